//! The raw tree editor: directories of a base tree edited as tree bytes, and the names an edit adds
//! checked as git checks them.
//!
//! Owns the rules of an edit (gix's tree editor's: puts make the directories above, removals go
//! down only through trees, empty directories vanish) and the splicing of raw entries in git's
//! order. Must not read files on disk or move a ref; the trees it writes go into the snapshot's batch.

use super::caches::WrittenTrees;
use super::err;
use crate::git::error::Error;
use crate::git::objects::git_order;
use crate::git::pack::ObjectBatch;

use gix::ObjectId;
use gix::bstr::{BStr, ByteSlice};
use gix::objs::tree::EntryKind;

/// What the edits leave at one name of a directory.
enum Slot {
    /// Nothing (whatever the directory had there is gone).
    Removed,
    /// This entry, whatever the directory had there.
    Leaf(EntryKind, ObjectId),
    /// A directory edited below.
    Dir(DirEdit),
}

/// The edits of one directory: its entries as they start, then what changed at each name.
pub(super) struct DirEdit {
    base: DirBase,
    /// An edit put something below: the directory exists (made empty when the name held no tree).
    /// Without it only removals were made below, which leave a name that holds no tree alone.
    forced: bool,
    names: std::collections::BTreeMap<Vec<u8>, Slot>,
}

/// The entries an edited directory starts from.
enum DirBase {
    /// What its parent's entries hold at its name, if that is a tree.
    Inherit,
    Tree(ObjectId),
    Empty,
}

impl DirEdit {
    /// The root directory of an edit of tree `base`.
    pub(super) fn root(base: ObjectId) -> DirEdit {
        DirEdit {
            base: DirBase::Tree(base),
            forced: true,
            names: std::collections::BTreeMap::new(),
        }
    }

    /// Applies one edit (`None`: remove) at `path`, after every earlier one, with the rules of
    /// gix's tree editor: putting an entry makes the directories above it (a non-tree on the way
    /// is replaced); removing goes down only through trees and is nothing when the path is absent.
    pub(super) fn apply(
        &mut self,
        path: &BStr,
        op: Option<(EntryKind, ObjectId)>,
    ) -> Result<(), Error> {
        let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        if comps.iter().any(|c| c.is_empty()) {
            return Err(Error::Invalid(format!(
                "cannot edit {path}: an empty path component"
            )));
        }
        let put = op.is_some();
        if put && comps.iter().any(|c| c.contains(&0)) {
            return Err(Error::Invalid(format!(
                "cannot write {path:?} into a tree: a name holds a NUL byte"
            )));
        }
        let Some((leaf, dirs)) = comps.split_last() else {
            return Ok(());
        };
        let mut cur = self;
        for c in dirs {
            let slot = cur.names.entry(c.to_vec()).or_insert(Slot::Dir(DirEdit {
                base: DirBase::Inherit,
                forced: false,
                names: std::collections::BTreeMap::new(),
            }));
            let base = match slot {
                Slot::Dir(d) => {
                    d.forced |= put;
                    None
                }
                Slot::Leaf(EntryKind::Tree, id) => Some(DirBase::Tree(*id)),
                Slot::Removed | Slot::Leaf(..) if !put => return Ok(()),
                Slot::Removed | Slot::Leaf(..) => Some(DirBase::Empty),
            };
            if let Some(base) = base {
                *slot = Slot::Dir(DirEdit {
                    base,
                    forced: true,
                    names: std::collections::BTreeMap::new(),
                });
            }
            cur = match slot {
                Slot::Dir(d) => d,
                _ => return Ok(()),
            };
        }
        let new = match op {
            Some((kind, id)) => Slot::Leaf(kind, id),
            None => Slot::Removed,
        };
        cur.names.insert(leaf.to_vec(), new);
        Ok(())
    }
}

/// Writes edited directories as raw tree bytes: each edited directory's entries are those of its
/// base tree's bytes, copied as they are, with the edited names spliced in git's order; nothing
/// is decoded into owned entries or encoded again.
pub(super) struct RawEditor<'r, 'b> {
    repo: &'r gix::Repository,
    hash_len: usize,
    /// Where the trees written go (with the blobs).
    batch: &'b std::cell::RefCell<ObjectBatch<'r>>,
    /// Trees written recently (read from here first, and kept here once written).
    kept: &'b WrittenTrees,
}

