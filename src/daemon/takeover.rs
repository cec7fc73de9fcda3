//! Graceful restart (`octofs restart`): the running daemon hands every mount's `/dev/fuse`
//! connection, and the in-memory state the kernel depends on, to a new daemon process started from
//! the binary now at its path, so that an upgrade never unmounts anything (docs/restart.md).
//!
//! The old side ([`Daemon::restart`]): refuse new control requests and wait for those running,
//! take every mounted thread's lock, start the new process, pause every mount's reader threads
//! (each finishes the request it serves; new ones wait in the kernel), export the live nodes and
//! open handles, close the catalogs cleanly, and send all of it over a private Unix socket in the
//! state dir: one length-prefixed JSON frame, then the descriptors (`SCM_RIGHTS`): the daemon's
//! lock file, each mount's `/dev/fuse` fd, each open handle's file. Passthrough backing ids are
//! numbers in the kernel connection and stay valid while it lives. Once the new process says it
//! serves, the old one answers and exits without unmounting. Any failure before that (the binary
//! missing, refusing, dying, or silent for [`HANDOVER_TIMEOUT`]) kills the new process, resumes the
//! readers and leaves the old daemon serving; `restart` says why.
//!
//! The new side ([`serve_takeover`]): receive, refuse a version it does not know, load each
//! workspace's core from disk as at start, give it the handed-over nodes and handles, build the
//! sessions without INIT, and only when every mount is ready start them all, bind the control
//! socket and say "serving". Until then nothing it made may be dropped (a session unmounts on
//! drop): a failure answers the refusal and exits at once.
//!
//! Owns the protocol and the order of the steps; what a mount's state is belongs to the adapter
//! (`fs::fuse`), the handles and the core.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::error::Error;
use super::proto::Restarted;
use super::{Daemon, Mounted, Reply, Settings, lock};
use crate::access::Caller;
use crate::fs::fuse::{AdapterState, FuseAdapter, MountInfo};
use crate::fs::uring::Transport;
use crate::layout::Layout;
use crate::workspace::WorkspaceRecord;

/// The handover format this binary writes and reads.
pub const VERSION: u32 = 1;
/// How long the new process has from its start to "serving".
pub const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long running control requests, thread locks and requests in flight may take to finish.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest handover frame read.
const MAX_FRAME: u64 = 1 << 30;
/// Read by the new process only, for tests: `exit` (die after receiving everything) or `refuse`
/// (refuse after loading every workspace).
pub const FAULT_ENV: &str = "OCTOFS_TAKEOVER_FAULT";

/// Set while a handover runs: control requests are refused meanwhile.
static HANDING_OVER: AtomicBool = AtomicBool::new(false);
/// Control requests being served.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// The handover succeeded: exit once the `restart` answer is written.
static EXIT_AFTER_ANSWER: AtomicBool = AtomicBool::new(false);
/// The daemon's lock file (its flock travels with the descriptor).
static LOCK_FILE: OnceLock<File> = OnceLock::new();
/// In a new daemon: the connection to the old one, to say "serving" on once the socket answers.
static ACK: Mutex<Option<UnixStream>> = Mutex::new(None);

/// Remembers the daemon's lock file, to hand it over.
pub(super) fn remember_lock(file: &File) {
    if let Ok(f) = file.try_clone() {
        let _ = LOCK_FILE.set(f);
    }
}

/// A control request being served (counted until dropped).
pub(super) struct InFlight;

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a control request in, or refuses it while a handover runs.
pub(super) fn enter() -> Result<InFlight, Error> {
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let g = InFlight;
    if HANDING_OVER.load(Ordering::SeqCst) {
        return Err(Error::Refused(
            "the daemon is restarting; try again in a moment".into(),
        ));
    }
    Ok(g)
}

/// After an answer was written: exits if this daemon handed everything over.
pub(super) fn exit_if_handed_over() {
    if EXIT_AFTER_ANSWER.load(Ordering::SeqCst) {
        tracing::info!("handed over; exiting without unmounting");
        std::process::exit(0);
    }
}

