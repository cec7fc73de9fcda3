//! `octofs pull`: a named snapshot of a remote (`refs/snapshots/<name>`) brought into a live
//! workspace as a fast-forward. The snapshot is fetched into the mirror
//! (`refs/octomate/pulled/<name>`; the mirror's own `refs/snapshots/<name>` follows when that is a
//! fast-forward), and applied only when nothing local would be lost: HEAD must be the snapshot's
//! base (its first parent), and the working state clean or equal to a snapshot this one descends
//! from. `--force` saves the working state as the thread's snapshot first, and says so.
//!
//! Exactly the differing paths are written and removed through the core (`WorkspaceFs::apply`),
//! ignored content is left alone (it is never part of a snapshot's tree), HEAD and the index do
//! not move (the pulled state reads as uncommitted), and the kernel is told what changed behind it.
//! Runs git only in the mirror, never in the workspace.

use super::error::{Context, Error};
use super::proto::Pulled;
use super::refusal::{ChatOp, PullRefusal};
use super::snapshot::{Goal, check_snapshot_name, named_ref, read_head};
use super::{Daemon, Reply};
use crate::access::Caller;
use crate::git::mirror;
use crate::git::snapshot as snap;

/// The most snapshots of a chain `pull` walks back to find one equal to the working state.
const CHAIN_MAX: usize = 10_000;

/// The most local changes a refusal names (the rest are counted).
const NAMED_MAX: usize = 20;

/// Where a pulled snapshot is kept in the mirror (overwritten by the next pull of that name).
fn pulled_ref(name: &str) -> String {
    format!("refs/octomate/pulled/{name}")
}

/// `git diff-tree -r -z --name-only a b`: the paths that differ.
fn differing(
    mirror: &std::path::Path,
    a: gix::ObjectId,
    b: gix::ObjectId,
) -> Result<Vec<Vec<u8>>, Error> {
    let out = crate::git::Git::new(Some(mirror))
        .args([
            "diff-tree",
            "-r",
            "-z",
            "--name-only",
            "--no-renames",
            "--end-of-options",
        ])
        .args([a.to_string(), b.to_string()])
        .output_bytes()
        .context(|| "git diff-tree".to_string())?;
    Ok(out
        .split(|c| *c == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

impl Daemon {
    /// `octofs pull <thread> --remote REMOTE --name N [--force]`.
    pub(super) fn pull(
        &self,
        thread: &str,
        remote: &str,
        name: &str,
        force: bool,
        c: &Caller,
    ) -> Reply<Pulled> {
        let thread_lock = self.thread_lock(thread)?;
        check_snapshot_name(name)?;
        let (rec, _held) = thread_lock.live(c, ChatOp::Pull)?;
        let project = rec.project.clone();
        let mirror_dir = self.layout.mirror(&project);
        let target = mirror::push_target(&self.layout, &project, Some(remote), self.far_side(c))?;
        let full = named_ref(name);
        let theirs = mirror::fetch_ref(&mirror_dir, &target, &full, &pulled_ref(name))?
            .ok_or_else(|| PullRefusal::NoSuchName {
                remote: remote.to_string(),
                name_ref: full.clone(),
            })?;
        let repo = snap::open(&mirror_dir)?;
        let (tree, parents, message, _) = snap::commit_info(&repo, theirs)?;
        let base = *parents.first().ok_or_else(|| PullRefusal::NoParent {
            name_ref: full.clone(),
            theirs,
        })?;
        let core = self.core_of(&rec)?;
        let (head, _) = read_head(&core)?;
        if head != base {
            return Err(PullRefusal::NotAtBase {
                head,
                name_ref: full,
                theirs,
                base,
            }
            .into());
        }
        let live = self.assemble(&mut rec.clone(), Goal::Tree)?;
        let (head_tree, _, _, _) = snap::commit_info(&repo, head)?;
        // Clean, or equal to a snapshot of the chain this one descends from (its second parents).
        let mut known = live == head_tree || live == tree;
        let mut cur = parents.get(1).copied();
        let mut walked = 0;
        while !known && walked < CHAIN_MAX {
            let Some(id) = cur else { break };
            let Ok((t, ps, _, _)) = snap::commit_info(&repo, id) else {
                break;
            };
            known = t == live;
            cur = ps.get(1).copied();
            walked += 1;
        }
        let mut saved_first = None;
        if !known {
            // The local changes the pull would lose: changed since HEAD, and not as the snapshot
            // has them.
            let local = differing(&mirror_dir, head_tree, live)?;
            let unlike = differing(&mirror_dir, live, tree)?;
            let lost: Vec<String> = local
                .iter()
                .filter(|p| unlike.contains(p))
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            if !force {
                let mut shown = lost
                    .iter()
                    .take(NAMED_MAX)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                if lost.len() > NAMED_MAX {
                    shown.push_str(&format!(" and {} more", lost.len() - NAMED_MAX));
                }
                return Err(PullRefusal::WouldLose {
                    name_ref: full,
                    thread: thread.to_string(),
                    changes: shown,
                }
                .into());
            }
            let s = self.snapshot_locked(thread)?;
            tracing::info!(%thread, snapshot = %s, "pull --force: the local changes saved first");
            saved_first = Some(s);
        }
        let started = std::time::Instant::now();
        let changed = if live == tree {
            Vec::new()
        } else {
            self.apply_diff(&core, &project, live, tree)?
        };
        // What the tree cannot hold, when the snapshot's record came along.
        let mut warnings = Vec::new();
        if let Some(blob) = crate::git::posix_record::blob_of(&message) {
            if repo.has_object(blob) {
                // The remote's record is data: applied with the thread owner's authority only
                // (docs/security.md, privilege separation), what it may not set named.
                let who = super::posix::authority(&rec.owner);
                let left = super::posix::restore(&core, &repo, theirs, &who)?;
                warnings.extend(super::posix::left_out_warnings(&full, &who, &left));
            } else {
                warnings.push(format!(
                    "the POSIX record of {full} (modes git cannot hold, owners, special files) did not come with it; not applied"
                ));
            }
        }
        self.tell_kernel(thread);
        // The mirror's own snapshot of that name follows when it is a fast-forward.
        let ours = snap::read_ref(&repo, &full);
        let follows = match ours {
            None => true,
            Some(o) if o == theirs => false,
            Some(o) => crate::git::Git::new(Some(&mirror_dir))
                .args(["merge-base", "--is-ancestor", "--end-of-options"])
                .args([o.to_string(), theirs.to_string()])
                .output_bytes()
                .is_ok(),
        };
        if follows {
            snap::cas_ref(
                &repo,
                &full,
                ours,
                theirs,
                &format!("octofs: pulled {name} from {remote}"),
            )?;
        } else if ours != Some(theirs) {
            warnings.push(format!(
                "this mirror's {full} has diverged from {remote}'s; it stays (the pulled one is {})",
                pulled_ref(name)
            ));
        }
        let changed: Vec<String> = changed
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        tracing::info!(
            %thread, snapshot = %theirs, paths = changed.len(),
            ms = started.elapsed().as_millis() as u64, "pulled"
        );
        Ok((
            Pulled {
                commit: theirs.to_string(),
                changed,
                saved_first,
            },
            warnings,
        ))
    }
}
