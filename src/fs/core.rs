//! The filesystem core of one workspace: a copy-on-write overlay of the base commit.
//!
//! Every request is a method returning `Result<_, Errno>`; nothing here panics on a request and
//! nothing here knows about the kernel (the fuser adapter in [`super::fuse`] does). All metadata lives
//! in one [`State`] behind a mutex. A change is a transaction ([`Tx`]): its catalog records are
//! appended to the log *first* and applied in memory only if that succeeded, so a failed append
//! (ENOSPC) changes nothing and an acknowledged change survives SIGKILL.
//!
//! The model (see `docs/overlay.md`):
//! - An inode nobody changed has no record: it is *derived* from the base tree on lookup, numbered by
//!   the hash of its path in the base (`docs/inodes.md`).
//! - A changed inode has an [`InodeRecord`] ("persisted"). Each persisted inode is linked in its parent
//!   directory's *overlay*, and so on up to the root ("the chain"), so the set of changed paths is
//!   found by walking overlays only, never the whole tree.
//! - A directory's entries are its base tree's, overridden by its overlay (`Some(ino)` links, `None`
//!   hides a base entry). Renaming a directory copies nothing: its base tree goes with it.
//! - A regular file's content is its base blob (served from the shared blob cache) until the first
//!   write intent, when it is copied up into the upper layer's data file; the inode number stays.

use std::collections::VecDeque;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};
use gix::ObjectId;

use crate::cow::blobcache::BlobCache;
use crate::cow::catalog::{
    BaseRef, Catalog, CatalogState, InodeRecord, InodeTable, Kind, Record, Ts,
};
use crate::cow::upper::{Upper, system_time};
use crate::git::objects::{EntryKind, ObjectStore, TreeEntry};
use crate::git::snapshot::{ViewEdit, ViewSource};

mod posix;
pub use posix::NodeMeta;

pub const ROOT_INO: u64 = 1;
/// Longest file name a directory entry may have (as on ext4).
pub const NAME_MAX: usize = 255;
/// Most hard links one inode may have (as on ext4).
const LINK_MAX: u32 = 65_000;
/// Inode numbers the workspace allocates have the top bit set; derived ones never do.
const ALLOCATED: u64 = 1 << 63;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65_536;

/// Who is asking (from the FUSE request header).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// How the workspace presents what nobody changed.
#[derive(Debug, Clone, Copy)]
pub struct Presentation {
    pub uid: u32,
    pub gid: u32,
    /// The base commit's committer time: mtime, ctime and atime of every unmodified entry.
    pub time: SystemTime,
}

/// A directory entry with its attributes (readdirplus needs both).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub attr: FileAttr,
}

/// The names in a directory (as bytes) and their kinds.
pub type Listing = Vec<(Vec<u8>, FileType)>;

/// A time to set: now, or a given time.
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of one `setattr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
}

/// What `open` hands the adapter.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    /// The file is the workspace's own data file (else the read-only blob-cache file of the base).
    pub upper: bool,
    /// Counted as a writer of the inode (write access or `O_TRUNC`): its release must say so, and
    /// only then (an `O_RDONLY|O_CREAT` create is no writer).
    pub write: bool,
}

/// Result of `getxattr`/`listxattr`: the size asked for, or the bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

/// A change from the base, as `status` and `diff` list it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
    /// A directory (everything below it may differ too).
    pub dir: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone)]
struct Node {
    rec: InodeRecord,
    /// Has a catalog record (else derived from the base, or unlinked).
    persisted: bool,
    /// References the kernel holds (lookups, readdirplus entries, creates), minus forgets.
    lookups: u64,
    /// Open file handles, and how many of them may write.
    opens: u32,
    writers: u32,
}

impl Node {
    /// A node for a record of the catalog, not yet referenced by the kernel.
    fn persisted(rec: InodeRecord) -> Node {
        Node {
            rec,
            persisted: true,
            lookups: 0,
            opens: 0,
            writers: 0,
        }
    }
}

/// The live nodes as the catalog's inode table: a dropped record leaves its node (unlinked) for as
/// long as the kernel or an open file refers to it.
impl InodeTable for HashMap<u64, Node> {
    fn set(&mut self, rec: &InodeRecord) {
        match self.get_mut(&rec.ino) {
            Some(n) => {
                n.rec = rec.clone();
                n.persisted = true;
            }
            None => {
                self.insert(rec.ino, Node::persisted(rec.clone()));
            }
        }
    }

    fn drop_record(&mut self, ino: u64) {
        if let Some(n) = self.get_mut(&ino) {
            n.persisted = false;
            n.rec.nlink = 0;
        }
    }
}

struct State {
    catalog: Catalog,
    /// The catalog's state as replayed and committed, each record held in a [`Node`] with its
    /// runtime data; `live.inodes` also holds the inodes without a record (derived from the base,
    /// or unlinked and still referenced). `live.generation` counts committed batches since the
    /// workspace was created (durable: replay recounts them).
    live: CatalogState<HashMap<u64, Node>>,
    journal: Journal,
}

/// Paths changed through the mount, in order, for git's file-system monitor: a token names a
/// position; a query answers every path changed after it. Kept in memory: a token from another
/// daemon run (other epoch) or older than what is retained answers "everything", which is always safe.
struct Journal {
    epoch: u64,
    seq: u64,
    /// The sequence number just before the oldest retained entry.
    floor: u64,
    /// (sequence, path); an empty path means "everything".
    entries: VecDeque<(u64, Vec<u8>)>,
}

const JOURNAL_MAX: usize = 1 << 16;

/// What changed since an fsmonitor token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Everything,
    Paths(Vec<Vec<u8>>),
}

impl Journal {
    fn new() -> Journal {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id());
        Journal {
            epoch,
            seq: 0,
            floor: 0,
            entries: VecDeque::new(),
        }
    }

    fn note(&mut self, path: Vec<u8>) {
        // git ignores what happens inside its own directory.
        if path == b".git" || path.starts_with(b".git/") {
            return;
        }
        self.seq += 1;
        self.entries.push_back((self.seq, path));
        if self.entries.len() > JOURNAL_MAX
            && let Some((s, _)) = self.entries.pop_front()
        {
            self.floor = s;
        }
    }

    fn token(&self) -> String {
        format!("octofs:{}:{}", self.epoch, self.seq)
    }

    /// Entries after `token`, or `None` when the token cannot be trusted.
    fn since(&self, token: &str) -> Option<Vec<Vec<u8>>> {
        let mut parts = token.trim().split(':');
        if parts.next() != Some("octofs") {
            return None;
        }
        let epoch: u64 = parts.next()?.parse().ok()?;
        let seq: u64 = parts.next()?.parse().ok()?;
        if epoch != self.epoch || seq < self.floor || seq > self.seq {
            return None;
        }
        let mut out = Vec::new();
        for (s, p) in &self.entries {
            if *s > seq {
                if p.is_empty() {
                    return None;
                }
                out.push(p.clone());
            }
        }
        Some(out)
    }
}

/// The filesystem of one workspace.
pub struct WorkspaceFs {
    store: Arc<ObjectStore>,
    blobs: Arc<BlobCache>,
    upper: Upper,
    pres: Presentation,
    statfs_path: PathBuf,
    state: Mutex<State>,
    /// Opens of base content (blob-cache files): `git status` in a fresh workspace must read none.
    base_content_opens: AtomicU64,
    /// Unix seconds of the last request that touched the workspace's metadata.
    last_activity: AtomicU64,
    /// Catalog batches lost to damage, as reported in `quarantine/README` (kept across restarts).
    damaged: Vec<String>,
    /// What the daemon changed other than through a FUSE request since the kernel was last told
    /// (`None` while nothing is mounted: the kernel has nothing cached). See [`Behind`].
    behind: Mutex<Option<Vec<Behind>>>,
    /// Whether any inode may have an extended attribute: false until the first `setxattr` (or a
    /// loaded record with one). While false, `getxattr` answers "none" without the lock, which the
    /// kernel asks of `security.capability` before every write that could drop privileges.
    any_xattr: AtomicBool,
}

/// Something the daemon changed in the workspace other than through a FUSE request, which the
/// kernel may hold cached (entries and attributes for an hour, directory listings, pages). The
/// daemon hands these to the kernel's invalidation (`docs/caching.md`), from a thread that is not
/// serving FUSE requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behind {
    /// Name `name` in directory `parent` was created, removed or now leads to another inode: the
    /// kernel's entry (or cached absence) of it, and the directory's listing and attributes.
    Entry { parent: u64, name: Vec<u8> },
    /// The attributes or content of inode `ino` changed.
    Inode(u64),
}

/// A consistent view of what differs from the base, read in one critical section.
#[derive(Debug, Clone)]
pub struct View {
    pub base_tree: ObjectId,
    pub edits: Vec<ViewEdit>,
    /// The metadata of every changed node, by path (what git drops of it goes into the
    /// snapshot's POSIX record).
    pub meta: Vec<NodeMeta>,
    /// The workspace's generation when the view was read.
    pub generation: u64,
    /// When the view was read.
    pub taken_at: Ts,
}

impl std::fmt::Debug for WorkspaceFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceFs")
            .field("upper", &self.upper)
            .finish()
    }
}

/// The inode number of base path `path`: the first 8 bytes of its BLAKE3 hash, top bit clear, never
/// 0 or 1 (1 is the root). `salt` moves a colliding path to another number.
pub fn path_ino(path: &[u8], salt: u32) -> u64 {
    if path.is_empty() {
        return ROOT_INO;
    }
    let mut h = blake3::Hasher::new();
    h.update(path);
    if salt != 0 {
        h.update(&salt.to_le_bytes());
    }
    let bytes = h.finalize();
    let n = u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes")) & !ALLOCATED;
    if n < 2 { n + 2 } else { n }
}

/// `SystemTime` for Unix seconds (negative times clamp to the epoch).
pub fn unix_time(secs: i64) -> SystemTime {
    if secs <= 0 {
        UNIX_EPOCH
    } else {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    }
}

fn ts(t: SystemTime) -> Ts {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Ts(d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                Ts(-(d.as_secs() as i64), 0)
            } else {
                Ts(-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn eio(e: impl std::fmt::Display) -> Errno {
    tracing::error!("workspace I/O: {e}");
    Errno::EIO
}

fn io_errno(e: std::io::Error) -> Errno {
    match e.raw_os_error() {
        Some(n) => Errno::from_i32(n),
        None => eio(e),
    }
}

fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        p.extend_from_slice(parent);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn oid(hex: &str) -> Result<ObjectId, Errno> {
    ObjectId::from_hex(hex.as_bytes()).map_err(eio)
}

/// Git orders tree entries by name, with a tree's name compared as if it ended in '/'.
fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        std::cmp::Ordering::Equal => {
            let ac = a.get(n).copied().or(if a_tree { Some(b'/') } else { None });
            let bc = b.get(n).copied().or(if b_tree { Some(b'/') } else { None });
            ac.cmp(&bc)
        }
        o => o,
    }
}

/// Finds `name` in a tree in git order (binary search, trying it as a blob and as a tree).
fn find_entry<'a>(entries: &'a [TreeEntry], name: &[u8]) -> Option<&'a TreeEntry> {
    for as_tree in [false, true] {
        if let Ok(i) = entries.binary_search_by(|e| {
            let e_tree = matches!(e.kind, EntryKind::Tree);
            git_order(&e.name, e_tree, name, as_tree)
        }) && &*entries[i].name == name
        {
            return Some(&entries[i]);
        }
    }
    entries.iter().find(|e| &*e.name == name)
}

fn check_name(name: &OsStr) -> Result<&[u8], Errno> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if b.is_empty() || b.contains(&b'/') {
        return Err(Errno::EINVAL);
    }
    Ok(b)
}

/// The records of one change, applied together.
#[derive(Default)]
struct Tx {
    /// Bookkeeping only: does not count as a change of the workspace's state.
    quiet: bool,
    records: Vec<Record>,
    /// Working copies of the inode records this change modifies, written after `records`.
    recs: BTreeMap<u64, InodeRecord>,
    drops: Vec<u64>,
}

impl Tx {
    fn entry(&mut self, dir: u64, name: &[u8], ino: Option<u64>) {
        self.records.push(Record::Entry {
            dir,
            name: name.to_vec(),
            ino,
        });
    }

    fn drop_inode(&mut self, ino: u64) {
        self.recs.remove(&ino);
        self.drops.push(ino);
    }

    fn into_records(self) -> Vec<Record> {
        let mut out = self.records;
        out.extend(self.recs.into_values().map(Record::Inode));
        out.extend(self.drops.into_iter().map(|ino| Record::Drop { ino }));
        out
    }
}

/// What `make` creates.
struct New<'a> {
    /// Bookkeeping of octofs's own (see [`Tx::quiet`]).
    quiet: bool,
    kind: Kind,
    mode: u32,
    rdev: u32,
    target: Option<Vec<u8>>,
    content: Content<'a>,
}

/// The initial content of a new regular file.
enum Content<'a> {
    Empty,
    Bytes(&'a [u8]),
    /// An immutable host-wide file, read until the first write copies it up.
    Shared(String),
    /// An object of the mirror (a blob, or a gitlink's commit), as if it came from the base.
    Object(BaseRef),
}

/// One change of a tree, applied by [`WorkspaceFs::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeChange {
    Remove,
    File { id: ObjectId, exec: bool },
    Symlink { id: ObjectId },
    Gitlink { id: ObjectId },
}

