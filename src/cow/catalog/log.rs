//! The append side of `catalog.log`: group commit, the disk reserve and fdatasync.
//!
//! Batches are staged (framed, in order) by whoever holds the [`super::Catalog`] — the workspace's
//! metadata lock — and written by a [`Log::flush_to`] that may run outside that lock: the first
//! flusher takes every batch staged so far and writes them with one `write(2)`, the others wait for
//! it and find their batch already written. So concurrent committers share one write, and a batch is
//! in the kernel (it survives SIGKILL of the daemon) when `flush_to` returns for it. `fdatasync` is
//! shared the same way, and skipped when every written byte is already synced.
//!
//! A failed write is cut back off the log. When the failed group held a batch whose change was
//! already applied in memory (staged with [`Log::stage`] and `applied`), the log is poisoned: every
//! later stage fails with the same error, so nothing that depends on the lost batch can be
//! acknowledged; a remount replays what is on disk.
//!
//! Knows nothing of records beyond their framed bytes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Blocks kept allocated ahead of the log's end, and when to top them up. Every workspace pays
/// the reserve in disk (a few hundred workspaces per host: 64 KiB each, not more); a batch bigger
/// than what is left of it is written only after its space is allocated, so a full disk refuses it
/// cleanly instead of losing an acknowledged change.
pub(super) const RESERVE: u64 = 64 << 10;
const RESERVE_LOW: u64 = 16 << 10;

#[derive(Debug)]
pub(super) struct Log {
    file: File,
    inner: Mutex<Inner>,
    /// Signalled when a flush or a sync ends.
    done: Condvar,
    /// `write(2)` calls made (for tests and benchmarks).
    pub(super) writes: AtomicU64,
    /// `fdatasync` calls made.
    pub(super) syncs: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    /// Bytes in the log file (written).
    len: u64,
    /// Framed batches staged after `len`, not yet written.
    staged: Vec<u8>,
    /// Whether a batch in `staged` was applied in memory before its write.
    staged_applied: bool,
    /// Sequence number of the last batch staged, and of the last one written.
    staged_seq: u64,
    written_seq: u64,
    /// A leader is writing (outside this lock).
    flushing: bool,
    /// The log is synced up to here (bytes), in this `epoch`.
    synced_to: u64,
    syncing: bool,
    /// Bumped when the log is truncated (compaction), so a sync that started before does not
    /// count for bytes written after.
    epoch: u64,
    /// Threads waiting on `done`: a flush or sync that ends wakes them only if there are any (a
    /// wake-up is a system call; nearly every write finds no one waiting).
    waiters: usize,
    /// Disk blocks are allocated (beyond the log's size) up to here: a reserve so that metadata
    /// changes — above all deleting files — still succeed when the disk is full.
    reserved_to: u64,
    /// The log lost a batch whose change was applied: nothing more may be committed.
    poisoned: Option<i32>,
}

/// A batch staged with [`Log::stage`]: written once [`Log::flush_to`] returns for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Ticket(u64);

fn poison_error(errno: i32) -> io::Error {
    io::Error::new(
        io::Error::from_raw_os_error(errno).kind(),
        format!(
            "the catalog log lost a batch ({}); the workspace must be remounted",
            io::Error::from_raw_os_error(errno)
        ),
    )
}

impl Log {
    /// The log in `file`, whose first `len` bytes are good (and allocated; a reserve is set up).
    pub(super) fn new(file: File, len: u64) -> Log {
        let log = Log {
            file,
            inner: Mutex::new(Inner {
                len,
                staged: Vec::new(),
                staged_applied: false,
                staged_seq: 0,
                written_seq: 0,
                flushing: false,
                synced_to: len,
                syncing: false,
                epoch: 0,
                reserved_to: len,
                poisoned: None,
                waiters: 0,
            }),
            done: Condvar::new(),
            writes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        };
        let mut g = log.lock();
        log.top_up_reserve(&mut g);
        drop(g);
        log
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, mut g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        g.waiters += 1;
        let mut g = self.done.wait(g).unwrap_or_else(|p| p.into_inner());
        g.waiters -= 1;
        g
    }

    /// Wakes the waiters on `done` after a change made under `g` (read under the lock: a thread
    /// that starts waiting later sees the change first).
    fn wake(&self, g: MutexGuard<'_, Inner>) {
        let any = g.waiters > 0;
        drop(g);
        if any {
            self.done.notify_all();
        }
    }

