//! Snapshot assembly (seed 000 "Saving"): the one place a workspace becomes a commit of its
//! project's mirror. From the core's consistent view of what changed, through what `git add -A`
//! would keep (ignore rules, nested repositories as gitlinks), to a tree, the agent's own commits
//! carried into the mirror, the POSIX record of what the tree cannot hold, the commit and the
//! compare-and-swap of `refs/octomate/threads/<thread>`. Dependency layers are left out (see
//! `layers`): a snapshot is built from the real base tree, never the grafted view root.
//!
//! Also the named snapshots: `refs/snapshots/<name>` of the mirror (and only there), a chain of
//! its own next to the thread's, pushed to a remote on request; and, after every snapshot, the
//! push to the project's share remote (`super::share`).
//!
//! Reads the workspace only through its core (never through the mount, never with git);
//! writes only the mirror's objects and the thread's refs, the named snapshots' refs, and the
//! workspace's `.git/refs/octomate/saved` mark.

use super::error::{Context, Error, on_workspace};
use super::proto::{NamedSnapshot, Snapshotted};
use super::refusal::{ChatOp, Refusal, SnapshotRefusal};
use super::{Daemon, Reply};
use crate::access::Caller;
use crate::cow::catalog::Ts;
use crate::fs::WorkspaceFs;
use crate::git::kept;
use crate::git::mirror::Shared;
use crate::git::posix_record;
use crate::git::snapshot::{self as snap, HeadRef, ViewEdit};
use crate::names::{NameKind, validate};
use crate::own_repo::{add_all, carry};
use crate::workspace::{SavedMark, WorkspaceRecord};

/// The ref of the named snapshot `name` in a mirror.
pub(super) fn named_ref(name: &str) -> String {
    format!("refs/snapshots/{name}")
}

/// A snapshot name: one component of a git ref (the rules of a thread's name).
pub(super) fn check_snapshot_name(name: &str) -> Result<(), Error> {
    validate(NameKind::Thread, name).map_err(|_| {
        SnapshotRefusal::BadName {
            name: name.to_string(),
        }
        .into()
    })
}

/// Nested repositories (a directory holding `.git`) become gitlinks at their HEAD, as `git add -A`
/// records them; one without a commit is left out.
fn nested_repositories(core: &WorkspaceFs, edits: Vec<ViewEdit>) -> Vec<ViewEdit> {
    let mut nested: Vec<Vec<u8>> = Vec::new();
    for e in &edits {
        let comps: Vec<&[u8]> = e.path().split(|b| *b == b'/').collect();
        if let Some(i) = comps.iter().position(|c| *c == b".git")
            && i > 0
        {
            let dir = comps[..i].join(&b'/');
            if !nested.contains(&dir) {
                nested.push(dir);
            }
        }
    }
    if nested.is_empty() {
        return edits;
    }
    let inside = |p: &[u8], d: &[u8]| p == d || (p.starts_with(d) && p.get(d.len()) == Some(&b'/'));
    let mut out: Vec<ViewEdit> = edits
        .into_iter()
        .filter(|e| {
            matches!(e, ViewEdit::AddedDir { .. }) || !nested.iter().any(|d| inside(e.path(), d))
        })
        .collect();
    for dir in nested {
        let mut comps: Vec<&[u8]> = dir.split(|b| *b == b'/').collect();
        comps.push(b".git");
        if let Ok((id, _)) = read_head_at(core, &comps) {
            out.push(ViewEdit::Remove { path: dir.clone() });
            out.push(ViewEdit::Gitlink { path: dir, id });
        }
    }
    out
}

/// Where HEAD of a workspace is: its commit and its branch (or detached), read through the core.
pub(super) fn read_head(core: &WorkspaceFs) -> Result<(gix::ObjectId, HeadRef), Error> {
    read_head_at(core, &[b".git"])
}

/// The most a ref file (`HEAD`, a loose ref) or one line of `packed-refs` may hold. Real ones are
/// one short line; the agent controls these files, and a sparse one of gigabytes costs it nothing,
/// so nothing larger is read into the daemon's memory or shown in a message.
const REF_LINE_MAX: u64 = 4096;

