//! The workspace's own git repository: the `.git` every workspace gets at fork (docs/architecture.md "The
//! workspace's own repository").
//!
//! It is written into the workspace's upper layer before the first mount and costs O(1) per fork:
//! a handful of small files, the mirror's refs (without `refs/octomate/*`), `objects/info/alternates`
//! holding `../octofs/objects`, the mirror's object store as the mount presents it (reads only; every
//! new object is written inside the workspace; `fs::objects`), and an index shared by every fork of the same base, built once per base commit with
//! stat data equal to what the mount presents, so the first `git status` re-hashes nothing. The
//! config enables `core.fsmonitor` (answered by the daemon from the workspace's change journal) and
//! `core.untrackedCache`. The fsmonitor command is the small hook program `octofs-fsmonitor`
//! through the link `<state>/fsmonitor-<thread>` that planning makes, a path git execs without a
//! shell; `octofs fsmonitor` with quoted arguments when that cannot be.
//!
//! Reads the mirror (refs, objects), never writes it.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::fs::{BASE_TOKEN, BaseStat, Presentation, ROOT_INO, WorkspaceFs, base_stat};
use crate::git::mirror::{Project, UpstreamKind};
use crate::git::objects::EntryKind;
use crate::git::objects::ObjectStore;
use crate::layout::Layout;

/// Why the `.git` of a new workspace, or the shared index it starts with, could not be made.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The project's mirror could not be opened.
    #[error("cannot open the mirror {}: {source}", path.display())]
    OpenMirror {
        path: PathBuf,
        #[source]
        source: gix::Error,
    },
    /// The mirror's refs could not be listed.
    #[error("cannot list the mirror's refs: {source}")]
    ListRefs {
        #[source]
        source: gix::Error,
    },
    /// The directory of the shared indexes could not be created.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The index of a tree could not be built from the mirror's objects.
    #[error("cannot build the index of {tree}: {source}")]
    BuildIndex {
        tree: gix::ObjectId,
        #[source]
        source: gix::Error,
    },
    /// The tree a resumed workspace presents could not be read.
    #[error("cannot read tree {tree}: {source}")]
    ReadTree {
        tree: gix::ObjectId,
        #[source]
        source: gix::Error,
    },
    /// The size of a blob (for the stat data of its index entry) could not be read.
    #[error("cannot read the size of {id}: {source}")]
    BlobSize {
        id: gix::ObjectId,
        #[source]
        source: std::io::Error,
    },
    /// The index could not be serialized.
    #[error("cannot write the shared index: {source}")]
    EncodeIndex {
        #[source]
        source: gix::Error,
    },
    /// The index serialized is shorter than its header and checksum: nothing to extend.
    #[error("the index is too short")]
    IndexTooShort,
    /// The shared index could not be written to its file under `<state>/indexes/`.
    #[error("cannot write the shared index: {source}")]
    WriteIndex {
        #[source]
        source: std::io::Error,
    },
    /// A file or directory of the workspace's `.git` could not be created in its upper layer.
    #[error("cannot create .git/{what}: {source}")]
    Seed {
        what: String,
        #[source]
        source: crate::fs::FsError,
    },
}

/// Everything the `.git` of one new workspace is made of.
#[derive(Debug, Clone)]
pub struct RepoPlan {
    /// The branch HEAD is on (`None`: HEAD is detached at `head_commit`).
    pub branch: Option<String>,
    pub head_commit: String,
    /// `origin`'s URL, credentials removed; `None` for a directory upstream.
    pub origin: Option<String>,
    /// The upstream branch `branch` tracks, when it is one.
    pub track: Option<String>,
    pub mirror_objects: PathBuf,
    /// (ref name, object id, peeled object id of an annotated tag)
    pub refs: Vec<(String, String, Option<String>)>,
    /// The target of `refs/remotes/origin/HEAD`, when the mirror has one.
    pub origin_head: Option<String>,
    /// The command `core.fsmonitor` runs.
    pub fsmonitor: String,
    /// `.git/octomate-installed`: the dependency layers the workspace presents, one line each
    /// (`<manager> <path> <lockfile hash>`); `None` without layers.
    pub installed: Option<String>,
    /// The work tree's real path (its mount point), which git's untracked cache names.
    pub worktree: PathBuf,
}

