//! The daemon's side of mirrors: `mirror add/sync/access` under the project's lock, the blank
//! repository chat workspaces fork from, and the cache of open object stores the mounts read.
//!
//! Mechanism (cloning, fetching, credentials) is `git::mirror`; this module only serializes it per
//! project, decides who loses the read grant when a project's access list changes, and starts the
//! build of the shared index of each project's default branch ahead of the first fork, so that fork
//! does not pay for it: before `mirror add` and `mirror sync` answer (outside the project's lock,
//! so the mirror is never held by it), and on a background thread at daemon start. The build itself
//! is `repo::shared_index`, holding only its `index:` lock.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use super::error::{Context, Error};
use super::guard::LockKey;
use super::proto::{
    Access, AccessAnswer, AccessChange, Ack, FetchProgress, MirrorInfo, SyncOutcome,
};
use super::refusal::MirrorRefusal;
use super::{Daemon, KeyedLocks, Reply, lock};
use crate::access::Caller;
use crate::git::Git;
use crate::git::mirror::{self, Project, UpstreamKind};
use crate::git::objects::ObjectStore;
use crate::layout::Layout;
use crate::names::{NameKind, validate};
use crate::workspace::{Binding, Owner, WorkspaceRecord};

/// One shared index to build ahead of the first fork that needs it.
pub(super) struct IndexJob {
    project: String,
    store: Arc<ObjectStore>,
    tree: gix::ObjectId,
    time: i64,
    owner: Owner,
}

/// The keyed lock every build of the shared index of (`index_tree`, `worktree_tree`) holds: a fork
/// that finds a build under way waits for it instead of building a second one.
pub(super) fn index_lock_key(index_tree: gix::ObjectId, worktree_tree: gix::ObjectId) -> LockKey {
    LockKey::Index {
        index_tree,
        worktree_tree,
    }
}

/// Builds `jobs` one after the other, each under its `index:` lock and nothing else. A failure is
/// logged: the fork that needs that index builds it then, as it would have without the job.
fn run_index_jobs(layout: &Layout, locks: &KeyedLocks, jobs: Vec<IndexJob>) {
    for job in jobs {
        let l = locks.get(&index_lock_key(job.tree, job.tree));
        let _g = lock(&l);
        let started = Instant::now();
        let done = crate::repo::shared_index(
            layout,
            &job.store,
            job.tree,
            job.tree,
            job.time,
            job.owner.uid,
            job.owner.gid,
        );
        match done {
            Ok(_) => tracing::info!(
                project = %job.project,
                tree = %job.tree,
                uid = job.owner.uid,
                gid = job.owner.gid,
                ms = started.elapsed().as_millis() as u64,
                "shared index ready"
            ),
            Err(e) => tracing::warn!(
                project = %job.project,
                tree = %job.tree,
                uid = job.owner.uid,
                "cannot build the shared index ahead of time (the first fork will): {e}"
            ),
        }
    }
}

/// The internal project every chat workspace forks from (a name users cannot pick).
pub const BLANK: &str = ".blank";

impl Daemon {
    /// The object store of `project`'s mirror, opened once. The `stores` map is locked only to
    /// look up and to insert: opening a repository reads files, and every mount's first request
    /// and every `open` of any project would otherwise wait behind it. Two callers that open the
    /// same store at once both open it; the first one inserted is kept.
    pub(super) fn store(&self, project: &str) -> Result<Arc<ObjectStore>, Error> {
        if let Some(s) = lock(&self.stores).get(project).cloned() {
            return Ok(s);
        }
        let opened = Arc::new(
            ObjectStore::open(&self.layout.mirror(project))
                .context(|| format!("cannot open the mirror of {project}"))?
                .with_fallback(&crate::deps::DepStore::new(&self.layout).objects())
                .with_snapshot_caches(self.snapshot_caches.clone()),
        );
        Ok(lock(&self.stores)
            .entry(project.to_string())
            .or_insert(opened)
            .clone())
    }

    pub(super) fn mirror_add(
        &self,
        project: &str,
        upstream: &str,
        credential: Option<&str>,
        access: Access,
    ) -> Reply<MirrorInfo> {
        validate(NameKind::Project, project)?;
        with_job(project, || {
            self.mirror_add_watched(project, upstream, credential, access)
        })
    }

    fn mirror_add_watched(
        &self,
        project: &str,
        upstream: &str,
        credential: Option<&str>,
        access: Access,
    ) -> Reply<MirrorInfo> {
        let l = self.locks.get(&LockKey::project(project));
        let _g = lock(&l);
        let info = super::metrics::timed(super::metrics::Kind::MirrorClone, project, || {
            mirror::add(&self.layout, project, upstream, credential, access)
        })?;
        drop(_g);
        // Before the answer: a caller that forks right after `mirror add` finds the index, and the
        // state directory does not change behind a command that follows (a build still writing its
        // temporary file when the next command runs would look like that command's doing).
        run_index_jobs(&self.layout, &self.locks, self.index_jobs(project));
        // Then the default branch's dependency layers, still outside the project's lock; a failed
        // build is a warning, never a failed `mirror add`.
        let warnings = self.build_missing_layers(project);
        Ok((info, warnings))
    }

