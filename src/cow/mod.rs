//! Copy-on-write storage: the host-wide blob cache (and, with the write side, each workspace's upper
//! layer and catalog).
//!
//! Owns `<state>/blobs/`. It reads the object store through [`crate::git::objects`] and never touches
//! a mirror's working tree or refs, nor anything FUSE-specific.

pub mod blobcache;
pub mod catalog;
pub mod quota;
pub mod upper;
