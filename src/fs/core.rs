//! The filesystem core of one workspace: inode table, attributes, directory listings, opens.
//!
//! Every method returns `Result<_, Errno>`: the core never panics on a request and every failure has
//! its errno. Inode numbers are a pure function of the path (see `docs/inodes.md`), so they are the
//! same for every lookup, across forgets and across daemon restarts. Until the copy-on-write layer
//! lands, every write answers `EROFS`.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dashmap::DashMap;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use gix::ObjectId;

use crate::cow::blobcache::BlobCache;
use crate::git::objects::{EntryKind, ObjectStore, TreeEntry};

pub const ROOT_INO: u64 = 1;
/// Longest file name a directory entry may have (as on ext4).
pub const NAME_MAX: usize = 255;

/// A directory entry with its attributes (readdirplus needs both).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub attr: FileAttr,
    /// What the entry is in the base (`None` for `.` and `..`), so that readdirplus can register it.
    source: Option<(EntryKind, ObjectId)>,
}

/// A known inode: where it is and what the base says it is.
#[derive(Debug, Clone)]
struct Node {
    /// Path relative to the workspace root, `/`-separated, empty for the root.
    path: Box<[u8]>,
    kind: EntryKind,
    id: ObjectId,
    /// Lookups the kernel holds (FUSE lookup count); the node is dropped when it reaches zero.
    lookups: u64,
}

/// How the workspace presents ownership and times.
#[derive(Debug, Clone, Copy)]
pub struct Presentation {
    pub uid: u32,
    pub gid: u32,
    /// The base commit's committer time: mtime, ctime and atime of every unmodified entry.
    pub time: SystemTime,
}

/// The filesystem of one workspace.
pub struct WorkspaceFs {
    store: Arc<ObjectStore>,
    blobs: Arc<BlobCache>,
    root_tree: ObjectId,
    pres: Presentation,
    /// Where `statfs` reports space from (the state directory's file system).
    statfs_path: PathBuf,
    nodes: DashMap<u64, Node>,
}

impl std::fmt::Debug for WorkspaceFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceFs")
            .field("root_tree", &self.root_tree)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

/// The inode number of `path`: the first 8 bytes of its BLAKE3 hash, with the top bit clear (numbers
/// with the top bit set are reserved for inodes the workspace creates) and never 0 or 1.
pub fn path_ino(path: &[u8], salt: u32) -> u64 {
    if path.is_empty() {
        return ROOT_INO;
    }
    let mut h = blake3::Hasher::new();
    h.update(path);
    if salt != 0 {
        h.update(&salt.to_le_bytes());
    }
    let bytes = h.finalize();
    let mut n = u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"));
    n &= !(1u64 << 63);
    if n < 2 { n + 2 } else { n }
}

fn eio(e: impl std::fmt::Display) -> Errno {
    tracing::error!("object store: {e}");
    Errno::EIO
}

impl WorkspaceFs {
    pub fn new(
        store: Arc<ObjectStore>,
        blobs: Arc<BlobCache>,
        root_tree: ObjectId,
        pres: Presentation,
        statfs_path: PathBuf,
    ) -> WorkspaceFs {
        let nodes = DashMap::new();
        nodes.insert(
            ROOT_INO,
            Node {
                path: Box::new([]),
                kind: EntryKind::Tree,
                id: root_tree,
                lookups: 1,
            },
        );
        WorkspaceFs {
            store,
            blobs,
            root_tree,
            pres,
            statfs_path,
            nodes,
        }
    }

    pub fn blob_cache(&self) -> &BlobCache {
        &self.blobs
    }

    fn node(&self, ino: u64) -> Result<Node, Errno> {
        // Clone out: never hold a DashMap guard across further map calls.
        self.nodes.get(&ino).map(|n| n.clone()).ok_or(Errno::ENOENT)
    }

