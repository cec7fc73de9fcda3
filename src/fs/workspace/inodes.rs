//! The live inode table ([`Nodes`]): a full [`Node`] per inode the kernel or an open file refers
//! to (or that has a catalog record) beside the light nodes ([`super::light`]), what the table
//! costs in memory, the table as the catalog's [`InodeTable`], and derived inode numbering by path
//! hash ([`path_ino`], `docs/inodes.md`).
//!
//! Resolving names to nodes, making nodes light or full and reaping them is [`super::resolve`];
//! giving freed memory back to the system is [`super::trim`]. Does not touch the catalog or the
//! upper layer's files.

use std::collections::HashMap;

use crate::cow::catalog::{InodeRecord, InodeTable};

use super::{
    ALLOCATED, ROOT_INO,
    light::{Light, LightTable},
    trim,
};

pub(super) struct Node {
    pub(super) rec: InodeRecord,
    /// Has a catalog record (else derived from the base, or unlinked).
    pub(super) persisted: bool,
    /// References the kernel holds (lookups, readdirplus entries, creates), minus forgets.
    pub(super) lookups: u64,
    /// Open file handles, and how many of them may write.
    pub(super) opens: u32,
    pub(super) writers: u32,
    /// [`Light`] nodes naming this directory as their parent: it stays while they do, since they
    /// are derived from its base tree.
    pub(super) pins: u32,
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
            pins: 0,
        }
    }

    /// A node derived from the base, with `lookups` kernel references.
    pub(super) fn derived(rec: InodeRecord, lookups: u64) -> Node {
        Node {
            rec,
            persisted: false,
            lookups,
            opens: 0,
            writers: 0,
            pins: 0,
        }
    }
}

/// The live inode table: full nodes and light ones. Full nodes are boxed (a map slot is then 16
/// bytes, not a whole node, and a map grows by doubling); the inherent `get`/`insert`/... take and
/// give plain [`Node`]s, and the map itself is reachable read-only through `Deref` so that code
/// which needs a record finds exactly the nodes that have one.
#[derive(Default)]
pub(super) struct Nodes {
    full: HashMap<u64, Box<Node>>,
    pub(super) light: LightTable,
}

impl std::ops::Deref for Nodes {
    type Target = HashMap<u64, Box<Node>>;
    fn deref(&self) -> &HashMap<u64, Box<Node>> {
        &self.full
    }
}

impl Nodes {
    pub(super) fn new(full: HashMap<u64, Node>) -> Nodes {
        Nodes {
            full: full.into_iter().map(|(i, n)| (i, Box::new(n))).collect(),
            light: LightTable::default(),
        }
    }

    /// Full node `ino`.
    pub(super) fn get(&self, ino: &u64) -> Option<&Node> {
        self.full.get(ino).map(|n| &**n)
    }

    pub(super) fn get_mut(&mut self, ino: &u64) -> Option<&mut Node> {
        self.full.get_mut(ino).map(|n| &mut **n)
    }

    /// Adds (or replaces) full node `ino`.
    pub(super) fn insert(&mut self, ino: u64, n: Node) -> Option<Node> {
        self.full.insert(ino, Box::new(n)).map(|b| *b)
    }

    /// Full node `ino`, added by `f` if there is none.
    pub(super) fn get_or_insert_with(&mut self, ino: u64, f: impl FnOnce() -> Node) -> &mut Node {
        self.full.entry(ino).or_insert_with(|| Box::new(f()))
    }

    /// The full nodes.
    pub(super) fn values(&self) -> impl Iterator<Item = &Node> {
        self.full.values().map(|n| &**n)
    }

    /// Whether `ino` is in the table, full or light.
    pub(super) fn has(&self, ino: u64) -> bool {
        self.full.contains_key(&ino) || self.light.contains_key(&ino)
    }

    /// Adds light node `ino` and pins its parent; false, with nothing changed, if it does not fit
    /// a packed slot (the caller keeps a full node).
    pub(super) fn insert_light(&mut self, ino: u64, l: Light) -> bool {
        if !self.light.insert(ino, l) {
            return false;
        }
        if let Some(p) = self.get_mut(&l.parent) {
            p.pins += 1;
        }
        true
    }

    /// Takes light node `ino` out of the table (unpinning its parent).
    pub(super) fn take_light(&mut self, ino: u64) -> Option<Light> {
        let l = self.light.remove(&ino)?;
        if let Some(p) = self.get_mut(&l.parent) {
            p.pins = p.pins.saturating_sub(1);
        }
        Some(l)
    }

    /// Removes full node `ino`, giving memory back once the table is mostly empty.
    pub(super) fn remove(&mut self, ino: &u64) -> Option<Node> {
        let n = self.full.remove(ino)?;
        trim::freed(node_heap_bytes(&n));
        if self.full.capacity() > 1024 && self.full.len() * 4 < self.full.capacity() {
            self.full.shrink_to(self.full.len() * 2);
        }
        Some(*n)
    }

    /// Removes full node `ino` (see [`Self::remove`]).
    pub(super) fn remove_full(&mut self, ino: u64) -> Option<Node> {
        self.remove(&ino)
    }

    /// Nodes in the table: (full, light).
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.full.len(), self.light.len())
    }

    /// Bytes the table itself holds: map slots (by capacity), the boxed nodes and the light
    /// table; not the heap data of records (names, paths).
    pub(super) fn bytes(&self) -> usize {
        self.full.capacity() * (std::mem::size_of::<(u64, Box<Node>)>() + 1)
            + self.full.len() * std::mem::size_of::<Node>()
            + self.light.bytes()
    }
}

/// The heap a full node holds: its box, its map slot, and the blocks its record owns (with
/// glibc's 16 bytes of header and rounding each).
fn node_heap_bytes(n: &Node) -> usize {
    let block = |cap: usize| {
        if cap == 0 {
            0
        } else {
            cap.next_multiple_of(16) + 16
        }
    };
    let r = &n.rec;
    std::mem::size_of::<Node>()
        + 16
        + std::mem::size_of::<(u64, Box<Node>)>()
        + 1
        + block(r.name.capacity())
        + r.base
            .as_ref()
            .map_or(0, |b| block(b.oid.capacity()) + block(b.path.capacity()))
        + r.target.as_ref().map_or(0, |t| block(t.capacity()))
        + r.shared.as_ref().map_or(0, |s| block(s.capacity()))
        + r.xattrs
            .iter()
            .map(|(k, v)| 64 + block(k.capacity()) + block(v.capacity()))
            .sum::<usize>()
}

/// A table dropped whole (its workspace released, or its state replaced) frees all it held.
impl Drop for Nodes {
    fn drop(&mut self) {
        let records: usize = self.full.values().map(|n| node_heap_bytes(n)).sum();
        trim::freed(records + self.light.bytes());
    }
}

/// The live nodes as the catalog's inode table: a dropped record leaves its node (unlinked) for as
/// long as the kernel or an open file refers to it.
impl InodeTable for Nodes {
    fn set(&mut self, rec: &InodeRecord) {
        match self.get_mut(&rec.ino) {
            Some(n) => {
                n.rec = rec.clone();
                n.persisted = true;
            }
            None => {
                // A light node (never the case for a change made through a request, which
                // expands it first) keeps its kernel references.
                let lookups = self.take_light(rec.ino).map_or(0, |l| u64::from(l.lookups));
                let mut n = Node::persisted(rec.clone());
                n.lookups = lookups;
                self.insert(rec.ino, n);
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