/// Removes `user:password@` from a URL: credentials belong to the daemon, never to a workspace.
pub fn strip_credentials(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if let Some((user, host)) = authority.rsplit_once('@') {
            // Over http(s) the user part is a token or a password; elsewhere (ssh) a bare user
            // name is not a secret and is needed to connect.
            if scheme.starts_with("http") || user.contains(':') {
                return format!("{scheme}://{host}{path}");
            }
        }
    }
    url.to_string()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The characters that make git run a hook command through `/bin/sh -c` (git's `run-command.c`,
/// `prepare_shell_cmd`); a command with none of them is exec'd directly.
const SHELL_METACHARS: &str = "|&;<>()$`\\\"' \t\n*?[#~=%";

/// The fsmonitor hook program, installed beside `octofs`.
pub const FSMONITOR_HOOK: &str = "octofs-fsmonitor";

/// The command `core.fsmonitor` runs in `thread`'s workspace. Normally the hook program through
/// its link `<state>/fsmonitor-<thread>` (made here, pointing at the program beside `exe`): git
/// execs it directly, without a shell, and it starts in a fraction of `octofs`'s time. When there
/// is no hook program beside `exe`, the link cannot be made, or its path holds a character that
/// would make git start a shell anyway, `octofs fsmonitor` with its arguments quoted for that shell.
pub fn fsmonitor_command(layout: &Layout, thread: &str, exe: &Path) -> String {
    match fsmonitor_link(layout, thread, exe) {
        Ok(Some(link)) => return link,
        Ok(None) => {}
        Err(e) => tracing::warn!(
            %thread,
            "cannot link the fsmonitor hook (git runs `octofs fsmonitor` instead): {e}"
        ),
    }
    format!(
        "{} --state {} --root {} fsmonitor {}",
        shell_quote(&exe.to_string_lossy()),
        shell_quote(&layout.state.to_string_lossy()),
        shell_quote(&layout.root.to_string_lossy()),
        thread
    )
}

/// Brings an existing workspace's `core.fsmonitor` up to date when it is mounted again: the link
/// `<state>/fsmonitor-<thread>` is pointed at the hook program beside `exe` (this daemon's binary),
/// and a `.git/config` that still names a command octofs wrote earlier — `<octofs> --state …
/// fsmonitor <thread>` from before the hook program, whose binary may have moved or gone since, or
/// the link when there is no hook program now — gets the current command ([`fsmonitor_command`])
/// in that line. Every other line, and any other value (the owner's own choice), is left as it is.
/// Reads the config through the core (no symlink followed) and replaces it the way git does, in
/// one step. Returns whether it was rewritten.
pub fn refresh_fsmonitor(
    core: &WorkspaceFs,
    layout: &Layout,
    thread: &str,
    exe: &Path,
) -> Result<bool, Error> {
    let cmd = fsmonitor_command(layout, thread, exe);
    let e = |source| Error::Seed {
        what: "config".into(),
        source,
    };
    // A config too large to be one octofs wrote is left as it is, unread.
    let Some(config) = workspace_config_bytes(core).map_err(e)? else {
        return Ok(false);
    };
    let ours = |value: &str| octofs_fsmonitor(layout, thread, value);
    let Some(updated) = replace_core_fsmonitor(&config, &cmd, ours) else {
        return Ok(false);
    };
    core.put_file_quietly(&[".git"], "config", &updated)
        .map_err(e)?;
    Ok(true)
}

/// Whether `value` of `core.fsmonitor` is a command octofs wrote for `thread`: the link
/// `<state>/fsmonitor-<thread>`, or `<octofs> --state … --root … fsmonitor <thread>`.
pub fn octofs_fsmonitor(layout: &Layout, thread: &str, value: &str) -> bool {
    value == layout.fsmonitor_link(thread).to_string_lossy()
        || (value.ends_with(&format!(" fsmonitor {thread}"))
            && value.contains(" --state ")
            && value.contains(" --root ")
            && value
                .split(' ')
                .next()
                .is_some_and(|exe| exe.trim_end_matches('\'').ends_with("octofs")))
}

/// The largest `.git/config` the daemon reads (bigger ones are not a git config).
pub const CONFIG_MAX: u64 = 1 << 20;

/// The bytes of the workspace's `.git/config` (the agent controls it), read through the core (no
/// symlink followed, only a regular file): `None` when there is none, or it is larger than
/// [`CONFIG_MAX`] — a sparse one of gigabytes costs the agent nothing and must not cost the daemon
/// its memory.
pub fn workspace_config_bytes(core: &WorkspaceFs) -> Result<Option<Vec<u8>>, crate::fs::FsError> {
    use std::io::Read as _;
    let Some(f) = core.open_file(&[b".git", b"config"])? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    f.take(CONFIG_MAX + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= CONFIG_MAX).then_some(bytes))
}

/// `config` with the value of `core.fsmonitor` replaced by `cmd` where `ours` says octofs wrote
/// it; `None` when nothing changes. Only the simple `key = value` lines octofs writes are
/// considered (a value with quotes, escapes or a continuation is the owner's).
pub fn replace_core_fsmonitor(
    config: &[u8],
    cmd: &str,
    ours: impl Fn(&str) -> bool,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(config.len() + cmd.len());
    let mut section_core = false;
    let mut changed = false;
    for line in config.split_inclusive(|b| *b == b'\n') {
        let text = std::str::from_utf8(line).unwrap_or("");
        let body = text.trim();
        if let Some(rest) = body.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or("").trim();
            section_core = name.eq_ignore_ascii_case("core");
        } else if section_core
            && let Some((key, value)) = body.split_once('=')
            && key.trim().eq_ignore_ascii_case("fsmonitor")
        {
            let value = value.trim();
            if value != cmd && !value.contains(['"', '\\', ';', '#']) && ours(value) {
                out.extend_from_slice(format!("\tfsmonitor = {cmd}\n").as_bytes());
                changed = true;
                continue;
            }
        }
        out.extend_from_slice(line);
    }
    changed.then_some(out)
}

