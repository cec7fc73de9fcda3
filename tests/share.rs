//! Threads that move between hosts through a project's share remote, checked with two daemons on
//! this machine (two state directories and two roots: two hosts), one upstream and a bare share
//! repository:
//!
//! 1. [`a_thread_moves_between_hosts_and_back_byte_identical`]: files, a 755 mode, a symlink, a
//!    deletion, an untracked file, what only the POSIX record holds (a 600 mode, empty
//!    directories) and a commit on a branch of the thread's own go host 1 →
//!    share → host 2 (a host that never saw the thread) and, changed there, back to host 1
//!    (whose own snapshot is an ancestor of the share's): files, modes, symlink targets, HEAD,
//!    branch and `git status --porcelain` identical each time; ignored content stays home.
//!    Then the diverged case: both hosts change the thread independently; the second push to
//!    the share is refused (non-zero exit naming the divergence), the snapshot is kept in the
//!    local mirror, and release still releases.
//! 2. [`nested_repositories_and_refused_names_move_between_hosts`] (issue 30 item 2): a cloned
//!    dependency with changed and untracked files and a branch of its own, a `git init` +
//!    commit in a subdirectory and a `.GIT` directory go host 1 → share → host 2 byte for
//!    byte (their `.git` included), and git says of each nested repository what it said.
//! 3. [`a_thousand_changed_files_move_between_hosts`]: the time of a move (release on host 1 +
//!    open on host 2) of a thread with 1,000 changed files, printed.
//! 4. [`the_repository_behaves_like_the_model`] (issue 30, "the class, not the cases"): generated
//!    sequences of changes and lifecycle steps, in both I/O modes, compared with a model after
//!    every step (`tests/support/repo_model.rs` says what it generates and checks).
//! 5. [`directory_modes_survive_snapshot_restart_release_and_a_move`]: directories of another mode
//!    than a checkout gives that the tree does not hold (empty, holding only an ignored file or a
//!    name git refuses, nested) or holds only for an untracked file keep their mode after a
//!    snapshot and a restart, release + open, and a move to another host, as `stat` sees it.

use crate::common;

#[path = "support/repo_model.rs"]
mod repo_model;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const FS_TIMEOUT: Duration = Duration::from_secs(30);

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE2).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// Runs a shell script in `dir` (a mount), bounded by the command timeout.
#[track_caller]
fn in_ws(dir: &Path, script: &str) {
    run(
        std::process::Command::new("sh")
            .arg("-ec")
            .arg(script)
            .current_dir(dir),
        CMD_TIMEOUT,
    )
    .assert_ok();
}

/// What must be identical on both hosts.
#[derive(Debug, PartialEq)]
struct Moved {
    head: String,
    branch: String,
    status: String,
    files: BTreeMap<String, String>,
}

#[track_caller]
fn capture(mount: &Path) -> Moved {
    let m = mount.to_path_buf();
    let files = with_timeout("list the workspace", FS_TIMEOUT, move || {
        tree_listing(&m)
            .into_iter()
            .filter(|(k, _)| k != ".git" && !k.starts_with(".git/"))
            .collect()
    });
    Moved {
        head: g(mount, &["rev-parse", "HEAD"]),
        branch: g(mount, &["symbolic-ref", "-q", "HEAD"]),
        status: g(mount, &["status", "--porcelain"]),
        files,
    }
}

#[track_caller]
fn assert_moved(what: &str, a: &Moved, b: &Moved) {
    assert_eq!(a.head, b.head, "{what}: HEAD differs");
    assert_eq!(a.branch, b.branch, "{what}: the branch differs");
    assert_eq!(a.status, b.status, "{what}: git status differs");
    assert_same_listing(what, &a.files, &b.files);
}

struct Hosts {
    h1: Daemon,
    h2: Daemon,
    share: PathBuf,
}

