//! A thread's workspace record: which project it is bound to, the base it is forked from, and whether
//! it should be mounted. Kept at `<state>/workspaces/<thread>/workspace.json`, written atomically.
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