/// HEAD of the repository whose git directory is at `git_dir` (path components in the workspace).
fn read_head_at(core: &WorkspaceFs, git_dir: &[&[u8]]) -> Result<(gix::ObjectId, HeadRef), Error> {
    use std::io::{BufRead as _, Read as _};
    let open = |rel: &[&[u8]]| {
        let p: Vec<&[u8]> = git_dir.iter().chain(rel).copied().collect();
        core.open_file(&p).map_err(on_workspace("cannot read .git"))
    };
    let read = |rel: &[&[u8]], shown: &str| -> Result<Option<Vec<u8>>, Error> {
        let Some(f) = open(rel)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        f.take(REF_LINE_MAX + 1)
            .read_to_end(&mut out)
            .context(|| format!("cannot read .git/{shown}"))?;
        if out.len() as u64 > REF_LINE_MAX {
            return Err(SnapshotRefusal::RefTooLarge {
                path: shown.to_string(),
                max: REF_LINE_MAX,
            }
            .into());
        }
        Ok(Some(out))
    };
    let head = read(&[b"HEAD"], "HEAD")?.ok_or(SnapshotRefusal::NoHead)?;
    let head = String::from_utf8_lossy(&head).trim().to_string();
    let parse = |s: &str| {
        gix::ObjectId::from_hex(s.trim().as_bytes())
            .context(|| format!("bad object id {s:?} in .git"))
    };
    let Some(name) = head.strip_prefix("ref: ") else {
        return Ok((parse(&head)?, HeadRef::Detached));
    };
    let comps: Vec<&[u8]> = name.split('/').map(str::as_bytes).collect();
    let branch = name.strip_prefix("refs/heads/").map(str::to_string);
    let head_ref = branch.map(HeadRef::Branch).unwrap_or(HeadRef::Detached);
    if let Some(loose) = read(&comps, name)? {
        return Ok((parse(&String::from_utf8_lossy(&loose))?, head_ref));
    }
    // packed-refs may be long (every branch and tag of the mirror): read line by line, each
    // bounded.
    if let Some(f) = open(&[b"packed-refs"])? {
        let mut rd = std::io::BufReader::new(f);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut rd)
                .take(REF_LINE_MAX + 1)
                .read_until(b'\n', &mut line)
                .context(|| "cannot read .git/packed-refs".to_string())?;
            if n == 0 {
                break;
            }
            if n as u64 > REF_LINE_MAX {
                return Err(SnapshotRefusal::PackedRefsLine { max: REF_LINE_MAX }.into());
            }
            let line = String::from_utf8_lossy(&line);
            if let Some((oid, n)) = line.trim_end_matches(['\n', '\r']).split_once(' ')
                && n == name
            {
                return Ok((parse(oid)?, head_ref));
            }
        }
    }
    Err(SnapshotRefusal::Unborn {
        name: name.to_string(),
    }
    .into())
}

/// How far [`Daemon::assemble`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Goal {
    /// The tree only (written to the mirror's objects; no commit, no ref): `diff`.
    Tree,
    /// The thread's next snapshot: commit, POSIX record, ref and saved mark.
    Snapshot,
}

impl Daemon {
    /// `octofs snapshot`: saves the working state; returns the snapshot commit (an error naming
    /// the divergence when the project's share remote refused it: the snapshot is saved).
    pub(super) fn snapshot(&self, thread: &str, c: &Caller) -> Reply<Snapshotted> {
        let thread_lock = self.thread_lock(thread)?;
        let _held = thread_lock.owner(c)?;
        // Saved either way; a share remote that refused it fails the command (after the save). A
        // share that is merely ahead of it (behind) is a note.
        let (commit, unshared) = self.snapshot_locked_shared(thread)?;
        match unshared {
            Some(u) if !u.behind => Err(SnapshotRefusal::Unshared { why: u.why }.into()),
            u => Ok((
                Snapshotted { commit },
                u.map(|u| u.why).into_iter().collect(),
            )),
        }
    }

    /// Snapshot with the thread's lock held (`snapshot`, `release`): the thread's next snapshot
    /// commit. A snapshot the project's share remote refused is saved all the same (and the
    /// refusal logged).
    pub(super) fn snapshot_locked(&self, thread: &str) -> Result<String, Error> {
        self.snapshot_locked_shared(thread).map(|(c, _)| c)
    }