/// In a new daemon, once its control socket answers: tells the old daemon it serves.
pub(super) fn serving() {
    let Some(mut s) = lock(&ACK).take() else {
        return;
    };
    let msg = ChildMsg::Serving {
        pid: std::process::id(),
    };
    if let Err(e) = write_frame(&mut s, &msg) {
        tracing::error!("cannot tell the old daemon that this one serves: {e}");
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum ChildMsg {
    Hello { version: u32, pid: u32 },
    Serving { pid: u32 },
    Refused { why: String },
}

#[derive(Debug, Serialize, Deserialize)]
struct SettingsState {
    freshness_secs: u64,
    passthrough: bool,
    sweep_idle: u64,
    sweep_every: u64,
    fetch_timeout_secs: u64,
    transport: String,
    /// `serve --io` (absent from a handover of a daemon that had no such setting: handles).
    #[serde(default)]
    io: String,
    /// `serve --max-threads-per-user` (absent from an older daemon's handover: the default).
    #[serde(default)]
    max_threads_per_user: Option<usize>,
    /// `serve --quota-per-user` (absent from an older daemon's handover: none).
    #[serde(default)]
    quota_per_user: Option<u64>,
    /// `serve --keep-connections` (absent from an older daemon's handover: on).
    #[serde(default = "yes")]
    keep_connections: bool,
    /// `serve --metrics` and `--metrics-allow` (absent from an older daemon's handover: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metrics: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metrics_allow: Option<String>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(super) struct NegotiatedState {
    kernel_major: u32,
    kernel_minor: u32,
    flags: u64,
    max_write: u32,
    max_readahead: u32,
}

impl From<fuser::Negotiated> for NegotiatedState {
    fn from(n: fuser::Negotiated) -> Self {
        NegotiatedState {
            kernel_major: n.kernel_major,
            kernel_minor: n.kernel_minor,
            flags: n.flags,
            max_write: n.max_write,
            max_readahead: n.max_readahead,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct MountHandover {
    thread: String,
    path: PathBuf,
    /// Index of the connection's fd among the descriptors.
    dev_fd: usize,
    negotiated: NegotiatedState,
    adapter: AdapterState,
    /// Index of each handle's file among the descriptors (order of `adapter.handles.handles`).
    files: Vec<usize>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Handover {
    version: u32,
    old_pid: u32,
    settings: SettingsState,
    /// Descriptors that follow the frame.
    fds: usize,
    /// Index of the daemon's lock file among them.
    lock_fd: usize,
    mounts: Vec<MountHandover>,
}

pub(super) fn write_frame(s: &mut UnixStream, v: &impl Serialize) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    s.write_all(&(bytes.len() as u64).to_le_bytes())?;
    s.write_all(&bytes)
}

pub(super) fn read_frame(s: &mut UnixStream) -> std::io::Result<serde_json::Value> {
    let mut len = [0u8; 8];
    s.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {len} bytes")));
    }
    let mut bytes = vec![0u8; len as usize];
    s.read_exact(&mut bytes)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Auto => "auto",
        Transport::Uring => "uring",
        Transport::Dev => "dev",
    }
}

/// The binary at the running daemon's path (after an upgrade replaced the file, the new one).
fn own_path() -> Result<PathBuf, String> {
    let exe = std::fs::read_link("/proc/self/exe")
        .map_err(|e| format!("cannot tell this daemon's binary: {e}"))?;
    let s = exe.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => exe,
    })
}

/// A mount taken out of the daemon's table for the handover.
struct Taken {
    thread: String,
    m: Mounted,
}

impl Daemon {
    /// `octofs restart`: hands everything to a new daemon process (`exe`, else the binary now at
    /// this daemon's path); on success this process exits once the answer is written.
    pub(super) fn restart(&self, exe: Option<&Path>, c: &Caller) -> Reply<Restarted> {
        self.require_admin(c, "restart the daemon")?;
        if HANDING_OVER.swap(true, Ordering::SeqCst) {
            return Err(Error::Refused("a restart is already under way".into()));
        }
        match self.hand_over(exe) {
            Ok(r) => {
                tracing::info!(
                    new_pid = r.new_pid,
                    pause_ms = r.pause_ms,
                    "handed over to the new daemon"
                );
                EXIT_AFTER_ANSWER.store(true, Ordering::SeqCst);
                // Should the answer never be taken, exit anyway: the new daemon serves.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_secs(5));
                    exit_if_handed_over();
                });
                Ok((r, vec![]))
            }
            Err(why) => {
                HANDING_OVER.store(false, Ordering::SeqCst);
                tracing::warn!("restart failed, this daemon goes on serving: {why}");
                Err(Error::Refused(format!(
                    "restart failed, the running daemon goes on serving: {why}"
                )))
            }
        }
    }

    fn hand_over(&self, exe: Option<&Path>) -> Result<Restarted, String> {
        let deadline = Instant::now() + QUIESCE_TIMEOUT;
        // Only this request may run.
        while IN_FLIGHT.load(Ordering::SeqCst) > 1 {
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} control requests still running after {QUIESCE_TIMEOUT:?}",
                    IN_FLIGHT.load(Ordering::SeqCst) - 1
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // New workspaces' background syncs end in this process, before it goes.
        self.settle_all();
        let lock_file = LOCK_FILE
            .get()
            .ok_or("this daemon does not hold its lock file")?;
        // Every mounted thread's lock: the timers (sweep, release when idle) wait meanwhile.
        let threads: Vec<String> = lock(&self.mounts).keys().cloned().collect();
        let locks: Vec<_> = threads
            .iter()
            .map(|t| self.locks.get(&format!("thread:{t}")))
            .collect();
        let _guards = loop {
            let guards: Vec<_> = locks.iter().filter_map(|l| l.try_lock().ok()).collect();
            if guards.len() == locks.len() {
                break guards;
            }
            drop(guards);
            if Instant::now() >= deadline {
                return Err("a workspace stayed busy with another operation".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut taken: Vec<Taken> = {
            let mut mounts = lock(&self.mounts);
            threads
                .iter()
                .filter_map(|t| {
                    mounts.remove(t).map(|m| Taken {
                        thread: t.clone(),
                        m,
                    })
                })
                .collect()
        };
        let r = self.hand_over_taken(exe, lock_file, &mut taken);
        if r.is_err() {
            let mut mounts = lock(&self.mounts);
            for t in taken {
                mounts.insert(t.thread, t.m);
            }
        } else {
            // The new daemon serves these mounts now. Dropping a session unmounts (fuser's
            // `Mount`): that failed with EBUSY on a mount a process was using and took every idle
            // one away from the new daemon, leaving a bare directory. Nothing here may unmount.
            for t in taken {
                t.m.session.disown();
            }
        }
        r
    }

    fn hand_over_taken(
        &self,
        exe: Option<&Path>,
        lock_file: &File,
        taken: &mut [Taken],
    ) -> Result<Restarted, String> {
        for t in taken.iter() {
            if let Some(tr) = t.m.info.transport.get()
                && tr.starts_with("uring")
            {
                return Err(format!(
                    "thread {} is served over io_uring, whose rings cannot be handed over \
                     (serve with --transport dev to restart without unmounting)",
                    t.thread
                ));
            }
        }
        let exe = match exe {
            Some(p) => p.to_path_buf(),
            None => own_path()?,
        };
        let sock_path = self.layout.state.join("takeover.sock");
        let _ = std::fs::remove_file(&sock_path);
        let listener = UnixListener::bind(&sock_path)
            .map_err(|e| format!("cannot listen on {}: {e}", sock_path.display()))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot make {} private: {e}", sock_path.display()))?;
        }
        let child = Command::new(&exe)
            .arg("--state")
            .arg(&self.layout.state)
            .arg("--root")
            .arg(&self.layout.root)
            .arg("takeover-serve")
            .arg("--from")
            .arg(&sock_path)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", exe.display()));
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&sock_path);
                return Err(e);
            }
        };
        let started = Instant::now();
        let r = self.exchange(&listener, &mut child, started, lock_file, taken);
        let _ = std::fs::remove_file(&sock_path);
        match r {
            Ok(r) => Ok(r),
            Err(why) => {
                // The new process must never serve next to this one.
                let _ = child.kill();
                let _ = child.wait();
                for t in taken.iter() {
                    if let Err(e) = t.m.core.reopen_after_handover() {
                        tracing::error!(thread = %t.thread, "catalog: {e}");
                    }
                    t.m.session.resume_readers();
                    // The new process may have given the keeper its own descriptors before it
                    // was stopped: the keeper gets this daemon's again.
                    super::mounts::keep_mount(&t.thread, &t.m);
                }
                Err(why)
            }
        }
    }

    fn exchange(
        &self,
        listener: &UnixListener,
        child: &mut Child,
        started: Instant,
        lock_file: &File,
        taken: &mut [Taken],
    ) -> Result<Restarted, String> {
        let deadline = started + HANDOVER_TIMEOUT;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let mut s = accept_child(listener, child, deadline)?;
        s.set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        match read_frame(&mut s).map(serde_json::from_value::<ChildMsg>) {
            Ok(Ok(ChildMsg::Hello { .. })) => {}
            Ok(Ok(other)) => return Err(format!("the new daemon said {other:?}")),
            Ok(Err(e)) => return Err(format!("the new daemon said something else: {e}")),
            Err(e) => return Err(child_gone(child, &e)),
        }
        // Quiesce: from here requests wait in the kernel.
        let pause_start = Instant::now();
        for (i, t) in taken.iter().enumerate() {
            if let Err(e) = t.m.session.pause_readers(Duration::from_secs(5)) {
                for t in &taken[..i] {
                    t.m.session.resume_readers();
                }
                return Err(format!("thread {}: {e}", t.thread));
            }
        }
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut files_kept = Vec::new();
        let dup = |f: BorrowedFd<'_>| f.try_clone_to_owned().map_err(|e| e.to_string());
        fds.push(dup(lock_file.as_fd())?);
        let mut mounts = Vec::new();
        let mut handles = 0;
        for t in taken.iter() {
            let negotiated =
                t.m.session
                    .negotiated()
                    .ok_or_else(|| format!("thread {}: INIT state unknown", t.thread))?;
            let dev_fd = fds.len();
            fds.push(t.m.session.dup_dev_fd().map_err(|e| e.to_string())?);
            let (adapter, files) = crate::fs::fuse::export_state(&t.m.info, &t.m.core)
                .map_err(|e| format!("thread {}: {e}", t.thread))?;
            let mut idx = Vec::with_capacity(files.len());
            for f in &files {
                idx.push(fds.len());
                fds.push(dup(f.as_fd())?);
            }
            handles += files.len();
            files_kept.push(files);
            // The durable state, compacted with the clean mark: the new daemon loads it as at start.
            t.m.core.close();
            mounts.push(MountHandover {
                thread: t.thread.clone(),
                path: t.m.path.clone(),
                dev_fd,
                negotiated: NegotiatedState {
                    kernel_major: negotiated.kernel_major,
                    kernel_minor: negotiated.kernel_minor,
                    flags: negotiated.flags,
                    max_write: negotiated.max_write,
                    max_readahead: negotiated.max_readahead,
                },
                adapter,
                files: idx,
            });
        }
        let st = &self.settings;
        let handover = Handover {
            version: VERSION,
            old_pid: std::process::id(),
            settings: SettingsState {
                freshness_secs: st.freshness_secs,
                passthrough: st.passthrough,
                sweep_idle: st.sweep_idle,
                sweep_every: st.sweep_every,
                fetch_timeout_secs: st.fetch_timeout_secs,
                transport: transport_name(st.transport).into(),
                io: st.io.to_string(),
                max_threads_per_user: Some(st.max_threads_per_user),
                quota_per_user: st.quota_per_user,
                keep_connections: st.keep_connections,
                metrics: st.metrics.as_ref().map(|m| m.addr.to_string()),
                metrics_allow: st.metrics.as_ref().map(|m| m.allow.to_string()),
            },
            fds: fds.len(),
            lock_fd: 0,
            mounts,
        };
        let n_mounts = handover.mounts.len();
        write_frame(&mut s, &handover).map_err(|e| child_gone(child, &e))?;
        for chunk in fds.chunks(crate::sys::FDS_PER_MESSAGE) {
            let borrowed: Vec<BorrowedFd<'_>> = chunk.iter().map(|f| f.as_fd()).collect();
            crate::sys::send_fds(&s, &borrowed).map_err(|e| child_gone(child, &e))?;
        }
        s.set_read_timeout(Some(left()))
            .map_err(|e| e.to_string())?;
        let answer = read_frame(&mut s).map_err(|e| child_gone(child, &e))?;
        match serde_json::from_value::<ChildMsg>(answer) {
            Ok(ChildMsg::Serving { pid }) => {
                let pause_ms = pause_start.elapsed().as_secs_f64() * 1000.0;
                // The service manager follows the new process (this one is its main pid).
                super::notify::notify(&format!(
                    "MAINPID={pid}\nREADY=1\nSTATUS=serving workspaces (restarted)"
                ));
                Ok(Restarted {
                    old_pid: std::process::id(),
                    new_pid: pid,
                    mounts: n_mounts,
                    handles,
                    pause_ms,
                })
            }
            Ok(ChildMsg::Refused { why }) => Err(format!("the new daemon refused: {why}")),
            Ok(other) => Err(format!("the new daemon said {other:?}")),
            Err(e) => Err(format!("the new daemon said something else: {e}")),
        }
    }
}

