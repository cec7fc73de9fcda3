//! Transactions: the records of one change, appended to the catalog first and applied to the live
//! state only if the append succeeded (so a failed append, e.g. ENOSPC, changes nothing). Runs with
//! the state mutex held; the only I/O here is the catalog append (and the occasional compaction),
//! which must be ordered with the change it records (`docs/locking.md`). Every committed change is
//! also noted, by directory entry and inode, in the [`SnapTrack`] that lets a snapshot rebuild only
//! what changed since the last one.

use std::collections::{BTreeMap, HashSet};

use gix::ObjectId;

use crate::fs::FsError;
use fuser::Errno;

use crate::cow::catalog::{InodeRecord, Kind, Record};

use crate::cow::catalog::CatalogState;

use super::{
    ALLOCATED, ROOT_INO, State,
    convert::io_errno,
    inodes::{Node, Nodes},
    posix::MetaSet,
};

#[derive(Default)]
pub(super) struct Tx {
    /// Bookkeeping only: does not count as a change of the workspace's state.
    pub(super) quiet: bool,
    pub(super) records: Vec<Record>,
    /// Working copies of the inode records this change modifies, written after `records`.
    pub(super) recs: BTreeMap<u64, InodeRecord>,
    pub(super) drops: Vec<u64>,
}

/// Transactions gathered for one catalog append (see [`WorkspaceFs::apply_all`]): their records in
/// order, and the inodes whose unreferenced data may go only once those records are written.
///
/// [`WorkspaceFs::apply_all`]: super::WorkspaceFs::apply_all
#[derive(Default)]
pub(super) struct Batch {
    pub(super) records: Vec<Record>,
    pub(super) reaps: Vec<u64>,
}

impl Tx {
    pub(super) fn entry(&mut self, dir: u64, name: &[u8], ino: Option<u64>) {
        self.records.push(Record::Entry {
            dir,
            name: name.to_vec(),
            ino,
        });
    }

    pub(super) fn drop_inode(&mut self, ino: u64) {
        self.recs.remove(&ino);
        self.drops.push(ino);
    }

    pub(super) fn into_records(self) -> Vec<Record> {
        let mut out = self.records;
        out.extend(self.recs.into_values().map(Record::Inode));
        out.extend(self.drops.into_iter().map(|ino| Record::Drop { ino }));
        out
    }
}
impl State {
    /// Full node `ino`. A light one (a base file: requests that read or change a file make it full
    /// first) is asked for only as a directory: `ENOTDIR`.
    pub(super) fn node(&self, ino: u64) -> Result<&Node, FsError> {
        self.live.inodes.get(&ino).ok_or_else(|| self.missing(ino))
    }

    pub(super) fn node_mut(&mut self, ino: u64) -> Result<&mut Node, FsError> {
        if !self.live.inodes.contains_key(&ino) {
            return Err(self.missing(ino));
        }
        self.live.inodes.get_mut(&ino).ok_or(Errno::ENOENT.into())
    }

    fn missing(&self, ino: u64) -> FsError {
        if self.live.inodes.light.contains_key(&ino) {
            Errno::ENOTDIR.into()
        } else {
            Errno::ENOENT.into()
        }
    }

