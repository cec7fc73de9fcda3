//! The snapshot view: in one critical section, every edit that turns the base tree into the working
//! state (O(changed paths), no content read), and the list of changes `status` derives from it;
//! for a snapshot, when the core knows the last one, only the edits that turn that snapshot's tree
//! into the working state (O(paths changed since it)). Reads the state and the object store;
//! changes nothing but the snapshot epochs (`tx::SnapTrack`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::fs::{Context, FsError};
use gix::ObjectId;

use crate::cow::catalog::{Kind, Ts};
use crate::git::objects::{EntryKind, TreeEntry};
use crate::git::snapshot::{ViewEdit, ViewSource};

use crate::cow::blobcache::BlobCache;

use super::{
    ROOT_INO, State, WorkspaceFs, convert::eio, convert::join, tree_order::find_entry, tx::Dirty,
    types::Change, types::ChangeKind, types::View,
};

impl WorkspaceFs {
    /// Reads, in one critical section, every edit that turns the base tree into the working state
    /// (the workspace's own `.git` excluded). Cost: O(changed paths). Content is not read: copied-up
    /// files are named by their data file, read later without the lock.
    pub fn view(&self) -> Result<View, FsError> {
        // Taken before the lock: whatever changes after this may or may not be in the view, so it
        // counts as a change since it (see `changed_since`).
        let taken_at = self.clock()?;
        let st = self.lock();
        let root = st.node(ROOT_INO)?;
        let (root_tree, _) =
            Self::base_tree(&root.rec).ok_or_else(|| eio("the root has no base tree"))?;
        let mut edits = Vec::new();
        self.view_dir(
            &st,
            ROOT_INO,
            b"",
            Some(root_tree),
            Some(root_tree),
            &mut edits,
        )?;
        let meta = self.view_meta(&st)?;
        Ok(View {
            base_tree: root_tree,
            onto: root_tree,
            since_last: false,
            epoch: 0,
            edits,
            meta,
            generation: st.live.generation,
            taken_at,
        })
    }

    /// The view a snapshot is built from. When `last` is the tree of the last snapshot this core
    /// was told of ([`Self::snapshot_saved`]) and it can be trusted, the edits apply to that tree
    /// and rebuild only the paths changed since its view (each removed, then put back as it is
    /// now, whole for a directory): O(paths changed since the last snapshot), whatever the
    /// workspace changed before. Otherwise (no snapshot since the core was loaded, another tree,
    /// too many changes, a change the ignore rules or the index could see, a hard-linked file)
    /// they apply to the base tree, as [`Self::view`]'s. Either way the tree built is the same.
    /// The metadata ([`View::meta`]) is the last snapshot view's updated with what changed since
    /// (see `snapshot_meta`), the same list a full walk gives.
    /// Closes a snapshot epoch: [`View::epoch`] is what to tell [`Self::snapshot_saved`].
    pub fn snapshot_view(&self, last: Option<ObjectId>) -> Result<View, FsError> {
        let taken_at = self.clock()?;
        let mut st = self.lock();
        let root = st.node(ROOT_INO)?;
        let (root_tree, _) =
            Self::base_tree(&root.rec).ok_or_else(|| eio("the root has no base tree"))?;
        let writing: Vec<u64> = {
            let nodes = &st.live.inodes;
            st.track
                .writing
                .iter()
                .copied()
                .filter(|i| nodes.get(i).is_some_and(|n| n.writers > 0))
                .collect()
        };
        st.track.writing = writing.iter().copied().collect();
        // The metadata first: it is updated with what was noted since the last snapshot view,
        // which closing the epoch hands over to the edits.
        let meta = self.snapshot_meta(&mut st)?;
        let (epoch, since) = st.track.close(last, root_tree, &writing);
        let incremental = match (since, last) {
            (Some(d), Some(last)) => self.edits_since(&st, root_tree, &d)?.map(|e| (e, last)),
            _ => None,
        };
        let (edits, onto, since_last) = match incremental {
            Some((edits, last)) => (edits, last, true),
            None => {
                let mut edits = Vec::new();
                self.view_dir(
                    &st,
                    ROOT_INO,
                    b"",
                    Some(root_tree),
                    Some(root_tree),
                    &mut edits,
                )?;
                (edits, root_tree, false)
            }
        };
        Ok(View {
            base_tree: root_tree,
            onto,
            since_last,
            epoch,
            edits,
            meta,
            generation: st.live.generation,
            taken_at,
        })
    }

