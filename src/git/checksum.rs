//! The trailing checksums of git's files that are not object ids: an index's (and so a shared
//! index's, whose checksum is its name), a pack's and a pack index's. They guard against a torn or
//! corrupt file, not against an attacker choosing colliding content, so they are computed with a
//! fast SHA-1 (the RustCrypto `sha1` crate: SHA-NI on x86_64 where the CPU has it) instead of
//! gix's collision-detecting one, as git itself does since 2.47 (its "unsafe" SHA-1 for
//! checksums). The digest is the same SHA-1: git and gix verify these files as before.
//!
//! Object ids must NOT come here: they stay gix's (`gix::hash::hasher`, collision detection), as
//! does every id a workspace's content decides.

use sha1::Digest as _;

/// SHA-1 without collision detection, fed in any chunks (a clone goes on from the same point).
#[derive(Clone, Default)]
pub struct Sha1(sha1::Sha1);

impl Sha1 {
    pub fn new() -> Self {
        Sha1::default()
    }

    /// Adds `bytes` to what is checksummed.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The SHA-1 of everything added.
    pub fn finish(self) -> gix::ObjectId {
        let mut out = [0u8; 20];
        out.copy_from_slice(&self.0.finalize());
        gix::ObjectId::from(out)
    }
}

/// A checksum of a repository's hash kind being computed over a file's bytes.
pub enum Checksum {
    /// SHA-1: [`Sha1`].
    Fast(Sha1),
    /// Any other hash kind: gix's hasher.
    Other(gix::hash::Hasher),
}

impl Checksum {
    /// A checksum of hash kind `kind` (git's files are checksummed with the repository's hash).
    pub fn new(kind: gix::hash::Kind) -> Self {
        match kind {
            gix::hash::Kind::Sha1 => Checksum::Fast(Sha1::new()),
            #[allow(unreachable_patterns)] // Only while gix is built with SHA-1 alone.
            other => Checksum::Other(gix::hash::hasher(other)),
        }
    }

    /// Adds `bytes` to what is checksummed.
    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Checksum::Fast(h) => h.update(bytes),
            Checksum::Other(h) => h.update(bytes),
        }
    }

    /// The checksum of everything added.
    pub fn finish(self) -> Result<gix::ObjectId, gix::Error> {
        match self {
            Checksum::Fast(h) => Ok(h.finish()),
            Checksum::Other(h) => h.try_finalize(),
        }
    }
}

/// `index` as git's index file, written with `options` (whose `skip_hash` is ignored), ending in
/// its checksum from [`sha1`] instead of the collision-detecting one gix would compute.
pub fn index_file(
    index: &gix::index::File,
    options: gix::index::write::Options,
) -> Result<Vec<u8>, gix::Error> {
    let mut bytes = Vec::new();
    if index.object_hash() != gix::hash::Kind::Sha1 {
        index.write_to(
            &mut bytes,
            gix::index::write::Options {
                skip_hash: false,
                ..options
            },
        )?;
        return Ok(bytes);
    }
    // Written with a null trailer (git's `index.skipHash`), which the checksum then replaces.
    index.write_to(
        &mut bytes,
        gix::index::write::Options {
            skip_hash: true,
            ..options
        },
    )?;
    let body = bytes.len().checked_sub(20).ok_or_else(|| {
        gix::Error::from_error(std::io::Error::other("an index shorter than its checksum"))
    })?;
    let sum = sha1(&bytes[..body]);
    bytes[body..].copy_from_slice(sum.as_bytes());
    Ok(bytes)
}

/// The SHA-1 checksum of `bytes` (what git appends to an index or a pack index).
pub fn sha1(bytes: &[u8]) -> gix::ObjectId {
    let mut h = Sha1::new();
    h.update(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gix's SHA-1 (collision-detecting) of `bytes` fed as `chunks`.
    fn gix_sha1(chunks: &[&[u8]]) -> gix::ObjectId {
        let mut h = gix::hash::hasher(gix::hash::Kind::Sha1);
        for c in chunks {
            h.update(c);
        }
        h.try_finalize().expect("no collision in test data")
    }

    /// Catches a checksum that differs from the SHA-1 git and gix verify these files with: a
    /// wrong digest, lost or reordered bytes across `update` calls (chunks of odd sizes that cross
    /// SHA-1's 64-byte blocks), or the padding of an empty, short or > 1 MiB input.
    #[test]
    fn checksums_are_gix_sha1() {
        let mut big = vec![0u8; (1 << 20) + 12_345];
        let mut x = 0x9e37_79b9_u32;
        for b in big.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *b = x as u8;
        }
        for len in [
            0usize,
            1,
            55,
            56,
            63,
            64,
            65,
            127,
            128,
            1000,
            1 << 20,
            big.len(),
        ] {
            let data = &big[..len];
            let want = gix_sha1(&[data]);
            assert_eq!(sha1(data), want, "one call, {len} bytes");
            for step in [1usize, 3, 63, 64, 65, 4097] {
                if step == 1 && len > 4096 {
                    continue;
                }
                let mut c = Checksum::new(gix::hash::Kind::Sha1);
                for chunk in data.chunks(step) {
                    c.update(chunk);
                }
                assert_eq!(c.finish().unwrap(), want, "{len} bytes in chunks of {step}");
            }
        }
        // Unaligned starts: slices that begin at every offset within a word.
        for off in 1..8 {
            let data = &big[off..off + 70_001];
            let mut c = Checksum::new(gix::hash::Kind::Sha1);
            let (a, b) = data.split_at(33_333);
            c.update(a);
            c.update(b);
            assert_eq!(c.finish().unwrap(), gix_sha1(&[data]), "offset {off}");
        }
        // A known digest: SHA-1 of "abc" (FIPS 180-1).
        assert_eq!(
            sha1(b"abc").to_string(),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }
}
