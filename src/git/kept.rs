//! The kept side of a snapshot: what `git add -A` leaves out of a snapshot's tree although it is
//! the workspace's own state — nested git repositories (the tree holds at most a gitlink) and
//! paths git refuses to put into a tree (`.GIT`, `.git` below the top, NTFS aliases of `.git`, a
//! `.gitmodules` symlink) — kept beside the tree, never in it.
//!
//! Mechanism only: the format, how a snapshot names it and where it lives in a mirror. Which paths
//! are kept and how they come back is the lifecycle's policy (`daemon::kept`); nothing here knows
//! about workspaces or mounts, and nothing here ever runs git in, or reads the configuration of, a
//! kept repository: its `.git` is plain data (files, modes, bytes).
//!
//! A kept side is a tree of the mirror (named in the snapshot's message by the trailer
//! `Octofs-Kept: <tree>`): `record`, a JSON blob listing every kept path (kind, mode, owner,
//! group, device number, extended attributes, the first name of a hard link, the blob of a file's
//! bytes or a symlink's target; every path and xattr in hex), sorted by path, and `objects/<id>`,
//! every blob the record names, so that fetching or pushing the side tree carries the bytes. The
//! side tree is kept reachable by `refs/octomate/kept/<thread>`: a commit whose tree holds one
//! entry per snapshot (named by the snapshot's commit id), moved by compare-and-swap before the
//! thread's ref moves. See `docs/posix-record.md`.

use crate::git::error::{Context, Error};
use crate::git::posix_record::PosixEntry;
use gix::ObjectId;
use gix::bstr::ByteSlice;
use gix::objs::tree::EntryKind;
use serde::{Deserialize, Serialize};

use super::snapshot as snap;

/// The version of the format this code writes and reads.
const VERSION: u32 = 1;

const KEPT_TRAILER: &str = "Octofs-Kept: ";

/// Whether git refuses `name` as a name in a tree (as a symlink's name when `symlink`): any case
/// of `.git`, its NTFS aliases, a `.gitmodules` symlink — the checks of git on Linux
/// (`core.protectNTFS` on), which a snapshot's tree is held to.
pub fn refused_name(name: &[u8], symlink: bool) -> bool {
    use gix::validate::path::component::{Mode, Options};
    let opts = Options {
        protect_windows: false,
        protect_hfs: false,
        protect_ntfs: true,
    };
    gix::validate::path::component(name.as_bstr(), symlink.then_some(Mode::Symlink), opts).is_err()
}

/// Why a subtree is kept beside the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeptWhy {
    /// A directory holding a `.git`: a nested repository (the tree has at most its gitlink).
    Nested,
    /// A name git refuses in a tree (the path is the first refused component).
    Refused,
}

/// One kept subtree: its root path and why it is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptRoot {
    #[serde(with = "hex_bytes")]
    pub path: Vec<u8>,
    pub why: KeptWhy,
}

/// One kept path: its exact POSIX state and, for a file or a symlink, the blob of its bytes (the
/// file's content, the symlink's target).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptEntry {
    pub meta: PosixEntry,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
}

impl KeptEntry {
    /// The blob of the bytes, when the entry has one.
    pub fn blob_id(&self) -> Result<Option<ObjectId>, Error> {
        self.blob
            .as_deref()
            .map(|b| {
                ObjectId::from_hex(b.as_bytes())
                    .map_err(|_| Error::Invalid(format!("bad blob id {b:?} in a kept record")))
            })
            .transpose()
    }
}

/// Everything a snapshot keeps beside its tree, roots and entries sorted by path (parents first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptRecord {
    pub version: u32,
    /// The tree of the snapshot this side belongs to, stored as its hex id.
    #[serde(with = "crate::records::hex")]
    pub tree: ObjectId,
    pub roots: Vec<KeptRoot>,
    pub entries: Vec<KeptEntry>,
}

