//! What a snapshot's POSIX record holds, and putting it back on resume (policy; the format and its
//! place in the mirror are `git::posix_record`, reading and applying metadata is the core's).
//!
//! A snapshot's tree is what `git add -A` makes; git keeps of a file only its bytes and one exec
//! bit. The record holds, relative to what the tree restores, every path whose state git drops:
//! - files, directories and symlinks of the tree whose permission bits differ from what git
//!   restores (0644/0755 files, 0755 directories; setuid, setgid and sticky included), whose owner
//!   is not the workspace's owner, or that carry extended attributes;
//! - the second and later names of a hard-linked file (git stores copies);
//! - fifos, sockets and devices, and empty directories, with every directory above them that the
//!   tree does not have (git keeps none of these). They are kept whatever the ignore rules say:
//!   the ignore rules choose among the files git would add, and git adds none of these.
//!
//! Nothing under a `.git` directory or a submodule (the tree holds the submodule's commit) is
//! recorded. Regular files the ignore rules leave out of the tree stay out of the record too.
//! Ordering and format: `docs/posix-record.md`.

use std::collections::HashMap;

use gix::ObjectId;
use gix::objs::tree::EntryKind;

use super::error::{Context, Error, on_workspace};
use crate::fs::{NodeMeta, WorkspaceFs};
use crate::git::posix_record::{self, PosixEntry, PosixKind, PosixRecord};
use crate::git::snapshot as snap;
use crate::workspace::Owner;

/// What the tree has at `path`, if anything.
fn tree_kind(
    repo: &gix::Repository,
    tree: ObjectId,
    path: &[u8],
) -> Result<Option<EntryKind>, Error> {
    let t = repo
        .find_tree(tree)
        .context(|| format!("cannot read the snapshot tree {tree}"))?;
    let found = t.lookup_entry(path.split(|b| *b == b'/')).context(|| {
        format!(
            "cannot look up {} in the snapshot tree",
            String::from_utf8_lossy(path)
        )
    })?;
    Ok(found.map(|e| e.mode().kind()))
}

fn entry_of(m: &NodeMeta) -> PosixEntry {
    PosixEntry {
        path: m.path.clone(),
        kind: m.kind,
        mode: m.mode,
        uid: m.uid,
        gid: m.gid,
        rdev: if matches!(m.kind, PosixKind::Char | PosixKind::Block) {
            m.rdev
        } else {
            0
        },
        xattrs: m.xattrs.clone(),
        link: None,
    }
}

fn under(p: &[u8], d: &[u8]) -> bool {
    p.starts_with(d) && p.get(d.len()) == Some(&b'/')
}

/// What the tree has at `path`, looked up once per path, and not at all below a path the tree
/// does not hold as a directory (an ignored subtree costs one lookup).
fn kind_at(
    repo: &gix::Repository,
    tree: ObjectId,
    memo: &mut HashMap<Vec<u8>, Option<EntryKind>>,
    path: &[u8],
) -> Result<Option<EntryKind>, Error> {
    if let Some(k) = memo.get(path) {
        return Ok(*k);
    }
    let k = match path.iter().rposition(|b| *b == b'/') {
        Some(i) => match kind_at(repo, tree, memo, &path[..i])? {
            Some(EntryKind::Tree) => tree_kind(repo, tree, path)?,
            _ => None,
        },
        None => tree_kind(repo, tree, path)?,
    };
    memo.insert(path.to_vec(), k);
    Ok(k)
}

