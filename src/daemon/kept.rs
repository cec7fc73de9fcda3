//! What a snapshot keeps beside its tree, and putting it back on resume (policy; the format and
//! its place in the mirror are `git::kept`, reading and writing a workspace is the core's).
//!
//! `git add -A` leaves out two kinds of a workspace's own state, which a release must not lose:
//! - nested repositories: a directory (below the top) holding a `.git` — an agent's `git clone`
//!   of a dependency, a tool's `git init` — whose committed, changed and untracked files and whose
//!   `.git` (refs, objects, config, index: plain data) the tree holds at most as a gitlink;
//! - names git refuses in a tree (`.GIT` and every other case of `.git`, its NTFS aliases such as
//!   `git~1` or `.git.`, a `.gitmodules` symlink): the subtree at the first refused name. Without
//!   this, one such name made every snapshot of the thread fail.
//!
//! Both are kept whole, whatever the ignore rules say (git adds none of them): every path below
//! the root with its kind, bytes (a file's content, a symlink's target), permission bits, owner,
//! group, device number, hard links and, outside `.git` directories, extended attributes. The
//! snapshot's tree stays exactly what `git add -A` makes; the outer repository's `git status` sees
//! what it saw. The daemon reads a kept repository only through the core, as bytes: it never runs
//! git in it and never reads its configuration or hooks as anything but data.
//!
//! A kept side may come from a share remote or be forged, like a POSIX record: every entry is
//! applied through `posix::admit` with the thread owner's authority, a root must be a relative
//! path of plain names that is not the workspace's own `.git`, and an entry outside its record's
//! roots is left out. What is left out is named to the caller, never dropped silently.
//!
//! Must not touch: the snapshot's tree (the snapshot assembly's), the POSIX record
//! (`daemon::posix`), the workspace's own `.git`.

use std::collections::{HashMap, HashSet};

use fuser::FileType;
use gix::ObjectId;

use super::error::{Context, Error, on_workspace};
use super::posix::{Admitted, LeftOut, admit};
use super::refusal::SnapshotRefusal;
use crate::access::Caller;
use crate::fs::{NodeMeta, TreeChange, WorkspaceFs};
use crate::git::kept::{self, KeptEntry, KeptRecord, KeptRoot, KeptWhy};
use crate::git::posix_record::{PosixEntry, PosixKind};
use crate::git::snapshot::{self as snap, ViewEdit};

pub use crate::git::kept::refused_name;

/// The kept root `path` is in, if any (`symlink`: the last component is a symlink): the directory
/// above the first `.git` below the top (a nested repository), or the first name git refuses.
/// Nothing below the workspace's own `.git` is ever kept here.
pub fn root_of(path: &[u8], symlink: bool) -> Option<KeptRoot> {
    let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    let n = comps.len();
    for (i, c) in comps.iter().enumerate() {
        if *c == b".git" {
            if i == 0 {
                return None;
            }
            return Some(KeptRoot {
                path: comps[..i].join(&b'/'),
                why: KeptWhy::Nested,
            });
        }
        if refused_name(c, symlink && i + 1 == n) {
            return Some(KeptRoot {
                path: comps[..=i].join(&b'/'),
                why: KeptWhy::Refused,
            });
        }
    }
    None
}

/// `p` is `d` or below it.
fn at_or_under(p: &[u8], d: &[u8]) -> bool {
    p == d || (p.starts_with(d) && p.get(d.len()) == Some(&b'/'))
}

/// Sorted, without duplicates, without a root inside another.
fn outermost(mut roots: Vec<KeptRoot>) -> Vec<KeptRoot> {
    roots.sort_by(|a, b| a.path.cmp(&b.path));
    let mut out: Vec<KeptRoot> = Vec::new();
    for r in roots {
        if !out.iter().any(|o| at_or_under(&r.path, &o.path)) {
            out.push(r);
        }
    }
    out
}

/// Whether a root is one a workspace can hold and this module may write: a relative path of plain
/// names, not the workspace's own `.git` nor below it.
fn admissible_root(p: &[u8]) -> bool {
    !p.is_empty()
        && p.split(|b| *b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b".." && !c.contains(&0))
        && !at_or_under(p, b".git")
}

/// The kept roots a view's `edits` name (outermost only).
pub fn roots_in(edits: &[ViewEdit]) -> Vec<KeptRoot> {
    outermost(
        edits
            .iter()
            .filter_map(|e| root_of(e.path(), matches!(e, ViewEdit::Symlink { .. })))
            .collect(),
    )
}

