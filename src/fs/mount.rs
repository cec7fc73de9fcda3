//! Mounting a workspace and the facts of a mount: the mount options and the threads that serve
//! every mount's connection, what INIT asks of the kernel and what the mount then runs with
//! ([`MountInfo`]: passthrough, no-open, no-opendir, the transport, its request counts), and telling
//! the kernel to forget what the daemon changed behind it. The requests themselves are the
//! adapter's (`fuse/`); the restart handover of a mount is `fuse/handover.rs`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{BackingId, INodeNo, InitFlags, KernelConfig};

use super::Behind;
use super::fuse::FuseAdapter;
use super::handles::Handles;
use super::inode_io::InodeIo;
use super::io::IoMode;
use super::stats::Stats;

/// Mount-wide facts the daemon reports in `status` and `stats`.
#[derive(Debug, Default)]
pub struct MountInfo {
    pub passthrough: AtomicBool,
    /// The kernel opens directories without asking (it offered `FUSE_NO_OPENDIR_SUPPORT` and
    /// `opendir` answers `ENOSYS`): no OPENDIR or RELEASEDIR request.
    pub no_opendir: AtomicBool,
    /// The request transport the mount runs on ("uring (…)" or "dev (…)"), set once at mount.
    pub transport: std::sync::OnceLock<String>,
    /// The ring memory and pause of a mount on the io_uring transport (kept and handed over with
    /// its connection: `super::uring::RingShare`).
    pub ring: std::sync::OnceLock<super::uring::RingShare>,
    /// Every request this mount answered (recorded by a guard at the top of each method).
    pub stats: Stats,
    /// The mount runs in no-open mode (asked for, and the kernel offered `FUSE_NO_OPEN_SUPPORT`).
    pub no_open: AtomicBool,
    /// The per-inode I/O of a no-open mount, for the daemon to release what it changed behind the
    /// kernel ([`invalidate_mount`]).
    pub inode_io: std::sync::OnceLock<Arc<InodeIo>>,
    /// The adapter's open handles, reachable from the daemon for a handover to another process.
    pub handles: HandlesLink,
}

/// The open handles of a mount's adapter, set once when the adapter is made.
#[derive(Default)]
pub struct HandlesLink(std::sync::OnceLock<Arc<Handles<BackingId>>>);

impl HandlesLink {
    /// Links the adapter's handle table (the first one set stays).
    pub fn set(&self, handles: Arc<Handles<BackingId>>) {
        let _ = self.0.set(handles);
    }

    pub fn get(&self) -> Option<&Arc<Handles<BackingId>>> {
        self.0.get()
    }
}

impl std::fmt::Debug for HandlesLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.get().map(|h| h.len());
        f.debug_tuple("HandlesLink").field(&n).finish()
    }
}

impl MountInfo {
    /// The I/O mode the mount runs in.
    pub fn io_mode(&self) -> IoMode {
        if self.no_open.load(Ordering::Relaxed) {
            IoMode::NoOpen
        } else {
            IoMode::Handles
        }
    }
}

/// INIT: what the mount asks of the kernel (`docs/caching.md`) and what it runs with, recorded in
/// `info` (the I/O mode the kernel allows of `want_io`, passthrough when `want_passthrough` and the
/// kernel offers it, whether directories are opened without a request).
pub fn negotiate(
    info: &MountInfo,
    want_io: IoMode,
    want_passthrough: bool,
    cfg: &mut KernelConfig,
) {
    let no_open =
        want_io == IoMode::NoOpen && cfg.capabilities().contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
    if want_io == IoMode::NoOpen && !no_open {
        tracing::warn!("the kernel does not offer no-open; serving files with handles");
    }
    info.no_open.store(no_open, Ordering::Relaxed);
    // With no-open, the kernel would leave an atomic `O_TRUNC` to an OPEN it never sends (the
    // file would silently not be truncated): without the flag it truncates with SETATTR.
    if !no_open {
        let _ = cfg.add_capabilities(InitFlags::FUSE_ATOMIC_O_TRUNC);
    }
    for flag in [
        InitFlags::FUSE_DO_READDIRPLUS,
        InitFlags::FUSE_CACHE_SYMLINKS,
        InitFlags::FUSE_PARALLEL_DIROPS,
        // octofs clears set-user-ID and set-group-ID itself on write, truncate and chown (see
        // `kill_suidgid`), so the kernel need not ask for `security.capability` before writes.
        InitFlags::FUSE_HANDLE_KILLPRIV_V2,
    ] {
        let _ = cfg.add_capabilities(flag);
    }
    let _ = cfg.set_max_write(1 << 20);
    // Nothing to request: the kernel says it copes with `opendir` answering ENOSYS, and then
    // opens every directory itself, caching listings (readdir is stateless, see handles.rs).
    let no_opendir = cfg
        .capabilities()
        .contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
    info.no_opendir.store(no_opendir, Ordering::Relaxed);
    // No passthrough with no-open: the kernel refuses to mix them on one connection (EIO).
    if want_passthrough
        && !no_open
        && cfg.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        && cfg.set_max_stack_depth(1).is_ok()
    {
        info.passthrough.store(true, Ordering::Relaxed);
    }
}

