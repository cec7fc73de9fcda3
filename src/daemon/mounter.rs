//! How a loaded workspace core is served at its mount point: the [`Mounter`] seam, with the FUSE
//! mounter ([`Fuse`]: the kernel mounts it and a fuser session serves it) and a core-only one
//! ([`CoreOnly`], for tests: the core is held without a kernel mount, so that the daemon's own
//! lifecycle code runs without root or `/dev/fuse`). Also the [`Session`] a served workspace keeps.
//!
//! Owns the kernel-facing half of mounting: making the session, whether the kernel has a mount,
//! whether a process uses one, unmounting. Must not decide when to mount or unmount (that is
//! `super::mounts` and `super::threads`), nor touch records or the mount point's contents.

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::Daemon;
use super::error::{Context, Error};
use crate::fs::fuse::{FuseAdapter, MountInfo};
use crate::fs::{IoMode, WorkspaceFs};
use crate::workspace::WorkspaceRecord;

/// How the daemon mounts, unmounts and asks about a workspace's mount.
pub(super) trait Mounter: Send + Sync {
    /// Serves `core` (`rec`'s workspace) at `path`, an existing directory, in `io` mode.
    fn mount(
        &self,
        d: &Daemon,
        rec: &WorkspaceRecord,
        core: &Arc<WorkspaceFs>,
        path: &Path,
        io: IoMode,
    ) -> Result<(Session, Arc<MountInfo>), Error>;
    /// The device of the mount of `thread` at `path` (none: nothing of it is mounted there).
    fn kernel_dev(&self, path: &Path, thread: &str) -> Option<String>;
    /// Unmounts `path` (EBUSY while a process uses it).
    fn unmount(&self, path: &Path) -> io::Result<()>;
    /// Detaches `path` lazily (its users keep it until they leave).
    fn lazy_unmount(&self, path: &Path) -> io::Result<()>;
    /// Whether a mount whose daemon is gone is left at `path`.
    fn is_stale(&self, path: &Path) -> bool;
    /// Whether a process uses the mount at `path`; an idle answer marks it expired.
    fn is_busy(&self, path: &Path) -> bool;
    /// [`Self::is_busy`], waiting up to `patience` for a process on its way out.
    fn is_busy_settled(&self, path: &Path, patience: Duration) -> bool;
    /// A copy of the mount at `path` elsewhere (a sandbox's bind): a process and its path there.
    fn bound_elsewhere(&self, path: &Path) -> Option<(u32, PathBuf)>;
}

/// The kernel's mounts, served by fuser sessions: what the daemon runs with.
pub(super) struct Fuse;

impl Mounter for Fuse {
    fn mount(
        &self,
        d: &Daemon,
        rec: &WorkspaceRecord,
        core: &Arc<WorkspaceFs>,
        path: &Path,
        io: IoMode,
    ) -> Result<(Session, Arc<MountInfo>), Error> {
        let info = Arc::new(MountInfo::default());
        let is_root = crate::sys::euid() == 0;
        let adapter = FuseAdapter::new(
            core.clone(),
            is_root && d.passthrough_for(rec.owner.uid),
            info.clone(),
        )
        .with_io(io)
        .with_objects(d.mirror_objects(rec));
        // From here on, what the daemon changes other than through the mount is told to the kernel.
        core.watch_kernel();
        let cfg = crate::fs::fuse::mount_config(&rec.thread, is_root);
        let session = crate::fs::fuse::mount(adapter, path, &cfg, d.settings.transport)
            .context(|| format!("cannot mount {}", path.display()))?;
        Ok((Session::Fuse(session), info))
    }

    fn kernel_dev(&self, path: &Path, thread: &str) -> Option<String> {
        super::mounts::kernel_dev(path, thread)
    }

    fn unmount(&self, path: &Path) -> io::Result<()> {
        crate::sys::unmount(path)
    }

    fn lazy_unmount(&self, path: &Path) -> io::Result<()> {
        crate::sys::lazy_unmount(path)
    }

    fn is_stale(&self, path: &Path) -> bool {
        crate::sys::is_stale_mount(path)
    }

    fn is_busy(&self, path: &Path) -> bool {
        crate::sys::is_busy(path)
    }

    fn is_busy_settled(&self, path: &Path, patience: Duration) -> bool {
        crate::sys::is_busy_settled(path, patience)
    }

    fn bound_elsewhere(&self, path: &Path) -> Option<(u32, PathBuf)> {
        crate::sys::bound_elsewhere(path)
    }
}

/// Cores held without a kernel mount (tests only): a path is "mounted" from its mount until its
/// unmount, or until a test takes it away behind the daemon; a test may mark one busy.
#[cfg(test)]
#[derive(Default)]
pub(super) struct CoreOnly {
    mounted: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
    busy: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
}