/// Two daemons with project `p` of one upstream, sharing to one bare repository.
fn hosts(files: &[(&str, &str)]) -> Hosts {
    let h1 = Daemon::start();
    let h2 = Daemon::start();
    let up = GitRepo::init(&h1.base.join("upstream"));
    for (p, c) in files {
        up.write(p, c);
    }
    up.write(".gitignore", "*.log\n");
    up.commit_all("initial", DATE1);
    let share = h1.base.join("share.git");
    git(&h1.base, ["init", "-q", "--bare", share.to_str().unwrap()]);
    for h in [&h1, &h2] {
        h.cli_ok([
            "mirror",
            "add",
            "p",
            up.path.to_str().unwrap(),
            "--share",
            share.to_str().unwrap(),
        ]);
    }
    let list = h2.cli_ok(["mirror", "list"]);
    assert!(
        list.contains(&format!("share={}", share.display())),
        "mirror list does not show the share: {list}"
    );
    Hosts { h1, h2, share }
}

fn share_tip(share: &Path, thread: &str) -> String {
    g(
        share,
        &[
            "rev-parse",
            "--verify",
            &format!("refs/octomate/threads/{thread}"),
        ],
    )
}

#[test]
fn a_thread_moves_between_hosts_and_back_byte_identical() {
    let Hosts { h1, h2, share } = hosts(&[
        ("README.md", "# demo\n"),
        ("a.txt", "alpha\n"),
        ("b.txt", "bravo\n"),
        ("tool.sh", "#!/bin/sh\necho tool\n"),
        ("src/lib.rs", "pub fn f() {}\n"),
    ]);

    // Host 1: a commit on a branch of its own, then working changes of every kind.
    let m1 = h1.open_thread("a", &["--project", "p"]);
    g(&m1, &["checkout", "-q", "-b", "feature/a"]);
    in_ws(&m1, "printf 'committed\\n' > src/new.rs");
    g(&m1, &["add", "src/new.rs"]);
    g(&m1, &["commit", "-q", "-m", "agent work"]);
    in_ws(
        &m1,
        "printf 'alpha changed\\n' > a.txt\n\
         chmod 755 tool.sh\n\
         ln -s src/lib.rs lib-link\n\
         rm b.txt\n\
         mkdir -p notes && printf 'untracked\\n' > notes/todo.md\n\
         printf 'stays home\\n' > debug.log\n\
         mkdir -p empty/dir\n\
         chmod 600 src/lib.rs",
    );
    let before = capture(&m1);
    assert!(before.status.contains("?? lib-link") && before.status.contains(" D b.txt"));
    h1.cli_ok(["release", "a"]);
    let s1 = share_tip(&share, "a");
    // The POSIX record (the 600 mode, the empty directories) travels with it.
    g(&share, &["rev-parse", "--verify", "refs/octomate/posix/a"]);

    // Host 2 never saw the thread: it resumes from the share.
    let m2 = h2.open_thread("a", &["--project", "p"]);
    let mut arrived = capture(&m2);
    assert!(
        arrived.files.remove("debug.log").is_none(),
        "ignored content travelled"
    );
    let mut expected = before;
    expected.files.remove("debug.log");
    assert_moved("host 1 -> host 2", &expected, &arrived);
    assert_eq!(
        g(&h2.mirror("p"), &["rev-parse", "refs/octomate/threads/a"]),
        s1
    );

    // Changed on host 2, released, back on host 1 (its own snapshot is an ancestor).
    in_ws(
        &m2,
        "printf 'from host 2\\n' >> README.md\nrm a.txt\nprintf 'two\\n' > notes/host2.md",
    );
    let changed = capture(&m2);
    h2.cli_ok(["release", "a"]);
    let s2 = share_tip(&share, "a");
    assert_ne!(s1, s2);
    assert_eq!(g(&share, &["rev-parse", &format!("{s2}^2")]), s1);
    let m1 = h1.open_thread("a", &[]);
    assert_moved("host 2 -> host 1", &changed, &capture(&m1));
    let back = capture(&m1);
    assert_eq!(back.branch, "refs/heads/feature/a");

    // Diverged: host 2 moves on through the share while host 1 keeps working.
    let m2 = h2.open_thread("a", &[]);
    in_ws(&m2, "printf 'host 2 again\\n' > c.txt");
    h2.cli_ok(["release", "a"]);
    let s3 = share_tip(&share, "a");
    in_ws(&m1, "printf 'host 1 alone\\n' > d.txt");
    let out = h1.cli(["snapshot", "a"]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains("diverged") && err.contains("not shared") && err.trim().lines().count() == 1,
        "{}",
        out.describe()
    );
    let local = g(&h1.mirror("p"), &["rev-parse", "refs/octomate/threads/a"]);
    assert_ne!(local, s3);
    assert_eq!(
        g(&h1.mirror("p"), &["show", &format!("{local}:d.txt")]),
        "host 1 alone"
    );
    assert_eq!(share_tip(&share, "a"), s3, "the share was overwritten");
    // Release still releases (the refusal is a warning and a log line).
    let out = h1.cli(["release", "a"]);
    out.assert_ok();
    assert!(
        out.stderr_str().contains("not shared"),
        "{}",
        out.describe()
    );
    assert!(h1.log_text().contains("not shared"));
    assert_eq!(share_tip(&share, "a"), s3);
}

