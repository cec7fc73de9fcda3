//! Issue 28, item 4, tried as a hostile ordinary user (docs/security.md, privilege separation: one user's
//! threads are bounded so they cannot starve others; docs/lifecycle.md "Per-user limits").
//!
//! 1. [`a_user_at_the_thread_cap_is_refused_and_others_are_not`]: an ordinary user opened 500
//!    threads in 17 s (2,538 OS threads in the daemon); nothing bounded one user's live threads.
//! 2. [`a_user_over_quota_gets_edquot_and_others_keep_writing`]: one workspace filled the state
//!    file system and every other user's writes failed with ENOSPC; nothing bounded its bytes.
//! 3. [`concurrent_opens_of_one_user_do_not_pass_the_cap_together`]: the cap's check and count are
//!    one step, whatever the threads' own locks.

use crate::common;

use common::*;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// `sh -c script` as user `u` in directory `cwd` (a process of theirs, in their mount).
fn sh_as(u: User, cwd: &Path, script: &str) -> Out {
    let mut c = as_user(u, "sh");
    c.args(["-c", &format!("cd \"$0\" && {script}")])
        .arg(cwd)
        .current_dir("/");
    run(&mut c, CMD_TIMEOUT)
}

/// The size of `file` as user `u` sees it.
fn size_as(u: User, file: &Path) -> u64 {
    let out = run(as_user(u, "stat").args(["-c", "%s"]).arg(file), CMD_TIMEOUT);
    assert!(out.success(), "stat {}: {}", file.display(), out.describe());
    out.stdout_str().trim().parse().expect("a size")
}

/// Content of `file` as user `u` reads it.
fn cat_as(u: User, file: &Path) -> String {
    let out = run(as_user(u, "cat").arg(file), CMD_TIMEOUT);
    assert!(out.success(), "cat {}: {}", file.display(), out.describe());
    out.stdout_str()
}

#[track_caller]
fn assert_edquot(out: &Out, what: &str) {
    assert!(
        !out.success() && out.stderr_str().contains("quota exceeded"),
        "{what}: expected EDQUOT: {}",
        out.describe()
    );
}

/// The test's temp dir is root's 0700: both users must reach the socket and their mounts.
fn open_to_users(d: &Daemon) {
    use std::os::unix::fs::PermissionsExt;
    for p in [&d.base, &d.root] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}

fn project(d: &Daemon, users: &[User]) {
    add_project(d, "p", &[("README.md", "hello\n", 0o644)]);
    let mut args = vec!["mirror".to_string(), "access".into(), "p".into()];
    for u in users {
        args.extend(["--allow-user".to_string(), u.uid.to_string()]);
    }
    d.cli_ok(&args);
}

/// `ls` of a mount as user `u`: what a process of theirs sees there.
fn listing_as(u: User, m: &Path) -> String {
    let out = run(as_user(u, "ls").arg(m), CMD_TIMEOUT);
    assert!(out.success(), "ls {}: {}", m.display(), out.describe());
    out.stdout_str()
}

#[test]
fn a_user_at_the_thread_cap_is_refused_and_others_are_not() {
    let (a, b) = (user_a(), user_b());
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--max-threads-per-user", "2"]);
    open_to_users(&d);
    project(&d, &[a, b]);
    d.cli_as(a, &["open", "a1", "--project", "p"]).assert_ok();
    d.cli_as(a, &["open", "a2", "--project", "p"]).assert_ok();
    // Opening a live thread again is no new thread.
    d.cli_as(a, &["open", "a1"]).assert_ok();

    // The third: one line naming the cap and the count, and nothing of it left behind.
    d.cli_as(a, &["open", "a3", "--project", "p"])
        .assert_one_line_error(&["2 live threads", "--max-threads-per-user 2"]);
    assert!(!is_mounted(&d.mount("a3")), "a refused open mounted a3");
    assert!(!d.state.join("threads/a3.json").exists(), "a3 was bound");
    assert!(
        !d.state.join("workspaces/a3").exists(),
        "a3 has a workspace"
    );
    // A fork makes a new live thread too, and a chat workspace.
    d.cli_as(a, &["fork", "a1", "a4"])
        .assert_one_line_error(&["2 live threads", "--max-threads-per-user 2"]);
    d.cli_as(a, &["open", "a5"])
        .assert_one_line_error(&["2 live threads", "--max-threads-per-user 2"]);

    // Another user is not held back by A's threads, and root is not counted.
    d.cli_as(b, &["open", "b1", "--project", "p"]).assert_ok();
    assert!(listing_as(b, &d.mount("b1")).contains("README.md"));
    d.cli_ok(["open", "r1", "--project", "p"]);
    d.cli_ok(["open", "r2", "--project", "p"]);
    d.cli_ok(["open", "r3", "--project", "p"]);

    // The count survives a restart (rebuilt from the records).
    d.stop();
    d.spawn_with(&["--max-threads-per-user", "2"]);
    d.cli_as(a, &["open", "a3", "--project", "p"])
        .assert_one_line_error(&["2 live threads", "--max-threads-per-user 2"]);

    // A release frees a place: both users of a1 release it, and a3 opens (a new process sees it).
    d.cli_as(a, &["release", "a1"]).assert_ok();
    d.cli_as(a, &["release", "a1"]).assert_ok();
    d.cli_as(a, &["open", "a3", "--project", "p"]).assert_ok();
    assert!(listing_as(a, &d.mount("a3")).contains("README.md"));
    // ...and only one.
    d.cli_as(a, &["open", "a1"])
        .assert_one_line_error(&["2 live threads", "--max-threads-per-user 2"]);
    for t in ["a2", "a3"] {
        d.cli_as(a, &["release", t]).assert_ok();
    }
    d.cli_as(b, &["release", "b1"]).assert_ok();
    for t in ["r1", "r2", "r3"] {
        d.cli_ok(["release", t]);
    }
}

