//! The daemon: one process serving every workspace mount of the host and the control socket.
//!
//! Policy lives here (which mirror a thread is bound to, when to mount, remount after a restart);
//! mechanism lives below it (`git`, `cow`, `fs`). Each mount is served by its own fuser session
//! threads, so one busy workspace never stalls another. Operations on one project or one thread
//! serialize on a keyed lock; the daemon-wide maps (`mounts`, `stores`) are held only to clone an
//! `Arc` out of them, never across I/O (docs/locking-daemon.md).
//!
//! The rooms, by concern:
//! - this file: the [`Daemon`] and its state, and [`serve`] (start-up and shutdown);
//! - `server`: the control socket, its connection limits and worker pools, request dispatch;
//! - `authz`: who may do what (peer credentials against thread owners and project access);
//! - `guard`: the keyed locks' keys, and the thread guard (a request's lock, owner check, record);
//! - `limits`: what one user's threads may take of the host (live threads, bytes);
//! - `mirrors`: mirror add/sync/access and the object stores the mounts read;
//! - `io_auto`: which I/O mode each new mount gets under `serve --io auto` (the default);
//! - `mounter`: the seam between the daemon and the kernel's mounts (FUSE, or core-only in tests);
//! - `mounts`: mounting, unmounting and remounting workspaces, and whether the kernel still has a
//!   mount (mountinfo, not the table);
//! - `strays`: files written into a bare mount point, moved into the workspace at its next mount;
//! - `lifecycle`: a thread's lifecycle policy as pure plans (open, release, sweep), no I/O;
//! - `threads`: a thread's lifecycle carried out: open (fork, resume, share), release (also when
//!   idle), sweep;
//! - `moves`: a thread's state carried to a new thread: `fork` and `teleport`;
//! - `resync`: a live workspace brought to its upstream tip, as a developer or a reviewer may;
//! - `snapshot`: snapshot assembly (the one place a workspace becomes a tree and a commit);
//! - `deps`: dependency layers: builds after mirror add/sync, `deps build/list/gc`, progress;
//! - `diff`: what changed between snapshots or up to the live state;
//! - `share`: a project's share remote: threads that move between hosts;
//! - `pull`: a named snapshot of a remote applied to a live workspace;
//! - `status`: list, status, fsmonitor answers and request statistics;
//! - `layers`: the dependency layers a workspace presents, and their absence from what leaves it;
//! - `posix`: what a snapshot's tree cannot hold (modes, owners, special files), both ways;
//! - `keeper`: the connection keeper process, which lets the mounts outlive a crash of the daemon;
//! - `metrics`: the Prometheus exposition of what the daemon counts, and its opt-in listener;
//! - `takeover`: graceful restart: every mount's connection and state handed to a new process;
//! - `error`, `refusal`: why a request failed, and why it was refused (typed, one line each);
//! - [`proto`]: the request and reply types of the control protocol.

mod authz;
mod commit;
mod create;
mod deps;
mod diff;
pub mod error;
mod export;
mod fdstore;
mod guard;
pub mod io_auto;
mod keeper;
mod kept;
mod later_index;
mod layers;
mod lifecycle;
mod limits;
pub mod metrics;
mod mirrors;
mod mounter;
mod mounts;
mod moves;
pub mod notify;
mod posix;
pub mod proto;
mod pull;
mod push;
mod recover;
mod refusal;
mod repo_config;
mod repo_record;
mod resync;
mod server;
mod share;
mod snapshot;
mod status;
mod strays;
mod takeover;
mod threads;
mod tree_diff;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::cow::blobcache::BlobCache;
use crate::fs::WorkspaceFs;
use crate::fs::fuse::MountInfo;
use crate::git::mirror;
use crate::git::objects::ObjectStore;
use crate::layout::Layout;
use crate::workspace::Owner;
use error::Error;
use guard::LockKey;
pub use keeper::run_keeper;
pub use limits::DEFAULT_MAX_THREADS_PER_USER;
pub use takeover::serve_takeover;

/// Settings of one daemon.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A mirror synced within this many seconds is not fetched again (0: always fetch).
    pub freshness_secs: u64,
    /// Whether to try FUSE passthrough (it also needs root and a kernel that offers it).
    pub passthrough: bool,
    /// The sweep timer: release workspaces idle this long (seconds), checking every `sweep_every`
    /// seconds; 0 turns the timer off.
    pub sweep_idle: u64,
    pub sweep_every: u64,
    /// Clone and fetch give up after this many seconds without progress.
    pub fetch_timeout_secs: u64,
    /// How mounts receive requests (`octofs serve --transport`).
    pub transport: crate::fs::uring::Transport,
    /// How new mounts serve file I/O (`octofs serve --io`): one mode, or auto (`io_auto`).
    pub io: io_auto::IoSetting,
    /// The most live threads one user (not root) may hold; 0: no cap (`limits`).
    pub max_threads_per_user: usize,
    /// The most bytes one user's (not root's) workspaces may hold in their upper layers; none: no
    /// quota (`limits`). With one, those users' mounts serve writes through the daemon (no
    /// passthrough), so that every byte is counted.
    pub quota_per_user: Option<u64>,
    /// Keep every mount's connection in the keeper process, so that the mounts outlive a crash
    /// of this daemon and the next one adopts them (`octofs serve --keep-connections`).
    pub keep_connections: bool,
    /// The metrics listener (`octofs serve --metrics ADDR`); none: off.
    pub metrics: Option<metrics::Endpoint>,
}

