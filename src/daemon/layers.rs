//! Dependency layers in a workspace: which built layers a new workspace presents (a lockfile at
//! the root of its files whose install path the tree does not have and its root `.gitignore`
//! ignores), what `status` says about them, the stamp `.git/octomate-installed`, and the one rule
//! for everything that leaves a workspace: nothing at or below a layer's path, and no layer object
//! named where the mirror cannot find it.
//!
//! Reads the mirror (through its object store) and the layer records; never builds a layer, never
//! writes a mirror, and reads a workspace only through its core.

use gix::ObjectId;
use gix_ignore::glob::pattern::Case;
use gix_ignore::glob::search::Pattern as _;
use gix_ignore::search::Ignore;

use super::Daemon;
use super::error::{Error, on_workspace};
use crate::deps::build::{layer_key, major};
use crate::deps::{DepLayer, DepStore, LayerState, Lockfile, detect};
use crate::fs::WorkspaceFs;
use crate::git::graft::{Graft, under_layer};
use crate::git::objects::{EntryKind, ObjectStore};
use crate::git::snapshot::{ViewEdit, ViewSource};
use crate::workspace::WorkspaceRecord;

/// The lockfiles at the root of `tree` whose layer a workspace of it would present: the install
/// path is not in the tree and the tree's root `.gitignore` ignores it as a directory.
fn eligible(store: &ObjectStore, tree: ObjectId) -> std::io::Result<Vec<Lockfile>> {
    let locks = detect(store, tree)?;
    if locks.is_empty() {
        return Ok(locks);
    }
    let entries = store.tree(tree)?;
    let rules = match entries
        .iter()
        .find(|e| &*e.name == b".gitignore" && e.kind == EntryKind::Blob)
    {
        Some(e) => Some(gix_ignore::glob::search::pattern::List::<Ignore> {
            patterns: Ignore::default()
                .bytes_to_patterns(&store.blob(e.id)?, std::path::Path::new("")),
            source: None,
            base: None,
        }),
        None => None,
    };
    let ignored = |path: &str| {
        rules.as_ref().is_some_and(|list| {
            gix_ignore::search::pattern_matching_relative_path(
                list,
                path.into(),
                None,
                Some(true),
                Case::Sensitive,
            )
            .is_some_and(|m| !m.pattern.is_negative())
        })
    };
    Ok(locks
        .into_iter()
        .filter(|l| {
            !entries
                .iter()
                .any(|e| &*e.name == l.install_path.as_bytes())
                && ignored(l.install_path)
        })
        .collect())
}

/// Why lockfile `lock` (whose bytes are `bytes`) has no built layer: the newest failed build's
/// message for it, else how to build it.
fn why_missing(deps: &DepStore, lock: &Lockfile, bytes: &[u8]) -> String {
    let failed = deps
        .list()
        .unwrap_or_default()
        .into_iter()
        .filter(|rec| {
            rec.manager == lock.manager
                && rec.key == layer_key(rec.manager, &major(&rec.manager_version), bytes)
        })
        .filter_map(|rec| match rec.state {
            LayerState::Failed { message, .. } => Some((rec.built_at, message)),
            LayerState::Built { .. } => None,
        })
        .max_by_key(|(at, _)| *at)
        .map(|(_, m)| m);
    match failed {
        Some(m) => format!("its build failed: {m}"),
        None => "run octofs deps build".into(),
    }
}

/// The stamp `.git/octomate-installed` of a workspace presenting `layers`: one line per layer,
/// `<manager> <path> <lockfile hash>`; `None` without layers.
pub(super) fn installed_stamp(layers: &[DepLayer]) -> Option<String> {
    (!layers.is_empty()).then(|| {
        layers
            .iter()
            .map(|l| format!("{} {} {}\n", l.manager.name(), l.path, l.lockfile_hash))
            .collect()
    })
}

/// The grafts of a workspace record's layers.
pub(super) fn grafts(rec: &WorkspaceRecord) -> Result<Vec<Graft>, Error> {
    rec.layers
        .iter()
        .map(|l| {
            Ok(Graft {
                path: l.path.clone(),
                tree: ObjectId::from_hex(l.tree.as_bytes()).map_err(|_| {
                    Error::Refused(format!(
                        "thread {}: layer {} has a bad tree id {:?}",
                        rec.thread, l.key, l.tree
                    ))
                })?,
            })
        })
        .collect()
}

