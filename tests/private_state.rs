//! Issue 10, "Credentials in clear" and "World-readable state".
//!
//! 1. [`credentials_live_only_in_the_credentials_file`]: an http upstream that demands basic auth,
//!    added with `user:token@` in its URL and with `--credential-file`; the token reaches the server
//!    (add and sync work) but no file under `<state>` except `<state>/credentials/<project>`, no
//!    listing, no error, no workspace and no log line. An old record holding the URL is migrated.
//! 2. [`state_is_private_whatever_the_umask`]: a daemon started under `umask 000` keeps `<state>`
//!    private (0700 dirs, 0600 files, 0400 blobs; `<state>` itself 0711), and a second, unprivileged
//!    local user can read none of it.
//!
//! Both tests run the whole process under `umask 000` (this file holds nothing else), so that every
//! mode the daemon and the CLI produce is the one they asked for.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(20);

/// A python http server over `dir` that answers 401 unless the request carries
/// `Authorization: Basic base64(user:password)`; killed by its process-group id on drop.
struct AuthServer {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

const SERVER: &str = r#"
import base64, http.server, sys, functools
port, directory, user, password, log = sys.argv[1:6]
want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == want
        with open(log, "a") as f:
            f.write(f"{'ok' if ok else 'denied'} {self.path}\n")
        if not ok:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(port)),
    functools.partial(H, directory=directory)).serve_forever()
"#;

impl AuthServer {
    #[track_caller]
    fn start(base: &Path, dir: &Path, user: &str, password: &str) -> AuthServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let script = base.join("auth_server.py");
        fs::write(&script, SERVER).unwrap();
        let log = base.join("auth_server.log");
        let errlog = fs::File::create(base.join("auth_server.err")).unwrap();
        let child = Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .arg(dir)
            .args([user, password])
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errlog)
            .process_group(0)
            .spawn()
            .expect("spawn python3");
        let server = AuthServer { child, port, log };
        let up = poll(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        assert!(
            up.is_some(),
            "auth server did not come up: {}",
            fs::read_to_string(base.join("auth_server.err")).unwrap_or_default()
        );
        server
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        kill_child_group(&self.child);
        let _ = self.child.wait();
    }
}

/// Every file under `dir` (not following symlinks, not crossing mounts) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let dev = fs::symlink_metadata(dir).unwrap().dev();
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let m = e.path().symlink_metadata().unwrap();
            if m.is_dir() && m.dev() == dev {
                stack.push(e.path());
            } else if m.is_file() {
                let bytes = fs::read(e.path()).unwrap_or_default();
                if String::from_utf8_lossy(&bytes).contains(needle) {
                    out.push(e.path());
                }
            }
        }
    }
    out
}

/// A bare repository served over http (git's dumb protocol) at `<served>/up.git`, with one commit.
fn served_upstream(base: &Path) -> (GitRepo, PathBuf) {
    let up = GitRepo::init(&base.join("upstream"));
    up.write("README.md", "hello\n");
    up.commit_all("one", DATE1);
    let served = base.join("served");
    fs::create_dir(&served).unwrap();
    let bare = served.join("up.git");
    git(
        base,
        [
            "clone",
            "-q",
            "--bare",
            &up.path.to_string_lossy(),
            &bare.to_string_lossy(),
        ],
    );
    git(&bare, ["update-server-info"]);
    (up, bare)
}

/// A new upstream commit, pushed to the served bare repository.
fn advance(up: &GitRepo, bare: &Path, n: u32) -> String {
    up.write("README.md", format!("hello {n}\n"));
    let head = up.commit_all(&format!("commit {n}"), DATE2);
    up.git(["push", "-q", &bare.to_string_lossy(), "main"]);
    git(bare, ["update-server-info"]);
    head
}