    /// The snapshot built from the [`Self::snapshot_view`] of `epoch` was saved, with tree `tree`:
    /// the next snapshot view may start from it.
    pub fn snapshot_saved(&self, epoch: u64, tree: ObjectId) {
        let mut st = self.lock();
        let Some(base) = st
            .node(ROOT_INO)
            .ok()
            .and_then(|r| Self::base_tree(&r.rec).map(|(t, _)| t))
        else {
            return;
        };
        st.track.saved(epoch, tree, base);
    }

    /// The edits that turn the last snapshot's tree into the working state, from what changed
    /// since (`dirty`): every changed path removed and put back as it is now. `None` when that
    /// cannot be trusted to give the tree a full view gives.
    fn edits_since(
        &self,
        st: &State,
        root_tree: ObjectId,
        dirty: &Dirty,
    ) -> Result<Option<Vec<ViewEdit>>, FsError> {
        let mut paths: Vec<Vec<u8>> = Vec::new();
        for (dir, name) in &dirty.names {
            // A directory that is gone: its own removal is noted in its parent.
            if let Some(p) = Self::path_of(st, *dir) {
                paths.push(join(&p, name));
            }
        }
        for ino in &dirty.inos {
            let Some(n) = st.live.inodes.get(ino) else {
                continue;
            };
            if n.rec.nlink == 0 {
                continue;
            }
            // Every name of a hard-linked file would have to be found: walk everything instead.
            if n.rec.kind != Kind::Dir && n.rec.nlink > 1 {
                return Ok(None);
            }
            if let Some(p) = Self::path_of(st, *ino) {
                paths.push(p);
            }
        }
        let mut roots: Vec<Vec<u8>> = Vec::new();
        let mut probed: HashMap<Vec<u8>, bool> = HashMap::new();
        for p in paths {
            let comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            if p.is_empty() {
                return Ok(None);
            }
            if comps[0] == b".git" {
                // The workspace's own repository is not in the tree, but its index and exclude
                // file decide what of the new paths is (see `add_all::keep`).
                let rest = &comps[1..];
                let decides = rest.is_empty()
                    || rest[0] == b"index"
                    || rest[0] == b"info"
                    || rest[0].starts_with(b"sharedindex");
                if decides {
                    return Ok(None);
                }
                continue;
            }
            // A changed ignore file may change what of any unchanged path is kept.
            if comps.iter().any(|c| *c == b".gitignore") {
                return Ok(None);
            }
            // Inside a nested repository (or its `.git`): the repository is rebuilt whole (it
            // becomes one gitlink, or files again).
            let mut cut = comps.len();
            if let Some(i) = comps.iter().position(|c| *c == b".git") {
                cut = i;
            }
            for j in 1..cut {
                // Each directory is probed once per view (1,000 changed files in 90 directories:
                // 90 probes, not 1,000).
                let dir = &p[..comps[..j].iter().map(|c| c.len() + 1).sum::<usize>() - 1];
                let nested = match probed.get(dir) {
                    Some(n) => *n,
                    None => {
                        let mut probe: Vec<&[u8]> = comps[..j].to_vec();
                        probe.push(b".git");
                        let n = self.entry_at(st, &probe)?.is_some();
                        probed.insert(dir.to_vec(), n);
                        n
                    }
                };
                if nested {
                    cut = j;
                    break;
                }
            }
            roots.push(comps[..cut].join(&b'/'));
        }
        // Outermost first; a path below another changed one is rebuilt with it.
        roots.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
        roots.dedup();
        let mut kept: HashSet<Vec<u8>> = HashSet::new();
        let mut out = Vec::new();
        for p in roots {
            let covered = p
                .iter()
                .enumerate()
                .any(|(i, b)| *b == b'/' && kept.contains(&p[..i]));
            if covered {
                continue;
            }
            out.push(ViewEdit::Remove { path: p.clone() });
            let comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            let rb = self.base_entry_at(root_tree, &comps)?;
            match self.entry_at(st, &comps)? {
                Some(At::Node(ino)) => self.view_entry(st, &p, ino, None, rb, &mut out)?,
                Some(At::Base(e)) => base_edits(&p, &e, rb, &mut out),
                None => {}
            }
            kept.insert(p);
        }
        Ok(Some(out))
    }

