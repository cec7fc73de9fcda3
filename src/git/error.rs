//! The git layer's errors: what failed, in one line a user can act on. git's own messages come
//! through as the line git ended with; every other failure says what octofs was doing and why it
//! failed (the cause kept as the error's source).

/// An error of the git layer (mirrors, snapshots, object access).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// git could not be started.
    #[error("cannot run git: {0} (is git installed?)")]
    Spawn(#[source] std::io::Error),
    /// git ran and failed: the last line it wrote on stderr (redacted where it may hold a URL).
    #[error("{0}")]
    Git(String),
    /// Clone or fetch made no progress for the whole stall window and was killed.
    #[error(
        "no progress from {upstream} for {secs} s, gave up (octofs serve --fetch-timeout sets the limit)"
    )]
    Stalled { upstream: String, secs: u64 },
    /// The clone or fetch was cancelled by its caller (Ctrl-C) and git was stopped.
    #[error("cancelled; nothing was kept")]
    Cancelled,
    #[error("unknown project {0:?} (add it with `octofs mirror add {0} <upstream>`)")]
    UnknownProject(String),
    #[error("project {0:?} already exists")]
    ProjectExists(String),
    /// A request refused before anything was changed (an upstream, a credential), as data
    /// (`refusal`; boxed: a refusal carries more than the other variants).
    #[error(transparent)]
    Refused(Box<super::refusal::Refusal>),
    /// A repository or record does not hold what it must (a moved ref, a damaged record, a name
    /// that resolves to nothing).
    #[error("{0}")]
    Invalid(String),
    /// A project record could not be read or written (the record store's own one-line message).
    #[error(transparent)]
    Record(#[from] crate::records::RecordError),
    /// What octofs was doing, and why it failed.
    #[error("{what}: {source}")]
    Op {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Says what was being done when an error happened: `Error::Op { what, source }`.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> Context<T>
    for std::result::Result<T, E>
{
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Op {
            what: what(),
            source: e.into(),
        })
    }
}

/// For callers above the git layer that still report one line (`repo`'s seeding).
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}
