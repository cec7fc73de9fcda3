//! The presented stat of what nobody changed: the one definition of the inode number, mode, owner,
//! times and size the mount shows for an entry of the base commit.
//!
//! Two places must agree on it byte for byte: the core, which derives an inode for every base entry
//! it is asked about, and the shared index a new workspace's `.git` starts with
//! (`crate::repo::shared_index`), whose stat data must equal what `lstat` returns through the mount
//! or the first `git status` re-hashes every file. Both read it from here. Owns no state and touches
//! nothing but the object store (for blob sizes).

use std::io;

use gix::ObjectId;

use crate::cow::catalog::Ts;
use crate::git::objects::{EntryKind, ObjectStore};

use super::{Presentation, convert::ts, inodes::path_ino};

/// What the mount presents for base entry `path` while nobody changed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseStat {
    /// The inode number of the path when no other base path's hash collides with it (the core then
    /// salts one of the two; git compares only the low 32 bits anyway).
    pub ino: u64,
    /// Permission bits (no file type).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// mtime, ctime and atime: the base commit's committer time.
    pub time: Ts,
    pub size: u64,
}

/// The permission bits of an unchanged base entry of `kind`.
pub fn base_mode(kind: EntryKind) -> u32 {
    match kind {
        EntryKind::Tree | EntryKind::Gitlink | EntryKind::Executable => 0o755,
        EntryKind::Blob => 0o644,
        EntryKind::Symlink => 0o777,
    }
}

/// The size of an unchanged base entry of `kind` whose object is `id`: a blob's (a file's content,
/// a symlink's target) is its length; a directory's (also a gitlink's) is one block.
pub fn base_size(store: &ObjectStore, kind: EntryKind, id: ObjectId) -> io::Result<u64> {
    match kind {
        EntryKind::Tree | EntryKind::Gitlink => Ok(DIR_SIZE),
        EntryKind::Blob | EntryKind::Executable | EntryKind::Symlink => store.blob_size(id),
    }
}

/// The size every directory presents.
pub(super) const DIR_SIZE: u64 = 4096;

/// The whole presented stat of base entry `path` of `kind` with object `id`.
pub fn base_stat(
    store: &ObjectStore,
    pres: &Presentation,
    path: &[u8],
    kind: EntryKind,
    id: ObjectId,
) -> io::Result<BaseStat> {
    Ok(BaseStat {
        ino: path_ino(path, 0),
        mode: base_mode(kind),
        uid: pres.uid,
        gid: pres.gid,
        time: ts(pres.time),
        size: base_size(store, kind, id)?,
    })
}
