//! The index of a new workspace whose base nobody built the shared index of ahead (a branch other
//! than the default, another owner): `open` is answered once the workspace is mounted, with its
//! `.git` held (`WorkspaceFs::hold_dir`: every request on its names waits), and the shared index
//! is built after the answer on a thread of its own; its split index then goes into the `.git`,
//! the hold ends and the kernel is told. The first git command pays for the build at most once
//! and finds the index it would have found had the build been done before the answer.
//!
//! Owns that build and its end only. Must not decide anything of `open` (that is `super::create`)
//! nor write the workspace other than the two index files (`repo::put_index`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::{Daemon, lock};
use crate::fs::WorkspaceFs;
use crate::git::objects::ObjectStore;
use crate::workspace::{Owner, WorkspaceRecord};

/// What the build of a new workspace's index needs, taken before it was mounted.
pub(super) struct PendingIndex {
    pub(super) store: Arc<ObjectStore>,
    pub(super) core: Arc<WorkspaceFs>,
    /// The held `.git` (`None`: the base has a `.git` of its own; only the shared index is built,
    /// for the next forks and the I/O mode's weighing).
    pub(super) git: Option<u64>,
    /// The work tree's real path (the untracked cache's ident).
    pub(super) worktree: PathBuf,
    pub(super) index_tree: gix::ObjectId,
    pub(super) worktree_tree: gix::ObjectId,
    pub(super) base_time: i64,
    pub(super) owner: Owner,
}

impl Daemon {
    /// Builds `p`'s shared index after the answer of `thread`'s `open` (on a thread of its own, so
    /// no pool waits behind it; on the caller's when none can be started), puts its split index
    /// into the held `.git`, ends the hold (an error for whoever waits when that failed) and tells
    /// the kernel what changed behind it.
    pub(super) fn complete_index(&self, thread: &str, p: PendingIndex) {
        let layout = self.layout.clone();
        let locks = self.locks.clone();
        let kernel = lock(&self.mounts)
            .get(thread)
            .and_then(|m| Some((m.session.notifier()?, m.info.clone())));
        let thread = thread.to_string();
        // Counted as a control request in flight: `octofs restart` waits for the build to end
        // (two daemons never write one upper layer). Refused only while a handover runs, which
        // waits for the caller's own request first: then the next daemon puts the index in.
        let in_flight = match super::takeover::enter() {
            Ok(g) => g,
            Err(e) => {
                tracing::warn!(%thread, "not building the index here: {e}");
                p.core.release_dir(Err(e.to_string()));
                return;
            }
        };
        let job = move || {
            let _in_flight = in_flight;
            let started = Instant::now();
            let built = {
                let l = locks.get(&super::mirrors::index_lock_key(
                    p.index_tree,
                    p.worktree_tree,
                ));
                let _g = lock(&l);
                crate::repo::shared_index(
                    &layout,
                    &p.store,
                    p.index_tree,
                    p.worktree_tree,
                    p.base_time,
                    p.owner.uid,
                    p.owner.gid,
                )
            };
            let ms = started.elapsed().as_millis() as u64;
            let Some(git) = p.git else {
                if let Err(e) = built {
                    tracing::warn!(%thread, "cannot build the shared index: {e}");
                }
                return;
            };
            let put = built.and_then(|index| {
                crate::repo::put_index(&p.core, git, &p.worktree, &index, p.base_time, true)
            });
            match &put {
                Ok(()) => tracing::info!(%thread, ms, "the workspace's index is in place"),
                Err(e) => tracing::error!(%thread, ms, "cannot put the workspace's index in: {e}"),
            }
            p.core.release_dir(put.map_err(|e| e.to_string()));
            // After the hold ended: an invalidation waits for the requests in flight on the
            // directory, which were waiting for the hold.
            if let Some((notifier, info)) = kernel {
                crate::fs::fuse::invalidate_mount(&info, &notifier, &p.core.take_behind());
            }
        };
        let slot = Arc::new(std::sync::Mutex::new(Some(job)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("octofs-index".into())
            .spawn(move || {
                if let Some(j) = theirs.lock().unwrap_or_else(|e| e.into_inner()).take() {
                    j();
                }
            });
        if spawned.is_err() {
            tracing::warn!("cannot start a thread for the index: building it before the answer");
            if let Some(j) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
                j();
            }
        }
    }

    /// A workspace loaded again (a mount, the adoption after a restart or a crash) whose index was
    /// to come after its mount (`index_later`) and whose `.git` has none yet — the daemon that
    /// was to put it in stopped first, or a power loss took its catalog records: holds its `.git`
    /// and builds the index as at its first open.
    pub(super) fn index_still_missing(&self, rec: &WorkspaceRecord, core: &Arc<WorkspaceFs>) {
        if !rec.index_later || rec.chat {
            return;
        }
        let Ok(Some(attr)) = core.attr_at(&[b".git"]) else {
            return;
        };
        let Ok(Some(names)) = core.list_dir(&[b".git"]) else {
            return;
        };
        if names
            .iter()
            .any(|(n, _)| n == b"index" || n.starts_with(b"sharedindex."))
        {
            return;
        }
        let store = match self.store(&rec.project) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(thread = %rec.thread, "cannot put its index in: {e}");
                return;
            }
        };
        tracing::info!(thread = %rec.thread, "its index never came: building it");
        let git = attr.ino.0;
        core.hold_dir(git);
        let worktree = std::fs::canonicalize(&self.layout.root)
            .unwrap_or_else(|_| self.layout.root.clone())
            .join(&rec.thread);
        self.complete_index(
            &rec.thread,
            PendingIndex {
                store,
                core: core.clone(),
                git: Some(git),
                worktree,
                index_tree: rec.base_tree,
                worktree_tree: rec.base_tree,
                base_time: rec.base_time,
                owner: rec.owner,
            },
        );
    }
}
