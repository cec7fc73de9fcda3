//! The fuser adapter: one `Filesystem` per mounted workspace, delegating to [`WorkspaceFs`].
//!
//! It owns what only the kernel interface needs: open file handles, passthrough backing ids, kernel
//! cache TTLs and init flags (see `docs/caching.md`). The kernel requires every concurrent open of
//! one inode to use the same backing file, so one backing id per inode is shared while any open
//! exists; a write-open of a base file that readers hold open through passthrough moves the name to
//! a new, copied-up inode and answers `ESTALE`, so the kernel looks the name up again (readers keep
//! the base content, as after a rename-over).

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use dashmap::DashMap;
use fuser::{
    AccessFlags, BackingId, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};

use super::stats::{Op, Stats};
use super::{Behind, Caller, DirEntry, Opened, SetAttr, SetTime, WorkspaceFs, XattrReply};

/// The daemon sees every change made through the mount and invalidates what it changes behind the
/// kernel's back, so the kernel may cache entries and attributes for a long time.
const TTL: Duration = Duration::from_secs(3600);

/// A directory handle's listing, read at most once.
type Listing = Arc<std::sync::OnceLock<Result<Vec<DirEntry>, Errno>>>;

enum Handle {
    File {
        ino: u64,
        file: File,
        /// The file is the workspace's data file (else the read-only blob-cache file).
        upper: bool,
        /// Opened with write intent.
        write: bool,
        /// Held while this handle is open, keeping the inode's backing id alive.
        _backing: Option<Arc<BackingId>>,
    },
    /// A directory: its listing is read at the first readdir (when the kernel's cache of it is
    /// valid, it never asks, and the listing is never computed).
    Dir { ino: u64, listing: Listing },
}

/// The passthrough backing of one inode while any open of it exists.
#[derive(Default)]
struct Backing {
    id: Weak<BackingId>,
    /// Whether the backing file is the data file (else the blob-cache file).
    upper: bool,
}

/// Mount-wide facts the daemon reports in `status` and `stats`.
#[derive(Debug, Default)]
pub struct MountInfo {
    pub passthrough: AtomicBool,
    /// The request transport the mount runs on ("uring (…)" or "dev (…)"), set once at mount.
    pub transport: std::sync::OnceLock<String>,
    /// Every request this mount answered (recorded by a guard at the top of each method).
    pub stats: Stats,
}

pub struct FuseAdapter {
    core: Arc<WorkspaceFs>,
    want_passthrough: bool,
    info: Arc<MountInfo>,
    handles: DashMap<u64, Handle>,
    next_fh: AtomicU64,
    backing: DashMap<u64, Backing>,
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

    fn passthrough(&self) -> bool {
        self.info.passthrough.load(Ordering::Relaxed)
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, h);
        fh
    }

    /// Opens `ino` and, with passthrough, finds or registers its backing id. `Err(ESTALE)` asks the
    /// kernel to look the name up again (the name now has a new inode).
    fn open_inner(
        &self,
        ino: u64,
        flags: i32,
        register: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> Result<(Opened, Option<Arc<BackingId>>), Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if !self.passthrough() {
            return Ok((self.core.open(ino, flags)?, None));
        }
        let mut slot = self.backing.entry(ino).or_default();
        let live = slot.id.upgrade();
        if write && live.is_some() && !slot.upper {
            // Readers hold the base content through passthrough: the kernel would refuse a second
            // backing file for this inode, so the writer gets a new inode.
            if self.core.reinode_for_write(ino)? {
                return Err(Errno::ESTALE);
            }
            return Err(Errno::EBUSY);
        }
        let opened = self.core.open(ino, flags)?;
        if let Some(id) = live {
            if slot.upper == opened.upper {
                return Ok((opened, Some(id)));
            }
            self.core.release(ino, opened.write);
            return Err(Errno::EBUSY);
        }
        match register(&opened.file) {
            Ok(id) => {
                let id = Arc::new(id);
                *slot = Backing {
                    id: Arc::downgrade(&id),
                    upper: opened.upper,
                };
                Ok((opened, Some(id)))
            }
            Err(e) => {
                tracing::warn!("passthrough unavailable ({e}); serving I/O through the daemon");
                self.info.passthrough.store(false, Ordering::Relaxed);
                Ok((opened, None))
            }
        }
    }

    fn file_handle<R>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&File, bool, u64) -> R,
    ) -> Result<R, Errno> {
        match self.handles.get(&fh.0).as_deref() {
            Some(Handle::File {
                file, upper, ino, ..
            }) => Ok(f(file, *upper, *ino)),
            Some(Handle::Dir { .. }) => Err(Errno::EISDIR),
            None => Err(Errno::EBADF),
        }
    }

    /// [`Self::file_handle`] for an `f` that can fail too.
    fn with_file<R>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&File, bool, u64) -> Result<R, Errno>,
    ) -> Result<R, Errno> {
        self.file_handle(fh, f).and_then(|r| r)
    }

    /// Runs `f` on the workspace's own data file behind `fh`; a handle on base content is not open
    /// for writing (`EBADF`).
    fn with_upper_file<R>(
        &self,
        fh: FileHandle,
        f: impl FnOnce(&File) -> Result<R, Errno>,
    ) -> Result<R, Errno> {
        self.with_file(
            fh,
            |file, upper, _| {
                if upper { f(file) } else { Err(Errno::EBADF) }
            },
        )
    }

    /// Runs `f` on the listing of directory handle `fh`, read when first asked for.
    fn with_listing(&self, fh: FileHandle, f: impl FnOnce(&[DirEntry])) -> Result<(), Errno> {
        let (ino, listing) = match self.handles.get(&fh.0).as_deref() {
            Some(Handle::Dir { ino, listing }) => (*ino, listing.clone()),
            _ => return Err(Errno::EBADF),
        };
        let list = listing
            .get_or_init(|| self.core.readdir(ino))
            .as_ref()
            .map_err(|e| *e)?;
        f(list);
        Ok(())
    }
}

