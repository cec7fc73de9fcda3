//! Durable JSON records, one a file, each written atomically: the store behind a thread's binding,
//! its workspace record and a project's description. It knows nothing of what a record holds.
//! Also the means of making several durable writes at once ([`at_once`]): their syncs issued
//! together from threads kept for it, so that none waits for the others nor for a thread to start.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub mod hex;

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

    /// Replaces the record of `key` atomically and durably (see [`write_atomic`]), creating its
    /// directory.
    pub fn save<T: Serialize>(&self, key: &str, record: &T) -> Result<(), RecordError> {
        let staged = self.stage(key, record)?;
        staged.sync()?;
        staged.publish()?.sync()
    }

    /// The first half of a durable [`Self::save`]: the record encoded and written beside its file,
    /// not yet synced nor in place (see [`StagedRecord`]). Creates its directory.
    pub fn stage<T: Serialize>(&self, key: &str, record: &T) -> Result<StagedRecord, RecordError> {
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
        let what = What {
            noun: self.noun,
            key: key.to_string(),
        };
        let staged = Staged::write(&path, &bytes).map_err(|e| what.error(e))?;
        Ok(StagedRecord { staged, what })
    }

    /// Removes the record of `key`, if any (best effort: a record left behind is what a crash
    /// at this point would leave).
    pub fn remove(&self, key: &str) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// Moves the record of `key` out of the way, unread (one that cannot be loaded: a power loss
    /// persisted its name but not its bytes): renamed to `<file>.corrupt-<unix seconds>` beside
    /// it, which [`Self::list`] and [`Self::load`] never read. Returns the new path.
    pub fn set_aside(&self, key: &str) -> io::Result<PathBuf> {
        let path = self.path(key);
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".corrupt-{secs}"));
        let to = path.with_file_name(name);
        std::fs::rename(&path, &to)?;
        Ok(to)
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
    let staged = Staged::write(path, bytes)?;
    staged.sync()?;
    staged.publish()?.sync()
}

/// A record's new bytes in a temp file beside it, not yet in place: the first half of
/// [`write_atomic`], for a caller that makes several writes durable at once (their syncs issued
/// together, so that the file system commits them in one journal transaction instead of one
/// after the other). [`Staged::sync`] makes the bytes durable, [`Staged::publish`] renames them
/// over the record, [`Placed::sync`] makes the new name durable. Dropped unpublished, the temp
/// file is removed.
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    file: std::fs::File,
    published: bool,
}

