//! Snapshot commits in a mirror (docs/architecture.md "Snapshots, release and resume"; seed 000 "Saving").
//!
//! A snapshot adds objects and moves one `refs/octomate/threads/<thread>` ref; it never touches the
//! mirror's HEAD, index, working tree or branches. The tree is the base tree edited with only what
//! changed (untouched subtrees keep their ids); the ref moves by compare-and-swap with a reflog entry,
//! so a lost race is an error, never an overwrite, and a crash leaves the old or the new ref, never
//! a ref to a missing object (objects are written before the ref).

use crate::git::error::{Context, Error};
use crate::git::objects::git_order;
use crate::git::pack::{Deflated, Deflater, ObjectBatch};
use std::path::{Path, PathBuf};

use gix::ObjectId;
use gix::bstr::{BStr, ByteSlice};
use gix::objs::tree::EntryKind;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
use gix::refs::{FullName, Target};

/// One edit that turns the base tree into the workspace's working state (a workspace's view of what differs from its base).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewEdit {
    /// Remove whatever is at `path`.
    Remove {
        path: Vec<u8>,
    },
    /// A directory of the base, whole, now at `path`.
    Tree {
        path: Vec<u8>,
        id: ObjectId,
    },
    /// A directory at `path` that is not in the base at that path (the ignore rules decide whether
    /// its content belongs to the working state). No tree effect by itself.
    AddedDir {
        path: Vec<u8>,
    },
    Gitlink {
        path: Vec<u8>,
        id: ObjectId,
    },
    File {
        path: Vec<u8>,
        exec: bool,
        source: ViewSource,
        /// Not in the base at that path.
        added: bool,
    },
    Symlink {
        path: Vec<u8>,
        source: ViewSource,
        added: bool,
    },
}

impl ViewEdit {
    /// The same edit at another path.
    pub fn at(mut self, new: Vec<u8>) -> ViewEdit {
        match &mut self {
            ViewEdit::Remove { path }
            | ViewEdit::Tree { path, .. }
            | ViewEdit::AddedDir { path }
            | ViewEdit::Gitlink { path, .. }
            | ViewEdit::File { path, .. }
            | ViewEdit::Symlink { path, .. } => *path = new,
        }
        self
    }

    pub fn path(&self) -> &[u8] {
        match self {
            ViewEdit::Remove { path }
            | ViewEdit::Tree { path, .. }
            | ViewEdit::AddedDir { path }
            | ViewEdit::Gitlink { path, .. }
            | ViewEdit::File { path, .. }
            | ViewEdit::Symlink { path, .. } => path,
        }
    }
}

/// Where the bytes of a file or symlink of the view are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ViewSource {
    /// An object already in the mirror.
    Object(ObjectId),
    /// A file on disk (a data file of the upper layer, or a shared host-wide file).
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// Where HEAD of a workspace was when a snapshot was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadRef {
    Branch(String),
    Detached,
}

const HEAD_TRAILER: &str = "Octofs-Head: ";

pub fn thread_ref(thread: &str) -> String {
    format!("refs/octomate/threads/{thread}")
}

const OWNER_TRAILER: &str = "Octofs-Owner: ";

/// The message of a snapshot commit; its trailers record where HEAD was and whose thread it is
/// (uid and, when the host knows it, the user name: a share carries snapshots to hosts where
/// only the name means the same user).
pub fn message(thread: &str, head: &HeadRef, owner: &SnapshotOwner) -> String {
    let h = match head {
        HeadRef::Branch(b) => format!("refs/heads/{b}"),
        HeadRef::Detached => "detached".to_string(),
    };
    let o = match &owner.name {
        Some(n) => format!("{} {n}", owner.uid),
        None => owner.uid.to_string(),
    };
    format!("octofs snapshot of thread {thread}\n\n{HEAD_TRAILER}{h}\n{OWNER_TRAILER}{o}\n")
}

/// Whose thread a snapshot is, as its message records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOwner {
    pub uid: u32,
    pub name: Option<String>,
}

impl SnapshotOwner {
    /// The owner `uid` of this host, named as this host names it.
    pub fn local(uid: u32) -> SnapshotOwner {
        SnapshotOwner {
            uid,
            name: crate::sys::user_name(uid),
        }
    }
}

/// The owner a snapshot's message records; `None` for a snapshot made before owners were
/// recorded (or by anything else).
pub fn owner_of(message: &[u8]) -> Option<SnapshotOwner> {
    message.lines().find_map(|line| {
        let rest = line.to_str().ok()?.strip_prefix(OWNER_TRAILER)?.trim();
        let (uid, name) = match rest.split_once(' ') {
            Some((u, n)) => (u, Some(n.to_string())),
            None => (rest, None),
        };
        Some(SnapshotOwner {
            uid: uid.parse().ok()?,
            name,
        })
    })
}

/// Where HEAD was, from a snapshot commit's message.
pub fn head_of(message: &[u8]) -> HeadRef {
    for line in message.lines() {
        if let Some(rest) = line
            .to_str()
            .ok()
            .and_then(|l| l.strip_prefix(HEAD_TRAILER))
            && let Some(b) = rest.trim().strip_prefix("refs/heads/")
        {
            return HeadRef::Branch(b.to_string());
        }
    }
    HeadRef::Detached
}

