//! The mirror's small packs merged into one when they no longer grow geometrically (git's
//! `repack --geometric=2` rule), on a thread of its own after a snapshot wrote a pack.
//!
//! Owns only the packs it merges: those with nothing but a `.pack` and an `.idx`, whole objects
//! only, none while a `multi-pack-index` exists; removes them only once the merged pack is in
//! place. Must not touch a ref or any other file of the mirror (besides its own stale temporary
//! files).

use super::write::{PackOut, crc32};
use crate::git::error::{Context, Error};
use std::collections::HashSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use gix::ObjectId;

/// At most this many mergeable packs stay after a merge (the smallest are merged to stay under):
/// a long-lived gix store has a fixed number of index slots (32 or more).
const MERGEABLE_MAX: usize = 8;

/// A merge is running in this process (at most one at a time).
static MERGING: AtomicBool = AtomicBool::new(false);

/// Merges the small packs of `objects` (see [`consolidate`]) on a thread of its own, unless a
/// merge is running already; failures are logged (the packs stay as they were).
pub fn consolidate_in_background(objects: PathBuf, hash: gix::hash::Kind) {
    if MERGING.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("octofs-pack-merge".into())
        .spawn(move || {
            let t = std::time::Instant::now();
            match consolidate(&objects, hash) {
                Ok(Some(m)) => tracing::info!(
                    objects = %objects.display(), packs = m.merged, count = m.objects,
                    ms = t.elapsed().as_millis() as u64, "merged snapshot packs"
                ),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(objects = %objects.display(), "cannot merge snapshot packs: {e}")
                }
            }
            MERGING.store(false, Ordering::Release);
        });
    if spawned.is_err() {
        MERGING.store(false, Ordering::Release);
    }
}

/// What a merge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// Packs merged into one.
    pub merged: usize,
    /// Objects in the new pack.
    pub objects: usize,
    pub pack: PathBuf,
}

/// A pack that may be merged: its path without extension and its size.
struct Candidate {
    stem: PathBuf,
    size: u64,
}

/// Files a pack may have besides `.pack` and `.idx` that make it another tool's (kept, partial
/// clone, bitmaps, reverse index, cruft): such a pack is never merged.
const OTHERS: [&str; 5] = ["keep", "promisor", "bitmap", "rev", "mtimes"];

/// Temporary files of ours older than this are left over from a crash and removed.
const STALE_SECS: u64 = 3600;

/// Merges the small packs of the object directory `objects` into one when they no longer grow
/// geometrically (sorted by size, each at least twice all smaller ones together; git's
/// `repack --geometric=2` rule) or more than [`MERGEABLE_MAX`] of them are left: amortized,
/// every byte is copied O(log n) times, and the mirror keeps O(log n) packs. Only packs with
/// whole objects are merged (a pack with deltas is left alone). The merged pack is complete and
/// in place before the packs it replaces are removed, so every object stays readable throughout.
pub fn consolidate(objects: &Path, hash: gix::hash::Kind) -> Result<Option<Merged>, Error> {
    let dir = objects.join("pack");
    let what = || format!("cannot list {}", dir.display());
    if dir.join("multi-pack-index").exists() {
        return Ok(None);
    }
    let mut names: HashSet<std::ffi::OsString> = HashSet::new();
    for e in std::fs::read_dir(&dir).context(what)? {
        let e = e.context(what)?;
        let name = e.file_name();
        let s = name.to_string_lossy();
        if (s.starts_with("tmp_pack_octofs_") || s.starts_with("tmp_idx_octofs_"))
            && e.metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age.as_secs() > STALE_SECS)
        {
            let _ = std::fs::remove_file(e.path());
        }
        names.insert(name);
    }
    let mut cands: Vec<Candidate> = Vec::new();
    for name in &names {
        let s = name.to_string_lossy();
        let Some(stem) = s
            .strip_prefix("pack-")
            .and_then(|r| r.strip_suffix(".pack"))
        else {
            continue;
        };
        let has = |ext: &str| names.contains(std::ffi::OsStr::new(&format!("pack-{stem}.{ext}")));
        if !has("idx") || OTHERS.iter().any(|o| has(o)) {
            continue;
        }
        let path = dir.join(name);
        let Ok(m) = std::fs::metadata(&path) else {
            continue;
        };
        if refused().contains(&path) {
            continue;
        }
        cands.push(Candidate {
            stem: path.with_extension(""),
            size: m.len(),
        });
    }
    cands.sort_by_key(|c| c.size);
    let upto = merge_count(&cands.iter().map(|c| c.size).collect::<Vec<_>>());
    if upto < 2 {
        return Ok(None);
    }
    let chosen = &cands[..upto];
    let mut out = PackOut::create(&dir)?;
    let mut seen: HashSet<ObjectId> = HashSet::new();
    for c in chosen {
        if !copy_pack(&c.stem, hash, &mut out, &mut seen)? {
            refused().insert(c.stem.with_extension("pack"));
            return Ok(None);
        }
    }
    let objects_n = out.entries.len();
    let pack = out.finish(hash)?;
    let new_stem = pack.with_extension("");
    for c in chosen {
        if c.stem == new_stem {
            continue;
        }
        // As git removes a pack: the data first, the index last.
        let _ = std::fs::remove_file(c.stem.with_extension("pack"));
        let _ = std::fs::remove_file(c.stem.with_extension("idx"));
    }
    Ok(Some(Merged {
        merged: chosen.len(),
        objects: objects_n,
        pack,
    }))
}

