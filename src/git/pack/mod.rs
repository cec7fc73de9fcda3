//! The objects one snapshot adds to a mirror, written together: a few as loose objects, more as
//! one pack (`objects/pack/pack-<hash>.pack` and its `.idx`, version 2, every entry whole: no
//! deltas), and the mirror's small packs merged into one now and then so they do not pile up.
//!
//! Owns only the files it creates in the mirror's `objects/pack` (its temporary `tmp_pack_octofs_*`
//! and `tmp_idx_octofs_*` files, the packs it writes) and, when merging, the packs it merges: those
//! with nothing but a `.pack` and an `.idx` (no `.keep`, `.promisor`, `.rev`, `.bitmap`,
//! `.mtimes`), whole objects only, and none while a `multi-pack-index` exists. Never a ref, never
//! another file of the mirror.
//!
//! Crash rule (the one loose objects follow): a pack becomes visible only complete. Its bytes,
//! header count and trailing checksum are written under a temporary name, then it is renamed to
//! its final name, then its index (also complete under a temporary name) is renamed in; git and
//! gix see a pack only through its index. The batch's objects are visible once
//! [`ObjectBatch::finish`] returns, before any caller writes a ref naming them. Like loose
//! objects (and like git's own commits by default), nothing is synced: a SIGKILL of the daemon
//! leaves the old or the new state, a power loss may lose what the kernel had not written.
//!
//! Memory: a batch holds its first few objects (at most [`LOOSE_UP_TO`] objects and
//! [`HELD_BYTES_MAX`] bytes) before it decides loose or pack; after that each object is
//! compressed into the pack file as it comes. Files larger than the snapshot's in-memory limit
//! never come here (they stream into loose objects).
//!
//! This file owns the batch (loose or pack, decided by its size); the rooms:
//! - `write`: one pack file written under a temporary name and renamed in complete, with its
//!   index, and objects compressed away from their batch (`Deflated`);
//! - `merge`: the mirror's small packs merged into one.

mod merge;
mod write;

pub use merge::{Merged, consolidate, consolidate_in_background};
pub use write::{Deflated, Deflater};

use crate::git::error::{Context, Error};
use std::collections::HashSet;
use std::path::PathBuf;

use gix::ObjectId;
use gix::objs::Kind;
use write::PackOut;

/// Up to this many objects a batch writes loose objects (a pack costs two files and a merge
/// later; a handful of loose objects cost as much and merge never).
pub const LOOSE_UP_TO: usize = 16;

/// Bytes a batch holds in memory before it decides (then everything goes to a pack).
const HELD_BYTES_MAX: usize = 4 << 20;

/// What one batch wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Written {
    /// Objects written (not counting those the mirror or the batch had).
    pub objects: usize,
    /// The pack, when the batch wrote one.
    pub pack: Option<PathBuf>,
}

/// The objects of one snapshot, written at [`ObjectBatch::finish`] as loose objects (few) or as one
/// pack (many). Until then they are not in the mirror: [`ObjectBatch::contains`] says which ids it
/// holds.
pub struct ObjectBatch<'r> {
    repo: &'r gix::Repository,
    ids: HashSet<ObjectId>,
    held: Vec<(Kind, ObjectId, Vec<u8>)>,
    held_bytes: usize,
    pack: Option<PackOut>,
}

