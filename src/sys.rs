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
        Err(io::Error::last_os_error())
    }
}

/// `umount2(path, 0)`: a plain unmount, which fails with EBUSY while the mount is in use.
pub fn unmount(path: &Path) -> io::Result<()> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(c.as_ptr(), 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
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

/// `kill(-pgid, SIGKILL)`: kills every process of the process group led by our child `pgid` (a
/// child spawned with `process_group(0)`, not yet reaped, so that the id cannot have been reused).
pub fn kill_process_group(pgid: u32) -> io::Result<()> {
    let Ok(pgid) = libc::pid_t::try_from(pgid) else {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    };
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: kill(2) touches no memory; a negative pid names a process group.
    check(unsafe { libc::kill(-pgid, libc::SIGKILL) })
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

#[cfg(test)]
mod tests {
    #[test]
    fn unescapes_mountinfo_paths() {
        assert_eq!(super::unescape_mountinfo(r"/a\040b\134c"), "/a b\\c");
    }
}
