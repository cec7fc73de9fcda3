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

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
}
