//! The command `core.fsmonitor` runs in a workspace: the hook program through its link
//! `<state>/fsmonitor-<thread>` (git execs it without a shell), else `octofs fsmonitor` quoted for
//! the shell; and a remounted workspace's config brought up to date when octofs wrote the old value.
//!
//! Owns that link and the one `core.fsmonitor` line octofs wrote; must not change any other line
//! of a workspace's config (an owner's own value is left as it is).

use std::path::Path;

use super::Error;
use super::read::workspace_config_bytes;
use crate::fs::WorkspaceFs;
use crate::layout::Layout;

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The characters that make git run a hook command through `/bin/sh -c` (git's `run-command.c`,
/// `prepare_shell_cmd`); a command with none of them is exec'd directly.
const SHELL_METACHARS: &str = "|&;<>()$`\\\"' \t\n*?[#~=%";

/// The fsmonitor hook program, installed beside `octofs`.
pub const FSMONITOR_HOOK: &str = "octofs-fsmonitor";

/// The command `core.fsmonitor` runs in `thread`'s workspace. Normally the hook program through
/// its link `<state>/fsmonitor-<thread>` (made here, pointing at the program beside `exe`): git
/// execs it directly, without a shell, and it starts in a fraction of `octofs`'s time. When there
/// is no hook program beside `exe`, the link cannot be made, or its path holds a character that
/// would make git start a shell anyway, `octofs fsmonitor` with its arguments quoted for that shell.
pub fn fsmonitor_command(layout: &Layout, thread: &str, exe: &Path) -> String {
    match fsmonitor_link(layout, thread, exe) {
        Ok(Some(link)) => return link,
        Ok(None) => {}
        Err(e) => tracing::warn!(
            %thread,
            "cannot link the fsmonitor hook (git runs `octofs fsmonitor` instead): {e}"
        ),
    }
    format!(
        "{} --state {} --root {} fsmonitor {}",
        shell_quote(&exe.to_string_lossy()),
        shell_quote(&layout.state.to_string_lossy()),
        shell_quote(&layout.root.to_string_lossy()),
        thread
    )
}

/// Brings an existing workspace's `core.fsmonitor` up to date when it is mounted again: the link
/// `<state>/fsmonitor-<thread>` is pointed at the hook program beside `exe` (this daemon's binary),
/// and a `.git/config` that still names a command octofs wrote earlier — `<octofs> --state …
/// fsmonitor <thread>` from before the hook program, whose binary may have moved or gone since, or
/// the link when there is no hook program now — gets the current command ([`fsmonitor_command`])
/// in that line. Every other line, and any other value (the owner's own choice), is left as it is.
/// Reads the config through the core (no symlink followed) and replaces it the way git does, in
/// one step. Returns whether it was rewritten.
pub fn refresh_fsmonitor(
    core: &WorkspaceFs,
    layout: &Layout,
    thread: &str,
    exe: &Path,
) -> Result<bool, Error> {
    let cmd = fsmonitor_command(layout, thread, exe);
    let e = |source| Error::Seed {
        what: "config".into(),
        source,
    };
    // A config too large to be one octofs wrote is left as it is, unread.
    let Some(config) = workspace_config_bytes(core).map_err(e)? else {
        return Ok(false);
    };
    let ours = |value: &str| octofs_fsmonitor(layout, thread, value);
    let Some(updated) = replace_core_fsmonitor(&config, &cmd, ours) else {
        return Ok(false);
    };
    core.put_file_quietly(&[".git"], "config", &updated)
        .map_err(e)?;
    Ok(true)
}

/// Whether `value` of `core.fsmonitor` is a command octofs wrote for `thread`: the link
/// `<state>/fsmonitor-<thread>`, or `<octofs> --state … --root … fsmonitor <thread>`.
pub fn octofs_fsmonitor(layout: &Layout, thread: &str, value: &str) -> bool {
    value == layout.fsmonitor_link(thread).to_string_lossy()
        || (value.ends_with(&format!(" fsmonitor {thread}"))
            && value.contains(" --state ")
            && value.contains(" --root ")
            && value
                .split(' ')
                .next()
                .is_some_and(|exe| exe.trim_end_matches('\'').ends_with("octofs")))
}

/// `config` with the value of `core.fsmonitor` replaced by `cmd` where `ours` says octofs wrote
/// it; `None` when nothing changes. Only the simple `key = value` lines octofs writes are
/// considered (a value with quotes, escapes or a continuation is the owner's).
pub fn replace_core_fsmonitor(
    config: &[u8],
    cmd: &str,
    ours: impl Fn(&str) -> bool,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(config.len() + cmd.len());
    let mut section_core = false;
    let mut changed = false;
    for line in config.split_inclusive(|b| *b == b'\n') {
        let text = std::str::from_utf8(line).unwrap_or("");
        let body = text.trim();
        if let Some(rest) = body.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or("").trim();
            section_core = name.eq_ignore_ascii_case("core");
        } else if section_core
            && let Some((key, value)) = body.split_once('=')
            && key.trim().eq_ignore_ascii_case("fsmonitor")
        {
            let value = value.trim();
            if value != cmd && !value.contains(['"', '\\', ';', '#']) && ours(value) {
                out.extend_from_slice(format!("\tfsmonitor = {cmd}\n").as_bytes());
                changed = true;
                continue;
            }
        }
        out.extend_from_slice(line);
    }
    changed.then_some(out)
}

