//! No-open mode (`octofs serve --io no-open`) on a real mount: `open` and `flush` answer `ENOSYS`,
//! so the kernel opens and closes files without a request and serves reads and writes by inode
//! (`src/fs/inode_io.rs`). Each test names the wrong implementation it catches.

use crate::common;

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::op_count as count;
use common::*;
use serde_json::Value;

const N: u64 = 20;

/// A daemon in no-open mode with project `p` (files `f0.txt`..`f19.txt`, `dir/c.txt`,
/// `src/changed.txt`) and workspace `t` mounted.
fn no_open_workspace() -> (Daemon, GitRepo, std::path::PathBuf) {
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--io", "no-open"]);
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..N {
        repo.write(&format!("f{i}.txt"), format!("file {i}\n"));
    }
    repo.write("dir/c.txt", "see\n");
    repo.write("src/changed.txt", "old\n");
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    let mnt = d.open_thread("t", &["--project", "p"]);
    (d, repo, mnt)
}

fn stats(d: &Daemon) -> Value {
    parse_json("stats --json", &d.cli_ok(["stats", "t", "--json"]))
}

fn read_all(mnt: &Path) -> Vec<String> {
    (0..N)
        .map(|i| fs::read_to_string(mnt.join(format!("f{i}.txt"))).expect("read"))
        .collect()
}

fn show(d: &Daemon, rev_path: &str) -> String {
    git(&d.mirror("p"), ["show", rev_path])
        .trim_end()
        .to_string()
}

/// The paths git's fsmonitor hook reports since `token`, and the new token.
fn fsmonitor(d: &Daemon, token: &str) -> (String, Vec<String>) {
    let out = d.cli(["fsmonitor", "t", "2", token]);
    out.assert_ok();
    let text = out.stdout_str();
    let mut parts = text.split('\0').filter(|s| !s.is_empty());
    let token = parts.next().expect("a token").to_string();
    (token, parts.map(str::to_string).collect())
}

/// Catches: answering `open` (OPEN/RELEASE per open), answering FLUSH (a request per close), a
/// mode not recorded in `status`, or passthrough asked for alongside no-open.
#[test]
fn open_read_close_of_a_base_file_sends_no_request() {
    let (d, _repo, mnt) = no_open_workspace();
    let st = parse_json("status", &d.cli_ok(["status", "t", "--json"]));
    assert_eq!(st["io"], "no-open", "{st}");
    assert_eq!(st["passthrough"], false, "{st}");
    assert!(d.cli_ok(["status", "t"]).contains("io:            no-open"));

    // The connection's first open and close are asked (answered ENOSYS), never again.
    assert_eq!(fs::read_to_string(mnt.join("dir/c.txt")).unwrap(), "see\n");
    let cold = read_all(&mnt);
    // The cold reads marked atime stale (READ does): the next fstat of each asks once.
    read_all(&mnt);
    let s0 = stats(&d);
    let warm = read_all(&mnt);
    assert_eq!(cold, warm);
    assert_eq!(warm[7], "file 7\n");
    std::thread::sleep(Duration::from_millis(200));
    let s1 = stats(&d);
    for op in ["OPEN", "RELEASE", "FLUSH", "READ", "GETATTR", "LOOKUP"] {
        assert_eq!(
            count(&s1, op),
            count(&s0, op),
            "{op}: {N} warm open+read+close sent requests: {s1}"
        );
    }
    assert!(count(&s1, "OPEN") <= 1, "{s1}");
    assert!(count(&s1, "FLUSH") <= 1, "{s1}");
    assert_eq!(s1["total"]["passthrough_opens"], 0);
    assert!(s1["total"]["bytes_read"].as_u64().unwrap() >= 7 * N);
}

