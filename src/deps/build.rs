//! Building a layer: the key of a lockfile, the staging directory filled from a mirror's commit,
//! the package manager run there (cleared environment, timeout, output to the layer's log), the
//! check that nothing installed names the staging path, and the record of the result.
//!
//! Owns `<state>/deps/staging/<key>`, `<state>/deps/logs/<key>.log`, `<state>/deps/locks/<key>.lock`
//! and the records it writes. It reads the mirror only through its object store (never a mirror's
//! working tree, never a workspace) and runs nothing inside a mount; sealing is `seal`.

use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::error::{Error, FsOp, fs};
use super::sandbox::{self, BuildDirs, Sandbox};
use super::{
    DepLayer, DepStore, LayerRecord, LayerState, Lockfile, Manager, NestedTree, detect, seal, vet,
};
use crate::git::objects::{EntryKind, ObjectStore};

/// How long one manager command may run before it is killed (`OCTOFS_DEPS_TIMEOUT`, seconds,
/// overrides it).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The timeout of one manager command: `OCTOFS_DEPS_TIMEOUT` seconds, else [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Duration {
    std::env::var("OCTOFS_DEPS_TIMEOUT")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_TIMEOUT)
}

/// One lockfile of a commit, with the key of the layer it makes on this host.
#[derive(Debug, Clone)]
pub struct Plan {
    pub lock: Lockfile,
    /// The manager's version as it printed it, or why it could not be asked.
    pub version: Result<String, String>,
    pub key: String,
}

impl Plan {
    /// `npm layer for package-lock.json`: how progress lines name it.
    pub fn describe(&self) -> String {
        format!("{} layer for {}", self.lock.manager.name(), self.lock.name)
    }
}

/// What one build (or the check that made it unnecessary) came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub key: String,
    pub manager: Manager,
    /// The lockfile's name at the commit's root.
    pub lockfile: String,
    /// Where the layer is presented in a workspace.
    pub path: String,
    /// Milliseconds the build took (0 when nothing was built).
    pub ms: u64,
    #[serde(flatten)]
    pub result: OutcomeKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "kebab-case")]
pub enum OutcomeKind {
    /// Built now.
    Built {
        tree: String,
        bytes: u64,
        files: u64,
    },
    /// Built before: nothing was run.
    UpToDate {
        tree: String,
        bytes: u64,
        files: u64,
    },
    /// The build failed: `message` is one line, the whole output is in `log`.
    Failed { message: String, log: PathBuf },
}

/// One step of a build, as `deps progress` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressEvent {
    /// Increases by one per event of this daemon.
    pub seq: u64,
    pub project: String,
    /// `npm layer for package-lock.json`.
    pub what: String,
    /// Set when the build is over; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
}

/// The answer to `deps progress`: the events after the one asked for, and the last one's number.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressAnswer {
    pub last: u64,
    pub events: Vec<ProgressEvent>,
}

/// The answer to `deps build`: one outcome per lockfile of the commit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildAnswer {
    pub project: String,
    pub commit: String,
    pub outcomes: Vec<Outcome>,
}