/// Whether `path` is at or below one of `roots` (kept beside the tree, by this module).
pub fn is_kept(roots: &[KeptRoot], path: &[u8]) -> bool {
    roots.iter().any(|r| at_or_under(path, &r.path))
}

/// What one snapshot keeps beside its tree, decided from the view's edits before the tree is built.
pub struct Plan {
    /// Every kept root (outermost first).
    pub roots: Vec<KeptRoot>,
    /// Roots nothing changed in since the last snapshot: their entries are that snapshot's.
    reuse: HashSet<Vec<u8>>,
    /// The last snapshot's kept record (only when the view is incremental from it).
    prev: Option<KeptRecord>,
}

impl Plan {
    /// The roots the view's `edits` name, and the last snapshot's ones (`last`, when the edits are
    /// relative to its tree: `since_last`): an untouched one is reused as it was, one with a
    /// change at, below or above it is read again.
    pub fn of(
        repo: &gix::Repository,
        last: Option<ObjectId>,
        since_last: bool,
        edits: &[ViewEdit],
    ) -> Result<Plan, Error> {
        let mut roots: Vec<KeptRoot> = edits
            .iter()
            .filter_map(|e| root_of(e.path(), matches!(e, ViewEdit::Symlink { .. })))
            .collect();
        let mut reuse = HashSet::new();
        let mut prev = None;
        if since_last && let Some(l) = last {
            let (_, _, message, _) = snap::commit_info(repo, l)?;
            if let Some(side) = kept::side_of(&message) {
                let r = kept::read_side(repo, side)?;
                for root in &r.roots {
                    let touched = edits.iter().any(|e| {
                        at_or_under(e.path(), &root.path) || at_or_under(&root.path, e.path())
                    });
                    if !touched {
                        reuse.insert(root.path.clone());
                    }
                    roots.push(root.clone());
                }
                prev = Some(r);
            }
        }
        Ok(Plan {
            roots: outermost(roots),
            reuse,
            prev,
        })
    }

    fn refused(&self) -> impl Iterator<Item = &[u8]> {
        self.roots
            .iter()
            .filter(|r| r.why == KeptWhy::Refused)
            .map(|r| r.path.as_slice())
    }

    /// The edits without what is at or below a refused name (it never goes into the tree; nested
    /// repositories become gitlinks as before, in the snapshot assembly).
    pub fn strip(&self, edits: Vec<ViewEdit>) -> Vec<ViewEdit> {
        if self.refused().next().is_none() {
            return edits;
        }
        edits
            .into_iter()
            .filter(|e| !self.refused().any(|r| at_or_under(e.path(), r)))
            .collect()
    }

    /// The POSIX record's metadata split: what is outside every kept root (for the record), and
    /// what is at or below one (kept here instead; its extended attributes are kept).
    pub fn split_meta(&self, meta: Vec<NodeMeta>) -> (Vec<NodeMeta>, Vec<NodeMeta>) {
        if self.roots.is_empty() {
            return (meta, Vec::new());
        }
        meta.into_iter()
            .partition(|m| !self.roots.iter().any(|r| at_or_under(&m.path, &r.path)))
    }

    /// Reads every kept root through the core (or takes an untouched one from the last snapshot)
    /// and writes the side tree for a snapshot of tree `tree`; `None` when nothing is kept.
    /// `meta` (the view's metadata below the roots: [`Self::split_meta`]) gives extended
    /// attributes.
    pub fn write(
        &self,
        core: &WorkspaceFs,
        repo: &gix::Repository,
        tree: ObjectId,
        meta: &[NodeMeta],
    ) -> Result<Option<ObjectId>, Error> {
        if self.roots.is_empty() {
            return Ok(None);
        }
        let xattrs: HashMap<&[u8], &NodeMeta> =
            meta.iter().map(|m| (m.path.as_slice(), m)).collect();
        let mut roots = Vec::new();
        let mut entries: Vec<(KeptEntry, u64, u32)> = Vec::new();
        for root in &self.roots {
            if self.reuse.contains(&root.path)
                && let Some(p) = &self.prev
            {
                entries.extend(
                    p.entries
                        .iter()
                        .filter(|e| at_or_under(&e.meta.path, &root.path))
                        .map(|e| (e.clone(), 0, 1)),
                );
                roots.push(root.clone());
                continue;
            }
            if read_root(core, repo, root, &xattrs, &mut entries)? {
                roots.push(root.clone());
            }
        }
        if roots.is_empty() {
            return Ok(None);
        }
        // Hard links: the first name in path order is the file, the later ones name it.
        entries.sort_by(|a, b| a.0.meta.path.cmp(&b.0.meta.path));
        let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
        let entries: Vec<KeptEntry> = entries
            .into_iter()
            .map(|(mut e, ino, nlink)| {
                if nlink > 1 && e.meta.kind == PosixKind::File {
                    match first.get(&ino) {
                        Some(f) => e.meta.link = Some(f.clone()),
                        None => {
                            first.insert(ino, e.meta.path.clone());
                        }
                    }
                }
                e
            })
            .collect();
        let record = KeptRecord::new(tree, roots, entries);
        Ok(Some(kept::write_side(repo, &record)?))
    }
}

