//! The framing shared by `catalog.log` and `catalog.snap`: each batch of records is
//! `RS len sum JSON LF` (RS the byte 0x1e, `len` 8 hex digits, `sum` the first 64 bits of the JSON's
//! BLAKE3 as 16 hex digits), so one damaged frame costs that batch alone. Encoding only; reading
//! frames back is in `replay`.

use std::io::{self, Write};

use super::record::Record;

/// Start of a frame: ASCII "record separator" (as in RFC 7464); JSON escapes it inside strings.
pub(super) const RS: u8 = 0x1e;
/// `RS`, the payload length as 8 hex digits, a space, its checksum as 16 hex digits, a space.
pub(super) const HEADER: usize = 27;
/// Larger frames are refused on append and taken as damage on replay.
pub(super) const MAX_PAYLOAD: u64 = 1 << 30;

pub(super) fn checksum(payload: &[u8]) -> u64 {
    let h = blake3::hash(payload);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// One batch as it is appended to the log.
pub(super) fn frame(batch: &[Record]) -> io::Result<Vec<u8>> {
    let payload = serde_json::to_vec(batch).map_err(io::Error::other)?;
    if payload.len() as u64 > MAX_PAYLOAD {
        return Err(io::Error::other("a catalog batch of more than 1 GiB"));
    }
    let mut out = Vec::with_capacity(HEADER + payload.len() + 1);
    out.push(RS);
    write!(out, "{:08x} {:016x} ", payload.len(), checksum(&payload))?;
    out.extend_from_slice(&payload);
    out.push(b'\n');
    Ok(out)
}

pub(super) fn parse_hex(b: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}
