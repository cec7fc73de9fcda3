//! Issue 2, "Done when": real FUSE mounts of two refs of one mirror, side by side, match
//! `git archive` of those refs byte for byte, with the same file types, modes and link targets;
//! reads and inode numbers are stable (also across a daemon restart); writes stay in their workspace; and the mirror
//! is byte-identical before and after the workspaces are used.

use crate::common;

use common::*;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const PROJECT: &str = "proj";
/// Gitlink targets. Deliberately not objects of the repository: a superproject does not contain its
/// submodules' commits, so the filesystem must never try to read them.
const SUB1: &str = "0123456789abcdef0123456789abcdef01234567";
const SUB2: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// Builds the test repository: v1 (lightweight tag) and v2 (annotated tag, also `main`).
fn build_repo(repo: &GitRepo) -> (String, String) {
    // --- v1
    repo.write("README.md", "hello from v1\n");
    repo.write(".hidden", "dotfile\n");
    repo.write("a/top.txt", "top\n");
    repo.write("a/b/c/sibling.txt", "sibling\n");
    repo.write("a/b/c/d/deepest.txt", "deepest\n");
    repo.write_exec("bin/run.sh", "#!/bin/sh\necho run\n");
    repo.write_exec("bin/tool", pseudo_random(4096, 7));
    repo.write("scripts/to-chmod.sh", "#!/bin/sh\necho chmod me\n");
    repo.symlink("link-to-file", "README.md");
    repo.symlink("link-to-dir", "a/b");
    repo.symlink("link-dangling", "does/not/exist");
    repo.symlink("link-changes", "README.md");
    repo.symlink("a/b/link-up", "../../README.md");
    repo.write(
        ".gitmodules",
        "[submodule \"vendor/sub\"]\n\tpath = vendor/sub\n\turl = https://example.invalid/sub.git\n",
    );
    repo.write("vendor/README", "vendored things\n");
    repo.write("data/random.bin", pseudo_random(200 * 1024, 1));
    repo.write("data/big.bin", pseudo_random(1536 * 1024 + 123, 2));
    repo.write("empty.txt", "");
    repo.write("dir with space/naïve café.txt", "crème brûlée\n");
    repo.write("日本語/ファイル.md", "# 見出し\n本文\n");
    repo.write("to-delete.txt", "doomed\n");
    repo.write(
        "gone/only-in-v1/file.txt",
        "whole directory removed in v2\n",
    );
    repo.write("type-change", "a regular file in v1, a symlink in v2\n");
    repo.git(["add", "-A"]);
    repo.gitlink("vendor/sub", SUB1);
    let v1 = repo.commit_all("v1", DATE1);
    repo.git(["tag", "v1"]);

    // --- v2: modify, delete, add, chmod, change link targets, change a type, move the gitlink.
    repo.write("README.md", "hello from v2, which is longer\n");
    let mut big = pseudo_random(1536 * 1024 + 123, 2);
    big[1024 * 1024..1024 * 1024 + 16].copy_from_slice(b"changed in v2!!!");
    repo.write("data/big.bin", &big);
    repo.remove("to-delete.txt");
    repo.remove("gone");
    repo.write("new dir/added file.txt", "added in v2\n");
    repo.write("a/b/c/d/e/f/newdeep.txt", "even deeper\n");
    repo.write("data/new.bin", pseudo_random(70_000, 3));
    repo.chmod("scripts/to-chmod.sh", 0o755);
    repo.chmod("bin/tool", 0o644);
    repo.symlink("link-changes", "a/top.txt");
    repo.remove("type-change");
    repo.symlink("type-change", "README.md");
    repo.gitlink("vendor/sub", SUB2);
    let v2 = repo.commit_all("v2", DATE2);
    repo.git_at(DATE2, ["tag", "-a", "v2", "-m", "release v2"]);

    // The fixture must contain what the test claims to cover.
    let tree = repo.git(["ls-tree", "-r", "v1"]);
    assert!(
        tree.contains(&format!("160000 commit {SUB1}\tvendor/sub")),
        "{tree}"
    );
    assert!(tree.contains("100755 blob"), "{tree}");
    assert!(tree.contains("120000 blob"), "{tree}");
    let tree2 = repo.git(["ls-tree", "-r", "v2"]);
    assert!(
        tree2.contains(&format!("160000 commit {SUB2}\tvendor/sub")),
        "{tree2}"
    );
    assert_ne!(v1, v2);
    (v1, v2)
}

