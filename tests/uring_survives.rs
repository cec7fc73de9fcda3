//! A workspace on FUSE over io_uring outlives its daemon: `kill -9` of the daemon, then a new one
//! started on the same state, and an `octofs restart`, while a process reads and appends in a loop
//! in one workspace and a second workspace sits idle. The new daemon maps the old ring memory at
//! the same address (the keeper or the handover gives it its memfd), serves the requests the old
//! entries hold unanswered, registers fresh entries for the others and kicks each queue
//! (docs/transport.md, "Surviving the daemon"). The loop must see no error, every line it appended
//! must be there, a process started afterwards must read every base file equal to `git show`,
//! `git status --porcelain` must be as before, and `status` must still say `uring`. Before: the
//! loop read `ECONNABORTED`/`ENOTCONN` after the kill (ring mounts were not kept) and `restart`
//! refused ("served over io_uring, whose rings cannot be handed over").
//! [`requests_racing_a_kill_9_are_never_cancelled`]: a thread per CPU opening a file as fast as it
//! can across sixteen crashes sees no error (no `ECANCELED` from requests handed to a dying
//! daemon's entries, no `EIO` from a reply the dead daemon had written but not committed). Skips
//! where the kernel has no FUSE over io_uring.

use crate::common;

use common::*;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const ENABLE: &str = "/sys/module/fuse/parameters/enable_uring";
const FILES: &[(&str, &str)] = &[
    ("README.md", "# ring\n"),
    ("src/lib.rs", "pub fn f() {}\n"),
    ("src/deep/mod.rs", "pub mod x;\n"),
    ("docs/guide.md", "read me\n"),
];

/// `cmd args` in `dir`, in a process started now (bounded).
fn in_mount(dir: &Path, cmd: &str, args: &[&str]) -> Out {
    run(
        std::process::Command::new(cmd).args(args).current_dir(dir),
        Duration::from_secs(30),
    )
}

