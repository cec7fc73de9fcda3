//! A workspace is self-contained (issue 31): git in a sandbox that binds only the workspace
//! (bubblewrap: `/usr` and `/etc` read-only, the workspace as `/work`, every namespace unshared)
//! works as in a clone, because the mirror's objects are presented read-only inside the mount at
//! `.git/octofs/objects` and the workspace's alternates name them by a relative path. The daemon
//! checks the owner's access itself: git works on the host with the mirror's directory out of the
//! user's reach, and stops working when the owner is taken off the project.
//!
//! Failed before: in the sandbox `git log` answered "unable to normalize alternate object path:
//! <state>/mirrors/p/.git/objects" and `git status` "fatal: bad object HEAD"; with the mirrors
//! directory out of the user's reach, `git log` on the host failed the same way.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// An upstream with two commits, added as `project`, every listed user allowed.
fn project(d: &Daemon, project: &str, users: &[&str]) -> GitRepo {
    let repo = GitRepo::init(&d.base.join(format!("up-{project}")));
    repo.write("README.md", "# demo\n");
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.commit_all("initial", DATE1);
    repo.write("a.txt", "alpha\n");
    repo.commit_all("second", DATE2);
    let mut args = vec!["mirror", "add", project, repo.path.to_str().unwrap()];
    for u in users {
        args.extend_from_slice(&["--allow-user", u]);
    }
    d.cli_ok(args);
    repo
}

/// A daemon, project `p` (users a and b may use it), and thread `t` opened by user a: the user,
/// the daemon, the upstream repository and the workspace's path.
fn opened_by_a() -> (User, Daemon, GitRepo, PathBuf) {
    let a = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    let repo = project(&d, "p", &["octofs-test-user", "octofs-test-other"]);
    let out = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let ws = PathBuf::from(out.stdout_str().trim());
    (a, d, repo, ws)
}

/// `script` run by `sh` in bubblewrap as `u` (None: root), the workspace `ws` bound as `/work` and
/// nothing else of the host but `/usr` and `/etc` (read-only).
fn in_sandbox(u: Option<User>, ws: &Path, script: &str) -> Out {
    let args = [
        "--ro-bind",
        "/usr",
        "/usr",
        "--ro-bind",
        "/etc",
        "/etc",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        // The workspace's fsmonitor hook is the daemon's, outside the sandbox (README).
        "--setenv",
        "GIT_CONFIG_COUNT",
        "1",
        "--setenv",
        "GIT_CONFIG_KEY_0",
        "core.fsmonitor",
        "--setenv",
        "GIT_CONFIG_VALUE_0",
        "false",
        "--bind",
    ];
    let mut c = match u {
        Some(u) => as_user(u, "bwrap"),
        None => {
            let mut c = Command::new("bwrap");
            agent_env(&mut c);
            c
        }
    };
    c.args(args)
        .arg(ws)
        .args([
            "/work",
            "--chdir",
            "/work",
            "--unshare-all",
            "--die-with-parent",
            "sh",
            "-ec",
            script,
        ])
        .current_dir("/");
    run(&mut c, CMD_TIMEOUT)
}

/// The names in a host directory, sorted, each followed by a space (as `ls | tr '\n' ' '`).
fn listing(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.iter().map(|n| format!("{n} ")).collect()
}

#[track_caller]
fn ok(out: &Out) -> String {
    assert!(out.success(), "{}", out.describe());
    out.stdout_str()
}

/// What every sandboxed check compares with: the upstream's own history.
fn history(repo: &GitRepo) -> String {
    repo.git(["log", "--format=%H %s"])
}