/// The new process's connection, checked to come from it.
fn accept_child(
    listener: &UnixListener,
    child: &mut Child,
    deadline: Instant,
) -> Result<UnixStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(|e| e.to_string())?;
                match crate::sys::peer_pid(&s) {
                    Ok(pid) if pid == child.id() => return Ok(s),
                    // Someone else (root only: the socket is 0600): not the new daemon.
                    _ => continue,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("takeover socket: {e}")),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "the new daemon exited ({status}) before taking over"
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the new daemon did not connect within {HANDOVER_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Why the exchange with the new process broke off.
fn child_gone(child: &mut Child, e: &std::io::Error) -> String {
    std::thread::sleep(Duration::from_millis(20));
    match child.try_wait() {
        Ok(Some(status)) => format!("the new daemon exited ({status}) during the handover"),
        _ if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            format!("the new daemon did not answer within {HANDOVER_TIMEOUT:?}")
        }
        _ => format!("the handover connection broke: {e}"),
    }
}

/// Answers the old daemon with a refusal and exits at once: nothing made so far may be dropped
/// (a session would unmount).
fn refuse_and_exit(s: &mut UnixStream, why: &str) -> ! {
    tracing::error!("taking over failed: {why}");
    let _ = write_frame(
        s,
        &ChildMsg::Refused {
            why: why.to_string(),
        },
    );
    std::process::exit(1);
}

