//! Building a mirror (clone, or a directory committed through a scratch index with the folder as
//! work tree, so no `.git` is ever created in it), syncing it (fetch and move forward, or
//! re-commit the directory) and re-creating one that was deleted or broken under the daemon. Every
//! publication is a rename of a complete staging directory. Every git command puts `--` (or
//! `--end-of-options`) before its positional arguments.

use crate::git::error::{Context, Error};
use crate::git::refusal::Refusal;
use std::ffi::OsStr;
use std::path::Path;

use super::credentials::{
    credential_from_file, is_http, load_credential, redact, save_credential, split_credentials,
};
use super::network::network_git;
use super::upstream::{check_upstream, classify};
use super::{
    Access, MirrorInfo, Project, SyncOutcome, UpstreamKind, head, info, load, now, require, save,
};
use crate::git;
use crate::git::Git;
use crate::layout::Layout;

/// Creates the mirror of `project` from `upstream`. `credential` (`user:token`, or a bare token) is
/// the content of the caller's credential file, for an http(s) upstream given without credentials in
/// its URL. The caller holds the project's lock.
pub fn add(
    layout: &Layout,
    project: &str,
    upstream: &str,
    credential: Option<&str>,
    access: Access,
) -> Result<MirrorInfo, Error> {
    if load(layout, project)?.is_some() || layout.mirror(project).exists() {
        return Err(Error::ProjectExists(project.to_string()));
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
                return Err(Refusal::TwoCredentials { upstream }.into());
            }
        },
    };
    let (kind, upstream) = classify(&upstream)?;
    if credential.is_some() && !is_http(&upstream) {
        return Err(Refusal::CredentialNotHttp { upstream }.into());
    }
    crate::layout::create_private_dir(&layout.mirrors())
        .context(|| "cannot create mirrors dir".to_string())?;
    crate::layout::create_private_dir(&layout.projects())
        .context(|| "cannot create projects dir".to_string())?;
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
    // A cancel that came after the last git step still keeps nothing.
    if super::network::cancelled() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(Error::Cancelled);
    }
    let dest = layout.mirror(project);
    if let Err(e) = std::fs::rename(&staging, &dest) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(Refusal::Publish { dest, source: e }.into());
    }
    let p = Project {
        project: project.to_string(),
        upstream,
        kind,
        default_branch,
        last_sync: now(),
        access,
        share: None,
        excludes: Vec::new(),
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
) -> Result<String, Error> {
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
            .context(|| format!("cannot clone {upstream}"))?;
        }
        UpstreamKind::Directory => {
            Git::new(None)
                .args(["init", "--quiet", "--initial-branch=main", "--"])
                .arg(s)
                .output()
                .context(|| "cannot create mirror".to_string())?;
            commit_directory(staging, Path::new(upstream))?;
        }
    }
    // The mirror keeps every commit a workspace may be based on: never prune unreachable objects.
    git!(Some(staging); "config", "--", "gc.auto", "0")
        .context(|| "cannot configure mirror".to_string())?;
    git!(Some(staging); "config", "--", "core.logAllRefUpdates", "always")
        .context(|| "cannot configure mirror".to_string())?;
    let branch = git!(Some(staging); "symbolic-ref", "--short", "--", "HEAD")
        .unwrap_or_else(|_| "main".into());
    Ok(branch)
}

/// Commits `folder` onto the mirror's current branch if its content differs from HEAD, then brings the
/// mirror's index and working tree to the new commit. Returns whether a commit was made.
fn commit_directory(mirror: &Path, folder: &Path) -> Result<bool, Error> {
    let git_dir = mirror.join(".git");
    let scratch = git_dir.join(format!("octofs-scratch-index-{}", std::process::id()));
    let _ = std::fs::remove_file(&scratch);
    let mut git_dir_arg = std::ffi::OsString::from("--git-dir=");
    git_dir_arg.push(git_dir.as_os_str());
    let mut work_tree_arg = std::ffi::OsString::from("--work-tree=");
    work_tree_arg.push(folder.as_os_str());
    let gd = [git_dir_arg.as_os_str(), work_tree_arg.as_os_str()];
    let run = |args: &[&str]| {
        Git::new(None)
            .args(gd)
            .args(args)
            .env("GIT_INDEX_FILE", &scratch)
            .by_octofs()
            .output()
    };
    let result = (|| {
        run(&["add", "-A", "--", "."]).context(|| format!("cannot read {}", folder.display()))?;
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
pub fn sync(layout: &Layout, project: &str, freshness: u64) -> Result<SyncOutcome, Error> {
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
                            .context(|| format!("cannot move mirror {project} forward"))?;
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
fn recreate(layout: &Layout, p: &mut Project) -> Result<(), Error> {
    let project = p.project.clone();
    let dest = layout.mirror(&project);
    tracing::warn!(%project, "the mirror is missing or broken; cloning it again from its upstream");
    std::fs::create_dir_all(layout.mirrors())
        .context(|| "cannot create mirrors dir".to_string())?;
    let staging = layout
        .mirrors()
        .join(format!(".staging-{project}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let credential = load_credential(layout, &project)?;
    let branch = match build_mirror(&staging, p.kind, &p.upstream, credential.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(Refusal::Recreate {
                project,
                error: Box::new(e),
            }
            .into());
        }
    };
    let aside = layout
        .mirrors()
        .join(format!(".broken-{project}-{}", now()));
    let moved = std::fs::symlink_metadata(&dest).is_ok();
    if moved && let Err(e) = std::fs::rename(&dest, &aside) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(Refusal::MoveAside { dest, source: e }.into());
    }
    if let Err(e) = std::fs::rename(&staging, &dest) {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(Refusal::Publish { dest, source: e }.into());
    }
    if moved {
        tracing::warn!(%project, kept = %aside.display(), "the broken mirror is kept aside");
    }
    p.default_branch = branch;
    Ok(())
}
