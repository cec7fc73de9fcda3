//! `octofs mirror add|access|sync|list|set`: a project's mirror and its settings. Resolves what
//! the caller means where the caller is (upstream paths made absolute, user and group names, the
//! credential file read as the caller), shows git's and the dependency builds' progress on a
//! terminal while a clone or fetch runs, and cancels it on Ctrl-C.

use octofs::client;
use octofs::layout::Layout;
use octofs::names::{NameKind, validate};
use octofs::proto::{self, Access, FetchProgress, MirrorInfo, OutcomeKind, ProgressAnswer};

use super::args::{
    MirrorAccessArgs, MirrorAddArgs, MirrorCmd, MirrorSetArgs, MirrorSyncArgs, resolve_upstream,
};
use super::ask;
use super::output::{Text, access_line, emit, short};

pub fn run(layout: &Layout, cmd: MirrorCmd) -> Result<(), String> {
    match cmd {
        MirrorCmd::Add(a) => add(layout, a),
        MirrorCmd::Access(a) => access(layout, a),
        MirrorCmd::Sync(a) => sync(layout, a),
        MirrorCmd::List(a) => emit(ask(layout, proto::MirrorList)?, a.json),
        MirrorCmd::Set(a) => set(layout, a),
    }
}

/// `mirror add`: the project, its default branch and head.
fn add(layout: &Layout, a: MirrorAddArgs) -> Result<(), String> {
    let project = a.project;
    validate(NameKind::Project, &project)?;
    let upstream = resolve_upstream(&a.upstream)?;
    let share = a.share.as_deref().map(resolve_upstream).transpose()?;
    let access = a.allow.resolve()?;
    // Read here, as the caller: the daemon never opens a path on a caller's behalf.
    let credential = a
        .credential_file
        .map(|f| {
            std::fs::read_to_string(&f).map_err(|e| format!("cannot read {}: {e}", f.display()))
        })
        .transpose()?;
    let req = proto::MirrorAdd {
        project: project.clone(),
        upstream,
        credential,
        access,
    };
    let mut info = with_progress(layout, &project, || ask(layout, req))?.answer;
    if let Some(share) = share {
        let req = proto::MirrorShare {
            project,
            share: Some(share),
        };
        info = ask(layout, req)?.answer;
    }
    println!(
        "{} {} {}",
        info.project.project,
        info.project.default_branch,
        info.head.as_deref().unwrap_or("(empty)")
    );
    Ok(())
}

/// `mirror access`: who may bind the project, and the live threads a change concerns.
fn access(layout: &Layout, a: MirrorAccessArgs) -> Result<(), String> {
    let project = a.project;
    validate(NameKind::Project, &project)?;
    let access = if a.anyone {
        Some(Access::default())
    } else if a.allow.is_empty() {
        None
    } else {
        Some(a.allow.resolve()?)
    };
    let req = proto::MirrorAccess {
        project: project.clone(),
        access,
    };
    let answer = ask(layout, req)?.answer;
    let a = answer.access;
    if a.is_open() {
        println!("any local user");
    }
    for uid in a.users {
        println!("user {}", octofs::access::describe_uid(uid));
    }
    for gid in a.groups {
        println!("group {gid}");
    }
    for t in answer.affected {
        if t.change == "revoked" {
            println!(
                "revoked: live thread {} of {} ({}): its git can no longer read {project}'s history (git log, status and diff fail on the base's objects) until access is granted again; its files stay, and release still saves them",
                t.thread, t.owner, t.path
            );
        } else {
            println!(
                "granted: live thread {} of {} ({}): its git reads {project}'s history again, in the same mount",
                t.thread, t.owner, t.path
            );
        }
    }
    Ok(())
}

/// `mirror sync`: the project, what the sync did, and the head.
fn sync(layout: &Layout, a: MirrorSyncArgs) -> Result<(), String> {
    let project = a.project;
    validate(NameKind::Project, &project)?;
    let req = proto::MirrorSync {
        project: project.clone(),
    };
    let out = with_progress(layout, &project, || ask(layout, req))?.answer;
    let what = if out.recreated {
        "re-created"
    } else if out.fresh {
        "fresh"
    } else if out.warning.is_some() {
        "stale"
    } else if out.changed {
        "updated"
    } else {
        "unchanged"
    };
    println!(
        "{} {} {}",
        out.project,
        what,
        out.head.as_deref().unwrap_or("(empty)")
    );
    Ok(())
}

impl Text for Vec<MirrorInfo> {
    fn print(self) -> Result<(), String> {
        println!("PROJECT\tKIND\tBRANCH\tHEAD\tUPSTREAM\tACCESS");
        for m in self {
            let share = m
                .project
                .share
                .as_deref()
                .map(|s| format!("\tshare={s}"))
                .unwrap_or_default();
            println!(
                "{}\t{:?}\t{}\t{}\t{}\t{}{share}",
                m.project.project,
                m.project.kind,
                m.project.default_branch,
                m.head.as_deref().map(short).unwrap_or("-"),
                m.project.upstream,
                access_line(&m.project.access)
            );
        }
        Ok(())
    }
}

