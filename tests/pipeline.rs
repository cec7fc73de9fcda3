//! `octofs commit` and `octofs push` through gates, against real repositories in temporary
//! directories: the commit is on the workspace's branch as git in the mount sees it (log, status
//! clean), every gate refuses and passes, a refusal changes nothing, and a push reaches a bare
//! upstream only when its lease and its gates allow.

use crate::common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs git in `dir` (a mount or a repository), asserting success; trimmed stdout.
#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// Writes a file in a mount (bounded in time).
fn put(ws: &Path, rel: &str, bytes: &[u8]) {
    let p = ws.join(rel);
    let b = bytes.to_vec();
    with_timeout("write in the mount", FS_TIMEOUT, move || {
        write_file(&p, &b, 0o644)
    });
}

fn remove(ws: &Path, rel: &str) {
    let p = ws.join(rel);
    with_timeout("remove in the mount", FS_TIMEOUT, move || {
        fs::remove_file(p).unwrap()
    });
}

/// A project whose upstream is a bare repository holding `files` on `main`; returns its path.
fn bare_project(d: &Daemon, project: &str, files: &[(&str, &str)]) -> PathBuf {
    let work = GitRepo::init(&d.base.join(format!("work-{project}")));
    for (p, content) in files {
        work.write(p, content);
    }
    work.git(["add", "-A", "--force"]);
    work.commit_all("initial", DATE1);
    let bare = d.base.join(format!("{project}.git"));
    g(
        &d.base,
        &[
            "clone",
            "-q",
            "--bare",
            work.path.to_str().unwrap(),
            bare.to_str().unwrap(),
        ],
    );
    d.cli_ok(["mirror", "add", project, bare.to_str().unwrap()]);
    bare
}

const FILES: &[(&str, &str)] = &[
    ("README.md", "# demo\n"),
    ("a.txt", "alpha\n"),
    ("b.txt", "bravo\n"),
    ("c.txt", "charlie\n"),
    ("src/lib.rs", "pub fn f() {}\n"),
    (".gitignore", "*.log\n"),
    ("tracked.log", "tracked although *.log is ignored\n"),
];

/// HEAD, branch and porcelain status in the mount.
fn state(ws: &Path) -> (String, String, String) {
    (
        g(ws, &["rev-parse", "HEAD"]),
        g(ws, &["symbolic-ref", "HEAD"]),
        g(ws, &["status", "--porcelain"]),
    )
}

#[test]
fn commit_moves_the_branch_and_leaves_status_clean() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("t1", &["--project", "p"]);
    let before = g(&ws, &["rev-parse", "HEAD"]);
    let branch = g(&ws, &["symbolic-ref", "HEAD"]);
    assert!(branch.starts_with("refs/heads/"), "{branch}");
    put(&ws, "a.txt", b"alpha 2\n");
    put(&ws, "src/new.rs", b"new\n");
    remove(&ws, "b.txt");
    let id = d
        .cli_ok(["commit", "t1", "-m", "agent work"])
        .trim()
        .to_string();
    assert_eq!(id.len(), 40, "commit printed {id:?}");
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), id);
    assert_eq!(g(&ws, &["rev-parse", "HEAD^"]), before);
    assert_eq!(g(&ws, &["symbolic-ref", "HEAD"]), branch);
    assert_eq!(g(&ws, &["rev-parse", &branch]), id);
    assert_eq!(g(&ws, &["log", "-1", "--format=%s"]), "agent work");
    assert_eq!(
        g(&ws, &["show", "--name-status", "--format=", "HEAD"]),
        "M\ta.txt\nD\tb.txt\nA\tsrc/new.rs"
    );
    assert_eq!(
        g(&ws, &["status", "--porcelain"]),
        "",
        "status after commit"
    );
    assert_eq!(g(&ws, &["diff", "--cached", "--name-only"]), "");
    // The commit is in the mirror too.
    g(
        &d.mirror("p"),
        &["cat-file", "-e", &format!("{id}^{{commit}}")],
    );
    // A second commit on top.
    put(&ws, "c.txt", b"charlie 2\n");
    let id2 = d
        .cli_ok(["commit", "t1", "-m", "second"])
        .trim()
        .to_string();
    assert_eq!(g(&ws, &["rev-parse", "HEAD^"]), id);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), id2);
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
}