/// One entry of a tree's bytes: where it starts, where its name is, whether it is a tree.
struct RawEntry {
    start: usize,
    name: std::ops::Range<usize>,
    tree: bool,
}

impl<'r, 'b> RawEditor<'r, 'b> {
    /// An editor writing into `batch` and keeping what it writes in `kept`, reading the trees of
    /// `repo` (from `kept` when it has them).
    pub(super) fn new(
        repo: &'r gix::Repository,
        batch: &'b std::cell::RefCell<ObjectBatch<'r>>,
        kept: &'b WrittenTrees,
    ) -> RawEditor<'r, 'b> {
        RawEditor {
            repo,
            hash_len: repo.object_hash().len_in_bytes(),
            batch,
            kept,
        }
    }

    /// The bytes of tree `id`: kept in [`WrittenTrees`], else read from the mirror.
    fn read(&self, id: ObjectId) -> Result<std::sync::Arc<[u8]>, Error> {
        if let Some(raw) = self.kept.get(&id) {
            return Ok(raw);
        }
        if id.is_empty_tree() {
            return Ok(std::sync::Arc::from(&[][..]));
        }
        let mut buf = Vec::new();
        let data = gix::objs::Find::try_find(&self.repo.objects, &id, &mut buf)
            .map_err(|e| Error::Invalid(format!("cannot edit tree {id}: {e}")))?
            .ok_or_else(|| Error::Invalid(format!("cannot edit tree {id}: not in the mirror")))?;
        if data.kind != gix::objs::Kind::Tree {
            return Err(Error::Invalid(format!(
                "cannot edit tree {id}: it is a {}",
                data.kind
            )));
        }
        Ok(std::sync::Arc::from(data.data))
    }

    /// The entries of a tree's bytes, and whether they are in git's order.
    fn parse(&self, raw: &[u8], id: ObjectId) -> Result<(Vec<RawEntry>, bool), Error> {
        let bad = || Error::Invalid(format!("cannot edit tree {id}: it is malformed"));
        let mut out: Vec<RawEntry> = Vec::new();
        let mut sorted = true;
        let mut at = 0;
        while at < raw.len() {
            let sp = at + raw[at..].iter().position(|b| *b == b' ').ok_or_else(bad)?;
            let nul = sp + raw[sp..].iter().position(|b| *b == 0).ok_or_else(bad)?;
            let end = nul + 1 + self.hash_len;
            if end > raw.len() {
                return Err(bad());
            }
            let tree = gix::objs::tree::EntryMode::from_bytes(&raw[at..sp])
                .ok_or_else(bad)?
                .is_tree();
            let e = RawEntry {
                start: at,
                name: sp + 1..nul,
                tree,
            };
            if let Some(p) = out.last() {
                sorted &= git_order(&raw[p.name.clone()], p.tree, &raw[e.name.clone()], e.tree)
                    == std::cmp::Ordering::Less;
            }
            out.push(e);
            at = end;
        }
        Ok((out, sorted))
    }

