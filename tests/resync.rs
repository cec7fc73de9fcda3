//! `octofs resync <thread> --role developer|reviewer` (seed 002 "re-sync, role-aware"), through
//! real mounts with real git:
//!
//! 1. [`developer_fast_forwards_a_clean_workspace`]: after a mirror sync, a clean workspace moves
//!    to the upstream tip (files, HEAD, branch, index, origin refs); `git status` is clean and
//!    reads no file content; a process that had looked at the changed paths sees the new ones;
//!    unchanged paths keep their inode numbers; the next snapshot has the tip as first parent and
//!    the previous snapshot as second; a second resync is "up to date".
//! 2. [`developer_refuses_dirty_ahead_and_diverged`]: a modified file, an untracked file, an own
//!    commit (ahead), an own commit after the upstream moved (diverged): refused with the reason,
//!    nothing changed; ignored files do not make a workspace dirty.
//! 3. [`reviewer_saves_then_resets`]: a diverged, dirty reviewer workspace is saved as a snapshot
//!    and reset to the tip: tracked files, index and HEAD at the tip, untracked files gone (and
//!    in the snapshot), ignored files kept.
//!    [`reviewer_reset_keeps_an_untracked_nested_repository`]: an untracked nested repository
//!    (`sub/.git`) is left in place, its history and uncommitted files whole.
//! 4. [`resync_refusals_change_nothing`]: unknown thread, another user's thread, a chat thread,
//!    a released thread, an unknown role.
//! 5. [`fast_forward_of_1000_paths_in_10k_files`]: the figure (printed) of a developer
//!    fast-forward of 1,000 changed paths in a 10,000-file workspace, and `git status` after it
//!    reads no content.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

fn git_out(dir: &Path, args: &[&str]) -> Out {
    // (A workspace of another user is read as root here.)
    run(
        git_command(dir, DATE2)
            .args(["-c", "safe.directory=*"])
            .args(args),
        CMD_TIMEOUT,
    )
}

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = git_out(dir, args);
    assert!(
        out.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        out.describe()
    );
    out.stdout_str().trim().to_string()
}

#[track_caller]
fn status(d: &Daemon, thread: &str) -> serde_json::Value {
    parse_json("status --json", &d.cli_ok(["status", thread, "--json"]))
}

fn base_content_opens(d: &Daemon, thread: &str) -> u64 {
    status(d, thread)["base_content_opens"]
        .as_u64()
        .expect("base_content_opens")
}

/// `octofs resync <thread> --role <role> --json`: the answer, and whether the command succeeded.
#[track_caller]
fn resync(d: &Daemon, thread: &str, role: &str) -> (serde_json::Value, Out) {
    let out = d.cli(["resync", thread, "--role", role, "--json"]);
    assert!(!out.stdout.is_empty(), "no answer: {}", out.describe());
    let v = parse_json("resync --json", out.stdout_str().trim());
    (v, out)
}

/// A refused command: non-zero exit, one line on stderr naming every needle.
#[track_caller]
fn assert_one_line_error(out: &Out, needles: &[&str]) {
    out.assert_failed();
    let err = out.stderr_str();
    let err = err.trim();
    assert_eq!(
        err.lines().count(),
        1,
        "expected one line: {}",
        out.describe()
    );
    for n in needles {
        assert!(
            err.to_lowercase().contains(&n.to_lowercase()),
            "error does not mention {n:?}: {}",
            out.describe()
        );
    }
}