fn err<E: std::error::Error + Send + Sync + 'static>(what: &str) -> impl Fn(E) -> Error + '_ {
    move |e| Error::Op {
        what: what.to_string(),
        source: Box::new(e),
    }
}

pub fn open(mirror: &Path) -> Result<gix::Repository, Error> {
    super::open_owned(mirror).context(|| format!("cannot open the mirror {}", mirror.display()))
}

/// The commit a ref points at, if it exists.
pub fn read_ref(repo: &gix::Repository, name: &str) -> Option<ObjectId> {
    repo.find_reference(name)
        .ok()
        .and_then(|mut r| r.peel_to_id().ok())
        .map(|id| id.detach())
}

/// A snapshot commit's tree, parents and message.
pub fn commit_info(
    repo: &gix::Repository,
    id: ObjectId,
) -> Result<(ObjectId, Vec<ObjectId>, Vec<u8>, i64), Error> {
    let c = repo
        .find_commit(id)
        .context(|| format!("cannot read commit {id}"))?;
    let d = c.decode().context(|| format!("cannot read commit {id}"))?;
    let time = c.time().map(|t| t.seconds).unwrap_or(0);
    Ok((d.tree(), d.parents().collect(), d.message.to_vec(), time))
}

/// Writes every object the edits need and returns the edited tree. Edits must be sorted by path.
///
/// `clock`: a reading of the files' clock (seconds, nanoseconds of a ctime) taken before the edits
/// were read. With it, the blob id of a file read now is remembered ([`FileBlobs`]) when the file
/// last changed before that reading, and a file that has not changed since a snapshot remembered it
/// is not read again: a snapshot reads only the files written since the last one.
///
/// The new objects (the changed files' blobs, the edited trees) are written together when the tree
/// is done: a few as loose objects, more as one pack ([`crate::git::pack`]); files larger than
/// [`IN_MEMORY_UP_TO`] stream into loose objects as they are read. Every object is in the mirror
/// when this returns (before any ref can name the tree).
///
/// Cost: what the edits name. Each tree on a changed path is read once and written once; the
/// names and object ids checked are those of the edits, not every entry of every tree written
/// (gix's own tree editor checks that every entry of a tree it writes exists: one object lookup,
/// a `stat` of a loose path, per entry, 100,000 of them for a snapshot touching the directories of
/// a 100,000-file tree, whatever changed).
pub fn build_tree(
    repo: &gix::Repository,
    base_tree: ObjectId,
    edits: &[ViewEdit],
    clock: Option<(i64, i64)>,
) -> Result<ObjectId, Error> {
    build_tree_on(repo, base_tree, edits, clock, blob_threads())
}

/// [`build_tree`] with the changed files' blobs saved on up to `threads` threads (see
/// [`read_files`]); the tree, its objects and their pack entries are the same for any count.
fn build_tree_on(
    repo: &gix::Repository,
    base_tree: ObjectId,
    edits: &[ViewEdit],
    clock: Option<(i64, i64)>,
    threads: usize,
) -> Result<ObjectId, Error> {
    // An id the view names (a tree or object of the base, of the last snapshot) must be in the
    // mirror: a tree naming a missing object would be written, and the ref moved to it.
    let present = |id: ObjectId, path: &BStr| -> Result<ObjectId, Error> {
        if repo.has_object(id) {
            Ok(id)
        } else {
            Err(Error::Invalid(format!(
                "the object {id} at {path} is not in the mirror"
            )))
        }
    };
    present(base_tree, b"/".as_bstr())?;
    let batch = std::cell::RefCell::new(ObjectBatch::new(repo));
    let blob = |source: &ViewSource, path: &BStr| -> Result<ObjectId, Error> {
        Ok(match source {
            ViewSource::Object(id) => present(*id, path)?,
            ViewSource::File(p) => {
                FileBlobs::shared().blob(repo, &mut batch.borrow_mut(), p, clock)?
            }
            ViewSource::Bytes(b) => batch.borrow_mut().write(gix::objs::Kind::Blob, b)?,
        })
    };
    let saved = read_files(repo, &batch, edits, clock, threads)?;
    let mut root = DirEdit {
        base: DirBase::Tree(base_tree),
        forced: true,
        names: std::collections::BTreeMap::new(),
    };
    for (i, e) in edits.iter().enumerate() {
        let path: &BStr = e.path().as_bstr();
        let leaf = match e {
            ViewEdit::Symlink { .. } => Some(gix::validate::path::component::Mode::Symlink),
            _ => None,
        };
        if !matches!(e, ViewEdit::Remove { .. } | ViewEdit::AddedDir { .. }) {
            check_path(path, leaf)?;
        }
        let op = match e {
            ViewEdit::Remove { .. } => None,
            ViewEdit::AddedDir { .. } => continue,
            ViewEdit::Tree { id, .. } => Some((EntryKind::Tree, present(*id, path)?)),
            ViewEdit::Gitlink { id, .. } => Some((EntryKind::Commit, *id)),
            ViewEdit::File { exec, source, .. } => {
                let kind = if *exec {
                    EntryKind::BlobExecutable
                } else {
                    EntryKind::Blob
                };
                let id = match saved.get(&i) {
                    Some(id) => *id,
                    None => blob(source, path)?,
                };
                Some((kind, id))
            }
            ViewEdit::Symlink { source, .. } => Some((EntryKind::Link, blob(source, path)?)),
        };
        root.apply(path, op)?;
    }
    let ed = RawEditor {
        repo,
        hash_len: repo.object_hash().len_in_bytes(),
        batch: &batch,
    };
    let tree = match ed.write_dir(Some(base_tree), &root)? {
        Some(id) => id,
        None => ed.write_raw(Vec::new())?,
    };
    let written = batch.into_inner().finish()?;
    tracing::debug!(objects = written.objects, pack = ?written.pack, "snapshot objects written");
    Ok(tree)
}

