//! The data files of one workspace's upper layer: `<upper>/data/<inode as 16 hex digits>`.
//!
//! A data file gets its final name before it is filled, and is filled before any catalog record
//! points at it: until that record is appended, nothing refers to the file, so a crash half-way
//! leaves an orphan, never a record pointing at a partial file. In the daemon the file itself usually
//! comes from its pool, `<state>/pool/`: empty files a background thread made ahead of time
//! ([`Pool`]), so that the request path renames one into place instead of allocating an inode (on a
//! journal-less ext4 that has freed many inodes lately, an allocation scans the recently freed ones:
//! 150–300 µs measured, against 6–19 µs for the rename); with the pool empty it creates the file
//! directly. The data file of a deleted file goes back to the pool, emptied, when nothing else
//! holds it open ([`Upper::remove`]). Pool files hold nothing, nothing refers to them and they live
//! outside every workspace (removing a workspace never races with the thread that fills the pool);
//! what a stop left is removed beside the next daemon's start. Copy-up streams from the blob cache
//! with `copy_file_range`, never holding a file in memory, and copies only the data ranges
//! (`SEEK_DATA`/`SEEK_HOLE`): a sparse file stays sparse.
//!
//! Orphans (data files the catalog does not know after an unclean stop) are removed when the stop is
//! known to have been the daemon's alone — same boot (the kernel still holds everything the daemon
//! wrote) and a catalog that replayed without damage: then an orphan is a create or copy-up that was
//! never acknowledged, or the data of a file whose deletion was. Otherwise (a reboot or power loss
//! may have lost catalog batches, or damage did) they are moved to `<upper>/quarantine/`, never
//! deleted. Leftover `data/.tmp-*` files of older versions are removed.

use std::fs::{File, FileTimes, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};

use super::catalog::Ts;

/// How a note about a damaged catalog batch starts in `quarantine/README`.
const DAMAGE_NOTE: &str = "catalog: ";

/// Copies all of `src` into the empty file `dst`, leaving `src`'s holes as holes (a 5 GiB sparse base
/// file must not become 5 GiB of zeros on disk when one byte of it is written).
pub(crate) fn copy_sparse(src: &File, dst: &mut File) -> io::Result<()> {
    let len = src.metadata()?.len();
    let mut off = 0u64;
    while off < len {
        let at = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let start = match crate::sys::lseek(src, at, libc::SEEK_DATA) {
            Ok(s) => s as u64,
            // Only a hole from here to the end.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            // A file system without SEEK_DATA: everything is data.
            Err(_) => off,
        };
        let end = match crate::sys::lseek(src, start as i64, libc::SEEK_HOLE) {
            Ok(h) => (h as u64).min(len),
            Err(_) => len,
        };
        copy_range(src, dst, start, end)?;
        off = end.max(start + 1);
    }
    dst.set_len(len)
}

