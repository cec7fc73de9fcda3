//! `octofs commit`: the workspace's working state (every change, or only the listed paths)
//! committed on its current branch as the agent's git would — a new commit with HEAD as parent,
//! the branch (or a detached HEAD) moved, the index rewritten to the new tree — after the gates.
//!
//! The tree comes from snapshot assembly ([`Daemon::assemble`]: the workspace's ignore rules, in
//! process, never running anything the workspace configures); objects go to the project's mirror,
//! which the workspace reads through its alternates. Writes in the workspace only `.git/index`
//! and the branch ref (or `.git/HEAD` when detached), quietly, telling the kernel; a refusal
//! changes nothing.

use super::error::{Error, on_workspace};
use super::proto::{Commit, CommitMode, Committed};
use super::refusal::{ChatOp, CommitRefusal, GateRefusal};
use super::snapshot::{Goal, read_head};
use super::{Daemon, Reply};
use crate::access::Caller;
use crate::fs::WorkspaceFs;
use crate::git::gates::{self, Gate, Item};
use crate::git::mirror::{Change, changes};
use crate::git::snapshot::{self as snap, HeadRef, ViewEdit, ViewSource};
use crate::own_repo::{add_all, carry};

/// Whether `path` is `p` or below it.
fn selected(path: &[u8], p: &[u8]) -> bool {
    let p = p.strip_suffix(b"/").unwrap_or(p);
    p.is_empty() || path == p || (path.starts_with(p) && path.get(p.len()) == Some(&b'/'))
}

/// The gates of a request: every name known, and a `cmd=` gate only from an administrator (the
/// daemon runs that program as itself: an ordinary caller naming one would run anything with
/// the daemon's rights).
pub(super) fn parse_gates(d: &Daemon, specs: &[String], c: &Caller) -> Result<Vec<Gate>, Error> {
    let gates = specs
        .iter()
        .map(|g| gates::parse(g))
        .collect::<Result<Vec<Gate>, _>>()
        .map_err(GateRefusal::from)?;
    if gates.iter().any(|g| matches!(g, Gate::Cmd(_))) {
        d.require_admin(c, "run a cmd= gate (the daemon runs the program as itself)")?;
    }
    Ok(gates)
}

/// Runs `excludes` (the workspace's ignore rules) and `gates` over every path `changes` adds or
/// changes; one error naming each refused path and why.
pub(super) fn check_gates(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    changes: &[Change],
    gates: &[Gate],
    project_excludes: &[String],
    what: &'static str,
) -> Result<(), Error> {
    let mut items: Vec<Item> = Vec::new();
    for ch in changes.iter().filter(|ch| ch.mode != 0) {
        let size = if ch.mode == 0o160000 {
            0
        } else {
            repo.find_header(ch.id)
                .map_err(|e| Error::Op {
                    what: format!(
                        "cannot read the object of {}",
                        String::from_utf8_lossy(&ch.path)
                    ),
                    source: Box::new(e),
                })?
                .size()
        };
        let item = Item {
            path: ch.path.clone(),
            size,
        };
        if !items.contains(&item) {
            items.push(item);
        }
    }
    let item_paths: Vec<&[u8]> = items.iter().map(|i| i.path.as_slice()).collect();
    let ignored = add_all::ignored(core, &item_paths)?;
    let mut verdict = ignored.into_iter();
    let mut refusals = gates::run(&items, gates, |_| verdict.next().unwrap_or(false));
    if !project_excludes.is_empty() {
        let known: Vec<String> = refusals.iter().map(|r| r.path.clone()).collect();
        refusals.extend(
            gates::ProjectExcludes::new(project_excludes)
                .refusals(&items)
                .into_iter()
                .filter(|r| !known.contains(&r.path)),
        );
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(GateRefusal::Refused { what, refusals }.into())
    }
}

