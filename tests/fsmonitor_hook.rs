//! git's fsmonitor hook in a workspace is the small `octofs-fsmonitor` program, run through the
//! link `<state>/fsmonitor-<thread>` that the daemon makes, a path git execs without a shell:
//!
//! 1. [`git_runs_the_hook_program_without_a_shell_and_sees_every_change`]: `core.fsmonitor` is
//!    the link, git execs it (no `/bin/sh`), its answer is byte for byte what `octofs fsmonitor`
//!    answers, a change made through the mount between two statuses is listed, and with the hook
//!    failing git falls back to examining every file and still lists every change.
//! 2. [`another_user_learns_nothing_through_the_link`]: the daemon answers the hook only for the
//!    thread's owner (or root), whoever runs the link.
//! 3. [`a_state_dir_with_a_space_falls_back_to_the_octofs_command`]: a link path git would hand to
//!    a shell is not used; `octofs fsmonitor` with quoted arguments is, and works.
//! 4. [`install_puts_the_hook_beside_octofs`]: `scripts/install` installs the hook program.
//! 5. [`a_workspace_mounted_again_gets_the_current_hook`]: a workspace whose config names the
//!    command of an earlier octofs (a binary since moved), or whose link leads to a hook that is
//!    gone, is brought up to date when the daemon mounts it again; the owner's own value, and a
//!    config too large to be one octofs wrote, are kept.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Timeout for one in-process batch of file operations on a mount.
const FS_TIMEOUT: Duration = Duration::from_secs(20);

/// What makes git run a hook command through `/bin/sh -c` (git's `run-command.c`).
const SHELL_METACHARS: &str = "|&;<>()$`\\\"' \t\n*?[#~=%";

/// The hook program under test.
fn hook_bin() -> &'static str {
    env!("CARGO_BIN_EXE_octofs-fsmonitor")
}

/// Project `p`: a few files in two directories, one commit.
fn project(d: &Daemon) {
    let repo = GitRepo::init(&d.base.join("up"));
    repo.write("README.md", "# demo\n");
    repo.write("src/lib.rs", "pub fn f() {}\n");
    repo.write("a.txt", "a\n");
    repo.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
}

/// A `git status --porcelain` and the fsmonitor hook runs git's trace2 saw.
struct Status {
    porcelain: Vec<String>,
    stderr: String,
    /// argv of each child git started.
    started: Vec<Vec<String>>,
    /// Exit code of each child.
    codes: Vec<i64>,
}

