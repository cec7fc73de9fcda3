//! Read access to a mirror's object store: trees, blob sizes and blob contents, by object id.
//!
//! This is the lower layer of every workspace (invariant 2: the lower layer is a commit, not a
//! directory). It never writes. Parsed trees and blob sizes are cached, shared by every workspace of the
//! mirror (parsed trees bounded by the bytes they hold); stat data comes from object headers, never
//! from reading content.
//!
//! An object the mirror does not have is looked up in the store's fallback, the host's dependency
//! layer store (`<state>/deps/store.git`, opened at the first miss once it exists): a workspace
//! whose view grafts a layer reads the layer's trees and blobs from there. The mirror is never
//! written; the fallback is written only through [`ObjectStore::with_fallback_repo`] (grafted
//! trees, `git::graft`).

use crate::git::error::{Context, Error};
use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dashmap::DashMap;
use gix::ObjectId;
use lru::LruCache;

/// The kind of a tree entry, as git records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Tree,
    Blob,
    Executable,
    Symlink,
    /// A submodule commit; presented as an empty directory.
    Gitlink,
}

/// Git orders tree entries by name, with a tree's name compared as if it ended in '/'.
pub fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        std::cmp::Ordering::Equal => {
            let ac = a.get(n).copied().or(if a_tree { Some(b'/') } else { None });
            let bc = b.get(n).copied().or(if b_tree { Some(b'/') } else { None });
            ac.cmp(&bc)
        }
        o => o,
    }
}

/// One entry of a parsed tree.
#[derive(Debug, Clone)]
pub struct TreeEntry {
    pub name: Box<[u8]>,
    pub kind: EntryKind,
    pub id: ObjectId,
}

/// What a workspace is based on: a commit, its tree and its time.
#[derive(Debug, Clone)]
pub struct ResolvedRef {
    pub commit: ObjectId,
    pub tree: ObjectId,
    /// Committer time, Unix seconds.
    pub time: i64,
    /// The branch `spec` named, when it named one.
    pub branch: Option<String>,
}

static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// gix repositories are not `Sync`: every thread keeps its own handle per store.
    static REPOS: RefCell<HashMap<u64, gix::Repository>> = RefCell::new(HashMap::new());
}

/// Parsed trees, least recently used evicted first, bounded by the bytes they hold (a tree of
/// 100,000 entries costs what 10,000 trees of ten do).
struct TreeCache {
    lru: LruCache<ObjectId, Arc<[TreeEntry]>>,
    bytes: usize,
    budget: usize,
}

impl TreeCache {
    /// Bytes the store's tree cache may hold: every tree of a 100k-file base takes ~8 MiB.
    const BUDGET: usize = 64 << 20;

    fn new(budget: usize) -> TreeCache {
        TreeCache {
            lru: LruCache::unbounded(),
            bytes: 0,
            budget,
        }
    }

    /// What a parsed tree holds: its entries and their names (with the allocator's overhead).
    fn cost(entries: &[TreeEntry]) -> usize {
        std::mem::size_of_val(entries)
            + entries
                .iter()
                .map(|e| e.name.len().next_multiple_of(16) + 16)
                .sum::<usize>()
            + 64
    }

    fn get(&mut self, id: &ObjectId) -> Option<Arc<[TreeEntry]>> {
        self.lru.get(id).cloned()
    }

    fn put(&mut self, id: ObjectId, entries: Arc<[TreeEntry]>) {
        self.bytes += Self::cost(&entries);
        if let Some(old) = self.lru.put(id, entries) {
            self.bytes = self.bytes.saturating_sub(Self::cost(&old));
        }
        // The newest tree stays even when it alone is over the budget.
        while self.bytes > self.budget && self.lru.len() > 1 {
            match self.lru.pop_lru() {
                Some((_, old)) => self.bytes = self.bytes.saturating_sub(Self::cost(&old)),
                None => break,
            }
        }
    }
}

