//! Fault injection against real FUSE mounts of real git repositories.
//!
//! - [`sigkill_mid_workload_loses_nothing_acknowledged`]: a write-heavy workload runs through the
//!   mount while the daemon is SIGKILLed at several points (between two operations, from another
//!   thread while operations run, in the middle of a large multi-write file, with and without
//!   passthrough, and in threads opened `--io no-open`, whose mode every restart keeps). The dead mounts must answer `ENOTCONN`; once they are detached (`umount -l`), a
//!   new `serve` on the same state must remount every workspace by itself and present exactly
//!   what was acknowledged: content bytes, modes, link counts, hardlink groups, symlink targets,
//!   inode numbers, and no unlinked name;
//!   [`serve_clears_a_dead_mount_left_by_sigkill`] checks that `serve` does that by itself.
//! - [`full_state_dir_returns_enospc_and_keeps_every_acknowledged_write`]: the state directory on a
//!   16 MiB tmpfs; filling it gives `ENOSPC` (never `EIO`, never a hang), every written file reads
//!   back while the disk is full, deleting frees space, and the catalog loads with every earlier
//!   write after a stop, a stop on a full disk, and a SIGKILL on a full disk. Errno violations are
//!   collected and reported together at the end, so one finding does not hide the others.
//! - [`inode_numbers_survive_copy_up_rename_link_and_restart`]: `st_ino` across copy-up, renames of
//!   the file and of its directories, hardlinks, clean and unclean restarts; a deleted and recreated
//!   name gets a new number; numbers are not reused after a restart.
//! - [`reader_across_copy_up_with_passthrough`] / [`reader_across_copy_up_without_passthrough`]: a
//!   descriptor opened for reading before the first write to a base file (the semantics of
//!   `docs/overlay.md`, "Readers across a copy-up").
//!
//! Every test hashes the whole mirror (work tree and `.git`: content, mode, mtime, inode) before and
//! after: invariant 1, the mirror is never written by a workspace.
//!
//! Nothing here can hang: external commands go through the harness's timeouts and every in-process
//! access to a mount runs under [`with_timeout`]. The daemon is only ever killed by the pid of the
//! child the test started, and only while that child is unreaped (so the pid cannot have been
//! reused).

//!
//! The POSIX model the mounts are held to is the one the model test uses (`tests/support/model.rs`);
//! the workload, its generator and the scan of a mount live beside it in `tests/support/`.

use crate::common;

// Each test driver uses part of the shared support.
use crate::support;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use support::model::Model;
use support::mount_check::{Seen, check_against, listing_diff, scan};
use support::workload::{Gen, Live, Op, Progress, exec, overlay};

const PROJECT: &str = "proj";
/// Upper bound for one block of in-process I/O on a mount.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `f` (in-process access to a mount) under a watchdog.
fn io<T, F>(what: &str, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    with_timeout(what, IO_TIMEOUT, f)
}

// ---------------------------------------------------------------------------------------------
// Fixture and small helpers

/// The project every test forks: nested directories, an executable, symlinks, a 256 KiB binary,
/// and files no test reads before it needs them "cold" (not yet in the blob cache).
fn build_project(repo: &GitRepo) -> String {
    repo.write("README.md", "octofs fault-injection fixture\n");
    repo.write(".gitignore", "*.o\n");
    repo.write("src/main.c", "int main(void) { return 0; }\n");
    repo.write(
        "src/lib/util.c",
        "#include \"util.h\"\nint util(void) { return 42; }\n",
    );
    repo.write("src/lib/util.h", "#pragma once\nint util(void);\n");
    repo.write_exec("scripts/build.sh", "#!/bin/sh\ncc -o main src/main.c\n");
    repo.write("data/blob.bin", pseudo_random(256 * 1024, 11));
    repo.write("data/small.bin", pseudo_random(3000, 12));
    repo.write("docs/a/b/deep.md", "# deep\n");
    repo.write("solo/only.txt", "the only file of its directory\n");
    repo.write("cold/c1.bin", pseudo_random(64 * 1024, 13));
    repo.write("cold/c2.bin", pseudo_random(64 * 1024, 14));
    for i in 0..12 {
        repo.write(
            &format!("pkg/m{i:02}.txt"),
            format!("module {i}\n").repeat(i * 37 + 1),
        );
    }
    repo.symlink("link-readme", "README.md");
    repo.symlink("src/lib/link-up", "../main.c");
    repo.commit_all("base", DATE1)
}

/// A scratch directory holding the upstream repository and its `git archive`.
struct Fixture {
    _dir: tempfile::TempDir,
    repo: GitRepo,
    /// `git archive HEAD`, extracted.
    archive: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::Builder::new()
        .prefix("octofs-faults-src-")
        .tempdir()
        .expect("tempdir");
    let base = dir.path().canonicalize().expect("canonicalize");
    let repo = GitRepo::init(&base.join("upstream"));
    build_project(&repo);
    let archive = base.join("archive");
    extract_archive(&repo.path, "HEAD", &archive);
    // A workspace's root is its owner's only (the trust model).
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&archive, fs::Permissions::from_mode(0o700)).expect("chmod archive");
    }
    Fixture {
        _dir: dir,
        repo,
        archive,
    }
}

/// The process umask, read without changing it (other test threads create files concurrently).
fn process_umask() -> u32 {
    let status = fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .expect("Umask line");
    u32::from_str_radix(line.trim(), 8).expect("octal umask")
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let rel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = rel
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|s| s.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// Every entry of the mirror (work tree and `.git`): type, content hash, mode, mtime and inode, so
/// that even a rewrite with identical bytes is noticed.
fn mirror_digest(dir: &Path) -> BTreeMap<String, String> {
    fn walk(top: &Path, p: &Path, out: &mut BTreeMap<String, String>) {
        let meta =
            fs::symlink_metadata(p).unwrap_or_else(|e| panic!("mirror: stat {}: {e}", p.display()));
        let rel = p.strip_prefix(top).unwrap().to_string_lossy().into_owned();
        let ft = meta.file_type();
        let what = if ft.is_dir() {
            let mut kids: Vec<PathBuf> = fs::read_dir(p)
                .unwrap_or_else(|e| panic!("mirror: readdir {}: {e}", p.display()))
                .map(|e| e.expect("mirror: dir entry").path())
                .collect();
            kids.sort();
            for k in kids {
                walk(top, &k, out);
            }
            "dir".to_string()
        } else if ft.is_symlink() {
            format!("symlink -> {}", fs::read_link(p).unwrap().display())
        } else if ft.is_file() {
            let bytes = fs::read(p).unwrap_or_else(|e| panic!("mirror: read {}: {e}", p.display()));
            format!("file {} {}", bytes.len(), blake3::hash(&bytes).to_hex())
        } else {
            "other".to_string()
        };
        out.insert(
            rel,
            format!(
                "{what} mode={:o} mtime={}.{:09} ino={}",
                meta.mode() & 0o7777,
                meta.mtime(),
                meta.mtime_nsec(),
                meta.ino()
            ),
        );
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    assert!(
        out.keys().any(|k| k == ".git/HEAD") && out.keys().any(|k| k == ".git/index"),
        "mirror digest lacks .git/HEAD or .git/index: is {} a checkout?",
        dir.display()
    );
    out
}

/// Polls until the (unreaped) process `pid` is a zombie: its file descriptors, `/dev/fuse`
/// included, are closed, so its mounts answer `ENOTCONN`.
fn wait_dead(pid: u32) {
    let dead = || {
        let state = fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
            });
        matches!(state.as_deref(), None | Some("Z") | Some("X"))
    };
    wait_until(
        &format!("daemon pid {pid} dead after SIGKILL"),
        Duration::from_secs(10),
        dead,
    );
}

/// errno of a `statfs` of the mount (None when it answers). `statfs` always reaches the daemon;
/// `stat` and listing the root may not: the kernel answers them from its caches (attributes for an
/// hour; directories are opened without asking and their listings kept) even after the daemon died.
fn live_errno(mount: &Path) -> Option<i32> {
    let m = mount.to_path_buf();
    io("statfs of a mount point", move || {
        octofs::sys::statvfs(&m)
            .err()
            .map(|e| e.raw_os_error().unwrap_or(-1))
    })
}

/// After the daemon was SIGKILLed: its mounts answer `ENOTCONN` (not a hang); they are detached
/// with `umount -l` (what a supervisor does; that `serve` clears them by itself is
/// [`serve_clears_a_dead_mount_left_by_sigkill`]), and a new daemon remounts them by itself.
/// A daemon without the connection keeper (`--keep-connections false`): its mounts die with it,
/// which is what the SIGKILL tests here look at (with the keeper the next daemon adopts them:
/// restart_idle.rs).
fn start_without_keeper() -> Daemon {
    let mut d = Daemon::unstarted();
    d.spawn_with(NO_KEEPER);
    d
}

const NO_KEEPER: &[&str] = &["--keep-connections", "false"];

#[track_caller]
fn restart_after_kill(d: &mut Daemon, mounts: &[PathBuf], serve_args: &[&str]) {
    for m in mounts {
        assert_eq!(
            live_errno(m),
            Some(libc::ENOTCONN),
            "{}: the killed daemon's mount",
            m.display()
        );
        run(
            Command::new("umount").arg("-l").arg(m),
            Duration::from_secs(10),
        )
        .assert_ok();
        assert!(!mount_points().contains(m), "umount -l {}", m.display());
    }
    let mut args = serve_args.to_vec();
    args.extend_from_slice(NO_KEEPER);
    d.spawn_with(&args);
    wait_mounted(mounts, Duration::from_secs(10));
    for m in mounts {
        mounted_once(m);
    }
}

