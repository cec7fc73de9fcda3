//! The repository record of a snapshot: what a workspace's `.git` holds besides HEAD, the index
//! and the objects HEAD reaches, kept across release, fork, teleport and a move between hosts
//! (docs/lifecycle.md "The repository record").
//!
//! Kept: every ref under `refs/` that the mirror does not present with the same value (the
//! agent's branches, tags, `refs/stash`, notes, remotes it fetched; `refs/octomate/*` never), its
//! symbolic refs, the reflogs of `refs/stash` (every stash entry) and of HEAD, `.git/config` and
//! `.git/info/exclude` as bytes — and every object those refs and reflogs reach, carried into the
//! mirror as the agent's commits are (`own_repo::carry`). Not kept: other reflogs, hooks, linked
//! worktrees' administrative files (their branches are refs, and kept).
//!
//! Format: a commit of the mirror, `refs/octomate/repo/<thread>`, whose tree holds `refs` (one
//! line per ref: `<id> <name>` or `symref <target> <name>`), `config`, `exclude`, `logs/HEAD`,
//! `logs/stash`, `tags/<id>` (the bytes of each annotated tag the refs reach, so the tag travels
//! with the record) and `objects/<id>` (a tree or blob a ref names), and whose parents are every
//! commit the refs and reflogs name, after the previous record: so the record and all it needs are
//! reachable from one ref, and a push or fetch of that ref moves them. The snapshot commit names
//! its record with the trailer `Octofs-Repo: <id>`. An unchanged record (same tree) is the
//! previous commit: nothing is written. A fork or teleport files the source's record for the new
//! thread without the source's own branch `octofs/<from>` ([`without_ref`]).
//!
//! Privilege (docs/security.md, privilege separation): the daemon reads the workspace's `.git` only
//! through the core (no symlink followed, every file bounded), never runs git there and never
//! honours the config it carries (bytes in, bytes out). A record is data that a share remote may
//! forge, so applying one ([`load`], [`Restore::write`]) writes only files of the workspace's own
//! `.git`, owned by its owner — what that owner could write with git — and objects into the
//! mirror under their own id (a tag whose bytes are not its name is left out): a ref name that is
//! not a valid `refs/…` name outside `refs/octomate/`, a ref to an object the mirror lacks, and a
//! file over its bound are left out, each named in a warning. Its `.git/config`, the one file that
//! makes git run things, is written byte for byte only when the record is the owner's own from this
//! host; from the share or another owner only its allowlisted keys are (`repo_config`), the keys
//! left out named in one warning.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Read as _;

use gix::ObjectId;
use gix::objs::tree::{Entry, EntryKind};
use gix::objs::{Find as _, Kind, Write as _, WriteTo as _};

use super::error::{Context, Error, on_workspace};
use super::refusal::SnapshotRefusal;
use crate::fs::WorkspaceFs;
use crate::git::snapshot as snap;
use crate::layout::Layout;

const REPO_TRAILER: &str = "Octofs-Repo: ";

// What `core.fsmonitor` says in a record where the workspace had octofs's own command (that
// command names the thread and the host's state directory; a resume writes its own).
use super::repo_config::FSMONITOR_TOKEN;

/// The most one ref file or `packed-refs` line may hold (real ones are one short line).
const REF_LINE_MAX: u64 = 4096;
/// The most refs a record keeps; a workspace with more is refused (it is not an agent's).
const REFS_MAX: usize = 100_000;
/// The largest `packed-refs` read (the mirror's refs are in it too).
const PACKED_MAX: u64 = 64 << 20;
/// The largest reflog kept: HEAD's keeps its newest entries within it; a longer stash log is
/// refused.
const LOG_MAX: u64 = 4 << 20;

/// The ref that keeps `thread`'s repository records reachable in the mirror.
pub(super) fn repo_ref(thread: &str) -> String {
    format!("refs/octomate/repo/{thread}")
}

/// Where the mirror keeps what it last fetched of `repo_ref(thread)` from the share.
pub(super) fn fetched_repo_ref(thread: &str) -> String {
    format!("refs/octomate/shared/repo/{thread}")
}

/// The trailer line a snapshot message carries for its record.
pub(super) fn trailer(record: ObjectId) -> String {
    format!("{REPO_TRAILER}{record}\n")
}

