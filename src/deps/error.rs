//! Why a dependency layer could not be built, sealed or collected: one variant per failure, each
//! carrying what it is about (path, program, key…) and its cause. Its `Display` is the one line a
//! build's outcome and record keep (`OutcomeKind::Failed`, `LayerState::Failed`) and `deps gc`
//! answers, as when these errors were text.
//!
//! Owns only the errors' shapes and texts; must not do I/O.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

/// What was being done to a path when the system refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsOp {
    Read,
    Stat,
    Create,
    Write,
    Remove,
    /// Made ready for the build user (created, owned, searchable).
    Prepare,
}

impl std::fmt::Display for FsOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FsOp::Read => "read",
            FsOp::Stat => "stat",
            FsOp::Create => "create",
            FsOp::Write => "write",
            FsOp::Remove => "remove",
            FsOp::Prepare => "prepare",
        })
    }
}

/// An error of the dependency layers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot {op} {}: {source}", .path.display())]
    Fs {
        op: FsOp,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot read tree {tree}: {source}")]
    Tree {
        tree: gix::ObjectId,
        source: io::Error,
    },
    /// A manifest's blob in the mirror.
    #[error("cannot read {name}: {source}")]
    Blob { name: String, source: io::Error },
    #[error("cannot lock the layer store: {0}")]
    StoreLock(#[source] io::Error),
    #[error("cannot lock the build of {key}: {source}")]
    KeyLock { key: String, source: io::Error },
    #[error("cannot create the layer store: {0}")]
    Store(#[source] crate::git::Error),
    #[error("cannot seal {what}: {source}")]
    Seal {
        what: String,
        source: crate::git::Error,
    },
    #[error("nothing was sealed")]
    NothingSealed,
    #[error("cannot write the log: {0}")]
    Log(#[source] io::Error),
    #[error("{program} is not installed on this host")]
    NotInstalled { program: String },
    /// The manager is on the daemon's `PATH` in a place only the daemon's user reaches (a pyenv
    /// shim or nvm tree under `/root`).
    #[error(
        "{program} cannot be run by the build user (uid {uid}): install it where every user can run it (e.g. /usr/local/bin), not under a private HOME"
    )]
    Unreachable { program: String, uid: u32 },
    /// `what` is the program, with `--version` for the version probe.
    #[error("cannot run {what} as the build user: {source}")]
    Run { what: String, source: io::Error },
    #[error("{program} --version failed ({status})")]
    VersionFailed { program: String, status: ExitStatus },
    #[error("{program} --version printed no version: {output:?}")]
    NoVersion { program: String, output: String },
    /// The manager's version could not be asked when the build was planned (why, as said then).
    #[error("{0}")]
    NoManager(String),
    #[error("`{}` failed ({status})", .argv.join(" "))]
    Failed {
        argv: Vec<String>,
        status: ExitStatus,
    },
    #[error("`{}` did not finish within {secs} s and was killed", .argv.join(" "))]
    TimedOut { argv: Vec<String>, secs: u64 },
    #[error("`{}` cancelled", .argv.join(" "))]
    Cancelled { argv: Vec<String> },
    #[error("cannot wait for {program}: {source}")]
    Wait { program: String, source: io::Error },
    /// A command failed and the manager said why: its own line.
    #[error("{0}")]
    Manager(String),
    #[error("{manager} finished without creating {path}")]
    NoInstall {
        manager: &'static str,
        path: &'static str,
    },
    /// The staged project names a dependency that is not a registry package (the file, and why).
    #[error("refused: {file}: {why}")]
    Refused { file: String, why: Vet },
    /// The layer would run what the staging path held.
    #[error(
        "{} names the staging path {} (the layer would not be relocatable)",
        .file.display(),
        .staging.display()
    )]
    Bound { file: PathBuf, staging: PathBuf },
    #[error(
        "the build user (uid {uid}) cannot reach {}: {source} (every directory above the state directory must be searchable by it)",
        .dir.display()
    )]
    Unsearchable {
        uid: u32,
        dir: PathBuf,
        source: io::Error,
    },
    #[error(
        "{} is not a directory of the build user (uid {uid}) writable by it alone: remove it",
        .dir.display()
    )]
    ForeignLocks { dir: PathBuf, uid: u32 },
    #[error("cannot build the build sandbox: {0}")]
    Sandbox(#[source] landlock::RulesetError),
    #[error("cannot read the workspace records: {0}")]
    Records(#[source] io::Error),
    #[error("cannot list the layers: {0}")]
    List(#[source] io::Error),
    #[error("cannot remove the ref of layer {key}: {source}")]
    RemoveRef {
        key: String,
        source: crate::git::Error,
    },
    #[error("cannot prune the layer store: {0}")]
    Prune(#[source] crate::git::Error),
}

/// Why the vet refused a staged manifest (`vet`): what it names, and what it is instead of a
/// registry package.
#[derive(Debug, thiserror::Error)]
pub enum Vet {
    #[error("not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("dependency {name:?} is {spec:?} ({why}), not a registry package")]
    Spec {
        name: String,
        spec: String,
        why: &'static str,
    },
    #[error("dependency {name:?} is resolved from {resolved:?}, not a registry package")]
    Resolved { name: String, resolved: String },
    #[error("package {key:?} lies outside the project")]
    Outside { key: String },
    #[error("workspace package glob {glob:?} lies outside the project")]
    GlobOutside { glob: String },
    /// A whole line names the source (a pnpm lockfile key, a requirement with `@ git+`).
    #[error("{line:?} is {why}, not a registry package")]
    Line { line: String, why: &'static str },
    /// A YAML `key: value` (pnpm's lockfile).
    #[error("{key} {value:?} is {why}, not a registry package")]
    Yaml {
        key: String,
        value: String,
        why: &'static str,
    },
    /// A TOML `key = value` (uv's lockfile, `pyproject.toml`).
    #[error("{key} = {value:?} is {why}, not a registry package")]
    Toml {
        key: String,
        value: String,
        why: &'static str,
    },
}

/// `Error::Fs` for a failed step on `path`: `.map_err(fs(FsOp::Read, &dir))`.
pub(crate) fn fs(op: FsOp, path: &std::path::Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Fs {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn each_error_keeps_its_line() {
        let io = || io::Error::from_raw_os_error(libc::EACCES);
        let argv = || vec!["npm".to_string(), "ci".to_string()];
        let cases: Vec<(Error, &str)> = vec![
            (
                fs(FsOp::Stat, std::path::Path::new("/s/x"))(io()),
                "cannot stat /s/x: Permission denied (os error 13)",
            ),
            (
                Error::NotInstalled {
                    program: "pnpm".into(),
                },
                "pnpm is not installed on this host",
            ),
            (
                Error::Unreachable {
                    program: "uv".into(),
                    uid: 999,
                },
                "uv cannot be run by the build user (uid 999): install it where every user can run it (e.g. /usr/local/bin), not under a private HOME",
            ),
            (
                Error::Run {
                    what: "npm --version".into(),
                    source: io(),
                },
                "cannot run npm --version as the build user: Permission denied (os error 13)",
            ),
            (
                Error::NoVersion {
                    program: "uv".into(),
                    output: "uv".into(),
                },
                "uv --version printed no version: \"uv\"",
            ),
            (
                Error::Failed {
                    argv: argv(),
                    status: ExitStatus::from_raw(1 << 8),
                },
                "`npm ci` failed (exit status: 1)",
            ),
            (
                Error::TimedOut {
                    argv: argv(),
                    secs: 600,
                },
                "`npm ci` did not finish within 600 s and was killed",
            ),
            (Error::Cancelled { argv: argv() }, "`npm ci` cancelled"),
            (
                Error::NoInstall {
                    manager: "npm",
                    path: "node_modules",
                },
                "npm finished without creating node_modules",
            ),
            (
                Error::Refused {
                    file: "package.json".into(),
                    why: Vet::Spec {
                        name: "x".into(),
                        spec: "git+file:///r".into(),
                        why: "a git source",
                    },
                },
                "refused: package.json: dependency \"x\" is \"git+file:///r\" (a git source), not a registry package",
            ),
            (
                Error::Refused {
                    file: "uv.lock".into(),
                    why: Vet::Toml {
                        key: "path".into(),
                        value: "../x".into(),
                        why: "a path source",
                    },
                },
                "refused: uv.lock: path = \"../x\" is a path source, not a registry package",
            ),
            (
                Error::Refused {
                    file: "pnpm-lock.yaml".into(),
                    why: Vet::Yaml {
                        key: "tarball".into(),
                        value: "file:x.tgz".into(),
                        why: "a local tarball",
                    },
                },
                "refused: pnpm-lock.yaml: tarball \"file:x.tgz\" is a local tarball, not a registry package",
            ),
            (
                Error::Refused {
                    file: "pnpm-lock.yaml".into(),
                    why: Vet::Line {
                        line: "/x@file:y:".into(),
                        why: "a local directory",
                    },
                },
                "refused: pnpm-lock.yaml: \"/x@file:y:\" is a local directory, not a registry package",
            ),
            (
                Error::Refused {
                    file: "package-lock.json".into(),
                    why: Vet::Resolved {
                        name: "x".into(),
                        resolved: "file:../x".into(),
                    },
                },
                "refused: package-lock.json: dependency \"x\" is resolved from \"file:../x\", not a registry package",
            ),
            (
                Error::Refused {
                    file: "package-lock.json".into(),
                    why: Vet::Outside { key: "../x".into() },
                },
                "refused: package-lock.json: package \"../x\" lies outside the project",
            ),
            (
                Error::Refused {
                    file: "pnpm-workspace.yaml".into(),
                    why: Vet::GlobOutside {
                        glob: "../*".into(),
                    },
                },
                "refused: pnpm-workspace.yaml: workspace package glob \"../*\" lies outside the project",
            ),
            (
                Error::Bound {
                    file: "node_modules/.bin/x".into(),
                    staging: "/s/deps/staging/k".into(),
                },
                "node_modules/.bin/x names the staging path /s/deps/staging/k (the layer would not be relocatable)",
            ),
            (
                Error::Unsearchable {
                    uid: 999,
                    dir: "/s/deps/staging/k".into(),
                    source: io(),
                },
                "the build user (uid 999) cannot reach /s/deps/staging/k: Permission denied (os error 13) (every directory above the state directory must be searchable by it)",
            ),
            (
                Error::ForeignLocks {
                    dir: "/tmp/l".into(),
                    uid: 999,
                },
                "/tmp/l is not a directory of the build user (uid 999) writable by it alone: remove it",
            ),
            (
                Error::StoreLock(io()),
                "cannot lock the layer store: Permission denied (os error 13)",
            ),
        ];
        for (e, want) in cases {
            assert_eq!(e.to_string(), want);
        }
    }
}
