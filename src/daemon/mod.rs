//! The daemon: one process serving every workspace mount of the host and the control socket.
//!
//! Policy lives here (which mirror a thread is bound to, when to mount, remount after a restart);
//! mechanism lives below it (`git`, `cow`, `fs`). Every request runs on a blocking thread so that a slow
//! clone never stalls the socket, and each mount is served by its own fuser session threads, so one busy
//! workspace never stalls another. Operations on one project or one thread serialize on a keyed lock.

mod lifecycle;
mod posix;
pub mod proto;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::cow::blobcache::BlobCache;
use crate::fs::core::{Presentation, WorkspaceFs, unix_time};
use crate::fs::fuse::{FuseAdapter, MountInfo};
use crate::git::mirror;
use crate::git::objects::ObjectStore;
use crate::layout::Layout;
use crate::names::{NameKind, validate};
use crate::workspace::WorkspaceRecord;
use proto::{Request, Response, WorkspaceStatus};

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
}

struct Mounted {
    path: PathBuf,
    session: fuser::BackgroundSession,
    info: Arc<MountInfo>,
    core: Arc<WorkspaceFs>,
    /// Overlapping users of the thread (`open` adds one, `release` removes one).
    users: u32,
}

/// Named mutexes: one per project and one per thread.
#[derive(Default)]
struct KeyedLocks(Mutex<HashMap<String, Arc<Mutex<()>>>>);

impl KeyedLocks {
    fn get(&self, key: &str) -> Arc<Mutex<()>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.to_string()).or_default().clone()
    }
}

pub struct Daemon {
    layout: Layout,
    settings: Settings,
    blobs: Arc<BlobCache>,
    stores: Mutex<HashMap<String, Arc<ObjectStore>>>,
    mounts: Mutex<HashMap<String, Mounted>>,
    locks: KeyedLocks,
}

