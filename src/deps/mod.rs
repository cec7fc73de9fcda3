//! Dependency layers: the ignored dependency trees of a project (`node_modules`, `.venv`), installed
//! once per host by the package manager itself and sealed as immutable git trees in a host-wide
//! object store (`<state>/deps/store.git`), keyed by a hash of the lockfile(s), the manager and its
//! major version. A workspace presents a layer read-through at its ignored path: the layer's tree is
//! grafted into the workspace's view (never into its base commit), so forking stays O(1) and every
//! workspace reads the same blob-cache files.
//!
//! This module owns the layer records and the store's paths. It never writes a mirror or a workspace
//! and never runs anything a workspace can configure: a layer is built from a mirror's commit.

use std::path::PathBuf;

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
    /// The sealed tree (hex object id in `<state>/deps/store.git`).
    pub tree: String,
    /// Hex blake3 of the lockfile(s) alone: what `.git/octomate-installed` records.
    pub lockfile_hash: String,
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
