//! Dependency layers in a workspace: which built layers a new workspace presents (each install
//! path of a layer — the root's, and workspace packages' — that the tree does not have and its
//! `.gitignore` files ignore), what `status` says about them, the stamp `.git/octomate-installed`,
//! and the one rule for everything that leaves a workspace: nothing at or below a layer's path
//! while the workspace's ignore rules ignore it (what the user un-ignored there is content), and
//! no layer object named where the mirror cannot find it.
//!
//! Which layer stands in while a thread's own lockfile's layer is built (asked of
//! `super::deps::Daemon::build_for_open`, which builds in the sandbox), and whether a uv layer's
//! interpreter is one the workspace's owner can run (checked with their filesystem identity).
//!
//! Reads the mirror (through its object store) and the layer records; never builds a layer itself,
//! never runs anything, never writes a mirror, and reads a workspace only through its core.

use gix::ObjectId;
use gix_ignore::glob::pattern::Case;
use gix_ignore::glob::search::Pattern as _;
use gix_ignore::search::Ignore;

use super::Daemon;
use super::error::{Error, on_workspace};
use crate::deps::build::{layer_key, major};
use crate::deps::{DepLayer, DepStore, LayerState, Lockfile, Manager, detect};
use crate::fs::WorkspaceFs;
use crate::git::graft::{Graft, under_layer};
use crate::git::objects::{EntryKind, ObjectStore};
use crate::git::snapshot::{ViewEdit, ViewSource};
use crate::workspace::WorkspaceRecord;

