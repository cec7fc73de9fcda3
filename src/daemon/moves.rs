//! A thread's state carried to a new thread (seed 000 "Binding"): `fork` (a parallel attempt from
//! one live state) and `teleport` (binding a new thread to a project at a ref, or carrying the
//! source's state, with its small ignored files, to the thread that lands).
//!
//! Both reuse the save-and-resume machinery: the source is snapshotted (the only change it sees:
//! its saved mark), the state is filed as the new thread's first snapshot under its own
//! `refs/octomate/threads/<to>`, and the new thread is created by the same resume that brings a
//! released thread back — a fork of the shared base with the changed paths referring to the
//! mirror's blobs, never copies of them. Afterwards the two threads share nothing.
//!
//! Policy only, like `threads`: nothing here runs git in a workspace or reads one through its
//! mount. Both threads' locks are held (in name order) for the whole operation.

use super::error::{Context, Error, on_workspace};
use super::guard::LockKey;
use super::proto::Forked;
use super::refusal::{MoveRefusal, SnapshotRefusal};
use super::{Daemon, Reply, lock, now};
use crate::access::Caller;
use crate::git::kept;
use crate::git::posix_record;
use crate::git::snapshot::{self as snap, HeadRef};
use crate::names::{NameKind, validate};
use crate::workspace::{Binding, Owner, WorkspaceRecord};

/// The largest ignored file `teleport` copies across (bigger ones are build output or data the
/// next build or install makes again).
pub(super) const IGNORED_COPY_MAX: u64 = 64 << 10;

/// A small ignored file carried by `teleport`: its path (bytes: any name a file can have), what
/// the core keeps of it besides its content (permission bits with setuid/setgid/sticky, owner,
/// group, modification time, extended attributes) and its content.
struct IgnoredFile {
    path: Vec<u8>,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: std::time::SystemTime,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    bytes: Vec<u8>,
}

/// Which branch the new thread gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BranchRule {
    /// Always one of its own, `octofs/<to>`, at the source's commit (`fork`: two attempts never
    /// share a branch).
    Own,
    /// One of its own when the source is on its thread branch `octofs/<from>`; a branch the agent
    /// chose is kept (`teleport`: the work moves, it does not split).
    KeepChosen,
}

impl Daemon {
    /// `octofs fork <from> <to>`: `to` gets `from`'s current state on a branch of its own.
    pub(super) fn fork(&self, from: &str, to: &str, c: &Caller) -> Reply<Forked> {
        self.carry_state(from, to, BranchRule::Own, false, c)
    }

    /// `octofs teleport <from> <to> [--project P] [--ref R]`.
    pub(super) fn teleport(
        &self,
        from: &str,
        to: &str,
        project: Option<&str>,
        git_ref: Option<&str>,
        c: &Caller,
    ) -> Reply<Forked> {
        let Some(p) = project else {
            if git_ref.is_some() {
                return Err(MoveRefusal::RefNeedsProject.into());
            }
            return self.carry_state(from, to, BranchRule::KeepChosen, true, c);
        };
        validate(NameKind::Thread, from)?;
        validate(NameKind::Thread, to)?;
        validate(NameKind::Project, p)?;
        if from == to {
            return Err(MoveRefusal::TeleportToSource { to: to.to_string() }.into());
        }
        {
            // The source is only the conversation that moves (a chat thread's workspace may be
            // gone already); if it exists, it must be the caller's.
            let thread_lock = self.thread_lock(from)?;
            let _held = thread_lock.owner(c)?;
        }
        {
            let l = self.locks.get(&LockKey::thread(to));
            let _g = lock(&l);
            self.refuse_existing(to)?;
        }
        // The ref is validated before anything changes: a thread that bound and then could not
        // check out would be stuck.
        mirror_require(self, p)?;
        self.check_bind(c, p)?;
        self.store(p)?.resolve(git_ref)?;
        // `open` re-checks all of this under `to`'s lock: a concurrent open of `to` is refused
        // or joined there, never overwritten.
        let (opened, warnings) = self.open(to, Some(p), git_ref, None, c)?;
        let rec = self.live_record(to)?;
        Ok((
            Forked {
                thread: to.into(),
                project: rec.project,
                path: opened.path,
                snapshot: None,
                branch: rec.branch,
                ignored_copied: Vec::new(),
            },
            warnings,
        ))
    }