impl New<'_> {
    fn plain(kind: Kind, mode: u32, rdev: u32) -> New<'static> {
        New {
            quiet: false,
            kind,
            mode,
            rdev,
            target: None,
            content: Content::Empty,
        }
    }
}

impl State {
    fn node(&self, ino: u64) -> Result<&Node, Errno> {
        self.live.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node, Errno> {
        self.live.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// The working copy of `ino`'s record in `tx`.
    fn rec<'t>(&self, tx: &'t mut Tx, ino: u64) -> Result<&'t mut InodeRecord, Errno> {
        match tx.recs.entry(ino) {
            std::collections::btree_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::btree_map::Entry::Vacant(e) => {
                Ok(e.insert(self.node(ino)?.rec.clone()))
            }
        }
    }

    /// Makes sure `ino` and its ancestors are persisted and linked in their parents' overlays.
    fn chain(&self, tx: &mut Tx, ino: u64) -> Result<(), Errno> {
        let mut cur = ino;
        loop {
            let n = self.node(cur)?;
            // An unlinked inode (still open) has no name to be linked under.
            if n.persisted || tx.recs.contains_key(&cur) || n.rec.nlink == 0 {
                return Ok(());
            }
            tx.recs.insert(cur, n.rec.clone());
            if cur == ROOT_INO {
                return Ok(());
            }
            let (parent, name) = (n.rec.parent, n.rec.name.clone());
            tx.entry(parent, &name, Some(cur));
            cur = parent;
        }
    }

    fn alloc(&mut self, tx: &mut Tx) -> u64 {
        let ino = ALLOCATED | self.live.next_ino;
        self.live.next_ino += 1;
        tx.records.push(Record::NextIno {
            next: self.live.next_ino,
        });
        ino
    }

