//! What `octofs restart` keeps when nobody is using the mounts, and what happens to a mount taken
//! away behind the daemon.
//!
//! Ten workspaces, one busy (a process has its cwd in it) and nine idle, one of them in no-open
//! mode and two owned by an ordinary user, each with an uncommitted `new.txt`; two restarts (the
//! second with `--exe`). Then processes started after the restarts, which looked nothing up before,
//! must see every mount: every base file's bytes equal to `git show` of the base commit, the same
//! file list, `git status --porcelain` equal to before, and `status` saying mounted. Failed before:
//! the old daemon dropped the handed-over sessions, whose fuser `Mount` unmounted on drop — EBUSY on
//! the busy mount, success on every idle one (nine bare directories after the first restart).
//!
//! A mount removed behind the daemon (`umount -l`) is reported `not mounted` by `status`/`list` and
//! `doctor`; while a process still uses the detached mount, `open` refuses in one line (its session
//! still serves that process); then `open` mounts it again, and `doctor --fix` does too, each moving the files written into
//! the bare directory meanwhile into the workspace under `.octofs-stray/<time>/`, said in one line.
//! Failed before: `status` said mounted, `open` printed the path and mounted nothing.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const FILES: &[(&str, &str)] = &[
    ("README.md", "# idle\n"),
    ("src/lib.rs", "pub fn f() {}\n"),
    ("src/deep/mod.rs", "pub mod x;\n"),
    ("docs/guide.md", "read me\n"),
    ("data/blob.bin", "0123456789abcdef\n"),
];

/// `cmd args` in `dir`, as `user` when given, in a process of its own (started now).
fn in_mount(user: Option<User>, dir: &Path, cmd: &str, args: &[&str]) -> Out {
    let mut c = match user {
        Some(u) => as_user(u, "sh"),
        None => Command::new("sh"),
    };
    c.args(["-c", "cd \"$0\" && exec \"$@\""])
        .arg(dir)
        .arg(cmd)
        .args(args)
        .current_dir("/");
    run(&mut c, Duration::from_secs(60))
}

/// The workspace's files outside `.git`, as a fresh `find` lists them.
fn listed(user: Option<User>, mount: &Path) -> Vec<String> {
    let out = in_mount(
        user,
        mount,
        "find",
        &[
            ".", "-path", "./.git", "-prune", "-o", "-type", "f", "-print",
        ],
    );
    assert!(
        out.success(),
        "find in {}: {}",
        mount.display(),
        out.describe()
    );
    let mut v: Vec<String> = out
        .stdout_str()
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .collect();
    v.sort();
    v
}

fn porcelain(user: Option<User>, mount: &Path) -> String {
    let out = in_mount(user, mount, "git", &["status", "--porcelain"]);
    assert!(
        out.success(),
        "git status in {}: {}",
        mount.display(),
        out.describe()
    );
    out.stdout_str()
}

fn busy_process(mount: &Path) -> Child {
    Command::new("sleep")
        .arg("600")
        .current_dir(mount)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn a process in the mount")
}

#[test]
fn idle_and_busy_mounts_survive_two_restarts_with_their_trees() {
    let user = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    let files: Vec<(&str, &str, u32)> = FILES.iter().map(|(p, c)| (*p, *c, 0o644)).collect();
    let repo = add_project(&d, "p", &files);
    let head = repo.head();
    let mut base: Vec<String> = FILES.iter().map(|(p, _)| p.to_string()).collect();
    base.sort();

    // t0 busy, t1..t9 idle; t5 in no-open mode; t7 and t8 the ordinary user's.
    let owner = |i: usize| (i == 7 || i == 8).then_some(user);
    let mut mounts = Vec::new();
    for i in 0..10 {
        let t = format!("t{i}");
        let mut args = vec!["open", t.as_str(), "--project", "p"];
        if i == 5 {
            args.extend(["--io", "no-open"]);
        }
        let out = match owner(i) {
            Some(u) => d.cli_as(u, &args),
            None => d.cli(&args),
        };
        assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
        let m = d.mount(&t);
        assert_eq!(out.stdout_str().trim(), m.to_str().unwrap());
        let w = in_mount(
            owner(i),
            &m,
            "sh",
            &["-c", &format!("echo new in {t} > new.txt")],
        );
        assert!(w.success(), "{}", w.describe());
        mounts.push(m);
    }
    let before: Vec<String> = mounts
        .iter()
        .enumerate()
        .map(|(i, m)| porcelain(owner(i), m))
        .collect();
    for b in &before {
        assert_eq!(b, "?? new.txt\n");
    }
    let mut busy = busy_process(&mounts[0]);

    let first = d.cli(["restart"]);
    assert!(first.success(), "{}\n{}", first.describe(), d.log_tail());
    let second = d.cli(["restart", "--exe", bin()]);
    assert!(second.success(), "{}\n{}", second.describe(), d.log_tail());
    let _ = busy.kill();
    let _ = busy.wait();

    let lost: Vec<&PathBuf> = mounts.iter().filter(|m| !is_mounted(m)).collect();
    assert!(
        lost.is_empty(),
        "mounts gone after two restarts: {lost:?}\n{}",
        d.log_tail()
    );
    let mut want = base.clone();
    want.push("new.txt".into());
    want.sort();
    for (i, m) in mounts.iter().enumerate() {
        let u = owner(i);
        assert_eq!(listed(u, m), want, "files in {}", m.display());
        for (p, _) in FILES {
            let got = in_mount(u, m, "cat", &[p]);
            assert!(
                got.success(),
                "cat {p} in {}: {}",
                m.display(),
                got.describe()
            );
            let want = repo.git(["show", &format!("{head}:{p}")]);
            assert_eq!(got.stdout_str(), want, "{p} in {}", m.display());
        }
        let new = in_mount(u, m, "cat", &["new.txt"]);
        assert_eq!(
            new.stdout_str(),
            format!("new in t{i}\n"),
            "{}",
            new.describe()
        );
        assert_eq!(porcelain(u, m), before[i], "git status in {}", m.display());
        assert_eq!(d.state_of(&format!("t{i}")), "mounted");
    }
    // The no-open thread kept its mode.
    let st = d.cli_ok(["status", "t5", "--json"]);
    assert!(
        st.contains("\"io\":\"no-open\"") || st.contains("\"io\": \"no-open\""),
        "{st}"
    );
}

