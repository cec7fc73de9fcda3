//! The CLI's side of the control socket: send one request, read one response, and start a daemon
//! when none answers.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemon::proto::{Request, Response};
use crate::layout::Layout;

fn connect(layout: &Layout) -> std::io::Result<UnixStream> {
    UnixStream::connect(layout.socket())
}

/// Sends `req` and returns the daemon's response. With `autostart`, a daemon is started in the
/// background (logging to `<state>/octofs.log`) when none answers.
pub fn call(layout: &Layout, req: &Request, autostart: bool) -> Result<Response, String> {
    let stream = match connect(layout) {
        Ok(s) => s,
        // Only when no daemon listens: a socket the caller may not reach is not a reason to start
        // a second daemon (which could not take the state directory anyway).
        Err(e) if autostart && no_daemon(&e) => start_daemon(layout)?,
        Err(e) if no_daemon(&e) => {
            return Err(format!(
                "no octofs daemon is running for {} ({e})",
                layout.state.display()
            ));
        }
        Err(e) => {
            return Err(format!(
                "cannot reach the octofs daemon at {}: {e}",
                layout.socket().display()
            ));
        }
    };
    exchange(stream, req)
}

/// Whether a failed connect means that no daemon is listening (no socket, or a stale one).
fn no_daemon(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

fn exchange(mut stream: UnixStream, req: &Request) -> Result<Response, String> {
    let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| format!("cannot talk to the daemon: {e}"))?;
    let mut resp = String::new();
    BufReader::new(stream)
        .read_line(&mut resp)
        .map_err(|e| format!("cannot read the daemon's answer: {e}"))?;
    if resp.is_empty() {
        return Err("the daemon closed the connection without answering (see its log)".into());
    }
    serde_json::from_str(&resp).map_err(|e| format!("bad answer from the daemon: {e}"))
}

fn start_daemon(layout: &Layout) -> Result<UnixStream, String> {
    // Refuse what the daemon would refuse before creating anything (its log included).
    if let Ok(m) = std::fs::metadata(&layout.root)
        && !m.is_dir()
    {
        return Err(format!("root {} is not a directory", layout.root.display()));
    }
    // The daemon makes its state private at start; what is made here before it runs is already.
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(parent) = layout.state.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(crate::layout::STATE_DIR_MODE)
        .create(&layout.state)
        .map_err(|e| format!("cannot create state dir {}: {e}", layout.state.display()))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(layout.log_file())
        .map_err(|e| format!("cannot open {}: {e}", layout.log_file().display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the octofs binary: {e}"))?;
    let mut child = Command::new(exe)
        .arg("--state")
        .arg(&layout.state)
        .arg("--root")
        .arg(&layout.root)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        // Its own process group: a Ctrl-C in the terminal that started it does not stop it.
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = connect(layout) {
            return Ok(s);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the daemon exited at start ({status}): {}",
                last_log_line(layout)
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the daemon did not come up within 15 s (see {})",
                layout.log_file().display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn last_log_line(layout: &Layout) -> String {
    std::fs::read_to_string(layout.log_file())
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "no log".into())
}

/// Asks the daemon to stop and waits until it has released the state directory.
pub fn stop(layout: &Layout) -> Result<bool, String> {
    let Ok(stream) = connect(layout) else {
        return Ok(false);
    };
    let resp = exchange(stream, &Request::Stop)?;
    if !resp.ok {
        return Err(resp.error.unwrap_or_default());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while layout.socket().exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The daemon removes its socket after unmounting; its lock goes with the process.
    if let Ok(f) = std::fs::File::open(layout.daemon_lock()) {
        while Instant::now() < deadline {
            match f.try_lock() {
                Ok(()) => break,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    Ok(true)
}
