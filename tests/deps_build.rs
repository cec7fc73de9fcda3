//! Dependency layers, the build side, against the real npm registry and PyPI: `mirror add` builds
//! the default branch's layers (npm, pnpm, uv) and seals each as a tree of node_modules' (or
//! .venv's) children in `<state>/deps/store.git`; a failing install is recorded as failed with the
//! manager's reason and never fails `mirror add`; `deps gc` removes what nothing uses and keeps
//! what a workspace or a mirror's tip needs.
//!
//! pnpm and uv are required (scripts/ensure-deps installs them from their registry packages): a
//! host without them fails these tests, it does not skip them.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{DATE1, DATE2, Daemon, GitRepo, extract_archive, parse_json, run};

/// A build talks to a registry: generous, and still bounded.
const BUILD: Duration = Duration::from_secs(600);

#[track_caller]
fn require(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed: run scripts/ensure-deps (it installs pnpm with npm and uv with pip)"
    );
}

/// Runs a package manager in `dir` (to make a lockfile), asserting success.
#[track_caller]
fn tool(dir: &Path, argv: &[&str]) {
    let out = run(
        Command::new(argv[0])
            .args(&argv[1..])
            .current_dir(dir)
            .env("UV_PYTHON_DOWNLOADS", "never"),
        BUILD,
    );
    out.assert_ok();
}

fn layers(d: &Daemon) -> Vec<serde_json::Value> {
    let v = parse_json("deps list", &d.cli_ok(["deps", "list", "--json"]));
    v.as_array().expect("an array of layers").clone()
}

/// `git ls-tree -r` of a tree of the layer store: "mode path" lines.
fn ls_tree(d: &Daemon, tree: &str) -> Vec<String> {
    let store = d.state.join("deps/store.git");
    let out = common::sh(
        "git",
        [
            "--git-dir",
            store.to_str().expect("utf-8 path"),
            "ls-tree",
            "-r",
            "--full-tree",
            tree,
        ],
    );
    out.assert_ok();
    out.stdout_str()
        .lines()
        .map(|l| {
            let (meta, path) = l.split_once('\t').expect("ls-tree line");
            format!("{} {path}", meta.split(' ').next().unwrap_or(""))
        })
        .collect()
}

