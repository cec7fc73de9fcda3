//! Reading the workspace by path without the kernel, for the daemon: whether a name exists, a
//! file's content or an open file, what is at a path, a symlink's target, a directory's names.
//! Never follows a symlink, on the way or at the end (the daemon must not reach outside the
//! workspace). Changes nothing but the live table (nodes resolved on the way).

use std::fs::File;
use std::os::unix::ffi::OsStringExt;

use crate::fs::FsError;
use fuser::{Errno, FileAttr, FileType};
use gix::ObjectId;

use crate::cow::catalog::{InodeRecord, Kind};

use super::{ROOT_INO, State, WorkspaceFs, convert::io_errno, types::Listing};

impl WorkspaceFs {
    /// Whether `name` exists in directory `parent`.
    pub fn exists(&self, parent: u64, name: &str) -> Result<bool, FsError> {
        self.wait_held(Some(parent))?;
        let mut st = self.lock();
        Ok(self.resolve(&mut st, parent, name.as_bytes())?.is_some())
    }

    /// The inode at `path` (components from the root), if any.
    pub(super) fn walk(&self, st: &mut State, path: &[&[u8]]) -> Result<Option<u64>, FsError> {
        let mut cur = ROOT_INO;
        for c in path {
            match self.resolve(st, cur, c)? {
                Some(i) => cur = i,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The record at `path` (components from the root, symlinks not followed), or `None` when
    /// nothing is there (also when something on the way is not a directory).
    fn rec_at(&self, path: &[&[u8]]) -> Result<Option<InodeRecord>, FsError> {
        self.wait_held_path(path)?;
        let mut st = self.lock();
        let ino = match self.walk(&mut st, path) {
            Ok(Some(ino)) => ino,
            Ok(None) => return Ok(None),
            Err(e) if e == Errno::ENOTDIR => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(st.node(ino)?.rec.clone()))
    }

    /// The content of the regular file at `path` (components from the root), without the kernel.
    pub fn read_file(&self, path: &[&[u8]]) -> Result<Option<Vec<u8>>, FsError> {
        let Some(mut f) = self.open_file(path)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut out).map_err(io_errno)?;
        Ok(Some(out))
    }

    /// The regular file at `path` (components from the root) opened for reading, without the
    /// kernel. `None` when nothing is there, or something other than a regular file: a symlink on
    /// the way or at the end is never followed (the daemon must not reach outside the workspace).
    pub fn open_file(&self, path: &[&[u8]]) -> Result<Option<File>, FsError> {
        let Some(rec) = self.rec_at(path)? else {
            return Ok(None);
        };
        if rec.kind != Kind::File {
            return Ok(None);
        }
        Ok(Some(if rec.upper {
            self.open_data(rec.ino)?
        } else {
            self.source_file(&rec)?
        }))
    }

    /// What is at `path` (components from the root), without following symlinks.
    pub fn kind_at(&self, path: &[&[u8]]) -> Result<Option<FileType>, FsError> {
        Ok(self.attr_at(path)?.map(|a| a.kind))
    }

    /// The attributes presented for `path` (components from the root; symlinks are not
    /// followed), or `None` when nothing is there. Takes no lookup the kernel would have to forget.
    pub fn attr_at(&self, path: &[&[u8]]) -> Result<Option<FileAttr>, FsError> {
        let Some(rec) = self.rec_at(path)? else {
            return Ok(None);
        };
        Ok(Some(self.attr(&rec)?))
    }

    /// The target of the symlink at `path` (components from the root; symlinks on the way are not
    /// followed), or `None` when nothing or something else is there.
    pub fn link_at(&self, path: &[&[u8]]) -> Result<Option<Vec<u8>>, FsError> {
        let Some(rec) = self.rec_at(path)? else {
            return Ok(None);
        };
        if rec.kind != Kind::Symlink {
            return Ok(None);
        }
        match (rec.target, rec.base) {
            (Some(t), _) => Ok(Some(t)),
            (None, Some(b)) => {
                let id = ObjectId::from_hex(b.oid.as_bytes()).map_err(|_| Errno::EIO)?;
                Ok(Some(self.blob_bytes(id)?))
            }
            (None, None) => Ok(Some(Vec::new())),
        }
    }

    /// The names in the directory at `path` (components from the root) with their kinds, without
    /// `.` and `..`; `None` when it is not a directory (symlinks are not followed).
    pub fn list_dir(&self, path: &[&[u8]]) -> Result<Option<Listing>, FsError> {
        let ino = match self.rec_at(path)? {
            Some(rec) if rec.kind == Kind::Dir => rec.ino,
            _ => return Ok(None),
        };
        Ok(Some(
            self.readdir(ino)?
                .into_iter()
                .filter(|e| e.name != "." && e.name != "..")
                .map(|e| (e.name.into_vec(), e.attr.kind))
                .collect(),
        ))
    }
}
