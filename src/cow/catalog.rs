//! The durable catalog of one workspace's upper layer: every inode that differs from the base and every
//! directory entry that differs from the base tree.
//!
//! Storage is `<upper>/catalog.snap` (the whole state at some moment) plus `<upper>/catalog.log` (one
//! frame per committed batch of [`Record`]s since then). Every record is an absolute "set", so replaying
//! any suffix of the log over a newer state changes nothing: compaction may crash at any point.
//!
//! Ordering (see `docs/crash-safety.md`): a batch is appended to the log with one `write` *before* the
//! in-memory state changes and before the request is answered, so a SIGKILL after the answer loses
//! nothing; a batch that fails to append (ENOSPC) is cut off again and the operation fails unapplied. A
//! torn last frame (power loss) is ignored on load. Data files are written before a record points at
//! them, and removed only after the record that pointed at them is gone.
//!
//! Framing (see `docs/crash-safety.md` "Damaged log"): each batch is `RS len sum JSON LF`, with RS the
//! byte 0x1e (which JSON never holds unescaped), so that one damaged frame costs that batch alone: the
//! replay skips it, finds the next RS and goes on, and reports what the damaged batch concerned (a
//! [`Damage`]). Logs of older versions (one bare JSON line per batch) still replay. The snapshot is
//! written as the same frames (records in chunks, see `snapshot_frames`) and replayed the same way,
//! so damage there costs one frame too; an old snapshot (one JSON document) still loads.
//!
//! This module knows nothing about FUSE or git objects beyond their ids as strings.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Seconds and nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub struct Ts(pub i64, pub u32);

impl Ts {
    pub fn now() -> Ts {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Ts(d.as_secs() as i64, d.subsec_nanos())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

/// Where an inode came from in the base commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRef {
    /// Object id (hex) of the blob, tree, or (for a gitlink) commit.
    pub oid: String,
    /// Path in the base tree (`/`-separated, empty for the root): inode numbers of base children
    /// are derived from it.
    #[serde(with = "bytes_as_string")]
    pub path: Vec<u8>,
    /// A submodule commit, presented as an empty directory.
    #[serde(default)]
    pub gitlink: bool,
}

/// Everything about one inode. An inode with a record is "persisted"; base entries nobody changed
/// have no record and are derived from the base tree on lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeRecord {
    pub ino: u64,
    pub kind: Kind,
    #[serde(default)]
    pub base: Option<BaseRef>,
    /// A regular file whose content lives in `<upper>/data/<ino>`.
    #[serde(default)]
    pub upper: bool,
    /// The target of a symlink created in the workspace.
    #[serde(default, with = "opt_bytes")]
    pub target: Option<Vec<u8>>,
    /// Permission bits including set-id and sticky (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub rdev: u32,
    pub atime: Ts,
    pub mtime: Ts,
    pub ctime: Ts,
    pub nlink: u32,
    /// The directory holding the inode and its name there (for a hardlinked file, the name it was
    /// created or last renamed under). Exact for directories and for files with one link.
    #[serde(default)]
    pub parent: u64,
    #[serde(default, with = "bytes_as_string")]
    pub name: Vec<u8>,
    #[serde(default, with = "xattr_map")]
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The data file's ctime right after copy-up: later ctimes of the data file are real changes.
    #[serde(default)]
    pub copied_ctime: Option<Ts>,
    /// A regular file whose content is an immutable host-wide file (e.g. the shared index of a
    /// base commit) until it is copied up.
    #[serde(default)]
    pub shared: Option<String>,
}

/// One change, as stored in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // records are built one at a time and serialized at once
pub enum Record {
    /// Set (create or replace) an inode's record.
    Inode(InodeRecord),
    /// The inode no longer exists (its overlay, if any, goes with it).
    Drop { ino: u64 },
    /// Set a directory entry: `Some(ino)` links, `None` hides the base entry of that name.
    Entry {
        dir: u64,
        #[serde(with = "bytes_as_string")]
        name: Vec<u8>,
        ino: Option<u64>,
    },
    /// Forget a directory entry: the name is neither linked nor hidden (it follows the base again).
    Unentry {
        dir: u64,
        #[serde(with = "bytes_as_string")]
        name: Vec<u8>,
    },
    /// The next inode number to allocate is at least this.
    NextIno { next: u64 },
    /// The workspace's state changed: its generation is now at least `n`. Batches that change only
    /// octofs's own bookkeeping (e.g. the workspace's record of its last snapshot) carry none.
    Generation { n: u64 },
}

