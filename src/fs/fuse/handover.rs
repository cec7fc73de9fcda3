//! A mount's adapter handed to another daemon process (`octofs restart`, `crate::daemon::takeover`,
//! `docs/restart.md`): what the kernel depends on ([`AdapterState`]: the INIT outcome acted on, the
//! open handles with their backing ids, the core's live nodes) exported from the old process, and a
//! session made in the new one from the connection, already initialized, with that state adopted.
//! The handles' files travel alongside as descriptors.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::BackingId;

use super::FuseAdapter;
use crate::fs::WorkspaceFs;
use crate::fs::handles::HandlesState;
use crate::fs::mount::MountInfo;
use crate::fs::workspace::NodeState;

/// What one mount's adapter holds that the kernel depends on, as handed to another daemon process
/// (`crate::daemon::takeover`): the INIT outcome it acted on, its open handles and the core's live
/// nodes. The handles' files travel alongside as descriptors.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AdapterState {
    pub passthrough: bool,
    pub no_opendir: bool,
    /// The mount runs in no-open mode (absent in a handover from a daemon without it: no).
    #[serde(default)]
    pub no_open: bool,
    pub handles: HandlesState,
    pub nodes: Vec<NodeState>,
}

/// The state of the adapter serving `core` with `info`, and each handle's file (same order as
/// `handles.handles`). Call it while the mount's readers are paused.
pub fn export_state(
    info: &MountInfo,
    core: &WorkspaceFs,
) -> std::io::Result<(AdapterState, Vec<Arc<File>>)> {
    let handles = info
        .handles
        .get()
        .ok_or_else(|| std::io::Error::other("the mount has no adapter"))?;
    // Files a no-open mount holds by inode are not handed over: released here (their writes
    // noted, the nodes' open counts settled), the new daemon opens them again at the next READ or
    // WRITE; if the handover fails this daemon does the same.
    if let Some(io) = info.inode_io.get() {
        io.release_all();
    }
    let (handles, files) = handles.export_state(BackingId::raw);
    let state = AdapterState {
        passthrough: info.passthrough.load(Ordering::Relaxed),
        no_opendir: info.no_opendir.load(Ordering::Relaxed),
        no_open: info.no_open.load(Ordering::Relaxed),
        handles,
        nodes: core.export_nodes(),
    };
    Ok((state, files))
}

/// Serves a mount another daemon process made and handed over (`crate::daemon::takeover`): its
/// connection `fd`, already initialized (`negotiated`), with the adapter given the old process's
/// handles (`files` in the order of `state.handles.handles`), backing ids and node references.
/// Nothing is served until the caller spawns the session; dropping it unmounts.
pub fn adopt(
    adapter: FuseAdapter,
    fd: std::os::fd::OwnedFd,
    mountpoint: &Path,
    cfg: &fuser::Config,
    negotiated: fuser::Negotiated,
    state: AdapterState,
    files: Vec<File>,
) -> std::io::Result<fuser::Session<FuseAdapter>> {
    let info = adapter.info().clone();
    info.passthrough.store(state.passthrough, Ordering::Relaxed);
    info.no_opendir.store(state.no_opendir, Ordering::Relaxed);
    info.no_open.store(state.no_open, Ordering::Relaxed);
    // The transport is set when the session is spawned (`fs::uring::serve_adopted`).
    adapter.files().core().import_nodes(state.nodes);
    let mut session =
        fuser::Session::from_fd_initialized(adapter, fd, mountpoint, cfg.clone(), negotiated)?;
    let mut ids = std::collections::HashMap::new();
    for h in &state.handles.handles {
        if let Some(id) = h.backing {
            ids.entry(id).or_insert_with(|| session.adopt_backing(id));
        }
    }
    let fs = session
        .filesystem_mut()
        .ok_or_else(|| std::io::Error::other("the session has no filesystem"))?;
    fs.files()
        .handles()
        .import_state(state.handles, files, |id| ids.remove(&id))
        .map_err(std::io::Error::other)?;
    Ok(session)
}
