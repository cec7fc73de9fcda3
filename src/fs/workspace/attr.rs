//! Attribute presentation and the read-side requests: `lookup`, `forget`, `getattr`, `readdir`,
//! `readlink`, `access`, `statfs`, and `setattr`. The attributes of a derived inode come from
//! [`super::presented`]; a copied-up file's size and times from its data file.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::time::SystemTime;

use crate::fs::{Context, FsError};
use fuser::{Errno, FileAttr, FileType, INodeNo};

use crate::cow::catalog::{BaseRef, InodeRecord, Kind, Ts};
use crate::cow::upper::system_time;
use crate::git::objects::{EntryKind, TreeEntry};

use super::presented::{DIR_SIZE, base_mode, base_size};
use super::xattr::CAPABILITY;
use super::{
    NAME_MAX, ROOT_INO, WorkspaceFs, convert::check_name, convert::eio, convert::join,
    convert::oid, convert::shown, convert::ts, tx::Tx, types::DirEntry, types::DirName,
    types::SetAttr, types::SetTime,
};

impl WorkspaceFs {
    pub(super) fn derived_rec(
        &self,
        parent: u64,
        parent_path: &[u8],
        e: &TreeEntry,
        ino: u64,
    ) -> Result<InodeRecord, FsError> {
        let t = ts(self.pres.time);
        let (kind, nlink) = match e.kind {
            EntryKind::Tree => {
                let subdirs = self
                    .tree_entries(e.id)?
                    .iter()
                    .filter(|c| matches!(c.kind, EntryKind::Tree | EntryKind::Gitlink))
                    .count() as u32;
                (Kind::Dir, 2 + subdirs)
            }
            EntryKind::Gitlink => (Kind::Dir, 2),
            EntryKind::Blob | EntryKind::Executable => (Kind::File, 1),
            EntryKind::Symlink => (Kind::Symlink, 1),
        };
        let mode = base_mode(e.kind);
        Ok(InodeRecord {
            ino,
            kind,
            base: Some(BaseRef {
                oid: e.id.to_string(),
                path: join(parent_path, &e.name),
                gitlink: e.kind == EntryKind::Gitlink,
            }),
            upper: false,
            target: None,
            mode,
            uid: self.pres.uid,
            gid: self.pres.gid,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            nlink,
            parent,
            name: e.name.to_vec(),
            xattrs: BTreeMap::new(),
            copied_ctime: None,
            shared: None,
        })
    }

    pub(super) fn attr(&self, rec: &InodeRecord) -> Result<FileAttr, FsError> {
        self.attr_with(rec, None)
    }

    /// [`Self::attr`], given the metadata of an upper file's data file when the caller holds it
    /// open (`fstat` of its descriptor instead of a `stat` of its path).
    pub(super) fn attr_with(
        &self,
        rec: &InodeRecord,
        data: Option<&std::fs::Metadata>,
    ) -> Result<FileAttr, FsError> {
        let (mut atime, mut mtime, mut ctime) = (rec.atime, rec.mtime, rec.ctime);
        let (size, blocks) = match rec.kind {
            Kind::File if rec.upper => {
                let stat;
                let m = match data {
                    Some(m) => m,
                    None => {
                        let path = self.upper.data_path(rec.ino);
                        stat = std::fs::metadata(&path)
                            .map_err(eio)
                            .context(|| format!("data file {}", path.display()))?;
                        &stat
                    }
                };
                atime = Ts(m.atime(), m.atime_nsec() as u32);
                mtime = Ts(m.mtime(), m.mtime_nsec() as u32);
                let data_ctime = Ts(m.ctime(), m.ctime_nsec() as u32);
                if rec.copied_ctime.is_none_or(|c| data_ctime > c) {
                    ctime = ctime.max(data_ctime);
                }
                (m.len(), m.blocks())
            }
            Kind::File if rec.shared.is_some() => {
                let shared = rec.shared.as_deref().unwrap_or_default();
                let m = std::fs::metadata(shared)
                    .map_err(eio)
                    .context(|| format!("shared file {shared}"))?;
                (m.len(), m.blocks())
            }
            Kind::File | Kind::Symlink => {
                let size = match (&rec.target, &rec.base) {
                    (Some(t), _) => t.len() as u64,
                    (None, Some(b)) => {
                        let id = oid(&b.oid)?;
                        base_size(&self.store, EntryKind::Blob, id)
                            .map_err(eio)
                            .context(|| format!("blob {id} of {}", shown(&b.path)))?
                    }
                    (None, None) => 0,
                };
                (size, size.div_ceil(512))
            }
            Kind::Dir => (DIR_SIZE, DIR_SIZE / 512),
            _ => (0, 0),
        };
        Ok(FileAttr {
            ino: INodeNo(rec.ino),
            size,
            blocks,
            atime: system_time(atime),
            mtime: system_time(mtime),
            ctime: system_time(ctime),
            crtime: system_time(ctime),
            kind: file_type(rec.kind),
            perm: (rec.mode & 0o7777) as u16,
            nlink: rec.nlink,
            uid: rec.uid,
            gid: rec.gid,
            rdev: rec.rdev,
            blksize: 4096,
            flags: 0,
        })
    }

