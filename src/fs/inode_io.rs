//! File I/O by inode, for mounts in no-open mode (`octofs serve --io no-open`).
//!
//! In that mode `open` answers `ENOSYS`, so the kernel opens files itself: it never sends OPEN,
//! RELEASE (not even for a file made by CREATE) or a file handle (every READ and WRITE carries
//! `fh` 0), and it keeps each inode's page cache across opens. What the handle table does per open
//! is done here per inode:
//! - **A bounded table of open files by inode** (at most [`HELD`]): the first READ of an inode opens
//!   its content through the core (the blob-cache file of base content, or the data file), later
//!   READs reuse it. A reader of base content whose inode was copied up since reads the data file.
//!   What a READ read of the blob cache is dropped from the daemon's page cache again: the mount
//!   keeps its own copy, and the blob cache's would be a second one.
//! - **Copy-up and writer accounting at the first WRITE.** A WRITE (or fallocate, or the target of
//!   copy_file_range) opens the inode for writing through the core, which copies a base file up and
//!   counts a writer, so snapshots, git's fsmonitor answers and "changed since" checks see the file
//!   as being written. Nothing tells when a writer is done (no RELEASE), so a writer is released once
//!   no write came for [`WRITER_IDLE`] and none is in progress: the core then notes the change, as
//!   at a release. A reader idle for [`READER_IDLE`] is released too (an open file keeps the
//!   workspace from looking idle).
//! - **What the kernel forgets, or the daemon changed behind it, is released at once**, so an
//!   unlinked file's data goes when the kernel's last reference does, and no stale content is read.
//!
//! A sweeper thread runs while anything is held (it exits when the table is empty or the mount's
//! adapter is gone). The table's lock is held only to look up, insert or remove an entry, never
//! across I/O or a call to the core. Touches the workspace only through [`WorkspaceFs`]'s request
//! methods; knows nothing of FUSE (`files.rs` decides when this path is used).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use fuser::Errno;

use super::{Context, FsError, WorkspaceFs};

/// Inodes held open at most; past it the least recently used one is released.
pub const HELD: usize = 512;
/// A writer with no write for this long is released (its change noted).
pub const WRITER_IDLE: Duration = Duration::from_millis(250);
/// A reader not read for this long is released.
pub const READER_IDLE: Duration = Duration::from_secs(5);
/// How often the sweeper looks for idle entries.
const SWEEP: Duration = Duration::from_millis(100);

/// One inode's open content.
struct Held {
    file: Arc<File>,
    /// The workspace's data file (else the read-only blob-cache file of the base).
    upper: bool,
    /// Counted as a writer by the core: its release must say so.
    write: bool,
    used: Instant,
    /// Writes in progress through it: not released meanwhile (a write that landed after the
    /// core noted the release could be missed by a snapshot taken in between).
    busy: u32,
}

struct Inner {
    core: Arc<WorkspaceFs>,
    table: Mutex<HashMap<u64, Held>>,
    sweeping: AtomicBool,
}

/// The per-inode I/O of one mount.
pub struct InodeIo {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Inner {
    fn release(&self, ino: u64, h: Held) {
        self.core.release(ino, h.write);
    }

    /// Releases every entry `pick` chooses; returns whether the table is empty now.
    fn release_where(&self, mut pick: impl FnMut(u64, &Held) -> bool) -> bool {
        let (gone, empty) = {
            let mut t = lock(&self.table);
            let keys: Vec<u64> = t
                .iter()
                .filter(|(i, h)| pick(**i, h))
                .map(|(i, _)| *i)
                .collect();
            let gone: Vec<(u64, Held)> = keys
                .into_iter()
                .filter_map(|i| t.remove(&i).map(|h| (i, h)))
                .collect();
            (gone, t.is_empty())
        };
        for (ino, h) in gone {
            self.release(ino, h);
        }
        empty
    }

