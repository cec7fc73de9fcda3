//! The index shared by every fork of one base: built once per (trees, owner) under
//! `<state>/indexes` with the stat data the mount presents, its cache tree and untracked cache
//! beside it, and what every fork's small index repeats of them (kept for the last few).
//!
//! Owns the files under `<state>/indexes` (written whole under a temporary name, read-only, the
//! daemon's only). Must not write a workspace (`seed` links the shared index into one) nor the
//! mirror (its objects are only read).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::Error;
use crate::fs::{BaseStat, Presentation, base_stat};
use crate::git::objects::EntryKind;
use crate::git::objects::ObjectStore;
use crate::layout::Layout;

/// The index of `index_tree` for a workspace whose files are `worktree_tree`, presented to owner
/// `uid`/`gid` with base time `time`: an entry whose blob and mode are the same in both trees gets
/// exactly the stat data the mount presents (git re-reads nothing); any other gets none, so git
/// compares its content. Built once per (trees, owner) under `<state>/indexes/` and shared by every
/// fork: a fresh fork has `index_tree == worktree_tree`; a resumed one indexes HEAD's tree over its
/// snapshot's files, so uncommitted work reads as uncommitted.
pub fn shared_index(
    layout: &Layout,
    store: &ObjectStore,
    index_tree: gix::ObjectId,
    worktree_tree: gix::ObjectId,
    time: i64,
    uid: u32,
    gid: u32,
) -> Result<PathBuf, Error> {
    let path = shared_index_path(layout, index_tree, worktree_tree, uid, gid);
    let dir = layout.state.join("indexes");
    let key = format!("{index_tree}-{worktree_tree}-{uid}-{gid}");
    if path.exists() {
        return Ok(path);
    }
    crate::layout::create_private_dir(&dir).map_err(|source| Error::CreateDir {
        dir: dir.clone(),
        source,
    })?;
    let repo = crate::git::open_owned(store.path()).map_err(|source| Error::OpenMirror {
        path: store.path().to_path_buf(),
        source,
    })?;
    let mut index = repo
        .index_from_tree(&index_tree)
        .map_err(|source| Error::BuildIndex {
            tree: index_tree,
            source,
        })?;
    let worktree: std::collections::HashMap<Vec<u8>, (gix::ObjectId, gix::index::entry::Mode)> =
        if worktree_tree == index_tree {
            Default::default()
        } else {
            let w = repo
                .index_from_tree(&worktree_tree)
                .map_err(|source| Error::ReadTree {
                    tree: worktree_tree,
                    source,
                })?;
            w.entries()
                .iter()
                .map(|e| (e.path(&w).to_vec(), (e.id, e.mode)))
                .collect()
        };
    let pres = Presentation {
        uid,
        gid,
        time: crate::fs::unix_time(time),
    };
    // The file bytes of the tree (`serve --io auto` weighs a base by them): summed here, where
    // every blob's size is read anyway, and kept beside the index.
    let mut file_bytes: u64 = 0;
    for (entry, path) in index.entries_mut_with_paths() {
        let same_in_worktree = worktree_tree == index_tree
            || worktree
                .get(path.as_ref() as &[u8])
                .is_some_and(|(id, mode)| *id == entry.id && *mode == entry.mode);
        // A gitlink is presented as a directory, which git never compares with its index entry.
        if !same_in_worktree || entry.mode == gix::index::entry::Mode::COMMIT {
            entry.stat = gix::index::entry::Stat::default();
            continue;
        }
        let kind = if entry.mode == gix::index::entry::Mode::FILE_EXECUTABLE {
            EntryKind::Executable
        } else if entry.mode == gix::index::entry::Mode::SYMLINK {
            EntryKind::Symlink
        } else {
            EntryKind::Blob
        };
        let st = base_stat(store, &pres, path.as_ref(), kind, entry.id).map_err(|source| {
            Error::BlobSize {
                id: entry.id,
                source,
            }
        })?;
        file_bytes = file_bytes.saturating_add(st.size);
        entry.stat = index_stat(&st);
    }
    // A fresh fork's directories hold no untracked file: git's untracked cache can say so, and the
    // first `git status` then lists no directory (see `seed`). Kept beside the index, read-only.
    let untracked = (worktree_tree == index_tree).then(|| untracked_tail(store, &index, &pres));
    // The cache tree of the index (it holds exactly `index_tree`), for every fork's small index.
    let cache_tree = crate::git::index_ext::cache_tree(index_tree, &mut |id| {
        let tree = repo.find_tree(id)?;
        let decoded = tree.decode()?;
        Ok::<_, gix::Error>(
            decoded
                .entries
                .iter()
                .map(|e| (e.filename.to_vec(), e.mode.is_tree(), e.oid.to_owned()))
                .collect(),
        )
    })
    .map_err(|source| Error::ReadTree {
        tree: index_tree,
        source,
    })?;
    let bytes = crate::git::checksum::index_file(
        &index,
        gix::index::write::Options {
            extensions: gix::index::write::Extensions::None,
            ..Default::default()
        },
    )
    .map_err(|source| Error::EncodeIndex { source })?;
    if bytes.len() < 32 {
        return Err(Error::IndexTooShort);
    }
    for (side, tail) in [
        (untracked_tail_path(&path), untracked),
        (cache_tree_path(&path), Some(cache_tree)),
        (
            bytes_path(&path),
            Some(format!("{file_bytes}\n").into_bytes()),
        ),
    ] {
        let Some(tail) = tail else { continue };
        let written = (|| -> std::io::Result<()> {
            if let Some(d) = side.parent() {
                crate::layout::create_private_dir(d)?;
            }
            let tmp = side.with_file_name(format!(".tmp-{key}-{}", std::process::id()));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&tail)?;
            f.sync_all()?;
            std::fs::set_permissions(
                &tmp,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o400),
            )?;
            std::fs::rename(&tmp, &side)
        })();
        if let Err(source) = written {
            return Err(Error::WriteIndex { source });
        }
    }
    let tmp = dir.join(format!(".tmp-{key}-{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.flush()?;
        f.sync_all()?;
        let mut perms = f.metadata()?.permissions();
        // Read-only, and the daemon's only: it lists every path of the project.
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o400);
        std::fs::set_permissions(&tmp, perms)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::WriteIndex { source });
    }
    Ok(path)
}

