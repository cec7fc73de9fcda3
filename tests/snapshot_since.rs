//! Snapshots read again only the files written since the last one (blob ids remembered by each
//! data file's stamp): across random same-size rewrites whose modification time is put back (so
//! only the change time tells), rewrites right after a snapshot returns (in the tick its clock
//! read), and a daemon restart (which forgets what was remembered), every snapshot holds exactly
//! what the files hold.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::*;

const N: u64 = 12;

fn show(mirror: &std::path::Path, commit: &str, path: &str) -> Vec<u8> {
    let out = run(
        Command::new("git").arg("-C").arg(mirror).args([
            "cat-file",
            "blob",
            &format!("{commit}:{path}"),
        ]),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    out.stdout.clone()
}

/// Rewrites `f{i}.txt` with `text` (always the same size) and puts its modification time back.
fn rewrite(ws: &std::path::Path, i: u64, text: &str) {
    let p = ws.join(format!("f{i}.txt"));
    let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
    std::fs::write(&p, text).unwrap();
    let f = std::fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(mtime).unwrap();
}

#[test]
fn every_snapshot_holds_what_the_files_hold() {
    let mut d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..N {
        repo.write(&format!("f{i}.txt"), format!("base {i:03}\n"));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    let ws = d.open_thread("t", &["--project", "p"]);
    let mirror = d.mirror("p");
    let check = |d: &Daemon, what: &str| -> String {
        let s = d.snapshot_id("t");
        for i in 0..N {
            let path = format!("f{i}.txt");
            assert_eq!(
                String::from_utf8_lossy(&show(&mirror, &s, &path)),
                std::fs::read_to_string(ws.join(&path)).unwrap(),
                "{what}: {path} in snapshot {s}"
            );
        }
        s
    };
    let mut rng = Rng::new(0x5eed);
    for round in 0..10u64 {
        for _ in 0..=rng.below(4) {
            let i = rng.below(N);
            rewrite(&ws, i, &format!("r{round:02} {i:03}\n"));
        }
        check(&d, &format!("round {round}"));
        // Right after the snapshot returned: in the tick its clock read, or the next.
        let i = rng.below(N);
        rewrite(&ws, i, &format!("s{round:02} {i:03}\n"));
        check(&d, &format!("round {round}, rewritten right after"));
    }
    // A restart forgets what was remembered: the full read finds the same tree (same commit).
    let before = check(&d, "before the restart");
    d.stop();
    d.spawn();
    wait_mounted(std::slice::from_ref(&ws), Duration::from_secs(20));
    assert_eq!(check(&d, "after the restart"), before);
    rewrite(&ws, 0, "after 000\n");
    check(&d, "a rewrite after the restart");
}
