//! The `.git` of a new workspace: what it is made of (the [`RepoPlan`], from the mirror's refs and
//! the project) and writing it into the workspace's upper layer before the first mount.
//!
//! Owns the files of a fresh `.git` (HEAD, config, packed-refs, alternates, the small split index
//! naming the shared one) and that no credential reaches them. Must not write the mirror, nor the
//! shared index (`shared_index` builds it; this only links it in).

use std::path::{Path, PathBuf};

use super::Error;
use super::fsmonitor::fsmonitor_command;
use super::read::mirror_refs;
use super::shared_index::{index_hash, small_index_parts};
use crate::fs::{BASE_TOKEN, ROOT_INO, WorkspaceFs};
use crate::git::mirror::{Project, UpstreamKind};
use crate::layout::Layout;

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

/// Writes the `.git` of `plan` into a new workspace (before it is mounted); returns its inode
/// (`None`: the base has a `.git` of its own, left as it is).
/// Without `index` (its shared index is still being built), the `.git` has no index yet:
/// [`put_index`] puts it in later.
pub fn seed(
    core: &WorkspaceFs,
    plan: &RepoPlan,
    index: Option<&Path>,
    base_time: i64,
) -> Result<Option<u64>, Error> {
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
        return Ok(None);
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
    if let Some(index) = index {
        put_index(core, git, &plan.worktree, index, base_time, false)?;
    }
    Ok(Some(git))
}

/// Puts the split index of the shared index at `index` into the workspace's `.git` (inode `git`)
/// whose work tree is `worktree`: before the mount (`mounted` false, part of the seed) or, for a
/// base whose shared index was built after the mount, into the held `.git` (quiet, told to the
/// kernel: `WorkspaceFs::add_own_file`). A `.git/index` already there (the daemon's `commit` may
/// have written one) is left as it is.
pub fn put_index(
    core: &WorkspaceFs,
    git: u64,
    worktree: &Path,
    index: &Path,
    base_time: i64,
    mounted: bool,
) -> Result<(), Error> {
    let e = |what: &str| {
        let what = what.to_string();
        move |source: crate::fs::FsError| Error::Seed { what, source }
    };
    // A split index: the shared part (every entry, one file per base and owner, shared by every
    // fork, never copied) as `sharedindex.<its hash>`, and a small `index` of this work tree that
    // names it and carries what is the workspace's own: the fsmonitor token, and for a fresh fork
    // the untracked cache, whose ident is the mount point.
    let shared_hash = index_hash(index).map_err(|source| Error::WriteIndex { source })?;
    let shared_name = format!("sharedindex.{}", gix::ObjectId::from(shared_hash));
    let shared_ino = if mounted {
        match core.add_own_shared(git, &shared_name, index, 0o644) {
            Err(err) if err == fuser::Errno::EEXIST => 0,
            r => r.map_err(e(&shared_name))?,
        }
    } else {
        core.seed_shared(git, &shared_name, index, 0o644)
            .map_err(e(&shared_name))?
    };
    let fsmonitor = crate::git::index_ext::fsmonitor_payload(BASE_TOKEN);
    let parts = small_index_parts(index, &shared_hash);
    // The untracked cache's ident is the mount point: this fork's own, before the shared tail.
    let ident = crate::git::index_ext::untracked_ident(worktree, &system_name());
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
    if mounted {
        // Created now, after the base's time unless the clock is behind it (then git only
        // compares more contents); the stamp below would be a change of the workspace's state.
        return match core.add_own_file(git, "index", &small, 0o644) {
            Err(err) if err == fuser::Errno::EEXIST => Ok(()),
            r => r.map(|_| ()).map_err(e("index")),
        };
    }
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
}
