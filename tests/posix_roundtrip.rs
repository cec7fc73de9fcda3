//! Issue 10, invariant 4 ("nothing acknowledged is lost"): a release keeps the exact POSIX state of
//! a thread (docs/security.md), through real mounts:
//!
//! 1. [`release_and_open_keep_modes_owners_special_files_and_deep_paths`]: files 0600, a 0700
//!    directory, a setuid file, foreign owners, a fifo, a unix socket, a character device, empty
//!    directories, an xattr, a hard link, names that are not UTF-8, special files and directories
//!    below a path longer than `PATH_MAX`, and tracked files chmod'ed or chown'ed come back after
//!    snapshot → release → open exactly as `lstat` saw them (type, mode, owner, rdev, size,
//!    content); the snapshot's tree is still what `git add -A` makes (no special files, no empty
//!    directories, git's own modes); an unchanged state snapshots to the same commit, and a
//!    chmod alone makes a new one.
//! 2. [`a_missing_record_fails_the_resume_loudly`]: a record that cannot be read never lets a
//!    thread come back with wider permissions.
//! 3. [`nested_repositories_and_names_git_refuses_survive_release_fork_and_teleport`] (and
//!    its no-open twin, issue 30 item 2): a `git clone` of a dependency and a `git init` +
//!    commit in a subdirectory (committed, changed, staged and untracked files, other branches
//!    and tags, their own `.git`), a `git init` without a commit, and names git refuses in a
//!    tree (`.GIT`, `src/.Git`, a `.gitmodules` symlink, a non-UTF-8 name below `.GIT`) come
//!    back byte for byte (lstat of every path, nested `.git` included) after release + open, in
//!    a fork and in a teleported thread; `git status`, `git log --all` and `git for-each-ref`
//!    of each nested repository and the outer `git status` say what they said; the snapshot's
//!    tree is still what `git add -A` makes (gitlinks, no refused name); `status` and `diff`
//!    name what is kept beside it.
//! 4. [`new_files_with_odd_names_and_deep_paths_round_trip`] (ignored until the in-process
//!    ignore evaluation lands): new regular files whose names are not UTF-8 or whose paths are
//!    longer than `PATH_MAX` are in the snapshot and come back.

use crate::common;

use common::*;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(60);

/// A path component of 200 bytes; 24 of them make a path longer than `PATH_MAX` (4096).
fn deep_component(i: usize) -> Vec<u8> {
    let mut c = format!("level{i:02}-").into_bytes();
    c.resize(200, b'd');
    c
}

const DEPTH: usize = 24;

fn deep_path() -> Vec<u8> {
    let comps: Vec<Vec<u8>> = (0..DEPTH).map(deep_component).collect();
    comps.join(&b'/')
}

/// `/proc/self/fd/<fd>/<name>`: a short path to `name` in the directory `dir` is open on, however
/// deep that directory is.
fn at(dir: &File, name: &[u8]) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    if !name.is_empty() {
        p.push(OsStr::from_bytes(name));
    }
    p
}

/// The same for a child process (which has its own `/proc/self`).
fn at_for_child(dir: &File, name: &[u8]) -> PathBuf {
    let mut p = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        dir.as_raw_fd()
    ));
    p.push(OsStr::from_bytes(name));
    p
}

fn run_ok(cmd: &mut Command) {
    run(cmd, CMD_TIMEOUT).assert_ok();
}

fn getxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let p = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let n = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated; buf is writable for its length.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

