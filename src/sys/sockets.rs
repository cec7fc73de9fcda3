//! Unix sockets and passed descriptors: the peer's credentials and groups, descriptors sent and
//! received with `SCM_RIGHTS`, systemd's notify socket and the descriptors it passes (`LISTEN_FDS`).

use std::io;

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

/// The pid of the process at the other end of a Unix socket when it connected (`SO_PEERCRED`).
pub fn peer_pid(sock: &impl std::os::fd::AsRawFd) -> io::Result<u32> {
    peer_cred(sock).map(|c| c.pid as u32)
}

/// The uid of the process at the other end of a Unix socket when it connected (`SO_PEERCRED`).
pub fn peer_uid(sock: &impl std::os::fd::AsRawFd) -> io::Result<u32> {
    peer_cred(sock).map(|c| c.uid)
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
