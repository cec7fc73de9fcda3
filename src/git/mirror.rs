//! Mirrors: one pristine git working checkout per project, on its default branch (seed 000 "Mirrors").
//!
//! A mirror is created by `add` and moved forward only by `sync`; both run under the caller's
//! per-project lock (the daemon holds it) and both publish atomically: a new mirror is built in a
//! staging directory and renamed into place, so a mirror directory that exists is complete. Upstreams
//! come in three kinds — a git URL, a git repository path, a plain directory. A directory upstream is
//! committed through a scratch index with the folder as work tree, so no `.git` is ever created in it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::git;
use crate::layout::Layout;
use crate::records::RecordDir;

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

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Project descriptions live at `<state>/projects/<project>.json`.
fn store(layout: &Layout) -> RecordDir {
    RecordDir::files(layout.projects(), "project", "project")
}

/// Loads a project's description; `Ok(None)` when the project does not exist.
pub fn load(layout: &Layout, project: &str) -> Result<Option<Project>, String> {
    store(layout).load(project)
}

/// Loads a project that must exist.
pub fn require(layout: &Layout, project: &str) -> Result<Project, String> {
    load(layout, project)?.ok_or_else(|| {
        format!(
            "unknown project {project:?} (add it with `octofs mirror add {project} <upstream>`)"
        )
    })
}

fn save(layout: &Layout, p: &Project) -> Result<(), String> {
    store(layout).save(&p.project, p)
}

/// Decides what kind of upstream `upstream` names, without creating anything.
pub fn classify(upstream: &str) -> Result<(UpstreamKind, String), String> {
    if upstream.is_empty() {
        return Err("upstream must not be empty".into());
    }
    let is_url = upstream.contains("://")
        || (upstream.contains(':') && !upstream.starts_with('/') && upstream.contains('@'));
    if is_url {
        if let Some(path) = upstream.strip_prefix("file://")
            && !Path::new(path).exists()
        {
            return Err(format!("upstream {upstream} does not exist"));
        }
        return Ok((UpstreamKind::Url, upstream.to_string()));
    }
    let path = std::path::absolute(upstream).map_err(|e| format!("upstream {upstream}: {e}"))?;
    let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("upstream {upstream} does not exist"),
        _ => format!("upstream {upstream}: {e}"),
    })?;
    if !meta.is_dir() {
        return Err(format!(
            "upstream {upstream} is not a git repository or a directory"
        ));
    }
    let shown = path.to_string_lossy().into_owned();
    let is_repo = path.join(".git").exists()
        || (path.join("HEAD").is_file()
            && path.join("objects").is_dir()
            && path.join("refs").is_dir());
    if is_repo {
        git!(Some(&path); "rev-parse", "--git-dir")
            .map_err(|e| format!("upstream {upstream} is not a usable git repository: {e}"))?;
        Ok((UpstreamKind::Repository, shown))
    } else {
        Ok((UpstreamKind::Directory, shown))
    }
}

