//! Grafted trees: a workspace's view root made of its base tree with each dependency layer's tree
//! put at the layer's path (`node_modules`, `packages/app/node_modules`), so that the filesystem
//! core presents the layer read-through like any other base content.
//!
//! The synthetic trees are written into the dependency layer store (`<state>/deps/store.git`,
//! through the object store's fallback), never into a mirror: a mirror holds only what its
//! upstream and the threads' snapshots hold. The result depends only on the base tree and the
//! layers (content-addressed), so it is the same tree at every fork and after every restart.
//! Nothing here reads or writes a workspace.

use std::io;

use gix::ObjectId;
use gix::objs::tree::EntryKind as Mode;

use super::objects::{EntryKind, ObjectStore};

/// One layer to graft: its path (relative, `/`-separated) and its tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graft {
    pub path: String,
    pub tree: ObjectId,
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn mode_of(kind: EntryKind) -> Mode {
    match kind {
        EntryKind::Tree => Mode::Tree,
        EntryKind::Blob => Mode::Blob,
        EntryKind::Executable => Mode::BlobExecutable,
        EntryKind::Symlink => Mode::Link,
        EntryKind::Gitlink => Mode::Commit,
    }
}

/// Whether `path` is one of the `layers`' paths or below one (paths relative, `/`-separated).
pub fn under_layer<'a>(path: &[u8], mut layers: impl Iterator<Item = &'a str>) -> bool {
    layers.any(|l| {
        let l = l.as_bytes();
        path == l || (path.starts_with(l) && path.get(l.len()) == Some(&b'/'))
    })
}

/// `base` with every graft's tree at its path (an entry already there is replaced; missing
/// directories on the way are made), written into the store's fallback repository. Returns
/// `base` itself when there is nothing to graft. Every tree read comes from `store` (the mirror,
/// then the fallback); a path with an empty or `.`/`..` component is refused.
pub fn graft(store: &ObjectStore, base: ObjectId, grafts: &[Graft]) -> io::Result<ObjectId> {
    if grafts.is_empty() {
        return Ok(base);
    }
    let mut split: Vec<(Vec<&[u8]>, ObjectId)> = Vec::with_capacity(grafts.len());
    for g in grafts {
        let comps: Vec<&[u8]> = g.path.split('/').map(str::as_bytes).collect();
        if comps
            .iter()
            .any(|c| c.is_empty() || *c == b"." || *c == b".." || *c == b".git")
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "dependency layer path {:?} is not a plain relative path",
                    g.path
                ),
            ));
        }
        split.push((comps, g.tree));
    }
    let refs: Vec<(&[&[u8]], ObjectId)> = split.iter().map(|(c, t)| (&c[..], *t)).collect();
    rewrite(store, Some(base), &refs)
}

