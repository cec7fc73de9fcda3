//! The daemon: one process serving every workspace mount of the host and the control socket.
//!
//! Policy lives here (which mirror a thread is bound to, when to mount, remount after a restart);
//! mechanism lives below it (`git`, `cow`, `fs`). Each mount is served by its own fuser session
//! threads, so one busy workspace never stalls another. Operations on one project or one thread
//! serialize on a keyed lock.
//!
//! The control socket (DESIGN.md "Trust model"): every request is authenticated by the socket's peer
//! credentials. A thread belongs to the user who first opened it; only its owner or root (or the
//! daemon's own user) acts on it, and root alone manages mirrors and the daemon. Requests run on
//! bounded pools of blocking threads: at most `HEAVY_WORKERS` for everything that may take time
//! (clones, snapshots, listings), `FAST_WORKERS` of their own for git's fsmonitor queries, and
//! `ping` inline, so that git's hook never queues behind a flood of heavy requests and no flood
//! grows the daemon's threads. Connections past `MAX_CONNECTIONS` wait in the listen backlog.

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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::access::{Caller, describe_uid};
use crate::cow::blobcache::BlobCache;
use crate::fs::fuse::{FuseAdapter, MountInfo};
use crate::fs::{Presentation, WorkspaceFs, unix_time};
use crate::git::mirror;
use crate::git::objects::ObjectStore;
use crate::layout::Layout;
use crate::names::{NameKind, validate};
use crate::workspace::{Owner, WorkspaceRecord};
use proto::{Access, Request, Response, WorkspaceStatus};

/// Blocking threads for requests that may take time (clone, sync, open, snapshot, list, ...).
const HEAVY_WORKERS: usize = 8;
/// Blocking threads of their own for fsmonitor queries, which git waits on.
const FAST_WORKERS: usize = 4;
/// Connections served at once; more wait in the listen backlog, costing the daemon nothing.
const MAX_CONNECTIONS: usize = 2048;
/// Connections one user other than root may have open at once: one user holding idle connections
/// must not take every slot from the others (and their fsmonitor queries).
const USER_CONNECTIONS: usize = 128;
/// A request line longer than this is not one of ours.
const MAX_REQUEST: usize = 64 << 10;
/// How long a client may take to send its request line, and to take its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

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
}

struct Mounted {
    path: PathBuf,
    session: fuser::BackgroundSession,
    info: Arc<MountInfo>,
    core: Arc<WorkspaceFs>,
    /// The workspace's owner (fsmonitor answers go to them or root only).
    owner: Owner,
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

/// Whether `c` is among who may bind a project (an open project: anyone).
fn may_bind(c: &Caller, access: &Access) -> bool {
    access.is_open()
        || access.users.contains(&c.uid)
        || access.groups.iter().any(|g| c.in_group(*g))
}

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

    fn handle(&self, req: Request, c: &Caller) -> Response {
        match self.dispatch(req, c) {
            Ok((v, w)) => Response::ok(v, w),
            Err(e) => Response::err(e),
        }
    }

    fn dispatch(&self, req: Request, c: &Caller) -> Reply {
        match req {
            Request::Ping => Ok((json!("pong"), vec![])),
            Request::MirrorAdd {
                project,
                upstream,
                credential,
                access,
            } => {
                self.require_admin(c, "add mirrors")?;
                self.mirror_add(&project, &upstream, credential.as_deref(), access)
            }
            Request::MirrorAccess { project, access } => {
                self.require_admin(c, "see or change who may bind a project")?;
                self.mirror_access(&project, access)
            }
            Request::MirrorSync { project } => {
                self.require_admin(c, "sync mirrors")?;
                self.mirror_sync(&project)
            }
            Request::MirrorList => {
                let mut l = mirror::list(&self.layout)?;
                if !self.is_admin(c) {
                    l.retain(|m| may_bind(c, &m.project.access));
                }
                Ok((json!(l), vec![]))
            }
            Request::Open {
                thread,
                project,
                git_ref,
            } => self.open(&thread, project.as_deref(), git_ref.as_deref(), c),
            Request::List => self.list(c),
            Request::Status { thread } => self.status(&thread, c),
            Request::Fsmonitor { thread, token } => self.fsmonitor(&thread, &token, c),
            Request::Snapshot { thread } => self.snapshot(&thread, c),
            Request::Release {
                thread,
                force,
                discard,
            } => self.release(&thread, force, discard, c),
            Request::Sweep { idle_secs } => {
                self.require_admin(c, "sweep every user's workspaces")?;
                self.sweep(idle_secs)
            }
            Request::Diff {
                thread,
                from,
                to,
                patch,
            } => self.diff(&thread, from.as_deref(), to.as_deref(), patch, c),
            Request::Stats { thread } => self.stats(thread.as_deref(), c),
            Request::Stop => {
                self.require_admin(c, "stop the daemon")?;
                Ok((json!("stopping"), vec![]))
            }
        }
    }