#[test]
fn a_user_over_quota_gets_edquot_and_others_keep_writing() {
    let (a, b) = (user_a(), user_b());
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--quota-per-user", "1M"]);
    open_to_users(&d);
    project(&d, &[a, b]);
    d.cli_as(a, &["open", "ta", "--project", "p"]).assert_ok();
    d.cli_as(b, &["open", "tb", "--project", "p"]).assert_ok();
    let (ma, mb) = (d.mount("ta"), d.mount("tb"));
    sh_as(a, &ma, "printf hello > keep").assert_ok();

    // 2 MiB against a 1 MiB quota: the writes past it fail with EDQUOT, and what was acknowledged
    // before stays.
    let out = sh_as(a, &ma, "dd if=/dev/zero of=big bs=64k count=32");
    assert_edquot(&out, "dd past the quota");
    let big = size_as(a, &ma.join("big"));
    assert!(
        big > MIB / 2 && big <= MIB && big.is_multiple_of(64 << 10),
        "big is {big} bytes"
    );
    // The rest, to the byte (a write request past the quota is refused whole; one write(2) may
    // be several requests, and then it is short, as on any file system with quotas).
    assert_edquot(
        &sh_as(a, &ma, "dd if=/dev/zero of=fill bs=4k count=16"),
        "dd of the rest",
    );
    assert_edquot(
        &sh_as(a, &ma, "dd if=/dev/zero of=fill2 bs=1 count=4096"),
        "dd of the last bytes",
    );
    // Nothing more fits: a refused append, truncate up or fallocate changes nothing.
    assert_edquot(
        &sh_as(a, &ma, "printf more | dd of=keep oflag=append conv=notrunc"),
        "append",
    );
    assert_eq!(cat_as(a, &ma.join("keep")), "hello");
    assert_edquot(&sh_as(a, &ma, "truncate -s 4M keep"), "truncate up");
    assert_eq!(size_as(a, &ma.join("keep")), 5);
    assert_edquot(&sh_as(a, &ma, "fallocate -l 4M keep"), "fallocate");
    assert_eq!(size_as(a, &ma.join("keep")), 5);
    // The user's count and the workspace's bytes are shown.
    let status = d.cli_as(a, &["status", "ta"]);
    status.assert_ok();
    let text = status.stdout_str();
    assert!(
        text.contains("bytes used:") && text.contains(&format!("of {MIB} bytes")),
        "status:\n{text}"
    );

    // The other user's mount still takes writes.
    sh_as(b, &mb, "dd if=/dev/zero of=mine bs=64k count=8").assert_ok();
    assert_eq!(size_as(b, &mb.join("mine")), 512 << 10);

    // What is removed is given back.
    sh_as(a, &ma, "rm big && dd if=/dev/zero of=half bs=64k count=8").assert_ok();
    assert_eq!(size_as(a, &ma.join("half")), 512 << 10);

    // The count survives a restart: rebuilt from the upper layer, the 512 KiB still count.
    d.stop();
    d.spawn_with(&["--quota-per-user", "1M"]);
    assert_edquot(
        &sh_as(a, &ma, "dd if=/dev/zero of=more bs=64k count=10"),
        "dd past the quota after a restart",
    );
    assert_eq!(size_as(a, &ma.join("half")), 512 << 10);
    sh_as(b, &mb, "printf ok > after").assert_ok();
    assert_eq!(cat_as(b, &mb.join("after")), "ok");

    // A released thread's bytes no longer count.
    d.cli_as(a, &["release", "ta", "--discard"]).assert_ok();
    d.cli_as(a, &["open", "ta2", "--project", "p"]).assert_ok();
    sh_as(a, &d.mount("ta2"), "dd if=/dev/zero of=f bs=64k count=12").assert_ok();
    d.cli_as(a, &["release", "ta2", "--discard"]).assert_ok();
    d.cli_as(b, &["release", "tb", "--discard"]).assert_ok();
}

#[test]
fn concurrent_opens_of_one_user_do_not_pass_the_cap_together() {
    let a = user_a();
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--max-threads-per-user", "2"]);
    open_to_users(&d);
    project(&d, &[a]);
    // Six opens of new threads at once, each under its own thread's lock: two may pass.
    let outs: Vec<(String, Out)> = std::thread::scope(|s| {
        let d = &d;
        let handles: Vec<_> = (0..6)
            .map(|i| {
                s.spawn(move || {
                    let t = format!("c{i}");
                    let out = d.cli_as(a, &["open", &t, "--project", "p"]);
                    (t, out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("open thread"))
            .collect()
    });
    let opened: Vec<&String> = outs
        .iter()
        .filter(|(_, o)| o.success())
        .map(|(t, _)| t)
        .collect();
    assert_eq!(opened.len(), 2, "opened {opened:?}");
    for (t, o) in &outs {
        if !o.success() {
            o.assert_one_line_error(&["live threads", "--max-threads-per-user 2"]);
            assert!(!d.state.join("workspaces").join(t).exists(), "{t} was made");
        }
    }
    for t in opened {
        assert!(listing_as(a, &d.mount(t)).contains("README.md"));
        d.cli_as(a, &["release", t]).assert_ok();
    }
}