#[test]
fn credentials_live_only_in_the_credentials_file() {
    // The daemon under umask 000 (set in its own shell: a process-wide umask would reach every
    // other test of this binary, whose files then came out 0666).
    let mut d = Daemon::unstarted();
    d.spawn_under_umask("000");
    let (up, bare) = served_upstream(&d.base);
    let token = "s3cret-Tok3n-77";
    let server = AuthServer::start(&d.base, bare.parent().unwrap(), "alice", token);
    let clean = format!("http://127.0.0.1:{}/up.git", server.port);
    let with_creds = format!("http://alice:{token}@127.0.0.1:{}/up.git", server.port);

    // The credentials in the URL reach the server (the server refuses everything else)...
    d.cli_ok(["mirror", "add", "proj", &with_creds]);
    assert!(server.log().contains("ok "), "server log: {}", server.log());
    // ... and so do those of a credential file.
    let cred_file = d.base.join("cred");
    fs::write(&cred_file, format!("alice:{token}\n")).unwrap();
    d.cli_ok([
        "mirror",
        "add",
        "viafile",
        &clean,
        "--credential-file",
        &cred_file.to_string_lossy(),
    ]);
    // Without credentials the server refuses: proof that the ones above were used.
    let out = d.cli(["mirror", "add", "nocreds", &clean]);
    assert!(!out.success(), "{}", out.describe());

    // Sync fetches with them.
    let head = advance(&up, &bare, 1);
    for p in ["proj", "viafile"] {
        let out = d.cli_ok(["mirror", "sync", p]);
        assert!(out.contains("updated") && out.contains(&head), "{p}: {out}");
    }

    // Listings carry the URL without credentials.
    for args in [&["mirror", "list"][..], &["mirror", "list", "--json"][..]] {
        let out = d.cli_ok(args);
        assert!(!out.contains(token), "{args:?}: {out}");
        assert!(out.contains(&clean), "{args:?}: {out}");
    }

    // Errors never echo them: an unreachable credentialed upstream, and a failing sync.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for bad in [
        format!("http://alice:{token}@127.0.0.1:{closed}/up.git"),
        format!("http://alice:{token}@127.0.0.1:{}/missing.git", server.port),
    ] {
        let out = d.cli(["mirror", "add", "bad", &bad]);
        assert!(!out.success(), "{}", out.describe());
        assert!(
            !out.stderr_str().contains(token) && !out.stdout_str().contains(token),
            "{}",
            out.describe()
        );
    }

    // A workspace's origin is the clean URL and its .git holds no credentials.
    let ws = PathBuf::from(
        d.cli_ok(["open", "--project", "proj", "w"])
            .trim()
            .to_string(),
    );
    let ws_git = ws.join(".git");
    let (leaks, config) = with_timeout("read .git", FS_TIMEOUT, move || {
        (
            files_containing(&ws_git, token),
            fs::read_to_string(ws_git.join("config")).unwrap(),
        )
    });
    assert!(leaks.is_empty(), "token inside the workspace: {leaks:?}");
    assert!(config.contains(&clean), "{config}");
    d.cli_ok(["release", "w"]);

    // Stored only in the credentials files, which are private.
    let leaks = files_containing(&d.state, token);
    let allowed = [
        d.state.join("credentials/proj"),
        d.state.join("credentials/viafile"),
    ];
    assert_eq!(
        leaks.iter().collect::<std::collections::BTreeSet<_>>(),
        allowed.iter().collect(),
        "files under <state> holding the token"
    );
    for f in &allowed {
        let m = fs::metadata(f).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600, "{}", f.display());
    }
    assert_eq!(
        fs::metadata(d.state.join("credentials")).unwrap().mode() & 0o777,
        0o700
    );
    assert!(
        !d.log_text().contains(token),
        "daemon log: {}",
        d.log_text()
    );

    // A record written by an older octofs, with the credentials in its URL and in the mirror's
    // config: migrated on the next start, and fetches still authenticate.
    d.stop();
    let record = d.state.join("projects/proj.json");
    let text = fs::read_to_string(&record).unwrap();
    fs::write(&record, text.replace(&clean, &with_creds)).unwrap();
    git(
        &d.mirror("proj"),
        ["remote", "set-url", "origin", &with_creds],
    );
    fs::remove_file(d.state.join("credentials/proj")).unwrap();
    d.spawn();
    let head = advance(&up, &bare, 2);
    let out = d.cli_ok(["mirror", "sync", "proj"]);
    assert!(out.contains("updated") && out.contains(&head), "{out}");
    let out = d.cli_ok(["mirror", "list"]);
    assert!(!out.contains(token), "{out}");
    let leaks = files_containing(&d.state, token);
    assert_eq!(
        leaks.iter().collect::<std::collections::BTreeSet<_>>(),
        allowed.iter().collect(),
        "files under <state> holding the token after the migration"
    );
    assert!(
        !d.log_text().contains(token),
        "daemon log: {}",
        d.log_text()
    );
    drop(server);
}

