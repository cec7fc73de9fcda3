//! Filesystem session
//!
//! A session runs a filesystem implementation while it is being mounted to a specific mount
//! point. A session begins by mounting the filesystem and ends by unmounting it. While the
//! filesystem is mounted, the session loop receives, dispatches and replies to kernel requests
//! for filesystem operations under its mount point.

use std::borrow::Cow;
use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::BorrowedFd;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::thread::{self};

use log::debug;
use log::error;
use log::info;
use log::warn;
use nix::unistd::Uid;
use nix::unistd::geteuid;
use parking_lot::Mutex;

use crate::Errno;
use crate::Filesystem;
use crate::KernelConfig;
use crate::MountOption;
use crate::ReplyEmpty;
use crate::Request;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::dev_fuse::DevFuse;
use crate::ll;
use crate::ll::Operation;
use crate::ll::ResponseErrno;
use crate::ll::Version;
use crate::ll::flags::init_flags::InitFlags;
use crate::ll::fuse_abi as abi;
use crate::mnt::Mount;
use crate::mnt::mount_options::Config;
use crate::mnt::mount_options::check_option_conflicts;
use crate::notify::Notifier;
use crate::read_buf::FuseReadBuf;
use crate::reply::Reply;
use crate::reply::ReplyRaw;
use crate::reply::ReplySender;
use crate::reply::RingReplySink;
use crate::request::RequestWithSender;

/// The max size of write requests from the kernel. The absolute minimum is 4k,
/// FUSE recommends at least 128k, max 16M. The FUSE default is 16M on macOS
/// and 128k on other systems.
pub(crate) const MAX_WRITE_SIZE: usize = 16 * 1024 * 1024;

#[derive(Default, Debug, Eq, PartialEq, Clone, Copy)]
/// How requests should be filtered based on the calling UID.
pub enum SessionACL {
    /// Allow requests from any user. Corresponds to the `allow_other` mount option.
    All,
    /// Allow requests from root. Corresponds to the `allow_root` mount option.
    RootAndOwner,
    /// Allow requests from the owning UID. This is FUSE's default mode of operation.
    #[default]
    Owner,
}

impl SessionACL {
    /// Returns the mount option string for kernel/fusermount/libfuse paths.
    /// Both `All` and `RootAndOwner` map to `allow_other` - the kernel only
    /// understands `allow_other`, and fuser enforces the root-only restriction internally.
    #[allow(dead_code)]
    pub(crate) fn to_mount_option(self) -> Option<&'static str> {
        match self {
            SessionACL::All | SessionACL::RootAndOwner => Some("allow_other"),
            SessionACL::Owner => None,
        }
    }
}

/// Calls `destroy` on drop.
#[derive(Debug)]
pub(crate) struct FilesystemHolder<FS: Filesystem> {
    pub(crate) fs: Option<FS>,
    /// Told once `destroy` ran, for a session served by the pool (octofs patch).
    pub(crate) done: Option<Arc<PoolCtl>>,
}

impl<FS: Filesystem> FilesystemHolder<FS> {
    fn destroy(&mut self) {
        if let Some(mut fs) = self.fs.take() {
            fs.destroy();
        }
    }
}

impl<FS: Filesystem> Drop for FilesystemHolder<FS> {
    fn drop(&mut self) {
        self.destroy();
        if let Some(done) = self.done.take() {
            done.complete();
        }
    }
}

#[derive(Debug)]
struct UmountOnDrop {
    mount: Arc<Mutex<Option<Mount>>>,
}

impl UmountOnDrop {
    fn umount(&self) -> io::Result<()> {
        if let Some(mount) = self.mount.lock().take() {
            mount.umount()?;
        }
        Ok(())
    }
}

impl Drop for UmountOnDrop {
    fn drop(&mut self) {
        if let Err(e) = self.umount() {
            warn!("Failed to umount filesystem: {}", e);
        }
    }
}

/// The session data structure
#[derive(Debug)]
pub struct Session<FS: Filesystem> {
    /// Filesystem operation implementations. None after `destroy` called.
    pub(crate) filesystem: FilesystemHolder<FS>,
    /// Communication channel to the kernel driver
    pub(crate) ch: Channel,
    /// Handle to the mount.  Dropping this unmounts.
    mount: UmountOnDrop,
    /// Whether to restrict access to owner, root + owner, or unrestricted
    /// Used to implement `allow_root` and `auto_unmount`
    pub(crate) allowed: SessionACL,
    /// User that launched the fuser process
    pub(crate) session_owner: Uid,
    /// FUSE protocol version, as reported by the kernel.
    /// The field is set to `Some` when the init message is received.
    pub(crate) proto_version: Option<Version>,
    pub(crate) config: Config,
    /// What INIT settled, once it did (octofs patch).
    negotiated: Option<Negotiated>,
}

