//! The durable catalog of one workspace's upper layer: every inode that differs from the base and every
//! directory entry that differs from the base tree.
//!
//! Storage is `<upper>/catalog.snap` (the whole state at some moment) plus `<upper>/catalog.log` (one
//! line per committed batch of [`Record`]s since then). Every record is an absolute "set", so replaying
//! any suffix of the log over a newer state changes nothing: compaction may crash at any point.
//!
//! Ordering (see `docs/crash-safety.md`): a batch is appended to the log with one `write` *before* the
//! in-memory state changes and before the request is answered, so a SIGKILL after the answer loses
//! nothing; a batch that fails to append (ENOSPC) is cut off again and the operation fails unapplied. A
//! torn last line (power loss) is ignored on load. Data files are written before a record points at
//! them, and removed only after the record that pointed at them is gone.
//!
//! This module knows nothing about FUSE or git objects beyond their ids as strings.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead};
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
        let mut state = match std::fs::read(dir.join(SNAP)) {
            Ok(b) => serde_json::from_slice::<CatalogState>(&b)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{SNAP}: {e}")))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => CatalogState::default(),
            Err(e) => return Err(e),
        };
        let log_path = dir.join(LOG);
        let mut good_len = 0u64;
        let mut batches = 0u64;
        if let Ok(f) = File::open(&log_path) {
            let mut reader = io::BufReader::new(f);
            let mut line = Vec::new();
            loop {
                line.clear();
                let n = reader.read_until(b'\n', &mut line)?;
                if n == 0 || line.last() != Some(&b'\n') {
                    break; // end, or a torn last line
                }
                match serde_json::from_slice::<Vec<Record>>(&line) {
                    Ok(batch) => {
                        for r in &batch {
                            state.apply(r);
                        }
                        good_len += n as u64;
                        batches += 1;
                    }
                    Err(e) => {
                        tracing::warn!(
                            "catalog: ignoring a damaged log tail at byte {good_len}: {e}"
                        );
                        break;
                    }
                }
            }
        }
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
        };
        catalog.top_up_reserve();
        Ok((catalog, state, was_clean))
    }

    /// Appends one batch. On failure nothing of it remains in the log and the caller must not apply it.
    pub fn append(&mut self, batch: &[Record]) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut line = serde_json::to_vec(batch).map_err(io::Error::other)?;
        line.push(b'\n');
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

    /// Whether the log has grown enough, relative to the live state, to be worth compacting
    /// (`live_records` is only asked for once the log is long).
    pub fn wants_compaction(&self, live_records: impl FnOnce() -> usize) -> bool {
        self.log_batches > 20_000 && self.log_batches as usize > 4 * live_records().max(1)
    }

    /// Writes `state` as the new snapshot and starts an empty log. Crash-safe at every step: the old
    /// snapshot plus the old log, or the new snapshot plus (a replay-idempotent) old log, or the new
    /// snapshot alone.
    pub fn compact(&mut self, state: &CatalogState) -> io::Result<()> {
        let bytes = serde_json::to_vec(state).map_err(io::Error::other)?;
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
}