/// Packs found to hold deltas (not merged again by this process).
fn refused() -> std::sync::MutexGuard<'static, HashSet<PathBuf>> {
    static SET: std::sync::OnceLock<std::sync::Mutex<HashSet<PathBuf>>> =
        std::sync::OnceLock::new();
    SET.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// How many of the packs of `sizes` (ascending) to merge: every pack up to the last one that is
/// smaller than twice all smaller ones together, and more while over [`MERGEABLE_MAX`] would be
/// left.
pub(super) fn merge_count(sizes: &[u64]) -> usize {
    let mut sum = 0u64;
    let mut upto = 0;
    for (i, s) in sizes.iter().enumerate() {
        if i > 0 && *s < sum.saturating_mul(2) {
            upto = i + 1;
        }
        sum = sum.saturating_add(*s);
    }
    let left = sizes.len() - upto + usize::from(upto > 0);
    if left > MERGEABLE_MAX {
        upto = sizes.len() - MERGEABLE_MAX + 1;
    }
    if upto < 2 { 0 } else { upto }
}

/// Copies every entry of the pack at `stem` (`.pack`, `.idx`) into `out` as it is (its bytes and
/// CRC-32 stay valid: whole objects do not depend on their offset), skipping ids in `seen`.
/// `false` when the pack holds a delta (nothing of it may be copied then). Each entry's CRC-32 is
/// checked against the index.
fn copy_pack(
    stem: &Path,
    hash: gix::hash::Kind,
    out: &mut PackOut,
    seen: &mut HashSet<ObjectId>,
) -> Result<bool, Error> {
    let pack_path = stem.with_extension("pack");
    let what = || format!("cannot merge {}", pack_path.display());
    let idx = gix::odb::pack::index::File::at(stem.with_extension("idx"), hash).context(what)?;
    let mut entries: Vec<(u64, ObjectId, Option<u32>)> = idx
        .iter()
        .map(|e| (e.pack_offset, e.oid, e.crc32))
        .collect();
    entries.sort_by_key(|e| e.0);
    let mut f = std::fs::File::open(&pack_path).context(what)?;
    let len = f.metadata().context(what)?.len();
    let end = len
        .checked_sub(hash.len_in_bytes() as u64)
        .filter(|e| *e >= 12)
        .ok_or_else(|| Error::Invalid(format!("{} is too short", pack_path.display())))?;
    let mut header = [0u8; 12];
    f.read_exact(&mut header).context(what)?;
    if &header[..4] != b"PACK"
        || u32::from_be_bytes([header[8], header[9], header[10], header[11]]) as usize
            != entries.len()
    {
        return Err(Error::Invalid(format!(
            "{} does not match its index",
            pack_path.display()
        )));
    }
    let mut rd = std::io::BufReader::with_capacity(1 << 20, f);
    let mut at = 12u64;
    let mut buf: Vec<u8> = Vec::new();
    for (i, (off, id, crc)) in entries.iter().enumerate() {
        let next = entries.get(i + 1).map_or(end, |e| e.0);
        if *off != at || next <= *off || next > end {
            return Err(Error::Invalid(format!(
                "{} does not match its index",
                pack_path.display()
            )));
        }
        let n = usize::try_from(next - off)
            .map_err(|_| Error::Invalid(format!("{}: an entry too large", pack_path.display())))?;
        buf.resize(n, 0);
        rd.read_exact(&mut buf).context(what)?;
        at = next;
        let ty = (buf[0] >> 4) & 7;
        if !(1..=4).contains(&ty) {
            return Ok(false);
        }
        let sum = crc32(0, &buf);
        if crc.is_some_and(|c| c != sum) {
            return Err(Error::Invalid(format!(
                "{}: the entry of {id} does not match its CRC",
                pack_path.display()
            )));
        }
        if !seen.insert(*id) {
            continue;
        }
        out.file.write_all(&buf).context(what)?;
        out.entries.push((*id, out.offset, sum));
        out.offset += n as u64;
    }
    Ok(true)
}
