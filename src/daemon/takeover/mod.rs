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
//! Files: `mod.rs` the protocol (the frame, what it carries, the in-flight gate), `give.rs` the
//! old side, `take.rs` the new side and the adoption of kept mounts, `error.rs` why either failed.
//!
//! Owns the protocol and the order of the steps; what a mount's state is belongs to the adapter
//! (`fs::fuse`), the handles and the core.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::error::Error;
use super::lock;
use super::refusal::RestartRefusal;
use crate::fs::fuse::AdapterState;
use crate::fs::uring::Transport;

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
        return Err(RestartRefusal::Restarting.into());
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
    /// A ring mount's memory (absent: `/dev/fuse`, or an older daemon's handover) and the index of
    /// its memfd among the descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ring: Option<crate::fs::uring::RingGeometry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ring_fd: Option<usize>,
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
fn own_path() -> Result<PathBuf, HandoverError> {
    let exe = std::fs::read_link("/proc/self/exe").map_err(HandoverError::OwnPath)?;
    let s = exe.to_string_lossy();
    Ok(match s.strip_suffix(" (deleted)") {
        Some(p) => PathBuf::from(p),
        None => exe,
    })
}

mod error;
mod give;
mod take;

use error::AdoptError;
pub(super) use error::HandoverError;

pub(super) use take::adopt_kept;
pub use take::serve_takeover;