/// Makes `<state>/fsmonitor-<thread>` a link to the hook program beside `exe` (replaced in one
/// step when it pointed elsewhere) and returns its path; `None` when the path would need a shell
/// or there is no hook program to link to.
fn fsmonitor_link(layout: &Layout, thread: &str, exe: &Path) -> std::io::Result<Option<String>> {
    use std::os::unix::fs::PermissionsExt;
    let link = layout.fsmonitor_link(thread);
    let Some(text) = link.to_str() else {
        return Ok(None);
    };
    if !link.is_absolute() || text.contains(|c| SHELL_METACHARS.contains(c)) {
        return Ok(None);
    }
    let Some(hook) = exe.parent().map(|d| d.join(FSMONITOR_HOOK)) else {
        return Ok(None);
    };
    match std::fs::metadata(&hook) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        _ => return Ok(None),
    }
    if std::fs::read_link(&link).is_ok_and(|t| t == hook) {
        return Ok(Some(text.to_string()));
    }
    // Beside the link, then renamed over it: git never finds it missing or half made. The
    // thread's lock keeps two plans of one thread apart; the pid keeps two daemons apart.
    let tmp = layout
        .state
        .join(format!(".fsmonitor-{thread}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&hook, &tmp)?;
    if let Err(e) = std::fs::rename(&tmp, &link) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(Some(text.to_string()))
}

/// Whether a workspace presents the mirror's ref `name` (its tags, and its upstream's branches:
/// `refs/remotes/origin/*` when the project has an origin, else `refs/heads/*`).
pub fn presented(name: &str, has_origin: bool) -> bool {
    !name.starts_with("refs/octomate/")
        && (name.starts_with("refs/tags/")
            || (has_origin && name.starts_with("refs/remotes/origin/"))
            || (!has_origin && name.starts_with("refs/heads/")))
}

/// Plans the `.git` of a new workspace of `project` with HEAD at `head_commit`, on `branch` (or
/// detached), from `repo`, the project's mirror (the daemon's open handle: its refs are read
/// from disk at each call).
pub fn plan(
    repo: &gix::Repository,
    layout: &Layout,
    project: &Project,
    thread: &str,
    head_commit: &str,
    branch: Option<&str>,
    exe: &Path,
) -> Result<RepoPlan, Error> {
    let mirror = layout.mirror(&project.project);
    let has_origin = project.kind != UpstreamKind::Directory;
    let keep = |name: &str| presented(name, has_origin);
    let listed = mirror_refs(repo)?;
    let origin_head = listed.symbolic.into_iter().find_map(|(name, target)| {
        (name == "refs/remotes/origin/HEAD" && keep(&name)).then_some(target)
    });
    let mut refs: Vec<(String, String, Option<String>)> = listed
        .direct
        .into_iter()
        .filter(|(name, _, _)| keep(name))
        .map(|(name, id, peeled)| (name, id.to_string(), peeled.map(|p| p.to_string())))
        .collect();
    if let Some(branch) = branch {
        let head_ref = format!("refs/heads/{branch}");
        refs.retain(|(n, _, _)| *n != head_ref);
        refs.push((head_ref, head_commit.to_string(), None));
    }
    refs.sort();
    let track = branch.filter(|b| {
        has_origin
            && refs
                .iter()
                .any(|(n, _, _)| *n == format!("refs/remotes/origin/{b}"))
    });
    let fsmonitor = fsmonitor_command(layout, thread, exe);
    Ok(RepoPlan {
        branch: branch.map(str::to_string),
        head_commit: head_commit.to_string(),
        origin: has_origin.then(|| strip_credentials(&project.upstream)),
        track: track.map(str::to_string),
        mirror_objects: mirror.join(".git").join("objects"),
        refs,
        origin_head,
        fsmonitor,
        installed: None,
        worktree: std::fs::canonicalize(&layout.root)
            .unwrap_or_else(|_| layout.root.clone())
            .join(thread),
    })
}

/// A repository's refs under `refs/`, read in process (what `git for-each-ref` lists).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MirrorRefs {
    /// (name, object id, the object an annotated tag peels to), sorted by name.
    pub direct: Vec<(String, gix::ObjectId, Option<gix::ObjectId>)>,
    /// (name, target name) of every symbolic ref, sorted by name.
    pub symbolic: Vec<(String, String)>,
}

/// Lists the refs of `repo` (loose and packed) with gix: no `git for-each-ref` subprocess on the
/// open path. A tag object is peeled to the first object that is not a tag (what `packed-refs`
/// calls fully peeled); packed-refs' own peeled ids are used when present, so only loose refs cost
/// an object lookup. A ref whose object is missing is listed without a peeled id.
pub fn mirror_refs(repo: &gix::Repository) -> Result<MirrorRefs, Error> {
    let err = |source| Error::ListRefs { source };
    let platform = repo.references().map_err(err)?;
    let mut out = MirrorRefs::default();
    for r in platform.all().map_err(err)? {
        let r = r.map_err(err)?;
        let name = r.name().as_bstr().to_string();
        if !name.starts_with("refs/") {
            continue;
        }
        match r.target() {
            gix::refs::TargetRef::Symbolic(target) => {
                out.symbolic.push((name, target.as_bstr().to_string()));
            }
            gix::refs::TargetRef::Object(id) => {
                let id = id.to_owned();
                let peeled = match r.inner.peeled {
                    Some(p) => Some(p),
                    None => match repo.find_header(id) {
                        Ok(h) if h.kind() == gix::object::Kind::Tag => repo
                            .find_object(id)
                            .ok()
                            .and_then(|o| o.peel_tags_to_end().ok())
                            .map(|o| o.id),
                        _ => None,
                    },
                };
                out.direct.push((name, id, peeled.filter(|p| *p != id)));
            }
        }
    }
    out.direct.sort();
    out.symbolic.sort();
    Ok(out)
}

