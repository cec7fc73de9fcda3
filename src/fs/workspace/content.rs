//! File content: the base blob (from the shared blob cache) or host-wide shared file of a file nobody
//! wrote, copy-up into the upper layer's data file at the first write intent (keeping the inode
//! number), opens, releases, the re-inode of a file whose base content passthrough readers hold, and
//! which content files a mount's read-ahead warms (never filling the blob cache).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use crate::fs::FsError;
use fuser::Errno;

use gix::ObjectId;

use crate::cow::blobcache::{AheadJob, AheadOwner};
use crate::cow::catalog::{InodeRecord, Kind, Record, Ts};
use crate::git::objects::TreeEntry;

use super::{
    State, WorkspaceFs, convert::eio, convert::oid, convert::shown, tx::Tx, types::Opened,
};
use crate::fs::Context;

impl WorkspaceFs {
    /// Opens of base content so far.
    pub fn base_content_opens(&self) -> u64 {
        self.base_content_opens.load(Ordering::Relaxed)
    }

    // ----- content -----

    /// The entries of base tree `id`; a missing or unreadable tree is `EIO` naming it.
    pub(super) fn tree_entries(&self, id: ObjectId) -> Result<Arc<[TreeEntry]>, FsError> {
        self.store
            .tree(id)
            .map_err(eio)
            .context(|| format!("tree {id}"))
    }

    /// The content of blob `id` (a symlink's target); a missing blob is `EIO` naming it.
    pub(super) fn blob_bytes(&self, id: ObjectId) -> Result<Vec<u8>, FsError> {
        self.store
            .blob(id)
            .map_err(eio)
            .context(|| format!("blob {id}"))
    }

    /// The read-only file holding the content of a file that is not copied up: its blob in the
    /// shared blob cache (filled on first use), or its shared host-wide file.
    pub(super) fn source_file(&self, rec: &InodeRecord) -> Result<File, FsError> {
        if let Some(shared) = &rec.shared {
            return crate::cow::blobcache::open_source(std::path::Path::new(shared))
                .map_err(eio)
                .context(|| format!("shared file {shared}"));
        }
        let base = rec
            .base
            .as_ref()
            .ok_or_else(|| eio(format!("inode {:#x} has no content source", rec.ino)))?;
        let id = oid(&base.oid)?;
        let size = self
            .store
            .blob_size(id)
            .map_err(eio)
            .context(|| format!("blob {id} of {}", shown(&base.path)))?;
        self.base_content_opens.fetch_add(1, Ordering::Relaxed);
        // Filling the cache needs disk: a full one answers ENOSPC, not EIO.
        self.blobs.open(&self.store, id, size).context(|| {
            format!(
                "filling blob {id} of {} into the blob cache",
                shown(&base.path)
            )
        })
    }

    /// Starts reading the content of `files` (`(inode, size)`) into the page cache on the daemon's
    /// read-ahead pool, for the mount `owner`; returns how many were queued. Only files not copied
    /// up are read ahead (their blob-cache file, or their shared file), and only if the blob cache
    /// holds them already: read-ahead never fills it. `drop_later`: the mount keeps its own page
    /// cache (no-open), so the daemon's copy is dropped again shortly after.
    pub fn read_ahead(
        &self,
        files: &[(u64, u64)],
        owner: &Arc<AheadOwner>,
        drop_later: bool,
    ) -> usize {
        let jobs: Vec<AheadJob> = {
            let st = self.lock();
            files
                .iter()
                .filter_map(|&(ino, size)| {
                    let rec = self.record(&st, ino).ok()?;
                    if rec.kind != Kind::File || rec.upper {
                        return None;
                    }
                    let path = match (&rec.shared, &rec.base) {
                        (Some(shared), _) => std::path::PathBuf::from(shared),
                        (None, Some(base)) => self.blobs.path(&oid(&base.oid).ok()?),
                        (None, None) => return None,
                    };
                    Some(AheadJob {
                        path,
                        size,
                        owner: owner.clone(),
                        drop_later,
                    })
                })
                .collect()
        };
        self.blobs.ahead.queue(jobs)
    }

