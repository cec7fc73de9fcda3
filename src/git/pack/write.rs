//! One pack file written: entries compressed and appended under a temporary name, the count and
//! checksum put in, the version 2 index built, then the pack and its index renamed in, in that
//! order (a pack is visible to git only through its index, so only complete).
//!
//! Owns the temporary files `tmp_pack_octofs_*` and `tmp_idx_octofs_*` it creates and the pack it
//! renames in; must not touch another file of the mirror (the batch decides what goes in, the
//! merge which packs go away).

use crate::git::error::{Context, Error};
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gix::ObjectId;
use gix::objs::Kind;

/// An object hashed and compressed away from its batch (on a worker thread), to be added with
/// [`ObjectBatch::put_deflated`]: its id, whole bytes and the compressed bytes a pack entry holds.
pub struct Deflated {
    pub kind: Kind,
    pub id: ObjectId,
    pub data: Vec<u8>,
    pub(super) deflated: Vec<u8>,
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

/// `crc` continued over `data` (start with 0): the CRC-32 a pack index keeps per entry.
pub(super) fn crc32(crc: u32, data: &[u8]) -> u32 {
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
pub(super) struct PackOut {
    dir: PathBuf,
    tmp: PathBuf,
    pub(super) file: std::io::BufWriter<std::fs::File>,
    pub(super) offset: u64,
    pub(super) entries: Vec<(ObjectId, u64, u32)>,
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
    pub(super) fn create(dir: &Path) -> Result<PackOut, Error> {
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
    pub(super) fn add(&mut self, kind: Kind, id: ObjectId, data: &[u8]) -> Result<(), Error> {
        let z = self.zip.get_or_insert_with(new_compressor);
        deflate(z, data, &mut self.buf).context(|| format!("cannot write {id} into a pack"))?;
        let buf = std::mem::take(&mut self.buf);
        let added = self.add_deflated(kind, id, data.len() as u64, &buf);
        self.buf = buf;
        added
    }

    /// Appends one whole object of `size` bytes, already compressed (`deflated`).
    pub(super) fn add_deflated(
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
    pub(super) fn finish(mut self, hash: gix::hash::Kind) -> Result<PathBuf, Error> {
        let what = || format!("cannot write a pack in {}", self.dir.display());
        let count = u32::try_from(self.entries.len())
            .map_err(|_| Error::Invalid("too many objects for one pack".into()))?;
        self.file.flush().context(what)?;
        let file = self.file.get_ref();
        file.write_all_at(&pack_header(count), 0).context(what)?;
        // The checksum covers the final header: read the pack back (from the page cache).
        let mut h = crate::git::checksum::Checksum::new(hash);
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
    let mut h = crate::git::checksum::Checksum::new(hash);
    h.update(&out);
    let sum = h
        .finish()
        .context(|| "cannot checksum a pack index".to_string())?;
    out.extend_from_slice(sum.as_slice());
    Ok(out)
}

#[cfg(test)]
thread_local! {
    /// Tests: the step of [`PackOut::finish`] at which this thread "dies" (0: never), leaving
    /// every file as it is.
    pub(super) static CRASH_AT: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
    pub(super) static CRASHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