/// What the INIT exchange settled for a connection: recorded after the handshake so that another
/// process given the connection can serve it without a second INIT (octofs patch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serializable", derive(serde::Serialize, serde::Deserialize))]
pub struct Negotiated {
    /// The kernel's protocol major version as it announced it.
    pub kernel_major: u32,
    /// The kernel's protocol minor version.
    pub kernel_minor: u32,
    /// The flags in force: what the kernel offered and the filesystem requested.
    pub flags: u64,
    /// The largest write the kernel sends.
    pub max_write: u32,
    /// The kernel's readahead.
    pub max_readahead: u32,
}

/// Stops the `/dev/fuse` reader threads between two requests and lets them go again (octofs
/// patch). A reader checks `stop` before each read and, when idle, waits in `poll` for the
/// device or the pipe, which holds one byte while a pause is asked for.
#[derive(Debug)]
struct PauseCtl {
    stop: std::sync::atomic::AtomicBool,
    pipe_r: OwnedFd,
    /// Held so that the read end never sees end-of-file (nothing writes it: `run` has no pause).
    _pipe_w: OwnedFd,
    /// (reader threads running, reader threads parked)
    counts: std::sync::Mutex<(usize, usize)>,
    cv: std::sync::Condvar,
}

impl PauseCtl {
    fn new() -> io::Result<Arc<PauseCtl>> {
        let (pipe_r, pipe_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        Ok(Arc::new(PauseCtl {
            stop: std::sync::atomic::AtomicBool::new(false),
            pipe_r,
            _pipe_w: pipe_w,
            counts: std::sync::Mutex::new((0, 0)),
            cv: std::sync::Condvar::new(),
        }))
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, (usize, usize)> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stopping(&self) -> bool {
        self.stop.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A reader thread starts; the guard says when it ends.
    fn enter(self: &Arc<Self>) -> ReaderGuard {
        self.counts().0 += 1;
        ReaderGuard(self.clone())
    }

    /// Parks the calling reader until the pause ends.
    fn park(&self) {
        let mut c = self.counts();
        c.1 += 1;
        self.cv.notify_all();
        while self.stopping() {
            c = self.cv.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        c.1 -= 1;
    }

    /// The idle wait of one reader: an epoll set with the device registered `EPOLLEXCLUSIVE`
    /// and the pause pipe registered plainly. Every clone of a connection's fd waits on the one
    /// input queue of the connection; `poll` (or a plain epoll entry) puts each idle reader on
    /// that queue non-exclusively, so every request woke every idle reader (all but one then
    /// read `EAGAIN`: a thundering herd of wake-ups, each a VM exit when the reader sleeps on
    /// another vCPU). With `EPOLLEXCLUSIVE` the kernel wakes one idle reader per request; a
    /// pause still wakes them all. `None` (kernel before 4.5): `wait` falls back to `poll`.
    fn waiter(&self, dev: BorrowedFd<'_>) -> Option<nix::sys::epoll::Epoll> {
        use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
        let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).ok()?;
        ep.add(self.pipe_r.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 1))
            .ok()?;
        ep.add(
            dev,
            EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLEXCLUSIVE, 0),
        )
        .ok()?;
        Some(ep)
    }

    /// Waits until `dev` has a request (or is gone) or a pause is asked for.
    fn wait(&self, dev: BorrowedFd<'_>, ep: Option<&nix::sys::epoll::Epoll>) -> io::Result<()> {
        if let Some(ep) = ep {
            use nix::sys::epoll::{EpollEvent, EpollTimeout};
            let mut events = [EpollEvent::empty(); 2];
            return match ep.wait(&mut events, EpollTimeout::NONE) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
                Err(e) => Err(e.into()),
            };
        }
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [
            PollFd::new(dev, PollFlags::POLLIN),
            PollFd::new(self.pipe_r.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Counts a reader thread out when it ends.
struct ReaderGuard(Arc<PauseCtl>);

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.counts().0 -= 1;
        self.0.cv.notify_all();
    }
}

impl<FS: Filesystem> AsFd for Session<FS> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.ch.as_fd()
    }
}

impl<FS: Filesystem> Session<FS> {
    /// Create a new session by mounting the given filesystem to the given mountpoint
    /// # Errors
    /// Returns an error if the options are incorrect, or if the fuse device can't be mounted.
    pub fn new<P: AsRef<Path>>(
        filesystem: FS,
        mountpoint: P,
        options: &Config,
    ) -> io::Result<Session<FS>> {
        Self::new_with_init_hook(filesystem, mountpoint, options, |_| {})
    }