/// git in a sandbox: log, status, commit, fsck, gc, repack, worktree add and clone, the outputs
/// compared with the upstream's.
fn git_works_in(u: Option<User>, ws: &Path, repo: &GitRepo, mirror: &Path) {
    let want = history(repo);
    assert_eq!(ok(&in_sandbox(u, ws, "git log --format='%H %s'")), want);
    assert_eq!(ok(&in_sandbox(u, ws, "git status --porcelain")), "");
    assert_eq!(
        ok(&in_sandbox(u, ws, "git cat-file -p HEAD:a.txt")),
        "alpha\n"
    );
    let script = "echo three > c.txt
git add c.txt
git commit -q -m third
git fsck --no-progress 2>&1
git gc -q
git repack -q -a -d
git status --porcelain
git log --format=%s";
    assert_eq!(
        ok(&in_sandbox(u, ws, script)),
        "third\nsecond\ninitial\n",
        "commit, fsck, gc, repack"
    );
    let script = "git worktree add -q /tmp/wt -b side 2>&1
git -C /tmp/wt log --format=%s
git clone -q /work /tmp/x 2>&1
git -C /tmp/x log --format=%s
git -C /tmp/x fsck --no-progress 2>&1";
    assert_eq!(
        ok(&in_sandbox(u, ws, script)),
        "third\nsecond\ninitial\nthird\nsecond\ninitial\n",
        "worktree add, clone"
    );
    // The base objects are read-only and nobody's to change.
    let out = in_sandbox(
        u,
        ws,
        "ls .git/octofs/objects | tr '\\n' ' '; echo
for p in .git/octofs/objects/x .git/octofs/objects/pack/x; do ! touch $p 2>/dev/null; done
! mkdir .git/octofs/objects/y 2>/dev/null
! rm -rf .git/octofs 2>/dev/null
! mv .git/octofs .git/elsewhere 2>/dev/null
cat .git/objects/info/alternates",
    );
    let text = ok(&out);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some(listing(&mirror.join(".git/objects")).as_str())
    );
    assert_eq!(lines.next(), Some("../octofs/objects"));
}