    /// [`Self::snapshot_locked`], also answering why the snapshot was not shared (the project has a
    /// share remote that diverged or cannot be reached); the snapshot is saved either way.
    pub(super) fn snapshot_locked_shared(
        &self,
        thread: &str,
    ) -> Result<(String, Option<super::share::Unshared>), Error> {
        let mut rec = self.live_record(thread)?;
        if rec.chat {
            return Err(Refusal::Chat {
                thread: thread.to_string(),
                op: ChatOp::Snapshot,
            }
            .into());
        }
        let project = rec.project.clone();
        let id = super::metrics::timed(super::metrics::Kind::Snapshot, &project, || {
            self.assemble(&mut rec, Goal::Snapshot)
        })?;
        let unshared = self.share_thread(&rec.project, thread, id);
        Ok((id.to_string(), unshared))
    }

    /// `octofs snapshot <thread> [--name N [--push REMOTE]]`: the thread's snapshot, filed also as
    /// the named snapshot `refs/snapshots/N`, and that one pushed to REMOTE as a fast-forward. A
    /// remote that diverged, or a share remote that refused the thread's snapshot, fails the
    /// command after everything local was saved.
    pub(super) fn snapshot_named(
        &self,
        thread: &str,
        name: Option<&str>,
        push: Option<&str>,
        c: &Caller,
    ) -> Reply<NamedSnapshot> {
        let thread_lock = self.thread_lock(thread)?;
        if let Some(n) = name {
            check_snapshot_name(n)?;
        }
        if push.is_some() && name.is_none() {
            return Err(SnapshotRefusal::PushNeedsName.into());
        }
        let _held = thread_lock.owner(c)?;
        let (snapshot, unshared) = self.snapshot_locked_shared(thread)?;
        let project = self.live_record(thread)?.project;
        let id = gix::ObjectId::from_hex(snapshot.as_bytes())
            .context(|| format!("snapshot id {snapshot:?}"))?;
        let mirror = self.layout.mirror(&project);
        let target = push
            .map(|r| {
                crate::git::mirror::push_target(&self.layout, &project, Some(r), self.far_side(c))
            })
            .transpose()?;
        // The chain continues where the remote has it: a host that resumed the thread (from a
        // share, or a pull) and has not seen the name's latest commit files its snapshot on top of
        // the remote's, not beside it.
        if let (Some(n), Some(t)) = (name, &target) {
            self.follow_remote_name(&mirror, t, n)?;
        }
        let named = name
            .map(|n| self.file_named(&project, thread, id, n))
            .transpose()?;
        if let (Some(n), Some(r), Some(target), Some(commit)) = (name, push, &target, named) {
            let full = named_ref(n);
            match crate::git::mirror::push_ref(&mirror, target, commit, &full, &[])? {
                Shared::Pushed | Shared::Already | Shared::Behind(_) => {
                    tracing::info!(%thread, snapshot = %n, %commit, "named snapshot pushed");
                }
                Shared::Diverged(theirs) => {
                    return Err(SnapshotRefusal::Diverged {
                        name_ref: full,
                        remote: r.to_string(),
                        theirs,
                        commit,
                    }
                    .into());
                }
            }
        }
        let mut notes = Vec::new();
        match unshared {
            Some(u) if !u.behind => return Err(SnapshotRefusal::Unshared { why: u.why }.into()),
            Some(u) => notes.push(u.why),
            None => {}
        }
        Ok((
            NamedSnapshot {
                commit: named.unwrap_or(id).to_string(),
                snapshot,
                name: name.map(str::to_string),
                pushed: push.map(str::to_string),
            },
            notes,
        ))
    }

