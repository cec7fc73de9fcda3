//! Namespace changes through the mount: `mknod`, `mkdir`, `symlink`, `create`, `unlink`, `rmdir`,
//! `rename` and `link`, each one transaction. Never reads or writes file content, except creating the
//! empty (or seeded) data file of a new regular file.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt as _;

use crate::fs::{Context, FsError};
use fuser::{Errno, FileAttr};

use crate::cow::catalog::{BaseRef, InodeRecord, Kind, Record, Ts};

use super::{
    LINK_MAX, ROOT_INO, State, WorkspaceFs, convert::check_name, convert::eio, convert::io_errno,
    resend::crash_point, tree_order::find_entry, tx::Tx, types::Caller, types::Opened,
};

/// What `make` creates.
pub(super) struct New<'a> {
    /// Bookkeeping of octofs's own (see [`Tx::quiet`]).
    pub(super) quiet: bool,
    pub(super) kind: Kind,
    pub(super) mode: u32,
    pub(super) rdev: u32,
    pub(super) target: Option<Vec<u8>>,
    pub(super) content: Content<'a>,
}

/// The initial content of a new regular file.
pub(super) enum Content<'a> {
    Empty,
    Bytes(&'a [u8]),
    /// An immutable host-wide file, read until the first write copies it up.
    Shared(String),
    /// An object of the mirror (a blob, or a gitlink's commit), as if it came from the base.
    Object(BaseRef),
}

/// One change of a tree, applied by [`WorkspaceFs::apply`].
impl New<'_> {
    pub(super) fn plain(kind: Kind, mode: u32, rdev: u32) -> New<'static> {
        New {
            quiet: false,
            kind,
            mode,
            rdev,
            target: None,
            content: Content::Empty,
        }
    }
}
impl WorkspaceFs {
    // ----- creating and removing names -----

    pub(super) fn parent_for_create(
        &self,
        st: &mut State,
        parent: u64,
        name: &[u8],
    ) -> Result<(), FsError> {
        let p = st.node(parent)?;
        if p.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        if p.rec.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        if self.resolve(st, parent, name)?.is_some() {
            return Err(Errno::EEXIST.into());
        }
        Ok(())
    }

    /// Removes `name` from `dir` in `tx`: hides a base entry, or forgets an entry the workspace made.
    pub(super) fn unlink_name(
        &self,
        st: &State,
        tx: &mut Tx,
        dir: u64,
        name: &[u8],
    ) -> Result<(), FsError> {
        let in_base = match Self::base_tree(&st.node(dir)?.rec) {
            Some((tree, _)) => find_entry(&self.tree_entries(tree)?, name).is_some(),
            None => false,
        };
        if in_base {
            tx.entry(dir, name, None);
        } else {
            tx.records.push(Record::Unentry {
                dir,
                name: name.to_vec(),
            });
        }
        Ok(())
    }

    /// `ino` (still linked elsewhere) loses its name `name` in `dir`: if that was the name its record
    /// remembers, remember another of its names instead.
    pub(super) fn repoint_primary(
        st: &State,
        tx: &mut Tx,
        ino: u64,
        dir: u64,
        name: &[u8],
    ) -> Result<(), FsError> {
        let r = st.rec(tx, ino)?;
        if r.parent != dir || r.name != name {
            return Ok(());
        }
        let other = st.live.dirs.iter().find_map(|(d, entries)| {
            entries
                .iter()
                .find(|(n, i)| **i == Some(ino) && !(*d == dir && n.as_slice() == name))
                .map(|(n, _)| (*d, n.clone()))
        });
        if let Some((d, n)) = other {
            r.parent = d;
            r.name = n;
        }
        Ok(())
    }

