//! Issue 5, "Done when": snapshots, restore, release, sweep, binding, chat workspaces and diff
//! (docs/architecture.md "Snapshots, release and resume"; seed 000 "Saving", "Restoring", "Reclaiming",
//! "Binding", "The chat workspace"), checked through real mounts with real git:
//!
//! 1. [`round_trip_through_snapshot_release_and_open`]: modifications, deletions, untracked files,
//!    an exec bit, a file replaced by a symlink, ignored files, an agent commit and more uncommitted
//!    work survive snapshot → release → open (status, log, HEAD on its branch, bytes and modes;
//!    ignored files are gone); parents, reflog, `refs/octomate/saved`, an unchanged state returning
//!    the same id, HEAD/index/branches not moving, the mirror's own refs untouched; and
//!    [`detached_head_round_trip`] for a detached HEAD.
//! 2. [`snapshot_tree_equals_git_add_all_of_a_native_copy`]: the snapshot's tree equals what
//!    `git add -A` into a scratch copy of the workspace's index, then `git write-tree`, produces on a
//!    `cp -a` copy of the mount (the differential check), for hairy change sets (ignore rules with
//!    negations, `.git/info/exclude`, tracked-but-ignored files, directory renames, type changes);
//!    also [`snapshot_of_a_directory_renamed_with_a_tracked_ignored_file`] and
//!    [`snapshot_of_a_workspace_holding_an_embedded_repository`].
//! 3. [`release_drops_the_upper_layer_and_respects_busy_mounts_and_users`]: the upper layer and the
//!    mount point go; a busy mount refuses release (one-line error, stays mounted) and `--force`
//!    releases it; two opens need two releases; releasing twice is harmless; `list` shows it.
//!    [`release_waits_for_a_process_that_is_leaving`]: a process leaving the mount (git's detached
//!    maintenance after a commit) is waited for, not a refusal.
//! 4. [`sweep_releases_only_clean_idle_workspaces`]: clean idle workspaces go, dirty ones (incl. a
//!    write through passthrough on an fd opened before the snapshot, and a commit-only change), ones
//!    with open files or a busy cwd, and chat workspaces stay.
//! 5. [`binding_is_once_and_chat_workspaces_are_thrown_away`] and
//!    [`resume_of_a_released_thread_is_o1`] (timings printed, not asserted).
//! 6. [`snapshot_faults_unknown_thread_and_lost_cas`] and
//!    [`sigkill_around_snapshots_never_leaves_a_ref_to_a_missing_object`].
//! 7. [`diff_against_base_saved_and_between_snapshots`].

use crate::common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs git in `dir` (not asserted).
fn git_out(dir: &Path, args: &[&str]) -> Out {
    run(git_command(dir, DATE1).args(args), CMD_TIMEOUT)
}

/// Runs git in `dir`, asserting success; returns trimmed stdout.
#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = git_out(dir, args);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// `octofs status <thread> --json`.
#[track_caller]
fn status(d: &Daemon, thread: &str) -> serde_json::Value {
    parse_json("status --json", &d.cli_ok(["status", thread, "--json"]))
}

/// The entry of `thread` in `octofs list --json`.
#[track_caller]
fn list_entry(d: &Daemon, thread: &str) -> serde_json::Value {
    let v = parse_json("list --json", &d.cli_ok(["list", "--json"]));
    v.as_array()
        .and_then(|a| a.iter().find(|e| e["thread"] == thread).cloned())
        .unwrap_or_else(|| panic!("{thread} not in `list --json`: {v}"))
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
}

fn append(p: &Path, text: &str) {
    fs::OpenOptions::new()
        .append(true)
        .open(p)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("append to {}: {e}", p.display()));
}

/// Every entry of a workspace (bytes, mode, link target; via [`tree_listing`]) except `.git` and
/// the paths under `skip`.
fn work_listing(mount: &Path, skip: &[&str]) -> BTreeMap<String, String> {
    let m = mount.to_path_buf();
    let skip: Vec<String> = skip.iter().map(|s| s.to_string()).collect();
    fsop("list the workspace", move || {
        tree_listing(&m)
            .into_iter()
            .filter(|(k, _)| {
                let under = |p: &str| k == p || k.starts_with(&format!("{p}/"));
                !under(".git") && !skip.iter().any(|s| under(s))
            })
            .collect()
    })
}

/// What a person sees of a workspace: status, log, HEAD and the files.
#[derive(Debug, PartialEq)]
struct WsState {
    status: String,
    log: String,
    head_ref: String,
    head: String,
    files: BTreeMap<String, String>,
}

/// Captures [`WsState`]; `skip` are paths left out of the file listing (ignored files).
#[track_caller]
fn capture(mount: &Path, skip: &[&str]) -> WsState {
    let sym = git_out(mount, &["symbolic-ref", "-q", "HEAD"]);
    WsState {
        status: g(mount, &["status", "--porcelain=v2"]),
        log: g(mount, &["log", "--format=%H %P %an %s"]),
        head_ref: if sym.success() {
            sym.stdout_str().trim().to_string()
        } else {
            "(detached)".into()
        },
        head: g(mount, &["rev-parse", "HEAD"]),
        files: work_listing(mount, skip),
    }
}

#[track_caller]
fn assert_same_state(what: &str, before: &WsState, after: &WsState) {
    assert_eq!(
        before.head_ref, after.head_ref,
        "{what}: HEAD's ref differs"
    );
    assert_eq!(before.head, after.head, "{what}: HEAD differs");
    assert_eq!(before.log, after.log, "{what}: git log differs");
    assert_eq!(
        before.status, after.status,
        "{what}: git status --porcelain=v2 differs"
    );
    assert_same_listing(&format!("{what}: the files"), &before.files, &after.files);
}

/// The standard small project: text files in a few directories, an executable, a symlink, a
/// `.gitignore`.
const FILES: &[(&str, &str, u32)] = &[
    ("README.md", "# demo\n", 0o644),
    ("a.txt", "alpha\n", 0o644),
    ("b.txt", "bravo\n", 0o644),
    ("c.txt", "charlie\n", 0o644),
    ("run.sh", "#!/bin/sh\necho run\n", 0o755),
    ("tool.sh", "#!/bin/sh\necho tool\n", 0o644),
    ("src/lib.rs", "pub fn f() {}\n", 0o644),
    ("src/main.rs", "fn main() {}\n", 0o644),
    ("src/deep/x/y.txt", "deep\n", 0o644),
    ("docs/guide.md", "guide\n", 0o644),
    ("docs/old.md", "old\n", 0o644),
    ("link", "a.txt", 0o120000),
    (".gitignore", "*.log\n/build/\n", 0o644),
];

/// Sends one raw request line to the daemon's socket (no CLI, so nothing can auto-start a daemon)
/// and returns the answer line (empty when the daemon died first).
fn raw_request(socket: &Path, request: &str, timeout: Duration) -> std::io::Result<String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(request.as_bytes())?;
    s.write_all(b"\n")?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

/// `git fsck --full` of `repo`: asserts it exits 0 and reports nothing but dangling objects.
#[track_caller]
fn assert_fsck_clean(repo: &Path, what: &str) {
    let out = git_out(repo, &["fsck", "--full", "--no-progress"]);
    let text = format!("{}{}", out.stdout_str(), out.stderr_str());
    let bad: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("dangling ") && !l.trim().is_empty())
        .collect();
    assert!(
        out.success() && bad.is_empty(),
        "{what}: git fsck of {} is not clean: {}",
        repo.display(),
        out.describe()
    );
}

fn tree_of(repo: &Path, commit: &str) -> String {
    g(repo, &["rev-parse", &format!("{commit}^{{tree}}")])
}

fn parents_of(repo: &Path, commit: &str) -> Vec<String> {
    g(repo, &["rev-list", "--parents", "-n", "1", commit])
        .split_whitespace()
        .skip(1)
        .map(str::to_string)
        .collect()
}

