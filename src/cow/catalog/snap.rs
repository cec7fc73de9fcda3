//! `catalog.snap`: the whole state as a sequence of frames (written by compaction), and loading it
//! back, including snapshots of the old format (one JSON document).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::SNAP;
use super::frame::{RS, frame};
use super::record::{CatalogState, Record};
use super::replay::{Damage, replay};

/// Records per snapshot frame: small enough that a damaged frame costs little, large enough that
/// the per-frame header and checksum cost nothing measurable.
pub(super) const SNAP_CHUNK: usize = 64;

/// The snapshot as a sequence of log frames (see `docs/crash-safety.md` "Damaged log"): inode records
/// and directory entries in chunks of [`SNAP_CHUNK`], each frame led by the counters (`NextIno`,
/// `Generation`), so that no single damaged frame loses them and an empty state is one frame.
pub(super) fn snapshot_frames(state: &CatalogState) -> io::Result<Vec<u8>> {
    let counters = [
        Record::NextIno {
            next: state.next_ino,
        },
        Record::Generation {
            n: state.generation,
        },
    ];
    let mut chunks: Vec<Vec<Record>> = Vec::new();
    let mut cur: Vec<Record> = counters.to_vec();
    let mut push = |rec: Record, cur: &mut Vec<Record>| {
        cur.push(rec);
        if cur.len() >= SNAP_CHUNK + counters.len() {
            chunks.push(std::mem::replace(cur, counters.to_vec()));
        }
    };
    // Sorted, so that the same state always gives the same bytes.
    let mut inos: Vec<&u64> = state.inodes.keys().collect();
    inos.sort_unstable();
    for ino in inos {
        push(Record::Inode(state.inodes[ino].clone()), &mut cur);
    }
    let mut dirs: Vec<&u64> = state.dirs.keys().collect();
    dirs.sort_unstable();
    for dir in dirs {
        for (name, ino) in &state.dirs[dir] {
            let rec = Record::Entry {
                dir: *dir,
                name: name.clone(),
                ino: *ino,
            };
            push(rec, &mut cur);
        }
    }
    if chunks.is_empty() || cur.len() > counters.len() {
        chunks.push(cur);
    }
    let mut out = Vec::new();
    for c in &chunks {
        out.extend_from_slice(&frame(c)?);
    }
    Ok(out)
}

/// Loads `catalog.snap`: framed (skipping damaged frames, which are returned), or a plain JSON
/// document as written before framing (then whole or not at all; the next compaction rewrites it
/// framed). A missing snapshot is the empty state.
pub(super) fn load_snapshot(path: &Path) -> io::Result<(CatalogState, Vec<Damage>)> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(e),
    };
    let mut first = [0u8; 1];
    if f.read_at(&mut first, 0)? == 1 && first[0] == b'{' {
        let b = std::fs::read(path)?;
        match serde_json::from_slice::<CatalogState>(&b) {
            Ok(s) => return Ok((s, Vec::new())),
            // A framed snapshot whose first byte was hit is read as frames, below.
            Err(e) if !b.contains(&RS) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{SNAP}: {e}"),
                ));
            }
            Err(_) => {}
        }
    }
    let mut state = CatalogState::default();
    let r = replay(f, &mut state, SNAP)?;
    Ok((state, r.damage))
}