impl KeptRecord {
    pub fn new(
        tree: ObjectId,
        mut roots: Vec<KeptRoot>,
        mut entries: Vec<KeptEntry>,
    ) -> KeptRecord {
        roots.sort_by(|a, b| a.path.cmp(&b.path));
        roots.dedup_by(|a, b| a.path == b.path);
        entries.sort_by(|a, b| a.meta.path.cmp(&b.meta.path));
        KeptRecord {
            version: VERSION,
            tree,
            roots,
            entries,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain structs of strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<KeptRecord, Error> {
        super::record::decode_versioned(bytes, "kept record", VERSION, |r: &KeptRecord| r.version)
    }
}

pub fn kept_ref(thread: &str) -> String {
    format!("refs/octomate/kept/{thread}")
}

/// The trailer line a snapshot message carries when it keeps something beside its tree.
pub fn trailer(side: ObjectId) -> String {
    format!("{KEPT_TRAILER}{side}\n")
}

/// The side tree a snapshot message names, if any.
pub fn side_of(message: &[u8]) -> Option<ObjectId> {
    super::record::trailer_id(message, KEPT_TRAILER)
}

/// Kept files up to this size are read whole; larger ones stream.
const IN_MEMORY_UP_TO: u64 = 8 << 20;

/// Writes the bytes of `f` (a kept file, opened through the core) as a blob of the mirror, in
/// bounded memory: a large file is hashed in one pass (a blob the mirror has, e.g. the last
/// snapshot's, is not written again) and streamed into a loose object in a second. A file that
/// shrinks while it is read fails the write (an object never disagrees with its header).
pub fn write_file_blob(repo: &gix::Repository, f: std::fs::File) -> Result<ObjectId, Error> {
    use gix::objs::Write as _;
    use std::io::{Read as _, Seek as _};
    let what = || "cannot keep a file's bytes".to_string();
    let size = f.metadata().context(what)?.len();
    if size <= IN_MEMORY_UP_TO {
        let mut buf = Vec::with_capacity(size as usize);
        Exact {
            inner: &f,
            left: size,
        }
        .read_to_end(&mut buf)
        .context(what)?;
        return Ok(repo.write_blob(buf).context(what)?.detach());
    }
    let f = &f;
    let exact = || Exact {
        inner: std::io::BufReader::with_capacity(1 << 20, f),
        left: size,
    };
    let id = gix::objs::compute_stream_hash(
        repo.object_hash(),
        gix::objs::Kind::Blob,
        &mut exact(),
        size,
        &mut gix::utils::progress::Discard,
        &std::sync::atomic::AtomicBool::new(false),
    )
    .context(what)?;
    if repo.has_object(id) {
        return Ok(id);
    }
    let mut rewind = f;
    rewind.seek(std::io::SeekFrom::Start(0)).context(what)?;
    repo.objects
        .write_stream(gix::objs::Kind::Blob, size, &mut exact())
        .context(what)
}

/// Reads exactly `left` bytes of `inner`, and fails if it ends sooner.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: std::io::Read> std::io::Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was kept",
            ));
        }
        self.left -= got as u64;
        Ok(got)
    }
}

/// Writes the side tree of `record` (its blobs are already in the mirror); no ref moves.
pub fn write_side(repo: &gix::Repository, record: &KeptRecord) -> Result<ObjectId, Error> {
    let what = || "cannot write the kept side of a snapshot".to_string();
    let rec = repo.write_blob(record.encode()).context(what)?.detach();
    let mut ed = repo
        .edit_tree(ObjectId::empty_tree(repo.object_hash()))
        .context(what)?;
    ed.upsert("record", EntryKind::Blob, rec).context(what)?;
    for e in &record.entries {
        if let Some(id) = e.blob_id()? {
            ed.upsert(format!("objects/{id}"), EntryKind::Blob, id)
                .context(what)?;
        }
    }
    Ok(ed.write().context(what)?.detach())
}

/// Reads the record of side tree `side`.
pub fn read_side(repo: &gix::Repository, side: ObjectId) -> Result<KeptRecord, Error> {
    let tree = repo
        .find_tree(side)
        .context(|| format!("the kept side {side} is missing from the mirror"))?;
    let entry = tree
        .find_entry("record")
        .ok_or_else(|| Error::Invalid(format!("the kept side {side} has no record")))?;
    let blob = repo
        .find_object(entry.object_id())
        .context(|| format!("the record of the kept side {side}"))?;
    KeptRecord::decode(&blob.data).context(|| format!("the kept side {side}"))
}

