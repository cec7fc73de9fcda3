//! The filesystem: [`workspace`] answers every request for one workspace without a kernel; [`files`]
//! is a mount's open files in either I/O mode ([`io`]: the mode and the one I/O interface of
//! [`handles`] and [`inode_io`]); [`caching`] is what the kernel may cache of an answer (TTLs, FOPEN
//! flags); [`fuse`] is the mechanical fuser adapter that turns kernel requests into those calls and
//! their outcomes into replies; [`mount`] mounts a workspace, negotiates INIT and invalidates what
//! the daemon changed behind the kernel; [`uring`] is the request transport (FUSE over io_uring, or
//! `/dev/fuse` threads). Every core request returns an [`FsResult`]: an errno for the kernel and, where
//! the core knows it, what failed ([`error`], `docs/errors.md`).
//!
//! The core reads the base commit through [`crate::git::objects`] and file content through
//! [`crate::cow::blobcache`]; it never touches a mirror's working tree, HEAD or index. See
//! `docs/inodes.md` for how inode numbers are chosen and why they are stable.

pub mod caching;
pub mod error;
pub mod failures;
pub mod files;
pub mod fuse;
pub mod handles;
pub mod inode_io;
pub mod io;
pub mod mount;
pub mod objects;
pub mod readahead;
pub mod stats;
pub mod uring;
pub mod workspace;

pub use self::error::{Context, FsError, FsResult};
pub use self::io::IoMode;

// Everything the rest of the crate (and the tests) use from the core, by one path that does not
// depend on how the core is split into files.
pub use self::workspace::{
    BASE_TOKEN, BaseMove, BaseStat, Behind, Caller, Change, ChangeKind, Changed, DirEntry, DirName,
    Durable, Listing, Made, NAME_MAX, NodeMeta, Opened, Presentation, ROOT_INO, SetAttr, SetTime,
    TreeChange, View, WorkspaceFs, XattrReply, base_stat, path_ino, unix_time,
};
