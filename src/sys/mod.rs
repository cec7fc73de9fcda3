//! The only module with `unsafe`: thin, safe wrappers around the few syscalls std does not expose, one
//! file per concept, every name re-exported here: `process`, `mounts`, `files`, `users`,
//! `sockets`, `fuse_dev`; and `uring`, io_uring for the FUSE ring transport.
//!
//! Each function checks its arguments, calls exactly one syscall, and turns a failure into an
//! `io::Error` carrying errno. Nothing here holds state.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

mod files;
mod fuse_dev;
mod mounts;
mod process;
mod sockets;
pub mod uring;
mod users;

pub use files::*;
pub use fuse_dev::*;
pub use mounts::*;
pub use process::*;
pub use sockets::*;
pub use users::*;

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
