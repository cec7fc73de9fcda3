//! Conversions the core needs everywhere: Unix times to and from [`Ts`], I/O errors to errnos, path
//! joining, object ids and the validity of a name. Pure functions; touch no state.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use fuser::Errno;

use crate::fs::FsError;
use gix::ObjectId;

use crate::cow::catalog::Ts;

use std::time::{Duration, UNIX_EPOCH};

use super::NAME_MAX;

/// `SystemTime` for Unix seconds (negative times clamp to the epoch).
pub fn unix_time(secs: i64) -> SystemTime {
    if secs <= 0 {
        UNIX_EPOCH
    } else {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    }
}

pub(super) fn ts(t: SystemTime) -> Ts {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Ts(d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            if d.subsec_nanos() == 0 {
                Ts(-(d.as_secs() as i64), 0)
            } else {
                Ts(-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
            }
        }
    }
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `EIO` because of `e` (the context says what; logged once with the failed request).
pub(super) fn eio(e: impl std::fmt::Display) -> FsError {
    FsError::eio(e)
}

/// An I/O error's errno (its own, else `EIO` with its message).
pub(super) fn io_errno(e: std::io::Error) -> FsError {
    FsError::from(e)
}

/// A workspace path as the context of an error shows it: `"src/a b.rs"` (the root is `"/"`).
pub(super) fn shown(path: &[u8]) -> String {
    if path.is_empty() {
        "\"/\"".to_string()
    } else {
        format!("{:?}", String::from_utf8_lossy(path))
    }
}

pub(super) fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        p.extend_from_slice(parent);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

pub(super) fn oid(hex: &str) -> Result<ObjectId, FsError> {
    ObjectId::from_hex(hex.as_bytes())
        .map_err(|e| eio(format!("object id {hex:?} in a record: {e}")))
}
pub(super) fn check_name(name: &OsStr) -> Result<&[u8], FsError> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG.into());
    }
    if b.is_empty() || b.contains(&b'/') {
        return Err(Errno::EINVAL.into());
    }
    Ok(b)
}
