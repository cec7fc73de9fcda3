//! Named snapshots, their push and pull, and diff across them, through real mounts and real git:
//!
//! 1. [`named_snapshots_chain_and_an_unchanged_state_moves_nothing`]: `refs/snapshots/N` in the
//!    mirror, its first parent HEAD, its second the previous snapshot of that name; an unchanged
//!    state returns the same commit; bad names are refused.
//! 2. [`push_is_a_fast_forward_and_a_diverged_remote_is_refused`]: `--push` creates and
//!    fast-forwards the remote's ref; a remote snapshot that diverged is refused, never
//!    overwritten, and the local snapshot stays.
//! 3. [`pull_applies_a_snapshot_as_uncommitted_changes`]: the pulled changes read as uncommitted
//!    in `git status` (HEAD and the index unmoved), ignored files stay, `diff --from N` works across
//!    the pulled snapshot; a pull that would lose local changes is refused and names them; one at
//!    another HEAD is refused; `--force` saves the local changes first and says where.

use crate::common;

use common::*;
use std::path::{Path, PathBuf};

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE2).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

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

fn read(p: PathBuf) -> Option<String> {
    with_timeout("read a file in a mount", CMD_TIMEOUT, move || {
        std::fs::read_to_string(p).ok()
    })
}

/// A daemon with project `p` and a bare remote for named snapshots.
fn setup() -> (Daemon, PathBuf) {
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    up.write("a.txt", "alpha\n");
    up.write("b.txt", "bravo\n");
    up.write(".gitignore", "*.log\n");
    up.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", "p", up.path.to_str().unwrap()]);
    let remote = d.base.join("remote.git");
    git(&d.base, ["init", "-q", "--bare", remote.to_str().unwrap()]);
    (d, remote)
}

#[test]
fn named_snapshots_chain_and_an_unchanged_state_moves_nothing() {
    let (d, _) = setup();
    let m = d.open_thread("t", &["--project", "p"]);
    let mirror = d.mirror("p");
    in_ws(&m, "printf 'one\\n' > a.txt");
    let c1 = d
        .cli_ok(["snapshot", "t", "--name", "n1"])
        .trim()
        .to_string();
    assert_eq!(g(&mirror, &["rev-parse", "refs/snapshots/n1"]), c1);
    assert_eq!(
        g(&mirror, &["rev-parse", &format!("{c1}^1")]),
        g(&m, &["rev-parse", "HEAD"])
    );
    assert!(
        run(
            git_command(&mirror, DATE2).args(["rev-parse", "--verify", "-q", &format!("{c1}^2")]),
            CMD_TIMEOUT
        )
        .status
        .code()
            != Some(0)
    );
    assert_eq!(g(&mirror, &["show", &format!("{c1}:a.txt")]), "one");
    // The thread's own ref moved as by a plain snapshot.
    let thread_snap = g(&mirror, &["rev-parse", "refs/octomate/threads/t"]);
    assert_eq!(
        g(&mirror, &["rev-parse", &format!("{thread_snap}^{{tree}}")]),
        g(&mirror, &["rev-parse", &format!("{c1}^{{tree}}")])
    );
    // Unchanged: the same commit, no ref moves.
    let reflog_before = g(
        &mirror,
        &["reflog", "show", "--format=%H", "refs/snapshots/n1"],
    );
    let again = d
        .cli_ok(["snapshot", "t", "--name", "n1"])
        .trim()
        .to_string();
    assert_eq!(again, c1);
    assert_eq!(
        g(
            &mirror,
            &["reflog", "show", "--format=%H", "refs/snapshots/n1"]
        ),
        reflog_before
    );
    // Changed: a new link of the chain.
    in_ws(&m, "printf 'two\\n' > a.txt");
    let c2 = d
        .cli_ok(["snapshot", "t", "--name", "n1"])
        .trim()
        .to_string();
    assert_ne!(c2, c1);
    assert_eq!(g(&mirror, &["rev-parse", &format!("{c2}^2")]), c1);
    assert_eq!(g(&mirror, &["rev-parse", "refs/snapshots/n1"]), c2);
    // Another name starts its own chain.
    let o = d
        .cli_ok(["snapshot", "t", "--name", "other"])
        .trim()
        .to_string();
    assert_eq!(
        g(&mirror, &["rev-parse", &format!("{o}^{{tree}}")]),
        g(&mirror, &["rev-parse", &format!("{c2}^{{tree}}")])
    );
    // Bad names are refused before anything is saved.
    for bad in ["a/b", "..", "-x", "x.lock", "a b"] {
        let out = d.cli(["snapshot", "t", &format!("--name={bad}")]);
        out.assert_failed();
        assert!(
            out.stderr_str().contains("snapshot name"),
            "{}",
            out.describe()
        );
    }
    d.cli_ok(["release", "t"]);
}