    /// Writes the edited directory `d` whose base tree is `base` (`None`: empty) and the edited
    /// directories below it; `None` when it ends empty (git keeps no empty tree: its parent
    /// drops it, as gix's editor does).
    pub(super) fn write_dir(
        &self,
        base: Option<ObjectId>,
        d: &DirEdit,
    ) -> Result<Option<ObjectId>, Error> {
        let raw = match base {
            Some(id) => self.read(id)?,
            None => std::sync::Arc::from(&[][..]),
        };
        let (entries, sorted) = match base {
            Some(id) => self.parse(&raw, id)?,
            None => (Vec::new(), true),
        };
        let name_of = |e: &RawEntry| &raw[e.name.clone()];
        let find = |name: &[u8]| -> Option<usize> {
            if sorted {
                [false, true].into_iter().find_map(|as_tree| {
                    entries
                        .binary_search_by(|e| git_order(name_of(e), e.tree, name, as_tree))
                        .ok()
                })
            } else {
                entries.iter().position(|e| name_of(e) == name)
            }
        };
        let id_of = |e: &RawEntry| {
            let at = e.name.end + 1;
            gix::oid::try_from_bytes(&raw[at..at + self.hash_len])
                .map(ToOwned::to_owned)
                .map_err(|e| Error::Invalid(format!("a malformed tree entry: {e}")))
        };
        let mut skip = vec![false; entries.len()];
        let mut put: Vec<(&[u8], EntryKind, ObjectId)> = Vec::new();
        for (name, slot) in &d.names {
            let found = find(name);
            match slot {
                Slot::Removed => {}
                Slot::Leaf(kind, id) => put.push((name.as_slice(), *kind, *id)),
                Slot::Dir(sub) => {
                    let sub_base = match (&sub.base, found.map(|i| &entries[i])) {
                        (DirBase::Tree(id), _) => Some(*id),
                        (DirBase::Empty, _) => None,
                        (DirBase::Inherit, Some(e)) if e.tree => Some(id_of(e)?),
                        (DirBase::Inherit, _) if sub.forced => None,
                        // Only removals below a name that holds no tree: nothing changes.
                        (DirBase::Inherit, _) => continue,
                    };
                    if let Some(id) = self.write_dir(sub_base, sub)? {
                        put.push((name.as_slice(), EntryKind::Tree, id));
                    }
                }
            }
            if let Some(i) = found {
                skip[i] = true;
            }
        }
        put.sort_by(|a, b| git_order(a.0, a.1 == EntryKind::Tree, b.0, b.1 == EntryKind::Tree));
        let mut out = Vec::with_capacity(raw.len() + put.len() * (self.hash_len + 32));
        let mut next = put.into_iter().peekable();
        let emit = |out: &mut Vec<u8>, (name, kind, id): (&[u8], EntryKind, ObjectId)| {
            out.extend_from_slice(kind.as_octal_str());
            out.push(b' ');
            out.extend_from_slice(name);
            out.push(0);
            out.extend_from_slice(id.as_bytes());
        };
        for (i, e) in entries.iter().enumerate() {
            if skip[i] {
                continue;
            }
            while let Some(p) = next.next_if(|p| {
                git_order(p.0, p.1 == EntryKind::Tree, name_of(e), e.tree)
                    == std::cmp::Ordering::Less
            }) {
                emit(&mut out, p);
            }
            out.extend_from_slice(&raw[e.start..e.name.end + 1 + self.hash_len]);
        }
        for p in next {
            emit(&mut out, p);
        }
        if out.is_empty() {
            return Ok(None);
        }
        self.write_raw(out).map(Some)
    }

    /// Writes tree bytes (unless the mirror or the batch has them) and keeps them in
    /// [`WrittenTrees`]: the next snapshot edits the trees this one wrote without reading them
    /// back from the object store.
    pub(super) fn write_raw(&self, buf: Vec<u8>) -> Result<ObjectId, Error> {
        let what = "cannot write the snapshot tree";
        let repo = self.repo;
        let id = gix::objs::compute_hash(repo.object_hash(), gix::objs::Kind::Tree, &buf)
            .map_err(err(what))?;
        let mut batch = self.batch.borrow_mut();
        if !batch.has(&id) {
            batch.put(gix::objs::Kind::Tree, id, &buf)?;
        }
        self.kept.put(id, buf);
        Ok(id)
    }
}

