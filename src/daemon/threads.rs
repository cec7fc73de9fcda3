//! A thread's workspace lifecycle (seed 000 "Forking", "Restoring", "Reclaiming", "Binding",
//! "The chat workspace"): open (fork, resume, or share the live mount), release (now, or when the
//! mount's last process has left) and sweep. Saving is `super::snapshot`; carrying a state to a new
//! thread is `super::moves`.
//!
//! Policy only: the mechanisms are the filesystem core, `repo` (the workspace's `.git`) and the
//! records of `workspace`. Nothing here runs git in a workspace or reads one through its mount.
//! Every operation on a thread holds that thread's lock, and under it refuses a caller who neither
//! owns the thread nor is root.

use super::error::{Context, Error, on_workspace};
use super::mirrors::{BLANK, blank_project};
use super::proto::{Kept, Opened, ReleaseAnswer, SweepAnswer};
use super::{Daemon, Reply, lock, now};
use crate::access::{Caller, user_label};
use crate::fs::{Durable, WorkspaceFs};
use crate::git::mirror;
use crate::git::objects::{EntryKind, ObjectStore, TreeEntry};
use crate::git::snapshot::{self as snap, HeadRef};
use crate::names::{NameKind, validate};
use crate::records::{SyncJob, at_once};
use crate::workspace::{Binding, SavedMark, WorkspaceRecord};
use std::sync::Arc;

/// What a new workspace is made of.
pub(super) struct Fork {
    project: String,
    /// The commit whose tree the files are, its tree and time.
    base_commit: String,
    base_tree: gix::ObjectId,
    base_time: i64,
    /// The tree the index describes (HEAD's tree).
    index_tree: gix::ObjectId,
    /// Where HEAD goes.
    head_commit: String,
    branch: Option<String>,
    requested_ref: Option<String>,
    /// The snapshot this workspace resumes (recorded as `refs/octomate/saved`).
    saved: Option<String>,
    /// Changes applied over the base before the first mount: the diff between these two trees.
    apply: Option<(gix::ObjectId, gix::ObjectId)>,
    chat: bool,
    /// The thread's own I/O mode (none: the daemon's).
    io: Option<crate::fs::IoMode>,
}

