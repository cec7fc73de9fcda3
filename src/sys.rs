//! The only module with `unsafe`: thin, safe wrappers around the few syscalls std does not expose.
//!
//! Each function checks its arguments, calls exactly one syscall, and turns a failure into an
//! `io::Error` carrying errno. Nothing here holds state.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
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

pub fn egid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `umount2(path, MNT_DETACH)`: detach a mount even while it is busy (the kernel finishes it once the
/// last user leaves). Used for stale mounts whose daemon died.
pub fn lazy_unmount(path: &Path) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        Ok(())
    } else {
        fusermount_fallback(path, true, io::Error::last_os_error())
    }
}

/// `mount(src, dst, MS_BIND)`: `dst` shows the file system tree at `src` (the CSI plugin's
/// publication of a workspace at a pod's volume path, `crate::csi`). With `readonly`, the bind is
/// then remounted read-only (the source stays writable); if that fails the bind is undone.
pub fn bind_mount(src: &Path, dst: &Path, readonly: bool) -> io::Result<()> {
    let s = cpath(src)?;
    let d = cpath(dst)?;
    // SAFETY: `s` and `d` are valid NUL-terminated strings that outlive the call; a bind takes no
    // file system type and no data (both null).
    check(unsafe {
        libc::mount(
            s.as_ptr(),
            d.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    })?;
    if readonly {
        // SAFETY: as above; a remount of the bind at `d` takes no source.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                d.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                std::ptr::null(),
            )
        };
        if let Err(e) = check(rc) {
            let _ = lazy_unmount(dst);
            return Err(e);
        }
    }
    Ok(())
}

/// An ordinary user may not `umount2`; the setuid `fusermount3 -u` unmounts that user's own FUSE
/// mounts (`-z`: lazily). Its "busy" is reported as `EBUSY`.
fn fusermount_fallback(path: &Path, lazy: bool, e: io::Error) -> io::Result<()> {
    if e.raw_os_error() != Some(libc::EPERM) || euid() == 0 {
        return Err(e);
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|_| e)?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    if msg.contains("busy") {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    Err(io::Error::other(format!("fusermount3 -u: {}", msg.trim())))
}

/// `umount2(path, 0)`: a plain unmount, which fails with EBUSY while the mount is in use.
pub fn unmount(path: &Path) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        fusermount_fallback(path, false, io::Error::last_os_error())
    }
}

/// Whether a process uses the mount at `path` (cwd, open files, nested mounts), without unmounting
/// it: `umount2(MNT_EXPIRE)` answers EBUSY then, and otherwise only marks it expired (which any
/// access clears).
pub fn is_busy(path: &Path) -> bool {
    let Ok(c) = cpath(path) else { return false };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_EXPIRE) };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY)
}

/// Whether the mount at `path` stays busy for `patience`: a mount that a process is just leaving
/// (git's detached `maintenance run --auto` after a commit, a shell that is exiting) is not
/// busy. Only answers of EBUSY are retried, and those mark nothing; the first idle answer marks
/// the mount expired like [`is_busy`], so the caller must unmount it or access it next.
pub fn is_busy_settled(path: &Path, patience: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(10);
    loop {
        if !is_busy(path) {
            return false;
        }
        let left = patience.saturating_sub(start.elapsed());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(wait.min(left));
        wait = (wait * 2).min(std::time::Duration::from_millis(200));
    }
}

/// File-system statistics of the file system holding `path`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FsStats {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

pub fn statvfs(path: &Path) -> io::Result<FsStats> {
    let c = cpath(path)?;
    // SAFETY: an all-zero statvfs is a valid value for this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated and `st` is a valid, writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FsStats {
        blocks: st.f_blocks,
        bfree: st.f_bfree,
        bavail: st.f_bavail,
        files: st.f_files,
        ffree: st.f_ffree,
        bsize: st.f_bsize as u32,
        namelen: st.f_namemax as u32,
        frsize: st.f_frsize as u32,
    })
}