type Reply = Result<(serde_json::Value, Vec<String>), String>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Daemon {
    fn new(layout: Layout, settings: Settings) -> anyhow::Result<Daemon> {
        let blobs = BlobCache::new(&layout.blobs()).context("cannot create the blob cache")?;
        Ok(Daemon {
            layout,
            settings,
            blobs: Arc::new(blobs),
            stores: Mutex::new(HashMap::new()),
            mounts: Mutex::new(HashMap::new()),
            locks: KeyedLocks::default(),
        })
    }

    fn handle(&self, req: Request) -> Response {
        let r = match req {
            Request::Ping => Ok((json!("pong"), vec![])),
            Request::MirrorAdd { project, upstream } => self.mirror_add(&project, &upstream),
            Request::MirrorSync { project } => self.mirror_sync(&project),
            Request::MirrorList => mirror::list(&self.layout).map(|l| (json!(l), vec![])),
            Request::Open {
                thread,
                project,
                git_ref,
            } => self.open(&thread, project.as_deref(), git_ref.as_deref()),
            Request::List => self.list(),
            Request::Status { thread } => self.status(&thread),
            Request::Fsmonitor { thread, token } => self.fsmonitor(&thread, &token),
            Request::Snapshot { thread } => self.snapshot(&thread),
            Request::Release { thread, force } => self.release(&thread, force),
            Request::Sweep { idle_secs } => self.sweep(idle_secs),
            Request::Diff {
                thread,
                from,
                to,
                patch,
            } => self.diff(&thread, from.as_deref(), to.as_deref(), patch),
            Request::Stop => Ok((json!("stopping"), vec![])),
        };
        match r {
            Ok((v, w)) => Response::ok(v, w),
            Err(e) => Response::err(e),
        }
    }

    fn store(&self, project: &str) -> Result<Arc<ObjectStore>, String> {
        let mut stores = lock(&self.stores);
        if let Some(s) = stores.get(project) {
            return Ok(s.clone());
        }
        let s = Arc::new(
            ObjectStore::open(&self.layout.mirror(project))
                .map_err(|e| format!("cannot open the mirror of {project}: {e}"))?,
        );
        stores.insert(project.to_string(), s.clone());
        Ok(s)
    }

    fn mirror_add(&self, project: &str, upstream: &str) -> Reply {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let info = mirror::add(&self.layout, project, upstream)?;
        Ok((json!(info), vec![]))
    }

    fn mirror_sync(&self, project: &str) -> Reply {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let out = mirror::sync(&self.layout, project, self.settings.freshness_secs)?;
        let warnings = out.warning.iter().cloned().collect();
        Ok((json!(out), warnings))
    }

    fn check_root(&self) -> Result<(), String> {
        match std::fs::metadata(&self.layout.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(format!(
                "root {} is not a directory",
                self.layout.root.display()
            )),
            Err(e) => Err(format!("root {}: {e}", self.layout.root.display())),
        }
    }

    /// Mounts the workspace of `rec` at its mount point. The caller holds the thread's lock.
    fn mount(&self, rec: &WorkspaceRecord) -> Result<(), String> {
        let core = self.load_core(rec)?;
        self.mount_core(rec, core)
    }

    /// Loads the filesystem core of `rec`'s workspace (its upper layer over its base).
    fn load_core(&self, rec: &WorkspaceRecord) -> Result<Arc<WorkspaceFs>, String> {
        let store = self.store(&rec.project)?;
        let tree = gix::ObjectId::from_hex(rec.base_tree.as_bytes())
            .map_err(|e| format!("thread {}: bad base tree: {e}", rec.thread))?;
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
        .map_err(|e| format!("thread {}: cannot open its upper layer: {e}", rec.thread))?;
        Ok(Arc::new(core))
    }

    /// Mounts a loaded workspace at its mount point. The caller holds the thread's lock.
    fn mount_core(&self, rec: &WorkspaceRecord, core: Arc<WorkspaceFs>) -> Result<(), String> {
        let path = self.layout.mountpoint(&rec.thread);
        if crate::sys::is_stale_mount(&path) {
            let _ = crate::sys::lazy_unmount(&path);
        }
        match std::fs::read_dir(&path) {
            Ok(mut d) => {
                if d.next().is_some() {
                    return Err(format!("mount point {} is not empty", path.display()));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&path)
                    .map_err(|e| format!("cannot create mount point {}: {e}", path.display()))?;
            }
            Err(e) => return Err(format!("mount point {}: {e}", path.display())),
        }
        let info = Arc::new(MountInfo::default());
        let is_root = crate::sys::euid() == 0;
        let adapter = FuseAdapter::new(
            core.clone(),
            is_root && self.settings.passthrough,
            info.clone(),
        );
        let cfg = crate::fs::fuse::mount_config(&rec.thread, is_root);
        let session = crate::fs::fuse::mount(adapter, &path, &cfg)
            .map_err(|e| format!("cannot mount {}: {e}", path.display()))?;
        tracing::info!(thread = %rec.thread, path = %path.display(), "mounted");
        lock(&self.mounts).insert(
            rec.thread.clone(),
            Mounted {
                path,
                session,
                info,
                core,
                users: 1,
            },
        );
        Ok(())
    }

    /// Unmounts one thread's workspace. A busy mount (a process has its cwd or files in it) is
    /// refused and stays mounted, unless `force`, which detaches it lazily.
    fn unmount_thread(&self, thread: &str, force: bool) -> Result<(), String> {
        let Some(m) = lock(&self.mounts).remove(thread) else {
            return Ok(());
        };
        match crate::sys::unmount(&m.path) {
            Ok(()) => {
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
                Err(format!(
                    "{} is busy (a process still has its working directory or files in it); stop them or use --force",
                    path.display()
                ))
            }
            Err(e) => {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    tracing::warn!(%thread, "busy mount detached lazily (--force)");
                }
                let _ = crate::sys::lazy_unmount(&m.path);
                drop(m.session);
                Ok(())
            }
        }
    }

    fn status_of(&self, rec: &WorkspaceRecord) -> WorkspaceStatus {
        let mounts = lock(&self.mounts);
        let m = mounts.get(&rec.thread);
        WorkspaceStatus {
            thread: rec.thread.clone(),
            project: rec.project.clone(),
            base_commit: rec.base_commit.clone(),
            branch: rec.branch.clone(),
            requested_ref: rec.requested_ref.clone(),
            mounted: m.is_some(),
            path: self.layout.mountpoint(&rec.thread).display().to_string(),
            passthrough: m.map(|m| {
                m.info
                    .passthrough
                    .load(std::sync::atomic::Ordering::Relaxed)
            }),
            changed_paths: m
                .and_then(|m| m.core.changes().ok())
                .map(|c| c.len() as u64)
                .unwrap_or(0),
            quarantined: m.map(|m| m.core.quarantined() as u64).unwrap_or(0),
            base_content_opens: m.map(|m| m.core.base_content_opens()).unwrap_or(0),
            last_snapshot: rec.saved.as_ref().and_then(|s| s.commit.clone()),
            state: if m.is_some() { "mounted" } else { "unmounted" }.into(),
            users: m.map(|m| m.users).unwrap_or(0),
            chat: rec.chat,
        }
    }

    /// A released thread: bound to its project, no workspace until it is opened again.
    fn status_of_released(&self, b: &crate::workspace::Binding) -> WorkspaceStatus {
        let last = crate::git::snapshot::open(&self.layout.mirror(&b.project))
            .ok()
            .and_then(|r| {
                crate::git::snapshot::read_ref(&r, &crate::git::snapshot::thread_ref(&b.thread))
            })
            .map(|id| id.to_string());
        WorkspaceStatus {
            thread: b.thread.clone(),
            project: b.project.clone(),
            base_commit: last.clone().unwrap_or_else(|| b.base_commit.clone()),
            branch: b.branch.clone(),
            requested_ref: None,
            mounted: false,
            path: self.layout.mountpoint(&b.thread).display().to_string(),
            passthrough: None,
            changed_paths: 0,
            quarantined: 0,
            base_content_opens: 0,
            last_snapshot: last,
            state: "released".into(),
            users: 0,
            chat: false,
        }
    }

    fn fsmonitor(&self, thread: &str, token: &str) -> Reply {
        validate(NameKind::Thread, thread)?;
        let core = lock(&self.mounts)
            .get(thread)
            .map(|m| m.core.clone())
            .ok_or_else(|| format!("thread {thread} is not mounted"))?;
        let (token, changed) = core.fsmonitor_query(token);
        let mut answer = proto::FsmonitorAnswer {
            token,
            everything: false,
            paths: Vec::new(),
        };
        match changed {
            crate::fs::core::Changed::Everything => answer.everything = true,
            crate::fs::core::Changed::Paths(paths) => {
                for p in paths {
                    match String::from_utf8(p) {
                        Ok(s) => answer.paths.push(s),
                        Err(_) => {
                            answer.everything = true;
                            answer.paths.clear();
                            break;
                        }
                    }
                }
            }
        }
        Ok((json!(answer), vec![]))
    }

    fn list(&self) -> Reply {
        let live = WorkspaceRecord::list(&self.layout)?;
        let mut all: Vec<_> = live.iter().map(|r| self.status_of(r)).collect();
        for b in crate::workspace::Binding::list(&self.layout)? {
            if !live.iter().any(|r| r.thread == b.thread) {
                all.push(self.status_of_released(&b));
            }
        }
        all.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok((json!(all), vec![]))
    }

    fn status(&self, thread: &str) -> Reply {
        validate(NameKind::Thread, thread)?;
        if let Some(rec) = WorkspaceRecord::load(&self.layout, thread)? {
            return Ok((json!(self.status_of(&rec)), vec![]));
        }
        let b = crate::workspace::Binding::load(&self.layout, thread)?
            .ok_or_else(|| format!("unknown thread {thread:?}"))?;
        Ok((json!(self.status_of_released(&b)), vec![]))
    }

    /// Remounts every workspace that was mounted when the daemon last stopped.
    fn remount_all(&self) {
        let records = match WorkspaceRecord::list(&self.layout) {
            Ok(r) => r,
            Err(e) => return tracing::error!("cannot list workspaces: {e}"),
        };
        for rec in records.into_iter().filter(|r| r.mounted) {
            if let Err(e) = self.mount(&rec) {
                tracing::error!(thread = %rec.thread, "cannot remount: {e}");
            }
        }
    }

    /// Unmounts every workspace, leaving their records as they are so that the next daemon remounts
    /// them. A busy mount is detached lazily: its users see the daemon gone, never a hang.
    fn unmount_all(&self) {
        let mounts: Vec<_> = lock(&self.mounts).drain().collect();
        for (thread, m) in mounts {
            unmount(&thread, m);
        }
    }
}

