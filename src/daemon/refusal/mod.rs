//! Why the daemon refused a request, as data: one enum per area (the request line, gates, commit,
//! push, pull, snapshots, moves, re-sync, export, diff, limits, mirrors, dependency layers,
//! restart, workspaces and their mounts; `open` and `release` keep theirs in `super::lifecycle`),
//! each variant carrying what the refusal is about (thread, project, ref, path…). Its
//! `Display` is the one line the CLI prints, byte for byte what the tests and users see.
//!
//! Owns only the refusals' shapes and texts; deciding to refuse is the requests' modules'. Must
//! not do I/O, and must not change a text without its tests (they compare the lines).

use std::path::PathBuf;

use gix::ObjectId;

use super::error::Error;
use super::lifecycle::{open::OpenRefusal, release::ReleaseRefusal};
use crate::git::gates;

/// A refusal: the request cannot be done in the thread's or project's current state, or as asked.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A chat workspace (no project) asked for what only a project's thread has.
    #[error("thread {thread} is a chat workspace{}", .op.why())]
    Chat { thread: String, op: ChatOp },
    #[error(transparent)]
    Request(#[from] RequestRefusal),
    #[error(transparent)]
    Gates(#[from] GateRefusal),
    #[error(transparent)]
    Commit(#[from] CommitRefusal),
    #[error(transparent)]
    Push(#[from] PushRefusal),
    #[error(transparent)]
    Pull(#[from] PullRefusal),
    #[error(transparent)]
    Snapshot(#[from] SnapshotRefusal),
    #[error(transparent)]
    Move(#[from] MoveRefusal),
    #[error(transparent)]
    Resync(#[from] ResyncRefusal),
    #[error(transparent)]
    Export(#[from] ExportRefusal),
    #[error(transparent)]
    Diff(#[from] DiffRefusal),
    #[error(transparent)]
    Limit(#[from] LimitRefusal),
    #[error(transparent)]
    Mirror(#[from] MirrorRefusal),
    #[error(transparent)]
    Deps(#[from] DepsRefusal),
    #[error(transparent)]
    Restart(#[from] RestartRefusal),
    #[error(transparent)]
    Workspace(#[from] WorkspaceRefusal),
    /// `open` refused (never a permission refusal or a failed read: those are other errors).
    #[error("{0}")]
    Open(OpenRefusal),
    /// `release` refused (never an unknown thread: that is [`Error::UnknownThread`]).
    #[error("{0}")]
    Release(ReleaseRefusal),
}

/// The request a chat workspace cannot serve: what [`Refusal::Chat`] says after the thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatOp {
    Commit,
    Push,
    Pull,
    Resync,
    Snapshot,
    Export,
    Diff,
}

impl ChatOp {
    fn why(self) -> &'static str {
        match self {
            ChatOp::Commit => " (no project): nothing to commit to",
            ChatOp::Push => " (no project): nothing to push",
            ChatOp::Pull => " (no project): nothing to pull into",
            ChatOp::Resync => " (no project): it has no upstream to re-sync with",
            ChatOp::Snapshot => " (no project): it is never saved",
            ChatOp::Export => " (no project): there is no folder to export to",
            ChatOp::Diff => ": nothing is saved to diff",
        }
    }
}

/// A request line the daemon cannot read.
#[derive(Debug, thiserror::Error)]
pub enum RequestRefusal {
    #[error("bad request: {0}")]
    Unreadable(std::io::Error),
    #[error("bad request: longer than {} KiB", .max >> 10)]
    TooLong { max: usize },
    #[error("bad request: not UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 { offset: usize },
    #[error("bad request: {0}")]
    NotJson(serde_json::Error),
    #[error("bad request: no request line within {secs} s")]
    NoLine { secs: u64 },
}

/// Gates that refused what a commit or push carries, or a gate that cannot be parsed.
#[derive(Debug, thiserror::Error)]
pub enum GateRefusal {
    #[error(transparent)]
    Bad(#[from] gates::GateError),
    /// `what` (commit, push) refused: each path and why.
    #[error("{}", gates::refused_message(.what, .refusals))]
    Refused {
        what: &'static str,
        refusals: Vec<gates::Refusal>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CommitRefusal {
    #[error("a commit needs a message (-m)")]
    NoMessage,
    #[error("--mode fixup needs --anchor: the commit it fixes")]
    FixupNeedsAnchor,
    #[error("--anchor is only for --mode fixup")]
    AnchorOnlyForFixup,
    #[error("--anchor {spec}: no such commit")]
    NoSuchAnchor { spec: String },
    #[error("--anchor {spec} ({anchor}) is not HEAD or an ancestor of it: nothing to fix up")]
    AnchorNotAncestor { spec: String, anchor: ObjectId },
    #[error(".git/index.lock exists: git is running in the workspace (or died there); try again")]
    IndexLocked,
    #[error("empty branch name")]
    EmptyBranch,
    /// Nothing differs from HEAD (under `paths`, when given).
    #[error("nothing to commit{}: the working state equals HEAD", under(.paths))]
    Nothing { paths: Vec<String> },
}

fn under(paths: &[String]) -> String {
    if paths.is_empty() {
        String::new()
    } else {
        format!(" under {}", paths.join(", "))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PushRefusal {
    #[error("--lease wants a full commit id, not {lease:?}")]
    BadLease { lease: String },
    #[error("HEAD is detached: name the remote branch with --branch")]
    Detached,
    #[error("{branch:?} is not a branch name")]
    NotABranch { branch: String },
    #[error(
        "push of {head} to {branch} failed: {error} (when the remote refused it: its branch is not at --lease, or the push is not a fast-forward)"
    )]
    Failed {
        head: ObjectId,
        branch: String,
        error: crate::git::Error,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum PullRefusal {
    #[error("{remote} has no {name_ref}")]
    NoSuchName { remote: String, name_ref: String },
    #[error("{name_ref} ({theirs}) has no parent")]
    NoParent { name_ref: String, theirs: ObjectId },
    #[error(
        "HEAD is at {head}, but {name_ref} ({theirs}) is based on {base}: pull only fast-forwards a workspace whose HEAD is the snapshot's base"
    )]
    NotAtBase {
        head: ObjectId,
        name_ref: String,
        theirs: ObjectId,
        base: ObjectId,
    },
    #[error(
        "pull of {name_ref} would lose local changes of thread {thread}: {changes} (snapshot or commit them first, or pull --force, which saves them in a snapshot first)"
    )]
    WouldLose {
        name_ref: String,
        thread: String,
        changes: String,
    },
}

/// Snapshots, named snapshots and what a snapshot must keep (refs, layers, the kept side).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotRefusal {
    #[error(
        "bad snapshot name {name:?}: 1-128 characters of [A-Za-z0-9._-], not starting with . or -, one component of a git ref"
    )]
    BadName { name: String },
    #[error("--push needs --name: only a named snapshot is pushed")]
    PushNeedsName,
    #[error("the workspace has no .git/HEAD")]
    NoHead,
    #[error(".git/{path} is larger than {max} bytes: not a ref")]
    RefTooLarge { path: String, max: u64 },
    #[error(".git/packed-refs has a line longer than {max} bytes: not refs")]
    PackedRefsLine { max: u64 },
    #[error("HEAD ({name}) has no commit yet: nothing to snapshot")]
    Unborn { name: String },
    #[error("the snapshot has no parent")]
    NoParent,
    #[error("the share's snapshot {theirs} has no parent")]
    ShareNoParent { theirs: ObjectId },
    /// The project's share remote refused the thread's snapshot (saved here all the same).
    #[error("{why}")]
    Unshared { why: String },
    #[error(
        "{name_ref} on {remote} has diverged: it names {theirs}, which {commit} does not descend from; not overwritten (the local snapshot {commit} is kept)"
    )]
    Diverged {
        name_ref: String,
        remote: String,
        theirs: ObjectId,
        commit: ObjectId,
    },
    #[error(
        "the workspace's base tree {base_tree} is not in the mirror of project {project} (the mirror was re-created without it); `octofs release {thread} --discard` drops the workspace without saving"
    )]
    BaseTreeMissing {
        base_tree: ObjectId,
        project: String,
        thread: String,
    },
    #[error("{thread_ref} moved underneath (expected {}, found {}); not overwriting it", shown(.expected), shown(.found))]
    MovedUnderneath {
        thread_ref: String,
        expected: Option<ObjectId>,
        found: Option<ObjectId>,
    },
    #[error(
        "the kept side {side} of snapshot {snapshot} names {id} ({path}), which is missing from the mirror"
    )]
    KeptMissing {
        side: ObjectId,
        snapshot: ObjectId,
        id: ObjectId,
        path: String,
    },
    #[error("{path} is larger than {max} bytes: release would not keep it")]
    FileTooLarge { path: String, max: u64 },
    #[error("the workspace has more than {max} refs: release would not keep them all")]
    TooManyRefs { max: usize },
    #[error(
        "cannot keep the workspace's refs: {error}; `octofs release {thread} --discard` drops the workspace without saving"
    )]
    RefsNotKept { error: Box<Error>, thread: String },
}

fn shown(id: &Option<ObjectId>) -> String {
    id.map_or("none".into(), |s| s.to_string())
}

/// Fork and teleport.
#[derive(Debug, thiserror::Error)]
pub enum MoveRefusal {
    #[error("--ref needs --project: without one, teleport carries the source's state")]
    RefNeedsProject,
    #[error("teleport needs a new thread: {to} is the source")]
    TeleportToSource { to: String },
    #[error("{to} is the source: name a new thread")]
    ToSource { to: String },
    #[error("thread {to} already exists (a chat workspace); choose a new thread")]
    ChatExists { to: String },
    #[error("thread {to} is already bound to project {project}; choose a new thread")]
    Bound { to: String, project: String },
    #[error(
        "thread {from} is a chat workspace (no project): its files are never saved, so there is no state to carry; `octofs teleport {from} {to} --project P` binds a new thread instead"
    )]
    ChatCarry { from: String, to: String },
    #[error("the thread has no binding")]
    NoBinding,
}

