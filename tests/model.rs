//! The reference-model test of the filesystem core (no kernel).
//!
//! Generated sequences of operations drive a [`WorkspaceFs`] over a real git base and, side by side,
//! a plain in-memory model of a POSIX tree. For every operation the model predicts success or the
//! exact errno and the core must agree. After every step the whole tree is walked through the core
//! only (`lookup` from the root, `readdir`, `getattr`, `open` + read, `readlink`, xattrs) and compared
//! with the model: names, kinds, permission bits, owners, sizes, bytes, symlink targets, xattrs, link
//! counts, which entries are one inode (hardlinks) and that an inode number never changes (rename,
//! copy-up, reload) nor moves to another file. Files held open (also across unlink) are read through
//! their handles; a file is materialized on write intent only; the upper layer holds exactly the
//! data files of materialized files that are linked or still held. A reload is either clean
//! (`close`) or unclean (drop, as SIGKILL would): the catalog must already hold everything
//! acknowledged.
//!
//! What the rest of octofs reads from the core is checked after every step too: `changes()` against
//! the model's diff from the base; `view()` (the snapshot's edits) applied to the base tree must give
//! the working state as git sees it; the fsmonitor journal must name every path that changed since
//! the token taken before the step; `changed_since` must not say "unchanged" when the state changed.
//!
//! The test plays the kernel: every successful lookup/create/mknod/mkdir/symlink/link (and each
//! readdirplus entry) adds one reference, and after each step most references are forgotten again
//! (exercising node reaping), never a directory's while something below it is still referenced (a
//! dentry pins its parent).
//!
//! Errnos follow Linux (the VFS's checks first, then what the daemon answers; pjdfstest measures the
//! mount against ext4). Some of those checks never reach a daemon behind a kernel (a parent that is
//! not a directory, a directory moved into itself), but the core is a library callable without one
//! and is held to the same answers. Operations a kernel never sends (opening a fifo, user.* xattrs
//! on a symlink, chmod of a symlink) are not generated.
//!
//! Knobs: `OCTOFS_MODEL_CASES` (default 200), `OCTOFS_MODEL_STEPS` (default 60), `OCTOFS_MODEL_SEED`
//! (run one seed only), `OCTOFS_MODEL_THREADS` (default: up to 4), `OCTOFS_MODEL_NO_SHRINK`,
//! `OCTOFS_MODEL_TMP` (where upper layers go; tmpfs by default). A failure names the seed and the
//! step and prints a shrunk sequence of operations that still fails. A passing run prints (see
//! `--nocapture`) how often each operation ended in each way.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fuser::{Errno, FileAttr, FileType};
use octofs::cow::blobcache::BlobCache;
use octofs::cow::catalog::Ts;
use octofs::fs::{
    Caller, ChangeKind, Changed, ROOT_INO, SetAttr, WorkspaceFs, XattrReply, path_ino,
};
use octofs::git::objects::ObjectStore;
use octofs::git::snapshot::{ViewEdit, ViewSource};

mod common;

use common::{CORE_OWNER, DATE1, GitRepo, load_core};

// ----- deterministic randomness -----

/// splitmix64: small, fast, and the same sequence on every platform.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

/// `len` pseudo-random bytes named by `seed` (so an operation prints as two numbers).
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&r.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn ename(e: Errno) -> String {
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

// ----- the base repository -----

const OWNER: (u32, u32) = CORE_OWNER;
const CALLER: Caller = Caller {
    uid: 1000,
    gid: 100,
};

#[derive(Clone, Copy, PartialEq, Eq)]
enum BaseKind {
    File,
    Exec,
    Link,
}

/// The base commit: nested directories, files of several sizes (two above 64 KiB), executables and
/// symlinks (to a file, to a directory, dangling). git cannot hold an empty directory.
fn base_spec() -> Vec<(&'static str, Vec<u8>, BaseKind)> {
    use BaseKind::*;
    vec![
        ("README.md", b"# base\n".to_vec(), File),
        ("empty", Vec::new(), File),
        ("run.sh", b"#!/bin/sh\necho hi\n".to_vec(), Exec),
        ("big.bin", bytes(1, 100_000), File),
        ("link", b"a/one.txt".to_vec(), Link),
        ("dangling", b"nowhere/at/all".to_vec(), Link),
        ("a/one.txt", b"one\n".to_vec(), File),
        ("a/two.txt", bytes(2, 4096), File),
        ("a/up", b"../README.md".to_vec(), Link),
        ("a/b/x.bin", bytes(3, 70_000), File),
        ("a/b/tool", b"#!/bin/sh\n".to_vec(), Exec),
        ("a/b/c/deep.txt", b"deep\n".to_vec(), File),
        ("d/g.txt", b"g\n".to_vec(), File),
        ("d/e/f.txt", b"f\n".to_vec(), File),
        ("d/e/dirlink", b"../../a".to_vec(), Link),
        ("sp ace/naïve café.txt", "ü\n".as_bytes().to_vec(), File),
    ]
}

/// A scratch directory for upper layers and the blob cache: on tmpfs when there is one (a clean
/// stop fsyncs the catalog; the test is about logic, not disks), else in the usual temp dir.
/// `OCTOFS_MODEL_TMP` chooses another place.
fn scratch_dir() -> tempfile::TempDir {
    let place = std::env::var_os("OCTOFS_MODEL_TMP")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let shm = Path::new("/dev/shm");
            shm.is_dir().then(|| shm.to_path_buf())
        });
    match place {
        Some(p) => tempfile::tempdir_in(&p)
            .or_else(|_| tempfile::tempdir())
            .expect("tempdir"),
        None => tempfile::tempdir().expect("tempdir"),
    }
}

/// The base repository, its object store and the host-wide blob cache, shared by every case.
struct Base {
    _repo: tempfile::TempDir,
    cache: tempfile::TempDir,
    store: Arc<ObjectStore>,
    blobs: Arc<BlobCache>,
    tree: gix::ObjectId,
    time: i64,
}

impl Base {
    fn new() -> Base {
        let repo = tempfile::tempdir().expect("tempdir");
        let r = GitRepo::init(repo.path());
        r.git(["config", "core.symlinks", "true"]);
        for (path, data, kind) in base_spec() {
            match kind {
                BaseKind::File => r.write(path, &data),
                BaseKind::Exec => r.write_exec(path, &data),
                BaseKind::Link => r.symlink(path, std::str::from_utf8(&data).expect("utf8")),
            }
        }
        r.commit_all("base", DATE1);
        let cache = scratch_dir();
        let store = Arc::new(ObjectStore::open(&r.path).expect("open store"));
        let head = store.resolve(None).expect("HEAD resolves");
        let blobs = Arc::new(BlobCache::new(&cache.path().join("blobs")).expect("blob cache"));
        Base {
            _repo: repo,
            cache,
            store,
            blobs,
            tree: head.tree,
            time: head.time,
        }
    }

