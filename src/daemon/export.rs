//! `octofs export <thread> [--dry-run]`: a thread's saved state written back into its project's
//! folder (a plain-directory upstream), with git as the merge.
//!
//! B is where the thread's history meets the folder's (the mirror commit it forked from, or a
//! later one it moved to), O the folder now (committed into the mirror exactly as `mirror sync` of
//! a folder does), T the thread's snapshot (tracked and untracked files, never ignored ones; a
//! live workspace that changed is snapshotted first). `git merge-tree` merges them in the mirror
//! with the hardened environment and no attributes. A conflict refuses the whole export before
//! the folder is touched, naming every conflicting path; so does a path the merge would create
//! where the folder holds a file git does not track there (an ignored one): nothing in the folder
//! is lost. Otherwise exactly the paths where the merge differs from O are written (created,
//! replaced through a rename, or deleted; modes and symlinks as git has them), as the folder's
//! owner (the thread's filesystem identity is theirs while writing: no root-owned file is left
//! and no path reaches further than they could), and the folder is committed again so the next
//! sync sees no change. Everything else in the folder, ignored and untracked files included, is
//! left alone.
//!
//! Runs git only in the mirror; reads the workspace only through the snapshot machinery.

use std::ffi::OsStr;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::{Context, Error};
use super::guard::{Bound, LockKey};
use super::proto::{ExportChange, Exported};
use super::refusal::{ChatOp, ExportRefusal, MoveRefusal};
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::git::Git;
use crate::git::mirror::{self, UpstreamKind};
use crate::git::snapshot as snap;

/// The empty tree: as `attr.tree`, the merge reads no `.gitattributes` at all (no merge driver or
/// `merge=union` of the folder's own decides what the thread's files become).
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// One path the export writes: what git has for it in the merge result.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Write {
    /// Removed from the folder.
    Delete,
    /// A regular file (executable or not) with the blob's content.
    File { id: gix::ObjectId, exec: bool },
    /// A symlink to the blob's content.
    Symlink { id: gix::ObjectId },
}

/// The writes of one export, in the order they run: deletions deepest first, then the rest in
/// path order (parents before children).
struct Plan {
    changes: Vec<(Vec<u8>, char, Write)>,
    /// Nested repositories (gitlinks) the merge changed: the export cannot write them.
    skipped: Vec<Vec<u8>>,
}