    /// Appends `tx` to the catalog and applies it. Nothing changes if the append fails.
    fn commit(&mut self, tx: Tx) -> Result<(), Errno> {
        let quiet = tx.quiet;
        // An unlinked inode that is still open changes in memory only: it has no place in the
        // catalog (after a restart it is gone, as on any file system).
        let (volatile, mut records): (Vec<Record>, Vec<Record>) = tx
            .into_records()
            .into_iter()
            .partition(|r| matches!(r, Record::Inode(rec) if rec.nlink == 0));
        for r in volatile {
            if let Record::Inode(rec) = r
                && let Some(n) = self.live.inodes.get_mut(&rec.ino)
                && !n.persisted
            {
                n.rec = rec;
            }
        }
        if !quiet {
            records.push(Record::Generation {
                n: self.live.generation + 1,
            });
        }
        if let Err(e) = self.catalog.append(&records) {
            // The allocation counter may have moved: harmless, numbers are never reused.
            return Err(io_errno(e));
        }
        for r in &records {
            self.live.apply(r);
        }
        let nodes = &self.live.inodes;
        if self
            .catalog
            .wants_compaction(|| nodes.values().filter(|n| n.persisted).count())
        {
            let snapshot = self.snapshot();
            if let Err(e) = self.catalog.compact(&snapshot) {
                tracing::warn!("catalog compaction failed (the log keeps growing): {e}");
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> CatalogState {
        CatalogState {
            inodes: self
                .live
                .inodes
                .iter()
                .filter(|(_, n)| n.persisted)
                .map(|(i, n)| (*i, n.rec.clone()))
                .collect(),
            dirs: self.live.dirs.clone(),
            next_ino: self.live.next_ino,
            generation: self.live.generation,
        }
    }
}

impl WorkspaceFs {
    /// Opens the workspace whose upper layer is `upper_dir`, over base tree `root_tree`.
    pub fn load(
        store: Arc<ObjectStore>,
        blobs: Arc<BlobCache>,
        root_tree: ObjectId,
        pres: Presentation,
        upper_dir: &std::path::Path,
        statfs_path: PathBuf,
    ) -> std::io::Result<WorkspaceFs> {
        let upper = Upper::open(upper_dir)?;
        let (catalog, loaded, was_clean) = Catalog::open(upper_dir)?;
        let damage = catalog.damage().to_vec();
        let base_time = ts(pres.time);
        let mut nodes: HashMap<u64, Node> = loaded
            .inodes
            .into_iter()
            .map(|(ino, rec)| (ino, Node::persisted(rec)))
            .collect();
        if let std::collections::hash_map::Entry::Vacant(slot) = nodes.entry(ROOT_INO) {
            let subdirs = store
                .tree(root_tree)?
                .iter()
                .filter(|e| matches!(e.kind, EntryKind::Tree | EntryKind::Gitlink))
                .count() as u32;
            slot.insert(Node {
                rec: InodeRecord {
                    ino: ROOT_INO,
                    kind: Kind::Dir,
                    base: Some(BaseRef {
                        oid: root_tree.to_string(),
                        path: Vec::new(),
                        gitlink: false,
                    }),
                    upper: false,
                    target: None,
                    // The workspace is its owner's (the mount is `allow_other`): other local users,
                    // who may not even be allowed to bind the project, do not enter it unless the
                    // owner opens it up with chmod.
                    mode: 0o700,
                    uid: pres.uid,
                    gid: pres.gid,
                    rdev: 0,
                    atime: base_time,
                    mtime: base_time,
                    ctime: base_time,
                    nlink: 2 + subdirs,
                    parent: ROOT_INO,
                    name: Vec::new(),
                    xattrs: BTreeMap::new(),
                    copied_ctime: None,
                    shared: None,
                },
                persisted: false,
                lookups: 1,
                opens: 0,
                writers: 0,
            });
        }
        if let Some(root) = nodes.get_mut(&ROOT_INO) {
            root.lookups = 1;
        }
        let any_xattr = nodes.values().any(|n| !n.rec.xattrs.is_empty());
        let mut fs = WorkspaceFs {
            store,
            blobs,
            upper,
            pres,
            statfs_path,
            state: Mutex::new(State {
                catalog,
                live: CatalogState {
                    inodes: nodes,
                    dirs: loaded.dirs,
                    next_ino: loaded.next_ino.max(1),
                    generation: loaded.generation,
                },
                journal: Journal::new(),
            }),
            base_content_opens: AtomicU64::new(0),
            last_activity: AtomicU64::new(now_secs()),
            damaged: Vec::new(),
            behind: Mutex::new(None),
            any_xattr: AtomicBool::new(any_xattr),
        };
        if !damage.is_empty() {
            fs.note_catalog_damage(&damage)?;
        }
        if !was_clean || !damage.is_empty() {
            fs.check_after_unclean_stop()?;
        }
        fs.damaged = fs.upper.damage_notes();
        Ok(fs)
    }

    /// A damaged catalog batch was skipped: its note goes to `quarantine/README` (and so into
    /// `status`). The batch may have held the last `NextIno`: the counter moves past every allocated
    /// number still in use (records, entries, data files, which the check that follows quarantines
    /// under their number), so none is handed out twice. A number only the lost batch used may be
    /// reused: nothing refers to it any more, and the kernel has not seen it since the remount.
    fn note_catalog_damage(&self, damage: &[crate::cow::catalog::Damage]) -> std::io::Result<()> {
        let mut st = self.lock();
        let data = self.upper.data_inodes()?;
        let highest = data
            .into_iter()
            .chain(st.live.inodes.keys().copied())
            .chain(st.live.dirs.keys().copied())
            .chain(
                st.live
                    .dirs
                    .values()
                    .flat_map(|m| m.values().flatten().copied()),
            )
            .filter(|ino| ino & ALLOCATED != 0)
            .map(|ino| ino & !ALLOCATED)
            .max()
            .unwrap_or(0);
        if highest >= st.live.next_ino {
            let mut tx = Tx::default();
            tx.records.push(Record::NextIno { next: highest + 1 });
            st.commit(tx)
                .map_err(|e| std::io::Error::from_raw_os_error(e.code()))?;
        }
        for d in damage {
            tracing::warn!("workspace {}: {d}", self.upper.dir().display());
            self.upper.note_damage(&d.to_string())?;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.last_activity.store(now_secs(), Ordering::Relaxed);
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads, in one critical section, every edit that turns the base tree into the working state
    /// (the workspace's own `.git` excluded). Cost: O(changed paths). Content is not read: copied-up
    /// files are named by their data file, read later without the lock.
    pub fn view(&self) -> Result<View, Errno> {
        // Taken before the lock: whatever changes after this may or may not be in the view, so it
        // counts as a change since it (see `changed_since`).
        let taken_at = self.upper.clock().map_err(io_errno)?;
        let st = self.lock();
        let root = st.node(ROOT_INO)?;
        let (root_tree, _) =
            Self::base_tree(&root.rec).ok_or_else(|| eio("the root has no base tree"))?;
        let mut edits = Vec::new();
        self.view_dir(
            &st,
            ROOT_INO,
            b"",
            Some(root_tree),
            Some(root_tree),
            &mut edits,
        )?;
        let meta = self.view_meta(&st)?;
        Ok(View {
            base_tree: root_tree,
            edits,
            meta,
            generation: st.live.generation,
            taken_at,
        })
    }

    /// `editor_base`: the tree the base has at `path` once the edits above it are applied;
    /// `root_base`: the tree the base commit has at `path`.
    fn view_dir(
        &self,
        st: &State,
        dir: u64,
        path: &[u8],
        editor_base: Option<ObjectId>,
        root_base: Option<ObjectId>,
        out: &mut Vec<ViewEdit>,
    ) -> Result<(), Errno> {
        let rec = &st.node(dir)?.rec;
        let own = Self::base_tree(rec).map(|(t, _)| t);
        let mut eff = editor_base;
        if root_base.is_none() && dir != ROOT_INO {
            out.push(ViewEdit::AddedDir {
                path: path.to_vec(),
            });
        }
        if own != editor_base {
            match own {
                Some(t) => out.push(ViewEdit::Tree {
                    path: path.to_vec(),
                    id: t,
                }),
                None if editor_base.is_some() => out.push(ViewEdit::Remove {
                    path: path.to_vec(),
                }),
                None => {}
            }
            eff = own;
        }
        let Some(overlay) = st.live.dirs.get(&dir) else {
            return Ok(());
        };
        let eff_entries = match eff {
            Some(t) => Some(self.store.tree(t).map_err(eio)?),
            None => None,
        };
        let rb_entries = match root_base {
            Some(t) => Some(self.store.tree(t).map_err(eio)?),
            None => None,
        };
        for (name, target) in overlay {
            if dir == ROOT_INO && name == b".git" {
                continue;
            }
            let cp = join(path, name);
            let eff_child = eff_entries
                .as_ref()
                .and_then(|e| find_entry(e, name))
                .cloned();
            let rb_child = rb_entries
                .as_ref()
                .and_then(|e| find_entry(e, name))
                .cloned();
            let tree_of = |e: &Option<TreeEntry>| {
                e.as_ref()
                    .filter(|e| e.kind == EntryKind::Tree)
                    .map(|e| e.id)
            };
            let Some(ino) = target else {
                if eff_child.is_some() {
                    out.push(ViewEdit::Remove { path: cp });
                }
                continue;
            };
            let n = &st.node(*ino)?.rec;
            let base_id = n
                .base
                .as_ref()
                .and_then(|b| ObjectId::from_hex(b.oid.as_bytes()).ok());
            let unchanged_as = |kind: EntryKind| {
                eff_child
                    .as_ref()
                    .is_some_and(|e| e.kind == kind && Some(e.id) == base_id)
            };
            let added = rb_child
                .as_ref()
                .is_none_or(|e| matches!(e.kind, EntryKind::Tree | EntryKind::Gitlink));
            match n.kind {
                Kind::Dir if n.base.as_ref().is_some_and(|b| b.gitlink) => {
                    if !unchanged_as(EntryKind::Gitlink)
                        && let Some(id) = base_id
                    {
                        out.push(ViewEdit::Gitlink { path: cp, id });
                    }
                }
                Kind::Dir => {
                    // A directory where the base has a file: the file goes first.
                    if eff_child
                        .as_ref()
                        .is_some_and(|e| e.kind != EntryKind::Tree)
                    {
                        out.push(ViewEdit::Remove { path: cp.clone() });
                    }
                    self.view_dir(st, *ino, &cp, tree_of(&eff_child), tree_of(&rb_child), out)?
                }
                Kind::File => {
                    let exec = n.mode & 0o100 != 0;
                    let kind = if exec {
                        EntryKind::Executable
                    } else {
                        EntryKind::Blob
                    };
                    let source = if n.upper {
                        ViewSource::File(self.upper.data_path(n.ino))
                    } else if let Some(shared) = &n.shared {
                        ViewSource::File(PathBuf::from(shared))
                    } else if let Some(id) = base_id {
                        if unchanged_as(kind) {
                            continue;
                        }
                        ViewSource::Object(id)
                    } else {
                        ViewSource::Bytes(Vec::new())
                    };
                    out.push(ViewEdit::File {
                        path: cp,
                        exec,
                        source,
                        added,
                    });
                }
                Kind::Symlink => {
                    let source = match (&n.target, base_id) {
                        (Some(t), _) => ViewSource::Bytes(t.clone()),
                        (None, Some(id)) => {
                            if unchanged_as(EntryKind::Symlink) {
                                continue;
                            }
                            ViewSource::Object(id)
                        }
                        (None, None) => ViewSource::Bytes(Vec::new()),
                    };
                    out.push(ViewEdit::Symlink {
                        path: cp,
                        source,
                        added,
                    });
                }
                // git keeps no fifos, sockets or devices: such a name is not part of the state.
                _ => {
                    if eff_child.is_some() {
                        out.push(ViewEdit::Remove { path: cp });
                    }
                }
            }
        }
        Ok(())
    }

    /// Every file, symlink and gitlink below tree `id`, with paths relative to it, as the edits that
    /// would add them (used when a moved directory must be taken apart).
    pub fn tree_files(&self, id: ObjectId) -> Result<Vec<(Vec<u8>, ViewEdit)>, Errno> {
        let mut out = Vec::new();
        let mut stack = vec![(Vec::new(), id)];
        while let Some((prefix, tree)) = stack.pop() {
            for e in self.store.tree(tree).map_err(eio)?.iter() {
                let p = join(&prefix, &e.name);
                let edit = match e.kind {
                    EntryKind::Tree => {
                        stack.push((p, e.id));
                        continue;
                    }
                    EntryKind::Blob | EntryKind::Executable => ViewEdit::File {
                        path: Vec::new(),
                        exec: e.kind == EntryKind::Executable,
                        source: ViewSource::Object(e.id),
                        added: true,
                    },
                    EntryKind::Symlink => ViewEdit::Symlink {
                        path: Vec::new(),
                        source: ViewSource::Object(e.id),
                        added: true,
                    },
                    EntryKind::Gitlink => ViewEdit::Gitlink {
                        path: Vec::new(),
                        id: e.id,
                    },
                };
                out.push((p, edit));
            }
        }
        Ok(out)
    }

    /// "Now" on the clock of the upper layer's files (see [`Upper::clock`]).
    pub fn clock(&self) -> Result<Ts, Errno> {
        self.upper.clock().map_err(io_errno)
    }

    /// The workspace's generation (committed batches since creation).
    pub fn generation(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .live
            .generation
    }

    /// Whether anything may have changed since a view of `generation` read at `at`: metadata
    /// (generation), a file open for writing now, or a copied-up file written since (writes through
    /// passthrough reach the data file without the daemon).
    pub fn changed_since(&self, generation: u64, at: Ts, bookkeeping: &[u64]) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.live.generation != generation || st.live.inodes.values().any(|n| n.writers > 0) {
            return true;
        }
        // git writes its own files as new files (metadata changes, counted by the generation), so
        // `.git` is left out here: its files written just before the mark share its clock tick.
        st.live
            .inodes
            .values()
            .filter(|n| n.persisted && n.rec.upper && !bookkeeping.contains(&n.rec.ino))
            .filter(|n| Self::path_of(&st, n.rec.ino).is_none_or(|p| !p.starts_with(b".git/")))
            .any(|n| {
                std::fs::metadata(self.upper.data_path(n.rec.ino))
                    .map(|m| Ts(m.ctime(), m.ctime_nsec() as u32) >= at)
                    .unwrap_or(true)
            })
    }

    /// Unix seconds of the last metadata request, and whether any file is open now.
    pub fn activity(&self) -> (u64, bool) {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let open = st.live.inodes.values().any(|n| n.opens > 0);
        (self.last_activity.load(Ordering::Relaxed), open)
    }

    pub fn blob_cache(&self) -> &BlobCache {
        &self.blobs
    }

    /// After an unclean stop: data files nobody points at go to quarantine; records whose data file
    /// is missing get an empty one (and a note in quarantine); entries naming unknown inodes go.
    fn check_after_unclean_stop(&self) -> std::io::Result<()> {
        let mut st = self.lock();
        let mut fixed = 0;
        for ino in self.upper.data_inodes()? {
            let known = st
                .live
                .inodes
                .get(&ino)
                .is_some_and(|n| n.persisted && n.rec.upper);
            if !known {
                let dest = self.upper.orphan(
                    ino,
                    "data file without a catalog record after an unclean stop",
                )?;
                match dest {
                    Some(dest) => tracing::warn!(ino, "quarantined {}", dest.display()),
                    None => tracing::info!(ino, "removed a data file nothing acknowledged"),
                }
                fixed += 1;
            }
        }
        let missing: Vec<u64> = st
            .live
            .inodes
            .values()
            .filter(|n| n.persisted && n.rec.upper && !self.upper.data_path(n.rec.ino).exists())
            .map(|n| n.rec.ino)
            .collect();
        for ino in missing {
            let t = st.live.inodes[&ino].rec.mtime;
            self.upper.create(ino, None, t, t)?;
            let q = self.upper.dir().join("quarantine");
            std::fs::create_dir_all(&q)?;
            use std::io::Write;
            let mut notes = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(q.join("README"))?;
            writeln!(
                notes,
                "{ino:016x}: data file missing after an unclean stop; presented empty"
            )?;
            fixed += 1;
        }
        let dangling: Vec<(u64, Vec<u8>)> = st
            .live
            .dirs
            .iter()
            .flat_map(|(d, m)| {
                m.iter()
                    .filter(|(_, i)| {
                        i.is_some_and(|i| !st.live.inodes.get(&i).is_some_and(|n| n.persisted))
                    })
                    .map(move |(n, _)| (*d, n.clone()))
            })
            .collect();
        if !dangling.is_empty() {
            let mut tx = Tx::default();
            for (dir, name) in dangling {
                tracing::warn!(dir, name = %String::from_utf8_lossy(&name), "dropping an entry to an unknown inode");
                tx.records.push(Record::Unentry { dir, name });
                fixed += 1;
            }
            st.commit(tx)
                .map_err(|e| std::io::Error::from_raw_os_error(e.code()))?;
        }
        if fixed > 0 {
            tracing::warn!(fixed, "workspace checked after an unclean stop");
        }
        Ok(())
    }

    /// Leaves the catalog compacted with the clean-stop marker (called when the mount ends).
    pub fn close(&self) {
        let mut st = self.lock();
        let snap = st.snapshot();
        if let Err(e) = st.catalog.close_clean(&snap) {
            tracing::error!("cannot close the catalog cleanly: {e}");
        }
    }

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

    fn note_behind(&self, what: Behind) {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = b.as_mut() {
            v.push(what);
        }
    }

    /// [`Self::note_behind`] of a name.
    fn entry_behind(&self, parent: u64, name: &[u8]) {
        self.note_behind(Behind::Entry {
            parent,
            name: name.to_vec(),
        });
    }

    fn derived_rec(
        &self,
        parent: u64,
        parent_path: &[u8],
        e: &TreeEntry,
        ino: u64,
    ) -> Result<InodeRecord, Errno> {
        let t = ts(self.pres.time);
        let (kind, mode, nlink) = match e.kind {
            EntryKind::Tree => {
                let subdirs = self
                    .store
                    .tree(e.id)
                    .map_err(eio)?
                    .iter()
                    .filter(|c| matches!(c.kind, EntryKind::Tree | EntryKind::Gitlink))
                    .count() as u32;
                (Kind::Dir, 0o755, 2 + subdirs)
            }
            EntryKind::Gitlink => (Kind::Dir, 0o755, 2),
            EntryKind::Blob => (Kind::File, 0o644, 1),
            EntryKind::Executable => (Kind::File, 0o755, 1),
            EntryKind::Symlink => (Kind::Symlink, 0o777, 1),
        };
        Ok(InodeRecord {
            ino,
            kind,
            base: Some(BaseRef {
                oid: e.id.to_string(),
                path: join(parent_path, &e.name),
                gitlink: e.kind == EntryKind::Gitlink,
            }),
            upper: false,
            target: None,
            mode,
            uid: self.pres.uid,
            gid: self.pres.gid,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            nlink,
            parent,
            name: e.name.to_vec(),
            xattrs: BTreeMap::new(),
            copied_ctime: None,
            shared: None,
        })
    }

    /// The base tree a directory node lists (None for new directories and gitlinks).
    fn base_tree(rec: &InodeRecord) -> Option<(ObjectId, &[u8])> {
        let b = rec.base.as_ref()?;
        if rec.kind != Kind::Dir || b.gitlink {
            return None;
        }
        ObjectId::from_hex(b.oid.as_bytes())
            .ok()
            .map(|o| (o, &b.path[..]))
    }

    /// The inode number for base path `path`, salted past a different path holding the plain hash.
    fn derived_ino(st: &State, path: &[u8]) -> u64 {
        let mut salt = 0;
        loop {
            let ino = path_ino(path, salt);
            match st.live.inodes.get(&ino) {
                Some(n) if n.rec.base.as_ref().is_some_and(|b| b.path != path) => salt += 1,
                _ => return ino,
            }
        }
    }

    /// The inode `name` names in directory `parent`, registering a derived node if needed.
    fn resolve(&self, st: &mut State, parent: u64, name: &[u8]) -> Result<Option<u64>, Errno> {
        let p = st.node(parent)?;
        if p.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if p.rec.nlink == 0 {
            return Ok(None);
        }
        if let Some(e) = st.live.dirs.get(&parent).and_then(|d| d.get(name)) {
            return Ok(*e);
        }
        let Some((tree, parent_path)) = Self::base_tree(&p.rec) else {
            return Ok(None);
        };
        let parent_path = parent_path.to_vec();
        let entries = self.store.tree(tree).map_err(eio)?;
        let Some(e) = find_entry(&entries, name) else {
            return Ok(None);
        };
        let path = join(&parent_path, name);
        let ino = Self::derived_ino(st, &path);
        if let std::collections::hash_map::Entry::Vacant(slot) = st.live.inodes.entry(ino) {
            let rec = self.derived_rec(parent, &parent_path, e, ino)?;
            slot.insert(Node {
                rec,
                persisted: false,
                lookups: 0,
                opens: 0,
                writers: 0,
            });
        }
        Ok(Some(ino))
    }

    fn attr(&self, rec: &InodeRecord) -> Result<FileAttr, Errno> {
        let (mut atime, mut mtime, mut ctime) = (rec.atime, rec.mtime, rec.ctime);
        let (size, blocks) = match rec.kind {
            Kind::File if rec.upper => {
                let m = std::fs::metadata(self.upper.data_path(rec.ino)).map_err(eio)?;
                atime = Ts(m.atime(), m.atime_nsec() as u32);
                mtime = Ts(m.mtime(), m.mtime_nsec() as u32);
                let data_ctime = Ts(m.ctime(), m.ctime_nsec() as u32);
                if rec.copied_ctime.is_none_or(|c| data_ctime > c) {
                    ctime = ctime.max(data_ctime);
                }
                (m.len(), m.blocks())
            }
            Kind::File if rec.shared.is_some() => {
                let m =
                    std::fs::metadata(rec.shared.as_deref().unwrap_or_default()).map_err(eio)?;
                (m.len(), m.blocks())
            }
            Kind::File | Kind::Symlink => {
                let size = match (&rec.target, &rec.base) {
                    (Some(t), _) => t.len() as u64,
                    (None, Some(b)) => self.store.blob_size(oid(&b.oid)?).map_err(eio)?,
                    (None, None) => 0,
                };
                (size, size.div_ceil(512))
            }
            Kind::Dir => (4096, 8),
            _ => (0, 0),
        };
        Ok(FileAttr {
            ino: INodeNo(rec.ino),
            size,
            blocks,
            atime: system_time(atime),
            mtime: system_time(mtime),
            ctime: system_time(ctime),
            crtime: system_time(ctime),
            kind: match rec.kind {
                Kind::File => FileType::RegularFile,
                Kind::Dir => FileType::Directory,
                Kind::Symlink => FileType::Symlink,
                Kind::Fifo => FileType::NamedPipe,
                Kind::Socket => FileType::Socket,
                Kind::Char => FileType::CharDevice,
                Kind::Block => FileType::BlockDevice,
            },
            perm: (rec.mode & 0o7777) as u16,
            nlink: rec.nlink,
            uid: rec.uid,
            gid: rec.gid,
            rdev: rec.rdev,
            blksize: 4096,
            flags: 0,
        })
    }

    /// The path of `ino` in the workspace, walking names up to the root; `None` when it is not
    /// unique (a file with several links) or not known.
    fn path_of(st: &State, ino: u64) -> Option<Vec<u8>> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ROOT_INO {
                parts.reverse();
                return Some(parts.join(&b'/'));
            }
            let n = st.live.inodes.get(&cur)?;
            if n.rec.kind != Kind::Dir && n.rec.nlink > 1 {
                return None;
            }
            parts.push(&n.rec.name);
            cur = n.rec.parent;
        }
        None
    }

    fn journal_ino(&self, st: &mut State, ino: u64) {
        let path = Self::path_of(st, ino).map(|mut p| {
            if st
                .live
                .inodes
                .get(&ino)
                .is_some_and(|n| n.rec.kind == Kind::Dir)
                && !p.is_empty()
            {
                p.push(b'/');
            }
            p
        });
        st.journal.note(path.unwrap_or_default());
    }

    fn journal_name(&self, st: &mut State, dir: u64, name: &[u8], is_dir: bool) {
        let path = Self::path_of(st, dir).map(|p| {
            let mut p = join(&p, name);
            if is_dir {
                p.push(b'/');
            }
            p
        });
        st.journal.note(path.unwrap_or_default());
    }

    /// git's fsmonitor query: the new token and what changed since `token` (paths relative to the
    /// workspace root; directories end in `/`), including files open for writing right now.
    pub fn fsmonitor_query(&self, token: &str) -> (String, Changed) {
        if token == crate::repo::BASE_TOKEN {
            // The state the shared index describes: what differs from the base is in the catalog.
            let new = self.lock().journal.token();
            return match self.changes() {
                Ok(changes) => {
                    let st = self.lock();
                    let mut paths: Vec<Vec<u8>> = changes
                        .into_iter()
                        .map(|c| {
                            let mut p = c.path.into_bytes();
                            if c.dir {
                                p.push(b'/');
                            }
                            p
                        })
                        .collect();
                    for n in st.live.inodes.values().filter(|n| n.writers > 0) {
                        match Self::path_of(&st, n.rec.ino) {
                            Some(p) => paths.push(p),
                            None => return (new, Changed::Everything),
                        }
                    }
                    paths.sort();
                    paths.dedup();
                    (new, Changed::Paths(paths))
                }
                Err(_) => (new, Changed::Everything),
            };
        }
        let st = self.lock();
        let new = st.journal.token();
        let Some(mut paths) = st.journal.since(token) else {
            return (new, Changed::Everything);
        };
        for n in st.live.inodes.values().filter(|n| n.writers > 0) {
            match Self::path_of(&st, n.rec.ino) {
                Some(p) => paths.push(p),
                None => return (new, Changed::Everything),
            }
        }
        paths.sort();
        paths.dedup();
        (new, Changed::Paths(paths))
    }

    /// Opens of base content so far.
    pub fn base_content_opens(&self) -> u64 {
        self.base_content_opens.load(Ordering::Relaxed)
    }

    fn reap(&self, st: &mut State, ino: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Some(n) = st.live.inodes.get(&ino) else {
            return;
        };
        if n.lookups == 0 && n.opens == 0 && !n.persisted {
            let upper = n.rec.upper && n.rec.nlink == 0;
            st.live.inodes.remove(&ino);
            if upper {
                self.upper.remove(ino);
            }
        }
    }

    // ----- lookups and attributes -----

    /// `lookup`: the attributes of `name` in `parent`, counting one kernel reference.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let name = check_name(name)?;
        let mut st = self.lock();
        let ino = self.resolve(&mut st, parent, name)?.ok_or(Errno::ENOENT)?;
        let n = st.node_mut(ino)?;
        n.lookups += 1;
        let rec = n.rec.clone();
        self.attr(&rec)
    }

    /// `forget`: the kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut st = self.lock();
        if let Some(node) = st.live.inodes.get_mut(&ino) {
            node.lookups = node.lookups.saturating_sub(n);
        }
        self.reap(&mut st, ino);
    }