/// The record a snapshot message names, if any.
pub(super) fn record_of(message: &[u8]) -> Option<ObjectId> {
    crate::git::record::trailer_id(message, REPO_TRAILER)
}

/// Whether `name` is a ref a record may carry: a valid full name under `refs/`, outside
/// `refs/octomate/`.
fn allowed(name: &str) -> bool {
    name.starts_with("refs/")
        && !name.starts_with("refs/octomate/")
        && name != "refs/octomate"
        && gix::refs::FullName::try_from(name).is_ok()
        && !name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
}

/// Reads at most `max` bytes of the workspace's regular file `path`: `Ok(None)` when there is
/// none, `Err` naming it when it is larger.
fn read_bounded(core: &WorkspaceFs, path: &[&[u8]], max: u64) -> Result<Option<Vec<u8>>, Error> {
    let shown = || String::from_utf8_lossy(&path.join(&b'/')).into_owned();
    let Some(f) = core
        .open_file(path)
        .map_err(on_workspace(format!("cannot read {}", shown())))?
    else {
        return Ok(None);
    };
    let mut out = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut out)
        .context(|| format!("cannot read {}", shown()))?;
    if out.len() as u64 > max {
        return Err(SnapshotRefusal::FileTooLarge { path: shown(), max }.into());
    }
    Ok(Some(out))
}

/// The workspace's refs (loose over packed), read through the core.
#[derive(Default)]
struct WsRefs {
    direct: BTreeMap<String, ObjectId>,
    symbolic: BTreeMap<String, String>,
}

fn read_refs(core: &WorkspaceFs) -> Result<WsRefs, Error> {
    let mut out = WsRefs::default();
    if let Some(packed) = read_bounded(core, &[b".git", b"packed-refs"], PACKED_MAX)? {
        for line in packed.split(|b| *b == b'\n') {
            let line = String::from_utf8_lossy(line);
            if line.starts_with('#') || line.starts_with('^') || line.is_empty() {
                continue;
            }
            if let Some((id, name)) = line.trim_end().split_once(' ')
                && let Ok(id) = ObjectId::from_hex(id.as_bytes())
                && allowed(name)
            {
                out.direct.insert(name.to_string(), id);
            }
        }
    }
    let mut todo: Vec<Vec<Vec<u8>>> = vec![vec![b".git".to_vec(), b"refs".to_vec()]];
    while let Some(dir) = todo.pop() {
        let comps: Vec<&[u8]> = dir.iter().map(Vec::as_slice).collect();
        let Some(names) = core
            .list_dir(&comps)
            .map_err(on_workspace("cannot list .git/refs"))?
        else {
            continue;
        };
        for (name, kind) in names {
            let mut path = dir.clone();
            path.push(name);
            let full = String::from_utf8_lossy(&path[1..].join(&b'/')).into_owned();
            if full == "refs/octomate" || path.len() > 64 {
                continue;
            }
            match kind {
                fuser::FileType::Directory => todo.push(path),
                fuser::FileType::RegularFile => {
                    let comps: Vec<&[u8]> = path.iter().map(Vec::as_slice).collect();
                    let Some(bytes) = read_bounded(core, &comps, REF_LINE_MAX)? else {
                        continue;
                    };
                    let text = String::from_utf8_lossy(&bytes);
                    let text = text.trim();
                    if !allowed(&full) {
                        continue;
                    }
                    if let Some(target) = text.strip_prefix("ref: ") {
                        out.direct.remove(&full);
                        out.symbolic.insert(full, target.trim().to_string());
                    } else if let Ok(id) = ObjectId::from_hex(text.as_bytes()) {
                        out.direct.insert(full, id);
                    }
                }
                _ => {}
            }
            if out.direct.len() + out.symbolic.len() > REFS_MAX {
                return Err(SnapshotRefusal::TooManyRefs { max: REFS_MAX }.into());
            }
        }
    }
    Ok(out)
}

