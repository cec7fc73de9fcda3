//! Reading frames back: replaying `catalog.log` (or a framed `catalog.snap`) over a state in bounded
//! memory, skipping damaged frames (resynchronizing at the next RS), telling a torn tail (a frame cut
//! short by a power loss, dropped silently) from damage (reported as a [`Damage`] with the names and
//! inodes it concerned), and replaying logs of the old unframed format.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use super::frame::{HEADER, MAX_PAYLOAD, RS, checksum, parse_hex};
use super::record::{CatalogState, Record};
use super::{LOG, SNAP};

/// A stretch of `catalog.log` or `catalog.snap` that did not replay: the batch (or batches) there
/// were skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// The file: `catalog.log` or `catalog.snap`.
    pub file: &'static str,
    /// Byte offset and length of the damaged stretch in the log.
    pub offset: u64,
    pub len: u64,
    /// Inodes and names the damaged bytes mention, as far as they can still be read.
    pub inodes: Vec<u64>,
    pub names: Vec<String>,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "damaged {} record at bytes {}..{} skipped",
            if self.file == SNAP { "snapshot" } else { "log" },
            self.offset,
            self.offset + self.len
        )?;
        if self.names.is_empty() && self.inodes.is_empty() {
            return f.write_str(" (nothing in it could be read)");
        }
        if !self.names.is_empty() {
            write!(f, "; names {:?}", self.names)?;
        }
        if !self.inodes.is_empty() {
            write!(f, "; inodes {:?}", self.inodes)?;
        }
        Ok(())
    }
}

#[derive(Default)]
pub(super) struct Replayed {
    /// The log up to the end of its last good frame: what follows is a torn or damaged tail.
    pub(super) good_len: u64,
    pub(super) batches: u64,
    pub(super) damage: Vec<Damage>,
}

/// Positional reads of the log through a window, so a long log replays in bounded memory.
pub(super) struct LogReader {
    file: File,
    len: u64,
    start: u64,
    buf: Vec<u8>,
}

pub(super) const WINDOW: usize = 1 << 20;

impl LogReader {
    /// Bytes `pos..pos + n`, or `None` past the end of the log.
    fn get(&mut self, pos: u64, n: usize) -> io::Result<Option<&[u8]>> {
        if pos + n as u64 > self.len {
            return Ok(None);
        }
        let in_window = pos >= self.start && pos + n as u64 <= self.start + self.buf.len() as u64;
        if !in_window {
            let want = n.max(WINDOW).min((self.len - pos) as usize);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, pos)?;
            self.start = pos;
        }
        let at = (pos - self.start) as usize;
        Ok(Some(&self.buf[at..at + n]))
    }

    fn byte(&mut self, pos: u64) -> io::Result<Option<u8>> {
        Ok(self.get(pos, 1)?.map(|b| b[0]))
    }

    /// The first position at or after `from` whose byte satisfies `hit`.
    fn find(&mut self, from: u64, hit: impl Fn(u8) -> bool) -> io::Result<Option<u64>> {
        let mut pos = from;
        while pos < self.len {
            let n = (WINDOW as u64).min(self.len - pos) as usize;
            let Some(chunk) = self.get(pos, n)? else {
                break;
            };
            if let Some(i) = chunk.iter().position(|b| hit(*b)) {
                return Ok(Some(pos + i as u64));
            }
            pos += n as u64;
        }
        Ok(None)
    }

    /// Where the next batch can start after a damaged one at `from`: the next RS, or the start of
    /// a line of the old unframed format.
    fn resync(&mut self, from: u64) -> io::Result<Option<u64>> {
        let mut pos = from;
        loop {
            let Some(q) = self.find(pos, |b| b == RS || b == b'\n')? else {
                return Ok(None);
            };
            if self.byte(q)? == Some(RS) {
                return Ok(Some(q));
            }
            if self.byte(q + 1)? == Some(b'[') {
                return Ok(Some(q + 1));
            }
            pos = q + 1;
        }
    }
}

pub(super) enum Parsed {
    Good {
        batch: Vec<Record>,
        next: u64,
    },
    /// Not a valid batch; `payload` is where its JSON would be, when the header could be read.
    Bad {
        payload: Option<(u64, usize)>,
    },
}

/// Reads the batch starting at `p`.
pub(super) fn parse_at(r: &mut LogReader, p: u64) -> io::Result<Parsed> {
    if r.byte(p)? == Some(b'[') {
        // A line of the old format: the JSON up to the newline.
        let Some(nl) = r.find(p, |b| b == b'\n')? else {
            return Ok(Parsed::Bad { payload: None });
        };
        let n = (nl - p) as usize;
        let Some(line) = r.get(p, n)? else {
            return Ok(Parsed::Bad { payload: None });
        };
        return Ok(match serde_json::from_slice::<Vec<Record>>(line) {
            Ok(batch) => Parsed::Good {
                batch,
                next: nl + 1,
            },
            Err(_) => Parsed::Bad {
                payload: Some((p, n)),
            },
        });
    }
    // The first byte should be RS; a frame whose RS alone was hit still proves itself by its sum.
    let Some(h) = r.get(p, HEADER)? else {
        return Ok(Parsed::Bad { payload: None });
    };
    let (len, sum) = match (parse_hex(&h[1..9]), h[9], parse_hex(&h[10..26]), h[26]) {
        (Some(len), b' ', Some(sum), b' ') if len <= MAX_PAYLOAD => (len, sum),
        _ => return Ok(Parsed::Bad { payload: None }),
    };
    let at = p + HEADER as u64;
    let Some(payload) = r.get(at, len as usize)? else {
        return Ok(Parsed::Bad { payload: None });
    };
    let bad = Parsed::Bad {
        payload: Some((at, len as usize)),
    };
    if checksum(payload) != sum {
        return Ok(bad);
    }
    Ok(match serde_json::from_slice::<Vec<Record>>(payload) {
        // The frame's last byte should be LF; the sum already proved the payload.
        Ok(batch) => Parsed::Good {
            batch,
            next: at + len + 1,
        },
        Err(_) => bad,
    })
}

