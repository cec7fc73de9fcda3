//! The fuser adapter: one `Filesystem` per mounted workspace, delegating to [`WorkspaceFs`].
//!
//! It owns what only the kernel interface needs: kernel cache TTLs, init flags (see
//! `docs/caching.md`), turning fuser's argument types into core calls and results into replies, and
//! registering passthrough backing files with the kernel. Open handles and the backing rules live in
//! [`super::handles`]; every request's meaning lives in the core. A failed request is answered with
//! its [`FsError`]'s errno and logged once, with the error's context ([`super::failures`]).
//!
//! A mount runs in one of two I/O modes ([`IoMode`], `docs/performance.md`): with handles (OPEN and
//! RELEASE, passthrough when it works), or no-open, where `open` and `flush` answer `ENOSYS` so the
//! kernel opens and closes files without a request, and READ, WRITE and the other file requests are
//! served by inode ([`super::inode_io`]).
//!
//! In both modes the regular files a READDIRPLUS lists are remembered in listing order, and a
//! file's OPEN (handles) or first READ (no-open) hands the next ones to the daemon's read-ahead
//! pool, after the reply ([`super::readahead`]).

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
    Request, TimeOrNow, WriteFlags,
};

pub use super::io::IoMode;
use super::failures::{Cx, failed};
use super::handles::{FileOpen, Handles};
use super::inode_io::InodeIo;
use super::objects::{self, MirrorObjects};
use super::readahead::ListingOrder;
use super::stats::{Op, Stats};
use super::{Behind, Caller, FsError, Made, SetAttr, SetTime, WorkspaceFs, XattrReply};
use crate::cow::blobcache::AheadOwner;

/// The daemon sees every change made through the mount and invalidates what it changes behind the
/// kernel's back, so the kernel may cache entries and attributes for a long time.
const TTL: Duration = Duration::from_secs(3600);

/// Mount-wide facts the daemon reports in `status` and `stats`.
#[derive(Debug, Default)]
pub struct MountInfo {
    pub passthrough: AtomicBool,
    /// The kernel opens directories without asking (it offered `FUSE_NO_OPENDIR_SUPPORT` and
    /// `opendir` answers `ENOSYS`): no OPENDIR or RELEASEDIR request.
    pub no_opendir: AtomicBool,
    /// The request transport the mount runs on ("uring (…)" or "dev (…)"), set once at mount.
    pub transport: std::sync::OnceLock<String>,
    /// Every request this mount answered (recorded by a guard at the top of each method).
    pub stats: Stats,
    /// The mount runs in no-open mode (asked for, and the kernel offered `FUSE_NO_OPEN_SUPPORT`).
    pub no_open: AtomicBool,
    /// The per-inode I/O of a no-open mount, for the daemon to release what it changed behind the
    /// kernel ([`invalidate_mount`]).
    pub inode_io: std::sync::OnceLock<Arc<InodeIo>>,
    /// The adapter's open handles, reachable from the daemon for a handover to another process.
    pub handles: HandlesLink,
}

/// The open handles of a mount's adapter, set once when the adapter is made.
#[derive(Default)]
pub struct HandlesLink(std::sync::OnceLock<Arc<Handles<BackingId>>>);

impl std::fmt::Debug for HandlesLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.get().map(|h| h.len());
        f.debug_tuple("HandlesLink").field(&n).finish()
    }
}

impl MountInfo {
    /// The I/O mode the mount runs in.
    pub fn io_mode(&self) -> IoMode {
        if self.no_open.load(Ordering::Relaxed) {
            IoMode::NoOpen
        } else {
            IoMode::Handles
        }
    }
}

pub struct FuseAdapter {
    core: Arc<WorkspaceFs>,
    want_passthrough: bool,
    info: Arc<MountInfo>,
    handles: Arc<Handles<BackingId>>,
    want_io: IoMode,
    inode_io: Arc<InodeIo>,
    /// The regular files listed, in listing order, for read-ahead.
    order: ListingOrder,
    /// This mount's claim on the read-ahead pool, stopped at unmount.
    ahead: Arc<AheadOwner>,
    /// The mirror's objects at `.git/octofs/objects` (`super::objects`), when the daemon gave them.
    objects: Option<Arc<MirrorObjects>>,
}

impl FuseAdapter {
    pub fn new(core: Arc<WorkspaceFs>, want_passthrough: bool, info: Arc<MountInfo>) -> Self {
        let handles = Arc::new(Handles::new(core.clone()));
        let _ = info.handles.0.set(handles.clone());
        let inode_io = Arc::new(InodeIo::new(core.clone()));
        let _ = info.inode_io.set(inode_io.clone());
        FuseAdapter {
            handles,
            core,
            want_passthrough,
            info,
            want_io: IoMode::Handles,
            inode_io,
            order: ListingOrder::default(),
            ahead: Arc::new(AheadOwner::default()),
            objects: None,
        }
    }

