//! Issue 28, item 4, tried as a hostile ordinary user (DESIGN.md "Privilege separation": one user's
//! threads are bounded so they cannot starve others; docs/lifecycle.md "Per-user limits").
//!
//! 1. [`a_user_at_the_thread_cap_is_refused_and_others_are_not`]: an ordinary user opened 500
//!    threads in 17 s (2,538 OS threads in the daemon); nothing bounded one user's live threads.

mod common;

use common::*;
use std::path::Path;

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
