//! One workspace of the core driven beside its model: [`Case::step`] applies a generated operation
//! to both (the test plays the kernel: lookups take references, handles are held across steps,
//! forget rounds drop most references but never a directory's while something below is still
//! referenced) and then runs every check of the checker. A reload is clean (`close`) or unclean
//! (dropped, as a SIGKILL would leave it).

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::FileExt;

use fuser::{Errno, FileAttr};
use octofs::cow::catalog::Ts;
use octofs::fs::{FsError, ROOT_INO, SetAttr, WorkspaceFs, path_ino};

use super::base::{Base, scratch_dir};
use super::checker::{Ids, check_attr, outcome, tally};
use super::generator::{Op, Step};
use super::model::{CALLER, Id, Kind, Model, ROOT, components, os};
use crate::common::{Rng, pseudo_random};

/// A handle kept open across steps.
pub struct Held {
    pub id: Id,
    pub ino: u64,
    pub file: File,
    /// The handle is the upper data file (else the base content in the blob cache).
    pub upper: bool,
    pub write: bool,
}

/// One workspace driven beside its model.
pub struct Case<'b> {
    pub base: &'b Base,
    pub upper: tempfile::TempDir,
    pub fs: Option<WorkspaceFs>,
    pub model: Model,
    /// The model as the base commit has it (for the diff of `changes()`).
    pub base_model: Model,
    pub ids: Ids,
    /// References the test holds as the kernel would.
    pub refs: BTreeMap<u64, u64>,
    pub held: Vec<Held>,
    /// The fsmonitor token of the state before the current step.
    pub token: String,
    /// The generation and time of the last `view()` (what a snapshot records).
    pub last_view: Option<(u64, Ts)>,
    /// This step's walk also answers as readdirplus does (`listed`: one more reference).
    pub plus: bool,
    /// Data files an unclean stop may have quarantined (unlinked files still held open).
    pub may_quarantine: usize,
    /// The tree of the last snapshot the core was told of (see `check_snapshot_since`), and
    /// whether the core was reloaded since (it cannot know that snapshot then).
    pub snap_last: Option<gix::ObjectId>,
    pub snap_reloaded: bool,
    /// The snapshot caches of this case (the daemon's are one per daemon).
    pub snap_caches: octofs::git::snapshot::Caches,
}

