//! Creating a thread's workspace: what a new workspace is made of ([`Fork`]: a fork of a mirror's
//! commit, a resume of the thread's last snapshot, or a chat workspace), creating, seeding and
//! mounting it, and making it durable in the background after `open` was answered.
//!
//! Called by `super::threads` (open) and `super::moves`; it decides no refusal of `open` (that is
//! `super::threads`) and recovers nothing after a crash (that is `super::recover`). Nothing here runs
//! git in a workspace or reads one through its mount.

use super::error::{Context, Error, on_workspace};
use super::later_index::PendingIndex;
use super::mirrors::blank_project;
use super::refusal::{SnapshotRefusal, WorkspaceRefusal};
use super::{Daemon, now};
use crate::fs::Durable;
use crate::git::mirror;
use crate::git::snapshot::{self as snap, HeadRef};
use crate::records::{SyncJob, at_once};
use crate::workspace::{Binding, SavedMark, WorkspaceRecord};
use std::sync::Arc;

/// What a new workspace is made of.
pub(super) struct Fork {
    pub(super) project: String,
    /// The commit whose tree the files are, its tree and time.
    pub(super) base_commit: gix::ObjectId,
    pub(super) base_tree: gix::ObjectId,
    pub(super) base_time: i64,
    /// The tree the index describes (HEAD's tree).
    pub(super) index_tree: gix::ObjectId,
    /// Where HEAD goes.
    pub(super) head_commit: String,
    pub(super) branch: Option<String>,
    pub(super) requested_ref: Option<String>,
    /// The snapshot this workspace resumes (recorded as `refs/octomate/saved`).
    pub(super) saved: Option<gix::ObjectId>,
    /// Changes applied over the base before the first mount: the diff between these two trees.
    pub(super) apply: Option<(gix::ObjectId, gix::ObjectId)>,
    pub(super) chat: bool,
    /// The thread's own I/O mode (none: the daemon's).
    pub(super) io: Option<crate::fs::IoMode>,
}

impl Daemon {
    /// The fork that brings a released thread back: from its last snapshot (files = the snapshot's
    /// tree, HEAD at its first parent on the branch it was on), or from its first base when it was
    /// released with nothing saved.
    pub(super) fn resume_fork(&self, thread: &str, b: &Binding) -> Result<Fork, Error> {
        let repo = snap::open(&self.layout.mirror(&b.project))?;
        let Some(s) = snap::read_ref(&repo, &snap::thread_ref(thread)) else {
            let base = self
                .store(&b.project)?
                .resolve(Some(&b.base_commit.to_string()))?;
            return Ok(Fork {
                project: b.project.clone(),
                base_commit: b.base_commit,
                base_tree: base.tree,
                base_time: base.time,
                index_tree: base.tree,
                head_commit: b.base_commit.to_string(),
                branch: b.branch.clone(),
                requested_ref: None,
                saved: None,
                apply: None,
                chat: false,
                io: b.io,
            });
        };
        // The workspace comes back as a fork of HEAD (whose index is shared and usually already
        // built) with the snapshot's changes applied over it: O(changed paths), and every change
        // reads as uncommitted.
        let (tree, parents, message, _) = snap::commit_info(&repo, s)?;
        let head = *parents.first().ok_or(SnapshotRefusal::NoParent)?;
        let (head_tree, _, _, head_time) = snap::commit_info(&repo, head)?;
        let branch = match snap::head_of(&message) {
            HeadRef::Branch(b) => Some(b),
            HeadRef::Detached => None,
        };
        Ok(Fork {
            project: b.project.clone(),
            base_commit: head,
            base_tree: head_tree,
            base_time: head_time,
            index_tree: head_tree,
            head_commit: head.to_string(),
            branch,
            requested_ref: None,
            saved: Some(s),
            apply: Some((head_tree, tree)),
            chat: false,
            io: b.io,
        })
    }

