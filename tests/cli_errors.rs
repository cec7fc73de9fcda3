//! Issue 2, "Bad input": refused with one clear line on stderr, a non-zero exit, nothing on
//! stdout, and nothing created or changed in the state directory or under the root. Plus the
//! plain-directory mirror (add, sync) and `mirror list --json`.

use crate::common;

use common::*;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::Duration;

/// A small git repository with one commit on `main`.
fn small_repo(path: &Path) -> GitRepo {
    let repo = GitRepo::init(path);
    repo.write("README.md", "small\n");
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.commit_all("initial", DATE1);
    repo
}

/// Runs `octofs <args>` and asserts it is refused cleanly: non-zero exit, exactly one non-empty
/// line on stderr (not a panic), nothing on stdout, and no change to the state directory, the
/// root, or the set of mounts. `mention`: a string the error line must contain.
#[track_caller]
fn assert_refused(d: &Daemon, args: &[&str], mention: Option<&str>) -> String {
    let state_before = tree_listing(&d.state);
    let root_before = tree_listing(&d.root);
    let mounts_before = mounts_under(&d.base);
    let out = d.cli(args);
    let err = out.stderr_str();
    let line = err.strip_suffix('\n').unwrap_or(&err);
    assert!(
        !out.success(),
        "expected a refusal: {}\n--- daemon log ---\n{}",
        out.describe(),
        d.log_tail()
    );
    assert!(
        !line.trim().is_empty() && !line.contains('\n'),
        "error must be exactly one non-empty line on stderr: {}",
        out.describe()
    );
    assert!(!line.contains("panicked"), "{}", out.describe());
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout on error: {}",
        out.describe()
    );
    if let Some(m) = mention {
        assert!(
            line.contains(m),
            "error should name {m:?}: {}",
            out.describe()
        );
    }
    assert_same_listing(
        &format!("state dir after refused {args:?}"),
        &state_before,
        &tree_listing(&d.state),
    );
    assert_same_listing(
        &format!("root after refused {args:?}"),
        &root_before,
        &tree_listing(&d.root),
    );
    assert_eq!(
        mounts_before,
        mounts_under(&d.base),
        "mounts after refused {args:?}"
    );
    line.to_string()
}

/// Names outside `[A-Za-z0-9._-]{1,128}` or starting with '.' or '-'.
fn bad_names() -> Vec<String> {
    vec![
        String::new(),
        "a".repeat(129),
        ".hidden".into(),
        ".".into(),
        "..".into(),
        "-dash".into(),
        "a/b".into(),
        "/abs".into(),
        "a b".into(),
        "café".into(),
        "日本".into(),
        "a:b".into(),
    ]
}

#[test]
fn bad_names_are_refused_before_touching_state() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let upstream = repo.path.display().to_string();
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &upstream]);

    for name in bad_names() {
        // `--` so that names starting with '-' reach octofs instead of the option parser.
        assert_refused(&d, &["mirror", "add", "--", &name, &upstream], None);
        assert_refused(&d, &["open", "--project", "proj", "--", &name], None);
        assert_refused(
            &d,
            &["open", &format!("--project={name}"), "--", "t1"],
            None,
        );
        assert_refused(&d, &["mirror", "sync", "--", &name], None);
        assert_refused(&d, &["status", "--", &name], None);
    }

    // The boundaries of the rule are accepted.
    let long = "p".repeat(128);
    d.cli_ok(["mirror", "add", &long, &upstream]);
    for thread in ["x", "Zz09._-", &"t".repeat(128)] {
        let out = d.cli_ok(["open", "--project", &long, "--", thread]);
        assert_eq!(out, format!("{}\n", d.mount(thread).display()));
    }
}

#[test]
fn unknown_project_thread_and_ref_are_refused() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let d = Daemon::start();

    assert_refused(&d, &["open", "--project", "nope", "--", "t1"], Some("nope"));
    assert_refused(&d, &["mirror", "sync", "nope"], Some("nope"));
    assert_refused(&d, &["status", "ghost"], Some("ghost"));

    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    assert_refused(
        &d,
        &[
            "open",
            "--project",
            "proj",
            "--ref",
            "no-such-ref",
            "--",
            "t1",
        ],
        Some("no-such-ref"),
    );
    let missing_sha = "0123456789abcdef0123456789abcdef01234567";
    assert_refused(
        &d,
        &[
            "open",
            "--project",
            "proj",
            "--ref",
            missing_sha,
            "--",
            "t1",
        ],
        Some(missing_sha),
    );
    assert_refused(
        &d,
        &["open", "--project", "proj", "--ref", "main~5", "--", "t1"],
        Some("main~5"),
    );
    // A failed open does not poison the thread: a good one works afterwards.
    let out = d.cli_ok(["open", "--project", "proj", "--ref", "main", "--", "t1"]);
    assert_eq!(out, format!("{}\n", d.mount("t1").display()));
}