/// `find` output per path (the top directory excluded): type, comparable mode, size, link target.
///
/// Modes: the archive is made with `tar.umask=022`, so regular files carry git's exact modes
/// (0644 / 0755) and are compared in full. Directory permission bits are not recorded by git at
/// all (a checkout gets `0777 & ~umask`), so for directories only the owner bits are compared.
/// Symlink modes are always 0777 on Linux and are not compared; their target (`%l`) and size (the
/// target's length) are.
fn find_listing(dir: &Path) -> BTreeMap<String, String> {
    let out = sh(
        "find",
        [
            dir.as_os_str(),
            "-printf".as_ref(),
            "%P\\t%y\\t%m\\t%s\\t%l\\n".as_ref(),
        ],
    );
    out.assert_ok();
    let mut map = BTreeMap::new();
    for line in out.stdout_str().lines() {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 5, "unexpected find line {line:?}");
        // The workspace's own repository is not part of the tree (git archive has none).
        if f[0].is_empty() || f[0] == ".git" || f[0].starts_with(".git/") {
            continue;
        }
        let mode = u32::from_str_radix(f[2], 8).expect("octal mode");
        let v = match f[1] {
            "f" => format!("file {mode:04o} size {}", f[3]),
            "d" => format!("dir owner {:o}", mode & 0o700),
            "l" => format!("symlink -> {} (size {})", f[4], f[3]),
            other => format!("type {other} {mode:04o}"),
        };
        map.insert(f[0].to_string(), v);
    }
    map
}

/// Full stat data per path from `find` (inode, type, mode, size, mtime), for stability checks.
fn stat_listing(dir: &Path) -> BTreeMap<String, String> {
    let out = sh(
        "find",
        [
            dir.as_os_str(),
            "-printf".as_ref(),
            "%P\\t%i %y %m %s %T@\\n".as_ref(),
        ],
    );
    out.assert_ok();
    out.stdout_str()
        .lines()
        .map(|l| {
            let (p, rest) = l.split_once('\t').expect("tab");
            (p.to_string(), rest.to_string())
        })
        .collect()
}

#[track_caller]
fn assert_no_diff(mount: &Path, extracted: &Path) {
    let out = sh(
        "diff",
        [
            "-r".as_ref(),
            "--no-dereference".as_ref(),
            // The workspace's own repository; a git tree can never contain a `.git` entry.
            "--exclude=.git".as_ref(),
            mount.as_os_str(),
            extracted.as_os_str(),
        ],
    );
    assert!(
        out.success() && out.stdout.is_empty(),
        "mount differs from git archive: {}",
        out.describe()
    );
}

