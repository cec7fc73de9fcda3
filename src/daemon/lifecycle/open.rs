//! `octofs open` decided: who may open the thread, whether the request fits the thread's state
//! (its project, its chat workspace, `--ref`, `--io`), and which workspace the open gives — the
//! live one joined, the live one mounted again, or a new one (a resume, a fork, a chat).
//!
//! Pure: the facts come from `super::super::threads`, which carries the plan out; nothing here
//! reads a record, resolves a ref or asks the kernel.

use super::{Gathered, each_once};
use crate::access::{Caller, describe_uid};
use crate::daemon::authz::may_bind;
use crate::daemon::error::Error;
use crate::daemon::mirrors::BLANK;
use crate::daemon::proto::Access;
use crate::fs::IoMode;
use crate::workspace::{Binding, WorkspaceRecord};

/// What `open` is decided from.
pub(in crate::daemon) struct OpenFacts<'a> {
    pub thread: &'a str,
    pub caller: &'a Caller,
    /// Whether the caller is root or the daemon's own user.
    pub admin: bool,
    pub binding: Option<&'a Binding>,
    /// The live workspace's record.
    pub live: Option<&'a WorkspaceRecord>,
    /// What the request asks for: `--project`, `--ref`, `--io`.
    pub project: Option<&'a str>,
    pub git_ref: Option<&'a str>,
    pub io: Option<IoMode>,
    /// The access list of the project [`access_needed`] names (none when it names none).
    pub access: Option<Gathered<Access>>,
    /// `git_ref` resolved in the live workspace's project (with both only).
    pub ref_commit: Option<Gathered<gix::ObjectId>>,
    /// The live workspace's mount (with one only).
    pub mount: Mount,
}

/// A live workspace's mount as the kernel and the daemon know it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::daemon) struct Mount {
    /// Whether the kernel has this daemon's mount of it.
    pub served: bool,
    /// The I/O mode the daemon's session serves it in (none: no session).
    pub mode: Option<IoMode>,
}

/// What an `open` that is not refused does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::daemon) enum OpenPlan {
    /// The live workspace, which the kernel has: one more user.
    Join(Users),
    /// The live workspace, which the kernel does not have (taken away behind the daemon, or not
    /// remounted): its users as said, and mounted again.
    Remount(Users),
    /// No live workspace: a new one, which one decided by [`decide_create`] once the project's
    /// share was asked.
    Create,
}

/// The live workspace's record after an open that joins or remounts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::daemon) struct Users {
    /// Who holds it now, each once.
    pub holders: Vec<u32>,
    /// The open cancels a pending `release --when-idle`.
    pub cancels_pending: bool,
    /// The thread's own I/O mode from now on.
    pub io: Option<IoMode>,
}

