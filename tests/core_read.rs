//! The filesystem core without a kernel: walk a workspace through `lookup`/`readdir`/`open`/`readlink`
//! and compare every entry with what `git ls-tree` says about the base commit.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use fuser::{Errno, FileType};
use octofs::cow::blobcache::BlobCache;
use octofs::fs::failures::{Cx, failure_line};
use octofs::fs::stats::Op;
use octofs::fs::{ROOT_INO, WorkspaceFs, path_ino};
use octofs::git::objects::ObjectStore;

use crate::common;

use common::{CORE_OWNER, DATE1, GitRepo, git, load_core};

/// A repository with every kind of entry; returns its directory guard.
fn repo() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = GitRepo::init(tmp.path());
    r.write("a/b/c/deep.txt", "deep\n");
    r.write("a/one.txt", "one\n");
    r.write("empty", "");
    r.write("dir with space/naïve café.txt", "ü\n");
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    r.write("a/big.bin", &big);
    r.write_exec("run.sh", "#!/bin/sh\necho hi\n");
    r.symlink("link", "a/one.txt");
    r.symlink("dangling", "nowhere/at/all");
    let c = r.commit_all("one", DATE1);
    r.gitlink("sub", &c);
    r.commit_all("gitlink", DATE1);
    tmp
}

fn workspace(repo: &Path, cache: &Path) -> (WorkspaceFs, Arc<ObjectStore>) {
    workspace_at(repo, cache, &cache.join("upper"))
}

fn workspace_at(repo: &Path, cache: &Path, upper: &Path) -> (WorkspaceFs, Arc<ObjectStore>) {
    let store = Arc::new(ObjectStore::open(repo).expect("open store"));
    let base = store.resolve(None).expect("HEAD resolves");
    let blobs = Arc::new(BlobCache::new(cache).expect("cache"));
    let fs = load_core(&store, &blobs, base.tree, base.time, upper, cache);
    (fs, store)
}

/// Walks the whole tree through the core, returning path -> (kind, perm, size, content or target).
fn walk(
    fs: &WorkspaceFs,
    ino: u64,
    prefix: &str,
    out: &mut BTreeMap<String, (FileType, u16, u64, Vec<u8>, u64)>,
) {
    let entries = fs.readdir(ino).expect("readdir");
    assert_eq!(entries[0].name, ".");
    assert_eq!(entries[1].name, "..");
    for e in &entries[2..] {
        let name = e.name.to_str().expect("utf8 name");
        let path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let attr = fs.lookup(ino, &e.name).expect("lookup");
        assert_eq!(attr.ino, e.attr.ino, "readdir and lookup agree on {path}");
        assert_eq!(attr.size, e.attr.size, "readdir and lookup agree on {path}");
        assert_eq!(
            attr.ino.0,
            path_ino(path.as_bytes(), 0),
            "inode of {path} is its path hash"
        );
        assert_eq!((attr.uid, attr.gid), CORE_OWNER);
        let body = match attr.kind {
            FileType::Directory => {
                walk(fs, attr.ino.0, &path, out);
                Vec::new()
            }
            FileType::Symlink => fs.readlink(attr.ino.0).expect("readlink"),
            FileType::RegularFile => {
                let mut f = fs.open(attr.ino.0, libc::O_RDONLY).expect("open").file;
                let mut v = Vec::new();
                f.read_to_end(&mut v).unwrap();
                v
            }
            other => panic!("unexpected kind {other:?}"),
        };
        out.insert(path, (attr.kind, attr.perm, attr.size, body, attr.ino.0));
    }
}

