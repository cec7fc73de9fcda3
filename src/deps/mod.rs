//! Dependency layers: the ignored dependency trees of a project (`node_modules`, `.venv`), installed
//! once per host by the package manager itself and sealed as immutable git trees in a host-wide
//! object store (`<state>/deps/store.git`), keyed by a hash of the lockfile(s), the manager and its
//! major version. A workspace presents a layer read-through at its ignored path: the layer's tree is
//! grafted into the workspace's view (never into its base commit), so forking stays O(1) and every
//! workspace reads the same blob-cache files.
//!
//! This module owns the layer records and the store's paths. It never writes a mirror or a workspace
//! and never runs anything a workspace can configure: a layer is built from a mirror's commit.

pub mod build;
pub mod error;
pub mod gc;
pub mod sandbox;
pub mod seal;
pub mod vet;
pub mod workspace;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::layout::Layout;

/// The package managers whose lockfiles make a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Manager {
    /// `package-lock.json`, installed with `npm install` into `node_modules`.
    Npm,
    /// `pnpm-lock.yaml`, installed with `pnpm install --frozen-lockfile` into `node_modules`.
    Pnpm,
    /// `uv.lock`, installed with `uv sync --frozen` into a relocatable `.venv`.
    Uv,
}

impl Manager {
    pub fn name(self) -> &'static str {
        match self {
            Manager::Npm => "npm",
            Manager::Pnpm => "pnpm",
            Manager::Uv => "uv",
        }
    }
}

/// One sealed layer, as a workspace uses it: graft `tree` at `path` (relative to the workspace root,
/// `/`-separated, e.g. `node_modules` or `packages/app/node_modules`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepLayer {
    /// The layer's key: hex blake3 of the manager, its major version and the lockfile(s).
    pub key: String,
    pub manager: Manager,
    /// Where the tree is presented in a workspace.
    pub path: String,
    /// The sealed tree (in `<state>/deps/store.git`), stored as its hex id.
    #[serde(with = "crate::records::hex")]
    pub tree: gix::ObjectId,
    /// Hex blake3 of the lockfile(s) alone: what `.git/octomate-installed` records. In a project
    /// with workspace packages, blake3 of the lockfile and every workspace package's manifest
    /// (see [`Lockfile::key_input`]).
    pub lockfile_hash: String,
    /// The other `node_modules` the install made inside the project (workspace packages'), each a
    /// tree of its own, presented at its own path. Empty for a layer of one path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nested: Vec<NestedTree>,
}

/// One more install path of a layer (`packages/app/node_modules`) and its sealed tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NestedTree {
    pub path: String,
    #[serde(with = "crate::records::hex")]
    pub tree: gix::ObjectId,
}

impl DepLayer {
    /// Every path of the layer with its tree: the root install path's first.
    pub fn paths(&self) -> impl Iterator<Item = (&str, gix::ObjectId)> {
        std::iter::once((self.path.as_str(), self.tree))
            .chain(self.nested.iter().map(|n| (n.path.as_str(), n.tree)))
    }
}

/// Where a layer's build stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum LayerState {
    /// Sealed and usable.
    Built {
        layer: DepLayer,
        bytes: u64,
        files: u64,
    },
    /// The last build failed; `message` is one line, the manager's whole output is in `log`.
    Failed { message: String, log: PathBuf },
}

/// `<state>/deps/layers/<key>.json`: one layer's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub key: String,
    pub manager: Manager,
    /// The manager's version that built (or failed to build) it, as it printed it.
    pub manager_version: String,
    /// Unix seconds of the build.
    pub built_at: u64,
    #[serde(flatten)]
    pub state: LayerState,
}

/// The host's layer store: the paths under `<state>/deps`.
#[derive(Debug, Clone)]
pub struct DepStore {
    dir: PathBuf,
}

impl DepStore {
    pub fn new(layout: &Layout) -> DepStore {
        DepStore { dir: layout.deps() }
    }
    /// `<state>/deps` itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The bare repository holding every sealed layer's objects.
    pub fn objects(&self) -> PathBuf {
        self.dir.join("store.git")
    }
    pub fn records(&self) -> PathBuf {
        self.dir.join("layers")
    }
    pub fn record(&self, key: &str) -> PathBuf {
        self.records().join(format!("{key}.json"))
    }
    pub fn log(&self, key: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{key}.log"))
    }
    pub fn staging(&self, key: &str) -> PathBuf {
        self.dir.join("staging").join(key)
    }
}