/// Catches: writes served by handle (EBADF with `fh` 0), no copy-up at the first WRITE (the base
/// content is read-only), and writer accounting lost (an incremental snapshot after the first one
/// would miss a write that no journal entry names).
#[test]
fn writes_to_a_base_file_copy_it_up_into_the_next_snapshot() {
    let (d, _repo, mnt) = no_open_workspace();
    let first = d.snapshot_id("t");
    assert_eq!(show(&d, &format!("{first}:f1.txt")), "file 1");

    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(mnt.join("f1.txt"))
        .expect("open for append");
    f.write_all(b"more\n").expect("append");
    // Taken while the file is still open for writing.
    let second = d.snapshot_id("t");
    assert_eq!(show(&d, &format!("{second}:f1.txt")), "file 1\nmore");
    f.write_all(b"again\n").expect("append");
    drop(f);
    assert_eq!(
        fs::read_to_string(mnt.join("f1.txt")).unwrap(),
        "file 1\nmore\nagain\n"
    );
    let third = d.snapshot_id("t");
    assert_eq!(show(&d, &format!("{third}:f1.txt")), "file 1\nmore\nagain");

    // Written again once the writer went idle (released): still seen.
    std::thread::sleep(Duration::from_millis(600));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("f1.txt"))
        .expect("open for write");
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(b"FILE").expect("overwrite");
    drop(f);
    let fourth = d.snapshot_id("t");
    assert_eq!(show(&d, &format!("{fourth}:f1.txt")), "FILE 1\nmore\nagain");
    let status = git(&mnt, ["status", "--porcelain"]);
    assert_eq!(status.trim(), "M f1.txt", "{status}");
    assert_eq!(fs::read_to_string(mnt.join("f2.txt")).unwrap(), "file 2\n");
}

/// Catches: a CREATE answered with a handle (no RELEASE ever frees it: the file stays "open for
/// writing" for good, so fsmonitor reports it forever), and `O_TRUNC` lost (`FUSE_ATOMIC_O_TRUNC`
/// requested with no-open: the kernel leaves the truncate to an OPEN it never sends).
#[test]
fn create_write_reopen_and_truncate() {
    let (d, _repo, mnt) = no_open_workspace();
    let (t0, _) = fsmonitor(&d, "octofs:none");
    let path = mnt.join("new.txt");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .expect("create");
    f.write_all(b"hello\n").expect("write");
    drop(f);
    assert_eq!(fs::read_to_string(&path).unwrap(), "hello\n");
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    f.write_all(b"world\n").unwrap();
    drop(f);
    assert_eq!(fs::read_to_string(&path).unwrap(), "hello\nworld\n");
    assert_eq!(fs::metadata(&path).unwrap().len(), 12);
    let (t1, changed) = fsmonitor(&d, &t0);
    assert!(changed.iter().any(|p| p == "new.txt"), "{changed:?}");

    // O_TRUNC of a base file and of the new one, without writing.
    for name in ["f3.txt", "new.txt"] {
        let f = fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(mnt.join(name))
            .expect("open O_TRUNC");
        drop(f);
        assert_eq!(fs::metadata(mnt.join(name)).unwrap().len(), 0, "{name}");
        assert_eq!(fs::read(mnt.join(name)).unwrap(), b"", "{name}");
    }
    // O_RDONLY|O_TRUNC truncates too on Linux.
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_TRUNC)
        .open(mnt.join("f4.txt"))
        .expect("open O_RDONLY|O_TRUNC");
    drop(f);
    assert_eq!(fs::read(mnt.join("f4.txt")).unwrap(), b"");
    let snap = d.snapshot_id("t");
    assert_eq!(show(&d, &format!("{snap}:f3.txt")), "");
    assert_eq!(show(&d, &format!("{snap}:new.txt")), "");

    // Once nothing was written for a while, no file counts as open for writing.
    let (mut token, _) = fsmonitor(&d, &t1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let (next, changed) = fsmonitor(&d, &token);
        if changed.is_empty() {
            break;
        }
        token = next;
        assert!(
            Instant::now() < deadline,
            "still reported as being written 5 s after the last write: {changed:?}"
        );
    }
}