    pub(super) fn touch_dir(st: &State, tx: &mut Tx, dir: u64, now: Ts) -> Result<(), FsError> {
        let r = st.rec(tx, dir)?;
        r.mtime = now;
        r.ctime = now;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn make(
        &self,
        parent: u64,
        name: &OsStr,
        new: New<'_>,
        caller: Caller,
    ) -> Result<FileAttr, FsError> {
        let rec = self.make_rec(parent, name, new, caller)?;
        self.attr(&rec)
    }

    /// [`Self::make`] without computing the new node's attributes (which, for an entry referring
    /// to a blob, reads the blob's size): its record, with one kernel reference counted.
    pub(super) fn make_rec(
        &self,
        parent: u64,
        name: &OsStr,
        new: New<'_>,
        caller: Caller,
    ) -> Result<InodeRecord, FsError> {
        self.make_counted(parent, name, new, caller, None)
            .map(|(rec, _)| rec)
    }

    /// [`Self::make_rec`], also returning the new regular file's data file (open for reading and
    /// writing) when one was made. `open`: the new node is opened too, in the same hold of the lock
    /// as its commit (`Some(true)`: for writing) — one open counted, as [`Self::open`] counts it.
    fn make_counted(
        &self,
        parent: u64,
        name: &OsStr,
        new: New<'_>,
        caller: Caller,
        open: Option<bool>,
    ) -> Result<(InodeRecord, Option<File>), FsError> {
        let New {
            quiet,
            kind,
            mode,
            rdev,
            target,
            content,
        } = new;
        let name = check_name(name)?;
        let now = Ts::now();
        let upper = kind == Kind::File && matches!(content, Content::Empty | Content::Bytes(_));
        let mut st = self.lock();
        self.parent_for_create(&mut st, parent, name)?;
        // A new regular file's data file is made without the lock, under a number taken now (the
        // batch that links it records the counter); the name is checked again afterwards.
        let (made, data) = if upper {
            let ino = st.alloc_number();
            drop(st);
            let data = self.new_data_file(ino, now, &content)?;
            st = self.lock();
            if let Err(e) = self.parent_for_create(&mut st, parent, name) {
                self.upper.remove(ino);
                return Err(e);
            }
            (Some(ino), Some(data))
        } else {
            (None, None)
        };
        let committed = (|| {
            let mut tx = Tx {
                quiet,
                ..Tx::default()
            };
            st.chain(&mut tx, parent)?;
            let ino = match made {
                Some(ino) => {
                    tx.records.push(Record::NextIno {
                        next: st.live.next_ino,
                    });
                    ino
                }
                None => st.alloc(&mut tx),
            };
            let p = st.rec(&mut tx, parent)?;
            let (gid, mut mode) = if p.mode & libc::S_ISGID != 0 {
                (p.gid, mode & 0o7777)
            } else {
                (caller.gid, mode & 0o7777)
            };
            if kind == Kind::Dir {
                link_up(&mut p.nlink)?;
                if p.mode & libc::S_ISGID != 0 {
                    mode |= libc::S_ISGID;
                }
            }
            p.mtime = now;
            p.ctime = now;
            let base = match &content {
                Content::Object(b) => Some(b.clone()),
                _ => None,
            };
            let rec = InodeRecord {
                ino,
                kind,
                base,
                upper,
                target,
                mode,
                uid: caller.uid,
                gid,
                rdev,
                atime: now,
                mtime: now,
                ctime: now,
                nlink: if kind == Kind::Dir { 2 } else { 1 },
                parent,
                name: name.to_vec(),
                xattrs: BTreeMap::new(),
                copied_ctime: None,
                shared: match content {
                    Content::Shared(p) => Some(p),
                    _ => None,
                },
            };
            tx.entry(parent, name, Some(ino));
            tx.recs.insert(ino, rec.clone());
            st.commit(tx)?;
            Ok(rec)
        })();
        let rec = match committed {
            Ok(rec) => rec,
            Err(e) => {
                if let Some(ino) = made {
                    self.upper.remove(ino);
                }
                return Err(e);
            }
        };
        let ino = rec.ino;
        let n = st.node_mut(ino)?;
        n.lookups += 1;
        if let Some(writer) = open {
            n.opens += 1;
            if writer {
                n.writers += 1;
            }
        }
        self.journal_name(&mut st, parent, name, kind == Kind::Dir);
        if open == Some(true) {
            // As `open` notes a write-open: the snapshot tracker counts the file while it is open
            // for writing.
            self.journal_ino(&mut st, ino);
        }
        Ok((rec, data))
    }

    /// Creates the data file of new inode `ino` holding `content` (empty or bytes), with times
    /// `now`, and returns it open for reading and writing.
    fn new_data_file(&self, ino: u64, now: Ts, content: &Content<'_>) -> Result<File, FsError> {
        let data_file = || format!("data file {}", self.upper.data_path(ino).display());
        let mut f = self
            .upper
            .create(ino, None, now, now)
            .context(|| format!("creating {}", data_file()))?;
        if let Content::Bytes(b) = content {
            use std::io::Write;
            if let Err(e) = f.write_all(b) {
                self.upper.remove(ino);
                return Err(io_errno(e).context(format!("writing {}", data_file())));
            }
        }
        Ok(f)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<FileAttr, FsError> {
        self.wait_held(Some(parent))?;
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::Char,
            libc::S_IFBLK => Kind::Block,
            libc::S_IFDIR => return Err(Errno::EPERM.into()),
            _ => return Err(Errno::EINVAL.into()),
        };
        let r = self.make(parent, name, New::plain(kind, mode, rdev), caller);
        if r.is_ok() {
            crash_point("mknod", name.as_bytes());
        }
        r
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        caller: Caller,
    ) -> Result<FileAttr, FsError> {
        self.wait_held(Some(parent))?;
        let r = self.make(parent, name, New::plain(Kind::Dir, mode, 0), caller);
        if r.is_ok() {
            crash_point("mkdir", name.as_bytes());
        }
        r
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &[u8],
        caller: Caller,
    ) -> Result<FileAttr, FsError> {
        self.wait_held(Some(parent))?;
        if target.len() >= 4096 {
            return Err(Errno::ENAMETOOLONG.into());
        }
        let new = New {
            target: Some(target.to_vec()),
            ..New::plain(Kind::Symlink, 0o777, 0)
        };
        let r = self.make(parent, name, new, caller);
        if r.is_ok() {
            crash_point("symlink", name.as_bytes());
        }
        r
    }

    /// `create`: a new regular file, opened. The data file made for it is the handle's file (one
    /// open, not a create, a close and an open again), and its attributes are read from that
    /// descriptor; the open is counted in the same hold of the lock as the commit.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(FileAttr, Opened), FsError> {
        self.wait_held(Some(parent))?;
        // `O_TRUNC` means nothing for a new file; any other write access makes a writer.
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let new = New::plain(Kind::File, mode, 0);
        let (rec, data) = self.make_counted(parent, name, new, caller, Some(write))?;
        let ino = rec.ino;
        let opened = data
            .ok_or_else(|| eio(format!("new file {ino:#x} has no data file")))
            .and_then(|file| {
                let m = file
                    .metadata()
                    .map_err(eio)
                    .context(|| format!("data file {}", self.data_path(ino).display()))?;
                let attr = self.attr_with(&rec, Some(&m))?;
                Ok((attr, file))
            });
        match opened {
            Ok((attr, file)) => {
                crash_point("create", name.as_bytes());
                Ok((
                    attr,
                    Opened {
                        file,
                        upper: true,
                        write,
                    },
                ))
            }
            Err(e) => {
                self.release(ino, write);
                self.forget(ino, 1);
                Err(e)
            }
        }
    }

