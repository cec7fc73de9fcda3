//! Directory listings on a real mount: with no-opendir the kernel lists directories without an
//! OPENDIR or RELEASEDIR request, and a listing of a large directory that other threads change
//! meanwhile (creates and unlinks through the same mount) lists every name present throughout
//! exactly once, which needs readdir offsets that do not depend on the names before them.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::op_count as count;
use common::*;
use serde_json::Value;

/// Files in the large directory: a listing of it takes many READDIRPLUS requests.
const BIG: usize = 3000;

fn stats(d: &Daemon) -> Value {
    parse_json("stats --json", &d.cli_ok(["stats", "--json", "t"]))
}

fn project(d: &Daemon) {
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..BIG {
        repo.write(&format!("big/f{i:05}"), "x\n");
    }
    for i in 0..5 {
        for j in 0..5 {
            repo.write(&format!("tree/d{i}/e{j}/file"), "y\n");
        }
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    d.cli_ok(["open", "t", "--project", "p"]);
}

#[test]
fn ls_r_sends_no_opendir_or_releasedir() {
    let d = Daemon::start();
    project(&d);
    let mnt = d.mount("t");
    // The first directory open of the mount asks once and is told ENOSYS; never again after.
    run(Command::new("ls").arg(&mnt), CMD_TIMEOUT).assert_ok();
    let s0 = stats(&d);
    assert!(count(&s0, "OPENDIR") <= 1, "{s0}");
    let out = run(
        Command::new("ls").arg("-R").arg(mnt.join("tree")),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let text = out.stdout_str();
    assert_eq!(text.matches("file").count(), 25, "{text}");
    // Again, from the kernel's cache.
    run(
        Command::new("ls").arg("-R").arg(mnt.join("tree")),
        CMD_TIMEOUT,
    )
    .assert_ok();
    let s1 = stats(&d);
    assert!(
        count(&s1, "READDIRPLUS") + count(&s1, "READDIR")
            > count(&s0, "READDIRPLUS") + count(&s0, "READDIR"),
        "the listing reached the daemon: {s1}"
    );
    assert_eq!(count(&s1, "OPENDIR"), count(&s0, "OPENDIR"), "{s1}");
    assert_eq!(count(&s1, "RELEASEDIR"), 0, "{s1}");
}

fn listing(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn a_listing_during_creates_and_unlinks_misses_and_repeats_nothing() {
    let d = Daemon::start();
    project(&d);
    let dir = d.mount("t").join("big");
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = dir.join(format!("tmp{i}"));
                std::fs::write(&p, b"t").expect("create");
                if i >= 4 {
                    std::fs::remove_file(dir.join(format!("tmp{}", i - 4))).expect("unlink");
                }
                i += 1;
            }
            i
        })
    };
    let result = with_timeout("listings", std::time::Duration::from_secs(120), {
        let dir = dir.clone();
        move || {
            let mut bad = Vec::new();
            for round in 0..8 {
                let mut seen: HashMap<String, usize> = HashMap::new();
                for name in listing(&dir) {
                    *seen.entry(name).or_default() += 1;
                }
                for i in 0..BIG {
                    let name = format!("f{i:05}");
                    let n = seen.get(&name).copied().unwrap_or(0);
                    if n != 1 {
                        bad.push(format!("round {round}: {name} listed {n} times"));
                    }
                }
                if let Some((name, n)) = seen.iter().find(|(_, n)| **n > 1) {
                    bad.push(format!("round {round}: {name} listed {n} times"));
                }
            }
            bad
        }
    });
    stop.store(true, Ordering::Relaxed);
    let changes = churn.join().expect("churn thread");
    assert!(
        changes > 8,
        "the directory changed during the listings ({changes})"
    );
    assert!(result.is_empty(), "{:?}", &result[..result.len().min(10)]);
    // Settled: the listing is the directory.
    let now = listing(&dir);
    assert_eq!(now.iter().filter(|n| n.starts_with('f')).count(), BIG);
    assert_eq!(now.iter().filter(|n| n.starts_with("tmp")).count(), 4);
}
