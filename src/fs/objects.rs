//! The mirror's object store presented read-only inside a workspace, at `.git/octofs/objects`, so
//! that everything the workspace's git needs is reachable inside the mount (`docs/overlay.md`,
//! "The base objects inside the mount"). The workspace's `objects/info/alternates` names it by the
//! relative path [`ALTERNATE`]: a sandbox that binds only the workspace still finds the history.
//!
//! It owns the virtual inodes of that subtree (numbers with [`VIRTUAL`]'s bits set, which neither
//! derived nor allocated inodes ever have) and serves them from the host directory, each name opened
//! with [`crate::sys::open_beneath`] (no symlink followed, nothing outside the directory reached).
//! It never writes: every change in the subtree is refused with `EROFS` by the adapter. It does not
//! touch the workspace's core: the subtree is not in the catalog, so it is in no snapshot, view or
//! status. The daemon reads the mirror as root, so every request checks here what the host's
//! permissions would have: the caller is the workspace's owner or root, and the owner may still bind
//! the project (the `allowed` gate, which `mirror access` changes at once).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{Errno, FileAttr, FileType, INodeNo};

use super::FsError;

/// The name of the virtual directory in the workspace's `.git` (git ignores names it does not
/// know there).
pub const NAME: &str = "octofs";
/// What the workspace's `objects/info/alternates` holds: relative to `.git/objects`, as git reads
/// it.
pub const ALTERNATE: &str = "../octofs/objects";
/// The bits every virtual inode number has: the top two. Derived inodes never have the top bit,
/// allocated ones count up from it and never reach the next.
pub const VIRTUAL: u64 = 0b11 << 62;
/// `.git/octofs`.
pub const TOP_INO: u64 = VIRTUAL;
/// `.git/octofs/objects`: the mirror's `.git/objects`.
const OBJECTS_INO: u64 = VIRTUAL | 1;
/// The kernel keeps no attributes below `.git/octofs` and no name of a file: the mirror gains
/// packs (sync, snapshots) and loses them (gc) while workspaces live, git replaces files under
/// their names (`commit-graph`, `multi-pack-index`), and every request checks the owner's access
/// again. Attributes at TTL 0 are what keeps both right with directory names kept
/// ([`DIR_ENTRY_TTL`]): the mount has `default_permissions`, so the kernel asks GETATTR of each
/// directory with stale attributes before a path walk passes it (the access check runs on every
/// walk), and the GETATTR of a directory being opened refreshes its mtime, which the kernel
/// compares with its cached listing (a new pack is listed at once). `docs/caching.md`.
pub const TTL: Duration = Duration::ZERO;
/// How long the kernel may keep the name of a directory of the subtree (`.git/octofs`, `objects`,
/// `pack`, `info`, the loose objects' fan-out): a path walk into the tree sends no LOOKUP for
/// them, only the GETATTRs above. Such a directory is never replaced under its name while it
/// lives (a fan-out directory gc removed and git made again is found by its path).
pub const DIR_ENTRY_TTL: Duration = Duration::from_secs(1);
/// How long the kernel may keep the attributes of `.git/octofs`, the directory every walk into the
/// tree passes first: its listing is `objects` and nothing else, ever, and nothing below it is
/// reached without a request that checks the owner (`objects` and everything under it keep their
/// attributes at [`TTL`]: `ls .git/octofs/objects` shows a fan-out directory a sync made at once).
/// For up to this long a revoked owner may still `stat` `.git/octofs`, never read an object.
pub const TOP_ATTR_TTL: Duration = Duration::from_secs(1);

/// How long the kernel may keep an answer about the inode `attr` describes: its attributes, then
/// its name.
pub fn ttls(attr: &FileAttr) -> (Duration, Duration) {
    match attr.ino.0 {
        TOP_INO => (TOP_ATTR_TTL, DIR_ENTRY_TTL),
        _ if attr.kind == FileType::Directory => (TTL, DIR_ENTRY_TTL),
        _ => (TTL, TTL),
    }
}

/// Whether the owner may still read the project's objects.
pub type Allowed = Arc<dyn Fn() -> bool + Send + Sync>;

/// Whether `ino` is one of the subtree's.
pub fn is_virtual(ino: u64) -> bool {
    ino & VIRTUAL == VIRTUAL
}