    pub(super) fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), FsError> {
        let name = check_name(name)?;
        let mut st = self.lock();
        let ino = self.resolve(&mut st, parent, name)?.ok_or(Errno::ENOENT)?;
        match (dir, st.node(ino)?.rec.kind == Kind::Dir) {
            (false, true) => return Err(Errno::EISDIR.into()),
            (true, false) => return Err(Errno::ENOTDIR.into()),
            _ => {}
        }
        if dir && !self.is_empty_dir(&mut st, ino)? {
            return Err(Errno::ENOTEMPTY.into());
        }
        let now = Ts::now();
        let mut tx = Tx::default();
        st.chain(&mut tx, parent)?;
        self.unlink_name(&st, &mut tx, parent, name)?;
        Self::touch_dir(&st, &mut tx, parent, now)?;
        if dir {
            link_down(&mut st.rec(&mut tx, parent)?.nlink)?;
            tx.drop_inode(ino);
        } else {
            let r = st.rec(&mut tx, ino)?;
            r.nlink = r.nlink.saturating_sub(1);
            r.ctime = now;
            if r.nlink == 0 {
                tx.drop_inode(ino);
            } else {
                Self::repoint_primary(&st, &mut tx, ino, parent, name)?;
            }
        }
        st.commit(tx)?;
        self.journal_name(&mut st, parent, name, dir);
        self.reap(&mut st, ino);
        drop(st);
        crash_point(if dir { "rmdir" } else { "unlink" }, name);
        Ok(())
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<(), FsError> {
        self.wait_held(Some(parent))?;
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<(), FsError> {
        self.wait_held(Some(parent))?;
        self.remove(parent, name, true)
    }

    pub(super) fn is_empty_dir(&self, st: &mut State, ino: u64) -> Result<bool, FsError> {
        let rec = st.node(ino)?.rec.clone();
        let overlay = st.live.dirs.get(&ino);
        if overlay.is_some_and(|o| o.values().any(|v| v.is_some())) {
            return Ok(false);
        }
        if let Some((tree, _)) = Self::base_tree(&rec) {
            for e in self.tree_entries(tree)?.iter() {
                if !overlay.is_some_and(|o| o.contains_key(&*e.name)) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Whether `ino` is `ancestor` or lies below it.
    pub(super) fn is_within(st: &State, mut ino: u64, ancestor: u64) -> Result<bool, FsError> {
        for _ in 0..100_000 {
            if ino == ancestor {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            ino = st.node(ino)?.rec.parent;
        }
        Err(eio("directory parent chain does not end"))
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<(), FsError> {
        self.wait_held(Some(parent))?;
        self.wait_held(Some(newparent))?;
        let name = check_name(name)?;
        let newname = check_name(newname)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 || (exchange && noreplace)
        {
            return Err(Errno::EINVAL.into());
        }
        let mut st = self.lock();
        // As the kernel orders them: both parents are resolved before the source is looked up.
        if st.node(newparent)?.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR.into());
        }
        let src = self.resolve(&mut st, parent, name)?.ok_or(Errno::ENOENT)?;
        if st.node(newparent)?.rec.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        let dst = self.resolve(&mut st, newparent, newname)?;
        let src_dir = st.node(src)?.rec.kind == Kind::Dir;
        let now = Ts::now();
        let mut tx = Tx::default();
        if exchange {
            let dst = dst.ok_or(Errno::ENOENT)?;
            if dst == src {
                return Ok(());
            }
            let dst_dir = st.node(dst)?.rec.kind == Kind::Dir;
            if (src_dir && Self::is_within(&st, newparent, src)?)
                || (dst_dir && Self::is_within(&st, parent, dst)?)
            {
                return Err(Errno::EINVAL.into());
            }
            st.chain(&mut tx, parent)?;
            st.chain(&mut tx, newparent)?;
            st.chain(&mut tx, src)?;
            st.chain(&mut tx, dst)?;
            tx.entry(parent, name, Some(dst));
            tx.entry(newparent, newname, Some(src));
            if parent != newparent && src_dir != dst_dir {
                let (gains_dir, loses_dir) = if src_dir {
                    (newparent, parent)
                } else {
                    (parent, newparent)
                };
                link_up(&mut st.rec(&mut tx, gains_dir)?.nlink)?;
                link_down(&mut st.rec(&mut tx, loses_dir)?.nlink)?;
            }
            for (ino, p, n) in [(src, newparent, newname), (dst, parent, name)] {
                let r = st.rec(&mut tx, ino)?;
                r.parent = p;
                r.name = n.to_vec();
                r.ctime = now;
            }
            Self::touch_dir(&st, &mut tx, parent, now)?;
            Self::touch_dir(&st, &mut tx, newparent, now)?;
            st.commit(tx)?;
            self.journal_name(&mut st, parent, name, src_dir || dst_dir);
            self.journal_name(&mut st, newparent, newname, src_dir || dst_dir);
            return Ok(());
        }
        if let Some(dst) = dst {
            if noreplace {
                return Err(Errno::EEXIST.into());
            }
            if dst == src {
                return Ok(());
            }
            // As the kernel orders them: a directory into itself, then over its own ancestor, before
            // the target's type.
            if src_dir && Self::is_within(&st, newparent, src)? {
                return Err(Errno::EINVAL.into());
            }
            let dst_dir = st.node(dst)?.rec.kind == Kind::Dir;
            if dst_dir && Self::is_within(&st, parent, dst)? {
                return Err(Errno::ENOTEMPTY.into());
            }
            match (src_dir, dst_dir) {
                (true, false) => return Err(Errno::ENOTDIR.into()),
                (false, true) => return Err(Errno::EISDIR.into()),
                (true, true) if !self.is_empty_dir(&mut st, dst)? => {
                    return Err(Errno::ENOTEMPTY.into());
                }
                _ => {}
            }
        }
        if src_dir && Self::is_within(&st, newparent, src)? {
            return Err(Errno::EINVAL.into());
        }
        st.chain(&mut tx, parent)?;
        st.chain(&mut tx, newparent)?;
        self.unlink_name(&st, &mut tx, parent, name)?;
        tx.entry(newparent, newname, Some(src));
        if let Some(dst) = dst {
            let r = st.rec(&mut tx, dst)?;
            if r.kind == Kind::Dir {
                r.nlink = 0;
            } else {
                r.nlink = r.nlink.saturating_sub(1);
                r.ctime = now;
            }
            if r.nlink == 0 {
                tx.drop_inode(dst);
            } else {
                Self::repoint_primary(&st, &mut tx, dst, newparent, newname)?;
            }
            if src_dir {
                link_down(&mut st.rec(&mut tx, newparent)?.nlink)?;
            }
        }
        if src_dir && parent != newparent {
            link_down(&mut st.rec(&mut tx, parent)?.nlink)?;
            link_up(&mut st.rec(&mut tx, newparent)?.nlink)?;
        }
        let r = st.rec(&mut tx, src)?;
        r.parent = newparent;
        r.name = newname.to_vec();
        r.ctime = now;
        Self::touch_dir(&st, &mut tx, parent, now)?;
        Self::touch_dir(&st, &mut tx, newparent, now)?;
        st.commit(tx)?;
        self.journal_name(&mut st, parent, name, src_dir);
        self.journal_name(&mut st, newparent, newname, src_dir);
        if let Some(dst) = dst {
            self.reap(&mut st, dst);
        }
        drop(st);
        crash_point("rename", newname);
        Ok(())
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<FileAttr, FsError> {
        self.wait_held(Some(newparent))?;
        let newname = check_name(newname)?;
        let mut st = self.lock_for(ino)?;
        let rec = st.node(ino)?.rec.clone();
        // As the kernel orders them: an existing name first, then what the source is.
        self.parent_for_create(&mut st, newparent, newname)?;
        if rec.kind == Kind::Dir {
            return Err(Errno::EPERM.into());
        }
        if rec.nlink == 0 {
            return Err(Errno::ENOENT.into());
        }
        if rec.nlink >= LINK_MAX {
            return Err(Errno::EMLINK.into());
        }
        let now = Ts::now();
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        st.chain(&mut tx, newparent)?;
        tx.entry(newparent, newname, Some(ino));
        let r = st.rec(&mut tx, ino)?;
        link_up(&mut r.nlink)?;
        r.ctime = now;
        Self::touch_dir(&st, &mut tx, newparent, now)?;
        st.commit(tx)?;
        // The new name appeared; the content did not change, so the other names need no report.
        self.journal_name(&mut st, newparent, newname, false);
        let n = st.node_mut(ino)?;
        n.lookups += 1;
        let rec = n.rec.clone();
        drop(st);
        crash_point("link", newname);
        self.attr(&rec)
    }
}

/// One more link to an inode (a name, or a subdirectory's `..`).
fn link_up(nlink: &mut u32) -> Result<(), FsError> {
    *nlink = nlink.checked_add(1).ok_or(Errno::EMLINK)?;
    Ok(())
}

/// One link less; a count already at zero is a damaged record, not a panic.
fn link_down(nlink: &mut u32) -> Result<(), FsError> {
    *nlink = nlink
        .checked_sub(1)
        .ok_or_else(|| eio("a link count would go below zero"))?;
    Ok(())
}