#[test]
fn the_core_presents_exactly_the_base_tree() {
    let r = repo();
    let cache = tempfile::tempdir().unwrap();
    let (fs, _store) = workspace(r.path(), cache.path());
    let mut seen = BTreeMap::new();
    walk(&fs, ROOT_INO, "", &mut seen);

    // Every blob, link and gitlink of `git ls-tree -r` is there with the right mode, size and bytes.
    let listing = git(r.path(), ["ls-tree", "-r", "-l", "-z", "HEAD"]);
    let mut expected_files = 0;
    for rec in listing.split('\0').filter(|s| !s.is_empty()) {
        let (meta, path) = rec.split_once('\t').unwrap();
        let f: Vec<&str> = meta.split_whitespace().collect();
        let (mode, oid) = (f[0], f[2]);
        let (kind, perm, size, body, _) =
            seen.get(path).unwrap_or_else(|| panic!("{path} missing"));
        match mode {
            "100644" | "100755" => {
                assert_eq!(*kind, FileType::RegularFile, "{path}");
                assert_eq!(
                    *perm,
                    if mode == "100755" { 0o755 } else { 0o644 },
                    "{path}"
                );
                let content = Command::new("git")
                    .arg("-C")
                    .arg(r.path())
                    .args(["cat-file", "blob", oid])
                    .output()
                    .unwrap()
                    .stdout;
                assert_eq!(*body, content, "{path} bytes");
                assert_eq!(*size, content.len() as u64, "{path} size");
            }
            "120000" => {
                assert_eq!(*kind, FileType::Symlink, "{path}");
                let target = Command::new("git")
                    .arg("-C")
                    .arg(r.path())
                    .args(["cat-file", "blob", oid])
                    .output()
                    .unwrap()
                    .stdout;
                assert_eq!(*body, target, "{path} target");
                assert_eq!(*size, target.len() as u64);
            }
            "160000" => {
                assert_eq!(
                    *kind,
                    FileType::Directory,
                    "{path}: a gitlink is an empty directory"
                );
                assert_eq!(
                    fs.readdir(seen[path].4).unwrap().len(),
                    2,
                    "{path} is empty"
                );
            }
            m => panic!("unexpected mode {m}"),
        }
        expected_files += 1;
    }
    let non_dirs = seen.values().filter(|v| v.0 != FileType::Directory).count();
    assert_eq!(
        non_dirs + 1,
        expected_files,
        "nothing extra (the gitlink is the one directory counted)"
    );
}

#[test]
fn inode_numbers_are_stable_across_instances_and_forgets() {
    let r = repo();
    let cache = tempfile::tempdir().unwrap();
    let (a, _) = workspace_at(r.path(), cache.path(), &cache.path().join("a"));
    let (b, _) = workspace_at(r.path(), cache.path(), &cache.path().join("b"));
    let la = a.lookup(ROOT_INO, OsStr::new("a")).unwrap();
    let lb = b.lookup(ROOT_INO, OsStr::new("a")).unwrap();
    assert_eq!(la.ino, lb.ino);
    let deep_a = a.lookup(la.ino.0, OsStr::new("b")).unwrap();
    a.forget(deep_a.ino.0, 1);
    assert_eq!(
        a.getattr(deep_a.ino.0).unwrap_err(),
        Errno::ENOENT,
        "forgotten node is gone"
    );
    let again = a.lookup(la.ino.0, OsStr::new("b")).unwrap();
    assert_eq!(
        again.ino, deep_a.ino,
        "the same path gets the same number again"
    );
    // Directory link counts: 2 + subdirectories.
    assert_eq!(la.nlink, 3, "a/ has one subdirectory");
}

