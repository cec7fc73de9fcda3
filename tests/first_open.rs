//! The first `open` of a base nobody built the shared index of ahead (a branch other than the
//! default, an ordinary user's workspace): answered before the index is built, and git sees the
//! right state from its first command.
//!
//! [`first_open_of_an_unbuilt_base_is_answered_before_its_index_and_git_is_right_at_once`]: a
//! 20,000-file branch that is not the default, opened by an ordinary user. The daemon's log shows
//! the workspace created (and so `open` answered) before its index is in place; a snapshot taken
//! at once is the branch's tree; `git status --porcelain` and `git diff HEAD --stat`, run at once,
//! are empty; a write then shows exactly that file.
//!
//! [`a_held_directory_answers_nothing_of_its_names_until_released`] (the core without a kernel):
//! a lookup in a held `.git` waits while one elsewhere is answered, is answered once the index is
//! put in and the hold ends (the name noted for the kernel), and fails with `EIO` after a failed
//! hold, for the kernel's requests and the daemon's reads alike.
//!
//! [`an_index_a_killed_daemon_never_put_in_is_put_in_by_the_next`]: the daemon is killed right
//! after such an `open` (most runs before its index is in: a 60,000-file branch); the next daemon
//! adopts the mount and, when the index never came, builds it: git is right either way.

use crate::common;

use common::*;
use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

/// A repository whose default branch `main` has two files and whose branch `side` adds `n` more
/// (one `git fast-import`).
fn repo_with_a_big_side_branch(path: &Path, n: usize) -> GitRepo {
    let repo = GitRepo::init(path);
    let mut stream = Vec::new();
    let commit = |stream: &mut Vec<u8>, branch: &str, from: Option<&str>, msg: &str| {
        stream.extend_from_slice(
            format!(
                "commit refs/heads/{branch}\ncommitter Octo Test <octo@example.invalid> 1609459200 +0000\ndata {}\n{msg}\n",
                msg.len()
            )
            .as_bytes(),
        );
        if let Some(f) = from {
            stream.extend_from_slice(format!("from {f}\n").as_bytes());
        }
    };
    let file = |stream: &mut Vec<u8>, path: &str, content: &str| {
        stream.extend_from_slice(
            format!(
                "M 100644 inline {path}\ndata {}\n{content}\n",
                content.len()
            )
            .as_bytes(),
        );
    };
    commit(&mut stream, "main", None, "small\n");
    file(&mut stream, "README", "small\n");
    file(&mut stream, "d000/s0/f0.txt", "file 0\n");
    commit(&mut stream, "side", Some("refs/heads/main"), "big\n");
    for i in 0..n {
        let content = format!("file {i}\n{}\n", "x".repeat(i % 200));
        file(
            &mut stream,
            &format!("d{:03}/s{}/f{i}.txt", i / 100, i % 7),
            &content,
        );
    }
    stream.extend_from_slice(b"done\n");
    fast_import(path, &stream, FIXTURE_TIMEOUT);
    repo.git(["checkout", "-q", "-f", "main"]);
    repo
}

/// Where in the daemon's log `needle` is first said (panics with the log when it is not).
fn said_at(d: &Daemon, needle: &str) -> usize {
    let log = d.log_text();
    log.find(needle)
        .unwrap_or_else(|| panic!("the daemon never said {needle:?}; log:\n{}", d.log_tail()))
}

