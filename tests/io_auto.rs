//! `serve --io auto` (the default) on real mounts: each new workspace is mounted no-open while its
//! base's file bytes and the live no-open mounts' fit in half the daemon's memory
//! (`OCTOFS_IO_MEMORY` here), else with handles; `open --io` wins; the choice is the workspace's
//! for its life (restart, stop and start). What the kernel does is the observable: a warm
//! open+read+close sends OPEN in a handles mount and nothing in a no-open one (`stats`).

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::op_count as count;
use common::*;

/// Files in the project, of [`SIZE`] bytes each: the base weighs `N * SIZE` bytes.
const N: usize = 20;
const SIZE: usize = 1000;
/// Memory given to the daemon: a budget (half) of 30,000 bytes holds one base of 20,000, not two.
const MEMORY: &str = "60000";

fn daemon() -> Daemon {
    let mut d = Daemon::unstarted();
    d.spawn_with_env(&[], &[("OCTOFS_IO_MEMORY", MEMORY)]);
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..N {
        repo.write(&format!("f{i}.txt"), format!("{i:0>width$}", width = SIZE));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    d
}

/// OPEN requests the kernel sent for one warm pass reading every file of `mnt` (after two passes
/// that warm it).
fn opens(d: &Daemon, thread: &str, mnt: &Path) -> u64 {
    let read = || {
        for i in 0..N {
            let got = fs::read(mnt.join(format!("f{i}.txt"))).expect("read");
            assert_eq!(got.len(), SIZE);
        }
    };
    read();
    read();
    let stats = || parse_json("stats", &d.cli_ok(["stats", thread, "--json"]));
    let s0 = stats();
    read();
    count(&stats(), "OPEN") - count(&s0, "OPEN")
}

/// The mode `status --json` says and why.
fn io_of(d: &Daemon, thread: &str) -> (String, String) {
    let st = parse_json("status", &d.cli_ok(["status", thread, "--json"]));
    let s = |k: &str| st[k].as_str().unwrap_or("").to_string();
    (s("io"), s("io_why"))
}

/// Each thread's mode is what the kernel does (OPEN per warm open or none) and what `status`
/// says, with why.
#[track_caller]
fn check(d: &Daemon, want: &[(&str, &PathBuf, &str, &str)]) {
    for (thread, mnt, mode, why) in want {
        let (io, said) = io_of(d, thread);
        assert_eq!(&io, mode, "status io of {thread}");
        assert!(
            said.contains(why),
            "io_why of {thread}: {said:?}, want {why:?}"
        );
        let n = opens(d, thread, mnt);
        match *mode {
            "no-open" => assert_eq!(n, 0, "{thread} (no-open) sent OPENs"),
            _ => assert_eq!(n, N as u64, "{thread} (handles) sent no OPEN per open"),
        }
    }
}

/// A new thread `thread` finds the budget full (handles), and is released.
#[track_caller]
fn full(d: &Daemon, thread: &str) {
    let mnt = d.open_thread(thread, &["--project", "p"]);
    check(d, &[(thread, &mnt, "handles", "auto: budget full")]);
    d.cli_ok(["release", thread]);
}

/// Catches: auto not the default (every mount handles, or every mount no-open whatever the
/// budget), the live no-open mounts not counted (the second would be no-open too), the budget not
/// given back at release, `open --io` overridden by the budget either way, the choice not kept in
/// the record (a stop and start remounts in name order: `a2` before `z1`, so choosing again would
/// swap them), a restart or an adoption after `kill -9` serving a mount in another mode than the
/// kernel has or not holding its bytes (a new thread would get no-open), and `status`/`stats` not
/// saying the mode or why.
#[test]
fn auto_chooses_per_workspace_from_the_budget() {
    let mut d = daemon();
    // First opened: its 20,000 bytes fit the 30,000-byte budget. Second: they no longer do.
    let z1 = d.open_thread("z1", &["--project", "p"]);
    let a2 = d.open_thread("a2", &["--project", "p"]);
    // Asked for: no-open although the budget is full.
    let c3 = d.open_thread("c3", &["--project", "p", "--io", "no-open"]);
    let want = [
        ("z1", &z1, "no-open", "auto: 20 KiB of 29 KiB budget"),
        ("a2", &a2, "handles", "auto: budget full"),
        ("c3", &c3, "no-open", "asked"),
    ];
    check(&d, &want);
    let table = d.cli_ok(["stats", "a2"]);
    assert!(
        table.contains("io: handles (auto: budget full"),
        "stats a2:\n{table}"
    );
    let all = parse_json("stats", &d.cli_ok(["stats", "--json"]));
    let modes: Vec<(String, String)> = all["workspaces"]
        .as_array()
        .expect("workspaces")
        .iter()
        .map(|w| {
            (
                w["thread"].as_str().unwrap().into(),
                w["io"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        modes,
        [("a2", "handles"), ("c3", "no-open"), ("z1", "no-open")]
            .map(|(t, m)| (t.to_string(), m.to_string()))
    );

    // A crash: the next daemon adopts the kept mounts in their modes, and holds the bytes of the
    // no-open ones (a new thread finds the budget full).
    d.kill9();
    d.spawn_with_env(&[], &[("OCTOFS_IO_MEMORY", MEMORY)]);
    check(&d, &want);
    full(&d, "g6");
    // A restart hands every mount over in its mode; a stop and start remounts each from its
    // record in the mode it had.
    let out = d.cli(["restart"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    check(&d, &want);
    full(&d, "g7");
    d.stop();
    d.spawn_with_env(&[], &[("OCTOFS_IO_MEMORY", MEMORY)]);
    wait_mounted(
        &[z1.clone(), a2.clone(), c3.clone()],
        Duration::from_secs(30),
    );
    check(&d, &want);
    // The new daemon holds the bytes of the no-open mounts it serves: the budget is still full.
    full(&d, "g8");
    // And a crash of it right after (its keeper started at once after the stop: the stopped
    // daemon's keeper must not take its socket away as it exits).
    d.kill9();
    d.spawn_with_env(&[], &[("OCTOFS_IO_MEMORY", MEMORY)]);
    let log = d.log_text();
    assert_eq!(
        log.matches("adopted the mount of a daemon that died")
            .count(),
        3,
        "{log}"
    );
    check(&d, &want);

    // Released, z1 and c3 give their bytes back: a thread asking for handles gets them although
    // it would fit, and the next one without a mode of its own is no-open.
    d.cli_ok(["release", "z1"]);
    d.cli_ok(["release", "c3"]);
    // A shared index built before its bytes were kept beside it: they are summed from its
    // entries (f6's figure below) and kept.
    let bytes = d.state.join("indexes").join("bytes");
    fs::remove_dir_all(&bytes).expect("remove indexes/bytes");
    let e5 = d.open_thread("e5", &["--project", "p", "--io", "handles"]);
    let f6 = d.open_thread("f6", &["--project", "p"]);
    check(
        &d,
        &[
            ("e5", &e5, "handles", "asked"),
            ("f6", &f6, "no-open", "auto: 20 KiB of 29 KiB budget"),
            ("a2", &a2, "handles", "auto: budget full"),
        ],
    );
    let kept: Vec<_> = fs::read_dir(&bytes).expect("indexes/bytes again").collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let human = d.cli_ok(["status", "f6"]);
    assert!(
        human.contains("io:            no-open (auto: 20 KiB of 29 KiB budget)"),
        "{human}"
    );
    d.stop();
}

/// Catches: `serve --io handles|no-open` no longer fixing every mount's mode (auto deciding
/// anyway), and its reason not said.
#[test]
fn a_fixed_serve_io_applies_to_every_mount() {
    let mut d = Daemon::unstarted();
    d.spawn_with_env(&["--io", "no-open"], &[("OCTOFS_IO_MEMORY", "2")]);
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..N {
        repo.write(&format!("f{i}.txt"), format!("{i:0>width$}", width = SIZE));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    let t = d.open_thread("t", &["--project", "p"]);
    let u = d.open_thread("u", &["--project", "p"]);
    check(
        &d,
        &[
            ("t", &t, "no-open", "serve --io"),
            ("u", &u, "no-open", "serve --io"),
        ],
    );
    d.stop();
}

/// Catches: the per-base limit not applied (a third workspace of one base mounted no-open although
/// two live no-open mounts share it), applied across bases (another project's first workspace
/// would get handles), an asked no-open mount not counted, the room not given back at release,
/// and `status` not saying why.
#[test]
fn a_base_gets_at_most_per_base_no_open_mounts() {
    let mut d = Daemon::unstarted();
    // Memory for every base many times over: only the per-base limit decides.
    d.spawn_with_env(
        &[],
        &[
            ("OCTOFS_IO_MEMORY", "100000000"),
            ("OCTOFS_IO_PER_BASE", "2"),
        ],
    );
    for project in ["p", "q"] {
        let repo = GitRepo::init(&d.base.join(format!("up-{project}")));
        for i in 0..N {
            repo.write(
                &format!("f{i}.txt"),
                format!("{project}{i:0>width$}", width = SIZE - 1),
            );
        }
        repo.commit_all("files", DATE1);
        d.cli_ok(["mirror", "add", project, &repo.file_url()]);
    }
    let a = d.open_thread("a", &["--project", "p"]);
    let b = d.open_thread("b", &["--project", "p", "--io", "no-open"]);
    let c = d.open_thread("c", &["--project", "p"]);
    let q = d.open_thread("q1", &["--project", "q"]);
    check(
        &d,
        &[
            ("a", &a, "no-open", "auto: 20 KiB of"),
            ("b", &b, "no-open", "asked"),
            (
                "c",
                &c,
                "handles",
                "auto: 2 no-open mounts of this base already (OCTOFS_IO_PER_BASE",
            ),
            ("q1", &q, "no-open", "auto: 59 KiB of"),
        ],
    );
    // Room again for the base once one of its no-open mounts is released.
    d.cli_ok(["release", "a"]);
    let e = d.open_thread("e", &["--project", "p"]);
    check(&d, &[("e", &e, "no-open", "auto:")]);
    for t in ["b", "c", "q1", "e"] {
        d.cli_ok(["release", t]);
    }
}
