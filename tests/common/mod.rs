//! Shared harness for the octofs integration tests.
//!
//! Everything that can block goes through a timeout: external commands are spawned in their own
//! process group and killed (by that id) when they overrun, and in-process access to a FUSE mount is
//! wrapped in [`with_timeout`]. A [`Daemon`] guard owns a temporary directory holding `state/` and
//! `root/`; on drop — including when a test panics — it stops the daemon, kills its child process by
//! pid if it is still alive, and lazily unmounts anything left under its root.

#![allow(dead_code)]

mod prng;

// Not every test draws random numbers.
#[allow(unused_imports)]
pub use prng::{Rng, pseudo_random};

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use octofs::cow::blobcache::BlobCache;
use octofs::fs::{Presentation, WorkspaceFs, unix_time};
use octofs::git::objects::ObjectStore;

/// Default timeout for one external command.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(30);
/// Fixture commands on the host (building a test repository), which may be large.
pub const FIXTURE_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a daemon gets to come up (socket present and `list` answering).
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_octofs")
}

/// Result of one external command.
#[derive(Debug)]
pub struct Out {
    pub cmd: String,
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Out {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Panics with the command, its status and both streams unless it exited 0.
    #[track_caller]
    pub fn assert_ok(&self) -> &Self {
        assert!(self.success(), "command failed: {}", self.describe());
        self
    }

    /// Panics unless the command exited non-zero.
    #[track_caller]
    pub fn assert_failed(&self) -> &Self {
        assert!(
            !self.success(),
            "command unexpectedly succeeded: {}",
            self.describe()
        );
        self
    }

    /// Panics unless the command was refused the way every bad input must be: a non-zero exit,
    /// exactly one line on stderr naming every needle (case-insensitive), nothing on stdout.
    #[track_caller]
    pub fn assert_one_line_error(&self, needles: &[&str]) -> &Self {
        self.assert_failed();
        let err = self.stderr_str();
        let err = err.trim();
        assert_eq!(
            err.lines().count(),
            1,
            "expected a one-line error: {}",
            self.describe()
        );
        for n in needles {
            assert!(
                err.to_lowercase().contains(&n.to_lowercase()),
                "error does not mention {n:?}: {}",
                self.describe()
            );
        }
        assert!(
            self.stdout.is_empty(),
            "refused command printed on stdout: {}",
            self.describe()
        );
        self
    }

    pub fn describe(&self) -> String {
        format!(
            "`{}` -> {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.cmd,
            self.status,
            self.stdout_str(),
            self.stderr_str()
        )
    }
}

/// The one poll of the tests: asks `probe` until it yields a value, pausing 1 ms at first and
/// doubling up to 50 ms, and `None` once `limit` has passed (the probe is asked once more at the
/// deadline). Every wait on observable state (a process, a mount, a file, a counter, a listener)
/// goes through it or [`wait_until`]; a fixed sleep is left only where a test asserts that
/// something does NOT happen for a while.
pub fn poll<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Waits until `state` holds, or panics naming `what` after `limit`.
#[track_caller]
pub fn wait_until(what: &str, limit: Duration, mut state: impl FnMut() -> bool) {
    if poll(limit, || state().then_some(())).is_none() {
        panic!("{what}: not within {limit:?}");
    }
}

/// Waits for `child` for at most `timeout`; `None` when it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    poll(timeout, || match child.try_wait() {
        Ok(Some(status)) => Some(Some(status)),
        Ok(None) => None,
        Err(_) => Some(None),
    })
    .flatten()
}

/// SIGKILLs the process group led by `child` (spawned with `process_group(0)`) and the child itself.
/// Only called before the child has been reaped, so the ids still belong to it.
pub fn kill_child_group(child: &Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: plain kill(2) on ids we own; errors (already gone) are irrelevant.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Runs `cmd` with stdin from /dev/null and stdout/stderr captured into anonymous files (not pipes,
/// so a grandchild that keeps them open cannot block us). Kills its process group after `timeout`.
pub fn try_run(cmd: &mut Command, timeout: Duration) -> Result<Out, String> {
    let desc = format!("{cmd:?}");
    let io = |e: std::io::Error| format!("{desc}: {e}");
    let mut out_f = tempfile::tempfile().map_err(io)?;
    let mut err_f = tempfile::tempfile().map_err(io)?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out_f.try_clone().map_err(io)?))
        .stderr(Stdio::from(err_f.try_clone().map_err(io)?))
        .process_group(0);
    let mut child = spawn_retrying_busy(cmd).map_err(|e| format!("cannot spawn {desc}: {e}"))?;
    let status = match wait_timeout(&mut child, timeout) {
        Some(status) => status,
        None => {
            kill_child_group(&child);
            let _ = child.wait();
            let mut partial = String::new();
            let _ = err_f.seek(SeekFrom::Start(0));
            let _ = err_f.read_to_string(&mut partial);
            return Err(format!(
                "`{desc}` timed out after {timeout:?}; stderr so far:\n{partial}"
            ));
        }
    };
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    out_f.seek(SeekFrom::Start(0)).map_err(io)?;
    out_f.read_to_end(&mut stdout).map_err(io)?;
    err_f.seek(SeekFrom::Start(0)).map_err(io)?;
    err_f.read_to_end(&mut stderr).map_err(io)?;
    Ok(Out {
        cmd: desc,
        status,
        stdout,
        stderr,
    })
}

