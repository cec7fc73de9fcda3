//! A thread's workspace lifecycle (seed 000 "Forking", "Restoring", "Reclaiming", "Binding",
//! "The chat workspace"): open (fork, resume, or share the live mount), release (now, or when the
//! mount's last process has left) and sweep. Saving is `super::snapshot`; carrying a state to a new
//! thread is `super::moves`; making a new workspace is `super::create`, the tree diff a resume
//! applies is `super::tree_diff`, and what a crash during a create leaves is `super::recover`.
//!
//! Each operation gathers the facts its decision needs (records, the caller, whether the kernel
//! has the mount, busy, idle times), lets `super::lifecycle` decide — every refusal is decided
//! there, before anything is written — and carries the plan out. The mechanisms are the
//! filesystem core, `repo` (the workspace's `.git`) and the records of `workspace`. Nothing here
//! runs git in a workspace or reads one through its mount. Every operation on a thread holds that
//! thread's lock, and under it refuses a caller who neither owns the thread nor is root.

use super::create::Fork;
use super::error::Error;
use super::guard::LockKey;
use super::lifecycle::open::{self, CreatePlan, OpenPlan};
use super::lifecycle::release::{
    self, Busy, IdleWait, ReleaseFacts, ReleasePlan, WhenIdleFacts, WhenIdlePlan,
};
use super::lifecycle::sweep::{self, SweepFacts};
use super::mirrors::BLANK;
use super::proto::{Kept, Opened, ReleaseAnswer, SweepAnswer};
use super::{Daemon, Reply, lock, now};
use crate::access::{Caller, user_label};
use crate::fs::WorkspaceFs;
use crate::git::mirror;
use crate::names::{NameKind, validate};
use crate::workspace::{Binding, WorkspaceRecord};
use std::sync::Arc;

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
        let l = self.locks.get(&LockKey::thread(thread));
        let _g = lock(&l);
        let binding = Binding::load(&self.layout, thread)?;
        let live = WorkspaceRecord::load(&self.layout, thread)?;
        let admin = self.is_admin(c);
        // The facts the decision needs, read (a failed read is reported where it matters).
        let access = open::access_needed(
            admin,
            open::bound_project(live.as_ref(), binding.as_ref(), project),
        )
        .map(|p| {
            mirror::require(&self.layout, p)
                .map(|p| p.access)
                .map_err(Error::from)
        });
        let ref_commit = live.as_ref().zip(git_ref).map(|(rec, r)| {
            self.store(&rec.project)
                .and_then(|s| Ok(s.resolve(Some(r))?.commit))
        });
        // Served means the kernel has the mount, not only that the daemon has a session: a mount
        // taken away behind the daemon is let go and mounted again below.
        let mount = match &live {
            Some(_) => open::Mount {
                served: self.kernel_has(thread),
                mode: lock(&self.mounts).get(thread).map(|m| m.io.mode),
            },
            None => open::Mount::default(),
        };
        let plan = open::decide_open(open::OpenFacts {
            thread,
            caller: c,
            admin,
            binding: binding.as_ref(),
            live: live.as_ref(),
            project,
            git_ref,
            io,
            access,
            ref_commit,
            mount,
        })?;
        let owner = match (&live, &binding) {
            (Some(r), _) => r.owner,
            (None, Some(b)) => b.owner,
            (None, None) => crate::workspace::Owner {
                uid: c.uid,
                gid: c.gid,
            },
        };
        let path = Opened {
            path: self.layout.mountpoint(thread).display().to_string(),
        };
        if let (Some(mut rec), OpenPlan::Join(users) | OpenPlan::Remount(users)) = (live, &plan) {
            // One more user of the live workspace, counted in its record so that a restart keeps
            // the count. A record the daemon serves (or should: its remount failed) keeps its users.
            let remount = matches!(plan, OpenPlan::Remount(_));
            if remount {
                // A session whose mount the kernel no longer has is let go first.
                self.forget_lost_mount(thread)?;
            }
            let before = rec.clone();
            if users.cancels_pending {
                tracing::info!(%thread, "pending release cancelled by open");
            }
            rec.io = users.io;
            rec.set_holders(users.holders.clone());
            rec.release_when_idle = false;
            rec.mounted = true;
            rec.save(&self.layout)?;
            let mut notes = Vec::new();
            if remount {
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
        let fork = match open::decide_create(thread, binding.as_ref(), project, git_ref)? {
            CreatePlan::Resume(b) => {
                let mut fork = self.resume_fork(thread, b)?;
                if io.is_some() {
                    fork.io = io;
                }
                fork
            }
            CreatePlan::Fork(p) => {
                let proj = mirror::require(&self.layout, p)?;
                let base = self.store(p)?.resolve(git_ref)?;
                // HEAD goes on the branch the caller named, else on a branch of the thread's own.
                let branch = open::fork_branch(thread, git_ref, base.branch.clone());
                Fork {
                    project: proj.project,
                    base_commit: base.commit,
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
            CreatePlan::Chat => {
                self.ensure_blank()?;
                let base = self.store(BLANK)?.resolve(None)?;
                Fork {
                    project: BLANK.into(),
                    base_commit: base.commit,
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
            base_commit: fork.base_commit,
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
        let tl = self.thread_lock(thread)?;
        let _held = tl.owner(c)?;
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
        let live = WorkspaceRecord::load(&self.layout, thread)?;
        let bound = live.is_none() && Binding::load(&self.layout, thread)?.is_some();
        let mountpoint = self.layout.mountpoint(thread);
        let mut facts = ReleaseFacts {
            thread,
            live: live.as_ref(),
            bound,
            by,
            force,
            discard,
            served: lock(&self.mounts).contains_key(thread),
            busy: Busy::NotAsked,
            mountpoint: &mountpoint,
        };
        if release::busy_matters(&facts) {
            facts.busy = self.busy(&mountpoint);
        }
        let plan = release::decide_release(&facts)?;
        let answer = |released, already| ReleaseAnswer {
            thread: thread.into(),
            released,
            already,
            users: None,
            user_names: Vec::new(),
            snapshot: None,
            pending: false,
        };
        let (save, force) = match plan {
            ReleasePlan::Already => return Ok((answer(true, true), vec![])),
            ReleasePlan::DropHolder { holders } => {
                let Some(mut rec) = live else {
                    return Err(Error::UnknownThread(thread.to_string()));
                };
                let names = holders.iter().map(|u| user_label(*u)).collect();
                rec.set_holders(holders);
                rec.save(&self.layout)?;
                return Ok((
                    ReleaseAnswer {
                        users: Some(rec.users),
                        user_names: names,
                        ..answer(false, false)
                    },
                    vec![],
                ));
            }
            ReleasePlan::SaveAndUnmount { force } => (true, force),
            ReleasePlan::Unmount { force } => (false, force),
            ReleasePlan::Discard => (false, true),
        };
        // A workspace created moments ago: its background sync ends before it is taken apart.
        let core = lock(&self.mounts).get(thread).map(|m| m.core.clone());
        if let Some(core) = core {
            self.settled(&core);
        }
        let mut warnings = Vec::new();
        let saved = if save {
            let (s, unshared) = self.snapshot_locked_shared(thread)?;
            warnings.extend(unshared.map(|u| u.why));
            Some(s)
        } else {
            None
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
                snapshot: saved,
                ..answer(true, false)
            },
            warnings,
        ))
    }

    /// Whether a process uses the mount at `mountpoint`, as a release asks: a process on its way
    /// out (git's detached maintenance after a commit) is waited for, up to a second; then the
    /// copies of the mount elsewhere (a sandbox's bind), also given up to a second to go: a
    /// sandbox being set up anywhere on the host holds a copy of every mount for a moment
    /// (bubblewrap's `/oldroot` between its `pivot_root` and the detach of the old root).
    fn busy(&self, mountpoint: &std::path::Path) -> Busy {
        if self
            .mounter
            .is_busy_settled(mountpoint, std::time::Duration::from_secs(1))
        {
            return Busy::InUse;
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            match self.mounter.bound_elsewhere(mountpoint) {
                None => return Busy::Idle,
                Some((pid, at)) if std::time::Instant::now() >= until => {
                    return Busy::Elsewhere { pid, at };
                }
                Some(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
            }
        }
    }

    /// `octofs release <thread> --when-idle`: answers at once. A user who is not the last one
    /// releases as usual (one user fewer); the last one's release waits until no process uses the
    /// mount (no open file, mapping, working or root directory inside), then happens as a plain
    /// release (saved, unmounted, dropped). A mount nobody uses is released now. `open` cancels a
    /// pending release.
    pub(super) fn release_when_idle(&self, thread: &str, c: &Caller) -> Reply<ReleaseAnswer> {
        let tl = self.thread_lock(thread)?;
        let _held = tl.owner(c)?;
        let live = WorkspaceRecord::load(&self.layout, thread)?;
        let mut facts = WhenIdleFacts {
            live: live.as_ref(),
            by: c.uid,
            served: lock(&self.mounts).contains_key(thread),
            in_use: None,
        };
        if release::in_use_matters(&facts) {
            // Idle now (checked once: a second check in a row would unmount it behind us).
            facts.in_use = Some(self.in_use(thread));
        }
        match (release::decide_when_idle(&facts), live) {
            (WhenIdlePlan::Release, _) | (_, None) => {
                self.release_locked(thread, false, false, Some(c.uid))
            }
            (WhenIdlePlan::ReleaseNow, _) => self.release_locked(thread, true, false, Some(c.uid)),
            (WhenIdlePlan::Pending, Some(mut rec)) => {
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
        }
    }

    /// Whether a process uses the thread's mount: on the host (its cwd, root, open files or
    /// mappings) or through a copy of the mount elsewhere, such as a sandbox's bind
    /// (`sys::bound_elsewhere`).
    fn in_use(&self, thread: &str) -> bool {
        let at = self.layout.mountpoint(thread);
        // The copies first: an idle answer of `is_busy` marks the mount expired, and a second one
        // in a row would unmount it.
        self.mounter.bound_elsewhere(&at).is_some() || self.mounter.is_busy(&at)
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
            let l = self.locks.get(&LockKey::thread(&thread));
            let _g = lock(&l);
            let rec = WorkspaceRecord::load(&self.layout, &thread)
                .ok()
                .flatten()
                .filter(|r| r.release_when_idle);
            let served = lock(&self.mounts).contains_key(&thread);
            let in_use = (rec.is_some() && served).then(|| self.in_use(&thread));
            match release::idle_wait(rec.is_some(), served, in_use) {
                // Released, cancelled by an open, or unreadable: nothing waits any more.
                IdleWait::Gone => {
                    lock(&self.idle_waits).remove(&thread);
                    continue;
                }
                IdleWait::Wait => continue,
                IdleWait::Release => {}
            }
            lock(&self.idle_waits).remove(&thread);
            match self.release_locked(&thread, true, false, None) {
                Ok(_) => {
                    tracing::info!(%thread, "released when idle");
                    released.push(thread);
                }
                Err(e) => {
                    tracing::warn!(%thread, "release when idle failed: {e}; the workspace stays");
                    if let Some(mut rec) = rec {
                        rec.release_when_idle = false;
                        let _ = rec.save(&self.layout);
                    }
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
            let l = self.locks.get(&LockKey::thread(&thread));
            let _g = lock(&l);
            let Some(rec) = WorkspaceRecord::load(&self.layout, &thread)? else {
                continue;
            };
            let Some(core) = lock(&self.mounts).get(&thread).map(|m| m.core.clone()) else {
                continue;
            };
            let (last_activity, files_open) = core.activity();
            let mut facts = SweepFacts {
                chat: rec.chat,
                files_open,
                last_activity,
                now: now(),
                unsaved: None,
            };
            if sweep::unsaved_matters(&facts, idle) {
                facts.unsaved = Some(
                    rec.saved
                        .as_ref()
                        .is_none_or(|m| core.changed_since(m.generation, m.at, &m.bookkeeping)),
                );
            }
            if let Some(why) = sweep::verdict(&facts, idle) {
                kept.push(Kept {
                    thread,
                    why: why.to_string(),
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

#[cfg(test)]
#[path = "threads_tests.rs"]
mod tests;
