//! The commands that carry a thread's work elsewhere: to a new thread (`fork`, `teleport`), from
//! a remote's named snapshot (`pull`), back into a plain-directory project's folder (`export`), and
//! to its upstream's tip (`resync`). Validates names and makes remotes absolute before a request is
//! sent; the daemon does the work.

use octofs::layout::Layout;
use octofs::names::{NameKind, validate};
use octofs::proto::{self, Exported, Forked};

use super::args::{ExportArgs, ForkArgs, PullArgs, ResyncArgs, TeleportArgs, resolve_remote};
use super::ask;
use super::output::{Text, emit, short};

/// `octofs fork`: the new path (or the whole answer with `--json`).
pub fn fork(layout: &Layout, a: ForkArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.from)?;
    validate(NameKind::Thread, &a.to)?;
    emit(
        ask(
            layout,
            proto::Fork {
                from: a.from,
                to: a.to,
            },
        )?,
        a.json,
    )
}

/// `octofs teleport`: as `fork`.
pub fn teleport(layout: &Layout, a: TeleportArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.from)?;
    validate(NameKind::Thread, &a.to)?;
    if let Some(p) = &a.project {
        validate(NameKind::Project, p)?;
    }
    let req = proto::Teleport {
        from: a.from,
        to: a.to,
        project: a.project,
        git_ref: a.git_ref,
    };
    emit(ask(layout, req)?, a.json)
}

impl Text for Forked {
    fn print(self) -> Result<(), String> {
        println!("{}", self.path);
        Ok(())
    }
}

/// `octofs pull`: the snapshot applied (after the one that saved local changes, with `--force`).
pub fn pull(layout: &Layout, a: PullArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let remote = resolve_remote(&a.remote)?;
    let req = proto::Pull {
        thread: a.thread,
        remote,
        name: a.name,
        force: a.force,
    };
    let p = ask(layout, req)?.answer;
    if let Some(s) = &p.saved_first {
        println!("saved the local changes first as snapshot {s}");
    }
    println!("{}", p.commit);
    Ok(())
}

/// `octofs export`: one line per path written (or, with `--dry-run`, that would be).
pub fn export(layout: &Layout, a: ExportArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let req = proto::Export {
        thread: a.thread,
        dry_run: a.dry_run,
    };
    emit(ask(layout, req)?, a.json)
}

impl Text for Exported {
    fn print(self) -> Result<(), String> {
        for c in &self.changes {
            println!("{} {}", c.status, c.path);
        }
        Ok(())
    }
}

/// `octofs resync`: what happened; a refusal is the command's error (after the JSON line with
/// `--json`).
pub fn resync(layout: &Layout, a: ResyncArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let answered = ask(
        layout,
        proto::Resync {
            thread: a.thread,
            role: a.role,
        },
    )?;
    if a.json {
        println!("{}", answered.result);
    }
    let r = answered.answer;
    let short_id = |s: &str| short(s).to_string();
    match (r.action.as_str(), a.json) {
        ("refused", _) => Err(r.reason.unwrap_or_else(|| "refused".into())),
        (_, true) => Ok(()),
        ("up-to-date", _) => {
            println!("up to date at {}", short_id(&r.to));
            Ok(())
        }
        ("reset", _) => {
            println!(
                "reset {} -> {} ({} changed paths); the previous state is snapshot {}",
                short_id(&r.from),
                short_id(&r.to),
                r.changed_paths,
                r.snapshot.as_deref().unwrap_or("(none)")
            );
            Ok(())
        }
        _ => {
            println!(
                "fast-forward {} -> {} ({} changed paths)",
                short_id(&r.from),
                short_id(&r.to),
                r.changed_paths
            );
            Ok(())
        }
    }
}
