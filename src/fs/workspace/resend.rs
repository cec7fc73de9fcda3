//! Namespace requests the kernel sends again after a daemon died (`FUSE_NOTIFY_RESEND`,
//! docs/restart.md "A crash"): the dead daemon may have applied one (it is in the catalog) and
//! died before answering. Carried out again, a `mkdir` would answer `EEXIST`, an `unlink` `ENOENT`,
//! and the process would see its own change fail (`git` leaving a stale `index.lock`). For a
//! request marked as resent only, an `EEXIST`/`ENOENT` whose effect is the request's own (same
//! kind, same owner, same target, an empty file made moments ago) is answered as if it had just
//! been done; anything else keeps its errno. Also the test hook that makes such a window
//! ([`crash_point`], `OCTOFS_TEST_CRASH_AFTER`).
//!
//! Owns only these decisions: it reads names and records, counts the kernel reference a
//! successful answer hands out (as the request would have), and changes nothing else.

use std::ffi::OsStr;
use std::sync::OnceLock;

use fuser::{Errno, FileAttr};

use crate::cow::catalog::{InodeRecord, Kind, Ts};
use crate::fs::FsError;

use super::{WorkspaceFs, convert::check_name, types::Caller};

/// How long ago the dead daemon may have made what a resent request finds: the keeper holds a
/// connection for 120 s with no daemon (`daemon::keeper::GRACE`), then the requests end anyway.
const RESEND_WINDOW_SECS: i64 = 600;

/// Test hook, read once: `OCTOFS_TEST_CRASH_AFTER=<op>:<name>` (op `mkdir`, `create`, `unlink`,
/// `rmdir`, `rename`, `symlink`, `mknod`, `link`; name the request's (new) file name) kills the
/// daemon with `SIGKILL` right after such a request's change is in the catalog and before it is
/// answered. Unset in production: inert.
pub const CRASH_ENV: &str = "OCTOFS_TEST_CRASH_AFTER";

/// What a resent request that made a name meant to make.
pub enum Made<'a> {
    Dir,
    /// `mknod` of this file type (`S_IFMT` bits; 0 is a regular file).
    Node(u32),
    Symlink(&'a [u8]),
    /// `link` of this inode.
    Link(u64),
}

/// The hook: if `OCTOFS_TEST_CRASH_AFTER` names `op` on `name`, the process dies here.
pub(super) fn crash_point(op: &str, name: &[u8]) {
    static WANT: OnceLock<Option<(String, Vec<u8>)>> = OnceLock::new();
    let want = WANT.get_or_init(|| {
        let v = std::env::var(CRASH_ENV).ok()?;
        let (o, n) = v.split_once(':')?;
        Some((o.to_string(), n.as_bytes().to_vec()))
    });
    if let Some((o, n)) = want
        && o == op
        && n == name
    {
        tracing::warn!(
            "{CRASH_ENV}: dying after {op} {} (a test)",
            n.escape_ascii()
        );
        crate::sys::kill_self();
    }
}

fn recent(ts: Ts) -> bool {
    let now = Ts::now();
    ts.0 >= now.0 - RESEND_WINDOW_SECS && ts.0 <= now.0 + 5
}

fn matches(rec: &InodeRecord, made: &Made<'_>, caller: Caller) -> bool {
    let kind_ok = match made {
        Made::Dir => rec.kind == Kind::Dir,
        Made::Node(fmt) => {
            rec.kind
                == match *fmt {
                    libc::S_IFREG | 0 => Kind::File,
                    libc::S_IFIFO => Kind::Fifo,
                    libc::S_IFSOCK => Kind::Socket,
                    libc::S_IFCHR => Kind::Char,
                    libc::S_IFBLK => Kind::Block,
                    _ => return false,
                }
        }
        Made::Symlink(t) => rec.kind == Kind::Symlink && rec.target.as_deref() == Some(*t),
        Made::Link(_) => true,
    };
    match made {
        // The same inode under the new name: the link is there.
        Made::Link(ino) => rec.ino == *ino,
        _ => kind_ok && rec.uid == caller.uid && recent(rec.ctime),
    }
}

impl WorkspaceFs {
    /// The record `name` in `parent` names now, without counting a kernel reference.
    fn peek(&self, parent: u64, name: &[u8]) -> Result<Option<InodeRecord>, FsError> {
        let mut st = self.lock();
        let Some(ino) = self.resolve(&mut st, parent, name)? else {
            return Ok(None);
        };
        Ok(Some(st.node(ino)?.rec.clone()))
    }

    /// A resent `mkdir`/`mknod`/`symlink`/`link` answered `r`: an `EEXIST` whose entry is what the
    /// request made (see [`Made`]) is the dead daemon's work, answered with its attributes (one
    /// kernel reference counted, as the request would have).
    pub fn made_again(
        &self,
        r: Result<FileAttr, FsError>,
        parent: u64,
        name: &OsStr,
        made: Made<'_>,
        caller: Caller,
    ) -> Result<FileAttr, FsError> {
        match r {
            Err(e) if e == Errno::EEXIST => {
                let Ok(n) = check_name(name) else {
                    return Err(e);
                };
                match self.peek(parent, n) {
                    Ok(Some(rec)) if matches(&rec, &made, caller) => {
                        tracing::info!(
                            name = %n.escape_ascii(),
                            "a resent request found its change made by the daemon that died"
                        );
                        self.lookup(parent, name)
                    }
                    _ => Err(e),
                }
            }
            r => r,
        }
    }

    /// A resent `create` with `O_EXCL` answered `EEXIST`: if the file there is an empty regular
    /// file of the caller's made moments ago (the dead daemon's), its attributes with one kernel
    /// reference counted; the caller opens it. `None`: the error stands.
    pub fn created_again(&self, parent: u64, name: &OsStr, caller: Caller) -> Option<FileAttr> {
        let n = check_name(name).ok()?;
        let rec = self.peek(parent, n).ok()??;
        if !matches(&rec, &Made::Node(libc::S_IFREG), caller) {
            return None;
        }
        let attr = self.lookup(parent, name).ok()?;
        if attr.size != 0 {
            self.forget(attr.ino.0, 1);
            return None;
        }
        tracing::info!(
            name = %n.escape_ascii(),
            "a resent create found its file made by the daemon that died"
        );
        Some(attr)
    }

    /// A resent `unlink`/`rmdir` answered `r`: an `ENOENT` means the dead daemon removed it.
    pub fn removed_again(&self, r: Result<(), FsError>) -> Result<(), FsError> {
        match r {
            Err(e) if e == Errno::ENOENT => {
                tracing::info!("a resent removal found its name gone (the daemon that died)");
                Ok(())
            }
            r => r,
        }
    }

    /// A resent `rename` answered `r`: `ENOENT` (or `EEXIST` with `RENAME_NOREPLACE`) while the
    /// source name is gone and the new one is there means the dead daemon renamed it.
    pub fn renamed_again(
        &self,
        r: Result<(), FsError>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
    ) -> Result<(), FsError> {
        match r {
            Err(e) if e == Errno::ENOENT || e == Errno::EEXIST => {
                let (Ok(n), Ok(nn)) = (check_name(name), check_name(newname)) else {
                    return Err(e);
                };
                match (self.peek(parent, n), self.peek(newparent, nn)) {
                    (Ok(None), Ok(Some(_))) => {
                        tracing::info!(
                            name = %nn.escape_ascii(),
                            "a resent rename found its change made by the daemon that died"
                        );
                        Ok(())
                    }
                    _ => Err(e),
                }
            }
            r => r,
        }
    }
}
