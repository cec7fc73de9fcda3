//! The checks of the model test: outcomes (success with both results, or the same errno), the
//! attributes the core reports against the model, inode numbers that never change nor move, xattr
//! listings, and after every step the whole tree walked through the core only (`lookup`,
//! `readdir`/readdirplus, `getattr`, `open` + read, `readlink`, xattrs), held handles, unlinked but
//! referenced inodes, `changes()` against the model's diff from the base, `view()` applied to the
//! base tree, the fsmonitor journal, and the data files of the upper layer.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::Mutex;

use fuser::{Errno, FileAttr};
use octofs::fs::{ChangeKind, Changed, FsError, ROOT_INO, WorkspaceFs, XattrReply};
use octofs::git::snapshot::{ViewEdit, ViewSource};

use super::case::Case;
use super::model::{Id, Kind, Leaf, Model, ROOT, from_os, join};

pub fn ename(e: Errno) -> String {
    let c = e.code();
    let name = match c {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::E2BIG => "E2BIG",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EMLINK => "EMLINK",
        libc::ESTALE => "ESTALE",
        _ => "errno",
    };
    format!("{name}({c})")
}

/// Which inode number each model inode has; numbers never change and never move to another inode.
#[derive(Default)]
pub struct Ids {
    pub ino_of: HashMap<Id, u64>,
    pub id_of: HashMap<u64, Id>,
}

impl Ids {
    pub fn observe(&mut self, id: Id, ino: u64, what: &str) {
        match self.ino_of.get(&id) {
            Some(&known) => assert_eq!(
                ino, known,
                "{what}: the inode number changed from {known:#x} to {ino:#x}"
            ),
            None => {
                if let Some(other) = self.id_of.get(&ino) {
                    panic!(
                        "{what}: inode number {ino:#x} is reused: it belonged to another inode \
                         (model ids {other} and {id})"
                    );
                }
                self.ino_of.insert(id, ino);
                self.id_of.insert(ino, id);
            }
        }
    }
}

/// How often each operation ended in each way, over the whole run (printed at the end, so that a
/// change to the generator that stops reaching some case shows).
pub static OUTCOMES: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());

/// Counts one way an operation (the first word of `what`) went.
pub fn tally(what: &str, end: &str) {
    let op = what.split([' ', ':']).next().unwrap_or(what).to_string();
    *OUTCOMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((op, end.to_string()))
        .or_default() += 1;
}

/// Success with both results, or the same errno; anything else fails the test.
pub fn outcome<T, U>(
    what: &str,
    model: Result<T, Errno>,
    core: Result<U, FsError>,
) -> Option<(T, U)> {
    match &model {
        Ok(_) => tally(what, "ok"),
        Err(e) => tally(what, &ename(*e)),
    }
    match (model, core) {
        (Ok(t), Ok(u)) => Some((t, u)),
        (Err(m), Err(c)) => {
            assert!(
                m == c.errno,
                "{what}: the core fails with {} ({c}), the model expects {}",
                ename(c.errno),
                ename(m)
            );
            None
        }
        (Ok(_), Err(c)) => panic!(
            "{what}: the core fails with {} ({c}), the model expects success",
            ename(c.errno)
        ),
        (Err(m), Ok(_)) => panic!("{what}: the core succeeds, the model expects {}", ename(m)),
    }
}

pub fn read_all(f: &File) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match f.read_at(&mut buf, out.len() as u64) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("read: {e}"),
        }
    }
}

pub fn same_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got != want {
        let at = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: content differs: the core has {} bytes, the model {}; first difference at {at}",
            got.len(),
            want.len()
        );
    }
}

