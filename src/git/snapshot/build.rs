//! A view's edits made into a snapshot tree, with every object the tree needs written.
//!
//! Owns the order of the work: ids the view names checked, the changed files saved (on several
//! threads, `parallel`, or here, `file_blobs`), the directories edited (`editor`), the batch of new
//! objects written (`crate::git::pack`) before the tree's id is returned. Must not move a ref.

use super::Caches;
use super::editor::{DirEdit, RawEditor, check_path};
use super::parallel::{blob_threads, read_files};
use super::{ViewEdit, ViewSource};
use crate::git::error::Error;
use crate::git::pack::ObjectBatch;

use gix::ObjectId;
use gix::bstr::{BStr, ByteSlice};
use gix::objs::tree::EntryKind;

/// Writes every object the edits need and returns the edited tree. Edits must be sorted by path.
///
/// `clock`: a reading of the files' clock (seconds, nanoseconds of a ctime) taken before the edits
/// were read. With it, the blob id of a file read now is remembered (in `caches`) when the file
/// last changed before that reading, and a file that has not changed since a snapshot remembered it
/// is not read again: a snapshot reads only the files written since the last one.
///
/// The new objects (the changed files' blobs, the edited trees) are written together when the tree
/// is done: a few as loose objects, more as one pack ([`crate::git::pack`]); files larger than
/// `IN_MEMORY_UP_TO` (`file_blobs`) stream into loose objects as they are read. Every object is
/// in the mirror when this returns (before any ref can name the tree).
///
/// Cost: what the edits name. Each tree on a changed path is read once and written once; the
/// names and object ids checked are those of the edits, not every entry of every tree written
/// (gix's own tree editor checks that every entry of a tree it writes exists: one object lookup,
/// a `stat` of a loose path, per entry, 100,000 of them for a snapshot touching the directories of
/// a 100,000-file tree, whatever changed).
///
/// `caches`: the memory snapshots share (the daemon's one [`Caches`]): the trees written are kept
/// there for the next snapshot, the ids of files read remembered there.
pub fn build_tree(
    repo: &gix::Repository,
    base_tree: ObjectId,
    edits: &[ViewEdit],
    clock: Option<(i64, i64)>,
    caches: &Caches,
) -> Result<ObjectId, Error> {
    build_tree_on(repo, base_tree, edits, clock, caches, blob_threads())
}

/// [`build_tree`] with the changed files' blobs saved on up to `threads` threads (see
/// [`read_files`]); the tree, its objects and their pack entries are the same for any count.
pub(super) fn build_tree_on(
    repo: &gix::Repository,
    base_tree: ObjectId,
    edits: &[ViewEdit],
    clock: Option<(i64, i64)>,
    caches: &Caches,
    threads: usize,
) -> Result<ObjectId, Error> {
    // An id the view names (a tree or object of the base, of the last snapshot) must be in the
    // mirror: a tree naming a missing object would be written, and the ref moved to it.
    let present = |id: ObjectId, path: &BStr| -> Result<ObjectId, Error> {
        if repo.has_object(id) {
            Ok(id)
        } else {
            Err(Error::Invalid(format!(
                "the object {id} at {path} is not in the mirror"
            )))
        }
    };
    present(base_tree, b"/".as_bstr())?;
    let batch = std::cell::RefCell::new(ObjectBatch::new(repo));
    let blob = |source: &ViewSource, path: &BStr| -> Result<ObjectId, Error> {
        Ok(match source {
            ViewSource::Object(id) => present(*id, path)?,
            ViewSource::File(p) => caches.files.blob(repo, &mut batch.borrow_mut(), p, clock)?,
            ViewSource::Bytes(b) => batch.borrow_mut().write(gix::objs::Kind::Blob, b)?,
        })
    };
    let saved = read_files(repo, &batch, edits, clock, &caches.files, threads)?;
    let mut root = DirEdit::root(base_tree);
    for (i, e) in edits.iter().enumerate() {
        let path: &BStr = e.path().as_bstr();
        let leaf = match e {
            ViewEdit::Symlink { .. } => Some(gix::validate::path::component::Mode::Symlink),
            _ => None,
        };
        if !matches!(e, ViewEdit::Remove { .. } | ViewEdit::AddedDir { .. }) {
            check_path(path, leaf)?;
        }
        let op = match e {
            ViewEdit::Remove { .. } => None,
            ViewEdit::AddedDir { .. } => continue,
            ViewEdit::Tree { id, .. } => Some((EntryKind::Tree, present(*id, path)?)),
            ViewEdit::Gitlink { id, .. } => Some((EntryKind::Commit, *id)),
            ViewEdit::File { exec, source, .. } => {
                let kind = if *exec {
                    EntryKind::BlobExecutable
                } else {
                    EntryKind::Blob
                };
                let id = match saved.get(&i) {
                    Some(id) => *id,
                    None => blob(source, path)?,
                };
                Some((kind, id))
            }
            ViewEdit::Symlink { source, .. } => Some((EntryKind::Link, blob(source, path)?)),
        };
        root.apply(path, op)?;
    }
    let ed = RawEditor::new(repo, &batch, &caches.trees);
    let tree = match ed.write_dir(Some(base_tree), &root)? {
        Some(id) => id,
        None => ed.write_raw(Vec::new())?,
    };
    let written = batch.into_inner().finish()?;
    tracing::debug!(objects = written.objects, pack = ?written.pack, "snapshot objects written");
    Ok(tree)
}