/// Catches: the data of an unlinked file dropped while the kernel still has it open (the inode's
/// held file released at unlink instead of when the kernel forgets it), and rename losing the
/// held content.
#[test]
fn unlinked_and_renamed_files_keep_their_content() {
    let (d, _repo, mnt) = no_open_workspace();
    // A base file open, unlinked, still readable.
    let mut base = fs::File::open(mnt.join("f5.txt")).unwrap();
    fs::remove_file(mnt.join("f5.txt")).unwrap();
    let mut s = String::new();
    base.read_to_string(&mut s).unwrap();
    assert_eq!(s, "file 5\n");

    // A written file open, unlinked, written and read through its descriptor.
    let mut w = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(mnt.join("tmp.txt"))
        .unwrap();
    w.write_all(b"first\n").unwrap();
    fs::remove_file(mnt.join("tmp.txt")).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    w.write_all(b"second\n").unwrap();
    w.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    w.read_to_string(&mut s).unwrap();
    assert_eq!(s, "first\nsecond\n");
    drop(w);
    assert!(!mnt.join("tmp.txt").exists());

    // Rename over a base file; the old name's reader keeps what it opened.
    fs::write(mnt.join("g.txt"), "gee\n").unwrap();
    let mut old = fs::File::open(mnt.join("f6.txt")).unwrap();
    fs::rename(mnt.join("g.txt"), mnt.join("f6.txt")).unwrap();
    let mut s = String::new();
    old.read_to_string(&mut s).unwrap();
    assert_eq!(s, "file 6\n");
    assert_eq!(fs::read_to_string(mnt.join("f6.txt")).unwrap(), "gee\n");
    fs::rename(mnt.join("dir/c.txt"), mnt.join("c2.txt")).unwrap();
    assert_eq!(fs::read_to_string(mnt.join("c2.txt")).unwrap(), "see\n");
    let snap = d.snapshot_id("t");
    assert_eq!(show(&d, &format!("{snap}:f6.txt")), "gee");
    assert_eq!(show(&d, &format!("{snap}:c2.txt")), "see");
    assert!(!git_out_ok(&d, &format!("{snap}:f5.txt")));
    assert!(!git_out_ok(&d, &format!("{snap}:dir/c.txt")));
}

fn git_out_ok(d: &Daemon, rev_path: &str) -> bool {
    run(
        git_command(&d.mirror("p"), DATE1).args(["cat-file", "-e", rev_path]),
        CMD_TIMEOUT,
    )
    .success()
}

/// Catches: a page cache or held file not dropped when the daemon changes a file behind the
/// kernel (a resync): the old content would be read.
#[test]
fn a_file_the_daemon_changed_is_read_fresh() {
    let (d, repo, mnt) = no_open_workspace();
    let changed = mnt.join("src/changed.txt");
    assert_eq!(fs::read_to_string(&changed).unwrap(), "old\n");
    // Held open across the resync, as an editor would.
    let kept = fs::File::open(&changed).unwrap();
    repo.write("src/changed.txt", "new content\n");
    repo.write("f0.txt", "file 0 changed upstream\n");
    repo.commit_all("second", DATE2);
    d.cli_ok(["mirror", "sync", "p"]);
    let out = d.cli(["resync", "t", "--role", "developer", "--json"]);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(
        fs::read_to_string(&changed).unwrap(),
        "new content\n",
        "a resync's change read stale"
    );
    assert_eq!(
        fs::read_to_string(mnt.join("f0.txt")).unwrap(),
        "file 0 changed upstream\n"
    );
    assert_eq!(fs::read_to_string(mnt.join("f2.txt")).unwrap(), "file 2\n");
    drop(kept);
    // Release and resume: the mode and the content stay.
    d.cli_ok(["release", "t"]);
    let mnt = d.open_thread("t", &[]);
    let st = parse_json("status", &d.cli_ok(["status", "t", "--json"]));
    assert_eq!(st["io"], "no-open", "{st}");
    assert_eq!(
        fs::read_to_string(mnt.join("src/changed.txt")).unwrap(),
        "new content\n"
    );
    d.cli_ok(["release", "t"]);
}

