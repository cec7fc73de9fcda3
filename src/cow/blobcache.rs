//! The content-addressed, read-only blob cache shared by every workspace of the host.
//!
//! A blob that is opened is written once to `<state>/blobs/<2 hex>/<38 hex>` (mode 0400, in 0700
//! directories: the cache holds every project's files, so only the daemon may read it) and served
//! from there to every workspace of every mirror: N workspaces reading one file share one copy on disk
//! and one in the page cache. Files appear by rename from `<state>/blobs/tmp/`, so a cache file that
//! exists is complete; one whose size disagrees with the object header (a torn write after a power loss)
//! is replaced, and one that vanished (the cache emptied under a live daemon) is written again.
//!
//! Memory stays bounded whatever the blob's size: large blobs stream from the object store, and the
//! cache file is written sparse (blocks of zeros are left as holes), so a sparse file in a workspace
//! stays sparse through a snapshot and back.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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
}

#[derive(Debug)]
pub struct BlobCache {
    dir: PathBuf,
    pub stats: CacheStats,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// Read-only for the daemon, nothing for anyone else.
const BLOB_MODE: u32 = 0o400;
/// Blobs up to this size are read from the object store whole; larger ones stream.
const STREAM_ABOVE: u64 = 8 << 20;
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
        })
    }

    pub fn path(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex().to_string();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    /// Opens blob `id` read-only from the cache, materializing it from `store` first if needed.
    pub fn open(&self, store: &ObjectStore, id: ObjectId, size: u64) -> io::Result<File> {
        let path = self.path(&id);
        if let Ok(f) = File::open(&path) {
            if f.metadata()?.len() == size {
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(f);
            }
            tracing::warn!(blob = %id, "cached blob has the wrong size; replacing it");
        }
        self.materialize(store, id, &path, size)?;
        File::open(&path)
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
            if size <= STREAM_ABOVE {
                let data = store.blob(id)?;
                write_sparse(&f, &mut &data[..], size, id)?;
            } else {
                let mut stream = store.blob_stream(id)?;
                write_sparse(&f, &mut stream, size, id)?;
                stream.finish()?;
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