    /// Presents `objects` read-only at `.git/octofs/objects` (see `super::objects`).
    pub fn with_objects(mut self, objects: Option<Arc<MirrorObjects>>) -> Self {
        self.objects = objects;
        self
    }

    /// The virtual objects tree, when `i` is one of its inodes.
    fn virt(&self, i: u64) -> Option<&MirrorObjects> {
        self.objects.as_deref().filter(|_| objects::is_virtual(i))
    }

    /// Whether `name` in `parent` is the virtual `.git/octofs`: `parent` is the workspace's own
    /// `.git` (asked of the core each time: `.git` may be replaced by another directory).
    fn is_top(&self, parent: u64, name: &OsStr) -> bool {
        self.objects.is_some()
            && name == objects::NAME
            && self
                .core
                .attr_at(&[b".git"])
                .ok()
                .flatten()
                .is_some_and(|a| a.ino.0 == parent && a.kind == fuser::FileType::Directory)
    }

    /// Whether a change to `name` in `parent` (or to inode `parent` itself) touches the read-only
    /// objects tree.
    fn read_only(&self, parent: u64, name: Option<&OsStr>) -> bool {
        self.virt(parent).is_some() || name.is_some_and(|n| self.is_top(parent, n))
    }

    /// The I/O mode to ask the kernel for at INIT (no-open falls back to handles when the kernel
    /// does not offer it).
    pub fn with_io(mut self, io: IoMode) -> Self {
        self.want_io = io;
        self
    }

    fn passthrough(&self) -> bool {
        self.info.passthrough.load(Ordering::Relaxed)
    }

    fn no_open(&self) -> bool {
        self.info.no_open.load(Ordering::Relaxed)
    }

    /// Whether file I/O on `fh` is served by inode: no handle in no-open mode, or a handle this
    /// daemon never gave out (one a daemon that died opened, whose mount this one adopted:
    /// docs/restart.md "A crash"; its number is never one of this daemon's, see `handles.rs`).
    fn by_inode(&self, fh: u64) -> bool {
        if fh == 0 {
            self.no_open()
        } else {
            !self.handles.knows(fh)
        }
    }

    /// Counts a passthrough open, or turns passthrough off for the mount when registering failed.
    /// File `i` is being read: the files listed after it go to the read-ahead pool.
    fn read_ahead(&self, i: u64) {
        let next = self.order.read(i);
        if !next.is_empty() {
            self.core.read_ahead(&next, &self.ahead, self.no_open());
        }
    }

    fn note_backing(&self, opened: &FileOpen<BackingId>) {
        if let Some(e) = &opened.passthrough_failed {
            tracing::warn!("passthrough unavailable ({e}); serving I/O through the daemon");
            self.info.passthrough.store(false, Ordering::Relaxed);
        }
        if opened.backing.is_some() {
            self.info.stats.passthrough_open();
        }
    }
}

/// One entry of a virtual directory's listing: its offset, inode, kind, name and, except for `.`
/// and `..`, its attributes with what counting a reference needs.
type VirtualEntry<'a> = (FileAttr, std::path::PathBuf, &'a std::fs::Metadata);

impl FuseAdapter {
    /// Lists virtual directory `i` from `offset` (`.`, `..`, then its entries by name), handing
    /// each to `add` until it answers false (the reply is full).
    fn virtual_listing(
        &self,
        v: &MirrorObjects,
        uid: u32,
        i: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, fuser::FileType, &OsStr, Option<VirtualEntry<'_>>) -> bool,
    ) -> Result<(), FsError> {
        let entries = v.list(uid, i)?;
        let git = self
            .core
            .attr_at(&[b".git"])?
            .map_or(super::ROOT_INO, |a| a.ino.0);
        let dir = fuser::FileType::Directory;
        let dots = [(".", i), ("..", v.parent_of(i, git))];
        for (n, (name, d)) in dots.iter().enumerate() {
            let off = n as u64 + 1;
            if off > offset && !add(off, *d, dir, OsStr::new(name), None) {
                return Ok(());
            }
        }
        for (n, (name, attr, rel, md)) in entries.into_iter().enumerate() {
            let off = n as u64 + 3;
            if off > offset && !add(off, attr.ino.0, attr.kind, &name, Some((attr, rel, &md))) {
                return Ok(());
            }
        }
        Ok(())
    }
}