fn the_built_layer(d: &Daemon, manager: &str) -> serde_json::Value {
    let all = layers(d);
    let l = all
        .iter()
        .find(|l| l["manager"] == manager)
        .unwrap_or_else(|| panic!("no {manager} layer in {all:?}\n{}", d.log_tail()))
        .clone();
    assert_eq!(l["state"], "built", "{l}\n{}", d.log_tail());
    assert!(l["files"].as_u64().unwrap_or(0) > 0, "{l}");
    assert!(l["bytes"].as_u64().unwrap_or(0) > 0, "{l}");
    let key = l["key"].as_str().expect("key");
    assert_eq!(key.len(), 64, "{l}");
    // The ref keeps the sealed tree alive, and names a commit of exactly that tree.
    let store = d.state.join("deps/store.git");
    let out = common::sh(
        "git",
        [
            "--git-dir",
            store.to_str().expect("utf-8 path"),
            "rev-parse",
            &format!("refs/layers/{key}^{{tree}}"),
        ],
    );
    out.assert_ok();
    assert_eq!(out.stdout_str().trim(), l["tree"].as_str().expect("tree"));
    // Nothing is left in staging.
    let staging = d.state.join("deps/staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "staging not cleaned: {left:?}");
    l
}

fn npm_project(dir: &Path, deps: &str) -> GitRepo {
    let repo = GitRepo::init(dir);
    repo.write(
        "package.json",
        format!(r#"{{"name":"demo","version":"1.0.0","private":true,"dependencies":{{{deps}}}}}"#),
    );
    repo
}

#[test]
fn npm_layer_is_built_at_mirror_add_and_sealed_as_node_modules_children() {
    let d = Daemon::start();
    let repo = npm_project(&d.base.join("up"), r#""is-number":"7.0.0""#);
    tool(
        &repo.path,
        &[
            "npm",
            "install",
            "--package-lock-only",
            "--no-audit",
            "--no-fund",
        ],
    );
    repo.write(".gitignore", "node_modules/\n");
    repo.commit_all("npm project", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        BUILD,
    );
    out.assert_ok();
    // Not a terminal: no progress lines, no warning.
    assert!(!out.stderr_str().contains("building"), "{}", out.describe());
    let l = the_built_layer(&d, "npm");
    assert_eq!(l["path"], "node_modules");
    assert_eq!(l["users"], serde_json::json!([]));
    let entries = ls_tree(&d, l["tree"].as_str().expect("tree"));
    assert!(
        entries.contains(&"100644 is-number/package.json".to_string()),
        "{entries:?}"
    );
    assert!(
        !entries.iter().any(|e| e.contains("node_modules/")),
        "{entries:?}"
    );
    // The record says how the key was made: npm's version, and the lockfile's hash.
    let rec: serde_json::Value = parse_json(
        "layer record",
        &std::fs::read_to_string(
            d.state
                .join("deps/layers")
                .join(format!("{}.json", l["key"].as_str().expect("key"))),
        )
        .expect("layer record"),
    );
    let lock = std::fs::read(repo.path.join("package-lock.json")).expect("lockfile");
    assert_eq!(
        rec["layer"]["lockfile_hash"],
        blake3::hash(&lock).to_hex().to_string()
    );
    // A second build of the same commit builds nothing.
    let again = d.cli_ok(["deps", "build", "p"]);
    assert!(again.contains("up to date"), "{again}");
    // And a sync of an unchanged mirror neither.
    let before = std::fs::metadata(
        d.state
            .join("deps/logs")
            .join(format!("{}.log", l["key"].as_str().expect("key"))),
    )
    .and_then(|m| m.modified())
    .expect("log");
    d.cli_ok(["mirror", "sync", "p"]);
    let after = std::fs::metadata(
        d.state
            .join("deps/logs")
            .join(format!("{}.log", l["key"].as_str().expect("key"))),
    )
    .and_then(|m| m.modified())
    .expect("log");
    assert_eq!(before, after, "an unchanged layer was built again");
}

#[test]
fn pnpm_layer_keeps_its_symlinks_and_not_the_staging_path() {
    require("pnpm");
    let d = Daemon::start();
    let repo = npm_project(&d.base.join("up"), r#""is-number":"7.0.0""#);
    tool(&repo.path, &["pnpm", "install", "--lockfile-only"]);
    assert!(repo.path.join("pnpm-lock.yaml").exists());
    repo.commit_all("pnpm project", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        BUILD,
    );
    out.assert_ok();
    let l = the_built_layer(&d, "pnpm");
    assert_eq!(l["path"], "node_modules");
    let entries = ls_tree(&d, l["tree"].as_str().expect("tree"));
    assert!(
        entries.contains(&"120000 is-number".to_string()),
        "{entries:?}"
    );
    assert!(
        entries.contains(
            &"100644 .pnpm/is-number@7.0.0/node_modules/is-number/package.json".to_string()
        ),
        "{entries:?}"
    );
    // pnpm's workspace state names the staging path: it is not sealed.
    assert!(
        !entries.iter().any(|e| e.contains(".pnpm-workspace-state")),
        "{entries:?}"
    );
}

#[test]
fn uv_layer_is_a_relocatable_venv_whose_console_scripts_run_where_it_is_presented() {
    require("uv");
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    repo.write(
        "pyproject.toml",
        "[project]\nname = \"demo\"\nversion = \"0.1.0\"\nrequires-python = \">=3.8\"\n\
         dependencies = [\"iniconfig==2.0.0\", \"pyflakes==3.2.0\"]\n",
    );
    tool(&repo.path, &["uv", "lock"]);
    repo.commit_all("uv project", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        BUILD,
    );
    out.assert_ok();
    let l = the_built_layer(&d, "uv");
    assert_eq!(l["path"], ".venv");
    let entries = ls_tree(&d, l["tree"].as_str().expect("tree"));
    assert!(
        entries.contains(&"100755 bin/pyflakes".to_string()),
        "{entries:?}"
    );
    assert!(
        entries
            .iter()
            .any(|e| e.ends_with("site-packages/iniconfig/__init__.py")),
        "{entries:?}"
    );
    // Presented somewhere else than where it was built, the venv is that place's.
    let at = d.base.join("elsewhere/.venv");
    extract_archive(
        &d.state.join("deps/store.git"),
        l["tree"].as_str().expect("tree"),
        &at,
    );
    let cfg = std::fs::read_to_string(at.join("pyvenv.cfg")).expect("pyvenv.cfg");
    assert!(cfg.contains("relocatable = true"), "{cfg}");
    let prefix = run(
        Command::new(at.join("bin/python"))
            .args(["-c", "import iniconfig, sys; print(sys.prefix)"]),
        Duration::from_secs(60),
    );
    prefix.assert_ok();
    assert_eq!(prefix.stdout_str().trim(), at.to_str().expect("utf-8"));
    // The console script runs this venv's interpreter: pyflakes finds the problem in a file.
    std::fs::write(d.base.join("bad.py"), "import os\n").expect("write");
    let flakes = run(
        Command::new(at.join("bin/pyflakes")).arg(d.base.join("bad.py")),
        Duration::from_secs(60),
    );
    assert!(
        flakes.stdout_str().contains("'os' imported but unused"),
        "{}",
        flakes.describe()
    );
}

#[test]
fn a_failing_install_is_recorded_with_its_reason_and_mirror_add_succeeds() {
    let d = Daemon::start();
    let repo = npm_project(
        &d.base.join("up"),
        r#""octofs-no-such-package-zz9":"1.0.0""#,
    );
    repo.write(
        "package-lock.json",
        r#"{"name":"demo","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{"":{"name":"demo","version":"1.0.0","dependencies":{"octofs-no-such-package-zz9":"1.0.0"}},"node_modules/octofs-no-such-package-zz9":{"version":"1.0.0","resolved":"https://registry.npmjs.org/octofs-no-such-package-zz9/-/octofs-no-such-package-zz9-1.0.0.tgz"}}}"#,
    );
    repo.commit_all("broken lockfile", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        BUILD,
    );
    out.assert_ok();
    let err = out.stderr_str();
    assert!(
        err.contains("warning: dependency npm layer for package-lock.json: failed"),
        "{}",
        out.describe()
    );
    let all = layers(&d);
    assert_eq!(all.len(), 1, "{all:?}");
    let l = &all[0];
    assert_eq!(l["state"], "failed", "{l}");
    let message = l["message"].as_str().expect("message");
    assert!(
        message.contains("404") && message.contains("octofs-no-such-package-zz9"),
        "not the manager's reason: {message}"
    );
    let log = l["log"].as_str().expect("log");
    assert!(
        err.contains(log),
        "the warning does not name the log: {err}"
    );
    let text = std::fs::read_to_string(log).expect("log");
    assert!(text.contains("npm install"), "{text}");
    // `deps build` tries again, and says why it failed.
    let again = run(d.command().args(["deps", "build", "p"]), BUILD);
    again.assert_failed();
    assert!(
        again.stdout_str().contains("failed after"),
        "{}",
        again.describe()
    );
    // The mirror is usable.
    d.cli_ok(["mirror", "list"]);
}

#[test]
fn gc_removes_an_unused_layer_and_keeps_a_used_one_and_the_tips() {
    let d = Daemon::start();
    let repo = npm_project(&d.base.join("up"), r#""is-number":"7.0.0""#);
    let up = repo.path.to_str().expect("utf-8").to_string();
    let mut keys = Vec::new();
    for (i, version) in ["7.0.0", "6.0.0", "5.0.0"].iter().enumerate() {
        repo.write(
            "package.json",
            format!(
                r#"{{"name":"demo","version":"1.0.0","private":true,"dependencies":{{"is-number":"{version}"}}}}"#
            ),
        );
        tool(
            &repo.path,
            &[
                "npm",
                "install",
                "--package-lock-only",
                "--no-audit",
                "--no-fund",
            ],
        );
        repo.commit_all(&format!("is-number {version}"), DATE2);
        let args: Vec<&str> = if i == 0 {
            vec!["mirror", "add", "p", &up]
        } else {
            vec!["mirror", "sync", "p"]
        };
        run(d.command().args(&args), BUILD).assert_ok();
        let all = layers(&d);
        assert_eq!(all.len(), i + 1, "{all:?}");
        let new = all
            .iter()
            .find(|l| !keys.contains(&l["key"]))
            .expect("a new layer")
            .clone();
        assert_eq!(new["state"], "built", "{new}\n{}", d.log_tail());
        keys.push(new["key"].clone());
    }
    let l = layers(&d);
    let tree_of = |key: &serde_json::Value| {
        l.iter().find(|x| x["key"] == *key).expect("layer")["tree"]
            .as_str()
            .expect("tree")
            .to_string()
    };
    let (used, unused, tip) = (&keys[0], &keys[1], &keys[2]);
    let unused_tree = tree_of(unused);
    // A workspace record that holds the first layer.
    let ws = d.state.join("workspaces/holder");
    std::fs::create_dir_all(&ws).expect("mkdir");
    let used_layer = serde_json::json!({
        "key": used, "manager": "npm", "path": "node_modules", "tree": tree_of(used),
        "lockfile_hash": "0",
    });
    let record = serde_json::json!({
        "thread": "holder", "project": "p", "base_commit": repo.head(), "base_tree": "0".repeat(40),
        "base_time": 0, "requested_ref": null, "branch": null, "created": 0, "mounted": false,
        "layers": [used_layer],
    });
    std::fs::write(ws.join("workspace.json"), record.to_string()).expect("write record");
    let listed = layers(&d);
    let holder = listed
        .iter()
        .find(|x| x["key"] == *used)
        .expect("used layer");
    assert_eq!(holder["users"], serde_json::json!(["holder"]));

    let gc = parse_json("deps gc", &d.cli_ok(["deps", "gc", "--json"]));
    let removed: Vec<&serde_json::Value> = gc["removed"]
        .as_array()
        .expect("removed")
        .iter()
        .map(|r| &r["key"])
        .collect();
    assert_eq!(removed, vec![unused], "{gc}");
    assert_eq!(gc["kept"], 2, "{gc}");
    assert!(gc["freed_bytes"].as_u64().unwrap_or(0) > 0, "{gc}");
    let left: Vec<serde_json::Value> = layers(&d).into_iter().map(|l| l["key"].clone()).collect();
    assert!(
        left.contains(used) && left.contains(tip) && !left.contains(unused),
        "{left:?}"
    );
    // The unused layer's objects are gone from the store; the others' are there.
    let store = d.state.join("deps/store.git");
    let exists = |tree: &str| {
        common::sh(
            "git",
            [
                "--git-dir",
                store.to_str().expect("utf-8"),
                "cat-file",
                "-e",
                tree,
            ],
        )
        .success()
    };
    assert!(!exists(&unused_tree), "the unused tree survived gc");
    assert!(exists(&tree_of(used)) && exists(&tree_of(tip)));
    assert!(
        !d.state
            .join("deps/logs")
            .join(format!("{}.log", unused.as_str().expect("key")))
            .exists()
    );
}

/// A dependency on a root-only repository of the host (`git+file://`): refused before npm runs,
/// with the dependency named in the record, `deps list` and the log; nothing of the repository
/// is sealed, nothing is cloned.
#[test]
fn a_git_file_dependency_on_a_root_only_repo_is_refused_and_nothing_of_it_is_sealed() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    // Root's secret repository: 0700, as /root is.
    let secret_dir = d.base.join("root-only");
    std::fs::create_dir(&secret_dir).expect("mkdir");
    let secret = GitRepo::init(&secret_dir.join("secret-repo"));
    secret.write("package.json", r#"{"name":"secret","version":"1.0.0"}"#);
    secret.write("key.txt", "octofs-root-secret-4242\n");
    let commit = secret.commit_all("secret", DATE1);
    std::fs::set_permissions(&secret_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let url = format!("git+file://{}", secret.path.display());
    let repo = npm_project(&d.base.join("up"), &format!(r#""secret":"{url}""#));
    repo.write(
        "package-lock.json",
        format!(
            r#"{{"name":"demo","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{{"":{{"name":"demo","version":"1.0.0","dependencies":{{"secret":"{url}"}}}},"node_modules/secret":{{"version":"1.0.0","resolved":"{url}#{commit}"}}}}}}"#
        ),
    );
    repo.commit_all("a git+file dependency", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        BUILD,
    );
    out.assert_ok();
    let all = layers(&d);
    assert_eq!(all.len(), 1, "{all:?}");
    let l = &all[0];
    assert_eq!(l["state"], "failed", "{l}\n{}", d.log_tail());
    let message = l["message"].as_str().expect("message");
    assert!(
        message.contains("refused")
            && message.contains("\"secret\"")
            && message.contains(&url)
            && !message.contains('\n'),
        "the refusal does not name the dependency: {message}"
    );
    let listed = d.cli_ok(["deps", "list"]);
    assert!(listed.contains(&url), "deps list: {listed}");
    let log = std::fs::read_to_string(l["log"].as_str().expect("log")).expect("log");
    assert!(log.contains(message), "{log}");
    // Nothing ran: no npm command in the log.
    assert!(!log.contains("$ npm"), "npm ran: {log}");
    // Nothing of the repository is in the layer store.
    let store = d.state.join("deps/store.git");
    if store.exists() {
        let objects = common::sh(
            "git",
            [
                "--git-dir",
                store.to_str().expect("utf-8"),
                "cat-file",
                "--batch-all-objects",
                "--batch",
            ],
        );
        assert!(
            !objects.stdout_str().contains("octofs-root-secret-4242"),
            "the secret was sealed"
        );
    }
    // The workspace opens without the layer.
    let ws = d.open_thread("t1", &["--project", "p"]);
    assert!(!ws.join("node_modules").exists());
    assert!(ws.join("package.json").is_file());
    d.cli_ok(["release", "t1"]);
}

/// A layer that needs no registry (an npm workspace package, linked) builds in the sandbox: the
/// log says which uid ran npm, and what the install wrote was that uid's; `<state>/deps` stays
/// 0700 root with one search entry for it, and nothing else of the state gains one.
#[test]
fn a_registry_free_layer_builds_as_the_build_user() {
    use std::os::unix::fs::MetadataExt;
    let d = Daemon::start();
    let repo = GitRepo::init(&d.base.join("up"));
    repo.write(
        "package.json",
        r#"{"name":"demo","version":"1.0.0","private":true,"workspaces":["packages/a"]}"#,
    );
    repo.write(
        "packages/a/package.json",
        r#"{"name":"a","version":"1.0.0"}"#,
    );
    repo.write(
        "package-lock.json",
        r#"{"name":"demo","version":"1.0.0","lockfileVersion":3,"requires":true,"packages":{"":{"name":"demo","version":"1.0.0","workspaces":["packages/a"]},"node_modules/a":{"resolved":"packages/a","link":true},"packages/a":{"version":"1.0.0"}}}"#,
    );
    repo.write(".gitignore", "node_modules/\n");
    repo.commit_all("npm workspace", DATE1);
    let out = run(
        d.command()
            .args(["mirror", "add", "p", repo.path.to_str().expect("utf-8")]),
        BUILD,
    );
    out.assert_ok();
    let l = the_built_layer(&d, "npm");
    let entries = ls_tree(&d, l["tree"].as_str().expect("tree"));
    assert!(entries.contains(&"120000 a".to_string()), "{entries:?}");
    let log = std::fs::read_to_string(
        d.state
            .join("deps/logs")
            .join(format!("{}.log", l["key"].as_str().expect("key"))),
    )
    .expect("log");
    // The build user: `octofs-build` where scripts/install made it, else 65533; never root.
    let uid: u32 = log
        .lines()
        .find_map(|l| l.strip_prefix("octofs: running as uid "))
        .and_then(|l| l.split(' ').next())
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no build user in the log: {log}"));
    assert_ne!(uid, 0, "{log}");
    assert!(log.contains("in the build sandbox"), "{log}");
    let deps = std::fs::metadata(d.state.join("deps")).expect("deps");
    assert_eq!((deps.uid(), deps.mode() & 0o707), (0, 0o700));
    let cache = std::fs::metadata(d.state.join("deps/cache/npm")).expect("npm cache");
    assert_eq!((cache.uid(), cache.mode() & 0o777), (uid, 0o700));
    for private in ["deps/layers", "deps/logs", "mirrors"] {
        let m = std::fs::metadata(d.state.join(private)).expect(private);
        assert_eq!(m.mode() & 0o777, 0o700, "{private}");
    }
    // As the build user: `<state>/deps/logs` and the mirrors stay unreadable.
    let probe = run(
        Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={}", cache.gid()))
            .args(["--clear-groups", "sh", "-c"])
            .arg(format!(
                "ls {s}/deps/logs || echo logs-refused; ls {s}/mirrors || echo mirrors-refused; \
                 ls {s}/deps || echo deps-unlisted",
                s = d.state.display()
            )),
        Duration::from_secs(30),
    );
    let text = probe.stdout_str();
    for refused in ["logs-refused", "mirrors-refused", "deps-unlisted"] {
        assert!(text.contains(refused), "{refused}: {}", probe.describe());
    }
}
