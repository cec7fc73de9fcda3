//! Where octofs keeps things: the state directory and the mount root (DESIGN.md "State layout").
//!
//! Tools and tests rely on these paths; nothing else in the code builds a state path by hand.

use std::path::{Path, PathBuf};

/// The resolved state directory and mount root of one octofs installation.
#[derive(Debug, Clone)]
pub struct Layout {
    pub state: PathBuf,
    pub root: PathBuf,
}

impl Layout {
    /// The defaults of DESIGN.md: `/var/lib/octofs` and `/workspaces` as root, else XDG locations.
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
            if is_root {
                PathBuf::from("/workspaces")
            } else {
                std::env::var_os("XDG_RUNTIME_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(std::env::temp_dir)
                    .join("octofs")
            }
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
    pub fn mountpoint(&self, thread: &str) -> PathBuf {
        self.root.join(thread)
    }
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