#[test]
fn commit_of_listed_paths_leaves_the_rest_uncommitted() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("t2", &["--project", "p"]);
    put(&ws, "a.txt", b"alpha 2\n");
    put(&ws, "src/lib.rs", b"pub fn g() {}\n");
    put(&ws, "c.txt", b"charlie 2\n");
    d.cli_ok([
        "commit",
        "t2",
        "-m",
        "only src and a",
        "--path",
        "src",
        "--path",
        "a.txt",
    ]);
    assert_eq!(
        g(&ws, &["show", "--name-only", "--format=", "HEAD"]),
        "a.txt\nsrc/lib.rs"
    );
    assert_eq!(g(&ws, &["status", "--porcelain"]), "M c.txt");
    // Nothing left under a listed path: nothing to commit.
    let out = d.cli(["commit", "t2", "-m", "again", "--path", "src"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("nothing to commit"),
        "{}",
        out.describe()
    );
}

#[test]
fn nothing_to_commit_changes_nothing() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("t3", &["--project", "p"]);
    let before = state(&ws);
    let out = d.cli(["commit", "t3", "-m", "empty"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("nothing to commit"),
        "{}",
        out.describe()
    );
    assert_eq!(state(&ws), before);
}

/// A commit refused by a gate (naming `path` and `why`) leaves HEAD, the index and the files as
/// they were; the same commit without that gate (or with a passing one) succeeds.
#[track_caller]
fn refused_then_passes(
    d: &Daemon,
    ws: &Path,
    t: &str,
    refused: &[&str],
    path: &str,
    why: &str,
    passing: &[&str],
) {
    let before = state(ws);
    let mut args = vec!["commit", t, "-m", "gated"];
    args.extend_from_slice(refused);
    let out = d.cli(&args);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains(path) && err.contains(why),
        "{}",
        out.describe()
    );
    assert_eq!(state(ws), before, "a refused commit changed something");
    let mut args = vec!["commit", t, "-m", "gated"];
    args.extend_from_slice(passing);
    d.cli_ok(&args);
    assert_eq!(g(ws, &["status", "--porcelain"]), "");
}

