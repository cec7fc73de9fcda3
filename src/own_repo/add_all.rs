//! What `git add -A` would add, decided in process.
//!
//! A path that is new to the base belongs to the working state when it is tracked (it has an entry
//! in the workspace's index, a split index resolved), or when it is untracked and not ignored. The
//! ignore rules are git's: the `.gitignore` of every directory on the path (the deepest decides
//! first; within a file the last matching line wins; a negation re-includes) and then
//! `.git/info/exclude`; a directory that is excluded excludes everything below it, which nothing
//! can re-include. Like git since 2.32, a `.gitignore` that is a symlink is not read, and, like
//! git, neither is one larger than 100 MiB. `core.excludesFile` and the global excludes are not
//! honoured: they are paths on the host, chosen by the workspace's configuration.
//!
//! Patterns are matched by `gix-ignore`; only the walk over directories is ours. Everything is
//! read through the filesystem core, names as bytes, at any depth.

use std::collections::HashMap;
use std::path::Path;

use gix::bstr::{BStr, ByteSlice};
use gix_ignore::glob::pattern::Case;
use gix_ignore::glob::search::Pattern as _;
use gix_ignore::glob::search::pattern::List;
use gix_ignore::search::Ignore;

use super::{Error, Scratch};
use crate::fs::WorkspaceFs;
use crate::git::snapshot::ViewEdit;

/// git ignores pattern files larger than this (`PATTERN_MAX_FILE_SIZE`).
const PATTERN_MAX_FILE_SIZE: u64 = 100 << 20;

/// Keeps of `edits` what `git add -A` would add: everything of the base, and of the paths new to
/// the base only those tracked or untracked-and-not-ignored. A directory that moved here whole is
/// kept as one tree only when every file in it is kept; otherwise it is expanded into the files
/// that are. A nested repository (a gitlink edit) is kept when tracked, or when it is one (it has
/// a `.git`) and is not ignored. Nothing is read when no path is new (the common case of edits to
/// tracked files). `state` is the daemon's state directory (for private copies of the index).
pub fn keep(
    core: &WorkspaceFs,
    state: &Path,
    edits: Vec<ViewEdit>,
) -> Result<Vec<ViewEdit>, Error> {
    let added_dirs: Vec<Vec<u8>> = edits
        .iter()
        .filter_map(|e| match e {
            ViewEdit::AddedDir { path } => Some(path.clone()),
            _ => None,
        })
        .collect();
    let mut roots: Vec<Vec<u8>> = Vec::new();
    for e in &edits {
        let p = match e {
            ViewEdit::AddedDir { path } => path,
            ViewEdit::File {
                path, added: true, ..
            }
            | ViewEdit::Symlink {
                path, added: true, ..
            } => path,
            _ => continue,
        };
        if !added_dirs.iter().any(|d| under(p, d)) && !roots.contains(p) {
            roots.push(p.clone());
        }
    }
    if roots.is_empty() {
        return Ok(edits);
    }
    let is_new = |p: &[u8]| roots.iter().any(|r| p == r.as_slice() || under(p, r));
    let index = read_index(core, state)?;
    let tracked = |p: &[u8]| index.entry_index_by_path(p.as_bstr()).is_ok();
    let mut rules = Rules::new(core)?;
    let mut out = Vec::with_capacity(edits.len());
    for e in edits {
        match &e {
            ViewEdit::Gitlink { path, .. } if is_new(path) => {
                let repo = [path.as_slice(), b"/.git"].concat();
                if tracked(path)
                    || (core_kind(core, &repo)?.is_some() && !rules.ignored(path, true)?)
                {
                    out.push(e);
                }
            }
            ViewEdit::File { path, .. } | ViewEdit::Symlink { path, .. } if is_new(path) => {
                if tracked(path) || !rules.ignored(path, false)? {
                    out.push(e);
                }
            }
            ViewEdit::Tree { path, id } if is_new(path) => {
                let files = core
                    .tree_files(*id)
                    .map_err(|source| Error::ListTree { id: *id, source })?;
                let mut kept = Vec::with_capacity(files.len());
                for (f, edit) in files {
                    let p = [path.as_slice(), b"/", &f].concat();
                    // A gitlink of the base moved here is an empty directory: only its index
                    // entry can bring it in.
                    let keep = tracked(&p)
                        || (!matches!(edit, ViewEdit::Gitlink { .. })
                            && !rules.ignored(&p, false)?);
                    kept.push((p, edit, keep));
                }
                if kept.iter().all(|(_, _, k)| *k) {
                    out.push(e);
                } else {
                    out.push(ViewEdit::Remove { path: path.clone() });
                    out.extend(
                        kept.into_iter()
                            .filter(|(_, _, k)| *k)
                            .map(|(p, edit, _)| edit.at(p)),
                    );
                }
            }
            _ => out.push(e),
        }
    }
    Ok(out)
}

