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

use crate::git::error::{Context, Error};
use std::collections::HashSet;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gix::ObjectId;
use gix::objs::Kind;

/// Up to this many objects a batch writes loose objects (a pack costs two files and a merge
/// later; a handful of loose objects cost as much and merge never).
pub const LOOSE_UP_TO: usize = 16;

/// Bytes a batch holds in memory before it decides (then everything goes to a pack).
const HELD_BYTES_MAX: usize = 4 << 20;

/// At most this many mergeable packs stay after a merge (the smallest are merged to stay under):
/// a long-lived gix store has a fixed number of index slots (32 or more).
const MERGEABLE_MAX: usize = 8;

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

/// An object hashed and compressed away from its batch (on a worker thread), to be added with
/// [`ObjectBatch::put_deflated`]: its id, whole bytes and the compressed bytes a pack entry holds.
pub struct Deflated {
    pub kind: Kind,
    pub id: ObjectId,
    pub data: Vec<u8>,
    deflated: Vec<u8>,
}

/// A compressor for [`Deflated::of`], reused by one thread between objects.
pub struct Deflater(gix::zlib::stream::deflate::Compress);

impl Default for Deflater {
    fn default() -> Deflater {
        Deflater(new_compressor())
    }
}

impl Deflated {
    /// `data` as an object of `kind`: hashed (`hash`) and compressed as a pack entry's bytes.
    pub fn of(
        z: &mut Deflater,
        hash: gix::hash::Kind,
        kind: Kind,
        data: Vec<u8>,
    ) -> Result<Deflated, Error> {
        let id = gix::objs::compute_hash(hash, kind, &data)
            .context(|| "cannot hash an object".to_string())?;
        let mut deflated = Vec::new();
        deflate(&mut z.0, &data, &mut deflated).context(|| format!("cannot compress {id}"))?;
        Ok(Deflated {
            kind,
            id,
            data,
            deflated,
        })
    }
}

/// The compressor of pack entries: zlib level 1 (git's default is 6; a snapshot's pack is
/// written while the agent waits).
fn new_compressor() -> gix::zlib::stream::deflate::Compress {
    gix::zlib::stream::deflate::Compress::new(gix::zlib::Compression::BEST_SPEED)
}

/// The mirror's object directory.
fn objects_dir(repo: &gix::Repository) -> PathBuf {
    repo.common_dir().join("objects")
}

/// `crc` continued over `data` (start with 0): the CRC-32 a pack index keeps per entry.
fn crc32(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// The pack type of a whole object.
fn type_id(kind: Kind) -> u8 {
    match kind {
        Kind::Commit => 1,
        Kind::Tree => 2,
        Kind::Blob => 3,
        Kind::Tag => 4,
    }
}

/// A pack entry's header: type and size.
fn entry_header(kind: Kind, size: u64, out: &mut Vec<u8>) {
    let mut size = size;
    let mut c = (type_id(kind) << 4) | (size as u8 & 0x0f);
    size >>= 4;
    while size != 0 {
        out.push(c | 0x80);
        c = size as u8 & 0x7f;
        size >>= 7;
    }
    out.push(c);
}

/// `input` compressed (zlib) into `out`, with a compressor reused between objects.
fn deflate(
    z: &mut gix::zlib::stream::deflate::Compress,
    mut input: &[u8],
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    use gix::zlib::Status;
    use gix::zlib::stream::deflate::FlushCompress;
    z.reset();
    out.clear();
    out.reserve(input.len() / 2 + 64);
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.capacity().max(4096));
        }
        let len = out.len();
        out.resize(out.capacity(), 0);
        let (tin, tout) = (z.total_in(), z.total_out());
        let status = z
            .compress(input, &mut out[len..], FlushCompress::Finish)
            .map_err(std::io::Error::other);
        let wrote = (z.total_out() - tout) as usize;
        let took = (z.total_in() - tin) as usize;
        out.truncate(len + wrote);
        match status? {
            Status::StreamEnd => return Ok(()),
            Status::Ok | Status::BufError => {
                input = &input[took..];
                if wrote == 0 && took == 0 && out.capacity() - out.len() >= 64 {
                    return Err(std::io::Error::other("the compressor made no progress"));
                }
            }
        }
    }
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