    /// The working copy of `ino`'s record in `tx`.
    pub(super) fn rec<'t>(&self, tx: &'t mut Tx, ino: u64) -> Result<&'t mut InodeRecord, FsError> {
        match tx.recs.entry(ino) {
            std::collections::btree_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::btree_map::Entry::Vacant(e) => {
                Ok(e.insert(self.node(ino)?.rec.clone()))
            }
        }
    }

    /// Makes sure `ino` and its ancestors are persisted and linked in their parents' overlays.
    pub(super) fn chain(&self, tx: &mut Tx, ino: u64) -> Result<(), FsError> {
        let mut cur = ino;
        loop {
            let n = self.node(cur)?;
            // An unlinked inode (still open) has no name to be linked under.
            if n.persisted || tx.recs.contains_key(&cur) || n.rec.nlink == 0 {
                return Ok(());
            }
            tx.recs.insert(cur, n.rec.clone());
            if cur == ROOT_INO {
                return Ok(());
            }
            let (parent, name) = (n.rec.parent, n.rec.name.clone());
            tx.entry(parent, &name, Some(cur));
            cur = parent;
        }
    }

    /// Takes the next allocated inode number without recording it: the batch that first uses it
    /// must record the counter (`Record::NextIno` with the counter as it is then).
    pub(super) fn alloc_number(&mut self) -> u64 {
        let ino = ALLOCATED | self.live.next_ino;
        self.live.next_ino += 1;
        ino
    }

    pub(super) fn alloc(&mut self, tx: &mut Tx) -> u64 {
        let ino = ALLOCATED | self.live.next_ino;
        self.live.next_ino += 1;
        tx.records.push(Record::NextIno {
            next: self.live.next_ino,
        });
        ino
    }

    /// Appends `tx` to the catalog and applies it. Nothing changes if the append fails.
    pub(super) fn commit(&mut self, tx: Tx) -> Result<(), FsError> {
        let quiet = tx.quiet;
        // Counted first: even a failed append may have changed an unlinked inode in memory.
        self.commits = self.commits.wrapping_add(1);
        // An unlinked inode that is still open changes in memory only: it has no place in the
        // catalog (after a restart it is gone, as on any file system).
        let (volatile, mut records): (Vec<Record>, Vec<Record>) = tx
            .into_records()
            .into_iter()
            .partition(|r| matches!(r, Record::Inode(rec) if rec.nlink == 0));
        for r in volatile {
            if let Record::Inode(rec) = r
                && let Some(n) = self.live.inodes.get_mut(&rec.ino)
                && !n.persisted
            {
                n.rec = rec;
            }
        }
        if !quiet {
            records.push(Record::Generation {
                n: self.live.generation + 1,
            });
        }
        if let Some(batch) = self.batch.as_mut() {
            // Seeding a workspace nobody has mounted: applied now, written with the batch (and
            // noted like any change: a snapshot view may have been taken before).
            self.track.note(&self.live, &records);
            for r in &records {
                self.live.apply(r);
            }
            batch.records.extend(records);
            return Ok(());
        }
        if let Err(e) = self.catalog.append(&records) {
            // The allocation counter may have moved: harmless, numbers are never reused.
            return Err(io_errno(e).context(append_what(&records)));
        }
        self.track.note(&self.live, &records);
        for r in &records {
            self.live.apply(r);
        }
        let nodes = &self.live.inodes;
        if self
            .catalog
            .wants_compaction(|| nodes.values().filter(|n| n.persisted).count())
        {
            let snapshot = self.snapshot();
            if let Err(e) = self.catalog.compact(&snapshot) {
                tracing::warn!("catalog compaction failed (the log keeps growing): {e}");
            }
        }
        Ok(())
    }

    pub(super) fn snapshot(&self) -> CatalogState {
        CatalogState {
            inodes: self
                .live
                .inodes
                .iter()
                .filter(|(_, n)| n.persisted)
                .map(|(i, n)| (*i, n.rec.clone()))
                .collect(),
            dirs: self.live.dirs.clone(),
            next_ino: self.live.next_ino,
            generation: self.live.generation,
        }
    }
}

/// Which catalog append failed, for its error's context: "catalog append of 4 records (inodes 0x1,
/// 0x8000000000000005)".
fn append_what(records: &[Record]) -> String {
    let mut inos: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Inode(rec) => Some(rec.ino),
            Record::Drop { ino } => Some(*ino),
            Record::Entry { dir, .. } | Record::Unentry { dir, .. } => Some(*dir),
            Record::NextIno { .. } | Record::Generation { .. } => None,
        })
        .collect();
    inos.sort_unstable();
    inos.dedup();
    let shown: Vec<String> = inos.iter().map(|i| format!("{i:#x}")).collect();
    format!(
        "catalog append of {} records (inodes {})",
        records.len(),
        shown.join(", ")
    )
}

