//! The POSIX record of a snapshot: what git drops of a workspace's state (docs/security.md,
//! "a release keeps the exact POSIX state"), kept beside the snapshot, never in its tree.
//!
//! Mechanism only: the format of a record, and where it lives in a mirror. What goes into a record
//! (and how it is applied) is the lifecycle's policy (`daemon::posix`); nothing here knows about
//! workspaces or mounts.
//!
//! A record is a JSON blob. Names are bytes end to end: every path, xattr name and value is hex, so
//! no name is ever converted lossily. The snapshot commit names its record's blob in a trailer of
//! its message (`Octofs-Posix: <blob>`), so a record is found from the commit it belongs to and is
//! never applied to another one; the record also names the tree it describes, checked on use. The
//! blob is kept reachable by `refs/octomate/posix/<thread>`: a commit whose tree holds one blob per
//! snapshot, named by the snapshot's commit id, moved by compare-and-swap *before* the thread's ref
//! moves, so a snapshot ref never points at a commit whose record is missing. See
//! `docs/posix-record.md`.

use crate::git::error::{Context, Error};
use gix::ObjectId;
use gix::objs::tree::EntryKind;
use serde::{Deserialize, Serialize};

use super::snapshot as snap;

/// The version of the format this code writes and reads.
const VERSION: u32 = 1;

const POSIX_TRAILER: &str = "Octofs-Posix: ";

/// What a path is: the one table of file kinds in octofs. The catalog stores an inode's kind as this
/// type too (`cow::catalog::Kind`), so a kind goes from a workspace to a record and back unconverted,
/// by the same lowercase names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PosixKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    Char,
    Block,
}

impl PosixKind {
    /// Kinds git never stores: the record is the only place they live.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            PosixKind::Fifo | PosixKind::Socket | PosixKind::Char | PosixKind::Block
        )
    }
}

/// The exact state of one path (relative to the workspace's root, `/`-separated bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixEntry {
    #[serde(with = "hex_bytes")]
    pub path: Vec<u8>,
    pub kind: PosixKind,
    /// Permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Device number of a character or block device.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rdev: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty", with = "hex_pairs")]
    pub xattrs: Vec<Xattr>,
    /// Another path of the record's tree that is the same file (a hard link), listed earlier.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "hex_bytes_opt"
    )]
    pub link: Option<Vec<u8>>,
}

