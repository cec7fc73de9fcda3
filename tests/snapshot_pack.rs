//! A snapshot of many changes writes its objects as one pack in the mirror: real git accepts the
//! mirror (`git fsck --strict`: every object of every snapshot reachable, every pack valid), the
//! snapshot's tree is what `git add -A` makes, the packs do not pile up over many snapshots, and a
//! snapshot whose pack cannot be written fails without moving the thread's ref.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// The tree `git add -A` makes of the workspace (a scratch index, the workspace's untouched).
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
    out.stdout_str().trim().to_string()
}

fn in_mirror(mirror: &Path, args: &[&str]) -> Out {
    run(
        Command::new("git").arg("-C").arg(mirror).args(args),
        CMD_TIMEOUT,
    )
}

/// The mirror's pack directory (as git finds it).
fn pack_dir(mirror: &Path) -> PathBuf {
    let out = in_mirror(
        mirror,
        &[
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            "objects/pack",
        ],
    );
    out.assert_ok();
    PathBuf::from(out.stdout_str().trim())
}

fn packs(mirror: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(pack_dir(mirror))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "idx"))
        .collect();
    v.sort();
    v
}

fn fsck(mirror: &Path, what: &str) {
    let f = in_mirror(mirror, &["fsck", "--strict", "--no-dangling"]);
    assert!(f.success(), "{what}: git fsck: {}", f.describe());
}

/// Many snapshots of many changes: each tree is `git add -A`'s, each new pack verifies, fsck is
/// clean, every file's content reads back through git, and after 14 snapshots the mirror holds
/// a handful of packs (merged), not 14. Fails on a malformed pack or index (fsck, verify-pack),
/// on a pack renamed in under a name git does not find (the snapshot's objects missing), or on
/// merges that never happen or lose objects.
#[test]
fn snapshots_of_many_changes_are_packs_git_accepts() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for dir in 0..8 {
        for f in 0..40 {
            repo.write(&format!("d{dir}/f{f}.txt"), format!("base {dir} {f}\n"));
        }
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    let ws = d.open_thread("t", &["--project", "p"]);
    let mirror = d.mirror("p");
    let scratch = tempfile::tempdir().unwrap();
    let before = packs(&mirror).len();
    let mut snaps = Vec::new();
    for round in 0..14 {
        // Appends to 60 files (all directories), new files, a removal.
        for i in 0..60 {
            let p = ws.join(format!("d{}/f{}.txt", i % 8, (i * 7 + round) % 40));
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&p)
                .unwrap();
            std::io::Write::write_all(&mut f, format!("round {round} {i}\n").as_bytes()).unwrap();
        }
        std::fs::create_dir_all(ws.join(format!("new{round}"))).unwrap();
        for i in 0..10 {
            std::fs::write(
                ws.join(format!("new{round}/n{i}")),
                format!("{round}/{i}\n"),
            )
            .unwrap();
        }
        if round % 3 == 2 {
            std::fs::remove_file(ws.join(format!("d{}/f{}.txt", round % 8, round))).unwrap();
        }
        let packs_before = packs(&mirror);
        let s = d.snapshot_id("t");
        let tree = in_mirror(&mirror, &["rev-parse", &format!("{s}^{{tree}}")]);
        tree.assert_ok();
        assert_eq!(
            tree.stdout_str().trim(),
            git_tree(&ws, scratch.path()),
            "round {round}: the snapshot's tree is not `git add -A`'s"
        );
        let new: Vec<PathBuf> = packs(&mirror)
            .into_iter()
            .filter(|p| !packs_before.contains(p))
            .collect();
        assert!(!new.is_empty(), "round {round}: 70 changes wrote no pack");
        for p in &new {
            let v = in_mirror(&mirror, &["verify-pack", p.to_str().unwrap()]);
            assert!(
                v.success() || !p.exists(),
                "round {round}: {}",
                v.describe()
            );
        }
        let blob = in_mirror(
            &mirror,
            &["cat-file", "blob", &format!("{s}:new{round}/n3")],
        );
        blob.assert_ok();
        assert_eq!(blob.stdout_str(), format!("{round}/3\n"));
        snaps.push(s);
    }
    fsck(&mirror, "after 14 snapshots");
    // The merges run beside the snapshots: give the last one a moment.
    poll(Duration::from_secs(20), || {
        (packs(&mirror).len() <= before + 8).then_some(())
    });
    let now = packs(&mirror).len();
    assert!(
        now <= before + 8,
        "{now} packs after 14 snapshots ({before} before): they were not merged"
    );
    fsck(&mirror, "after the merges");
    for (round, s) in snaps.iter().enumerate() {
        let blob = in_mirror(
            &mirror,
            &["cat-file", "blob", &format!("{s}:new{round}/n7")],
        );
        blob.assert_ok();
        assert_eq!(blob.stdout_str(), format!("{round}/7\n"));
    }
    let ls = in_mirror(&mirror, &["ls-tree", "-r", &snaps[13]]);
    ls.assert_ok();
    assert_eq!(ls.stdout_str().lines().count(), git_ls(&ws, scratch.path()));
}