/// Drops from `edits` everything at or below a layer path of `rec`, and turns every edit that
/// names an object only the layer store has (a layer file or directory moved or copied out of the
/// layer) into edits the mirror can hold: the content itself. Without layers, `edits` unchanged.
pub(super) fn strip(
    rec: &WorkspaceRecord,
    core: &WorkspaceFs,
    store: &ObjectStore,
    repo: &gix::Repository,
    edits: Vec<ViewEdit>,
) -> Result<Vec<ViewEdit>, Error> {
    if rec.layers.is_empty() {
        return Ok(edits);
    }
    let paths = || rec.layers.iter().map(|l| l.path.as_str());
    let content = |id: ObjectId| -> Result<ViewSource, Error> {
        if repo.has_object(id) {
            return Ok(ViewSource::Object(id));
        }
        Ok(ViewSource::Bytes(store.blob(id).map_err(|e| {
            Error::Op {
                what: format!("cannot read dependency layer object {id}"),
                source: Box::new(e),
            }
        })?))
    };
    let mut out = Vec::with_capacity(edits.len());
    for e in edits {
        if under_layer(e.path(), paths()) {
            continue;
        }
        match e {
            ViewEdit::File {
                path,
                exec,
                source: ViewSource::Object(id),
                added,
            } => out.push(ViewEdit::File {
                path,
                exec,
                source: content(id)?,
                added,
            }),
            ViewEdit::Symlink {
                path,
                source: ViewSource::Object(id),
                added,
            } => out.push(ViewEdit::Symlink {
                path,
                source: content(id)?,
                added,
            }),
            ViewEdit::Tree { path, id } if !repo.has_object(id) => {
                let files = core
                    .tree_files(id)
                    .map_err(on_workspace("cannot read a moved dependency directory"))?;
                out.push(ViewEdit::Remove { path: path.clone() });
                for (f, edit) in files {
                    let p = [path.as_slice(), b"/", &f].concat();
                    let edit = match edit {
                        ViewEdit::File {
                            exec,
                            source: ViewSource::Object(id),
                            ..
                        } => ViewEdit::File {
                            path: p,
                            exec,
                            source: content(id)?,
                            added: true,
                        },
                        ViewEdit::Symlink {
                            source: ViewSource::Object(id),
                            ..
                        } => ViewEdit::Symlink {
                            path: p,
                            source: content(id)?,
                            added: true,
                        },
                        other => other.at(p),
                    };
                    out.push(edit);
                }
            }
            other => out.push(other),
        }
    }
    out.sort_by(|a, b| a.path().cmp(b.path()));
    Ok(out)
}

/// Drops from a view's metadata every node at or below a layer path of `rec` (its modes, owners,
/// special files and empty directories are the layer's, or the install's: never saved).
pub(super) fn strip_meta(
    rec: &WorkspaceRecord,
    mut meta: Vec<crate::fs::NodeMeta>,
) -> Vec<crate::fs::NodeMeta> {
    if !rec.layers.is_empty() {
        meta.retain(|m| !under_layer(&m.path, rec.layers.iter().map(|l| l.path.as_str())));
    }
    meta
}

impl Daemon {
    /// The built layers a new workspace of `project` whose files are `tree` presents, and one line
    /// per eligible lockfile without one. Reads two or three blobs and the layer records; runs
    /// nothing. A failure to read is logged and means no layers (the workspace opens without).
    pub(super) fn choose_layers(&self, project: &str, tree: ObjectId) -> Vec<DepLayer> {
        let deps = DepStore::new(&self.layout);
        let found = self
            .store(project)
            .map_err(|e| e.to_string())
            .and_then(|s| eligible(&s, tree).map_err(|e| e.to_string()));
        let locks = match found {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%project, "cannot detect dependency lockfiles: {e}");
                return Vec::new();
            }
        };
        let mut layers = Vec::new();
        for lock in locks {
            match deps.built_for(&lock) {
                Ok(Some(mut layer)) => {
                    layer.path = lock.install_path.to_string();
                    layers.push(layer);
                }
                Ok(None) => tracing::info!(
                    %project,
                    manager = lock.manager.name(),
                    "no built dependency layer; the workspace opens without it"
                ),
                Err(e) => tracing::warn!(%project, "cannot read the dependency layers: {e}"),
            }
        }
        layers
    }

    /// What `status` says about the lockfiles of a workspace's base whose layer it does not
    /// present: one line each, and why.
    pub(super) fn dependency_lines(&self, rec: &WorkspaceRecord) -> Vec<String> {
        let Ok(tree) = ObjectId::from_hex(rec.base_tree.as_bytes()) else {
            return Vec::new();
        };
        let deps = DepStore::new(&self.layout);
        let Ok(store) = self.store(&rec.project) else {
            return Vec::new();
        };
        let locks = eligible(&store, tree).unwrap_or_default();
        let bytes_of = |lock: &Lockfile| -> Vec<u8> {
            store
                .tree(tree)
                .ok()
                .and_then(|entries| {
                    let e = entries.iter().find(|e| &*e.name == lock.name.as_bytes())?;
                    store.blob(e.id).ok()
                })
                .unwrap_or_default()
        };
        locks
            .into_iter()
            .filter(|lock| {
                !rec.layers
                    .iter()
                    .any(|l| l.manager == lock.manager && l.path == lock.install_path)
            })
            .map(|lock| match deps.built_for(&lock) {
                Ok(Some(_)) => format!(
                    "{} layer not in use (built after this workspace opened: release it and open it again)",
                    lock.manager.name()
                ),
                _ => format!(
                    "{} layer not built ({})",
                    lock.manager.name(),
                    why_missing(&deps, &lock, &bytes_of(&lock))
                ),
            })
            .collect()
    }
}
