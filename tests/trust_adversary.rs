//! Issue 10, tried as the adversary (docs/security.md): a hostile agent writing its own
//! workspace, and a second unprivileged local user, against the root daemon. Each test is a hole
//! that was found and fixed, or a cheap guard on probes that held.
//!
//! 1. [`an_oversized_head_or_packed_refs_cannot_exhaust_the_daemon`]: a sparse `.git/HEAD` of
//!    many MiB (free for the agent) was read whole by `snapshot` and echoed into the error reply: a
//!    2 GiB one got the daemon OOM-killed, and every mount of every user with it.
//! 2. [`one_user_holding_idle_connections_does_not_lock_out_the_others`]: 2,048 idle connections
//!    from one user took every slot of the control socket; nobody else was answered.
//! 3. [`a_symlink_at_the_mount_point_is_not_followed`]: root mounted the workspace over the
//!    symlink's target.
//! 4. [`a_sparse_index_costs_the_daemon_no_disk`]: a sparse 3 GiB `.git/index` became 3 GiB of
//!    private copy (and as long under the thread's lock).
//! 5. [`another_user_cannot_read_a_workspace_through_its_mount`]: the `allow_other` mount's root
//!    was 0755, so any local user read any workspace, even of a project it may not bind.
//! 6. [`symlinks_and_lies_in_the_workspace_reach_nothing_outside`] (held): `.gitignore`,
//!    `.git/info/exclude`, `.git/index`, `.git/HEAD` as symlinks to a host file, `HEAD` naming
//!    `../` paths, a hard link to a host file: nothing of the host file lands in a snapshot, the
//!    mirror or a message.

use crate::common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Timeout for one in-process batch of file operations on a mount.
const FS_TIMEOUT: Duration = Duration::from_secs(60);

#[track_caller]
fn fsop<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    with_timeout(what, FS_TIMEOUT, f)
}

#[track_caller]
fn project(d: &Daemon, name: &str) -> GitRepo {
    let up = GitRepo::init(&d.base.join(format!("up-{name}")));
    up.write("README.md", "# demo\n");
    up.write("src/lib.rs", "pub fn f() {}\n");
    up.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", name, up.path.to_str().unwrap()]);
    up
}

/// Peak resident memory of the daemon (VmHWM), from /proc.
fn daemon_peak_rss(d: &Daemon) -> u64 {
    let pid = d.pid().expect("daemon running");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// Sets the length of `path` (sparse: costs the agent nothing).
fn set_len(path: &Path, len: u64) {
    let p = path.to_path_buf();
    fsop("truncate", move || {
        fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_len(len))
            .expect("set_len")
    });
}

#[test]
fn an_oversized_head_or_packed_refs_cannot_exhaust_the_daemon() {
    // Small enough that the old code costs this test a few hundred MiB, not the machine.
    const BIG: u64 = 48 << 20;
    let d = Daemon::start();
    project(&d, "p");
    let m = d.open_thread("t", &["--project", "p"]);
    let head = m.join(".git/HEAD");
    let original = fs::read(&head).expect("HEAD");
    let head_id = git(&m, ["rev-parse", "HEAD"]).trim().to_string();
    fs::write(m.join("new.txt"), "x\n").expect("write");
    let before = daemon_peak_rss(&d);

    // 1. HEAD itself: a sparse file of zeros.
    set_len(&head, BIG);
    let started = Instant::now();
    let out = d.cli(["snapshot", "t"]);
    out.assert_failed();
    let err = out.stderr_str();
    assert!(
        err.len() < 1000 && err.contains("HEAD"),
        "the refusal is one short line naming HEAD, got {} bytes: {:?}",
        err.len(),
        &err[..err.len().min(300)]
    );
    assert!(started.elapsed() < Duration::from_secs(20), "slow refusal");

    // 2. HEAD names a branch that only packed-refs could hold, and packed-refs is one huge line.
    fs::write(&head, "ref: refs/heads/nowhere\n").expect("HEAD");
    let packed = m.join(".git/packed-refs");
    let packed_before = fs::read_to_string(&packed).expect("packed-refs");
    set_len(&packed, BIG);
    let out = d.cli(["snapshot", "t"]);
    out.assert_failed();
    assert!(
        out.stderr_str().len() < 1000,
        "long refusal: {} bytes",
        out.stderr_str().len()
    );

    let grown = daemon_peak_rss(&d).saturating_sub(before);
    assert!(
        grown < BIG / 2,
        "the daemon's peak memory grew by {grown} bytes reading a {BIG}-byte HEAD/packed-refs"
    );

    // A legitimately long packed-refs (many refs, the one sought last) still resolves.
    set_len(&packed, 0);
    let mut text = packed_before.clone();
    for i in 0..20_000 {
        text.push_str(&format!("{head_id} refs/tags/filler-{i:05}\n"));
    }
    text.push_str(&format!("{head_id} refs/heads/nowhere\n"));
    fs::write(&packed, text).expect("packed-refs");
    let id = d.cli_ok(["snapshot", "t"]);
    assert_eq!(id.trim().len(), 40, "snapshot printed {id:?}");

    fs::write(&head, &original).expect("HEAD back");
    fs::write(&packed, &packed_before).expect("packed-refs back");
    d.cli_ok(["release", "t"]);
}