/// The persisted state: what replaying the snapshot and the log yields. The filesystem core keeps its
/// live state in the same shape, with its runtime data beside each record (`I` is then its table of
/// nodes), so that one [`CatalogState::apply`] serves both replay and live commits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogState<I = HashMap<u64, InodeRecord>> {
    pub inodes: I,
    /// Directory overlays: entries that differ from the directory's base tree.
    #[serde(with = "overlay_map")]
    pub dirs: HashMap<u64, BTreeMap<Vec<u8>, Option<u64>>>,
    pub next_ino: u64,
    /// Changes of state since the workspace was created (see [`Record::Generation`]).
    #[serde(default)]
    pub generation: u64,
}

/// Where [`CatalogState::apply`] keeps inode records.
pub trait InodeTable {
    /// [`Record::Inode`]: the inode's record is now `rec`.
    fn set(&mut self, rec: &InodeRecord);
    /// [`Record::Drop`]: the inode has no record any more.
    fn drop_record(&mut self, ino: u64);
}

impl InodeTable for HashMap<u64, InodeRecord> {
    fn set(&mut self, rec: &InodeRecord) {
        self.insert(rec.ino, rec.clone());
    }

    fn drop_record(&mut self, ino: u64) {
        self.remove(&ino);
    }
}

impl<I: InodeTable> CatalogState<I> {
    pub fn apply(&mut self, r: &Record) {
        match r {
            Record::Inode(rec) => self.inodes.set(rec),
            Record::Drop { ino } => {
                self.inodes.drop_record(*ino);
                self.dirs.remove(ino);
            }
            Record::Entry { dir, name, ino } => {
                self.dirs
                    .entry(*dir)
                    .or_default()
                    .insert(name.clone(), *ino);
            }
            Record::Unentry { dir, name } => {
                if let Some(d) = self.dirs.get_mut(dir) {
                    d.remove(name);
                }
            }
            Record::NextIno { next } => self.next_ino = self.next_ino.max(*next),
            Record::Generation { n } => self.generation = self.generation.max(*n),
        }
    }
}

/// The on-disk catalog of one workspace.
pub struct Catalog {
    dir: PathBuf,
    log: File,
    log_len: u64,
    log_batches: u64,
    /// The log has disk blocks allocated (beyond its size) up to here: a reserve so that metadata
    /// changes — above all deleting files — still succeed when the disk is full.
    reserved_to: u64,
    /// Batches found damaged when the log was replayed (they were skipped).
    damage: Vec<Damage>,
}

/// Blocks kept allocated ahead of the log's end, and when to top them up.
const RESERVE: u64 = 256 << 10;
const RESERVE_LOW: u64 = 64 << 10;

const SNAP: &str = "catalog.snap";
const LOG: &str = "catalog.log";
const CLEAN: &str = "clean";

impl Catalog {
    /// Opens (or creates) the catalog in `dir` and returns it with the replayed state and whether the
    /// previous run stopped cleanly. The clean marker is removed: until [`Catalog::close_clean`], a
    /// stop is unclean.
    pub fn open(dir: &Path) -> io::Result<(Catalog, CatalogState, bool)> {
        crate::layout::create_private_dir(dir)?;
        let snap_path = dir.join(SNAP);
        let (mut state, snap_damage) = load_snapshot(&snap_path)?;
        if !snap_damage.is_empty() {
            quarantine(dir, &snap_path, SNAP, &snap_damage)?;
        }
        let log_path = dir.join(LOG);
        let Replayed {
            good_len,
            batches,
            damage,
        } = match File::open(&log_path) {
            Ok(f) => replay(f, &mut state, LOG)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Replayed::default(),
            Err(e) => return Err(e),
        };
        if !damage.is_empty() {
            quarantine(dir, &log_path, LOG, &damage)?;
        }
        let damage = snap_damage.into_iter().chain(damage).collect();
        use std::os::unix::fs::OpenOptionsExt;
        let log = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            .open(&log_path)?;
        if log.metadata()?.len() != good_len {
            log.set_len(good_len)?;
        }
        let was_clean = dir.join(CLEAN).exists();
        if was_clean {
            std::fs::remove_file(dir.join(CLEAN))?;
            File::open(dir)?.sync_all()?;
        }
        let mut catalog = Catalog {
            dir: dir.to_path_buf(),
            log,
            log_len: good_len,
            log_batches: batches,
            reserved_to: good_len,
            damage,
        };
        catalog.top_up_reserve();
        if !catalog.damage.is_empty() {
            catalog.compact(&state)?;
        }
        Ok((catalog, state, was_clean))
    }

