//! The daemon's side of dependency layers: `deps build` (the layers of one commit of a project),
//! the build of a default branch's missing layers after `mirror add` and `mirror sync`, `deps
//! list`, `deps gc`, and the progress a CLI on a terminal polls while a build runs.
//!
//! Builds run on the requesting worker, under no project or workspace lock (only the key's own
//! build lock, in `deps::build`); a failed build never fails the request that started it. The
//! building itself is `crate::deps`; this module decides when and reports.
//!
//! Also the build of a workspace's **own** lockfile at open ([`Daemon::build_for_open`]): a
//! resumed thread whose agent changed its lockfile gets that lockfile's layer, built in the same
//! sandbox as every build, on a thread of its own; the open waits for it a bounded time
//! (`OCTOFS_DEPS_OPEN_WAIT`), and `status` asks [`building`] while it runs.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::error::{Context, Error};
use super::refusal::DepsRefusal;
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::deps::build::{
    self, BuildAnswer, Outcome, OutcomeKind, Plan, ProgressAnswer, ProgressEvent,
};
use crate::deps::gc::{self, GcAnswer, LayerInfo, Needed};
use crate::deps::{DepLayer, DepStore, Lockfile, Manager};
use crate::git::mirror;
use crate::names::{NameKind, validate};
use crate::workspace::WorkspaceRecord;

/// Builds started at open that are still running, by (manager, lockfile hash): when the first
/// started and how many opens wait on it.
static BUILDING: Mutex<Vec<(Manager, String, Instant, u32)>> = Mutex::new(Vec::new());

/// How long an open waits for the build of its workspace's own lockfile by default.
pub const OPEN_WAIT: Duration = Duration::from_secs(30);

/// How long an open waits for the build of its workspace's own lockfile: `OCTOFS_DEPS_OPEN_WAIT`
/// seconds (0: not at all, the build goes on in the background), else [`OPEN_WAIT`].
fn open_wait() -> Duration {
    std::env::var("OCTOFS_DEPS_OPEN_WAIT")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(OPEN_WAIT)
}

/// How long the build of `manager`'s layer for the lockfile whose key input hashes to `hash` has
/// been running, when an open started one that has not finished.
pub(super) fn building(manager: Manager, hash: &str) -> Option<Duration> {
    lock(&BUILDING)
        .iter()
        .find(|(m, h, _, _)| *m == manager && h == hash)
        .map(|(_, _, at, _)| at.elapsed())
}

/// Marks a build started at open as running until dropped.
struct Running(Manager, String);

impl Running {
    fn start(manager: Manager, hash: &str) -> Running {
        let mut b = lock(&BUILDING);
        match b.iter_mut().find(|(m, h, _, _)| *m == manager && h == hash) {
            Some(e) => e.3 += 1,
            None => b.push((manager, hash.to_string(), Instant::now(), 1)),
        }
        Running(manager, hash.to_string())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut b = lock(&BUILDING);
        if let Some(i) = b
            .iter()
            .position(|(m, h, _, _)| *m == self.0 && *h == self.1)
        {
            b[i].3 -= 1;
            if b[i].3 == 0 {
                b.remove(i);
            }
        }
    }
}

/// The events this daemon's builds reported, the last `KEPT` of them.
static EVENTS: Mutex<(u64, Vec<ProgressEvent>)> = Mutex::new((0, Vec::new()));
const KEPT: usize = 256;

fn report(project: &str, what: &str, outcome: Option<Outcome>) {
    // A build that ran (not one found built) is timed for the metrics.
    if let Some(o) = &outcome {
        let ok = match o.result {
            OutcomeKind::Built { .. } => Some(true),
            OutcomeKind::Failed { .. } => Some(false),
            OutcomeKind::UpToDate { .. } => None,
        };
        if let Some(ok) = ok {
            let took = Duration::from_millis(o.ms);
            super::metrics::observe(super::metrics::Kind::LayerBuild, o.manager.name(), took, ok);
        }
    }
    let mut ev = lock(&EVENTS);
    ev.0 += 1;
    let seq = ev.0;
    ev.1.push(ProgressEvent {
        seq,
        project: project.to_string(),
        what: what.to_string(),
        outcome,
    });
    if ev.1.len() > KEPT {
        let extra = ev.1.len() - KEPT;
        ev.1.drain(..extra);
    }
}