/// Compares the attributes the core reports for `id` with the model.
pub fn check_attr(model: &Model, ids: &mut Ids, id: Id, a: &FileAttr, what: &str) {
    let n = model.node(id);
    ids.observe(id, a.ino.0, what);
    assert_eq!(a.kind, n.kind.file_type(), "{what}: kind");
    assert_eq!(
        a.perm as u32, n.mode,
        "{what}: permission bits {:o} (model {:o})",
        a.perm, n.mode
    );
    assert_eq!(a.nlink, model.nlink(id), "{what}: nlink");
    assert_eq!((a.uid, a.gid), (n.uid, n.gid), "{what}: owner");
    if n.kind != Kind::Dir {
        assert_eq!(a.size, n.data.len() as u64, "{what}: size");
    }
}

/// A model's working state as git sees it: files (bytes, executable bit) and symlinks (target).
pub fn git_state(m: &Model) -> BTreeMap<String, (Kind, bool, &[u8])> {
    m.flatten()
        .into_iter()
        .filter(|(_, l)| matches!(l.kind, Kind::File | Kind::Symlink))
        .map(|(p, l)| (p, (l.kind, l.exec, l.data)))
        .collect()
}

/// Removes whatever is at `path` (a leaf, or everything below a directory) and any leaf at a
/// directory above it (it becomes a directory).
pub fn make_room<V>(state: &mut BTreeMap<String, V>, path: &str) {
    state.remove(path);
    let below = format!("{path}/");
    let doomed: Vec<String> = state
        .range(below.clone()..)
        .take_while(|(p, _)| p.starts_with(&below))
        .map(|(p, _)| p.clone())
        .collect();
    for p in doomed {
        state.remove(&p);
    }
    let mut a = path;
    while let Some((up, _)) = a.rsplit_once('/') {
        state.remove(up);
        a = up;
    }
}

pub fn same_attr(what: &str, a: &FileAttr, b: &FileAttr) {
    let key = |x: &FileAttr| (x.ino, x.kind, x.size, x.perm, x.nlink, x.uid, x.gid);
    assert_eq!(key(a), key(b), "{what}: attributes disagree");
}

pub fn check_xattrs(fs: &WorkspaceFs, ino: u64, want: &BTreeMap<String, Vec<u8>>, what: &str) {
    let size = match fs.listxattr(ino, 0) {
        Ok(XattrReply::Size(n)) => n,
        other => panic!("{what}: listxattr(size 0) answers {other:?}"),
    };
    let list = if size == 0 {
        Vec::new()
    } else {
        assert_eq!(
            fs.listxattr(ino, size - 1).map_err(|e| e.errno),
            Err(Errno::ERANGE),
            "{what}: listxattr into a short buffer"
        );
        match fs.listxattr(ino, size) {
            Ok(XattrReply::Data(d)) => d,
            other => panic!("{what}: listxattr answers {other:?}"),
        }
    };
    assert_eq!(list.len(), size as usize, "{what}: listxattr size");
    assert!(
        list.is_empty() || list.ends_with(&[0]),
        "{what}: listxattr names end in NUL"
    );
    let names: BTreeSet<String> = list
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect();
    let want_names: BTreeSet<String> = want.keys().cloned().collect();
    assert_eq!(names, want_names, "{what}: xattr names");
    for (k, v) in want {
        let name = OsStr::new(k);
        assert_eq!(
            fs.getxattr(ino, name, 0).map_err(|e| e.errno),
            Ok(XattrReply::Size(v.len() as u32)),
            "{what}: getxattr {k} size"
        );
        if !v.is_empty() {
            assert_eq!(
                fs.getxattr(ino, name, v.len() as u32).map_err(|e| e.errno),
                Ok(XattrReply::Data(v.clone())),
                "{what}: getxattr {k}"
            );
        }
        if v.len() > 1 {
            assert_eq!(
                fs.getxattr(ino, name, v.len() as u32 - 1)
                    .map_err(|e| e.errno),
                Err(Errno::ERANGE),
                "{what}: getxattr {k} into a short buffer"
            );
        }
    }
    assert_eq!(
        fs.getxattr(ino, OsStr::new("user.absent"), 0)
            .map_err(|e| e.errno),
        Err(Errno::NO_XATTR),
        "{what}: getxattr of a missing name"
    );
}

