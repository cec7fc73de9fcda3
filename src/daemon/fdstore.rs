//! systemd's file-descriptor store, the connection keeper's twin where the daemon runs as a unit
//! with `FileDescriptorStoreMax=` (docs/restart.md "A crash"): every mount's `/dev/fuse`
//! descriptors (the connection's and its readers' clones) are stored with the service manager
//! (`sd_notify` `FDSTORE=1`, `FDNAME=<thread>`, `SCM_RIGHTS`), which keeps them across a crash of
//! the daemon and hands them to the next start of the unit (`LISTEN_FDS`, `LISTEN_FDNAMES`,
//! `LISTEN_PID`, descriptors from 3); that daemon adopts them as it adopts the keeper's. What the
//! next daemon needs besides (the INIT outcome, the mode) is in `<state>/fdstore.json`.
//!
//! Owns that protocol only: it never reads or writes a request and never unmounts. Active only
//! when the manager says the unit has a store (`$NOTIFY_SOCKET` and `$FDSTORE` > 0, systemd ≥ 254);
//! otherwise every function does nothing. A stop removes every stored descriptor
//! (`FDSTOREREMOVE=1`): nothing holding a connection outlives `octofs stop`.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::keeper::{Kept, KeptMeta};
use super::lock;
use crate::layout::Layout;

/// What the store holds, beside the descriptors: per thread, its mount point and facts.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Index {
    mounts: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    path: PathBuf,
    meta: KeptMeta,
}

/// The state file naming what the store holds (`None`: the store is not in use).
static INDEX: Mutex<Option<(PathBuf, Index)>> = Mutex::new(None);

fn index_file(layout: &Layout) -> PathBuf {
    layout.state.join("fdstore.json")
}

/// Whether the service manager keeps descriptors for this daemon.
fn available() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
        && std::env::var("FDSTORE")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .is_some_and(|n| n > 0)
}

/// At start: takes the descriptors the service manager handed this process (a daemon of the unit
/// died with them stored), with what `fdstore.json` says of each thread, and from now on stores
/// this daemon's. Empty when the store is not in use.
pub(super) fn attach(layout: &Layout) -> Vec<Kept> {
    let file = index_file(layout);
    let old: Index = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let passed = crate::sys::listen_fds();
    if !available() {
        // Handed descriptors with no store to keep them in: not ours to serve (closed).
        if !passed.is_empty() {
            tracing::warn!(
                n = passed.len(),
                "descriptors passed by the service manager, but it has no store: closed"
            );
        }
        let _ = std::fs::remove_file(&file);
        return Vec::new();
    }
    let mut by_thread: BTreeMap<String, Vec<OwnedFd>> = BTreeMap::new();
    for (name, fd) in passed {
        by_thread.entry(name).or_default().push(fd);
    }
    let mut kept = Vec::new();
    for (thread, fds) in by_thread {
        match old.mounts.get(&thread) {
            Some(e) => kept.push(Kept {
                thread,
                path: e.path.clone(),
                meta: e.meta.clone(),
                fds,
            }),
            None => {
                tracing::warn!(%thread, "the service manager kept descriptors nobody recorded: removed");
                remove(&thread);
            }
        }
    }
    *lock(&INDEX) = Some((file, Index::default()));
    if !kept.is_empty() {
        tracing::info!(
            mounts = kept.len(),
            "the service manager kept the mounts of a daemon that died"
        );
    }
    kept
}

/// Whether the service manager keeps this daemon's descriptors.
pub(super) fn active() -> bool {
    lock(&INDEX).is_some()
}

fn save(file: &Path, index: &Index) {
    let r = serde_json::to_vec(index)
        .map_err(std::io::Error::other)
        .and_then(|b| crate::records::write_atomic(file, &b));
    if let Err(e) = r {
        tracing::warn!("cannot write {}: {e}", file.display());
    }
}

/// Stores `thread`'s descriptors (replacing any stored for it).
pub(super) fn keep(thread: &str, path: &Path, meta: &KeptMeta, fds: &[OwnedFd]) {
    let mut g = lock(&INDEX);
    let Some((file, index)) = g.as_mut() else {
        return;
    };
    index.mounts.insert(
        thread.to_string(),
        Entry {
            path: path.to_path_buf(),
            meta: meta.clone(),
        },
    );
    save(file, index);
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    // The descriptors held before (a dead daemon's clones) go first: their requests were sent
    // again before this daemon's readers started.
    remove(thread);
    let msg = format!("FDSTORE=1\nFDNAME={thread}");
    if let Err(e) = crate::sys::notify_with_fds(&msg, &borrowed) {
        tracing::error!(%thread, "cannot store its connection with the service manager: {e}");
    }
}

fn remove(thread: &str) {
    if let Err(e) = crate::sys::notify_with_fds(&format!("FDSTOREREMOVE=1\nFDNAME={thread}"), &[]) {
        tracing::warn!(%thread, "cannot remove its connection from the service manager's store: {e}");
    }
}

/// `thread` is unmounted: its descriptors leave the store.
pub(super) fn forget(thread: &str) {
    let mut g = lock(&INDEX);
    let Some((file, index)) = g.as_mut() else {
        return;
    };
    if index.mounts.remove(thread).is_some() {
        save(file, index);
    }
    remove(thread);
}

/// At a stop: every stored descriptor leaves the store.
pub(super) fn quit() {
    let Some((file, index)) = lock(&INDEX).take() else {
        return;
    };
    for thread in index.mounts.keys() {
        remove(thread);
    }
    let _ = std::fs::remove_file(file);
}
