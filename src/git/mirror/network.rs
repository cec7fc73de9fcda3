//! Clone and fetch: the only git commands that talk to an upstream. They run as every git of the
//! daemon does ([`crate::git::Git`]: hardened environment, only the transports a project may use),
//! plus the credentials (if any) in the child's environment,
//! and a stall timeout: no progress for [`set_fetch_timeout`] seconds and the git process group is
//! killed, leaving the mirror as it was. Errors are one redacted line.
//!
//! Whoever waits on a clone or fetch may watch it ([`watched`]): git's last progress line
//! ("Receiving objects:  45% …") is kept for them, and [`Watch::cancel`] ends git (SIGTERM, so
//! that it removes its temporary packs; SIGKILL after a grace) with [`Error::Cancelled`], which
//! the callers turn into "nothing kept" as for any other failure.

use crate::git::error::{Context, Error};
use std::cell::RefCell;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::credentials::{credential_env, redact};
use crate::git::Git;

static FETCH_TIMEOUT_SECS: AtomicU64 = AtomicU64::new(300);

/// Sets the stall timeout of clone and fetch: no progress for this many seconds ends them.
pub fn set_fetch_timeout(secs: u64) {
    FETCH_TIMEOUT_SECS.store(secs.max(1), Ordering::Relaxed);
}

/// What git said last on stderr, kept bounded.
const STDERR_KEEP: usize = 64 * 1024;

/// How long a cancelled git has to remove its temporary files before it is killed.
const CANCEL_GRACE: Duration = Duration::from_secs(3);

/// The progress and the cancel switch of the clones and fetches a request runs.
#[derive(Debug, Default)]
pub struct Watch {
    line: Mutex<String>,
    cancel: AtomicBool,
}

impl Watch {
    /// git's last progress line ("" before the first).
    pub fn line(&self) -> String {
        self.line.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Ends the running clone or fetch, and any later one of the same request.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    fn set_line(&self, line: &str) {
        *self.line.lock().unwrap_or_else(|p| p.into_inner()) = line.to_string();
    }
}

thread_local! {
    static WATCH: RefCell<Option<Arc<Watch>>> = const { RefCell::new(None) };
}

/// Runs `f` with its clones and fetches (on this thread) reporting to, and cancelled by, `w`.
pub fn watched<T>(w: &Arc<Watch>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Arc<Watch>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            WATCH.with(|c| *c.borrow_mut() = prev);
        }
    }
    let _restore = Restore(WATCH.with(|c| c.borrow_mut().replace(w.clone())));
    f()
}

/// Whether the request running on this thread was cancelled (a step between two git commands
/// checks it too, so that a cancel never waits for the next long step).
pub fn cancelled() -> bool {
    WATCH.with(|c| c.borrow().as_ref().is_some_and(|w| w.cancelled()))
}

/// The last progress line in a chunk of git's stderr (lines end in `\r` while they update).
fn last_line(chunk: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(chunk);
    text.split(['\r', '\n'])
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .map(|l| l.strip_prefix("remote: ").unwrap_or(l).to_string())
}

/// Runs a git command that talks to `upstream` (clone, fetch): only the allowed transports, the
/// credentials (if any) through the environment, progress on stderr watched, and the whole process
/// group killed after [`set_fetch_timeout`] seconds without any. Errors are one redacted line.
pub(super) fn network_git(
    dir: Option<&Path>,
    args: &[&OsStr],
    upstream: &str,
    credential: Option<&str>,
) -> Result<(), Error> {
    network_git_with(dir, args, upstream, credential, &[])
}