/// [`try_run`] that panics on spawn failure or timeout.
#[track_caller]
pub fn run(cmd: &mut Command, timeout: Duration) -> Out {
    match try_run(cmd, timeout) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

/// Spawns `cmd`, retrying for up to 10 s while exec says `ETXTBSY`.
///
/// The tests of a binary run as threads of one process. When another thread forks (a daemon, git,
/// a shell) while this one still holds a program it just wrote open for writing, the child inherits
/// a writable copy of that descriptor until it execs, and an exec of the program in that window
/// fails with `ETXTBSY` — the kernel is right, and `go test` retries the same way. A program that
/// stays busy for 10 s is a real error.
pub fn spawn_retrying_busy(cmd: &mut Command) -> std::io::Result<Child> {
    let started = Instant::now();
    loop {
        match cmd.spawn() {
            Err(e)
                if e.raw_os_error() == Some(libc::ETXTBSY)
                    && started.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            spawned => return spawned,
        }
    }
}

/// Starts a program the test has just written into a mount ([`spawn_retrying_busy`]); panics if
/// it cannot.
#[track_caller]
pub fn spawn_written_program(cmd: &mut Command) -> Child {
    spawn_retrying_busy(cmd).unwrap_or_else(|e| panic!("exec {cmd:?}: {e}"))
}

/// Runs `program args…` with [`CMD_TIMEOUT`].
#[track_caller]
pub fn sh<I, S>(program: &str, args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(Command::new(program).args(args), CMD_TIMEOUT)
}

/// Runs `f` on a helper thread and panics if it does not finish within `timeout` (e.g. a request
/// stuck in a FUSE mount). A panic inside `f` is propagated. A timed-out thread is left blocked;
/// the [`Daemon`] guard's cleanup (stop, kill, umount -l) then releases it.
#[track_caller]
pub fn with_timeout<T, F>(what: &str, timeout: Duration, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let v = f();
        let _ = tx.send(());
        v
    });
    match rx.recv_timeout(timeout) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: did not finish within {timeout:?} (hung FUSE request?)")
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mounts

/// Decodes the octal escapes (`\040` etc.) of a /proc/self/mountinfo field.
fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// How long one file operation on a mount may take in a test before it counts as hung.
pub const FS_TIMEOUT: Duration = Duration::from_secs(20);

/// Runs `f` (file operations on a mount) with [`FS_TIMEOUT`].
#[track_caller]
pub fn fsop<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    with_timeout(what, FS_TIMEOUT, f)
}

/// Reads a file in a mount (with [`FS_TIMEOUT`]); `None` when it cannot be read.
pub fn read_ws(p: &Path) -> Option<Vec<u8>> {
    let p = p.to_path_buf();
    fsop("read a file in a mount", move || fs::read(p).ok())
}

/// Whether a path exists in a mount (with [`FS_TIMEOUT`]), without following a last symlink.
pub fn exists_ws(p: &Path) -> bool {
    let p = p.to_path_buf();
    fsop("stat a path in a mount", move || {
        fs::symlink_metadata(p).is_ok()
    })
}

/// Whether `p` is a mount point now (`/proc/self/mounts`).
pub fn is_mounted(p: &Path) -> bool {
    mount_points().iter().any(|m| m == p)
}

/// Every mount point listed in /proc/self/mountinfo (one entry per mount).
pub fn mount_points() -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .collect()
}

/// Mount points equal to or below `root`, deepest first.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|p| p.starts_with(root))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    v
}

/// Lazily unmounts every mount point at or below `root` (never panics).
pub fn umount_all_under(root: &Path) {
    for m in mounts_under(root) {
        if let Err(e) = try_run(
            Command::new("umount").arg("-l").arg(&m),
            Duration::from_secs(10),
        ) {
            eprintln!("cleanup: umount -l {}: {e}", m.display());
        }
    }
}