/// Everything under `dir` except `.git`: path -> content (files), "-> target" (symlinks).
fn files(dir: &Path) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, String>) {
        let mut entries: Vec<_> = fs::read_dir(dir).expect("read_dir").flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            if rel == ".git" {
                continue;
            }
            let m = fs::symlink_metadata(&p).expect("lstat");
            if m.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&p).unwrap().display()));
            } else if m.is_dir() {
                walk(root, &p, out);
            } else {
                let exec = if m.mode() & 0o111 != 0 { " (exec)" } else { "" };
                out.insert(
                    rel,
                    format!("{}{exec}", String::from_utf8_lossy(&fs::read(&p).unwrap())),
                );
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// An upstream with a first commit, added as project `proj`.
fn project(d: &Daemon) -> GitRepo {
    project_with(d, None)
}

/// [`project`], with a `.gitignore` of `ignore` in its first commit when given.
fn project_with(d: &Daemon, ignore: Option<&str>) -> GitRepo {
    let up = GitRepo::init(&d.base.join("upstream"));
    if let Some(rules) = ignore {
        up.write(".gitignore", rules);
    }
    up.write("keep.txt", "kept\n");
    up.write("src/changed.txt", "old\n");
    up.write("gone.txt", "to be removed\n");
    up.write("src/lib/deep.txt", "deep\n");
    up.write("tool.sh", "#!/bin/sh\n");
    up.symlink("link", "keep.txt");
    up.commit_all("first", DATE1);
    d.cli_ok(["mirror", "add", "proj", &up.path.to_string_lossy()]);
    up
}

/// The upstream's second commit: a change, an addition in a new directory, a removal (its
/// directory emptied), a mode change and a symlink retargeted.
fn advance(up: &GitRepo) -> String {
    up.write("src/changed.txt", "new content\n");
    up.write("added/new.txt", "brand new\n");
    up.remove("gone.txt");
    up.remove("src/lib/deep.txt");
    up.chmod("tool.sh", 0o755);
    up.symlink("link", "src/changed.txt");
    up.commit_all("second", DATE2)
}

#[test]
fn developer_fast_forwards_a_clean_workspace() {
    let d = Daemon::start();
    let up = project(&d);
    let first = up.head();
    let ws = d.open_thread("dev", &["--project", "proj"]);
    let before = d.snapshot_id("dev");
    let keep_ino = fs::metadata(ws.join("keep.txt")).unwrap().ino();
    // The kernel caches what a running process saw: an old content, a missing name, a listing.
    assert_eq!(
        fs::read_to_string(ws.join("src/changed.txt")).unwrap(),
        "old\n"
    );
    assert!(fs::metadata(ws.join("added/new.txt")).is_err());
    assert!(fs::metadata(ws.join("src/lib")).is_ok());
    let second = advance(&up);
    d.cli_ok(["mirror", "sync", "proj"]);
    // A sync changes no live workspace.
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), first);
    assert_eq!(
        fs::read_to_string(ws.join("src/changed.txt")).unwrap(),
        "old\n"
    );

    let (v, out) = resync(&d, "dev", "developer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "fast-forward", "{v}");
    assert_eq!(v["role"], "developer");
    assert_eq!(v["thread"], "dev");
    assert_eq!(v["from"], first.as_str());
    assert_eq!(v["to"], second.as_str());
    // changed, added, gone, deep, tool.sh (mode), link.
    assert_eq!(v["changed_paths"], 6, "{v}");
    assert!(v.get("snapshot").is_none(), "{v}");

    // Files, HEAD, branch and origin refs at the tip.
    let expected = tempfile_checkout(&d, &up, &second);
    assert_eq!(files(&ws), files(&expected));
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second);
    assert_eq!(g(&ws, &["symbolic-ref", "HEAD"]), "refs/heads/octofs/dev");
    assert_eq!(g(&ws, &["rev-parse", "origin/main"]), second);
    assert!(!ws.join("src/lib").exists(), "an emptied directory stays");
    assert_eq!(
        fs::metadata(ws.join("keep.txt")).unwrap().ino(),
        keep_ino,
        "an unchanged path changed its inode"
    );
    // The index matches the tip with the stat data the mount presents: status is clean and reads
    // no file content (no path is re-hashed).
    let opens = base_content_opens(&d, "dev");
    assert_eq!(
        g(&ws, &["status", "--porcelain=v1", "--untracked-files=all"]),
        ""
    );
    assert_eq!(
        base_content_opens(&d, "dev"),
        opens,
        "git status after the fast-forward read file content (re-hashed)"
    );
    assert_eq!(g(&ws, &["diff", "--cached", "--name-only", "HEAD"]), "");

    // The next snapshot: the tip first, the previous snapshot second.
    fs::write(ws.join("after.txt"), "work after the resync\n").unwrap();
    let snap = d.snapshot_id("dev");
    let parents = g(&d.mirror("proj"), &["rev-list", "--parents", "-n1", &snap]);
    assert_eq!(parents, format!("{snap} {second} {before}"));
    fs::remove_file(ws.join("after.txt")).unwrap();

    // Again: nothing to do.
    let (v, out) = resync(&d, "dev", "developer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "up-to-date", "{v}");
    let plain = d.cli_ok(["resync", "dev", "--role", "developer"]);
    assert!(plain.contains("up to date"), "{plain}");

    // Release and resume keep the state at the tip.
    d.cli_ok(["release", "dev"]);
    let ws = d.open_thread("dev", &[]);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second);
    assert_eq!(files(&ws), files(&expected));
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    d.cli_ok(["release", "dev"]);
}

