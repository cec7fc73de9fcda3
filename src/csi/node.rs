//! What NodePublishVolume and NodeUnpublishVolume do on this node: open (or resume) a thread as the
//! pod's user, bind its workspace at the pod's volume path, and on the last unpublish of a thread
//! release it (the daemon snapshots it and pushes the snapshot to the project's share remote).
//!
//! Every daemon request that acts on a thread runs as the pod's user: the plugin starts `octofs
//! open`/`octofs release` with that uid and gid (no supplementary groups), so the daemon's own
//! rules on who may open, own and release a thread apply as to any local user of that uid, and a
//! pod never gets more than that user has. Root's authority is used only for what kubelet itself
//! asks of a node plugin: creating and removing the target directory kubelet named, the bind mount
//! and its unmount, and read-only requests (ping, the list of projects). The publications are kept
//! in `<plugin-dir>/publications.json` (written whole, then renamed), so that a restarted plugin
//! knows them. Nothing here touches the daemon's state directory or a workspace's files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tonic::{Code, Status};

use super::proto::{AccessType, NodePublishVolumeRequest};
use crate::client::ClientError;
use crate::layout::Layout;
use crate::names::{NameKind, validate};
use crate::proto::{Call, MirrorList, Ping};

/// What the plugin is told at start.
#[derive(Debug, Clone)]
pub struct Config {
    pub layout: Layout,
    pub node_id: String,
    /// Where the publications are recorded.
    pub plugin_dir: PathBuf,
    /// The lowest uid a pod may ask for (`uid` attribute); root only when this is 0.
    pub min_uid: u32,
    /// The `octofs` binary run as the pod's user.
    pub exe: PathBuf,
}

/// One publication: a volume of a pod at its target path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub volume_id: String,
    pub target: PathBuf,
    pub project: String,
    pub thread: String,
    pub uid: u32,
    pub gid: u32,
    pub readonly: bool,
    /// `namespace/name` of the pod, for the log and for people reading the file.
    #[serde(default)]
    pub pod: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    publications: Vec<Publication>,
}

/// The node side of the plugin.
pub struct Node {
    pub config: Config,
    /// One publish or unpublish at a time (they read and write the record whole).
    lock: Mutex<()>,
}

/// The volume attributes a pod gives (`volumeAttributes` of its inline volume) and kubelet's.
pub const ATTR_PROJECT: &str = "project";
pub const ATTR_THREAD: &str = "thread";
pub const ATTR_REF: &str = "ref";
pub const ATTR_UID: &str = "uid";
pub const ATTR_GID: &str = "gid";
pub const CTX_EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
pub const CTX_POD_NAME: &str = "csi.storage.k8s.io/pod.name";
pub const CTX_POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

/// The daemon's one-line refusal as a gRPC status: a permission refusal is PERMISSION_DENIED, an
/// unknown thread NOT_FOUND, anything else INTERNAL.
fn from_daemon(what: &str, line: &str) -> Status {
    let line = line.trim();
    let line = line.strip_prefix("octofs: ").unwrap_or(line);
    let code = if line.starts_with("permission denied") {
        Code::PermissionDenied
    } else if line.starts_with("unknown thread") {
        Code::NotFound
    } else {
        Code::Internal
    };
    Status::new(code, format!("{what}: {line}"))
}

impl Node {
    pub fn new(config: Config) -> Node {
        Node {
            config,
            lock: Mutex::new(()),
        }
    }

    fn record_path(&self) -> PathBuf {
        self.config.plugin_dir.join("publications.json")
    }

    fn load(&self) -> Result<Record, Status> {
        match std::fs::read(self.record_path()) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                Status::internal(format!(
                    "{} is not a publication record: {e}",
                    self.record_path().display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Record::default()),
            Err(e) => Err(Status::internal(format!(
                "cannot read {}: {e}",
                self.record_path().display()
            ))),
        }
    }