    /// Creates, seeds and mounts a new workspace (on failure nothing of it remains), putting `also`
    /// (a new thread's binding) in place with it. On failure `also` may be in place (the caller
    /// removes it). Returns the warnings naming what of the resumed snapshot's POSIX record was
    /// beyond `owner`'s authority and left out (`posix::admit`).
    ///
    /// The workspace exists once its record is in place (renamed in): a create interrupted before
    /// that (the daemon killed) leaves a directory without a record, which nothing serves and the
    /// next create of the thread replaces. Before the answer, the catalog's seed batch, the record
    /// and `also` are in the kernel (SIGKILL of the daemon loses none of them), not synced: their
    /// syncs run after it ([`make_durable`]), and every `fsync` in the workspace, and every durable
    /// write of the daemon that depends on it, waits for them ([`Durable`]). A power loss before
    /// they ran may leave the record missing, torn or without its seed; the next start treats
    /// that as an interrupted create ([`Daemon::recover_creates`], [`Daemon::refuse_unseeded`]):
    /// nothing in it was reported durable.
    pub(super) fn create_with(
        &self,
        thread: &str,
        fork: Fork,
        owner: crate::workspace::Owner,
        also: Option<crate::records::StagedRecord>,
    ) -> Result<Vec<String>, Error> {
        let proj = if fork.chat {
            blank_project()
        } else {
            mirror::require(&self.layout, &fork.project)?
        };
        let mut rec = WorkspaceRecord {
            thread: thread.into(),
            project: fork.project.clone(),
            base_commit: fork.base_commit,
            base_tree: fork.base_tree,
            base_time: fork.base_time,
            requested_ref: fork.requested_ref.clone(),
            branch: fork.branch.clone(),
            created: now(),
            mounted: true,
            chat: fork.chat,
            saved: None,
            owner,
            users: 1,
            user_uids: vec![owner.uid],
            release_when_idle: false,
            io: fork.io,
            io_auto: None,
            index_later: false,
            layers: if fork.chat {
                Vec::new()
            } else {
                // The layers of the lockfiles the workspace's files have (a resumed one's are its
                // snapshot's).
                let files = fork.apply.map_or(fork.base_tree, |(_, to)| to);
                self.choose_layers(&fork.project, files, fork.base_tree)
            },
            files_tree: fork
                .apply
                .map(|(_, to)| to)
                .filter(|t| *t != fork.base_tree && !fork.chat),
        };
        // What an interrupted create left (no record: the callers found none under the thread's
        // lock) goes first: the new upper layer starts empty.
        let dir = self.layout.workspace(thread);
        if dir.exists() {
            tracing::info!(%thread, "removing what an interrupted create left");
            std::fs::remove_dir_all(&dir)
                .context(|| format!("cannot remove the leftover {}", dir.display()))?;
        }
        // A fresh fork's upper layer holds nothing outside `.git` when its mark is taken (no
        // snapshot restored, no changes applied), so the mark's time needs no clock tick of its own.
        let fresh = fork.apply.is_none() && fork.saved.is_none();
        // The background sync of the new workspace, once it is under way.
        let mut pending: Option<Arc<Durable>> = None;
        // What of the record was left out, named to the caller.
        let mut left_out = Vec::new();
        let made = (|| {
            // Where the time goes, in µs since the start, for the log line below.
            let t0 = std::time::Instant::now();
            let us = |t: std::time::Instant| t.elapsed().as_micros() as u64;
            let core = self.load_core(&rec)?;
            let loaded = us(t0);
            let exe =
                std::env::current_exe().context(|| "cannot find the octofs binary".to_string())?;
            let store = self.store(&fork.project)?;
            // The refs are read through the store's own handle of the mirror (no second open).
            let mut plan = store.with_repo(|repo| {
                crate::repo::plan(
                    repo,
                    &self.layout,
                    &proj,
                    thread,
                    &fork.head_commit,
                    fork.branch.as_deref(),
                    &exe,
                )
            })?;
            plan.installed = super::layers::installed_stamp(&rec.layers);
            // The rest of the resumed snapshot's repository (refs, stash, config): its refs go
            // into the plan, its files after the seed (`repo_record`).
            let record = match &fork.saved {
                Some(s) => {
                    let id = *s;
                    let repo = snap::open(&self.layout.mirror(&fork.project))?;
                    let (_, _, message, _) = snap::commit_info(&repo, id)?;
                    let shown = format!("snapshot {}", s.to_hex_with_len(12));
                    // Its config byte for byte only when the snapshot is the owner's own from
                    // this host (`repo_config`).
                    let trust =
                        super::repo_config::trust(&self.layout, thread, &s.to_string(), owner.uid);
                    super::repo_record::record_of(&message)
                        .map(|r| super::repo_record::load(&repo, r, &shown, trust))
                        .transpose()?
                }
                None => None,
            };
            if let Some(r) = &record {
                r.amend(&mut plan);
            }
            let planned = us(t0);
            // The shared index of this base and owner, when it is built (ahead, at `mirror add`
            // or sync, or by an earlier fork). When it is not, the workspace is mounted without
            // waiting for it: its `.git` is held (every request on its names waits) until the
            // build, after the answer, puts the index in (`complete_index`).
            let ready = crate::repo::shared_index_path(
                &self.layout,
                fork.index_tree,
                fork.base_tree,
                rec.owner.uid,
                rec.owner.gid,
            );
            let index = ready.exists().then_some(ready);
            let index_later = index.is_none();
            let indexed = us(t0);
            // The mount's I/O mode, chosen now (`serve --io auto`) from the base's bytes the
            // index just counted, and kept in the record.
            let (io, chosen) = self.io_hold(&rec);
            rec.io_auto = chosen;
            // The seed, the saved changes and what git dropped go to the catalog as one batch.
            let seeded = core.seeding(
                || {
                    let git = crate::repo::seed(&core, &plan, index.as_deref(), fork.base_time)?;
                    if let Some(r) = &record {
                        r.write(&core, &plan.fsmonitor)?;
                    }
                    let seeded = us(t0);
                    let mut diffed = seeded;
                    if let Some((from, to)) = fork.apply {
                        let changes = self.tree_changes(&fork.project, from, to)?;
                        diffed = us(t0);
                        core.apply_all(&changes)
                            .map_err(on_workspace("cannot restore the saved changes"))?;
                    }
                    let applied = us(t0);
                    let mut bookkeeping = Vec::new();
                    let mut left: Vec<String> = record
                        .as_ref()
                        .map(|r| r.left_out.clone())
                        .unwrap_or_default();
                    if let Some(s) = &fork.saved {
                        let id = *s;
                        let repo = snap::open(&self.layout.mirror(&fork.project))?;
                        // With the owner's authority only: the record may have come from a share
                        // remote (docs/security.md, privilege separation).
                        let who = super::posix::authority(&owner);
                        let shown = format!("snapshot {}", s.to_hex_with_len(12));
                        // Nested repositories and names git refuses first: the record's
                        // metadata of the directories above them comes after.
                        let kept = super::kept::restore(&core, &repo, id, &who)?;
                        let parts = super::posix::restore(&core, &repo, id, &who)?;
                        left.extend(super::posix::left_out_warnings(&shown, &who, &parts));
                        left.extend(super::kept::left_out_warnings(&shown, &who, &kept));
                        // The saved mark goes with the same batch (it is octofs's bookkeeping,
                        // not a change of the workspace's state).
                        bookkeeping.push(
                            core.put_file_quietly(
                                &[".git", "refs", "octomate"],
                                "saved",
                                format!("{s}\n").as_bytes(),
                            )
                            .map_err(on_workspace("cannot record refs/octomate/saved"))?,
                        );
                        bookkeeping.extend(self.write_tips(&core, thread, &fork.project));
                    }
                    let restored = us(t0);
                    Ok::<_, Error>((seeded, diffed, applied, restored, bookkeeping, left, git))
                },
                on_workspace("cannot write the new workspace's catalog"),
            )?;
            let (seeded, diffed, applied, restored, bookkeeping, left, git) = seeded;
            // Held before the mount: no request sees `.git` without its index.
            let index_job = match (&index, git) {
                (Some(_), _) => None,
                (None, git) => {
                    if let Some(g) = git {
                        core.hold_dir(g);
                        rec.index_later = true;
                    }
                    Some(PendingIndex {
                        store: store.clone(),
                        core: core.clone(),
                        git,
                        worktree: plan.worktree.clone(),
                        index_tree: fork.index_tree,
                        worktree_tree: fork.base_tree,
                        base_time: fork.base_time,
                        owner: rec.owner,
                    })
                }
            };
            left_out = left;
            // (What git dropped — modes, owners, special files, empty directories — came back
            // above, before the mount exists: no moment where a file is wider than it was.)
            let written = us(t0);
            // The mark's time: later writes must not look older than it, and for a resumed or
            // carried state the files written above must look older (the clock's next tick).
            let at = if fresh {
                core.clock_now()
            } else {
                core.clock()
            };
            rec.saved = Some(SavedMark {
                commit: fork.saved,
                generation: core.generation(),
                at: at.map_err(on_workspace("cannot read the upper layer's clock"))?,
                bookkeeping,
            });
            let staged = rec.stage(&self.layout)?;
            let clocked = us(t0);
            // The syncs, taken now (each record's on a handle of its temp file, which the rename
            // keeps) and run after the answer: first the bytes (catalog log, records), then the
            // names (the records' directories), so that a power loss after the first set leaves
            // either no record or a whole one.
            let c = core.clone();
            let mut bytes: Vec<SyncJob<Error>> = vec![Box::new(move || {
                c.sync_seed()
                    .map_err(on_workspace("cannot sync the new workspace's catalog"))
            })];
            bytes.push(job(staged.sync_job()?));
            if let Some(a) = &also {
                bytes.push(job(a.sync_job()?));
            }
            let placed = staged.publish()?;
            let also = also.map(|a| a.publish()).transpose()?;
            let mut names = vec![job(placed.sync_job())];
            if let Some(a) = &also {
                names.push(job(a.sync_job()));
            }
            let in_place = us(t0);
            // In place: the workspace exists and survives SIGKILL of the daemon. Nothing in it is
            // reported durable (fsync) before the syncs above have run (see `Durable`).
            let barrier = Durable::pending();
            core.durable_after(barrier.clone());
            pending = Some(barrier.clone());
            make_durable(
                thread,
                bytes,
                names,
                barrier,
                sync_fault_delay(&self.layout),
            );
            let mounted = self.mount_core(&rec, core, false, io).map(|_note| ());
            if let Some(p) = index_job {
                if mounted.is_ok() {
                    self.complete_index(thread, p);
                } else {
                    // The workspace goes (below): nothing to build it for.
                    p.core
                        .release_dir(Err("the workspace was not mounted".into()));
                }
            }
            tracing::info!(
                %thread, loaded, planned, indexed, seeded, diffed, applied, restored, written,
                clocked, in_place, index_later, mounted = us(t0),
                "created a workspace (µs since the start)"
            );
            mounted
        })();
        if made.is_err() {
            // Its syncs finish first: nothing then works on files of a directory being removed.
            if let Some(b) = pending {
                let _ = b.wait();
            }
            let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
        }
        // A layer its owner cannot use is said at once, not presented as fine.
        let unusable = self.interpreter_lines(&fork.project, &rec.layers, owner);
        made.map(|()| left_out.into_iter().chain(unusable).collect())
    }
}

