//! The connection keeper: a small process of its own (`octofs fd-keeper`, started by the daemon)
//! that holds a duplicate of every descriptor each mount's requests are read from (the
//! connection's `/dev/fuse` fd and its clones), so that the kernel does not abort the connections
//! when the daemon dies (`kill -9`, an OOM kill, a panic): a FUSE connection lives while any process
//! holds its device, and requests read from a clone nobody holds any more are ended with
//! `ECONNABORTED`. The next daemon gets the descriptors back and adopts the mounts
//! (`takeover::adopt_kept`, docs/restart.md "A crash").
//!
//! Owns the keeper's socket protocol (`<state>/keeper.sock`, for its owner only, root's or the daemon user's
//! only), the keeper process and the daemon's side of it (`attach`, `keep`, `forget`, `quit`).
//! It must not touch the mounts themselves: it never reads or writes a request, never unmounts,
//! and holds nothing but descriptors and the few facts (INIT outcome, mode) the next daemon needs
//! to serve them. It lets go of a connection the kernel aborted (unmounted), and exits on `quit`
//! (a `stop`), or when no daemon has been attached for [`GRACE`] (then the mounts fail with
//! `ENOTCONN`, as without a keeper).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::lock;
use super::takeover::{read_frame, write_frame};
use crate::layout::Layout;

/// How long the keeper holds the connections with no daemon attached: requests to the mounts wait
/// meanwhile (a fatal signal ends a waiting process). `OCTOFS_KEEPER_GRACE` (seconds) overrides.
pub const GRACE: Duration = Duration::from_secs(120);
/// How long a daemon waits for a keeper it started to answer.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// The keeper's socket in the state dir.
pub fn socket(layout: &Layout) -> PathBuf {
    layout.state.join("keeper.sock")
}

/// What the next daemon needs besides the descriptors to serve one kept mount.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeptMeta {
    pub negotiated: super::takeover::NegotiatedState,
    pub passthrough: bool,
    pub no_opendir: bool,
    pub no_open: bool,
    /// A ring mount: its ring memory's geometry (the memfd is the last descriptor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<crate::fs::uring::RingGeometry>,
}

