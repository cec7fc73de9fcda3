//! What the catalog stores: inode records, directory-overlay entries and the counters, as the
//! [`Record`]s of a batch, and the [`CatalogState`] that replaying records yields.
//!
//! Pure data and its JSON encoding (names and paths are bytes: JSON strings when they are UTF-8,
//! arrays otherwise; an inode record's fields that hold their default — no base, no target, no
//! extended attributes, ... — are left out, and read back as that default). No I/O here.

use std::collections::{BTreeMap, HashMap};

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

/// An inode's kind: the one table of file kinds, owned by the POSIX record (the same names are
/// stored in the catalog and in a snapshot's record).
pub use crate::git::posix_record::PosixKind as Kind;

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
    #[serde(default, skip_serializing_if = "is_false")]
    pub gitlink: bool,
}

/// Everything about one inode. An inode with a record is "persisted"; base entries nobody changed
/// have no record and are derived from the base tree on lookup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeRecord {
    pub ino: u64,
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseRef>,
    /// A regular file whose content lives in `<upper>/data/<ino>`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub upper: bool,
    /// The target of a symlink created in the workspace.
    #[serde(default, with = "opt_bytes", skip_serializing_if = "Option::is_none")]
    pub target: Option<Vec<u8>>,
    /// Permission bits including set-id and sticky (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
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
    #[serde(
        default,
        with = "xattr_map",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The data file's ctime right after copy-up: later ctimes of the data file are real changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copied_ctime: Option<Ts>,
    /// A regular file whose content is an immutable host-wide file (e.g. the shared index of a
    /// base commit) until it is copied up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<String>,
}

/// Whether a flag is unset: such a field is left out of the encoding (every field that may be
/// left out reads back as its default, so records written before, with every field, load the
/// same).
fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
