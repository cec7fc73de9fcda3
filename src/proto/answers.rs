//! The answers of the control protocol (a response's `result`), one type per request's answer
//! (named by [`Call::Answer`](super::Call::Answer)): the daemon serializes them, the CLI, the
//! fsmonitor hook, doctor and the CSI plugin read them. Owns their fields and wire form only.

use serde::{Deserialize, Serialize};

use super::{Access, StatsReport};

/// The answer to `mirror progress`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchProgress {
    /// A `mirror add` or `mirror sync` of the project is running.
    pub running: bool,
    /// git's last progress line ("" before the first).
    pub line: String,
}

/// How `diff` prints: git's `--stat`, `--name-status` or the patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiffFormat {
    Stat,
    NameStatus,
    Patch,
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
    /// The bytes the workspace's upper layer holds, as counted against its owner's quota
    /// (docs/overlay.md "Quota"); `None` when not mounted.
    #[serde(default)]
    pub bytes_used: Option<u64>,
    /// The owner's bytes across their workspaces and their quota, when one counts them.
    #[serde(default)]
    pub owner_bytes: Option<u64>,
    #[serde(default)]
    pub owner_quota: Option<u64>,
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
    /// mounted, unmounted, released, or not mounted (recorded as mounted, but the kernel has no
    /// such mount: `open` or `doctor --fix` mounts it again).
    #[serde(default)]
    pub state: String,
    /// Overlapping users sharing the mount (each caller once).
    #[serde(default)]
    pub users: u32,
    /// Who they are: user names, or uids without a name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_names: Vec<String>,
    /// The thread's owner: a user name, or a uid without a name.
    #[serde(default)]
    pub owner: String,
    /// Set when the owner may no longer bind the project (`mirror access`): why git in the
    /// workspace cannot read the history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
    /// A chat workspace (no project; never saved).
    #[serde(default)]
    pub chat: bool,
    /// `release --when-idle` is pending: released once no process uses the mount.
    #[serde(default)]
    pub release_when_idle: bool,
    /// The dependency layers the workspace presents.
    #[serde(default)]
    pub layers: Vec<crate::deps::DepLayer>,
    /// One line per lockfile of the base whose layer the workspace does not present, and why
    /// (`npm layer not built (run octofs deps build)`).
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// How the mount serves file I/O ("handles" or "no-open"); `None` when not mounted.
    #[serde(default)]
    pub io: Option<String>,
    /// Why it has that mode: `asked` (`open --io`), `serve --io`, or what `serve --io auto`
    /// weighed (`auto: 210 MiB of 4.0 GiB budget`, `auto: budget full (…)`); `None` when not
    /// mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_why: Option<String>,
    /// What the thread keeps beside its snapshot's tree (nested repositories, names git refuses):
    /// one line naming them; `None` when nothing is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

/// The answer to a watch query.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchAnswer {
    /// Names the state after every entry below.
    pub token: String,
    /// The token given cannot be trusted (another daemon run, or too old): rescan.
    pub everything: bool,
    pub entries: Vec<WatchEntry>,
}

/// One change: a path (relative to the workspace root; a directory ends in `/`) and the token
/// that names the state just after it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchEntry {
    pub token: String,
    /// The path as UTF-8 (invalid bytes replaced).
    pub path: String,
    /// The path's bytes in hex, when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// What the path is now, as the workspace itself says (no symlink followed): `changed` (it
    /// exists), `directory` (a directory's listing changed) or `removed`.
    #[serde(default)]
    pub kind: String,
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
    /// How the mount serves file I/O ("handles" or "no-open") and why (as in `status`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_why: Option<String>,
}

/// The answer to `ping` ("pong") and `stop` ("stopping").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Ack(pub String);

/// The answer to `open`: where the thread's workspace is mounted (a JSON string on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Opened {
    pub path: String,
}

/// The answer to `snapshot`: the snapshot commit (a JSON string on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Snapshotted {
    pub commit: String,
}

/// The answer to `mirror access`: who may bind the project (the fields of [`Access`], so an
/// older reader of the answer still reads it), and the live threads the change concerns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessAnswer {
    #[serde(flatten)]
    pub access: Access,
    /// Live threads of the project whose owner lost (`revoked`) or regained (`granted`) the right
    /// to bind it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affected: Vec<AccessChange>,
}

