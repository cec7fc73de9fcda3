//! The agent's own commits, carried into the mirror in process.
//!
//! A snapshot's first parent is the workspace's HEAD, so when the agent committed, the mirror
//! needs those commits. `git push` from the workspace would run with the workspace's configuration
//! (`url.*.pushInsteadOf`, `protocol.ext.allow`, hooks...) as root; instead, the objects reachable
//! from HEAD that the mirror lacks are read from the workspace's own object store — loose objects
//! and packs, copied through the core into a private directory first — and written into the
//! mirror. Each one is checked against its id first: an agent must not plant an object under
//! another object's id in a mirror that every workspace of the project reads.
//!
//! Loose blobs stream from the workspace into the mirror (memory stays bounded whatever their
//! size); commits, trees, tags and packed objects are read whole from the private copy.
//!
//! The walk stops at what the mirror has (a commit it has brings its history, as for a push). The
//! workspace's `objects/info/alternates` is not followed (its one legitimate alternate is the
//! mirror itself): an object only reachable through another is an error.

use std::collections::HashSet;
use std::io::Read as _;
use std::path::Path;

use gix::ObjectId;
use gix::objs::{Find as _, Kind, ObjectRef, Write as _};
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
use gix::refs::{FullName, Target};

use super::{Error, Scratch};
use crate::fs::WorkspaceFs;

/// The ref that keeps a thread's own commits reachable in the mirror.
pub fn heads_ref(thread: &str) -> String {
    format!("refs/octomate/heads/{thread}")
}

/// Copies every object reachable from `head` that the mirror `repo` lacks out of the workspace
/// into the mirror, then points `refs/octomate/heads/<thread>` at `head`. Returns how many objects
/// were written. `state` is the daemon's state directory (for the private copies).
pub fn carry(
    core: &WorkspaceFs,
    state: &Path,
    repo: &gix::Repository,
    thread: &str,
    head: ObjectId,
) -> Result<usize, Error> {
    let written = carry_reachable(core, state, repo, &[head], &HashSet::new())?;
    set_ref(repo, &heads_ref(thread), head)?;
    Ok(written)
}

/// Copies every object reachable from `tips` that the mirror `repo` lacks out of the workspace
/// into the mirror (as [`carry`], no ref moves). A tip in `optional` that the workspace no longer
/// has (a reflog's old entry after a gc) is skipped; any other missing object is an error.
/// Returns how many objects were written.
pub fn carry_reachable(
    core: &WorkspaceFs,
    state: &Path,
    repo: &gix::Repository,
    tips: &[ObjectId],
    optional: &HashSet<ObjectId>,
) -> Result<usize, Error> {
    let scratch = Scratch::new(state, "objects")?;
    let objects = scratch.path().join("objects");
    std::fs::create_dir_all(objects.join("pack")).map_err(|source| Error::CreatePrivate {
        path: objects.clone(),
        source,
    })?;
    let odb =
        gix::odb::at(&objects, gix::hash::Kind::Sha1).map_err(|source| Error::OpenObjects {
            path: objects.clone(),
            source,
        })?;
    let mut packs_copied = false;
    let mut todo = tips.to_vec();
    let mut seen = HashSet::new();
    let mut written = 0;
    let mut buf = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) || repo.has_object(id) {
            continue;
        }
        let hex = id.to_string();
        let (dir, file) = hex.split_at(2);
        let loose: [&[u8]; 4] = [b".git", b"objects", dir.as_bytes(), file.as_bytes()];
        if stream_loose_blob(core, repo, id, &loose)? {
            written += 1;
            continue;
        }
        scratch.copy_in(
            core,
            &loose,
            &Path::new("objects").join(dir).join(file),
            u64::MAX,
        )?;
        let mut kind = find(&odb, &id, &mut buf)?;
        if kind.is_none() && !packs_copied {
            copy_packs(core, &scratch)?;
            packs_copied = true;
            kind = find(&odb, &id, &mut buf)?;
        }
        let Some(kind) = kind else {
            if optional.contains(&id) {
                continue;
            }
            return Err(Error::ObjectMissing { id });
        };
        let data = buf.as_slice();
        let actual = gix::objs::compute_hash(gix::hash::Kind::Sha1, kind, data)
            .map_err(|source| Error::HashObject { id, source })?;
        if actual != id {
            return Err(Error::WrongId { id, actual });
        }
        let parsed = ObjectRef::from_bytes(data, kind, gix::hash::Kind::Sha1)
            .map_err(|source| Error::ParseObject { kind, id, source })?;
        match parsed {
            ObjectRef::Commit(c) => {
                todo.push(c.tree());
                todo.extend(c.parents());
            }
            ObjectRef::Tree(t) => todo.extend(
                t.entries
                    .iter()
                    .filter(|e| !e.mode.is_commit())
                    .map(|e| e.oid.to_owned()),
            ),
            ObjectRef::Tag(t) => todo.push(t.target()),
            ObjectRef::Blob(_) => {}
        }
        repo.objects
            .write_buf(kind, data)
            .map_err(|source| Error::WriteObject { id, source })?;
        written += 1;
    }
    Ok(written)
}

