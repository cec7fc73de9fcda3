//! What an `open` costs besides the mount: the mirror's refs are read in process, and the shared
//! index of the default branch is built ahead of time.
//!
//! 1. [`mirror_refs_match_git`]: `repo::mirror_refs` lists what `git for-each-ref` lists (loose and
//!    packed refs, branches, remote branches, lightweight, annotated and nested annotated tags,
//!    the symbolic `refs/remotes/origin/HEAD`), with tags fully peeled (what `git rev-parse
//!    <tag>^{}` says, the meaning `packed-refs` gives its `^` lines).
//! 2. [`mirror_add_and_sync_build_the_shared_index_before_any_open`]: after `mirror add` the index
//!    of the default branch for root appears without an `open`, after a sync that moves the branch
//!    the new tree's does, and the first fork then works from it (git status clean).
//! 3. [`sixty_workspaces_share_one_bounded_pool_of_request_threads`]: 60 live workspaces hold the
//!    daemon under 64 OS threads (every mount's `/dev/fuse` is served by one pool), each serves
//!    reads of names nobody looked up yet, a write and a `git status` showing exactly its own
//!    change, from processes started after all opens and run 8 at once (one as an ordinary uid);
//!    releasing them all leaves no mount and gives the threads back.

use crate::common;

use common::*;
use std::path::Path;
use std::time::{Duration, Instant};

/// `(name, object id, fully peeled id of a tag)` and `(name, symref target)` as git reports them.
type Listing = (Vec<(String, String, Option<String>)>, Vec<(String, String)>);

fn git_listing(dir: &Path) -> Listing {
    let out = git(
        dir,
        [
            "for-each-ref",
            "--format=%(objectname) %(objecttype) %(refname) %(symref)",
        ],
    );
    let mut direct = Vec::new();
    let mut symbolic = Vec::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let [oid, kind, name, symref] = f[..] else {
            panic!("unexpected for-each-ref line {line:?}");
        };
        if !symref.is_empty() {
            symbolic.push((name.to_string(), symref.to_string()));
            continue;
        }
        let peeled = (kind == "tag").then(|| {
            git(dir, ["rev-parse", &format!("{name}^{{}}")])
                .trim()
                .to_string()
        });
        direct.push((name.to_string(), oid.to_string(), peeled));
    }
    direct.sort();
    symbolic.sort();
    (direct, symbolic)
}

fn octofs_listing(dir: &Path) -> Listing {
    let repo = gix::open_opts(dir, gix::open::Options::isolated()).expect("open repo");
    let refs = octofs::repo::mirror_refs(&repo).expect("mirror_refs");
    (
        refs.direct
            .into_iter()
            .map(|(n, id, p)| (n, id.to_string(), p.map(|p| p.to_string())))
            .collect(),
        refs.symbolic,
    )
}

#[test]
fn mirror_refs_match_git() {
    let tmp = tempfile::tempdir().unwrap();
    let up = GitRepo::init(&tmp.path().join("up"));
    up.write("a.txt", "a\n");
    up.commit_all("one", DATE1);
    up.git(["branch", "side"]);
    up.git(["tag", "light"]);
    up.git(["tag", "-a", "-m", "annotated", "ann"]);
    up.write("b.txt", "b\n");
    up.commit_all("two", DATE2);
    up.git(["tag", "-a", "-m", "on an annotated tag", "nested", "ann"]);
    up.git(["tag", "-a", "-m", "a tree", "treetag", "HEAD^{tree}"]);
    let mirror = tmp.path().join("mirror");
    git(
        tmp.path(),
        [
            "clone",
            "-q",
            up.path.to_str().unwrap(),
            mirror.to_str().unwrap(),
        ],
    );
    // Some refs packed (with peeled lines), some loose: both stores are read.
    up.write("c.txt", "c\n");
    up.commit_all("three", DATE2);
    up.git(["tag", "-a", "-m", "loose", "loose-ann"]);
    up.git(["tag", "loose-light"]);
    git(&mirror, ["fetch", "-q", "--tags", "origin"]);
    git(&mirror, ["branch", "local-only", "HEAD~1"]);
    git(&mirror, ["update-ref", "refs/octomate/threads/t", "HEAD"]);
    let loose = mirror.join(".git/refs/tags/loose-ann");
    assert!(loose.exists(), "the test needs a loose annotated tag");
    assert!(
        std::fs::read_to_string(mirror.join(".git/packed-refs"))
            .unwrap()
            .contains("refs/tags/ann"),
        "the test needs a packed annotated tag"
    );
    let want = git_listing(&mirror);
    assert!(
        want.1
            .iter()
            .any(|(n, t)| n == "refs/remotes/origin/HEAD" && t == "refs/remotes/origin/main"),
        "{want:?}"
    );
    assert!(want.0.iter().filter(|(_, _, p)| p.is_some()).count() >= 4);
    assert_eq!(octofs_listing(&mirror), want);
}

/// Waits (bounded) until `path` exists.
fn wait_for(path: &Path, timeout: Duration) -> bool {
    poll(timeout, || path.exists().then_some(())).is_some()
}

