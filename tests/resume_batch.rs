//! A fork (and a resume) applies its saved change set as one catalog batch: checked through real
//! mounts that a 1,000-path change set of every kind (modified, deleted, new and untracked files
//! in new directories, modes, symlinks, an agent commit) arrives byte-identical, and is still
//! byte-identical after the daemon is killed with SIGKILL right after the fork's answer (the
//! workspace then comes back from its catalog alone: a record the batch left out, or a batch
//! not written before the answer, shows as a missing or stale path), and after a release and a
//! resume of the fork.

use crate::common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(60);

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// Every entry of a workspace but `.git`, and HEAD's commit.
fn state(mount: &Path) -> (BTreeMap<String, String>, String, String) {
    let m = mount.to_path_buf();
    let files = with_timeout("list the workspace", FS_TIMEOUT, move || {
        tree_listing(&m)
            .into_iter()
            .filter(|(k, _)| k != ".git" && !k.starts_with(".git/"))
            .collect()
    });
    let status = g(mount, &["status", "--porcelain=v1", "-uall"]);
    (files, g(mount, &["rev-parse", "HEAD"]), status)
}

fn restart(d: &mut Daemon, mounts: &[&Path]) {
    for m in mounts {
        run(
            Command::new("umount").arg("-l").arg(m),
            Duration::from_secs(10),
        )
        .assert_ok();
    }
    d.spawn();
    let all: Vec<_> = mounts.iter().map(|m| m.to_path_buf()).collect();
    wait_mounted(&all, Duration::from_secs(20));
}

#[test]
fn a_fork_of_1000_changed_paths_is_identical_and_survives_sigkill() {
    let mut d = Daemon::start();
    let up = GitRepo::init(&d.base.join("up"));
    for i in 0..1200 {
        up.write(
            &format!("d{:02}/s{}/f{i}.txt", i / 100, i % 5),
            format!("file {i}\n"),
        );
    }
    up.write_exec("tools/run.sh", "#!/bin/sh\necho hi\n");
    up.symlink("tools/link", "run.sh");
    up.commit_all("base", DATE1);
    d.cli_ok(["mirror", "add", "p", up.path.to_str().unwrap()]);
    let src = d.open_thread("src", &["--project", "p"]);

    let w = src.clone();
    with_timeout("1,000 changes", Duration::from_secs(180), move || {
        // An agent commit first: HEAD moves, the rest stays uncommitted.
        fs::write(w.join("d00/s0/f0.txt"), "committed\n").unwrap();
        g(&w, &["commit", "-q", "-am", "agent"]);
        for i in 0..1200usize {
            let p = w.join(format!("d{:02}/s{}/f{i}.txt", i / 100, i % 5));
            match i % 12 {
                0..=5 => fs::write(&p, format!("changed {i}\n")).unwrap(),
                6 => fs::remove_file(&p).unwrap(),
                7 => fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap(),
                8 => {
                    fs::remove_file(&p).unwrap();
                    std::os::unix::fs::symlink(format!("f{}.txt", i + 1), &p).unwrap();
                }
                _ => {}
            }
        }
        // Untracked files in new directories, and a deleted directory's worth of files.
        for i in 0..150 {
            let p = w.join(format!("new/n{}/u{i}.txt", i % 7));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, format!("untracked {i}\n")).unwrap();
        }
        fs::remove_dir_all(w.join("tools")).unwrap();
    });
    let before = state(&src);
    assert_eq!(
        before.2.lines().count(),
        1200 / 12 * 9 + 150 + 2,
        "the source's change set is not what the test means to fork"
    );

    d.cli_ok_within(["fork", "src", "dst"], Duration::from_secs(60));
    // SIGKILL right after the answer: the fork must come back from what is on disk.
    d.kill9();
    let dst = d.mount("dst");
    restart(&mut d, &[&src, &dst]);
    let after = state(&dst);
    assert_eq!(after.1, before.1, "the fork's HEAD differs after SIGKILL");
    assert_same_listing("the fork after SIGKILL", &before.0, &after.0);
    assert_eq!(
        after.2, before.2,
        "the fork's git status differs after SIGKILL"
    );

    // Released and resumed: the same again (its own snapshot, applied the same way).
    d.cli_ok(["release", "dst"]);
    let dst = d.open_thread("dst", &[]);
    let resumed = state(&dst);
    assert_eq!(resumed.1, before.1, "the resumed fork's HEAD differs");
    assert_same_listing("the resumed fork", &before.0, &resumed.0);
    d.cli_ok(["release", "dst"]);
    d.cli_ok(["release", "src"]);
}

// ---------------------------------------------------------------------------------------------
// The core: a change set applied as one batch (runs of additions put in one transaction) gives
// what applying each change on its own gives, in memory and after a reload from the catalog.

/// Every entry below `ino`: path -> (kind, permission bits, size, link count, owner, content or
/// target).
type CoreListing = BTreeMap<String, (fuser::FileType, u16, u64, u32, (u32, u32), Vec<u8>)>;