/// Polls until every path in `mounts` is a mount point, or panics after `timeout`.
#[track_caller]
pub fn wait_mounted(mounts: &[PathBuf], timeout: Duration) {
    let missing = || {
        let all = mount_points();
        mounts
            .iter()
            .filter(|m| !all.contains(m))
            .collect::<Vec<&PathBuf>>()
    };
    if poll(timeout, || missing().is_empty().then_some(())).is_none() {
        panic!("not mounted after {timeout:?}: {:?}", missing());
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon guard

/// A temporary `state/` + `root/` pair and (optionally) an `octofs serve` child on them.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    /// Canonical path of `dir`.
    pub base: PathBuf,
    pub state: PathBuf,
    pub root: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    starts: u32,
}

impl Daemon {
    /// Creates the directories and starts a daemon, waiting until it answers.
    pub fn start() -> Daemon {
        let mut d = Daemon::unstarted();
        d.spawn();
        d
    }

    /// Creates `<tmp>/state` and `<tmp>/root` but starts nothing.
    pub fn unstarted() -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("octofs-test-")
            .tempdir()
            .expect("tempdir");
        let base = dir.path().canonicalize().expect("canonicalize tempdir");
        // Searchable, as a state directory's parents are on a host: the build user of dependency
        // layers reaches `<state>/deps` through it (docs/deps.md "Build identity and sandbox").
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&base, fs::Permissions::from_mode(0o711)).expect("chmod tempdir");
        let state = base.join("state");
        let root = base.join("root");
        fs::create_dir(&state).expect("mkdir state");
        fs::create_dir(&root).expect("mkdir root");
        Daemon {
            log: base.join("daemon-0.log"),
            dir,
            base,
            state,
            root,
            child: None,
            starts: 0,
        }
    }

    /// Control socket path.
    pub fn socket(&self) -> PathBuf {
        self.state.join("octofs.sock")
    }

    /// Mount path of a thread.
    pub fn mount(&self, thread: &str) -> PathBuf {
        self.root.join(thread)
    }

    /// Mirror path of a project.
    pub fn mirror(&self, project: &str) -> PathBuf {
        self.state.join("mirrors").join(project)
    }

    /// The `state:` line of `octofs status <thread>` (`mounted`, `released`, `not mounted` …).
    #[track_caller]
    pub fn state_of(&self, thread: &str) -> String {
        let st = self.cli_ok(["status", thread]);
        st.lines()
            .find_map(|l| l.strip_prefix("state:"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| panic!("no state in {st}"))
    }

    /// Current daemon log (stderr + stdout of the last `serve`).
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Base command with `--state` and `--root`, without OCTOFS_* from the environment.
    ///
    /// Daemons run the default `serve --io auto` with no page-cache budget for no-open mounts
    /// (`OCTOFS_IO_MEMORY=0`): auto chooses handles for every workspace, as the tests written
    /// before auto expect (their no-open twins ask `--io no-open`). `io_auto` gives the daemon a
    /// budget of its own (`spawn_with_env`).
    pub fn command(&self) -> Command {
        let mut c = Command::new(bin());
        c.env_remove("OCTOFS_STATE")
            .env_remove("OCTOFS_ROOT")
            .env("OCTOFS_IO_MEMORY", "0")
            .arg("--state")
            .arg(&self.state)
            .arg("--root")
            .arg(&self.root);
        c
    }

    /// Runs the CLI with the given arguments (after the global options), with a timeout.
    #[track_caller]
    pub fn cli<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run(self.command().args(args), CMD_TIMEOUT)
    }

    /// The CLI as user `u` (no supplementary groups), pointed at this daemon's state and root.
    pub fn cli_as(&self, u: User, args: &[&str]) -> Out {
        self.cli_as_in(u, &[], args)
    }

    /// [`Daemon::cli_as`] with the supplementary groups `groups`.
    pub fn cli_as_in(&self, u: User, groups: &[u32], args: &[&str]) -> Out {
        let mut c = as_user_in(u, groups, bin());
        c.env_remove("OCTOFS_STATE")
            .env_remove("OCTOFS_ROOT")
            .arg("--state")
            .arg(&self.state)
            .arg("--root")
            .arg(&self.root)
            .args(args);
        run(&mut c, CMD_TIMEOUT)
    }

    /// `octofs open <thread> <args>`, returning the mount path (checked to be `<root>/<thread>`).
    #[track_caller]
    pub fn open_thread(&self, thread: &str, args: &[&str]) -> PathBuf {
        let mut all = vec!["open", thread];
        all.extend_from_slice(args);
        let path = PathBuf::from(self.cli_ok(all).trim());
        assert_eq!(path, self.mount(thread), "open printed an unexpected path");
        path
    }

    /// `octofs snapshot <thread>`, returning the commit id (checked to be 40 hex digits).
    #[track_caller]
    pub fn snapshot_id(&self, thread: &str) -> String {
        let id = self.cli_ok(["snapshot", thread]).trim().to_string();
        assert!(
            id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "snapshot printed {id:?}"
        );
        id
    }

    /// Like [`Daemon::cli_ok`] with a longer limit, for commands whose work grows with the data
    /// (hashing gigabytes into the mirror) and so with the machine's load.
    #[track_caller]
    pub fn cli_ok_within<I, S>(&self, args: I, limit: Duration) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = run(self.command().args(args), limit);
        assert!(
            out.success(),
            "{}\n--- daemon log ---\n{}",
            out.describe(),
            self.log_tail()
        );
        out.stdout_str()
    }

    /// Like [`Daemon::cli`] but asserts success and returns stdout.
    #[track_caller]
    pub fn cli_ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self.cli(args);
        assert!(
            out.success(),
            "{}\n--- daemon log ---\n{}",
            out.describe(),
            self.log_tail()
        );
        out.stdout_str()
    }

    /// Last lines of the daemon log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Spawns `octofs serve` (stdout/stderr to a log file) and waits until it answers.
    #[track_caller]
    pub fn spawn(&mut self) {
        self.spawn_with(&[]);
    }

    /// Like [`Daemon::spawn`], with extra arguments after `serve` (e.g. `--passthrough false`).
    #[track_caller]
    pub fn spawn_with(&mut self, serve_args: &[&str]) {
        self.spawn_with_env(serve_args, &[]);
    }

    /// Like [`Daemon::spawn_with`], with variables `env` in the daemon's environment.
    #[track_caller]
    pub fn spawn_with_env(&mut self, serve_args: &[&str], env: &[(&str, &str)]) {
        let mut cmd = self.command();
        cmd.envs(env.iter().copied()).arg("serve").args(serve_args);
        self.launch(cmd);
    }

    /// Like [`Daemon::spawn`], the daemon started under umask `mask` (e.g. `000`). The umask is
    /// set by a shell that then execs the daemon, never in this process: other tests' threads
    /// create files meanwhile, and a process-wide umask would reach them.
    #[track_caller]
    pub fn spawn_under_umask(&mut self, mask: &str) {
        let mut cmd = self.serve_through_shell(&format!("umask {mask} && exec \"$0\" \"$@\""), &[]);
        cmd.env("OCTOFS_IO_MEMORY", "0");
        self.launch(cmd);
    }

    /// `sh -c script` with `octofs --state … --root … serve serve_args` as its `$0 "$@"` (the
    /// script ends by exec'ing them), without OCTOFS_* from the environment.
    fn serve_through_shell(&self, script: &str, serve_args: &[&str]) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script])
            .arg(bin())
            .arg("--state")
            .arg(&self.state)
            .arg("--root")
            .arg(&self.root)
            .arg("serve")
            .args(serve_args)
            .env_remove("OCTOFS_STATE")
            .env_remove("OCTOFS_ROOT");
        cmd
    }

    /// Starts `cmd` (a daemon) with its output in the next log file and waits until it answers.
    #[track_caller]
    fn launch(&mut self, mut cmd: Command) {
        assert!(self.child.is_none(), "daemon already running");
        self.log = self.base.join(format!("daemon-{}.log", self.starts));
        self.starts += 1;
        let log = fs::File::create(&self.log).expect("create daemon log");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("dup log")))
            .stderr(Stdio::from(log))
            .process_group(0);
        self.child = Some(cmd.spawn().expect("spawn octofs serve"));
        self.wait_ready();
    }

    /// Like [`Daemon::spawn_with_env`], playing systemd's hand-over of its descriptor store:
    /// `fds` become the daemon's descriptors 3, 4, … with `LISTEN_FDS`, `LISTEN_FDNAMES` and
    /// `LISTEN_PID` (its own pid: a shell sets it, then execs the daemon).
    #[track_caller]
    pub fn spawn_with_listen_fds(
        &mut self,
        serve_args: &[&str],
        env: &[(&str, &str)],
        fds: &[(String, std::os::fd::OwnedFd)],
    ) {
        let names: Vec<&str> = fds.iter().map(|(n, _)| n.as_str()).collect();
        let owned: Vec<std::os::fd::OwnedFd> = fds
            .iter()
            .map(|(_, f)| f.try_clone().expect("dup a stored descriptor"))
            .collect();
        let mut cmd = self.serve_through_shell(
            "LISTEN_PID=$$; export LISTEN_PID; exec \"$0\" \"$@\"",
            serve_args,
        );
        cmd.envs(env.iter().copied())
            .env("LISTEN_FDS", owned.len().to_string())
            .env("LISTEN_FDNAMES", names.join(":"));
        octofs::sys::pass_fds_from_3(&mut cmd, &owned).expect("pass the descriptors");
        self.launch(cmd);
    }

    #[track_caller]
    fn wait_ready(&mut self) {
        let ready = poll(READY_TIMEOUT, || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                panic!(
                    "octofs serve exited early with {status}\n--- daemon log ---\n{}",
                    self.log_tail()
                );
            }
            // Only ask the CLI once the socket accepts connections: `list` would otherwise
            // auto-start a second daemon that this guard does not own (a daemon killed with
            // SIGKILL leaves its socket file behind, so existence alone proves nothing).
            if std::os::unix::net::UnixStream::connect(self.socket()).is_ok()
                && let Ok(out) = try_run(self.command().arg("list"), Duration::from_secs(5))
                && out.success()
            {
                return Some(());
            }
            None
        });
        if ready.is_none() {
            panic!(
                "daemon not ready within {READY_TIMEOUT:?}\n--- daemon log ---\n{}",
                self.log_tail()
            );
        }
    }

    /// `octofs stop`, asserting that it succeeds, the daemon exits, and nothing stays mounted under
    /// the root.
    #[track_caller]
    pub fn stop(&mut self) {
        let out = run(self.command().arg("stop"), Duration::from_secs(20));
        assert!(
            out.success(),
            "{}\n--- daemon log ---\n{}",
            out.describe(),
            self.log_tail()
        );
        if let Some(mut child) = self.child.take() {
            match wait_timeout(&mut child, Duration::from_secs(10)) {
                Some(_) => {}
                None => {
                    kill_child_group(&child);
                    let _ = child.wait();
                    panic!(
                        "daemon still running 10 s after `octofs stop`\n--- daemon log ---\n{}",
                        self.log_tail()
                    );
                }
            }
        }
        let left = mounts_under(&self.root);
        assert!(
            left.is_empty(),
            "mounts left under root after `octofs stop`: {left:?}"
        );
    }

    /// Process id of the running `octofs serve` child, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILLs the daemon child (by its own pid, nothing else) and reaps it. Its mounts are left
    /// behind, answering `ENOTCONN`, exactly as after a crash.
    #[track_caller]
    pub fn kill9(&mut self) {
        let pid = self.pid().expect("kill9: no daemon running") as libc::pid_t;
        // SAFETY: plain kill(2) on the pid of our own, not yet reaped, child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        self.reap_killed();
    }

    /// Reaps a daemon child that was SIGKILLed by pid from elsewhere (e.g. another thread of the
    /// test). Panics if it is still alive after a few seconds.
    #[track_caller]
    pub fn reap_killed(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("reap_killed: no daemon child");
        match wait_timeout(&mut child, Duration::from_secs(10)) {
            Some(status) => status,
            None => {
                kill_child_group(&child);
                let _ = child.wait();
                panic!("daemon pid {} did not die after SIGKILL", child.id());
            }
        }
    }

    /// Best-effort shutdown used by Drop: never panics.
    fn cleanup(&mut self) {
        let alive = match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        };
        // Ask politely when something may be answering (ours, or one the CLI auto-started).
        if (alive || self.socket().exists())
            && let Err(e) = try_run(self.command().arg("stop"), Duration::from_secs(10))
        {
            eprintln!("cleanup: {e}");
        }
        if let Some(mut child) = self.child.take()
            && wait_timeout(&mut child, Duration::from_secs(5)).is_none()
        {
            eprintln!("cleanup: daemon pid {} still alive, killing it", child.id());
            kill_child_group(&child);
            let _ = child.wait();
        }
        // Everything a test mounts lives under `base` (even if a test pointed `root` elsewhere
        // inside it).
        umount_all_under(&self.base);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- daemon log ({}) ---\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        self.cleanup();
    }
}

