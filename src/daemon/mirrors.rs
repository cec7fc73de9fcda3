//! The daemon's side of mirrors: `mirror add/sync/access` under the project's lock, the blank
//! repository chat workspaces fork from, and the cache of open object stores the mounts read.
//!
//! Mechanism (cloning, fetching, credentials) is `git::mirror`; this module only serializes it per
//! project and decides who loses the read grant when a project's access list changes.

use std::sync::Arc;

use super::error::{Context, Error};
use super::proto::{Access, MirrorInfo, SyncOutcome};
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::git::Git;
use crate::git::mirror::{self, Project, UpstreamKind};
use crate::git::objects::ObjectStore;
use crate::names::{NameKind, validate};

/// The internal project every chat workspace forks from (a name users cannot pick).
pub const BLANK: &str = ".blank";

impl Daemon {
    /// The object store of `project`'s mirror, opened once. The `stores` map is locked only to
    /// look up and to insert: opening a repository reads files, and every mount's first request
    /// and every `open` of any project would otherwise wait behind it. Two callers that open the
    /// same store at once both open it; the first one inserted is kept.
    pub(super) fn store(&self, project: &str) -> Result<Arc<ObjectStore>, Error> {
        if let Some(s) = lock(&self.stores).get(project).cloned() {
            return Ok(s);
        }
        let opened = Arc::new(
            ObjectStore::open(&self.layout.mirror(project))
                .context(|| format!("cannot open the mirror of {project}"))?,
        );
        Ok(lock(&self.stores)
            .entry(project.to_string())
            .or_insert(opened)
            .clone())
    }

    pub(super) fn mirror_add(
        &self,
        project: &str,
        upstream: &str,
        credential: Option<&str>,
        access: Access,
    ) -> Reply<MirrorInfo> {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let info = mirror::add(&self.layout, project, upstream, credential, access)?;
        Ok((info, vec![]))
    }

    /// Who may bind `project`; replaced first when `access` is given.
    pub(super) fn mirror_access(&self, project: &str, access: Option<Access>) -> Reply<Access> {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let Some(a) = access else {
            let p = mirror::require(&self.layout, project)?;
            return Ok((p.access, vec![]));
        };
        let p = mirror::set_access(&self.layout, project, a)?;
        // Who may no longer bind the project loses the read grant on its objects at once (their
        // workspaces' git then cannot read the project's history: revoking is revoking).
        let keep = |uid: u32| {
            let user = Caller {
                uid,
                gid: u32::MAX,
                groups: crate::sys::user_groups(uid),
            };
            super::authz::may_bind(&user, &p.access)
        };
        let mut warnings = Vec::new();
        match crate::access::revoke_objects(&self.layout.mirror(project), &keep) {
            Ok(gone) if !gone.is_empty() => {
                let who: Vec<String> = gone
                    .iter()
                    .map(|u| crate::access::describe_uid(*u))
                    .collect();
                tracing::info!(%project, "objects grant revoked from {}", who.join(", "));
            }
            Ok(_) => {}
            Err(e) => warnings.push(format!(
                "cannot take back the read grant on {project}'s objects: {e}"
            )),
        }
        Ok((p.access, warnings))
    }

    /// Every project the caller may bind (every project, for root).
    pub(super) fn mirror_list(&self, c: &Caller) -> Reply<Vec<MirrorInfo>> {
        let mut l = mirror::list(&self.layout)?;
        if !self.is_admin(c) {
            l.retain(|m| super::authz::may_bind(c, &m.project.access));
        }
        Ok((l, vec![]))
    }

    pub(super) fn mirror_sync(&self, project: &str) -> Reply<SyncOutcome> {
        validate(NameKind::Project, project)?;
        let l = self.locks.get(&format!("project:{project}"));
        let _g = lock(&l);
        let out = mirror::sync(&self.layout, project, self.settings.freshness_secs)?;
        let warnings = out.warning.iter().cloned().collect();
        Ok((out, warnings))
    }

    /// Creates the blank repository chat workspaces fork from, once.
    pub(super) fn ensure_blank(&self) -> Result<(), Error> {
        let l = self.locks.get(&format!("project:{BLANK}"));
        let _g = lock(&l);
        let dir = self.layout.mirror(BLANK);
        if dir.join(".git").exists() {
            return Ok(());
        }
        let staging = self
            .layout
            .mirrors()
            .join(format!(".staging-blank-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)
            .context(|| "cannot create the blank repository".to_string())?;
        let made = (|| {
            crate::git!(Some(&staging); "init", "--quiet", "--initial-branch=main")?;
            let empty =
                crate::git!(Some(&staging); "hash-object", "-t", "tree", "-w", "/dev/null")?;
            let commit = Git::new(Some(&staging))
                .args([
                    "commit-tree",
                    &empty,
                    "-m",
                    "octofs: blank repository for chat workspaces",
                ])
                .by_octofs()
                .output()?;
            crate::git!(Some(&staging); "update-ref", "refs/heads/main", &commit)?;
            std::fs::rename(&staging, &dir).map_err(|e| e.to_string())
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(Error::Refused(format!(
                "cannot create the blank repository: {e}"
            )));
        }
        Ok(())
    }
}

/// The project description of the blank repository.
pub(super) fn blank_project() -> Project {
    Project {
        project: BLANK.into(),
        upstream: String::new(),
        kind: UpstreamKind::Directory,
        default_branch: "main".into(),
        last_sync: 0,
        access: Default::default(),
    }
}
