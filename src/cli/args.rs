//! What the command line is: clap's `Cli` and its commands (each command's arguments a struct
//! of its own), and what the arguments mean before a request is sent: durations, sizes, upstreams
//! and remotes made absolute, who may bind a project. Parses and resolves only: no request to the
//! daemon, no output.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use octofs::proto::{Access, CommitMode};

#[derive(Parser)]
#[command(
    name = "octofs",
    version,
    about = "Per-thread copy-on-write git workspaces as FUSE mounts"
)]
pub struct Cli {
    /// State directory (mirrors, workspaces, blob cache, control socket) [env: OCTOFS_STATE]
    // The environment is read in `main`, not by clap: clap names an argument taken from the
    // environment in every usage line (`Usage: octofs open --state <STATE> --root <ROOT>
    // <THREAD>`), as if it were required.
    #[arg(long, global = true)]
    pub state: Option<PathBuf>,
    /// Directory under which workspaces are mounted as <root>/<thread> [env: OCTOFS_ROOT]
    #[arg(long, global = true)]
    pub root: Option<PathBuf>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the daemon in the foreground
    Serve(ServeArgs),
    /// Stop the daemon (its mounted workspaces are remounted when it starts again)
    Stop,
    /// Manage project mirrors
    Mirror {
        #[command(subcommand)]
        cmd: MirrorCmd,
    },
    /// Mount the thread's workspace (forking it on first use) and print its path
    Open(OpenArgs),
    /// List workspaces
    List(ListArgs),
    /// Print where the thread's workspace is mounted (changes nothing: no open, no user counted)
    Path(PathArgs),
    /// Show one workspace
    Status(StatusArgs),
    /// FUSE request statistics of a mounted thread, or of every mount (root): per-opcode counts
    /// and latency, bytes served by the daemon, passthrough opens
    Stats(StatsArgs),
    /// Print the daemon's metrics in Prometheus text format (root), as `serve --metrics` serves them
    Metrics,
    /// Save the thread's working state as a commit under refs/octomate/threads/<thread>; print its id
    Snapshot(SnapshotArgs),
    /// Save if changed, unmount and drop the thread's workspace (the last of its users does)
    Release(ReleaseArgs),
    /// Release every workspace idle past the window whose state the mirror has seen
    Sweep(SweepArgs),
    /// What changed between two snapshots (or commits), or from one to the live state
    Diff(DiffArgs),
    /// git's fsmonitor hook (protocol v2): what `core.fsmonitor` runs in workspaces made before
    /// the `octofs-fsmonitor` program, or whose state path git could not exec without a shell
    #[command(hide = true)]
    Fsmonitor(FsmonitorArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell)
    Completions(CompletionsArgs),
    /// Write the man pages (octofs.1 and one per command, e.g. octofs-mirror-add.1) into DIR
    Man(ManArgs),
    /// Stream the thread's changes as JSON lines (path, kind, token) until it is released
    Watch(WatchArgs),
    /// Run CMD in a sandbox that sees only the thread's workspace (bubblewrap, as the caller):
    /// the workspace read-write at /work (its working directory), /usr and /etc read-only, fresh
    /// /proc, /dev and /tmp, no network, a clean environment. Opens the thread first if needed
    /// (as `open`); `release --when-idle` waits for the sandbox. Exits with CMD's status.
    Run(RunArgs),
    /// Find stale or hung mounts, orphaned or broken workspaces, corrupt cache files and indexes,
    /// and moved mirrors; exits non-zero while anything is left unresolved
    Doctor(DoctorArgs),
    /// A new thread with a fork of another's current state (tracked changes, untracked files,
    /// HEAD) on a branch of its own; the source keeps running untouched. Prints the new path
    Fork(ForkArgs),
    /// Move a thread's work to a new thread: bind it to a project at a ref, or (without
    /// --project) carry the source's state and its small ignored files. Prints the new path
    Teleport(TeleportArgs),
    /// Commit the workspace's changes (all, or under --path) on its current branch through the
    /// gates; print the new commit id
    Commit(CommitArgs),
    /// Push the workspace's branch from the project's mirror through the gates
    Push(PushArgs),
    /// Dependency layers (node_modules, .venv): installed once per host from a project's lockfiles
    /// and presented read-through in its workspaces
    Deps {
        #[command(subcommand)]
        cmd: DepsCmd,
    },
    /// Write the thread's saved state back into its project's folder (a plain-directory
    /// upstream), merged three-way with the folder's own changes; a conflict changes nothing
    Export(ExportArgs),
    /// Bring a workspace to its upstream branch's tip after a mirror sync: a developer's clean
    /// workspace fast-forwards (dirty or ahead: refused, nothing changes); a reviewer's is saved
    /// as a snapshot, then reset to the tip
    Resync(ResyncArgs),
    /// Apply a remote's named snapshot refs/snapshots/<NAME> to the workspace as uncommitted
    /// changes (fast-forward only: HEAD must be its base, local changes are never lost)
    Pull(PullArgs),
    /// Restart the daemon without unmounting: a new daemon process (the binary now installed at
    /// the daemon's path) takes over every mount, its open files and its state; processes in the
    /// mounts notice nothing. If the handover fails, the running daemon goes on serving
    Restart(RestartArgs),
    /// Serve a Kubernetes CSI node plugin on a Unix socket: pods get threads as inline volumes
    /// (docs/kubernetes.md); a client of this node's daemon
    Csi(CsiArgs),
    /// The far side of a transport to a remote a caller named, run as that caller (started by the
    /// daemon's git, not for use by hand; see `git::mirror::far_side`)
    #[command(name = "transport-as", hide = true)]
    TransportAs(TransportAsArgs),
    /// The new daemon of a restart, started by the old one (not for use by hand)
    #[command(hide = true)]
    TakeoverServe(TakeoverServeArgs),
    /// The connection keeper, started by the daemon (not for use by hand)
    #[command(hide = true)]
    FdKeeper,
}