// ---------------------------------------------------------------------------------------------
// Directory listings

/// A recursive listing of `dir` that does not follow symlinks and does not cross into other
/// file systems: relative path -> "type mode content-hash|link-target". The top directory itself
/// is listed as "".
pub fn tree_listing(dir: &Path) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let dev = match fs::symlink_metadata(dir) {
        Ok(m) => m.dev(),
        Err(_) => return map,
    };
    walk(dir, dir, dev, &mut map);
    map
}

fn walk(top: &Path, path: &Path, dev: u64, map: &mut BTreeMap<String, String>) {
    let rel = path
        .strip_prefix(top)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => {
            map.insert(rel, format!("error {e}"));
            return;
        }
    };
    let mode = meta.mode() & 0o7777;
    let ft = meta.file_type();
    let entry = if ft.is_dir() {
        if meta.dev() != dev {
            format!("mountpoint {mode:o}")
        } else {
            let mut names: Vec<PathBuf> = fs::read_dir(path)
                .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
                .unwrap_or_default();
            names.sort();
            for child in names {
                walk(top, &child, dev, map);
            }
            format!("dir {mode:o}")
        }
    } else if ft.is_symlink() {
        let target = fs::read_link(path).unwrap_or_default();
        format!("symlink {mode:o} -> {}", target.display())
    } else if ft.is_file() {
        let bytes = fs::read(path).unwrap_or_default();
        format!(
            "file {mode:o} {} {}",
            bytes.len(),
            blake3::hash(&bytes).to_hex()
        )
    } else if ft.is_socket() {
        format!("socket {mode:o}")
    } else if ft.is_fifo() {
        format!("fifo {mode:o}")
    } else {
        format!("other {mode:o}")
    };
    map.insert(rel, entry);
}

