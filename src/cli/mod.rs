//! The `octofs` command line, split by command group: [`args`] (what clap parses and what the
//! arguments mean), [`output`] (text for people or the daemon's JSON), and one module per group —
//! `threads` (a thread's workspace: open, list, path, status, snapshot, release, sweep, diff,
//! commit, push, run), `sharing` (work carried to another thread or place: fork, teleport, pull,
//! export, resync), `projects` (`mirror …`), `deps`, `watch` (`watch` and git's fsmonitor hook)
//! and `admin` (the daemon's own processes, stop, restart, stats, metrics, doctor, csi,
//! completions, man). [`run`] dispatches a parsed command.
//!
//! Talks to the daemon only through `octofs::client` and `octofs::proto`; `admin` alone starts
//! the daemon's (and the keeper's, the CSI plugin's) processes in this one.

pub mod admin;
pub mod args;
mod deps;
mod output;
mod projects;
mod sharing;
mod threads;
mod watch;

use octofs::client::{self, Answered};
use octofs::layout::Layout;
use octofs::proto::Call;

use args::Cmd;

/// Runs one command (every command but `transport-as`, which `main` runs before a layout exists).
pub fn run(layout: &Layout, cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Serve(a) => admin::serve(layout, a),
        Cmd::Stop => admin::stop(layout),
        Cmd::Mirror { cmd } => projects::run(layout, cmd),
        Cmd::Open(a) => threads::open(layout, a),
        Cmd::List(a) => threads::list(layout, a),
        Cmd::Path(a) => threads::path(layout, a),
        Cmd::Status(a) => threads::status(layout, a),
        Cmd::Stats(a) => admin::stats(layout, a),
        Cmd::Metrics => admin::metrics(layout),
        Cmd::Snapshot(a) => threads::snapshot(layout, a),
        Cmd::Release(a) => threads::release(layout, a),
        Cmd::Sweep(a) => threads::sweep(layout, a),
        Cmd::Diff(a) => threads::diff(layout, a),
        Cmd::Fsmonitor(a) => watch::fsmonitor(layout, a),
        Cmd::Completions(a) => admin::completions(a),
        Cmd::Man(a) => admin::man(a),
        Cmd::Watch(a) => watch::watch(layout, a),
        Cmd::Run(a) => threads::run(layout, a),
        Cmd::Doctor(a) => admin::doctor(layout, a),
        Cmd::Fork(a) => sharing::fork(layout, a),
        Cmd::Teleport(a) => sharing::teleport(layout, a),
        Cmd::Commit(a) => threads::commit(layout, a),
        Cmd::Push(a) => threads::push(layout, a),
        Cmd::Deps { cmd } => deps::run(layout, cmd),
        Cmd::Export(a) => sharing::export(layout, a),
        Cmd::Resync(a) => sharing::resync(layout, a),
        Cmd::Pull(a) => sharing::pull(layout, a),
        Cmd::Restart(a) => admin::restart(layout, a),
        Cmd::Csi(a) => admin::csi(layout, a),
        Cmd::TakeoverServe(a) => admin::takeover_serve(layout, a),
        Cmd::FdKeeper => admin::fd_keeper(layout),
        Cmd::TransportAs(_) => Err("transport-as is run by the daemon's git only".into()),
    }
}

/// Whether Ctrl-C cancelled a `mirror add`/`mirror sync` (the command then exits 130).
pub fn interrupted() -> bool {
    projects::INTERRUPTED.load(std::sync::atomic::Ordering::Acquire)
}

/// Sends `req`, starting a daemon when none runs; prints the daemon's warnings to stderr and
/// returns its answer.
fn ask<R: Call>(layout: &Layout, req: R) -> Result<Answered<R::Answer>, String> {
    let a = client::call(layout, req, true)?;
    for w in &a.warnings {
        eprintln!("octofs: warning: {w}");
    }
    Ok(a)
}
