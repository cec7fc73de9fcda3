//! The build identity and sandbox of the package managers that build dependency layers
//! (docs/deps.md "Build identity and sandbox"). A lockfile and its manifests are content an agent
//! can push, and the manager interprets them: it runs with no authority it does not need
//! (docs/security.md, privilege separation). Every manager process runs as the build user
//! (`octofs-build`, else `OCTOFS_BUILD_UID`, else uid/gid 65533), with no supplementary groups,
//! an empty private HOME, `PR_SET_NO_NEW_PRIVS` and a Landlock domain that lets it write only its
//! staging directory, its HOME and the daemon's package caches, read and run the system's
//! programs and libraries, read `/etc`, `/proc` and `/sys`, and nothing else (not `/root`, not
//! `/home`, not the rest of `<state>`). The network stays open: registries are on it.
//!
//! Owns `<state>/deps/cache/` (npm's cache, pnpm's store, uv's cache, owned by the build user),
//! the per-build `<state>/deps/staging/home-<key>`, and the ACL entries that let the build user
//! search `<state>/deps`, `<state>/deps/staging` and `<state>/deps/cache` (search only: it can list
//! none of them, and every other directory of the state stays 0700 root). The privilege drop itself
//! is `sys::drop_privileges_on_exec`.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::DepStore;
use super::error::{Error, FsOp, fs};

/// The system user package managers run as, when it exists (scripts/install creates it).
pub const BUILD_USER: &str = "octofs-build";
/// The uid and gid of the build identity on a host without [`BUILD_USER`] and without
/// `OCTOFS_BUILD_UID`: one below `nobody`'s 65534, which no distribution assigns.
pub const FALLBACK_ID: u32 = 65533;

/// Who package managers run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
}

/// The build identity: `OCTOFS_BUILD_UID` (uid and gid, never 0) when set, else the
/// [`BUILD_USER`] account, else [`FALLBACK_ID`].
pub fn identity() -> Identity {
    if let Some(id) = std::env::var("OCTOFS_BUILD_UID")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .filter(|id| *id != 0)
    {
        return Identity { uid: id, gid: id };
    }
    match crate::sys::user_by_name(BUILD_USER) {
        Ok(Some((uid, gid))) if uid != 0 && gid != 0 => Identity { uid, gid },
        _ => Identity {
            uid: FALLBACK_ID,
            gid: FALLBACK_ID,
        },
    }
}

/// The directories of one build that the manager may write.
#[derive(Debug, Clone)]
pub struct BuildDirs {
    /// The project's manifests; the manager's working directory and where it installs.
    pub staging: PathBuf,
    /// Its HOME (empty at the start; `tmp/` in it is its TMPDIR).
    pub home: PathBuf,
    /// `<state>/deps/cache`: `npm/` (npm's cache), `pnpm/` (pnpm's store), `uv/` (uv's cache).
    pub cache: PathBuf,
}

impl BuildDirs {
    /// The directories of the build of `key` (nothing is created).
    pub fn of(deps: &DepStore, key: &str) -> BuildDirs {
        BuildDirs {
            staging: deps.staging(key),
            home: deps.dir().join("staging").join(format!("home-{key}")),
            cache: deps.dir().join("cache"),
        }
    }

    /// Every directory the manager of a build as `id` may write.
    pub fn writable(&self, id: Identity) -> Vec<PathBuf> {
        let mut v = vec![self.staging.clone(), self.home.clone()];
        v.extend(CACHES.iter().map(|c| self.cache.join(c)));
        v.push(pnpm_locks(id));
        v
    }