/// The differential reference: `cp -a` of the mount, then in the copy `git add -A` into a scratch
/// copy of its index and `git write-tree` (fsmonitor and the untracked cache off: they belong to
/// the mount's daemon, not to the copy). Returns the tree id.
#[track_caller]
fn native_tree_of_copy(mount: &Path, scratch_dir: &Path) -> String {
    let copy = scratch_dir.join("copy");
    let _ = fs::remove_dir_all(&copy);
    let out = run(
        Command::new("cp").arg("-a").arg(mount).arg(&copy),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let index = scratch_dir.join("scratch-index");
    fs::copy(copy.join(".git/index"), &index).expect("copy index");
    let add = |args: &[&str]| {
        let out = run(
            git_command(&copy, DATE1)
                .env("GIT_INDEX_FILE", &index)
                .args([
                    "-c",
                    "core.fsmonitor=false",
                    "-c",
                    "core.untrackedCache=false",
                ])
                .args(args),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        out.stdout_str().trim().to_string()
    };
    add(&["add", "-A"]);
    add(&["write-tree"])
}

/// `git diff-tree` of two trees, for failure messages; `repo` is the copy made by
/// [`native_tree_of_copy`] (it holds the native tree and reaches the mirror's objects).
fn tree_diff(repo: &Path, a: &str, b: &str) -> String {
    let out = git_out(repo, &["diff-tree", "-r", "--no-renames", a, b]);
    format!("{}{}", out.stdout_str(), out.stderr_str())
}

// ---------------------------------------------------------------------------------------------
// 1. Round trip

#[test]
fn round_trip_through_snapshot_release_and_open() {
    let d = Daemon::start();
    let up = add_project(&d, "p", FILES);
    // A second branch: the thread is opened on it by name.
    up.git(["checkout", "-q", "-b", "feature"]);
    up.write("feature.txt", "on the feature branch\n");
    up.commit_all("feature work", DATE2);
    up.git(["checkout", "-q", "main"]);
    d.cli_ok(["mirror", "sync", "p"]);
    let mirror = d.mirror("p");
    let mirror_refs_before = g(
        &mirror,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    );
    let mirror_head_before = fs::read(mirror.join(".git/HEAD")).unwrap();
    let mirror_index_before = fs::read(mirror.join(".git/index")).unwrap();

    let t = "rt";
    let ws = d.open_thread(t, &["--project", "p", "--ref", "feature"]);
    assert_eq!(g(&ws, &["symbolic-ref", "HEAD"]), "refs/heads/feature");

    // Uncommitted work, then one commit, then more uncommitted work.
    let w = ws.clone();
    fsop("first edits", move || {
        append(&w.join("a.txt"), "more alpha\n");
        fs::remove_file(w.join("docs/old.md")).unwrap();
        write_file(&w.join("new/untracked.txt"), b"untracked\n", 0o644);
        chmod(&w.join("tool.sh"), 0o755);
        fs::remove_file(w.join("c.txt")).unwrap();
        std::os::unix::fs::symlink("src/lib.rs", w.join("c.txt")).unwrap();
        write_file(&w.join("debug.log"), b"ignored\n", 0o644);
        write_file(&w.join("build/out.bin"), b"ignored too\n", 0o644);
        write_file(&w.join("b.txt"), b"bravo, committed by the agent\n", 0o644);
    });
    g(&ws, &["add", "b.txt"]);
    g(&ws, &["commit", "-q", "-m", "agent commit"]);
    let agent_commit = g(&ws, &["rev-parse", "HEAD"]);
    let w = ws.clone();
    fsop("later edits", move || {
        append(&w.join("src/main.rs"), "// later\n");
        write_file(&w.join("later.txt"), b"later\n", 0o644);
        fs::remove_file(w.join("src/deep/x/y.txt")).unwrap();
        write_file(&w.join("src/deep/x/z.txt"), b"z\n", 0o644);
    });

    // HEAD, the index and the branches do not move during a snapshot.
    let refs_before = g(&ws, &["for-each-ref", "--format=%(refname) %(objectname)"]);
    let head_file = read_ws(&ws.join(".git/HEAD")).unwrap();
    let index_file = read_ws(&ws.join(".git/index")).unwrap();
    let s1 = d.snapshot_id(t);
    assert_eq!(
        read_ws(&ws.join(".git/HEAD")).unwrap(),
        head_file,
        "HEAD moved"
    );
    assert_eq!(
        read_ws(&ws.join(".git/index")).unwrap(),
        index_file,
        "the index changed during a snapshot"
    );
    // Except octofs's own mark, `refs/octomate/saved`, which the snapshot writes (and which a
    // process in the mount sees at once: the daemon tells the kernel).
    let refs_after: String = g(&ws, &["for-each-ref", "--format=%(refname) %(objectname)"])
        .lines()
        .filter(|l| !l.starts_with("refs/octomate/"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        refs_after, refs_before,
        "the workspace's refs moved during a snapshot"
    );
    // Parents: HEAD (the agent's commit, now in the mirror), no previous snapshot yet.
    assert_eq!(parents_of(&mirror, &s1), vec![agent_commit.clone()]);
    g(
        &mirror,
        &["cat-file", "-e", &format!("{agent_commit}^{{commit}}")],
    );
    assert_eq!(
        g(&ws, &["rev-parse", "refs/octomate/saved"]),
        s1,
        "refs/octomate/saved in the workspace"
    );
    // The differential check on this state.
    let native = native_tree_of_copy(&ws, &d.base);
    let snap_tree = tree_of(&mirror, &s1);
    assert_eq!(
        snap_tree,
        native,
        "snapshot tree != `git add -A` of a native copy:\n{}",
        tree_diff(&d.base.join("copy"), &native, &snap_tree)
    );
    // Unchanged state: the same id, no new reflog entry.
    assert_eq!(
        d.snapshot_id(t),
        s1,
        "an unchanged state made a new snapshot"
    );

    // A second snapshot: second parent is the first.
    let w = ws.clone();
    fsop("edit after the first snapshot", move || {
        write_file(&w.join("new/second.txt"), b"second\n", 0o644);
    });
    let s2 = d.snapshot_id(t);
    assert_ne!(s2, s1);
    assert_eq!(
        parents_of(&mirror, &s2),
        vec![agent_commit.clone(), s1.clone()]
    );
    assert_eq!(g(&ws, &["rev-parse", "refs/octomate/saved"]), s2);
    let reflog = g(
        &mirror,
        &["reflog", "show", "--format=%H", "refs/octomate/threads/rt"],
    );
    assert_eq!(
        reflog.lines().collect::<Vec<_>>(),
        vec![s2.as_str(), s1.as_str()],
        "reflog of refs/octomate/threads/rt: one entry per snapshot"
    );
    // The mirror's HEAD, index and branches are untouched; only refs/octomate/* were added.
    assert_eq!(
        fs::read(mirror.join(".git/HEAD")).unwrap(),
        mirror_head_before
    );
    assert_eq!(
        fs::read(mirror.join(".git/index")).unwrap(),
        mirror_index_before
    );
    let mirror_refs_after: String = g(
        &mirror,
        &["for-each-ref", "--format=%(refname) %(objectname)"],
    )
    .lines()
    .filter(|l| !l.starts_with("refs/octomate/"))
    .collect::<Vec<_>>()
    .join("\n");
    assert_eq!(mirror_refs_after, mirror_refs_before);
    // No commit on any branch of the mirror reaches the snapshot.
    assert_eq!(
        g(&mirror, &["branch", "-a", "--contains", &s2]),
        "",
        "a branch of the mirror contains the snapshot"
    );

    let ignored = ["debug.log", "build"];
    let before = capture(&ws, &ignored);
    let released = d.cli_ok(["release", t]);
    assert!(released.contains(&s2), "release output: {released}");
    assert!(!d.state.join("workspaces").join(t).exists());
    let ws = d.open_thread(t, &[]);
    let after = capture(&ws, &[]);
    assert_same_state("snapshot → release → open", &before, &after);
    assert!(!exists_ws(&ws.join("debug.log")) && !exists_ws(&ws.join("build")));
    assert_eq!(g(&ws, &["rev-parse", "refs/octomate/saved"]), s2);
    // A resumed workspace snapshots to the same id while unchanged, and is clean: nothing differs
    // from its snapshot, and a sweep may release it.
    assert_eq!(d.snapshot_id(t), s2);
    assert_eq!(d.cli_ok(["diff", t, "--from", "saved"]).trim(), "");
    let v = parse_json(
        "sweep --json",
        &d.cli_ok(["sweep", "--idle", "0", "--json"]),
    );
    assert_eq!(
        v["released"],
        serde_json::json!([t]),
        "a resumed, unchanged workspace is clean: {v}"
    );
    // The chain goes on across releases: the next snapshot's second parent is the last one.
    let ws = d.open_thread(t, &[]);
    let w = ws.clone();
    fsop("edit after the resume", move || {
        append(&w.join("a.txt"), "after the resume\n")
    });
    let s3 = d.snapshot_id(t);
    assert_eq!(parents_of(&mirror, &s3), vec![agent_commit, s2]);
    d.cli_ok(["release", t]);
}

#[test]
fn detached_head_round_trip() {
    let d = Daemon::start();
    let up = add_project(&d, "p", FILES);
    up.write("a.txt", "alpha v2\n");
    up.write("second.txt", "second\n");
    let tip = up.commit_all("second", DATE2);
    d.cli_ok(["mirror", "sync", "p"]);
    let t = "det";
    let ws = d.open_thread(t, &["--project", "p"]);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), tip);
    // Detach at the first commit: the working tree now differs from the base everywhere it changed.
    g(&ws, &["checkout", "-q", "--detach", "HEAD~1"]);
    let w = ws.clone();
    fsop("edit", move || {
        append(&w.join("b.txt"), "detached edit\n");
        write_file(&w.join("untracked.txt"), b"u\n", 0o644);
    });
    let before = capture(&ws, &[]);
    assert_eq!(before.head_ref, "(detached)");
    let s = d.snapshot_id(t);
    assert_eq!(parents_of(&d.mirror("p"), &s), vec![before.head.clone()]);
    d.cli_ok(["release", t]);
    let ws = d.open_thread(t, &[]);
    let after = capture(&ws, &[]);
    assert_same_state("detached HEAD round trip", &before, &after);
    d.cli_ok(["release", t]);
}

// ---------------------------------------------------------------------------------------------
// 2. Differential

#[test]
fn snapshot_tree_equals_git_add_all_of_a_native_copy() {
    let d = Daemon::start();
    let mut files: Vec<(&str, &str, u32)> = FILES.to_vec();
    files.extend_from_slice(&[
        ("vendor/keep.c", "tracked in an ignored directory\n", 0o644),
        ("tracked.log", "tracked although *.log is ignored\n", 0o644),
        ("gone/a.txt", "a\n", 0o644),
        ("gone/sub/b.txt", "b\n", 0o644),
        ("moveme/one.txt", "one\n", 0o644),
        ("moveme/two/three.txt", "three\n", 0o644),
        ("becomes_dir", "file\n", 0o644),
        ("dir_becomes_file/x.txt", "x\n", 0o644),
        ("exec_off.sh", "#!/bin/sh\n", 0o755),
        ("group_exec.txt", "g\n", 0o644),
    ]);
    let up = add_project(&d, "p", &files);
    // vendor/ is ignored by a rule added after the file was tracked.
    up.write(
        ".gitignore",
        "*.log\n/build/\n/vendor/\n/tmp/*\n!/tmp/keep\n",
    );
    up.commit_all("ignore vendor", DATE2);
    d.cli_ok(["mirror", "sync", "p"]);
    let mirror = d.mirror("p");
    let t = "diffy";
    let ws = d.open_thread(t, &["--project", "p"]);

    // Every round is checked; the failures are reported together at the end.
    let check = |what: &str| -> Option<String> {
        let s = d.snapshot_id(t);
        let ours = tree_of(&mirror, &s);
        let native = native_tree_of_copy(&ws, &d.base);
        (ours != native).then(|| {
            format!(
                "{what}: snapshot tree {ours} != `git add -A` of a native copy {native}; diff \
                 native → snapshot:\n{}",
                tree_diff(&d.base.join("copy"), &native, &ours)
            )
        })
    };
    let mut failures = Vec::new();

    // Round 1: plain edits of every kind.
    let w = ws.clone();
    fsop("round 1", move || {
        append(&w.join("a.txt"), "one more line\n");
        fs::remove_dir_all(w.join("gone")).unwrap();
        fs::remove_file(w.join("becomes_dir")).unwrap();
        write_file(&w.join("becomes_dir/inner.txt"), b"inner\n", 0o644);
        fs::remove_dir_all(w.join("dir_becomes_file")).unwrap();
        write_file(&w.join("dir_becomes_file"), b"now a file\n", 0o644);
        chmod(&w.join("exec_off.sh"), 0o644);
        chmod(&w.join("group_exec.txt"), 0o654);
        write_file(&w.join("new/deep/er/file.txt"), b"deep new\n", 0o755);
        fs::create_dir_all(w.join("empty/dir")).unwrap();
        write_file(&w.join("name with spaces.txt"), b"spaces\n", 0o644);
        write_file(&w.join("ünïcödé.txt"), "unicode\n".as_bytes(), 0o644);
        std::os::unix::fs::symlink("src", w.join("link_to_dir")).unwrap();
        std::os::unix::fs::symlink("does/not/exist", w.join("dangling")).unwrap();
        fs::remove_file(w.join("link")).unwrap();
        write_file(&w.join("link"), b"link became a file\n", 0o644);
    });
    failures.extend(check("round 1 (plain edits)"));

    // Round 2: what `git add -A` leaves out, and what it keeps although it matches a rule.
    let w = ws.clone();
    fsop("round 2", move || {
        write_file(&w.join("x.log"), b"ignored\n", 0o644);
        write_file(&w.join("build/obj/o.o"), b"ignored dir\n", 0o644);
        append(&w.join("tracked.log"), "modified, still tracked\n");
        append(&w.join("vendor/keep.c"), "modified, still tracked\n");
        write_file(&w.join("vendor/new.c"), b"new in an ignored dir\n", 0o644);
        write_file(&w.join("tmp/scratch"), b"ignored by /tmp/*\n", 0o644);
        write_file(&w.join("tmp/keep"), b"re-included by !/tmp/keep\n", 0o644);
        write_file(&w.join("sub/.gitignore"), b"*.tmp\n!important.tmp\n", 0o644);
        write_file(&w.join("sub/a.tmp"), b"ignored by sub/.gitignore\n", 0o644);
        write_file(&w.join("sub/important.tmp"), b"re-included\n", 0o644);
        write_file(&w.join("sub/real.txt"), b"real\n", 0o644);
        write_file(
            &w.join("only_ignored/a.log"),
            b"nothing to add here\n",
            0o644,
        );
        // .git/info/exclude of the workspace counts too ("never ignored or excluded files").
        let excl = w.join(".git/info/exclude");
        let mut text = fs::read_to_string(&excl).unwrap_or_default();
        text.push_str("excluded.txt\n");
        write_file(&excl, text.as_bytes(), 0o644);
        write_file(&w.join("excluded.txt"), b"excluded\n", 0o644);
    });
    failures.extend(check("round 2 (ignore rules)"));

    // Round 3: a directory renamed (copies nothing) and edited below; a deep delete.
    let w = ws.clone();
    fsop("round 3", move || {
        // Round 2's re-included file is not carried into the later rounds.
        fs::remove_dir_all(w.join("tmp")).unwrap();
        fs::rename(w.join("moveme"), w.join("moved")).unwrap();
        append(&w.join("moved/two/three.txt"), "edited after the move\n");
        fs::rename(w.join("src/deep"), w.join("shallow")).unwrap();
        fs::remove_file(w.join("docs/guide.md")).unwrap();
    });
    failures.extend(check("round 3 (directory renames)"));

    // Round 4: a tracked-but-ignored file carried by a directory rename: in the new place it is
    // untracked and ignored, so `git add -A` leaves it out.
    let w = ws.clone();
    fsop("round 4", move || {
        fs::create_dir_all(w.join("logs_src")).unwrap();
        fs::rename(w.join("tracked.log"), w.join("logs_src/tracked.log")).unwrap();
    });
    failures.extend(check(
        "round 4 (tracked.log moved: now untracked and ignored)",
    ));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    d.cli_ok(["release", t]);
}

#[test]
fn snapshot_of_a_workspace_holding_an_embedded_repository() {
    // An agent clones (or inits) a repository inside its workspace. `git add -A` records it as a
    // gitlink at its HEAD; a snapshot must at least succeed, and match that.
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let mirror = d.mirror("p");
    let t = "embedded";
    let ws = d.open_thread(t, &["--project", "p"]);
    let nested = ws.join("nested");
    let w = nested.clone();
    fsop("mkdir nested", move || fs::create_dir(w).unwrap());
    g(&nested, &["init", "-q"]);
    let w = nested.clone();
    fsop("nested edits", move || {
        write_file(&w.join("n.txt"), b"nested\n", 0o644)
    });
    g(&nested, &["add", "n.txt"]);
    g(&nested, &["commit", "-q", "-m", "nested"]);
    let out = d.cli(["snapshot", t]);
    assert!(
        out.success(),
        "snapshot of a workspace with an embedded repository at nested/ failed (so does \
         release: the thread can never be saved): {}",
        out.describe()
    );
    let s = out.stdout_str().trim().to_string();
    let ours = tree_of(&mirror, &s);
    let native = native_tree_of_copy(&ws, &d.base);
    assert_eq!(
        ours,
        native,
        "embedded repository: diff native → snapshot:\n{}",
        tree_diff(&d.base.join("copy"), &native, &ours)
    );
    assert_fsck_clean(&mirror, "after snapshotting an embedded repository");
    d.cli_ok(["release", t]);
}

#[test]
fn snapshot_of_a_directory_renamed_with_a_tracked_ignored_file() {
    // `vendor/` is ignored but vendor/keep.c is tracked. Renaming the whole directory to a new,
    // non-ignored name keeps everything; renaming it to another ignored name leaves it all out.
    let d = Daemon::start();
    let mut files: Vec<(&str, &str, u32)> = FILES.to_vec();
    files.extend_from_slice(&[
        ("pkg/keep.c", "tracked\n", 0o644),
        (
            "pkg/build.log",
            "tracked although *.log is ignored\n",
            0o644,
        ),
    ]);
    add_project(&d, "p", &files);
    let mirror = d.mirror("p");
    let t = "dirmove";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop(
        "rename a directory holding a tracked ignored file",
        move || {
            fs::rename(w.join("pkg"), w.join("pkg2")).unwrap();
        },
    );
    let s = d.snapshot_id(t);
    let ours = tree_of(&mirror, &s);
    let native = native_tree_of_copy(&ws, &d.base);
    assert_eq!(
        ours,
        native,
        "snapshot tree != `git add -A` after `mv pkg pkg2` (pkg/build.log is tracked, *.log \
         ignored: pkg2/build.log is untracked and ignored, git leaves it out); diff native → \
         snapshot:\n{}",
        tree_diff(&d.base.join("copy"), &native, &ours)
    );
    d.cli_ok(["release", t]);
}

// ---------------------------------------------------------------------------------------------
// 3. Release

/// A process on its way out of the mount — as git 2.47's detached `maintenance run --auto` is
/// for a moment after `git commit` returns — does not make `release` refuse as busy: the daemon
/// waits it out (up to a second). On the old check this release failed with "busy".
#[test]
fn release_waits_for_a_process_that_is_leaving() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let t = "leaving";
    let ws = d.open_thread(t, &["--project", "p"]);
    let mut leaving = Command::new("sleep")
        .arg("0.4")
        .current_dir(&ws)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn sleep in the mount");
    let out = d.cli(["release", t]);
    let left = wait_timeout(&mut leaving, Duration::from_secs(5));
    if left.is_none() {
        kill_child_group(&leaving);
        let _ = wait_timeout(&mut leaving, Duration::from_secs(5));
    }
    assert!(
        out.status.success(),
        "release refused while a process was leaving the mount: {}",
        out.stderr_str()
    );
    assert!(!is_mounted(&ws), "released but still mounted");
    assert_eq!(list_entry(&d, t)["state"], "released");
}