/// Mount points of FUSE file systems at or below `root`, from `/proc/self/mountinfo`.
pub fn fuse_mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        // fields: id parent major:minor root mountpoint options ... - fstype source superopts
        let mut parts = line.split(" - ");
        let (Some(left), Some(right)) = (parts.next(), parts.next()) else {
            continue;
        };
        let fstype = right.split(' ').next().unwrap_or("");
        if !fstype.starts_with("fuse") {
            continue;
        }
        let Some(mp) = left.split(' ').nth(4) else {
            continue;
        };
        let mp = PathBuf::from(unescape_mountinfo(mp));
        if mp.starts_with(root) {
            out.push(mp);
        }
    }
    out
}

/// The device (`major:minor`, as mountinfo writes it) of the mount on top at exactly `path`, in
/// constant time (mountinfo is O(mounts): at 1,000 mounts a read cost ~20 ms here). `statx` with an
/// empty mask and `AT_STATX_DONT_SYNC` never asks the file system (FUSE answers the device from the
/// superblock, even to a process the mount does not allow), and the walk only looks `path`'s last
/// name up in its parent, which must not be FUSE. `Ok(None)`: `path` is not a mount's root (nothing
/// is mounted there). `Err`: the kernel cannot say (no `statx` or no `STATX_ATTR_MOUNT_ROOT`,
/// before 5.8): ask mountinfo.
pub fn mount_root_dev(path: &Path) -> io::Result<Option<String>> {
    let c = cpath(path)?;
    // SAFETY: an all-zero statx is a valid value for this plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is NUL-terminated, `st` is a valid, writable statx; dirfd is ignored for an
    // absolute path and otherwise the cwd.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC | libc::AT_SYMLINK_NOFOLLOW,
            0,
            &mut st,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if st.stx_attributes_mask & root == 0 {
        return Err(io::Error::other("the kernel does not say mount roots"));
    }
    Ok((st.stx_attributes & root != 0)
        .then(|| format!("{}:{}", st.stx_dev_major, st.stx_dev_minor)))
}

/// The FUSE mount the kernel has on top at exactly `path` (from `/proc/self/mountinfo`, which
/// never asks the file system: a hung or lost mount costs nothing): its device (`major:minor`, one
/// per connection) and its source (`octofs:<thread>`). `None` when the topmost mount there is not
/// FUSE, or there is none.
pub fn fuse_mount_at(path: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut top = None;
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = left.split(' ').collect();
        let (Some(dev), Some(mp)) = (f.get(2), f.get(4)) else {
            continue;
        };
        if Path::new(&unescape_mountinfo(mp)) != path {
            continue;
        }
        // Later lines are mounted on top of earlier ones.
        let mut r = right.split(' ');
        let fstype = r.next().unwrap_or("");
        let source = unescape_mountinfo(r.next().unwrap_or(""));
        top = fstype
            .starts_with("fuse")
            .then(|| (dev.to_string(), source.to_string_lossy().into_owned()));
    }
    top
}

/// A place where the FUSE mount at `path` is also mounted, other than `path` itself: a bind of the
/// workspace into a sandbox's mount namespace (bubblewrap's `--bind <ws> /work`, a container's
/// volume) or elsewhere on the host. Such a copy holds the connection open and is used by processes
/// the host mount's own busy check never sees (their references are on the copy). Copies at the same
/// path in other namespaces (a service's namespace made while the workspace was mounted) are not
/// counted: an unmount propagates to them. Found by reading the mountinfo of one process of every
/// mount namespace (only mount tables are read); answers the first one found, as a pid and the path
/// inside its namespace.
pub fn bound_elsewhere(path: &Path) -> Option<(u32, PathBuf)> {
    let (dev, _) = fuse_mount_at(path)?;
    let mut seen = std::collections::HashSet::new();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        if !seen.insert(ns) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').take(5).collect();
            if f.get(2) != Some(&dev.as_str()) {
                continue;
            }
            let Some(mp) = f.get(4) else { continue };
            let mp = PathBuf::from(unescape_mountinfo(mp));
            if mp != path {
                return Some((pid, mp));
            }
        }
    }
    None
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(s: &str) -> std::ffi::OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    std::os::unix::ffi::OsStringExt::from_vec(out)
}