    /// Like `new`; `hook` sees the `KernelConfig` after the filesystem's `init` and before the
    /// INIT reply is sent, so a transport can add its own flags (FUSE_OVER_IO_URING) and limits.
    /// (octofs patch)
    pub fn new_with_init_hook<P: AsRef<Path>>(
        filesystem: FS,
        mountpoint: P,
        options: &Config,
        hook: impl FnOnce(&mut KernelConfig),
    ) -> io::Result<Session<FS>> {
        check_option_conflicts(options)?;

        let mountpoint = mountpoint.as_ref();
        info!("Mounting {}", mountpoint.display());
        // If AutoUnmount is requested, but not AllowRoot or AllowOther, return an error
        // because fusermount needs allow_root or allow_other to handle the auto_unmount option
        if options.mount_options.contains(&MountOption::AutoUnmount)
            && options.acl == SessionACL::Owner
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("auto_unmount requires acl != Owner, got: {:?}", options.acl),
            ));
        }
        let (file, mount) = Mount::new(mountpoint, &options.mount_options, options.acl)?;

        let ch = Channel::new(file);

        let mut session = Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
                done: None,
            },
            ch,
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(Some(mount))),
            },
            allowed: options.acl,
            session_owner: geteuid(),
            proto_version: None,
            config: options.clone(),
            negotiated: None,
        };

        session.handshake(hook)?;

        Ok(session)
    }

    /// Wrap an existing /dev/fuse file descriptor. This doesn't mount the
    /// filesystem anywhere; that must be done separately.
    pub fn from_fd(
        filesystem: FS,
        fd: OwnedFd,
        acl: SessionACL,
        config: Config,
    ) -> io::Result<Self> {
        let ch = Channel::new(Arc::new(DevFuse(File::from(fd))));
        let mut session = Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
                done: None,
            },
            ch,
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(None)),
            },
            allowed: acl,
            session_owner: geteuid(),
            proto_version: None,
            config,
            negotiated: None,
        };

        session.handshake(|_| {})?;

        Ok(session)
    }

    /// Serves a connection another process mounted and initialized, whose `/dev/fuse` fd it handed
    /// over: no INIT is read or answered (the kernel had its answer, `negotiated`), and unmounting
    /// works as for a mount made here. The filesystem's `init` is not called: the caller gives it
    /// the state the old process recorded. Requests the kernel queued meanwhile are read once the
    /// session is spawned. (octofs patch)
    pub fn from_fd_initialized(
        filesystem: FS,
        fd: OwnedFd,
        mountpoint: &Path,
        config: Config,
        negotiated: Negotiated,
    ) -> io::Result<Self> {
        let dev = Arc::new(DevFuse(File::from(fd)));
        let mount = Mount::adopt(mountpoint, dev.clone())?;
        Ok(Session {
            filesystem: FilesystemHolder {
                fs: Some(filesystem),
                done: None,
            },
            ch: Channel::new(dev),
            mount: UmountOnDrop {
                mount: Arc::new(Mutex::new(Some(mount))),
            },
            allowed: config.acl,
            session_owner: geteuid(),
            proto_version: Some(Version(negotiated.kernel_major, negotiated.kernel_minor)),
            config,
            negotiated: Some(negotiated),
        })
    }

    /// What INIT settled (`None` before the handshake). (octofs patch)
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.negotiated
    }

    /// The filesystem, before the session is spawned (to give it state). (octofs patch)
    pub fn filesystem_mut(&mut self) -> Option<&mut FS> {
        self.filesystem.fs.as_mut()
    }

    /// Takes over passthrough backing id `id`, registered on this connection by the process that
    /// handed it over: the returned `BackingId` closes it when dropped, as one made here. The caller
    /// must own the id (no other `BackingId` of it may exist in this process). (octofs patch)
    pub fn adopt_backing(&self, id: u32) -> crate::BackingId {
        // SAFETY: the id was registered on this connection (the kernel keeps backing ids per
        // connection) and the caller says nothing else here owns it.
        unsafe { self.ch.sender().wrap_backing(id) }
    }

    /// Run the session loop in a background thread. If the returned handle is dropped,
    /// the filesystem is unmounted and the given session ends.
    pub fn spawn(self) -> io::Result<BackgroundSession> {
        self.spawn_with_ring(Vec::new())
    }

    /// Like `spawn`, and also runs each of `workers` on its own thread with a [`RingDispatcher`]
    /// for this session's filesystem (a FUSE-over-io_uring transport feeds requests through it).
    /// The `/dev/fuse` connection is served by the process's worker pool (`crate::pool`: no
    /// thread of its own); the session ends when the connection is gone and every worker has
    /// returned; the filesystem's `destroy` runs after all of them. (octofs patch)
    pub fn spawn_with_ring(self, workers: Vec<RingWorker<FS>>) -> io::Result<BackgroundSession> {
        let pool = crate::pool::Pool::get()?;
        let sender = self.ch.sender();
        let reader_devs = vec![self.ch.sender().0];
        // Take the fuse_session, so that we can unmount it
        let mount = std::mem::take(&mut *self.mount.mount.lock());
        let Session {
            mut filesystem,
            ch,
            mount: _do_not_umount_yet,
            allowed,
            session_owner,
            proto_version: _,
            config: _,
            negotiated,
        } = self;
        ch.set_nonblocking()?;
        let key = pool.new_key();
        let ctl = Arc::new(PoolCtl::new(key, ch.sender()));
        filesystem.done = Some(ctl.clone());
        let filesystem = Arc::new(filesystem);
        for (i, worker) in workers.into_iter().enumerate() {
            let thread_name = format!("fuser-ring-{i}");
            let dispatcher = RingDispatcher {
                event_loop: SessionEventLoop {
                    thread_name: thread_name.clone(),
                    filesystem: filesystem.clone(),
                    ch: ch.clone(),
                    allowed,
                    session_owner,
                    pause: None,
                },
                buf: Vec::new(),
            };
            // Holds the filesystem until the worker's outcome is recorded (its `destroy`, and so
            // the session's end, come after).
            let keep = filesystem.clone();
            let rec = ctl.clone();
            thread::Builder::new().name(thread_name).spawn(move || {
                if let Err(e) = worker(dispatcher) {
                    rec.record(e);
                }
                drop(keep);
            })?;
        }
        let served = PooledSession {
            se: SessionEventLoop {
                thread_name: "fuse-pool".to_string(),
                filesystem,
                ch,
                allowed,
                session_owner,
                pause: None,
            },
            ctl: ctl.clone(),
        };
        pool.register(key, Arc::new(served))?;
        Ok(BackgroundSession {
            guard: SessionGuard(ctl.clone()),
            sender,
            mount,
            negotiated,
            pause: ctl,
            reader_devs,
        })
    }

    /// Run the session loop that receives kernel requests and dispatches them to method
    /// calls into the filesystem. This read-dispatch-loop is non-concurrent to prevent
    /// having multiple buffers (which take up much memory), but the filesystem methods
    /// may run concurrent by spawning threads.
    /// # Errors
    /// Returns any final error when the session comes to an end.
    pub fn run(self) -> io::Result<()> {
        let channels = self.reader_channels()?;
        self.run_with_ring(channels, Vec::new())
    }

    /// One channel per reader thread: the session's own, then `n_threads - 1` more (clones of the
    /// device with `clone_fd`, else the same one). (octofs patch: made before the session thread.)
    fn reader_channels(&self) -> io::Result<Vec<Channel>> {
        let n_threads = self.config.n_threads.unwrap_or(1);

        if !cfg!(target_os = "linux") && n_threads != 1 {
            // TODO: check whether it works on macOS/FreeBSD and enable if it works.
            return Err(io::Error::other(
                "n_threads != 1 is only supported on Linux",
            ));
        }

        let Some(n_threads_minus_one) = n_threads.checked_sub(1) else {
            return Err(io::Error::other("n_threads"));
        };

        let mut channels = Vec::with_capacity(n_threads);
        channels.push(self.ch.clone());
        for _ in 0..n_threads_minus_one {
            if self.config.clone_fd {
                #[cfg(target_os = "linux")]
                {
                    channels.push(self.ch.clone_fd()?);
                    continue;
                }
                #[cfg(not(target_os = "linux"))]
                {
                    return Err(io::Error::other("clone_fd is only supported on Linux"));
                }
            } else {
                channels.push(self.ch.clone());
            }
        }
        Ok(channels)
    }

    /// `run`, plus the ring workers of `spawn_with_ring` (octofs patch).
    fn run_with_ring(
        self,
        channels: Vec<Channel>,
        workers: Vec<RingWorker<FS>>,
    ) -> io::Result<()> {
        let Session {
            filesystem,
            ch,
            mount: _do_not_umount_yet,
            allowed,
            session_owner,
            proto_version: _,
            config: _,
            negotiated: _,
        } = self;
        let pause = PauseCtl::new()?;

        let n_threads = channels.len();
        let mut filesystem = Arc::new(filesystem);
        let ring_ch = ch;

        let mut threads = Vec::with_capacity(n_threads + workers.len());

        for (i, ch) in channels.into_iter().enumerate() {
            let thread_name = format!("fuser-{i}");
            let event_loop = SessionEventLoop {
                thread_name: thread_name.clone(),
                filesystem: filesystem.clone(),
                ch,
                allowed,
                session_owner,
                pause: Some(pause.clone()),
            };
            threads.push(
                thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || event_loop.event_loop())?,
            );
        }

        for (i, worker) in workers.into_iter().enumerate() {
            let thread_name = format!("fuser-ring-{i}");
            let dispatcher = RingDispatcher {
                event_loop: SessionEventLoop {
                    thread_name: thread_name.clone(),
                    filesystem: filesystem.clone(),
                    ch: ring_ch.clone(),
                    allowed,
                    session_owner,
                    pause: Some(pause.clone()),
                },
                buf: Vec::new(),
            };
            threads.push(
                thread::Builder::new()
                    .name(thread_name)
                    .spawn(move || worker(dispatcher))?,
            );
        }
        drop(ring_ch);

        let mut reply: io::Result<()> = Ok(());
        for thread in threads {
            let res = match thread.join() {
                Ok(res) => res,
                Err(_) => {
                    return Err(io::Error::other("event loop thread panicked"));
                }
            };
            if let Err(e) = res {
                if reply.is_ok() {
                    reply = Err(e);
                }
            }
        }

        let Some(filesystem) = Arc::get_mut(&mut filesystem) else {
            return Err(io::Error::other(
                "BUG: must have one refcount for filesystem",
            ));
        };

        filesystem.destroy();

        reply
    }

    fn handshake(&mut self, hook: impl FnOnce(&mut KernelConfig)) -> io::Result<()> {
        let mut hook = Some(hook);
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();

        loop {
            // Read the init request from the kernel
            let size = match self.ch.receive_retrying(buf) {
                Ok(size) => size,
                Err(nix::errno::Errno::ENODEV) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "FUSE device disconnected during handshake",
                    ));
                }
                Err(err) => return Err(err.into()),
            };

            // Parse the request
            let request = match ll::AnyRequest::try_from(&buf[..size]) {
                Ok(request) => request,
                Err(err) => {
                    error!("{err}");
                    return Err(io::Error::new(io::ErrorKind::InvalidData, err.to_string()));
                }
            };

            // Extract the init operation
            let op = match request.operation() {
                Ok(op) => op,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "Failed to parse FUSE operation",
                    ));
                }
            };

            let init = match op {
                ll::Operation::Init(init) => init,
                _ => {
                    error!("Received non-init FUSE operation before init: {}", request);
                    // Send error response and return error - non-init during handshake is invalid
                    <ReplyRaw as Reply>::new(
                        request.unique(),
                        ReplySender::Channel(self.ch.sender()),
                    )
                    .send_ll(&ResponseErrno(ll::Errno::EIO));
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "Received non-init FUSE operation during handshake",
                    ));
                }
            };

            let v = init.version();
            if v.0 > abi::FUSE_KERNEL_VERSION {
                // Kernel has a newer major version than we support.
                // Send our version and wait for a second INIT request with a compatible version.
                debug!(
                    "INIT: Kernel version {} > our version {}, sending our version and waiting for next init",
                    v.0,
                    abi::FUSE_KERNEL_VERSION
                );
                let response = init.reply_version_only();
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&response);
                continue;
            }

            // We don't support ABI versions before 7.6
            if v < Version(7, 6) {
                error!("Unsupported FUSE ABI version {v}");
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&ResponseErrno(ll::Errno::EPROTO));
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("Unsupported FUSE ABI version {v}"),
                ));
            }

            let mut config = KernelConfig::new(init.capabilities(), init.max_readahead(), v);

            // Call filesystem init method and give it a chance to return an error
            let Some(filesystem) = &mut self.filesystem.fs else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "Bug: filesystem must be initialized during handshake",
                ));
            };
            let res = filesystem.init(Request::ref_cast(request.header()), &mut config);
            if let Err(error) = res {
                let errno = Errno::from_i32(error.raw_os_error().unwrap_or(0));
                <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                    .send_ll(&ResponseErrno(errno));
                return Err(error);
            }
            if let Some(hook) = hook.take() {
                hook(&mut config);
            }

            // Remember the ABI version supported by kernel and mark the session initialized.
            self.proto_version = Some(v);

            // Log capability status for debugging
            for bit in 0..64 {
                let bitflags = InitFlags::from_bits_retain(1 << bit);
                if bitflags == InitFlags::FUSE_INIT_EXT {
                    continue;
                }
                let bitflag_is_known = InitFlags::all().contains(bitflags);
                let kernel_supports = init.capabilities().contains(bitflags);
                let we_requested = config.requested.contains(bitflags);
                // On macOS, there's a clash between linux and macOS constants,
                // so we pick macOS ones (last).
                let name = if let Some((name, _)) = bitflags.iter_names().last() {
                    Cow::Borrowed(name)
                } else {
                    Cow::Owned(format!("(1 << {bit})"))
                };
                if we_requested && kernel_supports {
                    debug!("capability {name} enabled")
                } else if we_requested {
                    debug!("capability {name} not supported by kernel")
                } else if kernel_supports {
                    debug!("capability {name} not requested by client")
                } else if bitflag_is_known {
                    debug!("capability {name} not supported nor requested")
                }
            }

            // Reply with our desired version and settings.
            debug!(
                "INIT response: ABI {}.{}, flags {:#x}, max readahead {}, max write {}",
                abi::FUSE_KERNEL_VERSION,
                abi::FUSE_KERNEL_MINOR_VERSION,
                init.capabilities() & config.requested,
                config.max_readahead,
                config.max_write
            );

            self.negotiated = Some(Negotiated {
                kernel_major: v.0,
                kernel_minor: v.1,
                flags: (init.capabilities() & config.requested).bits(),
                max_write: config.max_write,
                max_readahead: config.max_readahead,
            });
            let response = init.reply(&config);
            <ReplyRaw as Reply>::new(request.unique(), ReplySender::Channel(self.ch.sender()))
                .send_ll(&response);

            return Ok(());
        }
    }

    /// Unmount the filesystem
    pub fn unmount(&mut self) -> io::Result<()> {
        self.mount.umount()
    }

    /// Returns a thread-safe object that can be used to unmount the Filesystem
    pub fn unmount_callable(&mut self) -> SessionUnmounter {
        SessionUnmounter {
            mount: self.mount.mount.clone(),
        }
    }

    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.ch.sender())
    }
}