/// Carries the stat data of the workspace's current index over to `index` (built from the new
/// tree, without any) for every entry whose object and mode did not change, so that `git status`
/// after the commit re-reads only what the commit changed, not every file. An entry git would
/// consider racily clean (modified in or after the second the old index was written) keeps no
/// stat, so its content is compared. Without a readable old index nothing is carried (slower, not
/// wrong).
pub(super) fn keep_stat(core: &WorkspaceFs, state: &std::path::Path, index: &mut gix::index::File) {
    let old_written = core.attr_at(&[b".git", b"index"]).map(|attr| {
        attr.map_or(0, |a| {
            a.mtime
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        })
    });
    let (Ok(old), Ok(written)) = (add_all::read_index(core, state), old_written) else {
        return;
    };
    for (e, path) in index.entries_mut_with_paths() {
        if let Some(o) = old.entry_by_path(path)
            && o.id == e.id
            && o.mode == e.mode
            && u64::from(o.stat.mtime.secs) < written
        {
            e.stat = o.stat;
        }
    }
}

/// Replaces the workspace's `.git/index` the way git does: the new index complete in
/// `.git/index.lock`, renamed over `.git/index` (the index a workspace starts with is a shared
/// host-wide file, which cannot be rewritten in place). A present `index.lock` means git is at
/// work in the workspace: refused, as git refuses.
pub(super) fn write_index(core: &WorkspaceFs, bytes: &[u8]) -> Result<(), Error> {
    if core
        .kind_at(&[b".git", b"index.lock"])
        .map_err(on_workspace("cannot read .git"))?
        .is_some()
    {
        return Err(CommitRefusal::IndexLocked.into());
    }
    core.put_file_quietly(&[".git"], "index.lock", bytes)
        .map_err(on_workspace("cannot write .git/index.lock"))?;
    core.rename_quietly(&[b".git"], "index.lock", "index")
        .map_err(on_workspace("cannot move .git/index.lock to .git/index"))?;
    Ok(())
}

/// The commit a fixup fixes: `spec` resolved in the mirror (the agent's commits are carried there
/// before), which must be HEAD or one of its ancestors — a fixup of anything else could never
/// be squashed into it.
fn resolve_anchor(
    repo: &gix::Repository,
    spec: &str,
    head: gix::ObjectId,
) -> Result<gix::ObjectId, Error> {
    let unknown = || -> Error {
        CommitRefusal::NoSuchAnchor {
            spec: spec.to_string(),
        }
        .into()
    };
    let anchor = if spec == "HEAD" {
        head
    } else {
        repo.rev_parse_single(spec)
            .map_err(|_| unknown())?
            .object()
            .map_err(|_| unknown())?
            .peel_to_commit()
            .map_err(|_| unknown())?
            .id
    };
    let reaches = anchor == head
        || repo
            .rev_walk([head])
            .all()
            .map_err(|e| Error::Op {
                what: "cannot walk HEAD's history".into(),
                source: Box::new(e),
            })?
            .filter_map(Result::ok)
            .any(|info| info.id == anchor);
    if !reaches {
        return Err(CommitRefusal::AnchorNotAncestor {
            spec: spec.to_string(),
            anchor,
        }
        .into());
    }
    Ok(anchor)
}

/// The workspace's `.git/config` (the agent controls it), read through the core (no symlink
/// followed; [`crate::repo::workspace_config_bytes`]) and parsed in process without includes:
/// callers take single values from it and nothing of it runs. `None` when there is none, or it is
/// larger than [`crate::repo::CONFIG_MAX`] or not a config.
pub(super) fn workspace_config(core: &WorkspaceFs) -> Result<Option<gix::config::File>, Error> {
    let Some(bytes) = crate::repo::workspace_config_bytes(core)
        .map_err(on_workspace("cannot read .git/config"))?
    else {
        return Ok(None);
    };
    Ok(gix::config::File::from_bytes_no_includes(
        &bytes,
        gix::config::file::Metadata::api(),
        Default::default(),
    )
    .ok())
}

/// The workspace's own author identity: `user.name` and `user.email` of its `.git/config`. `None`
/// when either is missing or the file cannot be read: the commit is then octofs's.
fn identity(core: &WorkspaceFs) -> Option<snap::Identity> {
    let config = workspace_config(core).ok()??;
    let get = |key: &str| {
        config
            .string(key)
            .map(|v| v.to_string())
            .filter(|v| !v.trim().is_empty() && !v.contains(['<', '>', '\n']))
    };
    Some(snap::Identity {
        name: get("user.name")?,
        email: get("user.email")?,
    })
}

