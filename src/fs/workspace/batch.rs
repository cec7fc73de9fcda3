//! The seeding batch: before a workspace is mounted, every catalog transaction of its seeding
//! ([`WorkspaceFs::seeding`]) or of a change set ([`WorkspaceFs::apply_all`]) is applied in
//! memory and gathered into one batch, written as one append (and one sync when asked) with every
//! record a later one overwrites left out ([`coalesce`]). Owns the batch's end only; what goes
//! into it is the transactions' ([`super::tx`]).

use crate::fs::FsError;

use crate::cow::catalog::Record;

use super::{WorkspaceFs, convert::io_errno, tx::Batch};

impl WorkspaceFs {
    /// Runs `f` (which seeds this workspace, before it is mounted, through this API) with every
    /// catalog transaction gathered into one batch, written (one append: in the kernel, it
    /// survives SIGKILL of the daemon) when `f` returns, also after a failure; a failed write is
    /// `f`'s error type through `on_catalog`. Not synced: the caller makes it durable with
    /// [`Self::sync_catalog`] before it answers, issued together with its other durable writes.
    /// Once mounted, or inside another batch, `f` just runs. As with [`Self::apply_all`], a
    /// failure means the workspace is discarded.
    pub fn seeding<T, E>(
        &self,
        f: impl FnOnce() -> Result<T, E>,
        on_catalog: impl FnOnce(FsError) -> E,
    ) -> Result<T, E> {
        let mounted = self
            .behind
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        {
            let mut st = self.lock();
            if mounted || st.batch.is_some() {
                drop(st);
                return f();
            }
            st.batch = Some(Batch::default());
        }
        let out = f();
        let written = self.end_batch(false);
        let v = out?;
        written.map_err(on_catalog)?;
        Ok(v)
    }

    /// Writes the batch [`Self::apply_all`] gathered (one append, and one sync when `sync`), then
    /// lets go of the data its transactions left unreferenced.
    pub(super) fn end_batch(&self, sync: bool) -> Result<(), FsError> {
        let mut st = self.lock();
        let Some(batch) = st.batch.take() else {
            return Ok(());
        };
        let records = coalesce(batch.records);
        let n = records.len();
        st.catalog
            .append(&records)
            .and_then(|()| if sync { st.catalog.sync() } else { Ok(()) })
            .map_err(|e| io_errno(e).context(format!("catalog append of {n} records")))?;
        for ino in batch.reaps {
            self.reap(&mut st, ino);
        }
        Ok(())
    }
}

/// The records of a sequence of transactions with every record that a later one overwrites left
/// out, the rest in order. Each record sets one slot absolutely: an inode's record (set or
/// dropped), one name of a directory (an entry, a whiteout or none), the allocation counter, the
/// generation (both only grow). Dropping a directory also empties its names, which only the names'
/// own later records set again, so replaying the result gives the same state as replaying them all
/// (an emptied directory may be left without an empty name map, which reads the same).
fn coalesce(records: Vec<Record>) -> Vec<Record> {
    #[derive(PartialEq, Eq, Hash)]
    enum Slot {
        Inode(u64),
        Name(u64, Vec<u8>),
        NextIno,
        Generation,
    }
    let slot = |r: &Record| match r {
        Record::Inode(rec) => Slot::Inode(rec.ino),
        Record::Drop { ino } => Slot::Inode(*ino),
        Record::Entry { dir, name, .. } | Record::Unentry { dir, name } => {
            Slot::Name(*dir, name.clone())
        }
        Record::NextIno { .. } => Slot::NextIno,
        Record::Generation { .. } => Slot::Generation,
    };
    let mut last = std::collections::HashMap::with_capacity(records.len());
    for (i, r) in records.iter().enumerate() {
        last.insert(slot(r), i);
    }
    records
        .into_iter()
        .enumerate()
        .filter(|(i, r)| last.get(&slot(r)) == Some(i))
        .map(|(_, r)| r)
        .collect()
}