/// What may differ, since some point, in the working state a snapshot records: directory entries
/// (a name created, removed, replaced or moved), inodes (content, mode, owner, extended
/// attributes, symlink target, a directory's base tree) and directories whose own metadata changed
/// (mode, owner, extended attributes, link count: the POSIX record's, not the tree's).
/// Over-approximated, never under: a name noted that did not change only costs its rebuild.
#[derive(Default, Debug)]
pub(super) struct Dirty {
    pub(super) names: HashSet<(u64, Vec<u8>)>,
    pub(super) inos: HashSet<u64>,
    /// Directories whose own metadata changed (not their entries nor their base tree): the
    /// snapshot's tree does not change for them, its POSIX record may.
    pub(super) meta: HashSet<u64>,
    /// Too much changed to remember: the next snapshot walks everything.
    pub(super) overflow: bool,
}

/// Entries one [`Dirty`] remembers at most; past it the set says "everything" (a snapshot after
/// that many changes walks the whole change set anyway).
const DIRTY_MAX: usize = 1 << 16;

impl Dirty {
    fn len(&self) -> usize {
        self.names.len() + self.inos.len() + self.meta.len()
    }

    fn cap(&mut self) {
        if self.len() > DIRTY_MAX {
            self.names = HashSet::new();
            self.inos = HashSet::new();
            self.meta = HashSet::new();
            self.overflow = true;
        }
    }

    pub(super) fn name(&mut self, dir: u64, name: &[u8]) {
        if !self.overflow {
            self.names.insert((dir, name.to_vec()));
            self.cap();
        }
    }

    pub(super) fn ino(&mut self, ino: u64) {
        if !self.overflow {
            self.inos.insert(ino);
            self.cap();
        }
    }

    pub(super) fn meta(&mut self, ino: u64) {
        if !self.overflow {
            self.meta.insert(ino);
            self.cap();
        }
    }

    fn merge(&mut self, other: &Dirty) {
        if self.overflow {
            return;
        }
        if other.overflow {
            self.overflow = true;
        } else {
            self.names.extend(other.names.iter().cloned());
            self.inos.extend(other.inos.iter().copied());
            self.meta.extend(other.meta.iter().copied());
        }
        self.cap();
    }
}

/// The last snapshot a workspace's core knows it was saved as: the view it was built from (by
/// epoch), its tree, and the base tree of the root then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Baseline {
    pub(super) epoch: u64,
    pub(super) tree: ObjectId,
    pub(super) base: ObjectId,
}

/// What changed since each snapshot view, so that the next snapshot is built from the previous
/// snapshot's tree with only those paths rebuilt. In memory only: after a restart (or an overflow)
/// there is no baseline and the next snapshot walks every change from the base.
///
/// Every snapshot view closes an epoch: the changes noted since go into `closed` under its number.
/// A snapshot that is saved makes its view's epoch the baseline; the changes since the baseline
/// are the union of the epochs closed after it plus the open one (a failed snapshot moves
/// nothing, so its changes stay counted).
#[derive(Default, Debug)]
pub(super) struct SnapTrack {
    /// The last epoch closed (0: none yet; the open one is the next).
    pub(super) epoch: u64,
    pub(super) open: Dirty,
    pub(super) closed: Vec<(u64, Dirty)>,
    pub(super) baseline: Option<Baseline>,
    /// Epochs up to this one were forgotten (too many changes): none of them may become a
    /// baseline.
    pub(super) floor: u64,
    /// Inodes that were open for writing when last seen (content may change without a request).
    pub(super) writing: HashSet<u64>,
    /// The metadata a POSIX record is made from, as of the snapshot view that closed the epoch
    /// it is kept with (see `WorkspaceFs::snapshot_meta`): the next snapshot view updates it with
    /// only what was noted since, when that view closes the next epoch. `None` (a core just
    /// loaded, a view that failed, too many changes): the next one walks every node.
    pub(super) meta: Option<(u64, MetaSet)>,
}

