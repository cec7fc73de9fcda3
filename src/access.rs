//! Who is asking, and the one grant the daemon makes to a workspace's owner (docs/security.md).
//!
//! [`Caller`] is the identity of a control request, taken from the socket's peer credentials (never
//! from anything the request says). [`grant_objects`] lets a workspace's owner read the object store
//! of its mirror by its host path, although the daemon's state is private (the workspace's own git
//! reads it through `.git/octofs/objects` in the mount, which the daemon serves: `fs::objects`): search permission on `<state>/mirrors`, the mirror and its `.git`, read and search on
//! everything under `.git/objects` — with default ACLs there, so packs and loose objects written later
//! inherit it. Nothing else of the mirror (its config, refs, checkout) is granted.
//!
//! Mechanism only: the daemon decides who owns what and who may bind a project. ACLs are written as
//! the kernel's `system.posix_acl_*` extended attributes (the same bytes `setfacl` writes), through
//! the wrappers of `sys`.

use std::io;
use std::path::{Path, PathBuf};

/// The user behind a control request: the uid, gid and supplementary groups the kernel recorded for
/// the process that connected to the socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

impl Caller {
    /// Whether the caller is in group `gid` (primary or supplementary).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// `uid` as a refusal shows it: "uid 1000 (alice)".
pub fn describe_uid(uid: u32) -> String {
    match crate::sys::user_name(uid) {
        Some(name) => format!("uid {uid} ({name})"),
        None => format!("uid {uid}"),
    }
}

/// `uid`'s user name, or the number when it has none (a column of `list`).
pub fn user_label(uid: u32) -> String {
    crate::sys::user_name(uid).unwrap_or_else(|| uid.to_string())
}

const ACCESS: &str = "system.posix_acl_access";
const DEFAULT: &str = "system.posix_acl_default";
const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;
const R: u16 = 4;
const X: u16 = 1;

/// One ACL entry; ordered as the kernel requires (by tag, then id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    tag: u16,
    id: u32,
    perm: u16,
}

fn decode(b: &[u8]) -> Option<Vec<Entry>> {
    let (head, rest) = b.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*head) != VERSION || rest.len() % 8 != 0 {
        return None;
    }
    Some(
        rest.chunks_exact(8)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect(),
    )
}

fn encode(mut acl: Vec<Entry>) -> Vec<u8> {
    acl.sort();
    let mut out = VERSION.to_le_bytes().to_vec();
    for e in acl {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        out.extend_from_slice(&e.id.to_le_bytes());
    }
    out
}

/// The minimal ACL equivalent to a file mode.
fn from_mode(mode: u32) -> Vec<Entry> {
    let e = |tag, shift: u32| Entry {
        tag,
        id: UNDEFINED_ID,
        perm: ((mode >> shift) & 7) as u16,
    };
    vec![e(USER_OBJ, 6), e(GROUP_OBJ, 3), e(OTHER, 0)]
}

/// `acl` with `perm` added for user `uid` and the mask recomputed (as `setfacl -m` does); `None`
/// when `acl` already grants it effectively.
fn with_user(mut acl: Vec<Entry>, uid: u32, perm: u16) -> Option<Vec<Entry>> {
    let mask = acl.iter().find(|e| e.tag == MASK).map(|e| e.perm);
    let current = acl
        .iter()
        .find(|e| e.tag == USER && e.id == uid)
        .map(|e| e.perm);
    if current.is_some_and(|c| c & perm == perm) && mask.is_some_and(|m| m & perm == perm) {
        return None;
    }
    match acl.iter_mut().find(|e| e.tag == USER && e.id == uid) {
        Some(e) => e.perm |= perm,
        None => acl.push(Entry {
            tag: USER,
            id: uid,
            perm,
        }),
    }
    let mask = acl
        .iter()
        .filter(|e| matches!(e.tag, GROUP_OBJ | USER | GROUP))
        .fold(0, |m, e| m | e.perm);
    acl.retain(|e| e.tag != MASK);
    acl.push(Entry {
        tag: MASK,
        id: UNDEFINED_ID,
        perm: mask,
    });
    Some(acl)
}

/// Adds `perm` for `uid` to the access ACL of `path` (and, with `default`, to its default ACL).
fn grant(path: &Path, mode: u32, uid: u32, perm: u16, default: bool) -> io::Result<()> {
    let access = match crate::sys::get_xattr(path, ACCESS)? {
        Some(b) => decode(&b).unwrap_or_else(|| from_mode(mode)),
        None => from_mode(mode),
    };
    if let Some(acl) = with_user(access.clone(), uid, perm) {
        crate::sys::set_xattr(path, ACCESS, &encode(acl))?;
    }
    if default {
        // A directory without a default ACL starts from its access ACL, as `setfacl -d` does.
        let base = match crate::sys::get_xattr(path, DEFAULT)? {
            Some(b) => decode(&b).unwrap_or(access),
            None => access,
        };
        if let Some(acl) = with_user(base, uid, perm) {
            crate::sys::set_xattr(path, DEFAULT, &encode(acl))?;
        }
    }
    Ok(())
}

/// Lets user `uid` search (not list) the directory `path`, by an entry of its access ACL: how the
/// build identity of dependency layers reaches its own directories under the private
/// `<state>/deps` (src/deps/sandbox.rs). Idempotent.
pub fn grant_search(path: &Path, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::symlink_metadata(path)?.mode();
    grant(path, mode, uid, X, false)
}