impl Daemon {
    /// `octofs open`: the thread's one workspace, mounted — the live mount (counted), a remount,
    /// a resume of its last snapshot, a new fork, or a chat workspace.
    /// A thread that exists is its owner's (root may join it); a new one becomes the caller's.
    pub(super) fn open(
        &self,
        thread: &str,
        project: Option<&str>,
        git_ref: Option<&str>,
        io: Option<crate::fs::IoMode>,
        c: &Caller,
    ) -> Reply<Opened> {
        let started = std::time::Instant::now();
        validate(NameKind::Thread, thread)?;
        if let Some(p) = project {
            validate(NameKind::Project, p)?;
        }
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        let binding = Binding::load(&self.layout, thread)?;
        let live = WorkspaceRecord::load(&self.layout, thread)?;
        let owner = match (&live, &binding) {
            (Some(r), _) => Some(r.owner),
            (None, Some(b)) => Some(b.owner),
            (None, None) => None,
        };
        if let Some(o) = owner {
            self.require_owner(c, thread, o)?;
        }
        let owner = owner.unwrap_or(crate::workspace::Owner {
            uid: c.uid,
            gid: c.gid,
        });
        let bound = match (&live, &binding) {
            (Some(r), _) if r.chat => None,
            (Some(r), _) => Some(r.project.as_str()),
            (None, Some(b)) => Some(b.project.as_str()),
            (None, None) => project,
        };
        if let Some(p) = bound {
            self.check_bind(c, p)?;
        }
        if let (Some(b), Some(p)) = (&binding, project)
            && b.project != p
        {
            return Err(Error::Refused(format!(
                "thread {thread} is bound to project {}; it cannot be re-bound to {p}",
                b.project
            )));
        }
        if let (Some(rec), Some(p)) = (&live, project)
            && rec.chat
        {
            return Err(Error::Refused(format!(
                "thread {thread} has a chat workspace (no project); release it before binding it to {p}"
            )));
        }
        if let (Some(rec), Some(r)) = (&live, git_ref) {
            let resolved = self.store(&rec.project)?.resolve(Some(r))?;
            if gix::ObjectId::from_hex(rec.base_commit.as_bytes()).ok() != Some(resolved.commit) {
                return Err(Error::Refused(format!(
                    "thread {thread} already has a workspace based on {}; --ref {r} applies only when it is created",
                    rec.base_commit.get(..12).unwrap_or(&rec.base_commit)
                )));
            }
        }
        let path = Opened {
            path: self.layout.mountpoint(thread).display().to_string(),
        };
        if let Some(mut rec) = live {
            // One more user of the live workspace, counted in its record so that a restart keeps
            // the count. A record the daemon serves (or should: its remount failed) keeps its users.
            // Served means the kernel has the mount, not only that the daemon has a session: a
            // mount taken away behind the daemon is let go here and mounted again below.
            self.forget_lost_mount(thread)?;
            let served = self.kernel_has(thread);
            let current = lock(&self.mounts).get(thread).map(|m| m.io.mode);
            if let (Some(want), Some(current)) = (io, current)
                && want != current
                && served
            {
                return Err(Error::Refused(format!(
                    "thread {thread} is mounted in {current} mode; release it to reopen it in {want} mode"
                )));
            }
            let before = rec.clone();
            if io.is_some() {
                rec.io = io;
            }
            // Each caller counts once: the same user opening it again (`cd $(octofs open t)`,
            // doctor's advice) is no other user.
            let holders = if rec.release_when_idle {
                // A pending `release --when-idle` was its last user's release: this open cancels
                // it and is the one user now.
                tracing::info!(%thread, "pending release cancelled by open");
                vec![c.uid]
            } else if served || rec.mounted {
                let mut h = rec.holders();
                h.push(c.uid);
                h
            } else {
                vec![c.uid]
            };
            rec.set_holders(holders);
            rec.release_when_idle = false;
            rec.mounted = true;
            rec.save(&self.layout)?;
            let mut notes = Vec::new();
            if !served {
                match self.mount(&rec) {
                    Ok(note) => notes.extend(note),
                    Err(e) => {
                        // (Unless the workspace was set aside as an interrupted create: its
                        // record went with it.)
                        if self.layout.workspace(thread).exists() {
                            let _ = before.save(&self.layout);
                        }
                        return Err(e);
                    }
                }
            }
            notes.extend(self.grant_owner(&rec.project, rec.owner, false));
            return Ok((path, notes));
        }
        self.check_root()?;
        // A new live thread of its owner: counted against their cap before anything is written.
        let slot = self.reserve_live(thread, owner.uid)?;
        // A thread another host moved on: its snapshot comes from the project's share remote.
        let (binding, shared_warning) = if git_ref.is_none() {
            self.adopt_shared(thread, binding, project, owner, c)?
        } else {
            (binding, None)
        };
        // A thread adopted from the share is its recorded owner's (see `shared_owner`).
        let owner = binding.as_ref().map_or(owner, |b| b.owner);
        let fork = match (&binding, project) {
            (Some(b), _) => {
                if git_ref.is_some() {
                    return Err(Error::Refused(format!(
                        "thread {thread} was released; it resumes from its last snapshot (--ref applies only when a thread is created)"
                    )));
                }
                let mut fork = self.resume_fork(thread, b)?;
                if io.is_some() {
                    fork.io = io;
                }
                fork
            }
            (None, Some(p)) => {
                let proj = mirror::require(&self.layout, p)?;
                let base = self.store(p)?.resolve(git_ref)?;
                // HEAD goes on the branch the caller named, else on a branch of the thread's own.
                let branch = git_ref
                    .and(base.branch.clone())
                    .unwrap_or_else(|| format!("octofs/{thread}"));
                Fork {
                    project: proj.project,
                    base_commit: base.commit.to_string(),
                    base_tree: base.tree,
                    base_time: base.time,
                    index_tree: base.tree,
                    head_commit: base.commit.to_string(),
                    branch: Some(branch),
                    requested_ref: git_ref.map(str::to_string),
                    saved: None,
                    apply: None,
                    chat: false,
                    io,
                }
            }
            (None, None) => {
                if git_ref.is_some() {
                    return Err(Error::Refused(
                        "a chat workspace (no --project) has no refs to choose from".into(),
                    ));
                }
                self.ensure_blank()?;
                let base = self.store(BLANK)?.resolve(None)?;
                Fork {
                    project: BLANK.into(),
                    base_commit: base.commit.to_string(),
                    base_tree: base.tree,
                    base_time: base.time,
                    index_tree: base.tree,
                    head_commit: base.commit.to_string(),
                    branch: Some("main".into()),
                    requested_ref: None,
                    saved: None,
                    apply: None,
                    chat: true,
                    io,
                }
            }
        };
        let forked_project = fork.project.clone();
        let fork_io = fork.io;
        // A new thread's binding is what its record will say (project, base, branch, I/O mode):
        // put in place together with the workspace and made durable with it (see `create_with`).
        // Nothing of either is left if one fails.
        let new_binding = (binding.is_none() && project.is_some()).then(|| Binding {
            thread: thread.into(),
            project: fork.project.clone(),
            base_commit: fork.base_commit.clone(),
            branch: fork.branch.clone(),
            created: now(),
            owner,
            io: fork_io,
        });
        let staged = new_binding
            .as_ref()
            .map(|b| b.stage(&self.layout))
            .transpose()?;
        let us = |t: std::time::Instant| t.elapsed().as_micros() as u64;
        let before_create = us(started);
        let left_out = match self.create_with(thread, fork, owner, staged) {
            Ok(w) => w,
            Err(e) => {
                if new_binding.is_some() {
                    Binding::remove(&self.layout, thread);
                }
                return Err(e);
            }
        };
        slot.keep();
        if let Some(mut b) = binding.clone().filter(|b| b.io != fork_io) {
            // The mode asked for at a resume stays the thread's.
            b.io = fork_io;
            if let Err(e) = b.save(&self.layout) {
                self.discard(thread);
                return Err(e.into());
            }
        }
        let warnings = self.grant_owner(&forked_project, owner, false);
        tracing::info!(
            %thread, before_create, answered = us(started),
            "opened a new workspace (µs since the request was dispatched)"
        );
        Ok((
            path,
            left_out
                .into_iter()
                .chain(warnings)
                .chain(shared_warning)
                .collect(),
        ))
    }

