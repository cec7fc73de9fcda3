//! The workspace's own git repository: the `.git` every workspace gets at fork (docs/architecture.md "The
//! workspace's own repository").
//!
//! It is written into the workspace's upper layer before the first mount and costs O(1) per fork:
//! a handful of small files, the mirror's refs (without `refs/octomate/*`), `objects/info/alternates`
//! holding `../octofs/objects`, the mirror's object store as the mount presents it (reads only; every
//! new object is written inside the workspace; `fs::objects`), and an index shared by every fork of the same base, built once per base commit with
//! stat data equal to what the mount presents, so the first `git status` re-hashes nothing. The
//! config enables `core.fsmonitor` (answered by the daemon from the workspace's change journal) and
//! `core.untrackedCache`. The fsmonitor command is the small hook program `octofs-fsmonitor`
//! through the link `<state>/fsmonitor-<thread>` that planning makes, a path git execs without a
//! shell; `octofs fsmonitor` with quoted arguments when that cannot be.
//!
//! Reads the mirror (refs, objects), never writes it. This file owns the errors; the rooms, one
//! concept each:
//! - `seed`: what a new workspace's `.git` is made of (the plan) and writing it into the upper layer;
//! - `shared_index`: the index shared by every fork of a base, its side files under
//!   `<state>/indexes`, and what each fork's small index takes from them;
//! - `fsmonitor`: the `core.fsmonitor` command, its hook link, and its refresh at a remount;
//! - `read`: what is read in process: the mirror's refs (no `git for-each-ref`), the workspace's
//!   `.git/config` through the core.

mod fsmonitor;
mod read;
mod seed;
mod shared_index;

pub use fsmonitor::{
    FSMONITOR_HOOK, fsmonitor_command, octofs_fsmonitor, refresh_fsmonitor, replace_core_fsmonitor,
};
pub use read::{CONFIG_MAX, MirrorRefs, mirror_refs, workspace_config_bytes};
pub use seed::{RepoPlan, plan, presented, put_index, seed, strip_credentials};
pub use shared_index::{index_bytes, index_stat, shared_index, shared_index_path};

use std::path::PathBuf;

/// Why the `.git` of a new workspace, or the shared index it starts with, could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The project's mirror could not be opened.
    #[error("cannot open the mirror {}: {source}", path.display())]
    OpenMirror {
        path: PathBuf,
        #[source]
        source: gix::Error,
    },
    /// The mirror's refs could not be listed.
    #[error("cannot list the mirror's refs: {source}")]
    ListRefs {
        #[source]
        source: gix::Error,
    },
    /// The directory of the shared indexes could not be created.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The index of a tree could not be built from the mirror's objects.
    #[error("cannot build the index of {tree}: {source}")]
    BuildIndex {
        tree: gix::ObjectId,
        #[source]
        source: gix::Error,
    },
    /// The tree a resumed workspace presents could not be read.
    #[error("cannot read tree {tree}: {source}")]
    ReadTree {
        tree: gix::ObjectId,
        #[source]
        source: gix::Error,
    },
    /// The size of a blob (for the stat data of its index entry) could not be read.
    #[error("cannot read the size of {id}: {source}")]
    BlobSize {
        id: gix::ObjectId,
        #[source]
        source: std::io::Error,
    },
    /// The index could not be serialized.
    #[error("cannot write the shared index: {source}")]
    EncodeIndex {
        #[source]
        source: gix::Error,
    },
    /// The index serialized is shorter than its header and checksum: nothing to extend.
    #[error("the index is too short")]
    IndexTooShort,
    /// The shared index could not be written to its file under `<state>/indexes/`.
    #[error("cannot write the shared index: {source}")]
    WriteIndex {
        #[source]
        source: std::io::Error,
    },
    /// A file or directory of the workspace's `.git` could not be created in its upper layer.
    #[error("cannot create .git/{what}: {source}")]
    Seed {
        what: String,
        #[source]
        source: crate::fs::FsError,
    },
}