#[test]
fn bad_upstreams_are_refused() {
    let d = Daemon::start();
    let missing = d.base.join("does-not-exist");
    let missing_s = missing.display().to_string();
    assert_refused(&d, &["mirror", "add", "q", &missing_s], Some(&missing_s));
    assert_refused(
        &d,
        &["mirror", "add", "q", &format!("file://{missing_s}")],
        None,
    );
    let file = d.base.join("plain-file.txt");
    fs::write(&file, "not a repository\n").unwrap();
    let file_s = file.display().to_string();
    assert_refused(&d, &["mirror", "add", "q", &file_s], Some(&file_s));
    assert_eq!(fs::read_to_string(&file).unwrap(), "not a repository\n");
}

#[test]
fn second_mirror_add_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let other = small_repo(&src.path().join("other"));
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.path.display().to_string()]);
    assert_refused(
        &d,
        &["mirror", "add", "proj", &repo.path.display().to_string()],
        Some("proj"),
    );
    assert_refused(
        &d,
        &["mirror", "add", "proj", &other.file_url()],
        Some("proj"),
    );
}

#[test]
fn root_that_is_a_file_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    d.stop();

    // The only thing wrong with these invocations is the root.
    let file = d.base.join("root-file");
    fs::write(&file, "I am not a directory\n").unwrap();
    d.root = file.clone();
    let file_s = file.display().to_string();
    // The daemon itself refuses to run on it, and exits instead of hanging.
    let out = run(d.command().arg("serve"), Duration::from_secs(10));
    assert!(
        !out.success(),
        "serve with a file as root: {}",
        out.describe()
    );
    assert!(
        out.stderr_str().contains(&file_s),
        "serve should name the bad root: {}",
        out.describe()
    );

    // The CLI (which would auto-start a daemon) refuses it without touching the state.
    assert_refused(
        &d,
        &["open", "--project", "proj", "--", "t1"],
        Some(&file_s),
    );
    assert_eq!(fs::read_to_string(&file).unwrap(), "I am not a directory\n");
}

/// Relative paths of every non-directory entry under `dir`, skipping nothing.
fn files_under(dir: &Path) -> BTreeSet<String> {
    tree_listing(dir)
        .into_iter()
        .filter(|(k, v)| !k.is_empty() && !v.starts_with("dir "))
        .map(|(k, _)| k)
        .collect()
}

/// `git ls-tree -r HEAD` of a mirror: path -> mode.
fn ls_tree(mirror: &Path) -> std::collections::BTreeMap<String, String> {
    git(mirror, ["ls-tree", "-r", "-z", "HEAD"])
        .split('\0')
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (meta, path) = e.split_once('\t').expect("ls-tree entry");
            (
                path.to_string(),
                meta.split(' ').next().unwrap().to_string(),
            )
        })
        .collect()
}

fn rev_parse(mirror: &Path, rev: &str) -> String {
    git(mirror, ["rev-parse", rev]).trim().to_string()
}