/// The upstream's tree at `rev`, extracted under the test's base directory.
fn tempfile_checkout(d: &Daemon, up: &GitRepo, rev: &str) -> std::path::PathBuf {
    let dest = d.base.join(format!("expected-{rev}"));
    extract_archive(&up.path, rev, &dest);
    dest
}

#[test]
fn developer_refuses_dirty_ahead_and_diverged() {
    let d = Daemon::start();
    let up = project(&d);
    let first = up.head();
    let ws = d.open_thread("t", &["--project", "proj"]);
    let t3 = d.open_thread("t3", &["--project", "proj"]);
    let second = advance(&up);
    d.cli_ok(["mirror", "sync", "proj"]);

    let unchanged = |ws: &Path, head: &str| {
        assert_eq!(g(ws, &["rev-parse", "HEAD"]), head, "HEAD moved");
        assert_eq!(
            fs::read_to_string(ws.join("src/changed.txt")).unwrap(),
            "old\n",
            "a refused resync changed a file"
        );
        assert!(ws.join("gone.txt").exists());
        assert_eq!(
            status(&d, "t")["base_commit"],
            first.as_str(),
            "the base moved"
        );
    };

    // A modified tracked file.
    fs::write(ws.join("keep.txt"), "mine\n").unwrap();
    let (v, out) = resync(&d, "t", "developer");
    assert_one_line_error(&out, &["dirty", "1 changed path", "keep.txt"]);
    assert_eq!(v["action"], "refused", "{v}");
    assert_eq!(v["from"], first.as_str());
    assert!(v["reason"].as_str().unwrap().starts_with("dirty:"), "{v}");
    unchanged(&ws, &first);
    let plain = d.cli(["resync", "t", "--role", "developer"]);
    assert_one_line_error(&plain, &["dirty"]);
    assert!(plain.stdout.is_empty(), "{}", plain.describe());
    fs::write(ws.join("keep.txt"), "kept\n").unwrap();

    // Untracked files: three and more are named with an ellipsis.
    for n in ["u1", "u2", "u3", "u4"] {
        fs::write(ws.join(n), "x").unwrap();
    }
    let (_, out) = resync(&d, "t", "developer");
    assert_one_line_error(&out, &["dirty: 4 changed paths (u1, u2, u3…)"]);
    unchanged(&ws, &first);
    for n in ["u1", "u2", "u3", "u4"] {
        fs::remove_file(ws.join(n)).unwrap();
    }
    // A staged change whose file was put back.
    fs::write(ws.join("keep.txt"), "staged\n").unwrap();
    g(&ws, &["add", "keep.txt"]);
    fs::write(ws.join("keep.txt"), "kept\n").unwrap();
    let (_, out) = resync(&d, "t", "developer");
    assert_one_line_error(&out, &["dirty", "staged"]);
    g(&ws, &["reset", "-q"]);

    // An own commit on top of the old tip: diverged from the new one.
    fs::write(ws.join("mine.txt"), "mine\n").unwrap();
    g(&ws, &["add", "mine.txt"]);
    g(&ws, &["commit", "-q", "-m", "mine"]);
    let mine = g(&ws, &["rev-parse", "HEAD"]);
    let (v, out) = resync(&d, "t", "developer");
    assert_one_line_error(&out, &["diverged from origin/main", "1 commit"]);
    assert_eq!(v["to"], second.as_str());
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), mine);
    assert_eq!(
        fs::read_to_string(ws.join("src/changed.txt")).unwrap(),
        "old\n"
    );
    // A refusal never moves the base.
    assert!(v.get("base_moved").is_none(), "{v}");
    assert_eq!(status(&d, "t")["base_commit"], first.as_str());

    // Ahead only: the own commit on top of the tip the mirror has.
    let t2 = d.open_thread("t2", &["--project", "proj"]);
    for i in 0..2 {
        fs::write(t2.join(format!("m{i}")), "m").unwrap();
        g(&t2, &["add", "-A"]);
        g(&t2, &["commit", "-q", "-m", "m"]);
    }
    let (v, out) = resync(&d, "t2", "developer");
    assert_one_line_error(&out, &["ahead of origin/main by 2 commits"]);
    assert_eq!(v["action"], "refused");
    assert!(v.get("base_moved").is_none(), "{v}");
    assert_eq!(status(&d, "t2")["base_commit"], second.as_str());

    // Ignored files alone do not make a workspace dirty, and stay.
    fs::write(t3.join(".git/info/exclude"), "*.log\n").unwrap();
    fs::write(t3.join("build.log"), "log\n").unwrap();
    let (v, out) = resync(&d, "t3", "developer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "fast-forward", "{v}");
    assert_eq!(fs::read_to_string(t3.join("build.log")).unwrap(), "log\n");
    assert_eq!(g(&t3, &["rev-parse", "HEAD"]), second);
    assert_eq!(v["base_moved"], true, "{v}");
    assert_eq!(status(&d, "t3")["base_commit"], second.as_str());
    // Opened at a commit: no upstream branch to follow.
    d.open_thread("t4", &["--project", "proj", "--ref", &first]);
    let out = d.cli(["resync", "t4", "--role", "developer", "--json"]);
    assert_one_line_error(&out, &["no upstream branch"]);
    for t in ["t", "t2", "t3", "t4"] {
        d.cli_ok(["release", t]);
    }
}

