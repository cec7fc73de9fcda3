//! What snapshots keep in memory between them ([`Caches`]): the trees recent snapshots wrote, by
//! id, and the blob ids of files saved before (`file_blobs`).
//!
//! The caches are values, not process-wide: the daemon owns one for all its workspaces and passes
//! it to every snapshot (and to the object stores it opens, which serve a just-written tree from
//! it); a test or a bench makes its own. Owns the bound of that memory and what it forgets; must
//! not decide what is written (the editor does): it only answers with bytes it was given, which
//! are right for any mirror because ids are content hashes.

use super::file_blobs::FileBlobs;

use gix::ObjectId;

/// The memory snapshots share: one per daemon (shared by every workspace and mirror), or one per
/// test. Empty at start: after a restart every file is read, and every tree opened, once more.
#[derive(Default)]
pub struct Caches {
    /// The trees recent snapshots wrote.
    pub(super) trees: WrittenTrees,
    /// The blob ids of files saved before, by stamp.
    pub(super) files: FileBlobs,
}

impl Caches {
    pub fn new() -> Caches {
        Caches::default()
    }

    /// The bytes of tree `id` if a snapshot using these caches wrote it recently (kept in memory,
    /// see [`WrittenTrees`]); the ids are content hashes, so the bytes are right for any mirror.
    pub fn kept_tree(&self, id: &gix::oid) -> Option<std::sync::Arc<[u8]>> {
        self.trees.get(id)
    }
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches").finish_non_exhaustive()
    }
}

/// The trees recent snapshots wrote, uncompressed, by id. A snapshot edits the trees on the paths
/// that changed since the last one, which are mostly trees the last snapshot wrote: served from
/// here, they are not opened, inflated and copied again from loose objects (a 1,000-entry
/// directory is ~35 KiB of tree, and every changed directory is one). Content-addressed, so an
/// entry is right for any mirror; the editor reads only trees named by a tree it already has (the
/// root is checked to be in the mirror first). Bounded: past [`WRITTEN_TREES_MAX`] bytes it
/// starts again empty.
#[derive(Default)]
pub(super) struct WrittenTrees {
    trees: std::sync::Mutex<KeptTrees>,
}

/// The kept trees and their bytes in all.
#[derive(Default)]
struct KeptTrees {
    by_id: std::collections::HashMap<ObjectId, std::sync::Arc<[u8]>>,
    bytes: usize,
}

/// Bytes of trees kept at most (by one [`Caches`]: shared by every workspace of the daemon).
const WRITTEN_TREES_MAX: usize = 16 << 20;

impl WrittenTrees {
    pub(super) fn get(&self, id: &gix::oid) -> Option<std::sync::Arc<[u8]>> {
        let t = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        t.by_id.get(id).cloned()
    }

    pub(super) fn put(&self, id: ObjectId, bytes: Vec<u8>) {
        if bytes.len() > WRITTEN_TREES_MAX / 4 {
            return;
        }
        let mut t = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        if t.by_id.contains_key(&id) {
            return;
        }
        if t.bytes + bytes.len() > WRITTEN_TREES_MAX {
            t.by_id.clear();
            t.bytes = 0;
        }
        t.bytes += bytes.len();
        t.by_id.insert(id, bytes.into());
    }
}
