//! `octofs watch <thread>`: a JSON line per change made in the workspace (path, kind as the path is
//! now, token), resumable from any line's token with `--since`, a `rescan` line for a token that
//! cannot be trusted, and a clean end (a `released` line, exit 0) when the workspace is released.

use crate::common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const DATE: &str = "2026-01-01T00:00:00Z";

struct Watcher {
    child: Child,
    lines: mpsc::Receiver<Value>,
}

impl Watcher {
    fn start(d: &Daemon, args: &[&str]) -> Watcher {
        let mut child = d
            .command()
            .arg("watch")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn watch");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                let v: Value = serde_json::from_str(&l).expect("a JSON line");
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Watcher { child, lines }
    }

    /// Lines until `done` holds for the lines so far (10 s at most).
    fn until(&self, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done(&got) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => got.push(v),
                Err(_) => panic!("watch: timed out; lines so far: {got:?}"),
            }
        }
        got
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Watcher {
    /// Every line that comes within `d`.
    fn lines_for(&self, d: Duration) -> Vec<Value> {
        let mut got = Vec::new();
        let deadline = Instant::now() + d;
        while let Ok(v) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            got.push(v);
        }
        got
    }
}

fn last_kind(lines: &[Value], path: &str) -> Option<String> {
    lines
        .iter()
        .rev()
        .find(|v| v["path"] == path)
        .map(|v| v["kind"].as_str().unwrap_or("").to_string())
}

#[test]
fn watch_streams_changes_resumes_from_a_token_and_ends_at_release() {
    let src = tempfile::tempdir().unwrap();
    let repo = GitRepo::init(&src.path().join("repo"));
    repo.write("README.md", "watch\n");
    repo.commit_all("initial", DATE);
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mnt = d.open_thread("t1", &["--project", "proj"]);

    // Not mounted: one line on stderr, exit 1.
    let out = d.cli(["watch", "nobody"]);
    assert!(
        !out.success() && out.stderr_str().trim().lines().count() == 1,
        "{}",
        out.describe()
    );

    let w = Watcher::start(&d, &["t1"]);
    // The first poll fixes "now": changes from before it are not reported.
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(mnt.join("a.txt"), "a\n").unwrap();
    std::fs::create_dir(mnt.join("d")).unwrap();
    std::fs::write(mnt.join("d/b.txt"), "b\n").unwrap();
    std::fs::rename(mnt.join("d/b.txt"), mnt.join("d/c.txt")).unwrap();
    std::fs::remove_file(mnt.join("a.txt")).unwrap();
    std::fs::write(mnt.join("README.md"), "changed\n").unwrap();
    let lines = w.until(|l| {
        last_kind(l, "a.txt").as_deref() == Some("removed")
            && last_kind(l, "README.md").is_some()
            && last_kind(l, "d/c.txt").is_some()
    });
    assert_eq!(
        last_kind(&lines, "README.md").as_deref(),
        Some("changed"),
        "{lines:?}"
    );
    assert_eq!(
        last_kind(&lines, "d/c.txt").as_deref(),
        Some("changed"),
        "{lines:?}"
    );
    assert_eq!(
        last_kind(&lines, "d/b.txt").as_deref(),
        Some("removed"),
        "{lines:?}"
    );
    assert_eq!(
        last_kind(&lines, "d/").as_deref(),
        Some("directory"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|v| !v["path"].as_str().unwrap_or("").starts_with(".git"))
    );

    // Resuming after a line gives exactly the lines that followed it.
    let i = lines.iter().position(|v| v["path"] == "d/").expect("d/");
    let token = lines[i]["token"].as_str().unwrap().to_string();
    let again = Watcher::start(&d, &["t1", "--since", &token]);
    let rest = again.until(|l| l.len() >= lines.len() - i - 1);
    let paths = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|x| x["path"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(paths(&rest), paths(&lines[i + 1..]));
    drop(again);

    // A token from elsewhere: rescan.
    let other = Watcher::start(&d, &["t1", "--since", "octofs:1:1"]);
    let l = other.until(|l| !l.is_empty());
    assert_eq!(l[0]["kind"], "rescan", "{l:?}");
    drop(other);

    // Release ends the stream cleanly.
    d.cli_ok(["release", "t1"]);
    let end = w.until(|l| l.iter().any(|v| v["kind"] == "released"));
    assert!(
        end.last().is_some_and(|v| v["kind"] == "released"),
        "{end:?}"
    );
    let mut w = w;
    let status = wait_timeout(&mut w.child, Duration::from_secs(10)).expect("watch exits");
    assert!(status.success(), "{status:?}");
}

/// A path whose parent became a symlink to a host directory is `removed` (as the workspace has it),
/// whatever the host directory holds: the kind is never found by looking through the mount, where
/// the symlink would lead a root watcher out of the workspace.
#[test]
fn kinds_never_follow_a_planted_symlink() {
    let src = tempfile::tempdir().unwrap();
    let repo = GitRepo::init(&src.path().join("repo"));
    repo.write("README.md", "watch\n");
    repo.commit_all("initial", DATE);
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mnt = d.open_thread("t2", &["--project", "proj"]);
    // A host directory with a file of the same name, which only root can see into.
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("secret"), "host\n").unwrap();

    let w = Watcher::start(&d, &["t2"]);
    std::thread::sleep(Duration::from_millis(500));
    std::fs::create_dir(mnt.join("x")).unwrap();
    std::fs::write(mnt.join("x/secret"), "mine\n").unwrap();
    std::fs::remove_file(mnt.join("x/secret")).unwrap();
    std::fs::remove_dir(mnt.join("x")).unwrap();
    std::os::unix::fs::symlink(host.path(), mnt.join("x")).unwrap();
    let lines = w.until(|l| last_kind(l, "x").is_some() && last_kind(l, "x/secret").is_some());
    assert_eq!(
        last_kind(&lines, "x/secret").as_deref(),
        Some("removed"),
        "{lines:?}"
    );
    assert_eq!(
        last_kind(&lines, "x").as_deref(),
        Some("changed"),
        "{lines:?}"
    );
    d.cli_ok(["release", "t2"]);
}