/// From this many changed files to read on, a snapshot reads, hashes and compresses them on
/// several threads ([`read_files`]). Measured through the CLI on 2 vCPUs at load 4–7: 1,000
/// changed files gained (tree step ~200 → ~130 ms), 100 did not (a little slower: a loaded
/// machine's other CPU is busy, and the snapshot waits for the slowest thread).
const PARALLEL_FROM: usize = 128;

/// Files one round of [`read_files`] holds in memory at once (each at most [`PARALLEL_UP_TO`]
/// bytes, whole and compressed: 64 MiB at most).
const PARALLEL_WINDOW: usize = 128;

/// Files larger than this are saved on the snapshot's own thread, as before.
const PARALLEL_UP_TO: u64 = 256 << 10;

/// Threads that save a snapshot's changed files: the machine's CPUs, at most 4.
fn blob_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// A changed file as a worker thread of [`read_files`] left it.
enum Prepared {
    /// Remembered with this stamp ([`FileBlobs`]): this id, if the mirror or the batch has it.
    Known(ObjectId),
    /// Read (its stamp from before the read), hashed and compressed.
    Read(Deflated, Stamp),
    /// Larger than [`PARALLEL_UP_TO`]: saved on the snapshot's thread.
    Large,
}

/// The blobs of the edits' files (`ViewSource::File`) saved on `threads` threads, by the edit's
/// index, when there are at least [`PARALLEL_FROM`] of them (else nothing: the caller saves
/// each). Bounded: the threads take the files a window of [`PARALLEL_WINDOW`] at a time, and each
/// window's objects go into `batch` in the edits' order before the next is read: the batch gets
/// the same objects, compressed the same, as from one thread (only their order in the pack may
/// differ, when other edits also add blobs). Files the
/// workers leave (large ones, a remembered id the mirror lacks) are saved here, as one thread
/// would. The first error (a file that cannot be read) fails the whole: nothing was written to
/// the mirror yet (the batch is written only when the tree is done).
fn read_files(
    repo: &gix::Repository,
    batch: &std::cell::RefCell<ObjectBatch<'_>>,
    edits: &[ViewEdit],
    clock: Option<(i64, i64)>,
    threads: usize,
) -> Result<std::collections::HashMap<usize, ObjectId>, Error> {
    let files: Vec<(usize, &Path)> = edits
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            ViewEdit::File {
                source: ViewSource::File(p),
                ..
            } => Some((i, p.as_path())),
            _ => None,
        })
        .collect();
    let mut saved = std::collections::HashMap::new();
    if threads < 2 || files.len() < PARALLEL_FROM {
        return Ok(saved);
    }
    let hash = repo.object_hash();
    let blobs = FileBlobs::shared();
    let mut deflaters: Vec<Deflater> = (0..threads).map(|_| Deflater::default()).collect();
    for window in files.chunks(PARALLEL_WINDOW) {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = |z: &mut Deflater| {
            let mut out = Vec::new();
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((_, p)) = window.get(k) else {
                    return out;
                };
                let r = blobs.prepare(z, hash, p, clock.is_some());
                let failed = r.is_err();
                out.push((k, r));
                if failed {
                    // The snapshot fails: the others stop at their next file.
                    next.store(window.len(), std::sync::atomic::Ordering::Relaxed);
                    return out;
                }
            }
        };
        let (mine, theirs) = deflaters.split_first_mut().expect("threads >= 2");
        let mut results = std::thread::scope(|sc| {
            let handles: Vec<_> = theirs.iter_mut().map(|z| sc.spawn(|| work(z))).collect();
            let mut all = work(mine);
            for h in handles {
                match h.join() {
                    Ok(r) => all.extend(r),
                    Err(_) => {
                        return Err(Error::Invalid(
                            "a thread saving the snapshot's files failed".into(),
                        ));
                    }
                }
            }
            Ok(all)
        })?;
        results.sort_by_key(|(k, _)| *k);
        let mut b = batch.borrow_mut();
        for (k, r) in results {
            let (i, p) = window[k];
            let id = match r? {
                Prepared::Known(id) if b.contains(&id) || repo.has_object(id) => id,
                Prepared::Known(_) | Prepared::Large => blobs.blob(repo, &mut b, p, clock)?,
                Prepared::Read(d, stamp) => {
                    if !b.has(&d.id) {
                        b.put_deflated(&d)?;
                    }
                    blobs.remember(stamp, d.id, clock);
                    d.id
                }
            };
            saved.insert(i, id);
        }
    }
    Ok(saved)
}

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
struct DirEdit {
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
    /// Applies one edit (`None`: remove) at `path`, after every earlier one, with the rules of
    /// gix's tree editor: putting an entry makes the directories above it (a non-tree on the way
    /// is replaced); removing goes down only through trees and is nothing when the path is absent.
    fn apply(&mut self, path: &BStr, op: Option<(EntryKind, ObjectId)>) -> Result<(), Error> {
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
struct RawEditor<'r, 'b> {
    repo: &'r gix::Repository,
    hash_len: usize,
    /// Where the trees written go (with the blobs).
    batch: &'b std::cell::RefCell<ObjectBatch<'r>>,
}

/// One entry of a tree's bytes: where it starts, where its name is, whether it is a tree.
struct RawEntry {
    start: usize,
    name: std::ops::Range<usize>,
    tree: bool,
}

impl RawEditor<'_, '_> {
    /// The bytes of tree `id`: kept in [`WrittenTrees`], else read from the mirror.
    fn read(&self, id: ObjectId) -> Result<std::sync::Arc<[u8]>, Error> {
        if let Some(raw) = WrittenTrees::shared().get(&id) {
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
    fn write_dir(&self, base: Option<ObjectId>, d: &DirEdit) -> Result<Option<ObjectId>, Error> {
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
    fn write_raw(&self, buf: Vec<u8>) -> Result<ObjectId, Error> {
        let what = "cannot write the snapshot tree";
        let repo = self.repo;
        let id = gix::objs::compute_hash(repo.object_hash(), gix::objs::Kind::Tree, &buf)
            .map_err(err(what))?;
        let mut batch = self.batch.borrow_mut();
        if !batch.has(&id) {
            batch.put(gix::objs::Kind::Tree, id, &buf)?;
        }
        WrittenTrees::shared().put(id, buf);
        Ok(id)
    }
}

/// The trees recent snapshots wrote, uncompressed, by id. A snapshot edits the trees on the paths
/// that changed since the last one, which are mostly trees the last snapshot wrote: served from
/// here, they are not opened, inflated and copied again from loose objects (a 1,000-entry
/// directory is ~35 KiB of tree, and every changed directory is one). Content-addressed, so an
/// entry is right for any mirror; the editor reads only trees named by a tree it already has (the
/// root is checked to be in the mirror first). Bounded: past [`WRITTEN_TREES_MAX`] bytes it
/// starts again empty.
struct WrittenTrees {
    trees: std::sync::Mutex<KeptTrees>,
}

/// The kept trees and their bytes in all.
#[derive(Default)]
struct KeptTrees {
    by_id: std::collections::HashMap<ObjectId, std::sync::Arc<[u8]>>,
    bytes: usize,
}

/// Bytes of trees kept at most (shared by every workspace of the daemon).
const WRITTEN_TREES_MAX: usize = 16 << 20;

/// The bytes of tree `id` if a snapshot of this daemon wrote it recently (kept in memory, see
/// [`WrittenTrees`]); the ids are content hashes, so the bytes are right for any mirror.
pub fn kept_tree(id: &gix::oid) -> Option<std::sync::Arc<[u8]>> {
    WrittenTrees::shared().get(id)
}

impl WrittenTrees {
    fn shared() -> &'static WrittenTrees {
        static SHARED: std::sync::OnceLock<WrittenTrees> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| WrittenTrees {
            trees: std::sync::Mutex::new(KeptTrees::default()),
        })
    }

    fn get(&self, id: &gix::oid) -> Option<std::sync::Arc<[u8]>> {
        let t = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        t.by_id.get(id).cloned()
    }

    fn put(&self, id: ObjectId, bytes: Vec<u8>) {
        if bytes.len() > WRITTEN_TREES_MAX / 4 {
            return;
        }
        let mut t = self.trees.lock().unwrap_or_else(|e| e.into_inner());
        if t.by_id.contains_key(&id) {
            return;
        }
        if t.bytes + bytes.len() > WRITTEN_TREES_MAX {
            t.by_id.clear();
            t.bytes = 0;
        }
        t.bytes += bytes.len();
        t.by_id.insert(id, bytes.into());
    }
}

/// The checks gix's tree editor makes of every name it writes, made of the names an edit adds:
/// no empty, `.`, `..` or `.git` component (nor an NTFS alias of `.git`), no `/` or NUL in a name.
/// The defaults of git on Linux (`core.protectNTFS` on, HFS and Windows device names off).
fn check_path(
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

/// What identifies the content of a file on disk without reading it: its device and inode, size,
/// modification and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The blob ids of files the daemon saved (upper-layer data files), by the file's [`Stamp`]: a
/// snapshot does not read, hash and write again a file that has not changed since an earlier
/// snapshot saved it. Held in memory only: after a restart every file is read once more.
///
/// A file's id is remembered only when its change time (read before its content) is earlier than a
/// clock reading taken before the snapshot's view, so any write after the content was read leaves a
/// later change time and a different stamp (the rule git's index uses against "racily clean"
/// entries). The id is used only if the repository has the object.
pub struct FileBlobs {
    known: std::sync::Mutex<std::collections::HashMap<(u64, u64), (Stamp, ObjectId)>>,
}

/// Files remembered at most (about 100 bytes each); past it the memory starts again empty.
const FILE_BLOBS_MAX: usize = 1 << 20;

impl FileBlobs {
    /// The daemon's one table (keyed by host inode, so shared by every workspace and mirror).
    pub fn shared() -> &'static FileBlobs {
        static SHARED: std::sync::OnceLock<FileBlobs> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| FileBlobs {
            known: std::sync::Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// The blob of the file at `p`: remembered, or written now (and remembered, see the type).
    fn blob(
        &self,
        repo: &gix::Repository,
        batch: &mut ObjectBatch<'_>,
        p: &Path,
        clock: Option<(i64, i64)>,
    ) -> Result<ObjectId, Error> {
        if clock.is_some()
            && let Ok(m) = std::fs::metadata(p)
            && let Some(id) = self.known(&Stamp::of(&m))
            && (batch.contains(&id) || repo.has_object(id))
        {
            return Ok(id);
        }
        let (id, read) = write_file_blob(repo, batch, p)?;
        self.remember(read, id, clock);
        Ok(id)
    }

    /// The id remembered for a file with stamp `s`.
    fn known(&self, s: &Stamp) -> Option<ObjectId> {
        let m = self.known.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(s.dev, s.ino))
            .filter(|(was, _)| was == s)
            .map(|(_, id)| *id)
    }

    /// Remembers `id` for the file whose stamp before it was read is `read`, if it last changed
    /// before `clock`.
    fn remember(&self, read: Stamp, id: ObjectId, clock: Option<(i64, i64)>) {
        if let Some(clock) = clock
            && read.ctime < clock
        {
            let mut m = self.known.lock().unwrap_or_else(|e| e.into_inner());
            if m.len() >= FILE_BLOBS_MAX {
                m.clear();
            }
            m.insert((read.dev, read.ino), (read, id));
        }
    }

    /// The work of [`Self::blob`] that needs no repository, for a worker thread of
    /// [`read_files`]: the remembered id (when `remembered` ids may be used), else the file read
    /// (at most [`PARALLEL_UP_TO`] bytes), hashed and compressed.
    fn prepare(
        &self,
        z: &mut Deflater,
        hash: gix::hash::Kind,
        p: &Path,
        remembered: bool,
    ) -> Result<Prepared, Error> {
        use std::io::Read as _;
        if remembered
            && let Ok(m) = std::fs::metadata(p)
            && let Some(id) = self.known(&Stamp::of(&m))
        {
            return Ok(Prepared::Known(id));
        }
        let cannot = || format!("cannot read {}", p.display());
        let f = std::fs::File::open(p).context(cannot)?;
        let m = f.metadata().context(cannot)?;
        let (size, stamp) = (m.len(), Stamp::of(&m));
        if size > PARALLEL_UP_TO {
            return Ok(Prepared::Large);
        }
        let mut buf = Vec::with_capacity(size as usize);
        ExactSize {
            inner: f,
            left: size,
        }
        .read_to_end(&mut buf)
        .context(cannot)?;
        let d = Deflated::of(z, hash, gix::objs::Kind::Blob, buf)?;
        Ok(Prepared::Read(d, stamp))
    }
}

/// Files up to this size are read whole to be saved; larger ones stream.
const IN_MEMORY_UP_TO: u64 = 8 << 20;

/// Writes the content of file `p` as a blob: into `batch` when it is at most [`IN_MEMORY_UP_TO`]
/// bytes. gix's `write_blob_stream` reads the whole file into memory first (5 GiB of daemon memory
/// for a 5 GiB file), so a large file streams instead: one pass hashes it (a blob the mirror
/// already has, e.g. from the last snapshot, is not written again), a second one hashes and
/// compresses it into a loose object. Memory stays bounded whatever the size. Also returns the
/// file's stamp as it was before its content was read.
fn write_file_blob(
    repo: &gix::Repository,
    batch: &mut ObjectBatch<'_>,
    p: &Path,
) -> Result<(ObjectId, Stamp), Error> {
    use gix::objs::Write as _;
    use std::io::Read as _;
    let what = || format!("cannot write a blob from {}", p.display());
    let open = || -> Result<(std::fs::File, u64, Stamp), Error> {
        let f = std::fs::File::open(p).context(|| format!("cannot read {}", p.display()))?;
        let m = f
            .metadata()
            .context(|| format!("cannot read {}", p.display()))?;
        Ok((f, m.len(), Stamp::of(&m)))
    };
    // The object's header states its size before the content follows: a file that shrinks while
    // it is read must fail the write, never leave an object whose content disagrees with its header.
    let exact = |f: std::fs::File, size: u64| ExactSize {
        inner: std::io::BufReader::with_capacity(1 << 20, f),
        left: size,
    };
    let (f, size, stamp) = open()?;
    if size <= IN_MEMORY_UP_TO {
        // Read whole into a buffer of its size: no 1 MiB read buffer allocated (and its pages
        // faulted in) for every small file.
        let mut buf = Vec::with_capacity(size as usize);
        ExactSize {
            inner: f,
            left: size,
        }
        .read_to_end(&mut buf)
        .context(|| format!("cannot read {}", p.display()))?;
        return Ok((batch.write(gix::objs::Kind::Blob, &buf)?, stamp));
    }
    let id = gix::objs::compute_stream_hash(
        repo.object_hash(),
        gix::objs::Kind::Blob,
        &mut exact(f, size),
        size,
        &mut gix::utils::progress::Discard,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .context(what)?;
    if batch.contains(&id) || repo.has_object(id) {
        return Ok((id, stamp));
    }
    // Opened again: the stamp is the second open's, taken before the content written is read.
    let (f, size, stamp) = open()?;
    let id = repo
        .objects
        .write_stream(gix::objs::Kind::Blob, size, &mut exact(f, size))
        .context(what)?;
    Ok((id, stamp))
}

/// Reads exactly `left` bytes of `inner`, and fails if it ends sooner.
struct ExactSize<R> {
    inner: R,
    left: u64,
}

impl<R: std::io::Read> std::io::Read for ExactSize<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was saved",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn signature() -> gix::actor::Signature {
    gix::actor::Signature {
        name: "octofs".into(),
        email: "octofs@localhost".into(),
        time: gix::date::Time::now_local_or_utc(),
    }
}

/// Writes a commit object (no ref moves).
pub fn write_commit(
    repo: &gix::Repository,
    tree: ObjectId,
    parents: Vec<ObjectId>,
    message: &str,
) -> Result<ObjectId, Error> {
    write_commit_as(repo, tree, parents, message, None)
}

/// Who a commit is by: a name and an email (the time is the commit's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub email: String,
}

/// Writes a commit object by `who` (author and committer; octofs's own signature without one).
pub fn write_commit_as(
    repo: &gix::Repository,
    tree: ObjectId,
    parents: Vec<ObjectId>,
    message: &str,
    who: Option<&Identity>,
) -> Result<ObjectId, Error> {
    let mut sig = signature();
    if let Some(who) = who {
        sig.name = who.name.as_str().into();
        sig.email = who.email.as_str().into();
    }
    let commit = gix::objs::Commit {
        tree,
        parents: parents.into_iter().collect(),
        author: sig.clone(),
        committer: sig,
        encoding: None,
        message: message.into(),
        extra_headers: vec![],
    };
    Ok(repo
        .write_object(&commit)
        .map_err(err("cannot write the snapshot commit"))?
        .detach())
}

/// Moves `name` from `expected` (`None`: must not exist) to `new`, with a reflog entry. A ref that
/// moved underneath is an error, never an overwrite.
pub fn cas_ref(
    repo: &gix::Repository,
    name: &str,
    expected: Option<ObjectId>,
    new: ObjectId,
    log: &str,
) -> Result<(), Error> {
    let full = FullName::try_from(name).context(|| format!("bad ref name {name}"))?;
    let edit = RefEdit {
        name: full,
        deref: false,
        change: Change::Update {
            log: LogChange {
                mode: RefLog::AndReference,
                force_create_reflog: true,
                message: log.into(),
            },
            expected: match expected {
                Some(id) => PreviousValue::MustExistAndMatch(Target::Object(id)),
                None => PreviousValue::MustNotExist,
            },
            new: Target::Object(new),
        },
    };
    let sig = signature();
    let mut tb = gix::date::parse::TimeBuf::default();
    let first = repo.edit_references_as(Some(edit.clone()), Some(sig.to_ref(&mut tb)));
    let result = match first {
        Err(e) if clear_stale_locks(repo, name) => {
            tracing::debug!("{name}: retrying after a stale lock: {e}");
            repo.edit_references_as(Some(edit), Some(sig.to_ref(&mut tb)))
        }
        other => other,
    };
    result
        .map(|_| ())
        .context(|| format!("{name} moved underneath (another snapshot won the race?)"))
}

/// How long a ref lock may stay unchanged before it counts as left by a process that died while
/// holding it (git and gix hold one for milliseconds).
const STALE_LOCK_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// After a failed edit of `name`: waits for `packed-refs.lock` and `<name>.lock` in `repo` to go
/// away, and removes one that stays unchanged for [`STALE_LOCK_AFTER`] — the daemon killed while
/// it updated a ref leaves one, and every later edit of any ref of the mirror would fail on it
/// for good. `true` when a lock was there (gone or removed now: worth retrying).
fn clear_stale_locks(repo: &gix::Repository, name: &str) -> bool {
    let locks = [
        repo.git_dir().join("packed-refs.lock"),
        repo.git_dir().join(format!("{name}.lock")),
    ];
    let mut found = false;
    for lock in locks {
        let stamp = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let Some(seen) = stamp(&lock) else {
            continue;
        };
        found = true;
        let since = std::time::Instant::now();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
            match stamp(&lock) {
                None => break,
                Some(t) if t != seen => break,
                Some(_) if since.elapsed() >= STALE_LOCK_AFTER => {
                    match std::fs::remove_file(&lock) {
                        Ok(()) => tracing::warn!(
                            "removed {}: unchanged for {} s, left by a process that died while \
                             updating a ref",
                            lock.display(),
                            STALE_LOCK_AFTER.as_secs()
                        ),
                        Err(e) => tracing::warn!("cannot remove stale {}: {e}", lock.display()),
                    }
                    break;
                }
                Some(_) => {}
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_and_owner_trailers_round_trip() {
        let alice = SnapshotOwner {
            uid: 1001,
            name: Some("alice".into()),
        };
        let m = message("t1", &HeadRef::Branch("feature/x".into()), &alice);
        assert_eq!(head_of(m.as_bytes()), HeadRef::Branch("feature/x".into()));
        assert_eq!(owner_of(m.as_bytes()), Some(alice));
        let nameless = SnapshotOwner { uid: 7, name: None };
        let m = message("t1", &HeadRef::Detached, &nameless);
        assert_eq!(head_of(m.as_bytes()), HeadRef::Detached);
        assert_eq!(owner_of(m.as_bytes()), Some(nameless));
        assert_eq!(head_of(b"some other commit"), HeadRef::Detached);
        assert_eq!(owner_of(b"some other commit\n\nOctofs-Owner: x\n"), None);
        assert_eq!(owner_of(b"some other commit"), None);
    }

    /// A remembered file is not read again while unchanged, and is read again once written, even
    /// with its size and modification time put back (only the change time tells).
    #[test]
    fn a_snapshot_reads_again_only_the_files_written_since() {
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path().join("repo")).unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, b"aaaa").unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let edits = [ViewEdit::File {
            path: b"f".to_vec(),
            exec: false,
            source: ViewSource::File(file.clone()),
            added: true,
        }];
        let content = |tree: ObjectId| {
            let t = repo.find_tree(tree).unwrap();
            let e = t.lookup_entry_by_path("f").unwrap().unwrap();
            repo.find_object(e.object_id()).unwrap().data.clone()
        };
        let later = Some((i64::MAX, 0));
        let first = build_tree(&repo, empty, &edits, later).unwrap();
        assert_eq!(content(first), b"aaaa");
        let stamp = Stamp::of(&std::fs::metadata(&file).unwrap());
        let known = |s: &Stamp| {
            FileBlobs::shared()
                .known
                .lock()
                .unwrap()
                .get(&(s.dev, s.ino))
                .is_some_and(|(was, _)| was == s)
        };
        assert!(known(&stamp), "remembered: it changed before the clock");
        assert_eq!(build_tree(&repo, empty, &edits, later).unwrap(), first);

        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, b"bbbb").unwrap();
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let second = build_tree(&repo, empty, &edits, later).unwrap();
        assert_eq!(content(second), b"bbbb");

        // Changed at or after the clock: not remembered (a write in the same tick could follow).
        let other = dir.path().join("other");
        std::fs::write(&other, b"cccc").unwrap();
        let edits = [ViewEdit::File {
            path: b"f".to_vec(),
            exec: false,
            source: ViewSource::File(other.clone()),
            added: true,
        }];
        build_tree(&repo, empty, &edits, Some((0, 0))).unwrap();
        assert!(!known(&Stamp::of(&std::fs::metadata(&other).unwrap())));
    }

    /// `n` files under `dir` as file edits (sorted): sizes from empty to past
    /// [`PARALLEL_UP_TO`], some with the same content, text that compresses.
    fn many_files(dir: &Path, n: usize) -> Vec<ViewEdit> {
        let mut edits = Vec::new();
        for i in 0..n {
            let p = dir.join(format!("data{i}"));
            let body = match i % 7 {
                0 => Vec::new(),
                1 => b"the same content\n".to_vec(),
                5 if i % 70 == 5 => vec![b'x'; PARALLEL_UP_TO as usize + 1 + i],
                _ => format!("file {i}\n").repeat(1 + i * 13 % 900).into_bytes(),
            };
            std::fs::write(&p, body).unwrap();
            edits.push(ViewEdit::File {
                path: format!("d{}/f{i}", i % 5).into_bytes(),
                exec: i % 11 == 0,
                source: ViewSource::File(p),
                added: true,
            });
        }
        edits.push(ViewEdit::Symlink {
            path: b"d1/link".to_vec(),
            source: ViewSource::Bytes(b"f1".to_vec()),
            added: true,
        });
        edits.sort_by(|a, b| a.path().cmp(b.path()));
        edits
    }

    /// The changed files saved on several threads (three windows of them, large files left to
    /// the snapshot's thread, content repeated across files and threads) give the tree one thread
    /// gives, with every object's content the same, a pack `git fsck --strict` accepts, and the
    /// same tree again when the remembered ids are used. Catches: a blob matched to the wrong
    /// edit, an object lost or written twice when threads meet the same content, a pack entry
    /// whose compressed bytes or header disagree with its object.
    #[test]
    fn files_saved_on_several_threads_make_the_tree_one_thread_makes() {
        let dir = tempfile::tempdir().unwrap();
        let edits = many_files(dir.path(), 300);
        let serial = gix::init_bare(dir.path().join("one")).unwrap();
        let parallel = gix::init_bare(dir.path().join("two")).unwrap();
        let empty = ObjectId::empty_tree(serial.object_hash());
        let a = build_tree_on(&serial, empty, &edits, None, 1).unwrap();
        let b = build_tree_on(&parallel, empty, &edits, None, 3).unwrap();
        assert_eq!(a, b);
        let mut blobs = 0;
        for e in &edits {
            let path = e.path().as_bstr();
            let id = |repo: &gix::Repository| {
                let t = repo.find_tree(a).unwrap();
                t.lookup_entry_by_path(path.to_str().unwrap())
                    .unwrap()
                    .unwrap()
                    .object_id()
            };
            let (x, y) = (id(&serial), id(&parallel));
            assert_eq!(x, y, "{path}");
            assert_eq!(
                serial.find_object(x).unwrap().data,
                parallel.find_object(y).unwrap().data,
                "{path}"
            );
            blobs += 1;
        }
        assert_eq!(blobs, 301);
        let fsck = std::process::Command::new("git")
            .args(["fsck", "--strict", "--no-dangling"])
            .current_dir(parallel.git_dir())
            .output()
            .unwrap();
        assert!(fsck.status.success(), "{fsck:?}");
        let packs = std::fs::read_dir(parallel.git_dir().join("objects/pack"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("pack".as_ref()))
            .count();
        assert_eq!(
            packs, 1,
            "the threads' objects went into the snapshot's one pack"
        );
        // Remembered ids (the files changed before the clock) on the second snapshot.
        let later = Some((i64::MAX, 0));
        let c = build_tree_on(&parallel, empty, &edits, later, 3).unwrap();
        let d = build_tree_on(&parallel, empty, &edits, later, 3).unwrap();
        assert_eq!((c, d), (a, a));
    }

    /// A changed file that cannot be read while the others are read on several threads fails the
    /// tree, and nothing is left in the mirror: no pack, no temporary file, no loose object (so
    /// no ref can move to a tree missing a blob). Catches: a worker's error dropped (a tree
    /// without that file, or with a blob that is not in the mirror), a half-written pack left.
    #[test]
    fn a_file_that_cannot_be_read_fails_the_parallel_save_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let edits = many_files(dir.path(), 200);
        std::fs::remove_file(dir.path().join("data150")).unwrap();
        let repo = gix::init_bare(dir.path().join("repo")).unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let e = build_tree_on(&repo, empty, &edits, None, 2).unwrap_err();
        assert!(e.to_string().contains("data150"), "{e}");
        let mut left = Vec::new();
        let mut stack = vec![repo.git_dir().join("objects")];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d).unwrap() {
                let p = f.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    left.push(p);
                }
            }
        }
        assert!(left.is_empty(), "{left:?}");
    }

    /// Only the edits are checked now (not every entry of every tree written): an edit naming an
    /// object the mirror lacks, or a name git refuses, still fails the tree instead of writing
    /// a tree a ref could name.
    #[test]
    fn an_edit_naming_a_missing_object_or_a_refused_name_fails_the_tree() {
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
                build_tree(&repo, empty, &edits, None).is_err(),
                "{edits:?} must not make a tree"
            );
        }
        let ok = [file(b"a/git", ViewSource::Bytes(b"x".to_vec()))];
        build_tree(&repo, empty, &ok, None).unwrap();
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
            let ours = build_tree(&repo, base, &edits, None).unwrap();
            let theirs = reference(base, &edits);
            assert_eq!(ours, theirs, "round {round}: {edits:?} onto {base}");
            let kept = WrittenTrees::shared().get(&ours);
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
            assert!(build_tree(&repo, empty, &edits, None).is_err(), "{path:?}");
        }
    }

    #[test]
    fn trees_hold_paths_longer_than_path_max_and_names_that_are_not_utf8() {
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
        let tree = build_tree(&repo, empty, &edits, None).unwrap();
        let entry = repo
            .find_tree(tree)
            .unwrap()
            .lookup_entry(deep.split(|b| *b == b'/'))
            .unwrap()
            .expect("the deep file is in the tree");
        assert_eq!(entry.mode().kind(), EntryKind::Blob);
        assert_eq!(repo.find_object(entry.object_id()).unwrap().data, b"deep\n");
    }

    /// The daemon killed while it updated a ref leaves `packed-refs.lock` in the mirror. Catches:
    /// every later edit of the mirror's refs failing on it for good; a lock someone still holds
    /// (one that goes away) being removed.
    #[test]
    fn a_ref_edit_gets_past_a_lock_left_by_a_dead_process() {
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let name = "refs/octomate/threads/t";
        cas_ref(&repo, name, None, empty, "first").unwrap();
        // A stale lock: nobody removes it.
        let lock = dir.path().join("packed-refs.lock");
        std::fs::write(&lock, b"").unwrap();
        let blob = repo.write_blob(b"x").unwrap().detach();
        let t0 = std::time::Instant::now();
        cas_ref(&repo, name, Some(empty), blob, "second").unwrap();
        assert!(t0.elapsed() >= STALE_LOCK_AFTER);
        assert!(!lock.exists());
        assert_eq!(repo.find_reference(name).unwrap().id().detach(), blob);
        // A live holder: it lets go after 300 ms, and its lock is not removed under it.
        std::fs::write(&lock, b"").unwrap();
        let held = lock.clone();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::fs::remove_file(&held).unwrap();
        });
        let t0 = std::time::Instant::now();
        cas_ref(&repo, name, Some(blob), empty, "third").unwrap();
        assert!(t0.elapsed() < STALE_LOCK_AFTER);
        holder.join().expect("the holder removed its own lock");
        // A moved ref is still refused.
        assert!(cas_ref(&repo, name, Some(blob), blob, "fourth").is_err());
    }
}
