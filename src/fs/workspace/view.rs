//! The snapshot view: in one critical section, every edit that turns the base tree into the working
//! state (O(changed paths), no content read), and the list of changes `status` derives from it.
//! Reads the state and the object store; changes nothing.

use std::collections::BTreeMap;
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
    ROOT_INO, State, WorkspaceFs, convert::eio, convert::join, tree_order::find_entry,
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
            edits,
            meta,
            generation: st.live.generation,
            taken_at,
        })
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
            let tree_of = |e: &Option<TreeEntry>| {
                e.as_ref()
                    .filter(|e| e.kind == EntryKind::Tree)
                    .map(|e| e.id)
            };
            let Some(ino) = target else {
                if eff_child.is_some() {
                    out.push(ViewEdit::Remove { path: cp });
                }
                continue;
            };
            let n = &st.node(*ino)?.rec;
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
                        out.push(ViewEdit::Gitlink { path: cp, id });
                    }
                }
                Kind::Dir => {
                    // A directory where the base has a file: the file goes first.
                    if eff_child
                        .as_ref()
                        .is_some_and(|e| e.kind != EntryKind::Tree)
                    {
                        out.push(ViewEdit::Remove { path: cp.clone() });
                    }
                    self.view_dir(st, *ino, &cp, tree_of(&eff_child), tree_of(&rb_child), out)?
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
                            continue;
                        }
                        ViewSource::Object(id)
                    } else {
                        ViewSource::Bytes(Vec::new())
                    };
                    out.push(ViewEdit::File {
                        path: cp,
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
                                continue;
                            }
                            ViewSource::Object(id)
                        }
                        (None, None) => ViewSource::Bytes(Vec::new()),
                    };
                    out.push(ViewEdit::Symlink {
                        path: cp,
                        source,
                        added,
                    });
                }
                // git keeps no fifos, sockets or devices: such a name is not part of the state.
                _ => {
                    if eff_child.is_some() {
                        out.push(ViewEdit::Remove { path: cp });
                    }
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
