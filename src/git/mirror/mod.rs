//! Mirrors: one pristine git working checkout per project, on its default branch (seed 000 "Mirrors").
//!
//! A mirror is created by `add` and moved forward only by `sync`; both run under the caller's
//! per-project lock (the daemon holds it) and both publish atomically: a new mirror is built in a
//! staging directory and renamed into place, so a mirror directory that exists is complete.
//!
//! The rooms:
//! - this file: the project records (`<state>/projects/<project>.json`) and their listing;
//! - `upstream`: what an upstream is (a git URL, a git repository path, a plain directory) and
//!   which ones are refused before git sees them;
//! - `credentials`: an http(s) upstream's secret, kept apart from every record and redacted from
//!   every message;
//! - `clone_sync`: building, syncing and re-creating a mirror;
//! - `network`: clone and fetch, with a stall timeout and the credentials in git's environment;
//! - `push`: push, ls-remote and fetch of one ref, to the upstream or a remote a caller names;
//! - `far_side`: the far side of a transport to a caller's remote, run as that caller.

mod clone_sync;
mod credentials;
pub mod far_side;
mod network;
mod push;
mod upstream;

use crate::git::error::Error;
use crate::git::refusal::Refusal;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::git;
use crate::layout::Layout;
use crate::records::RecordDir;
use credentials::{migrate_credentials, redact_url};

pub use clone_sync::{add, sync};
pub use credentials::redact;
pub use far_side::FarSide;
pub use network::{Watch, cancelled, set_fetch_timeout, watched};
pub use push::{
    Change, PushTarget, Shared, changes, check_share, fetch_ref, is_ancestor, push, push_ref,
    push_target, remote_ref_tip, remote_tip, share_target,
};
pub use upstream::{check_upstream, classify, is_url};

/// What an upstream is; decides how the mirror is created and synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    Url,
    Repository,
    Directory,
}

/// The durable description of a project, kept at `<state>/projects/<project>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Project {
    pub project: String,
    pub upstream: String,
    pub kind: UpstreamKind,
    pub default_branch: String,
    /// Unix seconds of the last successful sync (or of the add).
    pub last_sync: u64,
    /// Who may bind the project (open a thread of it).
    #[serde(default, skip_serializing_if = "Access::is_open")]
    pub access: Access,
    /// The share remote (a URL or an absolute path, no credentials): every snapshot of the
    /// project's threads is also pushed to its `refs/octomate/threads/<thread>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<String>,
    /// Gitignore-style patterns whose paths are never committed or pushed from the project's
    /// workspaces (the `excludes` gate), even where a branch tracks them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excludes: Vec<String>,
}

/// Who may bind a project: these users and the members of these groups; both lists empty means any
/// local user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<u32>,
}

impl Access {
    pub fn is_open(&self) -> bool {
        self.users.is_empty() && self.groups.is_empty()
    }
}

/// One row of `mirror list`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MirrorInfo {
    #[serde(flatten)]
    pub project: Project,
    pub head: Option<String>,
    pub path: PathBuf,
}

/// The result of a sync.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SyncOutcome {
    pub project: String,
    pub head: Option<String>,
    pub changed: bool,
    /// Not synced because the last sync is within the freshness window.
    pub fresh: bool,
    /// Set when the upstream could not be reached and the stale mirror is kept.
    pub warning: Option<String>,
    /// The mirror was missing or broken and was cloned again from the upstream.
    #[serde(default)]
    pub recreated: bool,
}

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Project descriptions live at `<state>/projects/<project>.json`.
fn store(layout: &Layout) -> RecordDir {
    RecordDir::files(layout.projects(), "project", "project")
}

/// Loads a project's description; `Ok(None)` when the project does not exist. A record that still
/// holds credentials in its upstream URL (written by an older octofs) is migrated first.
pub fn load(layout: &Layout, project: &str) -> Result<Option<Project>, Error> {
    let Some(mut p) = store(layout)
        .load::<Project>(project)
        .map_err(Error::Record)?
    else {
        return Ok(None);
    };
    if p.kind == UpstreamKind::Url {
        let clean = redact_url(&p.upstream);
        if clean != p.upstream {
            migrate_credentials(layout, &mut p, clean)?;
        }
    }
    Ok(Some(p))
}

/// Loads a project that must exist.
pub fn require(layout: &Layout, project: &str) -> Result<Project, Error> {
    load(layout, project)?.ok_or_else(|| Error::UnknownProject(project.to_string()))
}

pub(super) fn save(layout: &Layout, p: &Project) -> Result<(), Error> {
    store(layout).save(&p.project, p).map_err(Error::Record)
}

/// Sets (or, with `None`, clears) `project`'s share remote. The caller holds the project's lock.
pub fn set_share(layout: &Layout, project: &str, share: Option<&str>) -> Result<Project, Error> {
    let mut p = require(layout, project)?;
    p.share = share.map(check_share).transpose()?;
    save(layout, &p)?;
    Ok(p)
}

/// Replaces `project`'s configured excludes (an empty list clears them). The caller holds the
/// project's lock.
pub fn set_excludes(
    layout: &Layout,
    project: &str,
    excludes: Vec<String>,
) -> Result<Project, Error> {
    let mut p = require(layout, project)?;
    if let Some(bad) = excludes
        .iter()
        .find(|e| e.trim().is_empty() || e.contains('\n') || e.starts_with('#'))
    {
        return Err(Refusal::BadExclude {
            pattern: bad.clone(),
        }
        .into());
    }
    p.excludes = excludes;
    save(layout, &p)?;
    Ok(p)
}

/// Replaces who may bind `project`. The caller holds the project's lock.
pub fn set_access(layout: &Layout, project: &str, access: Access) -> Result<Project, Error> {
    let mut p = require(layout, project)?;
    p.access = access;
    save(layout, &p)?;
    Ok(p)
}

pub(super) fn head(mirror: &Path) -> Option<String> {
    git!(Some(mirror); "rev-parse", "--verify", "--quiet", "--end-of-options", "HEAD").ok()
}

pub fn info(layout: &Layout, mut project: Project) -> MirrorInfo {
    let path = layout.mirror(&project.project);
    project.upstream = redact(&project.upstream);
    MirrorInfo {
        head: head(&path),
        path,
        project,
    }
}

/// Every project, sorted by name.
pub fn list(layout: &Layout) -> Result<Vec<MirrorInfo>, Error> {
    // Names starting with '.' are octofs's own (the blank repository of chat workspaces).
    let projects: Vec<Project> = store(layout)
        .list(|project| !project.starts_with('.'))
        .map_err(Error::Record)?;
    let mut out: Vec<MirrorInfo> = projects.into_iter().map(|p| info(layout, p)).collect();
    out.sort_by(|a, b| a.project.project.cmp(&b.project.project));
    Ok(out)
}
