//! Read-ahead of one mount's small files, in the order the kernel listed them.
//!
//! A cold read of a workspace pays one synchronous disk read (or two: the blob-cache file's inode,
//! then its data) per file, one after the other, because a reader like `find | xargs cat` or a test
//! runner opens one file at a time. A checkout's files sit next to each other on disk and the
//! kernel's own readahead covers them; the blob cache's files do not. So the mount remembers the
//! regular files it listed (READDIRPLUS), in listing order — the order such readers read them —
//! and when a file is read (its OPEN, or in no-open mode its first READ) the next [`WINDOW`] files
//! of that order (at most [`WINDOW_BYTES`]) are handed to the daemon's read-ahead pool
//! ([`crate::cow::blobcache::ReadAhead`]), which warms their content files in the page cache
//! while the reader is busy with this one. Listing alone reads nothing (a `git status` or `ls -R`
//! costs no content I/O); only reads move the window, and only forward.
//!
//! Bounded: at most [`ORDER_MAX`] files are remembered (16 bytes each; the oldest go first), the
//! order is forgotten after [`FORGET_AFTER`] without a listing or read, and a read looks for its
//! file only near where the last read was. Knows nothing of FUSE or of the core: the adapter
//! (`fuse.rs`) feeds it inode numbers and asks the core for the files behind them.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Files read ahead of the one being read.
pub const WINDOW: usize = 64;
/// Bytes read ahead of the one being read, at most.
pub const WINDOW_BYTES: u64 = 8 << 20;
/// Files larger than this are left to the kernel's own readahead (a reader of a large file reads
/// sequentially, which the kernel sees).
pub const FILE_MAX: u64 = 1 << 20;
/// Listed files remembered at most.
pub const ORDER_MAX: usize = 16 * 1024;
/// A read looks for its file this far after, then before, the last read's (a few µs at most).
const SEARCH: usize = 4096;
/// The order is dropped after this long without a listing or a read.
pub const FORGET_AFTER: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Order {
    /// `(inode, size)` of the listed files, in listing order; `first` is the sequence number of
    /// the front.
    files: VecDeque<(u64, u64)>,
    first: u64,
    /// Sequence number of the last file read (where the next read is looked for).
    cursor: u64,
    /// Files below this sequence number were handed to the pool (or passed).
    queued: u64,
    used: Option<Instant>,
}

/// The listing order of one mount.
#[derive(Debug, Default)]
pub struct ListingOrder {
    order: Mutex<Order>,
}

fn lock(m: &Mutex<Order>) -> MutexGuard<'_, Order> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Order {
    fn touch(&mut self, now: Instant) {
        if self
            .used
            .is_some_and(|t| now.saturating_duration_since(t) >= FORGET_AFTER)
        {
            *self = Order::default();
        }
        self.used = Some(now);
    }

    fn end(&self) -> u64 {
        self.first + self.files.len() as u64
    }
}

impl ListingOrder {
    /// Regular files of `(inode, size)` were listed (in this order): remembered for read-ahead.
    /// Empty and large files are not.
    pub fn listed(&self, files: impl IntoIterator<Item = (u64, u64)>) {
        let mut o = lock(&self.order);
        o.touch(Instant::now());
        for (ino, size) in files {
            if size == 0 || size > FILE_MAX {
                continue;
            }
            o.files.push_back((ino, size));
            if o.files.len() > ORDER_MAX {
                o.files.pop_front();
                o.first += 1;
            }
        }
        if o.files.capacity() > 2 * ORDER_MAX {
            o.files.shrink_to(ORDER_MAX);
        }
    }

