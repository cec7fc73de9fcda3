//! Files found in a thread's mount point when it is about to be mounted: something wrote into the
//! bare directory while the mount was gone (taken away behind the daemon, or a daemon that died).
//! They are the thread's, so they are moved into its workspace, under
//! `.octofs-stray/<UTC time>/`, through its core (before the mount: the kernel caches nothing yet),
//! as the workspace's owner, then removed from the bare directory; never lost (docs/restart.md).
//!
//! Owns only that move. The directory is the agents' to write: nothing in it is followed (every
//! directory is opened `O_NOFOLLOW` and read through its descriptor, every file opened
//! `O_NOFOLLOW`), so a symlink swapped in cannot make the daemon copy a file from elsewhere.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::fs::{Caller, FsError, ROOT_INO, WorkspaceFs};
use crate::workspace::Owner;

/// The directory of the workspace the strays go to.
pub const STRAY_DIR: &str = ".octofs-stray";
/// Deeper trees are not followed further (their rest stays in the bare directory, reported).
const MAX_DEPTH: usize = 128;

/// What was moved.
#[derive(Default)]
pub(super) struct Moved {
    pub entries: usize,
    /// Files that hold nothing to keep (fifos, sockets, devices): removed, not copied.
    pub skipped: usize,
    /// Entries that could not be copied (left in the bare directory, hidden under the mount).
    pub left: usize,
}

impl Moved {
    /// The one line that tells the caller (`open`'s stderr, `doctor --fix`).
    pub(super) fn describe(&self, mountpoint: &Path, into: &str) -> String {
        let mut n = format!(
            "{} entries found in the unmounted {} were moved into the workspace, to {}/{into}",
            self.entries,
            mountpoint.display(),
            mountpoint.display()
        );
        if self.skipped > 0 {
            n.push_str(&format!(
                " ({} fifos/sockets/devices dropped)",
                self.skipped
            ));
        }
        if self.left > 0 {
            n.push_str(&format!(
                "; {} could not be moved and stay under the mount (see the daemon log)",
                self.left
            ));
        }
        n
    }
}

/// Moves what is in `dir` (the mount point, not mounted) into `core` under
/// `.octofs-stray/<stamp>/`. `Ok(None)` when `dir` is empty; else where they went, workspace-relative.
pub(super) fn move_into(
    core: &WorkspaceFs,
    dir: &Path,
    owner: Owner,
) -> Result<Option<(String, Moved)>, String> {
    let top = open_dir(dir).map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    let names = names_in(&top).map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    if names.is_empty() {
        return Ok(None);
    }
    let caller = Caller {
        uid: owner.uid,
        gid: owner.gid,
    };
    let fs_err = |what: &str, e: FsError| format!("cannot make {what} in the workspace: {e}");
    let stray = match core.lookup(ROOT_INO, OsStr::new(STRAY_DIR)) {
        Ok(a) => a.ino.0,
        Err(_) => {
            core.mkdir(ROOT_INO, OsStr::new(STRAY_DIR), 0o755, caller)
                .map_err(|e| fs_err(STRAY_DIR, e))?
                .ino
                .0
        }
    };
    let base = stamp();
    let mut name = base.clone();
    let mut n = 1;
    let into = loop {
        match core.mkdir(stray, OsStr::new(&name), 0o755, caller) {
            Ok(a) => break a.ino.0,
            Err(e) if e == fuser::Errno::EEXIST => {
                n += 1;
                name = format!("{base}-{n}");
            }
            Err(e) => {
                core.forget(stray, 1);
                return Err(fs_err(&name, e));
            }
        }
    };
    let mut moved = Moved::default();
    copy_dir(core, &top, &names, into, caller, 0, &mut moved);
    core.forget(into, 1);
    core.forget(stray, 1);
    Ok(Some((format!("{STRAY_DIR}/{name}"), moved)))
}

/// A UTC time stamp that sorts (`20261203T174001Z`).
fn stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// `dir` opened as a directory, never through a symlink.
fn open_dir(dir: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
}

/// The path of `name` inside the directory open as `dir` (resolved through the descriptor).
fn at(dir: &File, name: &OsStr) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

fn names_in(dir: &File) -> std::io::Result<Vec<std::ffi::OsString>> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        names.push(e?.file_name());
    }
    names.sort();
    Ok(names)
}

/// Copies the entries `names` of `src` into directory `into` of the core, removing each source
/// entry once copied.
fn copy_dir(
    core: &WorkspaceFs,
    src: &File,
    names: &[std::ffi::OsString],
    into: u64,
    caller: Caller,
    depth: usize,
    moved: &mut Moved,
) {
    for name in names {
        let path = at(src, name);
        let copied = copy_one(core, name, &path, into, caller, depth, moved);
        match copied {
            Ok(()) => {
                moved.entries += 1;
                let gone = match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => std::fs::remove_dir(&path),
                    Ok(_) => std::fs::remove_file(&path),
                    Err(e) => Err(e),
                };
                if let Err(e) = gone {
                    tracing::warn!(path = %name.to_string_lossy(), "stray entry copied, not removed: {e}");
                }
            }
            Err(e) => {
                moved.left += 1;
                tracing::warn!(path = %name.to_string_lossy(), "stray entry not moved: {e}");
            }
        }
    }
}

fn copy_one(
    core: &WorkspaceFs,
    name: &OsStr,
    path: &Path,
    into: u64,
    caller: Caller,
    depth: usize,
    moved: &mut Moved,
) -> Result<(), String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    let mode = meta.mode() & 0o777;
    let ft = meta.file_type();
    if ft.is_dir() {
        if depth >= MAX_DEPTH {
            return Err(format!("deeper than {MAX_DEPTH} directories"));
        }
        let d = open_dir(path).map_err(|e| e.to_string())?;
        let names = names_in(&d).map_err(|e| e.to_string())?;
        let ino = core
            .mkdir(into, name, mode | 0o700, caller)
            .map_err(|e| e.to_string())?
            .ino
            .0;
        let left = moved.left;
        copy_dir(core, &d, &names, ino, caller, depth + 1, moved);
        core.forget(ino, 1);
        if moved.left > left {
            return Err("not every entry in it was moved".into());
        }
        Ok(())
    } else if ft.is_symlink() {
        let target = std::fs::read_link(path).map_err(|e| e.to_string())?;
        let a = core
            .symlink(into, name, target.as_os_str().as_bytes(), caller)
            .map_err(|e| e.to_string())?;
        core.forget(a.ino.0, 1);
        Ok(())
    } else if ft.is_file() {
        let mut from = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| e.to_string())?;
        // What was opened, not what was looked at: a device node swapped in after the lstat must
        // not be read into the workspace.
        if !from.metadata().is_ok_and(|m| m.is_file()) {
            return Err("changed while being moved".into());
        }
        let (attr, mut opened) = core
            .create(into, name, mode, libc::O_WRONLY, caller)
            .map_err(|e| e.to_string())?;
        let ino = attr.ino.0;
        let r = std::io::copy(&mut from, &mut opened.file);
        drop(opened);
        core.release(ino, true);
        core.forget(ino, 1);
        r.map(|_| ()).map_err(|e| e.to_string())
    } else {
        // A fifo, socket or device node holds no data: nothing to keep.
        moved.skipped += 1;
        Ok(())
    }
}
