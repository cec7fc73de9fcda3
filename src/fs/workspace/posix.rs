//! The POSIX state of a workspace that git does not keep: read for a snapshot's record, and put back
//! when a released thread resumes (DESIGN.md "Trust model": a release keeps the exact POSIX state).
//!
//! Owns only two operations of the core: listing the metadata of every changed node
//! ([`WorkspaceFs::view_meta`], in the same critical section as the view's edits) and applying one
//! entry of a record ([`WorkspaceFs::restore_entry`]) before the workspace is mounted. What is worth
//! recording is the lifecycle's policy (`daemon::posix`); the format is `git::posix_record`.
//! Everything is by bytes and by inode, never through a host path, so no name is converted and no
//! depth is limited by `PATH_MAX`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::fs::FsError;
use fuser::Errno;

use super::{Kind, New, ROOT_INO, SetAttr, State, WorkspaceFs, join};
use crate::git::posix_record::{PosixEntry, PosixKind};

/// The metadata of one node of the workspace that differs from the base (see [`View::meta`]).
///
/// [`View::meta`]: super::View::meta
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMeta {
    pub path: Vec<u8>,
    pub kind: PosixKind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    pub ino: u64,
    pub nlink: u32,
    /// A directory without any entry (git keeps no empty directories).
    pub empty: bool,
    /// A submodule's commit, presented as a directory.
    pub gitlink: bool,
}

impl WorkspaceFs {
    /// The metadata of every node that has a record (every node whose metadata can differ from
    /// what the base presents), by path, the workspace's own `.git` excluded. A node with several
    /// names is listed at each. Walks overlays only: O(changed paths).
    pub(super) fn view_meta(&self, st: &State) -> Result<Vec<NodeMeta>, FsError> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT_INO, Vec::new())];
        while let Some((dir, path)) = stack.pop() {
            let Some(overlay) = st.live.dirs.get(&dir) else {
                continue;
            };
            for (name, target) in overlay {
                let Some(ino) = target else { continue };
                if dir == ROOT_INO && name == b".git" {
                    continue;
                }
                let rec = &st.node(*ino)?.rec;
                let cp = join(&path, name);
                let gitlink = rec.base.as_ref().is_some_and(|b| b.gitlink);
                let empty = rec.kind == Kind::Dir && !gitlink && self.is_empty_in(st, *ino)?;
                if rec.kind == Kind::Dir && !gitlink {
                    stack.push((*ino, cp.clone()));
                }
                out.push(NodeMeta {
                    path: cp,
                    kind: rec.kind,
                    mode: rec.mode & 0o7777,
                    uid: rec.uid,
                    gid: rec.gid,
                    rdev: rec.rdev,
                    xattrs: rec
                        .xattrs
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                    ino: *ino,
                    nlink: rec.nlink,
                    empty,
                    gitlink,
                });
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Whether directory `ino` has no entry (its base tree's entries all hidden, none added).
    fn is_empty_in(&self, st: &State, ino: u64) -> Result<bool, FsError> {
        let overlay = st.live.dirs.get(&ino);
        if overlay.is_some_and(|o| o.values().any(Option::is_some)) {
            return Ok(false);
        }
        let Some((tree, _)) = Self::base_tree(&st.node(ino)?.rec) else {
            return Ok(true);
        };
        let entries = self.tree_entries(tree)?;
        Ok(entries
            .iter()
            .all(|e| overlay.is_some_and(|o| o.get(&e.name[..]).is_some_and(Option::is_none))))
    }

    /// The inode at `path` (`/`-separated bytes), creating missing directories on the way as
    /// plain directories of the presented owner when `create_dirs`.
    fn walk_bytes(&self, path: &[u8], create_dirs: bool) -> Result<Option<u64>, FsError> {
        let mut cur = ROOT_INO;
        for c in path.split(|b| *b == b'/') {
            let next = {
                let mut st = self.lock();
                self.resolve(&mut st, cur, c)?
            };
            cur = match next {
                Some(i) => i,
                None if create_dirs => {
                    let made = self.seeded(self.make(
                        cur,
                        OsStr::from_bytes(c),
                        New::plain(Kind::Dir, 0o755, 0),
                        self.owner(),
                    ))?;
                    self.entry_behind(cur, c);
                    made
                }
                None => return Ok(None),
            };
        }
        Ok(Some(cur))
    }

    /// Puts back one entry of a POSIX record (before the workspace is mounted: nobody sees a
    /// moment where a file is wider than recorded). Files and symlinks must already be there (the
    /// snapshot's tree brought them); directories and special files are made when missing; a hard
    /// link replaces its copy with a link to the entry it names.
    pub fn restore_entry(&self, e: &PosixEntry) -> Result<(), FsError> {
        let (dir_path, name) = match e.path.iter().rposition(|b| *b == b'/') {
            Some(i) => (&e.path[..i], &e.path[i + 1..]),
            None => (&e.path[..0], &e.path[..]),
        };
        let dir = if dir_path.is_empty() {
            ROOT_INO
        } else {
            self.walk_bytes(dir_path, true)?.ok_or(Errno::ENOENT)?
        };
        let name_os = OsStr::from_bytes(name);
        let existing = {
            let mut st = self.lock();
            match self.resolve(&mut st, dir, name)? {
                Some(i) => Some((i, st.node(i)?.rec.kind)),
                None => None,
            }
        };
        let want = e.kind;
        let ino = match (existing, e.kind) {
            (Some((i, k)), _) if k == want && e.link.is_none() => i,
            (None, PosixKind::Dir) => self.seeded(self.make(
                dir,
                name_os,
                New::plain(Kind::Dir, e.mode, 0),
                self.owner(),
            ))?,
            (None, k) if k.is_special() => self.seeded(self.make(
                dir,
                name_os,
                New::plain(want, e.mode, e.rdev),
                self.owner(),
            ))?,
            (Some((_, Kind::File)), PosixKind::File) => {
                let target = e.link.as_deref().ok_or(Errno::EINVAL)?;
                let t = self.walk_bytes(target, false)?.ok_or(Errno::ENOENT)?;
                if self.lock().node(t)?.rec.kind != Kind::File {
                    return Err(Errno::EINVAL.into());
                }
                self.unlink(dir, name_os)?;
                self.seeded(self.link(t, dir, name_os))?
            }
            (Some(_), _) => return Err(Errno::EEXIST.into()),
            (None, _) => return Err(Errno::ENOENT.into()),
        };
        if e.kind != PosixKind::Symlink || e.uid != self.pres.uid || e.gid != self.pres.gid {
            let mode = (e.kind != PosixKind::Symlink).then_some(e.mode);
            self.setattr(
                ino,
                SetAttr {
                    mode,
                    uid: Some(e.uid),
                    gid: Some(e.gid),
                    ..SetAttr::default()
                },
            )?;
        }
        for (k, v) in &e.xattrs {
            self.setxattr(ino, OsStr::from_bytes(k), v, 0)?;
        }
        self.entry_behind(dir, name);
        self.note_behind(super::Behind::Inode(ino));
        Ok(())
    }
}
