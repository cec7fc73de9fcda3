//! The fuser adapter: one `Filesystem` per mounted workspace. It translates each kernel request into
//! one call (the core [`WorkspaceFs`], the mount's open files [`Files`], or the virtual objects tree
//! [`virt`]) and its outcome into a reply ([`reply`]); it decides nothing. TTLs and FOPEN flags come
//! with the outcome (`super::caching`), the I/O mode is `super::files`' business, the set-user-ID
//! rule the core's, what INIT asks `super::mount`'s. A failed request is answered with its
//! [`FsError`](super::FsError)'s errno and logged once, with the error's context
//! (`super::failures`). A restart hands the adapter to another process ([`handover`]).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle, Filesystem, Generation,
    INodeNo, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use self::reply::{caller, resent, set_time};
use self::virt::Virt;
use super::caching::Entry;
use super::failures::{Cx, answer};
use super::files::Files;
use super::io::FileRef;
use super::objects::MirrorObjects;
use super::stats::Op;
use super::{Made, SetAttr, WorkspaceFs};

pub mod handover;
pub mod reply;
pub mod virt;

// The paths the daemon uses, from before the adapter was split.
pub use super::io::IoMode;
pub use super::mount::{MountInfo, invalidate, invalidate_mount, mount, mount_config, pool_limits};
pub use handover::{AdapterState, adopt, export_state};

pub struct FuseAdapter {
    files: Files,
    virt: Virt,
    info: Arc<MountInfo>,
    want_passthrough: bool,
    want_io: IoMode,
}

impl FuseAdapter {
    pub fn new(core: Arc<WorkspaceFs>, want_passthrough: bool, info: Arc<MountInfo>) -> Self {
        FuseAdapter {
            files: Files::new(core.clone(), info.clone()),
            virt: Virt::new(core, None),
            info,
            want_passthrough,
            want_io: IoMode::Handles,
        }
    }

    /// Presents `objects` read-only at `.git/octofs/objects` (see `super::objects`).
    pub fn with_objects(mut self, objects: Option<Arc<MirrorObjects>>) -> Self {
        self.virt = Virt::new(self.files.core().clone(), objects);
        self
    }

    /// The I/O mode to ask the kernel for at INIT (no-open falls back to handles when the kernel
    /// does not offer it).
    pub fn with_io(mut self, io: IoMode) -> Self {
        self.want_io = io;
        self
    }

    pub fn info(&self) -> &Arc<MountInfo> {
        &self.info
    }

    pub fn files(&self) -> &Files {
        &self.files
    }

    fn core(&self) -> &WorkspaceFs {
        self.files.core()
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, cfg: &mut KernelConfig) -> std::io::Result<()> {
        super::mount::negotiate(&self.info, self.want_io, self.want_passthrough, cfg);
        Ok(())
    }

