//! The filesystem core's error: the errno the kernel is answered with, and what the core knew when it
//! failed (which data file, which catalog append, which blob or object) that the adapter cannot know.
//! The errno is the whole contract with callers (pjdfstest checks it); the context is for the one log
//! line of a failed request ([`super::failures`]) and for the daemon's one-line messages. Decides no
//! errno and touches no state.
//!
//! `?` turns a bare [`Errno`] (or an [`std::io::Error`]: its OS error, else `EIO`) into an [`FsError`]
//! without context; [`Context`] attaches it where the core knows something (`docs/errors.md`).

use std::fmt;

use fuser::Errno;

/// A failed core operation: the errno to answer with, and what failed, when the core knows more than
/// the request said (e.g. "data file /…/upper/data/8000…2a", "blob 3b18e5… into the blob cache").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    pub errno: Errno,
    /// What failed, innermost last ("open: data file …: No such file"); `None` for the errors a
    /// request's own arguments explain (ENOENT of a name, EEXIST, ENOTEMPTY, ...).
    pub context: Option<String>,
}

/// The result of every core request.
pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    /// `errno`, because of `what`.
    pub fn new(errno: Errno, what: impl fmt::Display) -> FsError {
        FsError {
            errno,
            context: Some(what.to_string()),
        }
    }

    /// `EIO` because of `what` (an internal inconsistency, a missing object, a damaged record).
    pub fn eio(what: impl fmt::Display) -> FsError {
        FsError::new(Errno::EIO, what)
    }

    /// The same errno, with `what` said before the context it has ("what: inner").
    pub fn context(mut self, what: impl fmt::Display) -> FsError {
        self.context = Some(match self.context.take() {
            Some(inner) => format!("{what}: {inner}"),
            None => what.to_string(),
        });
        self
    }
}

impl From<Errno> for FsError {
    fn from(errno: Errno) -> FsError {
        FsError {
            errno,
            context: None,
        }
    }
}

/// An I/O error's own OS errno (ENOSPC stays ENOSPC); one without (a short read, a corrupt object)
/// is `EIO`, with its message as the context.
impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> FsError {
        match e.raw_os_error() {
            Some(n) => Errno::from_i32(n).into(),
            None => FsError::eio(e),
        }
    }
}

impl PartialEq<Errno> for FsError {
    fn eq(&self, other: &Errno) -> bool {
        self.errno == *other
    }
}

/// "EIO (Input/output error): blob 3b18e5… into the blob cache: …" — the errno by name, then the
/// context if any.
impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::errno::describe_errno(self.errno))?;
        if let Some(c) = &self.context {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FsError {}

/// Attaches what failed to an error on its way out of the core, keeping its errno:
/// `self.upper.open_data(ino).context(|| format!("data file {path:?}"))?`.
pub trait Context<T> {
    fn context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> FsResult<T>;
}

impl<T, E: Into<FsError>> Context<T> for Result<T, E> {
    fn context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> FsResult<T> {
        self.map_err(|e| e.into().context(what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_keep_their_errno_and_others_are_eio_with_their_message() {
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(FsError::from(full), Errno::ENOSPC);
        let odd = std::io::Error::other("short blob");
        let e = FsError::from(odd);
        assert_eq!(e.errno, Errno::EIO);
        assert_eq!(e.context.as_deref(), Some("short blob"));
    }

    #[test]
    fn context_nests_outermost_first_and_shows_after_the_errno() {
        let r: Result<(), std::io::Error> = Err(std::io::Error::other("object not found"));
        let e = r
            .context(|| "blob 3b18")
            .context(|| "open of inode 0x2a")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "EIO (Input/output error): open of inode 0x2a: blob 3b18: object not found"
        );
        assert_eq!(
            FsError::from(Errno::ENOENT).to_string(),
            "ENOENT (No such file or directory)"
        );
    }
}
