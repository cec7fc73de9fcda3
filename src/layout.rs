//! Where octofs keeps things: the state directory and the mount root (docs/usage.md "State layout").
//!
//! Tools and tests rely on these paths; nothing else in the code builds a state path by hand.
//!
//! Everything under `<state>` is private to the daemon's user: directories 0700, files 0600 (blob
//! cache files 0400), whatever the umask. Two deliberate exceptions: `<state>` itself is 0711, so
//! that any local user can reach the control socket in it (which authenticates its callers), and the
//! sockets keep the mode their owner gives them. Mount points live under the root, not here. The
//! fsmonitor links `<state>/fsmonitor-<thread>` are symlinks to the installed hook program, which
//! every workspace owner runs through them: a symlink has no mode of its own, and it leads to
//! nothing of the state.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode of `<state>` itself: searchable by all (to reach the socket), listable by none.
pub const STATE_DIR_MODE: u32 = 0o711;
/// The mode of every directory under `<state>`.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The mode of every file under `<state>` (blob cache files: 0400).
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// The resolved state directory and mount root of one octofs installation.
#[derive(Debug, Clone)]
pub struct Layout {
    pub state: PathBuf,
    pub root: PathBuf,
}

/// The mount root when none is given: `/workspaces` for root; else `$XDG_RUNTIME_DIR/octofs`, or —
/// without a runtime directory (runuser, su, cron) — `<tmp>/octofs-<uid>`, the user's own: a shared
/// `/tmp/octofs` would belong to whichever user came first, and the second could not mount.
fn default_root(euid: u32, runtime_dir: Option<std::ffi::OsString>, tmp: &Path) -> PathBuf {
    if euid == 0 {
        return PathBuf::from("/workspaces");
    }
    match runtime_dir.filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("octofs"),
        None => tmp.join(format!("octofs-{euid}")),
    }
}

impl Layout {
    /// The defaults (docs/usage.md "State layout"): `/var/lib/octofs` and `/workspaces` as root, else XDG locations.
    pub fn resolve(state: Option<PathBuf>, root: Option<PathBuf>) -> Layout {
        let is_root = crate::sys::euid() == 0;
        let state = state.unwrap_or_else(|| {
            if is_root {
                PathBuf::from("/var/lib/octofs")
            } else {
                xdg("XDG_DATA_HOME", ".local/share").join("octofs")
            }
        });
        let root = root.unwrap_or_else(|| {
            default_root(
                crate::sys::euid(),
                std::env::var_os("XDG_RUNTIME_DIR"),
                &std::env::temp_dir(),
            )
        });
        Layout {
            state: absolute(&state),
            root: absolute(&root),
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.state.join("octofs.sock")
    }
    pub fn daemon_lock(&self) -> PathBuf {
        self.state.join("daemon.lock")
    }
    pub fn log_file(&self) -> PathBuf {
        self.state.join("octofs.log")
    }
    pub fn mirrors(&self) -> PathBuf {
        self.state.join("mirrors")
    }
    pub fn mirror(&self, project: &str) -> PathBuf {
        self.mirrors().join(project)
    }
    /// Per-project metadata (upstream, kind, last sync) and the per-mirror lock live beside the mirrors,
    /// never inside a mirror's working tree.
    pub fn projects(&self) -> PathBuf {
        self.state.join("projects")
    }
    pub fn workspaces(&self) -> PathBuf {
        self.state.join("workspaces")
    }
    pub fn workspace(&self, thread: &str) -> PathBuf {
        self.workspaces().join(thread)
    }
    pub fn blobs(&self) -> PathBuf {
        self.state.join("blobs")
    }
    /// `<state>/credentials/<project>`: the upstream credentials of a project (`user:password`),
    /// readable by the daemon only, never copied into a record, a mirror or a workspace.
    pub fn credentials(&self) -> PathBuf {
        self.state.join("credentials")
    }
    pub fn credential(&self, project: &str) -> PathBuf {
        self.credentials().join(project)
    }
    /// `<state>/deps`: the host's dependency layers (see [`crate::deps`]): `store.git` (the sealed
    /// layers' objects), `layers/<key>.json` (one record a layer), `logs/<key>.log` (the package
    /// manager's output of its build) and `staging/<key>` (a build in progress).
    pub fn deps(&self) -> PathBuf {
        self.state.join("deps")
    }
    /// `<state>/own-snapshots/<thread>`: the thread's last snapshot that is its owner's own, made
    /// on this host (its `.git/config` comes back byte for byte; `daemon::repo_config`).
    pub fn own_snapshot(&self, thread: &str) -> PathBuf {
        self.state.join("own-snapshots").join(thread)
    }
    pub fn mountpoint(&self, thread: &str) -> PathBuf {
        self.root.join(thread)
    }
    /// `<state>/fsmonitor-<thread>`: the link to the fsmonitor hook program that a workspace's
    /// `core.fsmonitor` names; the hook reads the state directory and the thread from it.
    pub fn fsmonitor_link(&self, thread: &str) -> PathBuf {
        self.state.join(format!("fsmonitor-{thread}"))
    }
}

/// Creates `dir` and its missing parents with mode 0700 (whatever the umask); an existing `dir` is
/// left as it is (see `crate::private_state::make_private` for the state directory's own repair
/// at start).
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR_MODE)
        .create(dir)
}

/// Creates `dir` and its missing parents with mode 0755 whatever the umask (the daemon's is 077),
/// for directories that are not state: the mount root. Existing directories are left as they are.
pub fn create_public_dir(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut p = dir;
    while std::fs::symlink_metadata(p).is_err() {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(parent) => p = parent,
            None => break,
        }
    }
    for d in missing.iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    // A path that exists but is no directory is reported as such.
    if !std::fs::metadata(dir)?.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "exists and is not a directory",
        ));
    }
    Ok(())
}

fn xdg(var: &str, fallback: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join(fallback)
    })
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_user_without_a_runtime_directory_gets_a_mount_root_of_their_own() {
        let tmp = Path::new("/tmp");
        assert_eq!(default_root(0, None, tmp), Path::new("/workspaces"));
        assert_eq!(
            default_root(1000, Some("/run/user/1000".into()), tmp),
            Path::new("/run/user/1000/octofs")
        );
        assert_eq!(default_root(1000, None, tmp), Path::new("/tmp/octofs-1000"));
        assert_eq!(
            default_root(1001, Some("".into()), tmp),
            Path::new("/tmp/octofs-1001")
        );
    }
}