/// Copies bytes `at..end` of `src` to the same offsets of `dst`.
fn copy_range(src: &File, dst: &File, mut at: u64, end: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    while at < end {
        match crate::sys::copy_file_range(src, at, dst, at, end - at) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file being copied up shrank",
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                ) =>
            {
                // No copy_file_range between these files: through a bounded buffer.
                let mut buf = vec![0u8; (end - at).min(1 << 20) as usize];
                while at < end {
                    let n = buf.len().min((end - at) as usize);
                    src.read_exact_at(&mut buf[..n], at)?;
                    dst.write_all_at(&buf[..n], at)?;
                    at += n as u64;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Empty files a pool is filled up to.
const POOL_FILES: usize = 64;
/// A pool with fewer files than this is filled up again.
const POOL_LOW: usize = 32;
/// The most files a pool keeps, counting the data files of deleted files given back to it
/// ([`Upper::remove`]): empty files, an inode each and no data block.
const POOL_MAX: usize = 4096;

/// Empty data files made ahead of time in one directory beside the workspaces (the daemon's is
/// `<state>/pool/`, shared by all of them), named by a counter: the request path takes one by name
/// and renames it to its final name. Only names are kept, no descriptors. One daemon-wide thread
/// fills a pool that ran low; a pool is filled only once something took a file from it.
#[derive(Debug)]
pub struct Pool {
    dir: PathBuf,
    names: Mutex<Vec<u64>>,
    next: AtomicU64,
    /// Queued for, or being filled by, the filling thread.
    filling: AtomicBool,
}

impl Pool {
    /// The pool in `dir` (made private if missing), with what an earlier run left there removed:
    /// empty files nothing refers to.
    pub fn open(dir: &Path) -> io::Result<Arc<Pool>> {
        crate::layout::create_private_dir(dir)?;
        let left: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .collect();
        // Up to POOL_MAX of them: removed beside the start (a restart's pause does not wait for
        // them), or here when no thread can be started.
        let remove = move |left: Vec<PathBuf>| {
            for p in left {
                let _ = std::fs::remove_file(p);
            }
        };
        if left.len() <= POOL_LOW {
            remove(left);
        } else if let Err(e) = std::thread::Builder::new()
            .name("octofs-pool-rm".into())
            .spawn({
                let left = left.clone();
                move || remove(left)
            })
        {
            tracing::debug!("pool {}: removing in place: {e}", dir.display());
            remove(left);
        }
        Ok(Arc::new(Pool {
            dir: dir.to_path_buf(),
            names: Mutex::new(Vec::new()),
            next: AtomicU64::new(pool_start()),
            filling: AtomicBool::new(false),
        }))
    }

    fn path(&self, name: u64) -> PathBuf {
        self.dir.join(format!("{name:016x}"))
    }

    /// A pool file's name, or `None` when the pool is empty; asks for a refill when it runs low.
    fn take(self: &Arc<Self>) -> Option<u64> {
        let (name, low) = {
            let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
            let name = names.pop();
            (name, names.len() < POOL_LOW)
        };
        if low && !self.filling.swap(true, Ordering::AcqRel) && !pool_filler(Arc::downgrade(self)) {
            self.filling.store(false, Ordering::Release);
        }
        name
    }

    /// Moves the empty file at `path` into the pool; false (and nothing moved) when the pool is
    /// full or the rename failed.
    fn give_back(&self, path: &Path) -> bool {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.len() >= POOL_MAX {
            return false;
        }
        let name = self.next.fetch_add(1, Ordering::Relaxed);
        match std::fs::rename(path, self.path(name)) {
            Ok(()) => {
                names.push(name);
                true
            }
            Err(e) => {
                tracing::debug!("pool {}: {e}", self.dir.display());
                false
            }
        }
    }

    /// Files ready now.
    fn len(&self) -> usize {
        self.names.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Makes empty files until the pool holds [`POOL_FILES`]; false when the disk refused first.
    fn fill(&self) -> bool {
        while self.len() < POOL_FILES {
            let name = self.next.fetch_add(1, Ordering::Relaxed);
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(self.path(name))
            {
                Ok(_) => self
                    .names
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(name),
                // Made by the daemon that ran before (a restart's handover): another name.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    tracing::debug!("pool {}: {e}", self.dir.display());
                    return false;
                }
            }
        }
        true
    }

    /// Fills the pool for as long as takes keep it low: a take that found it low while a fill
    /// was ending saw it still queued and did not queue it again.
    fn keep_filled(&self) {
        while self.fill() {
            self.filling.store(false, Ordering::Release);
            if self.len() >= POOL_LOW || self.filling.swap(true, Ordering::AcqRel) {
                return;
            }
        }
        self.filling.store(false, Ordering::Release);
    }
}

impl Drop for Pool {
    /// A pool let go leaves no files behind (the daemon's lives as long as the process).
    fn drop(&mut self) {
        let names = std::mem::take(self.names.get_mut().unwrap_or_else(|p| p.into_inner()));
        for name in names {
            let _ = std::fs::remove_file(self.path(name));
        }
    }
}

/// Hands a pool to the daemon-wide filling thread (started on first use); false when the thread
/// cannot be started (the pool stays empty and files are created directly).
fn pool_filler(pool: Weak<Pool>) -> bool {
    static FILLER: OnceLock<Option<Mutex<mpsc::Sender<Weak<Pool>>>>> = OnceLock::new();
    let filler = FILLER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Weak<Pool>>();
        let spawned = std::thread::Builder::new()
            .name("octofs-pool".into())
            .spawn(move || {
                for pool in rx {
                    if let Some(pool) = pool.upgrade() {
                        pool.keep_filled();
                    }
                }
            });
        match spawned {
            Ok(_) => Some(Mutex::new(tx)),
            Err(e) => {
                tracing::warn!("cannot start the data-file pool thread: {e}");
                None
            }
        }
    });
    filler.as_ref().is_some_and(|tx| {
        tx.lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(pool)
            .is_ok()
    })
}

/// Where a pool's names start: unlikely to meet the names of a daemon that ran just before this
/// one (a restart's handover, whose pool files [`Pool::open`] removes while it may still run).
fn pool_start() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs() << 24) ^ u64::from(t.subsec_nanos())
}

