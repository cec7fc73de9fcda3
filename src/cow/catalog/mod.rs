//! The durable catalog of one workspace's upper layer: every inode that differs from the base and every
//! directory entry that differs from the base tree.
//!
//! Storage is `<upper>/catalog.snap` (the whole state at some moment) plus `<upper>/catalog.log` (one
//! frame per committed batch of [`Record`]s since then). Every record is an absolute "set", so replaying
//! any suffix of the log over a newer state changes nothing: compaction may crash at any point.
//!
//! Ordering (see `docs/crash-safety.md`): a batch is appended to the log with one `write` *before* the
//! in-memory state changes and before the request is answered, so a SIGKILL after the answer loses
//! nothing; a batch that fails to append (ENOSPC) is cut off again and the operation fails unapplied. A
//! torn last frame (power loss) is ignored on load. Data files are written before a record points at
//! them, and removed only after the record that pointed at them is gone.
//!
//! Framing (see `docs/crash-safety.md` "Damaged log"): each batch is `RS len sum JSON LF`, with RS the
//! byte 0x1e (which JSON never holds unescaped), so that one damaged frame costs that batch alone: the
//! replay skips it, finds the next RS and goes on, and reports what the damaged batch concerned (a
//! [`Damage`]). Logs of older versions (one bare JSON line per batch) still replay. The snapshot is
//! written as the same frames (records in chunks, see `snapshot_frames`) and replayed the same way,
//! so damage there costs one frame too; an old snapshot (one JSON document) still loads.
//!
//! This module knows nothing about FUSE or git objects beyond their ids as strings.
//!
//! Rooms: [`record`] (the types and their encoding), `frame` (the on-disk framing), `replay` (reading
//! frames back, damage), `snap` (the snapshot), `log` (appending: group commit, the disk reserve,
//! fdatasync); this file ties them into the [`Catalog`] of one workspace.

mod frame;
mod log;
pub mod record;
mod replay;
mod snap;
#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use record::{BaseRef, CatalogState, InodeRecord, InodeTable, Kind, Record, Ts};
pub use replay::Damage;

use frame::frame;
use log::{Log, Ticket};
use replay::{Replayed, replay};
use snap::{load_snapshot, snapshot_frames};

/// The on-disk catalog of one workspace.
pub struct Catalog {
    dir: PathBuf,
    log: Arc<Log>,
    log_batches: u64,
    /// No compaction check (which counts the live records) before the log has this many batches.
    next_check: u64,
    /// Batches found damaged when the log was replayed (they were skipped).
    damage: Vec<Damage>,
}

const SNAP: &str = "catalog.snap";
const LOG: &str = "catalog.log";
const CLEAN: &str = "clean";

/// A batch handed to [`Catalog::append_applied`]: its change may be applied (and its lock released)
/// before it is written; [`Pending::wait`] returns once it is in the kernel, and the request may be
/// answered then.
#[must_use = "a change may only be acknowledged once its batch is written: call wait()"]
#[derive(Debug)]
pub struct Pending {
    log: Arc<Log>,
    ticket: Option<Ticket>,
}

impl Pending {
    /// Writes the batch (together with every other one staged by then, in one `write`) or waits
    /// for the writer that took it.
    pub fn wait(mut self) -> io::Result<()> {
        match self.ticket.take() {
            Some(t) => self.log.flush_to(t),
            None => Ok(()),
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take()
            && let Err(e) = self.log.flush_to(t)
        {
            tracing::warn!("catalog: a batch nobody waited for could not be written: {e}");
        }
    }
}

/// Syncs a catalog's log without holding the catalog (see [`Catalog::syncer`]).
#[derive(Debug, Clone)]
pub struct LogSync(Arc<Log>);

impl LogSync {
    /// Like [`Catalog::sync`].
    pub fn sync(&self) -> io::Result<()> {
        self.0.sync()
    }
}

impl Catalog {
    /// Opens (or creates) the catalog in `dir` and returns it with the replayed state and whether the
    /// previous run stopped cleanly. The clean marker is removed: until [`Catalog::close_clean`], a
    /// stop is unclean.
    pub fn open(dir: &Path) -> io::Result<(Catalog, CatalogState, bool)> {
        crate::layout::create_private_dir(dir)?;
        let snap_path = dir.join(SNAP);
        let (mut state, snap_damage) = load_snapshot(&snap_path)?;
        if !snap_damage.is_empty() {
            quarantine(dir, &snap_path, SNAP, &snap_damage)?;
        }
        let log_path = dir.join(LOG);
        let Replayed {
            good_len,
            batches,
            damage,
        } = match File::open(&log_path) {
            Ok(f) => replay(f, &mut state, LOG)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Replayed::default(),
            Err(e) => return Err(e),
        };
        if !damage.is_empty() {
            quarantine(dir, &log_path, LOG, &damage)?;
        }
        let damage = snap_damage.into_iter().chain(damage).collect();
        use std::os::unix::fs::OpenOptionsExt;
        let log = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            .open(&log_path)?;
        if log.metadata()?.len() != good_len {
            log.set_len(good_len)?;
        }
        let was_clean = dir.join(CLEAN).exists();
        if was_clean {
            std::fs::remove_file(dir.join(CLEAN))?;
            File::open(dir)?.sync_all()?;
        }
        let mut catalog = Catalog {
            dir: dir.to_path_buf(),
            log: Arc::new(Log::new(log, good_len)),
            log_batches: batches,
            next_check: 0,
            damage,
        };
        if !catalog.damage.is_empty() {
            catalog.compact(&state)?;
        }
        Ok((catalog, state, was_clean))
    }