/// Whether `path` is the root of a mount that answers `ENOTCONN` (its daemon is gone).
/// Uses `statfs`, which always reaches the file system (a `stat` may be answered from the kernel's
/// attribute cache even after the daemon died).
pub fn is_stale_mount(path: &Path) -> bool {
    matches!(statvfs(path), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `fallocate(fd, mode, offset, len)`.
pub fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: the fd is valid for the lifetime of `file`; fallocate touches no memory of ours.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) })
}

/// `syncfs`: everything the kernel holds dirty for the file system that holds `path` goes to
/// disk.
pub fn syncfs(path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path)?;
    // SAFETY: the fd is valid for the lifetime of `dir`; syncfs touches no memory of ours.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `posix_fadvise(fd, offset, len, POSIX_FADV_DONTNEED)`: the kernel may drop the clean pages of
/// that range from its page cache (`len` 0: to the end of the file).
pub fn fadvise_dontneed(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED)
}

/// `posix_fadvise(fd, offset, len, POSIX_FADV_WILLNEED)`: the kernel starts reading that range into
/// its page cache and returns without waiting for it (`len` 0: to the end of the file).
pub fn fadvise_willneed(file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_WILLNEED)
}

fn fadvise(file: &std::fs::File, offset: u64, len: u64, advice: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    // SAFETY: the fd is valid for the lifetime of `file`; posix_fadvise touches no memory of ours.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), off, len, advice) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// `lseek(fd, offset, whence)` (for SEEK_DATA / SEEK_HOLE).
pub fn lseek(file: &std::fs::File, offset: i64, whence: i32) -> io::Result<i64> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is valid for the lifetime of `file`; lseek touches no memory of ours.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Clears `O_NONBLOCK` on an open file (opened with it so that a FIFO cannot block the opener).
pub fn clear_nonblock(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: the fd is valid for the lifetime of `file`; F_GETFL/F_SETFL touch no memory of ours.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `copy_file_range` between two files at explicit offsets; returns the bytes copied.
pub fn copy_file_range(
    src: &std::fs::File,
    src_off: u64,
    dst: &std::fs::File,
    dst_off: u64,
    len: u64,
) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let (Ok(mut so), Ok(mut d_o)) = (i64::try_from(src_off), i64::try_from(dst_off)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    // SAFETY: both fds are valid; the offset pointers point at locals that outlive the call.
    let r = unsafe {
        libc::copy_file_range(src.as_raw_fd(), &mut so, dst.as_raw_fd(), &mut d_o, len, 0)
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
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

/// Whether `path` (not followed if a symlink) carries a POSIX ACL, access or default: its group
/// mode bits are then the ACL's mask and must not be narrowed blindly.
pub fn has_acl(path: &Path) -> io::Result<bool> {
    let c = cpath(path)?;
    for name in [c"system.posix_acl_access", c"system.posix_acl_default"] {
        // SAFETY: both strings are NUL-terminated and outlive the call; a null buffer of size 0
        // only asks for the attribute's size.
        let r = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
        if r >= 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => {}
            _ => return Err(e),
        }
    }
    Ok(false)
}

/// The supplementary groups of the process at the other end of a Unix socket, as the kernel
/// recorded them when it connected (`SO_PEERGROUPS`, Linux ≥ 4.13).
pub fn peer_groups(sock: &impl std::os::fd::AsRawFd) -> io::Result<Vec<u32>> {
    // The generic Linux value (asm-generic/socket.h); the libc crate does not export it.
    const SO_PEERGROUPS: libc::c_int = 59;
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<u32>()) as libc::socklen_t;
        // SAFETY: the fd is valid while `sock` is borrowed; `groups` is a writable buffer of `len`
        // bytes and `len` a valid in/out length.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<u32>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        // ERANGE: the buffer was too small; `len` now says how large it must be.
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

/// A local user's uid and primary gid by name (`getpwnam_r`); `None` when there is no such user.
pub fn user_by_name(name: &str) -> io::Result<Option<(u32, u32)>> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    loop {
        // SAFETY: an all-zero passwd is a valid value for this plain C struct.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf` outlives the use of `pw`'s strings
        // (none are kept).
        let rc = unsafe {
            libc::getpwnam_r(c.as_ptr(), &mut pw, buf.as_mut_ptr(), buf.len(), &mut found)
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        return Ok((!found.is_null()).then_some((pw.pw_uid, pw.pw_gid)));
    }
}

/// A local user's name by uid (`getpwuid_r`); `None` when the uid has no entry.
pub fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value for this plain C struct.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the name is copied out before `buf` is dropped.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pw.pw_name.is_null() {
        return None;
    }
    // SAFETY: on success pw_name points at a NUL-terminated string inside `buf`.
    let name = unsafe { std::ffi::CStr::from_ptr(pw.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// Every group of local user `uid` (primary and supplementary, `getgrouplist`); empty when the uid
/// has no entry.
pub fn user_groups(uid: u32) -> Vec<u32> {
    let Some(name) = user_name(uid) else {
        return Vec::new();
    };
    let Ok(c) = CString::new(name) else {
        return Vec::new();
    };
    let Some((_, gid)) = user_by_name(&c.to_string_lossy()).ok().flatten() else {
        return Vec::new();
    };
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `c` is NUL-terminated; `groups` holds `n` writable gids and `n` is a valid in/out
        // count.
        let rc = unsafe { libc::getgrouplist(c.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(n.max(0) as usize);
            return groups;
        }
        // -1: too small; `n` now says how many there are.
        if n as usize <= groups.len() || groups.len() >= 1 << 16 {
            return vec![gid];
        }
        groups.resize(n as usize, 0);
    }
}

/// A local group's gid by name (`getgrnam_r`); `None` when there is no such group.
pub fn group_by_name(name: &str) -> io::Result<Option<u32>> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    loop {
        // SAFETY: an all-zero group is a valid value for this plain C struct.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; nothing of `gr` but the gid is kept.
        let rc = unsafe {
            libc::getgrnam_r(c.as_ptr(), &mut gr, buf.as_mut_ptr(), buf.len(), &mut found)
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        return Ok((!found.is_null()).then_some(gr.gr_gid));
    }
}

/// An extended attribute of `path` itself (never a symlink's target); `None` when it has none by
/// that name.
pub fn get_xattr(path: &Path, name: &str) -> io::Result<Option<Vec<u8>>> {
    let c = cpath(path)?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: `c` and `n` are NUL-terminated; `buf` is writable for `buf.len()` bytes.
        let r =
            unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            buf.truncate(r as usize);
            return Ok(Some(buf));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA) => return Ok(None),
            Some(libc::ERANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            _ => return Err(e),
        }
    }
}

/// Sets an extended attribute of `path` itself (never a symlink's target).
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let c = cpath(path)?;
    let n = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))?;
    // SAFETY: `c` and `n` are NUL-terminated; `value` is readable for its length.
    check(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// Runs `f` with this thread's filesystem identity set to `uid`/`gid` (Linux's per-thread
/// fsuid/fsgid): what it creates is theirs, and it reaches only what they may (the kernel drops
/// root's file capabilities while the fsuid is not 0), so a symlink swapped into a user's folder
/// leads nowhere they could not write themselves. The identity is restored afterwards, also when
/// `f` panics. Other threads keep theirs.
pub fn as_fs_user<T>(uid: u32, gid: u32, f: impl FnOnce() -> T) -> io::Result<T> {
    struct Restore(u32, u32);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: setfsuid/setfsgid only change this thread's credentials.
            unsafe {
                libc::setfsuid(self.0);
                libc::setfsgid(self.1);
            }
        }
    }
    // SAFETY: as above; an invalid id (-1) changes nothing and returns the current one.
    let (old_uid, old_gid) = unsafe {
        (
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
        )
    };
    let restore = Restore(old_uid, old_gid);
    // SAFETY: as above (the group first, while the thread still acts as root on files).
    let (now_uid, now_gid) = unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        (
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
        )
    };
    if now_uid != uid || now_gid != gid {
        drop(restore);
        return Err(io::Error::other(format!(
            "cannot take the filesystem identity {uid}:{gid}"
        )));
    }
    let out = f();
    drop(restore);
    Ok(out)
}