#[cfg(test)]
impl CoreOnly {
    /// Takes the mount at `path` away behind the daemon (as an `umount` by hand would).
    pub(super) fn take_away(&self, path: &Path) {
        super::lock(&self.mounted).remove(path);
    }

    /// Marks the mount at `path` used by a process, or no longer.
    pub(super) fn set_busy(&self, path: &Path, busy: bool) {
        if busy {
            super::lock(&self.busy).insert(path.to_path_buf());
        } else {
            super::lock(&self.busy).remove(path);
        }
    }
}

#[cfg(test)]
impl Mounter for CoreOnly {
    fn mount(
        &self,
        _: &Daemon,
        _: &WorkspaceRecord,
        _: &Arc<WorkspaceFs>,
        path: &Path,
        _: IoMode,
    ) -> Result<(Session, Arc<MountInfo>), Error> {
        super::lock(&self.mounted).insert(path.to_path_buf());
        Ok((Session::Core, Arc::new(MountInfo::default())))
    }

    fn kernel_dev(&self, path: &Path, _: &str) -> Option<String> {
        super::lock(&self.mounted)
            .contains(path)
            .then(|| "core-only".to_string())
    }

    fn unmount(&self, path: &Path) -> io::Result<()> {
        if super::lock(&self.busy).contains(path) {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        super::lock(&self.mounted).remove(path);
        Ok(())
    }

    fn lazy_unmount(&self, path: &Path) -> io::Result<()> {
        super::lock(&self.mounted).remove(path);
        Ok(())
    }

    fn is_stale(&self, _: &Path) -> bool {
        false
    }

    fn is_busy(&self, path: &Path) -> bool {
        super::lock(&self.busy).contains(path)
    }

    fn is_busy_settled(&self, path: &Path, _: Duration) -> bool {
        self.is_busy(path)
    }

    fn bound_elsewhere(&self, _: &Path) -> Option<(u32, PathBuf)> {
        None
    }
}

/// What serves a mounted workspace: a fuser session, or nothing (a core-only mount).
pub(super) enum Session {
    Fuse(fuser::BackgroundSession),
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "made by the core-only mounter, in tests only")
    )]
    Core,
}

impl From<fuser::BackgroundSession> for Session {
    fn from(s: fuser::BackgroundSession) -> Session {
        Session::Fuse(s)
    }
}

/// What a core-only mount answers where a kernel connection is asked for.
fn no_connection() -> io::Error {
    io::Error::other("a core-only mount has no kernel connection")
}

impl Session {
    /// Whether its session threads have ended (the connection with them).
    pub(super) fn is_finished(&self) -> bool {
        match self {
            Session::Fuse(s) => s.guard.is_finished(),
            Session::Core => true,
        }
    }

    /// Lets go of the session without unmounting.
    pub(super) fn disown(self) {
        if let Session::Fuse(s) = self {
            s.disown();
        }
    }

    pub(super) fn notifier(&self) -> Option<fuser::Notifier> {
        match self {
            Session::Fuse(s) => Some(s.notifier()),
            Session::Core => None,
        }
    }

    pub(super) fn negotiated(&self) -> Option<fuser::Negotiated> {
        match self {
            Session::Fuse(s) => s.negotiated(),
            Session::Core => None,
        }
    }

    pub(super) fn dup_dev_fd(&self) -> io::Result<OwnedFd> {
        match self {
            Session::Fuse(s) => s.dup_dev_fd(),
            Session::Core => Err(no_connection()),
        }
    }

    pub(super) fn dup_reader_fds(&self) -> io::Result<Vec<OwnedFd>> {
        match self {
            Session::Fuse(s) => s.dup_reader_fds(),
            Session::Core => Err(no_connection()),
        }
    }

    pub(super) fn pause_readers(&self, timeout: Duration) -> io::Result<()> {
        match self {
            Session::Fuse(s) => s.pause_readers(timeout),
            Session::Core => Ok(()),
        }
    }

    pub(super) fn resume_readers(&self) {
        if let Session::Fuse(s) = self {
            s.resume_readers();
        }
    }

    /// Waits for the session threads to end (after an unmount).
    pub(super) fn join(self) -> io::Result<()> {
        match self {
            Session::Fuse(s) => s.join(),
            Session::Core => Ok(()),
        }
    }

    /// Unmounts and waits for the session threads to end.
    pub(super) fn umount_and_join(self) -> io::Result<()> {
        match self {
            Session::Fuse(s) => s.umount_and_join(),
            Session::Core => Ok(()),
        }
    }
}