/// A mount of the handover, ready to be spawned.
struct Built {
    thread: String,
    path: PathBuf,
    session: fuser::Session<FuseAdapter>,
    info: Arc<MountInfo>,
    core: Arc<crate::fs::WorkspaceFs>,
    owner: crate::workspace::Owner,
    when_idle: bool,
    /// The mode the kernel has this mount in, held against the no-open budget.
    io: super::io_auto::Hold,
}

/// `octofs takeover-serve --from SOCKET`: the new daemon of a restart, started by the old one.
pub fn serve_takeover(layout: Layout, from: &Path) -> anyhow::Result<()> {
    crate::sys::fix_malloc_mmap_threshold();
    crate::sys::set_umask(0o077);
    let mut s = UnixStream::connect(from)
        .with_context(|| format!("cannot reach the old daemon at {}", from.display()))?;
    s.set_read_timeout(Some(HANDOVER_TIMEOUT))?;
    write_frame(
        &mut s,
        &ChildMsg::Hello {
            version: VERSION,
            pid: std::process::id(),
        },
    )?;
    let frame = read_frame(&mut s).context("no handover from the old daemon")?;
    let version = frame.get("version").and_then(|v| v.as_u64());
    if version != Some(u64::from(VERSION)) {
        refuse_and_exit(
            &mut s,
            &format!("handover version {version:?} unknown (this binary reads {VERSION})"),
        );
    }
    let h: Handover = match serde_json::from_value(frame) {
        Ok(h) => h,
        Err(e) => refuse_and_exit(&mut s, &format!("bad handover: {e}")),
    };
    let mut fds: Vec<Option<OwnedFd>> = Vec::with_capacity(h.fds);
    while fds.len() < h.fds {
        match crate::sys::recv_fds(&s) {
            Ok(got) => fds.extend(got.into_iter().map(Some)),
            Err(e) => refuse_and_exit(&mut s, &format!("receiving descriptors: {e}")),
        }
    }
    let fault = std::env::var(FAULT_ENV).unwrap_or_default();
    if fault == "exit" {
        std::process::exit(3);
    }
    let Some(lock_fd) = fds.get_mut(h.lock_fd).and_then(Option::take) else {
        refuse_and_exit(&mut s, "no lock file in the handover");
    };
    let lock_file = File::from(lock_fd);
    let transport = match h.settings.transport.parse::<Transport>() {
        Ok(t) => t,
        Err(e) => refuse_and_exit(&mut s, &e),
    };
    let io = match h.settings.io.as_str() {
        // An older daemon without the setting served every mount with handles.
        "" => super::io_auto::IoSetting::Mode(crate::fs::IoMode::Handles),
        m => match m.parse::<super::io_auto::IoSetting>() {
            Ok(io) => io,
            Err(e) => refuse_and_exit(&mut s, &e),
        },
    };
    let settings = Settings {
        io,
        freshness_secs: h.settings.freshness_secs,
        passthrough: h.settings.passthrough,
        sweep_idle: h.settings.sweep_idle,
        sweep_every: h.settings.sweep_every,
        fetch_timeout_secs: h.settings.fetch_timeout_secs,
        transport,
        max_threads_per_user: h
            .settings
            .max_threads_per_user
            .unwrap_or(super::limits::DEFAULT_MAX_THREADS_PER_USER),
        quota_per_user: h.settings.quota_per_user,
        keep_connections: h.settings.keep_connections,
        // An address or list this process cannot read (an older one wrote it) leaves it off.
        metrics: h.settings.metrics.as_deref().and_then(|a| {
            Some(super::metrics::Endpoint {
                addr: a.parse().ok()?,
                allow: h
                    .settings
                    .metrics_allow
                    .as_deref()
                    .unwrap_or("")
                    .parse()
                    .ok()?,
            })
        }),
    };
    crate::git::mirror::set_fetch_timeout(settings.fetch_timeout_secs);
    let daemon = match Daemon::new(layout.clone(), settings) {
        Ok(d) => Arc::new(d),
        Err(e) => refuse_and_exit(&mut s, &format!("{e:#}")),
    };
    let mut built: Vec<Built> = Vec::new();
    for m in h.mounts {
        if let Err(why) = build(&daemon, &layout, m, &mut fds, &mut built) {
            refuse_and_exit(&mut s, &why);
        }
    }
    if fault == "refuse" {
        refuse_and_exit(&mut s, "refused for a test (OCTOFS_TAKEOVER_FAULT=refuse)");
    }
    // Every mount is ready: from here this process serves them.
    let mut spawned = Vec::new();
    for b in built {
        let session = match b.session.spawn() {
            Ok(s) => s,
            // Mounts already spawned serve; this one cannot: nothing to answer but the truth.
            Err(e) => refuse_and_exit(&mut s, &format!("thread {}: {e}", b.thread)),
        };
        spawned.push((
            b.thread,
            b.path,
            session,
            b.info,
            b.core,
            b.owner,
            b.when_idle,
            b.io,
        ));
    }
    for (thread, path, session, info, core, owner, when_idle, io) in spawned {
        if when_idle {
            lock(&daemon.idle_waits).insert(thread.clone());
        }
        let dev = super::mounts::kernel_dev(&path, &thread);
        let name = thread.clone();
        let relative = core.clone();
        lock(&daemon.mounts).insert(
            thread,
            Mounted {
                path,
                session,
                info,
                core,
                owner,
                dev,
                io,
            },
        );
        // A workspace an older daemon mounted may still name the mirror by its host path: pointed
        // at the objects inside the mount as a mount does, now that it is served here.
        if let Ok(Some(rec)) = WorkspaceRecord::load(&layout, &name) {
            daemon.relative_alternates(&rec, &relative);
            daemon.tell_kernel(&name);
        }
    }
    tracing::info!(old_pid = h.old_pid, "took over every mount");
    // The keeper holds the old daemon's descriptors (its readers are paused: none holds a
    // request); it gets this one's instead.
    drop(super::fdstore::attach(&layout));
    if daemon.settings.keep_connections {
        drop(super::keeper::attach(&layout));
    }
    for (thread, m) in lock(&daemon.mounts).iter() {
        super::mounts::keep_mount(thread, m);
    }
    if super::fdstore::active() {
        // The service manager takes descriptors from the unit's main pid only (`NotifyAccess=
        // main`), which this process becomes once the old one said `MAINPID=` and exited: stored
        // again then.
        let (old, daemon) = (h.old_pid, daemon.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Path::new(&format!("/proc/{old}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            for (thread, m) in lock(&daemon.mounts).iter() {
                super::mounts::keep_mount(thread, m);
            }
        });
    }
    *lock(&ACK) = Some(s);
    remember_lock(&lock_file);
    if let Err(e) = crate::git::mirror::list(&layout) {
        tracing::error!("cannot load the projects: {e}");
    }
    daemon.prebuild_all_indexes();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(super::server::BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(super::server::run(daemon.clone()));
    super::notify::stopping();
    daemon.unmount_all();
    super::keeper::quit();
    let _ = std::fs::remove_file(layout.socket());
    drop(lock_file);
    result
}

/// Loads one handed-over mount's workspace and builds its session (not yet serving).
fn build(
    daemon: &Daemon,
    layout: &Layout,
    m: MountHandover,
    fds: &mut [Option<OwnedFd>],
    built: &mut Vec<Built>,
) -> Result<(), String> {
    let thread = m.thread;
    let mut take = |i: usize| {
        fds.get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| format!("thread {thread}: descriptor {i} missing"))
    };
    let dev = take(m.dev_fd)?;
    let files = m
        .files
        .iter()
        .map(|&i| take(i).map(File::from))
        .collect::<Result<Vec<_>, _>>()?;
    let rec = WorkspaceRecord::load(layout, &thread)
        .map_err(|e| format!("thread {thread}: {e}"))?
        .ok_or_else(|| format!("thread {thread}: no workspace record"))?;
    let core = daemon
        .load_core(&rec)
        .map_err(|e| format!("thread {thread}: {e}"))?;
    let info = Arc::new(MountInfo::default());
    let is_root = crate::sys::euid() == 0;
    // The mode the kernel has the mount in (the old daemon's INIT decided it), whatever the
    // record or this daemon's setting say; its bytes held as when it was mounted.
    let mode = if m.adapter.no_open {
        crate::fs::IoMode::NoOpen
    } else {
        crate::fs::IoMode::Handles
    };
    let bytes = match rec.io_auto {
        _ if mode == crate::fs::IoMode::Handles => 0,
        Some(c) => c.bytes,
        None => daemon.base_bytes(&rec),
    };
    let io = daemon.io_budget.hold(mode, bytes);
    let adapter = FuseAdapter::new(
        core.clone(),
        is_root && daemon.passthrough_for(rec.owner.uid),
        info.clone(),
    )
    .with_io(mode)
    .with_objects(daemon.mirror_objects(&rec));
    core.watch_kernel();
    let cfg = crate::fs::fuse::mount_config(&thread, is_root);
    let n = m.negotiated;
    let negotiated = fuser::Negotiated {
        kernel_major: n.kernel_major,
        kernel_minor: n.kernel_minor,
        flags: n.flags,
        max_write: n.max_write,
        max_readahead: n.max_readahead,
    };
    let session = crate::fs::fuse::adopt(adapter, dev, &m.path, &cfg, negotiated, m.adapter, files)
        .map_err(|e| format!("thread {thread}: {e}"))?;
    built.push(Built {
        thread: thread.clone(),
        path: m.path,
        session,
        info,
        core,
        owner: rec.owner,
        when_idle: rec.release_when_idle,
        io,
    });
    Ok(())
}

