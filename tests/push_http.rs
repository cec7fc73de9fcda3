//! `octofs push` to an http(s) upstream that needs credentials: the project's credential (kept by the
//! daemon) reaches the server, and it never appears in a workspace, on the command line of any
//! process while the push runs (what `ps` shows every local user), or in the command's output.
//!
//! The server is git's own smart-HTTP backend (`git http-backend`, which accepts pushes) behind a small
//! python server that answers 401 unless the request carries the right Basic credentials, and that
//! holds each push open for a moment so that the push's processes can be looked at while they run.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(20);

const SERVER: &str = r#"
import base64, http.server, os, subprocess, sys, time
port, root, user, secret_file, log = sys.argv[1:6]
password = open(secret_file).read().strip()
want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    def serve(self, method):
        ok = self.headers.get("Authorization") == want
        path, _, query = self.path.partition("?")
        with open(log, "a") as f:
            f.write(f"{'ok' if ok else 'denied'} {method} {path}\n")
        if not ok:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="test"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if method == "POST" and path.endswith("git-receive-pack"):
            time.sleep(1.5)  # the push's processes stay alive while the test looks at them
        env = dict(os.environ, GIT_PROJECT_ROOT=root, GIT_HTTP_EXPORT_ALL="1",
                   REQUEST_METHOD=method, PATH_INFO=path, QUERY_STRING=query,
                   CONTENT_TYPE=self.headers.get("Content-Type") or "",
                   CONTENT_LENGTH=str(len(body)), REMOTE_USER=user, REMOTE_ADDR="127.0.0.1",
                   HTTP_CONTENT_ENCODING=self.headers.get("Content-Encoding") or "",
                   GIT_PROTOCOL=self.headers.get("Git-Protocol") or "")
        out = subprocess.run(["git", "http-backend"], input=body, env=env,
                             capture_output=True).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status = 200
        headers = []
        for line in head.split(b"\r\n"):
            k, _, v = line.decode().partition(":")
            if k.lower() == "status":
                status = int(v.strip().split()[0])
            elif k:
                headers.append((k, v.strip()))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)
    def do_GET(self):
        self.serve("GET")
    def do_POST(self):
        self.serve("POST")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(port)), H).serve_forever()
"#;

/// The python smart-HTTP server, killed by its process-group id on drop.
struct GitHttpServer {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl GitHttpServer {
    #[track_caller]
    fn start(base: &Path, root: &Path, user: &str, password: &str) -> GitHttpServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let script = base.join("git_http_server.py");
        fs::write(&script, SERVER).unwrap();
        let log = base.join("git_http_server.log");
        // The password goes through a file: on the server's command line it would be seen by the
        // very check this test makes.
        let secret = base.join("git_http_server.secret");
        fs::write(&secret, password).unwrap();
        let errlog = fs::File::create(base.join("git_http_server.err")).unwrap();
        let child = Command::new("python3")
            .arg(&script)
            .arg(port.to_string())
            .arg(root)
            .arg(user)
            .arg(&secret)
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errlog)
            .process_group(0)
            .spawn()
            .expect("spawn python3");
        let server = GitHttpServer { child, port, log };
        let up = poll(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        assert!(
            up.is_some(),
            "git http server did not come up: {}",
            fs::read_to_string(base.join("git_http_server.err")).unwrap_or_default()
        );
        server
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for GitHttpServer {
    fn drop(&mut self) {
        kill_child_group(&self.child);
        let _ = self.child.wait();
    }
}

/// Every process's command line, as `ps` shows it to any local user.
fn command_lines() -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(bytes) = fs::read(e.path().join("cmdline"))
            && !bytes.is_empty()
        {
            out.push(String::from_utf8_lossy(&bytes).replace('\0', " "));
        }
    }
    out
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
            } else if m.is_file()
                && String::from_utf8_lossy(&fs::read(e.path()).unwrap_or_default()).contains(needle)
            {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn push_over_http_uses_the_daemons_credential_and_shows_it_nowhere() {
    let d = Daemon::start();
    let token = "pUsh-T0ken-4242";
    // The upstream: a bare repository with one commit, served (and pushable) over smart HTTP.
    let work = GitRepo::init(&d.base.join("work"));
    work.write("README.md", "hello\n");
    work.commit_all("one", DATE1);
    let root = d.base.join("served");
    fs::create_dir(&root).unwrap();
    let bare = root.join("up.git");
    run(
        git_command(&d.base, DATE1).args([
            "clone",
            "-q",
            "--bare",
            work.path.to_str().unwrap(),
            bare.to_str().unwrap(),
        ]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    run(
        git_command(&bare, DATE1).args(["config", "http.receivepack", "true"]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    let server = GitHttpServer::start(&d.base, &root, "alice", token);
    let url = format!("http://127.0.0.1:{}/up.git", server.port);
    let cred_file = d.base.join("cred");
    fs::write(&cred_file, format!("alice:{token}\n")).unwrap();
    d.cli_ok([
        "mirror",
        "add",
        "p",
        &url,
        "--credential-file",
        &cred_file.to_string_lossy(),
    ]);

    let ws = d.open_thread("t", &["--project", "p"]);
    let file = ws.join("pushed.txt");
    with_timeout("write in the mount", FS_TIMEOUT, move || {
        write_file(&file, b"over http\n", 0o644)
    });
    let commit = d
        .cli_ok(["commit", "t", "-m", "over http"])
        .trim()
        .to_string();

    // Look at every command line while the push runs.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let token = token.to_string();
        std::thread::spawn(move || {
            let (mut leaks, mut saw_push) = (Vec::new(), false);
            while !stop.load(Ordering::Relaxed) {
                for line in command_lines() {
                    if line.contains(&token) && !leaks.contains(&line) {
                        leaks.push(line.clone());
                    }
                    if line.contains("git") && line.contains("127.0.0.1") {
                        saw_push = true;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (leaks, saw_push)
        })
    };
    let out = d.cli(["push", "t", "--branch", "main"]);
    stop.store(true, Ordering::Relaxed);
    let (leaks, saw_push) = watcher.join().unwrap();
    out.assert_ok();
    assert!(
        !out.stdout_str().contains(token) && !out.stderr_str().contains(token),
        "{}",
        out.describe()
    );
    assert!(
        saw_push,
        "the push's git processes were never seen running: the command-line check proved nothing"
    );
    assert!(
        leaks.is_empty(),
        "command lines holding the token: {leaks:?}"
    );

    // It reached the server with the credential (the server refuses everything else).
    let got = run(
        git_command(&bare, DATE1).args(["rev-parse", "main"]),
        CMD_TIMEOUT,
    );
    got.assert_ok();
    assert_eq!(got.stdout_str().trim(), commit);
    let log = server.log();
    assert!(log.contains("ok POST /up.git/git-receive-pack"), "{log}");
    assert!(!log.contains("denied POST"), "{log}");

    // Nothing in the workspace (its .git included) holds the token, nor does the daemon's log.
    let leaks = with_timeout("read the workspace", FS_TIMEOUT, {
        let ws = ws.clone();
        let token = token.to_string();
        move || files_containing(&ws, &token)
    });
    assert!(leaks.is_empty(), "token inside the workspace: {leaks:?}");
    let daemon_log = fs::read_to_string(d.state.join("octofs.log")).unwrap_or_default();
    assert!(!daemon_log.contains(token), "token in the daemon's log");
    d.cli_ok(["release", "t"]);
}