    fn save(&self, r: &Record) -> Result<(), Status> {
        let path = self.record_path();
        let tmp = path.with_extension("json.tmp");
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&self.config.plugin_dir)?;
            let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?;
            let mut f = std::fs::File::create(&tmp)?;
            std::io::Write::write_all(&mut f, &bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| Status::internal(format!("cannot write {}: {e}", path.display())))
    }

    /// The publications recorded (for tests and `Probe`'s log).
    pub fn publications(&self) -> Result<Vec<Publication>, Status> {
        Ok(self.load()?.publications)
    }

    /// Whether the daemon answers (Probe).
    pub fn daemon_ready(&self) -> bool {
        crate::client::call(&self.config.layout, Ping, false).is_ok()
    }

    /// A read-only request to the daemon as root (this process).
    fn ask<R: Call>(&self, req: R) -> Result<R::Answer, Status> {
        match crate::client::call(&self.config.layout, req, false) {
            Ok(a) => Ok(a.answer),
            Err(ClientError::Refused(e)) => Err(from_daemon("the octofs daemon", &e)),
            Err(e) => Err(Status::unavailable(format!("the octofs daemon: {e}"))),
        }
    }

    /// `octofs <args>` as the pod's user; its stdout, or its one-line error as a status.
    fn as_user(&self, uid: u32, gid: u32, what: &str, args: &[&str]) -> Result<String, Status> {
        use std::os::unix::process::CommandExt;
        let out = Command::new(&self.config.exe)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .arg("--state")
            .arg(&self.config.layout.state)
            .arg("--root")
            .arg(&self.config.layout.root)
            .args(args)
            .current_dir("/")
            // Root's supplementary groups are dropped by std when it sets the uid.
            .uid(uid)
            .gid(gid)
            .output()
            .map_err(|e| {
                Status::internal(format!("cannot run {}: {e}", self.config.exe.display()))
            })?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        for w in stderr
            .lines()
            .filter(|l| l.starts_with("octofs: warning: "))
        {
            tracing::warn!(uid, "{what}: {w}");
        }
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            let line = stderr
                .lines()
                .rfind(|l| !l.starts_with("octofs: warning: ") && !l.trim().is_empty())
                .unwrap_or("failed without a message");
            Err(from_daemon(what, line))
        }
    }

    /// NodePublishVolume.
    pub fn publish(&self, req: NodePublishVolumeRequest) -> Result<(), Status> {
        let p = self.check_publish(&req)?;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut rec = self.load()?;
        if let Some(old) = rec.publications.iter().find(|o| o.target == p.target) {
            if old.volume_id != p.volume_id {
                return Err(Status::already_exists(format!(
                    "{} is the target of volume {} already",
                    p.target.display(),
                    old.volume_id
                )));
            }
            if (
                old.project.as_str(),
                old.thread.as_str(),
                old.uid,
                old.readonly,
            ) != (p.project.as_str(), p.thread.as_str(), p.uid, p.readonly)
            {
                return Err(Status::already_exists(format!(
                    "volume {} is published at {} already with other attributes (thread {}, uid {}, readonly {})",
                    old.volume_id,
                    p.target.display(),
                    old.thread,
                    old.uid,
                    old.readonly
                )));
            }
            if crate::sys::fuse_mount_at(&p.target).is_some() {
                return Ok(());
            }
            // Recorded but not mounted (the node restarted): publish it again below.
        }
        // An unknown project is NOT_FOUND before anything is opened.
        let projects = self.ask(MirrorList)?;
        let known = projects.iter().any(|m| m.project.project == p.project);
        if !known {
            return Err(Status::not_found(format!(
                "no project {:?} on node {} (octofs mirror add {} UPSTREAM --share REMOTE)",
                p.project, self.config.node_id, p.project
            )));
        }
        let mut args = vec!["open", p.thread.as_str(), "--project", p.project.as_str()];
        let git_ref = req.volume_context.get(ATTR_REF).filter(|r| !r.is_empty());
        if let Some(r) = git_ref {
            args.extend(["--ref", r.as_str()]);
        }
        let printed = self.as_user(p.uid, p.gid, &format!("open {}", p.thread), &args)?;
        // What is bound is the daemon's mount point of the thread, a FUSE mount: never a path a
        // process of the pod's user could have put in the child's output.
        let ws = self.config.layout.mountpoint(&p.thread);
        if Path::new(printed.lines().last().unwrap_or_default()) != ws
            || crate::sys::fuse_mount_at(&ws).is_none()
        {
            return Err(Status::internal(format!(
                "octofs open {} did not mount it at {}",
                p.thread,
                ws.display()
            )));
        }
        if !rec.publications.iter().any(|o| o == &p) {
            rec.publications.push(p.clone());
        }
        // Recorded before the mount: an unpublish after a failure below still releases.
        self.save(&rec)?;
        if let Err(e) = std::fs::create_dir_all(&p.target) {
            return Err(Status::internal(format!(
                "cannot create {}: {e}",
                p.target.display()
            )));
        }
        if crate::sys::fuse_mount_at(&p.target).is_none()
            && let Err(e) = crate::sys::bind_mount(&ws, &p.target, p.readonly)
        {
            return Err(Status::internal(format!(
                "cannot bind {} at {}: {e}",
                ws.display(),
                p.target.display()
            )));
        }
        tracing::info!(volume = %p.volume_id, thread = %p.thread, uid = p.uid, pod = %p.pod, target = %p.target.display(), "published");
        Ok(())
    }

    /// The publication a request asks for, or INVALID_ARGUMENT / PERMISSION_DENIED.
    fn check_publish(&self, req: &NodePublishVolumeRequest) -> Result<Publication, Status> {
        if req.volume_id.is_empty() {
            return Err(invalid("volume_id is missing"));
        }
        if req.target_path.is_empty() {
            return Err(invalid("target_path is missing"));
        }
        let target = PathBuf::from(&req.target_path);
        if !target.is_absolute() {
            return Err(invalid(format!(
                "target_path {:?} is not absolute",
                req.target_path
            )));
        }
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| invalid("volume_capability is missing"))?;
        match &cap.access_type {
            Some(AccessType::Mount(_)) => {}
            Some(AccessType::Block(_)) => {
                return Err(invalid(
                    "octofs volumes are file systems: block access is not offered",
                ));
            }
            None => return Err(invalid("volume_capability has no access type")),
        }
        let ctx = &req.volume_context;
        let attr = |k: &str| ctx.get(k).map(String::as_str).filter(|v| !v.is_empty());
        if attr(CTX_EPHEMERAL) != Some("true") {
            return Err(invalid(format!(
                "octofs volumes are ephemeral inline volumes only ({CTX_EPHEMERAL} is not \"true\"); use a csi: volume in the pod"
            )));
        }
        let project =
            attr(ATTR_PROJECT).ok_or_else(|| invalid("volume attribute `project` is missing"))?;
        let thread =
            attr(ATTR_THREAD).ok_or_else(|| invalid("volume attribute `thread` is missing"))?;
        validate(NameKind::Project, project).map_err(|e| invalid(e.to_string()))?;
        validate(NameKind::Thread, thread).map_err(|e| invalid(e.to_string()))?;
        let uid: u32 = attr(ATTR_UID)
            .ok_or_else(|| {
                invalid(
                    "volume attribute `uid` is missing (the pod's runAsUser, who owns the thread)",
                )
            })?
            .parse()
            .map_err(|_| invalid("volume attribute `uid` is not a number"))?;
        if uid < self.config.min_uid {
            return Err(Status::permission_denied(format!(
                "uid {uid} is below this node's lowest pod uid {} (octofs csi --min-uid)",
                self.config.min_uid
            )));
        }
        let gid: u32 = match attr(ATTR_GID) {
            Some(g) => g
                .parse()
                .map_err(|_| invalid("volume attribute `gid` is not a number"))?,
            None => crate::sys::user_name(uid)
                .and_then(|n| crate::sys::user_by_name(&n).ok().flatten())
                .map_or(uid, |(_, g)| g),
        };
        let pod = match (attr(CTX_POD_NAMESPACE), attr(CTX_POD_NAME)) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            _ => String::new(),
        };
        Ok(Publication {
            volume_id: req.volume_id.clone(),
            target,
            project: project.to_string(),
            thread: thread.to_string(),
            uid,
            gid,
            readonly: req.readonly,
            pod,
        })
    }

    /// NodeUnpublishVolume.
    pub fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), Status> {
        if volume_id.is_empty() {
            return Err(invalid("volume_id is missing"));
        }
        if target_path.is_empty() {
            return Err(invalid("target_path is missing"));
        }
        let target = Path::new(target_path);
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut rec = self.load()?;
        let mine = rec
            .publications
            .iter()
            .position(|p| p.target == target && p.volume_id == volume_id);
        // The bind goes first (detached: the pod is gone, a process it left may still hold it).
        if crate::sys::fuse_mount_at(target).is_some() && (mine.is_some() || self.ours(target)) {
            crate::sys::lazy_unmount(target).map_err(|e| {
                Status::internal(format!("cannot unmount {}: {e}", target.display()))
            })?;
        }
        match std::fs::remove_dir(target) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Status::internal(format!(
                    "cannot remove {}: {e}",
                    target.display()
                )));
            }
        }
        let Some(i) = mine else {
            // Unknown or already unpublished: nothing more to do (the spec's idempotency).
            return Ok(());
        };
        let p = rec.publications[i].clone();
        let others = rec
            .publications
            .iter()
            .filter(|o| o.thread == p.thread && o.target != p.target)
            .count();
        if others == 0 {
            // The last publication of the thread here: the daemon snapshots it, pushes the
            // snapshot to the share and releases. A failure keeps the record: kubelet retries.
            let out = self.as_user(
                p.uid,
                p.gid,
                &format!("release {}", p.thread),
                &["release", p.thread.as_str()],
            );
            match out {
                Ok(line) => tracing::info!(thread = %p.thread, "{line}"),
                Err(s) if s.message().contains("unknown thread") => {}
                Err(s) if s.message().contains("is released") => {}
                Err(s) => return Err(s),
            }
        }
        rec.publications.remove(i);
        self.save(&rec)?;
        tracing::info!(volume = %p.volume_id, thread = %p.thread, target = %p.target.display(), remaining = others, "unpublished");
        Ok(())
    }

    /// Whether the mount at `target` is a workspace of this node's daemon (a bind of one of its
    /// mounts): an unrecorded target is unmounted only then.
    fn ours(&self, target: &Path) -> bool {
        let Some((dev, _)) = crate::sys::fuse_mount_at(target) else {
            return false;
        };
        crate::sys::fuse_mounts_under(&self.config.layout.root)
            .iter()
            .any(|m| crate::sys::fuse_mount_at(m).is_some_and(|(d, _)| d == dev))
    }
}