#[test]
fn reviewer_saves_then_resets() {
    let d = Daemon::start();
    let up = project(&d);
    let ws = d.open_thread("rev", &["--project", "proj"]);
    // A stale local commit, a tracked change, an untracked file and an ignored one.
    fs::write(ws.join("keep.txt"), "reviewer's note\n").unwrap();
    g(&ws, &["commit", "-q", "-am", "round 1"]);
    let local = g(&ws, &["rev-parse", "HEAD"]);
    fs::write(ws.join("src/changed.txt"), "reviewer edit\n").unwrap();
    fs::write(ws.join("notes.md"), "untracked\n").unwrap();
    fs::write(ws.join(".git/info/exclude"), "*.log\n").unwrap();
    fs::write(ws.join("run.log"), "ignored\n").unwrap();
    let second = advance(&up);
    d.cli_ok(["mirror", "sync", "proj"]);

    let (v, out) = resync(&d, "rev", "reviewer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "reset", "{v}");
    assert_eq!(v["from"], local.as_str());
    assert_eq!(v["to"], second.as_str());
    let snap = v["snapshot"].as_str().expect("snapshot id").to_string();

    // The tip, exactly, plus the ignored file.
    let expected = tempfile_checkout(&d, &up, &second);
    let mut want = files(&expected);
    want.insert("run.log".into(), "ignored\n".into());
    assert_eq!(files(&ws), want);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second);
    assert_eq!(g(&ws, &["rev-parse", "octofs/rev"]), second);
    let opens = base_content_opens(&d, "rev");
    assert_eq!(
        g(&ws, &["status", "--porcelain", "--untracked-files=all"]),
        ""
    );
    assert_eq!(base_content_opens(&d, "rev"), opens, "status re-hashed");

    // Nothing lost: the snapshot holds the state before the reset.
    let m = d.mirror("proj");
    assert_eq!(g(&m, &["rev-parse", &format!("{snap}^1")]), local);
    assert_eq!(g(&m, &["show", &format!("{snap}:notes.md")]), "untracked");
    assert_eq!(
        g(&m, &["show", &format!("{snap}:src/changed.txt")]),
        "reviewer edit"
    );
    assert!(
        !git_out(&m, &["cat-file", "-e", &format!("{snap}:run.log")]).success(),
        "an ignored file was saved"
    );

    // A snapshot after the reset: the tip first, the saved state second.
    fs::write(ws.join("review.md"), "lgtm\n").unwrap();
    let next = d.snapshot_id("rev");
    assert_eq!(
        g(&m, &["rev-list", "--parents", "-n1", &next]),
        format!("{next} {second} {snap}")
    );
    // A reviewer at the tip with nothing changed: up to date, nothing saved.
    fs::remove_file(ws.join("review.md")).unwrap();
    let (v, out) = resync(&d, "rev", "reviewer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "up-to-date", "{v}");
    assert!(v.get("snapshot").is_none());
    let plain = d.cli_ok(["resync", "rev", "--role", "reviewer"]);
    assert!(plain.contains("up to date"), "{plain}");
    d.cli_ok(["release", "rev"]);
}

/// A reviewer reset of a workspace holding an untracked nested repository (`sub/.git`, with its
/// own commit and an uncommitted file): the nested repository is left in place, whole. The
/// snapshot taken first cannot hold it (git records a nested repository as a gitlink, a commit id
/// whose objects are only in `sub/.git`), so removing it as an untracked path would lose its
/// history; git's own `reset --hard` and `clean -fd` leave it alone too.
#[test]
fn reviewer_reset_keeps_an_untracked_nested_repository() {
    let d = Daemon::start();
    let up = project(&d);
    let ws = d.open_thread("nest", &["--project", "proj"]);
    let sub = ws.join("sub");
    fs::create_dir(&sub).unwrap();
    g(&sub, &["init", "-q", "-b", "main"]);
    fs::write(sub.join("inner.txt"), "inner\n").unwrap();
    g(&sub, &["add", "inner.txt"]);
    g(&sub, &["commit", "-q", "-m", "inner work"]);
    let inner = g(&sub, &["rev-parse", "HEAD"]);
    fs::write(sub.join("wip.txt"), "uncommitted\n").unwrap();
    fs::write(ws.join("src/changed.txt"), "reviewer edit\n").unwrap();
    let second = advance(&up);
    d.cli_ok(["mirror", "sync", "proj"]);

    let (v, out) = resync(&d, "nest", "reviewer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "reset", "{v}");
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second);
    // The nested repository, its history and its uncommitted file, as they were.
    assert_eq!(g(&sub, &["rev-parse", "HEAD"]), inner);
    assert_eq!(g(&sub, &["log", "--format=%s"]), "inner work");
    assert_eq!(
        fs::read_to_string(sub.join("inner.txt")).unwrap(),
        "inner\n"
    );
    assert_eq!(
        fs::read_to_string(sub.join("wip.txt")).unwrap(),
        "uncommitted\n"
    );
    assert_eq!(
        g(&sub, &["status", "--porcelain"]),
        "?? wip.txt",
        "the nested repository's own state"
    );
    // Everything else is the tip.
    let expected = tempfile_checkout(&d, &up, &second);
    let mut got = files(&ws);
    got.retain(|p, _| !p.starts_with("sub/"));
    assert_eq!(got, files(&expected));
    assert_eq!(
        g(&ws, &["status", "--porcelain", "--untracked-files=normal"]),
        "?? sub/"
    );
    d.cli_ok(["release", "nest"]);
}

#[test]
fn resync_refusals_change_nothing() {
    let d = Daemon::start();
    let up = project(&d);
    let _ = up;
    let out = d.cli(["resync", "nobody", "--role", "developer"]);
    assert_one_line_error(&out, &["unknown thread"]);
    let out = d.cli(["resync", "x", "--role", "boss"]);
    out.assert_failed();
    let out = d.cli(["resync", "../x", "--role", "developer"]);
    out.assert_failed();

    // Another user's thread.
    let a = user_a();
    let b = user_b();
    let cli_as = |u: User, args: &[&str]| {
        let mut c = as_user(u, bin());
        c.arg("--state")
            .arg(&d.state)
            .arg("--root")
            .arg(&d.root)
            .args(args);
        run(&mut c, CMD_TIMEOUT)
    };
    cli_as(a, &["open", "owned", "--project", "proj"]).assert_ok();
    let ws = d.mount("owned");
    let head = g(&ws, &["rev-parse", "HEAD"]);
    advance(&up);
    d.cli_ok(["mirror", "sync", "proj"]);
    let out = cli_as(b, &["resync", "owned", "--role", "reviewer"]);
    assert_one_line_error(&out, &["permission denied"]);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), head);
    // Its owner may.
    let out = cli_as(a, &["resync", "owned", "--role", "developer"]);
    assert!(out.success(), "{}", out.describe());
    assert!(
        out.stdout_str().contains("fast-forward"),
        "{}",
        out.describe()
    );
    d.cli_ok(["release", "owned"]);

    // A chat thread.
    d.open_thread("chat", &[]);
    let out = d.cli(["resync", "chat", "--role", "developer"]);
    assert_one_line_error(&out, &["chat"]);
    d.cli_ok(["release", "chat"]);

    // A released thread.
    d.open_thread("gone", &["--project", "proj"]);
    d.cli_ok(["release", "gone"]);
    let out = d.cli(["resync", "gone", "--role", "reviewer"]);
    assert_one_line_error(&out, &["released"]);
    let st = status(&d, "gone");
    assert_eq!(st["state"], "released", "{st}");
}

