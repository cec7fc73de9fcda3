//! What one user's threads may take of the host (docs/security.md, privilege separation; docs/lifecycle.md
//! "Per-user limits"): the cap on each user's live threads (`serve --max-threads-per-user`) and
//! the quota on the bytes their workspaces hold (`serve --quota-per-user`, counted by
//! `cow::quota`).
//!
//! Owns the daemon's count of each user's live threads: the names of the threads whose workspace
//! record is theirs, plus the ones being created. It never writes a record; the records stay the
//! truth, and a name whose record is gone (released, discarded, swept) is dropped from the count
//! when the user reaches the cap. Root (uid 0) is not counted: it is the operator.

use std::collections::{HashMap, HashSet};

use super::error::Error;
use super::refusal::LimitRefusal;
use super::{Daemon, lock};
use crate::workspace::WorkspaceRecord;

/// The default of `serve --max-threads-per-user`: each live thread costs the daemon about five OS
/// threads (its mount's session threads and their notifier), so 256 of one user stay far from
/// the host's `pid_max` (32,768 on small hosts) and leave room for several such users.
pub const DEFAULT_MAX_THREADS_PER_USER: usize = 256;

/// Each user's live threads, by uid.
#[derive(Default)]
pub(super) struct LiveThreads {
    by_user: HashMap<u32, HashSet<String>>,
    /// Threads whose create is under way (their record may not be in place yet).
    creating: HashSet<String>,
    /// Bumped at every insert: a pruning done without the lock applies only if nothing was added
    /// meanwhile.
    epoch: u64,
}

impl LiveThreads {
    /// The count of the records in place at start.
    pub(super) fn from_records(records: &[WorkspaceRecord]) -> LiveThreads {
        let mut live = LiveThreads::default();
        for r in records.iter().filter(|r| r.owner.uid != 0) {
            live.by_user
                .entry(r.owner.uid)
                .or_default()
                .insert(r.thread.clone());
        }
        live
    }
}

/// A new live thread of a user, counted from [`Daemon::reserve_live`] on; dropped without
/// [`LiveSlot::keep`] (the create failed), it is no longer counted.
pub(super) struct LiveSlot<'a> {
    daemon: &'a Daemon,
    thread: String,
    uid: u32,
    counted: bool,
    kept: bool,
}

impl LiveSlot<'_> {
    /// The thread was created: it stays counted until its record goes.
    pub(super) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for LiveSlot<'_> {
    fn drop(&mut self) {
        if !self.counted {
            return;
        }
        let mut l = lock(&self.daemon.live);
        l.creating.remove(&self.thread);
        if !self.kept
            && let Some(set) = l.by_user.get_mut(&self.uid)
        {
            set.remove(&self.thread);
        }
    }
}

impl Daemon {
    /// Counts the workspace `core` of owner `uid` against their quota (with one; root has none).
    pub(super) fn count_bytes(&self, core: &crate::fs::WorkspaceFs, uid: u32) {
        let Some(limit) = self.settings.quota_per_user.filter(|_| uid != 0) else {
            return;
        };
        let user = lock(&self.quotas)
            .entry(uid)
            .or_insert_with(|| std::sync::Arc::new(crate::cow::quota::UserBytes::new(limit)))
            .clone();
        core.count_against(user);
    }

    /// Whether mounts of user `uid` may hand I/O to the kernel: not with a quota that counts
    /// them, which must see every write (docs/overlay.md "Quota").
    pub(super) fn passthrough_for(&self, uid: u32) -> bool {
        self.settings.passthrough && (self.settings.quota_per_user.is_none() || uid == 0)
    }

    /// User `uid`'s bytes and quota, when one counts them.
    pub(super) fn quota_of(&self, uid: u32) -> Option<(u64, u64)> {
        lock(&self.quotas).get(&uid).map(|u| (u.used(), u.limit()))
    }

    /// Counts `thread`, about to be created for user `uid`, among that user's live threads, or
    /// refuses it (one line naming the cap and the count) when they hold the most a user may.
    /// The check and the count are one step under the daemon's `live` lock, so concurrent creates
    /// by one user (under different threads' locks) cannot pass the cap together. Call it before
    /// anything of the thread is written.
    pub(super) fn reserve_live(&self, thread: &str, uid: u32) -> Result<LiveSlot<'_>, Error> {
        let cap = self.settings.max_threads_per_user;
        let mut slot = LiveSlot {
            daemon: self,
            thread: thread.to_string(),
            uid,
            counted: false,
            kept: false,
        };
        if uid == 0 || cap == 0 {
            return Ok(slot);
        }
        // At most twice: as counted, then once more after dropping names whose record is gone.
        for pruned in [false, true] {
            let (names, epoch) = {
                let mut guard = lock(&self.live);
                let l = &mut *guard;
                let set = l.by_user.entry(uid).or_default();
                if set.contains(thread) || set.len() < cap {
                    set.insert(thread.to_string());
                    l.creating.insert(thread.to_string());
                    l.epoch += 1;
                    slot.counted = true;
                    return Ok(slot);
                }
                if pruned {
                    return Err(LimitRefusal::TooMany {
                        uid,
                        live: set.len(),
                        cap,
                    }
                    .into());
                }
                let names: Vec<String> = set
                    .iter()
                    .filter(|t| !l.creating.contains(*t))
                    .cloned()
                    .collect();
                (names, l.epoch)
            };
            // The records are read without the lock (docs/locking-daemon.md): a name whose record
            // is gone or is another user's is no longer this user's live thread.
            let stale: Vec<String> = names
                .into_iter()
                .filter(|t| {
                    !matches!(WorkspaceRecord::load(&self.layout, t),
                        Ok(Some(r)) if r.owner.uid == uid)
                })
                .collect();
            let mut l = lock(&self.live);
            if l.epoch == epoch
                && let Some(set) = l.by_user.get_mut(&uid)
            {
                for t in &stale {
                    set.remove(t);
                }
            }
        }
        Err(LimitRefusal::AtCap { uid, cap }.into())
    }
}
