//! Tree diffs between two commits of a project's mirror, read in process from the mirror's parsed
//! trees (only the subtrees whose ids differ), and applying one to a workspace not yet mounted
//! (a resume's saved changes over its base).
//!
//! Pure reading of the mirror's object store plus one catalog batch through the filesystem core;
//! it must not touch records, bindings or mounts, nor run git.

use super::Daemon;
use super::error::{Context, Error, on_workspace};
use crate::fs::WorkspaceFs;
use crate::git::objects::{EntryKind, ObjectStore, TreeEntry};

impl Daemon {
    /// Applies the difference between two trees of the mirror to a workspace ([`Self::tree_changes`]).
    /// Returns the paths it wrote or removed.
    pub(super) fn apply_diff(
        &self,
        core: &WorkspaceFs,
        project: &str,
        from: gix::ObjectId,
        to: gix::ObjectId,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let changes = self.tree_changes(project, from, to)?;
        // One catalog batch for the whole change set while the workspace is not mounted yet
        // (once mounted, as for a pull, each change is its own transaction).
        core.apply_all(&changes)
            .map_err(on_workspace("cannot restore the saved changes"))?;
        let mut done: Vec<Vec<u8>> = changes.into_iter().map(|(p, _)| p).collect();
        done.sort();
        done.dedup();
        Ok(done)
    }

    /// The difference between two trees of the mirror as changes to apply in this order:
    /// removals (deepest first), then additions and changes (in the new tree's order). Read in
    /// process from the mirror's parsed trees (shared and cached by every workspace of the
    /// project): only the subtrees whose ids differ are read, never the whole tree.
    pub(super) fn tree_changes(
        &self,
        project: &str,
        from: gix::ObjectId,
        to: gix::ObjectId,
    ) -> Result<Vec<(Vec<u8>, crate::fs::TreeChange)>, Error> {
        use crate::fs::TreeChange;
        let store = self.store(project)?;
        let mut diff = TreeDiff::default();
        diff.trees(&store, &mut Vec::new(), from, to)
            .context(|| format!("cannot compare trees {from} and {to}"))?;
        let TreeDiff {
            mut removals,
            additions,
        } = diff;
        removals.sort_by(|a, b| b.cmp(a));
        Ok(removals
            .into_iter()
            .map(|p| (p, TreeChange::Remove))
            .chain(additions)
            .collect())
    }
}

/// The changes between two trees, as `git diff-tree -r --no-renames` lists them: every file,
/// symlink or gitlink that is gone or changes kind (removals), and every one that is new or
/// changed (additions, in the order of the new tree). Subtrees with equal ids are not read.
#[derive(Default)]
struct TreeDiff {
    removals: Vec<Vec<u8>>,
    additions: Vec<(Vec<u8>, crate::fs::TreeChange)>,
}

impl TreeDiff {
    /// Compares trees `a` and `b`, found at `prefix` (empty, or ending with `/`).
    fn trees(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        a: gix::ObjectId,
        b: gix::ObjectId,
    ) -> std::io::Result<()> {
        if a == b {
            return Ok(());
        }
        let old = store.tree(a)?;
        let new = store.tree(b)?;
        let mut by_name: std::collections::HashMap<&[u8], &TreeEntry> =
            old.iter().map(|e| (&*e.name, e)).collect();
        for e in new.iter() {
            match by_name.remove(&*e.name) {
                None => self.added(store, prefix, e)?,
                Some(o) => self.changed(store, prefix, o, e)?,
            }
        }
        // What only the old tree has, in its order (the order does not matter: removals are
        // sorted before they are applied).
        for o in old.iter() {
            if by_name.contains_key(&*o.name) {
                self.removed(store, prefix, o)?;
            }
        }
        Ok(())
    }