/// Panics with a readable list of differences unless the two listings are equal.
#[track_caller]
pub fn assert_same_listing(
    what: &str,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    if before == after {
        return;
    }
    let mut diffs = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => diffs.push(format!("  removed {k:?}: {v}")),
            Some(w) if w != v => diffs.push(format!("  changed {k:?}: {v}  =>  {w}")),
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            diffs.push(format!("  added   {k:?}: {v}"));
        }
    }
    panic!("{what} changed:\n{}", diffs.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Git repositories

pub const DATE1: &str = "1609459200 +0000"; // 2021-01-01T00:00:00Z
pub const DATE2: &str = "1612137600 +0000"; // 2021-02-01T00:00:00Z

/// A `git` command run in `dir` with an isolated, deterministic configuration and identity.
pub fn git_command(dir: &Path, date: &str) -> Command {
    let mut c = Command::new("git");
    c.current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Octo Test")
        .env("GIT_AUTHOR_EMAIL", "octo@example.invalid")
        .env("GIT_AUTHOR_DATE", date)
        .env("GIT_COMMITTER_NAME", "Octo Test")
        .env("GIT_COMMITTER_EMAIL", "octo@example.invalid")
        .env("GIT_COMMITTER_DATE", date)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .args([
            "-c",
            "init.defaultBranch=main",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "tag.gpgsign=false",
            "-c",
            "core.autocrlf=false",
            "-c",
            "core.quotePath=false",
        ]);
    c
}

/// Runs git in `dir`, asserts success, returns stdout.
#[track_caller]
pub fn git<I, S>(dir: &Path, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str()
}

/// A scratch git repository built with the real git CLI.
pub struct GitRepo {
    pub path: PathBuf,
}

impl GitRepo {
    /// `git init` at `path` (created if missing), default branch `main`.
    #[track_caller]
    pub fn init(path: &Path) -> GitRepo {
        fs::create_dir_all(path).expect("mkdir repo");
        git(path, ["init", "-q"]);
        GitRepo {
            path: path.to_path_buf(),
        }
    }

    pub fn file_url(&self) -> String {
        format!("file://{}", self.path.display())
    }

    #[track_caller]
    pub fn git<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        git(&self.path, args)
    }

    /// Runs git with the given author/committer date.
    #[track_caller]
    pub fn git_at<I, S>(&self, date: &str, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        // A fixture's git on the host: the timeout guards a hang only (a 1 GiB `add` on a loaded
        // machine takes longer than CMD_TIMEOUT).
        let out = run(git_command(&self.path, date).args(args), FIXTURE_TIMEOUT);
        out.assert_ok();
        out.stdout_str()
    }

    /// Writes a regular file with mode 0644 (parents created).
    #[track_caller]
    pub fn write(&self, rel: &str, bytes: impl AsRef<[u8]>) {
        write_file(&self.path.join(rel), bytes.as_ref(), 0o644);
    }

    /// Writes a regular file with mode 0755 (parents created).
    #[track_caller]
    pub fn write_exec(&self, rel: &str, bytes: impl AsRef<[u8]>) {
        write_file(&self.path.join(rel), bytes.as_ref(), 0o755);
    }

    #[track_caller]
    pub fn chmod(&self, rel: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(self.path.join(rel), fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// Creates (or replaces) a symlink `rel` -> `target`.
    #[track_caller]
    pub fn symlink(&self, rel: &str, target: &str) {
        let p = self.path.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("mkdir parent");
        }
        if fs::symlink_metadata(&p).is_ok() {
            fs::remove_file(&p).expect("remove old link");
        }
        std::os::unix::fs::symlink(target, &p).expect("symlink");
    }

    #[track_caller]
    pub fn remove(&self, rel: &str) {
        let p = self.path.join(rel);
        if fs::symlink_metadata(&p)
            .map(|m| m.is_dir())
            .unwrap_or(false)
        {
            fs::remove_dir_all(&p).expect("rm -r");
        } else {
            fs::remove_file(&p).expect("rm");
        }
    }

    /// Records a gitlink (submodule commit) at `rel` in the index and creates the empty directory an
    /// unpopulated submodule has in a checkout (so `git add -A` does not stage its deletion).
    #[track_caller]
    pub fn gitlink(&self, rel: &str, sha: &str) {
        fs::create_dir_all(self.path.join(rel)).expect("mkdir gitlink dir");
        self.git([
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{sha},{rel}"),
        ]);
    }

    /// `git add -A` and commit at `date`; returns the new commit id.
    #[track_caller]
    pub fn commit_all(&self, msg: &str, date: &str) -> String {
        self.git_at(date, ["add", "-A"]);
        self.git_at(date, ["commit", "-q", "--allow-empty", "-m", msg]);
        self.head()
    }

    pub fn head(&self) -> String {
        self.git(["rev-parse", "HEAD"]).trim().to_string()
    }
}

/// Creates an upstream repository at `<base>/up-<project>` with `files` (path, content, mode; a
/// mode of 0o120000 makes a symlink to `content`) committed, and adds it as project `project`.
#[track_caller]
/// Runs `work(i, mount)` for every mount from `workers` threads at once (each takes the next
/// mount), after reading `dir/deep/c.txt` (a name nobody looked up yet) in it and checking it says
/// `gamma`; panics with `what` when a worker did.
pub fn each_mount_in_parallel(
    mounts: &[PathBuf],
    workers: usize,
    what: &str,
    work: impl Fn(usize, &PathBuf) + Send + Sync + 'static,
) {
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mounts = std::sync::Arc::new(mounts.to_vec());
    let work = std::sync::Arc::new(work);
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (next, mounts, work) = (next.clone(), mounts.clone(), work.clone());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(m) = mounts.get(i) else { return };
                    let deep = run(
                        Command::new("cat").arg(m.join("dir/deep/c.txt")),
                        Duration::from_secs(30),
                    );
                    assert_eq!(deep.assert_ok().stdout_str(), "gamma\n", "workspace {i}");
                    work(i, m);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect(what);
    }
}

