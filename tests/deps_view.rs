//! Dependency layers presented in workspaces, through the real daemon and real mounts. The layer
//! is built by hand (a small fake `node_modules` sealed into `<state>/deps/store.git` with git, and
//! its `Built` record), so these tests do not depend on how layers are built:
//!
//! 1. [`a_layer_is_presented_read_through_and_never_leaves_the_workspace`]: a workspace opened
//!    before the layer exists says why it has none; one opened after presents it (content, modes,
//!    symlinks, `require` with node, a clean `git status`, `.git/octomate-installed`), at the same
//!    fork cost and disk (printed); two workspaces read the same blob-cache file; a write copies up
//!    and leaves the sealed blob as it was; snapshots and commits hold no `node_modules` and the
//!    mirror gets no layer object; `rm -rf node_modules` survives a daemon restart, which presents
//!    the same tree; release + resume and fork present the layer again (and nothing of what was
//!    changed under it: content, modes, empty directories).
//! 2. [`a_failed_layer_leaves_a_usable_workspace_and_status_says_why`]: the failed build's
//!    message, matched to the lockfile by its key; a layer of another lockfile is not used.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const LOCK: &str = "{\n  \"name\": \"app\",\n  \"lockfileVersion\": 3,\n  \"packages\": {\"node_modules/x\": {\"version\": \"1.0.0\"}}\n}\n";

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// git on a bare repository `git_dir` (with an optional index and work tree).
#[track_caller]
fn g_bare(git_dir: &Path, index: Option<&Path>, work: Option<&Path>, args: &[&str]) -> String {
    let mut c = git_command(git_dir, DATE1);
    c.env("GIT_DIR", git_dir);
    if let Some(i) = index {
        c.env("GIT_INDEX_FILE", i);
    }
    if let Some(w) = work {
        c.env("GIT_WORK_TREE", w).current_dir(w);
    }
    let out = run(c.args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

fn status(d: &Daemon, thread: &str) -> serde_json::Value {
    parse_json("status --json", &d.cli_ok(["status", thread, "--json"]))
}

/// Bytes of disk (allocated blocks) under `p`.
fn disk_usage(p: &Path) -> u64 {
    let out = run(Command::new("du").arg("-s").arg("-B1").arg(p), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str()
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("du output")
}

/// The project: a package.json, its lockfile, code that requires `x`, `node_modules/` ignored.
fn project(base: &Path) -> GitRepo {
    let repo = GitRepo::init(&base.join("app"));
    repo.write(
        "package.json",
        "{\"name\": \"app\", \"dependencies\": {\"x\": \"1.0.0\"}}\n",
    );
    repo.write("package-lock.json", LOCK);
    repo.write("index.js", "console.log(require('x'));\n");
    repo.write(".gitignore", "node_modules/\n");
    repo.git(["add", "-A"]);
    repo.git(["commit", "-q", "-m", "app"]);
    repo
}

/// The layer's files: a fake `node_modules`.
fn layer_dir(base: &Path) -> PathBuf {
    let nm = base.join("layer").join("node_modules");
    write_file(
        &nm.join("x/package.json"),
        b"{\"name\": \"x\", \"version\": \"1.0.0\", \"main\": \"index.js\", \"bin\": {\"tool\": \"bin/tool.js\"}}\n",
        0o644,
    );
    write_file(
        &nm.join("x/index.js"),
        b"module.exports = require('./lib/deep/answer.js');\n",
        0o644,
    );
    write_file(
        &nm.join("x/lib/deep/answer.js"),
        b"module.exports = 42;\n",
        0o644,
    );
    write_file(
        &nm.join("x/bin/tool.js"),
        b"#!/usr/bin/env node\nconsole.log('tool ' + require('..'));\n",
        0o755,
    );
    fs::create_dir_all(nm.join(".bin")).expect("mkdir .bin");
    std::os::unix::fs::symlink("../x/bin/tool.js", nm.join(".bin/tool")).expect("symlink");
    nm
}

/// Seals `nm` into `<state>/deps/store.git` and writes its `Built` record; returns the tree id.
fn seal_layer(d: &Daemon, nm: &Path, lock: &[u8]) -> String {
    let deps = d.state.join("deps");
    let store = deps.join("store.git");
    if !store.exists() {
        fs::create_dir_all(&deps).expect("mkdir deps");
        g(&deps, &["init", "-q", "--bare", "store.git"]);
    }
    let index = d.base.join("layer.index");
    g_bare(&store, Some(&index), Some(nm), &["add", "-f", "-A", "."]);
    let tree = g_bare(&store, Some(&index), Some(nm), &["write-tree"]);
    let hash = blake3::hash(lock).to_hex().to_string();
    let key = layer_key("npm", "10", lock);
    let record = serde_json::json!({
        "key": key,
        "manager": "npm",
        "manager_version": "10.0.0",
        "built_at": 1_700_000_000u64,
        "state": "built",
        "layer": {
            "key": key,
            "manager": "npm",
            "path": "node_modules",
            "tree": tree,
            "lockfile_hash": hash,
        },
        "bytes": 200,
        "files": 5,
    });
    let layers = deps.join("layers");
    fs::create_dir_all(&layers).expect("mkdir layers");
    fs::write(
        layers.join(format!("{key}.json")),
        serde_json::to_vec_pretty(&record).expect("json"),
    )
    .expect("write record");
    tree
}

#[test]
fn a_failed_layer_leaves_a_usable_workspace_and_status_says_why() {
    let d = Daemon::start();
    let repo = project(&d.base);
    d.cli_ok(["mirror", "add", "app", repo.path.to_str().expect("utf8")]);
    // A failed build of this lockfile (npm 10, the newest record: `mirror add` may have failed
    // one of its own), and a built layer of another lockfile.
    let layers = d.state.join("deps/layers");
    fs::create_dir_all(&layers).expect("mkdir layers");
    let key = layer_key("npm", "10", LOCK.as_bytes());
    let failed = serde_json::json!({
        "key": key, "manager": "npm", "manager_version": "10.9.2", "built_at": 4_000_000_000u64,
        "state": "failed", "message": "404 Not Found - GET https://registry/x-9.tgz",
        "log": d.state.join("deps/logs/x.log"),
    });
    fs::write(layers.join(format!("{key}.json")), failed.to_string()).expect("write");
    seal_layer(&d, &layer_dir(&d.base), b"another lockfile\n");
    let ws = d.open_thread("t", &["--project", "app"]);
    assert!(!ws.join("node_modules").exists());
    assert_eq!(read(&ws.join("index.js")), "console.log(require('x'));\n");
    assert!(!ws.join(".git/octomate-installed").exists());
    let s = status(&d, "t");
    assert_eq!(
        s["dependencies"][0].as_str(),
        Some(
            "npm layer not built (its build failed: 404 Not Found - GET https://registry/x-9.tgz)"
        ),
        "{s}"
    );
    fs::write(ws.join("new.txt"), "work\n").expect("write");
    d.snapshot_id("t");
    d.cli_ok(["release", "t"]);
}

/// The key layer builds give a lockfile (`docs/deps.md` "Key").
fn layer_key(manager: &str, major: &str, lock: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    for part in [manager.as_bytes(), b"\0", major.as_bytes(), b"\0", lock] {
        h.update(part);
    }
    h.finalize().to_hex().to_string()
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `octofs open` of a new thread, timed.
fn timed_open(d: &Daemon, thread: &str) -> Duration {
    let t0 = Instant::now();
    d.open_thread(thread, &["--project", "app"]);
    t0.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn names_in(d: &Daemon, commit: &str) -> String {
    g(&d.mirror("app"), &["ls-tree", "-r", "--name-only", commit])
}

#[test]
fn a_layer_is_presented_read_through_and_never_leaves_the_workspace() {
    let mut d = Daemon::start();
    let repo = project(&d.base);
    d.cli_ok(["mirror", "add", "app", repo.path.to_str().expect("utf8")]);

    // Without a layer: the workspace opens without one and status says why.
    let mut without = Vec::new();
    for i in 0..3 {
        without.push(timed_open(&d, &format!("plain{i}")));
    }
    let plain = d.mount("plain0");
    assert!(!plain.join("node_modules").exists());
    let s = status(&d, "plain0");
    assert_eq!(s["layers"].as_array().map(Vec::len), Some(0), "{s}");
    // (`mirror add` tried to build it: the fake lockfile names no real package, so the reason
    // is npm's own, or how to build it where the build did not run.)
    assert!(
        s["dependencies"][0]
            .as_str()
            .is_some_and(|m| m.starts_with("npm layer not built (")),
        "{s}"
    );
    let text = d.cli_ok(["status", "plain0"]);
    assert!(
        text.contains("dependencies:  npm layer not built ("),
        "{text}"
    );
    assert!(!plain.join(".git/octomate-installed").exists());

    // The layer, sealed by hand.
    let nm = layer_dir(&d.base);
    let layer_tree = seal_layer(&d, &nm, LOCK.as_bytes());
    let store = d.state.join("deps/store.git");
    let mut with = Vec::new();
    for i in 0..3 {
        with.push(timed_open(&d, &format!("dep{i}")));
    }
    let w1 = d.mount("dep0");
    let w2 = d.mount("dep1");
    let upper = |t: &str| disk_usage(&d.state.join("workspaces").join(t));
    let (disk_without, disk_with) = (upper("plain1"), upper("dep1"));
    eprintln!(
        "open (fork) of the project, CLI wall time: without a layer median {:?} (all {without:?}), \
         with a layer median {:?} (all {with:?}); upper layer + records after open (du of \
         <state>/workspaces/<thread>): without {disk_without} bytes, with {disk_with} bytes",
        median(without.clone()),
        median(with.clone())
    );
    // The same disk: nothing of the layer is copied (a stamp of one line more at most).
    assert!(
        disk_with <= disk_without + (64 << 10),
        "a workspace with a layer takes {disk_with} bytes, without {disk_without}"
    );
    // The same cost (loosely: the machine is shared; the figures are printed above).
    assert!(
        median(with.clone()) <= median(without.clone()) * 3 + Duration::from_millis(300),
        "open with a layer {with:?} vs without {without:?}"
    );

    // Presented read-through: content, modes, symlinks, nested directories.
    assert_eq!(
        read(&w1.join("node_modules/x/lib/deep/answer.js")),
        "module.exports = 42;\n"
    );
    assert_eq!(
        fs::read(w1.join("node_modules/x/package.json")).expect("read"),
        fs::read(nm.join("x/package.json")).expect("read")
    );
    let mode = |p: &Path| fs::symlink_metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&w1.join("node_modules/x/bin/tool.js")), 0o755);
    assert_eq!(mode(&w1.join("node_modules/x/index.js")), 0o644);
    assert_eq!(
        fs::read_link(w1.join("node_modules/.bin/tool")).expect("readlink"),
        PathBuf::from("../x/bin/tool.js")
    );
    let out = run(
        Command::new("node")
            .args(["-e", "console.log(require('./node_modules/x'))"])
            .current_dir(&w1),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    assert_eq!(out.stdout_str().trim(), "42");
    let out = run(
        Command::new("node").arg("index.js").current_dir(&w1),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    assert_eq!(out.stdout_str().trim(), "42");
    let out = run(
        Command::new(w1.join("node_modules/.bin/tool")).current_dir(&w1),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    assert_eq!(out.stdout_str().trim(), "tool 42");
    assert_eq!(g(&w1, &["status", "--porcelain"]), "");

    // The stamp, and what status says.
    let hash = blake3::hash(LOCK.as_bytes()).to_hex().to_string();
    assert_eq!(
        read(&w1.join(".git/octomate-installed")),
        format!("npm node_modules {hash}\n")
    );
    let s = status(&d, "dep0");
    assert_eq!(s["layers"][0]["path"], "node_modules", "{s}");
    assert_eq!(
        s["layers"][0]["tree"].as_str(),
        Some(layer_tree.as_str()),
        "{s}"
    );
    assert_eq!(s["dependencies"].as_array().map(Vec::len), Some(0), "{s}");
    assert!(
        d.cli_ok(["status", "dep0"])
            .contains("layer:         npm node_modules")
    );
    // The workspace opened before the layer existed says how to get it.
    let s = status(&d, "plain0");
    assert!(
        s["dependencies"][0]
            .as_str()
            .is_some_and(|m| m.starts_with("npm layer not in use (built after")),
        "{s}"
    );

    // Two workspaces reading the same layer file share one blob-cache file.
    let answer_id = g_bare(
        &store,
        None,
        None,
        &["rev-parse", &format!("{layer_tree}:x/lib/deep/answer.js")],
    );
    assert_eq!(
        read(&w2.join("node_modules/x/lib/deep/answer.js")),
        "module.exports = 42;\n"
    );
    let cached: Vec<PathBuf> = walk(&d.state.join("blobs"))
        .into_iter()
        .filter(|p| {
            p.strip_prefix(d.state.join("blobs"))
                .ok()
                .map(|r| r.to_string_lossy().replace('/', ""))
                .is_some_and(|r| r.ends_with(&answer_id))
        })
        .collect();
    assert_eq!(
        cached.len(),
        1,
        "blob-cache files of {answer_id}: {cached:?}"
    );

    // A write copies up; the other workspace and the sealed blob are unchanged.
    let index_id = g_bare(
        &store,
        None,
        None,
        &["rev-parse", &format!("{layer_tree}:x/index.js")],
    );
    fs::write(w1.join("node_modules/x/index.js"), "module.exports = 7;\n").expect("write");
    assert_eq!(
        read(&w1.join("node_modules/x/index.js")),
        "module.exports = 7;\n"
    );
    assert_eq!(
        read(&w2.join("node_modules/x/index.js")),
        "module.exports = require('./lib/deep/answer.js');\n"
    );
    assert_eq!(
        g_bare(&store, None, None, &["cat-file", "blob", &index_id]),
        "module.exports = require('./lib/deep/answer.js');"
    );

    // What an install leaves that git cannot hold (an empty directory, a mode) is not saved either.
    fs::create_dir(w1.join("node_modules/.cache")).expect("mkdir");
    fs::set_permissions(
        w1.join("node_modules/x/lib"),
        fs::Permissions::from_mode(0o700),
    )
    .expect("chmod");

    // Snapshots and commits hold no node_modules; the mirror holds no layer object.
    fs::write(w1.join("index.js"), "console.log(require('x') + 1);\n").expect("write");
    // A layer file copied out of the layer is content like any other (its object reaches the mirror).
    fs::copy(
        w1.join("node_modules/x/lib/deep/answer.js"),
        w1.join("answer.js"),
    )
    .expect("cp");
    let snap = d.snapshot_id("dep0");
    let names = names_in(&d, &snap);
    assert!(!names.contains("node_modules"), "snapshot tree: {names}");
    assert!(
        names.contains("answer.js") && names.contains("index.js"),
        "{names}"
    );
    let commit = d
        .cli_ok(["commit", "dep0", "-m", "work"])
        .trim()
        .to_string();
    let names = names_in(&d, &commit);
    assert!(!names.contains("node_modules"), "commit tree: {names}");
    assert!(names.contains("answer.js"), "{names}");
    let missing = run(
        git_command(&d.mirror("app"), DATE1).args(["cat-file", "-e", &layer_tree]),
        CMD_TIMEOUT,
    );
    assert!(!missing.success(), "the layer's tree reached the mirror");
    g(
        &d.mirror("app"),
        &["fsck", "--connectivity-only", "--no-dangling"],
    );
    assert_eq!(g(&w1, &["status", "--porcelain"]), "");

    // rm -rf node_modules works, and survives a restart (which presents the same tree).
    fs::remove_dir_all(w2.join("node_modules")).expect("rm -rf node_modules");
    assert!(!w2.join("node_modules").exists());
    d.stop();
    d.spawn();
    wait_mounted(&[w1.clone(), w2.clone()], Duration::from_secs(20));
    assert!(!w2.join("node_modules").exists());
    assert_eq!(
        read(&w1.join("node_modules/x/index.js")),
        "module.exports = 7;\n"
    );
    assert_eq!(
        read(&d.mount("dep2").join("node_modules/x/index.js")),
        "module.exports = require('./lib/deep/answer.js');\n"
    );
    assert_eq!(status(&d, "dep1")["layers"][0]["path"], "node_modules");

    // Release + resume presents the layer again (its own copy-up did not travel: not content).
    d.cli_ok(["release", "dep0"]);
    d.open_thread("dep0", &[]);
    assert_eq!(
        read(&w1.join("node_modules/x/index.js")),
        "module.exports = require('./lib/deep/answer.js');\n"
    );
    assert_eq!(
        read(&w1.join("index.js")),
        "console.log(require('x') + 1);\n"
    );
    assert!(!w1.join("node_modules/.cache").exists());
    assert_eq!(mode(&w1.join("node_modules/x/lib")), 0o755);
    assert_eq!(
        read(&w1.join(".git/octomate-installed")),
        format!("npm node_modules {hash}\n")
    );
    let out = run(
        Command::new("node").arg("index.js").current_dir(&w1),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    assert_eq!(out.stdout_str().trim(), "43");

    // A fork gets the layer by its own lockfile.
    d.cli_ok(["fork", "dep0", "forked"]);
    let f = d.mount("forked");
    assert_eq!(
        read(&f.join("node_modules/x/lib/deep/answer.js")),
        "module.exports = 42;\n"
    );
    assert_eq!(status(&d, "forked")["layers"][0]["path"], "node_modules");

    for t in [
        "plain0", "plain1", "plain2", "dep0", "dep1", "dep2", "forked",
    ] {
        d.cli_ok(["release", t, "--force"]);
    }
}

/// Every regular file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// A file the user put under a layer path, and a layer file they changed, are saved once the
/// workspace's `.gitignore` no longer ignores them (the old rule dropped everything under a layer
/// path from every snapshot, so un-ignoring lost them at release); what the layer presented and
/// nobody changed stays out, and no layer object reaches the mirror.
#[test]
fn what_the_user_un_ignores_under_a_layer_is_saved() {
    let d = Daemon::start();
    let repo = project(&d.base);
    d.cli_ok(["mirror", "add", "app", repo.path.to_str().expect("utf8")]);
    let layer_tree = seal_layer(&d, &layer_dir(&d.base), LOCK.as_bytes());
    let ws = d.open_thread("u", &["--project", "app"]);
    assert_eq!(status(&d, "u")["layers"][0]["path"], "node_modules");
    fs::write(ws.join("node_modules/mine.txt"), "mine\n").expect("write");
    fs::write(ws.join("node_modules/x/index.js"), "module.exports = 7;\n").expect("write");
    fs::create_dir(ws.join("node_modules/.cache")).expect("mkdir");
    // While ignored: nothing under node_modules is saved.
    let snap = d.snapshot_id("u");
    let names = names_in(&d, &snap);
    assert!(!names.contains("node_modules"), "snapshot tree: {names}");
    // Un-ignored: the user's file and the changed layer file are content; the rest stays ignored.
    fs::write(
        ws.join(".gitignore"),
        "node_modules/*\n!node_modules/mine.txt\n!node_modules/x/\n",
    )
    .expect("write");
    let snap = d.snapshot_id("u");
    let names = names_in(&d, &snap);
    for p in ["node_modules/mine.txt", "node_modules/x/index.js"] {
        assert!(names.lines().any(|l| l == p), "{p} not saved: {names}");
    }
    for p in ["node_modules/x/lib/deep/answer.js", "node_modules/.cache"] {
        assert!(!names.contains(p), "{p} saved: {names}");
    }
    d.cli_ok(["release", "u"]);
    let ws = d.open_thread("u", &[]);
    assert_eq!(read(&ws.join("node_modules/mine.txt")), "mine\n");
    assert_eq!(
        read(&ws.join("node_modules/x/index.js")),
        "module.exports = 7;\n"
    );
    let missing = run(
        git_command(&d.mirror("app"), DATE1).args(["cat-file", "-e", &layer_tree]),
        CMD_TIMEOUT,
    );
    assert!(!missing.success(), "the layer's tree reached the mirror");
    g(
        &d.mirror("app"),
        &["fsck", "--connectivity-only", "--no-dangling"],
    );
    d.cli_ok(["release", "u", "--force"]);
}

/// A project folder that already has a `.venv` that is not relocatable keeps it: no uv layer is
/// presented in its workspaces, the folder's venv is left as it is, and `status` says why (its
/// `pyvenv.cfg` lacks `relocatable = true`, or a script's shebang names the venv's own path). A
/// relocatable one does not stop the layer. Before, the layer was presented regardless.
#[test]
fn an_existing_non_relocatable_venv_is_kept_and_reported() {
    let d = Daemon::start();
    let folder = d.base.join("pyproj");
    let uv_lock = "version = 1\nrequires-python = \">=3.8\"\n";
    write_file(
        &folder.join("pyproject.toml"),
        b"[project]\nname = \"p\"\nversion = \"0.1.0\"\n",
        0o644,
    );
    write_file(&folder.join("uv.lock"), uv_lock.as_bytes(), 0o644);
    write_file(&folder.join(".gitignore"), b".venv/\n", 0o644);
    let venv = folder.join(".venv");
    write_file(
        &venv.join("pyvenv.cfg"),
        b"home = /usr/bin\nversion = 3.11.2\n",
        0o644,
    );
    let bound = format!("#!{}/bin/python\nimport sys\n", venv.display());
    write_file(&venv.join("bin/tool"), bound.as_bytes(), 0o755);
    d.cli_ok(["mirror", "add", "p", folder.to_str().expect("utf8")]);
    // A built uv layer for this lockfile, sealed by hand.
    let deps = d.state.join("deps");
    let store = deps.join("store.git");
    if !store.exists() {
        fs::create_dir_all(&deps).expect("mkdir deps");
        g(&deps, &["init", "-q", "--bare", "store.git"]);
    }
    let files = d.base.join("uvlayer/.venv");
    write_file(&files.join("pyvenv.cfg"), b"relocatable = true\n", 0o644);
    let index = d.base.join("uvlayer.index");
    g_bare(
        &store,
        Some(&index),
        Some(&files),
        &["add", "-f", "-A", "."],
    );
    let tree = g_bare(&store, Some(&index), Some(&files), &["write-tree"]);
    let key = layer_key("uv", "0.9", uv_lock.as_bytes());
    let record = serde_json::json!({
        "key": key, "manager": "uv", "manager_version": "0.9.0", "built_at": 1_700_000_000u64,
        "state": "built", "bytes": 19, "files": 1,
        "layer": {"key": key, "manager": "uv", "path": ".venv", "tree": tree,
                  "lockfile_hash": blake3::hash(uv_lock.as_bytes()).to_hex().to_string()},
    });
    fs::create_dir_all(deps.join("layers")).expect("mkdir");
    fs::write(deps.join(format!("layers/{key}.json")), record.to_string()).expect("write record");

    let kept = |thread: &str, why: &str| {
        let ws = d.open_thread(thread, &["--project", "p"]);
        let s = status(&d, thread);
        assert_eq!(s["layers"].as_array().map(Vec::len), Some(0), "{s}");
        let line = s["dependencies"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            line.starts_with(&format!("existing .venv kept (not relocatable: {why}")),
            "{s}"
        );
        assert!(!ws.join(".venv").exists());
        assert!(
            d.cli_ok(["status", thread])
                .contains("dependencies:  existing .venv kept (not relocatable: ")
        );
    };
    kept("t1", "pyvenv.cfg has no `relocatable = true`)");
    // Relocatable by its configuration, but a script still runs the interpreter at its old path.
    write_file(
        &venv.join("pyvenv.cfg"),
        b"home = /usr/bin\nrelocatable = true\n",
        0o644,
    );
    kept("t2", "bin/tool runs ");
    // The folder's venv is left as it was.
    assert_eq!(read(&venv.join("bin/tool")), bound);
    // A relocatable venv does not stop the layer.
    write_file(
        &venv.join("bin/tool"),
        b"#!/bin/sh\nexec \"$(dirname \"$0\")/python\" \"$@\"\n",
        0o755,
    );
    let ws = d.open_thread("t3", &["--project", "p"]);
    assert_eq!(status(&d, "t3")["layers"][0]["path"], ".venv");
    assert_eq!(read(&ws.join(".venv/pyvenv.cfg")), "relocatable = true\n");
    // The folder is its owner's content: a `bin/` that is a symlink is not followed, and a FIFO
    // named pyvenv.cfg does not hold the daemon (the old check blocked in open(2) there, and the
    // open below timed out).
    let elsewhere = d.base.join("elsewhere");
    write_file(&elsewhere.join("tool"), bound.as_bytes(), 0o755);
    fs::rename(venv.join("bin"), d.base.join("old-bin")).expect("move bin");
    std::os::unix::fs::symlink(&elsewhere, venv.join("bin")).expect("symlink bin");
    kept("t4", "bin/ is not a directory)");
    fs::remove_file(venv.join("pyvenv.cfg")).expect("rm pyvenv.cfg");
    run(
        std::process::Command::new("mkfifo").arg(venv.join("pyvenv.cfg")),
        CMD_TIMEOUT,
    )
    .assert_ok();
    kept("t5", "it has no pyvenv.cfg)");
    for t in ["t1", "t2", "t3", "t4", "t5"] {
        d.cli_ok(["release", t, "--force"]);
    }
}

/// Issue 32, item 2: a uv layer whose `.venv/bin/python` names an interpreter its workspace's owner
/// cannot run (under a 0700 directory, as a root-only Python would be) is not presented as fine:
/// `open` prints why and `status` says so, as an ordinary user, who indeed gets "Permission
/// denied" there; once the interpreter is reachable, status is clean. Before, status showed the
/// layer alone and open said nothing.
#[test]
fn a_uv_layer_whose_interpreter_the_owner_cannot_run_is_reported() {
    let owner = user_a();
    let d = Daemon::start();
    open_the_way(&d);
    chmod(&d.root, 0o755);
    let uv_lock = "version = 1\nrequires-python = \">=3.8\"\n# interpreter check\n";
    let repo = GitRepo::init(&d.base.join("py"));
    repo.write(
        "pyproject.toml",
        "[project]\nname = \"p\"\nversion = \"0.1.0\"\n",
    );
    repo.write("uv.lock", uv_lock);
    repo.write(".gitignore", ".venv/\n");
    repo.commit_all("py", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().expect("utf8")]);
    d.cli_ok([
        "mirror",
        "access",
        "p",
        "--allow-user",
        &owner.uid.to_string(),
    ]);
    // The interpreter: the host's python3, reached through a directory only root can search.
    let private = d.base.join("private");
    let interp = private.join("bin/python3");
    fs::create_dir_all(interp.parent().expect("parent")).expect("mkdir");
    std::os::unix::fs::symlink("/usr/bin/python3", &interp).expect("symlink python3");
    chmod(&private, 0o700);
    // A built uv layer for this lockfile, sealed by hand: bin/python names that interpreter,
    // bin/python3 is a link to python (as uv makes them).
    let deps = d.state.join("deps");
    let store = deps.join("store.git");
    if !store.exists() {
        fs::create_dir_all(&deps).expect("mkdir deps");
        g(&deps, &["init", "-q", "--bare", "store.git"]);
    }
    let files = d.base.join("uvlayer/.venv");
    write_file(
        &files.join("pyvenv.cfg"),
        b"home = /usr/bin\nrelocatable = true\n",
        0o644,
    );
    fs::create_dir_all(files.join("bin")).expect("mkdir bin");
    std::os::unix::fs::symlink(&interp, files.join("bin/python")).expect("symlink");
    std::os::unix::fs::symlink("python", files.join("bin/python3")).expect("symlink");
    let index = d.base.join("uvlayer.index");
    g_bare(
        &store,
        Some(&index),
        Some(&files),
        &["add", "-f", "-A", "."],
    );
    let tree = g_bare(&store, Some(&index), Some(&files), &["write-tree"]);
    let key = layer_key("uv", "0.9", uv_lock.as_bytes());
    let record = serde_json::json!({
        "key": key, "manager": "uv", "manager_version": "0.9.0", "built_at": 1_700_000_000u64,
        "state": "built", "bytes": 60, "files": 3,
        "layer": {"key": key, "manager": "uv", "path": ".venv", "tree": tree,
                  "lockfile_hash": blake3::hash(uv_lock.as_bytes()).to_hex().to_string()},
    });
    fs::create_dir_all(deps.join("layers")).expect("mkdir");
    fs::write(deps.join(format!("layers/{key}.json")), record.to_string()).expect("write record");

    let out = d.cli_as(owner, &["open", "py", "--project", "p"]);
    out.assert_ok();
    assert!(
        out.stderr_str().contains("uv layer .venv") && out.stderr_str().contains("cannot run"),
        "open said nothing: {}",
        out.describe()
    );
    let ws = d.mount("py");
    // What the owner meets in the workspace (through a shell: setpriv itself finds the program
    // before it drops root's rights).
    let run_python = format!("{}/.venv/bin/python -c 'print(1)'", ws.display());
    let ran = run(as_user(owner, "sh").arg("-c").arg(&run_python), CMD_TIMEOUT);
    assert!(
        !ran.success() && ran.stderr_str().contains("Permission denied"),
        "{}",
        ran.describe()
    );
    let s = d.cli_as(owner, &["status", "py", "--json"]);
    s.assert_ok();
    let s = parse_json("status", &s.stdout_str());
    let lines = s["dependencies"].to_string();
    assert!(
        lines.contains("uv layer .venv")
            && lines.contains(&interp.display().to_string())
            && lines.contains("cannot run"),
        "{s}"
    );
    let text = d.cli_as(owner, &["status", "py"]);
    assert!(
        text.stdout_str().contains("dependencies:  uv layer .venv"),
        "{}",
        text.describe()
    );
    // Reachable now: the owner runs it, and status has nothing to say.
    chmod(&private, 0o755);
    let ran = run(as_user(owner, "sh").arg("-c").arg(&run_python), CMD_TIMEOUT);
    assert!(ran.success(), "{}", ran.describe());
    let s = d.cli_as(owner, &["status", "py", "--json"]);
    let s = parse_json("status", &s.stdout_str());
    assert_eq!(s["dependencies"].as_array().map(Vec::len), Some(0), "{s}");
    // Reachable through a supplementary group of the owner only (not their primary one): their
    // login, which has that group, runs it, and status has nothing to say either. Before, the
    // check walked the path with the daemon's groups and asked the primary group only: "cannot
    // run (…/bin/python3: Permission denied)".
    let sup = supplementary_group("octofs-test-sup", "octofs-test-user");
    std::os::unix::fs::chown(&private, Some(0), Some(sup)).expect("chown");
    chmod(&private, 0o750);
    let ran = run(
        as_user_in(owner, &[sup], "sh").arg("-c").arg(&run_python),
        CMD_TIMEOUT,
    );
    assert!(ran.success(), "{}", ran.describe());
    let s = d.cli_as(owner, &["status", "py", "--json"]);
    let s = parse_json("status", &s.stdout_str());
    assert_eq!(s["dependencies"].as_array().map(Vec::len), Some(0), "{s}");
    d.cli_as(owner, &["release", "py", "--force"]).assert_ok();
}

/// The gid of local group `group`, made (a system group) when missing, with `user` a member of it
/// as a supplementary group. Tolerates another test's concurrent `groupadd`/`usermod`.
fn supplementary_group(group: &str, user: &str) -> u32 {
    for attempt in 0..20 {
        let _ = try_run(
            Command::new("groupadd").args(["-f", "--system", group]),
            CMD_TIMEOUT,
        );
        let _ = try_run(
            Command::new("usermod").args(["-a", "-G", group, user]),
            CMD_TIMEOUT,
        );
        let member = try_run(Command::new("id").args(["-Gn", user]), CMD_TIMEOUT)
            .is_ok_and(|o| o.stdout_str().split_whitespace().any(|g| g == group));
        let gid = try_run(Command::new("getent").args(["group", group]), CMD_TIMEOUT)
            .ok()
            .and_then(|o| o.stdout_str().split(':').nth(2)?.trim().parse().ok());
        if let (true, Some(gid)) = (member, gid) {
            return gid;
        }
        std::thread::sleep(Duration::from_millis(50 * attempt));
    }
    panic!("cannot make {user} a member of group {group}");
}