fn porcelain(mount: &Path) -> String {
    let out = in_mount(mount, "git", &["status", "--porcelain"]);
    assert!(out.success(), "{}", out.describe());
    out.stdout_str()
        .lines()
        .filter(|l| !l.ends_with(".log"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Waits until the loop made `more` rounds past what it had made (fails after 30 s: a hang).
fn progress(done: &AtomicUsize, more: usize, what: &str, d: &Daemon) {
    let from = done.load(Ordering::Relaxed);
    let end = Instant::now() + Duration::from_secs(30);
    while done.load(Ordering::Relaxed) < from + more {
        assert!(
            Instant::now() < end,
            "the loop made no progress for 30 s {what}\n{}",
            d.log_tail()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the daemon logged about taking over ring entries (shown with the test's output).
fn ring_lines(d: &Daemon) -> String {
    d.log_text()
        .lines()
        .filter(|l| {
            l.contains("ring entries")
                || l.contains("old daemon")
                || l.contains("ring memory")
                || l.contains("adopted")
        })
        .map(|l| format!("  {l}\n"))
        .collect()
}

fn transport_of(d: &Daemon, thread: &str) -> String {
    let status = d.cli_ok(["status", thread]);
    status
        .lines()
        .find(|l| l.trim_start().starts_with("transport:"))
        .unwrap_or("")
        .to_string()
}

/// The pid a restart printed ("restarted: pid A -> B, …").
fn restarted_pid(out: &str) -> Option<u32> {
    let (_, rest) = out.split_once("pid ")?;
    let (_, rest) = rest.split_once(" -> ")?;
    rest.split(',').next()?.trim().parse().ok()
}

/// A daemon serving over io_uring (`--transport uring`) and the upstream of [`FILES`] (one commit,
/// `DATE1`), not yet mirrored; `None` (said on stderr) when the kernel has no FUSE over io_uring.
fn ring_daemon_with_project() -> Option<(Daemon, tempfile::TempDir, GitRepo)> {
    if !Path::new(ENABLE).exists() {
        eprintln!("skipped: this kernel has no FUSE over io_uring ({ENABLE} is missing)");
        return None;
    }
    let mut d = Daemon::unstarted();
    d.spawn_with(SERVE);
    let src = tempfile::Builder::new()
        .prefix("octofs-src-")
        .tempdir()
        .expect("tempdir");
    let repo = GitRepo::init(&src.path().join("upstream"));
    for (p, c) in FILES {
        repo.write(p, c);
    }
    repo.commit_all("base", DATE1);
    Some((d, src, repo))
}

/// What every daemon here serves with.
const SERVE: &[&str] = &["--transport", "uring"];

#[test]
fn a_ring_mount_outlives_a_kill_9_and_a_restart() {
    let Some((mut d, _src, repo)) = ring_daemon_with_project() else {
        return;
    };
    let head = repo.head();
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    let mut mounts = Vec::new();
    for t in ["busy", "idle"] {
        d.cli_ok(["open", t, "--project", "p"]);
        let m = d.mount(t);
        wait_mounted(std::slice::from_ref(&m), Duration::from_secs(10));
        fs::write(m.join("new.txt"), format!("new in {t}\n")).expect("write new.txt");
        assert!(
            transport_of(&d, t).contains("uring"),
            "{t}: {}",
            transport_of(&d, t)
        );
        mounts.push(m);
    }
    let before: Vec<String> = mounts.iter().map(|m| porcelain(m)).collect();

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (m, stop, done) = (mounts[0].clone(), stop.clone(), done.clone());
        std::thread::spawn(move || {
            let _ = tx.send(work_loop(m, "# ring\n", stop, done));
        });
    }
    progress(&done, 20, "before the crash", &d);

    // A crash: the keeper holds the connections and the ring memories.
    d.kill9();
    std::thread::sleep(Duration::from_millis(300));
    // Requests made while no daemon runs, from each CPU (each queue): the kernel queues them and
    // hands them to no entry registered later; the new daemon's kick of each queue gets them
    // served.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut waiting = Vec::new();
    for cpu in 0..cpus {
        let mut c = std::process::Command::new("taskset");
        c.arg("-c")
            .arg(cpu.to_string())
            .arg("stat")
            .arg(mounts[1].join(format!("absent-{cpu}")))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        waiting.push(c.spawn().expect("spawn stat"));
    }
    std::thread::sleep(Duration::from_millis(300));
    d.spawn_with(SERVE);
    progress(&done, 20, "after the crash", &d);
    for mut c in waiting {
        let Some(_) = wait_timeout(&mut c, Duration::from_secs(20)) else {
            let _ = c.kill();
            let _ = c.wait();
            panic!(
                "a lookup made while no daemon ran was never answered\n{}",
                d.log_tail()
            );
        };
        let out = c.wait_with_output().expect("stat output");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("No such file or directory"),
            "a lookup made while no daemon ran: {err}"
        );
    }
    eprintln!("after the crash:\n{}", ring_lines(&d));
    for t in ["busy", "idle"] {
        let tr = transport_of(&d, t);
        assert!(tr.contains("uring"), "{t} after the crash: {tr}");
    }

    // A graceful restart.
    let out = run(d.command().arg("restart"), Duration::from_secs(40));
    assert!(
        out.success(),
        "restart: {}\n{}",
        out.describe(),
        d.log_tail()
    );
    let new_pid = restarted_pid(&out.stdout_str());
    progress(&done, 20, "after the restart", &d);
    eprintln!("after the restart:\n{}", ring_lines(&d));
    for t in ["busy", "idle"] {
        let tr = transport_of(&d, t);
        assert!(tr.contains("uring"), "{t} after the restart: {tr}");
    }

    // And a crash of the daemon the restart started (not a child of this test).
    if let Some(pid) = new_pid {
        // SAFETY: kill(2) of the daemon the restart reported, by its pid.
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
        let end = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = d.reap_killed();
        d.spawn_with(SERVE);
        progress(&done, 20, "after the second crash", &d);
        eprintln!("after the second crash:\n{}", ring_lines(&d));
    }

    let saw = finish_work_loop(&stop, &rx, "a crash, a restart and a crash on the ring", &d);
    for log in ["held.log", "reopened.log"] {
        let got = in_mount(&mounts[0], "cat", &[log]);
        assert!(got.success(), "{}", got.describe());
        let text = got.stdout_str();
        assert!(
            numbered(&text, saw.rounds),
            "{log} after {} rounds: {} lines",
            saw.rounds,
            text.lines().count()
        );
    }
    for (i, m) in mounts.iter().enumerate() {
        assert!(is_mounted(m), "{} gone\n{}", m.display(), d.log_tail());
        for (p, _) in FILES {
            let got = in_mount(m, "cat", &[p]);
            assert!(got.success(), "cat {p}: {}", got.describe());
            assert_eq!(
                got.stdout_str(),
                repo.git(["show", &format!("{head}:{p}")]),
                "{p} in {}",
                m.display()
            );
        }
        assert_eq!(porcelain(m), before[i], "git status in {}", m.display());
    }
    for t in ["busy", "idle"] {
        d.cli_ok(["release", t]);
    }
    d.stop();
    for m in &mounts {
        assert!(!is_mounted(m), "{} left mounted", m.display());
    }
}

/// Requests racing a `kill -9` are never ended with `ECANCELED`: a thread per CPU (pinned) opens
/// and closes a file of a ring mount as fast as it can (an OPEN and a RELEASE each time) across
/// sixteen crashes, each followed by a new daemon. A request the kernel hands to an entry
/// whose thread is already exiting is ended with `ECANCELED` by 6.18 (`fuse_uring_send_in_task`
/// run as cancelled task work); the ring threads' exit guard (`GUARD` in
/// `src/fs/uring/service.rs`) takes their waiting entries off the queues as they begin to exit,
/// so such a request waits for the next daemon instead. Without the guard every crash here left
/// callers with `ECANCELED` (docs/transport.md, "ECANCELED across a crash").
#[test]
fn requests_racing_a_kill_9_are_never_cancelled() {
    const CRASHES: usize = 16;
    let Some((mut d, _src, repo)) = ring_daemon_with_project() else {
        return;
    };
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    d.cli_ok(["open", "t", "--project", "p"]);
    let m = d.mount("t");
    wait_mounted(std::slice::from_ref(&m), Duration::from_secs(10));
    assert!(
        transport_of(&d, "t").contains("uring"),
        "{}",
        transport_of(&d, "t")
    );

    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut hammers = Vec::new();
    for i in 0..cpus {
        let (file, stop, done) = (m.join("README.md"), stop.clone(), done.clone());
        hammers.push(std::thread::spawn(move || {
            // SAFETY: a zeroed cpu_set_t, CPU_SET within its size, sched_setaffinity of this
            // thread only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(i % cpus, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            let mut errors = Vec::new();
            while !stop.load(Ordering::Relaxed) && errors.len() < 20 {
                match fs::File::open(&file) {
                    Ok(_) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            errors
        }));
    }
    progress(&done, 200, "before the first crash", &d);
    for crash in 1..=CRASHES {
        d.kill9();
        std::thread::sleep(Duration::from_millis(50));
        d.spawn_with(SERVE);
        progress(&done, 200, &format!("after crash {crash}"), &d);
    }
    stop.store(true, Ordering::Relaxed);
    let errors: Vec<String> = hammers
        .into_iter()
        .flat_map(|h| h.join().expect("a hammer thread panicked"))
        .collect();
    eprintln!(
        "{} opens across {CRASHES} crashes, errors {errors:?}",
        done.load(Ordering::Relaxed)
    );
    assert!(
        errors.is_empty(),
        "opens across the crashes failed: {errors:?}\n{}",
        takeover_lines(&d)
    );
    d.cli_ok(["release", "t"]);
    d.stop();
    assert!(!is_mounted(&m), "{} left mounted", m.display());
}

/// What every daemon of `d` logged about taking over ring entries and about failures (all logs,
/// not only the last daemon's: a failure may follow any of the crashes).
fn takeover_lines(d: &Daemon) -> String {
    let mut logs: Vec<_> = fs::read_dir(&d.base)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("daemon-"))
    });
    logs.sort();
    let mut out = String::new();
    for log in logs {
        let text = fs::read_to_string(&log).unwrap_or_default();
        out += &format!("--- {}\n", log.display());
        for l in text.lines().filter(|l| {
            l.contains("old daemon")
                || l.contains("WARN")
                || l.contains("ERROR")
                || l.contains("afresh")
        }) {
            out += &format!("  {l}\n");
        }
    }
    out
}
