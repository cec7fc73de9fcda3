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
//! A reader does not read in exactly the listed order: `find` (fts) lists a directory whole, then
//! descends into each subdirectory where it meets it, so the directory's files after that
//! subdirectory are read only after its whole subtree, whose files were listed after them. So a
//! read finds its file wherever it was listed (an index by inode), and each listed file carries
//! when it was last handed to the pool: the files after a read that were not handed out recently
//! are handed out, however the reader jumps. A file handed out long enough ago to have left the
//! page cache again (a no-open mount drops the warmed copy after 2 s; a reread) is handed out again.
//!
//! Bounded: at most [`ORDER_MAX`] files are remembered (16 bytes each, and an index entry; the
//! oldest go first), and the order is forgotten after [`FORGET_AFTER`] without a listing or read.
//! Knows nothing of FUSE or of the core: `files.rs` feeds it inode numbers and asks
//! the core for the files behind them.

use std::collections::{HashMap, VecDeque};
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
/// The order is dropped after this long without a listing or a read.
pub const FORGET_AFTER: Duration = Duration::from_secs(30);
/// A file handed to the pool this long ago is handed out again when a read comes near it (its
/// warmed pages may be gone: a no-open mount drops them after 2 s).
pub const HAND_OUT_AGAIN_AFTER: Duration = Duration::from_secs(2);

/// One listed regular file.
#[derive(Debug, Clone, Copy)]
struct Listed {
    ino: u64,
    /// Bytes (at most [`FILE_MAX`]).
    size: u32,
    /// When it was last handed to the pool, in ms since the order's epoch plus one (0: never).
    handed: u32,
}

#[derive(Debug)]
struct Order {
    /// The listed files, in listing order; `first` is the sequence number of the front.
    files: VecDeque<Listed>,
    first: u64,
    /// Where each remembered inode was listed last (its sequence number).
    at: HashMap<u64, u64>,
    epoch: Instant,
    used: Option<Instant>,
}

impl Default for Order {
    fn default() -> Order {
        Order {
            files: VecDeque::new(),
            first: 0,
            at: HashMap::new(),
            epoch: Instant::now(),
            used: None,
        }
    }
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
        // Idle too long, or its millisecond clock (u32) halfway to running out: start afresh.
        if self
            .used
            .is_some_and(|t| now.saturating_duration_since(t) >= FORGET_AFTER)
            || now.saturating_duration_since(self.epoch)
                > Duration::from_millis(u32::MAX as u64 / 2)
        {
            *self = Order::default();
        }
        self.used = Some(now);
    }

    fn end(&self) -> u64 {
        self.first + self.files.len() as u64
    }

    /// `now` on the order's clock, never 0 (0 means "never handed out").
    fn stamp(&self, now: Instant) -> u32 {
        let ms = now.saturating_duration_since(self.epoch).as_millis();
        u32::try_from(ms).unwrap_or(u32::MAX - 1).saturating_add(1)
    }
}

impl ListingOrder {
    /// Regular files of `(inode, size)` were listed (in this order): remembered for read-ahead.
    /// Empty and large files are not.
    pub fn listed(&self, files: impl IntoIterator<Item = (u64, u64)>) {
        let mut guard = lock(&self.order);
        let o = &mut *guard;
        o.touch(Instant::now());
        for (ino, size) in files {
            if size == 0 || size > FILE_MAX {
                continue;
            }
            let seq = o.end();
            o.files.push_back(Listed {
                ino,
                size: size as u32,
                handed: 0,
            });
            o.at.insert(ino, seq);
            if o.files.len() > ORDER_MAX
                && let Some(old) = o.files.pop_front()
            {
                if o.at.get(&old.ino) == Some(&o.first) {
                    o.at.remove(&old.ino);
                }
                o.first += 1;
            }
        }
        if o.files.capacity() > 2 * ORDER_MAX {
            o.files.shrink_to(ORDER_MAX);
        }
        if o.at.capacity() > 2 * ORDER_MAX {
            o.at.shrink_to(ORDER_MAX);
        }
    }

    /// File `ino` is being read: the files to read ahead now, `(inode, size)`: those of the
    /// [`WINDOW`] listed after it that were not handed out in the last
    /// [`HAND_OUT_AGAIN_AFTER`] (none while the nearer half of the window was handed out, so the
    /// pool gets batches, not one file per read; none when `ino` was not listed).
    pub fn read(&self, ino: u64) -> Vec<(u64, u64)> {
        self.read_at(ino, Instant::now())
    }

    fn read_at(&self, ino: u64, now: Instant) -> Vec<(u64, u64)> {
        let mut guard = lock(&self.order);
        let o = &mut *guard;
        o.touch(now);
        let Some(&seq) = o.at.get(&ino) else {
            return Vec::new();
        };
        let stamp = o.stamp(now);
        let again = HAND_OUT_AGAIN_AFTER.as_millis() as u32;
        let fresh = |l: &Listed| l.handed != 0 && stamp.saturating_sub(l.handed) < again;
        // The file read is being read now: no need to hand it out later.
        let at = (seq - o.first) as usize;
        o.files[at].handed = stamp;
        let end = (at + 1 + WINDOW).min(o.files.len());
        let Some(start) = (at + 1..end).find(|&k| !fresh(&o.files[k])) else {
            return Vec::new();
        };
        if start > at + 1 + WINDOW / 2 {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut bytes = 0u64;
        for k in start..end {
            let l = o.files[k];
            if fresh(&l) {
                continue;
            }
            if bytes + u64::from(l.size) > WINDOW_BYTES && !out.is_empty() {
                break;
            }
            bytes += u64::from(l.size);
            out.push((l.ino, u64::from(l.size)));
            o.files[k].handed = stamp;
        }
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
        // A remembered file is found wherever it was listed.
        assert!(!o.read(10 + 2 * ORDER_MAX as u64 - 100).is_empty());
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
        let t0 = Instant::now();
        for i in 1..=600 {
            o.read_at(i, t0);
        }
        // Within the hand-out interval the window is still warm: nothing again.
        assert!(o.read_at(1, t0 + Duration::from_millis(500)).is_empty());
        let later = t0 + HAND_OUT_AGAIN_AFTER + Duration::from_millis(100);
        assert_eq!(
            inos(o.read_at(1, later)),
            (2..2 + WINDOW as u64).collect::<Vec<_>>()
        );
    }

    /// `find` lists a directory whole, then reads its files up to a subdirectory, the
    /// subdirectory's whole subtree (listed after the directory), then the rest of the
    /// directory's files. Catches: a read looked for only near the previous one (the rest of the
    /// directory, read after more than a few thousand other files, was never read ahead).
    #[test]
    fn files_read_after_a_long_subtree_are_still_read_ahead() {
        let o = ListingOrder::default();
        let dir: Vec<u64> = (1..=100).collect();
        let subtree: Vec<u64> = (1_000..6_000).collect();
        o.listed(dir.iter().map(|&i| (i, 100)));
        o.listed(subtree.iter().map(|&i| (i, 100)));
        let mut handed: Vec<u64> = Vec::new();
        for &i in dir[..10].iter().chain(&subtree).chain(&dir[10..]) {
            handed.extend(inos(o.read(i)));
        }
        for i in 66..=100 {
            assert!(
                handed.contains(&i),
                "file {i} of the directory never read ahead"
            );
        }
        let n = handed.len();
        handed.sort_unstable();
        handed.dedup();
        assert_eq!(
            handed.len(),
            n,
            "a file handed out twice within the interval"
        );
    }
}
