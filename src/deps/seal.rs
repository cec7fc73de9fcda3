//! Sealing an installed tree as a git tree in the host's layer store (`<state>/deps/store.git`):
//! what is dropped first (nested `.git` entries, caches that name the staging path), the check that
//! nothing left names the staging path, and the write of the tree and its `refs/layers/<key>`.
//!
//! Owns `store.git` and its lock (`<state>/deps/store.lock`: builds hold it shared while they write
//! objects, gc exclusive while it prunes). git runs with the daemon's hardened environment, a
//! temporary index and no attributes from the installed files, so content is stored byte for byte.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use super::error::{Error, FsOp, fs};
use super::{DepStore, Manager};
use crate::git::Git;

/// The empty tree: what `GIT_ATTR_SOURCE` names so that no `.gitattributes` of an installed
/// package changes what is stored (no end-of-line conversion, no filter, no `ident`).
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// The store's lock file: shared while a build writes objects, exclusive while gc prunes.
pub fn store_lock(deps: &DepStore, exclusive: bool) -> std::io::Result<std::fs::File> {
    crate::layout::create_private_dir(deps.dir())?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(deps.dir().join("store.lock"))?;
    if exclusive {
        f.lock()?;
    } else {
        f.lock_shared()?;
    }
    Ok(f)
}

/// Creates `store.git` (bare) when missing.
pub fn ensure_store(deps: &DepStore) -> Result<(), Error> {
    let dir = deps.objects();
    if dir.join("HEAD").exists() {
        return Ok(());
    }
    crate::layout::create_private_dir(deps.dir()).map_err(fs(FsOp::Create, deps.dir()))?;
    Git::new(None)
        .args(["init", "--bare", "--quiet"])
        .arg(&dir)
        .output()
        .map(|_| ())
        .map_err(Error::Store)
}

/// Removes what a layer must not carry: every entry named `.git` (a nested repository would be
/// stored as a submodule link, its files lost; git stores no `.git` name), and pnpm's workspace
/// state file, a cache that records the staging path (pnpm rebuilds it).
pub fn prepare(manager: Manager, install: &Path) -> Result<(), Error> {
    let mut stack = vec![install.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(fs(FsOp::Read, &dir))?;
        for entry in rd {
            let entry = entry.map_err(fs(FsOp::Read, &dir))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(fs(FsOp::Stat, &path))?;
            let name = entry.file_name();
            let drop = name == ".git"
                || (manager == Manager::Pnpm
                    && dir == install
                    && name.as_bytes().starts_with(b".pnpm-workspace-state"));
            if drop {
                let gone = if ft.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
                gone.map_err(fs(FsOp::Remove, &path))?;
            } else if ft.is_dir() {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// Walks the installed tree: its content's bytes (files and symlink targets) and its file count
/// (files and symlinks), refusing a tree in which any file or symlink names the staging
/// directory: such a layer would run, from a workspace, what the staging path held.
pub fn check_unbound(install: &Path, staging: &Path) -> Result<(u64, u64), Error> {
    let mut needles: Vec<Vec<u8>> = vec![staging.as_os_str().as_bytes().to_vec()];
    if let Ok(c) = staging.canonicalize()
        && c != staging
    {
        needles.push(c.as_os_str().as_bytes().to_vec());
    }
    let (mut bytes, mut files) = (0u64, 0u64);
    let mut stack = vec![install.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(fs(FsOp::Read, &dir))?;
        for entry in rd {
            let entry = entry.map_err(fs(FsOp::Read, &dir))?;
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).map_err(fs(FsOp::Stat, &path))?;
            let content = if meta.is_dir() {
                stack.push(path);
                continue;
            } else if meta.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .map(|t| t.as_os_str().as_bytes().to_vec())
                    .map_err(fs(FsOp::Read, &path))?
            } else if meta.is_file() {
                std::fs::read(&path).map_err(fs(FsOp::Read, &path))?
            } else {
                // Sockets, fifos, devices: git stores none of them.
                continue;
            };
            files += 1;
            bytes += if meta.is_file() {
                meta.size()
            } else {
                content.len() as u64
            };
            if needles.iter().any(|n| contains(&content, n)) {
                let rel = path.strip_prefix(staging).unwrap_or(&path);
                return Err(Error::Bound {
                    file: rel.to_path_buf(),
                    staging: staging.to_path_buf(),
                });
            }
        }
    }
    Ok((bytes, files))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, _)) = needle.split_first() else {
        return true;
    };
    let mut i = 0;
    while let Some(p) = hay[i..].iter().position(|&b| b == first) {
        let at = i + p;
        if hay[at..].starts_with(needle) {
            return true;
        }
        i = at + 1;
    }
    false
}