#[test]
fn a_mount_removed_behind_the_daemon_is_reported_and_mounted_again_with_its_strays() {
    let user = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    add_project(&d, "p", &[("README.md", "# strays\n", 0o644)]);
    let out = d.cli_as(user, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}", out.describe());
    let m = d.mount("t");
    let w = in_mount(Some(user), &m, "sh", &["-c", "echo mine > new.txt"]);
    assert!(w.success(), "{}", w.describe());

    // Taken away behind the daemon while a process works in it (the detached mount lives on for
    // that process); something writes into the bare directory.
    let mut held = busy_process(&m);
    let um = run(Command::new("umount").arg("-l").arg(&m), CMD_TIMEOUT);
    assert!(um.success(), "{}", um.describe());
    assert!(!is_mounted(&m));
    write_file(&m.join("stray.txt"), b"written while unmounted\n", 0o644);
    write_file(&m.join("sub/inner.txt"), b"inner\n", 0o600);
    std::os::unix::fs::symlink("/etc/shadow", m.join("sub/link")).expect("symlink");

    assert_eq!(d.state_of("t"), "not mounted");
    let list = d.cli_ok(["list"]);
    assert!(
        list.lines()
            .any(|l| l.starts_with("t\t") && l.contains("not mounted")),
        "{list}"
    );
    let doc = d.cli(["doctor"]);
    assert!(
        doc.stdout_str().contains("not-mounted")
            && doc
                .stdout_str()
                .contains("files were written into the bare directory"),
        "{}",
        doc.describe()
    );

    // Its session still serves that process: no second one over the same upper layer.
    d.cli_as(user, &["open", "t"])
        .assert_one_line_error(&["detached", "still uses"]);
    assert!(!is_mounted(&m));
    let _ = held.kill();
    let _ = held.wait();

    // `open` mounts it again, the strays moved into the workspace, said in one line.
    let again = d.cli_as(user, &["open", "t"]);
    assert!(again.success(), "{}\n{}", again.describe(), d.log_tail());
    assert_eq!(again.stdout_str().trim(), m.to_str().unwrap());
    let err = again.stderr_str();
    assert_eq!(err.trim().lines().count(), 1, "{}", again.describe());
    assert!(err.contains(".octofs-stray/"), "{}", again.describe());
    assert!(is_mounted(&m), "open did not mount {}", m.display());
    assert_eq!(d.state_of("t"), "mounted");
    let files = listed(Some(user), &m);
    let stray_dir = files
        .iter()
        .find_map(|p| p.strip_suffix("/stray.txt"))
        .unwrap_or_else(|| panic!("no stray.txt in {files:?}"))
        .to_string();
    assert!(stray_dir.starts_with(".octofs-stray/"), "{files:?}");
    assert_eq!(
        files,
        vec![
            format!("{stray_dir}/stray.txt"),
            format!("{stray_dir}/sub/inner.txt"),
            "README.md".to_string(),
            "new.txt".to_string(),
        ]
    );
    let cat = in_mount(Some(user), &m, "cat", &[&format!("{stray_dir}/stray.txt")]);
    assert_eq!(
        cat.stdout_str(),
        "written while unmounted\n",
        "{}",
        cat.describe()
    );
    let inner = in_mount(
        Some(user),
        &m,
        "cat",
        &[&format!("{stray_dir}/sub/inner.txt")],
    );
    assert_eq!(inner.stdout_str(), "inner\n", "{}", inner.describe());
    let link = fs::read_link(m.join(&stray_dir).join("sub/link")).expect("readlink");
    assert_eq!(link, Path::new("/etc/shadow"));
    let meta = fs::symlink_metadata(m.join(&stray_dir).join("stray.txt")).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (user.uid, user.gid));
    assert_eq!(porcelain(Some(user), &m), "?? .octofs-stray/\n?? new.txt\n");

    // Again, fixed by `doctor --fix` this time.
    let um = run(Command::new("umount").arg("-l").arg(&m), CMD_TIMEOUT);
    assert!(um.success(), "{}", um.describe());
    write_file(&m.join("second.txt"), b"second\n", 0o644);
    let fix = d.cli(["doctor", "--fix"]);
    assert!(
        fix.stdout_str().contains("fixed not-mounted"),
        "{}\n{}",
        fix.describe(),
        d.log_tail()
    );
    assert!(is_mounted(&m), "doctor --fix did not mount {}", m.display());
    let files = listed(Some(user), &m);
    assert!(
        files
            .iter()
            .any(|p| p.starts_with(".octofs-stray/") && p.ends_with("/second.txt")),
        "{files:?}"
    );
    assert!(files.contains(&"new.txt".to_string()), "{files:?}");
    assert_eq!(d.state_of("t"), "mounted");
    let clean = d.cli(["doctor"]);
    assert!(
        !clean.stdout_str().contains("not-mounted"),
        "{}",
        clean.describe()
    );
}