/// An extended attribute: name and value.
pub type Xattr = (Vec<u8>, Vec<u8>);

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Everything of one snapshot that its tree does not restore, sorted by path (parents first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PosixRecord {
    pub version: u32,
    /// The tree the record describes (the snapshot commit's tree), stored as its hex id.
    #[serde(with = "crate::records::hex")]
    pub tree: ObjectId,
    pub entries: Vec<PosixEntry>,
}

impl PosixRecord {
    pub fn new(tree: ObjectId, mut entries: Vec<PosixEntry>) -> PosixRecord {
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        PosixRecord {
            version: VERSION,
            tree,
            entries,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain structs of strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<PosixRecord, Error> {
        super::record::decode_versioned(bytes, "POSIX record", VERSION, |r: &PosixRecord| r.version)
    }
}

pub fn posix_ref(thread: &str) -> String {
    format!("refs/octomate/posix/{thread}")
}

/// The trailer line a snapshot message carries when it has a record.
pub fn trailer(blob: ObjectId) -> String {
    format!("{POSIX_TRAILER}{blob}\n")
}

/// The record blob a snapshot message names, if any.
pub fn blob_of(message: &[u8]) -> Option<ObjectId> {
    super::record::trailer_id(message, POSIX_TRAILER)
}

/// Writes the record's blob (no ref moves).
pub fn write_blob(repo: &gix::Repository, record: &PosixRecord) -> Result<ObjectId, Error> {
    Ok(repo
        .write_blob(record.encode())
        .context(|| "cannot write the POSIX record".to_string())?
        .detach())
}

/// Makes `blob` reachable as the record of `snapshot` under [`posix_ref`] (compare-and-swap: a ref
/// that moved underneath is an error).
pub fn keep(
    repo: &gix::Repository,
    thread: &str,
    snapshot: ObjectId,
    blob: ObjectId,
) -> Result<(), Error> {
    let name = posix_ref(thread);
    let prev = snap::read_ref(repo, &name);
    let base = match prev {
        Some(p) => snap::commit_info(repo, p)?.0,
        None => ObjectId::empty_tree(repo.object_hash()),
    };
    let mut ed = repo
        .edit_tree(base)
        .context(|| format!("cannot edit the POSIX records of {thread}"))?;
    ed.upsert(snapshot.to_string(), EntryKind::Blob, blob)
        .context(|| format!("cannot edit the POSIX records of {thread}"))?;
    let tree = ed
        .write()
        .context(|| format!("cannot write the POSIX records of {thread}"))?
        .detach();
    let commit = snap::write_commit(
        repo,
        tree,
        prev.into_iter().collect(),
        &format!("octofs POSIX record of snapshot {snapshot} of thread {thread}\n"),
    )?;
    snap::cas_ref(
        repo,
        &name,
        prev,
        commit,
        &format!("octofs: POSIX record of {thread}"),
    )
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::hex(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        super::unhex(&s).map_err(serde::de::Error::custom)
    }
}

mod hex_bytes_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(b) => s.serialize_some(&super::hex(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::unhex(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

mod hex_pairs {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[super::Xattr], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|(k, v)| [super::hex(k), super::hex(v)]))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<super::Xattr>, D::Error> {
        Vec::<[String; 2]>::deserialize(d)?
            .into_iter()
            .map(|[k, v]| {
                Ok((
                    super::unhex(&k).map_err(serde::de::Error::custom)?,
                    super::unhex(&v).map_err(serde::de::Error::custom)?,
                ))
            })
            .collect()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, Error> {
    if !s.len().is_multiple_of(2) {
        return Err(Error::Invalid(format!("odd-length hex {s:?}")));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| Error::Invalid(format!("bad hex {s:?}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as released snapshots hold it (its tree a hex string), checked in.
    const RECORD: &str = include_str!("../../tests/fixtures/records/posix.json");

    /// Catches: a tree written in another form than the 40-hex string snapshots hold (gix's
    /// `{"Sha1":[…]}`), or one that is not an object id decoded as some id instead of refused.
    #[test]
    fn a_record_in_snapshots_reads_and_writes_back_byte_for_byte() {
        let r = PosixRecord::decode(RECORD.as_bytes()).expect("record");
        assert_eq!(
            r.tree.to_string(),
            "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
        );
        assert_eq!(String::from_utf8_lossy(&r.encode()), RECORD);
        let bad = RECORD.replace("4b825dc642cb6eb9a060e54bf8d69288fbee4904", "4b825d");
        let e = PosixRecord::decode(bad.as_bytes()).expect_err("a bad tree");
        assert!(
            e.to_string().contains("not a hex object id: \"4b825d\""),
            "{e}"
        );
    }

    fn entry(path: &[u8], kind: PosixKind) -> PosixEntry {
        PosixEntry {
            path: path.to_vec(),
            kind,
            mode: 0o600,
            uid: 0,
            gid: 0,
            rdev: 0,
            xattrs: vec![],
            link: None,
        }
    }

    #[test]
    fn records_with_odd_names_round_trip_exactly() {
        let deep: Vec<u8> = (0..30)
            .flat_map(|i| {
                let mut c = vec![b'd'; 200];
                c[0] = b'0' + (i % 10) as u8;
                c.push(b'/');
                c
            })
            .chain(*b"leaf")
            .collect();
        assert!(deep.len() > 4096);
        let mut suid = entry(b"bin/tool", PosixKind::File);
        suid.mode = 0o4755;
        suid.uid = 1234;
        suid.gid = 5678;
        suid.xattrs = vec![(b"user.\xff\x00x".to_vec(), vec![0, 1, 2, 0xfe])];
        let mut dev = entry(b"dev/null", PosixKind::Char);
        dev.rdev = (1 << 8) | 3;
        let mut link = entry(b"z/second", PosixKind::File);
        link.link = Some(b"caf\xe9".to_vec());
        let entries = vec![
            link,
            entry(b"caf\xe9", PosixKind::File),
            entry(b"new\nline \"quoted\" \\ back", PosixKind::Fifo),
            entry(&[0x80, 0xc3, 0x28, b' ', 0xff], PosixKind::Socket),
            entry(&deep, PosixKind::Dir),
            suid,
            dev,
        ];
        let tree = ObjectId::empty_tree(gix::hash::Kind::Sha1);
        let r = PosixRecord::new(tree, entries);
        let bytes = r.encode();
        assert!(std::str::from_utf8(&bytes).is_ok(), "the record is text");
        let back = PosixRecord::decode(&bytes).expect("decode");
        assert_eq!(back, r);
        assert!(
            back.entries.windows(2).all(|w| w[0].path < w[1].path),
            "entries are sorted by path"
        );
        assert_eq!(
            back.entries
                .iter()
                .find(|e| e.path == deep)
                .unwrap()
                .path
                .len(),
            deep.len()
        );
    }

    #[test]
    fn damaged_or_foreign_records_are_refused() {
        assert!(PosixRecord::decode(b"not json").is_err());
        assert!(
            PosixRecord::decode(br#"{"version":1,"tree":"x","entries":[{"path":"zz","kind":"file","mode":0,"uid":0,"gid":0}]}"#)
                .is_err(),
            "bad hex in a path"
        );
        assert!(
            PosixRecord::decode(br#"{"version":1,"tree":"x","entries":[{"path":"abc","kind":"file","mode":0,"uid":0,"gid":0}]}"#)
                .is_err(),
            "odd-length hex in a path"
        );
        let err = PosixRecord::decode(br#"{"version":9,"tree":"x","entries":[]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("version 9"), "{err}");
    }

    #[test]
    fn the_trailer_names_the_blob() {
        let blob = ObjectId::empty_blob(gix::hash::Kind::Sha1);
        let msg = format!(
            "octofs snapshot of thread t\n\nOctofs-Head: detached\n{}",
            trailer(blob)
        );
        assert_eq!(blob_of(msg.as_bytes()), Some(blob));
        assert_eq!(
            blob_of(b"octofs snapshot of thread t\n\nOctofs-Head: detached\n"),
            None
        );
    }
}
