//! The `octofs` command line: parses arguments, validates names before anything is touched, and
//! speaks to the daemon (starting one when none runs). Results go to stdout; errors are one line on
//! stderr with a non-zero exit.

#![forbid(unsafe_code)]

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::Value;

use cli::{
    AllowArgs, parse_duration, parse_size, print_stats, print_status, resolve_upstream, short,
};
use octofs::client;
use octofs::daemon::proto::{
    Access, AccessAnswer, DiffAnswer, Exported, Forked, FsmonitorAnswer, MirrorInfo, Opened,
    ReleaseAnswer, Request, Snapshotted, StatsAnswer, SweepAnswer, SyncOutcome, WorkspaceStatus,
};
use octofs::daemon::proto::{CommitMode, Committed, Pushed, Resynced};
use octofs::daemon::proto::{DiffFormat, NamedSnapshot, Pulled};
use octofs::layout::Layout;
use octofs::names::{NameKind, validate};

#[derive(Parser)]
#[command(
    name = "octofs",
    version,
    about = "Per-thread copy-on-write git workspaces as FUSE mounts"
)]
struct Cli {
    /// State directory (mirrors, workspaces, blob cache, control socket) [env: OCTOFS_STATE]
    // The environment is read in `main`, not by clap: clap names an argument taken from the
    // environment in every usage line (`Usage: octofs open --state <STATE> --root <ROOT>
    // <THREAD>`), as if it were required.
    #[arg(long, global = true)]
    state: Option<PathBuf>,
    /// Directory under which workspaces are mounted as <root>/<thread> [env: OCTOFS_ROOT]
    #[arg(long, global = true)]
    root: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon in the foreground
    Serve {
        /// Seconds within which a synced mirror is not fetched again
        #[arg(long, default_value_t = 0, env = "OCTOFS_FRESHNESS")]
        freshness: u64,
        /// Hand reads of open files to the kernel (FUSE passthrough; needs root and Linux >= 6.9)
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "OCTOFS_PASSTHROUGH")]
        passthrough: bool,
        /// Sweep timer: release workspaces idle this long (e.g. 30m, 2h; 0 turns the timer off)
        #[arg(long, default_value = "1h", value_parser = parse_duration, env = "OCTOFS_SWEEP_IDLE")]
        sweep_idle: u64,
        /// How often the sweep timer runs
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        sweep_every: u64,
        /// Clone and fetch give up after this long without progress (e.g. 300, 5m)
        #[arg(long, default_value = "5m", value_parser = parse_duration, env = "OCTOFS_FETCH_TIMEOUT")]
        fetch_timeout: u64,
        /// How mounts receive requests: dev (/dev/fuse threads), auto (FUSE over io_uring when the
        /// kernel offers it), uring (or the mount fails); see docs/transport.md
        #[arg(long, default_value = "dev", env = "OCTOFS_TRANSPORT")]
        transport: octofs::fs::uring::Transport,
        /// How mounts serve file I/O: auto (per workspace: no-open while the bases fit in half the
        /// memory, else handles), handles (OPEN/RELEASE, passthrough), or no-open (no request for a
        /// warm open/read/close; no passthrough, page cache per mount); see docs/performance.md
        #[arg(long, default_value = "auto", env = "OCTOFS_IO")]
        io: octofs::daemon::io_auto::IoSetting,
        /// The most live threads one user may hold (root is not counted; 0: no cap); see
        /// docs/lifecycle.md "Per-user limits"
        #[arg(long, default_value_t = octofs::daemon::DEFAULT_MAX_THREADS_PER_USER, env = "OCTOFS_MAX_THREADS_PER_USER")]
        max_threads_per_user: usize,
        /// The most bytes one user's workspaces may write to their upper layers (e.g. 10G, 512M;
        /// root is not counted; default: no quota); see docs/overlay.md "Quota"
        #[arg(long, value_parser = parse_size, env = "OCTOFS_QUOTA_PER_USER")]
        quota_per_user: Option<u64>,
        /// Keep every mount's connection in a keeper process, so that the mounts outlive a crash
        /// of the daemon and the next one adopts them; see docs/restart.md "A crash"
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "OCTOFS_KEEP_CONNECTIONS")]
        keep_connections: bool,
        /// Serve the daemon's metrics (Prometheus text format) at http://ADDR/metrics, e.g.
        /// 127.0.0.1:9464 (default: off); see docs/metrics.md
        #[arg(long, value_name = "ADDR", value_parser = octofs::daemon::metrics::parse_addr, env = "OCTOFS_METRICS")]
        metrics: Option<std::net::SocketAddr>,
        /// Who may read --metrics besides root and the daemon's user: uid[,uid…] or any (default:
        /// nobody else; a local client's uid is its socket's owner)
        #[arg(
            long,
            value_name = "WHO",
            default_value = "root",
            env = "OCTOFS_METRICS_ALLOW"
        )]
        metrics_allow: octofs::daemon::metrics::Allow,
    },
    /// Stop the daemon (its mounted workspaces are remounted when it starts again)
    Stop,
    /// Manage project mirrors
    Mirror {
        #[command(subcommand)]
        cmd: MirrorCmd,
    },
    /// Mount the thread's workspace (forking it on first use) and print its path
    Open {
        thread: String,
        /// The project the thread is bound to
        #[arg(long)]
        project: Option<String>,
        /// Branch, tag, commit or any revision of the mirror to fork at (default: its default branch)
        #[arg(long = "ref")]
        git_ref: Option<String>,
        /// This thread's I/O mode, kept across release and resume: handles or no-open (default: as
        /// the thread had it, else the daemon's `serve --io`, auto: chosen per workspace); a
        /// mounted thread keeps its mode
        #[arg(long)]
        io: Option<octofs::fs::IoMode>,
    },
    /// List workspaces
    List {
        #[arg(long)]
        json: bool,
    },
    /// Print where the thread's workspace is mounted (changes nothing: no open, no user counted)
    Path { thread: String },
    /// Show one workspace
    Status {
        thread: String,
        #[arg(long)]
        json: bool,
    },
    /// FUSE request statistics of a mounted thread, or of every mount (root): per-opcode counts
    /// and latency, bytes served by the daemon, passthrough opens
    Stats {
        thread: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print the daemon's metrics in Prometheus text format (root), as `serve --metrics` serves them
    Metrics,
    /// Save the thread's working state as a commit under refs/octomate/threads/<thread>; print its id
    Snapshot {
        thread: String,
        /// Also file it as the named snapshot refs/snapshots/<NAME> of the mirror (a chain: its
        /// second parent is the previous snapshot of that name); prints the named snapshot's id
        #[arg(long)]
        name: Option<String>,
        /// Push the named snapshot to this remote (`origin`, a URL or an absolute path) as a
        /// fast-forward; a diverged remote snapshot is refused, never overwritten
        #[arg(long, requires = "name", value_name = "REMOTE")]
        push: Option<String>,
    },
    /// Save if changed, unmount and drop the thread's workspace (the last of its users does)
    Release {
        thread: String,
        /// Release even while processes use the mount (they lose it)
        #[arg(long)]
        force: bool,
        /// Drop the workspace without saving it: its unsaved changes are lost (works without a mirror)
        #[arg(long)]
        discard: bool,
        /// Return at once; release when the last process has left the mount (`open` cancels it)
        #[arg(long, conflicts_with_all = ["force", "discard"])]
        when_idle: bool,
    },
    /// Release every workspace idle past the window whose state the mirror has seen
    Sweep {
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        idle: u64,
        #[arg(long)]
        json: bool,
    },
    /// What changed between two snapshots (or commits), or from one to the live state
    Diff {
        thread: String,
        /// Default: the workspace's base (a released thread: its last snapshot)
        #[arg(long)]
        from: Option<String>,
        /// Default: the live state (a released thread: its last snapshot); `saved` names the last snapshot
        #[arg(long)]
        to: Option<String>,
        /// Show the patch, not just the changed paths
        #[arg(long, conflicts_with_all = ["stat", "name_status"])]
        patch: bool,
        /// Show git's diffstat
        #[arg(long, conflicts_with = "name_status")]
        stat: bool,
        /// Show each changed path with its status (the default)
        #[arg(long)]
        name_status: bool,
    },
    /// git's fsmonitor hook (protocol v2): what `core.fsmonitor` runs in workspaces made before
    /// the `octofs-fsmonitor` program, or whose state path git could not exec without a shell
    #[command(hide = true)]
    Fsmonitor {
        thread: String,
        version: Option<String>,
        token: Option<String>,
    },
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell)
    Completions { shell: clap_complete::Shell },
    /// Write the man pages (octofs.1 and one per command, e.g. octofs-mirror-add.1) into DIR
    Man { dir: PathBuf },
    /// Stream the thread's changes as JSON lines (path, kind, token) until it is released
    Watch {
        thread: String,
        /// Start after this token (from an earlier line); default: from now
        #[arg(long)]
        since: Option<String>,
    },
    /// Run CMD in a sandbox that sees only the thread's workspace (bubblewrap, as the caller):
    /// the workspace read-write at /work (its working directory), /usr and /etc read-only, fresh
    /// /proc, /dev and /tmp, no network, a clean environment. Opens the thread first if needed
    /// (as `open`); `release --when-idle` waits for the sandbox. Exits with CMD's status.
    Run {
        thread: String,
        /// The project the thread is bound to (as for `open`)
        #[arg(long)]
        project: Option<String>,
        /// Revision to fork at when the thread is new (as for `open`)
        #[arg(long = "ref")]
        git_ref: Option<String>,
        /// Where the workspace appears inside the sandbox
        #[arg(long, value_name = "PATH", default_value = octofs::run::DEFAULT_AT)]
        at: PathBuf,
        /// A host path bound read-only at the same place (a toolchain, a package store); repeatable
        #[arg(long = "ro", value_name = "PATH")]
        ro: Vec<PathBuf>,
        /// Share the host's network
        #[arg(long)]
        net: bool,
        /// KEY=VALUE set inside (after the defaults PATH, HOME=/tmp, TERM, LANG); repeatable
        #[arg(long = "env", value_name = "KEY=VALUE", value_parser = octofs::run::parse_env)]
        env: Vec<(String, String)>,
        /// The command and its arguments
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<std::ffi::OsString>,
    },
    /// Find stale or hung mounts, orphaned or broken workspaces, corrupt cache files and indexes,
    /// and moved mirrors; exits non-zero while anything is left unresolved
    Doctor {
        /// Repair what is safe: unmount stale mounts, remove corrupt derived data, move broken
        /// workspaces to <state>/quarantine (never delete them)
        #[arg(long)]
        fix: bool,
        #[arg(long)]
        json: bool,
    },
    /// A new thread with a fork of another's current state (tracked changes, untracked files,
    /// HEAD) on a branch of its own; the source keeps running untouched. Prints the new path
    Fork {
        from: String,
        to: String,
        #[arg(long)]
        json: bool,
    },
    /// Move a thread's work to a new thread: bind it to a project at a ref, or (without
    /// --project) carry the source's state and its small ignored files. Prints the new path
    Teleport {
        from: String,
        to: String,
        /// Bind the new thread to this project (default: carry the source's state)
        #[arg(long)]
        project: Option<String>,
        /// Branch, tag, commit or any revision to start from (with --project)
        #[arg(long = "ref", requires = "project")]
        git_ref: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Commit the workspace's changes (all, or under --path) on its current branch through the
    /// gates; print the new commit id
    Commit {
        thread: String,
        /// The message (optional only with --mode amend, which then keeps HEAD's)
        #[arg(short = 'm', long = "message", default_value = "")]
        message: String,
        /// commit: a new commit on HEAD; fixup: `fixup! <anchor's subject>` on HEAD; amend: replace HEAD
        #[arg(long, value_enum, default_value_t = CommitMode::Commit)]
        mode: CommitMode,
        /// The commit a fixup fixes (HEAD or an ancestor; with --mode fixup)
        #[arg(long)]
        anchor: Option<String>,
        /// Commit only the changes at or below this path (repeatable)
        #[arg(long = "path")]
        paths: Vec<String>,
        /// A gate besides `excludes` (which always runs): secret-names, max-size=BYTES, cmd=PROGRAM
        #[arg(long = "gate")]
        gates: Vec<String>,
        /// A command run in the workspace (as its owner) before the commit; it may rewrite files,
        /// which are then committed; a failing hook stops the commit (repeatable, in order)
        #[arg(long = "hook")]
        hooks: Vec<String>,
        /// Also run git's own pre-commit, commit-msg and post-commit hooks of the workspace (as its
        /// owner); skipped by default
        #[arg(long)]
        git_hooks: bool,
    },
    /// Push the workspace's branch from the project's mirror through the gates
    Push {
        thread: String,
        /// A URL, or `origin` (default): the project's upstream
        #[arg(long)]
        remote: Option<String>,
        /// The remote branch (default: the workspace's branch)
        #[arg(long)]
        branch: Option<String>,
        /// Push only if the remote branch is exactly at this commit (--force-with-lease)
        #[arg(long)]
        lease: Option<String>,
        /// A gate besides `excludes` (which always runs): secret-names, max-size=BYTES, cmd=PROGRAM
        #[arg(long = "gate")]
        gates: Vec<String>,
    },
    /// Dependency layers (node_modules, .venv): installed once per host from a project's lockfiles
    /// and presented read-through in its workspaces
    Deps {
        #[command(subcommand)]
        cmd: DepsCmd,
    },
    /// Write the thread's saved state back into its project's folder (a plain-directory
    /// upstream), merged three-way with the folder's own changes; a conflict changes nothing
    Export {
        thread: String,
        /// List what would change (`A path`, `M path`, `D path`) and change nothing
        #[arg(long)]
        dry_run: bool,
        #[arg(long)]
        json: bool,
    },
    /// Bring a workspace to its upstream branch's tip after a mirror sync: a developer's clean
    /// workspace fast-forwards (dirty or ahead: refused, nothing changes); a reviewer's is saved
    /// as a snapshot, then reset to the tip
    Resync {
        thread: String,
        #[arg(long, value_parser = ["developer", "reviewer"])]
        role: String,
        #[arg(long)]
        json: bool,
    },
    /// Apply a remote's named snapshot refs/snapshots/<NAME> to the workspace as uncommitted
    /// changes (fast-forward only: HEAD must be its base, local changes are never lost)
    Pull {
        thread: String,
        /// `origin`, a URL or an absolute path
        #[arg(long)]
        remote: String,
        #[arg(long)]
        name: String,
        /// Pull over local changes: they are saved in a snapshot first (its id is printed)
        #[arg(long)]
        force: bool,
    },
    /// Restart the daemon without unmounting: a new daemon process (the binary now installed at
    /// the daemon's path) takes over every mount, its open files and its state; processes in the
    /// mounts notice nothing. If the handover fails, the running daemon goes on serving
    Restart {
        /// Start the new daemon from this binary instead of the one at the daemon's path
        #[arg(long)]
        exe: Option<PathBuf>,
    },
    /// Serve a Kubernetes CSI node plugin on a Unix socket: pods get threads as inline volumes
    /// (docs/kubernetes.md); a client of this node's daemon
    Csi {
        /// The socket kubelet calls: unix:///ABSOLUTE/PATH
        #[arg(long, env = "CSI_ENDPOINT")]
        endpoint: String,
        /// This node's id (default: the host name; in a DaemonSet, the node name)
        #[arg(long, env = "OCTOFS_NODE_ID")]
        node_id: Option<String>,
        /// Where the plugin records its publications
        #[arg(long, default_value = "/var/lib/octofs-csi")]
        plugin_dir: PathBuf,
        /// The lowest uid a pod may ask for (the `uid` attribute); 0 would let pods ask for root
        #[arg(long, default_value_t = 1000)]
        min_uid: u32,
    },
    /// The far side of a transport to a remote a caller named, run as that caller (started by the
    /// daemon's git, not for use by hand; see `git::mirror::far_side`)
    #[command(name = "transport-as", hide = true)]
    TransportAs {
        #[arg(long)]
        uid: Option<u32>,
        #[arg(long)]
        gid: Option<u32>,
        /// Supplementary groups, comma-separated
        #[arg(long, default_value = "")]
        groups: String,
        /// A directory no repository of the far side may be in
        #[arg(long)]
        deny: Vec<PathBuf>,
        /// upload-pack, receive-pack or ssh
        program: String,
        /// What git appends: the repository path, or ssh's arguments
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<std::ffi::OsString>,
    },
    /// The new daemon of a restart, started by the old one (not for use by hand)
    #[command(hide = true)]
    TakeoverServe {
        /// The old daemon's takeover socket
        #[arg(long)]
        from: PathBuf,
    },
    /// The connection keeper, started by the daemon (not for use by hand)
    #[command(hide = true)]
    FdKeeper,
}