/// Which new workspace an open creates.
#[derive(Debug, Clone, Copy)]
pub(in crate::daemon) enum CreatePlan<'a> {
    /// The released thread's last snapshot (or its first base when nothing was saved).
    Resume(&'a Binding),
    /// A fork of the project's commit (`--ref`, else its default branch).
    Fork(&'a str),
    /// A chat workspace: no project.
    Chat,
}

/// Why an `open` was refused. (`pub`: a variant of [`crate::daemon::refusal::Refusal`] holds it;
/// its module keeps it inside the daemon.)
#[derive(Debug)]
pub enum OpenRefusal {
    /// The thread is another user's.
    NotOwner {
        thread: String,
        owner: u32,
        caller: u32,
    },
    /// The thread's project limits who may bind it, and the caller is not among them.
    MayNotBind { project: String, caller: u32 },
    /// The thread is bound to another project.
    Rebind {
        thread: String,
        bound: String,
        asked: String,
    },
    /// `--project` for a thread whose live workspace is a chat.
    ChatBind { thread: String, asked: String },
    /// `--ref` naming another commit than the live workspace's base.
    RefOnLive {
        thread: String,
        base: String,
        git_ref: String,
    },
    /// `--io` other than the mode the live mount serves in.
    IoClash {
        thread: String,
        current: IoMode,
        want: IoMode,
    },
    /// `--ref` for a released thread (it resumes from its snapshot).
    RefOnReleased { thread: String },
    /// `--ref` for a chat workspace.
    RefOnChat,
    /// A fact the decision needed could not be gathered.
    Failed(Error),
}

impl OpenRefusal {
    /// The line inside the daemon's error (without its "permission denied: ").
    fn line(&self) -> String {
        match self {
            OpenRefusal::NotOwner {
                thread,
                owner,
                caller,
            } => format!(
                "thread {thread} belongs to {}, not to {}",
                describe_uid(*owner),
                describe_uid(*caller)
            ),
            OpenRefusal::MayNotBind { project, caller } => format!(
                "project {project} may be bound only by the users and groups root allowed, and {} is not among them",
                describe_uid(*caller)
            ),
            OpenRefusal::Rebind {
                thread,
                bound,
                asked,
            } => format!(
                "thread {thread} is bound to project {bound}; it cannot be re-bound to {asked}"
            ),
            OpenRefusal::ChatBind { thread, asked } => format!(
                "thread {thread} has a chat workspace (no project); release it before binding it to {asked}"
            ),
            OpenRefusal::RefOnLive {
                thread,
                base,
                git_ref,
            } => format!(
                "thread {thread} already has a workspace based on {}; --ref {git_ref} applies only when it is created",
                base.get(..12).unwrap_or(base)
            ),
            OpenRefusal::IoClash {
                thread,
                current,
                want,
            } => format!(
                "thread {thread} is mounted in {current} mode; release it to reopen it in {want} mode"
            ),
            OpenRefusal::RefOnReleased { thread } => format!(
                "thread {thread} was released; it resumes from its last snapshot (--ref applies only when a thread is created)"
            ),
            OpenRefusal::RefOnChat => {
                "a chat workspace (no --project) has no refs to choose from".into()
            }
            OpenRefusal::Failed(e) => e.to_string(),
        }
    }

    fn denied(&self) -> bool {
        matches!(
            self,
            OpenRefusal::NotOwner { .. } | OpenRefusal::MayNotBind { .. }
        )
    }
}

impl std::fmt::Display for OpenRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.denied() {
            f.write_str("permission denied: ")?;
        }
        f.write_str(&self.line())
    }
}

impl From<OpenRefusal> for Error {
    fn from(r: OpenRefusal) -> Error {
        match r {
            OpenRefusal::Failed(e) => e,
            r if r.denied() => Error::PermissionDenied(r.line()),
            r => crate::daemon::refusal::Refusal::Open(r).into(),
        }
    }
}

/// The project a thread is bound to: its live workspace's (none for a chat), else its binding's,
/// else the one the request names.
pub(in crate::daemon) fn bound_project<'a>(
    live: Option<&'a WorkspaceRecord>,
    binding: Option<&'a Binding>,
    project: Option<&'a str>,
) -> Option<&'a str> {
    match (live, binding) {
        (Some(r), _) if r.chat => None,
        (Some(r), _) => Some(r.project.as_str()),
        (None, Some(b)) => Some(b.project.as_str()),
        (None, None) => project,
    }
}

/// The project whose access list decides whether the caller may bind it: the bound one, unless
/// the caller is an admin or it is the blank repository of chat workspaces.
pub(in crate::daemon) fn access_needed(admin: bool, bound: Option<&str>) -> Option<&str> {
    bound.filter(|p| !admin && *p != BLANK)
}

