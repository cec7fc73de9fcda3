//! `octofs push`: the workspace's branch sent from the project's mirror (where `octofs commit`
//! wrote its commits; the agent's own commits are carried there first) to the project's upstream
//! or a given remote, after the gates ran over every path any outgoing commit touched.
//!
//! Reads the workspace only through its core (HEAD, the ignore rules); runs git only in the
//! mirror, never with a workspace's configuration; a refusal sends nothing.

use super::commit::{check_gates, parse_gates};
use super::proto::Pushed;
use super::refusal::{ChatOp, PushRefusal};
use super::snapshot::read_head;
use super::{Daemon, Reply};
use crate::access::Caller;
use crate::git::mirror::{changes, push, push_target, remote_tip};
use crate::git::snapshot::{self as snap, HeadRef};
use crate::own_repo::carry;

impl Daemon {
    /// `octofs push`: returns the remote branch and the commit sent.
    pub(super) fn push(
        &self,
        thread: &str,
        remote: Option<&str>,
        branch: Option<&str>,
        lease: Option<&str>,
        gate_specs: &[String],
        c: &Caller,
    ) -> Reply<Pushed> {
        let thread_lock = self.thread_lock(thread)?;
        let gates = parse_gates(self, gate_specs, c)?;
        let lease = lease
            .map(|l| {
                gix::ObjectId::from_hex(l.as_bytes()).map_err(|_| PushRefusal::BadLease {
                    lease: l.to_string(),
                })
            })
            .transpose()?;
        let (rec, _held) = thread_lock.live(c, ChatOp::Push)?;
        let core = self.core_of(&rec)?;
        let (head, head_ref) = read_head(&core)?;
        let branch = match (branch, &head_ref) {
            (Some(b), _) => b.to_string(),
            (None, HeadRef::Branch(b)) => b.clone(),
            (None, HeadRef::Detached) => {
                return Err(PushRefusal::Detached.into());
            }
        };
        gix::refs::FullName::try_from(format!("refs/heads/{branch}")).map_err(|_| {
            PushRefusal::NotABranch {
                branch: branch.clone(),
            }
        })?;
        let mirror = self.layout.mirror(&rec.project);
        let mut repo = snap::open(&mirror)?;
        if !repo.has_object(head) {
            let n = carry::carry(&core, &self.layout.state, &repo, thread, head)?;
            tracing::info!(%thread, %head, objects = n, "carried the agent's commits");
            repo = snap::open(&mirror)?;
        }
        let target = push_target(&self.layout, &rec.project, remote, self.far_side(c))?;
        // The outgoing range: from the lease, else from the remote tip, else everything the
        // branch carries (less what the project's upstream already has on its branches, as of the
        // mirror's last sync).
        let base = match lease {
            Some(l) if repo.has_object(l) => Some(l),
            Some(_) => None,
            None => remote_tip(&mirror, &target, &branch)?,
        };
        let mut log = crate::git::Git::new(Some(&mirror)).args([
            "log",
            "-z",
            "--format=",
            "--raw",
            "--no-abbrev",
            "--no-renames",
            "-m",
            "--root",
        ]);
        log = match base {
            Some(b) => log.args(["--end-of-options".to_string(), format!("{b}..{head}")]),
            None if target.upstream => log.args([
                "--not",
                "--remotes=origin",
                "--not",
                "--end-of-options",
                &head.to_string(),
            ]),
            None => log.args(["--end-of-options".to_string(), head.to_string()]),
        };
        let raw = log.output_bytes()?;
        let touched = changes(&raw)?;
        let excludes = crate::git::mirror::require(&self.layout, &rec.project)?.excludes;
        check_gates(&core, &repo, &touched, &gates, &excludes, "push")?;
        push(&mirror, &target, head, &branch, lease).map_err(|error| PushRefusal::Failed {
            head,
            branch: branch.clone(),
            error,
        })?;
        tracing::info!(%thread, %branch, commit = %head, "push");
        Ok((
            Pushed {
                branch,
                commit: head.to_string(),
            },
            vec![],
        ))
    }
}