/// A new file in `dir` named `<prefix><pid>_<n>`, created exclusively, read-only for everyone
/// once closed (as git's pack files are).
fn create_tmp(dir: &Path, prefix: &str) -> std::io::Result<(std::fs::File, PathBuf)> {
    loop {
        let n = TMP_SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{prefix}{}_{n}", std::process::id()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&path)
        {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// A pack being written under a temporary name (removed if it is dropped unfinished).
struct PackOut {
    dir: PathBuf,
    tmp: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    offset: u64,
    entries: Vec<(ObjectId, u64, u32)>,
    zip: Option<gix::zlib::stream::deflate::Compress>,
    buf: Vec<u8>,
    head: Vec<u8>,
    done: bool,
}

/// The pack header: signature, version 2, object count.
fn pack_header(count: u32) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[..4].copy_from_slice(b"PACK");
    h[4..8].copy_from_slice(&2u32.to_be_bytes());
    h[8..].copy_from_slice(&count.to_be_bytes());
    h
}

impl PackOut {
    fn create(dir: &Path) -> Result<PackOut, Error> {
        let what = || format!("cannot create a pack in {}", dir.display());
        let (f, tmp) = create_tmp(dir, "tmp_pack_octofs_").context(what)?;
        let mut out = PackOut {
            dir: dir.to_path_buf(),
            tmp,
            file: std::io::BufWriter::with_capacity(256 << 10, f),
            offset: 12,
            entries: Vec::new(),
            zip: None,
            buf: Vec::new(),
            head: Vec::new(),
            done: false,
        };
        // The count is put in at the end.
        out.file.write_all(&pack_header(0)).context(what)?;
        Ok(out)
    }

    /// Appends one whole object.
    fn add(&mut self, kind: Kind, id: ObjectId, data: &[u8]) -> Result<(), Error> {
        let z = self.zip.get_or_insert_with(new_compressor);
        deflate(z, data, &mut self.buf).context(|| format!("cannot write {id} into a pack"))?;
        let buf = std::mem::take(&mut self.buf);
        let added = self.add_deflated(kind, id, data.len() as u64, &buf);
        self.buf = buf;
        added
    }

    /// Appends one whole object of `size` bytes, already compressed (`deflated`).
    fn add_deflated(
        &mut self,
        kind: Kind,
        id: ObjectId,
        size: u64,
        deflated: &[u8],
    ) -> Result<(), Error> {
        let what = || format!("cannot write {id} into a pack");
        self.head.clear();
        entry_header(kind, size, &mut self.head);
        let crc = crc32(crc32(0, &self.head), deflated);
        self.file.write_all(&self.head).context(what)?;
        self.file.write_all(deflated).context(what)?;
        self.entries.push((id, self.offset, crc));
        self.offset += (self.head.len() + deflated.len()) as u64;
        Ok(())
    }

    /// Completes the pack (count, checksum, index) and renames it, then its index, in; the
    /// pack's path.
    fn finish(mut self, hash: gix::hash::Kind) -> Result<PathBuf, Error> {
        let what = || format!("cannot write a pack in {}", self.dir.display());
        let count = u32::try_from(self.entries.len())
            .map_err(|_| Error::Invalid("too many objects for one pack".into()))?;
        self.file.flush().context(what)?;
        let file = self.file.get_ref();
        file.write_all_at(&pack_header(count), 0).context(what)?;
        // The checksum covers the final header: read the pack back (from the page cache).
        let mut h = super::checksum::Checksum::new(hash);
        let mut buf = vec![0u8; (1 << 20).min(self.offset as usize)];
        let mut at = 0u64;
        while at < self.offset {
            let want = buf.len().min((self.offset - at) as usize);
            let n = file.read_at(&mut buf[..want], at).context(what)?;
            if n == 0 {
                return Err(Error::Invalid(format!(
                    "the pack {} ended early while it was read back",
                    self.tmp.display()
                )));
            }
            h.update(&buf[..n]);
            at += n as u64;
        }
        let sum = h.finish().context(what)?;
        file.write_all_at(sum.as_slice(), self.offset)
            .context(what)?;
        crash_point(1)?;
        let entries = std::mem::take(&mut self.entries);
        let idx = index_bytes(entries, &sum, hash)?;
        let (ifile, itmp) = create_tmp(&self.dir, "tmp_idx_octofs_").context(what)?;
        let placed = self.place(ifile, &idx, &itmp, &sum);
        if placed.is_err() && !crash_stopped() {
            let _ = std::fs::remove_file(&itmp);
        }
        placed
    }

    /// Writes the index into `ifile` (at `itmp`), then renames the pack in, then the index.
    fn place(
        &mut self,
        mut ifile: std::fs::File,
        idx: &[u8],
        itmp: &Path,
        sum: &gix::oid,
    ) -> Result<PathBuf, Error> {
        let what = || format!("cannot write a pack in {}", self.dir.display());
        ifile.write_all(idx).context(what)?;
        drop(ifile);
        crash_point(2)?;
        let name = self.dir.join(format!("pack-{}", sum.to_hex()));
        let pack = name.with_extension("pack");
        std::fs::rename(&self.tmp, &pack).context(what)?;
        self.done = true;
        crash_point(3)?;
        std::fs::rename(itmp, name.with_extension("idx")).context(what)?;
        Ok(pack)
    }
}

impl Drop for PackOut {
    fn drop(&mut self) {
        if !self.done && !crash_stopped() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A version 2 pack index of `entries` (id, offset, CRC-32) for the pack whose checksum is
/// `pack_sum`: fan-out, sorted ids, CRCs, offsets (large ones in a second table), checksums.
fn index_bytes(
    mut entries: Vec<(ObjectId, u64, u32)>,
    pack_sum: &gix::oid,
    hash: gix::hash::Kind,
) -> Result<Vec<u8>, Error> {
    entries.sort_by_key(|e| e.0);
    if let Some(w) = entries.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(Error::Invalid(format!(
            "the object {} is twice in one pack",
            w[0].0
        )));
    }
    let n = entries.len();
    let mut out = Vec::with_capacity(8 + 1024 + n * (hash.len_in_bytes() + 8) + 64);
    out.extend_from_slice(b"\xfftOc");
    out.extend_from_slice(&2u32.to_be_bytes());
    let mut fan = [0u32; 256];
    for (id, ..) in &entries {
        fan[usize::from(id.as_slice()[0])] += 1;
    }
    let mut total = 0u32;
    for f in fan {
        total += f;
        out.extend_from_slice(&total.to_be_bytes());
    }
    for (id, ..) in &entries {
        out.extend_from_slice(id.as_slice());
    }
    for (_, _, crc) in &entries {
        out.extend_from_slice(&crc.to_be_bytes());
    }
    let mut large: Vec<u64> = Vec::new();
    for (_, off, _) in &entries {
        let v = if *off > 0x7fff_ffff {
            large.push(*off);
            0x8000_0000 | (large.len() as u32 - 1)
        } else {
            *off as u32
        };
        out.extend_from_slice(&v.to_be_bytes());
    }
    for off in large {
        out.extend_from_slice(&off.to_be_bytes());
    }
    out.extend_from_slice(pack_sum.as_bytes());
    let mut h = super::checksum::Checksum::new(hash);
    h.update(&out);
    let sum = h
        .finish()
        .context(|| "cannot checksum a pack index".to_string())?;
    out.extend_from_slice(sum.as_slice());
    Ok(out)
}

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
fn merge_count(sizes: &[u64]) -> usize {
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

#[cfg(test)]
thread_local! {
    /// Tests: the step of [`PackOut::finish`] at which this thread "dies" (0: never), leaving
    /// every file as it is.
    static CRASH_AT: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
    static CRASHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn crash_point(step: u8) -> Result<(), Error> {
    if CRASH_AT.with(|c| c.get()) == step {
        CRASHED.with(|c| c.set(true));
        return Err(Error::Invalid(format!("crashed at step {step}")));
    }
    Ok(())
}

#[cfg(test)]
fn crash_stopped() -> bool {
    CRASHED.with(|c| c.get())
}

#[cfg(not(test))]
fn crash_point(_step: u8) -> Result<(), Error> {
    Ok(())
}

#[cfg(not(test))]
fn crash_stopped() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

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