#[derive(Debug)]
/// A thread-safe object that can be used to unmount a Filesystem
pub struct SessionUnmounter {
    mount: Arc<Mutex<Option<Mount>>>,
}

impl SessionUnmounter {
    /// Unmount the filesystem
    pub fn unmount(&mut self) -> io::Result<()> {
        if let Some(mount) = std::mem::take(&mut *self.mount.lock()) {
            mount.umount()?;
        }
        Ok(())
    }
}

/// A ring worker of [`Session::spawn_with_ring`]: runs on its own thread until the connection
/// ends, feeding the requests it receives to the dispatcher (octofs patch).
pub type RingWorker<FS> = Box<dyn FnOnce(RingDispatcher<FS>) -> io::Result<()> + Send>;

/// Dispatches requests that arrive outside `/dev/fuse` (FUSE over io_uring ring entries) to the
/// session's filesystem; replies go to the sink given with each request (octofs patch).
pub struct RingDispatcher<FS: Filesystem> {
    event_loop: SessionEventLoop<FS>,
    /// The request reassembled contiguously, aligned for `fuse_in_header`.
    buf: Vec<u8>,
}

impl<FS: Filesystem> std::fmt::Debug for RingDispatcher<FS> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingDispatcher")
            .field("thread", &self.event_loop.thread_name)
            .finish()
    }
}

