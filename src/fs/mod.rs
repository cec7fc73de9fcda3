//! The filesystem: [`core`] answers every request for one workspace without a kernel; [`fuse`] is the
//! thin fuser adapter that turns kernel requests into core calls and core results into replies
//! (passthrough, TTLs, invalidation).
//!
//! The core reads the base commit through [`crate::git::objects`] and file content through
//! [`crate::cow::blobcache`]; it never touches a mirror's working tree, HEAD or index. See
//! `docs/inodes.md` for how inode numbers are chosen and why they are stable.

pub mod core;
pub mod fuse;
pub mod stats;

pub use self::core::{DirEntry, WorkspaceFs};