/// The index of `index_tree` for a workspace whose files are `worktree_tree`, presented to owner
/// `uid`/`gid` with base time `time`: an entry whose blob and mode are the same in both trees gets
/// exactly the stat data the mount presents (git re-reads nothing); any other gets none, so git
/// compares its content. Built once per (trees, owner) under `<state>/indexes/` and shared by every
/// fork: a fresh fork has `index_tree == worktree_tree`; a resumed one indexes HEAD's tree over its
/// snapshot's files, so uncommitted work reads as uncommitted.
pub fn shared_index(
    layout: &Layout,
    store: &ObjectStore,
    index_tree: gix::ObjectId,
    worktree_tree: gix::ObjectId,
    time: i64,
    uid: u32,
    gid: u32,
) -> Result<PathBuf, Error> {
    let path = shared_index_path(layout, index_tree, worktree_tree, uid, gid);
    let dir = layout.state.join("indexes");
    let key = format!("{index_tree}-{worktree_tree}-{uid}-{gid}");
    if path.exists() {
        return Ok(path);
    }
    crate::layout::create_private_dir(&dir).map_err(|source| Error::CreateDir {
        dir: dir.clone(),
        source,
    })?;
    let repo = crate::git::open_owned(store.path()).map_err(|source| Error::OpenMirror {
        path: store.path().to_path_buf(),
        source,
    })?;
    let mut index = repo
        .index_from_tree(&index_tree)
        .map_err(|source| Error::BuildIndex {
            tree: index_tree,
            source,
        })?;
    let worktree: std::collections::HashMap<Vec<u8>, (gix::ObjectId, gix::index::entry::Mode)> =
        if worktree_tree == index_tree {
            Default::default()
        } else {
            let w = repo
                .index_from_tree(&worktree_tree)
                .map_err(|source| Error::ReadTree {
                    tree: worktree_tree,
                    source,
                })?;
            w.entries()
                .iter()
                .map(|e| (e.path(&w).to_vec(), (e.id, e.mode)))
                .collect()
        };
    let pres = Presentation {
        uid,
        gid,
        time: crate::fs::unix_time(time),
    };
    // The file bytes of the tree (`serve --io auto` weighs a base by them): summed here, where
    // every blob's size is read anyway, and kept beside the index.
    let mut file_bytes: u64 = 0;
    for (entry, path) in index.entries_mut_with_paths() {
        let same_in_worktree = worktree_tree == index_tree
            || worktree
                .get(path.as_ref() as &[u8])
                .is_some_and(|(id, mode)| *id == entry.id && *mode == entry.mode);
        // A gitlink is presented as a directory, which git never compares with its index entry.
        if !same_in_worktree || entry.mode == gix::index::entry::Mode::COMMIT {
            entry.stat = gix::index::entry::Stat::default();
            continue;
        }
        let kind = if entry.mode == gix::index::entry::Mode::FILE_EXECUTABLE {
            EntryKind::Executable
        } else if entry.mode == gix::index::entry::Mode::SYMLINK {
            EntryKind::Symlink
        } else {
            EntryKind::Blob
        };
        let st = base_stat(store, &pres, path.as_ref(), kind, entry.id).map_err(|source| {
            Error::BlobSize {
                id: entry.id,
                source,
            }
        })?;
        file_bytes = file_bytes.saturating_add(st.size);
        entry.stat = index_stat(&st);
    }
    // A fresh fork's directories hold no untracked file: git's untracked cache can say so, and the
    // first `git status` then lists no directory (see `seed`). Kept beside the index, read-only.
    let untracked = (worktree_tree == index_tree).then(|| untracked_tail(store, &index, &pres));
    // The cache tree of the index (it holds exactly `index_tree`), for every fork's small index.
    let cache_tree = crate::git::index_ext::cache_tree(index_tree, &mut |id| {
        let tree = repo.find_tree(id)?;
        let decoded = tree.decode()?;
        Ok::<_, gix::Error>(
            decoded
                .entries
                .iter()
                .map(|e| (e.filename.to_vec(), e.mode.is_tree(), e.oid.to_owned()))
                .collect(),
        )
    })
    .map_err(|source| Error::ReadTree {
        tree: index_tree,
        source,
    })?;
    let bytes = crate::git::checksum::index_file(
        &index,
        gix::index::write::Options {
            extensions: gix::index::write::Extensions::None,
            ..Default::default()
        },
    )
    .map_err(|source| Error::EncodeIndex { source })?;
    if bytes.len() < 32 {
        return Err(Error::IndexTooShort);
    }
    for (side, tail) in [
        (untracked_tail_path(&path), untracked),
        (cache_tree_path(&path), Some(cache_tree)),
        (
            bytes_path(&path),
            Some(format!("{file_bytes}\n").into_bytes()),
        ),
    ] {
        let Some(tail) = tail else { continue };
        let written = (|| -> std::io::Result<()> {
            if let Some(d) = side.parent() {
                crate::layout::create_private_dir(d)?;
            }
            let tmp = side.with_file_name(format!(".tmp-{key}-{}", std::process::id()));
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&tail)?;
            f.sync_all()?;
            std::fs::set_permissions(
                &tmp,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o400),
            )?;
            std::fs::rename(&tmp, &side)
        })();
        if let Err(source) = written {
            return Err(Error::WriteIndex { source });
        }
    }
    let tmp = dir.join(format!(".tmp-{key}-{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.flush()?;
        f.sync_all()?;
        let mut perms = f.metadata()?.permissions();
        // Read-only, and the daemon's only: it lists every path of the project.
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o400);
        std::fs::set_permissions(&tmp, perms)?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::WriteIndex { source });
    }
    Ok(path)
}