    // ----- lookups and attributes -----

    /// `lookup`: the attributes of `name` in `parent`, counting one kernel reference.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr, FsError> {
        let name = check_name(name)?;
        self.wait_held(Some(parent))?;
        let mut st = self.lock();
        let rec = self
            .reference(&mut st, parent, name)?
            .ok_or(Errno::ENOENT)?;
        drop(st);
        self.counted_attr(&rec)
    }

    /// The attributes of `rec`, read without the lock (a data file's are `fstat`ed), for a reply that
    /// hands the kernel a reference already counted: if they cannot be read, nothing is handed and
    /// the reference is dropped again.
    fn counted_attr(&self, rec: &InodeRecord) -> Result<FileAttr, FsError> {
        self.attr(rec).inspect_err(|_| self.forget(rec.ino, 1))
    }

    /// `forget`: the kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut st = self.lock();
        self.unreference(&mut st, ino, n);
    }

    pub fn getattr(&self, ino: u64) -> Result<FileAttr, FsError> {
        let rec = self.record(&self.lock(), ino)?;
        self.attr(&rec)
    }

    /// Whether the content of `ino` is the workspace's own data file.
    pub fn is_upper(&self, ino: u64) -> bool {
        self.lock()
            .live
            .inodes
            .get(&ino)
            .is_some_and(|n| n.rec.upper)
    }

    /// The whole listing of directory `ino`, `.` and `..` first. Entries are not counted as kernel
    /// references; readdirplus calls [`Self::listed`] for each one it returns.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>, FsError> {
        self.wait_held(Some(ino))?;
        let rec = self.record(&self.lock(), ino)?;
        if rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        let dot = self.attr(&rec)?;
        let parent_attr = FileAttr {
            ino: INodeNo(if ino == ROOT_INO {
                ROOT_INO
            } else {
                rec.parent
            }),
            ..dot
        };
        let mut out = vec![
            DirEntry {
                name: ".".into(),
                attr: dot,
            },
            DirEntry {
                name: "..".into(),
                attr: parent_attr,
            },
        ];
        if rec.nlink == 0 {
            return Ok(out);
        }
        // The base tree is read before, and the attributes computed after, the one critical
        // section that picks each name's inode.
        let base = match Self::base_tree(&rec) {
            Some((tree, path)) => Some((self.tree_entries(tree)?, path.to_vec())),
            None => None,
        };
        enum Child {
            Known(Box<InodeRecord>),
            Derived(TreeEntry, u64),
        }
        let children: Vec<(Vec<u8>, Child)> = {
            let st = self.lock();
            let overlay = st.live.dirs.get(&ino);
            let mut v = Vec::new();
            if let Some((entries, path)) = &base {
                for e in entries.iter() {
                    if overlay.is_some_and(|o| o.contains_key(&*e.name)) {
                        continue;
                    }
                    let child = self.derived_ino(&st, &join(path, &e.name))?;
                    let c = match st.live.inodes.get(&child) {
                        Some(n) => Child::Known(Box::new(n.rec.clone())),
                        None => Child::Derived(e.clone(), child),
                    };
                    v.push((e.name.to_vec(), c));
                }
            }
            for (name, target) in overlay.into_iter().flatten() {
                let Some(child) = target else { continue };
                v.push((
                    name.clone(),
                    Child::Known(Box::new(st.node(*child)?.rec.clone())),
                ));
            }
            v
        };
        for (name, c) in children {
            let child_rec = match c {
                Child::Known(r) => *r,
                Child::Derived(e, child) => {
                    let path = base.as_ref().map(|(_, p)| &p[..]).unwrap_or_default();
                    self.derived_rec(ino, path, &e, child)?
                }
            };
            out.push(DirEntry {
                name: OsString::from_vec(name),
                attr: self.attr(&child_rec)?,
            });
        }
        Ok(out)
    }

    /// The names of directory `ino` (`.` and `..` first, the rest in no particular order) with the
    /// inode and kind of each, and the number of commits they are valid for: while
    /// [`Self::commits`] returns the same number, no name was added, removed or renamed (every
    /// change of a directory is a committed transaction). Reads no attributes: cheap enough to
    /// serve a stateless `readdir` (readdirplus reads each entry's attributes with
    /// [`Self::listed`]).
    pub fn dir_names(&self, ino: u64) -> Result<(u64, Vec<DirName>), FsError> {
        self.wait_held(Some(ino))?;
        let (rec, seen) = {
            let st = self.lock();
            (self.record(&st, ino)?, st.commits)
        };
        if rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        // The base tree is read without the lock, as in `readdir`.
        let base = match Self::base_tree(&rec) {
            Some((tree, path)) => Some((self.store.tree(tree).map_err(eio)?, path.to_vec())),
            None => None,
        };
        let dir = |name: &str, ino: u64| DirName {
            name: name.into(),
            ino,
            kind: FileType::Directory,
        };
        let parent = if ino == ROOT_INO {
            ROOT_INO
        } else {
            rec.parent
        };
        let mut out = vec![dir(".", ino), dir("..", parent)];
        let st = self.lock();
        // Valid for the count read with the record: a commit since then (the record or its base
        // tree may have changed) makes the next call read the names again.
        if rec.nlink == 0 {
            return Ok((seen, out));
        }
        let overlay = st.live.dirs.get(&ino);
        if let Some((entries, path)) = &base {
            for e in entries.iter() {
                if overlay.is_some_and(|o| o.contains_key(&*e.name)) {
                    continue;
                }
                let child = self.derived_ino(&st, &join(path, &e.name))?;
                let kind = match st.live.inodes.get(&child) {
                    Some(n) => file_type(n.rec.kind),
                    None => match e.kind {
                        EntryKind::Tree | EntryKind::Gitlink => FileType::Directory,
                        EntryKind::Blob | EntryKind::Executable => FileType::RegularFile,
                        EntryKind::Symlink => FileType::Symlink,
                    },
                };
                out.push(DirName {
                    name: OsString::from_vec(e.name.to_vec()),
                    ino: child,
                    kind,
                });
            }
        }
        for (name, target) in overlay.into_iter().flatten() {
            let Some(child) = target else { continue };
            out.push(DirName {
                name: OsString::from_vec(name.clone()),
                ino: *child,
                kind: file_type(st.node(*child)?.rec.kind),
            });
        }
        Ok((seen, out))
    }

    /// Transactions committed since the workspace was loaded (see [`Self::dir_names`]).
    pub fn commits(&self) -> u64 {
        self.lock().commits
    }

    /// readdirplus hands the entry `name` of `parent` to the kernel: the current attributes of the
    /// inode the name has now (`None`: the name is gone), counting the kernel's reference to it.
    ///
    /// The listing a readdirplus serves was read at the first readdir of its handle, and the kernel
    /// applies the attributes of every entry to its cached inode as if they were current: served
    /// from the listing, a file written since then would read as its old size (see
    /// docs/caching.md). So they are read again here, when the request is answered.
    pub fn listed(&self, parent: u64, name: &OsStr) -> Result<Option<FileAttr>, FsError> {
        self.wait_held(Some(parent))?;
        let mut st = self.lock();
        let Some(rec) = self.reference(&mut st, parent, name.as_bytes())? else {
            return Ok(None);
        };
        drop(st);
        self.counted_attr(&rec).map(Some)
    }

    pub fn opendir(&self, ino: u64) -> Result<(), FsError> {
        match self.record(&self.lock(), ino)?.kind {
            Kind::Dir => Ok(()),
            _ => Err(Errno::ENOTDIR.into()),
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, FsError> {
        let rec = self.record(&self.lock(), ino)?;
        if rec.kind != Kind::Symlink {
            return Err(Errno::EINVAL.into());
        }
        match (rec.target, rec.base) {
            (Some(t), _) => Ok(t),
            (None, Some(b)) => self.blob_bytes(oid(&b.oid)?),
            (None, None) => Ok(Vec::new()),
        }
    }

    pub fn access(&self, ino: u64, _mask: i32) -> Result<(), FsError> {
        if self.lock().live.inodes.has(ino) {
            Ok(())
        } else {
            Err(Errno::ENOENT.into())
        }
    }

    pub fn statfs(&self) -> Result<crate::sys::FsStats, FsError> {
        crate::sys::statvfs(&self.statfs_path)
            .map(|mut s| {
                s.namelen = NAME_MAX as u32;
                s
            })
            .map_err(FsError::from)
    }

    // ----- attributes and extended attributes -----

    /// Drops the set-user-ID and set-group-ID bits of `ino` as a write or truncate by a caller
    /// without `CAP_FSETID` does (see [`killed_suidgid`]), and its file capabilities; nothing is
    /// recorded when it has none to drop. With `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves this to
    /// the file system.
    pub fn kill_suidgid(&self, ino: u64) -> Result<(), FsError> {
        let mut st = self.lock_for(ino)?;
        let rec = &st.node(ino)?.rec;
        if rec.kind == Kind::Dir
            || (killed_suidgid(rec.mode) == rec.mode && !rec.xattrs.contains_key(CAPABILITY))
        {
            return Ok(());
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.mode = killed_suidgid(r.mode);
        r.xattrs.remove(CAPABILITY);
        r.ctime = Ts::now();
        st.commit(tx)?;
        self.journal_ino(&mut st, ino);
        Ok(())
    }

    /// Before an open by `caller_uid` with `flags`: an open that truncates drops set-user-ID and
    /// set-group-ID as a truncate does (with `FUSE_HANDLE_KILLPRIV_V2` the kernel leaves it to the
    /// file system and fuser does not pass its `FUSE_OPEN_KILL_SUIDGID`: root stands for
    /// `CAP_FSETID`).
    pub fn before_open(&self, ino: u64, flags: i32, caller_uid: u32) -> Result<(), FsError> {
        if flags & libc::O_TRUNC != 0 && caller_uid != 0 {
            self.kill_suidgid(ino)?;
        }
        Ok(())
    }

    /// `setattr`. A size change copies a base file up first; the data file's size and times are
    /// set without the state lock (the kernel serializes `setattr` of one inode; a copy-up of it in
    /// progress is waited for).
    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<FileAttr, FsError> {
        let mut st = self.wait_copied(self.lock_for(ino)?, ino);
        let rec = st.node(ino)?.rec.clone();
        let now = Ts::now();
        if let Some(size) = set.size {
            match rec.kind {
                Kind::File => {}
                Kind::Dir => return Err(Errno::EISDIR.into()),
                _ => return Err(Errno::EINVAL.into()),
            }
            if !rec.upper {
                st = self.copy_up(st, ino, size == 0)?;
            }
        }
        let upper = st.node(ino)?.rec.upper;
        let data_times = upper && (set.atime.is_some() || set.mtime.is_some());
        if set.size.is_some() || data_times {
            drop(st);
            let f = self.open_data(ino)?;
            let data_file = || format!("data file {}", self.data_path(ino).display());
            if let Some(size) = set.size {
                // Growing is charged first (a refused truncate changes nothing); what a shrink
                // frees is given back once it is done.
                self.grow_data(ino, size)?;
                f.set_len(size)
                    .context(|| format!("truncating {}", data_file()))?;
                self.upper.usage().shrunk(ino, size);
            }
            if data_times {
                let mut times = std::fs::FileTimes::new();
                if let Some(t) = set.atime {
                    times = times.set_accessed(match t {
                        SetTime::Now => SystemTime::now(),
                        SetTime::At(t) => t,
                    });
                }
                if let Some(t) = set.mtime {
                    times = times.set_modified(match t {
                        SetTime::Now => SystemTime::now(),
                        SetTime::At(t) => t,
                    });
                }
                f.set_times(times)
                    .context(|| format!("setting the times of {}", data_file()))?;
            }
            drop(f);
            st = self.wait_copied(self.lock(), ino);
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        if let Some(m) = set.mode {
            r.mode = m & 0o7777;
        }
        if set.kill_suidgid && r.kind != Kind::Dir {
            r.mode = killed_suidgid(r.mode);
            r.xattrs.remove(CAPABILITY);
        }
        if let Some(u) = set.uid {
            r.uid = u;
        }
        if let Some(g) = set.gid {
            r.gid = g;
        }
        let pick = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => ts(t),
        };
        if let Some(t) = set.atime {
            r.atime = pick(t);
        }
        if let Some(t) = set.mtime {
            r.mtime = pick(t);
        }
        r.ctime = set.ctime.map(ts).unwrap_or(now);
        let changed = r.clone();
        st.commit(tx)?;
        self.journal_ino(&mut st, ino);
        drop(st);
        self.attr(&changed)
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::Char => FileType::CharDevice,
        Kind::Block => FileType::BlockDevice,
    }
}

/// `mode` without the privileges a write, truncate or chown drops (as `setattr_should_drop_suidgid`
/// in the kernel): set-user-ID always, set-group-ID only with group execution (without it the bit
/// means mandatory locking, which a write keeps).
pub(super) fn killed_suidgid(mode: u32) -> u32 {
    let mut m = mode & !libc::S_ISUID;
    if m & libc::S_IXGRP != 0 {
        m &= !libc::S_ISGID;
    }
    m
}
