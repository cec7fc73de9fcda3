//! Issue 10, "a reader must never see wrong content": what the daemon changes in a mounted
//! workspace without a FUSE request (`.git/refs/octomate/saved` after every snapshot) reaches every
//! process in the mount at once, whole, and the accounting of writers never hides a file being
//! written.
//!
//! - [`snapshot_mark_is_seen_at_once_with_passthrough`] /
//!   [`snapshot_mark_is_seen_at_once_without_passthrough`]: the kernel cached "no such file" and
//!   the old listing of `.git/refs` (entry and attribute timeouts are an hour); after `octofs
//!   snapshot` the next read in the mount sees the new id, and the listings show the new names
//!   (the daemon invalidates what it changed behind the kernel, `docs/caching.md`).
//! - [`snapshot_mark_is_never_read_empty`]: a reader loop in the mount during repeated snapshots
//!   never reads the mark empty or partial (it is replaced in one step, never truncated first).
//! - [`read_only_create_does_not_hide_a_writer`]: a handle made by `open(O_RDONLY|O_CREAT)` is not a
//!   writer; closing it must not un-count another process's write-open of the same file, which
//!   git's fsmonitor (and sweep) rely on to see writes made through passthrough.

use crate::common;

use common::*;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn setup(passthrough: bool, thread: &str) -> OneFileWorkspace {
    one_file_workspace(passthrough, thread, "behind the kernel\n")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("read_dir {}: {e}", dir.display()),
    };
    v.sort();
    v
}

fn mark_is_seen_at_once(passthrough: bool) {
    let thread = if passthrough { "seen-pt" } else { "seen-np" };
    let s = setup(passthrough, thread);
    let refs = s.mount.join(".git/refs");
    let dir = refs.join("octomate");
    let mark = dir.join("saved");
    // The kernel learns (and may cache for an hour) that there is no mark and no directory.
    let err = fs::read(&mark).expect_err("no mark before the first snapshot");
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    assert!(!names(&refs).contains(&"octomate".to_string()));
    assert!(fs::metadata(&dir).is_err());

    fs::write(s.mount.join("one.txt"), "one\n").expect("write one");
    let first = s.d.cli_ok(["snapshot", thread]).trim().to_string();
    assert_eq!(
        fs::read_to_string(&mark).ok(),
        Some(format!("{first}\n")),
        "the mark right after the first snapshot"
    );
    assert!(
        names(&refs).contains(&"octomate".to_string()),
        "{:?}",
        names(&refs)
    );
    assert_eq!(names(&dir), vec!["saved".to_string()]);
    let size = fs::metadata(&mark).expect("stat the mark").len();
    assert_eq!(size, first.len() as u64 + 1);

    // A mark the kernel has cached (entry, attributes, listing) is replaced.
    fs::write(s.mount.join("two.txt"), "two\n").expect("write two");
    let second = s.d.cli_ok(["snapshot", thread]).trim().to_string();
    assert_ne!(first, second);
    assert_eq!(
        fs::read_to_string(&mark).ok(),
        Some(format!("{second}\n")),
        "the mark right after the second snapshot"
    );
    assert_eq!(names(&dir), vec!["saved".to_string()]);
}

#[test]
fn snapshot_mark_is_seen_at_once_with_passthrough() {
    with_timeout("mark seen (passthrough)", Duration::from_secs(120), || {
        mark_is_seen_at_once(true)
    });
}

#[test]
fn snapshot_mark_is_seen_at_once_without_passthrough() {
    with_timeout(
        "mark seen (no passthrough)",
        Duration::from_secs(120),
        || mark_is_seen_at_once(false),
    );
}

#[test]
fn snapshot_mark_is_never_read_empty() {
    with_timeout("mark never empty", Duration::from_secs(240), || {
        let thread = "never-empty";
        let s = setup(true, thread);
        fs::write(s.mount.join("f.txt"), "0\n").expect("write");
        s.d.cli_ok(["snapshot", thread]);
        let mark = s.mount.join(".git/refs/octomate/saved");
        assert_eq!(fs::read(&mark).expect("mark").len(), 41);
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (stop, reads, mark) = (stop.clone(), reads.clone(), mark.clone());
                std::thread::spawn(move || -> Result<(), String> {
                    while !stop.load(Ordering::Relaxed) {
                        match fs::read(&mark) {
                            Ok(b) if b.len() == 41 && b[40] == b'\n' => {}
                            Ok(b) => return Err(format!("read {:?}", String::from_utf8_lossy(&b))),
                            Err(e) => return Err(format!("read: {e}")),
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        let start = Instant::now();
        let mut rounds = 0;
        while rounds < 40 && start.elapsed() < Duration::from_secs(120) {
            rounds += 1;
            fs::write(s.mount.join("f.txt"), format!("{rounds}\n")).expect("write");
            s.d.cli_ok(["snapshot", thread]);
        }
        stop.store(true, Ordering::Relaxed);
        let mut bad = Vec::new();
        for r in readers {
            if let Err(e) = r.join().expect("reader thread") {
                bad.push(e);
            }
        }
        assert!(
            bad.is_empty(),
            "after {rounds} snapshots and {} reads: {bad:?}",
            reads.load(Ordering::Relaxed)
        );
    });
}

/// The paths git's fsmonitor hook reports changed since `token`, and the new token.
fn fsmonitor(d: &Daemon, thread: &str, token: &str) -> (String, Vec<String>) {
    let out = d.cli(["fsmonitor", thread, "2", token]);
    out.assert_ok();
    let mut parts = out
        .stdout
        .split(|b| *b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned());
    let token = parts.next().unwrap_or_default();
    (token, parts.filter(|p| !p.is_empty()).collect())
}

#[test]
fn read_only_create_does_not_hide_a_writer() {
    with_timeout("read-only create", Duration::from_secs(120), || {
        let thread = "ro-create";
        let s = setup(true, thread);
        let b = s.mount.join("b.txt");
        // O_RDONLY|O_CREAT of a new name: the kernel sends `create`.
        let ro = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CREAT)
            .mode(0o644)
            .open(&b)
            .expect("open(O_RDONLY|O_CREAT)");
        // Another process writes the same file (through passthrough: the daemon sees no write).
        let mut w = OpenOptions::new()
            .write(true)
            .open(&b)
            .expect("open for writing");
        drop(ro);
        let (token, _) = fsmonitor(&s.d, thread, "");
        w.write_all(b"unsaved work\n").expect("write");
        let (_, changed) = fsmonitor(&s.d, thread, &token);
        assert!(
            changed.iter().any(|p| p == "b.txt"),
            "b.txt is open for writing but fsmonitor reports {changed:?}"
        );
        drop(w);
    });
}
