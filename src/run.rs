//! `octofs run <thread> -- CMD`: a command in a sandbox that sees only the workspace
//! (`docs/sandbox.md`). It owns the bubblewrap command line: the workspace bound read-write as the
//! working directory, the system's `/usr` and `/etc` read-only, fresh `/proc`, `/dev` and `/tmp`,
//! every namespace unshared (the network only on request), a clean environment. It runs as the
//! caller, with the caller's authority (bubblewrap is not setuid here: an unprivileged user
//! namespace), so it never needs the daemon for anything but the open. It must not touch the
//! daemon's state: what the sandbox sees of the repository is what the mount presents
//! (`.git/octofs/objects` and a relative alternates path make the workspace self-contained).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What a sandbox gets besides the workspace.
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    /// Where the workspace appears inside (default `/work`).
    pub at: Option<PathBuf>,
    /// Host paths bound read-only at the same place (a toolchain, a package store).
    pub ro: Vec<PathBuf>,
    /// Share the host's network (package managers, `git fetch`); unshared by default.
    pub net: bool,
    /// `KEY=VALUE` pairs set inside, after the defaults (so they may override `PATH` or `HOME`).
    pub env: Vec<(String, String)>,
}

/// Where the workspace is bound when the caller does not say.
pub const DEFAULT_AT: &str = "/work";

/// The top-level directories of a merged-`/usr` system that are links into `/usr` (`/bin`, `/lib`,
/// `/lib64`, `/sbin`), each with its target: recreated as links inside.
fn usr_links() -> Vec<(String, PathBuf)> {
    ["bin", "sbin", "lib", "lib32", "lib64", "libx32"]
        .iter()
        .filter_map(|d| {
            let t = std::fs::read_link(Path::new("/").join(d)).ok()?;
            Some((format!("/{d}"), t))
        })
        .collect()
}

/// The arguments of `bwrap` (not the program) that run `cmd` with `workspace` bound as the sandbox
/// describes; `term` and `lang` are the caller's, kept when set.
pub fn bwrap_args(
    workspace: &Path,
    sb: &Sandbox,
    cmd: &[OsString],
    term: Option<OsString>,
    lang: Option<OsString>,
) -> Vec<OsString> {
    let at = sb.at.clone().unwrap_or_else(|| PathBuf::from(DEFAULT_AT));
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    push(&["--ro-bind".as_ref(), "/usr".as_ref(), "/usr".as_ref()]);
    push(&["--ro-bind".as_ref(), "/etc".as_ref(), "/etc".as_ref()]);
    for (dir, target) in usr_links() {
        push(&["--symlink".as_ref(), target.as_os_str(), dir.as_ref()]);
    }
    for p in &sb.ro {
        push(&["--ro-bind".as_ref(), p.as_os_str(), p.as_os_str()]);
    }
    push(&["--proc".as_ref(), "/proc".as_ref()]);
    push(&["--dev".as_ref(), "/dev".as_ref()]);
    push(&["--tmpfs".as_ref(), "/tmp".as_ref()]);
    push(&["--bind".as_ref(), workspace.as_os_str(), at.as_os_str()]);
    push(&["--chdir".as_ref(), at.as_os_str()]);
    push(&["--unshare-all".as_ref()]);
    if sb.net {
        push(&["--share-net".as_ref()]);
    }
    push(&["--die-with-parent".as_ref(), "--clearenv".as_ref()]);
    let mut env: Vec<(String, OsString)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), "/tmp".into()),
        // The workspace's fsmonitor hook is the daemon's, outside the sandbox: git inside asks
        // the file system instead (docs/sandbox.md).
        ("GIT_CONFIG_COUNT".into(), "1".into()),
        ("GIT_CONFIG_KEY_0".into(), "core.fsmonitor".into()),
        ("GIT_CONFIG_VALUE_0".into(), "false".into()),
    ];
    if let Some(t) = term {
        env.push(("TERM".into(), t));
    }
    if let Some(l) = lang {
        env.push(("LANG".into(), l));
    }
    for (k, v) in &sb.env {
        env.retain(|(e, _)| e != k);
        env.push((k.clone(), v.into()));
    }
    for (k, v) in env {
        push(&["--setenv".as_ref(), k.as_ref(), v.as_os_str()]);
    }
    a.push("--".into());
    a.extend(cmd.iter().cloned());
    a
}

/// A `KEY=VALUE` argument of `--env`.
pub fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => {
            Ok((k.to_string(), v.to_string()))
        }
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// `bwrap` on the caller's `PATH`, or a one-line error saying how to get it.
pub fn bwrap() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "octofs run needs bubblewrap (`bwrap`) on PATH: install it (Debian: apt install bubblewrap)"
                .to_string()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(a: &[OsString]) -> Vec<String> {
        a.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_workspace_is_the_only_writable_host_path() {
        let sb = Sandbox {
            ro: vec![PathBuf::from("/opt/tool")],
            ..Sandbox::default()
        };
        let a = text(&bwrap_args(
            Path::new("/ws/t"),
            &sb,
            &["git".into(), "status".into()],
            None,
            None,
        ));
        let binds: Vec<&[String]> = a
            .windows(3)
            .filter(|w| w[0] == "--bind" || w[0] == "--bind-try" || w[0] == "--dev-bind")
            .collect();
        assert_eq!(binds.len(), 1, "{a:?}");
        assert_eq!(binds[0][1..], ["/ws/t".to_string(), "/work".to_string()]);
        assert!(
            a.windows(3)
                .any(|w| w == ["--ro-bind", "/opt/tool", "/opt/tool"])
        );
        assert!(a.contains(&"--unshare-all".to_string()));
        assert!(!a.contains(&"--share-net".to_string()));
        assert!(a.contains(&"--clearenv".to_string()));
        let dash = a.iter().position(|s| s == "--").unwrap();
        assert_eq!(a[dash + 1..], ["git".to_string(), "status".to_string()]);
    }

    #[test]
    fn env_given_overrides_the_defaults() {
        let sb = Sandbox {
            env: vec![("PATH".into(), "/opt/bin".into())],
            net: true,
            at: Some(PathBuf::from("/src")),
            ..Sandbox::default()
        };
        let a = text(&bwrap_args(
            Path::new("/ws/t"),
            &sb,
            &["true".into()],
            None,
            None,
        ));
        let paths: Vec<&[String]> = a
            .windows(3)
            .filter(|w| w[0] == "--setenv" && w[1] == "PATH")
            .collect();
        assert_eq!(paths.len(), 1);
        assert_eq!(paths[0][2], "/opt/bin");
        assert!(a.contains(&"--share-net".to_string()));
        assert!(a.windows(2).any(|w| w == ["--chdir", "/src"]));
    }

    #[test]
    fn env_arguments_are_key_value() {
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(parse_env("novalue").is_err());
        assert!(parse_env("=x").is_err());
    }
}