/// A daemon that died left its mounts' connections with the keeper (`keeper`): this one serves
/// them, through the same adoption as a handover (`build`), with what the durable state gives
/// (record, catalog, upper layer) instead of the old daemon's memory. Each workspace's visible
/// names are registered (the kernel still refers to the old daemon's inodes by their stable
/// numbers), the requests the dead daemon read and never answered are asked for again
/// (`FUSE_NOTIFY_RESEND`, before a reader runs), then the session serves and the keeper gets this
/// daemon's descriptors. A mount that cannot be adopted is detached and let go (it is mounted
/// again from its record, as after a crash without a keeper).
pub(super) fn adopt_kept(daemon: &Daemon, layout: &Layout, kept: Vec<super::keeper::Kept>) {
    for k in kept {
        let thread = k.thread.clone();
        let path = k.path.clone();
        let started = Instant::now();
        match adopt_one(daemon, layout, k) {
            Ok(names) => tracing::info!(
                %thread,
                names,
                ms = started.elapsed().as_millis() as u64,
                "adopted the mount of a daemon that died"
            ),
            Err(why) => {
                tracing::error!(%thread, "cannot adopt its mount ({why}): letting it go");
                let _ = crate::sys::lazy_unmount(&path);
                super::keeper::forget(&thread);
            }
        }
    }
}