impl Daemon {
    /// `octofs export <thread> [--dry-run]`.
    pub(super) fn export(&self, thread: &str, dry_run: bool, c: &Caller) -> Reply<Exported> {
        let thread_lock = self.thread_lock(thread)?;
        let (
            Bound {
                project,
                live,
                binding,
            },
            _held,
        ) = thread_lock.bound(c, ChatOp::Export)?;
        let p = mirror::require(&self.layout, &project)?;
        if p.kind != UpstreamKind::Directory {
            return Err(ExportRefusal::NotAFolder {
                project,
                upstream: mirror::redact(&p.upstream),
            }
            .into());
        }
        let folder = PathBuf::from(&p.upstream);
        let meta = match std::fs::symlink_metadata(&folder) {
            Ok(m) if m.is_dir() => m,
            _ => {
                return Err(ExportRefusal::FolderGone {
                    project,
                    folder: folder.display().to_string(),
                }
                .into());
            }
        };
        let (uid, gid) = (meta.uid(), meta.gid());
        if !self.is_admin(c) && c.uid != uid {
            return Err(ExportRefusal::NotTheFolderOwner {
                folder: folder.display().to_string(),
                uid,
            }
            .into());
        }

        // T: the thread's saved state.
        let mirror_dir = self.layout.mirror(&project);
        let t = match &live {
            Some(r) => match self.unchanged_since_saved(r)? {
                Some(s) => s,
                None => {
                    let s = self.snapshot_locked(thread)?;
                    gix::ObjectId::from_hex(s.as_bytes())
                        .context(|| format!("snapshot id {s:?}"))?
                }
            },
            None => {
                let repo = snap::open(&mirror_dir)?;
                match snap::read_ref(&repo, &snap::thread_ref(thread)) {
                    Some(s) => s,
                    None => {
                        let b = binding.as_ref().ok_or(MoveRefusal::NoBinding)?;
                        b.base_commit
                    }
                }
            }
        };

        let pl = self.locks.get(&LockKey::project(&project));
        let _pg = lock(&pl);
        // O: the folder now, committed as `mirror sync` does.
        let synced = mirror::sync(&self.layout, &project, 0)?;
        if let Some(w) = synced.warning {
            return Err(ExportRefusal::NotSynced { warning: w }.into());
        }
        let o = synced.head.ok_or_else(|| ExportRefusal::NoCommit {
            project: project.clone(),
        })?;
        let merged = merge(&mirror_dir, &o, &t.to_string())?;
        let plan = plan(&mirror_dir, &o, &merged)?;
        check_folder(&folder, &plan)?;
        let mut warnings: Vec<String> = plan
            .skipped
            .iter()
            .map(|p| {
                format!(
                    "{}: a nested repository (gitlink) is not exported",
                    String::from_utf8_lossy(p)
                )
            })
            .collect();
        let changes: Vec<ExportChange> = plan
            .changes
            .iter()
            .map(|(path, status, _)| ExportChange {
                status: status.to_string(),
                path: String::from_utf8_lossy(path).into_owned(),
            })
            .collect();
        let mut commit = Some(o.clone());
        if !dry_run && !plan.changes.is_empty() {
            let repo = snap::open(&mirror_dir)?;
            let written = write_all(&repo, &folder, &plan, (uid, gid));
            // What was written is recorded even after a failure: the next sync sees no change.
            let recorded = mirror::sync(&self.layout, &project, 0);
            written?;
            let recorded = recorded?;
            if let Some(w) = recorded.warning {
                warnings.push(w);
            }
            commit = recorded.head;
        }
        tracing::info!(%thread, %project, changes = changes.len(), dry_run, "export");
        Ok((
            Exported {
                thread: thread.into(),
                project,
                folder: folder.display().to_string(),
                dry_run,
                snapshot: t.to_string(),
                commit,
                changes,
            },
            warnings,
        ))
    }
}

/// The tree of the three-way merge of `ours` (the folder) and `theirs` (the thread) at their merge
/// base, or a refusal naming every conflicting path.
fn merge(mirror_dir: &Path, ours: &str, theirs: &str) -> Result<String, Error> {
    let attr = format!("attr.tree={EMPTY_TREE}");
    let out = Git::new(Some(mirror_dir))
        .args(["-c", attr.as_str(), "merge-tree", "--write-tree", "-z"])
        .args(["--name-only", "--no-messages", ours, theirs])
        .into_command()
        .stdin(std::process::Stdio::null())
        .output()
        .context(|| "cannot run git merge-tree".to_string())?;
    let fields: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
    let tree = String::from_utf8_lossy(fields.first().copied().unwrap_or_default()).into_owned();
    match out.status.code() {
        Some(0) => Ok(tree),
        Some(1) => {
            let mut paths: Vec<String> = fields[1..]
                .iter()
                .take_while(|f| !f.is_empty())
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            paths.dedup();
            Err(ExportRefusal::Conflicts { paths }.into())
        }
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(ExportRefusal::MergeTree {
                line: err
                    .lines()
                    .last()
                    .unwrap_or("no message")
                    .trim()
                    .to_string(),
            }
            .into())
        }
    }
}

