//! git's fsmonitor hook (protocol v2) for octofs workspaces, as a program of its own: git runs it
//! for every `git status` in a workspace, so it starts with nothing but std and the wire's JSON (no
//! argument parser, no async runtime, no logging), asks the daemon once, prints the answer and
//! exits.
//!
//! git runs it with `argv = [<state>/fsmonitor-<thread>, "2", <token>]`, exec'd directly (the
//! path has no shell metacharacter) in the work tree, as the user who runs git. The first argument
//! is the link the daemon makes to this program when it creates the workspace's `.git`
//! (`core.fsmonitor` names that link), so it says where the control socket is (the link's
//! directory, the state directory) and which thread is asked about (the link's name after
//! `fsmonitor-`) without any argument a shell would have to split. The daemon answers only the
//! thread's owner or root (it checks the socket's peer credentials), so a link run by someone else
//! learns nothing, and a workspace that points `core.fsmonitor` elsewhere only affects itself.
//!
//! Prints the new token, NUL, then each changed path followed by NUL, or `/` NUL when everything
//! may have changed (what `octofs fsmonitor` prints). On any failure it prints one line on stderr
//! and exits non-zero: git then examines every file itself, which is always correct. Reads and
//! writes nothing but the socket and its standard output.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The name of a link to this program, before the thread's name.
const LINK_PREFIX: &str = "fsmonitor-";
/// The control socket, in the state directory.
const SOCKET: &str = "octofs.sock";
/// How long the daemon may take to take the question and to answer it: past this git is better
/// off examining the files itself.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The output's encoding, shared with `octofs fsmonitor` (std only: included, not linked).
#[path = "../proto/hook.rs"]
mod hook;

#[derive(serde::Serialize)]
struct Query<'a> {
    cmd: &'static str,
    thread: &'a str,
    token: &'a str,
}

#[derive(serde::Deserialize)]
struct Response {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    result: Option<Answer>,
}

#[derive(serde::Deserialize)]
struct Answer {
    token: String,
    everything: bool,
    #[serde(default)]
    paths: Vec<String>,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("octofs-fsmonitor: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let (state, thread) = locate(Path::new(&argv0))?;
    let version = args.next();
    if version.as_deref() != Some(OsStr::new("2")) {
        return Err(format!("unsupported hook version {version:?} (expected 2)"));
    }
    // A token that is not UTF-8 is none of ours: sent as it reads, it names no journal position
    // and the daemon answers "everything".
    let token = args
        .next()
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_default();
    let answer = ask(&state.join(SOCKET), &thread, &token)?;
    let out = hook::encode(&answer.token, answer.everything, &answer.paths);
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&out)
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write the answer: {e}"))
}

/// The state directory and the thread a link `<state>/fsmonitor-<thread>` names.
fn locate(argv0: &Path) -> Result<(PathBuf, String), String> {
    let bad = || {
        format!(
            "cannot tell the state directory and the thread from {}: git runs this program \
             through the link <state>/{LINK_PREFIX}<thread> that octofs makes for each workspace",
            argv0.display()
        )
    };
    let name = argv0.file_name().ok_or_else(bad)?.as_bytes();
    let thread = name.strip_prefix(LINK_PREFIX.as_bytes()).ok_or_else(bad)?;
    // The daemon validates the name; this only keeps what is not a name out of the request.
    if thread.is_empty()
        || !thread
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(bad());
    }
    let state = match argv0.parent() {
        Some(p) if p.is_absolute() => p.to_path_buf(),
        _ => return Err(bad()),
    };
    // Checked above: ASCII.
    let thread = String::from_utf8_lossy(thread).into_owned();
    Ok((state, thread))
}

/// One fsmonitor request on the control socket, and its answer.
fn ask(socket: &Path, thread: &str, token: &str) -> Result<Answer, String> {
    let cannot_reach = |e: std::io::Error| {
        format!(
            "cannot reach the octofs daemon at {}: {e}",
            socket.display()
        )
    };
    let mut stream = UnixStream::connect(socket).map_err(cannot_reach)?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(TIMEOUT)))
        .map_err(cannot_reach)?;
    let mut line = serde_json::to_vec(&Query {
        cmd: "fsmonitor",
        thread,
        token,
    })
    .map_err(|e| format!("cannot encode the request: {e}"))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|e| format!("cannot talk to the daemon: {e}"))?;
    let mut reply = Vec::new();
    BufReader::new(stream)
        .read_until(b'\n', &mut reply)
        .map_err(|e| format!("cannot read the daemon's answer: {e}"))?;
    if reply.is_empty() {
        return Err("the daemon closed the connection without answering".into());
    }
    let resp: Response =
        serde_json::from_slice(&reply).map_err(|e| format!("bad answer from the daemon: {e}"))?;
    if !resp.ok {
        return Err(resp
            .error
            .unwrap_or_else(|| "the daemon reported an error".into()));
    }
    resp.result
        .ok_or_else(|| "the daemon's answer has no result".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_names_the_state_and_the_thread() {
        assert_eq!(
            locate(Path::new("/var/lib/octofs/fsmonitor-agent.1_x-y")),
            Ok((PathBuf::from("/var/lib/octofs"), "agent.1_x-y".to_string()))
        );
    }

    #[test]
    fn anything_else_is_refused() {
        for argv0 in [
            "octofs-fsmonitor",
            "/usr/local/bin/octofs-fsmonitor",
            "fsmonitor-t",
            "/s/fsmonitor-",
            "/s/fsmonitor-a b",
            "/s/fsmonitor-a\"b",
            "/",
            "",
        ] {
            let e = locate(Path::new(argv0)).expect_err(argv0);
            assert!(e.contains("<state>/fsmonitor-<thread>"), "{e}");
        }
    }
}
