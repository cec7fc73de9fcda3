//! The core's inode table without a kernel: what it holds while the kernel refers to base entries
//! (a `git status` looks up every file), and that it empties again when the kernel forgets them.
//! Would fail if every looked-up base file kept a full node and record (the table then grows by
//! a record per file git looked at), if forgets were not counted exactly, or if a base file's
//! number or attributes changed between its light and full forms.

use std::ffi::OsStr;
use std::io::Read;
use std::sync::Arc;

use fuser::Errno;
use octofs::cow::blobcache::BlobCache;
use octofs::fs::{ROOT_INO, SetAttr, WorkspaceFs, path_ino};
use octofs::git::objects::ObjectStore;

mod common;

use common::{DATE1, GitRepo, load_core};

const DIRS: usize = 6;
const FILES: usize = 40;

fn repo() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = GitRepo::init(tmp.path());
    for d in 0..DIRS {
        for f in 0..FILES {
            r.write(&format!("d{d}/f{f:02}.txt"), format!("{d}/{f}\n"));
        }
        r.write_exec(&format!("d{d}/run.sh"), "#!/bin/sh\n");
        r.symlink(&format!("d{d}/link"), "f00.txt");
    }
    r.write("top.txt", "top\n");
    r.commit_all("base", DATE1);
    tmp
}

fn workspace(repo: &std::path::Path, cache: &std::path::Path) -> WorkspaceFs {
    let store = Arc::new(ObjectStore::open(repo).expect("open store"));
    let base = store.resolve(None).expect("HEAD resolves");
    let blobs = Arc::new(BlobCache::new(cache).expect("cache"));
    load_core(
        &store,
        &blobs,
        base.tree,
        base.time,
        &cache.join("upper"),
        cache,
    )
}

#[test]
fn looked_up_base_files_cost_no_record_and_go_when_forgotten() {
    let src = repo();
    let cache = tempfile::tempdir().expect("tempdir");
    let fs = workspace(src.path(), cache.path());
    assert_eq!(fs.node_counts(), (1, 0), "a fresh workspace holds its root");

    // What `git status` does: every directory and every file looked up once; half of the files
    // twice (a second dentry, e.g. after an invalidation).
    let mut files = Vec::new(); // (dir ino, name, ino, lookups)
    let mut dirs = Vec::new();
    for d in 0..DIRS {
        let dname = format!("d{d}");
        let dir = fs.lookup(ROOT_INO, OsStr::new(&dname)).expect("lookup dir");
        assert_eq!(dir.ino.0, path_ino(dname.as_bytes(), 0));
        dirs.push(dir.ino.0);
        let names: Vec<String> = (0..FILES)
            .map(|f| format!("f{f:02}.txt"))
            .chain(["run.sh".into(), "link".into()])
            .collect();
        for (i, name) in names.into_iter().enumerate() {
            let a = fs.lookup(dir.ino.0, OsStr::new(&name)).expect("lookup");
            let path = format!("{dname}/{name}");
            assert_eq!(a.ino.0, path_ino(path.as_bytes(), 0), "{path}");
            let mut k = 1;
            if i % 2 == 0 {
                let again = fs.lookup(dir.ino.0, OsStr::new(&name)).expect("lookup");
                assert_eq!(again.ino, a.ino);
                assert_eq!(again.size, a.size);
                k = 2;
            }
            files.push((dir.ino.0, name, a.ino.0, k, a));
        }
    }
    let top = fs.lookup(ROOT_INO, OsStr::new("top.txt")).expect("lookup");
    let nfiles = files.len() + 1;
    let (full, light) = fs.node_counts();
    assert_eq!(
        (full, light),
        (1 + DIRS, nfiles),
        "base files the kernel refers to are light; directories (and the root) full"
    );

    // Every light file answers as a full one would, without becoming one.
    for (_, name, ino, _, a) in &files {
        let g = fs.getattr(*ino).expect("getattr");
        assert_eq!(
            (g.ino, g.size, g.kind, g.perm, g.nlink),
            (a.ino, a.size, a.kind, a.perm, a.nlink)
        );
        if name == "link" {
            assert_eq!(fs.readlink(*ino).expect("readlink"), b"f00.txt");
        }
        fs.access(*ino, 0).expect("access");
        assert_eq!(
            fs.listxattr(*ino, 0).map(|_| ()).map_err(|e| e.errno),
            Ok(())
        );
    }
    assert_eq!(
        fs.node_counts(),
        (1 + DIRS, nfiles),
        "reads register nothing"
    );

    // An open makes one full for as long as it is open, then it is light again.
    let (_, _, ino, _, _) = &files[1];
    let mut content = String::new();
    let opened = fs.open(*ino, libc::O_RDONLY).expect("open");
    assert_eq!(fs.node_counts(), (2 + DIRS, nfiles - 1));
    opened
        .file
        .take(100)
        .read_to_string(&mut content)
        .expect("read");
    assert_eq!(content, "0/1\n");
    fs.release(*ino, false);
    assert_eq!(
        fs.node_counts(),
        (1 + DIRS, nfiles),
        "light again after release"
    );

    // A change gives it a record: it stays when the kernel forgets it.
    let (_, _, changed, _, _) = files[3].clone();
    fs.setattr(
        changed,
        SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        },
    )
    .expect("chmod");
    assert_eq!(fs.getattr(changed).expect("getattr").perm, 0o600);

    // Forgets are exact: a file looked up twice stays after one forget.
    for (_, _, ino, k, _) in &files {
        if *k == 2 {
            fs.forget(*ino, 1);
            fs.getattr(*ino).expect("still referenced once");
        }
    }
    for (_, _, ino, _, _) in &files {
        fs.forget(*ino, 1);
    }
    fs.forget(top.ino.0, 1);
    for (_, _, ino, _, _) in &files {
        if *ino != changed {
            assert_eq!(
                fs.getattr(*ino).map(|_| ()).map_err(|e| e.errno),
                Err(Errno::ENOENT),
                "a forgotten base file is gone from the table"
            );
        }
    }
    // Directories go last, as the kernel forgets them (their light children pinned them).
    for d in &dirs {
        fs.forget(*d, 1);
    }
    // Left: the root, and the changed file with its directory (both have records now).
    assert_eq!(fs.node_counts(), (3, 0));
    assert_eq!(fs.getattr(changed).expect("getattr").perm, 0o600);

    // Looked up again, a file has the same number.
    let (dir, name, ino, _, _) = &files[0];
    let again = fs.lookup(*dir, OsStr::new(name)).expect("lookup again");
    assert_eq!(again.ino.0, *ino);
}

#[test]
fn a_directory_forgotten_before_its_files_stays_until_they_go() {
    let src = repo();
    let cache = tempfile::tempdir().expect("tempdir");
    let fs = workspace(src.path(), cache.path());
    let dir = fs.lookup(ROOT_INO, OsStr::new("d0")).expect("lookup").ino.0;
    let file = fs.lookup(dir, OsStr::new("f05.txt")).expect("lookup").ino.0;
    // Not what the kernel does (a dentry pins its parent), but the core must not lose the file.
    fs.forget(dir, 1);
    assert_eq!(fs.node_counts(), (2, 1));
    assert_eq!(fs.getattr(file).expect("getattr").size, 4);
    fs.unlink(dir, OsStr::new("f05.txt")).expect("unlink");
    fs.forget(file, 1);
    // The directory now has a record (its overlay hides the name).
    assert_eq!(fs.node_counts(), (2, 0));
}
