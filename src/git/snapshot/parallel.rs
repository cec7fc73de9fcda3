//! The changed files of a snapshot read, hashed and compressed on several threads.
//!
//! Owns the windows of files handed to the worker threads and the order their objects go into the
//! batch (the edits' order, so the result is what one thread makes). Must not write to the mirror
//! itself: objects go into the snapshot's batch, which is written when the tree is done.

use super::file_blobs::{ExactSize, FileBlobs, Stamp};
use super::{ViewEdit, ViewSource};
use crate::git::error::{Context, Error};
use crate::git::pack::{Deflated, Deflater, ObjectBatch};
use std::path::Path;

use gix::ObjectId;

/// From this many changed files to read on, a snapshot reads, hashes and compresses them on
/// several threads ([`read_files`]). Measured through the CLI on 2 vCPUs at load 4–7: 1,000
/// changed files gained (tree step ~200 → ~130 ms), 100 did not (a little slower: a loaded
/// machine's other CPU is busy, and the snapshot waits for the slowest thread).
const PARALLEL_FROM: usize = 128;

/// Files one round of [`read_files`] holds in memory at once (each at most [`PARALLEL_UP_TO`]
/// bytes, whole and compressed: 64 MiB at most).
const PARALLEL_WINDOW: usize = 128;

/// Files larger than this are saved on the snapshot's own thread, as before.
pub(super) const PARALLEL_UP_TO: u64 = 256 << 10;

/// Threads that save a snapshot's changed files: the machine's CPUs, at most 4.
pub(super) fn blob_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// A changed file as a worker thread of [`read_files`] left it.
enum Prepared {
    /// Remembered with this stamp ([`FileBlobs`]): this id, if the mirror or the batch has it.
    Known(ObjectId),
    /// Read (its stamp from before the read), hashed and compressed.
    Read(Deflated, Stamp),
    /// Larger than [`PARALLEL_UP_TO`]: saved on the snapshot's thread.
    Large,
}

/// The blobs of the edits' files (`ViewSource::File`) saved on `threads` threads, by the edit's
/// index, when there are at least [`PARALLEL_FROM`] of them (else nothing: the caller saves
/// each). Bounded: the threads take the files a window of [`PARALLEL_WINDOW`] at a time, and each
/// window's objects go into `batch` in the edits' order before the next is read: the batch gets
/// the same objects, compressed the same, as from one thread (only their order in the pack may
/// differ, when other edits also add blobs). Files the
/// workers leave (large ones, a remembered id the mirror lacks) are saved here, as one thread
/// would. The first error (a file that cannot be read) fails the whole: nothing was written to
/// the mirror yet (the batch is written only when the tree is done).
pub(super) fn read_files(
    repo: &gix::Repository,
    batch: &std::cell::RefCell<ObjectBatch<'_>>,
    edits: &[ViewEdit],
    clock: Option<(i64, i64)>,
    blobs: &FileBlobs,
    threads: usize,
) -> Result<std::collections::HashMap<usize, ObjectId>, Error> {
    let files: Vec<(usize, &Path)> = edits
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            ViewEdit::File {
                source: ViewSource::File(p),
                ..
            } => Some((i, p.as_path())),
            _ => None,
        })
        .collect();
    let mut saved = std::collections::HashMap::new();
    if threads < 2 || files.len() < PARALLEL_FROM {
        return Ok(saved);
    }
    let hash = repo.object_hash();
    let mut deflaters: Vec<Deflater> = (0..threads).map(|_| Deflater::default()).collect();
    for window in files.chunks(PARALLEL_WINDOW) {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let work = |z: &mut Deflater| {
            let mut out = Vec::new();
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((_, p)) = window.get(k) else {
                    return out;
                };
                let r = prepare(blobs, z, hash, p, clock.is_some());
                let failed = r.is_err();
                out.push((k, r));
                if failed {
                    // The snapshot fails: the others stop at their next file.
                    next.store(window.len(), std::sync::atomic::Ordering::Relaxed);
                    return out;
                }
            }
        };
        let (mine, theirs) = deflaters.split_first_mut().expect("threads >= 2");
        let mut results = std::thread::scope(|sc| {
            let handles: Vec<_> = theirs.iter_mut().map(|z| sc.spawn(|| work(z))).collect();
            let mut all = work(mine);
            for h in handles {
                match h.join() {
                    Ok(r) => all.extend(r),
                    Err(_) => {
                        return Err(Error::Invalid(
                            "a thread saving the snapshot's files failed".into(),
                        ));
                    }
                }
            }
            Ok(all)
        })?;
        results.sort_by_key(|(k, _)| *k);
        let mut b = batch.borrow_mut();
        for (k, r) in results {
            let (i, p) = window[k];
            let id = match r? {
                Prepared::Known(id) if b.contains(&id) || repo.has_object(id) => id,
                Prepared::Known(_) | Prepared::Large => blobs.blob(repo, &mut b, p, clock)?,
                Prepared::Read(d, stamp) => {
                    if !b.has(&d.id) {
                        b.put_deflated(&d)?;
                    }
                    blobs.remember(stamp, d.id, clock);
                    d.id
                }
            };
            saved.insert(i, id);
        }
    }
    Ok(saved)
}