    /// Before a named snapshot is filed and pushed: the remote's `refs/snapshots/<name>` is
    /// fetched (into `refs/octomate/pulled/<name>`, as `pull` does), and the mirror's own ref of
    /// the name moves to it when it has none or is an ancestor of it (a fast-forward), so the
    /// next commit of the chain descends from the remote's. A remote without the name, or one
    /// that diverged from ours, leaves the mirror's ref as it is (the push then says so).
    fn follow_remote_name(
        &self,
        mirror: &std::path::Path,
        target: &crate::git::mirror::PushTarget,
        name: &str,
    ) -> Result<(), Error> {
        let full = named_ref(name);
        let Some(theirs) = crate::git::mirror::fetch_ref(
            mirror,
            target,
            &full,
            &format!("refs/octomate/pulled/{name}"),
        )?
        else {
            return Ok(());
        };
        let repo = snap::open(mirror)?;
        let ours = snap::read_ref(&repo, &full);
        let forward = match ours {
            None => true,
            Some(o) => o != theirs && crate::git::mirror::is_ancestor(mirror, o, theirs),
        };
        if forward {
            snap::cas_ref(
                &repo,
                &full,
                ours,
                theirs,
                &format!("octofs: snapshot {name} as the remote has it"),
            )?;
            tracing::info!(snapshot = %name, commit = %theirs, "named snapshot follows the remote's");
        }
        Ok(())
    }

    /// Files the thread snapshot `snapshot` as the named snapshot `name`: same tree and HEAD, its
    /// second parent the previous commit of that name. A state equal to that previous one (tree,
    /// HEAD, branch, POSIX record) is that commit, and nothing moves.
    fn file_named(
        &self,
        project: &str,
        thread: &str,
        snapshot: gix::ObjectId,
        name: &str,
    ) -> Result<gix::ObjectId, Error> {
        let repo = snap::open(&self.layout.mirror(project))?;
        let (tree, parents, message, _) = snap::commit_info(&repo, snapshot)?;
        let head = *parents.first().ok_or(SnapshotRefusal::NoParent)?;
        let head_ref = snap::head_of(&message);
        let posix = posix_record::blob_of(&message);
        let full = named_ref(name);
        let prev = snap::read_ref(&repo, &full);
        if let Some(p) = prev {
            let (ptree, pparents, pmsg, _) = snap::commit_info(&repo, p)?;
            if ptree == tree
                && pparents.first() == Some(&head)
                && snap::head_of(&pmsg) == head_ref
                && posix_record::blob_of(&pmsg) == posix
            {
                return Ok(p);
            }
        }
        let owner = match snap::owner_of(&message) {
            Some(o) => o,
            None => snap::SnapshotOwner::local(self.live_record(thread)?.owner.uid),
        };
        let mut msg = snap::message(thread, &head_ref, &owner).replacen(
            "octofs snapshot of thread",
            &format!("octofs snapshot {name} of thread"),
            1,
        );
        if let Some(b) = posix {
            msg.push_str(&posix_record::trailer(b));
        }
        let mut parents = vec![head];
        parents.extend(prev);
        let commit = snap::write_commit(&repo, tree, parents, &msg)?;
        snap::cas_ref(
            &repo,
            &full,
            prev,
            commit,
            &format!("octofs: snapshot {name} of {thread}"),
        )?;
        tracing::info!(%thread, snapshot = %name, %commit, "named snapshot");
        Ok(commit)
    }