/// The paths where `merged` differs from the folder's commit `o`.
fn plan(mirror_dir: &Path, o: &str, merged: &str) -> Result<Plan, Error> {
    let out = Git::new(Some(mirror_dir))
        .args(["diff-tree", "-r", "-z", "--no-renames", "--end-of-options"])
        .args([format!("{o}^{{tree}}").as_str(), merged])
        .output_bytes()
        .context(|| "git diff-tree".to_string())?;
    let fields: Vec<&[u8]> = out.split(|b| *b == 0).filter(|f| !f.is_empty()).collect();
    let mut deletions = Vec::new();
    let mut writes = Vec::new();
    let mut skipped = Vec::new();
    for pair in fields.chunks(2) {
        let [meta, path] = pair else { continue };
        let meta = String::from_utf8_lossy(meta);
        let f: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [old_mode, new_mode, _, new_id, status] = f[..] else {
            return Err(ExportRefusal::DiffTreeOutput {
                meta: meta.to_string(),
            }
            .into());
        };
        let path = path.to_vec();
        if old_mode == "160000" || new_mode == "160000" {
            skipped.push(path);
            continue;
        }
        let id = gix::ObjectId::from_hex(new_id.as_bytes())
            .context(|| format!("diff-tree object id {new_id:?}"))?;
        let write = match (status, new_mode) {
            ("D", _) => Write::Delete,
            (_, "100644") => Write::File { id, exec: false },
            (_, "100755") => Write::File { id, exec: true },
            (_, "120000") => Write::Symlink { id },
            _ => {
                return Err(ExportRefusal::DiffTreeEntry {
                    meta: meta.to_string(),
                }
                .into());
            }
        };
        match write {
            Write::Delete => deletions.push((path, 'D', write)),
            _ => writes.push((path, if status == "A" { 'A' } else { 'M' }, write)),
        }
    }
    deletions.sort_by(|a, b| b.0.cmp(&a.0));
    writes.sort_by(|a, b| a.0.cmp(&b.0));
    deletions.extend(writes);
    Ok(Plan {
        changes: deletions,
        skipped,
    })
}

/// Refuses, before anything is written, a plan that would lose something of the folder's or reach
/// outside it: a new path where the folder holds a file git does not track (an ignored file), or
/// a path under a symlink or a file that stays.
fn check_folder(folder: &Path, plan: &Plan) -> Result<(), Error> {
    let deleted: std::collections::HashSet<&[u8]> = plan
        .changes
        .iter()
        .filter(|(_, _, w)| *w == Write::Delete)
        .map(|(p, _, _)| p.as_slice())
        .collect();
    let mut lost = Vec::new();
    let mut outside = Vec::new();
    for (path, status, _) in &plan.changes {
        let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        let mut cur = folder.to_path_buf();
        for (i, c) in comps.iter().enumerate() {
            cur.push(OsStr::from_bytes(c));
            let Ok(m) = std::fs::symlink_metadata(&cur) else {
                break;
            };
            let prefix = &path[..comps[..=i].iter().map(|c| c.len() + 1).sum::<usize>() - 1];
            if i + 1 < comps.len() && !m.is_dir() && !deleted.contains(prefix) {
                outside.push(String::from_utf8_lossy(path).into_owned());
                break;
            }
            if i + 1 == comps.len()
                && *status == 'A'
                && !(m.is_dir() && has_deleted_under(&deleted, path))
            {
                lost.push(String::from_utf8_lossy(path).into_owned());
            }
        }
    }
    if !lost.is_empty() {
        return Err(ExportRefusal::Untracked { paths: lost }.into());
    }
    if !outside.is_empty() {
        return Err(ExportRefusal::NotADirectory { paths: outside }.into());
    }
    Ok(())
}

fn has_deleted_under(deleted: &std::collections::HashSet<&[u8]>, dir: &[u8]) -> bool {
    deleted
        .iter()
        .any(|d| d.len() > dir.len() && d.starts_with(dir) && d[dir.len()] == b'/')
}