impl SnapTrack {
    /// Notes what `records` change in `live` (called before they are applied).
    pub(super) fn note(&mut self, live: &CatalogState<Nodes>, records: &[Record]) {
        for r in records {
            match r {
                Record::Entry { dir, name, ino } => {
                    let old = live.dirs.get(dir).and_then(|o| o.get(name));
                    let same = match (old, ino) {
                        (Some(old), new) => old == new,
                        // An inode derived from the base, linked where it already was (its
                        // ancestors' overlays as a change below them is persisted): no change.
                        (None, Some(i)) => live.inodes.get(i).is_some_and(|n| {
                            let rec = &n.rec;
                            !n.persisted && rec.nlink > 0 && rec.parent == *dir && rec.name == *name
                        }),
                        (None, None) => false,
                    };
                    if !same {
                        self.open.name(*dir, name);
                    }
                }
                Record::Unentry { dir, name } => {
                    if live.dirs.get(dir).is_some_and(|o| o.contains_key(name)) {
                        self.open.name(*dir, name);
                    }
                }
                Record::Inode(rec) => {
                    let old = live.inodes.get(&rec.ino).map(|n| &n.rec);
                    let same_dir = rec.kind == Kind::Dir
                        && old.is_some_and(|o| o.kind == Kind::Dir && o.base == rec.base);
                    if !same_dir {
                        self.open.ino(rec.ino);
                    } else if old.is_some_and(|o| {
                        o.mode != rec.mode
                            || o.uid != rec.uid
                            || o.gid != rec.gid
                            || o.rdev != rec.rdev
                            || o.nlink != rec.nlink
                            || o.xattrs != rec.xattrs
                    }) {
                        // The same directory with other metadata: its entries and tree are
                        // unchanged; only the POSIX record may be.
                        self.open.meta(rec.ino);
                    }
                }
                Record::Drop { .. } | Record::NextIno { .. } | Record::Generation { .. } => {}
            }
        }
    }

    /// Closes the open epoch for a snapshot view; returns its number and, when `onto` is the tree
    /// of the baseline, everything that changed since it (`None`: walk everything). `writing`:
    /// the inodes open for writing now, whose content may still change after the view (they
    /// count in the next epoch too).
    pub(super) fn close(
        &mut self,
        onto: Option<ObjectId>,
        root_base: ObjectId,
        writing: &[u64],
    ) -> (u64, Option<Dirty>) {
        self.epoch += 1;
        let epoch = self.epoch;
        let mut cur = std::mem::take(&mut self.open);
        for w in writing {
            cur.ino(*w);
            self.open.ino(*w);
        }
        self.closed.push((epoch, cur));
        let total: usize = self.closed.iter().map(|(_, d)| d.len()).sum();
        if total > DIRTY_MAX {
            // Nothing before this view can be a baseline any more.
            self.closed.clear();
            self.baseline = None;
            self.floor = epoch;
            return (epoch, None);
        }
        let Some(b) = self.baseline else {
            return (epoch, None);
        };
        if Some(b.tree) != onto || b.base != root_base {
            return (epoch, None);
        }
        let mut since = Dirty::default();
        for (e, d) in &self.closed {
            if *e > b.epoch {
                since.merge(d);
            }
        }
        (epoch, (!since.overflow).then_some(since))
    }

    /// The snapshot built from the view of `epoch` was saved with tree `tree`.
    pub(super) fn saved(&mut self, epoch: u64, tree: ObjectId, base: ObjectId) {
        if epoch == 0
            || epoch > self.epoch
            || epoch < self.floor
            || self.baseline.is_some_and(|b| b.epoch > epoch)
        {
            return;
        }
        self.baseline = Some(Baseline { epoch, tree, base });
        self.closed.retain(|(e, _)| *e > epoch);
    }
}
