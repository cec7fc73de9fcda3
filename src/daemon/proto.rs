//! The control protocol between the CLI and the daemon: one JSON request line, one JSON response line,
//! over the Unix socket `<state>/octofs.sock`. Who is asking is never part of a request: the daemon
//! takes it from the socket's peer credentials.
//!
//! Every command's answer (the response's `result`) has a type here, which the daemon serializes
//! and the CLI reads: `mirror add` and `mirror list` [`MirrorInfo`], `mirror access` [`AccessAnswer`],
//! `mirror sync` [`SyncOutcome`], `open` [`Opened`], `list` and `status` [`WorkspaceStatus`],
//! `fsmonitor` [`FsmonitorAnswer`], `snapshot` [`Snapshotted`], `release` [`ReleaseAnswer`],
//! `sweep` [`SweepAnswer`], `diff` [`DiffAnswer`], `stats` [`StatsAnswer`], `watch` [`WatchAnswer`],
//! `metrics` a string (Prometheus text format), `ping` and `stop` [`Ack`], `fork` and `teleport` [`Forked`], `release --when-idle`
//! [`ReleaseAnswer`], `deps build` [`BuildAnswer`], `deps list` [`LayerInfo`], `deps gc`
//! [`GcAnswer`], `deps progress` [`ProgressAnswer`], `export` [`Exported`], `resync` [`Resynced`],
//! `snapshot --name` [`NamedSnapshot`], `pull` [`Pulled`], `mirror set` [`MirrorInfo`], `restart`
//! [`Restarted`].

use serde::{Deserialize, Serialize};

pub use crate::deps::build::{BuildAnswer, Outcome, OutcomeKind, ProgressAnswer, ProgressEvent};
pub use crate::deps::gc::{GcAnswer, LayerInfo, Removed};
pub use crate::fs::stats::{OpStats, StatsReport};
pub use crate::git::mirror::{Access, MirrorInfo, SyncOutcome, is_url};

