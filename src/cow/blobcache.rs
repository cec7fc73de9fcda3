//! The content-addressed, read-only blob cache shared by every workspace of the host.
//!
//! A blob that is opened is written once to `<state>/blobs/<2 hex>/<38 hex>` (mode 0400, in 0700
//! directories: the cache holds every project's files, so only the daemon may read it) and served
//! from there to every workspace of every mirror: N workspaces reading one file share one copy on disk
//! and one in the page cache. Files appear by rename from `<state>/blobs/tmp/`, so a cache file that
//! exists is complete; one whose size disagrees with the object header (a torn write after a power loss)
//! is replaced.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
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
        self.materialize(store, id, &path)?;
        File::open(&path)
    }

    fn materialize(&self, store: &ObjectStore, id: ObjectId, path: &Path) -> io::Result<()> {
        let data = store.blob(id)?;
        let tmp = self.dir.join("tmp").join(format!(
            "{}.{}.{}",
            id.to_hex(),
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(BLOB_MODE)
                .open(&tmp)?;
            f.write_all(&data)?;
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
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
