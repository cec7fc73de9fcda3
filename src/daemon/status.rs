//! What the daemon tells about workspaces: `list`, `status`, git's fsmonitor queries and request
//! statistics. Read-only: nothing here changes a workspace, and the `mounts` map is locked only to
//! clone out what a question needs (counting changes may take a while).

use super::error::Error;
use super::proto::{self, WorkspaceStatus};
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::fs::WorkspaceFs;
use crate::fs::fuse::MountInfo;
use crate::names::{NameKind, validate};
use crate::workspace::{Owner, WorkspaceRecord};

impl Daemon {
    fn status_of(&self, rec: &WorkspaceRecord) -> WorkspaceStatus {
        #[derive(Clone, Copy)]
        struct Served<'a> {
            core: &'a WorkspaceFs,
            info: &'a MountInfo,
        }
        // Only the Arcs are taken under the global lock: counting changes may take a while.
        let taken = lock(&self.mounts)
            .get(&rec.thread)
            .map(|m| (m.core.clone(), m.info.clone()));
        let m = taken.as_ref().map(|(core, info)| Served { core, info });
        // The kernel's word, not the table's: a mount can be gone while the daemon still has its
        // session (taken away behind it).
        let in_kernel = m.is_some() && self.kernel_has(&rec.thread);
        let quota = self.quota_of(rec.owner.uid);
        WorkspaceStatus {
            thread: rec.thread.clone(),
            project: rec.project.clone(),
            base_commit: rec.base_commit.to_string(),
            branch: rec.branch.clone(),
            requested_ref: rec.requested_ref.clone(),
            mounted: in_kernel,
            path: self.layout.mountpoint(&rec.thread).display().to_string(),
            passthrough: m.map(|m| {
                m.info
                    .passthrough
                    .load(std::sync::atomic::Ordering::Relaxed)
            }),
            transport: m.and_then(|m| m.info.transport.get().cloned()),
            changed_paths: m
                .and_then(|m| m.core.changes().ok())
                .map(|c| c.len() as u64)
                .unwrap_or(0),
            bytes_used: m.map(|m| m.core.bytes_used()),
            owner_bytes: quota.map(|q| q.0),
            owner_quota: quota.map(|q| q.1),
            quarantined: m.map(|m| m.core.quarantined() as u64).unwrap_or(0),
            damaged: m.map(|m| m.core.damaged().to_vec()).unwrap_or_default(),
            base_content_opens: m.map(|m| m.core.base_content_opens()).unwrap_or(0),
            last_snapshot: rec
                .saved
                .as_ref()
                .and_then(|s| s.commit)
                .map(|c| c.to_string()),
            state: if in_kernel {
                "mounted"
            } else if m.is_some() || rec.mounted {
                // Recorded (or served) as mounted, but the kernel has no such mount.
                "not mounted"
            } else {
                "unmounted"
            }
            .into(),
            users: if m.is_some() { rec.users.max(1) } else { 0 },
            user_names: if m.is_some() {
                rec.holders()
                    .iter()
                    .map(|u| crate::access::user_label(*u))
                    .collect()
            } else {
                Vec::new()
            },
            owner: crate::access::user_label(rec.owner.uid),
            // Asked by `status` only (`list` reads no project record per thread).
            access: None,
            chat: rec.chat,
            release_when_idle: rec.release_when_idle,
            layers: rec.layers.clone(),
            dependencies: if rec.chat {
                Vec::new()
            } else {
                self.dependency_lines(rec)
            },
            io: m.map(|m| m.info.io_mode().to_string()),
            io_why: m.map(|_| self.io_why(rec)),
            kept: if rec.chat {
                None
            } else {
                self.kept_line(rec, m.map(|m| m.core))
            },
        }
    }

    /// Why git in a live workspace cannot read its project's history: its owner may no longer
    /// bind the project (`mirror access` took them off); none while they may.
    fn access_note(&self, rec: &WorkspaceRecord) -> Option<String> {
        let admin = rec.owner.uid == 0 || rec.owner.uid == crate::sys::euid();
        if rec.chat || admin {
            return None;
        }
        let p = crate::git::mirror::load(&self.layout, &rec.project).ok()??;
        let owner = Caller {
            uid: rec.owner.uid,
            gid: rec.owner.gid,
            groups: crate::sys::user_groups(rec.owner.uid),
        };
        (!super::authz::may_bind(&owner, &p.access)).then(|| {
            format!(
                "revoked: {} may no longer bind project {}, so git here cannot read its history (.git/octofs/objects) until root grants it again (octofs mirror access); the files stay and release saves them",
                crate::access::user_label(rec.owner.uid),
                rec.project
            )
        })
    }

    /// The line naming what a live thread keeps beside its tree (`super::kept`): what its changes
    /// and its last snapshot hold; without a mount, its last snapshot's.
    pub(super) fn kept_line(
        &self,
        rec: &WorkspaceRecord,
        core: Option<&WorkspaceFs>,
    ) -> Option<String> {
        let repo = crate::git::snapshot::open(&self.layout.mirror(&rec.project)).ok()?;
        let last = rec.saved.as_ref().and_then(|m| m.commit);
        let roots = match core {
            Some(core) => super::kept::live_roots(core, &repo, last),
            None => last
                .map(|l| super::kept::roots_of(&repo, l))
                .unwrap_or_default(),
        };
        super::kept::describe(&roots)
    }

    /// A released thread: bound to its project, no workspace until it is opened again.
    fn status_of_released(&self, b: &crate::workspace::Binding) -> WorkspaceStatus {
        let last = crate::git::snapshot::open(&self.layout.mirror(&b.project))
            .ok()
            .and_then(|r| {
                crate::git::snapshot::read_ref(&r, &crate::git::snapshot::thread_ref(&b.thread))
            })
            .map(|id| id.to_string());
        WorkspaceStatus {
            thread: b.thread.clone(),
            project: b.project.clone(),
            base_commit: last.clone().unwrap_or_else(|| b.base_commit.to_string()),
            branch: b.branch.clone(),
            requested_ref: None,
            mounted: false,
            path: self.layout.mountpoint(&b.thread).display().to_string(),
            passthrough: None,
            transport: None,
            changed_paths: 0,
            bytes_used: None,
            owner_bytes: None,
            owner_quota: None,
            quarantined: 0,
            damaged: Vec::new(),
            base_content_opens: 0,
            last_snapshot: last.clone(),
            state: "released".into(),
            users: 0,
            user_names: Vec::new(),
            owner: crate::access::user_label(b.owner.uid),
            access: None,
            chat: false,
            release_when_idle: false,
            layers: Vec::new(),
            dependencies: Vec::new(),
            io: None,
            io_why: None,
            kept: last
                .as_deref()
                .and_then(|l| gix::ObjectId::from_hex(l.as_bytes()).ok())
                .and_then(|l| {
                    let repo = crate::git::snapshot::open(&self.layout.mirror(&b.project)).ok()?;
                    super::kept::describe(&super::kept::roots_of(&repo, l))
                }),
        }
    }

    pub(super) fn fsmonitor(
        &self,
        thread: &str,
        token: &str,
        c: &Caller,
    ) -> Reply<proto::FsmonitorAnswer> {
        let core = self.owned_mount(thread, c)?;
        let (token, changed) = core.fsmonitor_query(token);
        let mut answer = proto::FsmonitorAnswer {
            token,
            everything: false,
            paths: Vec::new(),
        };
        match changed {
            crate::fs::Changed::Everything => answer.everything = true,
            crate::fs::Changed::Paths(paths) => {
                for p in paths {
                    match String::from_utf8(p) {
                        Ok(s) => answer.paths.push(s),
                        Err(_) => {
                            answer.everything = true;
                            answer.paths.clear();
                            break;
                        }
                    }
                }
            }
        }
        Ok((answer, vec![]))
    }

    /// The core of `thread`'s mounted workspace, for its owner (or root): what changed in a
    /// workspace is its owner's business.
    fn owned_mount(&self, thread: &str, c: &Caller) -> Result<std::sync::Arc<WorkspaceFs>, Error> {
        validate(NameKind::Thread, thread)?;
        let (core, owner) = lock(&self.mounts)
            .get(thread)
            .map(|m| (m.core.clone(), m.owner))
            .ok_or_else(|| Error::NotMounted(thread.to_string()))?;
        self.require_owner(c, thread, owner)?;
        Ok(core)
    }

    /// `octofs watch`: the journal entries of a mounted thread after `token` (its owner's business).
    pub(super) fn watch(&self, thread: &str, token: &str, c: &Caller) -> Reply<proto::WatchAnswer> {
        let core = self.owned_mount(thread, c)?;
        let (token, entries) = core.watch_query(token);
        let answer = match entries {
            None => proto::WatchAnswer {
                token,
                everything: true,
                entries: Vec::new(),
            },
            Some(entries) => proto::WatchAnswer {
                token,
                everything: false,
                entries: entries
                    .into_iter()
                    .map(|(token, p)| {
                        let path_hex = std::str::from_utf8(&p)
                            .is_err()
                            .then(|| p.iter().map(|b| format!("{b:02x}")).collect());
                        // The kind comes from the core, which follows no symlink: a caller's own
                        // lstat through the mount would follow an intermediate symlink the agent
                        // planted, and tell a root watcher about a host path.
                        let dir = p.ends_with(b"/");
                        let comps: Vec<&[u8]> =
                            p.split(|b| *b == b'/').filter(|c| !c.is_empty()).collect();
                        let exists =
                            comps.is_empty() || matches!(core.kind_at(&comps), Ok(Some(_)));
                        let kind = match (exists, dir) {
                            (false, _) => "removed",
                            (true, true) => "directory",
                            (true, false) => "changed",
                        };
                        proto::WatchEntry {
                            token,
                            path: String::from_utf8_lossy(&p).into_owned(),
                            path_hex,
                            kind: kind.into(),
                        }
                    })
                    .collect(),
            },
        };
        Ok((answer, vec![]))
    }

    /// Request statistics of one mounted thread (its owner's business), or of every mount summed
    /// (root only: the daemon-wide figures describe every user's activity).
    pub(super) fn stats(&self, thread: Option<&str>, c: &Caller) -> Reply<proto::StatsAnswer> {
        let mut answer = proto::StatsAnswer::default();
        match thread {
            Some(thread) => {
                validate(NameKind::Thread, thread)?;
                let (info, owner) = lock(&self.mounts)
                    .get(thread)
                    .map(|m| (m.info.clone(), m.owner))
                    .ok_or_else(|| Error::NotMounted(thread.to_string()))?;
                self.require_owner(c, thread, owner)?;
                answer.workspaces.push(proto::WorkspaceStats {
                    thread: thread.to_string(),
                    stats: info.stats.report(),
                    io: Some(info.io_mode().to_string()),
                    io_why: self.io_why_of(thread),
                });
            }
            None => {
                self.require_admin(c, "see every workspace's statistics")?;
                let mut infos: Vec<_> = lock(&self.mounts)
                    .iter()
                    .map(|(t, m)| (t.clone(), m.info.clone()))
                    .collect();
                infos.sort_by(|a, b| a.0.cmp(&b.0));
                for (thread, info) in infos {
                    answer.workspaces.push(proto::WorkspaceStats {
                        io: Some(info.io_mode().to_string()),
                        io_why: self.io_why_of(&thread),
                        thread,
                        stats: info.stats.report(),
                    });
                }
            }
        }
        for w in &answer.workspaces {
            answer.total.add(&w.stats);
        }
        Ok((answer, vec![]))
    }

    /// Why `thread`'s mount has its I/O mode (its record read; none without one).
    fn io_why_of(&self, thread: &str) -> Option<String> {
        WorkspaceRecord::load(&self.layout, thread)
            .ok()
            .flatten()
            .map(|r| self.io_why(&r))
    }

    /// Every thread of the caller (of everyone, for root).
    pub(super) fn list(&self, c: &Caller) -> Reply<Vec<WorkspaceStatus>> {
        let mine = |owner: Owner| self.is_admin(c) || owner.uid == c.uid;
        let live = WorkspaceRecord::list(&self.layout)?;
        let mut all: Vec<_> = live
            .iter()
            .filter(|r| mine(r.owner))
            .map(|r| self.status_of(r))
            .collect();
        for b in crate::workspace::Binding::list(&self.layout)? {
            if mine(b.owner) && !live.iter().any(|r| r.thread == b.thread) {
                all.push(self.status_of_released(&b));
            }
        }
        all.sort_by(|a, b| a.thread.cmp(&b.thread));
        Ok((all, vec![]))
    }

    pub(super) fn status(&self, thread: &str, c: &Caller) -> Reply<WorkspaceStatus> {
        validate(NameKind::Thread, thread)?;
        if let Some(rec) = WorkspaceRecord::load(&self.layout, thread)? {
            self.require_owner(c, thread, rec.owner)?;
            let mut st = self.status_of(&rec);
            st.access = self.access_note(&rec);
            return Ok((st, vec![]));
        }
        let b = crate::workspace::Binding::load(&self.layout, thread)?
            .ok_or_else(|| Error::UnknownThread(thread.to_string()))?;
        self.require_owner(c, thread, b.owner)?;
        Ok((self.status_of_released(&b), vec![]))
    }
}