/// Where [`shared_index`] keeps the index of (`index_tree`, `worktree_tree`) for owner `uid`/`gid`.
pub fn shared_index_path(
    layout: &Layout,
    index_tree: gix::ObjectId,
    worktree_tree: gix::ObjectId,
    uid: u32,
    gid: u32,
) -> PathBuf {
    // `.split`: written as a split index's shared part (no extensions of its own), with its
    // untracked-cache tail beside it; indexes of earlier versions (with an fsmonitor extension) are
    // not used.
    layout
        .state
        .join("indexes")
        .join(format!("{index_tree}-{worktree_tree}-{uid}-{gid}.split"))
}

/// Where [`shared_index`] keeps the cache tree (`TREE` payload) of the index at `index`.
fn cache_tree_path(index: &Path) -> PathBuf {
    let name = index.file_name().unwrap_or_default();
    index
        .parent()
        .unwrap_or(Path::new("."))
        .join("cachetree")
        .join(name)
}

/// Where [`shared_index`] keeps the file bytes of the index at `index` (the sizes of its blobs,
/// as decimal text).
fn bytes_path(index: &Path) -> PathBuf {
    let name = index.file_name().unwrap_or_default();
    index
        .parent()
        .unwrap_or(Path::new("."))
        .join("bytes")
        .join(name)
}

/// The file bytes of the tree of the shared index at `index` (the sum of its blobs' sizes, as the
/// mount presents them): from the number kept beside it, else (an index built before it was kept)
/// summed from the index's entries once and kept. Reads no blob. None: no such index.
pub fn index_bytes(index: &Path) -> Option<u64> {
    let side = bytes_path(index);
    if let Some(n) = std::fs::read_to_string(&side)
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return Some(n);
    }
    let file = gix::index::File::at(
        index,
        gix::hash::Kind::Sha1,
        false,
        gix::index::decode::Options::default(),
    )
    .ok()?;
    let n = file
        .entries()
        .iter()
        .fold(0u64, |a, e| a.saturating_add(u64::from(e.stat.size)));
    // Kept for the next mount; a failure only means summing again.
    let _ = (|| -> std::io::Result<()> {
        if let Some(d) = side.parent() {
            crate::layout::create_private_dir(d)?;
        }
        let tmp = side.with_file_name(format!(".tmp-bytes-{}", std::process::id()));
        std::fs::write(&tmp, format!("{n}\n"))?;
        std::fs::rename(&tmp, &side)
    })();
    Some(n)
}

/// Where [`shared_index`] keeps the untracked cache (after its ident) of the index at `index`.
fn untracked_tail_path(index: &Path) -> PathBuf {
    let name = index.file_name().unwrap_or_default();
    index
        .parent()
        .unwrap_or(Path::new("."))
        .join("untracked")
        .join(name)
}

/// The untracked cache of a fresh fork of `index`'s tree, after its ident: every directory of the
/// tree (those git lists for `git status`), with the stat data the mount presents and its
/// `.gitignore`'s id, none holding an untracked file.
fn untracked_tail(store: &ObjectStore, index: &gix::index::File, pres: &Presentation) -> Vec<u8> {
    use crate::git::index_ext::{CachedDir, StatData};
    let null = gix::ObjectId::null(gix::hash::Kind::Sha1);
    let stat = |path: &[u8]| {
        // A directory's presented stat reads no object (its size is fixed).
        let s = base_stat(store, pres, path, EntryKind::Tree, null)
            .map(|st| index_stat(&st))
            .unwrap_or_default();
        StatData {
            ctime: (s.ctime.secs, s.ctime.nsecs),
            mtime: (s.mtime.secs, s.mtime.nsecs),
            dev: 0,
            ino: s.ino,
            uid: s.uid,
            gid: s.gid,
            size: s.size,
        }
    };
    let mut root = CachedDir::new(Vec::new(), stat(b""));
    for e in index.entries() {
        let path: &[u8] = e.path(index).as_ref();
        let Some(slash) = path.iter().rposition(|b| *b == b'/') else {
            if path == b".gitignore" && e.mode == gix::index::entry::Mode::FILE {
                root.gitignore = Some(e.id.as_bytes().try_into().unwrap_or([0; 20]));
            }
            continue;
        };
        let (dir, name) = (&path[..slash], &path[slash + 1..]);
        let mut cur = &mut root;
        let mut end = 0;
        for comp in dir.split(|b| *b == b'/') {
            end += comp.len();
            cur = cur.child(comp, || stat(&dir[..end]));
            end += 1;
        }
        if name == b".gitignore" && e.mode == gix::index::entry::Mode::FILE {
            cur.gitignore = Some(e.id.as_bytes().try_into().unwrap_or([0; 20]));
        }
    }
    crate::git::index_ext::untracked_tail(&root)
}

/// The index stat data of a base entry presented as `st`: what git finds when it `lstat`s the file
/// through the mount (git keeps 32 bits of each field and compares only those).
pub fn index_stat(st: &BaseStat) -> gix::index::entry::Stat {
    let time = gix::index::entry::stat::Time {
        secs: st.time.0.clamp(0, u32::MAX as i64) as u32,
        nsecs: st.time.1,
    };
    gix::index::entry::Stat {
        mtime: time,
        ctime: time,
        dev: 0,
        ino: st.ino as u32,
        uid: st.uid,
        gid: st.gid,
        size: st.size as u32,
    }
}

