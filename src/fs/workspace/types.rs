//! The request and reply types of the workspace core: what callers (the fuser adapter, the daemon,
//! the tests) pass in and get back. Plain data; no behaviour and no state.

use std::ffi::OsString;
use std::fs::File;
use std::time::SystemTime;

use fuser::{FileAttr, FileType};
use gix::ObjectId;

use crate::cow::catalog::Ts;
use crate::git::snapshot::ViewEdit;

use super::posix::NodeMeta;

/// Who is asking (from the FUSE request header).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

/// How the workspace presents what nobody changed.
#[derive(Debug, Clone, Copy)]
pub struct Presentation {
    pub uid: u32,
    pub gid: u32,
    /// The base commit's committer time: mtime, ctime and atime of every unmodified entry.
    pub time: SystemTime,
}

/// A directory entry with its attributes (readdirplus needs both).
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub attr: FileAttr,
}

/// One name of a directory as `readdir` reports it: the inode it names now and its kind.
#[derive(Debug, Clone)]
pub struct DirName {
    pub name: OsString,
    pub ino: u64,
    pub kind: FileType,
}

/// The names in a directory (as bytes) and their kinds.
pub type Listing = Vec<(Vec<u8>, FileType)>;

/// A time to set: now, or a given time.
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of one `setattr`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
    /// Clear set-user-ID, and set-group-ID when group execution is allowed (the kernel's rule for
    /// a write, truncate or chown by a caller without `CAP_FSETID`), after `mode` is applied. A
    /// directory keeps its bits.
    pub kill_suidgid: bool,
}

impl SetAttr {
    /// This change as a SETATTR from `caller_uid` asks for it, with set-user-ID and set-group-ID
    /// dropped where a local file system drops them (`FUSE_HANDLE_KILLPRIV_V2` leaves that to the
    /// file system; fuser does not pass the kernel's `FATTR_KILL_SUIDGID`, so root stands for
    /// `CAP_FSETID`): on a chown always, on a truncate by a caller without it, and on a SETATTR
    /// that changes nothing, which is what the kernel's `file_remove_privs` sends before a write
    /// that does not come to the daemon (passthrough).
    pub fn from_caller(mut self, caller_uid: u32) -> SetAttr {
        let nothing = self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
            && self.ctime.is_none();
        self.kill_suidgid = self.uid.is_some()
            || self.gid.is_some()
            || (self.size.is_some() && caller_uid != 0)
            || nothing;
        self
    }
}

/// What `open` hands the adapter.
#[derive(Debug)]
pub struct Opened {
    pub file: File,
    /// The file is the workspace's own data file (else the read-only blob-cache file of the base).
    pub upper: bool,
    /// Counted as a writer of the inode (write access or `O_TRUNC`): its release must say so, and
    /// only then (an `O_RDONLY|O_CREAT` create is no writer).
    pub write: bool,
}

/// Result of `getxattr`/`listxattr`: the size asked for, or the bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum XattrReply {
    Size(u32),
    Data(Vec<u8>),
}

/// A change from the base, as `status` and `diff` list it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
    /// A directory (everything below it may differ too).
    pub dir: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Behind {
    /// Name `name` in directory `parent` was created, removed or now leads to another inode: the
    /// kernel's entry (or cached absence) of it, and the directory's listing and attributes.
    Entry { parent: u64, name: Vec<u8> },
    /// The attributes or content of inode `ino` changed.
    Inode(u64),
}

/// A consistent view of what differs from the base, read in one critical section.
#[derive(Debug, Clone)]
pub struct View {
    pub base_tree: ObjectId,
    /// The tree `edits` apply to: the base tree, or (`since_last`) the last snapshot's tree.
    pub onto: ObjectId,
    /// The edits rebuild only what changed since the last snapshot (see
    /// [`WorkspaceFs::snapshot_view`](super::WorkspaceFs::snapshot_view)).
    pub since_last: bool,
    /// The snapshot epoch this view closed (0 for a view that closes none): what
    /// [`WorkspaceFs::snapshot_saved`](super::WorkspaceFs::snapshot_saved) is told.
    pub epoch: u64,
    pub edits: Vec<ViewEdit>,
    /// The metadata the snapshot's POSIX record is made from, by path: every node whose own
    /// metadata git drops, and the directories above them (see `WorkspaceFs::view_meta`).
    pub meta: Vec<NodeMeta>,
    /// The workspace's generation when the view was read.
    pub generation: u64,
    /// When the view was read.
    pub taken_at: Ts,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeChange {
    Remove,
    File { id: ObjectId, exec: bool },
    Symlink { id: ObjectId },
    Gitlink { id: ObjectId },
}
