//! The clients' side of the control socket (the CLI, doctor, the CSI plugin): send one request,
//! read one response as the request's answer type ([`call`]), and start a daemon when none answers.
//! Owns the connection and the daemon's start; knows the protocol only through `crate::proto`,
//! never the daemon.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::path::PathBuf;
use std::process::ExitStatus;

use serde::Deserialize;

use crate::layout::Layout;
use crate::proto::{Call, Request, Response};

/// Why the CLI could not get an answer from a daemon: the one line it prints.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no octofs daemon is running for {} ({source})", state.display())]
    NoDaemon {
        state: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the octofs daemon at {}: {source}", socket.display())]
    Unreachable {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot encode the request: {0}")]
    Encode(#[source] serde_json::Error),
    #[error("cannot talk to the daemon: {0}")]
    Send(#[source] std::io::Error),
    #[error("cannot read the daemon's answer: {0}")]
    Receive(#[source] std::io::Error),
    #[error("the daemon closed the connection without answering (see its log)")]
    Closed,
    #[error("bad answer from the daemon: {0}")]
    BadAnswer(#[source] serde_json::Error),
    #[error("root {} is not a directory", .0.display())]
    RootNotDir(PathBuf),
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create state dir {}: {source}", dir.display())]
    CreateStateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open {}: {source}", path.display())]
    OpenLog {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot find the octofs binary: {0}")]
    NoBinary(#[source] std::io::Error),
    #[error("cannot hand the log to the daemon: {0}")]
    LogHandle(#[source] std::io::Error),
    #[error("cannot start the daemon: {0}")]
    Start(#[source] std::io::Error),
    #[error("the daemon exited at start ({status}): {last_log_line}")]
    ExitedAtStart {
        status: ExitStatus,
        last_log_line: String,
    },
    #[error("the daemon did not come up within 15 s (see {})", log.display())]
    StartTimeout { log: PathBuf },
    /// The daemon answered with an error (its one line).
    #[error("{0}")]
    Refused(String),
}

/// The CLI prints an error as its one line.
impl From<ClientError> for String {
    fn from(e: ClientError) -> String {
        e.to_string()
    }
}

fn connect(layout: &Layout) -> std::io::Result<UnixStream> {
    UnixStream::connect(layout.socket())
}

/// An answer of the daemon: typed, as it came (`--json` prints it so), and its warnings.
#[derive(Debug, Clone)]
pub struct Answered<A> {
    pub answer: A,
    /// The response's `result` as the daemon wrote it.
    pub result: serde_json::Value,
    pub warnings: Vec<String>,
}

impl<A> Answered<A> {
    /// The same answer seen as another type (a text form that needs the request's context).
    pub fn map<B>(self, f: impl FnOnce(A) -> B) -> Answered<B> {
        Answered {
            answer: f(self.answer),
            result: self.result,
            warnings: self.warnings,
        }
    }
}

/// Sends `req` and returns the daemon's answer as `R`'s answer type; a refusal is
/// [`ClientError::Refused`] with the daemon's one line. With `autostart`, a daemon is started in
/// the background (logging to `<state>/octofs.log`) when none answers.
pub fn call<R: Call>(
    layout: &Layout,
    req: R,
    autostart: bool,
) -> Result<Answered<R::Answer>, ClientError> {
    let resp = send(layout, &req.into(), autostart)?;
    if !resp.ok {
        return Err(ClientError::Refused(
            resp.error
                .unwrap_or_else(|| "the daemon reported an error".into()),
        ));
    }
    let answer = R::Answer::deserialize(&resp.result).map_err(ClientError::BadAnswer)?;
    Ok(Answered {
        answer,
        result: resp.result,
        warnings: resp.warnings,
    })
}

/// Sends `req` and returns the daemon's response as it came (ok or not).
pub fn send(layout: &Layout, req: &Request, autostart: bool) -> Result<Response, ClientError> {
    let stream = match connect(layout) {
        Ok(s) => s,
        // Only when no daemon listens: a socket the caller may not reach is not a reason to start
        // a second daemon (which could not take the state directory anyway).
        Err(e) if autostart && no_daemon(&e) => start_daemon(layout)?,
        Err(source) if no_daemon(&source) => {
            return Err(ClientError::NoDaemon {
                state: layout.state.clone(),
                source,
            });
        }
        Err(source) => {
            return Err(ClientError::Unreachable {
                socket: layout.socket(),
                source,
            });
        }
    };
    exchange(stream, req)
}

/// Whether a failed connect means that no daemon is listening (no socket, or a stale one).
fn no_daemon(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    )
}

fn exchange(mut stream: UnixStream, req: &Request) -> Result<Response, ClientError> {
    let mut line = serde_json::to_vec(req).map_err(ClientError::Encode)?;
    line.push(b'\n');
    stream.write_all(&line).map_err(ClientError::Send)?;
    let mut resp = String::new();
    BufReader::new(stream)
        .read_line(&mut resp)
        .map_err(ClientError::Receive)?;
    if resp.is_empty() {
        return Err(ClientError::Closed);
    }
    serde_json::from_str(&resp).map_err(ClientError::BadAnswer)
}

fn start_daemon(layout: &Layout) -> Result<UnixStream, ClientError> {
    // Refuse what the daemon would refuse before creating anything (its log included).
    if let Ok(m) = std::fs::metadata(&layout.root)
        && !m.is_dir()
    {
        return Err(ClientError::RootNotDir(layout.root.clone()));
    }
    // The daemon makes its state private at start; what is made here before it runs is already.
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(parent) = layout.state.parent() {
        std::fs::create_dir_all(parent).map_err(|source| ClientError::CreateDir {
            dir: parent.to_path_buf(),
            source,
        })?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(crate::layout::STATE_DIR_MODE)
        .create(&layout.state)
        .map_err(|source| ClientError::CreateStateDir {
            dir: layout.state.clone(),
            source,
        })?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(layout.log_file())
        .map_err(|source| ClientError::OpenLog {
            path: layout.log_file(),
            source,
        })?;
    let exe = std::env::current_exe().map_err(ClientError::NoBinary)?;
    let mut child = Command::new(exe)
        .arg("--state")
        .arg(&layout.state)
        .arg("--root")
        .arg(&layout.root)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(ClientError::LogHandle)?)
        .stderr(log)
        // Its own process group: a Ctrl-C in the terminal that started it does not stop it.
        .process_group(0)
        .spawn()
        .map_err(ClientError::Start)?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Ok(s) = connect(layout) {
            return Ok(s);
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(ClientError::ExitedAtStart {
                status,
                last_log_line: last_log_line(layout),
            });
        }
        if Instant::now() > deadline {
            return Err(ClientError::StartTimeout {
                log: layout.log_file(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn last_log_line(layout: &Layout) -> String {
    std::fs::read_to_string(layout.log_file())
        .ok()
        .and_then(|t| {
            t.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "no log".into())
}

/// Asks the daemon to stop and waits until it has released the state directory.
pub fn stop(layout: &Layout) -> Result<bool, ClientError> {
    let Ok(stream) = connect(layout) else {
        return Ok(false);
    };
    let resp = exchange(stream, &Request::Stop)?;
    if !resp.ok {
        return Err(ClientError::Refused(resp.error.unwrap_or_default()));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while layout.socket().exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The daemon removes its socket after unmounting; its lock goes with the process.
    if let Ok(f) = std::fs::File::open(layout.daemon_lock()) {
        while Instant::now() < deadline {
            match f.try_lock() {
                Ok(()) => break,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
    Ok(true)
}
