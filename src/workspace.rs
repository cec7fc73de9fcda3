//! A thread's durable records, written atomically:
//! - its [`Binding`] (`<state>/threads/<thread>.json`): the project it is bound to (once, for good),
//!   which survives release so that the thread can be resumed and never re-bound;
//! - its live [`WorkspaceRecord`] (`<state>/workspaces/<thread>/workspace.json`): the base the
//!   workspace is forked from, whether it should be mounted, and what its last snapshot saw. It goes
//!   with the rest of `<state>/workspaces/<thread>` when the thread is released.
//!
//! This module only stores and loads records; mounting is the daemon's job.

use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::layout::Layout;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    pub thread: String,
    pub project: String,
    /// The base commit (hex) and its tree: the lower layer of the workspace.
    pub base_commit: String,
    pub base_tree: String,
    /// The base commit's committer time (Unix seconds): the times unmodified files present.
    pub base_time: i64,
    /// The ref the caller asked for, when they named one.
    pub requested_ref: Option<String>,
    /// The branch the workspace is on, when the base was a branch.
    pub branch: Option<String>,
    /// Unix seconds of creation.
    pub created: u64,
    /// Whether the daemon should serve this workspace (remounted after a restart).
    pub mounted: bool,
    /// A chat workspace: a fork of the blank repository, never saved, discarded on release.
    #[serde(default)]
    pub chat: bool,
    /// What the mirror has seen of this workspace: the state at its last snapshot (or at fork).
    #[serde(default)]
    pub saved: Option<SavedMark>,
}

/// The workspace state the mirror has seen.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedMark {
    /// The snapshot commit (None: the state is the fork's base, which the mirror has).
    pub commit: Option<String>,
    /// The workspace generation and the time of the view the snapshot was built from.
    pub generation: u64,
    pub at: crate::cow::catalog::Ts,
    /// Inodes of octofs's own bookkeeping files (not changes of the state).
    #[serde(default)]
    pub bookkeeping: Vec<u64>,
}

/// A thread's binding to its project, kept across release.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Binding {
    pub thread: String,
    pub project: String,
    /// Where the thread was first forked (resumed from when it was released with no snapshot).
    pub base_commit: String,
    pub branch: Option<String>,
    pub created: u64,
}

impl Binding {
    fn path(layout: &Layout, thread: &str) -> std::path::PathBuf {
        layout.state.join("threads").join(format!("{thread}.json"))
    }

    pub fn load(layout: &Layout, thread: &str) -> Result<Option<Binding>, String> {
        let path = Self::path(layout, thread);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("thread {thread}: corrupt {}: {e}", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "thread {thread}: cannot read {}: {e}",
                path.display()
            )),
        }
    }

    pub fn save(&self, layout: &Layout) -> Result<(), String> {
        let path = Self::path(layout, &self.thread);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        write_atomic(&path, &bytes).map_err(|e| format!("cannot save thread {}: {e}", self.thread))
    }

    /// Every binding, sorted by thread.
    pub fn list(layout: &Layout) -> Result<Vec<Binding>, String> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(layout.state.join("threads")) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(format!("cannot list threads: {e}")),
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(thread) = name.strip_suffix(".json")
                && let Some(b) = Self::load(layout, thread)?
            {
                out.push(b);
            }
        }
        out.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok(out)
    }
}

const RECORD: &str = "workspace.json";

/// Writes `bytes` to `path` durably: temp file, fsync, rename, fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

impl WorkspaceRecord {
    pub fn load(layout: &Layout, thread: &str) -> Result<Option<WorkspaceRecord>, String> {
        let path = layout.workspace(thread).join(RECORD);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("thread {thread}: corrupt {}: {e}", path.display())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "thread {thread}: cannot read {}: {e}",
                path.display()
            )),
        }
    }

    pub fn save(&self, layout: &Layout) -> Result<(), String> {
        let dir = layout.workspace(&self.thread);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        write_atomic(&dir.join(RECORD), &bytes)
            .map_err(|e| format!("cannot save workspace {}: {e}", self.thread))
    }

    /// Every workspace record, sorted by thread.
    pub fn list(layout: &Layout) -> Result<Vec<WorkspaceRecord>, String> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(layout.workspaces()) {
            Ok(d) => d,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(format!("cannot list workspaces: {e}")),
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if crate::names::validate(crate::names::NameKind::Thread, &name).is_err() {
                continue;
            }
            if let Some(r) = Self::load(layout, &name)? {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok(out)
    }
}
