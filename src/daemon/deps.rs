//! The daemon's side of dependency layers: `deps build` (the layers of one commit of a project),
//! the build of a default branch's missing layers after `mirror add` and `mirror sync`, `deps
//! list`, `deps gc`, and the progress a CLI on a terminal polls while a build runs.
//!
//! Builds run on the requesting worker, under no project or workspace lock (only the key's own
//! build lock, in `deps::build`); a failed build never fails the request that started it. The
//! building itself is `crate::deps`; this module decides when and reports.

use std::sync::Mutex;

use super::error::{Context, Error};
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::deps::DepStore;
use crate::deps::build::{
    self, BuildAnswer, Outcome, OutcomeKind, Plan, ProgressAnswer, ProgressEvent,
};
use crate::deps::gc::{self, GcAnswer, LayerInfo, Needed};
use crate::git::mirror;
use crate::names::{NameKind, validate};

/// The events this daemon's builds reported, the last `KEPT` of them.
static EVENTS: Mutex<(u64, Vec<ProgressEvent>)> = Mutex::new((0, Vec::new()));
const KEPT: usize = 256;

fn report(project: &str, what: &str, outcome: Option<Outcome>) {
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
        let mut l = gc::list(&self.layout).context(|| "cannot list the layers".to_string())?;
        if !self.is_admin(c) {
            let own: Vec<String> = crate::workspace::WorkspaceRecord::list(&self.layout)?
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
                    return Err(Error::Refused(format!(
                        "cannot tell which layers {project} needs ({e}); nothing removed"
                    )));
                }
            }
        }
        let a = gc::gc(&self.layout, &needed).map_err(Error::Refused)?;
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
