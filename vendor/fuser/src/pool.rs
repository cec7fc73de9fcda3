//! One bounded pool of threads serving the `/dev/fuse` connections of every spawned session
//! (octofs patch). Upstream fuser runs `n_threads` reader threads plus a joining thread per
//! session; a process serving a thousand mounts then held thousands of threads. Here
//! [`crate::Session::spawn`] registers the session's connection in one epoll set shared by the
//! process, and a pool of workers serves whichever connection has a request.
//!
//! How a request is served: each connection is registered `EPOLLONESHOT`, so one worker is woken
//! for it; that worker reads one request (the fd is non-blocking), re-arms the connection at once
//! (the next request of the same mount may go to another worker while this one is dispatching)
//! and dispatches it. A mount thus gets as many concurrent requests as it has requests queued,
//! bounded only by the pool.
//!
//! Size policy: the pool starts `min` workers and keeps at least one idle: when a worker takes a
//! request and no other worker is idle, it starts another one, up to `max` (so a request that
//! blocks — a long read, a snapshot, an fsync — never stalls other mounts until `max` requests
//! block at once). A worker above `min` that waited [`IDLE_EXIT`] without a request ends.
//! `set_limits` sets `min` and `max` (defaults [`DEFAULT_MIN`], [`DEFAULT_MAX`]).
//!
//! This module owns the epoll set, the worker threads and the table of registered connections;
//! it knows nothing of a filesystem: a session is a [`PoolSession`] (`session.rs`).

use std::collections::HashMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::time::Duration;

use log::error;
use log::warn;
use nix::sys::epoll::Epoll;
use nix::sys::epoll::EpollCreateFlags;
use nix::sys::epoll::EpollEvent;
use nix::sys::epoll::EpollFlags;

use crate::read_buf::FuseReadBuf;

/// Workers started with the pool when `set_limits` was not called.
pub const DEFAULT_MIN: usize = 4;
/// The most workers when `set_limits` was not called.
pub const DEFAULT_MAX: usize = 32;
/// A worker above `min` that waited this long without a request ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(10);

static MIN: AtomicUsize = AtomicUsize::new(DEFAULT_MIN);
static MAX: AtomicUsize = AtomicUsize::new(DEFAULT_MAX);
static POOL: OnceLock<Result<Pool, String>> = OnceLock::new();

/// Sets how many workers the pool keeps (`min`, at least 1) and may run (`max`, at least `min`).
/// Applies from the next decision on: call it before the first session is spawned to also set how
/// many start.
pub fn set_limits(min: usize, max: usize) {
    let min = min.max(1);
    MIN.store(min, Ordering::Relaxed);
    MAX.store(max.max(min), Ordering::Relaxed);
}

/// The pool's counts now: (worker threads, idle workers, connections served).
pub fn stats() -> (usize, usize, usize) {
    match POOL.get() {
        Some(Ok(p)) => {
            let w = p.lock_workers();
            (w.total, w.idle, p.lock_sessions().len())
        }
        _ => (0, 0, 0),
    }
}

/// What a worker does with a connection that has a request (or is gone).
pub(crate) trait PoolSession: Send + Sync {
    /// Reads and serves one request of this connection, re-arming it (`pool.rearm`) as soon as
    /// the next one may be read, or removing it (`pool.remove`) when the connection ended.
    fn serve(&self, pool: &Pool, key: u64, buf: &mut [u8]);
    /// The connection's fd.
    fn fd(&self) -> BorrowedFd<'_>;
}

#[derive(Debug, Default)]
struct Workers {
    total: usize,
    idle: usize,
    /// Numbers the worker threads' names.
    started: u64,
}

