//! `octofs resync <thread> --role developer|reviewer` (seed 002 "re-sync, role-aware"): after a
//! mirror sync moved the upstream, a live workspace is brought to the tip of its upstream branch
//! as its role allows.
//!
//! - developer: a clean workspace (the working state equals HEAD's tree and the index matches
//!   HEAD) whose HEAD is behind or equal to the tip fast-forwards; one that is dirty, strictly
//!   ahead or diverged is left exactly as it is, and the answer says why.
//! - reviewer: the current state is saved as a snapshot first (nothing is lost), then HEAD, the
//!   index and every tracked file go to the tip, untracked non-ignored files go (they are in the
//!   snapshot), ignored files and nested repositories (a directory holding `.git`) stay.
//!
//! The difference between what the workspace presented and the tip is applied over it as entries
//! that refer to the mirror's blobs, exactly as resume does, in O(changed paths); unchanged paths
//! keep their inodes. [`Daemon::present_commit`] is the one function that moves what a workspace
//! presents (the place a dependency layer's graft will be redone). A developer's clean workspace
//! then has its base (lower layer) moved to the tip without changing anything it presents
//! ([`Daemon::move_base_to`]), so that `status` counts nothing the fast-forward wrote.
//!
//! Policy only: never runs git in a workspace or reads one through its mount; writes in the
//! workspace only through its core (the changed paths, `.git/index`, the branch or HEAD, the
//! origin refs) and tells the kernel before answering. The thread's lock is held throughout.

use std::collections::HashMap;

use super::commit::{keep_stat, write_index};
use super::error::{Context, Error, on_workspace};
use super::proto::Resynced;
use super::refusal::{ChatOp, ResyncRefusal};
use super::snapshot::{Goal, read_head};
use super::{Daemon, Reply};
use crate::access::Caller;
use crate::fs::{TreeChange, WorkspaceFs};
use crate::git::mirror::{UpstreamKind, changes};
use crate::git::snapshot::{self as snap, HeadRef};
use crate::own_repo::{add_all, carry};
use crate::workspace::WorkspaceRecord;

/// Who asks for the re-sync: what it may do to the workspace's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Keeps its own work: only a clean fast-forward.
    Developer,
    /// Reviews someone else's branch: reset to the tip after saving the state.
    Reviewer,
}