#[derive(Subcommand)]
enum DepsCmd {
    /// The layers of the host: key, manager, path, state, size, files, when built, users
    List {
        #[arg(long)]
        json: bool,
    },
    /// Remove the layers no workspace uses and no mirror's default branch needs; prune the store
    Gc {
        #[arg(long)]
        json: bool,
    },
    /// Build the layers of a project's commit that are missing or failed; print what was built or
    /// why it failed
    Build {
        project: String,
        /// Branch, tag or commit of the mirror (default: its default branch)
        #[arg(long = "ref")]
        git_ref: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum MirrorCmd {
    /// Create a project's mirror from a git URL, a git repository path or a plain directory
    Add {
        project: String,
        upstream: String,
        /// A file holding the http(s) upstream's credentials (a token, or user:token), copied into
        /// the daemon's private state; keeps them off the command line
        #[arg(long, value_name = "FILE")]
        credential_file: Option<PathBuf>,
        #[command(flatten)]
        allow: AllowArgs,
        /// A share remote (a URL or a bare repository's path): every snapshot of the project's
        /// threads is also pushed to its refs/octomate/threads/<thread>, and `open` resumes from it
        #[arg(long, value_name = "REMOTE")]
        share: Option<String>,
    },
    /// Show or change who may bind a project (open threads of it); root only
    Access {
        project: String,
        #[command(flatten)]
        allow: AllowArgs,
        /// Let any local user bind it again
        #[arg(long, conflicts_with_all = ["allow_user", "allow_group"])]
        anyone: bool,
    },
    /// Fetch (or re-commit a directory upstream) unless synced within the freshness window
    Sync { project: String },
    /// List mirrors
    List {
        #[arg(long)]
        json: bool,
    },
    /// Change a project's settings: its share remote
    Set {
        project: String,
        /// The share remote (a URL or a bare repository's path)
        #[arg(long, value_name = "REMOTE")]
        share: Option<String>,
        /// Stop sharing the project's threads
        #[arg(long, conflicts_with = "share")]
        no_share: bool,
        /// A gitignore-style pattern whose paths are never committed or pushed from the project's
        /// workspaces, even where a branch tracks them (repeatable; replaces the project's list)
        #[arg(long = "exclude", value_name = "PATTERN")]
        excludes: Vec<String>,
        /// Clear the project's excludes
        #[arg(long, conflicts_with = "excludes")]
        no_excludes: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::TransportAs {
        uid,
        gid,
        groups,
        deny,
        program,
        rest,
    } = cli.cmd
    {
        let Ok(groups) = groups
            .split(',')
            .filter(|g| !g.is_empty())
            .map(str::parse::<u32>)
            .collect::<Result<Vec<u32>, _>>()
        else {
            eprintln!("fatal: --groups wants comma-separated numbers, not {groups:?}");
            return ExitCode::from(128);
        };
        return octofs::git::mirror::far_side::run(octofs::git::mirror::far_side::Args {
            uid,
            gid,
            groups,
            deny,
            program,
            rest,
        });
    }
    if !matches!(
        cli.cmd,
        Cmd::Serve { .. } | Cmd::TakeoverServe { .. } | Cmd::FdKeeper | Cmd::Csi { .. }
    ) {
        octofs::sys::default_sigpipe();
    }
    let from_env = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let layout = Layout::resolve(
        cli.state.or_else(|| from_env("OCTOFS_STATE")),
        cli.root.or_else(|| from_env("OCTOFS_ROOT")),
    );
    match run(&layout, cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("octofs: {e}");
            if INTERRUPTED.load(std::sync::atomic::Ordering::Acquire) {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// A remote to push to or pull from: `origin` (the project's upstream) as it is, a path made
/// absolute, a URL as given.
fn resolve_remote(remote: &str) -> Result<String, String> {
    if remote == "origin" {
        return Ok(remote.to_string());
    }
    resolve_upstream(remote)
}

fn request(layout: &Layout, req: Request) -> Result<Value, String> {
    let resp = client::call(layout, &req, true)?;
    for w in &resp.warnings {
        eprintln!("octofs: warning: {w}");
    }
    if resp.ok {
        Ok(resp.result)
    } else {
        Err(resp
            .error
            .unwrap_or_else(|| "the daemon reported an error".into()))
    }
}

/// `octofs watch`: polls the daemon's journal of the thread every 100 ms and prints one JSON line per
/// change — `{"path", "kind", "token"}`, kind `changed`, `removed` or `directory` as the path is now
/// in the workspace (the daemon's answer: nothing here looks through the mount) — a `rescan` line
/// when the token cannot be trusted, and a `released` line (exit 0) when the workspace goes away.
/// Each line's token resumes the stream after it (`--since`). The requests of one change (`echo >
/// file`: open, truncate, write, close) are one line: see [`cli::Coalesce`].
/// Across `octofs restart` (or a crash the next daemon recovers from) the stream goes on: while the
/// daemon cannot be reached or says it is restarting, the same token is asked again, for up to
/// `WATCH_RECONNECT` (1 s once the control socket is gone: a `stop`); the new daemon's journal
/// starts afresh, so its first answer is a `rescan` line, then changes as before.
fn watch(layout: &Layout, thread: String, since: Option<String>) -> Result<(), String> {
    use octofs::daemon::proto::WatchAnswer;
    use std::io::Write;
    const WATCH_RECONNECT: std::time::Duration = std::time::Duration::from_secs(15);
    let mut token = since.unwrap_or_default();
    let mut first = true;
    let mut unreachable_since: Option<std::time::Instant> = None;
    let mut held = cli::Coalesce::default();
    let print = |lines: Vec<Value>| -> bool {
        let mut out = std::io::stdout().lock();
        lines
            .into_iter()
            .try_for_each(|v| writeln!(out, "{v}").and_then(|()| out.flush()))
            .is_ok()
    };
    loop {
        let req = Request::Watch {
            thread: thread.clone(),
            token: token.clone(),
        };
        let resp = client::call(layout, &req, false);
        let between_daemons = match &resp {
            Err(_) => true,
            Ok(r) => !r.ok && r.error.as_deref().is_some_and(|e| e.contains("restarting")),
        };
        if between_daemons && !first {
            let since = *unreachable_since.get_or_insert_with(std::time::Instant::now);
            let budget = if layout.socket().exists() {
                WATCH_RECONNECT
            } else {
                std::time::Duration::from_secs(1)
            };
            if since.elapsed() < budget {
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        }
        unreachable_since = None;
        let resp = match resp {
            Ok(r) => r,
            // The daemon stopped: the workspace is gone with it.
            Err(_) if !first => octofs::daemon::proto::Response {
                ok: false,
                ..Default::default()
            },
            Err(e) => return Err(e.to_string()),
        };
        if !resp.ok {
            if first {
                return Err(resp.error.unwrap_or_default());
            }
            let mut lines = held.flush();
            lines.push(serde_json::json!({"kind": "released", "token": token}));
            print(lines);
            return Ok(());
        }
        first = false;
        let a: WatchAnswer = parse(resp.result)?;
        let lines = if a.everything {
            let mut lines = held.flush();
            lines.push(serde_json::json!({"kind": "rescan", "token": a.token}));
            lines
        } else {
            held.add(a.entries.iter().map(|e| {
                let mut v = serde_json::json!({"path": e.path, "kind": e.kind, "token": e.token});
                if let Some(h) = &e.path_hex {
                    v["path_hex"] = Value::String(h.clone());
                }
                v
            }));
            held.due(std::time::Instant::now())
        };
        if !print(lines) {
            // The reader went away.
            return Ok(());
        }
        token = a.token;
        std::thread::sleep(cli::WATCH_POLL);
    }
}

/// The answer to `fork` and `teleport`: the new path (or the whole answer as JSON).
fn print_forked(v: Value, json: bool) -> Result<(), String> {
    if json {
        println!("{v}");
        return Ok(());
    }
    let f: Forked = parse(v)?;
    println!("{}", f.path);
    Ok(())
}

fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
    serde_json::from_value(v).map_err(|e| format!("bad answer from the daemon: {e}"))
}

fn run(layout: &Layout, cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "octofs", &mut std::io::stdout());
            Ok(())
        }
        Cmd::Watch { thread, since } => {
            validate(NameKind::Thread, &thread)?;
            watch(layout, thread, since)
        }
        Cmd::Run {
            thread,
            project,
            git_ref,
            at,
            ro,
            net,
            env,
            cmd,
        } => {
            validate(NameKind::Thread, &thread)?;
            if let Some(p) = &project {
                validate(NameKind::Project, p)?;
            }
            if !at.is_absolute() {
                return Err(format!("--at {} is not an absolute path", at.display()));
            }
            if let Some(p) = ro.iter().find(|p| !p.is_absolute()) {
                return Err(format!("--ro {} is not an absolute path", p.display()));
            }
            let bwrap = octofs::run::bwrap()?;
            let opened: Opened = parse(request(
                layout,
                Request::Open {
                    thread,
                    project,
                    git_ref,
                    io: None,
                },
            )?)?;
            let sb = octofs::run::Sandbox {
                at: Some(at),
                ro,
                net,
                env,
            };
            let args = octofs::run::bwrap_args(
                std::path::Path::new(&opened.path),
                &sb,
                &cmd,
                std::env::var_os("TERM"),
                std::env::var_os("LANG"),
            );
            use std::os::unix::process::CommandExt;
            let e = std::process::Command::new(&bwrap).args(args).exec();
            Err(format!("cannot start {}: {e}", bwrap.display()))
        }
        Cmd::Doctor { fix, json } => {
            let r = octofs::doctor::run(layout, fix);
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&r).map_err(|e| format!("cannot encode: {e}"))?
                );
            } else {
                octofs::doctor::print(&r, fix);
            }
            match r.unresolved() {
                0 => Ok(()),
                n => Err(format!("{n} finding(s) unresolved")),
            }
        }
        Cmd::Man { dir } => {
            use clap::CommandFactory;
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .map_err(|e| format!("cannot write the man pages into {}: {e}", dir.display()))
        }
        Cmd::Serve {
            freshness,
            passthrough,
            sweep_idle,
            sweep_every,
            fetch_timeout,
            transport,
            io,
            max_threads_per_user,
            quota_per_user,
            keep_connections,
            metrics,
            metrics_allow,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("OCTOFS_LOG")
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                // Colour only on a terminal: the daemon's log file is plain text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            octofs::daemon::serve(
                layout.clone(),
                octofs::daemon::Settings {
                    freshness_secs: freshness,
                    passthrough,
                    sweep_idle,
                    sweep_every,
                    fetch_timeout_secs: fetch_timeout,
                    transport,
                    io,
                    max_threads_per_user,
                    quota_per_user,
                    keep_connections,
                    metrics: metrics.map(|addr| octofs::daemon::metrics::Endpoint {
                        addr,
                        allow: metrics_allow,
                    }),
                },
            )
            .map_err(|e| format!("{e:#}"))
        }
        Cmd::Stop => {
            if client::stop(layout)? {
                println!("stopped");
            } else {
                println!("no daemon running");
            }
            Ok(())
        }
        Cmd::Mirror { cmd } => match cmd {
            MirrorCmd::Add {
                project,
                upstream,
                credential_file,
                allow,
                share,
            } => {
                validate(NameKind::Project, &project)?;
                let upstream = resolve_upstream(&upstream)?;
                let share = share.as_deref().map(resolve_upstream).transpose()?;
                let access = allow.resolve()?;
                // Read here, as the caller: the daemon never opens a path on a caller's behalf.
                let credential = credential_file
                    .map(|f| {
                        std::fs::read_to_string(&f)
                            .map_err(|e| format!("cannot read {}: {e}", f.display()))
                    })
                    .transpose()?;
                let mut info: MirrorInfo = parse(with_progress(layout, &project.clone(), || {
                    request(
                        layout,
                        Request::MirrorAdd {
                            project: project.clone(),
                            upstream,
                            credential,
                            access,
                        },
                    )
                })?)?;
                if let Some(share) = share {
                    info = parse(request(
                        layout,
                        Request::MirrorShare {
                            project,
                            share: Some(share),
                        },
                    )?)?;
                }
                println!(
                    "{} {} {}",
                    info.project.project,
                    info.project.default_branch,
                    info.head.as_deref().unwrap_or("(empty)")
                );
                Ok(())
            }
            MirrorCmd::Access {
                project,
                allow,
                anyone,
            } => {
                validate(NameKind::Project, &project)?;
                let access = if anyone {
                    Some(Access::default())
                } else if allow.is_empty() {
                    None
                } else {
                    Some(allow.resolve()?)
                };
                let answer: AccessAnswer = parse(request(
                    layout,
                    Request::MirrorAccess {
                        project: project.clone(),
                        access,
                    },
                )?)?;
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
            MirrorCmd::Sync { project } => {
                validate(NameKind::Project, &project)?;
                let out: SyncOutcome = parse(with_progress(layout, &project.clone(), || {
                    request(layout, Request::MirrorSync { project })
                })?)?;
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
            MirrorCmd::List { json } => {
                let v = request(layout, Request::MirrorList)?;
                if json {
                    println!("{v}");
                    return Ok(());
                }
                let list: Vec<MirrorInfo> = parse(v)?;
                println!("PROJECT\tKIND\tBRANCH\tHEAD\tUPSTREAM\tACCESS");
                for m in list {
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
                        cli::access_line(&m.project.access)
                    );
                }
                Ok(())
            }
            MirrorCmd::Set {
                project,
                share,
                no_share,
                excludes,
                no_excludes,
            } => {
                validate(NameKind::Project, &project)?;
                let sets_share = share.is_some() || no_share;
                let sets_excludes = !excludes.is_empty() || no_excludes;
                if !sets_share && !sets_excludes {
                    return Err(
                        "mirror set: nothing to set (--share, --no-share, --exclude or --no-excludes)"
                            .into(),
                    );
                }
                if sets_share {
                    let share = if no_share {
                        None
                    } else {
                        share.as_deref().map(resolve_upstream).transpose()?
                    };
                    let info: MirrorInfo = parse(request(
                        layout,
                        Request::MirrorShare {
                            project: project.clone(),
                            share,
                        },
                    )?)?;
                    println!(
                        "{} share {}",
                        info.project.project,
                        info.project.share.as_deref().unwrap_or("(none)")
                    );
                }
                if sets_excludes {
                    let info: MirrorInfo = parse(request(
                        layout,
                        Request::MirrorExcludes { project, excludes },
                    )?)?;
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
        },
        Cmd::Open {
            thread,
            project,
            git_ref,
            io,
        } => {
            validate(NameKind::Thread, &thread)?;
            if let Some(p) = &project {
                validate(NameKind::Project, p)?;
            }
            let opened: Opened = parse(request(
                layout,
                Request::Open {
                    thread,
                    project,
                    git_ref,
                    io,
                },
            )?)?;
            println!("{}", opened.path);
            Ok(())
        }
        Cmd::List { json } => {
            let v = request(layout, Request::List)?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let list: Vec<WorkspaceStatus> = parse(v)?;
            // Tab-separated under a header; new columns go last (scripts cut by position).
            println!("THREAD\tPROJECT\tBASE\tSTATE\tPATH\tBYTES\tOWNER");
            for w in list {
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
        Cmd::Snapshot {
            thread,
            name: None,
            push: None,
        } => {
            validate(NameKind::Thread, &thread)?;
            let s: Snapshotted = parse(request(layout, Request::Snapshot { thread })?)?;
            println!("{}", s.commit);
            Ok(())
        }
        Cmd::Snapshot { thread, name, push } => {
            validate(NameKind::Thread, &thread)?;
            let push = push.as_deref().map(resolve_remote).transpose()?;
            let s: NamedSnapshot = parse(request(
                layout,
                Request::SnapshotNamed { thread, name, push },
            )?)?;
            println!("{}", s.commit);
            Ok(())
        }
        Cmd::Release {
            thread,
            force,
            discard,
            when_idle,
        } => {
            validate(NameKind::Thread, &thread)?;
            let req = if when_idle {
                Request::ReleaseWhenIdle {
                    thread: thread.clone(),
                }
            } else {
                Request::Release {
                    thread: thread.clone(),
                    force,
                    discard,
                }
            };
            let r: ReleaseAnswer = parse(request(layout, req)?)?;
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
                    None if discard => println!("released {thread} (discarded, not saved)"),
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
        Cmd::Sweep { idle, json } => {
            let v = request(layout, Request::Sweep { idle_secs: idle })?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let s: SweepAnswer = parse(v)?;
            for t in s.released {
                println!("released {t}");
            }
            for k in s.kept {
                println!("kept {} ({})", k.thread, k.why);
            }
            Ok(())
        }
        Cmd::Diff {
            thread,
            from,
            to,
            patch,
            stat,
            name_status,
        } => {
            validate(NameKind::Thread, &thread)?;
            let format = if stat {
                Some(DiffFormat::Stat)
            } else if name_status {
                Some(DiffFormat::NameStatus)
            } else {
                None
            };
            let d: DiffAnswer = parse(request(
                layout,
                Request::Diff {
                    thread,
                    from,
                    to,
                    patch,
                    format,
                },
            )?)?;
            if !d.diff.is_empty() {
                println!("{}", d.diff);
            }
            Ok(())
        }
        Cmd::Fsmonitor {
            thread,
            version,
            token,
        } => {
            if version.as_deref() != Some("2") {
                return Err(format!(
                    "fsmonitor: unsupported hook version {version:?} (expected 2)"
                ));
            }
            let resp = client::call(
                layout,
                &Request::Fsmonitor {
                    thread,
                    token: token.unwrap_or_default(),
                },
                false,
            )?;
            if !resp.ok {
                return Err(resp.error.unwrap_or_default());
            }
            let a: FsmonitorAnswer = parse(resp.result)?;
            let mut out = Vec::new();
            out.extend_from_slice(a.token.as_bytes());
            out.push(0);
            if a.everything {
                out.extend_from_slice(b"/\0");
            } else {
                for p in &a.paths {
                    out.extend_from_slice(p.as_bytes());
                    out.push(0);
                }
            }
            use std::io::Write;
            std::io::stdout()
                .write_all(&out)
                .map_err(|e| format!("fsmonitor: {e}"))
        }
        Cmd::Metrics => {
            let v = request(layout, Request::Metrics)?;
            let text: String = parse(v)?;
            print!("{text}");
            Ok(())
        }
        Cmd::Stats { thread, json } => {
            if let Some(t) = &thread {
                validate(NameKind::Thread, t)?;
            }
            let v = request(
                layout,
                Request::Stats {
                    thread: thread.clone(),
                },
            )?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let a: StatsAnswer = parse(v)?;
            match thread {
                Some(_) => {
                    for w in &a.workspaces {
                        println!("thread {}", w.thread);
                        // (h-default: the mount's I/O mode and why)
                        let io = cli::io_shown(w.io.as_deref(), w.io_why.as_deref());
                        io.iter().for_each(|io| println!("io: {io}"));
                        print_stats(&w.stats);
                    }
                }
                None => {
                    println!("daemon: {} mounted workspace(s)", a.workspaces.len());
                    print_stats(&a.total);
                    for w in &a.workspaces {
                        let io = w.io.as_deref().unwrap_or("-"); // (h-default: the I/O mode)
                        let n = w.stats.requests();
                        println!("  {:<24} {:>12} requests  {io}", w.thread, n);
                    }
                }
            }
            Ok(())
        }
        Cmd::Fork { from, to, json } => {
            validate(NameKind::Thread, &from)?;
            validate(NameKind::Thread, &to)?;
            print_forked(request(layout, Request::Fork { from, to })?, json)
        }
        Cmd::Teleport {
            from,
            to,
            project,
            git_ref,
            json,
        } => {
            validate(NameKind::Thread, &from)?;
            validate(NameKind::Thread, &to)?;
            if let Some(p) = &project {
                validate(NameKind::Project, p)?;
            }
            print_forked(
                request(
                    layout,
                    Request::Teleport {
                        from,
                        to,
                        project,
                        git_ref,
                    },
                )?,
                json,
            )
        }
        Cmd::Path { thread } => {
            validate(NameKind::Thread, &thread)?;
            let w: WorkspaceStatus = parse(request(layout, Request::Status { thread })?)?;
            if w.state != "mounted" {
                return Err(format!(
                    "thread {} is {} (octofs open {} mounts it)",
                    w.thread, w.state, w.thread
                ));
            }
            println!("{}", w.path);
            Ok(())
        }
        Cmd::Status { thread, json } => {
            validate(NameKind::Thread, &thread)?;
            let v = request(layout, Request::Status { thread })?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let w: WorkspaceStatus = parse(v)?;
            print_status(&w);
            Ok(())
        }
        Cmd::Commit {
            thread,
            message,
            mode,
            anchor,
            paths,
            gates,
            hooks,
            git_hooks,
        } => {
            validate(NameKind::Thread, &thread)?;
            let mut message = message;
            let hooked = if hooks.is_empty() && !git_hooks {
                None
            } else {
                let w: WorkspaceStatus = parse(request(
                    layout,
                    Request::Status {
                        thread: thread.clone(),
                    },
                )?)?;
                let run = octofs::hooks::Runner::for_workspace(&w)?;
                for h in &hooks {
                    run.hook(h)?;
                }
                if git_hooks {
                    run.git_hook("pre-commit", &[])?;
                    if !message.is_empty() {
                        message = run.commit_msg(&message)?;
                    }
                }
                Some(run)
            };
            let c: Committed = parse(request(
                layout,
                Request::Commit {
                    thread,
                    message,
                    paths,
                    gates,
                    mode,
                    anchor,
                },
            )?)?;
            if git_hooks && let Some(run) = hooked {
                // As git does: post-commit cannot undo the commit; its failure is only reported.
                if let Err(e) = run.git_hook("post-commit", &[]) {
                    eprintln!("octofs: warning: {e}");
                }
            }
            println!("{}", c.commit);
            Ok(())
        }
        Cmd::Push {
            thread,
            remote,
            branch,
            lease,
            gates,
        } => {
            validate(NameKind::Thread, &thread)?;
            let p: Pushed = parse(request(
                layout,
                Request::Push {
                    thread,
                    remote,
                    branch,
                    lease,
                    gates,
                },
            )?)?;
            println!("{} {}", p.branch, p.commit);
            Ok(())
        }
        Cmd::Deps { cmd } => deps(layout, cmd),
        Cmd::Export {
            thread,
            dry_run,
            json,
        } => {
            validate(NameKind::Thread, &thread)?;
            let v = request(layout, Request::Export { thread, dry_run })?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let e: Exported = parse(v)?;
            for c in &e.changes {
                println!("{} {}", c.status, c.path);
            }
            Ok(())
        }
        Cmd::Resync { thread, role, json } => {
            validate(NameKind::Thread, &thread)?;
            let v = request(layout, Request::Resync { thread, role })?;
            let r: Resynced = parse(v.clone())?;
            if json {
                println!("{v}");
            }
            let short_id = |s: &str| short(s).to_string();
            match (r.action.as_str(), json) {
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
        Cmd::Pull {
            thread,
            remote,
            name,
            force,
        } => {
            validate(NameKind::Thread, &thread)?;
            let remote = resolve_remote(&remote)?;
            let p: Pulled = parse(request(
                layout,
                Request::Pull {
                    thread,
                    remote,
                    name,
                    force,
                },
            )?)?;
            if let Some(s) = &p.saved_first {
                println!("saved the local changes first as snapshot {s}");
            }
            println!("{}", p.commit);
            Ok(())
        }
        Cmd::Restart { exe } => {
            let exe = exe
                .map(|p| std::path::absolute(&p).map_err(|e| format!("{}: {e}", p.display())))
                .transpose()?;
            let resp = client::call(layout, &Request::Restart { exe }, false)
                .map_err(|e| e.to_string())?;
            if !resp.ok {
                return Err(resp.error.unwrap_or_default());
            }
            let r: octofs::daemon::proto::Restarted = parse(resp.result)?;
            println!(
                "restarted: pid {} -> {}, {} mounts and {} open files handed over, requests paused {:.1} ms",
                r.old_pid, r.new_pid, r.mounts, r.handles, r.pause_ms
            );
            Ok(())
        }
        Cmd::TakeoverServe { from } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("OCTOFS_LOG")
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                // Colour only on a terminal: the daemon's log file is plain text.
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init();
            octofs::daemon::serve_takeover(layout.clone(), &from).map_err(|e| format!("{e:#}"))
        }
        Cmd::FdKeeper => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_env("OCTOFS_LOG")
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_writer(std::io::stderr)
                .with_ansi(false)
                .init();
            octofs::daemon::run_keeper(layout).map_err(|e| format!("{e:#}"))
        }
        Cmd::Csi {
            endpoint,
            node_id,
            plugin_dir,
            min_uid,
        } => {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find the octofs binary: {e}"))?;
            let config = octofs::csi::node::Config {
                layout: layout.clone(),
                node_id: node_id.unwrap_or_else(octofs::csi::host_name),
                plugin_dir,
                min_uid,
                exe,
            };
            octofs::csi::serve(config, &endpoint)
        }
        Cmd::TransportAs { .. } => Err("transport-as is run by the daemon's git only".into()),
    }
}

/// Set once Ctrl-C asked the daemon to cancel the running `mirror add`/`mirror sync`: the command
/// then exits 130, as an interrupted command does.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs `f` (a `mirror add` or `mirror sync` request of `project`). Meanwhile, when stderr is a
/// terminal, shows git's progress line and the project's dependency builds (a line when one
/// starts, a line with its result and time); and on Ctrl-C asks the daemon to cancel the request,
/// which then fails having kept nothing (a second Ctrl-C leaves at once).
fn with_progress<T: Send>(layout: &Layout, project: &str, f: impl FnOnce() -> T + Send) -> T {
    use octofs::daemon::proto::{FetchProgress, OutcomeKind, ProgressAnswer};
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
    let call = |req: Request| -> Option<serde_json::Value> {
        let resp = client::call(layout, &req, false).ok()?;
        resp.ok.then_some(resp.result)
    };
    let deps = |after: u64| -> Option<ProgressAnswer> {
        serde_json::from_value(call(Request::DepsProgress {
            project: project.to_string(),
            after,
        })?)
        .ok()
    };
    let fetch = || -> Option<FetchProgress> {
        serde_json::from_value(call(Request::MirrorProgress {
            project: project.to_string(),
        })?)
        .ok()
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
                if call(Request::MirrorCancel {
                    project: project.to_string(),
                })
                .is_none()
                {
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

/// `octofs deps list|gc|build`.
fn deps(layout: &Layout, cmd: DepsCmd) -> Result<(), String> {
    use octofs::daemon::proto::{BuildAnswer, GcAnswer, LayerInfo, OutcomeKind};
    match cmd {
        DepsCmd::List { json } => {
            let v = request(layout, Request::DepsList)?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let list: Vec<LayerInfo> = parse(v)?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            println!("KEY\tMANAGER\tPATH\tSTATE\tSIZE\tFILES\tBUILT\tTHREADS\tOWNERS");
            for l in list {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    short(&l.key),
                    l.manager.name(),
                    l.path,
                    l.state,
                    mib(l.bytes),
                    l.files,
                    ago(now.saturating_sub(l.built_at)),
                    if l.users.is_empty() {
                        "-".to_string()
                    } else {
                        l.users.join(",")
                    },
                    if l.owners.is_empty() {
                        "-".to_string()
                    } else {
                        l.owners.join(",")
                    }
                );
                if let (Some(m), Some(log)) = (&l.message, &l.log) {
                    println!("  {m} (see {})", log.display());
                }
            }
            Ok(())
        }
        DepsCmd::Gc { json } => {
            let v = request(layout, Request::DepsGc)?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let a: GcAnswer = parse(v)?;
            for r in &a.removed {
                println!(
                    "removed {} layer {} ({}, {})",
                    r.manager.name(),
                    short(&r.key),
                    r.state,
                    mib(r.bytes)
                );
            }
            println!(
                "{} layer(s) removed, {} kept, {} freed",
                a.removed.len(),
                a.kept,
                mib(a.freed_bytes)
            );
            Ok(())
        }
        DepsCmd::Build {
            project,
            git_ref,
            json,
        } => {
            validate(NameKind::Project, &project)?;
            let v = request(layout, Request::DepsBuild { project, git_ref })?;
            if json {
                println!("{v}");
                return Ok(());
            }
            let a: BuildAnswer = parse(v)?;
            if a.outcomes.is_empty() {
                println!("{} {}: no lockfile, no layer", a.project, short(&a.commit));
            }
            let mut failed = 0;
            for o in &a.outcomes {
                if matches!(o.result, OutcomeKind::Failed { .. }) {
                    failed += 1;
                }
                println!("{}", o.describe());
            }
            match failed {
                0 => Ok(()),
                n => Err(format!("{n} layer(s) failed to build")),
            }
        }
    }
}

/// Bytes as MiB with one decimal.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// How long ago, in the largest whole unit.
fn ago(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s if s < 172_800 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}