/// Where [`shared_index`] keeps the index of (`index_tree`, `worktree_tree`) for owner `uid`/`gid`.
pub fn shared_index_path(
    layout: &Layout,
    index_tree: gix::ObjectId,
    worktree_tree: gix::ObjectId,
    uid: u32,
    gid: u32,
) -> PathBuf {
    // `.split`: written as a split index's shared part (no extensions of its own), with its
    // untracked-cache tail beside it; indexes of earlier versions (with an fsmonitor extension) are
    // not used.
    layout
        .state
        .join("indexes")
        .join(format!("{index_tree}-{worktree_tree}-{uid}-{gid}.split"))
}

/// Where [`shared_index`] keeps the cache tree (`TREE` payload) of the index at `index`.
fn cache_tree_path(index: &Path) -> PathBuf {
    let name = index.file_name().unwrap_or_default();
    index
        .parent()
        .unwrap_or(Path::new("."))
        .join("cachetree")
        .join(name)
}

/// Where [`shared_index`] keeps the file bytes of the index at `index` (the sizes of its blobs,
/// as decimal text).
fn bytes_path(index: &Path) -> PathBuf {
    let name = index.file_name().unwrap_or_default();
    index
        .parent()
        .unwrap_or(Path::new("."))
        .join("bytes")
        .join(name)
}

/// The file bytes of the tree of the shared index at `index` (the sum of its blobs' sizes, as the
/// mount presents them): from the number kept beside it, else (an index built before it was kept)
/// summed from the index's entries once and kept. Reads no blob. None: no such index.
pub fn index_bytes(index: &Path) -> Option<u64> {
    let side = bytes_path(index);
    if let Some(n) = std::fs::read_to_string(&side)
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return Some(n);
    }
    let file = gix::index::File::at(
        index,
        gix::hash::Kind::Sha1,
        false,
        gix::index::decode::Options::default(),
    )
    .ok()?;
    let n = file
        .entries()
        .iter()
        .fold(0u64, |a, e| a.saturating_add(u64::from(e.stat.size)));
    // Kept for the next mount; a failure only means summing again.
    let _ = (|| -> std::io::Result<()> {
        if let Some(d) = side.parent() {
            crate::layout::create_private_dir(d)?;
        }
        let tmp = side.with_file_name(format!(".tmp-bytes-{}", std::process::id()));
        std::fs::write(&tmp, format!("{n}\n"))?;
        std::fs::rename(&tmp, &side)
    })();
    Some(n)
}