    /// Snapshot assembly, the one entry point: the live workspace of `rec` as a tree of its
    /// project's mirror (`Goal::Tree`), or as the thread's next snapshot (`Goal::Snapshot`: the
    /// commit, its POSIX record, the compare-and-swap of the thread's ref and the workspace's saved
    /// mark). The caller holds the thread's lock.
    pub(super) fn assemble(
        &self,
        rec: &mut WorkspaceRecord,
        goal: Goal,
    ) -> Result<gix::ObjectId, Error> {
        let thread = rec.thread.clone();
        let thread = thread.as_str();
        let mut spans = Spans::start();
        let core = self.core_of(rec)?;
        let mirror = self.layout.mirror(&rec.project);
        let project = &rec.project;
        let gone = || {
            format!(
                "the mirror of project {project} is missing or broken: `octofs mirror sync {project}` clones it again; `octofs release {thread} --discard` drops the workspace without saving"
            )
        };
        let mut repo = snap::open(&mirror).context(gone)?;
        // The last snapshot's tree: the view rebuilds only what changed since it, when the core
        // knows that tree as its last snapshot (else it lists every change from the base).
        let last = rec
            .saved
            .as_ref()
            .and_then(|m| m.commit)
            .and_then(|c| snap::commit_info(&repo, c).ok())
            .map(|(tree, ..)| tree);
        // 1. A consistent view of what changed (the only step that holds the workspace's lock).
        let view = core
            .snapshot_view(last)
            .map_err(on_workspace("cannot read the workspace's changes"))?;
        spans.mark(Span::View);
        let head = match goal {
            Goal::Snapshot => Some(read_head(&core)?),
            Goal::Tree => None,
        };
        // What `git add -A` cannot hold, kept beside the tree: nested repositories and names git
        // refuses (`super::kept`). A refused name never reaches the tree.
        let saved_commit = rec.saved.as_ref().and_then(|m| m.commit);
        let kept_plan = super::kept::Plan::of(&repo, saved_commit, view.since_last, &view.edits)?;
        // 2. What `git add -A` would leave out; nested repositories become gitlinks.
        let mut edits = add_all::keep(
            &core,
            &self.layout.state,
            nested_repositories(&core, kept_plan.strip(view.edits)),
        )?;
        edits.sort_by(|a, b| a.path().cmp(b.path()));
        spans.mark(Span::Keep);
        // 3. Objects, then (for a snapshot) the commit and the ref.
        // The upper layer's clock before the view: files last changed before it may be remembered.
        let clock = Some((view.taken_at.0, i64::from(view.taken_at.1)));
        // Dependency layers never leave the workspace: the tree is built from the real base (the
        // view's root has the layers grafted in), without what is at or below a layer's path
        // while the ignore rules ignore it (what the user un-ignored there is content).
        let base_tree = if rec.layers.is_empty() {
            view.base_tree
        } else {
            rec.base_tree
        };
        let edits = super::layers::strip(rec, &core, &*self.store(project)?, &repo, edits)?;
        let (meta, kept_meta) = kept_plan.split_meta(view.meta);
        let meta = super::layers::strip_meta(rec, &core, meta)?;
        if !repo.has_object(base_tree) {
            return Err(SnapshotRefusal::BaseTreeMissing {
                base_tree,
                project: project.to_string(),
                thread: thread.to_string(),
            }
            .into());
        }
        // The edits apply to the last snapshot's tree (incremental), else to the real base.
        let onto = if view.since_last {
            view.onto
        } else {
            base_tree
        };
        let Some((head, head_ref)) = head else {
            return Ok(snap::build_tree(
                &repo,
                onto,
                &edits,
                clock,
                &self.snapshot_caches,
            )?);
        };
        let tref = snap::thread_ref(thread);
        let prev = snap::read_ref(&repo, &tref);
        // The ref must be where this workspace last left it. One exception: snapshots of this
        // workspace that moved the ref just before the daemon died, before they were recorded
        // here — one per such death in a row, each the second parent of the next, the first on
        // top of what was recorded.
        let mut saved = rec.saved.as_ref().and_then(|m| m.commit);
        // A mirror re-created from its upstream has neither the ref nor the snapshot: nobody moved
        // it, the chain starts again (the old snapshots went with the old mirror).
        if prev.is_none()
            && let Some(s) = saved
            && !repo.has_object(s)
        {
            tracing::warn!(%thread, last = %s, "the mirror lost the thread's snapshots; starting a new chain");
            saved = None;
        }
        if prev != saved {
            let ours = match prev {
                Some(p) => own_snapshots_since(&repo, thread, p, saved)?,
                None => false,
            };
            if !ours {
                return Err(SnapshotRefusal::MovedUnderneath {
                    thread_ref: tref,
                    expected: saved,
                    found: prev,
                }
                .into());
            }
        }
        if !repo.has_object(head) {
            // The agent's own commits: carried into the mirror (and kept reachable there).
            let n = carry::carry(&core, &self.layout.state, &repo, thread, head)?;
            tracing::info!(%thread, %head, objects = n, "carried the agent's commits");
            repo = snap::open(&mirror)?;
        }
        // The rest of the workspace's repository: its refs, stash, config (`repo_record`).
        let has_origin = crate::git::mirror::require(&self.layout, project)?.kind
            != crate::git::mirror::UpstreamKind::Directory;
        let record = super::repo_record::save(&core, &self.layout, &repo, thread, has_origin)?;
        spans.mark(Span::Keep);
        let tree = snap::build_tree(&repo, onto, &edits, clock, &self.snapshot_caches)?;
        spans.mark(Span::Tree);
        // What the tree cannot hold goes into the POSIX record, named by the commit's message.
        // A file of the tree hard-linked to one kept beside it is that link, not a copy.
        let mut kept_links: std::collections::HashMap<u64, Vec<u8>> = Default::default();
        for m in &kept_meta {
            if m.kind == crate::git::posix_record::PosixKind::File && m.nlink > 1 {
                kept_links
                    .entry(m.ino)
                    .and_modify(|p| {
                        if m.path < *p {
                            p.clone_from(&m.path);
                        }
                    })
                    .or_insert_with(|| m.path.clone());
            }
        }
        let posix = match super::posix::record_of(&repo, tree, &meta, &rec.owner, &kept_links)? {
            Some(r) => Some(posix_record::write_blob(&repo, &r)?),
            None => None,
        };
        let mut message = snap::message(
            thread,
            &head_ref,
            &snap::SnapshotOwner::local(rec.owner.uid),
        );
        if let Some(b) = posix {
            message.push_str(&posix_record::trailer(b));
        }
        message.push_str(&super::repo_record::trailer(record));
        let side = kept_plan.write(&core, &repo, tree, &kept_meta)?;
        if let Some(s) = side {
            message.push_str(&kept::trailer(s));
        }
        spans.mark(Span::Posix);
        if let Some(p) = prev {
            let (ptree, pparents, pmsg, _) = snap::commit_info(&repo, p)?;
            if ptree == tree
                && pparents.first() == Some(&head)
                && snap::head_of(&pmsg) == head_ref
                && posix_record::blob_of(&pmsg) == posix
                && super::repo_record::record_of(&pmsg) == Some(record)
                && kept::side_of(&pmsg) == side
            {
                self.mark_saved(rec, &core, p, view.generation, view.taken_at)?;
                core.snapshot_saved(view.epoch, tree);
                return Ok(p);
            }
        }
        let mut parents = vec![head];
        parents.extend(prev);
        let commit = snap::write_commit(&repo, tree, parents, &message)?;
        // The record is reachable before the snapshot's ref names the commit that needs it.
        if let Some(b) = posix {
            posix_record::keep(&repo, thread, commit, b)?;
        }
        if let Some(s) = side {
            kept::keep(&repo, thread, commit, s)?;
        }
        snap::cas_ref(
            &repo,
            &tref,
            prev,
            commit,
            &format!("octofs: snapshot of {thread}"),
        )?;
        spans.mark(Span::Commit);
        self.mark_saved(rec, &core, commit, view.generation, view.taken_at)?;
        core.snapshot_saved(view.epoch, tree);
        spans.mark(Span::Saved);
        let edits = edits.len();
        let meta = meta.len();
        let ms = spans.ms();
        tracing::info!(
            %thread, %commit, since_last = view.since_last, edits, meta,
            total_ms = ms[Span::Total as usize],
            view_ms = ms[Span::View as usize],
            keep_ms = ms[Span::Keep as usize],
            tree_ms = ms[Span::Tree as usize],
            posix_ms = ms[Span::Posix as usize],
            commit_ms = ms[Span::Commit as usize],
            saved_ms = ms[Span::Saved as usize],
            "snapshot"
        );
        Ok(commit)
    }