    fn destroy(&mut self) {
        self.files.close();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Lookup);
        let cx = Cx::new(Op::Lookup, parent.0, Some(name));
        if let Some(v) = self.virt.of(parent.0) {
            return reply::entry(&cx, reply, Virt::lookup(v, req.uid(), Some(parent.0), name));
        }
        if let Some(v) = self.virt.top(parent.0, name) {
            return reply::entry(&cx, reply, Virt::lookup(v, req.uid(), None, name));
        }
        reply::entry(
            &cx,
            reply,
            Entry::lookup(self.core().lookup(parent.0, name)),
        );
    }

    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        let _t = self.info.stats.time(Op::Forget);
        if let Some(v) = self.virt.of(i.0) {
            return v.forget(i.0, nlookup);
        }
        self.files.forget(i.0, nlookup);
    }

    fn getattr(&self, req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.info.stats.time(Op::Getattr);
        let cx = Cx::new(Op::Getattr, i.0, None);
        if let Some(v) = self.virt.of(i.0) {
            return reply::attr(&cx, reply, Virt::getattr(v, req.uid(), i.0));
        }
        reply::attr(&cx, reply, self.core().getattr(i.0).map(Entry::of));
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
        if self.virt.read_only(i.0, None) {
            return reply.error(Errno::EROFS);
        }
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime,
            kill_suidgid: false,
        };
        reply::attr(&cx, reply, self.files.setattr(i.0, set, req.uid()));
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        let _t = self.info.stats.time(Op::Readlink);
        let cx = Cx::new(Op::Readlink, i.0, None);
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::EINVAL);
        }
        reply::data(&cx, reply, self.core().readlink(i.0));
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
        if self.virt.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self
            .core()
            .mknod(p.0, name, mode & !umask, rdev, caller(req));
        if resent(req) {
            let made = Made::Node(mode & libc::S_IFMT);
            r = self.core().made_again(r, p.0, name, made, caller(req));
        }
        reply::entry(&cx, reply, r.map(Entry::of));
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
        if self.virt.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core().mkdir(p.0, name, mode & !umask, caller(req));
        if resent(req) {
            r = self.core().made_again(r, p.0, name, Made::Dir, caller(req));
        }
        reply::entry(&cx, reply, r.map(Entry::of));
    }

    fn unlink(&self, req: &Request, p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Unlink);
        let cx = Cx::new(Op::Unlink, p.0, Some(name));
        if self.virt.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core().unlink(p.0, name);
        if resent(req) {
            r = self.core().removed_again(r);
        }
        reply::empty(&cx, reply, r);
    }

    fn rmdir(&self, req: &Request, p: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Rmdir);
        let cx = Cx::new(Op::Rmdir, p.0, Some(name));
        if self.virt.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core().rmdir(p.0, name);
        if resent(req) {
            r = self.core().removed_again(r);
        }
        reply::empty(&cx, reply, r);
    }

    fn symlink(&self, req: &Request, p: INodeNo, name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Symlink);
        let cx = Cx::new(Op::Symlink, p.0, Some(name));
        if self.virt.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let target = target.as_os_str().as_bytes();
        let mut r = self.core().symlink(p.0, name, target, caller(req));
        if resent(req) {
            let made = Made::Symlink(target);
            r = self.core().made_again(r, p.0, name, made, caller(req));
        }
        reply::entry(&cx, reply, r.map(Entry::of));
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
        if self.virt.read_only(p.0, Some(name)) || self.virt.read_only(np.0, Some(newname)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core().rename(p.0, name, np.0, newname, flags.bits());
        if resent(req) {
            r = self.core().renamed_again(r, p.0, name, np.0, newname);
        }
        reply::empty(&cx, reply, r);
    }

    fn link(&self, req: &Request, i: INodeNo, np: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _t = self.info.stats.time(Op::Link);
        let cx = Cx::new(Op::Link, i.0, Some(newname));
        if self.virt.read_only(i.0, None) || self.virt.read_only(np.0, Some(newname)) {
            return reply.error(Errno::EROFS);
        }
        let mut r = self.core().link(i.0, np.0, newname);
        if resent(req) {
            let made = Made::Link(i.0);
            r = self.core().made_again(r, np.0, newname, made, caller(req));
        }
        reply::entry(&cx, reply, r.map(Entry::of));
    }

    fn open(&self, req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.info.stats.time(Op::Open);
        let cx = Cx::new(Op::Open, i.0, None);
        if let Some(v) = self.virt.of(i.0) {
            let r = self.files.serves_open();
            let r = r.and_then(|()| Virt::open(v, req.uid(), i.0, flags.0));
            return reply::opened(&cx, reply, r);
        }
        let r = self
            .files
            .open(i.0, flags.0, req.uid(), |f| reply.open_backing(f));
        let (r, then) = match r {
            Ok((opening, then)) => (Ok(opening), then),
            Err(e) => (Err(e), Default::default()),
        };
        reply::opened(&cx, reply, r);
        self.files.opened(i.0, then);
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
        if self.virt.read_only(p.0, Some(name)) {
            return reply.error(Errno::EROFS);
        }
        let r = self.files.create(
            p.0,
            name,
            mode & !umask,
            flags,
            caller(req),
            resent(req),
            |f| reply.open_backing(f),
        );
        reply::created(&cx, reply, r);
    }

    fn read(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _t = self.info.stats.time(Op::Read);
        let cx = Cx::new(Op::Read, i.0, None);
        if let Some(v) = self.virt.of(i.0) {
            return reply::data(&cx, reply, v.read(req.uid(), i.0, fh.0, offset, size));
        }
        let f = FileRef { ino: i.0, fh: fh.0 };
        reply::data(&cx, reply, self.files.read(f, offset, size));
        self.files.after_read(f, offset);
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: WriteFlags,
        _flags: OpenFlags,
        _lo: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.info.stats.time(Op::Write);
        let cx = Cx::new(Op::Write, i.0, None);
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        let f = FileRef { ino: i.0, fh: fh.0 };
        let kill = wf.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        reply::written(&cx, reply, self.files.write(f, offset, data, kill));
    }

    fn flush(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Flush);
        let cx = Cx::new(Op::Flush, i.0, None);
        reply::empty(&cx, reply, self.files.flush());
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
        match self.virt.of(i.0) {
            Some(v) => v.release(i.0, fh.0),
            None => self.files.release(i.0, fh.0),
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, i: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Fsync);
        let cx = Cx::new(Op::Fsync, i.0, None);
        if self.virt.of(i.0).is_some() {
            return reply.ok();
        }
        let f = FileRef { ino: i.0, fh: fh.0 };
        reply::empty(&cx, reply, self.files.fsync(f, datasync));
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.info.stats.time(Op::Opendir);
        let cx = Cx::new(Op::Opendir, i.0, None);
        let virtual_dir = self.virt.of(i.0).is_some();
        reply::opened(&cx, reply, self.files.opendir(i.0, virtual_dir));
    }

    fn readdir(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.info.stats.time(Op::Readdir);
        let cx = Cx::new(Op::Readdir, i.0, None);
        let add = |off, ino, kind, name: &OsStr| reply.add(INodeNo(ino), off, kind, name);
        let r = match self.virt.of(i.0) {
            Some(v) => self.virt.readdir(v, req.uid(), i.0, offset, add),
            None => self.files.readdir(i.0, offset, add),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(answer(&cx, e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.info.stats.time(Op::Readdirplus);
        let cx = Cx::new(Op::Readdirplus, i.0, None);
        let add = |off, name: &OsStr, e: &Entry| {
            reply.add_with_ttls(
                e.attr.ino,
                off,
                name,
                &e.attr_ttl,
                &e.entry_ttl,
                &e.attr,
                Generation(0),
            )
        };
        let r = match self.virt.of(i.0) {
            Some(v) => self.virt.readdirplus(v, req.uid(), i.0, offset, add),
            None => self.files.readdirplus(i.0, offset, add),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(answer(&cx, e)),
        }
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

    fn fsyncdir(&self, _req: &Request, i: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Fsyncdir);
        let cx = Cx::new(Op::Fsyncdir, i.0, None);
        reply::empty(&cx, reply, self.core().sync_catalog());
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

    fn statfs(&self, _req: &Request, i: INodeNo, reply: ReplyStatfs) {
        let _t = self.info.stats.time(Op::Statfs);
        let cx = Cx::new(Op::Statfs, i.0, None);
        match self.core().statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(answer(&cx, e)),
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
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        reply::empty(&cx, reply, self.core().setxattr(i.0, name, value, flags));
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.info.stats.time(Op::Getxattr);
        let cx = Cx::new(Op::Getxattr, i.0, Some(name));
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::ENODATA);
        }
        reply::xattr(&cx, reply, self.core().getxattr(i.0, name, size));
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.info.stats.time(Op::Listxattr);
        let cx = Cx::new(Op::Listxattr, i.0, None);
        if self.virt.of(i.0).is_some() {
            return if size == 0 {
                reply.size(0)
            } else {
                reply.data(&[])
            };
        }
        reply::xattr(&cx, reply, self.core().listxattr(i.0, size));
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Removexattr);
        let cx = Cx::new(Op::Removexattr, i.0, Some(name));
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        reply::empty(&cx, reply, self.core().removexattr(i.0, name));
    }

    fn access(&self, req: &Request, i: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _t = self.info.stats.time(Op::Access);
        let cx = Cx::new(Op::Access, i.0, None);
        if let Some(v) = self.virt.of(i.0) {
            return reply::empty(&cx, reply, Virt::access(v, req.uid(), i.0, mask.bits()));
        }
        reply::empty(&cx, reply, self.core().access(i.0, mask.bits()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.info.stats.time(Op::Fallocate);
        let cx = Cx::new(Op::Fallocate, i.0, None);
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        let f = FileRef { ino: i.0, fh: fh.0 };
        reply::empty(&cx, reply, self.files.fallocate(f, mode, offset, length));
    }

    fn lseek(
        &self,
        req: &Request,
        i: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.info.stats.time(Op::Lseek);
        let cx = Cx::new(Op::Lseek, i.0, None);
        if let Some(v) = self.virt.of(i.0) {
            return reply::offset(&cx, reply, v.lseek(req.uid(), i.0, fh.0, offset, whence));
        }
        let f = FileRef { ino: i.0, fh: fh.0 };
        reply::offset(&cx, reply, self.files.lseek(f, offset, whence));
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        i: INodeNo,
        fh_in: FileHandle,
        off_in: u64,
        o: INodeNo,
        fh_out: FileHandle,
        off_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _t = self.info.stats.time(Op::CopyFileRange);
        let cx = Cx::new(Op::CopyFileRange, i.0, None);
        if self.virt.of(o.0).is_some() {
            return reply.error(Errno::EROFS);
        }
        // Not a handle of the core's: the caller copies by reading and writing.
        if self.virt.of(i.0).is_some() {
            return reply.error(Errno::EXDEV);
        }
        let from = FileRef {
            ino: i.0,
            fh: fh_in.0,
        };
        let to = FileRef {
            ino: o.0,
            fh: fh_out.0,
        };
        let r = self.files.copy_file_range(from, off_in, to, off_out, len);
        reply::written(&cx, reply, r);
    }
}
