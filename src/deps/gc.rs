//! The host's layers as `octofs deps list` shows them (with the threads that use each one), and
//! their collection (`octofs deps gc`): a layer no workspace record uses and no mirror's
//! default-branch tip needs loses its record, log and ref, and `store.git` is pruned.
//!
//! Which layers workspaces use comes from the caller ([`LayerUse`], read from the workspace
//! records by [`crate::workspace::WorkspaceRecord::layer_uses`]): this module knows nothing of
//! those records, never writes one, never touches a mirror or a mount.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{Error, FsOp, fs};
use super::{DepStore, LayerRecord, LayerState, Manager, build, seal};
use crate::git::Git;
use crate::layout::Layout;

/// One layer as `deps list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub key: String,
    pub manager: Manager,
    pub manager_version: String,
    /// Where it is presented in a workspace.
    pub path: String,
    /// `built` or `failed`.
    pub state: String,
    /// The sealed tree (built layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// Content bytes and file count (built layers).
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub files: u64,
    pub built_at: u64,
    /// Why it failed (failed layers), and the manager's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// The threads whose workspace records hold this layer.
    pub users: Vec<String>,
    /// Those threads' owners (user names, or uids without a name).
    #[serde(default)]
    pub owners: Vec<String>,
}

/// A layer `deps gc` removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    pub key: String,
    pub manager: Manager,
    pub state: String,
    /// The layer's content bytes (0 for a failed one).
    pub bytes: u64,
}

/// The answer to `deps gc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcAnswer {
    pub removed: Vec<Removed>,
    /// Layers kept (used by a workspace, needed by a mirror's tip, or being built).
    pub kept: u64,
    /// Disk bytes freed: records, logs, staging leftovers and the store's pruned objects.
    pub freed_bytes: u64,
}

fn info(rec: LayerRecord, users: Vec<String>) -> LayerInfo {
    let (state, path, tree, bytes, files, message, log) = match rec.state {
        LayerState::Built {
            layer,
            bytes,
            files,
        } => (
            "built",
            layer.path,
            Some(layer.tree.to_string()),
            bytes,
            files,
            None,
            None,
        ),
        LayerState::Failed { message, log } => (
            "failed",
            build::install_path(rec.manager).to_string(),
            None,
            0,
            0,
            Some(message),
            Some(log),
        ),
    };
    LayerInfo {
        key: rec.key,
        manager: rec.manager,
        manager_version: rec.manager_version,
        path,
        state: state.into(),
        tree,
        bytes,
        files,
        built_at: rec.built_at,
        message,
        log,
        users,
        owners: Vec::new(),
    }
}

/// One layer a workspace record holds: `(key, thread, owner's uid)`.
pub type LayerUse = (String, String, u32);

/// Every layer on the host, newest first, with its users (`uses`: what the workspace records
/// hold).
pub fn list(
    layout: &Layout,
    uses: impl FnOnce() -> std::io::Result<Vec<LayerUse>>,
) -> std::io::Result<Vec<LayerInfo>> {
    let deps = DepStore::new(layout);
    let uses = uses()?;
    let mut out: Vec<LayerInfo> = deps
        .list()?
        .into_iter()
        .map(|rec| {
            let mine = uses.iter().filter(|(k, _, _)| *k == rec.key);
            let mut users: Vec<String> = mine.clone().map(|(_, t, _)| t.clone()).collect();
            users.sort();
            users.dedup();
            let mut owners: Vec<String> = mine
                .map(|(_, _, u)| crate::access::user_label(*u))
                .collect();
            owners.sort();
            owners.dedup();
            let mut i = info(rec, users);
            i.owners = owners;
            i
        })
        .collect();
    out.sort_by(|a, b| b.built_at.cmp(&a.built_at).then(a.key.cmp(&b.key)));
    Ok(out)
}

/// What a mirror's default-branch tip needs: the keys of its layers on this host, and the
/// (manager, lockfile hash) of each (a built layer of an older manager still serves it).
#[derive(Debug, Default)]
pub struct Needed {
    pub keys: HashSet<String>,
    pub locks: HashSet<(Manager, String)>,
}

/// Bytes under `path` (files and symlinks, not followed); 0 when it is missing.
fn disk_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        use std::os::unix::fs::MetadataExt;
        return meta.blocks() * 512;
    }
    std::fs::read_dir(path)
        .map(|rd| rd.flatten().map(|e| disk_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// Removes every layer that no workspace record holds and `needed` does not name, and prunes the
/// store. A layer whose build is under way is kept; so is every layer while a build seals (gc
/// waits for the store's lock). `uses` reads what the workspace records hold; it is called once
/// the store is locked, so that a layer a new workspace took before then is seen.
pub fn gc(
    layout: &Layout,
    needed: &Needed,
    uses: impl FnOnce() -> std::io::Result<Vec<LayerUse>>,
) -> Result<GcAnswer, Error> {
    let deps = DepStore::new(layout);
    let _store = seal::store_lock(&deps, true).map_err(Error::StoreLock)?;
    let used: HashSet<String> = uses()
        .map_err(Error::Records)?
        .into_iter()
        .map(|(k, _, _)| k)
        .collect();
    let records = deps.list().map_err(Error::List)?;
    let before = disk_bytes(deps.dir());
    let mut answer = GcAnswer::default();
    let mut refs_removed = false;
    for rec in records {
        let at_tip = needed.keys.contains(&rec.key)
            || match &rec.state {
                LayerState::Built { layer, .. } => needed
                    .locks
                    .contains(&(layer.manager, layer.lockfile_hash.clone())),
                LayerState::Failed { .. } => false,
            };
        if used.contains(&rec.key) || at_tip {
            answer.kept += 1;
            continue;
        }
        let Some(_building) = try_key_lock(&deps, &rec.key) else {
            answer.kept += 1;
            continue;
        };
        if matches!(rec.state, LayerState::Built { .. }) {
            Git::new(None)
                .env("GIT_DIR", deps.objects())
                .args(["update-ref", "-d", &format!("refs/layers/{}", rec.key)])
                .output()
                .map_err(|source| Error::RemoveRef {
                    key: rec.key.clone(),
                    source,
                })?;
            refs_removed = true;
        }
        for f in [deps.record(&rec.key), deps.log(&rec.key)] {
            match std::fs::remove_file(&f) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(fs(FsOp::Remove, &f)(e)),
            }
        }
        let (state, bytes) = match rec.state {
            LayerState::Built { bytes, .. } => ("built", bytes),
            LayerState::Failed { .. } => ("failed", 0),
        };
        answer.removed.push(Removed {
            key: rec.key,
            manager: rec.manager,
            state: state.into(),
            bytes,
        });
    }
    // Staging leftovers of builds that did not finish (a daemon killed mid-build).
    if let Ok(rd) = std::fs::read_dir(deps.dir().join("staging")) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let key = name.trim_end_matches(".index");
            if let Some(_l) = try_key_lock(&deps, key) {
                let p = e.path();
                let _ = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }
    if refs_removed && deps.objects().join("HEAD").exists() {
        Git::new(None)
            .env("GIT_DIR", deps.objects())
            .args(["gc", "--prune=now", "--quiet"])
            .output()
            .map_err(Error::Prune)?;
    }
    answer.freed_bytes = before.saturating_sub(disk_bytes(deps.dir()));
    Ok(answer)
}

/// The key's build lock when no build holds it.
fn try_key_lock(deps: &DepStore, key: &str) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = deps.dir().join("locks");
    crate::layout::create_private_dir(&dir).ok()?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(dir.join(format!("{key}.lock")))
        .ok()?;
    f.try_lock().ok()?;
    Some(f)
}