#[test]
fn each_gate_refuses_and_passes() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("t4", &["--project", "p"]);
    // secret-names
    put(&ws, "deploy/.env.production", b"TOKEN=x\n");
    refused_then_passes(
        &d,
        &ws,
        "t4",
        &["--gate", "secret-names"],
        "deploy/.env.production",
        "secret-names",
        &[],
    );
    put(&ws, "notes.txt", b"fine\n");
    d.cli_ok(["commit", "t4", "-m", "no secret", "--gate", "secret-names"]);
    // max-size
    put(&ws, "big.bin", &[7u8; 100]);
    refused_then_passes(
        &d,
        &ws,
        "t4",
        &["--gate", "max-size=99"],
        "big.bin",
        "max-size=99",
        &["--gate", "max-size=100"],
    );
    // cmd: the host's program gets the paths on stdin.
    let check = d.base.join("check.sh");
    fs::write(
        &check,
        "#!/bin/sh\nwhile read p; do case \"$p\" in *forbidden*) echo \"policy: $p\" >&2; exit 1;; esac; done\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&check, fs::Permissions::from_mode(0o755)).unwrap();
    let gate = format!("cmd={}", check.display());
    put(&ws, "forbidden.txt", b"x\n");
    refused_then_passes(
        &d,
        &ws,
        "t4",
        &["--gate", &gate],
        "forbidden.txt",
        "policy: forbidden.txt",
        &[],
    );
    put(&ws, "allowed.txt", b"x\n");
    d.cli_ok(["commit", "t4", "-m", "cmd passes", "--gate", &gate]);
    // excludes always runs: a tracked file the ignore rules match cannot be committed.
    put(&ws, "tracked.log", b"changed\n");
    let before = state(&ws);
    let out = d.cli(["commit", "t4", "-m", "log"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("tracked.log") && out.stderr_str().contains("excludes"),
        "{}",
        out.describe()
    );
    assert_eq!(state(&ws), before);
    // ... but the rest can be, by path.
    put(&ws, "a.txt", b"alpha 3\n");
    d.cli_ok(["commit", "t4", "-m", "a only", "--path", "a.txt"]);
    assert_eq!(g(&ws, &["status", "--porcelain"]), "M tracked.log");
    // An unknown gate fails before anything runs.
    let before = state(&ws);
    let out = d.cli([
        "commit",
        "t4",
        "-m",
        "x",
        "--path",
        "tracked.log",
        "--gate",
        "no-such-gate",
    ]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("unknown gate"),
        "{}",
        out.describe()
    );
    assert_eq!(state(&ws), before);
}

#[test]
fn push_reaches_a_bare_upstream_within_its_lease_and_gates() {
    let d = Daemon::start();
    let bare = bare_project(&d, "p", FILES);
    let up_tip = g(&bare, &["rev-parse", "main"]);
    let ws = d.open_thread("t5", &["--project", "p"]);
    put(&ws, "a.txt", b"alpha pushed\n");
    let c1 = d.cli_ok(["commit", "t5", "-m", "one"]).trim().to_string();
    // A wrong lease is refused and sends nothing.
    let wrong = "1".repeat(40);
    let out = d.cli(["push", "t5", "--branch", "main", "--lease", &wrong]);
    out.assert_failed();
    assert_eq!(
        g(&bare, &["rev-parse", "main"]),
        up_tip,
        "{}",
        out.describe()
    );
    // The right lease pushes.
    let out = d.cli_ok([
        "push",
        "t5",
        "--branch",
        "main",
        "--lease",
        &up_tip,
        "--gate",
        "secret-names",
    ]);
    assert!(out.contains(&c1), "{out}");
    assert_eq!(g(&bare, &["rev-parse", "main"]), c1);
    // A range that added and removed a secret file is refused by secret-names: it still travels.
    put(&ws, ".env", b"TOKEN=secret\n");
    d.cli_ok(["commit", "t5", "-m", "oops"]);
    remove(&ws, ".env");
    let c3 = d
        .cli_ok(["commit", "t5", "-m", "remove it"])
        .trim()
        .to_string();
    let out = d.cli(["push", "t5", "--branch", "main", "--gate", "secret-names"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains(".env") && out.stderr_str().contains("secret-names"),
        "{}",
        out.describe()
    );
    assert_eq!(
        g(&bare, &["rev-parse", "main"]),
        c1,
        "a refused push sent something"
    );
    // The workspace's own branch (the default), without that gate: it goes.
    let own = g(&ws, &["symbolic-ref", "--short", "HEAD"]);
    let out = d.cli_ok(["push", "t5"]);
    assert!(out.contains(&own) && out.contains(&c3), "{out}");
    assert_eq!(g(&bare, &["rev-parse", &own]), c3);
    // Someone else moved main: a plain push (not a fast-forward) is refused, sending nothing.
    let other = g(
        &bare,
        &[
            "commit-tree",
            "-p",
            &c1,
            "-m",
            "someone else",
            &format!("{c1}^{{tree}}"),
        ],
    );
    g(&bare, &["update-ref", "refs/heads/main", &other]);
    put(&ws, "b.txt", b"elsewhere\n");
    let c4 = d.cli_ok(["commit", "t5", "-m", "four"]).trim().to_string();
    let out = d.cli(["push", "t5", "--branch", "main"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("fast-forward"),
        "{}",
        out.describe()
    );
    assert_eq!(g(&bare, &["rev-parse", "main"]), other);
    // With the right lease it replaces main.
    d.cli_ok(["push", "t5", "--branch", "main", "--lease", &other]);
    assert_eq!(g(&bare, &["rev-parse", "main"]), c4);
    // An unknown gate fails before anything is sent.
    let out = d.cli(["push", "t5", "--gate", "bogus"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("unknown gate"),
        "{}",
        out.describe()
    );
    assert_eq!(g(&bare, &["rev-parse", "main"]), c4);
}

#[test]
fn commit_and_push_on_top_of_the_agents_own_commit() {
    // The agent committed with its own git (the commit is only in the workspace's objects): an
    // `octofs commit` goes on top of it, and a push carries both.
    let d = Daemon::start();
    let bare = bare_project(&d, "p", FILES);
    let ws = d.open_thread("t6", &["--project", "p"]);
    put(&ws, "a.txt", b"by the agent\n");
    g(&ws, &["commit", "-q", "-am", "agent's own"]);
    let agents = g(&ws, &["rev-parse", "HEAD"]);
    put(&ws, "c.txt", b"by octofs commit\n");
    let id = d
        .cli_ok(["commit", "t6", "-m", "on top"])
        .trim()
        .to_string();
    assert_eq!(g(&ws, &["rev-parse", "HEAD^"]), agents);
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), id);
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    let own = g(&ws, &["symbolic-ref", "--short", "HEAD"]);
    d.cli_ok(["push", "t6"]);
    assert_eq!(g(&bare, &["rev-parse", &own]), id);
    assert_eq!(g(&bare, &["rev-parse", &format!("{own}^")]), agents);
}

#[test]
fn fixup_and_amend_modes() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("tm", &["--project", "p"]);
    let base = g(&ws, &["rev-parse", "HEAD"]);
    put(&ws, "a.txt", b"alpha 2\n");
    let c1 = d
        .cli_ok(["commit", "tm", "-m", "change alpha\n\nwith a body"])
        .trim()
        .to_string();
    // A fixup needs an anchor that HEAD reaches.
    put(&ws, "b.txt", b"bravo 2\n");
    let out = d.cli(["commit", "tm", "-m", "x", "--mode", "fixup"]);
    out.assert_failed();
    assert!(out.stderr_str().contains("--anchor"), "{}", out.describe());
    let out = d.cli(["commit", "tm", "-m", "x", "--anchor", &c1]);
    out.assert_failed();
    assert!(out.stderr_str().contains("fixup"), "{}", out.describe());
    for bad in ["1".repeat(40), "no-such-rev".to_string()] {
        let out = d.cli(["commit", "tm", "--mode", "fixup", "--anchor", &bad]);
        out.assert_failed();
        assert_eq!(g(&ws, &["rev-parse", "HEAD"]), c1, "{}", out.describe());
    }
    let fix = d
        .cli_ok(["commit", "tm", "--mode", "fixup", "--anchor", &c1])
        .trim()
        .to_string();
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), fix);
    assert_eq!(g(&ws, &["rev-parse", "HEAD^"]), c1);
    assert_eq!(g(&ws, &["log", "-1", "--format=%s"]), "fixup! change alpha");
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    // Amend replaces HEAD: same parent, both changes, the new message; the branch moves.
    put(&ws, "c.txt", b"charlie 2\n");
    let amended = d
        .cli_ok([
            "commit",
            "tm",
            "--mode",
            "amend",
            "-m",
            "alpha, bravo, charlie",
        ])
        .trim()
        .to_string();
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), amended);
    assert_eq!(
        g(&ws, &["rev-parse", "HEAD^"]),
        c1,
        "amend keeps HEAD's parent"
    );
    assert_eq!(
        g(&ws, &["show", "--name-status", "--format=", "HEAD"]),
        "M\tb.txt\nM\tc.txt"
    );
    assert_eq!(
        g(&ws, &["log", "-1", "--format=%s"]),
        "alpha, bravo, charlie"
    );
    assert_eq!(g(&ws, &["status", "--porcelain"]), "");
    // Without -m an amend keeps the message; with nothing changed and no new message it refuses.
    put(&ws, "src/lib.rs", b"pub fn h() {}\n");
    d.cli_ok(["commit", "tm", "--mode", "amend"]);
    assert_eq!(
        g(&ws, &["log", "-1", "--format=%s"]),
        "alpha, bravo, charlie"
    );
    assert_eq!(g(&ws, &["rev-parse", "HEAD^"]), c1);
    let head = g(&ws, &["rev-parse", "HEAD"]);
    let out = d.cli(["commit", "tm", "--mode", "amend"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("nothing to commit"),
        "{}",
        out.describe()
    );
    // A reword alone is an amend.
    d.cli_ok(["commit", "tm", "--mode", "amend", "-m", "reworded"]);
    assert_eq!(g(&ws, &["log", "-1", "--format=%s"]), "reworded");
    assert_ne!(g(&ws, &["rev-parse", "HEAD"]), head);
    assert_eq!(g(&ws, &["rev-parse", "HEAD~2"]), base);
    // An amend is gated on everything it carries: a secret committed earlier is refused too.
    put(&ws, ".env", b"TOKEN=1\n");
    d.cli_ok(["commit", "tm", "-m", "with a secret"]);
    let head = g(&ws, &["rev-parse", "HEAD"]);
    put(&ws, "a.txt", b"alpha 3\n");
    let out = d.cli([
        "commit",
        "tm",
        "--mode",
        "amend",
        "-m",
        "hide it",
        "--gate",
        "secret-names",
    ]);
    out.assert_failed();
    assert!(out.stderr_str().contains(".env"), "{}", out.describe());
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), head);
}