    /// Writes the mirror's tips as the reflog of the workspace's `refs/octomate/saved`
    /// (`git::tips`: `git fsck` in the workspace then calls none of the project's snapshots
    /// dangling); returns the file's inode (bookkeeping). The caller writes the mark itself with
    /// it. A failure is logged: it costs only that.
    pub(super) fn write_tips(
        &self,
        core: &WorkspaceFs,
        thread: &str,
        project: &str,
    ) -> Option<u64> {
        let written = crate::git::tips::reflog(&self.layout.mirror(project), super::now() as i64)
            .and_then(|log| {
                core.put_file_quietly(&[".git", "logs", "refs", "octomate"], "saved", &log)
                    .map_err(|e| e.to_string())
            });
        match written {
            Ok(ino) => Some(ino),
            Err(e) => {
                tracing::warn!(%thread, "cannot write the mirror's tips as the reflog of refs/octomate/saved: {e}");
                None
            }
        }
    }

    fn mark_saved(
        &self,
        rec: &mut WorkspaceRecord,
        core: &WorkspaceFs,
        commit: gix::ObjectId,
        generation: u64,
        at: Ts,
    ) -> Result<(), Error> {
        let ino = core
            .put_file_quietly(
                &[".git", "refs", "octomate"],
                "saved",
                format!("{commit}\n").as_bytes(),
            )
            .map_err(on_workspace("cannot record refs/octomate/saved"))?;
        let mut bookkeeping = vec![ino];
        bookkeeping.extend(self.write_tips(core, &rec.thread, &rec.project));
        // A process in the mount reads the new mark as soon as the snapshot is answered.
        self.tell_kernel(&rec.thread);
        rec.saved = Some(SavedMark {
            commit: Some(commit),
            generation,
            at,
            bookkeeping,
        });
        // The new record's bytes are synced before they replace the old ones (a power loss never
        // leaves a torn or empty record), but the rename is not (no sync of the directory): the
        // snapshot is acknowledged once the rename is in the kernel (it survives SIGKILL of the
        // daemon), and a power loss that undoes the rename leaves the previous mark, which the
        // next snapshot accepts (the thread's ref one snapshot ahead of it, with it as second
        // parent, is this workspace's own: see `assemble`). The mirror's objects and ref are not
        // synced either: a snapshot is as durable as git makes its own commits.
        let staged = rec.stage(&self.layout)?;
        staged.sync()?;
        staged.publish()?;
        // This snapshot is its owner's own, made here from their workspace: its config comes
        // back byte for byte (`repo_config`).
        super::repo_config::mark_own(
            &self.layout,
            &rec.thread,
            &commit.to_string(),
            rec.owner.uid,
        );
        Ok(())
    }
}

