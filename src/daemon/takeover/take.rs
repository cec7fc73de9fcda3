//! The new side of a restart ([`serve_takeover`]) and the adoption of mounts a keeper held across a
//! crash ([`adopt_kept`]): receive, rebuild each workspace's core and session without INIT, start
//! them all once every one is ready. Must not: touch the old daemon's table (the old side's,
//! `give.rs`).

use super::*;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::daemon::{Daemon, Mounted, Settings, lock};
use crate::fs::fuse::{AdapterState, FuseAdapter, MountInfo};
use crate::fs::uring::Transport;
use crate::layout::Layout;
use crate::workspace::WorkspaceRecord;

/// Answers the old daemon with a refusal and exits at once: nothing made so far may be dropped
/// (a session would unmount).
fn refuse_and_exit(s: &mut UnixStream, why: &str) -> ! {
    tracing::error!("taking over failed: {why}");
    let _ = write_frame(
        s,
        &ChildMsg::Refused {
            why: why.to_string(),
        },
    );
    std::process::exit(1);
}

/// A mount of the handover, ready to be spawned.
struct Built {
    thread: String,
    path: PathBuf,
    session: fuser::Session<FuseAdapter>,
    info: Arc<MountInfo>,
    core: Arc<crate::fs::WorkspaceFs>,
    owner: crate::workspace::Owner,
    when_idle: bool,
    /// The mode the kernel has this mount in, held against the no-open budget.
    io: crate::daemon::io_auto::Hold,
    /// The ring memory of a ring mount, mapped at its old address.
    ring: Option<crate::fs::uring::KeptRing>,
}

