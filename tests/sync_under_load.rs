//! Mirror sync under live workspaces (docs/invariants.md 2: the lower layer is a commit): five
//! mounted workspaces of one project, each with a writer creating, appending, renaming and
//! deleting files and running `git status` (and, in three of them, `git commit`) every few
//! rounds, while three `mirror sync`s bring new upstream commits.
//!
//! No writer sees an error; afterwards each workspace's files and HEAD are exactly what its
//! writer recorded; a new `open` sees the new tip; `resync --role developer` moves a clean
//! workspace to it and refuses a dirty one. A sync that changed a live workspace's files, or a
//! mount that failed a request during a sync, fails here.

use crate::common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const WORKSPACES: usize = 5;
/// Writers 0..COMMITTERS commit; the others only run `git status`.
const COMMITTERS: usize = 3;
const SYNCS: usize = 3;

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE2).args(args), CMD_TIMEOUT);
    assert!(
        out.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        out.describe()
    );
    out.stdout_str().trim().to_string()
}

/// What a writer made: its files (path under the workspace -> content) and its last commit.
#[derive(Debug, Default)]
struct Record {
    files: BTreeMap<String, String>,
    head: Option<String>,
    rounds: usize,
}

/// One writer's loop in workspace `ws`, under `w<i>/`, until `stop` (and at least 12 rounds).
/// Every error is returned, never swallowed.
fn writer(i: usize, ws: PathBuf, stop: Arc<AtomicBool>) -> Result<Record, String> {
    let mut rec = Record::default();
    let dir = format!("w{i}");
    let p = |rel: &str| ws.join(rel);
    let io = |what: String| move |e: std::io::Error| format!("writer {i}: {what}: {e}");
    fs::create_dir_all(p(&dir)).map_err(io(format!("mkdir {dir}")))?;
    let mut round = 0usize;
    while !stop.load(Ordering::Relaxed) || round < 12 {
        // Create.
        let name = format!("{dir}/f{round}.txt");
        let body = format!("round {round} of writer {i}\n");
        fs::write(p(&name), &body).map_err(io(format!("create {name}")))?;
        rec.files.insert(name.clone(), body);
        // Append to the first file.
        let first = format!("{dir}/f0.txt");
        let line = format!("appended in round {round}\n");
        fs::OpenOptions::new()
            .append(true)
            .open(p(&first))
            .and_then(|mut f| f.write_all(line.as_bytes()))
            .map_err(io(format!("append {first}")))?;
        rec.files.get_mut(&first).expect("f0").push_str(&line);
        // Rename the file of two rounds ago.
        if round >= 2 {
            let from = format!("{dir}/f{}.txt", round - 2);
            let to = format!("{dir}/r{}.txt", round - 2);
            if round - 2 != 0 {
                fs::rename(p(&from), p(&to)).map_err(io(format!("rename {from}")))?;
                let v = rec.files.remove(&from).expect("renamed file recorded");
                rec.files.insert(to, v);
            }
        }
        // Delete a renamed file now and then.
        if round >= 5 && round.is_multiple_of(3) {
            let gone = format!("{dir}/r{}.txt", round - 5);
            if rec.files.remove(&gone).is_some() {
                fs::remove_file(p(&gone)).map_err(io(format!("delete {gone}")))?;
            }
        }
        if round % 3 == 2 {
            let out = run(
                git_command(&ws, DATE2).args(["status", "--porcelain"]),
                CMD_TIMEOUT,
            );
            if !out.success() {
                return Err(format!("writer {i}: git status: {}", out.describe()));
            }
        }
        if i < COMMITTERS && round % 5 == 4 {
            for args in [vec!["add", "-A"], vec!["commit", "-q", "-m", "round"]] {
                let out = run(git_command(&ws, DATE2).args(&args), CMD_TIMEOUT);
                if !out.success() {
                    return Err(format!("writer {i}: git {args:?}: {}", out.describe()));
                }
            }
            let out = run(
                git_command(&ws, DATE2).args(["rev-parse", "HEAD"]),
                CMD_TIMEOUT,
            );
            if !out.success() {
                return Err(format!("writer {i}: rev-parse: {}", out.describe()));
            }
            rec.head = Some(out.stdout_str().trim().to_string());
        }
        round += 1;
    }
    rec.rounds = round;
    Ok(rec)
}

/// The files under `dir` of `ws` (path relative to `ws` -> content).
fn files_under(ws: &Path, dir: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(ws.join(dir)).expect("read_dir").flatten() {
        let rel = format!("{dir}/{}", e.file_name().to_string_lossy());
        out.insert(rel, fs::read_to_string(e.path()).expect("read"));
    }
    out
}