/// What git says of the nested repository at `dir`: status, every ref's log, every ref.
fn nested_says(dir: &Path) -> String {
    format!(
        "{}\n{}\n{}",
        g(dir, &["status", "--porcelain", "--untracked-files=all"]),
        g(dir, &["log", "--all", "--format=%H %s"]),
        g(dir, &["for-each-ref"])
    )
}

#[test]
fn nested_repositories_and_refused_names_move_between_hosts() {
    let Hosts { h1, h2, share } = hosts(&[("README.md", "# demo\n"), ("a.txt", "alpha\n")]);
    let up = h1.base.join("upstream");
    let m1 = h1.open_thread("n", &["--project", "p"]);
    in_ws(
        &m1,
        &format!(
            "git clone -q file://{} vend\n\
             printf 'changed\\n' > vend/a.txt\n\
             printf 'untracked\\n' > vend/new.txt\n\
             git -C vend branch side\n\
             mkdir -p tools/sub && cd tools/sub && git init -q && printf 'x\\n' > x.txt\n\
             git add x.txt && git -c user.name=a -c user.email=a@b commit -q -m one\n\
             printf 'y\\n' > x.txt\n\
             cd ../..\n\
             mkdir .GIT && printf 'refused\\n' > .GIT/config && chmod 600 .GIT/config",
            up.display()
        ),
    );
    // git may refresh an index as it answers: asked first, then the files are listed.
    let says: Vec<String> = ["vend", "tools/sub"]
        .iter()
        .map(|r| nested_says(&m1.join(r)))
        .collect();
    let before = capture(&m1);
    assert!(
        before.files.contains_key("vend/.git/HEAD") && before.files.contains_key(".GIT/config"),
        "{:?}",
        before.files.keys().collect::<Vec<_>>()
    );
    h1.cli_ok(["release", "n"]);
    g(&share, &["rev-parse", "--verify", "refs/octomate/kept/n"]);

    let m2 = h2.open_thread("n", &["--project", "p"]);
    let arrived = capture(&m2);
    assert_moved("host 1 -> host 2", &before, &arrived);
    let now: Vec<String> = ["vend", "tools/sub"]
        .iter()
        .map(|r| nested_says(&m2.join(r)))
        .collect();
    assert_eq!(
        now, says,
        "git says otherwise of the nested repositories on host 2"
    );
    h2.cli_ok(["release", "n"]);
}