/// `octofs takeover-serve --from SOCKET`: the new daemon of a restart, started by the old one.
pub fn serve_takeover(layout: Layout, from: &Path) -> anyhow::Result<()> {
    crate::sys::fix_malloc_mmap_threshold();
    crate::sys::set_umask(0o077);
    let mut s = UnixStream::connect(from)
        .with_context(|| format!("cannot reach the old daemon at {}", from.display()))?;
    s.set_read_timeout(Some(HANDOVER_TIMEOUT))?;
    write_frame(
        &mut s,
        &ChildMsg::Hello {
            version: VERSION,
            pid: std::process::id(),
        },
    )?;
    let frame = read_frame(&mut s).context("no handover from the old daemon")?;
    let version = frame.get("version").and_then(|v| v.as_u64());
    if version != Some(u64::from(VERSION)) {
        refuse_and_exit(
            &mut s,
            &format!("handover version {version:?} unknown (this binary reads {VERSION})"),
        );
    }
    let h: Handover = match serde_json::from_value(frame) {
        Ok(h) => h,
        Err(e) => refuse_and_exit(&mut s, &format!("bad handover: {e}")),
    };
    let mut fds: Vec<Option<OwnedFd>> = Vec::with_capacity(h.fds);
    while fds.len() < h.fds {
        match crate::sys::recv_fds(&s) {
            Ok(got) => fds.extend(got.into_iter().map(Some)),
            Err(e) => refuse_and_exit(&mut s, &format!("receiving descriptors: {e}")),
        }
    }
    let fault = std::env::var(FAULT_ENV).unwrap_or_default();
    if fault == "exit" {
        std::process::exit(3);
    }
    let Some(lock_fd) = fds.get_mut(h.lock_fd).and_then(Option::take) else {
        refuse_and_exit(&mut s, "no lock file in the handover");
    };
    let lock_file = File::from(lock_fd);
    let transport = match h.settings.transport.parse::<Transport>() {
        Ok(t) => t,
        Err(e) => refuse_and_exit(&mut s, &e),
    };
    let io = match h.settings.io.as_str() {
        // An older daemon without the setting served every mount with handles.
        "" => crate::daemon::io_auto::IoSetting::Mode(crate::fs::IoMode::Handles),
        m => match m.parse::<crate::daemon::io_auto::IoSetting>() {
            Ok(io) => io,
            Err(e) => refuse_and_exit(&mut s, &e),
        },
    };
    let settings = Settings {
        io,
        freshness_secs: h.settings.freshness_secs,
        passthrough: h.settings.passthrough,
        sweep_idle: h.settings.sweep_idle,
        sweep_every: h.settings.sweep_every,
        fetch_timeout_secs: h.settings.fetch_timeout_secs,
        transport,
        max_threads_per_user: h
            .settings
            .max_threads_per_user
            .unwrap_or(crate::daemon::limits::DEFAULT_MAX_THREADS_PER_USER),
        quota_per_user: h.settings.quota_per_user,
        keep_connections: h.settings.keep_connections,
        // An address or list this process cannot read (an older one wrote it) leaves it off.
        metrics: h.settings.metrics.as_deref().and_then(|a| {
            Some(crate::daemon::metrics::Endpoint {
                addr: a.parse().ok()?,
                allow: h
                    .settings
                    .metrics_allow
                    .as_deref()
                    .unwrap_or("")
                    .parse()
                    .ok()?,
            })
        }),
    };
    crate::git::mirror::set_fetch_timeout(settings.fetch_timeout_secs);
    let daemon = match Daemon::new(layout.clone(), settings) {
        Ok(d) => Arc::new(d),
        Err(e) => refuse_and_exit(&mut s, &format!("{e:#}")),
    };
    let mut built: Vec<Built> = Vec::new();
    for m in h.mounts {
        if let Err(why) = build(&daemon, &layout, m, &mut fds, &mut built, Some(h.old_pid)) {
            refuse_and_exit(&mut s, &why.to_string());
        }
    }
    if fault == "refuse" {
        refuse_and_exit(&mut s, "refused for a test (OCTOFS_TAKEOVER_FAULT=refuse)");
    }
    // Every mount is ready: from here this process serves them.
    let mut spawned = Vec::new();
    for b in built {
        let session = match crate::fs::uring::serve_adopted(
            b.session,
            &b.path,
            b.ring,
            &b.info.transport,
            &b.info.ring,
        ) {
            Ok(s) => s,
            // Mounts already spawned serve; this one cannot: nothing to answer but the truth.
            Err(e) => refuse_and_exit(&mut s, &format!("thread {}: {e}", b.thread)),
        };
        spawned.push((
            b.thread,
            b.path,
            session,
            b.info,
            b.core,
            b.owner,
            b.when_idle,
            b.io,
        ));
    }
    for (thread, path, session, info, core, owner, when_idle, io) in spawned {
        if when_idle {
            lock(&daemon.idle_waits).insert(thread.clone());
        }
        let dev = crate::daemon::mounts::kernel_dev(&path, &thread);
        let name = thread.clone();
        let relative = core.clone();
        lock(&daemon.mounts).insert(
            thread,
            Mounted {
                path,
                session: session.into(),
                info,
                core,
                owner,
                dev,
                io,
            },
        );
        // A workspace an older daemon mounted may still name the mirror by its host path: pointed
        // at the objects inside the mount as a mount does, now that it is served here.
        if let Ok(Some(rec)) = WorkspaceRecord::load(&layout, &name) {
            daemon.relative_alternates(&rec, &relative);
            daemon.tell_kernel(&name);
        }
    }
    tracing::info!(old_pid = h.old_pid, "took over every mount");
    // The keeper holds the old daemon's descriptors (its readers are paused: none holds a
    // request); it gets this one's instead.
    drop(crate::daemon::fdstore::attach(&layout));
    if daemon.settings.keep_connections {
        drop(crate::daemon::keeper::attach(&layout));
    }
    for (thread, m) in lock(&daemon.mounts).iter() {
        crate::daemon::mounts::keep_mount(thread, m);
    }
    if crate::daemon::fdstore::active() {
        // The service manager takes descriptors from the unit's main pid only (`NotifyAccess=
        // main`), which this process becomes once the old one said `MAINPID=` and exited: stored
        // again then.
        let (old, daemon) = (h.old_pid, daemon.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Path::new(&format!("/proc/{old}")).exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            for (thread, m) in lock(&daemon.mounts).iter() {
                crate::daemon::mounts::keep_mount(thread, m);
            }
        });
    }
    *lock(&ACK) = Some(s);
    remember_lock(&lock_file);
    if let Err(e) = crate::git::mirror::list(&layout) {
        tracing::error!("cannot load the projects: {e}");
    }
    daemon.prebuild_all_indexes();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(crate::daemon::server::BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(crate::daemon::server::run(daemon.clone()));
    crate::daemon::notify::stopping();
    daemon.unmount_all();
    crate::daemon::keeper::quit();
    let _ = std::fs::remove_file(layout.socket());
    drop(lock_file);
    result
}