/// The new ids of a reflog's entries (`<old> <new> <who> <time>\t<message>`), with each line.
fn log_entries(log: &[u8]) -> impl Iterator<Item = (Option<ObjectId>, &[u8])> {
    log.split_inclusive(|b| *b == b'\n').map(|line| {
        let id = line
            .get(41..81)
            .and_then(|h| ObjectId::from_hex(h).ok())
            .filter(|id| !id.is_null());
        (id, line)
    })
}

/// The newest entries of a reflog that fit in [`LOG_MAX`] (whole lines).
fn tail(log: Vec<u8>) -> Vec<u8> {
    if log.len() as u64 <= LOG_MAX {
        return log;
    }
    let from = log.len() - LOG_MAX as usize;
    let start = log[from..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(log.len(), |i| from + i + 1);
    log[start..].to_vec()
}

/// Writes `bytes` as an object of `kind` unless the mirror has it; returns its id.
fn put(repo: &gix::Repository, kind: Kind, bytes: &[u8]) -> Result<ObjectId, Error> {
    let id = gix::objs::compute_hash(repo.object_hash(), kind, bytes)
        .context(|| "cannot hash the repository record".to_string())?;
    if !repo.has_object(id) {
        repo.objects
            .write_buf(kind, bytes)
            .context(|| "cannot write the repository record".to_string())?;
    }
    Ok(id)
}

/// Writes a tree of `entries` (any order) unless the mirror has it; returns its id.
fn put_tree(repo: &gix::Repository, mut entries: Vec<Entry>) -> Result<ObjectId, Error> {
    entries.sort();
    let tree = gix::objs::Tree { entries };
    let mut buf = Vec::new();
    tree.write_to(&mut buf)
        .context(|| "cannot encode the repository record".to_string())?;
    put(repo, Kind::Tree, &buf)
}

fn entry(name: &str, mode: EntryKind, oid: ObjectId) -> Entry {
    Entry {
        mode: mode.into(),
        filename: name.into(),
        oid,
    }
}

/// The record of the live workspace `core` of `thread`, written into the mirror `repo` with every
/// object it needs, `refs/octomate/repo/<thread>` moved to it: its commit. An unchanged record is
/// the previous one (nothing written). Refuses, naming it, what it cannot keep (a ref to an object
/// the workspace does not have, a file over its bound).
pub(super) fn save(
    core: &WorkspaceFs,
    layout: &Layout,
    repo: &gix::Repository,
    thread: &str,
    has_origin: bool,
) -> Result<ObjectId, Error> {
    let keep_as_is = |e: Error| -> Error {
        SnapshotRefusal::RefsNotKept {
            error: Box::new(e),
            thread: thread.to_string(),
        }
        .into()
    };
    let presented: BTreeMap<String, ObjectId> = crate::repo::mirror_refs(repo)?
        .direct
        .into_iter()
        .filter(|(n, _, _)| crate::repo::presented(n, has_origin))
        .map(|(n, id, _)| (n, id))
        .collect();
    let ws = read_refs(core)?;
    let mut lines = String::new();
    let mut required: Vec<ObjectId> = Vec::new();
    for (name, id) in &ws.direct {
        if presented.get(name) != Some(id) {
            lines.push_str(&format!("{id} {name}\n"));
            required.push(*id);
        }
    }
    for (name, target) in &ws.symbolic {
        if !(has_origin && name == "refs/remotes/origin/HEAD") && allowed(target) {
            lines.push_str(&format!("symref {target} {name}\n"));
        }
    }
    let stash = read_bounded(core, &[b".git", b"logs", b"refs", b"stash"], LOG_MAX)?;
    required.extend(
        stash
            .iter()
            .flat_map(|l| log_entries(l).filter_map(|(id, _)| id)),
    );
    let head_log = match core.open_file(&[b".git", b"logs", b"HEAD"]) {
        Ok(Some(f)) => {
            let mut out = Vec::new();
            f.take(64 << 20)
                .read_to_end(&mut out)
                .context(|| "cannot read .git/logs/HEAD".to_string())?;
            Some(tail(out))
        }
        Ok(None) => None,
        Err(e) => return Err(on_workspace("cannot read .git/logs/HEAD")(e)),
    };
    // The objects: what the refs and the stash need (an error when missing), then what HEAD's
    // reflog names (what the workspace no longer has is left out of the log).
    let lacking: Vec<ObjectId> = required
        .iter()
        .copied()
        .filter(|id| !repo.has_object(*id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if !lacking.is_empty() {
        let n = crate::own_repo::carry::carry_reachable(
            core,
            &layout.state,
            repo,
            &lacking,
            &HashSet::new(),
        )
        .map_err(|e| keep_as_is(e.into()))?;
        tracing::info!(%thread, objects = n, "carried the objects of the workspace's refs");
    }
    let head_log = head_log.map(|log| {
        let wanted: Vec<ObjectId> = log_entries(&log)
            .filter_map(|(id, _)| id)
            .filter(|id| !repo.has_object(*id))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !wanted.is_empty() {
            let optional: HashSet<ObjectId> = wanted.iter().copied().collect();
            if let Err(e) = crate::own_repo::carry::carry_reachable(
                core,
                &layout.state,
                repo,
                &wanted,
                &optional,
            ) {
                tracing::warn!(%thread, "HEAD's reflog keeps only what the mirror has: {e}");
            }
        }
        log_entries(&log)
            .filter(|(id, _)| id.is_none_or(|id| repo.has_object(id)))
            .flat_map(|(_, line)| line.iter().copied())
            .collect::<Vec<u8>>()
    });
    // What reaches the objects: commits become parents; tags travel as bytes (their target
    // followed); a tree or blob a ref names is an entry of `objects/`.
    let mut parents: BTreeSet<ObjectId> = BTreeSet::new();
    let mut tags: BTreeMap<ObjectId, ObjectId> = BTreeMap::new();
    let mut objects: Vec<Entry> = Vec::new();
    let mut todo: Vec<ObjectId> = required.clone();
    todo.extend(
        head_log
            .iter()
            .flat_map(|l| log_entries(l).filter_map(|(id, _)| id)),
    );
    let mut seen = HashSet::new();
    let mut buf = Vec::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(obj) = repo
            .objects
            .try_find(&id, &mut buf)
            .context(|| format!("cannot read {id} in the mirror"))?
        else {
            continue;
        };
        match obj.kind {
            Kind::Commit => {
                parents.insert(id);
            }
            Kind::Tag => {
                let data = obj.data.to_vec();
                let tag = gix::objs::TagRef::from_bytes(&data, repo.object_hash())
                    .context(|| format!("cannot parse tag {id}"))?;
                todo.push(tag.target());
                tags.insert(id, put(repo, Kind::Blob, &data)?);
            }
            Kind::Tree => objects.push(entry(&id.to_string(), EntryKind::Tree, id)),
            Kind::Blob => objects.push(entry(&id.to_string(), EntryKind::Blob, id)),
        }
    }
    let mut top = vec![entry(
        "refs",
        EntryKind::Blob,
        put(repo, Kind::Blob, lines.as_bytes())?,
    )];
    if let Some(config) = crate::repo::workspace_config_bytes(core)
        .map_err(on_workspace("cannot read .git/config"))?
    {
        let ours = |v: &str| crate::repo::octofs_fsmonitor(layout, thread, v);
        let config =
            crate::repo::replace_core_fsmonitor(&config, FSMONITOR_TOKEN, ours).unwrap_or(config);
        top.push(entry(
            "config",
            EntryKind::Blob,
            put(repo, Kind::Blob, &config)?,
        ));
    }
    if let Some(exclude) = read_bounded(
        core,
        &[b".git", b"info", b"exclude"],
        crate::repo::CONFIG_MAX,
    )? {
        top.push(entry(
            "exclude",
            EntryKind::Blob,
            put(repo, Kind::Blob, &exclude)?,
        ));
    }
    let mut logs = Vec::new();
    if let Some(l) = &head_log {
        logs.push(entry("HEAD", EntryKind::Blob, put(repo, Kind::Blob, l)?));
    }
    if let Some(l) = &stash {
        logs.push(entry("stash", EntryKind::Blob, put(repo, Kind::Blob, l)?));
    }
    if !logs.is_empty() {
        top.push(entry("logs", EntryKind::Tree, put_tree(repo, logs)?));
    }
    if !tags.is_empty() {
        let t = tags
            .iter()
            .map(|(id, blob)| entry(&id.to_string(), EntryKind::Blob, *blob))
            .collect();
        top.push(entry("tags", EntryKind::Tree, put_tree(repo, t)?));
    }
    if !objects.is_empty() {
        top.push(entry("objects", EntryKind::Tree, put_tree(repo, objects)?));
    }
    let tree = put_tree(repo, top)?;
    let name = repo_ref(thread);
    let prev = snap::read_ref(repo, &name);
    if let Some(p) = prev
        && snap::commit_info(repo, p).is_ok_and(|(t, ..)| t == tree)
    {
        return Ok(p);
    }
    let all: Vec<ObjectId> = prev.into_iter().chain(parents).collect();
    let commit = snap::write_commit(
        repo,
        tree,
        all,
        &format!("octofs repository record of thread {thread}\n"),
    )?;
    snap::cas_ref(
        repo,
        &name,
        prev,
        commit,
        &format!("octofs: repository record of {thread}"),
    )?;
    Ok(commit)
}

/// Points `refs/octomate/repo/<thread>` at `record` whatever it named (a fork's or an adopted
/// thread's first record).
pub(super) fn set_ref(repo: &gix::Repository, thread: &str, record: ObjectId) -> Result<(), Error> {
    let name = repo_ref(thread);
    let prev = snap::read_ref(repo, &name);
    if prev == Some(record) {
        return Ok(());
    }
    snap::cas_ref(
        repo,
        &name,
        prev,
        record,
        &format!("octofs: repository record of {thread}"),
    )?;
    Ok(())
}

/// The record `record` without the ref `name` (the same commit when it has none): a fork's or a
/// teleport's record, without the source thread's own branch `octofs/<from>` (HEAD goes on the
/// new thread's own). Same parents: everything stays reachable.
pub(super) fn without_ref(
    repo: &gix::Repository,
    record: ObjectId,
    name: &str,
    thread: &str,
) -> Result<ObjectId, Error> {
    let what = || format!("the repository record {record} is missing or unreadable");
    let (tree, parents, ..) = snap::commit_info(repo, record).context(what)?;
    let t = repo.find_tree(tree).context(what)?;
    let mut entries: Vec<Entry> = t
        .decode()
        .context(what)?
        .entries
        .iter()
        .map(|e| Entry {
            mode: e.mode,
            filename: e.filename.to_owned(),
            oid: e.oid.to_owned(),
        })
        .collect();
    let Some(refs) = entries.iter_mut().find(|e| e.filename == "refs") else {
        return Ok(record);
    };
    let text = repo.find_object(refs.oid).context(what)?.detach().data;
    let suffix = format!(" {name}");
    let kept: Vec<u8> = text
        .split_inclusive(|b| *b == b'\n')
        .filter(|l| {
            !l.strip_suffix(b"\n")
                .unwrap_or(l)
                .ends_with(suffix.as_bytes())
        })
        .flatten()
        .copied()
        .collect();
    if kept == text {
        return Ok(record);
    }
    refs.oid = put(repo, Kind::Blob, &kept)?;
    let tree = put_tree(repo, entries)?;
    snap::write_commit(
        repo,
        tree,
        parents,
        &format!("octofs repository record of thread {thread}\n"),
    )
    .map_err(Into::into)
}

/// A record, admitted: what a resume writes into the new workspace's `.git`.
#[derive(Debug, Default)]
pub(super) struct Restore {
    /// (name, id, what an annotated tag peels to), each in the mirror.
    refs: Vec<(String, ObjectId, Option<ObjectId>)>,
    symbolic: Vec<(String, String)>,
    config: Option<Vec<u8>>,
    exclude: Option<Vec<u8>>,
    head_log: Option<Vec<u8>>,
    stash_log: Option<Vec<u8>>,
    /// What was left out, one warning each.
    pub(super) left_out: Vec<String>,
}

/// Reads the record `record` of the snapshot `shown` from the mirror `repo`, restoring its tags
/// into the mirror, and admits what it says (see the module's doc). Its config is kept byte for
/// byte only when `trust` says the record is the owner's own from this host; else only its
/// allowlisted keys are (`repo_config::filter`), what was left out named in one warning. A record
/// that is missing or unreadable is an error naming it.
pub(super) fn load(
    repo: &gix::Repository,
    record: ObjectId,
    shown: &str,
    trust: super::repo_config::Trust,
) -> Result<Restore, Error> {
    let what = || format!("the repository record {record} of {shown} is missing or unreadable");
    let (tree, ..) = snap::commit_info(repo, record).context(what)?;
    let mut out = Restore::default();
    let read = |id: ObjectId| -> Result<Vec<u8>, Error> {
        Ok(repo.find_object(id).context(what)?.detach().data)
    };
    let entries = |id: ObjectId| -> Result<Vec<(String, ObjectId, bool)>, Error> {
        let t = repo.find_tree(id).context(what)?;
        let decoded = t.decode().context(what)?;
        Ok(decoded
            .entries
            .iter()
            .map(|e| (e.filename.to_string(), e.oid.to_owned(), e.mode.is_tree()))
            .collect())
    };
    let mut refs_blob = None;
    for (name, id, is_tree) in entries(tree)? {
        match (name.as_str(), is_tree) {
            ("refs", false) => refs_blob = Some(read(id)?),
            ("config", false) => out.config = Some(read(id)?),
            ("exclude", false) => out.exclude = Some(read(id)?),
            ("logs", true) => {
                for (n, l, t) in entries(id)? {
                    match (n.as_str(), t) {
                        ("HEAD", false) => out.head_log = Some(read(l)?),
                        ("stash", false) => out.stash_log = Some(read(l)?),
                        _ => {}
                    }
                }
            }
            ("tags", true) => {
                for (n, blob, _) in entries(id)? {
                    let Ok(want) = ObjectId::from_hex(n.as_bytes()) else {
                        continue;
                    };
                    if repo.has_object(want) {
                        continue;
                    }
                    let bytes = read(blob)?;
                    let ok = gix::objs::compute_hash(repo.object_hash(), Kind::Tag, &bytes)
                        .is_ok_and(|h| h == want)
                        && gix::objs::TagRef::from_bytes(&bytes, repo.object_hash()).is_ok();
                    if ok {
                        put(repo, Kind::Tag, &bytes)?;
                    } else {
                        out.left_out.push(format!(
                            "{shown}: tag {want} of its record is not that tag: left out"
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    for (name, cap) in [
        ("config", crate::repo::CONFIG_MAX),
        ("exclude", crate::repo::CONFIG_MAX),
    ] {
        let slot = if name == "config" {
            &mut out.config
        } else {
            &mut out.exclude
        };
        if slot.as_ref().is_some_and(|b| b.len() as u64 > cap) {
            *slot = None;
            out.left_out.push(format!(
                "{shown}: its .git/{name} is over {cap} bytes: left out"
            ));
        }
    }
    if trust == super::repo_config::Trust::Foreign
        && let Some(config) = out.config.take()
    {
        let f = super::repo_config::filter(&config);
        out.config = f.bytes;
        if !f.dropped.is_empty() {
            const SHOWN: usize = 24;
            let mut names = f.dropped[..f.dropped.len().min(SHOWN)].join(", ");
            if f.dropped.len() > SHOWN {
                names.push_str(&format!(" and {} more", f.dropped.len() - SHOWN));
            }
            let why = format!(
                "{shown}: its .git/config is not this owner's own from this host (the share, or another owner's thread): only keys git never runs or follows are kept; left out: {names}"
            );
            tracing::warn!(record = %record, "{why}");
            out.left_out.push(why);
        }
    }
    for slot in [&mut out.head_log, &mut out.stash_log] {
        if slot.as_ref().is_some_and(|b| b.len() as u64 > LOG_MAX) {
            *slot = None;
            out.left_out
                .push(format!("{shown}: a reflog over {LOG_MAX} bytes: left out"));
        }
    }
    let text = String::from_utf8_lossy(refs_blob.as_deref().unwrap_or_default()).into_owned();
    for line in text.lines().take(REFS_MAX) {
        let mut parts = line.split(' ');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some("symref"), Some(target), Some(name), None)
                if allowed(name) && allowed(target) =>
            {
                out.symbolic.push((name.to_string(), target.to_string()));
            }
            (Some(id), Some(name), None, None) if allowed(name) => {
                match ObjectId::from_hex(id.as_bytes()) {
                    Ok(id) if repo.has_object(id) => {
                        let peeled = match repo.find_header(id) {
                            Ok(h) if h.kind() == Kind::Tag => repo
                                .find_object(id)
                                .ok()
                                .and_then(|o| o.peel_tags_to_end().ok())
                                .map(|o| o.id),
                            _ => None,
                        };
                        out.refs.push((name.to_string(), id, peeled));
                    }
                    _ => out.left_out.push(format!(
                        "{shown}: ref {name} names an object this mirror does not have: left out"
                    )),
                }
            }
            _ => out.left_out.push(format!(
                "{shown}: a line of its record's refs is not a ref octofs keeps ({:?}): left out",
                line.chars().take(80).collect::<String>()
            )),
        }
    }
    Ok(out)
}

impl Restore {
    /// The refs of the new `.git`: the mirror's (as planned) with the record's over them; the
    /// branch HEAD is on stays where the plan puts it.
    pub(super) fn amend(&self, plan: &mut crate::repo::RepoPlan) {
        let head = plan.branch.as_ref().map(|b| format!("refs/heads/{b}"));
        let mut refs: BTreeMap<String, (String, Option<String>)> =
            plan.refs.drain(..).map(|(n, id, p)| (n, (id, p))).collect();
        for (name, id, peeled) in &self.refs {
            if Some(name) != head.as_ref() {
                refs.insert(
                    name.clone(),
                    (id.to_string(), peeled.map(|p| p.to_string())),
                );
            }
        }
        for (name, _) in &self.symbolic {
            refs.remove(name);
        }
        plan.refs = refs.into_iter().map(|(n, (id, p))| (n, id, p)).collect();
    }

    /// Writes the record's files into the new workspace's `.git` (after `repo::seed`, before the
    /// mount): `fsmonitor` is the command this workspace's `core.fsmonitor` runs.
    pub(super) fn write(&self, core: &WorkspaceFs, fsmonitor: &str) -> Result<(), Error> {
        let put = |dirs: &[&str], name: &str, bytes: &[u8]| {
            core.put_file_quietly(dirs, name, bytes)
                .map(|_| ())
                .map_err(on_workspace(format!(
                    "cannot restore .git/{}",
                    dirs[1..]
                        .iter()
                        .chain([&name])
                        .copied()
                        .collect::<Vec<_>>()
                        .join("/")
                )))
        };
        if let Some(config) = &self.config {
            let config =
                crate::repo::replace_core_fsmonitor(config, fsmonitor, |v| v == FSMONITOR_TOKEN)
                    .unwrap_or_else(|| config.clone());
            put(&[".git"], "config", &config)?;
        }
        if let Some(exclude) = &self.exclude {
            put(&[".git", "info"], "exclude", exclude)?;
        }
        if let Some(l) = &self.head_log {
            put(&[".git", "logs"], "HEAD", l)?;
        }
        if let Some(l) = &self.stash_log {
            put(&[".git", "logs", "refs"], "stash", l)?;
        }
        for (name, target) in &self.symbolic {
            let comps: Vec<&str> = std::iter::once(".git").chain(name.split('/')).collect();
            if let Some((last, dirs)) = comps.split_last() {
                put(dirs, last, format!("ref: {target}\n").as_bytes())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_refs_outside_octomate_are_allowed() {
        for ok in [
            "refs/heads/main",
            "refs/tags/v1",
            "refs/stash",
            "refs/heads/a/b",
        ] {
            assert!(allowed(ok), "{ok}");
        }
        for bad in [
            "refs/octomate/saved",
            "refs/octomate",
            "HEAD",
            "refs/heads/../x",
            "refs/heads//x",
            "refs/heads/a b",
            "config",
            "refs/heads/x.lock",
        ] {
            assert!(!allowed(bad), "{bad}");
        }
    }

    #[test]
    fn a_trailer_names_its_record() {
        let id = ObjectId::empty_tree(gix::hash::Kind::Sha1);
        let msg = format!(
            "octofs snapshot of thread t\n\nOctofs-Head: main\n{}",
            trailer(id)
        );
        assert_eq!(record_of(msg.as_bytes()), Some(id));
        assert_eq!(record_of(b"octofs snapshot of thread t\n"), None);
    }

    /// A forged record (as a share remote may hand over) gives nothing the owner's git could not
    /// make: refs outside `refs/`, inside `refs/octomate/`, with `..`, to missing objects, and a
    /// tag whose bytes are another object's are each left out and named.
    #[test]
    fn a_forged_record_keeps_only_plain_refs_to_objects_the_mirror_has() {
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let empty = put_tree(&repo, vec![]).unwrap();
        let c = snap::write_commit(&repo, empty, vec![], "base\n").unwrap();
        let missing = ObjectId::from_hex(b"1234567890123456789012345678901234567890").unwrap();
        let refs = format!(
            "{c} refs/heads/ok\n{c} refs/octomate/threads/x\n{c} refs/heads/../../evil\n\
             {c} HEAD\nsymref refs/heads/ok refs/remotes/u/HEAD\nsymref ../x refs/heads/s\n\
             {missing} refs/heads/gone\nnot a ref at all\n"
        );
        let forged_tag = put(&repo, Kind::Blob, b"object 0\ntype commit\n").unwrap();
        let tags = put_tree(
            &repo,
            vec![entry(&missing.to_string(), EntryKind::Blob, forged_tag)],
        )
        .unwrap();
        let tree = put_tree(
            &repo,
            vec![
                entry(
                    "refs",
                    EntryKind::Blob,
                    put(&repo, Kind::Blob, refs.as_bytes()).unwrap(),
                ),
                entry("tags", EntryKind::Tree, tags),
            ],
        )
        .unwrap();
        let record = snap::write_commit(&repo, tree, vec![c], "record\n").unwrap();
        let r = load(
            &repo,
            record,
            "snapshot x",
            crate::daemon::repo_config::Trust::Own,
        )
        .unwrap();
        assert_eq!(r.refs, vec![("refs/heads/ok".to_string(), c, None)]);
        assert_eq!(
            r.symbolic,
            vec![(
                "refs/remotes/u/HEAD".to_string(),
                "refs/heads/ok".to_string()
            )]
        );
        assert_eq!(r.left_out.len(), 7, "{:?}", r.left_out);
        assert!(!repo.has_object(missing), "a forged tag reached the mirror");
        assert!(r.left_out.iter().all(|w| !w.contains('\n')));
    }

    /// The same record's config: byte for byte when it is the owner's own, its allowlisted keys
    /// only (and one warning naming the rest) when it is not.
    #[test]
    fn a_foreign_record_s_config_keeps_only_allowlisted_keys() {
        use crate::daemon::repo_config::Trust;
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let config = b"[user]\n\tname = A\n[core]\n\tpager = touch /tmp/x\n[alias]\n\tx = !sh\n";
        let tree = put_tree(
            &repo,
            vec![entry(
                "config",
                EntryKind::Blob,
                put(&repo, Kind::Blob, config).unwrap(),
            )],
        )
        .unwrap();
        let record = snap::write_commit(&repo, tree, vec![], "record\n").unwrap();
        let own = load(&repo, record, "snapshot x", Trust::Own).unwrap();
        assert_eq!(own.config.as_deref(), Some(&config[..]));
        assert!(own.left_out.is_empty());
        let foreign = load(&repo, record, "snapshot x", Trust::Foreign).unwrap();
        assert_eq!(
            foreign.config.as_deref(),
            Some(&b"[user]\n\tname = A\n"[..])
        );
        assert_eq!(foreign.left_out.len(), 1, "{:?}", foreign.left_out);
        let w = &foreign.left_out[0];
        assert!(
            !w.contains('\n') && w.contains("core.pager, alias.x"),
            "{w}"
        );
    }

    #[test]
    fn a_long_reflog_keeps_its_newest_whole_lines() {
        let line = format!("{} {} a <a@b> 1 +0000\tx\n", "0".repeat(40), "1".repeat(40));
        let n = (LOG_MAX as usize / line.len()) + 10;
        let log = line.repeat(n).into_bytes();
        let t = tail(log);
        assert!(t.len() as u64 <= LOG_MAX);
        assert!(t.starts_with(b"0000"));
        assert_eq!(t.len() % line.len(), 0);
    }
}