/// The mirror's object files inside the mount (`.git/octofs/objects`) keep their bytes across a
/// restart, for a process that holds one open from before and for one started after, which looks
/// the names up in another order. Failed before (here: the held index read `ESTALE`; in CI,
/// `restart::five_restarts_under_load_lose_nothing` saw "packfile ... does not match index"): the
/// new daemon numbered the subtree from scratch in lookup order, so it did not know the numbers the
/// kernel held, and gave them to other files (the `.pack` looked up first took the number the
/// kernel still held for the `.idx`, with its cached pages).
#[test]
fn object_files_keep_their_bytes_across_a_restart() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-p"));
    for (p, c) in FILES {
        repo.write(p, c);
    }
    repo.commit_all("initial", DATE1);
    repo.git(["repack", "-a", "-d"]);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
    let m = d.open_thread("ob", &["--project", "p"]);
    let host_pack = d.mirror("p").join(".git/objects/pack");
    let mut names: Vec<String> = fs::read_dir(&host_pack)
        .expect("the mirror's packs")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".idx") || n.ends_with(".pack"))
        .collect();
    names.sort();
    assert!(
        names.len() >= 2,
        "the mirror has a pack and its index: {names:?}"
    );
    let inside = |n: &str| m.join(".git/octofs/objects/pack").join(n);

    // Before: the index is looked up first and held open by a process that lives on.
    let idx = names.iter().find(|n| n.ends_with(".idx")).unwrap().clone();
    let pack = names.iter().find(|n| n.ends_with(".pack")).unwrap().clone();
    let holder = Command::new("sh")
        .args(["-c", "exec 3<\"$0\"; cat <&3 >/dev/null; exec sleep 600"])
        .arg(inside(&idx))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn a holder");
    let mut holder = KillOnDrop(holder);
    let st = in_mount(None, &m, "git", &["status", "--porcelain"]);
    assert!(st.success(), "{}", st.describe());
    std::thread::sleep(Duration::from_millis(300));

    let out = d.cli(["restart"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());

    // After: a new process reads the pack first, then the index, then the held index again
    // through the holder's descriptor (the kernel's number from before, never looked up here).
    for n in [&pack, &idx] {
        let got = in_mount(None, &m, "cat", &[inside(n).to_str().unwrap()]);
        assert!(got.success(), "cat {n}: {}", got.describe());
        let want = fs::read(host_pack.join(n)).unwrap();
        assert!(
            got.stdout == want,
            "{n} read after the restart is not the mirror's file"
        );
    }
    let pid = holder.0.id();
    let held = run(
        Command::new("cat").arg(format!("/proc/{pid}/fd/3")),
        Duration::from_secs(30),
    );
    assert!(held.success(), "the held index: {}", held.describe());
    assert!(
        held.stdout == fs::read(host_pack.join(&idx)).unwrap(),
        "the held index's bytes"
    );
    let st = in_mount(None, &m, "git", &["status", "--porcelain"]);
    assert!(
        st.success(),
        "git status after the restart: {}",
        st.describe()
    );
    assert_eq!(st.stdout_str(), "");
    let log = in_mount(None, &m, "git", &["log", "--format=%s"]);
    assert_eq!(log.stdout_str(), "initial\n", "{}", log.describe());
    let _ = holder.0.kill();
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A workspace mounted by an older daemon, whose alternates still name the mirror by its host path,
/// is pointed at the objects inside the mount when `octofs restart` hands it over (as a mount
/// does), so git in a sandbox finds its history without a release. Failed before: only a mount
/// rewrote the path, and a handed-over workspace kept the host path until its next mount.
#[test]
fn a_handover_makes_an_old_workspace_s_alternates_relative() {
    let d = Daemon::start();
    let files: Vec<(&str, &str, u32)> = FILES.iter().map(|(p, c)| (*p, *c, 0o644)).collect();
    add_project(&d, "p", &files);
    let m = d.open_thread("old", &["--project", "p"]);
    let alt = m.join(".git/objects/info/alternates");
    let host = format!("{}\n", d.mirror("p").join(".git/objects").display());
    let a = alt.clone();
    let h = host.clone();
    fsop("write the old alternates", move || {
        fs::write(&a, h).unwrap()
    });
    assert_eq!(read_ws(&alt).unwrap(), host.as_bytes());
    let out = d.cli(["restart"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let got = in_mount(None, &m, "cat", &[".git/objects/info/alternates"]);
    assert_eq!(
        got.stdout_str(),
        "../octofs/objects\n",
        "{}",
        got.describe()
    );
    let log = in_mount(None, &m, "git", &["log", "--format=%s"]);
    assert_eq!(log.stdout_str(), "initial\n", "{}", log.describe());
}

/// A `git status --porcelain` loop in `mount` until `stop`: each output compared with `want` (the
/// loop's own logs left out). Rounds and what differed.
fn status_loop(
    mount: PathBuf,
    want: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (usize, Vec<String>) {
    let mut rounds = 0;
    let mut errors = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) && errors.len() < 20 {
        let out = in_mount(None, &mount, "git", &["status", "--porcelain"]);
        let got: String = out
            .stdout_str()
            .lines()
            .filter(|l| !l.ends_with(".log"))
            .map(|l| format!("{l}\n"))
            .collect();
        if !out.success() {
            errors.push(format!("round {rounds}: {}", out.describe()));
        } else if got != want {
            errors.push(format!("round {rounds}: status {got:?}"));
        }
        rounds += 1;
    }
    (rounds, errors)
}

/// A process in a mount namespace of its own (`unshare -m`) that bind-mounts `mount` at `at` (as a
/// container gets a workspace) and reads `README.md` through the bind until `stop_file` exists:
/// prints `ERR …` for each failure, then `rounds N` and the bind's `new.txt`.
fn bind_loop(mount: &Path, at: &Path, stop_file: &Path) -> Child {
    let script = "mount --bind \"$0\" \"$1\" || exit 9; n=0; \
                  while [ ! -e \"$2\" ]; do \
                    c=$(cat \"$1/README.md\") || echo \"ERR read $n\"; \
                    [ \"$c\" = \"# idle\" ] || echo \"ERR content $n: $c\"; n=$((n+1)); \
                  done; echo \"rounds $n\"; cat \"$1/new.txt\" || echo \"ERR new.txt\"";
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .arg(mount)
        .arg(at)
        .arg(stop_file)
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn unshare")
}

/// A `kill -9` of the daemon is a pause to the processes in its mounts: the connection keeper holds
/// every mount's descriptors, the next daemon adopts them. A busy workspace in I/O mode `busy_io`
/// (a read/append loop, a file held open, a `git status` loop comparing its output, a process
/// whose cwd is in it, a process in another mount namespace reading through a bind mount of it)
/// and idle ones (default, no-open, an ordinary user's); processes started after the new daemon
/// see every tree byte-identical, `git status` as before, and the loops saw no error and lost no
/// line; meanwhile `doctor` reports the four mounts as kept for the next daemon (without probing
/// them). Failed before: every mount died with the daemon (the loop's reads failed with ENOTCONN,
/// "Transport endpoint is not connected").
fn mounts_outlive_a_kill_9(busy_io: Option<&str>) {
    let user = user_a();
    let mut d = Daemon::start();
    open_the_way(&d);
    let files: Vec<(&str, &str, u32)> = FILES.iter().map(|(p, c)| (*p, *c, 0o644)).collect();
    let repo = add_project(&d, "p", &files);
    let head = repo.head();
    // c0 busy in `busy_io`, c1 idle, c2 idle in the other mode, c3 idle and the ordinary user's.
    let owner = |i: usize| (i == 3).then_some(user);
    let mut mounts = Vec::new();
    for i in 0..4 {
        let t = format!("c{i}");
        let mut args = vec!["open", t.as_str(), "--project", "p"];
        match (i, busy_io) {
            (0, Some(io)) => args.extend(["--io", io]),
            (2, None) => args.extend(["--io", "no-open"]),
            _ => {}
        }
        let out = match owner(i) {
            Some(u) => d.cli_as(u, &args),
            None => d.cli(&args),
        };
        assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
        let m = d.mount(&t);
        let w = in_mount(
            owner(i),
            &m,
            "sh",
            &["-c", &format!("echo new in {t} > new.txt")],
        );
        assert!(w.success(), "{}", w.describe());
        mounts.push(m);
    }
    // `git status` leaves the kernel holding the old daemon's inodes of every file.
    let before: Vec<String> = mounts
        .iter()
        .enumerate()
        .map(|(i, m)| porcelain(owner(i), m))
        .collect();
    let mut busy = busy_process(&mounts[0]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (m, stop) = (mounts[0].clone(), stop.clone());
        std::thread::spawn(move || {
            let _ = tx.send(work_loop(m, "# idle\n", stop, Default::default()));
        });
    }
    let (stx, srx) = std::sync::mpsc::channel();
    {
        let (m, want, stop) = (mounts[0].clone(), before[0].clone(), stop.clone());
        std::thread::spawn(move || {
            let _ = stx.send(status_loop(m, want, stop));
        });
    }
    let bind_dir = tempfile::tempdir().expect("tempdir");
    let bind_at = bind_dir.path().join("work");
    fs::create_dir(&bind_at).expect("mkdir bind point");
    let bind_stop = bind_dir.path().join("stop");
    let binder = bind_loop(&mounts[0], &bind_at, &bind_stop);
    std::thread::sleep(Duration::from_millis(500));

    d.kill9();
    // Nobody serves for a while: the loop's requests wait. `doctor` says so, in bounded time,
    // without probing (a probe would wait too) or unmounting anything.
    let doc = d.cli(["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&doc.stdout_str())
        .unwrap_or_else(|e| panic!("doctor: {e}: {}", doc.describe()));
    let kinds: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert_eq!(kinds, vec!["kept-mount"; 4], "{v}");
    d.spawn();
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let saw = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the loop hung across the crash");
    let _ = busy.kill();
    let _ = busy.wait();
    let (status_rounds, status_errors) = srx
        .recv_timeout(Duration::from_secs(120))
        .expect("the git status loop hung across the crash");
    fs::write(&bind_stop, b"").expect("stop the bind loop");
    let mut binder = binder;
    if wait_timeout(&mut binder, Duration::from_secs(60)).is_none() {
        let _ = binder.kill();
        panic!("the loop through a bind mount hung across the crash");
    }
    let bound = binder.wait_with_output().expect("bind loop output");
    let bound_out = String::from_utf8_lossy(&bound.stdout).to_string();
    eprintln!(
        "crash ({busy_io:?}): {} rounds, slowest round {:?} (the pause), errors {:?}; \
         git status: {status_rounds} rounds, errors {status_errors:?}; bind mount: {:?}",
        saw.rounds,
        saw.slowest,
        saw.errors,
        bound_out
            .lines()
            .filter(|l| l.starts_with("rounds"))
            .collect::<Vec<_>>()
    );
    assert!(
        status_errors.is_empty() && status_rounds > 0,
        "git status across the crash: {status_errors:?}"
    );
    assert!(
        bound.status.success() && !bound_out.contains("ERR") && bound_out.ends_with("new in c0\n"),
        "through a bind mount in another mount namespace: {bound_out}\n{}",
        String::from_utf8_lossy(&bound.stderr)
    );
    assert!(
        saw.errors.is_empty(),
        "the loop saw {:?}\n{}",
        saw.errors,
        d.log_tail()
    );
    assert!(saw.rounds > 2, "{} rounds", saw.rounds);
    for log in ["held.log", "reopened.log"] {
        let got = in_mount(None, &mounts[0], "cat", &[log]);
        assert!(got.success(), "{}", got.describe());
        assert!(
            numbered(&got.stdout_str(), saw.rounds),
            "{log} after {} rounds: {:?}",
            saw.rounds,
            got.stdout_str()
        );
    }

    let mut want: Vec<String> = FILES.iter().map(|(p, _)| p.to_string()).collect();
    want.push("new.txt".into());
    for (i, m) in mounts.iter().enumerate() {
        let u = owner(i);
        assert!(is_mounted(m), "{} gone\n{}", m.display(), d.log_tail());
        let mut want = want.clone();
        if i == 0 {
            want.extend(["held.log".to_string(), "reopened.log".to_string()]);
        }
        want.sort();
        assert_eq!(listed(u, m), want, "files in {}", m.display());
        for (p, _) in FILES {
            let got = in_mount(u, m, "cat", &[p]);
            assert!(
                got.success(),
                "cat {p} in {}: {}",
                m.display(),
                got.describe()
            );
            let want = repo.git(["show", &format!("{head}:{p}")]);
            assert_eq!(got.stdout_str(), want, "{p} in {}", m.display());
        }
        let new = in_mount(u, m, "cat", &["new.txt"]);
        assert_eq!(
            new.stdout_str(),
            format!("new in c{i}\n"),
            "{}",
            new.describe()
        );
        let mut now = porcelain(u, m);
        if i == 0 {
            now = now
                .replace("?? held.log\n", "")
                .replace("?? reopened.log\n", "");
        }
        assert_eq!(now, before[i], "git status in {}", m.display());
        assert_eq!(d.state_of(&format!("c{i}")), "mounted");
    }
    assert!(
        d.log_text()
            .contains("adopted the mount of a daemon that died"),
        "{}",
        d.log_tail()
    );
}

/// One namespace request caught by a crash: the daemon applies it (it is in the catalog) and dies
/// before answering (`OCTOFS_TEST_CRASH_AFTER=<op>:<name>`, a test hook); the kernel sends it
/// again to the next daemon, which finds it done.
struct Caught {
    /// The hook's `<op>:<name>`.
    hook: &'static str,
    /// What the process in the mount runs (`sh -c`, cwd the mount).
    script: &'static str,
}

const CAUGHT: &[Caught] = &[
    Caught {
        hook: "mkdir:newdir",
        script: "mkdir newdir",
    },
    Caught {
        hook: "create:index.lock",
        script: "perl -e 'use Fcntl; sysopen(F, \"index.lock\", O_WRONLY|O_CREAT|O_EXCL, 0644) \
                 or die \"create index.lock: $!\\n\"; print F \"locked\\n\" or die; \
                 close(F) or die \"close: $!\\n\"'",
    },
    Caught {
        hook: "rename:index",
        script: "mv index.lock index",
    },
    Caught {
        hook: "link:index2",
        script: "ln index index2",
    },
    Caught {
        hook: "symlink:ln",
        script: "ln -s src/lib.rs ln",
    },
    Caught {
        hook: "unlink:README.md",
        script: "rm README.md",
    },
    Caught {
        hook: "rmdir:newdir",
        script: "rmdir newdir",
    },
];

/// Each namespace request a `kill -9` catches between its change and its answer is seen by the
/// process that made it as done (`mkdir`, `open(O_CREAT|O_EXCL)` of git's `index.lock`, `rename`,
/// `link`, `symlink`, `unlink`, `rmdir`), and the tree is what the requests made: each daemon
/// dies inside one request (the test hook), the connection keeper holds the mount, the next
/// daemon adopts it and the kernel sends the request again. Failed before (the resent request
/// carried out again): `mkdir: cannot create directory 'newdir': File exists`, `create
/// index.lock: File exists`, `mv: cannot stat 'index.lock'`, `rm: … No such file or directory`.
fn resent_requests_are_answered_as_done(io: Option<&str>) {
    let mut d = Daemon::unstarted();
    d.spawn_with_env(&[], &[("OCTOFS_TEST_CRASH_AFTER", CAUGHT[0].hook)]);
    let files: Vec<(&str, &str, u32)> = FILES.iter().map(|(p, c)| (*p, *c, 0o644)).collect();
    add_project(&d, "p", &files);
    let mut args = vec!["open", "t", "--project", "p"];
    if let Some(io) = io {
        args.extend(["--io", io]);
    }
    let out = d.cli(&args);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let m = d.mount("t");
    let mut pauses = Vec::new();
    let mut failed = Vec::new();
    for (i, c) in CAUGHT.iter().enumerate() {
        let started = std::time::Instant::now();
        let worker = {
            let m = m.clone();
            let script = c.script;
            std::thread::spawn(move || {
                let mut cmd = Command::new("sh");
                cmd.args(["-c", script]).current_dir(&m);
                run(&mut cmd, Duration::from_secs(60))
            })
        };
        // The daemon dies inside the request; a command that ends first (it failed before
        // reaching it, on the old code) is a failure, and the daemon is killed here instead.
        let pid = d.pid().expect("a daemon");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let died = loop {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.rsplit(") ").next().is_none_or(|r| r.starts_with('Z')) {
                break true;
            }
            if worker.is_finished() || std::time::Instant::now() >= deadline {
                std::thread::sleep(Duration::from_millis(500));
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if died {
            let status = d.reap_killed();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&status),
                Some(libc::SIGKILL),
                "{}: the daemon did not die in the request\n{}",
                c.hook,
                d.log_tail()
            );
        } else {
            failed.push(format!("{}: the daemon never reached the request", c.hook));
            d.kill9();
        }
        match CAUGHT.get(i + 1) {
            Some(next) => d.spawn_with_env(&[], &[("OCTOFS_TEST_CRASH_AFTER", next.hook)]),
            None => d.spawn(),
        }
        let out = worker.join().expect("worker");
        pauses.push(started.elapsed());
        // Every request is tried (each failure listed at the end): the effect is applied anyway.
        if !out.success() || !out.stderr_str().is_empty() {
            failed.push(format!("{}: {}", c.hook, out.describe()));
        }
        assert!(
            d.log_text()
                .contains("adopted the mount of a daemon that died"),
            "{}",
            d.log_tail()
        );
    }
    eprintln!("crash inside a request ({io:?}): each took {pauses:?}");
    assert!(
        failed.is_empty(),
        "{} failures across the {} requests caught by a crash:\n{}\n{}",
        failed.len(),
        CAUGHT.len(),
        failed.join("\n"),
        d.log_tail()
    );
    // What a process started now sees.
    let ls = in_mount(
        None,
        &m,
        "sh",
        &["-c", "ls -A; readlink ln; cat index index2"],
    );
    assert!(ls.success(), "{}", ls.describe());
    assert_eq!(
        ls.stdout_str(),
        ".git\ndata\ndocs\nindex\nindex2\nln\nsrc\nsrc/lib.rs\nlocked\nlocked\n",
        "{}",
        d.log_tail()
    );
    let links = fs::symlink_metadata(m.join("index")).expect("stat index");
    assert_eq!(links.nlink(), 2);
    let st = porcelain(None, &m);
    assert_eq!(
        st,
        " D README.md\n?? index\n?? index2\n?? ln\n",
        "{}",
        d.log_tail()
    );
    d.stop();
}

#[test]
fn resent_requests_are_answered_as_done_with_handles() {
    resent_requests_are_answered_as_done(None);
}

#[test]
fn resent_requests_are_answered_as_done_without_open() {
    resent_requests_are_answered_as_done(Some("no-open"));
}

#[test]
fn mounts_outlive_a_kill_9_and_the_next_daemon_adopts_them() {
    mounts_outlive_a_kill_9(None);
}

#[test]
fn mounts_outlive_a_kill_9_and_the_next_daemon_adopts_them_without_open() {
    mounts_outlive_a_kill_9(Some("no-open"));
}

/// What a test playing systemd holds in its descriptor store: each stored descriptor with its
/// `FDNAME`, as `FDSTORE=1` / `FDSTOREREMOVE=1` notifications left it.
type Store = std::sync::Arc<std::sync::Mutex<Vec<(String, std::os::fd::OwnedFd)>>>;

/// Plays the service manager's notification socket at `path` until `stop`: keeps what
/// `FDSTORE=1` sends, drops what `FDSTOREREMOVE=1` names.
fn play_systemd(
    path: &Path,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (Store, std::thread::JoinHandle<()>) {
    let sock = std::os::unix::net::UnixDatagram::bind(path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let store: Store = Default::default();
    let held = store.clone();
    let t = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((bytes, fds)) = octofs::sys::recv_with_fds(&sock) else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes).to_string();
            let name = text
                .lines()
                .find_map(|l| l.strip_prefix("FDNAME="))
                .unwrap_or("stored")
                .to_string();
            let mut st = held.lock().unwrap();
            if text.lines().any(|l| l == "FDSTOREREMOVE=1") {
                st.retain(|(n, _)| *n != name);
            }
            if text.lines().any(|l| l == "FDSTORE=1") {
                st.extend(fds.into_iter().map(|f| (name.clone(), f)));
            }
        }
    });
    (store, t)
}

/// Under systemd with a descriptor store (`FileDescriptorStoreMax=`), the daemon stores every
/// mount's `/dev/fuse` descriptors with the service manager; after a `kill -9` the next start of
/// the unit gets them back (`LISTEN_FDS`/`LISTEN_FDNAMES`) and adopts the mounts — with no
/// connection keeper at all here (`--keep-connections false`). This test plays systemd: a datagram
/// socket as `NOTIFY_SOCKET` keeping what `FDSTORE=1` sends, then the next daemon started with the
/// stored descriptors at 3, 4, …. A loop reading and appending with `fsync` in the mount sees a
/// pause only (0 errors, every line present), a process started afterwards sees the tree and `git
/// status` as before, and after `octofs stop` the store holds nothing. Failed before: nothing was
/// stored (the store was empty after the kill) and the mount died with the daemon (the loop read
/// `ENOTCONN`).
#[test]
fn systemd_s_descriptor_store_keeps_the_mounts_across_a_kill_9() {
    let mut d = Daemon::unstarted();
    let notify = d.base.join("notify.sock");
    let stop_sd = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (store, systemd) = play_systemd(&notify, stop_sd.clone());
    let notify_s = notify.to_str().expect("utf-8 path").to_string();
    let env = [("NOTIFY_SOCKET", notify_s.as_str()), ("FDSTORE", "256")];
    let serve = ["--keep-connections", "false"];
    d.spawn_with_env(&serve, &env);
    let files: Vec<(&str, &str, u32)> = FILES.iter().map(|(p, c)| (*p, *c, 0o644)).collect();
    let repo = add_project(&d, "p", &files);
    let head = repo.head();
    let out = d.cli(["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let m = d.mount("t");
    let w = in_mount(None, &m, "sh", &["-c", "echo new in c0 > new.txt"]);
    assert!(w.success(), "{}", w.describe());
    let before = porcelain(None, &m);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || {
            let _ = tx.send(work_loop(m, "# idle\n", stop, Default::default()));
        });
    }
    std::thread::sleep(Duration::from_millis(500));

    d.kill9();
    let stored: Vec<(String, std::os::fd::OwnedFd)> = store
        .lock()
        .unwrap()
        .iter()
        .map(|(n, f)| (n.clone(), f.try_clone().expect("dup")))
        .collect();
    assert!(
        stored.iter().any(|(n, _)| n == "t"),
        "the store holds {:?}\n{}",
        stored.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        d.log_tail()
    );
    std::thread::sleep(Duration::from_millis(300));
    d.spawn_with_listen_fds(&serve, &env, &stored);
    drop(stored);
    std::thread::sleep(Duration::from_millis(700));
    let saw = finish_work_loop(&stop, &rx, "a crash under systemd's store", &d);
    for log in ["held.log", "reopened.log"] {
        let got = in_mount(None, &m, "cat", &[log]);
        assert!(
            numbered(&got.stdout_str(), saw.rounds),
            "{log} after {} rounds: {}",
            saw.rounds,
            got.describe()
        );
    }
    for (p, _) in FILES {
        let got = in_mount(None, &m, "cat", &[p]);
        let want = repo.git(["show", &format!("{head}:{p}")]);
        assert_eq!(got.stdout_str(), want, "{p}: {}", got.describe());
    }
    let now = porcelain(None, &m)
        .replace("?? held.log\n", "")
        .replace("?? reopened.log\n", "");
    assert_eq!(now, before);
    assert!(
        d.log_text()
            .contains("adopted the mount of a daemon that died"),
        "{}",
        d.log_tail()
    );
    // The new daemon stored its own descriptors in place of the dead one's.
    assert!(store.lock().unwrap().iter().any(|(n, _)| n == "t"));
    d.stop();
    poll(Duration::from_secs(5), || {
        store.lock().unwrap().is_empty().then_some(())
    });
    let left: Vec<String> = store
        .lock()
        .unwrap()
        .iter()
        .map(|(n, _)| n.clone())
        .collect();
    stop_sd.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = systemd.join();
    assert!(
        left.is_empty(),
        "descriptors left in the store after stop: {left:?}"
    );
}

/// A dead daemon's mount unmounted lazily before the next daemon starts (an operator clearing
/// it, or a crash test doing so): the keeper still holds its connection, which a process working
/// in the detached mount keeps alive. The next daemon must not adopt it (it would serve a mount
/// no new process can reach, and report it mounted) but mount the workspace again from its
/// record: a process started afterwards sees the file written before the crash.
#[test]
fn a_kept_mount_unmounted_behind_the_keeper_is_mounted_again() {
    let mut d = Daemon::start();
    let files: Vec<(&str, &str, u32)> = FILES.iter().map(|(p, c)| (*p, *c, 0o644)).collect();
    add_project(&d, "p", &files);
    let m = d.open_thread("t", &["--project", "p"]);
    fs::write(m.join("mine.txt"), "written before the crash\n").unwrap();
    // Working in the mount: its superblock, and so the kept connection, outlive the unmount.
    let mut inside = Command::new("sleep")
        .arg("120")
        .current_dir(&m)
        .spawn()
        .expect("spawn sleep");
    d.kill9();
    run(
        Command::new("umount").arg("-l").arg(&m),
        Duration::from_secs(10),
    )
    .assert_ok();
    d.spawn();
    let mounted = poll(Duration::from_secs(10), || octofs::sys::fuse_mount_at(&m));
    let _ = inside.kill();
    let _ = inside.wait();
    assert!(mounted.is_some(), "not mounted again\n{}", d.log_tail());
    let cat = run(
        Command::new("cat").arg(m.join("mine.txt")),
        Duration::from_secs(10),
    );
    assert_eq!(
        cat.stdout_str(),
        "written before the crash\n",
        "{}",
        cat.describe()
    );
    assert!(
        d.log_text().contains("unmounted behind the keeper"),
        "{}",
        d.log_tail()
    );
}