/// The regular files new to the base that `git add -A` leaves out because they match an ignore
/// rule themselves (an `.env`), never those inside an ignored directory (dependencies, build
/// output): the untracked, ignored `File` edits of `edits` whose directory is not ignored.
/// Tracked paths are never among them (the snapshot holds those). Read like [`keep`].
pub fn ignored_files(
    core: &WorkspaceFs,
    state: &Path,
    edits: &[ViewEdit],
) -> Result<Vec<Vec<u8>>, Error> {
    let added: Vec<&[u8]> = edits
        .iter()
        .filter_map(|e| match e {
            ViewEdit::File {
                path, added: true, ..
            } => Some(path.as_slice()),
            _ => None,
        })
        .collect();
    if added.is_empty() {
        return Ok(Vec::new());
    }
    let index = read_index(core, state)?;
    let mut rules = Rules::new(core)?;
    let mut out = Vec::new();
    for path in added {
        if index.entry_index_by_path(path.as_bstr()).is_ok() {
            continue;
        }
        let parent = parent_of(path);
        if !parent.is_empty() && rules.ignored(parent, true)? {
            continue;
        }
        if rules.ignored(path, false)? {
            out.push(path.to_vec());
        }
    }
    Ok(out)
}

/// Whether `p` is strictly below directory `d`.
fn under(p: &[u8], d: &[u8]) -> bool {
    p.starts_with(d) && p.get(d.len()) == Some(&b'/')
}

fn comps(path: &[u8]) -> Vec<&[u8]> {
    path.split(|b| *b == b'/').collect()
}

fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

fn core_kind(core: &WorkspaceFs, path: &[u8]) -> Result<Option<fuser::FileType>, Error> {
    core.kind_at(&comps(path)).map_err(|source| Error::Read {
        path: shown(path),
        source,
    })
}

/// The most octofs reads of a workspace's index file (or its shared part). git's index of a
/// million files is ~150 MB; a larger file is an agent's doing (a sparse file of GiBs costs it
/// nothing) and would cost the daemon the time to hash and parse it, so it is refused before it is
/// copied or read.
pub(crate) const MAX_INDEX_BYTES: u64 = 1 << 30;

/// The workspace's index (`.git/index`; empty when there is none), read from a private copy. A
/// split index (`core.splitIndex`) names its shared part, which is copied beside it on demand.
pub(crate) fn read_index(core: &WorkspaceFs, state: &Path) -> Result<gix::index::File, Error> {
    let scratch = Scratch::new(state, "index")?;
    let path = scratch.path().join("index");
    if !scratch.copy_in(
        core,
        &[b".git", b"index"],
        Path::new("index"),
        MAX_INDEX_BYTES,
    )? {
        return Ok(gix::index::File::from_state(
            gix::index::State::new(gix::hash::Kind::Sha1),
            path,
        ));
    }
    let open = || {
        gix::index::File::at(
            &path,
            gix::hash::Kind::Sha1,
            false,
            gix::index::decode::Options::default(),
        )
    };
    match open() {
        Ok(f) => Ok(f),
        Err(e) => {
            let shared = e
                .downcast_any_ref::<gix::index::file::init::OpenError>()
                .filter(|o| o.path.parent() == Some(scratch.path()))
                .and_then(|o| o.path.file_name())
                .map(|n| n.as_encoded_bytes().to_vec())
                .filter(|n| n.starts_with(b"sharedindex."));
            let Some(name) = shared else {
                return Err(Error::Index { source: e });
            };
            let to = name.to_str_lossy();
            if !scratch.copy_in(core, &[b".git", &name], Path::new(&*to), MAX_INDEX_BYTES)? {
                return Err(Error::SplitIndexMissing { name: shown(&name) });
            }
            open().map_err(|source| Error::Index { source })
        }
    }
}

/// Whether each of `paths` (files) is ignored by the workspace's rules, exactly as [`keep`] decides
/// for an untracked path (whether it is tracked does not matter here): the commit gate `excludes`.
pub fn ignored(core: &WorkspaceFs, paths: &[&[u8]]) -> Result<Vec<bool>, Error> {
    let mut rules = Rules::new(core)?;
    paths.iter().map(|p| rules.ignored(p, false)).collect()
}

/// Whether each of `paths` (with whether it is a directory) is ignored by the workspace's rules,
/// as [`keep`] decides for an untracked path: what a dependency layer's path leaves out.
pub fn ignored_as(core: &WorkspaceFs, paths: &[(&[u8], bool)]) -> Result<Vec<bool>, Error> {
    let mut rules = Rules::new(core)?;
    paths
        .iter()
        .map(|(p, dir)| rules.ignored(p, *dir))
        .collect()
}

/// The ignore state of one directory of the workspace.
struct DirRules {
    /// The directory is ignored (so is everything below it).
    excluded: bool,
    /// Its `.gitignore`, when it has one and is not excluded.
    list: Option<List<Ignore>>,
}