/// Everything `lstat` says of every path of a workspace (`.git` excluded), walked by directory fd
/// so that no path is limited by `PATH_MAX`: type, mode, owner, rdev, size, content or link
/// target, the `user.note` xattr, and for hard-linked files the first path of the same inode.
fn lstat_listing(mount: &Path) -> BTreeMap<Vec<u8>, String> {
    fn walk(
        dir: &File,
        prefix: &[u8],
        out: &mut BTreeMap<Vec<u8>, String>,
        inodes: &mut BTreeMap<u64, Vec<u8>>,
    ) {
        let mut names: Vec<OsString> = fs::read_dir(at(dir, b""))
            .expect("read_dir")
            .map(|e| e.expect("dir entry").file_name())
            .collect();
        names.sort();
        for name in names {
            let name = name.into_vec();
            if prefix.is_empty() && name == b".git" {
                continue;
            }
            let path = if prefix.is_empty() {
                name.clone()
            } else {
                [prefix, b"/", &name].concat()
            };
            let p = at(dir, &name);
            let m = fs::symlink_metadata(&p).expect("lstat");
            let ft = m.file_type();
            use std::os::unix::fs::FileTypeExt;
            let kind = if ft.is_dir() {
                "dir"
            } else if ft.is_file() {
                "file"
            } else if ft.is_symlink() {
                "symlink"
            } else if ft.is_fifo() {
                "fifo"
            } else if ft.is_socket() {
                "socket"
            } else if ft.is_char_device() {
                "char"
            } else if ft.is_block_device() {
                "block"
            } else {
                "other"
            };
            let what = if ft.is_file() {
                let bytes = fs::read(&p).expect("read");
                let link = if m.nlink() > 1 {
                    let first = inodes.entry(m.ino()).or_insert_with(|| path.clone());
                    format!(" link-of={}", String::from_utf8_lossy(first))
                } else {
                    String::new()
                };
                format!("{:?}{link}", String::from_utf8_lossy(&bytes))
            } else if ft.is_symlink() {
                format!(
                    "-> {:?}",
                    fs::read_link(&p).expect("readlink").into_os_string()
                )
            } else {
                String::new()
            };
            let size = if ft.is_dir() { 0 } else { m.size() };
            let xattr = getxattr(&p, "user.note")
                .map(|v| format!(" user.note={v:?}"))
                .unwrap_or_default();
            out.insert(
                path.clone(),
                format!(
                    "{kind} mode={:o} uid={} gid={} rdev={} size={size} {what}{xattr}",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid(),
                    m.rdev()
                ),
            );
            if ft.is_dir() {
                let sub = File::open(&p).expect("open dir");
                walk(&sub, &path, out, inodes);
            }
        }
    }
    let mut out = BTreeMap::new();
    let root = File::open(mount).expect("open the mount");
    walk(&root, b"", &mut out, &mut BTreeMap::new());
    out
}

fn show(m: &BTreeMap<Vec<u8>, String>) -> String {
    m.iter()
        .map(|(k, v)| {
            let k = String::from_utf8_lossy(k);
            let k = if k.len() > 80 {
                format!("…{}", &k[k.len() - 60..])
            } else {
                k.to_string()
            };
            format!("  {k}: {v}\n")
        })
        .collect()
}

#[track_caller]
fn assert_same(what: &str, before: &BTreeMap<Vec<u8>, String>, after: &BTreeMap<Vec<u8>, String>) {
    if before == after {
        return;
    }
    let mut diff = String::new();
    for (k, v) in before {
        match after.get(k) {
            Some(w) if w == v => {}
            Some(w) => diff.push_str(&format!(
                "  changed {}: {v}  =>  {w}\n",
                String::from_utf8_lossy(k)
            )),
            None => diff.push_str(&format!("  lost {}: {v}\n", String::from_utf8_lossy(k))),
        }
    }
    for (k, w) in after {
        if !before.contains_key(k) {
            diff.push_str(&format!("  new {}: {w}\n", String::from_utf8_lossy(k)));
        }
    }
    panic!("{what}:\n{diff}");
}

fn project(d: &Daemon) -> GitRepo {
    let repo = GitRepo::init(&d.base.join("up"));
    repo.write("a.txt", "alpha\n");
    repo.write("b.txt", "bravo\n");
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.write_exec("run.sh", "#!/bin/sh\n");
    repo.write("caf\u{e9}-tracked.txt", "tracked\n");
    repo.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    repo
}

/// `git ls-tree -r` of a commit in the mirror: (mode, path) of every blob, symlink and gitlink.
fn tree_entries(mirror: &Path, commit: &str) -> Vec<(String, Vec<u8>)> {
    let out = run(
        git_command(mirror, DATE1).args(["ls-tree", "-r", "-z", "--full-tree", commit]),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let mut v: Vec<(String, Vec<u8>)> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let tab = l.iter().position(|b| *b == b'\t').expect("tab");
            let mode = String::from_utf8_lossy(&l[..6]).to_string();
            (mode, l[tab + 1..].to_vec())
        })
        .collect();
    v.sort();
    v
}

