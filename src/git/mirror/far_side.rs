//! The far side of a transport to a remote a caller named (`push --remote`, `pull --remote`,
//! `snapshot --push`), run with the caller's authority (docs/security.md, privilege separation: whatever
//! the daemon does for a caller reaching outside its state, it does with the caller's credentials).
//!
//! git talks to a repository on this host by starting `git-upload-pack` (fetch, ls-remote) or
//! `git-receive-pack` (push) in it, and to an ssh remote by starting `ssh`. The daemon's git runs as
//! root in the mirror; what it starts for the far side is this binary's hidden `transport-as`
//! command ([`run`]), which:
//! - becomes the caller (uid, gid, supplementary groups — all three ids, for good), sets
//!   `no_new_privs`, and only then looks at the path: a repository the caller cannot read is one
//!   the transport cannot read, and the error says only what the caller could learn by themselves;
//! - refuses a repository inside the daemon's state or under the mount root (a mirror, another
//!   project's objects, a workspace's content), by its canonical path as the caller resolves it;
//! - runs `upload-pack`/`receive-pack` with the hardened environment of [`crate::git::Git`] and no
//!   hooks (`core.hooksPath=/dev/null`, no `core.alternateRefsCommand`): configuration of the far
//!   repository never makes the daemon — or the caller — run anything;
//! - for ssh, runs `ssh` as the caller with the caller's home (their keys and known hosts), and
//!   none of the daemon's agent socket.
//!
//! git's `-c` settings do not reach a local transport's far side (git clears them for it), so the
//! far side is the only place the hook rule can be applied. A remote of the daemon's own (the
//! project's upstream, its share remote) goes through [`run`] too, as the daemon, for the same
//! rule; git://, http(s):// remotes have no far side on this host and carry no credential of the
//! daemon's for a remote a caller names.
//!
//! Owns nothing on disk; decides only how a transport's far side is started.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use crate::git::Git;

/// Whose authority the far side of a transport runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FarSide {
    /// The daemon's own (a remote the daemon's configuration names).
    Daemon,
    /// A caller's: the remote was named by a control request of this user.
    User {
        uid: u32,
        gid: u32,
        groups: Vec<u32>,
    },
}

/// The hidden command the far side is started as (`octofs transport-as …`).
pub const COMMAND: &str = "transport-as";

/// What the far side runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    UploadPack,
    ReceivePack,
    Ssh,
}

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Program::UploadPack => "upload-pack",
            Program::ReceivePack => "receive-pack",
            Program::Ssh => "ssh",
        }
    }

    pub fn parse(s: &str) -> Option<Program> {
        [Program::UploadPack, Program::ReceivePack, Program::Ssh]
            .into_iter()
            .find(|p| p.name() == s)
    }
}

/// How a URL reaches its repository, as far as the far side is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A repository on this host (`file://`, or an absolute path given as one).
    Local,
    /// `ssh://`, `git+ssh://`, `ssh+git://` or scp-like `user@host:path`.
    Ssh,
    /// git:// or http(s)://: nothing runs on this host for the far side.
    Network,
}

/// How `url` (a checked remote: an absolute path or a URL of an allowed transport) is reached.
pub fn reach(url: &str) -> Reach {
    match url.split_once("://") {
        None if url.starts_with('/') => Reach::Local,
        None => Reach::Ssh,
        Some((scheme, _)) => match scheme.to_ascii_lowercase().as_str() {
            "file" => Reach::Local,
            "ssh" | "git+ssh" | "ssh+git" => Reach::Ssh,
            _ => Reach::Network,
        },
    }
}

/// The URL git is given for `url`: an absolute path becomes a `file://` URL, so that git never opens
/// the path itself (a plain path that is a file is read as a bundle by the daemon's own git, with
/// root's authority) and every access goes through the far side. git decodes `%XX` in a `file://`
/// URL, so a `%` of the path is written `%25`.
pub fn transport_url(url: &str) -> String {
    if url.starts_with('/') {
        format!("file://{}", url.replace('%', "%25"))
    } else {
        url.to_string()
    }
}

