//! `octofs export`: a thread's saved state written back into its project's folder, through real
//! mounts, real git and a folder owned by an unprivileged user.
//!
//! 1. [`export_merges_the_thread_into_the_folder`]: `--dry-run` lists exactly the would-be
//!    changes and changes nothing; the export writes them (modified, deleted, new and untracked
//!    files, modes, symlinks) owned by the folder's owner, keeps the folder's own changes since
//!    the fork, its ignored files and its untracked files, never writes the thread's ignored
//!    files, and records the folder as the mirror's commit (a second dry run finds nothing).
//! 2. [`export_refusals_change_nothing`]: conflicts (every path named), a new path over a file
//!    the folder ignores, an unknown thread, a project that is not a folder, a folder that is gone.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(20);

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

fn ws<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    with_timeout(what, FS_TIMEOUT, f)
}

/// A refused command: non-zero exit, one line on stderr naming every needle.
#[track_caller]
fn assert_refused(out: &Out, needles: &[&str]) {
    out.assert_failed();
    let err = out.stderr_str();
    assert_eq!(err.trim().lines().count(), 1, "{}", out.describe());
    for n in needles {
        assert!(
            err.to_lowercase().contains(&n.to_lowercase()),
            "error does not name {n:?}: {}",
            out.describe()
        );
    }
}

fn chown_r(p: &Path, u: User) {
    run(
        std::process::Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", u.uid, u.gid))
            .arg(p),
        CMD_TIMEOUT,
    )
    .assert_ok();
}

/// A plain folder (no `.git`) with files of every kind, owned by `u`.
fn folder(d: &Daemon, name: &str, u: User) -> std::path::PathBuf {
    let f = d.base.join(name);
    write_file(&f.join("a.txt"), b"a1\na2\na3\na4\na5\n", 0o644);
    write_file(&f.join("b.txt"), b"b\n", 0o644);
    write_file(&f.join("dir/c.txt"), b"c\n", 0o644);
    write_file(&f.join("run.sh"), b"#!/bin/sh\n", 0o755);
    std::os::unix::fs::symlink("a.txt", f.join("link")).unwrap();
    write_file(&f.join(".gitignore"), b"*.log\n*.local\n", 0o644);
    write_file(&f.join("keep.log"), b"the folder's ignored file\n", 0o644);
    chown_r(&f, u);
    f
}

fn lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s.lines().map(str::to_string).collect();
    v.sort();
    v
}