/// Creates the mirror of `project` from `upstream`. The caller holds the project's lock.
pub fn add(layout: &Layout, project: &str, upstream: &str) -> Result<MirrorInfo, String> {
    if load(layout, project)?.is_some() || layout.mirror(project).exists() {
        return Err(format!("project {project:?} already exists"));
    }
    let (kind, upstream) = classify(upstream)?;
    std::fs::create_dir_all(layout.mirrors())
        .map_err(|e| format!("cannot create mirrors dir: {e}"))?;
    std::fs::create_dir_all(layout.projects())
        .map_err(|e| format!("cannot create projects dir: {e}"))?;
    let staging = layout
        .mirrors()
        .join(format!(".staging-{project}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let built = build_mirror(&staging, kind, &upstream);
    let default_branch = match built {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    let dest = layout.mirror(project);
    if let Err(e) = std::fs::rename(&staging, &dest) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!("cannot publish mirror {}: {e}", dest.display()));
    }
    let p = Project {
        project: project.to_string(),
        upstream,
        kind,
        default_branch,
        last_sync: now(),
    };
    if let Err(e) = save(layout, &p) {
        let _ = std::fs::remove_dir_all(&dest);
        return Err(e);
    }
    Ok(info(layout, p))
}

fn build_mirror(staging: &Path, kind: UpstreamKind, upstream: &str) -> Result<String, String> {
    let s = staging.as_os_str();
    match kind {
        UpstreamKind::Url | UpstreamKind::Repository => {
            git::git(
                None,
                &[
                    OsStr::new("clone"),
                    OsStr::new("--quiet"),
                    OsStr::new(upstream),
                    s,
                ],
            )
            .map_err(|e| format!("cannot clone {upstream}: {e}"))?;
        }
        UpstreamKind::Directory => {
            git::git(
                None,
                &[
                    OsStr::new("init"),
                    OsStr::new("--quiet"),
                    OsStr::new("--initial-branch=main"),
                    s,
                ],
            )
            .map_err(|e| format!("cannot create mirror: {e}"))?;
            commit_directory(staging, Path::new(upstream))?;
        }
    }
    // The mirror keeps every commit a workspace may be based on: never prune unreachable objects.
    git!(Some(staging); "config", "gc.auto", "0")
        .map_err(|e| format!("cannot configure mirror: {e}"))?;
    git!(Some(staging); "config", "core.logAllRefUpdates", "always")
        .map_err(|e| format!("cannot configure mirror: {e}"))?;
    let branch =
        git!(Some(staging); "symbolic-ref", "--short", "HEAD").unwrap_or_else(|_| "main".into());
    Ok(branch)
}

/// Commits `folder` onto the mirror's current branch if its content differs from HEAD, then brings the
/// mirror's index and working tree to the new commit. Returns whether a commit was made.
fn commit_directory(mirror: &Path, folder: &Path) -> Result<bool, String> {
    let git_dir = mirror.join(".git");
    let scratch = git_dir.join(format!("octofs-scratch-index-{}", std::process::id()));
    let _ = std::fs::remove_file(&scratch);
    let env: [(&str, &OsStr); 6] = [
        ("GIT_INDEX_FILE", scratch.as_os_str()),
        ("GIT_AUTHOR_NAME", OsStr::new("octofs")),
        ("GIT_AUTHOR_EMAIL", OsStr::new("octofs@localhost")),
        ("GIT_COMMITTER_NAME", OsStr::new("octofs")),
        ("GIT_COMMITTER_EMAIL", OsStr::new("octofs@localhost")),
        ("GIT_CONFIG_NOSYSTEM", OsStr::new("1")),
    ];
    let gd = [
        OsStr::new("--git-dir"),
        git_dir.as_os_str(),
        OsStr::new("--work-tree"),
        folder.as_os_str(),
    ];
    let run = |args: &[&str]| {
        let mut all: Vec<&OsStr> = gd.to_vec();
        all.extend(args.iter().map(OsStr::new));
        git::git_env(None, &all, &env)
    };
    let result = (|| {
        run(&["add", "-A", "."]).map_err(|e| format!("cannot read {}: {e}", folder.display()))?;
        let tree = run(&["write-tree"])?;
        let head = run(&["rev-parse", "--verify", "--quiet", "HEAD^{commit}"]).ok();
        if let Some(h) = &head {
            let head_tree = run(&["rev-parse", &format!("{h}^{{tree}}")])?;
            if head_tree == tree {
                return Ok(false);
            }
        }
        let mut args = vec![
            "commit-tree",
            tree.as_str(),
            "-m",
            "octofs: sync from directory",
        ];
        if let Some(h) = &head {
            args.extend(["-p", h.as_str()]);
        }
        let commit = run(&args)?;
        let branch = git!(Some(mirror); "symbolic-ref", "HEAD")?;
        git!(Some(mirror); "update-ref", "-m", "octofs: sync from directory", &branch, &commit)?;
        git!(Some(mirror); "reset", "--quiet", "--hard", &commit)?;
        Ok(true)
    })();
    let _ = std::fs::remove_file(&scratch);
    result
}

/// Syncs a mirror unless it was synced within `freshness` seconds. A failed fetch keeps the stale
/// mirror and reports a warning; it is not an error. The caller holds the project's lock.
pub fn sync(layout: &Layout, project: &str, freshness: u64) -> Result<SyncOutcome, String> {
    let mut p = require(layout, project)?;
    let mirror = layout.mirror(project);
    let head_before = head(&mirror);
    // A mirror deleted or broken under the daemon is built again, whatever the freshness window.
    // (`.git` first: git would otherwise look for a repository in the directories above.)
    let usable = mirror.join(".git").is_dir()
        && (git!(Some(&mirror); "rev-parse", "--verify", "--quiet", "HEAD^{commit}").is_ok()
            || has_no_commits(&mirror));
    if !usable {
        recreate(layout, &mut p)?;
        p.last_sync = now();
        save(layout, &p)?;
        return Ok(SyncOutcome {
            project: project.into(),
            head: head(&mirror),
            changed: true,
            fresh: false,
            warning: None,
            recreated: true,
        });
    }
    if freshness > 0 && now().saturating_sub(p.last_sync) < freshness {
        return Ok(SyncOutcome {
            project: project.into(),
            head: head_before,
            changed: false,
            fresh: true,
            warning: None,
            recreated: false,
        });
    }
    let mut warning = None;
    match p.kind {
        UpstreamKind::Directory => {
            if !Path::new(&p.upstream).is_dir() {
                warning = Some(format!(
                    "upstream {} is not reachable (not a directory); keeping the mirror as last synced",
                    p.upstream
                ));
            } else {
                commit_directory(&mirror, Path::new(&p.upstream))?;
            }
        }
        UpstreamKind::Url | UpstreamKind::Repository => {
            match git!(Some(&mirror); "fetch", "--quiet", "--prune", "--tags", "origin") {
                Err(e) => {
                    warning = Some(format!(
                        "cannot fetch {}: {e}; keeping the mirror as last synced",
                        p.upstream
                    ))
                }
                Ok(_) => {
                    let remote = format!("refs/remotes/origin/{}", p.default_branch);
                    if let Ok(tip) =
                        git!(Some(&mirror); "rev-parse", "--verify", "--quiet", &remote)
                        && head_before.as_deref() != Some(tip.as_str())
                    {
                        git!(Some(&mirror); "reset", "--quiet", "--hard", &tip)
                            .map_err(|e| format!("cannot move mirror {project} forward: {e}"))?;
                    }
                }
            }
        }
    }
    if warning.is_none() {
        p.last_sync = now();
        save(layout, &p)?;
    }
    let head_after = head(&mirror);
    Ok(SyncOutcome {
        project: project.into(),
        changed: head_after != head_before,
        head: head_after,
        fresh: false,
        warning,
        recreated: false,
    })
}

/// A usable mirror whose branch has no commit yet (its HEAD is unborn): nothing to re-create.
fn has_no_commits(mirror: &Path) -> bool {
    git!(Some(mirror); "rev-parse", "--git-dir").is_ok()
        && git!(Some(mirror); "rev-parse", "--verify", "--quiet", "HEAD").is_err()
        && git!(Some(mirror); "symbolic-ref", "--quiet", "HEAD").is_ok()
        && git!(Some(mirror); "for-each-ref", "--count=1").is_ok_and(|o| o.is_empty())
}

/// Builds the mirror of `p` again from its upstream, the way `add` does (staging, then a rename), after
/// it was deleted or broken under the daemon. A broken leftover is moved aside to
/// `mirrors/.broken-<project>-<time>` and kept (it may still hold snapshot objects worth recovering by
/// hand); snapshots that only the old mirror held are not in the new one.
fn recreate(layout: &Layout, p: &mut Project) -> Result<(), String> {
    let project = p.project.clone();
    let dest = layout.mirror(&project);
    tracing::warn!(%project, "the mirror is missing or broken; cloning it again from its upstream");
    std::fs::create_dir_all(layout.mirrors())
        .map_err(|e| format!("cannot create mirrors dir: {e}"))?;
    let staging = layout
        .mirrors()
        .join(format!(".staging-{project}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let branch = match build_mirror(&staging, p.kind, &p.upstream) {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(format!("cannot re-create the mirror of {project}: {e}"));
        }
    };
    let aside = layout
        .mirrors()
        .join(format!(".broken-{project}-{}", now()));
    let moved = std::fs::symlink_metadata(&dest).is_ok();
    if moved && let Err(e) = std::fs::rename(&dest, &aside) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "cannot move the broken mirror {} aside: {e}",
            dest.display()
        ));
    }
    if let Err(e) = std::fs::rename(&staging, &dest) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!("cannot publish mirror {}: {e}", dest.display()));
    }
    if moved {
        tracing::warn!(%project, kept = %aside.display(), "the broken mirror is kept aside");
    }
    p.default_branch = branch;
    Ok(())
}

fn head(mirror: &Path) -> Option<String> {
    git!(Some(mirror); "rev-parse", "--verify", "--quiet", "HEAD").ok()
}

fn info(layout: &Layout, project: Project) -> MirrorInfo {
    let path = layout.mirror(&project.project);
    MirrorInfo {
        head: head(&path),
        path,
        project,
    }
}

/// Every project, sorted by name.
pub fn list(layout: &Layout) -> Result<Vec<MirrorInfo>, String> {
    // Names starting with '.' are octofs's own (the blank repository of chat workspaces).
    let projects: Vec<Project> = store(layout).list(|project| !project.starts_with('.'))?;
    let mut out: Vec<MirrorInfo> = projects.into_iter().map(|p| info(layout, p)).collect();
    out.sort_by(|a, b| a.project.project.cmp(&b.project.project));
    Ok(out)
}
