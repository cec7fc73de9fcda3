//! octofs's quiet bookkeeping writes: files of its own inside the workspace (e.g.
//! `.git/refs/octomate/saved`) written or renamed by the daemon without counting as a change of the
//! workspace's state, replaced the way git replaces a ref (never truncated), each changed name
//! noted for the kernel ([`Behind`]). Must not be used for the user's files.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::fs::{Context, FsError};
use fuser::Errno;

use crate::cow::catalog::{InodeRecord, Kind, Ts};

use super::{
    ROOT_INO, WorkspaceFs,
    convert::io_errno,
    namespace::{Content, New},
    tx::Tx,
    types::Behind,
};

impl WorkspaceFs {
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
}
