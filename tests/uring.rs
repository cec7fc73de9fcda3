//! A workspace served over FUSE io_uring (`octofs serve --transport uring`): reads, writes,
//! creates, renames, listings and `git status` work, `octofs status` says which transport a mount
//! runs on, and the requests really are answered by the per-CPU ring threads (not the one
//! `/dev/fuse` thread kept for FORGET and INTERRUPT). `--transport auto` must end up on the rings
//! wherever the kernel offers them, with the requests read from the rings and not from `/dev/fuse`:
//! upstream fuser after 0.18.0 refuses `FUSE_OVER_IO_URING` in `add_capabilities`, and a rebase
//! that kept the refusal would quietly serve `/dev/fuse` (vendor/fuser-patches/README.md,
//! "Rebasing"). [`forty_ring_workspaces_share_the_ring_threads`]: 40 ring mounts hold the daemon
//! at no more than 64 threads (one ring service: 2 threads per CPU, each with one entry of every
//! mount), each serving processes started after all opens. Every test skips, saying why, where the kernel has no FUSE over io_uring (no
//! `fuse.enable_uring` module parameter).

use crate::common;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

const ENABLE: &str = "/sys/module/fuse/parameters/enable_uring";

fn kernel_has_it() -> bool {
    if Path::new(ENABLE).exists() {
        return true;
    }
    eprintln!("skipped: this kernel has no FUSE over io_uring ({ENABLE} is missing)");
    false
}

/// Voluntary context switches of the daemon's ring threads: each request served wakes one.
fn ring_thread_wakeups(pid: u32) -> (usize, u64) {
    thread_wakeups(pid, "fuser-ring-")
}

/// The daemon's threads named `prefix…` and their voluntary context switches (a thread waiting for
/// a request sleeps once per request it is woken for). `fuse-pool-` are the threads that read
/// `/dev/fuse` (vendor/fuser's pool, shared by every mount).
fn thread_wakeups(pid: u32, prefix: &str) -> (usize, u64) {
    let mut threads = 0;
    let mut switches = 0;
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for t in tasks.flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        threads += 1;
        let status = fs::read_to_string(t.path().join("status")).unwrap_or_default();
        switches += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    (threads, switches)
}

fn workspace(args: &[&str]) -> (tempfile::TempDir, Daemon, std::path::PathBuf) {
    let src = tempfile::Builder::new()
        .prefix("octofs-src-")
        .tempdir()
        .expect("tempdir");
    let repo = GitRepo::init(&src.path().join("upstream"));
    repo.write("README.md", "hello ring\n");
    for i in 0..50 {
        repo.write(&format!("src/f{i}.txt"), format!("file {i}\n"));
    }
    repo.commit_all("base", DATE1);
    let mut d = Daemon::unstarted();
    d.spawn_with(args);
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    d.cli_ok(["open", "t", "--project", "proj"]);
    let mount = d.mount("t");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    (src, d, mount)
}

