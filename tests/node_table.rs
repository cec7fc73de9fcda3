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

use crate::common;

use common::{DATE1, GitRepo, git_command, load_core};

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

/// What one entry of the table costs: a light node is one 16-byte map slot (its number and one
/// packed word), a full node a boxed [`Node`] behind a 16-byte slot. Fails if the light slot grows
/// back to 24 bytes (an unpacked parent, index and count beside the key) or the node or record
/// types grow by a field's worth (e.g. an inline xattr map or hex oid string in every record).
#[test]
fn table_entries_stay_small() {
    let (node, light_slot, record) = WorkspaceFs::node_sizes();
    assert_eq!(
        light_slot, 16,
        "a light node is its number and one packed word"
    );
    assert!(record <= 304, "an inode record is {record} bytes");
    assert!(node <= record + 40, "a full node is {node} bytes");
}

const MANY: usize = 3500;

fn wide_repo() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = GitRepo::init(tmp.path());
    for f in 0..MANY {
        r.write(&format!("w/f{f:04}"), format!("{f}\n"));
    }
    for d in 0..3 {
        r.write(&format!("v{d}/a"), "a\n");
        r.write(&format!("v{d}/b"), "b\n");
    }
    r.commit_all("wide", DATE1);
    tmp
}

/// The table's own bytes: ~17 a light node while the kernel refers to 3,500 base files of one
/// directory, and back to a small fixed size once it forgot them. Fails if the light map kept
/// 24-byte slots (25.6 bytes a node here), or kept its capacity (or its parents' slots) after the
/// forgets.
#[test]
fn the_light_table_costs_a_packed_slot_and_shrinks_after_forgets() {
    let src = wide_repo();
    let cache = tempfile::tempdir().expect("tempdir");
    let fs = workspace(src.path(), cache.path());
    let empty = fs.node_table_bytes();
    let w = fs.lookup(ROOT_INO, OsStr::new("w")).expect("lookup").ino.0;
    let mut inos = Vec::new();
    for f in 0..MANY {
        let name = format!("f{f:04}");
        let a = fs.lookup(w, OsStr::new(&name)).expect("lookup");
        assert_eq!(a.ino.0, path_ino(format!("w/{name}").as_bytes(), 0));
        inos.push(a.ino.0);
    }
    assert_eq!(fs.node_counts(), (2, MANY));
    let bytes = fs.node_table_bytes() - empty;
    assert!(
        bytes <= MANY * 20,
        "{bytes} bytes for {MANY} light nodes ({} a node)",
        bytes / MANY
    );
    for (f, ino) in inos.iter().enumerate() {
        assert_eq!(
            fs.getattr(*ino).expect("getattr").size,
            format!("{f}\n").len() as u64
        );
    }
    for ino in &inos {
        fs.forget(*ino, 1);
    }
    fs.forget(w, 1);
    assert_eq!(fs.node_counts(), (1, 0));
    // The maps shrink by halves down to ~1,000 slots (17 KiB): not the 3,584 slots (61 KiB)
    // the 3,500 nodes took.
    let after = fs.node_table_bytes();
    assert!(
        after <= empty + 20_000,
        "{after} bytes left after the forgets ({empty} for the fresh table)"
    );
}

/// A light node counts up to 65,535 kernel references in its packed word; the next one makes it
/// full, and forgets stay exact across the change. Parent slots are reused after a directory's
/// light nodes went, and every light node keeps naming its own parent. Fails if a count overflowed
/// into the index bits (the file would answer as another entry), or a freed slot still named the
/// old directory.
#[test]
fn packed_counts_and_parent_slots_stay_exact() {
    let src = wide_repo();
    let cache = tempfile::tempdir().expect("tempdir");
    let fs = workspace(src.path(), cache.path());
    let w = fs.lookup(ROOT_INO, OsStr::new("w")).expect("lookup").ino.0;
    let name = OsStr::new("f0007");
    let first = fs.lookup(w, name).expect("lookup");
    for _ in 1..65_535 {
        fs.lookup(w, name).expect("lookup");
    }
    assert_eq!(fs.node_counts(), (2, 1), "65,535 references: still light");
    let a = fs.lookup(w, name).expect("lookup");
    assert_eq!((a.ino, a.size), (first.ino, 2));
    assert_eq!(fs.node_counts(), (3, 0), "65,536: full");
    fs.forget(a.ino.0, 65_535);
    assert_eq!(fs.getattr(a.ino.0).expect("one reference left").size, 2);
    fs.forget(a.ino.0, 1);
    assert_eq!(
        fs.getattr(a.ino.0).map(|_| ()).map_err(|e| e.errno),
        Err(Errno::ENOENT)
    );

    // Light nodes in three directories; the first directory's go, a fourth takes its slot.
    let mut dirs = Vec::new();
    for d in 0..3 {
        let v = fs
            .lookup(ROOT_INO, OsStr::new(&format!("v{d}")))
            .expect("lookup")
            .ino
            .0;
        let a = fs.lookup(v, OsStr::new("a")).expect("lookup").ino.0;
        let b = fs.lookup(v, OsStr::new("b")).expect("lookup").ino.0;
        dirs.push((d, v, a, b));
    }
    let (_, v0, a0, b0) = dirs[0];
    fs.forget(a0, 1);
    fs.forget(b0, 1);
    fs.forget(v0, 1);
    let x = fs.lookup(w, OsStr::new("f1999")).expect("lookup").ino.0;
    assert_eq!(fs.getattr(x).expect("getattr").size, 5);
    assert_eq!(x, path_ino(b"w/f1999", 0));
    for &(d, v, a, b) in &dirs[1..] {
        assert_eq!(fs.getattr(a).expect("getattr").size, 2);
        assert_eq!(fs.lookup(v, OsStr::new("a")).expect("lookup").ino.0, a);
        assert_eq!(a, path_ino(format!("v{d}/a").as_bytes(), 0));
        // Unlinking through the light node's parent finds it (its parent is the right one).
        fs.unlink(v, OsStr::new("b")).expect("unlink");
        assert_eq!(
            fs.lookup(v, OsStr::new("b"))
                .map(|_| ())
                .map_err(|e| e.errno),
            Err(Errno::ENOENT)
        );
        fs.forget(b, 1);
    }
}