impl Role {
    pub fn parse(s: &str) -> Result<Role, ResyncRefusal> {
        match s {
            "developer" => Ok(Role::Developer),
            "reviewer" => Ok(Role::Reviewer),
            _ => Err(ResyncRefusal::UnknownRole {
                role: s.to_string(),
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Developer => "developer",
            Role::Reviewer => "reviewer",
        }
    }
}

/// The upstream branch of a workspace and where the mirror has it now.
struct Upstream {
    /// As the workspace names it (`origin/main`, or `main` for a directory upstream).
    shown: String,
    tip: gix::ObjectId,
}

/// How a workspace's HEAD relates to its upstream tip (counted in the mirror).
struct Relation {
    /// Commits of HEAD the tip does not have, and the other way round.
    ahead: u64,
    behind: u64,
}

fn plural(n: u64, one: &str) -> String {
    if n == 1 {
        format!("{n} {one}")
    } else {
        format!("{n} {one}s")
    }
}

/// "3 changed paths (a, b, c…)": at most three paths named.
fn dirty_reason(paths: &[Vec<u8>]) -> String {
    let shown: Vec<String> = paths
        .iter()
        .take(3)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let more = if paths.len() > 3 { "…" } else { "" };
    format!(
        "dirty: {} ({}{more})",
        plural(paths.len() as u64, "changed path"),
        shown.join(", ")
    )
}

/// The index stat data of an entry presented as `a` (git keeps 32 bits of each field).
fn index_stat(a: &fuser::FileAttr) -> gix::index::entry::Stat {
    let t = |s: std::time::SystemTime| {
        let d = s.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        gix::index::entry::stat::Time {
            secs: d.as_secs().min(u64::from(u32::MAX)) as u32,
            nsecs: d.subsec_nanos(),
        }
    };
    gix::index::entry::Stat {
        mtime: t(a.mtime),
        ctime: t(a.ctime),
        dev: 0,
        ino: a.ino.0 as u32,
        uid: a.uid,
        gid: a.gid,
        size: a.size as u32,
    }
}

impl Daemon {
    /// `octofs resync`.
    pub(super) fn resync(&self, thread: &str, role: &str, c: &Caller) -> Reply<Resynced> {
        let thread_lock = self.thread_lock(thread)?;
        let role = Role::parse(role)?;
        let (rec, _held) = thread_lock.live(c, ChatOp::Resync)?;
        let started = std::time::Instant::now();
        let core = self.core_of(&rec)?;
        let (head, head_ref) = read_head(&core)?;
        let mirror = self.layout.mirror(&rec.project);
        let mut repo = snap::open(&mirror)?;
        let up = self.upstream_of(&rec, &core, &head_ref, &repo)?;
        // What the workspace holds now, and the moment it was read (a change after it refuses
        // a fast-forward: what was checked clean must still be).
        let generation = core.generation();
        let at = core
            .clock()
            .map_err(on_workspace("cannot read the upper layer's clock"))?;
        let working = self.assemble(&mut rec.clone(), Goal::Tree)?;
        if !repo.has_object(head) {
            // The agent's own commits: the mirror needs them to compare (the next snapshot
            // carries them anyway).
            carry::carry(&core, &self.layout.state, &repo, thread, head)?;
            repo = snap::open(&mirror)?;
        }
        let (head_tree, _, _, _) = snap::commit_info(&repo, head)?;
        let (tip_tree, _, _, _) = snap::commit_info(&repo, up.tip)?;
        let dirty = if working == head_tree {
            Vec::new()
        } else {
            tree_changes(&mirror, head_tree, working)?
                .into_iter()
                .map(|c| c.path)
                .collect()
        };
        let staged = !dirty.is_empty() || self.index_differs(&core, &repo, head_tree)?;
        let mut answer = Resynced {
            thread: thread.into(),
            role: role.name().into(),
            action: "up-to-date".into(),
            from: head.to_string(),
            to: up.tip.to_string(),
            reason: None,
            snapshot: None,
            changed_paths: 0,
            base_moved: false,
        };
        let refuse = |mut a: Resynced, why: String| {
            tracing::info!(%thread, role = role.name(), "resync refused: {why}");
            a.action = "refused".into();
            a.reason = Some(why);
            Ok((a, vec![]))
        };
        if head == up.tip && dirty.is_empty() && !staged {
            // Clean at the tip: its base moves there if it is not yet (a workspace whose own
            // commits were pushed, or one whose earlier move a crash interrupted).
            answer.base_moved = self.move_base_to(&core, thread, head, head_tree)?;
            return Ok((answer, vec![]));
        }
        let from_tree = match role {
            Role::Developer => {
                if head == up.tip {
                    // Nothing to move; the dirty work is the developer's.
                    return Ok((answer, vec![]));
                }
                if !dirty.is_empty() {
                    return refuse(answer, dirty_reason(&dirty));
                }
                if staged {
                    return refuse(
                        answer,
                        "dirty: the index has staged changes (it differs from HEAD)".into(),
                    );
                }
                let rel = relation(&mirror, head, up.tip)?;
                if rel.ahead > 0 && rel.behind == 0 {
                    return refuse(
                        answer,
                        format!("ahead of {} by {}", up.shown, plural(rel.ahead, "commit")),
                    );
                }
                if rel.ahead > 0 {
                    return refuse(
                        answer,
                        format!(
                            "diverged from {}: {} of its own, {} upstream",
                            up.shown,
                            plural(rel.ahead, "commit"),
                            rel.behind
                        ),
                    );
                }
                if core.changed_since(generation, at, &[]) {
                    return refuse(
                        answer,
                        "the workspace changed while it was checked; try again".into(),
                    );
                }
                head_tree
            }
            Role::Reviewer => {
                let saved = self.snapshot_locked(thread)?;
                let id = gix::ObjectId::from_hex(saved.as_bytes())
                    .context(|| format!("snapshot id {saved:?}"))?;
                let (saved_tree, _, _, _) = snap::commit_info(&repo, id)?;
                answer.snapshot = Some(saved);
                saved_tree
            }
        };
        let changed = self.present_commit(&core, &rec, from_tree, tip_tree, up.tip, &head_ref)?;
        if role == Role::Developer {
            answer.base_moved = self.move_base_to(&core, thread, up.tip, tip_tree)?;
        }
        answer.action = match role {
            Role::Developer => "fast-forward",
            Role::Reviewer => "reset",
        }
        .into();
        answer.changed_paths = changed;
        tracing::info!(
            %thread, role = role.name(), from = %head, to = %up.tip, changed,
            ms = started.elapsed().as_millis() as u64,
            "resync"
        );
        Ok((answer, vec![]))
    }

    /// The branch a workspace follows: its tracking branch (`branch.<b>.merge` of `origin` in
    /// its `.git/config`), else the branch it is on or was opened at when the mirror has one of
    /// that name, else (opened without a ref) the project's default branch. Its tip is the
    /// mirror's `refs/remotes/origin/<b>` (what `mirror sync` fetched), or `refs/heads/<b>` for a
    /// directory upstream.
    fn upstream_of(
        &self,
        rec: &WorkspaceRecord,
        core: &WorkspaceFs,
        head_ref: &HeadRef,
        repo: &gix::Repository,
    ) -> Result<Upstream, Error> {
        let project = crate::git::mirror::require(&self.layout, &rec.project)?;
        let remote = project.kind != UpstreamKind::Directory;
        let tip_of = |b: &str| -> Option<(String, gix::ObjectId)> {
            let mut names = Vec::new();
            if remote {
                names.push((format!("refs/remotes/origin/{b}"), format!("origin/{b}")));
            }
            names.push((format!("refs/heads/{b}"), b.to_string()));
            names.into_iter().find_map(|(name, shown)| {
                let id = snap::read_ref(repo, &name)?;
                let commit = repo.find_object(id).ok()?.peel_to_commit().ok()?;
                Some((shown, commit.id))
            })
        };
        let mut candidates: Vec<String> = Vec::new();
        if let HeadRef::Branch(b) = head_ref
            && let Some(t) = tracking_branch(core, b)?
        {
            candidates.push(t);
        }
        candidates.extend(
            rec.branch
                .iter()
                .filter(|b| !b.starts_with("octofs/"))
                .cloned(),
        );
        match &rec.requested_ref {
            Some(r) => candidates.push(r.clone()),
            None => candidates.push(project.default_branch.clone()),
        }
        for b in &candidates {
            if let Some((shown, tip)) = tip_of(b) {
                return Ok(Upstream { shown, tip });
            }
        }
        Err(ResyncRefusal::NoUpstream {
            thread: rec.thread.clone(),
            project: rec.project.clone(),
            last: candidates.pop(),
        }
        .into())
    }

    /// Whether the workspace's index records anything other than `tree` (staged changes, a
    /// conflict): a fast-forward would drop them.
    fn index_differs(
        &self,
        core: &WorkspaceFs,
        repo: &gix::Repository,
        tree: gix::ObjectId,
    ) -> Result<bool, Error> {
        let old = add_all::read_index(core, &self.layout.state)?;
        let want = repo.index_from_tree(&tree).map_err(|e| Error::Op {
            what: "cannot build the index of HEAD".into(),
            source: Box::new(e),
        })?;
        if old.entries().len() != want.entries().len() {
            return Ok(true);
        }
        Ok(old.entries().iter().zip(want.entries()).any(|(o, w)| {
            o.id != w.id
                || o.mode != w.mode
                || o.stage() != w.stage()
                || o.path(&old) != w.path(&want)
        }))
    }

    /// The one place a re-sync moves what a workspace presents, from the files of `from_tree` to
    /// commit `to` (tree `to_tree`): the changed paths applied over the workspace (removals
    /// first, deepest first; each new entry refers to the mirror's blob), `.git/index` rewritten
    /// to `to_tree` with stat data equal to what the mount presents, HEAD's branch (or a detached
    /// HEAD) moved to `to`, the workspace's origin refs and tags updated from the mirror, and the
    /// kernel told. The base moves afterwards, if at all ([`Self::move_base_to`]). A dependency
    /// layer's graft belongs here.
    /// Returns how many paths changed.
    ///
    /// The new entries are dated one second before the re-sync began: git counts an entry whose
    /// time is not older than the index as "racily clean" and reads it again; dated before the
    /// index, the next `git status` reads nothing, and any later write gives a newer time.
    fn present_commit(
        &self,
        core: &WorkspaceFs,
        rec: &WorkspaceRecord,
        from_tree: gix::ObjectId,
        to_tree: gix::ObjectId,
        to: gix::ObjectId,
        head_ref: &HeadRef,
    ) -> Result<u64, Error> {
        let mirror = self.layout.mirror(&rec.project);
        let repo = snap::open(&mirror)?;
        let list = tree_changes(&mirror, from_tree, to_tree)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let dated =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(now.as_secs().saturating_sub(1));
        // A nested repository (a directory holding `.git`) is never removed: a snapshot holds it
        // as a gitlink, a commit id whose objects only its own `.git` has, so removing it would
        // lose its history and its uncommitted files (git's `reset --hard` leaves it too).
        let nested = |p: &[u8]| -> Result<bool, Error> {
            let mut comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            comps.push(b".git");
            Ok(core
                .kind_at(&comps)
                .map_err(on_workspace("cannot read the workspace"))?
                .is_some())
        };
        let mut removals: Vec<&[u8]> = Vec::new();
        for c in list.iter().filter(|c| c.mode == 0) {
            if nested(&c.path)? {
                tracing::info!(thread = %rec.thread, path = %String::from_utf8_lossy(&c.path),
                    "resync leaves a nested repository in place");
                continue;
            }
            removals.push(c.path.as_slice());
        }
        removals.sort_by(|a, b| b.cmp(a));
        let shown = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
        for p in &removals {
            core.apply(p, &TreeChange::Remove)
                .map_err(on_workspace(format!("cannot remove {}", shown(p))))?;
        }
        let mut fresh: HashMap<&[u8], gix::index::entry::Stat> = HashMap::new();
        for c in list.iter().filter(|c| c.mode != 0) {
            let change = match c.mode {
                0o100755 => TreeChange::File {
                    id: c.id,
                    exec: true,
                },
                0o120000 => TreeChange::Symlink { id: c.id },
                0o160000 => TreeChange::Gitlink { id: c.id },
                _ => TreeChange::File {
                    id: c.id,
                    exec: false,
                },
            };
            if let Some(a) = core
                .apply_dated(&c.path, &change, dated)
                .map_err(on_workspace(format!("cannot write {}", shown(&c.path))))?
            {
                fresh.insert(c.path.as_slice(), index_stat(&a));
            }
        }
        // The index: the tip's tree, each entry with the stat the mount presents (kept from the
        // old index where nothing changed, read from the new entry where the re-sync wrote it).
        let mut index = repo.index_from_tree(&to_tree).map_err(|e| Error::Op {
            what: "cannot build the index of the upstream tip".into(),
            source: Box::new(e),
        })?;
        keep_stat(core, &self.layout.state, &mut index);
        for (e, path) in index.entries_mut_with_paths() {
            let p: &[u8] = path.as_ref();
            if let Some(st) = fresh.get(p) {
                e.stat = *st;
            }
        }
        let bytes = crate::git::checksum::index_file(&index, Default::default()).map_err(|e| {
            Error::Op {
                what: "cannot write the index of the upstream tip".into(),
                source: Box::new(e),
            }
        })?;
        write_index(core, &bytes)?;
        super::commit::move_head(core, head_ref, to)?;
        self.update_remote_refs(core, rec, &repo)?;
        self.tell_kernel(&rec.thread);
        Ok(list.len() as u64)
    }

    /// Moves the base (lower layer) of a workspace that presents exactly `commit`'s files (clean
    /// at `commit`, the fast-forward applied) to `commit` and its tree `tree`, without changing
    /// anything it presents ([`WorkspaceFs::move_base`]): afterwards `status` counts no change,
    /// the record's base is `commit`, and the presented times stay (the record's `base_time` is
    /// the workspace's presentation time, which a move keeps). The record is saved first, then the
    /// catalog's one batch re-points the root and the overlay's directories: a crash before the
    /// batch leaves the old base under the catalog's root with the tip's files in the overlay (a
    /// consistent workspace, which the next resync moves), after it the moved one. Returns whether
    /// the base moved now; false when it already was there or cannot move without changing what
    /// the workspace presents (then the record is put back).
    fn move_base_to(
        &self,
        core: &WorkspaceFs,
        thread: &str,
        commit: gix::ObjectId,
        tree: gix::ObjectId,
    ) -> Result<bool, Error> {
        let Some(mut rec) = WorkspaceRecord::load(&self.layout, thread)? else {
            return Ok(false);
        };
        let store = self.store(&rec.project)?;
        let root = match crate::git::graft::graft(&store, tree, &super::layers::grafts(&rec)) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(%thread, "the base does not move: cannot graft the layers: {e}");
                return Ok(false);
            }
        };
        let now = core
            .root_base()
            .map_err(on_workspace("cannot read the workspace's base"))?;
        if now != root
            && !core
                .can_move_base(root)
                .map_err(on_workspace("cannot read the workspace's overlay"))?
        {
            tracing::info!(%thread, "the base does not move: the workspace differs from {commit}");
            return Ok(false);
        }
        let old = rec.clone();
        let (c, t) = (commit, tree);
        if rec.base_commit != c || rec.base_tree != t {
            rec.base_commit = c;
            rec.base_tree = t;
            rec.save(&self.layout)?;
        }
        if now == root {
            return Ok(false);
        }
        self.fault("resync:before-move");
        let started = std::time::Instant::now();
        let moved = core
            .move_base(root)
            .map_err(on_workspace("cannot move the workspace's base"));
        match moved {
            Ok(Some(m)) => {
                self.fault("resync:after-move");
                tracing::info!(%thread, %commit, repointed = m.repointed, kept = m.kept,
                    symlinks = m.symlinks, us = started.elapsed().as_micros() as u64,
                    "moved the workspace's base");
                Ok(true)
            }
            Ok(None) | Err(_) => {
                // Changed in between: the catalog's root stays, and so does the record.
                old.save(&self.layout)?;
                moved.map(|_| false)
            }
        }
    }