#[test]
fn export_merges_the_thread_into_the_folder() {
    let d = Daemon::start();
    let owner = user_a();
    let f = folder(&d, "folder", owner);
    d.cli_ok(["mirror", "add", "p", f.to_str().unwrap()]);
    let m = d.open_thread("t", &["--project", "p"]);
    let w = m.clone();
    ws("edits in the workspace", move || {
        fs::write(w.join("a.txt"), "a1\na2\na3\na4\na5 thread\n").unwrap();
        fs::remove_file(w.join("b.txt")).unwrap();
        fs::create_dir_all(w.join("new/deep")).unwrap();
        fs::write(w.join("new/deep/d.txt"), "new\n").unwrap();
        fs::set_permissions(w.join("dir/c.txt"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("new/deep/d.txt", w.join("l2")).unwrap();
        fs::write(w.join("untracked.txt"), "never added\n").unwrap();
        fs::write(w.join("x.log"), "the thread's ignored file\n").unwrap();
    });
    // The folder changes meanwhile, without conflict: a line far from the thread's, a new file,
    // an untracked-but-ignored file.
    fs::write(f.join("a.txt"), "a1 folder\na2\na3\na4\na5\n").unwrap();
    write_file(&f.join("dir/other.txt"), b"the folder's new file\n", 0o644);
    write_file(
        &f.join("y.log"),
        b"ignored, written after the fork\n",
        0o600,
    );

    let before = tree_listing(&f);
    let dry = d.cli_ok(["export", "t", "--dry-run"]);
    assert_eq!(
        lines(&dry),
        lines("M a.txt\nD b.txt\nM dir/c.txt\nA l2\nA new/deep/d.txt\nA untracked.txt\n"),
        "dry run"
    );
    assert_same_listing("the folder after a dry run", &before, &tree_listing(&f));

    let json = parse_json("export --json", &d.cli_ok(["export", "t", "--json"]));
    assert_eq!(json["dry_run"], false);
    assert_eq!(json["changes"].as_array().map(Vec::len), Some(6), "{json}");
    let after = tree_listing(&f);
    assert_eq!(
        fs::read_to_string(f.join("a.txt")).unwrap(),
        "a1 folder\na2\na3\na4\na5 thread\n",
        "the three-way merge of a.txt"
    );
    assert!(!f.join("b.txt").exists(), "b.txt was not deleted");
    assert_eq!(fs::read(f.join("new/deep/d.txt")).unwrap(), b"new\n");
    assert_eq!(fs::read(f.join("untracked.txt")).unwrap(), b"never added\n");
    assert_eq!(
        fs::read_link(f.join("l2")).unwrap(),
        Path::new("new/deep/d.txt")
    );
    let mode = |p: &str| fs::symlink_metadata(f.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("dir/c.txt"), 0o755);
    assert_eq!(mode("new/deep/d.txt"), 0o644);
    assert!(
        !f.join("x.log").exists(),
        "the thread's ignored file was exported"
    );
    // Untouched: the folder's own change, its ignored files, the paths the merge did not change.
    for p in [
        "dir/other.txt",
        "y.log",
        "keep.log",
        "run.sh",
        "link",
        ".gitignore",
    ] {
        assert_eq!(after.get(p), before.get(p), "{p} changed");
    }
    // Everything written is the folder owner's, nothing root's.
    for p in [
        "a.txt",
        "dir/c.txt",
        "l2",
        "new",
        "new/deep",
        "new/deep/d.txt",
        "untracked.txt",
    ] {
        let md = fs::symlink_metadata(f.join(p)).unwrap();
        assert_eq!((md.uid(), md.gid()), (owner.uid, owner.gid), "owner of {p}");
    }
    // The folder is the mirror's commit now: nothing left to export, the mirror did not move.
    let head = g(&d.mirror("p"), &["rev-parse", "HEAD"]);
    assert_eq!(d.cli_ok(["export", "t", "--dry-run"]), "");
    assert_eq!(g(&d.mirror("p"), &["rev-parse", "HEAD"]), head);
    assert_eq!(
        g(&d.mirror("p"), &["show", "HEAD:a.txt"]),
        "a1 folder\na2\na3\na4\na5 thread"
    );

    // A released thread exports its last snapshot.
    let w = m.clone();
    ws("one more edit", move || {
        fs::write(w.join("dir/c.txt"), "c from the thread\n").unwrap();
    });
    d.cli_ok(["release", "t"]);
    assert_eq!(d.cli_ok(["export", "t"]), "M dir/c.txt\n");
    assert_eq!(
        fs::read(f.join("dir/c.txt")).unwrap(),
        b"c from the thread\n"
    );
}

#[test]
fn export_refusals_change_nothing() {
    let d = Daemon::start();
    let owner = user_a();
    let f = folder(&d, "folder", owner);
    d.cli_ok(["mirror", "add", "p", f.to_str().unwrap()]);
    let m = d.open_thread("t", &["--project", "p"]);
    let w = m.clone();
    ws("conflicting edits", move || {
        fs::write(w.join("a.txt"), "a1 thread\na2\na3\na4\na5\n").unwrap();
        fs::write(w.join("b.txt"), "b thread\n").unwrap();
        fs::write(w.join("fine.txt"), "no conflict here\n").unwrap();
    });
    fs::write(f.join("a.txt"), "a1 folder\na2\na3\na4\na5\n").unwrap();
    fs::write(f.join("b.txt"), "b folder\n").unwrap();
    let before = tree_listing(&f);
    for args in [vec!["export", "t"], vec!["export", "t", "--dry-run"]] {
        let out = d.cli(&args);
        assert_refused(&out, &["conflict", "a.txt", "b.txt"]);
        assert!(out.stdout.is_empty(), "{}", out.describe());
        assert_same_listing(
            "the folder after a refused export",
            &before,
            &tree_listing(&f),
        );
    }

    // A new path where the folder has a file it ignores: that file would be lost.
    let w = m.clone();
    ws("resolve, then a path the folder ignores", move || {
        fs::write(w.join("a.txt"), "a1 folder\na2\na3\na4\na5\n").unwrap();
        fs::write(w.join("b.txt"), "b folder\n").unwrap();
        fs::write(w.join(".gitignore"), "*.log\n").unwrap();
        fs::write(w.join("cfg.local"), "the thread's\n").unwrap();
    });
    write_file(&f.join("cfg.local"), b"the folder's own, ignored\n", 0o600);
    let before = tree_listing(&f);
    assert_refused(&d.cli(["export", "t"]), &["cfg.local", "does not track"]);
    assert_same_listing(
        "the folder after a refused export",
        &before,
        &tree_listing(&f),
    );

    // Unknown thread.
    assert_refused(&d.cli(["export", "nothere"]), &["nothere"]);

    // A project whose upstream is a git repository.
    let up = GitRepo::init(&d.base.join("up"));
    up.write("x.txt", "x\n");
    up.commit_all("x", DATE1);
    d.cli_ok(["mirror", "add", "g", up.path.to_str().unwrap()]);
    d.open_thread("tg", &["--project", "g"]);
    assert_refused(&d.cli(["export", "tg"]), &["not a folder"]);

    // A folder that is gone.
    let f2 = folder(&d, "gone", owner);
    d.cli_ok(["mirror", "add", "q", f2.to_str().unwrap()]);
    d.open_thread("tq", &["--project", "q"]);
    fs::rename(&f2, d.base.join("moved")).unwrap();
    assert_refused(&d.cli(["export", "tq"]), &["no longer exists"]);
    assert!(!f2.exists(), "the export re-created the folder");

    for t in ["t", "tg", "tq"] {
        d.cli_ok(["release", t]);
    }
}
