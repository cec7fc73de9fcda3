//! `octofs diff`: what changed between two snapshots (or commits) of a thread, or from one to the
//! live state (assembled as a snapshot's tree would be, without writing a commit or moving a ref).
//! A `--from`/`--to` is a named snapshot (`refs/snapshots/<name>`, also one pulled from a remote),
//! `saved`/`last` (the thread's last snapshot), or any commit or tree of the mirror.
//! Runs git only in the thread's mirror.

use super::error::{Context, Error};
use super::guard::Bound;
use super::proto::{DiffAnswer, DiffFormat};
use super::refusal::{ChatOp, DiffRefusal};
use super::snapshot::Goal;
use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::git::snapshot as snap;

impl Daemon {
    /// `octofs diff`: what changed between two commits (snapshots), or from one to the live state.
    pub(super) fn diff(
        &self,
        thread: &str,
        from: Option<&str>,
        to: Option<&str>,
        format: DiffFormat,
        c: &Caller,
    ) -> Reply<DiffAnswer> {
        let thread_lock = self.thread_lock(thread)?;
        let (Bound { project, live, .. }, _held) = thread_lock.bound(c, ChatOp::Diff)?;
        let mirror = self.layout.mirror(&project);
        let repo = snap::open(&mirror)?;
        let last = snap::read_ref(&repo, &snap::thread_ref(thread));
        let resolve = |spec: &str| -> Result<gix::ObjectId, Error> {
            let spec = if spec == "saved" || spec == "last" {
                last.map(|l| l.to_string()).ok_or(DiffRefusal::NoSnapshot)?
            } else if super::snapshot::check_snapshot_name(spec).is_ok()
                && let Some(id) = snap::read_ref(&repo, &super::snapshot::named_ref(spec))
            {
                id.to_string()
            } else {
                spec.to_string()
            };
            let out = crate::git!(Some(&mirror); "rev-parse", "--verify", "--quiet", "--end-of-options", &format!("{spec}^{{tree}}"))
                .map_err(|_| DiffRefusal::NotACommit {
                    spec: spec.to_string(),
                })?;
            gix::ObjectId::from_hex(out.as_bytes())
                .context(|| format!("git rev-parse {spec:?} answered {out:?}"))
        };
        let from_tree = match (from, &live) {
            (Some(f), _) => resolve(f)?,
            (None, Some(r)) => r.base_tree,
            (None, None) => resolve("saved")?,
        };
        let to_tree = match (to, &live) {
            (Some(t), _) => resolve(t)?,
            (None, Some(r)) => self.assemble(&mut r.clone(), Goal::Tree)?,
            (None, None) => resolve("saved")?,
        };
        let (a, b) = (from_tree.to_string(), to_tree.to_string());
        let out = match format {
            DiffFormat::Patch => {
                crate::git!(Some(&mirror); "diff", "--no-color", "--no-ext-diff", "--no-textconv", &a, &b)
            }
            DiffFormat::Stat => {
                crate::git!(Some(&mirror); "diff", "--no-color", "--no-renames", "--stat", &a, &b)
            }
            DiffFormat::NameStatus => {
                crate::git!(Some(&mirror); "diff-tree", "-r", "--name-status", "--no-renames", &a, &b)
            }
        }?;
        // Nested repositories and names git refuses are kept beside the trees, never in a diff:
        // said in one line (the thread's live state's, else its last snapshot's).
        let kept = match &live {
            Some(r) => {
                let core = lock(&self.mounts).get(&r.thread).map(|m| m.core.clone());
                self.kept_line(r, core.as_deref())
            }
            None => last.and_then(|l| super::kept::describe(&super::kept::roots_of(&repo, l))),
        };
        Ok((
            DiffAnswer {
                from: a,
                to: b,
                diff: out,
            },
            kept.map(|k| format!("not in this diff: {k}"))
                .into_iter()
                .collect(),
        ))
    }
}