/// Makes a new workspace durable after its `open` was answered: `bytes` at once (catalog log,
/// record and binding files), then `names` at once (their directories), on the kept sync workers;
/// then finishes `barrier`, which every `fsync` in the workspace and the daemon's own durable
/// writes that depend on it wait for. `delay` (tests only) holds the syncs back.
fn make_durable(
    thread: &str,
    bytes: Vec<SyncJob<Error>>,
    names: Vec<SyncJob<Error>>,
    barrier: Arc<Durable>,
    delay: Option<std::time::Duration>,
) {
    let thread = thread.to_string();
    crate::records::in_background(Box::new(move || {
        let started = std::time::Instant::now();
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        let r = at_once(bytes, lost).and_then(|()| at_once(names, lost));
        tracing::info!(
            %thread, synced = started.elapsed().as_micros() as u64,
            "the new workspace is durable (µs after it was placed)"
        );
        barrier.finish(r.map_err(|e| format!("thread {thread}: {e}")));
    }));
}

/// For tests, in debug builds only: how long a new workspace's background sync waits before it
/// starts (`<state>/faults/open-sync-delay-ms`, in milliseconds), so that a test can watch what
/// must wait for it. Release builds never read it.
fn sync_fault_delay(layout: &crate::layout::Layout) -> Option<std::time::Duration> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let ms =
        std::fs::read_to_string(layout.state.join("faults").join("open-sync-delay-ms")).ok()?;
    ms.trim().parse().ok().map(std::time::Duration::from_millis)
}

/// A record's sync as a job of the daemon's [`at_once`].
fn job(j: SyncJob<crate::records::RecordError>) -> SyncJob<Error> {
    Box::new(move || j().map_err(Error::from))
}

/// What a sync job that never reported (its worker could not start) fails with.
fn lost() -> Error {
    WorkspaceRefusal::SyncLost.into()
}
