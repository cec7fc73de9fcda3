//! Giving the memory of freed nodes back to the system, off the request path: request threads
//! count what the inode table frees ([`freed`]: nodes the kernel forgot, a whole table dropped with
//! its workspace); a thread of its own, woken once the count passes [`THRESHOLD`], waits for the
//! frees to pause ([`QUIET`], at most [`MAX_WAIT`]), asks the allocator to give its free pages back
//! ([`crate::sys::malloc_trim`]), and sleeps [`MIN_INTERVAL`] before it trims again. glibc would
//! otherwise keep them in its arenas, between blocks still in use, for as long as the daemon runs.
//! Forget requests only count and, at most once a burst, wake that thread.
//!
//! Owns the count and the thread only: it never touches the table or a workspace.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Bytes freed (estimated from the nodes) after which a trim is worth its walk of the arenas:
/// ~2,000 directory nodes, or 60,000 light ones (one workspace's forgotten `git status` is
/// ~4 MiB).
pub(crate) const THRESHOLD: usize = 1 << 20;
/// A burst of forgets is over once no node was freed for this long.
pub(crate) const QUIET: Duration = Duration::from_millis(200);
/// The longest a trim waits for a burst to end.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(2);
/// The shortest time between two trims.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(2);

/// Bytes freed since the last trim.
static FREED: AtomicUsize = AtomicUsize::new(0);
/// Trims done (for tests and logs).
static TRIMS: AtomicU64 = AtomicU64::new(0);

struct Trimmer {
    wanted: Mutex<bool>,
    wake: Condvar,
}

/// The trimming thread, started by the first burst (None if it could not be started: memory
/// then stays with the allocator, as it would without it).
static TRIMMER: OnceLock<Option<&'static Trimmer>> = OnceLock::new();

/// `bytes` of node memory were freed: counts them, and wakes the trimmer when they pass the
/// threshold. Cheap (an atomic add; a notify once per threshold's worth).
pub(crate) fn freed(bytes: usize) {
    let before = FREED.fetch_add(bytes, Ordering::Relaxed);
    if before < THRESHOLD
        && before + bytes >= THRESHOLD
        && let Some(t) = TRIMMER.get_or_init(start)
    {
        let mut wanted = t.wanted.lock().unwrap_or_else(|e| e.into_inner());
        *wanted = true;
        t.wake.notify_one();
    }
}

/// How many times the allocator was trimmed since the daemon started.
pub(crate) fn allocator_trims() -> u64 {
    TRIMS.load(Ordering::Relaxed)
}

fn start() -> Option<&'static Trimmer> {
    let t: &'static Trimmer = Box::leak(Box::new(Trimmer {
        wanted: Mutex::new(false),
        wake: Condvar::new(),
    }));
    match std::thread::Builder::new()
        .name("octofs-trim".into())
        .spawn(move || run(t))
    {
        Ok(_) => Some(t),
        Err(e) => {
            tracing::warn!("cannot start the allocator trim thread: {e}");
            None
        }
    }
}

fn run(t: &'static Trimmer) {
    loop {
        {
            let mut wanted = t.wanted.lock().unwrap_or_else(|e| e.into_inner());
            while !*wanted {
                wanted = t.wake.wait(wanted).unwrap_or_else(|e| e.into_inner());
            }
            *wanted = false;
        }
        let began = Instant::now();
        loop {
            let seen = FREED.load(Ordering::Relaxed);
            std::thread::sleep(QUIET);
            if FREED.load(Ordering::Relaxed) == seen || began.elapsed() >= MAX_WAIT {
                break;
            }
        }
        let bytes = FREED.swap(0, Ordering::Relaxed);
        let t0 = Instant::now();
        let released = crate::sys::malloc_trim();
        TRIMS.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            freed = bytes,
            released,
            ms = t0.elapsed().as_secs_f64() * 1e3,
            "allocator trimmed after the inode table freed memory"
        );
        std::thread::sleep(MIN_INTERVAL);
    }
}