#[test]
fn mirror_of_a_plain_directory_and_its_sync() {
    let src = tempfile::tempdir().unwrap();
    let folder = src.path().join("plain folder");
    write_file(&folder.join("README.txt"), b"plain\n", 0o644);
    write_file(&folder.join("sub/dir/file.rs"), b"fn main() {}\n", 0o644);
    write_file(&folder.join("run.sh"), b"#!/bin/sh\n", 0o755);
    write_file(&folder.join("space name.txt"), b"spaces\n", 0o644);
    write_file(&folder.join("ünïcödé.txt"), b"utf-8\n", 0o644);
    write_file(&folder.join("data.bin"), &pseudo_random(50_000, 9), 0o644);
    std::os::unix::fs::symlink("README.txt", folder.join("link")).unwrap();
    let folder_s = folder.display().to_string();

    let d = Daemon::start();
    let before = tree_listing(&folder);
    d.cli_ok(["mirror", "add", "plain", &folder_s]);
    assert!(
        !folder.join(".git").exists(),
        "mirror add created a .git in the source folder"
    );
    assert_same_listing(
        "source folder after mirror add",
        &before,
        &tree_listing(&folder),
    );

    let mirror = d.mirror("plain");
    let tree = ls_tree(&mirror);
    let want: BTreeSet<String> = files_under(&folder);
    assert_eq!(
        tree.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "ls-tree vs folder"
    );
    assert_eq!(tree["run.sh"], "100755", "exec bit");
    assert_eq!(tree["README.txt"], "100644");
    assert_eq!(tree["link"], "120000", "symlink");
    assert_eq!(
        fs::read_to_string(mirror.join("sub/dir/file.rs")).unwrap(),
        "fn main() {}\n",
        "mirror is a working checkout"
    );

    // No change: no commit.
    let head0 = rev_parse(&mirror, "HEAD");
    d.cli_ok(["mirror", "sync", "plain"]);
    assert_eq!(
        rev_parse(&mirror, "HEAD"),
        head0,
        "sync without changes made a commit"
    );

    // A new file: one new commit on top, visible in the mirror's checkout.
    write_file(&folder.join("added.txt"), b"new\n", 0o644);
    d.cli_ok(["mirror", "sync", "plain"]);
    let head1 = rev_parse(&mirror, "HEAD");
    assert_ne!(head1, head0, "sync after adding a file made no commit");
    assert_eq!(
        rev_parse(&mirror, "HEAD^"),
        head0,
        "the new commit's parent"
    );
    assert!(ls_tree(&mirror).contains_key("added.txt"));
    assert_eq!(
        fs::read_to_string(mirror.join("added.txt")).unwrap(),
        "new\n"
    );
    let status = git(&mirror, ["--no-optional-locks", "status", "--porcelain"]);
    assert!(
        status.is_empty(),
        "mirror checkout not clean after sync:\n{status}"
    );

    // Again without a change: no commit.
    d.cli_ok(["mirror", "sync", "plain"]);
    assert_eq!(
        rev_parse(&mirror, "HEAD"),
        head1,
        "second sync without changes made a commit"
    );

    // A deletion is synced too.
    fs::remove_dir_all(folder.join("sub")).unwrap();
    d.cli_ok(["mirror", "sync", "plain"]);
    assert_ne!(
        rev_parse(&mirror, "HEAD"),
        head1,
        "sync after a deletion made no commit"
    );
    assert_eq!(
        ls_tree(&mirror).keys().cloned().collect::<BTreeSet<_>>(),
        files_under(&folder)
    );
    assert!(
        !folder.join(".git").exists(),
        "mirror sync created a .git in the source folder"
    );
}

#[test]
fn mirror_list_json_lists_projects() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let folder = src.path().join("folder");
    write_file(&folder.join("a.txt"), b"a\n", 0o644);
    let d = Daemon::start();

    parse_json("empty mirror list", &d.cli_ok(["mirror", "list", "--json"]));

    d.cli_ok(["mirror", "add", "alpha", &repo.path.display().to_string()]);
    d.cli_ok(["mirror", "add", "beta", &folder.display().to_string()]);
    assert_eq!(rev_parse(&d.mirror("alpha"), "HEAD"), repo.head());

    let mut strings = Vec::new();
    json_strings(
        &parse_json(
            "mirror list --json",
            &d.cli_ok(["mirror", "list", "--json"]),
        ),
        &mut strings,
    );
    for p in ["alpha", "beta"] {
        assert!(
            strings.iter().any(|s| s == p),
            "`mirror list --json` lacks {p}: {strings:?}"
        );
    }
    let plain = d.cli_ok(["mirror", "list"]);
    assert!(plain.contains("alpha") && plain.contains("beta"), "{plain}");
}

// ---------------------------------------------------------------------------------------------
// Issue 10, "Upstream and path handling"