/// Writes the `.git` of `plan` into a new workspace (before it is mounted).
pub fn seed(
    core: &WorkspaceFs,
    plan: &RepoPlan,
    index: &Path,
    base_time: i64,
) -> Result<(), Error> {
    let head = match &plan.branch {
        Some(b) => format!("ref: refs/heads/{b}\n"),
        None => format!("{}\n", plan.head_commit),
    };
    let e = |what: &str| {
        let what = what.to_string();
        move |source: crate::fs::FsError| Error::Seed { what, source }
    };
    if core.exists(ROOT_INO, ".git").map_err(e(""))? {
        // The base commit itself has a `.git` entry: leave it as the tree has it.
        return Ok(());
    }
    let git = core.seed_dir(ROOT_INO, ".git", 0o755).map_err(e(""))?;
    core.seed_file(git, "HEAD", head.as_bytes(), 0o644)
        .map_err(e("HEAD"))?;
    let mut config = String::from(
        "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n",
    );
    config.push_str(&format!(
        "\tfsmonitor = {}\n\tfsmonitorHookVersion = 2\n",
        plan.fsmonitor
    ));
    config.push_str("\tuntrackedCache = true\n");
    if let Some(url) = &plan.origin {
        config.push_str(&format!(
            "[remote \"origin\"]\n\turl = {url}\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
        ));
    }
    if let Some(b) = &plan.track {
        config.push_str(&format!(
            "[branch \"{b}\"]\n\tremote = origin\n\tmerge = refs/heads/{b}\n"
        ));
    }
    core.seed_file(git, "config", config.as_bytes(), 0o644)
        .map_err(e("config"))?;
    core.seed_file(
        git,
        "description",
        b"Unnamed repository; edit this file 'description' to name the repository.\n",
        0o644,
    )
    .map_err(e("description"))?;
    let mut packed = String::from("# pack-refs with: peeled fully-peeled sorted \n");
    for (name, oid, peeled) in &plan.refs {
        packed.push_str(&format!("{oid} {name}\n"));
        if let Some(p) = peeled {
            packed.push_str(&format!("^{p}\n"));
        }
    }
    core.seed_file(git, "packed-refs", packed.as_bytes(), 0o644)
        .map_err(e("packed-refs"))?;
    let refs = core.seed_dir(git, "refs", 0o755).map_err(e("refs"))?;
    core.seed_dir(refs, "heads", 0o755)
        .map_err(e("refs/heads"))?;
    core.seed_dir(refs, "tags", 0o755).map_err(e("refs/tags"))?;
    if let Some(target) = &plan.origin_head {
        let remotes = core
            .seed_dir(refs, "remotes", 0o755)
            .map_err(e("refs/remotes"))?;
        let origin = core
            .seed_dir(remotes, "origin", 0o755)
            .map_err(e("refs/remotes/origin"))?;
        core.seed_file(origin, "HEAD", format!("ref: {target}\n").as_bytes(), 0o644)
            .map_err(e("refs/remotes/origin/HEAD"))?;
    }
    let objects = core.seed_dir(git, "objects", 0o755).map_err(e("objects"))?;
    core.seed_dir(objects, "pack", 0o755)
        .map_err(e("objects/pack"))?;
    let info = core
        .seed_dir(objects, "info", 0o755)
        .map_err(e("objects/info"))?;
    core.seed_file(
        info,
        "alternates",
        format!("{}\n", crate::fs::objects::ALTERNATE).as_bytes(),
        0o644,
    )
    .map_err(e("objects/info/alternates"))?;
    let ginfo = core.seed_dir(git, "info", 0o755).map_err(e("info"))?;
    core.seed_file(ginfo, "exclude", b"", 0o644)
        .map_err(e("info/exclude"))?;
    if let Some(stamp) = &plan.installed {
        core.seed_file(git, "octomate-installed", stamp.as_bytes(), 0o644)
            .map_err(e("octomate-installed"))?;
    }
    // A split index: the shared part (every entry, one file per base and owner, shared by every
    // fork, never copied) as `sharedindex.<its hash>`, and a small `index` of this work tree that
    // names it and carries what is the workspace's own: the fsmonitor token, and for a fresh fork
    // the untracked cache, whose ident is the mount point.
    let shared_hash = index_hash(index).map_err(|source| Error::WriteIndex { source })?;
    let shared_name = format!("sharedindex.{}", gix::ObjectId::from(shared_hash));
    let shared_ino = core
        .seed_shared(git, &shared_name, index, 0o644)
        .map_err(e(&shared_name))?;
    let fsmonitor = crate::git::index_ext::fsmonitor_payload(BASE_TOKEN);
    let parts = small_index_parts(index, &shared_hash);
    // The untracked cache's ident is the mount point: this fork's own, before the shared tail.
    let ident = crate::git::index_ext::untracked_ident(&plan.worktree, &system_name());
    let mut ident_len = Vec::new();
    crate::git::index_ext::put_varint(&mut ident_len, ident.len() as u64);
    let untracked: Option<[&[u8]; 3]> = parts
        .untracked
        .as_deref()
        .map(|tail| [&ident_len[..], &ident[..], tail]);
    let mut extensions: Vec<(&[u8; 4], &[&[u8]])> = Vec::new();
    if let Some(u) = &untracked {
        extensions.push((b"UNTR", u));
    }
    let fsmonitor_parts = [&fsmonitor[..]];
    extensions.push((b"FSMN", &fsmonitor_parts));
    let small = parts.head.finish(&extensions);
    let index_ino = core
        .seed_file(git, "index", &small, 0o644)
        .map_err(e("index"))?;
    // git treats entries whose mtime is not older than the index as "racily clean" and re-reads
    // them: the index must look newer than the base.
    let now = std::time::SystemTime::now();
    let after_base = crate::fs::unix_time(base_time + 1);
    let stamp = if after_base > now { after_base } else { now };
    for ino in [shared_ino, index_ino] {
        core.setattr(
            ino,
            crate::fs::SetAttr {
                mtime: Some(crate::fs::SetTime::At(stamp)),
                atime: Some(crate::fs::SetTime::At(stamp)),
                ..Default::default()
            },
        )
        .map_err(e("index"))?;
    }
    Ok(())
}