/// Where [`shared_index`] keeps the untracked cache (after its ident) of the index at `index`.
fn untracked_tail_path(index: &Path) -> PathBuf {
    let name = index.file_name().unwrap_or_default();
    index
        .parent()
        .unwrap_or(Path::new("."))
        .join("untracked")
        .join(name)
}

/// The untracked cache of a fresh fork of `index`'s tree, after its ident: every directory of the
/// tree (those git lists for `git status`), with the stat data the mount presents and its
/// `.gitignore`'s id, none holding an untracked file.
fn untracked_tail(store: &ObjectStore, index: &gix::index::File, pres: &Presentation) -> Vec<u8> {
    use crate::git::index_ext::{CachedDir, StatData};
    let null = gix::ObjectId::null(gix::hash::Kind::Sha1);
    let stat = |path: &[u8]| {
        // A directory's presented stat reads no object (its size is fixed).
        let s = base_stat(store, pres, path, EntryKind::Tree, null)
            .map(|st| index_stat(&st))
            .unwrap_or_default();
        StatData {
            ctime: (s.ctime.secs, s.ctime.nsecs),
            mtime: (s.mtime.secs, s.mtime.nsecs),
            dev: 0,
            ino: s.ino,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
        }
    };
    let mut root = CachedDir::new(Vec::new(), stat(b""));
    for e in index.entries() {
        let path: &[u8] = e.path(index).as_ref();
        let Some(slash) = path.iter().rposition(|b| *b == b'/') else {
            if path == b".gitignore" && e.mode == gix::index::entry::Mode::FILE {
                root.gitignore = Some(e.id.as_bytes().try_into().unwrap_or([0; 20]));
            }
            continue;
        };
        let (dir, name) = (&path[..slash], &path[slash + 1..]);
        let mut cur = &mut root;
        let mut end = 0;
        for comp in dir.split(|b| *b == b'/') {
            end += comp.len();
            cur = cur.child(comp, || stat(&dir[..end]));
            end += 1;
        }
        if name == b".gitignore" && e.mode == gix::index::entry::Mode::FILE {
            cur.gitignore = Some(e.id.as_bytes().try_into().unwrap_or([0; 20]));
        }
    }
    crate::git::index_ext::untracked_tail(&root)
}

/// The index stat data of a base entry presented as `st`: what git finds when it `lstat`s the file
/// through the mount (git keeps 32 bits of each field and compares only those).
pub fn index_stat(st: &BaseStat) -> gix::index::entry::Stat {
    let time = gix::index::entry::stat::Time {
        secs: st.time.0.clamp(0, u32::MAX as i64) as u32,
        nsecs: st.time.1,
    };
    gix::index::entry::Stat {
        mtime: time,
        ctime: time,
        dev: 0,
        ino: st.ino as u32,
        uid: st.uid,
        gid: st.gid,
        size: st.size as u32,
    }
}

/// What every fork's small index of one shared index repeats: its head (header, link, cache tree;
/// checksummed already) and the untracked cache's tail. Read from `<state>/indexes` once per
/// shared index and kept in memory for the last few: a fork then reads neither file and
/// checksums and copies only what is its own.
pub(super) struct SmallIndexParts {
    pub(super) head: crate::git::index_ext::SplitIndexHead,
    pub(super) untracked: Option<Vec<u8>>,
}

/// How many shared indexes' [`SmallIndexParts`] the daemon keeps (each about the size of the
/// small index: ~280 KB for a 100,000-file base).
const SMALL_INDEX_PARTS_KEPT: usize = 8;