/// Replays the log (or framed snapshot) `file` in `f` over `state`, skipping damaged batches.
pub(super) fn replay(
    f: File,
    state: &mut CatalogState,
    file: &'static str,
) -> io::Result<Replayed> {
    let len = f.metadata()?.len();
    let mut r = LogReader {
        file: f,
        len,
        start: 0,
        buf: Vec::new(),
    };
    let mut out = Replayed::default();
    let mut p = 0u64;
    while p < len {
        let payload = match parse_at(&mut r, p)? {
            Parsed::Good { batch, next } => {
                for rec in &batch {
                    state.apply(rec);
                }
                out.batches += 1;
                out.good_len = next.min(len);
                p = next;
                continue;
            }
            Parsed::Bad { payload } => payload,
        };
        let (end, tail) = match r.resync(p + 1)? {
            Some(q) => (q, false),
            None => (len, true),
        };
        // The snapshot is written whole (write_atomic): a bad tail there is damage, never torn.
        if tail && file == LOG && is_torn(&mut r, p, len)? {
            // The last batch was being written when the system went down: it was never complete,
            // so no request had its answer; drop it as before.
            tracing::info!("catalog: ignoring a torn log tail at byte {p}");
            break;
        }
        let d = describe(&mut r, p, end, payload, file)?;
        match out.damage.last_mut() {
            Some(prev) if prev.offset + prev.len == p => {
                prev.len += d.len;
                prev.inodes.extend(d.inodes);
                prev.names.extend(d.names);
            }
            _ => out.damage.push(d),
        }
        p = end;
    }
    for d in &mut out.damage {
        d.inodes.sort_unstable();
        d.inodes.dedup();
        d.names.sort();
        d.names.dedup();
    }
    Ok(out)
}

/// Whether the bad tail `p..len` is a batch cut short (power loss: a prefix of a frame, possibly
/// followed by zeros) rather than a complete frame that was damaged later: every complete frame ends
/// with LF and holds no NUL.
pub(super) fn is_torn(r: &mut LogReader, p: u64, len: u64) -> io::Result<bool> {
    if r.byte(len - 1)? != Some(b'\n') {
        return Ok(true);
    }
    Ok(r.find(p, |b| b == 0)?.is_some())
}

/// What the damaged stretch `p..end` concerned, as far as it can be read.
pub(super) fn describe(
    r: &mut LogReader,
    p: u64,
    end: u64,
    payload: Option<(u64, usize)>,
    file: &'static str,
) -> io::Result<Damage> {
    let mut d = Damage {
        file,
        offset: p,
        len: end - p,
        inodes: Vec::new(),
        names: Vec::new(),
    };
    // A damaged checksum leaves JSON that still parses: then the records say exactly what was lost.
    if let Some((at, n)) = payload
        && at + n as u64 <= end
        && let Some(bytes) = r.get(at, n)?
        && let Ok(batch) = serde_json::from_slice::<Vec<Record>>(bytes)
    {
        for rec in &batch {
            let (ino, name) = match rec {
                Record::Inode(i) => (Some(i.ino), Some(&i.name)),
                Record::Drop { ino } => (Some(*ino), None),
                Record::Entry { name, ino, .. } => (*ino, Some(name)),
                Record::Unentry { name, .. } => (None, Some(name)),
                Record::NextIno { .. } | Record::Generation { .. } => (None, None),
            };
            d.inodes.extend(ino);
            // The root's record has no name.
            d.names.extend(
                name.filter(|n| !n.is_empty())
                    .map(|n| String::from_utf8_lossy(n).into_owned()),
            );
        }
        return Ok(d);
    }
    // Otherwise pick out what looks like `"ino":N` and `"name":"…"` (names of directory entries
    // and inodes), reading at most a window of the stretch.
    let n = ((end - p) as usize).min(WINDOW);
    let bytes = r.get(p, n)?.unwrap_or_default().to_vec();
    for (key, number) in [(&b"\"ino\":"[..], true), (&b"\"name\":\""[..], false)] {
        let mut i = 0;
        while let Some(k) = bytes[i..].windows(key.len()).position(|w| w == key) {
            let start = i + k + key.len();
            let rest = &bytes[start..];
            if number {
                let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
                if let Some(v) = std::str::from_utf8(&rest[..digits])
                    .ok()
                    .and_then(|s| s.parse().ok())
                {
                    d.inodes.push(v);
                }
            } else if let Some(q) = rest.iter().position(|b| *b == b'"')
                && q > 0
            {
                // An escaped quote in a name cuts it short; good enough for a report.
                d.names
                    .push(String::from_utf8_lossy(&rest[..q]).into_owned());
            }
            i = start;
        }
    }
    Ok(d)
}