/// [`as_fs_user`] with this thread's supplementary groups set to `groups` meanwhile (the raw
/// `setgroups` system call changes the calling thread only, unlike libc's wrapper, which changes
/// every thread of the process), so that a directory or file reachable through one of the user's
/// supplementary groups is reachable in `f` too. The thread's groups are restored afterwards, also
/// when `f` panics. A daemon that may not set groups (not root) runs `f` as [`as_fs_user`] does.
pub fn as_fs_user_in<T>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> T,
) -> io::Result<T> {
    struct Restore(Vec<libc::gid_t>);
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: `self.0` holds `len` readable gids; SYS_setgroups only changes this thread's
            // credentials (it is the raw call, not libc's all-threads wrapper).
            unsafe {
                libc::syscall(libc::SYS_setgroups, self.0.len(), self.0.as_ptr());
            }
        }
    }
    // SAFETY: a zero-length query writes nothing and returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return as_fs_user(uid, gid, f);
    }
    let mut old = vec![0 as libc::gid_t; n as usize];
    // SAFETY: `old` holds `n` writable gids.
    let got = unsafe { libc::getgroups(n, old.as_mut_ptr()) };
    if got < 0 {
        return as_fs_user(uid, gid, f);
    }
    old.truncate(got as usize);
    let wanted: Vec<libc::gid_t> = groups.iter().take(65536).copied().collect();
    // SAFETY: `wanted` holds `len` readable gids; only this thread's credentials change.
    let rc = unsafe { libc::syscall(libc::SYS_setgroups, wanted.len(), wanted.as_ptr()) };
    if rc != 0 {
        return as_fs_user(uid, gid, f);
    }
    let _restore = Restore(old);
    as_fs_user(uid, gid, f)
}