impl Staged {
    /// Writes `bytes` to a private (0600) temp file of its own in `path`'s directory.
    pub fn write(path: &Path, bytes: &[u8]) -> io::Result<Staged> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = path.parent().unwrap_or(Path::new("."));
        let tmp = dir.join(format!(
            ".{}.tmp{}.{}",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(crate::layout::PRIVATE_FILE_MODE)
            .open(&tmp)?;
        if let Err(e) = file.write_all(bytes) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(Staged {
            tmp,
            path: path.to_path_buf(),
            file,
            published: false,
        })
    }

    /// Makes the new bytes durable (fsync of the temp file).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// Puts the new bytes in place (rename over the record): from here on a reader, or the daemon
    /// after SIGKILL, finds them; a power loss may still undo the rename until [`Placed::sync`].
    pub fn publish(mut self) -> io::Result<Placed> {
        std::fs::rename(&self.tmp, &self.path)?;
        self.published = true;
        let dir = self.path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Ok(Placed { dir })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A record renamed into place by [`Staged::publish`].
pub struct Placed {
    dir: PathBuf,
}

impl Placed {
    /// Makes the rename durable (fsync of the record's directory).
    pub fn sync(&self) -> io::Result<()> {
        std::fs::File::open(&self.dir)?.sync_all()
    }
}

/// Which record a staged save is, for its errors.
#[derive(Clone)]
struct What {
    noun: &'static str,
    key: String,
}

impl What {
    fn error(&self, source: io::Error) -> RecordError {
        RecordError::Save {
            noun: self.noun,
            key: self.key.clone(),
            source,
        }
    }
}

/// A record of a [`RecordDir`] staged by [`RecordDir::stage`]: [`Staged`] with errors that name
/// the record. The save is durable once [`Self::sync`], [`Self::publish`] and the returned
/// [`PlacedRecord::sync`] have all succeeded, in that order.
pub struct StagedRecord {
    staged: Staged,
    what: What,
}

impl StagedRecord {
    /// Makes the record's bytes durable (not yet its name).
    pub fn sync(&self) -> Result<(), RecordError> {
        self.staged.sync().map_err(|e| self.what.error(e))
    }

    /// [`Self::sync`] as a job of its own, for [`at_once`] (on a second handle of the file).
    pub fn sync_job(&self) -> Result<SyncJob<RecordError>, RecordError> {
        let file = self
            .staged
            .file
            .try_clone()
            .map_err(|e| self.what.error(e))?;
        let what = self.what.clone();
        Ok(Box::new(move || file.sync_all().map_err(|e| what.error(e))))
    }

    /// Puts the record in place (rename): loads find it from here on.
    pub fn publish(self) -> Result<PlacedRecord, RecordError> {
        let StagedRecord { staged, what } = self;
        match staged.publish() {
            Ok(placed) => Ok(PlacedRecord { placed, what }),
            Err(e) => Err(what.error(e)),
        }
    }
}

/// A record put in place by [`StagedRecord::publish`].
pub struct PlacedRecord {
    placed: Placed,
    what: What,
}

impl PlacedRecord {
    /// Makes the record's name durable (fsync of its directory).
    pub fn sync(&self) -> Result<(), RecordError> {
        self.placed.sync().map_err(|e| self.what.error(e))
    }

    /// [`Self::sync`] as a job of its own, for [`at_once`].
    pub fn sync_job(&self) -> SyncJob<RecordError> {
        let dir = self.placed.dir.clone();
        let what = self.what.clone();
        Box::new(move || {
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| what.error(e))
        })
    }
}

/// A durable write (a sync) to be issued together with others by [`at_once`].
pub type SyncJob<E> = Box<dyn FnOnce() -> Result<(), E> + Send>;

/// Runs every job at once and returns, once all have finished, the first error: the first job
/// on the calling thread, each other on a sync worker. Syncs issued together cost about one of
/// them (the file system and the disk overlap them; a journal commits them together). A job
/// whose worker could not be started, or that panicked, fails with `lost()`.
pub fn at_once<E: Send + 'static>(jobs: Vec<SyncJob<E>>, lost: impl Fn() -> E) -> Result<(), E> {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Ok(());
    };
    let others: Vec<mpsc::Receiver<Result<(), E>>> = jobs
        .map(|job| {
            let (tx, rx) = mpsc::sync_channel(1);
            // Not handed off: the channel closes unsent and the job counts as lost.
            let _ = hand_off(Box::new(move || {
                let r = job();
                Box::new(move || {
                    let _ = tx.send(r);
                })
            }));
            rx
        })
        .collect();
    let mut out = first();
    for rx in others {
        let r = rx.recv().unwrap_or_else(|_| Err(lost()));
        out = out.and(r);
    }
    out
}

/// Runs `job` on a sync worker and returns at once: the background half of durable writes whose
/// caller answers before they are synced (it hands the job the means of telling when they are).
/// Should no worker start, `job` runs on the calling thread: late, never lost.
pub fn in_background(job: Box<dyn FnOnce() + Send>) {
    let slot = std::sync::Arc::new(Mutex::new(Some(job)));
    let theirs = slot.clone();
    let handed = hand_off(Box::new(move || {
        let job = theirs.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(job) = job {
            job();
        }
        Box::new(|| {})
    }));
    if !handed {
        let left = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(job) = left {
            job();
        }
    }
}

