//! The service manager's readiness protocol (`sd_notify`): when the daemon runs under systemd with
//! `Type=notify`, it says `READY=1` once its control socket answers and `STOPPING=1` when it begins
//! to unmount. Without `NOTIFY_SOCKET` (started by hand, or by the CLI) nothing is sent.
//!
//! Owns only the datagram to the manager's socket; it must not decide anything about the daemon's
//! life. A failed send is logged and ignored: the manager then times the start out, as it would for
//! a daemon that never became ready.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to `$NOTIFY_SOCKET`, if set. A socket name
/// starting with `@` is in the abstract namespace.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&path, state) {
        tracing::warn!(
            "cannot notify the service manager at {}: {e}",
            path.to_string_lossy()
        );
    }
}

fn send(path: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

/// `READY=1` with the daemon's pid (the manager may have started it through a wrapper).
pub fn ready() {
    notify(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving workspaces",
        std::process::id()
    ));
}

/// `STOPPING=1`: the daemon is unmounting and will exit.
pub fn stopping() {
    notify("STOPPING=1\nSTATUS=unmounting workspaces");
}