/// Refuses, before it is sent, an upstream the daemon would refuse (the daemon's own check).
pub fn check_upstream(upstream: &str) -> Result<(), String> {
    crate::git::mirror::check_upstream(upstream).map_err(|e| e.to_string())
}

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
        /// The thread's I/O mode (none: as it was, else the daemon's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        io: Option<crate::fs::fuse::IoMode>,
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
        /// `stat` or `name-status` (default: the patch when `patch`, else name-status).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        format: Option<DiffFormat>,
    },
    /// Request statistics of one mounted thread (its owner or root), or of every mount (root).
    Stats {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread: Option<String>,
    },
    /// `octofs metrics`: the daemon's metrics in Prometheus text format (root or the daemon's user).
    Metrics,
    Stop,
    /// `octofs watch`: the thread's journal entries after `token` (empty: from now).
    Watch {
        thread: String,
        #[serde(default)]
        token: String,
    },
    /// A new thread `to` with `from`'s current state (a fork of its own, on a branch of its own).
    Fork {
        from: String,
        to: String,
    },
    /// Binds `to` to `project` at `git_ref`; without a project, carries `from`'s state (and its
    /// small ignored files) to `to`.
    Teleport {
        from: String,
        to: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        project: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        git_ref: Option<String>,
    },
    /// `release --when-idle`: answers at once; the release happens when no process uses the mount.
    ReleaseWhenIdle {
        thread: String,
    },
    /// `octofs commit`: the working state (or the listed paths) on the workspace's branch.
    Commit {
        thread: String,
        /// May be empty only with `amend` (HEAD's message is kept).
        message: String,
        #[serde(default)]
        paths: Vec<String>,
        #[serde(default)]
        gates: Vec<String>,
        #[serde(default)]
        mode: CommitMode,
        /// The commit a `fixup` fixes (any revision the workspace's HEAD reaches).
        #[serde(default)]
        anchor: Option<String>,
    },
    /// `octofs push`: the workspace's branch from the mirror to a remote.
    Push {
        thread: String,
        #[serde(default)]
        remote: Option<String>,
        #[serde(default)]
        branch: Option<String>,
        #[serde(default)]
        lease: Option<String>,
        #[serde(default)]
        gates: Vec<String>,
    },
    /// `octofs deps build`: the missing (or failed) dependency layers of a project's commit (its
    /// default branch when no ref is given).
    DepsBuild {
        project: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        git_ref: Option<String>,
    },
    /// `octofs deps list`: every dependency layer of the host.
    DepsList,
    /// `octofs deps gc`: removes the layers nothing uses.
    DepsGc,
    /// What the dependency builds of `project` reported after event `after` (the CLI polls it
    /// while `mirror add/sync` runs, to show progress on a terminal).
    DepsProgress {
        project: String,
        #[serde(default)]
        after: u64,
    },
    /// `octofs export`: the thread's saved state written back into its project's folder.
    Export {
        thread: String,
        #[serde(default)]
        dry_run: bool,
    },
    /// `octofs resync`: the workspace brought to its upstream tip as `role` (developer or
    /// reviewer) allows.
    Resync {
        thread: String,
        role: String,
    },
    /// `octofs snapshot --name N [--push REMOTE]`: the thread's snapshot, filed also as
    /// `refs/snapshots/N`, and pushed to REMOTE as a fast-forward.
    SnapshotNamed {
        thread: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        push: Option<String>,
    },
    /// `octofs pull`: `refs/snapshots/<name>` of `remote` applied to the workspace as
    /// uncommitted changes (fast-forward only).
    Pull {
        thread: String,
        remote: String,
        name: String,
        #[serde(default)]
        force: bool,
    },
    /// `octofs mirror set P --share REMOTE`: sets (or, with `None`, clears) the share remote.
    MirrorShare {
        project: String,
        share: Option<String>,
    },
    /// `octofs mirror set P --exclude PATTERN… | --no-excludes`: replaces the project's excludes.
    MirrorExcludes {
        project: String,
        excludes: Vec<String>,
    },
    /// git's progress in the clone or fetch `mirror add`/`mirror sync` of `project` runs.
    MirrorProgress {
        project: String,
    },
    /// Ends the clone or fetch (and skips the layer builds) `mirror add`/`mirror sync` of
    /// `project` runs; that request then fails having kept nothing (Ctrl-C of the CLI).
    MirrorCancel {
        project: String,
    },
    /// `octofs restart`: hand every mount to a new daemon process started from `exe` (default:
    /// the binary now at the daemon's path), without unmounting.
    Restart {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exe: Option<std::path::PathBuf>,
    },
    /// `doctor --fix`: mounts again a thread recorded as mounted that the kernel has no mount of
    /// (its users unchanged). Root (or the daemon's user) only.
    Remount {
        thread: String,
    },
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire stays what the CLI of the previous release read by key.
    #[test]
    fn answers_keep_their_wire_form() {
        let v = serde_json::to_value(Opened {
            path: "/r/t".into(),
        })
        .unwrap();
        assert_eq!(v, serde_json::json!("/r/t"));
        let r = ReleaseAnswer {
            thread: "t".into(),
            released: false,
            already: false,
            users: Some(2),
            user_names: Vec::new(),
            snapshot: None,
            pending: false,
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"thread": "t", "released": false, "users": 2})
        );
        let back: ReleaseAnswer = serde_json::from_value(
            serde_json::json!({"thread": "t", "released": true, "already": true}),
        )
        .unwrap();
        assert!(back.already && back.released && back.snapshot.is_none());
        let s = SweepAnswer {
            released: vec!["a".into()],
            kept: vec![Kept {
                thread: "b".into(),
                why: "active".into(),
            }],
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"released": ["a"], "kept": [{"thread": "b", "why": "active"}]})
        );
    }

    /// Every checked-in request and answer line reads and writes back byte for byte: a field
    /// renamed, reordered, dropped or newly written changes the wire, and fails here
    /// (`src/proto/requests.jsonl`, `src/proto/answers.tsv`).
    #[test]
    fn the_wire_is_the_checked_in_one() {
        fn same<T: serde::de::DeserializeOwned + Serialize>(line: &str) {
            let v: T = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(serde_json::to_string(&v).unwrap(), line);
        }
        let requests = include_str!("../proto/requests.jsonl");
        for line in requests.lines() {
            same::<Request>(line);
        }
        let answers = include_str!("../proto/answers.tsv");
        for row in answers.lines() {
            let (kind, line) = row.split_once('\t').expect("kind<TAB>json");
            match kind {
                "response" => same::<Response>(line),
                "ack" => same::<Ack>(line),
                "opened" => same::<Opened>(line),
                "snapshotted" => same::<Snapshotted>(line),
                "committed" => same::<Committed>(line),
                "status" => same::<WorkspaceStatus>(line),
                "release" => same::<ReleaseAnswer>(line),
                "forked" => same::<Forked>(line),
                "sweep" => same::<SweepAnswer>(line),
                "diff" => same::<DiffAnswer>(line),
                "pushed" => same::<Pushed>(line),
                "watch" => same::<WatchAnswer>(line),
                "fsmonitor" => same::<FsmonitorAnswer>(line),
                "access" => same::<AccessAnswer>(line),
                "resynced" => same::<Resynced>(line),
                "pulled" => same::<Pulled>(line),
                "named" => same::<NamedSnapshot>(line),
                "exported" => same::<Exported>(line),
                "restarted" => same::<Restarted>(line),
                "progress" => same::<FetchProgress>(line),
                _ => panic!("unknown kind {kind}"),
            }
        }
    }
}
