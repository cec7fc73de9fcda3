//! Transactions: the records of one change, appended to the catalog first and applied to the live
//! state only if the append succeeded (so a failed append, e.g. ENOSPC, changes nothing). Runs with
//! the state mutex held; the only I/O here is the catalog append (and the occasional compaction),
//! which must be ordered with the change it records (`docs/locking.md`).

use std::collections::BTreeMap;

use crate::fs::FsError;
use fuser::Errno;

use crate::cow::catalog::{InodeRecord, Record};

use crate::cow::catalog::CatalogState;

use super::{ALLOCATED, ROOT_INO, State, convert::io_errno, inodes::Node};

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
    pub(super) fn node(&self, ino: u64) -> Result<&Node, FsError> {
        self.live.inodes.get(&ino).ok_or(Errno::ENOENT.into())
    }

    pub(super) fn node_mut(&mut self, ino: u64) -> Result<&mut Node, FsError> {
        self.live.inodes.get_mut(&ino).ok_or(Errno::ENOENT.into())
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
            // Seeding a workspace nobody has mounted: applied now, written with the batch.
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
