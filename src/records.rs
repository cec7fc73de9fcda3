//! Durable JSON records, one a file, each written atomically: the store behind a thread's binding,
//! its workspace record and a project's description. It knows nothing of what a record holds.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why a record could not be loaded, saved or listed: one line naming the record and the file.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{key_kind} {key}: corrupt {}: {source}", path.display())]
    Corrupt {
        key_kind: &'static str,
        key: String,
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{key_kind} {key}: cannot read {}: {source}", path.display())]
    Read {
        key_kind: &'static str,
        key: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot encode {noun} {key}: {source}")]
    Encode {
        noun: &'static str,
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot save {noun} {key}: {source}")]
    Save {
        noun: &'static str,
        key: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot list {noun}s: {source}")]
    List {
        noun: &'static str,
        #[source]
        source: io::Error,
    },
}

/// A directory of records, each named by a key (a thread or project name): `<dir>/<key>.json`, or
/// `<dir>/<key>/<file>` when each key has a directory of its own.
pub struct RecordDir {
    dir: PathBuf,
    file: Option<&'static str>,
    /// What a key names (`thread`), for messages.
    key: &'static str,
    /// What a record is (`workspace`), for messages.
    noun: &'static str,
}

impl RecordDir {
    /// Records at `<dir>/<key>.json`.
    pub fn files(dir: PathBuf, key: &'static str, noun: &'static str) -> RecordDir {
        RecordDir {
            dir,
            file: None,
            key,
            noun,
        }
    }

    /// Records at `<dir>/<key>/<file>`.
    pub fn in_dirs(
        dir: PathBuf,
        file: &'static str,
        key: &'static str,
        noun: &'static str,
    ) -> RecordDir {
        RecordDir {
            dir,
            file: Some(file),
            key,
            noun,
        }
    }

    fn path(&self, key: &str) -> PathBuf {
        match self.file {
            None => self.dir.join(format!("{key}.json")),
            Some(file) => self.dir.join(key).join(file),
        }
    }

    /// The record of `key`; `Ok(None)` when there is none.
    pub fn load<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, RecordError> {
        let path = self.path(key);
        let key_kind = self.key;
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| RecordError::Corrupt {
                    key_kind,
                    key: key.to_string(),
                    path,
                    source,
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(RecordError::Read {
                key_kind,
                key: key.to_string(),
                path,
                source,
            }),
        }
    }

    /// Replaces the record of `key` atomically (see [`write_atomic`]), creating its directory.
    pub fn save<T: Serialize>(&self, key: &str, record: &T) -> Result<(), RecordError> {
        self.save_with(key, record, true)
    }

    /// As [`Self::save`], `durable` or not: without it the record replaces the old one atomically
    /// and survives the daemon being killed, but not necessarily a power loss (no fsync).
    pub fn save_with<T: Serialize>(
        &self,
        key: &str,
        record: &T,
        durable: bool,
    ) -> Result<(), RecordError> {
        let path = self.path(key);
        if let Some(dir) = path.parent() {
            crate::layout::create_private_dir(dir).map_err(|source| RecordError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| RecordError::Encode {
            noun: self.noun,
            key: key.to_string(),
            source,
        })?;
        write_replacing(&path, &bytes, durable).map_err(|source| RecordError::Save {
            noun: self.noun,
            key: key.to_string(),
            source,
        })
    }

    /// Removes the record of `key`, if any (best effort: a record left behind is what a crash
    /// at this point would leave).
    pub fn remove(&self, key: &str) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// The records of every key that `keep` accepts, in no particular order.
    pub fn list<T: DeserializeOwned>(
        &self,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Vec<T>, RecordError> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(source) => {
                return Err(RecordError::List {
                    noun: self.noun,
                    source,
                });
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let key = match self.file {
                None => name.strip_suffix(".json"),
                Some(_) => Some(name.as_str()),
            };
            if let Some(key) = key
                && keep(key)
                && let Some(r) = self.load(key)?
            {
                out.push(r);
            }
        }
        Ok(out)
    }
}

/// Writes `bytes` to `path` durably: temp file, fsync, rename, fsync of the directory. The file is
/// private (0600) whatever the umask; two writers of one path (threads of the daemon) each use a
/// temp file of their own, and the last rename wins.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_replacing(path, bytes, true)
}

/// [`write_atomic`], with the two fsyncs only when `durable`.
fn write_replacing(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::layout::PRIVATE_FILE_MODE)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