impl Daemon {
    /// Builds the layers of `project`'s commit `git_ref` (its default branch when `None`) that are
    /// not built (a failed one is tried again). `only_missing` skips the lockfiles whose layer is
    /// built without reporting them.
    fn build_layers(
        &self,
        project: &str,
        git_ref: Option<&str>,
        only_missing: bool,
    ) -> Result<BuildAnswer, Error> {
        let store = self.store(project)?;
        let base = store.resolve(git_ref)?;
        let deps = DepStore::new(&self.layout);
        let plans: Vec<Plan> = build::plan(&store, base.tree)
            .context(|| format!("cannot read the lockfiles of {project}"))?;
        let what = format!("{project}@{}", base.commit);
        let timeout = build::timeout_from_env();
        let mut outcomes = Vec::new();
        for plan in plans {
            if only_missing && build::is_built(&deps, &plan) {
                continue;
            }
            // `mirror add`/`mirror sync` cancelled (Ctrl-C): no further build starts.
            if mirror::cancelled() {
                tracing::info!(%project, "layer builds skipped: cancelled");
                break;
            }
            let name = plan.describe();
            report(project, &name, None);
            tracing::info!(%project, key = %plan.key, "building the {name}");
            let o = build::build(&deps, &store, base.tree, &plan, &what, timeout);
            match &o.result {
                OutcomeKind::Failed { .. } => tracing::warn!(%project, "{}", o.describe()),
                _ => tracing::info!(%project, "{}", o.describe()),
            }
            report(project, &name, Some(o.clone()));
            outcomes.push(o);
        }
        Ok(BuildAnswer {
            project: project.to_string(),
            commit: base.commit.to_string(),
            outcomes,
        })
    }

    /// After `mirror add` and `mirror sync` (outside the project's lock): the default branch's
    /// missing layers. Returns one warning per failed build (naming its log); never fails.
    pub(super) fn build_missing_layers(&self, project: &str) -> Vec<String> {
        match self.build_layers(project, None, true) {
            Ok(a) => a
                .outcomes
                .iter()
                .filter(|o| matches!(o.result, OutcomeKind::Failed { .. }))
                .map(|o| format!("dependency {}", o.describe()))
                .collect(),
            // A mirror without commits has no lockfile; anything else is worth a line.
            Err(e) => {
                tracing::warn!(%project, "cannot build the dependency layers: {e}");
                if matches!(e, Error::Git(_)) {
                    Vec::new()
                } else {
                    vec![format!("cannot build the dependency layers: {e}")]
                }
            }
        }
    }

