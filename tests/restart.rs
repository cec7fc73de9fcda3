//! `octofs restart` hands every mount to a new daemon process without unmounting: processes working
//! in the mount (a `cat` loop, a file held open and appended to, a `git status` loop, a shell whose
//! cwd is in the mount) see no error across five restarts, no appended byte is lost, the daemon's
//! pid changes each time, and release/resume afterwards keep everything. A handover that fails (the
//! new binary exits at once, the new daemon refuses or dies after receiving everything) leaves the
//! old daemon serving, with no error seen by the processes in the mount.
//!
//! What each part catches: without the handover of open handles the appender's writes fail (EBADF);
//! without the lookup counts the kernel's cached inodes go stale (ESTALE/ENOENT); if the readers are
//! not quiesced, a request read by the old daemon and unanswered is aborted (ECONNABORTED, EIO);
//! if a failed handover does not resume the readers, the loops hang (the watchdog fails the test).
//! The restart pause (the slowest `open`+`read` of a file during the restarts) is printed.

use crate::common;

use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the processes in the mount saw.
#[derive(Default)]
struct Seen {
    errors: Mutex<Vec<String>>,
    /// Operations done by all loops (the watchdog's progress counter).
    ops: AtomicU64,
    /// The slowest `open`+`read` of the cat loop, in microseconds.
    max_read_us: AtomicU64,
    reads: AtomicU64,
}

impl Seen {
    fn error(&self, e: String) {
        let mut v = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 50 {
            v.push(e);
        }
    }
    fn errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn spawn_loop(
    stop: &Arc<AtomicBool>,
    seen: &Arc<Seen>,
    mut f: impl FnMut(u64) -> Result<(), String> + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let stop = stop.clone();
    let seen = seen.clone();
    std::thread::spawn(move || {
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) {
            if let Err(e) = f(i) {
                seen.error(e);
            }
            seen.ops.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
    })
}

/// A `cat` of `file` in a loop (each an open and a read the daemon serves), its latency recorded.
fn cat_loop(
    stop: &Arc<AtomicBool>,
    seen: &Arc<Seen>,
    file: PathBuf,
    want: Vec<u8>,
) -> std::thread::JoinHandle<()> {
    let s = seen.clone();
    spawn_loop(stop, seen, move |_| {
        let t = Instant::now();
        let got = fs::read(&file).map_err(|e| format!("cat {}: {e}", file.display()))?;
        let us = t.elapsed().as_micros() as u64;
        s.max_read_us.fetch_max(us, Ordering::Relaxed);
        s.reads.fetch_add(1, Ordering::Relaxed);
        if got != want {
            return Err(format!(
                "cat {}: {} bytes, not the content",
                file.display(),
                got.len()
            ));
        }
        Ok(())
    })
}

/// A shell whose cwd is the mount, listing it and reading a file in a loop; errors go to its stderr.
fn shell_in(mount: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(
            "while :; do ls . >/dev/null || echo 'ls failed'; \
             cat README.md >/dev/null || echo 'cat failed'; sleep 0.01; done",
        )
        .current_dir(mount)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the shell")
}

fn stop_shell(child: Child) -> String {
    // SAFETY: kill(2) of our own child by its pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
    }
    let out = child.wait_with_output().expect("reap the shell");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether process `pid` is gone (or a zombie).
fn gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn wait_gone(pid: u32) -> bool {
    poll(Duration::from_secs(10), || gone(pid).then_some(())).is_some()
}

/// `octofs restart` (with extra arguments): its output, and the new pid when it succeeded.
fn restart(d: &Daemon, args: &[&str]) -> (Out, Option<(u32, u32)>) {
    let mut all = vec!["restart"];
    all.extend_from_slice(args);
    let out = run(d.command().args(&all), Duration::from_secs(40));
    // "restarted: pid A -> B, ..."
    let pids = out.stdout_str().split_once("pid ").and_then(|(_, rest)| {
        let (a, rest) = rest.split_once(" -> ")?;
        let b = rest.split(',').next()?;
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    });
    (out, pids)
}

/// Fails the test (instead of hanging) when the loops stop making progress.
fn watchdog(seen: &Seen, during: Duration) {
    let end = Instant::now() + during;
    let mut last = seen.ops.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        let now = seen.ops.load(Ordering::Relaxed);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        assert!(
            last_change.elapsed() < Duration::from_secs(15),
            "the processes in the mount made no progress for 15 s"
        );
    }
}

