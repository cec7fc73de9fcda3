//! Users and identities: local users and groups by name and id, running with a user's filesystem
//! identity, becoming a user for good, and dropping every authority before an exec.

use super::check;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