/// Decides an `open` (before anything is written). A thread that exists is its owner's (an admin
/// may join it); a new one becomes the caller's.
pub(in crate::daemon) fn decide_open(f: OpenFacts<'_>) -> Result<OpenPlan, OpenRefusal> {
    let thread = f.thread;
    let owner = match (f.live, f.binding) {
        (Some(r), _) => Some(r.owner),
        (None, Some(b)) => Some(b.owner),
        (None, None) => None,
    };
    if let Some(o) = owner
        && !f.admin
        && f.caller.uid != o.uid
    {
        return Err(OpenRefusal::NotOwner {
            thread: thread.into(),
            owner: o.uid,
            caller: f.caller.uid,
        });
    }
    if let Some(p) = access_needed(f.admin, bound_project(f.live, f.binding, f.project)) {
        match f.access {
            Some(Ok(a)) if may_bind(f.caller, &a) => {}
            Some(Err(e)) => return Err(OpenRefusal::Failed(e)),
            // (Not gathered: nobody is taken to be allowed.)
            Some(Ok(_)) | None => {
                return Err(OpenRefusal::MayNotBind {
                    project: p.into(),
                    caller: f.caller.uid,
                });
            }
        }
    }
    if let (Some(b), Some(p)) = (f.binding, f.project)
        && b.project != p
    {
        return Err(OpenRefusal::Rebind {
            thread: thread.into(),
            bound: b.project.clone(),
            asked: p.into(),
        });
    }
    if let (Some(rec), Some(p)) = (f.live, f.project)
        && rec.chat
    {
        return Err(OpenRefusal::ChatBind {
            thread: thread.into(),
            asked: p.into(),
        });
    }
    let Some(rec) = f.live else {
        return Ok(OpenPlan::Create);
    };
    if let Some(r) = f.git_ref {
        let resolved = match f.ref_commit {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => return Err(OpenRefusal::Failed(e)),
            None => None,
        };
        if resolved.is_none() || Some(rec.base_commit) != resolved {
            return Err(OpenRefusal::RefOnLive {
                thread: thread.into(),
                base: rec.base_commit.to_string(),
                git_ref: r.into(),
            });
        }
    }
    let served = f.mount.served;
    if let (Some(want), Some(current)) = (f.io, f.mount.mode)
        && want != current
        && served
    {
        return Err(OpenRefusal::IoClash {
            thread: thread.into(),
            current,
            want,
        });
    }
    // Each caller counts once: the same user opening it again (`cd $(octofs open t)`, doctor's
    // advice) is no other user. A pending `release --when-idle` was its last user's release: this
    // open cancels it and is the one user now. A record the daemon serves (or should: its remount
    // failed) keeps its users.
    let holders = if rec.release_when_idle {
        vec![f.caller.uid]
    } else if served || rec.mounted {
        let mut h = rec.holders();
        h.push(f.caller.uid);
        each_once(h)
    } else {
        vec![f.caller.uid]
    };
    let users = Users {
        holders,
        cancels_pending: rec.release_when_idle,
        io: f.io.or(rec.io),
    };
    Ok(if served {
        OpenPlan::Join(users)
    } else {
        OpenPlan::Remount(users)
    })
}

/// Decides which new workspace an open creates, once the project's share was asked (a thread
/// another host moved on comes back bound): `binding` the thread's binding now.
pub(in crate::daemon) fn decide_create<'a>(
    thread: &str,
    binding: Option<&'a Binding>,
    project: Option<&'a str>,
    git_ref: Option<&str>,
) -> Result<CreatePlan<'a>, OpenRefusal> {
    match (binding, project, git_ref) {
        (Some(_), _, Some(_)) => Err(OpenRefusal::RefOnReleased {
            thread: thread.into(),
        }),
        (Some(b), _, None) => Ok(CreatePlan::Resume(b)),
        (None, Some(p), _) => Ok(CreatePlan::Fork(p)),
        (None, None, Some(_)) => Err(OpenRefusal::RefOnChat),
        (None, None, None) => Ok(CreatePlan::Chat),
    }
}

/// The branch a fork's HEAD goes on: the one the caller named (when `--ref` resolved to a
/// branch), else a branch of the thread's own.
pub(in crate::daemon) fn fork_branch(
    thread: &str,
    git_ref: Option<&str>,
    resolved_branch: Option<String>,
) -> String {
    git_ref
        .and(resolved_branch)
        .unwrap_or_else(|| format!("octofs/{thread}"))
}

#[cfg(test)]
#[path = "open_tests.rs"]
mod tests;