#[test]
fn push_is_a_fast_forward_and_a_diverged_remote_is_refused() {
    let (d, remote) = setup();
    let r = remote.to_str().unwrap();
    let m = d.open_thread("t", &["--project", "p"]);
    in_ws(&m, "printf 'one\\n' > a.txt");
    let c1 = d
        .cli_ok(["snapshot", "t", "--name", "s", "--push", r])
        .trim()
        .to_string();
    assert_eq!(g(&remote, &["rev-parse", "refs/snapshots/s"]), c1);
    in_ws(&m, "printf 'two\\n' > a.txt");
    let c2 = d
        .cli_ok(["snapshot", "t", "--name", "s", "--push", r])
        .trim()
        .to_string();
    assert_eq!(g(&remote, &["rev-parse", "refs/snapshots/s"]), c2);
    // Someone else moved the remote's snapshot to a commit ours does not descend from.
    let tree = g(&remote, &["rev-parse", &format!("{c2}^{{tree}}")]);
    let theirs = g(
        &remote,
        &["commit-tree", &tree, "-p", &c1, "-m", "elsewhere"],
    );
    g(&remote, &["update-ref", "refs/snapshots/s", &theirs]);
    in_ws(&m, "printf 'three\\n' > a.txt");
    let out = d.cli(["snapshot", "t", "--name", "s", "--push", r]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains("diverged") && err.contains(&theirs),
        "{}",
        out.describe()
    );
    assert_eq!(
        g(&remote, &["rev-parse", "refs/snapshots/s"]),
        theirs,
        "overwritten"
    );
    let local = g(&d.mirror("p"), &["rev-parse", "refs/snapshots/s"]);
    assert_eq!(g(&d.mirror("p"), &["rev-parse", &format!("{local}^2")]), c2);
    assert_eq!(
        g(&d.mirror("p"), &["show", &format!("{local}:a.txt")]),
        "three"
    );
    // --push without --name is refused by the command line.
    d.cli(["snapshot", "t", "--push", r]).assert_failed();
    d.cli_ok(["release", "t"]);
}