fn kind_of(t: FileType) -> PosixKind {
    match t {
        FileType::Directory => PosixKind::Dir,
        FileType::Symlink => PosixKind::Symlink,
        FileType::NamedPipe => PosixKind::Fifo,
        FileType::Socket => PosixKind::Socket,
        FileType::CharDevice => PosixKind::Char,
        FileType::BlockDevice => PosixKind::Block,
        _ => PosixKind::File,
    }
}

fn shown(p: &[u8]) -> String {
    String::from_utf8_lossy(p).escape_debug().to_string()
}

/// Reads the subtree at `root` through the core into `out` (entry, inode, link count), its
/// bytes written to the mirror as blobs. `false` when the root is no longer there (or no longer
/// a nested repository).
fn read_root(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    root: &KeptRoot,
    meta: &HashMap<&[u8], &NodeMeta>,
    out: &mut Vec<(KeptEntry, u64, u32)>,
) -> Result<bool, Error> {
    let comps =
        |p: &[u8]| -> Vec<Vec<u8>> { p.split(|b| *b == b'/').map(<[u8]>::to_vec).collect() };
    if root.why == KeptWhy::Nested {
        let mut git = comps(&root.path);
        git.push(b".git".to_vec());
        let g: Vec<&[u8]> = git.iter().map(Vec::as_slice).collect();
        if core
            .attr_at(&g)
            .map_err(on_workspace("cannot read a nested repository"))?
            .is_none()
        {
            return Ok(false);
        }
    }
    let mut stack = vec![root.path.clone()];
    let mut any = false;
    while let Some(path) = stack.pop() {
        let owned = comps(&path);
        let c: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let reading = || format!("cannot read {} to keep it", shown(&path));
        let Some(a) = core.attr_at(&c).map_err(on_workspace(reading()))? else {
            continue;
        };
        let kind = kind_of(a.kind);
        let blob = match kind {
            PosixKind::File => {
                // Streamed into the mirror: memory stays bounded whatever the file's size.
                let Some(f) = core.open_file(&c).map_err(on_workspace(reading()))? else {
                    continue;
                };
                Some(kept::write_file_blob(repo, f).context(reading)?)
            }
            PosixKind::Symlink => {
                let Some(t) = core.link_at(&c).map_err(on_workspace(reading()))? else {
                    continue;
                };
                Some(repo.write_blob(t).context(reading)?.detach())
            }
            PosixKind::Dir => {
                if let Some(list) = core.list_dir(&c).map_err(on_workspace(reading()))? {
                    for (name, _) in list {
                        stack.push([path.as_slice(), b"/", &name].concat());
                    }
                }
                None
            }
            _ => None,
        };
        let xattrs = meta
            .get(path.as_slice())
            .map(|m| m.xattrs.clone())
            .unwrap_or_default();
        out.push((
            KeptEntry {
                meta: PosixEntry {
                    path,
                    kind,
                    mode: u32::from(a.perm) & 0o7777,
                    uid: a.uid,
                    gid: a.gid,
                    rdev: if matches!(kind, PosixKind::Char | PosixKind::Block) {
                        a.rdev
                    } else {
                        0
                    },
                    xattrs,
                    link: None,
                },
                blob: blob.map(|b| b.to_string()),
            },
            a.ino.0,
            a.nlink,
        ));
        any = true;
    }
    Ok(any)
}

/// Removes whatever is at `path` in a workspace being made (a gitlink the tree brought, a
/// directory), so that a kept root comes back exactly as it was kept.
fn clear(core: &WorkspaceFs, path: &[u8]) -> Result<(), Error> {
    let owned: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    let clearing = || format!("cannot clear {} to restore it", shown(path));
    let Some(a) = core.attr_at(&owned).map_err(on_workspace(clearing()))? else {
        return Ok(());
    };
    if a.kind == FileType::Directory
        && let Some(list) = core.list_dir(&owned).map_err(on_workspace(clearing()))?
    {
        for (name, _) in list {
            clear(core, &[path, b"/", &name].concat())?;
        }
    }
    core.apply(path, &TreeChange::Remove)
        .map_err(on_workspace(clearing()))
}