/// A mirror's object store, shared by every workspace of that mirror.
pub struct ObjectStore {
    id: u64,
    path: PathBuf,
    repo: gix::ThreadSafeRepository,
    trees: Mutex<TreeCache>,
    sizes: DashMap<ObjectId, u64>,
    fallback: Option<Fallback>,
    /// The daemon's snapshot caches: a tree a snapshot just wrote is read from there.
    snapshots: Option<Arc<crate::git::snapshot::Caches>>,
}

/// The object store searched when the mirror lacks an object (the dependency layer store).
struct Fallback {
    id: u64,
    path: PathBuf,
    /// Opened at the first miss once the repository exists.
    repo: OnceLock<gix::ThreadSafeRepository>,
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStore")
            .field("path", &self.path)
            .finish()
    }
}

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

impl ObjectStore {
    pub fn open(path: &Path) -> io::Result<ObjectStore> {
        let repo =
            super::open_owned(path).map_err(|e| other(format!("{}: {e}", path.display())))?;
        Ok(ObjectStore {
            id: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            repo: repo.into_sync(),
            trees: Mutex::new(TreeCache::new(TreeCache::BUDGET)),
            sizes: DashMap::new(),
            fallback: None,
            snapshots: None,
        })
    }

    /// The same store, reading a tree a snapshot just wrote from `caches` (the daemon's snapshot
    /// caches) before the mirror.
    pub fn with_snapshot_caches(
        mut self,
        caches: Arc<crate::git::snapshot::Caches>,
    ) -> ObjectStore {
        self.snapshots = Some(caches);
        self
    }

    /// The same store, looking up in the repository at `path` (a bare repository; it may not exist
    /// yet) every object the mirror does not have.
    pub fn with_fallback(mut self, path: &Path) -> ObjectStore {
        self.fallback = Some(Fallback {
            id: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            path: path.to_path_buf(),
            repo: OnceLock::new(),
        });
        self
    }

    /// Runs `f` on this thread's handle of the fallback repository; `None` when there is no
    /// fallback or it does not exist (yet).
    pub fn with_fallback_repo<R>(&self, f: impl FnOnce(&gix::Repository) -> R) -> Option<R> {
        let fb = self.fallback.as_ref()?;
        let shared = match fb.repo.get() {
            Some(r) => r,
            None => {
                if !fb.path.exists() {
                    return None;
                }
                match super::open_owned(&fb.path) {
                    Ok(r) => fb.repo.get_or_init(|| r.into_sync()),
                    Err(e) => {
                        tracing::warn!(path = %fb.path.display(), "cannot open the dependency layer store: {e}");
                        return None;
                    }
                }
            }
        };
        Some(REPOS.with(|cell| {
            let mut map = cell.borrow_mut();
            let repo = map.entry(fb.id).or_insert_with(|| shared.to_thread_local());
            f(repo)
        }))
    }

