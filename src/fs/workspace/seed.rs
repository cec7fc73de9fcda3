//! Seeding: the daemon writes a new workspace's own files (its `.git`, shared files of a layer)
//! before the workspace is mounted, owned by the presented owner, and reads the upper layer's clock
//! for the mark of a new workspace. Gathering the seeding into one catalog batch is
//! [`super::batch`]; applying a tree diff is [`super::apply`]. Must not be used for changes of the
//! workspace's state once mounted (those are the kernel's requests, or [`super::quiet`] writes).

use std::ffi::OsStr;

use crate::fs::{Context, FsError};
use fuser::FileAttr;

use crate::cow::catalog::{Kind, Ts};

use super::{
    WorkspaceFs,
    namespace::{Content, New},
    types::Caller,
};

impl WorkspaceFs {
    pub(super) fn seeded(&self, r: Result<FileAttr, FsError>) -> Result<u64, FsError> {
        let ino = r?.ino.0;
        self.forget(ino, 1);
        Ok(ino)
    }

    /// Creates directory `name` in `parent`, owned by the presented owner.
    pub fn seed_dir(&self, parent: u64, name: &str, mode: u32) -> Result<u64, FsError> {
        let owner = self.owner();
        self.seeded(self.make(
            parent,
            OsStr::new(name),
            New::plain(Kind::Dir, mode, 0),
            owner,
        ))
    }

    /// Creates file `name` in `parent` holding `bytes`.
    pub fn seed_file(
        &self,
        parent: u64,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> Result<u64, FsError> {
        self.seed_new(parent, name, Content::Bytes(bytes), mode, false)
    }

    /// Creates file `name` in `parent` whose content is the immutable host-wide file `shared` until
    /// the first write (O(1): nothing is copied).
    pub fn seed_shared(
        &self,
        parent: u64,
        name: &str,
        shared: &std::path::Path,
        mode: u32,
    ) -> Result<u64, FsError> {
        let content = Content::Shared(shared.to_string_lossy().into_owned());
        self.seed_new(parent, name, content, mode, false)
    }

    /// [`Self::seed_file`] once mounted: octofs's own file (quiet: not a change of the workspace's
    /// state), its name noted for the kernel ([`super::Behind`]). For the names of a held directory
    /// ([`Self::hold_dir`]), which no request has seen.
    pub fn add_own_file(
        &self,
        parent: u64,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> Result<u64, FsError> {
        let ino = self.seed_new(parent, name, Content::Bytes(bytes), mode, true)?;
        self.entry_behind(parent, name.as_bytes());
        Ok(ino)
    }

    /// [`Self::seed_shared`] once mounted, as [`Self::add_own_file`].
    pub fn add_own_shared(
        &self,
        parent: u64,
        name: &str,
        shared: &std::path::Path,
        mode: u32,
    ) -> Result<u64, FsError> {
        let content = Content::Shared(shared.to_string_lossy().into_owned());
        let ino = self.seed_new(parent, name, content, mode, true)?;
        self.entry_behind(parent, name.as_bytes());
        Ok(ino)
    }

    /// Makes file `name` in `parent` of `content`, owned by the workspace's owner (`quiet`:
    /// octofs's own, not a change of the workspace's state).
    fn seed_new(
        &self,
        parent: u64,
        name: &str,
        content: Content<'_>,
        mode: u32,
        quiet: bool,
    ) -> Result<u64, FsError> {
        let new = New {
            quiet,
            content,
            ..New::plain(Kind::File, mode, 0)
        };
        let owner = self.owner();
        self.seeded(self.make(parent, OsStr::new(name), new, owner))
    }

    /// "Now" on the upper layer's clock without waiting for its next tick ([`Upper::tick`]): the
    /// mark of a new workspace whose upper layer holds nothing outside `.git` (nothing written
    /// before it can be mistaken for a later change; no later write looks older).
    ///
    /// [`Upper::tick`]: crate::cow::upper::Upper::tick
    pub fn clock_now(&self) -> Result<Ts, FsError> {
        self.upper.tick().context(|| {
            format!(
                "the clock of the upper layer {}",
                self.upper.dir().display()
            )
        })
    }

    pub(super) fn owner(&self) -> Caller {
        Caller {
            uid: self.pres.uid,
            gid: self.pres.gid,
        }
    }
}
