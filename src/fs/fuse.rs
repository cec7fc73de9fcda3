//! The fuser adapter: one `Filesystem` per mounted workspace, delegating to [`WorkspaceFs`].
//!
//! It owns what only the kernel interface needs: open file handles, passthrough backing ids (one per
//! inode while any open exists — the kernel refuses mixed backing files for one inode), kernel cache
//! TTLs and init flags. See `docs/caching.md` for the caching rules.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};

use super::core::{DirEntry, WorkspaceFs};

/// Entries and attributes of the base never change underneath the kernel, and every change the
/// daemon makes is invalidated explicitly, so the kernel may cache them for a long time.
const TTL: Duration = Duration::from_secs(3600);

enum Handle {
    File {
        file: File,
        /// Held while this handle is open, keeping the inode's backing id alive.
        _backing: Option<Arc<BackingId>>,
    },
    Dir(Arc<Vec<DirEntry>>),
}

/// Mount-wide facts the daemon reports in `status`.
#[derive(Debug, Default)]
pub struct MountInfo {
    pub passthrough: AtomicBool,
}

pub struct FuseAdapter {
    core: Arc<WorkspaceFs>,
    want_passthrough: bool,
    info: Arc<MountInfo>,
    handles: DashMap<u64, Handle>,
    next_fh: AtomicU64,
    /// One backing id per inode while any passthrough open of it exists.
    backing: DashMap<u64, Weak<BackingId>>,
}

impl FuseAdapter {
    pub fn new(core: Arc<WorkspaceFs>, want_passthrough: bool, info: Arc<MountInfo>) -> Self {
        FuseAdapter {
            core,
            want_passthrough,
            info,
            handles: DashMap::new(),
            next_fh: AtomicU64::new(1),
            backing: DashMap::new(),
        }
    }

    fn fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }

    /// The inode's shared backing id, registering `file` if no open holds one. `None` means this open
    /// is served through read callbacks.
    fn backing_for(&self, ino: u64, file: &File, reply: &ReplyOpen) -> Option<Arc<BackingId>> {
        if !self.info.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        let mut slot = self.backing.entry(ino).or_default();
        if let Some(id) = slot.upgrade() {
            return Some(id);
        }
        match reply.open_backing(file) {
            Ok(id) => {
                let id = Arc::new(id);
                *slot = Arc::downgrade(&id);
                Some(id)
            }
            Err(e) => {
                tracing::warn!("passthrough unavailable ({e}); serving reads through the daemon");
                self.info.passthrough.store(false, Ordering::Relaxed);
                None
            }
        }
    }
}