fn index_of(d: &Daemon, tree: &str) -> std::path::PathBuf {
    d.state
        .join("indexes")
        .join(format!("{tree}-{tree}-0-0.split"))
}

#[test]
fn mirror_add_and_sync_build_the_shared_index_before_any_open() {
    let tmp = tempfile::tempdir().unwrap();
    let up = GitRepo::init(&tmp.path().join("up"));
    for i in 0..200 {
        up.write(&format!("d{}/f{i}.txt", i % 7), format!("{i}\n"));
    }
    up.commit_all("one", DATE1);
    let tree1 = up.git(["rev-parse", "HEAD^{tree}"]).trim().to_string();
    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &up.file_url()]);
    assert!(
        wait_for(&index_of(&d, &tree1), Duration::from_secs(20)),
        "no shared index for {tree1} after mirror add; log:\n{}",
        d.log_tail()
    );

    up.write("d0/new.txt", "new\n");
    up.commit_all("two", DATE2);
    let tree2 = up.git(["rev-parse", "HEAD^{tree}"]).trim().to_string();
    d.cli_ok(["mirror", "sync", "proj"]);
    assert!(
        wait_for(&index_of(&d, &tree2), Duration::from_secs(20)),
        "no shared index for {tree2} after mirror sync; log:\n{}",
        d.log_tail()
    );

    // A restarted daemon builds what is missing.
    std::fs::remove_file(index_of(&d, &tree2)).unwrap();
    d.stop();
    d.spawn();
    assert!(
        wait_for(&index_of(&d, &tree2), Duration::from_secs(20)),
        "no shared index for {tree2} after a restart; log:\n{}",
        d.log_tail()
    );

    let ws = d.open_thread("t1", &["--project", "proj"]);
    let status = git(&ws, ["status", "--porcelain"]);
    assert_eq!(status.trim(), "", "a fresh fork is clean");
    assert!(ws.join("d0/new.txt").exists());
    d.cli_ok(["release", "t1"]);
}

fn daemon_threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn sixty_workspaces_share_one_bounded_pool_of_request_threads() {
    const N: usize = 60;
    let d = Daemon::start();
    add_project(
        &d,
        "p",
        &[
            ("a.txt", "alpha\n", 0o644),
            ("dir/b.txt", "beta\n", 0o644),
            ("dir/deep/c.txt", "gamma\n", 0o644),
        ],
    );
    let pid = d.pid().expect("daemon pid");
    let started = Instant::now();
    let user = user_a();
    d.cli_ok([
        "mirror",
        "access",
        "p",
        "--allow-user",
        &user.uid.to_string(),
    ]);
    let mut mounts = Vec::new();
    for i in 0..N - 1 {
        mounts.push(d.open_thread(&format!("w{i}"), &["--project", "p"]));
    }
    // The last one is an ordinary user's.
    let theirs = d.cli_as(user, &["open", "mine", "--project", "p"]);
    theirs.assert_ok();
    let mine = d.mount("mine");
    let open_all = started.elapsed();
    let threads = daemon_threads(pid);
    // Before the pool each mount had 4 reader threads and a joining one: 60 mounts held 300+.
    assert!(
        threads <= 64,
        "{threads} daemon threads with {N} workspaces open (bound 64)"
    );
    // Processes started after every open, 8 at once: reads of names never looked up, a write, and
    // a `git status` that sees exactly this workspace's change.
    each_mount_in_parallel(&mounts, 8, "a workspace served a wrong answer", |i, m| {
        let m2 = m.clone();
        let b = fsop("read dir/b.txt", move || {
            std::fs::read(m2.join("dir/b.txt"))
        });
        assert_eq!(b.expect("read b"), b"beta\n", "workspace {i}");
        let m2 = m.clone();
        fsop("write", move || {
            std::fs::write(m2.join(format!("new-{i}.txt")), "x\n")
        })
        .expect("write");
        let status = git(m, ["status", "--porcelain", "--untracked-files=all"]);
        assert_eq!(status, format!("?? new-{i}.txt\n"), "workspace {i}");
    });
    // The ordinary user's workspace, by its owner's processes.
    let mut sh = as_user(user, "sh");
    sh.args([
        "-c",
        "cd \"$0\" && cat dir/deep/c.txt && echo x > new.txt && \\
         git status --porcelain --untracked-files=all",
    ])
    .arg(&mine)
    .current_dir("/");
    let out = run(&mut sh, Duration::from_secs(60));
    assert_eq!(out.assert_ok().stdout_str(), "gamma\n?? new.txt\n");
    let busy = daemon_threads(pid);
    assert!(
        busy <= 64,
        "{busy} daemon threads after serving {N} workspaces"
    );
    for i in 0..N - 1 {
        d.cli_ok(["release", &format!("w{i}")]);
    }
    d.cli_as(user, &["release", "mine"]).assert_ok();
    for m in mounts.iter().chain([&mine]) {
        assert!(
            !is_mounted(m),
            "{} still mounted after release",
            m.display()
        );
    }
    eprintln!(
        "{N} opens in {open_all:?}; daemon threads: {threads} open, {busy} after serving, {} released",
        daemon_threads(pid)
    );
}