/// Kills the holder process when the test ends, however it ends.
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn one_user_holding_idle_connections_does_not_lock_out_the_others() {
    use std::io::BufRead as _;
    // The holder needs more descriptors than the usual soft limit (it inherits ours).
    raise_nofile_limit(4096);
    let User { uid, gid } = user_b();
    let d = Daemon::start();
    // An unprivileged user opens more connections than the daemon serves at once and sends
    // nothing on them.
    let script = "import socket,sys,time\n\
        ss=[]\n\
        for i in range(int(sys.argv[2])):\n\
        \x20   s=socket.socket(socket.AF_UNIX)\n\
        \x20   try: s.connect(sys.argv[1])\n\
        \x20   except Exception: break\n\
        \x20   ss.append(s)\n\
        print('held', len(ss), flush=True)\n\
        time.sleep(60)\n";
    let mut child = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .args(["/usr/bin/python3", "-c", script])
        .arg(d.socket())
        .arg("2100")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let stdout = child.stdout.take().expect("stdout");
    let _holder = Holder(child);
    let held = with_timeout("the holder connects", Duration::from_secs(30), move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("holder output");
        line
    });
    assert!(held.starts_with("held "), "holder said {held:?}");
    // Everyone else is still answered promptly.
    let started = Instant::now();
    let out = try_run(d.command().arg("list"), Duration::from_secs(10));
    let took = started.elapsed();
    assert!(
        out.as_ref().is_ok_and(|o| o.success()) && took < Duration::from_secs(5),
        "list took {took:?} while another user held idle connections: {:?}",
        out.map(|o| o.describe())
    );
}

#[test]
fn a_symlink_at_the_mount_point_is_not_followed() {
    let d = Daemon::start();
    project(&d, "p");
    // Whoever can write in the root directory must not get a mount (its content chosen by the
    // workspace's owner) over an empty directory elsewhere, such as /etc/cron.d.
    let victim = d.base.join("victim");
    fs::create_dir(&victim).expect("mkdir victim");
    std::os::unix::fs::symlink(&victim, d.mount("evil")).expect("symlink");
    let out = d.cli(["open", "evil", "--project", "p"]);
    let mounted = mount_points().iter().any(|m| m == &victim);
    if mounted {
        umount_all_under(&victim);
    }
    assert!(
        !mounted,
        "the daemon mounted a workspace over {}",
        victim.display()
    );
    out.assert_failed();
    assert!(
        out.stderr_str().contains("symlink"),
        "refusal: {}",
        out.stderr_str()
    );
}

/// Bytes allocated on disk under `dir` (st_blocks), following nothing.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// Catches: a daemon that copies a sparse `.git/index` of 3 GiB densely for a snapshot (its disk),
/// or that reads and hashes it at all (seconds of its CPU; gix even accepted the zero padding now
/// and then, so the snapshot sometimes succeeded after 12 s).
#[test]
fn a_sparse_index_costs_the_daemon_no_disk() {
    const BIG: u64 = 3 << 30;
    let d = Daemon::start();
    project(&d, "p");
    let m = d.open_thread("t", &["--project", "p"]);
    let index = m.join(".git/index");
    let original = fs::read(&index).expect("index");
    // A new file, so that the snapshot reads the index; the index, 3 GiB of nothing.
    fs::write(m.join("new.txt"), "x\n").expect("write");
    set_len(&index, BIG);
    let tmp = d.state.join("tmp");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(allocated(&tmp));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let started = Instant::now();
    let out = d.cli(["snapshot", "t"]);
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = watcher.join().expect("watcher");
    // Refused by its size before it is read: parsing it (whether gix then accepts the zeros or
    // not) would cost the daemon seconds of hashing 3 GiB.
    out.assert_failed();
    assert!(
        out.stderr_str().contains(".git/index is 3221225472 bytes"),
        "{}",
        out.describe()
    );
    assert!(
        peak < BIG / 8,
        "the daemon wrote {peak} bytes of copies for a sparse {BIG}-byte index (in {took:?})"
    );
    fs::write(&index, &original).expect("index back");
    let id = d.cli_ok(["snapshot", "t"]);
    assert_eq!(id.trim().len(), 40, "snapshot printed {id:?}");
    d.cli_ok(["release", "t"]);
}