/// Runs `git fast-import` of `stream` (ending in `done`) into the repository at `repo`, the stream
/// written beside it (`<repo>.fi`): `run` feeds /dev/null to stdin, so a shell redirects it.
pub fn fast_import(repo: &Path, stream: &[u8], timeout: Duration) {
    let file = repo.with_extension("fi");
    std::fs::write(&file, stream).unwrap();
    run(
        Command::new("sh")
            .arg("-c")
            .arg("git -C \"$1\" fast-import --quiet --done < \"$2\"")
            .arg("sh")
            .arg(repo)
            .arg(&file),
        timeout,
    )
    .assert_ok();
}

pub fn add_project(d: &Daemon, project: &str, files: &[(&str, &str, u32)]) -> GitRepo {
    let repo = GitRepo::init(&d.base.join(format!("up-{project}")));
    for (p, content, mode) in files {
        if *mode == 0o120000 {
            repo.symlink(p, content);
        } else {
            write_file(&repo.path.join(p), content.as_bytes(), *mode);
        }
    }
    // Every listed file is tracked, also those a .gitignore matches.
    repo.git(["add", "-A", "--force"]);
    repo.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", project, repo.path.to_str().unwrap()]);
    repo
}

/// Writes `bytes` to `path` with `mode`, creating parent directories.
#[track_caller]
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("mkdir parent");
    }
    fs::write(path, bytes).expect("write file");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `git archive --format=tar <rev>` of `repo`, extracted into `dest` (created) with tar.
///
/// `tar.umask=022` makes the archive carry git's canonical modes (0644/0755 files, 0755
/// directories) instead of git's default umask 002 (0664/0775); `tar -p` (the default for root)
/// keeps them on extraction regardless of the process umask.
#[track_caller]
pub fn extract_archive(repo: &Path, rev: &str, dest: &Path) {
    fs::create_dir_all(dest).expect("mkdir extract dir");
    let tarball = dest.with_extension("tar");
    let out = run(
        git_command(repo, DATE1)
            .args(["-c", "tar.umask=022", "archive", "--format=tar", "-o"])
            .arg(&tarball)
            .arg(rev),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    sh(
        "tar",
        [
            OsStr::new("-x"),
            OsStr::new("-p"),
            OsStr::new("-f"),
            tarball.as_os_str(),
            OsStr::new("-C"),
            dest.as_os_str(),
        ],
    )
    .assert_ok();
    fs::remove_file(&tarball).expect("rm tarball");
}

/// Requests of `op` in the total of a `stats --json` answer.
pub fn op_count(v: &serde_json::Value, op: &str) -> u64 {
    v["total"]["ops"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["op"] == op))
        .and_then(|o| o["count"].as_u64())
        .unwrap_or(0)
}

