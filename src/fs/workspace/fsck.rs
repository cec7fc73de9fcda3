//! The check at load after an unclean stop or a damaged catalog: data files nobody points at go to
//! quarantine, missing data files are recreated empty (noted), entries to unknown inodes are dropped,
//! and the allocation counter moves past every number in use. Runs before anything is mounted.

use crate::cow::catalog::Record;

use super::{ALLOCATED, WorkspaceFs, tx::Tx};

impl WorkspaceFs {
    /// reused: nothing refers to it any more, and the kernel has not seen it since the remount.
    pub(super) fn note_catalog_damage(
        &self,
        damage: &[crate::cow::catalog::Damage],
    ) -> std::io::Result<()> {
        let mut st = self.lock();
        let data = self.upper.data_inodes()?;
        let highest = data
            .into_iter()
            .chain(st.live.inodes.keys().copied())
            .chain(st.live.dirs.keys().copied())
            .chain(
                st.live
                    .dirs
                    .values()
                    .flat_map(|m| m.values().flatten().copied()),
            )
            .filter(|ino| ino & ALLOCATED != 0)
            .map(|ino| ino & !ALLOCATED)
            .max()
            .unwrap_or(0);
        if highest >= st.live.next_ino {
            let mut tx = Tx::default();
            tx.records.push(Record::NextIno { next: highest + 1 });
            st.commit(tx)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno.code()))?;
        }
        for d in damage {
            tracing::warn!("workspace {}: {d}", self.upper.dir().display());
            self.upper.note_damage(&d.to_string())?;
        }
        Ok(())
    }
    /// After an unclean stop: data files nobody points at go to quarantine; records whose data file
    /// is missing get an empty one (and a note in quarantine); entries naming unknown inodes go.
    pub(super) fn check_after_unclean_stop(&self) -> std::io::Result<()> {
        let mut st = self.lock();
        let mut fixed = 0;
        for ino in self.upper.data_inodes()? {
            let known = st
                .live
                .inodes
                .get(&ino)
                .is_some_and(|n| n.persisted && n.rec.upper);
            if !known {
                let dest = self.upper.orphan(
                    ino,
                    "data file without a catalog record after an unclean stop",
                )?;
                match dest {
                    Some(dest) => tracing::warn!(ino, "quarantined {}", dest.display()),
                    None => tracing::info!(ino, "removed a data file nothing acknowledged"),
                }
                fixed += 1;
            }
        }
        let missing: Vec<u64> = st
            .live
            .inodes
            .values()
            .filter(|n| n.persisted && n.rec.upper && !self.upper.data_path(n.rec.ino).exists())
            .map(|n| n.rec.ino)
            .collect();
        for ino in missing {
            let t = st.live.inodes[&ino].rec.mtime;
            self.upper.create(ino, None, t, t)?;
            let q = self.upper.dir().join("quarantine");
            std::fs::create_dir_all(&q)?;
            use std::io::Write;
            let mut notes = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(q.join("README"))?;
            writeln!(
                notes,
                "{ino:016x}: data file missing after an unclean stop; presented empty"
            )?;
            fixed += 1;
        }
        let dangling: Vec<(u64, Vec<u8>)> = st
            .live
            .dirs
            .iter()
            .flat_map(|(d, m)| {
                m.iter()
                    .filter(|(_, i)| {
                        i.is_some_and(|i| !st.live.inodes.get(&i).is_some_and(|n| n.persisted))
                    })
                    .map(move |(n, _)| (*d, n.clone()))
            })
            .collect();
        if !dangling.is_empty() {
            let mut tx = Tx::default();
            for (dir, name) in dangling {
                tracing::warn!(dir, name = %String::from_utf8_lossy(&name), "dropping an entry to an unknown inode");
                tx.records.push(Record::Unentry { dir, name });
                fixed += 1;
            }
            st.commit(tx)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno.code()))?;
        }
        if fixed > 0 {
            tracing::warn!(fixed, "workspace checked after an unclean stop");
        }
        Ok(())
    }
}
