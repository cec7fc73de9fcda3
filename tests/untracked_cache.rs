//! The first `git status` of a fresh fork lists no directory: the workspace's index is a split
//! index whose small part carries an untracked cache of the base (every directory valid, none
//! holding an untracked file, its ident naming the mount) and the fsmonitor token, so git trusts
//! every directory the daemon's journal does not name. Checked against a native clone given the
//! same changes: the cache must never hide an untracked file or show an ignored one.

use crate::common;

use std::fs;
use std::path::Path;

use common::*;

/// `git` in `dir` with an empty global excludes location, so that git's untracked cache depends
/// only on the repository (a user's `~/.config/git/ignore` makes git rebuild the cache once).
fn git_in(dir: &Path, xdg: &Path, trace: Option<&Path>, args: &[&str]) -> Out {
    let mut c = git_command(dir, DATE1);
    c.env("XDG_CONFIG_HOME", xdg).env("HOME", xdg).args(args);
    if let Some(t) = trace {
        // The directory walk's counters are data events nested below git's default depth.
        c.env("GIT_TRACE2_EVENT", t)
            .env("GIT_TRACE2_EVENT_NESTING", "10");
    }
    run(&mut c, CMD_TIMEOUT)
}

/// The sum of git's trace2 `read_directory` counter `key` in the event trace at `trace`.
fn trace_counter(trace: &Path, key: &str) -> Option<u64> {
    let text = fs::read_to_string(trace).ok()?;
    let mut total = None;
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["category"] == "read_directory" && v["key"] == key {
            let n = v["value"]
                .as_str()
                .and_then(|s| s.parse::<u64>().ok())
                .or_else(|| v["value"].as_u64())?;
            total = Some(total.unwrap_or(0) + n);
        }
    }
    total
}

fn status(dir: &Path, xdg: &Path) -> String {
    let out = git_in(dir, xdg, None, &["status", "--porcelain"]);
    out.assert_ok();
    assert!(out.stderr_str().trim().is_empty(), "{}", out.describe());
    let mut lines: Vec<String> = out.stdout_str().lines().map(str::to_string).collect();
    lines.sort();
    lines.join("\n")
}

/// Catches: a cache git rejects (wrong ident or flags: it warns and lists every directory), a
/// shared index that is not split (its size is the whole index), and a cache that claims too much
/// (an untracked file hidden, an ignored one shown, a `.gitignore` change not seen) — against a
/// native clone given the same changes.
#[test]
fn first_status_of_a_fork_lists_no_directory_and_matches_a_clone() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for dir in [
        "src/app",
        "src/lib/deep",
        "docs",
        "tests/unit",
        "vendor/x/y/z",
    ] {
        for f in ["a.txt", "b.rs"] {
            repo.write(&format!("{dir}/{f}"), format!("{dir}/{f}\n"));
        }
    }
    repo.write("README", "top\n");
    repo.write(".gitignore", "build/\n*.tmp\n");
    repo.write("docs/.gitignore", "*.log\n");
    repo.commit_all("tree", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    let xdg = d.base.join("xdg");
    fs::create_dir_all(&xdg).unwrap();

    let mnt = d.open_thread("t", &["--project", "p"]);
    let trace = d.base.join("trace.json");
    let out = git_in(&mnt, &xdg, Some(&trace), &["status", "--porcelain"]);
    out.assert_ok();
    assert_eq!(out.stdout_str(), "", "{}", out.describe());
    assert!(
        out.stderr_str().trim().is_empty(),
        "git warned: {}",
        out.describe()
    );
    assert_eq!(
        trace_counter(&trace, "opendir"),
        Some(0),
        "the first status listed directories:\n{}",
        fs::read_to_string(&trace).unwrap_or_default()
    );
    let small = fs::read(mnt.join(".git/index")).unwrap();
    let shared: Vec<_> = fs::read_dir(mnt.join(".git"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("sharedindex."))
        .collect();
    assert_eq!(shared.len(), 1, "one shared index part");
    // The workspace's own part holds no entry (they are all in the shared part) and names the
    // shared part in its `link` extension. (Its size says nothing: its cache tree and untracked
    // cache can outweigh the entries of a small tree.)
    assert!(small.len() > 12 && &small[..4] == b"DIRC", "not an index");
    assert_eq!(
        u32::from_be_bytes([small[8], small[9], small[10], small[11]]),
        0,
        "the index is not split: its own part holds entries"
    );
    assert!(
        small.windows(4).any(|w| w == b"link"),
        "the index is not split: no link extension"
    );

    // The same changes in the mount and in a clone: git must tell the same story.
    let clone = d.base.join("clone");
    git(
        &d.base,
        ["clone", "-q", repo.path.to_str().unwrap(), "clone"],
    );
    for root in [&mnt, &clone] {
        let w = |rel: &str, s: &str| {
            let p = root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, s).unwrap();
        };
        w("src/lib/deep/new.rs", "new\n");
        w("newdir/inner/x", "x\n");
        w("docs/notes.log", "ignored\n");
        w("build/out.o", "ignored\n");
        w("vendor/x/y/z/scratch.tmp", "ignored\n");
        fs::remove_file(root.join("tests/unit/a.txt")).unwrap();
    }
    assert_eq!(status(&mnt, &xdg), status(&clone, &xdg));
    assert!(status(&mnt, &xdg).contains("?? src/lib/deep/new.rs"));
    // An ignore rule changed: what it un-ignores appears.
    for root in [&mnt, &clone] {
        fs::write(root.join("docs/.gitignore"), "*.nothing\n").unwrap();
    }
    let after = status(&mnt, &xdg);
    assert_eq!(after, status(&clone, &xdg));
    assert!(after.contains("?? docs/notes.log"), "{after}");
    // Staged and committed through the split index.
    for root in [&mnt, &clone] {
        git_in(root, &xdg, None, &["add", "-A"]).assert_ok();
        git_in(root, &xdg, None, &["commit", "-qm", "changes"]).assert_ok();
    }
    assert_eq!(status(&mnt, &xdg), "");
    assert_eq!(status(&clone, &xdg), "");

    // A second fork of the same base: its own ident (its own mount), no directory listed.
    let mnt2 = d.open_thread("u", &["--project", "p"]);
    let trace2 = d.base.join("trace2.json");
    let out = git_in(&mnt2, &xdg, Some(&trace2), &["status", "--porcelain"]);
    out.assert_ok();
    assert_eq!(out.stdout_str(), "");
    assert!(out.stderr_str().trim().is_empty(), "{}", out.describe());
    assert_eq!(trace_counter(&trace2, "opendir"), Some(0));
    fs::write(mnt2.join("src/app/fresh"), "x").unwrap();
    assert_eq!(status(&mnt2, &xdg), "?? src/app/fresh");
}
