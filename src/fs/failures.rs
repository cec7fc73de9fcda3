//! The one log line of a failed request: what it was (operation, inode, name), its errno by name and
//! what the core knew of the failure ([`FsError::context`]: which data file, catalog append, blob or
//! object), at debug for the errors programs probe for all day, at warn for those an operator should
//! see; and its count by opcode and errno, process-wide, for the daemon's metrics ([`error_counts`]).
//! Used by the fuser adapter ([`answer`]); touches nothing but the log and those counters.

use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};

use fuser::Errno;

use super::FsError;
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

/// Logs a failed request once, with what it was about, its errno by name and its context, and
/// returns the errno for the reply. Failures an operator should see (disk full, I/O error, busy,
/// quota) are warnings; the rest (no such file, exists, not empty, ...) are what programs probe for
/// all day: debug.
pub fn failed(cx: &Cx, e: FsError) -> Errno {
    count(cx.op, e.errno);
    let line = failure_line(cx, &e);
    if [Errno::ENOSPC, Errno::EIO, Errno::EBUSY, Errno::EDQUOT].contains(&e.errno) {
        tracing::warn!("{line}");
    } else {
        tracing::debug!("{line}");
    }
    e.errno
}

/// The errno to answer `e` with: [`failed`]'s, except for the answers that are no failure, neither
/// logged nor counted: `ENOSYS` where it tells the kernel to do something itself from now on (open
/// files and directories, flush), and `ENOENT` to a lookup that must not be cached as a negative
/// entry (the virtual objects tree).
pub fn answer(cx: &Cx, e: FsError) -> Errno {
    if e.errno == Errno::ENOSYS || (cx.op == Op::Lookup && e.errno == Errno::ENOENT) {
        return e.errno;
    }
    failed(cx, e)
}

/// Errnos counted one by one; a larger one is counted in the last slot ("other").
const ERRNOS: usize = 134;

/// Failed requests by opcode and errno, over every mount of the process: one relaxed add per
/// failure, never on a request that succeeds.
static ERRORS: [[AtomicU64; ERRNOS + 1]; Op::ALL.len()] =
    [const { [const { AtomicU64::new(0) }; ERRNOS + 1] }; Op::ALL.len()];

fn count(op: Op, errno: Errno) {
    let slot = usize::try_from(errno.code()).map_or(ERRNOS, |e| e.min(ERRNOS));
    ERRORS[op as usize][slot].fetch_add(1, Ordering::Relaxed);
}

/// Every (opcode, errno name, count) with a count, in opcode then errno order.
pub fn error_counts() -> Vec<(Op, String, u64)> {
    let mut out = Vec::new();
    for op in Op::ALL {
        for (code, n) in ERRORS[*op as usize].iter().enumerate() {
            let n = n.load(Ordering::Relaxed);
            if n == 0 {
                continue;
            }
            let name = if code == ERRNOS {
                "other".to_string()
            } else {
                errno_name(Errno::from_i32(code as i32)).into_owned()
            };
            out.push((*op, name, n));
        }
    }
    out
}

/// "lookup of inode 0x2a name \"a\": EIO: blob 3b18… into the blob cache: …"
pub fn failure_line(cx: &Cx, e: &FsError) -> String {
    let name = errno_name(e.errno);
    match &e.context {
        Some(c) => format!("{cx}: {name}: {c}"),
        None => format!("{cx}: {name}"),
    }
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

    #[test]
    fn a_failure_line_carries_the_core_context() {
        let cx = Cx::new(Op::Open, 0x2a, None);
        let bare = FsError::from(Errno::ENOENT);
        assert_eq!(
            failure_line(&cx, &bare),
            format!("{} of inode 0x2a: ENOENT", Op::Open.name())
        );
        let e = FsError::eio("blob 3b18 into the blob cache");
        assert_eq!(
            failure_line(&cx, &e),
            format!(
                "{} of inode 0x2a: EIO: blob 3b18 into the blob cache",
                Op::Open.name()
            )
        );
    }
}