#[test]
fn fast_forward_of_1000_paths_in_10k_files() {
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    let total = 10_000;
    for i in 0..total {
        up.write(
            &format!("d{}/s{}/f{i}.txt", i % 50, i % 7),
            format!("file {i}\n"),
        );
    }
    // (No automatic gc: one running in the background races the mirror's clone.)
    up.git(["config", "gc.auto", "0"]);
    up.commit_all("big", DATE1);
    d.cli_ok(["mirror", "add", "proj", &up.path.to_string_lossy()]);
    let ws = d.open_thread("big", &["--project", "proj"]);
    // A first status, as an agent's session would have run.
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    // 1,000 changed paths: 800 changed, 100 added, 100 removed.
    for i in 0..800 {
        up.write(
            &format!("d{}/s{}/f{i}.txt", i % 50, i % 7),
            format!("changed {i}\n"),
        );
    }
    for i in 0..100 {
        up.write(&format!("new/n{i}.txt"), format!("new {i}\n"));
    }
    for i in 800..900 {
        up.remove(&format!("d{}/s{}/f{i}.txt", i % 50, i % 7));
    }
    let tip = up.commit_all("1000 paths", DATE2);
    d.cli_ok(["mirror", "sync", "proj"]);

    let t = Instant::now();
    let (v, out) = resync(&d, "big", "developer");
    let took = t.elapsed();
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "fast-forward", "{v}");
    assert_eq!(v["changed_paths"], 1000, "{v}");
    println!(
        "resync --role developer: 1,000 changed paths in a {total}-file workspace: {} ms (CLI round trip)",
        took.as_millis()
    );
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), tip);
    let opens = base_content_opens(&d, "big");
    let t = Instant::now();
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    println!("first git status after it: {} ms", t.elapsed().as_millis());
    assert_eq!(base_content_opens(&d, "big"), opens, "status re-hashed");
    assert_eq!(
        fs::read_to_string(ws.join("d0/s0/f0.txt")).unwrap(),
        "changed 0\n"
    );
    assert!(!ws.join("d0/s3/f850.txt").exists());
    // The base moved to the tip: nothing counts as changed.
    assert_eq!(v["base_moved"], true, "{v}");
    let st = status(&d, "big");
    assert_eq!(st["base_commit"], tip.as_str(), "{st}");
    assert_eq!(st["changed_paths"], 0, "{st}");
    d.cli_ok(["release", "big"]);
}