fn adopt_one(daemon: &Daemon, layout: &Layout, k: super::keeper::Kept) -> Result<usize, String> {
    let thread = k.thread;
    let rec = WorkspaceRecord::load(layout, &thread)
        .map_err(|e| e.to_string())?
        .ok_or("no workspace record")?;
    if !rec.mounted {
        return Err("not recorded as mounted".into());
    }
    if k.path != layout.mountpoint(&thread) {
        return Err(format!(
            "kept for {}, not its mount point",
            k.path.display()
        ));
    }
    let mut fds = k.fds.into_iter();
    let dev = fds.next().ok_or("no descriptor kept")?;
    // The dead daemon's clones: requests it read from them are queued again below.
    let old_clones: Vec<OwnedFd> = fds.collect();
    let ask = dev.try_clone().map_err(|e| e.to_string())?;
    let m = MountHandover {
        thread: thread.clone(),
        path: k.path,
        dev_fd: 0,
        negotiated: k.meta.negotiated,
        adapter: AdapterState {
            passthrough: k.meta.passthrough,
            no_opendir: k.meta.no_opendir,
            no_open: k.meta.no_open,
            handles: Default::default(),
            nodes: Vec::new(),
        },
        files: Vec::new(),
    };
    let mut slots = vec![Some(dev)];
    let mut built = Vec::new();
    build(daemon, layout, m, &mut slots, &mut built)?;
    let b = built.pop().ok_or("nothing built")?;
    let names = b.core.register_all().map_err(|e| format!("{e:?}"))?;
    // Before any reader runs: a request read by a new reader and queued again would be served
    // twice.
    match crate::sys::fuse_notify_resend(ask.as_fd()) {
        Ok(()) => {}
        Err(e) => tracing::warn!(
            %thread,
            "the kernel cannot send again the requests the dead daemon held (FUSE_NOTIFY_RESEND, \
             Linux 6.9): {e}; a process waiting for one of them waits until killed"
        ),
    }
    let session = b.session.spawn().map_err(|e| e.to_string())?;
    drop(old_clones);
    if b.when_idle {
        lock(&daemon.idle_waits).insert(thread.clone());
    }
    let dev = super::mounts::kernel_dev(&b.path, &thread);
    let mounted = Mounted {
        path: b.path,
        session,
        info: b.info,
        core: b.core,
        owner: b.owner,
        dev,
        io: b.io,
    };
    super::mounts::keep_mount(&thread, &mounted);
    lock(&daemon.mounts).insert(thread, mounted);
    daemon.grant_owner(&rec.project, rec.owner, true);
    Ok(names)
}
