//! The virtual objects tree (`.git/octofs/objects`, [`MirrorObjects`]) as the adapter routes to it:
//! which inodes and names are its (its top is a name in the workspace's own `.git`, asked of the
//! core each time), its answers with their TTLs and FOPEN flags (its own, `objects::ttls`: no file
//! name and no attributes but those of `.git/octofs` may be cached, a directory's name for a
//! second, its object files' pages may), and its listings. Every change in it is refused with
//! `EROFS` by the adapter; nothing here touches the workspace.

use std::ffi::OsStr;
use std::sync::Arc;

use fuser::{BackingId, FileAttr, FopenFlags, INodeNo};

use crate::fs::caching::{Entry, Opening, negative_attr};
use crate::fs::objects::{self, MirrorObjects};
use crate::fs::{FsError, ROOT_INO, WorkspaceFs};

/// The objects tree of one mount, when the daemon gave one.
pub struct Virt {
    core: Arc<WorkspaceFs>,
    objects: Option<Arc<MirrorObjects>>,
}

/// An answer of the tree, kept as [`objects::ttls`] says: a directory's name for a second, a
/// file's not at all, attributes not at all but those of `.git/octofs`.
fn entry(attr: FileAttr) -> Entry {
    let (attr_ttl, entry_ttl) = objects::ttls(&attr);
    Entry {
        attr,
        attr_ttl,
        entry_ttl,
    }
}

/// One entry of a virtual directory's listing: its attributes with what counting a reference
/// needs (`.` and `..` have none).
type Listed<'a> = (FileAttr, std::path::PathBuf, &'a std::fs::Metadata);

impl Virt {
    pub fn new(core: Arc<WorkspaceFs>, objects: Option<Arc<MirrorObjects>>) -> Self {
        Virt { core, objects }
    }

    /// The objects tree, when `i` is one of its inodes.
    pub fn of(&self, i: u64) -> Option<&MirrorObjects> {
        self.objects.as_deref().filter(|_| objects::is_virtual(i))
    }

    /// The objects tree, when `name` in `parent` is the virtual `.git/octofs`: `parent` is the
    /// workspace's own `.git` (asked of the core each time: `.git` may be replaced by another
    /// directory).
    pub fn top(&self, parent: u64, name: &OsStr) -> Option<&MirrorObjects> {
        let v = self.objects.as_deref()?;
        let is_top = name == objects::NAME
            && self
                .core
                .attr_at(&[b".git"])
                .ok()
                .flatten()
                .is_some_and(|a| a.ino.0 == parent && a.kind == fuser::FileType::Directory);
        is_top.then_some(v)
    }

    /// Whether a change to `name` in `parent` (or to inode `parent` itself) touches the read-only
    /// objects tree.
    pub fn read_only(&self, parent: u64, name: Option<&OsStr>) -> bool {
        self.of(parent).is_some() || name.is_some_and(|n| self.top(parent, n).is_some())
    }

    /// LOOKUP in the tree (`parent` one of its inodes) or of its top. No negative entry: a pack
    /// the mirror gains must be found at once.
    pub fn lookup(
        v: &MirrorObjects,
        uid: u32,
        parent: Option<u64>,
        name: &OsStr,
    ) -> Result<Entry, FsError> {
        match parent {
            Some(p) => v.lookup(uid, p, name).map(entry),
            None => v.lookup_top(uid).map(entry),
        }
    }

    pub fn getattr(v: &MirrorObjects, uid: u32, i: u64) -> Result<Entry, FsError> {
        v.getattr(uid, i).map(entry)
    }

    /// OPEN: the mirror's object files never change under one inode (git writes new ones and
    /// renames), so the kernel may keep their pages across opens.
    pub fn open(
        v: &MirrorObjects,
        uid: u32,
        i: u64,
        flags: i32,
    ) -> Result<Opening<BackingId>, FsError> {
        let (fh, _) = v.open(uid, i, flags)?;
        Ok(Opening {
            fh,
            flags: FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            backing: None,
        })
    }

    /// ACCESS: no writing; the rest as the caller may see the inode.
    pub fn access(v: &MirrorObjects, uid: u32, i: u64, mask: i32) -> Result<(), FsError> {
        if mask & libc::W_OK != 0 {
            return Err(fuser::Errno::EROFS.into());
        }
        v.getattr(uid, i).map(|_| ())
    }

    /// Lists virtual directory `i` from `offset` (`.`, `..`, then its entries by name), handing
    /// each to `add` until it answers false (the reply is full).
    fn listing(
        &self,
        v: &MirrorObjects,
        uid: u32,
        i: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, fuser::FileType, &OsStr, Option<Listed<'_>>) -> bool,
    ) -> Result<(), FsError> {
        let entries = v.list(uid, i)?;
        let git = self.core.attr_at(&[b".git"])?.map_or(ROOT_INO, |a| a.ino.0);
        let dir = fuser::FileType::Directory;
        let dots = [(".", i), ("..", v.parent_of(i, git))];
        for (n, (name, d)) in dots.iter().enumerate() {
            let off = n as u64 + 1;
            if off > offset && !add(off, *d, dir, OsStr::new(name), None) {
                return Ok(());
            }
        }
        for (n, (name, attr, rel, md)) in entries.into_iter().enumerate() {
            let off = n as u64 + 3;
            if off > offset && !add(off, attr.ino.0, attr.kind, &name, Some((attr, rel, &md))) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// READDIR of virtual directory `i`: `add(offset, inode, kind, name)` until it answers that
    /// the reply is full.
    pub fn readdir(
        &self,
        v: &MirrorObjects,
        uid: u32,
        i: u64,
        offset: u64,
        mut add: impl FnMut(u64, u64, fuser::FileType, &OsStr) -> bool,
    ) -> Result<(), FsError> {
        self.listing(v, uid, i, offset, |off, ino, kind, name, _| {
            !add(off, ino, kind, name)
        })
    }

    /// READDIRPLUS of virtual directory `i`: `add(offset, name, entry)` until it answers that the
    /// reply is full; every entry but `.` and `..` counted as a reference when it is sent.
    pub fn readdirplus(
        &self,
        v: &MirrorObjects,
        uid: u32,
        i: u64,
        offset: u64,
        mut add: impl FnMut(u64, &OsStr, &Entry) -> bool,
    ) -> Result<(), FsError> {
        self.listing(v, uid, i, offset, |off, ino, kind, name, listed| {
            let counted = listed.is_some();
            let attr = match listed {
                Some((a, rel, md)) => FileAttr {
                    ino: INodeNo(v.count(rel, md)),
                    ..a
                },
                None => FileAttr {
                    ino: INodeNo(ino),
                    kind,
                    ..negative_attr()
                },
            };
            let full = add(off, name, &entry(attr));
            if full && counted {
                v.forget(attr.ino.0, 1);
            }
            !full
        })
    }
}