#[test]
fn git_works_in_a_sandbox_that_binds_only_the_workspace() {
    let (a, d, repo, ws) = opened_by_a();
    // The user cannot reach the mirrors at all (an ACL grant's mask goes with the mode).
    chmod(&d.state.join("mirrors"), 0o700);
    let host_log = |u: User| {
        let mut c = as_user(u, "git");
        c.arg("-C").arg(&ws).args(["log", "--format=%H %s"]);
        run(&mut c, CMD_TIMEOUT)
    };
    assert_eq!(ok(&host_log(a)), history(&repo), "git on the host");
    git_works_in(Some(a), &ws, &repo, &d.mirror("p"));

    // Objects the mirror gains are found and listed at once (nothing of the subtree is cached,
    // not even a miss).
    repo.write("b.txt", "beta\n");
    repo.commit_all("fourth", DATE2);
    let new = repo.git(["rev-parse", "HEAD"]).trim().to_string();
    let show =
        format!("ls .git/octofs/objects | tr '\\n' ' '; echo; git cat-file -p {new}:b.txt || true");
    let before = ok(&in_sandbox(Some(a), &ws, &show));
    assert!(!before.contains("beta"), "{before}");
    d.cli_ok(["mirror", "sync", "p"]);
    let after = ok(&in_sandbox(Some(a), &ws, &show));
    assert_eq!(
        after,
        format!("{}\nbeta\n", listing(&d.mirror("p").join(".git/objects"))),
        "the mirror's new objects"
    );

    // Taken off the project: the owner's git no longer reads the history, here or in a sandbox
    // (in a workspace that has not copied it: `repack -a` above did, as in any clone).
    let out = d.cli_as(a, &["open", "t2", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let ws = PathBuf::from(out.stdout_str().trim());
    let host_log = |u: User| {
        let mut c = as_user(u, "git");
        c.arg("-C").arg(&ws).args(["log", "--format=%s"]);
        run(&mut c, CMD_TIMEOUT)
    };
    assert_eq!(ok(&host_log(a)), "fourth\nsecond\ninitial\n");
    d.cli_ok(["mirror", "access", "p", "--allow-user", "octofs-test-other"]);
    let revoked = host_log(a);
    assert!(
        !revoked.success(),
        "a revoked owner still reads the history: {}",
        revoked.describe()
    );
    let revoked = in_sandbox(Some(a), &ws, "git log --format=%s");
    assert!(
        !revoked.success(),
        "a revoked owner still reads the history in a sandbox: {}",
        revoked.describe()
    );
    // Nor does another user, even allowed on the project, read it through this workspace.
    chmod(&ws, 0o755);
    let b = user_b();
    let mut c = as_user(b, "cat");
    c.arg(ws.join(".git/octofs/objects/info/packs"));
    let out = run(&mut c, CMD_TIMEOUT);
    assert!(
        !out.success(),
        "another user read the objects: {}",
        out.describe()
    );
    chmod(&ws, 0o700);
    d.cli_ok(["release", "t"]);
    d.cli_ok(["release", "t2"]);
}

#[test]
fn git_works_in_a_sandbox_of_root_s_thread() {
    let d = Daemon::start();
    let repo = project(&d, "p", &[]);
    let ws = PathBuf::from(d.cli_ok(["open", "r", "--project", "p"]).trim());
    git_works_in(None, &ws, &repo, &d.mirror("p"));
    d.cli_ok(["release", "r"]);
}

/// `octofs run` as an ordinary user: one command opens the thread and runs in a sandbox that
/// sees the workspace at `/work` and nothing writable of the host. A loop in such a sandbox goes
/// on across `octofs restart` without an error, and `release --when-idle` waits until the sandbox
/// is gone — also while no process of it has its cwd in the workspace (its bind still reaches it)
/// — then saves everything. Failed before: there was no `run`, and a sandbox's bind of the
/// workspace was not seen by the busy check (its references are on the copy of the mount), so
/// `release --when-idle` released at once under a working sandbox.
#[test]
fn octofs_run_sandboxes_a_command_across_a_restart_and_release_waits_for_it() {
    let a = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    project(&d, "p", &["octofs-test-user"]);
    let out = d.cli_as(
        a,
        &[
            "run",
            "t",
            "--project",
            "p",
            "--",
            "sh",
            "-ec",
            "pwd; git log --format=%s; git status --porcelain; echo made > made.txt; ls /",
        ],
    );
    let text = ok(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("/work"));
    assert_eq!(lines.next(), Some("second"));
    assert_eq!(lines.next(), Some("initial"));
    let top: Vec<&str> = lines.collect();
    let allowed = [
        "bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "proc", "dev", "tmp",
        "work",
    ];
    assert!(
        top.iter().all(|n| allowed.contains(n)),
        "the sandbox sees more of the host: {top:?}"
    );
    let ws = d.mount("t");
    assert_eq!(read_ws(&ws.join("made.txt")).unwrap(), b"made\n");

    // A working sandbox across a restart.
    let log = d.base.join("sandbox.out");
    let script = "n=0
while [ ! -e stop ]; do
  git status --porcelain >/dev/null || echo FAIL status
  [ \"$(cat made.txt)\" = made ] || echo FAIL read
  n=$((n+1)); echo $n > count.txt
  sleep 0.05
done
cd /tmp
sleep 1.5
echo done";
    let mut c = as_user(a, bin());
    c.arg("--state")
        .arg(&d.state)
        .arg("--root")
        .arg(&d.root)
        .args(["run", "t", "--", "sh", "-c", script])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::piped())
        .current_dir("/");
    let mut sandbox = c.spawn().expect("octofs run");
    let count = |ws: &Path| -> u64 {
        read_ws(&ws.join("count.txt"))
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    wait_until("the sandbox's loop starts", CMD_TIMEOUT, || count(&ws) >= 3);
    // (Each `run` opens the thread; one caller counts once.)
    let out = d.cli_as(a, &["release", "t", "--when-idle"]);
    assert!(out.stdout_str().contains("pending"), "{}", out.describe());
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(is_mounted(&ws), "released under a working sandbox");
    let out = d.cli(["restart"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let before = count(&ws);
    wait_until(
        "the sandbox's loop goes on after the restart",
        CMD_TIMEOUT,
        || count(&ws) > before,
    );

    // The loop ends and the sandbox sleeps in its /tmp: its bind still holds the workspace.
    let mut t = as_user(a, "touch");
    t.arg(ws.join("stop"));
    ok(&run(&mut t, CMD_TIMEOUT));
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(
        is_mounted(&ws),
        "released while the sandbox still had it bound"
    );
    assert_eq!(d.state_of("t"), "mounted");
    let status = wait_timeout(&mut sandbox, CMD_TIMEOUT).expect("the sandbox ends");
    assert!(status.success(), "octofs run: {status:?}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!said.contains("FAIL") && said.ends_with("done\n"), "{said}");
    wait_until("released once the sandbox left", CMD_TIMEOUT, || {
        d.state_of("t") == "released"
    });
    let final_count = count(&ws);
    assert_eq!(final_count, 0, "the mount point still shows files");
    let out = d.cli_as(a, &["open", "t"]);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(read_ws(&ws.join("made.txt")).unwrap(), b"made\n");
    assert!(
        count(&ws) > before,
        "the sandbox's last writes were not saved"
    );
    d.cli_ok(["release", "t"]);
}

/// A from-scratch `cargo build` of a crate in `octofs run`, the toolchain bound read-only, its
/// binary run, and `git status` clean (the target directory is ignored).
#[test]
fn a_from_scratch_cargo_build_runs_in_octofs_run() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-c"));
    repo.write(
        "Cargo.toml",
        "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    );
    repo.write(
        "src/main.rs",
        "mod answer;\nfn main() {\n    println!(\"hello from octofs {}\", answer::ANSWER);\n}\n",
    );
    repo.write("src/answer.rs", "pub const ANSWER: u32 = 42;\n");
    repo.write(".gitignore", "/target\n/Cargo.lock\n");
    repo.commit_all("a crate", DATE1);
    d.cli_ok(["mirror", "add", "c", repo.path.to_str().unwrap()]);
    let sysroot = String::from_utf8(
        Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .expect("rustc")
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let path = format!("PATH={sysroot}/bin:/usr/bin:/bin");
    let out = run(
        d.command().args([
            "run",
            "c",
            "--project",
            "c",
            "--ro",
            &sysroot,
            "--env",
            &path,
            "--env",
            "CARGO_HOME=/tmp/cargo",
            "--",
            "sh",
            "-ec",
            "cargo build --offline -q 2>&1; ./target/debug/hello; git status --porcelain",
        ]),
        std::time::Duration::from_secs(300),
    );
    assert_eq!(ok(&out), "hello from octofs 42\n");
    d.cli_ok(["release", "c"]);
}

/// A sandbox works on across a `kill -9` of the daemon: the connection keeper holds the mount's
/// descriptors, the next daemon adopts the mount, and the sandbox's bind (a copy of the mount in its
/// own namespace, on the same connection) sees a pause, no error: its loop of `git status`, reads
/// and appends goes on and every line it appended is there.
#[test]
fn a_sandbox_works_on_across_a_daemon_crash() {
    let a = user_a();
    let mut d = Daemon::start();
    open_the_way(&d);
    project(&d, "p", &["octofs-test-user"]);
    let out = d.cli_as(a, &["open", "k", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let ws = d.mount("k");
    let log = d.base.join("crash-sandbox.out");
    let script = "n=0
while [ ! -e stop ]; do
  git status --porcelain >/dev/null || echo FAIL status
  [ \"$(cat a.txt)\" = alpha ] || echo FAIL read
  n=$((n+1)); echo $n >> lines.txt || echo FAIL append
  sleep 0.05
done
echo done $n";
    let mut c = as_user(a, bin());
    c.arg("--state")
        .arg(&d.state)
        .arg("--root")
        .arg(&d.root)
        .args(["run", "k", "--", "sh", "-c", script])
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::piped())
        .current_dir("/");
    let mut sandbox = c.spawn().expect("octofs run");
    let lines = |ws: &Path| -> usize {
        read_ws(&ws.join("lines.txt"))
            .map(|b| b.split(|c| *c == b'\n').filter(|l| !l.is_empty()).count())
            .unwrap_or(0)
    };
    wait_until("the sandbox's loop starts", CMD_TIMEOUT, || lines(&ws) >= 3);
    d.kill9();
    std::thread::sleep(std::time::Duration::from_millis(300));
    d.spawn();
    let before = lines(&ws);
    std::thread::sleep(std::time::Duration::from_millis(800));
    assert!(
        lines(&ws) > before,
        "the sandbox's loop stopped after the crash\n{}",
        d.log_tail()
    );
    let mut t = as_user(a, "touch");
    t.arg(ws.join("stop"));
    ok(&run(&mut t, CMD_TIMEOUT));
    let status = wait_timeout(&mut sandbox, CMD_TIMEOUT).expect("the sandbox ends");
    assert!(status.success(), "octofs run: {status:?}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!said.contains("FAIL"), "{said}\n{}", d.log_tail());
    let n: usize = said
        .trim()
        .strip_prefix("done ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    let got = String::from_utf8(read_ws(&ws.join("lines.txt")).unwrap()).unwrap();
    let want: String = (1..=n).map(|i| format!("{i}\n")).collect();
    assert_eq!(got, want, "the appended lines");
    d.cli_ok(["release", "k"]);
}

/// The objects tree keeps its directories' names for a second but no attributes (issue 33,
/// `src/fs/objects.rs`): a pack the mirror gains is still found by the next git started right
/// after it, because opening `pack/` asks its attributes again and the kernel drops the listing
/// it cached when the mtime moved (with the attributes kept for the second too, git read the
/// cached listing without the new pack and answered "path 'b.txt' does not exist"), as is a new
/// fan-out directory in `objects/`; and an owner taken off the project is refused at the next
/// walk into the tree, names kept or not.
#[test]
fn a_pack_the_mirror_gains_and_a_revocation_are_seen_at_once_with_names_kept() {
    let (a, d, repo, ws) = opened_by_a();

    // The upstream's next commit as one pack, made ahead outside the mirror.
    repo.write("b.txt", "beta\n");
    repo.commit_all("third", DATE2);
    let new = repo.git(["rev-parse", "HEAD"]).trim().to_string();
    let stage = d.base.join("stage");
    std::fs::create_dir(&stage).expect("mkdir stage");
    let script = format!(
        "printf 'HEAD\\n^HEAD~1\\n' | git -C '{}' pack-objects --revs -q '{}/pack'",
        repo.path.display(),
        stage.display()
    );
    let name = ok(&run(Command::new("sh").args(["-c", &script]), CMD_TIMEOUT));
    let name = format!("pack-{}", name.trim());
    let packs = d.mirror("p").join(".git/objects/pack");

    let cat = |what: &str| {
        let mut c = as_user(a, "git");
        c.arg("-C").arg(&ws).args(["cat-file", "-p", what]);
        run(&mut c, CMD_TIMEOUT)
    };
    // git lists `pack/` (the kernel caches the listing and the names on the way). Twice: the
    // process after the first one in a new mount was seen listing `pack/` afresh whatever the
    // TTLs, which would hide a stale listing.
    assert_eq!(ok(&cat("HEAD:a.txt")), "alpha\n");
    assert_eq!(ok(&cat("HEAD:a.txt")), "alpha\n");
    let t = std::time::Instant::now();
    for ext in ["pack", "idx"] {
        let to = packs.join(format!("{name}.{ext}"));
        let from = stage.join(format!("{name}.{ext}"));
        if std::fs::rename(&from, &to).is_err() {
            std::fs::copy(&from, &to).expect("copy the pack into the mirror");
        }
    }
    let seen = cat(&format!("{new}:b.txt"));
    eprintln!("the new pack was read {:?} after it was added", t.elapsed());
    assert_eq!(
        ok(&seen),
        "beta\n",
        "an object of a pack the mirror gained{}",
        d.log_tail()
    );

    // A loose object in a fan-out directory the mirror did not have: `objects/` lists it at once
    // too (its attributes, and so the mtime its cached listing is checked against, are not kept).
    let ls = || {
        let mut c = as_user(a, "ls");
        c.arg(ws.join(".git/octofs/objects"));
        ok(&run(&mut c, CMD_TIMEOUT))
    };
    ls();
    let listed = ls();
    let script = format!(
        "g='{}'; i=0
while :; do h=$(echo loose$i | git --git-dir=\"$g\" hash-object --stdin)
  [ -d \"$g/objects/$(echo $h | cut -c1-2)\" ] || break; i=$((i+1)); done
echo loose$i | git --git-dir=\"$g\" hash-object -w --stdin",
        d.mirror("p").join(".git").display()
    );
    let loose = ok(&run(Command::new("sh").args(["-c", &script]), CMD_TIMEOUT));
    let fan_out = &loose.trim()[..2];
    assert!(!listed.lines().any(|l| l == fan_out), "{listed}");
    let now = ls();
    assert!(
        now.lines().any(|l| l == fan_out),
        "objects/{fan_out} made in the mirror is not listed: {now}"
    );

    d.cli_ok(["mirror", "access", "p", "--allow-user", "octofs-test-other"]);
    let revoked = cat("HEAD:a.txt");
    eprintln!("refused {:?} after the pack was added", t.elapsed());
    assert!(
        !revoked.success(),
        "a revoked owner still reads the history: {}",
        revoked.describe()
    );
    d.cli_ok(["release", "t"]);
}