fn open_flags(path: &Path, flags: i32) -> std::io::Result<fs::File> {
    let mut o = fs::OpenOptions::new();
    o.custom_flags(flags & !libc::O_ACCMODE);
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    o.open(path)
}

/// Catches: a running program truncated (with atomic `O_TRUNC` an `O_RDONLY|O_TRUNC` open would be
/// answered without the kernel's check; here the kernel truncates with SETATTR after checking), and
/// an exec of a file written in the mount failing (a writer's file held so that exec sees it busy,
/// or content read through a stale page cache).
#[test]
fn exec_and_etxtbsy() {
    let (_d, _repo, mnt) = no_open_workspace();
    let which = sh("sh", ["-c", "command -v sleep"]);
    let program = fs::read(which.stdout_str().trim()).expect("read the sleep binary");
    for round in 0..5 {
        let path = mnt.join(format!("prog-{round}"));
        fs::write(&path, &program).expect("copy the program in");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut child = spawn_written_program(Command::new(&path).arg("30"));
        for flags in [
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_TRUNC,
        ] {
            let err = open_flags(&path, flags).expect_err("a running program opened to truncate");
            assert_eq!(
                err.raw_os_error(),
                Some(libc::ETXTBSY),
                "round {round}, flags {flags:#x}: {err}"
            );
        }
        assert_eq!(fs::metadata(&path).unwrap().len(), program.len() as u64);
        std::thread::sleep(Duration::from_millis(20));
        assert!(child.try_wait().expect("wait").is_none(), "round {round}");
        child.kill().expect("kill");
        child.wait().expect("reap");
        drop(open_flags(&path, libc::O_RDONLY | libc::O_TRUNC).expect("truncate after exit"));
        assert_eq!(fs::metadata(&path).unwrap().len(), 0, "round {round}");
        fs::remove_file(&path).expect("unlink");
    }
    // A script written in the mount runs.
    let script = mnt.join("run.sh");
    fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let out = run(&mut Command::new(&script), CMD_TIMEOUT);
    out.assert_ok();
    assert_eq!(out.stdout_str(), "ran\n");
}