    /// Lets `id` reach and own this build's directories: search on `<state>/deps`, its `staging`
    /// and `cache` (ACL entries, nothing listable), the caches and the fresh HOME owned by `id`,
    /// and the staged tree (written by the daemon) handed over to it. Then checks, as `id`, that
    /// it can reach the staging directory: a state directory below a path `id` may not search
    /// fails here, with the reason, not inside the manager.
    pub fn hand_over(&self, deps: &DepStore, id: Identity) -> Result<(), Error> {
        let fail = |what: &Path, e: std::io::Error| fs(FsOp::Prepare, what)(e);
        let staging_root = deps.dir().join("staging");
        for d in [&staging_root, &self.cache] {
            crate::layout::create_private_dir(d).map_err(|e| fail(d, e))?;
        }
        for d in [deps.dir(), staging_root.as_path(), self.cache.as_path()] {
            crate::access::grant_search(d, id.uid).map_err(|e| fail(d, e))?;
        }
        for c in CACHES {
            let d = self.cache.join(c);
            crate::layout::create_private_dir(&d).map_err(|e| fail(&d, e))?;
            own(&d, id).map_err(|e| fail(&d, e))?;
        }
        prepare_pnpm_locks(id)?;
        let _ = std::fs::remove_dir_all(&self.home);
        crate::layout::create_private_dir(&self.home.join("tmp"))
            .map_err(|e| fail(&self.home, e))?;
        own_tree(&self.home, id).map_err(|e| fail(&self.home, e))?;
        own_tree(&self.staging, id).map_err(|e| fail(&self.staging, e))?;
        match crate::sys::as_fs_user(id.uid, id.gid, || std::fs::read_dir(&self.staging)) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) | Err(source) => Err(Error::Unsearchable {
                uid: id.uid,
                dir: self.staging.clone(),
                source,
            }),
        }
    }

    /// Removes this build's staging directory and HOME.
    pub fn remove(&self) {
        for d in [&self.staging, &self.home] {
            if let Err(e) = std::fs::remove_dir_all(d)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("cannot remove {}: {e}", d.display());
            }
        }
    }
}

/// Where pnpm (12) keeps its store operation locks: a fixed path in `/tmp`, whatever `TMPDIR` says.
fn pnpm_locks(id: Identity) -> PathBuf {
    PathBuf::from(format!("/tmp/pnpm-store-operation-locks-{}", id.uid))
}

/// Makes [`pnpm_locks`] a directory of the build user's, 0700, the only place in `/tmp` the sandbox
/// lets it write. One that exists already must be a real directory of the build user's: `/tmp` is
/// everyone's, and one made by another user (or a symlink) would be theirs to tamper with.
fn prepare_pnpm_locks(id: Identity) -> Result<(), Error> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = pnpm_locks(id);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => own(&dir, id).map_err(fs(FsOp::Prepare, &dir)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(&dir).map_err(fs(FsOp::Stat, &dir))?;
            if m.is_dir() && m.uid() == id.uid && m.mode() & 0o022 == 0 {
                Ok(())
            } else {
                Err(Error::ForeignLocks { dir, uid: id.uid })
            }
        }
        Err(e) => Err(fs(FsOp::Create, &dir)(e)),
    }
}

/// The caches under `<state>/deps/cache`, one a manager.
const CACHES: [&str; 3] = ["npm", "pnpm", "uv"];

/// `path` itself (never a symlink's target) owned by `id`.
fn own(path: &Path, id: Identity) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(id.uid), Some(id.gid))
}

/// Everything under `dir` (which the daemon made, so nothing in it is someone else's link) owned
/// by `id`.
fn own_tree(dir: &Path, id: Identity) -> std::io::Result<()> {
    own(dir, id)?;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            own(&entry.path(), id)?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok(())
}