/// The `node_modules` directories an install made inside the project besides the root's
/// (workspace packages' own: pnpm links each package's dependencies there; npm puts there what it
/// cannot hoist), relative to `staging`, sorted. Never looks into a `node_modules`, `.venv` or
/// `.git`.
fn nested_installs(staging: &Path) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    let mut stack = vec![(staging.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(fs(FsOp::Read, &dir))?;
        for entry in rd {
            let entry = entry.map_err(fs(FsOp::Read, &dir))?;
            let ft = entry.file_type().map_err(fs(FsOp::Stat, &entry.path()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !ft.is_dir() || SKIPPED_DIRS.contains(&name.as_str()) && rel.is_empty() {
                continue;
            }
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if name == "node_modules" {
                out.push(path);
            } else if !SKIPPED_DIRS.contains(&name.as_str()) {
                stack.push((entry.path(), path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One line for a finished build: what it did and how long it took.
impl Outcome {
    pub fn describe(&self) -> String {
        let o = self;
        let secs = o.ms as f64 / 1000.0;
        let what = format!("{} layer for {}", o.manager.name(), o.lockfile);
        match &o.result {
            OutcomeKind::Built { bytes, files, .. } => format!(
                "{what}: built in {secs:.1} s ({files} files, {:.1} MiB)",
                *bytes as f64 / (1 << 20) as f64
            ),
            OutcomeKind::UpToDate { files, bytes, .. } => format!(
                "{what}: up to date ({files} files, {:.1} MiB)",
                *bytes as f64 / (1 << 20) as f64
            ),
            OutcomeKind::Failed { message, log } => format!(
                "{what}: failed after {secs:.1} s: {message} (see {})",
                log.display()
            ),
        }
    }
}

/// The major version a layer is keyed by: the first number, or `0.<minor>` for a 0.x release
/// (where the minor number is the one that breaks).
pub fn major(version: &str) -> String {
    let v = version.trim().trim_start_matches('v');
    let mut parts = v.split('.');
    let first = parts.next().unwrap_or("");
    if first == "0" {
        format!("0.{}", parts.next().unwrap_or(""))
    } else {
        first.to_string()
    }
}

/// The layer key: hex blake3 over the manager's name, its major version and the lockfile's bytes.
pub fn layer_key(manager: Manager, major: &str, lockfile: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(manager.name().as_bytes());
    h.update(b"\0");
    h.update(major.as_bytes());
    h.update(b"\0");
    h.update(lockfile);
    h.finalize().to_hex().to_string()
}

/// A probe of a manager (`--version`, `--help`): as the build user, in a sandbox that may write
/// nothing.
fn probe(program: &str) -> Result<Command, Error> {
    sandbox::Sandbox {
        id: sandbox::identity(),
        state: PathBuf::new(),
        dirs: None,
    }
    .command(program, Path::new("/"))
}

/// Why a manager the daemon finds on its `PATH` cannot be started by the build user: it lies in a
/// place only the daemon's user reaches (a pyenv shim or nvm tree under `/root`).
fn unreachable_manager(name: &str) -> Error {
    Error::Unreachable {
        program: name.to_string(),
        uid: sandbox::identity().uid,
    }
}

/// The manager's version, as `<manager> --version` prints it (`uv 0.9.1 (...)` gives `0.9.1`).
pub fn manager_version(manager: Manager) -> Result<String, Error> {
    let name = manager.name();
    let out = probe(name)?
        .arg("--version")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotInstalled {
                program: name.to_string(),
            },
            _ if e.raw_os_error() == Some(libc::EACCES) => unreachable_manager(name),
            _ => Error::Run {
                what: format!("{name} --version"),
                source: e,
            },
        })?;
    if !out.status.success() {
        return Err(Error::VersionFailed {
            program: name.to_string(),
            status: out.status,
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .map(str::to_string)
        .ok_or_else(|| Error::NoVersion {
            program: name.to_string(),
            output: text.trim().to_string(),
        })
}

/// The lockfiles of `tree` and the keys of their layers on this host (asks each manager its
/// version once).
pub fn plan(store: &ObjectStore, tree: gix::ObjectId) -> std::io::Result<Vec<Plan>> {
    let mut plans = Vec::new();
    for lock in detect(store, tree)? {
        let bytes = lock.key_input.clone();
        let version = manager_version(lock.manager).map_err(|e| e.to_string());
        let key = match &version {
            Ok(v) => layer_key(lock.manager, &major(v), &bytes),
            // Keyed as "no manager": a later build with the manager present is another key.
            Err(_) => layer_key(lock.manager, "none", &bytes),
        };
        plans.push(Plan { lock, version, key });
    }
    Ok(plans)
}

/// The files a manager needs to install, by name, wherever they are in the tree (workspace
/// packages included). Not `.npmrc` nor `.pnpmfile.cjs`: the project's content can reach the
/// default branch through `octofs push`, so it is an agent's to write, and those files can name
/// programs the manager runs (`git=`, `script-shell=`, pnpm's hooks) — with the daemon's rights.
fn manifests(manager: Manager) -> &'static [&'static str] {
    match manager {
        Manager::Npm | Manager::Pnpm => &[
            "package.json",
            "package-lock.json",
            "npm-shrinkwrap.json",
            "pnpm-lock.yaml",
            "pnpm-workspace.yaml",
        ],
        Manager::Uv => &["pyproject.toml", ".python-version", "uv.lock"],
    }
}

/// Directories never looked into for manifests.
const SKIPPED_DIRS: [&str; 3] = ["node_modules", ".venv", ".git"];

/// Writes the manifests of `tree` (the commit's root tree) under `dir`.
fn stage(
    store: &ObjectStore,
    tree: gix::ObjectId,
    manager: Manager,
    dir: &Path,
) -> Result<u64, Error> {
    let wanted = manifests(manager);
    let mut written = 0;
    let mut stack = vec![(tree, dir.to_path_buf())];
    while let Some((t, at)) = stack.pop() {
        let entries = store
            .tree(t)
            .map_err(|source| Error::Tree { tree: t, source })?;
        for e in entries.iter() {
            let Ok(name) = std::str::from_utf8(&e.name) else {
                continue;
            };
            match e.kind {
                EntryKind::Tree if !SKIPPED_DIRS.contains(&name) => {
                    stack.push((e.id, at.join(name)));
                }
                EntryKind::Blob | EntryKind::Executable if wanted.contains(&name) => {
                    let bytes = store.blob(e.id).map_err(|source| Error::Blob {
                        name: name.to_string(),
                        source,
                    })?;
                    std::fs::create_dir_all(&at).map_err(fs(FsOp::Create, &at))?;
                    let path = at.join(name);
                    std::fs::write(&path, bytes).map_err(fs(FsOp::Write, &path))?;
                    written += 1;
                }
                _ => {}
            }
        }
    }
    Ok(written)
}

/// One command of an install: its argv and the variables it gets besides the cleared environment.
type Step = (Vec<String>, Vec<(&'static str, &'static str)>);

/// The commands that install `manager`'s tree in the staging directory. No package code runs: a
/// lockfile is content an agent can push, so install scripts are not run (`--ignore-scripts`) and
/// uv installs wheels only (`--no-build`); a package that needs them fails the build, with the
/// manager's message, and the workspace is handed over without the layer. Where things go is the
/// daemon's choice, never the project's: pnpm's store, virtual store and modules directory are
/// given on the command line, over whatever `pnpm-workspace.yaml` says (npm's and uv's caches are
/// set in the environment, `sandbox::manager_env`, and no `.npmrc` of the project is staged).
fn install_commands(manager: Manager, dirs: &BuildDirs) -> Vec<Step> {
    let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    match manager {
        Manager::Npm => vec![(
            argv(&[
                "npm",
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
            ]),
            vec![],
        )],
        Manager::Pnpm => {
            let mut a = argv(&[
                "pnpm",
                "install",
                "--frozen-lockfile",
                "--ignore-scripts",
                "--ignore-pnpmfile",
                "--modules-dir",
                "node_modules",
                "--virtual-store-dir",
                "node_modules/.pnpm",
                "--store-dir",
            ]);
            // `pnpm/store`, not `pnpm`: pnpm keeps its store operation locks beside the store, in
            // a directory the build user must be able to create.
            a.push(dirs.cache.join("pnpm/store").to_string_lossy().into_owned());
            vec![(a, vec![])]
        }
        Manager::Uv => {
            let env = vec![("UV_PYTHON_DOWNLOADS", "never")];
            let mut sync = argv(&[
                "uv",
                "sync",
                "--frozen",
                "--no-install-project",
                "--no-build",
            ]);
            if uv_has_flag("--no-install-workspace") {
                sync.push("--no-install-workspace".to_string());
            }
            vec![
                (argv(&["uv", "venv", "--relocatable", ".venv"]), env.clone()),
                (sync, env),
            ]
        }
    }
}

/// Whether this host's `uv sync` takes `flag`.
fn uv_has_flag(flag: &str) -> bool {
    probe("uv")
        .ok()
        .and_then(|mut c| {
            c.args(["sync", "--help"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .output()
                .ok()
        })
        .is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

/// Runs one command in `dir`, in `sandbox`, with its output appended to `log`; kills its process
/// group after `timeout`.
fn run_logged(
    argv: &[String],
    env: &[(&str, &str)],
    sandbox: &Sandbox,
    dir: &Path,
    log: &std::fs::File,
    timeout: Duration,
) -> Result<(), Error> {
    let out = log.try_clone().map_err(Error::Log)?;
    let err = log.try_clone().map_err(Error::Log)?;
    let mut child = sandbox
        .command(&argv[0], dir)?
        .args(&argv[1..])
        .envs(env.iter().copied())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotInstalled {
                program: argv[0].clone(),
            },
            _ if e.raw_os_error() == Some(libc::EACCES) => unreachable_manager(&argv[0]),
            _ => Error::Run {
                what: argv[0].clone(),
                source: e,
            },
        })?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                return Err(Error::Failed {
                    argv: argv.to_vec(),
                    status,
                });
            }
            Ok(None) if Instant::now() >= deadline => {
                let _ = crate::sys::kill_process_group(child.id());
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::TimedOut {
                    argv: argv.to_vec(),
                    secs: timeout.as_secs(),
                });
            }
            // The `mirror add`/`mirror sync` that runs this build was cancelled (Ctrl-C).
            Ok(None) if crate::git::mirror::cancelled() => {
                let _ = crate::sys::kill_process_group(child.id());
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Cancelled {
                    argv: argv.to_vec(),
                });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(source) => {
                return Err(Error::Wait {
                    program: argv[0].clone(),
                    source,
                });
            }
        }
    }
}

/// The one line that says why a manager failed: the first line of its output that reports an
/// error and says more than a code, else its last non-blank line.
pub fn failure_line(output: &str) -> Option<String> {
    let noise = |l: &str| {
        let t = l.trim();
        t.is_empty()
            || t.contains("A complete log of this run")
            || t.starts_with("npm error code ")
            || t.split_whitespace().count() <= 3
    };
    let clean = |l: &str| {
        let t = l.trim();
        let t = t.strip_prefix("npm error ").unwrap_or(t);
        let t: String = t.chars().take(300).collect();
        t
    };
    output
        .lines()
        .find(|l| l.to_ascii_lowercase().contains("err") && !noise(l))
        .or_else(|| output.lines().rev().find(|l| !l.trim().is_empty()))
        .map(clean)
}

/// Unix seconds now.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The exclusive lock of one key's build (`<state>/deps/locks/<key>.lock`), held until dropped.
pub fn key_lock(deps: &DepStore, key: &str) -> std::io::Result<std::fs::File> {
    let dir = deps.dir().join("locks");
    crate::layout::create_private_dir(&dir)?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(dir.join(format!("{key}.lock")))?;
    f.lock()?;
    Ok(f)
}

/// Where a layer of `manager` is presented.
pub fn install_path(manager: Manager) -> &'static str {
    match manager {
        Manager::Npm | Manager::Pnpm => "node_modules",
        Manager::Uv => ".venv",
    }
}

/// What the record of a built layer says, as an outcome that built nothing.
fn up_to_date(plan: &Plan, rec: &LayerRecord) -> Option<Outcome> {
    match &rec.state {
        LayerState::Built {
            layer,
            bytes,
            files,
        } => Some(Outcome {
            key: plan.key.clone(),
            manager: plan.lock.manager,
            lockfile: plan.lock.name.to_string(),
            path: layer.path.clone(),
            ms: 0,
            result: OutcomeKind::UpToDate {
                tree: layer.tree.to_string(),
                bytes: *bytes,
                files: *files,
            },
        }),
        LayerState::Failed { .. } => None,
    }
}

/// Whether `plan`'s layer is built already (its record says so).
pub fn is_built(deps: &DepStore, plan: &Plan) -> bool {
    deps.load(&plan.key)
        .is_some_and(|r| matches!(r.state, LayerState::Built { .. }))
}

/// Builds `plan`'s layer from `tree` (the root tree of a commit of the mirror behind `store`),
/// unless it is built already; `what` names the commit in the log. Waits for a build of the same
/// key that is under way (then reports its result). Never fails: a failure is a `Failed` record
/// and outcome.
pub fn build(
    deps: &DepStore,
    store: &ObjectStore,
    tree: gix::ObjectId,
    plan: &Plan,
    what: &str,
    timeout: Duration,
) -> Outcome {
    let started = Instant::now();
    let manager = plan.lock.manager;
    let path = plan.lock.install_path.to_string();
    let log_path = deps.log(&plan.key);
    let failed = |message: String, started: Instant| Outcome {
        key: plan.key.clone(),
        manager,
        lockfile: plan.lock.name.to_string(),
        path: path.clone(),
        ms: started.elapsed().as_millis() as u64,
        result: OutcomeKind::Failed {
            message,
            log: deps.log(&plan.key),
        },
    };
    let prepared = (|| {
        for d in [
            deps.records(),
            deps.dir().join("logs"),
            deps.dir().join("staging"),
        ] {
            crate::layout::create_private_dir(&d).map_err(fs(FsOp::Create, &d))?;
        }
        key_lock(deps, &plan.key).map_err(|source| Error::KeyLock {
            key: plan.key.clone(),
            source,
        })
    })();
    let _lock = match prepared {
        Ok(l) => l,
        Err(e) => return failed(e.to_string(), started),
    };
    // Another build of this key may have finished while this one waited for the lock.
    if let Some(done) = deps.load(&plan.key).and_then(|r| up_to_date(plan, &r)) {
        return done;
    }
    let result = build_locked(deps, store, tree, plan, what, timeout);
    let version = plan.version.clone().unwrap_or_default();
    let (state, outcome) = match result {
        Ok((tree, nested, bytes, files)) => (
            LayerState::Built {
                layer: DepLayer {
                    key: plan.key.clone(),
                    manager,
                    path: path.clone(),
                    tree,
                    lockfile_hash: plan.lock.hash.clone(),
                    nested,
                },
                bytes,
                files,
            },
            Outcome {
                key: plan.key.clone(),
                manager,
                lockfile: plan.lock.name.to_string(),
                path: path.clone(),
                ms: started.elapsed().as_millis() as u64,
                result: OutcomeKind::Built {
                    tree: tree.to_string(),
                    bytes,
                    files,
                },
            },
        ),
        Err(e) => {
            let message = e.to_string();
            let _ = append(&log_path, &format!("octofs: build failed: {message}\n"));
            (
                LayerState::Failed {
                    message: message.clone(),
                    log: log_path.clone(),
                },
                failed(message, started),
            )
        }
    };
    let record = LayerRecord {
        key: plan.key.clone(),
        manager,
        manager_version: version,
        built_at: now(),
        state,
    };
    match serde_json::to_vec_pretty(&record) {
        Ok(bytes) => {
            if let Err(e) = crate::records::write_atomic(&deps.record(&plan.key), &bytes) {
                return failed(format!("cannot write the layer's record: {e}"), started);
            }
        }
        Err(e) => return failed(format!("cannot encode the layer's record: {e}"), started),
    }
    outcome
}

fn append(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)?
        .write_all(text.as_bytes())
}

/// The build proper, under the key's lock: stage, install, check, seal. Returns the sealed tree,
/// the content's bytes and its file count, or the one-line reason it failed. The staging directory
/// is gone afterwards either way.
fn build_locked(
    deps: &DepStore,
    store: &ObjectStore,
    tree: gix::ObjectId,
    plan: &Plan,
    what: &str,
    timeout: Duration,
) -> Result<(gix::ObjectId, Vec<NestedTree>, u64, u64), Error> {
    let manager = plan.lock.manager;
    let log_path = deps.log(&plan.key);
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .read(true)
        .truncate(true)
        .mode(crate::layout::PRIVATE_FILE_MODE)
        .open(&log_path)
        .map_err(fs(FsOp::Create, &log_path))?;
    let _ = writeln!(
        log,
        "octofs: {} layer {} for {} of {what} (manager {})",
        manager.name(),
        plan.key,
        plan.lock.name,
        plan.version.as_deref().unwrap_or("missing")
    );
    plan.version
        .as_ref()
        .map_err(|why| Error::NoManager(why.clone()))?;
    let staging = deps.staging(&plan.key);
    let dirs = BuildDirs::of(deps, &plan.key);
    dirs.remove();
    crate::layout::create_private_dir(&staging).map_err(fs(FsOp::Create, &staging))?;
    let result = (|| {
        let n = stage(store, tree, manager, &staging)?;
        let _ = writeln!(
            log,
            "octofs: staged {n} manifest file(s) in {}",
            staging.display()
        );
        // Before anything runs: a dependency that is not a registry package is refused.
        vet::check(manager, &staging)?;
        let id = sandbox::identity();
        dirs.hand_over(deps, id)?;
        let _ = writeln!(
            log,
            "octofs: running as uid {} gid {} in the build sandbox",
            id.uid, id.gid
        );
        let sandbox = Sandbox {
            id,
            state: deps.dir().parent().unwrap_or(deps.dir()).to_path_buf(),
            dirs: Some(dirs.clone()),
        };
        for (argv, env) in install_commands(manager, &dirs) {
            let _ = writeln!(log, "$ {}", argv.join(" "));
            let start = log.stream_position().unwrap_or(0);
            if let Err(e) = run_logged(&argv, &env, &sandbox, &staging, &log, timeout) {
                // The manager's own words, when it said why.
                let mut out = String::new();
                let _ = log.seek(std::io::SeekFrom::Start(start));
                let _ = (&log).take(4 << 20).read_to_string(&mut out);
                let _ = log.seek(std::io::SeekFrom::End(0));
                return Err(match failure_line(&out) {
                    Some(line) if !matches!(e, Error::TimedOut { .. }) => Error::Manager(line),
                    _ => e,
                });
            }
            let _ = log.seek(std::io::SeekFrom::End(0));
        }
        let install = staging.join(plan.lock.install_path);
        if !install.is_dir() {
            return Err(Error::NoInstall {
                manager: manager.name(),
                path: plan.lock.install_path,
            });
        }
        let mut paths = vec![plan.lock.install_path.to_string()];
        if manager != Manager::Uv {
            paths.extend(nested_installs(&staging)?);
        }
        let (mut bytes, mut files) = (0, 0);
        for p in &paths {
            let install = staging.join(p);
            seal::prepare(manager, &install)?;
            let (b, f) = seal::check_unbound(&install, &staging)?;
            bytes += b;
            files += f;
        }
        let trees = seal::seal(deps, &staging, &paths, &plan.key)?;
        for (p, tree) in paths.iter().zip(&trees) {
            let _ = writeln!(log, "octofs: sealed {p} as tree {tree}");
        }
        let _ = writeln!(log, "octofs: sealed {files} files, {bytes} bytes");
        let mut all = paths.into_iter().zip(trees);
        let (_, tree) = all.next().ok_or(Error::NothingSealed)?;
        let nested = all.map(|(path, tree)| NestedTree { path, tree }).collect();
        Ok((tree, nested, bytes, files))
    })();
    dirs.remove();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majors_and_keys() {
        assert_eq!(major("11.19.1"), "11");
        assert_eq!(major("0.13.9"), "0.13");
        assert_eq!(major("v20.1.0"), "20");
        let a = layer_key(Manager::Npm, "11", b"{}");
        assert_ne!(a, layer_key(Manager::Npm, "10", b"{}"));
        assert_ne!(a, layer_key(Manager::Pnpm, "11", b"{}"));
        assert_ne!(a, layer_key(Manager::Npm, "11", b"{ }"));
        assert_eq!(a.len(), 64);
    }

    /// pnpm's store, virtual store and modules directory are the daemon's, whatever the project's
    /// `pnpm-workspace.yaml` sets: given on the command line, which wins over it.
    #[test]
    fn pnpm_is_told_where_things_go() {
        let dirs = BuildDirs {
            staging: PathBuf::from("/s/deps/staging/k"),
            home: PathBuf::from("/s/deps/staging/home-k"),
            cache: PathBuf::from("/s/deps/cache"),
        };
        let steps = install_commands(Manager::Pnpm, &dirs);
        let argv = steps[0].0.join(" ");
        for want in [
            "--modules-dir node_modules",
            "--virtual-store-dir node_modules/.pnpm",
            "--store-dir /s/deps/cache/pnpm/store",
            "--ignore-scripts",
            "--ignore-pnpmfile",
        ] {
            assert!(argv.contains(want), "{want} missing: {argv}");
        }
    }

    #[test]
    fn the_failure_line_is_the_managers_reason() {
        let npm = "npm error code E404\nnpm error 404 Not Found - GET https://r/x.tgz\nnpm error 404\n\
                   npm error A complete log of this run can be found in: /root/.npm/_logs/x.log\n";
        assert_eq!(
            failure_line(npm).as_deref(),
            Some("404 Not Found - GET https://r/x.tgz")
        );
        let uv =
            "Using CPython 3.11\nerror: Failed to fetch: `https://x/y.whl`\n  Caused by: 404\n";
        assert_eq!(
            failure_line(uv).as_deref(),
            Some("error: Failed to fetch: `https://x/y.whl`")
        );
        assert_eq!(
            failure_line("first\nlast words\n\n").as_deref(),
            Some("last words")
        );
        assert_eq!(failure_line(""), None);
    }
}
