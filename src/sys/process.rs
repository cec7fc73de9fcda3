//! Process-wide state and signals: ids, the calling thread's CPU time, the allocator, SIGPIPE, the
//! umask, and signals to our own process groups.

use super::check;
use std::io;

pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

pub fn egid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); zero if unreadable.
/// Benchmarks on a loaded machine report it next to the wall time.
pub fn thread_cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Fixes glibc's mmap threshold for the daemon. Every FUSE session thread owns a request buffer of
/// 16 MiB (fuser's maximum write size) that the kernel fills only as far as each request goes. By
/// default glibc raises its mmap threshold to the size of the largest block ever freed; once one
/// such buffer was freed (an unmount), the next ones are carved from a thread arena, where `calloc`
/// zeroes them by hand and makes all 16 MiB resident: about 20 MiB of RSS per mounted workspace. A
/// fixed threshold keeps every large block a fresh, lazily mapped region.
pub fn fix_malloc_mmap_threshold() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator tunables; it is called before the daemon starts threads.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
}

/// Gives the allocator's free memory back to the system. glibc keeps what a program frees for its
/// next allocations, in a heap per arena, and by itself returns only the free top of each heap;
/// `malloc_trim(0)` also releases every whole free page inside them (`MADV_DONTNEED`). It takes
/// each arena's lock in turn while it walks its free blocks: for a background thread, not for a
/// request path. Returns whether any memory was released (always false on other C libraries).
pub fn malloc_trim() -> bool {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks and releases the allocator's own free blocks, under its locks.
    unsafe {
        libc::malloc_trim(0) == 1
    }
    #[cfg(not(target_env = "gnu"))]
    false
}

/// Restores the default SIGPIPE action, so that `octofs list | head` ends quietly like any Unix tool
/// instead of failing to print.
pub fn default_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// `umask(mask)`: sets the process's file mode creation mask; returns the previous one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask cannot fail and touches no memory.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// A signal [`signal_process_group`] may send.
#[derive(Debug, Clone, Copy)]
pub enum Signal {
    /// SIGTERM: ask to end (git removes its temporary files).
    Term,
    /// SIGKILL.
    Kill,
}

/// Sends `sig` to the process group `pgid`: every process of the group led by our child `pgid`
/// (spawned with `process_group(0)`, not yet reaped, so that the id cannot have been reused).
pub fn signal_process_group(pgid: u32, sig: Signal) -> io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let sig = match sig {
        Signal::Term => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    // SAFETY: kill(2) touches no memory; a negative pid names a process group.
    check(unsafe { libc::kill(-pgid, sig) })
}

/// `kill(-pgid, SIGKILL)`: kills every process of the process group led by our child `pgid` (a
/// child spawned with `process_group(0)`, not yet reaped, so that the id cannot have been reused).
pub fn kill_process_group(pgid: u32) -> io::Result<()> {
    signal_process_group(pgid, Signal::Kill)
}

/// `kill(getpid(), SIGKILL)`: this process dies at once, as a `kill -9` from outside would kill
/// it (the test hook `OCTOFS_TEST_CRASH_AFTER` only).
pub fn kill_self() {
    // SAFETY: kill(2) touches no memory; the pid is this process's own.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
}
