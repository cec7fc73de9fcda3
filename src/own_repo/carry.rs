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
//! The walk stops at what the mirror has (a commit it has brings its history, as for a push). The
//! workspace's `objects/info/alternates` is not followed (its one legitimate alternate is the
//! mirror itself): an object only reachable through another is an error.

use std::collections::HashSet;
use std::path::Path;

use gix::ObjectId;
use gix::objs::{Find as _, Kind, ObjectRef, Write as _};
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
use gix::refs::{FullName, Target};

use super::Scratch;
use crate::fs::core::WorkspaceFs;

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
) -> Result<usize, String> {
    let scratch = Scratch::new(state, "objects")?;
    let objects = scratch.path().join("objects");
    std::fs::create_dir_all(objects.join("pack"))
        .map_err(|e| format!("cannot create {}: {e}", objects.display()))?;
    let odb = gix::odb::at(&objects, gix::hash::Kind::Sha1)
        .map_err(|e| format!("cannot open {}: {e}", objects.display()))?;
    let mut packs_copied = false;
    let mut todo = vec![head];
    let mut seen = HashSet::new();
    let mut written = 0;
    let mut buf = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) || repo.has_object(id) {
            continue;
        }
        let hex = id.to_string();
        let (dir, file) = hex.split_at(2);
        scratch.copy_in(
            core,
            &[b".git", b"objects", dir.as_bytes(), file.as_bytes()],
            &Path::new("objects").join(dir).join(file),
        )?;
        let mut kind = find(&odb, &id, &mut buf)?;
        if kind.is_none() && !packs_copied {
            copy_packs(core, &scratch)?;
            packs_copied = true;
            kind = find(&odb, &id, &mut buf)?;
        }
        let Some(kind) = kind else {
            return Err(format!(
                "object {id}, reachable from the workspace's HEAD, is not in its .git/objects"
            ));
        };
        let data = buf.as_slice();
        let actual = gix::objs::compute_hash(gix::hash::Kind::Sha1, kind, data)
            .map_err(|e| format!("cannot hash object {id} of the workspace: {e}"))?;
        if actual != id {
            return Err(format!(
                "the workspace's object {id} holds an object whose id is {actual}: not carried"
            ));
        }
        let parsed = ObjectRef::from_bytes(data, kind, gix::hash::Kind::Sha1)
            .map_err(|e| format!("cannot parse {kind} {id} of the workspace: {e}"))?;
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
            .map_err(|e| format!("cannot write object {id} into the mirror: {e}"))?;
        written += 1;
    }
    set_ref(repo, &heads_ref(thread), head)?;
    Ok(written)
}

/// Reads object `id` of the private store into `buf` (exactly its content); its kind, or `None`
/// when the store does not have it.
fn find(odb: &gix::odb::Handle, id: &ObjectId, buf: &mut Vec<u8>) -> Result<Option<Kind>, String> {
    let err = |e: gix::Error| format!("cannot read object {id} of the workspace: {e}");
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
fn copy_packs(core: &WorkspaceFs, scratch: &Scratch) -> Result<(), String> {
    let dir: [&[u8]; 3] = [b".git", b"objects", b"pack"];
    let names = core
        .list_dir(&dir)
        .map_err(|e| format!("cannot list .git/objects/pack: {e:?}"))?
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
        )?;
    }
    Ok(())
}

/// Points `name` at `id` whatever it pointed at, with a reflog entry.
fn set_ref(repo: &gix::Repository, name: &str, id: ObjectId) -> Result<(), String> {
    let edit = RefEdit {
        name: FullName::try_from(name).map_err(|e| format!("bad ref name {name}: {e}"))?,
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
        .map_err(|e| format!("cannot update {name} in the mirror: {e}"))
}