struct Mounted {
    path: PathBuf,
    /// What serves it: a fuser session, or nothing (a core-only mount, `mounter`).
    session: mounter::Session,
    info: Arc<MountInfo>,
    core: Arc<WorkspaceFs>,
    /// The workspace's owner (fsmonitor answers go to them or root only).
    owner: Owner,
    /// The device the kernel gave this mount (`major:minor` in mountinfo), read once mounted:
    /// whether the kernel still has *this* mount at the path is asked against it.
    dev: Option<String>,
    /// The I/O mode it was mounted in, held against the no-open budget while it lives.
    io: io_auto::Hold,
}

/// Named mutexes: one per project, one per thread, one per shared index being built.
#[derive(Default)]
struct KeyedLocks(Mutex<HashMap<LockKey, Arc<Mutex<()>>>>);

/// Past this many keyed locks, the ones nobody holds or waits for are dropped.
const KEYED_LOCKS_KEPT: usize = 256;

impl KeyedLocks {
    fn get(&self, key: &LockKey) -> Arc<Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // A lock only the map refers to is neither held nor waited for (both hold a clone of its
        // `Arc`), so dropping it changes nothing: the next user of its key makes a fresh one. Without
        // this, every thread name ever used would keep an entry for the daemon's lifetime.
        if map.len() >= KEYED_LOCKS_KEPT {
            map.retain(|_, l| Arc::strong_count(l) > 1);
        }
        map.entry(key.clone()).or_default().clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The daemon's state. Its locks, what they protect and what may be done while holding them are in
/// docs/locking-daemon.md: in short, `stores` and `mounts` are held only to look up, insert, remove
/// or clone an `Arc` out (never across I/O, a mount, an unmount, or a question to a workspace's
/// core); the keyed locks serialize the work on one project or one thread and may be held across
/// anything that work does.
pub struct Daemon {
    layout: Layout,
    settings: Settings,
    blobs: Arc<BlobCache>,
    /// The open object store of each project's mirror.
    stores: Mutex<HashMap<String, Arc<ObjectStore>>>,
    /// The workspaces being served, by thread.
    mounts: Mutex<HashMap<String, Mounted>>,
    /// How they are mounted: by the kernel (FUSE), or core-only in tests.
    mounter: Arc<dyn mounter::Mounter>,
    /// The project, thread and shared-index locks ([`LockKey`]).
    locks: Arc<KeyedLocks>,
    /// Threads whose `release --when-idle` waits for their mount to be idle (their records say so
    /// too; this is what the timer walks). Held only to read or change the set.
    idle_waits: Mutex<HashSet<String>>,
    /// Counts `mirror access` changes: what a mount's objects gate decided holds until it moves
    /// (see [`Daemon::objects_gate`]).
    access_epoch: Arc<std::sync::atomic::AtomicU64>,
    /// Each user's live threads (`limits`). Held only to count or check, never across I/O.
    live: Mutex<limits::LiveThreads>,
    /// Each user's bytes across their workspaces (`limits`), with the quota on. Held only to find
    /// or insert a user's counter.
    quotas: Mutex<HashMap<u32, Arc<crate::cow::quota::UserBytes>>>,
    /// The page cache no-open mounts may take (`io_auto`): decided and held under its own lock.
    io_budget: Arc<io_auto::Budget>,
    /// What snapshots keep in memory between them (trees written, ids of files read), shared by
    /// every workspace and every mirror's object store.
    snapshot_caches: Arc<crate::git::snapshot::Caches>,
}

/// A request's answer (one of `proto`'s types) and its warnings, or why it failed.
type Reply<T> = Result<(T, Vec<String>), Error>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Daemon {
    fn new(layout: Layout, settings: Settings) -> anyhow::Result<Daemon> {
        let blobs = BlobCache::new(&layout.blobs()).context("cannot create the blob cache")?;
        // The live threads each user holds now: their records (what an interrupted create left is
        // dropped from the count when it matters, see `limits`).
        let records = crate::workspace::WorkspaceRecord::list(&layout).unwrap_or_else(|e| {
            tracing::error!("cannot count the live threads: {e}");
            Vec::new()
        });
        Ok(Daemon {
            live: Mutex::new(limits::LiveThreads::from_records(&records)),
            quotas: Mutex::default(),
            layout,
            settings,
            blobs: Arc::new(blobs),
            stores: Mutex::new(HashMap::new()),
            snapshot_caches: Arc::default(),
            mounts: Mutex::new(HashMap::new()),
            mounter: Arc::new(mounter::Fuse),
            locks: Arc::default(),
            idle_waits: Mutex::default(),
            access_epoch: Arc::default(),
            io_budget: io_auto::Budget::new(io_auto::memory(), io_auto::per_base()),
        })
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `<state>/serving`: present while a daemon serves; found at start, the previous one did not
/// stop cleanly (its new workspaces' background syncs may not have run).
const SERVING: &str = "serving";

/// Runs the daemon in the foreground until `stop`, SIGTERM or SIGINT.
pub fn serve(layout: Layout, settings: Settings) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    crate::sys::fix_malloc_mmap_threshold();
    // Everything the daemon (and git under it) creates is private, whatever umask it was started
    // with; modes are also set explicitly where files are made (layout.rs: "State modes").
    crate::sys::set_umask(0o077);
    if let Ok(m) = std::fs::metadata(&layout.root)
        && !m.is_dir()
    {
        bail!("root {} is not a directory", layout.root.display());
    }
    crate::private_state::make_private(&layout.state).with_context(|| {
        format!(
            "cannot create or make private the state dir {}",
            layout.state.display()
        )
    })?;
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(layout.daemon_lock())
        .with_context(|| format!("cannot open {}", layout.daemon_lock().display()))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match lock_file.try_lock() {
            Ok(()) => {
                // A restart hands the lock (with its descriptor) to the new daemon.
                takeover::remember_lock(&lock_file);
                break;
            }
            Err(std::fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                bail!(
                    "another octofs daemon is serving {}",
                    layout.state.display()
                )
            }
            Err(std::fs::TryLockError::Error(e)) => {
                bail!("cannot lock {}: {e}", layout.daemon_lock().display())
            }
        }
    }
    // Not state: every workspace owner must reach its mount point under it.
    crate::layout::create_public_dir(&layout.root)
        .with_context(|| format!("cannot create root {}", layout.root.display()))?;
    mirror::set_fetch_timeout(settings.fetch_timeout_secs);
    // Made once here, so that a refused or failed `mirror add` leaves the state as it found it.
    for dir in [layout.mirrors(), layout.projects()] {
        crate::layout::create_private_dir(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // New data files of every workspace come from one pool of empty files beside them.
    if let Err(e) = crate::cow::upper::use_pool(&layout.state.join("pool")) {
        tracing::warn!("no pool of new files (each is created when it is needed): {e}");
    }
    // Loading every project moves credentials out of records written by an older octofs.
    if let Err(e) = mirror::list(&layout) {
        tracing::error!("cannot load the projects: {e}");
    }

    let daemon = Arc::new(Daemon::new(layout.clone(), settings)?);
    // What a power loss during a create left is an interrupted create (threads.rs).
    daemon.recover_creates();
    // A daemon that did not stop cleanly may have answered creates whose background syncs never
    // ran, and left its last changes in the page cache only: what it left in the kernel is made
    // durable before any fsync in a workspace is answered again (so that none is answered before
    // its record is on disk). The sync runs in the background, every workspace loaded meanwhile
    // waits for it at its first fsync (`mounts::unclean_sync`): the mounts serve at once (it was
    // most of the pause a crash caused, docs/restart.md).
    let serving = layout.state.join(SERVING);
    if serving.exists() {
        mounts::sync_unclean_state(&layout);
    }
    if let Err(e) = std::fs::write(&serving, b"") {
        tracing::warn!("cannot write {}: {e}", serving.display());
    }
    // A daemon that died left its mounts' connections with the service manager's descriptor
    // store (under systemd with one) and with the keeper: they are adopted before anything looks
    // at a mount point (a request to a kept mount waits for a server). One adoption a thread: the
    // two hold duplicates of the same descriptors.
    let mut kept = fdstore::attach(&layout);
    if daemon.settings.keep_connections {
        for k in keeper::attach(&layout) {
            if !kept.iter().any(|s| s.thread == k.thread) {
                kept.push(k);
            }
        }
    }
    takeover::adopt_kept(&daemon, &layout, kept);
    mounts::clear_stale_mounts(&layout.root);
    daemon.remount_all();
    daemon.prebuild_all_indexes();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(server::BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(server::run(daemon.clone()));
    notify::stopping();
    daemon.settle_all();
    daemon.unmount_all();
    // Nothing holding a mount's descriptor outlives a stop.
    keeper::quit();
    let _ = std::fs::remove_file(serving);
    let _ = std::fs::remove_file(layout.socket());
    drop(lock_file);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_locks_do_not_pile_up_and_a_held_one_stays_the_same() {
        let locks = KeyedLocks::default();
        let held = locks.get(&LockKey::thread("busy"));
        let guard = lock(&held);
        for i in 0..10_000 {
            let l = locks.get(&LockKey::Thread(format!("t{i}")));
            drop(lock(&l));
        }
        assert!(
            locks.len() <= KEYED_LOCKS_KEPT,
            "{} locks kept",
            locks.len()
        );
        // The held lock survived the pruning: a second user of its key waits on the same mutex.
        let again = locks.get(&LockKey::thread("busy"));
        assert!(Arc::ptr_eq(&held, &again));
        assert!(again.try_lock().is_err());
        drop(guard);
    }
}
