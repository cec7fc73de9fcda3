//! Mirrors: one pristine git working checkout per project, on its default branch (seed 000 "Mirrors").
//!
//! A mirror is created by `add` and moved forward only by `sync`; both run under the caller's
//! per-project lock (the daemon holds it) and both publish atomically: a new mirror is built in a
//! staging directory and renamed into place, so a mirror directory that exists is complete. Upstreams
//! come in three kinds — a git URL, a git repository path, a plain directory. A directory upstream is
//! committed through a scratch index with the folder as work tree, so no `.git` is ever created in it.
//!
//! Upstreams are checked before git sees them: an absolute path or a URL of an allowed transport
//! (`file`, `git`, `http(s)`, `ssh`), never an option (`-…`) nor a remote helper (`fd::`, `ext::`).
//! Every git command puts `--` (or `--end-of-options`) before its positional arguments. Clone and
//! fetch run with `GIT_ALLOW_PROTOCOL` and a stall timeout: no progress for [`set_fetch_timeout`]
//! seconds and the git process group is killed, leaving the mirror as it was.
//!
//! Credentials (`user:token@` in an http(s) URL, or a credential file) never reach the project
//! record, the mirror's `.git/config` or a workspace: they live in `<state>/credentials/<project>`
//! (0600) and are handed to clone/fetch only through the git child's environment
//! (`http.<origin>.extraHeader`), never on a command line. Every URL that can be printed is redacted
//! ([`redact`]). A record of an older octofs that still holds credentials is migrated when loaded.

use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Who may bind the project (open a thread of it).
    #[serde(default, skip_serializing_if = "Access::is_open")]
    pub access: Access,
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