/// A word quoted for `sh` (git runs `--upload-pack`/`--receive-pack` and `GIT_SSH_COMMAND` through
/// the shell).
fn quote(s: &OsStr) -> String {
    format!(
        "'{}'",
        String::from_utf8_lossy(s.as_bytes()).replace('\'', r"'\''")
    )
}

impl FarSide {
    /// The shell command that starts `program` as this far side, refusing repositories under
    /// `deny`; git appends the path (or ssh's arguments).
    fn command(&self, exe: &Path, program: Program, deny: &[PathBuf]) -> String {
        let mut words = vec![quote(exe.as_os_str()), COMMAND.to_string()];
        if let FarSide::User { uid, gid, groups } = self {
            words.push(format!("--uid={uid}"));
            words.push(format!("--gid={gid}"));
            let list: Vec<String> = groups.iter().map(u32::to_string).collect();
            words.push(format!("--groups={}", list.join(",")));
        }
        for d in deny {
            let mut arg = OsString::from("--deny=");
            arg.push(d);
            words.push(quote(&arg));
        }
        words.push(program.name().to_string());
        words.join(" ")
    }

    /// The options of the git command `sub` (`ls-remote`, `fetch`, `push`) and the environment that
    /// make its far side this one, for `url`. Nothing for a network transport (or for ssh as the
    /// daemon: the daemon's own ssh, as for its upstream).
    pub fn transport(
        &self,
        exe: &Path,
        sub: &str,
        url: &str,
        deny: &[PathBuf],
    ) -> (Vec<String>, Vec<(String, String)>) {
        match reach(url) {
            Reach::Local => {
                let (opt, program) = if sub == "push" {
                    ("--receive-pack", Program::ReceivePack)
                } else {
                    ("--upload-pack", Program::UploadPack)
                };
                (
                    vec![format!("{opt}={}", self.command(exe, program, deny))],
                    vec![],
                )
            }
            Reach::Ssh if matches!(self, FarSide::User { .. }) => (
                vec![],
                vec![
                    (
                        "GIT_SSH_COMMAND".into(),
                        self.command(exe, Program::Ssh, deny),
                    ),
                    // git passes ports and options the way OpenSSH takes them.
                    ("GIT_SSH_VARIANT".into(), "ssh".into()),
                ],
            ),
            Reach::Ssh | Reach::Network => (vec![], vec![]),
        }
    }
}

/// The far side's arguments, as `transport-as` receives them.
#[derive(Debug, Clone, Default)]
pub struct Args {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
    pub deny: Vec<PathBuf>,
    pub program: String,
    pub rest: Vec<OsString>,
}

/// git shows the far side's stderr as it is: one `fatal:` line, and git adds its own.
fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("fatal: {msg}");
    ExitCode::from(128)
}

/// Whether `path` is `dir` or below it.
fn inside(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}

