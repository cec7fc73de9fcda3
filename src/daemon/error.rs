//! The daemon's errors: why a request was refused or failed, in the one line the CLI prints. A
//! request's error never carries more than that line; the daemon logs what it needs itself.

use crate::fs::FsError;

/// Why a request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The git layer failed (a mirror, a snapshot's objects or refs).
    #[error(transparent)]
    Git(#[from] crate::git::Error),
    /// The caller may not do this (peer credentials against owner or access list).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("unknown thread {0:?}")]
    UnknownThread(String),
    #[error("thread {0} is released (open it to resume)")]
    Released(String),
    #[error("thread {0} is not mounted")]
    NotMounted(String),
    /// The request cannot be done in the thread's or project's current state, or as asked: why,
    /// as data (`refusal`; boxed: a refusal carries more than the other variants).
    #[error(transparent)]
    Refusal(Box<super::refusal::Refusal>),
    /// An operation on a workspace's core failed: what, the errno by name and what the core knew.
    #[error("{what}: {source}")]
    Workspace {
        what: String,
        #[source]
        source: FsError,
    },
    /// What the daemon was doing, and why it failed (a system call, a layer below).
    #[error("{what}: {source}")]
    Op {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A thread's binding or workspace record could not be read or written.
    #[error(transparent)]
    Record(#[from] crate::records::RecordError),
    /// A thread or project name was refused.
    #[error(transparent)]
    Name(#[from] crate::names::InvalidName),
    /// A workspace's `.git`, read in process, could not be read or its commits carried.
    #[error(transparent)]
    OwnRepo(#[from] crate::own_repo::Error),
    /// A dependency layer could not be built or collected.
    #[error(transparent)]
    Deps(#[from] crate::deps::error::Error),
    /// A new workspace's `.git` or its shared index could not be made.
    #[error(transparent)]
    Repo(#[from] crate::repo::Error),
}

/// `Error::Workspace` for a failed core operation: `.map_err(on_workspace("what"))`.
pub(super) fn on_workspace(what: impl Into<String>) -> impl FnOnce(FsError) -> Error {
    let what = what.into();
    move |source| Error::Workspace { what, source }
}

/// Says what was being done when an error happened: `Error::Op { what, source }`.
pub(super) trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error>;
}

impl<T, E: Into<Box<dyn std::error::Error + Send + Sync>>> Context<T> for Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, Error> {
        self.map_err(|e| Error::Op {
            what: what(),
            source: e.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_workspace_operation_names_its_errno() {
        let e = on_workspace("cannot read the workspace's changes")(fuser::Errno::ENOENT.into());
        assert_eq!(
            e.to_string(),
            "cannot read the workspace's changes: ENOENT (No such file or directory)"
        );
        let e = on_workspace("cannot read .git")(FsError::eio("object 3b18 is missing"));
        assert_eq!(
            e.to_string(),
            "cannot read .git: EIO (Input/output error): object 3b18 is missing"
        );
    }

    #[test]
    fn the_workspace_repository_layers_keep_their_one_line() {
        let id = gix::ObjectId::empty_blob(gix::hash::Kind::Sha1);
        let actual = gix::ObjectId::empty_tree(gix::hash::Kind::Sha1);
        let e: Error = crate::own_repo::Error::WrongId { id, actual }.into();
        assert_eq!(
            e.to_string(),
            format!(
                "the workspace's object {id} holds an object whose id is {actual}: not carried"
            )
        );
        let e: Error = crate::repo::Error::Seed {
            what: "HEAD".into(),
            source: fuser::Errno::ENOSPC.into(),
        }
        .into();
        assert_eq!(
            e.to_string(),
            "cannot create .git/HEAD: ENOSPC (No space left on device)"
        );
        assert!(matches!(e, Error::Repo(crate::repo::Error::Seed { .. })));
    }
}