#[test]
fn pull_applies_a_snapshot_as_uncommitted_changes() {
    let (d, remote) = setup();
    let r = remote.to_str().unwrap();
    // The author: changes of every kind, pushed as `feat`.
    let src = d.open_thread("src", &["--project", "p"]);
    in_ws(
        &src,
        "printf 'alpha pulled\\n' > a.txt\nrm b.txt\nprintf 'new\\n' > c.txt\nln -s a.txt link\nmkdir -p d && printf 'x\\n' > d/x.sh && chmod 755 d/x.sh",
    );
    let feat = d
        .cli_ok(["snapshot", "src", "--name", "feat", "--push", r])
        .trim()
        .to_string();
    d.cli_ok(["release", "src"]);
    // The mirror forgets it: the pull must fetch it from the remote.
    g(&d.mirror("p"), &["update-ref", "-d", "refs/snapshots/feat"]);

    // A clean workspace with an ignored file: pulled.
    let w = d.open_thread("w", &["--project", "p"]);
    in_ws(&w, "printf 'mine\\n' > build.log");
    let head = g(&w, &["rev-parse", "HEAD"]);
    let index_before = g(&w, &["ls-files", "-s"]);
    let out = d.cli_ok(["pull", "w", "--remote", r, "--name", "feat"]);
    assert_eq!(out.trim(), feat);
    assert_eq!(read(w.join("a.txt")).as_deref(), Some("alpha pulled\n"));
    assert_eq!(read(w.join("c.txt")).as_deref(), Some("new\n"));
    assert_eq!(read(w.join("b.txt")), None);
    assert_eq!(
        read(w.join("build.log")).as_deref(),
        Some("mine\n"),
        "ignored file touched"
    );
    assert_eq!(g(&w, &["rev-parse", "HEAD"]), head, "HEAD moved");
    assert_eq!(g(&w, &["ls-files", "-s"]), index_before, "the index moved");
    let status = run(
        git_command(&w, DATE2).args(["status", "--porcelain"]),
        CMD_TIMEOUT,
    )
    .stdout_str();
    for line in [" M a.txt", " D b.txt", "?? c.txt", "?? d/", "?? link"] {
        assert!(
            status.lines().any(|l| l == line),
            "{line:?} not in status:\n{status}"
        );
    }
    assert_eq!(
        std::fs::read_link(w.join("link")).unwrap().to_str(),
        Some("a.txt")
    );
    assert_eq!(
        g(&d.mirror("p"), &["rev-parse", "refs/snapshots/feat"]),
        feat
    );
    // diff across the pulled snapshot: nothing, then the one path changed since.
    assert_eq!(d.cli_ok(["diff", "w", "--from", "feat"]).trim(), "");
    in_ws(&w, "printf 'after\\n' > c.txt");
    assert_eq!(
        d.cli_ok(["diff", "w", "--from", "feat", "--name-status"])
            .trim(),
        "M\tc.txt"
    );
    let stat = d.cli_ok(["diff", "w", "--from", "feat", "--stat"]);
    assert!(
        stat.contains("c.txt") && stat.contains("1 file changed"),
        "{stat}"
    );
    let patch = d.cli_ok(["diff", "w", "--from", feat.as_str(), "--patch"]);
    assert!(
        patch.contains("-new") && patch.contains("+after"),
        "{patch}"
    );

    // Local changes the pull would lose: refused, named, nothing touched.
    let l = d.open_thread("l", &["--project", "p"]);
    in_ws(
        &l,
        "printf 'local work\\n' > a.txt\nprintf 'kept\\n' > mine.txt",
    );
    let out = d.cli(["pull", "l", "--remote", r, "--name", "feat"]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains("a.txt") && err.contains("mine.txt") && err.contains("would lose"),
        "{}",
        out.describe()
    );
    assert!(
        !err.contains("c.txt"),
        "names a path that is not a local change: {err}"
    );
    assert_eq!(read(l.join("a.txt")).as_deref(), Some("local work\n"));
    assert_eq!(read(l.join("c.txt")), None);
    // --force: the local changes saved first, and where is printed.
    let out = d.cli_ok(["pull", "l", "--remote", r, "--name", "feat", "--force"]);
    let saved = out
        .lines()
        .find_map(|l| l.strip_prefix("saved the local changes first as snapshot "))
        .unwrap_or_else(|| panic!("no saved snapshot printed: {out}"))
        .trim()
        .to_string();
    assert_eq!(
        g(&d.mirror("p"), &["show", &format!("{saved}:a.txt")]),
        "local work"
    );
    assert_eq!(
        g(&d.mirror("p"), &["show", &format!("{saved}:mine.txt")]),
        "kept"
    );
    assert_eq!(read(l.join("a.txt")).as_deref(), Some("alpha pulled\n"));
    assert_eq!(read(l.join("mine.txt")), None);

    // Another HEAD: refused.
    let h = d.open_thread("h", &["--project", "p"]);
    in_ws(&h, "printf 'c\\n' > z.txt");
    g(&h, &["add", "z.txt"]);
    g(&h, &["commit", "-q", "-m", "moved on"]);
    let out = d.cli(["pull", "h", "--remote", r, "--name", "feat"]);
    out.assert_failed();
    assert!(out.stderr_str().contains("HEAD"), "{}", out.describe());
    assert_eq!(read(h.join("a.txt")).as_deref(), Some("alpha\n"));
    // A name the remote does not have.
    let out = d.cli(["pull", "h", "--remote", r, "--name", "nope"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("refs/snapshots/nope"),
        "{}",
        out.describe()
    );
    for t in ["w", "l", "h"] {
        d.cli_ok(["release", t, "--discard"]);
    }
}