/// The number of the host file or directory `md` describes: derived from its identity (device,
/// inode number and birth time), never from the order of lookups. The same file has the same number
/// in every daemon, so the kernel's inodes (and their cached pages) stay right across `octofs
/// restart`; a file replaced under its name (a rewritten `commit-graph`), or a new file that reuses
/// a freed inode number, is another number, so the kernel never mixes their pages.
fn number(md: &std::fs::Metadata) -> u64 {
    let born = md
        .created()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .unwrap_or_default();
    let mut h = blake3::Hasher::new();
    h.update(&md.dev().to_le_bytes());
    h.update(&md.ino().to_le_bytes());
    h.update(&born.as_secs().to_le_bytes());
    h.update(&born.subsec_nanos().to_le_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.finalize().as_bytes()[..8]);
    // Below the two fixed numbers is never chosen.
    VIRTUAL | (u64::from_le_bytes(b) & !VIRTUAL).max(2)
}

/// A name the kernel knows in the subtree below `objects`.
struct Node {
    /// Relative to the mirror's `.git/objects`.
    rel: PathBuf,
    lookups: u64,
}

#[derive(Default)]
struct Table {
    nodes: HashMap<u64, Node>,
    /// Open handles and the number each was opened for (a handle of a daemon before a restart
    /// may be a number this one gave another file).
    files: HashMap<u64, (u64, Arc<File>)>,
    next_fh: u64,
}

/// One workspace's view of its mirror's objects.
pub struct MirrorObjects {
    /// The host directory (`<mirror>/.git/objects`), opened once.
    root: File,
    root_path: PathBuf,
    uid: u32,
    gid: u32,
    allowed: Allowed,
    table: Mutex<Table>,
    /// Requests refused because the owner may no longer read the project (for logs and tests).
    refused: AtomicU64,
}

impl std::fmt::Debug for MirrorObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorObjects")
            .field("root", &self.root_path)
            .finish()
    }
}

