//! Mounting: a workspace's core loaded over its base and served at `<root>/<thread>` by its own
//! fuser session (through `super::mounter`, the seam a test replaces with a core-only mounter);
//! unmounting (refused when busy unless forced, then detached lazily); remounting
//! every mounted workspace when the daemon starts and unmounting all when it stops; and telling
//! the kernel what the daemon changed in a mount behind its back. Whether a thread is mounted is
//! the kernel's word (mountinfo: this daemon's mount, on the connection it made, at the path), not
//! the table's: a mount taken away behind the daemon is let go and mounted again by `open` and
//! `doctor --fix` (docs/restart.md).
//!
//! The `mounts` map is locked only to insert, remove or clone out of it, never across a mount,
//! an unmount or a question to the core.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::error::{Context, Error};
use super::guard::LockKey;
use super::refusal::WorkspaceRefusal;
use super::{Daemon, Mounted, lock};

use crate::fs::objects::MirrorObjects;
use crate::fs::{Durable, Presentation, WorkspaceFs, unix_time};
use crate::workspace::WorkspaceRecord;

/// The background sync of the state file system after an unclean stop (none after a clean one):
/// every workspace core loaded while it runs reports nothing durable before it has finished.
static UNCLEAN_SYNC: OnceLock<Arc<Durable>> = OnceLock::new();

/// Starts syncing `layout`'s state file system in the background (an unclean stop before).
pub(super) fn sync_unclean_state(layout: &crate::layout::Layout) {
    let barrier = Durable::pending();
    if UNCLEAN_SYNC.set(barrier.clone()).is_err() {
        return;
    }
    let state = layout.state.clone();
    let run = move || {
        let started = std::time::Instant::now();
        let r = crate::sys::syncfs(&state).map_err(|e| {
            format!(
                "cannot sync the state file system after an unclean stop ({}): {e}",
                state.display()
            )
        });
        if r.is_ok() {
            tracing::info!(
                ms = started.elapsed().as_millis() as u64,
                "unclean stop before: state file system synced"
            );
        }
        barrier.finish(r);
    };
    if let Err(e) = std::thread::Builder::new()
        .name("octofs-unclean-sync".into())
        .spawn(run)
    {
        tracing::error!("cannot sync the state file system in the background: {e}");
    }
}

impl Daemon {
    pub(super) fn check_root(&self) -> Result<(), Error> {
        match std::fs::metadata(&self.layout.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(WorkspaceRefusal::RootNotADirectory {
                root: self.layout.root.clone(),
            }
            .into()),
            Err(error) => Err(WorkspaceRefusal::Root {
                root: self.layout.root.clone(),
                error,
            }
            .into()),
        }
    }

    /// Mounts the workspace of `rec` at its mount point. The caller holds the thread's lock.
    /// Returns a one-line note when files found in the bare mount point were moved into the
    /// workspace.
    pub(super) fn mount(&self, rec: &WorkspaceRecord) -> Result<Option<String>, Error> {
        let core = self.load_core(rec)?;
        self.refuse_unseeded(rec, &core)?;
        self.refresh_fsmonitor(rec, &core);
        let (io, chosen) = self.io_hold(rec);
        let note = self.mount_core(rec, core, true, io)?;
        if let Some(c) = chosen {
            // Chosen now (a workspace mounted before auto was the setting): kept for its life.
            let mut kept = rec.clone();
            kept.io_auto = Some(c);
            if let Err(e) = kept.save(&self.layout) {
                tracing::warn!(thread = %rec.thread, "cannot record its I/O mode: {e}");
            }
        }
        Ok(note)
    }