    /// Waits (releasing the lock) until no data file of `ino` is being prepared.
    pub(super) fn wait_copied<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        ino: u64,
    ) -> MutexGuard<'a, State> {
        while st.copying.contains(&ino) {
            st = self.copied.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st
    }

    /// Creates data file `data` with the content of `rec` (none when `empty`) and `rec`'s times;
    /// returns its ctime and the file, open for reading and writing. File I/O: called without the
    /// state lock.
    fn prepare_data(
        &self,
        data: u64,
        rec: &InodeRecord,
        empty: bool,
    ) -> Result<(Ts, File), FsError> {
        let path = || self.upper.data_path(data);
        let f = if empty {
            self.upper
                .create(data, None, rec.atime, rec.mtime)
                .context(|| format!("creating data file {}", path().display()))?
        } else {
            let mut src = self.source_file(rec)?;
            self.upper
                .create(data, Some(&mut src), rec.atime, rec.mtime)
                .context(|| format!("copying up into data file {}", path().display()))?
        };
        // The ctime of the file just written, from its descriptor (no lookup of its path).
        f.metadata()
            .map(|m| (Ts(m.ctime(), m.ctime_nsec() as u32), f))
            .map_err(|e| {
                self.upper.remove(data);
                eio(e).context(format!("data file {}", path().display()))
            })
    }

    /// Copies `ino` up into its data file (empty when `empty`), keeping its number and times.
    ///
    /// The content is copied without the lock (`docs/locking.md`): `ino` is marked in
    /// [`State::copying`] meanwhile, so a concurrent copy-up, `setattr` or re-inode of the same inode
    /// waits for it, and nothing else does. Returns the lock, held again.
    pub(super) fn copy_up<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        ino: u64,
        empty: bool,
    ) -> Result<MutexGuard<'a, State>, FsError> {
        self.copy_up_file(st, ino, empty).map(|(st, _)| st)
    }

    /// [`Self::copy_up`], also returning the new data file, open for reading and writing, when
    /// this call made it (`None`: the file was copied up already, or is no regular file).
    fn copy_up_file<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        ino: u64,
        empty: bool,
    ) -> Result<(MutexGuard<'a, State>, Option<File>), FsError> {
        st = self.wait_copied(st, ino);
        let rec = st.node(ino)?.rec.clone();
        if rec.kind != Kind::File || rec.upper {
            return Ok((st, None));
        }
        st.copying.insert(ino);
        drop(st);
        let prepared = self.prepare_data(ino, &rec, empty);
        let mut st = self.lock();
        st.copying.remove(&ino);
        self.copied.notify_all();
        let (copied, file) = prepared?;
        // The record as it is now: its name, mode or owner may have changed meanwhile (not its
        // times or content: `setattr` and other copy-ups waited).
        let mut tx = Tx::default();
        let r = st.chain(&mut tx, ino).and_then(|()| {
            let r = st.rec(&mut tx, ino)?;
            r.upper = true;
            r.shared = None;
            r.copied_ctime = Some(copied);
            Ok(())
        });
        if let Err(e) = r.and_then(|()| st.commit(tx)) {
            self.upper.remove(ino);
            return Err(e);
        }
        Ok((st, Some(file)))
    }

    /// Opens `ino`. Any write intent (write access or `O_TRUNC`) copies the file up first; `O_TRUNC`
    /// copies no data. No file is opened, copied or truncated under the state lock.
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened, FsError> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let trunc = flags & libc::O_TRUNC != 0;
        let writer = write || trunc;
        let mut st = self.lock_for(ino)?;
        let n = st.node_mut(ino)?;
        match n.rec.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR.into()),
            Kind::Symlink => return Err(Errno::ELOOP.into()),
            _ => return Err(Errno::ENXIO.into()),
        }
        // Counted before the lock is dropped, so the node stays while its content is opened.
        n.opens += 1;
        if writer {
            n.writers += 1;
        }
        let rec = n.rec.clone();
        let opened = self.open_counted(st, ino, &rec, writer, trunc);
        let mut st = self.lock();
        match &opened {
            Ok(_) if writer => self.journal_ino(&mut st, ino),
            Ok(_) => {}
            Err(_) => {
                if let Some(n) = st.live.inodes.get_mut(&ino) {
                    n.opens = n.opens.saturating_sub(1);
                    if writer {
                        n.writers = n.writers.saturating_sub(1);
                    }
                }
                self.reap(&mut st, ino);
            }
        }
        opened
    }

    /// The content part of [`Self::open`], entered with the lock held and the open counted; returns
    /// with the lock released.
    fn open_counted(
        &self,
        st: MutexGuard<'_, State>,
        ino: u64,
        rec: &InodeRecord,
        writer: bool,
        trunc: bool,
    ) -> Result<Opened, FsError> {
        if rec.upper || writer {
            let (st, made) = if rec.upper {
                (st, None)
            } else {
                self.copy_up_file(st, ino, trunc)?
            };
            drop(st);
            // The data file the copy-up just made serves the handle: no second open.
            let f = match made {
                Some(f) => f,
                None => self.open_data(ino)?,
            };
            if trunc {
                f.set_len(0).context(|| {
                    format!("truncating data file {}", self.data_path(ino).display())
                })?;
                self.upper.usage().shrunk(ino, 0);
            }
            return Ok(Opened {
                file: f,
                upper: true,
                write: writer,
            });
        }
        drop(st);
        // Filling the blob cache may take a while: not under the workspace lock.
        Ok(Opened {
            file: self.source_file(rec)?,
            upper: false,
            write: false,
        })
    }

    // ----- bytes (docs/overlay.md "Quota") -----

    /// The bytes this workspace's upper layer holds (its data files, as charged).
    pub fn bytes_used(&self) -> u64 {
        self.upper.usage().used()
    }

    /// Counts this workspace's bytes against its owner's quota from now on.
    pub fn count_against(&self, user: Arc<crate::cow::quota::UserBytes>) {
        self.upper.usage().attach(user)
    }

    /// Before `ino`'s data file may extend to `end` bytes: what it grows by is charged to the
    /// owner's quota, or `EDQUOT` and the caller writes nothing.
    pub fn grow_data(&self, ino: u64, end: u64) -> Result<(), FsError> {
        self.upper.usage().grow(ino, end).map_err(FsError::from)
    }

    /// Before a `fallocate` of `mode` on `ino`'s data file `file`: charges what it may extend the
    /// file to (its end, or with `FALLOC_FL_INSERT_RANGE` the size plus `length`; a kept size is
    /// charged too: the blocks are allocated). Freeing modes (punching a hole, collapsing a range)
    /// cost nothing; what they free is given back at the next load.
    pub fn grow_for_fallocate(
        &self,
        ino: u64,
        file: &File,
        mode: i32,
        offset: u64,
        length: u64,
    ) -> Result<(), FsError> {
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_COLLAPSE_RANGE) != 0 {
            return Ok(());
        }
        let end = if mode & libc::FALLOC_FL_INSERT_RANGE != 0 {
            file.metadata()?.len().saturating_add(length)
        } else {
            offset.saturating_add(length)
        };
        self.grow_data(ino, end)
    }

    /// Before a `copy_file_range` of `len` bytes from `src` at `off_in` into `ino` at `off_out`:
    /// charges what the target may grow by (no more than the source has from `off_in`), and
    /// returns the length to copy.
    pub fn grow_for_copy(
        &self,
        ino: u64,
        src: &File,
        off_in: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64, FsError> {
        let len = len.min(src.metadata()?.len().saturating_sub(off_in));
        self.grow_data(ino, off_out.saturating_add(len))?;
        Ok(len)
    }

    /// Where `ino`'s data file is (or would be) in the upper layer, for error messages.
    pub fn data_path(&self, ino: u64) -> std::path::PathBuf {
        self.upper.data_path(ino)
    }

    /// Opens the current data file of an upper inode (for a handle opened before its copy-up).
    pub fn open_data(&self, ino: u64) -> Result<File, FsError> {
        self.upper
            .open_data(ino)
            .context(|| format!("data file {}", self.data_path(ino).display()))
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
    ///
    /// The new data file is prepared without the lock, `ino` marked as being copied meanwhile (as in
    /// [`Self::copy_up`]); the new inode's number is taken from the counter before, and the counter
    /// recorded with the batch that links it.
    pub fn reinode_for_write(&self, ino: u64) -> Result<bool, FsError> {
        let mut st = self.wait_copied(self.lock_for(ino)?, ino);
        let rec = st.node(ino)?.rec.clone();
        if rec.kind != Kind::File || rec.upper || rec.nlink != 1 {
            return Ok(false);
        }
        let new = st.alloc_number();
        st.copying.insert(ino);
        drop(st);
        let prepared = self.prepare_data(new, &rec, false);
        let mut st = self.lock();
        st.copying.remove(&ino);
        self.copied.notify_all();
        let (copied, _) = prepared?;
        let r = (|| {
            // The name may have moved or gone meanwhile: it is the current record that moves.
            let now = st.node(ino)?.rec.clone();
            if now.kind != Kind::File || now.upper || now.nlink != 1 {
                return Ok(false);
            }
            let mut tx = Tx::default();
            st.chain(&mut tx, now.parent)?;
            tx.records.push(Record::NextIno {
                next: st.live.next_ino,
            });
            tx.entry(now.parent, &now.name, Some(new));
            tx.recs.insert(
                new,
                InodeRecord {
                    ino: new,
                    upper: true,
                    shared: None,
                    copied_ctime: Some(copied),
                    ..now
                },
            );
            tx.drop_inode(ino);
            st.commit(tx)?;
            Ok(true)
        })();
        match r {
            Ok(true) => {
                self.journal_ino(&mut st, new);
                Ok(true)
            }
            other => {
                self.upper.remove(new);
                other
            }
        }
    }

    /// Makes `fsync` of a file or directory durable for the catalog too: every batch appended
    /// before this call (so every change the caller was answered about) is on disk when it returns.
    /// Not under the state lock (the catalog's [`LogSync`]): appends go on meanwhile. A new
    /// workspace's own creation is durable first ([`Self::wait_durable`]).
    ///
    /// [`LogSync`]: crate::cow::catalog::LogSync
    pub fn sync_catalog(&self) -> Result<(), FsError> {
        self.wait_durable()?;
        self.catalog_sync
            .sync()
            .context(|| format!("fsync of the catalog in {}", self.upper.dir().display()))
    }
}