/// Runs the plan in `folder`: each path's blob is read from the mirror as the daemon, and written
/// with the folder owner's filesystem identity (`owner`).
fn write_all(
    repo: &gix::Repository,
    folder: &Path,
    plan: &Plan,
    owner: (u32, u32),
) -> Result<(), Error> {
    for (path, _, write) in &plan.changes {
        let bytes = match write {
            Write::Delete => Vec::new(),
            Write::File { id, .. } | Write::Symlink { id } => repo
                .find_object(*id)
                .map(|o| o.detach().data)
                .context(|| format!("cannot read the blob of {}", String::from_utf8_lossy(path)))?,
        };
        crate::sys::as_fs_user(owner.0, owner.1, || write_one(folder, path, write, &bytes))
            .context(|| "cannot take the folder owner's identity".to_string())??;
    }
    Ok(())
}

/// Writes one path of the plan: a deletion (and the directories it empties), or a file or
/// symlink written beside its name and renamed over it, with the directories it needs.
fn write_one(folder: &Path, path: &[u8], write: &Write, bytes: &[u8]) -> Result<(), Error> {
    {
        let target = folder.join(OsStr::from_bytes(path));
        let shown = || String::from_utf8_lossy(path).into_owned();
        match write {
            Write::Delete => {
                match std::fs::symlink_metadata(&target) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => std::fs::remove_file(&target)
                        .context(|| format!("cannot delete {}", shown()))?,
                    Err(_) => {}
                }
                // Directories the deletion emptied go too, as git keeps none (never the folder).
                let mut dir = target.parent().map(Path::to_path_buf);
                while let Some(d) = dir {
                    if d == folder || std::fs::remove_dir(&d).is_err() {
                        break;
                    }
                    dir = d.parent().map(Path::to_path_buf);
                }
            }
            Write::File { .. } | Write::Symlink { .. } => {
                let parent = target.parent().unwrap_or(folder);
                make_dirs(folder, parent).context(|| format!("cannot create {}", shown()))?;
                if let Ok(m) = std::fs::symlink_metadata(&target)
                    && m.is_dir()
                {
                    // A directory whose tracked files went: what is left is untracked, kept.
                    std::fs::remove_dir(&target).context(|| {
                        format!("cannot replace the directory {} (it is not empty)", shown())
                    })?;
                }
                let name = target.file_name().unwrap_or_default();
                let mut tmp_name = std::ffi::OsString::from(".");
                tmp_name.push(name);
                tmp_name.push(format!(".octofs-export-{}", std::process::id()));
                let tmp = parent.join(tmp_name);
                let _ = std::fs::remove_file(&tmp);
                let made = match write {
                    Write::Symlink { .. } => {
                        std::os::unix::fs::symlink(OsStr::from_bytes(bytes), &tmp)
                    }
                    Write::File { exec, .. } => {
                        let mode = if *exec { 0o755 } else { 0o644 };
                        std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(mode)
                            .custom_flags(libc::O_NOFOLLOW)
                            .open(&tmp)
                            .and_then(|mut f| {
                                f.write_all(bytes)?;
                                f.set_permissions(std::fs::Permissions::from_mode(mode))?;
                                f.sync_data()
                            })
                    }
                    Write::Delete => Ok(()),
                };
                let placed = made.and_then(|()| std::fs::rename(&tmp, &target));
                if let Err(e) = placed {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e).context(|| format!("cannot write {}", shown()));
                }
            }
        }
    }
    Ok(())
}

/// Creates the directories from `folder` down to `dir` that are missing (mode 0755), never
/// following a symlink on the way.
fn make_dirs(folder: &Path, dir: &Path) -> std::io::Result<()> {
    let rel = dir.strip_prefix(folder).unwrap_or(Path::new(""));
    let mut cur = folder.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotADirectory,
                    format!("{} is not a directory", cur.display()),
                ));
            }
            Err(_) => {
                std::fs::create_dir(&cur)?;
                std::fs::set_permissions(&cur, std::fs::Permissions::from_mode(0o755))?;
            }
        }
    }
    Ok(())
}