/// Loads one handed-over mount's workspace and builds its session (not yet serving).
fn build(
    daemon: &Daemon,
    layout: &Layout,
    m: MountHandover,
    fds: &mut [Option<OwnedFd>],
    built: &mut Vec<Built>,
    old_pid: Option<u32>,
) -> Result<(), AdoptError> {
    let thread = m.thread;
    let mut take = |index: usize| {
        fds.get_mut(index)
            .and_then(Option::take)
            .ok_or_else(|| AdoptError::MissingFd {
                thread: thread.clone(),
                index,
            })
    };
    let dev = take(m.dev_fd)?;
    // Mapped now, before anything of this process could take its address.
    let ring = match (m.ring, m.ring_fd) {
        (Some(g), Some(i)) => Some(crate::fs::uring::KeptRing::map(g, take(i)?, old_pid)),
        // A ring connection whose memory did not come with it: still served from the rings
        // (the kernel sends every request there), with fresh entries only.
        (Some(g), None) => Some(crate::fs::uring::KeptRing::lost(g, old_pid)),
        _ => None,
    };
    let files = m
        .files
        .iter()
        .map(|&i| take(i).map(File::from))
        .collect::<Result<Vec<_>, _>>()?;
    let rec = WorkspaceRecord::load(layout, &thread)
        .map_err(|source| AdoptError::Record {
            thread: thread.clone(),
            source,
        })?
        .ok_or_else(|| AdoptError::NoRecord {
            thread: thread.clone(),
        })?;
    let core = daemon.load_core(&rec).map_err(|e| AdoptError::Core {
        thread: thread.clone(),
        source: Box::new(e),
    })?;
    let info = Arc::new(MountInfo::default());
    let is_root = crate::sys::euid() == 0;
    // The mode the kernel has the mount in (the old daemon's INIT decided it), whatever the
    // record or this daemon's setting say; its bytes held as when it was mounted.
    let mode = if m.adapter.no_open {
        crate::fs::IoMode::NoOpen
    } else {
        crate::fs::IoMode::Handles
    };
    let bytes = match rec.io_auto {
        _ if mode == crate::fs::IoMode::Handles => 0,
        Some(c) => c.bytes,
        None => daemon.base_bytes(&rec),
    };
    let io = daemon.io_budget.hold(mode, bytes, rec.base_tree);
    let adapter = FuseAdapter::new(
        core.clone(),
        is_root && daemon.passthrough_for(rec.owner.uid),
        info.clone(),
    )
    .with_io(mode)
    .with_objects(daemon.mirror_objects(&rec));
    core.watch_kernel();
    let cfg = crate::fs::fuse::mount_config(&thread, is_root);
    let n = m.negotiated;
    let negotiated = fuser::Negotiated {
        kernel_major: n.kernel_major,
        kernel_minor: n.kernel_minor,
        flags: n.flags,
        max_write: n.max_write,
        max_readahead: n.max_readahead,
    };
    let session = crate::fs::fuse::adopt(adapter, dev, &m.path, &cfg, negotiated, m.adapter, files)
        .map_err(|source| AdoptError::Session {
            thread: thread.clone(),
            source,
        })?;
    built.push(Built {
        thread: thread.clone(),
        path: m.path,
        session,
        info,
        core,
        owner: rec.owner,
        when_idle: rec.release_when_idle,
        io,
        ring,
    });
    Ok(())
}

/// A daemon that died left its mounts' connections with the keeper (`keeper`): this one serves
/// them, through the same adoption as a handover (`build`), with what the durable state gives
/// (record, catalog, upper layer) instead of the old daemon's memory. Each workspace's visible
/// names are registered (the kernel still refers to the old daemon's inodes by their stable
/// numbers), the requests the dead daemon read and never answered are asked for again
/// (`FUSE_NOTIFY_RESEND`, before a reader runs), then the session serves and the keeper gets this
/// daemon's descriptors. A mount that cannot be adopted is detached and let go (it is mounted
/// again from its record, as after a crash without a keeper).
pub(in crate::daemon) fn adopt_kept(
    daemon: &Daemon,
    layout: &Layout,
    kept: Vec<crate::daemon::keeper::Kept>,
) {
    for k in kept {
        let thread = k.thread.clone();
        let path = k.path.clone();
        let started = Instant::now();
        match adopt_one(daemon, layout, k) {
            Ok(names) => tracing::info!(
                %thread,
                names,
                ms = started.elapsed().as_millis() as u64,
                "adopted the mount of a daemon that died"
            ),
            Err(why) => {
                tracing::error!(%thread, "cannot adopt its mount ({why}): letting it go");
                let _ = crate::sys::lazy_unmount(&path);
                crate::daemon::keeper::forget(&thread);
            }
        }
    }
}

