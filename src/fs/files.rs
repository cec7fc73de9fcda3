//! The files of one mount as the kernel opens, reads and closes them, in either I/O mode
//! ([`IoMode`](super::io::IoMode), `docs/performance.md`): with handles (OPEN and RELEASE, passthrough when it works;
//! [`Handles`]), or no-open, where the kernel opens and closes files without a request (`open` and
//! `flush` answer `ENOSYS`) and READ, WRITE and the other file requests are served by inode
//! ([`InodeIo`]). Everything that differs between the modes is decided here, once: which
//! [`FileIo`] serves a request, what an OPEN or CREATE answers (an [`Opening`] with its FOPEN flags,
//! [`super::caching`]), what RELEASE, FORGET and FLUSH do, and when the set-user-ID rule applies
//! before an open, write or truncate (the rule itself is the core's).
//!
//! It also owns the mount's read-ahead: the regular files a READDIRPLUS lists are remembered in
//! listing order, and a file's OPEN (handles) or first READ (no-open) hands the next ones to the
//! daemon's read-ahead pool, after the reply ([`super::readahead`]).
//!
//! Knows the kernel only through fuser's types (attributes, FOPEN flags, backing ids); never
//! replies to a request (the adapter in `fuse/` does) and touches the workspace only through
//! [`WorkspaceFs`]'s request methods.

use std::ffi::OsStr;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::{BackingId, Errno, FileAttr};

use super::caching::{self, Entry, Opening};
use super::handles::{FileOpen, Handles};
use super::inode_io::InodeIo;
use super::io::{FileIo, FileRef};
use super::mount::MountInfo;
use super::readahead::ListingOrder;
use super::{Caller, FsResult, SetAttr, WorkspaceFs};
use crate::cow::blobcache::AheadOwner;

/// The open files of one mount.
pub struct Files {
    core: Arc<WorkspaceFs>,
    info: Arc<MountInfo>,
    handles: Arc<Handles<BackingId>>,
    inode_io: Arc<InodeIo>,
    /// The regular files listed, in listing order, for read-ahead.
    order: ListingOrder,
    /// This mount's claim on the read-ahead pool, stopped at unmount.
    ahead: Arc<AheadOwner>,
}

impl Files {
    /// The files of the mount serving `core`, reachable from `info` for the daemon (handover,
    /// invalidation).
    pub fn new(core: Arc<WorkspaceFs>, info: Arc<MountInfo>) -> Self {
        let handles = Arc::new(Handles::new(core.clone()));
        info.handles.set(handles.clone());
        let inode_io = Arc::new(InodeIo::new(core.clone()));
        let _ = info.inode_io.set(inode_io.clone());
        Files {
            core,
            info,
            handles,
            inode_io,
            order: ListingOrder::default(),
            ahead: Arc::new(AheadOwner::default()),
        }
    }

    pub fn core(&self) -> &Arc<WorkspaceFs> {
        &self.core
    }