    /// The shared indexes of `project`'s default branch (the mirror's HEAD) that are missing: one per
    /// owner a fork of it is likely to have — root, the daemon's own user, and the owner of every
    /// workspace record and thread binding of the project. Reads records and the mirror's HEAD; takes
    /// no keyed lock.
    pub(super) fn index_jobs(&self, project: &str) -> Vec<IndexJob> {
        let store = match self.store(project) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%project, "cannot prebuild the shared index: {e}");
                return Vec::new();
            }
        };
        // A mirror without commits has nothing to index.
        let Ok(base) = store.resolve(None) else {
            return Vec::new();
        };
        let mut owners = vec![
            Owner { uid: 0, gid: 0 },
            Owner {
                uid: crate::sys::euid(),
                gid: crate::sys::egid(),
            },
        ];
        match WorkspaceRecord::list(&self.layout) {
            Ok(recs) => owners.extend(
                recs.into_iter()
                    .filter(|r| r.project == project)
                    .map(|r| r.owner),
            ),
            Err(e) => tracing::warn!("cannot list the workspaces: {e}"),
        }
        match Binding::list(&self.layout) {
            Ok(bs) => owners.extend(
                bs.into_iter()
                    .filter(|b| b.project == project)
                    .map(|b| b.owner),
            ),
            Err(e) => tracing::warn!("cannot list the threads: {e}"),
        }
        owners.sort_by_key(|o| (o.uid, o.gid));
        owners.dedup_by_key(|o| (o.uid, o.gid));
        owners
            .into_iter()
            .filter(|o| {
                !crate::repo::shared_index_path(&self.layout, base.tree, base.tree, o.uid, o.gid)
                    .exists()
            })
            .map(|owner| IndexJob {
                project: project.to_string(),
                store: store.clone(),
                tree: base.tree,
                time: base.time,
                owner,
            })
            .collect()
    }

    /// Builds `jobs` on a background thread (never on the caller's, never under a lock the caller
    /// holds). Without a thread (the system refuses one) the jobs are dropped: forks build what
    /// they need, as they would have.
    pub(super) fn spawn_index_builds(&self, jobs: Vec<IndexJob>) {
        if jobs.is_empty() {
            return;
        }
        let layout = self.layout.clone();
        let locks = self.locks.clone();
        let spawned = std::thread::Builder::new()
            .name("octofs-index".into())
            .spawn(move || run_index_jobs(&layout, &locks, jobs));
        if let Err(e) = spawned {
            tracing::warn!("cannot start the shared index build: {e}");
        }
    }

    /// At start: the missing default-branch indexes of every project, built one after the other on
    /// one background thread.
    pub(super) fn prebuild_all_indexes(&self) {
        let projects = match mirror::list(&self.layout) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("cannot list the projects to prebuild their indexes: {e}");
                return;
            }
        };
        let jobs = projects
            .iter()
            .flat_map(|m| self.index_jobs(&m.project.project))
            .collect();
        self.spawn_index_builds(jobs);
    }

    /// Who may bind `project`; replaced first when `access` is given. Applies at once to the
    /// project's live threads: an owner who may no longer bind it loses the read grant on its
    /// objects (their workspace's git cannot read the history, `.git/octofs/objects` refuses
    /// them), an owner allowed again gets it back (the same mount's git works again); the answer
    /// lists both.
    pub(super) fn mirror_access(
        &self,
        project: &str,
        access: Option<Access>,
    ) -> Reply<AccessAnswer> {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&LockKey::project(project));
        let _g = lock(&l);
        let before = mirror::require(&self.layout, project)?.access;
        let Some(a) = access else {
            return Ok((
                AccessAnswer {
                    access: before,
                    affected: Vec::new(),
                },
                vec![],
            ));
        };
        let p = mirror::set_access(&self.layout, project, a)?;
        // Every mount's objects gate decides again at its next request (`.git/octofs`).
        self.access_epoch
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let allowed = |uid: u32, access: &Access| {
            let user = Caller {
                uid,
                gid: u32::MAX,
                groups: crate::sys::user_groups(uid),
            };
            uid == 0 || uid == crate::sys::euid() || super::authz::may_bind(&user, access)
        };
        // Who may no longer bind the project loses the read grant on its objects at once (their
        // workspaces' git then cannot read the project's history: revoking is revoking).
        let keep = |uid: u32| allowed(uid, &p.access);
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
        let mut affected = Vec::new();
        let mut regranted: Vec<u32> = Vec::new();
        let live = WorkspaceRecord::list(&self.layout)?;
        for rec in live.iter().filter(|r| r.project == project && !r.chat) {
            let (was, is) = (
                allowed(rec.owner.uid, &before),
                allowed(rec.owner.uid, &p.access),
            );
            if was == is {
                continue;
            }
            if is && !regranted.contains(&rec.owner.uid) {
                // Allowed again: the read grant comes back now, not at the next open.
                regranted.push(rec.owner.uid);
                warnings.extend(self.grant_owner(project, rec.owner, true));
            }
            tracing::info!(
                %project,
                thread = %rec.thread,
                uid = rec.owner.uid,
                "live thread's access {}",
                if is { "granted" } else { "revoked" }
            );
            affected.push(AccessChange {
                thread: rec.thread.clone(),
                owner: crate::access::user_label(rec.owner.uid),
                path: self.layout.mountpoint(&rec.thread).display().to_string(),
                change: if is { "granted" } else { "revoked" }.into(),
            });
        }
        Ok((
            AccessAnswer {
                access: p.access,
                affected,
            },
            warnings,
        ))
    }

    /// Every project the caller may bind (every project, for root).
    pub(super) fn mirror_list(&self, c: &Caller) -> Reply<Vec<MirrorInfo>> {
        let mut l = mirror::list(&self.layout)?;
        if !self.is_admin(c) {
            l.retain(|m| super::authz::may_bind(c, &m.project.access));
        }
        Ok((l, vec![]))
    }

    pub(super) fn mirror_sync(&self, project: &str) -> Reply<SyncOutcome> {
        validate(NameKind::Project, project)?;
        with_job(project, || self.mirror_sync_watched(project))
    }

    fn mirror_sync_watched(&self, project: &str) -> Reply<SyncOutcome> {
        let l = self.locks.get(&LockKey::project(project));
        let _g = lock(&l);
        let out = super::metrics::timed(super::metrics::Kind::MirrorFetch, project, || {
            mirror::sync(&self.layout, project, self.settings.freshness_secs)
        })?;
        drop(_g);
        // Also after a sync that moved nothing: it costs one `stat` per owner when the index is
        // there, and builds it when it is not (a new owner, an index removed). Before the answer,
        // as after `mirror add`.
        run_index_jobs(&self.layout, &self.locks, self.index_jobs(project));
        let mut warnings: Vec<String> = out.warning.iter().cloned().collect();
        warnings.extend(self.build_missing_layers(project));
        Ok((out, warnings))
    }

    /// Creates the blank repository chat workspaces fork from, once.
    pub(super) fn ensure_blank(&self) -> Result<(), Error> {
        let l = self.locks.get(&LockKey::project(BLANK));
        let _g = lock(&l);
        let dir = self.layout.mirror(BLANK);
        if dir.join(".git").exists() {
            return Ok(());
        }
        let staging = self
            .layout
            .mirrors()
            .join(format!(".staging-blank-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .context(|| "cannot create the blank repository".to_string())?;
        let made = (|| {
            crate::git!(Some(&staging); "init", "--quiet", "--initial-branch=main")?;
            let empty =
                crate::git!(Some(&staging); "hash-object", "-t", "tree", "-w", "/dev/null")?;
            let commit = Git::new(Some(&staging))
                .args([
                    "commit-tree",
                    &empty,
                    "-m",
                    "octofs: blank repository for chat workspaces",
                ])
                .by_octofs()
                .output()?;
            crate::git!(Some(&staging); "update-ref", "refs/heads/main", &commit)?;
            std::fs::rename(&staging, &dir).map_err(|e| e.to_string())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(MirrorRefusal::Blank { error: e }.into());
        }
        Ok(())
    }
}

/// The project description of the blank repository.
pub(super) fn blank_project() -> Project {
    Project {
        project: BLANK.into(),
        upstream: String::new(),
        kind: UpstreamKind::Directory,
        default_branch: "main".into(),
        last_sync: 0,
        access: Default::default(),
        share: None,
        excludes: Vec::new(),
    }
}

/// The `mirror add`/`mirror sync` requests running, by project: what `mirror progress` reads and
/// `mirror cancel` ends (see [`mirror::Watch`]).
static JOBS: LazyLock<Mutex<HashMap<String, Arc<mirror::Watch>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Runs `f` (a `mirror add` or `mirror sync` of `project`) watched: its clones and fetches report
/// their progress and stop on `mirror cancel`.
fn with_job<T>(project: &str, f: impl FnOnce() -> T) -> T {
    let w = Arc::new(mirror::Watch::default());
    lock(&JOBS).insert(project.to_string(), w.clone());
    let out = mirror::watched(&w, f);
    let mut jobs = lock(&JOBS);
    if jobs.get(project).is_some_and(|j| Arc::ptr_eq(j, &w)) {
        jobs.remove(project);
    }
    out
}

/// `mirror progress`.
pub(super) fn progress(project: &str) -> FetchProgress {
    match lock(&JOBS).get(project) {
        Some(w) => FetchProgress {
            running: true,
            line: w.line(),
        },
        None => FetchProgress::default(),
    }
}

/// `mirror cancel`.
pub(super) fn cancel(project: &str) -> Reply<Ack> {
    match lock(&JOBS).get(project) {
        Some(w) => {
            w.cancel();
            tracing::info!(%project, "clone or fetch cancelled by its caller");
            Ok((Ack("cancelling".into()), vec![]))
        }
        None => Err(MirrorRefusal::NotRunning {
            project: project.to_string(),
        }
        .into()),
    }
}