#[track_caller]
fn mounted_once(mount: &Path) {
    let n = mount_points().iter().filter(|p| *p == mount).count();
    assert_eq!(
        n,
        1,
        "{} appears {n} times in mountinfo (a stale mount not cleared, or stacked mounts)",
        mount.display()
    );
    assert_eq!(
        live_errno(mount),
        None,
        "{} is in mountinfo but does not answer (errno)",
        mount.display()
    );
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => "ENOSPC".into(),
        Some(libc::EIO) => "EIO".into(),
        Some(libc::ENOTCONN) => "ENOTCONN".into(),
        Some(libc::ECONNABORTED) => "ECONNABORTED".into(),
        Some(n) => format!("errno {n} ({e})"),
        None => format!("{e}"),
    }
}

fn scan_mount(label: &str, mount: &Path) -> BTreeMap<String, Seen> {
    let m = mount.to_path_buf();
    io(
        &format!("{label}: scanning {}", mount.display()),
        move || scan(&m),
    )
}

/// The mount holds exactly `m` (content, modes, link counts, symlinks, inode numbers).
#[track_caller]
fn verify_exact(label: &str, mount: &Path, m: &Model) {
    let seen = scan_mount(label, mount);
    if let Err(e) = check_against(m, &seen) {
        panic!(
            "{label}: {} does not hold what was acknowledged:\n{e}",
            mount.display()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Running operations

/// Runs one operation under a watchdog.
fn run_op(root: &Path, op: &Op) -> (Progress, io::Result<()>) {
    let (root, op) = (root.to_path_buf(), op.clone());
    io(&format!("{op}"), move || {
        let live = Live::default();
        let mut prog = Progress::default();
        let r = exec(&op, &root, &mut prog, &live);
        (prog, r)
    })
}

/// Runs an operation that must succeed and applies it to the model.
#[track_caller]
fn must(root: &Path, model: &mut Model, op: Op, umask: u32) {
    let (_, r) = run_op(root, &op);
    if let Err(e) = r {
        panic!("{op}: {e}");
    }
    model.apply(&op, umask);
}

// ---------------------------------------------------------------------------------------------
// 1. SIGKILL in the middle of a write-heavy workload

#[derive(Clone, Copy, Debug)]
enum Trigger {
    /// Kill after `n` operations completed: from the workload thread itself (exactly between two
    /// operations) or from another thread while the workload keeps going.
    AfterOps { n: usize, from_other_thread: bool },
    /// Kill from another thread once operation `op` (a large file written in 64 KiB writes) has
    /// had `bytes` acknowledged.
    MidWrite { op: usize, bytes: usize },
}

struct Failure {
    index: usize,
    op: Op,
    prog: Progress,
    err: io::Error,
}

struct Outcome {
    /// The base with every acknowledged operation applied (the state before `failure`'s op).
    model: Model,
    ops_ok: usize,
    /// Acknowledged operations by kind.
    kinds: BTreeMap<&'static str, usize>,
    /// Operations completed when the kill was sent.
    killed_after: usize,
    /// The first operation that failed (after the kill): it may or may not have taken effect.
    failure: Option<Failure>,
    /// errno of a mkdir tried once the daemon was surely dead.
    probe_errno: Option<i32>,
}

/// Runs generated operations through the mount at `root`, SIGKILLs the daemon `pid` as `trigger`
/// says, and stops at the first failing operation.
fn workload(
    root: PathBuf,
    mut model: Model,
    seed: u64,
    max_ops: usize,
    trigger: Trigger,
    pid: u32,
    umask: u32,
) -> Outcome {
    let live = Arc::new(Live::default());
    let kill = {
        let live = live.clone();
        move || {
            live.killed.store(true, Ordering::SeqCst);
            // SAFETY: kill(2) of the pid of the daemon child this test started. It is not reaped
            // before this workload (and the killer thread, joined below) has finished.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
        }
    };
    let killer = match trigger {
        Trigger::AfterOps {
            from_other_thread: false,
            ..
        } => None,
        _ => {
            let live = live.clone();
            let kill = kill.clone();
            Some(std::thread::spawn(move || {
                // Well below IO_TIMEOUT, so the kill always happens before anyone reaps the child.
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    let done = live.ops_done.load(Ordering::SeqCst);
                    let due = match trigger {
                        Trigger::AfterOps { n, .. } => done >= n,
                        Trigger::MidWrite { op, bytes } => {
                            done > op
                                || (done == op && live.op_bytes.load(Ordering::SeqCst) >= bytes)
                        }
                    };
                    if due || live.finished.load(Ordering::SeqCst) || Instant::now() > deadline {
                        kill();
                        return done;
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            }))
        }
    };
    // Whatever happens below (a panic included), the killer is released and joined before this
    // function returns, so it never fires after the child could have been reaped.
    struct JoinKiller(Option<std::thread::JoinHandle<usize>>, Arc<Live>);
    impl Drop for JoinKiller {
        fn drop(&mut self) {
            self.1.finished.store(true, Ordering::SeqCst);
            if let Some(h) = self.0.take() {
                let _ = h.join();
            }
        }
    }
    let mut killer = JoinKiller(killer, live.clone());

    let mut generator = Gen::new(seed);
    let mut ops_ok = 0;
    let mut kinds = BTreeMap::new();
    let mut failure = None;
    let mut killed_after = usize::MAX;
    for i in 0..max_ops {
        let op = match trigger {
            Trigger::MidWrite { op, .. } if op == i => generator.big(&model, 8 << 20),
            _ => generator.next(&model),
        };
        let mut prog = Progress::default();
        match exec(&op, &root, &mut prog, &live) {
            Ok(()) => {
                model.apply(&op, umask);
                if let Some(p) = op.new_name()
                    && let Ok(meta) = fs::symlink_metadata(root.join(p))
                {
                    model.set_ino(p, meta.ino());
                }
                ops_ok += 1;
                *kinds.entry(op.kind()).or_insert(0) += 1;
            }
            Err(err) => {
                assert!(
                    live.killed.load(Ordering::SeqCst),
                    "operation #{i} ({op}) failed while the daemon was alive: {} ({} bytes acknowledged)",
                    errno_name(&err),
                    prog.acked
                );
                failure = Some(Failure {
                    index: i,
                    op,
                    prog,
                    err,
                });
                break;
            }
        }
        live.op_bytes.store(0, Ordering::SeqCst);
        live.ops_done.store(i + 1, Ordering::SeqCst);
        if let Trigger::AfterOps {
            n,
            from_other_thread: false,
        } = trigger
            && i + 1 == n
        {
            killed_after = n;
            kill();
        }
    }
    live.finished.store(true, Ordering::SeqCst);
    if let Some(h) = killer.0.take() {
        killed_after = h.join().expect("killer thread");
    }
    if !live.killed.load(Ordering::SeqCst) {
        killed_after = ops_ok;
        kill();
    }
    drop(killer);
    wait_dead(pid);
    // The daemon is gone: a metadata operation must fail now, not hang and not succeed.
    let probe = fs::create_dir(root.join("probe-after-kill"));
    assert!(
        probe.is_err(),
        "mkdir through the mount succeeded after the daemon was killed"
    );
    Outcome {
        model,
        ops_ok,
        kinds,
        killed_after,
        failure,
        probe_errno: probe.err().and_then(|e| e.raw_os_error()),
    }
}

/// Where a write of `data` at `off` over `before` stopped, judging by `cur`: the `k` such that
/// `cur == before` overlaid with `data[..k]`, with `k >= acked`.
fn partial_write_len(
    before: &[u8],
    cur: &[u8],
    off: usize,
    data: &[u8],
    acked: usize,
) -> Option<usize> {
    let k = if cur.len() > before.len() {
        cur.len() - off
    } else if cur.len() == before.len() {
        let mut s = cur.len();
        while s > off && cur[s - 1] == before[s - 1] {
            s -= 1;
        }
        (s - off).max(acked)
    } else {
        return None;
    };
    if k < acked || k > data.len() {
        return None;
    }
    let mut m = before.to_vec();
    overlay(&mut m, off, &data[..k]);
    (m == cur).then_some(k)
}

/// The states the workspace may be in when `f.op` was interrupted by the kill: not applied, applied,
/// or (for writes) applied up to some byte at or past what was acknowledged.
fn candidates(
    model: &Model,
    f: &Failure,
    seen: &BTreeMap<String, Seen>,
    umask: u32,
) -> Vec<(String, Model)> {
    let mut after = model.clone();
    after.apply(&f.op, umask);
    let cur = |p: &str| seen.get(p).filter(|s| s.kind == 'f').map(|s| &s.data);
    let mut out = Vec::new();
    match &f.op {
        Op::Create {
            path, data, mode, ..
        } => {
            if !f.prog.created {
                out.push(("not created".to_string(), model.clone()));
            }
            let mut lens = vec![f.prog.acked];
            if let Some(c) = cur(path)
                && c.len() > f.prog.acked
                && c.len() <= data.len()
                && c[..] == data[..c.len()]
            {
                lens.push(c.len());
            }
            for k in lens {
                let mut m = model.clone();
                m.new_file(path, data[..k].to_vec(), mode & !umask);
                out.push((format!("created, {k} of {} bytes written", data.len()), m));
            }
        }
        Op::Write {
            path, offset, data, ..
        } => push_partial_writes(&mut out, model, path, *offset as usize, data, f, cur(path)),
        Op::Append { path, data, .. } => {
            let off = model.content(path).len();
            push_partial_writes(&mut out, model, path, off, data, f, cur(path))
        }
        _ => out.push(("not applied".to_string(), model.clone())),
    }
    out.push(("complete".to_string(), after));
    out
}

fn push_partial_writes(
    out: &mut Vec<(String, Model)>,
    model: &Model,
    path: &str,
    off: usize,
    data: &[u8],
    f: &Failure,
    cur: Option<&Vec<u8>>,
) {
    let before = model.content(path);
    let mut lens = vec![f.prog.acked];
    if let Some(c) = cur
        && let Some(k) = partial_write_len(before, c, off, data, f.prog.acked)
        && k != f.prog.acked
    {
        lens.push(k);
    }
    for k in lens {
        let mut m = model.clone();
        overlay(m.content_mut(path), off, &data[..k]);
        out.push((format!("{k} of {} bytes written", data.len()), m));
    }
}

/// Checks the restarted workspace against the acknowledged state, allowing the interrupted
/// operation to be either applied or not; returns the state found.
fn verify_after_crash(label: &str, mount: &Path, out: &Outcome, umask: u32) -> Model {
    let seen = scan_mount(label, mount);
    let cands = match &out.failure {
        None => vec![(
            "every operation acknowledged".to_string(),
            out.model.clone(),
        )],
        Some(f) => candidates(&out.model, f, &seen, umask),
    };
    let mut reports = Vec::new();
    for (what, m) in cands {
        match check_against(&m, &seen) {
            Ok(()) => {
                eprintln!("{label}: the workspace matches the acknowledged state ({what})");
                return m;
            }
            Err(e) => reports.push(format!("--- if the interrupted operation was {what}:\n{e}")),
        }
    }
    let interrupted = out
        .failure
        .as_ref()
        .map(|f| {
            format!(
                "#{} {} ({} bytes acknowledged)",
                f.index, f.op, f.prog.acked
            )
        })
        .unwrap_or_else(|| "none".into());
    panic!(
        "{label}: after SIGKILL and restart, {} does not hold what was acknowledged \
         ({} operations acknowledged; interrupted operation: {interrupted}):\n{}",
        mount.display(),
        out.ops_ok,
        reports.join("\n")
    );
}

/// `octofs status <thread> --json` works and agrees with the quarantine folder; prints what was
/// quarantined (and whether those bytes are also in the workspace).
fn check_status(d: &Daemon, thread: &str, model: Option<&Model>) -> serde_json::Value {
    let v = parse_json("status --json", &d.cli_ok(["status", thread, "--json"]));
    assert_eq!(v["thread"].as_str(), Some(thread), "status: {v}");
    assert_eq!(v["mounted"].as_bool(), Some(true), "status: {v}");
    let q = v["quarantined"]
        .as_u64()
        .unwrap_or_else(|| panic!("status --json has no quarantined count: {v}"));
    let qdir = d
        .state
        .join("workspaces")
        .join(thread)
        .join("upper")
        .join("quarantine");
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&qdir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name() != "README")
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        fs::read(e.path()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    assert_eq!(
        q as usize,
        files.len(),
        "{thread}: status reports {q} quarantined files, {} holds {}",
        qdir.display(),
        files.len()
    );
    if let Ok(readme) = fs::read_to_string(qdir.join("README")) {
        eprintln!("{thread}: quarantine/README after an unclean stop:\n{readme}");
        for (name, bytes) in &files {
            let also = model.and_then(|m| m.files().into_iter().find(|p| m.content(p) == bytes));
            eprintln!(
                "  quarantined {name}: {} bytes{}",
                bytes.len(),
                match also {
                    Some(p) if !bytes.is_empty() => format!(" (same bytes as {p:?} in the mount)"),
                    _ if bytes.is_empty() => String::new(),
                    _ => " (NOT present in the mount: never acknowledged)".to_string(),
                }
            );
        }
    }
    v
}

struct Plan {
    trigger: Trigger,
    /// Whether the daemon that is killed in this run uses passthrough.
    passthrough: bool,
    /// Whether this run's thread is opened with `--io no-open` (every write a WRITE request, files
    /// held by inode, writers released by the sweeper): kept by the binding across every restart.
    no_open: bool,
}

fn serve_args(passthrough: bool) -> &'static [&'static str] {
    if passthrough {
        &[]
    } else {
        &["--passthrough", "false"]
    }
}

#[test]
fn sigkill_mid_workload_loses_nothing_acknowledged() {
    let started = Instant::now();
    let fx = fixture();
    let archive_model = Model::from_scan(&scan(&fx.archive), false);
    let umask = process_umask();
    const MAX_OPS: usize = 220;
    let after = |n, from_other_thread| Trigger::AfterOps {
        n,
        from_other_thread,
    };
    let mid_write = Trigger::MidWrite {
        op: 40,
        bytes: 3 << 20,
    };
    let plan = |trigger, passthrough, no_open| Plan {
        trigger,
        passthrough,
        no_open,
    };
    // (trigger, the killed daemon's passthrough, the thread opened `--io no-open`)
    let plans = [
        plan(after(30, false), true, false),
        plan(after(110, true), true, false),
        plan(mid_write, true, false),
        plan(mid_write, false, false),
        plan(after(150, true), false, false),
        plan(mid_write, true, true),
        plan(after(150, true), true, true),
    ];
    assert!(plans[0].passthrough, "the first daemon is a default one");

    let mut d = start_without_keeper();
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    let mirror = d.mirror(PROJECT);
    let mirror_before = mirror_digest(&mirror);

    // Every workspace so far, with the state it was verified to hold.
    let mut done: Vec<(String, Model, &str)> = Vec::new();
    for (k, plan) in plans.iter().enumerate() {
        let run_started = Instant::now();
        let thread = format!("crash{k}");
        let label = format!("run {k} ({:?})", plan.trigger);
        let io_mode = if plan.no_open { "no-open" } else { "handles" };
        d.cli_ok(["open", &thread, "--project", PROJECT, "--io", io_mode]);
        let mount = d.mount(&thread);
        wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
        let initial = Model::from_scan(&scan_mount(&label, &mount), true);
        let diffs = listing_diff(&archive_model.describe(), &initial.describe());
        assert!(
            diffs.is_empty(),
            "{label}: a fresh workspace differs from git archive:\n{}",
            diffs.join("\n")
        );

        let pid = d.pid().expect("daemon running");
        let (root, trigger) = (mount.clone(), plan.trigger);
        let out = io(&format!("{label}: workload"), move || {
            workload(root, initial, 1000 + k as u64, MAX_OPS, trigger, pid, umask)
        });
        let status = d.reap_killed();
        eprintln!(
            "{label}: daemon {status} after {} completed operations; {} acknowledged; \
             interrupted: {}; a mkdir after the kill failed with errno {:?}; acknowledged: {:?}",
            out.killed_after,
            out.ops_ok,
            out.failure
                .as_ref()
                .map(|f| format!(
                    "#{} {} after {} acknowledged bytes, with {}",
                    f.index,
                    f.op,
                    f.prog.acked,
                    errno_name(&f.err)
                ))
                .unwrap_or_else(|| "none".into()),
            out.probe_errno,
            out.kinds
        );
        assert!(
            out.ops_ok >= 20,
            "{label}: only {} operations ran before the kill",
            out.ops_ok
        );

        // Every mount of the dead daemon answers ENOTCONN; once detached, a new daemon on the
        // same state remounts every workspace by itself: no `open` is issued.
        let next_passthrough = plans.get(k + 1).is_none_or(|p| p.passthrough);
        let mut all: Vec<PathBuf> = done.iter().map(|(t, ..)| d.mount(t)).collect();
        all.push(mount.clone());
        restart_after_kill(&mut d, &all, serve_args(next_passthrough));

        let found = verify_after_crash(&label, &mount, &out, umask);
        for (t, m, _) in &done {
            verify_exact(&format!("{t} after the crash of {label}"), &d.mount(t), m);
        }
        done.push((thread, found, io_mode));
        for (t, m, io_mode) in &done {
            let v = check_status(&d, t, Some(m));
            assert_eq!(v["io"].as_str(), Some(*io_mode), "status of {t}: {v}");
            if !next_passthrough {
                assert_eq!(
                    v["passthrough"].as_bool(),
                    Some(false),
                    "status of {t}: {v}"
                );
            }
        }
        eprintln!("{label}: {:.2?}", run_started.elapsed());
    }

    // A clean stop and start after all the crashes: nothing changes.
    d.stop();
    d.spawn_with(NO_KEEPER);
    let all: Vec<PathBuf> = done.iter().map(|(t, ..)| d.mount(t)).collect();
    wait_mounted(&all, Duration::from_secs(10));
    for m in &all {
        mounted_once(m);
    }
    for (t, m, io_mode) in &done {
        verify_exact(&format!("{t} after a clean restart"), &d.mount(t), m);
        let v = check_status(&d, t, Some(m));
        assert_eq!(v["io"].as_str(), Some(*io_mode), "status of {t}: {v}");
    }
    assert_same_listing("mirror", &mirror_before, &mirror_digest(&mirror));
    eprintln!("sigkill test: {:.2?}", started.elapsed());
}

/// A daemon killed with SIGKILL without the connection keeper (`--keep-connections false`; with
/// it the next daemon adopts the mount: restart_idle.rs) leaves its mount behind, answering
/// `ENOTCONN`. A new `serve` on the same state must clear it and remount the workspace by itself
/// (docs/restart.md: on restart the daemon remounts every workspace that was mounted), with what was
/// written before the kill.
#[test]
fn serve_clears_a_dead_mount_left_by_sigkill() {
    let fx = fixture();
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--keep-connections", "false"]);
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    let mirror = d.mirror(PROJECT);
    let mirror_before = mirror_digest(&mirror);
    d.cli_ok(["open", "stale", "--project", PROJECT]);
    let mount = d.mount("stale");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    let m = mount.clone();
    io("writes before the kill", move || {
        fs::write(m.join("written-before-kill.txt"), b"still here\n").unwrap();
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.join("README.md"))
            .unwrap();
        f.write_all(b"appended before the kill\n").unwrap();
        // Any `ls` or `stat` of the workspace leaves the root's attributes in the kernel's cache.
        fs::metadata(&m).unwrap();
    });
    d.kill9();
    assert_eq!(
        live_errno(&mount),
        Some(libc::ENOTCONN),
        "the killed daemon's mount"
    );
    // No umount, no `open`: the new daemon must notice the dead mount itself.
    d.spawn();
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    mounted_once(&mount);
    let m = mount.clone();
    let (file, readme) = io("reads after the restart", move || {
        (
            fs::read(m.join("written-before-kill.txt")),
            fs::read(m.join("README.md")),
        )
    });
    assert_eq!(file.expect("written-before-kill.txt"), b"still here\n");
    assert_eq!(
        readme.expect("README.md"),
        b"octofs fault-injection fixture\nappended before the kill\n"
    );
    check_status(&d, "stale", None);
    d.stop();
    assert_same_listing("mirror", &mirror_before, &mirror_digest(&mirror));
}

// ---------------------------------------------------------------------------------------------
// 2. A full disk

/// Creates `dir/fNNN`, 1 MiB each in 64 KiB writes, until one fails; records what was
/// acknowledged. Returns how many files were created (the last one possibly partial).
fn fill_until_enospc(
    root: &Path,
    dir: &str,
    model: &mut Model,
    umask: u32,
    violations: &mut Vec<String>,
) -> usize {
    must(
        root,
        model,
        Op::Mkdir {
            path: dir.to_string(),
            mode: 0o755,
        },
        umask,
    );
    for i in 0..64u64 {
        let op = Op::Create {
            path: format!("{dir}/f{i:03}"),
            data: pseudo_random(1 << 20, 5000 + i),
            mode: 0o644,
            chunk: 64 * 1024,
            fsync: i % 4 == 0,
        };
        let (prog, r) = run_op(root, &op);
        match r {
            Ok(()) => model.apply(&op, umask),
            Err(e) => {
                eprintln!(
                    "filling {dir}: {op} failed with {} after {} acknowledged bytes",
                    errno_name(&e),
                    prog.acked
                );
                if e.raw_os_error() != Some(libc::ENOSPC) {
                    violation(
                        violations,
                        format!(
                            "filling the disk: {op} failed with {}, not ENOSPC ({} bytes acknowledged)",
                            errno_name(&e),
                            prog.acked
                        ),
                    );
                }
                model.apply_partial(&op, &prog, umask);
                return i as usize + usize::from(prog.created);
            }
        }
    }
    panic!("wrote 64 MiB into {dir} on a 16 MiB tmpfs without an error");
}

/// An operation on a full disk: success, or ENOSPC; anything else is a violation.
fn on_full_disk(
    root: &Path,
    model: &mut Model,
    op: Op,
    umask: u32,
    violations: &mut Vec<String>,
) -> String {
    let (prog, r) = run_op(root, &op);
    match r {
        Ok(()) => {
            model.apply(&op, umask);
            format!("{op}: ok")
        }
        Err(e) => {
            if e.raw_os_error() != Some(libc::ENOSPC) {
                violation(
                    violations,
                    format!(
                        "on a full disk, {op} failed with {}, not ENOSPC",
                        errno_name(&e)
                    ),
                );
            }
            model.apply_partial(&op, &prog, umask);
            format!(
                "{op}: {} ({} bytes acknowledged)",
                errno_name(&e),
                prog.acked
            )
        }
    }
}

/// Prints the warnings and errors of the last daemon's log (for the report).
fn print_log_problems(d: &Daemon, when: &str) {
    let text = d.log_text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && !l.contains("Broken pipe"))
        .collect();
    if !lines.is_empty() {
        eprintln!("daemon log, {when}:\n  {}", lines.join("\n  "));
    }
}

/// Records a violation (and prints it at once, in case a later step panics).
fn violation(violations: &mut Vec<String>, msg: String) {
    eprintln!("VIOLATION: {msg}");
    violations.push(msg);
}

/// Deletes a file of the workspace "full" on a full disk: it must succeed, deleting is how a user
/// frees space. When it fails, the violation is recorded and the tmpfs grown by 4 MiB from
/// outside, so that the rest of the test still runs.
fn delete_on_full_disk(
    d: &Daemon,
    tmpfs_mb: &mut u32,
    model: &mut Model,
    path: &str,
    umask: u32,
    violations: &mut Vec<String>,
) {
    let m = d.mount("full");
    let op = Op::Unlink {
        path: path.to_string(),
    };
    let (_, r) = run_op(&m, &op);
    if let Err(e) = r {
        violation(
            violations,
            format!(
                "on a full disk, {op} failed with {}: deleting cannot free space",
                errno_name(&e)
            ),
        );
        *tmpfs_mb += 4;
        sh(
            "mount",
            [
                "-o".as_ref(),
                format!("remount,size={tmpfs_mb}m").as_ref(),
                d.state.as_os_str(),
            ],
        )
        .assert_ok();
        let (_, r) = run_op(&m, &op);
        if let Err(e) = r {
            panic!(
                "{op} fails with {} even after the tmpfs grew to {tmpfs_mb} MiB; violations:\n  {}",
                errno_name(&e),
                violations.join("\n  ")
            );
        }
    }
    model.apply(&op, umask);
}

#[test]
fn full_state_dir_returns_enospc_and_keeps_every_acknowledged_write() {
    let started = Instant::now();
    let fx = fixture();
    let umask = process_umask();
    let mut d = Daemon::unstarted();
    // The whole state dir (mirror, blob cache, upper layers, catalog) on a 16 MiB tmpfs. On every
    // exit path, panics included, the guard lazily unmounts everything under its temporary
    // directory (the workspace mount first, then this tmpfs).
    sh(
        "mount",
        [
            "-t".as_ref(),
            "tmpfs".as_ref(),
            "-o".as_ref(),
            "size=16m,mode=0755".as_ref(),
            "octofs-test-enospc".as_ref(),
            d.state.as_os_str(),
        ],
    )
    .assert_ok();
    d.spawn_with(NO_KEEPER);
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    let mirror = d.mirror(PROJECT);
    let mirror_before = mirror_digest(&mirror);
    d.cli_ok(["open", "full", "--project", PROJECT]);
    let mount = d.mount("full");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    let m = mount.as_path();
    // From the archive, so that nothing reads cold/* before the disk is full.
    let base_model = Model::from_scan(&scan(&fx.archive), false);
    let mut model = base_model.clone();
    let mut violations: Vec<String> = Vec::new();

    // 1. Acknowledged writes while there is room: new files, copy-ups, metadata.
    must(
        m,
        &mut model,
        Op::Mkdir {
            path: "early".into(),
            mode: 0o755,
        },
        umask,
    );
    for i in 0..8u64 {
        let op = Op::Create {
            path: format!("early/f{i}"),
            data: pseudo_random(100 * 1024, 100 + i),
            mode: 0o644,
            chunk: 64 * 1024,
            fsync: i % 2 == 0,
        };
        must(m, &mut model, op, umask);
    }
    for op in [
        Op::Append {
            path: "README.md".into(),
            data: b"appended before the disk filled\n".to_vec(),
            fsync: true,
        },
        Op::Write {
            path: "src/main.c".into(),
            offset: 0,
            data: b"/* rewritten */".to_vec(),
            fsync: false,
        },
        Op::Chmod {
            path: "scripts/build.sh".into(),
            mode: 0o700,
        },
        Op::Rename {
            from: "pkg/m01.txt".into(),
            to: "pkg/renamed.txt".into(),
        },
        Op::Unlink {
            path: "pkg/m02.txt".into(),
        },
        Op::Link {
            from: "early/f0".into(),
            to: "early/f0-link".into(),
        },
        Op::Symlink {
            path: "early/sym".into(),
            target: "../README.md".into(),
        },
        Op::Truncate {
            path: "data/small.bin".into(),
            len: 1000,
        },
    ] {
        must(m, &mut model, op, umask);
    }

    // 2. Fill the disk: the failing write returns ENOSPC.
    let filled = fill_until_enospc(m, "fill", &mut model, umask, &mut violations);
    assert!(filled >= 4, "only {filled} MiB fitted on the tmpfs");

    // 3. More requests on the full disk: each succeeds or says ENOSPC (never EIO, never a hang).
    let mut report = Vec::new();
    for op in [
        Op::Create {
            path: "full-new.bin".into(),
            data: pseudo_random(64 * 1024, 77),
            mode: 0o644,
            chunk: 64 * 1024,
            fsync: false,
        },
        // A base file never read so far: copy-up needs its blob, and room for it.
        Op::Append {
            path: "cold/c1.bin".into(),
            data: b"more".to_vec(),
            fsync: false,
        },
        Op::Mkdir {
            path: "full-dir".into(),
            mode: 0o755,
        },
        Op::Rename {
            from: "early/f1".into(),
            to: "early/f1-renamed".into(),
        },
        Op::Chmod {
            path: "early/f2".into(),
            mode: 0o600,
        },
        Op::Write {
            path: "early/f3".into(),
            offset: 0,
            data: pseudo_random(4096, 78),
            fsync: true,
        },
        Op::Symlink {
            path: "full-sym".into(),
            target: "README.md".into(),
        },
        Op::Link {
            from: "early/f4".into(),
            to: "early/f4-link".into(),
        },
    ] {
        report.push(on_full_disk(m, &mut model, op, umask, &mut violations));
    }
    // Reading a base file whose blob is not cached yet.
    let want_c2 = model.content("cold/c2.bin").clone();
    let c2 = m.join("cold/c2.bin");
    match io("read cold/c2.bin on a full disk", move || fs::read(&c2)) {
        Ok(bytes) if bytes == want_c2 => report.push("read cold/c2.bin: ok".into()),
        Ok(bytes) => violation(
            &mut violations,
            format!(
                "on a full disk, reading cold/c2.bin returned {} wrong bytes",
                bytes.len()
            ),
        ),
        Err(e) => {
            report.push(format!("read cold/c2.bin: {}", errno_name(&e)));
            if e.raw_os_error() != Some(libc::ENOSPC) {
                violation(
                    &mut violations,
                    format!(
                        "on a full disk, reading the uncached base file cold/c2.bin failed with \
                         {}, not ENOSPC (nor success)",
                        errno_name(&e)
                    ),
                );
            }
        }
    }
    eprintln!("on the full disk:\n  {}", report.join("\n  "));
    // While the disk is full, every file the test wrote (created or changed) reads back intact.
    // Files still holding base content (never read so far, so not in the blob cache) must read
    // too, or at least fail with ENOSPC, never EIO.
    let written = |p: &str| {
        let id = model.file_id(p);
        base_model
            .nodes
            .get(&id)
            .is_none_or(|n| n.data != model.node(id).data)
    };
    let (mm, want): (PathBuf, Vec<(String, Vec<u8>, bool)>) = (
        m.to_path_buf(),
        model
            .files()
            .into_iter()
            .map(|p| {
                let c = model.content(&p).clone();
                let w = written(&p);
                (p, c, w)
            })
            .collect(),
    );
    let (bad_written, bad_base) = io("reading every file on the full disk", move || {
        let (mut bw, mut bb) = (Vec::new(), Vec::new());
        for (p, c, w) in &want {
            let problem = match fs::read(mm.join(p)) {
                Ok(b) if b == *c => continue,
                Ok(b) => format!("{p}: {} bytes, want {}", b.len(), c.len()),
                Err(e) if !*w && e.raw_os_error() == Some(libc::ENOSPC) => continue,
                Err(e) => format!("{p}: {}", errno_name(&e)),
            };
            if *w {
                bw.push(problem)
            } else {
                bb.push(problem)
            }
        }
        (bw, bb)
    });
    assert!(
        bad_written.is_empty(),
        "on the full disk, files written before it filled do not read back:\n  {}",
        bad_written.join("\n  ")
    );
    if !bad_base.is_empty() {
        violation(
            &mut violations,
            format!(
                "on a full disk, {} of the unmodified base files (blobs not cached yet) cannot be \
                 read: {}",
                bad_base.len(),
                bad_base.join(", ")
            ),
        );
    }
    // The daemon still serves: the control socket, statfs and a listing of the mount.
    check_status(&d, "full", Some(&model));
    sh("stat", ["-f".as_ref(), m.as_os_str()]).assert_ok();
    sh("ls", ["-la".as_ref(), m.join("early").as_os_str()]).assert_ok();

    // 4. Deleting frees space, and new writes succeed again.
    let mut tmpfs_mb = 16;
    for i in 0..4 {
        let path = format!("fill/f{i:03}");
        delete_on_full_disk(&d, &mut tmpfs_mb, &mut model, &path, umask, &mut violations);
    }
    let op = Op::Create {
        path: "after-free.bin".into(),
        data: pseudo_random(1 << 20, 79),
        mode: 0o644,
        chunk: 64 * 1024,
        fsync: true,
    };
    let (_, r) = run_op(m, &op);
    if let Err(e) = r {
        panic!(
            "after deleting 4 MiB, {op} failed with {}; violations:\n  {}",
            errno_name(&e),
            violations.join("\n  ")
        );
    }
    model.apply(&op, umask);
    verify_exact("after freeing space", m, &model);

    // 5. Stop and start: the catalog loads with every write.
    d.stop();
    d.spawn_with(NO_KEEPER);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    mounted_once(&mount);
    verify_exact("after stop + start", m, &model);
    check_status(&d, "full", Some(&model));

    // 6. Fill again and stop while the disk is full (compaction has no room), then start.
    fill_until_enospc(m, "fill2", &mut model, umask, &mut violations);
    d.stop();
    print_log_problems(&d, "stop on a full disk");
    d.spawn_with(NO_KEEPER);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    mounted_once(&mount);
    verify_exact("after a stop on a full disk", m, &model);

    // 7. Still full: SIGKILL, then start.
    let op = Op::Create {
        path: "fill2/one-more".into(),
        data: pseudo_random(1 << 20, 80),
        mode: 0o644,
        chunk: 64 * 1024,
        fsync: false,
    };
    let line = on_full_disk(m, &mut model, op, umask, &mut violations);
    eprintln!("before the SIGKILL: {line}");
    d.kill9();
    restart_after_kill(&mut d, std::slice::from_ref(&mount), &[]);
    verify_exact("after SIGKILL on a full disk", m, &model);
    check_status(&d, "full", Some(&model));

    // 8. Free space again; writes work; a last clean restart.
    let fill2: Vec<String> = model
        .files()
        .into_iter()
        .filter(|p| p.starts_with("fill2/"))
        .collect();
    for p in fill2 {
        delete_on_full_disk(&d, &mut tmpfs_mb, &mut model, &p, umask, &mut violations);
    }
    let op = Op::Create {
        path: "the-end.bin".into(),
        data: pseudo_random(2 << 20, 81),
        mode: 0o644,
        chunk: 1 << 20,
        fsync: true,
    };
    must(m, &mut model, op, umask);
    d.stop();
    d.spawn_with(NO_KEEPER);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    mounted_once(&mount);
    verify_exact("at the end", m, &model);
    d.stop();

    assert_same_listing("mirror", &mirror_before, &mirror_digest(&mirror));
    run(
        Command::new("umount").arg(&d.state),
        Duration::from_secs(10),
    )
    .assert_ok();
    eprintln!("enospc test: {:.2?}", started.elapsed());
    assert!(
        violations.is_empty(),
        "full-disk violations:\n  {}",
        violations.join("\n  ")
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Inode numbers

#[track_caller]
fn check_inos(label: &str, mount: &Path, want: &BTreeMap<String, u64>) {
    let (m, w) = (mount.to_path_buf(), want.clone());
    let diffs = io(label, move || {
        let mut diffs = Vec::new();
        for (p, ino) in &w {
            match fs::symlink_metadata(m.join(p)) {
                Ok(meta) if meta.ino() == *ino => {}
                Ok(meta) => diffs.push(format!("  {p}: was {ino:#x}, now {:#x}", meta.ino())),
                Err(e) => diffs.push(format!("  {p}: {e}")),
            }
        }
        diffs
    });
    assert!(
        diffs.is_empty(),
        "{label}: inode numbers changed:\n{}",
        diffs.join("\n")
    );
}

/// Creates `rel` with a little content and returns its inode number.
fn create_and_stat(mount: &Path, rel: &str) -> u64 {
    let p = mount.join(rel);
    io(&format!("create {rel}"), move || {
        fs::write(&p, b"new\n").unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
        fs::symlink_metadata(&p).unwrap().ino()
    })
}

#[test]
fn inode_numbers_survive_copy_up_rename_link_and_restart() {
    let started = Instant::now();
    let fx = fixture();
    let mut d = start_without_keeper();
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    let mirror = d.mirror(PROJECT);
    let mirror_before = mirror_digest(&mirror);
    d.cli_ok(["open", "inodes", "--project", PROJECT]);
    let mount = d.mount("inodes");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));

    let m = mount.clone();
    let (want, mut seen) = io("inode checks", move || {
        let ino = |rel: &str| {
            fs::symlink_metadata(m.join(rel))
                .unwrap_or_else(|e| panic!("stat {rel}: {e}"))
                .ino()
        };
        let nlink = |rel: &str| fs::symlink_metadata(m.join(rel)).unwrap().nlink();
        let names = [
            "src",
            "src/main.c",
            "src/lib",
            "src/lib/util.c",
            "src/lib/util.h",
            "README.md",
            "docs/a",
            "docs/a/b",
            "docs/a/b/deep.md",
            "pkg/m03.txt",
            "pkg/m04.txt",
            "solo",
            "solo/only.txt",
            "data/blob.bin",
            "link-readme",
        ];
        let base: BTreeMap<&str, u64> = names.iter().map(|p| (*p, ino(p))).collect();
        let mut seen: BTreeSet<u64> = base.values().copied().collect();
        assert_eq!(
            seen.len(),
            base.len(),
            "distinct paths share a number: {base:?}"
        );

        // Copy-up by a write, with no reader open: the number stays (fstat of the writer too).
        {
            let mut f = OpenOptions::new()
                .append(true)
                .open(m.join("src/main.c"))
                .unwrap();
            f.write_all(b"// appended\n").unwrap();
            assert_eq!(
                f.metadata().unwrap().ino(),
                base["src/main.c"],
                "fstat of the writer after copy-up"
            );
        }
        assert_eq!(ino("src/main.c"), base["src/main.c"], "copy-up by append");
        // O_TRUNC (copies no data), truncate(2) of a large file, chmod (metadata only).
        fs::write(m.join("src/lib/util.c"), b"int util(void) { return 7; }\n").unwrap();
        assert_eq!(
            ino("src/lib/util.c"),
            base["src/lib/util.c"],
            "O_TRUNC copy-up"
        );
        OpenOptions::new()
            .write(true)
            .open(m.join("data/blob.bin"))
            .unwrap()
            .set_len(1000)
            .unwrap();
        assert_eq!(
            ino("data/blob.bin"),
            base["data/blob.bin"],
            "truncate copy-up"
        );
        fs::set_permissions(m.join("README.md"), fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(ino("README.md"), base["README.md"], "chmod");

        // Rename of the file, then of its directory (which also holds an untouched base file and
        // a subdirectory), then of a directory two levels above an untouched file.
        fs::rename(m.join("src/main.c"), m.join("src/main2.c")).unwrap();
        assert_eq!(ino("src/main2.c"), base["src/main.c"], "file rename");
        fs::rename(m.join("src"), m.join("source")).unwrap();
        for (new, old) in [
            ("source", "src"),
            ("source/main2.c", "src/main.c"),
            ("source/lib", "src/lib"),
            ("source/lib/util.c", "src/lib/util.c"),
            ("source/lib/util.h", "src/lib/util.h"),
        ] {
            assert_eq!(ino(new), base[old], "{new} (was {old}) after renaming src");
        }
        fs::rename(m.join("docs/a"), m.join("docs/z")).unwrap();
        assert_eq!(ino("docs/z"), base["docs/a"], "directory rename");
        assert_eq!(ino("docs/z/b"), base["docs/a/b"]);
        assert_eq!(ino("docs/z/b/deep.md"), base["docs/a/b/deep.md"]);
        fs::rename(m.join("pkg/m03.txt"), m.join("docs/z/m03.txt")).unwrap();
        assert_eq!(
            ino("docs/z/m03.txt"),
            base["pkg/m03.txt"],
            "move across dirs"
        );
        fs::rename(m.join("link-readme"), m.join("docs/link-readme")).unwrap();
        assert_eq!(
            ino("docs/link-readme"),
            base["link-readme"],
            "symlink rename"
        );

        // Hardlinks share the number: of a copied-up file and of an untouched base file.
        fs::hard_link(m.join("source/main2.c"), m.join("hard-main.c")).unwrap();
        assert_eq!(ino("hard-main.c"), base["src/main.c"]);
        assert_eq!((nlink("hard-main.c"), nlink("source/main2.c")), (2, 2));
        fs::hard_link(m.join("source/lib/util.h"), m.join("util-link.h")).unwrap();
        assert_eq!(ino("util-link.h"), base["src/lib/util.h"]);
        assert_eq!(ino("source/lib/util.h"), base["src/lib/util.h"]);
        assert_eq!((nlink("util-link.h"), nlink("source/lib/util.h")), (2, 2));

        // New names get fresh numbers.
        fs::create_dir(m.join("new")).unwrap();
        fs::write(m.join("new/new.txt"), b"new\n").unwrap();
        std::os::unix::fs::symlink("new.txt", m.join("new/new-link")).unwrap();
        for p in ["new", "new/new.txt", "new/new-link"] {
            assert!(seen.insert(ino(p)), "{p} got a number already in use");
        }

        // A deleted and recreated name gets a new number: base file, new file, base directory,
        // new directory.
        fs::remove_file(m.join("pkg/m04.txt")).unwrap();
        fs::write(m.join("pkg/m04.txt"), b"recreated\n").unwrap();
        let n = ino("pkg/m04.txt");
        assert!(
            n != base["pkg/m04.txt"] && seen.insert(n),
            "recreated base file: {n:#x}"
        );
        fs::write(m.join("tmp.txt"), b"one\n").unwrap();
        let a = ino("tmp.txt");
        assert!(seen.insert(a));
        fs::remove_file(m.join("tmp.txt")).unwrap();
        fs::write(m.join("tmp.txt"), b"two\n").unwrap();
        let b = ino("tmp.txt");
        assert!(
            b != a && seen.insert(b),
            "recreated new file: {a:#x} then {b:#x}"
        );
        fs::remove_file(m.join("solo/only.txt")).unwrap();
        fs::remove_dir(m.join("solo")).unwrap();
        fs::create_dir(m.join("solo")).unwrap();
        fs::write(m.join("solo/only.txt"), b"recreated\n").unwrap();
        let (s, so) = (ino("solo"), ino("solo/only.txt"));
        assert!(s != base["solo"] && seen.insert(s), "recreated base dir");
        assert!(
            so != base["solo/only.txt"] && seen.insert(so),
            "recreated base file"
        );
        fs::create_dir(m.join("d1")).unwrap();
        let a = ino("d1");
        assert!(seen.insert(a));
        fs::remove_dir(m.join("d1")).unwrap();
        fs::create_dir(m.join("d1")).unwrap();
        let b = ino("d1");
        assert!(b != a && seen.insert(b), "recreated new dir");

        let want: BTreeMap<String, u64> = [
            "source",
            "source/main2.c",
            "hard-main.c",
            "source/lib",
            "source/lib/util.c",
            "source/lib/util.h",
            "util-link.h",
            "README.md",
            "docs/z",
            "docs/z/b",
            "docs/z/b/deep.md",
            "docs/z/m03.txt",
            "docs/link-readme",
            "data/blob.bin",
            "new",
            "new/new.txt",
            "new/new-link",
            "pkg/m04.txt",
            "tmp.txt",
            "solo",
            "solo/only.txt",
            "d1",
            // Untouched base entries.
            "pkg",
            "pkg/m05.txt",
            "docs",
            "cold/c1.bin",
        ]
        .iter()
        .map(|p| (p.to_string(), ino(p)))
        .collect();
        (want, seen)
    });
    check_inos("after the changes", &mount, &want);

    // A clean restart, then one by SIGKILL: every number stays; new files get numbers never seen.
    d.stop();
    d.spawn_with(NO_KEEPER);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    mounted_once(&mount);
    check_inos("after stop + start", &mount, &want);
    let n = create_and_stat(&mount, "after-restart.txt");
    assert!(seen.insert(n), "a new file after a restart reuses {n:#x}");
    d.kill9();
    restart_after_kill(&mut d, std::slice::from_ref(&mount), &[]);
    check_inos("after SIGKILL + start", &mount, &want);
    let n = create_and_stat(&mount, "after-crash.txt");
    assert!(seen.insert(n), "a new file after a crash reuses {n:#x}");
    let m = mount.clone();
    let links = io("nlink after restarts", move || {
        [
            "hard-main.c",
            "source/main2.c",
            "util-link.h",
            "source/lib/util.h",
        ]
        .map(|p| fs::symlink_metadata(m.join(p)).unwrap().nlink())
    });
    assert_eq!(links, [2, 2, 2, 2], "link counts after restarts");
    d.stop();
    assert_same_listing("mirror", &mirror_before, &mirror_digest(&mirror));
    eprintln!("inode test: {:.2?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 4. A reader open across a copy-up

/// Everything from offset 0 to EOF through `f` (pread, so the file offset does not matter).
fn pread_all(f: &File) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read_at(&mut buf, out.len() as u64)?;
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[derive(Debug)]
struct ReaderView {
    reader_ino: u64,
    writer_ino: u64,
    path_ino: u64,
    /// What the descriptor opened before the write reads afterwards.
    reader_sees: Vec<u8>,
    /// `fstat` of that descriptor afterwards.
    reader_fstat: Result<u64, String>,
    /// What a new open reads.
    new_open_sees: Vec<u8>,
}

/// Opens `rel` for reading and reads some of it, then runs `write` (which must append `appended`
/// through another descriptor or process), then looks through both the old descriptor and a new
/// one.
fn reader_across_write(
    mount: &Path,
    rel: &str,
    base: Vec<u8>,
    write: impl FnOnce(&Path) -> u64 + Send + 'static,
) -> ReaderView {
    let path = mount.join(rel);
    io(&format!("reader across a copy-up of {rel}"), move || {
        let mut reader = File::open(&path).unwrap();
        let mut head = vec![0u8; base.len().min(4096)];
        reader.read_exact(&mut head).unwrap();
        assert_eq!(head, base[..head.len()], "reader before the write");
        // The whole file through the old descriptor, so the kernel caches its pages.
        assert_eq!(pread_all(&reader).unwrap(), base, "reader before the write");
        let reader_ino = reader.metadata().unwrap().ino();
        assert_eq!(fs::metadata(&path).unwrap().ino(), reader_ino);
        let writer_ino = write(&path);
        ReaderView {
            reader_ino,
            writer_ino,
            path_ino: fs::metadata(&path).unwrap().ino(),
            reader_sees: pread_all(&reader).unwrap(),
            reader_fstat: reader
                .metadata()
                .map(|m| m.len())
                .map_err(|e| e.to_string()),
            new_open_sees: fs::read(&path).unwrap(),
        }
    })
}

fn reader_across_copy_up(passthrough: bool) {
    let started = Instant::now();
    let fx = fixture();
    let base_blob = fs::read(fx.repo.path.join("data/blob.bin")).unwrap();
    let base_m05 = fs::read(fx.repo.path.join("pkg/m05.txt")).unwrap();
    let args = serve_args(passthrough);
    // Passthrough needs CAP_SYS_ADMIN and Linux >= 6.9; elsewhere the daemon falls back.
    let expect_pt = passthrough && unsafe { libc::geteuid() } == 0 && kernel_at_least(6, 9);
    if passthrough && !expect_pt {
        eprintln!("passthrough unavailable here (not root or kernel < 6.9): checking the fallback");
    }

    let mut d = Daemon::unstarted();
    d.spawn_with(args);
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    let mirror = d.mirror(PROJECT);
    let mirror_before = mirror_digest(&mirror);
    d.cli_ok(["open", "reader", "--project", PROJECT]);
    let mount = d.mount("reader");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));

    // In-process: a second descriptor opened with O_APPEND while the reader is open.
    let appended = b"appended while a reader was open\n".to_vec();
    let app = appended.clone();
    let v1 = reader_across_write(&mount, "data/blob.bin", base_blob.clone(), move |p| {
        let mut w = OpenOptions::new()
            .append(true)
            .open(p)
            .unwrap_or_else(|e| panic!("open for append while a reader is open: {e}"));
        w.write_all(&app)
            .unwrap_or_else(|e| panic!("append while a reader is open: {e}"));
        w.metadata().unwrap().ino()
    });
    // A shell's `echo >>` (open with O_CREAT|O_APPEND in another process).
    let v2 = reader_across_write(&mount, "pkg/m05.txt", base_m05.clone(), |p| {
        run(
            Command::new("sh")
                .args(["-c", "echo shell-append >> \"$1\"", "sh"])
                .arg(p),
            Duration::from_secs(10),
        )
        .assert_ok();
        fs::metadata(p).unwrap().ino()
    });
    let status = check_status(&d, "reader", None);
    assert_eq!(
        status["passthrough"].as_bool(),
        Some(expect_pt),
        "status --json passthrough: {status}"
    );

    let new_blob = [base_blob.clone(), appended].concat();
    let new_m05 = [base_m05.clone(), b"shell-append\n".to_vec()].concat();
    for (v, old, new, what) in [
        (
            &v1,
            &base_blob,
            &new_blob,
            "data/blob.bin (in-process append)",
        ),
        (&v2, &base_m05, &new_m05, "pkg/m05.txt (shell echo >>)"),
    ] {
        eprintln!(
            "{what}, passthrough {expect_pt}: reader ino {:#x}, writer ino {:#x}, path ino {:#x}; \
             the old descriptor reads {} bytes ({}), fstat size {:?}; a new open reads {} bytes",
            v.reader_ino,
            v.writer_ino,
            v.path_ino,
            v.reader_sees.len(),
            if v.reader_sees == *old {
                "the base content"
            } else if v.reader_sees == *new {
                "the new content"
            } else {
                "NEITHER"
            },
            v.reader_fstat,
            v.new_open_sees.len()
        );
        // Everyone opening the path from now on sees the write.
        assert!(
            v.new_open_sees == *new,
            "{what}: a new open does not see the append"
        );
        assert_eq!(
            v.writer_ino, v.path_ino,
            "{what}: the writer's file is the path's"
        );
        if expect_pt {
            // docs/overlay.md: the name moved to a new, copied-up inode; the earlier descriptor
            // keeps the base content, as after a rename-over, until it is closed.
            assert!(
                v.reader_sees == *old,
                "{what}: with passthrough the earlier reader must keep the base content, \
                 read {} bytes",
                v.reader_sees.len()
            );
            assert_ne!(
                v.reader_ino, v.path_ino,
                "{what}: with passthrough the name moves to a new inode"
            );
        } else {
            // docs/overlay.md: copy-up in place; every descriptor reads the current content.
            assert!(
                v.reader_sees == *new,
                "{what}: without passthrough the earlier reader must see the current content, \
                 read {} bytes (base is {}, new is {})",
                v.reader_sees.len(),
                old.len(),
                new.len()
            );
            assert_eq!(
                v.reader_ino, v.path_ino,
                "{what}: without passthrough the copy-up keeps the inode number"
            );
        }
    }

    // With the readers closed: a further append, then a restart; content and numbers persist.
    let p = mount.join("data/blob.bin");
    io("second append", move || {
        let mut w = OpenOptions::new().append(true).open(&p).unwrap();
        w.write_all(b"second\n").unwrap();
    });
    let new_blob = [new_blob, b"second\n".to_vec()].concat();
    d.stop();
    d.spawn_with(args);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    mounted_once(&mount);
    let m = mount.clone();
    let (blob, m05, i1, i2) = io("after restart", move || {
        (
            fs::read(m.join("data/blob.bin")).unwrap(),
            fs::read(m.join("pkg/m05.txt")).unwrap(),
            fs::metadata(m.join("data/blob.bin")).unwrap().ino(),
            fs::metadata(m.join("pkg/m05.txt")).unwrap().ino(),
        )
    });
    assert!(blob == new_blob, "data/blob.bin after restart");
    assert!(m05 == new_m05, "pkg/m05.txt after restart");
    assert_eq!(
        (i1, i2),
        (v1.path_ino, v2.path_ino),
        "numbers after restart"
    );
    d.stop();
    assert_same_listing("mirror", &mirror_before, &mirror_digest(&mirror));
    eprintln!(
        "reader test (passthrough {passthrough}): {:.2?}",
        started.elapsed()
    );
}

#[test]
fn reader_across_copy_up_with_passthrough() {
    reader_across_copy_up(true);
}

#[test]
fn reader_across_copy_up_without_passthrough() {
    reader_across_copy_up(false);
}

// ---------------------------------------------------------------------------------------------
// Issue 10: a damaged catalog record

/// One flipped byte in a middle record of `catalog.log` (the daemon killed, so the log is what the
/// next daemon replays) used to cut off every record after it: files created later vanished. Now
/// it costs that record alone, every other file is intact, and `status` and the log name what the
/// damaged record concerned.
#[test]
fn a_damaged_catalog_record_costs_that_record_alone() {
    let fx = fixture();
    let mut d = start_without_keeper();
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    d.cli_ok(["open", "dmg", "--project", PROJECT]);
    let mount = d.mount("dmg");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    let m = mount.clone();
    io("creating files", move || {
        for i in 1..=6 {
            fs::write(m.join(format!("new{i}.txt")), format!("content {i}\n")).unwrap();
        }
        let mut f = OpenOptions::new()
            .append(true)
            .open(m.join("README.md"))
            .unwrap();
        f.write_all(b"appended\n").unwrap();
    });
    d.kill9();
    let log_path = d
        .state
        .join("workspaces/dmg/upper/catalog.log")
        .to_path_buf();
    let mut log = fs::read(&log_path).unwrap();
    // The ':' of the directory entry that names new3.txt: the record no longer parses.
    let needle = b"\"name\":\"new3.txt\",\"ino\"";
    let at = log
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("no entry for new3.txt in {}", String::from_utf8_lossy(&log)));
    log[at + 6] = b';';
    fs::write(&log_path, &log).unwrap();
    restart_after_kill(&mut d, std::slice::from_ref(&mount), &[]);

    let m = mount.clone();
    let (files, readme) = io("reads after the restart", move || {
        let files: Vec<_> = (1..=6)
            .map(|i| fs::read_to_string(m.join(format!("new{i}.txt"))).ok())
            .collect();
        (files, fs::read_to_string(m.join("README.md")).unwrap())
    });
    for (i, got) in files.iter().enumerate() {
        let i = i + 1;
        if i == 3 {
            continue;
        }
        assert_eq!(
            got.as_deref(),
            Some(format!("content {i}\n").as_str()),
            "new{i}.txt after one damaged record\n--- daemon log ---\n{}",
            d.log_tail()
        );
    }
    assert_eq!(
        readme, "octofs fault-injection fixture\nappended\n",
        "README.md after one damaged record"
    );
    let v = check_status(&d, "dmg", None);
    let damaged = v["damaged"].to_string();
    assert!(
        damaged.contains("new3.txt"),
        "status must name what the damaged record concerned: {v}"
    );
    let text = d.cli_ok(["status", "dmg"]);
    assert!(
        text.contains("damaged:") && text.contains("new3.txt"),
        "{text}"
    );
    assert!(
        d.log_text().contains("new3.txt"),
        "the daemon log must report the damage\n{}",
        d.log_tail()
    );
    // A later restart still reports it, and nothing more is lost.
    d.stop();
    d.spawn_with(NO_KEEPER);
    let v = parse_json("status --json", &d.cli_ok(["status", "dmg", "--json"]));
    assert!(v["damaged"].to_string().contains("new3.txt"), "{v}");
    let m = mount.clone();
    let again = io("reads after a second restart", move || {
        fs::read_to_string(m.join("new6.txt")).ok()
    });
    assert_eq!(again.as_deref(), Some("content 6\n"));
    d.stop();
}

/// Issue 10: the compacted snapshot (`catalog.snap`, written at a clean stop) is framed like the
/// log: a flipped byte in its middle costs the frame it hit (at most 64 records), not the workspace.
#[test]
fn a_damaged_catalog_snapshot_costs_that_frame_alone() {
    const N: usize = 150;
    let fx = fixture();
    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    d.cli_ok(["open", "snapdmg", "--project", PROJECT]);
    let mount = d.mount("snapdmg");
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    let m = mount.clone();
    io("creating files", move || {
        for i in 1..=N {
            fs::write(m.join(format!("new{i}.txt")), format!("content {i}\n")).unwrap();
        }
    });
    // A clean stop compacts: everything is in the snapshot, the log is empty.
    d.stop();
    let upper = d.state.join("workspaces/snapdmg/upper");
    assert_eq!(fs::metadata(upper.join("catalog.log")).unwrap().len(), 0);
    let snap_path = upper.join("catalog.snap");
    let mut snap = fs::read(&snap_path).unwrap();
    let mid = snap.len() / 2;
    snap[mid] ^= 0x04;
    fs::write(&snap_path, &snap).unwrap();
    d.spawn();
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));

    let m = mount.clone();
    let (files, readme) = io("reads after the restart", move || {
        let files: Vec<_> = (1..=N)
            .map(|i| fs::read_to_string(m.join(format!("new{i}.txt"))).ok())
            .collect();
        (files, fs::read_to_string(m.join("README.md")).ok())
    });
    assert_eq!(
        readme.as_deref(),
        Some("octofs fault-injection fixture\n"),
        "a base file after a damaged snapshot\n--- daemon log ---\n{}",
        d.log_tail()
    );
    let v = check_status(&d, "snapdmg", None);
    let damaged = v["damaged"].to_string();
    assert!(
        damaged.contains("snapshot"),
        "status must report the damage: {v}"
    );
    let mut lost = Vec::new();
    for (i, got) in files.iter().enumerate() {
        let i = i + 1;
        match got {
            Some(text) => assert_eq!(*text, format!("content {i}\n"), "new{i}.txt"),
            None => lost.push(i),
        }
    }
    assert!(
        !lost.is_empty() && lost.len() <= 64,
        "one damaged frame costs at most 64 records: lost {lost:?}\n--- daemon log ---\n{}",
        d.log_tail()
    );
    // The flipped byte may have hit a name itself: every other lost file is named ("newN.txt" is
    // no substring of another file's name).
    let unnamed: Vec<_> = lost
        .iter()
        .filter(|i| !damaged.contains(&format!("new{i}.txt")))
        .collect();
    assert!(
        unnamed.len() <= 1,
        "lost but not reported: {unnamed:?} in {damaged}"
    );
    assert!(
        d.log_text().contains("damaged snapshot record"),
        "the daemon log must report the damage\n{}",
        d.log_tail()
    );
    // New files get fresh inode numbers and survive another restart; the damage stays reported.
    let m = mount.clone();
    io("creating after the damage", move || {
        fs::write(m.join("later.txt"), "later\n").unwrap();
    });
    d.stop();
    d.spawn();
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(10));
    let v = parse_json("status --json", &d.cli_ok(["status", "snapdmg", "--json"]));
    assert!(v["damaged"].to_string().contains("snapshot"), "{v}");
    let m = mount.clone();
    let (later, kept) = io("reads after a second restart", move || {
        (
            fs::read_to_string(m.join("later.txt")).ok(),
            (1..=N)
                .filter(|i| fs::read_to_string(m.join(format!("new{i}.txt"))).is_ok())
                .count(),
        )
    });
    assert_eq!(later.as_deref(), Some("later\n"));
    assert_eq!(kept, N - lost.len());
    d.stop();
}