    /// The frames that were found damaged (and skipped) when the snapshot and the log were replayed
    /// at open.
    pub fn damage(&self) -> &[Damage] {
        &self.damage
    }

    /// Appends one batch. On failure nothing of it remains in the log and the caller must not apply it.
    pub fn append(&mut self, batch: &[Record]) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let line = frame(batch)?;
        if let Err(e) = self.log.write_all_at(&line, self.log_len) {
            let _ = self.log.set_len(self.log_len);
            return Err(e);
        }
        self.log_len += line.len() as u64;
        self.log_batches += 1;
        self.top_up_reserve();
        Ok(())
    }

    /// Allocates the next stretch of the log ahead of time (best effort: on a full disk the reserve
    /// that is left is what metadata changes use).
    fn top_up_reserve(&mut self) {
        if self.reserved_to >= self.log_len + RESERVE_LOW {
            return;
        }
        if crate::sys::fallocate(&self.log, libc::FALLOC_FL_KEEP_SIZE, self.log_len, RESERVE)
            .is_ok()
        {
            self.reserved_to = self.log_len + RESERVE;
        }
    }

    /// Makes every appended batch durable (fsync of a file or directory in the workspace).
    pub fn sync(&self) -> io::Result<()> {
        self.log.sync_data()
    }

    /// A second descriptor of the log, whose `sync_data` is [`Catalog::sync`] without borrowing the
    /// catalog (so the caller can make appends durable without holding the lock that orders them).
    /// The log is never replaced (compaction truncates it in place), so the descriptor stays valid.
    pub fn sync_handle(&self) -> io::Result<File> {
        self.log.try_clone()
    }

    /// Whether the log has grown enough, relative to the live state, to be worth compacting
    /// (`live_records` is only asked for once the log is long).
    pub fn wants_compaction(&self, live_records: impl FnOnce() -> usize) -> bool {
        self.log_batches > 20_000 && self.log_batches as usize > 4 * live_records().max(1)
    }

    /// Writes `state` as the new snapshot and starts an empty log. Crash-safe at every step: the old
    /// snapshot plus the old log, or the new snapshot plus (a replay-idempotent) old log, or the new
    /// snapshot alone.
    pub fn compact(&mut self, state: &CatalogState) -> io::Result<()> {
        let bytes = snapshot_frames(state)?;
        crate::records::write_atomic(&self.dir.join(SNAP), &bytes)?;
        self.log.set_len(0)?;
        self.log.sync_all()?;
        self.log_len = 0;
        self.log_batches = 0;
        self.reserved_to = 0;
        self.top_up_reserve();
        Ok(())
    }

    /// Compacts and leaves the clean-stop marker.
    pub fn close_clean(&mut self, state: &CatalogState) -> io::Result<()> {
        self.compact(state)?;
        crate::records::write_atomic(&self.dir.join(CLEAN), b"clean\n")
    }
}

/// Start of a frame: ASCII "record separator" (as in RFC 7464); JSON escapes it inside strings.
const RS: u8 = 0x1e;
/// `RS`, the payload length as 8 hex digits, a space, its checksum as 16 hex digits, a space.
const HEADER: usize = 27;
/// Larger frames are refused on append and taken as damage on replay.
const MAX_PAYLOAD: u64 = 1 << 30;

