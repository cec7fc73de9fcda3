//! What the workspace's repository needs read in process, without a git subprocess: the mirror's
//! refs (what `git for-each-ref` lists) and a workspace's `.git/config` through the core.
//!
//! Reads only; must not write the mirror or a workspace, and reads a workspace's config through the
//! core (no symlink followed, bounded in size), never by path.

use super::Error;
use crate::fs::WorkspaceFs;

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