// ---------------------------------------------------------------------------------------------
// Issue 10: a mirror or the blob cache deleted under a live daemon

/// `git -C <mirror> ...` as the test sees it.
fn mirror_git(mirror: &Path, args: &[&str]) -> Out {
    run(
        Command::new("git").arg("-C").arg(mirror).args(args),
        Duration::from_secs(30),
    )
}

/// A mirror deleted under live workspaces used to leave them stuck: `mirror sync` "succeeded"
/// without a mirror, and no snapshot or release was possible. Now `mirror sync` re-creates it from the
/// project's upstream, the workspaces read and save again (a new snapshot chain: the old one went with
/// the mirror), and `release --discard` can always drop a workspace, mirror or not.
#[test]
fn a_deleted_mirror_heals_and_a_workspace_can_always_be_saved_or_discarded() {
    let fx = fixture();
    let upstream_head = fx.repo.head();
    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    let mirror = d.mirror(PROJECT);
    d.cli_ok(["open", "keep", "--project", PROJECT]);
    d.cli_ok(["open", "drop", "--project", PROJECT]);
    let keep = d.mount("keep");
    let drop_mount = d.mount("drop");
    let m = keep.clone();
    io("work before the mirror goes", move || {
        fs::write(m.join("work.txt"), b"before\n").unwrap();
    });
    d.cli_ok(["snapshot", "keep"]);

    fs::remove_dir_all(&mirror).unwrap();
    // Saving needs the mirror: refused with a clear line that says how to get out.
    let out = d.cli(["release", "keep"]);
    assert!(!out.success(), "{}", out.describe());
    let err = out.stderr_str();
    assert!(
        err.contains("mirror sync") && err.contains("--discard"),
        "{}",
        out.describe()
    );
    assert!(mounts_under(&d.root).contains(&keep));

    let out = d.cli_ok(["mirror", "sync", PROJECT]);
    assert!(
        mirror.join(".git").is_dir(),
        "`mirror sync` must re-create a missing mirror (said {out:?})"
    );
    assert_eq!(
        mirror_git(&mirror, &["rev-parse", "HEAD"])
            .stdout_str()
            .trim(),
        upstream_head
    );
    assert!(out.contains("re-created"), "{out}");

    // The live workspace reads base content it had not read yet, and saves again.
    let m = keep.clone();
    let (cold, more) = io("reads after the re-clone", move || {
        fs::write(m.join("more.txt"), b"after\n").unwrap();
        (
            fs::read(m.join("cold/c2.bin")),
            fs::read(m.join("work.txt")),
        )
    });
    assert_eq!(cold.expect("cold/c2.bin"), pseudo_random(64 * 1024, 14));
    assert_eq!(more.expect("work.txt"), b"before\n");
    let snap = d.cli_ok(["snapshot", "keep"]);
    let snap = snap.trim();
    let tree = mirror_git(&mirror, &["ls-tree", "--name-only", snap]).stdout_str();
    assert!(
        tree.contains("work.txt") && tree.contains("more.txt"),
        "{tree}"
    );
    d.cli_ok(["release", "keep"]);
    let m = PathBuf::from(d.cli_ok(["open", "keep", "--project", PROJECT]).trim());
    let back = io("resume after the re-clone", move || {
        (fs::read(m.join("work.txt")), fs::read(m.join("more.txt")))
    });
    assert_eq!(back.0.expect("work.txt"), b"before\n");
    assert_eq!(back.1.expect("more.txt"), b"after\n");

    // Discarding needs no mirror at all.
    fs::remove_dir_all(&mirror).unwrap();
    let m = drop_mount.clone();
    io("unsaved work", move || {
        fs::write(m.join("scratch.txt"), b"thrown away\n").unwrap();
    });
    d.cli_ok(["release", "drop", "--discard"]);
    assert!(!mounts_under(&d.root).contains(&drop_mount));
    assert!(!d.state.join("workspaces").join("drop").exists());
    d.cli_ok(["mirror", "sync", PROJECT]);

    // A mirror that is there but broken (its objects gone) is cloned again too; the broken one is
    // kept aside, never deleted.
    fs::remove_dir_all(mirror.join(".git/objects")).unwrap();
    let out = d.cli_ok(["mirror", "sync", PROJECT]);
    assert!(out.contains("re-created"), "{out}");
    assert_eq!(
        mirror_git(&mirror, &["rev-parse", "HEAD^{commit}"])
            .stdout_str()
            .trim(),
        upstream_head
    );
    let aside: Vec<_> = fs::read_dir(d.state.join("mirrors"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".broken-proj-"))
        .collect();
    assert_eq!(aside.len(), 1, "the broken mirror kept aside");
    d.stop();
}

