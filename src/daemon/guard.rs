//! The keyed locks' keys ([`LockKey`]) and the thread guard: the one preamble of every request
//! that works on one thread (validate its name, take its lock, check the caller may act on it,
//! load what the request needs and refuse a chat workspace where the request cannot serve one).
//!
//! Owns only that preamble; what a request does once it holds the thread is its module's. Must not
//! take any other lock than the thread's, nor change a record.

use std::sync::{Arc, Mutex, MutexGuard};

use super::error::Error;
use super::refusal::{ChatOp, Refusal};
use super::{Daemon, lock};
use crate::access::Caller;
use crate::names::{NameKind, validate};
use crate::workspace::{Binding, WorkspaceRecord};

/// What a keyed lock serializes: the work on one thread, on one project, or the build of one
/// shared index (docs/locking-daemon.md).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum LockKey {
    Thread(String),
    Project(String),
    /// The shared index of a base: the tree the index is of, and the tree the worktree presents.
    Index {
        index_tree: gix::ObjectId,
        worktree_tree: gix::ObjectId,
    },
}

impl LockKey {
    pub(super) fn thread(name: &str) -> LockKey {
        LockKey::Thread(name.to_string())
    }

    pub(super) fn project(name: &str) -> LockKey {
        LockKey::Project(name.to_string())
    }
}

/// A thread bound to a project, live or released: what [`ThreadLock::bound`] loads.
#[derive(Debug)]
pub(super) struct Bound {
    pub(super) project: String,
    /// The live workspace's record, when there is one (never a chat workspace's).
    pub(super) live: Option<WorkspaceRecord>,
    /// The thread's binding, when there is one.
    pub(super) binding: Option<Binding>,
}

/// A thread's validated name and its lock, not taken yet: [`ThreadLock::owner`], [`ThreadLock::live`]
/// or [`ThreadLock::bound`] take it. Two steps because the lock's guard borrows the lock this holds.
pub(super) struct ThreadLock<'d> {
    daemon: &'d Daemon,
    thread: &'d str,
    lock: Arc<Mutex<()>>,
}

/// The thread's lock, held until dropped.
pub(super) struct Held<'l> {
    _guard: MutexGuard<'l, ()>,
}

impl Daemon {
    /// Validates `thread`'s name and finds its lock (not taken).
    pub(super) fn thread_lock<'d>(&'d self, thread: &'d str) -> Result<ThreadLock<'d>, Error> {
        validate(NameKind::Thread, thread)?;
        Ok(ThreadLock {
            daemon: self,
            thread,
            lock: self.locks.get(&LockKey::thread(thread)),
        })
    }
}