#[test]
fn a_thousand_changed_files_move_between_hosts() {
    let files: Vec<(String, String)> = (0..2000)
        .map(|i| (format!("d{}/f{i}.txt", i % 40), format!("file {i}\n")))
        .collect();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let Hosts { h1, h2, share } = hosts(&refs);
    let m1 = h1.open_thread("big", &["--project", "p"]);
    in_ws(
        &m1,
        "i=0; while [ $i -lt 1000 ]; do printf 'changed %s\\n' $i > d$((i % 40))/f$i.txt; i=$((i+1)); done",
    );
    let before = capture(&m1);
    let t = Instant::now();
    h1.cli_ok_within(["release", "big"], Duration::from_secs(120));
    let released = t.elapsed();
    let t = Instant::now();
    let out = run(
        h2.command().args(["open", "big", "--project", "p"]),
        Duration::from_secs(120),
    );
    out.assert_ok();
    let opened = t.elapsed();
    let m2 = PathBuf::from(out.stdout_str().trim());
    assert_moved("1,000 changed files", &before, &capture(&m2));
    assert!(!share_tip(&share, "big").is_empty());
    println!(
        "move of a thread with 1,000 changed files: release+share on host 1 {} ms, open from the share on host 2 {} ms, total {} ms",
        released.as_millis(),
        opened.as_millis(),
        (released + opened).as_millis()
    );
    // The share's part of it, as the daemons logged it.
    for line in h1.log_text().lines().chain(h2.log_text().lines()) {
        if line.contains("snapshot")
            || line.contains("resuming from the share")
            || line.contains("released")
            || line.contains("mounted")
        {
            println!("{line}");
        }
    }
    h2.cli_ok(["release", "big"]);
}

/// A share holds every user's threads: on a host that has not seen a thread, only its owner (by
/// user name) or root may open it from the share, and root opens it for that owner. Fails on a
/// share that hands a thread to whoever asks first (the old `open`).
#[test]
fn a_shared_thread_opens_only_for_its_owner() {
    use std::os::unix::fs::MetadataExt;
    let Hosts { h1, h2, share } = hosts(&[("a.txt", "alpha\n")]);
    let (a, b) = (user_a(), user_b());
    for h in [&h1, &h2] {
        h.cli_ok([
            "mirror",
            "access",
            "p",
            "--allow-user",
            "octofs-test-user",
            "--allow-user",
            "octofs-test-other",
        ]);
    }
    // User a works on two threads on host 1 and releases them: both are on the share.
    for t in ["mine", "theirs"] {
        let out = h1.cli_as(a, &["open", t, "--project", "p"]);
        out.assert_ok();
        let m = PathBuf::from(out.stdout_str().trim());
        let mut w = as_user(a, "sh");
        w.arg("-ec")
            .arg("printf 'secret work of a\\n' > private.txt")
            .current_dir(&m);
        run(&mut w, CMD_TIMEOUT).assert_ok();
        h1.cli_as(a, &["release", t]).assert_ok();
        share_tip(&share, t);
    }

    // User b on host 2 may not take it; nothing on host 2 changes.
    let out = h2.cli_as(b, &["open", "mine", "--project", "p"]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains("belongs to octofs-test-user") && err.trim().lines().count() == 1,
        "{}",
        out.describe()
    );
    assert!(!h2.mount("mine").join("private.txt").exists());
    assert!(
        run(
            git_command(&h2.mirror("p"), DATE2).args([
                "rev-parse",
                "--verify",
                "--quiet",
                "refs/octomate/threads/mine"
            ]),
            CMD_TIMEOUT
        )
        .stdout_str()
        .trim()
        .is_empty(),
        "the refused open filed the thread on host 2"
    );

    // User a may, and gets their work.
    let out = h2.cli_as(a, &["open", "mine", "--project", "p"]);
    out.assert_ok();
    let m = PathBuf::from(out.stdout_str().trim());
    let mut r = as_user(a, "cat");
    r.arg(m.join("private.txt"));
    assert_eq!(run(&mut r, CMD_TIMEOUT).stdout_str(), "secret work of a\n");
    h2.cli_as(a, &["release", "mine"]).assert_ok();

    // Root (an orchestrator) opens the other one: it is a's on host 2 too, so b still may not.
    let m = h2.open_thread("theirs", &["--project", "p"]);
    let uid = with_timeout("stat the mount", FS_TIMEOUT, move || {
        std::fs::metadata(&m).unwrap().uid()
    });
    assert_eq!(uid, a.uid, "root's open gave a's thread to someone else");
    let out = h2.cli_as(b, &["open", "theirs"]);
    out.assert_failed();
    h2.cli_ok(["release", "theirs"]);
}

