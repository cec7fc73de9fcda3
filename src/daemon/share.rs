//! Threads that move between hosts: a project's share remote (a bare repository or any git
//! server; `mirror add … --share` or `mirror set … --share`) holds every thread's last snapshot as
//! `refs/octomate/threads/<thread>`, the record of what its tree cannot hold as
//! `refs/octomate/posix/<thread>`, and the rest of its repository (refs, stash, config) as
//! `refs/octomate/repo/<thread>` (`repo_record`).
//!
//! Two moves, both plain git: after every snapshot of a project's thread (explicit, release,
//! fork/teleport, the sweep) the thread's ref is pushed to the share as a fast-forward only — a
//! share that diverged is never overwritten, the local snapshot stays, and the caller hears why;
//! and `open` of a thread this host does not know (or whose last snapshot here is an ancestor of
//! the share's) fetches the share's ref and resumes from it.
//!
//! Runs git only in the project's mirror, through the hardened network git of `git::mirror`;
//! never in a workspace. The share URL carries no credential.

use super::error::Error;
use super::guard::LockKey;
use super::proto::MirrorInfo;
use super::refusal::SnapshotRefusal;
use super::{Daemon, Reply, lock, now};
use crate::access::{Caller, describe_uid};
use crate::git::mirror::{self, Shared};
use crate::git::posix_record;
use crate::git::snapshot::{self as snap, HeadRef};
use crate::names::{NameKind, validate};
use crate::workspace::{Binding, Owner};

/// Where the mirror keeps what it last fetched of a thread from the share (overwritten by each
/// fetch; the thread's own ref moves only as a fast-forward to it).
fn fetched_ref(thread: &str) -> String {
    format!("refs/octomate/shared/threads/{thread}")
}

/// Why a thread's snapshot was not shared.
#[derive(Debug, Clone)]
pub(super) struct Unshared {
    /// One line.
    pub why: String,
    /// The share's snapshot descends from ours: nothing is lost, nothing was pushed (a note, not
    /// a failure).
    pub behind: bool,
}

fn fetched_posix_ref(thread: &str) -> String {
    format!("refs/octomate/shared/posix/{thread}")
}

