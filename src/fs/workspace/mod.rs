//! The filesystem core of one workspace: a copy-on-write overlay of the base commit.
//!
//! Every request is a method returning `Result<_, FsError>`: the errno to answer with, and what
//! failed when the core knows more than the request says (the data file, the catalog append, the
//! blob or tree; `docs/errors.md`). Nothing here panics on a request and nothing here knows about
//! the kernel (the fuser adapter in [`super::fuse`] does). All metadata
//! lives in one [`State`] behind a mutex, held for in-memory work and the catalog append only: no
//! file is copied, opened, `fstat`ed or synced under it (`docs/locking.md`). A change is a
//! transaction ([`Tx`]): its catalog records are appended to the log *first* and applied in memory
//! only if that succeeded, so a failed append (ENOSPC) changes nothing and an acknowledged change
//! survives SIGKILL.
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use gix::ObjectId;

use crate::cow::blobcache::BlobCache;
use crate::cow::catalog::{BaseRef, Catalog, CatalogState, InodeRecord, Kind, LogSync};
use crate::cow::upper::Upper;
use crate::git::objects::{EntryKind, ObjectStore};

mod apply;
mod attr;
mod batch;
mod behind;
mod by_path;
mod content;
mod convert;
mod durable;
mod fsck;
mod handover;
mod held;
mod inodes;
mod journal;
mod light;
mod namespace;
mod posix;
mod presented;
mod quiet;
mod rebase;
mod resend;
mod resolve;
mod seed;
mod tree_order;
mod trim;
mod tx;
mod types;
mod view;
mod xattr;

pub use convert::unix_time;
use convert::*;
pub use durable::Durable;
pub use handover::NodeState;
pub use held::HELD_WAIT;
pub use inodes::path_ino;
use inodes::{Node, Nodes};
use journal::Journal;
pub use journal::{BASE_TOKEN, Changed};
use namespace::New;
pub use posix::NodeMeta;
pub use presented::{BaseStat, base_stat};
pub use rebase::BaseMove;
pub use resend::{CRASH_ENV, Made};
pub use types::*;

pub const ROOT_INO: u64 = 1;
/// Longest file name a directory entry may have (as on ext4).
pub const NAME_MAX: usize = 255;
/// Most hard links one inode may have (as on ext4).
const LINK_MAX: u32 = 65_000;
/// Inode numbers the workspace allocates have the top bit set; derived ones never do.
const ALLOCATED: u64 = 1 << 63;

/// Everything behind the workspace's one mutex: the catalog, the live inode table and the journal.
struct State {
    catalog: Catalog,
    /// The catalog's state as replayed and committed, each record held in a [`Node`] with its
    /// runtime data; `live.inodes` also holds the inodes without a record (derived from the base,
    /// or unlinked and still referenced). `live.generation` counts committed batches since the
    /// workspace was created (durable: replay recounts them).
    live: CatalogState<Nodes>,
    journal: Journal,
    /// Inodes whose data file is being prepared without the lock (copy-up, re-inode): other
    /// requests that would change or copy the same inode wait on [`WorkspaceFs::copied`].
    copying: HashSet<u64>,
    /// Committed transactions since load, quiet ones included: a directory listing read at one
    /// value is still the listing while it holds (see [`WorkspaceFs::dir_names`]).
    commits: u64,
    /// What changed since each snapshot view (incremental snapshots; see [`tx::SnapTrack`]).
    track: tx::SnapTrack,
    /// While [`WorkspaceFs::apply_all`] seeds a workspace nobody has mounted: the records of its
    /// transactions, applied in memory and appended to the catalog as one batch at its end.
    batch: Option<tx::Batch>,
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
    /// Whether any inode may have `security.capability`, which the kernel asks of every new file
    /// before its first write: false until the first `setxattr` of it (or a loaded record with it).
    /// While false it is answered "none" without the lock even when other attributes exist.
    any_capability: AtomicBool,
    /// Signalled (with the state mutex) whenever an inode leaves [`State::copying`].
    copied: Condvar,
    /// Syncs the catalog's log: `fsync` makes it durable without the state lock.
    catalog_sync: LogSync,
    /// A new workspace's background sync, which every `fsync` waits for (see [`Durable`]).
    durable: Mutex<Option<Arc<Durable>>>,
    /// The directory whose names are not ready yet (see [`held`]), and whether there is one.
    held: Mutex<held::Held>,
    any_held: AtomicBool,
    /// Signalled whenever the hold ends.
    held_changed: Condvar,
}

/// Something the daemon changed in the workspace other than through a FUSE request, which the
/// kernel may hold cached (entries and attributes for an hour, directory listings, pages). The
/// daemon hands these to the kernel's invalidation (`docs/caching.md`), from a thread that is not
/// serving FUSE requests.
impl std::fmt::Debug for WorkspaceFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkspaceFs")
            .field("upper", &self.upper)
            .finish()
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
        let catalog_sync = catalog.syncer();
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
                pins: 0,
            });
        }
        if let Some(root) = nodes.get_mut(&ROOT_INO) {
            root.lookups = 1;
        }
        let any_xattr = nodes.values().any(|n| !n.rec.xattrs.is_empty());
        let any_capability = nodes
            .values()
            .any(|n| n.rec.xattrs.contains_key(xattr::CAPABILITY));
        let mut fs = WorkspaceFs {
            store,
            blobs,
            upper,
            pres,
            statfs_path,
            state: Mutex::new(State {
                catalog,
                live: CatalogState {
                    inodes: Nodes::new(nodes),
                    dirs: loaded.dirs,
                    next_ino: loaded.next_ino.max(1),
                    generation: loaded.generation,
                },
                journal: Journal::new(),
                copying: HashSet::new(),
                commits: 0,
                track: tx::SnapTrack::default(),
                batch: None,
            }),
            base_content_opens: AtomicU64::new(0),
            last_activity: AtomicU64::new(now_secs()),
            damaged: Vec::new(),
            behind: Mutex::new(None),
            any_xattr: AtomicBool::new(any_xattr),
            any_capability: AtomicBool::new(any_capability),
            copied: Condvar::new(),
            catalog_sync,
            durable: Mutex::new(None),
            held: Mutex::new(held::Held::default()),
            any_held: AtomicBool::new(false),
            held_changed: Condvar::new(),
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
    fn lock(&self) -> MutexGuard<'_, State> {
        self.last_activity.store(now_secs(), Ordering::Relaxed);
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leaves the catalog compacted with the clean-stop marker (called when the mount ends).
    pub fn close(&self) {
        let mut st = self.lock();
        let snap = st.snapshot();
        if let Err(e) = st.catalog.close_clean(&snap) {
            tracing::error!("cannot close the catalog cleanly: {e}");
        }
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
