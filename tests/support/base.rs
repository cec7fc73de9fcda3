//! The base commit the model test runs on: a real git repository (nested directories, files of
//! several sizes, executables, symlinks), its object store and the host-wide blob cache, built once
//! and shared by every generated case; and where the upper layers go (tmpfs when there is one).

use std::path::Path;
use std::sync::Arc;

use octofs::cow::blobcache::BlobCache;
use octofs::fs::WorkspaceFs;
use octofs::git::objects::ObjectStore;

use crate::common::{DATE1, GitRepo, load_core, pseudo_random};

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum BaseKind {
    File,
    Exec,
    Link,
}

/// The base commit: nested directories, files of several sizes (two above 64 KiB), executables and
/// symlinks (to a file, to a directory, dangling). git cannot hold an empty directory.
pub fn base_spec() -> Vec<(&'static str, Vec<u8>, BaseKind)> {
    use BaseKind::*;
    vec![
        ("README.md", b"# base\n".to_vec(), File),
        ("empty", Vec::new(), File),
        ("run.sh", b"#!/bin/sh\necho hi\n".to_vec(), Exec),
        ("big.bin", pseudo_random(100_000, 1), File),
        ("link", b"a/one.txt".to_vec(), Link),
        ("dangling", b"nowhere/at/all".to_vec(), Link),
        ("a/one.txt", b"one\n".to_vec(), File),
        ("a/two.txt", pseudo_random(4096, 2), File),
        ("a/up", b"../README.md".to_vec(), Link),
        ("a/b/x.bin", pseudo_random(70_000, 3), File),
        ("a/b/tool", b"#!/bin/sh\n".to_vec(), Exec),
        ("a/b/c/deep.txt", b"deep\n".to_vec(), File),
        ("d/g.txt", b"g\n".to_vec(), File),
        ("d/e/f.txt", b"f\n".to_vec(), File),
        ("d/e/dirlink", b"../../a".to_vec(), Link),
        ("sp ace/naïve café.txt", "ü\n".as_bytes().to_vec(), File),
    ]
}

/// A scratch directory for upper layers and the blob cache: on tmpfs when there is one (a clean
/// stop fsyncs the catalog; the test is about logic, not disks), else in the usual temp dir.
/// `OCTOFS_MODEL_TMP` chooses another place.
pub fn scratch_dir() -> tempfile::TempDir {
    let place = std::env::var_os("OCTOFS_MODEL_TMP")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            let shm = Path::new("/dev/shm");
            shm.is_dir().then(|| shm.to_path_buf())
        });
    match place {
        Some(p) => tempfile::tempdir_in(&p)
            .or_else(|_| tempfile::tempdir())
            .expect("tempdir"),
        None => tempfile::tempdir().expect("tempdir"),
    }
}

/// The base repository, its object store and the host-wide blob cache, shared by every case.
pub struct Base {
    pub _repo: tempfile::TempDir,
    pub cache: tempfile::TempDir,
    pub store: Arc<ObjectStore>,
    pub blobs: Arc<BlobCache>,
    pub tree: gix::ObjectId,
    pub time: i64,
}

impl Base {
    pub fn new() -> Base {
        let repo = tempfile::tempdir().expect("tempdir");
        let r = GitRepo::init(repo.path());
        r.git(["config", "core.symlinks", "true"]);
        for (path, data, kind) in base_spec() {
            match kind {
                BaseKind::File => r.write(path, &data),
                BaseKind::Exec => r.write_exec(path, &data),
                BaseKind::Link => r.symlink(path, std::str::from_utf8(&data).expect("utf8")),
            }
        }
        r.commit_all("base", DATE1);
        let cache = scratch_dir();
        let store = Arc::new(ObjectStore::open(&r.path).expect("open store"));
        let head = store.resolve(None).expect("HEAD resolves");
        let blobs = Arc::new(BlobCache::new(&cache.path().join("blobs")).expect("blob cache"));
        Base {
            _repo: repo,
            cache,
            store,
            blobs,
            tree: head.tree,
            time: head.time,
        }
    }

    pub fn load(&self, upper: &Path) -> WorkspaceFs {
        load_core(
            &self.store,
            &self.blobs,
            self.tree,
            self.time,
            upper,
            self.cache.path(),
        )
    }
}