/// One mount as the keeper holds it: its thread, mount point, facts, and descriptors (the
/// connection's first, then its clones).
pub struct Kept {
    pub thread: String,
    pub path: PathBuf,
    pub meta: KeptMeta,
    pub fds: Vec<OwnedFd>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Msg {
    /// A daemon attaches: the keeper answers with `Held` and the descriptors.
    Hello { pid: u32 },
    /// Keep these descriptors (they follow) for `thread`, instead of any held before.
    Keep {
        thread: String,
        path: PathBuf,
        meta: KeptMeta,
        fds: usize,
    },
    /// `thread` is unmounted: close its descriptors.
    Forget { thread: String },
    /// The daemon stops: close everything and exit.
    Quit,
}

#[derive(Debug, Serialize, Deserialize)]
struct HeldMount {
    thread: String,
    path: PathBuf,
    meta: KeptMeta,
    fds: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Held {
    mounts: Vec<HeldMount>,
}

// ----- the daemon's side -----

/// The daemon's connection to its keeper (none: no keeper, mounts die with the daemon).
static LINK: Mutex<Option<UnixStream>> = Mutex::new(None);

/// Connects to the keeper of `layout`'s state (starting one if none answers) and attaches this
/// daemon to it: returns the mounts it holds (a daemon died with them), whose descriptors are
/// now this process's too. On failure the daemon serves without a keeper (logged).
pub(super) fn attach(layout: &Layout) -> Vec<Kept> {
    match try_attach(layout) {
        Ok(kept) => kept,
        Err(e) => {
            tracing::warn!(
                "no connection keeper ({e}): the mounts will not survive a crash of this daemon"
            );
            Vec::new()
        }
    }
}

fn try_attach(layout: &Layout) -> Result<Vec<Kept>, String> {
    let path = socket(layout);
    let mut s = match UnixStream::connect(&path) {
        Ok(s) => s,
        Err(_) => {
            start(layout)?;
            let deadline = Instant::now() + START_TIMEOUT;
            loop {
                match UnixStream::connect(&path) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(format!(
                            "the keeper did not answer at {}: {e}",
                            path.display()
                        ));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    };
    // Only a keeper of this daemon's user: the socket is in the private state dir, and checked.
    let uid = crate::sys::peer_uid(&s).map_err(|e| format!("keeper socket: {e}"))?;
    if uid != crate::sys::euid() {
        return Err(format!("the keeper socket belongs to uid {uid}"));
    }
    s.set_read_timeout(Some(START_TIMEOUT))
        .map_err(|e| e.to_string())?;
    write_frame(
        &mut s,
        &Msg::Hello {
            pid: std::process::id(),
        },
    )
    .map_err(|e| format!("keeper: {e}"))?;
    let held: Held =
        serde_json::from_value(read_frame(&mut s).map_err(|e| format!("keeper: {e}"))?)
            .map_err(|e| format!("keeper: {e}"))?;
    let total: usize = held.mounts.iter().map(|m| m.fds).sum();
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(total);
    while fds.len() < total {
        fds.extend(crate::sys::recv_fds(&s).map_err(|e| format!("keeper: {e}"))?);
    }
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    let mut fds = fds.into_iter();
    let kept = held
        .mounts
        .into_iter()
        .map(|m| Kept {
            fds: fds.by_ref().take(m.fds).collect(),
            thread: m.thread,
            path: m.path,
            meta: m.meta,
        })
        .collect();
    *lock(&LINK) = Some(s);
    Ok(kept)
}

/// Starts `octofs fd-keeper` from this daemon's binary, in a process group of its own (a signal
/// to the daemon's group does not reach it).
fn start(layout: &Layout) -> Result<(), String> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| format!("cannot tell this daemon's binary: {e}"))?;
    let exe = match exe.to_string_lossy().strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => exe,
    };
    Command::new(&exe)
        .arg("--state")
        .arg(&layout.state)
        .arg("--root")
        .arg(&layout.root)
        .arg("fd-keeper")
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start {} fd-keeper: {e}", exe.display()))?;
    Ok(())
}

/// Sends one message (and descriptors) to the keeper; a broken link is dropped (logged once).
fn send(msg: &Msg, fds: &[BorrowedFd<'_>]) {
    let mut link = lock(&LINK);
    let Some(s) = link.as_mut() else { return };
    let r = write_frame(s, msg).and_then(|()| {
        for chunk in fds.chunks(crate::sys::FDS_PER_MESSAGE) {
            crate::sys::send_fds(s, chunk)?;
        }
        Ok(())
    });
    if let Err(e) = r {
        tracing::error!("lost the connection keeper ({e}): mounts will not survive a crash");
        *link = None;
    }
}

/// Whether this daemon has a keeper, or the service manager's descriptor store.
pub(super) fn attached() -> bool {
    lock(&LINK).is_some() || super::fdstore::active()
}

/// Gives the keeper `thread`'s descriptors (replacing any it held for it).
pub(super) fn keep(thread: &str, path: &Path, meta: KeptMeta, fds: &[OwnedFd]) {
    super::fdstore::keep(thread, path, &meta, fds);
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    send(
        &Msg::Keep {
            thread: thread.to_string(),
            path: path.to_path_buf(),
            meta,
            fds: borrowed.len(),
        },
        &borrowed,
    );
}

/// Tells the keeper (and the descriptor store) `thread` is unmounted.
pub(super) fn forget(thread: &str) {
    super::fdstore::forget(thread);
    send(
        &Msg::Forget {
            thread: thread.to_string(),
        },
        &[],
    );
}

/// At a stop: the keeper closes everything and exits (waited for, briefly).
pub(super) fn quit() {
    super::fdstore::quit();
    send(&Msg::Quit, &[]);
    if let Some(mut s) = lock(&LINK).take() {
        use std::io::Read as _;
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.read(&mut [0u8; 1]);
    }
}

// ----- the keeper process -----

struct Entry {
    path: PathBuf,
    meta: KeptMeta,
    fds: Vec<OwnedFd>,
}

#[derive(Default)]
struct State {
    mounts: BTreeMap<String, Entry>,
    /// Daemons attached now.
    attached: usize,
    /// The keeper's socket, removed at quit (only while the path is still this keeper's: see
    /// [`remove_own_socket`]).
    socket: PathBuf,
    /// The inode of the socket this keeper bound.
    socket_ino: u64,
    /// When the last daemon went (or the keeper started).
    alone_since: Option<Instant>,
    quit: bool,
}

/// `octofs fd-keeper`: holds the mounts' descriptors for the daemons of `layout`'s state until
/// `quit`, or [`GRACE`] with no daemon attached.
pub fn run_keeper(layout: &Layout) -> anyhow::Result<()> {
    crate::sys::set_umask(0o077);
    let path = socket(layout);
    if UnixStream::connect(&path).is_ok() {
        anyhow::bail!("a keeper already answers at {}", path.display());
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    listener.set_nonblocking(true)?;
    let socket_ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path)?);
    let grace = std::env::var("OCTOFS_KEEPER_GRACE")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(GRACE);
    let state = Arc::new(Mutex::new(State {
        alone_since: Some(Instant::now()),
        socket: path.clone(),
        socket_ino,
        ..State::default()
    }));
    tracing::info!(pid = std::process::id(), "connection keeper started");
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                let st = state.clone();
                std::thread::spawn(move || serve_link(s, &st));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!("keeper socket: {e}"),
        }
        {
            let mut st = lock(&state);
            // A connection the kernel aborted (unmounted) is let go.
            st.mounts.retain(|thread, e| {
                let alive = e
                    .fds
                    .first()
                    .is_some_and(|f| !crate::sys::fuse_connection_aborted(f.as_fd()));
                if !alive {
                    tracing::info!(%thread, "its connection ended; letting it go");
                }
                alive
            });
            let alone = st.attached == 0;
            let alone_for = st.alone_since.map(|t| t.elapsed()).unwrap_or_default();
            let done = st.quit
                || (alone && st.mounts.is_empty() && alone_for > Duration::from_secs(2))
                || (alone && alone_for > grace);
            if done {
                if !st.mounts.is_empty() {
                    tracing::warn!(
                        mounts = st.mounts.len(),
                        "no daemon came back: letting the connections go (the mounts fail)"
                    );
                }
                st.mounts.clear();
                // At a quit the link removed it already, and the path may be the next keeper's.
                if !st.quit {
                    remove_own_socket(&st);
                }
                tracing::info!("connection keeper exits");
                std::process::exit(0);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes the keeper's socket path if it is still the socket this keeper bound: once a stopped
/// daemon has seen its keeper's link close, the next daemon may start a keeper of its own at the
/// same path, which an exiting keeper must not take away (that daemon's mounts would then not
/// survive its crash, and the keeper after it would not find them).
fn remove_own_socket(st: &State) {
    let ours = std::fs::symlink_metadata(&st.socket)
        .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == st.socket_ino);
    if ours {
        let _ = std::fs::remove_file(&st.socket);
    }
}

fn serve_link(mut s: UnixStream, state: &Mutex<State>) {
    let mut is_daemon = false;
    let r = (|| -> std::io::Result<()> {
        match crate::sys::peer_uid(&s) {
            Ok(uid) if uid == crate::sys::euid() => {}
            _ => return Ok(()),
        }
        loop {
            let v = match read_frame(&mut s) {
                Ok(v) => v,
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            let msg: Msg = serde_json::from_value(v).map_err(std::io::Error::other)?;
            match msg {
                Msg::Hello { pid } => {
                    let (held, fds) = {
                        let mut st = lock(state);
                        if !is_daemon {
                            is_daemon = true;
                            st.attached += 1;
                            st.alone_since = None;
                        }
                        let mut fds = Vec::new();
                        let mut mounts = Vec::new();
                        for (thread, e) in &st.mounts {
                            for f in &e.fds {
                                fds.push(f.try_clone()?);
                            }
                            mounts.push(HeldMount {
                                thread: thread.clone(),
                                path: e.path.clone(),
                                meta: e.meta.clone(),
                                fds: e.fds.len(),
                            });
                        }
                        (Held { mounts }, fds)
                    };
                    tracing::info!(pid, mounts = held.mounts.len(), "a daemon attached");
                    write_frame(&mut s, &held)?;
                    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
                    for chunk in borrowed.chunks(crate::sys::FDS_PER_MESSAGE) {
                        crate::sys::send_fds(&s, chunk)?;
                    }
                }
                Msg::Keep {
                    thread,
                    path,
                    meta,
                    fds: n,
                } => {
                    let mut fds = Vec::with_capacity(n);
                    while fds.len() < n {
                        fds.extend(crate::sys::recv_fds(&s)?);
                    }
                    // The descriptors held before (the old clones) close here: requests read
                    // from them were sent again first (the new daemon asked before keeping).
                    lock(state).mounts.insert(thread, Entry { path, meta, fds });
                }
                Msg::Forget { thread } => {
                    lock(state).mounts.remove(&thread);
                }
                Msg::Quit => {
                    let mut st = lock(state);
                    st.mounts.clear();
                    st.quit = true;
                    // Gone before the daemon sees this link close: a stopped daemon leaves no
                    // keeper socket behind.
                    remove_own_socket(&st);
                    return Ok(());
                }
            }
        }
    })();
    if let Err(e) = r {
        tracing::warn!("keeper link: {e}");
    }
    if is_daemon {
        let mut st = lock(state);
        st.attached -= 1;
        if st.attached == 0 && !st.quit {
            st.alone_since = Some(Instant::now());
            if !st.mounts.is_empty() {
                tracing::warn!(
                    mounts = st.mounts.len(),
                    "the daemon is gone; holding its connections for the next one"
                );
            }
        }
    }
}