    /// `f` on the mirror, then, if it failed, on the fallback; the mirror's error when both fail.
    fn find<R>(&self, f: impl Fn(&gix::Repository) -> io::Result<R>) -> io::Result<R> {
        match self.with_repo(&f) {
            Ok(r) => Ok(r),
            Err(e) => match self.with_fallback_repo(&f) {
                Some(Ok(r)) => Ok(r),
                _ => Err(e),
            },
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on this thread's handle of the mirror (opened once per thread).
    pub fn with_repo<R>(&self, f: impl FnOnce(&gix::Repository) -> R) -> R {
        REPOS.with(|cell| {
            let mut map = cell.borrow_mut();
            let repo = map
                .entry(self.id)
                .or_insert_with(|| self.repo.to_thread_local());
            f(repo)
        })
    }

    /// Resolves `spec` (a branch, tag, remote branch, commit id or any rev-parse expression; the
    /// mirror's HEAD when `None`) to a commit. A branch that exists only upstream is found as
    /// `origin/<spec>`.
    pub fn resolve(&self, spec: Option<&str>) -> Result<ResolvedRef, Error> {
        self.with_repo(|repo| {
            let shown = spec.unwrap_or("HEAD");
            let mut candidates = vec![shown.to_string()];
            if let Some(s) = spec {
                candidates.push(format!("origin/{s}"));
            }
            let mut last_err = String::new();
            for cand in &candidates {
                match repo.rev_parse_single(cand.as_str()) {
                    Ok(id) => {
                        let commit = id
                            .object()
                            .and_then(|o| o.peel_to_commit())
                            .context(|| format!("ref {shown:?} does not name a commit"))?;
                        let tree = commit
                            .tree_id()
                            .context(|| format!("commit {} has no tree", commit.id))?
                            .detach();
                        let time = commit.time().map(|t| t.seconds).unwrap_or(0);
                        let branch = match spec {
                            None => repo
                                .head_name()
                                .ok()
                                .flatten()
                                .map(|n| n.shorten().to_string()),
                            Some(s) => repo
                                .find_reference(format!("refs/heads/{s}").as_str())
                                .ok()
                                .map(|_| s.to_string())
                                .or_else(|| {
                                    repo.find_reference(format!("refs/remotes/origin/{s}").as_str())
                                        .ok()
                                        .map(|_| s.to_string())
                                }),
                        };
                        return Ok(ResolvedRef {
                            commit: commit.id,
                            tree,
                            time,
                            branch,
                        });
                    }
                    Err(e) => last_err = e.to_string(),
                }
            }
            Err(Error::Invalid(match spec {
                Some(s) => {
                    tracing::debug!("resolve {s}: {last_err}");
                    format!("ref {s:?} does not resolve in the mirror (no branch, tag or commit of that name)")
                }
                None => format!("the mirror has no commits yet: {last_err}"),
            }))
        })
    }

    /// The entries of tree `id`, in git order.
    pub fn tree(&self, id: ObjectId) -> io::Result<Arc<[TreeEntry]>> {
        if let Some(t) = self.trees.lock().map_err(other)?.get(&id) {
            return Ok(t);
        }
        let parsed = |decoded: &gix::objs::TreeRef<'_>| -> Arc<[TreeEntry]> {
            decoded
                .entries
                .iter()
                .map(|e| TreeEntry {
                    name: e.filename.to_vec().into_boxed_slice(),
                    kind: if e.mode.is_tree() {
                        EntryKind::Tree
                    } else if e.mode.is_commit() {
                        EntryKind::Gitlink
                    } else if e.mode.is_link() {
                        EntryKind::Symlink
                    } else if e.mode.is_executable() {
                        EntryKind::Executable
                    } else {
                        EntryKind::Blob
                    },
                    id: e.oid.to_owned(),
                })
                .collect()
        };
        // A tree a snapshot of this daemon just wrote is still in memory: a fork of that snapshot
        // reads it from there, not from its loose object (whose first read would also dirty the
        // file's atime, which the fork's fsyncs then wait for).
        let kept = self
            .snapshots
            .as_ref()
            .and_then(|c| c.kept_tree(&id))
            .and_then(|raw| {
                gix::objs::TreeRef::from_bytes(&raw, id.kind())
                    .ok()
                    .map(|t| parsed(&t))
            });
        let entries: Arc<[TreeEntry]> = match kept {
            Some(e) => e,
            None => self.find(|repo| -> io::Result<Arc<[TreeEntry]>> {
                let tree = repo.find_tree(id).map_err(other)?;
                let decoded = tree.decode().map_err(other)?;
                Ok(parsed(&decoded))
            })?,
        };
        self.trees.lock().map_err(other)?.put(id, entries.clone());
        Ok(entries)
    }

    /// Parsed trees in the cache and the bytes they hold (bounded by the cache's budget).
    pub fn tree_cache_usage(&self) -> (usize, usize) {
        self.trees
            .lock()
            .map(|c| (c.lru.len(), c.bytes))
            .unwrap_or((0, 0))
    }

    /// The size of blob `id`, from its header (no content is read for loose or undeltified objects).
    pub fn blob_size(&self, id: ObjectId) -> io::Result<u64> {
        if let Some(s) = self.sizes.get(&id) {
            return Ok(*s);
        }
        let size = self.find(|repo| repo.find_header(id).map(|h| h.size()).map_err(other))?;
        self.sizes.insert(id, size);
        Ok(size)
    }

    /// The content of blob `id`.
    pub fn blob(&self, id: ObjectId) -> io::Result<Vec<u8>> {
        self.find(|repo| repo.find_blob(id).map(|mut b| b.take_data()).map_err(other))
    }

    /// The content of blob `id` as a stream, for blobs too large to hold in memory: gix decodes an
    /// object whole, while `git cat-file blob` streams loose and undeltified packed objects (git
    /// never deltifies objects above `core.bigFileThreshold`). Git runs in the mirror through the
    /// daemon's one hardened git command, so only the daemon's own mirror config is read.
    pub fn blob_stream(&self, id: ObjectId) -> io::Result<BlobStream> {
        let mut dir = &self.path;
        if !self.with_repo(|repo| repo.has_object(id))
            && let Some(fb) = &self.fallback
            && self.with_fallback_repo(|repo| repo.has_object(id)) == Some(true)
        {
            dir = &fb.path;
        }
        let mut child = crate::git::Git::new(Some(dir))
            .into_command()
            .args(["cat-file", "blob"])
            .arg(id.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| other(format!("cannot run git cat-file: {e}")))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| other("git cat-file has no stdout"))?;
        Ok(BlobStream {
            id,
            child: Some(child),
            out,
        })
    }
}

