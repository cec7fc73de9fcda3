//! The daemon's API, used without the kernel: seeding a new workspace's own files before it is
//! mounted, reading files and directories by path (never following symlinks), octofs's quiet
//! bookkeeping writes, applying a tree diff, and the list of changes made behind the kernel
//! ([`Behind`]) for the daemon to invalidate.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use crate::fs::{Context, FsError};
use fuser::{Errno, FileAttr, FileType};
use gix::ObjectId;

use crate::cow::catalog::{BaseRef, InodeRecord, Kind, Ts};

use super::{
    ROOT_INO, State, WorkspaceFs, convert::io_errno, namespace::Content, namespace::New, tx::Tx,
    types::Behind, types::Caller, types::Listing, types::TreeChange,
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
        let owner = self.owner();
        let mut cur = ROOT_INO;
        for d in dirs {
            let next = {
                let mut st = self.lock();
                self.resolve(&mut st, cur, d.as_bytes())?
            };
            cur = match next {
                Some(i) => i,
                None => {
                    let new = New {
                        quiet: true,
                        ..New::plain(Kind::Dir, 0o755, 0)
                    };
                    let made = self.seeded(self.make(cur, OsStr::new(d), new, owner))?;
                    self.entry_behind(cur, d.as_bytes());
                    made
                }
            };
        }
        let existing = {
            let mut st = self.lock();
            self.resolve(&mut st, cur, name.as_bytes())?
        };
        let ino = match existing {
            Some(old) => self.replace_quietly(cur, name.as_bytes(), old, bytes)?,
            None => {
                let new = New {
                    quiet: true,
                    content: Content::Bytes(bytes),
                    ..New::plain(Kind::File, 0o644, 0)
                };
                self.seeded(self.make(cur, OsStr::new(name), new, owner))?
            }
        };
        self.entry_behind(cur, name.as_bytes());
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
        let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        let (name, dirs) = comps.split_last().ok_or(Errno::EINVAL)?;
        let owner = self.owner();
        let mut parents = vec![ROOT_INO];
        for d in dirs {
            let cur = *parents.last().expect("root");
            let next = {
                let mut st = self.lock();
                self.resolve(&mut st, cur, d)?
            };
            let next = match next {
                Some(i) => i,
                None if *change == TreeChange::Remove => return Ok(()),
                None => {
                    let made = self.seeded(self.make(
                        cur,
                        OsStr::from_bytes(d),
                        New::plain(Kind::Dir, 0o755, 0),
                        owner,
                    ))?;
                    self.entry_behind(cur, d);
                    made
                }
            };
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
            Some(Kind::Dir) => self.rmdir(dir, name)?,
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
        self.seeded(self.make(dir, name, made, owner)).map(|_| ())
    }

    pub(super) fn owner(&self) -> Caller {
        Caller {
            uid: self.pres.uid,
            gid: self.pres.gid,
        }
    }
}