#[test]
fn commits_carry_the_workspaces_identity() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("ti", &["--project", "p"]);
    put(&ws, "a.txt", b"alpha 2\n");
    d.cli_ok(["commit", "ti", "-m", "anonymous"]);
    assert_eq!(
        g(&ws, &["log", "-1", "--format=%an <%ae>"]),
        "octofs <octofs@localhost>"
    );
    g(&ws, &["config", "user.name", "Agent Smith"]);
    g(&ws, &["config", "user.email", "smith@example.invalid"]);
    put(&ws, "b.txt", b"bravo 2\n");
    d.cli_ok(["commit", "ti", "-m", "signed"]);
    assert_eq!(
        g(&ws, &["log", "-1", "--format=%an <%ae>|%cn <%ce>"]),
        "Agent Smith <smith@example.invalid>|Agent Smith <smith@example.invalid>"
    );
}

/// Issue 30, item 1: the identity the agent configured survives release and open (its
/// `.git/config` is kept, as data), so `octofs commit` after a resume authors as the agent, as
/// `git commit` there does. Failed before: the resumed config had no `user.name`, and the commit
/// was `octofs <octofs@localhost>`.
#[test]
fn commits_after_a_resume_carry_the_workspaces_identity() {
    let d = Daemon::start();
    bare_project(&d, "p", FILES);
    let ws = d.open_thread("tr", &["--project", "p"]);
    g(&ws, &["config", "user.name", "Agent Smith"]);
    g(&ws, &["config", "user.email", "smith@example.invalid"]);
    d.cli_ok(["release", "tr"]);
    let ws = d.open_thread("tr", &[]);
    put(&ws, "a.txt", b"alpha 3\n");
    d.cli_ok(["commit", "tr", "-m", "after the resume"]);
    assert_eq!(
        g(&ws, &["log", "-1", "--format=%an <%ae>|%cn <%ce>"]),
        "Agent Smith <smith@example.invalid>|Agent Smith <smith@example.invalid>"
    );
}

