//! Issue 28, item 2, tried as the adversary (docs/security.md, privilege separation: a record that
//! arrives from outside the daemon is data; applying it may set only what the thread's owner could
//! set by themselves). An ordinary user `a` owns a thread; the POSIX record of a snapshot it pulls
//! is forged.
//!
//! 1. [`a_forged_record_sets_only_what_the_owner_could`]: the forged record made `evil.git/` and
//!    its `hooks/pre-receive` owned by uid 0 in a's workspace, a setuid-root `tool` with a
//!    `security.capability` xattr, and device nodes `mem` (char 1:1) and `disk` (block 8:0), mode
//!    0666. Now a process of `a` sees its own files, no setuid, no device node, no capability (a
//!    `user.` xattr and a fifo of the record still come back), and the pull names each entry it
//!    left out. Root's thread pulling the same snapshot keeps the exact state (and is told
//!    nothing). Failed before: every one of those was applied as written.
//! 2. [`the_owner_cannot_make_them_through_the_mount_either`] (held: the kernel checks with
//!    `default_permissions` before the core is asked): chown or chgrp to root, mknod of devices,
//!    `security.capability` and `trusted.*` xattrs, setuid on a root-owned file are refused with
//!    EPERM, and nothing changes.
//! 3. [`a_forged_share_record_brings_no_command_in_its_config`] (issue 30, privilege): a record
//!    forged on the share sets `core.hooksPath`, `core.pager`, `core.editor`, `core.fsmonitor`,
//!    `alias.x = !…`, `diff.x.textconv` and `include.path` beside `user.name`. After `open`, `git
//!    config --local --list` shows `user.name` and none of the others; `git status`, `log -p`,
//!    `diff`, `commit` (its hook), `git x` and the included alias run no command (no marker file),
//!    and `open` names what it left out. Failed before: the config was applied byte for byte.
//! 4. [`root_forking_a_users_thread_gets_no_command_of_theirs`]: root forks `a`'s thread whose
//!    config sets `core.pager` and `alias.x`: the fork's config keeps `user.name` and the default
//!    keys only, `git x` runs nothing as root. `a`'s own fork, and `a`'s release and open, keep the
//!    config byte for byte. Failed before: root's fork carried `a`'s pager and alias.

use crate::common;

use common::*;
use octofs::git::posix_record::{PosixEntry, PosixKind, PosixRecord};
use std::path::Path;