/// The mode of one thread (`open --io`) in a daemon whose default is handles. Catches: the flag
/// ignored (the thread's warm open+read+close would send OPEN/RELEASE), the mode lost on release
/// and resume or on a daemon restart (`stop` then start remounts from the record), the other
/// threads of the daemon switched too, and a mounted thread's mode changed under its processes (or
/// its record changed by the refused open).
#[test]
fn one_thread_runs_in_no_open_in_a_daemon_of_handles() {
    let mut d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..N {
        repo.write(&format!("f{i}.txt"), format!("file {i}\n"));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    let t = d.open_thread("t", &["--project", "p", "--io", "no-open"]);
    let h = d.open_thread("h", &["--project", "p"]);
    let io_of = |d: &Daemon, thread: &str| {
        parse_json("status", &d.cli_ok(["status", thread, "--json"]))["io"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let opens = |d: &Daemon, thread: &str, mnt: &Path| {
        for _ in 0..2 {
            for i in 0..N {
                fs::read_to_string(mnt.join(format!("f{i}.txt"))).expect("read");
            }
        }
        let s0 = parse_json("stats", &d.cli_ok(["stats", thread, "--json"]));
        for i in 0..N {
            fs::read_to_string(mnt.join(format!("f{i}.txt"))).expect("read");
        }
        let s1 = parse_json("stats", &d.cli_ok(["stats", thread, "--json"]));
        count(&s1, "OPEN") - count(&s0, "OPEN")
    };
    let check = |d: &Daemon, t: &Path, h: &Path| {
        assert_eq!(io_of(d, "t"), "no-open");
        assert_eq!(io_of(d, "h"), "handles");
        assert_eq!(opens(d, "t", t), 0, "the no-open thread sent OPENs");
        assert_eq!(
            opens(d, "h", h),
            N,
            "the handles thread sent no OPEN per open"
        );
    };
    check(&d, &t, &h);

    // A mounted thread keeps its mode: reopening it in another is refused and changes nothing.
    let out = d.cli(["open", "t", "--io", "handles"]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.contains("is mounted in no-open mode") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    // Asking for the mode it has is an open as any other (the same caller: no user more).
    d.cli_ok(["open", "t", "--io", "no-open"]);
    assert_eq!(io_of(&d, "t"), "no-open");

    // Kept across a daemon restart (remounted from its record) and a release and resume.
    d.stop();
    d.spawn();
    wait_mounted(&[t.clone(), h.clone()], Duration::from_secs(30));
    check(&d, &t, &h);
    d.cli_ok(["release", "t"]);
    let t = d.open_thread("t", &[]);
    check(&d, &t, &h);

    // A released thread may change its mode at its next open.
    d.cli_ok(["release", "t"]);
    let t = d.open_thread("t", &["--io", "handles"]);
    assert_eq!(io_of(&d, "t"), "handles");
    assert_eq!(opens(&d, "t", &t), N);
    d.cli_ok(["release", "t"]);
    let t = d.open_thread("t", &[]);
    assert_eq!(io_of(&d, "t"), "handles", "the new mode was not kept");
    drop(t);
}

/// Pages of `path` in the page cache, in bytes (`fincore`).
fn resident_bytes(path: &Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("fincore runs");
    assert!(out.status.success(), "fincore {}: {out:?}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("fincore prints a number")
}

/// Catches: keeping what a no-open READ read of the blob cache in the daemon's page cache. The
/// mount's own page cache holds the content already (no passthrough shares the blob cache's
/// pages), so every file read would be cached twice: the page-cache cost of no-open workspaces
/// against clones would be 4 : 3 for three workspaces instead of 1 : 1.
#[test]
fn reads_leave_no_copy_of_the_blob_cache_in_the_page_cache() {
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--io", "no-open"]);
    let repo = GitRepo::init(&d.base.join("up"));
    // 3 MiB and a half of varied bytes: several READs, the last one short.
    let big: Vec<u8> = (0..3 * 1024 * 1024 + 512 * 1024)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(repo.path.join("big.bin"), &big).expect("write big.bin");
    repo.commit_all("big", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    let mnt = d.open_thread("t", &["--project", "p"]);
    let id = git(&repo.path, ["rev-parse", "HEAD:big.bin"]);
    let id = id.trim();
    let cached = d.state.join("blobs").join(&id[..2]).join(&id[2..]);

    // The first read writes the blob cache file; once it is on disk its pages are clean, and
    // the read of a second workspace (its own page cache) is served from it.
    assert_eq!(fs::read(mnt.join("big.bin")).expect("read"), big);
    assert!(cached.is_file(), "no blob cache file {}", cached.display());
    let synced = Command::new("sync").arg("-f").arg(&cached).status();
    assert!(synced.is_ok_and(|s| s.success()), "sync -f");
    let u = d.open_thread("u", &["--project", "p"]);
    let before = resident_bytes(&cached);
    assert_eq!(fs::read(u.join("big.bin")).expect("read"), big);
    let after = resident_bytes(&cached);
    assert!(
        after < 64 * 1024,
        "the blob cache file keeps {after} bytes in the page cache after a no-open read \
         ({before} before it)"
    );
    // Served again from the mount's page cache, the content is still right.
    assert_eq!(fs::read(u.join("big.bin")).expect("read"), big);
}

/// Catches: a fork's index without git's cache tree (`TREE`), so that every `git status` reads
/// every tree of HEAD to compare it with the index (most of a warm status at a few thousand
/// files), or a cache tree git does not take as its own: `git write-tree` answers from a valid
/// cache tree without looking at the entries, so a wrong id there would be the answer.
#[test]
fn a_forks_index_carries_the_cache_tree() {
    let (_d, _repo, mnt) = no_open_workspace();
    let index = fs::read(mnt.join(".git/index")).expect("read .git/index");
    assert!(
        index.windows(4).any(|w| w == b"TREE"),
        "the fork's index has no TREE extension"
    );
    let head = git(&mnt, ["rev-parse", "HEAD^{tree}"]);
    assert_eq!(git(&mnt, ["write-tree"]), head);
    assert_eq!(git(&mnt, ["status", "--porcelain"]).trim(), "");
    // git keeps it right through a change of the index.
    fs::write(mnt.join("dir/c.txt"), "changed\n").expect("write");
    git(&mnt, ["add", "dir/c.txt"]);
    assert_ne!(git(&mnt, ["write-tree"]), head);
    assert_eq!(
        git(&mnt, ["diff", "--cached", "--name-only"]).trim(),
        "dir/c.txt"
    );
}

/// The blob-cache file of `path` at HEAD of `repo`.
fn blob_file(d: &Daemon, repo: &GitRepo, path: &str) -> std::path::PathBuf {
    let id = git(&repo.path, ["rev-parse", &format!("HEAD:{path}")]);
    let id = id.trim();
    d.state.join("blobs").join(&id[..2]).join(&id[2..])
}

/// Drops `path` from the page cache (it is clean: synced first).
fn evict(path: &Path) {
    let f = fs::File::open(path).expect("open a blob-cache file");
    f.sync_all().expect("sync");
    octofs::sys::fadvise_dontneed(&f, 0, 0).expect("fadvise");
}

/// Whether `what` holds within 10 s.
fn eventually(what: impl Fn() -> bool) -> bool {
    poll(Duration::from_secs(10), || what().then_some(())).is_some()
}

/// Catches: cold reads that find nothing read ahead (each file one synchronous disk read after
/// the other), read-ahead started by a listing alone (a `git status` or `ls -R` reading every
/// file), read-ahead in only one of the two I/O modes, and a no-open mount's read-ahead leaving
/// the blob cache's copy in the page cache (a second copy of every file it read).
#[test]
fn a_read_warms_the_files_listed_after_it_in_both_modes() {
    const FILES: usize = 40;
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..FILES {
        let body: String = (0..2000).map(|k| format!("{i}.{k} ")).collect();
        repo.write(&format!("d/f{i}.txt"), body);
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", &repo.file_url()]);
    // The blob cache filled by a first reader.
    let fill = d.open_thread("fill", &["--project", "p"]);
    for i in 0..FILES {
        fs::read(fill.join(format!("d/f{i}.txt"))).expect("read");
    }
    let blobs: Vec<_> = (0..FILES)
        .map(|i| blob_file(&d, &repo, &format!("d/f{i}.txt")))
        .collect();
    assert!(blobs.iter().all(|b| b.is_file()));

    for (thread, io) in [("h", "handles"), ("n", "no-open")] {
        for b in &blobs {
            evict(b);
        }
        assert!(
            blobs.iter().all(|b| resident_bytes(b) == 0),
            "{io}: not evicted"
        );
        let mnt = d.open_thread(thread, &["--project", "p", "--io", io]);
        // Listed in the mount's order (READDIRPLUS): nothing is read for a listing alone.
        let names: Vec<String> = fs::read_dir(mnt.join("d"))
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), FILES);
        std::thread::sleep(Duration::from_millis(300));
        let warm = |n: &String| resident_bytes(&blob_file(&d, &repo, &format!("d/{n}"))) > 0;
        assert!(!names.iter().any(warm), "{io}: a listing alone read files");
        // Reading the first file warms the ones listed after it, which nobody read.
        fs::read(mnt.join("d").join(&names[0])).expect("read");
        let rest = &names[1..];
        assert!(
            eventually(|| rest.iter().filter(|n| warm(n)).count() == rest.len()),
            "{io}: {} of the {} files listed after the one read are in the page cache",
            rest.iter().filter(|n| warm(n)).count(),
            rest.len()
        );
        if io == "no-open" {
            // The mount keeps its own copy of what it reads: the blob cache's goes again.
            assert!(
                eventually(|| !rest.iter().any(warm)),
                "{io}: the read-ahead copy stays in the page cache"
            );
        }
    }
}
