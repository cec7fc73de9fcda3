//! The commands on one thread's workspace: `open`, `list`, `path`, `status`, `snapshot`,
//! `release`, `sweep`, `diff`, `commit` (with the CLI's hooks, run here as the workspace's owner)
//! and `push`, and `run` (a sandbox that sees only the workspace). Validates names before a request
//! is sent; never reads a workspace itself.

use octofs::names::{NameKind, validate};
use octofs::proto::{self, DiffFormat, ReleaseAnswer, SweepAnswer, WorkspaceStatus};

use super::args::{
    CommitArgs, DiffArgs, ListArgs, OpenArgs, PathArgs, PushArgs, ReleaseArgs, RunArgs,
    SnapshotArgs, StatusArgs, SweepArgs, resolve_remote,
};
use super::ask;
use super::output::{Text, emit, short};
use octofs::layout::Layout;

/// `octofs open`: prints the mount path.
pub fn open(layout: &Layout, a: OpenArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    if let Some(p) = &a.project {
        validate(NameKind::Project, p)?;
    }
    let opened = ask(
        layout,
        proto::Open {
            thread: a.thread,
            project: a.project,
            git_ref: a.git_ref,
            io: a.io,
        },
    )?
    .answer;
    println!("{}", opened.path);
    Ok(())
}

/// `octofs list`.
pub fn list(layout: &Layout, a: ListArgs) -> Result<(), String> {
    emit(ask(layout, proto::List)?, a.json)
}

impl Text for Vec<WorkspaceStatus> {
    fn print(self) -> Result<(), String> {
        // Tab-separated under a header; new columns go last (scripts cut by position).
        println!("THREAD\tPROJECT\tBASE\tSTATE\tPATH\tBYTES\tOWNER");
        for w in self {
            // The bytes its upper layer holds (`-` when not mounted), then its owner.
            println!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                w.thread,
                w.project,
                short(&w.base_commit),
                w.state,
                w.path,
                w.bytes_used.map_or("-".into(), |b| b.to_string()),
                if w.owner.is_empty() { "-" } else { &w.owner }
            );
        }
        Ok(())
    }
}

/// `octofs path`: where the thread is mounted (it must be).
pub fn path(layout: &Layout, a: PathArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let w = ask(layout, proto::Status { thread: a.thread })?.answer;
    if w.state != "mounted" {
        return Err(format!(
            "thread {} is {} (octofs open {} mounts it)",
            w.thread, w.state, w.thread
        ));
    }
    println!("{}", w.path);
    Ok(())
}

/// `octofs status`.
pub fn status(layout: &Layout, a: StatusArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    emit(ask(layout, proto::Status { thread: a.thread })?, a.json)
}

/// `octofs status` for people: one line per field.
impl Text for WorkspaceStatus {
    fn print(self) -> Result<(), String> {
        let w = &self;
        println!("thread:        {}", w.thread);
        println!("project:       {}", w.project);
        println!("base:          {}", w.base_commit);
        println!(
            "branch:        {}",
            w.branch.as_deref().unwrap_or("(detached)")
        );
        println!("path:          {}", w.path);
        println!(
            "state:         {}{}",
            w.state,
            if w.chat { " (chat)" } else { "" }
        );
        if !w.owner.is_empty() {
            println!("owner:         {}", w.owner);
        }
        if let Some(a) = &w.access {
            println!("access:        {a}");
        }
        if w.users > 1 {
            println!("users:         {} ({})", w.users, w.user_names.join(", "));
        }
        if w.release_when_idle {
            println!("release:       pending (when no process uses the mount)");
        }
        if let Some(p) = w.passthrough {
            println!("passthrough:   {}", if p { "yes" } else { "no" });
        }
        if let Some(t) = &w.transport {
            println!("transport:     {t}");
        }
        if let Some(io) = super::output::io_shown(w.io.as_deref(), w.io_why.as_deref()) {
            println!("io:            {io}");
        }
        for l in &w.layers {
            println!(
                "layer:         {} {} ({})",
                l.manager.name(),
                l.path,
                short(&l.key)
            );
        }
        for d in &w.dependencies {
            println!("dependencies:  {d}");
        }
        println!("changed paths: {}", w.changed_paths);
        if let Some(k) = &w.kept {
            println!("kept:          {k}");
        }
        if let Some(b) = w.bytes_used {
            println!("bytes used:    {b}");
        }
        if let (Some(b), Some(q)) = (w.owner_bytes, w.owner_quota) {
            println!("owner's quota: {b} of {q} bytes");
        }
        println!("base reads:    {}", w.base_content_opens);
        if w.quarantined > 0 {
            println!(
                "quarantined:   {} (see <state>/workspaces/<thread>/upper/quarantine)",
                w.quarantined
            );
        }
        if !w.damaged.is_empty() {
            println!(
                "damaged:       {} catalog record(s) lost (see the quarantine README)",
                w.damaged.len()
            );
            for d in &w.damaged {
                println!("  {d}");
            }
        }
        println!(
            "last snapshot: {}",
            w.last_snapshot.as_deref().unwrap_or("none")
        );
        Ok(())
    }
}