fn status(ws: &Path) -> Status {
    let trace = tempfile::NamedTempFile::new().expect("trace file");
    let out = run(
        git_command(ws, DATE1)
            .env("GIT_TRACE2_EVENT", trace.path())
            .args(["status", "--porcelain"]),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let mut s = Status {
        porcelain: out.stdout_str().lines().map(str::to_string).collect(),
        stderr: out.stderr_str(),
        started: Vec::new(),
        codes: Vec::new(),
    };
    s.porcelain.sort();
    for line in fs::read_to_string(trace.path()).unwrap_or_default().lines() {
        let v: serde_json::Value = parse_json("trace2 event", line);
        match v["event"].as_str() {
            Some("child_start") => {
                let mut argv = Vec::new();
                json_strings(&v["argv"], &mut argv);
                s.started.push(argv);
            }
            Some("child_exit") => s.codes.push(v["code"].as_i64().unwrap_or(-1)),
            _ => {}
        }
    }
    s
}

/// The truth a status with fsmonitor must equal: no hook, no untracked cache, the index untouched.
fn reference(ws: &Path) -> Vec<String> {
    let out = run(
        git_command(ws, DATE1).args([
            "--no-optional-locks",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.untrackedCache=false",
            "status",
            "--porcelain",
        ]),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let mut lines: Vec<String> = out.stdout_str().lines().map(str::to_string).collect();
    lines.sort();
    lines
}

fn lines(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Runs `program 2 token` in `dir` (as git runs the hook) and returns its output.
fn run_hook(program: &Path, dir: &Path, token: &str) -> Out {
    let mut c = Command::new(program);
    c.current_dir(dir).args(["2", token]);
    run(&mut c, CMD_TIMEOUT)
}

/// Catches: a hook git runs through a shell (or `octofs` again), a hook answer that differs from
/// `octofs fsmonitor`'s (an encoding slip makes git trust a changed file), a hook that reports
/// success when the daemon refused it (git would trust stale data), and a link to another program.
#[test]
fn git_runs_the_hook_program_without_a_shell_and_sees_every_change() {
    let d = Daemon::start();
    project(&d);
    let ws = d.open_thread("t", &["--project", "p"]);
    let link = d.state.join("fsmonitor-t");
    let configured = git(&ws, ["config", "core.fsmonitor"]).trim().to_string();
    assert_eq!(Path::new(&configured), link, "core.fsmonitor");
    assert!(
        !configured.contains(|c| SHELL_METACHARS.contains(c)),
        "git would run {configured:?} through a shell"
    );
    assert_eq!(
        fs::canonicalize(&link).expect("the link leads somewhere"),
        fs::canonicalize(hook_bin()).unwrap(),
        "the link is not to the hook program"
    );

    // First status: the hook runs (asked about the base), nothing changed.
    let first = status(&ws);
    assert!(first.porcelain.is_empty(), "{:?}", first.porcelain);
    assert!(first.stderr.trim().is_empty(), "{}", first.stderr);
    assert_eq!(first.started.len(), 1, "children: {:?}", first.started);
    assert_eq!(first.started[0][..2], [configured.clone(), "2".to_string()]);
    assert_eq!(first.codes, [0]);

    // Changes through the mount between two statuses: the second status asks with the first's
    // token and must list them.
    let w = ws.clone();
    with_timeout("change files", FS_TIMEOUT, move || {
        fs::write(w.join("a.txt"), "changed\n").unwrap();
        fs::write(w.join("new.txt"), "new\n").unwrap();
    });
    let second = status(&ws);
    assert_eq!(second.porcelain, lines(&[" M a.txt", "?? new.txt"]));
    assert_eq!(second.porcelain, reference(&ws));
    assert!(second.stderr.trim().is_empty(), "{}", second.stderr);
    assert_eq!(second.codes, [0]);
    let token = second.started[0][2].clone();
    assert!(token.starts_with("octofs:"), "token {token:?}");

    // git execs the link itself: no shell, no `octofs`.
    if run(Command::new("strace").arg("-V"), CMD_TIMEOUT).success() {
        let log = tempfile::NamedTempFile::new().unwrap();
        let out = run(
            Command::new("strace")
                .args(["-f", "-qq", "-s", "4096", "-e", "trace=execve", "-o"])
                .arg(log.path())
                .arg("git")
                .args(["-c", "core.quotePath=false", "status", "--porcelain"])
                .current_dir(&ws)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_CONFIG_NOSYSTEM", "1"),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        let execs: Vec<String> = fs::read_to_string(log.path())
            .unwrap()
            .lines()
            .filter(|l| l.contains("execve(\""))
            .map(str::to_string)
            .collect();
        assert!(
            execs
                .iter()
                .any(|l| l.contains(&format!("execve(\"{configured}\""))),
            "git did not exec the link: {execs:#?}"
        );
        assert!(
            !execs
                .iter()
                .any(|l| l.contains("execve(\"/bin/sh\"") || l.contains(bin())),
            "a shell or octofs ran: {execs:#?}"
        );
    } else {
        eprintln!("no strace: the exec of the hook itself is not checked");
    }

    // The hook's answer is `octofs fsmonitor`'s, byte for byte: after a token (two changes and the
    // status's own index write since), for an unknown token (everything), and for none.
    for t in [token.as_str(), "octofs:1:1", ""] {
        let hook = run_hook(&link, &ws, t);
        hook.assert_ok();
        let cli = d.cli(["fsmonitor", "t", "2", t]);
        cli.assert_ok();
        assert_eq!(hook.stdout, cli.stdout, "answers to {t:?} differ");
    }
    let answer = run_hook(&link, &ws, &token).stdout;
    assert!(
        answer.ends_with(b"\0a.txt\0new.txt\0"),
        "{:?}",
        String::from_utf8_lossy(&answer)
    );

    // A failing hook (a link naming a thread the daemon does not serve): exit status non-zero with
    // one line; git examines every file and still lists every change.
    let other = d.state.join("fsmonitor-nosuch");
    std::os::unix::fs::symlink(hook_bin(), &other).unwrap();
    let refused = run_hook(&other, &ws, &token);
    refused.assert_failed();
    assert!(refused.stdout.is_empty(), "{}", refused.describe());
    assert!(
        refused.stderr_str().starts_with("octofs-fsmonitor: ")
            && refused.stderr_str().contains("nosuch"),
        "{}",
        refused.describe()
    );
    git(&ws, ["config", "core.fsmonitor", other.to_str().unwrap()]);
    let w = ws.clone();
    with_timeout("change a file", FS_TIMEOUT, move || {
        fs::write(w.join("src/lib.rs"), "pub fn g() {}\n").unwrap();
        fs::create_dir(w.join("dir")).unwrap();
        fs::write(w.join("dir/x.txt"), "x\n").unwrap();
    });
    let failing = status(&ws);
    let all = lines(&[" M a.txt", " M src/lib.rs", "?? dir/", "?? new.txt"]);
    assert_eq!(failing.porcelain, all);
    assert_eq!(failing.codes.len(), 1, "children: {:?}", failing.started);
    assert_ne!(failing.codes[0], 0, "the refused hook reported success");

    // Back to the real hook: still right after git rescanned.
    git(&ws, ["config", "core.fsmonitor", configured.as_str()]);
    let w = ws.clone();
    with_timeout("remove a file", FS_TIMEOUT, move || {
        fs::remove_file(w.join("README.md")).unwrap()
    });
    let back = status(&ws);
    let mut all = all;
    all.push(" D README.md".into());
    all.sort();
    assert_eq!(back.porcelain, all);
    assert_eq!(back.porcelain, reference(&ws));
    assert_eq!(back.codes, [0]);
    d.cli_ok(["release", "t"]);
}

/// Catches: a hook (or daemon) that trusts the thread its link names instead of who runs it.
#[test]
fn another_user_learns_nothing_through_the_link() {
    let b = user_b();
    let d = Daemon::start();
    // The test's directories are reachable; only the daemon's check stands in the way.
    for (p, mode) in [(&d.base, 0o711), (&d.state, 0o711), (&d.root, 0o755)] {
        fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    }
    project(&d);
    let ws = d.open_thread("t", &["--project", "p"]);
    let link = d.state.join("fsmonitor-t");
    let mut c = as_user(b, &link);
    c.current_dir(&d.base).args(["2", ""]);
    let out = run(&mut c, CMD_TIMEOUT);
    out.assert_failed();
    assert!(out.stdout.is_empty(), "{}", out.describe());
    let err = out.stderr_str();
    assert!(
        err.contains("permission denied") && err.contains("thread t belongs to"),
        "{}",
        out.describe()
    );
    // Root (the owner here) is answered.
    run_hook(&link, &ws, "").assert_ok();
    d.cli_ok(["release", "t"]);
}

/// Catches: a hook path with a space handed to git unquoted (git would run `sh -c` on the words),
/// and a fallback that does not answer.
#[test]
fn a_state_dir_with_a_space_falls_back_to_the_octofs_command() {
    let mut d = Daemon::unstarted();
    d.state = d.base.join("my state");
    fs::create_dir(&d.state).unwrap();
    d.spawn();
    project(&d);
    let ws = d.open_thread("t", &["--project", "p"]);
    let configured = git(&ws, ["config", "core.fsmonitor"]).trim().to_string();
    let exe = fs::canonicalize(bin()).unwrap();
    assert_eq!(
        configured,
        format!(
            "'{}' --state '{}' --root '{}' fsmonitor t",
            exe.display(),
            d.state.display(),
            d.root.display()
        )
    );
    assert!(
        fs::symlink_metadata(d.state.join("fsmonitor-t")).is_err(),
        "a link was made although git would not exec it"
    );
    assert!(status(&ws).porcelain.is_empty());
    let w = ws.clone();
    with_timeout("change a file", FS_TIMEOUT, move || {
        fs::write(w.join("a.txt"), "changed\n").unwrap()
    });
    let s = status(&ws);
    assert_eq!(s.porcelain, lines(&[" M a.txt"]));
    assert_eq!(s.codes, [0]);
    assert!(s.stderr.trim().is_empty(), "{}", s.stderr);
    d.cli_ok(["release", "t"]);
}

/// Catches: an install without the hook program (every workspace would fall back to the slow
/// command) or with one that is not executable.
#[test]
fn install_puts_the_hook_beside_octofs() {
    let dest = tempfile::tempdir().expect("tempdir");
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    run(
        Command::new(repo.join("scripts/install"))
            .args(["--bin", bin()])
            .env("DESTDIR", dest.path())
            .env("PREFIX", "/usr/local"),
        Duration::from_secs(120),
    )
    .assert_ok();
    let hook = dest.path().join("usr/local/bin/octofs-fsmonitor");
    let mode = fs::metadata(&hook)
        .expect("hook installed")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "hook mode");
    assert_eq!(fs::read(&hook).unwrap(), fs::read(hook_bin()).unwrap());
}

/// Catches: a workspace made by an earlier octofs (its `core.fsmonitor` the quoted `octofs` command
/// of a binary that has since moved, and no link) or whose link leads to a hook program that is
/// gone: every `git status` in it would print a hook error and rescan the whole tree. Also catches
/// a rewrite that touches the owner's own value or the config's other lines.
#[test]
fn a_workspace_mounted_again_gets_the_current_hook() {
    let mut d = Daemon::start();
    project(&d);
    let old = d.open_thread("old", &["--project", "p"]);
    let moved = d.open_thread("moved", &["--project", "p"]);
    let own = d.open_thread("own", &["--project", "p"]);
    let huge = d.open_thread("huge", &["--project", "p"]);
    let gone = d.base.join("gone/target/release");
    let stale_command = format!(
        "'{}' --state '{}' --root '{}' fsmonitor old",
        gone.join("octofs").display(),
        d.state.display(),
        d.root.display()
    );
    git(&old, ["config", "core.fsmonitor", &stale_command]);
    git(&old, ["config", "user.name", "Kept Name"]);
    fs::remove_file(d.state.join("fsmonitor-old")).expect("remove the link");
    let moved_link = d.state.join("fsmonitor-moved");
    fs::remove_file(&moved_link).unwrap();
    std::os::unix::fs::symlink(gone.join("octofs-fsmonitor"), &moved_link).unwrap();
    git(&own, ["config", "core.fsmonitor", "false"]);
    // A config the daemon must not read whole: the old command, then 2 GiB of holes.
    let huge_config = huge.join(".git/config");
    let huge_text = format!(
        "[core]\n\tfsmonitor = '{}' --state '{}' --root '{}' fsmonitor huge\n",
        gone.join("octofs").display(),
        d.state.display(),
        d.root.display()
    );
    fs::write(&huge_config, &huge_text).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(&huge_config)
        .and_then(|f| f.set_len(2 << 30))
        .unwrap();
    let w = old.clone();
    with_timeout("change a file", FS_TIMEOUT, move || {
        fs::write(w.join("a.txt"), "changed\n").unwrap()
    });
    // Before: git cannot run the hook.
    let broken = status(&old);
    assert_eq!(broken.porcelain, lines(&[" M a.txt"]));
    assert!(
        broken.codes.iter().all(|c| *c != 0),
        "the stale command ran: {:?}",
        broken.codes
    );

    d.stop();
    d.spawn();
    wait_mounted(
        &[old.clone(), moved.clone(), own.clone(), huge.clone()],
        Duration::from_secs(20),
    );
    // Left as it is (not read, not rewritten densely).
    let mut head = vec![0u8; huge_text.len()];
    std::io::Read::read_exact(&mut fs::File::open(&huge_config).unwrap(), &mut head).unwrap();
    assert_eq!(String::from_utf8_lossy(&head), huge_text);
    assert_eq!(fs::metadata(&huge_config).unwrap().len(), 2 << 30);
    let hook = fs::canonicalize(hook_bin()).unwrap();
    for t in ["old", "moved"] {
        let link = d.state.join(format!("fsmonitor-{t}"));
        assert_eq!(
            fs::canonicalize(&link).ok(),
            Some(hook.clone()),
            "the link of {t} does not lead to the hook program"
        );
        let ws = d.root.join(t);
        let configured = git(&ws, ["config", "core.fsmonitor"]).trim().to_string();
        assert_eq!(Path::new(&configured), link, "core.fsmonitor of {t}");
        let s = status(&ws);
        assert_eq!(s.codes, [0], "{t}: {}", s.stderr);
        assert!(s.stderr.trim().is_empty(), "{t}: {}", s.stderr);
        assert_eq!(s.porcelain, reference(&ws), "{t}");
    }
    assert_eq!(status(&old).porcelain, lines(&[" M a.txt"]));
    assert_eq!(git(&old, ["config", "user.name"]).trim(), "Kept Name");
    assert_eq!(
        git(&own, ["config", "core.fsmonitor"]).trim(),
        "false",
        "the owner's own value was replaced"
    );
    fs::write(&huge_config, "").unwrap();
    for t in ["old", "moved", "own", "huge"] {
        d.cli_ok(["release", t]);
    }
}
