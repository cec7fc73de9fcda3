//! A thread's workspace lifecycle (seed 000 "Forking", "Saving", "Restoring", "Reclaiming",
//! "Binding", "The chat workspace"): open (fork, resume, or share the live mount), snapshot, release,
//! sweep, and diff.
//!
//! Policy only: the mechanisms are the filesystem core (the view of what changed), `git::snapshot`
//! (objects and refs in the mirror), `repo` (the workspace's `.git`), `own_repo` (that `.git` read
//! in process: what `git add -A` keeps, the agent's own commits) and the records of `workspace`.
//! Nothing here runs git in a workspace or reads one through its mount. Every operation on a thread
//! holds that thread's lock, and under it refuses a caller who neither owns the thread nor is root.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::cow::catalog::Ts;
use crate::fs::WorkspaceFs;
use crate::git::mirror::{self, Project, UpstreamKind};
use crate::git::posix_record;
use crate::git::snapshot::ViewEdit;
use crate::git::snapshot::{self as snap, HeadRef};
use crate::names::{NameKind, validate};
use crate::own_repo::{add_all, carry};
use crate::workspace::{Binding, SavedMark, WorkspaceRecord};

/// The internal project every chat workspace forks from (a name users cannot pick).
pub const BLANK: &str = ".blank";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What a new workspace is made of.
struct Fork {
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
}

