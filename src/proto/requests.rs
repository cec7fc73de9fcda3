//! One struct per request of the control protocol, each naming its answer ([`Call`]). A request
//! is its fields beside `"cmd"` on the wire (`{"cmd":"commit","thread":"t1",…}`); the daemon
//! dispatches on the [`Request`] variant and hands the struct on as it came. Owns the requests'
//! fields and their wire form only: no checking (the daemon validates), no I/O.

use serde::{Deserialize, Serialize};

use super::{
    AccessAnswer, Ack, BuildAnswer, Call, CommitMode, Committed, DiffAnswer, DiffFormat, Exported,
    FetchProgress, Forked, FsmonitorAnswer, GcAnswer, LayerInfo, MirrorInfo, NamedSnapshot, Opened,
    ProgressAnswer, Pulled, Pushed, ReleaseAnswer, Request, Restarted, Resynced, Snapshotted,
    StatsAnswer, SweepAnswer, SyncOutcome, WatchAnswer, WorkspaceStatus,
};
use crate::git::mirror::Access;

/// A request with no field: `{"cmd":"<name>"}`, a unit variant of [`Request`].
macro_rules! bare {
    ($($(#[$doc:meta])* $name:ident => $answer:ty;)*) => {$(
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name;
        impl From<$name> for Request {
            fn from(_: $name) -> Request {
                Request::$name
            }
        }
        impl Call for $name {
            type Answer = $answer;
        }
    )*};
}

/// A request with fields: a newtype variant of [`Request`] holding the struct.
macro_rules! with_fields {
    ($($name:ident => $answer:ty;)*) => {$(
        impl From<$name> for Request {
            fn from(r: $name) -> Request {
                Request::$name(r)
            }
        }
        impl Call for $name {
            type Answer = $answer;
        }
    )*};
}

bare! {
    /// Whether a daemon answers ("pong").
    Ping => Ack;
    /// `octofs mirror list`: the mirrors the caller may see.
    MirrorList => Vec<MirrorInfo>;
    /// `octofs list`: the caller's workspaces (root: every one).
    List => Vec<WorkspaceStatus>;
    /// `octofs metrics`: the daemon's metrics in Prometheus text format (root or the daemon's user).
    Metrics => String;
    /// `octofs stop` ("stopping").
    Stop => Ack;
    /// `octofs deps list`: every dependency layer of the host.
    DepsList => Vec<LayerInfo>;
    /// `octofs deps gc`: removes the layers nothing uses.
    DepsGc => GcAnswer;
}

with_fields! {
    MirrorAdd => MirrorInfo;
    MirrorAccess => AccessAnswer;
    MirrorSync => SyncOutcome;
    Open => Opened;
    Status => WorkspaceStatus;
    Fsmonitor => FsmonitorAnswer;
    Snapshot => Snapshotted;
    Release => ReleaseAnswer;
    Sweep => SweepAnswer;
    Diff => DiffAnswer;
    Stats => StatsAnswer;
    Watch => WatchAnswer;
    Fork => Forked;
    Teleport => Forked;
    ReleaseWhenIdle => ReleaseAnswer;
    Commit => Committed;
    Push => Pushed;
    DepsBuild => BuildAnswer;
    DepsProgress => ProgressAnswer;
    Export => Exported;
    Resync => Resynced;
    SnapshotNamed => NamedSnapshot;
    Pull => Pulled;
    MirrorShare => MirrorInfo;
    MirrorExcludes => MirrorInfo;
    MirrorProgress => FetchProgress;
    MirrorCancel => Ack;
    Restart => Restarted;
    Remount => bool;
}

/// `octofs mirror add`: a project's mirror from an upstream.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorAdd {
    pub project: String,
    pub upstream: String,
    /// The content of the caller's credential file (read by the CLI, as the caller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
    /// Who may bind the project (empty: any local user).
    #[serde(default)]
    pub access: Access,
}

/// Replaces who may bind a project (`access: None` only reads it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorAccess {
    pub project: String,
    pub access: Option<Access>,
}

/// `octofs mirror sync`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorSync {
    pub project: String,
}

/// `octofs open`: mounts the thread's workspace (forking it on first use).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Open {
    pub thread: String,
    pub project: Option<String>,
    pub git_ref: Option<String>,
    /// The thread's I/O mode (none: as it was, else the daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<crate::fs::IoMode>,
}

/// `octofs status` (and `path`, and the CLI's hooks): one workspace.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub thread: String,
}

/// git's fsmonitor hook (protocol v2): what changed in the thread's workspace since `token`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fsmonitor {
    pub thread: String,
    pub token: String,
}

/// `octofs snapshot`: the thread's working state as a commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Snapshot {
    pub thread: String,
}

