//! Resolving a name in a directory to a node of the live table (overlay first, then base tree),
//! the kernel's references to nodes and their release: a base file or symlink only the kernel
//! refers to is kept light ([`super::light`]) and made full ([`WorkspaceFs::expand`]) when a
//! request may change or open it; a node goes when the kernel has forgotten it, nothing has it open
//! and it has no record ([`WorkspaceFs::reap`]). Also the adoption of every name after a crash
//! ([`WorkspaceFs::register_all`]) and what the table costs, for `stats` and tests.
//!
//! Does not touch the catalog or the upper layer's files (but for removing the data file of an
//! unlinked inode the last reference to which is gone).

use std::sync::{Arc, MutexGuard};

use crate::fs::FsError;
use fuser::Errno;
use gix::ObjectId;

use crate::cow::catalog::{InodeRecord, Kind};
use crate::git::objects::{EntryKind, TreeEntry};

use super::{
    ROOT_INO, State, WorkspaceFs,
    convert::join,
    inodes::{Node, path_ino},
    light::Light,
    tree_order::find_index,
    trim,
};

impl WorkspaceFs {
    /// The base tree a directory node lists (None for new directories and gitlinks).
    pub(super) fn base_tree(rec: &InodeRecord) -> Option<(ObjectId, &[u8])> {
        let b = rec.base.as_ref()?;
        if rec.kind != Kind::Dir || b.gitlink {
            return None;
        }
        ObjectId::from_hex(b.oid.as_bytes())
            .ok()
            .map(|o| (o, &b.path[..]))
    }

    /// The inode number for base path `path`, salted past a different path holding the plain hash.
    pub(super) fn derived_ino(&self, st: &State, path: &[u8]) -> Result<u64, FsError> {
        let mut salt = 0;
        loop {
            let ino = path_ino(path, salt);
            let other = match st.live.inodes.get(&ino) {
                Some(n) => n.rec.base.as_ref().is_some_and(|b| b.path != path),
                None => match st.live.inodes.light.get(&ino) {
                    Some(l) => !self.light_path_is(st, &l, path)?,
                    None => false,
                },
            };
            if !other {
                return Ok(ino);
            }
            salt += 1;
        }
    }

    /// Whether light node `l` is base path `path`.
    fn light_path_is(&self, st: &State, l: &Light, path: &[u8]) -> Result<bool, FsError> {
        let (entries, parent_path) = self.light_parent(st, l)?;
        let Some(e) = entries.get(l.idx as usize) else {
            return Ok(false);
        };
        Ok(if parent_path.is_empty() {
            path == &*e.name
        } else {
            path.len() == parent_path.len() + 1 + e.name.len()
                && path.starts_with(&parent_path)
                && path[parent_path.len()] == b'/'
                && path.ends_with(&e.name)
        })
    }

    /// The base tree entries and base path of light node `l`'s parent.
    fn light_parent(&self, st: &State, l: &Light) -> Result<(Arc<[TreeEntry]>, Vec<u8>), FsError> {
        let p = st.node(l.parent).map_err(|_| FsError::from(Errno::EIO))?;
        let (tree, path) = Self::base_tree(&p.rec).ok_or(Errno::EIO)?;
        let path = path.to_vec();
        Ok((self.tree_entries(tree)?, path))
    }

    /// The record of light node `ino`, derived again from its parent's base tree.
    fn light_rec(&self, st: &State, ino: u64, l: &Light) -> Result<InodeRecord, FsError> {
        let (entries, parent_path) = self.light_parent(st, l)?;
        let e = entries.get(l.idx as usize).ok_or(Errno::EIO)?;
        self.derived_rec(l.parent, &parent_path, e, ino)
    }

    /// The record of `ino`, full or light (a light one derived, nothing registered): for requests
    /// that only read it.
    pub(super) fn record(&self, st: &State, ino: u64) -> Result<InodeRecord, FsError> {
        if let Some(n) = st.live.inodes.get(&ino) {
            return Ok(n.rec.clone());
        }
        match st.live.inodes.light.get(&ino) {
            Some(l) => self.light_rec(st, ino, &l),
            None => Err(Errno::ENOENT.into()),
        }
    }

    /// Makes `ino` a full node if it is light, for a request that may change it, open it or count
    /// on [`State::node`] finding it. A no-op for anything else.
    pub(super) fn expand(&self, st: &mut State, ino: u64) -> Result<(), FsError> {
        let Some(l) = st.live.inodes.light.get(&ino) else {
            return Ok(());
        };
        let rec = self.light_rec(st, ino, &l)?;
        st.live.inodes.take_light(ino);
        st.live
            .inodes
            .insert(ino, Node::derived(rec, u64::from(l.lookups)));
        // The parent is not reaped here even if nothing refers to it any more: the request may be
        // about to use it (an unlink in it); it goes at its next forget, as any derived node.
        Ok(())
    }