    fn load(&self, upper: &Path) -> WorkspaceFs {
        load_core(
            &self.store,
            &self.blobs,
            self.tree,
            self.time,
            upper,
            self.cache.path(),
        )
    }
}

// ----- the model -----

type Id = u64;
const ROOT: Id = 0;
const NAME_MAX: usize = 255;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
}

impl Kind {
    fn file_type(self) -> FileType {
        match self {
            Kind::File => FileType::RegularFile,
            Kind::Dir => FileType::Directory,
            Kind::Symlink => FileType::Symlink,
            Kind::Fifo => FileType::NamedPipe,
        }
    }
}

/// One inode of the model.
#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    /// File content, or a symlink's target.
    data: Vec<u8>,
    /// Permission bits with set-id and sticky (0o7777).
    mode: u32,
    uid: u32,
    gid: u32,
    xattrs: BTreeMap<String, Vec<u8>>,
    children: BTreeMap<String, Id>,
    /// The directory of each name (a multiset; one entry for a live directory, none once removed).
    dirs: Vec<Id>,
    /// The directory that held the last name removed: a kernel holding the inode keeps that
    /// dentry's parent referenced.
    last_dir: Id,
    /// A regular file whose content lives in the upper layer (materialized on write intent only).
    upper: bool,
    /// Bumped by every change of the content (for the fsmonitor journal check).
    version: u64,
}

/// A path's entry as git sees it (for the diff from the base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Leaf<'a> {
    kind: Kind,
    data: &'a [u8],
    exec: bool,
}

#[derive(Clone)]
struct Model {
    nodes: HashMap<Id, Node>,
    next: Id,
}

