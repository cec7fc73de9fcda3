//! The POSIX state of a workspace that git does not keep: read for a snapshot's record, and put back
//! when a released thread resumes (docs/security.md: a release keeps the exact POSIX state).
//!
//! Owns only two operations of the core: listing the metadata a record is made from
//! ([`WorkspaceFs::view_meta`], in the same critical section as the view's edits; for a snapshot,
//! [`WorkspaceFs::snapshot_meta`]: the last snapshot view's list updated with what changed since)
//! and applying one entry of a record ([`WorkspaceFs::restore_entry`]) before the workspace is
//! mounted. What is worth recording is the lifecycle's policy (`daemon::posix`); the format is
//! `git::posix_record`.
//! Everything is by bytes and by inode, never through a host path, so no name is converted and no
//! depth is limited by `PATH_MAX`.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::fs::FsError;
use fuser::Errno;

use super::{Kind, New, ROOT_INO, SetAttr, State, WorkspaceFs, join, tx::Dirty};
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

/// The metadata a POSIX record is made from, by path (see [`WorkspaceFs::view_meta`]).
pub(super) type MetaSet = BTreeMap<Vec<u8>, NodeMeta>;

/// Whether a path is at or below a `.git` (the workspace's own repository, or a nested one's):
/// nothing there is ever in a POSIX record.
fn in_git(comps: &[&[u8]]) -> bool {
    comps.iter().any(|c| *c == b".git")
}

impl WorkspaceFs {
    /// The metadata a snapshot's POSIX record is made from, sorted by path, the workspace's own
    /// `.git` excluded: every node whose own metadata can put it in the record (a file with other
    /// permission bits than git restores, 0644 or 0755; a file or symlink of another owner, with
    /// extended attributes, or a file with more than one link; a directory of other bits than
    /// 0755, another owner or extended attributes, or empty; a fifo, socket or device), and every
    /// directory above one (the record brings back those the tree does not have). A node that
    /// differs from the base only in content or name is left out: the record never holds it.
    /// Nothing at or below a `.git` or in a submodule is listed. A node with several names is
    /// listed at each. Walks every node with a record.
    pub(super) fn view_meta(&self, st: &State) -> Result<Vec<NodeMeta>, FsError> {
        let own = self.meta_walk_all(st)?;
        self.with_ancestors(st, &own)
    }

    /// [`Self::view_meta`] for the snapshot view about to close the open epoch: the set the last
    /// snapshot view kept, updated with only what was noted since it (`track.open`: names
    /// created, removed or moved are walked again below them, inodes and directories whose
    /// metadata changed are read again), so it costs what changed since, plus one entry per
    /// listed node. A full walk when nothing is kept (a core just loaded, a failed view), after
    /// too many changes, or when a file with several names is involved (each name would have to
    /// be found). Keeps the result for the next snapshot view.
    pub(super) fn snapshot_meta(&self, st: &mut State) -> Result<Vec<NodeMeta>, FsError> {
        let kept = st.track.meta.take();
        let own = match kept {
            Some((e, prev)) if e == st.track.epoch && !st.track.open.overflow => {
                self.meta_since(st, prev, &st.track.open)?
            }
            _ => None,
        };
        let own = match own {
            Some(o) => o,
            None => self.meta_walk_all(st)?,
        };
        let out = self.with_ancestors(st, &own)?;
        // Kept with the epoch this view closes (`SnapTrack::close` counts it next).
        st.track.meta = Some((st.track.epoch + 1, own));
        Ok(out)
    }

    /// The nodes of [`Self::view_meta`] whose own metadata puts them there (no directories above
    /// them), by a walk of every overlay.
    fn meta_walk_all(&self, st: &State) -> Result<MetaSet, FsError> {
        let mut out = MetaSet::new();
        if let Some(overlay) = st.live.dirs.get(&ROOT_INO) {
            for (name, target) in overlay {
                let Some(ino) = target else { continue };
                if name == b".git" {
                    continue;
                }
                self.meta_walk(st, *ino, name.clone(), &mut out)?;
            }
        }
        Ok(out)
    }

    /// `prev` (the nodes of [`Self::meta_walk_all`] at the last snapshot view) with what `dirty`
    /// noted since read again; `None` when that cannot be trusted to give what a full walk gives.
    fn meta_since(
        &self,
        st: &State,
        mut own: MetaSet,
        dirty: &Dirty,
    ) -> Result<Option<MetaSet>, FsError> {
        // A name that changed: everything at or below it now (a directory moved away takes its
        // nodes' old paths with it; one moved here brings its own). The directory holding it:
        // its link count and whether it is empty.
        let mut roots: Vec<Vec<u8>> = Vec::new();
        let mut singles: Vec<Vec<u8>> = Vec::new();
        for (dir, name) in &dirty.names {
            // A directory that is gone: its own removal is noted in its parent.
            if let Some(p) = Self::path_of(st, *dir) {
                roots.push(join(&p, name));
                if !p.is_empty() {
                    singles.push(p);
                }
            }
        }
        // An inode that changed: read again; a directory whose base tree changed (or that is
        // new): everything below it too (it may have become a submodule). A directory whose own
        // metadata changed: itself.
        let changed = dirty.inos.iter().map(|i| (i, true));
        for (ino, whole) in changed.chain(dirty.meta.iter().map(|i| (i, false))) {
            let Some(n) = st.live.inodes.get(ino) else {
                continue;
            };
            if n.rec.nlink == 0 {
                continue;
            }
            if n.rec.kind != Kind::Dir && n.rec.nlink > 1 {
                return Ok(None);
            }
            if let Some(p) = Self::path_of(st, *ino)
                && !p.is_empty()
            {
                if whole && n.rec.kind == Kind::Dir {
                    roots.push(p);
                } else {
                    singles.push(p);
                }
            }
        }
        // Outermost first; a root below another one is walked with it.
        roots.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
        roots.dedup();
        let mut walked: HashSet<Vec<u8>> = HashSet::new();
        for p in roots {
            let covered = p
                .iter()
                .enumerate()
                .any(|(i, b)| *b == b'/' && walked.contains(&p[..i]));
            if covered {
                continue;
            }
            // Drop what was listed at or below `p`, then list what is there now.
            let mut below = p.clone();
            below.push(b'/');
            let mut end = p.clone();
            end.push(b'/' + 1);
            let gone: Vec<Vec<u8>> = own
                .range(below..end)
                .map(|(k, _)| k.clone())
                .chain(own.contains_key(&p).then(|| p.clone()))
                .collect();
            for k in gone {
                own.remove(&k);
            }
            let comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            if !in_git(&comps)
                && let Some(ino) = overlay_node(st, &comps)
            {
                self.meta_walk(st, ino, p.clone(), &mut own)?;
            }
            walked.insert(p);
        }
        for p in singles {
            let comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            own.remove(&p);
            if in_git(&comps) {
                continue;
            }
            if let Some(ino) = overlay_node(st, &comps)
                && let Some(m) = self.meta_of(st, ino, &p)?
            {
                own.insert(p, m);
            }
        }
        // A node with several names is listed at each: one not walked here may be stale.
        if own.values().any(|m| m.kind != Kind::Dir && m.nlink > 1) {
            return Ok(None);
        }
        Ok(Some(own))
    }