/// What every fork's small index of one shared index repeats: its head (header, link, cache tree;
/// checksummed already) and the untracked cache's tail. Read from `<state>/indexes` once per
/// shared index and kept in memory for the last few: a fork then reads neither file and
/// checksums and copies only what is its own.
struct SmallIndexParts {
    head: crate::git::index_ext::SplitIndexHead,
    untracked: Option<Vec<u8>>,
}

/// How many shared indexes' [`SmallIndexParts`] the daemon keeps (each about the size of the
/// small index: ~280 KB for a 100,000-file base).
const SMALL_INDEX_PARTS_KEPT: usize = 8;

/// The kept [`SmallIndexParts`], by shared index path and its trailing hash, most recent last.
#[allow(clippy::type_complexity)]
static SMALL_INDEX_PARTS: std::sync::Mutex<
    Vec<(PathBuf, [u8; 20], std::sync::Arc<SmallIndexParts>)>,
> = std::sync::Mutex::new(Vec::new());

/// The [`SmallIndexParts`] of the shared index at `index`, whose trailing hash is `shared` (a
/// shared index rebuilt with other content has another hash, so nothing stale is ever used).
fn small_index_parts(index: &Path, shared: &[u8; 20]) -> std::sync::Arc<SmallIndexParts> {
    let kept = || SMALL_INDEX_PARTS.lock().unwrap_or_else(|p| p.into_inner());
    {
        let mut k = kept();
        if let Some(at) = k.iter().position(|(p, h, _)| p == index && h == shared) {
            let e = k.remove(at);
            let parts = e.2.clone();
            k.push(e);
            return parts;
        }
    }
    // Absent for a shared index built before cache trees were kept: git then walks HEAD's trees.
    let cache_tree = std::fs::read(cache_tree_path(index)).ok();
    let mut fixed: Vec<(&[u8; 4], &[u8])> = Vec::new();
    if let Some(t) = &cache_tree {
        fixed.push((b"TREE", t));
    }
    let parts = std::sync::Arc::new(SmallIndexParts {
        head: crate::git::index_ext::SplitIndexHead::new(shared, &fixed),
        untracked: std::fs::read(untracked_tail_path(index)).ok(),
    });
    let mut k = kept();
    k.retain(|(p, h, _)| !(p == index && h == shared));
    if k.len() >= SMALL_INDEX_PARTS_KEPT {
        k.remove(0);
    }
    k.push((index.to_path_buf(), *shared, parts.clone()));
    parts
}

/// The trailing hash of the index file at `path` (what a split index names its shared part by).
fn index_hash(path: &Path) -> std::io::Result<[u8; 20]> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::End(-20))?;
    let mut h = [0u8; 20];
    f.read_exact(&mut h)?;
    Ok(h)
}