impl Daemon {
    /// `octofs mirror set P --share REMOTE` (and the second half of `mirror add … --share`).
    pub(super) fn mirror_share(&self, project: &str, share: Option<&str>) -> Reply<MirrorInfo> {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&LockKey::project(project));
        let _g = lock(&l);
        let p = mirror::set_share(&self.layout, project, share)?;
        tracing::info!(%project, share = ?p.share, "share remote set");
        Ok((mirror::info(&self.layout, p), vec![]))
    }

    /// `octofs mirror set P --exclude …`: replaces the project's excludes (see `git::gates`).
    pub(super) fn mirror_excludes(
        &self,
        project: &str,
        excludes: Vec<String>,
    ) -> Reply<MirrorInfo> {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&LockKey::project(project));
        let _g = lock(&l);
        let p = mirror::set_excludes(&self.layout, project, excludes)?;
        tracing::info!(%project, excludes = ?p.excludes, "excludes set");
        Ok((mirror::info(&self.layout, p), vec![]))
    }

    /// Pushes the thread's snapshot `commit` to the share remote of `project` (when it has one) as
    /// a fast-forward of `refs/octomate/threads/<thread>`, with the thread's POSIX records in the
    /// same atomic push. `Some` when it was not shared: behind (the share's snapshot descends from
    /// `commit`: nothing of it is missing there, and nothing is pushed), diverged, unreachable;
    /// logged here. The local snapshot is saved either way.
    pub(super) fn share_thread(
        &self,
        project: &str,
        thread: &str,
        commit: gix::ObjectId,
    ) -> Option<Unshared> {
        let share = match mirror::load(&self.layout, project) {
            Ok(Some(p)) => p.share?,
            Ok(None) => return None,
            Err(e) => {
                let why = format!("cannot read project {project}'s record to share: {e}");
                tracing::warn!(%thread, "{why}");
                return Some(Unshared { why, behind: false });
            }
        };
        let mirror = self.layout.mirror(project);
        let started = std::time::Instant::now();
        let pushed = (|| {
            let target = mirror::share_target(&share)?;
            let repo = snap::open(&mirror)?;
            let forced: Vec<(gix::ObjectId, String)> = [
                posix_record::posix_ref(thread),
                super::repo_record::repo_ref(thread),
                crate::git::kept::kept_ref(thread),
            ]
            .into_iter()
            .filter_map(|name| snap::read_ref(&repo, &name).map(|id| (id, name)))
            .collect();
            Ok::<_, Error>(mirror::push_ref(
                &mirror,
                &target,
                commit,
                &snap::thread_ref(thread),
                &forced,
            )?)
        })();
        let why = match pushed {
            Ok(Shared::Pushed) => {
                tracing::info!(%thread, %commit, %share, ms = started.elapsed().as_millis() as u64, "snapshot shared");
                return None;
            }
            Ok(Shared::Already) => return None,
            Ok(Shared::Behind(theirs)) => {
                return Some(self.behind_share(thread, commit, theirs, &share));
            }
            // The share's commit may be one this mirror has not fetched yet (another host moved
            // the thread on): fetched, a share that merely went ahead of us is "behind", not
            // "diverged".
            Ok(Shared::Diverged(theirs))
                if mirror::share_target(&share)
                    .and_then(|t| {
                        mirror::fetch_ref(
                            &mirror,
                            &t,
                            &snap::thread_ref(thread),
                            &fetched_ref(thread),
                        )
                    })
                    .is_ok_and(|got| got == Some(theirs))
                    && mirror::is_ancestor(&mirror, commit, theirs) =>
            {
                return Some(self.behind_share(thread, commit, theirs, &share));
            }
            Ok(Shared::Diverged(theirs)) => format!(
                "snapshot {commit} of {thread} is saved locally but not shared: {} on the share {share} has diverged (it names {theirs}, which {commit} does not descend from); not overwritten",
                snap::thread_ref(thread)
            ),
            Err(e) => format!(
                "snapshot {commit} of {thread} is saved locally but not shared to {share}: {e}"
            ),
        };
        tracing::warn!(%thread, "{why}");
        Some(Unshared { why, behind: false })
    }

    /// What a snapshot `commit` of `thread` that the share's `theirs` descends from says: it is
    /// behind, nothing was pushed, and how to continue from the share's.
    fn behind_share(
        &self,
        thread: &str,
        commit: gix::ObjectId,
        theirs: gix::ObjectId,
        share: &str,
    ) -> Unshared {
        let why = format!(
            "thread {thread} here ({commit}) is behind the share {share} ({theirs}, which descends from it): nothing pushed; release it and open it again to continue from the share's"
        );
        tracing::info!(%thread, "{why}");
        Unshared { why, behind: true }
    }

    /// `open` of a thread with no live workspace, in a project with a share remote: when this host
    /// does not know the thread, or its last snapshot here is an ancestor of the share's, the
    /// share's snapshot is fetched (only the objects the mirror lacks) and becomes the thread's
    /// last snapshot here, so that `open` resumes from it. Returns the binding to resume with (a
    /// new one, saved, for a thread this host did not know) and a warning when the share could
    /// not be asked or has diverged from this host. The caller holds the thread's lock.
    pub(super) fn adopt_shared(
        &self,
        thread: &str,
        binding: Option<Binding>,
        project: Option<&str>,
        owner: Owner,
        c: &Caller,
    ) -> Result<(Option<Binding>, Option<String>), Error> {
        let Some(project) = binding
            .as_ref()
            .map(|b| b.project.clone())
            .or(project.map(str::to_string))
        else {
            return Ok((binding, None));
        };
        let Some(share) = mirror::load(&self.layout, &project)?.and_then(|p| p.share) else {
            return Ok((binding, None));
        };
        let mirror_dir = self.layout.mirror(&project);
        let tref = snap::thread_ref(thread);
        let started = std::time::Instant::now();
        let fetched = (|| {
            let target = mirror::share_target(&share)?;
            let tip = mirror::fetch_ref(&mirror_dir, &target, &tref, &fetched_ref(thread))?;
            if tip.is_some() {
                mirror::fetch_ref(
                    &mirror_dir,
                    &target,
                    &posix_record::posix_ref(thread),
                    &fetched_posix_ref(thread),
                )?;
                mirror::fetch_ref(
                    &mirror_dir,
                    &target,
                    &super::repo_record::repo_ref(thread),
                    &super::repo_record::fetched_repo_ref(thread),
                )?;
                // Nested repositories and names git refuses (`super::kept`).
                mirror::fetch_ref(
                    &mirror_dir,
                    &target,
                    &crate::git::kept::kept_ref(thread),
                    &format!("refs/octomate/shared/kept/{thread}"),
                )?;
            }
            Ok::<_, Error>(tip)
        })();
        let theirs = match fetched {
            Ok(Some(t)) => t,
            Ok(None) => return Ok((binding, None)),
            Err(e) => {
                let why = format!(
                    "cannot ask the share {share} for thread {thread}: {e}; opening what this host has"
                );
                tracing::warn!(%thread, "{why}");
                return Ok((binding, Some(why)));
            }
        };
        let repo = snap::open(&mirror_dir)?;
        let ours = snap::read_ref(&repo, &tref);
        let adopt = match ours {
            None => true,
            Some(o) if o == theirs => false,
            Some(o) => {
                let ancestor = |a: gix::ObjectId, b: gix::ObjectId| {
                    crate::git::Git::new(Some(&mirror_dir))
                        .args(["merge-base", "--is-ancestor", "--end-of-options"])
                        .args([a.to_string(), b.to_string()])
                        .output_bytes()
                        .is_ok()
                };
                if ancestor(o, theirs) {
                    true
                } else if ancestor(theirs, o) {
                    false
                } else {
                    let why = format!(
                        "thread {thread} has diverged between this host ({o}) and the share {share} ({theirs}); resuming this host's snapshot"
                    );
                    tracing::warn!(%thread, "{why}");
                    return Ok((binding, Some(why)));
                }
            }
        };
        if !adopt {
            return Ok((binding, None));
        }
        let (_, parents, message, _) = snap::commit_info(&repo, theirs)?;
        let head = *parents
            .first()
            .ok_or(SnapshotRefusal::ShareNoParent { theirs })?;
        // A thread this host does not know yet becomes the share's owner's, never the caller's
        // merely because they asked first: a share holds every user's threads.
        let owner = match &binding {
            Some(_) => owner,
            None => self.shared_owner(thread, &snap::owner_of(&message), owner, c)?,
        };
        snap::cas_ref(
            &repo,
            &tref,
            ours,
            theirs,
            &format!("octofs: snapshot of {thread} from the share"),
        )?;
        // The share's snapshot is no owner's own here: its config comes back filtered.
        super::repo_config::forget(&self.layout, thread);
        // Its repository record (fetched above) becomes the thread's here: the next snapshot
        // builds on it, and it stays reachable.
        if let Some(r) = super::repo_record::record_of(&message)
            && repo.has_object(r)
        {
            super::repo_record::set_ref(&repo, thread, r)?;
        }
        tracing::info!(
            %thread, snapshot = %theirs, %share,
            ms = started.elapsed().as_millis() as u64,
            "resuming from the share"
        );
        if let Some(b) = binding {
            return Ok((Some(b), None));
        }
        let b = Binding {
            thread: thread.into(),
            project,
            base_commit: head,
            branch: match snap::head_of(&message) {
                HeadRef::Branch(b) => Some(b),
                HeadRef::Detached => None,
            },
            created: now(),
            owner,
            io: None,
        };
        b.save(&self.layout)?;
        Ok((Some(b), None))
    }
    /// Who a thread adopted from the share belongs to here. The snapshot names its owner (uid
    /// and, where the other host knew it, the user name). A user other than root may adopt only
    /// their own thread: same name, or the same uid where no name was recorded. Root adopts it
    /// for the user of that name on this host (else for the caller).
    fn shared_owner(
        &self,
        thread: &str,
        recorded: &Option<snap::SnapshotOwner>,
        caller_owner: Owner,
        c: &Caller,
    ) -> Result<Owner, Error> {
        let local = recorded
            .as_ref()
            .and_then(|o| o.name.as_deref())
            .and_then(|n| crate::sys::user_by_name(n).ok().flatten())
            .map(|(uid, gid)| Owner { uid, gid });
        if self.is_admin(c) {
            return Ok(local.unwrap_or(caller_owner));
        }
        let mine = match recorded {
            Some(o) => match (&o.name, crate::sys::user_name(c.uid)) {
                (Some(theirs), Some(me)) => *theirs == me,
                (Some(_), None) => false,
                (None, _) => o.uid == c.uid,
            },
            None => false,
        };
        if mine {
            return Ok(caller_owner);
        }
        let whose = match recorded {
            Some(snap::SnapshotOwner {
                name: Some(n), uid, ..
            }) => format!("{n} (uid {uid} on the host that shared it)"),
            Some(snap::SnapshotOwner { uid, .. }) => {
                format!("uid {uid} on the host that shared it")
            }
            None => "a user the snapshot does not name (only root may open it)".into(),
        };
        Err(Error::PermissionDenied(format!(
            "thread {thread} on the share belongs to {whose}; {} may not open it",
            describe_uid(c.uid)
        )))
    }
}