impl<FS: Filesystem> RingDispatcher<FS> {
    /// Dispatches one request whose bytes are `parts` concatenated (`fuse_in_header`, then the
    /// arguments, exactly as `/dev/fuse` would deliver them). The reply goes to `sink`, now or
    /// later (the filesystem may answer from another thread). Returns false, having replied
    /// nothing, when the bytes are not a valid request: the caller must answer it itself.
    pub fn dispatch(&mut self, parts: &[&[u8]], sink: Arc<dyn RingReplySink>) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let align = std::mem::align_of::<abi::fuse_in_header>();
        if self.buf.len() < len + align {
            self.buf.resize(len + align, 0);
        }
        let off = (align - (self.buf.as_ptr() as usize) % align) % align;
        let data = &mut self.buf[off..off + len];
        let mut at = 0;
        for p in parts {
            data[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        let data = &self.buf[off..off + len];
        let Some(req) = RequestWithSender::new_ring(self.event_loop.ch.sender(), sink, data) else {
            return false;
        };
        if let Ok(Operation::Destroy(_)) = req.request.operation() {
            req.reply::<ReplyEmpty>().ok();
        } else {
            req.dispatch(&self.event_loop);
        }
        true
    }
}

pub(crate) struct SessionEventLoop<FS: Filesystem> {
    /// Cache thread name for faster `debug!`.
    pub(crate) thread_name: String,
    pub(crate) ch: Channel,
    pub(crate) filesystem: Arc<FilesystemHolder<FS>>,
    pub(crate) allowed: SessionACL,
    pub(crate) session_owner: Uid,
    /// Pauses this reader between requests (octofs patch; `None` where no reader thread runs
    /// this loop: the pool's sessions and ring dispatchers).
    pause: Option<Arc<PauseCtl>>,
}

impl<FS: Filesystem> SessionEventLoop<FS> {
    fn event_loop(&self) -> io::Result<()> {
        // Buffer for receiving requests from the kernel. Only one is allocated and
        // it is reused immediately after dispatching to conserve memory and allocations.
        let mut buf = FuseReadBuf::new();
        let buf = buf.as_mut();
        // octofs patch: reads never block, so a pause is seen between any two requests; an idle
        // reader waits in epoll (the device exclusively: one reader woken per request) for a
        // request or the pause pipe.
        let pause = match &self.pause {
            Some(p) => p.clone(),
            None => PauseCtl::new()?,
        };
        let _running = pause.enter();
        self.ch.set_nonblocking()?;
        let waiter = pause.waiter(self.ch.as_fd());
        loop {
            if pause.stopping() {
                pause.park();
                continue;
            }
            // Read the next request from the given channel to kernel driver
            // The kernel driver makes sure that we get exactly one request per read
            match self.ch.receive(buf) {
                Ok(size) => match RequestWithSender::new(self.ch.sender(), &buf[..size]) {
                    // Dispatch request
                    Some(req) => {
                        if let Ok(Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<ReplyEmpty>().ok();
                            return Ok(());
                        } else {
                            req.dispatch(self)
                        }
                    }
                    // Quit loop on illegal request
                    None => {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "Invalid request",
                        ));
                    }
                },
                Err(nix::errno::Errno::EAGAIN) => {
                    pause.wait(self.ch.as_fd(), waiter.as_ref())?
                }
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ENODEV) => return Ok(()),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

/// The background session data structure
#[derive(Debug)]
pub struct BackgroundSession {
    /// Says when the session ended (octofs patch: no thread of its own any more)
    pub guard: SessionGuard,
    /// Object for creating Notifiers for client use
    sender: ChannelSender,
    /// Ensures the filesystem is unmounted when the session ends
    mount: Option<Mount>,
    /// What INIT settled (octofs patch).
    negotiated: Option<Negotiated>,
    /// Pauses, resumes and ends the pool's serving of this connection (octofs patch).
    pause: Arc<PoolCtl>,
    /// The device requests are read from (octofs patch).
    reader_devs: Vec<Arc<DevFuse>>,
}

impl BackgroundSession {
    /// Unmount the filesystem and join the background thread.
    pub fn umount_and_join(mut self) -> io::Result<()> {
        if let Some(mount) = self.mount.take() {
            mount.umount()?;
        }
        self.join()
    }