    /// The fork that brings a released thread back: from its last snapshot (files = the snapshot's
    /// tree, HEAD at its first parent on the branch it was on), or from its first base when it was
    /// released with nothing saved.
    pub(super) fn resume_fork(&self, thread: &str, b: &Binding) -> Result<Fork, Error> {
        let repo = snap::open(&self.layout.mirror(&b.project))?;
        let Some(s) = snap::read_ref(&repo, &snap::thread_ref(thread)) else {
            let base = self.store(&b.project)?.resolve(Some(&b.base_commit))?;
            return Ok(Fork {
                project: b.project.clone(),
                base_commit: b.base_commit.clone(),
                base_tree: base.tree,
                base_time: base.time,
                index_tree: base.tree,
                head_commit: b.base_commit.clone(),
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
        let head = *parents
            .first()
            .ok_or_else(|| Error::Refused("the snapshot has no parent".into()))?;
        let (head_tree, _, _, head_time) = snap::commit_info(&repo, head)?;
        let branch = match snap::head_of(&message) {
            HeadRef::Branch(b) => Some(b),
            HeadRef::Detached => None,
        };
        Ok(Fork {
            project: b.project.clone(),
            base_commit: head.to_string(),
            base_tree: head_tree,
            base_time: head_time,
            index_tree: head_tree,
            head_commit: head.to_string(),
            branch,
            requested_ref: None,
            saved: Some(s.to_string()),
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
            base_commit: fork.base_commit.clone(),
            base_tree: fork.base_tree.to_string(),
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
                .filter(|t| *t != fork.base_tree && !fork.chat)
                .map(|t| t.to_string()),
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
                    let id = gix::ObjectId::from_hex(s.as_bytes())
                        .context(|| format!("saved snapshot id {s:?}"))?;
                    let repo = snap::open(&self.layout.mirror(&fork.project))?;
                    let (_, _, message, _) = snap::commit_info(&repo, id)?;
                    let shown = format!("snapshot {}", s.get(..12).unwrap_or(s));
                    // Its config byte for byte only when the snapshot is the owner's own from
                    // this host (`repo_config`).
                    let trust = super::repo_config::trust(&self.layout, thread, s, owner.uid);
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
            let index = {
                let il = self.locks.get(&super::mirrors::index_lock_key(
                    fork.index_tree,
                    fork.base_tree,
                ));
                let _ig = lock(&il);
                crate::repo::shared_index(
                    &self.layout,
                    &store,
                    fork.index_tree,
                    fork.base_tree,
                    fork.base_time,
                    rec.owner.uid,
                    rec.owner.gid,
                )?
            };
            let indexed = us(t0);
            // The mount's I/O mode, chosen now (`serve --io auto`) from the base's bytes the
            // index just counted, and kept in the record.
            let (io, chosen) = self.io_hold(&rec);
            rec.io_auto = chosen;
            // The seed, the saved changes and what git dropped go to the catalog as one batch.
            let seeded = core.seeding(
                || {
                    crate::repo::seed(&core, &plan, &index, fork.base_time)?;
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
                        let id = gix::ObjectId::from_hex(s.as_bytes())
                            .context(|| format!("saved snapshot id {s:?}"))?;
                        let repo = snap::open(&self.layout.mirror(&fork.project))?;
                        // With the owner's authority only: the record may have come from a share
                        // remote (docs/security.md, privilege separation).
                        let who = super::posix::authority(&owner);
                        let shown = format!("snapshot {}", s.get(..12).unwrap_or(s));
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
                    Ok::<_, Error>((seeded, diffed, applied, restored, bookkeeping, left))
                },
                on_workspace("cannot write the new workspace's catalog"),
            )?;
            let (seeded, diffed, applied, restored, bookkeeping, left) = seeded;
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
                commit: fork.saved.clone(),
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
            tracing::info!(
                %thread, loaded, planned, indexed, seeded, diffed, applied, restored, written,
                clocked, in_place, mounted = us(t0),
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

    /// Applies the difference between two trees of the mirror to a workspace ([`Self::tree_changes`]).
    /// Returns the paths it wrote or removed.
    pub(super) fn apply_diff(
        &self,
        core: &WorkspaceFs,
        project: &str,
        from: gix::ObjectId,
        to: gix::ObjectId,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let changes = self.tree_changes(project, from, to)?;
        // One catalog batch for the whole change set while the workspace is not mounted yet
        // (once mounted, as for a pull, each change is its own transaction).
        core.apply_all(&changes)
            .map_err(on_workspace("cannot restore the saved changes"))?;
        let mut done: Vec<Vec<u8>> = changes.into_iter().map(|(p, _)| p).collect();
        done.sort();
        done.dedup();
        Ok(done)
    }

    /// The difference between two trees of the mirror as changes to apply in this order:
    /// removals (deepest first), then additions and changes (in the new tree's order). Read in
    /// process from the mirror's parsed trees (shared and cached by every workspace of the
    /// project): only the subtrees whose ids differ are read, never the whole tree.
    pub(super) fn tree_changes(
        &self,
        project: &str,
        from: gix::ObjectId,
        to: gix::ObjectId,
    ) -> Result<Vec<(Vec<u8>, crate::fs::TreeChange)>, Error> {
        use crate::fs::TreeChange;
        let store = self.store(project)?;
        let mut diff = TreeDiff::default();
        diff.trees(&store, &mut Vec::new(), from, to)
            .context(|| format!("cannot compare trees {from} and {to}"))?;
        let TreeDiff {
            mut removals,
            additions,
        } = diff;
        removals.sort_by(|a, b| b.cmp(a));
        Ok(removals
            .into_iter()
            .map(|p| (p, TreeChange::Remove))
            .chain(additions)
            .collect())
    }

    pub(super) fn live_record(&self, thread: &str) -> Result<WorkspaceRecord, Error> {
        match WorkspaceRecord::load(&self.layout, thread)? {
            Some(r) => Ok(r),
            None if Binding::load(&self.layout, thread)?.is_some() => {
                Err(Error::Released(thread.to_string()))
            }
            None => Err(Error::UnknownThread(thread.to_string())),
        }
    }

    /// `octofs release`: one user fewer; the last one saves (if anything changed), unmounts and drops
    /// the upper layer. A busy mount is refused unless `force`. `discard` drops the workspace at once
    /// without saving (every user's, busy or not): the way out when it cannot be saved, e.g. its mirror
    /// is gone; the thread's last snapshot stays where it was.
    pub(super) fn release(
        &self,
        thread: &str,
        force: bool,
        discard: bool,
        c: &Caller,
    ) -> Reply<ReleaseAnswer> {
        let force = force || discard;
        validate(NameKind::Thread, thread)?;
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        self.check_thread(c, thread)?;
        self.release_locked(thread, force, discard, Some(c.uid))
    }

    /// `release` with the thread's lock held and the caller checked. `by`: the caller whose hold
    /// ends (none: the daemon's own release, of the last user).
    fn release_locked(
        &self,
        thread: &str,
        force: bool,
        discard: bool,
        by: Option<u32>,
    ) -> Reply<ReleaseAnswer> {
        let mut rec = match WorkspaceRecord::load(&self.layout, thread)? {
            Some(r) => r,
            None if Binding::load(&self.layout, thread)?.is_some() => {
                return Ok((
                    ReleaseAnswer {
                        thread: thread.into(),
                        released: true,
                        already: true,
                        users: None,
                        user_names: Vec::new(),
                        snapshot: None,
                        pending: false,
                    },
                    vec![],
                ));
            }
            None => return Err(Error::UnknownThread(thread.to_string())),
        };
        let holders = after_release(&rec, by);
        if !holders.is_empty() && !force {
            let names = holders.iter().map(|u| user_label(*u)).collect();
            rec.set_holders(holders);
            rec.save(&self.layout)?;
            return Ok((
                ReleaseAnswer {
                    thread: thread.into(),
                    released: false,
                    already: false,
                    users: Some(rec.users),
                    user_names: names,
                    snapshot: None,
                    pending: false,
                },
                vec![],
            ));
        }
        // A busy mount is refused before anything is saved: a refused release changes nothing.
        // A process on its way out (git's detached maintenance after a commit) is waited for,
        // up to a second. (`served` first, as a statement of its own: the guard of `mounts` must
        // be gone before the mount is checked.)
        let served = lock(&self.mounts).contains_key(thread);
        if !force
            && served
            && crate::sys::is_busy_settled(
                &self.layout.mountpoint(thread),
                std::time::Duration::from_secs(1),
            )
        {
            return Err(Error::Refused(format!(
                "{} is busy (a process still has its working directory or files in it); stop them or use --force",
                self.layout.mountpoint(thread).display()
            )));
        }
        if !force
            && served
            && let Some((pid, at)) = crate::sys::bound_elsewhere(&self.layout.mountpoint(thread))
        {
            return Err(Error::Refused(format!(
                "{} is busy: it is also mounted at {} for process {pid} (a sandbox or a bind); stop it or use --force",
                self.layout.mountpoint(thread).display(),
                at.display()
            )));
        }
        // A workspace created moments ago: its background sync ends before it is taken apart.
        let core = lock(&self.mounts).get(thread).map(|m| m.core.clone());
        if let Some(core) = core {
            self.settled(&core);
        }
        let mut warnings = Vec::new();
        let saved = if rec.chat || discard {
            None
        } else {
            let (s, unshared) = self.snapshot_locked_shared(thread)?;
            warnings.extend(unshared.map(|u| u.why));
            Some(s)
        };
        if discard {
            tracing::warn!(%thread, "discarding the workspace without saving it");
        }
        self.unmount_thread(thread, force)?;
        let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
        let _ = std::fs::remove_dir(self.layout.mountpoint(thread));
        tracing::info!(%thread, "released");
        Ok((
            ReleaseAnswer {
                thread: thread.into(),
                released: true,
                already: false,
                users: None,
                user_names: Vec::new(),
                snapshot: saved,
                pending: false,
            },
            warnings,
        ))
    }

    /// `octofs release <thread> --when-idle`: answers at once. A user who is not the last one
    /// releases as usual (one user fewer); the last one's release waits until no process uses the
    /// mount (no open file, mapping, working or root directory inside), then happens as a plain
    /// release (saved, unmounted, dropped). A mount nobody uses is released now. `open` cancels a
    /// pending release.
    pub(super) fn release_when_idle(&self, thread: &str, c: &Caller) -> Reply<ReleaseAnswer> {
        validate(NameKind::Thread, thread)?;
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        self.check_thread(c, thread)?;
        let Some(mut rec) = WorkspaceRecord::load(&self.layout, thread)? else {
            return self.release_locked(thread, false, false, Some(c.uid));
        };
        if !after_release(&rec, Some(c.uid)).is_empty() {
            return self.release_locked(thread, false, false, Some(c.uid));
        }
        // (`served` first, as a statement of its own: the guard of `mounts` must be gone before
        // `is_busy` walks the mount.)
        let served = lock(&self.mounts).contains_key(thread);
        if !served || !self.in_use(thread) {
            // Idle now (checked once: a second check in a row would unmount it behind us).
            return self.release_locked(thread, true, false, Some(c.uid));
        }
        rec.release_when_idle = true;
        rec.save(&self.layout)?;
        lock(&self.idle_waits).insert(thread.to_string());
        tracing::info!(%thread, "release pending until the mount is idle");
        Ok((
            ReleaseAnswer {
                thread: thread.into(),
                released: false,
                already: false,
                users: None,
                user_names: Vec::new(),
                snapshot: None,
                pending: true,
            },
            vec![],
        ))
    }

    /// Whether a process uses the thread's mount: on the host (its cwd, root, open files or
    /// mappings) or through a copy of the mount elsewhere, such as a sandbox's bind
    /// (`sys::bound_elsewhere`).
    fn in_use(&self, thread: &str) -> bool {
        let at = self.layout.mountpoint(thread);
        // The copies first: an idle answer of `is_busy` marks the mount expired, and a second one
        // in a row would unmount it.
        crate::sys::bound_elsewhere(&at).is_some() || crate::sys::is_busy(&at)
    }

    /// Whether any `release --when-idle` waits (the timer asks before it does any work).
    pub(super) fn has_idle_waits(&self) -> bool {
        !lock(&self.idle_waits).is_empty()
    }

    /// Releases each workspace whose `release --when-idle` waits and whose mount no process uses
    /// any more; returns the threads released. A release that fails is logged and not retried
    /// (the workspace stays mounted, its pending mark cleared).
    pub(super) fn release_idle_waits(&self) -> Vec<String> {
        let waiting: Vec<String> = lock(&self.idle_waits).iter().cloned().collect();
        let mut released = Vec::new();
        for thread in waiting {
            let l = self.locks.get(&format!("thread:{thread}"));
            let _g = lock(&l);
            let rec = match WorkspaceRecord::load(&self.layout, &thread) {
                Ok(Some(r)) if r.release_when_idle => r,
                // Released, cancelled by an open, or unreadable: nothing waits any more.
                _ => {
                    lock(&self.idle_waits).remove(&thread);
                    continue;
                }
            };
            let served = lock(&self.mounts).contains_key(&thread);
            if served && self.in_use(&thread) {
                continue;
            }
            lock(&self.idle_waits).remove(&thread);
            match self.release_locked(&thread, true, false, None) {
                Ok(_) => {
                    tracing::info!(%thread, "released when idle");
                    released.push(thread);
                }
                Err(e) => {
                    tracing::warn!(%thread, "release when idle failed: {e}; the workspace stays");
                    let mut rec = rec;
                    rec.release_when_idle = false;
                    let _ = rec.save(&self.layout);
                }
            }
        }
        released
    }

    /// Waits for `core`'s background sync if it was created moments ago ([`Durable`]), before
    /// the daemon makes durable something that depends on it (a snapshot's ref, a fork of it, its
    /// release, a stop). A failure was logged when it happened and is for the workspace's fsyncs
    /// to report; here it is only noted.
    pub(super) fn settled(&self, core: &WorkspaceFs) {
        if let Err(e) = core.wait_durable() {
            tracing::debug!("{e}");
        }
    }

    /// [`Self::settled`] for every served workspace: before the daemon stops or hands over.
    pub(super) fn settle_all(&self) {
        let cores: Vec<Arc<WorkspaceFs>> = lock(&self.mounts)
            .values()
            .map(|m| m.core.clone())
            .collect();
        for core in cores {
            self.settled(&core);
        }
    }

    /// Before a workspace whose record is in place is served again: a catalog that loads blank,
    /// without `.git`, never held the seed its create wrote before putting the record in place,
    /// which only a
    /// power loss before the create's background sync explains (the record's rename reached the
    /// disk, the catalog's bytes did not). Nothing in it was reported durable: it is an
    /// interrupted create, set aside ([`Self::set_aside_workspace`]) and refused; the next
    /// `open` of the thread makes it again.
    pub(super) fn refuse_unseeded(
        &self,
        rec: &WorkspaceRecord,
        core: &WorkspaceFs,
    ) -> Result<(), Error> {
        // (A base whose tree has a `.git` entry of its own is not seeded: its catalog may well
        // be blank.)
        if !core.is_blank() || core.exists(crate::fs::ROOT_INO, ".git").unwrap_or(true) {
            return Ok(());
        }
        let done = self.set_aside_workspace(
            &rec.thread,
            "its record is in place but its catalog holds no seed",
        );
        Err(Error::Refused(format!(
            "thread {}: its workspace was never made durable (power loss while it was created) and was {done}; open it again",
            rec.thread
        )))
    }

    /// At start, before anything is remounted: what a power loss during a create can leave, as
    /// an interrupted create (nothing in it was reported durable: every fsync in a new workspace
    /// waits for its background sync). A binding that cannot be read is set aside; a workspace
    /// directory whose record cannot be read, or that has none and was made on an earlier boot,
    /// is set aside ([`Self::set_aside_workspace`]); a workspace record without its binding gets
    /// it back, made from the record. (A directory without a record made on this boot is what a
    /// daemon killed during a create leaves: nothing was answered for it, and the next create of
    /// the thread removes it.) Each case is one log line; none stops the daemon.
    pub(super) fn recover_creates(&self) {
        let threads = self.layout.state.join("threads");
        for key in names_in(&threads) {
            let Some(thread) = key.strip_suffix(".json") else {
                continue;
            };
            if validate(NameKind::Thread, thread).is_err() {
                continue;
            }
            if let Err(e) = Binding::load(&self.layout, thread) {
                match Binding::set_aside(&self.layout, thread) {
                    Ok(to) => tracing::warn!(
                        %thread, "unreadable binding ({e}): set aside as {}", to.display()
                    ),
                    Err(err) => tracing::error!(%thread, "unreadable binding ({e}): {err}"),
                }
            }
        }
        let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|b| b.trim().to_string());
        for thread in names_in(&self.layout.workspaces()) {
            if validate(NameKind::Thread, &thread).is_err()
                || !self.layout.workspace(&thread).is_dir()
            {
                continue;
            }
            match WorkspaceRecord::load(&self.layout, &thread) {
                Ok(Some(rec)) => self.rebind(&rec),
                Ok(None) => {
                    let made_on = std::fs::read_to_string(
                        self.layout.workspace(&thread).join("upper").join("boot"),
                    )
                    .ok()
                    .map(|b| b.trim().to_string());
                    if this_boot.is_some() && made_on == this_boot {
                        continue;
                    }
                    self.set_aside_workspace(&thread, "no record, made on an earlier boot");
                }
                Err(e) => {
                    self.set_aside_workspace(&thread, &format!("unreadable record ({e})"));
                }
            }
        }
    }

    /// A project workspace's record without its thread's binding (a power loss kept the one's
    /// rename, not the other's): the binding made again from the record, which says the same
    /// (project, base, branch, owner, I/O mode).
    fn rebind(&self, rec: &WorkspaceRecord) {
        if rec.chat || !matches!(Binding::load(&self.layout, &rec.thread), Ok(None)) {
            return;
        }
        let b = Binding {
            thread: rec.thread.clone(),
            project: rec.project.clone(),
            base_commit: rec.base_commit.clone(),
            branch: rec.branch.clone(),
            created: rec.created,
            owner: rec.owner,
            io: rec.io,
        };
        match b.save(&self.layout) {
            Ok(()) => tracing::warn!(
                thread = %rec.thread, project = %rec.project,
                "a workspace without its binding: bound again from its record"
            ),
            Err(e) => tracing::error!(thread = %rec.thread, "cannot bind the workspace again: {e}"),
        }
    }

    /// Takes an interrupted create's directory out of `<state>/workspaces`: removed if its upper
    /// layer holds no data file, else moved whole to `<state>/quarantine/<thread>.<unix seconds>`
    /// (never deleted: a user may have written in it before the power loss). Logs one line with
    /// `why`; returns what was done, for a message.
    pub(super) fn set_aside_workspace(&self, thread: &str, why: &str) -> String {
        let dir = self.layout.workspace(thread);
        let holds_data = std::fs::read_dir(dir.join("upper").join("data"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        let done = if holds_data {
            let quarantine = self.layout.state.join("quarantine");
            let to = quarantine.join(format!("{thread}.{}", now()));
            match crate::layout::create_private_dir(&quarantine)
                .and_then(|()| std::fs::rename(&dir, &to))
            {
                Ok(()) => format!("set aside in {}", to.display()),
                Err(e) => format!(
                    "left in place (cannot set it aside in {}: {e})",
                    to.display()
                ),
            }
        } else {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => "removed (it held no file)".to_string(),
                Err(e) => format!("left in place (cannot remove it: {e})"),
            }
        };
        tracing::warn!(%thread, "{why}: an interrupted create, {done}");
        done
    }

    /// Drops a workspace that failed to come into being.
    pub(super) fn discard(&self, thread: &str) {
        let core = lock(&self.mounts).get(thread).map(|m| m.core.clone());
        if let Some(core) = core {
            self.settled(&core);
        }
        let _ = self.unmount_thread(thread, true);
        let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
        let _ = std::fs::remove_dir(self.layout.mountpoint(thread));
    }

    /// `octofs sweep`: releases every project workspace idle for `idle` seconds whose state the
    /// mirror has seen; never one with unsaved work, open files, or a chat workspace.
    pub(super) fn sweep(&self, idle: u64) -> Reply<SweepAnswer> {
        let threads: Vec<String> = lock(&self.mounts).keys().cloned().collect();
        let mut released = Vec::new();
        let mut kept = Vec::new();
        for thread in threads {
            let l = self.locks.get(&format!("thread:{thread}"));
            let _g = lock(&l);
            let Some(rec) = WorkspaceRecord::load(&self.layout, &thread)? else {
                continue;
            };
            let Some(core) = lock(&self.mounts).get(&thread).map(|m| m.core.clone()) else {
                continue;
            };
            let (last, open) = core.activity();
            let why = if rec.chat {
                Some("chat workspace")
            } else if open {
                Some("files open")
            } else if now().saturating_sub(last) < idle {
                Some("active")
            } else if rec
                .saved
                .as_ref()
                .is_none_or(|m| core.changed_since(m.generation, m.at, &m.bookkeeping))
            {
                Some("unsaved changes")
            } else {
                None
            };
            if let Some(why) = why {
                kept.push(Kept {
                    thread,
                    why: why.into(),
                });
                continue;
            }
            match self.unmount_thread(&thread, false) {
                Ok(()) => {
                    let _ = std::fs::remove_dir_all(self.layout.workspace(&thread));
                    let _ = std::fs::remove_dir(self.layout.mountpoint(&thread));
                    tracing::info!(%thread, "swept");
                    released.push(thread);
                }
                Err(e) => kept.push(Kept {
                    thread,
                    why: e.to_string(),
                }),
            }
        }
        Ok((SweepAnswer { released, kept }, vec![]))
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

/// The names in `dir` (none if it cannot be read).
fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A record's sync as a job of the daemon's [`at_once`].
fn job(j: SyncJob<crate::records::RecordError>) -> SyncJob<Error> {
    Box::new(move || j().map_err(Error::from))
}

/// What a sync job that never reported (its worker could not start) fails with.
fn lost() -> Error {
    Error::Refused("a durable write failed".into())
}

/// The changes between two trees, as `git diff-tree -r --no-renames` lists them: every file,
/// symlink or gitlink that is gone or changes kind (removals), and every one that is new or
/// changed (additions, in the order of the new tree). Subtrees with equal ids are not read.
#[derive(Default)]
struct TreeDiff {
    removals: Vec<Vec<u8>>,
    additions: Vec<(Vec<u8>, crate::fs::TreeChange)>,
}

impl TreeDiff {
    /// Compares trees `a` and `b`, found at `prefix` (empty, or ending with `/`).
    fn trees(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        a: gix::ObjectId,
        b: gix::ObjectId,
    ) -> std::io::Result<()> {
        if a == b {
            return Ok(());
        }
        let old = store.tree(a)?;
        let new = store.tree(b)?;
        let mut by_name: std::collections::HashMap<&[u8], &TreeEntry> =
            old.iter().map(|e| (&*e.name, e)).collect();
        for e in new.iter() {
            match by_name.remove(&*e.name) {
                None => self.added(store, prefix, e)?,
                Some(o) => self.changed(store, prefix, o, e)?,
            }
        }
        // What only the old tree has, in its order (the order does not matter: removals are
        // sorted before they are applied).
        for o in old.iter() {
            if by_name.contains_key(&*o.name) {
                self.removed(store, prefix, o)?;
            }
        }
        Ok(())
    }

    fn changed(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        o: &TreeEntry,
        e: &TreeEntry,
    ) -> std::io::Result<()> {
        match (o.kind, e.kind) {
            (EntryKind::Tree, EntryKind::Tree) => {
                let len = prefix.len();
                prefix.extend_from_slice(&e.name);
                prefix.push(b'/');
                let r = self.trees(store, prefix, o.id, e.id);
                prefix.truncate(len);
                r
            }
            (EntryKind::Tree, _) | (_, EntryKind::Tree) => {
                self.removed(store, prefix, o)?;
                self.added(store, prefix, e)
            }
            _ if o.kind == e.kind && o.id == e.id => Ok(()),
            _ => {
                // A change of kind (file, symlink, gitlink) is a removal and an addition, as
                // git's type change; a change of content or of the executable bit replaces.
                let class = |k: EntryKind| match k {
                    EntryKind::Blob | EntryKind::Executable => 0,
                    EntryKind::Symlink => 1,
                    EntryKind::Gitlink | EntryKind::Tree => 2,
                };
                if class(o.kind) != class(e.kind) {
                    self.removals.push(join(prefix, &o.name));
                }
                self.additions.push((join(prefix, &e.name), leaf(e)));
                Ok(())
            }
        }
    }

    /// Every leaf at or below `e`, added.
    fn added(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        e: &TreeEntry,
    ) -> std::io::Result<()> {
        let additions = &mut self.additions;
        leaves(store, prefix, e, &mut |path, l| {
            additions.push((path, leaf(l)))
        })
    }

    /// Every leaf at or below `o`, removed.
    fn removed(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        o: &TreeEntry,
    ) -> std::io::Result<()> {
        let removals = &mut self.removals;
        leaves(store, prefix, o, &mut |path, _| removals.push(path))
    }
}

/// Calls `f` with the path and entry of every leaf at or below `e` (`prefix`: its directory's
/// path with a trailing `/`, or empty).
fn leaves(
    store: &ObjectStore,
    prefix: &mut Vec<u8>,
    e: &TreeEntry,
    f: &mut dyn FnMut(Vec<u8>, &TreeEntry),
) -> std::io::Result<()> {
    if e.kind != EntryKind::Tree {
        f(join(prefix, &e.name), e);
        return Ok(());
    }
    let len = prefix.len();
    prefix.extend_from_slice(&e.name);
    prefix.push(b'/');
    let r = store
        .tree(e.id)
        .and_then(|t| t.iter().try_for_each(|c| leaves(store, prefix, c, f)));
    prefix.truncate(len);
    r
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(prefix.len() + name.len());
    p.extend_from_slice(prefix);
    p.extend_from_slice(name);
    p
}

/// What a leaf entry (not a tree) becomes in a workspace.
fn leaf(e: &TreeEntry) -> crate::fs::TreeChange {
    use crate::fs::TreeChange;
    match e.kind {
        EntryKind::Blob => TreeChange::File {
            id: e.id,
            exec: false,
        },
        EntryKind::Executable => TreeChange::File {
            id: e.id,
            exec: true,
        },
        EntryKind::Symlink => TreeChange::Symlink { id: e.id },
        EntryKind::Gitlink | EntryKind::Tree => TreeChange::Gitlink { id: e.id },
    }
}

/// Who still holds `rec`'s thread once `by` releases it: the caller's hold ends; a caller who holds
/// none (root releasing a user's thread) ends the oldest one.
fn after_release(rec: &WorkspaceRecord, by: Option<u32>) -> Vec<u32> {
    let mut holders = rec.holders();
    match by.and_then(|u| holders.iter().position(|h| *h == u)) {
        Some(i) => {
            holders.remove(i);
        }
        None if !holders.is_empty() => {
            holders.remove(0);
        }
        None => {}
    }
    holders
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::TreeChange;
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn write(dir: &Path, path: &str, content: &str) {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
    }

    type Sets = (BTreeSet<Vec<u8>>, BTreeSet<(Vec<u8>, String)>);

    /// Removals and additions as `git diff-tree -r -z --no-renames` lists them (the former
    /// subprocess of `apply_diff`).
    fn by_git(dir: &Path, a: &str, b: &str) -> Sets {
        let out = git(dir, &["diff-tree", "-r", "-z", "--no-renames", a, b]);
        let fields: Vec<&str> = out.split('\0').filter(|s| !s.is_empty()).collect();
        let mut removals = BTreeSet::new();
        let mut additions = BTreeSet::new();
        for pair in fields.chunks(2) {
            let f: Vec<&str> = pair[0].trim_start_matches(':').split(' ').collect();
            let path = pair[1].as_bytes().to_vec();
            if f[4] == "D" || f[4] == "T" {
                removals.insert(path.clone());
            }
            if f[4] != "D" {
                additions.insert((path, format!("{} {}", f[1], f[3])));
            }
        }
        (removals, additions)
    }

    fn by_tree_diff(store: &ObjectStore, a: gix::ObjectId, b: gix::ObjectId) -> Sets {
        let mut d = TreeDiff::default();
        d.trees(store, &mut Vec::new(), a, b).expect("diff");
        let removals = d.removals.into_iter().collect();
        let additions = d
            .additions
            .into_iter()
            .map(|(p, c)| {
                let s = match c {
                    TreeChange::File { id, exec: false } => format!("100644 {id}"),
                    TreeChange::File { id, exec: true } => format!("100755 {id}"),
                    TreeChange::Symlink { id } => format!("120000 {id}"),
                    TreeChange::Gitlink { id } => format!("160000 {id}"),
                    TreeChange::Remove => "remove".into(),
                };
                (p, s)
            })
            .collect();
        (removals, additions)
    }

    /// The in-process diff lists what `git diff-tree -r --no-renames` lists, for every kind of
    /// change a snapshot can hold: content and mode changes, a file that becomes a symlink, a
    /// directory, or a gitlink and back, nested additions and removals, untouched subtrees.
    #[test]
    fn tree_diff_matches_git_diff_tree() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let w = tmp.path();
        git(w, &["init", "-q"]);
        for i in 0..5 {
            write(w, &format!("same/s{i}.txt"), "same\n");
            write(w, &format!("deep/a/b/f{i}.txt"), &format!("{i}\n"));
        }
        write(w, "mod.txt", "old\n");
        write(w, "mode.sh", "#!/bin/sh\n");
        write(w, "to_link", "file\n");
        write(w, "to_dir", "file\n");
        write(w, "from_dir/x/y.txt", "y\n");
        write(w, "from_dir/z.txt", "z\n");
        write(w, "gone/g/h.txt", "h\n");
        write(w, "link_to_file", "placeholder\n");
        write(w, "dir_to_sub/in.txt", "in\n");
        git(w, &["add", "-A"]);
        git(w, &["commit", "-qm", "a"]);
        let a = git(w, &["rev-parse", "HEAD^{tree}"]);
        let old_head = git(w, &["rev-parse", "HEAD"]);

        write(w, "mod.txt", "new\n");
        git(w, &["update-index", "--chmod=+x", "mode.sh"]);
        std::fs::remove_file(w.join("to_link")).expect("rm");
        std::os::unix::fs::symlink("mod.txt", w.join("to_link")).expect("symlink");
        std::fs::remove_file(w.join("to_dir")).expect("rm");
        write(w, "to_dir/inner/file.txt", "inner\n");
        std::fs::remove_dir_all(w.join("from_dir")).expect("rm");
        write(w, "from_dir", "now a file\n");
        std::fs::remove_dir_all(w.join("gone")).expect("rm");
        write(w, "new/n1/n2/added.txt", "added\n");
        write(w, "deep/a/b/f9.txt", "nine\n");
        std::fs::remove_file(w.join("deep/a/b/f0.txt")).expect("rm");
        git(w, &["add", "-A"]);
        git(w, &["rm", "-rq", "--cached", "dir_to_sub"]);
        git(
            w,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{old_head},dir_to_sub"),
            ],
        );
        git(w, &["commit", "-qm", "b"]);
        let b = git(w, &["rev-parse", "HEAD^{tree}"]);

        let store = ObjectStore::open(&w.join(".git")).expect("store");
        let (a_id, b_id) = (
            gix::ObjectId::from_hex(a.as_bytes()).expect("id"),
            gix::ObjectId::from_hex(b.as_bytes()).expect("id"),
        );
        for (x, y, xs, ys) in [(a_id, b_id, &a, &b), (b_id, a_id, &b, &a)] {
            let expected = by_git(w, xs, ys);
            assert!(
                expected.0.len() >= 6 && expected.1.len() >= 6,
                "{expected:?}"
            );
            assert_eq!(by_tree_diff(&store, x, y), expected, "{xs} -> {ys}");
        }
        assert_eq!(by_tree_diff(&store, a_id, a_id), Default::default());
    }
}