/// Most descriptors one [`send_fds`] message carries (the kernel's `SCM_MAX_FD` is 253).
pub const FDS_PER_MESSAGE: usize = 200;

/// Sends `fds` (at most [`FDS_PER_MESSAGE`]) over a connected Unix stream socket as one byte with
/// `SCM_RIGHTS`: the peer receives duplicates with [`recv_fds`].
pub fn send_fds(
    sock: &impl std::os::fd::AsRawFd,
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if fds.is_empty() || fds.len() > FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors in one message", fds.len()),
        ));
    }
    let raw: Vec<libc::c_int> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let data_len = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
    // u64 elements: the control buffer is aligned for `cmsghdr`.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut byte = [fds.len() as u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: zeroed msghdr is a valid empty header; every pointer set below points into buffers
    // that outlive the sendmsg call, with the lengths given.
    let rc = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
        std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(cmsg).cast(), raw.len());
        loop {
            let rc = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
            if rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break rc;
        }
    };
    match rc {
        1 => Ok(()),
        r if r < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::other("sendmsg sent nothing")),
    }
}

/// Sends `payload` with `fds` (may be empty; at most [`FDS_PER_MESSAGE`]) as one message on a
/// connected socket; the bytes sent.
fn send_with_fds(
    sock: &impl std::os::fd::AsRawFd,
    payload: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    if fds.len() > FDS_PER_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors in one message", fds.len()),
        ));
    }
    let raw: Vec<libc::c_int> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let data_len = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr().cast_mut().cast(),
        iov_len: payload.len(),
    };
    // SAFETY: as in `send_fds`; the kernel only reads the payload (`iov_base` is never written
    // through) and the control buffer, both alive across the call.
    let rc = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !raw.is_empty() {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            if cmsg.is_null() {
                return Err(io::Error::other("no room for the control message"));
            }
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(data_len as u32) as _;
            std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(cmsg).cast(), raw.len());
        }
        loop {
            let rc = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
            if rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break rc;
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as usize)
}

