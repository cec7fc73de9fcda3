//! The control socket's trust boundary, tried as two unprivileged local users would (issue 10): every
//! request is authenticated by its peer credentials, a workspace belongs to the user who opened it
//! (only its owner or root acts on it), a project may restrict who binds it, the socket works
//! whatever the daemon's umask, the count of a shared thread's users survives a restart, and the
//! socket stays responsive (fsmonitor, ping) under a flood of requests.
//!
//! The tests create two local users (`octofs-test-user`, `octofs-test-other`) when missing and run
//! the CLI as them with `setpriv`.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// git in `dir` as `u`.
fn git_as(u: User, dir: &Path, args: &[&str]) -> Out {
    let mut c = as_user(u, "git");
    c.arg("-C").arg(dir).args(args);
    run(&mut c, CMD_TIMEOUT)
}

/// Takes every permission of group and others off everything in `<state>` but the socket (as a
/// daemon with private state keeps it), leaving `<state>` itself searchable.
fn make_state_private(d: &Daemon) {
    make_private(&d.state, &d.socket());
    chmod(&d.state, 0o711);
}

/// `chmod -R go-rwx dir`, sparing `sock`.
fn make_private(dir: &Path, sock: &Path) {
    fn walk(p: &Path, sock: &Path) {
        let m = std::fs::symlink_metadata(p).expect("stat");
        if m.file_type().is_symlink() || p == sock {
            return;
        }
        chmod(p, m.mode() & 0o700);
        if m.is_dir() {
            for e in std::fs::read_dir(p).expect("readdir") {
                walk(&e.expect("entry").path(), sock);
            }
        }
    }
    walk(dir, sock);
}

/// An upstream with a couple of commits, added as `project` by root (extra `mirror add` arguments
/// in `extra`).
fn project(d: &Daemon, project: &str, extra: &[&str]) -> GitRepo {
    let repo = GitRepo::init(&d.base.join(format!("up-{project}")));
    repo.write("README.md", "# demo\n");
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.commit_all("initial", DATE1);
    repo.write("a.txt", "alpha\n");
    repo.commit_all("second", DATE2);
    let mut args = vec!["mirror", "add", project, repo.path.to_str().unwrap()];
    args.extend_from_slice(extra);
    d.cli_ok(args);
    repo
}

/// Asserts a refusal: non-zero exit, one line on stderr saying "permission denied" and every needle.
#[track_caller]
fn assert_denied(out: &Out, needles: &[&str]) {
    out.assert_failed();
    let err = out.stderr_str();
    let err = err.trim();
    assert_eq!(err.lines().count(), 1, "one-line error: {}", out.describe());
    assert!(
        err.contains("permission denied"),
        "not a permission refusal: {}",
        out.describe()
    );
    for n in needles {
        assert!(err.contains(n), "error lacks {n:?}: {}", out.describe());
    }
}

fn threads_of(out: &str) -> Vec<String> {
    let v = parse_json("list --json", out);
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["thread"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn is_mounted(p: &Path) -> bool {
    mount_points().iter().any(|m| m == p)
}

/// One raw request line on the socket; returns the answer line.
fn raw(socket: &Path, line: &[u8]) -> std::io::Result<String> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(line)?;
    // A line without a newline ends with the connection's write side.
    s.shutdown(std::net::Shutdown::Write)?;
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer)?;
    Ok(answer)
}