/// The record of a snapshot whose tree is `tree`, from the view's metadata (the workspace's nodes
/// whose own metadata git may drop, and the directories above them: `WorkspaceFs::view_meta`;
/// a node left out of it is one the tree restores); `None` when the tree restores everything.
pub fn record_of(
    repo: &gix::Repository,
    tree: ObjectId,
    meta: &[NodeMeta],
    owner: &Owner,
) -> Result<Option<PosixRecord>, Error> {
    let mut memo: HashMap<Vec<u8>, Option<EntryKind>> = HashMap::new();
    let mut skip: Vec<&[u8]> = Vec::new();
    let mut entries: Vec<PosixEntry> = Vec::new();
    let mut linked: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut wanted_parents: Vec<&[u8]> = Vec::new();
    // `meta` is sorted by path: a directory comes before everything under it.
    for m in meta {
        let p = m.path.as_slice();
        if skip.iter().any(|d| under(p, d)) {
            continue;
        }
        if m.gitlink || p.split(|b| *b == b'/').any(|c| c == b".git") {
            skip.push(p);
            continue;
        }
        let foreign_owner = m.uid != owner.uid || m.gid != owner.gid;
        let plain = !foreign_owner && m.xattrs.is_empty() && m.nlink <= 1;
        // The common case, decided without reading the tree: a file or symlink whose mode git
        // restores (the exec bit of the tree is the file's own).
        match m.kind {
            PosixKind::File if plain && (m.mode == 0o644 || m.mode == 0o755) => continue,
            PosixKind::Symlink if plain => continue,
            _ => {}
        }
        let kind = kind_at(repo, tree, &mut memo, p)?;
        let e = match (m.kind, kind) {
            (_, Some(EntryKind::Commit)) => {
                skip.push(p);
                continue;
            }
            (PosixKind::Dir, Some(EntryKind::Tree)) => {
                (m.mode != 0o755 || foreign_owner || !m.xattrs.is_empty()).then(|| entry_of(m))
            }
            (PosixKind::File, Some(k @ (EntryKind::Blob | EntryKind::BlobExecutable))) => {
                let git_mode = if k == EntryKind::BlobExecutable {
                    0o755
                } else {
                    0o644
                };
                match linked.get(&m.ino) {
                    Some(first) => Some(PosixEntry {
                        link: Some(first.clone()),
                        ..entry_of(m)
                    }),
                    None => {
                        linked.insert(m.ino, m.path.clone());
                        (m.mode != git_mode || foreign_owner || !m.xattrs.is_empty())
                            .then(|| entry_of(m))
                    }
                }
            }
            (PosixKind::Symlink, Some(EntryKind::Link)) => {
                (foreign_owner || !m.xattrs.is_empty()).then(|| entry_of(m))
            }
            (k, None) if k.is_special() => Some(entry_of(m)),
            (PosixKind::Dir, None) if m.empty => Some(entry_of(m)),
            // Left out of the tree by the ignore rules (or a directory of only such files).
            _ => None,
        };
        if let Some(e) = e {
            if kind.is_none()
                && let Some(i) = p.iter().rposition(|b| *b == b'/')
            {
                wanted_parents.push(&p[..i]);
            }
            entries.push(e);
        }
    }
    // The directories above a kept special file or empty directory that the tree does not have
    // come back as they were (their parents are changed nodes too, so they are in `meta`).
    let by_path: HashMap<&[u8], &NodeMeta> = meta.iter().map(|m| (m.path.as_slice(), m)).collect();
    let mut have: std::collections::HashSet<Vec<u8>> =
        entries.iter().map(|e| e.path.clone()).collect();
    while let Some(d) = wanted_parents.pop() {
        if have.contains(d) || kind_at(repo, tree, &mut memo, d)?.is_some() {
            continue;
        }
        if let Some(m) = by_path.get(d) {
            have.insert(d.to_vec());
            entries.push(entry_of(m));
        }
        if let Some(i) = d.iter().rposition(|b| *b == b'/') {
            wanted_parents.push(&d[..i]);
        }
    }
    if entries.is_empty() {
        return Ok(None);
    }
    Ok(Some(PosixRecord::new(tree, entries)))
}

/// Puts back the record of snapshot `snapshot` (named in its message) into a workspace that holds
/// the snapshot's tree and is not mounted yet. A snapshot without a record changes nothing; a
/// record that cannot be read or applied fails the resume (a resume never widens a file's
/// permissions); a record of another tree is ignored with a warning.
pub fn restore(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    snapshot: ObjectId,
) -> Result<(), Error> {
    let (tree, _, message, _) = snap::commit_info(repo, snapshot)?;
    let Some(blob) = posix_record::blob_of(&message) else {
        return Ok(());
    };
    let obj = repo.find_object(blob).context(|| {
        format!("the POSIX record {blob} of snapshot {snapshot} is missing from the mirror")
    })?;
    let record = PosixRecord::decode(&obj.data).context(|| format!("the POSIX record {blob}"))?;
    if record.tree != tree {
        tracing::warn!(%snapshot, %blob, record_tree = %record.tree, %tree,
            "the POSIX record describes another tree; not applied");
        return Ok(());
    }
    for e in &record.entries {
        core.restore_entry(e).map_err(on_workspace(format!(
            "cannot restore the POSIX state of {} ({:?})",
            String::from_utf8_lossy(&e.path),
            e.kind
        )))?;
    }
    Ok(())
}