fn adopt_one(
    daemon: &Daemon,
    layout: &Layout,
    k: crate::daemon::keeper::Kept,
) -> Result<usize, AdoptError> {
    let thread = k.thread;
    let rec = WorkspaceRecord::load(layout, &thread)
        .map_err(AdoptError::KeptRecord)?
        .ok_or(AdoptError::KeptNoRecord)?;
    if !rec.mounted {
        return Err(AdoptError::NotMounted);
    }
    if k.path != layout.mountpoint(&thread) {
        return Err(AdoptError::KeptElsewhere(k.path));
    }
    // Unmounted behind the keeper (`umount -l` of the dead mount before this daemon started): its
    // connection ends with its last user, and entries registered on it then fail (`ENOTCONN`).
    // Mounted again from its record instead (mountinfo never asks the file system).
    let source = format!("octofs:{thread}");
    if crate::sys::fuse_mount_at(&k.path).is_none_or(|(_, s)| s != source) {
        return Err(AdoptError::KeptDetached(k.path));
    }
    let mut fds = k.fds;
    // A ring mount's memory (given last; found by what it is, whatever order a store kept).
    let ring_fd = match k.meta.ring {
        Some(_) => fds.iter().position(is_ring_memory).map(|i| fds.remove(i)),
        None => None,
    };
    let mut fds = fds.into_iter();
    let dev = fds.next().ok_or(AdoptError::NoDescriptor)?;
    // The dead daemon's clones: requests it read from them are queued again below.
    let old_clones: Vec<OwnedFd> = fds.collect();
    let ask = dev.try_clone()?;
    let m = MountHandover {
        thread: thread.clone(),
        path: k.path,
        dev_fd: 0,
        negotiated: k.meta.negotiated,
        adapter: AdapterState {
            passthrough: k.meta.passthrough,
            no_opendir: k.meta.no_opendir,
            no_open: k.meta.no_open,
            handles: Default::default(),
            nodes: Vec::new(),
        },
        files: Vec::new(),
        ring: k.meta.ring,
        ring_fd: ring_fd.is_some().then_some(1),
    };
    let mut slots = vec![Some(dev), ring_fd];
    let mut built = Vec::new();
    build(daemon, layout, m, &mut slots, &mut built, None)?;
    let b = built.pop().ok_or(AdoptError::NothingBuilt)?;
    let names = b.core.register_all().map_err(AdoptError::Register)?;
    // Before any reader runs: a request read by a new reader and queued again would be served
    // twice.
    match crate::sys::fuse_notify_resend(ask.as_fd()) {
        Ok(()) => {}
        Err(e) => tracing::warn!(
            %thread,
            "the kernel cannot send again the requests the dead daemon held (FUSE_NOTIFY_RESEND, \
             Linux 6.9): {e}; a process waiting for one of them waits until killed"
        ),
    }
    let session = crate::fs::uring::serve_adopted(
        b.session,
        &b.path,
        b.ring,
        &b.info.transport,
        &b.info.ring,
    )?;
    drop(old_clones);
    if b.when_idle {
        lock(&daemon.idle_waits).insert(thread.clone());
    }
    let dev = crate::daemon::mounts::kernel_dev(&b.path, &thread);
    let mounted = Mounted {
        path: b.path,
        session: session.into(),
        info: b.info,
        core: b.core,
        owner: b.owner,
        dev,
        io: b.io,
    };
    crate::daemon::mounts::keep_mount(&thread, &mounted);
    lock(&daemon.mounts).insert(thread, mounted);
    daemon.grant_owner(&rec.project, rec.owner, true);
    Ok(names)
}

/// Whether `fd` is a ring memory (`RingMemory`'s memfd), not a `/dev/fuse` descriptor.
fn is_ring_memory(fd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|p| p.to_string_lossy().starts_with("/memfd:octofs-ring"))
}