/// `sd_notify` with descriptors: sends `state` and `fds` (`SCM_RIGHTS`) in one datagram to
/// `$NOTIFY_SOCKET` (a name starting with `@` is abstract). An error when it is not set.
pub fn notify_with_fds(state: &str, fds: &[std::os::fd::BorrowedFd<'_>]) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::UnixDatagram;
    let path = std::env::var_os("NOTIFY_SOCKET")
        .ok_or_else(|| io::Error::other("NOTIFY_SOCKET is not set"))?;
    let sock = UnixDatagram::unbound()?;
    match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.connect_addr(&addr)?;
        }
        None => sock.connect(&path)?,
    }
    let sent = send_with_fds(&sock, state.as_bytes(), fds)?;
    if sent != state.len() {
        return Err(io::Error::other("the notification was cut short"));
    }
    Ok(())
}

/// Receives one datagram of [`notify_with_fds`] (the service manager's side, for tests that play
/// it): its bytes and the descriptors it carried (close-on-exec here).
pub fn recv_with_fds(
    sock: &impl std::os::fd::AsRawFd,
) -> io::Result<(Vec<u8>, Vec<std::os::fd::OwnedFd>)> {
    use std::os::fd::FromRawFd;
    let data_len = FDS_PER_MESSAGE * std::mem::size_of::<libc::c_int>();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut buf = vec![0u8; 4096];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as in `recv_fds`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let rc = loop {
            let rc = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break rc;
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let n = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<libc::c_int>();
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                for i in 0..n {
                    fds.push(std::os::fd::OwnedFd::from_raw_fd(
                        data.add(i).read_unaligned(),
                    ));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        buf.truncate(rc as usize);
        Ok((buf, fds))
    }
}

/// The descriptors the service manager passed this process (`sd_listen_fds_with_names`): when
/// `LISTEN_PID` is this process, `LISTEN_FDS` descriptors from 3, named by `LISTEN_FDNAMES`
/// (`:`-separated). Each is made close-on-exec and owned by the caller; none when not for us.
pub fn listen_fds() -> Vec<(String, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    if !ours {
        return Vec::new();
    }
    let n = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(0)
        .clamp(0, 100_000);
    let names_var = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    let names: Vec<&str> = names_var.split(':').collect();
    let mut out = Vec::new();
    for i in 0..n {
        let fd = 3 + i;
        // SAFETY: fcntl on a descriptor number touches no memory; one that is not open fails.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        if flags < 0 {
            continue;
        }
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
        let name = names
            .get(i as usize)
            .copied()
            .unwrap_or("unknown")
            .to_string();
        // SAFETY: the service manager passed descriptors 3..3+LISTEN_FDS to this process (its
        // pid checked); nothing else in it owns them.
        out.push((name, unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }));
    }
    out
}

/// Test support (playing the service manager): makes `cmd`'s child get `fds` (at most 64) as
/// descriptors 3, 4, … (without close-on-exec), as `sd_listen_fds` expects. The caller keeps
/// `fds` open until the child is spawned.
pub fn pass_fds_from_3(
    cmd: &mut std::process::Command,
    fds: &[std::os::fd::OwnedFd],
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    const MAX: usize = 64;
    if fds.len() > MAX {
        return Err(io::Error::other(format!(
            "{} descriptors to pass",
            fds.len()
        )));
    }
    let mut raw = [0 as libc::c_int; MAX];
    for (r, f) in raw.iter_mut().zip(fds) {
        *r = f.as_raw_fd();
    }
    let n = fds.len();
    // SAFETY: between fork and exec the closure calls only fcntl/dup2/close (async-signal-safe),
    // allocates nothing and touches only the arrays it owns. Every source first moves above the
    // targets' range, so that no dup2 overwrites a source not yet placed.
    unsafe {
        cmd.pre_exec(move || {
            let base = 3 + n as libc::c_int;
            let mut moved = [0 as libc::c_int; MAX];
            for (m, &fd) in moved.iter_mut().zip(raw.iter()).take(n) {
                *m = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, base);
                if *m < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (i, &m) in moved.iter().enumerate().take(n) {
                if libc::dup2(m, 3 + i as libc::c_int) < 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::close(m);
            }
            Ok(())
        });
    }
    Ok(())
}