#[test]
fn relative_upstream_is_resolved_against_the_callers_cwd() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let folder = src.path().join("sub/folder");
    write_file(&folder.join("a.txt"), b"a\n", 0o644);
    let d = Daemon::start();
    // The daemon's cwd is not `src`: only the caller's cwd makes these paths name anything.
    let out = run(
        d.command()
            .current_dir(src.path())
            .args(["mirror", "add", "rel", "repo"]),
        CMD_TIMEOUT,
    );
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    assert_eq!(rev_parse(&d.mirror("rel"), "HEAD"), repo.head());
    let out = run(
        d.command().current_dir(src.path().join("sub")).args([
            "mirror",
            "add",
            "dir",
            "./folder/../folder",
        ]),
        CMD_TIMEOUT,
    );
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let list = d.cli_ok(["mirror", "list"]);
    let src_abs = src.path().canonicalize().unwrap();
    assert!(
        list.contains(&src_abs.join("repo").display().to_string()),
        "the project records the absolute path: {list}"
    );
}

/// Sends one raw request line to the daemon and returns its answer line.
fn raw_request(d: &Daemon, line: &str) -> String {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(d.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut answer = String::new();
    BufReader::new(s).read_line(&mut answer).unwrap();
    answer
}

#[test]
fn option_like_upstreams_never_reach_git() {
    let d = Daemon::start();
    let marker = d.base.join("pwned");
    let m = marker.display().to_string();
    let upstreams = [
        format!("-oProxyCommand=touch {m}"),
        format!("--upload-pack=touch {m};x@y:z"),
        format!("--config=core.sshCommand=touch {m}"),
        "-".to_string(),
    ];
    for up in &upstreams {
        assert_refused(&d, &["mirror", "add", "--", "q", up], Some("'-'"));
        // A client that does not check: the daemon refuses too.
        let req = serde_json::json!({"cmd": "mirror-add", "project": "q", "upstream": up});
        let before = tree_listing(&d.state);
        let answer = raw_request(&d, &req.to_string());
        assert!(
            answer.contains("\"ok\":false") && answer.contains("'-'"),
            "{up}: {answer}"
        );
        assert_same_listing(
            "state after a raw refused add",
            &before,
            &tree_listing(&d.state),
        );
    }
    assert!(!marker.exists(), "an upstream ran a command");
}

#[test]
fn remote_helpers_and_other_transports_are_refused_fast() {
    let d = Daemon::start();
    let marker = d.base.join("pwned");
    let m = marker.display().to_string();
    for up in [
        "fd::17".to_string(),
        "fd::0@x".to_string(),
        format!("ext::sh -c touch% {m}"),
        format!("ext::sh -c touch% {m}@x:y"),
        "foo::bar://x".to_string(),
        "ftp://127.0.0.1/x.git".to_string(),
    ] {
        let t = std::time::Instant::now();
        let line = assert_refused(&d, &["mirror", "add", "q", &up], None);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{up}: {:?}",
            t.elapsed()
        );
        assert!(
            line.contains("not allowed") || line.contains("remote helper"),
            "{up}: {line}"
        );
    }
    assert!(!marker.exists(), "an upstream ran a command");
}