impl Case<'_> {
    // ----- checks -----

    /// The whole tree through the core only, then held handles, dead-but-referenced inodes and
    /// `changes()`.
    pub fn verify(&mut self) {
        self.walk(ROOT, ROOT_INO, "");
        let fs = self.fs.as_ref().expect("loaded");
        for h in &mut self.held {
            let what = format!("held handle of model id {}", h.id);
            let a = fs
                .getattr(h.ino)
                .unwrap_or_else(|e| panic!("{what}: getattr: {}", e));
            check_attr(&self.model, &mut self.ids, h.id, &a, &what);
            // As the adapter does: a handle opened on the base before a copy-up reads the data file.
            if !h.upper && fs.is_upper(h.ino) {
                h.file = fs.open_data(h.ino).expect("open_data");
                h.upper = true;
            }
            same_bytes(&what, &read_all(&h.file), &self.model.node(h.id).data);
        }
        for &ino in self.refs.keys() {
            let Some(&id) = self.ids.id_of.get(&ino) else {
                continue;
            };
            if !self.model.alive(id) {
                let what = format!("unlinked inode {ino:#x} the kernel still holds");
                let a = fs
                    .getattr(ino)
                    .unwrap_or_else(|e| panic!("{what}: getattr: {}", e));
                check_attr(&self.model, &mut self.ids, id, &a, &what);
            }
        }
        self.check_changes();
    }

    pub fn walk(&mut self, dir: Id, ino: u64, path: &str) {
        let fs = self.fs.as_ref().expect("loaded");
        let shown = if path.is_empty() { "/" } else { path };
        fs.opendir(ino)
            .unwrap_or_else(|e| panic!("opendir {shown}: {}", e));
        let list = fs
            .readdir(ino)
            .unwrap_or_else(|e| panic!("readdir {shown}: {}", e));
        assert!(
            list.len() >= 2 && list[0].name == "." && list[1].name == "..",
            "readdir {shown}: starts with . and .."
        );
        assert_eq!(
            list[0].attr.ino.0, ino,
            "readdir {shown}: . is the directory"
        );
        let parent = self.ids.ino_of[&self.model.parent(dir)];
        assert_eq!(
            list[1].attr.ino.0, parent,
            "readdir {shown}: .. is the parent"
        );
        let names: Vec<String> = list[2..].iter().map(|e| from_os(&e.name)).collect();
        let unique: BTreeSet<&String> = names.iter().collect();
        assert_eq!(
            unique.len(),
            names.len(),
            "readdir {shown}: duplicate names"
        );
        let want: BTreeSet<&String> = self.model.node(dir).children.keys().collect();
        assert_eq!(unique, want, "readdir {shown}: names");
        let mut subdirs = Vec::new();
        for e in &list[2..] {
            let name = from_os(&e.name);
            let name = name.as_str();
            let cpath = join(path, name);
            let id = self.model.node(dir).children[name];
            if self.plus {
                let a = fs
                    .listed(ino, &e.name)
                    .unwrap_or_else(|err| panic!("readdirplus {cpath}: {}", err))
                    .unwrap_or_else(|| panic!("readdirplus {cpath}: the name is gone"));
                same_attr(&format!("{cpath}: readdir vs readdirplus"), &e.attr, &a);
                *self.refs.entry(a.ino.0).or_default() += 1;
            }
            let a = fs
                .lookup(ino, &e.name)
                .unwrap_or_else(|err| panic!("lookup {cpath}: {}", err));
            *self.refs.entry(a.ino.0).or_default() += 1;
            check_attr(&self.model, &mut self.ids, id, &a, &cpath);
            same_attr(&format!("{cpath}: readdir vs lookup"), &e.attr, &a);
            let g = fs
                .getattr(a.ino.0)
                .unwrap_or_else(|err| panic!("getattr {cpath}: {}", err));
            same_attr(&format!("{cpath}: getattr vs lookup"), &g, &a);
            let n = self.model.node(id);
            match n.kind {
                Kind::File => {
                    let mut o = fs
                        .open(a.ino.0, libc::O_RDONLY)
                        .unwrap_or_else(|err| panic!("open {cpath}: {}", err));
                    assert_eq!(o.upper, n.upper, "{cpath}: read from upper or base");
                    let mut v = Vec::new();
                    o.file.read_to_end(&mut v).expect("read");
                    drop(o);
                    fs.release(a.ino.0, false);
                    same_bytes(&cpath, &v, &n.data);
                    assert_eq!(
                        fs.is_upper(a.ino.0),
                        n.upper,
                        "{cpath}: materialized only on write intent"
                    );
                }
                Kind::Symlink => {
                    let t = fs
                        .readlink(a.ino.0)
                        .unwrap_or_else(|err| panic!("readlink {cpath}: {}", err));
                    assert_eq!(
                        String::from_utf8_lossy(&t),
                        String::from_utf8_lossy(&n.data),
                        "{cpath}: symlink target"
                    );
                }
                Kind::Dir | Kind::Fifo => {}
            }
            if matches!(n.kind, Kind::File | Kind::Dir) {
                check_xattrs(fs, a.ino.0, &n.xattrs, &cpath);
            }
            if n.kind == Kind::Dir {
                subdirs.push((id, a.ino.0, cpath));
            }
        }
        for (id, ino, p) in subdirs {
            self.walk(id, ino, &p);
        }
    }

    /// `changes()` against the model's diff from the base, as git sees entries (kind, bytes, target,
    /// executable bit; not other permission bits, owners or xattrs).
    ///
    /// Exact, with two allowances, both following from "found by walking overlays only" (the doc of
    /// `changes` promises no more):
    /// - a path listed as added, deleted or modified stands for its whole subtree (`dir: true`: a
    ///   renamed directory carries its base subtree without an overlay to walk; a file that
    ///   replaced a base directory), so a difference below it need not be listed on its own;
    /// - "modified" may be listed for a path whose bytes happen to equal the base again (a file
    ///   copied up and rewritten, or replaced by an equal one): the catalog knows what was changed,
    ///   not whether the change undid itself.
    ///
    /// Every listed change must be true of its path: added = absent in the base and present now,
    /// deleted = the reverse, modified = present in both; `dir` = a directory is there (in the base
    /// or now), and without `dir` something else is.
    pub fn check_changes(&self) {
        let changes = self
            .fs()
            .changes()
            .unwrap_or_else(|e| panic!("changes: {}", e));
        let now = self.model.flatten();
        // git keeps no fifos and no empty directories: whether changes() names one (a new empty
        // directory as added, a fifo where the base had a file as modified or as deleted) is the
        // core's choice; the diff it must cover is git's.
        let mut holding: BTreeSet<&str> = BTreeSet::new();
        for (p, l) in &now {
            if matches!(l.kind, Kind::File | Kind::Symlink) {
                let mut a = p.as_str();
                while let Some((up, _)) = a.rsplit_once('/') {
                    holding.insert(up);
                    a = up;
                }
            }
        }
        let now_git: BTreeMap<String, Leaf> = now
            .iter()
            .filter(|(p, l)| match l.kind {
                Kind::Fifo => false,
                Kind::Dir => holding.contains(p.as_str()),
                Kind::File | Kind::Symlink => true,
            })
            .map(|(p, l)| (p.clone(), *l))
            .collect();
        let base = &self.base_model.flatten();
        let mut listed: BTreeMap<String, ChangeKind> = BTreeMap::new();
        let mut dirs: BTreeSet<String> = BTreeSet::new();
        for c in &changes {
            assert!(
                listed.insert(c.path.clone(), c.kind).is_none(),
                "changes() lists {} twice",
                c.path
            );
            if c.dir {
                dirs.insert(c.path.clone());
            }
        }
        let state = |l: Option<&Leaf>| match l {
            None => "absent".to_string(),
            Some(l) => format!("{:?}", l.kind),
        };
        for (p, k) in &listed {
            let (b, n) = (base.get(p), now.get(p));
            // `dir`: a directory is there, in the base or now (so what is below may differ too).
            let a_dir = [b, n]
                .iter()
                .any(|l| l.is_some_and(|l| l.kind == Kind::Dir));
            let a_non_dir = [b, n]
                .iter()
                .any(|l| l.is_some_and(|l| l.kind != Kind::Dir));
            assert!(
                if dirs.contains(p) { a_dir } else { a_non_dir },
                "changes() lists {p} with dir: {}, but it is {} in the base and {} now",
                dirs.contains(p),
                state(b),
                state(n)
            );
            let true_of = |n: Option<&Leaf>| match k {
                ChangeKind::Added => b.is_none() && n.is_some(),
                ChangeKind::Deleted => b.is_some() && n.is_none(),
                ChangeKind::Modified => b.is_some() && n.is_some(),
            };
            assert!(
                true_of(n) || true_of(now_git.get(p)),
                "changes() lists {p} as {k:?}, but it is {} in the base and {} now; \
                 changes() = {listed:?}",
                state(b),
                state(n)
            );
        }
        // What must be covered: every file and symlink that git would see differ (a directory
        // comes and goes with what is in it).
        let leaves = |m: &BTreeMap<String, Leaf>| {
            m.iter()
                .filter(|(_, l)| l.kind != Kind::Dir)
                .map(|(p, _)| p.clone())
                .collect::<Vec<_>>()
        };
        let all: BTreeSet<String> = leaves(base).into_iter().chain(leaves(&now_git)).collect();
        for p in &all {
            let want = match (base.get(p), now_git.get(p)) {
                (None, Some(_)) => ChangeKind::Added,
                (Some(_), None) => ChangeKind::Deleted,
                (Some(b), Some(n))
                    if b.kind != n.kind
                        || (n.kind != Kind::Dir && b.data != n.data)
                        || b.exec != n.exec =>
                {
                    ChangeKind::Modified
                }
                _ => continue,
            };
            // Listed at all: its kind was checked above.
            if listed.contains_key(p) {
                continue;
            }
            let mut covered = false;
            let mut a = p.as_str();
            while let Some((up, _)) = a.rsplit_once('/') {
                covered |= listed.contains_key(up);
                a = up;
            }
            assert!(
                covered,
                "changes() misses {p} ({want:?}: {} in the base, {} now); changes() = {listed:?}",
                state(base.get(p)),
                state(now.get(p))
            );
        }
    }

    /// `view()`: its edits, applied to the base tree as the snapshot builder applies them (sorted
    /// by path; a tree, file or symlink replaces whatever is at its path and makes its parents
    /// directories), must give the working state as git sees it: every file with its bytes and
    /// executable bit, every symlink with its target (no directories, no fifos).
    pub fn check_view(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let view = self.fs().view().unwrap_or_else(|e| panic!("view: {}", e));
        assert_eq!(view.base_tree, self.base.tree, "view: the base tree");
        self.last_view = Some((view.generation, view.taken_at));
        let mut edits = view.edits.clone();
        edits.sort_by(|a, b| a.path().cmp(b.path()));
        let base = git_state(&self.base_model);
        let mut state: BTreeMap<String, (Kind, bool, Cow<[u8]>)> = base
            .iter()
            .map(|(p, (k, x, d))| (p.clone(), (*k, *x, Cow::Borrowed(*d))))
            .collect();
        for e in &edits {
            let p = from_os(OsStr::from_bytes(e.path()));
            let what = format!("view edit {e:?}");
            let (kind, exec, source, added) = match e {
                ViewEdit::Remove { .. } => {
                    make_room(&mut state, &p);
                    continue;
                }
                ViewEdit::AddedDir { .. } => continue,
                ViewEdit::Gitlink { .. } => panic!("{what}: there are no gitlinks here"),
                ViewEdit::Tree { id, .. } => {
                    make_room(&mut state, &p);
                    self.expand_tree(&mut state, &p, *id);
                    continue;
                }
                ViewEdit::File {
                    exec,
                    source,
                    added,
                    ..
                } => (Kind::File, *exec, source, *added),
                ViewEdit::Symlink { source, added, .. } => (Kind::Symlink, false, source, *added),
            };
            assert_eq!(
                added,
                !base.contains_key(&p),
                "{what}: `added` says whether the base has a file or symlink there"
            );
            let bytes = match source {
                ViewSource::Object(id) => self.base.store.blob(*id).expect("blob"),
                ViewSource::File(f) => std::fs::read(f).expect("data file"),
                ViewSource::Bytes(b) => b.clone(),
            };
            make_room(&mut state, &p);
            state.insert(p, (kind, exec, Cow::Owned(bytes)));
        }
        let want = git_state(&self.model);
        let got_paths: BTreeSet<&String> = state.keys().collect();
        let want_paths: BTreeSet<&String> = want.keys().collect();
        assert!(
            got_paths == want_paths,
            "view: the snapshot would hold {:?} that the working state has not, and miss {:?}",
            got_paths.difference(&want_paths).collect::<Vec<_>>(),
            want_paths.difference(&got_paths).collect::<Vec<_>>()
        );
        for (p, (kind, exec, data)) in &want {
            let (k, x, d) = &state[p];
            assert_eq!((k, x), (kind, exec), "view: {p}: kind and executable bit");
            same_bytes(&format!("view: {p}"), d, data);
        }
    }

    /// `snapshot_view`: the tree built from the last snapshot's tree with only the paths changed
    /// since must be the tree built from the base with every change (`view()`), and its POSIX
    /// metadata (kept from the last snapshot view and updated) what `view()`'s walk lists, after
    /// every step;
    /// after a reload the core knows no last snapshot and must walk everything. `save`: the core
    /// is told the snapshot was saved (else the next view must still count this one's changes).
    pub fn check_snapshot_since(&mut self, save: bool) {
        use octofs::git::snapshot::build_tree;
        let repo = gix::open(self.base._repo.path()).expect("open the base repository");
        let fs = self.fs.as_ref().expect("loaded");
        let v = fs
            .snapshot_view(self.snap_last)
            .unwrap_or_else(|e| panic!("snapshot_view: {}", e));
        if self.snap_reloaded || self.snap_last.is_none() {
            assert!(
                !v.since_last,
                "snapshot_view: the core was reloaded since the last snapshot it was told of, yet it builds from it"
            );
            assert_eq!(
                v.onto, self.base.tree,
                "snapshot_view: a full view edits the base"
            );
        }
        tally(
            "snapshot_view",
            if v.since_last { "since last" } else { "full" },
        );
        let mut edits = v.edits.clone();
        edits.sort_by(|a, b| a.path().cmp(b.path()));
        let got = build_tree(&repo, v.onto, &edits, None, &self.snap_caches)
            .expect("build the incremental tree");
        let full = fs.view().unwrap_or_else(|e| panic!("view: {}", e));
        // The metadata for the POSIX record, updated from the last snapshot view's with what
        // was noted since, must be what a walk of every node gives.
        assert_eq!(
            v.meta, full.meta,
            "snapshot_view: the POSIX metadata kept since the last snapshot view differs from the full walk's"
        );
        let mut all = full.edits.clone();
        all.sort_by(|a, b| a.path().cmp(b.path()));
        let want = build_tree(&repo, full.base_tree, &all, None, &self.snap_caches)
            .expect("build the full tree");
        assert_eq!(
            got, want,
            "snapshot_view (since last: {}, onto {}): the tree from the edits {:?} differs from the full walk's",
            v.since_last, v.onto, edits
        );
        if save {
            fs.snapshot_saved(v.epoch, got);
            self.snap_last = Some(got);
            self.snap_reloaded = false;
        }
    }

    /// Adds base tree `id` at `path` to `state` (as git would check it out).
    pub fn expand_tree(
        &self,
        state: &mut BTreeMap<String, (Kind, bool, Cow<[u8]>)>,
        path: &str,
        id: gix::ObjectId,
    ) {
        use octofs::git::objects::EntryKind;
        use std::os::unix::ffi::OsStrExt;
        for e in self.base.store.tree(id).expect("tree").iter() {
            let p = join(path, &from_os(OsStr::from_bytes(&e.name)));
            let leaf =
                |k: Kind, x: bool| (k, x, Cow::Owned(self.base.store.blob(e.id).expect("blob")));
            match e.kind {
                EntryKind::Tree => self.expand_tree(state, &p, e.id),
                EntryKind::Blob => {
                    state.insert(p, leaf(Kind::File, false));
                }
                EntryKind::Executable => {
                    state.insert(p, leaf(Kind::File, true));
                }
                EntryKind::Symlink => {
                    state.insert(p, leaf(Kind::Symlink, false));
                }
                EntryKind::Gitlink => panic!("there are no gitlinks here"),
            }
        }
    }

    /// git's fsmonitor: what the journal answers for the token taken before this step must name
    /// every path whose inode, content, kind or executable bit changed (or a directory above it,
    /// as `dir/`), unless it answers "everything" (always safe: after a reload, a hardlink, ...).
    pub fn check_journal(&mut self, before: &BTreeMap<String, (Id, u64, Kind, bool)>) {
        use std::os::unix::ffi::OsStrExt;
        let (next, changed) = self.fs().fsmonitor_query(&self.token);
        self.token = next;
        let Changed::Paths(paths) = changed else {
            return;
        };
        let named: BTreeSet<String> = paths
            .iter()
            .map(|p| from_os(OsStr::from_bytes(p)))
            .collect();
        let after = self.model.signatures();
        let all: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
        for p in all {
            if before.get(p) == after.get(p) {
                continue;
            }
            let mut covered = named.contains(p) || named.contains(&format!("{p}/"));
            let mut a = p.as_str();
            while let Some((up, _)) = a.rsplit_once('/') {
                covered |= named.contains(&format!("{up}/"));
                a = up;
            }
            assert!(
                covered,
                "fsmonitor: {p} changed ({:?} -> {:?}) but the journal names only {named:?}",
                before.get(p),
                after.get(p)
            );
        }
    }

    /// The upper layer holds a data file for exactly the materialized files that are linked, or
    /// unlinked but still referenced by the kernel or an open handle.
    pub fn check_data_files(&self) {
        let mut on_disk = BTreeSet::new();
        for e in std::fs::read_dir(self.upper.path().join("data")).expect("data dir") {
            let name = e.expect("entry").file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            on_disk.insert(u64::from_str_radix(&name, 16).expect("hex data file name"));
        }
        let pinned: HashSet<u64> = self
            .refs
            .keys()
            .copied()
            .chain(self.held.iter().map(|h| h.ino))
            .collect();
        let want: BTreeSet<u64> = self
            .model
            .nodes
            .iter()
            .filter(|(_, n)| n.kind == Kind::File && n.upper)
            .filter_map(|(id, _)| {
                let ino = *self.ids.ino_of.get(id)?;
                (self.model.alive(*id) || pinned.contains(&ino)).then_some(ino)
            })
            .collect();
        let extra: Vec<String> = on_disk
            .difference(&want)
            .map(|i| format!("{i:#x}"))
            .collect();
        let missing: Vec<String> = want
            .difference(&on_disk)
            .map(|i| format!("{i:#x}"))
            .collect();
        assert!(
            extra.is_empty() && missing.is_empty(),
            "upper data files: {extra:?} should not exist, {missing:?} are missing"
        );
    }
}