/// `octofs release`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Release {
    pub thread: String,
    pub force: bool,
    /// Drop the workspace without saving it.
    #[serde(default)]
    pub discard: bool,
}

/// `octofs sweep`: releases every workspace idle past `idle_secs` whose state is saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sweep {
    pub idle_secs: u64,
}

/// `octofs diff`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Diff {
    pub thread: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub patch: bool,
    /// `stat` or `name-status` (default: the patch when `patch`, else name-status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<DiffFormat>,
}

impl Diff {
    /// The format asked for: `format`, else the patch when `patch`, else name-status.
    pub fn format(&self) -> DiffFormat {
        self.format.unwrap_or(if self.patch {
            DiffFormat::Patch
        } else {
            DiffFormat::NameStatus
        })
    }
}

/// Request statistics of one mounted thread (its owner or root), or of every mount (root).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Stats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
}

/// `octofs watch`: the thread's journal entries after `token` (empty: from now).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Watch {
    pub thread: String,
    #[serde(default)]
    pub token: String,
}

/// A new thread `to` with `from`'s current state (a fork of its own, on a branch of its own).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fork {
    pub from: String,
    pub to: String,
}

/// Binds `to` to `project` at `git_ref`; without a project, carries `from`'s state (and its
/// small ignored files) to `to`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Teleport {
    pub from: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
}

/// `release --when-idle`: answers at once; the release happens when no process uses the mount.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseWhenIdle {
    pub thread: String,
}

/// `octofs commit`: the working state (or the listed paths) on the workspace's branch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Commit {
    pub thread: String,
    /// May be empty only with `amend` (HEAD's message is kept).
    pub message: String,
    #[serde(default)]
    pub paths: Vec<String>,
    #[serde(default)]
    pub gates: Vec<String>,
    #[serde(default)]
    pub mode: CommitMode,
    /// The commit a `fixup` fixes (any revision the workspace's HEAD reaches).
    #[serde(default)]
    pub anchor: Option<String>,
}

/// `octofs push`: the workspace's branch from the mirror to a remote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Push {
    pub thread: String,
    #[serde(default)]
    pub remote: Option<String>,
    #[serde(default)]
    pub branch: Option<String>,
    #[serde(default)]
    pub lease: Option<String>,
    #[serde(default)]
    pub gates: Vec<String>,
}

/// `octofs deps build`: the missing (or failed) dependency layers of a project's commit (its
/// default branch when no ref is given).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DepsBuild {
    pub project: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
}

/// What the dependency builds of `project` reported after event `after` (the CLI polls it
/// while `mirror add/sync` runs, to show progress on a terminal).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DepsProgress {
    pub project: String,
    #[serde(default)]
    pub after: u64,
}

/// `octofs export`: the thread's saved state written back into its project's folder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Export {
    pub thread: String,
    #[serde(default)]
    pub dry_run: bool,
}

/// `octofs resync`: the workspace brought to its upstream tip as `role` (developer or
/// reviewer) allows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resync {
    pub thread: String,
    pub role: String,
}

/// `octofs snapshot --name N [--push REMOTE]`: the thread's snapshot, filed also as
/// `refs/snapshots/N`, and pushed to REMOTE as a fast-forward.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotNamed {
    pub thread: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<String>,
}

/// `octofs pull`: `refs/snapshots/<name>` of `remote` applied to the workspace as
/// uncommitted changes (fast-forward only).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pull {
    pub thread: String,
    pub remote: String,
    pub name: String,
    #[serde(default)]
    pub force: bool,
}

/// `octofs mirror set P --share REMOTE`: sets (or, with `None`, clears) the share remote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorShare {
    pub project: String,
    pub share: Option<String>,
}

/// `octofs mirror set P --exclude PATTERN… | --no-excludes`: replaces the project's excludes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorExcludes {
    pub project: String,
    pub excludes: Vec<String>,
}

/// git's progress in the clone or fetch `mirror add`/`mirror sync` of `project` runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorProgress {
    pub project: String,
}

/// Ends the clone or fetch (and skips the layer builds) `mirror add`/`mirror sync` of
/// `project` runs; that request then fails having kept nothing (Ctrl-C of the CLI).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorCancel {
    pub project: String,
}

/// `octofs restart`: hand every mount to a new daemon process started from `exe` (default:
/// the binary now at the daemon's path), without unmounting.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Restart {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<std::path::PathBuf>,
}

/// `doctor --fix`: mounts again a thread recorded as mounted that the kernel has no mount of
/// (its users unchanged). Root (or the daemon's user) only. Answers whether it mounted it; the
/// notes (files moved in) come as warnings.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Remount {
    pub thread: String,
}