#[test]
fn a_workspace_served_over_io_uring_reads_writes_renames_and_runs_git() {
    if !kernel_has_it() {
        return;
    }
    let (_src, mut d, mnt) = workspace(&["--transport", "uring"]);
    let status = d.cli_ok(["status", "t"]);
    assert!(
        status.contains("transport:     uring"),
        "status should say uring:\n{status}"
    );
    let pid = d.pid().expect("daemon pid");
    let (threads, before) = ring_thread_wakeups(pid);
    let cpus = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    assert!(threads >= 2, "ring threads: {threads} (cpus {cpus:?})");

    let m = mnt.clone();
    with_timeout(
        "file operations over the ring",
        Duration::from_secs(60),
        move || {
            let mnt = m;
            assert_eq!(
                fs::read_to_string(mnt.join("README.md")).unwrap(),
                "hello ring\n"
            );
            for i in 0..50 {
                let p = mnt.join(format!("src/f{i}.txt"));
                assert_eq!(fs::read_to_string(&p).unwrap(), format!("file {i}\n"));
            }
            fs::create_dir_all(mnt.join("new/deep")).unwrap();
            for i in 0..20 {
                fs::write(mnt.join(format!("new/deep/n{i}")), vec![b'x'; 3000 + i]).unwrap();
            }
            // A write bigger than one page and than the kernel's default request size.
            let big = pseudo_random(3 * 1024 * 1024 + 17, 5);
            fs::write(mnt.join("new/big.bin"), &big).unwrap();
            assert_eq!(fs::read(mnt.join("new/big.bin")).unwrap(), big);
            fs::rename(mnt.join("new/deep/n0"), mnt.join("renamed")).unwrap();
            fs::rename(mnt.join("src/f1.txt"), mnt.join("new/f1.txt")).unwrap();
            fs::remove_file(mnt.join("src/f2.txt")).unwrap();
            std::os::unix::fs::symlink("README.md", mnt.join("link")).unwrap();
            assert_eq!(
                fs::read_link(mnt.join("link")).unwrap(),
                Path::new("README.md")
            );
            let mut names: Vec<String> = fs::read_dir(mnt.join("new/deep"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(names.len(), 19, "{names:?}");
            assert_eq!(fs::metadata(mnt.join("renamed")).unwrap().len(), 3000);
        },
    );
    let out = run(
        Command::new("git")
            .arg("-C")
            .arg(&mnt)
            .args(["status", "--porcelain"]),
        Duration::from_secs(60),
    );
    out.assert_ok();
    let st = out.stdout_str();
    for want in [
        " D src/f1.txt",
        " D src/f2.txt",
        "?? link",
        "?? new/",
        "?? renamed",
    ] {
        assert!(st.contains(want), "git status lacks {want:?}:\n{st}");
    }

    let (_, after) = ring_thread_wakeups(pid);
    eprintln!("ring threads: {threads}, wakeups: {}", after - before);
    assert!(
        after >= before + 100,
        "the ring threads woke {} times for hundreds of requests: requests went elsewhere",
        after - before
    );
    d.stop();
}

#[test]
fn dev_transport_is_reported_and_has_no_ring_threads() {
    if !kernel_has_it() {
        return;
    }
    let (_src, mut d, mnt) = workspace(&["--transport", "dev"]);
    assert_eq!(
        fs::read_to_string(mnt.join("README.md")).unwrap(),
        "hello ring\n"
    );
    let status = d.cli_ok(["status", "t"]);
    assert!(status.contains("transport:     dev"), "{status}");
    let pid = d.pid().expect("pid");
    let (threads, _) = ring_thread_wakeups(pid);
    assert_eq!(threads, 0);
    // The control of the test below: on /dev/fuse the same workload wakes the pool's threads.
    let (_, before) = thread_wakeups(pid, "fuse-pool-");
    small_workload(&mnt);
    let (_, after) = thread_wakeups(pid, "fuse-pool-");
    eprintln!("dev: /dev/fuse pool wakeups {}", after - before);
    assert!(
        after >= before + 100,
        "the /dev/fuse pool threads woke {} times for hundreds of requests",
        after - before
    );
    d.stop();
}

/// Reads every base file (each a LOOKUP, OPEN, FLUSH, RELEASE at least), writes 20 new ones and
/// lists them: a few hundred requests, under a timeout.
fn small_workload(mnt: &Path) {
    let mnt = mnt.to_path_buf();
    with_timeout("a small workload", Duration::from_secs(60), move || {
        for i in 0..50 {
            let p = mnt.join(format!("src/f{i}.txt"));
            assert_eq!(fs::read_to_string(&p).unwrap(), format!("file {i}\n"));
        }
        fs::create_dir_all(mnt.join("w")).unwrap();
        for i in 0..20 {
            fs::write(mnt.join(format!("w/n{i}")), format!("n{i}\n")).unwrap();
        }
        assert_eq!(fs::read_dir(mnt.join("w")).unwrap().count(), 20);
    });
}

/// The ring transport is negotiated wherever the kernel offers it: `--transport auto` (which falls
/// back to `/dev/fuse` without failing) ends up on the rings, `octofs status` says `uring` with no
/// note that fuser's recorded INIT reply (`Negotiated`) lacks `FUSE_OVER_IO_URING`, and a workload's
/// requests are read from the rings: the ring threads wake for them, the `/dev/fuse` pool threads
/// at most for a tenth as many (FORGET and INTERRUPT stay on `/dev/fuse`; an idle pool thread wakes
/// every 10 s). With upstream fuser's refusal of the flag it fails: status says
/// `dev (fuser refused FUSE_OVER_IO_URING …)`.
#[test]
fn auto_negotiates_io_uring_where_the_kernel_offers_it_and_requests_skip_dev_fuse() {
    if !kernel_has_it() {
        return;
    }
    let (_src, mut d, mnt) = workspace(&["--transport", "auto"]);
    let status = d.cli_ok(["status", "t"]);
    let transport = status
        .lines()
        .find(|l| l.trim_start().starts_with("transport:"))
        .unwrap_or("(no transport line)");
    assert!(
        transport.contains("uring (") && !transport.contains("fuser"),
        "this kernel offers FUSE over io_uring, yet an auto mount runs on {transport:?}:\n{status}"
    );
    let pid = d.pid().expect("daemon pid");
    let (rings, ring_before) = thread_wakeups(pid, "fuser-ring-");
    let (_, pool_before) = thread_wakeups(pid, "fuse-pool-");
    assert!(rings >= 2, "ring threads: {rings}");
    small_workload(&mnt);
    let (_, ring_after) = thread_wakeups(pid, "fuser-ring-");
    let (_, pool_after) = thread_wakeups(pid, "fuse-pool-");
    let (ring, pool) = (ring_after - ring_before, pool_after - pool_before);
    eprintln!("auto: ring wakeups {ring}, /dev/fuse pool wakeups {pool}");
    assert!(
        ring >= 100,
        "the ring threads woke {ring} times for hundreds of requests: requests went elsewhere"
    );
    assert!(
        pool * 10 <= ring,
        "the /dev/fuse pool threads woke {pool} times against the rings' {ring}: requests are \
         still read from /dev/fuse"
    );
    d.stop();
}

/// Serves with `--transport uring` and the fault `fault` injected in one ring entry's
/// registration: opening a workspace must fail within a bounded time, saying why, leave nothing
/// mounted and no caller blocked, and the daemon must go on serving (a `dev` daemon on the same
/// state then mounts the workspace fine).
fn registration_fault_fails_the_mount_cleanly(fault: &str) {
    if !kernel_has_it() {
        return;
    }
    let src = tempfile::Builder::new()
        .prefix("octofs-src-")
        .tempdir()
        .expect("tempdir");
    let repo = GitRepo::init(&src.path().join("upstream"));
    repo.write("README.md", "hello ring\n");
    repo.commit_all("base", DATE1);
    let d = Daemon::unstarted();
    let log = fs::File::create(d.base.join("fault.log")).expect("log");
    let mut child = d
        .command()
        .args(["serve", "--transport", "uring"])
        .env("OCTOFS_URING_FAULT", fault)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().expect("dup"))
        .stderr(log)
        .process_group(0)
        .spawn()
        .expect("spawn serve");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("daemon ready", Duration::from_secs(10), || {
            std::os::unix::net::UnixStream::connect(d.socket()).is_ok() && d.cli(["list"]).success()
        });
        d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
        // A caller that enters the mount while the entries are (not) registering: the kernel holds
        // its request; the abort must release it with an error.
        let root = d.root.clone();
        let caller = std::thread::spawn(move || {
            poll(Duration::from_secs(20), || {
                (!mounts_under(&root).is_empty()).then_some(())
            })?;
            Some(try_run(
                Command::new("stat").arg(root.join("t/README.md")),
                Duration::from_secs(40),
            ))
        });
        let t0 = std::time::Instant::now();
        let out = d.cli(["open", "t", "--project", "proj"]);
        assert!(!out.success(), "open should fail: {}", out.describe());
        assert!(
            out.stderr_str().contains("io_uring"),
            "the error should name the transport: {}",
            out.stderr_str()
        );
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "took {:?}",
            t0.elapsed()
        );
        assert!(
            mounts_under(&d.root).is_empty(),
            "left mounted: {:?}",
            mounts_under(&d.root)
        );
        match caller.join().expect("caller thread") {
            // The mount came and went before the caller looked: nothing could block.
            None => {}
            // Answered (before the abort, through /dev/fuse after a refused registration) or
            // failed by the abort: either way it returned.
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("a caller stayed blocked in the failed mount: {e}"),
        }
        // The daemon still answers.
        d.cli_ok(["list"]);
    }));
    let _ = d.cli(["stop"]);
    if wait_timeout(&mut child, Duration::from_secs(20)).is_none() {
        kill_child_group(&child);
        let _ = child.wait();
        umount_all_under(&d.root);
        panic!("daemon did not stop after the failed mount");
    }
    if let Err(e) = result {
        umount_all_under(&d.root);
        eprintln!(
            "--- daemon log ---\n{}",
            fs::read_to_string(d.base.join("fault.log")).unwrap_or_default()
        );
        std::panic::resume_unwind(e);
    }
}

