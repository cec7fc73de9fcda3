//! Why a handover failed: on the old side ([`HandoverError`], what `restart` answers after
//! "restart failed, the running daemon goes on serving: ") and on the new side or in the adoption
//! of kept mounts ([`AdoptError`], what the new daemon refuses with, or why a kept mount is let
//! go). One line each, as before they were typed.
//!
//! Owns only the errors' shapes and texts; must not decide anything about the handover.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// The old side's failure: the handover did not happen, this daemon goes on serving.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("{running} control requests still running after {timeout:?}")]
    Busy { running: usize, timeout: Duration },
    #[error("this daemon does not hold its lock file")]
    NoLockFile,
    #[error("a workspace stayed busy with another operation")]
    ThreadBusy,
    #[error("cannot tell this daemon's binary: {0}")]
    OwnPath(#[source] io::Error),
    #[error("cannot listen on {}: {source}", .path.display())]
    Listen { path: PathBuf, source: io::Error },
    #[error("cannot make {} private: {source}", .path.display())]
    Private { path: PathBuf, source: io::Error },
    #[error("cannot start {}: {source}", .exe.display())]
    Start { exe: PathBuf, source: io::Error },
    /// A descriptor or the socket could not be set up (the system call's own line).
    #[error(transparent)]
    Io(#[from] io::Error),
    /// A mount could not be paused or exported.
    #[error("thread {thread}: {source}")]
    Mount { thread: String, source: io::Error },
    #[error("thread {thread}: INIT state unknown")]
    InitUnknown { thread: String },
    #[error("takeover socket: {0}")]
    Accept(#[source] io::Error),
    #[error("the new daemon exited ({0}) before taking over")]
    ExitedEarly(ExitStatus),
    #[error("the new daemon did not connect within {0:?}")]
    NoConnect(Duration),
    #[error("the new daemon exited ({0}) during the handover")]
    Exited(ExitStatus),
    #[error("the new daemon did not answer within {0:?}")]
    NoAnswer(Duration),
    #[error("the handover connection broke: {0}")]
    Broke(#[source] io::Error),
    /// The new daemon answered out of turn (its message, as debug-printed).
    #[error("the new daemon said {said}")]
    Said { said: String },
    #[error("the new daemon said something else: {0}")]
    Garbled(#[source] serde_json::Error),
    #[error("the new daemon refused: {why}")]
    Refused { why: String },
}

/// Why one handed-over or kept mount could not be adopted.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("thread {thread}: descriptor {index} missing")]
    MissingFd { thread: String, index: usize },
    #[error("thread {thread}: {source}")]
    Record {
        thread: String,
        source: crate::records::RecordError,
    },
    #[error("thread {thread}: no workspace record")]
    NoRecord { thread: String },
    #[error("thread {thread}: {source}")]
    Core {
        thread: String,
        source: Box<crate::daemon::error::Error>,
    },
    #[error("thread {thread}: {source}")]
    Session { thread: String, source: io::Error },
    /// Of a kept mount (the thread is named beside it): its record could not be read.
    #[error(transparent)]
    KeptRecord(crate::records::RecordError),
    #[error("no workspace record")]
    KeptNoRecord,
    #[error("not recorded as mounted")]
    NotMounted,
    #[error("kept for {}, not its mount point", .0.display())]
    KeptElsewhere(PathBuf),
    #[error("no longer mounted at {} (unmounted behind the keeper)", .0.display())]
    KeptDetached(PathBuf),
    #[error("no descriptor kept")]
    NoDescriptor,
    #[error("nothing built")]
    NothingBuilt,
    /// The workspace's visible names could not be registered (the core's error, debug-printed).
    #[error("{0:?}")]
    Register(crate::fs::FsError),
    #[error(transparent)]
    Io(#[from] io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handover_errors_keep_their_lines() {
        let e = io::Error::from_raw_os_error(libc::EACCES);
        let cases = [
            (
                HandoverError::Busy {
                    running: 2,
                    timeout: Duration::from_secs(10),
                }
                .to_string(),
                "2 control requests still running after 10s",
            ),
            (
                HandoverError::Listen {
                    path: "/s/takeover.sock".into(),
                    source: io::Error::from_raw_os_error(libc::EACCES),
                }
                .to_string(),
                "cannot listen on /s/takeover.sock: Permission denied (os error 13)",
            ),
            (
                HandoverError::Io(e).to_string(),
                "Permission denied (os error 13)",
            ),
            (
                HandoverError::NoConnect(Duration::from_secs(30)).to_string(),
                "the new daemon did not connect within 30s",
            ),
            (
                HandoverError::Refused { why: "w".into() }.to_string(),
                "the new daemon refused: w",
            ),
            (
                AdoptError::MissingFd {
                    thread: "t".into(),
                    index: 3,
                }
                .to_string(),
                "thread t: descriptor 3 missing",
            ),
            (
                AdoptError::KeptElsewhere("/w/x".into()).to_string(),
                "kept for /w/x, not its mount point",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }
}