    /// Root and the daemon's own user may do anything.
    fn is_admin(&self, c: &Caller) -> bool {
        c.uid == 0 || c.uid == crate::sys::euid()
    }

    fn require_admin(&self, c: &Caller, what: &str) -> Result<(), String> {
        if self.is_admin(c) {
            Ok(())
        } else {
            Err(format!(
                "permission denied: only root may {what} ({} is not root)",
                describe_uid(c.uid)
            ))
        }
    }

    /// Refuses `c` acting on `thread`, owned by `owner`, unless it is theirs or `c` is root.
    fn require_owner(&self, c: &Caller, thread: &str, owner: Owner) -> Result<(), String> {
        if self.is_admin(c) || c.uid == owner.uid {
            Ok(())
        } else {
            Err(format!(
                "permission denied: thread {thread} belongs to {}, not to {}",
                describe_uid(owner.uid),
                describe_uid(c.uid)
            ))
        }
    }

    /// Refuses `c` acting on `thread` unless it owns it or is root. An unknown thread passes: the
    /// operation itself reports it. The caller holds the thread's lock (ownership cannot change
    /// between this check and the operation).
    fn check_thread(&self, c: &Caller, thread: &str) -> Result<(), String> {
        if self.is_admin(c) {
            return Ok(());
        }
        let owner = match WorkspaceRecord::load(&self.layout, thread)? {
            Some(r) => Some(r.owner),
            None => crate::workspace::Binding::load(&self.layout, thread)?.map(|b| b.owner),
        };
        match owner {
            Some(o) => self.require_owner(c, thread, o),
            None => Ok(()),
        }
    }

    /// Refuses `c` binding (opening a thread of) `project` when the project limits who may.
    fn check_bind(&self, c: &Caller, project: &str) -> Result<(), String> {
        if self.is_admin(c) || project == lifecycle::BLANK {
            return Ok(());
        }
        let p = mirror::require(&self.layout, project)?;
        if may_bind(c, &p.access) {
            Ok(())
        } else {
            Err(format!(
                "permission denied: project {project} may be bound only by the users and groups root allowed, and {} is not among them",
                describe_uid(c.uid)
            ))
        }
    }

    /// Lets a workspace's owner read the objects of its project's mirror (its `.git`'s alternates
    /// point there, and the daemon's state is private); `recheck` walks every object file again.
    /// A failure is a warning: the workspace works, but git in it may not find the history.
    fn grant_owner(&self, project: &str, owner: Owner, recheck: bool) -> Option<String> {
        if owner.uid == 0 || owner.uid == crate::sys::euid() {
            return None;
        }
        let mirror = self.layout.mirror(project);
        match crate::access::grant_objects(&self.layout.mirrors(), &mirror, owner.uid, recheck) {
            Ok(()) => None,
            Err(e) => {
                let w = format!(
                    "cannot let {} read the objects of project {project} ({e}); git in the workspace may not find its history",
                    describe_uid(owner.uid)
                );
                tracing::warn!("{w}");
                Some(w)
            }
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

    fn mirror_add(
        &self,
        project: &str,
        upstream: &str,
        credential: Option<&str>,
        access: Access,
    ) -> Reply {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let info = mirror::add(&self.layout, project, upstream, credential, access)?;
        Ok((json!(info), vec![]))
    }

    /// Who may bind `project`; replaced first when `access` is given.
    fn mirror_access(&self, project: &str, access: Option<Access>) -> Reply {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let Some(a) = access else {
            let p = mirror::require(&self.layout, project)?;
            return Ok((json!(p.access), vec![]));
        };
        let p = mirror::set_access(&self.layout, project, a)?;
        // Who may no longer bind the project loses the read grant on its objects at once (their
        // workspaces' git then cannot read the project's history: revoking is revoking).
        let keep = |uid: u32| {
            let user = Caller {
                uid,
                gid: u32::MAX,
                groups: crate::sys::user_groups(uid),
            };
            may_bind(&user, &p.access)
        };
        let mut warnings = Vec::new();
        match crate::access::revoke_objects(&self.layout.mirror(project), &keep) {
            Ok(gone) if !gone.is_empty() => {
                let who: Vec<String> = gone
                    .iter()
                    .map(|u| crate::access::describe_uid(*u))
                    .collect();
                tracing::info!(%project, "objects grant revoked from {}", who.join(", "));
            }
            Ok(_) => {}
            Err(e) => warnings.push(format!(
                "cannot take back the read grant on {project}'s objects: {e}"
            )),
        }
        Ok((json!(p.access), warnings))
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
        // Whoever can write in the root must not redirect the mount (root's, content chosen by
        // the workspace's owner) onto a directory elsewhere.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(format!(
                "mount point {} is a symlink: not followed",
                path.display()
            ));
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
        // From here on, what the daemon changes other than through the mount is told to the kernel.
        core.watch_kernel();
        let cfg = crate::fs::fuse::mount_config(&rec.thread, is_root);
        let session = crate::fs::fuse::mount(adapter, &path, &cfg, self.settings.transport)
            .map_err(|e| format!("cannot mount {}: {e}", path.display()))?;
        tracing::info!(thread = %rec.thread, path = %path.display(), "mounted");
        lock(&self.mounts).insert(
            rec.thread.clone(),
            Mounted {
                path,
                session,
                info,
                core,
                owner: rec.owner,
            },
        );
        Ok(())
    }

