//! Git: the project mirrors and read access to their object stores.
//!
//! Owns `<state>/mirrors/*` and `<state>/projects/*`. Only [`mirror`] writes a mirror (add and sync);
//! [`objects`] only reads. Nothing in this module knows about mounts or workspaces (invariant 1: a
//! mirror is never written by a workspace).

pub mod mirror;
pub mod objects;
pub mod posix_record;
pub mod snapshot;

use std::process::{Command, Stdio};

/// Runs `git` with `args` (in `dir` when given), returning trimmed stdout, or the last line of stderr
/// as the error. The environment is pinned (see [`command`]).
pub(crate) fn git(
    dir: Option<&std::path::Path>,
    args: &[&std::ffi::OsStr],
) -> Result<String, String> {
    git_env(dir, args, &[])
}

/// [`git`] with extra environment variables.
pub(crate) fn git_env(
    dir: Option<&std::path::Path>,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<String, String> {
    let mut cmd = command(dir);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(cmd).map(|out| String::from_utf8_lossy(&out).trim().to_string())
}

/// [`git`], returning stdout as it is (for `-z` output: names are bytes).
pub(crate) fn git_bytes(
    dir: Option<&std::path::Path>,
    args: &[&std::ffi::OsStr],
) -> Result<Vec<u8>, String> {
    let mut cmd = command(dir);
    cmd.args(args);
    run(cmd)
}

/// A `git` command (in `dir` when given) whose behaviour no configuration but the repository's
/// own can change — and the daemon runs git only in repositories it owns (mirrors, its own
/// scratch repositories), never in a workspace (DESIGN.md "Trust model"). No system or global
/// configuration, no system attributes, no `~` to find anything in, no replace refs, only the
/// transports a project needs (no `ext::`/`fd::` remote helpers), never a prompt or a pager; git
/// variables of the daemon's own environment that would redirect the repository or add
/// configuration are dropped.
pub(crate) fn command(dir: Option<&std::path::Path>) -> Command {
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_COMMON_DIR",
        "GIT_NAMESPACE",
        "GIT_CONFIG",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_EXTERNAL_DIFF",
        "GIT_EXEC_PATH",
        "GIT_TEMPLATE_DIR",
        "GIT_ATTR_SOURCE",
    ] {
        cmd.env_remove(var);
    }
    // Nothing can be created below /dev/null: `~/.gitconfig`, `$XDG_CONFIG_HOME/git/*` and
    // `~/.config/git/*` do not exist for these processes.
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", "/dev/null")
        .env("XDG_CONFIG_HOME", "/dev/null")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_ALLOW_PROTOCOL", "file:git:http:https:ssh")
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "true")
        .env("GIT_PAGER", "cat")
        .env("PAGER", "cat")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
    cmd
}

/// Runs `cmd`; stdout on success, else the last line of stderr.
fn run(mut cmd: Command) -> Result<Vec<u8>, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run git: {e} (is git installed?)"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("git failed")
            .trim()
            .to_string();
        Err(line)
    }
}

/// Opens a repository the daemon owns (a mirror) with gix, reading only that repository's own
/// configuration: no system or global files, no environment overrides (and so no `git config`
/// subprocess to find the system configuration).
pub(crate) fn open_owned(path: &std::path::Path) -> gix::Result<gix::Repository> {
    gix::open_opts(path, gix::open::Options::isolated())
}

/// `git(...)` with `&str` arguments.
#[macro_export]
macro_rules! git {
    ($dir:expr; $($arg:expr),+ $(,)?) => {
        $crate::git::git($dir, &[$(std::ffi::OsStr::new($arg)),+])
    };
}
