//! The POSIX model both the model test and the fault tests hold the filesystem to: an in-memory
//! tree of inodes (kinds, bytes, permission bits, owners, xattrs, hardlinks, names of unlinked
//! inodes still held) that answers every namespace and content operation with success or the exact
//! errno Linux gives, in the order of the kernel's own checks. It knows nothing of octofs: drivers
//! apply the same operation to the model and to the system under test and compare.
//!
//! Paths are relative, `/`-separated, the root is `""`; a model name stands for the bytes the core
//! sees (see [`os`]). Path resolution never follows symlinks.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;

use fuser::{Errno, FileType};
use octofs::fs::Caller;

use super::base::{BaseKind, base_spec};
use crate::common::CORE_OWNER;

/// The owner of the base tree (every base entry and the root).
pub const OWNER: (u32, u32) = CORE_OWNER;
pub const CALLER: Caller = Caller {
    uid: 1000,
    gid: 100,
};

pub type Id = u64;
pub const ROOT: Id = 0;
pub const NAME_MAX: usize = 255;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
}

impl Kind {
    pub fn file_type(self) -> FileType {
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
pub struct Node {
    pub kind: Kind,
    /// File content, or a symlink's target.
    pub data: Vec<u8>,
    /// Permission bits with set-id and sticky (0o7777).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub xattrs: BTreeMap<String, Vec<u8>>,
    pub children: BTreeMap<String, Id>,
    /// The directory of each name (a multiset; one entry for a live directory, none once removed).
    pub dirs: Vec<Id>,
    /// The directory that held the last name removed: a kernel holding the inode keeps that
    /// dentry's parent referenced.
    pub last_dir: Id,
    /// A regular file whose content lives in the upper layer (materialized on write intent only).
    pub upper: bool,
    /// Bumped by every change of the content (for the fsmonitor journal check).
    pub version: u64,
}

/// A path's entry as git sees it (for the diff from the base).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leaf<'a> {
    pub kind: Kind,
    pub data: &'a [u8],
    pub exec: bool,
}

#[derive(Clone)]
pub struct Model {
    pub nodes: HashMap<Id, Node>,
    pub next: Id,
    /// Inode numbers a mount showed for model inodes (the fault tests check they never change).
    pub inos: BTreeMap<Id, u64>,
}

/// A model name as the bytes the core sees: U+FFFD stands for the byte 0xFF.
pub fn os(name: &str) -> std::ffi::OsString {
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
pub fn from_os(name: &OsStr) -> String {
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

pub fn components(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|c| !c.is_empty())
}

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

pub fn split(path: &str) -> (String, String) {
    match path.rsplit_once('/') {
        Some((d, n)) => (d.to_string(), n.to_string()),
        None => (String::new(), path.to_string()),
    }
}

impl Model {
    /// A tree holding only its root directory.
    pub fn with_root(mode: u32, owner: (u32, u32)) -> Model {
        let mut m = Model {
            nodes: HashMap::new(),
            next: 1,
            inos: BTreeMap::new(),
        };
        m.nodes
            .insert(ROOT, Model::new_node(Kind::Dir, mode, owner, Vec::new()));
        m
    }

    /// The base commit's tree (see [`base_spec`]) as a workspace presents it.
    pub fn from_base() -> Model {
        // The workspace's root is its owner's only (the trust model).
        let mut m = Model::with_root(0o700, OWNER);
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

    pub fn new_node(kind: Kind, mode: u32, owner: (u32, u32), data: Vec<u8>) -> Node {
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

    pub fn add(&mut self, dir: Id, name: &str, node: Node) -> Id {
        let id = self.next;
        self.next += 1;
        self.nodes.insert(id, node);
        self.link_name(dir, name, id);
        id
    }

    pub fn node(&self, id: Id) -> &Node {
        &self.nodes[&id]
    }

    pub fn node_mut(&mut self, id: Id) -> &mut Node {
        self.nodes.get_mut(&id).expect("model node")
    }

    pub fn kind(&self, id: Id) -> Kind {
        self.node(id).kind
    }

    pub fn alive(&self, id: Id) -> bool {
        id == ROOT || !self.node(id).dirs.is_empty()
    }

    pub fn nlink(&self, id: Id) -> u32 {
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
    pub fn parent(&self, dir: Id) -> Id {
        self.node(dir).dirs.first().copied().unwrap_or(ROOT)
    }

    pub fn child(&self, dir: Id, name: &str) -> Option<Id> {
        self.node(dir).children.get(name).copied()
    }

    /// Every inode along `path`, the root first (path resolution never follows symlinks here).
    pub fn resolve(&self, path: &str) -> Result<Vec<Id>, Errno> {
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

    pub fn link_name(&mut self, dir: Id, name: &str, id: Id) {
        self.node_mut(dir).children.insert(name.to_string(), id);
        self.node_mut(id).dirs.push(dir);
    }

    pub fn unlink_name(&mut self, dir: Id, name: &str) -> Id {
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
    pub fn is_within(&self, mut d: Id, ancestor: Id) -> bool {
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
    pub fn new_name_ok(&self, dir: Id, name: &str) -> Result<(), Errno> {
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

    pub fn make(
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

    pub fn link(&mut self, src: Id, dir: Id, name: &str) -> Result<(), Errno> {
        // linkat: the new name is looked up (filename_create) before vfs_link refuses a directory.
        self.new_name_ok(dir, name)?;
        if self.kind(src) == Kind::Dir {
            return Err(Errno::EPERM);
        }
        self.link_name(dir, name, src);
        Ok(())
    }

    pub fn existing(&self, dir: Id, name: &str) -> Result<Id, Errno> {
        if self.kind(dir) != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.child(dir, name).ok_or(Errno::ENOENT)
    }

    pub fn unlink(&mut self, dir: Id, name: &str) -> Result<(), Errno> {
        let id = self.existing(dir, name)?;
        if self.kind(id) == Kind::Dir {
            return Err(Errno::EISDIR);
        }
        self.unlink_name(dir, name);
        Ok(())
    }

    pub fn rmdir(&mut self, dir: Id, name: &str) -> Result<(), Errno> {
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
    pub fn rename(
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
    pub fn open(&mut self, id: Id, write: bool, trunc: bool) -> Result<(), Errno> {
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

    pub fn write(&mut self, id: Id, off: u64, data: &[u8]) {
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
    pub fn reinode(&mut self, id: Id) -> Option<Id> {
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

    pub fn truncate(&mut self, id: Id, size: u64) -> Result<(), Errno> {
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

    pub fn setxattr(&mut self, id: Id, name: &str, value: &[u8], flags: i32) -> Result<(), Errno> {
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

    pub fn removexattr(&mut self, id: Id, name: &str) -> Result<(), Errno> {
        self.node_mut(id)
            .xattrs
            .remove(name)
            .map(|_| ())
            .ok_or(Errno::NO_XATTR)
    }

    /// Every live path (not the root) with its inode, in a stable order.
    pub fn entries(&self) -> Vec<(String, Id)> {
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
    pub fn signatures(&self) -> BTreeMap<String, (Id, u64, Kind, bool)> {
        self.entries()
            .into_iter()
            .map(|(p, id)| {
                let n = self.node(id);
                let exec = n.kind == Kind::File && n.mode & 0o100 != 0;
                (p, (id, n.version, n.kind, exec))
            })
            .collect()
    }

    pub fn flatten(&self) -> BTreeMap<String, Leaf<'_>> {
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

// ----- by path: what the fault tests, which drive a mount by path, ask of the model -----

impl Model {
    /// The inode at `path`, if every component exists.
    pub fn lookup(&self, path: &str) -> Option<Id> {
        self.resolve(path)
            .ok()
            .map(|ids| *ids.last().expect("root"))
    }

    /// The inode at `path`, which must exist.
    #[track_caller]
    pub fn at(&self, path: &str) -> Id {
        self.lookup(path)
            .unwrap_or_else(|| panic!("model: {path:?} does not exist"))
    }

    /// The directory a path names its entry in, and the entry's name.
    #[track_caller]
    pub fn entry_of(&self, path: &str) -> (Id, String) {
        let (dir, name) = split(path);
        (self.at(&dir), name)
    }

    /// Every path whose kind `f` accepts, sorted; the root is `""`.
    pub fn paths(&self, f: impl Fn(Kind) -> bool) -> Vec<String> {
        let mut out = Vec::new();
        if f(Kind::Dir) {
            out.push(String::new());
        }
        out.extend(
            self.entries()
                .into_iter()
                .filter(|(_, id)| f(self.kind(*id)))
                .map(|(p, _)| p),
        );
        out
    }

    pub fn files(&self) -> Vec<String> {
        self.paths(|k| k == Kind::File)
    }

    /// Every directory, the root (`""`) included.
    pub fn dirs(&self) -> Vec<String> {
        self.paths(|k| k == Kind::Dir)
    }

    pub fn is_empty_dir(&self, path: &str) -> bool {
        self.node(self.at(path)).children.is_empty()
    }

    /// The inode of the regular file at `path`.
    #[track_caller]
    pub fn file_id(&self, path: &str) -> Id {
        let id = self.at(path);
        assert_eq!(self.kind(id), Kind::File, "model: {path:?} is not a file");
        id
    }

    #[track_caller]
    pub fn content(&self, path: &str) -> &Vec<u8> {
        &self.node(self.file_id(path)).data
    }

    #[track_caller]
    pub fn content_mut(&mut self, path: &str) -> &mut Vec<u8> {
        let id = self.file_id(path);
        &mut self.node_mut(id).data
    }

    /// A new regular file at `path` (which must be a new name in an existing directory).
    #[track_caller]
    pub fn new_file(&mut self, path: &str, content: Vec<u8>, mode: u32) {
        let (dir, name) = self.entry_of(path);
        if let Err(e) = self.make(dir, &name, Kind::File, mode, content) {
            panic!("model: creating {path:?}: {e:?}");
        }
    }

    /// Records the inode number a mount showed for `path`.
    pub fn set_ino(&mut self, path: &str, ino: u64) {
        if let Some(id) = self.lookup(path) {
            self.inos.insert(id, ino);
        }
    }

    /// Inode numbers observed earlier, by current path.
    pub fn known_inos(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if let Some(ino) = self.inos.get(&ROOT) {
            out.insert(String::new(), *ino);
        }
        for (p, id) in self.entries() {
            if let Some(ino) = self.inos.get(&id) {
                out.insert(p, *ino);
            }
        }
        out
    }
}
