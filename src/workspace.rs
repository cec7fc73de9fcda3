//! A thread's durable records, written atomically:
//! - its [`Binding`] (`<state>/threads/<thread>.json`): the project it is bound to (once, for good),
//!   which survives release so that the thread can be resumed and never re-bound;
//! - its live [`WorkspaceRecord`] (`<state>/workspaces/<thread>/workspace.json`): the base the
//!   workspace is forked from, whether it should be mounted, and what its last snapshot saw. It goes
//!   with the rest of `<state>/workspaces/<thread>` when the thread is released.
//!
//! This module only stores and loads records; mounting is the daemon's job.

use gix::ObjectId;
use serde::{Deserialize, Serialize};

use crate::layout::Layout;
use crate::records::{RecordDir, RecordError};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkspaceRecord {
    pub thread: String,
    pub project: String,
    /// The base commit and its tree: the lower layer of the workspace.
    #[serde(with = "crate::records::hex")]
    pub base_commit: ObjectId,
    #[serde(with = "crate::records::hex")]
    pub base_tree: ObjectId,
    /// The base commit's committer time (Unix seconds): the times unmodified files present.
    pub base_time: i64,
    /// The ref the caller asked for, when they named one.
    pub requested_ref: Option<String>,
    /// The branch the workspace is on, when the base was a branch.
    pub branch: Option<String>,
    /// Unix seconds of creation.
    pub created: u64,
    /// Whether the daemon should serve this workspace (remounted after a restart).
    pub mounted: bool,
    /// A chat workspace: a fork of the blank repository, never saved, discarded on release.
    #[serde(default)]
    pub chat: bool,
    /// What the mirror has seen of this workspace: the state at its last snapshot (or at fork).
    #[serde(default)]
    pub saved: Option<SavedMark>,
    /// The workspace's owner: the user who opened it. Its files are presented as this user's, and only
    /// this user or root may act on it. Records written before owners existed belong to root.
    #[serde(default)]
    pub owner: Owner,
    /// Overlapping users of the thread: `open` adds one, `release` removes one, and the last one
    /// releases. Kept here so that a daemon restart does not forget who still holds the workspace
    /// (records written before it was kept count as one).
    #[serde(default)]
    pub users: u32,
    /// Who those users are: each caller's uid once (a second `open` by the same caller is not
    /// another user). Records written before it was kept hold only the count: their users are
    /// taken as the owner.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_uids: Vec<u32>,
    /// `release --when-idle` was asked: the daemon releases the workspace once no process uses the
    /// mount; a new `open` clears it. Kept here so that a daemon restart keeps waiting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_when_idle: bool,
    /// The dependency layers presented read-through in this workspace (grafted into its view, never
    /// into its base commit or a snapshot). Empty for a workspace without dependencies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<crate::deps::DepLayer>,
    /// The tree whose lockfiles chose the layers when it differs from `base_tree` (a resumed
    /// thread's snapshot, whose lockfile may be its agent's): what `status` compares the presented
    /// layers with.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::records::hex::option"
    )]
    pub files_tree: Option<ObjectId>,
    /// The I/O mode the thread asked for (`open --io`); none: the daemon's (`serve --io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<crate::fs::IoMode>,
    /// The mode `serve --io auto` chose for this workspace's mount, and from what: kept for the
    /// workspace's life (restart, adoption and remount serve it the same way), gone with it at
    /// release. None: asked (`io`), a daemon with a fixed `serve --io`, or not mounted yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_auto: Option<IoChosen>,
    /// Its `.git/index` was put in after the mount (its base's shared index was not built when it
    /// was opened: `daemon::later_index`). A daemon that loads it again and finds no index in its
    /// `.git` (the one that should have put it in stopped first) puts it in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub index_later: bool,
}