/// A `security.capability` value the kernel accepts (v2 header, CAP_SYS_ADMIN permitted and
/// effective), so a refusal is about who asks, not about the value.
const CAPABILITY: [u8; 20] = [
    0x01, 0x00, 0x00, 0x02, 0x00, 0x00, 0x20, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// A Python script run by `u` (or root) in `dir`: what a process of that user sees.
fn py_as(u: Option<User>, dir: &Path, script: &str) -> Out {
    let mut c = match u {
        Some(u) => as_user(u, "/usr/bin/python3"),
        None => std::process::Command::new("/usr/bin/python3"),
    };
    c.arg("-c").arg(script).current_dir(dir);
    run(&mut c, CMD_TIMEOUT)
}

/// One line per path: kind, uid, gid, mode bits, device numbers and the xattr names, or
/// "missing".
const LISTING: &str = r#"
import os, stat, sys
for p in sys.argv[1:]:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        print(p, "missing"); continue
    kind = "char" if stat.S_ISCHR(st.st_mode) else "block" if stat.S_ISBLK(st.st_mode) else \
        "fifo" if stat.S_ISFIFO(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "file"
    dev = "%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev)) if kind in ("char", "block") else "-"
    names = ",".join(sorted(os.listxattr(p, follow_symlinks=False))) if kind in ("file", "dir") else ""
    print(p, kind, st.st_uid, st.st_gid, "%o" % stat.S_IMODE(st.st_mode), dev, names or "-")
"#;

const PATHS: [&str; 7] = [
    "evil.git",
    "evil.git/hooks",
    "evil.git/hooks/pre-receive",
    "tool",
    "mem",
    "disk",
    "pipe",
];

fn listing(u: Option<User>, mount: &Path) -> Vec<String> {
    let script = format!("import sys; sys.argv = [''] + {PATHS:?}\n{LISTING}");
    let out = py_as(u, mount, &script);
    assert!(out.success(), "{}", out.describe());
    out.stdout_str().lines().map(str::to_string).collect()
}

fn entry(path: &str, kind: PosixKind, mode: u32) -> PosixEntry {
    PosixEntry {
        path: path.as_bytes().to_vec(),
        kind,
        mode,
        uid: 0,
        gid: 0,
        rdev: 0,
        xattrs: vec![],
        link: None,
    }
}

/// A bare repository at `<base>/forged.git` whose `refs/snapshots/feat` is a forged snapshot over
/// `base` (the thread's HEAD): the tree adds `evil.git/hooks/pre-receive` and `tool`, and the
/// message names a record (its blob made reachable through a second parent, so a fetch brings it)
/// claiming root's ownership, setuid, a capability and device nodes.
fn forge(d: &Daemon, base: &str) -> String {
    let r = d.base.join("forged.git");
    git(&d.base, ["init", "-q", "--bare", r.to_str().unwrap()]);
    git(&r, ["fetch", "-q", d.mirror("p").to_str().unwrap(), base]);
    let blob = |name: &str, bytes: &[u8]| {
        let f = d.base.join(name);
        std::fs::write(&f, bytes).expect("write");
        git(&r, ["hash-object", "-w", f.to_str().unwrap()])
            .trim()
            .to_string()
    };
    let hook = blob("hook", b"#!/bin/sh\nid > /tmp/owned\n");
    let tool = blob("tool", b"#!/bin/sh\nexec sh\n");
    let index = d.base.join("forged.index");
    let with_index = |args: &[&str]| {
        let out = run(
            git_command(&r, DATE1)
                .env("GIT_INDEX_FILE", &index)
                .args(args),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        out.stdout_str().trim().to_string()
    };
    with_index(&["read-tree", base]);
    with_index(&[
        "update-index",
        "--add",
        "--cacheinfo",
        &format!("100755,{hook},evil.git/hooks/pre-receive"),
        "--cacheinfo",
        &format!("100755,{tool},tool"),
    ]);
    let tree = with_index(&["write-tree"]);
    let mut tool_e = entry("tool", PosixKind::File, 0o4755);
    tool_e.xattrs = vec![
        (b"security.capability".to_vec(), CAPABILITY.to_vec()),
        (b"user.note".to_vec(), b"kept".to_vec()),
    ];
    let mut mem = entry("mem", PosixKind::Char, 0o666);
    mem.rdev = (1 << 8) | 1;
    let mut disk = entry("disk", PosixKind::Block, 0o666);
    disk.rdev = 8 << 8;
    let mut pipe = entry("pipe", PosixKind::Fifo, 0o640);
    let a = user_a();
    (pipe.uid, pipe.gid) = (a.uid, a.gid);
    let record = PosixRecord::new(
        gix::ObjectId::from_hex(tree.as_bytes()).expect("tree id"),
        vec![
            entry("evil.git", PosixKind::Dir, 0o755),
            entry("evil.git/hooks", PosixKind::Dir, 0o755),
            entry("evil.git/hooks/pre-receive", PosixKind::File, 0o4755),
            tool_e,
            mem,
            disk,
            pipe,
        ],
    );
    let rec = blob("record", &record.encode());
    let aux_tree = {
        let out = run(
            git_command(&r, DATE1)
                .env("GIT_INDEX_FILE", d.base.join("aux.index"))
                .args([
                    "update-index",
                    "--add",
                    "--cacheinfo",
                    &format!("100644,{rec},record"),
                ]),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        let out = run(
            git_command(&r, DATE1)
                .env("GIT_INDEX_FILE", d.base.join("aux.index"))
                .args(["write-tree"]),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        out.stdout_str().trim().to_string()
    };
    let aux = git(&r, ["commit-tree", &aux_tree, "-m", "carrier"])
        .trim()
        .to_string();
    let msg = d.base.join("message");
    std::fs::write(
        &msg,
        format!("octofs snapshot of thread x\n\nOctofs-Posix: {rec}\n"),
    )
    .expect("message");
    let commit = git(
        &r,
        [
            "commit-tree",
            &tree,
            "-p",
            base,
            "-p",
            &aux,
            "-F",
            msg.to_str().unwrap(),
        ],
    )
    .trim()
    .to_string();
    git(&r, ["update-ref", "refs/snapshots/feat", &commit]);
    // Readable by everyone (a's credentials are the ones that read it).
    run(
        std::process::Command::new("chmod").args(["-R", "a+rX", r.to_str().unwrap()]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    r.display().to_string()
}

/// A copy of the repository at `from` owned by `u`: the attacker serves its own repository (a
/// remote a caller names is read with the caller's authority, and git reads no repository
/// another user owns).
fn owned_copy(d: &Daemon, from: &str, u: User) -> String {
    let to = d.base.join(format!("forged-{}.git", u.uid));
    git(
        &d.base,
        [
            "clone",
            "-q",
            "--mirror",
            "--no-local",
            from,
            to.to_str().unwrap(),
        ],
    );
    run(
        std::process::Command::new("chown").args([
            "-R",
            &format!("{}:{}", u.uid, u.gid),
            to.to_str().unwrap(),
        ]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    to.display().to_string()
}

/// A daemon on a one-file project `p` and the thread `t` that user `a` opened on it.
fn a_thread_of(a: User) -> Daemon {
    let d = Daemon::start();
    open_the_way(&d);
    add_project(&d, "p", &[("README.md", "# demo\n", 0o644)]);
    let out = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    d
}

#[test]
fn a_forged_record_sets_only_what_the_owner_could() {
    let a = user_a();
    let d = a_thread_of(a);
    let m = d.mount("t");
    let base = git(&d.mirror("p"), ["rev-parse", "HEAD"])
        .trim()
        .to_string();
    let remote = forge(&d, &base);
    let theirs = owned_copy(&d, &remote, a);

    let out = d.cli_as(a, &["pull", "t", "--remote", &theirs, "--name", "feat"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    // What a process of `a` sees, in a process started after the pull.
    let (u, g) = (a.uid, a.gid);
    assert_eq!(
        listing(Some(a), &m),
        [
            format!("evil.git dir {u} {g} 755 - -"),
            format!("evil.git/hooks dir {u} {g} 755 - -"),
            format!("evil.git/hooks/pre-receive file {u} {g} 755 - -"),
            format!("tool file {u} {g} 755 - user.note"),
            "mem missing".to_string(),
            "disk missing".to_string(),
            format!("pipe fifo {u} {g} 640 - -"),
        ],
        "{}",
        out.describe()
    );
    // Each entry left out is named, one line each.
    let err = out.stderr_str();
    let warned: Vec<&str> = err.lines().filter(|l| l.contains("POSIX record")).collect();
    for (path, what) in [
        ("evil.git:", "owner uid 0"),
        ("evil.git/hooks:", "owner uid 0"),
        ("evil.git/hooks/pre-receive:", "the setuid bit"),
        ("tool:", "security.capability"),
        ("mem:", "character device 1:1"),
        ("disk:", "block device 8:0"),
    ] {
        assert!(
            warned
                .iter()
                .any(|l| l.contains(&format!(" {path} ")) && l.contains(what)),
            "no warning naming {path} {what}: {err}"
        );
    }
    assert_eq!(warned.len(), 6, "{err}");
    assert!(!err.contains("pipe"), "{err}");
    assert!(
        d.log_text().contains("applied only in part"),
        "no warning in the log"
    );
    // The workspace's owner still works in it: git sees the pulled files.
    let st = run(
        as_user(a, "git").args(["-C", m.to_str().unwrap(), "status", "--porcelain"]),
        CMD_TIMEOUT,
    );
    assert!(
        st.stdout_str().contains("?? evil.git/") && st.stdout_str().contains("?? tool"),
        "{}",
        st.describe()
    );

    // Root's own thread keeps the exact state, and is told of nothing left out.
    let r = d.open_thread("r", &["--project", "p"]);
    let out = d.cli(["pull", "r", "--remote", &remote, "--name", "feat"]);
    assert!(out.success(), "{}", out.describe());
    assert!(
        !out.stderr_str().contains("POSIX record"),
        "{}",
        out.describe()
    );
    assert_eq!(
        listing(None, &r),
        [
            "evil.git dir 0 0 755 - -".to_string(),
            "evil.git/hooks dir 0 0 755 - -".to_string(),
            "evil.git/hooks/pre-receive file 0 0 4755 - -".to_string(),
            "tool file 0 0 4755 - security.capability,user.note".to_string(),
            "mem char 0 0 666 1:1 -".to_string(),
            "disk block 0 0 666 8:0 -".to_string(),
            format!("pipe fifo {u} {g} 640 - -"),
        ],
    );
    for t in ["t", "r"] {
        d.cli_ok(["release", t, "--discard"]);
    }
}

/// What the probes of [`the_owner_cannot_make_them_through_the_mount_either`] print: each
/// operation's errno name, or "ok".
const PROBES: &str = r#"
import errno, os, sys
cap = bytes.fromhex(sys.argv[1])
def t(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
t("chown-root", lambda: os.chown("mine", 0, -1))
t("chgrp-root", lambda: os.chown("mine", -1, 0))
t("mknod-char", lambda: os.mknod("mem", 0o20666, os.makedev(1, 1)))
t("mknod-block", lambda: os.mknod("disk", 0o60666, os.makedev(8, 0)))
t("setcap", lambda: os.setxattr("mine", "security.capability", cap))
t("trusted", lambda: os.setxattr("mine", "trusted.x", b"1"))
t("suid-root-file", lambda: os.chmod("rootfile", 0o4755))
t("suid-own-file", lambda: os.chmod("mine", 0o4755))
t("mkfifo", lambda: os.mkfifo("fifo"))
t("user-xattr", lambda: os.setxattr("mine", "user.x", b"1"))
st = os.lstat("rootfile"); print("rootfile", st.st_uid, "%o" % (st.st_mode & 0o7777))
st = os.lstat("mine"); print("mine", st.st_uid, st.st_gid, sorted(os.listxattr("mine")))
print("devices", [p for p in ("mem", "disk") if os.path.lexists(p)])
"#;

#[test]
fn the_owner_cannot_make_them_through_the_mount_either() {
    let a = user_a();
    let d = a_thread_of(a);
    let m = d.mount("t");
    // Root (who may join any thread) leaves a file of its own in a's workspace.
    let rf = m.join("rootfile");
    fsop("root's file", move || {
        write_file(&rf, b"root's\n", 0o755);
        std::os::unix::fs::chown(&rf, Some(0), Some(0)).expect("chown");
    });
    py_as(Some(a), &m, "open('mine', 'w').write('mine\\n')").assert_ok();
    let hex: String = CAPABILITY.iter().map(|b| format!("{b:02x}")).collect();
    let mut c = as_user(a, "/usr/bin/python3");
    c.args(["-c", PROBES, &hex]).current_dir(&m);
    let out = run(&mut c, CMD_TIMEOUT);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(
        out.stdout_str(),
        format!(
            "chown-root EPERM\nchgrp-root EPERM\nmknod-char EPERM\nmknod-block EPERM\n\
             setcap EPERM\ntrusted EPERM\nsuid-root-file EPERM\nsuid-own-file ok\nmkfifo ok\n\
             user-xattr ok\nrootfile 0 755\nmine {} {} ['user.x']\ndevices []\n",
            a.uid, a.gid
        )
    );
    d.cli_ok(["release", "t", "--discard"]);
}

/// `git <args>` in `dir` as `u` (root when `None`), with the agent's neutral environment.
fn git_as(u: Option<User>, dir: &Path, args: &[&str]) -> Out {
    let mut c = match u {
        Some(u) => as_user(u, "git"),
        None => {
            let mut c = std::process::Command::new("git");
            agent_env(&mut c);
            c
        }
    };
    c.arg("-C").arg(dir).args(args);
    run(&mut c, CMD_TIMEOUT)
}

/// A directory every user may write, where a command a config names leaves its marker.
fn marks_dir(d: &Daemon) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let m = d.base.join("marks");
    std::fs::create_dir_all(&m).expect("mkdir marks");
    std::fs::set_permissions(&m, std::fs::Permissions::from_mode(0o777)).expect("chmod marks");
    m
}

fn marks(m: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(m)
        .expect("read marks")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `git config --local --list` of the workspace `m`, as `u`.
fn local_config(u: Option<User>, m: &Path) -> Vec<String> {
    let out = git_as(u, m, &["config", "--local", "--list"]);
    assert!(out.success(), "{}", out.describe());
    out.stdout_str().lines().map(str::to_string).collect()
}

/// Without octofs's own `core.fsmonitor` line (it names the workspace's thread).
fn but_fsmonitor(list: &[String]) -> Vec<String> {
    list.iter()
        .filter(|l| !l.starts_with("core.fsmonitor="))
        .cloned()
        .collect()
}

#[test]
fn a_forged_share_record_brings_no_command_in_its_config() {
    let a = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    add_project(&d, "p", &[("README.md", "# demo\n", 0o644)]);
    let share = d.base.join("share.git");
    git(&d.base, ["init", "-q", "--bare", share.to_str().unwrap()]);
    d.cli_ok(["mirror", "set", "p", "--share", share.to_str().unwrap()]);
    let out = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let out = d.cli_as(a, &["release", "t"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());

    // The forger (anyone who may push to the share) replaces the record's config and files a
    // snapshot on top of the thread's, naming the new record.
    let m = marks_dir(&d);
    let mk = m.display();
    let hooks = d.base.join("hooks");
    write_file(
        &hooks.join("pre-commit"),
        format!("#!/bin/sh\ntouch {mk}/hook\n").as_bytes(),
        0o755,
    );
    let inc = d.base.join("included");
    write_file(
        &inc,
        format!("[alias]\n\ty = !touch {mk}/include\n").as_bytes(),
        0o644,
    );
    let s = git(&share, ["rev-parse", "refs/octomate/threads/t"])
        .trim()
        .to_string();
    let r = git(&share, ["rev-parse", "refs/octomate/repo/t"])
        .trim()
        .to_string();
    let mut config = git(&share, ["cat-file", "blob", &format!("{r}:config")]);
    config.push_str(&format!(
        "[core]\n\thooksPath = {hooks}\n\tpager = touch {mk}/pager; cat\n\
         \teditor = touch {mk}/editor\n\tfsmonitor = touch {mk}/fsmonitor; false\n\
         [user]\n\tname = Forged User\n[alias]\n\tx = !touch {mk}/alias\n\
         [diff \"x\"]\n\ttextconv = touch {mk}/textconv; cat\n[include]\n\tpath = {inc}\n",
        hooks = hooks.display(),
        inc = inc.display()
    ));
    let cfg_file = d.base.join("forged-config");
    std::fs::write(&cfg_file, &config).expect("write config");
    let blob = git(&share, ["hash-object", "-w", cfg_file.to_str().unwrap()])
        .trim()
        .to_string();
    let listing: String = git(&share, ["ls-tree", &r])
        .lines()
        .map(|l| {
            if l.ends_with("\tconfig") {
                format!("100644 blob {blob}\tconfig\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let listing_file = d.base.join("forged-tree");
    std::fs::write(&listing_file, listing).expect("write tree listing");
    let out = run(
        std::process::Command::new("sh").arg("-c").arg(format!(
            "git -C {} mktree < {}",
            share.display(),
            listing_file.display()
        )),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let tree = out.stdout_str().trim().to_string();
    let mut args = vec![
        "commit-tree".to_string(),
        tree,
        "-m".into(),
        "record".into(),
    ];
    for p in git(&share, ["rev-list", "--parents", "-n1", &r])
        .split_whitespace()
        .skip(1)
    {
        args.extend(["-p".to_string(), p.to_string()]);
    }
    let forged_record = git(&share, &args).trim().to_string();
    let message = git(&share, ["log", "-1", "--format=%B", &s]).replace(&r, &forged_record);
    let msg_file = d.base.join("forged-message");
    std::fs::write(&msg_file, message).expect("write message");
    let forged = git(
        &share,
        [
            "commit-tree",
            &format!("{s}^{{tree}}"),
            "-p",
            &format!("{s}^1"),
            "-p",
            &s,
            "-F",
            msg_file.to_str().unwrap(),
        ],
    )
    .trim()
    .to_string();
    git(
        &share,
        ["update-ref", "refs/octomate/repo/t", &forged_record],
    );
    git(&share, ["update-ref", "refs/octomate/threads/t", &forged]);

    // `a` opens the thread: this host resumes the share's snapshot, which descends from its own.
    let out = d.cli_as(a, &["open", "t"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let ws = d.mount("t");
    assert_eq!(
        git_as(Some(a), &ws, &["rev-parse", "refs/octomate/saved"])
            .stdout_str()
            .trim(),
        forged,
        "the share's snapshot was not resumed"
    );
    let list = local_config(Some(a), &ws);
    assert!(
        list.contains(&"user.name=Forged User".to_string()),
        "{list:?}"
    );
    for bad in [
        "core.hookspath",
        "core.pager",
        "core.editor",
        "alias.",
        "diff.x.",
        "include.",
        "touch",
    ] {
        assert!(
            !list.iter().any(|l| l.contains(bad)),
            "{bad} came with the forged record: {list:?}"
        );
    }
    // What the user is told: the config was filtered, and what of it was left out.
    let err = out.stderr_str();
    assert!(
        err.contains(".git/config") && err.contains("core.pager") && err.contains("alias.x"),
        "{}",
        out.describe()
    );
    assert!(
        d.log_text().contains(".git/config"),
        "no warning in the log"
    );
    // Every git command an agent runs: none runs a command of the record.
    py_as(
        Some(a),
        &ws,
        "open('.gitattributes', 'w').write('* diff=x\\n'); open('README.md', 'a').write('more\\n')",
    )
    .assert_ok();
    for args in [
        &["status"][..],
        &["log", "-p"],
        &["diff"],
        &["var", "GIT_PAGER"],
        &["var", "GIT_EDITOR"],
        &["x"],
        &["y"],
        &["commit", "-qam", "a change"],
    ] {
        let out = git_as(Some(a), &ws, args);
        assert!(
            !out.stdout_str().contains("touch"),
            "git {args:?}: {}",
            out.describe()
        );
    }
    assert_eq!(
        marks(&m),
        Vec::<String>::new(),
        "a command of the record ran"
    );
    d.cli_ok(["release", "t", "--discard"]);
}

#[test]
fn root_forking_a_users_thread_gets_no_command_of_theirs() {
    let a = user_a();
    let d = a_thread_of(a);
    let ws = d.mount("t");
    let m = marks_dir(&d);
    let mk = m.display().to_string();
    for (k, v) in [
        ("core.pager", format!("touch {mk}/pager; cat")),
        ("alias.x", format!("!touch {mk}/alias")),
        ("user.name", "Alice Agent".to_string()),
    ] {
        git_as(Some(a), &ws, &["config", k, &v]).assert_ok();
    }
    let mine = local_config(Some(a), &ws);
    assert!(
        mine.iter().any(|l| l.starts_with("core.pager=")),
        "{mine:?}"
    );

    // Root's fork: the allowlisted keys only.
    let out = d.cli(["fork", "t", "f"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let f = d.mount("f");
    let list = local_config(None, &f);
    assert!(
        list.contains(&"user.name=Alice Agent".to_string()),
        "{list:?}"
    );
    assert!(
        !list
            .iter()
            .any(|l| l.starts_with("core.pager") || l.starts_with("alias.")),
        "root's fork carries a's commands: {list:?}"
    );
    assert_eq!(
        but_fsmonitor(&list),
        but_fsmonitor(&mine)
            .into_iter()
            .filter(|l| !l.starts_with("core.pager") && !l.starts_with("alias."))
            .collect::<Vec<_>>(),
        "root's fork lost more than the commands"
    );
    assert!(
        out.stderr_str().contains("core.pager"),
        "{}",
        out.describe()
    );
    let _ = git_as(None, &f, &["x"]);
    let _ = git_as(None, &f, &["var", "GIT_PAGER"]);
    assert_eq!(marks(&m), Vec::<String>::new(), "a's command ran as root");

    // `a`'s own fork, and `a`'s release and open: byte for byte.
    let out = d.cli_as(a, &["fork", "t", "t2"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    assert!(
        !out.stderr_str().contains(".git/config"),
        "{}",
        out.describe()
    );
    assert_eq!(
        but_fsmonitor(&local_config(Some(a), &d.mount("t2"))),
        but_fsmonitor(&mine)
    );
    d.cli_as(a, &["release", "t"]).assert_ok();
    let out = d.cli_as(a, &["open", "t"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    assert!(
        !out.stderr_str().contains(".git/config"),
        "{}",
        out.describe()
    );
    assert_eq!(local_config(Some(a), &ws), mine);
    for t in ["t", "t2", "f"] {
        d.cli_ok(["release", t, "--discard"]);
    }
}