/// A lockfile at the root of a tree that makes a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lockfile {
    pub manager: Manager,
    /// The lockfile's name at the root (`package-lock.json`, `pnpm-lock.yaml`, `uv.lock`).
    pub name: &'static str,
    /// Where the manager installs, relative to the root.
    pub install_path: &'static str,
    /// Hex blake3 of [`Self::key_input`].
    pub hash: String,
    /// What the layer's key covers besides the manager: the lockfile's bytes; in a project with
    /// workspace packages (`pnpm-workspace.yaml`, or `"workspaces"` in the root `package.json`),
    /// followed by each workspace package's `package.json` (by path, sorted) and the workspace
    /// file itself, since the install reads them.
    pub key_input: Vec<u8>,
}

/// The lockfiles at the root of `tree` that make layers: pnpm's (else npm's) for `node_modules`,
/// uv's for `.venv`. Reads the lockfiles and, in a project with workspace packages, their
/// manifests (following the workspace globs only); runs nothing.
pub fn detect(
    store: &crate::git::objects::ObjectStore,
    tree: gix::ObjectId,
) -> std::io::Result<Vec<Lockfile>> {
    use crate::git::objects::EntryKind;
    let entries = store.tree(tree)?;
    let blob = |name: &str| {
        entries
            .iter()
            .find(|e| &*e.name == name.as_bytes() && e.kind == EntryKind::Blob)
            .map(|e| e.id)
    };
    let mut found = Vec::new();
    let node = [
        (Manager::Pnpm, "pnpm-lock.yaml"),
        (Manager::Npm, "package-lock.json"),
    ]
    .into_iter()
    .find_map(|(m, name)| blob(name).map(|id| (m, name, "node_modules", id)));
    let uv = blob("uv.lock").map(|id| (Manager::Uv, "uv.lock", ".venv", id));
    for (manager, name, install_path, id) in node.into_iter().chain(uv) {
        let mut key_input = store.blob(id)?;
        if manager != Manager::Uv {
            for (path, bytes) in workspace::manifests(store, tree, manager)? {
                key_input.extend_from_slice(b"\0");
                key_input.extend_from_slice(path.as_bytes());
                key_input.extend_from_slice(b"\0");
                key_input.extend_from_slice(&bytes);
            }
        }
        found.push(Lockfile {
            manager,
            name,
            install_path,
            hash: blake3::hash(&key_input).to_hex().to_string(),
            key_input,
        });
    }
    Ok(found)
}

impl DepStore {
    /// The record of layer `key`, if one was built or tried. A corrupt record reads as none (the
    /// layer is then built again).
    pub fn load(&self, key: &str) -> Option<LayerRecord> {
        let bytes = std::fs::read(self.record(key)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Every layer record on the host, in no particular order.
    pub fn list(&self) -> std::io::Result<Vec<LayerRecord>> {
        let mut out = Vec::new();
        let dir = match std::fs::read_dir(self.records()) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in dir {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "json")
                && let Ok(bytes) = std::fs::read(&path)
                && let Ok(rec) = serde_json::from_slice::<LayerRecord>(&bytes)
            {
                out.push(rec);
            }
        }
        Ok(out)
    }

    /// The built layer for `lock`, when there is one: the newest built record of the same manager and
    /// lockfile (records of another major version of the manager are other keys; the newest wins).
    /// Runs nothing, so it is cheap enough for every `open`.
    pub fn built_for(&self, lock: &Lockfile) -> std::io::Result<Option<DepLayer>> {
        Ok(self
            .list()?
            .into_iter()
            .filter_map(|rec| match rec.state {
                LayerState::Built { layer, .. }
                    if layer.manager == lock.manager && layer.lockfile_hash == lock.hash =>
                {
                    Some((rec.built_at, layer))
                }
                _ => None,
            })
            .max_by_key(|(at, _)| *at)
            .map(|(_, layer)| layer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer record as `<state>/deps/layers/<key>.json` holds it (its trees hex strings).
    const LAYER: &str = include_str!("../../tests/fixtures/records/layer.json");

    /// Catches: a layer's tree (or a nested one) written in another form than the 40-hex string on
    /// disk (gix's `{"Sha1":[…]}`), or one that is not an object id read as some id.
    #[test]
    fn a_layer_record_on_disk_reads_and_writes_back_byte_for_byte() {
        let r: LayerRecord = serde_json::from_str(LAYER).expect("layer record");
        let LayerState::Built { layer, .. } = &r.state else {
            panic!("a built layer: {r:?}");
        };
        let trees: Vec<String> = layer.paths().map(|(_, t)| t.to_string()).collect();
        assert_eq!(trees, ["1".repeat(40), "2".repeat(40)]);
        let out = serde_json::to_vec_pretty(&r).expect("encode");
        assert_eq!(String::from_utf8_lossy(&out), LAYER);
        for (good, bad) in [("1".repeat(40), "111"), ("2".repeat(40), "2x")] {
            let e = serde_json::from_str::<LayerRecord>(&LAYER.replace(&good, bad))
                .expect_err("a bad tree")
                .to_string();
            assert!(e.contains(&format!("not a hex object id: {bad:?}")), "{e}");
        }
    }
}
