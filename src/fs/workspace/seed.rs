//! The daemon's API, used without the kernel: seeding a new workspace's own files before it is
//! mounted, reading files and directories by path (never following symlinks), octofs's quiet
//! bookkeeping writes, applying a tree diff (one path, or a whole change set as one catalog batch),
//! and the list of changes made behind the kernel ([`Behind`]) for the daemon to invalidate.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::fs::{Context, FsError};
use fuser::{Errno, FileAttr, FileType};
use gix::ObjectId;

use crate::cow::catalog::{BaseRef, InodeRecord, Kind, Record, Ts};

use super::{
    ROOT_INO, State, WorkspaceFs, convert::check_name, convert::io_errno, namespace::Content,
    namespace::New, tx::Batch, tx::Tx, types::Behind, types::Caller, types::Listing,
    types::TreeChange,
};

impl WorkspaceFs {
    /// From now on the kernel may cache this workspace (it is being mounted): what the daemon
    /// changes other than through a FUSE request is recorded for [`Self::take_behind`].
    pub fn watch_kernel(&self) {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        b.get_or_insert_with(Vec::new);
    }

    /// What the daemon changed behind the kernel since the last call, for the kernel to forget.
    pub fn take_behind(&self) -> Vec<Behind> {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        b.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub(super) fn note_behind(&self, what: Behind) {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = b.as_mut() {
            v.push(what);
        }
    }

    /// [`Self::note_behind`] of a name.
    pub(super) fn entry_behind(&self, parent: u64, name: &[u8]) {
        self.note_behind(Behind::Entry {
            parent,
            name: name.to_vec(),
        });
    }
    // ----- seeding (the daemon writes a new workspace's own files before mounting it) -----

    pub(super) fn seeded(&self, r: Result<FileAttr, FsError>) -> Result<u64, FsError> {
        let ino = r?.ino.0;
        self.forget(ino, 1);
        Ok(ino)
    }

    /// Creates directory `name` in `parent`, owned by the presented owner.
    pub fn seed_dir(&self, parent: u64, name: &str, mode: u32) -> Result<u64, FsError> {
        let owner = self.owner();
        self.seeded(self.make(
            parent,
            OsStr::new(name),
            New::plain(Kind::Dir, mode, 0),
            owner,
        ))
    }

    /// Creates file `name` in `parent` holding `bytes`.
    pub fn seed_file(
        &self,
        parent: u64,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> Result<u64, FsError> {
        let new = New {
            content: Content::Bytes(bytes),
            ..New::plain(Kind::File, mode, 0)
        };
        let owner = self.owner();
        self.seeded(self.make(parent, OsStr::new(name), new, owner))
    }

    /// Creates file `name` in `parent` whose content is the immutable host-wide file `shared` until
    /// the first write (O(1): nothing is copied).
    pub fn seed_shared(
        &self,
        parent: u64,
        name: &str,
        shared: &std::path::Path,
        mode: u32,
    ) -> Result<u64, FsError> {
        let new = New {
            content: Content::Shared(shared.to_string_lossy().into_owned()),
            ..New::plain(Kind::File, mode, 0)
        };
        let owner = self.owner();
        self.seeded(self.make(parent, OsStr::new(name), new, owner))
    }

    /// "Now" on the upper layer's clock without waiting for its next tick ([`Upper::tick`]): the
    /// mark of a new workspace whose upper layer holds nothing outside `.git` (nothing written
    /// before it can be mistaken for a later change; no later write looks older).
    ///
    /// [`Upper::tick`]: crate::cow::upper::Upper::tick
    pub fn clock_now(&self) -> Result<Ts, FsError> {
        self.upper.tick().context(|| {
            format!(
                "the clock of the upper layer {}",
                self.upper.dir().display()
            )
        })
    }

    /// Whether `name` exists in directory `parent`.
    pub fn exists(&self, parent: u64, name: &str) -> Result<bool, FsError> {
        let mut st = self.lock();
        Ok(self.resolve(&mut st, parent, name.as_bytes())?.is_some())
    }

    /// The inode at `path` (components from the root), if any.
    pub(super) fn walk(&self, st: &mut State, path: &[&[u8]]) -> Result<Option<u64>, FsError> {
        let mut cur = ROOT_INO;
        for c in path {
            match self.resolve(st, cur, c)? {
                Some(i) => cur = i,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The content of the regular file at `path` (components from the root), without the kernel.
    pub fn read_file(&self, path: &[&[u8]]) -> Result<Option<Vec<u8>>, FsError> {
        let Some(mut f) = self.open_file(path)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut out).map_err(io_errno)?;
        Ok(Some(out))
    }

    /// The regular file at `path` (components from the root) opened for reading, without the
    /// kernel. `None` when nothing is there, or something other than a regular file: a symlink on
    /// the way or at the end is never followed (the daemon must not reach outside the workspace).
    pub fn open_file(&self, path: &[&[u8]]) -> Result<Option<File>, FsError> {
        let rec = {
            let mut st = self.lock();
            let ino = match self.walk(&mut st, path) {
                Ok(Some(ino)) => ino,
                Ok(None) => return Ok(None),
                Err(e) if e == Errno::ENOTDIR => return Ok(None),
                Err(e) => return Err(e),
            };
            st.node(ino)?.rec.clone()
        };
        if rec.kind != Kind::File {
            return Ok(None);
        }
        Ok(Some(if rec.upper {
            self.open_data(rec.ino)?
        } else {
            self.source_file(&rec)?
        }))
    }

    /// What is at `path` (components from the root), without following symlinks.
    pub fn kind_at(&self, path: &[&[u8]]) -> Result<Option<FileType>, FsError> {
        Ok(self.attr_at(path)?.map(|a| a.kind))
    }

    /// The attributes presented for `path` (components from the root; symlinks are not
    /// followed), or `None` when nothing is there. Takes no lookup the kernel would have to forget.
    pub fn attr_at(&self, path: &[&[u8]]) -> Result<Option<FileAttr>, FsError> {
        let mut st = self.lock();
        let ino = match self.walk(&mut st, path) {
            Ok(Some(ino)) => ino,
            Ok(None) => return Ok(None),
            Err(e) if e == Errno::ENOTDIR => return Ok(None),
            Err(e) => return Err(e),
        };
        let rec = st.node(ino)?.rec.clone();
        drop(st);
        Ok(Some(self.attr(&rec)?))
    }

    /// The target of the symlink at `path` (components from the root; symlinks on the way are not
    /// followed), or `None` when nothing or something else is there.
    pub fn link_at(&self, path: &[&[u8]]) -> Result<Option<Vec<u8>>, FsError> {
        let rec = {
            let mut st = self.lock();
            let ino = match self.walk(&mut st, path) {
                Ok(Some(ino)) => ino,
                Ok(None) => return Ok(None),
                Err(e) if e == Errno::ENOTDIR => return Ok(None),
                Err(e) => return Err(e),
            };
            st.node(ino)?.rec.clone()
        };
        if rec.kind != Kind::Symlink {
            return Ok(None);
        }
        match (rec.target, rec.base) {
            (Some(t), _) => Ok(Some(t)),
            (None, Some(b)) => {
                let id = ObjectId::from_hex(b.oid.as_bytes()).map_err(|_| Errno::EIO)?;
                Ok(Some(self.blob_bytes(id)?))
            }
            (None, None) => Ok(Some(Vec::new())),
        }
    }

    /// The names in the directory at `path` (components from the root) with their kinds, without
    /// `.` and `..`; `None` when it is not a directory (symlinks are not followed).
    pub fn list_dir(&self, path: &[&[u8]]) -> Result<Option<Listing>, FsError> {
        let ino = {
            let mut st = self.lock();
            match self.walk(&mut st, path) {
                Ok(Some(ino)) if st.node(ino)?.rec.kind == Kind::Dir => ino,
                Ok(_) => return Ok(None),
                Err(e) if e == Errno::ENOTDIR => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        Ok(Some(
            self.readdir(ino)?
                .into_iter()
                .filter(|e| e.name != "." && e.name != "..")
                .map(|e| (e.name.into_vec(), e.attr.kind))
                .collect(),
        ))
    }

    /// Writes octofs's own bookkeeping file `dirs/name` (e.g. `.git/refs/octomate/saved`), creating
    /// the directories, without counting as a change of the workspace's state. Returns the file's
    /// inode. An existing file is replaced the way git replaces a ref, never truncated: the new
    /// content goes to a new inode's data file, complete before one catalog batch points the name at
    /// it, so a reader sees the old content or the new, never a partial one; a reader holding the old
    /// file open keeps it. The changed names are noted for the kernel ([`Behind`]).
    pub fn put_file_quietly(
        &self,
        dirs: &[&str],
        name: &str,
        bytes: &[u8],
    ) -> Result<u64, FsError> {
        let dirs: Vec<&[u8]> = dirs.iter().map(|d| d.as_bytes()).collect();
        self.put_bytes_quietly(&dirs, name.as_bytes(), bytes)
    }

    /// [`Self::put_file_quietly`] for names that are bytes (any name a file can have, UTF-8 or
    /// not).
    pub fn put_bytes_quietly(
        &self,
        dirs: &[&[u8]],
        name: &[u8],
        bytes: &[u8],
    ) -> Result<u64, FsError> {
        let owner = self.owner();
        let mut cur = ROOT_INO;
        for d in dirs {
            let d: &[u8] = d;
            let next = {
                let mut st = self.lock();
                self.resolve(&mut st, cur, d)?
            };
            cur = match next {
                Some(i) => i,
                None => {
                    let new = New {
                        quiet: true,
                        ..New::plain(Kind::Dir, 0o755, 0)
                    };
                    let made = self.seeded(self.make(cur, OsStr::from_bytes(d), new, owner))?;
                    self.entry_behind(cur, d);
                    made
                }
            };
        }
        let existing = {
            let mut st = self.lock();
            self.resolve(&mut st, cur, name)?
        };
        let ino = match existing {
            Some(old) => self.replace_quietly(cur, name, old, bytes)?,
            None => {
                let new = New {
                    quiet: true,
                    content: Content::Bytes(bytes),
                    ..New::plain(Kind::File, 0o644, 0)
                };
                self.seeded(self.make(cur, OsStr::from_bytes(name), new, owner))?
            }
        };
        self.entry_behind(cur, name);
        Ok(ino)
    }

    /// Renames `from` over `to` in the directory at `dirs` (as `rename(2)` would), for the daemon,
    /// and notes both names for the kernel ([`Behind`]), which did not see the rename.
    pub fn rename_quietly(&self, dirs: &[&[u8]], from: &str, to: &str) -> Result<(), FsError> {
        let dir = {
            let mut st = self.lock();
            self.walk(&mut st, dirs)?.ok_or(Errno::ENOENT)?
        };
        self.rename(dir, OsStr::new(from), dir, OsStr::new(to), 0)?;
        self.entry_behind(dir, from.as_bytes());
        self.entry_behind(dir, to.as_bytes());
        Ok(())
    }

    /// Points `name` in `dir` (now inode `old`, a file of the workspace's own) at a new inode
    /// holding `bytes`, with `old`'s other attributes; `old` stays for whoever holds it.
    pub(super) fn replace_quietly(
        &self,
        dir: u64,
        name: &[u8],
        old: u64,
        bytes: &[u8],
    ) -> Result<u64, FsError> {
        let mut st = self.lock();
        let rec = st.node(old)?.rec.clone();
        if rec.kind != Kind::File || !rec.upper || rec.nlink != 1 {
            return Err(Errno::EEXIST.into());
        }
        let mut tx = Tx {
            quiet: true,
            ..Tx::default()
        };
        st.chain(&mut tx, dir)?;
        let new = st.alloc(&mut tx);
        let now = Ts::now();
        // Data before records (docs/crash-safety.md): a crash before the batch leaves an
        // unreferenced data file, quarantined at the next load; the name still has the old one.
        let data_file = || format!("data file {}", self.upper.data_path(new).display());
        self.upper
            .create(new, None, now, now)
            .context(|| format!("creating {}", data_file()))?;
        let written = self.upper.open_data(new).and_then(|mut f| {
            use std::io::Write;
            f.write_all(bytes)
        });
        if let Err(e) = written {
            self.upper.remove(new);
            return Err(io_errno(e).context(format!("writing {}", data_file())));
        }
        tx.entry(dir, name, Some(new));
        tx.recs.insert(
            new,
            InodeRecord {
                ino: new,
                atime: now,
                mtime: now,
                ctime: now,
                copied_ctime: None,
                ..rec
            },
        );
        tx.drop_inode(old);
        if let Err(e) = st.commit(tx) {
            self.upper.remove(new);
            return Err(e);
        }
        // Nobody may hold the old inode (then its data file goes now), or the kernel or an open
        // file does (then it goes with their last reference).
        self.reap(&mut st, old);
        drop(st);
        self.note_behind(Behind::Inode(old));
        Ok(new)
    }

    /// Applies one change of a tree diff at `path` (used to bring back a released thread: its
    /// snapshot's changes from HEAD's tree, in O(changed paths)). Removals prune directories they
    /// leave empty, as git keeps no empty directories; additions create missing directories.
    pub fn apply(&self, path: &[u8], change: &TreeChange) -> Result<(), FsError> {
        self.apply_in(path, change, &mut Dirs::default())
    }

    /// [`Self::apply`], with the directories on the way looked up in (and added to) `dirs`: a
    /// change set sorted by path resolves or creates each directory once, not once per name in
    /// it. `dirs` must only hold what this workspace has now (nothing else changes it while a
    /// change set is applied; what this change removes it forgets here).
    fn apply_in(&self, path: &[u8], change: &TreeChange, dirs: &mut Dirs) -> Result<(), FsError> {
        let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        let (name, dir_comps) = comps.split_last().ok_or(Errno::EINVAL)?;
        let owner = self.owner();
        let mut parents = vec![ROOT_INO];
        let mut end = 0usize;
        for d in dir_comps {
            let cur = *parents.last().expect("root");
            end += d.len();
            let prefix = &path[..end];
            end += 1;
            if let Some(i) = dirs.get(prefix) {
                parents.push(*i);
                continue;
            }
            let next = {
                let mut st = self.lock();
                self.resolve(&mut st, cur, d)?
            };
            let next = match next {
                Some(i) => i,
                None if *change == TreeChange::Remove => return Ok(()),
                None => {
                    let made = self.seeded_rec(self.make_rec(
                        cur,
                        OsStr::from_bytes(d),
                        New::plain(Kind::Dir, 0o755, 0),
                        owner,
                    ))?;
                    self.entry_behind(cur, d);
                    made
                }
            };
            dirs.insert(prefix.to_vec(), next);
            parents.push(next);
        }
        let dir = *parents.last().expect("root");
        let name = OsStr::from_bytes(name);
        let existing = {
            let mut st = self.lock();
            match self.resolve(&mut st, dir, name.as_bytes())? {
                Some(i) => Some(st.node(i)?.rec.kind),
                None => None,
            }
        };
        match existing {
            Some(Kind::Dir) => {
                self.rmdir(dir, name)?;
                dirs.forget(path);
            }
            Some(_) => self.unlink(dir, name)?,
            None => {}
        }
        self.entry_behind(dir, name.as_bytes());
        let object = |id: &ObjectId, gitlink: bool| BaseRef {
            oid: id.to_string(),
            path: path.to_vec(),
            gitlink,
        };
        let made = match change {
            TreeChange::Remove => {
                // Prune the directories the removal emptied (never the root).
                for (i, d) in parents.iter().enumerate().skip(1).rev() {
                    let mut st = self.lock();
                    if !self.is_empty_dir(&mut st, *d)? {
                        break;
                    }
                    drop(st);
                    self.rmdir(parents[i - 1], OsStr::from_bytes(comps[i - 1]))?;
                    self.entry_behind(parents[i - 1], comps[i - 1]);
                    let len = comps[..i].iter().map(|c| c.len() + 1).sum::<usize>() - 1;
                    dirs.forget(&path[..len]);
                }
                return Ok(());
            }
            TreeChange::File { id, exec } => New {
                content: Content::Object(object(id, false)),
                ..New::plain(Kind::File, if *exec { 0o755 } else { 0o644 }, 0)
            },
            TreeChange::Symlink { id } => New {
                target: Some(self.blob_bytes(*id)?),
                ..New::plain(Kind::Symlink, 0o777, 0)
            },
            TreeChange::Gitlink { id } => New {
                content: Content::Object(object(id, true)),
                ..New::plain(Kind::Dir, 0o755, 0)
            },
        };
        self.seeded_rec(self.make_rec(dir, name, made, owner))
            .map(|_| ())
    }

    /// [`Self::seeded`] of a record made without its attributes.
    fn seeded_rec(&self, r: Result<InodeRecord, FsError>) -> Result<u64, FsError> {
        let ino = r?.ino;
        self.forget(ino, 1);
        Ok(ino)
    }

    /// Applies a whole change set, in order, as [`Self::apply`] applies one change (used to bring
    /// back a released thread or to make a fork: its snapshot's changes from HEAD's tree). Before
    /// the workspace is mounted, every transaction is applied in memory and the catalog gets one
    /// batch, with every record that a later one overwrites left out, and one `fdatasync`: the
    /// per-path transactions wrote each directory's record again for every name changed in it.
    /// If this fails, what was applied in memory may not all be in the catalog: a workspace being
    /// seeded is then discarded (as `create` does). Inside [`Self::seeding`] the records join the
    /// seeding batch, which its caller writes and syncs. Once mounted, each change is its own
    /// transaction (a batch would hold back requests' records until its end).
    pub fn apply_all(&self, changes: &[(Vec<u8>, TreeChange)]) -> Result<(), FsError> {
        let restoring = |p: &[u8]| format!("restoring {}", String::from_utf8_lossy(p));
        let mounted = self
            .behind
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if mounted {
            for (p, c) in changes {
                self.apply(p, c).map_err(|e| e.context(restoring(p)))?;
            }
            return Ok(());
        }
        // Inside [`Self::seeding`] (a fork or a resume being made) the seeding batch gathers
        // these records too, and its owner writes and syncs it.
        let own_batch = {
            let mut st = self.lock();
            let own = st.batch.is_none();
            if own {
                st.batch = Some(Batch::default());
            }
            own
        };
        let mut dirs = Dirs::default();
        let applied = (|| {
            let mut i = 0;
            while let Some((p, c)) = changes.get(i) {
                // A run of additions goes in as one transaction; a removal, or what a put cannot
                // do, one path at a time.
                let put = if *c == TreeChange::Remove {
                    0
                } else {
                    self.put_run(&changes[i..], &mut dirs)?
                };
                if put == 0 {
                    self.apply_in(p, c, &mut dirs)
                        .map_err(|e| e.context(restoring(p)))?;
                    i += 1;
                } else {
                    i += put;
                }
            }
            Ok::<(), FsError>(())
        })();
        if !own_batch {
            return applied;
        }
        // What was applied is written even after a failure: memory and catalog agree again.
        let written = self.end_batch(true);
        applied.and(written)
    }

    /// Puts the leading additions of `changes` (files, symlinks and gitlinks, each referring to
    /// an object of the mirror) into the workspace as ONE transaction, while a change set is
    /// applied before the mount ([`Self::apply_all`]): each directory on the way is resolved
    /// once (or made, in the same transaction), an existing file or symlink at the path loses its
    /// name to the new entry, and every directory changed is recorded once, not once per name.
    /// The result is what [`Self::apply_in`] gives for each change in turn, times aside. Returns
    /// how many changes it applied: it stops before a removal, a name it already set, or a path
    /// that needs more than a put (a directory at the path, something other than a directory on
    /// the way), which the caller applies with [`Self::apply_in`]. What it did before stopping
    /// (e.g. directories made on the way to that path) is committed.
    fn put_run(
        &self,
        changes: &[(Vec<u8>, TreeChange)],
        dirs: &mut Dirs,
    ) -> Result<usize, FsError> {
        use std::collections::{HashMap, HashSet};
        let owner = self.owner();
        let now = Ts::now();
        let mut st = self.lock();
        let mut tx = Tx::default();
        // Directories this transaction makes (by path), which the live state does not know until
        // it is committed; every name it sets; what to note in the journal and reap afterwards.
        let mut made: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut fresh: HashSet<u64> = HashSet::new();
        let mut touched: HashSet<(u64, Vec<u8>)> = HashSet::new();
        let mut journal: Vec<(u64, Vec<u8>, bool)> = Vec::new();
        let mut reaps: Vec<u64> = Vec::new();
        let mut done = 0usize;
        let first_ino = st.live.next_ino;
        let mut one = |st: &mut State, path: &[u8], change: &TreeChange| -> Result<bool, FsError> {
            let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
            let (name, dir_comps) = comps.split_last().ok_or(Errno::EINVAL)?;
            let name = check_name(OsStr::from_bytes(name))?;
            let mut cur = ROOT_INO;
            let mut end = 0usize;
            for d in dir_comps {
                end += d.len();
                let prefix = &path[..end];
                end += 1;
                if let Some(i) = dirs.get(prefix).or_else(|| made.get(prefix)) {
                    cur = *i;
                    continue;
                }
                let next = if fresh.contains(&cur) {
                    None
                } else {
                    match self.resolve(st, cur, d)? {
                        Some(i) if st.node(i)?.rec.kind == Kind::Dir => Some(i),
                        Some(_) => return Ok(false),
                        None => None,
                    }
                };
                cur = match next {
                    Some(i) => {
                        dirs.insert(prefix.to_vec(), i);
                        i
                    }
                    None => {
                        let d = check_name(OsStr::from_bytes(d))?;
                        if !touched.insert((cur, d.to_vec())) {
                            return Ok(false);
                        }
                        if !fresh.contains(&cur) {
                            st.chain(&mut tx, cur)?;
                        }
                        let ino = st.alloc_number();
                        let rec = new_rec(st, &mut tx, cur, d, ino, Kind::Dir, 0o755, owner, now)?;
                        tx.entry(cur, d, Some(ino));
                        tx.recs.insert(ino, rec);
                        made.insert(prefix.to_vec(), ino);
                        fresh.insert(ino);
                        journal.push((cur, d.to_vec(), true));
                        ino
                    }
                };
            }
            let dir = cur;
            if touched.contains(&(dir, name.to_vec())) {
                return Ok(false);
            }
            let existing = if fresh.contains(&dir) {
                None
            } else {
                self.resolve(st, dir, name)?
            };
            if let Some(old) = existing
                && st.node(old)?.rec.kind == Kind::Dir
            {
                return Ok(false);
            }
            let (kind, mode, target, base) = match change {
                TreeChange::Remove => return Ok(false),
                TreeChange::File { id, exec } => (
                    Kind::File,
                    if *exec { 0o755 } else { 0o644 },
                    None,
                    Some((*id, false)),
                ),
                TreeChange::Symlink { id } => {
                    (Kind::Symlink, 0o777, Some(self.blob_bytes(*id)?), None)
                }
                TreeChange::Gitlink { id } => (Kind::Dir, 0o755, None, Some((*id, true))),
            };
            touched.insert((dir, name.to_vec()));
            if !fresh.contains(&dir) {
                st.chain(&mut tx, dir)?;
            }
            if let Some(old) = existing {
                // As `unlink` does; the entry below replaces the name.
                let r = st.rec(&mut tx, old)?;
                r.nlink = r.nlink.saturating_sub(1);
                r.ctime = now;
                if r.nlink == 0 {
                    tx.drop_inode(old);
                } else {
                    Self::repoint_primary(st, &mut tx, old, dir, name)?;
                }
                reaps.push(old);
            }
            let ino = st.alloc_number();
            let mut rec = new_rec(st, &mut tx, dir, name, ino, kind, mode, owner, now)?;
            rec.target = target;
            rec.base = base.map(|(id, gitlink)| BaseRef {
                oid: id.to_string(),
                path: path.to_vec(),
                gitlink,
            });
            tx.entry(dir, name, Some(ino));
            tx.recs.insert(ino, rec);
            journal.push((dir, name.to_vec(), kind == Kind::Dir));
            Ok(true)
        };
        let mut failed = None;
        for (path, change) in changes {
            match one(&mut st, path, change) {
                Ok(true) => done += 1,
                Ok(false) => break,
                Err(e) => {
                    failed =
                        Some(e.context(format!("restoring {}", String::from_utf8_lossy(path))));
                    break;
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if st.live.next_ino != first_ino {
            tx.records.push(Record::NextIno {
                next: st.live.next_ino,
            });
        }
        if tx.records.is_empty() && tx.recs.is_empty() {
            return Ok(done);
        }
        st.commit(tx)?;
        for (p, i) in made {
            dirs.insert(p, i);
        }
        for (d, n, is_dir) in journal {
            self.journal_name(&mut st, d, &n, is_dir);
        }
        for old in reaps {
            self.reap(&mut st, old);
        }
        Ok(done)
    }

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
    fn end_batch(&self, sync: bool) -> Result<(), FsError> {
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

    /// [`Self::apply`], then the entry it made at `path` (a file or a symlink) dated `time`
    /// (access, modification and change times): its attributes as the mount now presents them,
    /// which `.git/index` can record so that git finds the entry unchanged without reading it.
    /// `None` for a removal or a gitlink (a directory, never compared by git). The kernel is told
    /// the entry's attributes changed ([`Behind`]): a lookup between the two steps cached others.
    pub fn apply_dated(
        &self,
        path: &[u8],
        change: &TreeChange,
        time: std::time::SystemTime,
    ) -> Result<Option<FileAttr>, FsError> {
        self.apply(path, change)?;
        if matches!(change, TreeChange::Remove | TreeChange::Gitlink { .. }) {
            return Ok(None);
        }
        let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        let ino = {
            let mut st = self.lock();
            self.walk(&mut st, &comps)?.ok_or(Errno::ENOENT)?
        };
        let attr = self.setattr(
            ino,
            crate::fs::SetAttr {
                atime: Some(crate::fs::SetTime::At(time)),
                mtime: Some(crate::fs::SetTime::At(time)),
                ctime: Some(time),
                ..Default::default()
            },
        )?;
        self.note_behind(Behind::Inode(ino));
        Ok(Some(attr))
    }

    pub(super) fn owner(&self) -> Caller {
        Caller {
            uid: self.pres.uid,
            gid: self.pres.gid,
        }
    }
}

/// The record of a new inode `ino` named `name` in `dir` (changed in `tx`: one more link for a
/// directory, its times), made by `owner` as `make` makes one: the directory's group and set-group-id
/// bit when it has that bit.
#[allow(clippy::too_many_arguments)]
fn new_rec(
    st: &State,
    tx: &mut Tx,
    dir: u64,
    name: &[u8],
    ino: u64,
    kind: Kind,
    mode: u32,
    owner: Caller,
    now: Ts,
) -> Result<InodeRecord, FsError> {
    let p = st.rec(tx, dir)?;
    let setgid = p.mode & libc::S_ISGID != 0;
    let gid = if setgid { p.gid } else { owner.gid };
    let mut mode = mode & 0o7777;
    if kind == Kind::Dir {
        p.nlink = p.nlink.checked_add(1).ok_or(Errno::EMLINK)?;
        if setgid {
            mode |= libc::S_ISGID;
        }
    }
    p.mtime = now;
    p.ctime = now;
    Ok(InodeRecord {
        ino,
        kind,
        base: None,
        upper: false,
        target: None,
        mode,
        uid: owner.uid,
        gid,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        nlink: if kind == Kind::Dir { 2 } else { 1 },
        parent: dir,
        name: name.to_vec(),
        xattrs: std::collections::BTreeMap::new(),
        copied_ctime: None,
        shared: None,
    })
}

/// The directories a change set reached, by path (no trailing `/`): their inodes.
#[derive(Default)]
struct Dirs(std::collections::HashMap<Vec<u8>, u64>);

impl Dirs {
    fn get(&self, path: &[u8]) -> Option<&u64> {
        self.0.get(path)
    }

    fn insert(&mut self, path: Vec<u8>, ino: u64) {
        self.0.insert(path, ino);
    }

    /// The directory at `path` is gone: it and everything below it.
    fn forget(&mut self, path: &[u8]) {
        if self.0.remove(path).is_none() {
            return;
        }
        self.0
            .retain(|k, _| !(k.starts_with(path) && k.get(path.len()) == Some(&b'/')));
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