/// Every path under `dir` (itself included), not following symlinks, not crossing mounts.
fn walk(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    let dev = fs::symlink_metadata(dir).unwrap().dev();
    let mut out = vec![(dir.to_path_buf(), fs::symlink_metadata(dir).unwrap())];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let m = e.path().symlink_metadata().unwrap();
            if m.is_dir() && m.dev() == dev {
                stack.push(e.path());
            }
            out.push((e.path(), m));
        }
    }
    out
}

/// Modes: 0700 dirs, 0600 files (0400 blobs), `<state>` itself 0711; the control socket is left
/// out (another part of the daemon decides its mode).
#[track_caller]
fn assert_private(state: &Path) {
    let mut wide = Vec::new();
    let mut blobs = 0;
    for (p, m) in walk(state) {
        let mode = m.mode() & 0o7777;
        let ft = m.file_type();
        use std::os::unix::fs::FileTypeExt;
        if p == state {
            if mode != 0o711 {
                wide.push(format!("{} {mode:o} (want 711)", p.display()));
            }
        } else if ft.is_socket() || ft.is_symlink() {
        } else if p.starts_with(state.join("blobs"))
            && ft.is_file()
            && !p.starts_with(state.join("blobs/tmp"))
        {
            blobs += 1;
            if mode != 0o400 {
                wide.push(format!("{} {mode:o} (a blob: want 400)", p.display()));
            }
        } else if mode & 0o077 != 0 {
            wide.push(format!("{} {mode:o}", p.display()));
        }
    }
    assert!(blobs > 0, "no blob was materialized");
    assert!(
        wide.is_empty(),
        "state wider than private:\n{}",
        wide.join("\n")
    );
}