/// The number of files `git add -A` keeps in the workspace.
fn git_ls(ws: &Path, scratch: &Path) -> usize {
    let index = scratch.join("index");
    let mut ls = git_command(ws, DATE1);
    ls.env("GIT_INDEX_FILE", &index).args(["ls-files"]);
    let out = run(&mut ls, CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().lines().count()
}

/// Read-only bind mount over a directory, removed (lazily if need be) when dropped.
struct ReadOnly(PathBuf);

impl ReadOnly {
    fn over(dir: &Path) -> ReadOnly {
        let d = dir.to_str().unwrap();
        sh("mount", ["--bind", d, d]).assert_ok();
        let guard = ReadOnly(dir.to_path_buf());
        sh("mount", ["-o", "remount,bind,ro", d, d]).assert_ok();
        guard
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let d = self.0.to_str().unwrap();
        if !sh("umount", [d]).success() {
            let _ = sh("umount", ["-l", d]);
        }
    }
}

/// A snapshot whose pack cannot be written (the mirror's pack directory read-only: loose objects
/// can still be written) fails, and the thread's ref stays where it was: the objects are in
/// place before the ref moves. Fails if the ref (or the commit it names) were written before the
/// pack: the ref would then name a commit whose tree is missing (fsck fails too). The next
/// snapshot, with the directory writable again, saves everything.
#[test]
fn a_snapshot_whose_pack_cannot_be_written_leaves_the_ref() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for f in 0..100 {
        repo.write(&format!("d{}/f{f}.txt", f % 5), format!("base {f}\n"));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    let ws = d.open_thread("t", &["--project", "p"]);
    let mirror = d.mirror("p");
    let first = d.snapshot_id("t");
    let tref = "refs/octomate/threads/t";
    let at = |what: &str| {
        let r = in_mirror(&mirror, &["rev-parse", tref]);
        r.assert_ok();
        assert_eq!(r.stdout_str().trim(), first, "{what}: the ref moved");
    };
    at("the first snapshot");
    for f in 0..100 {
        std::fs::write(
            ws.join(format!("d{}/f{f}.txt", f % 5)),
            format!("changed {f}\n"),
        )
        .unwrap();
    }
    {
        let _ro = ReadOnly::over(&pack_dir(&mirror));
        let out = d.cli(["snapshot", "t"]);
        assert!(
            !out.success(),
            "the snapshot succeeded without its pack: {}",
            out.describe()
        );
        at("a failed snapshot");
        fsck(&mirror, "after the failed snapshot");
    }
    let second = d.snapshot_id("t");
    assert_ne!(second, first);
    let scratch = tempfile::tempdir().unwrap();
    let tree = in_mirror(&mirror, &["rev-parse", &format!("{second}^{{tree}}")]);
    assert_eq!(tree.stdout_str().trim(), git_tree(&ws, scratch.path()));
    fsck(&mirror, "after the second snapshot");
}