/// [`network_git`] with more environment (the far side of a caller's remote, `far_side`).
pub(super) fn network_git_with(
    dir: Option<&Path>,
    args: &[&OsStr],
    upstream: &str,
    credential: Option<&str>,
    env: &[(String, String)],
) -> Result<(), Error> {
    let secs = FETCH_TIMEOUT_SECS.load(Ordering::Relaxed).max(1);
    let stall = Duration::from_secs(secs);
    let mut cmd = network_command(dir, args, upstream, credential, secs);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = cmd.spawn().map_err(Error::Spawn)?;
    let last_progress = Arc::new(Mutex::new(Instant::now()));
    let (tx, rx) = std::sync::mpsc::channel();
    let watch = WATCH.with(|c| c.borrow().clone());
    if let Some(mut stderr) = child.stderr.take() {
        let last = last_progress.clone();
        let watch = watch.clone();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&chunk[..n]);
                if let (Some(w), Some(l)) = (&watch, last_line(&chunk[..n])) {
                    w.set_line(&redact(&l));
                }
                if kept.len() > STDERR_KEEP {
                    kept.drain(..kept.len() - STDERR_KEEP);
                }
                *last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            }
            let _ = tx.send(kept);
        });
    }
    let mut cancelled_at: Option<Instant> = None;
    let status = loop {
        if cancelled_at.is_none() && watch.as_ref().is_some_and(|w| w.cancelled()) {
            // git removes its temporary packs and lock files on SIGTERM.
            if let Err(e) = crate::sys::signal_process_group(child.id(), crate::sys::Signal::Term) {
                tracing::warn!("cannot stop a cancelled git: {e}");
            }
            cancelled_at = Some(Instant::now());
        }
        if cancelled_at.is_some_and(|t| t.elapsed() >= CANCEL_GRACE) {
            let _ = crate::sys::kill_process_group(child.id());
            let _ = child.wait();
            break None;
        }
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                let _ = crate::sys::kill_process_group(child.id());
                let _ = child.wait();
                return Err(e).context(|| "cannot wait for git".to_string());
            }
        }
        let quiet = last_progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        if quiet >= stall {
            // Not reaped yet, so the group id is still ours.
            if let Err(e) = crate::sys::kill_process_group(child.id()) {
                tracing::warn!("cannot kill a stalled git: {e}");
            }
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    if cancelled_at.is_some() {
        return Err(Error::Cancelled);
    }
    match status {
        None => Err(Error::Stalled {
            upstream: redact(upstream),
            secs,
        }),
        Some(s) if s.success() => Ok(()),
        Some(s) => {
            let text = String::from_utf8_lossy(&stderr);
            let lines: Vec<&str> = text
                .split(['\n', '\r'])
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let line = lines
                .iter()
                .rev()
                .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
                .or(lines.last())
                .map(|l| l.to_string())
                .unwrap_or_else(|| format!("git failed ({s})"));
            let mut line = match lines.iter().find_map(|l| dubious_ownership(l)) {
                Some(msg) => msg,
                None => redact(&line),
            };
            if let Some(c) = credential
                && let Some((_, secret)) = c.split_once(':')
                && !secret.is_empty()
            {
                line = line.replace(secret, "***");
            }
            Err(Error::Git(line))
        }
    }
}

/// git's refusal of a repository another user owns (`detected dubious ownership in repository at
/// '<path>'`, followed by advice about `safe.directory` that the daemon's git never reads), said in
/// octofs's words with the owner named.
fn dubious_ownership(line: &str) -> Option<String> {
    let rest = line
        .split_once("detected dubious ownership in repository at '")?
        .1;
    let path = rest.strip_suffix('\'').unwrap_or(rest);
    let owner = std::fs::metadata(path)
        .map(|m| crate::access::describe_uid(std::os::unix::fs::MetadataExt::uid(&m)))
        .unwrap_or_else(|_| "another user".into());
    Some(not_ours(path, &owner).to_string())
}

/// The refusal of a repository at `path` that `owner` owns, not the daemon's user.
pub(super) fn not_ours(path: &str, owner: &str) -> crate::git::refusal::Refusal {
    crate::git::refusal::Refusal::NotOurs {
        path: path.to_string(),
        owner: owner.to_string(),
        daemon_user: crate::access::describe_uid(crate::sys::euid()),
    }
}