/// An upstream with ignored paths (`.env`, `node_modules/`) and the files of [`project`].
fn ignoring_project(d: &Daemon) -> GitRepo {
    project_with(d, Some(".env\nnode_modules/\n"))
}

/// [`advance`], plus a new file in `src/`.
fn advance_src(up: &GitRepo) -> String {
    up.write("src/new.txt", "at the tip\n");
    advance(up)
}

/// `path` -> content of every file under `dir` but `.git` and the ignored `.env` and
/// `node_modules`.
fn tracked_files(dir: &Path) -> std::collections::BTreeMap<String, String> {
    let mut f = files(dir);
    f.retain(|k, _| k != ".env" && !k.starts_with("node_modules"));
    f
}

/// A developer fast-forward of a clean workspace moves its base: afterwards the record's base is
/// the tip and `status` counts nothing the fast-forward wrote (only what it counted before: the
/// ignored files and a file `git stash` rewrote), `git status` is clean and reads no content,
/// ignored files and the workspace's `.git` state (config, stash) are as before, a file held open
/// across it is still read (and the ignored one written), a process whose cwd is in a changed
/// directory sees the new file, and release + resume keeps the moved base and the tip's files (a
/// resumed workspace's `.git` is a new one: its stash is not carried, before this change too). (Fails on the old fast-forward, which left the base
/// at the old commit and counted the 7 written paths.)
#[test]
fn developer_fast_forward_moves_the_base() {
    use std::io::{Read, Seek, Write};
    let d = Daemon::start();
    let up = ignoring_project(&d);
    let first = up.head();
    let ws = d.open_thread("mover", &["--project", "proj"]);
    fs::write(ws.join(".env"), "SECRET=1\n").unwrap();
    fs::create_dir_all(ws.join("node_modules/pkg")).unwrap();
    fs::write(ws.join("node_modules/pkg/index.js"), "module\n").unwrap();
    fs::write(ws.join("keep.txt"), "stashed change\n").unwrap();
    g(&ws, &["stash"]);
    assert_eq!(fs::read_to_string(ws.join("keep.txt")).unwrap(), "kept\n");
    let stash = g(&ws, &["rev-parse", "stash@{0}"]);
    let config = fs::read(ws.join(".git/config")).unwrap();
    let counted_before = status(&d, "mover")["changed_paths"].clone();
    // The kernel caches what a running process saw.
    assert_eq!(
        fs::read_to_string(ws.join("src/changed.txt")).unwrap(),
        "old\n"
    );
    // (Held for reading: a file open for writing refuses the fast-forward, as it may be changing.)
    let mut held = fs::File::open(ws.join(".env")).unwrap();
    let mut reader = fs::File::open(ws.join("keep.txt")).unwrap();
    let mut inside = std::process::Command::new("sh")
        .args(["-c", "read _; cat new.txt changed.txt"])
        .current_dir(ws.join("src"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    let second = advance_src(&up);
    d.cli_ok(["mirror", "sync", "proj"]);
    let (v, out) = resync(&d, "mover", "developer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "fast-forward", "{v}");
    assert_eq!(v["from"], first.as_str());
    assert_eq!(v["base_moved"], true, "{v}");
    let st = status(&d, "mover");
    assert_eq!(st["base_commit"], second.as_str(), "{st}");
    assert_eq!(st["changed_paths"], counted_before, "{st}");

    // The process inside `src/` sees the tip's files.
    inside.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut seen = String::new();
    inside
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut seen)
        .unwrap();
    assert!(inside.wait().unwrap().success());
    assert_eq!(seen, "at the tip\nnew content\n");
    // The files held open go on working; the ignored file takes a write.
    let mut env = String::new();
    held.read_to_string(&mut env).unwrap();
    assert_eq!(env, "SECRET=1\n");
    let mut w = fs::OpenOptions::new()
        .append(true)
        .open(ws.join(".env"))
        .unwrap();
    w.write_all(b"MORE=2\n").unwrap();
    drop(w);
    held.seek(std::io::SeekFrom::Start(0)).unwrap();
    env.clear();
    held.read_to_string(&mut env).unwrap();
    assert_eq!(env, "SECRET=1\nMORE=2\n");
    drop(held);
    assert_eq!(
        fs::read_to_string(ws.join(".env")).unwrap(),
        "SECRET=1\nMORE=2\n"
    );
    let mut kept = String::new();
    reader.read_to_string(&mut kept).unwrap();
    assert_eq!(kept, "kept\n");
    drop(reader);

    let expected = tempfile_checkout(&d, &up, &second);
    assert_eq!(tracked_files(&ws), files(&expected));
    assert_eq!(
        fs::read_to_string(ws.join("node_modules/pkg/index.js")).unwrap(),
        "module\n"
    );
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second);
    // git reads `.gitignore` at every status: the first status after the move opens no more
    // than the next one (no path re-hashed).
    let mut opened = Vec::new();
    for _ in 0..2 {
        let opens = base_content_opens(&d, "mover");
        assert_eq!(
            g(&ws, &["status", "--porcelain=v1", "--untracked-files=all"]),
            ""
        );
        opened.push(base_content_opens(&d, "mover") - opens);
    }
    assert_eq!(
        opened[0], opened[1],
        "git status after the move read file content (re-hashed)"
    );
    assert_eq!(
        g(&ws, &["status", "--porcelain=v1", "--ignored"]),
        "!! .env\n!! node_modules/"
    );
    assert_eq!(g(&ws, &["rev-parse", "stash@{0}"]), stash);
    assert_eq!(fs::read(ws.join(".git/config")).unwrap(), config);

    // Again: up to date, nothing moves.
    let (v, out) = resync(&d, "mover", "developer");
    assert!(out.success(), "{}", out.describe());
    assert_eq!(v["action"], "up-to-date", "{v}");
    assert!(v.get("base_moved").is_none(), "{v}");

    // Release and resume keep it.
    d.cli_ok(["release", "mover"]);
    let ws = d.open_thread("mover", &[]);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second);
    assert_eq!(tracked_files(&ws), files(&expected));
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    let st = status(&d, "mover");
    assert_eq!(st["base_commit"], second.as_str(), "{st}");
    d.cli_ok(["release", "mover"]);
}