/// The daemon's pool ([`use_pool`]): every upper layer opened after it takes its new files there.
static DAEMON_POOL: OnceLock<Arc<Pool>> = OnceLock::new();

/// Makes `dir` the pool of every upper layer this process opens from now on (the daemon, once, at
/// start). Upper layers on another file system fall back to creating files (the rename fails).
pub fn use_pool(dir: &Path) -> io::Result<()> {
    let pool = Pool::open(dir)?;
    let _ = DAEMON_POOL.set(pool);
    Ok(())
}

#[derive(Debug)]
pub struct Upper {
    dir: PathBuf,
    pool: Option<Arc<Pool>>,
    /// The previous run that opened this upper layer did so on this boot of the kernel.
    same_boot: bool,
    /// A damaged catalog batch was noted since this open ([`Upper::note_damage`]).
    damaged: AtomicBool,
    /// This boot, until it is recorded in [`BOOT`] — by the first data file created after the
    /// open, so only after every orphan of an earlier boot was dealt with (the check after an
    /// unclean stop creates nothing before it has); a crash before that leaves the old boot there.
    boot: Option<String>,
    boot_recorded: AtomicBool,
    /// The bytes its data files hold, counted against the owner's quota (docs/overlay.md "Quota").
    usage: super::quota::Usage,
}

/// The file recording the boot the upper layer was last opened on.
const BOOT: &str = "boot";

/// This boot of the kernel (changes with every reboot), when the kernel tells.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

pub fn system_time(t: Ts) -> std::time::SystemTime {
    if t.0 >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::new(t.0 as u64, t.1)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_secs(t.0.unsigned_abs())
            + std::time::Duration::from_nanos(t.1 as u64)
    }
}

impl Upper {
    /// Opens the upper layer in `dir`, taking new files from the daemon's pool if there is one.
    pub fn open(dir: &Path) -> io::Result<Upper> {
        Self::open_with_pool(dir, DAEMON_POOL.get().cloned())
    }