#[test]
fn errors_have_the_right_errno() {
    let r = repo();
    let cache = tempfile::tempdir().unwrap();
    let (fs, _) = workspace(r.path(), cache.path());
    assert_eq!(
        fs.lookup(ROOT_INO, OsStr::new("missing")).unwrap_err(),
        Errno::ENOENT
    );
    let long = "x".repeat(256);
    assert_eq!(
        fs.lookup(ROOT_INO, OsStr::new(&long)).unwrap_err(),
        Errno::ENAMETOOLONG
    );
    let one = fs
        .lookup(
            fs.lookup(ROOT_INO, OsStr::new("a")).unwrap().ino.0,
            OsStr::new("one.txt"),
        )
        .unwrap();
    assert_eq!(
        fs.lookup(one.ino.0, OsStr::new("x")).unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(fs.readdir(one.ino.0).unwrap_err(), Errno::ENOTDIR);
    assert_eq!(fs.readlink(one.ino.0).unwrap_err(), Errno::EINVAL);
    assert_eq!(
        fs.open(ROOT_INO, libc::O_RDONLY).unwrap_err(),
        Errno::EISDIR
    );
    assert_eq!(fs.getattr(0xdead).unwrap_err(), Errno::ENOENT);
}

#[test]
fn opening_reads_content_once_into_the_shared_cache() {
    let r = repo();
    let cache = tempfile::tempdir().unwrap();
    let (a, _) = workspace(r.path(), cache.path());
    let big = a
        .lookup(
            a.lookup(ROOT_INO, OsStr::new("a")).unwrap().ino.0,
            OsStr::new("big.bin"),
        )
        .unwrap();
    // stat needs no content
    assert_eq!(
        a.blob_cache()
            .stats
            .materialized
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    drop(a.open(big.ino.0, libc::O_RDONLY).unwrap());
    drop(a.open(big.ino.0, libc::O_RDONLY).unwrap());
    let stats = &a.blob_cache().stats;
    assert_eq!(
        stats
            .materialized
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(stats.hits.load(std::sync::atomic::Ordering::Relaxed), 1);
    // The cache file is read-only and named by the object id.
    let oid = git(r.path(), ["rev-parse", "HEAD:a/big.bin"]);
    let p = cache.path().join(&oid.trim()[..2]).join(&oid.trim()[2..]);
    let meta = std::fs::metadata(&p).expect("cache file exists");
    assert_eq!(meta.len(), 300_000);
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o400
    );
}

/// A base blob missing from the object store (a damaged mirror): the request still fails with EIO,
/// and the error, and the one log line of the failed request, name the blob and the path — the bare
/// errno the core returned before said neither.
#[test]
fn a_missing_blob_is_eio_naming_the_blob_and_its_path() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = GitRepo::init(tmp.path());
    r.write("kept.txt", "kept\n");
    r.write("lost.txt", "lost and gone\n");
    r.commit_all("one", DATE1);
    let blob = git(tmp.path(), ["rev-parse", "HEAD:lost.txt"]);
    let blob = blob.trim();
    let loose = tmp
        .path()
        .join(".git/objects")
        .join(&blob[..2])
        .join(&blob[2..]);
    std::fs::remove_file(&loose).expect("remove the loose blob");
    let cache = tempfile::tempdir().expect("tempdir");
    let (fs, _store) = workspace(tmp.path(), cache.path());

    assert!(fs.lookup(ROOT_INO, OsStr::new("kept.txt")).is_ok());
    let name = OsStr::new("lost.txt");
    let err = fs.lookup(ROOT_INO, name).unwrap_err();
    assert_eq!(err.errno, Errno::EIO);
    let context = err.context.clone().unwrap_or_default();
    assert!(
        context.contains(blob) && context.contains("lost.txt"),
        "the error names the blob and its path: {err}"
    );
    let line = failure_line(&Cx::new(Op::Lookup, ROOT_INO, Some(name)), &err);
    assert!(
        line.contains("EIO") && line.contains(blob) && line.contains("lost.txt"),
        "the logged failure names the blob: {line}"
    );
}

/// A data file removed from under the upper layer: `getattr` fails with EIO and `open` with ENOENT
/// (the errnos as before), each error naming the data file that is gone.
#[test]
fn a_data_file_gone_from_the_upper_layer_is_named_by_the_error() {
    let r = repo();
    let cache = tempfile::tempdir().expect("tempdir");
    let (fs, _store) = workspace(r.path(), cache.path());
    let caller = octofs::fs::Caller { uid: 0, gid: 0 };
    let (attr, opened) = fs
        .create(ROOT_INO, OsStr::new("new.txt"), 0o644, libc::O_RDWR, caller)
        .expect("create");
    let ino = attr.ino.0;
    drop(opened);
    fs.release(ino, true);
    let data = fs.data_path(ino);
    std::fs::remove_file(&data).expect("remove the data file");
    let shown = data.display().to_string();

    let err = fs.getattr(ino).unwrap_err();
    assert_eq!(err.errno, Errno::EIO);
    assert!(
        err.context.as_deref().is_some_and(|c| c.contains(&shown)),
        "getattr's error names the data file: {err}"
    );
    let err = fs.open(ino, libc::O_RDONLY).unwrap_err();
    assert_eq!(err.errno, Errno::ENOENT);
    let line = failure_line(&Cx::new(Op::Open, ino, None), &err);
    assert!(
        line.contains("ENOENT") && line.contains(&shown),
        "the logged failure names the data file: {line}"
    );
}