#[test]
fn five_restarts_under_load_lose_nothing() {
    let src = tempfile::Builder::new()
        .prefix("octofs-src-")
        .tempdir()
        .expect("tempdir");
    let repo = GitRepo::init(&src.path().join("upstream"));
    repo.write("README.md", "restart\n");
    let data: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    repo.write("data.bin", &data);
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.commit_all("base", DATE1);
    let mut d = Daemon::unstarted();
    d.spawn();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mount = d.open_thread("rs", &["--project", "proj"]);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let mut loops = vec![cat_loop(&stop, &seen, mount.join("data.bin"), data.clone())];
    // A file held open the whole time, appended to with a check after each record.
    let log_path = mount.join("append.log");
    let appended = Arc::new(AtomicU64::new(0));
    {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .mode(0o644)
            .open(&log_path)
            .expect("create the appended file");
        let n = appended.clone();
        let s = seen.clone();
        loops.push(spawn_loop(&stop, &seen, move |i| {
            let rec = format!("record {i:08}\n");
            f.write_all(rec.as_bytes())
                .map_err(|e| format!("append record {i}: {e}"))?;
            let len = f
                .metadata()
                .map_err(|e| format!("fstat after record {i}: {e}"))?
                .len();
            if len != (i + 1) * rec.len() as u64 {
                return Err(format!("after record {i} the file has {len} bytes"));
            }
            n.store(i + 1, Ordering::Relaxed);
            s.ops.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(2));
            Ok(())
        }));
    }
    // `git status` in a loop.
    {
        let mount = mount.clone();
        loops.push(spawn_loop(&stop, &seen, move |_| {
            let out = Command::new("git")
                .args(["status", "--porcelain"])
                .current_dir(&mount)
                .output()
                .map_err(|e| format!("git status: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "git status: {}: {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(())
        }));
    }
    let shell = shell_in(&mount);

    watchdog(&seen, Duration::from_millis(500));
    let mut pid = d.pid().expect("the daemon's pid");
    let mut pauses = Vec::new();
    for round in 0..5 {
        let before = seen.reads.load(Ordering::Relaxed);
        let (out, pids) = restart(&d, &[]);
        assert!(
            out.success(),
            "restart {round}: {}\n--- daemon log ---\n{}",
            out.describe(),
            d.log_tail()
        );
        let (old, new) = pids.unwrap_or_else(|| panic!("restart printed {:?}", out.stdout_str()));
        assert_eq!(
            old, pid,
            "restart {round}: the old daemon was not the one serving"
        );
        assert_ne!(new, pid, "restart {round}: the daemon's pid did not change");
        assert!(
            wait_gone(old),
            "restart {round}: the old daemon {old} is still running"
        );
        assert!(
            !gone(new),
            "restart {round}: the new daemon {new} is not running"
        );
        pauses.push(out.stdout_str().trim().to_string());
        pid = new;
        watchdog(&seen, Duration::from_millis(400));
        assert!(
            seen.reads.load(Ordering::Relaxed) > before,
            "restart {round}: no read completed since"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.join().expect("a loop panicked");
    }
    let shell_err = stop_shell(shell);
    let errors = seen.errors();
    let max_ms = seen.max_read_us.load(Ordering::Relaxed) as f64 / 1000.0;
    eprintln!(
        "restart figures: 5 restarts, {} reads, max open+read latency {max_ms:.1} ms, {} errors, \
         {} records appended\n{}",
        seen.reads.load(Ordering::Relaxed),
        errors.len() + shell_err.lines().count(),
        appended.load(Ordering::Relaxed),
        pauses.join("\n")
    );
    assert!(errors.is_empty(), "errors seen in the mount: {errors:#?}");
    assert!(shell_err.is_empty(), "the shell saw errors: {shell_err}");

    // Every record, in order.
    let n = appended.load(Ordering::Relaxed);
    assert!(n > 100, "only {n} records appended");
    let want: String = (0..n).map(|i| format!("record {i:08}\n")).collect();
    let got = fs::read_to_string(&log_path).expect("read the appended file");
    assert!(
        got == want,
        "the appended file lost records ({} of {} bytes)",
        got.len(),
        want.len()
    );

    // The new daemon keeps all of it across release and resume.
    d.cli_ok(["release", "rs"]);
    d.open_thread("rs", &[]);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    assert_eq!(
        fs::read_to_string(&log_path).expect("read after resume"),
        want
    );
    assert_eq!(
        fs::read(mount.join("data.bin")).expect("data after resume"),
        data
    );
    d.stop();
    assert!(wait_gone(pid), "the last daemon {pid} did not exit at stop");
}

#[test]
fn a_failed_restart_leaves_the_old_daemon_serving() {
    let s = one_file_workspace(true, "rf", "failed restarts\n");
    let d = &s.d;
    let pid = d.pid().expect("the daemon's pid");
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Seen::default());
    let reader = cat_loop(
        &stop,
        &seen,
        s.mount.join("README.md"),
        b"failed restarts\n".to_vec(),
    );
    // A file held open across the failed handovers keeps working.
    let mut held = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(s.mount.join("held.txt"))
        .expect("create held.txt");
    watchdog(&seen, Duration::from_millis(300));

    let script_dir = tempfile::tempdir().expect("tempdir");
    let wrapper = |fault: &str| {
        let p = script_dir.path().join(format!("octofs-{fault}"));
        write_file(
            &p,
            format!(
                "#!/bin/sh\nOCTOFS_TAKEOVER_FAULT={fault} exec {} \"$@\"\n",
                bin()
            )
            .as_bytes(),
            0o755,
        );
        p
    };
    let cases = [
        (PathBuf::from("/bin/true"), "exited"),
        (PathBuf::from("/nonexistent/octofs"), "cannot start"),
        (wrapper("refuse"), "refused"),
        (wrapper("exit"), "exited"),
    ];
    for (i, (exe, why)) in cases.iter().enumerate() {
        let (out, _) = restart(d, &["--exe", &exe.to_string_lossy()]);
        assert!(!out.success(), "restart with {} succeeded", exe.display());
        assert!(
            out.stderr_str().contains(why) && out.stderr_str().contains("goes on serving"),
            "restart with {}: {}",
            exe.display(),
            out.describe()
        );
        assert!(!gone(pid), "the old daemon died with {}", exe.display());
        writeln!(held, "line {i}").expect("write to the held file after a failed restart");
        watchdog(&seen, Duration::from_millis(300));
    }
    // Still the same daemon, still answering, and a real restart works after the failures.
    d.cli_ok(["list"]);
    let (out, pids) = restart(d, &[]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let (_, new) = pids.expect("pids");
    writeln!(held, "after").expect("write after the restart");
    drop(held);
    watchdog(&seen, Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("reader panicked");
    let errors = seen.errors();
    assert!(errors.is_empty(), "errors seen in the mount: {errors:#?}");
    assert_eq!(
        fs::read_to_string(s.mount.join("held.txt")).expect("read held.txt"),
        "line 0\nline 1\nline 2\nline 3\nafter\n"
    );
    drop(s);
    assert!(wait_gone(new), "the new daemon {new} did not exit at stop");
}

/// A daemon with a mount on the io_uring transport restarts like any other (its ring threads are
/// paused and their ring memory handed over: docs/transport.md, "Surviving the daemon"): a failed
/// handover (a new daemon that refuses after receiving everything) resumes the paused ring threads (a read and a write answer at
/// once), and a real one leaves the mount on the ring, served by the new process. Before, such a
/// daemon refused to restart.
#[test]
fn a_daemon_with_ring_mounts_restarts_and_keeps_them_on_the_ring() {
    if !Path::new("/sys/module/fuse/parameters/enable_uring").exists() {
        eprintln!("skipped: this kernel has no FUSE over io_uring");
        return;
    }
    let src = tempfile::Builder::new()
        .prefix("octofs-src-")
        .tempdir()
        .expect("tempdir");
    let repo = GitRepo::init(&src.path().join("upstream"));
    repo.write("README.md", "ring\n");
    repo.commit_all("base", DATE1);
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--transport", "uring"]);
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mount = d.open_thread("t", &["--project", "proj"]);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    let status = d.cli_ok(["status", "t"]);
    if !status.contains("transport:     uring") {
        eprintln!("skipped: the mount is not on the ring ({status})");
        return;
    }
    let pid = d.pid().expect("pid");
    // A new daemon that refuses after it received everything: the old one had paused its readers
    // and ring threads.
    let script_dir = tempfile::tempdir().expect("tempdir");
    let refusing = script_dir.path().join("octofs-refuse");
    write_file(
        &refusing,
        format!(
            "#!/bin/sh\nOCTOFS_TAKEOVER_FAULT=refuse exec {} \"$@\"\n",
            bin()
        )
        .as_bytes(),
        0o755,
    );
    let (out, _) = restart(&d, &["--exe", &refusing.to_string_lossy()]);
    assert!(
        !out.success() && out.stderr_str().contains("refused"),
        "a restart with a refusing daemon: {}",
        out.describe()
    );
    assert!(!gone(pid));
    let m = mount.clone();
    with_timeout(
        "a read and a write after a failed handover",
        Duration::from_secs(20),
        move || {
            assert_eq!(
                fs::read_to_string(m.join("README.md")).expect("read"),
                "ring\n"
            );
            fs::write(m.join("new.txt"), "still serving\n").expect("write after the failure");
        },
    );
    let (out, pids) = restart(&d, &[]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let (old, new) = pids.expect("restart printed the pids");
    assert_eq!(old, pid);
    assert_ne!(new, pid);
    assert!(wait_gone(pid), "the old daemon did not exit");
    let status = d.cli_ok(["status", "t"]);
    assert!(status.contains("transport:     uring"), "{status}");
    let m = mount.clone();
    with_timeout(
        "a read and a write after the restart",
        Duration::from_secs(20),
        move || {
            assert_eq!(
                fs::read_to_string(m.join("new.txt")).expect("read"),
                "still serving\n"
            );
            fs::write(m.join("after.txt"), "served by the new daemon\n").expect("write");
            assert_eq!(
                fs::read_to_string(m.join("after.txt")).expect("read"),
                "served by the new daemon\n"
            );
        },
    );
    d.stop();
    assert!(!is_mounted(&mount), "left mounted");
}

/// A `cargo build` of a small crate in a workspace spans two restarts and a `kill -9` of the
/// daemon: a shell builds it from scratch over and over (`cargo clean` first: rustc and cargo
/// write, rename and read hundreds of files in `target/`) while `octofs restart` runs twice, then
/// the daemon is killed and a new one started on the same state (it adopts the mount from the
/// connection keeper); every build succeeds and the binary built last runs.
#[test]
fn a_cargo_build_spanning_two_restarts_and_a_crash_succeeds() {
    let mut d = Daemon::start();
    let files = [
        (
            "Cargo.toml",
            "[package]\nname = \"small\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n",
            0o644,
        ),
        (
            "src/main.rs",
            "mod util;\nfn main() {\n    println!(\"{}\", util::greet(\"restart\"));\n}\n",
            0o644,
        ),
        (
            "src/util.rs",
            "pub fn greet(who: &str) -> String {\n    format!(\"built across {who}\")\n}\n",
            0o644,
        ),
    ];
    add_project(&d, "p", &files);
    let mnt = d.open_thread("build", &["--project", "p"]);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let script = "n=0; while [ ! -e \"$1\" ] || [ $n -lt 2 ]; do \
                  \"$0\" clean -q --offline && \"$0\" build -q --offline || exit 1; \
                  n=$((n+1)); done; echo \"$n builds\"";
    let stop = tempfile::tempdir().unwrap();
    let flag = stop.path().join("stop");
    let mut builder = Command::new("sh")
        .args(["-c", script])
        .arg(&cargo)
        .arg(&flag)
        .current_dir(&mnt)
        .env("CARGO_TARGET_DIR", mnt.join("target"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the build loop");
    std::thread::sleep(Duration::from_millis(1500));
    let mut serving = 0;
    for round in 0..2 {
        let (out, pids) = restart(&d, &[]);
        let Some((_, new)) = pids.filter(|_| out.success()) else {
            panic!("restart {round}: {}\n{}", out.describe(), d.log_tail());
        };
        serving = new;
        std::thread::sleep(Duration::from_millis(1500));
    }
    // The daemon serving now is the second restart's (the test's child exited at the first).
    // SAFETY: kill(2) of the pid `restart` reported, alive (it answered); errors are irrelevant.
    unsafe {
        libc::kill(serving as libc::pid_t, libc::SIGKILL);
    }
    d.reap_killed();
    let proc_dir = PathBuf::from(format!("/proc/{serving}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_dir.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    d.spawn();
    std::thread::sleep(Duration::from_millis(1500));
    fs::write(&flag, b"").unwrap();
    let status = wait_timeout(&mut builder, Duration::from_secs(300));
    if status.is_none() {
        let _ = builder.kill();
    }
    let out = builder.wait_with_output().expect("the build loop");
    assert!(
        status.is_some_and(|s| s.success()),
        "the build loop failed ({status:?}): {}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log_tail()
    );
    eprintln!(
        "cargo across restarts: {}",
        String::from_utf8_lossy(&out.stdout).trim()
    );
    let ran = run(
        &mut Command::new(mnt.join("target/debug/small")),
        Duration::from_secs(30),
    );
    assert!(ran.success(), "{}", ran.describe());
    assert_eq!(ran.stdout_str(), "built across restart\n");
    assert!(
        d.log_text()
            .contains("adopted the mount of a daemon that died"),
        "{}",
        d.log_tail()
    );
}
