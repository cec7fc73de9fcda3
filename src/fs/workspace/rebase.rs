//! Moving a workspace's base (its lower layer) to another tree without changing anything the
//! workspace presents: the root's record and every directory record of the overlay are re-pointed
//! at the new tree's directory of the same path, in one catalog batch (so a crash leaves the old
//! base or the new one, never a mix), and only where the names the overlay leaves to the base read
//! the same in both trees. Files, symlinks and their records, inode numbers, times and the kernel's
//! caches are untouched: what differs from the new base is already in the overlay (the daemon
//! applied the difference first), and what equals it now shows as unchanged (a record whose object
//! is the base's is no change). A symlink record made with its target bytes is re-pointed at the
//! new tree's blob when that blob holds the same target. Light nodes derived from a directory whose
//! base moves are made full first (their index in the old tree would no longer hold).
//!
//! Touches only the records of directories (and such symlinks) and the live nodes named above; the
//! cost is the overlay's directories and their tree entries, never the whole tree.

use std::collections::{BTreeMap, HashSet};

use fuser::Errno;
use gix::ObjectId;

use crate::cow::catalog::{BaseRef, InodeRecord, Kind};
use crate::fs::FsError;
use crate::git::objects::{EntryKind, TreeEntry};

use super::{ROOT_INO, State, WorkspaceFs, convert::join, tree_order::find_entry, tx::Tx};

/// What [`WorkspaceFs::move_base`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BaseMove {
    /// Directory records now based on the new tree (the root included).
    pub repointed: usize,
    /// Directory records left on their old base: the names they leave to it differ in the new
    /// tree (or the directory was moved from elsewhere in the base).
    pub kept: usize,
    /// Symlink records that now refer to the new tree's blob.
    pub symlinks: usize,
}

#[derive(Default)]
struct Plan {
    recs: Vec<InodeRecord>,
    moved: HashSet<u64>,
    summary: BaseMove,
}

impl WorkspaceFs {
    /// The tree the root lists under its overlay: the base tree with the dependency layers grafted.
    pub fn root_base(&self) -> Result<ObjectId, FsError> {
        let st = self.lock();
        let root = st.node(ROOT_INO)?;
        Self::base_tree(&root.rec)
            .map(|(t, _)| t)
            .ok_or_else(|| Errno::EIO.into())
    }

    /// Whether [`Self::move_base`] onto `new_root` would move the root (nothing is changed).
    pub fn can_move_base(&self, new_root: ObjectId) -> Result<bool, FsError> {
        let st = self.lock();
        self.plan_dir(&st, ROOT_INO, b"", Some(new_root), &mut Plan::default())
    }

    /// Re-bases the workspace on `new_root` without changing what it presents (see the module
    /// doc). `None` when the root's own names that the overlay leaves to the base differ between
    /// the two trees: moving would change the workspace, so nothing is done. The batch is
    /// bookkeeping (no change of the workspace's state: its generation stays).
    pub fn move_base(&self, new_root: ObjectId) -> Result<Option<BaseMove>, FsError> {
        let mut st = self.lock();
        let mut plan = Plan::default();
        if !self.plan_dir(&st, ROOT_INO, b"", Some(new_root), &mut plan)? {
            return Ok(None);
        }
        if plan.recs.is_empty() {
            return Ok(Some(plan.summary));
        }
        // A light node is an index into its parent's base tree: made full while that is the old
        // tree (its record is the same under the new one, which has the same entry there).
        let lights: Vec<u64> = st
            .live
            .inodes
            .light
            .iter()
            .filter(|(_, l)| plan.moved.contains(&l.parent))
            .map(|(i, _)| *i)
            .collect();
        for ino in lights {
            self.expand(&mut st, ino)?;
        }
        let mut tx = Tx {
            quiet: true,
            ..Default::default()
        };
        for rec in plan.recs {
            tx.recs.insert(rec.ino, rec);
        }
        st.commit(tx)?;
        Ok(Some(plan.summary))
    }

    /// Plans directory `ino` at `path` onto `new_tree` (what the new base has there), its overlay's
    /// directories first. False only for the root when it cannot move.
    fn plan_dir(
        &self,
        st: &State,
        ino: u64,
        path: &[u8],
        new_tree: Option<ObjectId>,
        plan: &mut Plan,
    ) -> Result<bool, FsError> {
        let node = st.node(ino)?;
        let rec = &node.rec;
        if rec.kind != Kind::Dir || rec.base.as_ref().is_some_and(|b| b.gitlink) {
            return Ok(true);
        }
        let new_entries = match new_tree {
            Some(t) => Some(self.tree_entries(t)?),
            None => None,
        };
        let empty = BTreeMap::new();
        let overlay = st.live.dirs.get(&ino).unwrap_or(&empty);
        for (name, target) in overlay {
            let Some(c) = target else { continue };
            let Some(child) = st.live.inodes.get(c) else {
                continue;
            };
            let new_child = new_entries.as_ref().and_then(|e| find_entry(e, name));
            let child_path = join(path, name);
            match child.rec.kind {
                Kind::Dir => {
                    let sub = new_child
                        .filter(|e| e.kind == EntryKind::Tree)
                        .map(|e| e.id);
                    self.plan_dir(st, *c, &child_path, sub, plan)?;
                }
                Kind::Symlink => {
                    if let (Some(target), Some(e)) = (&child.rec.target, new_child)
                        && e.kind == EntryKind::Symlink
                        && child.rec.base.is_none()
                        && child.rec.nlink == 1
                        && self.blob_bytes(e.id)? == *target
                    {
                        let mut r = child.rec.clone();
                        r.target = None;
                        r.base = Some(BaseRef {
                            oid: e.id.to_string(),
                            path: child_path,
                            gitlink: false,
                        });
                        plan.recs.push(r);
                        plan.summary.symlinks += 1;
                    }
                }
                _ => {}
            }
        }
        let old = Self::base_tree(rec);
        if old.map(|(t, _)| t) == new_tree {
            return Ok(true);
        }
        // A directory moved here from elsewhere in the base keeps its base: its derived nodes are
        // numbered by their path in the base, which must not change under the kernel.
        let here = old.is_none_or(|(_, p)| p == path);
        let old_entries = match old {
            Some((t, _)) => Some(self.tree_entries(t)?),
            None => None,
        };
        if !here || !same_outside(old_entries.as_deref(), new_entries.as_deref(), overlay) {
            if ino == ROOT_INO {
                return Ok(false);
            }
            plan.summary.kept += 1;
            return Ok(true);
        }
        let mut r = rec.clone();
        r.base = new_tree.map(|t| BaseRef {
            oid: t.to_string(),
            path: path.to_vec(),
            gitlink: false,
        });
        plan.recs.push(r);
        plan.moved.insert(ino);
        plan.summary.repointed += 1;
        Ok(true)
    }
}

/// Whether every name `overlay` does not override reads the same in `old` and `new` (same kind and
/// object, or absent from both).
fn same_outside(
    old: Option<&[TreeEntry]>,
    new: Option<&[TreeEntry]>,
    overlay: &BTreeMap<Vec<u8>, Option<u64>>,
) -> bool {
    let old = old.unwrap_or(&[]);
    let new = new.unwrap_or(&[]);
    let left = |e: &&TreeEntry| !overlay.contains_key(&*e.name);
    old.iter()
        .filter(left)
        .all(|e| find_entry(new, &e.name).is_some_and(|n| n.kind == e.kind && n.id == e.id))
        && new
            .iter()
            .filter(left)
            .all(|e| find_entry(old, &e.name).is_some())
}