impl<'b> Case<'b> {
    pub fn new(base: &'b Base) -> Case<'b> {
        let upper = scratch_dir();
        let fs = base.load(upper.path());
        let model = Model::from_base();
        let mut ids = Ids::default();
        ids.observe(ROOT, ROOT_INO, "root");
        // Base entries are numbered by the hash of their path (docs/inodes.md).
        for (path, id) in model.entries() {
            ids.observe(id, path_ino(path.as_bytes(), 0), &path);
        }
        Case {
            base,
            upper,
            fs: Some(fs),
            base_model: model.clone(),
            model,
            ids,
            refs: BTreeMap::new(),
            held: Vec::new(),
            plus: false,
            token: String::new(),
            last_view: None,
            may_quarantine: 0,
            snap_last: None,
            snap_reloaded: false,
            snap_caches: Default::default(),
        }
    }

    pub fn fs(&self) -> &WorkspaceFs {
        self.fs.as_ref().expect("loaded")
    }

    /// Sends `set` to the core for the inode the model calls `id`, whose own outcome is `model`;
    /// when both succeed, the attributes the core answers must match the model.
    pub fn setattr_checked(
        &mut self,
        id: Id,
        ino: u64,
        model: Result<(), Errno>,
        set: SetAttr,
        what: &str,
    ) {
        let c = self.fs().setattr(ino, set);
        if let Some(((), a)) = outcome(what, model, c) {
            check_attr(&self.model, &mut self.ids, id, &a, what);
        }
    }

    pub fn add_ref(&mut self, ino: u64) {
        *self.refs.entry(ino).or_default() += 1;
    }

    /// Resolves `path` through the core's lookups (taking the kernel's references) and the model;
    /// both must find the same inode or fail the same way (then the operation is not sent).
    pub fn resolve(&mut self, path: &str, what: &str) -> Option<(Id, u64)> {
        let m = self.model.resolve(path);
        let mut ino = ROOT_INO;
        let mut inos = vec![ROOT_INO];
        let mut core = Ok(());
        for c in components(path) {
            match self.fs().lookup(ino, &os(c)) {
                Ok(a) => {
                    ino = a.ino.0;
                    inos.push(ino);
                    self.add_ref(ino);
                }
                Err(e) => {
                    core = Err(e);
                    break;
                }
            }
        }
        let (ids, ()) = outcome(&format!("{what}: resolving {path:?}"), m, core)?;
        for (id, ino) in ids.iter().zip(&inos) {
            self.ids.observe(*id, *ino, path);
        }
        Some((*ids.last().expect("root"), ino))
    }

    pub fn step(&mut self, s: &Step) {
        self.plus = s.forget_seed >> 63 == 1;
        let before = self.model.signatures();
        if self.token.is_empty() {
            self.token = self.fs().fsmonitor_query("").0;
        }
        // What a snapshot records of the view it was built from (the last view read).
        let (generation, at) = match self.last_view {
            Some(mark) => mark,
            None => {
                let v = self.fs().view().expect("view");
                (v.generation, v.taken_at)
            }
        };
        self.apply(&s.op);
        self.check_journal(&before);
        // A snapshot is skipped when nothing changed since the last one: it must not be skipped
        // when the working state (as git sees it) did change.
        let git = |sig: &BTreeMap<String, (Id, u64, Kind, bool)>| {
            sig.iter()
                .filter(|(_, v)| matches!(v.2, Kind::File | Kind::Symlink))
                .map(|(p, v)| (p.clone(), *v))
                .collect::<BTreeMap<_, _>>()
        };
        if git(&before) != git(&self.model.signatures()) {
            assert!(
                self.fs().changed_since(generation, at, &[]),
                "changed_since: the working state changed, the workspace says it did not"
            );
        }
        self.verify();
        self.check_view();
        // A snapshot view every step; saved (the next one may start from it) two steps in three,
        // so that changes pile up over several views.
        self.check_snapshot_since(!s.forget_seed.is_multiple_of(3));
        self.forget_round(s.forget_seed);
        self.check_data_files();
    }

    pub fn apply(&mut self, op: &Op) {
        let what = format!("{op:?}");
        let what = what.as_str();
        match op {
            Op::Create {
                dir,
                name,
                mode,
                data,
            } => {
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self.model.make(d, name, Kind::File, *mode, Vec::new());
                let c = self.fs().create(
                    dino,
                    &os(name),
                    libc::S_IFREG | mode,
                    libc::O_RDWR | libc::O_CREAT,
                    CALLER,
                );
                if let Some((id, (attr, opened))) = outcome(what, m, c) {
                    self.add_ref(attr.ino.0);
                    check_attr(&self.model, &mut self.ids, id, &attr, what);
                    assert!(
                        opened.upper,
                        "{what}: a new file is opened on its data file"
                    );
                    if let Some((len, seed)) = data {
                        let b = pseudo_random(*len, *seed);
                        opened.file.write_all_at(&b, 0).expect("write");
                        self.model.write(id, 0, &b);
                    }
                    drop(opened);
                    self.fs().release(attr.ino.0, true);
                }
            }
            Op::Mknod { dir, name, mode } => {
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self.model.make(d, name, Kind::Fifo, *mode, Vec::new());
                let c = self
                    .fs()
                    .mknod(dino, &os(name), libc::S_IFIFO | mode, 0, CALLER);
                self.made(what, m, c);
            }
            Op::Mkdir { dir, name, mode } => {
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self.model.make(d, name, Kind::Dir, *mode, Vec::new());
                let c = self.fs().mkdir(dino, &os(name), *mode, CALLER);
                self.made(what, m, c);
            }
            Op::Symlink { dir, name, target } => {
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self
                    .model
                    .make(d, name, Kind::Symlink, 0o777, target.as_bytes().to_vec());
                let c = self
                    .fs()
                    .symlink(dino, &os(name), target.as_bytes(), CALLER);
                self.made(what, m, c);
            }
            Op::Link { src, dir, name } => {
                let Some((s, sino)) = self.resolve(src, what) else {
                    return;
                };
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self.model.link(s, d, name).map(|()| s);
                let c = self.fs().link(sino, dino, &os(name));
                self.made(what, m, c);
            }
            Op::Unlink { dir, name } => {
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self.model.unlink(d, name);
                let c = self.fs().unlink(dino, &os(name));
                outcome(what, m, c);
            }
            Op::Rmdir { dir, name } => {
                let Some((d, dino)) = self.resolve(dir, what) else {
                    return;
                };
                let m = self.model.rmdir(d, name);
                let c = self.fs().rmdir(dino, &os(name));
                outcome(what, m, c);
            }
            Op::Rename {
                dir,
                name,
                newdir,
                newname,
                flags,
            } => {
                let Some((p, pino)) = self.resolve(dir, what) else {
                    return;
                };
                let Some((np, npino)) = self.resolve(newdir, what) else {
                    return;
                };
                let m = self.model.rename(p, name, np, newname, *flags);
                let c = self
                    .fs()
                    .rename(pino, &os(name), npino, &os(newname), *flags);
                outcome(what, m, c);
            }
            Op::Write {
                path,
                off,
                len,
                seed,
            } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if self.model.kind(id) == Kind::Fifo {
                    return; // the kernel serves fifos itself
                }
                let m = self.model.open(id, true, false);
                let c = self.fs().open(ino, libc::O_RDWR);
                if let Some(((), opened)) = outcome(what, m, c) {
                    assert!(opened.upper, "{what}: a write open gets the data file");
                    let b = pseudo_random(*len, *seed);
                    opened.file.write_all_at(&b, *off).expect("write");
                    self.model.write(id, *off, &b);
                    drop(opened);
                    self.fs().release(ino, true);
                }
            }
            Op::ReinodeWrite {
                path,
                off,
                len,
                seed,
            } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if self.model.kind(id) != Kind::File {
                    return;
                }
                let m = self.model.reinode(id);
                let c = self.fs().reinode_for_write(ino);
                let Some((m, moved)) = outcome(what, Ok(m), c) else {
                    return;
                };
                assert_eq!(
                    moved,
                    m.is_some(),
                    "{what}: reinode_for_write moved the name"
                );
                // ESTALE: the kernel looks the name up again and opens what it finds.
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if let Some(new) = m {
                    assert_eq!(id, new, "{what}: the name has the new inode");
                }
                let m = self.model.open(id, true, false);
                let c = self.fs().open(ino, libc::O_RDWR);
                if let Some(((), opened)) = outcome(what, m, c) {
                    let b = pseudo_random(*len, *seed);
                    opened.file.write_all_at(&b, *off).expect("write");
                    self.model.write(id, *off, &b);
                    drop(opened);
                    self.fs().release(ino, true);
                }
            }
            Op::Truncate { path, size } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                let m = self.model.truncate(id, *size);
                self.setattr_checked(
                    id,
                    ino,
                    m,
                    SetAttr {
                        size: Some(*size),
                        ..SetAttr::default()
                    },
                    what,
                );
            }
            Op::Chmod { path, mode } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if self.model.kind(id) == Kind::Symlink {
                    return; // chmod follows symlinks; lchmod is refused by the kernel
                }
                self.model.node_mut(id).mode = mode & 0o7777;
                self.setattr_checked(
                    id,
                    ino,
                    Ok(()),
                    SetAttr {
                        mode: Some(*mode),
                        ..SetAttr::default()
                    },
                    what,
                );
            }
            Op::Chown { path, uid, gid } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                let n = self.model.node_mut(id);
                n.uid = uid.unwrap_or(n.uid);
                n.gid = gid.unwrap_or(n.gid);
                self.setattr_checked(
                    id,
                    ino,
                    Ok(()),
                    SetAttr {
                        uid: *uid,
                        gid: *gid,
                        ..SetAttr::default()
                    },
                    what,
                );
            }
            Op::SetXattr {
                path,
                name,
                len,
                seed,
                flags,
            } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if !matches!(self.model.kind(id), Kind::File | Kind::Dir) {
                    return; // the kernel refuses user.* xattrs on anything else
                }
                let v = pseudo_random(*len, *seed);
                let m = self.model.setxattr(id, name, &v, *flags);
                let c = self.fs().setxattr(ino, OsStr::new(name), &v, *flags);
                outcome(what, m, c);
            }
            Op::RemoveXattr { path, name } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if !matches!(self.model.kind(id), Kind::File | Kind::Dir) {
                    return;
                }
                let m = self.model.removexattr(id, name);
                let c = self.fs().removexattr(ino, OsStr::new(name));
                outcome(what, m, c);
            }
            Op::OpenTrunc { path, rdwr } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if self.model.kind(id) == Kind::Fifo {
                    return;
                }
                let acc = if *rdwr { libc::O_RDWR } else { libc::O_WRONLY };
                let m = self.model.open(id, true, true);
                let c = self.fs().open(ino, acc | libc::O_TRUNC);
                if let Some(((), opened)) = outcome(what, m, c) {
                    assert!(opened.upper, "{what}: O_TRUNC opens the data file");
                    assert_eq!(
                        opened.file.metadata().expect("stat").len(),
                        0,
                        "{what}: empty after O_TRUNC"
                    );
                    drop(opened);
                    self.fs().release(ino, true);
                }
            }
            Op::Hold { path, write } => {
                let Some((id, ino)) = self.resolve(path, what) else {
                    return;
                };
                if self.model.kind(id) != Kind::File {
                    return; // directories are opened with opendir; fifos by the kernel
                }
                let m = self.model.open(id, *write, false);
                let flags = if *write { libc::O_RDWR } else { libc::O_RDONLY };
                let c = self.fs().open(ino, flags);
                if let Some(((), opened)) = outcome(what, m, c) {
                    assert_eq!(
                        opened.upper,
                        self.model.node(id).upper,
                        "{what}: the handle's backing file (upper or base)"
                    );
                    self.held.push(Held {
                        id,
                        ino,
                        file: opened.file,
                        upper: opened.upper,
                        write: *write,
                    });
                }
            }
            Op::HeldWrite { k, off, len, seed } => {
                let Some(h) = self.held_at(*k) else { return };
                let h = &self.held[h];
                if !h.write {
                    return;
                }
                let b = pseudo_random(*len, *seed);
                h.file.write_all_at(&b, *off).expect("write");
                let id = h.id;
                if !self.model.alive(id) {
                    tally(what, "on an unlinked inode");
                }
                self.model.write(id, *off, &b);
            }
            Op::HeldTruncate { k, size } => {
                let Some(h) = self.held_at(*k) else { return };
                let (id, ino, write) = (self.held[h].id, self.held[h].ino, self.held[h].write);
                if !self.model.alive(id) {
                    tally(what, "on an unlinked inode");
                }
                if !write {
                    return; // ftruncate needs a writable descriptor
                }
                let m = self.model.truncate(id, *size);
                self.setattr_checked(
                    id,
                    ino,
                    m,
                    SetAttr {
                        size: Some(*size),
                        ..SetAttr::default()
                    },
                    what,
                );
            }
            Op::HeldChmod { k, mode } => {
                let Some(h) = self.held_at(*k) else { return };
                let (id, ino) = (self.held[h].id, self.held[h].ino);
                if !self.model.alive(id) {
                    tally(what, "on an unlinked inode");
                }
                self.model.node_mut(id).mode = mode & 0o7777;
                self.setattr_checked(
                    id,
                    ino,
                    Ok(()),
                    SetAttr {
                        mode: Some(*mode),
                        ..SetAttr::default()
                    },
                    what,
                );
            }
            Op::HeldSetXattr { k, name, len, seed } => {
                let Some(h) = self.held_at(*k) else { return };
                let (id, ino) = (self.held[h].id, self.held[h].ino);
                if !self.model.alive(id) {
                    tally(what, "on an unlinked inode");
                }
                let v = pseudo_random(*len, *seed);
                let m = self.model.setxattr(id, name, &v, 0);
                let c = self.fs().setxattr(ino, OsStr::new(name), &v, 0);
                outcome(what, m, c);
            }
            Op::HeldReopen { k } => {
                let Some(h) = self.held_at(*k) else { return };
                let (id, ino) = (self.held[h].id, self.held[h].ino);
                if !self.model.alive(id) {
                    tally(what, "on an unlinked inode");
                }
                let m = self.model.open(id, true, false);
                let c = self.fs().open(ino, libc::O_RDWR);
                if let Some(((), opened)) = outcome(what, m, c) {
                    assert!(opened.upper, "{what}: a write open gets the data file");
                    self.held.push(Held {
                        id,
                        ino,
                        file: opened.file,
                        upper: true,
                        write: true,
                    });
                }
            }
            Op::Close { k } => {
                let Some(h) = self.held_at(*k) else { return };
                let h = self.held.remove(h);
                drop(h.file);
                self.fs().release(h.ino, h.write);
            }
            Op::Reload { clean } => {
                tally(what, if *clean { "clean" } else { "unclean" });
                self.reload(*clean)
            }
        }
    }

    pub fn held_at(&self, k: usize) -> Option<usize> {
        (!self.held.is_empty()).then(|| k % self.held.len())
    }

    /// The end of mknod/mkdir/symlink/link: one more kernel reference, and the attributes.
    pub fn made(&mut self, what: &str, m: Result<Id, Errno>, c: Result<FileAttr, FsError>) {
        if let Some((id, attr)) = outcome(what, m, c) {
            self.add_ref(attr.ino.0);
            check_attr(&self.model, &mut self.ids, id, &attr, what);
        }
    }

    pub fn reload(&mut self, clean: bool) {
        let fs = self.fs.take().expect("loaded");
        if clean {
            // Unmounting: the kernel releases every handle and forgets every node first.
            for h in self.held.drain(..) {
                drop(h.file);
                fs.release(h.ino, h.write);
            }
            for (ino, n) in std::mem::take(&mut self.refs) {
                fs.forget(ino, n);
            }
            fs.close();
        } else {
            // SIGKILL: nothing more reaches the workspace. Unlinked files still held open leave
            // their data files behind, which the unclean load quarantines.
            let pinned: HashSet<u64> = self
                .refs
                .keys()
                .copied()
                .chain(self.held.iter().map(|h| h.ino))
                .collect();
            self.may_quarantine += self
                .model
                .nodes
                .iter()
                .filter(|(id, n)| {
                    n.upper
                        && !self.model.alive(**id)
                        && self.ids.ino_of.get(id).is_some_and(|i| pinned.contains(i))
                })
                .count();
            self.held.clear();
            self.refs.clear();
        }
        drop(fs);
        self.fs = Some(self.base.load(self.upper.path()));
        self.snap_reloaded = true;
        let q = self.fs().quarantined();
        assert!(
            q <= self.may_quarantine,
            "reload (clean: {clean}): {q} files quarantined, at most {} were unlinked and open",
            self.may_quarantine
        );
    }

    /// Forgets most references, as a kernel shrinking its caches would; what stays referenced
    /// keeps its parent directories referenced (a dentry pins its parent).
    pub fn forget_round(&mut self, seed: u64) {
        let mut r = Rng::new(seed);
        let mut keep: BTreeMap<u64, u64> = BTreeMap::new();
        for (&ino, &n) in &self.refs {
            let k = match r.below(10) {
                0..=5 => 0,
                6..=7 => 1,
                _ => n,
            };
            keep.insert(ino, k);
        }
        let mut stack: Vec<u64> = keep
            .iter()
            .filter(|(_, k)| **k > 0)
            .map(|(i, _)| *i)
            .chain(self.held.iter().map(|h| h.ino))
            .collect();
        while let Some(ino) = stack.pop() {
            for p in self.pins(ino) {
                let k = keep.get_mut(&p).unwrap_or_else(|| {
                    panic!("test harness: the parent {p:#x} of {ino:#x} has no reference")
                });
                if *k == 0 {
                    *k = 1;
                    stack.push(p);
                }
            }
        }
        let fs = self.fs.as_ref().expect("loaded");
        for (ino, k) in keep {
            let n = self.refs[&ino];
            if k < n {
                fs.forget(ino, n - k);
            }
            if k == 0 {
                self.refs.remove(&ino);
            } else {
                self.refs.insert(ino, k);
            }
        }
    }

    /// The directories a referenced inode keeps referenced.
    pub fn pins(&self, ino: u64) -> Vec<u64> {
        let Some(&id) = self.ids.id_of.get(&ino) else {
            return Vec::new();
        };
        let n = self.model.node(id);
        let dirs = if n.dirs.is_empty() {
            vec![n.last_dir]
        } else {
            n.dirs.clone()
        };
        dirs.into_iter()
            .filter(|d| *d != ROOT && *d != id)
            .filter_map(|d| self.ids.ino_of.get(&d).copied())
            .collect()
    }
}