/// git's exclude rules of one workspace, loaded directory by directory as paths need them.
struct Rules<'a> {
    core: &'a WorkspaceFs,
    /// `.git/info/exclude`: the lowest precedence.
    exclude: Option<List<Ignore>>,
    /// By directory path (`""`: the root).
    dirs: HashMap<Vec<u8>, DirRules>,
}

impl<'a> Rules<'a> {
    fn new(core: &'a WorkspaceFs) -> Result<Rules<'a>, Error> {
        let exclude = load(core, &[b".git", b"info", b"exclude"], None)?;
        let root = DirRules {
            excluded: false,
            list: load(core, &[b".gitignore"], None)?,
        };
        Ok(Rules {
            core,
            exclude,
            dirs: HashMap::from([(Vec::new(), root)]),
        })
    }

    /// Whether `path` (a directory when `is_dir`) is ignored.
    fn ignored(&mut self, path: &[u8], is_dir: bool) -> Result<bool, Error> {
        let parent = parent_of(path);
        self.load_dir(parent)?;
        if self.dirs.get(parent).is_some_and(|d| d.excluded) {
            return Ok(true);
        }
        Ok(self.matches(path, is_dir, parent))
    }

    /// Loads the state of `dir` and of every directory above it.
    fn load_dir(&mut self, dir: &[u8]) -> Result<(), Error> {
        if self.dirs.contains_key(dir) {
            return Ok(());
        }
        let mut missing = vec![dir];
        let mut cur = parent_of(dir);
        while !self.dirs.contains_key(cur) {
            missing.push(cur);
            cur = parent_of(cur);
        }
        for d in missing.into_iter().rev() {
            let parent = parent_of(d);
            let excluded =
                self.dirs.get(parent).is_none_or(|p| p.excluded) || self.matches(d, true, parent);
            let list = if excluded {
                None
            } else {
                let file = [d, b"/.gitignore"].concat();
                let mut base = d.to_vec();
                base.push(b'/');
                load(self.core, &comps(&file), Some(base))?
            };
            self.dirs.insert(d.to_vec(), DirRules { excluded, list });
        }
        Ok(())
    }

    /// The verdict of the rules for `path`, whose directory `dir` is loaded and not excluded: the
    /// deepest `.gitignore` with a matching line decides, then `.git/info/exclude`.
    fn matches(&self, path: &[u8], is_dir: bool, dir: &[u8]) -> bool {
        let path: &BStr = path.as_bstr();
        let basename = path.rfind_byte(b'/').map(|p| p + 1);
        let verdict = |list: &List<Ignore>| {
            gix_ignore::search::pattern_matching_relative_path(
                list,
                path,
                basename,
                Some(is_dir),
                Case::Sensitive,
            )
            .map(|m| !m.pattern.is_negative())
        };
        let mut d = Some(dir);
        while let Some(cur) = d {
            if let Some(v) = self
                .dirs
                .get(cur)
                .and_then(|r| r.list.as_ref())
                .and_then(verdict)
            {
                return v;
            }
            d = (!cur.is_empty()).then(|| parent_of(cur));
        }
        self.exclude.as_ref().and_then(verdict).unwrap_or(false)
    }
}

/// The directory `path` is in (`""` for a top-level name).
fn parent_of(path: &[u8]) -> &[u8] {
    path.rfind_byte(b'/').map_or(&[][..], |i| &path[..i])
}

/// The patterns of the workspace's file at `file`, matched relative to `base` (a directory with a
/// trailing `/`; `None`: the root). A missing file, a symlink, a directory or an oversized file
/// has none.
fn load(
    core: &WorkspaceFs,
    file: &[&[u8]],
    base: Option<Vec<u8>>,
) -> Result<Option<List<Ignore>>, Error> {
    let what = || shown(&file.join(&b'/'));
    let Some(f) = core.open_file(file).map_err(|source| Error::Read {
        path: what(),
        source,
    })?
    else {
        return Ok(None);
    };
    let size = f
        .metadata()
        .map_err(|source| Error::ReadContent {
            path: what(),
            source,
        })?
        .len();
    if size > PATTERN_MAX_FILE_SIZE {
        tracing::warn!(file = %what(), size, "ignoring a pattern file larger than 100 MiB, as git does");
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, PATTERN_MAX_FILE_SIZE),
        &mut bytes,
    )
    .map_err(|source| Error::ReadContent {
        path: what(),
        source,
    })?;
    Ok(Some(List {
        patterns: Ignore::default().bytes_to_patterns(&bytes, Path::new("")),
        source: None,
        base: base.map(Into::into),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_of_paths() {
        assert_eq!(parent_of(b"a/b/c"), b"a/b");
        assert_eq!(parent_of(b"a"), b"");
        assert!(under(b"a/b", b"a"));
        assert!(!under(b"ab", b"a"));
    }
}