/// Tree `tree` (none: an empty one) with each `(components, tree)` put in place.
fn rewrite(
    store: &ObjectStore,
    tree: Option<ObjectId>,
    grafts: &[(&[&[u8]], ObjectId)],
) -> io::Result<ObjectId> {
    let mut entries: Vec<gix::objs::tree::Entry> = match tree {
        Some(id) => store
            .tree(id)?
            .iter()
            .map(|e| gix::objs::tree::Entry {
                mode: mode_of(e.kind).into(),
                filename: e.name.to_vec().into(),
                oid: e.id,
            })
            .collect(),
        None => Vec::new(),
    };
    // Grafts grouped by their first component, in the order given (the last one for a name wins).
    let mut names: Vec<&[u8]> = Vec::new();
    for (comps, _) in grafts {
        if let Some(first) = comps.first()
            && !names.contains(first)
        {
            names.push(first);
        }
    }
    for name in names {
        let mine: Vec<(&[&[u8]], ObjectId)> = grafts
            .iter()
            .filter(|(c, _)| c.first() == Some(&name))
            .map(|(c, t)| (&c[1..], *t))
            .collect();
        let existing = entries.iter().position(|e| e.filename.as_slice() == name);
        let new_id = match mine.iter().rev().find(|(rest, _)| rest.is_empty()) {
            // The layer is this very entry.
            Some((_, t)) => *t,
            None => {
                let below = existing
                    .map(|i| &entries[i])
                    .filter(|e| e.mode.is_tree())
                    .map(|e| e.oid);
                rewrite(store, below, &mine)?
            }
        };
        if let Some(i) = existing {
            entries.remove(i);
        }
        entries.push(gix::objs::tree::Entry {
            mode: Mode::Tree.into(),
            filename: name.to_vec().into(),
            oid: new_id,
        });
    }
    entries.sort();
    let tree = gix::objs::Tree { entries };
    store
        .with_fallback_repo(|repo| {
            repo.write_object(&tree)
                .map(|id| id.detach())
                .map_err(other)
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the dependency layer store does not exist",
            )
        })?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &std::path::Path, args: &[&str], input: Option<&[u8]>) -> String {
        use std::io::Write as _;
        let mut child = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_DIR", dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("git");
        if let Some(i) = input {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(i)
                .expect("write");
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("git");
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_string()
    }

    fn blob(dir: &std::path::Path, content: &str) -> String {
        git(
            dir,
            &["hash-object", "-w", "--stdin"],
            Some(content.as_bytes()),
        )
    }

    fn mktree(dir: &std::path::Path, lines: &[String]) -> ObjectId {
        let mut input = lines.join("\n");
        input.push('\n');
        let id = git(dir, &["mktree"], Some(input.as_bytes()));
        ObjectId::from_hex(id.as_bytes()).expect("id")
    }

    #[test]
    fn grafts_into_the_fallback_and_never_the_mirror() {
        let d = tempfile::tempdir().expect("tempdir");
        let mirror = d.path().join("mirror.git");
        let deps = d.path().join("store.git");
        for r in [&mirror, &deps] {
            std::fs::create_dir(r).expect("dir");
            git(r, &["init", "-q", "--bare"], None);
        }
        let a = blob(&mirror, "a\n");
        let inner = mktree(&mirror, &[format!("100644 blob {a}\tx.txt")]);
        // The base has `a.txt`, a directory `packages/app` and a stale file named `node_modules`.
        let app = mktree(&mirror, &[format!("040000 tree {inner}\tapp")]);
        let base = mktree(
            &mirror,
            &[
                format!("100644 blob {a}\ta.txt"),
                format!("100644 blob {a}\tnode_modules"),
                format!("040000 tree {app}\tpackages"),
            ],
        );
        let l = blob(&deps, "layer\n");
        let layer = mktree(&deps, &[format!("100755 blob {l}\ttool")]);
        let store = ObjectStore::open(&mirror)
            .expect("store")
            .with_fallback(&deps);
        let grafts = [
            Graft {
                path: "node_modules".into(),
                tree: layer,
            },
            Graft {
                path: "packages/app/node_modules".into(),
                tree: layer,
            },
            Graft {
                path: "new/dir/.venv".into(),
                tree: layer,
            },
        ];
        let root = graft(&store, base, &grafts).expect("graft");
        // Deterministic: the same inputs give the same tree.
        assert_eq!(graft(&store, base, &grafts).expect("graft"), root);
        let names = |t: ObjectId| -> Vec<String> {
            store
                .tree(t)
                .expect("tree")
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect()
        };
        assert_eq!(names(root), ["a.txt", "new", "node_modules", "packages"]);
        let nm = store.tree(root).expect("root")[2].clone();
        assert_eq!((nm.kind, nm.id), (EntryKind::Tree, layer));
        let pkgs = store.tree(root).expect("root")[3].id;
        let app2 = store.tree(pkgs).expect("packages")[0].id;
        assert_eq!(names(app2), ["node_modules", "x.txt"]);
        // The synthetic trees are in the layer store, not in the mirror.
        let has = |repo: &std::path::Path, id: ObjectId| {
            std::process::Command::new("git")
                .args(["cat-file", "-e", &id.to_string()])
                .env("GIT_DIR", repo)
                .status()
                .expect("git")
                .success()
        };
        assert!(has(&deps, root));
        assert!(!has(&mirror, root));
        assert!(graft(&store, base, &[]).expect("none") == base);
        let bad = Graft {
            path: "../x".into(),
            tree: layer,
        };
        assert!(graft(&store, base, &[bad]).is_err());
    }

    #[test]
    fn paths_under_a_layer() {
        let layers = ["node_modules", "a/.venv"];
        let u = |p: &str| under_layer(p.as_bytes(), layers.iter().copied());
        assert!(u("node_modules"));
        assert!(u("node_modules/x/index.js"));
        assert!(u("a/.venv/bin/python"));
        assert!(!u("node_modules2"));
        assert!(!u("a/.venvx"));
        assert!(!u("a"));
    }
}