/// The kept roots of snapshot `snapshot`, if it has a side (an unreadable one: none, logged).
pub fn roots_of(repo: &gix::Repository, snapshot: ObjectId) -> Vec<KeptRoot> {
    let side = match snap::commit_info(repo, snapshot) {
        Ok((_, _, message, _)) => kept::side_of(&message),
        Err(_) => None,
    };
    match side.map(|s| kept::read_side(repo, s)) {
        Some(Ok(r)) => r.roots,
        Some(Err(e)) => {
            tracing::warn!(%snapshot, "cannot read the kept side: {e}");
            Vec::new()
        }
        None => Vec::new(),
    }
}

/// The kept roots of a live workspace, as its next snapshot would keep them: those its changes
/// name (a changed path below a nested `.git` or at a refused name, an added directory holding a
/// `.git`) and those of its last snapshot `last` that are still there.
pub fn live_roots(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    last: Option<ObjectId>,
) -> Vec<KeptRoot> {
    let mut roots = Vec::new();
    if let Ok(changes) = core.changes() {
        for c in changes {
            let p = c.path.as_bytes();
            let comps: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
            if let Some(r) = root_of(p, false) {
                roots.push(r);
            } else if let Some(r) = root_of(p, true)
                && matches!(core.attr_at(&comps), Ok(Some(a)) if a.kind == FileType::Symlink)
            {
                // A `.gitmodules` symlink: refused only as a symlink.
                roots.push(r);
            } else if c.dir {
                let mut g: Vec<&[u8]> = p.split(|b| *b == b'/').collect();
                g.push(b".git");
                if matches!(core.attr_at(&g), Ok(Some(_))) {
                    roots.push(KeptRoot {
                        path: p.to_vec(),
                        why: KeptWhy::Nested,
                    });
                }
            }
        }
    }
    if let Some(l) = last {
        for r in roots_of(repo, l) {
            let c: Vec<&[u8]> = r.path.split(|b| *b == b'/').collect();
            if matches!(core.attr_at(&c), Ok(Some(_))) {
                roots.push(r);
            }
        }
    }
    outermost(roots)
}

/// One line naming what is kept beside the tree (`None`: nothing is).
pub fn describe(roots: &[KeptRoot]) -> Option<String> {
    if roots.is_empty() {
        return None;
    }
    let name = |why| {
        roots
            .iter()
            .filter(|r| r.why == why)
            .map(|r| shown(&r.path))
            .collect::<Vec<_>>()
    };
    let mut parts = Vec::new();
    let nested = name(KeptWhy::Nested);
    if !nested.is_empty() {
        parts.push(format!("nested repositories {}", nested.join(", ")));
    }
    let refused = name(KeptWhy::Refused);
    if !refused.is_empty() {
        parts.push(format!("names git refuses {}", refused.join(", ")));
    }
    Some(format!(
        "{} (kept beside the snapshot's tree, not in it)",
        parts.join("; ")
    ))
}

/// Puts back the kept side of snapshot `snapshot` into a workspace being made that holds the
/// snapshot's tree (before the POSIX record), with the authority of `who`, the thread's owner
/// ([`admit`]); returns what it applied only in part or not at all. A snapshot without a side
/// changes nothing; a side that cannot be read fails the resume; one of another tree is ignored
/// with a warning.
pub fn restore(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    snapshot: ObjectId,
    who: &Caller,
) -> Result<Vec<LeftOut>, Error> {
    let (tree, _, message, _) = snap::commit_info(repo, snapshot)?;
    let Some(side) = kept::side_of(&message) else {
        return Ok(Vec::new());
    };
    let record =
        kept::read_side(repo, side).context(|| format!("the kept side of snapshot {snapshot}"))?;
    if record.tree != tree {
        tracing::warn!(%snapshot, %side, record_tree = %record.tree, %tree,
            "the kept side describes another tree; not applied");
        return Ok(vec![(
            Vec::new(),
            vec![format!(
                "the kept side {side} describes another tree: nothing of it applied"
            )],
        )]);
    }
    let mut left: Vec<LeftOut> = Vec::new();
    let roots: Vec<&KeptRoot> = record
        .roots
        .iter()
        .filter(|r| {
            let ok = admissible_root(&r.path);
            if !ok {
                left.push((r.path.clone(), vec!["a root no kept side may have".into()]));
            }
            ok
        })
        .collect();
    for r in &roots {
        clear(core, &r.path)?;
    }
    let mut admitted = Vec::new();
    let mut changes = Vec::new();
    for e in &record.entries {
        if !roots.iter().any(|r| at_or_under(&e.meta.path, &r.path)) {
            left.push((
                e.meta.path.clone(),
                vec!["a path outside the kept roots".into()],
            ));
            continue;
        }
        let Admitted { entry, left_out } = admit(&e.meta, who);
        if !left_out.is_empty() {
            left.push((e.meta.path.clone(), left_out));
        }
        let Some(m) = entry else { continue };
        let id = e.blob_id()?;
        match (m.kind, id) {
            (PosixKind::File, Some(id)) => changes.push((
                m.path.clone(),
                TreeChange::File {
                    id,
                    exec: m.mode & 0o111 != 0,
                },
            )),
            (PosixKind::Symlink, Some(id)) => {
                changes.push((m.path.clone(), TreeChange::Symlink { id }))
            }
            (PosixKind::File | PosixKind::Symlink, None) => {
                left.push((m.path.clone(), vec!["its bytes (no blob named)".into()]));
                continue;
            }
            _ => {}
        }
        if let Some(id) = id
            && !repo.has_object(id)
        {
            return Err(SnapshotRefusal::KeptMissing {
                side,
                snapshot,
                id,
                path: shown(&m.path),
            }
            .into());
        }
        admitted.push(m);
    }
    core.apply_all(&changes)
        .map_err(on_workspace("cannot restore the kept content"))?;
    for m in &admitted {
        core.restore_entry(m).map_err(on_workspace(format!(
            "cannot restore the kept {} ({:?})",
            shown(&m.path),
            m.kind
        )))?;
    }
    Ok(left)
}

