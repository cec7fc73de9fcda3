//! The control protocol between the CLI and the daemon: one JSON request line, one JSON response line,
//! over the Unix socket `<state>/octofs.sock`. Who is asking is never part of a request: the daemon
//! takes it from the socket's peer credentials.

use serde::{Deserialize, Serialize};

pub use crate::fs::stats::{OpStats, StatsReport};
pub use crate::git::mirror::Access;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Ping,
    MirrorAdd {
        project: String,
        upstream: String,
        /// The content of the caller's credential file (read by the CLI, as the caller).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credential: Option<String>,
        /// Who may bind the project (empty: any local user).
        #[serde(default)]
        access: Access,
    },
    /// Replaces who may bind a project (`access: None` only reads it).
    MirrorAccess {
        project: String,
        access: Option<Access>,
    },
    MirrorSync {
        project: String,
    },
    MirrorList,
    Open {
        thread: String,
        project: Option<String>,
        git_ref: Option<String>,
    },
    List,
    Status {
        thread: String,
    },
    /// git's fsmonitor hook (protocol v2): what changed in the thread's workspace since `token`.
    Fsmonitor {
        thread: String,
        token: String,
    },
    Snapshot {
        thread: String,
    },
    Release {
        thread: String,
        force: bool,
        /// Drop the workspace without saving it.
        #[serde(default)]
        discard: bool,
    },
    Sweep {
        idle_secs: u64,
    },
    Diff {
        thread: String,
        from: Option<String>,
        to: Option<String>,
        patch: bool,
    },
    /// Request statistics of one mounted thread (its owner or root), or of every mount (root).
    Stats {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread: Option<String>,
    },
    Stop,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub result: serde_json::Value,
}

impl Response {
    pub fn ok(result: serde_json::Value, warnings: Vec<String>) -> Response {
        Response {
            ok: true,
            error: None,
            warnings,
            result,
        }
    }
    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Default::default()
        }
    }
}

/// One workspace as `list` and `status` report it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkspaceStatus {
    pub thread: String,
    pub project: String,
    pub base_commit: String,
    pub branch: Option<String>,
    pub requested_ref: Option<String>,
    pub mounted: bool,
    pub path: String,
    /// Whether reads are handed to the kernel (FUSE passthrough); `None` when not mounted.
    pub passthrough: Option<bool>,
    /// The request transport ("uring (…)" or "dev (…)"); `None` when not mounted.
    #[serde(default)]
    pub transport: Option<String>,
    /// Paths that differ from the base (counted while mounted).
    pub changed_paths: u64,
    /// Files moved to `<state>/workspaces/<thread>/upper/quarantine` after an unclean stop.
    #[serde(default)]
    pub quarantined: u64,
    /// Catalog batches lost to damage (what each concerned), from `quarantine/README`.
    #[serde(default)]
    pub damaged: Vec<String>,
    pub last_snapshot: Option<String>,
    /// Opens of base content since the mount (content read from the blob cache).
    #[serde(default)]
    pub base_content_opens: u64,
    /// mounted, unmounted, or released.
    #[serde(default)]
    pub state: String,
    /// Overlapping users sharing the mount.
    #[serde(default)]
    pub users: u32,
    /// A chat workspace (no project; never saved).
    #[serde(default)]
    pub chat: bool,
}

/// The answer to an fsmonitor query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FsmonitorAnswer {
    pub token: String,
    /// Everything may have changed (unknown token): git rescans.
    pub everything: bool,
    pub paths: Vec<String>,
}

/// The answer to `stats`: each mounted workspace asked about, and their sum.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StatsAnswer {
    pub workspaces: Vec<WorkspaceStats>,
    pub total: StatsReport,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkspaceStats {
    pub thread: String,
    pub stats: StatsReport,
}