fn ino(i: INodeNo) -> u64 {
    i.0
}

/// The kernel's mark on a request it sends again after the daemon that read it died
/// (`FUSE_UNIQUE_RESEND`, set by `FUSE_NOTIFY_RESEND`): its change may be applied already
/// (`workspace/resend.rs`).
const UNIQUE_RESEND: u64 = 1 << 63;

fn resent(req: &Request) -> bool {
    req.unique().0 & UNIQUE_RESEND != 0
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
    }
}

fn entry(cx: &Cx, reply: ReplyEntry, r: Result<FileAttr, FsError>) {
    match r {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(failed(cx, e)),
    }
}

fn attr(cx: &Cx, reply: ReplyAttr, r: Result<FileAttr, FsError>) {
    match r {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(e) => reply.error(failed(cx, e)),
    }
}

fn data(cx: &Cx, reply: ReplyData, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(d) => reply.data(&d),
        Err(e) => reply.error(failed(cx, e)),
    }
}

fn written(cx: &Cx, reply: ReplyWrite, r: Result<u32, FsError>) {
    match r {
        Ok(n) => reply.written(n),
        Err(e) => reply.error(failed(cx, e)),
    }
}

fn empty(cx: &Cx, reply: ReplyEmpty, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(failed(cx, e)),
    }
}

fn xattr(cx: &Cx, reply: ReplyXattr, r: Result<XattrReply, FsError>) {
    match r {
        Ok(XattrReply::Size(n)) => reply.size(n),
        Ok(XattrReply::Data(d)) => reply.data(&d),
        Err(e) => reply.error(failed(cx, e)),
    }
}

impl FuseAdapter {
    /// Answers a CREATE with the file it opened (also for a resent one): its backing when it has
    /// one, and no flush round trip on close, as for `open` (flush has nothing to do).
    fn reply_created(&self, attr: &FileAttr, opened: FileOpen<BackingId>, reply: ReplyCreate) {
        self.note_backing(&opened);
        let FileOpen { fh, backing, .. } = opened;
        match backing {
            Some(id) => reply.created_passthrough(
                &TTL,
                attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_NOFLUSH,
                &id,
            ),
            None => reply.created(
                &TTL,
                attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_NOFLUSH,
            ),
        }
    }