#[test]
fn a_refused_registration_aborts_the_mount_instead_of_hanging() {
    registration_fault_fails_the_mount_cleanly("bad-queue");
}

#[test]
fn an_entry_that_never_registers_aborts_the_mount_instead_of_hanging() {
    registration_fault_fails_the_mount_cleanly("no-register");
}

/// Big WRITEs and READs through the daemon over the ring (no-open: nothing is passed through): the
/// written bytes are what is read back, through the page cache and from the daemon after the
/// caches are dropped. The transport once gave an entry's payload pages back before the kernel had
/// read the reply from them, so every request over 256 KiB was answered with zeros (a 1 MiB `dd`
/// failed with EIO, a READ returned zeros).
#[test]
fn big_writes_and_reads_through_the_daemon_over_the_ring_keep_every_byte() {
    if !kernel_has_it() {
        return;
    }
    let (_src, d, mnt) = workspace(&["--transport", "uring", "--io", "no-open"]);
    let status = d.cli_ok(["status", "t"]);
    assert!(status.contains("transport:     uring"), "{status}");
    let m = mnt.clone();
    with_timeout(
        "big I/O over the ring",
        Duration::from_secs(60),
        move || {
            use std::io::{Read, Write};
            let big = pseudo_random(3 * 1024 * 1024 + 17, 9);
            // One write(2) per MiB: each a 1 MiB WRITE request (max_write is the ring's payload).
            let mut f = fs::File::create(m.join("big.bin")).unwrap();
            for chunk in big.chunks(1024 * 1024) {
                f.write_all(chunk).unwrap();
            }
            f.sync_all().unwrap();
            drop(f);
            assert_eq!(fs::read(m.join("big.bin")).unwrap(), big, "read back warm");
            fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
            let mut got = Vec::new();
            let mut f = fs::File::open(m.join("big.bin")).unwrap();
            let mut buf = vec![0u8; 1024 * 1024];
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(
                got == big,
                "read back from the daemon after dropping caches differs"
            );
        },
    );
    let stats = d.cli_ok(["stats", "t"]);
    assert!(
        stats.contains("bytes written through the daemon: ")
            && !stats.contains("bytes written through the daemon:    0\n"),
        "the writes did not go through the daemon:\n{stats}"
    );
}