/// Receives one message of [`send_fds`]: the descriptors it carried (close-on-exec here).
pub fn recv_fds(sock: &impl std::os::fd::AsRawFd) -> io::Result<Vec<std::os::fd::OwnedFd>> {
    use std::os::fd::FromRawFd;
    let data_len = FDS_PER_MESSAGE * std::mem::size_of::<libc::c_int>();
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(data_len as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: as in `send_fds`; the kernel writes at most `msg_controllen` bytes of control data,
    // and each descriptor it reports is new in this process and owned by nobody else.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let rc = loop {
            let rc = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break rc;
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        if rc == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let n = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<libc::c_int>();
                let data = libc::CMSG_DATA(cmsg).cast::<libc::c_int>();
                for i in 0..n {
                    fds.push(std::os::fd::OwnedFd::from_raw_fd(
                        data.add(i).read_unaligned(),
                    ));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other(
                "descriptors were dropped (control data truncated)",
            ));
        }
        if fds.len() != usize::from(byte[0]) {
            return Err(io::Error::other(format!(
                "{} descriptors announced, {} received",
                byte[0],
                fds.len()
            )));
        }
        Ok(fds)
    }
}

/// The pid of the process at the other end of a Unix socket when it connected (`SO_PEERCRED`).
pub fn peer_pid(sock: &impl std::os::fd::AsRawFd) -> io::Result<u32> {
    peer_cred(sock).map(|c| c.pid as u32)
}

/// The uid of the process at the other end of a Unix socket when it connected (`SO_PEERCRED`).
pub fn peer_uid(sock: &impl std::os::fd::AsRawFd) -> io::Result<u32> {
    peer_cred(sock).map(|c| c.uid)
}

/// Whether the FUSE connection of `/dev/fuse` descriptor `fd` was aborted (unmounted, or every
/// server gone): the device then polls `POLLERR`. Asks nothing of the mount, never blocks.
pub fn fuse_connection_aborted(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd, timeout 0.
    let rc = unsafe { libc::poll(&mut p, 1, 0) };
    rc > 0 && p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
}

/// `FUSE_NOTIFY_RESEND` (Linux 6.9): asks the kernel to queue again every request of the
/// connection of `/dev/fuse` descriptor `dev` that a server read and has not answered (a server
/// that died). The notification is a bare `fuse_out_header`: length 16, unique 0, code 7.
pub fn fuse_notify_resend(dev: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::io::Write as _;
    const FUSE_NOTIFY_RESEND: i32 = 7;
    let mut msg = Vec::with_capacity(16);
    msg.extend_from_slice(&16u32.to_ne_bytes());
    msg.extend_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    msg.extend_from_slice(&0u64.to_ne_bytes());
    let f = std::fs::File::from(dev.try_clone_to_owned()?);
    (&f).write_all(&msg)
}

fn peer_cred(sock: &impl std::os::fd::AsRawFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// A local user's home directory by uid (`getpwuid_r`); `None` when the uid has no entry or no
/// home.
pub fn user_home(uid: u32) -> Option<PathBuf> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value for this plain C struct.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the path is copied out before `buf` is dropped.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pw.pw_dir.is_null() {
        return None;
    }
    // SAFETY: on success pw_dir points at a NUL-terminated string inside `buf`.
    let dir = unsafe { std::ffi::CStr::from_ptr(pw.pw_dir) };
    let dir = Path::new(std::ffi::OsStr::from_bytes(dir.to_bytes()));
    (!dir.as_os_str().is_empty()).then(|| dir.to_path_buf())
}