#[derive(Subcommand)]
pub enum DepsCmd {
    /// The layers of the host: key, manager, path, state, size, files, when built, users
    List(DepsListArgs),
    /// Remove the layers no workspace uses and no mirror's default branch needs; prune the store
    Gc(DepsGcArgs),
    /// Build the layers of a project's commit that are missing or failed; print what was built or
    /// why it failed
    Build(DepsBuildArgs),
}

#[derive(Subcommand)]
pub enum MirrorCmd {
    /// Create a project's mirror from a git URL, a git repository path or a plain directory
    Add(MirrorAddArgs),
    /// Show or change who may bind a project (open threads of it); root only
    Access(MirrorAccessArgs),
    /// Fetch (or re-commit a directory upstream) unless synced within the freshness window
    Sync(MirrorSyncArgs),
    /// List mirrors
    List(MirrorListArgs),
    /// Change a project's settings: its share remote
    Set(MirrorSetArgs),
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Seconds within which a synced mirror is not fetched again
    #[arg(long, default_value_t = 0, env = "OCTOFS_FRESHNESS")]
    pub freshness: u64,
    /// Hand reads of open files to the kernel (FUSE passthrough; needs root and Linux >= 6.9)
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "OCTOFS_PASSTHROUGH")]
    pub passthrough: bool,
    /// Sweep timer: release workspaces idle this long (e.g. 30m, 2h; 0 turns the timer off)
    #[arg(long, default_value = "1h", value_parser = parse_duration, env = "OCTOFS_SWEEP_IDLE")]
    pub sweep_idle: u64,
    /// How often the sweep timer runs
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub sweep_every: u64,
    /// Clone and fetch give up after this long without progress (e.g. 300, 5m)
    #[arg(long, default_value = "5m", value_parser = parse_duration, env = "OCTOFS_FETCH_TIMEOUT")]
    pub fetch_timeout: u64,
    /// How mounts receive requests: auto (FUSE over io_uring when the kernel offers it, else
    /// /dev/fuse), uring (or the mount fails), dev (/dev/fuse threads); see docs/transport.md
    #[arg(long, default_value = "auto", env = "OCTOFS_TRANSPORT")]
    pub transport: octofs::fs::uring::Transport,
    /// How mounts serve file I/O: auto (per workspace: no-open while the bases fit in half the
    /// memory, else handles), handles (OPEN/RELEASE, passthrough), or no-open (no request for a
    /// warm open/read/close; no passthrough, page cache per mount); see docs/performance.md
    #[arg(long, default_value = "auto", env = "OCTOFS_IO")]
    pub io: octofs::daemon::io_auto::IoSetting,
    /// The most live threads one user may hold (root is not counted; 0: no cap); see
    /// docs/lifecycle.md "Per-user limits"
    #[arg(long, default_value_t = octofs::daemon::DEFAULT_MAX_THREADS_PER_USER, env = "OCTOFS_MAX_THREADS_PER_USER")]
    pub max_threads_per_user: usize,
    /// The most bytes one user's workspaces may write to their upper layers (e.g. 10G, 512M;
    /// root is not counted; default: no quota); see docs/overlay.md "Quota"
    #[arg(long, value_parser = parse_size, env = "OCTOFS_QUOTA_PER_USER")]
    pub quota_per_user: Option<u64>,
    /// Keep every mount's connection in a keeper process, so that the mounts outlive a crash
    /// of the daemon and the next one adopts them; see docs/restart.md "A crash"
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, env = "OCTOFS_KEEP_CONNECTIONS")]
    pub keep_connections: bool,
    /// Serve the daemon's metrics (Prometheus text format) at http://ADDR/metrics, e.g.
    /// 127.0.0.1:9464 (default: off); see docs/metrics.md
    #[arg(long, value_name = "ADDR", value_parser = octofs::daemon::metrics::parse_addr, env = "OCTOFS_METRICS")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Who may read --metrics besides root and the daemon's user: uid[,uid…] or any (default:
    /// nobody else; a local client's uid is its socket's owner)
    #[arg(
        long,
        value_name = "WHO",
        default_value = "root",
        env = "OCTOFS_METRICS_ALLOW"
    )]
    pub metrics_allow: octofs::daemon::metrics::Allow,
}