#[derive(Debug, thiserror::Error)]
pub enum ResyncRefusal {
    #[error("unknown role {role:?}: a role is developer or reviewer")]
    UnknownRole { role: String },
    /// Not one of the branches the thread could follow is in the mirror; `last` is the last tried.
    #[error(
        "thread {thread} has no upstream branch in the mirror of {project} (it follows none, and {} is not a branch there)",
        .last.as_deref().unwrap_or("its base")
    )]
    NoUpstream {
        thread: String,
        project: String,
        last: Option<String>,
    },
    #[error("unexpected `git rev-list --count` output {text:?}")]
    RevListOutput { text: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ExportRefusal {
    #[error(
        "project {project}'s upstream {upstream} is not a folder: export writes back to a plain-directory upstream only (push a git upstream)"
    )]
    NotAFolder { project: String, upstream: String },
    #[error("project {project}'s folder {folder} no longer exists (or is not a directory)")]
    FolderGone { project: String, folder: String },
    #[error("only the owner of {folder} (uid {uid}) or root may export into it")]
    NotTheFolderOwner { folder: String, uid: u32 },
    /// The folder could not be committed as `mirror sync` does: its warning.
    #[error("{warning}")]
    NotSynced { warning: String },
    #[error("the mirror of {project} has no commit to merge into")]
    NoCommit { project: String },
    #[error(
        "export refused: {} conflict(s) between the folder's changes and the thread's (git cannot merge them): {}; nothing was written",
        .paths.len(), .paths.join(", ")
    )]
    Conflicts { paths: Vec<String> },
    #[error("git merge-tree failed: {line}")]
    MergeTree { line: String },
    #[error("unexpected diff-tree output {meta:?}")]
    DiffTreeOutput { meta: String },
    #[error("unexpected diff-tree entry {meta:?}")]
    DiffTreeEntry { meta: String },
    #[error(
        "export refused: the folder holds files git does not track where the thread has files: {}; nothing was written",
        .paths.join(", ")
    )]
    Untracked { paths: Vec<String> },
    #[error(
        "export refused: in the folder, a symlink or a file stands where the thread has a directory: {}; nothing was written",
        .paths.join(", ")
    )]
    NotADirectory { paths: Vec<String> },
}

