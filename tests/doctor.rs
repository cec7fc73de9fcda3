//! `octofs doctor` finds each fault injected here, says what it is in one line, exits non-zero
//! while any is unresolved, and `--fix` repairs what is safe without losing anything a user wrote:
//! a stale mount after the daemon was SIGKILLed, a hung daemon and its mounts (bounded time), an
//! upper layer without a record (moved to quarantine with its files, never deleted), a blob-cache
//! file whose content is not its id, a torn shared index, a leftover temporary index, and a
//! mirror whose HEAD was moved by hand (reported with the command to run; doctor never writes a
//! mirror).

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

const DATE: &str = "2026-01-01T00:00:00Z";

fn project(path: &Path) -> GitRepo {
    let repo = GitRepo::init(path);
    repo.write("README.md", "doctor\n");
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.commit_all("initial", DATE);
    repo
}

/// `octofs doctor --json [--fix]`: (exit success, report).
fn doctor(d: &Daemon, fix: bool) -> (bool, Value) {
    let mut args = vec!["doctor", "--json"];
    if fix {
        args.push("--fix");
    }
    let out = d.cli(args);
    let v: Value = serde_json::from_str(out.stdout_str().trim())
        .unwrap_or_else(|e| panic!("doctor's JSON: {e}: {}", out.describe()));
    if !out.success() {
        let line = out.stderr_str();
        assert_eq!(line.trim().lines().count(), 1, "{}", out.describe());
    }
    (out.success(), v)
}