    /// [`Upper::open`] with a pool of the caller's (or none). A pool on another file system than
    /// `dir` is not used: every file taken from it would fail to move and be removed again.
    pub fn open_with_pool(dir: &Path, pool: Option<Arc<Pool>>) -> io::Result<Upper> {
        use std::os::unix::fs::MetadataExt;
        crate::layout::create_private_dir(&dir.join("data"))?;
        let dev = std::fs::metadata(dir.join("data"))?.dev();
        let pool = pool.filter(|p| std::fs::metadata(&p.dir).is_ok_and(|m| m.dev() == dev));
        let boot = boot_id();
        let previous = std::fs::read_to_string(dir.join(BOOT)).ok();
        let same_boot = boot.is_some() && previous.as_deref().map(str::trim) == boot.as_deref();
        // What the data files hold now: each counted at its apparent size, or at what it
        // allocates when that is more (a `fallocate` that kept the size), so that a restart never
        // counts less than was charged before it.
        let usage = super::quota::Usage::default();
        for e in std::fs::read_dir(dir.join("data"))? {
            let e = e?;
            let name = e.file_name();
            if let Some(ino) = name.to_str().and_then(|n| u64::from_str_radix(n, 16).ok())
                && let Ok(m) = e.metadata()
            {
                usage.counted(ino, m.len().max(m.blocks().saturating_mul(512)));
            }
        }
        Ok(Upper {
            dir: dir.to_path_buf(),
            pool,
            same_boot,
            damaged: AtomicBool::new(false),
            boot: if same_boot { None } else { boot },
            boot_recorded: AtomicBool::new(false),
            usage,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn data_path(&self, ino: u64) -> PathBuf {
        self.dir.join("data").join(format!("{ino:016x}"))
    }

    /// Creates the data file of `ino` with the content of `from` (empty when `None`) and the given
    /// times under its final name (a pool file renamed there, or a new file: one directory
    /// operation), and returns it open for reading and writing (a new file's handle uses it: no
    /// second open). Call it before any catalog record points at the file: until then a partial
    /// file is an orphan (see the module doc). On failure the file is removed again.
    pub fn create(
        &self,
        ino: u64,
        from: Option<&mut File>,
        atime: Ts,
        mtime: Ts,
    ) -> io::Result<File> {
        if let Some(b) = &self.boot
            && !self.boot_recorded.load(Ordering::Acquire)
        {
            // Once per open on a new boot; torn by a crash, it reads as another boot: careful.
            std::fs::write(self.dir.join(BOOT), b)?;
            self.boot_recorded.store(true, Ordering::Release);
        }
        // The whole copy is charged before anything is made (a new empty file is refused only
        // when the owner's quota is full): a refused copy-up or create changes nothing.
        let size = match &from {
            Some(src) => src.metadata()?.len(),
            None if self.usage.full() => return Err(io::Error::from_raw_os_error(libc::EDQUOT)),
            None => 0,
        };
        self.usage.grow(ino, size)?;
        let path = self.data_path(ino);
        let result = (|| {
            let mut f = match self.take_pooled(&path) {
                Some(f) => f,
                None => OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&path)?,
            };
            if let Some(src) = from {
                copy_sparse(src, &mut f)?;
            }
            f.set_times(
                FileTimes::new()
                    .set_accessed(system_time(atime))
                    .set_modified(system_time(mtime)),
            )?;
            Ok(f)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&path);
            self.usage.removed(ino);
        }
        result
    }

    /// The bytes of this layer, and their count against the owner's quota.
    pub fn usage(&self) -> &super::quota::Usage {
        &self.usage
    }

    /// A pool file renamed to `path` and opened, or `None` (an empty pool, or a pool file that
    /// could not be moved: the caller creates the file directly).
    fn take_pooled(&self, path: &Path) -> Option<File> {
        let pool = self.pool.as_ref()?;
        let name = pool.take()?;
        let from = pool.path(name);
        if let Err(e) = std::fs::rename(&from, path) {
            tracing::debug!("pool file {}: {e}", from.display());
            let _ = std::fs::remove_file(&from);
            return None;
        }
        // Empty since it was made (nothing writes pool files): no truncation needed.
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::debug!("pool file renamed to {}: {e}", path.display());
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    /// Files ready in this layer's pool now (0 without one).
    pub fn pooled(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.len())
    }

    /// "Now" on the data files' own clock: file times come from the kernel's coarse clock, which can
    /// lag the precise one by a tick, so a write right after a precise "now" may carry an earlier
    /// time. Touching a file here and reading its ctime gives a time no later write can precede.
    pub fn clock(&self) -> io::Result<Ts> {
        // Waits for the next tick of that clock, so that everything written before this call has
        // an earlier time than the answer and everything written after it a time at least as late.
        let first = self.tick()?;
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_micros(500));
            let t = self.tick()?;
            if t > first {
                return Ok(t);
            }
        }
        self.tick()
    }