    /// File `ino` is being read: the files to read ahead now, `(inode, size)` (none when they were
    /// handed out already, or `ino` is not near the last read in the order).
    pub fn read(&self, ino: u64) -> Vec<(u64, u64)> {
        let mut o = lock(&self.order);
        o.touch(Instant::now());
        // Forward from the cursor first (a reader reads on), then back from it (a reread).
        let cursor = o.cursor.max(o.first);
        let ahead = cursor..(cursor + SEARCH as u64).min(o.end());
        let back = (cursor.saturating_sub(SEARCH as u64).max(o.first)..cursor).rev();
        let found = ahead.chain(back).find(|s| {
            o.files
                .get((s - o.first) as usize)
                .is_some_and(|f| f.0 == ino)
        });
        let Some(seq) = found else {
            return Vec::new();
        };
        o.cursor = seq;
        // A read far behind what was handed out (a second reader, a reread): start again there.
        if seq + 1 + (WINDOW as u64) < o.queued.saturating_sub(WINDOW as u64) {
            o.queued = seq + 1;
        }
        let start = o.queued.max(seq + 1);
        // Keep the window full: hand out more only once half of it has been read.
        if start > seq + 1 + (WINDOW as u64) / 2 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let mut s = start;
        while s < seq + 1 + WINDOW as u64 && s < o.end() {
            let (i, size) = o.files[(s - o.first) as usize];
            if bytes + size > WINDOW_BYTES && !out.is_empty() {
                break;
            }
            bytes += size;
            out.push((i, size));
            s += 1;
        }
        o.queued = s;
        out
    }

    /// Files remembered now.
    pub fn len(&self) -> usize {
        lock(&self.order).files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inos(v: Vec<(u64, u64)>) -> Vec<u64> {
        v.into_iter().map(|(i, _)| i).collect()
    }

    fn order(n: u64) -> ListingOrder {
        let o = ListingOrder::default();
        o.listed((1..=n).map(|i| (i, 100)));
        o
    }

    #[test]
    fn a_read_hands_out_the_files_listed_after_it_once() {
        let o = order(1000);
        let first = inos(o.read(1));
        assert_eq!(first, (2..2 + WINDOW as u64).collect::<Vec<_>>());
        // The next reads are covered until half the window is read.
        for i in 2..=(WINDOW as u64 / 2) {
            assert!(o.read(i).is_empty(), "read {i}");
        }
        let more = inos(o.read(1 + WINDOW as u64 / 2));
        assert_eq!(more[0], 2 + WINDOW as u64);
        assert!(more.iter().all(|i| *i > 1 + WINDOW as u64));
        // Never one file twice while reading forward.
        let mut seen: Vec<u64> = first.into_iter().chain(more).collect();
        for i in (2 + WINDOW as u64 / 2)..=1000 {
            seen.extend(inos(o.read(i)));
        }
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n);
        assert_eq!(seen, (2..=1000).collect::<Vec<_>>());
    }

    #[test]
    fn listing_alone_reads_nothing_and_unknown_files_read_nothing_ahead() {
        let o = order(100);
        assert!(o.read(5000).is_empty());
        assert_eq!(o.len(), 100);
    }

    #[test]
    fn empty_and_large_files_are_not_remembered_and_the_order_is_bounded() {
        let o = ListingOrder::default();
        o.listed([(1, 0), (2, FILE_MAX + 1), (3, 1)]);
        assert_eq!(o.len(), 1);
        o.listed((10..10 + 2 * ORDER_MAX as u64).map(|i| (i, 1)));
        assert_eq!(o.len(), ORDER_MAX);
        // The oldest went first.
        assert!(o.read(3).is_empty());
        // Far from the last read (the cursor was at the front): not looked for.
        assert!(o.read(10 + 2 * ORDER_MAX as u64 - 100).is_empty());
        assert!(!o.read(10 + ORDER_MAX as u64 + 5).is_empty());
    }

    #[test]
    fn the_byte_budget_bounds_a_window() {
        let o = ListingOrder::default();
        o.listed((1..=100).map(|i| (i, FILE_MAX)));
        let out = o.read(1);
        assert_eq!(out.len() as u64, WINDOW_BYTES / FILE_MAX);
    }

    #[test]
    fn a_reread_from_the_start_reads_ahead_again() {
        let o = order(1000);
        for i in 1..=600 {
            o.read(i);
        }
        assert_eq!(inos(o.read(1)), (2..2 + WINDOW as u64).collect::<Vec<_>>());
    }
}