/// Moves what HEAD names to `to`, quietly (the caller tells the kernel): the branch's ref file under
/// `.git/refs/heads`, or `.git/HEAD` itself when detached.
pub(super) fn move_head(
    core: &WorkspaceFs,
    head: &HeadRef,
    to: gix::ObjectId,
) -> Result<(), Error> {
    let line = format!("{to}\n");
    match head {
        HeadRef::Branch(b) => {
            let mut dirs: Vec<&str> = vec![".git", "refs", "heads"];
            let comps: Vec<&str> = b.split('/').collect();
            let (name, parents) = comps.split_last().ok_or(CommitRefusal::EmptyBranch)?;
            dirs.extend(parents);
            core.put_file_quietly(&dirs, name, line.as_bytes())
                .map_err(on_workspace("cannot move the branch"))?;
        }
        HeadRef::Detached => {
            core.put_file_quietly(&[".git"], "HEAD", line.as_bytes())
                .map_err(on_workspace("cannot move HEAD"))?;
        }
    }
    Ok(())
}

impl Daemon {
    /// `octofs commit`: returns the new commit.
    pub(super) fn commit(&self, req: &Commit, c: &Caller) -> Reply<Committed> {
        let Commit {
            thread,
            message,
            paths,
            gates: gate_specs,
            mode,
            anchor,
        } = req;
        let (thread, message, mode) = (thread.as_str(), message.as_str(), *mode);
        let thread_lock = self.thread_lock(thread)?;
        // Every gate is known before anything runs.
        let gates = parse_gates(self, gate_specs, c)?;
        if message.trim().is_empty() && mode == CommitMode::Commit {
            return Err(CommitRefusal::NoMessage.into());
        }
        match (mode, anchor) {
            (CommitMode::Fixup, None) => {
                return Err(CommitRefusal::FixupNeedsAnchor.into());
            }
            (CommitMode::Commit | CommitMode::Amend, Some(_)) => {
                return Err(CommitRefusal::AnchorOnlyForFixup.into());
            }
            _ => {}
        }
        let (rec, _held) = thread_lock.live(c, ChatOp::Commit)?;
        let core = self.core_of(&rec)?;
        let excludes = crate::git::mirror::require(&self.layout, &rec.project)?.excludes;
        let (head, head_ref) = read_head(&core)?;
        let working = self.assemble(&mut rec.clone(), Goal::Tree)?;
        let mirror = self.layout.mirror(&rec.project);
        let mut repo = snap::open(&mirror)?;
        if !repo.has_object(head) {
            let n = carry::carry(&core, &self.layout.state, &repo, thread, head)?;
            tracing::info!(%thread, %head, objects = n, "carried the agent's commits");
            repo = snap::open(&mirror)?;
        }
        let (head_tree, head_parents, head_message, _) = snap::commit_info(&repo, head)?;
        // What the new commit says and where it goes.
        let (message, parents) = match mode {
            CommitMode::Commit => (message.to_string(), vec![head]),
            CommitMode::Fixup => {
                let spec = anchor.as_deref().unwrap_or_default();
                let anchor = resolve_anchor(&repo, spec, head)?;
                let (_, _, anchor_message, _) = snap::commit_info(&repo, anchor)?;
                let subject = String::from_utf8_lossy(&anchor_message)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let body = message.trim();
                let message = if body.is_empty() {
                    format!("fixup! {subject}\n")
                } else {
                    format!("fixup! {subject}\n\n{body}\n")
                };
                (message, vec![head])
            }
            CommitMode::Amend => {
                let message = if message.trim().is_empty() {
                    String::from_utf8_lossy(&head_message).into_owned()
                } else {
                    message.to_string()
                };
                (message, head_parents.clone())
            }
        };
        let raw = crate::git::Git::new(Some(&mirror))
            .args(["diff-tree", "-r", "-z", "--raw", "--no-renames"])
            .arg(head_tree.to_string())
            .arg(working.to_string())
            .output_bytes()?;
        let mut changes = changes(&raw)?;
        if !paths.is_empty() {
            changes.retain(|ch| paths.iter().any(|p| selected(&ch.path, p.as_bytes())));
        }
        // An amend may only change the message (as `git commit --amend -m` does).
        let reworded = mode == CommitMode::Amend && message.as_bytes() != head_message.as_slice();
        if changes.is_empty() && !reworded {
            return Err(CommitRefusal::Nothing {
                paths: paths.clone(),
            }
            .into());
        }
        // A dependency layer's path is ignored content even if HEAD tracks it: never committed.
        let in_layer: Vec<gates::Refusal> = changes
            .iter()
            .filter(|ch| {
                ch.mode != 0
                    && crate::git::graft::under_layer(
                        &ch.path,
                        rec.layers.iter().map(|l| l.path.as_str()),
                    )
            })
            .map(|ch| gates::Refusal {
                path: String::from_utf8_lossy(&ch.path).into_owned(),
                why: "it is in a dependency layer (excludes)".into(),
            })
            .collect();
        if !in_layer.is_empty() {
            return Err(GateRefusal::Refused {
                what: "commit",
                refusals: in_layer,
            }
            .into());
        }
        // The gates see every path the commit adds or changes; an amended commit's paths are
        // those it changes from its own parent (HEAD's, which travel again under the new id).
        if mode == CommitMode::Amend {
            let mut gated = changes.clone();
            let parent_tree = match head_parents.first() {
                Some(p) => snap::commit_info(&repo, *p)?.0,
                None => gix::ObjectId::empty_tree(gix::hash::Kind::Sha1),
            };
            let raw = crate::git::Git::new(Some(&mirror))
                .args(["diff-tree", "-r", "-z", "--raw", "--no-renames"])
                .arg(parent_tree.to_string())
                .arg(head_tree.to_string())
                .output_bytes()?;
            gated.extend(crate::git::mirror::changes(&raw)?);
            check_gates(&core, &repo, &gated, &gates, &excludes, "commit")?;
        } else {
            check_gates(&core, &repo, &changes, &gates, &excludes, "commit")?;
        }
        let tree = if paths.is_empty() {
            working
        } else {
            let edits: Vec<ViewEdit> = changes
                .iter()
                .map(|ch| match ch.mode {
                    0 => ViewEdit::Remove {
                        path: ch.path.clone(),
                    },
                    0o160000 => ViewEdit::Gitlink {
                        path: ch.path.clone(),
                        id: ch.id,
                    },
                    0o120000 => ViewEdit::Symlink {
                        path: ch.path.clone(),
                        source: ViewSource::Object(ch.id),
                        added: false,
                    },
                    m => ViewEdit::File {
                        path: ch.path.clone(),
                        exec: m & 0o111 != 0,
                        source: ViewSource::Object(ch.id),
                        added: false,
                    },
                })
                .collect();
            // Objects already in the mirror: no file is read, nothing to remember.
            snap::build_tree(&repo, head_tree, &edits, None, &self.snapshot_caches)?
        };
        let who = identity(&core);
        let commit = snap::write_commit_as(&repo, tree, parents, &message, who.as_ref())?;
        // The index first (a crash leaves the old HEAD with an index of the new tree: `git status`
        // shows the commit's changes staged, nothing lost), then the branch.
        let mut index = repo.index_from_tree(&tree).map_err(|e| Error::Op {
            what: "cannot build the index of the new commit".into(),
            source: Box::new(e),
        })?;
        keep_stat(&core, &self.layout.state, &mut index);
        let bytes = crate::git::checksum::index_file(&index, Default::default()).map_err(|e| {
            Error::Op {
                what: "cannot write the index of the new commit".into(),
                source: Box::new(e),
            }
        })?;
        write_index(&core, &bytes)?;
        move_head(&core, &head_ref, commit)?;
        self.tell_kernel(thread);
        tracing::info!(%thread, %commit, ?mode, paths = changes.len(), "commit");
        Ok((
            Committed {
                commit: commit.to_string(),
            },
            vec![],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_selection_is_by_component() {
        assert!(selected(b"src/a.rs", b"src"));
        assert!(selected(b"src/a.rs", b"src/"));
        assert!(selected(b"src", b"src"));
        assert!(!selected(b"srcx/a.rs", b"src"));
        assert!(!selected(b"a.rs", b"src"));
    }
}
