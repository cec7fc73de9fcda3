//! A directory whose names are not ready yet: a new workspace is mounted before the daemon has put
//! everything in its `.git` (the index of a base nobody built ahead is built after `open` was
//! answered), and every request that would look up, list, create, remove or rename a name of that
//! directory waits until the daemon says it is complete ([`WorkspaceFs::hold_dir`],
//! [`WorkspaceFs::release_dir`]), or fails with a clear error when it cannot be (a failed build,
//! or a wait past [`HELD_WAIT`]). The kernel is never told anything about such a name before it is
//! there, so nothing stale is cached.
//!
//! Owns the hold only (one directory per workspace); it changes no name itself. Internal paths of
//! the core (the daemon putting the names in) never wait.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fuser::Errno;

use super::{ROOT_INO, WorkspaceFs};
use crate::fs::FsError;

/// The longest a request waits for a held directory before it fails (`ETIMEDOUT`): far beyond a
/// shared index build (1.3 s for 100,000 files on 2 vCPUs), short enough that a stuck build is
/// an error a user sees instead of a hung command.
pub const HELD_WAIT: Duration = Duration::from_secs(300);

/// The hold of a workspace: which directory, and how its wait ended (`None` while it lasts).
#[derive(Default)]
pub(super) struct Held {
    dir: Option<(u64, Option<Result<(), String>>)>,
}

impl WorkspaceFs {
    /// Holds directory `dir` (before the mount): every request on its names waits until
    /// [`Self::release_dir`].
    pub fn hold_dir(&self, dir: u64) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        h.dir = Some((dir, None));
        self.any_held.store(true, Ordering::Release);
    }

    /// Ends the hold: `Ok` lets every waiting and later request through; `Err(why)` fails them
    /// (`EIO`, `why` logged with each) until the next hold.
    pub fn release_dir(&self, outcome: Result<(), String>) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(()) => {
                h.dir = None;
                self.any_held.store(false, Ordering::Release);
            }
            Err(why) => {
                if let Some((_, end)) = h.dir.as_mut() {
                    *end = Some(Err(why));
                }
            }
        }
        drop(h);
        self.held_changed.notify_all();
    }

    /// Waits (at most [`HELD_WAIT`]) until no directory is held, or its hold failed.
    pub fn wait_unheld(&self) -> Result<(), FsError> {
        self.wait_held(None)
    }

    /// Whether a directory is held now.
    pub fn is_held(&self) -> bool {
        self.any_held.load(Ordering::Acquire)
    }

    /// Waits while directory `dir` is held (any held directory when `None`). Never called with the
    /// state lock held.
    pub(super) fn wait_held(&self, dir: Option<u64>) -> Result<(), FsError> {
        if !self.any_held.load(Ordering::Acquire) {
            return Ok(());
        }
        let deadline = Instant::now() + HELD_WAIT;
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &h.dir {
                None => return Ok(()),
                Some((d, _)) if dir.is_some_and(|want| want != *d) => return Ok(()),
                Some((_, Some(Ok(())))) => return Ok(()),
                Some((_, Some(Err(why)))) => {
                    return Err(FsError::from(Errno::EIO)
                        .context(format!("the workspace's .git is incomplete: {why}")));
                }
                Some((_, None)) => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(FsError::from(Errno::ETIMEDOUT).context(format!(
                    "the workspace's .git is still being completed after {} s",
                    HELD_WAIT.as_secs()
                )));
            }
            h = self
                .held_changed
                .wait_timeout(h, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// [`Self::wait_held`] for a daemon read by path: waits when the path names what the hold
    /// hides from the daemon, a name of the index (`index`, `index.lock`, `sharedindex.*`) in a
    /// held directory of the root (only `.git` is ever held). Its other names are the daemon's own
    /// (it seeded them before the hold) and are read without waiting, also while mounting.
    pub(super) fn wait_held_path(&self, path: &[&[u8]]) -> Result<(), FsError> {
        if path.len() == 2
            && self.any_held.load(Ordering::Acquire)
            && (path[1] == b"index"
                || path[1] == b"index.lock"
                || path[1].starts_with(b"sharedindex"))
        {
            let first = {
                let mut st = self.lock();
                self.resolve(&mut st, ROOT_INO, path[0])?
            };
            if let Some(ino) = first {
                return self.wait_held(Some(ino));
            }
        }
        Ok(())
    }
}
