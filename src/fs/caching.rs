//! What the kernel may cache of a mount's answers (`docs/caching.md`): how long an entry or its
//! attributes stay valid ([`Entry`] carries both TTLs), that a missing name is cached too (a
//! negative entry), and how an open file or directory may keep its page cache (the FOPEN flags of
//! an [`Opening`]). The adapter (`fuse/`) copies these into replies and decides none of them; the
//! virtual objects tree (`super::objects`) has rules of its own. Touches no state.

use std::sync::Arc;
use std::time::Duration;

use fuser::{FileAttr, FopenFlags, INodeNo};

use super::FsResult;

/// The daemon sees every change made through the mount and invalidates what it changes behind the
/// kernel's back, so the kernel may cache entries and attributes for a long time.
pub const TTL: Duration = Duration::from_secs(3600);

/// Attributes with how long the kernel may keep them (`attr_ttl`, until its next GETATTR) and,
/// for a lookup or a READDIRPLUS entry, how long it may keep the name's entry (`entry_ttl`, until
/// its next LOOKUP). The core's answers keep both for [`TTL`]; the objects tree keeps the names of
/// its directories longer than their attributes (`fuse/virt.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub attr: FileAttr,
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
}

impl Entry {
    /// The core's attributes: kept for [`TTL`].
    pub fn of(attr: FileAttr) -> Entry {
        Entry {
            attr,
            attr_ttl: TTL,
            entry_ttl: TTL,
        }
    }

    /// A lookup's answer: a missing name is a negative entry, cached as long as any other
    /// (compilers, git and node probe many missing paths).
    pub fn lookup(r: FsResult<FileAttr>) -> FsResult<Entry> {
        match r {
            Ok(attr) => Ok(Entry::of(attr)),
            Err(e) if e.errno == fuser::Errno::ENOENT => Ok(Entry::of(negative_attr())),
            Err(e) => Err(e),
        }
    }

    /// `.` or `..` in a READDIRPLUS listing: the kernel ignores their attributes.
    pub fn dot(ino: u64, kind: fuser::FileType) -> Entry {
        Entry::of(FileAttr {
            ino: INodeNo(ino),
            kind,
            ..negative_attr()
        })
    }
}

impl From<FileAttr> for Entry {
    fn from(attr: FileAttr) -> Entry {
        Entry::of(attr)
    }
}

/// An open file or directory as the kernel is told of it: the handle (0: none), how it may cache,
/// and the passthrough backing when I/O goes to the backing file directly.
#[derive(Debug)]
pub struct Opening<B> {
    pub fh: u64,
    pub flags: FopenFlags,
    pub backing: Option<Arc<B>>,
}

/// Every open answers `FOPEN_NOFLUSH`: octofs has nothing to do at flush (no posix locks, every
/// write is already in the data file), so no round trip on close.
pub const NOFLUSH: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

/// The FOPEN flags of a file opened with a handle: base content (`upper` false) is immutable, so
/// the kernel may keep its page cache across opens, unless I/O passes through to the backing file.
pub fn file_flags(upper: bool, passthrough: bool) -> FopenFlags {
    if upper || passthrough {
        NOFLUSH
    } else {
        FopenFlags::FOPEN_KEEP_CACHE | NOFLUSH
    }
}

/// The FOPEN flags of a file made (or opened) without a handle in no-open mode: its page cache is
/// the mount's own, kept across the opens the kernel makes by itself.
pub const KERNEL_OPENED: FopenFlags = FopenFlags::FOPEN_KEEP_CACHE.union(NOFLUSH);

/// The FOPEN flags of a directory the core opened: the kernel caches its listing (readdir keeps no
/// state, see `handles.rs`, and the daemon invalidates what it changes behind the kernel).
pub const DIR_FLAGS: FopenFlags = FopenFlags::FOPEN_CACHE_DIR.union(FopenFlags::FOPEN_KEEP_CACHE);

/// A negative entry: node id 0 with a TTL tells the kernel to cache "no such name".
pub fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: std::time::UNIX_EPOCH,
        mtime: std::time::UNIX_EPOCH,
        ctime: std::time::UNIX_EPOCH,
        crtime: std::time::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}
