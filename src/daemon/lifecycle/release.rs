//! `octofs release` decided: one user fewer, or the last one's save and unmount (refused while a
//! process uses the mount, unless forced), or `--discard`; `release --when-idle` (now, or pending
//! until the mount is idle); and the timer that carries pending releases out.
//!
//! Pure: the facts come from `super::super::threads`, which asks whether the mount is busy only
//! when [`busy_matters`] (the question marks an idle mount expired) and carries the plan out.

use crate::daemon::error::Error;
use crate::workspace::WorkspaceRecord;
use std::path::{Path, PathBuf};

/// What a release is decided from.
pub(in crate::daemon) struct ReleaseFacts<'a> {
    pub thread: &'a str,
    /// The live workspace's record.
    pub live: Option<&'a WorkspaceRecord>,
    /// Whether the thread has a binding (it was released before).
    pub bound: bool,
    /// The caller whose hold ends (none: the daemon's own release, of the last user).
    pub by: Option<u32>,
    pub force: bool,
    pub discard: bool,
    /// Whether the daemon serves the workspace.
    pub served: bool,
    /// Whether a process uses the mount, asked when [`busy_matters`] only.
    pub busy: Busy,
    pub mountpoint: &'a Path,
}

/// Whether a process uses a mount.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(in crate::daemon) enum Busy {
    /// Not asked (taken as in use if it matters).
    #[default]
    NotAsked,
    Idle,
    /// A process has its working directory or files in it (waited for up to a second).
    InUse,
    /// It is also mounted elsewhere, for process `pid` at `at` (a sandbox or a bind).
    Elsewhere {
        pid: u32,
        at: PathBuf,
    },
}

/// What a release that is not refused does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::daemon) enum ReleasePlan {
    /// Released before: nothing to do.
    Already,
    /// Others still hold it: these do now, and the workspace stays.
    DropHolder { holders: Vec<u32> },
    /// The last user: saved, unmounted (detached lazily when `force` and busy), dropped.
    SaveAndUnmount { force: bool },
    /// The last user of a chat workspace: unmounted and dropped, nothing to save.
    Unmount { force: bool },
    /// `--discard`: dropped at once without saving, busy or not (its last snapshot stays).
    Discard,
}

/// Why a release was refused. (`pub`: a variant of [`crate::daemon::refusal::Refusal`] holds it;
/// its module keeps it inside the daemon.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseRefusal {
    /// No workspace and no binding.
    Unknown(String),
    Busy {
        mountpoint: PathBuf,
    },
    BoundElsewhere {
        mountpoint: PathBuf,
        pid: u32,
        at: PathBuf,
    },
}

impl std::fmt::Display for ReleaseRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReleaseRefusal::Unknown(thread) => Error::UnknownThread(thread.clone()).fmt(f),
            ReleaseRefusal::Busy { mountpoint } => write!(
                f,
                "{} is busy (a process still has its working directory or files in it); stop them or use --force",
                mountpoint.display()
            ),
            ReleaseRefusal::BoundElsewhere {
                mountpoint,
                pid,
                at,
            } => write!(
                f,
                "{} is busy: it is also mounted at {} for process {pid} (a sandbox or a bind); stop it or use --force",
                mountpoint.display(),
                at.display()
            ),
        }
    }
}

impl From<ReleaseRefusal> for Error {
    fn from(r: ReleaseRefusal) -> Error {
        match r {
            ReleaseRefusal::Unknown(thread) => Error::UnknownThread(thread),
            r => crate::daemon::refusal::Refusal::Release(r).into(),
        }
    }
}

/// Who still holds `rec`'s thread once `by` releases it: the caller's hold ends; a caller who holds
/// none (root releasing a user's thread) ends the oldest one.
pub(in crate::daemon) fn after_release(rec: &WorkspaceRecord, by: Option<u32>) -> Vec<u32> {
    let mut holders = rec.holders();
    match by.and_then(|u| holders.iter().position(|h| *h == u)) {
        Some(i) => {
            holders.remove(i);
        }
        None if !holders.is_empty() => {
            holders.remove(0);
        }
        None => {}
    }
    holders
}