    /// Gives the session up without unmounting: another process serves its connection now (a
    /// handover). Dropping a `BackgroundSession` unmounts, and an unmount here would take the mount
    /// away from the process it was handed to (it succeeds wherever no process is using the
    /// mount). The reader threads are left as they are (paused: they hold no request); the
    /// caller's process is about to exit. (octofs patch)
    pub fn disown(mut self) {
        if let Some(mount) = self.mount.take() {
            mount.disown();
        }
    }

    /// Returns an object that can be used to send notifications to the kernel
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.sender.clone())
    }

    /// What INIT settled for this connection. (octofs patch)
    pub fn negotiated(&self) -> Option<Negotiated> {
        self.negotiated
    }

    /// A duplicate of the connection's `/dev/fuse` fd, to hand to another process. (octofs patch)
    pub fn dup_dev_fd(&self) -> io::Result<OwnedFd> {
        self.sender.0.as_fd().try_clone_to_owned()
    }

    /// A duplicate of every descriptor this session's readers read requests from: the
    /// connection's fd first, then each clone (`clone_fd`). A process that keeps them all open
    /// keeps the connection alive, and the requests read but not answered queued on it, should
    /// this one die; closing a clone ends the requests read from it. (octofs patch)
    pub fn dup_reader_fds(&self) -> io::Result<Vec<OwnedFd>> {
        self.reader_devs
            .iter()
            .map(|d| d.as_fd().try_clone_to_owned())
            .collect()
    }