/// Whether the `.gitignore` files of `tree` (the root's and those of every directory on the way)
/// ignore directory `path` (relative, `/`-separated), by git's rules: the deepest file with a
/// matching line decides, and an ignored directory ignores everything below it.
fn ignored_in_tree(store: &ObjectStore, tree: ObjectId, path: &str) -> std::io::Result<bool> {
    type Rules = gix_ignore::glob::search::pattern::List<Ignore>;
    let comps: Vec<&str> = path.split('/').collect();
    // The rules of each directory on the way: `lists[k]` is the `.gitignore` of the first `k`
    // components' directory.
    let mut lists: Vec<Option<Rules>> = Vec::with_capacity(comps.len());
    let mut at = Some(tree);
    for k in 0..comps.len() {
        let Some(t) = at else {
            lists.push(None);
            continue;
        };
        let entries = store.tree(t)?;
        let list = match entries
            .iter()
            .find(|e| &*e.name == b".gitignore" && e.kind == EntryKind::Blob)
        {
            Some(e) => Some(Rules {
                patterns: Ignore::default()
                    .bytes_to_patterns(&store.blob(e.id)?, std::path::Path::new("")),
                source: None,
                base: (k > 0).then(|| format!("{}/", comps[..k].join("/")).into()),
            }),
            None => None,
        };
        lists.push(list);
        at = entries
            .iter()
            .find(|e| &*e.name == comps[k].as_bytes() && e.kind == EntryKind::Tree)
            .map(|e| e.id);
    }
    // Each directory from the top: the deepest list (at or above its parent) that matches decides.
    for n in 1..=comps.len() {
        let dir = comps[..n].join("/");
        let basename = dir.rfind('/').map(|p| p + 1);
        let verdict = lists[..n].iter().rev().flatten().find_map(|list| {
            gix_ignore::search::pattern_matching_relative_path(
                list,
                dir.as_str().into(),
                basename,
                Some(true),
                Case::Sensitive,
            )
            .map(|m| !m.pattern.is_negative())
        });
        if verdict == Some(true) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `tree` has anything at `path` (relative, `/`-separated).
fn in_tree(store: &ObjectStore, tree: ObjectId, path: &str) -> std::io::Result<bool> {
    let mut at = tree;
    let comps: Vec<&str> = path.split('/').collect();
    for (k, c) in comps.iter().enumerate() {
        let entries = store.tree(at)?;
        let Some(e) = entries.iter().find(|e| &*e.name == c.as_bytes()) else {
            return Ok(false);
        };
        if k + 1 == comps.len() {
            return Ok(true);
        }
        if e.kind != EntryKind::Tree {
            return Ok(false);
        }
        at = e.id;
    }
    Ok(false)
}

/// Whether a workspace of `tree` presents a layer at `path`: the tree has nothing there and its
/// ignore rules ignore it as a directory.
fn presentable(store: &ObjectStore, tree: ObjectId, path: &str) -> std::io::Result<bool> {
    Ok(!in_tree(store, tree, path)? && ignored_in_tree(store, tree, path)?)
}

/// The lockfiles at the root of `tree` whose layer a workspace of it would present: the install
/// path is not in the tree and the tree's ignore rules ignore it as a directory.
fn eligible(store: &ObjectStore, tree: ObjectId) -> std::io::Result<Vec<Lockfile>> {
    let mut out = Vec::new();
    for l in detect(store, tree)? {
        if presentable(store, tree, l.install_path)? {
            out.push(l);
        }
    }
    Ok(out)
}

/// Why lockfile `lock` (whose bytes are `bytes`) has no built layer: the newest failed build's
/// message for it, else how to build it.
fn why_missing(deps: &DepStore, lock: &Lockfile) -> String {
    let bytes = &lock.key_input;
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
pub(super) fn grafts(rec: &WorkspaceRecord) -> Vec<Graft> {
    rec.layers
        .iter()
        .map(|l| Graft {
            path: l.path.clone(),
            tree: l.tree,
        })
        .collect()
}

/// Which of `paths` (each with whether it is a directory) the workspace's ignore rules leave out
/// now; reads the rules only when there is a path to decide.
fn ignored_now(
    core: &WorkspaceFs,
    paths: &[(&[u8], bool)],
) -> Result<std::collections::HashSet<Vec<u8>>, Error> {
    if paths.is_empty() {
        return Ok(Default::default());
    }
    let verdicts = crate::own_repo::add_all::ignored_as(core, paths)?;
    Ok(paths
        .iter()
        .zip(verdicts)
        .filter(|(_, ignored)| *ignored)
        .map(|((p, _), _)| p.to_vec())
        .collect())
}

/// Whether an edit at or below a layer path needs the ignore rules to decide it. A path new to
/// the view was decided by `git add -A`'s rules already (kept: tracked or not ignored); a removal
/// changes nothing where the snapshot has nothing, and removes what an earlier snapshot saved
/// there; an added directory has no tree effect. The rest (a layer file changed in place, a
/// directory moved) are the layer's presentation unless the path is content now.
fn needs_rules(e: &ViewEdit) -> bool {
    !matches!(
        e,
        ViewEdit::Remove { .. }
            | ViewEdit::AddedDir { .. }
            | ViewEdit::File { added: true, .. }
            | ViewEdit::Symlink { added: true, .. }
    )
}

/// Drops from `edits` what is at or below a layer path of `rec` while the workspace's ignore rules
/// ignore it (the layer's presentation and the install's output: never saved). A path there that
/// the rules no longer ignore (the user un-ignored `node_modules/x`) is content and is saved like
/// any other; what the layer presented and nobody changed makes no edit, so it stays out (it is the
/// lockfile's install, not the user's work). Every kept edit that names an object only the layer
/// store has (a layer file changed, moved or copied out of the layer) becomes edits the mirror can
/// hold: the content itself. Without layers, `edits` unchanged.
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
    let asked: Vec<(&[u8], bool)> = edits
        .iter()
        .filter(|e| under_layer(e.path(), paths()) && needs_rules(e))
        .map(|e| {
            let dir = matches!(e, ViewEdit::Tree { .. } | ViewEdit::Gitlink { .. });
            (e.path(), dir)
        })
        .collect();
    let ignored = ignored_now(core, &asked)?;
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
        if ignored.contains(e.path()) && under_layer(e.path(), paths()) {
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

/// Drops from a view's metadata every node at or below a layer path of `rec` that the workspace's
/// ignore rules ignore now (its modes, owners, special files and empty directories are the
/// layer's, or the install's: never saved); one there that is content now (un-ignored) stays.
pub(super) fn strip_meta(
    rec: &WorkspaceRecord,
    core: &WorkspaceFs,
    mut meta: Vec<crate::fs::NodeMeta>,
) -> Result<Vec<crate::fs::NodeMeta>, Error> {
    if rec.layers.is_empty() {
        return Ok(meta);
    }
    let paths = || rec.layers.iter().map(|l| l.path.as_str());
    let asked: Vec<(&[u8], bool)> = meta
        .iter()
        .filter(|m| under_layer(&m.path, paths()))
        .map(|m| {
            (
                m.path.as_slice(),
                m.kind == crate::git::posix_record::PosixKind::Dir,
            )
        })
        .collect();
    let ignored = ignored_now(core, &asked)?;
    meta.retain(|m| !ignored.contains(&m.path));
    Ok(meta)
}

/// How much of a `pyvenv.cfg` or of a script's first line is read.
const VENV_READ_MAX: u64 = 64 << 10;
/// How many scripts of an existing venv's `bin/` are looked at.
const VENV_SCRIPTS_MAX: usize = 256;

/// Why the `.venv` already in `dir` cannot be presented elsewhere, when there is one that is not
/// relocatable: it is not a plain directory, its `pyvenv.cfg` lacks `relocatable = true`, or a
/// script in its `bin/` has a shebang naming an absolute path inside the venv (it would run the
/// interpreter at the old path). `None` without a `.venv`, or for a relocatable one. Reads at most
/// a few KiB of a few hundred files; never writes. The folder is its owner's content: no symlink is
/// followed (the `.venv`, its `bin/` and every file are taken only as what they are), and only
/// regular files are read, opened without blocking (a FIFO named `pyvenv.cfg` must not hold the
/// daemon).
pub(super) fn kept_venv(dir: &std::path::Path) -> Option<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let venv = dir.join(".venv");
    let meta = std::fs::symlink_metadata(&venv).ok()?;
    if !meta.is_dir() {
        return Some("it is not a directory".into());
    }
    let read = |p: &std::path::Path, max: u64| -> Option<Vec<u8>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(p)
            .ok()?;
        if !f.metadata().ok()?.is_file() {
            return None;
        }
        let mut out = Vec::new();
        f.take(max).read_to_end(&mut out).ok()?;
        Some(out)
    };
    let cfg = match read(&venv.join("pyvenv.cfg"), VENV_READ_MAX) {
        Some(c) => String::from_utf8_lossy(&c).into_owned(),
        None => return Some("it has no pyvenv.cfg".into()),
    };
    let relocatable = cfg.lines().any(|l| {
        let mut kv = l.splitn(2, '=');
        let k = kv.next().unwrap_or("").trim();
        let v = kv.next().unwrap_or("").trim();
        k == "relocatable" && v.eq_ignore_ascii_case("true")
    });
    if !relocatable {
        return Some("pyvenv.cfg has no `relocatable = true`".into());
    }
    let roots: Vec<Vec<u8>> = [Some(venv.clone()), venv.canonicalize().ok()]
        .into_iter()
        .flatten()
        .map(|p| std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str()).to_vec())
        .collect();
    let bin = venv.join("bin");
    if !std::fs::symlink_metadata(&bin).ok()?.is_dir() {
        return Some("bin/ is not a directory".into());
    }
    let bin = std::fs::read_dir(bin).ok()?;
    for entry in bin.flatten().take(VENV_SCRIPTS_MAX) {
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let Some(head) = read(&entry.path(), 512) else {
            continue;
        };
        let Some(line) = head
            .strip_prefix(b"#!")
            .and_then(|h| h.split(|b| *b == b'\n').next())
        else {
            continue;
        };
        let interp = line
            .split(|b| b.is_ascii_whitespace())
            .find(|w| !w.is_empty())
            .unwrap_or(b"");
        if roots.iter().any(|r| interp.starts_with(r)) {
            return Some(format!(
                "bin/{} runs {}",
                entry.file_name().to_string_lossy(),
                String::from_utf8_lossy(interp)
            ));
        }
    }
    None
}

/// How many symlinks of a layer's `bin/` are followed to find its interpreter.
const INTERPRETER_HOPS: usize = 8;

/// The host path a uv layer's `bin/python` names (following the layer's own relative links in
/// `bin/`, e.g. `python3 -> python`): `None` when the layer has no `bin/python` symlink, or it
/// leads nowhere on the host.
fn interpreter_of(store: &ObjectStore, layer: &DepLayer) -> Option<std::path::PathBuf> {
    let bin = store
        .tree(layer.tree)
        .ok()?
        .iter()
        .find(|e| &*e.name == b"bin" && e.kind == EntryKind::Tree)?
        .id;
    let entries = store.tree(bin).ok()?;
    let mut name: Vec<u8> = b"python".to_vec();
    for _ in 0..INTERPRETER_HOPS {
        let e = entries.iter().find(|e| *e.name == *name)?;
        if e.kind != EntryKind::Symlink {
            return None;
        }
        let target = store.blob(e.id).ok()?;
        if target.starts_with(b"/") {
            return Some(std::path::PathBuf::from(
                String::from_utf8_lossy(&target).into_owned(),
            ));
        }
        if target.contains(&b'/') {
            return None;
        }
        name = target;
    }
    None
}

/// Why `owner` cannot run `interpreter` (a host path): a directory on the way they cannot search,
/// a target that is missing, or no execute bit for them (owner, their primary or supplementary
/// groups, others). Resolved with their filesystem identity and their groups (`getgrouplist`, as
/// a login of theirs gets them), so the daemon sees no more than they would.
fn unrunnable(interpreter: &std::path::Path, owner: crate::workspace::Owner) -> Option<String> {
    use std::os::unix::fs::MetadataExt as _;
    let mut groups = crate::sys::user_groups(owner.uid);
    if !groups.contains(&owner.gid) {
        groups.push(owner.gid);
    }
    let resolved = match crate::sys::as_fs_user_in(owner.uid, owner.gid, &groups, || {
        std::fs::canonicalize(interpreter).and_then(|p| std::fs::metadata(&p).map(|m| (p, m)))
    }) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Some(format!("{}: {e}", interpreter.display())),
        Err(e) => return Some(e.to_string()),
    };
    let (path, m) = resolved;
    let bit = if m.uid() == owner.uid {
        0o100
    } else if groups.contains(&m.gid()) {
        0o010
    } else {
        0o001
    };
    if !m.is_file() || m.mode() & bit == 0 {
        return Some(format!("{} is not executable for it", path.display()));
    }
    None
}