/// Whether both ACLs of `dir` already give `uid` read and search effectively. A chmod of `dir`
/// (which narrows the access ACL's mask) makes this false, so it also tells whether something
/// changed modes below it.
fn inherits(dir: &Path, uid: u32) -> io::Result<bool> {
    for name in [ACCESS, DEFAULT] {
        let granted = crate::sys::get_xattr(dir, name)?
            .and_then(|b| decode(&b))
            .is_some_and(|acl| with_user(acl, uid, R | X).is_none());
        if !granted {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Lets user `uid` read the objects of the mirror at `mirror` (inside `mirrors`): search on
/// `mirrors`, `mirror` and `mirror/.git`; read and search on `.git/objects` and everything below
/// it, with default ACLs on its directories. Idempotent: entries already there are not rewritten.
///
/// Once `.git/objects` carries the default entry, everything written below it since inherits it,
/// so the walk over every object file is skipped unless `recheck` (after a restart, when modes may
/// have been changed while the daemon was away): an open stays O(1) in the mirror's size.
pub fn grant_objects(mirrors: &Path, mirror: &Path, uid: u32, recheck: bool) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let git = mirror.join(".git");
    for dir in [mirrors, mirror, git.as_path()] {
        let m = std::fs::symlink_metadata(dir)?;
        if !m.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        grant(dir, m.mode(), uid, X, false)?;
    }
    let objects = git.join("objects");
    if !recheck && inherits(&objects, uid)? {
        return Ok(());
    }
    walk_objects(objects, &mut |path, m| {
        if m.is_dir() {
            grant(path, m.mode(), uid, R | X, true)
        } else {
            grant(path, m.mode(), uid, R, false)
        }
    })
}

/// Calls `f` on `objects` and every directory and file below it. A fetch or a snapshot may add and
/// remove files meanwhile: what vanished needs nothing, and what is new inherits the default ACLs.
fn walk_objects(
    objects: PathBuf,
    f: &mut dyn FnMut(&Path, &std::fs::Metadata) -> io::Result<()>,
) -> io::Result<()> {
    let mut stack = vec![objects];
    while let Some(dir) = stack.pop() {
        f(&dir, &std::fs::symlink_metadata(&dir)?)?;
        for entry in std::fs::read_dir(&dir)? {
            let outcome = entry.and_then(|entry| {
                let m = entry.metadata()?;
                if m.is_dir() {
                    stack.push(entry.path());
                } else if m.is_file() {
                    f(&entry.path(), &m)?;
                }
                // Symlinks carry no ACL; nothing else belongs in an object store.
                Ok(())
            });
            match outcome {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

/// `acl` without the named-user entries of the users `keep` refuses, mask recomputed; `None` when
/// nothing changes. The uids removed are added to `gone`.
fn without_users(
    mut acl: Vec<Entry>,
    keep: &dyn Fn(u32) -> bool,
    gone: &mut Vec<u32>,
) -> Option<Vec<Entry>> {
    let before = acl.len();
    acl.retain(|e| {
        let drop = e.tag == USER && !keep(e.id);
        if drop && !gone.contains(&e.id) {
            gone.push(e.id);
        }
        !drop
    });
    if acl.len() == before {
        return None;
    }
    let mask = acl
        .iter()
        .filter(|e| matches!(e.tag, GROUP_OBJ | USER | GROUP))
        .fold(0, |m, e| m | e.perm);
    if let Some(m) = acl.iter_mut().find(|e| e.tag == MASK) {
        m.perm = mask;
    }
    Some(acl)
}

/// Takes back the objects grant of [`grant_objects`] from every user `keep` refuses, on the mirror,
/// its `.git` and everything under `.git/objects` (access and default ACLs). Returns the uids whose
/// grant was removed. `<state>/mirrors` keeps its search entries: they reveal nothing by themselves.
pub fn revoke_objects(mirror: &Path, keep: &dyn Fn(u32) -> bool) -> io::Result<Vec<u32>> {
    let mut gone = Vec::new();
    let git = mirror.join(".git");
    for dir in [mirror, git.as_path()] {
        revoke(dir, keep, &mut gone)?;
    }
    walk_objects(git.join("objects"), &mut |path, _| {
        revoke(path, keep, &mut gone)
    })?;
    Ok(gone)
}

fn revoke(path: &Path, keep: &dyn Fn(u32) -> bool, gone: &mut Vec<u32>) -> io::Result<()> {
    for name in [ACCESS, DEFAULT] {
        let Some(acl) = crate::sys::get_xattr(path, name)?.and_then(|b| decode(&b)) else {
            continue;
        };
        if let Some(acl) = without_users(acl, keep, gone) {
            crate::sys::set_xattr(path, name, &encode(acl))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_user_sets_a_mask_and_is_idempotent() {
        let acl = with_user(from_mode(0o700), 1000, R | X).expect("changed");
        let bytes = encode(acl);
        let back = decode(&bytes).expect("decodes");
        assert!(back.contains(&Entry {
            tag: USER,
            id: 1000,
            perm: R | X
        }));
        assert!(back.contains(&Entry {
            tag: MASK,
            id: UNDEFINED_ID,
            perm: R | X
        }));
        assert_eq!(with_user(back.clone(), 1000, R), None);
        // A mask that hides the entry (a later chmod) is widened again.
        let masked: Vec<Entry> = back
            .into_iter()
            .map(|e| {
                if e.tag == MASK {
                    Entry { perm: 0, ..e }
                } else {
                    e
                }
            })
            .collect();
        assert!(with_user(masked, 1000, R).is_some());
    }
}
