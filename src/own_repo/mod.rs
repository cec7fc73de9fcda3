//! A workspace's own repository (its `.git`), read in process by the daemon (DESIGN.md "Trust
//! model").
//!
//! The daemon runs as root and the agent in a workspace is untrusted, so nothing here runs `git` in
//! a workspace or reads a workspace through its mount: every byte comes through the filesystem core
//! ([`WorkspaceFs::open_file`], [`WorkspaceFs::list_dir`]), symlinks are never followed, and nothing
//! the workspace's repository configures is consulted — not its `.git/config` (fsmonitor, hooks,
//! filters, helpers, `url.*.insteadOf`, includes), not its attributes, not its alternates. What git
//! would take from a host path (`core.excludesFile`, the global excludes) is not honoured either.
//!
//! - [`add_all`]: of the paths new to the base, which `git add -A` would add (the workspace's
//!   index, its `.gitignore` files and `.git/info/exclude`).
//! - [`carry`]: copies the agent's own commits into the mirror, each object verified against its id.
//!
//! Writes nothing in a workspace. Writes the mirror's object store and one ref (`carry` only), and
//! private copies under `<state>/tmp/` ([`Scratch`]), which go when the operation ends.

pub mod add_all;
pub mod carry;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fs::WorkspaceFs;

/// A private directory for copies of a workspace's files that a library must read from a path (an
/// index, packs). Copies, never the workspace's own files: an agent can rewrite or truncate those
/// at any time, and a file the daemon maps must not change under it. Removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new, empty directory under `<state>/tmp/`, readable by the daemon only.
    pub fn new(state: &Path, label: &str) -> Result<Scratch, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = state.join("tmp");
        let dir = base.join(format!(
            "{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let made = (|| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&base)?;
            static SWEPT: std::sync::Once = std::sync::Once::new();
            SWEPT.call_once(|| sweep_stale(&base));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::DirBuilder::new().mode(0o700).create(&dir)
        })();
        made.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Copies the workspace's regular file at `from` (components from the workspace's root) to
    /// `to` (relative to this directory, parents created). False when there is no such file.
    pub fn copy_in(&self, core: &WorkspaceFs, from: &[&[u8]], to: &Path) -> Result<bool, String> {
        let shown = || String::from_utf8_lossy(&from.join(&b'/')).into_owned();
        let Some(src) = core
            .open_file(from)
            .map_err(|e| format!("cannot read {}: {}", shown(), e))?
        else {
            return Ok(false);
        };
        let dest = self.0.join(to);
        let copied = (|| {
            use std::os::unix::fs::OpenOptionsExt;
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&dest)?;
            // Holes stay holes: a sparse file of terabytes costs the agent nothing, and must not
            // cost the daemon its disk either.
            crate::cow::upper::copy_sparse(&src, &mut out)
        })();
        copied.map_err(|e| format!("cannot copy {} out of the workspace: {e}", shown()))?;
        Ok(true)
    }
}

/// Removes what a daemon that died left in `<state>/tmp/` (only one daemon serves a state
/// directory: every entry not named with this process's id is stale).
fn sweep_stale(base: &Path) {
    let mine = format!("-{}-", std::process::id());
    for e in std::fs::read_dir(base).into_iter().flatten().flatten() {
        if !e.file_name().to_string_lossy().contains(&mine) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