impl Daemon {
    /// One line per uv layer of `layers` whose interpreter (`.venv/bin/python`'s target on this
    /// host) the workspace's `owner` cannot run: what `open` prints and `status` says, instead of
    /// presenting the layer as fine. Reads the layer's tree and stats the host path with the
    /// owner's filesystem identity; runs nothing.
    pub(super) fn interpreter_lines(
        &self,
        project: &str,
        layers: &[DepLayer],
        owner: crate::workspace::Owner,
    ) -> Vec<String> {
        let Ok(store) = self.store(project) else {
            return Vec::new();
        };
        layers
            .iter()
            .filter(|l| l.manager == Manager::Uv && !l.path.contains('/'))
            .filter_map(|l| {
                let interp = interpreter_of(&store, l)?;
                let why = unrunnable(&interp, owner)?;
                Some(format!(
                    "uv layer {}: {}/bin/python runs {}, which {} cannot run ({why}); install a Python every user can run (e.g. /usr/bin/python3) and build the layer again (octofs deps gc, then octofs deps build)",
                    l.path,
                    l.path,
                    interp.display(),
                    crate::access::describe_uid(owner.uid)
                ))
            })
            .collect()
    }

    /// The `.venv` a project already has that a uv layer must not replace: one in the project's
    /// folder (a plain-directory upstream) or in its mirror's checkout that is not relocatable,
    /// with where it is and why.
    pub(super) fn existing_venv(&self, project: &str) -> Option<(std::path::PathBuf, String)> {
        let mut dirs = Vec::new();
        if let Ok(Some(p)) = crate::git::mirror::load(&self.layout, project)
            && p.kind == crate::git::mirror::UpstreamKind::Directory
        {
            dirs.push(std::path::PathBuf::from(p.upstream));
        }
        dirs.push(self.layout.mirror(project));
        dirs.into_iter().find_map(|d| {
            // Read with the folder owner's filesystem identity: the daemon sees there no more
            // than they could (the mirror is the daemon's own).
            use std::os::unix::fs::MetadataExt as _;
            let m = std::fs::metadata(&d).ok()?;
            let why = crate::sys::as_fs_user(m.uid(), m.gid(), || kept_venv(&d)).ok()??;
            Some((d.join(".venv"), why))
        })
    }