    /// Refuses a thread that exists (bound, or with a workspace): fork and teleport make new ones.
    fn refuse_existing(&self, to: &str) -> Result<(), Error> {
        if let Some(r) = WorkspaceRecord::load(&self.layout, to)? {
            let to = to.to_string();
            return Err(if r.chat {
                MoveRefusal::ChatExists { to }
            } else {
                MoveRefusal::Bound {
                    to,
                    project: r.project,
                }
            }
            .into());
        }
        if let Some(b) = Binding::load(&self.layout, to)? {
            return Err(MoveRefusal::Bound {
                to: to.to_string(),
                project: b.project,
            }
            .into());
        }
        Ok(())
    }

    /// `fork`, and `teleport` without a project: `from`'s state (its live workspace snapshotted
    /// now, or a released thread's last snapshot) becomes `to`'s first snapshot, and `to` is
    /// resumed from it, owned by the caller.
    fn carry_state(
        &self,
        from: &str,
        to: &str,
        rule: BranchRule,
        copy_ignored: bool,
        c: &Caller,
    ) -> Reply<Forked> {
        let entered = std::time::Instant::now();
        validate(NameKind::Thread, from)?;
        validate(NameKind::Thread, to)?;
        if from == to {
            return Err(MoveRefusal::ToSource { to: to.to_string() }.into());
        }
        // Both threads' locks, always in name order: two crossed forks never deadlock.
        let (a, b) = if from < to { (from, to) } else { (to, from) };
        let la = self.locks.get(&LockKey::thread(a));
        let _ga = lock(&la);
        let lb = self.locks.get(&LockKey::thread(b));
        let _gb = lock(&lb);

        let live = WorkspaceRecord::load(&self.layout, from)?;
        let bound = Binding::load(&self.layout, from)?;
        let (project, owner) = match (&live, &bound) {
            (Some(r), _) if r.chat => {
                self.require_owner(c, from, r.owner)?;
                return Err(MoveRefusal::ChatCarry {
                    from: from.to_string(),
                    to: to.to_string(),
                }
                .into());
            }
            (Some(r), _) => (r.project.clone(), r.owner),
            (None, Some(b)) => (b.project.clone(), b.owner),
            (None, None) => return Err(Error::UnknownThread(from.to_string())),
        };
        self.require_owner(c, from, owner)?;
        self.refuse_existing(to)?;
        self.check_bind(c, &project)?;
        self.check_root()?;
        let me = Owner {
            uid: c.uid,
            gid: c.gid,
        };
        // `to` is a new live thread of the caller's: counted against their cap before anything
        // of it (its first snapshot, its binding) is written.
        let slot = self.reserve_live(to, me.uid)?;

        let started = std::time::Instant::now();
        let checked_in = started.duration_since(entered);
        // 1. The source's state: a snapshot of the live workspace (unchanged since the last one:
        // the same commit, nothing written), or the released thread's last one.
        let state = match &live {
            Some(r) => match self.unchanged_since_saved(r)? {
                Some(s) => Some(s),
                None => {
                    let s = self.snapshot_locked(from)?;
                    Some(
                        gix::ObjectId::from_hex(s.as_bytes())
                            .context(|| format!("snapshot id {s:?}"))?,
                    )
                }
            },
            None => {
                let repo = snap::open(&self.layout.mirror(&project))?;
                snap::read_ref(&repo, &snap::thread_ref(from))
            }
        };
        // The source's config comes along byte for byte only to the same owner, and only when
        // the source's state is its owner's own from this host (`repo_config`).
        let config_own = me.uid == owner.uid
            && state.is_some_and(|s| {
                super::repo_config::trust(&self.layout, from, &s.to_string(), owner.uid)
                    == super::repo_config::Trust::Own
            });
        let saved_in = started.elapsed();
        let ignored = match (&live, copy_ignored) {
            (Some(r), true) => self.small_ignored_files(r)?,
            _ => Vec::new(),
        };

        // 2. Filed as `to`'s first snapshot: same tree and parent, `to`'s branch in its trailer.
        let repo = snap::open(&self.layout.mirror(&project))?;
        let (head, head_ref, tree, posix, record, side) = match state {
            Some(s) => {
                let (tree, parents, message, _) = snap::commit_info(&repo, s)?;
                let head = *parents.first().ok_or(SnapshotRefusal::NoParent)?;
                (
                    head,
                    snap::head_of(&message),
                    tree,
                    posix_record::blob_of(&message),
                    super::repo_record::record_of(&message),
                    kept::side_of(&message),
                )
            }
            None => {
                // Released with nothing saved: its first base, unchanged.
                let b = bound.as_ref().ok_or(MoveRefusal::NoBinding)?;
                let head = b.base_commit;
                let (tree, _, _, _) = snap::commit_info(&repo, head)?;
                let head_ref = b
                    .branch
                    .clone()
                    .map(HeadRef::Branch)
                    .unwrap_or(HeadRef::Detached);
                (head, head_ref, tree, None, None, None)
            }
        };
        let own = format!("octofs/{to}");
        let head_ref = match head_ref {
            HeadRef::Branch(b)
                if rule == BranchRule::KeepChosen && b != format!("octofs/{from}") =>
            {
                HeadRef::Branch(b)
            }
            HeadRef::Branch(_) => HeadRef::Branch(own),
            HeadRef::Detached => HeadRef::Detached,
        };
        // The source's repository (refs, stash, config) comes along, without the source's own
        // branch: `to` has its own.
        let record = record
            .map(|r| {
                super::repo_record::without_ref(&repo, r, &format!("refs/heads/octofs/{from}"), to)
            })
            .transpose()?;
        let mut message = snap::message(to, &head_ref, &snap::SnapshotOwner::local(me.uid));
        if let Some(b) = posix {
            message.push_str(&posix_record::trailer(b));
        }
        if let Some(r) = record {
            message.push_str(&super::repo_record::trailer(r));
        }
        if let Some(s) = side {
            message.push_str(&kept::trailer(s));
        }
        let commit = snap::write_commit(&repo, tree, vec![head], &message)?;
        if let Some(b) = posix {
            posix_record::keep(&repo, to, commit, b)?;
        }
        if let Some(r) = record {
            super::repo_record::set_ref(&repo, to, r)?;
        }
        if let Some(s) = side {
            kept::keep(&repo, to, commit, s)?;
        }
        let tref = snap::thread_ref(to);
        snap::cas_ref(
            &repo,
            &tref,
            None,
            commit,
            &format!("octofs: state of {from} carried to {to}"),
        )?;
        if config_own {
            super::repo_config::mark_own(&self.layout, to, &commit.to_string(), me.uid);
        } else {
            super::repo_config::forget(&self.layout, to);
        }

        // 3. `to` resumes from it, exactly as a released thread does.
        let branch = match &head_ref {
            HeadRef::Branch(b) => Some(b.clone()),
            HeadRef::Detached => None,
        };
        let binding = Binding {
            thread: to.into(),
            project: project.clone(),
            base_commit: head,
            branch: branch.clone(),
            created: now(),
            owner: me,
            // The new thread works as the one it came from.
            io: Binding::load(&self.layout, from)
                .ok()
                .flatten()
                .and_then(|b| b.io),
        };
        let filed_in = started.elapsed();
        // The binding is made durable with the workspace, in the same grouped syncs, as `open`
        // does with a new thread's (`create_with`); nothing of either is left when one fails.
        let made = binding
            .stage(&self.layout)
            .map_err(Error::from)
            .and_then(|staged| {
                let fork = self.resume_fork(to, &binding)?;
                self.create_with(to, fork, me, Some(staged))
            });
        if made.is_err() {
            Binding::remove(&self.layout, to);
            super::repo_config::forget(&self.layout, to);
        }
        let left_out = match made {
            Ok(w) => w,
            Err(e) => {
                // Nothing of `to` remains: its refs go with it (a later `open` of the name starts
                // a chain of its own).
                self.drop_refs(&project, to, commit, posix.is_some());
                return Err(e);
            }
        };
        slot.keep();
        let made_in = started.elapsed();
        let mut warnings = left_out;
        warnings.extend(self.grant_owner(&project, me, false));
        warnings.extend(self.share_thread(&project, to, commit).map(|u| u.why));
        let mut copied = Vec::new();
        if !ignored.is_empty() {
            let who = super::posix::authority(&me);
            match self.put_ignored(to, &ignored, &who) {
                Ok((c, left)) => {
                    copied = c;
                    warnings.extend(super::posix::left_out_warnings(
                        "the small ignored files",
                        &who,
                        &left,
                    ));
                }
                Err(e) => warnings.push(format!("the small ignored files were not copied: {e}")),
            }
        }
        tracing::info!(
            %from, %to, %commit,
            checked_ms = checked_in.as_millis() as u64,
            source_saved_ms = saved_in.as_millis() as u64,
            filed_ms = filed_in.as_millis() as u64,
            made_ms = made_in.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "carried a thread's state (ms since the checks)"
        );
        Ok((
            Forked {
                thread: to.into(),
                project,
                path: self.layout.mountpoint(to).display().to_string(),
                snapshot: Some(commit.to_string()),
                branch,
                ignored_copied: copied,
            },
            warnings,
        ))
    }

