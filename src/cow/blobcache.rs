//! The content-addressed, read-only blob cache shared by every workspace of the host.
//!
//! A blob that is opened is written once to `<state>/blobs/<2 hex>/<38 hex>` (mode 0400, in 0700
//! directories: the cache holds every project's files, so only the daemon may read it) and served
//! from there to every workspace of every mirror: N workspaces reading one file share one copy on disk
//! and one in the page cache. Files appear by rename from `<state>/blobs/tmp/`, so a cache file that
//! exists is complete; one whose size disagrees with the object header (a torn write after a power loss)
//! is replaced, and one that vanished (the cache emptied under a live daemon) is written again.
//!
//! Memory stays bounded whatever the blob's size: blobs above [`STREAM_ABOVE`] stream from the object
//! store (`git cat-file`) in chunks of [`CHUNK`], smaller ones are read whole through gix; either way
//! the content goes to a temp file in `tmp/` and is renamed into place. The cache file is written
//! sparse (blocks of zeros are left as holes), so a sparse file in a workspace stays sparse through a
//! snapshot and back. What is written is hashed as it goes and must hash to the blob's id (a corrupt
//! object store or a short stream never becomes a cache file). Concurrent opens of the same missing
//! blob fill it once: the others wait for that fill and open its result.
//!
//! [`ReadAhead`] is the daemon's small pool that warms content files in the page cache ahead of a
//! mount's reads (`fs::readahead` decides which): bounded in threads, queued files and bytes, it
//! never fills the cache (a missing file is skipped) and never makes a request wait.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gix::ObjectId;

use crate::git::objects::ObjectStore;

/// Counters, readable by `status` and by tests proving what was (not) read.
#[derive(Debug, Default)]
pub struct CacheStats {
    /// Blobs written into the cache (content read from the object store).
    pub materialized: AtomicU64,
    pub materialized_bytes: AtomicU64,
    /// Opens served from a cache file that already existed.
    pub hits: AtomicU64,
    /// Fills that streamed from the object store (blobs above the streaming threshold).
    pub streamed: AtomicU64,
    /// Opens that waited for another open's fill of the same blob and used its result.
    pub joined: AtomicU64,
}

#[derive(Debug)]
pub struct BlobCache {
    dir: PathBuf,
    pub stats: CacheStats,
    /// Warms content files ahead of the mounts' reads.
    pub ahead: Arc<ReadAhead>,
    /// Blobs being filled: a fill holds its blob's mutex, and other opens of that blob wait on it.
    filling: Mutex<HashMap<ObjectId, Arc<Mutex<()>>>>,
    /// Blobs larger than this stream from the object store ([`STREAM_ABOVE`]; lower in tests).
    stream_above: u64,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Read-only for the daemon, nothing for anyone else.
const BLOB_MODE: u32 = 0o400;
/// Blobs up to this size are read from the object store whole; larger ones stream.
pub const STREAM_ABOVE: u64 = 1 << 20;
/// Blocks of this size that hold only zeros are left as holes in the cache file.
const HOLE_BLOCK: usize = 64 << 10;
/// How much of a streamed blob is held at once.
const CHUNK: usize = 1 << 20;

impl BlobCache {
    pub fn new(dir: &Path) -> io::Result<BlobCache> {
        crate::layout::create_private_dir(&dir.join("tmp"))?;
        Ok(BlobCache {
            dir: dir.to_path_buf(),
            stats: CacheStats::default(),
            filling: Mutex::new(HashMap::new()),
            stream_above: STREAM_ABOVE,
            ahead: ReadAhead::new(AHEAD_THREADS),
        })
    }

    pub fn path(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex().to_string();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    /// Opens blob `id` read-only from the cache, materializing it from `store` first if needed.
    pub fn open(&self, store: &ObjectStore, id: ObjectId, size: u64) -> io::Result<File> {
        let path = self.path(&id);
        if let Some(f) = cached(&path, size, id)? {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(f);
        }
        let slot = self
            .filling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id)
            .or_default()
            .clone();
        let result = (|| {
            let _filling = slot.lock().unwrap_or_else(|p| p.into_inner());
            // Filled by the open this one waited for.
            if let Some(f) = cached(&path, size, id)? {
                self.stats.joined.fetch_add(1, Ordering::Relaxed);
                return Ok(f);
            }
            self.materialize(store, id, &path, size)?;
            File::open(&path)
        })();
        let mut filling = self.filling.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and this one: nobody else waits for this blob.
        if Arc::strong_count(&slot) == 2 {
            filling.remove(&id);
        }
        result
    }

