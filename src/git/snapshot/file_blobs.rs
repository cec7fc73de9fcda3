//! A file on disk saved as a blob, and the blob ids of files saved before (by their stamp).
//!
//! Owns reading a file exactly (a file that shrinks while read fails the write), streaming large
//! files into loose objects, and the rule for when a remembered id may be used. Must not edit a
//! tree or move a ref; small blobs go into the snapshot's batch.

use crate::git::error::{Context, Error};
use crate::git::pack::ObjectBatch;
use std::path::Path;

use gix::ObjectId;

/// What identifies the content of a file on disk without reading it: its device and inode, size,
/// modification and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    pub(super) fn of(m: &std::fs::Metadata) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The blob ids of files the daemon saved (upper-layer data files), by the file's [`Stamp`]: a
/// snapshot does not read, hash and write again a file that has not changed since an earlier
/// snapshot saved it. Held in memory only: after a restart every file is read once more.
///
/// A file's id is remembered only when its change time (read before its content) is earlier than a
/// clock reading taken before the snapshot's view, so any write after the content was read leaves a
/// later change time and a different stamp (the rule git's index uses against "racily clean"
/// entries). The id is used only if the repository has the object. One table per [`Caches`]
/// (keyed by host inode, so the daemon's is shared by every workspace and mirror).
///
/// [`Caches`]: super::Caches
#[derive(Default)]
pub(super) struct FileBlobs {
    known: std::sync::Mutex<std::collections::HashMap<(u64, u64), (Stamp, ObjectId)>>,
}

/// Files remembered at most (about 100 bytes each); past it the memory starts again empty.
const FILE_BLOBS_MAX: usize = 1 << 20;

impl FileBlobs {
    /// The blob of the file at `p`: remembered, or written now (and remembered, see the type).
    pub(super) fn blob(
        &self,
        repo: &gix::Repository,
        batch: &mut ObjectBatch<'_>,
        p: &Path,
        clock: Option<(i64, i64)>,
    ) -> Result<ObjectId, Error> {
        if clock.is_some()
            && let Ok(m) = std::fs::metadata(p)
            && let Some(id) = self.known(&Stamp::of(&m))
            && (batch.contains(&id) || repo.has_object(id))
        {
            return Ok(id);
        }
        let (id, read) = write_file_blob(repo, batch, p)?;
        self.remember(read, id, clock);
        Ok(id)
    }

    /// The id remembered for a file with stamp `s`.
    pub(super) fn known(&self, s: &Stamp) -> Option<ObjectId> {
        let m = self.known.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&(s.dev, s.ino))
            .filter(|(was, _)| was == s)
            .map(|(_, id)| *id)
    }

    /// Remembers `id` for the file whose stamp before it was read is `read`, if it last changed
    /// before `clock`.
    pub(super) fn remember(&self, read: Stamp, id: ObjectId, clock: Option<(i64, i64)>) {
        if let Some(clock) = clock
            && read.ctime < clock
        {
            let mut m = self.known.lock().unwrap_or_else(|e| e.into_inner());
            if m.len() >= FILE_BLOBS_MAX {
                m.clear();
            }
            m.insert((read.dev, read.ino), (read, id));
        }
    }
}

/// Files up to this size are read whole to be saved; larger ones stream.
pub(super) const IN_MEMORY_UP_TO: u64 = 8 << 20;