    /// The I/O mode `rec`'s mount gets, held against the no-open budget (`io_auto`): the thread's
    /// own (`open --io`), else a fixed `serve --io`, else (`auto`) the one chosen at an earlier
    /// mount of this workspace, else one chosen now — returned too, for the caller to keep in the
    /// record.
    pub(super) fn io_hold(
        &self,
        rec: &WorkspaceRecord,
    ) -> (super::io_auto::Hold, Option<crate::workspace::IoChosen>) {
        use super::io_auto::IoSetting;
        use crate::fs::IoMode;
        let held = |mode: IoMode| {
            let bytes = if mode == IoMode::NoOpen {
                self.base_bytes(rec)
            } else {
                0
            };
            self.io_budget.hold(mode, bytes, rec.base_tree)
        };
        if let Some(mode) = rec.io {
            return (held(mode), None);
        }
        match (self.settings.io, rec.io_auto) {
            (IoSetting::Mode(mode), _) => (held(mode), None),
            (IoSetting::Auto, Some(c)) => {
                (self.io_budget.hold(c.mode, c.bytes, rec.base_tree), None)
            }
            (IoSetting::Auto, None) => {
                let (chosen, hold) = self.io_budget.decide(self.base_bytes(rec), rec.base_tree);
                tracing::info!(
                    thread = %rec.thread,
                    "I/O mode {} ({})",
                    chosen.mode,
                    super::io_auto::why(false, Some(&chosen))
                );
                (hold, Some(chosen))
            }
        }
    }

    /// Why `rec`'s mount has its I/O mode, as `status` and `stats` say it (`io_auto::why`).
    pub(super) fn io_why(&self, rec: &WorkspaceRecord) -> String {
        match self.settings.io {
            super::io_auto::IoSetting::Mode(_) => super::io_auto::why(rec.io.is_some(), None),
            super::io_auto::IoSetting::Auto => {
                super::io_auto::why(rec.io.is_some(), rec.io_auto.as_ref())
            }
        }
    }

    /// The file bytes of `rec`'s base: kept beside its shared index (`repo::index_bytes`), no
    /// blob read; 0 when there is no such index (logged).
    pub(super) fn base_bytes(&self, rec: &WorkspaceRecord) -> u64 {
        let tree = rec.base_tree;
        let index =
            crate::repo::shared_index_path(&self.layout, tree, tree, rec.owner.uid, rec.owner.gid);
        crate::repo::index_bytes(&index).unwrap_or_else(|| {
            tracing::warn!(thread = %rec.thread, "no shared index: its base's bytes count as 0");
            0
        })
    }

    /// Points an existing workspace's fsmonitor hook at this daemon's hook program (its binary may
    /// have moved since the workspace was made: git would print an error and rescan at every
    /// status). Never fails the mount: a workspace without the hook is still correct, only slower.
    fn refresh_fsmonitor(&self, rec: &WorkspaceRecord, core: &WorkspaceFs) {
        let refreshed = std::env::current_exe()
            .map_err(|e| e.to_string())
            .and_then(|exe| {
                crate::repo::refresh_fsmonitor(core, &self.layout, &rec.thread, &exe)
                    .map_err(|e| e.to_string())
            });
        match refreshed {
            Ok(true) => tracing::info!(thread = %rec.thread, "core.fsmonitor brought up to date"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(thread = %rec.thread, "cannot refresh the fsmonitor hook: {e}")
            }
        }
    }