/// Streams the workspace's loose object `id` (at `loose`) into the mirror when it is a blob, so
/// that memory stays bounded whatever its size; false when there is no such loose object or it is
/// not a blob (commits, trees and tags are small, and are parsed). The stream must hold exactly
/// the size its header gives, or nothing is written; an object whose content is not `id` is an
/// error (what was written is an object under its own id, which harms nothing).
fn stream_loose_blob(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    id: ObjectId,
    loose: &[&[u8]],
) -> Result<bool, Error> {
    let bad = |source: std::io::Error| Error::ReadObject { id, source };
    let Some(f) = core.open_file(loose).map_err(|e| bad(errno(e)))? else {
        return Ok(false);
    };
    let mut rd = Inflate {
        rd: std::io::BufReader::new(f),
        z: gix::zlib::Decompress::new(),
        done: false,
    };
    let mut header = Vec::new();
    let mut byte = [0u8];
    loop {
        if rd.read(&mut byte).map_err(bad)? == 0 || header.len() > 64 {
            return Err(Error::BadHeader { id });
        }
        if byte[0] == 0 {
            break;
        }
        header.push(byte[0]);
    }
    let parsed = header.split(|b| *b == b' ').collect::<Vec<_>>();
    let (kind, size) = match parsed[..] {
        [kind, size] => (
            Kind::from_bytes(kind).ok(),
            std::str::from_utf8(size)
                .ok()
                .and_then(|s| s.parse::<u64>().ok()),
        ),
        _ => (None, None),
    };
    let (Some(kind), Some(size)) = (kind, size) else {
        return Err(Error::BadHeader { id });
    };
    if kind != Kind::Blob {
        return Ok(false);
    }
    let mut exact = Exact {
        rd,
        left: size,
        what: id,
    };
    let got = repo
        .objects
        .write_stream(Kind::Blob, size, &mut exact)
        .map_err(|source| Error::CopyObject { id, source })?;
    if got != id {
        return Err(Error::WrongId { id, actual: got });
    }
    Ok(true)
}

/// A core error as an I/O error of the same kind, its message saying the errno and the context.
fn errno(e: crate::fs::FsError) -> std::io::Error {
    std::io::Error::new(std::io::Error::from_raw_os_error(e.errno.code()).kind(), e)
}

/// A zlib stream, inflated as it is read.
struct Inflate<R> {
    rd: R,
    z: gix::zlib::Decompress,
    done: bool,
}

impl<R: std::io::BufRead> std::io::Read for Inflate<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        use std::io::{Error, ErrorKind};
        if self.done || out.is_empty() {
            return Ok(0);
        }
        loop {
            let input = self.rd.fill_buf()?;
            let eof = input.is_empty();
            let (in0, out0) = (self.z.total_in(), self.z.total_out());
            let flush = if eof {
                gix::zlib::FlushDecompress::Finish
            } else {
                gix::zlib::FlushDecompress::None
            };
            let status = self
                .z
                .decompress(input, out, flush)
                .map_err(|e| Error::new(ErrorKind::InvalidData, format!("corrupt object: {e}")))?;
            let consumed = (self.z.total_in() - in0) as usize;
            let written = (self.z.total_out() - out0) as usize;
            self.rd.consume(consumed);
            if status == gix::zlib::Status::StreamEnd {
                self.done = true;
                return Ok(written);
            }
            if written > 0 {
                return Ok(written);
            }
            if eof {
                return Err(Error::new(ErrorKind::UnexpectedEof, "truncated object"));
            }
            if consumed == 0 {
                return Err(Error::new(ErrorKind::InvalidData, "corrupt object"));
            }
        }
    }
}