fn core_walk(fs: &octofs::fs::WorkspaceFs, ino: u64, prefix: &str, out: &mut CoreListing) {
    use std::io::Read as _;
    let entries = fs.readdir(ino).expect("readdir");
    for e in entries.iter().filter(|e| e.name != "." && e.name != "..") {
        let name = e.name.to_str().expect("utf8 name");
        let path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let attr = fs.lookup(ino, &e.name).expect("lookup");
        let body = match attr.kind {
            fuser::FileType::Directory => {
                core_walk(fs, attr.ino.0, &path, out);
                Vec::new()
            }
            fuser::FileType::Symlink => fs.readlink(attr.ino.0).expect("readlink"),
            _ => {
                let mut f = fs.open(attr.ino.0, libc::O_RDONLY).expect("open").file;
                let mut v = Vec::new();
                f.read_to_end(&mut v).expect("read");
                v
            }
        };
        out.insert(
            path,
            (
                attr.kind,
                attr.perm,
                attr.size,
                attr.nlink,
                (attr.uid, attr.gid),
                body,
            ),
        );
        fs.forget(attr.ino.0, 1);
    }
}

#[test]
fn a_batched_change_set_is_what_each_change_gives_and_replays_the_same() {
    use octofs::fs::TreeChange;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().expect("tempdir");
    let r = GitRepo::init(&tmp.path().join("repo"));
    r.write("a/one.txt", "one\n");
    r.write("a/two.txt", "two\n");
    r.write("a/b/c/deep.txt", "deep\n");
    r.write_exec("run.sh", "#!/bin/sh\n");
    r.write("keep/k.txt", "k\n");
    let sub = r.commit_all("base", DATE1);
    let blob = |s: &str| {
        let f = tmp.path().join("blob");
        fs::write(&f, s).expect("write");
        let id = g(&r.path, &["hash-object", "-w", f.to_str().expect("utf8")]);
        gix::ObjectId::from_hex(id.as_bytes()).expect("id")
    };
    let file = |s: &str| TreeChange::File {
        id: blob(s),
        exec: false,
    };
    let sub = gix::ObjectId::from_hex(sub.as_bytes()).expect("commit id");
    let changes: Vec<(Vec<u8>, TreeChange)> = vec![
        (b"a/b/c/deep.txt".to_vec(), TreeChange::Remove),
        (b"a/one.txt".to_vec(), file("changed\n")),
        // The same path twice in one run: the second one wins, as when applied one by one.
        (b"a/one.txt".to_vec(), file("twice\n")),
        (b"new/x/y/z.txt".to_vec(), file("z\n")),
        (b"new/x/w.txt".to_vec(), file("w\n")),
        (
            b"a/two.txt".to_vec(),
            TreeChange::Symlink {
                id: blob("one.txt"),
            },
        ),
        // A gitlink is a directory: one more link for its parent.
        (b"new/sub".to_vec(), TreeChange::Gitlink { id: sub }),
        (
            b"run.sh".to_vec(),
            TreeChange::File {
                id: blob("#!/bin/sh\n"),
                exec: false,
            },
        ),
        // Where the removal above pruned a directory: a file now.
        (b"a/b".to_vec(), file("was a directory\n")),
        (b"keep/k.txt".to_vec(), TreeChange::Remove),
        (b"keep/k2.txt".to_vec(), file("k2\n")),
        (b"top.txt".to_vec(), file("top\n")),
    ];
    let store = Arc::new(
        octofs::git::objects::ObjectStore::open(&r.path.join(".git")).expect("open store"),
    );
    let base = store.resolve(None).expect("HEAD resolves");
    let cache = tmp.path().join("cache");
    fs::create_dir_all(&cache).expect("cache dir");
    let blobs = Arc::new(octofs::cow::blobcache::BlobCache::new(&cache).expect("cache"));
    let core = |upper: &str| {
        load_core(
            &store,
            &blobs,
            base.tree,
            base.time,
            &tmp.path().join(upper),
            &cache,
        )
    };
    let listing = |fs: &octofs::fs::WorkspaceFs| {
        let mut out = CoreListing::new();
        core_walk(fs, octofs::fs::ROOT_INO, "", &mut out);
        out
    };

    let one_by_one = core("upper-each");
    for (p, c) in &changes {
        one_by_one.apply(p, c).expect("apply one change");
    }
    let batched = core("upper-batch");
    batched.apply_all(&changes).expect("apply the change set");
    let expected = listing(&one_by_one);
    assert_eq!(expected["a/one.txt"].5, b"twice\n");
    assert_eq!(expected["new"].3, 4, "new/x and new/sub are directories");
    assert!(!expected.contains_key("a/b/c"));
    assert_eq!(listing(&batched), expected, "batched vs one by one");
    drop(batched);
    drop(one_by_one);
    // What the catalog holds is the same state (a record the batch left out, a wrong link count
    // or allocation counter shows here).
    let reloaded = core("upper-batch");
    // As many records as one by one: an inode the batch left linked nowhere (a path put twice)
    // would be one more.
    assert_eq!(
        reloaded.node_counts(),
        core("upper-each").node_counts(),
        "records after a reload, batched vs one by one"
    );
    assert_eq!(listing(&reloaded), expected, "the batch after a reload");
    // New inodes after the reload do not reuse a number the batch took.
    reloaded
        .apply(b"new/x/after.txt", &file("after\n"))
        .expect("apply after the reload");
    let mut after = listing(&reloaded);
    assert_eq!(
        after.remove("new/x/after.txt").map(|e| e.5),
        Some(b"after\n".to_vec())
    );
    assert_eq!(
        after.get("new/x/w.txt").map(|e| e.5.clone()),
        Some(b"w\n".to_vec())
    );
}