    /// Loads the filesystem core of `rec`'s workspace (its upper layer over its base).
    pub(super) fn load_core(&self, rec: &WorkspaceRecord) -> Result<Arc<WorkspaceFs>, Error> {
        let store = self.store(&rec.project)?;
        let base = rec.base_tree;
        // The view's root: the base with the dependency layers grafted in (the same tree at every
        // load). A layer that cannot be grafted is left out, logged: the workspace still opens.
        let tree = match crate::git::graft::graft(&store, base, &super::layers::grafts(rec)) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(thread = %rec.thread, "cannot present the dependency layers: {e}");
                base
            }
        };
        let pres = Presentation {
            uid: rec.owner.uid,
            gid: rec.owner.gid,
            time: unix_time(rec.base_time),
        };
        let core = WorkspaceFs::load(
            store,
            self.blobs.clone(),
            tree,
            pres,
            &self.layout.workspace(&rec.thread).join("upper"),
            self.layout.state.clone(),
        )
        .context(|| format!("thread {}: cannot open its upper layer", rec.thread))?;
        self.count_bytes(&core, rec.owner.uid);
        if let Some(b) = UNCLEAN_SYNC.get()
            && !b.is_finished()
        {
            core.durable_after(b.clone());
        }
        let core = Arc::new(core);
        self.index_still_missing(rec, &core);
        Ok(core)
    }

    /// The mirror's objects as `rec`'s workspace presents them at `.git/octofs/objects`; `None`
    /// (logged) when the mirror's object directory cannot be opened: the workspace still mounts.
    pub(super) fn mirror_objects(&self, rec: &WorkspaceRecord) -> Option<Arc<MirrorObjects>> {
        let dir = self
            .layout
            .mirror(&rec.project)
            .join(".git")
            .join("objects");
        let gate = self.objects_gate(&rec.project, rec.owner);
        match MirrorObjects::at(&dir, rec.owner.uid, rec.owner.gid, gate) {
            Ok(o) => Some(Arc::new(o)),
            Err(e) => {
                tracing::error!(thread = %rec.thread, "cannot present the mirror's objects ({}): {e}", dir.display());
                None
            }
        }
    }

    /// A workspace seeded before `.git/octofs` existed names the mirror's objects by their host
    /// path in `objects/info/alternates`: it is pointed at the copy inside the mount, so git in a
    /// sandbox that binds only the workspace finds the history too. Anything else there (the
    /// owner's own alternates) is left alone. A failure is logged: the old path still works on
    /// the host.
    pub(super) fn relative_alternates(&self, rec: &WorkspaceRecord, core: &WorkspaceFs) {
        let path: [&[u8]; 4] = [b".git", b"objects", b"info", b"alternates"];
        let host = self
            .layout
            .mirror(&rec.project)
            .join(".git")
            .join("objects");
        let Ok(Some(now)) = core.read_file(&path) else {
            return;
        };
        if now.trim_ascii_end() != host.as_os_str().as_encoded_bytes() {
            return;
        }
        let line = format!("{}\n", crate::fs::objects::ALTERNATE);
        if let Err(e) = core.put_bytes_quietly(&path[..3], b"alternates", line.as_bytes()) {
            tracing::warn!(thread = %rec.thread, "cannot make the alternates relative: {e:?}");
        }
    }

    /// Mounts a loaded workspace at its mount point. The caller holds the thread's lock. With
    /// `strays` (a workspace mounted before), files found in the bare mount point are the thread's:
    /// they are moved into the workspace first, and the note returned says where; without (a
    /// workspace being made), a mount point that is not empty is refused — what is there is not
    /// the new workspace's.
    pub(super) fn mount_core(
        &self,
        rec: &WorkspaceRecord,
        core: Arc<WorkspaceFs>,
        strays: bool,
        io: super::io_auto::Hold,
    ) -> Result<Option<String>, Error> {
        let path = self.layout.mountpoint(&rec.thread);
        if self.mounter.is_stale(&path) {
            let _ = self.mounter.lazy_unmount(&path);
        }
        // Whoever can write in the root must not redirect the mount (root's, content chosen by
        // the workspace's owner) onto a directory elsewhere.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(WorkspaceRefusal::MountPointSymlink { path }.into());
        }
        let mut note = None;
        match std::fs::read_dir(&path) {
            Ok(mut d) => {
                let occupied = d.next().is_some();
                if occupied && !strays {
                    return Err(WorkspaceRefusal::MountPointNotEmpty { path }.into());
                }
                if occupied {
                    // Written into the bare directory while the mount was gone: the thread's.
                    note = super::strays::move_into(&core, &path, rec.owner)
                        .map_err(|why| WorkspaceRefusal::Strays { why })?
                        .map(|(into, moved)| moved.describe(&path, &into));
                    if let Some(n) = &note {
                        tracing::warn!(thread = %rec.thread, "{n}");
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&path)
                    .context(|| format!("cannot create mount point {}", path.display()))?;
            }
            Err(error) => {
                return Err(WorkspaceRefusal::MountPoint { path, error }.into());
            }
        }
        self.relative_alternates(rec, &core);
        let (session, info) = self.mounter.mount(self, rec, &core, &path, io.mode)?;
        tracing::info!(thread = %rec.thread, path = %path.display(), "mounted");
        let dev = self.mounter.kernel_dev(&path, &rec.thread);
        let m = Mounted {
            path,
            session,
            info,
            core,
            owner: rec.owner,
            dev,
            io,
        };
        keep_mount(&rec.thread, &m);
        lock(&self.mounts).insert(rec.thread.clone(), m);
        Ok(note)
    }

    /// `doctor --fix`: mounts `thread` again when it is recorded as mounted and the kernel has no
    /// mount of it (its users stay as recorded). Answers whether it mounted anything, with the
    /// note of files moved in from the bare mount point.
    pub(super) fn remount(&self, thread: &str, c: &crate::access::Caller) -> super::Reply<bool> {
        self.require_admin(c, "remount a workspace")?;
        crate::names::validate(crate::names::NameKind::Thread, thread)?;
        let l = self.locks.get(&LockKey::thread(thread));
        let _g = lock(&l);
        let Some(rec) = WorkspaceRecord::load(&self.layout, thread)? else {
            return Err(WorkspaceRefusal::NoWorkspace {
                thread: thread.into(),
            }
            .into());
        };
        if !rec.mounted {
            return Err(WorkspaceRefusal::NotRecordedMounted {
                thread: thread.into(),
            }
            .into());
        }
        self.forget_lost_mount(thread)?;
        if self.kernel_has(thread) {
            return Ok((false, Vec::new()));
        }
        let note = self.mount(&rec)?;
        tracing::info!(%thread, "mounted again (doctor --fix)");
        Ok((true, note.into_iter().collect()))
    }

    /// Whether the kernel has this daemon's mount of `thread` at its mount point now — the
    /// `mounts` table only says the daemon serves a connection, and a mount can be taken away
    /// behind it (`umount`, a restart that once unmounted idle mounts). Asked of mountinfo, never
    /// of the mount (a hung one would hang the question).
    pub(super) fn kernel_has(&self, thread: &str) -> bool {
        lock(&self.mounts)
            .get(thread)
            .is_some_and(|m| in_kernel(self.mounter.as_ref(), thread, m))
    }

    /// Lets go of `thread`'s session when the kernel no longer has its mount, so that it can be
    /// mounted again. Its connection ends with the mount, and with it the session; a detached mount
    /// a process still uses keeps both (the session goes on serving that process) and the remount
    /// is refused, the session kept: two cores must never serve one upper layer. The session is
    /// disowned, never unmounted: whatever is at the path now is not its mount. The caller holds
    /// the thread's lock.
    pub(super) fn forget_lost_mount(&self, thread: &str) -> Result<(), Error> {
        let lost = lock(&self.mounts)
            .get(thread)
            .is_some_and(|m| !in_kernel(self.mounter.as_ref(), thread, m));
        if !lost {
            return Ok(());
        }
        tracing::warn!(%thread, "its mount is gone from the kernel; letting its session go");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let ended = lock(&self.mounts)
                .get(thread)
                .map(|m| (m.session.is_finished(), m.path.clone()));
            match ended {
                None => return Ok(()),
                Some((true, _)) => break,
                Some((false, path)) if std::time::Instant::now() >= deadline => {
                    return Err(WorkspaceRefusal::DetachedInUse {
                        thread: thread.into(),
                        path,
                    }
                    .into());
                }
                Some(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        if let Some(m) = lock(&self.mounts).remove(thread) {
            m.session.disown();
            super::keeper::forget(thread);
        }
        Ok(())
    }

    /// Tells the kernel serving `thread`'s mount what the daemon changed in it behind the kernel
    /// (`docs/caching.md`), before the request that changed it is answered. This runs on a request
    /// worker, never a FUSE thread, holding no lock a FUSE request waits for (the kernel may wait
    /// for requests in flight on the same inodes first).
    pub(super) fn tell_kernel(&self, thread: &str) {
        // (A core-only mount has no kernel to tell.)
        let Some((core, notifier, info)) = lock(&self.mounts)
            .get(thread)
            .and_then(|m| Some((m.core.clone(), m.session.notifier()?, m.info.clone())))
        else {
            return;
        };
        crate::fs::fuse::invalidate_mount(&info, &notifier, &core.take_behind());
    }

    /// Unmounts one thread's workspace. A busy mount (a process has its cwd or files in it) is
    /// refused and stays mounted, unless `force`, which detaches it lazily.
    pub(super) fn unmount_thread(&self, thread: &str, force: bool) -> Result<(), Error> {
        // An index still being put in (`later_index`) is in before the mount goes: nothing writes
        // the upper layer of a workspace after its unmount (its directory may be removed and made
        // again by the next open).
        let core = lock(&self.mounts).get(thread).map(|m| m.core.clone());
        if let Some(core) = core {
            let _ = core.wait_unheld();
        }
        let Some(m) = lock(&self.mounts).remove(thread) else {
            return Ok(());
        };
        match self.mounter.unmount(&m.path) {
            Ok(()) => {
                super::keeper::forget(thread);
                let (tx, rx) = std::sync::mpsc::channel();
                let session = m.session;
                std::thread::spawn(move || {
                    let _ = tx.send(session.join());
                });
                let _ = rx.recv_timeout(Duration::from_secs(5));
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !force => {
                let path = m.path.clone();
                lock(&self.mounts).insert(thread.to_string(), m);
                Err(WorkspaceRefusal::Busy { path }.into())
            }
            Err(e) => {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    tracing::warn!(%thread, "busy mount detached lazily (--force)");
                }
                let _ = self.mounter.lazy_unmount(&m.path);
                drop(m.session);
                super::keeper::forget(thread);
                Ok(())
            }
        }
    }

    pub(super) fn core_of(&self, rec: &WorkspaceRecord) -> Result<Arc<WorkspaceFs>, Error> {
        let served = lock(&self.mounts).get(&rec.thread).map(|m| m.core.clone());
        if let Some(core) = served {
            self.settled(&core);
            return Ok(core);
        }
        if let Some(note) = self.mount(rec)? {
            tracing::warn!(thread = %rec.thread, "{note}");
        }
        lock(&self.mounts)
            .get(&rec.thread)
            .map(|m| m.core.clone())
            .ok_or_else(|| Error::NotMounted(rec.thread.clone()))
    }

    /// Remounts every workspace that was mounted when the daemon last stopped.
    pub(super) fn remount_all(&self) {
        let records = match WorkspaceRecord::list(&self.layout) {
            Ok(r) => r,
            Err(e) => return tracing::error!("cannot list workspaces: {e}"),
        };
        for rec in records.into_iter().filter(|r| r.mounted) {
            // Adopted from the keeper: served already.
            if lock(&self.mounts).contains_key(&rec.thread) {
                continue;
            }
            if let Err(e) = self.mount(&rec) {
                tracing::error!(thread = %rec.thread, "cannot remount: {e}");
            } else if rec.release_when_idle {
                lock(&self.idle_waits).insert(rec.thread.clone());
            }
            // Whatever changed the mirror's modes while the daemon was away, the owner keeps
            // reading its objects (a failure is logged).
            self.grant_owner(&rec.project, rec.owner, true);
        }
    }

    /// Unmounts every workspace, leaving their records as they are so that the next daemon remounts
    /// them. A busy mount is detached lazily: its users see the daemon gone, never a hang.
    pub(super) fn unmount_all(&self) {
        let mounts: Vec<_> = lock(&self.mounts).drain().collect();
        for (thread, m) in mounts {
            unmount(self.mounter.as_ref(), &thread, m);
        }
    }
}

/// Gives the connection keeper the descriptors `m`'s requests are read from, with what the next
/// daemon needs to serve them (docs/restart.md "A crash"). A mount on the io_uring transport also
/// gives its ring memory (last), whose entries the next daemon takes over.
pub(super) fn keep_mount(thread: &str, m: &Mounted) {
    use std::sync::atomic::Ordering;
    if !super::keeper::attached() {
        return;
    }
    let Some(negotiated) = m.session.negotiated() else {
        return;
    };
    let mut fds = match m.session.dup_reader_fds() {
        Ok(f) => f,
        Err(e) => {
            return tracing::warn!(%thread, "cannot keep its connection: {e}");
        }
    };
    let ring = m.info.ring.get();
    if let Some(r) = ring {
        match r.dup_fd() {
            Ok(f) => fds.push(f),
            Err(e) => return tracing::warn!(%thread, "cannot keep its ring memory: {e}"),
        }
    }
    let meta = super::keeper::KeptMeta {
        negotiated: negotiated.into(),
        passthrough: m.info.passthrough.load(Ordering::Relaxed),
        no_opendir: m.info.no_opendir.load(Ordering::Relaxed),
        no_open: m.info.no_open.load(Ordering::Relaxed),
        ring: ring.map(|r| r.geometry),
    };
    super::keeper::keep(thread, &m.path, meta, &fds);
}

fn unmount(mounter: &dyn super::mounter::Mounter, thread: &str, m: Mounted) {
    // fuser unmounts and joins the session threads; a busy mount fails fast with EBUSY and is then
    // detached lazily, so its users see the daemon gone instead of a hang.
    let Mounted { path, session, .. } = m;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(session.umount_and_join());
    });
    super::keeper::forget(thread);
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => tracing::info!(%thread, "unmounted"),
        outcome => {
            let why = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => "no answer within 5 s".to_string(),
            };
            tracing::warn!(%thread, "unmount: {why}; detaching lazily");
            if let Err(e) = mounter.lazy_unmount(&path) {
                tracing::error!(%thread, "lazy unmount: {e}");
            }
        }
    }
}

