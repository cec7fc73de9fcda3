//! The commands about the daemon itself: its processes (`serve`, the new daemon of a restart, the
//! connection keeper, the CSI plugin, git's `transport-as`), `stop`, `restart`, `stats`,
//! `metrics`, `doctor`, and the command line's own `completions` and `man`. The only group that
//! runs daemon code in this process; it never reads a workspace.

use std::process::ExitCode;

use octofs::client;
use octofs::layout::Layout;
use octofs::names::{NameKind, validate};
use octofs::proto::{self, StatsAnswer, StatsReport};

use super::args::{
    Cli, CompletionsArgs, CsiArgs, DoctorArgs, ManArgs, RestartArgs, ServeArgs, StatsArgs,
    TakeoverServeArgs, TransportAsArgs,
};
use super::ask;
use super::output::{Text, emit};

/// The daemon's log on stderr, filtered by `OCTOFS_LOG` (default `info`).
fn init_log(ansi: bool) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OCTOFS_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

/// `octofs serve`: the daemon in the foreground.
pub fn serve(layout: &Layout, a: ServeArgs) -> Result<(), String> {
    // Colour only on a terminal: the daemon's log file is plain text.
    init_log(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    octofs::daemon::serve(
        layout.clone(),
        octofs::daemon::Settings {
            freshness_secs: a.freshness,
            passthrough: a.passthrough,
            sweep_idle: a.sweep_idle,
            sweep_every: a.sweep_every,
            fetch_timeout_secs: a.fetch_timeout,
            transport: a.transport,
            io: a.io,
            max_threads_per_user: a.max_threads_per_user,
            quota_per_user: a.quota_per_user,
            keep_connections: a.keep_connections,
            metrics: a.metrics.map(|addr| octofs::daemon::metrics::Endpoint {
                addr,
                allow: a.metrics_allow,
            }),
        },
    )
    .map_err(|e| format!("{e:#}"))
}

/// The new daemon of a restart, started by the old one.
pub fn takeover_serve(layout: &Layout, a: TakeoverServeArgs) -> Result<(), String> {
    // Colour only on a terminal: the daemon's log file is plain text.
    init_log(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    octofs::daemon::serve_takeover(layout.clone(), &a.from).map_err(|e| format!("{e:#}"))
}

/// The connection keeper, started by the daemon.
pub fn fd_keeper(layout: &Layout) -> Result<(), String> {
    init_log(false);
    octofs::daemon::run_keeper(layout).map_err(|e| format!("{e:#}"))
}

/// `octofs csi`: the Kubernetes CSI node plugin, a client of this node's daemon.
pub fn csi(layout: &Layout, a: CsiArgs) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the octofs binary: {e}"))?;
    let config = octofs::csi::node::Config {
        layout: layout.clone(),
        node_id: a.node_id.unwrap_or_else(octofs::csi::host_name),
        plugin_dir: a.plugin_dir,
        min_uid: a.min_uid,
        exe,
    };
    octofs::csi::serve(config, &a.endpoint)
}

/// The far side of a transport the daemon's git started, as the caller it names.
pub fn transport_as(a: TransportAsArgs) -> ExitCode {
    let Ok(groups) = a
        .groups
        .split(',')
        .filter(|g| !g.is_empty())
        .map(str::parse::<u32>)
        .collect::<Result<Vec<u32>, _>>()
    else {
        eprintln!(
            "fatal: --groups wants comma-separated numbers, not {:?}",
            a.groups
        );
        return ExitCode::from(128);
    };
    octofs::git::mirror::far_side::run(octofs::git::mirror::far_side::Args {
        uid: a.uid,
        gid: a.gid,
        groups,
        deny: a.deny,
        program: a.program,
        rest: a.rest,
    })
}

/// `octofs stop`.
pub fn stop(layout: &Layout) -> Result<(), String> {
    if client::stop(layout)? {
        println!("stopped");
    } else {
        println!("no daemon running");
    }
    Ok(())
}

/// `octofs restart`: never starts a daemon (there must be one to hand over).
pub fn restart(layout: &Layout, a: RestartArgs) -> Result<(), String> {
    let exe = a
        .exe
        .map(|p| std::path::absolute(&p).map_err(|e| format!("{}: {e}", p.display())))
        .transpose()?;
    let r = client::call(layout, proto::Restart { exe }, false)?.answer;
    println!(
        "restarted: pid {} -> {}, {} mounts and {} open files handed over, requests paused {:.1} ms",
        r.old_pid, r.new_pid, r.mounts, r.handles, r.pause_ms
    );
    Ok(())
}

/// `octofs metrics`: Prometheus text format, as the daemon wrote it.
pub fn metrics(layout: &Layout) -> Result<(), String> {
    let text = ask(layout, proto::Metrics)?.answer;
    print!("{text}");
    Ok(())
}

/// `octofs stats [THREAD]`.
pub fn stats(layout: &Layout, a: StatsArgs) -> Result<(), String> {
    if let Some(t) = &a.thread {
        validate(NameKind::Thread, t)?;
    }
    let one = a.thread.is_some();
    let r = ask(layout, proto::Stats { thread: a.thread })?;
    emit(r.map(|answer| Stats { answer, one }), a.json)
}

/// `stats`' text: one thread's table, or the daemon's total and a line per workspace.
struct Stats {
    answer: StatsAnswer,
    one: bool,
}

impl Text for Stats {
    fn print(self) -> Result<(), String> {
        let a = self.answer;
        if self.one {
            for w in &a.workspaces {
                println!("thread {}", w.thread);
                let io = super::output::io_shown(w.io.as_deref(), w.io_why.as_deref());
                io.iter().for_each(|io| println!("io: {io}"));
                print_stats(&w.stats);
            }
        } else {
            println!("daemon: {} mounted workspace(s)", a.workspaces.len());
            print_stats(&a.total);
            for w in &a.workspaces {
                let io = w.io.as_deref().unwrap_or("-");
                let n = w.stats.requests();
                println!("  {:<24} {:>12} requests  {io}", w.thread, n);
            }
        }
        Ok(())
    }
}

/// One table of request figures: opcode, count, p50, p99 (upper edge of a log2 bucket), total time.
fn print_stats(s: &StatsReport) {
    println!(
        "{:<16} {:>12} {:>10} {:>10} {:>14}",
        "opcode", "count", "p50 µs", "p99 µs", "total ms"
    );
    for o in &s.ops {
        println!(
            "{:<16} {:>12} {:>10} {:>10} {:>14.1}",
            o.op,
            o.count,
            format!("≤{}", o.p50_us),
            format!("≤{}", o.p99_us),
            o.total_us as f64 / 1000.0
        );
    }
    println!("{:<16} {:>12}", "all", s.requests());
    println!("bytes read through the daemon:    {}", s.bytes_read);
    println!("bytes written through the daemon: {}", s.bytes_written);
    println!("passthrough opens:                {}", s.passthrough_opens);
}

/// `octofs doctor`: reads the state directly (no daemon needed); fails while anything is left.
pub fn doctor(layout: &Layout, a: DoctorArgs) -> Result<(), String> {
    let r = octofs::doctor::run(layout, a.fix);
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&r).map_err(|e| format!("cannot encode: {e}"))?
        );
    } else {
        octofs::doctor::print(&r, a.fix);
    }
    match r.unresolved() {
        0 => Ok(()),
        n => Err(format!("{n} finding(s) unresolved")),
    }
}

/// `octofs completions SHELL`.
pub fn completions(a: CompletionsArgs) -> Result<(), String> {
    use clap::CommandFactory;
    clap_complete::generate(
        a.shell,
        &mut Cli::command(),
        "octofs",
        &mut std::io::stdout(),
    );
    Ok(())
}

/// `octofs man DIR`.
pub fn man(a: ManArgs) -> Result<(), String> {
    use clap::CommandFactory;
    let dir = a.dir;
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    clap_mangen::generate_to(Cli::command(), &dir)
        .map_err(|e| format!("cannot write the man pages into {}: {e}", dir.display()))
}
