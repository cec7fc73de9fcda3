//! The live inode table: a [`Node`] per inode the kernel or an open file refers to (or that has a
//! catalog record), derived inode numbering by path hash (`docs/inodes.md`), resolving a name in a
//! directory (overlay first, then base tree), a node's path, and reaping nodes nobody refers to.

use std::collections::HashMap;

use crate::fs::FsError;
use fuser::Errno;
use gix::ObjectId;

use crate::cow::catalog::{InodeRecord, Kind};

use crate::cow::catalog::InodeTable;

use super::{ALLOCATED, ROOT_INO, State, WorkspaceFs, convert::join, tree_order::find_entry};

pub(super) struct Node {
    pub(super) rec: InodeRecord,
    /// Has a catalog record (else derived from the base, or unlinked).
    pub(super) persisted: bool,
    /// References the kernel holds (lookups, readdirplus entries, creates), minus forgets.
    pub(super) lookups: u64,
    /// Open file handles, and how many of them may write.
    pub(super) opens: u32,
    pub(super) writers: u32,
}

impl Node {
    /// A node for a record of the catalog, not yet referenced by the kernel.
    pub(super) fn persisted(rec: InodeRecord) -> Node {
        Node {
            rec,
            persisted: true,
            lookups: 0,
            opens: 0,
            writers: 0,
        }
    }
}

/// The live nodes as the catalog's inode table: a dropped record leaves its node (unlinked) for as
/// long as the kernel or an open file refers to it.
impl InodeTable for HashMap<u64, Node> {
    fn set(&mut self, rec: &InodeRecord) {
        match self.get_mut(&rec.ino) {
            Some(n) => {
                n.rec = rec.clone();
                n.persisted = true;
            }
            None => {
                self.insert(rec.ino, Node::persisted(rec.clone()));
            }
        }
    }

    fn drop_record(&mut self, ino: u64) {
        if let Some(n) = self.get_mut(&ino) {
            n.persisted = false;
            n.rec.nlink = 0;
        }
    }
}
/// The inode number of base path `path`: the first 8 bytes of its BLAKE3 hash, top bit clear, never
/// 0 or 1 (1 is the root). `salt` moves a colliding path to another number.
pub fn path_ino(path: &[u8], salt: u32) -> u64 {
    if path.is_empty() {
        return ROOT_INO;
    }
    let mut h = blake3::Hasher::new();
    h.update(path);
    if salt != 0 {
        h.update(&salt.to_le_bytes());
    }
    let bytes = h.finalize();
    let first = bytes
        .as_bytes()
        .first_chunk::<8>()
        .copied()
        .unwrap_or_default();
    let n = u64::from_le_bytes(first) & !ALLOCATED;
    if n < 2 { n + 2 } else { n }
}
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
    pub(super) fn derived_ino(st: &State, path: &[u8]) -> u64 {
        let mut salt = 0;
        loop {
            let ino = path_ino(path, salt);
            match st.live.inodes.get(&ino) {
                Some(n) if n.rec.base.as_ref().is_some_and(|b| b.path != path) => salt += 1,
                _ => return ino,
            }
        }
    }

    /// The inode `name` names in directory `parent`, registering a derived node if needed.
    pub(super) fn resolve(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
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
        let Some(e) = find_entry(&entries, name) else {
            return Ok(None);
        };
        let path = join(&parent_path, name);
        let ino = Self::derived_ino(st, &path);
        if let std::collections::hash_map::Entry::Vacant(slot) = st.live.inodes.entry(ino) {
            let rec = self.derived_rec(parent, &parent_path, e, ino)?;
            slot.insert(Node {
                rec,
                persisted: false,
                lookups: 0,
                opens: 0,
                writers: 0,
            });
        }
        Ok(Some(ino))
    }
    pub(super) fn reap(&self, st: &mut State, ino: u64) {
        if ino == ROOT_INO {
            return;
        }
        // Data goes only after the record that dropped it is written (see `Batch`).
        if let Some(b) = st.batch.as_mut() {
            b.reaps.push(ino);
            return;
        }
        let Some(n) = st.live.inodes.get(&ino) else {
            return;
        };
        if n.lookups == 0 && n.opens == 0 && !n.persisted {
            let upper = n.rec.upper && n.rec.nlink == 0;
            st.live.inodes.remove(&ino);
            if upper {
                self.upper.remove(ino);
            }
        }
    }
}