/// The most left-out entries a command names (the rest are counted).
const NAMED_MAX: usize = 20;

/// One warning line per entry of the kept side of `what` left out wholly or in part, the first
/// [`NAMED_MAX`] named, then one line counting the rest (each named one also logged).
pub fn left_out_warnings(what: &str, who: &Caller, left: &[LeftOut]) -> Vec<String> {
    let mut out: Vec<String> = left
        .iter()
        .take(NAMED_MAX)
        .map(|(path, parts)| {
            let path = shown(path);
            let parts = parts.join(", ");
            tracing::warn!(side = %what, uid = who.uid, %path, left_out = %parts,
                "a kept entry was applied only in part");
            format!(
                "the kept nested repositories and names of {what} (uid {}): {path}: left out {parts}",
                who.uid
            )
        })
        .collect();
    if left.len() > NAMED_MAX {
        out.push(format!(
            "the kept nested repositories and names of {what}: and {} more entries left out in part",
            left.len() - NAMED_MAX
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_nested_repositories_and_refused_names() {
        let nested = |p: &str| {
            Some(KeptRoot {
                path: p.as_bytes().to_vec(),
                why: KeptWhy::Nested,
            })
        };
        let refused = |p: &[u8]| {
            Some(KeptRoot {
                path: p.to_vec(),
                why: KeptWhy::Refused,
            })
        };
        assert_eq!(root_of(b".git/config", false), None);
        assert_eq!(root_of(b"src/lib.rs", false), None);
        assert_eq!(root_of(b"vend/.git/HEAD", false), nested("vend"));
        assert_eq!(root_of(b"a/b/.git", false), nested("a/b"));
        assert_eq!(root_of(b".GIT/x", false), refused(b".GIT"));
        assert_eq!(root_of(b"d/.Git", false), refused(b"d/.Git"));
        assert_eq!(root_of(b"d/git~1/x", false), refused(b"d/git~1"));
        assert_eq!(root_of(b"d/.git./x", false), refused(b"d/.git."));
        assert_eq!(root_of(b".gitmodules", true), refused(b".gitmodules"));
        assert_eq!(root_of(b".gitmodules", false), None);
        assert_eq!(root_of(b"caf\xe9/.GIT", false), refused(b"caf\xe9/.GIT"));
        // The first refused name wins: a nested `.git` inside `.GIT` is part of it.
        assert_eq!(root_of(b".GIT/r/.git/HEAD", false), refused(b".GIT"));
        let r = outermost(vec![
            nested("a/b").unwrap(),
            refused(b"a").unwrap(),
            nested("a/b").unwrap(),
            nested("c").unwrap(),
        ]);
        assert_eq!(
            r.iter().map(|r| r.path.as_slice()).collect::<Vec<_>>(),
            [&b"a"[..], b"c"]
        );
        assert!(!admissible_root(b".git"));
        assert!(!admissible_root(b".git/hooks"));
        assert!(!admissible_root(b"../x"));
        assert!(admissible_root(b".GIT"));
        assert!(admissible_root(b"vend"));
    }
}
