//! Snapshot commits in a mirror (docs/architecture.md "Snapshots, release and resume"; seed 000 "Saving").
//!
//! A snapshot adds objects and moves one `refs/octomate/threads/<thread>` ref; it never touches the
//! mirror's HEAD, index, working tree or branches. The tree is the base tree edited with only what
//! changed (untouched subtrees keep their ids); the ref moves by compare-and-swap with a reflog entry,
//! so a lost race is an error, never an overwrite, and a crash leaves the old or the new ref, never
//! a ref to a missing object (objects are written before the ref).
//!
//! This file owns the view's edits ([`ViewEdit`], [`ViewSource`]: what a workspace says differs
//! from its base) and opening a mirror; the rooms, one concept each:
//! - `trailers`: a snapshot commit's message and what its trailers record (HEAD, owner);
//! - `build`: a view's edits made into a tree, every object it needs written ([`build_tree`]);
//! - `parallel`: the changed files read, hashed and compressed on several threads;
//! - `file_blobs`: a file on disk saved as a blob, and the ids of files saved before;
//! - `editor`: the raw tree editor (directories edited as tree bytes, names checked);
//! - `caches`: what snapshots keep in memory ([`Caches`], owned by the daemon, not process-wide);
//! - `commit`: commit objects written and read;
//! - `refs`: the thread refs, moved by compare-and-swap past a stale lock.

mod build;
mod caches;
mod commit;
mod editor;
mod file_blobs;
mod parallel;
mod refs;
mod trailers;

pub use build::build_tree;
pub use caches::Caches;
pub use commit::{Identity, commit_info, write_commit, write_commit_as};
pub use refs::{cas_ref, read_ref, thread_ref};
pub use trailers::{HeadRef, SnapshotOwner, head_of, message, owner_of};

use crate::git::error::{Context, Error};
use std::path::{Path, PathBuf};

use gix::ObjectId;

/// One edit that turns the base tree into the workspace's working state (a workspace's view of what differs from its base).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewEdit {
    /// Remove whatever is at `path`.
    Remove {
        path: Vec<u8>,
    },
    /// A directory of the base, whole, now at `path`.
    Tree {
        path: Vec<u8>,
        id: ObjectId,
    },
    /// A directory at `path` that is not in the base at that path (the ignore rules decide whether
    /// its content belongs to the working state). No tree effect by itself.
    AddedDir {
        path: Vec<u8>,
    },
    Gitlink {
        path: Vec<u8>,
        id: ObjectId,
    },
    File {
        path: Vec<u8>,
        exec: bool,
        source: ViewSource,
        /// Not in the base at that path.
        added: bool,
    },
    Symlink {
        path: Vec<u8>,
        source: ViewSource,
        added: bool,
    },
}

impl ViewEdit {
    /// The same edit at another path.
    pub fn at(mut self, new: Vec<u8>) -> ViewEdit {
        match &mut self {
            ViewEdit::Remove { path }
            | ViewEdit::Tree { path, .. }
            | ViewEdit::AddedDir { path }
            | ViewEdit::Gitlink { path, .. }
            | ViewEdit::File { path, .. }
            | ViewEdit::Symlink { path, .. } => *path = new,
        }
        self
    }

    pub fn path(&self) -> &[u8] {
        match self {
            ViewEdit::Remove { path }
            | ViewEdit::Tree { path, .. }
            | ViewEdit::AddedDir { path }
            | ViewEdit::Gitlink { path, .. }
            | ViewEdit::File { path, .. }
            | ViewEdit::Symlink { path, .. } => path,
        }
    }
}

/// Where the bytes of a file or symlink of the view are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewSource {
    /// An object already in the mirror.
    Object(ObjectId),
    /// A file on disk (a data file of the upper layer, or a shared host-wide file).
    File(PathBuf),
    Bytes(Vec<u8>),
}

fn err<E: std::error::Error + Send + Sync + 'static>(what: &str) -> impl Fn(E) -> Error + '_ {
    move |e| Error::Op {
        what: what.to_string(),
        source: Box::new(e),
    }
}

pub fn open(mirror: &Path) -> Result<gix::Repository, Error> {
    super::open_owned(mirror).context(|| format!("cannot open the mirror {}", mirror.display()))
}