#[test]
fn owner_works_in_own_workspace_with_git_and_fsmonitor() {
    let a = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    project(&d, "p", &[]);
    // Private state: the owner reaches the mirror's objects only through what the daemon grants.
    make_state_private(&d);
    let out = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    assert!(out.stderr.is_empty(), "{}", out.describe());
    let mount = PathBuf::from(out.stdout_str().trim());
    assert_eq!(mount, d.mount("t"));
    // Files are presented as the owner's.
    for rel in ["", "README.md", "src", ".git", ".git/index"] {
        let m = std::fs::symlink_metadata(mount.join(rel)).expect("stat");
        assert_eq!((m.uid(), m.gid()), (a.uid, a.gid), "owner of {rel:?}");
    }
    // The owner writes, and git works for them: reading history goes through the alternates into
    // the daemon's mirror (ACLs), `git status` asks the daemon's fsmonitor as the owner.
    let sh = |script: &str| {
        let mut c = as_user(a, "sh");
        c.arg("-c").arg(script).current_dir(&mount);
        run(&mut c, CMD_TIMEOUT)
    };
    // Base content (served from the private blob cache by the daemon) reads as the owner.
    assert_eq!(
        sh("cat README.md src/lib.rs").stdout_str(),
        "# demo\npub fn f() {}\n"
    );
    // The grant is the objects' only: the mirror's config, refs and checkout stay closed.
    let mirror = d.mirror("p");
    for closed in [".git/config", ".git/HEAD", "README.md"] {
        let peek = sh(&format!("cat {}", mirror.join(closed).display()));
        assert!(
            !peek.success(),
            "{closed} of the mirror readable: {}",
            peek.describe()
        );
    }
    sh(&format!("ls {}", mirror.join(".git").display())).assert_failed();
    sh("echo more >> a.txt").assert_ok();
    let log = git_as(a, &mount, &["log", "--format=%s"]);
    assert!(log.success(), "{}", log.describe());
    assert_eq!(log.stdout_str(), "second\ninitial\n");
    let st = git_as(a, &mount, &["status", "--porcelain"]);
    assert!(st.success(), "{}", st.describe());
    assert_eq!(st.stdout_str(), " M a.txt\n");
    assert!(
        !st.stderr_str().contains("fsmonitor") && !st.stderr_str().contains("ermission"),
        "git status complained: {}",
        st.describe()
    );
    let hook = d.cli_as(a, &["fsmonitor", "t", "2", ""]);
    assert!(
        hook.success(),
        "fsmonitor hook as owner: {}",
        hook.describe()
    );
    // The owner saves, releases and resumes its own workspace. (Untracked files and new commits are
    // left out of this round trip: saving those runs git in the workspace, as its owner.)
    let snap = d.cli_as(a, &["snapshot", "t"]);
    assert!(snap.success(), "{}\n{}", snap.describe(), d.log_tail());
    let rel = d.cli_as(a, &["release", "t"]);
    assert!(rel.success(), "{}\n{}", rel.describe(), d.log_tail());
    assert!(!is_mounted(&mount));
    let again = d.cli_as(a, &["open", "t"]);
    assert!(again.success(), "{}\n{}", again.describe(), d.log_tail());
    let st = git_as(a, &mount, &["status", "--porcelain"]);
    assert_eq!(st.stdout_str(), " M a.txt\n", "{}", st.describe());
    // The owner commits: new objects go into the workspace, history is read through the mirror.
    sh("echo new > new.txt").assert_ok();
    git_as(a, &mount, &["add", "-A"]).assert_ok();
    let c = git_as(a, &mount, &["commit", "-q", "-m", "agent work"]);
    assert!(c.success(), "{}", c.describe());
    let log = git_as(a, &mount, &["log", "--format=%s"]);
    assert_eq!(
        log.stdout_str(),
        "agent work\nsecond\ninitial\n",
        "{}",
        log.describe()
    );
    let show = git_as(a, &mount, &["show", "--stat", "--format=%s", "HEAD~2"]);
    assert!(show.success(), "{}", show.describe());
    // Objects the mirror gains later (a snapshot of another thread) stay readable to the owner.
    d.cli_ok(["open", "other", "--project", "p"]);
    std::fs::write(d.mount("other").join("a.txt"), "root's change\n").expect("write");
    let root_snap = d.cli_ok(["snapshot", "other"]).trim().to_string();
    let cat = git_as(
        a,
        &mount,
        &["cat-file", "-p", &format!("{root_snap}:a.txt")],
    );
    assert_eq!(cat.stdout_str(), "root's change\n", "{}", cat.describe());
    // Modes tightened under the mirror (chmod narrows every ACL's mask): the next open grants
    // again.
    make_private(&d.state.join("mirrors"), &d.socket());
    let out = d.cli_as(a, &["open", "t2", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    for m in [mount.clone(), d.mount("t2")] {
        let log = git_as(a, &m, &["log", "-1", "--format=%s", "HEAD~1"]);
        assert!(log.success(), "{}", log.describe());
    }
}

#[test]
fn other_users_cannot_touch_a_workspace_root_can() {
    let (a, b) = (user_a(), user_b());
    let d = Daemon::start();
    open_the_way(&d);
    let up = project(&d, "p", &[]);
    let out = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let owner = format!("uid {}", a.uid);
    for args in [
        &["snapshot", "t"][..],
        &["release", "t"],
        &["release", "t", "--force"],
        &["diff", "t"],
        &["status", "t"],
        &["stats", "t"],
        &["fsmonitor", "t", "2", ""],
        &["open", "t"],
        &["open", "t", "--project", "p"],
    ] {
        assert_denied(&d.cli_as(b, args), &["thread t", &owner]);
    }
    assert!(is_mounted(&d.mount("t")), "a refused release unmounted");
    // B sees none of A's threads; A sees its own; root sees all.
    assert!(threads_of(&d.cli_as(b, &["list", "--json"]).stdout_str()).is_empty());
    assert_eq!(
        threads_of(&d.cli_as(a, &["list", "--json"]).stdout_str()),
        ["t"]
    );
    assert_eq!(threads_of(&d.cli_ok(["list", "--json"])), ["t"]);
    // Mirrors and the daemon are root's.
    let up_path = up.path.to_str().unwrap();
    assert_denied(&d.cli_as(b, &["mirror", "add", "q", up_path]), &[]);
    assert!(!d.mirror("q").exists());
    assert_denied(&d.cli_as(b, &["mirror", "sync", "p"]), &[]);
    assert_denied(&d.cli_as(b, &["sweep", "--idle", "0"]), &[]);
    assert_denied(&d.cli_as(b, &["stop"]), &[]);
    // Request statistics: a thread's are its owner's, the daemon-wide sum is root's.
    d.cli_as(a, &["stats", "t"]).assert_ok();
    assert_denied(&d.cli_as(a, &["stats"]), &[]);
    d.cli_ok(["stats"]);
    d.cli_ok(["stats", "t"]);
    // Root acts on A's thread; opening it makes root a second user, not its owner.
    d.cli_ok(["status", "t"]);
    d.cli_ok(["diff", "t"]);
    d.cli_ok(["snapshot", "t"]);
    d.cli_ok(["open", "t"]);
    let m = std::fs::metadata(d.mount("t")).expect("stat");
    assert_eq!(m.uid(), a.uid);
    d.cli_ok(["release", "t"]);
    assert!(is_mounted(&d.mount("t")), "A still holds it");
    // A released thread stays A's: B cannot resume it.
    d.cli_as(a, &["release", "t"]).assert_ok();
    assert!(!is_mounted(&d.mount("t")));
    assert_denied(&d.cli_as(b, &["open", "t"]), &["thread t", &owner]);
    assert_denied(&d.cli_as(b, &["status", "t"]), &["thread t", &owner]);
}

#[test]
fn a_project_restricts_who_binds_it() {
    let (a, b) = (user_a(), user_b());
    let d = Daemon::start();
    open_the_way(&d);
    project(&d, "p", &["--allow-user", "octofs-test-user"]);
    assert_denied(
        &d.cli_as(b, &["open", "tb", "--project", "p"]),
        &["project p"],
    );
    assert!(!d.mount("tb").exists() || !is_mounted(&d.mount("tb")));
    let ok = d.cli_as(a, &["open", "ta", "--project", "p"]);
    assert!(ok.success(), "{}\n{}", ok.describe(), d.log_tail());
    // Only root changes the list; a numeric group id of B opens it to B.
    assert_denied(
        &d.cli_as(
            b,
            &["mirror", "access", "p", "--allow-user", "octofs-test-other"],
        ),
        &[],
    );
    d.cli_ok([
        "mirror",
        "access",
        "p",
        "--allow-user",
        "octofs-test-user",
        "--allow-group",
        &b.gid.to_string(),
    ]);
    let ok = d.cli_as(b, &["open", "tb", "--project", "p"]);
    assert!(ok.success(), "{}\n{}", ok.describe(), d.log_tail());
    d.cli_as(b, &["release", "tb"]).assert_ok();
    d.cli_as(a, &["release", "ta"]).assert_ok();
    // A group counts as the caller's supplementary group too (the kernel's record of the peer).
    project(&d, "q", &["--allow-group", &a.gid.to_string()]);
    assert_denied(
        &d.cli_as(b, &["open", "tq", "--project", "q"]),
        &["project q"],
    );
    let ok = d.cli_as_in(b, &[a.gid], &["open", "tq", "--project", "q"]);
    assert!(ok.success(), "{}\n{}", ok.describe(), d.log_tail());
    d.cli_as(b, &["release", "tq"]).assert_ok();
}

/// Taking a user off a project's allow list takes back their read grant on its objects at once: their
/// git can no longer read the project's history, while the users still allowed keep theirs.
#[test]
fn revoking_a_user_takes_back_the_objects_grant() {
    let (a, b) = (user_a(), user_b());
    let d = Daemon::start();
    open_the_way(&d);
    project(
        &d,
        "p",
        &[
            "--allow-user",
            "octofs-test-user",
            "--allow-user",
            "octofs-test-other",
        ],
    );
    make_state_private(&d);
    let mut mounts = Vec::new();
    for (u, t) in [(a, "ta"), (b, "tb")] {
        let out = d.cli_as(u, &["open", t, "--project", "p"]);
        assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
        mounts.push(PathBuf::from(out.stdout_str().trim()));
    }
    let history = |u: User, mount: &Path| git_as(u, mount, &["log", "--format=%s"]);
    for (u, m) in [(a, &mounts[0]), (b, &mounts[1])] {
        let out = history(u, m);
        assert!(out.success(), "{}", out.describe());
        assert_eq!(out.stdout_str(), "second\ninitial\n");
    }
    // The revocation names the live thread it affects and what happens to it.
    let said = d.cli_ok(["mirror", "access", "p", "--allow-user", "octofs-test-user"]);
    let revoked_line = said
        .lines()
        .find(|l| l.starts_with("revoked: live thread tb of octofs-test-other"))
        .unwrap_or_else(|| panic!("the revocation does not list tb: {said}"));
    assert!(
        revoked_line.contains(&mounts[1].display().to_string())
            && revoked_line.contains("history")
            && revoked_line.contains("granted again"),
        "{revoked_line}"
    );
    assert!(!said.contains("thread ta"), "ta is not affected: {said}");
    // `mirror list` shows each project's access.
    let list = d.cli_ok(["mirror", "list"]);
    assert!(
        list.lines().next().is_some_and(|h| h.contains("ACCESS"))
            && list
                .lines()
                .any(|l| l.starts_with("p\t") && l.contains("users=octofs-test-user")),
        "mirror list does not show the access: {list}"
    );
    let kept = history(a, &mounts[0]);
    assert!(
        kept.success(),
        "the user still allowed lost access: {}",
        kept.describe()
    );
    let revoked = history(b, &mounts[1]);
    assert!(
        !revoked.success(),
        "a revoked user still reads the project's history: {}",
        revoked.describe()
    );
    // git says what it cannot reach (octofs's alternate of the project's objects), and the
    // thread's status says why.
    let err = revoked.stderr_str();
    assert!(err.contains("octofs/objects"), "{}", revoked.describe());
    let st = d.cli_as(b, &["status", "tb"]);
    st.assert_ok();
    assert!(
        st.stdout_str()
            .lines()
            .any(|l| l.starts_with("access:") && l.contains("revoked") && l.contains("project p")),
        "{}",
        st.describe()
    );
    assert!(
        !d.cli_as(a, &["status", "ta"])
            .stdout_str()
            .contains("access:"),
        "the user still allowed is told of a revocation"
    );
    // Granting it back applies to the same mount at once: no reopen.
    let said = d.cli_ok([
        "mirror",
        "access",
        "p",
        "--allow-user",
        "octofs-test-user",
        "--allow-user",
        "octofs-test-other",
    ]);
    assert!(
        said.lines()
            .any(|l| l.starts_with("granted: live thread tb of octofs-test-other")),
        "the grant does not list tb: {said}"
    );
    let back = history(b, &mounts[1]);
    assert!(
        back.success(),
        "git log after the grant: {}",
        back.describe()
    );
    assert_eq!(back.stdout_str(), "second\ninitial\n");
    let status = git_as(b, &mounts[1], &["status", "--porcelain"]);
    assert!(
        status.success(),
        "git status after the grant: {}",
        status.describe()
    );
    assert_eq!(status.stdout_str(), "");
    assert!(
        !d.cli_as(b, &["status", "tb"])
            .stdout_str()
            .contains("access:")
    );
    // Nothing else changed: both threads are still their owners' to save and release.
    d.cli_as(a, &["release", "ta"]).assert_ok();
    d.cli_as(b, &["release", "tb"]).assert_ok();
}

#[test]
fn a_daemon_started_under_umask_000_still_refuses_others() {
    let b = user_b();
    let mut d = Daemon::unstarted();
    // Set in the daemon's own shell, never in this process: other tests' threads create files
    // meanwhile (a process-wide umask 000 made another test's files 0666).
    d.spawn_under_umask("000");
    open_the_way(&d);
    let mode = std::fs::metadata(d.socket()).expect("socket").mode() & 0o7777;
    assert_eq!(mode, 0o666, "socket mode {mode:o}");
    let up = GitRepo::init(&d.base.join("up"));
    up.write("a", "a\n");
    up.commit_all("one", DATE1);
    assert_denied(
        &d.cli_as(b, &["mirror", "add", "q", up.path.to_str().unwrap()]),
        &["root"],
    );
    assert!(!d.mirror("q").exists());
}

/// Users of a thread are callers, each counted once (issue 32, item 5): its owner opening it again
/// (`cd $(octofs open t)`, doctor's advice) is not another user, root opening it is; the count
/// survives a restart, and a release that leaves others names them.
#[test]
fn users_of_a_shared_thread_survive_a_restart() {
    let a = user_a();
    let mut d = Daemon::start();
    open_the_way(&d);
    project(&d, "p", &[]);
    let path = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(path.success(), "{}\n{}", path.describe(), d.log_tail());
    for _ in 0..2 {
        d.cli_as(a, &["open", "t"]).assert_ok();
    }
    let st = parse_json("status", &d.cli_ok(["status", "t", "--json"]));
    assert_eq!(
        st["users"], 1,
        "the owner's second open counted another user: {st}"
    );
    d.cli_ok(["open", "t"]);
    d.stop();
    d.spawn();
    assert!(is_mounted(&d.mount("t")), "not remounted");
    let st = parse_json("status", &d.cli_ok(["status", "t", "--json"]));
    assert_eq!(st["users"], 2, "{st}");
    assert_eq!(
        st["user_names"],
        serde_json::json!(["octofs-test-user", "root"]),
        "{st}"
    );
    let out = d.cli_as(a, &["release", "t"]);
    out.assert_ok();
    let text = out.stdout_str();
    assert!(
        text.contains("still in use by 1 other user(s): root"),
        "the release does not name who still uses the thread: {text}"
    );
    assert!(
        is_mounted(&d.mount("t")),
        "one release unmounted a shared thread"
    );
    let out = d.cli_ok(["release", "t"]);
    assert!(out.starts_with("released"), "{out}");
    assert!(!is_mounted(&d.mount("t")));
}

fn daemon_threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn fsmonitor_and_ping_stay_prompt_under_a_flood_of_lists() {
    // 1,000 open connections need more than the usual soft limit of 1,024 descriptors, here and in
    // the daemon (which inherits it).
    raise_nofile_limit(4096);
    let d = Daemon::start();
    project(&d, "p", &[]);
    d.cli_ok(["open", "t", "--project", "p"]);
    std::fs::write(d.mount("t").join("x"), "x").expect("write");
    let pid = d.pid().expect("pid");
    let sock = d.socket();
    // 1,000 list connections, all sent before any answer is read.
    let flood = {
        let sock = sock.clone();
        std::thread::spawn(move || {
            let mut conns = Vec::new();
            for _ in 0..1000 {
                let mut s = UnixStream::connect(&sock).expect("connect");
                s.write_all(b"{\"cmd\":\"list\"}\n").expect("send");
                conns.push(s);
            }
            let mut answered = 0;
            for s in conns {
                s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
                let mut line = String::new();
                if BufReader::new(s).read_line(&mut line).is_ok() && line.contains("\"ok\":true") {
                    answered += 1;
                }
            }
            answered
        })
    };
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    let mut max_threads = 0;
    let mut rounds = 0;
    while !flood.is_finished() || rounds < 5 {
        let t = Instant::now();
        let out = d.cli(["fsmonitor", "t", "2", ""]);
        assert!(out.success(), "{}", out.describe());
        let ping = raw(&sock, b"{\"cmd\":\"ping\"}\n").expect("ping");
        assert!(ping.contains("pong"), "{ping}");
        worst = worst.max(t.elapsed());
        max_threads = max_threads.max(daemon_threads(pid));
        rounds += 1;
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "flood never ended"
        );
    }
    let answered = flood.join().expect("flood thread");
    eprintln!("worst fsmonitor+ping {worst:?} over {rounds} rounds; max threads {max_threads}");
    assert_eq!(answered, 1000, "every list answered");
    assert!(
        worst < Duration::from_secs(1),
        "fsmonitor + ping took {worst:?} under load"
    );
    assert!(max_threads <= 48, "daemon ran {max_threads} threads");
    d.cli_ok(["release", "t"]);
}

#[test]
fn a_bad_request_line_gets_an_error_reply() {
    let d = Daemon::start();
    let sock = d.socket();
    for line in [
        &b"{\"cmd\":\"ping\xff\"}\n"[..],
        b"\xc3\x28 not json\n",
        b"{\"cmd\":\"no-such\"}\n",
        b"garbage without newline",
    ] {
        let answer = raw(&sock, line).expect("answer");
        let v = parse_json("error reply", &answer);
        assert_eq!(v["ok"], false, "{answer}");
        assert!(
            v["error"].as_str().unwrap_or("").starts_with("bad request"),
            "{answer}"
        );
    }
    // An oversized line is refused with a reply too, and the daemon keeps serving.
    let mut big = vec![b'x'; 200 << 10];
    big.push(b'\n');
    let answer = {
        let s = UnixStream::connect(&sock).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut w = s.try_clone().expect("dup");
        // The daemon answers once the limit is passed and closes: the rest of the write may fail.
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(&big);
        });
        let mut answer = String::new();
        let _ = BufReader::new(s).read_line(&mut answer);
        let _ = writer.join();
        answer
    };
    assert!(answer.contains("bad request"), "{answer}");
    assert!(
        raw(&sock, b"{\"cmd\":\"ping\"}\n")
            .unwrap()
            .contains("pong")
    );
}
