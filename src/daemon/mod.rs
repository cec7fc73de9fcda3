//! The daemon: one process serving every workspace mount of the host and the control socket.
//!
//! Policy lives here (which mirror a thread is bound to, when to mount, remount after a restart);
//! mechanism lives below it (`git`, `cow`, `fs`). Every request runs on a blocking thread so that a slow
//! clone never stalls the socket, and each mount is served by its own fuser session threads, so one busy
//! workspace never stalls another. Operations on one project or one thread serialize on a keyed lock.

pub mod proto;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
}

struct Mounted {
    path: PathBuf,
    session: fuser::BackgroundSession,
    info: Arc<MountInfo>,
    core: Arc<WorkspaceFs>,
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

    fn open(&self, thread: &str, project: Option<&str>, git_ref: Option<&str>) -> Reply {
        validate(NameKind::Thread, thread)?;
        if let Some(p) = project {
            validate(NameKind::Project, p)?;
        }
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        let existing = WorkspaceRecord::load(&self.layout, thread)?;
        if let Some(rec) = &existing {
            if let Some(p) = project {
                if p != rec.project {
                    return Err(format!(
                        "thread {thread} is bound to project {}; it cannot be re-bound to {p}",
                        rec.project
                    ));
                }
            }
            if let Some(r) = git_ref {
                let resolved = self.store(&rec.project)?.resolve(Some(r))?;
                if resolved.commit.to_string() != rec.base_commit {
                    return Err(format!(
                        "thread {thread} already has a workspace based on {}; --ref {r} applies only when it is created",
                        &rec.base_commit[..12]
                    ));
                }
            }
        }
        if let Some(m) = lock(&self.mounts).get(thread) {
            return Ok((json!(m.path), vec![]));
        }
        let rec = match existing {
            Some(mut rec) => {
                if !rec.mounted {
                    rec.mounted = true;
                    rec.save(&self.layout)?;
                }
                rec
            }
            None => {
                let Some(project) = project else {
                    return Err(format!(
                        "thread {thread} has no workspace yet: name its project with --project"
                    ));
                };
                let proj = mirror::require(&self.layout, project)?;
                let pl = self.locks.get(&format!("project:{project}"));
                let _pg = lock(&pl);
                let base = self.store(project)?.resolve(git_ref)?;
                self.check_root()?;
                // HEAD goes on the branch the caller named, else on a branch of the thread's own.
                let branch = git_ref
                    .and(base.branch.clone())
                    .unwrap_or_else(|| format!("octofs/{thread}"));
                let rec = WorkspaceRecord {
                    thread: thread.to_string(),
                    project: project.to_string(),
                    base_commit: base.commit.to_string(),
                    base_tree: base.tree.to_string(),
                    base_time: base.time,
                    requested_ref: git_ref.map(str::to_string),
                    branch: Some(branch.clone()),
                    created: SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    mounted: true,
                };
                rec.save(&self.layout)?;
                let created = self.load_core(&rec).and_then(|core| {
                    let exe = std::env::current_exe()
                        .map_err(|e| format!("cannot find the octofs binary: {e}"))?;
                    let plan = crate::repo::plan(
                        &self.layout,
                        &proj,
                        thread,
                        &rec.base_commit,
                        &branch,
                        &exe,
                    )?;
                    let index = {
                        let il = self.locks.get(&format!("index:{}", rec.base_commit));
                        let _ig = lock(&il);
                        crate::repo::shared_index(
                            &self.layout,
                            &*self.store(project)?,
                            &rec.base_commit,
                            base.tree,
                            rec.base_time,
                            crate::sys::euid(),
                            crate::sys::egid(),
                        )?
                    };
                    crate::repo::seed(&core, &plan, &index, rec.base_time)?;
                    self.mount_core(&rec, core)
                });
                if let Err(e) = created {
                    let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
                    return Err(e);
                }
                return Ok((json!(self.layout.mountpoint(thread)), vec![]));
            }
        };
        self.mount(&rec)?;
        Ok((json!(self.layout.mountpoint(thread)), vec![]))
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
            uid: crate::sys::euid(),
            gid: crate::sys::egid(),
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
            },
        );
        Ok(())
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
            last_snapshot: None,
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
        let all: Vec<_> = WorkspaceRecord::list(&self.layout)?
            .iter()
            .map(|r| self.status_of(r))
            .collect();
        Ok((json!(all), vec![]))
    }

    fn status(&self, thread: &str) -> Reply {
        validate(NameKind::Thread, thread)?;
        let rec = WorkspaceRecord::load(&self.layout, thread)?
            .ok_or_else(|| format!("unknown thread {thread:?}"))?;
        Ok((json!(self.status_of(&rec)), vec![]))
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
    if let Ok(m) = std::fs::metadata(&layout.root) {
        if !m.is_dir() {
            bail!("root {} is not a directory", layout.root.display());
        }
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