/// What `git` shows of a workspace's repository besides its files (issue 30, item 1).
#[derive(Debug, PartialEq, Clone)]
struct Repository {
    refs: Vec<String>,
    stash: String,
    config: Vec<String>,
    exclude: String,
    logs: Vec<String>,
    head_reflog: String,
}

#[track_caller]
fn repository(mount: &Path) -> Repository {
    let refs: Vec<String> = g(
        mount,
        &[
            "for-each-ref",
            "--format=%(refname) %(objectname) %(*objectname)",
        ],
    )
    .lines()
    // (`refs/octomate/saved` is octofs's mark of the last snapshot.)
    .filter(|l| !l.starts_with("refs/octomate/"))
    .map(str::to_string)
    .collect();
    let logs = refs
        .iter()
        .filter(|r| r.starts_with("refs/heads/") || r.starts_with("refs/tags/"))
        .map(|r| {
            let name = r.split(' ').next().unwrap();
            format!("{name}: {}", g(mount, &["log", "--format=%H %an %s", name]))
        })
        .collect();
    Repository {
        refs,
        stash: g(mount, &["stash", "list", "--format=%H %gd %gs"]),
        config: g(mount, &["config", "--local", "--list"])
            .lines()
            .map(str::to_string)
            .collect(),
        exclude: String::from_utf8(read_ws(&mount.join(".git/info/exclude")).unwrap()).unwrap(),
        logs,
        head_reflog: g(mount, &["reflog", "--format=%H %gs"]),
    }
}

/// The same repository in another workspace: `core.fsmonitor` names that workspace's hook, and
/// the branch HEAD is on there (`own`) is that workspace's.
fn elsewhere(r: &Repository, own: Option<&str>) -> Repository {
    let mut r = r.clone();
    r.config.retain(|l| !l.starts_with("core.fsmonitor="));
    if let Some(own) = own {
        let own = format!("refs/heads/{own} ");
        r.refs.retain(|l| !l.starts_with(&own));
        r.logs.retain(|l| !l.starts_with(&own.replace(' ', ":")));
    }
    r
}