    /// Tells the kernel serving `thread`'s mount what the daemon changed in it behind the kernel
    /// (`docs/caching.md`), before the request that changed it is answered. This runs on a request
    /// worker, never a FUSE thread, holding no lock a FUSE request waits for (the kernel may wait
    /// for requests in flight on the same inodes first).
    fn tell_kernel(&self, thread: &str) {
        let Some((core, notifier)) = lock(&self.mounts)
            .get(thread)
            .map(|m| (m.core.clone(), m.session.notifier()))
        else {
            return;
        };
        crate::fs::fuse::invalidate(&notifier, &core.take_behind());
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
        #[derive(Clone, Copy)]
        struct Served<'a> {
            core: &'a WorkspaceFs,
            info: &'a MountInfo,
        }
        // Only the Arcs are taken under the global lock: counting changes may take a while.
        let taken = lock(&self.mounts)
            .get(&rec.thread)
            .map(|m| (m.core.clone(), m.info.clone()));
        let m = taken.as_ref().map(|(core, info)| Served { core, info });
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
            transport: m.and_then(|m| m.info.transport.get().cloned()),
            changed_paths: m
                .and_then(|m| m.core.changes().ok())
                .map(|c| c.len() as u64)
                .unwrap_or(0),
            quarantined: m.map(|m| m.core.quarantined() as u64).unwrap_or(0),
            damaged: m.map(|m| m.core.damaged().to_vec()).unwrap_or_default(),
            base_content_opens: m.map(|m| m.core.base_content_opens()).unwrap_or(0),
            last_snapshot: rec.saved.as_ref().and_then(|s| s.commit.clone()),
            state: if m.is_some() { "mounted" } else { "unmounted" }.into(),
            users: if m.is_some() { rec.users.max(1) } else { 0 },
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
            transport: None,
            changed_paths: 0,
            quarantined: 0,
            damaged: Vec::new(),
            base_content_opens: 0,
            last_snapshot: last,
            state: "released".into(),
            users: 0,
            chat: false,
        }
    }

    fn fsmonitor(&self, thread: &str, token: &str, c: &Caller) -> Reply {
        validate(NameKind::Thread, thread)?;
        let (core, owner) = lock(&self.mounts)
            .get(thread)
            .map(|m| (m.core.clone(), m.owner))
            .ok_or_else(|| format!("thread {thread} is not mounted"))?;
        // What changed in a workspace is its owner's business.
        self.require_owner(c, thread, owner)?;
        let (token, changed) = core.fsmonitor_query(token);
        let mut answer = proto::FsmonitorAnswer {
            token,
            everything: false,
            paths: Vec::new(),
        };
        match changed {
            crate::fs::Changed::Everything => answer.everything = true,
            crate::fs::Changed::Paths(paths) => {
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

    /// Request statistics of one mounted thread (its owner's business), or of every mount summed
    /// (root only: the daemon-wide figures describe every user's activity).
    fn stats(&self, thread: Option<&str>, c: &Caller) -> Reply {
        let mut answer = proto::StatsAnswer::default();
        match thread {
            Some(thread) => {
                validate(NameKind::Thread, thread)?;
                let (info, owner) = lock(&self.mounts)
                    .get(thread)
                    .map(|m| (m.info.clone(), m.owner))
                    .ok_or_else(|| format!("thread {thread} is not mounted"))?;
                self.require_owner(c, thread, owner)?;
                answer.workspaces.push(proto::WorkspaceStats {
                    thread: thread.to_string(),
                    stats: info.stats.report(),
                });
            }
            None => {
                self.require_admin(c, "see every workspace's statistics")?;
                let mut infos: Vec<_> = lock(&self.mounts)
                    .iter()
                    .map(|(t, m)| (t.clone(), m.info.clone()))
                    .collect();
                infos.sort_by(|a, b| a.0.cmp(&b.0));
                for (thread, info) in infos {
                    answer.workspaces.push(proto::WorkspaceStats {
                        thread,
                        stats: info.stats.report(),
                    });
                }
            }
        }
        for w in &answer.workspaces {
            answer.total.add(&w.stats);
        }
        Ok((json!(answer), vec![]))
    }

    /// Every thread of the caller (of everyone, for root).
    fn list(&self, c: &Caller) -> Reply {
        let mine = |owner: Owner| self.is_admin(c) || owner.uid == c.uid;
        let live = WorkspaceRecord::list(&self.layout)?;
        let mut all: Vec<_> = live
            .iter()
            .filter(|r| mine(r.owner))
            .map(|r| self.status_of(r))
            .collect();
        for b in crate::workspace::Binding::list(&self.layout)? {
            if mine(b.owner) && !live.iter().any(|r| r.thread == b.thread) {
                all.push(self.status_of_released(&b));
            }
        }
        all.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok((json!(all), vec![]))
    }

    fn status(&self, thread: &str, c: &Caller) -> Reply {
        validate(NameKind::Thread, thread)?;
        if let Some(rec) = WorkspaceRecord::load(&self.layout, thread)? {
            self.require_owner(c, thread, rec.owner)?;
            return Ok((json!(self.status_of(&rec)), vec![]));
        }
        let b = crate::workspace::Binding::load(&self.layout, thread)?
            .ok_or_else(|| format!("unknown thread {thread:?}"))?;
        self.require_owner(c, thread, b.owner)?;
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
            // Whatever changed the mirror's modes while the daemon was away, the owner keeps
            // reading its objects (a failure is logged).
            self.grant_owner(&rec.project, rec.owner, true);
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
    crate::layout::make_private(&layout.state).with_context(|| {
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
    // Not state: every workspace owner must reach its mount point under it.
    crate::layout::create_public_dir(&layout.root)
        .with_context(|| format!("cannot create root {}", layout.root.display()))?;
    clear_stale_mounts(&layout.root);
    mirror::set_fetch_timeout(settings.fetch_timeout_secs);
    // Made once here, so that a refused or failed `mirror add` leaves the state as it found it.
    for dir in [layout.mirrors(), layout.projects()] {
        crate::layout::create_private_dir(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Loading every project moves credentials out of records written by an older octofs.
    if let Err(e) = mirror::list(&layout) {
        tracing::error!("cannot load the projects: {e}");
    }

    let daemon = Arc::new(Daemon::new(layout.clone(), settings)?);
    daemon.remount_all();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // The request pools, the sweep timer, and a little slack: a flood of requests queues, it
        // never grows the daemon's threads.
        .max_blocking_threads(HEAVY_WORKERS + FAST_WORKERS + 4)
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
    // Every local user must reach the socket (agents run the fsmonitor hook and `octofs open` as
    // themselves), whatever the umask: each request is authorized by its peer credentials instead.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("cannot set the mode of {}", sock.display()))?;
    }
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
    let pools = Arc::new(Pools {
        heavy: Semaphore::new(HEAVY_WORKERS),
        fast: Semaphore::new(FAST_WORKERS),
    });
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let per_user: Arc<Mutex<HashMap<u32, usize>>> = Arc::default();
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = stop.notified() => break,
            conn = accept(&listener, &slots) => {
                let (stream, slot) = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors, most likely: let connections finish.
                        tracing::warn!("control socket: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let uid = stream.peer_cred().map(|c| c.uid()).ok();
                let share = match uid {
                    Some(uid) if !daemon.is_admin(&Caller { uid, ..Caller::default() }) => {
                        match UserShare::take(&per_user, uid) {
                            Some(s) => Some(s),
                            None => {
                                tokio::spawn(refuse(stream, uid));
                                drop(slot);
                                continue;
                            }
                        }
                    }
                    _ => None,
                };
                let d = daemon.clone();
                let stop = stop.clone();
                let pools = pools.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(d, pools, stream, stop).await {
                        tracing::debug!("control connection: {e}");
                    }
                    drop(share);
                    drop(slot);
                });
            }
        }
    }
    tracing::info!("stopping");
    Ok(())
}

/// One of the `USER_CONNECTIONS` connections a user may have open; given back on drop.
struct UserShare {
    counts: Arc<Mutex<HashMap<u32, usize>>>,
    uid: u32,
}

impl UserShare {
    /// A share for `uid`, or `None` when it has all of its connections open already.
    fn take(counts: &Arc<Mutex<HashMap<u32, usize>>>, uid: u32) -> Option<UserShare> {
        let mut map = lock(counts);
        let n = map.entry(uid).or_insert(0);
        if *n >= USER_CONNECTIONS {
            return None;
        }
        *n += 1;
        Some(UserShare {
            counts: counts.clone(),
            uid,
        })
    }
}

impl Drop for UserShare {
    fn drop(&mut self) {
        let mut map = lock(&self.counts);
        if let Some(n) = map.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.uid);
            }
        }
    }
}

