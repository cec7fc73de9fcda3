//! Applying a tree diff to a workspace (bringing back a released thread, making a fork: its
//! snapshot's changes from HEAD's tree, in O(changed paths)): one change at a path, a whole change
//! set (a run of additions as one transaction), and a change dated for `.git/index`. Removals prune
//! the directories they empty; additions make the missing ones. The catalog batch a change set
//! joins before the mount is [`super::batch`]; the changed names are noted for the kernel
//! ([`super::types::Behind`]).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::fs::FsError;
use fuser::{Errno, FileAttr};
use gix::ObjectId;

use crate::cow::catalog::{BaseRef, InodeRecord, Kind, Record, Ts};

use super::{
    ROOT_INO, State, WorkspaceFs,
    convert::check_name,
    namespace::{Content, New},
    tx::{Batch, Tx},
    types::{Behind, Caller, TreeChange},
};

impl WorkspaceFs {
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