#[test]
fn release_drops_the_upper_layer_and_respects_busy_mounts_and_users() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let t = "rel";
    let ws = d.open_thread(t, &["--project", "p"]);
    let upper = d.state.join("workspaces").join(t);
    assert!(upper.is_dir(), "no upper layer at {}", upper.display());
    let w = ws.clone();
    fsop("edit", move || {
        write_file(&w.join("new.txt"), b"new\n", 0o644)
    });

    // Busy: a process has its working directory in the mount.
    let sleeper = Proc::sleeper_in(&ws);
    let tref = format!("refs/octomate/threads/{t}");
    let ref_before = git_out(&d.mirror("p"), &["rev-parse", "-q", "--verify", &tref]);
    let out = d.cli(["release", t]);
    out.assert_one_line_error(&["busy"]);
    let ref_after = git_out(&d.mirror("p"), &["rev-parse", "-q", "--verify", &tref]);
    if ref_before.stdout != ref_after.stdout {
        // Not asserted: saving is harmless, but README says a refused command changes nothing.
        eprintln!(
            "note: the refused (busy) release still saved a snapshot: {tref} {:?} -> {:?}",
            ref_before.stdout_str().trim(),
            ref_after.stdout_str().trim()
        );
    }
    assert!(is_mounted(&ws), "a refused release unmounted the workspace");
    assert!(upper.is_dir(), "a refused release dropped the upper layer");
    assert_eq!(status(&d, t)["state"], "mounted");
    let w = ws.clone();
    let still = fsop("use after a refused release", move || {
        write_file(&w.join("after-refusal.txt"), b"still works\n", 0o644);
        fs::read(w.join("new.txt")).unwrap()
    });
    assert_eq!(still, b"new\n");
    // --force releases it (saving first).
    let out = d.cli_ok(["release", t, "--force"]);
    drop(sleeper);
    let last = list_entry(&d, t);
    let snap = last["last_snapshot"]
        .as_str()
        .unwrap_or_else(|| panic!("no last_snapshot after release: {last}"))
        .to_string();
    assert!(out.contains(&snap), "release --force output {out:?}");
    assert_eq!(last["state"], "released", "{last}");
    assert!(!upper.exists(), "upper layer left after release");
    assert!(!is_mounted(&ws), "still mounted after release --force");
    assert!(!ws.exists(), "mount point left after release");
    let files = g(&d.mirror("p"), &["ls-tree", "-r", "--name-only", &snap]);
    assert!(
        files.lines().any(|l| l == "after-refusal.txt"),
        "the forced release's snapshot lacks the last write:\n{files}"
    );

    // Releasing a released thread is harmless.
    let again = d.cli(["release", t]);
    again.assert_ok();
    assert_eq!(list_entry(&d, t)["last_snapshot"], snap.as_str());

    // The same caller opening it twice is one user (`cd $(octofs open t)` after an open, doctor's
    // advice): one release releases it (issue 32, item 5).
    let ws = d.open_thread(t, &[]);
    assert_eq!(d.open_thread(t, &[]), ws);
    assert_eq!(status(&d, t)["users"], 1);
    // `octofs path` says where it is and counts nobody.
    assert_eq!(d.cli_ok(["path", t]).trim(), ws.display().to_string());
    assert_eq!(status(&d, t)["users"], 1);
    assert!(d.state.join("workspaces").join(t).is_dir());
    let out = d.cli_ok(["release", t]);
    assert!(out.starts_with("released"), "{out}");
    assert!(!is_mounted(&ws));
    // A released thread and an unknown one: `path` refuses in one line.
    d.cli(["path", t])
        .assert_one_line_error(&["released", "octofs open"]);
    d.cli(["path", "nosuch"]).assert_one_line_error(&["nosuch"]);
    assert!(!d.state.join("workspaces").join(t).exists());
    assert!(!ws.exists());
    let e = list_entry(&d, t);
    assert_eq!(e["state"], "released", "{e}");
    assert_eq!(e["last_snapshot"], snap.as_str(), "{e}");
    // The plain `list` says so too, under a header, with the owner last.
    let text = d.cli_ok(["list"]);
    assert_eq!(
        text.lines().next(),
        Some("THREAD\tPROJECT\tBASE\tSTATE\tPATH\tBYTES\tOWNER"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{t}\t")))
        .unwrap_or_else(|| panic!("{t} not in list:\n{text}"));
    assert!(
        line.contains("released") && line.contains(&snap[..12]) && line.ends_with("\troot"),
        "list line {line:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Sweep

/// Resident memory of the daemon process, from /proc.
fn daemon_rss(d: &Daemon) -> u64 {
    let pid = d.pid().expect("daemon running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Each mount's session threads own 16 MiB request buffers; they must stay lazily mapped, also
/// after unmounts freed earlier ones (which made glibc carve later buffers from thread arenas and
/// zero them by hand: ~20 MiB resident per workspace, 2 GiB for 100).
#[test]
fn daemon_memory_stays_small_across_many_mounts_and_unmounts() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let idle = daemon_rss(&d);
    for i in 0..12 {
        let ws = d.open_thread(&format!("m{i}"), &["--project", "p"]);
        let w = ws.clone();
        fsop("read", move || std::fs::read(w.join("a.txt")).unwrap());
    }
    for i in 0..6 {
        d.cli_ok(["release", &format!("m{i}"), "--force"]);
    }
    for i in 12..30 {
        d.open_thread(&format!("m{i}"), &["--project", "p"]);
    }
    let grown = daemon_rss(&d).saturating_sub(idle);
    // 24 mounts: a few MiB of bookkeeping; 24 resident request buffers would be 400 MiB.
    assert!(
        grown < 96 << 20,
        "daemon RSS grew by {} MiB for 24 mounted workspaces",
        grown >> 20
    );
}

#[test]
fn sweep_releases_only_clean_idle_workspaces() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let mount = |t: &str| d.mount(t);
    // clean-fresh: never touched. clean-saved: edited, then saved.
    d.open_thread("clean-fresh", &["--project", "p"]);
    let ws = d.open_thread("clean-saved", &["--project", "p"]);
    let w = ws.clone();
    fsop("edit", move || append(&w.join("a.txt"), "saved\n"));
    d.snapshot_id("clean-saved");
    // dirty-after: saved, then edited. dirty-never: edited, never saved.
    let ws = d.open_thread("dirty-after", &["--project", "p"]);
    d.snapshot_id("dirty-after");
    let w = ws.clone();
    fsop("edit", move || {
        write_file(&w.join("unsaved.txt"), b"x\n", 0o644)
    });
    let ws = d.open_thread("dirty-never", &["--project", "p"]);
    let w = ws.clone();
    fsop("edit", move || fs::remove_file(w.join("b.txt")).unwrap());
    // dirty-commit: its only change is a commit (only .git changed; the mirror has not seen it).
    let ws = d.open_thread("dirty-commit", &["--project", "p"]);
    d.snapshot_id("dirty-commit");
    g(
        &ws,
        &["commit", "-q", "--allow-empty", "-m", "only a commit"],
    );
    // dirty-passthrough: the only change after the snapshot is a write through an fd opened (and
    // copied up) before it; with passthrough the daemon does not see that write.
    let ws = d.open_thread("dirty-passthrough", &["--project", "p"]);
    let passthrough = status(&d, "dirty-passthrough")["passthrough"].clone();
    eprintln!("dirty-passthrough: passthrough = {passthrough}");
    let w = ws.clone();
    let mut fd = fsop("open for write", move || {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(w.join("a.txt"))
            .unwrap();
        f.write_all(b"ALPHA\n").unwrap();
        f.sync_all().unwrap();
        f
    });
    let before_write = d.snapshot_id("dirty-passthrough");
    std::thread::sleep(Duration::from_millis(20));
    let mut fd = fsop("write through the old fd", move || {
        fd.seek(SeekFrom::Start(0)).unwrap();
        fd.write_all(b"OMEGA\n").unwrap();
        fd.sync_all().unwrap();
        fd
    });
    // The snapshot saw ALPHA.
    assert_eq!(
        g(
            &d.mirror("p"),
            &["cat-file", "-p", &format!("{before_write}:a.txt")]
        ),
        "ALPHA"
    );
    fsop("close", move || {
        fd.flush().unwrap();
        drop(fd);
    });
    // files-open: saved, then a file held open (read-only).
    let ws = d.open_thread("files-open", &["--project", "p"]);
    d.snapshot_id("files-open");
    let w = ws.clone();
    let held = fsop("hold a file open", move || {
        fs::File::open(w.join("c.txt")).unwrap()
    });
    // busy-cwd: saved, a process has its working directory in it.
    let ws = d.open_thread("busy-cwd", &["--project", "p"]);
    d.snapshot_id("busy-cwd");
    let sleeper = Proc::sleeper_in(&ws);
    // chat: a chat workspace, untouched.
    d.open_thread("chat", &[]);

    let v = parse_json(
        "sweep --json",
        &d.cli_ok(["sweep", "--idle", "0", "--json"]),
    );
    eprintln!("sweep: {v}");
    let released: Vec<String> = v["released"]
        .as_array()
        .unwrap_or_else(|| panic!("sweep --json: {v}"))
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect();
    let kept: BTreeMap<String, String> = v["kept"]
        .as_array()
        .unwrap_or_else(|| panic!("sweep --json: {v}"))
        .iter()
        .map(|k| {
            (
                k["thread"].as_str().unwrap().to_string(),
                k["why"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut problems = Vec::new();
    for t in ["clean-fresh", "clean-saved"] {
        if !released.contains(&t.to_string()) {
            problems.push(format!("{t}: clean and idle but not released"));
        } else {
            if d.state.join("workspaces").join(t).exists() {
                problems.push(format!("{t}: upper layer left after the sweep"));
            }
            if is_mounted(&mount(t)) {
                problems.push(format!("{t}: still mounted after the sweep"));
            }
            if list_entry(&d, t)["state"] != "released" {
                problems.push(format!("{t}: not listed as released"));
            }
        }
    }
    for t in [
        "dirty-after",
        "dirty-never",
        "dirty-commit",
        "dirty-passthrough",
        "files-open",
        "busy-cwd",
        "chat",
    ] {
        if released.contains(&t.to_string()) {
            problems.push(format!("{t}: RELEASED by the sweep (unsaved or in use)"));
        } else if !kept.contains_key(t) && t != "chat" {
            problems.push(format!("{t}: neither released nor reported as kept"));
        }
        if !released.contains(&t.to_string()) && !is_mounted(&mount(t)) {
            problems.push(format!("{t}: kept but no longer mounted"));
        }
    }
    // What a swept dirty workspace would have lost: the passthrough write must be saved by release.
    if !released.contains(&"dirty-passthrough".to_string()) {
        let out = d.cli_ok(["release", "dirty-passthrough"]);
        let s = list_entry(&d, "dirty-passthrough")["last_snapshot"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let content = git_out(&d.mirror("p"), &["cat-file", "-p", &format!("{s}:a.txt")]);
        if content.stdout_str().trim() != "OMEGA" {
            problems.push(format!(
                "dirty-passthrough: release ({}) saved {s} with a.txt = {:?}, expected OMEGA",
                out.trim(),
                content.stdout_str().trim()
            ));
        }
    }
    drop(held);
    drop(sleeper);
    assert!(
        problems.is_empty(),
        "sweep --idle 0: {v}\n{}\n--- daemon log ---\n{}",
        problems.join("\n"),
        d.log_tail()
    );
    // Once the file is closed and the process gone, those (saved) workspaces go too; dirty ones stay.
    // The kernel sends a closed file's RELEASE asynchronously, so the daemon may learn of the close
    // a moment after `close` returned: sweep again until both went (each sweep is checked).
    let mut released = String::new();
    let mut sweeps = Vec::new();
    wait_until(
        "the second sweep releasing files-open and busy-cwd",
        Duration::from_secs(10),
        || {
            let v = parse_json(
                "sweep --json",
                &d.cli_ok(["sweep", "--idle", "0", "--json"]),
            );
            released.push_str(&v["released"].to_string());
            sweeps.push(v.to_string());
            released.contains("files-open") && released.contains("busy-cwd")
        },
    );
    for t in ["dirty-after", "dirty-never", "dirty-commit", "chat"] {
        assert!(
            !released.contains(t),
            "a later sweep released {t}: {sweeps:?}"
        );
        assert!(is_mounted(&mount(t)), "{t} unmounted by a later sweep");
    }
    // A sweep with a long window releases nothing.
    d.cli_ok(["snapshot", "dirty-after"]);
    let v = parse_json(
        "sweep --json",
        &d.cli_ok(["sweep", "--idle", "30m", "--json"]),
    );
    assert_eq!(
        v["released"],
        serde_json::json!([]),
        "sweep --idle 30m: {v}"
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Binding and chat

#[test]
fn binding_is_once_and_chat_workspaces_are_thrown_away() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    add_project(&d, "q", &[("other.txt", "other project\n", 0o644)]);
    let t = "bound";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("edit", move || {
        write_file(&w.join("mine.txt"), b"mine\n", 0o644)
    });
    let listing = work_listing(&ws, &[]);
    let st = status(&d, t);
    let binding = fs::read(d.state.join("threads").join(format!("{t}.json"))).ok();
    let out = d.cli(["open", t, "--project", "q"]);
    out.assert_one_line_error(&["bound", "p"]);
    assert_eq!(status(&d, t), st, "a refused re-bind changed the status");
    assert_same_listing("a refused re-bind", &listing, &work_listing(&ws, &[]));
    assert_eq!(
        fs::read(d.state.join("threads").join(format!("{t}.json"))).ok(),
        binding
    );
    // Released, it is still bound.
    d.cli_ok(["release", t]);
    let out = d.cli(["open", t, "--project", "q"]);
    out.assert_one_line_error(&["bound"]);
    assert!(!d.mount(t).exists() && !is_mounted(&d.mount(t)));
    assert_eq!(list_entry(&d, t)["state"], "released");
    // Same project, or none, resumes it.
    let ws = d.open_thread(t, &["--project", "p"]);
    assert_eq!(read_ws(&ws.join("mine.txt")).unwrap(), b"mine\n");
    d.cli_ok(["release", t]);

    // Chat: an empty, writable repository, never saved, discarded on release.
    let c = "chatty";
    let ws = d.open_thread(c, &[]);
    let st = status(&d, c);
    assert_eq!(st["chat"], true, "{st}");
    let names: Vec<String> = fsop("list chat", {
        let w = ws.clone();
        move || {
            fs::read_dir(&w)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        }
    });
    assert_eq!(names, vec![".git".to_string()], "a chat workspace is empty");
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    let w = ws.clone();
    fsop("write in chat", move || {
        write_file(&w.join("notes.txt"), b"notes\n", 0o644)
    });
    g(&ws, &["add", "notes.txt"]);
    g(&ws, &["commit", "-q", "-m", "chat commit"]);
    let out = d.cli(["snapshot", c]);
    out.assert_one_line_error(&["chat"]);
    let out = d.cli(["open", c, "--project", "p"]);
    out.assert_one_line_error(&["chat"]);
    d.cli_ok(["release", c]);
    assert!(!d.state.join("workspaces").join(c).exists());
    assert!(!is_mounted(&ws));
    let ws = d.open_thread(c, &[]);
    assert!(
        !exists_ws(&ws.join("notes.txt")),
        "a chat workspace came back with its old files"
    );
    assert_eq!(
        g(&ws, &["log", "--format=%s"]),
        "octofs: blank repository for chat workspaces"
    );
    d.cli_ok(["release", c]);
}

/// Builds a repository of `n` small files with one `git fast-import`, checked out.
fn generated_repo(path: &Path, n: usize) -> GitRepo {
    let repo = GitRepo::init(path);
    let mut stream = Vec::new();
    let msg = "generated\n";
    stream.extend_from_slice(
        format!(
            "commit refs/heads/main\ncommitter Octo Test <octo@example.invalid> 1609459200 +0000\ndata {}\n{msg}\n",
            msg.len()
        )
        .as_bytes(),
    );
    for i in 0..n {
        let content = format!("file {i}\n{}\n", "x".repeat(i % 200));
        stream.extend_from_slice(
            format!(
                "M 100644 inline d{:03}/s{}/f{i}.txt\ndata {}\n{content}\n",
                i / 100,
                i % 7,
                content.len()
            )
            .as_bytes(),
        );
    }
    stream.extend_from_slice(b"done\n");
    fast_import(path, &stream, CMD_TIMEOUT);
    repo.git(["checkout", "-q", "-f", "main"]);
    repo
}

#[test]
fn resume_of_a_released_thread_is_o1() {
    let d = Daemon::start();
    let n = 3000;
    let repo = generated_repo(&d.base.join("big"), n);
    d.cli_ok(["mirror", "add", "big", repo.path.to_str().unwrap()]);
    let t0 = Instant::now();
    let ws = d.open_thread("fresh", &["--project", "big"]);
    let fresh = t0.elapsed();
    let w = ws.clone();
    fsop("edit", move || {
        append(&w.join("d000/s0/f0.txt"), "changed\n");
        fs::remove_file(w.join("d001/s3/f101.txt")).unwrap();
        write_file(&w.join("new.txt"), b"new\n", 0o644);
    });
    let t0 = Instant::now();
    let s = d.snapshot_id("fresh");
    let snap_t = t0.elapsed();
    d.cli_ok(["release", "fresh"]);
    let mut resumes = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        let ws = d.open_thread("fresh", &[]);
        resumes.push(t0.elapsed());
        assert_eq!(
            read_ws(&ws.join("new.txt")).unwrap(),
            b"new\n",
            "resumed workspace lacks its untracked file"
        );
        assert_eq!(g(&ws, &["rev-parse", "refs/octomate/saved"]), s);
        d.cli_ok(["release", "fresh"]);
    }
    eprintln!(
        "resume timing ({n} files, debug build, CLI wall time): fresh open {fresh:?}, snapshot \
         (3 changes) {snap_t:?}, open of the released thread {resumes:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Faults

#[test]
fn snapshot_faults_unknown_thread_and_lost_cas() {
    let d = Daemon::start();
    let up = add_project(&d, "p", FILES);
    let out = d.cli(["snapshot", "nobody"]);
    out.assert_one_line_error(&["unknown thread"]);
    assert!(!d.state.join("workspaces").join("nobody").exists());

    let t = "cas";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("edit", move || append(&w.join("a.txt"), "one\n"));
    let s1 = d.snapshot_id(t);
    let mirror = d.mirror("p");
    let tref = format!("refs/octomate/threads/{t}");
    // Behind octofs's back, the thread's ref moves to another commit.
    let other = up.head();
    g(&mirror, &["update-ref", &tref, &other, &s1]);
    let w = ws.clone();
    fsop("edit", move || append(&w.join("a.txt"), "two\n"));
    let listing = work_listing(&ws, &[]);
    let out = d.cli(["snapshot", t]);
    let now = g(&mirror, &["rev-parse", &tref]);
    assert!(
        !out.success() && now == other,
        "snapshot after {tref} moved behind octofs's back (from {s1} to {other}) must fail and \
         leave the ref alone; got ref {now} (parents {:?}) and {}\n--- daemon log ---\n{}",
        parents_of(&mirror, &now),
        out.describe(),
        d.log_tail()
    );
    out.assert_one_line_error(&[&tref]);
    assert_eq!(
        g(&ws, &["rev-parse", "refs/octomate/saved"]),
        s1,
        "a failed snapshot moved refs/octomate/saved"
    );
    assert_same_listing("a failed snapshot", &listing, &work_listing(&ws, &[]));
    // Release must not drop the unsaved work either.
    let out = d.cli(["release", t]);
    out.assert_failed();
    assert!(is_mounted(&ws) && d.state.join("workspaces").join(t).is_dir());
}

/// After a SIGKILL: lazily unmounts the dead mount (clearing it without help is
/// `faults.rs`'s `serve_clears_a_dead_mount_left_by_sigkill`), starts a daemon and waits for the
/// remount.
#[track_caller]
fn restart(d: &mut Daemon, mount: &Path) {
    run(
        Command::new("umount").arg("-l").arg(mount),
        Duration::from_secs(10),
    )
    .assert_ok();
    d.spawn();
    wait_mounted(&[mount.to_path_buf()], Duration::from_secs(10));
}

#[test]
fn sigkill_around_snapshots_never_leaves_a_ref_to_a_missing_object() {
    let mut d = Daemon::start();
    add_project(&d, "p", FILES);
    let t = "crash";
    let ws = d.open_thread(t, &["--project", "p"]);
    let mirror = d.mirror("p");
    let tref = format!("refs/octomate/threads/{t}");
    let edit = |round: usize| {
        let w = ws.clone();
        fsop("edits", move || {
            for i in 0..150 {
                write_file(
                    &w.join(format!("gen/r{round}/f{i}.txt")),
                    format!("round {round} file {i}\n").repeat(50).as_bytes(),
                    0o644,
                );
            }
        });
    };
    let check = |what: &str| -> Option<String> {
        let out = git_out(&mirror, &["rev-parse", "--verify", "-q", &tref]);
        let r = out.stdout_str().trim().to_string();
        if !r.is_empty() {
            g(&mirror, &["cat-file", "-e", &format!("{r}^{{commit}}")]);
            g(&mirror, &["cat-file", "-e", &format!("{r}^{{tree}}")]);
        }
        assert_fsck_clean(&mirror, what);
        (!r.is_empty()).then_some(r)
    };

    // Right after a snapshot returns.
    edit(0);
    let s = d.snapshot_id(t);
    d.kill9();
    assert_eq!(
        check("SIGKILL right after a snapshot").as_deref(),
        Some(s.as_str())
    );
    restart(&mut d, &ws);

    // How long a snapshot takes here, right after a restart, so that the kills below land before,
    // inside and after the ref update.
    edit(1);
    let t0 = Instant::now();
    d.snapshot_id(t);
    let took = t0.elapsed();
    d.kill9();
    check("SIGKILL after a timed snapshot");
    restart(&mut d, &ws);

    // During snapshots (raw socket requests: a CLI could auto-start a daemon we do not own).
    let mut outcomes = Vec::new();
    for (round, percent) in [(2, 10u32), (3, 40), (4, 80), (5, 150), (6, 300)] {
        let delay_ms = (took * percent / 100).as_millis();
        edit(round);
        let before = check("before the kill");
        let sock = d.socket();
        let req = format!("{{\"cmd\":\"snapshot\",\"thread\":\"{t}\"}}");
        let asker = std::thread::spawn(move || raw_request(&sock, &req, Duration::from_secs(20)));
        std::thread::sleep(took * percent / 100);
        d.kill9();
        let answer = asker.join().unwrap();
        let after = check(&format!("SIGKILL {delay_ms} ms into a snapshot"));
        outcomes.push(format!(
            "{delay_ms} ms: answer {:?}, ref {} -> {}",
            answer
                .as_ref()
                .map(|a| a.trim().chars().take(80).collect::<String>()),
            before.as_deref().unwrap_or("-"),
            after.as_deref().unwrap_or("-")
        ));
        if let Some(a) = &after
            && Some(a) != before.as_ref()
        {
            assert_eq!(
                parents_of(&mirror, a).get(1),
                before.as_ref(),
                "a snapshot written during a crash does not follow the previous one"
            );
        }
        restart(&mut d, &ws);
    }
    eprintln!("kill during snapshot (an undisturbed one took {took:?}): {outcomes:#?}");
    // After all that, snapshots work and see everything.
    let s = d.snapshot_id(t);
    let files = g(&mirror, &["ls-tree", "-r", "--name-only", &s]);
    assert_eq!(
        files.lines().filter(|l| l.starts_with("gen/")).count(),
        7 * 150
    );
    check("final");
    d.cli_ok(["release", t]);
}

/// Catches: a thread whose snapshots moved its ref twice in a row without the workspace recording
/// either (the daemon killed both times between the ref's compare-and-swap and the saved mark; the
/// SIGKILL test above hit it now and then) refusing every later snapshot as "moved underneath";
/// and the other way round, a ref someone else moved being overwritten.
#[test]
fn snapshots_whose_marks_were_lost_in_a_row_are_the_threads_own() {
    let mut d = Daemon::start();
    add_project(&d, "p", FILES);
    let t = "lost";
    let ws = d.open_thread(t, &["--project", "p"]);
    let mirror = d.mirror("p");
    let tref = format!("refs/octomate/threads/{t}");
    let write = |name: &str| {
        let w = ws.join(name);
        fsop("write", move || write_file(&w, b"x\n", 0o644));
    };
    write("one.txt");
    let s1 = d.snapshot_id(t);
    write("two.txt");
    let s2 = d.snapshot_id(t);
    write("three.txt");
    let s3 = d.snapshot_id(t);
    d.stop();
    // What a daemon that died right after moving the ref for s2, and again for s3, leaves: a
    // record that still names s1.
    let record = d.state.join(format!("workspaces/{t}/workspace.json"));
    let mut v: serde_json::Value = parse_json("record", &fs::read_to_string(&record).unwrap());
    assert_eq!(v["saved"]["commit"].as_str(), Some(s3.as_str()));
    v["saved"]["commit"] = serde_json::Value::String(s1.clone());
    fs::write(&record, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    d.spawn();
    wait_mounted(std::slice::from_ref(&ws), Duration::from_secs(10));
    write("four.txt");
    let s4 = d.snapshot_id(t);
    assert_eq!(g(&mirror, &["rev-parse", &format!("{s4}^2")]).trim(), s3);
    assert_eq!(g(&mirror, &["rev-parse", &format!("{s3}^2")]).trim(), s2);
    let files = g(&mirror, &["ls-tree", "--name-only", &s4]);
    for f in ["one.txt", "two.txt", "three.txt", "four.txt"] {
        assert!(
            files.lines().any(|l| l == f),
            "{f} missing from {s4}: {files}"
        );
    }

    // A ref moved by something else (here: to the base's commit) is still never overwritten.
    let base = g(&mirror, &["rev-parse", &format!("{s4}^1")])
        .trim()
        .to_string();
    g(&mirror, &["update-ref", &tref, &base]);
    write("five.txt");
    let out = d.cli(["snapshot", t]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("moved underneath"),
        "{}",
        out.describe()
    );
    assert_eq!(g(&mirror, &["rev-parse", &tref]).trim(), base);
    g(&mirror, &["update-ref", &tref, &s4]);
    d.cli_ok(["release", t]);
}

// ---------------------------------------------------------------------------------------------
// 7. diff

#[test]
fn diff_against_base_saved_and_between_snapshots() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let mirror = d.mirror("p");
    let t = "differ";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("edits before the snapshot", move || {
        append(&w.join("a.txt"), "alpha edit\n");
        fs::remove_file(w.join("b.txt")).unwrap();
        write_file(&w.join("n1.txt"), b"n1\n", 0o644);
        write_file(&w.join("ignored.log"), b"not part of any diff\n", 0o644);
    });
    let s1 = d.snapshot_id(t);
    let w = ws.clone();
    fsop("edits after the snapshot", move || {
        append(&w.join("c.txt"), "added line\n");
        write_file(&w.join("n2.txt"), b"n2\n", 0o644);
        chmod(&w.join("tool.sh"), 0o755);
    });
    let lines = |s: String| -> Vec<String> {
        s.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    };
    assert_eq!(
        lines(d.cli_ok(["diff", t])),
        vec![
            "M a.txt",
            "D b.txt",
            "M c.txt",
            "A n1.txt",
            "A n2.txt",
            "M tool.sh"
        ],
        "diff <t>: everything since the base"
    );
    assert_eq!(
        lines(d.cli_ok(["diff", t, "--from", "saved"])),
        vec!["M c.txt", "A n2.txt", "M tool.sh"],
        "diff <t> --from saved: only the edits since the snapshot"
    );
    let patch = d.cli_ok(["diff", t, "--from", "saved", "--patch"]);
    for needle in [
        "diff --git a/c.txt b/c.txt",
        "+added line",
        "diff --git a/n2.txt b/n2.txt",
        "new mode 100755",
    ] {
        assert!(patch.contains(needle), "--patch lacks {needle:?}:\n{patch}");
    }
    let s2 = d.snapshot_id(t);
    let ours = lines(d.cli_ok(["diff", t, "--from", &s1, "--to", &s2]));
    let git = lines(g(&mirror, &["diff-tree", "-r", "--name-status", &s1, &s2]));
    assert_eq!(ours, git, "diff --from s1 --to s2 vs git diff-tree");
    assert_eq!(
        lines(d.cli_ok(["diff", t, "--from", "saved"])),
        Vec::<String>::new(),
        "nothing changed since the second snapshot"
    );
    // Released: diff between snapshots still works.
    d.cli_ok(["release", t]);
    assert_eq!(
        lines(d.cli_ok(["diff", t, "--from", &s1, "--to", &s2])),
        git
    );
}

/// A new thread's binding is saved while its workspace is made: when the workspace cannot be made
/// (here its mount point is not empty), neither is left, and the thread opens later as new. Fails
/// if the binding written alongside were kept (the thread would then read as released).
#[test]
fn a_first_open_that_fails_leaves_no_binding() {
    let d = Daemon::start();
    add_project(&d, "p", FILES);
    let t = "unmade";
    let mp = d.mount(t);
    fs::create_dir_all(&mp).unwrap();
    fs::write(mp.join("in-the-way"), b"x").unwrap();
    let out = d.cli(["open", t, "--project", "p"]);
    out.assert_one_line_error(&["not empty"]);
    assert!(
        !d.state.join("threads").join(format!("{t}.json")).exists(),
        "a failed first open left the thread bound"
    );
    assert!(!d.state.join("workspaces").join(t).exists());
    fs::remove_file(mp.join("in-the-way")).unwrap();
    let ws = d.open_thread(t, &["--project", "p"]);
    assert!(exists_ws(&ws.join("src/lib.rs")));
    assert!(d.state.join("threads").join(format!("{t}.json")).exists());
    d.cli_ok(["release", t]);
}

/// An acknowledged `open` of a new thread survives SIGKILL of the daemon right after it answers:
/// the next daemon serves the thread again, bound to its project at the same base, with its `.git`
/// (the catalog's seed batch), its binding and its record as `open` left them. Fails if any of the
/// durable writes of a new workspace (catalog batch, record, binding) is not in place before the
/// answer.
#[test]
fn an_acknowledged_open_survives_sigkill_right_after_it() {
    let mut d = Daemon::start();
    let repo = add_project(&d, "p", FILES);
    let base = g(&repo.path, &["rev-parse", "HEAD"]);
    let t = "killed-after-open";
    let ws = d.open_thread(t, &["--project", "p"]);
    d.kill9();
    let binding = d.state.join("threads").join(format!("{t}.json"));
    let record = d.state.join("workspaces").join(t).join("workspace.json");
    assert!(
        binding.exists() && record.exists(),
        "binding or record missing"
    );
    d.spawn();
    wait_mounted(std::slice::from_ref(&ws), Duration::from_secs(10));
    let st = status(&d, t);
    assert_eq!(st["project"], "p", "{st}");
    assert_eq!(st["base_commit"], base.as_str(), "{st}");
    assert_eq!(st["mounted"], true, "{st}");
    assert_eq!(st["users"], 1, "{st}");
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), base);
    assert_eq!(
        g(&ws, &["symbolic-ref", "HEAD"]),
        format!("refs/heads/octofs/{t}")
    );
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    assert_eq!(read_ws(&ws.join("src/lib.rs")).unwrap(), b"pub fn f() {}\n");
    // Still bound: another project is refused, the same one is the live workspace.
    let out = d.cli(["open", t, "--project", "q"]);
    out.assert_one_line_error(&["bound", "p"]);
    assert_eq!(d.open_thread(t, &["--project", "p"]), ws);
    d.cli_ok(["release", t]);
    d.cli_ok(["release", t]);
    assert!(!is_mounted(&ws));
    d.stop();
}

/// A create the daemon did not finish leaves a workspace directory without a record (the record,
/// renamed in last, is what makes the workspace exist): the next `open` of the thread makes it
/// from its base again, with an empty upper layer. Simulated by removing the record and binding
/// of a stopped workspace that holds a file. Fails if the upper layer left behind is reused (its
/// file would show in the new fork, its stale `.git` kept).
#[test]
fn an_interrupted_create_is_made_again_from_the_base() {
    let mut d = Daemon::start();
    add_project(&d, "p", FILES);
    let t = "half-made";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("write", move || {
        write_file(
            &w.join("leftover.txt"),
            b"from the old upper layer\n",
            0o644,
        )
    });
    d.stop();
    fs::remove_file(d.state.join("workspaces").join(t).join("workspace.json")).unwrap();
    fs::remove_file(d.state.join("threads").join(format!("{t}.json"))).unwrap();
    assert!(d.state.join("workspaces").join(t).join("upper").exists());
    d.spawn();
    assert!(!is_mounted(&ws), "a workspace without a record was served");
    let ws = d.open_thread(t, &["--project", "p"]);
    assert!(
        !exists_ws(&ws.join("leftover.txt")),
        "the interrupted create's upper layer was reused"
    );
    assert_eq!(read_ws(&ws.join("a.txt")).unwrap(), b"alpha\n");
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    d.cli_ok(["release", t]);
    d.stop();
}

/// Every fsync entry of a workspace — a file handle's (base or copied up) and fsyncdir's (the
/// core's `sync_catalog`) — waits for the background sync of the workspace's creation, and fails
/// with EIO, every time, when that sync failed. Driven on the core without a kernel, the sync
/// held back by hand. Fails if an fsync returns before the barrier is finished (skips it), or
/// answers success after a failed one.
#[test]
fn every_fsync_in_a_new_workspace_waits_for_its_background_sync() {
    use octofs::fs::handles::Handles;
    use octofs::fs::{Durable, ROOT_INO};
    use std::sync::{Arc, mpsc};

    let (_tmp, core) = common::core_of_files(&[("f.txt", "base content\n"), ("g.txt", "g\n")]);
    let core = Arc::new(core);
    let handles: Handles<u32> = Handles::new(core.clone());
    let ino = |name: &str| {
        core.lookup(ROOT_INO, std::ffi::OsStr::new(name))
            .expect("lookup")
            .ino
            .0
    };
    let none = None::<fn(&fs::File) -> std::io::Result<u32>>;
    let base_fh = handles
        .open(ino("f.txt"), libc::O_RDONLY, none)
        .expect("open ro")
        .fh;
    let upper = handles
        .open(ino("g.txt"), libc::O_RDWR, none)
        .expect("open rw");
    assert!(upper.upper, "a read-write open copies up");

    let barrier = Durable::pending();
    core.durable_after(barrier.clone());
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        for which in 0..3 {
            let (tx, handles, core) = (tx.clone(), &handles, &core);
            s.spawn(move || {
                let r = match which {
                    0 => handles.fsync(base_fh, false),
                    1 => handles.fsync(upper.fh, true),
                    _ => core.sync_catalog(),
                };
                let _ = tx.send((which, r));
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            rx.try_recv().is_err(),
            "an fsync returned before the workspace's creation was durable"
        );
        assert!(!barrier.is_finished());
        barrier.finish(Ok(()));
        for _ in 0..3 {
            let (which, r) = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("the fsync returns once the barrier is finished");
            assert_eq!(r, Ok(()), "fsync entry {which}");
        }
    });
    // Done with: later fsyncs do not wait.
    assert_eq!(core.sync_catalog(), Ok(()));

    // A background sync that failed: every fsync fails with EIO, and keeps failing.
    let failed = Durable::pending();
    core.durable_after(failed.clone());
    failed.finish(Err("the state disk went away".into()));
    for _ in 0..2 {
        let e = handles
            .fsync(upper.fh, false)
            .expect_err("fsync after a failed sync");
        assert_eq!(e.errno, fuser::Errno::EIO, "{e}");
        assert!(e.to_string().contains("the state disk went away"), "{e}");
        assert_eq!(
            core.sync_catalog().expect_err("fsyncdir").errno,
            fuser::Errno::EIO
        );
    }
}

/// `open` of a new thread answers before its background sync, and an fsync in the new workspace
/// does not return before that sync has run. The sync is held back 5 s by the debug builds' fault
/// file `<state>/faults/open-sync-delay-ms`. Fails if `open` waits for the sync (the old
/// synchronous open), or if the daemon gives the workspace no barrier (the fsync returns at once).
#[test]
fn open_answers_before_its_sync_and_an_fsync_in_it_waits_for_the_sync() {
    const DELAY: Duration = Duration::from_secs(5);
    let mut d = Daemon::start();
    add_project(&d, "p", FILES);
    let faults = d.state.join("faults");
    fs::create_dir_all(&faults).unwrap();
    fs::write(
        faults.join("open-sync-delay-ms"),
        DELAY.as_millis().to_string(),
    )
    .unwrap();
    let t = "held-sync";
    let started = Instant::now();
    let ws = d.open_thread(t, &["--project", "p"]);
    let opened = started.elapsed();
    let w = ws.clone();
    fsop("write and fsync", move || {
        let mut f = fs::File::create(w.join("durable.txt")).unwrap();
        f.write_all(b"synced\n").unwrap();
        f.sync_all().unwrap();
    });
    let synced = started.elapsed();
    eprintln!("open answered after {opened:?}, the fsync after {synced:?}");
    assert!(
        synced >= DELAY,
        "an fsync returned {synced:?} after the open began, before the workspace's sync ({DELAY:?})"
    );
    assert!(opened < DELAY, "open waited for its sync: {opened:?}");
    fs::remove_file(faults.join("open-sync-delay-ms")).unwrap();
    assert!(
        d.log_text().contains("the new workspace is durable"),
        "{}",
        d.log_tail()
    );
    d.cli_ok(["release", t]);
    d.stop();
}

/// What a power loss during creates can leave, written by hand while the daemon is stopped (ext4
/// without a journal may persist a rename without the file's bytes): a torn record, an empty
/// record, a record whose catalog lost its seed, a record without its binding, an unreadable
/// binding. The next daemon starts, serves every sound workspace, binds a record without a binding
/// again from it, sets aside (never deletes) the workspaces it cannot trust — each with the file a
/// user wrote in it — and opens those threads again from their base. Fails on the old code: one
/// unreadable record stopped every remount, and a workspace without its seed was served without
/// its `.git`.
#[test]
fn a_start_after_a_power_loss_during_creates_recovers_them() {
    let mut d = Daemon::start();
    add_project(&d, "p", FILES);
    let names = ["torn", "empty", "unseeded", "unbound", "badbind", "sound"];
    for t in names {
        let ws = d.open_thread(t, &["--project", "p"]);
        let w = ws.clone();
        let text = format!("{t}'s own bytes\n");
        fsop("write", move || {
            write_file(&w.join("mine.txt"), text.as_bytes(), 0o644)
        });
    }
    d.stop();
    let state = d.state.clone();
    let wdir = |t: &str| state.join("workspaces").join(t);
    let binding = |t: &str| state.join("threads").join(format!("{t}.json"));
    let rec = wdir("torn").join("workspace.json");
    let bytes = fs::read(&rec).unwrap();
    fs::write(&rec, &bytes[..bytes.len() / 2]).unwrap();
    fs::write(wdir("empty").join("workspace.json"), b"").unwrap();
    let upper = wdir("unseeded").join("upper");
    let _ = fs::remove_file(upper.join("catalog.snap"));
    fs::OpenOptions::new()
        .write(true)
        .open(upper.join("catalog.log"))
        .unwrap()
        .set_len(0)
        .unwrap();
    fs::remove_file(binding("unbound")).unwrap();
    fs::write(binding("badbind"), b"\0\0\0\0\0\0\0\0").unwrap();

    d.spawn();
    let served: Vec<_> = ["unbound", "badbind", "sound"]
        .iter()
        .map(|t| d.mount(t))
        .collect();
    wait_mounted(&served, Duration::from_secs(10));
    for t in ["unbound", "badbind", "sound"] {
        let ws = d.mount(t);
        assert_eq!(
            read_ws(&ws.join("mine.txt")).unwrap(),
            format!("{t}'s own bytes\n").as_bytes()
        );
        assert_eq!(g(&ws, &["status", "--porcelain"]), "?? mine.txt");
        let b = parse_json(t, &fs::read_to_string(binding(t)).unwrap());
        assert_eq!(b["project"], "p", "{t}: {b}");
    }
    let aside: Vec<String> = fs::read_dir(d.state.join("threads"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("badbind.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "the unreadable binding was not set aside");
    let quarantine = d.state.join("quarantine");
    for t in ["torn", "empty", "unseeded"] {
        assert!(!is_mounted(&d.mount(t)), "{t} was served");
        assert!(!wdir(t).exists(), "{t} was left in the workspaces");
        let kept: Vec<_> = fs::read_dir(&quarantine)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{t}."))
            })
            .collect();
        assert_eq!(kept.len(), 1, "{t} was not set aside");
        let mine = format!("{t}'s own bytes\n");
        let holds_it = fs::read_dir(kept[0].path().join("upper").join("data"))
            .unwrap()
            .flatten()
            .any(|f| fs::read(f.path()).is_ok_and(|b| b == mine.as_bytes()));
        assert!(holds_it, "{t}: the user's bytes were not kept");
    }
    let log = d.log_text();
    assert!(log.contains("an interrupted create"), "{}", d.log_tail());
    assert!(
        log.contains("bound again from its record"),
        "{}",
        d.log_tail()
    );
    // Those threads open again (their bindings were sound), from their base.
    for t in ["torn", "empty", "unseeded"] {
        let ws = d.open_thread(t, &[]);
        assert!(!exists_ws(&ws.join("mine.txt")), "{t}");
        assert_eq!(read_ws(&ws.join("a.txt")).unwrap(), b"alpha\n");
        assert_eq!(g(&ws, &["status", "--porcelain"]), "", "{t}");
    }
    for t in names {
        d.cli_ok(["release", t]);
    }
    d.stop();
}