#[derive(clap::Args)]
pub struct OpenArgs {
    pub thread: String,
    /// The project the thread is bound to
    #[arg(long)]
    pub project: Option<String>,
    /// Branch, tag, commit or any revision of the mirror to fork at (default: its default branch)
    #[arg(long = "ref")]
    pub git_ref: Option<String>,
    /// This thread's I/O mode, kept across release and resume: handles or no-open (default: as
    /// the thread had it, else the daemon's `serve --io`, auto: chosen per workspace); a
    /// mounted thread keeps its mode
    #[arg(long)]
    pub io: Option<octofs::fs::IoMode>,
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PathArgs {
    pub thread: String,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    pub thread: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct StatsArgs {
    pub thread: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct SnapshotArgs {
    pub thread: String,
    /// Also file it as the named snapshot refs/snapshots/<NAME> of the mirror (a chain: its
    /// second parent is the previous snapshot of that name); prints the named snapshot's id
    #[arg(long)]
    pub name: Option<String>,
    /// Push the named snapshot to this remote (`origin`, a URL or an absolute path) as a
    /// fast-forward; a diverged remote snapshot is refused, never overwritten
    #[arg(long, requires = "name", value_name = "REMOTE")]
    pub push: Option<String>,
}

#[derive(clap::Args)]
pub struct ReleaseArgs {
    pub thread: String,
    /// Release even while processes use the mount (they lose it)
    #[arg(long)]
    pub force: bool,
    /// Drop the workspace without saving it: its unsaved changes are lost (works without a mirror)
    #[arg(long)]
    pub discard: bool,
    /// Return at once; release when the last process has left the mount (`open` cancels it)
    #[arg(long, conflicts_with_all = ["force", "discard"])]
    pub when_idle: bool,
}

#[derive(clap::Args)]
pub struct SweepArgs {
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub idle: u64,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct DiffArgs {
    pub thread: String,
    /// Default: the workspace's base (a released thread: its last snapshot)
    #[arg(long)]
    pub from: Option<String>,
    /// Default: the live state (a released thread: its last snapshot); `saved` names the last snapshot
    #[arg(long)]
    pub to: Option<String>,
    /// Show the patch, not just the changed paths
    #[arg(long, conflicts_with_all = ["stat", "name_status"])]
    pub patch: bool,
    /// Show git's diffstat
    #[arg(long, conflicts_with = "name_status")]
    pub stat: bool,
    /// Show each changed path with its status (the default)
    #[arg(long)]
    pub name_status: bool,
}

#[derive(clap::Args)]
pub struct FsmonitorArgs {
    pub thread: String,
    pub version: Option<String>,
    pub token: Option<String>,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    pub shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub struct ManArgs {
    pub dir: PathBuf,
}

#[derive(clap::Args)]
pub struct WatchArgs {
    pub thread: String,
    /// Start after this token (from an earlier line); default: from now
    #[arg(long)]
    pub since: Option<String>,
}

#[derive(clap::Args)]
pub struct RunArgs {
    pub thread: String,
    /// The project the thread is bound to (as for `open`)
    #[arg(long)]
    pub project: Option<String>,
    /// Revision to fork at when the thread is new (as for `open`)
    #[arg(long = "ref")]
    pub git_ref: Option<String>,
    /// Where the workspace appears inside the sandbox
    #[arg(long, value_name = "PATH", default_value = octofs::run::DEFAULT_AT)]
    pub at: PathBuf,
    /// A host path bound read-only at the same place (a toolchain, a package store); repeatable
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<PathBuf>,
    /// Share the host's network
    #[arg(long)]
    pub net: bool,
    /// KEY=VALUE set inside (after the defaults PATH, HOME=/tmp, TERM, LANG); repeatable
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = octofs::run::parse_env)]
    pub env: Vec<(String, String)>,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<std::ffi::OsString>,
}

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Repair what is safe: unmount stale mounts, remove corrupt derived data, move broken
    /// workspaces to <state>/quarantine (never delete them)
    #[arg(long)]
    pub fix: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ForkArgs {
    pub from: String,
    pub to: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct TeleportArgs {
    pub from: String,
    pub to: String,
    /// Bind the new thread to this project (default: carry the source's state)
    #[arg(long)]
    pub project: Option<String>,
    /// Branch, tag, commit or any revision to start from (with --project)
    #[arg(long = "ref", requires = "project")]
    pub git_ref: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct CommitArgs {
    pub thread: String,
    /// The message (optional only with --mode amend, which then keeps HEAD's)
    #[arg(short = 'm', long = "message", default_value = "")]
    pub message: String,
    /// commit: a new commit on HEAD; fixup: `fixup! <anchor's subject>` on HEAD; amend: replace HEAD
    #[arg(long, value_enum, default_value_t = CommitMode::Commit)]
    pub mode: CommitMode,
    /// The commit a fixup fixes (HEAD or an ancestor; with --mode fixup)
    #[arg(long)]
    pub anchor: Option<String>,
    /// Commit only the changes at or below this path (repeatable)
    #[arg(long = "path")]
    pub paths: Vec<String>,
    /// A gate besides `excludes` (which always runs): secret-names, max-size=BYTES, cmd=PROGRAM
    #[arg(long = "gate")]
    pub gates: Vec<String>,
    /// A command run in the workspace (as its owner) before the commit; it may rewrite files,
    /// which are then committed; a failing hook stops the commit (repeatable, in order)
    #[arg(long = "hook")]
    pub hooks: Vec<String>,
    /// Also run git's own pre-commit, commit-msg and post-commit hooks of the workspace (as its
    /// owner); skipped by default
    #[arg(long)]
    pub git_hooks: bool,
}

#[derive(clap::Args)]
pub struct PushArgs {
    pub thread: String,
    /// A URL, or `origin` (default): the project's upstream
    #[arg(long)]
    pub remote: Option<String>,
    /// The remote branch (default: the workspace's branch)
    #[arg(long)]
    pub branch: Option<String>,
    /// Push only if the remote branch is exactly at this commit (--force-with-lease)
    #[arg(long)]
    pub lease: Option<String>,
    /// A gate besides `excludes` (which always runs): secret-names, max-size=BYTES, cmd=PROGRAM
    #[arg(long = "gate")]
    pub gates: Vec<String>,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    pub thread: String,
    /// List what would change (`A path`, `M path`, `D path`) and change nothing
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct ResyncArgs {
    pub thread: String,
    #[arg(long, value_parser = ["developer", "reviewer"])]
    pub role: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PullArgs {
    pub thread: String,
    /// `origin`, a URL or an absolute path
    #[arg(long)]
    pub remote: String,
    #[arg(long)]
    pub name: String,
    /// Pull over local changes: they are saved in a snapshot first (its id is printed)
    #[arg(long)]
    pub force: bool,
}

#[derive(clap::Args)]
pub struct RestartArgs {
    /// Start the new daemon from this binary instead of the one at the daemon's path
    #[arg(long)]
    pub exe: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct CsiArgs {
    /// The socket kubelet calls: unix:///ABSOLUTE/PATH
    #[arg(long, env = "CSI_ENDPOINT")]
    pub endpoint: String,
    /// This node's id (default: the host name; in a DaemonSet, the node name)
    #[arg(long, env = "OCTOFS_NODE_ID")]
    pub node_id: Option<String>,
    /// Where the plugin records its publications
    #[arg(long, default_value = "/var/lib/octofs-csi")]
    pub plugin_dir: PathBuf,
    /// The lowest uid a pod may ask for (the `uid` attribute); 0 would let pods ask for root
    #[arg(long, default_value_t = 1000)]
    pub min_uid: u32,
}

#[derive(clap::Args)]
pub struct TransportAsArgs {
    #[arg(long)]
    pub uid: Option<u32>,
    #[arg(long)]
    pub gid: Option<u32>,
    /// Supplementary groups, comma-separated
    #[arg(long, default_value = "")]
    pub groups: String,
    /// A directory no repository of the far side may be in
    #[arg(long)]
    pub deny: Vec<PathBuf>,
    /// upload-pack, receive-pack or ssh
    pub program: String,
    /// What git appends: the repository path, or ssh's arguments
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<std::ffi::OsString>,
}

#[derive(clap::Args)]
pub struct TakeoverServeArgs {
    /// The old daemon's takeover socket
    #[arg(long)]
    pub from: PathBuf,
}

#[derive(clap::Args)]
pub struct DepsListArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct DepsGcArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct DepsBuildArgs {
    pub project: String,
    /// Branch, tag or commit of the mirror (default: its default branch)
    #[arg(long = "ref")]
    pub git_ref: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct MirrorAddArgs {
    pub project: String,
    pub upstream: String,
    /// A file holding the http(s) upstream's credentials (a token, or user:token), copied into
    /// the daemon's private state; keeps them off the command line
    #[arg(long, value_name = "FILE")]
    pub credential_file: Option<PathBuf>,
    #[command(flatten)]
    pub allow: AllowArgs,
    /// A share remote (a URL or a bare repository's path): every snapshot of the project's
    /// threads is also pushed to its refs/octomate/threads/<thread>, and `open` resumes from it
    #[arg(long, value_name = "REMOTE")]
    pub share: Option<String>,
}

#[derive(clap::Args)]
pub struct MirrorAccessArgs {
    pub project: String,
    #[command(flatten)]
    pub allow: AllowArgs,
    /// Let any local user bind it again
    #[arg(long, conflicts_with_all = ["allow_user", "allow_group"])]
    pub anyone: bool,
}

#[derive(clap::Args)]
pub struct MirrorSyncArgs {
    pub project: String,
}

#[derive(clap::Args)]
pub struct MirrorListArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct MirrorSetArgs {
    pub project: String,
    /// The share remote (a URL or a bare repository's path)
    #[arg(long, value_name = "REMOTE")]
    pub share: Option<String>,
    /// Stop sharing the project's threads
    #[arg(long, conflicts_with = "share")]
    pub no_share: bool,
    /// A gitignore-style pattern whose paths are never committed or pushed from the project's
    /// workspaces, even where a branch tracks them (repeatable; replaces the project's list)
    #[arg(long = "exclude", value_name = "PATTERN")]
    pub excludes: Vec<String>,
    /// Clear the project's excludes
    #[arg(long, conflicts_with = "excludes")]
    pub no_excludes: bool,
}

/// Who may bind a project; without any, every local user may.
#[derive(clap::Args)]
pub struct AllowArgs {
    /// A user (name or uid) allowed to bind the project (repeatable)
    #[arg(long = "allow-user", value_name = "USER")]
    pub allow_user: Vec<String>,
    /// A group (name or gid) whose members may bind the project (repeatable)
    #[arg(long = "allow-group", value_name = "GROUP")]
    pub allow_group: Vec<String>,
}

impl AllowArgs {
    pub fn is_empty(&self) -> bool {
        self.allow_user.is_empty() && self.allow_group.is_empty()
    }

    /// Resolves names to ids here, where the caller's user database is.
    pub fn resolve(&self) -> Result<Access, String> {
        let user = |u: &String| match u.parse::<u32>() {
            Ok(id) => Ok(id),
            Err(_) => match octofs::sys::user_by_name(u) {
                Ok(Some((uid, _))) => Ok(uid),
                Ok(None) => Err(format!("no such user {u:?}")),
                Err(e) => Err(format!("cannot look up user {u:?}: {e}")),
            },
        };
        let group = |g: &String| match g.parse::<u32>() {
            Ok(id) => Ok(id),
            Err(_) => match octofs::sys::group_by_name(g) {
                Ok(Some(gid)) => Ok(gid),
                Ok(None) => Err(format!("no such group {g:?}")),
                Err(e) => Err(format!("cannot look up group {g:?}: {e}")),
            },
        };
        Ok(Access {
            users: self.allow_user.iter().map(user).collect::<Result<_, _>>()?,
            groups: self
                .allow_group
                .iter()
                .map(group)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A duration: plain seconds, or a number with s, m, h or d.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use e.g. 90s, 30m, 2h, 1d)"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("bad duration {s:?} (use e.g. 90s, 30m, 2h, 1d)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

/// A size: bytes, or with a binary unit `K`, `M`, `G`, `T` (`10G` is 10 GiB; `B`/`iB` may follow).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("bad size {s:?} (use e.g. 4096, 512M, 10G)");
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let shift = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// An upstream as the daemon must see it: a path is made absolute against the caller's working
/// directory (the daemon's is another); a URL is sent as given. Refused up front: anything git could
/// read as an option.
pub fn resolve_upstream(upstream: &str) -> Result<String, String> {
    if upstream.starts_with('-') {
        // The daemon refuses it too; checked here so that it is not made a path below.
        return octofs::proto::check_upstream(upstream).map(|()| upstream.to_string());
    }
    if upstream.is_empty() || octofs::proto::is_url(upstream) || upstream.contains("::") {
        return Ok(upstream.to_string());
    }
    // Canonical when it exists; a missing path is left for the daemon to report.
    std::fs::canonicalize(upstream)
        .or_else(|_| std::path::absolute(upstream))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("upstream {upstream}: {e}"))
}

/// A remote to push to or pull from: `origin` (the project's upstream) as it is, a path made
/// absolute, a URL as given.
pub fn resolve_remote(remote: &str) -> Result<String, String> {
    if remote == "origin" {
        return Ok(remote.to_string());
    }
    resolve_upstream(remote)
}

impl Cmd {
    /// The daemon and the plugins, which keep running when a reader of their output goes away
    /// (every other command dies of SIGPIPE, as a command line tool does).
    pub fn is_service(&self) -> bool {
        matches!(
            self,
            Cmd::Serve(_) | Cmd::TakeoverServe(_) | Cmd::FdKeeper | Cmd::Csi(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("30m"), Ok(1800));
        assert_eq!(parse_duration("2h"), Ok(7200));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