/// Mount options shared by every workspace mount.
pub fn mount_config(thread: &str, allow_other: bool) -> fuser::Config {
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(format!("octofs:{thread}")),
        fuser::MountOption::Subtype("octofs".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    if allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    // Only a foreground `Session::run` reads with threads of its own; a spawned session is
    // served by the process's worker pool (`pool_limits`).
    cfg.n_threads = Some(4);
    cfg.clone_fd = true;
    let (min, max) = pool_limits();
    fuser::pool::set_limits(min, max);
    cfg
}

/// The bounds of the one pool of threads serving every mount's `/dev/fuse` connection
/// (`vendor/fuser/src/pool.rs`, policy in `docs/transport.md` "Request threads"): at least two
/// per core (at least 4, at most 16) kept, at most 24 (the pool starts another worker whenever
/// none is idle, so up to 23 requests may block at once before a new one waits). 24 keeps the
/// whole daemon under 64 threads: at 1,000 workspaces under load the pool reached a cap of 32 and
/// the daemon 59 threads.
pub fn pool_limits() -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    ((2 * cores).clamp(4, 16), 24)
}

/// Tells the kernel to forget what it may have cached of changes the daemon made behind it
/// (`docs/caching.md`): a name's entry (or cached absence) and its directory's listing and
/// attributes, an inode's attributes and pages. Call it from a thread that serves no FUSE request and
/// holds no lock a FUSE request may wait for: the kernel may first wait for requests in flight on
/// those inodes, and a request thread waiting on its own inode's lock would never return.
pub fn invalidate(notifier: &fuser::Notifier, behind: &[Behind]) {
    for b in behind {
        // "Not cached" answers Ok (fuser maps the kernel's ENOENT); anything else only costs
        // freshness until the timeout, so it is logged, not fatal.
        let r = match b {
            Behind::Entry { parent, name } => notifier
                .inval_entry(INodeNo(*parent), OsStr::from_bytes(name))
                .and_then(|()| notifier.inval_inode(INodeNo(*parent), 0, 0)),
            Behind::Inode(i) => notifier.inval_inode(INodeNo(*i), 0, 0),
        };
        if let Err(e) = r {
            tracing::warn!("cannot invalidate the kernel's cache of {b:?}: {e}");
        }
    }
}

/// [`invalidate`], after releasing what a no-open mount holds open of the inodes the daemon changed
/// (their next READ opens the current content).
pub fn invalidate_mount(info: &MountInfo, notifier: &fuser::Notifier, behind: &[Behind]) {
    if let Some(io) = info.inode_io.get() {
        let inodes: Vec<u64> = behind
            .iter()
            .filter_map(|b| match b {
                Behind::Inode(i) => Some(*i),
                Behind::Entry { .. } => None,
            })
            .collect();
        io.drop_inodes(&inodes);
    }
    invalidate(notifier, behind);
}

/// Mounts `adapter` at `mountpoint` and serves it on background threads over `transport`
/// (`super::uring`).
pub fn mount(
    adapter: FuseAdapter,
    mountpoint: &Path,
    cfg: &fuser::Config,
    transport: super::uring::Transport,
) -> std::io::Result<fuser::BackgroundSession> {
    let info = adapter.info().clone();
    super::uring::mount(
        adapter,
        mountpoint,
        cfg,
        transport,
        &info.transport,
        &info.ring,
    )
}