/// The device the kernel gave the octofs mount of `thread` at `path` (`statx`, or mountinfo on a
/// kernel that cannot say), if it has one.
pub(super) fn kernel_dev(path: &Path, thread: &str) -> Option<String> {
    // mountinfo has the canonical path (fuser mounts there); only the root is resolved, never the
    // mount point itself (that would ask the mount).
    let canonical = match (path.parent().map(std::fs::canonicalize), path.file_name()) {
        (Some(Ok(dir)), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    };
    // In constant time when the kernel can say (mountinfo costs O(mounts) and was most of an
    // `open` at 1,000 mounts): a device is one connection's, so equal devices are the same mount.
    if let Ok(dev) = crate::sys::mount_root_dev(&canonical) {
        return dev;
    }
    crate::sys::fuse_mount_at(&canonical)
        .filter(|(_, source)| *source == format!("octofs:{thread}"))
        .map(|(dev, _)| dev)
}

/// Whether the kernel has `m` (the mount of `thread`) at its path: the topmost mount there is
/// octofs's of that thread, on the connection it had when mounted.
fn in_kernel(mounter: &dyn super::mounter::Mounter, thread: &str, m: &Mounted) -> bool {
    match (mounter.kernel_dev(&m.path, thread), &m.dev) {
        (Some(now), Some(then)) => now == *then,
        (now, None) => now.is_some(),
        (None, Some(_)) => false,
    }
}

/// Unmounts stale mounts (daemon gone: ENOTCONN) under `root`.
pub(super) fn clear_stale_mounts(root: &Path) {
    for mp in crate::sys::fuse_mounts_under(root) {
        if crate::sys::is_stale_mount(&mp) {
            match crate::sys::lazy_unmount(&mp) {
                Ok(()) => tracing::info!(path = %mp.display(), "cleared stale mount"),
                Err(e) => tracing::warn!(path = %mp.display(), "cannot clear stale mount: {e}"),
            }
        }
    }
}