    /// The handle table (for a handover to another daemon process).
    pub fn handles(&self) -> &Handles<BackingId> {
        &self.handles
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

    /// The I/O that serves a request on `fh`.
    fn io(&self, fh: u64) -> &dyn FileIo {
        if self.by_inode(fh) {
            &*self.inode_io
        } else {
            &*self.handles
        }
    }

    /// Counts a passthrough open, or turns passthrough off for the mount when registering failed.
    fn note_backing(&self, opened: &FileOpen<BackingId>) {
        if let Some(e) = &opened.passthrough_failed {
            tracing::warn!("passthrough unavailable ({e}); serving I/O through the daemon");
            self.info.passthrough.store(false, Ordering::Relaxed);
        }
        if opened.backing.is_some() {
            self.info.stats.passthrough_open();
        }
    }

    /// File `i` is being read: the files listed after it go to the read-ahead pool.
    fn read_ahead(&self, i: u64) {
        let next = self.order.read(i);
        if !next.is_empty() {
            self.core.read_ahead(&next, &self.ahead, self.no_open());
        }
    }

    /// The mount is going away: nothing more is read ahead, writers held by inode note their
    /// changes, then the core closes.
    pub fn close(&self) {
        self.ahead.stop();
        self.inode_io.release_all();
        self.core.close();
    }

    /// The kernel dropped `nlookup` references to `ino`. In no-open mode no file of it is open any
    /// more: what is held of it goes first (an unlinked file's data goes with the core's last
    /// reference).
    pub fn forget(&self, ino: u64, nlookup: u64) {
        if self.no_open() {
            self.inode_io.drop_inodes(&[ino]);
        }
        self.core.forget(ino, nlookup);
    }

    /// SETATTR of `ino` by `caller_uid`, with the core's set-user-ID rule. Truncating a base file
    /// that readers hold through passthrough first moves the name to a new inode (`ESTALE`: look
    /// again).
    pub fn setattr(&self, ino: u64, set: SetAttr, caller_uid: u32) -> FsResult<Entry> {
        if set.size.is_some() {
            self.handles.before_truncate(ino)?;
        }
        self.core
            .setattr(ino, set.from_caller(caller_uid))
            .map(Entry::of)
    }

    /// Whether OPEN is served at all: `ENOSYS` in no-open mode (the kernel then opens this file and
    /// every later one itself, the virtual objects tree's included).
    pub fn serves_open(&self) -> FsResult<()> {
        if self.no_open() {
            return Err(Errno::ENOSYS.into());
        }
        Ok(())
    }

    /// OPEN of `ino` with `flags` by `caller_uid`; `register` registers a passthrough backing file
    /// with the kernel (used when passthrough is on). `ENOSYS` in no-open mode: the kernel opens
    /// this file and every later one itself. Call [`Self::opened`] after the reply.
    pub fn open(
        &self,
        ino: u64,
        flags: i32,
        caller_uid: u32,
        register: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> FsResult<(Opening<BackingId>, Then)> {
        self.serves_open()?;
        self.core.before_open(ino, flags, caller_uid)?;
        let opened = self
            .handles
            .open(ino, flags, self.passthrough().then_some(register))?;
        self.note_backing(&opened);
        let FileOpen {
            fh, upper, backing, ..
        } = opened;
        let flags = caching::file_flags(upper, backing.is_some());
        let then = Then(!upper);
        Ok((Opening { fh, flags, backing }, then))
    }

    /// After the reply to an OPEN of `ino`: base content being read moves the read-ahead window.
    pub fn opened(&self, ino: u64, then: Then) {
        if then.0 {
            self.read_ahead(ino);
        }
    }

    /// CREATE of `name` in `parent` (`mode` with the umask applied), opened with `flags`. A resent
    /// exclusive create whose file the daemon that died made is opened and answered as the create
    /// would have been. In no-open mode no RELEASE will come, not even for this file: no handle
    /// (the open is held by inode, released when idle or forgotten, and I/O comes with `fh` 0).
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
        resent: bool,
        register: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> FsResult<(Entry, Opening<BackingId>)> {
        if resent
            && flags & libc::O_EXCL != 0
            && let Some(attr) = self.core.created_again(parent, name, caller)
        {
            return self.open_created(attr, flags, register);
        }
        let register = self.passthrough().then_some(register);
        if self.no_open() {
            let (attr, opened) = self.core.create(parent, name, mode, flags, caller)?;
            self.inode_io
                .adopt(attr.ino.0, opened.file, opened.upper, opened.write);
            return Ok((Entry::of(attr), kernel_opened()));
        }
        let (attr, opened) = self
            .handles
            .create(parent, name, mode, flags, caller, register)?;
        Ok((Entry::of(attr), self.created(opened)))
    }

    /// A resent `create` whose file the daemon that died made (`WorkspaceFs::created_again`, one
    /// kernel reference counted): opened now.
    fn open_created(
        &self,
        attr: FileAttr,
        flags: i32,
        register: impl FnOnce(&File) -> std::io::Result<BackingId>,
    ) -> FsResult<(Entry, Opening<BackingId>)> {
        let i = attr.ino.0;
        if self.no_open() {
            // As a create without OPEN: held by inode when its I/O comes (`fh` 0).
            return Ok((Entry::of(attr), kernel_opened()));
        }
        let register = self.passthrough().then_some(register);
        let flags = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        match self.handles.open(i, flags, register) {
            Ok(opened) => Ok((Entry::of(attr), self.created(opened))),
            Err(e) => {
                self.core.forget(i, 1);
                Err(e)
            }
        }
    }

    /// The file a CREATE opened with a handle: its backing when it has one, no flush round trip.
    fn created(&self, opened: FileOpen<BackingId>) -> Opening<BackingId> {
        self.note_backing(&opened);
        let FileOpen { fh, backing, .. } = opened;
        Opening {
            fh,
            flags: caching::NOFLUSH,
            backing,
        }
    }

    /// FLUSH: nothing to do (every write is already in the data file, and writer accounting ends
    /// at release), so every open answers `FOPEN_NOFLUSH`. In no-open mode no open did: `ENOSYS`
    /// stops FLUSH on close for good.
    pub fn flush(&self) -> FsResult<()> {
        if self.no_open() {
            return Err(Errno::ENOSYS.into());
        }
        Ok(())
    }

    /// RELEASE of handle `fh` of `ino`. In no-open mode handle 0 stands for no handle (files are
    /// held by inode, see `inode_io.rs`).
    pub fn release(&self, ino: u64, fh: u64) {
        if fh != 0 || !self.no_open() {
            self.handles.release(ino, fh);
        }
    }

    /// READ of `f`; call [`Self::after_read`] after the reply.
    pub fn read(&self, f: FileRef, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let r = self.io(f.fh).read(f, offset, size);
        if let Ok(d) = &r {
            self.info.stats.read_bytes(d.len() as u64);
        }
        r
    }

    /// After the reply to a READ: without OPEN, a file's first READ is the sign that it is being
    /// read.
    pub fn after_read(&self, f: FileRef, offset: u64) {
        if offset == 0 && self.by_inode(f.fh) {
            self.read_ahead(f.ino);
        }
    }

    /// WRITE to `f`. `kill_suidgid`: the kernel asks (`FUSE_HANDLE_KILLPRIV_V2`, the writer lacks
    /// `CAP_FSETID` and the file has set-user/group-ID) that they be dropped before the bytes
    /// land, as a local file system does.
    pub fn write(&self, f: FileRef, offset: u64, data: &[u8], kill_suidgid: bool) -> FsResult<u32> {
        if kill_suidgid {
            self.core.kill_suidgid(f.ino)?;
        }
        let r = self.io(f.fh).write(f, offset, data);
        if let Ok(n) = r {
            self.info.stats.wrote_bytes(u64::from(n));
        }
        r
    }

    pub fn fsync(&self, f: FileRef, datasync: bool) -> FsResult<()> {
        self.io(f.fh).fsync(f, datasync)
    }

    pub fn fallocate(&self, f: FileRef, mode: i32, offset: u64, length: u64) -> FsResult<()> {
        self.io(f.fh).fallocate(f, mode, offset, length)
    }

    pub fn lseek(&self, f: FileRef, offset: i64, whence: i32) -> FsResult<i64> {
        self.io(f.fh).lseek(f, offset, whence)
    }

    /// COPY_FILE_RANGE: by inode when both files are, else by handle.
    pub fn copy_file_range(
        &self,
        from: FileRef,
        off_in: u64,
        to: FileRef,
        off_out: u64,
        len: u64,
    ) -> FsResult<u32> {
        let io: &dyn FileIo = if self.by_inode(from.fh) && self.by_inode(to.fh) {
            &*self.inode_io
        } else {
            &*self.handles
        };
        io.copy_file_range(from, off_in, to, off_out, len)
    }

    /// OPENDIR: `ENOSYS` when the kernel can open directories itself (it then never asks again);
    /// else a handle that means nothing (`fh` 0: readdir keeps no state), the listing cached by
    /// the kernel, except a directory of the virtual objects tree (`virtual_dir`), listed afresh
    /// at every open (the mirror gains and loses packs).
    pub fn opendir(&self, ino: u64, virtual_dir: bool) -> FsResult<Opening<BackingId>> {
        if self.info.no_opendir.load(Ordering::Relaxed) {
            return Err(Errno::ENOSYS.into());
        }
        if virtual_dir {
            return Ok(Opening {
                fh: 0,
                flags: fuser::FopenFlags::empty(),
                backing: None,
            });
        }
        self.core.opendir(ino)?;
        Ok(Opening {
            fh: 0,
            flags: caching::DIR_FLAGS,
            backing: None,
        })
    }

    /// READDIR of `ino` after `offset`: `add(offset, inode, kind, name)` until it answers that the
    /// reply is full.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, fuser::FileType, &OsStr) -> bool,
    ) -> FsResult<()> {
        self.handles
            .readdir(ino, offset, |off, e| !add(off, e.ino, e.kind, &e.name))
    }

    /// READDIRPLUS of `ino` after `offset`: `add(offset, name, entry)` until it answers that the
    /// reply is full. Every entry but `.` and `..` is counted as a kernel reference when it is
    /// sent; the regular files sent are remembered for read-ahead.
    pub fn readdirplus(
        &self,
        ino: u64,
        offset: u64,
        mut add: impl FnMut(u64, &OsStr, &Entry) -> bool,
    ) -> FsResult<()> {
        let mut files = Vec::new();
        let r = self.handles.readdir(ino, offset, |off, e| {
            // The kernel ignores the attributes of "." and ".."; every other entry's are read
            // now and counted as a reference.
            let dots = e.name == "." || e.name == "..";
            let entry = if dots {
                Entry::dot(e.ino, e.kind)
            } else {
                match self.core.listed(ino, &e.name) {
                    Ok(Some(attr)) => Entry::of(attr),
                    // Gone since the listing was read: not listed.
                    Ok(None) => return true,
                    Err(err) => {
                        tracing::debug!("readdirplus: {:?}: {err:?}", e.name);
                        return true;
                    }
                }
            };
            let full = add(off, &e.name, &entry);
            // Not sent (the reply is full): the kernel holds no reference to it.
            if full && !dots {
                self.core.forget(entry.attr.ino.0, 1);
            }
            if !full && entry.attr.kind == fuser::FileType::RegularFile {
                files.push((entry.attr.ino.0, entry.attr.size));
            }
            !full
        });
        self.order.listed(files);
        r
    }
}

/// What to do after the reply to an OPEN ([`Files::opened`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Then(bool);

/// A file opened without a handle (no-open mode): `fh` 0, the mount's page cache kept.
fn kernel_opened() -> Opening<BackingId> {
    Opening {
        fh: 0,
        flags: caching::KERNEL_OPENED,
        backing: None,
    }
}
