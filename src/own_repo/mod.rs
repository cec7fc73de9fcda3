//! A workspace's own repository (its `.git`), read in process by the daemon (docs/security.md,
//! the trust model).
//!
//! The daemon runs as root and the agent in a workspace is untrusted, so nothing here runs `git` in
//! a workspace or reads a workspace through its mount: every byte comes through the filesystem core
//! ([`WorkspaceFs::open_file`], [`WorkspaceFs::list_dir`]), symlinks are never followed, and nothing
//! the workspace's repository configures is consulted — not its `.git/config` (fsmonitor, hooks,
//! filters, helpers, `url.*.insteadOf`, includes), not its attributes, not its alternates. What git
//! would take from a host path (`core.excludesFile`, the global excludes) is not honoured either.
//!
//! - [`add_all`]: of the paths new to the base, which `git add -A` would add (the workspace's
//!   index, its `.gitignore` files and `.git/info/exclude`).
//! - [`carry`]: copies the agent's own commits into the mirror, each object verified against its id.
//!
//! Writes nothing in a workspace. Writes the mirror's object store and one ref (`carry` only), and
//! private copies under `<state>/tmp/` ([`Scratch`]), which go when the operation ends.

pub mod add_all;
pub mod carry;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gix::ObjectId;

use crate::fs::{FsError, WorkspaceFs};