/// Loads a project's description; `Ok(None)` when the project does not exist. A record that still
/// holds credentials in its upstream URL (written by an older octofs) is migrated first.
pub fn load(layout: &Layout, project: &str) -> Result<Option<Project>, String> {
    let Some(mut p) = store(layout).load::<Project>(project)? else {
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

/// Moves the credentials of `p`'s upstream URL into its credentials file, and the URL without them
/// into the mirror's config and the record (in that order: the secret is kept before it is removed
/// elsewhere). Idempotent, so concurrent loads of one record agree.
fn migrate_credentials(layout: &Layout, p: &mut Project, clean: String) -> Result<(), String> {
    let project = p.project.clone();
    let fail = |e: String| {
        format!("project {project}: cannot move its credentials out of its record: {e}")
    };
    if let Ok((_, Some(cred))) = split_credentials(&p.upstream) {
        save_credential(layout, &p.project, &cred).map_err(fail)?;
    }
    let mirror = layout.mirror(&p.project);
    if mirror.join(".git").is_dir() {
        git!(Some(&mirror); "config", "--", "remote.origin.url", &clean)
            .map_err(|e| fail(redact(&e)))?;
    }
    p.upstream = clean;
    save(layout, p).map_err(|e| fail(redact(&e)))?;
    tracing::info!(project = %p.project, "moved the upstream's credentials into <state>/credentials");
    Ok(())
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

/// Replaces who may bind `project`. The caller holds the project's lock.
pub fn set_access(layout: &Layout, project: &str, access: Access) -> Result<Project, String> {
    let mut p = require(layout, project)?;
    p.access = access;
    save(layout, &p)?;
    Ok(p)
}

/// Whether `upstream` is a URL (`scheme://…` or scp-like `user@host:path`) rather than a path.
pub fn is_url(upstream: &str) -> bool {
    upstream.contains("://")
        || (upstream.contains(':') && !upstream.starts_with('/') && upstream.contains('@'))
}

/// The transports a project may use: what `GIT_ALLOW_PROTOCOL` lets clone and fetch speak.
const ALLOWED_PROTOCOLS: &str = "file:git:http:https:ssh";
const ALLOWED_SCHEMES: [&str; 7] = ["file", "git", "http", "https", "ssh", "git+ssh", "ssh+git"];

/// Refuses, before anything is created, an upstream git could read as an option or hand to a remote
/// helper or a transport a project does not need. `shown` is the upstream as messages show it.
pub fn check_upstream(upstream: &str) -> Result<(), String> {
    let shown = redact(upstream);
    if upstream.is_empty() {
        return Err("upstream must not be empty".into());
    }
    if upstream.starts_with('-') {
        return Err(format!(
            "upstream {shown:?} must not start with '-' (git would read it as an option)"
        ));
    }
    if upstream.contains(['\0', '\n']) {
        return Err(format!("upstream {shown:?} contains a NUL or a newline"));
    }
    // `<transport>::<address>` makes git run `git-remote-<transport>` (`fd::`, `ext::` run
    // anything): never an upstream.
    if let Some((helper, _)) = upstream.split_once("::")
        && !helper.is_empty()
        && helper
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    {
        return Err(format!(
            "upstream {shown}: remote helpers ({helper}::) are not allowed; use a path or a file://, git://, http(s):// or ssh URL"
        ));
    }
    if let Some((scheme, _)) = upstream.split_once("://")
        && !ALLOWED_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str())
    {
        return Err(format!(
            "upstream {shown}: transport {scheme:?} is not allowed (allowed: file, git, http, https, ssh)"
        ));
    }
    if !is_url(upstream) && !Path::new(upstream).is_absolute() {
        return Err(format!(
            "upstream path {shown} is relative: give an absolute path (the octofs command resolves it against its working directory)"
        ));
    }
    Ok(())
}

/// Decides what kind of upstream `upstream` names, without creating anything.
pub fn classify(upstream: &str) -> Result<(UpstreamKind, String), String> {
    check_upstream(upstream)?;
    if is_url(upstream) {
        if let Some(path) = upstream.strip_prefix("file://")
            && !Path::new(path).exists()
        {
            return Err(format!("upstream {} does not exist", redact(upstream)));
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
        git!(Some(&path); "rev-parse", "--git-dir", "--end-of-options")
            .map_err(|e| format!("upstream {upstream} is not a usable git repository: {e}"))?;
        Ok((UpstreamKind::Repository, shown))
    } else {
        Ok((UpstreamKind::Directory, shown))
    }
}

/// Creates the mirror of `project` from `upstream`. `credential` (`user:token`, or a bare token) is
/// the content of the caller's credential file, for an http(s) upstream given without credentials in
/// its URL. The caller holds the project's lock.
pub fn add(
    layout: &Layout,
    project: &str,
    upstream: &str,
    credential: Option<&str>,
    access: Access,
) -> Result<MirrorInfo, String> {
    if load(layout, project)?.is_some() || layout.mirror(project).exists() {
        return Err(format!("project {project:?} already exists"));
    }
    check_upstream(upstream)?;
    let (upstream, url_credential) = split_credentials(upstream)?;
    let credential = match (url_credential, credential) {
        (None, None) => None,
        (Some(c), None) => Some(c),
        (None, Some(file)) => Some(credential_from_file(None, file)?),
        // `https://user@host/…` plus a file holding the token.
        (Some(c), Some(file)) => match c.strip_suffix(':') {
            Some(user) if !user.contains(':') => Some(credential_from_file(Some(user), file)?),
            _ => {
                return Err(format!(
                    "upstream {upstream} carries a password and a credential file was given: use one"
                ));
            }
        },
    };
    let (kind, upstream) = classify(&upstream)?;
    if credential.is_some() && !is_http(&upstream) {
        return Err(format!(
            "upstream {upstream}: credentials are only used with http(s) upstreams"
        ));
    }
    crate::layout::create_private_dir(&layout.mirrors())
        .map_err(|e| format!("cannot create mirrors dir: {e}"))?;
    crate::layout::create_private_dir(&layout.projects())
        .map_err(|e| format!("cannot create projects dir: {e}"))?;
    let staging = layout
        .mirrors()
        .join(format!(".staging-{project}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let built = build_mirror(&staging, kind, &upstream, credential.as_deref());
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
        access,
    };
    let saved = match &credential {
        Some(c) => save_credential(layout, project, c),
        None => Ok(()),
    }
    .and_then(|()| save(layout, &p));
    if let Err(e) = saved {
        let _ = std::fs::remove_dir_all(&dest);
        let _ = std::fs::remove_file(layout.credential(project));
        return Err(e);
    }
    Ok(info(layout, p))
}

fn build_mirror(
    staging: &Path,
    kind: UpstreamKind,
    upstream: &str,
    credential: Option<&str>,
) -> Result<String, String> {
    let s = staging.as_os_str();
    match kind {
        UpstreamKind::Url | UpstreamKind::Repository => {
            // No hard links into a local upstream: the mirror shares no inode with files another
            // user owns (and may change or chmod).
            network_git(
                None,
                &[
                    OsStr::new("clone"),
                    OsStr::new("--progress"),
                    OsStr::new("--no-hardlinks"),
                    OsStr::new("--"),
                    OsStr::new(upstream),
                    s,
                ],
                upstream,
                credential,
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
                    OsStr::new("--"),
                    s,
                ],
            )
            .map_err(|e| format!("cannot create mirror: {e}"))?;
            commit_directory(staging, Path::new(upstream))?;
        }
    }
    // The mirror keeps every commit a workspace may be based on: never prune unreachable objects.
    git!(Some(staging); "config", "--", "gc.auto", "0")
        .map_err(|e| format!("cannot configure mirror: {e}"))?;
    git!(Some(staging); "config", "--", "core.logAllRefUpdates", "always")
        .map_err(|e| format!("cannot configure mirror: {e}"))?;
    let branch = git!(Some(staging); "symbolic-ref", "--short", "--", "HEAD")
        .unwrap_or_else(|_| "main".into());
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
    let mut git_dir_arg = std::ffi::OsString::from("--git-dir=");
    git_dir_arg.push(git_dir.as_os_str());
    let mut work_tree_arg = std::ffi::OsString::from("--work-tree=");
    work_tree_arg.push(folder.as_os_str());
    let gd = [git_dir_arg.as_os_str(), work_tree_arg.as_os_str()];
    let run = |args: &[&str]| {
        let mut all: Vec<&OsStr> = gd.to_vec();
        all.extend(args.iter().map(OsStr::new));
        git::git_env(None, &all, &env)
    };
    let result = (|| {
        run(&["add", "-A", "--", "."])
            .map_err(|e| format!("cannot read {}: {e}", folder.display()))?;
        let tree = run(&["write-tree"])?;
        let head = run(&[
            "rev-parse",
            "--verify",
            "--quiet",
            "--end-of-options",
            "HEAD^{commit}",
        ])
        .ok();
        if let Some(h) = &head {
            let head_tree = run(&[
                "rev-parse",
                "--verify",
                "--end-of-options",
                &format!("{h}^{{tree}}"),
            ])?;
            if head_tree == tree {
                return Ok(false);
            }
        }
        let mut args = vec!["commit-tree", "-m", "octofs: sync from directory"];
        if let Some(h) = &head {
            args.extend(["-p", h.as_str()]);
        }
        args.extend(["--end-of-options", tree.as_str()]);
        let commit = run(&args)?;
        let branch = git!(Some(mirror); "symbolic-ref", "--", "HEAD")?;
        git!(Some(mirror); "update-ref", "-m", "octofs: sync from directory", "--", &branch, &commit)?;
        git!(Some(mirror); "reset", "--quiet", "--hard", "--end-of-options", &commit, "--")?;
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
            let credential = load_credential(layout, project)?;
            let fetched = network_git(
                Some(&mirror),
                &[
                    OsStr::new("fetch"),
                    OsStr::new("--progress"),
                    OsStr::new("--prune"),
                    OsStr::new("--tags"),
                    OsStr::new("--"),
                    OsStr::new("origin"),
                ],
                &p.upstream,
                credential.as_deref(),
            );
            match fetched {
                Err(e) => {
                    warning = Some(format!(
                        "cannot fetch {}: {e}; keeping the mirror as last synced",
                        redact(&p.upstream)
                    ))
                }
                Ok(()) => {
                    let remote = format!("refs/remotes/origin/{}", p.default_branch);
                    if let Ok(tip) = git!(Some(&mirror); "rev-parse", "--verify", "--quiet", "--end-of-options", &remote)
                        && head_before.as_deref() != Some(tip.as_str())
                    {
                        git!(Some(&mirror); "reset", "--quiet", "--hard", "--end-of-options", &tip, "--")
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
    let credential = load_credential(layout, &project)?;
    let branch = match build_mirror(&staging, p.kind, &p.upstream, credential.as_deref()) {
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
    git!(Some(mirror); "rev-parse", "--verify", "--quiet", "--end-of-options", "HEAD").ok()
}

fn info(layout: &Layout, mut project: Project) -> MirrorInfo {
    let path = layout.mirror(&project.project);
    project.upstream = redact(&project.upstream);
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

// ---------------------------------------------------------------------------------------------
// Credentials

fn is_http(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// `scheme://`, the userinfo (without its `@`) and the rest of a `scheme://userinfo@host/…` URL.
fn userinfo(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..end].rfind('@')?;
    Some((&url[..scheme.len() + 3], &rest[..at], &rest[at + 1..]))
}

/// `url` without its secret: over http(s) the whole userinfo (a user name there is often a token),
/// elsewhere a password (a bare ssh user name is needed to connect and is no secret).
fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some((scheme, info, rest)) if is_http(url) || info.contains(':') => {
            format!("{scheme}{rest}")
        }
        _ => url.to_string(),
    }
}

/// `text` with the secret of every URL in it removed (git's messages can echo URLs).
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The URL starts at its scheme: the run of scheme characters before `://`.
        let start = rest[..i]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || "+.-".contains(*c)))
            .map(|(j, c)| j + c.len_utf8())
            .unwrap_or(0);
        let end = rest[i + 3..]
            .find(|c: char| c.is_whitespace() || "'\"<>`".contains(c))
            .map(|j| i + 3 + j)
            .unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits an upstream into the URL to store and the credentials to keep apart (`user:password`,
/// decoded). A password in a non-http URL is refused: no transport of ours would use it.
fn split_credentials(upstream: &str) -> Result<(String, Option<String>), String> {
    let Some((_, info, _)) = userinfo(upstream) else {
        return Ok((upstream.to_string(), None));
    };
    let clean = redact_url(upstream);
    if !is_http(upstream) {
        if info.contains(':') {
            return Err(format!(
                "upstream {clean}: a password in the URL is only supported over http(s) (use an ssh key)"
            ));
        }
        return Ok((clean, None));
    }
    let (user, password) = info.split_once(':').unwrap_or((info, ""));
    Ok((
        clean,
        Some(format!(
            "{}:{}",
            percent_decode(user),
            percent_decode(password)
        )),
    ))
}

/// The user a bare token from a credential file is sent as, when the URL names none: what GitHub
/// expects, and any name does for GitLab and most servers.
const TOKEN_USER: &str = "x-access-token";

/// The credentials of a credential file: `user:token`, or a bare token sent as `user` (the URL's),
/// else as [`TOKEN_USER`].
fn credential_from_file(user: Option<&str>, content: &str) -> Result<String, String> {
    let c = content.trim_end_matches(['\n', '\r']);
    if c.is_empty() {
        return Err("the credential file is empty".into());
    }
    if c.contains(['\n', '\r', '\0']) {
        return Err("the credential file must hold one line: a token or user:token".into());
    }
    if c.contains(':') {
        return Ok(c.to_string());
    }
    Ok(format!("{}:{c}", user.unwrap_or(TOKEN_USER)))
}

fn save_credential(layout: &Layout, project: &str, credential: &str) -> Result<(), String> {
    crate::layout::create_private_dir(&layout.credentials())
        .map_err(|e| format!("cannot create {}: {e}", layout.credentials().display()))?;
    crate::records::write_atomic(&layout.credential(project), credential.as_bytes())
        .map_err(|e| format!("cannot save the credentials of {project}: {e}"))
}

/// The stored credentials of `project`, if it has any.
fn load_credential(layout: &Layout, project: &str) -> Result<Option<String>, String> {
    match std::fs::read_to_string(layout.credential(project)) {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read the credentials of {project}: {e}")),
    }
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(T[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The environment that hands `credential` to git for requests to `url`'s origin only: an
/// `Authorization` header set through `GIT_CONFIG_*` (the environment of a root process is readable
/// by root only, unlike a command line).
fn credential_env(url: &str, credential: &str) -> Vec<(String, String)> {
    let origin = match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            format!("{}://{}/", scheme.to_ascii_lowercase(), &rest[..end])
        }
        None => return Vec::new(),
    };
    vec![
        ("GIT_CONFIG_COUNT".into(), "1".into()),
        (
            "GIT_CONFIG_KEY_0".into(),
            format!("http.{origin}.extraHeader"),
        ),
        (
            "GIT_CONFIG_VALUE_0".into(),
            format!("Authorization: Basic {}", base64(credential.as_bytes())),
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// Clone and fetch

static FETCH_TIMEOUT_SECS: AtomicU64 = AtomicU64::new(300);

/// Sets the stall timeout of clone and fetch: no progress for this many seconds ends them.
pub fn set_fetch_timeout(secs: u64) {
    FETCH_TIMEOUT_SECS.store(secs.max(1), Ordering::Relaxed);
}

/// What git said last on stderr, kept bounded.
const STDERR_KEEP: usize = 64 * 1024;

/// Runs a git command that talks to `upstream` (clone, fetch): only the allowed transports, the
/// credentials (if any) through the environment, progress on stderr watched, and the whole process
/// group killed after [`set_fetch_timeout`] seconds without any. Errors are one redacted line.
fn network_git(
    dir: Option<&Path>,
    args: &[&OsStr],
    upstream: &str,
    credential: Option<&str>,
) -> Result<(), String> {
    let secs = FETCH_TIMEOUT_SECS.load(Ordering::Relaxed).max(1);
    let stall = Duration::from_secs(secs);
    let mut cmd = Command::new("git");
    if let Some(d) = dir {
        cmd.arg("-C").arg(d);
    }
    cmd.args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_ASKPASS", "true")
        .env("SSH_ASKPASS", "true")
        .env("GIT_PAGER", "cat")
        .env("LC_ALL", "C")
        .env("GIT_ALLOW_PROTOCOL", ALLOWED_PROTOCOLS)
        // curl gives up on its own when less than a byte a second flows for the whole window.
        .env("GIT_HTTP_LOW_SPEED_LIMIT", "1")
        .env("GIT_HTTP_LOW_SPEED_TIME", secs.to_string())
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .env_remove("GIT_CONFIG_PARAMETERS")
        .env_remove("GIT_CONFIG_COUNT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group, so that a stall kills git and every helper it started.
        .process_group(0);
    if let Some(c) = credential {
        for (k, v) in credential_env(upstream, c) {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run git: {e} (is git installed?)"))?;
    let last_progress = Arc::new(Mutex::new(Instant::now()));
    let (tx, rx) = std::sync::mpsc::channel();
    if let Some(mut stderr) = child.stderr.take() {
        let last = last_progress.clone();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                kept.extend_from_slice(&chunk[..n]);
                if kept.len() > STDERR_KEEP {
                    kept.drain(..kept.len() - STDERR_KEEP);
                }
                *last.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
            }
            let _ = tx.send(kept);
        });
    }
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(e) => {
                let _ = crate::sys::kill_process_group(child.id());
                let _ = child.wait();
                return Err(format!("cannot wait for git: {e}"));
            }
        }
        let quiet = last_progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        if quiet >= stall {
            // Not reaped yet, so the group id is still ours.
            if let Err(e) = crate::sys::kill_process_group(child.id()) {
                tracing::warn!("cannot kill a stalled git: {e}");
            }
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stderr = rx.recv_timeout(Duration::from_secs(5)).unwrap_or_default();
    match status {
        None => Err(format!(
            "no progress from {} for {secs} s, gave up (octofs serve --fetch-timeout sets the limit)",
            redact(upstream)
        )),
        Some(s) if s.success() => Ok(()),
        Some(s) => {
            let text = String::from_utf8_lossy(&stderr);
            let lines: Vec<&str> = text
                .split(['\n', '\r'])
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let line = lines
                .iter()
                .rev()
                .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
                .or(lines.last())
                .map(|l| l.to_string())
                .unwrap_or_else(|| format!("git failed ({s})"));
            let mut line = redact(&line);
            if let Some(c) = credential
                && let Some((_, secret)) = c.split_once(':')
                && !secret.is_empty()
            {
                line = line.replace(secret, "***");
            }
            Err(line)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_urls_in_text() {
        assert_eq!(
            redact("fatal: unable to access 'https://alice:tok@example.com/a.git/': 403"),
            "fatal: unable to access 'https://example.com/a.git/': 403"
        );
        assert_eq!(
            redact("https://tok@h/x and ssh://git@h/y"),
            "https://h/x and ssh://git@h/y"
        );
        assert_eq!(redact("ssh://git:pw@h:22/y"), "ssh://h:22/y");
        assert_eq!(redact("/srv/repo"), "/srv/repo");
        assert_eq!(redact("http://h/a@b"), "http://h/a@b");
        // A scheme right after a character of more than one byte (the cut must fall between
        // characters).
        assert_eq!(redact("é://u:p@h/x"), "é://h/x");
        assert_eq!(redact("«https://u:p@h/x»"), "«https://h/x»");
    }

    #[test]
    fn splits_credentials() {
        assert_eq!(
            split_credentials("https://al%40ce:t%3Ak@h:8443/x.git").unwrap(),
            ("https://h:8443/x.git".into(), Some("al@ce:t:k".into()))
        );
        assert_eq!(
            split_credentials("https://TOKEN@h/x").unwrap(),
            ("https://h/x".into(), Some("TOKEN:".into()))
        );
        assert_eq!(
            split_credentials("ssh://git@h/x").unwrap(),
            ("ssh://git@h/x".into(), None)
        );
        assert!(split_credentials("ssh://git:pw@h/x").is_err());
        assert_eq!(
            credential_from_file(Some("oauth2"), "tok\n").unwrap(),
            "oauth2:tok"
        );
        assert_eq!(
            credential_from_file(None, "tok").unwrap(),
            "x-access-token:tok"
        );
        assert_eq!(credential_from_file(Some("u"), "v:tok").unwrap(), "v:tok");
    }

    #[test]
    fn base64_matches_the_rfc() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn refuses_options_helpers_and_other_transports() {
        for bad in [
            "-oProxyCommand=x",
            "--upload-pack=x",
            "fd::17",
            "ext::sh -c x",
            "ftp://h/x",
            "relative/path",
        ] {
            assert!(check_upstream(bad).is_err(), "{bad}");
        }
        for good in [
            "/abs",
            "https://h/x",
            "git@h:x.git",
            "file:///x",
            "ssh://h/x",
        ] {
            assert!(check_upstream(good).is_ok(), "{good}");
        }
    }
}