/// The work of [`FileBlobs::blob`] that needs no repository, for a worker thread of
/// [`read_files`]: the remembered id (when `remembered` ids may be used), else the file read
/// (at most [`PARALLEL_UP_TO`] bytes), hashed and compressed.
fn prepare(
    blobs: &FileBlobs,
    z: &mut Deflater,
    hash: gix::hash::Kind,
    p: &Path,
    remembered: bool,
) -> Result<Prepared, Error> {
    use std::io::Read as _;
    if remembered
        && let Ok(m) = std::fs::metadata(p)
        && let Some(id) = blobs.known(&Stamp::of(&m))
    {
        return Ok(Prepared::Known(id));
    }
    let cannot = || format!("cannot read {}", p.display());
    let f = std::fs::File::open(p).context(cannot)?;
    let m = f.metadata().context(cannot)?;
    let (size, stamp) = (m.len(), Stamp::of(&m));
    if size > PARALLEL_UP_TO {
        return Ok(Prepared::Large);
    }
    let mut buf = Vec::with_capacity(size as usize);
    ExactSize::new(f, size)
        .read_to_end(&mut buf)
        .context(cannot)?;
    let d = Deflated::of(z, hash, gix::objs::Kind::Blob, buf)?;
    Ok(Prepared::Read(d, stamp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::snapshot::Caches;
    use crate::git::snapshot::build::build_tree_on;
    use gix::bstr::ByteSlice;

    /// `n` files under `dir` as file edits (sorted): sizes from empty to past
    /// [`PARALLEL_UP_TO`], some with the same content, text that compresses.
    fn many_files(dir: &Path, n: usize) -> Vec<ViewEdit> {
        let mut edits = Vec::new();
        for i in 0..n {
            let p = dir.join(format!("data{i}"));
            let body = match i % 7 {
                0 => Vec::new(),
                1 => b"the same content\n".to_vec(),
                5 if i % 70 == 5 => vec![b'x'; PARALLEL_UP_TO as usize + 1 + i],
                _ => format!("file {i}\n").repeat(1 + i * 13 % 900).into_bytes(),
            };
            std::fs::write(&p, body).unwrap();
            edits.push(ViewEdit::File {
                path: format!("d{}/f{i}", i % 5).into_bytes(),
                exec: i % 11 == 0,
                source: ViewSource::File(p),
                added: true,
            });
        }
        edits.push(ViewEdit::Symlink {
            path: b"d1/link".to_vec(),
            source: ViewSource::Bytes(b"f1".to_vec()),
            added: true,
        });
        edits.sort_by(|a, b| a.path().cmp(b.path()));
        edits
    }

    /// The changed files saved on several threads (three windows of them, large files left to
    /// the snapshot's thread, content repeated across files and threads) give the tree one thread
    /// gives, with every object's content the same, a pack `git fsck --strict` accepts, and the
    /// same tree again when the remembered ids are used. Catches: a blob matched to the wrong
    /// edit, an object lost or written twice when threads meet the same content, a pack entry
    /// whose compressed bytes or header disagree with its object.
    #[test]
    fn files_saved_on_several_threads_make_the_tree_one_thread_makes() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let edits = many_files(dir.path(), 300);
        let serial = gix::init_bare(dir.path().join("one")).unwrap();
        let parallel = gix::init_bare(dir.path().join("two")).unwrap();
        let empty = ObjectId::empty_tree(serial.object_hash());
        let a = build_tree_on(&serial, empty, &edits, None, &caches, 1).unwrap();
        let b = build_tree_on(&parallel, empty, &edits, None, &caches, 3).unwrap();
        assert_eq!(a, b);
        let mut blobs = 0;
        for e in &edits {
            let path = e.path().as_bstr();
            let id = |repo: &gix::Repository| {
                let t = repo.find_tree(a).unwrap();
                t.lookup_entry_by_path(path.to_str().unwrap())
                    .unwrap()
                    .unwrap()
                    .object_id()
            };
            let (x, y) = (id(&serial), id(&parallel));
            assert_eq!(x, y, "{path}");
            assert_eq!(
                serial.find_object(x).unwrap().data,
                parallel.find_object(y).unwrap().data,
                "{path}"
            );
            blobs += 1;
        }
        assert_eq!(blobs, 301);
        let fsck = std::process::Command::new("git")
            .args(["fsck", "--strict", "--no-dangling"])
            .current_dir(parallel.git_dir())
            .output()
            .unwrap();
        assert!(fsck.status.success(), "{fsck:?}");
        let packs = std::fs::read_dir(parallel.git_dir().join("objects/pack"))
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension() == Some("pack".as_ref()))
            .count();
        assert_eq!(
            packs, 1,
            "the threads' objects went into the snapshot's one pack"
        );
        // Remembered ids (the files changed before the clock) on the second snapshot.
        let later = Some((i64::MAX, 0));
        let c = build_tree_on(&parallel, empty, &edits, later, &caches, 3).unwrap();
        let d = build_tree_on(&parallel, empty, &edits, later, &caches, 3).unwrap();
        assert_eq!((c, d), (a, a));
    }

    /// A changed file that cannot be read while the others are read on several threads fails the
    /// tree, and nothing is left in the mirror: no pack, no temporary file, no loose object (so
    /// no ref can move to a tree missing a blob). Catches: a worker's error dropped (a tree
    /// without that file, or with a blob that is not in the mirror), a half-written pack left.
    #[test]
    fn a_file_that_cannot_be_read_fails_the_parallel_save_and_writes_nothing() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let edits = many_files(dir.path(), 200);
        std::fs::remove_file(dir.path().join("data150")).unwrap();
        let repo = gix::init_bare(dir.path().join("repo")).unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let e = build_tree_on(&repo, empty, &edits, None, &caches, 2).unwrap_err();
        assert!(e.to_string().contains("data150"), "{e}");
        let mut left = Vec::new();
        let mut stack = vec![repo.git_dir().join("objects")];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d).unwrap() {
                let p = f.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    left.push(p);
                }
            }
        }
        assert!(left.is_empty(), "{left:?}");
    }
}