/// `mirror set`: the share remote, then the excludes, each as set.
fn set(layout: &Layout, a: MirrorSetArgs) -> Result<(), String> {
    let project = a.project;
    validate(NameKind::Project, &project)?;
    let sets_share = a.share.is_some() || a.no_share;
    let sets_excludes = !a.excludes.is_empty() || a.no_excludes;
    if !sets_share && !sets_excludes {
        return Err(
            "mirror set: nothing to set (--share, --no-share, --exclude or --no-excludes)".into(),
        );
    }
    if sets_share {
        let share = if a.no_share {
            None
        } else {
            a.share.as_deref().map(resolve_upstream).transpose()?
        };
        let req = proto::MirrorShare {
            project: project.clone(),
            share,
        };
        let info = ask(layout, req)?.answer;
        println!(
            "{} share {}",
            info.project.project,
            info.project.share.as_deref().unwrap_or("(none)")
        );
    }
    if sets_excludes {
        let req = proto::MirrorExcludes {
            project,
            excludes: a.excludes,
        };
        let info = ask(layout, req)?.answer;
        println!(
            "{} excludes {}",
            info.project.project,
            if info.project.excludes.is_empty() {
                "(none)".to_string()
            } else {
                info.project.excludes.join(" ")
            }
        );
    }
    Ok(())
}

/// Set once Ctrl-C asked the daemon to cancel the running `mirror add`/`mirror sync`: the command
/// then exits 130, as an interrupted command does.
pub static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `f` (a `mirror add` or `mirror sync` request of `project`). Meanwhile, when stderr is a
/// terminal, shows git's progress line and the project's dependency builds (a line when one
/// starts, a line with its result and time); and on Ctrl-C asks the daemon to cancel the request,
/// which then fails having kept nothing (a second Ctrl-C leaves at once).
fn with_progress<T: Send>(layout: &Layout, project: &str, f: impl FnOnce() -> T + Send) -> T {
    use std::io::{IsTerminal, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let tty = std::io::stderr().is_terminal();
    let ctrl_c = std::sync::Arc::new(AtomicBool::new(false));
    // The first Ctrl-C only sets the flag; one more while it is set ends the CLI (exit 130).
    let trapped = signal_hook::flag::register_conditional_shutdown(
        signal_hook::consts::SIGINT,
        130,
        ctrl_c.clone(),
    )
    .and_then(|_| signal_hook::flag::register(signal_hook::consts::SIGINT, ctrl_c.clone()));
    if let Err(e) = trapped {
        eprintln!("octofs: warning: Ctrl-C will not cancel cleanly: {e}");
    }
    let deps = |after: u64| -> Option<ProgressAnswer> {
        let req = proto::DepsProgress {
            project: project.to_string(),
            after,
        };
        client::call(layout, req, false).ok().map(|a| a.answer)
    };
    let fetch = || -> Option<FetchProgress> {
        let req = proto::MirrorProgress {
            project: project.to_string(),
        };
        client::call(layout, req, false).ok().map(|a| a.answer)
    };
    // git's progress line is redrawn in place; anything else first clears it.
    let shown = std::cell::RefCell::new(String::new());
    let clear = || {
        if !shown.borrow().is_empty() {
            eprint!("\r\x1b[K");
            shown.borrow_mut().clear();
        }
    };
    let show = |a: &ProgressAnswer| {
        for e in &a.events {
            clear();
            match &e.outcome {
                None => eprintln!("octofs: building {}…", e.what),
                Some(o) => match &o.result {
                    // The warning line that follows names the reason and the log.
                    OutcomeKind::Failed { .. } => {
                        eprintln!(
                            "octofs: {}: failed after {:.1} s",
                            e.what,
                            o.ms as f64 / 1e3
                        )
                    }
                    _ => eprintln!("octofs: {}", o.describe()),
                },
            }
        }
    };
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let worker = s.spawn(|| {
            let v = f();
            done.store(true, Ordering::Release);
            v
        });
        let mut last = if tty {
            deps(u64::MAX).map(|a| a.last)
        } else {
            None
        };
        let mut cancel_sent = false;
        while !done.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            if ctrl_c.load(Ordering::Acquire) && !cancel_sent {
                cancel_sent = true;
                INTERRUPTED.store(true, Ordering::Release);
                clear();
                eprintln!("octofs: cancelling (Ctrl-C again leaves without waiting)…");
                let cancel = proto::MirrorCancel {
                    project: project.to_string(),
                };
                if client::call(layout, cancel, false).is_err() {
                    eprintln!("octofs: the daemon has nothing of {project} to cancel yet; waiting");
                    cancel_sent = false;
                    ctrl_c.store(false, Ordering::Release);
                }
            }
            if !tty {
                continue;
            }
            if let Some(a) = last.and_then(deps) {
                show(&a);
                last = Some(a.last);
            }
            if let Some(p) = fetch()
                && p.running
                && !p.line.is_empty()
                && *shown.borrow() != p.line
            {
                let width = 100;
                let line: String = p.line.chars().take(width).collect();
                eprint!("\r\x1b[Koctofs: {line}");
                let _ = std::io::stderr().flush();
                *shown.borrow_mut() = p.line;
            }
        }
        clear();
        if let Some(a) = last.and_then(deps) {
            show(&a);
        }
        match worker.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    })
}