#[test]
fn hooks_run_in_the_workspace_as_its_owner() {
    let d = Daemon::start();
    let a = user_a();
    bare_project(&d, "p", FILES);
    d.cli_ok(["mirror", "access", "p", "--allow-user", "octofs-test-user"]);
    // The workspace is user a's; root (an orchestrator) commits with hooks.
    let mut open = as_user(a, bin());
    open.arg("--state")
        .arg(&d.state)
        .arg("--root")
        .arg(&d.root)
        .args(["open", "th", "--project", "p"]);
    let out = run(&mut open, CMD_TIMEOUT);
    out.assert_ok();
    let ws = PathBuf::from(out.stdout_str().trim());
    let head = g(&ws, &["-c", "safe.directory=*", "rev-parse", "HEAD"]);
    put(&ws, "a.txt", b"alpha bad\n");
    // A failing hook stops the commit.
    let out = d.cli(["commit", "th", "-m", "x", "--hook", "exit 3"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("exit 3") || out.stderr_str().contains("exit status: 3"),
        "{}",
        out.describe()
    );
    assert_eq!(
        g(&ws, &["-c", "safe.directory=*", "rev-parse", "HEAD"]),
        head
    );
    // Hooks run in order, in the mount, as the owner, and what they rewrite is committed.
    let id = d
        .cli_ok([
            "commit",
            "th",
            "-m",
            "formatted",
            "--hook",
            "sed -i s/bad/good/ a.txt",
            "--hook",
            "id -u > who.txt",
        ])
        .trim()
        .to_string();
    assert_eq!(
        g(
            &ws,
            &["-c", "safe.directory=*", "show", &format!("{id}:a.txt")]
        ),
        "alpha good"
    );
    assert_eq!(
        g(
            &ws,
            &["-c", "safe.directory=*", "show", &format!("{id}:who.txt")]
        ),
        a.uid.to_string(),
        "the hook ran as someone else than the workspace's owner"
    );
    // Git's own hooks are skipped unless asked for.
    let hooks = ws.join(".git/hooks");
    let (pre, msg) = (hooks.join("pre-commit"), hooks.join("commit-msg"));
    with_timeout("write hooks", FS_TIMEOUT, move || {
        fs::create_dir_all(pre.parent().unwrap()).unwrap();
        write_file(&pre, b"#!/bin/sh\nid -u > pre-commit-ran\n", 0o755);
        write_file(
            &msg,
            b"#!/bin/sh\nprintf '\\nSigned-off-by: hook\\n' >> \"$1\"\n",
            0o755,
        );
    });
    put(&ws, "b.txt", b"bravo 2\n");
    let id = d.cli_ok(["commit", "th", "-m", "plain"]).trim().to_string();
    assert_eq!(
        g(
            &ws,
            &["-c", "safe.directory=*", "log", "-1", "--format=%B", &id]
        ),
        "plain"
    );
    assert!(!ws.join("pre-commit-ran").exists());
    put(&ws, "c.txt", b"charlie 2\n");
    let id = d
        .cli_ok(["commit", "th", "-m", "hooked", "--git-hooks"])
        .trim()
        .to_string();
    assert_eq!(
        g(
            &ws,
            &["-c", "safe.directory=*", "log", "-1", "--format=%B", &id]
        ),
        "hooked\n\nSigned-off-by: hook"
    );
    assert_eq!(
        g(
            &ws,
            &[
                "-c",
                "safe.directory=*",
                "show",
                &format!("{id}:pre-commit-ran")
            ]
        ),
        a.uid.to_string()
    );
    // Another user may not run hooks in it.
    let b = user_b();
    let mut other = as_user(b, bin());
    other
        .arg("--state")
        .arg(&d.state)
        .arg("--root")
        .arg(&d.root)
        .args(["commit", "th", "-m", "x", "--hook", "touch owned-by-b"]);
    let out = run(&mut other, CMD_TIMEOUT);
    out.assert_failed();
    assert!(!ws.join("owned-by-b").exists());
    d.cli_ok(["release", "th"]);
}

#[test]
fn a_projects_excludes_are_never_committed_or_pushed() {
    let d = Daemon::start();
    // An old branch tracks .npmrc: the project's excludes refuse it even so.
    let mut files = FILES.to_vec();
    files.push((".npmrc", "//registry.example/:_authToken=old\n"));
    let bare = bare_project(&d, "p", &files);
    let up_tip = g(&bare, &["rev-parse", "main"]);
    // Bad input changes nothing.
    let out = d.cli(["mirror", "set", "p", "--exclude", ""]);
    out.assert_failed();
    let out = d.cli(["mirror", "set", "nosuch", "--exclude", ".npmrc"]);
    out.assert_failed();
    let out = d.cli(["mirror", "set", "p"]);
    out.assert_failed();
    let set = d.cli_ok([
        "mirror",
        "set",
        "p",
        "--exclude",
        ".npmrc",
        "--exclude",
        "secrets/",
    ]);
    assert!(set.contains(".npmrc") && set.contains("secrets/"), "{set}");
    let ws = d.open_thread("tx", &["--project", "p"]);
    let head = g(&ws, &["rev-parse", "HEAD"]);
    put(&ws, ".npmrc", b"//registry.example/:_authToken=new\n");
    put(&ws, "secrets/prod.txt", b"password\n");
    put(&ws, "a.txt", b"alpha 2\n");
    let out = d.cli(["commit", "tx", "-m", "leak"]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains(".npmrc")
            && err.contains("secrets/prod.txt")
            && err.contains("project excludes"),
        "{}",
        out.describe()
    );
    assert_eq!(g(&ws, &["rev-parse", "HEAD"]), head, "a refusal moved HEAD");
    // Only the allowed path commits.
    d.cli_ok(["commit", "tx", "-m", "fine", "--path", "a.txt"]);
    // A push carries the range: an excluded path committed by the agent's own git is refused.
    g(&ws, &["add", ".npmrc"]);
    g(&ws, &["commit", "-q", "-m", "agent commits the token"]);
    let out = d.cli(["push", "tx", "--branch", "main"]);
    out.assert_failed();
    assert!(out.stderr_str().contains(".npmrc"), "{}", out.describe());
    assert_eq!(
        g(&bare, &["rev-parse", "main"]),
        up_tip,
        "a refused push sent something"
    );
    // Cleared, the same push goes (the project's own choice).
    d.cli_ok(["mirror", "set", "p", "--no-excludes"]);
    d.cli_ok(["push", "tx", "--branch", "main"]);
    assert_ne!(g(&bare, &["rev-parse", "main"]), up_tip);
}