#[test]
fn first_open_of_an_unbuilt_base_is_answered_before_its_index_and_git_is_right_at_once() {
    let d = Daemon::start();
    let repo = repo_with_a_big_side_branch(&d.base.join("big"), 20_000);
    let side_tree = repo.git(["rev-parse", "side^{tree}"]).trim().to_string();
    d.cli_ok(["mirror", "add", "big", repo.path.to_str().unwrap()]);
    let user = user_a();
    d.cli_ok([
        "mirror",
        "access",
        "big",
        "--allow-user",
        &user.uid.to_string(),
    ]);
    let index = d.state.join("indexes").join(format!(
        "{side_tree}-{side_tree}-{}-{}.split",
        user.uid, user.gid
    ));
    assert!(!index.exists(), "nobody built the side branch's index yet");

    let t0 = Instant::now();
    d.cli_as(user, &["open", "t", "--project", "big", "--ref", "side"])
        .assert_ok();
    let opened = t0.elapsed();
    let ws = d.mount("t");
    // A snapshot at once (it reads the index's side of `.git`: it waits for it) is the branch.
    let snap = d.cli_as(user, &["snapshot", "t"]);
    let snap = snap.assert_ok().stdout_str().trim().to_string();
    let mirror = d.state.join("mirrors").join("big");
    assert_eq!(
        git(&mirror, ["rev-parse", &format!("{snap}^{{tree}}")]).trim(),
        side_tree,
        "a snapshot taken while the index was being built is not the branch's tree"
    );
    // Git at once, as the owner: clean, no diff; then a write shows exactly that file.
    let mut sh = as_user(user, "sh");
    sh.args([
        "-c",
        "cd \"$0\" && git status --porcelain && echo '--' && git diff HEAD --stat && echo '--' && \\
         echo more >> d000/s0/f0.txt && git status --porcelain --untracked-files=all && \\
         git diff --stat",
    ])
    .arg(&ws)
    .current_dir("/");
    let out = run(&mut sh, CMD_TIMEOUT);
    assert_eq!(
        out.assert_ok().stdout_str(),
        "--\n--\n M d000/s0/f0.txt\n d000/s0/f0.txt | 1 +\n 1 file changed, 1 insertion(+)\n"
    );
    // Order of events: the workspace was created (its `open` answered) before its index was.
    let created = said_at(&d, "created a workspace");
    let in_place = said_at(&d, "the workspace's index is in place");
    assert!(
        created < in_place,
        "the index was built before open was answered; log:\n{}",
        d.log_tail()
    );
    assert!(
        index.exists(),
        "the build kept the shared index for the next forks"
    );
    d.cli_as(user, &["release", "t"]).assert_ok();
    assert!(!is_mounted(&ws));
    eprintln!("open of a 20,000-file unbuilt base: {opened:?} (CLI wall time)");
}

#[test]
fn an_index_a_killed_daemon_never_put_in_is_put_in_by_the_next() {
    let mut d = Daemon::start();
    let repo = repo_with_a_big_side_branch(&d.base.join("big"), 60_000);
    d.cli_ok(["mirror", "add", "big", repo.path.to_str().unwrap()]);
    let ws = d.open_thread("t", &["--project", "big", "--ref", "side"]);
    d.kill9();
    let came = d.log_text().contains("the workspace's index is in place");
    d.spawn();
    wait_mounted(std::slice::from_ref(&ws), Duration::from_secs(30));
    assert_eq!(
        git(&ws, ["status", "--porcelain"]),
        "",
        "a clean fork after the crash"
    );
    assert_eq!(git(&ws, ["diff", "HEAD", "--stat"]), "");
    if !came {
        said_at(&d, "its index never came: building it");
    }
    eprintln!(
        "the killed daemon had {} the index in",
        if came { "put" } else { "not put" }
    );
    d.cli_ok(["release", "t"]);
    assert!(!is_mounted(&ws));
}

#[test]
fn a_held_directory_answers_nothing_of_its_names_until_released() {
    use fuser::Errno;
    use octofs::fs::{Behind, ROOT_INO};
    let (_tmp, core) = core_of_files(&[("a.txt", "a\n")]);
    let core = std::sync::Arc::new(core);
    let git = core.seed_dir(ROOT_INO, ".git", 0o755).unwrap();
    core.seed_file(git, "HEAD", b"ref: refs/heads/main\n", 0o644)
        .unwrap();
    core.watch_kernel();
    core.hold_dir(git);
    let (tx, rx) = std::sync::mpsc::channel();
    let c = core.clone();
    let waiter = std::thread::spawn(move || {
        let r = c.lookup(git, OsStr::new("index")).map(|a| a.size);
        tx.send(()).unwrap();
        r
    });
    // Elsewhere, nothing waits.
    assert_eq!(core.lookup(ROOT_INO, OsStr::new("a.txt")).unwrap().size, 2);
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a lookup in the held .git was answered before its index was in"
    );
    core.add_own_file(git, "index", b"index!", 0o644).unwrap();
    core.release_dir(Ok(()));
    assert_eq!(waiter.join().unwrap(), Ok(6), "answered once released");
    assert!(core.take_behind().contains(&Behind::Entry {
        parent: git,
        name: b"index".to_vec()
    }));
    // A failed hold is an error for whoever reaches the directory's names, and says why.
    core.hold_dir(git);
    core.release_dir(Err("boom".into()));
    let e = core.lookup(git, OsStr::new("HEAD")).unwrap_err();
    assert_eq!(e, Errno::EIO);
    assert!(format!("{e:?}").contains("boom"), "{e:?}");
    assert_eq!(
        core.read_file(&[b".git", b"index"]).unwrap_err(),
        Errno::EIO
    );
    // The daemon's own files of `.git` are read without waiting.
    assert!(core.read_file(&[b".git", b"HEAD"]).unwrap().is_some());
}