    /// The built layers a new workspace of `project` whose files are `tree` presents. A lockfile
    /// of `tree` without a built layer, in a project whose `base` tree (the fork's HEAD) or
    /// default-branch tip has a built layer at the same path (a thread whose agent changed its
    /// lockfile), gets its own layer built now ([`Daemon::build_for_open`], waited for a bounded
    /// time); while that is not ready, the other tree's layer is presented in its place, so a
    /// workspace never opens without the dependencies its project had (`status` says which
    /// lockfile it is and that its own is building). Reads a few blobs and the layer records;
    /// runs nothing itself. A failure to read is logged and means no layers (the workspace opens
    /// without).
    pub(super) fn choose_layers(
        &self,
        project: &str,
        tree: ObjectId,
        base: ObjectId,
    ) -> Vec<DepLayer> {
        let deps = DepStore::new(&self.layout);
        let tree_id = tree;
        let store = self.store(project).map_err(|e| e.to_string());
        let found = store
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|s| eligible(s, tree).map_err(|e| e.to_string()));
        let locks = match found {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%project, "cannot detect dependency lockfiles: {e}");
                return Vec::new();
            }
        };
        let mut layers = Vec::new();
        // The root's install path, then each workspace package's that this tree does not have
        // and ignores: one entry each, presented at its own path.
        let mut present = |layer: &DepLayer, root: &str| {
            let mut first = true;
            for (path, t) in layer.paths() {
                let path = if first { root } else { path };
                let shown = first
                    || store
                        .as_ref()
                        .is_ok_and(|s| presentable(s, tree_id, path).unwrap_or(false));
                first = false;
                if shown {
                    layers.push(DepLayer {
                        path: path.to_string(),
                        tree: t,
                        nested: Vec::new(),
                        ..layer.clone()
                    });
                }
            }
        };
        for lock in locks {
            if lock.manager == Manager::Uv
                && let Some((at, why)) = self.existing_venv(project)
            {
                tracing::info!(%project, "existing {} kept (not relocatable: {why}); no uv layer", at.display());
                continue;
            }
            match deps.built_for(&lock) {
                Ok(Some(layer)) => present(&layer, lock.install_path),
                Ok(None) => {
                    let stand_in = store
                        .as_ref()
                        .ok()
                        .and_then(|s| self.stand_in_layer(s, &deps, &lock, tree, base));
                    let Some(stand_in) = stand_in else {
                        tracing::info!(
                            %project,
                            manager = lock.manager.name(),
                            "no built dependency layer; the workspace opens without it"
                        );
                        continue;
                    };
                    match self.build_for_open(project, tree, &lock) {
                        Some(layer) => present(&layer, lock.install_path),
                        None => {
                            tracing::info!(
                                %project,
                                manager = lock.manager.name(),
                                "the workspace's own lockfile has no layer yet; presenting the layer of {} meanwhile",
                                stand_in.lockfile_hash
                            );
                            present(&stand_in, lock.install_path)
                        }
                    }
                }
                Err(e) => tracing::warn!(%project, "cannot read the dependency layers: {e}"),
            }
        }
        layers
    }

    /// The built layer of `lock`'s manager and install path for the lockfile of `base` (the
    /// fork's HEAD), else of the project's default-branch tip, when that lockfile is not `lock`'s:
    /// what a workspace whose own lockfile has no layer yet presents meanwhile.
    fn stand_in_layer(
        &self,
        store: &ObjectStore,
        deps: &DepStore,
        lock: &Lockfile,
        tree: ObjectId,
        base: ObjectId,
    ) -> Option<DepLayer> {
        let tip = store.resolve(None).ok().map(|b| b.tree);
        [Some(base), tip]
            .into_iter()
            .flatten()
            .filter(|t| *t != tree)
            .find_map(|t| {
                eligible(store, t)
                    .ok()?
                    .into_iter()
                    .find(|l| {
                        l.manager == lock.manager
                            && l.install_path == lock.install_path
                            && l.hash != lock.hash
                    })
                    .and_then(|l| deps.built_for(&l).ok().flatten())
            })
    }

    /// What `status` says about the lockfiles of a workspace's files (as it opened: a resumed
    /// thread's snapshot) whose own layer it does not present: one line each, and why — the
    /// layer is building, was built after the workspace opened, failed, or was never built — and
    /// which lockfile's layer it presents meanwhile, if any.
    pub(super) fn dependency_lines(&self, rec: &WorkspaceRecord) -> Vec<String> {
        let tree = rec.files_tree.unwrap_or(rec.base_tree);
        let deps = DepStore::new(&self.layout);
        let Ok(store) = self.store(&rec.project) else {
            return Vec::new();
        };
        let locks = eligible(&store, tree).unwrap_or_default();
        let mut lines = Vec::new();
        for lock in locks {
            let shown = rec
                .layers
                .iter()
                .find(|l| l.manager == lock.manager && l.path == lock.install_path);
            if shown.is_some_and(|l| l.lockfile_hash == lock.hash) {
                continue;
            }
            let m = lock.manager.name();
            let meanwhile = match shown {
                Some(l) => format!(
                    "; {} presents the {m} layer of another lockfile ({}) meanwhile",
                    lock.install_path, l.key
                ),
                None => String::new(),
            };
            let line = match deps.built_for(&lock) {
                _ if lock.manager == Manager::Uv
                    && let Some((at, why)) = self.existing_venv(&rec.project) =>
                {
                    format!(
                        "existing .venv kept (not relocatable: {why}): {}; the uv layer is not presented",
                        at.display()
                    )
                }
                _ if let Some(d) = super::deps::building(lock.manager, &lock.hash) => format!(
                    "{m} layer of this workspace's {} building ({} s so far){meanwhile}; open the thread again once it is built",
                    lock.name,
                    d.as_secs()
                ),
                // Not grafted live: the view's lower layer is fixed at open, and processes of the
                // workspace may have read (or hold open) the stand-in's files or what they wrote
                // at that path; swapping it under them would mix two dependency trees.
                Ok(Some(_)) => format!(
                    "{m} layer not in use (built after this workspace opened: release it and open it again){meanwhile}; a layer joins a live workspace only at open, never swapped under the processes that may have read {} already",
                    lock.install_path
                ),
                _ => format!(
                    "{m} layer not built ({}){meanwhile}",
                    why_missing(&deps, &lock)
                ),
            };
            lines.push(line);
        }
        lines.extend(self.interpreter_lines(&rec.project, &rec.layers, rec.owner));
        lines
    }
}
