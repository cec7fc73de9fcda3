//! The live inode table: a [`Node`] per inode the kernel or an open file refers to (or that has a
//! catalog record), derived inode numbering by path hash (`docs/inodes.md`), resolving a name in a
//! directory (overlay first, then base tree), a node's path, and reaping nodes nobody refers to.
//!
//! A base file or symlink that only the kernel refers to (what a `git status` leaves behind, one
//! per file) is a [`Light`] node: its parent and its index in the parent's base tree, 16 bytes; its
//! record is derived again when a request reads it, and it becomes a full node when a request may
//! change or open it ([`WorkspaceFs::expand`]). Its parent directory stays (pinned) while it does.
//! A node goes when the kernel has forgotten it, nothing has it open and it has no record. Does not
//! touch the catalog or the upper layer's files (but for removing the data file of an unlinked
//! inode the last reference to which is gone).
//!
//! Memory the table frees (nodes the kernel forgot, a whole table dropped with its workspace) is
//! counted; past [`trim::THRESHOLD`] bytes a background thread, once the frees have paused and at
//! most every [`trim::MIN_INTERVAL`], asks the allocator to give its free pages back to the system
//! ([`crate::sys::malloc_trim`]): glibc would otherwise keep them in its arenas, between blocks
//! still in use, for as long as the daemon runs. Forget requests only count and, at most once a
//! burst, wake that thread.

use std::collections::HashMap;

use crate::fs::FsError;
use fuser::Errno;
use gix::ObjectId;

use crate::cow::catalog::{InodeRecord, Kind};

use crate::cow::catalog::InodeTable;

use super::{ALLOCATED, ROOT_INO, State, WorkspaceFs, convert::join, tree_order::find_index};
use crate::git::objects::{EntryKind, TreeEntry};
use std::sync::{Arc, MutexGuard};

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
    fn insert(&mut self, ino: u64, l: Light) -> bool {
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
    fn remove(&mut self, ino: &u64) -> Option<Light> {
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
    fn insert_light(&mut self, ino: u64, l: Light) -> bool {
        if !self.light.insert(ino, l) {
            return false;
        }
        if let Some(p) = self.get_mut(&l.parent) {
            p.pins += 1;
        }
        true
    }

    /// Takes light node `ino` out of the table (unpinning its parent).
    fn take_light(&mut self, ino: u64) -> Option<Light> {
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

/// Giving the memory of freed nodes back to the system, off the request path: request threads
/// count what the table frees ([`freed`]); a thread of its own, woken once the count passes
/// [`THRESHOLD`], waits for the frees to pause ([`QUIET`], at most [`MAX_WAIT`]), trims the
/// allocator, and sleeps [`MIN_INTERVAL`] before it trims again.
pub(super) mod trim {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex, OnceLock};
    use std::time::{Duration, Instant};

    /// Bytes freed (estimated from the nodes) after which a trim is worth its walk of the arenas:
    /// ~2,000 directory nodes, or 60,000 light ones (one workspace's forgotten `git status` is
    /// ~4 MiB).
    pub(crate) const THRESHOLD: usize = 1 << 20;
    /// A burst of forgets is over once no node was freed for this long.
    pub(crate) const QUIET: Duration = Duration::from_millis(200);
    /// The longest a trim waits for a burst to end.
    pub(crate) const MAX_WAIT: Duration = Duration::from_secs(2);
    /// The shortest time between two trims.
    pub(crate) const MIN_INTERVAL: Duration = Duration::from_secs(2);

    /// Bytes freed since the last trim.
    static FREED: AtomicUsize = AtomicUsize::new(0);
    /// Trims done (for tests and logs).
    static TRIMS: AtomicU64 = AtomicU64::new(0);

    struct Trimmer {
        wanted: Mutex<bool>,
        wake: Condvar,
    }

    /// The trimming thread, started by the first burst (None if it could not be started: memory
    /// then stays with the allocator, as it would without it).
    static TRIMMER: OnceLock<Option<&'static Trimmer>> = OnceLock::new();

    /// `bytes` of node memory were freed: counts them, and wakes the trimmer when they pass the
    /// threshold. Cheap (an atomic add; a notify once per threshold's worth).
    pub(crate) fn freed(bytes: usize) {
        let before = FREED.fetch_add(bytes, Ordering::Relaxed);
        if before < THRESHOLD
            && before + bytes >= THRESHOLD
            && let Some(t) = TRIMMER.get_or_init(start)
        {
            let mut wanted = t.wanted.lock().unwrap_or_else(|e| e.into_inner());
            *wanted = true;
            t.wake.notify_one();
        }
    }

    /// How many times the allocator was trimmed since the daemon started.
    pub(crate) fn allocator_trims() -> u64 {
        TRIMS.load(Ordering::Relaxed)
    }

    fn start() -> Option<&'static Trimmer> {
        let t: &'static Trimmer = Box::leak(Box::new(Trimmer {
            wanted: Mutex::new(false),
            wake: Condvar::new(),
        }));
        match std::thread::Builder::new()
            .name("octofs-trim".into())
            .spawn(move || run(t))
        {
            Ok(_) => Some(t),
            Err(e) => {
                tracing::warn!("cannot start the allocator trim thread: {e}");
                None
            }
        }
    }

    fn run(t: &'static Trimmer) {
        loop {
            {
                let mut wanted = t.wanted.lock().unwrap_or_else(|e| e.into_inner());
                while !*wanted {
                    wanted = t.wake.wait(wanted).unwrap_or_else(|e| e.into_inner());
                }
                *wanted = false;
            }
            let began = Instant::now();
            loop {
                let seen = FREED.load(Ordering::Relaxed);
                std::thread::sleep(QUIET);
                if FREED.load(Ordering::Relaxed) == seen || began.elapsed() >= MAX_WAIT {
                    break;
                }
            }
            let bytes = FREED.swap(0, Ordering::Relaxed);
            let t0 = Instant::now();
            let released = crate::sys::malloc_trim();
            TRIMS.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                freed = bytes,
                released,
                ms = t0.elapsed().as_secs_f64() * 1e3,
                "allocator trimmed after the inode table freed memory"
            );
            std::thread::sleep(MIN_INTERVAL);
        }
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