fn ino(i: INodeNo) -> u64 {
    i.0
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    }
}

fn entry(reply: ReplyEntry, r: Result<FileAttr, Errno>) {
    match r {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn attr(reply: ReplyAttr, r: Result<FileAttr, Errno>) {
    match r {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(e) => reply.error(e),
    }
}

fn data(reply: ReplyData, r: Result<Vec<u8>, Errno>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

fn written(reply: ReplyWrite, r: Result<u32, Errno>) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(e),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), Errno>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn xattr(reply: ReplyXattr, r: Result<XattrReply, Errno>) {
    match r {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(d)) => reply.data(&d),
        Err(e) => reply.error(e),
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_ATOMIC_O_TRUNC,
        ] {
            let _ = cfg.add_capabilities(flag);
        }
        let _ = cfg.set_max_write(1 << 20);
        if self.want_passthrough
            && cfg.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && cfg.set_max_stack_depth(1).is_ok()
        {
            self.info.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        self.core.close();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Lookup);
        match self.core.lookup(ino(parent), name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            // Cache the miss: compilers, git and node probe many missing paths.
            Err(e) if e == Errno::ENOENT => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        let _t = self.info.stats.time(Op::Forget);
        self.core.forget(ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.info.stats.time(Op::Getattr);
        attr(reply, self.core.getattr(ino(i)));
    }

    fn setattr(
        &self,
        _req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.info.stats.time(Op::Setattr);
        let i = ino(i);
        if size.is_some() && self.passthrough() && !self.core.is_upper(i) {
            // Truncating a base file that readers hold through passthrough: new inode, look again.
            let live = self
                .backing
                .get(&i)
                .is_some_and(|b| b.id.strong_count() > 0 && !b.upper);
            if live {
                return match self.core.reinode_for_write(i) {
                    Ok(true) => reply.error(Errno::ESTALE),
                    Ok(false) => reply.error(Errno::EBUSY),
                    Err(e) => reply.error(e),
                };
            }
        }
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime,
        };
        attr(reply, self.core.setattr(i, set));
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        let _t = self.info.stats.time(Op::Readlink);
        data(reply, self.core.readlink(ino(i)));
    }

    fn mknod(
        &self,
        req: &Request,
        p: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.info.stats.time(Op::Mknod);
        entry(
            reply,
            self.core
                .mknod(ino(p), name, mode & !umask, rdev, caller(req)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        p: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.info.stats.time(Op::Mkdir);
        entry(
            reply,
            self.core.mkdir(ino(p), name, mode & !umask, caller(req)),
        );
    }

    fn unlink(&self, _req: &Request, p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Unlink);
        empty(reply, self.core.unlink(ino(p), name));
    }

    fn rmdir(&self, _req: &Request, p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Rmdir);
        empty(reply, self.core.rmdir(ino(p), name));
    }

    fn symlink(&self, req: &Request, p: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Symlink);
        entry(
            reply,
            self.core
                .symlink(ino(p), name, target.as_os_str().as_bytes(), caller(req)),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        p: INodeNo,
        name: &OsStr,
        np: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Rename);
        empty(
            reply,
            self.core
                .rename(ino(p), name, ino(np), newname, flags.bits()),
        );
    }

    fn link(&self, _req: &Request, i: INodeNo, np: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Link);
        entry(reply, self.core.link(ino(i), ino(np), newname));
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.info.stats.time(Op::Open);
        let i = ino(i);
        let (opened, backing) = match self.open_inner(i, flags.0, |f| reply.open_backing(f)) {
            Ok(o) => o,
            Err(e) => return reply.error(e),
        };
        let upper = opened.upper;
        let fh = self.add_handle(Handle::File {
            ino: i,
            file: opened.file,
            upper,
            write: opened.write,
            _backing: backing.clone(),
        });
        if backing.is_some() {
            self.info.stats.passthrough_open();
        }
        match backing {
            // No flush round trip on close: octofs has nothing to do at flush (no posix locks,
            // every write is already in the data file).
            Some(id) => reply.opened_passthrough(FileHandle(fh), FopenFlags::FOPEN_NOFLUSH, &id),
            // Base content is immutable: the kernel may keep its page cache across opens.
            None if !upper => reply.opened(
                FileHandle(fh),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            ),
            None => reply.opened(FileHandle(fh), FopenFlags::FOPEN_NOFLUSH),
        }
    }

    fn create(
        &self,
        req: &Request,
        p: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.info.stats.time(Op::Create);
        let (attr, opened) = match self
            .core
            .create(ino(p), name, mode & !umask, flags, caller(req))
        {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let i = attr.ino.0;
        let mut backing = None;
        if self.passthrough() {
            match reply.open_backing(&opened.file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    self.backing.insert(
                        i,
                        Backing {
                            id: Arc::downgrade(&id),
                            upper: true,
                        },
                    );
                    backing = Some(id);
                }
                Err(e) => {
                    tracing::warn!("passthrough unavailable ({e}); serving I/O through the daemon");
                    self.info.passthrough.store(false, Ordering::Relaxed);
                }
            }
        }
        // A writer exactly when the core counted one: `O_RDONLY|O_CREAT` is none, and its release
        // must not un-count another handle's write-open of the file.
        let fh = self.add_handle(Handle::File {
            ino: i,
            file: opened.file,
            upper: true,
            write: opened.write,
            _backing: backing.clone(),
        });
        if backing.is_some() {
            self.info.stats.passthrough_open();
        }
        // No flush round trip on close, as for `open`: flush has nothing to do.
        match backing {
            Some(id) => reply.created_passthrough(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_NOFLUSH,
                &id,
            ),
            None => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_NOFLUSH,
            ),
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
        let _t = self.info.stats.time(Op::Read);
        // A handle opened on the base content before the file was copied up reads the current
        // content, as every descriptor of a file does.
        let stale = self.file_handle(fh, |_, upper, ino| {
            (!upper && self.core.is_upper(ino)).then_some(ino)
        });
        if let Ok(Some(ino)) = stale
            && let Ok(f) = self.core.open_data(ino)
            && let Some(mut h) = self.handles.get_mut(&fh.0)
            && let Handle::File { file, upper, .. } = &mut *h
        {
            *file = f;
            *upper = true;
        }
        let r = self.with_file(fh, |file, _, _| {
            let mut buf = vec![0u8; size as usize];
            let mut filled = 0;
            while filled < buf.len() {
                match file.read_at(&mut buf[filled..], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(io_errno(e)),
                }
            }
            buf.truncate(filled);
            Ok(buf)
        });
        if let Ok(d) = &r {
            self.info.stats.read_bytes(d.len() as u64);
        }
        data(reply, r);
    }

    fn write(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _wf: WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.info.stats.time(Op::Write);
        let r = self.with_upper_file(fh, |file| {
            file.write_all_at(data, offset).map_err(io_errno)?;
            Ok(data.len() as u32)
        });
        if let Ok(n) = r {
            self.info.stats.wrote_bytes(u64::from(n));
        }
        written(reply, r);
    }

    /// Nothing to do: every write is already in the data file, and writer accounting ends at
    /// release (no posix locks are kept). So every open and create answers `FOPEN_NOFLUSH`.
    fn flush(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Flush);
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
        let _t = self.info.stats.time(Op::Release);
        let wrote = matches!(
            self.handles.remove(&fh.0),
            Some((_, Handle::File { write: true, .. }))
        );
        // Drop the inode's slot once its last backing reference is gone.
        self.backing
            .remove_if(&ino(i), |_, b| b.id.strong_count() == 0);
        self.core.release(ino(i), wrote);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Fsync);
        let r = self.with_file(fh, |file, upper, _| {
            if !upper {
                return Ok(());
            }
            if datasync {
                file.sync_data()
            } else {
                file.sync_all()
            }
            .map_err(io_errno)
        });
        empty(reply, r.and_then(|()| self.core.sync_catalog()));
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.info.stats.time(Op::Opendir);
        match self.core.opendir(ino(i)) {
            Ok(()) => {
                let fh = self.add_handle(Handle::Dir {
                    ino: ino(i),
                    listing: Arc::default(),
                });
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
        let _t = self.info.stats.time(Op::Readdir);
        let r = self.with_listing(fh, |list| {
            for (idx, e) in list.iter().enumerate().skip(offset as usize) {
                if reply.add(e.attr.ino, idx as u64 + 1, e.attr.kind, &e.name) {
                    break;
                }
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.info.stats.time(Op::Readdirplus);
        let r = self.with_listing(fh, |list| {
            for (idx, e) in list.iter().enumerate().skip(offset as usize) {
                // The kernel ignores the attributes of "." and ".."; every other entry's are read
                // now (the listing's may be older than this request) and counted as a reference.
                let dots = e.name == "." || e.name == "..";
                let attr = if dots {
                    e.attr
                } else {
                    match self.core.listed(ino(i), &e.name) {
                        Ok(Some(attr)) => attr,
                        // Gone since the listing was read: not listed.
                        Ok(None) => continue,
                        Err(err) => {
                            tracing::debug!("readdirplus: {:?}: {err:?}", e.name);
                            continue;
                        }
                    }
                };
                if reply.add(
                    attr.ino,
                    idx as u64 + 1,
                    &e.name,
                    &TTL,
                    &attr,
                    Generation(0),
                ) {
                    // Not sent (the reply is full): the kernel holds no reference to it.
                    if !dots {
                        self.core.forget(attr.ino.0, 1);
                    }
                    break;
                }
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        _f: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Releasedir);
        self.handles.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Fsyncdir);
        empty(reply, self.core.sync_catalog());
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        let _t = self.info.stats.time(Op::Statfs);
        match self.core.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _pos: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Setxattr);
        empty(reply, self.core.setxattr(ino(i), name, value, flags));
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.info.stats.time(Op::Getxattr);
        xattr(reply, self.core.getxattr(ino(i), name, size));
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.info.stats.time(Op::Listxattr);
        xattr(reply, self.core.listxattr(ino(i), size));
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Removexattr);
        empty(reply, self.core.removexattr(ino(i), name));
    }

    fn access(&self, _req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Access);
        empty(reply, self.core.access(ino(i), mask.bits()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Fallocate);
        let r = self.with_upper_file(fh, |file| {
            crate::sys::fallocate(file, mode, offset, length).map_err(io_errno)
        });
        empty(reply, r);
    }

    fn lseek(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.info.stats.time(Op::Lseek);
        let r = self.with_file(fh, |file, _, _| {
            crate::sys::lseek(file, offset, whence).map_err(io_errno)
        });
        match r {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(e),
        }
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh_in: FileHandle,
        off_in: u64,
        _o: INodeNo,
        fh_out: FileHandle,
        off_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _t = self.info.stats.time(Op::CopyFileRange);
        let src = match self.with_file(fh_in, |f, _, _| f.try_clone().map_err(io_errno)) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let r = self.with_upper_file(fh_out, |dst| {
            let len = len.min(u32::MAX as u64 & !0xfff);
            crate::sys::copy_file_range(&src, off_in, dst, off_out, len).map_err(io_errno)
        });
        written(reply, r.map(|n| n as u32));
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

/// Tells the kernel to forget what it may have cached of changes the daemon made behind it
/// (`docs/caching.md`): a name's entry (or cached absence) and its directory's listing and
/// attributes, an inode's attributes and pages. Call it from a thread that serves no FUSE request and
/// holds no lock a FUSE request may wait for: the kernel may first wait for requests in flight on
/// those inodes, and a request thread waiting on its own inode's lock would never return.
pub fn invalidate(notifier: &fuser::Notifier, behind: &[Behind]) {
    for b in behind {
        // "Not cached" answers Ok (fuser maps the kernel's ENOENT); anything else only costs
        // freshness until the timeout, so it is logged, not fatal.
        let r = match b {
            Behind::Entry { parent, name } => notifier
                .inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                .and_then(|()| notifier.inval_inode(INodeNo(*parent), 0, 0)),
            Behind::Inode(i) => notifier.inval_inode(INodeNo(*i), 0, 0),
        };
        if let Err(e) = r {
            tracing::warn!("cannot invalidate the kernel's cache of {b:?}: {e}");
        }
    }
}

/// Mounts `adapter` at `mountpoint` and serves it on background threads over `transport`
/// (`super::uring`).
pub fn mount(
    adapter: FuseAdapter,
    mountpoint: &Path,
    cfg: &fuser::Config,
    transport: super::uring::Transport,
) -> std::io::Result<fuser::BackgroundSession> {
    let info = adapter.info.clone();
    super::uring::mount(adapter, mountpoint, cfg, transport, &info.transport)
}