    fn sweep(&self, now: Instant) -> bool {
        self.release_where(|_, h| {
            if h.busy > 0 {
                return false;
            }
            let idle = now.saturating_duration_since(h.used);
            idle >= if h.write { WRITER_IDLE } else { READER_IDLE }
        })
    }
}

/// Runs while `inner` holds anything: releases idle entries every [`SWEEP`].
fn sweeper(weak: Weak<Inner>) {
    loop {
        std::thread::sleep(SWEEP);
        let Some(inner) = weak.upgrade() else { return };
        if inner.sweep(Instant::now()) {
            inner.sweeping.store(false, Ordering::Release);
            // An entry added after the sweep but before the flag was cleared started no sweeper.
            let added = !lock(&inner.table).is_empty();
            if !added || inner.sweeping.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }
}

impl InodeIo {
    pub fn new(core: Arc<WorkspaceFs>) -> Self {
        InodeIo {
            inner: Arc::new(Inner {
                core,
                table: Mutex::new(HashMap::new()),
                sweeping: AtomicBool::new(false),
            }),
        }
    }

    fn core(&self) -> &WorkspaceFs {
        &self.inner.core
    }

    /// The open content of `ino`, opened through the core when not held yet; and whether it is
    /// the data file. For writing ([`Self::writing`]) it is counted as a writer (copied up first)
    /// and marked busy until [`Self::written`].
    fn held(&self, ino: u64, write: bool) -> Result<(Arc<File>, bool), FsError> {
        let now = Instant::now();
        let found = lock(&self.inner.table)
            .get_mut(&ino)
            .filter(|h| h.write || !write)
            .map(|h| {
                h.used = now;
                (h.file.clone(), h.upper)
            });
        if let Some((file, upper)) = found
            && (upper || !self.core().is_upper(ino))
        {
            return Ok((file, upper));
        }
        let opened = self
            .core()
            .open(ino, if write { libc::O_RDWR } else { libc::O_RDONLY })?;
        Ok(self.adopt(ino, opened.file, opened.upper, opened.write))
    }

    /// [`Self::held`] for writing, the entry marked busy: call [`Self::written`] after the write.
    fn writing(&self, ino: u64) -> Result<Arc<File>, FsError> {
        let (file, _) = self.held(ino, true)?;
        if let Some(h) = lock(&self.inner.table).get_mut(&ino) {
            h.busy += 1;
        }
        Ok(file)
    }

    /// A write through [`Self::writing`] is done: the writer stays while writes come.
    fn written(&self, ino: u64) {
        if let Some(h) = lock(&self.inner.table).get_mut(&ino) {
            h.busy = h.busy.saturating_sub(1);
            h.used = Instant::now();
        }
    }

    /// Holds `file`, opened through the core for `ino` (a create's open, or [`Self::held`]'s): the
    /// core's count of it ends when the entry is released. An entry that can write is not replaced
    /// by one that cannot (the new one is released instead).
    pub fn adopt(&self, ino: u64, file: File, upper: bool, write: bool) -> (Arc<File>, bool) {
        let held = Held {
            file: Arc::new(file),
            upper,
            write,
            used: Instant::now(),
            busy: 0,
        };
        let mut out = (held.file.clone(), upper);
        let mut released = Vec::new();
        {
            let mut t = lock(&self.inner.table);
            match t.get(&ino) {
                Some(old) if old.write && !write && (old.upper || !upper) => {
                    out = (old.file.clone(), old.upper);
                    released.push((ino, held));
                }
                _ => {
                    if let Some(old) = t.insert(ino, held) {
                        released.push((ino, old));
                    }
                }
            }
            if t.len() > HELD
                && let Some(oldest) = t
                    .iter()
                    .filter(|(_, h)| h.busy == 0)
                    .min_by_key(|(_, h)| h.used)
                    .map(|(i, _)| *i)
                && let Some(h) = t.remove(&oldest)
            {
                released.push((oldest, h));
            }
        }
        for (i, h) in released {
            self.inner.release(i, h);
        }
        if !self.inner.sweeping.swap(true, Ordering::AcqRel) {
            let weak = Arc::downgrade(&self.inner);
            let spawned = std::thread::Builder::new()
                .name("octofs-inode-io".into())
                .spawn(move || sweeper(weak));
            if let Err(e) = spawned {
                tracing::warn!("cannot start the inode I/O sweeper: {e}");
                self.inner.sweeping.store(false, Ordering::Release);
            }
        }
        out
    }

    fn what(&self, ino: u64, upper: bool, op: &str) -> String {
        if upper {
            format!("{op} of data file {}", self.core().data_path(ino).display())
        } else {
            format!("{op} of the base content of inode {ino:#x}")
        }
    }

    /// Up to `size` bytes of `ino` at `offset` (short only at the end of the file).
    ///
    /// What is read of the blob cache is then dropped from the daemon's page cache: the kernel
    /// keeps it in this mount's own page cache (there is no passthrough to share the blob cache's
    /// pages), so a second copy would only double the memory every read costs. A read that ends
    /// short (the end of the file) drops the whole file, readahead included.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let (file, upper) = self.held(ino, false)?;
        let data = super::handles::read_full_at(&file, offset, size)
            .context(|| self.what(ino, upper, "read"))?;
        if !upper {
            let (off, len) = if data.len() < size as usize {
                (0, 0)
            } else {
                (offset, data.len() as u64)
            };
            // Only advice: the content read stays right whatever the kernel makes of it.
            if let Err(e) = crate::sys::fadvise_dontneed(&file, off, len) {
                tracing::debug!("fadvise of the base content of inode {ino:#x}: {e}");
            }
        }
        Ok(data)
    }

    /// Writes `data` at `offset` of `ino` (copied up first if it is base content).
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let file = self.writing(ino)?;
        let r = self
            .core()
            .grow_data(ino, offset.saturating_add(data.len() as u64))
            .and_then(|()| {
                file.write_all_at(data, offset)
                    .context(|| self.what(ino, true, "write"))
            });
        self.written(ino);
        r?;
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL.into())
    }

    /// `fsync` of `ino`: its data file if it has one, then the catalog.
    pub fn fsync(&self, ino: u64, datasync: bool) -> Result<(), FsError> {
        let held = lock(&self.inner.table)
            .get(&ino)
            .filter(|h| h.upper)
            .map(|h| h.file.clone());
        let file = match held {
            Some(f) => Some(f),
            None if self.core().is_upper(ino) => Some(Arc::new(self.core().open_data(ino)?)),
            None => None,
        };
        if let Some(file) = file {
            if datasync {
                file.sync_data()
            } else {
                file.sync_all()
            }
            .context(|| self.what(ino, true, "fsync"))?;
        }
        self.core().sync_catalog()
    }

    pub fn fallocate(&self, ino: u64, mode: i32, offset: u64, length: u64) -> Result<(), FsError> {
        let file = self.writing(ino)?;
        let r = self
            .core()
            .grow_for_fallocate(ino, &file, mode, offset, length)
            .and_then(|()| {
                crate::sys::fallocate(&file, mode, offset, length)
                    .context(|| self.what(ino, true, "fallocate"))
            });
        self.written(ino);
        r
    }

    pub fn lseek(&self, ino: u64, offset: i64, whence: i32) -> Result<i64, FsError> {
        let (file, _) = self.held(ino, false)?;
        crate::sys::lseek(&file, offset, whence).map_err(FsError::from)
    }

    /// Copies up to `len` bytes from `ino_in` at `off_in` to `ino_out` at `off_out`.
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        off_in: u64,
        ino_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        let dst = self.writing(ino_out)?;
        // Opened after the target: copying a file onto itself reads the data file just made.
        let src = match self.held(ino_in, false) {
            Ok((src, _)) => src,
            Err(e) => {
                self.written(ino_out);
                return Err(e);
            }
        };
        let len = len.min(u64::from(u32::MAX) & !0xfff);
        let r = self
            .core()
            .grow_for_copy(ino_out, &src, off_in, off_out, len)
            .and_then(|len| {
                crate::sys::copy_file_range(&src, off_in, &dst, off_out, len)
                    .context(|| self.what(ino_out, true, "copy_file_range into"))
            });
        self.written(ino_out);
        u32::try_from(r?).map_err(|_| FsError::eio("copy_file_range copied more than asked"))
    }

    /// Releases what is held of `inodes` (the kernel forgot them, or the daemon changed them).
    pub fn drop_inodes(&self, inodes: &[u64]) {
        if inodes.is_empty() {
            return;
        }
        self.inner.release_where(|i, _| inodes.contains(&i));
    }

    /// Releases everything held (the mount is going away).
    pub fn release_all(&self) {
        self.inner.release_where(|_, _| true);
    }

    /// Inodes held open now, and how many of them as writers.
    pub fn held_count(&self) -> (usize, usize) {
        let t = lock(&self.inner.table);
        (t.len(), t.values().filter(|h| h.write).count())
    }
}

impl std::fmt::Debug for InodeIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (held, writers) = self.held_count();
        write!(f, "InodeIo {{ held: {held}, writers: {writers} }}")
    }
}

impl Drop for InodeIo {
    fn drop(&mut self) {
        self.release_all();
    }
}
