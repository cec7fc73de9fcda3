//! Records, bindings and callers for the lifecycle decisions' unit tests (test builds only).

use crate::access::Caller;
use crate::workspace::{Binding, Owner, WorkspaceRecord};

/// Two ordinary users without a name on any test host (their refusals say "uid N"), and root.
pub(in crate::daemon) const ALICE: u32 = 64001;
pub(in crate::daemon) const BOB: u32 = 64002;
pub(in crate::daemon) const ROOT: u32 = 0;

pub(in crate::daemon) const BASE: &str = "3f0c2a9d51e7b4c8a6f1d2e3c4b5a69788796a5b";

fn id(hex: &str) -> gix::ObjectId {
    gix::ObjectId::from_hex(hex.as_bytes()).expect("an object id")
}

pub(in crate::daemon) fn caller(uid: u32) -> Caller {
    Caller {
        uid,
        gid: uid,
        groups: Vec::new(),
    }
}

pub(in crate::daemon) fn owner(uid: u32) -> Owner {
    Owner { uid, gid: uid }
}

/// `thread`'s live workspace on `project`, `owner`'s, mounted and held by its owner.
pub(in crate::daemon) fn live(thread: &str, project: &str, uid: u32) -> WorkspaceRecord {
    WorkspaceRecord {
        thread: thread.into(),
        project: project.into(),
        base_commit: id(BASE),
        base_tree: id("4b825dc642cb6eb9a060e54bf8d69288fbee4904"),
        base_time: 0,
        requested_ref: None,
        branch: Some(format!("octofs/{thread}")),
        created: 0,
        mounted: true,
        chat: false,
        saved: None,
        owner: owner(uid),
        users: 1,
        user_uids: vec![uid],
        release_when_idle: false,
        layers: Vec::new(),
        files_tree: None,
        io: None,
        io_auto: None,
        index_later: false,
    }
}

/// A chat workspace (no project) of `uid`.
pub(in crate::daemon) fn chat(thread: &str, uid: u32) -> WorkspaceRecord {
    WorkspaceRecord {
        chat: true,
        ..live(thread, crate::daemon::mirrors::BLANK, uid)
    }
}

/// `thread`'s binding to `project`, `uid`'s.
pub(in crate::daemon) fn binding(thread: &str, project: &str, uid: u32) -> Binding {
    Binding {
        thread: thread.into(),
        project: project.into(),
        base_commit: id(BASE),
        branch: Some(format!("octofs/{thread}")),
        created: 0,
        owner: owner(uid),
        io: None,
    }
}