/// `octofs transport-as`: becomes the caller, checks the repository, and executes the far side
/// (returns only on failure).
pub fn run(a: Args) -> ExitCode {
    let Some(program) = Program::parse(&a.program) else {
        return fail(format!("unknown far side {:?}", a.program));
    };
    let who = match (a.uid, a.gid) {
        (Some(uid), Some(gid)) => {
            if (uid != crate::sys::euid() || gid != crate::sys::egid())
                && let Err(e) = crate::sys::become_user(uid, gid, &a.groups)
            {
                return fail(format!("cannot act as uid {uid}: {e}"));
            }
            Some(uid)
        }
        (None, None) => None,
        _ => return fail("--uid and --gid go together"),
    };
    if let Err(e) = crate::sys::set_no_new_privs() {
        return fail(format!("cannot set no_new_privs: {e}"));
    }
    let as_who = who
        .map(crate::access::describe_uid)
        .unwrap_or_else(|| "the daemon".into());
    let err = match program {
        Program::Ssh => {
            let mut cmd = std::process::Command::new("ssh");
            cmd.args(&a.rest).env_remove("SSH_AUTH_SOCK");
            if let Some(uid) = who {
                let home = crate::sys::user_home(uid).unwrap_or_else(|| "/nonexistent".into());
                cmd.env("HOME", home);
                if let Some(name) = crate::sys::user_name(uid) {
                    cmd.env("USER", &name).env("LOGNAME", &name);
                }
            }
            cmd.exec()
        }
        Program::UploadPack | Program::ReceivePack => {
            let [path] = a.rest.as_slice() else {
                return fail("the far side takes one repository path");
            };
            let shown = String::from_utf8_lossy(path.as_bytes()).into_owned();
            // Resolved with the caller's authority: what does not resolve is, for all the caller
            // can tell, not there.
            let Some(real) = std::fs::canonicalize(path)
                .ok()
                .filter(|r| std::fs::read_dir(r).is_ok())
            else {
                return fail(format!("{shown}: no repository {as_who} can read there"));
            };
            if a.deny.iter().any(|d| inside(&real, d)) {
                return fail(format!(
                    "{shown}: inside octofs's state or a workspace mount; a remote must be a repository of your own outside them"
                ));
            }
            let mut cmd = Git::new(None)
                .args([
                    "-c",
                    "core.hooksPath=/dev/null",
                    "-c",
                    "core.alternateRefsCommand=true",
                    "-c",
                    "core.fsmonitor=false",
                    program.name(),
                ])
                .arg(&real)
                .into_command();
            cmd.stdin(Stdio::inherit())
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit());
            cmd.exec()
        }
    };
    fail(format!(
        "cannot run the far side ({}): {err}",
        program.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reach_of_each_transport() {
        assert_eq!(reach("/srv/r.git"), Reach::Local);
        assert_eq!(reach("file:///srv/r.git"), Reach::Local);
        assert_eq!(reach("FILE:///srv/r.git"), Reach::Local);
        assert_eq!(reach("ssh://h/r.git"), Reach::Ssh);
        assert_eq!(reach("git+ssh://h/r.git"), Reach::Ssh);
        assert_eq!(reach("u@h:r.git"), Reach::Ssh);
        assert_eq!(reach("git://h/r.git"), Reach::Network);
        assert_eq!(reach("https://h/r.git"), Reach::Network);
    }

    #[test]
    fn paths_become_file_urls_with_percent_kept() {
        assert_eq!(transport_url("/a b/r%20.git"), "file:///a b/r%2520.git");
        assert_eq!(transport_url("file:///x"), "file:///x");
        assert_eq!(transport_url("ssh://h/x"), "ssh://h/x");
    }

    #[test]
    fn the_far_side_of_a_caller_names_the_caller_and_the_refused_places() {
        let f = FarSide::User {
            uid: 1000,
            gid: 100,
            groups: vec![100, 27],
        };
        let deny = [PathBuf::from("/var/lib/octofs"), PathBuf::from("/work's")];
        let (opts, env) = f.transport(Path::new("/usr/bin/octofs"), "push", "/srv/r", &deny);
        assert!(env.is_empty());
        assert_eq!(
            opts,
            [
                "--receive-pack='/usr/bin/octofs' transport-as --uid=1000 --gid=100 --groups=100,27 '--deny=/var/lib/octofs' '--deny=/work'\\''s' receive-pack"
            ]
        );
        let (opts, _) = f.transport(Path::new("/o"), "fetch", "file:///srv/r", &[]);
        assert_eq!(
            opts,
            ["--upload-pack='/o' transport-as --uid=1000 --gid=100 --groups=100,27 upload-pack"]
        );
        let (opts, env) = f.transport(Path::new("/o"), "fetch", "ssh://h/r", &[]);
        assert!(opts.is_empty());
        assert_eq!(env[0].0, "GIT_SSH_COMMAND");
        assert!(env[0].1.ends_with("--groups=100,27 ssh"), "{env:?}");
        // The daemon's own ssh and any network transport: nothing of ours on this host.
        assert_eq!(
            FarSide::Daemon.transport(Path::new("/o"), "fetch", "ssh://h/r", &[]),
            (vec![], vec![])
        );
        assert_eq!(
            f.transport(Path::new("/o"), "fetch", "https://h/r", &[]),
            (vec![], vec![])
        );
        let (opts, _) = FarSide::Daemon.transport(Path::new("/o"), "ls-remote", "/r", &[]);
        assert_eq!(opts, ["--upload-pack='/o' transport-as upload-pack"]);
    }
}