/// The kernel's name as `uname -s` prints it (git puts it in the untracked cache's ident).
fn system_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/ostype")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "Linux".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory holding an `octofs` and, with `hook`, an executable `octofs-fsmonitor`; the
    /// path of `octofs`.
    fn install(dir: &Path, hook: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let mut names = vec!["octofs"];
        if hook {
            names.push(FSMONITOR_HOOK);
        }
        for name in names {
            let p = dir.join(name);
            std::fs::write(&p, b"#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir.join("octofs")
    }

    /// Catches: a hook command git would run through a shell (a metacharacter in it, or arguments),
    /// a link to the wrong program, and a link left pointing at an old install.
    #[test]
    fn the_fsmonitor_hook_is_a_link_git_execs_without_a_shell() {
        let tmp = tempfile::tempdir().unwrap();
        let layout = Layout {
            state: tmp.path().join("state"),
            root: tmp.path().join("root"),
        };
        std::fs::create_dir(&layout.state).unwrap();
        let old = install(&tmp.path().join("old"), true);
        let exe = install(&tmp.path().join("bin"), true);
        let link = layout.fsmonitor_link("t-1.x");
        std::os::unix::fs::symlink(old.with_file_name(FSMONITOR_HOOK), &link).unwrap();
        let cmd = fsmonitor_command(&layout, "t-1.x", &exe);
        assert_eq!(cmd, link.to_str().unwrap());
        assert!(!cmd.contains(|c| SHELL_METACHARS.contains(c)), "{cmd}");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            exe.with_file_name(FSMONITOR_HOOK)
        );
        // Planning again keeps it; nothing is left beside it.
        assert_eq!(fsmonitor_command(&layout, "t-1.x", &exe), cmd);
        let names: Vec<_> = std::fs::read_dir(&layout.state)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["fsmonitor-t-1.x"]);
    }

    /// Catches: a rewrite of a value octofs did not write, of a key outside `[core]`, of another
    /// key, or one that loses or reorders the other lines (or their missing final newline).
    #[test]
    fn only_the_core_fsmonitor_octofs_wrote_is_replaced() {
        let ours = |v: &str| v.starts_with("OLD");
        let replace = |config: &str| {
            replace_core_fsmonitor(config.as_bytes(), "NEW", ours)
                .map(|b| String::from_utf8(b).unwrap())
        };
        let config = "[core]\n\tbare = false\n\tfsmonitor = OLD cmd\n\tfsmonitorHookVersion = 2\n\
                      [user]\n\tname = x";
        assert_eq!(
            replace(config).as_deref(),
            Some(
                "[core]\n\tbare = false\n\tfsmonitor = NEW\n\tfsmonitorHookVersion = 2\n\
                 [user]\n\tname = x"
            )
        );
        // Key names are case-insensitive in git, sections too.
        assert_eq!(
            replace("[Core]\n  FSMonitor=OLD\n").as_deref(),
            Some("[Core]\n\tfsmonitor = NEW\n")
        );
        for kept in [
            "[core]\n\tfsmonitor = false\n",
            "[core]\n\tfsmonitor = NEW\n",
            "[alias]\n\tfsmonitor = OLD\n",
            "[core]\n\tfsmonitorHookVersion = OLD\n",
            "[core]\n\tfsmonitor = \"OLD quoted\"\n",
            "[core]\n\tfsmonitor = OLD \\\n\tcontinued\n",
            "[core \"x\"]\n\tfsmonitor = OLD\n",
            "[core]\n[remote \"core\"]\n\tfsmonitor = OLD\n",
        ] {
            assert_eq!(replace(kept), None, "{kept:?}");
        }
    }

    /// Catches: a link path git would hand to `sh -c` unquoted (a state directory with a space),
    /// and a link to a hook program that is not installed.
    #[test]
    fn the_fsmonitor_hook_falls_back_to_the_quoted_octofs_command() {
        let tmp = tempfile::tempdir().unwrap();
        let exe = install(&tmp.path().join("bin"), true);
        let spaced = Layout {
            state: tmp.path().join("my state"),
            root: tmp.path().join("root"),
        };
        std::fs::create_dir(&spaced.state).unwrap();
        let cmd = fsmonitor_command(&spaced, "t", &exe);
        assert_eq!(
            cmd,
            format!(
                "'{}' --state '{}' --root '{}' fsmonitor t",
                exe.display(),
                spaced.state.display(),
                spaced.root.display()
            )
        );
        assert!(!spaced.fsmonitor_link("t").exists());
        assert_eq!(std::fs::read_dir(&spaced.state).unwrap().count(), 0);
        // No hook program beside `octofs` (an install of `octofs` alone).
        let lone = install(&tmp.path().join("lone"), false);
        let plain = Layout {
            state: tmp.path().join("state"),
            root: tmp.path().join("root"),
        };
        std::fs::create_dir(&plain.state).unwrap();
        let cmd = fsmonitor_command(&plain, "t", &lone);
        assert!(cmd.ends_with(" fsmonitor t"), "{cmd}");
        assert!(
            cmd.starts_with(&format!("'{}' --state", lone.display())),
            "{cmd}"
        );
        assert!(std::fs::symlink_metadata(plain.fsmonitor_link("t")).is_err());
    }

    #[test]
    fn credentials_never_reach_a_workspace() {
        assert_eq!(
            strip_credentials("https://user:tok@example.com/a/b.git"),
            "https://example.com/a/b.git"
        );
        assert_eq!(
            strip_credentials("https://example.com/x"),
            "https://example.com/x"
        );
        assert_eq!(strip_credentials("/srv/repo"), "/srv/repo");
        assert_eq!(
            strip_credentials("ssh://git@host:22/r"),
            "ssh://git@host:22/r"
        );
        assert_eq!(strip_credentials("ssh://git:pw@host/r"), "ssh://host/r");
    }

    /// Catches: a cache tree git does not read as its own (order of subtrees, entry counts with
    /// nested trees and a gitlink, the root's empty name): compared byte for byte with the `TREE`
    /// extension git itself writes for the same tree.
    #[test]
    fn cache_tree_is_the_one_git_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = dir.path();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args([
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .current_dir(r)
                .output()
                .expect("git runs");
            assert!(out.status.success(), "git {args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        git(&["init", "-q"]);
        for p in ["a", "b/c", "bb/x", "b/c/d", "b-c", "zz/y/w/v", "b.c"] {
            std::fs::create_dir_all(r.join(p)).expect("mkdir");
            std::fs::write(r.join(p).join("f"), p).expect("write");
        }
        std::fs::write(r.join("top"), "t").expect("write");
        git(&["add", "-A"]);
        let blob = git(&["hash-object", "-w", "top"]);
        let commit = git(&["commit-tree", &git(&["write-tree"]), "-m", "x"]);
        git(&[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{commit},zz/sub"),
        ]);
        git(&[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("100644,{blob},zz/y/top"),
        ]);
        let tree = git(&["write-tree"]);
        let index = std::fs::read(r.join(".git/index")).expect("index");
        let at = index
            .windows(4)
            .position(|w| w == b"TREE")
            .expect("git wrote a TREE extension");
        let len = u32::from_be_bytes(index[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let want = &index[at + 8..at + 8 + len];

        let repo = crate::git::open_owned(&r.join(".git")).expect("open");
        let root = gix::ObjectId::from_hex(tree.as_bytes()).expect("tree id");
        let got = crate::git::index_ext::cache_tree(root, &mut |id| {
            let t = repo.find_tree(id)?;
            let d = t.decode()?;
            Ok::<_, gix::Error>(
                d.entries
                    .iter()
                    .map(|e| (e.filename.to_vec(), e.mode.is_tree(), e.oid.to_owned()))
                    .collect(),
            )
        })
        .expect("cache tree");
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want),
            "our TREE differs from git's"
        );
        assert_eq!(got, want);
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("a'b"), r"'a'\''b'");
    }
}