/// Seals `<staging>/<path>` of every path of `paths` as a tree of `store.git` whose entries are
/// that path's children, keeps them alive with a commit at `refs/layers/<key>` (of the one tree,
/// or, for several paths, of the tree that holds them all at their paths), and returns the trees'
/// ids in the order of `paths`.
pub fn seal(
    deps: &DepStore,
    staging: &Path,
    paths: &[String],
    key: &str,
) -> Result<Vec<gix::ObjectId>, Error> {
    let _shared = store_lock(deps, false).map_err(Error::StoreLock)?;
    ensure_store(deps)?;
    let store = deps.objects();
    let index = deps.dir().join("staging").join(format!("{key}.index"));
    let _ = std::fs::remove_file(&index);
    let git = || {
        Git::new(None)
            .env("GIT_DIR", &store)
            .env("GIT_INDEX_FILE", &index)
            .env("GIT_ATTR_SOURCE", EMPTY_TREE)
    };
    let what = paths.join(", ");
    let failed = |source: crate::git::error::Error| Error::Seal {
        what: what.clone(),
        source,
    };
    let sealed = (|| {
        git()
            .env("GIT_WORK_TREE", staging)
            .args(["add", "-f", "-A", "--"])
            .args(paths)
            .output()
            .map_err(failed)?;
        let mut trees = Vec::with_capacity(paths.len());
        for p in paths {
            let tree = git()
                .arg("write-tree")
                .arg(format!("--prefix={p}/"))
                .output()
                .map_err(failed)?;
            trees.push(gix::ObjectId::from_hex(tree.as_bytes()).map_err(|_| {
                failed(crate::git::error::Error::Invalid(format!(
                    "git write-tree printed {tree:?}, not a tree id"
                )))
            })?);
        }
        let kept = match &trees[..] {
            [one] => one.to_string(),
            _ => git().arg("write-tree").output().map_err(failed)?,
        };
        let commit = git()
            .by_octofs()
            .args(["commit-tree", &kept, "-m", &format!("octofs layer {key}")])
            .output()
            .map_err(failed)?;
        git()
            .args(["update-ref", &format!("refs/layers/{key}"), &commit])
            .output()
            .map_err(failed)?;
        Ok(trees)
    })();
    let _ = std::fs::remove_file(&index);
    sealed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_needles() {
        assert!(contains(b"abc/tmp/x/staging/k/lib", b"/tmp/x/staging/k"));
        assert!(!contains(b"abc/tmp/x/stagin", b"/tmp/x/staging/k"));
        assert!(contains(b"//tmp/x", b"/tmp/x"));
        assert!(!contains(b"", b"/"));
    }

    /// A tree that names its staging directory (a console script's shebang, a symlink) is refused;
    /// one that does not is counted: bytes of files and link targets, files and links.
    #[test]
    fn a_tree_bound_to_the_staging_path_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let staging = tmp.path().join("staging/k");
        let venv = staging.join(".venv");
        std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
        std::fs::write(venv.join("pyvenv.cfg"), b"home = /usr/bin\n").expect("write");
        std::os::unix::fs::symlink("../pyvenv.cfg", venv.join("bin/cfg")).expect("symlink");
        assert_eq!(
            check_unbound(&venv, &staging).ok(),
            Some((16 + 13, 2)),
            "plain tree refused or miscounted"
        );
        let shebang = format!("#!{}/.venv/bin/python\n", staging.display());
        std::fs::write(venv.join("bin/tool"), shebang).expect("write");
        let err = check_unbound(&venv, &staging)
            .expect_err("bound script accepted")
            .to_string();
        assert!(err.contains(".venv/bin/tool"), "{err}");
        std::fs::remove_file(venv.join("bin/tool")).expect("rm");
        std::os::unix::fs::symlink(venv.join("pyvenv.cfg"), venv.join("bin/abs")).expect("symlink");
        assert!(
            check_unbound(&venv, &staging).is_err(),
            "absolute link into staging accepted"
        );
    }

    /// Nested `.git` entries go (at any depth, file or directory); the rest stays.
    #[test]
    fn nested_git_entries_are_removed_before_sealing() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let nm = tmp.path().join("node_modules");
        std::fs::create_dir_all(nm.join("a/.git/objects")).expect("mkdir");
        std::fs::create_dir_all(nm.join("b")).expect("mkdir");
        std::fs::write(nm.join("b/.git"), b"gitdir: /elsewhere\n").expect("write");
        std::fs::write(nm.join("a/index.js"), b"1").expect("write");
        std::fs::write(nm.join(".pnpm-workspace-state-v1.json"), b"{}").expect("write");
        prepare(Manager::Npm, &nm).expect("prepare");
        assert!(!nm.join("a/.git").exists() && !nm.join("b/.git").exists());
        assert!(nm.join("a/index.js").exists());
        // Only pnpm's own state file is pnpm's to drop.
        assert!(nm.join(".pnpm-workspace-state-v1.json").exists());
        prepare(Manager::Pnpm, &nm).expect("prepare");
        assert!(!nm.join(".pnpm-workspace-state-v1.json").exists());
    }
}