#[test]
fn mirror_syncs_under_five_writers() {
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    for k in 0..200 {
        up.write(
            &format!("src/m{}/file{k}.txt", k % 10),
            format!("base {k}\n"),
        );
    }
    let base = up.commit_all("base", DATE1);
    d.cli_ok(["mirror", "add", "proj", &up.path.to_string_lossy()]);
    let mounts: Vec<PathBuf> = (0..WORKSPACES)
        .map(|i| d.open_thread(&format!("load{i}"), &["--project", "proj"]))
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = mounts
        .iter()
        .enumerate()
        .map(|(i, ws)| {
            let (ws, stop) = (ws.clone(), stop.clone());
            std::thread::spawn(move || writer(i, ws, stop))
        })
        .collect();

    let mut tips = Vec::new();
    for s in 0..SYNCS {
        std::thread::sleep(Duration::from_millis(300));
        for k in 0..20 {
            up.write(
                &format!("src/m{}/file{}.txt", k % 10, s * 20 + k),
                format!("sync {s} changed {k}\n"),
            );
        }
        up.write(&format!("added/s{s}.txt"), format!("added in sync {s}\n"));
        tips.push(up.commit_all(&format!("upstream {s}"), DATE2));
        let out = d.cli_ok_within(["mirror", "sync", "proj"], Duration::from_secs(60));
        assert!(!out.trim().is_empty(), "mirror sync printed nothing");
        // Between syncs, every live workspace still presents its base.
        for ws in &mounts {
            assert_eq!(
                fs::read_to_string(ws.join("src/m0/file0.txt")).unwrap(),
                "base 0\n",
                "a mirror sync changed a live workspace's file"
            );
            assert!(!ws.join(format!("added/s{s}.txt")).exists());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let records: Vec<Record> = handles
        .into_iter()
        .map(|h| {
            with_timeout("a writer to finish", Duration::from_secs(120), move || {
                h.join().expect("writer panicked")
            })
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    let tip = tips.last().expect("a tip").clone();
    println!(
        "writers' rounds during {SYNCS} syncs: {:?}",
        records.iter().map(|r| r.rounds).collect::<Vec<_>>()
    );

    // Each workspace is exactly what its writer made.
    for (i, (ws, rec)) in mounts.iter().zip(&records).enumerate() {
        assert!(rec.rounds >= 12, "writer {i} ran {} rounds", rec.rounds);
        assert_eq!(
            files_under(ws, &format!("w{i}")),
            rec.files,
            "workspace {i}'s files"
        );
        let head = g(ws, &["rev-parse", "HEAD"]);
        match &rec.head {
            Some(h) => {
                assert_eq!(&head, h, "workspace {i}'s HEAD");
                assert_eq!(g(ws, &["rev-parse", "HEAD~1"]).len(), 40);
            }
            None => assert_eq!(head, base, "workspace {i}'s HEAD moved"),
        }
        assert_eq!(
            fs::read_to_string(ws.join("src/m0/file0.txt")).unwrap(),
            "base 0\n"
        );
    }

    // A new open sees the new tip.
    let fresh = d.open_thread("fresh", &["--project", "proj"]);
    assert_eq!(g(&fresh, &["rev-parse", "HEAD"]), tip);
    assert_eq!(
        fs::read_to_string(fresh.join("added/s2.txt")).unwrap(),
        "added in sync 2\n"
    );

    // resync --role developer: a clean one moves (writer 3 clears its files), a dirty one
    // (writer 4 left its untracked files) and a diverged one (writer 0 committed) refuse.
    let clean = &mounts[COMMITTERS];
    fs::remove_dir_all(clean.join(format!("w{COMMITTERS}"))).unwrap();
    let out = d.cli([
        "resync",
        &format!("load{COMMITTERS}"),
        "--role",
        "developer",
        "--json",
    ]);
    assert!(out.success(), "{}", out.describe());
    let v = parse_json("resync", out.stdout_str().trim());
    assert_eq!(v["action"], "fast-forward", "{v}");
    assert_eq!(g(clean, &["rev-parse", "HEAD"]), tip);
    assert_eq!(
        fs::read_to_string(clean.join("added/s2.txt")).unwrap(),
        "added in sync 2\n"
    );
    assert_eq!(g(clean, &["status", "--porcelain"]), "");

    let dirty = &mounts[COMMITTERS + 1];
    let before = files_under(dirty, &format!("w{}", COMMITTERS + 1));
    let out = d.cli([
        "resync",
        &format!("load{}", COMMITTERS + 1),
        "--role",
        "developer",
    ]);
    out.assert_failed();
    assert!(out.stderr_str().contains("dirty:"), "{}", out.describe());
    assert_eq!(g(dirty, &["rev-parse", "HEAD"]), base);
    assert_eq!(files_under(dirty, &format!("w{}", COMMITTERS + 1)), before);

    let out = d.cli(["resync", "load0", "--role", "developer"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("dirty:") || out.stderr_str().contains("diverged"),
        "{}",
        out.describe()
    );

    for i in 0..WORKSPACES {
        d.cli_ok(["release", &format!("load{i}"), "--force"]);
    }
    d.cli_ok(["release", "fresh"]);
}