/// What `serve --io auto` chose for one mount (`crate::daemon` decides, this only stores it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoChosen {
    pub mode: crate::fs::IoMode,
    /// The base's file bytes (the sizes of its tree's blobs).
    pub bytes: u64,
    /// The bytes of the other live no-open mounts' bases, when it was chosen.
    pub live: u64,
    /// The budget: half the memory the daemon may use.
    pub budget: u64,
    /// The live no-open mounts of the same base, when it was chosen (0 in records written
    /// before the per-base limit, and then not written).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub same_base: u32,
    /// The most live no-open mounts of one base, when it was chosen (0: no limit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub per_base: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A local user (and primary group) that owns a workspace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// The workspace state the mirror has seen.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SavedMark {
    /// The snapshot commit (None: the state is the fork's base, which the mirror has).
    #[serde(default, with = "crate::records::hex::option")]
    pub commit: Option<ObjectId>,
    /// The workspace generation and the time of the view the snapshot was built from.
    pub generation: u64,
    pub at: crate::cow::catalog::Ts,
    /// Inodes of octofs's own bookkeeping files (not changes of the state).
    #[serde(default)]
    pub bookkeeping: Vec<u64>,
}

/// A thread's binding to its project, kept across release.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Binding {
    pub thread: String,
    pub project: String,
    /// Where the thread was first forked (resumed from when it was released with no snapshot).
    #[serde(with = "crate::records::hex")]
    pub base_commit: ObjectId,
    pub branch: Option<String>,
    pub created: u64,
    /// Who owns the thread, for good: the user who first opened it (bindings written before
    /// owners existed belong to root).
    #[serde(default)]
    pub owner: Owner,
    /// The I/O mode the thread asked for (`open --io`), kept across release and resume; none: the
    /// daemon's (`serve --io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io: Option<crate::fs::IoMode>,
}

impl Binding {
    /// Bindings live at `<state>/threads/<thread>.json`.
    fn store(layout: &Layout) -> RecordDir {
        RecordDir::files(layout.state.join("threads"), "thread", "thread")
    }

    pub fn load(layout: &Layout, thread: &str) -> Result<Option<Binding>, RecordError> {
        Self::store(layout).load(thread)
    }

    pub fn save(&self, layout: &Layout) -> Result<(), RecordError> {
        Self::store(layout).save(&self.thread, self)
    }

    /// The binding written beside its file, to be synced and put in place by the caller together
    /// with other durable writes ([`crate::records::StagedRecord`]): a new thread's.
    pub fn stage(&self, layout: &Layout) -> Result<crate::records::StagedRecord, RecordError> {
        Self::store(layout).stage(&self.thread, self)
    }

    /// Removes the binding of `thread`, if any.
    pub fn remove(layout: &Layout, thread: &str) {
        Self::store(layout).remove(thread)
    }

    /// Moves the binding of `thread` out of the way unread (see [`RecordDir::set_aside`]).
    pub fn set_aside(layout: &Layout, thread: &str) -> std::io::Result<std::path::PathBuf> {
        Self::store(layout).set_aside(thread)
    }

    /// Every binding, sorted by thread.
    pub fn list(layout: &Layout) -> Result<Vec<Binding>, RecordError> {
        let mut out: Vec<Binding> = Self::store(layout).list(|_| true)?;
        out.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok(out)
    }
}

impl WorkspaceRecord {
    /// The uids holding the thread, each once (a record from before they were kept: its owner,
    /// when it counted any user).
    pub fn holders(&self) -> Vec<u32> {
        if self.user_uids.is_empty() && self.users > 0 {
            vec![self.owner.uid]
        } else {
            self.user_uids.clone()
        }
    }

    /// Sets who holds the thread (and the count kept beside them).
    pub fn set_holders(&mut self, mut uids: Vec<u32>) {
        let mut seen = Vec::with_capacity(uids.len());
        uids.retain(|u| {
            let new = !seen.contains(u);
            seen.push(*u);
            new
        });
        self.users = uids.len() as u32;
        self.user_uids = uids;
    }

    /// Records live at `<state>/workspaces/<thread>/workspace.json`.
    fn store(layout: &Layout) -> RecordDir {
        RecordDir::in_dirs(layout.workspaces(), "workspace.json", "thread", "workspace")
    }