/// Builds every kind of POSIX state git drops in workspace `m`.
fn make_posix_state(m: &Path) {
    let chmod = |p: &Path, mode: u32| {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod")
    };
    fs::write(m.join("secret.txt"), "secret\n").unwrap();
    chmod(&m.join("secret.txt"), 0o600);
    lsetxattr(&m.join("secret.txt"), "user.note", b"kept \xff");
    fs::create_dir(m.join("private")).unwrap();
    fs::write(m.join("private/f.txt"), "in private\n").unwrap();
    chmod(&m.join("private"), 0o700);
    fs::write(m.join("suid.sh"), "#!/bin/sh\n").unwrap();
    chmod(&m.join("suid.sh"), 0o4755);
    fs::write(m.join("other.txt"), "someone else's\n").unwrap();
    std::os::unix::fs::chown(m.join("other.txt"), Some(4321), Some(8765)).unwrap();
    std::os::unix::fs::symlink("a.txt", m.join("their-link")).unwrap();
    std::os::unix::fs::lchown(m.join("their-link"), Some(4321), Some(8765)).unwrap();
    run_ok(
        Command::new("mkfifo")
            .args(["-m", "640"])
            .arg(m.join("pipe")),
    );
    drop(std::os::unix::net::UnixListener::bind(m.join("sock")).expect("bind a socket"));
    run_ok(
        Command::new("mknod")
            .args(["-m", "600"])
            .arg(m.join("null-dev"))
            .args(["c", "1", "3"]),
    );
    fs::create_dir(m.join("empty")).unwrap();
    fs::create_dir_all(m.join("a/b/c")).unwrap();
    chmod(&m.join("a"), 0o750);
    chmod(&m.join("a/b/c"), 0o1777);
    fs::write(m.join("h1"), "linked\n").unwrap();
    fs::hard_link(m.join("h1"), m.join("h2")).unwrap();
    // Names that are not UTF-8.
    let odd = OsStr::from_bytes(b"caf\xe9");
    fs::create_dir(m.join("dir7")).unwrap();
    fs::write(m.join("dir7").join(odd), "latin-1 name\n").unwrap();
    chmod(&m.join("dir7").join(odd), 0o600);
    run_ok(Command::new("mkfifo").arg(m.join(OsStr::from_bytes(b"fifo-\xff\xfe"))));
    // Tracked files and directories with other modes and owners.
    chmod(&m.join("a.txt"), 0o600);
    std::os::unix::fs::chown(m.join("b.txt"), Some(4321), None).unwrap();
    chmod(&m.join("src"), 0o750);
    chmod(&m.join("run.sh"), 0o700);
    chmod(&m.join("caf\u{e9}-tracked.txt"), 0o640);
    // Below a path longer than PATH_MAX: a restricted directory, a fifo, an empty directory.
    let mut dir = File::open(m).unwrap();
    for i in 0..DEPTH {
        let c = deep_component(i);
        fs::create_dir(at(&dir, &c)).expect("mkdir deep");
        dir = File::open(at(&dir, &c)).expect("open deep");
    }
    assert!(deep_path().len() > 4096);
    fs::set_permissions(at(&dir, b""), fs::Permissions::from_mode(0o711)).unwrap();
    run_ok(Command::new("mkfifo").arg(at_for_child(&dir, b"deep-fifo")));
    fs::create_dir(at(&dir, b"deep-empty")).unwrap();
    fs::set_permissions(at(&dir, b"deep-empty"), fs::Permissions::from_mode(0o700)).unwrap();
}