    /// Locks the state with `ino` a full node (see [`Self::expand`]).
    pub(super) fn lock_for(&self, ino: u64) -> Result<MutexGuard<'_, State>, FsError> {
        let mut st = self.lock();
        self.expand(&mut st, ino)?;
        Ok(st)
    }

    /// The inode `name` names in directory `parent`, registering a derived node if needed: always a
    /// full node, for requests that go on to change it.
    pub(super) fn resolve(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
    ) -> Result<Option<u64>, FsError> {
        let ino = self.resolve_as(st, parent, name, false)?;
        if let Some(ino) = ino {
            self.expand(st, ino)?;
        }
        Ok(ino)
    }

    /// A kernel reference to `name` in `parent` (`lookup`, a readdirplus entry): resolves it,
    /// counts the reference and returns the record. A base file or symlink nobody changed or opened
    /// is kept light.
    pub(super) fn reference(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
    ) -> Result<Option<InodeRecord>, FsError> {
        let Some(ino) = self.resolve_as(st, parent, name, true)? else {
            return Ok(None);
        };
        if let Some(mut l) = st.live.inodes.light.get(&ino) {
            l.lookups += 1;
            if st.live.inodes.light.set_lookups(&ino, l.lookups) {
                return self.light_rec(st, ino, &l).map(Some);
            }
            // More references than a light node counts: a full node counts them.
            self.expand(st, ino)?;
        }
        let n = st.node_mut(ino)?;
        n.lookups += 1;
        let rec = n.rec.clone();
        self.settle(st, ino);
        Ok(Some(rec))
    }

    /// Resolves `name` in `parent`; an entry of the base not yet in the table is registered as a
    /// light node (with no references yet) when `light` and it is a file or symlink, else as a full
    /// one. An existing light node stays light.
    fn resolve_as(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
        light: bool,
    ) -> Result<Option<u64>, FsError> {
        let p = st.node(parent)?;
        if p.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        if p.rec.nlink == 0 {
            return Ok(None);
        }
        if let Some(e) = st.live.dirs.get(&parent).and_then(|d| d.get(name)) {
            return Ok(*e);
        }
        let Some((tree, parent_path)) = Self::base_tree(&p.rec) else {
            return Ok(None);
        };
        let parent_path = parent_path.to_vec();
        let entries = self.tree_entries(tree)?;
        let Some(idx) = find_index(&entries, name) else {
            return Ok(None);
        };
        let e = &entries[idx];
        let path = join(&parent_path, name);
        let ino = self.derived_ino(st, &path)?;
        if st.live.inodes.has(ino) {
            return Ok(Some(ino));
        }
        let small = light && !matches!(e.kind, EntryKind::Tree | EntryKind::Gitlink);
        let lit = small
            && u32::try_from(idx).is_ok_and(|idx| {
                st.live.inodes.insert_light(
                    ino,
                    Light {
                        parent,
                        idx,
                        lookups: 0,
                    },
                )
            });
        if !lit {
            let rec = self.derived_rec(parent, &parent_path, e, ino)?;
            st.live.inodes.insert(ino, Node::derived(rec, 0));
        }
        Ok(Some(ino))
    }

    /// For a daemon adopting the mount of one that died (docs/restart.md "A crash"): registers
    /// every name the workspace presents, directories as full nodes and base files as light ones,
    /// each counted as one kernel reference. The kernel still refers to the dead daemon's inodes
    /// (cached entries, open files, working directories) by their numbers, which are stable
    /// (`docs/inodes.md`); registered, each is found again as it was. Uncounted, a node would go
    /// at its first release (nothing would refer to it) while the kernel still uses it; counted
    /// once, it goes when the kernel forgets it (a forget takes the count to zero, never below). A
    /// node the kernel never refers to stays until unmounted (16 bytes a base file). Returns how
    /// many names were registered.
    pub fn register_all(&self) -> Result<usize, FsError> {
        let mut dirs = vec![ROOT_INO];
        let mut n = 0;
        while let Some(dir) = dirs.pop() {
            let names: Vec<(Vec<u8>, bool)> = self
                .readdir(dir)?
                .into_iter()
                .filter(|e| e.name != "." && e.name != "..")
                .map(|e| {
                    (
                        e.name.as_encoded_bytes().to_vec(),
                        e.attr.kind == fuser::FileType::Directory,
                    )
                })
                .collect();
            let mut st = self.lock();
            for (name, is_dir) in names {
                if let Some(rec) = self.reference(&mut st, dir, &name)? {
                    n += 1;
                    if is_dir {
                        dirs.push(rec.ino);
                    }
                }
            }
        }
        Ok(n)
    }

    /// Makes full node `ino` light again if it is a base file or symlink nobody changed, opens or
    /// copies and the kernel still refers to: exactly what deriving it again gives (checked).
    fn settle(&self, st: &mut State, ino: u64) {
        let Some(n) = st.live.inodes.get(&ino) else {
            return;
        };
        if n.persisted
            || n.opens > 0
            || n.writers > 0
            || n.pins > 0
            || n.lookups == 0
            || matches!(n.rec.kind, Kind::Dir)
            || n.rec.nlink == 0
            || n.rec.upper
            || n.rec.base.is_none()
            || st.batch.is_some()
            || st.copying.contains(&ino)
        {
            return;
        }
        let Ok(lookups) = u32::try_from(n.lookups) else {
            return;
        };
        let parent = n.rec.parent;
        if st
            .live
            .dirs
            .get(&parent)
            .is_some_and(|d| d.contains_key(&n.rec.name))
        {
            return;
        }
        let Some(p) = st.live.inodes.get(&parent) else {
            return;
        };
        let Some((tree, parent_path)) = Self::base_tree(&p.rec) else {
            return;
        };
        let Ok(entries) = self.tree_entries(tree) else {
            return;
        };
        let Some(idx) = find_index(&entries, &n.rec.name) else {
            return;
        };
        let (Ok(derived), Ok(idx32)) = (
            self.derived_rec(parent, parent_path, &entries[idx], ino),
            u32::try_from(idx),
        ) else {
            return;
        };
        if derived != n.rec {
            return;
        }
        let l = Light {
            parent,
            idx: idx32,
            lookups,
        };
        if !st.live.inodes.light.fits(&l) {
            return;
        }
        let full = st.live.inodes.remove(&ino);
        if !st.live.inodes.insert_light(ino, l)
            && let Some(n) = full
        {
            // Cannot happen (it fits, checked above); the node stays full if it does.
            st.live.inodes.insert(ino, n);
        }
    }

    /// Drops node `ino` if nothing refers to it any more (no kernel reference, no open, no record,
    /// no light child); else makes it light if it can be.
    pub(super) fn reap(&self, st: &mut State, ino: u64) {
        if ino == ROOT_INO {
            return;
        }
        // Data goes only after the record that dropped it is written (see `Batch`).
        if let Some(b) = st.batch.as_mut() {
            b.reaps.push(ino);
            return;
        }
        if let Some(l) = st.live.inodes.light.get(&ino) {
            if l.lookups == 0 {
                let parent = l.parent;
                st.live.inodes.take_light(ino);
                self.reap(st, parent);
            }
            return;
        }
        let Some(n) = st.live.inodes.get(&ino) else {
            return;
        };
        if n.lookups == 0 && n.opens == 0 && !n.persisted && n.pins == 0 {
            let upper = n.rec.upper && n.rec.nlink == 0;
            st.live.inodes.remove_full(ino);
            if upper {
                self.upper.remove(ino);
            }
        } else {
            self.settle(st, ino);
        }
    }

    /// Nodes in the live table, full and light: what the workspace's inode table costs (a full
    /// node is a record, a light one 16 bytes).
    pub fn node_counts(&self) -> (usize, usize) {
        self.lock().live.inodes.counts()
    }

    /// Bytes the live inode table itself holds (map slots by capacity, the full nodes, the light
    /// table; not the names and paths records own on the heap): for tests and `stats`.
    pub fn node_table_bytes(&self) -> usize {
        self.lock().live.inodes.bytes()
    }

    /// The in-memory sizes of a full node, a light node's map slot and an inode record, in bytes:
    /// what a workspace's table costs per entry, for tests that bound it.
    pub fn node_sizes() -> (usize, usize, usize) {
        (
            std::mem::size_of::<Node>(),
            std::mem::size_of::<(u64, u64)>(),
            std::mem::size_of::<InodeRecord>(),
        )
    }

    /// How many times the daemon gave the memory of forgotten nodes back to the system (the
    /// allocator trims of the whole process; see the module doc).
    pub fn allocator_trims() -> u64 {
        trim::allocator_trims()
    }

    /// Kernel references dropped (`forget`).
    pub(super) fn unreference(&self, st: &mut State, ino: u64, n: u64) {
        if let Some(l) = st.live.inodes.light.get(&ino) {
            let left = u32::try_from(u64::from(l.lookups).saturating_sub(n)).unwrap_or(0);
            st.live.inodes.light.set_lookups(&ino, left);
        } else if let Some(node) = st.live.inodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
        }
        self.reap(st, ino);
    }
}
