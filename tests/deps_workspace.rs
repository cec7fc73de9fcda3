//! Dependency layers end to end, against the real npm registry and PyPI: a project's layer built at
//! `mirror add` is there in every workspace with no install step — `require` and the project's own
//! `npm test` work in the mount, a uv venv runs the workspace's interpreter with `sys.prefix` at the
//! workspace's path — it costs no disk per workspace, an agent's own `npm install` after changing the
//! lockfile works in the mount and never touches the layer, and a failing install leaves a usable
//! workspace that `octofs status` explains.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{DATE1, Daemon, GitRepo, parse_json, run};

/// A build or an install talks to a registry: generous, and still bounded.
const NET: Duration = Duration::from_secs(600);

/// Runs `argv` in `dir` (a checkout or a mount), asserting success; stdout.
#[track_caller]
fn in_dir(dir: &Path, argv: &[&str]) -> String {
    let out = run(
        Command::new(argv[0])
            .args(&argv[1..])
            .current_dir(dir)
            .env("UV_PYTHON_DOWNLOADS", "never")
            .env("npm_config_audit", "false")
            .env("npm_config_fund", "false"),
        NET,
    );
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// Disk used under `dir` in bytes (`du -sB1`).
fn du(dir: &Path) -> u64 {
    let out = common::sh("du", ["-sB1", dir.to_str().expect("utf-8")]);
    out.assert_ok();
    out.stdout_str()
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du output")
}

/// Every regular file under `dir` with its blake3, sorted (the sealed layer's state).
fn tree_digest(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let m = e.path().symlink_metadata().expect("lstat");
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                let bytes = std::fs::read(e.path()).expect("read");
                out.push((
                    e.path().display().to_string(),
                    blake3::hash(&bytes).to_hex().to_string(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// Bytes of the files under `dir` that are in the page cache (`fincore`).
fn resident(dir: &Path) -> u64 {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let m = e.path().symlink_metadata().expect("lstat");
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() && m.len() > 0 {
                files.push(e.path());
            }
        }
    }
    files
        .chunks(200)
        .map(|chunk| {
            let out = run(
                Command::new("fincore")
                    .args(["--bytes", "--noheadings", "--output", "RES"])
                    .args(chunk),
                NET,
            );
            out.assert_ok();
            out.stdout_str()
                .split_whitespace()
                .filter_map(|n| n.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// The host's `Cached` in KiB (`/proc/meminfo`).
fn meminfo_cached() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .expect("meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("Cached:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("Cached in /proc/meminfo")
}

fn npm_project(d: &Daemon) -> GitRepo {
    let repo = GitRepo::init(&d.base.join("up-npm"));
    repo.write(
        "package.json",
        r#"{"name":"demo","version":"1.0.0","private":true,
"scripts":{"test":"node test.js"},
"dependencies":{"is-number":"7.0.0","left-pad":"1.3.0"}}"#,
    );
    repo.write(
        "test.js",
        "const isNumber = require('is-number');\nconst pad = require('left-pad');\n\
         if (!isNumber(5) || pad('x', 3) !== '  x') { process.exit(1); }\nconsole.log('tests pass');\n",
    );
    in_dir(&repo.path, &["npm", "install", "--package-lock-only"]);
    repo.write(".gitignore", "node_modules/\n");
    repo.commit_all("npm project", DATE1);
    repo
}

#[test]
fn npm_layer_is_ready_in_every_workspace_and_costs_no_disk() {
    let d = Daemon::start();
    let repo = npm_project(&d);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();

    // Open of a project whose layer exists costs what an open without one costs.
    let plain = GitRepo::init(&d.base.join("up-plain"));
    plain.write("package.json", "{}");
    plain.commit_all("plain", DATE1);
    d.cli_ok([
        "mirror",
        "add",
        "plain",
        plain.path.to_str().expect("utf-8"),
    ]);
    let time_open = |project: &str, thread: &str| {
        let t = std::time::Instant::now();
        d.open_thread(thread, &["--project", project]);
        t.elapsed()
    };
    let mut with = Vec::new();
    let mut without = Vec::new();
    for i in 0..5 {
        without.push(time_open("plain", &format!("plain{i}")));
        with.push(time_open("p", &format!("w{i}")));
    }
    with.sort();
    without.sort();
    eprintln!(
        "open, median of 5: {:?} with the npm layer, {:?} without",
        with[2], without[2]
    );

    // The workspace is ready to run: no install step.
    let ws = d.mount("w0");
    assert_eq!(
        in_dir(&ws, &["node", "-e", "console.log(require('is-number')(7))"]),
        "true"
    );
    assert!(in_dir(&ws, &["npm", "test"]).contains("tests pass"));
    // And in a sandbox that sees only the workspace (`octofs run`, docs/sandbox.md): the layer is
    // part of what the mount presents.
    let sandboxed = run(d.command().args(["run", "w0", "--", "npm", "test"]), NET);
    sandboxed.assert_ok();
    assert!(
        sandboxed.stdout_str().contains("tests pass"),
        "{}",
        sandboxed.describe()
    );
    let status = parse_json("status", &d.cli_ok(["status", "w0", "--json"]));
    assert!(
        status["layers"].to_string().contains("node_modules"),
        "{status}"
    );
    assert_eq!(
        in_dir(&ws, &["git", "status", "--porcelain"]),
        "",
        "the layer must read as ignored content"
    );
    let installed = std::fs::read_to_string(ws.join(".git/octomate-installed")).expect("stamp");
    assert!(installed.starts_with("npm node_modules "), "{installed}");

    // 20 workspaces (the 5 above and 15 more) add little disk, and each runs the tests: the page
    // cache the layer's files take after all 20 ran them is what it was after one (every workspace
    // reads the same blob-cache files). Measured as the resident bytes of the blob cache's files
    // (`fincore`, no cache is dropped); the host's `Cached` delta is printed beside it (noisy: the
    // machine is shared).
    let blobs = d.state.join("blobs");
    let (one, cached_one) = (resident(&blobs), meminfo_cached());
    for i in 5..20 {
        d.open_thread(&format!("w{i}"), &["--project", "p"]);
    }
    for i in 1..20 {
        assert!(in_dir(&d.mount(&format!("w{i}")), &["npm", "test"]).contains("tests pass"));
    }
    let (twenty, cached_twenty) = (resident(&blobs), meminfo_cached());
    eprintln!(
        "page cache of the blob cache's files: {one} bytes after 1 workspace ran npm test, \
         {twenty} after 20 ({:.2}x); host Cached grew by {} KiB meanwhile",
        twenty as f64 / one.max(1) as f64,
        cached_twenty as i64 - cached_one as i64
    );
    assert!(
        one > 0,
        "the tests read no layer file through the blob cache"
    );
    assert!(
        twenty as f64 <= one as f64 * 1.2,
        "page cache {twenty} bytes after 20 workspaces vs {one} after one"
    );
    let mut total = 0;
    for i in 0..20 {
        total += du(&d.state.join(format!("workspaces/w{i}")));
    }
    eprintln!("20 workspaces after npm test: {total} bytes of upper layers and records");
    assert!(total < 5 << 20, "20 workspaces use {total} bytes");

    // The agent changes its dependencies and installs in the mount, as a user would: it works, and
    // the sealed layer (read through another workspace) is unchanged.
    let before = tree_digest(&d.mount("w1").join("node_modules"));
    in_dir(&ws, &["npm", "install", "is-odd@3.0.1"]);
    assert_eq!(
        in_dir(&ws, &["node", "-e", "console.log(require('is-odd')(3))"]),
        "true"
    );
    assert!(in_dir(&ws, &["npm", "test"]).contains("tests pass"));
    assert_eq!(
        tree_digest(&d.mount("w1").join("node_modules")),
        before,
        "an install in one workspace changed the layer another one reads"
    );
    assert!(
        !d.mount("w1").join("node_modules/is-odd").exists(),
        "another workspace sees the package"
    );
    // A snapshot never carries the layer or the agent's install.
    let snap = d.snapshot_id("w0");
    let files = common::sh(
        "git",
        [
            "-C",
            d.mirror("p").to_str().expect("utf-8"),
            "ls-tree",
            "-r",
            "--name-only",
            &snap,
        ],
    );
    files.assert_ok();
    assert!(
        !files.stdout_str().contains("node_modules"),
        "{}",
        files.stdout_str()
    );
    // Deleting the directory works, and the next workspace still has it.
    in_dir(&ws, &["rm", "-rf", "node_modules"]);
    assert!(!ws.join("node_modules").exists());
    d.open_thread("after", &["--project", "p"]);
    assert!(d.mount("after").join("node_modules/is-number").is_dir());
    for i in 0..20 {
        d.cli_ok(["release", &format!("w{i}"), "--force"]);
    }
    for i in 0..5 {
        d.cli_ok(["release", &format!("plain{i}")]);
    }
    d.cli_ok(["release", "after"]);
}

#[test]
fn uv_venv_runs_the_workspaces_interpreter() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-uv"));
    repo.write(
        "pyproject.toml",
        "[project]\nname = \"demo\"\nversion = \"0.1.0\"\nrequires-python = \">=3.8\"\n\
         dependencies = [\"six==1.16.0\", \"pyflakes==3.2.0\"]\n",
    );
    in_dir(&repo.path, &["uv", "lock"]);
    repo.write(".gitignore", ".venv/\n");
    repo.commit_all("uv project", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "u", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    let ws = d.open_thread("t", &["--project", "u"]);
    let printed = in_dir(
        &ws,
        &[
            ".venv/bin/python",
            "-c",
            "import six, sys; print(sys.prefix)",
        ],
    );
    assert_eq!(
        Path::new(&printed),
        ws.join(".venv"),
        "sys.prefix must be the workspace's venv"
    );
    // A console script of the venv runs the workspace's interpreter.
    std::fs::write(ws.join("bad.py"), "import os\n").expect("write");
    let out = run(
        Command::new(ws.join(".venv/bin/pyflakes"))
            .arg("bad.py")
            .current_dir(&ws),
        NET,
    );
    assert!(
        out.stdout_str().contains("'os' imported but unused"),
        "{}",
        out.describe()
    );
    d.cli_ok(["release", "t"]);
}

#[test]
fn a_failing_install_leaves_a_usable_workspace_and_says_why() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-bad"));
    repo.write(
        "package.json",
        r#"{"name":"bad","version":"1.0.0","dependencies":{"octofs-no-such-package-zz9":"1.0.0"}}"#,
    );
    repo.write(
        "package-lock.json",
        r#"{"name":"bad","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{
"":{"name":"bad","version":"1.0.0","dependencies":{"octofs-no-such-package-zz9":"1.0.0"}},
"node_modules/octofs-no-such-package-zz9":{"version":"1.0.0",
"resolved":"https://registry.npmjs.org/octofs-no-such-package-zz9/-/octofs-no-such-package-zz9-1.0.0.tgz"}}}"#,
    );
    repo.write(".gitignore", "node_modules/\n");
    repo.write("README.md", "still here\n");
    repo.commit_all("bad lockfile", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "b", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    let ws = d.open_thread("t", &["--project", "b"]);
    assert_eq!(
        std::fs::read_to_string(ws.join("README.md")).expect("read"),
        "still here\n"
    );
    assert!(!ws.join("node_modules").exists());
    let status = d.cli_ok(["status", "t"]);
    assert!(
        status.contains("dependencies") && status.contains("not built"),
        "{status}"
    );
    d.cli_ok(["release", "t"]);
}

#[test]
fn pnpm_layer_is_ready_in_the_workspace() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-pnpm"));
    repo.write(
        "package.json",
        r#"{"name":"demo-pnpm","version":"1.0.0","private":true,
"scripts":{"test":"node -e \"if(!require('is-number')(3)) process.exit(1); console.log('tests pass')\""},
"dependencies":{"is-number":"7.0.0"}}"#,
    );
    in_dir(&repo.path, &["pnpm", "install", "--lockfile-only"]);
    repo.write(".gitignore", "node_modules/\n");
    repo.commit_all("pnpm project", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "q", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    let ws = d.open_thread("t", &["--project", "q"]);
    // pnpm's layout: node_modules/is-number is a relative symlink into node_modules/.pnpm.
    let link = std::fs::read_link(ws.join("node_modules/is-number")).expect("a symlink");
    assert!(link.is_relative(), "{}", link.display());
    assert_eq!(
        in_dir(&ws, &["node", "-e", "console.log(require('is-number')(7))"]),
        "true"
    );
    assert!(in_dir(&ws, &["pnpm", "test"]).contains("tests pass"));
    assert_eq!(in_dir(&ws, &["git", "status", "--porcelain"]), "");
    d.cli_ok(["release", "t", "--force"]);
}

#[test]
fn an_agents_uv_sync_after_a_lockfile_change_works_in_the_mount() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-uv2"));
    repo.write(
        "pyproject.toml",
        "[project]\nname = \"demo\"\nversion = \"0.1.0\"\nrequires-python = \">=3.8\"\n\
         dependencies = [\"six==1.16.0\"]\n",
    );
    in_dir(&repo.path, &["uv", "lock"]);
    repo.write(".gitignore", ".venv/\n");
    repo.commit_all("uv project", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "u", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    let ws = d.open_thread("a", &["--project", "u"]);
    let other = d.open_thread("b", &["--project", "u"]);
    let before = tree_digest(&other.join(".venv"));
    // The agent adds a package and syncs, as a user would.
    in_dir(&ws, &["uv", "add", "--no-sync", "iniconfig==2.0.0"]);
    in_dir(&ws, &["uv", "sync", "--frozen", "--no-install-project"]);
    assert_eq!(
        in_dir(
            &ws,
            &[
                ".venv/bin/python",
                "-c",
                "import iniconfig, six, sys; print(sys.prefix)"
            ]
        ),
        ws.join(".venv").display().to_string()
    );
    assert_eq!(
        tree_digest(&other.join(".venv")),
        before,
        "a sync in one workspace changed the layer another one reads"
    );
    d.cli_ok(["release", "a", "--force"]);
    d.cli_ok(["release", "b", "--force"]);
}

/// The `dependencies` lines of `status --json`, joined.
fn dependency_lines(d: &Daemon, thread: &str) -> String {
    let s = parse_json("status", &d.cli_ok(["status", thread, "--json"]));
    s["dependencies"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// Issue 32, item 1: a thread whose agent changed its lockfile (`npm install is-even`) gets, when
/// it is opened again, the layer of its own lockfile — built at open in the build sandbox from the
/// warm cache — and `status` says the true state. Before, the open presented no `node_modules`
/// at all (not even the base's layer) and status said "built after this workspace opened".
/// With the open told not to wait (`OCTOFS_DEPS_OPEN_WAIT=0`), the base's layer stands in while
/// the build runs, status says so, and the next open has the thread's own layer.
#[test]
fn a_threads_own_lockfile_gets_its_layer_when_it_opens_again() {
    let mut d = Daemon::unstarted();
    d.spawn_with_env(&[], &[("OCTOFS_DEPS_OPEN_WAIT", "600")]);
    let repo = npm_project(&d);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    let ws = d.open_thread("t", &["--project", "p"]);
    let base_stamp = std::fs::read_to_string(ws.join(".git/octomate-installed")).expect("stamp");
    // The agent adds a dependency, as it would: the lockfile changes.
    in_dir(&ws, &["npm", "install", "is-even@1.0.0"]);
    assert!(in_dir(&ws, &["git", "status", "--porcelain"]).contains("package-lock.json"));
    d.cli_ok(["release", "t"]);

    let t0 = std::time::Instant::now();
    let ws = d.open_thread("t", &[]);
    eprintln!(
        "open that built the thread's own npm layer: {:?}",
        t0.elapsed()
    );
    assert!(
        ws.join("node_modules/is-number").is_dir(),
        "the open has no node_modules/is-number"
    );
    assert_eq!(
        in_dir(&ws, &["node", "-e", "console.log(require('is-even')(2))"]),
        "true"
    );
    assert!(in_dir(&ws, &["npm", "test"]).contains("tests pass"));
    let stamp = std::fs::read_to_string(ws.join(".git/octomate-installed")).expect("stamp");
    assert_ne!(stamp, base_stamp, "the base's layer is presented");
    assert_eq!(dependency_lines(&d, "t"), "", "status is not clean");
    let text = d.cli_ok(["status", "t"]);
    assert!(text.contains("layer:         npm node_modules"), "{text}");
    assert!(!text.contains("not in use"), "{text}");
    // Nothing of the layer is content: git sees the agent's change of the manifests only.
    let porcelain = in_dir(&ws, &["git", "status", "--porcelain"]);
    assert!(!porcelain.contains("node_modules"), "{porcelain}");
    d.cli_ok(["release", "t"]);

    // The open does not wait: the base's layer stands in, status says the thread's own is
    // building (or built by now), and the next open presents it.
    d.stop();
    d.spawn_with_env(&[], &[("OCTOFS_DEPS_OPEN_WAIT", "0")]);
    let ws = d.open_thread("u", &["--project", "p"]);
    in_dir(&ws, &["npm", "install", "is-odd@3.0.1"]);
    d.cli_ok(["release", "u"]);
    let ws = d.open_thread("u", &[]);
    assert!(
        ws.join("node_modules/is-number").is_dir(),
        "the base's layer vanished while the thread's own builds"
    );
    assert!(!ws.join("node_modules/is-odd").exists());
    let lines = dependency_lines(&d, "u");
    assert!(
        (lines.contains("npm layer of this workspace's package-lock.json building")
            || lines.contains("npm layer not in use (built after this workspace opened"))
            && lines.contains("presents the npm layer of another lockfile"),
        "{lines}"
    );
    let deadline = std::time::Instant::now() + NET;
    while !dependency_lines(&d, "u").contains("built after this workspace opened") {
        assert!(
            std::time::Instant::now() < deadline,
            "the build never finished: {}",
            dependency_lines(&d, "u")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    d.cli_ok(["release", "u"]);
    let ws = d.open_thread("u", &[]);
    assert_eq!(
        in_dir(&ws, &["node", "-e", "console.log(require('is-odd')(3))"]),
        "true"
    );
    assert_eq!(dependency_lines(&d, "u"), "");
    d.cli_ok(["release", "u"]);
}

/// A lockfile reaches the default branch through anyone who can push (an agent's `octofs push`), and
/// the daemon builds it as root: no package code runs — the project's own lifecycle scripts
/// included — and the project's `.npmrc` is not used.
#[test]
fn builds_run_no_package_code() {
    let d = Daemon::start();
    let marker = d.base.join("postinstall-ran");
    let repo = GitRepo::init(&d.base.join("up-scripts"));
    repo.write(
        "package.json",
        format!(
            r#"{{"name":"demo","version":"1.0.0","private":true,
"scripts":{{"preinstall":"touch {m}","install":"touch {m}","postinstall":"touch {m}","prepare":"touch {m}"}},
"dependencies":{{"is-number":"7.0.0"}}}}"#,
            m = marker.display()
        ),
    );
    in_dir(
        &repo.path,
        &["npm", "install", "--package-lock-only", "--ignore-scripts"],
    );
    repo.write(
        ".npmrc",
        format!("script-shell=/bin/sh -c 'touch {}'\n", marker.display()),
    );
    repo.write(".gitignore", "node_modules/\n");
    repo.commit_all("scripts", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "s", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    assert!(
        !marker.exists(),
        "a build ran the project's scripts as the daemon"
    );
    let ws = d.open_thread("t", &["--project", "s"]);
    assert!(ws.join("node_modules/is-number/package.json").exists());
    d.cli_ok(["release", "t"]);
}

/// A pnpm workspace (two packages, `b` depends on `a` and on a registry package): the layer holds
/// every `node_modules` the install made (the root's `.pnpm` store and each package's links), each
/// presented at its own path, so `require` from inside `packages/b` works with no install step.
/// Before, only the root's `node_modules` was a layer: `packages/b/node_modules` was missing.
#[test]
fn pnpm_workspace_packages_get_their_node_modules() {
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up-mono"));
    repo.write(
        "package.json",
        r#"{"name":"mono","version":"1.0.0","private":true}"#,
    );
    repo.write("pnpm-workspace.yaml", "packages:\n  - 'packages/*'\n");
    repo.write(
        "packages/a/package.json",
        r#"{"name":"a","version":"1.0.0","main":"index.js","dependencies":{"is-number":"7.0.0"}}"#,
    );
    repo.write(
        "packages/a/index.js",
        "module.exports = (x) => require('is-number')(x);\n",
    );
    repo.write(
        "packages/b/package.json",
        r#"{"name":"b","version":"1.0.0","dependencies":{"a":"workspace:*","left-pad":"1.3.0"}}"#,
    );
    in_dir(&repo.path, &["pnpm", "install", "--lockfile-only"]);
    repo.write(".gitignore", "node_modules/\n");
    repo.commit_all("pnpm workspace", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "mono", repo.path.to_str().expect("utf-8")]),
        NET,
    );
    out.assert_ok();
    let ws = d.open_thread("t", &["--project", "mono"]);
    let s = parse_json("status", &d.cli_ok(["status", "t", "--json"]));
    let paths: Vec<&str> = s["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .filter_map(|l| l["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "node_modules",
            "packages/a/node_modules",
            "packages/b/node_modules"
        ],
        "{s}"
    );
    assert_eq!(
        in_dir(
            &ws.join("packages/b"),
            &[
                "node",
                "-e",
                "console.log(require('a')(5), JSON.stringify(require('left-pad')('x', 3)))"
            ]
        ),
        "true \"  x\""
    );
    assert_eq!(in_dir(&ws, &["git", "status", "--porcelain"]), "");
    // The stamp names every path.
    let stamp = std::fs::read_to_string(ws.join(".git/octomate-installed")).expect("stamp");
    assert_eq!(stamp.lines().count(), 3, "{stamp}");
    assert!(stamp.contains("pnpm packages/b/node_modules "), "{stamp}");
    d.cli_ok(["release", "t", "--force"]);
}
