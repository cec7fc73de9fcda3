//! Git: the project mirrors and read access to their object stores.
//!
//! Owns `<state>/mirrors/*` and `<state>/projects/*`. Only [`mirror`] writes a mirror (add and sync),
//! [`snapshot`] and [`posix_record`] add a thread's snapshot objects and refs to it (many objects
//! as one pack, [`pack`]); [`objects`]
//! only reads. Nothing in this module knows about mounts or workspaces (invariant 1: a mirror is
//! never written by a workspace). Every git process is started through `Git`, the one runner
//! with the hardened environment; every failure is an [`Error`].

pub mod checksum;
pub mod error;
pub mod gates;
pub mod graft;
pub mod index_ext;
pub mod kept;
pub mod mirror;
pub mod objects;
pub mod pack;
pub mod posix_record;
pub mod record;
pub mod refusal;
pub mod snapshot;
pub mod tips;

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Stdio};

pub use error::Error;

/// The one way the daemon runs git: a builder over [`std::process::Command`] whose environment no
/// configuration but the repository's own can change — and the daemon runs git only in
/// repositories it owns (mirrors, its own scratch repositories), never in a workspace (docs/security.md,
/// the trust model). No system or global configuration, no system attributes, no `~` to find
/// anything in, no replace refs, only the transports a project needs (no `ext::`/`fd::` remote
/// helpers), never a prompt or a pager; git variables of the daemon's own environment that would
/// redirect the repository or add configuration are dropped.
///
/// Every other way of running git is derived from it: [`Git::output`] and [`Git::output_bytes`]
/// for a command's answer, [`Git::into_command`] for a process the caller drives itself (blob
/// streaming, and clone/fetch with their stall timeout and credential header in `mirror`).
pub(crate) struct Git {
    cmd: Command,
}

/// Variables of the daemon's own environment that would redirect the repository, add
/// configuration, or run another program in git's place.
const DROPPED_ENV: [&str; 14] = [
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
];

/// The transports a project may use: what `GIT_ALLOW_PROTOCOL` lets any git of the daemon speak.
pub(crate) const ALLOWED_PROTOCOLS: &str = "file:git:http:https:ssh";

impl Git {
    /// `git` (in `dir` when given) with the hardened environment.
    pub(crate) fn new(dir: Option<&Path>) -> Git {
        let mut cmd = Command::new("git");
        if let Some(d) = dir {
            cmd.arg("-C").arg(d);
        }
        harden(&mut cmd);
        Git { cmd }
    }

    pub(crate) fn arg(mut self, arg: impl AsRef<OsStr>) -> Git {
        self.cmd.arg(arg);
        self
    }

    pub(crate) fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Git {
        self.cmd.args(args);
        self
    }

    /// One more environment variable, set over the hardened ones (a scratch index, a credential
    /// header: what one command needs, never policy).
    pub(crate) fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Git {
        self.cmd.env(key, value);
        self
    }

    /// Commits made by this command are octofs's own (author and committer).
    pub(crate) fn by_octofs(self) -> Git {
        self.env("GIT_AUTHOR_NAME", "octofs")
            .env("GIT_AUTHOR_EMAIL", "octofs@localhost")
            .env("GIT_COMMITTER_NAME", "octofs")
            .env("GIT_COMMITTER_EMAIL", "octofs@localhost")
    }

    /// Runs it: trimmed stdout, or the last line of stderr as the error.
    pub(crate) fn output(self) -> Result<String, Error> {
        self.output_bytes()
            .map(|out| String::from_utf8_lossy(&out).trim().to_string())
    }

    /// Runs it: stdout as it is (for `-z` output: names are bytes), or the last line of stderr.
    pub(crate) fn output_bytes(mut self) -> Result<Vec<u8>, Error> {
        let out = self.cmd.output().map_err(Error::Spawn)?;
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
            Err(Error::Git(line))
        }
    }

    /// The command itself, for a caller that drives the process (pipes, process group, timeout).
    pub(crate) fn into_command(self) -> Command {
        self.cmd
    }
}

/// The environment policy of [`Git`], for another program the daemon runs on the host's behalf (a
/// `cmd=` gate): no git variable of the daemon's that redirects a repository, no configuration
/// or home to read, no prompt, no pager.
pub(crate) fn harden(cmd: &mut Command) {
    for var in DROPPED_ENV {
        cmd.env_remove(var);
    }
    // Nothing can be created below /dev/null: `~/.gitconfig`, `$XDG_CONFIG_HOME/git/*` and
    // `~/.config/git/*` do not exist for these processes.
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("HOME", "/dev/null")
        .env("XDG_CONFIG_HOME", "/dev/null")
        .env("GIT_ATTR_NOSYSTEM", "1")
        .env("GIT_ALLOW_PROTOCOL", ALLOWED_PROTOCOLS)
        .env("GIT_NO_REPLACE_OBJECTS", "1")
        .env("GIT_NO_LAZY_FETCH", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "true")
        .env("SSH_ASKPASS", "true")
        .env("GIT_PAGER", "cat")
        .env("PAGER", "cat")
        .env("LC_ALL", "C")
        .stdin(Stdio::null());
}

/// Runs `git` with `args` (in `dir` when given), returning trimmed stdout, or the last line of stderr
/// as the error (what the [`git!`](crate::git!) macro calls).
pub(crate) fn git(dir: Option<&Path>, args: &[&OsStr]) -> Result<String, Error> {
    Git::new(dir).args(args).output()
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

#[cfg(test)]
mod tests {
    /// Every git the daemon starts goes through [`super::Git`] (its one environment policy): no
    /// file of `src/` outside this one starts `git` itself, in the code before its tests. Lists
    /// the offenders, so a new one is named.
    #[test]
    fn every_git_of_the_daemon_is_started_through_git() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![src.clone()];
        let mut offenders = Vec::new();
        let mut seen = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("read src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                seen += 1;
                let text = std::fs::read_to_string(&path).expect("read");
                let code = text.split("#[cfg(test)]").next().unwrap_or("");
                let rel = path.strip_prefix(&src).expect("under src");
                if rel != std::path::Path::new("git/mod.rs")
                    && ["Command::new(\"git\")", "Command::new(\"/usr/bin/git\")"]
                        .iter()
                        .any(|n| code.contains(n))
                {
                    offenders.push(rel.display().to_string());
                }
            }
        }
        assert!(seen > 50, "src/ not found: {}", src.display());
        assert!(
            offenders.is_empty(),
            "git started outside crate::git::Git: {offenders:?}"
        );
    }
}
