//! A `/dev/fuse` connection as a descriptor: whether it was aborted, and asking the kernel to resend
//! what a dead server read.

use std::io;

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