    /// Lists into `out` the node `ino` at `path` and every node below it in the overlays whose own
    /// metadata puts it in [`Self::view_meta`]; nothing at or below a `.git`, nor below a
    /// submodule.
    fn meta_walk(
        &self,
        st: &State,
        ino: u64,
        path: Vec<u8>,
        out: &mut MetaSet,
    ) -> Result<(), FsError> {
        let mut stack = vec![(ino, path)];
        while let Some((ino, path)) = stack.pop() {
            let name = match path.iter().rposition(|b| *b == b'/') {
                Some(i) => &path[i + 1..],
                None => &path[..],
            };
            if name == b".git" {
                continue;
            }
            let rec = &st.node(ino)?.rec;
            let gitlink = rec.base.as_ref().is_some_and(|b| b.gitlink);
            if rec.kind == Kind::Dir
                && !gitlink
                && let Some(overlay) = st.live.dirs.get(&ino)
            {
                for (name, target) in overlay {
                    if let Some(t) = target {
                        stack.push((*t, join(&path, name)));
                    }
                }
            }
            if let Some(m) = self.meta_of(st, ino, &path)? {
                out.insert(path, m);
            }
        }
        Ok(())
    }

    /// The metadata of node `ino` at `path` if its own metadata puts it in [`Self::view_meta`].
    fn meta_of(&self, st: &State, ino: u64, path: &[u8]) -> Result<Option<NodeMeta>, FsError> {
        let rec = &st.node(ino)?.rec;
        if rec.base.as_ref().is_some_and(|b| b.gitlink) {
            return Ok(None);
        }
        let own = rec.uid == self.pres.uid && rec.gid == self.pres.gid && rec.xattrs.is_empty();
        let bits = rec.mode & 0o7777;
        let listed = match rec.kind {
            Kind::File => !(own && (bits == 0o644 || bits == 0o755) && rec.nlink <= 1),
            Kind::Symlink => !own,
            Kind::Dir => !(own && bits == 0o755) || self.is_empty_in(st, ino)?,
            _ => true,
        };
        if !listed {
            return Ok(None);
        }
        self.node_meta(st, ino, path).map(Some)
    }

    /// The metadata of node `ino` at `path`.
    fn node_meta(&self, st: &State, ino: u64, path: &[u8]) -> Result<NodeMeta, FsError> {
        let rec = &st.node(ino)?.rec;
        let gitlink = rec.base.as_ref().is_some_and(|b| b.gitlink);
        let empty = rec.kind == Kind::Dir && !gitlink && self.is_empty_in(st, ino)?;
        Ok(NodeMeta {
            path: path.to_vec(),
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
            ino,
            nlink: rec.nlink,
            empty,
            gitlink,
        })
    }

    /// `own` and every directory above one of its nodes, sorted by path.
    fn with_ancestors(&self, st: &State, own: &MetaSet) -> Result<Vec<NodeMeta>, FsError> {
        let mut above = MetaSet::new();
        for p in own.keys() {
            for (i, b) in p.iter().enumerate() {
                if *b != b'/' {
                    continue;
                }
                let d = &p[..i];
                if own.contains_key(d) || above.contains_key(d) {
                    continue;
                }
                let comps: Vec<&[u8]> = d.split(|b| *b == b'/').collect();
                if let Some(ino) = overlay_node(st, &comps) {
                    above.insert(d.to_vec(), self.node_meta(st, ino, d)?);
                }
            }
        }
        let mut out: Vec<NodeMeta> = own.values().cloned().chain(above.into_values()).collect();
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

/// The node the overlays link at `comps` (through directories that are not submodules), if any:
/// a node without a record there is the base's, and has no metadata of its own to record.
fn overlay_node(st: &State, comps: &[&[u8]]) -> Option<u64> {
    let mut cur = ROOT_INO;
    for c in comps {
        let n = st.live.inodes.get(&cur)?;
        if n.rec.kind != Kind::Dir || n.rec.base.as_ref().is_some_and(|b| b.gitlink) {
            return None;
        }
        cur = (*st.live.dirs.get(&cur)?.get(*c)?)?;
    }
    Some(cur)
}