/// The command of [`network_git`]: the daemon's one hardened git ([`Git`]), plus what talking to
/// an upstream needs (curl's own stall limit, the credential header, a process group of its own).
pub(super) fn network_command(
    dir: Option<&Path>,
    args: &[&OsStr],
    upstream: &str,
    credential: Option<&str>,
    secs: u64,
) -> Command {
    let mut git = Git::new(dir)
        .args(args)
        // curl gives up on its own when less than a byte a second flows for the whole window.
        .env("GIT_HTTP_LOW_SPEED_LIMIT", "1")
        .env("GIT_HTTP_LOW_SPEED_TIME", secs.to_string());
    if let Some(c) = credential {
        for (k, v) in credential_env(upstream, c) {
            git = git.env(k, v);
        }
    }
    let mut cmd = git.into_command();
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group, so that a stall kills git and every helper it started.
        .process_group(0);
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_users_repository_is_refused_in_octofs_words() {
        let msg = dubious_ownership("fatal: detected dubious ownership in repository at '/'")
            .expect("recognized");
        assert!(
            msg.starts_with("the repository / belongs to uid 0 (root), not to the daemon's user"),
            "{msg}"
        );
        assert!(!msg.contains("safe.directory"), "{msg}");
        assert_eq!(
            dubious_ownership("fatal: Could not read from remote repository."),
            None
        );
    }

    #[test]
    fn the_watch_keeps_gits_last_progress_line() {
        assert_eq!(
            last_line(b"Cloning into 'x'...\nremote: Counting objects:  10% (1/10)\rremote: Counting objects: 100% (10/10), done.\r\nReceiving objects:  45% (45/100)\r"),
            Some("Receiving objects:  45% (45/100)".into())
        );
        assert_eq!(
            last_line(b"remote: Compressing objects:  50% (5/10)\r"),
            Some("Compressing objects:  50% (5/10)".into())
        );
        assert_eq!(last_line(b"\r\n  \r"), None);
        let w = Arc::new(Watch::default());
        assert!(!cancelled());
        watched(&w, || {
            assert!(!cancelled());
            w.cancel();
            assert!(cancelled());
        });
        assert!(!cancelled(), "the watch outlived its request");
    }

    fn env_of(cmd: &Command) -> Vec<(String, Option<String>)> {
        cmd.get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect()
    }

    #[test]
    fn clone_and_fetch_run_with_the_hardened_environment_and_the_credential_header() {
        let cmd = network_command(
            None,
            &[OsStr::new("fetch")],
            "https://example.com/x.git",
            Some("u:tok"),
            7,
        );
        let env = env_of(&cmd);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        // Everything every git of the daemon gets (the network variant once had its own, thinner
        // copy of the environment, without GIT_CONFIG_NOSYSTEM or GIT_CONFIG_GLOBAL).
        for (k, v) in env_of(&Git::new(None).into_command()) {
            if k == "GIT_CONFIG_COUNT" {
                continue;
            }
            assert_eq!(get(&k), Some(v), "{k}");
        }
        assert_eq!(get("GIT_CONFIG_GLOBAL"), Some(Some("/dev/null".into())));
        assert_eq!(get("GIT_CONFIG_NOSYSTEM"), Some(Some("1".into())));
        // The header is set over the dropped GIT_CONFIG_COUNT, for the upstream's origin only.
        assert_eq!(get("GIT_CONFIG_COUNT"), Some(Some("1".into())));
        assert_eq!(
            get("GIT_CONFIG_KEY_0"),
            Some(Some("http.https://example.com/.extraHeader".into()))
        );
        assert_eq!(get("GIT_HTTP_LOW_SPEED_TIME"), Some(Some("7".into())));
        // Without credentials, no configuration comes in through the environment.
        let plain = network_command(None, &[OsStr::new("fetch")], "/srv/x", None, 7);
        assert!(
            env_of(&plain)
                .iter()
                .any(|(k, v)| k == "GIT_CONFIG_COUNT" && v.is_none())
        );
    }
}