    /// Stages one framed batch. `applied`: the caller applies its change in memory before the
    /// batch is written (the group-commit path); then the batch must fit in the disk reserve, so
    /// that only an I/O error, never a full disk, can fail its write — `None` when it does not fit
    /// (write it with `applied` false, synchronously, instead).
    pub(super) fn stage(&self, frame: &[u8], applied: bool) -> io::Result<Option<Ticket>> {
        let mut g = self.lock();
        if let Some(errno) = g.poisoned {
            return Err(poison_error(errno));
        }
        let end = g.len + (g.staged.len() + frame.len()) as u64;
        if applied && end > g.reserved_to {
            return Ok(None);
        }
        g.staged.extend_from_slice(frame);
        g.staged_applied |= applied;
        g.staged_seq += 1;
        Ok(Some(Ticket(g.staged_seq)))
    }

    /// Returns once the batch of `t` is written, writing it (with everything staged before and
    /// with it) when no one else is.
    pub(super) fn flush_to(&self, t: Ticket) -> io::Result<()> {
        let mut g = self.lock();
        loop {
            if g.written_seq >= t.0 {
                return Ok(());
            }
            if let Some(errno) = g.poisoned {
                return Err(poison_error(errno));
            }
            if !g.flushing {
                break;
            }
            g = self.wait(g);
        }
        // The leader: one write of everything staged so far.
        let buf = std::mem::take(&mut g.staged);
        let applied = std::mem::replace(&mut g.staged_applied, false);
        let last = g.staged_seq;
        let at = g.len;
        g.flushing = true;
        drop(g);
        self.writes.fetch_add(1, Ordering::Relaxed);
        let r = self.file.write_all_at(&buf, at);
        if r.is_err() {
            // Nothing of the failed group may stay: a later batch must not follow a hole.
            let _ = self.file.set_len(at);
        }
        let mut g = self.lock();
        g.flushing = false;
        let out = match r {
            Ok(()) => {
                g.len = at + buf.len() as u64;
                g.written_seq = last;
                self.top_up_reserve(&mut g);
                Ok(())
            }
            Err(e) => {
                if applied {
                    g.poisoned = Some(e.raw_os_error().unwrap_or(libc::EIO));
                } else {
                    // Only this (unapplied) batch was in the group: it fails alone, as if never
                    // staged. Its number is skipped: no one waits for it any more.
                    g.written_seq = last;
                }
                Err(e)
            }
        };
        self.wake(g);
        out
    }

    /// Writes everything staged (e.g. before compaction or when the catalog is dropped).
    pub(super) fn flush_all(&self) -> io::Result<()> {
        let seq = self.lock().staged_seq;
        self.flush_to(Ticket(seq))
    }

    /// Makes every batch written or staged before this call durable: one `fdatasync` shared by
    /// concurrent callers, none when nothing was written since the last one.
    pub(super) fn sync(&self) -> io::Result<()> {
        self.flush_all()?;
        let mut g = self.lock();
        let (target, epoch) = (g.len, g.epoch);
        loop {
            if g.epoch != epoch || g.synced_to >= target {
                // Synced, or truncated by a compaction (which syncs) since.
                return Ok(());
            }
            if !g.syncing {
                break;
            }
            g = self.wait(g);
        }
        g.syncing = true;
        let upto = g.len;
        drop(g);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        let r = self.file.sync_data();
        let mut g = self.lock();
        g.syncing = false;
        if r.is_ok() && g.epoch == epoch {
            g.synced_to = g.synced_to.max(upto);
        }
        self.wake(g);
        r
    }

    /// Empties the log (after a new snapshot is written): waits for every staged batch to be
    /// written first, then truncates and syncs.
    pub(super) fn truncate(&self) -> io::Result<()> {
        self.flush_all()?;
        let mut g = self.lock();
        while g.flushing || g.syncing || !g.staged.is_empty() {
            g = self.wait(g);
        }
        self.file.set_len(0)?;
        self.file.sync_all()?;
        g.len = 0;
        g.synced_to = 0;
        g.epoch += 1;
        g.reserved_to = 0;
        self.top_up_reserve(&mut g);
        Ok(())
    }

    /// Allocates the next stretch of the log ahead of time (best effort: on a full disk the reserve
    /// that is left is what metadata changes use).
    fn top_up_reserve(&self, g: &mut Inner) {
        if g.reserved_to >= g.len + RESERVE_LOW {
            return;
        }
        if crate::sys::fallocate(&self.file, libc::FALLOC_FL_KEEP_SIZE, g.len, RESERVE).is_ok() {
            g.reserved_to = g.len + RESERVE;
        }
    }