/// A model name as the bytes the core sees: U+FFFD stands for the byte 0xFF.
fn os(name: &str) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    let mut out = Vec::new();
    for ch in name.chars() {
        if ch == '\u{FFFD}' {
            out.push(0xff);
        } else {
            let mut buf = [0; 4];
            out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// The model name of a name the core lists (the inverse of [`os`]).
fn from_os(name: &OsStr) -> String {
    use std::os::unix::ffi::OsStrExt;
    let b = name.as_bytes();
    let mut out = String::new();
    for part in b.split(|c| *c == 0xff).enumerate() {
        if part.0 > 0 {
            out.push('\u{FFFD}');
        }
        out.push_str(std::str::from_utf8(part.1).expect("a name is UTF-8 apart from 0xff"));
    }
    out
}

fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty())
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn split(path: &str) -> (String, String) {
    match path.rsplit_once('/') {
        Some((d, n)) => (d.to_string(), n.to_string()),
        None => (String::new(), path.to_string()),
    }
}

impl Model {
    fn from_base() -> Model {
        let mut m = Model {
            nodes: HashMap::new(),
            next: 1,
        };
        m.nodes
            // The workspace's root is its owner's only (the trust model).
            .insert(ROOT, Model::new_node(Kind::Dir, 0o700, OWNER, Vec::new()));
        for (path, data, kind) in base_spec() {
            let mut dir = ROOT;
            let comps: Vec<&str> = components(path).collect();
            for c in &comps[..comps.len() - 1] {
                dir = match m.nodes[&dir].children.get(*c) {
                    Some(&d) => d,
                    None => m.add(dir, c, Model::new_node(Kind::Dir, 0o755, OWNER, Vec::new())),
                };
            }
            let node = match kind {
                BaseKind::File => Model::new_node(Kind::File, 0o644, OWNER, data),
                BaseKind::Exec => Model::new_node(Kind::File, 0o755, OWNER, data),
                BaseKind::Link => Model::new_node(Kind::Symlink, 0o777, OWNER, data),
            };
            m.add(dir, comps[comps.len() - 1], node);
        }
        m
    }

    fn new_node(kind: Kind, mode: u32, owner: (u32, u32), data: Vec<u8>) -> Node {
        Node {
            kind,
            data,
            mode,
            uid: owner.0,
            gid: owner.1,
            xattrs: BTreeMap::new(),
            children: BTreeMap::new(),
            dirs: Vec::new(),
            last_dir: ROOT,
            upper: false,
            version: 0,
        }
    }

    fn add(&mut self, dir: Id, name: &str, node: Node) -> Id {
        let id = self.next;
        self.next += 1;
        self.nodes.insert(id, node);
        self.link_name(dir, name, id);
        id
    }

    fn node(&self, id: Id) -> &Node {
        &self.nodes[&id]
    }

    fn node_mut(&mut self, id: Id) -> &mut Node {
        self.nodes.get_mut(&id).expect("model node")
    }

    fn kind(&self, id: Id) -> Kind {
        self.node(id).kind
    }

    fn alive(&self, id: Id) -> bool {
        id == ROOT || !self.node(id).dirs.is_empty()
    }

    fn nlink(&self, id: Id) -> u32 {
        let n = self.node(id);
        match n.kind {
            Kind::Dir if self.alive(id) => {
                2 + n
                    .children
                    .values()
                    .filter(|c| self.kind(**c) == Kind::Dir)
                    .count() as u32
            }
            Kind::Dir => 0,
            _ => n.dirs.len() as u32,
        }
    }

    /// The parent of a directory (the root is its own).
    fn parent(&self, dir: Id) -> Id {
        self.node(dir).dirs.first().copied().unwrap_or(ROOT)
    }

    fn child(&self, dir: Id, name: &str) -> Option<Id> {
        self.node(dir).children.get(name).copied()
    }

    /// Every inode along `path`, the root first (path resolution never follows symlinks here).
    fn resolve(&self, path: &str) -> Result<Vec<Id>, Errno> {
        let mut out = vec![ROOT];
        for c in components(path) {
            let cur = *out.last().expect("root");
            if self.kind(cur) != Kind::Dir {
                return Err(Errno::ENOTDIR);
            }
            if c.len() > NAME_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
            out.push(self.child(cur, c).ok_or(Errno::ENOENT)?);
        }
        Ok(out)
    }

    fn link_name(&mut self, dir: Id, name: &str, id: Id) {
        self.node_mut(dir).children.insert(name.to_string(), id);
        self.node_mut(id).dirs.push(dir);
    }

    fn unlink_name(&mut self, dir: Id, name: &str) -> Id {
        let id = self
            .node_mut(dir)
            .children
            .remove(name)
            .expect("model name");
        let n = self.node_mut(id);
        let at = n.dirs.iter().position(|d| *d == dir).expect("dir ref");
        n.dirs.remove(at);
        n.last_dir = dir;
        id
    }

    /// Whether directory `d` is `ancestor` or lies below it.
    fn is_within(&self, mut d: Id, ancestor: Id) -> bool {
        loop {
            if d == ancestor {
                return true;
            }
            if d == ROOT {
                return false;
            }
            d = self.parent(d);
        }
    }

    /// The checks every "new name in `dir`" operation makes, in Linux order.
    fn new_name_ok(&self, dir: Id, name: &str) -> Result<(), Errno> {
        if self.kind(dir) != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if !self.alive(dir) {
            return Err(Errno::ENOENT);
        }
        if self.child(dir, name).is_some() {
            return Err(Errno::EEXIST);
        }
        Ok(())
    }

    fn make(
        &mut self,
        dir: Id,
        name: &str,
        kind: Kind,
        perm: u32,
        data: Vec<u8>,
    ) -> Result<Id, Errno> {
        if kind == Kind::Symlink && data.len() >= 4096 {
            return Err(Errno::ENAMETOOLONG);
        }
        self.new_name_ok(dir, name)?;
        let p = self.node(dir);
        let sgid = p.mode & libc::S_ISGID != 0;
        let gid = if sgid { p.gid } else { CALLER.gid };
        let mut mode = perm & 0o7777;
        if kind == Kind::Dir && sgid {
            mode |= libc::S_ISGID;
        }
        let mut node = Model::new_node(kind, mode, (CALLER.uid, gid), data);
        node.upper = kind == Kind::File;
        Ok(self.add(dir, name, node))
    }

    fn link(&mut self, src: Id, dir: Id, name: &str) -> Result<(), Errno> {
        // linkat: the new name is looked up (filename_create) before vfs_link refuses a directory.
        self.new_name_ok(dir, name)?;
        if self.kind(src) == Kind::Dir {
            return Err(Errno::EPERM);
        }
        self.link_name(dir, name, src);
        Ok(())
    }

    fn existing(&self, dir: Id, name: &str) -> Result<Id, Errno> {
        if self.kind(dir) != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.child(dir, name).ok_or(Errno::ENOENT)
    }

    fn unlink(&mut self, dir: Id, name: &str) -> Result<(), Errno> {
        let id = self.existing(dir, name)?;
        if self.kind(id) == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        self.unlink_name(dir, name);
        Ok(())
    }

    fn rmdir(&mut self, dir: Id, name: &str) -> Result<(), Errno> {
        let id = self.existing(dir, name)?;
        if self.kind(id) != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if !self.node(id).children.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        self.unlink_name(dir, name);
        Ok(())
    }

    /// rename(2) in the order of Linux's `do_renameat2` and `vfs_rename`.
    fn rename(
        &mut self,
        p: Id,
        name: &str,
        np: Id,
        newname: &str,
        flags: u32,
    ) -> Result<(), Errno> {
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 || (exchange && noreplace)
        {
            return Err(Errno::EINVAL);
        }
        if self.kind(p) != Kind::Dir || self.kind(np) != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let src = self.existing(p, name)?;
        if newname.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        let dst = self.child(np, newname);
        if noreplace && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        let src_dir = self.kind(src) == Kind::Dir;
        // The source must not be an ancestor of the target ...
        if src_dir && self.is_within(np, src) {
            return Err(Errno::EINVAL);
        }
        // ... nor the target an ancestor of the source.
        if let Some(d) = dst
            && self.kind(d) == Kind::Dir
            && self.is_within(p, d)
        {
            return Err(if exchange {
                Errno::EINVAL
            } else {
                Errno::ENOTEMPTY
            });
        }
        if dst == Some(src) {
            return Ok(()); // two names of one inode: nothing happens
        }
        if exchange {
            let dst = dst.expect("checked");
            self.node_mut(p).children.insert(name.to_string(), dst);
            self.node_mut(np).children.insert(newname.to_string(), src);
            for (id, from, to) in [(src, p, np), (dst, np, p)] {
                let n = self.node_mut(id);
                let at = n.dirs.iter().position(|d| *d == from).expect("dir ref");
                n.dirs[at] = to;
            }
            return Ok(());
        }
        if let Some(d) = dst {
            match (src_dir, self.kind(d) == Kind::Dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.node(d).children.is_empty() => {
                    return Err(Errno::ENOTEMPTY);
                }
                _ => {}
            }
            self.unlink_name(np, newname);
        }
        self.unlink_name(p, name);
        self.link_name(np, newname, src);
        Ok(())
    }

    /// What `open` answers (the core's own choices for a symlink and a fifo, which a kernel never
    /// sends: it follows the link, and serves a fifo itself).
    fn open(&mut self, id: Id, write: bool, trunc: bool) -> Result<(), Errno> {
        match self.kind(id) {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            Kind::Symlink => return Err(Errno::ELOOP),
            Kind::Fifo => return Err(Errno::ENXIO),
        }
        let n = self.node_mut(id);
        if write || trunc {
            n.upper = true;
        }
        if trunc {
            n.data.clear();
            n.version += 1;
        }
        Ok(())
    }

    fn write(&mut self, id: Id, off: u64, data: &[u8]) {
        let n = self.node_mut(id);
        let end = off as usize + data.len();
        if n.data.len() < end {
            n.data.resize(end, 0);
        }
        n.data[off as usize..end].copy_from_slice(data);
        n.upper = true;
        n.version += 1;
    }

    /// `reinode_for_write`: a base file with one name moves that name to a new inode (a copy,
    /// materialized); the old inode is left unlinked. Anything else stays as it is.
    fn reinode(&mut self, id: Id) -> Option<Id> {
        let n = self.node(id);
        if n.kind != Kind::File || n.upper || n.dirs.len() != 1 {
            return None;
        }
        let dir = n.dirs[0];
        let mut copy = n.clone();
        copy.dirs.clear();
        copy.upper = true;
        let name = self
            .node(dir)
            .children
            .iter()
            .find(|(_, c)| **c == id)
            .map(|(name, _)| name.clone())
            .expect("the name");
        self.unlink_name(dir, &name);
        Some(self.add(dir, &name, copy))
    }

    fn truncate(&mut self, id: Id, size: u64) -> Result<(), Errno> {
        match self.kind(id) {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        let n = self.node_mut(id);
        n.data.resize(size as usize, 0);
        n.upper = true;
        n.version += 1;
        Ok(())
    }

    fn setxattr(&mut self, id: Id, name: &str, value: &[u8], flags: i32) -> Result<(), Errno> {
        let n = self.node_mut(id);
        let exists = n.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::NO_XATTR);
        }
        n.xattrs.insert(name.to_string(), value.to_vec());
        Ok(())
    }

    fn removexattr(&mut self, id: Id, name: &str) -> Result<(), Errno> {
        self.node_mut(id)
            .xattrs
            .remove(name)
            .map(|_| ())
            .ok_or(Errno::NO_XATTR)
    }

    /// Every live path (not the root) with its inode, in a stable order.
    fn entries(&self) -> Vec<(String, Id)> {
        let mut out = Vec::new();
        let mut stack = vec![(String::new(), ROOT)];
        while let Some((path, dir)) = stack.pop() {
            for (name, &c) in &self.node(dir).children {
                let p = join(&path, name);
                out.push((p.clone(), c));
                if self.kind(c) == Kind::Dir {
                    stack.push((p, c));
                }
            }
        }
        out.sort();
        out
    }

    /// What git's fsmonitor must hear about when it changes: each path's inode, content version,
    /// kind and executable bit.
    fn signatures(&self) -> BTreeMap<String, (Id, u64, Kind, bool)> {
        self.entries()
            .into_iter()
            .map(|(p, id)| {
                let n = self.node(id);
                let exec = n.kind == Kind::File && n.mode & 0o100 != 0;
                (p, (id, n.version, n.kind, exec))
            })
            .collect()
    }

    fn flatten(&self) -> BTreeMap<String, Leaf<'_>> {
        self.entries()
            .into_iter()
            .map(|(p, id)| {
                let n = self.node(id);
                let leaf = Leaf {
                    kind: n.kind,
                    data: &n.data,
                    exec: n.kind == Kind::File && n.mode & 0o100 != 0,
                };
                (p, leaf)
            })
            .collect()
    }
}