/// Makes `<state>/fsmonitor-<thread>` a link to the hook program beside `exe` (replaced in one
/// step when it pointed elsewhere) and returns its path; `None` when the path would need a shell
/// or there is no hook program to link to.
fn fsmonitor_link(layout: &Layout, thread: &str, exe: &Path) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::PermissionsExt;
    let link = layout.fsmonitor_link(thread);
    let Some(text) = link.to_str() else {
        return Ok(None);
    };
    if !link.is_absolute() || text.contains(|c| SHELL_METACHARS.contains(c)) {
        return Ok(None);
    }
    let Some(hook) = exe.parent().map(|d| d.join(FSMONITOR_HOOK)) else {
        return Ok(None);
    };
    match std::fs::metadata(&hook) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        _ => return Ok(None),
    }
    if std::fs::read_link(&link).is_ok_and(|t| t == hook) {
        return Ok(Some(text.to_string()));
    }
    // Beside the link, then renamed over it: git never finds it missing or half made. The
    // thread's lock keeps two plans of one thread apart; the pid keeps two daemons apart.
    let tmp = layout
        .state
        .join(format!(".fsmonitor-{thread}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&hook, &tmp)?;
    if let Err(e) = std::fs::rename(&tmp, &link) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Some(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A directory holding an `octofs` and, with `hook`, an executable `octofs-fsmonitor`; the
    /// path of `octofs`.
    fn install(dir: &Path, hook: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let mut names = vec!["octofs"];
        if hook {
            names.push(FSMONITOR_HOOK);
        }
        for name in names {
            let p = dir.join(name);
            std::fs::write(&p, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir.join("octofs")
    }

    /// Catches: a hook command git would run through a shell (a metacharacter in it, or arguments),
    /// a link to the wrong program, and a link left pointing at an old install.
    #[test]
    fn the_fsmonitor_hook_is_a_link_git_execs_without_a_shell() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout {
            state: tmp.path().join("state"),
            root: tmp.path().join("root"),
        };
        std::fs::create_dir(&layout.state).unwrap();
        let old = install(&tmp.path().join("old"), true);
        let exe = install(&tmp.path().join("bin"), true);
        let link = layout.fsmonitor_link("t-1.x");
        std::os::unix::fs::symlink(old.with_file_name(FSMONITOR_HOOK), &link).unwrap();
        let cmd = fsmonitor_command(&layout, "t-1.x", &exe);
        assert_eq!(cmd, link.to_str().unwrap());
        assert!(!cmd.contains(|c| SHELL_METACHARS.contains(c)), "{cmd}");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            exe.with_file_name(FSMONITOR_HOOK)
        );
        // Planning again keeps it; nothing is left beside it.
        assert_eq!(fsmonitor_command(&layout, "t-1.x", &exe), cmd);
        let names: Vec<_> = std::fs::read_dir(&layout.state)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["fsmonitor-t-1.x"]);
    }

    /// Catches: a rewrite of a value octofs did not write, of a key outside `[core]`, of another
    /// key, or one that loses or reorders the other lines (or their missing final newline).
    #[test]
    fn only_the_core_fsmonitor_octofs_wrote_is_replaced() {
        let ours = |v: &str| v.starts_with("OLD");
        let replace = |config: &str| {
            replace_core_fsmonitor(config.as_bytes(), "NEW", ours)
                .map(|b| String::from_utf8(b).unwrap())
        };
        let config = "[core]\n\tbare = false\n\tfsmonitor = OLD cmd\n\tfsmonitorHookVersion = 2\n\
                      [user]\n\tname = x";
        assert_eq!(
            replace(config).as_deref(),
            Some(
                "[core]\n\tbare = false\n\tfsmonitor = NEW\n\tfsmonitorHookVersion = 2\n\
                 [user]\n\tname = x"
            )
        );
        // Key names are case-insensitive in git, sections too.
        assert_eq!(
            replace("[Core]\n  FSMonitor=OLD\n").as_deref(),
            Some("[Core]\n\tfsmonitor = NEW\n")
        );
        for kept in [
            "[core]\n\tfsmonitor = false\n",
            "[core]\n\tfsmonitor = NEW\n",
            "[alias]\n\tfsmonitor = OLD\n",
            "[core]\n\tfsmonitorHookVersion = OLD\n",
            "[core]\n\tfsmonitor = \"OLD quoted\"\n",
            "[core]\n\tfsmonitor = OLD \\\n\tcontinued\n",
            "[core \"x\"]\n\tfsmonitor = OLD\n",
            "[core]\n[remote \"core\"]\n\tfsmonitor = OLD\n",
        ] {
            assert_eq!(replace(kept), None, "{kept:?}");
        }
    }

    /// Catches: a link path git would hand to `sh -c` unquoted (a state directory with a space),
    /// and a link to a hook program that is not installed.
    #[test]
    fn the_fsmonitor_hook_falls_back_to_the_quoted_octofs_command() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = install(&tmp.path().join("bin"), true);
        let spaced = Layout {
            state: tmp.path().join("my state"),
            root: tmp.path().join("root"),
        };
        std::fs::create_dir(&spaced.state).unwrap();
        let cmd = fsmonitor_command(&spaced, "t", &exe);
        assert_eq!(
            cmd,
            format!(
                "'{}' --state '{}' --root '{}' fsmonitor t",
                exe.display(),
                spaced.state.display(),
                spaced.root.display()
            )
        );
        assert!(!spaced.fsmonitor_link("t").exists());
        assert_eq!(std::fs::read_dir(&spaced.state).unwrap().count(), 0);
        // No hook program beside `octofs` (an install of `octofs` alone).
        let lone = install(&tmp.path().join("lone"), false);
        let plain = Layout {
            state: tmp.path().join("state"),
            root: tmp.path().join("root"),
        };
        std::fs::create_dir(&plain.state).unwrap();
        let cmd = fsmonitor_command(&plain, "t", &lone);
        assert!(cmd.ends_with(" fsmonitor t"), "{cmd}");
        assert!(
            cmd.starts_with(&format!("'{}' --state", lone.display())),
            "{cmd}"
        );
        assert!(std::fs::symlink_metadata(plain.fsmonitor_link("t")).is_err());
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