/// Why a workspace's `.git` could not be read, or its commits not carried into the mirror. Paths
/// of the workspace are shown as its bytes, lossily.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A private directory or store under `<state>/tmp/` could not be created.
    #[error("cannot create {}: {source}", path.display())]
    CreatePrivate {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file or directory of the workspace could not be read through the core.
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: FsError,
    },
    /// A file of the workspace, opened, could not be read to its end.
    #[error("cannot read {path}: {source}")]
    ReadContent {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A file of the workspace could not be copied into a private directory.
    #[error("cannot copy {path} out of the workspace: {source}")]
    CopyOut {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A tree of the base could not be listed.
    #[error("cannot list tree {id}: {source}")]
    ListTree {
        id: ObjectId,
        #[source]
        source: FsError,
    },
    /// The workspace's index is malformed or cannot be decoded.
    #[error("cannot read the workspace's .git/index: {source}")]
    Index {
        #[source]
        source: gix::Error,
    },
    /// The workspace's index is split and its shared part is not there.
    #[error("the workspace's .git/index is split, and its .git/{name} is missing")]
    SplitIndexMissing { name: String },
    /// A workspace file is larger than octofs reads of such a file (an index larger than any git
    /// writes for a real tree).
    #[error("the workspace's {path} is {size} bytes, more than octofs reads of it ({max} bytes)")]
    TooLarge { path: String, size: u64, max: u64 },
    /// The private copy of the workspace's objects could not be opened.
    #[error("cannot open {}: {source}", path.display())]
    OpenObjects {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An object reachable from the workspace's HEAD is in neither its loose objects nor its packs.
    #[error("object {id}, reachable from the workspace's HEAD, is not in its .git/objects")]
    ObjectMissing { id: ObjectId },
    /// An object of the workspace could not be read.
    #[error("cannot read object {id} of the workspace: {source}")]
    ReadObject {
        id: ObjectId,
        #[source]
        source: std::io::Error,
    },
    /// An object of the workspace's packs could not be read.
    #[error("cannot read object {id} of the workspace: {source}")]
    FindObject {
        id: ObjectId,
        #[source]
        source: gix::Error,
    },
    /// A loose object of the workspace does not start with `<kind> <size>\0`.
    #[error("object {id} of the workspace has no valid header")]
    BadHeader { id: ObjectId },
    /// An object of the workspace could not be hashed.
    #[error("cannot hash object {id} of the workspace: {source}")]
    HashObject {
        id: ObjectId,
        #[source]
        source: gix::Error,
    },
    /// An object of the workspace is stored under an id that is not its own.
    #[error("the workspace's object {id} holds an object whose id is {actual}: not carried")]
    WrongId { id: ObjectId, actual: ObjectId },
    /// A commit, tree or tag of the workspace does not parse.
    #[error("cannot parse {kind} {id} of the workspace: {source}")]
    ParseObject {
        kind: gix::objs::Kind,
        id: ObjectId,
        #[source]
        source: gix::Error,
    },
    /// An object could not be written into the mirror.
    #[error("cannot write object {id} into the mirror: {source}")]
    WriteObject {
        id: ObjectId,
        #[source]
        source: gix::Error,
    },
    /// A loose blob of the workspace could not be streamed into the mirror.
    #[error("cannot copy object {id} of the workspace into the mirror: {source}")]
    CopyObject {
        id: ObjectId,
        #[source]
        source: gix::Error,
    },
    /// The workspace's pack directory could not be listed.
    #[error("cannot list .git/objects/pack: {source}")]
    ListPacks {
        #[source]
        source: FsError,
    },
    /// The name of the ref to update is not a valid ref name.
    #[error("bad ref name {name}: {source}")]
    BadRefName {
        name: String,
        #[source]
        source: gix::validate::reference::name::Error,
    },
    /// The ref keeping the thread's commits could not be updated in the mirror.
    #[error("cannot update {name} in the mirror: {source}")]
    UpdateRef {
        name: String,
        #[source]
        source: gix::Error,
    },
}

/// A private directory for copies of a workspace's files that a library must read from a path (an
/// index, packs). Copies, never the workspace's own files: an agent can rewrite or truncate those
/// at any time, and a file the daemon maps must not change under it. Removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new, empty directory under `<state>/tmp/`, readable by the daemon only.
    pub fn new(state: &Path, label: &str) -> Result<Scratch, Error> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = state.join("tmp");
        let dir = base.join(format!(
            "{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let made = (|| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&base)?;
            static SWEPT: std::sync::Once = std::sync::Once::new();
            SWEPT.call_once(|| sweep_stale(&base));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::DirBuilder::new().mode(0o700).create(&dir)
        })();
        made.map_err(|source| Error::CreatePrivate {
            path: dir.clone(),
            source,
        })?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Copies the workspace's regular file at `from` (components from the workspace's root) to
    /// `to` (relative to this directory, parents created). False when there is no such file;
    /// [`Error::TooLarge`] when the file, once opened, holds more than `max` bytes (the copy takes
    /// the length it had then: growing it afterwards copies nothing more).
    pub fn copy_in(
        &self,
        core: &WorkspaceFs,
        from: &[&[u8]],
        to: &Path,
        max: u64,
    ) -> Result<bool, Error> {
        let shown = || String::from_utf8_lossy(&from.join(&b'/')).into_owned();
        let Some(src) = core.open_file(from).map_err(|source| Error::Read {
            path: shown(),
            source,
        })?
        else {
            return Ok(false);
        };
        let size = src
            .metadata()
            .map_err(|e| Error::Read {
                path: shown(),
                source: e.into(),
            })?
            .len();
        if size > max {
            return Err(Error::TooLarge {
                path: shown(),
                size,
                max,
            });
        }
        let dest = self.0.join(to);
        let copied = (|| {
            use std::os::unix::fs::OpenOptionsExt;
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&dest)?;
            // Holes stay holes: a sparse file of terabytes costs the agent nothing, and must not
            // cost the daemon its disk either.
            crate::cow::upper::copy_sparse(&src, &mut out)
        })();
        copied.map_err(|source| Error::CopyOut {
            path: shown(),
            source,
        })?;
        Ok(true)
    }
}

/// Removes what a daemon that died left in `<state>/tmp/` (only one daemon serves a state
/// directory: every entry not named with this process's id is stale).
fn sweep_stale(base: &Path) {
    let mine = format!("-{}-", std::process::id());
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().contains(&mine) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