    /// The last snapshot of a live workspace when nothing in it changed since (no write, no file
    /// open for writing, its ref still there): what a new snapshot would be, without reading the
    /// changes again (a fork of a workspace saved at the end of its turn, or forked twice).
    pub(super) fn unchanged_since_saved(
        &self,
        rec: &WorkspaceRecord,
    ) -> Result<Option<gix::ObjectId>, Error> {
        let Some(mark) = &rec.saved else {
            return Ok(None);
        };
        let Some(commit) = mark.commit else {
            return Ok(None);
        };
        let Some(core) = lock(&self.mounts).get(&rec.thread).map(|m| m.core.clone()) else {
            return Ok(None);
        };
        if core.changed_since(mark.generation, mark.at, &mark.bookkeeping) {
            return Ok(None);
        }
        let repo = snap::open(&self.layout.mirror(&rec.project))?;
        Ok(
            (snap::read_ref(&repo, &snap::thread_ref(&rec.thread)) == Some(commit))
                .then_some(commit),
        )
    }

    /// The small ignored files of a live workspace: (path, mode, content) of every regular file
    /// that matches an ignore rule itself (not inside an ignored directory) and holds at most
    /// [`IGNORED_COPY_MAX`] bytes. Read through the core, never the mount; symlinks are not files.
    fn small_ignored_files(&self, rec: &WorkspaceRecord) -> Result<Vec<IgnoredFile>, Error> {
        use std::io::Read as _;
        let core = self.core_of(rec)?;
        let view = core
            .view()
            .map_err(on_workspace("cannot read the workspace's changes"))?;
        let paths =
            crate::own_repo::add_all::ignored_files(&core, &self.layout.state, &view.edits)?;
        let meta: std::collections::HashMap<&[u8], &crate::fs::NodeMeta> =
            view.meta.iter().map(|m| (m.path.as_slice(), m)).collect();
        // Nested repositories and names git refuses travel whole in the snapshot's kept side.
        let kept = super::kept::roots_in(&view.edits);
        let mut out = Vec::new();
        for p in paths {
            if super::kept::is_kept(&kept, &p) {
                continue;
            }
            let comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            let Some(f) = core
                .open_file(&comps)
                .map_err(on_workspace("cannot read an ignored file"))?
            else {
                continue;
            };
            let mut bytes = Vec::new();
            f.take(IGNORED_COPY_MAX + 1)
                .read_to_end(&mut bytes)
                .context(|| format!("cannot read {}", String::from_utf8_lossy(&p)))?;
            if bytes.len() as u64 > IGNORED_COPY_MAX {
                continue;
            }
            // What the core presents for it (never followed: `open_file` found a regular file).
            let Some(attr) = core
                .attr_at(&comps)
                .map_err(on_workspace("cannot read an ignored file's attributes"))?
            else {
                continue;
            };
            let xattrs = meta
                .get(p.as_slice())
                .map(|m| m.xattrs.clone())
                .unwrap_or_default();
            out.push(IgnoredFile {
                mode: u32::from(attr.perm) & 0o7777,
                uid: attr.uid,
                gid: attr.gid,
                mtime: attr.mtime,
                xattrs,
                bytes,
                path: p,
            });
        }
        Ok(out)
    }