    /// A test hook of debug builds: when `<state>/test-fault` names `point`, the daemon dies here
    /// as by SIGKILL (the file is removed first, so it fires once). Release builds never look.
    fn fault(&self, point: &str) {
        if !cfg!(debug_assertions) {
            return;
        }
        let f = self.layout.state.join("test-fault");
        if std::fs::read_to_string(&f).is_ok_and(|s| s.trim() == point) {
            let _ = std::fs::remove_file(&f);
            tracing::warn!(point, "test fault: the daemon dies here");
            let _ = crate::sys::kill_process_group(std::process::id());
            std::process::abort();
        }
    }

    /// The workspace's `refs/remotes/origin/*` (for a directory upstream, none) and `refs/tags/*`
    /// set to the mirror's: `.git/packed-refs` rewritten with the mirror's refs of those
    /// namespaces and every other line kept, and a loose ref of those namespaces that the mirror
    /// has overwritten (a loose ref hides its packed line).
    fn update_remote_refs(
        &self,
        core: &WorkspaceFs,
        rec: &WorkspaceRecord,
        repo: &gix::Repository,
    ) -> Result<(), Error> {
        let project = crate::git::mirror::require(&self.layout, &rec.project)?;
        let remote = project.kind != UpstreamKind::Directory;
        let ours = |name: &str| {
            !name.starts_with("refs/octomate/")
                && (name.starts_with("refs/tags/")
                    || (remote && name.starts_with("refs/remotes/origin/")))
        };
        let listed = crate::repo::mirror_refs(repo)?;
        let mut lines: Vec<(String, Vec<String>)> = Vec::new();
        let old = core
            .read_file(&[b".git", b"packed-refs"])
            .map_err(on_workspace("cannot read .git/packed-refs"))?
            .unwrap_or_default();
        for l in String::from_utf8_lossy(&old).lines() {
            if l.starts_with('#') || l.is_empty() {
                continue;
            }
            if let Some(peeled) = l.strip_prefix('^') {
                if let Some(last) = lines.last_mut() {
                    last.1.push(format!("^{peeled}"));
                }
                continue;
            }
            let Some((_, name)) = l.split_once(' ') else {
                continue;
            };
            lines.push((name.to_string(), vec![l.to_string()]));
        }
        lines.retain(|(name, _)| !ours(name));
        for (name, id, peeled) in listed.direct.iter().filter(|(n, _, _)| ours(n)) {
            let mut l = vec![format!("{id} {name}")];
            if let Some(p) = peeled {
                l.push(format!("^{p}"));
            }
            lines.push((name.clone(), l));
            // A loose ref of the same name (the agent fetched) would hide the packed line.
            let comps: Vec<&[u8]> = std::iter::once(b".git".as_slice())
                .chain(name.split('/').map(str::as_bytes))
                .collect();
            if core
                .kind_at(&comps)
                .map_err(on_workspace("cannot read .git/refs"))?
                == Some(fuser::FileType::RegularFile)
            {
                let dirs: Vec<&str> = std::iter::once(".git").chain(name.split('/')).collect();
                if let Some((file, parents)) = dirs.split_last() {
                    core.put_file_quietly(parents, file, format!("{id}\n").as_bytes())
                        .map_err(on_workspace(format!("cannot update {name}")))?;
                }
            }
        }
        lines.sort_by(|a, b| a.0.cmp(&b.0));
        let mut packed = String::from("# pack-refs with: peeled fully-peeled sorted \n");
        for (_, l) in lines {
            for x in l {
                packed.push_str(&x);
                packed.push('\n');
            }
        }
        core.put_file_quietly(&[".git"], "packed-refs", packed.as_bytes())
            .map_err(on_workspace("cannot write .git/packed-refs"))?;
        Ok(())
    }
}