/// The content of one blob, read from a `git cat-file` child ([`ObjectStore::blob_stream`]).
pub struct BlobStream {
    id: ObjectId,
    child: Option<std::process::Child>,
    out: std::process::ChildStdout,
}

impl io::Read for BlobStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.out.read(buf)
    }
}

impl BlobStream {
    /// Waits for git: the stream was complete only if it succeeded.
    pub fn finish(mut self) -> io::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let status = child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(other(format!(
                "git cat-file blob {} failed ({status})",
                self.id
            )))
        }
    }
}

impl Drop for BlobStream {
    fn drop(&mut self) {
        // Abandoned half-way (an error while writing the cache file): no git left running.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tree_cache_tests {
    use super::*;

    fn tree(n: usize, seed: u8) -> Arc<[TreeEntry]> {
        (0..n)
            .map(|i| TreeEntry {
                name: format!("entry-{i:06}").into_bytes().into_boxed_slice(),
                kind: EntryKind::Blob,
                id: ObjectId::from_bytes_or_panic(&[seed; 20]),
            })
            .collect()
    }

    fn id(k: u8) -> ObjectId {
        ObjectId::from_bytes_or_panic(&[k; 20])
    }

    /// Fails if the cache were bounded by its number of trees (16k large trees would all stay) or
    /// evicted anything but the least recently used.
    #[test]
    fn the_tree_cache_is_bounded_by_bytes_least_recently_used_first() {
        let big = TreeCache::cost(&tree(1000, 0));
        let mut c = TreeCache::new(3 * big + big / 2);
        for k in 1..=3 {
            c.put(id(k), tree(1000, k));
        }
        assert_eq!(c.lru.len(), 3);
        assert!(c.get(&id(1)).is_some(), "1 is now the most recently used");
        c.put(id(4), tree(1000, 4));
        assert!(
            c.bytes <= c.budget,
            "{} bytes over a budget of {}",
            c.bytes,
            c.budget
        );
        assert!(c.get(&id(2)).is_none(), "the least recently used went");
        for k in [1, 3, 4] {
            assert!(c.get(&id(k)).is_some(), "tree {k} stays");
        }
        // Many small trees fit where few large ones did; a tree over the whole budget stays alone.
        for k in 10..60 {
            c.put(id(k), tree(10, k));
        }
        assert!(c.lru.len() > 40, "{} small trees", c.lru.len());
        assert!(c.bytes <= c.budget);
        c.put(id(100), tree(5000, 100));
        assert_eq!(c.lru.len(), 1);
        assert_eq!(c.bytes, TreeCache::cost(&tree(5000, 100)));
        // Replacing a tree counts it once.
        c.put(id(100), tree(5000, 100));
        assert_eq!(c.bytes, TreeCache::cost(&tree(5000, 100)));
    }
}