// ----- operations -----

#[derive(Clone, Debug)]
enum Op {
    Create {
        dir: String,
        name: String,
        mode: u32,
        /// Bytes written through the handle `create` returns: (length, seed).
        data: Option<(usize, u64)>,
    },
    Mknod {
        dir: String,
        name: String,
        mode: u32,
    },
    Mkdir {
        dir: String,
        name: String,
        mode: u32,
    },
    Symlink {
        dir: String,
        name: String,
        target: String,
    },
    Link {
        src: String,
        dir: String,
        name: String,
    },
    Unlink {
        dir: String,
        name: String,
    },
    Rmdir {
        dir: String,
        name: String,
    },
    Rename {
        dir: String,
        name: String,
        newdir: String,
        newname: String,
        flags: u32,
    },
    /// Open O_RDWR, write (length, seed) bytes at `off` into the returned file, release.
    Write {
        path: String,
        off: u64,
        len: usize,
        seed: u64,
    },
    /// What the adapter does for a write-open while readers hold the base content through
    /// passthrough: `reinode_for_write` (the name gets a new, copied-up inode; the readers keep the
    /// old one, now unlinked), then open the name again O_RDWR and write.
    ReinodeWrite {
        path: String,
        off: u64,
        len: usize,
        seed: u64,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Chown {
        path: String,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    SetXattr {
        path: String,
        name: String,
        len: usize,
        seed: u64,
        flags: i32,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    /// Open with O_TRUNC (O_RDWR or O_WRONLY) and release.
    OpenTrunc {
        path: String,
        rdwr: bool,
    },
    /// Open and keep the handle (and the kernel's reference) across steps.
    Hold {
        path: String,
        write: bool,
    },
    HeldWrite {
        k: usize,
        off: u64,
        len: usize,
        seed: u64,
    },
    HeldTruncate {
        k: usize,
        size: u64,
    },
    HeldChmod {
        k: usize,
        mode: u32,
    },
    HeldSetXattr {
        k: usize,
        name: String,
        len: usize,
        seed: u64,
    },
    /// Open a held inode once more for writing, without a lookup (as through /proc/self/fd).
    HeldReopen {
        k: usize,
    },
    Close {
        k: usize,
    },
    /// Stop and load again: cleanly (`close`) or as if the daemon was killed.
    Reload {
        clean: bool,
    },
}

/// One step: an operation and the seed of the forgets that follow it (kept with the step so that a
/// shrunk sequence forgets the same way).
#[derive(Clone, Debug)]
struct Step {
    op: Op,
    forget_seed: u64,
}

/// Names for new entries: few, so that they collide. U+FFFD stands for the byte 0xFF (not UTF-8:
/// the catalog must keep such names as bytes); see [`os`].
const NAMES: [&str; 14] = [
    "n0",
    "n1",
    "n2",
    "n3",
    "one.txt",
    "a",
    "b",
    "x",
    "deep.txt",
    "g.txt",
    "naïve café",
    "new\nline \"q\" \\",
    "bad\u{FFFD}name",
    "\u{FFFD}",
];
const XATTRS: [&str; 3] = ["user.a", "user.b", "user.long.attribute.name"];
const FILE_MODES: [u32; 4] = [0o644, 0o600, 0o755, 0o444];
const DIR_MODES: [u32; 4] = [0o755, 0o700, 0o777, 0o1777];
const CHMODS: [u32; 9] = [
    0o644, 0o600, 0o755, 0o700, 0o2755, 0o1777, 0o000, 0o4755, 0o640,
];

/// Picks the next operation from the model's current state.
struct Gen<'a> {
    m: &'a Model,
    r: &'a mut Rng,
    /// Inodes of the handles held open: unlinking or renaming over them is worth trying often.
    held: Vec<Id>,
    all: Vec<(String, Id)>,
}

impl Gen<'_> {
    fn paths_where(&self, f: impl Fn(Kind) -> bool) -> Vec<(String, Id)> {
        self.all
            .iter()
            .filter(|(_, id)| f(self.m.kind(*id)))
            .cloned()
            .collect()
    }

    fn dirs(&self) -> Vec<(String, Id)> {
        let mut d = vec![(String::new(), ROOT)];
        d.extend(self.paths_where(|k| k == Kind::Dir));
        d
    }

    fn path_of(&mut self, v: &[(String, Id)]) -> Option<(String, Id)> {
        (!v.is_empty()).then(|| self.r.pick(v).clone())
    }

    /// A directory mostly; now and then a non-directory (ENOTDIR).
    fn parent(&mut self) -> (String, Id) {
        if self.r.pct(4) {
            let others = self.paths_where(|k| k != Kind::Dir);
            if let Some(p) = self.path_of(&others) {
                return p;
            }
        }
        let dirs = self.dirs();
        self.r.pick(&dirs).clone()
    }

    /// A name for something new: from a small pool (so names collide), rarely 255 or 256 bytes.
    fn new_name(&mut self, dir: Id) -> String {
        if self.m.kind(dir) == Kind::Dir {
            match self.r.below(100) {
                0..=2 => return "l".repeat(NAME_MAX),
                3 => return "l".repeat(NAME_MAX + 1),
                _ => {}
            }
        }
        self.r.pick(&NAMES).to_string()
    }

    /// An existing name in `dir` half of the time, else a pool name.
    fn some_name(&mut self, dir: Id) -> String {
        let names: Vec<&String> = match self.m.kind(dir) {
            Kind::Dir => self.m.node(dir).children.keys().collect(),
            _ => Vec::new(),
        };
        if !names.is_empty() && self.r.pct(50) {
            return self.r.pick(&names).to_string();
        }
        self.r.pick(&NAMES).to_string()
    }

    fn data_len(&mut self) -> usize {
        if self.r.pct(10) {
            60_000 + self.r.below(30_000) as usize
        } else {
            1 + self.r.below(3000) as usize
        }
    }

    fn offset(&mut self, size: u64) -> u64 {
        match self.r.below(10) {
            0..=3 => self.r.below(size + 1),
            4..=6 => size,
            7 => size + 1 + self.r.below(5000),
            _ => self.r.below(150_000),
        }
    }

    fn size(&mut self, size: u64) -> u64 {
        match self.r.below(4) {
            0 => 0,
            1 => self.r.below(size + 1),
            2 => size + 1 + self.r.below(5000),
            _ => self.r.below(150_000),
        }
    }

    fn file_or_any(&mut self) -> Option<(String, Id)> {
        let files = self.paths_where(|k| k == Kind::File);
        if !files.is_empty() && self.r.pct(90) {
            return self.path_of(&files);
        }
        let any = self.paths_where(|k| k != Kind::Fifo);
        self.path_of(&any)
    }

    /// A path of an inode that is held open (and still linked).
    fn held_path(&mut self) -> Option<(String, Id)> {
        let paths: Vec<(String, Id)> = self
            .all
            .iter()
            .filter(|(_, id)| self.held.contains(id))
            .cloned()
            .collect();
        self.path_of(&paths)
    }

    fn op(&mut self, held: usize) -> Op {
        loop {
            if let Some(op) = self.try_op(held) {
                return op;
            }
        }
    }

    fn try_op(&mut self, held: usize) -> Option<Op> {
        let roll = self.r.below(100);
        Some(match roll {
            0..=8 => {
                let (dir, d) = self.parent();
                let data = self.r.pct(50).then(|| (self.data_len(), self.r.next()));
                Op::Create {
                    name: self.new_name(d),
                    dir,
                    mode: *self.r.pick(&FILE_MODES),
                    data,
                }
            }
            9..=10 => {
                let (dir, d) = self.parent();
                Op::Mknod {
                    name: self.new_name(d),
                    dir,
                    mode: *self.r.pick(&[0o644, 0o600]),
                }
            }
            11..=16 => {
                let (dir, d) = self.parent();
                Op::Mkdir {
                    name: self.new_name(d),
                    dir,
                    mode: *self.r.pick(&DIR_MODES),
                }
            }
            17..=19 => {
                let (dir, d) = self.parent();
                let target = if self.r.pct(2) {
                    "t".repeat(4096)
                } else {
                    self.r
                        .pick(&["a/one.txt", "../x", "/abs/path", "nowhere", "n0"])
                        .to_string()
                };
                Op::Symlink {
                    name: self.new_name(d),
                    dir,
                    target,
                }
            }
            20..=25 => {
                let nondirs = self.paths_where(|k| k != Kind::Dir);
                let (src, _) = if nondirs.is_empty() || self.r.pct(8) {
                    let dirs = self.paths_where(|k| k == Kind::Dir);
                    self.path_of(&dirs)?
                } else {
                    self.path_of(&nondirs)?
                };
                let (dir, d) = self.parent();
                Op::Link {
                    src,
                    name: self.some_name(d),
                    dir,
                }
            }
            26..=32 => {
                let (dir, name) = match self.r.below(20) {
                    0..=2 => split(&self.held_path()?.0),
                    3..=14 => split(&self.path_of(&self.paths_where(|k| k != Kind::Dir))?.0),
                    15..=16 => split(&self.path_of(&self.paths_where(|k| k == Kind::Dir))?.0),
                    _ => {
                        let (dir, _) = self.parent();
                        (dir, self.r.pick(&NAMES).to_string())
                    }
                };
                Op::Unlink { dir, name }
            }
            33..=37 => {
                let dirs = self.paths_where(|k| k == Kind::Dir);
                let empty: Vec<(String, Id)> = dirs
                    .iter()
                    .filter(|(_, id)| self.m.node(*id).children.is_empty())
                    .cloned()
                    .collect();
                let (dir, name) = match self.r.below(20) {
                    0..=8 if !empty.is_empty() => split(&self.path_of(&empty)?.0),
                    0..=13 => split(&self.path_of(&dirs)?.0),
                    14..=16 => split(&self.path_of(&self.paths_where(|k| k != Kind::Dir))?.0),
                    _ => {
                        let (dir, _) = self.parent();
                        (dir, self.r.pick(&NAMES).to_string())
                    }
                };
                Op::Rmdir { dir, name }
            }
            38..=52 => self.rename()?,
            53..=61 => {
                let (path, id) = self.file_or_any()?;
                let size = self.m.node(id).data.len() as u64;
                Op::Write {
                    path,
                    off: self.offset(size),
                    len: self.data_len(),
                    seed: self.r.next(),
                }
            }
            62 => {
                let files = self.paths_where(|k| k == Kind::File);
                Op::ReinodeWrite {
                    path: self.path_of(&files)?.0,
                    off: self.r.below(5000),
                    len: self.data_len(),
                    seed: self.r.next(),
                }
            }
            63..=66 => {
                let (path, id) = self.file_or_any()?;
                let size = self.m.node(id).data.len() as u64;
                Op::Truncate {
                    path,
                    size: self.size(size),
                }
            }
            67..=69 => {
                let mut targets = self.dirs();
                targets.extend(self.paths_where(|k| k == Kind::File || k == Kind::Fifo));
                Op::Chmod {
                    path: self.path_of(&targets)?.0,
                    mode: *self.r.pick(&CHMODS),
                }
            }
            70 => {
                let mut targets = self.dirs();
                targets.extend(self.paths_where(|k| k != Kind::Dir));
                let owners = [None, Some(0), Some(1000), Some(4242)];
                Op::Chown {
                    path: self.path_of(&targets)?.0,
                    uid: *self.r.pick(&owners),
                    gid: *self.r.pick(&owners),
                }
            }
            71..=75 => {
                let flags = match self.r.below(20) {
                    0..=13 => 0,
                    14..=16 => libc::XATTR_CREATE,
                    _ => libc::XATTR_REPLACE,
                };
                // XATTR_CREATE mostly on a name that exists (EEXIST), XATTR_REPLACE on one that
                // may not (ENODATA).
                let (path, id) = self.xattr_target(flags == libc::XATTR_CREATE)?;
                let len = if self.r.pct(10) {
                    3000
                } else {
                    self.r.below(40) as usize
                };
                let have: Vec<&String> = self.m.node(id).xattrs.keys().collect();
                let name = if flags == libc::XATTR_CREATE && !have.is_empty() && self.r.pct(60) {
                    self.r.pick(&have).to_string()
                } else {
                    self.r.pick(&XATTRS).to_string()
                };
                Op::SetXattr {
                    path,
                    name,
                    len,
                    seed: self.r.next(),
                    flags,
                }
            }
            76..=77 => {
                let (path, id) = self.xattr_target(true)?;
                let have: Vec<&String> = self.m.node(id).xattrs.keys().collect();
                let name = if !have.is_empty() && self.r.pct(60) {
                    self.r.pick(&have).to_string()
                } else {
                    self.r.pick(&XATTRS).to_string()
                };
                Op::RemoveXattr { path, name }
            }
            78..=79 => {
                let (path, _) = self.file_or_any()?;
                Op::OpenTrunc {
                    path,
                    rdwr: self.r.pct(50),
                }
            }
            80..=84 if held >= 4 => Op::Close {
                k: self.r.below(held as u64) as usize,
            },
            80..=84 => {
                let files = self.paths_where(|k| k == Kind::File);
                Op::Hold {
                    path: self.path_of(&files)?.0,
                    write: self.r.pct(60),
                }
            }
            85..=96 if held > 0 => {
                let k = self.r.below(held as u64) as usize;
                match self.r.below(20) {
                    0..=6 => Op::HeldWrite {
                        k,
                        off: self.r.below(100_000),
                        len: self.data_len(),
                        seed: self.r.next(),
                    },
                    7..=9 => Op::HeldTruncate {
                        k,
                        size: self.size(4096),
                    },
                    10..=11 => Op::HeldChmod {
                        k,
                        mode: *self.r.pick(&CHMODS),
                    },
                    14 if held < 6 => Op::HeldReopen { k },
                    12..=13 => Op::HeldSetXattr {
                        k,
                        name: self.r.pick(&XATTRS).to_string(),
                        len: self.r.below(20) as usize,
                        seed: self.r.next(),
                    },
                    _ => Op::Close { k },
                }
            }
            85..=96 => return None,
            _ => Op::Reload {
                clean: self.r.pct(50),
            },
        })
    }

    /// A file or directory; with `having`, mostly one that has xattrs already.
    fn xattr_target(&mut self, having: bool) -> Option<(String, Id)> {
        let mut targets = self.dirs();
        targets.extend(self.paths_where(|k| k == Kind::File));
        let with: Vec<(String, Id)> = targets
            .iter()
            .filter(|(_, id)| !self.m.node(*id).xattrs.is_empty())
            .cloned()
            .collect();
        if having && !with.is_empty() && self.r.pct(70) {
            return self.path_of(&with);
        }
        self.path_of(&targets)
    }

    fn rename(&mut self) -> Option<Op> {
        let dirs = self.paths_where(|k| k == Kind::Dir);
        let nondirs = self.paths_where(|k| k != Kind::Dir);
        let (dir, name, src) = match self.r.below(20) {
            0..=7 if !dirs.is_empty() => {
                let (p, id) = self.path_of(&dirs)?;
                let (d, n) = split(&p);
                (d, n, Some(id))
            }
            0..=17 => {
                let (p, id) = self.path_of(&nondirs)?;
                let (d, n) = split(&p);
                (d, n, Some(id))
            }
            _ => {
                // Maybe missing (ENOENT).
                let (d, _) = self.parent();
                (d, self.r.pick(&NAMES).to_string(), None)
            }
        };
        let (newdir, nd) = match src {
            // Into its own subtree (EINVAL).
            Some(s) if self.m.kind(s) == Kind::Dir && self.r.pct(20) => {
                let inside: Vec<(String, Id)> = self
                    .dirs()
                    .into_iter()
                    .filter(|(_, d)| self.m.is_within(*d, s))
                    .collect();
                self.path_of(&inside)?
            }
            _ if self.r.pct(30) => {
                let id = self.m.resolve(&dir).ok().and_then(|v| v.last().copied())?;
                (dir.clone(), id)
            }
            _ => self.parent(),
        };
        // Now and then over a file held open (which then lives on unlinked).
        let (newdir, newname) = match self.held_path() {
            Some((p, _)) if self.r.pct(10) => split(&p),
            _ => (newdir, self.some_name(nd)),
        };
        let flags = match self.r.below(100) {
            0..=59 => 0,
            60..=74 => libc::RENAME_NOREPLACE,
            75..=96 => libc::RENAME_EXCHANGE,
            _ => libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
        };
        Some(Op::Rename {
            dir,
            name,
            newdir,
            newname,
            flags,
        })
    }
}

// ----- the system under test, beside the model -----

/// A handle kept open across steps.
struct Held {
    id: Id,
    ino: u64,
    file: File,
    /// The handle is the upper data file (else the base content in the blob cache).
    upper: bool,
    write: bool,
}

/// Which inode number each model inode has; numbers never change and never move to another inode.
#[derive(Default)]
struct Ids {
    ino_of: HashMap<Id, u64>,
    id_of: HashMap<u64, Id>,
}

impl Ids {
    fn observe(&mut self, id: Id, ino: u64, what: &str) {
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
static OUTCOMES: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());

/// Counts one way an operation (the first word of `what`) went.
fn tally(what: &str, end: &str) {
    let op = what.split([' ', ':']).next().unwrap_or(what).to_string();
    *OUTCOMES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((op, end.to_string()))
        .or_default() += 1;
}

/// Success with both results, or the same errno; anything else fails the test.
fn outcome<T, U>(what: &str, model: Result<T, Errno>, core: Result<U, Errno>) -> Option<(T, U)> {
    match &model {
        Ok(_) => tally(what, "ok"),
        Err(e) => tally(what, &ename(*e)),
    }
    match (model, core) {
        (Ok(t), Ok(u)) => Some((t, u)),
        (Err(m), Err(c)) => {
            assert!(
                m == c,
                "{what}: the core fails with {}, the model expects {}",
                ename(c),
                ename(m)
            );
            None
        }
        (Ok(_), Err(c)) => panic!(
            "{what}: the core fails with {}, the model expects success",
            ename(c)
        ),
        (Err(m), Ok(_)) => panic!("{what}: the core succeeds, the model expects {}", ename(m)),
    }
}

fn read_all(f: &File) -> Vec<u8> {
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

fn same_bytes(what: &str, got: &[u8], want: &[u8]) {
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
fn check_attr(model: &Model, ids: &mut Ids, id: Id, a: &FileAttr, what: &str) {
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
fn git_state(m: &Model) -> BTreeMap<String, (Kind, bool, &[u8])> {
    m.flatten()
        .into_iter()
        .filter(|(_, l)| matches!(l.kind, Kind::File | Kind::Symlink))
        .map(|(p, l)| (p, (l.kind, l.exec, l.data)))
        .collect()
}

/// Removes whatever is at `path` (a leaf, or everything below a directory) and any leaf at a
/// directory above it (it becomes a directory).
fn make_room<V>(state: &mut BTreeMap<String, V>, path: &str) {
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

fn same_attr(what: &str, a: &FileAttr, b: &FileAttr) {
    let key = |x: &FileAttr| (x.ino, x.kind, x.size, x.perm, x.nlink, x.uid, x.gid);
    assert_eq!(key(a), key(b), "{what}: attributes disagree");
}

fn check_xattrs(fs: &WorkspaceFs, ino: u64, want: &BTreeMap<String, Vec<u8>>, what: &str) {
    let size = match fs.listxattr(ino, 0) {
        Ok(XattrReply::Size(n)) => n,
        other => panic!("{what}: listxattr(size 0) answers {other:?}"),
    };
    let list = if size == 0 {
        Vec::new()
    } else {
        assert_eq!(
            fs.listxattr(ino, size - 1),
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
            fs.getxattr(ino, name, 0),
            Ok(XattrReply::Size(v.len() as u32)),
            "{what}: getxattr {k} size"
        );
        if !v.is_empty() {
            assert_eq!(
                fs.getxattr(ino, name, v.len() as u32),
                Ok(XattrReply::Data(v.clone())),
                "{what}: getxattr {k}"
            );
        }
        if v.len() > 1 {
            assert_eq!(
                fs.getxattr(ino, name, v.len() as u32 - 1),
                Err(Errno::ERANGE),
                "{what}: getxattr {k} into a short buffer"
            );
        }
    }
    assert_eq!(
        fs.getxattr(ino, OsStr::new("user.absent"), 0),
        Err(Errno::NO_XATTR),
        "{what}: getxattr of a missing name"
    );
}

/// One workspace driven beside its model.
struct Case<'b> {
    base: &'b Base,
    upper: tempfile::TempDir,
    fs: Option<WorkspaceFs>,
    model: Model,
    /// The model as the base commit has it (for the diff of `changes()`).
    base_model: Model,
    ids: Ids,
    /// References the test holds as the kernel would.
    refs: BTreeMap<u64, u64>,
    held: Vec<Held>,
    /// The fsmonitor token of the state before the current step.
    token: String,
    /// The generation and time of the last `view()` (what a snapshot records).
    last_view: Option<(u64, Ts)>,
    /// This step's walk also answers as readdirplus does (`listed`: one more reference).
    plus: bool,
    /// Data files an unclean stop may have quarantined (unlinked files still held open).
    may_quarantine: usize,
}

impl<'b> Case<'b> {
    fn new(base: &'b Base) -> Case<'b> {
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
        }
    }

    fn fs(&self) -> &WorkspaceFs {
        self.fs.as_ref().expect("loaded")
    }

    /// Sends `set` to the core for the inode the model calls `id`, whose own outcome is `model`;
    /// when both succeed, the attributes the core answers must match the model.
    fn setattr_checked(
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

    fn add_ref(&mut self, ino: u64) {
        *self.refs.entry(ino).or_default() += 1;
    }

    /// Resolves `path` through the core's lookups (taking the kernel's references) and the model;
    /// both must find the same inode or fail the same way (then the operation is not sent).
    fn resolve(&mut self, path: &str, what: &str) -> Option<(Id, u64)> {
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

    fn step(&mut self, s: &Step) {
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
        self.forget_round(s.forget_seed);
        self.check_data_files();
    }

    fn apply(&mut self, op: &Op) {
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
                        let b = bytes(*seed, *len);
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
                    let b = bytes(*seed, *len);
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
                    let b = bytes(*seed, *len);
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
                let v = bytes(*seed, *len);
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
                let b = bytes(*seed, *len);
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
                let v = bytes(*seed, *len);
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

    fn held_at(&self, k: usize) -> Option<usize> {
        (!self.held.is_empty()).then(|| k % self.held.len())
    }

    /// The end of mknod/mkdir/symlink/link: one more kernel reference, and the attributes.
    fn made(&mut self, what: &str, m: Result<Id, Errno>, c: Result<FileAttr, Errno>) {
        if let Some((id, attr)) = outcome(what, m, c) {
            self.add_ref(attr.ino.0);
            check_attr(&self.model, &mut self.ids, id, &attr, what);
        }
    }

    fn reload(&mut self, clean: bool) {
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
        let q = self.fs().quarantined();
        assert!(
            q <= self.may_quarantine,
            "reload (clean: {clean}): {q} files quarantined, at most {} were unlinked and open",
            self.may_quarantine
        );
    }

    // ----- checks -----

    /// The whole tree through the core only, then held handles, dead-but-referenced inodes and
    /// `changes()`.
    fn verify(&mut self) {
        self.walk(ROOT, ROOT_INO, "");
        let fs = self.fs.as_ref().expect("loaded");
        for h in &mut self.held {
            let what = format!("held handle of model id {}", h.id);
            let a = fs
                .getattr(h.ino)
                .unwrap_or_else(|e| panic!("{what}: getattr: {}", ename(e)));
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
                    .unwrap_or_else(|e| panic!("{what}: getattr: {}", ename(e)));
                check_attr(&self.model, &mut self.ids, id, &a, &what);
            }
        }
        self.check_changes();
    }

    fn walk(&mut self, dir: Id, ino: u64, path: &str) {
        let fs = self.fs.as_ref().expect("loaded");
        let shown = if path.is_empty() { "/" } else { path };
        fs.opendir(ino)
            .unwrap_or_else(|e| panic!("opendir {shown}: {}", ename(e)));
        let list = fs
            .readdir(ino)
            .unwrap_or_else(|e| panic!("readdir {shown}: {}", ename(e)));
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
                    .unwrap_or_else(|err| panic!("readdirplus {cpath}: {}", ename(err)))
                    .unwrap_or_else(|| panic!("readdirplus {cpath}: the name is gone"));
                same_attr(&format!("{cpath}: readdir vs readdirplus"), &e.attr, &a);
                *self.refs.entry(a.ino.0).or_default() += 1;
            }
            let a = fs
                .lookup(ino, &e.name)
                .unwrap_or_else(|err| panic!("lookup {cpath}: {}", ename(err)));
            *self.refs.entry(a.ino.0).or_default() += 1;
            check_attr(&self.model, &mut self.ids, id, &a, &cpath);
            same_attr(&format!("{cpath}: readdir vs lookup"), &e.attr, &a);
            let g = fs
                .getattr(a.ino.0)
                .unwrap_or_else(|err| panic!("getattr {cpath}: {}", ename(err)));
            same_attr(&format!("{cpath}: getattr vs lookup"), &g, &a);
            let n = self.model.node(id);
            match n.kind {
                Kind::File => {
                    let mut o = fs
                        .open(a.ino.0, libc::O_RDONLY)
                        .unwrap_or_else(|err| panic!("open {cpath}: {}", ename(err)));
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
                        .unwrap_or_else(|err| panic!("readlink {cpath}: {}", ename(err)));
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
    fn check_changes(&self) {
        let changes = self
            .fs()
            .changes()
            .unwrap_or_else(|e| panic!("changes: {}", ename(e)));
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
    fn check_view(&mut self) {
        use std::os::unix::ffi::OsStrExt;
        let view = self
            .fs()
            .view()
            .unwrap_or_else(|e| panic!("view: {}", ename(e)));
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

    /// Adds base tree `id` at `path` to `state` (as git would check it out).
    fn expand_tree(
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
    fn check_journal(&mut self, before: &BTreeMap<String, (Id, u64, Kind, bool)>) {
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

    /// Forgets most references, as a kernel shrinking its caches would; what stays referenced
    /// keeps its parent directories referenced (a dentry pins its parent).
    fn forget_round(&mut self, seed: u64) {
        let mut r = Rng(seed);
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
    fn pins(&self, ino: u64) -> Vec<u64> {
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

    /// The upper layer holds a data file for exactly the materialized files that are linked, or
    /// unlinked but still referenced by the kernel or an open handle.
    fn check_data_files(&self) {
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

// ----- running, reporting and shrinking -----

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        }
        Err(_) => default,
    }
}

/// Generates and runs one sequence, recording each step in `log` before it runs.
fn run_generated(base: &Base, seed: u64, steps: usize, log: &mut Vec<Step>) {
    let mut r = Rng(seed);
    let mut case = Case::new(base);
    case.verify();
    for _ in 0..steps {
        let op = Gen {
            all: case.model.entries(),
            m: &case.model,
            r: &mut r,
            held: case.held.iter().map(|h| h.id).collect(),
        }
        .op(case.held.len());
        let step = Step {
            op,
            forget_seed: r.next(),
        };
        log.push(step.clone());
        case.step(&step);
    }
    // One last unclean and clean reload: everything acknowledged is in the catalog.
    for clean in [false, true] {
        let step = Step {
            op: Op::Reload { clean },
            forget_seed: r.next(),
        };
        log.push(step.clone());
        case.step(&step);
    }
}

fn replay(base: &Base, steps: &[Step]) {
    let mut case = Case::new(base);
    case.verify();
    for s in steps {
        case.step(s);
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "(non-string panic)".to_string()
    }
}

fn replay_fails(base: &Base, steps: &[Step]) -> Option<String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay(base, steps)))
        .err()
        .map(|p| panic_message(&*p))
}

/// Removes steps while the sequence still fails (delta debugging, chunks halving down to one).
fn shrink(base: &Base, mut steps: Vec<Step>) -> Vec<Step> {
    let mut chunk = steps.len().div_ceil(2).max(1);
    loop {
        let mut removed = false;
        let mut i = 0;
        while i < steps.len() {
            let mut cand = steps.clone();
            cand.drain(i..(i + chunk).min(steps.len()));
            if replay_fails(base, &cand).is_some() {
                steps = cand;
                removed = true;
            } else {
                i += chunk;
            }
        }
        if chunk == 1 && !removed {
            return steps;
        }
        chunk = (chunk / 2).max(1);
    }
}

struct Failure {
    seed: u64,
    steps: Vec<Step>,
    message: String,
}

fn report(base: &Base, f: Failure) -> String {
    let at = f.steps.len();
    let last = f
        .steps
        .last()
        .map(|s| format!("{:?}", s.op))
        .unwrap_or_else(|| "(the base, before any step)".to_string());
    let mut out = format!(
        "model test failed: seed {:#x}, step {at} ({last}):\n  {}\nreproduce with \
         OCTOFS_MODEL_SEED={:#x} cargo test --test model\n",
        f.seed, f.message, f.seed
    );
    if std::env::var_os("OCTOFS_MODEL_NO_SHRINK").is_none() {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        // A failure that depends on timing (file timestamps against the clock) may not come back
        // on a replay: then there is nothing to shrink.
        let small = replay_fails(base, &f.steps).map(|_| shrink(base, f.steps.clone()));
        let message = small.as_ref().and_then(|s| replay_fails(base, s));
        std::panic::set_hook(hook);
        match (small, message) {
            (Some(small), Some(message)) => {
                out.push_str(&format!(
                    "shrunk to {} steps (forget seeds kept per step):\n",
                    small.len()
                ));
                for s in &small {
                    out.push_str(&format!("  {s:?}\n"));
                }
                out.push_str(&format!("which fails with: {message}\n"));
            }
            _ => out.push_str(
                "the failure did not come back on a replay (it depends on timing), so it was \
                 not shrunk\n",
            ),
        }
    }
    out
}

#[test]
fn the_core_behaves_like_the_model() {
    let started = Instant::now();
    let base = Base::new();
    let cases = env_num("OCTOFS_MODEL_CASES", 200);
    let steps = env_num("OCTOFS_MODEL_STEPS", 60) as usize;
    let seeds: Vec<u64> = match std::env::var("OCTOFS_MODEL_SEED") {
        Ok(_) => vec![env_num("OCTOFS_MODEL_SEED", 0)],
        Err(_) => (0..cases).map(|i| 0x0c70_f500_0000 + i).collect(),
    };
    let threads = env_num(
        "OCTOFS_MODEL_THREADS",
        std::thread::available_parallelism().map_or(2, |n| n.get().min(4)) as u64,
    )
    .max(1) as usize;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let mut log = Vec::new();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_generated(&base, seed, steps, &mut log)
                    }));
                    if let Err(p) = r {
                        stop.store(true, Ordering::Relaxed);
                        failures.lock().unwrap().push(Failure {
                            seed,
                            steps: log,
                            message: panic_message(&*p),
                        });
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.seed);
    if let Some(f) = failures.into_iter().next() {
        panic!("{}", report(&base, f));
    }
    let outcomes = OUTCOMES.lock().unwrap_or_else(|p| p.into_inner());
    let mut by_op: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ((op, end), n) in outcomes.iter() {
        by_op.entry(op).or_default().push(format!("{end} {n}"));
    }
    for (op, ends) in by_op {
        eprintln!("  {op}: {}", ends.join(", "));
    }
    eprintln!(
        "model test: {} sequences of {steps} steps in {:.1?}",
        seeds.len(),
        started.elapsed()
    );
}