    /// The current tick of the data files' clock, without waiting for the next one: no later
    /// write carries an earlier time, but writes just before may carry the same.
    pub fn tick(&self) -> io::Result<Ts> {
        use std::os::unix::fs::MetadataExt;
        let p = self.dir.join("clock");
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&p)?;
        let m = std::fs::metadata(&p)?;
        Ok(Ts(m.ctime(), m.ctime_nsec() as u32))
    }

    /// Opens the data file of `ino` read-write.
    pub fn open_data(&self, ino: u64) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.data_path(ino))
    }

    pub fn remove(&self, ino: u64) {
        if self.recycle(ino) {
            self.usage.removed(ino);
            return;
        }
        match std::fs::remove_file(self.data_path(ino)) {
            Ok(()) => self.usage.removed(ino),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.usage.removed(ino),
            Err(e) => tracing::warn!(ino, "cannot remove data file: {e}"),
        }
    }

    /// Gives the data file of a deleted `ino` back to the pool, emptied, instead of removing it:
    /// the next new file takes it, and the file system allocates and frees no inode (on a
    /// journal-less ext4 that has freed many lately, an allocation scans them: 150–300 µs). Only a
    /// file open nowhere else — no other descriptor, no passthrough backing the kernel still
    /// holds, no mapping that outlived its handle (a write lease says so) — and with one link;
    /// false leaves it to be removed.
    fn recycle(&self, ino: u64) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Some(pool) = &self.pool else {
            return false;
        };
        let path = self.data_path(ino);
        let Ok(f) = OpenOptions::new().read(true).write(true).open(&path) else {
            return false;
        };
        crate::sys::open_nowhere_else(&f).is_ok()
            && f.metadata().is_ok_and(|m| m.nlink() == 1)
            && f.set_len(0).is_ok()
            && pool.give_back(&path)
    }

    /// Inode numbers of every data file, and leftover temp files (incomplete copy-ups) removed.
    pub fn data_inodes(&self) -> io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir.join("data"))? {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".tmp-") {
                // A copy-up of an older version that never completed holds only base content:
                // nothing of the user's.
                let _ = std::fs::remove_file(e.path());
            } else if let Ok(ino) = u64::from_str_radix(&name, 16) {
                out.push(ino);
            }
        }
        Ok(out)
    }

    /// Moves the data file of `ino` into `<upper>/quarantine/` and records why.
    pub fn quarantine(&self, ino: u64, why: &str) -> io::Result<PathBuf> {
        let q = self.dir.join("quarantine");
        crate::layout::create_private_dir(&q)?;
        let dest = q.join(format!("{ino:016x}"));
        std::fs::rename(self.data_path(ino), &dest)?;
        use std::io::Write;
        let mut notes = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(q.join("README"))?;
        writeln!(notes, "{ino:016x}: {why}")?;
        Ok(dest)
    }

    /// After an unclean stop, the data file of `ino` has no catalog record: removed when it
    /// provably holds nothing acknowledged (see the module doc; returns `None`), else quarantined
    /// (returns where it went).
    pub fn orphan(&self, ino: u64, why: &str) -> io::Result<Option<PathBuf>> {
        if self.same_boot && !self.damaged.load(Ordering::Relaxed) {
            match std::fs::remove_file(self.data_path(ino)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {
                    self.usage.removed(ino);
                    return Ok(None);
                }
            }
        }
        self.quarantine(ino, why).map(Some)
    }

    /// Records in `quarantine/README` that a damaged catalog batch was skipped. Until the upper
    /// layer is opened again, [`Upper::orphan`] quarantines every orphan: its record may have been
    /// in the damaged batch.
    pub fn note_damage(&self, what: &str) -> io::Result<()> {
        self.damaged.store(true, Ordering::Relaxed);
        let q = self.dir.join("quarantine");
        std::fs::create_dir_all(&q)?;
        use std::io::Write;
        let mut notes = OpenOptions::new()
            .create(true)
            .append(true)
            .open(q.join("README"))?;
        writeln!(notes, "{DAMAGE_NOTE}{what}")
    }

    /// The notes [`Upper::note_damage`] left.
    pub fn damage_notes(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("quarantine").join("README"))
            .map(|t| {
                t.lines()
                    .filter_map(|l| l.strip_prefix(DAMAGE_NOTE))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Files currently in quarantine.
    pub fn quarantined(&self) -> usize {
        std::fs::read_dir(self.dir.join("quarantine"))
            .map(|d| d.flatten().filter(|e| e.file_name() != "README").count())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_writes_the_final_name_directly_and_removes_it_on_failure() {
        let d = tempfile::tempdir().unwrap();
        let u = Upper::open(d.path()).unwrap();
        let src_path = d.path().join("src");
        std::fs::write(&src_path, b"base content").unwrap();
        let mut src = File::open(&src_path).unwrap();
        let made = u.create(7, Some(&mut src), Ts(100, 5), Ts(200, 6)).unwrap();
        assert_eq!(std::fs::read(u.data_path(7)).unwrap(), b"base content");
        let m = std::fs::metadata(u.data_path(7)).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m.mtime(), m.mtime_nsec()), (200, 6));
        // The file returned is the data file, open for reading and writing.
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 4];
        made.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"base");
        made.write_all_at(b"BASE", 0).unwrap();
        assert_eq!(std::fs::read(u.data_path(7)).unwrap(), b"BASE content");
        drop(made);
        let names: Vec<_> = std::fs::read_dir(d.path().join("data"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(format!("{:016x}", 7))]);
        // A source that cannot be read: nothing stays behind.
        let mut bad = OpenOptions::new().write(true).open(&src_path).unwrap();
        assert!(u.create(8, Some(&mut bad), Ts(1, 0), Ts(1, 0)).is_err());
        assert!(!u.data_path(8).exists());
        assert_eq!(u.data_inodes().unwrap(), vec![7]);
    }

    /// An upper layer in `<d>/upper` with a pool of its own in `<d>/pool`.
    fn pooled_upper(d: &Path) -> Upper {
        let pool = Pool::open(&d.join("pool")).unwrap();
        Upper::open_with_pool(&d.join("upper"), Some(pool)).unwrap()
    }

    /// The pool's files, by name, read from its directory.
    fn pool_files(d: &Path) -> Vec<std::ffi::OsString> {
        let mut v: Vec<_> = std::fs::read_dir(d.join("pool"))
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    fn wait_pooled(u: &Upper, n: usize) {
        let t0 = std::time::Instant::now();
        while u.pooled() < n {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "the pool holds {} files after 10 s",
                u.pooled()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn new_data_files_come_from_the_pool_once_a_create_asked_for_it() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let u = pooled_upper(d.path());
        // Nothing is made ahead before anything was taken.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(u.pooled(), 0);
        assert!(pool_files(d.path()).is_empty());
        // The first create makes its file directly and asks for the pool to be filled.
        u.create(1, None, Ts(10, 1), Ts(20, 2)).unwrap();
        wait_pooled(&u, POOL_FILES);
        let before = pool_files(d.path());
        assert_eq!(before.len(), POOL_FILES);
        let inos: std::collections::BTreeSet<u64> = before
            .iter()
            .map(|n| {
                let m = std::fs::metadata(d.path().join("pool").join(n)).unwrap();
                assert_eq!((m.len(), m.mode() & 0o7777), (0, 0o600));
                m.ino()
            })
            .collect();
        // The next one is a pool file renamed to its final name: the same inode, under data/.
        let made = u.create(2, None, Ts(30, 3), Ts(40, 4)).unwrap();
        let m = std::fs::metadata(u.data_path(2)).unwrap();
        assert!(inos.contains(&m.ino()), "data file 2 is not a pool file");
        assert_eq!((m.len(), m.mode() & 0o7777), (0, 0o600));
        assert_eq!((m.mtime(), m.mtime_nsec()), (40, 4));
        assert_eq!((m.atime(), m.atime_nsec()), (30, 3));
        assert_eq!(pool_files(d.path()).len(), POOL_FILES - 1);
        use std::os::unix::fs::FileExt;
        made.write_all_at(b"new", 0).unwrap();
        assert_eq!(std::fs::read(u.data_path(2)).unwrap(), b"new");
        // A copy-up through a pool file holds the source's bytes.
        let src_path = d.path().join("src");
        std::fs::write(&src_path, b"base content").unwrap();
        let mut src = File::open(&src_path).unwrap();
        u.create(3, Some(&mut src), Ts(1, 0), Ts(1, 0)).unwrap();
        assert_eq!(std::fs::read(u.data_path(3)).unwrap(), b"base content");
        assert!(inos.contains(&std::fs::metadata(u.data_path(3)).unwrap().ino()));
        assert_eq!(u.data_inodes().unwrap().len(), 3);
    }

    #[test]
    fn a_deleted_file_goes_back_to_the_pool_emptied_unless_it_is_open_elsewhere() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let d = tempfile::tempdir().unwrap();
        let u = pooled_upper(d.path());
        let pooled = || -> Vec<std::fs::Metadata> {
            let dir = d.path().join("pool");
            let names = pool_files(d.path());
            names
                .iter()
                .filter_map(|n| std::fs::metadata(dir.join(n)).ok())
                .collect()
        };
        let pooled_inos = || -> Vec<u64> { pooled().iter().map(|m| m.ino()).collect() };
        // Open nowhere else once its handle is closed: emptied into the pool, and taken again.
        let f = u.create(1, None, Ts(1, 0), Ts(1, 0)).unwrap();
        f.write_all_at(b"deleted content", 0).unwrap();
        let ino = f.metadata().unwrap().ino();
        drop(f);
        u.remove(1);
        assert!(!u.data_path(1).exists());
        assert!(
            pooled_inos().contains(&ino),
            "the data file was not given back"
        );
        let m = pooled().into_iter().find(|m| m.ino() == ino).unwrap();
        assert_eq!((m.len(), m.mode() & 0o7777, m.nlink()), (0, 0o600, 1));
        // Still open (a handle, a passthrough backing, a mapping): removed, its content intact for
        // whoever holds it.
        let f = u.create(2, None, Ts(1, 0), Ts(1, 0)).unwrap();
        f.write_all_at(b"still open", 0).unwrap();
        let ino = f.metadata().unwrap().ino();
        u.remove(2);
        assert!(!u.data_path(2).exists());
        assert!(
            !pooled_inos().contains(&ino),
            "an open data file went to the pool"
        );
        let mut buf = [0u8; 10];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"still open");
        // Another link to it (not one octofs makes): removed, the other link keeps it.
        let f = u.create(3, None, Ts(1, 0), Ts(1, 0)).unwrap();
        drop(f);
        std::fs::hard_link(u.data_path(3), d.path().join("other")).unwrap();
        u.remove(3);
        assert!(!u.data_path(3).exists());
        assert_eq!(
            std::fs::metadata(d.path().join("other")).unwrap().nlink(),
            1
        );
    }

    #[test]
    fn a_pool_drained_faster_than_it_fills_falls_back_to_creating_files() {
        let d = tempfile::tempdir().unwrap();
        let u = pooled_upper(d.path());
        for ino in 1..=500u64 {
            u.create(ino, None, Ts(1, 0), Ts(1, 0)).unwrap();
        }
        let mut inos = u.data_inodes().unwrap();
        inos.sort();
        assert_eq!(inos, (1..=500).collect::<Vec<_>>());
        // Pool files removed behind its back make creates fall back, not fail. (Where the pool
        // stands after the burst depends on the filling thread's timing: above the refill mark it
        // is not filled up; at least one file is there.)
        wait_pooled(&u, 1);
        for name in pool_files(d.path()) {
            std::fs::remove_file(d.path().join("pool").join(name)).unwrap();
        }
        u.create(501, None, Ts(1, 0), Ts(1, 0)).unwrap();
        assert!(u.data_path(501).exists());
    }

    #[test]
    fn a_pool_on_another_file_system_is_not_used() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let dev = |p: &Path| std::fs::metadata(p).unwrap().dev();
        if dev(d.path()) == dev(shm.path()) {
            return;
        }
        let pool = Pool::open(&shm.path().join("pool")).unwrap();
        let u = Upper::open_with_pool(&d.path().join("upper"), Some(pool.clone())).unwrap();
        u.create(1, None, Ts(1, 0), Ts(1, 0)).unwrap();
        u.create(2, None, Ts(1, 0), Ts(1, 0)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Nothing was asked of the pool: no file made only to be removed again.
        assert_eq!((u.pooled(), pool.len()), (0, 0));
        assert!(pool_files(shm.path()).is_empty());
        assert_eq!(u.data_inodes().unwrap().len(), 2);
    }

    #[test]
    fn two_upper_layers_share_a_pool_and_what_a_stop_left_is_removed_at_the_next_open() {
        let d = tempfile::tempdir().unwrap();
        let pool = Pool::open(&d.path().join("pool")).unwrap();
        let a = Upper::open_with_pool(&d.path().join("a"), Some(pool.clone())).unwrap();
        let b = Upper::open_with_pool(&d.path().join("b"), Some(pool.clone())).unwrap();
        a.create(1, None, Ts(1, 0), Ts(1, 0)).unwrap();
        wait_pooled(&b, POOL_FILES);
        b.create(1, None, Ts(1, 0), Ts(1, 0)).unwrap();
        assert_eq!(a.pooled(), POOL_FILES - 1);
        // Removing a workspace's directory leaves the pool whole: its files live outside.
        drop(a);
        std::fs::remove_dir_all(d.path().join("a")).unwrap();
        assert!(pool_files(d.path()).len() >= POOL_FILES - 1);
        // A stop without dropping (a killed daemon) leaves files; the next open removes them.
        std::mem::forget(pool);
        drop(b);
        let left = pool_files(d.path()).len();
        assert!(left >= POOL_FILES - 1, "{left} pool files");
        let reopened = Pool::open(&d.path().join("pool")).unwrap();
        wait_no_pool_files(d.path());
        // Dropping a pool removes its files.
        let c = Upper::open_with_pool(&d.path().join("c"), Some(reopened)).unwrap();
        c.create(1, None, Ts(1, 0), Ts(1, 0)).unwrap();
        wait_pooled(&c, POOL_FILES);
        drop(c);
        wait_no_pool_files(d.path());
    }

    fn wait_no_pool_files(d: &Path) {
        let t0 = std::time::Instant::now();
        while !pool_files(d).is_empty() {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "pool files left"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn orphans_are_removed_after_a_stop_on_this_boot_and_quarantined_otherwise() {
        if boot_id().is_none() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        // Never opened before: the boot is unknown, so orphans are kept.
        let u = Upper::open(d.path()).unwrap();
        u.create(1, None, Ts(1, 0), Ts(1, 0)).unwrap();
        assert!(u.orphan(1, "test").unwrap().is_some());
        assert_eq!(u.quarantined(), 1);
        // Opened again on the same boot (the daemon was killed): the orphan is an unacknowledged
        // create, removed.
        u.create(2, None, Ts(1, 0), Ts(1, 0)).unwrap();
        let u = Upper::open(d.path()).unwrap();
        assert_eq!(u.orphan(2, "test").unwrap(), None);
        assert!(!u.data_path(2).exists());
        // ... unless a damaged catalog batch may have held its record.
        u.create(3, None, Ts(1, 0), Ts(1, 0)).unwrap();
        let u = Upper::open(d.path()).unwrap();
        u.note_damage("a batch").unwrap();
        assert!(u.orphan(3, "test").unwrap().is_some());
        // Another boot (power loss, reboot): kept.
        u.create(4, None, Ts(1, 0), Ts(1, 0)).unwrap();
        std::fs::write(d.path().join(BOOT), "some-other-boot\n").unwrap();
        let u = Upper::open(d.path()).unwrap();
        assert!(u.orphan(4, "test").unwrap().is_some());
        assert_eq!(u.quarantined(), 3);
    }
}