impl<'r> ObjectBatch<'r> {
    pub fn new(repo: &'r gix::Repository) -> ObjectBatch<'r> {
        ObjectBatch {
            repo,
            ids: HashSet::new(),
            held: Vec::new(),
            held_bytes: 0,
            pack: None,
        }
    }

    /// Whether the batch holds `id` (written at `finish`).
    pub fn contains(&self, id: &gix::oid) -> bool {
        self.ids.contains(id)
    }

    /// Whether the mirror (without looking for new packs) or the batch has `id`.
    pub fn has(&self, id: &gix::oid) -> bool {
        self.contains(id) || self.repo.objects.exists_without_refresh(id)
    }

    /// Adds an object (unless the mirror or the batch has it); its id.
    pub fn write(&mut self, kind: Kind, data: &[u8]) -> Result<ObjectId, Error> {
        let id = gix::objs::compute_hash(self.repo.object_hash(), kind, data)
            .context(|| "cannot hash an object".to_string())?;
        if !self.has(&id) {
            self.put(kind, id, data)?;
        }
        Ok(id)
    }

    /// Adds an object whose id the caller computed (nothing if the batch holds it already).
    pub fn put(&mut self, kind: Kind, id: ObjectId, data: &[u8]) -> Result<(), Error> {
        if !self.ids.insert(id) {
            return Ok(());
        }
        if let Some(p) = self.pack.as_mut() {
            return p.add(kind, id, data);
        }
        self.held.push((kind, id, data.to_vec()));
        self.held_bytes += data.len();
        if self.held.len() > LOOSE_UP_TO || self.held_bytes > HELD_BYTES_MAX {
            let mut p = PackOut::create(&objects_dir(self.repo).join("pack"))?;
            for (kind, id, data) in self.held.drain(..) {
                p.add(kind, id, &data)?;
            }
            self.held_bytes = 0;
            self.pack = Some(p);
        }
        Ok(())
    }

    /// Adds an object prepared on another thread ([`Deflated::of`]): its compressed bytes go into
    /// the pack as they are (the same bytes [`Self::put`] would write); while the batch still
    /// holds its first objects the whole bytes are kept instead. Nothing if the batch holds it.
    pub fn put_deflated(&mut self, d: &Deflated) -> Result<(), Error> {
        if self.pack.is_none() || self.ids.contains(&d.id) {
            return self.put(d.kind, d.id, &d.data);
        }
        self.ids.insert(d.id);
        if let Some(p) = self.pack.as_mut() {
            p.add_deflated(d.kind, d.id, d.data.len() as u64, &d.deflated)?;
        }
        Ok(())
    }

    /// Writes the batch into the mirror: loose objects, or the pack renamed in whole. Its objects
    /// are visible to git and to gix (a handle finds a new pack at its next miss) when it returns.
    pub fn finish(self) -> Result<Written, Error> {
        use gix::objs::Write as _;
        let objects = self.ids.len();
        if let Some(p) = self.pack {
            let dir = objects_dir(self.repo);
            let pack = p.finish(self.repo.object_hash())?;
            consolidate_in_background(dir, self.repo.object_hash());
            return Ok(Written {
                objects,
                pack: Some(pack),
            });
        }
        for (kind, id, data) in &self.held {
            self.repo
                .objects
                .write_buf_with_known_id(*kind, data, *id)
                .context(|| format!("cannot write the object {id}"))?;
        }
        Ok(Written {
            objects,
            pack: None,
        })
    }
}

/// The mirror's object directory.
fn objects_dir(repo: &gix::Repository) -> PathBuf {
    repo.common_dir().join("objects")
}

#[cfg(test)]
mod tests {
    use super::merge::merge_count;
    use super::write::{CRASH_AT, CRASHED, PackOut, crc32};
    use super::*;
    use std::path::Path;

    fn git(dir: &Path, args: &[&str]) -> std::process::Output {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap()
    }

