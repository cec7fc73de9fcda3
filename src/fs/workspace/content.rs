//! File content: the base blob (from the shared blob cache) or host-wide shared file of a file nobody
//! wrote, copy-up into the upper layer's data file at the first write intent (keeping the inode
//! number), opens, releases, and the re-inode of a file whose base content passthrough readers hold.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;

use fuser::Errno;

use crate::cow::catalog::{InodeRecord, Kind, Ts};

use super::{
    State, WorkspaceFs, convert::eio, convert::io_errno, convert::oid, tx::Tx, types::Opened,
};

impl WorkspaceFs {
    /// Opens of base content so far.
    pub fn base_content_opens(&self) -> u64 {
        self.base_content_opens.load(Ordering::Relaxed)
    }

    // ----- content -----

    /// The read-only file holding the content of a file that is not copied up: its blob in the
    /// shared blob cache (filled on first use), or its shared host-wide file.
    pub(super) fn source_file(&self, rec: &InodeRecord) -> Result<File, Errno> {
        if let Some(shared) = &rec.shared {
            return File::open(shared).map_err(eio);
        }
        let base = rec
            .base
            .as_ref()
            .ok_or_else(|| eio("a file with no content source"))?;
        let id = oid(&base.oid)?;
        let size = self.store.blob_size(id).map_err(eio)?;
        self.base_content_opens.fetch_add(1, Ordering::Relaxed);
        // Filling the cache needs disk: a full one answers ENOSPC, not EIO.
        self.blobs.open(&self.store, id, size).map_err(io_errno)
    }

    /// Copies `ino` up into its data file (empty when `empty`), keeping its number and times.
    pub(super) fn copy_up(&self, st: &mut State, ino: u64, empty: bool) -> Result<(), Errno> {
        let rec = st.node(ino)?.rec.clone();
        if rec.kind != Kind::File || rec.upper {
            return Ok(());
        }
        if empty {
            self.upper
                .create(ino, None, rec.atime, rec.mtime)
                .map_err(io_errno)?;
        } else {
            let mut src = self.source_file(&rec)?;
            self.upper
                .create(ino, Some(&mut src), rec.atime, rec.mtime)
                .map_err(io_errno)?;
        }
        let copied = std::fs::metadata(self.upper.data_path(ino))
            .map(|m| Ts(m.ctime(), m.ctime_nsec() as u32))
            .map_err(eio)?;
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.upper = true;
        r.shared = None;
        r.copied_ctime = Some(copied);
        if let Err(e) = st.commit(tx) {
            self.upper.remove(ino);
            return Err(e);
        }
        Ok(())
    }

    /// Opens `ino`. Any write intent (write access or `O_TRUNC`) copies the file up first; `O_TRUNC`
    /// copies no data.
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened, Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let trunc = flags & libc::O_TRUNC != 0;
        let mut st = self.lock();
        let rec = st.node(ino)?.rec.clone();
        match rec.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            Kind::Symlink => return Err(Errno::ELOOP),
            _ => return Err(Errno::ENXIO),
        }
        let opened = if rec.upper || write || trunc {
            if !rec.upper {
                self.copy_up(&mut st, ino, trunc)?;
            }
            let f = self.upper.open_data(ino).map_err(io_errno)?;
            if trunc {
                f.set_len(0).map_err(io_errno)?;
            }
            Opened {
                file: f,
                upper: true,
                write: write || trunc,
            }
        } else {
            drop(st);
            // Filling the blob cache may take a while: not under the workspace lock.
            let file = self.source_file(&rec)?;
            st = self.lock();
            Opened {
                file,
                upper: false,
                write: false,
            }
        };
        let n = st.node_mut(ino)?;
        n.opens += 1;
        if write || trunc {
            n.writers += 1;
            self.journal_ino(&mut st, ino);
        }
        Ok(opened)
    }

    /// Opens the current data file of an upper inode (for a handle opened before its copy-up).
    pub fn open_data(&self, ino: u64) -> Result<File, Errno> {
        self.upper.open_data(ino).map_err(io_errno)
    }

    /// An open handle of `ino` was closed (`wrote`: it was opened for writing).
    pub fn release(&self, ino: u64, wrote: bool) {
        let mut st = self.lock();
        if let Some(n) = st.live.inodes.get_mut(&ino) {
            n.opens = n.opens.saturating_sub(1);
            if wrote {
                n.writers = n.writers.saturating_sub(1);
            }
        }
        if wrote {
            self.journal_ino(&mut st, ino);
        }
        self.reap(&mut st, ino);
    }

    /// For a write to a file whose base content readers hold open through passthrough: moves the
    /// name to a new, copied-up inode and leaves the old inode (unlinked) to those readers. Returns
    /// false when that is not possible (a hardlinked or already-copied file).
    pub fn reinode_for_write(&self, ino: u64) -> Result<bool, Errno> {
        let mut st = self.lock();
        let rec = st.node(ino)?.rec.clone();
        if rec.kind != Kind::File || rec.upper || rec.nlink != 1 {
            return Ok(false);
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, rec.parent)?;
        let new = st.alloc(&mut tx);
        let mut src = self.source_file(&rec)?;
        self.upper
            .create(new, Some(&mut src), rec.atime, rec.mtime)
            .map_err(io_errno)?;
        let copied = std::fs::metadata(self.upper.data_path(new))
            .map(|m| Ts(m.ctime(), m.ctime_nsec() as u32))
            .map_err(eio)?;
        tx.entry(rec.parent, &rec.name, Some(new));
        tx.recs.insert(
            new,
            InodeRecord {
                ino: new,
                upper: true,
                shared: None,
                copied_ctime: Some(copied),
                ..rec.clone()
            },
        );
        tx.drop_inode(ino);
        if let Err(e) = st.commit(tx) {
            self.upper.remove(new);
            return Err(e);
        }
        self.journal_ino(&mut st, new);
        Ok(true)
    }

    /// Makes `fsync` of a file or directory durable for the catalog too.
    pub fn sync_catalog(&self) -> Result<(), Errno> {
        self.lock().catalog.sync().map_err(io_errno)
    }
}