/// Makes `side` reachable as the kept side of `snapshot` under [`kept_ref`] (compare-and-swap: a
/// ref that moved underneath is an error).
pub fn keep(
    repo: &gix::Repository,
    thread: &str,
    snapshot: ObjectId,
    side: ObjectId,
) -> Result<(), Error> {
    let name = kept_ref(thread);
    let prev = snap::read_ref(repo, &name);
    let base = match prev {
        Some(p) => snap::commit_info(repo, p)?.0,
        None => ObjectId::empty_tree(repo.object_hash()),
    };
    let what = || format!("cannot edit the kept sides of {thread}");
    let mut ed = repo.edit_tree(base).context(what)?;
    ed.upsert(snapshot.to_string(), EntryKind::Tree, side)
        .context(what)?;
    let tree = ed.write().context(what)?.detach();
    let commit = snap::write_commit(
        repo,
        tree,
        prev.into_iter().collect(),
        &format!("octofs kept side of snapshot {snapshot} of thread {thread}\n"),
    )?;
    snap::cas_ref(
        repo,
        &name,
        prev,
        commit,
        &format!("octofs: kept side of {thread}"),
    )
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.iter().map(|x| format!("{x:02x}")).collect::<String>())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        if !s.len().is_multiple_of(2) {
            return Err(serde::de::Error::custom(format!("odd-length hex {s:?}")));
        }
        (0..s.len())
            .step_by(2)
            .map(|i| {
                s.get(i..i + 2)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| serde::de::Error::custom(format!("bad hex {s:?}")))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::posix_record::PosixKind;

    /// A kept side's record as released snapshots hold it (its tree a hex string), checked in.
    const RECORD: &str = include_str!("../../tests/fixtures/records/kept.json");

    /// Catches: a tree written in another form than the 40-hex string snapshots hold (gix's
    /// `{"Sha1":[…]}`), or one that is not an object id decoded as some id instead of refused.
    #[test]
    fn a_kept_record_in_snapshots_reads_and_writes_back_byte_for_byte() {
        let r = KeptRecord::decode(RECORD.as_bytes()).expect("record");
        assert_eq!(
            r.tree.to_string(),
            "9b1e2d3c4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c"
        );
        assert_eq!(String::from_utf8_lossy(&r.encode()), RECORD);
        let bad = RECORD.replace("9b1e2d3c4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c", "9b1e");
        let e = KeptRecord::decode(bad.as_bytes()).expect_err("a bad tree");
        assert!(
            e.to_string().contains("not a hex object id: \"9b1e\""),
            "{e}"
        );
    }

    /// A small and a large (streamed) kept file land in the mirror as the blob of their bytes; a
    /// second write of one the mirror has is the same id.
    #[test]
    fn kept_files_small_and_large_become_their_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path().join("m.git")).unwrap();
        for len in [5usize, IN_MEMORY_UP_TO as usize + 12_345] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let p = dir.path().join(format!("f{len}"));
            std::fs::write(&p, &data).unwrap();
            let id = write_file_blob(&repo, std::fs::File::open(&p).unwrap()).unwrap();
            let want = gix::objs::compute_hash(gix::hash::Kind::Sha1, gix::objs::Kind::Blob, &data)
                .unwrap();
            assert_eq!(id, want, "{len} bytes");
            assert!(repo.find_object(id).unwrap().data == data, "{len} bytes");
            let again = write_file_blob(&repo, std::fs::File::open(&p).unwrap()).unwrap();
            assert_eq!(again, id);
        }
    }

    #[test]
    fn a_record_with_odd_names_round_trips_and_the_trailer_names_the_side() {
        let meta = |p: &[u8], kind| PosixEntry {
            path: p.to_vec(),
            kind,
            mode: 0o444,
            uid: 1,
            gid: 2,
            rdev: 0,
            xattrs: vec![],
            link: None,
        };
        let blob = ObjectId::empty_blob(gix::hash::Kind::Sha1);
        let r = KeptRecord::new(
            ObjectId::empty_tree(gix::hash::Kind::Sha1),
            vec![
                KeptRoot {
                    path: b"vend".to_vec(),
                    why: KeptWhy::Nested,
                },
                KeptRoot {
                    path: b".GIT".to_vec(),
                    why: KeptWhy::Refused,
                },
            ],
            vec![
                KeptEntry {
                    meta: meta(b"vend/.git/objects/ab/\xff", PosixKind::File),
                    blob: Some(blob.to_string()),
                },
                KeptEntry {
                    meta: meta(b".GIT", PosixKind::Dir),
                    blob: None,
                },
            ],
        );
        let back = KeptRecord::decode(&r.encode()).expect("decode");
        assert_eq!(back, r);
        assert_eq!(back.roots[0].path, b".GIT");
        assert_eq!(back.entries[1].blob_id().unwrap(), Some(blob));
        assert!(KeptRecord::decode(br#"{"version":2,"tree":"","roots":[],"entries":[]}"#).is_err());
        let tree = ObjectId::empty_tree(gix::hash::Kind::Sha1);
        let msg = format!("octofs snapshot of thread t\n\n{}", trailer(tree));
        assert_eq!(side_of(msg.as_bytes()), Some(tree));
        assert_eq!(side_of(b"octofs snapshot of thread t\n"), None);
    }
}
