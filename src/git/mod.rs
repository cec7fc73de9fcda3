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
/// as the error. The environment is pinned so that user configuration cannot prompt or page.
pub(crate) fn git(
    dir: Option<&std::path::Path>,
    args: &[&std::ffi::OsStr],
) -> Result<String, String> {
    git_env(dir, args, &[])
}

pub(crate) fn git_env(
    dir: Option<&std::path::Path>,
    args: &[&std::ffi::OsStr],
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<String, String> {
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "true")
        .env("GIT_PAGER", "cat")
        .env("LC_ALL", "C")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run git: {e} (is git installed?)"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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

/// `git(...)` with `&str` arguments.
#[macro_export]
macro_rules! git {
    ($dir:expr; $($arg:expr),+ $(,)?) => {
        $crate::git::git($dir, &[$(std::ffi::OsStr::new($arg)),+])
    };
}