fn checksum(payload: &[u8]) -> u64 {
    let h = blake3::hash(payload);
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

/// One batch as it is appended to the log.
fn frame(batch: &[Record]) -> io::Result<Vec<u8>> {
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

/// Records per snapshot frame: small enough that a damaged frame costs little, large enough that
/// the per-frame header and checksum cost nothing measurable.
const SNAP_CHUNK: usize = 64;

/// The snapshot as a sequence of log frames (see `docs/crash-safety.md` "Damaged log"): inode records
/// and directory entries in chunks of [`SNAP_CHUNK`], each frame led by the counters (`NextIno`,
/// `Generation`), so that no single damaged frame loses them and an empty state is one frame.
fn snapshot_frames(state: &CatalogState) -> io::Result<Vec<u8>> {
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
fn load_snapshot(path: &Path) -> io::Result<(CatalogState, Vec<Damage>)> {
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

/// Keeps a copy of the damaged `file` (named `what`) in `quarantine/` for whoever wants to look, and
/// logs the damage. The catalog is compacted right after, so the damage is reported once and new
/// frames never follow it.
fn quarantine(dir: &Path, file: &Path, what: &str, damage: &[Damage]) -> io::Result<()> {
    let q = dir.join("quarantine");
    std::fs::create_dir_all(&q)?;
    std::fs::copy(file, q.join(format!("{what}.damaged-{}", Ts::now().0)))?;
    for d in damage {
        tracing::warn!("catalog {}: {d}", dir.display());
    }
    Ok(())
}

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
struct Replayed {
    /// The log up to the end of its last good frame: what follows is a torn or damaged tail.
    good_len: u64,
    batches: u64,
    damage: Vec<Damage>,
}

/// Positional reads of the log through a window, so a long log replays in bounded memory.
struct LogReader {
    file: File,
    len: u64,
    start: u64,
    buf: Vec<u8>,
}

const WINDOW: usize = 1 << 20;

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

enum Parsed {
    Good {
        batch: Vec<Record>,
        next: u64,
    },
    /// Not a valid batch; `payload` is where its JSON would be, when the header could be read.
    Bad {
        payload: Option<(u64, usize)>,
    },
}

fn parse_hex(b: &[u8]) -> Option<u64> {
    u64::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}

/// Reads the batch starting at `p`.
fn parse_at(r: &mut LogReader, p: u64) -> io::Result<Parsed> {
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
fn replay(f: File, state: &mut CatalogState, file: &'static str) -> io::Result<Replayed> {
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
fn is_torn(r: &mut LogReader, p: u64, len: u64) -> io::Result<bool> {
    if r.byte(len - 1)? != Some(b'\n') {
        return Ok(true);
    }
    Ok(r.find(p, |b| b == 0)?.is_some())
}

/// What the damaged stretch `p..end` concerned, as far as it can be read.
fn describe(
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

mod bytes_as_string {
    //! Names and paths are bytes; JSON strings hold them when they are UTF-8, arrays otherwise.
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    pub(super) enum Repr {
        S(String),
        B(Vec<u8>),
    }

    pub(super) fn to_repr(v: &[u8]) -> Repr {
        match std::str::from_utf8(v) {
            Ok(s) => Repr::S(s.to_string()),
            Err(_) => Repr::B(v.to_vec()),
        }
    }

    pub(super) fn from_repr(r: Repr) -> Vec<u8> {
        match r {
            Repr::S(s) => s.into_bytes(),
            Repr::B(b) => b,
        }
    }

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        to_repr(v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Ok(from_repr(Repr::deserialize(d)?))
    }
}

mod opt_bytes {
    use super::bytes_as_string::{Repr, from_repr, to_repr};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        v.as_deref().map(to_repr).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Ok(Option::<Repr>::deserialize(d)?.map(from_repr))
    }
}

mod xattr_map {
    use super::bytes_as_string::{Repr, from_repr, to_repr};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<Vec<u8>, Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let v: Vec<(Repr, &Vec<u8>)> = m.iter().map(|(k, v)| (to_repr(k), v)).collect();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, D::Error> {
        let v = Vec::<(Repr, Vec<u8>)>::deserialize(d)?;
        Ok(v.into_iter().map(|(k, v)| (from_repr(k), v)).collect())
    }
}

mod overlay_map {
    use super::bytes_as_string::{Repr, from_repr, to_repr};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::{BTreeMap, HashMap};

    type Map = HashMap<u64, BTreeMap<Vec<u8>, Option<u64>>>;
    /// One directory's overlay as stored: (directory, [(name, inode or hidden)]).
    type Dir = (u64, Vec<(Repr, Option<u64>)>);

    pub fn serialize<S: Serializer>(m: &Map, s: S) -> Result<S::Ok, S::Error> {
        let v: Vec<Dir> = m
            .iter()
            .map(|(d, e)| (*d, e.iter().map(|(n, i)| (to_repr(n), *i)).collect()))
            .collect();
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Map, D::Error> {
        let v = Vec::<Dir>::deserialize(d)?;
        Ok(v.into_iter()
            .map(|(d, e)| (d, e.into_iter().map(|(n, i)| (from_repr(n), i)).collect()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn rec(ino: u64) -> InodeRecord {
        InodeRecord {
            ino,
            kind: Kind::File,
            base: None,
            upper: true,
            target: None,
            mode: 0o644,
            uid: 1,
            gid: 2,
            rdev: 0,
            atime: Ts(1, 2),
            mtime: Ts(3, 4),
            ctime: Ts(5, 6),
            nlink: 1,
            parent: 0,
            name: b"f".to_vec(),
            xattrs: [(b"user.k".to_vec(), vec![0, 255])].into_iter().collect(),
            copied_ctime: None,
            shared: None,
        }
    }

    #[test]
    fn replays_batches_and_survives_a_torn_tail() {
        let d = tempfile::tempdir().unwrap();
        let (mut c, s, clean) = Catalog::open(d.path()).unwrap();
        assert!(!clean);
        assert_eq!(s, CatalogState::default());
        let name = vec![b'a', 0xff, b'b'];
        let batch = vec![
            Record::Inode(rec(7)),
            Record::Entry {
                dir: 1,
                name: name.clone(),
                ino: Some(7),
            },
            Record::NextIno { next: 8 },
        ];
        c.append(&batch).unwrap();
        c.append(&[Record::Entry {
            dir: 1,
            name: b"gone".to_vec(),
            ino: None,
        }])
        .unwrap();
        drop(c);
        // A torn batch at the end (power loss mid-write) is ignored and cut off.
        let mut f = OpenOptions::new()
            .append(true)
            .open(d.path().join(LOG))
            .unwrap();
        f.write_all(b"[{\"op\":\"drop\",\"in").unwrap();
        drop(f);
        let (mut c, s, _) = Catalog::open(d.path()).unwrap();
        assert_eq!(s.inodes[&7], rec(7));
        assert_eq!(s.dirs[&1][&name], Some(7));
        assert_eq!(s.dirs[&1][&b"gone"[..]], None);
        assert_eq!(s.next_ino, 8);
        c.append(&[Record::Drop { ino: 7 }]).unwrap();
        drop(c);
        let (mut c, s, _) = Catalog::open(d.path()).unwrap();
        assert!(!s.inodes.contains_key(&7));
        // Compaction keeps the state and a clean close is seen by the next open.
        c.close_clean(&s).unwrap();
        let (_c, s2, clean) = Catalog::open(d.path()).unwrap();
        assert!(clean);
        assert_eq!(s, s2);
        assert_eq!(std::fs::metadata(d.path().join(LOG)).unwrap().len(), 0);
    }

    #[test]
    fn replaying_an_old_log_over_a_newer_snapshot_changes_nothing() {
        let mut s: CatalogState = CatalogState::default();
        let log = vec![
            Record::Inode(rec(9)),
            Record::Entry {
                dir: 1,
                name: b"x".to_vec(),
                ino: Some(9),
            },
            Record::Unentry {
                dir: 1,
                name: b"x".to_vec(),
            },
            Record::Drop { ino: 9 },
            Record::NextIno { next: 10 },
        ];
        for r in &log {
            s.apply(r);
        }
        let snap = s.clone();
        for r in &log {
            s.apply(r);
        }
        assert_eq!(s, snap);
    }

    /// A log of six batches, each creating file `f<i>` as inode `i`, and the log's bytes.
    fn six_batches(dir: &Path) -> Vec<u8> {
        let (mut c, _, _) = Catalog::open(dir).unwrap();
        for i in 1..=6u64 {
            let mut r = rec(i);
            r.name = format!("f{i}").into_bytes();
            c.append(&[
                Record::Inode(r),
                Record::Entry {
                    dir: 1,
                    name: format!("f{i}").into_bytes(),
                    ino: Some(i),
                },
                Record::NextIno { next: i + 1 },
            ])
            .unwrap();
        }
        drop(c);
        std::fs::read(dir.join(LOG)).unwrap()
    }

    /// Where each frame of `log` starts.
    fn frame_starts(log: &[u8]) -> Vec<usize> {
        log.iter()
            .enumerate()
            .filter(|(_, b)| **b == RS)
            .map(|(i, _)| i)
            .collect()
    }

    #[test]
    fn one_damaged_batch_costs_that_batch_alone_and_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let pristine = six_batches(d.path());
        let starts = frame_starts(&pristine);
        assert_eq!(starts.len(), 6);
        let third = starts[2];
        let payload_end = starts[3] - 1;
        // (byte to flip, whether batch 3 is lost): in its JSON, length, checksum, separator, RS
        // and LF. A hit RS or LF alone costs nothing: the checksum still proves the batch.
        let cases = [
            (third + HEADER + 20, true),
            (third + 3, true),
            (third + 15, true),
            (third + 9, true),
            (third, false),
            (payload_end, false),
        ];
        for (at, lost) in cases {
            let ws = tempfile::tempdir().unwrap();
            let mut log = pristine.clone();
            log[at] ^= 0x04;
            std::fs::write(ws.path().join(LOG), &log).unwrap();
            let (c, s, _) = Catalog::open(ws.path()).unwrap();
            for i in [1u64, 2, 4, 5, 6] {
                assert_eq!(
                    s.inodes[&i].name,
                    format!("f{i}").into_bytes(),
                    "flip at {at}"
                );
                assert_eq!(s.dirs[&1][format!("f{i}").as_bytes()], Some(i));
            }
            assert_eq!(s.next_ino, 7);
            if !lost {
                assert!(s.inodes.contains_key(&3), "flip at {at}");
                assert!(c.damage().is_empty(), "flip at {at}: {:?}", c.damage());
                continue;
            }
            assert!(!s.inodes.contains_key(&3), "flip at {at}");
            assert!(!s.dirs[&1].contains_key(&b"f3"[..]), "flip at {at}");
            let damage = c.damage();
            assert_eq!(damage.len(), 1, "flip at {at}: {damage:?}");
            assert_eq!(damage[0].offset, third as u64);
            assert_eq!(damage[0].len, (starts[3] - third) as u64);
            assert!(damage[0].names.contains(&"f3".to_string()), "{damage:?}");
            assert!(damage[0].to_string().contains("f3"), "{}", damage[0]);
            if at != third + HEADER + 20 {
                assert_eq!(damage[0].inodes, vec![3], "flip at {at}");
            }
            // The damaged log is kept aside and the live log compacted: the damage is reported
            // once, and what was replayed stays.
            let kept: Vec<_> = std::fs::read_dir(ws.path().join("quarantine"))
                .unwrap()
                .flatten()
                .map(|e| std::fs::read(e.path()).unwrap())
                .collect();
            assert_eq!(kept, vec![log.clone()]);
            assert_eq!(std::fs::metadata(ws.path().join(LOG)).unwrap().len(), 0);
            drop(c);
            let (c, s2, _) = Catalog::open(ws.path()).unwrap();
            assert!(c.damage().is_empty());
            assert_eq!(s, s2);
        }
    }

    #[test]
    fn damaged_last_batch_is_reported_but_a_torn_one_is_not() {
        let d = tempfile::tempdir().unwrap();
        let pristine = six_batches(d.path());
        let last = *frame_starts(&pristine).last().unwrap();
        // Complete but damaged: reported.
        let ws = tempfile::tempdir().unwrap();
        let mut log = pristine.clone();
        log[last + HEADER + 5] ^= 0x01;
        std::fs::write(ws.path().join(LOG), &log).unwrap();
        let (c, s, _) = Catalog::open(ws.path()).unwrap();
        assert!(!s.inodes.contains_key(&6));
        assert!(s.inodes.contains_key(&5));
        assert_eq!(c.damage().len(), 1);
        assert!(c.damage()[0].names.contains(&"f6".to_string()));
        // Torn (cut short, or cut short and padded with zeros by the file system): silently cut.
        let cut = last + (pristine.len() - last) / 2;
        let mut zeros = pristine[..cut].to_vec();
        zeros.resize(pristine.len() + 100, 0);
        for log in [
            pristine[..cut].to_vec(),
            pristine[..last + 4].to_vec(),
            zeros,
        ] {
            let ws = tempfile::tempdir().unwrap();
            std::fs::write(ws.path().join(LOG), &log).unwrap();
            let (c, s, _) = Catalog::open(ws.path()).unwrap();
            assert!(c.damage().is_empty(), "{:?}", c.damage());
            assert!(!s.inodes.contains_key(&6));
            assert!(s.inodes.contains_key(&5));
            assert_eq!(
                std::fs::metadata(ws.path().join(LOG)).unwrap().len(),
                last as u64
            );
            assert!(!ws.path().join("quarantine").exists());
        }
    }

    #[test]
    fn logs_of_the_old_format_replay_and_resynchronize() {
        let d = tempfile::tempdir().unwrap();
        let mut log = Vec::new();
        for i in 1..=4u64 {
            let mut line = serde_json::to_vec(&vec![
                Record::Inode(rec(i)),
                Record::Entry {
                    dir: 1,
                    name: format!("old{i}").into_bytes(),
                    ino: Some(i),
                },
            ])
            .unwrap();
            if i == 2 {
                line[3] = b'#';
            }
            line.push(b'\n');
            log.extend(line);
        }
        std::fs::write(d.path().join(LOG), &log).unwrap();
        let (mut c, s, _) = Catalog::open(d.path()).unwrap();
        assert_eq!(s.dirs[&1].len(), 3);
        assert!(!s.inodes.contains_key(&2));
        assert_eq!(c.damage().len(), 1);
        assert!(c.damage()[0].names.contains(&"old2".to_string()));
        // Names holding RS and LF are escaped in the JSON, so they cannot fake a frame.
        let odd = vec![b'a', RS, b'\n', b'b'];
        c.append(&[Record::Entry {
            dir: 1,
            name: odd.clone(),
            ino: None,
        }])
        .unwrap();
        drop(c);
        assert_eq!(
            frame_starts(&std::fs::read(d.path().join(LOG)).unwrap()).len(),
            1
        );
        let (c, s, _) = Catalog::open(d.path()).unwrap();
        assert!(c.damage().is_empty());
        assert_eq!(s.dirs[&1][&odd], None);
        assert_eq!(s.dirs[&1].len(), 4);
    }

    /// A state large enough for several snapshot frames: inodes 2..=200 named `f<i>` in the
    /// overlay of directory 1.
    fn big_state() -> CatalogState {
        let mut s = CatalogState {
            next_ino: 500,
            generation: 9,
            ..Default::default()
        };
        for i in 2..=200u64 {
            let mut r = rec(i);
            r.name = format!("f{i}").into_bytes();
            r.parent = 1;
            s.apply(&Record::Inode(r));
            s.apply(&Record::Entry {
                dir: 1,
                name: format!("f{i}").into_bytes(),
                ino: Some(i),
            });
        }
        s
    }

    #[test]
    fn a_damaged_snapshot_frame_costs_that_frame_alone_and_is_reported() {
        let d = tempfile::tempdir().unwrap();
        let state = big_state();
        let (mut c, _, _) = Catalog::open(d.path()).unwrap();
        c.compact(&state).unwrap();
        drop(c);
        let pristine = std::fs::read(d.path().join(SNAP)).unwrap();
        assert_eq!(pristine[0], RS, "the snapshot is framed");
        let (_, s, _) = Catalog::open(d.path()).unwrap();
        assert_eq!(s, state);
        let starts = frame_starts(&pristine);
        assert!(starts.len() >= 6, "{} frames", starts.len());
        // The first frame holds inode records, the last one directory entries.
        let mut ends = starts[1..].to_vec();
        ends.push(pristine.len());
        for (k, (start, end)) in [
            (starts[0], ends[0]),
            (*starts.last().unwrap(), pristine.len()),
        ]
        .into_iter()
        .enumerate()
        {
            let ws = tempfile::tempdir().unwrap();
            let mut snap = pristine.clone();
            snap[(start + end) / 2] ^= 0x04;
            std::fs::write(ws.path().join(SNAP), &snap).unwrap();
            let (c, s, _) = Catalog::open(ws.path()).unwrap();
            let damage = c.damage().to_vec();
            assert_eq!(damage.len(), 1, "frame {k}: {damage:?}");
            assert_eq!(damage[0].file, SNAP);
            assert_eq!(damage[0].offset, start as u64);
            assert_eq!(damage[0].len, (end - start) as u64);
            assert!(damage[0].to_string().contains("snapshot"), "{}", damage[0]);
            // The counters are in every frame: the damage does not lose them.
            assert_eq!((s.next_ino, s.generation), (500, 9));
            let lost_inodes: Vec<u64> = (2..=200).filter(|i| !s.inodes.contains_key(i)).collect();
            let lost_names: Vec<u64> = (2..=200)
                .filter(|i| !s.dirs[&1].contains_key(format!("f{i}").as_bytes()))
                .collect();
            if k == 0 {
                assert_eq!(lost_inodes.len(), SNAP_CHUNK, "{lost_inodes:?}");
                assert!(lost_names.is_empty());
                for i in &lost_inodes {
                    assert!(damage[0].inodes.contains(i), "{i}: {damage:?}");
                }
            } else {
                assert!(lost_inodes.is_empty());
                assert!(!lost_names.is_empty() && lost_names.len() <= SNAP_CHUNK);
                let f = format!("f{}", lost_names[0]);
                assert!(damage[0].names.contains(&f), "{f}: {damage:?}");
            }
            // Everything else is there, the damaged snapshot is kept aside, and the snapshot is
            // rewritten: the damage is reported once.
            let mut expect = state.clone();
            for i in &lost_inodes {
                expect.inodes.remove(i);
            }
            for i in &lost_names {
                expect
                    .dirs
                    .get_mut(&1)
                    .unwrap()
                    .remove(format!("f{i}").as_bytes());
            }
            assert_eq!(s, expect);
            let kept: Vec<_> = std::fs::read_dir(ws.path().join("quarantine"))
                .unwrap()
                .flatten()
                .map(|e| std::fs::read(e.path()).unwrap())
                .collect();
            assert_eq!(kept, vec![snap.clone()]);
            drop(c);
            let (c, s2, _) = Catalog::open(ws.path()).unwrap();
            assert!(c.damage().is_empty(), "{:?}", c.damage());
            assert_eq!(s2, expect);
        }
        // A hit on the last byte of the snapshot is damage, not a torn tail: the snapshot is
        // written whole.
        let ws = tempfile::tempdir().unwrap();
        let mut snap = pristine.clone();
        let last = snap.len() - 2;
        snap[last] = 0;
        std::fs::write(ws.path().join(SNAP), &snap).unwrap();
        let (c, _, _) = Catalog::open(ws.path()).unwrap();
        assert_eq!(c.damage().len(), 1, "{:?}", c.damage());
        // A hit on the first byte (RS) costs nothing: the checksum proves the frame.
        let ws = tempfile::tempdir().unwrap();
        let mut snap = pristine.clone();
        snap[0] = b'{';
        std::fs::write(ws.path().join(SNAP), &snap).unwrap();
        let (c, s, _) = Catalog::open(ws.path()).unwrap();
        assert!(c.damage().is_empty(), "{:?}", c.damage());
        assert_eq!(s, state);
    }

    #[test]
    fn snapshots_of_the_old_format_load_and_are_rewritten_framed() {
        let d = tempfile::tempdir().unwrap();
        let state = big_state();
        std::fs::write(d.path().join(SNAP), serde_json::to_vec(&state).unwrap()).unwrap();
        let (mut c, s, _) = Catalog::open(d.path()).unwrap();
        assert!(c.damage().is_empty());
        assert_eq!(s, state);
        c.compact(&s).unwrap();
        drop(c);
        assert_eq!(std::fs::read(d.path().join(SNAP)).unwrap()[0], RS);
        let (_, s, _) = Catalog::open(d.path()).unwrap();
        assert_eq!(s, state);
    }
}