fn unmount(thread: &str, m: Mounted) {
    // fuser unmounts and joins the session threads; a busy mount fails fast with EBUSY and is then
    // detached lazily, so its users see the daemon gone instead of a hang.
    let Mounted { path, session, .. } = m;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(session.umount_and_join());
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => tracing::info!(%thread, "unmounted"),
        outcome => {
            tracing::warn!(%thread, "unmount: {outcome:?}; detaching lazily");
            if let Err(e) = crate::sys::lazy_unmount(&path) {
                tracing::error!(%thread, "lazy unmount: {e}");
            }
        }
    }
}

/// Unmounts stale mounts (daemon gone: ENOTCONN) under `root`.
fn clear_stale_mounts(root: &Path) {
    for mp in crate::sys::fuse_mounts_under(root) {
        if crate::sys::is_stale_mount(&mp) {
            match crate::sys::lazy_unmount(&mp) {
                Ok(()) => tracing::info!(path = %mp.display(), "cleared stale mount"),
                Err(e) => tracing::warn!(path = %mp.display(), "cannot clear stale mount: {e}"),
            }
        }
    }
}

/// Runs the daemon in the foreground until `stop`, SIGTERM or SIGINT.
pub fn serve(layout: Layout, settings: Settings) -> anyhow::Result<()> {
    crate::sys::fix_malloc_mmap_threshold();
    if let Ok(m) = std::fs::metadata(&layout.root)
        && !m.is_dir()
    {
        bail!("root {} is not a directory", layout.root.display());
    }
    std::fs::create_dir_all(&layout.state)
        .with_context(|| format!("cannot create state dir {}", layout.state.display()))?;
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(layout.daemon_lock())
        .with_context(|| format!("cannot open {}", layout.daemon_lock().display()))?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match lock_file.try_lock() {
            Ok(()) => break,
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
    std::fs::create_dir_all(&layout.root)
        .with_context(|| format!("cannot create root {}", layout.root.display()))?;
    clear_stale_mounts(&layout.root);

    let daemon = Arc::new(Daemon::new(layout.clone(), settings)?);
    daemon.remount_all();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let result = rt.block_on(run(daemon.clone()));
    daemon.unmount_all();
    let _ = std::fs::remove_file(layout.socket());
    drop(lock_file);
    result
}

async fn run(daemon: Arc<Daemon>) -> anyhow::Result<()> {
    let sock = daemon.layout.socket();
    let _ = std::fs::remove_file(&sock);
    let listener = tokio::net::UnixListener::bind(&sock)
        .with_context(|| format!("cannot listen on {}", sock.display()))?;
    tracing::info!(socket = %sock.display(), "octofs daemon ready");
    let stop = Arc::new(tokio::sync::Notify::new());
    if daemon.settings.sweep_idle > 0 && daemon.settings.sweep_every > 0 {
        let d = daemon.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(d.settings.sweep_every));
            tick.tick().await;
            loop {
                tick.tick().await;
                let d = d.clone();
                let idle = d.settings.sweep_idle;
                match tokio::task::spawn_blocking(move || d.sweep(idle)).await {
                    Ok(Ok((v, _))) => tracing::debug!("sweep: {v}"),
                    Ok(Err(e)) => tracing::warn!("sweep: {e}"),
                    Err(e) => tracing::warn!("sweep: {e}"),
                }
            }
        });
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = stop.notified() => break,
            conn = listener.accept() => {
                let Ok((stream, _)) = conn else { continue };
                let d = daemon.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(d, stream, stop).await {
                        tracing::warn!("control connection: {e}");
                    }
                });
            }
        }
    }
    tracing::info!("stopping");
    Ok(())
}

async fn connection(
    daemon: Arc<Daemon>,
    stream: tokio::net::UnixStream,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    use tokio::io::AsyncReadExt;
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    // One request line; anything past 1 MiB is not a request of ours.
    BufReader::new(r.take(1 << 20)).read_line(&mut line).await?;
    let resp = match serde_json::from_str::<Request>(&line) {
        Err(e) => Response::err(format!("bad request: {e}")),
        Ok(req) => {
            let is_stop = matches!(req, Request::Stop);
            let d = daemon.clone();
            let resp = tokio::task::spawn_blocking(move || d.handle(req))
                .await
                .unwrap_or_else(|e| Response::err(format!("internal error: {e}")));
            if is_stop {
                stop.notify_one();
            }
            resp
        }
    };
    let mut out = serde_json::to_vec(&resp)?;
    out.push(b'\n');
    w.write_all(&out).await?;
    Ok(())
}