/// One live thread a `mirror access` change concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessChange {
    pub thread: String,
    /// Its owner (a user name, or a uid without a name).
    pub owner: String,
    pub path: String,
    /// `revoked` or `granted`.
    pub change: String,
}

/// The answer to `release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseAnswer {
    pub thread: String,
    /// Whether the workspace is gone (false: other users still share it).
    pub released: bool,
    /// The thread was released before: nothing was done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already: bool,
    /// The users still sharing the workspace, when it was not released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<u32>,
    /// Who they are (user names, or uids without a name), when it was not released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_names: Vec<String>,
    /// The snapshot saved on the way out (none: discarded, a chat workspace, or not released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// `--when-idle` on a busy mount: the release waits for its last process to leave.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
}

/// The answer to `fork` and `teleport`: the new thread, where it is mounted and what it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forked {
    pub thread: String,
    pub project: String,
    pub path: String,
    /// The new thread's first snapshot (filed under its own ref), when it carries a state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The branch HEAD is on (none: detached).
    pub branch: Option<String>,
    /// Small ignored files copied across (`teleport` without a project).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored_copied: Vec<String>,
}

/// The answer to `sweep`: the threads released, and the ones kept with why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepAnswer {
    pub released: Vec<String>,
    pub kept: Vec<Kept>,
}

/// A workspace `sweep` kept, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub thread: String,
    pub why: String,
}

/// The answer to `diff`: the two trees compared, and git's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffAnswer {
    pub from: String,
    pub to: String,
    pub diff: String,
}

/// How `octofs commit` records the change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CommitMode {
    /// A new commit on top of HEAD.
    #[default]
    Commit,
    /// A new commit on top of HEAD titled `fixup! <anchor's subject>` (for `git rebase --autosquash`).
    Fixup,
    /// HEAD replaced by a commit with HEAD's parents, the working state and the new (or HEAD's) message.
    Amend,
}

/// The answer to `commit`: the new commit (a JSON string on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Committed {
    pub commit: String,
}

/// The answer to `push`: the remote branch and the commit it now names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pushed {
    pub branch: String,
    pub commit: String,
}

/// The answer to `export`: what was (or, with `dry_run`, would be) written into the folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exported {
    pub thread: String,
    pub project: String,
    pub folder: String,
    pub dry_run: bool,
    /// The thread's snapshot that was exported.
    pub snapshot: String,
    /// The mirror's commit of the folder afterwards (before, for a dry run).
    pub commit: Option<String>,
    pub changes: Vec<ExportChange>,
}

/// One path `export` writes: `A` (created), `M` (replaced) or `D` (deleted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportChange {
    pub status: String,
    pub path: String,
}

/// The answer to `resync`: what happened to the workspace (`action`: fast-forward, reset,
/// up-to-date or refused, with the reason), HEAD before (`from`) and the upstream tip (`to`), the
/// snapshot a reviewer's state was saved as, and how many paths changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resynced {
    pub thread: String,
    pub role: String,
    pub action: String,
    pub from: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    pub changed_paths: u64,
    /// The workspace's base (its lower layer) moved to the tip: `status` counts no change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub base_moved: bool,
}

/// The answer to `snapshot --name`: the named snapshot (or, without a name, the thread's), the
/// thread's snapshot, and where it was pushed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedSnapshot {
    pub commit: String,
    pub snapshot: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed: Option<String>,
}

/// The answer to `pull`: the snapshot applied, the paths written or removed, and the snapshot
/// that saved the local changes first (`--force`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pulled {
    pub commit: String,
    pub changed: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_first: Option<String>,
}

/// `octofs restart`: the old and new daemon, what was handed over, and how long requests waited.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Restarted {
    pub old_pid: u32,
    pub new_pid: u32,
    pub mounts: usize,
    /// Open file handles handed over.
    pub handles: usize,
    /// From pausing the first mount's readers to the new daemon serving (ms).
    pub pause_ms: f64,
}