#[test]
fn state_is_private_whatever_the_umask() {
    let User { uid, gid } = user_b();
    let src = tempfile::tempdir().unwrap();
    let repo = GitRepo::init(&src.path().join("repo"));
    repo.write("README.md", "public readme\n");
    repo.write("secret.txt", "secret base content\n");
    repo.commit_all("initial", DATE1);
    let mut d = Daemon::unstarted();
    // The test's own directories are reachable by anyone: only octofs's modes protect the state.
    fs::set_permissions(&d.base, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(&d.state, fs::Permissions::from_mode(0o777)).unwrap();
    // Started under umask 000, by its own shell (never this process's: `spawn_under_umask`).
    d.spawn_under_umask("000");

    d.cli_ok(["mirror", "add", "proj", &repo.path.to_string_lossy()]);
    let ws = PathBuf::from(
        d.cli_ok(["open", "--project", "proj", "w"])
            .trim()
            .to_string(),
    );
    let w = ws.clone();
    with_timeout("write", FS_TIMEOUT, move || {
        // A base file read (blob cache), a copy-up, new files, one of them private.
        assert_eq!(
            fs::read_to_string(w.join("secret.txt")).unwrap(),
            "secret base content\n"
        );
        fs::write(w.join("README.md"), "changed readme\n").unwrap();
        write_file(
            &w.join("new/private.txt"),
            b"private workspace data\n",
            0o600,
        );
        write_file(&w.join("new/open.txt"), b"open workspace data\n", 0o644);
    });
    d.cli_ok(["snapshot", "w"]);

    assert_private(&d.state);

    // A second local user reads nothing: blobs, catalogs, upper data, records, mirror config and
    // objects, the log. Run as that user: one line per path it could open or list.
    let paths: Vec<PathBuf> = walk(&d.state)
        .into_iter()
        .filter(|(p, m)| (m.is_file() || m.is_dir()) && p != &d.state)
        .map(|(p, _)| p)
        .collect();
    let kinds = [
        "blobs/",
        "catalog",
        "upper/data/",
        "projects/",
        "mirrors/proj/.git/config",
        "mirrors/proj/.git/objects/",
    ];
    for k in kinds {
        assert!(
            paths.iter().any(|p| p.to_string_lossy().contains(k)),
            "nothing under <state> matches {k}"
        );
    }
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .args([
            "--",
            "/bin/sh",
            "-c",
            r#"for p in "$@"; do
                 if [ -d "$p" ]; then ls -- "$p" >/dev/null 2>&1 && echo "listed $p";
                 else cat -- "$p" >/dev/null 2>&1 && echo "read $p"; fi
               done
               cat -- "$1" 2>&1 >/dev/null | grep -q 'Permission denied' || echo "not EACCES: $1"
               ls -- "$0" 2>&1 >/dev/null | grep -q 'Permission denied' || echo "state listed""#,
        ])
        .arg(&d.state)
        .args(paths.iter().filter(|p| p.is_file()))
        .args(paths.iter().filter(|p| p.is_dir()));
    let out = run(&mut cmd, Duration::from_secs(60));
    out.assert_ok();
    assert!(
        out.stdout_str().is_empty(),
        "a second user reads the state:\n{}",
        out.stdout_str()
    );
    d.cli_ok(["release", "w"]);
    d.stop();

    // A state left by an older octofs (world-readable modes): made private at the next start.
    let widen =
        |p: PathBuf, mode: u32| fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
    widen(d.state.clone(), 0o755);
    widen(d.state.join("projects"), 0o755);
    widen(d.state.join("projects/proj.json"), 0o644);
    widen(d.mirror("proj").join(".git"), 0o755);
    widen(d.mirror("proj").join(".git/config"), 0o644);
    let blob = walk(&d.state.join("blobs"))
        .into_iter()
        .find(|(p, m)| m.is_file() && !p.starts_with(d.state.join("blobs/tmp")))
        .unwrap()
        .0;
    widen(blob, 0o444);
    fs::remove_file(d.state.join("private-modes")).unwrap();
    d.spawn();
    assert_private(&d.state);
    d.stop();
}

/// The connection keeper holds every mount's `/dev/fuse` descriptors (`docs/restart.md`): whoever
/// took them could serve any workspace. Its socket is root's, for root only, and another user cannot even
/// connect to it (the keeper also checks the peer's uid).
#[test]
fn another_user_cannot_reach_the_connection_keeper() {
    let d = Daemon::start();
    open_the_way(&d);
    add_project(&d, "p", &[("a.txt", "a\n", 0o644)]);
    d.open_thread("t", &["--project", "p"]);
    let sock = d.state.join("keeper.sock");
    wait_until("the keeper's socket", Duration::from_secs(10), || {
        sock.exists()
    });
    let md = fs::symlink_metadata(&sock).unwrap();
    assert_eq!(
        (md.uid(), md.mode() & 0o077),
        (0, 0),
        "the keeper's socket: {:o}",
        md.mode()
    );
    let mut c = as_user(user_a(), "python3");
    c.args([
        "-c",
        "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint('connected')",
    ])
    .arg(&sock);
    let out = run(&mut c, CMD_TIMEOUT);
    assert!(
        !out.success() && out.stderr_str().contains("Permission denied"),
        "another user reached the keeper: {}",
        out.describe()
    );
    d.cli_ok(["release", "t"]);
}