impl ThreadLock<'_> {
    /// Takes the thread's lock and checks that `c` may act on the thread (its owner or root, when
    /// it exists at all).
    pub(super) fn owner(&self, c: &Caller) -> Result<Held<'_>, Error> {
        let held = Held {
            _guard: lock(&self.lock),
        };
        self.daemon.check_thread(c, self.thread)?;
        Ok(held)
    }

    /// [`Self::owner`], and the thread's live record: refused when the thread is released, unknown
    /// or a chat workspace (`op` names the request in that refusal).
    pub(super) fn live(
        &self,
        c: &Caller,
        op: ChatOp,
    ) -> Result<(WorkspaceRecord, Held<'_>), Error> {
        let held = self.owner(c)?;
        let rec = self.daemon.live_record(self.thread)?;
        if rec.chat {
            return Err(self.chat(op));
        }
        Ok((rec, held))
    }

    /// [`Self::owner`], and the thread's project: from its live record (refused for a chat
    /// workspace) or, released, its binding; refused when it has neither.
    pub(super) fn bound(&self, c: &Caller, op: ChatOp) -> Result<(Bound, Held<'_>), Error> {
        let held = self.owner(c)?;
        let layout = &self.daemon.layout;
        let live = WorkspaceRecord::load(layout, self.thread)?;
        let binding = Binding::load(layout, self.thread)?;
        let project = match (&live, &binding) {
            (Some(r), _) if r.chat => return Err(self.chat(op)),
            (Some(r), _) => r.project.clone(),
            (None, Some(b)) => b.project.clone(),
            (None, None) => return Err(Error::UnknownThread(self.thread.to_string())),
        };
        let bound = Bound {
            project,
            live,
            binding,
        };
        Ok((bound, held))
    }

    fn chat(&self, op: ChatOp) -> Error {
        Refusal::Chat {
            thread: self.thread.to_string(),
            op,
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Layout;
    use crate::workspace::Owner;

    fn daemon(dir: &std::path::Path) -> Daemon {
        let layout = Layout::resolve(Some(dir.join("state")), Some(dir.join("root")));
        std::fs::create_dir_all(&layout.state).unwrap();
        let settings = super::super::Settings {
            freshness_secs: 0,
            passthrough: false,
            sweep_idle: 0,
            sweep_every: 0,
            fetch_timeout_secs: 0,
            transport: Default::default(),
            io: Default::default(),
            max_threads_per_user: 0,
            quota_per_user: None,
            keep_connections: false,
            metrics: None,
        };
        Daemon::new(layout, settings).unwrap()
    }

    /// A live workspace record of `thread` (nothing mounted), owned by uid `owner`.
    fn live(d: &Daemon, thread: &str, owner: u32, chat: bool) {
        let rec: WorkspaceRecord = serde_json::from_value(serde_json::json!({
            "thread": thread, "project": if chat { "" } else { "p" },
            "base_commit": "0".repeat(40), "base_tree": "0".repeat(40), "base_time": 0,
            "created": 0, "mounted": false, "chat": chat,
            "owner": {"uid": owner, "gid": owner},
        }))
        .unwrap();
        rec.save(&d.layout).unwrap();
    }

    fn bind(d: &Daemon, thread: &str, owner: u32) {
        Binding {
            thread: thread.into(),
            project: "p".into(),
            base_commit: gix::ObjectId::null(gix::hash::Kind::Sha1),
            branch: None,
            created: 0,
            owner: Owner {
                uid: owner,
                gid: owner,
            },
            io: None,
        }
        .save(&d.layout)
        .unwrap();
    }

    /// A caller who is neither root nor the daemon's user.
    fn user(uid: u32) -> Caller {
        assert_ne!(uid, crate::sys::euid());
        Caller {
            uid,
            gid: uid,
            groups: vec![],
        }
    }

    fn refusal<T>(r: Result<T, Error>) -> String {
        match r {
            Ok(_) => panic!("not refused"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_guard_refuses_a_bad_name_before_anything() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path());
        let e = refusal(d.thread_lock("../x"));
        assert!(e.contains("../x"), "{e}");
    }

    #[test]
    fn the_guard_refuses_another_users_thread() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path());
        live(&d, "t", 60001, false);
        let l = d.thread_lock("t").unwrap();
        let e = refusal(l.live(&user(60002), ChatOp::Push));
        assert!(
            e.starts_with("permission denied: thread t belongs to uid 60001"),
            "{e}"
        );
        assert!(e.contains(", not to uid 60002"), "{e}");
        // The owner passes, and gets the record.
        let (rec, _held) = l.live(&user(60001), ChatOp::Push).unwrap();
        assert_eq!((rec.thread.as_str(), rec.project.as_str()), ("t", "p"));
    }

    #[test]
    fn the_guard_refuses_a_chat_workspace_naming_the_request() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path());
        live(&d, "c", 60001, true);
        let l = d.thread_lock("c").unwrap();
        let e = refusal(l.live(&user(60001), ChatOp::Commit));
        assert_eq!(
            e,
            "thread c is a chat workspace (no project): nothing to commit to"
        );
        let e = refusal(l.bound(&user(60001), ChatOp::Diff));
        assert_eq!(e, "thread c is a chat workspace: nothing is saved to diff");
    }

    #[test]
    fn the_guard_refuses_a_released_and_an_unknown_thread() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path());
        bind(&d, "r", 60001);
        let l = d.thread_lock("r").unwrap();
        let e = refusal(l.live(&user(60001), ChatOp::Pull));
        assert_eq!(e, "thread r is released (open it to resume)");
        // Released is enough where the binding serves (diff, export).
        let (b, _held) = l.bound(&user(60001), ChatOp::Export).unwrap();
        assert_eq!(b.project, "p");
        assert!(b.live.is_none() && b.binding.is_some());
        drop(_held);
        // Nor may another user act on a released thread.
        let e = refusal(l.bound(&user(60002), ChatOp::Export));
        assert!(
            e.starts_with("permission denied: thread r belongs to"),
            "{e}"
        );

        let l = d.thread_lock("nobody").unwrap();
        let e = refusal(l.live(&user(60001), ChatOp::Resync));
        assert_eq!(e, "unknown thread \"nobody\"");
        let e = refusal(l.bound(&user(60001), ChatOp::Diff));
        assert_eq!(e, "unknown thread \"nobody\"");
    }

    #[test]
    fn the_guard_holds_the_threads_lock() {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path());
        live(&d, "t", 60001, false);
        let l = d.thread_lock("t").unwrap();
        let held = l.owner(&user(60001)).unwrap();
        // Those who take the thread's lock by its key (open, release, moves) wait on the same one.
        let same = d.locks.get(&LockKey::thread("t"));
        assert!(same.try_lock().is_err());
        drop(held);
        assert!(same.try_lock().is_ok());
        assert!(
            d.locks.get(&LockKey::project("t")).try_lock().is_ok(),
            "a project's lock is not its namesake thread's"
        );
    }
}
