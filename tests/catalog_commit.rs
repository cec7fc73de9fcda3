//! Timing of catalog commits (run on demand: `cargo test --release --test catalog_commit -- --ignored
//! --nocapture`): one `write(2)` per batch under the workspace lock (`Catalog::append`, what every
//! request does today) against group commit (`Catalog::append_applied` under the lock, the write
//! after it), with 1 and 4 committing threads; and `fsync` of an unchanged log, which no longer costs
//! an `fdatasync`. Prints µs per commit and the `write`/`fdatasync` calls made.
//!
//! The non-ignored test checks what the timing relies on: group-committed batches replay, in order,
//! after the catalog is dropped without a clean close (as after SIGKILL).

use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

use octofs::cow::catalog::{Catalog, InodeRecord, Kind, Record, Ts};

/// A batch like the one a create commits: the inode, its directory entry, the counters.
fn create_batch(ino: u64) -> Vec<Record> {
    let name = format!("file-{ino}.txt").into_bytes();
    vec![
        Record::NextIno { next: ino + 1 },
        Record::Inode(InodeRecord {
            ino,
            kind: Kind::File,
            base: None,
            upper: true,
            target: None,
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            rdev: 0,
            atime: Ts(1_700_000_000, 1),
            mtime: Ts(1_700_000_000, 1),
            ctime: Ts(1_700_000_000, 1),
            nlink: 1,
            parent: 1,
            name: name.clone(),
            xattrs: Default::default(),
            copied_ctime: None,
            shared: None,
        }),
        Record::Entry {
            dir: 1,
            name,
            ino: Some(ino),
        },
        Record::Generation { n: ino },
    ]
}

/// `threads` committers of `per` batches each through one lock; `grouped`: append_applied under the
/// lock and wait after it, else append under the lock. Returns (µs per commit, writes).
fn run(threads: u64, per: u64, grouped: bool) -> (f64, u64) {
    let d = tempfile::tempdir().expect("tempdir");
    let (c, _, _) = Catalog::open(d.path()).expect("open");
    let c = Arc::new(Mutex::new(c));
    let start = Arc::new(Barrier::new(threads as usize + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (c, start) = (c.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..per {
                    let batch = create_batch(2 + t * per + i);
                    if grouped {
                        let pending = c.lock().expect("lock").append_applied(&batch);
                        pending.expect("stage").wait().expect("write");
                    } else {
                        c.lock().expect("lock").append(&batch).expect("append");
                    }
                }
            })
        })
        .collect();
    start.wait();
    let t0 = Instant::now();
    for h in handles {
        h.join().expect("join");
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / (threads * per) as f64;
    let (_, writes, _) = c.lock().expect("lock").log_stats();
    (us, writes)
}

#[test]
#[ignore = "timing; run with --ignored --nocapture"]
fn commit_timing() {
    let per = 20_000;
    // A first round only warms up (page cache, allocator); the second is printed.
    run(1, per, false);
    for threads in [1u64, 4] {
        for grouped in [false, true] {
            let (us, writes) = run(threads, per / threads, grouped);
            println!(
                "{threads} thread(s), {}: {us:.2} µs per commit, {writes} writes for {per} batches",
                if grouped {
                    "group commit (append_applied + wait)"
                } else {
                    "append under the lock"
                }
            );
        }
    }
    // fsync of a file whose change is long committed: the log needs no fdatasync.
    let d = tempfile::tempdir().expect("tempdir");
    let (mut c, _, _) = Catalog::open(d.path()).expect("open");
    c.append(&create_batch(2)).expect("append");
    // The one fdatasync the change needs, before the timing.
    c.sync().expect("sync");
    let n = 2000;
    let t0 = Instant::now();
    for _ in 0..n {
        c.sync().expect("sync");
    }
    let after = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    let f = std::fs::File::open(d.path().join("catalog.log")).expect("log");
    let t0 = Instant::now();
    for _ in 0..n {
        f.sync_data().expect("fdatasync");
    }
    let before = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    let (_, _, syncs) = c.log_stats();
    println!(
        "sync of an unchanged log: {after:.2} µs ({} fdatasync for {n} calls); \
         an fdatasync each time: {before:.2} µs",
        syncs - 1
    );
}

#[test]
fn group_committed_batches_replay_in_order_without_a_clean_close() {
    let d = tempfile::tempdir().expect("tempdir");
    let (c, _, _) = Catalog::open(d.path()).expect("open");
    let c = Arc::new(Mutex::new(c));
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..100 {
                    let ino = 2 + t * 100 + i;
                    let pending = c.lock().expect("lock").append_applied(&create_batch(ino));
                    pending.expect("stage").wait().expect("write");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("join");
    }
    let (_, writes, _) = c.lock().expect("lock").log_stats();
    assert!(writes <= 400, "{writes}");
    drop(c);
    let (_, state, clean) = Catalog::open(d.path()).expect("reopen");
    assert!(!clean);
    assert_eq!(state.inodes.len(), 400);
    assert_eq!(state.dirs[&1].len(), 400);
    assert_eq!(state.next_ino, 402);
}