pub(crate) struct Pool {
    ep: Epoll,
    sessions: Mutex<HashMap<u64, Arc<dyn PoolSession>>>,
    next_key: AtomicU64,
    workers: Mutex<Workers>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

const WANT: EpollFlags = EpollFlags::EPOLLIN.union(EpollFlags::EPOLLONESHOT);

impl Pool {
    /// The process's pool, started on first use.
    pub(crate) fn get() -> io::Result<&'static Pool> {
        let p = POOL.get_or_init(|| {
            let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)
                .map_err(|e| format!("cannot create the FUSE pool's epoll set: {e}"))?;
            Ok(Pool {
                ep,
                sessions: Mutex::new(HashMap::new()),
                next_key: AtomicU64::new(1),
                workers: Mutex::new(Workers::default()),
            })
        });
        match p {
            Ok(p) => {
                p.ensure_min()?;
                Ok(p)
            }
            Err(e) => Err(io::Error::other(e.clone())),
        }
    }

    fn lock_workers(&self) -> std::sync::MutexGuard<'_, Workers> {
        self.workers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<dyn PoolSession>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A key for a session about to be registered (keys are never reused).
    pub(crate) fn new_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }

    /// Serves `s`'s connection under `key` from now on.
    pub(crate) fn register(&'static self, key: u64, s: Arc<dyn PoolSession>) -> io::Result<()> {
        self.lock_sessions().insert(key, s.clone());
        if let Err(e) = self.ep.add(s.fd(), EpollEvent::new(WANT, key)) {
            self.lock_sessions().remove(&key);
            return Err(io::Error::other(format!(
                "cannot add a FUSE connection to the pool's epoll set: {e}"
            )));
        }
        Ok(())
    }

    /// Lets a worker take the next request of `fd` (registered under `key`). A connection already
    /// removed is left alone.
    pub(crate) fn rearm(&self, key: u64, fd: BorrowedFd<'_>) {
        match self.ep.modify(fd, &mut EpollEvent::new(WANT, key)) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => warn!("cannot re-arm a FUSE connection in the pool: {e}"),
        }
    }

    /// Stops serving `fd` (registered under `key`): no worker reads it again, and the pool lets
    /// go of the session (a worker serving one of its requests holds it until that one is done).
    pub(crate) fn remove(&self, key: u64, fd: BorrowedFd<'_>) {
        match self.ep.delete(fd) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => warn!("cannot remove a FUSE connection from the pool: {e}"),
        }
        let gone = self.lock_sessions().remove(&key);
        drop(gone);
    }

    fn ensure_min(&'static self) -> io::Result<()> {
        let min = MIN.load(Ordering::Relaxed);
        let mut w = self.lock_workers();
        while w.total < min {
            self.start_worker(&mut w)?;
        }
        Ok(())
    }

    /// Starts one worker, counted idle. Called with the workers' lock held.
    fn start_worker(&'static self, w: &mut Workers) -> io::Result<()> {
        w.started += 1;
        let name = format!("fuse-pool-{}", w.started);
        std::thread::Builder::new()
            .name(name)
            .spawn(move || self.work())?;
        w.total += 1;
        w.idle += 1;
        Ok(())
    }

    fn work(&'static self) {
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();
        let mut events = [EpollEvent::empty(); 1];
        let timeout = u16::try_from(IDLE_EXIT.as_millis()).unwrap_or(u16::MAX);
        loop {
            let key = match self.ep.wait(&mut events, timeout) {
                Ok(0) => {
                    let mut w = self.lock_workers();
                    if w.total > MIN.load(Ordering::Relaxed) {
                        w.total -= 1;
                        w.idle -= 1;
                        return;
                    }
                    continue;
                }
                Ok(_) => events[0].data(),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    error!("the FUSE pool's epoll wait failed: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            {
                let mut w = self.lock_workers();
                w.idle -= 1;
                if w.idle == 0 && w.total < MAX.load(Ordering::Relaxed) {
                    if let Err(e) = self.start_worker(&mut w) {
                        warn!("cannot start another FUSE pool worker: {e}");
                    }
                }
            }
            let s = self.lock_sessions().get(&key).cloned();
            if let Some(s) = s {
                // A filesystem that panics on a request must not take the worker with it (the
                // pool would shrink below its count).
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    s.serve(self, key, &mut *buf)
                }));
                if r.is_err() {
                    error!("a FUSE request panicked in the pool; the worker goes on");
                }
            }
            self.lock_workers().idle += 1;
        }
    }
}