#[derive(Debug, thiserror::Error)]
pub enum DiffRefusal {
    #[error("the thread has no snapshot yet")]
    NoSnapshot,
    #[error("{spec:?} does not name a commit or tree in the mirror")]
    NotACommit { spec: String },
}

/// What one user's threads may take of the host.
#[derive(Debug, thiserror::Error)]
pub enum LimitRefusal {
    #[error(
        "user {uid} has {live} live threads, the most one user may have (octofs serve --max-threads-per-user {cap}); release one first"
    )]
    TooMany { uid: u32, live: usize, cap: usize },
    #[error(
        "user {uid} is at the cap of live threads (octofs serve --max-threads-per-user {cap}); release one first"
    )]
    AtCap { uid: u32, cap: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum MirrorRefusal {
    #[error("cannot create the blank repository: {error}")]
    Blank { error: String },
    #[error("no mirror add or mirror sync of {project} is running")]
    NotRunning { project: String },
}

#[derive(Debug, thiserror::Error)]
pub enum DepsRefusal {
    #[error("cannot tell which layers {project} needs ({error}); nothing removed")]
    UnknownNeeds { project: String, error: String },
}

/// `octofs restart`, and requests that arrive while it hands over.
#[derive(Debug, thiserror::Error)]
pub enum RestartRefusal {
    #[error("a restart is already under way")]
    UnderWay,
    #[error("restart failed, the running daemon goes on serving: {why}")]
    Failed { why: super::takeover::HandoverError },
    #[error("the daemon is restarting; try again in a moment")]
    Restarting,
}

/// A workspace made, mounted or unmounted: the root, its mount point, a remount, a busy mount.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceRefusal {
    #[error("root {} is not a directory", .root.display())]
    RootNotADirectory { root: PathBuf },
    #[error("root {}: {error}", .root.display())]
    Root {
        root: PathBuf,
        error: std::io::Error,
    },
    #[error("mount point {} is a symlink: not followed", .path.display())]
    MountPointSymlink { path: PathBuf },
    #[error("mount point {} is not empty", .path.display())]
    MountPointNotEmpty { path: PathBuf },
    #[error("mount point {}: {error}", .path.display())]
    MountPoint {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Files found in the bare mount point could not be moved into the workspace: why
    /// (`super::strays`'s line).
    #[error("{why}")]
    Strays { why: String },
    #[error("thread {thread} has no workspace")]
    NoWorkspace { thread: String },
    #[error("thread {thread} is not recorded as mounted; open it to mount it")]
    NotRecordedMounted { thread: String },
    #[error(
        "thread {thread}'s mount at {} was detached but a process still uses it; stop that process, then open the thread again",
        .path.display()
    )]
    DetachedInUse { thread: String, path: PathBuf },
    #[error(
        "{} is busy (a process still has its working directory or files in it); stop them or use --force",
        .path.display()
    )]
    Busy { path: PathBuf },
    /// A workspace whose create a power loss interrupted, set aside: `done` says where it went.
    #[error(
        "thread {thread}: its workspace was never made durable (power loss while it was created) and was {done}; open it again"
    )]
    NeverDurable { thread: String, done: String },
    /// A sync job of a create that never reported (its worker could not start).
    #[error("a durable write failed")]
    SyncLost,
}

impl From<Refusal> for Error {
    fn from(r: Refusal) -> Error {
        Error::Refusal(Box::new(r))
    }
}

/// Each area's refusal is an [`Error`] directly: `Err(CommitRefusal::NoMessage.into())`.
macro_rules! into_error {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(r: $t) -> Error {
                Refusal::from(r).into()
            }
        }
    )*};
}

into_error!(
    RequestRefusal,
    GateRefusal,
    CommitRefusal,
    PushRefusal,
    PullRefusal,
    SnapshotRefusal,
    MoveRefusal,
    ResyncRefusal,
    ExportRefusal,
    DiffRefusal,
    LimitRefusal,
    MirrorRefusal,
    DepsRefusal,
    RestartRefusal,
    WorkspaceRefusal
);

#[cfg(test)]
mod tests;