/// What a sandboxed manager may touch besides what it may write: read and run these.
const SYSTEM_RX: [&str; 10] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/snap", "/nix",
];
/// Read only (and list): configuration and the kernel's views of the process.
const SYSTEM_RO: [&str; 3] = ["/etc", "/proc", "/sys"];
/// Device files it may read and write.
const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Where `program` (and the interpreters managers run under: node, python3) are installed, when
/// that is outside the system paths already allowed (`~/.local/bin/uv`, an nvm tree): the prefix
/// above each one's `bin/`, resolved through symlinks. Never `/`, nor a directory holding `state`.
fn install_prefixes(program: &str, state: &Path) -> Vec<PathBuf> {
    let path = build_path();
    let mut out: Vec<PathBuf> = Vec::new();
    for name in [program, "node", "python3"] {
        let Some(found) = std::env::split_paths(&path)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        else {
            continue;
        };
        for p in [found.clone(), found.canonicalize().unwrap_or(found)] {
            let Some(prefix) = p.parent().and_then(Path::parent) else {
                continue;
            };
            if prefix == Path::new("/")
                || state.starts_with(prefix)
                || SYSTEM_RX.iter().any(|s| prefix.starts_with(s))
                || out.iter().any(|o| o == prefix)
            {
                continue;
            }
            out.push(prefix.to_path_buf());
        }
    }
    out
}

/// uv's managed Pythons, when the daemon's environment names where they are
/// (`UV_PYTHON_INSTALL_DIR`, passed on to uv): read and run there. The default place is under the
/// daemon user's HOME, which the build user cannot reach; the venv's interpreter is then a system one.
fn uv_python_dir() -> Option<PathBuf> {
    std::env::var_os("UV_PYTHON_INSTALL_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p != Path::new("/"))
}

/// The Landlock ruleset of a manager that may write `writable`: a ruleset fd to enforce in the
/// child, or `None` when this kernel has no Landlock (then logged once: the manager still runs as
/// the build user, without the filesystem sandbox). Best effort: a kernel with an older Landlock
/// ABI enforces what it knows.
pub fn ruleset(
    program: &str,
    writable: &[PathBuf],
    state: &Path,
) -> Result<Option<OwnedFd>, Error> {
    use landlock::{
        ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, path_beneath_rules,
    };
    let abi = ABI::V7;
    let err = Error::Sandbox;
    let existing = |paths: Vec<PathBuf>| -> Vec<PathBuf> {
        paths.into_iter().filter(|p| p.exists()).collect()
    };
    let mut rx: Vec<PathBuf> = SYSTEM_RX.iter().map(PathBuf::from).collect();
    rx.extend(install_prefixes(program, state));
    rx.extend(uv_python_dir());
    let read = AccessFs::ReadFile | AccessFs::ReadDir;
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .map_err(err)?
        .scope(Scope::from_all(abi))
        .map_err(err)?
        .create()
        .map_err(err)?
        .add_rules(path_beneath_rules(existing(rx), AccessFs::from_read(abi)))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            existing(SYSTEM_RO.iter().map(PathBuf::from).collect()),
            read,
        ))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            existing(DEVICES.iter().map(PathBuf::from).collect()),
            AccessFs::ReadFile | AccessFs::WriteFile,
        ))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            existing(writable.to_vec()),
            AccessFs::from_all(abi),
        ))
        .map_err(err)?;
    let fd: Option<OwnedFd> = created.into();
    if fd.is_none() {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "this kernel has no Landlock: package managers run as the build user without \
                 the filesystem sandbox"
            );
        });
    }
    Ok(fd)
}

/// Whether every user may search `dir` and every directory above it (the "other" execute bit of
/// each): what a build user with no groups can reach without an ACL of its own.
fn reachable_by_anyone(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    dir.is_absolute()
        && dir.ancestors().all(|d| {
            std::fs::metadata(d).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o001 != 0)
        })
}

/// The build user's PATH: the daemon's, less the directories the build user cannot reach (a pyenv
/// shim or an nvm tree under a 0700 `/root`), so a manager and the interpreter it looks for
/// (`python3` for uv, `node`) are found where every user can run them — and a layer's venv never
/// names an interpreter only root can run (its owner could not use it).
fn build_path() -> String {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| reachable_by_anyone(d))
        .collect();
    std::env::join_paths(dirs)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The environment a manager runs with: the daemon's PATH and LANG, the proxy and CA variables of