    /// The frames that were found damaged (and skipped) when the snapshot and the log were replayed
    /// at open.
    pub fn damage(&self) -> &[Damage] {
        &self.damage
    }

    /// Appends one batch: it is in the kernel (it survives SIGKILL of the daemon) when this returns.
    /// On failure nothing of it remains in the log and the caller must not apply it. Batches passed
    /// to [`Catalog::append_applied`] before and not yet written go out in the same `write`.
    pub fn append(&mut self, batch: &[Record]) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let bytes = frame(batch)?;
        let Some(t) = self.log.stage(&bytes, false)? else {
            return Err(io::Error::other("catalog: an unapplied batch was refused"));
        };
        self.log.flush_to(t)?;
        self.log_batches += 1;
        Ok(())
    }

    /// Stages one batch for group commit: the caller applies its change now, may release its lock,
    /// and answers the request only after [`Pending::wait`] returned `Ok`. Concurrent committers
    /// then share one `write` of the log. A batch that does not fit in the log's preallocated
    /// reserve (the disk is nearly full) is written here, before returning, exactly as
    /// [`Catalog::append`] (on failure nothing was applied and nothing remains). Once staged, only
    /// an I/O error can fail its write; then the log is poisoned (every later append fails) and
    /// `wait` returns that error.
    pub fn append_applied(&mut self, batch: &[Record]) -> io::Result<Pending> {
        let log = self.log.clone();
        let done = |ticket| Pending { log, ticket };
        if batch.is_empty() {
            return Ok(done(None));
        }
        let bytes = frame(batch)?;
        match self.log.stage(&bytes, true)? {
            Some(t) => {
                self.log_batches += 1;
                Ok(done(Some(t)))
            }
            None => {
                self.append(batch)?;
                Ok(done(None))
            }
        }
    }

    /// Makes every appended batch durable (fsync of a file or directory in the workspace). One
    /// `fdatasync` serves concurrent callers; none is made when nothing was written since the last.
    pub fn sync(&self) -> io::Result<()> {
        self.log.sync()
    }

    /// A handle that syncs this catalog's log (as [`Catalog::sync`]) without holding the catalog,
    /// so that an `fsync` request need not hold the workspace's lock across the disk flush.
    pub fn syncer(&self) -> LogSync {
        LogSync(self.log.clone())
    }

    /// Whether the log has grown enough, relative to the live state, to be worth compacting.
    /// `live_records` (a walk of the inode table) is asked for only once the log is long, and then
    /// again only after the log grew by another eighth: counting on every commit made each commit
    /// of a workspace with a long log cost a walk of its whole table (1.5 ms instead of 13 µs at
    /// 100,000 records); compaction is at most an eighth of the log late.
    pub fn wants_compaction(&mut self, live_records: impl FnOnce() -> usize) -> bool {
        const MIN_BATCHES: u64 = 20_000;
        if self.log_batches <= MIN_BATCHES || self.log_batches < self.next_check {
            return false;
        }
        if self.log_batches as usize > 4 * live_records().max(1) {
            return true;
        }
        self.next_check = self.log_batches + (self.log_batches / 8).max(1);
        false
    }

    /// Writes `state` as the new snapshot and starts an empty log. Crash-safe at every step: the old
    /// snapshot plus the old log, or the new snapshot plus (a replay-idempotent) old log, or the new
    /// snapshot alone. Staged batches are written first: `state` may include them only once they
    /// are in the log.
    pub fn compact(&mut self, state: &CatalogState) -> io::Result<()> {
        self.log.flush_all()?;
        let bytes = snapshot_frames(state)?;
        crate::records::write_atomic(&self.dir.join(SNAP), &bytes)?;
        self.log.truncate()?;
        self.log_batches = 0;
        self.next_check = 0;
        Ok(())
    }

    /// Compacts and leaves the clean-stop marker.
    pub fn close_clean(&mut self, state: &CatalogState) -> io::Result<()> {
        self.compact(state)?;
        crate::records::write_atomic(&self.dir.join(CLEAN), b"clean\n")
    }

    /// Takes back the clean-stop marker of `close_clean`: the catalog is in use again (a daemon
    /// whose handover to another process failed goes on serving).
    pub fn unmark_clean(&self) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(CLEAN)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => File::open(&self.dir)?.sync_all(),
        }
    }

    /// Bytes in the log, and how many `write`s and `fdatasync`s it took (for tests and benches).
    pub fn log_stats(&self) -> (u64, u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.log.len(),
            self.log.writes.load(Relaxed),
            self.log.syncs.load(Relaxed),
        )
    }
}

/// Keeps a copy of the damaged `file` (named `what`) in `quarantine/` for whoever wants to look, and
/// logs the damage. The catalog is compacted right after, so the damage is reported once and new
/// frames never follow it.
fn quarantine(dir: &Path, file: &Path, what: &str, damage: &[Damage]) -> io::Result<()> {
    let q = dir.join("quarantine");
    std::fs::create_dir_all(&q)?;
    std::fs::copy(file, q.join(format!("{what}.damaged-{}", Ts::now().0)))?;
    for d in damage {
        tracing::warn!("catalog {}: {d}", dir.display());
    }
    Ok(())
}
