//! The bytes one workspace's upper layer holds, and the per-user quota they count against
//! (`octofs serve --quota-per-user`; docs/overlay.md "Quota").
//!
//! Owns the counting only: [`Usage`] is one upper layer's, kept by its [`super::upper::Upper`];
//! [`UserBytes`] is one user's total across their workspaces, shared by their upper layers. Nothing
//! here reads or writes a data file's content: the callers ask before they make a file larger
//! ([`Usage::grow`]) and tell when they made one smaller or removed it.
//!
//! What counts: each data file at its charged size, the largest extent anything was allowed to give
//! it (writes, truncates, fallocate, a copy-up's whole base file), which is never less than its
//! apparent size nor, after a load, than what it allocates. Catalog records (names, directories,
//! symlinks, attributes) are not counted. A charge is one atomic add on the user's counter (a
//! compare-and-swap loop against the limit); a write that does not grow its file takes one read of
//! a sharded map, no lock of the workspace.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use dashmap::DashMap;

/// One user's bytes across their workspaces' upper layers, and the most they may hold.
#[derive(Debug)]
pub struct UserBytes {
    used: AtomicU64,
    limit: u64,
}

impl UserBytes {
    pub fn new(limit: u64) -> UserBytes {
        UserBytes {
            used: AtomicU64::new(0),
            limit,
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Adds `n` unless that would pass the limit (`EDQUOT`, nothing added).
    fn charge(&self, n: u64) -> io::Result<()> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= self.limit)
            })
            .map(|_| ())
            .map_err(|_| io::Error::from_raw_os_error(libc::EDQUOT))
    }

    /// Adds `n` whatever the limit (what a layer already held when it was loaded).
    fn add(&self, n: u64) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    fn refund(&self, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                Some(u.saturating_sub(n))
            });
    }
}

/// One upper layer's bytes: each data file's charged size, their total, and the user they count
/// against (none: no quota, the total is only shown).
#[derive(Debug, Default)]
pub struct Usage {
    files: DashMap<u64, u64>,
    used: AtomicU64,
    user: OnceLock<Arc<UserBytes>>,
}

impl Usage {
    /// The layer's files as they are (loaded from disk): counted, whatever the limit.
    pub fn counted(&self, ino: u64, size: u64) {
        if let Some(before) = self.files.insert(ino, size) {
            self.used.fetch_sub(before, Ordering::AcqRel);
        }
        self.used.fetch_add(size, Ordering::AcqRel);
    }

    /// Counts this layer against `user` from now on (once; a second call changes nothing).
    pub fn attach(&self, user: Arc<UserBytes>) {
        let mut added = false;
        self.user.get_or_init(|| {
            added = true;
            user.clone()
        });
        if added {
            user.add(self.used.load(Ordering::Acquire));
        }
    }

    /// The bytes this layer holds.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether the user is at their limit: nothing may be added, not even an empty file.
    pub fn full(&self) -> bool {
        self.user.get().is_some_and(|u| u.used() >= u.limit())
    }

    /// Before data file `ino` may extend to `end` bytes: charges what it grows by, or `EDQUOT`
    /// (nothing charged: the caller changes nothing).
    pub fn grow(&self, ino: u64, end: u64) -> io::Result<()> {
        if self.files.get(&ino).is_some_and(|c| *c >= end) {
            return Ok(());
        }
        let mut c = self.files.entry(ino).or_insert(0);
        if *c >= end {
            return Ok(());
        }
        let delta = end - *c;
        if let Some(u) = self.user.get() {
            u.charge(delta)?;
        }
        self.used.fetch_add(delta, Ordering::AcqRel);
        *c = end;
        Ok(())
    }

    /// Data file `ino` was made `size` bytes long (a truncate down): what it held past that is
    /// given back. (Growing goes through [`Usage::grow`] first.)
    pub fn shrunk(&self, ino: u64, size: u64) {
        if let Some(mut c) = self.files.get_mut(&ino)
            && *c > size
        {
            let back = *c - size;
            *c = size;
            drop(c);
            self.give_back(back);
        }
    }

    /// Data file `ino` is gone: all it was charged is given back.
    pub fn removed(&self, ino: u64) {
        if let Some((_, c)) = self.files.remove(&ino) {
            self.give_back(c);
        }
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
        if let Some(u) = self.user.get() {
            u.refund(n);
        }
    }
}

impl Drop for Usage {
    /// The layer is no longer served (released, or its core dropped): its bytes no longer count
    /// against the user (a later load counts them again from disk).
    fn drop(&mut self) {
        if let Some(u) = self.user.get() {
            u.refund(self.used.load(Ordering::Acquire));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_charge_past_the_limit_is_refused_and_changes_nothing() {
        let user = Arc::new(UserBytes::new(100));
        let a = Usage::default();
        a.counted(1, 30);
        a.attach(user.clone());
        assert_eq!(user.used(), 30);
        a.grow(1, 20).unwrap();
        assert_eq!(user.used(), 30, "a write inside the file costs nothing");
        a.grow(1, 90).unwrap();
        assert_eq!(user.used(), 90);
        let b = Usage::default();
        b.attach(user.clone());
        let e = b.grow(7, 11).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EDQUOT));
        assert_eq!((user.used(), b.used()), (90, 0));
        b.grow(7, 10).unwrap();
        assert!(b.full());
        a.shrunk(1, 40);
        assert_eq!(user.used(), 50);
        b.removed(7);
        assert_eq!(user.used(), 40);
        drop(a);
        assert_eq!(user.used(), 0);
    }
}
