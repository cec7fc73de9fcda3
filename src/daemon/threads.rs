//! A thread's workspace lifecycle (seed 000 "Forking", "Restoring", "Reclaiming", "Binding",
//! "The chat workspace"): open (fork, resume, or share the live mount), release (now, or when the
//! mount's last process has left) and sweep. Saving is `super::snapshot`; carrying a state to a new
//! thread is `super::moves`; making a new workspace is `super::create`, the tree diff a resume
//! applies is `super::tree_diff`, and what a crash during a create leaves is `super::recover`.
//!
//! Policy only: the mechanisms are the filesystem core, `repo` (the workspace's `.git`) and the
//! records of `workspace`. Nothing here runs git in a workspace or reads one through its mount.
//! Every operation on a thread holds that thread's lock, and under it refuses a caller who neither
//! owns the thread nor is root.

use super::create::Fork;
use super::error::Error;
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
            if rec.base_commit != resolved.commit {
                return Err(Error::Refused(format!(
                    "thread {thread} already has a workspace based on {}; --ref {r} applies only when it is created",
                    rec.base_commit.to_hex_with_len(12)
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