/// A TCP listener on 127.0.0.1 that accepts connections and never answers, for at most 60 s.
struct StalledServer {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StalledServer {
    fn start() -> StalledServer {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(60);
            while !s.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                if let Ok((c, _)) = listener.accept() {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        StalledServer {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StalledServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_stalled_upstream_times_out_and_leaves_nothing() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--fetch-timeout", "3"]);
    let server = StalledServer::start();
    for up in [
        format!("git://127.0.0.1:{}/x.git", server.port),
        format!("http://127.0.0.1:{}/x.git", server.port),
    ] {
        let t = std::time::Instant::now();
        let line = assert_refused(&d, &["mirror", "add", "q", &up], Some("no progress"));
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{up}: took {:?}: {line}",
            t.elapsed()
        );
    }
    // A sync from an upstream that stalls: a warning within the timeout, the mirror as it was.
    d.cli_ok(["mirror", "add", "q", &repo.path.display().to_string()]);
    let before = tree_listing(&d.mirror("q"));
    git(
        &d.mirror("q"),
        [
            "remote",
            "set-url",
            "origin",
            &format!("git://127.0.0.1:{}/x.git", server.port),
        ],
    );
    let t = std::time::Instant::now();
    let out = d.cli(["mirror", "sync", "q"]);
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert!(
        out.stdout_str().contains("stale") && out.stderr_str().contains("no progress"),
        "{}",
        out.describe()
    );
    git(
        &d.mirror("q"),
        [
            "remote",
            "set-url",
            "origin",
            &repo.path.display().to_string(),
        ],
    );
    let mut after = tree_listing(&d.mirror("q"));
    // FETCH_HEAD and the config's own churn aside, nothing changed.
    after.retain(|k, _| !k.ends_with("FETCH_HEAD"));
    let mut before = before;
    before.retain(|k, _| !k.ends_with("FETCH_HEAD"));
    assert_same_listing("mirror after a stalled sync", &before, &after);
    // The project's lock is free again.
    d.cli_ok(["mirror", "sync", "q"]);
}

/// Issue 10: names git refuses as the last component of a ref (`refs/octomate/threads/<name>`) used
/// to be opened and then could never be snapshotted or released. They are refused up front by every
/// command; names at the edge of git's rules work end to end.
#[test]
fn names_that_are_not_valid_ref_components_are_refused() {
    let src = tempfile::tempdir().unwrap();
    let repo = small_repo(&src.path().join("repo"));
    let upstream = repo.path.display().to_string();
    let d = Daemon::start();
    d.cli_ok(["mirror", "add", "proj", &upstream]);

    for name in ["a..b", "x.lock", "z.", "a.b.lock", "end..", "q.."] {
        let what = Some("not a valid git ref name");
        assert_refused(&d, &["mirror", "add", "--", name, &upstream], what);
        assert_refused(&d, &["open", "--project", "proj", "--", name], what);
        assert_refused(&d, &["open", "--", name], what);
        assert_refused(
            &d,
            &["open", &format!("--project={name}"), "--", "t1"],
            what,
        );
        assert_refused(&d, &["snapshot", "--", name], what);
        assert_refused(&d, &["release", "--", name], what);
        assert_refused(&d, &["mirror", "sync", "--", name], what);
    }

    // Names at the edge of the rules: open, change, snapshot, release, and back.
    for thread in ["a.b", "a-", "x_lock", "x.locked", "lock"] {
        let mount = d.cli_ok(["open", "--project", "proj", "--", thread]);
        let mount = Path::new(mount.trim());
        fs::write(mount.join("edge.txt"), thread).unwrap();
        let snap = d.cli_ok(["snapshot", "--", thread]);
        assert_eq!(
            rev_parse(
                &d.mirror("proj"),
                &format!("refs/octomate/threads/{thread}")
            ),
            snap.trim()
        );
        d.cli_ok(["release", "--", thread]);
        assert!(!d.state.join("workspaces").join(thread).exists());
        let mount = d.cli_ok(["open", "--project", "proj", "--", thread]);
        let back = fs::read_to_string(Path::new(mount.trim()).join("edge.txt")).unwrap();
        assert_eq!(back, thread);
        d.cli_ok(["release", "--", thread]);
    }
}

/// Usage lines do not name `--state` and `--root` as if they were required (issue 32, item 8):
/// taken from `OCTOFS_STATE`/`OCTOFS_ROOT` (as the demo sets them), clap named them in every usage
/// line ("Usage: octofs open --state <STATE> --root <ROOT> <THREAD>"). The environment still
/// chooses the state.
#[test]
fn usage_lines_do_not_show_the_global_options_as_required() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = std::process::Command::new(bin());
    c.env("OCTOFS_STATE", dir.path().join("state"))
        .env("OCTOFS_ROOT", dir.path().join("root"))
        .arg("open");
    let out = run(&mut c, CMD_TIMEOUT);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains("Usage: octofs open <THREAD>") && !err.contains("--state"),
        "{err}"
    );
    // `path` of an unknown thread: the daemon the environment names answers (started on demand).
    let mut c = std::process::Command::new(bin());
    c.env("OCTOFS_STATE", dir.path().join("state"))
        .env("OCTOFS_ROOT", dir.path().join("root"))
        .args(["path", "nosuch"]);
    let out = run(&mut c, CMD_TIMEOUT);
    out.assert_one_line_error(&["nosuch"]);
    assert!(
        dir.path().join("state").join("octofs.sock").exists(),
        "OCTOFS_STATE was not used"
    );
    let mut c = std::process::Command::new(bin());
    c.env("OCTOFS_STATE", dir.path().join("state"))
        .env("OCTOFS_ROOT", dir.path().join("root"))
        .arg("stop");
    run(&mut c, CMD_TIMEOUT).assert_ok();
}
