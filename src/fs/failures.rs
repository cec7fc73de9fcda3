//! The one log line of a failed request: what it was (operation, inode, name) and its errno by name,
//! at debug for the errors programs probe for all day, at warn for those an operator should see.
//! Used by the fuser adapter; touches nothing but the log.

use std::ffi::OsStr;

use fuser::Errno;

use super::stats::Op;

/// What a request was about, for the one log line of its failure.
pub struct Cx<'a> {
    op: Op,
    ino: u64,
    name: Option<&'a OsStr>,
}

impl<'a> Cx<'a> {
    pub fn new(op: Op, ino: u64, name: Option<&'a OsStr>) -> Self {
        Cx { op, ino, name }
    }
}

impl std::fmt::Display for Cx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of inode {:#x}", self.op.name(), self.ino)?;
        if let Some(n) = self.name {
            write!(f, " name {n:?}")?;
        }
        Ok(())
    }
}

/// Logs a failed request once, with what it was about and its errno by name, and returns the errno
/// for the reply. Failures an operator should see (disk full, I/O error, busy, quota) are warnings;
/// the rest (no such file, exists, not empty, ...) are what programs probe for all day: debug.
pub fn failed(cx: &Cx, e: Errno) -> Errno {
    let name = errno_name(e);
    if [Errno::ENOSPC, Errno::EIO, Errno::EBUSY, Errno::EDQUOT].contains(&e) {
        tracing::warn!("{cx}: {name}");
    } else {
        tracing::debug!("{cx}: {name}");
    }
    e
}

/// The symbolic name of an errno (`ENOENT`), or its number for one without a name
/// ([`crate::errno::name`]).
pub fn errno_name(e: Errno) -> std::borrow::Cow<'static, str> {
    match crate::errno::name(e.code()) {
        Some(name) => name.into(),
        None => format!("errno {}", e.code()).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_are_logged_by_name() {
        assert_eq!(errno_name(Errno::ENOENT), "ENOENT");
        assert_eq!(errno_name(Errno::ENOSPC), "ENOSPC");
        assert_eq!(errno_name(Errno::ESTALE), "ESTALE");
        assert_eq!(errno_name(Errno::NO_XATTR), "ENODATA");
        assert_eq!(errno_name(Errno::from_i32(4000)), "errno 4000");
    }

    #[test]
    fn a_failure_says_which_request_on_what() {
        let cx = Cx::new(Op::Lookup, 0x2a, Some(OsStr::new("a b")));
        assert_eq!(
            cx.to_string(),
            format!("{} of inode 0x2a name \"a b\"", Op::Lookup.name())
        );
    }
}