/// Everything the mount must agree on with the extracted archive.
#[track_caller]
fn check_mount(label: &str, mount: &Path, extracted: &Path) {
    // 1. Content, directory structure and link targets.
    assert_no_diff(mount, extracted);

    // 2. Types, modes, sizes and link targets of every path.
    let want = find_listing(extracted);
    let got = find_listing(mount);
    assert_same_listing(
        &format!("{label}: find listing (git archive => mount)"),
        &want,
        &got,
    );

    // 3. The gitlink is an empty directory.
    assert_eq!(
        got.get("vendor/sub").map(String::as_str),
        Some("dir owner 700"),
        "{label}: gitlink vendor/sub"
    );

    // 4. Distinct paths have distinct inode numbers; stat twice gives the same ones.
    let stats = stat_listing(mount);
    let mut by_ino: HashMap<&str, Vec<&str>> = HashMap::new();
    for (p, s) in &stats {
        by_ino
            .entry(s.split(' ').next().unwrap())
            .or_default()
            .push(p);
    }
    let dups: Vec<_> = by_ino.values().filter(|v| v.len() > 1).collect();
    assert!(
        dups.is_empty(),
        "{label}: paths sharing an inode number: {dups:?}"
    );

    let files: Vec<String> = want
        .iter()
        .filter(|(_, v)| v.starts_with("file "))
        .map(|(k, _)| k.clone())
        .collect();
    let all: Vec<(String, u64)> = stats
        .iter()
        .map(|(p, s)| (p.clone(), s.split(' ').next().unwrap().parse().unwrap()))
        .collect();
    let (m, e, l) = (
        mount.to_path_buf(),
        extracted.to_path_buf(),
        label.to_string(),
    );
    with_timeout(
        &format!("{label}: in-process reads"),
        Duration::from_secs(60),
        move || read_checks(&l, &m, &e, &files, &all),
    );

    // 5. access(2) and statfs(2).
    let x = |p: &str| sh("test", ["-x".as_ref(), mount.join(p).as_os_str()]);
    x("bin/run.sh").assert_ok();
    x("README.md").assert_failed();
    sh(
        "test",
        ["-r".as_ref(), mount.join("data/random.bin").as_os_str()],
    )
    .assert_ok();
    sh("stat", ["-f".as_ref(), mount.as_os_str()]).assert_ok();
}

/// In-process reads through the mount (run under a watchdog).
fn read_checks(
    label: &str,
    mount: &Path,
    extracted: &Path,
    files: &[String],
    all: &[(String, u64)],
) {
    for rel in files {
        let first =
            fs::read(mount.join(rel)).unwrap_or_else(|e| panic!("{label}: read {rel}: {e}"));
        let second =
            fs::read(mount.join(rel)).unwrap_or_else(|e| panic!("{label}: reread {rel}: {e}"));
        let want = fs::read(extracted.join(rel)).unwrap();
        assert!(first == second, "{label}: {rel}: two reads differ");
        assert!(
            first == want,
            "{label}: {rel}: content differs from git archive"
        );
    }
    for (rel, ino) in all {
        let p = mount.join(rel);
        let a = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{label}: stat {rel}: {e}"));
        let b = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{label}: stat {rel}: {e}"));
        assert_eq!(
            a.ino(),
            b.ino(),
            "{label}: {rel}: inode changed between two stats"
        );
        assert_eq!(a.ino(), *ino, "{label}: {rel}: inode differs from find's");
        assert_eq!(
            (a.mode(), a.size(), a.mtime()),
            (b.mode(), b.size(), b.mtime()),
            "{label}: {rel}"
        );
    }
    // Following links inside the mount.
    assert_eq!(
        fs::read(mount.join("link-to-file")).unwrap(),
        fs::read(extracted.join("README.md")).unwrap(),
        "{label}: reading through link-to-file"
    );
    let names = |d: &Path| {
        let mut v: Vec<_> = fs::read_dir(d)
            .unwrap_or_else(|e| panic!("{label}: readdir {}: {e}", d.display()))
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(
        names(&mount.join("link-to-dir")),
        names(&extracted.join("a/b")),
        "{label}: link-to-dir"
    );
    assert!(
        names(&mount.join("vendor/sub")).is_empty(),
        "{label}: gitlink not empty"
    );
    let dangling = fs::metadata(mount.join("link-dangling"))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        dangling.kind(),
        std::io::ErrorKind::NotFound,
        "{label}: dangling link"
    );
}