/// the daemon's environment, HOME and TMPDIR (and the XDG directories) in `home`, and where the
/// caches are (`cache`, when the command builds); nothing else.
fn manager_env(home: &Path, cache: Option<&Path>) -> Vec<(String, String)> {
    const CA: [&str; 6] = [
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "NODE_EXTRA_CA_CERTS",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
    ];
    let h = |rel: &str| home.join(rel).to_string_lossy().into_owned();
    let mut env = vec![
        ("PATH".to_string(), build_path()),
        ("HOME".to_string(), home.to_string_lossy().into_owned()),
        ("TMPDIR".to_string(), h("tmp")),
        ("XDG_CONFIG_HOME".to_string(), h(".config")),
        ("XDG_CACHE_HOME".to_string(), h(".cache")),
        ("XDG_DATA_HOME".to_string(), h(".local/share")),
        ("XDG_STATE_HOME".to_string(), h(".local/state")),
        (
            "LANG".to_string(),
            std::env::var("LANG").unwrap_or_else(|_| "C.UTF-8".into()),
        ),
        // npm's user configuration is the empty HOME's; nothing of the project's `.npmrc` is
        // staged (build.rs `manifests`). No update check, no telemetry.
        (
            "npm_config_update_notifier".to_string(),
            "false".to_string(),
        ),
        ("UV_NO_CONFIG".to_string(), "1".to_string()),
    ];
    if let Some(dir) = uv_python_dir() {
        env.push((
            "UV_PYTHON_INSTALL_DIR".to_string(),
            dir.to_string_lossy().into_owned(),
        ));
    }
    if let Some(cache) = cache {
        let c = |m: &str| cache.join(m).to_string_lossy().into_owned();
        env.push(("npm_config_cache".to_string(), c("npm")));
        env.push(("UV_CACHE_DIR".to_string(), c("uv")));
    }
    for (k, v) in std::env::vars() {
        if k.to_ascii_lowercase().ends_with("_proxy") || CA.contains(&k.as_str()) {
            env.push((k, v));
        }
    }
    env
}

/// What a sandboxed manager command may write, and where its HOME is.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: Identity,
    /// `<state>`: never made readable through an install prefix.
    pub state: PathBuf,
    /// A build's directories; `None` for a probe (`--version`), which may write nothing.
    pub dirs: Option<BuildDirs>,
}