/// Collects every string (values and object keys) in a JSON document.
pub fn json_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_strings(x, out)),
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                out.push(k.clone());
                json_strings(x, out);
            }
        }
        _ => {}
    }
}

/// Parses `text` as JSON, panicking with the text on failure.
#[track_caller]
pub fn parse_json(what: &str, text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{text}"))
}

// ---------------------------------------------------------------------------------------------
// The filesystem core without a kernel

/// The owner (uid, gid) a core-level workspace presents for every unmodified entry.
pub const CORE_OWNER: (u32, u32) = (1234, 5678);

/// A filesystem core over the base tree `tree` committed at `time` (Unix seconds), its upper layer
/// at `upper`; `statfs` is what `statfs` reports on.
#[track_caller]
pub fn load_core(
    store: &Arc<ObjectStore>,
    blobs: &Arc<BlobCache>,
    tree: gix::ObjectId,
    time: i64,
    upper: &Path,
    statfs: &Path,
) -> WorkspaceFs {
    WorkspaceFs::load(
        store.clone(),
        blobs.clone(),
        tree,
        Presentation {
            uid: CORE_OWNER.0,
            gid: CORE_OWNER.1,
            time: unix_time(time),
        },
        upper,
        statfs.to_path_buf(),
    )
    .expect("load workspace")
}

/// A filesystem core over a new repository in a temporary directory whose one commit holds
/// `files` (path, content); its upper layer and blob cache in the same directory, which the
/// returned `TempDir` keeps.
#[track_caller]
pub fn core_of_files(files: &[(&str, &str)]) -> (tempfile::TempDir, WorkspaceFs) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(&repo).expect("mkdir");
    let r = GitRepo::init(&repo);
    for (path, content) in files {
        r.write(path, content);
    }
    r.commit_all("one", DATE1);
    let (_, _, core) = core_of_repo(tmp.path(), &repo);
    (tmp, core)
}

/// A filesystem core over the HEAD of the repository at `repo`, its blob cache and upper layer in
/// `dir` (`cache/`, `upper/`), with the repository's object store and HEAD it was made from.
#[track_caller]
pub fn core_of_repo(
    dir: &Path,
    repo: &Path,
) -> (
    Arc<ObjectStore>,
    octofs::git::objects::ResolvedRef,
    WorkspaceFs,
) {
    let store = Arc::new(ObjectStore::open(repo).expect("open the object store"));
    let base = store.resolve(None).expect("HEAD resolves");
    let blobs = Arc::new(BlobCache::new(&dir.join("cache")).expect("blob cache"));
    let core = load_core(
        &store,
        &blobs,
        base.tree,
        base.time,
        &dir.join("upper"),
        dir,
    );
    (store, base, core)
}

// ---------------------------------------------------------------------------------------------
// Unprivileged local users, for the tests of the trust boundary.

/// A local user the tests act as.
#[derive(Debug, Clone, Copy)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

/// The user's uid and primary gid, creating a system user without home when missing. Tolerates a
/// concurrent creation of the same user by another test.
pub fn ensure_user(name: &str) -> User {
    let id = |flag: &str| -> Option<u32> {
        let out = try_run(Command::new("id").args([flag, name]), CMD_TIMEOUT).ok()?;
        out.success()
            .then(|| out.stdout_str().trim().parse().ok())
            .flatten()
    };
    for attempt in 0..20 {
        if let (Some(uid), Some(gid)) = (id("-u"), id("-g")) {
            return User { uid, gid };
        }
        // useradd fails while another useradd holds the passwd lock: retry.
        let _ = try_run(
            Command::new("useradd").args([
                "--system",
                "--no-create-home",
                "--user-group",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ]),
            CMD_TIMEOUT,
        );
        std::thread::sleep(Duration::from_millis(50 * attempt));
    }
    panic!("cannot create local user {name}");
}

/// `chmod` of one path.
#[track_caller]
pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Lets other users reach the daemon's `<state>` (its socket) and `<root>` (their mounts), as on a
/// host: the test's temporary directory is private.
pub fn open_the_way(d: &Daemon) {
    for p in [&d.base, &d.state] {
        chmod(p, 0o711);
    }
    chmod(&d.root, 0o755);
}

/// The first unprivileged test user (`octofs-test-user`).
pub fn user_a() -> User {
    ensure_user("octofs-test-user")
}

/// The second unprivileged test user (`octofs-test-other`).
pub fn user_b() -> User {
    ensure_user("octofs-test-other")
}

/// `cmd` with its arguments, run as `u` (no supplementary groups) with a neutral environment.
pub fn as_user(u: User, program: impl AsRef<std::ffi::OsStr>) -> Command {
    as_user_in(u, &[], program)
}

/// [`as_user`] with the supplementary groups `groups`.
pub fn as_user_in(u: User, groups: &[u32], program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", u.uid))
        .arg(format!("--regid={}", u.gid));
    if groups.is_empty() {
        c.arg("--clear-groups");
    } else {
        let list: Vec<String> = groups.iter().map(u32::to_string).collect();
        c.arg(format!("--groups={}", list.join(",")));
    }
    c.arg("--").arg(program);
    agent_env(&mut c)
        .env_remove("OCTOFS_STATE")
        .env_remove("OCTOFS_ROOT");
    c
}