/// Writes the content of file `p` as a blob: into `batch` when it is at most [`IN_MEMORY_UP_TO`]
/// bytes. gix's `write_blob_stream` reads the whole file into memory first (5 GiB of daemon memory
/// for a 5 GiB file), so a large file streams instead: one pass hashes it (a blob the mirror
/// already has, e.g. from the last snapshot, is not written again), a second one hashes and
/// compresses it into a loose object. Memory stays bounded whatever the size. Also returns the
/// file's stamp as it was before its content was read.
fn write_file_blob(
    repo: &gix::Repository,
    batch: &mut ObjectBatch<'_>,
    p: &Path,
) -> Result<(ObjectId, Stamp), Error> {
    use gix::objs::Write as _;
    use std::io::Read as _;
    let what = || format!("cannot write a blob from {}", p.display());
    let open = || -> Result<(std::fs::File, u64, Stamp), Error> {
        let f = std::fs::File::open(p).context(|| format!("cannot read {}", p.display()))?;
        let m = f
            .metadata()
            .context(|| format!("cannot read {}", p.display()))?;
        Ok((f, m.len(), Stamp::of(&m)))
    };
    // The object's header states its size before the content follows: a file that shrinks while
    // it is read must fail the write, never leave an object whose content disagrees with its header.
    let exact = |f: std::fs::File, size: u64| ExactSize {
        inner: std::io::BufReader::with_capacity(1 << 20, f),
        left: size,
    };
    let (f, size, stamp) = open()?;
    if size <= IN_MEMORY_UP_TO {
        // Read whole into a buffer of its size: no 1 MiB read buffer allocated (and its pages
        // faulted in) for every small file.
        let mut buf = Vec::with_capacity(size as usize);
        ExactSize {
            inner: f,
            left: size,
        }
        .read_to_end(&mut buf)
        .context(|| format!("cannot read {}", p.display()))?;
        return Ok((batch.write(gix::objs::Kind::Blob, &buf)?, stamp));
    }
    let id = gix::objs::compute_stream_hash(
        repo.object_hash(),
        gix::objs::Kind::Blob,
        &mut exact(f, size),
        size,
        &mut gix::utils::progress::Discard,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .context(what)?;
    if batch.contains(&id) || repo.has_object(id) {
        return Ok((id, stamp));
    }
    // Opened again: the stamp is the second open's, taken before the content written is read.
    let (f, size, stamp) = open()?;
    let id = repo
        .objects
        .write_stream(gix::objs::Kind::Blob, size, &mut exact(f, size))
        .context(what)?;
    Ok((id, stamp))
}

/// Reads exactly `left` bytes of `inner`, and fails if it ends sooner.
pub(super) struct ExactSize<R> {
    inner: R,
    left: u64,
}

impl<R> ExactSize<R> {
    /// `left` bytes of `inner`.
    pub(super) fn new(inner: R, left: u64) -> ExactSize<R> {
        ExactSize { inner, left }
    }
}

impl<R: std::io::Read> std::io::Read for ExactSize<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was saved",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::snapshot::{Caches, ViewEdit, ViewSource, build_tree};

    /// A remembered file is not read again while unchanged, and is read again once written, even
    /// with its size and modification time put back (only the change time tells).
    #[test]
    fn a_snapshot_reads_again_only_the_files_written_since() {
        let caches = Caches::default();
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path().join("repo")).unwrap();
        let file = dir.path().join("data");
        std::fs::write(&file, b"aaaa").unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let edits = [ViewEdit::File {
            path: b"f".to_vec(),
            exec: false,
            source: ViewSource::File(file.clone()),
            added: true,
        }];
        let content = |tree: ObjectId| {
            let t = repo.find_tree(tree).unwrap();
            let e = t.lookup_entry_by_path("f").unwrap().unwrap();
            repo.find_object(e.object_id()).unwrap().data.clone()
        };
        let later = Some((i64::MAX, 0));
        let first = build_tree(&repo, empty, &edits, later, &caches).unwrap();
        assert_eq!(content(first), b"aaaa");
        let stamp = Stamp::of(&std::fs::metadata(&file).unwrap());
        let known = |s: &Stamp| {
            caches
                .files
                .known
                .lock()
                .unwrap()
                .get(&(s.dev, s.ino))
                .is_some_and(|(was, _)| was == s)
        };
        assert!(known(&stamp), "remembered: it changed before the clock");
        assert_eq!(
            build_tree(&repo, empty, &edits, later, &caches).unwrap(),
            first
        );

        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, b"bbbb").unwrap();
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_modified(mtime).unwrap();
        drop(f);
        let second = build_tree(&repo, empty, &edits, later, &caches).unwrap();
        assert_eq!(content(second), b"bbbb");

        // Changed at or after the clock: not remembered (a write in the same tick could follow).
        let other = dir.path().join("other");
        std::fs::write(&other, b"cccc").unwrap();
        let edits = [ViewEdit::File {
            path: b"f".to_vec(),
            exec: false,
            source: ViewSource::File(other.clone()),
            added: true,
        }];
        build_tree(&repo, empty, &edits, Some((0, 0)), &caches).unwrap();
        assert!(!known(&Stamp::of(&std::fs::metadata(&other).unwrap())));
    }
}