impl Sandbox {
    /// `program` in `dir` as the build user, in the sandbox: cleared environment, stdin null, its
    /// own process group.
    pub fn command(&self, program: &str, dir: &Path) -> Result<Command, Error> {
        let (writable, home, cache) = match &self.dirs {
            Some(d) => (d.writable(self.id), d.home.clone(), Some(d.cache.as_path())),
            // A probe's HOME does not exist: it may write nothing anyway.
            None => (Vec::new(), PathBuf::from("/nonexistent"), None),
        };
        let ruleset = ruleset(program, &writable, &self.state)?;
        let mut c = Command::new(program);
        c.env_clear()
            .envs(manager_env(&home, cache))
            .current_dir(dir)
            .stdin(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut c, 0);
        crate::sys::drop_privileges_on_exec(&mut c, self.id.uid, self.id.gid, ruleset);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_build_path_keeps_only_directories_every_user_reaches() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().canonicalize().expect("canonicalize");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let private = base.join("private");
        let open = base.join("open");
        for (d, mode) in [(&private, 0o700), (&open, 0o755)] {
            std::fs::create_dir_all(d.join("bin")).expect("mkdir");
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        assert!(reachable_by_anyone(&open.join("bin")));
        assert!(!reachable_by_anyone(&private.join("bin")));
        assert!(!reachable_by_anyone(Path::new("relative/bin")));
        assert!(!reachable_by_anyone(&base.join("missing")));
    }

    /// The sandbox as a build gets it, around a shell that reports what it is and tries to reach
    /// what it must not: its uid, NoNewPrivs, a root-only file, a write outside its directories,
    /// a write inside them.
    #[test]
    fn a_sandboxed_command_runs_as_the_build_user_and_reaches_only_its_directories() {
        if crate::sys::euid() != 0 {
            eprintln!("skipped: needs root to drop privileges");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().canonicalize().expect("canonicalize");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        let state = base.join("state");
        std::fs::create_dir(&state).expect("mkdir");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o711)).expect("chmod");
        let layout = crate::layout::Layout {
            state: state.clone(),
            root: base.join("root"),
        };
        let deps = DepStore::new(&layout);
        crate::layout::create_private_dir(deps.dir()).expect("mkdir deps");
        // Root's secret, readable by everyone by its mode: only Landlock keeps it away.
        let secret = base.join("secret.txt");
        std::fs::write(&secret, b"root's secret\n").expect("write");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        // The rest of the state: 0700 root, and it stays out of reach.
        let records = deps.records();
        crate::layout::create_private_dir(&records).expect("mkdir");
        std::fs::write(records.join("x.json"), b"{}").expect("write");
        let dirs = BuildDirs::of(&deps, "k");
        crate::layout::create_private_dir(&dirs.staging).expect("mkdir staging");
        let id = Identity {
            uid: FALLBACK_ID,
            gid: FALLBACK_ID,
        };
        dirs.hand_over(&deps, id).expect("hand over");
        let sandbox = Sandbox {
            id,
            state: state.clone(),
            dirs: Some(dirs.clone()),
        };
        let script = format!(
            "id -u; id -G; grep -E '^NoNewPrivs' /proc/self/status; echo HOME=$HOME; \
             cat {secret} 2>&1 || echo secret-refused; \
             cat /root/.bashrc 2>&1 || echo root-refused; \
             ls {records} 2>&1 || echo records-refused; \
             touch {outside} 2>&1 || echo outside-refused; \
             touch /tmp/octofs-sandbox-probe-$$ 2>&1 || echo tmp-refused; \
             echo made > made.txt && echo inside-ok; \
             echo cached > {cache}/npm/c && echo cache-ok",
            secret = secret.display(),
            records = records.display(),
            outside = base.join("outside").display(),
            cache = dirs.cache.display(),
        );
        let out = sandbox
            .command("sh", &dirs.staging)
            .expect("command")
            .args(["-c", &script])
            .output()
            .expect("run sh");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.first().copied(), Some("65533"), "{text}");
        assert_eq!(lines.get(1).copied(), Some("65533"), "groups: {text}");
        assert!(text.contains("NoNewPrivs:\t1"), "{text}");
        assert!(
            text.contains(&format!("HOME={}", dirs.home.display())),
            "{text}"
        );
        for refused in [
            "secret-refused",
            "root-refused",
            "records-refused",
            "outside-refused",
            "tmp-refused",
        ] {
            assert!(text.contains(refused), "{refused} missing: {text}");
        }
        assert!(!text.contains("root's secret"), "read root's file: {text}");
        assert!(text.contains("Permission denied"), "{text}");
        assert!(
            text.contains("inside-ok") && text.contains("cache-ok"),
            "{text}"
        );
        assert!(!base.join("outside").exists());
        // What the build wrote is the build user's.
        use std::os::unix::fs::MetadataExt;
        let made = std::fs::metadata(dirs.staging.join("made.txt")).expect("made");
        assert_eq!(made.uid(), FALLBACK_ID);
        // The state's other directories keep their mode and gain no entry for the build user.
        let m = std::fs::metadata(&records).expect("records");
        assert_eq!(m.mode() & 0o777, 0o700);
        assert!(!crate::sys::has_acl(&records).expect("acl"));
        dirs.remove();
    }
}