/// Makes this process `uid`/`gid` with exactly the supplementary `groups`, for good: real,
/// effective and saved ids all change, so nothing of the old identity can be taken back. For a
/// process about to `exec` a program on a caller's behalf (single-threaded: the ids of other
/// threads are not changed). Checked afterwards: an identity that did not take is an error.
pub fn become_user(uid: u32, gid: u32, groups: &[u32]) -> io::Result<()> {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    // SAFETY: `groups` is a valid array of `groups.len()` gids for the call.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: setresgid/setresuid only change this process's credentials (the group first, while
    // the process may still change it).
    if unsafe { libc::setresgid(gid, gid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::setresuid(uid, uid, uid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getuid/geteuid/getgid/getegid have no preconditions and cannot fail.
    let now = unsafe {
        (
            libc::getuid(),
            libc::geteuid(),
            libc::getgid(),
            libc::getegid(),
        )
    };
    if now != (uid, uid, gid, gid) {
        return Err(io::Error::other(format!(
            "the identity {uid}:{gid} did not take"
        )));
    }
    Ok(())
}

/// `PR_SET_NO_NEW_PRIVS`: no program this process executes from now on gains privileges
/// (set-user-ID bits and file capabilities are ignored). Inherited by children, never undone.
pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes plain integers and changes only this process.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens `rel` beneath the directory `dir` with `openat2`, resolving no symlink (nor magic link)
/// on the way or at the end and never leaving `dir` (`..` included) or its mount. `flags` are
/// `open(2)`'s (`O_CLOEXEC` is added). For serving a host directory's contents to a mount without
/// letting a name planted in it lead elsewhere.
pub fn open_beneath(dir: &std::fs::File, rel: &Path, flags: i32) -> io::Result<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = cpath(rel)?;
    // `libc::open_how` cannot be built outside libc (it may grow): the kernel's struct, as of
    // Linux 5.6, passed with its size.
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_MAGICLINKS
            | libc::RESOLVE_NO_XDEV,
    };
    // SAFETY: `c` is NUL-terminated, `how` is a valid `open_how` whose size is passed with it,
    // and `dir` is an open descriptor for the duration of the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd as i32) })
}

/// Makes `cmd`'s child drop every authority before it execs: no supplementary groups, gid `gid`,
/// uid `uid` (checked: a child still root fails to start), `PR_SET_NO_NEW_PRIVS`, then the
/// Landlock domain of `ruleset` (a ruleset fd built by the parent; `None` when the kernel has no
/// Landlock). The ruleset is built before the fork because the child of a threaded process may
/// only make async-signal-safe calls: here, raw syscalls only. Used for the package managers that
/// build dependency layers (src/deps/sandbox.rs).
pub fn drop_privileges_on_exec(
    cmd: &mut std::process::Command,
    uid: u32,
    gid: u32,
    ruleset: Option<std::os::fd::OwnedFd>,
) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let closure = move || -> io::Result<()> {
        // SAFETY: each call is one raw syscall with plain integer arguments or a null pointer of
        // length 0 (setgroups); none allocates or takes a lock, as a pre_exec closure requires.
        // The ruleset fd stays open (owned by the closure) until the exec, which closes it
        // (Landlock ruleset fds are close-on-exec).
        unsafe {
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setgid(gid))?;
            check(libc::setuid(uid))?;
            if libc::getuid() != uid || libc::geteuid() != uid || libc::getegid() != gid {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
            if let Some(fd) = &ruleset
                && libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the closure makes only async-signal-safe raw syscalls (see above).
    unsafe {
        cmd.pre_exec(closure);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(super::unescape_mountinfo(r"/a\040b\134c"), "/a b\\c");
    }
}
