//! Open files and paths: `fallocate`, `fadvise`, `lseek`, `copy_file_range`, `O_NONBLOCK`, extended
//! attributes and ACLs of a path, and `openat2` beneath a directory.

use super::{check, cpath};
use std::ffi::CString;
use std::io;
use std::path::Path;

/// `fallocate(fd, mode, offset, len)`.
pub fn fallocate(file: &std::fs::File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: the fd is valid for the lifetime of `file`; fallocate touches no memory of ours.
    check(unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) })
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

/// Takes a write lease on `file` and gives it back at once: `Ok` only when no other open file
/// description of its inode exists anywhere in the system (the kernel refuses a write lease while
/// the inode is open elsewhere, for reading or writing: another descriptor of this process, a
/// passthrough backing file the kernel holds, a mapping that outlived its descriptor). Someone
/// opening the file while the lease is held makes the kernel signal this process: the signal is
/// set to `SIGURG` first, which is ignored unless handled (the default, `SIGIO`, would end the
/// daemon).
pub fn open_nowhere_else(file: &std::fs::File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    /// `F_SETSIG` (Linux, every architecture); the libc crate does not name it for glibc.
    const F_SETSIG: libc::c_int = 10;
    let fd = file.as_raw_fd();
    // SAFETY: the fd is valid for the lifetime of `file`; F_SETSIG and F_SETLEASE touch no memory
    // of ours.
    check(unsafe { libc::fcntl(fd, F_SETSIG, libc::SIGURG) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) })
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