fn ino(i: INodeNo) -> u64 {
    i.0
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            let _ = cfg.add_capabilities(flag);
        }
        if self.want_passthrough
            && cfg.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && cfg.set_max_stack_depth(1).is_ok()
        {
            self.info.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.core.lookup(ino(parent), name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            // Cache the miss: compilers, git and node probe many missing paths.
            Err(e) if e == Errno::ENOENT => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        self.core.forget(ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino(i)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        match self.core.readlink(ino(i)) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let file = match self.core.open(ino(i), flags.0) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let backing = self.backing_for(ino(i), &file, &reply);
        let fh = self.fh();
        match &backing {
            Some(id) => {
                let id = id.clone();
                self.handles.insert(
                    fh,
                    Handle::File {
                        file,
                        _backing: Some(id.clone()),
                    },
                );
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
            }
            None => {
                self.handles.insert(
                    fh,
                    Handle::File {
                        file,
                        _backing: None,
                    },
                );
                // Base content is immutable: the kernel may keep its page cache across opens.
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE);
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(h) = self.handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        let Handle::File { file, .. } = &*h else {
            return reply.error(Errno::EISDIR);
        };
        let mut buf = vec![0u8; size as usize];
        let mut filled = 0;
        while filled < buf.len() {
            match file.read_at(&mut buf[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return reply.error(Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO)));
                }
            }
        }
        reply.data(&buf[..filled]);
    }

    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(&fh.0);
        // Drop the inode's slot once its last backing reference is gone.
        self.backing
            .remove_if(&ino(i), |_, w| w.strong_count() == 0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self
            .core
            .opendir(ino(i))
            .and_then(|_| self.core.readdir(ino(i)))
        {
            Ok(list) => {
                let fh = self.fh();
                self.handles.insert(fh, Handle::Dir(Arc::new(list)));
                reply.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
                );
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(list) = self.dir_listing(fh) else {
            return reply.error(Errno::EBADF);
        };
        for (idx, e) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(e.attr.ino, idx as u64 + 1, e.attr.kind, &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Some(list) = self.dir_listing(fh) else {
            return reply.error(Errno::EBADF);
        };
        for (idx, e) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(
                e.attr.ino,
                idx as u64 + 1,
                &e.name,
                &TTL,
                &e.attr,
                Generation(0),
            ) {
                break;
            }
            // The kernel now holds a reference to every entry but "." and "..".
            if let Err(err) = self.core.note_listed(ino(i), e) {
                tracing::warn!("readdirplus: {:?}: {err:?}", e.name);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _f: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        match self.core.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        match self.core.getattr(ino(i)) {
            Ok(_) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        match self.core.getattr(ino(i)) {
            Ok(_) if size == 0 => reply.size(0),
            Ok(_) => reply.data(&[]),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        match self.core.access(ino(i), mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
    // The write side: until the copy-on-write layer lands, a workspace is a read-only view of its
    // base. Each operation still checks that its inode exists, so a stale handle gets ENOENT.
    fn setattr(
        &self,
        _req: &Request,
        i: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(self.read_only(i));
    }

    fn mknod(
        &self,
        _req: &Request,
        p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _r: u32,
        reply: ReplyEntry,
    ) {
        reply.error(self.read_only(p));
    }

    fn mkdir(&self, _req: &Request, p: INodeNo, _n: &OsStr, _m: u32, _u: u32, reply: ReplyEntry) {
        reply.error(self.read_only(p));
    }

    fn unlink(&self, _req: &Request, p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(self.read_only(p));
    }

    fn rmdir(&self, _req: &Request, p: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(self.read_only(p));
    }

    fn symlink(&self, _req: &Request, p: INodeNo, _n: &OsStr, _t: &Path, reply: ReplyEntry) {
        reply.error(self.read_only(p));
    }

    fn rename(
        &self,
        _req: &Request,
        p: INodeNo,
        _n: &OsStr,
        _np: INodeNo,
        _nn: &OsStr,
        _f: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(self.read_only(p));
    }

    fn link(&self, _req: &Request, i: INodeNo, _np: INodeNo, _nn: &OsStr, reply: ReplyEntry) {
        reply.error(self.read_only(i));
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _off: u64,
        _data: &[u8],
        _wf: fuser::WriteFlags,
        _f: OpenFlags,
        _lo: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(self.read_only(i));
    }

    fn create(
        &self,
        _req: &Request,
        p: INodeNo,
        _n: &OsStr,
        _m: u32,
        _u: u32,
        _f: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(self.read_only(p));
    }

    fn setxattr(
        &self,
        _req: &Request,
        i: INodeNo,
        _n: &OsStr,
        _v: &[u8],
        _f: i32,
        _p: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.read_only(i));
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, _n: &OsStr, reply: ReplyEmpty) {
        reply.error(self.read_only(i));
    }

    fn fallocate(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _o: u64,
        _l: u64,
        _m: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(self.read_only(i));
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _oi: u64,
        o: INodeNo,
        _fo: FileHandle,
        _oo: u64,
        _len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(self.read_only(o));
    }
}

impl FuseAdapter {
    /// The errno of a write request: ENOENT for an unknown inode, else EROFS.
    fn read_only(&self, i: INodeNo) -> Errno {
        match self.core.getattr(ino(i)) {
            Ok(_) => Errno::EROFS,
            Err(e) => e,
        }
    }

    fn dir_listing(&self, fh: FileHandle) -> Option<Arc<Vec<DirEntry>>> {
        match &*self.handles.get(&fh.0)? {
            Handle::Dir(list) => Some(list.clone()),
            Handle::File { .. } => None,
        }
    }
}

/// A negative entry: node id 0 with a TTL tells the kernel to cache "no such name".
fn negative_attr() -> FileAttr {
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

/// Mount options shared by every workspace mount.
pub fn mount_config(thread: &str, allow_other: bool) -> fuser::Config {
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(format!("octofs:{thread}")),
        fuser::MountOption::Subtype("octofs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(4);
    cfg.clone_fd = true;
    cfg
}

/// Mounts `adapter` at `mountpoint` and serves it on background threads.
pub fn mount(
    adapter: FuseAdapter,
    mountpoint: &Path,
    cfg: &fuser::Config,
) -> std::io::Result<fuser::BackgroundSession> {
    fuser::Session::new(adapter, mountpoint, cfg)?.spawn()
}