    /// Writes `files` into `to`'s live workspace through its core (directories made as needed),
    /// each with its owner, group, mode, modification time and extended attributes, and tells the
    /// kernel. Returns the paths written (a name that is not UTF-8 shown lossily).
    /// Owner, group, mode bits and extended attributes are what `who` (the new thread's owner)
    /// could set by themselves (`posix::admit`, as for a record); returns the paths written and
    /// what was left out of them.
    fn put_ignored(
        &self,
        to: &str,
        files: &[IgnoredFile],
        who: &Caller,
    ) -> Result<(Vec<String>, Vec<super::posix::LeftOut>), Error> {
        let rec = self.live_record(to)?;
        let core = self.core_of(&rec)?;
        let mut done = Vec::new();
        let mut left = Vec::new();
        for f in files {
            let shown = String::from_utf8_lossy(&f.path).into_owned();
            let asked = posix_record::PosixEntry {
                path: f.path.clone(),
                kind: posix_record::PosixKind::File,
                mode: f.mode,
                uid: f.uid,
                gid: f.gid,
                rdev: 0,
                xattrs: f.xattrs.clone(),
                link: None,
            };
            let admitted = super::posix::admit(&asked, who);
            if !admitted.left_out.is_empty() {
                left.push((f.path.clone(), admitted.left_out));
            }
            // (A file is never left out whole but for a path no workspace holds.)
            let Some(m) = admitted.entry else { continue };
            let mut comps: Vec<&[u8]> = f.path.split(|b| *b == b'/').collect();
            let Some(name) = comps.pop() else { continue };
            let ino = core
                .put_bytes_quietly(&comps, name, &f.bytes)
                .map_err(on_workspace(format!("cannot write {shown}")))?;
            // Owner first, then the mode (a change of owner never widens what the mode says).
            let set = crate::fs::SetAttr {
                uid: Some(m.uid),
                gid: Some(m.gid),
                ..Default::default()
            };
            core.setattr(ino, set)
                .map_err(on_workspace(format!("cannot set the owner of {shown}")))?;
            for (k, v) in &m.xattrs {
                use std::os::unix::ffi::OsStrExt as _;
                core.setxattr(ino, std::ffi::OsStr::from_bytes(k), v, 0)
                    .map_err(on_workspace(format!(
                        "cannot set the extended attribute {} of {shown}",
                        String::from_utf8_lossy(k)
                    )))?;
            }
            let set = crate::fs::SetAttr {
                mode: Some(m.mode),
                mtime: Some(crate::fs::SetTime::At(f.mtime)),
                ..Default::default()
            };
            core.setattr(ino, set)
                .map_err(on_workspace(format!("cannot set the mode of {shown}")))?;
            done.push(shown);
        }
        self.tell_kernel(to);
        Ok((done, left))
    }

    /// Removes the refs a failed carry filed for `to` (only if they still are what it wrote).
    fn drop_refs(&self, project: &str, to: &str, commit: gix::ObjectId, posix: bool) {
        let mirror = self.layout.mirror(project);
        let mut refs = vec![(snap::thread_ref(to), Some(commit.to_string()))];
        if posix {
            refs.push((posix_record::posix_ref(to), None));
        }
        refs.push((super::repo_record::repo_ref(to), None));
        // (Deleting a ref that was never made is harmless.)
        refs.push((kept::kept_ref(to), None));
        for (name, expected) in refs {
            let mut git = crate::git::Git::new(Some(&mirror)).args(["update-ref", "-d", &name]);
            if let Some(e) = expected {
                git = git.args([e]);
            }
            if let Err(e) = git.output_bytes() {
                tracing::warn!(thread = %to, "cannot remove {name} after a failed fork: {e}");
            }
        }
    }
}

fn mirror_require(d: &Daemon, project: &str) -> Result<(), Error> {
    crate::git::mirror::require(&d.layout, project)?;
    Ok(())
}
