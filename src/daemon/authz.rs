//! Who may do what: the caller (from the socket's peer credentials) against a thread's owner and a
//! project's access list. A thread belongs to the user who first opened it; only its owner or root
//! (or the daemon's own user) acts on it, and root alone manages mirrors and the daemon. Also the
//! read grant on a mirror's objects that a workspace's owner gets.
//!
//! Decides only; it changes no workspace and no mirror (the grant changes file modes and ACLs of
//! the mirror's objects, through `crate::access`).

use super::Daemon;
use super::error::Error;
use super::mirrors::BLANK;
use super::proto::Access;
use crate::access::{Caller, describe_uid};
use crate::git::mirror;
use crate::workspace::{Owner, WorkspaceRecord};

/// Whether `c` is among who may bind a project (an open project: anyone).
pub(super) fn may_bind(c: &Caller, access: &Access) -> bool {
    access.is_open()
        || access.users.contains(&c.uid)
        || access.groups.iter().any(|g| c.in_group(*g))
}

impl Daemon {
    /// Root and the daemon's own user may do anything.
    pub(super) fn is_admin(&self, c: &Caller) -> bool {
        c.uid == 0 || c.uid == crate::sys::euid()
    }

    /// Whose authority the far side of a transport to a remote `c` named runs with: `c`'s own,
    /// unless `c` is root or the daemon's user (`git::mirror::far_side`).
    pub(super) fn far_side(&self, c: &Caller) -> mirror::FarSide {
        if self.is_admin(c) {
            mirror::FarSide::Daemon
        } else {
            mirror::FarSide::User {
                uid: c.uid,
                gid: c.gid,
                groups: c.groups.clone(),
            }
        }
    }

    pub(super) fn require_admin(&self, c: &Caller, what: &str) -> Result<(), Error> {
        if self.is_admin(c) {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!(
                "only root may {what} ({} is not root)",
                describe_uid(c.uid)
            )))
        }
    }

    /// Refuses `c` acting on `thread`, owned by `owner`, unless it is theirs or `c` is root.
    pub(super) fn require_owner(
        &self,
        c: &Caller,
        thread: &str,
        owner: Owner,
    ) -> Result<(), Error> {
        if self.is_admin(c) || c.uid == owner.uid {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!(
                "thread {thread} belongs to {}, not to {}",
                describe_uid(owner.uid),
                describe_uid(c.uid)
            )))
        }
    }

    /// Refuses `c` acting on `thread` unless it owns it or is root. An unknown thread passes: the
    /// operation itself reports it. The caller holds the thread's lock (ownership cannot change
    /// between this check and the operation).
    pub(super) fn check_thread(&self, c: &Caller, thread: &str) -> Result<(), Error> {
        if self.is_admin(c) {
            return Ok(());
        }
        let owner = match WorkspaceRecord::load(&self.layout, thread)? {
            Some(r) => Some(r.owner),
            None => crate::workspace::Binding::load(&self.layout, thread)?.map(|b| b.owner),
        };
        match owner {
            Some(o) => self.require_owner(c, thread, o),
            None => Ok(()),
        }
    }

    /// Refuses `c` binding (opening a thread of) `project` when the project limits who may.
    pub(super) fn check_bind(&self, c: &Caller, project: &str) -> Result<(), Error> {
        if self.is_admin(c) || project == BLANK {
            return Ok(());
        }
        let p = mirror::require(&self.layout, project)?;
        if may_bind(c, &p.access) {
            Ok(())
        } else {
            Err(Error::PermissionDenied(format!(
                "project {project} may be bound only by the users and groups root allowed, and {} is not among them",
                describe_uid(c.uid)
            )))
        }
    }

    /// Whether `owner` may still read `project`'s objects, as a workspace's `.git/octofs/objects`
    /// asks at every request (the daemon reads them as root: this is the check the host's
    /// permissions would have made). The answer is kept until `mirror access` changes any
    /// project's access (the epoch moves); root, the daemon's user and the blank repository's
    /// chats always may.
    pub(super) fn objects_gate(&self, project: &str, owner: Owner) -> crate::fs::objects::Allowed {
        use std::sync::atomic::Ordering;
        let always = owner.uid == 0 || owner.uid == crate::sys::euid() || project == BLANK;
        let layout = self.layout.clone();
        let project = project.to_string();
        let epoch = self.access_epoch.clone();
        let decided: std::sync::Mutex<Option<(u64, bool)>> = std::sync::Mutex::new(None);
        std::sync::Arc::new(move || {
            if always {
                return true;
            }
            let now = epoch.load(Ordering::SeqCst);
            let mut d = decided.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((at, ok)) = *d
                && at == now
            {
                return ok;
            }
            let ok = match mirror::load(&layout, &project) {
                Ok(Some(p)) => may_bind(
                    &Caller {
                        uid: owner.uid,
                        gid: owner.gid,
                        groups: crate::sys::user_groups(owner.uid),
                    },
                    &p.access,
                ),
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(%project, "cannot read who may bind the project: {e}");
                    false
                }
            };
            *d = Some((now, ok));
            ok
        })
    }

    /// Lets a workspace's owner read the objects of its project's mirror by their host path (the
    /// daemon's state is private; the workspace's own git reads them through `.git/octofs/objects`,
    /// see [`Self::objects_gate`]); `recheck` walks every object file again. A failure is a
    /// warning: the workspace works.
    pub(super) fn grant_owner(&self, project: &str, owner: Owner, recheck: bool) -> Option<String> {
        if owner.uid == 0 || owner.uid == crate::sys::euid() {
            return None;
        }
        let mirror = self.layout.mirror(project);
        match crate::access::grant_objects(&self.layout.mirrors(), &mirror, owner.uid, recheck) {
            Ok(()) => None,
            Err(e) => {
                let w = format!(
                    "cannot let {} read the objects of project {project} ({e}); git in the workspace may not find its history",
                    describe_uid(owner.uid)
                );
                tracing::warn!("{w}");
                Some(w)
            }
        }
    }
}