/// The blob cache emptied under a live daemon (its `tmp/` with it) used to make every base file
/// that was not open ENOENT. Now a vanished cache file is written again on the next open.
#[test]
fn an_emptied_blob_cache_is_filled_again() {
    let fx = fixture();
    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", PROJECT, &fx.repo.file_url()]);
    d.cli_ok(["open", "cache", "--project", PROJECT]);
    let mount = d.mount("cache");
    let m = mount.clone();
    let first = io("first reads", move || {
        fs::read(m.join("data/blob.bin")).unwrap()
    });
    assert_eq!(first, pseudo_random(256 * 1024, 11));
    let blobs = d.state.join("blobs");
    for e in fs::read_dir(&blobs).unwrap().flatten() {
        fs::remove_dir_all(e.path()).unwrap();
    }
    let m = mount.clone();
    let (again, cold) = io("reads after the cache was emptied", move || {
        (
            fs::read(m.join("data/blob.bin")),
            fs::read(m.join("cold/c1.bin")),
        )
    });
    assert_eq!(
        again.expect("data/blob.bin after the cache was emptied"),
        pseudo_random(256 * 1024, 11)
    );
    assert_eq!(
        cold.expect("cold/c1.bin after the cache was emptied"),
        pseudo_random(64 * 1024, 13)
    );
    d.stop();
}