/// The neutral environment an agent's process gets in tests (no home, no host git configuration,
/// a fixed identity, no repository named by the environment).
pub fn agent_env(c: &mut Command) -> &mut Command {
    c.env("HOME", "/nonexistent")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Agent")
        .env("GIT_AUTHOR_EMAIL", "agent@example.invalid")
        .env("GIT_COMMITTER_NAME", "Agent")
        .env("GIT_COMMITTER_EMAIL", "agent@example.invalid")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
}

/// Raises this process's soft limit of open descriptors to at least `n` (as far as the hard limit
/// allows); a daemon spawned afterwards inherits it.
pub fn raise_nofile_limit(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid, local rlimit value.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < n {
            lim.rlim_cur = lim.rlim_max.min(n);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// A daemon serving one workspace (`thread`) of a one-file project `proj` whose README holds `text`.
pub struct OneFileWorkspace {
    pub _src: tempfile::TempDir,
    pub d: Daemon,
    pub mount: PathBuf,
}

/// Starts a daemon (with or without passthrough) and mounts a [`OneFileWorkspace`].
pub fn one_file_workspace(passthrough: bool, thread: &str, text: &str) -> OneFileWorkspace {
    let src = tempfile::Builder::new()
        .prefix("octofs-src-")
        .tempdir()
        .expect("tempdir");
    let repo = GitRepo::init(&src.path().join("upstream"));
    repo.write("README.md", text);
    repo.commit_all("base", DATE1);
    let mut d = Daemon::unstarted();
    d.spawn_with(if passthrough {
        &[]
    } else {
        &["--passthrough", "false"]
    });
    d.cli_ok(["mirror", "add", "proj", &repo.file_url()]);
    d.cli_ok(["open", thread, "--project", "proj"]);
    let mount = d.mount(thread);
    wait_mounted(std::slice::from_ref(&mount), Duration::from_secs(5));
    OneFileWorkspace {
        _src: src,
        d,
        mount,
    }
}

/// `sleep 60` in its own process group with its working directory in `dir` (a process keeping a
/// mount busy), killed by pid when dropped.
pub struct Proc(Child);

impl Proc {
    pub fn sleeper_in(dir: &Path) -> Proc {
        let child = Command::new("sleep")
            .arg("60")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn sleep");
        Proc(child)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        kill_child_group(&self.0);
        let _ = wait_timeout(&mut self.0, Duration::from_secs(5));
    }
}

/// Sets extended attribute `name` of `p` (not following a symlink); panics on failure.
pub fn lsetxattr(p: &Path, name: &str, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
    let n = std::ffi::CString::new(name).expect("name");
    // SAFETY: both strings are NUL-terminated and live across the call; value is a valid slice.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
}

/// What a process working in a mount saw across a crash or restart of the daemon: one read of a
/// base file, one append (with `fsync`) through a file held open since the start, and one append
/// through a file opened for it, per round.
pub struct LoopSaw {
    pub rounds: usize,
    pub errors: Vec<String>,
    pub slowest: Duration,
}

/// Reads `README.md` (expecting `readme`) and appends line `i` to `held.log` (open since the
/// start) and to `reopened.log` (opened each round) in `mount`, each synced, until `stop` or 20
/// errors; `done` counts the rounds.
pub fn work_loop(
    mount: PathBuf,
    readme: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> LoopSaw {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    let mut held = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(mount.join("held.log"))
        .expect("open held.log");
    let mut saw = LoopSaw {
        rounds: 0,
        errors: Vec::new(),
        slowest: Duration::ZERO,
    };
    while !stop.load(Ordering::Relaxed) && saw.errors.len() < 20 {
        let i = saw.rounds;
        let t = Instant::now();
        match fs::read_to_string(mount.join("README.md")) {
            Ok(s) if s == readme => {}
            Ok(s) => saw.errors.push(format!("round {i}: README.md read {s:?}")),
            Err(e) => saw.errors.push(format!("round {i}: read README.md: {e}")),
        }
        if let Err(e) = writeln!(held, "{i}").and_then(|()| held.sync_all()) {
            saw.errors
                .push(format!("round {i}: append to held.log: {e}"));
        }
        let r = fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(mount.join("reopened.log"))
            .and_then(|mut f| writeln!(f, "{i}").and_then(|()| f.sync_all()));
        if let Err(e) = r {
            saw.errors
                .push(format!("round {i}: append to reopened.log: {e}"));
        }
        saw.slowest = saw.slowest.max(t.elapsed());
        saw.rounds += 1;
        done.store(saw.rounds, Ordering::Relaxed);
    }
    saw
}

/// Stops a [`work_loop`] (its `stop` flag), waits for what it saw and asserts it saw no error
/// (the daemon's log beside them); `what` names the event it ran across.
pub fn finish_work_loop(
    stop: &std::sync::atomic::AtomicBool,
    rx: &std::sync::mpsc::Receiver<LoopSaw>,
    what: &str,
    d: &Daemon,
) -> LoopSaw {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let saw = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the loop hung across {what}"));
    eprintln!(
        "{what}: {} rounds, slowest round {:?}, errors {:?}",
        saw.rounds, saw.slowest, saw.errors
    );
    assert!(
        saw.errors.is_empty(),
        "the loop saw {:?}\n{}",
        saw.errors,
        d.log_tail()
    );
    saw
}

/// Whether `text` is the lines `0`, `1`, … `n - 1`: what a [`work_loop`] of `n` rounds appended.
pub fn numbered(text: &str, n: usize) -> bool {
    let lines: Vec<&str> = text.lines().collect();
    lines.len() == n && lines.iter().enumerate().all(|(i, l)| *l == i.to_string())
}