    fn changed(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        o: &TreeEntry,
        e: &TreeEntry,
    ) -> std::io::Result<()> {
        match (o.kind, e.kind) {
            (EntryKind::Tree, EntryKind::Tree) => {
                let len = prefix.len();
                prefix.extend_from_slice(&e.name);
                prefix.push(b'/');
                let r = self.trees(store, prefix, o.id, e.id);
                prefix.truncate(len);
                r
            }
            (EntryKind::Tree, _) | (_, EntryKind::Tree) => {
                self.removed(store, prefix, o)?;
                self.added(store, prefix, e)
            }
            _ if o.kind == e.kind && o.id == e.id => Ok(()),
            _ => {
                // A change of kind (file, symlink, gitlink) is a removal and an addition, as
                // git's type change; a change of content or of the executable bit replaces.
                let class = |k: EntryKind| match k {
                    EntryKind::Blob | EntryKind::Executable => 0,
                    EntryKind::Symlink => 1,
                    EntryKind::Gitlink | EntryKind::Tree => 2,
                };
                if class(o.kind) != class(e.kind) {
                    self.removals.push(join(prefix, &o.name));
                }
                self.additions.push((join(prefix, &e.name), leaf(e)));
                Ok(())
            }
        }
    }

    /// Every leaf at or below `e`, added.
    fn added(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        e: &TreeEntry,
    ) -> std::io::Result<()> {
        let additions = &mut self.additions;
        leaves(store, prefix, e, &mut |path, l| {
            additions.push((path, leaf(l)))
        })
    }

    /// Every leaf at or below `o`, removed.
    fn removed(
        &mut self,
        store: &ObjectStore,
        prefix: &mut Vec<u8>,
        o: &TreeEntry,
    ) -> std::io::Result<()> {
        let removals = &mut self.removals;
        leaves(store, prefix, o, &mut |path, _| removals.push(path))
    }
}

/// Calls `f` with the path and entry of every leaf at or below `e` (`prefix`: its directory's
/// path with a trailing `/`, or empty).
fn leaves(
    store: &ObjectStore,
    prefix: &mut Vec<u8>,
    e: &TreeEntry,
    f: &mut dyn FnMut(Vec<u8>, &TreeEntry),
) -> std::io::Result<()> {
    if e.kind != EntryKind::Tree {
        f(join(prefix, &e.name), e);
        return Ok(());
    }
    let len = prefix.len();
    prefix.extend_from_slice(&e.name);
    prefix.push(b'/');
    let r = store
        .tree(e.id)
        .and_then(|t| t.iter().try_for_each(|c| leaves(store, prefix, c, f)));
    prefix.truncate(len);
    r
}

fn join(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(prefix.len() + name.len());
    p.extend_from_slice(prefix);
    p.extend_from_slice(name);
    p
}