/// The checks gix's tree editor makes of every name it writes, made of the names an edit adds:
/// no empty, `.`, `..` or `.git` component (nor an NTFS alias of `.git`), no `/` or NUL in a name.
/// The defaults of git on Linux (`core.protectNTFS` on, HFS and Windows device names off).
pub(super) fn check_path(
    path: &BStr,
    leaf: Option<gix::validate::path::component::Mode>,
) -> Result<(), Error> {
    let opts = gix::validate::path::component::Options {
        protect_windows: false,
        protect_hfs: false,
        protect_ntfs: true,
    };
    let n = path.split(|b| *b == b'/').count();
    for (i, c) in path.split(|b| *b == b'/').enumerate() {
        let mode = if i + 1 == n { leaf } else { None };
        gix::validate::path::component(c.as_bstr(), mode, opts)
            .map_err(|e| Error::Invalid(format!("cannot write {path} into a tree: {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::snapshot::{Caches, ViewEdit, ViewSource, build_tree};

    /// Only the edits are checked now (not every entry of every tree written): an edit naming an
    /// object the mirror lacks, or a name git refuses, still fails the tree instead of writing
    /// a tree a ref could name.
    #[test]
    fn an_edit_naming_a_missing_object_or_a_refused_name_fails_the_tree() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let missing = ObjectId::from_hex(b"0123456789abcdef0123456789abcdef01234567").unwrap();
        let file = |path: &[u8], source: ViewSource| ViewEdit::File {
            path: path.to_vec(),
            exec: false,
            source,
            added: true,
        };
        for edits in [
            vec![file(b"a/f", ViewSource::Object(missing))],
            vec![ViewEdit::Tree {
                path: b"d".to_vec(),
                id: missing,
            }],
            vec![file(b"a/.git/config", ViewSource::Bytes(b"x".to_vec()))],
            vec![file(b"a/.GIT", ViewSource::Bytes(b"x".to_vec()))],
            vec![file(b"a/../b", ViewSource::Bytes(b"x".to_vec()))],
        ] {
            assert!(
                build_tree(&repo, empty, &edits, None, &caches).is_err(),
                "{edits:?} must not make a tree"
            );
        }
        let ok = [file(b"a/git", ViewSource::Bytes(b"x".to_vec()))];
        build_tree(&repo, empty, &ok, None, &caches).unwrap();
    }

    /// The raw editor makes, from sorted edits, the tree gix's editor makes from them applied in
    /// order: inserts, removals (of absent paths, below files and submodules too), type changes
    /// (file, directory, symlink, submodule at one name), whole trees put at a path and edited
    /// below, a path removed and put back, directories that end empty, names that sort around a
    /// directory's implied `/` (`a-b`, `a.b`, `a0` next to the directory `a`); and what it keeps
    /// in memory is what it wrote to the mirror. Fails on a merge that sorts by plain bytes or
    /// forgets a replaced entry, or on an empty directory left in a tree.
    #[test]
    fn the_raw_editor_makes_the_trees_gix_makes() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let names: [&[u8]; 7] = [b"a", b"a-b", b"a.b", b"a0", b"b", b"ab", b"\xe9"];
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rnd = move |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let reference = |base: ObjectId, edits: &[ViewEdit]| -> ObjectId {
            use gix::objs::FindExt as _;
            let mut buf = Vec::new();
            let root = repo.objects.find_tree(&base, &mut buf).unwrap().into();
            let mut ed = gix::objs::tree::Editor::new(root, &repo.objects, repo.object_hash());
            for e in edits {
                let comps = e.path().split(|b| *b == b'/').map(|c| c.as_bstr());
                let blob = |s: &ViewSource| match s {
                    ViewSource::Bytes(b) => repo.write_blob(b).unwrap().detach(),
                    other => panic!("{other:?}"),
                };
                match e {
                    ViewEdit::Remove { .. } => ed.remove(comps).map(|_| ()),
                    ViewEdit::Tree { id, .. } => ed.upsert(comps, EntryKind::Tree, *id).map(|_| ()),
                    ViewEdit::Gitlink { id, .. } => {
                        ed.upsert(comps, EntryKind::Commit, *id).map(|_| ())
                    }
                    ViewEdit::File { exec, source, .. } => {
                        let kind = if *exec {
                            EntryKind::BlobExecutable
                        } else {
                            EntryKind::Blob
                        };
                        ed.upsert(comps, kind, blob(source)).map(|_| ())
                    }
                    ViewEdit::Symlink { source, .. } => {
                        ed.upsert(comps, EntryKind::Link, blob(source)).map(|_| ())
                    }
                    ViewEdit::AddedDir { .. } => Ok(()),
                }
                .unwrap();
            }
            ed.write(|t| repo.write_object(t).map(|id| id.detach()))
                .unwrap()
        };
        let mut base = ObjectId::empty_tree(repo.object_hash());
        let mut roots = vec![base];
        let mut kinds_seen = std::collections::HashSet::new();
        for round in 0..400 {
            let mut edits = Vec::new();
            for _ in 0..1 + rnd(8) {
                let depth = 1 + rnd(3);
                let path: Vec<u8> = (0..depth)
                    .map(|_| names[rnd(names.len())])
                    .collect::<Vec<_>>()
                    .join(&b'/');
                let content = ViewSource::Bytes(format!("{round} {}\n", rnd(3)).into_bytes());
                let k = rnd(8);
                kinds_seen.insert(k);
                let edit = match k {
                    0 | 1 => ViewEdit::Remove { path },
                    2 | 3 => ViewEdit::File {
                        path,
                        exec: false,
                        source: content,
                        added: false,
                    },
                    4 => ViewEdit::File {
                        path,
                        exec: true,
                        source: content,
                        added: false,
                    },
                    5 => ViewEdit::Symlink {
                        path,
                        source: content,
                        added: false,
                    },
                    6 => ViewEdit::Tree {
                        path,
                        id: roots[rnd(roots.len())],
                    },
                    _ => {
                        // Removed and put back, as a snapshot since the last one rebuilds a path.
                        edits.push(ViewEdit::Remove { path: path.clone() });
                        ViewEdit::Gitlink {
                            path,
                            id: ObjectId::from_bytes_or_panic(&[7; 20]),
                        }
                    }
                };
                edits.push(edit);
            }
            edits.sort_by(|a, b| a.path().cmp(b.path()));
            let ours = build_tree(&repo, base, &edits, None, &caches).unwrap();
            let theirs = reference(base, &edits);
            assert_eq!(ours, theirs, "round {round}: {edits:?} onto {base}");
            let kept = caches.kept_tree(&ours);
            if let Some(kept) = kept {
                assert_eq!(&*kept, &repo.find_object(ours).unwrap().data[..]);
            }
            base = ours;
            roots.push(ours);
        }
        assert_eq!(kinds_seen.len(), 8);
        assert!(
            roots
                .iter()
                .any(|r| repo.find_tree(*r).unwrap().decode().unwrap().entries.len() > 4),
            "the trees grew"
        );
    }

    /// A name holding a NUL byte, or a path with an empty component, never reaches a tree.
    #[test]
    fn names_git_cannot_hold_fail_the_tree() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        for path in [&b"a\0b"[..], b"a//b", b"a/", b""] {
            let edits = [ViewEdit::File {
                path: path.to_vec(),
                exec: false,
                source: ViewSource::Bytes(b"x".to_vec()),
                added: true,
            }];
            assert!(
                build_tree(&repo, empty, &edits, None, &caches).is_err(),
                "{path:?}"
            );
        }
    }

    #[test]
    fn trees_hold_paths_longer_than_path_max_and_names_that_are_not_utf8() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let comps: Vec<Vec<u8>> = (0..24).map(|i| vec![b'a' + i as u8; 200]).collect();
        let mut deep = comps.join(&b'/');
        deep.extend_from_slice(b"/caf\xe9");
        assert!(deep.len() > 4096);
        let edits = [ViewEdit::File {
            path: deep.clone(),
            exec: false,
            source: ViewSource::Bytes(b"deep\n".to_vec()),
            added: true,
        }];
        let empty = ObjectId::empty_tree(repo.object_hash());
        let tree = build_tree(&repo, empty, &edits, None, &caches).unwrap();
        let entry = repo
            .find_tree(tree)
            .unwrap()
            .lookup_entry(deep.split(|b| *b == b'/'))
            .unwrap()
            .expect("the deep file is in the tree");
        assert_eq!(entry.mode().kind(), EntryKind::Blob);
        assert_eq!(repo.find_object(entry.object_id()).unwrap().data, b"deep\n");
    }
}