/// Whether the decision needs to know if a process uses the mount: the last user's release of a
/// served workspace, not forced.
pub(in crate::daemon) fn busy_matters(f: &ReleaseFacts<'_>) -> bool {
    let force = f.force || f.discard;
    !force && f.served && f.live.is_some_and(|r| after_release(r, f.by).is_empty())
}

/// Decides a release (before anything is saved: a refused release changes nothing).
pub(in crate::daemon) fn decide_release(
    f: &ReleaseFacts<'_>,
) -> Result<ReleasePlan, ReleaseRefusal> {
    let force = f.force || f.discard;
    let Some(rec) = f.live else {
        return if f.bound {
            Ok(ReleasePlan::Already)
        } else {
            Err(ReleaseRefusal::Unknown(f.thread.into()))
        };
    };
    let holders = after_release(rec, f.by);
    if !holders.is_empty() && !force {
        return Ok(ReleasePlan::DropHolder { holders });
    }
    if !force && f.served {
        match &f.busy {
            Busy::Idle => {}
            Busy::InUse | Busy::NotAsked => {
                return Err(ReleaseRefusal::Busy {
                    mountpoint: f.mountpoint.into(),
                });
            }
            Busy::Elsewhere { pid, at } => {
                return Err(ReleaseRefusal::BoundElsewhere {
                    mountpoint: f.mountpoint.into(),
                    pid: *pid,
                    at: at.clone(),
                });
            }
        }
    }
    Ok(if f.discard {
        ReleasePlan::Discard
    } else if rec.chat {
        ReleasePlan::Unmount { force }
    } else {
        ReleasePlan::SaveAndUnmount { force }
    })
}

/// What `release --when-idle` is decided from.
pub(in crate::daemon) struct WhenIdleFacts<'a> {
    pub live: Option<&'a WorkspaceRecord>,
    pub by: u32,
    pub served: bool,
    /// Whether a process uses the mount, asked when [`in_use_matters`] only.
    pub in_use: Option<bool>,
}

/// What `release --when-idle` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum WhenIdlePlan {
    /// A plain release (not forced): not the last user, or no live workspace.
    Release,
    /// The last user, and nothing uses the mount (or the daemon does not serve it): released
    /// now, forced (checked once: a second check in a row would unmount it behind the release).
    ReleaseNow,
    /// The last user, the mount in use: released by the timer once it is idle.
    Pending,
}

/// Whether `release --when-idle` needs to know if a process uses the mount.
pub(in crate::daemon) fn in_use_matters(f: &WhenIdleFacts<'_>) -> bool {
    f.served
        && f.live
            .is_some_and(|r| after_release(r, Some(f.by)).is_empty())
}

pub(in crate::daemon) fn decide_when_idle(f: &WhenIdleFacts<'_>) -> WhenIdlePlan {
    let Some(rec) = f.live else {
        return WhenIdlePlan::Release;
    };
    if !after_release(rec, Some(f.by)).is_empty() {
        return WhenIdlePlan::Release;
    }
    if !f.served || f.in_use == Some(false) {
        return WhenIdlePlan::ReleaseNow;
    }
    WhenIdlePlan::Pending
}

/// What the timer does with one thread whose `release --when-idle` waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum IdleWait {
    /// Released, cancelled by an open, or unreadable: nothing waits any more.
    Gone,
    /// Still in use: it waits.
    Wait,
    /// Idle (or not served): released now, as the daemon's own release of its last user.
    Release,
}

/// `pending`: whether the thread's record still says a release waits (none: no record, or one
/// that cannot be read); `in_use` asked only of a served mount.
pub(in crate::daemon) fn idle_wait(pending: bool, served: bool, in_use: Option<bool>) -> IdleWait {
    if !pending {
        IdleWait::Gone
    } else if served && in_use != Some(false) {
        IdleWait::Wait
    } else {
        IdleWait::Release
    }
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
