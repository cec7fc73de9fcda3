//! What a power loss during a create can leave, found and put right: at start (bindings and
//! workspace directories without their records, records without their bindings) and before a
//! workspace is served again (a catalog that never held its seed). Interrupted creates are set
//! aside, never deleted while they hold data.
//!
//! Each case is one log line and never stops the daemon; it must not create workspaces (that is
//! `super::create`) nor mount anything.

use super::error::Error;
use super::refusal::WorkspaceRefusal;
use super::{Daemon, now};
use crate::fs::WorkspaceFs;
use crate::names::{NameKind, validate};
use crate::workspace::{Binding, WorkspaceRecord};

impl Daemon {
    /// Before a workspace whose record is in place is served again: a catalog that loads blank,
    /// without `.git`, never held the seed its create wrote before putting the record in place,
    /// which only a
    /// power loss before the create's background sync explains (the record's rename reached the
    /// disk, the catalog's bytes did not). Nothing in it was reported durable: it is an
    /// interrupted create, set aside ([`Self::set_aside_workspace`]) and refused; the next
    /// `open` of the thread makes it again.
    pub(super) fn refuse_unseeded(
        &self,
        rec: &WorkspaceRecord,
        core: &WorkspaceFs,
    ) -> Result<(), Error> {
        // (A base whose tree has a `.git` entry of its own is not seeded: its catalog may well
        // be blank.)
        if !core.is_blank() || core.exists(crate::fs::ROOT_INO, ".git").unwrap_or(true) {
            return Ok(());
        }
        let done = self.set_aside_workspace(
            &rec.thread,
            "its record is in place but its catalog holds no seed",
        );
        Err(WorkspaceRefusal::NeverDurable {
            thread: rec.thread.clone(),
            done,
        }
        .into())
    }

    /// At start, before anything is remounted: what a power loss during a create can leave, as
    /// an interrupted create (nothing in it was reported durable: every fsync in a new workspace
    /// waits for its background sync). A binding that cannot be read is set aside; a workspace
    /// directory whose record cannot be read, or that has none and was made on an earlier boot,
    /// is set aside ([`Self::set_aside_workspace`]); a workspace record without its binding gets
    /// it back, made from the record. (A directory without a record made on this boot is what a
    /// daemon killed during a create leaves: nothing was answered for it, and the next create of
    /// the thread removes it.) Each case is one log line; none stops the daemon.
    pub(super) fn recover_creates(&self) {
        let threads = self.layout.state.join("threads");
        for key in names_in(&threads) {
            let Some(thread) = key.strip_suffix(".json") else {
                continue;
            };
            if validate(NameKind::Thread, thread).is_err() {
                continue;
            }
            if let Err(e) = Binding::load(&self.layout, thread) {
                match Binding::set_aside(&self.layout, thread) {
                    Ok(to) => tracing::warn!(
                        %thread, "unreadable binding ({e}): set aside as {}", to.display()
                    ),
                    Err(err) => tracing::error!(%thread, "unreadable binding ({e}): {err}"),
                }
            }
        }
        let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|b| b.trim().to_string());
        for thread in names_in(&self.layout.workspaces()) {
            if validate(NameKind::Thread, &thread).is_err()
                || !self.layout.workspace(&thread).is_dir()
            {
                continue;
            }
            match WorkspaceRecord::load(&self.layout, &thread) {
                Ok(Some(rec)) => self.rebind(&rec),
                Ok(None) => {
                    let made_on = std::fs::read_to_string(
                        self.layout.workspace(&thread).join("upper").join("boot"),
                    )
                    .ok()
                    .map(|b| b.trim().to_string());
                    if this_boot.is_some() && made_on == this_boot {
                        continue;
                    }
                    self.set_aside_workspace(&thread, "no record, made on an earlier boot");
                }
                Err(e) => {
                    self.set_aside_workspace(&thread, &format!("unreadable record ({e})"));
                }
            }
        }
    }

    /// A project workspace's record without its thread's binding (a power loss kept the one's
    /// rename, not the other's): the binding made again from the record, which says the same
    /// (project, base, branch, owner, I/O mode).
    fn rebind(&self, rec: &WorkspaceRecord) {
        if rec.chat || !matches!(Binding::load(&self.layout, &rec.thread), Ok(None)) {
            return;
        }
        let b = Binding {
            thread: rec.thread.clone(),
            project: rec.project.clone(),
            base_commit: rec.base_commit,
            branch: rec.branch.clone(),
            created: rec.created,
            owner: rec.owner,
            io: rec.io,
        };
        match b.save(&self.layout) {
            Ok(()) => tracing::warn!(
                thread = %rec.thread, project = %rec.project,
                "a workspace without its binding: bound again from its record"
            ),
            Err(e) => tracing::error!(thread = %rec.thread, "cannot bind the workspace again: {e}"),
        }
    }

    /// Takes an interrupted create's directory out of `<state>/workspaces`: removed if its upper
    /// layer holds no data file, else moved whole to `<state>/quarantine/<thread>.<unix seconds>`
    /// (never deleted: a user may have written in it before the power loss). Logs one line with
    /// `why`; returns what was done, for a message.
    pub(super) fn set_aside_workspace(&self, thread: &str, why: &str) -> String {
        let dir = self.layout.workspace(thread);
        let holds_data = std::fs::read_dir(dir.join("upper").join("data"))
            .map(|mut d| d.next().is_some())
            .unwrap_or(false);
        let done = if holds_data {
            let quarantine = self.layout.state.join("quarantine");
            let to = quarantine.join(format!("{thread}.{}", now()));
            match crate::layout::create_private_dir(&quarantine)
                .and_then(|()| std::fs::rename(&dir, &to))
            {
                Ok(()) => format!("set aside in {}", to.display()),
                Err(e) => format!(
                    "left in place (cannot set it aside in {}: {e})",
                    to.display()
                ),
            }
        } else {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => "removed (it held no file)".to_string(),
                Err(e) => format!("left in place (cannot remove it: {e})"),
            }
        };
        tracing::warn!(%thread, "{why}: an interrupted create, {done}");
        done
    }
}

/// The names in `dir` (none if it cannot be read).
fn names_in(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
