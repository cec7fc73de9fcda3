//! Commit objects: a snapshot's commit written (by octofs or by a named identity) and read back.
//!
//! Owns the signature octofs writes with; must not move a ref (`refs` does, after the commit is
//! written).

use super::err;
use crate::git::error::{Context, Error};

use gix::ObjectId;

/// A snapshot commit's tree, parents and message.
pub fn commit_info(
    repo: &gix::Repository,
    id: ObjectId,
) -> Result<(ObjectId, Vec<ObjectId>, Vec<u8>, i64), Error> {
    let c = repo
        .find_commit(id)
        .context(|| format!("cannot read commit {id}"))?;
    let d = c.decode().context(|| format!("cannot read commit {id}"))?;
    let time = c.time().map(|t| t.seconds).unwrap_or(0);
    Ok((d.tree(), d.parents().collect(), d.message.to_vec(), time))
}

pub(super) fn signature() -> gix::actor::Signature {
    gix::actor::Signature {
        name: "octofs".into(),
        email: "octofs@localhost".into(),
        time: gix::date::Time::now_local_or_utc(),
    }
}

/// Writes a commit object (no ref moves).
pub fn write_commit(
    repo: &gix::Repository,
    tree: ObjectId,
    parents: Vec<ObjectId>,
    message: &str,
) -> Result<ObjectId, Error> {
    write_commit_as(repo, tree, parents, message, None)
}

/// Who a commit is by: a name and an email (the time is the commit's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub name: String,
    pub email: String,
}

/// Writes a commit object by `who` (author and committer; octofs's own signature without one).
pub fn write_commit_as(
    repo: &gix::Repository,
    tree: ObjectId,
    parents: Vec<ObjectId>,
    message: &str,
    who: Option<&Identity>,
) -> Result<ObjectId, Error> {
    let mut sig = signature();
    if let Some(who) = who {
        sig.name = who.name.as_str().into();
        sig.email = who.email.as_str().into();
    }
    let commit = gix::objs::Commit {
        tree,
        parents: parents.into_iter().collect(),
        author: sig.clone(),
        committer: sig,
        encoding: None,
        message: message.into(),
        extra_headers: vec![],
    };
    Ok(repo
        .write_object(&commit)
        .map_err(err("cannot write the snapshot commit"))?
        .detach())
}