    fn packs(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.join("objects/pack"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A batch of many objects becomes one pack git verifies (`verify-pack` checks every CRC,
    /// offset and both checksums) and reads back byte for byte; a few objects stay loose; the
    /// CRC is the standard one.
    #[test]
    fn a_batch_is_one_pack_git_reads_or_a_few_loose_objects() {
        assert_eq!(crc32(0, b"123456789"), 0xcbf4_3926);
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let mut b = ObjectBatch::new(&repo);
        let mut ids = Vec::new();
        for i in 0..200 {
            let data = format!("object {i}\n").repeat(i * 7 + 1).into_bytes();
            ids.push((b.write(Kind::Blob, &data).unwrap(), data));
        }
        let again = b.write(Kind::Blob, &ids[3].1).unwrap();
        assert_eq!(again, ids[3].0);
        let w = b.finish().unwrap();
        assert_eq!(w.objects, 200);
        let pack = w.pack.expect("a pack");
        let v = git(
            dir.path(),
            &[
                "verify-pack",
                "-v",
                pack.with_extension("idx").to_str().unwrap(),
            ],
        );
        assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
        for (id, data) in &ids {
            let out = git(dir.path(), &["cat-file", "blob", &id.to_string()]);
            assert!(out.status.success());
            assert_eq!(&out.stdout, data);
            assert_eq!(&repo.find_object(*id).unwrap().data, data);
        }
        let mut b = ObjectBatch::new(&repo);
        let small = b.write(Kind::Blob, b"just one\n").unwrap();
        assert!(b.contains(&small) && !repo.has_object(small));
        assert_eq!(b.finish().unwrap().pack, None);
        assert!(repo.has_object(small));
        assert_eq!(packs(dir.path()).len(), 2, "{:?}", packs(dir.path()));
    }

    /// A crash (the thread stops, every file left as it is) at each step of writing a pack never
    /// leaves a pack git or gix can see that is incomplete: before the index is renamed in, none
    /// of the batch's objects is visible (so no ref can have been written to them, the ref is
    /// written after `finish`) and `git fsck --strict` is clean; after, all are. Fails if the pack
    /// or its index were renamed in before being complete (a visible pack failing fsck) or the
    /// index before the pack.
    #[test]
    fn a_crash_while_a_pack_is_written_never_shows_an_incomplete_pack() {
        for step in 1..=3u8 {
            let dir = tempfile::tempdir().unwrap();
            let repo = gix::init_bare(dir.path()).unwrap();
            let mut b = ObjectBatch::new(&repo);
            let ids: Vec<ObjectId> = (0..50)
                .map(|i| {
                    b.write(Kind::Blob, format!("crash {step} {i}\n").as_bytes())
                        .unwrap()
                })
                .collect();
            CRASH_AT.with(|c| c.set(step));
            CRASHED.with(|c| c.set(false));
            assert!(b.finish().is_err(), "step {step}");
            CRASH_AT.with(|c| c.set(0));
            CRASHED.with(|c| c.set(false));
            let fresh = gix::open(dir.path()).unwrap();
            for id in &ids {
                assert!(
                    !fresh.has_object(*id),
                    "step {step}: {id} visible before the index"
                );
            }
            for name in packs(dir.path()) {
                if let Some(stem) = name.strip_suffix(".idx") {
                    panic!("step {step}: an index {stem} is in place");
                }
            }
            let f = git(dir.path(), &["fsck", "--strict"]);
            assert!(
                f.status.success(),
                "step {step}: {}",
                String::from_utf8_lossy(&f.stderr)
            );
        }
    }

    /// Packs that stopped growing geometrically are merged into one that git verifies, holding
    /// every object once; a pack with deltas (git's own) is never merged; every object stays
    /// readable through a gix handle that had the old packs loaded.
    #[test]
    fn small_packs_merge_into_one_and_stay_readable() {
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let mut all = Vec::new();
        for round in 0..4 {
            let mut out = PackOut::create(&dir.path().join("objects/pack")).unwrap();
            for i in 0..40 {
                let data = format!("round {round} object {i}\n").into_bytes();
                let id = gix::objs::compute_hash(repo.object_hash(), Kind::Blob, &data).unwrap();
                out.add(Kind::Blob, id, &data).unwrap();
                all.push((id, data));
            }
            // One object in several packs: merged once.
            if round > 0 {
                let (id, data) = all[0].clone();
                out.add(Kind::Blob, id, &data).unwrap();
            }
            out.finish(repo.object_hash()).unwrap();
        }
        for (id, data) in &all[..50] {
            assert_eq!(&repo.find_object(*id).unwrap().data, data);
        }
        let m = consolidate(&dir.path().join("objects"), repo.object_hash())
            .unwrap()
            .expect("merged");
        assert_eq!((m.merged, m.objects), (4, 160));
        assert_eq!(packs(dir.path()).len(), 2, "{:?}", packs(dir.path()));
        let v = git(
            dir.path(),
            &[
                "verify-pack",
                m.pack.with_extension("idx").to_str().unwrap(),
            ],
        );
        assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
        for (id, data) in &all {
            assert_eq!(&repo.find_object(*id).unwrap().data, data);
        }
        let f = git(dir.path(), &["fsck", "--strict"]);
        assert!(f.status.success(), "{}", String::from_utf8_lossy(&f.stderr));
        assert_eq!(merge_count(&[10, 100, 1000]), 0);
        assert_eq!(merge_count(&[10, 10, 1000]), 2);
        assert_eq!(merge_count(&[10, 10, 30, 1000]), 3);
        assert_eq!(
            merge_count(&[1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144]),
            3
        );
    }
}