/// What a leaf entry (not a tree) becomes in a workspace.
fn leaf(e: &TreeEntry) -> crate::fs::TreeChange {
    use crate::fs::TreeChange;
    match e.kind {
        EntryKind::Blob => TreeChange::File {
            id: e.id,
            exec: false,
        },
        EntryKind::Executable => TreeChange::File {
            id: e.id,
            exec: true,
        },
        EntryKind::Symlink => TreeChange::Symlink { id: e.id },
        EntryKind::Gitlink | EntryKind::Tree => TreeChange::Gitlink { id: e.id },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::TreeChange;
    use std::collections::BTreeSet;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .expect("git runs");
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn write(dir: &Path, path: &str, content: &str) {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, content).expect("write");
    }

    type Sets = (BTreeSet<Vec<u8>>, BTreeSet<(Vec<u8>, String)>);

    /// Removals and additions as `git diff-tree -r -z --no-renames` lists them (the former
    /// subprocess of `apply_diff`).
    fn by_git(dir: &Path, a: &str, b: &str) -> Sets {
        let out = git(dir, &["diff-tree", "-r", "-z", "--no-renames", a, b]);
        let fields: Vec<&str> = out.split('\0').filter(|s| !s.is_empty()).collect();
        let mut removals = BTreeSet::new();
        let mut additions = BTreeSet::new();
        for pair in fields.chunks(2) {
            let f: Vec<&str> = pair[0].trim_start_matches(':').split(' ').collect();
            let path = pair[1].as_bytes().to_vec();
            if f[4] == "D" || f[4] == "T" {
                removals.insert(path.clone());
            }
            if f[4] != "D" {
                additions.insert((path, format!("{} {}", f[1], f[3])));
            }
        }
        (removals, additions)
    }

    fn by_tree_diff(store: &ObjectStore, a: gix::ObjectId, b: gix::ObjectId) -> Sets {
        let mut d = TreeDiff::default();
        d.trees(store, &mut Vec::new(), a, b).expect("diff");
        let removals = d.removals.into_iter().collect();
        let additions = d
            .additions
            .into_iter()
            .map(|(p, c)| {
                let s = match c {
                    TreeChange::File { id, exec: false } => format!("100644 {id}"),
                    TreeChange::File { id, exec: true } => format!("100755 {id}"),
                    TreeChange::Symlink { id } => format!("120000 {id}"),
                    TreeChange::Gitlink { id } => format!("160000 {id}"),
                    TreeChange::Remove => "remove".into(),
                };
                (p, s)
            })
            .collect();
        (removals, additions)
    }

    /// The in-process diff lists what `git diff-tree -r --no-renames` lists, for every kind of
    /// change a snapshot can hold: content and mode changes, a file that becomes a symlink, a
    /// directory, or a gitlink and back, nested additions and removals, untouched subtrees.
    #[test]
    fn tree_diff_matches_git_diff_tree() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let w = tmp.path();
        git(w, &["init", "-q"]);
        for i in 0..5 {
            write(w, &format!("same/s{i}.txt"), "same\n");
            write(w, &format!("deep/a/b/f{i}.txt"), &format!("{i}\n"));
        }
        write(w, "mod.txt", "old\n");
        write(w, "mode.sh", "#!/bin/sh\n");
        write(w, "to_link", "file\n");
        write(w, "to_dir", "file\n");
        write(w, "from_dir/x/y.txt", "y\n");
        write(w, "from_dir/z.txt", "z\n");
        write(w, "gone/g/h.txt", "h\n");
        write(w, "link_to_file", "placeholder\n");
        write(w, "dir_to_sub/in.txt", "in\n");
        git(w, &["add", "-A"]);
        git(w, &["commit", "-qm", "a"]);
        let a = git(w, &["rev-parse", "HEAD^{tree}"]);
        let old_head = git(w, &["rev-parse", "HEAD"]);

        write(w, "mod.txt", "new\n");
        git(w, &["update-index", "--chmod=+x", "mode.sh"]);
        std::fs::remove_file(w.join("to_link")).expect("rm");
        std::os::unix::fs::symlink("mod.txt", w.join("to_link")).expect("symlink");
        std::fs::remove_file(w.join("to_dir")).expect("rm");
        write(w, "to_dir/inner/file.txt", "inner\n");
        std::fs::remove_dir_all(w.join("from_dir")).expect("rm");
        write(w, "from_dir", "now a file\n");
        std::fs::remove_dir_all(w.join("gone")).expect("rm");
        write(w, "new/n1/n2/added.txt", "added\n");
        write(w, "deep/a/b/f9.txt", "nine\n");
        std::fs::remove_file(w.join("deep/a/b/f0.txt")).expect("rm");
        git(w, &["add", "-A"]);
        git(w, &["rm", "-rq", "--cached", "dir_to_sub"]);
        git(
            w,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{old_head},dir_to_sub"),
            ],
        );
        git(w, &["commit", "-qm", "b"]);
        let b = git(w, &["rev-parse", "HEAD^{tree}"]);

        let store = ObjectStore::open(&w.join(".git")).expect("store");
        let (a_id, b_id) = (
            gix::ObjectId::from_hex(a.as_bytes()).expect("id"),
            gix::ObjectId::from_hex(b.as_bytes()).expect("id"),
        );
        for (x, y, xs, ys) in [(a_id, b_id, &a, &b), (b_id, a_id, &b, &a)] {
            let expected = by_git(w, xs, ys);
            assert!(
                expected.0.len() >= 6 && expected.1.len() >= 6,
                "{expected:?}"
            );
            assert_eq!(by_tree_diff(&store, x, y), expected, "{xs} -> {ys}");
        }
        assert_eq!(by_tree_diff(&store, a_id, a_id), Default::default());
    }
}