fn split_nul(out: &[u8]) -> Vec<Vec<u8>> {
    out.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
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
fn read_head(core: &WorkspaceFs) -> Result<(gix::ObjectId, HeadRef), String> {
    read_head_at(core, &[b".git"])
}

/// The most a ref file (`HEAD`, a loose ref) or one line of `packed-refs` may hold. Real ones are
/// one short line; the agent controls these files, and a sparse one of gigabytes costs it nothing,
/// so nothing larger is read into the daemon's memory or shown in a message.
const REF_LINE_MAX: u64 = 4096;

/// HEAD of the repository whose git directory is at `git_dir` (path components in the workspace).
fn read_head_at(core: &WorkspaceFs, git_dir: &[&[u8]]) -> Result<(gix::ObjectId, HeadRef), String> {
    use std::io::{BufRead as _, Read as _};
    let open = |rel: &[&[u8]]| {
        let p: Vec<&[u8]> = git_dir.iter().chain(rel).copied().collect();
        core.open_file(&p)
            .map_err(|e| format!("cannot read .git: {e:?}"))
    };
    let read = |rel: &[&[u8]], shown: &str| -> Result<Option<Vec<u8>>, String> {
        let Some(f) = open(rel)? else {
            return Ok(None);
        };
        let mut out = Vec::new();
        f.take(REF_LINE_MAX + 1)
            .read_to_end(&mut out)
            .map_err(|e| format!("cannot read .git/{shown}: {e}"))?;
        if out.len() as u64 > REF_LINE_MAX {
            return Err(format!(
                ".git/{shown} is larger than {REF_LINE_MAX} bytes: not a ref"
            ));
        }
        Ok(Some(out))
    };
    let head = read(&[b"HEAD"], "HEAD")?.ok_or("the workspace has no .git/HEAD")?;
    let head = String::from_utf8_lossy(&head).trim().to_string();
    let parse = |s: &str| {
        gix::ObjectId::from_hex(s.trim().as_bytes())
            .map_err(|e| format!("bad object id {s:?} in .git: {e}"))
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
                .map_err(|e| format!("cannot read .git/packed-refs: {e}"))?;
            if n == 0 {
                break;
            }
            if n as u64 > REF_LINE_MAX {
                return Err(format!(
                    ".git/packed-refs has a line longer than {REF_LINE_MAX} bytes: not refs"
                ));
            }
            let line = String::from_utf8_lossy(&line);
            if let Some((oid, n)) = line.trim_end_matches(['\n', '\r']).split_once(' ')
                && n == name
            {
                return Ok((parse(oid)?, head_ref));
            }
        }
    }
    Err(format!(
        "HEAD ({name}) has no commit yet: nothing to snapshot"
    ))
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
        c: &Caller,
    ) -> Reply {
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
            return Err(format!(
                "thread {thread} is bound to project {}; it cannot be re-bound to {p}",
                b.project
            ));
        }
        if let (Some(rec), Some(p)) = (&live, project)
            && rec.chat
        {
            return Err(format!(
                "thread {thread} has a chat workspace (no project); release it before binding it to {p}"
            ));
        }
        if let (Some(rec), Some(r)) = (&live, git_ref) {
            let resolved = self.store(&rec.project)?.resolve(Some(r))?;
            if gix::ObjectId::from_hex(rec.base_commit.as_bytes()).ok() != Some(resolved.commit) {
                return Err(format!(
                    "thread {thread} already has a workspace based on {}; --ref {r} applies only when it is created",
                    rec.base_commit.get(..12).unwrap_or(&rec.base_commit)
                ));
            }
        }
        let path = json!(self.layout.mountpoint(thread));
        if let Some(mut rec) = live {
            // One more user of the live workspace, counted in its record so that a restart keeps
            // the count. A record the daemon serves (or should: its remount failed) keeps its users.
            let served = lock(&self.mounts).contains_key(thread);
            let before = rec.clone();
            rec.users = if served || rec.mounted {
                rec.users.max(1) + 1
            } else {
                1
            };
            rec.mounted = true;
            rec.save(&self.layout)?;
            if !served && let Err(e) = self.mount(&rec) {
                let _ = before.save(&self.layout);
                return Err(e);
            }
            let warnings = self.grant_owner(&rec.project, rec.owner, false);
            return Ok((path, warnings.into_iter().collect()));
        }
        self.check_root()?;
        let fork = match (&binding, project) {
            (Some(b), _) => {
                if git_ref.is_some() {
                    return Err(format!(
                        "thread {thread} was released; it resumes from its last snapshot (--ref applies only when a thread is created)"
                    ));
                }
                self.resume_fork(thread, b)?
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
                }
            }
            (None, None) => {
                if git_ref.is_some() {
                    return Err("a chat workspace (no --project) has no refs to choose from".into());
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
                }
            }
        };
        let forked_project = fork.project.clone();
        self.create(thread, fork, owner)?;
        if binding.is_none() && project.is_some() {
            let rec = WorkspaceRecord::load(&self.layout, thread)?.ok_or("workspace vanished")?;
            let b = Binding {
                thread: thread.into(),
                project: rec.project.clone(),
                base_commit: rec.base_commit.clone(),
                branch: rec.branch.clone(),
                created: now(),
                owner,
            };
            if let Err(e) = b.save(&self.layout) {
                self.discard(thread);
                return Err(e);
            }
        }
        let warnings = self.grant_owner(&forked_project, owner, false);
        Ok((path, warnings.into_iter().collect()))
    }

    /// The fork that brings a released thread back: from its last snapshot (files = the snapshot's
    /// tree, HEAD at its first parent on the branch it was on), or from its first base when it was
    /// released with nothing saved.
    fn resume_fork(&self, thread: &str, b: &Binding) -> Result<Fork, String> {
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
            });
        };
        // The workspace comes back as a fork of HEAD (whose index is shared and usually already
        // built) with the snapshot's changes applied over it: O(changed paths), and every change
        // reads as uncommitted.
        let (tree, parents, message, _) = snap::commit_info(&repo, s)?;
        let head = *parents.first().ok_or("the snapshot has no parent")?;
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
        })
    }

    /// Creates, seeds and mounts a new workspace. On failure nothing of it remains.
    fn create(
        &self,
        thread: &str,
        fork: Fork,
        owner: crate::workspace::Owner,
    ) -> Result<(), String> {
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
        };
        rec.save(&self.layout)?;
        let made = (|| {
            let core = self.load_core(&rec)?;
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find the octofs binary: {e}"))?;
            let plan = crate::repo::plan(
                &self.layout,
                &proj,
                thread,
                &fork.head_commit,
                fork.branch.as_deref(),
                &exe,
            )?;
            let index = {
                let il = self
                    .locks
                    .get(&format!("index:{}-{}", fork.index_tree, fork.base_tree));
                let _ig = lock(&il);
                crate::repo::shared_index(
                    &self.layout,
                    &*self.store(&fork.project)?,
                    fork.index_tree,
                    fork.base_tree,
                    fork.base_time,
                    rec.owner.uid,
                    rec.owner.gid,
                )?
            };
            crate::repo::seed(&core, &plan, &index, fork.base_time)?;
            if let Some((from, to)) = fork.apply {
                self.apply_diff(&core, &fork.project, from, to)?;
            }
            // What git dropped (modes, owners, special files, empty directories) comes back
            // before the mount exists: no moment where a file is wider than it was.
            if let Some(s) = &fork.saved {
                let id = gix::ObjectId::from_hex(s.as_bytes()).map_err(|e| e.to_string())?;
                let repo = snap::open(&self.layout.mirror(&fork.project))?;
                super::posix::restore(&core, &repo, id)?;
            }
            let mut bookkeeping = Vec::new();
            if let Some(s) = &fork.saved {
                bookkeeping.push(
                    core.put_file_quietly(
                        &[".git", "refs", "octomate"],
                        "saved",
                        format!("{s}\n").as_bytes(),
                    )
                    .map_err(|e| format!("cannot record refs/octomate/saved: {e:?}"))?,
                );
            }
            rec.saved = Some(SavedMark {
                commit: fork.saved.clone(),
                generation: core.generation(),
                at: core
                    .clock()
                    .map_err(|e| format!("cannot read the upper layer's clock: {e:?}"))?,
                bookkeeping,
            });
            rec.save(&self.layout)?;
            self.mount_core(&rec, core)
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
        }
        made
    }

    /// Applies the difference between two trees of the mirror to a workspace: removals first
    /// (deepest first), then additions and changes.
    fn apply_diff(
        &self,
        core: &WorkspaceFs,
        project: &str,
        from: gix::ObjectId,
        to: gix::ObjectId,
    ) -> Result<(), String> {
        use crate::fs::TreeChange;
        let mirror = self.layout.mirror(project);
        let out = crate::git::git_bytes(
            Some(&mirror),
            &[
                "diff-tree",
                "-r",
                "-z",
                "--no-renames",
                &from.to_string(),
                &to.to_string(),
            ]
            .map(std::ffi::OsStr::new),
        )
        .map_err(|e| format!("git diff-tree: {e}"))?;
        let fields = split_nul(&out);
        let mut removals = Vec::new();
        let mut additions = Vec::new();
        for pair in fields.chunks(2) {
            let [meta, path] = pair else { continue };
            let meta = String::from_utf8_lossy(meta);
            let f: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
            let [_, new_mode, _, new_id, status] = f[..] else {
                return Err(format!("unexpected diff-tree output {meta:?}"));
            };
            let id = gix::ObjectId::from_hex(new_id.as_bytes()).map_err(|e| e.to_string())?;
            let change = match (status, new_mode) {
                ("D", _) => TreeChange::Remove,
                (_, "100644") => TreeChange::File { id, exec: false },
                (_, "100755") => TreeChange::File { id, exec: true },
                (_, "120000") => TreeChange::Symlink { id },
                (_, "160000") => TreeChange::Gitlink { id },
                _ => return Err(format!("unexpected diff-tree entry {meta:?}")),
            };
            if change == TreeChange::Remove || status == "T" {
                removals.push(path.clone());
            }
            if change != TreeChange::Remove {
                additions.push((path.clone(), change));
            }
        }
        removals.sort_by(|a, b| b.cmp(a));
        for p in &removals {
            core.apply(p, &TreeChange::Remove)
                .map_err(|e| format!("cannot restore {}: {e:?}", String::from_utf8_lossy(p)))?;
        }
        for (p, c) in &additions {
            core.apply(p, c)
                .map_err(|e| format!("cannot restore {}: {e:?}", String::from_utf8_lossy(p)))?;
        }
        Ok(())
    }

    /// Creates the blank repository chat workspaces fork from, once.
    fn ensure_blank(&self) -> Result<(), String> {
        let l = self.locks.get(&format!("project:{BLANK}"));
        let _g = lock(&l);
        let dir = self.layout.mirror(BLANK);
        if dir.join(".git").exists() {
            return Ok(());
        }
        let staging = self
            .layout
            .mirrors()
            .join(format!(".staging-blank-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .map_err(|e| format!("cannot create the blank repository: {e}"))?;
        let made = (|| {
            crate::git!(Some(&staging); "init", "--quiet", "--initial-branch=main")?;
            let empty =
                crate::git!(Some(&staging); "hash-object", "-t", "tree", "-w", "/dev/null")?;
            let commit = crate::git::git_env(
                Some(&staging),
                &[
                    "commit-tree",
                    &empty,
                    "-m",
                    "octofs: blank repository for chat workspaces",
                ]
                .map(std::ffi::OsStr::new),
                &[
                    ("GIT_AUTHOR_NAME", "octofs".as_ref()),
                    ("GIT_AUTHOR_EMAIL", "octofs@localhost".as_ref()),
                    ("GIT_COMMITTER_NAME", "octofs".as_ref()),
                    ("GIT_COMMITTER_EMAIL", "octofs@localhost".as_ref()),
                ],
            )?;
            crate::git!(Some(&staging); "update-ref", "refs/heads/main", &commit)?;
            std::fs::rename(&staging, &dir).map_err(|e| e.to_string())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(format!("cannot create the blank repository: {e}"));
        }
        Ok(())
    }

    /// `octofs snapshot`: saves the working state; returns the snapshot commit.
    pub(super) fn snapshot(&self, thread: &str, c: &Caller) -> Reply {
        validate(NameKind::Thread, thread)?;
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        self.check_thread(c, thread)?;
        let id = self.snapshot_locked(thread)?;
        Ok((json!(id), vec![]))
    }

    fn live_record(&self, thread: &str) -> Result<WorkspaceRecord, String> {
        match WorkspaceRecord::load(&self.layout, thread)? {
            Some(r) => Ok(r),
            None if Binding::load(&self.layout, thread)?.is_some() => {
                Err(format!("thread {thread} is released (open it to resume)"))
            }
            None => Err(format!("unknown thread {thread:?}")),
        }
    }

    fn core_of(&self, rec: &WorkspaceRecord) -> Result<Arc<WorkspaceFs>, String> {
        if let Some(m) = lock(&self.mounts).get(&rec.thread) {
            return Ok(m.core.clone());
        }
        self.mount(rec)?;
        lock(&self.mounts)
            .get(&rec.thread)
            .map(|m| m.core.clone())
            .ok_or_else(|| format!("thread {} is not mounted", rec.thread))
    }

    /// Snapshot with the thread's lock held.
    pub(super) fn snapshot_locked(&self, thread: &str) -> Result<String, String> {
        let mut rec = self.live_record(thread)?;
        if rec.chat {
            return Err(format!(
                "thread {thread} is a chat workspace (no project): it is never saved"
            ));
        }
        let core = self.core_of(&rec)?;
        // 1. A consistent view of what changed (the only step that holds the workspace's lock).
        let view = core
            .view()
            .map_err(|e| format!("cannot read the workspace's changes: {e:?}"))?;
        let (head, head_ref) = read_head(&core)?;
        // 2. What `git add -A` would leave out.
        let mut edits = add_all::keep(
            &core,
            &self.layout.state,
            nested_repositories(&core, view.edits),
        )?;
        edits.sort_by(|a, b| a.path().cmp(b.path()));
        // 3. Objects, then the ref.
        let mirror = self.layout.mirror(&rec.project);
        let project = &rec.project;
        let gone = || {
            format!(
                "the mirror of project {project} is missing or broken: `octofs mirror sync {project}` clones it again; `octofs release {thread} --discard` drops the workspace without saving"
            )
        };
        let mut repo = snap::open(&mirror).map_err(|e| format!("{}: {e}", gone()))?;
        if !repo.has_object(view.base_tree) {
            return Err(format!(
                "the workspace's base tree {} is not in the mirror of project {project} (the mirror was re-created without it); `octofs release {thread} --discard` drops the workspace without saving",
                view.base_tree
            ));
        }
        let tref = snap::thread_ref(thread);
        let prev = snap::read_ref(&repo, &tref);
        // The ref must be where this workspace last left it. One exception: a snapshot of this
        // workspace that moved the ref just before the daemon died, before it was recorded here
        // (its second parent is what was recorded).
        let mut saved = rec
            .saved
            .as_ref()
            .and_then(|m| m.commit.as_deref())
            .and_then(|c| gix::ObjectId::from_hex(c.as_bytes()).ok());
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
                Some(p) => {
                    let (_, pp, msg, _) = snap::commit_info(&repo, p)?;
                    pp.get(1).copied() == saved
                        && String::from_utf8_lossy(&msg)
                            .starts_with(&format!("octofs snapshot of thread {thread}\n"))
                }
                None => false,
            };
            if !ours {
                return Err(format!(
                    "{tref} moved underneath (expected {}, found {}); not overwriting it",
                    saved.map_or("none".into(), |s| s.to_string()),
                    prev.map_or("none".into(), |s| s.to_string())
                ));
            }
        }
        if !repo.has_object(head) {
            // The agent's own commits: carried into the mirror (and kept reachable there).
            let n = carry::carry(&core, &self.layout.state, &repo, thread, head)?;
            tracing::info!(%thread, %head, objects = n, "carried the agent's commits");
            repo = snap::open(&mirror)?;
        }
        let tree = snap::build_tree(&repo, view.base_tree, &edits)?;
        // What the tree cannot hold goes into the POSIX record, named by the commit's message.
        let posix = match super::posix::record_of(&repo, tree, &view.meta, &rec.owner)? {
            Some(r) => Some(posix_record::write_blob(&repo, &r)?),
            None => None,
        };
        let mut message = snap::message(thread, &head_ref);
        if let Some(b) = posix {
            message.push_str(&posix_record::trailer(b));
        }
        if let Some(p) = prev {
            let (ptree, pparents, pmsg, _) = snap::commit_info(&repo, p)?;
            if ptree == tree
                && pparents.first() == Some(&head)
                && snap::head_of(&pmsg) == head_ref
                && posix_record::blob_of(&pmsg) == posix
            {
                self.mark_saved(
                    &mut rec,
                    &core,
                    &p.to_string(),
                    view.generation,
                    view.taken_at,
                )?;
                return Ok(p.to_string());
            }
        }
        let mut parents = vec![head];
        parents.extend(prev);
        let commit = snap::write_commit(&repo, tree, parents, &message)?;
        // The record is reachable before the snapshot's ref names the commit that needs it.
        if let Some(b) = posix {
            posix_record::keep(&repo, thread, commit, b)?;
        }
        snap::cas_ref(
            &repo,
            &tref,
            prev,
            commit,
            &format!("octofs: snapshot of {thread}"),
        )?;
        self.mark_saved(
            &mut rec,
            &core,
            &commit.to_string(),
            view.generation,
            view.taken_at,
        )?;
        tracing::info!(%thread, %commit, "snapshot");
        Ok(commit.to_string())
    }

    fn mark_saved(
        &self,
        rec: &mut WorkspaceRecord,
        core: &WorkspaceFs,
        commit: &str,
        generation: u64,
        at: Ts,
    ) -> Result<(), String> {
        let ino = core
            .put_file_quietly(
                &[".git", "refs", "octomate"],
                "saved",
                format!("{commit}\n").as_bytes(),
            )
            .map_err(|e| format!("cannot record refs/octomate/saved: {e:?}"))?;
        // A process in the mount reads the new mark as soon as the snapshot is answered.
        self.tell_kernel(&rec.thread);
        rec.saved = Some(SavedMark {
            commit: Some(commit.into()),
            generation,
            at,
            bookkeeping: vec![ino],
        });
        rec.save(&self.layout)
    }

    /// `octofs release`: one user fewer; the last one saves (if anything changed), unmounts and drops
    /// the upper layer. A busy mount is refused unless `force`. `discard` drops the workspace at once
    /// without saving (every user's, busy or not): the way out when it cannot be saved, e.g. its mirror
    /// is gone; the thread's last snapshot stays where it was.
    pub(super) fn release(&self, thread: &str, force: bool, discard: bool, c: &Caller) -> Reply {
        let force = force || discard;
        validate(NameKind::Thread, thread)?;
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        self.check_thread(c, thread)?;
        let mut rec = match WorkspaceRecord::load(&self.layout, thread)? {
            Some(r) => r,
            None if Binding::load(&self.layout, thread)?.is_some() => {
                return Ok((
                    json!({"thread": thread, "released": true, "already": true}),
                    vec![],
                ));
            }
            None => return Err(format!("unknown thread {thread:?}")),
        };
        if rec.users > 1 && !force {
            rec.users -= 1;
            rec.save(&self.layout)?;
            return Ok((
                json!({"thread": thread, "released": false, "users": rec.users}),
                vec![],
            ));
        }
        // A busy mount is refused before anything is saved: a refused release changes nothing.
        if !force
            && lock(&self.mounts).contains_key(thread)
            && crate::sys::is_busy(&self.layout.mountpoint(thread))
        {
            return Err(format!(
                "{} is busy (a process still has its working directory or files in it); stop them or use --force",
                self.layout.mountpoint(thread).display()
            ));
        }
        let saved = if rec.chat || discard {
            None
        } else {
            Some(self.snapshot_locked(thread)?)
        };
        if discard {
            tracing::warn!(%thread, "discarding the workspace without saving it");
        }
        self.unmount_thread(thread, force)?;
        let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
        let _ = std::fs::remove_dir(self.layout.mountpoint(thread));
        tracing::info!(%thread, "released");
        Ok((
            json!({"thread": thread, "released": true, "snapshot": saved}),
            vec![],
        ))
    }

    /// Drops a workspace that failed to come into being.
    fn discard(&self, thread: &str) {
        let _ = self.unmount_thread(thread, true);
        let _ = std::fs::remove_dir_all(self.layout.workspace(thread));
        let _ = std::fs::remove_dir(self.layout.mountpoint(thread));
    }

    /// `octofs sweep`: releases every project workspace idle for `idle` seconds whose state the
    /// mirror has seen; never one with unsaved work, open files, or a chat workspace.
    pub fn sweep(&self, idle: u64) -> Reply {
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
                kept.push(json!({"thread": thread, "why": why}));
                continue;
            }
            match self.unmount_thread(&thread, false) {
                Ok(()) => {
                    let _ = std::fs::remove_dir_all(self.layout.workspace(&thread));
                    let _ = std::fs::remove_dir(self.layout.mountpoint(&thread));
                    tracing::info!(%thread, "swept");
                    released.push(thread);
                }
                Err(e) => kept.push(json!({"thread": thread, "why": e})),
            }
        }
        Ok((json!({"released": released, "kept": kept}), vec![]))
    }

    /// `octofs diff`: what changed between two commits (snapshots), or from one to the live state.
    pub(super) fn diff(
        &self,
        thread: &str,
        from: Option<&str>,
        to: Option<&str>,
        patch: bool,
        c: &Caller,
    ) -> Reply {
        validate(NameKind::Thread, thread)?;
        let l = self.locks.get(&format!("thread:{thread}"));
        let _g = lock(&l);
        self.check_thread(c, thread)?;
        let binding = Binding::load(&self.layout, thread)?;
        let live = WorkspaceRecord::load(&self.layout, thread)?;
        let project = match (&live, &binding) {
            (Some(r), _) if r.chat => {
                return Err(format!(
                    "thread {thread} is a chat workspace: nothing is saved to diff"
                ));
            }
            (Some(r), _) => r.project.clone(),
            (None, Some(b)) => b.project.clone(),
            (None, None) => return Err(format!("unknown thread {thread:?}")),
        };
        let mirror = self.layout.mirror(&project);
        let repo = snap::open(&mirror)?;
        let last = snap::read_ref(&repo, &snap::thread_ref(thread));
        let resolve = |spec: &str| -> Result<gix::ObjectId, String> {
            let spec = if spec == "saved" || spec == "last" {
                last.map(|l| l.to_string())
                    .ok_or("the thread has no snapshot yet")?
            } else {
                spec.to_string()
            };
            let out = crate::git!(Some(&mirror); "rev-parse", "--verify", "--quiet", "--end-of-options", &format!("{spec}^{{tree}}"))
                .map_err(|_| format!("{spec:?} does not name a commit or tree in the mirror"))?;
            gix::ObjectId::from_hex(out.as_bytes()).map_err(|e| e.to_string())
        };
        let from_tree = match (from, &live) {
            (Some(f), _) => resolve(f)?,
            (None, Some(r)) => {
                gix::ObjectId::from_hex(r.base_tree.as_bytes()).map_err(|e| e.to_string())?
            }
            (None, None) => resolve("saved")?,
        };
        let to_tree = match (to, &live) {
            (Some(t), _) => resolve(t)?,
            (None, Some(r)) => {
                let core = self.core_of(r)?;
                let view = core
                    .view()
                    .map_err(|e| format!("cannot read the workspace's changes: {e:?}"))?;
                let mut edits = add_all::keep(
                    &core,
                    &self.layout.state,
                    nested_repositories(&core, view.edits),
                )?;
                edits.sort_by(|a, b| a.path().cmp(b.path()));
                snap::build_tree(&repo, view.base_tree, &edits)?
            }
            (None, None) => resolve("saved")?,
        };
        let (a, b) = (from_tree.to_string(), to_tree.to_string());
        let out = if patch {
            crate::git!(Some(&mirror); "diff", "--no-color", "--no-ext-diff", "--no-textconv", &a, &b)
        } else {
            crate::git!(Some(&mirror); "diff-tree", "-r", "--name-status", "--no-renames", &a, &b)
        }?;
        Ok((json!({"from": a, "to": b, "diff": out}), vec![]))
    }
}

/// The project description of the blank repository.
fn blank_project() -> Project {
    Project {
        project: BLANK.into(),
        upstream: String::new(),
        kind: UpstreamKind::Directory,
        default_branch: "main".into(),
        last_sync: 0,
        access: Default::default(),
    }
}
