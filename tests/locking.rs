//! No request waits for another inode's file I/O (docs/invariants.md 7, `docs/locking.md`): while one
//! process copies up a 1 GiB base file (its blob materialized from the mirror, then copied into the
//! upper layer), `stat` and `readdir` of other paths, `git status` and `octofs list` in the same
//! workspace each complete within a bounded time.
//!
//! On a core that holds the workspace lock across copy-up, every one of them waits for the whole
//! copy (seconds).

use crate::common;

use common::*;
use std::fs::{self, OpenOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;
/// Bound on one `stat` or `readdir` that reaches the daemon (generous for a loaded 2-vCPU machine;
/// the copy it must not wait for takes seconds).
const REQUEST_BOUND: Duration = Duration::from_millis(100);
/// Bound on `git status` and `octofs list` (processes that start, read and exit).
const COMMAND_BOUND: Duration = Duration::from_millis(1500);

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

#[test]
fn requests_never_wait_for_another_files_copy_up() {
    let src = tempfile::tempdir().unwrap();
    let repo = GitRepo::init(&src.path().join("repo"));
    for i in 0..200 {
        repo.write(&format!("dirs/d{i:03}/f.txt"), format!("{i}\n"));
    }
    repo.write("small.txt", "small\n");
    // 1 GiB of zeros: cheap to commit, but the mirror stores it as one big compressed blob that
    // the first copy-up must stream out of git before copying it.
    let big = repo.path.join("big.bin");
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(GIB)
        .unwrap();
    repo.commit_all("initial", DATE1);
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    d.cli_ok(["open", "t", "--project", "proj"]);
    let mount = d.mount("t");
    // Warm what the first git status reads, so its bound measures waiting, not first use.
    git(&mount, ["status", "--porcelain"]);

    let copying = Arc::new(AtomicBool::new(true));
    let copy_time = Arc::new(Mutex::new(None));
    let copier = {
        let (path, copying, copy_time) =
            (mount.join("big.bin"), copying.clone(), copy_time.clone());
        std::thread::spawn(move || {
            let (r, took) = timed(|| OpenOptions::new().read(true).write(true).open(&path));
            copying.store(false, Ordering::SeqCst);
            *copy_time.lock().unwrap() = Some(took);
            r.map(drop)
        })
    };
    // Let the copy-up start.
    std::thread::sleep(Duration::from_millis(200));
    let mut worst: Vec<(String, Duration)> = Vec::new();
    let mut samples = 0;
    let mut i = 0;
    while copying.load(Ordering::SeqCst) && i < 200 {
        // Names never asked before, so the kernel cannot answer from its cache.
        let (_, took) = timed(|| fs::symlink_metadata(mount.join(format!("missing-{i}"))));
        worst.push((format!("stat missing-{i}"), took));
        let dir = mount.join(format!("dirs/d{i:03}"));
        let (n, took) = timed(|| fs::read_dir(&dir).map(|r| r.count()));
        assert_eq!(n.unwrap(), 1, "readdir {}", dir.display());
        worst.push((format!("readdir d{i:03}"), took));
        if i % 10 == 0 {
            let (out, took) = timed(|| git(&mount, ["status", "--porcelain"]));
            assert!(!out.contains("small.txt"), "status: {out}");
            worst.push(("git status".into(), took));
            let (_, took) = timed(|| d.cli_ok(["list"]));
            worst.push(("octofs list".into(), took));
        }
        samples += 1;
        i += 1;
    }
    let copied = copier.join().expect("copier thread");
    copied.expect("open O_RDWR of the big file");
    let copy = copy_time.lock().unwrap().expect("copy time");
    eprintln!("copy-up of 1 GiB took {copy:?}; {samples} rounds of requests meanwhile");
    assert!(
        samples >= 1,
        "the copy-up ({copy:?}) ended before any request was made: the test measured nothing"
    );
    let mut failures = Vec::new();
    for (what, took) in &worst {
        let bound = if what.starts_with("stat") || what.starts_with("readdir") {
            REQUEST_BOUND
        } else {
            COMMAND_BOUND
        };
        if *took > bound {
            failures.push(format!("{what}: {took:?} (bound {bound:?})"));
        }
    }
    let max = |p: &str| {
        worst
            .iter()
            .filter(|(w, _)| w.starts_with(p))
            .map(|(_, t)| *t)
            .max()
            .unwrap_or_default()
    };
    eprintln!(
        "worst: stat {:?}, readdir {:?}, git status {:?}, octofs list {:?}",
        max("stat"),
        max("readdir"),
        max("git status"),
        max("octofs list")
    );
    assert!(
        failures.is_empty(),
        "requests waited for another file's copy-up:\n{}",
        failures.join("\n")
    );
    // The copy is complete and the file is the workspace's own now.
    assert_eq!(fs::metadata(mount.join("big.bin")).unwrap().len(), GIB);
}