    fn materialize(
        &self,
        store: &ObjectStore,
        id: ObjectId,
        path: &Path,
        size: u64,
    ) -> io::Result<()> {
        let tmp = self.dir.join("tmp").join(format!(
            "{}.{}.{}",
            id.to_hex(),
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let create = || {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(BLOB_MODE)
                .open(&tmp)
        };
        let f = match create() {
            // The cache was emptied under the daemon (its `tmp/` with it): make it again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(self.dir.join("tmp"))?;
                create()?
            }
            r => r?,
        };
        let result = (|| {
            if size <= self.stream_above {
                let data = store.blob(id)?;
                let mut from = Verify::new(&data[..], id, size);
                write_sparse(&f, &mut from, size, id)?;
                from.check()?;
            } else {
                self.stats.streamed.fetch_add(1, Ordering::Relaxed);
                let mut stream = Verify::new(store.blob_stream(id)?, id, size);
                write_sparse(&f, &mut stream, size, id)?;
                stream.check()?;
                stream.inner.finish()?;
            }
            f.set_permissions(std::fs::Permissions::from_mode(BLOB_MODE))?;
            if let Some(parent) = path.parent() {
                crate::layout::create_private_dir(parent)?;
            }
            std::fs::rename(&tmp, path)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result?;
        self.stats.materialized.fetch_add(1, Ordering::Relaxed);
        self.stats
            .materialized_bytes
            .fetch_add(size, Ordering::Relaxed);
        Ok(())
    }
}

/// Threads of the read-ahead pool at most (each spends its time waiting for an inode read).
pub const AHEAD_THREADS: usize = 4;
/// Files queued for read-ahead at most; past it a request to read ahead is refused.
pub const AHEAD_JOBS: usize = 1024;
/// Bytes queued for read-ahead at most.
pub const AHEAD_BYTES: u64 = 64 << 20;
/// A pool thread with nothing to do for this long ends.
pub const AHEAD_IDLE: Duration = Duration::from_secs(1);
/// What was read ahead for a mount that keeps its own page cache (no-open) is dropped from the
/// daemon's page cache this long after, read or not (the mount's READ drops what it reads at once).
pub const AHEAD_DROP_AFTER: Duration = Duration::from_secs(2);
/// Files waiting for that drop at most (past it the oldest is dropped at once).
const AHEAD_DROPS: usize = 8192;

/// One mount's claim on the read-ahead pool: what it queued is skipped once it stopped (unmount).
#[derive(Debug, Default)]
pub struct AheadOwner {
    stopped: AtomicBool,
}

impl AheadOwner {
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

/// A file to warm.
#[derive(Debug)]
pub struct AheadJob {
    pub path: PathBuf,
    pub size: u64,
    pub owner: Arc<AheadOwner>,
    /// Drop it from the page cache again after [`AHEAD_DROP_AFTER`] (the mount keeps its own copy).
    pub drop_later: bool,
}

/// Counters of the read-ahead pool (tests, `stats`).
#[derive(Debug, Default)]
pub struct AheadStats {
    pub queued: AtomicU64,
    /// Files whose read was started.
    pub warmed: AtomicU64,
    /// Jobs skipped: their mount stopped, or the file is not in the cache.
    pub skipped: AtomicU64,
    /// Requests refused because the queue was full.
    pub refused: AtomicU64,
    /// Files dropped from the page cache after [`AHEAD_DROP_AFTER`].
    pub dropped: AtomicU64,
}

#[derive(Debug, Default)]
struct AheadState {
    jobs: VecDeque<AheadJob>,
    bytes: u64,
    /// Threads running, and how many of them wait for work.
    threads: usize,
    waiting: usize,
    drops: VecDeque<(Instant, PathBuf)>,
}

/// The daemon's read-ahead pool: up to a few threads that open content files and ask the kernel to
/// read them (`POSIX_FADV_WILLNEED`, which does not wait for the disk), so that a reader finds them
/// in the page cache. Threads start when work is queued and end when idle.
#[derive(Debug)]
pub struct ReadAhead {
    state: Mutex<AheadState>,
    work: Condvar,
    max_threads: usize,
    pub stats: AheadStats,
}

fn lock_ahead(m: &Mutex<AheadState>) -> MutexGuard<'_, AheadState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ReadAhead {
    pub fn new(max_threads: usize) -> Arc<ReadAhead> {
        Arc::new(ReadAhead {
            state: Mutex::new(AheadState::default()),
            work: Condvar::new(),
            max_threads,
            stats: AheadStats::default(),
        })
    }

    /// Queues `jobs` (never waits for I/O: the queue's lock is held only to push); what does not
    /// fit the bounds is refused. Returns how many were queued.
    pub fn queue(self: &Arc<Self>, jobs: impl IntoIterator<Item = AheadJob>) -> usize {
        let mut n = 0;
        let start = {
            let mut st = lock_ahead(&self.state);
            for job in jobs {
                if st.jobs.len() >= AHEAD_JOBS || st.bytes + job.size > AHEAD_BYTES {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                st.bytes += job.size;
                st.jobs.push_back(job);
                n += 1;
            }
            let start =
                n > 0 && st.waiting < n.min(self.max_threads) && st.threads < self.max_threads;
            if start {
                st.threads += 1;
            }
            start
        };
        self.stats.queued.fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            self.work.notify_all();
        }
        if start {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("octofs-readahead".into())
                .spawn(move || me.run());
            if let Err(e) = spawned {
                tracing::warn!("cannot start a read-ahead thread: {e}");
                lock_ahead(&self.state).threads -= 1;
            }
        }
        n
    }

    /// Threads running now, files queued now.
    pub fn load(&self) -> (usize, usize) {
        let st = lock_ahead(&self.state);
        (st.threads, st.jobs.len())
    }

    fn run(self: Arc<Self>) {
        let mut idle_since = Instant::now();
        loop {
            let (job, due) = {
                let mut st = lock_ahead(&self.state);
                loop {
                    let now = Instant::now();
                    let mut due = Vec::new();
                    while st.drops.front().is_some_and(|(t, _)| *t <= now) {
                        if let Some((_, p)) = st.drops.pop_front() {
                            due.push(p);
                        }
                    }
                    let job = st.jobs.pop_front();
                    if let Some(j) = &job {
                        st.bytes = st.bytes.saturating_sub(j.size);
                    }
                    if job.is_some() || !due.is_empty() {
                        break (job, due);
                    }
                    if st.drops.is_empty() && now.duration_since(idle_since) >= AHEAD_IDLE {
                        st.threads -= 1;
                        return;
                    }
                    let wait = st
                        .drops
                        .front()
                        .map_or(AHEAD_IDLE, |(t, _)| t.saturating_duration_since(now))
                        .min(AHEAD_IDLE);
                    st.waiting += 1;
                    st = match self.work.wait_timeout(st, wait) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                    st.waiting -= 1;
                }
            };
            for path in due {
                self.drop_pages(&path);
            }
            if let Some(job) = job {
                self.warm(job);
            }
            idle_since = Instant::now();
        }
    }

    fn warm(&self, job: AheadJob) {
        if job.owner.stopped() {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Ok(f) = open_source(&job.path) else {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if let Err(e) = crate::sys::fadvise_willneed(&f, 0, 0) {
            tracing::debug!("read-ahead of {}: {e}", job.path.display());
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.stats.warmed.fetch_add(1, Ordering::Relaxed);
        if job.drop_later {
            let mut st = lock_ahead(&self.state);
            st.drops
                .push_back((Instant::now() + AHEAD_DROP_AFTER, job.path));
            let over = if st.drops.len() > AHEAD_DROPS {
                st.drops.pop_front()
            } else {
                None
            };
            drop(st);
            if let Some((_, p)) = over {
                self.drop_pages(&p);
            }
        }
    }

    fn drop_pages(&self, path: &Path) {
        if let Ok(f) = open_source(path)
            && crate::sys::fadvise_dontneed(&f, 0, 0).is_ok()
        {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Opens a file the daemon serves base content from — a blob-cache file or a dependency layer's
/// shared file — for reading, as root and without a caller: a symbolic link at `path` is not
/// followed, a FIFO or device there cannot block the opener (`O_NOFOLLOW | O_NONBLOCK`, then
/// `O_NONBLOCK` cleared), and anything but a regular file is refused (`EINVAL`).
pub fn open_source(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    crate::sys::clear_nonblock(&f)?;
    Ok(f)
}

/// The cache file of `id` at `path`, when it exists with the right size.
fn cached(path: &Path, size: u64, id: ObjectId) -> io::Result<Option<File>> {
    let Ok(f) = File::open(path) else {
        return Ok(None);
    };
    if f.metadata()?.len() == size {
        return Ok(Some(f));
    }
    tracing::warn!(blob = %id, "cached blob has the wrong size; replacing it");
    Ok(None)
}

/// A reader that hashes what passes through it as git hashes a blob, and at its end (or on
/// [`Verify::check`]) fails unless that is the blob's id.
struct Verify<R> {
    inner: R,
    hasher: Option<gix::hash::Hasher>,
    id: ObjectId,
}

impl<R: Read> Verify<R> {
    fn new(inner: R, id: ObjectId, size: u64) -> Verify<R> {
        let mut hasher = gix::hash::hasher(id.kind());
        hasher.update(format!("blob {size}\0").as_bytes());
        Verify {
            inner,
            hasher: Some(hasher),
            id,
        }
    }

    /// Fails unless everything read so far hashes to the blob's id (once; later calls pass).
    fn check(&mut self) -> io::Result<()> {
        let Some(h) = self.hasher.take() else {
            return Ok(());
        };
        let got = h
            .try_finalize()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        if got != self.id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "blob {} read from the object store hashes to {got}",
                    self.id
                ),
            ));
        }
        Ok(())
    }
}

impl<R: Read> Read for Verify<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 {
            self.check()?;
        } else if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// Writes the `size` bytes of `from` into `f`, leaving blocks of zeros as holes, in bounded memory.
fn write_sparse(f: &File, from: &mut impl Read, size: u64, id: ObjectId) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK.min(usize::try_from(size).unwrap_or(CHUNK)).max(1)];
    let mut off = 0u64;
    loop {
        let mut n = 0;
        while n < buf.len() {
            match from.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(r) => n += r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        for (i, block) in buf[..n].chunks(HOLE_BLOCK).enumerate() {
            if !is_zero(block) {
                f.write_all_at(block, off + (i * HOLE_BLOCK) as u64)?;
            }
        }
        off += n as u64;
        if n < buf.len() || off > size {
            break;
        }
    }
    if off != size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("blob {id} has {off} bytes, its header says {size}"),
        ));
    }
    f.set_len(size)
}

fn is_zero(block: &[u8]) -> bool {
    // Sixteen bytes at a time: the cache writes gigabytes through here.
    let words = block.chunks_exact(16);
    let rest = words.remainder();
    words
        .map(|w| <[u8; 16]>::try_from(w).map_or(1, u128::from_ne_bytes))
        .all(|w| w == 0)
        && rest.iter().all(|b| *b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn git(dir: &Path) -> Command {
        let mut c = Command::new("git");
        c.env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .arg("--git-dir")
            .arg(dir);
        c
    }

    /// A bare repository holding `blobs` as loose objects, and their ids.
    fn store_with(dir: &Path, blobs: &[Vec<u8>]) -> (ObjectStore, Vec<ObjectId>) {
        let repo = dir.join("repo.git");
        assert!(
            git(&repo)
                .args(["init", "-q", "--bare"])
                .status()
                .unwrap()
                .success()
        );
        let ids = blobs
            .iter()
            .map(|b| {
                let mut child = git(&repo)
                    .args(["hash-object", "-w", "--stdin"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                use std::io::Write;
                child.stdin.take().unwrap().write_all(b).unwrap();
                let out = child.wait_with_output().unwrap();
                ObjectId::from_hex(String::from_utf8(out.stdout).unwrap().trim().as_bytes())
                    .unwrap()
            })
            .collect();
        (ObjectStore::open(&repo).unwrap(), ids)
    }

    fn cache(dir: &Path, stream_above: u64) -> BlobCache {
        let mut c = BlobCache::new(&dir.join("blobs")).unwrap();
        c.stream_above = stream_above;
        c
    }

    fn read(mut f: File) -> Vec<u8> {
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    /// Content that is not all zeros, with a hole-sized run of zeros in the middle.
    fn content(len: usize, seed: u8) -> Vec<u8> {
        let mut v: Vec<u8> = (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect();
        if len > 3 * HOLE_BLOCK {
            v[HOLE_BLOCK..2 * HOLE_BLOCK].fill(0);
        }
        v
    }

    #[test]
    fn small_blobs_are_read_whole_large_ones_stream_and_both_land_intact() {
        let d = tempfile::tempdir().unwrap();
        let small = content(5000, 1);
        let large = content(3 * HOLE_BLOCK + 777, 2);
        let (store, ids) = store_with(d.path(), &[small.clone(), large.clone()]);
        let c = cache(d.path(), 10_000);
        assert_eq!(read(c.open(&store, ids[0], 5000).unwrap()), small);
        assert_eq!(c.stats.streamed.load(Ordering::Relaxed), 0);
        let len = large.len() as u64;
        assert_eq!(read(c.open(&store, ids[1], len).unwrap()), large);
        assert_eq!(c.stats.streamed.load(Ordering::Relaxed), 1);
        assert_eq!(c.stats.materialized.load(Ordering::Relaxed), 2);
        // Read-only, and served from the cache from now on.
        let m = std::fs::metadata(c.path(&ids[1])).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, BLOB_MODE);
        assert_eq!(read(c.open(&store, ids[1], len).unwrap()), large);
        assert_eq!(c.stats.hits.load(Ordering::Relaxed), 1);
        assert_eq!(
            std::fs::read_dir(d.path().join("blobs/tmp"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn content_that_does_not_hash_to_the_id_never_becomes_a_cache_file() {
        let d = tempfile::tempdir().unwrap();
        let real = content(4 * HOLE_BLOCK, 3);
        let other = content(4 * HOLE_BLOCK, 4);
        let (store, ids) = store_with(d.path(), &[real, other.clone()]);
        // The loose object of `ids[1]` replaced by that of `ids[0]`: a corrupt object store whose
        // object still has the right size.
        let loose = |id: &ObjectId| {
            let hex = id.to_hex().to_string();
            d.path()
                .join("repo.git/objects")
                .join(&hex[..2])
                .join(&hex[2..])
        };
        std::fs::remove_file(loose(&ids[1])).unwrap();
        std::fs::copy(loose(&ids[0]), loose(&ids[1])).unwrap();
        let size = other.len() as u64;
        for stream_above in [u64::MAX, 1000] {
            let c = cache(d.path(), stream_above);
            let e = c.open(&store, ids[1], size).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(!c.path(&ids[1]).exists());
            assert_eq!(
                std::fs::read_dir(d.path().join("blobs/tmp"))
                    .unwrap()
                    .count(),
                0
            );
        }
    }

    #[test]
    fn concurrent_opens_of_a_missing_blob_fill_it_once() {
        let d = tempfile::tempdir().unwrap();
        let large = content(16 * HOLE_BLOCK, 5);
        let (store, ids) = store_with(d.path(), std::slice::from_ref(&large));
        let c = cache(d.path(), 1000);
        let len = large.len() as u64;
        let barrier = std::sync::Barrier::new(6);
        std::thread::scope(|s| {
            for _ in 0..6 {
                s.spawn(|| {
                    barrier.wait();
                    assert_eq!(read(c.open(&store, ids[0], len).unwrap()), large);
                });
            }
        });
        assert_eq!(c.stats.materialized.load(Ordering::Relaxed), 1);
        assert_eq!(
            c.stats.joined.load(Ordering::Relaxed) + c.stats.hits.load(Ordering::Relaxed),
            5
        );
        assert!(c.filling.lock().unwrap().is_empty());
    }

    /// Bytes of `path` in the page cache (`fincore`).
    fn resident(path: &Path) -> u64 {
        let out = Command::new("fincore")
            .args(["--bytes", "--noheadings", "--output", "RES"])
            .arg(path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// A file of `len` bytes on disk, none of it in the page cache.
    fn cold_file(dir: &Path, name: &str, len: usize) -> PathBuf {
        let p = dir.join(name);
        let f = File::create(&p).unwrap();
        f.write_all_at(&content(len, 9), 0).unwrap();
        f.sync_all().unwrap();
        crate::sys::fadvise_dontneed(&f, 0, 0).unwrap();
        assert_eq!(resident(&p), 0);
        p
    }

    fn job(path: &Path, size: u64, owner: &Arc<AheadOwner>, drop_later: bool) -> AheadJob {
        AheadJob {
            path: path.to_path_buf(),
            size,
            owner: owner.clone(),
            drop_later,
        }
    }

    fn eventually(what: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if what() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn count(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[test]
    fn the_read_ahead_queue_is_bounded_in_files_and_bytes() {
        let owner = Arc::new(AheadOwner::default());
        // No thread may start: nothing leaves the queue.
        let pool = ReadAhead::new(0);
        let n = pool.queue(
            (0..AHEAD_JOBS + 10)
                .map(|i| job(Path::new(&format!("/nonexistent/{i}")), 1, &owner, false)),
        );
        assert_eq!(n, AHEAD_JOBS);
        assert_eq!(count(&pool.stats.refused), 10);
        assert_eq!(pool.load(), (0, AHEAD_JOBS));
        let pool = ReadAhead::new(0);
        let n = pool
            .queue((0..3).map(|_| job(Path::new("/nonexistent"), AHEAD_BYTES / 2, &owner, false)));
        assert_eq!(n, 2);
        assert_eq!(count(&pool.stats.refused), 1);
    }

    #[test]
    fn read_ahead_warms_a_file_skips_stopped_mounts_and_missing_files_and_ends_its_threads() {
        let d = tempfile::tempdir().unwrap();
        let a = cold_file(d.path(), "a", 200_000);
        let b = cold_file(d.path(), "b", 200_000);
        let owner = Arc::new(AheadOwner::default());
        let gone = Arc::new(AheadOwner::default());
        gone.stop();
        let pool = ReadAhead::new(2);
        let n = pool.queue([
            job(&a, 200_000, &owner, false),
            job(&b, 200_000, &gone, false),
            job(&d.path().join("missing"), 1, &owner, false),
        ]);
        assert_eq!(n, 3);
        assert!(pool.load().0 <= 2);
        assert!(eventually(|| count(&pool.stats.warmed)
            + count(&pool.stats.skipped)
            == 3));
        assert_eq!(count(&pool.stats.warmed), 1);
        assert!(eventually(|| resident(&a) >= 200_000), "{}", resident(&a));
        assert_eq!(resident(&b), 0);
        // Idle threads end.
        assert!(eventually(|| pool.load().0 == 0));
        assert_eq!(count(&pool.stats.dropped), 0);
    }

    #[test]
    fn what_is_read_ahead_for_a_mount_with_its_own_page_cache_is_dropped_again() {
        let d = tempfile::tempdir().unwrap();
        let a = cold_file(d.path(), "a", 100_000);
        let owner = Arc::new(AheadOwner::default());
        let pool = ReadAhead::new(1);
        let t0 = Instant::now();
        pool.queue([job(&a, 100_000, &owner, true)]);
        assert!(eventually(|| count(&pool.stats.dropped) == 1));
        assert!(t0.elapsed() >= AHEAD_DROP_AFTER);
        assert_eq!(count(&pool.stats.warmed), 1);
        assert_eq!(resident(&a), 0);
        assert!(eventually(|| pool.load().0 == 0));
    }

    #[test]
    fn a_source_file_is_opened_only_when_it_is_a_regular_file_and_never_blocks() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, b"bytes").unwrap();
        let f = open_source(&file).unwrap();
        let mut got = String::new();
        std::io::Read::read_to_string(&mut &f, &mut got).unwrap();
        assert_eq!(got, "bytes");
        // O_NONBLOCK is not left on the descriptor that passthrough and reads use.
        let flags = std::fs::read_to_string(format!(
            "/proc/self/fdinfo/{}",
            std::os::fd::AsRawFd::as_raw_fd(&f)
        ))
        .unwrap();
        let flags = flags
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|v| i32::from_str_radix(v.trim(), 8).unwrap())
            .unwrap();
        assert_eq!(flags & libc::O_NONBLOCK, 0, "flags {flags:o}");

        let link = d.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = open_source(&link).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");

        // A FIFO with no writer would block a plain open for reading forever.
        let fifo = d.path().join("fifo");
        let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(st.success());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(open_source(&fifo).map(|_| ()));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("opening a FIFO blocked");
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);

        let dir = d.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        assert!(open_source(&dir).is_err());
    }
}