    pub fn load(layout: &Layout, thread: &str) -> Result<Option<WorkspaceRecord>, RecordError> {
        Self::store(layout).load(thread)
    }

    pub fn save(&self, layout: &Layout) -> Result<(), RecordError> {
        Self::store(layout).save(&self.thread, self)
    }

    /// The record written beside its file, to be synced and put in place by the caller together
    /// with other durable writes ([`crate::records::StagedRecord`]): a new workspace's.
    pub fn stage(&self, layout: &Layout) -> Result<crate::records::StagedRecord, RecordError> {
        Self::store(layout).stage(&self.thread, self)
    }

    /// Every workspace record, sorted by thread.
    pub fn list(layout: &Layout) -> Result<Vec<WorkspaceRecord>, RecordError> {
        let mut out: Vec<WorkspaceRecord> = Self::store(layout)
            .list(|name| crate::names::validate(crate::names::NameKind::Thread, name).is_ok())?;
        out.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok(out)
    }

    /// Every layer a workspace record holds, with the thread and its owner's uid: what
    /// `deps list` shows as a layer's users and `deps gc` keeps ([`crate::deps::gc`]).
    pub fn layer_uses(layout: &Layout) -> std::io::Result<Vec<crate::deps::gc::LayerUse>> {
        let recs = Self::list(layout).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(recs
            .into_iter()
            .flat_map(|r| {
                let thread = r.thread.clone();
                let uid = r.owner.uid;
                r.layers
                    .into_iter()
                    .map(move |l| (l.key, thread.clone(), uid))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records as the daemon wrote them before they held object ids (hex strings), checked in.
    const WORKSPACE: &str = include_str!("../tests/fixtures/records/workspace.json");
    const WORKSPACE_PLAIN: &str = include_str!("../tests/fixtures/records/workspace-plain.json");
    const BINDING: &str = include_str!("../tests/fixtures/records/binding.json");

    /// Catches: a record whose object ids are written in another form than the 40-hex strings on
    /// disk (gix's `{"Sha1":[…]}`), a missing `null`, or a field that reads back differently.
    #[test]
    fn records_on_disk_read_and_write_back_byte_for_byte() {
        for text in [WORKSPACE, WORKSPACE_PLAIN] {
            let rec: WorkspaceRecord = serde_json::from_str(text).expect("workspace record");
            let out = serde_json::to_vec_pretty(&rec).expect("encode");
            assert_eq!(String::from_utf8_lossy(&out), text);
        }
        let b: Binding = serde_json::from_str(BINDING).expect("binding");
        let out = serde_json::to_vec_pretty(&b).expect("encode");
        assert_eq!(String::from_utf8_lossy(&out), BINDING);
    }

    /// Catches: a record whose base commit is not an object id loaded as some id (or a panic)
    /// instead of a corrupt record naming the file and the bad value.
    #[test]
    fn a_malformed_object_id_makes_the_record_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = Layout {
            state: dir.path().to_path_buf(),
            root: dir.path().join("root"),
        };
        let good = "\"base_commit\": \"3f2a9c0d5e7b41a8c6d2e0f19b8a7c6d5e4f3a21\"";
        assert!(WORKSPACE.contains(good));
        let ws = layout.workspaces().join("t1");
        std::fs::create_dir_all(&ws).expect("mkdir");
        let path = ws.join("workspace.json");
        std::fs::write(&path, WORKSPACE.replace(good, "\"base_commit\": \"3f2a\"")).expect("write");
        let e = WorkspaceRecord::load(&layout, "t1")
            .expect_err("a bad id")
            .to_string();
        assert!(
            e.starts_with(&format!(
                "thread t1: corrupt {}: not a hex object id: \"3f2a\" (",
                path.display()
            )),
            "{e}"
        );
        let bad_saved = WORKSPACE.replace("c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00", "c0ffee");
        std::fs::write(&path, bad_saved).expect("write");
        let e = WorkspaceRecord::load(&layout, "t1")
            .expect_err("a bad id")
            .to_string();
        assert!(e.contains("not a hex object id: \"c0ffee\""), "{e}");
    }
}