impl MirrorObjects {
    /// The objects at `objects` (the mirror's `.git/objects`), presented as owned by `uid`/`gid`.
    pub fn at(objects: &Path, uid: u32, gid: u32, allowed: Allowed) -> std::io::Result<Self> {
        let root = File::open(objects)?;
        if !root.metadata()?.is_dir() {
            return Err(std::io::Error::other(format!(
                "{} is not a directory",
                objects.display()
            )));
        }
        Ok(MirrorObjects {
            root,
            root_path: objects.to_path_buf(),
            uid,
            gid,
            allowed,
            table: Mutex::new(Table {
                // Handles of a daemon before a restart reach this one: counting from the clock
                // keeps the two ranges apart.
                next_fh: SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64 | 1),
                ..Table::default()
            }),
            refused: AtomicU64::new(0),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The caller may read the subtree: the owner (while allowed on the project) or root.
    fn check(&self, caller: u32) -> Result<(), FsError> {
        if caller != 0 && caller != self.uid {
            return Err(Errno::EACCES.into());
        }
        if !(self.allowed)() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(Errno::EACCES.into());
        }
        Ok(())
    }

    /// The host path of a virtual directory or file (relative to the objects directory).
    fn rel(&self, ino: u64) -> Result<PathBuf, FsError> {
        if ino == OBJECTS_INO {
            return Ok(PathBuf::from("."));
        }
        if let Some(n) = self.table().nodes.get(&ino) {
            return Ok(n.rel.clone());
        }
        // Known to the kernel from a daemon before a restart (an open file, a cwd): the same file
        // has the same number here, so it is found by walking the directory once.
        self.find(ino).ok_or_else(|| Errno::ESTALE.into())
    }

    /// Looks for the file or directory numbered `ino` in the objects directory (its layout is
    /// shallow: `pack/`, `info/commit-graphs/`, the loose objects' fan-out), and remembers it.
    fn find(&self, ino: u64) -> Option<PathBuf> {
        let mut dirs = vec![PathBuf::from(".")];
        for _depth in 0..3 {
            let mut next = Vec::new();
            for dir in dirs {
                let Ok(f) = crate::sys::open_beneath(
                    &self.root,
                    &dir,
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
                ) else {
                    continue;
                };
                for name in dir_names(&f).unwrap_or_default() {
                    let rel = dir.join(&name);
                    let Ok(md) = self.stat(&rel) else { continue };
                    if number(&md) == ino {
                        self.table().nodes.entry(ino).or_insert(Node {
                            rel: rel.clone(),
                            lookups: 0,
                        });
                        return Some(rel);
                    }
                    if md.is_dir() {
                        next.push(rel);
                    }
                }
            }
            dirs = next;
        }
        None
    }

    fn attr(&self, ino: u64, md: &std::fs::Metadata) -> FileAttr {
        let dir = md.is_dir();
        let t = |s: i64, ns: i64| {
            SystemTime::UNIX_EPOCH + Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32)
        };
        FileAttr {
            ino: INodeNo(ino),
            size: md.len(),
            blocks: md.blocks(),
            atime: t(md.atime(), md.atime_nsec()),
            mtime: t(md.mtime(), md.mtime_nsec()),
            ctime: t(md.ctime(), md.ctime_nsec()),
            crtime: t(md.ctime(), md.ctime_nsec()),
            kind: if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if dir { 0o500 } else { 0o400 },
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// `.git/octofs` itself.
    fn top_attr(&self) -> Result<FileAttr, FsError> {
        let md = self.root.metadata().map_err(io)?;
        let mut a = self.attr(TOP_INO, &md);
        a.nlink = 3;
        Ok(a)
    }

    /// The metadata of `rel` (a directory or regular file, never a symlink), opened beneath.
    fn stat(&self, rel: &Path) -> Result<std::fs::Metadata, FsError> {
        let f = crate::sys::open_beneath(&self.root, rel, libc::O_PATH | libc::O_NOFOLLOW)
            .map_err(io)?;
        let md = f.metadata().map_err(io)?;
        if md.is_dir() || md.is_file() {
            Ok(md)
        } else {
            Err(Errno::ENOENT.into())
        }
    }

    /// The inode number for `rel`, counting `lookups` more references of the kernel.
    fn intern(&self, rel: PathBuf, md: &std::fs::Metadata, lookups: u64) -> u64 {
        let ino = number(md);
        let mut t = self.table();
        let n = t.nodes.entry(ino).or_insert(Node {
            rel: PathBuf::new(),
            lookups: 0,
        });
        n.lookups += lookups;
        n.rel = rel;
        ino
    }

    /// `.git/octofs` (asked for by name in the workspace's `.git`).
    pub fn lookup_top(&self, caller: u32) -> Result<FileAttr, FsError> {
        self.check(caller)?;
        self.top_attr()
    }

    pub fn lookup(&self, caller: u32, parent: u64, name: &OsStr) -> Result<FileAttr, FsError> {
        self.check(caller)?;
        let b = name.as_bytes();
        if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
            return Err(Errno::ENOENT.into());
        }
        if parent == TOP_INO {
            if name != "objects" {
                return Err(Errno::ENOENT.into());
            }
            let md = self.root.metadata().map_err(io)?;
            return Ok(self.attr(OBJECTS_INO, &md));
        }
        let rel = self.rel(parent)?.join(name);
        let md = self.stat(&rel)?;
        let ino = self.intern(rel, &md, 1);
        Ok(self.attr(ino, &md))
    }

    pub fn forget(&self, ino: u64, n: u64) {
        let mut t = self.table();
        let gone = match t.nodes.get_mut(&ino) {
            Some(node) => {
                node.lookups = node.lookups.saturating_sub(n);
                node.lookups == 0
            }
            None => false,
        };
        if gone {
            t.nodes.remove(&ino);
        }
    }

    pub fn getattr(&self, caller: u32, ino: u64) -> Result<FileAttr, FsError> {
        self.check(caller)?;
        match ino {
            TOP_INO => self.top_attr(),
            OBJECTS_INO => {
                let md = self.root.metadata().map_err(io)?;
                Ok(self.attr(OBJECTS_INO, &md))
            }
            _ => {
                let md = self.stat(&self.rel(ino)?)?;
                Ok(self.attr(ino, &md))
            }
        }
    }

    /// Opens a file for reading (anything else is refused: the subtree is read-only).
    pub fn open(&self, caller: u32, ino: u64, flags: i32) -> Result<(u64, Arc<File>), FsError> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return Err(Errno::EROFS.into());
        }
        self.check(caller)?;
        if ino == TOP_INO || ino == OBJECTS_INO {
            return Err(Errno::EISDIR.into());
        }
        let f = self.open_file(ino)?;
        let mut t = self.table();
        let fh = t.next_fh;
        t.next_fh = t.next_fh.wrapping_add(1).max(1);
        t.files.insert(fh, (ino, f.clone()));
        Ok((fh, f))
    }

    fn open_file(&self, ino: u64) -> Result<Arc<File>, FsError> {
        let rel = self.rel(ino)?;
        let f = crate::sys::open_beneath(&self.root, &rel, libc::O_RDONLY | libc::O_NOFOLLOW)
            .map_err(io)?;
        let md = f.metadata().map_err(io)?;
        if md.is_dir() {
            return Err(Errno::EISDIR.into());
        }
        if !md.is_file() {
            return Err(Errno::ENOENT.into());
        }
        // Replaced under its name since the lookup: this inode is gone.
        if number(&md) != ino {
            return Err(Errno::ESTALE.into());
        }
        Ok(Arc::new(f))
    }

    /// The file open as `fh` for `ino`, or (a handle from before a restart, or none) the file
    /// opened again by its number.
    fn held(&self, ino: u64, fh: u64) -> Result<Arc<File>, FsError> {
        let held = self.table().files.get(&fh).cloned();
        match held {
            Some((n, f)) if fh != 0 && n == ino => Ok(f),
            _ => self.open_file(ino),
        }
    }

    /// Reads from an open handle, or (no-open mounts, `fh` 0) from the file by inode.
    pub fn read(
        &self,
        caller: u32,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    ) -> Result<Vec<u8>, FsError> {
        self.check(caller)?;
        let f = self.held(ino, fh)?;
        let mut buf = vec![0u8; size as usize];
        let mut got = 0;
        while got < buf.len() {
            match f.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
        buf.truncate(got);
        Ok(buf)
    }

    /// `SEEK_DATA` and `SEEK_HOLE` (the only ones the kernel asks for) on an open file.
    pub fn lseek(
        &self,
        caller: u32,
        ino: u64,
        fh: u64,
        offset: i64,
        whence: i32,
    ) -> Result<i64, FsError> {
        self.check(caller)?;
        let f = self.held(ino, fh)?;
        crate::sys::lseek(&f, offset, whence).map_err(io)
    }

    pub fn release(&self, ino: u64, fh: u64) {
        let mut t = self.table();
        if t.files.get(&fh).is_some_and(|(n, _)| *n == ino) {
            t.files.remove(&fh);
        }
    }

    /// The entries of a virtual directory after `.` and `..`, sorted by name, each with its
    /// attributes (no reference counted: see [`Self::count`]).
    pub fn list(
        &self,
        caller: u32,
        ino: u64,
    ) -> Result<Vec<(OsString, FileAttr, PathBuf, std::fs::Metadata)>, FsError> {
        self.check(caller)?;
        if ino == TOP_INO {
            let md = self.root.metadata().map_err(io)?;
            return Ok(vec![(
                OsString::from("objects"),
                self.attr(OBJECTS_INO, &md),
                PathBuf::from("."),
                md,
            )]);
        }
        let rel = self.rel(ino)?;
        let dir = crate::sys::open_beneath(
            &self.root,
            &rel,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        )
        .map_err(io)?;
        let names = dir_names(&dir).map_err(io)?;
        let mut out = Vec::new();
        for name in names {
            let r = rel.join(&name);
            // Gone since the listing, or not a directory or file: not listed.
            let Ok(md) = self.stat(&r) else { continue };
            let ino = self.intern(r.clone(), &md, 0);
            out.push((name, self.attr(ino, &md), r, md));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Counts one more kernel reference to a listed entry (READDIRPLUS).
    pub fn count(&self, rel: PathBuf, md: &std::fs::Metadata) -> u64 {
        self.intern(rel, md, 1)
    }

    /// The parent's inode of a virtual directory, for `..` in a listing.
    pub fn parent_of(&self, ino: u64, git: u64) -> u64 {
        match ino {
            TOP_INO => git,
            OBJECTS_INO => TOP_INO,
            _ => VIRTUAL,
        }
    }
}

/// The names in an open directory (through the daemon's own descriptor: no path is resolved
/// again).
fn dir_names(dir: &File) -> std::io::Result<Vec<OsString>> {
    use std::os::fd::AsRawFd;
    std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

fn io(e: std::io::Error) -> FsError {
    match e.raw_os_error() {
        // A symlink or a way out of the directory: as if nothing were there.
        Some(libc::ELOOP) | Some(libc::EXDEV) => Errno::ENOENT.into(),
        Some(n) => Errno::from_i32(n).into(),
        None => Errno::EIO.into(),
    }
}