    /// At open: builds the layer of `lock`, a lockfile of the workspace's files `tree` (a tree of
    /// `project`'s mirror) that has no layer and was never tried on this host (a failed build is
    /// not tried again at every open: `deps build` does that). The build runs in the sandbox, as
    /// every build, on a thread of its own; a build of the same key under way (another thread's
    /// open) is waited for, not repeated. Returns the built layer when it is ready within
    /// [`open_wait`]; `None` when it failed, was tried before, or is still running (then
    /// [`building`] says so until it ends).
    pub(super) fn build_for_open(
        &self,
        project: &str,
        tree: gix::ObjectId,
        lock: &Lockfile,
    ) -> Option<DepLayer> {
        let deps = DepStore::new(&self.layout);
        let store = self.store(project).ok()?;
        let plan = match build::plan(&store, tree) {
            Ok(p) => p.into_iter().find(|p| p.lock.manager == lock.manager)?,
            Err(e) => {
                tracing::warn!(%project, "cannot read the workspace's lockfiles: {e}");
                return None;
            }
        };
        if plan.version.is_err() || deps.load(&plan.key).is_some() {
            return None;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let what = format!("{project}@tree {tree} (a workspace's own lockfile)");
        let name = plan.describe();
        let running = Running::start(lock.manager, &lock.hash);
        let project_name = project.to_string();
        let started = std::thread::Builder::new()
            .name("deps-open".into())
            .spawn(move || {
                let _running = running;
                report(&project_name, &name, None);
                tracing::info!(project = %project_name, key = %plan.key, "building the {name} of a workspace's own lockfile");
                let o = build::build(&deps, &store, tree, &plan, &what, build::timeout_from_env());
                match &o.result {
                    OutcomeKind::Failed { .. } => tracing::warn!(project = %project_name, "{}", o.describe()),
                    _ => tracing::info!(project = %project_name, "{}", o.describe()),
                }
                report(&project_name, &name, Some(o.clone()));
                let _ = tx.send(o);
            });
        if let Err(e) = started {
            tracing::warn!(%project, "cannot start a layer build: {e}");
            return None;
        }
        match rx.recv_timeout(open_wait()) {
            Ok(o) if !matches!(o.result, OutcomeKind::Failed { .. }) => {
                DepStore::new(&self.layout).built_for(lock).ok().flatten()
            }
            _ => None,
        }
    }

    /// `octofs deps build <project> [--ref R]`.
    pub(super) fn deps_build(&self, project: &str, git_ref: Option<&str>) -> Reply<BuildAnswer> {
        validate(NameKind::Project, project)?;
        mirror::require(&self.layout, project)?;
        let a = self.build_layers(project, git_ref, false)?;
        Ok((a, vec![]))
    }

    /// `octofs deps list`: every layer; a caller other than root sees only their own threads
    /// among its users.
    pub(super) fn deps_list(&self, c: &Caller) -> Reply<Vec<LayerInfo>> {
        let mut l = gc::list(&self.layout, || WorkspaceRecord::layer_uses(&self.layout))
            .context(|| "cannot list the layers".to_string())?;
        if !self.is_admin(c) {
            let own: Vec<String> = WorkspaceRecord::list(&self.layout)?
                .into_iter()
                .filter(|r| r.owner.uid == c.uid)
                .map(|r| r.thread)
                .collect();
            let me = crate::access::user_label(c.uid);
            for i in &mut l {
                i.users.retain(|t| own.contains(t));
                i.owners.retain(|o| *o == me);
            }
        }
        Ok((l, vec![]))
    }

    /// `octofs deps gc`: keeps what a workspace uses and what each mirror's default-branch tip
    /// needs; removes the rest.
    pub(super) fn deps_gc(&self) -> Reply<GcAnswer> {
        let mut needed = Needed::default();
        for m in mirror::list(&self.layout)? {
            let project = m.project.project;
            let tip = self
                .store(&project)
                .map_err(|e| e.to_string())
                .and_then(|s| match s.resolve(None) {
                    Ok(base) => build::plan(&s, base.tree).map_err(|e| e.to_string()),
                    Err(_) => Ok(Vec::new()),
                });
            match tip {
                Ok(plans) => {
                    for p in plans {
                        needed.locks.insert((p.lock.manager, p.lock.hash.clone()));
                        needed.keys.insert(p.key);
                    }
                }
                // Without knowing what the tip needs, keep everything of a lockfile it may have.
                Err(e) => {
                    return Err(DepsRefusal::UnknownNeeds { project, error: e }.into());
                }
            }
        }
        let a = gc::gc(&self.layout, &needed, || {
            WorkspaceRecord::layer_uses(&self.layout)
        })?;
        Ok((a, vec![]))
    }

    /// `deps progress`: the build events of `project` after `after`.
    pub(super) fn deps_progress(&self, project: &str, after: u64) -> Reply<ProgressAnswer> {
        let ev = lock(&EVENTS);
        Ok((
            ProgressAnswer {
                last: ev.0,
                events: ev
                    .1
                    .iter()
                    .filter(|e| e.seq > after && e.project == project)
                    .cloned()
                    .collect(),
            },
            vec![],
        ))
    }
}