/// The daemon's OS threads (`/proc/<pid>/task`).
fn daemon_threads(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// 40 workspaces served over io_uring (`OCTOFS_TRANSPORT=uring`) share the ring threads: the
/// daemon stays at no more than 64 threads (per-mount ring threads made it 4 per mount here, 160+),
/// each mount answers reads and a write from processes started after every open, 8 at once, and
/// releasing them all leaves no mount. The `/dev/fuse` twin is
/// `open_cost::sixty_workspaces_share_one_bounded_pool_of_request_threads`.
#[test]
fn forty_ring_workspaces_share_the_ring_threads() {
    const N: usize = 40;
    if !kernel_has_it() {
        return;
    }
    let mut d = Daemon::unstarted();
    d.spawn_with_env(&[], &[("OCTOFS_TRANSPORT", "uring")]);
    add_project(
        &d,
        "p",
        &[
            ("a.txt", "alpha\n", 0o644),
            ("dir/deep/c.txt", "gamma\n", 0o644),
        ],
    );
    let pid = d.pid().expect("daemon pid");
    let mounts: Vec<_> = (0..N)
        .map(|i| d.open_thread(&format!("w{i}"), &["--project", "p"]))
        .collect();
    let status = d.cli_ok(["status", "w0"]);
    assert!(status.contains("transport:     uring ("), "{status}");
    let open = daemon_threads(pid);
    let (rings, _) = ring_thread_wakeups(pid);
    assert!(
        open <= 64,
        "{open} daemon threads ({rings} ring threads) with {N} ring workspaces open (bound 64)"
    );
    each_mount_in_parallel(
        &mounts,
        8,
        "a ring workspace served a wrong answer",
        |i, m| {
            let wrote = run(
                Command::new("sh")
                    .arg("-c")
                    .arg("echo \"$1\" > \"$0/new.txt\" && cat \"$0/new.txt\" \"$0/a.txt\"")
                    .arg(m)
                    .arg(format!("w{i}")),
                Duration::from_secs(30),
            );
            assert_eq!(
                wrote.assert_ok().stdout_str(),
                format!("w{i}\nalpha\n"),
                "workspace {i}"
            );
        },
    );
    let busy = daemon_threads(pid);
    assert!(
        busy <= 64,
        "{busy} daemon threads after serving {N} ring workspaces"
    );
    for i in 0..N {
        d.cli_ok(["release", &format!("w{i}")]);
    }
    for m in mounts.iter() {
        assert!(
            !is_mounted(m),
            "{} still mounted after release",
            m.display()
        );
    }
    eprintln!(
        "{N} ring workspaces: daemon threads {open} open ({rings} ring threads), {busy} after \
         serving, {} released",
        daemon_threads(pid)
    );
    d.stop();
}