/// The steps of a snapshot, timed for its log line.
#[derive(Clone, Copy)]
enum Span {
    /// From the start: everything.
    Total,
    /// The core's view (the one step under the workspace's lock) and its metadata.
    View,
    /// HEAD, the ignore rules, nested repositories, dependency layers, the agent's commits.
    Keep,
    /// The changed files' blobs and the edited trees.
    Tree,
    /// The POSIX record.
    Posix,
    /// The commit, the record kept reachable, the ref.
    Commit,
    /// The saved mark and the core told of the snapshot.
    Saved,
}

/// Milliseconds spent in each [`Span`] of one snapshot.
struct Spans {
    start: std::time::Instant,
    last: std::time::Instant,
    ms: [f64; 7],
}

impl Spans {
    fn start() -> Spans {
        let now = std::time::Instant::now();
        Spans {
            start: now,
            last: now,
            ms: [0.0; 7],
        }
    }

    /// The time since the last mark counts to `span` (marks of one span add up).
    fn mark(&mut self, span: Span) {
        let now = std::time::Instant::now();
        self.ms[span as usize] += (now - self.last).as_secs_f64() * 1e3;
        self.last = now;
    }

    /// Each span's milliseconds, rounded to 0.1 ms; [`Span::Total`]: from the start.
    fn ms(&self) -> [f64; 7] {
        let mut out = self.ms.map(|m| (m * 10.0).round() / 10.0);
        out[Span::Total as usize] = (self.start.elapsed().as_secs_f64() * 1e4).round() / 10.0;
        out
    }
}

/// Snapshots of `thread` that moved its ref without the workspace recording them can follow one
/// another (the daemon died between the ref's compare-and-swap and the saved mark, more than once
/// in a row): at most this many are recognised.
const UNRECORDED_SNAPSHOTS: usize = 64;

/// Whether `from` is a chain of `thread`'s own snapshot commits, each the second parent of the
/// next, whose first has `saved` as its second parent (`None`: the thread's first snapshot, which
/// has none): snapshots this workspace made whose saved mark was lost, not a ref someone else moved.
fn own_snapshots_since(
    repo: &gix::Repository,
    thread: &str,
    from: gix::ObjectId,
    saved: Option<gix::ObjectId>,
) -> Result<bool, Error> {
    let mine = format!("octofs snapshot of thread {thread}\n");
    let mut cur = from;
    for _ in 0..UNRECORDED_SNAPSHOTS {
        let (_, parents, msg, _) = snap::commit_info(repo, cur)?;
        if !String::from_utf8_lossy(&msg).starts_with(&mine) {
            return Ok(false);
        }
        match parents.get(1).copied() {
            second if second == saved => return Ok(true),
            Some(second) => cur = second,
            None => return Ok(false),
        }
    }
    Ok(false)
}