/// Issue 30, item 1: a release keeps the whole repository — other branches (also one made by
/// `git worktree add -b`), a lightweight and an annotated tag, two stashes (one with a staged new
/// file), the agent's config (identity, a remote it added), `.git/info/exclude` and HEAD's reflog —
/// through release and open, fork, teleport and a move to another host through the share, in both
/// I/O modes; `git stash pop` works at the end. Failed before: after release and open only HEAD's
/// branch was there (`refs` differed: no `work`, `side`, tags or `refs/stash`).
#[test]
fn a_release_keeps_the_whole_repository() {
    for io in [&[][..], &["--io", "no-open"][..]] {
        let Hosts { h1, h2, share: _ } = hosts(&[("a.txt", "alpha\n"), ("b.txt", "bravo\n")]);
        let mut args = vec!["--project", "p"];
        args.extend_from_slice(io);
        let m = h1.open_thread("r", &args);
        let outside = h1.base.join("linked");
        g(&m, &["checkout", "-q", "-b", "work"]);
        in_ws(&m, "printf 'work\\n' > w.txt");
        g(&m, &["add", "w.txt"]);
        g(&m, &["commit", "-q", "-m", "on work"]);
        g(&m, &["checkout", "-q", "-b", "side"]);
        in_ws(&m, "printf 'side\\n' > s.txt");
        g(&m, &["add", "s.txt"]);
        g(&m, &["commit", "-q", "-m", "on side"]);
        g(&m, &["tag", "-a", "v-agent", "-m", "an annotated tag"]);
        g(&m, &["tag", "light", "HEAD~1"]);
        g(&m, &["checkout", "-q", "work"]);
        g(
            &m,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                "linked",
                outside.to_str().unwrap(),
            ],
        );
        in_ws(&outside, "printf 'linked\\n' > l.txt");
        g(&outside, &["add", "l.txt"]);
        g(&outside, &["commit", "-q", "-m", "in the linked worktree"]);
        in_ws(&m, "printf 'first stash\\n' > a.txt");
        g(&m, &["stash", "push", "-q", "-m", "first"]);
        in_ws(&m, "printf 'staged\\n' > new.txt");
        g(&m, &["add", "new.txt"]);
        in_ws(&m, "printf 'second stash\\n' > b.txt");
        g(&m, &["stash", "push", "-q", "-m", "second"]);
        g(&m, &["config", "user.name", "Agent Smith"]);
        g(&m, &["config", "user.email", "smith@example.invalid"]);
        g(
            &m,
            &[
                "remote",
                "add",
                "upstream2",
                "https://example.invalid/x.git",
            ],
        );
        in_ws(&m, "printf 'secret.txt\\n' >> .git/info/exclude");
        in_ws(&m, "printf 'uncommitted\\n' > u.txt");
        let before = repository(&m);
        assert_eq!(before.stash.lines().count(), 2, "{before:?}");
        assert!(
            before
                .refs
                .iter()
                .any(|r| r.starts_with("refs/heads/linked "))
        );

        // Release and open: everything, the config byte for byte.
        h1.cli_ok(["release", "r"]);
        let m = h1.open_thread("r", &[]);
        assert_eq!(repository(&m), before, "after release and open ({io:?})");
        assert_eq!(read_ws(&m.join("u.txt")).unwrap(), b"uncommitted\n");

        // Fork and teleport: the same repository (HEAD on the fork's own branch).
        h1.cli_ok(["fork", "r", "r2"]);
        let m2 = h1.mount("r2");
        // (The source's own branch `octofs/r` stays the source's.)
        let carried = elsewhere(&before, Some("octofs/r"));
        assert_eq!(
            elsewhere(&repository(&m2), Some("octofs/r2")),
            carried,
            "after fork ({io:?})"
        );
        h1.cli_ok(["teleport", "r", "r3"]);
        let m3 = h1.mount("r3");
        assert_eq!(
            elsewhere(&repository(&m3), None),
            carried,
            "after teleport ({io:?})"
        );
        assert!(
            g(&m3, &["config", "core.fsmonitor"]).ends_with("fsmonitor-r3"),
            "the teleported config runs another thread's hook"
        );

        // To host 2 through the share; the stash pops there.
        h1.cli_ok(["release", "r"]);
        let m = h2.open_thread("r", &["--project", "p"]);
        assert_eq!(
            elsewhere(&repository(&m), None),
            elsewhere(&before, None),
            "on host 2 ({io:?})"
        );
        g(&m, &["stash", "pop", "-q"]);
        assert_eq!(read_ws(&m.join("b.txt")).unwrap(), b"second stash\n");
        assert_eq!(read_ws(&m.join("new.txt")).unwrap(), b"staged\n");
        assert_eq!(g(&m, &["stash", "list", "--format=%gs"]), "On work: first");
        for (d, t) in [(&h1, "r2"), (&h1, "r3"), (&h2, "r")] {
            d.cli_ok(["release", t]);
        }
    }
}