    pub(super) fn len(&self) -> u64 {
        self.lock().len
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        // A staged batch whose waiter never came (it gave up): written now, as it was staged.
        if let Err(e) = self.flush_all() {
            tracing::warn!("catalog log: staged batches could not be written: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn log_in(dir: &std::path::Path) -> (Log, std::path::PathBuf) {
        let p = dir.join("log");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(&p)
            .unwrap();
        (Log::new(f, 0), p)
    }

    #[test]
    fn staged_batches_go_out_in_one_write_and_are_in_the_file_when_flush_returns() {
        let d = tempfile::tempdir().unwrap();
        let (log, p) = log_in(d.path());
        let tickets: Vec<Ticket> = (0..5)
            .map(|i| {
                log.stage(format!("b{i};").as_bytes(), true)
                    .unwrap()
                    .unwrap()
            })
            .collect();
        // Staged only: nothing written yet (the caller has not released its lock).
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        log.flush_to(tickets[2]).unwrap();
        // Read through another descriptor: what a new daemon sees after SIGKILL.
        assert_eq!(std::fs::read(&p).unwrap(), b"b0;b1;b2;b3;b4;");
        for t in &tickets {
            log.flush_to(*t).unwrap();
        }
        assert_eq!(log.writes.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn concurrent_committers_share_writes_and_every_batch_lands_once_in_order() {
        let d = tempfile::tempdir().unwrap();
        let (log, p) = log_in(d.path());
        let log = Arc::new(log);
        // The workspace lock: staging is serialized by it, writing is not.
        let lock = Arc::new(Mutex::new(0u32));
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let (log, lock) = (log.clone(), lock.clone());
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let t = {
                            let mut n = lock.lock().unwrap();
                            *n += 1;
                            log.stage(format!("{k}.{i};").as_bytes(), true)
                                .unwrap()
                                .unwrap()
                        };
                        log.flush_to(t).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = String::from_utf8(std::fs::read(&p).unwrap()).unwrap();
        let items: Vec<&str> = text.split_terminator(';').collect();
        assert_eq!(items.len(), 800);
        for k in 0..4 {
            let mine: Vec<&str> = items
                .iter()
                .copied()
                .filter(|s| s.starts_with(&format!("{k}.")))
                .collect();
            let want: Vec<String> = (0..200).map(|i| format!("{k}.{i}")).collect();
            assert_eq!(mine, want);
        }
        let writes = log.writes.load(Ordering::Relaxed);
        assert!(writes <= 800, "{writes}");
        eprintln!("800 batches from 4 threads: {writes} writes");
    }

    #[test]
    fn sync_is_shared_and_skipped_when_nothing_was_written() {
        let d = tempfile::tempdir().unwrap();
        let (log, _) = log_in(d.path());
        log.sync().unwrap();
        assert_eq!(
            log.syncs.load(Ordering::Relaxed),
            0,
            "an empty log needs none"
        );
        let t = log.stage(b"x;", true).unwrap().unwrap();
        // A sync writes what is staged first.
        log.sync().unwrap();
        assert_eq!(log.writes.load(Ordering::Relaxed), 1);
        log.flush_to(t).unwrap();
        log.sync().unwrap();
        log.sync().unwrap();
        assert_eq!(log.syncs.load(Ordering::Relaxed), 1);
        log.truncate().unwrap();
        let t = log.stage(b"y;", false).unwrap().unwrap();
        log.flush_to(t).unwrap();
        log.sync().unwrap();
        assert_eq!(log.syncs.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_failed_write_of_an_applied_batch_poisons_the_log_and_an_unapplied_one_fails_alone() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        std::fs::write(&p, b"").unwrap();
        // Read-only: every write fails (EBADF), as an I/O error would.
        let log = Log::new(File::open(&p).unwrap(), 0);
        // (No reserve could be allocated on a read-only descriptor: pretend there is one.)
        log.lock().reserved_to = RESERVE;
        let t = log.stage(b"plain;", false).unwrap().unwrap();
        assert!(log.flush_to(t).is_err());
        let t = log.stage(b"applied;", true).unwrap().unwrap();
        assert!(log.flush_to(t).is_err());
        let e = log.stage(b"later;", false).unwrap_err();
        assert!(e.to_string().contains("remounted"), "{e}");
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
    }

    #[test]
    fn an_applied_batch_beyond_the_reserve_is_refused_for_a_synchronous_write() {
        let d = tempfile::tempdir().unwrap();
        let (log, _) = log_in(d.path());
        let big = vec![b'z'; RESERVE as usize + 1];
        assert!(log.stage(&big, true).unwrap().is_none());
        let t = log.stage(&big, false).unwrap().unwrap();
        log.flush_to(t).unwrap();
        assert_eq!(log.len(), RESERVE + 1);
    }
}
