//! The fixture of the core benchmarks: a real git repository of 100,000 files (written with
//! `git fast-import`, which takes a few seconds where a work tree and `git add` would take
//! minutes), its object store, a blob cache, and workspaces loaded over it, all in temporary
//! directories (on tmpfs when there is one: the benchmarks measure the core, not a disk).
//!
//! The tree: `big/` holds 10,000 files (`f00000`..`f09999`), and `d00/`..`d89/` hold 1,000 files
//! each (`f000`..`f999`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use octofs::cow::blobcache::BlobCache;
use octofs::fs::{Caller, Presentation, ROOT_INO, WorkspaceFs, unix_time};
use octofs::git::objects::ObjectStore;

/// Files in `big/`.
pub const BIG: usize = 10_000;
/// Directories `d00`.. and files in each.
pub const DIRS: usize = 90;
pub const PER_DIR: usize = 1_000;
/// Owner the workspace presents its base as.
pub const OWNER: (u32, u32) = (1234, 5678);
pub const CALLER: Caller = Caller {
    uid: 1234,
    gid: 5678,
};

pub fn dir_name(d: usize) -> String {
    format!("d{d:02}")
}

pub fn file_name(f: usize) -> String {
    format!("f{f:03}")
}

pub fn big_name(f: usize) -> String {
    format!("f{f:05}")
}

/// A temporary directory on tmpfs when there is one.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(t) = tempfile::tempdir_in(shm)
    {
        return t;
    }
    tempfile::tempdir().expect("tempdir")
}

fn git(dir: &Path) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdout(Stdio::null());
    c
}

fn run(mut c: Command, what: &str) {
    let st = c.status().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(st.success(), "{what}: {st}");
}

/// The base repository and what every workspace over it shares.
pub struct Base {
    /// Kept for its lifetime: the repository is removed when the base is dropped.
    pub _repo: tempfile::TempDir,
    pub cache: tempfile::TempDir,
    pub store: Arc<ObjectStore>,
    pub blobs: Arc<BlobCache>,
    pub tree: gix::ObjectId,
    pub time: i64,
}

impl Base {
    pub fn build() -> Base {
        let repo = scratch();
        let mut init = git(repo.path());
        init.args(["init", "-q"]);
        run(init, "git init");
        let mut head = git(repo.path());
        head.args(["symbolic-ref", "HEAD", "refs/heads/main"]);
        run(head, "git symbolic-ref");
        let mut stream = Vec::with_capacity(8 << 20);
        stream.extend_from_slice(
            b"commit refs/heads/main\ncommitter Bench <bench@example.com> 1609459200 +0000\n\
              data 5\nbase\n",
        );
        let mut add = |path: &str| {
            let body = format!("{path}\n");
            stream.extend_from_slice(
                format!("M 100644 inline {path}\ndata {}\n{body}\n", body.len()).as_bytes(),
            );
        };
        for f in 0..BIG {
            add(&format!("big/{}", big_name(f)));
        }
        for d in 0..DIRS {
            for f in 0..PER_DIR {
                add(&format!("{}/{}", dir_name(d), file_name(f)));
            }
        }
        let mut fi = git(repo.path());
        fi.args(["fast-import", "--quiet"]).stdin(Stdio::piped());
        let mut child = fi.spawn().expect("git fast-import");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&stream)
            .expect("feed git fast-import");
        let st = child.wait().expect("git fast-import");
        assert!(st.success(), "git fast-import: {st}");
        let cache = scratch();
        let store = Arc::new(ObjectStore::open(repo.path()).expect("open the object store"));
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

    /// A workspace over the base with its upper layer at `upper`.
    pub fn load(&self, upper: &Path) -> WorkspaceFs {
        WorkspaceFs::load(
            self.store.clone(),
            self.blobs.clone(),
            self.tree,
            Presentation {
                uid: OWNER.0,
                gid: OWNER.1,
                time: unix_time(self.time),
            },
            upper,
            self.cache.path().to_path_buf(),
        )
        .expect("load the workspace")
    }

    /// A fresh workspace (an empty upper layer).
    pub fn workspace(&self) -> Workspace {
        let upper = scratch();
        let fs = self.load(upper.path());
        Workspace { upper, fs }
    }
}

/// A workspace and the upper layer it lives in.
pub struct Workspace {
    pub upper: tempfile::TempDir,
    pub fs: WorkspaceFs,
}

impl Workspace {
    /// The inode of a top-level directory.
    pub fn dir(&self, name: &str) -> u64 {
        self.fs
            .lookup(ROOT_INO, name.as_ref())
            .unwrap_or_else(|e| panic!("lookup {name}: {e:?}"))
            .ino
            .0
    }
}

/// A copy of directory `from` (`cp -a`), in a new temporary directory.
pub fn copy_dir(from: &Path) -> (tempfile::TempDir, PathBuf) {
    let t = scratch();
    let to = t.path().join("upper");
    let mut c = Command::new("cp");
    c.arg("-a").arg(from).arg(&to);
    run(c, "cp -a");
    (t, to)
}