#[test]
fn release_and_open_keep_modes_owners_special_files_and_deep_paths() {
    let d = Daemon::start();
    let _repo = project(&d);
    let m = PathBuf::from(d.cli_ok(["open", "t1", "--project", "p"]).trim());
    let before = with_timeout("make the POSIX state", FS_TIMEOUT, {
        let m = m.clone();
        move || {
            make_posix_state(&m);
            lstat_listing(&m)
        }
    });
    let deep = deep_path();
    assert!(before.contains_key(&[deep.as_slice(), b"/deep-fifo"].concat()));

    let s1 = d.cli_ok(["snapshot", "t1"]).trim().to_string();
    // The snapshot's tree is what `git add -A` makes of the workspace: regular files and symlinks
    // with git's two file modes, no special files, no empty directories.
    let mirror = d.mirror("p");
    let mut want: Vec<(String, Vec<u8>)> = [
        ("100644", &b"a.txt"[..]),
        ("100644", b"b.txt"),
        ("100644", "caf\u{e9}-tracked.txt".as_bytes()),
        ("100644", b"dir7/caf\xe9"),
        ("100644", b"h1"),
        ("100644", b"h2"),
        ("100644", b"other.txt"),
        ("100644", b"private/f.txt"),
        ("100755", b"run.sh"),
        ("100644", b"secret.txt"),
        ("100644", b"src/lib.rs"),
        ("100755", b"suid.sh"),
        ("120000", b"their-link"),
    ]
    .iter()
    .map(|(m, p)| (m.to_string(), p.to_vec()))
    .collect();
    want.sort();
    assert_eq!(
        tree_entries(&mirror, &s1),
        want,
        "the snapshot's tree is not what git add -A makes"
    );

    d.cli_ok(["release", "t1"]);
    assert!(!mount_points().contains(&m), "released but still mounted");
    let m2 = PathBuf::from(d.cli_ok(["open", "t1"]).trim());
    assert_eq!(m2, m);
    let after = with_timeout("list the resumed workspace", FS_TIMEOUT, {
        let m = m.clone();
        move || lstat_listing(&m)
    });
    println!("before:\n{}", show(&before));
    assert_same("after release + open", &before, &after);

    // Nothing changed: the same snapshot. A chmod alone is a change (same tree, new record).
    let s2 = d.cli_ok(["snapshot", "t1"]).trim().to_string();
    assert_eq!(s2, s1, "an unchanged resumed workspace made a new snapshot");
    with_timeout("chmod", FS_TIMEOUT, {
        let m = m.clone();
        move || fs::set_permissions(m.join("secret.txt"), fs::Permissions::from_mode(0o640))
    })
    .unwrap();
    let s3 = d.cli_ok(["snapshot", "t1"]).trim().to_string();
    assert_ne!(s3, s1, "a chmod was not saved");
    assert_eq!(
        g_out(&mirror, &["rev-parse", &format!("{s3}^{{tree}}")]),
        g_out(&mirror, &["rev-parse", &format!("{s1}^{{tree}}")]),
        "a chmod changed the snapshot's tree"
    );
    let before = with_timeout("list", FS_TIMEOUT, {
        let m = m.clone();
        move || lstat_listing(&m)
    });
    d.cli_ok(["release", "t1"]);
    d.cli_ok(["open", "t1"]);
    let after = with_timeout("list", FS_TIMEOUT, {
        let m = m.clone();
        move || lstat_listing(&m)
    });
    assert_same("after chmod, release + open", &before, &after);
    d.cli_ok(["release", "t1"]);
}