    pub fn getattr(&self, ino: u64) -> Result<FileAttr, Errno> {
        let rec = self.lock().node(ino)?.rec.clone();
        self.attr(&rec)
    }

    /// Whether the content of `ino` is the workspace's own data file.
    pub fn is_upper(&self, ino: u64) -> bool {
        self.lock()
            .live
            .inodes
            .get(&ino)
            .is_some_and(|n| n.rec.upper)
    }

    /// The whole listing of directory `ino`, `.` and `..` first. Entries are not counted as kernel
    /// references; readdirplus calls [`Self::listed`] for each one it returns.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>, Errno> {
        let st = self.lock();
        let n = st.node(ino)?;
        if n.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let rec = n.rec.clone();
        let dot = self.attr(&rec)?;
        let parent_attr = FileAttr {
            ino: INodeNo(if ino == ROOT_INO {
                ROOT_INO
            } else {
                rec.parent
            }),
            ..dot
        };
        let mut out = vec![
            DirEntry {
                name: ".".into(),
                attr: dot,
            },
            DirEntry {
                name: "..".into(),
                attr: parent_attr,
            },
        ];
        if rec.nlink == 0 {
            return Ok(out);
        }
        let overlay = st.live.dirs.get(&ino).cloned().unwrap_or_default();
        if let Some((tree, path)) = Self::base_tree(&rec) {
            let path = path.to_vec();
            for e in self.store.tree(tree).map_err(eio)?.iter() {
                if overlay.contains_key(&*e.name) {
                    continue;
                }
                let child_path = join(&path, &e.name);
                let child = Self::derived_ino(&st, &child_path);
                let child_rec = match st.live.inodes.get(&child) {
                    Some(n) => n.rec.clone(),
                    None => self.derived_rec(ino, &path, e, child)?,
                };
                out.push(DirEntry {
                    name: OsString::from_vec(e.name.to_vec()),
                    attr: self.attr(&child_rec)?,
                });
            }
        }
        for (name, target) in &overlay {
            let Some(child) = target else { continue };
            let child_rec = st.node(*child)?.rec.clone();
            out.push(DirEntry {
                name: OsString::from_vec(name.clone()),
                attr: self.attr(&child_rec)?,
            });
        }
        drop(st);
        Ok(out)
    }

    /// readdirplus hands the entry `name` of `parent` to the kernel: the current attributes of the
    /// inode the name has now (`None`: the name is gone), counting the kernel's reference to it.
    ///
    /// The listing a readdirplus serves was read at the first readdir of its handle, and the kernel
    /// applies the attributes of every entry to its cached inode as if they were current: served
    /// from the listing, a file written since then would read as its old size (see
    /// docs/caching.md). So they are read again here, when the request is answered.
    pub fn listed(&self, parent: u64, name: &OsStr) -> Result<Option<FileAttr>, Errno> {
        let mut st = self.lock();
        let Some(ino) = self.resolve(&mut st, parent, name.as_bytes())? else {
            return Ok(None);
        };
        let rec = st.node(ino)?.rec.clone();
        let attr = self.attr(&rec)?;
        st.node_mut(ino)?.lookups += 1;
        Ok(Some(attr))
    }

    pub fn opendir(&self, ino: u64) -> Result<(), Errno> {
        match self.lock().node(ino)?.rec.kind {
            Kind::Dir => Ok(()),
            _ => Err(Errno::ENOTDIR),
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>, Errno> {
        let rec = self.lock().node(ino)?.rec.clone();
        if rec.kind != Kind::Symlink {
            return Err(Errno::EINVAL);
        }
        match (rec.target, rec.base) {
            (Some(t), _) => Ok(t),
            (None, Some(b)) => self.store.blob(oid(&b.oid)?).map_err(eio),
            (None, None) => Ok(Vec::new()),
        }
    }

    pub fn access(&self, ino: u64, _mask: i32) -> Result<(), Errno> {
        self.lock().node(ino).map(|_| ())
    }

    pub fn statfs(&self) -> Result<crate::sys::FsStats, Errno> {
        crate::sys::statvfs(&self.statfs_path)
            .map(|mut s| {
                s.namelen = NAME_MAX as u32;
                s
            })
            .map_err(io_errno)
    }

    // ----- content -----

    /// The read-only file holding the content of a file that is not copied up: its blob in the
    /// shared blob cache (filled on first use), or its shared host-wide file.
    fn source_file(&self, rec: &InodeRecord) -> Result<File, Errno> {
        if let Some(shared) = &rec.shared {
            return File::open(shared).map_err(eio);
        }
        let base = rec
            .base
            .as_ref()
            .ok_or_else(|| eio("a file with no content source"))?;
        let id = oid(&base.oid)?;
        let size = self.store.blob_size(id).map_err(eio)?;
        self.base_content_opens.fetch_add(1, Ordering::Relaxed);
        // Filling the cache needs disk: a full one answers ENOSPC, not EIO.
        self.blobs.open(&self.store, id, size).map_err(io_errno)
    }

    /// Copies `ino` up into its data file (empty when `empty`), keeping its number and times.
    fn copy_up(&self, st: &mut State, ino: u64, empty: bool) -> Result<(), Errno> {
        let rec = st.node(ino)?.rec.clone();
        if rec.kind != Kind::File || rec.upper {
            return Ok(());
        }
        if empty {
            self.upper
                .create(ino, None, rec.atime, rec.mtime)
                .map_err(io_errno)?;
        } else {
            let mut src = self.source_file(&rec)?;
            self.upper
                .create(ino, Some(&mut src), rec.atime, rec.mtime)
                .map_err(io_errno)?;
        }
        let copied = std::fs::metadata(self.upper.data_path(ino))
            .map(|m| Ts(m.ctime(), m.ctime_nsec() as u32))
            .map_err(eio)?;
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.upper = true;
        r.shared = None;
        r.copied_ctime = Some(copied);
        if let Err(e) = st.commit(tx) {
            self.upper.remove(ino);
            return Err(e);
        }
        Ok(())
    }

    /// Opens `ino`. Any write intent (write access or `O_TRUNC`) copies the file up first; `O_TRUNC`
    /// copies no data.
    pub fn open(&self, ino: u64, flags: i32) -> Result<Opened, Errno> {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let trunc = flags & libc::O_TRUNC != 0;
        let mut st = self.lock();
        let rec = st.node(ino)?.rec.clone();
        match rec.kind {
            Kind::File => {}
            Kind::Dir => return Err(Errno::EISDIR),
            Kind::Symlink => return Err(Errno::ELOOP),
            _ => return Err(Errno::ENXIO),
        }
        let opened = if rec.upper || write || trunc {
            if !rec.upper {
                self.copy_up(&mut st, ino, trunc)?;
            }
            let f = self.upper.open_data(ino).map_err(io_errno)?;
            if trunc {
                f.set_len(0).map_err(io_errno)?;
            }
            Opened {
                file: f,
                upper: true,
                write: write || trunc,
            }
        } else {
            drop(st);
            // Filling the blob cache may take a while: not under the workspace lock.
            let file = self.source_file(&rec)?;
            st = self.lock();
            Opened {
                file,
                upper: false,
                write: false,
            }
        };
        let n = st.node_mut(ino)?;
        n.opens += 1;
        if write || trunc {
            n.writers += 1;
            self.journal_ino(&mut st, ino);
        }
        Ok(opened)
    }

    /// Opens the current data file of an upper inode (for a handle opened before its copy-up).
    pub fn open_data(&self, ino: u64) -> Result<File, Errno> {
        self.upper.open_data(ino).map_err(io_errno)
    }

    /// An open handle of `ino` was closed (`wrote`: it was opened for writing).
    pub fn release(&self, ino: u64, wrote: bool) {
        let mut st = self.lock();
        if let Some(n) = st.live.inodes.get_mut(&ino) {
            n.opens = n.opens.saturating_sub(1);
            if wrote {
                n.writers = n.writers.saturating_sub(1);
            }
        }
        if wrote {
            self.journal_ino(&mut st, ino);
        }
        self.reap(&mut st, ino);
    }

    /// For a write to a file whose base content readers hold open through passthrough: moves the
    /// name to a new, copied-up inode and leaves the old inode (unlinked) to those readers. Returns
    /// false when that is not possible (a hardlinked or already-copied file).
    pub fn reinode_for_write(&self, ino: u64) -> Result<bool, Errno> {
        let mut st = self.lock();
        let rec = st.node(ino)?.rec.clone();
        if rec.kind != Kind::File || rec.upper || rec.nlink != 1 {
            return Ok(false);
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, rec.parent)?;
        let new = st.alloc(&mut tx);
        let mut src = self.source_file(&rec)?;
        self.upper
            .create(new, Some(&mut src), rec.atime, rec.mtime)
            .map_err(io_errno)?;
        let copied = std::fs::metadata(self.upper.data_path(new))
            .map(|m| Ts(m.ctime(), m.ctime_nsec() as u32))
            .map_err(eio)?;
        tx.entry(rec.parent, &rec.name, Some(new));
        tx.recs.insert(
            new,
            InodeRecord {
                ino: new,
                upper: true,
                shared: None,
                copied_ctime: Some(copied),
                ..rec.clone()
            },
        );
        tx.drop_inode(ino);
        if let Err(e) = st.commit(tx) {
            self.upper.remove(new);
            return Err(e);
        }
        self.journal_ino(&mut st, new);
        Ok(true)
    }

    /// Makes `fsync` of a file or directory durable for the catalog too.
    pub fn sync_catalog(&self) -> Result<(), Errno> {
        self.lock().catalog.sync().map_err(io_errno)
    }

    // ----- creating and removing names -----

    fn parent_for_create(&self, st: &mut State, parent: u64, name: &[u8]) -> Result<(), Errno> {
        let p = st.node(parent)?;
        if p.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if p.rec.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if self.resolve(st, parent, name)?.is_some() {
            return Err(Errno::EEXIST);
        }
        Ok(())
    }

    /// Removes `name` from `dir` in `tx`: hides a base entry, or forgets an entry the workspace made.
    fn unlink_name(&self, st: &State, tx: &mut Tx, dir: u64, name: &[u8]) -> Result<(), Errno> {
        let in_base = match Self::base_tree(&st.node(dir)?.rec) {
            Some((tree, _)) => find_entry(&self.store.tree(tree).map_err(eio)?, name).is_some(),
            None => false,
        };
        if in_base {
            tx.entry(dir, name, None);
        } else {
            tx.records.push(Record::Unentry {
                dir,
                name: name.to_vec(),
            });
        }
        Ok(())
    }

    /// `ino` (still linked elsewhere) loses its name `name` in `dir`: if that was the name its record
    /// remembers, remember another of its names instead.
    fn repoint_primary(
        st: &State,
        tx: &mut Tx,
        ino: u64,
        dir: u64,
        name: &[u8],
    ) -> Result<(), Errno> {
        let r = st.rec(tx, ino)?;
        if r.parent != dir || r.name != name {
            return Ok(());
        }
        let other = st.live.dirs.iter().find_map(|(d, entries)| {
            entries
                .iter()
                .find(|(n, i)| **i == Some(ino) && !(*d == dir && n.as_slice() == name))
                .map(|(n, _)| (*d, n.clone()))
        });
        if let Some((d, n)) = other {
            r.parent = d;
            r.name = n;
        }
        Ok(())
    }

    fn touch_dir(st: &State, tx: &mut Tx, dir: u64, now: Ts) -> Result<(), Errno> {
        let r = st.rec(tx, dir)?;
        r.mtime = now;
        r.ctime = now;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        parent: u64,
        name: &OsStr,
        new: New<'_>,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        let New {
            quiet,
            kind,
            mode,
            rdev,
            target,
            content,
        } = new;
        let name = check_name(name)?;
        let mut st = self.lock();
        self.parent_for_create(&mut st, parent, name)?;
        let now = Ts::now();
        let mut tx = Tx {
            quiet,
            ..Tx::default()
        };
        st.chain(&mut tx, parent)?;
        let ino = st.alloc(&mut tx);
        let p = st.rec(&mut tx, parent)?;
        let (gid, mut mode) = if p.mode & libc::S_ISGID != 0 {
            (p.gid, mode & 0o7777)
        } else {
            (caller.gid, mode & 0o7777)
        };
        if kind == Kind::Dir {
            p.nlink += 1;
            if p.mode & libc::S_ISGID != 0 {
                mode |= libc::S_ISGID;
            }
        }
        p.mtime = now;
        p.ctime = now;
        let upper = kind == Kind::File && matches!(content, Content::Empty | Content::Bytes(_));
        if upper {
            self.upper.create(ino, None, now, now).map_err(io_errno)?;
            if let Content::Bytes(b) = content {
                use std::io::Write;
                let written = self.upper.open_data(ino).and_then(|mut f| f.write_all(b));
                if let Err(e) = written {
                    self.upper.remove(ino);
                    return Err(io_errno(e));
                }
            }
        }
        let base = match &content {
            Content::Object(b) => Some(b.clone()),
            _ => None,
        };
        let rec = InodeRecord {
            ino,
            kind,
            base,
            upper,
            target,
            mode,
            uid: caller.uid,
            gid,
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            parent,
            name: name.to_vec(),
            xattrs: BTreeMap::new(),
            copied_ctime: None,
            shared: match content {
                Content::Shared(p) => Some(p),
                _ => None,
            },
        };
        tx.entry(parent, name, Some(ino));
        tx.recs.insert(ino, rec.clone());
        if let Err(e) = st.commit(tx) {
            if upper {
                self.upper.remove(ino);
            }
            return Err(e);
        }
        st.node_mut(ino)?.lookups += 1;
        self.journal_name(&mut st, parent, name, kind == Kind::Dir);
        drop(st);
        self.attr(&rec)
    }

    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::Char,
            libc::S_IFBLK => Kind::Block,
            libc::S_IFDIR => return Err(Errno::EPERM),
            _ => return Err(Errno::EINVAL),
        };
        self.make(parent, name, New::plain(kind, mode, rdev), caller)
    }

    pub fn mkdir(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        self.make(parent, name, New::plain(Kind::Dir, mode, 0), caller)
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &[u8],
        caller: Caller,
    ) -> Result<FileAttr, Errno> {
        if target.len() >= 4096 {
            return Err(Errno::ENAMETOOLONG);
        }
        let new = New {
            target: Some(target.to_vec()),
            ..New::plain(Kind::Symlink, 0o777, 0)
        };
        self.make(parent, name, new, caller)
    }

    /// `create`: a new regular file, opened.
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
    ) -> Result<(FileAttr, Opened), Errno> {
        let attr = self.make(parent, name, New::plain(Kind::File, mode, 0), caller)?;
        match self.open(attr.ino.0, flags & !libc::O_TRUNC) {
            Ok(o) => Ok((attr, o)),
            Err(e) => {
                self.forget(attr.ino.0, 1);
                Err(e)
            }
        }
    }

    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let name = check_name(name)?;
        let mut st = self.lock();
        let ino = self.resolve(&mut st, parent, name)?.ok_or(Errno::ENOENT)?;
        let rec = st.node(ino)?.rec.clone();
        match (dir, rec.kind == Kind::Dir) {
            (false, true) => return Err(Errno::EISDIR),
            (true, false) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        if dir && !self.is_empty_dir(&mut st, ino)? {
            return Err(Errno::ENOTEMPTY);
        }
        let now = Ts::now();
        let mut tx = Tx::default();
        st.chain(&mut tx, parent)?;
        self.unlink_name(&st, &mut tx, parent, name)?;
        Self::touch_dir(&st, &mut tx, parent, now)?;
        if dir {
            st.rec(&mut tx, parent)?.nlink -= 1;
            tx.drop_inode(ino);
        } else {
            let r = st.rec(&mut tx, ino)?;
            r.nlink = r.nlink.saturating_sub(1);
            r.ctime = now;
            if r.nlink == 0 {
                tx.drop_inode(ino);
            } else {
                Self::repoint_primary(&st, &mut tx, ino, parent, name)?;
            }
        }
        st.commit(tx)?;
        self.journal_name(&mut st, parent, name, dir);
        self.reap(&mut st, ino);
        Ok(())
    }

    pub fn unlink(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        self.remove(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        self.remove(parent, name, true)
    }

    fn is_empty_dir(&self, st: &mut State, ino: u64) -> Result<bool, Errno> {
        let rec = st.node(ino)?.rec.clone();
        let overlay = st.live.dirs.get(&ino);
        if overlay.is_some_and(|o| o.values().any(|v| v.is_some())) {
            return Ok(false);
        }
        if let Some((tree, _)) = Self::base_tree(&rec) {
            for e in self.store.tree(tree).map_err(eio)?.iter() {
                if !overlay.is_some_and(|o| o.contains_key(&*e.name)) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Whether `ino` is `ancestor` or lies below it.
    fn is_within(st: &State, mut ino: u64, ancestor: u64) -> Result<bool, Errno> {
        for _ in 0..100_000 {
            if ino == ancestor {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            ino = st.node(ino)?.rec.parent;
        }
        Err(eio("directory parent chain does not end"))
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<(), Errno> {
        let name = check_name(name)?;
        let newname = check_name(newname)?;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        if flags & !(libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE) != 0 || (exchange && noreplace)
        {
            return Err(Errno::EINVAL);
        }
        let mut st = self.lock();
        // As the kernel orders them: both parents are resolved before the source is looked up.
        if st.node(newparent)?.rec.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        let src = self.resolve(&mut st, parent, name)?.ok_or(Errno::ENOENT)?;
        if st.node(newparent)?.rec.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        let dst = self.resolve(&mut st, newparent, newname)?;
        let src_dir = st.node(src)?.rec.kind == Kind::Dir;
        let now = Ts::now();
        let mut tx = Tx::default();
        if exchange {
            let dst = dst.ok_or(Errno::ENOENT)?;
            if dst == src {
                return Ok(());
            }
            let dst_dir = st.node(dst)?.rec.kind == Kind::Dir;
            if (src_dir && Self::is_within(&st, newparent, src)?)
                || (dst_dir && Self::is_within(&st, parent, dst)?)
            {
                return Err(Errno::EINVAL);
            }
            st.chain(&mut tx, parent)?;
            st.chain(&mut tx, newparent)?;
            st.chain(&mut tx, src)?;
            st.chain(&mut tx, dst)?;
            tx.entry(parent, name, Some(dst));
            tx.entry(newparent, newname, Some(src));
            if parent != newparent && src_dir != dst_dir {
                let (gains_dir, loses_dir) = if src_dir {
                    (newparent, parent)
                } else {
                    (parent, newparent)
                };
                st.rec(&mut tx, gains_dir)?.nlink += 1;
                st.rec(&mut tx, loses_dir)?.nlink -= 1;
            }
            for (ino, p, n) in [(src, newparent, newname), (dst, parent, name)] {
                let r = st.rec(&mut tx, ino)?;
                r.parent = p;
                r.name = n.to_vec();
                r.ctime = now;
            }
            Self::touch_dir(&st, &mut tx, parent, now)?;
            Self::touch_dir(&st, &mut tx, newparent, now)?;
            st.commit(tx)?;
            self.journal_name(&mut st, parent, name, src_dir || dst_dir);
            self.journal_name(&mut st, newparent, newname, src_dir || dst_dir);
            return Ok(());
        }
        if let Some(dst) = dst {
            if noreplace {
                return Err(Errno::EEXIST);
            }
            if dst == src {
                return Ok(());
            }
            // As the kernel orders them: a directory into itself, then over its own ancestor, before
            // the target's type.
            if src_dir && Self::is_within(&st, newparent, src)? {
                return Err(Errno::EINVAL);
            }
            let dst_dir = st.node(dst)?.rec.kind == Kind::Dir;
            if dst_dir && Self::is_within(&st, parent, dst)? {
                return Err(Errno::ENOTEMPTY);
            }
            match (src_dir, dst_dir) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) if !self.is_empty_dir(&mut st, dst)? => return Err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        if src_dir && Self::is_within(&st, newparent, src)? {
            return Err(Errno::EINVAL);
        }
        st.chain(&mut tx, parent)?;
        st.chain(&mut tx, newparent)?;
        self.unlink_name(&st, &mut tx, parent, name)?;
        tx.entry(newparent, newname, Some(src));
        if let Some(dst) = dst {
            let r = st.rec(&mut tx, dst)?;
            if r.kind == Kind::Dir {
                r.nlink = 0;
            } else {
                r.nlink = r.nlink.saturating_sub(1);
                r.ctime = now;
            }
            if r.nlink == 0 {
                tx.drop_inode(dst);
            } else {
                Self::repoint_primary(&st, &mut tx, dst, newparent, newname)?;
            }
            if src_dir {
                st.rec(&mut tx, newparent)?.nlink -= 1;
            }
        }
        if src_dir && parent != newparent {
            st.rec(&mut tx, parent)?.nlink -= 1;
            st.rec(&mut tx, newparent)?.nlink += 1;
        }
        let r = st.rec(&mut tx, src)?;
        r.parent = newparent;
        r.name = newname.to_vec();
        r.ctime = now;
        Self::touch_dir(&st, &mut tx, parent, now)?;
        Self::touch_dir(&st, &mut tx, newparent, now)?;
        st.commit(tx)?;
        self.journal_name(&mut st, parent, name, src_dir);
        self.journal_name(&mut st, newparent, newname, src_dir);
        if let Some(dst) = dst {
            self.reap(&mut st, dst);
        }
        Ok(())
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &OsStr) -> Result<FileAttr, Errno> {
        let newname = check_name(newname)?;
        let mut st = self.lock();
        let rec = st.node(ino)?.rec.clone();
        // As the kernel orders them: an existing name first, then what the source is.
        self.parent_for_create(&mut st, newparent, newname)?;
        if rec.kind == Kind::Dir {
            return Err(Errno::EPERM);
        }
        if rec.nlink == 0 {
            return Err(Errno::ENOENT);
        }
        if rec.nlink >= LINK_MAX {
            return Err(Errno::EMLINK);
        }
        let now = Ts::now();
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        st.chain(&mut tx, newparent)?;
        tx.entry(newparent, newname, Some(ino));
        let r = st.rec(&mut tx, ino)?;
        r.nlink += 1;
        r.ctime = now;
        Self::touch_dir(&st, &mut tx, newparent, now)?;
        st.commit(tx)?;
        // The new name appeared; the content did not change, so the other names need no report.
        self.journal_name(&mut st, newparent, newname, false);
        let n = st.node_mut(ino)?;
        n.lookups += 1;
        let rec = n.rec.clone();
        drop(st);
        self.attr(&rec)
    }

    // ----- seeding (the daemon writes a new workspace's own files before mounting it) -----

    fn seeded(&self, r: Result<FileAttr, Errno>) -> Result<u64, Errno> {
        let ino = r?.ino.0;
        self.forget(ino, 1);
        Ok(ino)
    }

    /// Creates directory `name` in `parent`, owned by the presented owner.
    pub fn seed_dir(&self, parent: u64, name: &str, mode: u32) -> Result<u64, Errno> {
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
    ) -> Result<u64, Errno> {
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
    ) -> Result<u64, Errno> {
        let new = New {
            content: Content::Shared(shared.to_string_lossy().into_owned()),
            ..New::plain(Kind::File, mode, 0)
        };
        let owner = self.owner();
        self.seeded(self.make(parent, OsStr::new(name), new, owner))
    }

    /// Whether `name` exists in directory `parent`.
    pub fn exists(&self, parent: u64, name: &str) -> Result<bool, Errno> {
        let mut st = self.lock();
        Ok(self.resolve(&mut st, parent, name.as_bytes())?.is_some())
    }

    /// The inode at `path` (components from the root), if any.
    fn walk(&self, st: &mut State, path: &[&[u8]]) -> Result<Option<u64>, Errno> {
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
    pub fn read_file(&self, path: &[&[u8]]) -> Result<Option<Vec<u8>>, Errno> {
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
    pub fn open_file(&self, path: &[&[u8]]) -> Result<Option<File>, Errno> {
        let rec = {
            let mut st = self.lock();
            let ino = match self.walk(&mut st, path) {
                Ok(Some(ino)) => ino,
                Ok(None) | Err(Errno::ENOTDIR) => return Ok(None),
                Err(e) => return Err(e),
            };
            st.node(ino)?.rec.clone()
        };
        if rec.kind != Kind::File {
            return Ok(None);
        }
        Ok(Some(if rec.upper {
            self.upper.open_data(rec.ino).map_err(io_errno)?
        } else {
            self.source_file(&rec)?
        }))
    }

    /// What is at `path` (components from the root), without following symlinks.
    pub fn kind_at(&self, path: &[&[u8]]) -> Result<Option<FileType>, Errno> {
        let mut st = self.lock();
        let ino = match self.walk(&mut st, path) {
            Ok(Some(ino)) => ino,
            Ok(None) | Err(Errno::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e),
        };
        let rec = st.node(ino)?.rec.clone();
        drop(st);
        Ok(Some(self.attr(&rec)?.kind))
    }

    /// The names in the directory at `path` (components from the root) with their kinds, without
    /// `.` and `..`; `None` when it is not a directory (symlinks are not followed).
    pub fn list_dir(&self, path: &[&[u8]]) -> Result<Option<Listing>, Errno> {
        let ino = {
            let mut st = self.lock();
            match self.walk(&mut st, path) {
                Ok(Some(ino)) if st.node(ino)?.rec.kind == Kind::Dir => ino,
                Ok(_) | Err(Errno::ENOTDIR) => return Ok(None),
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
    pub fn put_file_quietly(&self, dirs: &[&str], name: &str, bytes: &[u8]) -> Result<u64, Errno> {
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

    /// Points `name` in `dir` (now inode `old`, a file of the workspace's own) at a new inode
    /// holding `bytes`, with `old`'s other attributes; `old` stays for whoever holds it.
    fn replace_quietly(&self, dir: u64, name: &[u8], old: u64, bytes: &[u8]) -> Result<u64, Errno> {
        let mut st = self.lock();
        let rec = st.node(old)?.rec.clone();
        if rec.kind != Kind::File || !rec.upper || rec.nlink != 1 {
            return Err(Errno::EEXIST);
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
        self.upper.create(new, None, now, now).map_err(io_errno)?;
        let written = self.upper.open_data(new).and_then(|mut f| {
            use std::io::Write;
            f.write_all(bytes)
        });
        if let Err(e) = written {
            self.upper.remove(new);
            return Err(io_errno(e));
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
    pub fn apply(&self, path: &[u8], change: &TreeChange) -> Result<(), Errno> {
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
                target: Some(self.store.blob(*id).map_err(eio)?),
                ..New::plain(Kind::Symlink, 0o777, 0)
            },
            TreeChange::Gitlink { id } => New {
                content: Content::Object(object(id, true)),
                ..New::plain(Kind::Dir, 0o755, 0)
            },
        };
        self.seeded(self.make(dir, name, made, owner)).map(|_| ())
    }

    fn owner(&self) -> Caller {
        Caller {
            uid: self.pres.uid,
            gid: self.pres.gid,
        }
    }

    // ----- attributes and extended attributes -----

    pub fn setattr(&self, ino: u64, set: SetAttr) -> Result<FileAttr, Errno> {
        let mut st = self.lock();
        let rec = st.node(ino)?.rec.clone();
        let now = Ts::now();
        if let Some(size) = set.size {
            match rec.kind {
                Kind::File => {}
                Kind::Dir => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            if !rec.upper {
                self.copy_up(&mut st, ino, size == 0)?;
            }
            let f = self.upper.open_data(ino).map_err(io_errno)?;
            f.set_len(size).map_err(io_errno)?;
        }
        let upper = st.node(ino)?.rec.upper;
        if upper && (set.atime.is_some() || set.mtime.is_some()) {
            let f = self.upper.open_data(ino).map_err(io_errno)?;
            let mut times = std::fs::FileTimes::new();
            if let Some(t) = set.atime {
                times = times.set_accessed(match t {
                    SetTime::Now => SystemTime::now(),
                    SetTime::At(t) => t,
                });
            }
            if let Some(t) = set.mtime {
                times = times.set_modified(match t {
                    SetTime::Now => SystemTime::now(),
                    SetTime::At(t) => t,
                });
            }
            f.set_times(times).map_err(io_errno)?;
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        if let Some(m) = set.mode {
            r.mode = m & 0o7777;
        }
        if let Some(u) = set.uid {
            r.uid = u;
        }
        if let Some(g) = set.gid {
            r.gid = g;
        }
        let pick = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => ts(t),
        };
        if let Some(t) = set.atime {
            r.atime = pick(t);
        }
        if let Some(t) = set.mtime {
            r.mtime = pick(t);
        }
        r.ctime = set.ctime.map(ts).unwrap_or(now);
        let changed = r.clone();
        st.commit(tx)?;
        self.journal_ino(&mut st, ino);
        drop(st);
        self.attr(&changed)
    }

    fn xattr_name(name: &OsStr) -> Result<&[u8], Errno> {
        let b = name.as_bytes();
        if b.is_empty() || b.len() > XATTR_NAME_MAX {
            return Err(Errno::ERANGE);
        }
        if b.starts_with(b"system.") {
            // POSIX ACLs and other system attributes are not supported.
            return Err(Errno::EOPNOTSUPP);
        }
        Ok(b)
    }

    pub fn setxattr(&self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let name = Self::xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        // Raised before the attribute exists: a lock-free `getxattr` that sees it down ran before
        // this set took effect.
        self.any_xattr.store(true, Ordering::SeqCst);
        let mut st = self.lock();
        let exists = st.node(ino)?.rec.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(Errno::NO_XATTR);
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.xattrs.insert(name.to_vec(), value.to_vec());
        r.ctime = Ts::now();
        st.commit(tx)
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> Result<XattrReply, Errno> {
        let name = Self::xattr_name(name)?;
        if !self.any_xattr.load(Ordering::SeqCst) {
            return Err(Errno::NO_XATTR);
        }
        let st = self.lock();
        let v = st.node(ino)?.rec.xattrs.get(name).ok_or(Errno::NO_XATTR)?;
        sized(v.clone(), size)
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> Result<XattrReply, Errno> {
        let st = self.lock();
        let mut out = Vec::new();
        for k in st.node(ino)?.rec.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        sized(out, size)
    }

    pub fn removexattr(&self, ino: u64, name: &OsStr) -> Result<(), Errno> {
        let name = Self::xattr_name(name)?;
        let mut st = self.lock();
        if !st.node(ino)?.rec.xattrs.contains_key(name) {
            return Err(Errno::NO_XATTR);
        }
        let mut tx = Tx::default();
        st.chain(&mut tx, ino)?;
        let r = st.rec(&mut tx, ino)?;
        r.xattrs.remove(name);
        r.ctime = Ts::now();
        st.commit(tx)
    }

    // ----- what changed -----

    /// Every path that differs from the base commit, from the same consistent view snapshots use
    /// (so O(changed paths)): a directory that appeared or moved is listed once, as a directory.
    pub fn changes(&self) -> Result<Vec<Change>, Errno> {
        let view = self.view()?;
        let root = view.base_tree;
        let in_base = |path: &[u8]| -> Result<Option<EntryKind>, Errno> {
            let mut tree = root;
            let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
            for (i, c) in comps.iter().enumerate() {
                let entries = self.store.tree(tree).map_err(eio)?;
                let Some(e) = find_entry(&entries, c) else {
                    return Ok(None);
                };
                if i + 1 == comps.len() {
                    return Ok(Some(e.kind));
                }
                if e.kind != EntryKind::Tree {
                    return Ok(None);
                }
                tree = e.id;
            }
            Ok(None)
        };
        let mut out: BTreeMap<Vec<u8>, (ChangeKind, bool)> = BTreeMap::new();
        for e in &view.edits {
            let (path, kind, dir) = match e {
                ViewEdit::Remove { path } => match in_base(path)? {
                    Some(was) => (path, ChangeKind::Deleted, was == EntryKind::Tree),
                    // Removed from a directory that moved here: never at this path in the base.
                    None => continue,
                },
                ViewEdit::AddedDir { path } => match in_base(path)? {
                    Some(_) => (path, ChangeKind::Modified, true),
                    None => (path, ChangeKind::Added, true),
                },
                ViewEdit::Tree { path, .. } => match in_base(path)? {
                    Some(_) => (path, ChangeKind::Modified, true),
                    None => (path, ChangeKind::Added, true),
                },
                ViewEdit::Gitlink { path, .. } => match in_base(path)? {
                    Some(_) => (path, ChangeKind::Modified, false),
                    None => (path, ChangeKind::Added, false),
                },
                ViewEdit::File { path, .. } | ViewEdit::Symlink { path, .. } => {
                    match in_base(path)? {
                        Some(_) => (path, ChangeKind::Modified, false),
                        None => (path, ChangeKind::Added, false),
                    }
                }
            };
            // A later edit of the same path (a removal followed by a replacement) says what it is now.
            let merged = match out.get(path) {
                Some((ChangeKind::Deleted, _)) if kind != ChangeKind::Deleted => {
                    ChangeKind::Modified
                }
                _ => kind,
            };
            out.insert(path.clone(), (merged, dir));
        }
        // A removal with something below it afterwards (a directory replaced by another one that
        // holds files): the path is still there, modified.
        let present: Vec<Vec<u8>> = out
            .iter()
            .filter(|(_, (kind, _))| *kind != ChangeKind::Deleted)
            .map(|(p, _)| p.clone())
            .collect();
        for p in present {
            let mut up = &p[..];
            while let Some(i) = up.iter().rposition(|b| *b == b'/') {
                up = &up[..i];
                if let Some(e) = out.get_mut(up)
                    && e.0 == ChangeKind::Deleted
                {
                    *e = (ChangeKind::Modified, true);
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|(p, (kind, dir))| Change {
                path: String::from_utf8_lossy(&p).into_owned(),
                kind,
                dir,
            })
            .collect())
    }

    /// Files in the workspace's quarantine.
    pub fn quarantined(&self) -> usize {
        self.upper.quarantined()
    }

    /// What damaged catalog batches cost this workspace (one line each).
    pub fn damaged(&self) -> &[String] {
        &self.damaged
    }
}

fn sized(v: Vec<u8>, size: u32) -> Result<XattrReply, Errno> {
    if size == 0 {
        Ok(XattrReply::Size(v.len() as u32))
    } else if (size as usize) < v.len() {
        Err(Errno::ERANGE)
    } else {
        Ok(XattrReply::Data(v))
    }
}
