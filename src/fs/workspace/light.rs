//! Light nodes: a base file or symlink that only the kernel refers to (what a `git status` leaves
//! behind, one per file) is kept as its parent and its index in the parent's base tree, packed in
//! one word of a [`LightTable`] (16 bytes a node); its record is derived again when a request reads
//! it, and it becomes a full node when a request may change or open it
//! ([`super::WorkspaceFs::expand`]). Its parent directory stays (pinned) while it does.
//!
//! Owns the packing and the slot table of parents only: pinning the parent node is the table of
//! full nodes' ([`super::inodes::Nodes`]), deciding when a node is light is [`super::resolve`].

use std::collections::HashMap;

use super::trim;

/// A base file or symlink nobody changed or has open, which only the kernel refers to (the bulk of
/// the table after a `git status`): 8 bytes beside its number instead of a [`Node`] and its record.
/// Its record is derived again, identically, from entry `idx` of its parent's base tree whenever a
/// request needs it ([`WorkspaceFs::expand`]). This is the unpacked view of a [`LightTable`] slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Light {
    /// The directory whose base tree holds the entry (a full node, pinned).
    pub(super) parent: u64,
    /// The entry's index in that tree.
    pub(super) idx: u32,
    /// References the kernel holds (exact: a node that would pass [`LightTable::MAX_LOOKUPS`]
    /// stays full).
    pub(super) lookups: u32,
}

/// What a light node holds of the heap: its map slot and control byte (the freed slots come back
/// when the map shrinks).
const LIGHT_BYTES: usize = std::mem::size_of::<(u64, u64)>() + 1;

/// Bits of a packed light node: the parent's slot in [`LightTable::parents`], the entry's index in
/// the parent's tree, the kernel's references. A node whose numbers do not fit stays full.
const SLOT_BITS: u32 = 24;
const IDX_BITS: u32 = 24;
const LOOKUP_BITS: u32 = 16;
const _: () = assert!(SLOT_BITS + IDX_BITS + LOOKUP_BITS == 64);

/// The light nodes: inode number → one packed `u64` (a 16-byte slot in the map, where a [`Light`]
/// beside its key took 24), the parent directories they name kept once each in a slot table.
#[derive(Default)]
pub(super) struct LightTable {
    map: HashMap<u64, u64>,
    /// Slot → parent directory inode (0: a free slot).
    parents: Vec<u64>,
    /// Parent directory inode → (its slot, light nodes naming it).
    slots: HashMap<u64, (u32, u32)>,
    free: Vec<u32>,
}

impl LightTable {
    /// The most kernel references a light node counts; one more makes it full.
    pub(super) const MAX_LOOKUPS: u32 = (1 << LOOKUP_BITS) - 1;
    const MAX_IDX: u32 = (1 << IDX_BITS) - 1;
    const MAX_SLOT: u32 = (1 << SLOT_BITS) - 1;

    fn unpack(&self, v: u64) -> Light {
        let slot = (v >> (IDX_BITS + LOOKUP_BITS)) as usize;
        Light {
            parent: self.parents.get(slot).copied().unwrap_or(0),
            idx: ((v >> LOOKUP_BITS) & u64::from(Self::MAX_IDX)) as u32,
            lookups: (v & u64::from(Self::MAX_LOOKUPS)) as u32,
        }
    }

    /// Light node `ino`, unpacked.
    pub(super) fn get(&self, ino: &u64) -> Option<Light> {
        self.map.get(ino).map(|&v| self.unpack(v))
    }