/// Directories with the same one-file tree under a root of `n` entries: every directory looked up
/// is a full node (a boxed node, its name, path and oid on the heap). Built with `git mktree`, so
/// that 24,000 directories take one tree object each level.
fn many_dirs_repo(n: usize) -> tempfile::TempDir {
    use std::io::Write;
    use std::process::Stdio;
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = GitRepo::init(tmp.path());
    r.write("x/f", "f\n");
    r.commit_all("one", DATE1);
    let sub = r.git(["rev-parse", "HEAD:x"]).trim().to_string();
    let list: String = (0..n)
        .map(|i| format!("040000 tree {sub}\td{i:05}\n"))
        .collect();
    let mut mktree = git_command(tmp.path(), DATE1)
        .arg("mktree")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git mktree");
    mktree
        .stdin
        .take()
        .expect("stdin")
        .write_all(list.as_bytes())
        .expect("write to git mktree");
    let out = mktree.wait_with_output().expect("git mktree");
    assert!(out.status.success(), "git mktree failed");
    let tree = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let commit = r.git_at(DATE1, ["commit-tree", &tree, "-m", "many"]);
    r.git(["update-ref", "HEAD", commit.trim()]);
    tmp
}

/// The process's anonymous resident memory (RssAnon), in bytes.
fn rss_anon() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .expect("RssAnon in /proc/self/status")
        * 1024
}

const CHILD_TEST: &str = "node_table::forgotten_nodes_in_a_process_of_their_own";

/// Memory of nodes the kernel forgot goes back to the system, not only to the allocator: run in a
/// process of its own (this test binary, filtered to [`CHILD_TEST`]), where the resident memory is
/// the table's alone. Fails if the daemon left freed nodes in glibc's arenas (without a trim, the
/// ~10 MiB of 24,000 forgotten directory nodes stay resident: they lie between blocks still in
/// use, which glibc's `free` never returns), or trimmed nothing after a burst of forgets.
#[cfg(target_env = "gnu")]
#[test]
fn forgotten_nodes_go_back_to_the_system() {
    let exe = std::env::current_exe().expect("the test binary");
    let out = common::run(
        std::process::Command::new(exe).args([
            "--exact",
            CHILD_TEST,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]),
        std::time::Duration::from_secs(300),
    );
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stdout_str().contains("1 passed"),
        "the child ran no test: {}",
        out.describe()
    );
}

/// The body of [`forgotten_nodes_go_back_to_the_system`], in its child process. Small blocks kept
/// alive between the lookups stand for what other workspaces and requests allocate meanwhile (in
/// the daemon, freed nodes are never only at the top of a heap).
#[cfg(target_env = "gnu")]
#[test]
#[ignore = "run alone, in a child process, by forgotten_nodes_go_back_to_the_system"]
fn forgotten_nodes_in_a_process_of_their_own() {
    const N: usize = 24_000;
    let src = many_dirs_repo(N);
    let cache = tempfile::tempdir().expect("tempdir");
    let fs = workspace(src.path(), cache.path());
    fs.lookup(ROOT_INO, OsStr::new("d00000")).expect("warm up");
    let before = rss_anon();
    let mut dirs = Vec::with_capacity(N);
    let mut pins = Vec::new();
    for i in 0..N {
        let a = fs
            .lookup(ROOT_INO, OsStr::new(&format!("d{i:05}")))
            .expect("lookup");
        dirs.push(a.ino.0);
        if i % 128 == 0 {
            pins.push(Box::new([i as u8; 64]));
        }
    }
    assert_eq!(fs.node_counts(), (1 + N, 0), "every directory a full node");
    let grown = rss_anon().saturating_sub(before);
    assert!(
        grown >= 4 << 20,
        "{grown} bytes for {N} directory nodes: too few to measure"
    );
    let trims = WorkspaceFs::allocator_trims();
    fs.forget(dirs[0], 2);
    for d in &dirs[1..] {
        fs.forget(*d, 1);
    }
    assert_eq!(fs.node_counts(), (1, 0));
    // Right after the forgets (the trim waits for them to pause): what `free` alone gave back.
    let freed_alone = grown.saturating_sub(rss_anon().saturating_sub(before));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut kept = rss_anon().saturating_sub(before);
    while kept > grown / 4 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        kept = rss_anon().saturating_sub(before);
    }
    assert!(
        kept <= grown / 4,
        "{kept} of the {grown} bytes {N} directory nodes took still resident 30 s after the \
         kernel forgot them ({} allocator trims)",
        WorkspaceFs::allocator_trims() - trims
    );
    assert!(WorkspaceFs::allocator_trims() > trims);
    eprintln!(
        "{N} directory nodes: {grown} bytes resident; free() alone gave back {freed_alone}, \
         {kept} still resident after the trim"
    );
    std::hint::black_box(&pins);
}