    /// What the working state has at `comps` now: a node of the overlay, or an entry of a base tree
    /// nobody changed.
    fn entry_at(&self, st: &State, comps: &[&[u8]]) -> Result<Option<At>, FsError> {
        let mut cur = At::Node(ROOT_INO);
        for c in comps {
            let dir_tree = match &cur {
                At::Node(d) => {
                    let n = st.node(*d)?;
                    if n.rec.kind != Kind::Dir || n.rec.base.as_ref().is_some_and(|b| b.gitlink) {
                        return Ok(None);
                    }
                    match st.live.dirs.get(d).and_then(|o| o.get(*c)) {
                        Some(Some(ino)) => {
                            cur = At::Node(*ino);
                            continue;
                        }
                        Some(None) => return Ok(None),
                        None => Self::base_tree(&n.rec).map(|(t, _)| t),
                    }
                }
                At::Base(e) if e.kind == EntryKind::Tree => Some(e.id),
                At::Base(_) => None,
            };
            let Some(t) = dir_tree else {
                return Ok(None);
            };
            match find_entry(&self.tree_entries(t)?, c) {
                Some(e) => cur = At::Base(e.clone()),
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The entry the base commit has at `comps`.
    fn base_entry_at(
        &self,
        root_tree: ObjectId,
        comps: &[&[u8]],
    ) -> Result<Option<TreeEntry>, FsError> {
        let mut tree = root_tree;
        for (i, c) in comps.iter().enumerate() {
            let entries = self.tree_entries(tree)?;
            let Some(e) = find_entry(&entries, c) else {
                return Ok(None);
            };
            if i + 1 == comps.len() {
                return Ok(Some(e.clone()));
            }
            if e.kind != EntryKind::Tree {
                return Ok(None);
            }
            tree = e.id;
        }
        Ok(None)
    }

    /// `editor_base`: the tree the base has at `path` once the edits above it are applied;
    /// `root_base`: the tree the base commit has at `path`.
    pub(super) fn view_dir(
        &self,
        st: &State,
        dir: u64,
        path: &[u8],
        editor_base: Option<ObjectId>,
        root_base: Option<ObjectId>,
        out: &mut Vec<ViewEdit>,
    ) -> Result<(), FsError> {
        let rec = &st.node(dir)?.rec;
        let own = Self::base_tree(rec).map(|(t, _)| t);
        let mut eff = editor_base;
        if root_base.is_none() && dir != ROOT_INO {
            out.push(ViewEdit::AddedDir {
                path: path.to_vec(),
            });
        }
        if own != editor_base {
            match own {
                Some(t) => out.push(ViewEdit::Tree {
                    path: path.to_vec(),
                    id: t,
                }),
                None if editor_base.is_some() => out.push(ViewEdit::Remove {
                    path: path.to_vec(),
                }),
                None => {}
            }
            eff = own;
        }
        let Some(overlay) = st.live.dirs.get(&dir) else {
            return Ok(());
        };
        let eff_entries = match eff {
            Some(t) => Some(self.tree_entries(t)?),
            None => None,
        };
        let rb_entries = match root_base {
            Some(t) => Some(self.tree_entries(t)?),
            None => None,
        };
        for (name, target) in overlay {
            if dir == ROOT_INO && name == b".git" {
                continue;
            }
            let cp = join(path, name);
            let eff_child = eff_entries
                .as_ref()
                .and_then(|e| find_entry(e, name))
                .cloned();
            let rb_child = rb_entries
                .as_ref()
                .and_then(|e| find_entry(e, name))
                .cloned();
            let Some(ino) = target else {
                if eff_child.is_some() {
                    out.push(ViewEdit::Remove { path: cp });
                }
                continue;
            };
            self.view_entry(st, &cp, *ino, eff_child, rb_child, out)?;
        }
        Ok(())
    }

    /// The edits for `cp`, which names node `ino` now: `eff_child` is what the tree being edited
    /// has there (once the edits above it are applied), `rb_child` what the base commit has there.
    fn view_entry(
        &self,
        st: &State,
        cp: &[u8],
        ino: u64,
        eff_child: Option<TreeEntry>,
        rb_child: Option<TreeEntry>,
        out: &mut Vec<ViewEdit>,
    ) -> Result<(), FsError> {
        let tree_of = |e: &Option<TreeEntry>| {
            e.as_ref()
                .filter(|e| e.kind == EntryKind::Tree)
                .map(|e| e.id)
        };
        let n = &st.node(ino)?.rec;
        let base_id = n
            .base
            .as_ref()
            .and_then(|b| ObjectId::from_hex(b.oid.as_bytes()).ok());
        let unchanged_as = |kind: EntryKind| {
            eff_child
                .as_ref()
                .is_some_and(|e| e.kind == kind && Some(e.id) == base_id)
        };
        let added = rb_child
            .as_ref()
            .is_none_or(|e| matches!(e.kind, EntryKind::Tree | EntryKind::Gitlink));
        match n.kind {
            Kind::Dir if n.base.as_ref().is_some_and(|b| b.gitlink) => {
                if !unchanged_as(EntryKind::Gitlink)
                    && let Some(id) = base_id
                {
                    out.push(ViewEdit::Gitlink {
                        path: cp.to_vec(),
                        id,
                    });
                }
            }
            Kind::Dir => {
                // A directory where the base has a file: the file goes first.
                if eff_child
                    .as_ref()
                    .is_some_and(|e| e.kind != EntryKind::Tree)
                {
                    out.push(ViewEdit::Remove { path: cp.to_vec() });
                }
                self.view_dir(st, ino, cp, tree_of(&eff_child), tree_of(&rb_child), out)?
            }
            Kind::File => {
                let exec = n.mode & 0o100 != 0;
                let kind = if exec {
                    EntryKind::Executable
                } else {
                    EntryKind::Blob
                };
                let source = if n.upper {
                    ViewSource::File(self.upper.data_path(n.ino))
                } else if let Some(shared) = &n.shared {
                    ViewSource::File(PathBuf::from(shared))
                } else if let Some(id) = base_id {
                    if unchanged_as(kind) {
                        return Ok(());
                    }
                    ViewSource::Object(id)
                } else {
                    ViewSource::Bytes(Vec::new())
                };
                out.push(ViewEdit::File {
                    path: cp.to_vec(),
                    exec,
                    source,
                    added,
                });
            }
            Kind::Symlink => {
                let source = match (&n.target, base_id) {
                    (Some(t), _) => ViewSource::Bytes(t.clone()),
                    (None, Some(id)) => {
                        if unchanged_as(EntryKind::Symlink) {
                            return Ok(());
                        }
                        ViewSource::Object(id)
                    }
                    (None, None) => ViewSource::Bytes(Vec::new()),
                };
                out.push(ViewEdit::Symlink {
                    path: cp.to_vec(),
                    source,
                    added,
                });
            }
            // git keeps no fifos, sockets or devices: such a name is not part of the state.
            _ => {
                if eff_child.is_some() {
                    out.push(ViewEdit::Remove { path: cp.to_vec() });
                }
            }
        }
        Ok(())
    }

    /// Every file, symlink and gitlink below tree `id`, with paths relative to it, as the edits that
    /// would add them (used when a moved directory must be taken apart).
    pub fn tree_files(&self, id: ObjectId) -> Result<Vec<(Vec<u8>, ViewEdit)>, FsError> {
        let mut out = Vec::new();
        let mut stack = vec![(Vec::new(), id)];
        while let Some((prefix, tree)) = stack.pop() {
            for e in self.tree_entries(tree)?.iter() {
                let p = join(&prefix, &e.name);
                let edit = match e.kind {
                    EntryKind::Tree => {
                        stack.push((p, e.id));
                        continue;
                    }
                    EntryKind::Blob | EntryKind::Executable => ViewEdit::File {
                        path: Vec::new(),
                        exec: e.kind == EntryKind::Executable,
                        source: ViewSource::Object(e.id),
                        added: true,
                    },
                    EntryKind::Symlink => ViewEdit::Symlink {
                        path: Vec::new(),
                        source: ViewSource::Object(e.id),
                        added: true,
                    },
                    EntryKind::Gitlink => ViewEdit::Gitlink {
                        path: Vec::new(),
                        id: e.id,
                    },
                };
                out.push((p, edit));
            }
        }
        Ok(out)
    }

    /// "Now" on the clock of the upper layer's files (see [`Upper::clock`]).
    pub fn clock(&self) -> Result<Ts, FsError> {
        self.upper.clock().context(|| {
            format!(
                "the clock of the upper layer {}",
                self.upper.dir().display()
            )
        })
    }

    /// The workspace's generation (committed batches since creation).
    pub fn generation(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live
            .generation
    }

    /// Whether anything may have changed since a view of `generation` read at `at`: metadata
    /// (generation), a file open for writing now, or a copied-up file written since (writes through
    /// passthrough reach the data file without the daemon).
    pub fn changed_since(&self, generation: u64, at: Ts, bookkeeping: &[u64]) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.live.generation != generation || st.live.inodes.values().any(|n| n.writers > 0) {
            return true;
        }
        // git writes its own files as new files (metadata changes, counted by the generation), so
        // `.git` is left out here: its files written just before the mark share its clock tick.
        let data: Vec<u64> = st
            .live
            .inodes
            .values()
            .filter(|n| n.persisted && n.rec.upper && !bookkeeping.contains(&n.rec.ino))
            .filter(|n| Self::path_of(&st, n.rec.ino).is_none_or(|p| !p.starts_with(b".git/")))
            .map(|n| n.rec.ino)
            .collect();
        drop(st);
        // The data files' times are read without the lock.
        data.into_iter().any(|ino| {
            std::fs::metadata(self.upper.data_path(ino))
                .map(|m| Ts(m.ctime(), m.ctime_nsec() as u32) >= at)
                .unwrap_or(true)
        })
    }

    /// Unix seconds of the last metadata request, and whether any file is open now.
    pub fn activity(&self) -> (u64, bool) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let open = st.live.inodes.values().any(|n| n.opens > 0);
        (self.last_activity.load(Ordering::Relaxed), open)
    }

    pub fn blob_cache(&self) -> &BlobCache {
        &self.blobs
    }

    // ----- what changed -----

    /// Every path that differs from the base commit, from the same consistent view snapshots use
    /// (so O(changed paths)): a directory that appeared or moved is listed once, as a directory.
    pub fn changes(&self) -> Result<Vec<Change>, FsError> {
        let view = self.view()?;
        let root = view.base_tree;
        let in_base = |path: &[u8]| -> Result<Option<EntryKind>, FsError> {
            let mut tree = root;
            let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
            for (i, c) in comps.iter().enumerate() {
                let entries = self.tree_entries(tree)?;
                let Some(e) = find_entry(&entries, c) else {
                    return Ok(None);
                };
                if i + 1 == comps.len() {
                    return Ok(Some(e.kind));
                }
                if e.kind != EntryKind::Tree {
                    return Ok(None);
                }
                tree = e.id;
            }
            Ok(None)
        };
        let mut out: BTreeMap<Vec<u8>, (ChangeKind, bool)> = BTreeMap::new();
        for e in &view.edits {
            let (path, kind, dir) = match e {
                ViewEdit::Remove { path } => match in_base(path)? {
                    Some(was) => (path, ChangeKind::Deleted, was == EntryKind::Tree),
                    // Removed from a directory that moved here: never at this path in the base.
                    None => continue,
                },
                ViewEdit::AddedDir { path } => match in_base(path)? {
                    Some(_) => (path, ChangeKind::Modified, true),
                    None => (path, ChangeKind::Added, true),
                },
                ViewEdit::Tree { path, .. } => match in_base(path)? {
                    Some(_) => (path, ChangeKind::Modified, true),
                    None => (path, ChangeKind::Added, true),
                },
                ViewEdit::Gitlink { path, .. } => match in_base(path)? {
                    Some(_) => (path, ChangeKind::Modified, false),
                    None => (path, ChangeKind::Added, false),
                },
                ViewEdit::File { path, .. } | ViewEdit::Symlink { path, .. } => {
                    match in_base(path)? {
                        Some(_) => (path, ChangeKind::Modified, false),
                        None => (path, ChangeKind::Added, false),
                    }
                }
            };
            // A later edit of the same path (a removal followed by a replacement) says what it is now.
            let merged = match out.get(path) {
                Some((ChangeKind::Deleted, _)) if kind != ChangeKind::Deleted => {
                    ChangeKind::Modified
                }
                _ => kind,
            };
            out.insert(path.clone(), (merged, dir));
        }
        // A removal with something below it afterwards (a directory replaced by another one that
        // holds files): the path is still there, modified.
        let present: Vec<Vec<u8>> = out
            .iter()
            .filter(|(_, (kind, _))| *kind != ChangeKind::Deleted)
            .map(|(p, _)| p.clone())
            .collect();
        for p in present {
            let mut up = &p[..];
            while let Some(i) = up.iter().rposition(|b| *b == b'/') {
                up = &up[..i];
                if let Some(e) = out.get_mut(up)
                    && e.0 == ChangeKind::Deleted
                {
                    *e = (ChangeKind::Modified, true);
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|(p, (kind, dir))| Change {
                path: String::from_utf8_lossy(&p).into_owned(),
                kind,
                dir,
            })
            .collect())
    }
}

/// Where a path of the working state leads.
enum At {
    /// A node of the overlay (changed, or linked on the way to a change).
    Node(u64),
    /// An entry of a base tree under no change.
    Base(TreeEntry),
}

/// The edits that put base entry `e` at `path` into a tree that has nothing there, as a full view
/// would list them (`rb`: what the base commit has at `path`).
fn base_edits(path: &[u8], e: &TreeEntry, rb: Option<TreeEntry>, out: &mut Vec<ViewEdit>) {
    let added = rb
        .as_ref()
        .is_none_or(|e| matches!(e.kind, EntryKind::Tree | EntryKind::Gitlink));
    let path = path.to_vec();
    match e.kind {
        EntryKind::Tree => {
            if rb.as_ref().is_none_or(|r| r.kind != EntryKind::Tree) {
                out.push(ViewEdit::AddedDir { path: path.clone() });
            }
            out.push(ViewEdit::Tree { path, id: e.id });
        }
        EntryKind::Blob | EntryKind::Executable => out.push(ViewEdit::File {
            path,
            exec: e.kind == EntryKind::Executable,
            source: ViewSource::Object(e.id),
            added,
        }),
        EntryKind::Symlink => out.push(ViewEdit::Symlink {
            path,
            source: ViewSource::Object(e.id),
            added,
        }),
        EntryKind::Gitlink => out.push(ViewEdit::Gitlink { path, id: e.id }),
    }
}