/// Answers a connection over its user's share with an error, without reading it.
async fn refuse(mut stream: tokio::net::UnixStream, uid: u32) {
    let resp = Response::err(format!(
        // Not `describe_uid`: a user lookup may block, and this runs on the accept path.
        "uid {uid} has {USER_CONNECTIONS} connections to the daemon open already; close some"
    ));
    if let Ok(mut out) = serde_json::to_vec(&resp) {
        out.push(b'\n');
        let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(&out)).await;
    }
}

/// The bounded pools of blocking threads that serve requests.
struct Pools {
    heavy: Semaphore,
    fast: Semaphore,
}

/// The next connection, once fewer than `MAX_CONNECTIONS` are being served.
async fn accept(
    listener: &tokio::net::UnixListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(tokio::net::UnixStream, OwnedSemaphorePermit)> {
    let slot = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(std::io::Error::other)?;
    let (stream, _) = listener.accept().await?;
    Ok((stream, slot))
}

/// Reads one request line: at most `MAX_REQUEST` bytes of UTF-8 JSON.
async fn read_request(r: tokio::net::unix::OwnedReadHalf) -> Result<Request, String> {
    use tokio::io::AsyncReadExt;
    let mut line = Vec::new();
    BufReader::new(r.take(MAX_REQUEST as u64 + 1))
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| format!("bad request: {e}"))?;
    if line.len() > MAX_REQUEST {
        return Err(format!(
            "bad request: longer than {} KiB",
            MAX_REQUEST >> 10
        ));
    }
    let text = std::str::from_utf8(&line).map_err(|e| {
        format!(
            "bad request: not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        )
    })?;
    serde_json::from_str(text).map_err(|e| format!("bad request: {e}"))
}

async fn connection(
    daemon: Arc<Daemon>,
    pools: Arc<Pools>,
    stream: tokio::net::UnixStream,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()> {
    // Who is asking is what the kernel says about the peer, never what the request says.
    let caller = stream.peer_cred().map(|cred| Caller {
        uid: cred.uid(),
        gid: cred.gid(),
        groups: crate::sys::peer_groups(&stream).unwrap_or_default(),
    });
    let (r, mut w) = stream.into_split();
    let request = match tokio::time::timeout(IO_TIMEOUT, read_request(r)).await {
        Ok(req) => req,
        Err(_) => Err(format!(
            "bad request: no request line within {} s",
            IO_TIMEOUT.as_secs()
        )),
    };
    let resp = match (request, caller) {
        (Err(e), _) => Response::err(e),
        (Ok(_), Err(e)) => Response::err(format!("cannot tell who is asking: {e}")),
        (Ok(req), Ok(caller)) => serve_request(daemon, &pools, req, caller, &stop).await,
    };
    let mut out = serde_json::to_vec(&resp)?;
    out.push(b'\n');
    tokio::time::timeout(IO_TIMEOUT, w.write_all(&out))
        .await
        .context("the client did not take its answer")??;
    Ok(())
}

/// Answers `ping` at once, fsmonitor queries on their own pool, everything else on the heavy pool.
async fn serve_request(
    daemon: Arc<Daemon>,
    pools: &Pools,
    req: Request,
    caller: Caller,
    stop: &tokio::sync::Notify,
) -> Response {
    let pool = match req {
        Request::Ping => return daemon.handle(req, &caller),
        Request::Fsmonitor { .. } | Request::Stats { .. } | Request::Stop => &pools.fast,
        _ => &pools.heavy,
    };
    let is_stop = matches!(req, Request::Stop);
    let Ok(_worker) = pool.acquire().await else {
        return Response::err("the daemon is stopping");
    };
    let resp = tokio::task::spawn_blocking(move || daemon.handle(req, &caller))
        .await
        .unwrap_or_else(|e| Response::err(format!("internal error: {e}")));
    if is_stop && resp.ok {
        stop.notify_one();
    }
    resp
}