    /// Stops every `/dev/fuse` reader thread after the request it is serving and waits until all
    /// stopped (requests arriving meanwhile stay queued in the kernel). On timeout the readers go
    /// on and the error says how many stopped. Ring workers are not paused. (octofs patch)
    pub fn pause_readers(&self, timeout: std::time::Duration) -> io::Result<()> {
        self.pause.pause(timeout)
    }

    /// Lets the reader threads stopped by `pause_readers` go on. (octofs patch)
    pub fn resume_readers(&self) {
        self.pause.resume()
    }

    /// Waits until the session ended: its connection is gone, no request of it is being served
    /// and the filesystem's `destroy` ran.
    pub fn join(self) -> io::Result<()> {
        self.guard.join()
    }
}

/// Says when a spawned session ended (octofs patch).
#[derive(Debug)]
pub struct SessionGuard(Arc<PoolCtl>);

impl SessionGuard {
    /// True once the connection is gone, no request of it is being served and the filesystem's
    /// `destroy` ran.
    pub fn is_finished(&self) -> bool {
        self.0.lock().complete
    }

    /// Waits until `is_finished`; the first error the session ended with.
    pub fn join(self) -> io::Result<()> {
        let mut st = self.0.lock();
        while !st.complete {
            st = self.0.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        match st.result.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The state of one session served by the pool: paused or not, requests being served, ended,
/// and how (octofs patch).
#[derive(Debug)]
pub(crate) struct PoolCtl {
    key: u64,
    /// The connection (to re-arm it in the pool after a pause).
    dev: ChannelSender,
    state: std::sync::Mutex<PoolState>,
    cv: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    /// A pause is asked for: no worker reads another request.
    stop: bool,
    /// Requests read and being dispatched by a worker now.
    inflight: usize,
    /// The connection is gone (or DESTROY came): removed from the pool.
    ended: bool,
    /// The first error the session ended with.
    result: Option<io::Error>,
    /// The filesystem's `destroy` ran: nothing of the session is left.
    complete: bool,
}

impl PoolCtl {
    fn new(key: u64, dev: ChannelSender) -> PoolCtl {
        PoolCtl {
            key,
            dev,
            state: std::sync::Mutex::new(PoolState::default()),
            cv: std::sync::Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, e: io::Error) {
        self.lock().result.get_or_insert(e);
    }

    fn complete(&self) {
        self.lock().complete = true;
        self.cv.notify_all();
    }

    /// Stops the pool from reading this connection after the requests being served, and waits
    /// until none is (requests arriving meanwhile stay queued in the kernel). On timeout the
    /// pool reads on and the error says how many were still being served.
    fn pause(&self, timeout: std::time::Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        let mut st = self.lock();
        st.stop = true;
        while st.inflight > 0 {
            let now = std::time::Instant::now();
            if now >= deadline {
                let busy = st.inflight;
                drop(st);
                self.resume();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{busy} requests were still being served after {timeout:?}"),
                ));
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Lets the pool read this connection again.
    fn resume(&self) {
        let ended = {
            let mut st = self.lock();
            st.stop = false;
            st.ended
        };
        if !ended {
            if let Ok(pool) = crate::pool::Pool::get() {
                pool.rearm(self.key, self.dev.0.as_fd());
            }
        }
    }
}

/// A session as the pool serves it (octofs patch).
struct PooledSession<FS: Filesystem> {
    se: SessionEventLoop<FS>,
    ctl: Arc<PoolCtl>,
}

/// Counts a request out of `inflight` when its dispatch returns (or unwinds).
struct Inflight<'a>(&'a PoolCtl);

impl Drop for Inflight<'_> {
    fn drop(&mut self) {
        self.0.lock().inflight -= 1;
        self.0.cv.notify_all();
    }
}

impl<FS: Filesystem> PooledSession<FS> {
    fn end(&self, pool: &crate::pool::Pool, r: io::Result<()>) {
        {
            let mut st = self.ctl.lock();
            st.ended = true;
            if let Err(e) = r {
                st.result.get_or_insert(e);
            }
        }
        pool.remove(self.ctl.key, self.se.ch.as_fd());
    }
}

impl<FS: Filesystem> crate::pool::PoolSession for PooledSession<FS> {
    fn fd(&self) -> BorrowedFd<'_> {
        self.se.ch.as_fd()
    }

    fn serve(&self, pool: &crate::pool::Pool, key: u64, buf: &mut [u8]) {
        {
            let mut st = self.ctl.lock();
            if st.stop || st.ended {
                // Left unarmed: `resume` re-arms it.
                return;
            }
            st.inflight += 1;
        }
        let _inflight = Inflight(&self.ctl);
        let fd = self.se.ch.as_fd();
        match self.se.ch.receive(buf) {
            Ok(size) => {
                pool.rearm(key, fd);
                match RequestWithSender::new(self.se.ch.sender(), &buf[..size]) {
                    Some(req) => {
                        if let Ok(Operation::Destroy(_)) = req.request.operation() {
                            req.reply::<ReplyEmpty>().ok();
                            self.end(pool, Ok(()));
                        } else {
                            req.dispatch(&self.se);
                        }
                    }
                    None => self.end(
                        pool,
                        Err(io::Error::new(io::ErrorKind::InvalidData, "Invalid request")),
                    ),
                }
            }
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::ENOENT | nix::errno::Errno::EINTR) => {
                pool.rearm(key, fd)
            }
            Err(nix::errno::Errno::ENODEV) => self.end(pool, Ok(())),
            Err(e) => self.end(pool, Err(e.into())),
        }
    }
}