/// Exactly `left` bytes of `rd`: shorter or longer is an error (an object's size is in its header,
/// written before its content).
struct Exact<R> {
    rd: R,
    left: u64,
    what: ObjectId,
}

impl<R: std::io::Read> std::io::Read for Exact<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        use std::io::{Error, ErrorKind};
        if self.left == 0 {
            let mut more = [0u8];
            return match self.rd.read(&mut more)? {
                0 => Ok(0),
                _ => Err(Error::new(
                    ErrorKind::InvalidData,
                    format!("object {} is longer than its header says", self.what),
                )),
            };
        }
        let want = out.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.rd.read(&mut out[..want])?;
        if n == 0 && want > 0 {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                format!("object {} is shorter than its header says", self.what),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Reads object `id` of the private store into `buf` (exactly its content); its kind, or `None`
/// when the store does not have it.
fn find(odb: &gix::odb::Handle, id: &ObjectId, buf: &mut Vec<u8>) -> Result<Option<Kind>, Error> {
    let err = |source: gix::Error| Error::FindObject { id: *id, source };
    let hit = odb
        .try_find(id, buf)
        .map_err(err)?
        .map(|d| (d.kind, d.data.as_ptr() as usize, d.data.len()));
    let Some((kind, at, len)) = hit else {
        return Ok(None);
    };
    if at == buf.as_ptr() as usize && len <= buf.len() {
        // The usual case: the object was decoded into `buf` itself, so it is not copied.
        buf.truncate(len);
    } else {
        let copy = odb
            .try_find(id, buf)
            .map_err(err)?
            .map(|d| d.data.to_vec())
            .unwrap_or_default();
        *buf = copy;
    }
    Ok(Some(kind))
}

/// Copies the workspace's packs (`.git/objects/pack/pack-*.{idx,pack}`) into the scratch store.
fn copy_packs(core: &WorkspaceFs, scratch: &Scratch) -> Result<(), Error> {
    let dir: [&[u8]; 3] = [b".git", b"objects", b"pack"];
    let names = core
        .list_dir(&dir)
        .map_err(|source| Error::ListPacks { source })?
        .unwrap_or_default();
    for (name, kind) in names {
        let Ok(name) = std::str::from_utf8(&name) else {
            continue;
        };
        let is_pack_file = name.starts_with("pack-")
            && (name.ends_with(".pack") || name.ends_with(".idx"))
            && !name.contains('/');
        if kind != fuser::FileType::RegularFile || !is_pack_file {
            continue;
        }
        scratch.copy_in(
            core,
            &[dir[0], dir[1], dir[2], name.as_bytes()],
            &Path::new("objects").join("pack").join(name),
            u64::MAX,
        )?;
    }
    Ok(())
}

/// Points `name` at `id` whatever it pointed at, with a reflog entry.
fn set_ref(repo: &gix::Repository, name: &str, id: ObjectId) -> Result<(), Error> {
    let edit = RefEdit {
        name: FullName::try_from(name).map_err(|source| Error::BadRefName {
            name: name.to_string(),
            source,
        })?,
        deref: false,
        change: Change::Update {
            log: LogChange {
                mode: RefLog::AndReference,
                force_create_reflog: true,
                message: "octofs: the thread's own commits".into(),
            },
            expected: PreviousValue::Any,
            new: Target::Object(id),
        },
    };
    let sig = gix::actor::Signature {
        name: "octofs".into(),
        email: "octofs@localhost".into(),
        time: gix::date::Time::now_local_or_utc(),
    };
    let mut tb = gix::date::parse::TimeBuf::default();
    repo.edit_references_as(Some(edit), Some(sig.to_ref(&mut tb)))
        .map(|_| ())
        .map_err(|source| Error::UpdateRef {
            name: name.to_string(),
            source,
        })
}