/// The daemon dies (as by SIGKILL) right before and right after the catalog batch that moves the
/// base: after a restart the workspace is at the tip, whole (files, HEAD, a clean `git status`),
/// and a resync completes the move when it was cut before it. (Fails on the old fast-forward,
/// which never moves the base.)
#[test]
fn a_crash_around_the_base_move_loses_nothing() {
    for point in ["resync:before-move", "resync:after-move"] {
        let mut d = Daemon::start();
        let up = project(&d);
        let ws = d.open_thread("crash", &["--project", "proj"]);
        assert_eq!(g(&ws, &["status", "--porcelain"]), "");
        let second = advance(&up);
        d.cli_ok(["mirror", "sync", "proj"]);
        fs::write(d.state.join("test-fault"), point).unwrap();
        let out = d.cli(["resync", "crash", "--role", "developer", "--json"]);
        assert!(
            !out.success(),
            "{point}: the daemon did not die: {}",
            out.describe()
        );
        d.reap_killed();
        assert!(
            !d.state.join("test-fault").exists(),
            "{point}: the fault never fired"
        );
        common::umount_all_under(&d.root);
        d.spawn();
        let ws = d.mount("crash");
        wait_mounted(
            std::slice::from_ref(&ws),
            std::time::Duration::from_secs(20),
        );
        let expected = tempfile_checkout(&d, &up, &second);
        assert_eq!(files(&ws), files(&expected), "{point}");
        assert_eq!(g(&ws, &["rev-parse", "HEAD"]), second, "{point}");
        assert_eq!(g(&ws, &["status", "--porcelain"]), "", "{point}");
        let st = status(&d, "crash");
        assert_eq!(st["base_commit"], second.as_str(), "{point}: {st}");
        // Cut before the move: the fast-forward's entries still count (changed, added (a file
        // and its directory), gone, deep, tool.sh, link); after it, nothing.
        let counted = if point == "resync:before-move" { 7 } else { 0 };
        assert_eq!(st["changed_paths"], counted, "{point}: {st}");
        // A resync completes what was cut.
        let (v, out) = resync(&d, "crash", "developer");
        assert!(out.success(), "{}", out.describe());
        assert_eq!(v["action"], "up-to-date", "{v}");
        assert_eq!(
            v["base_moved"].as_bool().unwrap_or(false),
            counted > 0,
            "{v}"
        );
        let st = status(&d, "crash");
        assert_eq!(st["changed_paths"], 0, "{point}: {st}");
        let opens = base_content_opens(&d, "crash");
        assert_eq!(g(&ws, &["status", "--porcelain"]), "", "{point}");
        assert_eq!(base_content_opens(&d, "crash"), opens, "{point}: re-hashed");
        assert_eq!(files(&ws), files(&expected), "{point}");
        d.cli_ok(["release", "crash"]);
        let ws = d.open_thread("crash", &[]);
        assert_eq!(files(&ws), files(&expected), "{point}");
        assert_eq!(g(&ws, &["status", "--porcelain"]), "", "{point}");
        d.cli_ok(["release", "crash"]);
        d.stop();
    }
}