/// Issue 32, item 4: a thread handed A → B → A. Host B, having opened the thread from the share,
/// continues its named chain (`snapshot --name n --push` files on top of the share's `n` and
/// pushes a fast-forward; before, it said "diverged"); host A, whose live thread is unchanged and
/// merely behind the share, releases saying "behind" and pushes nothing (before: "has diverged …;
/// not overwritten"); opened again, A resumes B's state and continues the same chain.
#[test]
fn a_thread_handed_back_and_forth_continues_its_chains() {
    let Hosts { h1, h2, share } = hosts(&[("a.txt", "alpha\n")]);
    let remote = share.to_str().unwrap();
    let named = |rev: &str| g(&share, &["rev-parse", "--verify", rev]);

    // Host A: work, a named snapshot pushed to the share (the thread's own ref goes there too).
    let m1 = h1.open_thread("t", &["--project", "p"]);
    in_ws(&m1, "printf 'from A\\n' > a.txt");
    h1.cli_ok(["snapshot", "t", "--name", "n", "--push", remote]);
    let n1 = named("refs/snapshots/n");
    let s1 = share_tip(&share, "t");

    // Host B opens it from the share and continues the chain of `n`.
    let m2 = h2.open_thread("t", &["--project", "p"]);
    assert_eq!(g(&m2, &["show", "HEAD:a.txt"]), "alpha");
    in_ws(&m2, "printf 'from B\\n' > b.txt");
    let out = h2.cli(["snapshot", "t", "--name", "n", "--push", remote]);
    assert!(
        out.success() && !out.stderr_str().contains("diverged"),
        "host B cannot continue the chain: {}",
        out.describe()
    );
    let n2 = named("refs/snapshots/n");
    assert_ne!(n2, n1);
    assert_eq!(
        named(&format!("{n2}^2")),
        n1,
        "B's snapshot is not on A's chain"
    );
    assert_eq!(g(&share, &["show", &format!("{n2}:b.txt")]), "from B");
    h2.cli_ok(["release", "t"]);
    let s2 = share_tip(&share, "t");
    assert_ne!(s2, s1);

    // Host A's live thread is unchanged and behind the share: its release says so, pushes
    // nothing, and still releases.
    let out = h1.cli(["release", "t"]);
    out.assert_ok();
    let err = out.stderr_str();
    assert!(
        err.contains("behind") && !err.contains("diverged"),
        "{}",
        out.describe()
    );
    assert_eq!(share_tip(&share, "t"), s2, "A pushed over the share");

    // Opened again, A resumes B's state and continues the chain too.
    let m1 = h1.open_thread("t", &[]);
    assert_eq!(
        std::fs::read_to_string(m1.join("b.txt")).unwrap(),
        "from B\n"
    );
    in_ws(&m1, "printf 'A again\\n' > c.txt");
    let out = h1.cli(["snapshot", "t", "--name", "n", "--push", remote]);
    assert!(out.success(), "{}", out.describe());
    let n3 = named("refs/snapshots/n");
    assert_eq!(named(&format!("{n3}^2")), n2);
    h1.cli_ok(["release", "t"]);
    assert_ne!(share_tip(&share, "t"), s2);
}

/// Issue 30: generated sequences (seeded; `OCTOFS_MODEL_SEED` replays one) of changes made by an
/// ordinary user with real tools and lifecycle steps through the CLI, in both I/O modes, the whole
/// presented tree and what git says compared with the model after every step.
#[test]
fn the_repository_behaves_like_the_model() {
    for io in [&[][..], &["--io", "no-open"][..]] {
        let started = Instant::now();
        let hosts = repo_model::Hosts::new(io);
        let steps = repo_model::run_sequences(&hosts);
        println!(
            "repository model ({io:?}): {steps} steps in {} ms",
            started.elapsed().as_millis()
        );
    }
}

/// What a process started now sees of each of `paths` in `mount`: `stat -c '%a %F'`, or
/// `missing`.
#[track_caller]
fn seen(mount: &Path, paths: &[&str]) -> Vec<(String, String)> {
    paths
        .iter()
        .map(|p| {
            let out = run(
                std::process::Command::new("stat")
                    .args(["-c", "%a %F", "--", p])
                    .current_dir(mount),
                CMD_TIMEOUT,
            );
            let what = if out.success() {
                out.stdout_str().trim().to_string()
            } else {
                "missing".to_string()
            };
            (p.to_string(), what)
        })
        .collect()
}