/// The kept [`SmallIndexParts`], by shared index path and its trailing hash, most recent last.
#[allow(clippy::type_complexity)]
static SMALL_INDEX_PARTS: std::sync::Mutex<
    Vec<(PathBuf, [u8; 20], std::sync::Arc<SmallIndexParts>)>,
> = std::sync::Mutex::new(Vec::new());

/// The [`SmallIndexParts`] of the shared index at `index`, whose trailing hash is `shared` (a
/// shared index rebuilt with other content has another hash, so nothing stale is ever used).
pub(super) fn small_index_parts(
    index: &Path,
    shared: &[u8; 20],
) -> std::sync::Arc<SmallIndexParts> {
    let kept = || SMALL_INDEX_PARTS.lock().unwrap_or_else(|p| p.into_inner());
    {
        let mut k = kept();
        if let Some(at) = k.iter().position(|(p, h, _)| p == index && h == shared) {
            let e = k.remove(at);
            let parts = e.2.clone();
            k.push(e);
            return parts;
        }
    }
    // Absent for a shared index built before cache trees were kept: git then walks HEAD's trees.
    let cache_tree = std::fs::read(cache_tree_path(index)).ok();
    let mut fixed: Vec<(&[u8; 4], &[u8])> = Vec::new();
    if let Some(t) = &cache_tree {
        fixed.push((b"TREE", t));
    }
    let parts = std::sync::Arc::new(SmallIndexParts {
        head: crate::git::index_ext::SplitIndexHead::new(shared, &fixed),
        untracked: std::fs::read(untracked_tail_path(index)).ok(),
    });
    let mut k = kept();
    k.retain(|(p, h, _)| !(p == index && h == shared));
    if k.len() >= SMALL_INDEX_PARTS_KEPT {
        k.remove(0);
    }
    k.push((index.to_path_buf(), *shared, parts.clone()));
    parts
}

/// The trailing hash of the index file at `path` (what a split index names its shared part by).
pub(super) fn index_hash(path: &Path) -> std::io::Result<[u8; 20]> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::End(-20))?;
    let mut h = [0u8; 20];
    f.read_exact(&mut h)?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    /// Catches: a cache tree git does not read as its own (order of subtrees, entry counts with
    /// nested trees and a gitlink, the root's empty name): compared byte for byte with the `TREE`
    /// extension git itself writes for the same tree.
    #[test]
    fn cache_tree_is_the_one_git_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = dir.path();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(r)
                .output()
                .expect("git runs");
            assert!(out.status.success(), "git {args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        git(&["init", "-q"]);
        for p in ["a", "b/c", "bb/x", "b/c/d", "b-c", "zz/y/w/v", "b.c"] {
            std::fs::create_dir_all(r.join(p)).expect("mkdir");
            std::fs::write(r.join(p).join("f"), p).expect("write");
        }
        std::fs::write(r.join("top"), "t").expect("write");
        git(&["add", "-A"]);
        let blob = git(&["hash-object", "-w", "top"]);
        let commit = git(&["commit-tree", &git(&["write-tree"]), "-m", "x"]);
        git(&[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{commit},zz/sub"),
        ]);
        git(&[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},zz/y/top"),
        ]);
        let tree = git(&["write-tree"]);
        let index = std::fs::read(r.join(".git/index")).expect("index");
        let at = index
            .windows(4)
            .position(|w| w == b"TREE")
            .expect("git wrote a TREE extension");
        let len = u32::from_be_bytes(index[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let want = &index[at + 8..at + 8 + len];

        let repo = crate::git::open_owned(&r.join(".git")).expect("open");
        let root = gix::ObjectId::from_hex(tree.as_bytes()).expect("tree id");
        let got = crate::git::index_ext::cache_tree(root, &mut |id| {
            let t = repo.find_tree(id)?;
            let d = t.decode()?;
            Ok::<_, gix::Error>(
                d.entries
                    .iter()
                    .map(|e| (e.filename.to_vec(), e.mode.is_tree(), e.oid.to_owned()))
                    .collect(),
            )
        })
        .expect("cache tree");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "our TREE differs from git's"
        );
        assert_eq!(got, want);
    }
}