/// Every kind of write succeeds in one workspace, is visible there, and changes neither a sibling
/// workspace of the same base nor the base itself.
#[track_caller]
fn check_writes_are_isolated(mount: &Path, sibling: &Path, extracted: &Path) {
    let m = mount.display().to_string();
    let attempts: &[&[&str]] = &[
        &["touch", &format!("{m}/newfile")],
        &[
            "sh",
            "-c",
            "echo x >> \"$1\"",
            "sh",
            &format!("{m}/README.md"),
        ],
        &[
            "sh",
            "-c",
            ": > \"$1\"",
            "sh",
            &format!("{m}/to-delete.txt"),
        ],
        &[
            "sh",
            "-c",
            "echo x > \"$1\"",
            "sh",
            &format!("{m}/a/new-in-dir"),
        ],
        &["mkdir", &format!("{m}/newdir")],
        &["rm", "-f", &format!("{m}/to-delete.txt")],
        &["rmdir", &format!("{m}/vendor/sub")],
        &["mv", &format!("{m}/a"), &format!("{m}/moved-a")],
        &["chmod", "600", &format!("{m}/README.md")],
        &["ln", "-s", "README.md", &format!("{m}/newlink")],
        &["ln", &format!("{m}/README.md"), &format!("{m}/hardlink")],
    ];
    for argv in attempts {
        let out = run(
            std::process::Command::new(argv[0]).args(&argv[1..]),
            Duration::from_secs(10),
        );
        assert!(
            out.success(),
            "write through the mount failed: {}",
            out.describe()
        );
    }
    let readme = fs::read_to_string(mount.join("README.md")).unwrap();
    assert!(readme.ends_with("x\n"), "appended byte missing: {readme:?}");
    assert_eq!(
        fs::read_to_string(mount.join("moved-a/new-in-dir")).unwrap(),
        "x\n"
    );
    assert!(!mount.join("a").exists() && !mount.join("to-delete.txt").exists());
    assert_eq!(
        fs::read_link(mount.join("newlink")).unwrap(),
        Path::new("README.md")
    );
    use std::os::unix::fs::MetadataExt;
    let (h, r) = (
        fs::metadata(mount.join("hardlink")).unwrap(),
        fs::metadata(mount.join("README.md")).unwrap(),
    );
    assert_eq!(
        (h.ino(), h.nlink()),
        (r.ino(), 2),
        "hardlink shares the inode"
    );
    assert_eq!(r.mode() & 0o777, 0o600);
    // The sibling of the same base sees none of it.
    assert_no_diff(sibling, extracted);
}