fn g_out(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

#[test]
fn a_missing_record_fails_the_resume_loudly() {
    let d = Daemon::start();
    let _repo = project(&d);
    let m = PathBuf::from(d.cli_ok(["open", "t2", "--project", "p"]).trim());
    with_timeout("chmod", FS_TIMEOUT, {
        let m = m.clone();
        move || {
            fs::write(m.join("secret.txt"), "secret\n").unwrap();
            fs::set_permissions(m.join("secret.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        }
    });
    d.cli_ok(["release", "t2"]);
    let mirror = d.mirror("p");
    let snap = g_out(&mirror, &["rev-parse", "refs/octomate/threads/t2"]);
    let msg = g_out(&mirror, &["log", "-1", "--format=%B", &snap]);
    let blob = msg
        .lines()
        .find_map(|l| l.strip_prefix("Octofs-Posix: "))
        .unwrap_or_else(|| panic!("the snapshot names no POSIX record: {msg}"))
        .trim()
        .to_string();
    let obj = mirror
        .join(".git/objects")
        .join(&blob[..2])
        .join(&blob[2..]);
    fs::remove_file(&obj).expect("remove the record's loose object");
    let out = d.cli(["open", "t2"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains(&blob) && out.stderr_str().contains("missing"),
        "the error does not name the missing record: {}",
        out.describe()
    );
    assert!(
        !mount_points().contains(&m),
        "a resume without its record was mounted"
    );
}

#[test]
fn new_files_with_odd_names_and_deep_paths_round_trip() {
    let d = Daemon::start();
    let _repo = project(&d);
    let m = PathBuf::from(d.cli_ok(["open", "t3", "--project", "p"]).trim());
    let before = with_timeout("make files", FS_TIMEOUT, {
        let m = m.clone();
        move || {
            fs::write(m.join(OsStr::from_bytes(b"caf\xe9")), "root latin-1\n").unwrap();
            let mut dir = File::open(&m).unwrap();
            for i in 0..DEPTH {
                let c = deep_component(i);
                fs::create_dir(at(&dir, &c)).expect("mkdir deep");
                dir = File::open(at(&dir, &c)).expect("open deep");
            }
            fs::write(at(&dir, b"deep.txt"), "deep\n").unwrap();
            fs::set_permissions(at(&dir, b"deep.txt"), fs::Permissions::from_mode(0o600)).unwrap();
            lstat_listing(&m)
        }
    });
    let s = d.cli_ok(["snapshot", "t3"]).trim().to_string();
    let names: Vec<Vec<u8>> = tree_entries(&d.mirror("p"), &s)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert!(
        names.contains(&b"caf\xe9".to_vec()),
        "caf\\xe9 not in the snapshot"
    );
    assert!(
        names.contains(&[deep_path().as_slice(), b"/deep.txt"].concat()),
        "the deep file is not in the snapshot"
    );
    d.cli_ok(["release", "t3"]);
    d.cli_ok(["open", "t3"]);
    let after = with_timeout("list", FS_TIMEOUT, {
        let m = m.clone();
        move || lstat_listing(&m)
    });
    assert_same("after release + open", &before, &after);
    d.cli_ok(["release", "t3"]);
}

/// What git says of the repository at `dir`: status (untracked files listed), every ref's log and
/// every ref.
fn repo_says(dir: &Path) -> String {
    let q = |args: &[&str]| {
        let out = run(git_command(dir, DATE2).args(args), CMD_TIMEOUT);
        out.assert_ok();
        out.stdout_str()
    };
    format!(
        "status:\n{}log:\n{}refs:\n{}",
        q(&["status", "--porcelain", "--untracked-files=all"]),
        q(&["log", "--all", "--format=%H %s"]),
        q(&["for-each-ref"])
    )
}

/// `repo_says` of the workspace at `m` and of each nested repository in it.
fn all_repos_say(m: &Path) -> String {
    let outer = run(
        git_command(m, DATE2).args(["status", "--porcelain"]),
        CMD_TIMEOUT,
    );
    outer.assert_ok();
    let mut out = format!("outer status:\n{}", outer.stdout_str());
    for sub in ["vend", "tools/sub"] {
        out.push_str(&format!("--- {sub}\n{}", repo_says(&m.join(sub))));
    }
    out
}

/// Builds nested repositories and names git refuses in workspace `m` (`upstream`: the URL of a
/// repository to clone).
fn make_nested_state(m: &Path, upstream: &str) {
    let vend = m.join("vend");
    git(m, ["clone", "-q", upstream, "vend"]);
    fs::write(vend.join("a.txt"), "changed in the clone\n").unwrap();
    fs::write(vend.join("staged.txt"), "staged\n").unwrap();
    git(&vend, ["add", "staged.txt"]);
    fs::write(vend.join("untracked.txt"), "untracked\n").unwrap();
    git(&vend, ["branch", "side"]);
    git(&vend, ["tag", "v1"]);
    let sub = m.join("tools/sub");
    fs::create_dir_all(&sub).unwrap();
    git(&sub, ["init", "-q"]);
    fs::write(sub.join("x.txt"), "one\n").unwrap();
    git(&sub, ["add", "x.txt"]);
    git(&sub, ["commit", "-q", "-m", "first"]);
    fs::write(sub.join("x.txt"), "two\n").unwrap();
    fs::write(sub.join("new.txt"), "new\n").unwrap();
    chmod(&sub.join("new.txt"), 0o600);
    let fresh = m.join("fresh");
    fs::create_dir(&fresh).unwrap();
    git(&fresh, ["init", "-q"]);
    fs::write(fresh.join("wip.txt"), "no commit yet\n").unwrap();
    // Names git refuses in a tree.
    fs::create_dir(m.join(".GIT")).unwrap();
    fs::write(m.join(".GIT/config"), "[core]\n").unwrap();
    chmod(&m.join(".GIT/config"), 0o600);
    fs::write(
        m.join(".GIT").join(OsStr::from_bytes(b"caf\xe9")),
        b"\xff\x00",
    )
    .unwrap();
    fs::create_dir(m.join("src/.Git")).unwrap();
    fs::write(m.join("src/.Git/HEAD"), "ref: refs/heads/x\n").unwrap();
    std::os::unix::fs::symlink("a.txt", m.join(".gitmodules")).unwrap();
}

/// Issue 30 item 2 in one I/O mode (`io`: extra arguments of the first `open`).
fn nested_and_refused_round_trip(io: &[&str]) {
    let d = Daemon::start();
    let upstream = project(&d);
    let mut args = vec!["--project", "p"];
    args.extend_from_slice(io);
    let m = d.open_thread("t1", &args);
    let listing = |m: &Path| {
        with_timeout("list the workspace", FS_TIMEOUT, {
            let m = m.to_path_buf();
            move || lstat_listing(&m)
        })
    };
    with_timeout("make nested repositories", FS_TIMEOUT, {
        let (m, up) = (m.clone(), upstream.file_url());
        move || make_nested_state(&m, &up)
    });
    let says = all_repos_say(&m);
    assert!(
        says.contains("?? vend/") && says.contains("?? .GIT/"),
        "{says}"
    );
    let before = listing(&m);
    assert!(
        before.contains_key(&b"vend/.git/HEAD"[..]),
        "{}",
        show(&before)
    );

    let s1 = d.snapshot_id("t1");
    // The tree is what `git add -A` makes: the nested repositories with a commit as gitlinks,
    // no refused name, nothing of the repository without a commit.
    let entries = tree_entries(&d.mirror("p"), &s1);
    for (mode, path) in [("160000", &b"vend"[..]), ("160000", b"tools/sub")] {
        assert!(
            entries.iter().any(|(m, p)| m == mode && p == path),
            "no gitlink {}: {entries:?}",
            String::from_utf8_lossy(path)
        );
    }
    for (_, p) in &entries {
        let p = String::from_utf8_lossy(p);
        assert!(
            !p.contains(".GIT")
                && !p.contains(".Git")
                && !p.starts_with("fresh")
                && p != ".gitmodules",
            "{p} is in the snapshot's tree"
        );
    }
    let status = d.cli_ok(["status", "t1"]);
    let kept = status
        .lines()
        .find(|l| l.starts_with("kept:"))
        .unwrap_or_else(|| panic!("status names nothing kept:\n{status}"));
    for name in [
        "vend",
        "tools/sub",
        "fresh",
        ".GIT",
        "src/.Git",
        ".gitmodules",
    ] {
        assert!(kept.contains(name), "{kept}");
    }
    let diff = d.cli(["diff", "t1"]);
    diff.assert_ok();
    assert!(
        diff.stderr_str().contains("nested repositories") && diff.stderr_str().contains(".GIT"),
        "diff does not say what is kept: {}",
        diff.stderr_str()
    );

    d.cli_ok(["release", "t1"]);
    let released = d.cli_ok(["status", "t1"]);
    assert!(
        released.contains("kept:") && released.contains("vend"),
        "{released}"
    );
    d.open_thread("t1", &[]);
    let after = listing(&m);
    assert_same("after release + open", &before, &after);
    // Unchanged: the same snapshot (before git refreshes an index).
    assert_eq!(
        d.snapshot_id("t1"),
        s1,
        "an unchanged resumed workspace made a new snapshot"
    );
    assert_eq!(
        all_repos_say(&m),
        says,
        "git says otherwise after release + open"
    );

    // A fork and a teleported thread get the same state (git's answers above may have refreshed
    // an index: the source is listed again).
    let now = listing(&m);
    d.cli_ok(["fork", "t1", "t2"]);
    let m2 = d.mount("t2");
    assert_same("in the fork", &now, &listing(&m2));
    assert_eq!(all_repos_say(&m2), says, "git says otherwise in the fork");
    let now = listing(&m2);
    d.cli_ok(["teleport", "t2", "t3"]);
    let m3 = d.mount("t3");
    assert_same("in the teleported thread", &now, &listing(&m3));
    assert_eq!(
        all_repos_say(&m3),
        says,
        "git says otherwise after teleport"
    );
    for t in ["t1", "t3"] {
        d.cli_ok(["release", t]);
    }
}

#[test]
fn nested_repositories_and_names_git_refuses_survive_release_fork_and_teleport() {
    nested_and_refused_round_trip(&[]);
}

#[test]
fn nested_repositories_and_names_git_refuses_survive_in_no_open_mode() {
    nested_and_refused_round_trip(&["--io", "no-open"]);
}