#[test]
fn another_user_cannot_read_a_workspace_through_its_mount() {
    let a = user_a();
    let b = user_b();
    let d = Daemon::start();
    // The test's temp dir is root's 0700: let both users reach the socket and the mounts.
    for p in [&d.base, &d.root] {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    project(&d, "p");
    d.cli_ok(["mirror", "access", "p", "--allow-user", &a.uid.to_string()]);
    let cli = |u: User, args: &[&str]| {
        let mut c = as_user(u, bin());
        c.arg("--state").arg(&d.state).arg("--root").arg(&d.root);
        c.args(args);
        run(&mut c, CMD_TIMEOUT)
    };
    cli(a, &["open", "t", "--project", "p"]).assert_ok();
    let m = d.mount("t");
    // B may not bind the project...
    cli(b, &["open", "tb", "--project", "p"]).assert_failed();
    // ...so must not read it, nor A's work in progress, through A's mount either.
    let read = |u, rel: &str| run(as_user(u, "cat").arg(m.join(rel)), CMD_TIMEOUT);
    assert!(
        read(a, "README.md").success(),
        "the owner reads its workspace"
    );
    let out = read(b, "README.md");
    assert!(
        !out.success(),
        "user B read A's workspace of a project B may not bind: {}",
        out.describe()
    );
    cli(a, &["release", "t"]).assert_ok();
}

#[test]
fn symlinks_and_lies_in_the_workspace_reach_nothing_outside() {
    const MARK: &str = "host-secret-4b1d";
    let d = Daemon::start();
    project(&d, "p");
    let m = d.open_thread("t", &["--project", "p"]);
    let host = d.base.join("host-file");
    fs::write(&host, format!("{MARK}\n*\n")).expect("host file");
    let original_head = fs::read(m.join(".git/HEAD")).expect("HEAD");
    // A hard link to a host file cannot be made in the mount.
    let err = fs::hard_link(&host, m.join("hl")).expect_err("hard link across the mount");
    assert_eq!(err.raw_os_error(), Some(libc::EXDEV), "{err}");
    // The ignore files and the index as symlinks to the host file (its "*" would ignore all).
    let link = |rel: &str| {
        let p = m.join(rel);
        let _ = fs::remove_file(&p);
        std::os::unix::fs::symlink(&host, &p).expect("symlink");
    };
    link(".gitignore");
    fs::create_dir_all(m.join(".git/info")).expect("mkdir");
    link(".git/info/exclude");
    fs::rename(m.join(".git/index"), m.join(".git/index.real")).expect("index aside");
    link(".git/index");
    fs::write(m.join("new.txt"), "x\n").expect("write");
    let mut errors = String::new();
    let snap = d.cli(["snapshot", "t"]);
    errors.push_str(&snap.stderr_str());
    // HEAD as a symlink, and naming refs outside .git.
    for head in [
        None,
        Some("ref: ../../../../../../etc/passwd\n"),
        Some("ref: refs/heads/../../../x\n"),
    ] {
        let p = m.join(".git/HEAD");
        fs::remove_file(&p).expect("rm HEAD");
        match head {
            None => std::os::unix::fs::symlink(&host, &p).expect("symlink"),
            Some(text) => fs::write(&p, text).expect("HEAD"),
        }
        fs::write(m.join("new.txt"), format!("{head:?}\n")).expect("write");
        let out = d.cli(["snapshot", "t"]);
        out.assert_failed();
        errors.push_str(&out.stderr_str());
        errors.push_str(&d.cli(["diff", "t", "--patch"]).stderr_str());
    }
    assert!(
        !errors.contains(MARK),
        "a host file reached a message: {errors}"
    );
    // The symlinks were saved as symlinks (the new file was not ignored by the host's "*").
    snap.assert_ok();
    let id = snap.stdout_str().trim().to_string();
    let mirror = d.mirror("p");
    let tree = git(&mirror, ["ls-tree", "-r", &id]);
    assert!(tree.contains("new.txt"), "{tree}");
    assert!(
        tree.contains("120000 blob") && tree.contains(".gitignore"),
        "{tree}"
    );
    let all = run(
        Command::new("git").arg("-C").arg(&mirror).args([
            "cat-file",
            "--batch-all-objects",
            "--batch",
        ]),
        CMD_TIMEOUT,
    );
    assert!(
        !all.stdout_str().contains(MARK),
        "a host file's content is in the mirror"
    );
    fs::remove_file(m.join(".git/HEAD")).expect("rm HEAD");
    fs::write(m.join(".git/HEAD"), &original_head).expect("HEAD back");
    fs::remove_file(m.join(".git/index")).expect("rm index");
    fs::rename(m.join(".git/index.real"), m.join(".git/index")).expect("index back");
    d.cli_ok(["release", "t"]);
}