/// `octofs snapshot`: the snapshot's id; with `--name`, the named snapshot's (pushed with
/// `--push`).
pub fn snapshot(layout: &Layout, a: SnapshotArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let commit = match (a.name, a.push) {
        (None, None) => {
            ask(layout, proto::Snapshot { thread: a.thread })?
                .answer
                .commit
        }
        (name, push) => {
            let push = push.as_deref().map(resolve_remote).transpose()?;
            let req = proto::SnapshotNamed {
                thread: a.thread,
                name,
                push,
            };
            ask(layout, req)?.answer.commit
        }
    };
    println!("{commit}");
    Ok(())
}

/// `octofs release` (`--when-idle`: answered at once).
pub fn release(layout: &Layout, a: ReleaseArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let thread = a.thread;
    let r: ReleaseAnswer = if a.when_idle {
        let req = proto::ReleaseWhenIdle {
            thread: thread.clone(),
        };
        ask(layout, req)?.answer
    } else {
        let req = proto::Release {
            thread: thread.clone(),
            force: a.force,
            discard: a.discard,
        };
        ask(layout, req)?.answer
    };
    let who = if r.user_names.is_empty() {
        String::new()
    } else {
        format!(": {}", r.user_names.join(", "))
    };
    if r.pending {
        println!("{thread}: release pending until no process uses the mount");
    } else if r.released {
        match r.snapshot {
            Some(s) => println!("released {thread} (snapshot {s})"),
            None if a.discard => println!("released {thread} (discarded, not saved)"),
            None => println!("released {thread}"),
        }
    } else {
        println!(
            "{thread} is still in use by {} other user(s){who} (each releases it, or release --force)",
            r.users.unwrap_or_default()
        );
    }
    Ok(())
}

/// `octofs sweep` (root).
pub fn sweep(layout: &Layout, a: SweepArgs) -> Result<(), String> {
    emit(ask(layout, proto::Sweep { idle_secs: a.idle })?, a.json)
}

impl Text for SweepAnswer {
    fn print(self) -> Result<(), String> {
        for t in self.released {
            println!("released {t}");
        }
        for k in self.kept {
            println!("kept {} ({})", k.thread, k.why);
        }
        Ok(())
    }
}

/// `octofs diff`: git's output as the daemon made it.
pub fn diff(layout: &Layout, a: DiffArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let format = if a.stat {
        Some(DiffFormat::Stat)
    } else if a.name_status {
        Some(DiffFormat::NameStatus)
    } else {
        None
    };
    let req = proto::Diff {
        thread: a.thread,
        from: a.from,
        to: a.to,
        patch: a.patch,
        format,
    };
    let d = ask(layout, req)?.answer;
    if !d.diff.is_empty() {
        println!("{}", d.diff);
    }
    Ok(())
}

/// `octofs commit`: the hooks first (here, as the workspace's owner), then the daemon's commit.
pub fn commit(layout: &Layout, a: CommitArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let mut message = a.message;
    let hooked = if a.hooks.is_empty() && !a.git_hooks {
        None
    } else {
        let w = ask(
            layout,
            proto::Status {
                thread: a.thread.clone(),
            },
        )?
        .answer;
        let run = octofs::hooks::Runner::for_workspace(&w)?;
        for h in &a.hooks {
            run.hook(h)?;
        }
        if a.git_hooks {
            run.git_hook("pre-commit", &[])?;
            if !message.is_empty() {
                message = run.commit_msg(&message)?;
            }
        }
        Some(run)
    };
    let req = proto::Commit {
        thread: a.thread,
        message,
        paths: a.paths,
        gates: a.gates,
        mode: a.mode,
        anchor: a.anchor,
    };
    let c = ask(layout, req)?.answer;
    if a.git_hooks
        && let Some(run) = hooked
    {
        // As git does: post-commit cannot undo the commit; its failure is only reported.
        if let Err(e) = run.git_hook("post-commit", &[]) {
            eprintln!("octofs: warning: {e}");
        }
    }
    println!("{}", c.commit);
    Ok(())
}

/// `octofs push`: the remote branch and the commit it now names.
pub fn push(layout: &Layout, a: PushArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let req = proto::Push {
        thread: a.thread,
        remote: a.remote,
        branch: a.branch,
        lease: a.lease,
        gates: a.gates,
    };
    let p = ask(layout, req)?.answer;
    println!("{} {}", p.branch, p.commit);
    Ok(())
}

/// `octofs run`: opens the thread (as `open`), then becomes bubblewrap with the workspace bound
/// alone; exits with the command's status.
pub fn run(layout: &Layout, a: RunArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    if let Some(p) = &a.project {
        validate(NameKind::Project, p)?;
    }
    if !a.at.is_absolute() {
        return Err(format!("--at {} is not an absolute path", a.at.display()));
    }
    if let Some(p) = a.ro.iter().find(|p| !p.is_absolute()) {
        return Err(format!("--ro {} is not an absolute path", p.display()));
    }
    let bwrap = octofs::run::bwrap()?;
    let req = proto::Open {
        thread: a.thread,
        project: a.project,
        git_ref: a.git_ref,
        io: None,
    };
    let opened = ask(layout, req)?.answer;
    let sb = octofs::run::Sandbox {
        at: Some(a.at),
        ro: a.ro,
        net: a.net,
        env: a.env,
    };
    let args = octofs::run::bwrap_args(
        std::path::Path::new(&opened.path),
        &sb,
        &a.cmd,
        std::env::var_os("TERM"),
        std::env::var_os("LANG"),
    );
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&bwrap).args(args).exec();
    Err(format!("cannot start {}: {e}", bwrap.display()))
}