#[test]
fn two_refs_side_by_side_match_git_archive() {
    let src = tempfile::tempdir().unwrap();
    let src_base = src.path().canonicalize().unwrap();
    let repo = GitRepo::init(&src_base.join("upstream"));
    let (v1, v2) = build_repo(&repo);

    let ext1 = src_base.join("archive-v1");
    let ext2 = src_base.join("archive-v2");
    extract_archive(&repo.path, "v1", &ext1);
    extract_archive(&repo.path, "v2", &ext2);
    // Sanity: the two refs really differ, and the archive has the gitlink as an empty directory.
    assert_ne!(find_listing(&ext1), find_listing(&ext2));
    assert!(
        fs::read_dir(ext1.join("vendor/sub"))
            .unwrap()
            .next()
            .is_none()
    );

    let mut d = Daemon::start();
    d.cli_ok(["mirror", "add", PROJECT, &repo.file_url()]);

    let mirror = d.mirror(PROJECT);
    let mirror_before = tree_listing(&mirror);
    assert_eq!(
        fs::read_to_string(mirror.join(".git/HEAD")).ok().as_deref(),
        Some("ref: refs/heads/main\n"),
        "mirror is not a checkout of the default branch"
    );
    assert_eq!(
        fs::read_to_string(mirror.join("README.md")).ok().as_deref(),
        Some("hello from v2, which is longer\n"),
        "mirror work tree is not the default branch"
    );

    // Two refs side by side, plus the default branch.
    let opens = [
        ("t1", Some("v1"), &ext1),
        ("t2", Some("v2"), &ext2),
        ("t3", None, &ext2),
        ("t4", Some("v1"), &ext1),
    ];
    for (thread, rev, _) in &opens {
        let mut args = vec!["open", *thread, "--project", PROJECT];
        if let Some(r) = rev {
            args.extend(["--ref", *r]);
        }
        let stdout = d.cli_ok(&args);
        assert_eq!(
            stdout,
            format!("{}\n", d.mount(thread).display()),
            "`octofs open {thread}` must print exactly the mount path"
        );
    }
    let mounts: Vec<PathBuf> = opens.iter().map(|(t, _, _)| d.mount(t)).collect();
    wait_mounted(&mounts, Duration::from_secs(2));

    for (thread, _, ext) in &opens {
        check_mount(thread, &d.mount(thread), ext);
    }
    check_writes_are_isolated(&d.mount("t4"), &d.mount("t1"), &ext1);

    // Opening a mounted thread again prints the same path and does not stack a second mount.
    let again = d.cli_ok(["open", "t1", "--project", PROJECT, "--ref", "v1"]);
    assert_eq!(again, format!("{}\n", d.mount("t1").display()));
    let t1 = d.mount("t1");
    let count = mount_points().iter().filter(|p| **p == t1).count();
    assert_eq!(count, 1, "t1 mounted {count} times after a second open");

    // Listing commands.
    let list = d.cli_ok(["list"]);
    for t in ["t1", "t2", "t3"] {
        assert!(
            list.contains(t),
            "`octofs list` does not mention {t}:\n{list}"
        );
    }
    let mut strings = Vec::new();
    json_strings(
        &parse_json("list --json", &d.cli_ok(["list", "--json"])),
        &mut strings,
    );
    for t in ["t1", "t2", "t3", PROJECT] {
        assert!(
            strings.iter().any(|s| s == t),
            "`list --json` lacks {t:?}: {strings:?}"
        );
    }
    let mut strings = Vec::new();
    json_strings(
        &parse_json("status --json", &d.cli_ok(["status", "t1", "--json"])),
        &mut strings,
    );
    assert!(
        strings.iter().any(|s| s.contains(&v1[..7])),
        "`status t1 --json` does not show the base commit {v1}: {strings:?}"
    );
    assert!(
        !strings.iter().any(|s| s.contains(&v2[..12])),
        "{strings:?}"
    );

    // Inode numbers (and all other stat data) survive a daemon restart, which remounts the
    // workspaces that were mounted.
    let before: Vec<_> = mounts.iter().map(|m| stat_listing(m)).collect();
    d.stop();
    d.spawn();
    wait_mounted(&mounts, Duration::from_secs(10));
    for ((m, b), (thread, _, ext)) in mounts.iter().zip(&before).zip(&opens) {
        let after = stat_listing(m);
        assert_same_listing(
            &format!("{thread}: stat data across a daemon restart"),
            b,
            &after,
        );
        if *thread != "t4" {
            assert_no_diff(m, ext);
        }
    }
    let again = d.cli_ok(["open", "t2", "--project", PROJECT, "--ref", "v2"]);
    assert_eq!(again, format!("{}\n", d.mount("t2").display()));

    // The mirror is byte-identical after all of the above.
    assert_same_listing("mirror", &mirror_before, &tree_listing(&mirror));
}

/// The daemon's log is plain text (no colour codes in a file), and an ioctl nobody serves — the
/// `TCGETS` that `isatty` sends for every file a shell or editor opens — gets `ENOTTY` without a
/// warning in the log for each one (issue 32, item 8).
#[test]
fn the_log_is_plain_text_and_a_terminal_ioctl_is_answered_quietly() {
    let d = Daemon::start();
    add_project(&d, "p", &[("README.md", "# p\n", 0o644)]);
    let m = d.open_thread("t", &["--project", "p"]);
    let script = "import fcntl, sys, termios\n\
                  try:\n    fcntl.ioctl(open(sys.argv[1]), termios.TCGETS, bytes(64))\n    print('answered')\n\
                  except OSError as e:\n    print(e.errno)\n";
    let out = sh(
        "python3",
        ["-c", script, m.join("README.md").to_str().unwrap()],
    );
    // ENOTTY is 25 on Linux.
    assert_eq!(out.stdout_str().trim(), "25", "{}", out.describe());
    d.cli_ok(["release", "t"]);
    let log = d.log_text();
    assert!(log.contains("mounted"), "{log}");
    assert!(
        !log.contains('\x1b'),
        "colour codes in the log file:\n{log}"
    );
    assert!(!log.contains("Not Implemented"), "{log}");
}
