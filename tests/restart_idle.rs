//! What `octofs restart` keeps when nobody is using the mounts.
//!
//! Ten workspaces, one busy (a process has its cwd in it) and nine idle, one of them in no-open
//! mode and two owned by an ordinary user, each with an uncommitted `new.txt`; two restarts (the
//! second with `--exe`). Then processes started after the restarts, which looked nothing up before,
//! must see every mount: every base file's bytes equal to `git show` of the base commit, the same
//! file list, `git status --porcelain` equal to before, and `status` saying mounted. Failed before:
//! the old daemon dropped the handed-over sessions, whose fuser `Mount` unmounted on drop — EBUSY on
//! the busy mount, success on every idle one (nine bare directories after the first restart).

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
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

fn state_of(d: &Daemon, thread: &str) -> String {
    let st = d.cli_ok(["status", thread]);
    st.lines()
        .find_map(|l| l.strip_prefix("state:"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| panic!("no state in {st}"))
}

fn open_the_way(d: &Daemon) {
    for (p, mode) in [(&d.base, 0o711), (&d.state, 0o711), (&d.root, 0o755)] {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
    }
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
        assert_eq!(state_of(&d, &format!("t{i}")), "mounted");
    }
    // The no-open thread kept its mode.
    let st = d.cli_ok(["status", "t5", "--json"]);
    assert!(
        st.contains("\"io\":\"no-open\"") || st.contains("\"io\": \"no-open\""),
        "{st}"
    );
}