/// `git diff-tree -r` between two trees of the mirror.
fn tree_changes(
    mirror: &std::path::Path,
    from: gix::ObjectId,
    to: gix::ObjectId,
) -> Result<Vec<crate::git::mirror::Change>, Error> {
    let raw = crate::git::Git::new(Some(mirror))
        .args([
            "diff-tree",
            "-r",
            "-z",
            "--raw",
            "--no-renames",
            "--end-of-options",
        ])
        .arg(from.to_string())
        .arg(to.to_string())
        .output_bytes()?;
    Ok(changes(&raw)?)
}

/// Commits of `head` not in `tip` and of `tip` not in `head`.
fn relation(
    mirror: &std::path::Path,
    head: gix::ObjectId,
    tip: gix::ObjectId,
) -> Result<Relation, Error> {
    let out = crate::git::Git::new(Some(mirror))
        .args(["rev-list", "--left-right", "--count", "--end-of-options"])
        .arg(format!("{head}...{tip}"))
        .output_bytes()?;
    let text = String::from_utf8_lossy(&out);
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    match (it.next(), it.next()) {
        (Some(Ok(ahead)), Some(Ok(behind))) => Ok(Relation { ahead, behind }),
        _ => Err(ResyncRefusal::RevListOutput {
            text: text.into_owned(),
        }
        .into()),
    }
}

/// `branch.<branch>.merge` of remote `origin` in the workspace's `.git/config`, as a branch name.
fn tracking_branch(core: &WorkspaceFs, branch: &str) -> Result<Option<String>, Error> {
    let Some(config) = super::commit::workspace_config(core)? else {
        return Ok(None);
    };
    let sub: &gix::bstr::BStr = branch.as_bytes().into();
    let remote = config.string_by("branch", Some(sub), "remote");
    if remote.as_ref().is_none_or(|r| r.as_slice() != b"origin") {
        return Ok(None);
    }
    Ok(config
        .string_by("branch", Some(sub), "merge")
        .and_then(|m| {
            String::from_utf8(m.to_vec())
                .ok()?
                .strip_prefix("refs/heads/")
                .map(str::to_string)
        }))
}