fn kinds(v: &Value) -> Vec<(String, bool)> {
    let mut k: Vec<(String, bool)> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap_or("").to_string(),
                f["fixed"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    k.sort();
    k
}

#[test]
fn a_healthy_host_has_no_findings_and_a_killed_daemon_leaves_a_stale_mount_to_fix() {
    let src = tempfile::tempdir().unwrap();
    let repo = project(&src.path().join("repo"));
    // Without the connection keeper: a killed daemon's mount dies with it (with one, the next
    // daemon adopts it: restart_idle.rs).
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--keep-connections", "false"]);
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mnt = d.open_thread("t1", &["--project", "proj"]);
    fs::write(mnt.join("mine.txt"), "written before the crash\n").unwrap();
    assert_eq!(
        fs::read_to_string(mnt.join("README.md")).unwrap(),
        "doctor\n"
    );

    let (ok, v) = doctor(&d, false);
    assert!(ok, "{v}");
    assert_eq!(v["daemon"], "running");
    assert_eq!(kinds(&v), vec![], "{v}");
    assert_eq!(v["checked"]["mounts"], 1, "{v}");
    // A host note is printed, never counted: the idle CPUs of a virtual machine that halt at once
    // (haltpoll without guest halt polling) are named exactly where sysfs says so.
    let sys = |p: &str| fs::read_to_string(p).map(|s| s.trim().to_string()).ok();
    let halts = sys("/sys/devices/system/cpu/cpuidle/current_driver").as_deref()
        == Some("haltpoll")
        && sys("/sys/module/haltpoll/parameters/guest_halt_poll_ns").as_deref() == Some("0");
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .filter_map(|n| n["kind"].as_str())
        .collect();
    assert_eq!(
        notes,
        if halts { vec!["idle-exits"] } else { vec![] },
        "{v}"
    );
    assert!(v["checked"]["blobs"].as_u64().unwrap() >= 1, "{v}");

    d.kill9();
    let (ok, v) = doctor(&d, false);
    assert!(!ok);
    assert_eq!(v["daemon"], "not running");
    assert_eq!(kinds(&v), vec![("stale-mount".to_string(), false)], "{v}");
    // Why the mount was not kept for the next daemon, in its line.
    let detail = v["findings"][0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("no connection keeper held it") && detail.contains("--keep-connections"),
        "{v}"
    );
    assert!(mounts_under(&d.root).contains(&mnt));

    let (ok, v) = doctor(&d, true);
    assert!(ok, "{v}");
    assert_eq!(kinds(&v), vec![("stale-mount".to_string(), true)], "{v}");
    assert!(!mounts_under(&d.root).contains(&mnt), "still mounted");
    // Nothing was lost: the daemon remounts the workspace with the file written before the kill.
    d.spawn();
    let mnt = d.open_thread("t1", &["--project", "proj"]);
    assert_eq!(
        fs::read_to_string(mnt.join("mine.txt")).unwrap(),
        "written before the crash\n"
    );
    let (ok, v) = doctor(&d, false);
    assert!(ok, "{v}");
}

#[test]
fn a_stopped_daemon_and_its_mounts_are_reported_in_bounded_time() {
    let src = tempfile::tempdir().unwrap();
    let repo = project(&src.path().join("repo"));
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    d.open_thread("t1", &["--project", "proj"]);
    let pid = d.pid().expect("pid") as i32;
    // SIGSTOP: the socket accepts, nothing answers, the mount's requests wait.
    assert_eq!(unsafe_free_kill(pid, "STOP"), 0);
    let started = Instant::now();
    let (ok, v) = doctor(&d, false);
    let took = started.elapsed();
    assert_eq!(unsafe_free_kill(pid, "CONT"), 0);
    assert!(!ok);
    assert_eq!(v["daemon"], "not answering", "{v}");
    assert_eq!(
        kinds(&v),
        vec![
            ("daemon-unresponsive".to_string(), false),
            ("hung-mount".to_string(), false)
        ],
        "{v}"
    );
    assert!(took < Duration::from_secs(20), "doctor took {took:?}");
    // Running again, the daemon answers and nothing is left.
    let started = Instant::now();
    loop {
        let (ok, v) = doctor(&d, false);
        if ok {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `kill -SIG pid` through the `kill` program (the test crate has no unsafe code).
fn unsafe_free_kill(pid: i32, sig: &str) -> i32 {
    let out = sh("kill", [format!("-{sig}"), pid.to_string()]);
    if out.success() { 0 } else { 1 }
}

#[test]
fn state_faults_are_found_and_fixed_without_losing_files() {
    let src = tempfile::tempdir().unwrap();
    let repo = project(&src.path().join("repo"));
    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    let mnt = d.open_thread("t1", &["--project", "proj"]);
    assert_eq!(
        fs::read_to_string(mnt.join("README.md")).unwrap(),
        "doctor\n"
    );
    d.stop();

    // An upper layer without a record, holding a user's file.
    let ghost = d.state.join("workspaces/ghost");
    fs::create_dir_all(ghost.join("upper/data")).unwrap();
    fs::write(ghost.join("upper/data/precious"), "keep me\n").unwrap();
    // A blob-cache file whose content is not its id (same size: the cache's own check misses it).
    let blob = fs::read_dir(d.state.join("blobs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().len() == 2)
        .flat_map(|e| fs::read_dir(e.path()).unwrap().flatten())
        .map(|e| e.path())
        .find(|p| fs::read(p).map(|b| b == b"doctor\n").unwrap_or(false))
        .expect("README's blob in the cache");
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&blob, "DOCTOR\n").unwrap();
    // A torn shared index and a leftover temporary one.
    let indexes = d.state.join("indexes");
    let index = fs::read_dir(&indexes)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_file() && !p.file_name().unwrap().to_string_lossy().starts_with('.'))
        .expect("a shared index");
    let mut bytes = fs::read(&index).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::set_permissions(&index, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&index, &bytes).unwrap();
    fs::write(indexes.join(".tmp-leftover"), "half").unwrap();
    // A mirror whose HEAD was moved by hand.
    git(&d.mirror("proj"), ["checkout", "-q", "--detach"]);

    let (ok, v) = doctor(&d, false);
    assert!(!ok);
    let found: Vec<String> = kinds(&v).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        found,
        vec![
            "corrupt-blob",
            "corrupt-index",
            "index-leftover",
            "mirror-changed",
            "orphaned-workspace"
        ],
        "{v}"
    );
    // Reporting changed nothing.
    assert!(ghost.join("upper/data/precious").exists());
    assert!(blob.exists() && index.exists());

    let (ok, v) = doctor(&d, true);
    assert!(!ok, "the mirror is left to the operator: {v}");
    assert_eq!(
        kinds(&v),
        vec![
            ("corrupt-blob".to_string(), true),
            ("corrupt-index".to_string(), true),
            ("index-leftover".to_string(), true),
            ("mirror-changed".to_string(), false),
            ("orphaned-workspace".to_string(), true)
        ],
        "{v}"
    );
    assert!(!ghost.exists() && !blob.exists() && !index.exists());
    let kept: Vec<_> = fs::read_dir(d.state.join("quarantine"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        fs::read_to_string(kept[0].join("upper/data/precious")).unwrap(),
        "keep me\n"
    );

    // What doctor says to run puts the mirror back; then nothing is left, and the workspace
    // reads its file again (the blob is filled again from the mirror).
    let branch = git(
        &d.mirror("proj"),
        ["for-each-ref", "--format=%(refname:short)", "refs/heads"],
    );
    git(&d.mirror("proj"), ["checkout", "-q", branch.trim()]);
    let (ok, v) = doctor(&d, false);
    assert!(ok, "{v}");
    d.spawn();
    let mnt = d.open_thread("t1", &["--project", "proj"]);
    assert_eq!(
        fs::read_to_string(mnt.join("README.md")).unwrap(),
        "doctor\n"
    );
}
