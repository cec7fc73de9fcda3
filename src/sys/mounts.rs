//! Mounts: unmounting (lazily, through `fusermount3` for an ordinary user), bind mounts, whether a
//! mount is busy or stale, file system statistics and `syncfs`, and what `/proc/self/mountinfo` and
//! `statx` say of the mounts at or under a path.

use super::{check, cpath, euid};
use std::io;
use std::path::{Path, PathBuf};

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

/// `statfs(path)` in a child process of its own, waited for at most `timeout`: `Some` of what it
/// answered, `None` when it did not answer in time. A caller whose request the server already
/// took cannot be killed out of the wait (FUSE over io_uring hands a request to an idle ring
/// entry at once, so a stopped daemon's mount holds its callers so), and a thread of ours stuck
/// there would keep this process from ending. The child keeps only the pipe it answers on (none
/// of our output), so a stuck child holds up neither our exit nor whoever reads our output; it
/// ends when the mount answers or is aborted, reaped by a thread of ours or, after we exit, init.
pub fn statfs_in_child(
    path: &Path,
    timeout: std::time::Duration,
) -> io::Result<Option<io::Result<()>>> {
    let c = cpath(path)?;
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let (r, w) = (fds[0], fds[1]);
    // SAFETY: fork has no preconditions; the child below only makes async-signal-safe calls.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: in the child of a possibly multi-threaded process: raw system calls only (no
        // allocation, no lock), on `c` (allocated before the fork) and the pipe's write end.
        unsafe {
            if w > 0 {
                libc::syscall(libc::SYS_close_range, 0u32, (w - 1) as u32, 0u32);
            }
            libc::syscall(libc::SYS_close_range, (w + 1) as u32, u32::MAX, 0u32);
            let mut st: libc::statfs = std::mem::zeroed();
            let rc = libc::statfs(c.as_ptr(), &mut st);
            let e: libc::c_int = if rc == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::write(
                w,
                (&e as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>(),
            );
            libc::_exit(0);
        }
    }
    // SAFETY: `w` is our copy of the pipe's write end, closed once.
    unsafe { libc::close(w) };
    if pid < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: `r` is the pipe's read end, closed once.
        unsafe { libc::close(r) };
        return Err(e);
    }
    let mut pfd = libc::pollfd {
        fd: r,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is one valid pollfd.
    let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
    let mut e: libc::c_int = -1;
    let got = if ready > 0 {
        // SAFETY: reading at most size_of::<c_int>() bytes into `e`.
        unsafe {
            libc::read(
                r,
                (&mut e as *mut libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>(),
            )
        }
    } else {
        0
    };
    // SAFETY: `r` is the pipe's read end, closed once.
    unsafe { libc::close(r) };
    // The child is reaped by a thread of ours whenever it ends (at once when it answered).
    let _ = std::thread::Builder::new()
        .name("octofs-reap".into())
        .spawn(move || {
            let mut status = 0;
            // SAFETY: `pid` is our child; `status` is a valid int.
            unsafe { libc::waitpid(pid, &mut status, 0) };
        });
    if got != std::mem::size_of::<libc::c_int>() as isize {
        return Ok(None);
    }
    Ok(Some(if e == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(e))
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(super::unescape_mountinfo(r"/a\040b\134c"), "/a b\\c");
    }
}