    /// A resent `create` whose file the daemon that died made (`WorkspaceFs::created_again`, one
    /// kernel reference counted): opened now and answered as the create would have been.
    fn open_created(&self, cx: &Cx, attr: FileAttr, flags: i32, reply: ReplyCreate) {
        let i = attr.ino.0;
        if self.no_open() {
            // As a create without OPEN: held by inode when its I/O comes (`fh` 0).
            return reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            );
        }
        let register = self
            .passthrough()
            .then_some(|f: &File| reply.open_backing(f));
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        let opened = match self.handles.open(i, flags, register) {
            Ok(o) => o,
            Err(e) => {
                self.core.forget(i, 1);
                return reply.error(failed(cx, e));
            }
        };
        self.reply_created(&attr, opened, reply)
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        let no_open = self.want_io == IoMode::NoOpen
            && cfg.capabilities().contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        if self.want_io == IoMode::NoOpen && !no_open {
            tracing::warn!("the kernel does not offer no-open; serving files with handles");
        }
        self.info.no_open.store(no_open, Ordering::Relaxed);
        // With no-open, the kernel would leave an atomic `O_TRUNC` to an OPEN it never sends (the
        // file would silently not be truncated): without the flag it truncates with SETATTR.
        if !no_open {
            let _ = cfg.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
        }
        for flag in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            // octofs clears set-user-ID and set-group-ID itself on write, truncate and chown (see
            // `kill_suidgid`), so the kernel need not ask for `security.capability` before writes.
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            let _ = cfg.add_capabilities(flag);
        }
        let _ = cfg.set_max_write(1 << 20);
        // Nothing to request: the kernel says it copes with `opendir` answering ENOSYS, and then
        // opens every directory itself, caching listings (readdir is stateless, see handles.rs).
        let no_opendir = cfg
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        self.info.no_opendir.store(no_opendir, Ordering::Relaxed);
        // No passthrough with no-open: the kernel refuses to mix them on one connection (EIO).
        if self.want_passthrough
            && !no_open
            && cfg.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
            && cfg.set_max_stack_depth(1).is_ok()
        {
            self.info.passthrough.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    fn destroy(&mut self) {
        // Nothing more is read ahead for this mount.
        self.ahead.stop();
        // Writers held by inode note their changes before the core closes.
        self.inode_io.release_all();
        self.core.close();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Lookup);
        let cx = Cx::new(Op::Lookup, parent.0, Some(name));
        if let Some(v) = self.virt(parent.0) {
            // No negative entry either: a pack the mirror gains must be found at once.
            return match v.lookup(_req.uid(), parent.0, name) {
                Ok(a) => reply.entry(&objects::TTL, &a, Generation(0)),
                Err(e) if e == Errno::ENOENT => reply.error(Errno::ENOENT),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        if let Some(v) = self.objects.as_deref()
            && self.is_top(parent.0, name)
        {
            return match v.lookup_top(_req.uid()) {
                Ok(a) => reply.entry(&objects::TTL, &a, Generation(0)),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        match self.core.lookup(ino(parent), name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            // Cache the miss: compilers, git and node probe many missing paths.
            Err(e) if e == Errno::ENOENT => reply.entry(&TTL, &negative_attr(), Generation(0)),
            Err(e) => reply.error(failed(&cx, e)),
        }
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        let _t = self.info.stats.time(Op::Forget);
        if let Some(v) = self.virt(i.0) {
            return v.forget(i.0, nlookup);
        }
        if self.no_open() {
            // The kernel dropped the inode, so no file of it is open any more: what is held of it
            // goes first (an unlinked file's data goes with the core's last reference).
            self.inode_io.drop_inodes(&[ino(i)]);
        }
        self.core.forget(ino(i), nlookup);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.info.stats.time(Op::Getattr);
        let cx = Cx::new(Op::Getattr, i.0, None);
        if let Some(v) = self.virt(i.0) {
            return match v.getattr(_req.uid(), i.0) {
                Ok(a) => reply.attr(&objects::TTL, &a),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        attr(&cx, reply, self.core.getattr(ino(i)));
    }

    fn setattr(
        &self,
        req: &Request,
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
        let cx = Cx::new(Op::Setattr, i.0, None);
        let i = ino(i);
        if self.read_only(i, None) {
            return reply.error(Errno::EROFS);
        }
        if size.is_some()
            && let Err(e) = self.handles.before_truncate(i)
        {
            // Truncating a base file that readers hold through passthrough: new inode, look again.
            return reply.error(failed(&cx, e));
        }
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves dropping set-user/group-ID to octofs:
        // on chown of a non-directory always, on truncate when the caller lacks CAP_FSETID (fuser
        // does not pass the kernel's FATTR_KILL_SUIDGID: root stands for CAP_FSETID), and on a
        // SETATTR that changes nothing, which is what the kernel's `file_remove_privs` sends
        // before a write that does not come to the daemon (passthrough).
        let nothing = mode.is_none()
            && uid.is_none()
            && gid.is_none()
            && size.is_none()
            && atime.is_none()
            && mtime.is_none()
            && ctime.is_none();
        let kill_suidgid =
            uid.is_some() || gid.is_some() || (size.is_some() && req.uid() != 0) || nothing;
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime,
            kill_suidgid,
        };
        attr(&cx, reply, self.core.setattr(i, set));
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        let _t = self.info.stats.time(Op::Readlink);
        let cx = Cx::new(Op::Readlink, i.0, None);
        if self.virt(i.0).is_some() {
            return reply.error(Errno::EINVAL);
        }
        data(&cx, reply, self.core.readlink(ino(i)));
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
        let cx = Cx::new(Op::Mknod, p.0, Some(name));
        if self.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self
            .core
            .mknod(ino(p), name, mode & !umask, rdev, caller(req));
        if resent(req) {
            let made = Made::Node(mode & libc::S_IFMT);
            r = self.core.made_again(r, ino(p), name, made, caller(req));
        }
        entry(&cx, reply, r);
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
        let cx = Cx::new(Op::Mkdir, p.0, Some(name));
        if self.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core.mkdir(ino(p), name, mode & !umask, caller(req));
        if resent(req) {
            r = self
                .core
                .made_again(r, ino(p), name, Made::Dir, caller(req));
        }
        entry(&cx, reply, r);
    }

    fn unlink(&self, req: &Request, p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Unlink);
        let cx = Cx::new(Op::Unlink, p.0, Some(name));
        if self.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core.unlink(ino(p), name);
        if resent(req) {
            r = self.core.removed_again(r);
        }
        empty(&cx, reply, r);
    }

    fn rmdir(&self, req: &Request, p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Rmdir);
        let cx = Cx::new(Op::Rmdir, p.0, Some(name));
        if self.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core.rmdir(ino(p), name);
        if resent(req) {
            r = self.core.removed_again(r);
        }
        empty(&cx, reply, r);
    }

    fn symlink(&self, req: &Request, p: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Symlink);
        let cx = Cx::new(Op::Symlink, p.0, Some(name));
        if self.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let target = target.as_os_str().as_bytes();
        let mut r = self.core.symlink(ino(p), name, target, caller(req));
        if resent(req) {
            let made = Made::Symlink(target);
            r = self.core.made_again(r, ino(p), name, made, caller(req));
        }
        entry(&cx, reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        p: INodeNo,
        name: &OsStr,
        np: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Rename);
        let cx = Cx::new(Op::Rename, p.0, Some(name));
        if self.read_only(p.0, Some(name)) || self.read_only(np.0, Some(newname)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self
            .core
            .rename(ino(p), name, ino(np), newname, flags.bits());
        if resent(req) {
            r = self.core.renamed_again(r, ino(p), name, ino(np), newname);
        }
        empty(&cx, reply, r);
    }

    fn link(&self, req: &Request, i: INodeNo, np: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Link);
        let cx = Cx::new(Op::Link, i.0, Some(newname));
        if self.read_only(i.0, None) || self.read_only(np.0, Some(newname)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core.link(ino(i), ino(np), newname);
        if resent(req) {
            let made = Made::Link(ino(i));
            r = self.core.made_again(r, ino(np), newname, made, caller(req));
        }
        entry(&cx, reply, r);
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.info.stats.time(Op::Open);
        if self.no_open() {
            // The kernel opens this open and every later one itself (the connection's no_open).
            return reply.error(Errno::ENOSYS);
        }
        let cx = Cx::new(Op::Open, i.0, None);
        if let Some(v) = self.virt(i.0) {
            // The mirror's object files never change under one inode (git writes new ones and
            // renames): the kernel may keep their pages across opens.
            return match v.open(req.uid(), i.0, flags.0) {
                Ok((fh, _)) => reply.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
                ),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        let i = ino(i);
        // An open that truncates drops set-user/group-ID as a truncate does (KILLPRIV_V2; fuser
        // does not pass the kernel's FUSE_OPEN_KILL_SUIDGID: root stands for CAP_FSETID).
        if flags.0 & libc::O_TRUNC != 0
            && req.uid() != 0
            && let Err(e) = self.core.kill_suidgid(i)
        {
            return reply.error(failed(&cx, e));
        }
        let register = self
            .passthrough()
            .then_some(|f: &File| reply.open_backing(f));
        let opened = match self.handles.open(i, flags.0, register) {
            Ok(o) => o,
            Err(e) => return reply.error(failed(&cx, e)),
        };
        self.note_backing(&opened);
        let FileOpen {
            fh, upper, backing, ..
        } = opened;
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
        if !upper {
            self.read_ahead(i);
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
        let cx = Cx::new(Op::Create, p.0, Some(name));
        if self.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        if resent(req)
            && flags & libc::O_EXCL != 0
            && let Some(attr) = self.core.created_again(ino(p), name, caller(req))
        {
            return self.open_created(&cx, attr, flags, reply);
        }
        if self.no_open() {
            // No RELEASE will come, not even for this file: no handle. The open is held by inode
            // (released when idle or forgotten), and I/O on the file comes with `fh` 0.
            return match self
                .core
                .create(ino(p), name, mode & !umask, flags, caller(req))
            {
                Ok((attr, opened)) => {
                    self.inode_io
                        .adopt(attr.ino.0, opened.file, opened.upper, opened.write);
                    reply.created(
                        &TTL,
                        &attr,
                        Generation(0),
                        FileHandle(0),
                        FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
                    )
                }
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        let register = self
            .passthrough()
            .then_some(|f: &File| reply.open_backing(f));
        let (attr, opened) =
            match self
                .handles
                .create(ino(p), name, mode & !umask, flags, caller(req), register)
            {
                Ok(r) => r,
                Err(e) => return reply.error(failed(&cx, e)),
            };
        self.reply_created(&attr, opened, reply)
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
        let cx = Cx::new(Op::Read, _i.0, None);
        if let Some(v) = self.virt(_i.0) {
            return data(&cx, reply, v.read(_req.uid(), _i.0, fh.0, offset, size));
        }
        let by_inode = self.by_inode(fh.0);
        let r = if by_inode {
            self.inode_io.read(ino(_i), offset, size)
        } else {
            self.handles.read(fh.0, offset, size)
        };
        if let Ok(d) = &r {
            self.info.stats.read_bytes(d.len() as u64);
        }
        data(&cx, reply, r);
        // Without OPEN, a file's first READ is the sign that it is being read.
        if by_inode && offset == 0 {
            self.read_ahead(ino(_i));
        }
    }

    fn write(
        &self,
        _req: &Request,
        _i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.info.stats.time(Op::Write);
        let cx = Cx::new(Op::Write, _i.0, None);
        if self.virt(_i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        // The kernel asks (FUSE_HANDLE_KILLPRIV_V2) when the writer lacks CAP_FSETID and the file
        // has set-user/group-ID: dropped before the bytes land, as a local file system does.
        if wf.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && let Err(e) = self.core.kill_suidgid(ino(_i))
        {
            return reply.error(failed(&cx, e));
        }
        let r = if self.by_inode(fh.0) {
            self.inode_io.write(ino(_i), offset, data)
        } else {
            self.handles.write(fh.0, offset, data)
        };
        if let Ok(n) = r {
            self.info.stats.wrote_bytes(u64::from(n));
        }
        written(&cx, reply, r);
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
        if self.no_open() {
            // No open answered FOPEN_NOFLUSH: ENOSYS stops FLUSH on close for good.
            return reply.error(Errno::ENOSYS);
        }
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
        if let Some(v) = self.virt(i.0) {
            v.release(i.0, fh.0);
            return reply.ok();
        }
        // No-open: handle 0 stands for no handle (files are held by inode, see inode_io.rs).
        if fh.0 != 0 || !self.no_open() {
            self.handles.release(ino(i), fh.0);
        }
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
        let cx = Cx::new(Op::Fsync, _i.0, None);
        if self.virt(_i.0).is_some() {
            return reply.ok();
        }
        let r = if self.by_inode(fh.0) {
            self.inode_io.fsync(ino(_i), datasync)
        } else {
            self.handles.fsync(fh.0, datasync)
        };
        empty(&cx, reply, r);
    }

    /// `ENOSYS` when the kernel can open directories itself (it then never asks again); else a
    /// handle that means nothing (`fh` 0: readdir keeps no state), the listing cached by the kernel.
    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.info.stats.time(Op::Opendir);
        if self.virt(i.0).is_some() && !self.info.no_opendir.load(Ordering::Relaxed) {
            // Listed afresh at every open: the mirror gains and loses packs.
            return reply.opened(FileHandle(0), FopenFlags::empty());
        }
        if self.info.no_opendir.load(Ordering::Relaxed) {
            return reply.error(Errno::ENOSYS);
        }
        let cx = Cx::new(Op::Opendir, i.0, None);
        match self.core.opendir(ino(i)) {
            Ok(()) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(failed(&cx, e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.info.stats.time(Op::Readdir);
        let cx = Cx::new(Op::Readdir, i.0, None);
        if let Some(v) = self.virt(i.0) {
            let r = self.virtual_listing(v, _req.uid(), i.0, offset, |off, ino, kind, name, _| {
                !reply.add(INodeNo(ino), off, kind, name)
            });
            return match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        let r = self.handles.readdir(ino(i), offset, |off, e| {
            !reply.add(INodeNo(e.ino), off, e.kind, &e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(failed(&cx, e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.info.stats.time(Op::Readdirplus);
        let cx = Cx::new(Op::Readdirplus, i.0, None);
        if let Some(v) = self.virt(i.0) {
            let r =
                self.virtual_listing(v, _req.uid(), i.0, offset, |off, ino, kind, name, entry| {
                    let counted = entry.is_some();
                    let attr = match entry {
                        Some((a, rel, md)) => FileAttr {
                            ino: INodeNo(v.count(rel, md)),
                            ..a
                        },
                        None => FileAttr {
                            ino: INodeNo(ino),
                            kind,
                            ..negative_attr()
                        },
                    };
                    let full = reply.add(attr.ino, off, name, &objects::TTL, &attr, Generation(0));
                    if full && counted {
                        v.forget(attr.ino.0, 1);
                    }
                    !full
                });
            return match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        let mut files = Vec::new();
        let r = self.handles.readdir(ino(i), offset, |off, e| {
            // The kernel ignores the attributes of "." and ".."; every other entry's are read
            // now and counted as a reference.
            let dots = e.name == "." || e.name == "..";
            let attr = if dots {
                FileAttr {
                    ino: INodeNo(e.ino),
                    kind: e.kind,
                    ..negative_attr()
                }
            } else {
                match self.core.listed(ino(i), &e.name) {
                    Ok(Some(attr)) => attr,
                    // Gone since the listing was read: not listed.
                    Ok(None) => return true,
                    Err(err) => {
                        tracing::debug!("readdirplus: {:?}: {err:?}", e.name);
                        return true;
                    }
                }
            };
            let full = reply.add(attr.ino, off, &e.name, &TTL, &attr, Generation(0));
            // Not sent (the reply is full): the kernel holds no reference to it.
            if full && !dots {
                self.core.forget(attr.ino.0, 1);
            }
            if !full && attr.kind == fuser::FileType::RegularFile {
                files.push((attr.ino.0, attr.size));
            }
            !full
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(failed(&cx, e)),
        }
        self.order.listed(files);
    }

    /// Only when `opendir` answered a handle: there is nothing to release.
    fn releasedir(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _f: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Releasedir);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _i: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Fsyncdir);
        let cx = Cx::new(Op::Fsyncdir, _i.0, None);
        empty(&cx, reply, self.core.sync_catalog());
    }

    /// No ioctl is served: `ENOTTY`, what the kernel makes of fuser's default `ENOSYS` anyway and
    /// what a regular file answers to a terminal's `TCGETS` (every shell and editor asks), without
    /// the default's warning in the log for each one.
    fn ioctl(
        &self,
        _req: &Request,
        _i: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _i: INodeNo, reply: ReplyStatfs) {
        let _t = self.info.stats.time(Op::Statfs);
        let cx = Cx::new(Op::Statfs, _i.0, None);
        match self.core.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(failed(&cx, e)),
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
        let cx = Cx::new(Op::Setxattr, i.0, Some(name));
        if self.virt(i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        empty(&cx, reply, self.core.setxattr(ino(i), name, value, flags));
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.info.stats.time(Op::Getxattr);
        let cx = Cx::new(Op::Getxattr, i.0, Some(name));
        if self.virt(i.0).is_some() {
            return reply.error(Errno::ENODATA);
        }
        xattr(&cx, reply, self.core.getxattr(ino(i), name, size));
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.info.stats.time(Op::Listxattr);
        let cx = Cx::new(Op::Listxattr, i.0, None);
        if self.virt(i.0).is_some() {
            return if size == 0 {
                reply.size(0)
            } else {
                reply.data(&[])
            };
        }
        xattr(&cx, reply, self.core.listxattr(ino(i), size));
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Removexattr);
        let cx = Cx::new(Op::Removexattr, i.0, Some(name));
        if self.virt(i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        empty(&cx, reply, self.core.removexattr(ino(i), name));
    }

    fn access(&self, _req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Access);
        let cx = Cx::new(Op::Access, i.0, None);
        if let Some(v) = self.virt(i.0) {
            if mask.bits() & libc::W_OK != 0 {
                return reply.error(Errno::EROFS);
            }
            return empty(&cx, reply, v.getattr(_req.uid(), i.0).map(|_| ()));
        }
        empty(&cx, reply, self.core.access(ino(i), mask.bits()));
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
        let cx = Cx::new(Op::Fallocate, _i.0, None);
        if self.virt(_i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        let r = if self.no_open() && fh.0 == 0 {
            self.inode_io.fallocate(ino(_i), mode, offset, length)
        } else {
            self.handles.fallocate(fh.0, mode, offset, length)
        };
        empty(&cx, reply, r);
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
        let cx = Cx::new(Op::Lseek, _i.0, None);
        if let Some(v) = self.virt(_i.0) {
            return match v.lseek(_req.uid(), _i.0, fh.0, offset, whence) {
                Ok(off) => reply.offset(off),
                Err(e) => reply.error(failed(&cx, e)),
            };
        }
        let r = if self.no_open() && fh.0 == 0 {
            self.inode_io.lseek(ino(_i), offset, whence)
        } else {
            self.handles.lseek(fh.0, offset, whence)
        };
        match r {
            Ok(off) => reply.offset(off),
            Err(e) => reply.error(failed(&cx, e)),
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
        let cx = Cx::new(Op::CopyFileRange, _i.0, None);
        if self.virt(_o.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        // Not a handle of the core's: the caller copies by reading and writing.
        if self.virt(_i.0).is_some() {
            return reply.error(Errno::EXDEV);
        }
        let r = if self.no_open() && fh_in.0 == 0 && fh_out.0 == 0 {
            self.inode_io
                .copy_file_range(ino(_i), off_in, ino(_o), off_out, len)
        } else {
            self.handles
                .copy_file_range(fh_in.0, off_in, fh_out.0, off_out, len)
        };
        written(&cx, reply, r);
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
    // Only a foreground `Session::run` reads with threads of its own; a spawned session is
    // served by the process's worker pool (`pool_limits`).
    cfg.n_threads = Some(4);
    cfg.clone_fd = true;
    let (min, max) = pool_limits();
    fuser::pool::set_limits(min, max);
    cfg
}

/// The bounds of the one pool of threads serving every mount's `/dev/fuse` connection
/// (`vendor/fuser/src/pool.rs`, policy in `docs/transport.md` "Request threads"): at least two
/// per core (at least 4, at most 16) kept, at most 24 (the pool starts another worker whenever
/// none is idle, so up to 23 requests may block at once before a new one waits). 24 keeps the
/// whole daemon under 64 threads: at 1,000 workspaces under load the pool reached a cap of 32 and
/// the daemon 59 threads.
pub fn pool_limits() -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    ((2 * cores).clamp(4, 16), 24)
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

/// [`invalidate`], after releasing what a no-open mount holds open of the inodes the daemon changed
/// (their next READ opens the current content).
pub fn invalidate_mount(info: &MountInfo, notifier: &fuser::Notifier, behind: &[Behind]) {
    if let Some(io) = info.inode_io.get() {
        let inodes: Vec<u64> = behind
            .iter()
            .filter_map(|b| match b {
                Behind::Inode(i) => Some(*i),
                Behind::Entry { .. } => None,
            })
            .collect();
        io.drop_inodes(&inodes);
    }
    invalidate(notifier, behind);
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

/// What one mount's adapter holds that the kernel depends on, as handed to another daemon process
/// (`crate::daemon::takeover`): the INIT outcome it acted on, its open handles and the core's live
/// nodes. The handles' files travel alongside as descriptors.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AdapterState {
    pub passthrough: bool,
    pub no_opendir: bool,
    /// The mount runs in no-open mode (absent in a handover from a daemon without it: no).
    #[serde(default)]
    pub no_open: bool,
    pub handles: super::handles::HandlesState,
    pub nodes: Vec<super::workspace::NodeState>,
}

/// The state of the adapter serving `core` with `info`, and each handle's file (same order as
/// `handles.handles`). Call it while the mount's readers are paused.
pub fn export_state(
    info: &MountInfo,
    core: &WorkspaceFs,
) -> std::io::Result<(AdapterState, Vec<Arc<File>>)> {
    let handles = info
        .handles
        .0
        .get()
        .ok_or_else(|| std::io::Error::other("the mount has no adapter"))?;
    // Files a no-open mount holds by inode are not handed over: released here (their writes
    // noted, the nodes' open counts settled), the new daemon opens them again at the next READ or
    // WRITE; if the handover fails this daemon does the same.
    if let Some(io) = info.inode_io.get() {
        io.release_all();
    }
    let (handles, files) = handles.export_state(BackingId::raw);
    let state = AdapterState {
        passthrough: info.passthrough.load(Ordering::Relaxed),
        no_opendir: info.no_opendir.load(Ordering::Relaxed),
        no_open: info.no_open.load(Ordering::Relaxed),
        handles,
        nodes: core.export_nodes(),
    };
    Ok((state, files))
}

/// Serves a mount another daemon process made and handed over (`crate::daemon::takeover`): its
/// connection `fd`, already initialized (`negotiated`), with the adapter given the old process's
/// handles (`files` in the order of `state.handles.handles`), backing ids and node references.
/// Nothing is served until the caller spawns the session; dropping it unmounts.
pub fn adopt(
    adapter: FuseAdapter,
    fd: std::os::fd::OwnedFd,
    mountpoint: &Path,
    cfg: &fuser::Config,
    negotiated: fuser::Negotiated,
    state: AdapterState,
    files: Vec<File>,
) -> std::io::Result<fuser::Session<FuseAdapter>> {
    let info = adapter.info.clone();
    info.passthrough.store(state.passthrough, Ordering::Relaxed);
    info.no_opendir.store(state.no_opendir, Ordering::Relaxed);
    info.no_open.store(state.no_open, Ordering::Relaxed);
    let _ = info.transport.set("dev".into());
    adapter.core.import_nodes(state.nodes);
    let mut session =
        fuser::Session::from_fd_initialized(adapter, fd, mountpoint, cfg.clone(), negotiated)?;
    let mut ids = std::collections::HashMap::new();
    for h in &state.handles.handles {
        if let Some(id) = h.backing {
            ids.entry(id).or_insert_with(|| session.adopt_backing(id));
        }
    }
    let fs = session
        .filesystem_mut()
        .ok_or_else(|| std::io::Error::other("the session has no filesystem"))?;
    fs.handles
        .import_state(state.handles, files, |id| ids.remove(&id))
        .map_err(std::io::Error::other)?;
    Ok(session)
}
