//! Snapshots built from the last snapshot's tree (only the paths changed since rebuilt) hold what
//! `git add -A` of the working state holds, through the daemon and the mount: new directories, a
//! directory renamed after a snapshot and written into, a change undone (the tree comes back
//! unchanged), deletions, an exec bit and a symlink, a nested repository (a gitlink), a
//! `.gitignore` removed (what it hid comes in although those files did not change: the full walk
//! must be taken) and a daemon restart (the core forgot the last snapshot: the full walk again).
//!
//! The reference is git itself: `git add -A` into a scratch index (outside the mount) and
//! `git write-tree`, in the workspace.
//!
//! [`every_posix_record_is_what_a_full_walk_records`]: the POSIX record of a snapshot, made from
//! the metadata the core kept since the last snapshot view and updated with what changed since
//! (directory modes, owners and xattrs, a directory with recorded nodes under it renamed, a fifo
//! and empty directories, removals), is the record a daemon that just started (a full walk)
//! makes of the same state: the same snapshot.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

/// The tree `git add -A` makes of the workspace (with an index of its own, so the workspace's is
/// untouched).
fn git_tree(ws: &Path, scratch: &Path) -> String {
    let index = scratch.join("index");
    let _ = std::fs::remove_file(&index);
    let mut add = git_command(ws, DATE1);
    add.env("GIT_INDEX_FILE", &index).args(["add", "-A"]);
    run(&mut add, CMD_TIMEOUT).assert_ok();
    let mut write = git_command(ws, DATE1);
    write.env("GIT_INDEX_FILE", &index).arg("write-tree");
    let out = run(&mut write, CMD_TIMEOUT);
    out.assert_ok();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn tree_of(mirror: &Path, commit: &str) -> String {
    let out = run(
        Command::new("git")
            .arg("-C")
            .arg(mirror)
            .args(["rev-parse", &format!("{commit}^{{tree}}")]),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn every_snapshot_is_what_git_add_all_makes() {
    let mut d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..6 {
        repo.write(&format!("f{i}.txt"), format!("base {i}\n"));
        repo.write(&format!("dir/g{i}.txt"), format!("dir {i}\n"));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    let ws = d.open_thread("t", &["--project", "p"]);
    let mirror = d.mirror("p");
    let scratch = tempfile::tempdir().unwrap();
    let snap = |d: &Daemon, what: &str| -> String {
        let s = d.snapshot_id("t");
        let got = tree_of(&mirror, &s);
        assert_eq!(
            got,
            git_tree(&ws, scratch.path()),
            "{what}: snapshot {s} holds another tree than `git add -A`"
        );
        got
    };
    let write = |p: &str, s: &str| {
        let p = ws.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, s).unwrap();
    };

    write("new/a.txt", "a\n");
    write("new/b/c.txt", "c\n");
    write("f0.txt", "changed 0\n");
    snap(&d, "new files and a change");

    std::fs::rename(ws.join("new"), ws.join("moved")).unwrap();
    write("moved/b/d.txt", "d\n");
    std::fs::rename(ws.join("dir"), ws.join("dir2")).unwrap();
    let before_undo = snap(&d, "directories renamed and written into");

    write("f1.txt", "changed 1\n");
    write("f1.txt", "base 1\n");
    write("moved/b/e.txt", "e\n");
    std::fs::remove_file(ws.join("moved/b/e.txt")).unwrap();
    assert_eq!(
        snap(&d, "changes undone"),
        before_undo,
        "changes undone since the last snapshot: the same tree"
    );

    std::fs::remove_dir_all(ws.join("moved/b")).unwrap();
    std::fs::remove_file(ws.join("f2.txt")).unwrap();
    let f3 = ws.join("f3.txt");
    let mut perm = std::fs::metadata(&f3).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&f3, perm).unwrap();
    std::os::unix::fs::symlink("f3.txt", ws.join("link")).unwrap();
    std::fs::rename(ws.join("dir2"), ws.join("dir")).unwrap();
    snap(
        &d,
        "deletions, an exec bit, a symlink, a directory moved back",
    );

    let nested = ws.join("moved/nested");
    std::fs::create_dir_all(&nested).unwrap();
    run(
        git_command(&nested, DATE1).args(["init", "-q"]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    write("moved/nested/n.txt", "n\n");
    run(git_command(&nested, DATE1).args(["add", "-A"]), CMD_TIMEOUT).assert_ok();
    run(
        git_command(&nested, DATE1).args(["commit", "-q", "-m", "n"]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    snap(&d, "a nested repository");
    write("moved/nested/n.txt", "n changed, not committed\n");
    write("moved/nested/sub/o.txt", "o\n");
    snap(&d, "inside a nested repository");

    write(".gitignore", "*.log\n");
    write("moved/x.log", "ignored\n");
    snap(&d, "an ignored file");
    std::fs::remove_file(ws.join(".gitignore")).unwrap();
    snap(&d, "the ignore file removed: what it hid comes in");

    d.stop();
    d.spawn();
    wait_mounted(std::slice::from_ref(&ws), Duration::from_secs(20));
    write("after/restart.txt", "r\n");
    write("f4.txt", "changed 4\n");
    snap(&d, "after a restart (the full walk)");
    write("f5.txt", "changed 5\n");
    snap(&d, "after a restart, from the last snapshot");
}

/// The entries of the POSIX record a snapshot names (none when it names no record).
fn record_entries(d: &Daemon, snapshot: &str) -> serde_json::Value {
    let mirror = d.mirror("p");
    let git = |args: &[&str]| {
        let out = run(git_command(&mirror, DATE1).args(args), CMD_TIMEOUT);
        out.assert_ok();
        out.stdout_str()
    };
    let msg = git(&["log", "-1", "--format=%B", snapshot]);
    match msg.lines().find_map(|l| l.strip_prefix("Octofs-Posix: ")) {
        Some(blob) => {
            let record = parse_json("the POSIX record", &git(&["cat-file", "-p", blob.trim()]));
            record["entries"].clone()
        }
        None => serde_json::json!([]),
    }
}

fn chmod(p: &Path, mode: u32) {
    let mut perm = std::fs::metadata(p).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, mode);
    std::fs::set_permissions(p, perm).unwrap();
}

#[test]
fn every_posix_record_is_what_a_full_walk_records() {
    let mut d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..4 {
        repo.write(&format!("a/b/f{i}.txt"), format!("a {i}\n"));
        repo.write(&format!("c/g{i}.txt"), format!("c {i}\n"));
        repo.write(&format!("h{i}.txt"), format!("h {i}\n"));
        repo.write(&format!("e/k{i}.txt"), format!("e {i}\n"));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    let ws = d.open_thread("t", &["--project", "p"]);
    // Copied up, nothing to record: the first snapshot (a full walk) lists none of them.
    for i in 0..4 {
        std::fs::write(ws.join(format!("h{i}.txt")), format!("h {i} changed\n")).unwrap();
    }
    d.snapshot_id("t");
    // After each change: a snapshot from what the core kept since the last snapshot view, then a
    // restart (the core forgets it), a change of content only (which no record holds: it makes the
    // daemon snapshot again, now from a full walk; an unchanged state would just return the last
    // snapshot) and that snapshot. Both records must list the same entries.
    let mut round = 0;
    let mut check = |d: &mut Daemon, what: &str| {
        let kept = d.snapshot_id("t");
        d.stop();
        d.spawn();
        wait_mounted(std::slice::from_ref(&ws), Duration::from_secs(20));
        round += 1;
        std::fs::write(ws.join("h0.txt"), format!("h 0, round {round}\n")).unwrap();
        let walked = d.snapshot_id("t");
        assert_ne!(walked, kept, "{what}: a changed file made no new snapshot");
        assert_eq!(
            record_entries(d, &walked),
            record_entries(d, &kept),
            "{what}: the record kept since the last snapshot view ({kept}) is not what a full walk \
             records of the same state ({walked})"
        );
    };

    chmod(&ws.join("a"), 0o700);
    chmod(&ws.join("a/b/f0.txt"), 0o600);
    check(&mut d, "a directory and a file chmod'ed");

    std::os::unix::fs::chown(ws.join("c"), Some(4321), Some(8765)).unwrap();
    lsetxattr(&ws.join("a/b"), "user.note", b"kept");
    check(&mut d, "a directory chown'ed, an xattr on another");

    std::fs::rename(ws.join("a"), ws.join("z")).unwrap();
    check(&mut d, "a directory with recorded nodes under it renamed");

    let fifo = run(Command::new("mkfifo").arg(ws.join("z/b/fifo")), CMD_TIMEOUT);
    fifo.assert_ok();
    std::fs::create_dir_all(ws.join("empty/deep")).unwrap();
    check(&mut d, "a fifo and empty directories");

    std::fs::remove_file(ws.join("z/b/f0.txt")).unwrap();
    std::fs::remove_dir(ws.join("empty/deep")).unwrap();
    check(
        &mut d,
        "a recorded file removed, an empty directory removed",
    );

    // A directory that has a record of its own (a name changed in it) but nothing to record, then
    // its mode: only the note of its metadata puts it in the kept list.
    std::fs::write(ws.join("e/new.txt"), "new\n").unwrap();
    check(&mut d, "a file created in a directory");
    chmod(&ws.join("e"), 0o750);
    check(&mut d, "a directory with a record of its own chmod'ed");

    chmod(&ws.join("z"), 0o755);
    std::os::unix::fs::chown(ws.join("c"), Some(0), Some(0)).unwrap();
    check(&mut d, "directories back to what the tree restores");
}
