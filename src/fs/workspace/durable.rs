//! The barrier between a new workspace (or one loaded after an unclean stop, while the state file
//! system is synced in the background: `daemon::mounts`) and its first `fsync`: the daemon answers `open` once the
//! workspace's seed, record and binding are in the kernel (a SIGKILL of the daemon loses none of
//! them) and makes them survive power loss in the background. Until that background sync has
//! finished, nothing in the workspace may be reported durable: every `fsync`/`fsyncdir` (they all
//! end in [`WorkspaceFs::sync_catalog`]) waits here first, and fails with `EIO` if the background
//! sync failed. See `docs/crash-safety.md`, "A new workspace".
//!
//! Owns the barrier alone: what the background sync does is the daemon's business; this module
//! never syncs anything but the catalog log it is asked to ([`WorkspaceFs::sync_seed`]).

use std::sync::{Arc, Condvar, Mutex};

use super::WorkspaceFs;
use crate::fs::error::{Context, FsError};

/// Whether a workspace's background sync has finished, and how. Shared between the job that runs
/// the sync ([`Durable::finish`]) and whoever must not answer before it ([`Durable::wait`]).
#[derive(Debug, Default)]
pub struct Durable {
    state: Mutex<Option<Result<(), String>>>,
    finished: Condvar,
}

impl Durable {
    /// A barrier whose sync has not finished yet.
    pub fn pending() -> Arc<Durable> {
        Arc::new(Durable::default())
    }

    /// The sync is over: `Ok`, or why it failed (logged here, once). Wakes every waiter; a second
    /// call changes nothing.
    pub fn finish(&self, outcome: Result<(), String>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.is_some() {
            return;
        }
        if let Err(why) = &outcome {
            tracing::error!(
                "a workspace's state could not be made durable: {why}; its fsyncs fail with EIO until it is remounted"
            );
        }
        *st = Some(outcome);
        self.finished.notify_all();
    }

    /// Blocks until the sync has finished; its outcome.
    pub fn wait(&self) -> Result<(), String> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(outcome) = &*st {
                return outcome.clone();
            }
            st = self.finished.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether the sync has finished (either way).
    pub fn is_finished(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

impl WorkspaceFs {
    /// From now on, nothing in this workspace is reported durable before `barrier` is finished
    /// (set before the workspace is mounted).
    pub fn durable_after(&self, barrier: Arc<Durable>) {
        *self.durable.lock().unwrap_or_else(|p| p.into_inner()) = Some(barrier);
    }

    /// Waits for the background sync of a new workspace, if one was set and has not been waited
    /// for successfully yet: `EIO` if it failed (every later call too: what the workspace was
    /// made of may not be on disk).
    pub fn wait_durable(&self) -> Result<(), FsError> {
        let pending = self
            .durable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(barrier) = pending else {
            return Ok(());
        };
        match barrier.wait() {
            Ok(()) => {
                let mut slot = self.durable.lock().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_some_and(|b| Arc::ptr_eq(b, &barrier)) {
                    *slot = None;
                }
                Ok(())
            }
            Err(why) => Err(FsError::eio(format!(
                "the state of the workspace in {} was never made durable: {why}",
                self.upper.dir().display()
            ))),
        }
    }

    /// The catalog log's sync for the background job of a new workspace: like
    /// [`Self::sync_catalog`] without waiting for [`Self::wait_durable`] (which that job is what
    /// finishes).
    pub fn sync_seed(&self) -> Result<(), FsError> {
        self.catalog_sync
            .sync()
            .context(|| format!("fsync of the catalog in {}", self.upper.dir().display()))
    }

    /// Whether the catalog holds nothing at all: no record, no directory entry, generation 0.
    /// A workspace that was ever seeded never reads so (its seed put `.git` in the root, and every
    /// later change raises the generation), so a record whose workspace loads blank was put in
    /// place by a create whose seed a power loss took (see `docs/crash-safety.md`).
    pub fn is_blank(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.live.generation == 0
            && st.live.dirs.values().all(|d| d.is_empty())
            && st.live.inodes.values().all(|n| !n.persisted)
    }
}
