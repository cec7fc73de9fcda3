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
use super::proto::Committed;
use super::snapshot::{Goal, read_head};
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::fs::{ROOT_INO, WorkspaceFs};
use crate::git::gates::{self, Gate, Item};
use crate::git::mirror::{Change, changes};
use crate::git::snapshot::{self as snap, HeadRef, ViewEdit, ViewSource};
use crate::names::{NameKind, validate};
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
        .map_err(|e| Error::Refused(e.to_string()))?;
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
    what: &str,
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
    let refusals = gates::run(&items, gates, |_| verdict.next().unwrap_or(false));
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(Error::Refused(gates::refused_message(what, &refusals)))
    }
}

/// Carries the stat data of the workspace's current index over to `index` (built from the new
/// tree, without any) for every entry whose object and mode did not change, so that `git status`
/// after the commit re-reads only what the commit changed, not every file. An entry git would
/// consider racily clean (modified in or after the second the old index was written) keeps no
/// stat, so its content is compared. Without a readable old index nothing is carried (slower, not
/// wrong).
fn keep_stat(core: &WorkspaceFs, state: &std::path::Path, index: &mut gix::index::File) {
    use std::ffi::OsStr;
    let old_written = core
        .lookup(ROOT_INO, OsStr::new(".git"))
        .and_then(|git| {
            core.forget(git.ino.0, 1);
            core.lookup(git.ino.0, OsStr::new("index"))
        })
        .map(|attr| {
            core.forget(attr.ino.0, 1);
            attr.mtime
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
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
fn write_index(core: &WorkspaceFs, bytes: &[u8]) -> Result<(), Error> {
    if core
        .kind_at(&[b".git", b"index.lock"])
        .map_err(on_workspace("cannot read .git"))?
        .is_some()
    {
        return Err(Error::Refused(
            ".git/index.lock exists: git is running in the workspace (or died there); try again"
                .into(),
        ));
    }
    core.put_file_quietly(&[".git"], "index.lock", bytes)
        .map_err(on_workspace("cannot write .git/index.lock"))?;
    core.rename_quietly(&[b".git"], "index.lock", "index")
        .map_err(on_workspace("cannot move .git/index.lock to .git/index"))?;
    Ok(())
}

impl Daemon {
    /// `octofs commit`: returns the new commit.
    pub(super) fn commit(
        &self,
        thread: &str,
        message: &str,
        paths: &[String],
        gate_specs: &[String],
        c: &Caller,
    ) -> Reply<Committed> {
        validate(NameKind::Thread, thread)?;
        // Every gate is known before anything runs.
        let gates = parse_gates(self, gate_specs, c)?;
        if message.trim().is_empty() {
            return Err(Error::Refused("a commit needs a message (-m)".into()));
        }
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        self.check_thread(c, thread)?;
        let rec = self.live_record(thread)?;
        if rec.chat {
            return Err(Error::Refused(format!(
                "thread {thread} is a chat workspace (no project): nothing to commit to"
            )));
        }
        let core = self.core_of(&rec)?;
        let (head, head_ref) = read_head(&core)?;
        let working = self.assemble(&mut rec.clone(), Goal::Tree)?;
        let mirror = self.layout.mirror(&rec.project);
        let mut repo = snap::open(&mirror)?;
        if !repo.has_object(head) {
            let n = carry::carry(&core, &self.layout.state, &repo, thread, head)?;
            tracing::info!(%thread, %head, objects = n, "carried the agent's commits");
            repo = snap::open(&mirror)?;
        }
        let (head_tree, _, _, _) = snap::commit_info(&repo, head)?;
        let raw = crate::git::Git::new(Some(&mirror))
            .args(["diff-tree", "-r", "-z", "--raw", "--no-renames"])
            .arg(head_tree.to_string())
            .arg(working.to_string())
            .output_bytes()?;
        let mut changes = changes(&raw)?;
        if !paths.is_empty() {
            changes.retain(|ch| paths.iter().any(|p| selected(&ch.path, p.as_bytes())));
        }
        if changes.is_empty() {
            let what = if paths.is_empty() {
                String::new()
            } else {
                format!(" under {}", paths.join(", "))
            };
            return Err(Error::Refused(format!(
                "nothing to commit{what}: the working state equals HEAD"
            )));
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
            return Err(Error::Refused(gates::refused_message("commit", &in_layer)));
        }
        // The gates see every path the commit adds or changes.
        check_gates(&core, &repo, &changes, &gates, "commit")?;
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
            snap::build_tree(&repo, head_tree, &edits, None)?
        };
        let commit = snap::write_commit(&repo, tree, vec![head], message)?;
        // The index first (a crash leaves the old HEAD with an index of the new tree: `git status`
        // shows the commit's changes staged, nothing lost), then the branch.
        let mut index = repo.index_from_tree(&tree).map_err(|e| Error::Op {
            what: "cannot build the index of the new commit".into(),
            source: Box::new(e),
        })?;
        keep_stat(&core, &self.layout.state, &mut index);
        let mut bytes = Vec::new();
        index
            .write_to(&mut bytes, Default::default())
            .map_err(|e| Error::Op {
                what: "cannot write the index of the new commit".into(),
                source: Box::new(e),
            })?;
        write_index(&core, &bytes)?;
        let line = format!("{commit}\n");
        match &head_ref {
            HeadRef::Branch(b) => {
                let mut dirs: Vec<&str> = vec![".git", "refs", "heads"];
                let comps: Vec<&str> = b.split('/').collect();
                let (name, parents) = comps
                    .split_last()
                    .ok_or_else(|| Error::Refused("empty branch name".into()))?;
                dirs.extend(parents);
                core.put_file_quietly(&dirs, name, line.as_bytes())
                    .map_err(on_workspace("cannot move the branch"))?;
            }
            HeadRef::Detached => {
                core.put_file_quietly(&[".git"], "HEAD", line.as_bytes())
                    .map_err(on_workspace("cannot move HEAD"))?;
            }
        }
        self.tell_kernel(thread);
        tracing::info!(%thread, %commit, paths = changes.len(), "commit");
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