/// Work for a sync worker: it runs the job and returns how to hand over its result, which the
/// worker does once it waits for work again (so that a caller who comes straight back finds it).
type Task = Box<dyn FnOnce() -> Reply + Send>;
type Reply = Box<dyn FnOnce() + Send>;

/// A sync worker waiting for a task.
struct Idle {
    id: u64,
    tx: mpsc::Sender<Task>,
}

/// The sync workers waiting for work, the last one to finish on top. Each runs one task at a
/// time; one is started whenever none waits (so a job never queues behind another), and each
/// ends after [`SYNC_WORKER_IDLE`] without work.
static IDLE: Mutex<Vec<Idle>> = Mutex::new(Vec::new());

/// How long a sync worker waits for work before it ends.
const SYNC_WORKER_IDLE: Duration = Duration::from_secs(60);

/// Runs `task` on a waiting sync worker, or on a new one; false if no thread could be started
/// (the task is dropped unrun: its caller sees its result channel close).
fn hand_off(task: Task) -> bool {
    let waiting = IDLE.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let task = match waiting {
        Some(w) => match w.tx.send(task) {
            Ok(()) => return true,
            Err(mpsc::SendError(task)) => task,
        },
        None => task,
    };
    let spawned = std::thread::Builder::new()
        .name("octofs-sync".into())
        .spawn(move || sync_worker(task));
    match spawned {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("cannot start a sync worker: {e}");
            false
        }
    }
}

fn sync_worker(mut task: Task) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        // A panicking task loses its own result only (its caller reports it); the worker goes on.
        let reply = std::panic::catch_unwind(std::panic::AssertUnwindSafe(task));
        let (tx, rx) = mpsc::channel();
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        IDLE.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Idle { id, tx });
        if let Ok(reply) = reply {
            reply();
        }
        task = match rx.recv_timeout(SYNC_WORKER_IDLE) {
            Ok(t) => t,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let mut idle = IDLE.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = idle.iter().position(|w| w.id == id) {
                    idle.swap_remove(i);
                    return;
                }
                // Taken off the list just now: its task is on the way.
                drop(idle);
                match rx.recv() {
                    Ok(t) => t,
                    Err(_) => return,
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// Catches: an answer before every job has finished (a worker's job still running), or a
    /// worker's error dropped in favour of the caller's own success.
    #[test]
    fn at_once_waits_for_every_job_and_keeps_the_first_error() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let jobs: Vec<SyncJob<&'static str>> = vec![
            Box::new(|| Ok(())),
            Box::new(move || {
                std::thread::sleep(Duration::from_millis(50));
                d.store(true, Ordering::SeqCst);
                Err("second")
            }),
            Box::new(|| Err("third")),
        ];
        assert_eq!(at_once(jobs, || "lost"), Err("second"));
        assert!(
            done.load(Ordering::SeqCst),
            "answered before a job finished"
        );
        let none: Vec<SyncJob<&'static str>> = Vec::new();
        assert_eq!(at_once(none, || "lost"), Ok(()));
    }

    /// Catches: a thread started for every job (what the workers are for), or a worker that
    /// dies with a panicking job (then every later job would start a thread again).
    #[test]
    fn sync_workers_are_reused_and_survive_a_panicking_job() {
        let panicked: Vec<SyncJob<&'static str>> =
            vec![Box::new(|| Ok(())), Box::new(|| panic!("a job panics"))];
        assert_eq!(at_once(panicked, || "lost"), Err("lost"));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..6 {
            let (tx, rx) = mpsc::channel();
            let jobs: Vec<SyncJob<&'static str>> = vec![
                Box::new(|| Ok(())),
                Box::new(move || {
                    let _ = tx.send(std::thread::current().id());
                    Ok(())
                }),
            ];
            assert_eq!(at_once(jobs, || "lost"), Ok(()));
            seen.insert(rx.recv().expect("the job ran"));
        }
        assert!(
            seen.len() < 4,
            "a new thread for most jobs: {} of 6",
            seen.len()
        );
    }
}