/// Directories whose mode is not what a checkout gives (0755) and that the snapshot's tree does not
/// hold or holds only for what is in them: empty, holding only an untracked file, only an ignored
/// file, only a name git refuses or only a nested repository without a commit (both kept beside
/// the tree), and nested ones of each. A process started
/// after each step sees every one with its mode: after a snapshot and a restart, after release +
/// open on this host, and after release + open on another host through the share (ignored files
/// stay home; their directory keeps its mode). Seed 0x3b51cfdb of the model test found the refused
/// name's case: the directory came back 0755.
#[test]
fn directory_modes_survive_snapshot_restart_release_and_a_move() {
    let Hosts { h1, h2, share: _ } = hosts(&[("README.md", "# demo\n"), ("a.txt", "alpha\n")]);
    let m1 = h1.open_thread("d", &["--project", "p"]);
    in_ws(
        &m1,
        "mkdir empty && chmod 700 empty\n\
         mkdir untracked && printf 'u\\n' > untracked/notes.md && chmod 750 untracked\n\
         mkdir ignored && printf 'i\\n' > ignored/debug.log && chmod 700 ignored\n\
         mkdir refused && ln -s ../a.txt refused/.Git && chmod 700 refused\n\
         mkdir -p n1/n2/n3 && chmod 700 n1/n2/n3 && chmod 750 n1/n2\n\
         mkdir -p m1/m2 && printf 'i\\n' > m1/m2/x.log && chmod 700 m1/m2 && chmod 711 m1\n\
         mkdir -p r1/r2 && ln -s ../../a.txt r1/r2/.Git && chmod 700 r1/r2\n\
         mkdir -p t1/t2 && printf 't\\n' > t1/t2/new.md && chmod 700 t1/t2\n\
         mkdir -p g1/g2 && git -C g1/g2 init -q && chmod 700 g1",
    );
    let paths = [
        "empty",
        "untracked",
        "untracked/notes.md",
        "ignored",
        "ignored/debug.log",
        "refused",
        "refused/.Git",
        "n1",
        "n1/n2",
        "n1/n2/n3",
        "m1",
        "m1/m2",
        "m1/m2/x.log",
        "r1",
        "r1/r2",
        "r1/r2/.Git",
        "t1",
        "t1/t2",
        "t1/t2/new.md",
        "g1",
        "g1/g2",
        "g1/g2/.git",
    ];
    let want = |ignored_kept: bool| -> Vec<(String, String)> {
        let dir = |m: &str| format!("{m} directory");
        let ignored = |m: &str| {
            if ignored_kept {
                format!("{m} regular file")
            } else {
                "missing".to_string()
            }
        };
        [
            ("empty", dir("700")),
            ("untracked", dir("750")),
            ("untracked/notes.md", "644 regular file".to_string()),
            ("ignored", dir("700")),
            ("ignored/debug.log", ignored("644")),
            ("refused", dir("700")),
            ("refused/.Git", "777 symbolic link".to_string()),
            ("n1", dir("755")),
            ("n1/n2", dir("750")),
            ("n1/n2/n3", dir("700")),
            ("m1", dir("711")),
            ("m1/m2", dir("700")),
            ("m1/m2/x.log", ignored("644")),
            ("r1", dir("755")),
            ("r1/r2", dir("700")),
            ("r1/r2/.Git", "777 symbolic link".to_string()),
            ("t1", dir("755")),
            ("t1/t2", dir("700")),
            ("t1/t2/new.md", "644 regular file".to_string()),
            ("g1", dir("700")),
            ("g1/g2", dir("755")),
            ("g1/g2/.git", dir("755")),
        ]
        .into_iter()
        .map(|(p, w)| (p.to_string(), w))
        .collect()
    };
    assert_eq!(seen(&m1, &paths), want(true), "as made");

    h1.snapshot_id("d");
    h1.cli_ok(["restart"]);
    assert_eq!(
        seen(&m1, &paths),
        want(true),
        "after a snapshot and a restart"
    );

    h1.cli_ok(["release", "d"]);
    let m1 = h1.open_thread("d", &[]);
    assert_eq!(
        seen(&m1, &paths),
        want(false),
        "after release + open on this host"
    );

    h1.cli_ok(["release", "d"]);
    let m2 = h2.open_thread("d", &["--project", "p"]);
    assert_eq!(
        seen(&m2, &paths),
        want(false),
        "after release + open on another host through the share"
    );
    h2.cli_ok(["release", "d"]);
}
