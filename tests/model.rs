//! The reference-model test of the filesystem core (no kernel).
//!
//! Generated sequences of operations drive a [`WorkspaceFs`] over a real git base and, side by side,
//! a plain in-memory model of a POSIX tree. For every operation the model predicts success or the
//! exact errno and the core must agree. After every step the whole tree is walked through the core
//! only (`lookup` from the root, `readdir`, `getattr`, `open` + read, `readlink`, xattrs) and compared
//! with the model: names, kinds, permission bits, owners, sizes, bytes, symlink targets, xattrs, link
//! counts, which entries are one inode (hardlinks) and that an inode number never changes (rename,
//! copy-up, reload) nor moves to another file. Files held open (also across unlink) are read through
//! their handles; a file is materialized on write intent only; the upper layer holds exactly the
//! data files of materialized files that are linked or still held. A reload is either clean
//! (`close`) or unclean (drop, as SIGKILL would): the catalog must already hold everything
//! acknowledged.
//!
//! What the rest of octofs reads from the core is checked after every step too: `changes()` against
//! the model's diff from the base; `view()` (the snapshot's edits) applied to the base tree must give
//! the working state as git sees it; the fsmonitor journal must name every path that changed since
//! the token taken before the step; `changed_since` must not say "unchanged" when the state changed.
//!
//! The test plays the kernel: every successful lookup/create/mknod/mkdir/symlink/link (and each
//! readdirplus entry) adds one reference, and after each step most references are forgotten again
//! (exercising node reaping), never a directory's while something below it is still referenced (a
//! dentry pins its parent).
//!
//! Errnos follow Linux (the VFS's checks first, then what the daemon answers; pjdfstest measures the
//! mount against ext4). Some of those checks never reach a daemon behind a kernel (a parent that is
//! not a directory, a directory moved into itself), but the core is a library callable without one
//! and is held to the same answers. Operations a kernel never sends (opening a fifo, user.* xattrs
//! on a symlink, chmod of a symlink) are not generated.
//!
//! Knobs: `OCTOFS_MODEL_CASES` (default 200), `OCTOFS_MODEL_STEPS` (default 60), `OCTOFS_MODEL_SEED`
//! (run one seed only), `OCTOFS_MODEL_THREADS` (default: up to 4), `OCTOFS_MODEL_NO_SHRINK`,
//! `OCTOFS_MODEL_TMP` (where upper layers go; tmpfs by default). A failure names the seed and the
//! step and prints a shrunk sequence of operations that still fails. A passing run prints (see
//! `--nocapture`) how often each operation ended in each way.
//!
//! The model, the generator, the checks and the shrinker live in `tests/support/` (shared with the
//! fault tests, which hold mounts to the same model); this file only runs the cases.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

// Each test driver uses part of the shared support.
use crate::support;

use support::base::Base;
use support::checker::OUTCOMES;
use support::shrinker::{Failure, panic_message, report, run_generated};

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        }
        Err(_) => default,
    }
}

#[test]
fn the_core_behaves_like_the_model() {
    let started = Instant::now();
    let base = Base::new();
    let cases = env_num("OCTOFS_MODEL_CASES", 200);
    let steps = env_num("OCTOFS_MODEL_STEPS", 60) as usize;
    let seeds: Vec<u64> = match std::env::var("OCTOFS_MODEL_SEED") {
        Ok(_) => vec![env_num("OCTOFS_MODEL_SEED", 0)],
        Err(_) => (0..cases).map(|i| 0x0c70_f500_0000 + i).collect(),
    };
    let threads = env_num(
        "OCTOFS_MODEL_THREADS",
        std::thread::available_parallelism().map_or(2, |n| n.get().min(4)) as u64,
    )
    .max(1) as usize;
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { break };
                    let mut log = Vec::new();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_generated(&base, seed, steps, &mut log)
                    }));
                    if let Err(p) = r {
                        stop.store(true, Ordering::Relaxed);
                        failures.lock().unwrap().push(Failure {
                            seed,
                            steps: log,
                            message: panic_message(&*p),
                        });
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.seed);
    if let Some(f) = failures.into_iter().next() {
        panic!("{}", report(&base, f));
    }
    let outcomes = OUTCOMES.lock().unwrap_or_else(|p| p.into_inner());
    let mut by_op: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ((op, end), n) in outcomes.iter() {
        by_op.entry(op).or_default().push(format!("{end} {n}"));
    }
    for (op, ends) in by_op {
        eprintln!("  {op}: {}", ends.join(", "));
    }
    eprintln!(
        "model test: {} sequences of {steps} steps in {:.1?}",
        seeds.len(),
        started.elapsed()
    );
}