    fn attr_of(&self, ino: u64, kind: EntryKind, id: ObjectId) -> Result<FileAttr, Errno> {
        let (ftype, perm, size, nlink) = match kind {
            EntryKind::Tree => {
                let subdirs = self
                    .store
                    .tree(id)
                    .map_err(eio)?
                    .iter()
                    .filter(|e| matches!(e.kind, EntryKind::Tree | EntryKind::Gitlink))
                    .count();
                (FileType::Directory, 0o755, 4096, 2 + subdirs as u32)
            }
            EntryKind::Gitlink => (FileType::Directory, 0o755, 4096, 2),
            EntryKind::Blob => (
                FileType::RegularFile,
                0o644,
                self.store.blob_size(id).map_err(eio)?,
                1,
            ),
            EntryKind::Executable => (
                FileType::RegularFile,
                0o755,
                self.store.blob_size(id).map_err(eio)?,
                1,
            ),
            EntryKind::Symlink => (
                FileType::Symlink,
                0o777,
                self.store.blob_size(id).map_err(eio)?,
                1,
            ),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.pres.time,
            mtime: self.pres.time,
            ctime: self.pres.time,
            crtime: self.pres.time,
            kind: ftype,
            perm,
            nlink,
            uid: self.pres.uid,
            gid: self.pres.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// The entries of directory `node` (a gitlink is an empty directory).
    fn children(&self, node: &Node) -> Result<Arc<[TreeEntry]>, Errno> {
        match node.kind {
            EntryKind::Tree => self.store.tree(node.id).map_err(eio),
            EntryKind::Gitlink => Ok(Arc::from(Vec::new())),
            _ => Err(Errno::ENOTDIR),
        }
    }

    fn child_path(parent: &Node, name: &[u8]) -> Vec<u8> {
        let mut p = Vec::with_capacity(parent.path.len() + 1 + name.len());
        if !parent.path.is_empty() {
            p.extend_from_slice(&parent.path);
            p.push(b'/');
        }
        p.extend_from_slice(name);
        p
    }

    /// The inode number for `path`, salted past any other path already holding the plain hash.
    fn ino_for(&self, path: &[u8]) -> u64 {
        let mut salt = 0;
        loop {
            let ino = path_ino(path, salt);
            match self.nodes.get(&ino) {
                Some(n) if *n.path != *path => salt += 1,
                _ => return ino,
            }
        }
    }

    /// Registers (or re-references) the child `entry` of `parent` and returns its attributes. Each
    /// call counts one kernel lookup.
    fn remember(&self, parent: &Node, entry: &TreeEntry) -> Result<FileAttr, Errno> {
        let ino = self.ino_for(&Self::child_path(parent, &entry.name));
        let attr = self.attr_of(ino, entry.kind, entry.id)?;
        self.register(parent, &entry.name, ino, entry.kind, entry.id);
        Ok(attr)
    }

    fn register(&self, parent: &Node, name: &[u8], ino: u64, kind: EntryKind, id: ObjectId) {
        self.nodes
            .entry(ino)
            .and_modify(|n| n.lookups += 1)
            .or_insert_with(|| Node {
                path: Self::child_path(parent, name).into_boxed_slice(),
                kind,
                id,
                lookups: 1,
            });
    }

    /// `lookup`: the attributes of `name` in `parent`, counting one kernel reference.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let p = self.node(parent)?;
        let children = self.children(&p)?;
        let name = name.as_bytes();
        let entry = children
            .iter()
            .find(|e| &*e.name == name)
            .ok_or(Errno::ENOENT)?;
        self.remember(&p, entry)
    }

    /// `forget`: the kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        self.nodes.remove_if_mut(&ino, |_, node| {
            node.lookups = node.lookups.saturating_sub(n);
            node.lookups == 0
        });
    }

    pub fn getattr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let n = self.node(ino)?;
        self.attr_of(ino, n.kind, n.id)
    }

    /// The whole listing of directory `ino`, `.` and `..` first. Entries other than `.` and `..` are
    /// *not* counted as lookups; readdirplus calls [`Self::note_listed`] for each entry it returns.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>, Errno> {
        let n = self.node(ino)?;
        let children = self.children(&n)?;
        let mut out = Vec::with_capacity(children.len() + 2);
        let dot = self.attr_of(ino, n.kind, n.id)?;
        out.push(DirEntry {
            name: ".".into(),
            attr: dot,
            source: None,
        });
        // Only the inode number matters for "..": the kernel neither caches nor counts it.
        let parent_path = n
            .path
            .iter()
            .rposition(|&b| b == b'/')
            .map_or(&[][..], |i| &n.path[..i]);
        let parent_ino = if ino == ROOT_INO {
            ROOT_INO
        } else {
            self.ino_for(parent_path)
        };
        out.push(DirEntry {
            name: "..".into(),
            attr: FileAttr {
                ino: INodeNo(parent_ino),
                ..dot
            },
            source: None,
        });
        for e in children.iter() {
            let path = Self::child_path(&n, &e.name);
            let ino = self.ino_for(&path);
            out.push(DirEntry {
                name: OsString::from_vec(e.name.to_vec()),
                attr: self.attr_of(ino, e.kind, e.id)?,
                source: Some((e.kind, e.id)),
            });
        }
        Ok(out)
    }

    /// readdirplus handed `entry` to the kernel, which now holds a reference to it (`.` and `..` are
    /// not counted).
    pub fn note_listed(&self, parent: u64, entry: &DirEntry) -> Result<(), Errno> {
        let Some((kind, id)) = entry.source else {
            return Ok(());
        };
        let p = self.node(parent)?;
        self.register(&p, entry.name.as_bytes(), entry.attr.ino.0, kind, id);
        Ok(())
    }

    /// Opens `ino` for reading. Any write intent answers `EROFS` until the copy-on-write layer lands.
    pub fn open(&self, ino: u64, flags: i32) -> Result<File, Errno> {
        let n = self.node(ino)?;
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS);
        }
        match n.kind {
            EntryKind::Blob | EntryKind::Executable => {
                let size = self.store.blob_size(n.id).map_err(eio)?;
                self.blobs.open(&self.store, n.id, size).map_err(eio)
            }
            EntryKind::Tree | EntryKind::Gitlink => Err(Errno::EISDIR),
            EntryKind::Symlink => Err(Errno::ELOOP),
        }
    }

    pub fn opendir(&self, ino: u64) -> Result<(), Errno> {
        let n = self.node(ino)?;
        self.children(&n).map(|_| ())
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let n = self.node(ino)?;
        if n.kind != EntryKind::Symlink {
            return Err(Errno::EINVAL);
        }
        self.store.blob(n.id).map_err(eio)
    }

    /// `access`: existence, and write access refused while the workspace is read-only.
    pub fn access(&self, ino: u64, mask: i32) -> Result<(), Errno> {
        self.node(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(Errno::EROFS);
        }
        Ok(())
    }

    pub fn statfs(&self) -> Result<crate::sys::FsStats, Errno> {
        crate::sys::statvfs(&self.statfs_path)
            .map(|mut s| {
                s.namelen = NAME_MAX as u32;
                s
            })
            .map_err(|e| Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)))
    }

    /// The path of `ino` relative to the workspace root (for logs and tests).
    pub fn path_of(&self, ino: u64) -> Option<PathBuf> {
        self.nodes
            .get(&ino)
            .map(|n| PathBuf::from(OsStr::from_bytes(&n.path)))
    }
}

/// `SystemTime` for Unix seconds (negative times clamp to the epoch).
pub fn unix_time(secs: i64) -> SystemTime {
    if secs <= 0 {
        UNIX_EPOCH
    } else {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    }
}