    pub(super) fn contains_key(&self, ino: &u64) -> bool {
        self.map.contains_key(ino)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether `l` fits a packed slot (else the node stays full).
    pub(super) fn fits(&self, l: &Light) -> bool {
        l.idx <= Self::MAX_IDX
            && l.lookups <= Self::MAX_LOOKUPS
            && (self.slots.contains_key(&l.parent)
                || !self.free.is_empty()
                || self.parents.len() <= Self::MAX_SLOT as usize)
    }

    /// Adds (or replaces) light node `ino`; false, with nothing changed, if it does not fit.
    /// Pinning the parent node is the caller's.
    pub(super) fn insert(&mut self, ino: u64, l: Light) -> bool {
        if !self.fits(&l) {
            return false;
        }
        if let Some(old) = self.map.get(&ino).copied() {
            // Only the count can change for a node already there (its parent and index are its
            // path); anything else is replaced whole.
            let o = self.unpack(old);
            if o.parent == l.parent && o.idx == l.idx {
                return self.set_lookups(&ino, l.lookups);
            }
            self.remove(&ino);
        }
        let slot = match self.slots.get_mut(&l.parent) {
            Some((slot, n)) => {
                *n += 1;
                *slot
            }
            None => {
                let slot = match self.free.pop() {
                    Some(s) => s,
                    None => {
                        self.parents.push(0);
                        (self.parents.len() - 1) as u32
                    }
                };
                if let Some(p) = self.parents.get_mut(slot as usize) {
                    *p = l.parent;
                }
                self.slots.insert(l.parent, (slot, 1));
                slot
            }
        };
        let v = (u64::from(slot) << (IDX_BITS + LOOKUP_BITS))
            | (u64::from(l.idx) << LOOKUP_BITS)
            | u64::from(l.lookups);
        self.map.insert(ino, v);
        true
    }

    /// Sets light node `ino`'s kernel references; false, with nothing changed, if `lookups` does
    /// not fit (the caller makes the node full) or there is no such node.
    pub(super) fn set_lookups(&mut self, ino: &u64, lookups: u32) -> bool {
        if lookups > Self::MAX_LOOKUPS {
            return false;
        }
        match self.map.get_mut(ino) {
            Some(v) => {
                *v = (*v & !u64::from(Self::MAX_LOOKUPS)) | u64::from(lookups);
                true
            }
            None => false,
        }
    }

    /// Takes light node `ino` out (its parent's slot goes with the last node naming it). The map
    /// gives memory back once it is mostly empty (after the kernel forgot what a `git status`
    /// looked up).
    pub(super) fn remove(&mut self, ino: &u64) -> Option<Light> {
        let v = self.map.remove(ino)?;
        trim::freed(LIGHT_BYTES);
        let l = self.unpack(v);
        if let Some((slot, n)) = self.slots.get_mut(&l.parent) {
            *n -= 1;
            if *n == 0 {
                let slot = *slot;
                self.slots.remove(&l.parent);
                if let Some(p) = self.parents.get_mut(slot as usize) {
                    *p = 0;
                }
                self.free.push(slot);
            }
        }
        if self.slots.is_empty() {
            self.parents = Vec::new();
            self.free = Vec::new();
            self.slots = HashMap::new();
        }
        if self.map.capacity() > 1024 && self.map.len() * 4 < self.map.capacity() {
            self.map.shrink_to(self.map.len() * 2);
        }
        Some(l)
    }

    /// Every light node, unpacked.
    pub(super) fn iter(&self) -> LightIter<'_> {
        LightIter {
            it: self.map.iter(),
            table: self,
        }
    }

    /// Bytes the table holds (its maps' slots, by capacity): what a workspace's light nodes cost.
    pub(super) fn bytes(&self) -> usize {
        // A hashbrown slot is the entry plus one control byte.
        self.map.capacity() * (std::mem::size_of::<(u64, u64)>() + 1)
            + self.slots.capacity() * (std::mem::size_of::<(u64, (u32, u32))>() + 1)
            + self.parents.capacity() * std::mem::size_of::<u64>()
            + self.free.capacity() * std::mem::size_of::<u32>()
    }
}

/// The light nodes of a [`LightTable`], unpacked: (number, node).
pub(super) struct LightIter<'a> {
    it: std::collections::hash_map::Iter<'a, u64, u64>,
    table: &'a LightTable,
}

impl<'a> Iterator for LightIter<'a> {
    type Item = (&'a u64, Light);
    fn next(&mut self) -> Option<(&'a u64, Light)> {
        let (ino, v) = self.it.next()?;
        Some((ino, self.table.unpack(*v)))
    }
}

impl<'a> IntoIterator for &'a LightTable {
    type Item = (&'a u64, Light);
    type IntoIter = LightIter<'a>;
    fn into_iter(self) -> LightIter<'a> {
        self.iter()
    }
}