/// One change is one line (issue 32, item 7): `echo x > file` (open with truncation, write, close)
/// printed three `changed` lines, and `sed -i` six `removed` lines for its temporary file. The
/// lines of a path are held until it has been quiet for one poll (100 ms), then printed once.
#[test]
fn one_change_is_one_line() {
    let src = tempfile::tempdir().unwrap();
    let repo = GitRepo::init(&src.path().join("repo"));
    repo.write("f.txt", "x\n");
    repo.commit_all("initial", DATE);
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mnt = d.open_thread("t3", &["--project", "proj"]);
    let w = Watcher::start(&d, &["t3"]);
    std::thread::sleep(Duration::from_millis(500));
    let shell = |script: &str| {
        let mut c = std::process::Command::new("sh");
        c.arg("-c").arg(script).current_dir(&mnt);
        run(&mut c, CMD_TIMEOUT).assert_ok();
    };
    let settle = Duration::from_millis(1500);

    shell("echo x > f.txt");
    let lines = w.lines_for(settle);
    assert_eq!(lines.len(), 1, "echo > an existing file: {lines:?}");
    assert_eq!(
        (lines[0]["path"].as_str(), lines[0]["kind"].as_str()),
        (Some("f.txt"), Some("changed"))
    );

    shell("echo new > g.txt");
    let lines = w.lines_for(settle);
    assert_eq!(lines.len(), 1, "echo > a new file: {lines:?}");
    assert_eq!(
        (lines[0]["path"].as_str(), lines[0]["kind"].as_str()),
        (Some("g.txt"), Some("changed"))
    );

    shell("sed -i s/x/y/ f.txt");
    let lines = w.lines_for(settle);
    let of = |path: &str| lines.iter().filter(|v| v["path"] == path).count();
    assert_eq!(of("f.txt"), 1, "sed -i: {lines:?}");
    assert_eq!(last_kind(&lines, "f.txt").as_deref(), Some("changed"));
    let removed: Vec<&Value> = lines.iter().filter(|v| v["kind"] == "removed").collect();
    assert!(removed.len() <= 1, "sed -i's temporary file: {removed:?}");
    assert!(lines.len() <= 2, "sed -i: {lines:?}");
    assert_eq!(std::fs::read_to_string(mnt.join("f.txt")).unwrap(), "y\n");
    drop(w);
    d.cli_ok(["release", "t3"]);
}

/// A stream goes on across `octofs restart`: the CLI asks again with its token while the daemons
/// change hands; the new daemon's journal starts afresh (one `rescan` line), then a change made
/// after the restart is reported, and the stream still ends cleanly at release. Failed before: the
/// stream ended with `{"kind":"released"}` at the restart (the refusal "the daemon is restarting"
/// and the gap between the daemons were taken for the end of the workspace).
#[test]
fn a_stream_goes_on_across_a_restart() {
    let src = tempfile::tempdir().unwrap();
    let repo = GitRepo::init(&src.path().join("repo"));
    repo.write("README.md", "watch\n");
    repo.commit_all("initial", DATE);
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mnt = d.open_thread("t1", &["--project", "proj"]);
    let w = Watcher::start(&d, &["t1"]);
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(mnt.join("before.txt"), "b\n").unwrap();
    let lines = w.until(|l| last_kind(l, "before.txt").is_some());
    assert_eq!(last_kind(&lines, "before.txt").as_deref(), Some("changed"));

    for round in 0..2 {
        let out = d.cli(["restart"]);
        assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
        // The CLI asks the new daemon within a poll; a change made before that is in its rescan.
        std::thread::sleep(Duration::from_millis(1000));
        let name = format!("after-{round}.txt");
        std::fs::write(mnt.join(&name), "a\n").unwrap();
        let lines =
            w.until(|l| l.iter().any(|v| v["kind"] == "released") || last_kind(l, &name).is_some());
        assert!(
            lines.iter().all(|v| v["kind"] != "released"),
            "restart {round} ended the stream: {lines:?}"
        );
        assert_eq!(
            last_kind(&lines, &name).as_deref(),
            Some("changed"),
            "{lines:?}"
        );
    }

    d.cli_ok(["release", "t1"]);
    let end = w.until(|l| l.iter().any(|v| v["kind"] == "released"));
    assert!(
        end.last().is_some_and(|v| v["kind"] == "released"),
        "{end:?}"
    );
    let mut w = w;
    let status = wait_timeout(&mut w.child, Duration::from_secs(10)).expect("watch exits");
    assert!(status.success(), "{status:?}");
}
