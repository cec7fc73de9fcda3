//! Issue 10, "Root code execution from a workspace" and the snapshot's data loss (docs/security.md,
//! the trust model): the daemon (root) never runs anything a workspace's repository configures, and a
//! snapshot keeps every name, checked through real mounts with real git.
//!
//! 0. [`a_workspace_fsmonitor_never_runs`]: the report itself.
//! 1. [`hostile_settings_in_git_config_run_nothing`] and
//!    [`hostile_settings_through_includes_run_nothing`]: every kind of setting git runs a command
//!    from (fsmonitor, hooks by `core.hooksPath` and in `.git/hooks`, `url.*.insteadOf` to `ext::`,
//!    filters and diff drivers by `.gitattributes`, `.git/info/attributes` and
//!    `core.attributesFile`, pagers, editors, helpers, `gpg.program`, `uploadpack.packObjectsHook`,
//!    ...) plus host paths (`core.worktree`, `core.excludesFile`), in `.git/config` or through
//!    `include.path`/`includeIf`, each writing a marker outside the workspace. `snapshot`, `diff
//!    --patch`, `release` and `open` (resume) write no marker; the snapshot is still what `git add
//!    -A` makes (untracked files in, ignored files out), and the agent's commits (one packed, one
//!    loose) are in the mirror, HEAD again after the resume.
//! 2. [`add_all_edge_cases_match_git`]: the in-process `git add -A` against git itself on a copy:
//!    a split index, a symlinked `.gitignore`, re-includes below an excluded directory, precedence
//!    of `.gitignore` over `.git/info/exclude`, nested repositories, intent-to-add entries.
//! 3. [`snapshot_keeps_non_utf8_names_and_paths_longer_than_path_max`].
//! 4. [`a_planted_object_never_reaches_the_mirror`]: an object whose content is not its id.
//! 5. [`snapshot_of_a_thousand_new_files`]: matches git, and prints its time.
//! 6. [`an_agents_large_commit_is_carried_in_bounded_memory`]: a 256 MiB committed blob.

use crate::common;

use common::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Timeout for one in-process batch of file operations on a mount.
const FS_TIMEOUT: Duration = Duration::from_secs(60);

#[track_caller]
fn fsop<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    with_timeout(what, FS_TIMEOUT, f)
}

/// Runs git in `dir` (never a workspace holding hostile settings), asserting success.
#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// A project whose upstream has a few files and a `.gitignore`.
#[track_caller]
fn project(d: &Daemon, name: &str, gitignore: &str) -> GitRepo {
    let up = GitRepo::init(&d.base.join(format!("up-{name}")));
    up.write("README.md", "# demo\n");
    up.write("src/lib.rs", "pub fn f() {}\n");
    up.write("docs/guide.md", "guide\n");
    up.write(".gitignore", gitignore);
    up.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", name, up.path.to_str().unwrap()]);
    up
}

/// `git add -A` + `git write-tree` on a `cp -a` copy of `mount`, into a scratch copy of its index.
/// `config`: the `.git/config` the copy gets instead of the workspace's, its hooks and
/// `info/attributes` removed (the reference run must not run the hostile settings either).
#[track_caller]
fn native_tree(mount: &Path, scratch: &Path, config: Option<&[u8]>) -> String {
    let copy = scratch.join("copy");
    let _ = fs::remove_dir_all(&copy);
    run(
        Command::new("cp").arg("-a").arg(mount).arg(&copy),
        CMD_TIMEOUT,
    )
    .assert_ok();
    if let Some(config) = config {
        fs::write(copy.join(".git/config"), config).unwrap();
        for d in [".git/hooks", ".git/evil-hooks"] {
            let _ = fs::remove_dir_all(copy.join(d));
        }
        let _ = fs::remove_file(copy.join(".git/info/attributes"));
    }
    let index = scratch.join("scratch-index");
    fs::copy(copy.join(".git/index"), &index).expect("copy index");
    let git = |args: &[&str]| {
        let out = run(
            git_command(&copy, DATE1)
                .env("GIT_INDEX_FILE", &index)
                .args([
                    "-c",
                    "core.fsmonitor=false",
                    "-c",
                    "core.untrackedCache=false",
                    "-c",
                    "core.hooksPath=/nonexistent",
                ])
                .args(args),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        out.stdout_str().trim().to_string()
    };
    git(&["add", "-A"]);
    git(&["write-tree"])
}

fn tree_of(repo: &Path, commit: &str) -> String {
    g(repo, &["rev-parse", &format!("{commit}^{{tree}}")])
}

fn tree_diff(repo: &Path, a: &str, b: &str) -> String {
    let out = run(
        git_command(repo, DATE1).args(["diff-tree", "-r", "--no-renames", a, b]),
        CMD_TIMEOUT,
    );
    format!("{}{}", out.stdout_str(), out.stderr_str())
}

/// The markers written so far (each one a command a workspace made the daemon run).
fn markers(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[track_caller]
fn assert_no_marker(dir: &Path, after: &str, d: &Daemon) {
    let m = markers(dir);
    assert!(
        m.is_empty(),
        "after {after}, the daemon ran commands the workspace configured (markers {m:?} in {})\n\
         --- daemon log ---\n{}",
        dir.display(),
        d.log_tail()
    );
}

/// The hooks git knows (client and server side).
const HOOKS: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "post-index-change",
];

/// Every setting git runs a command from (each touching `<markers>/pwned-<name>`), and host paths
/// for the worktree, excludes and attributes.
fn hostile_settings(m: &Path, hooks: &Path, host: &Path) -> String {
    let t = |name: &str| format!("touch {}/pwned-{name}", m.display());
    let ext = |name: &str| format!("ext::sh -c touch% {}/pwned-{name}% #", m.display());
    format!(
        r#"[core]
	fsmonitor = {fsmonitor}
	fsmonitorHookVersion = 2
	hooksPath = {hooks}
	sshCommand = {ssh}
	gitProxy = {proxy}
	alternateRefsCommand = {altrefs}
	askPass = {askpass}
	editor = {editor}
	pager = {pager}
	worktree = {host}/elsewhere
	excludesFile = {host}/excludes
	attributesFile = {host}/attributes
[protocol]
	allow = always
[protocol "ext"]
	allow = always
[url "{ext_push}"]
	pushInsteadOf = /
[url "{ext_fetch}"]
	insteadOf = /
[remote "origin"]
	uploadpack = {uploadpack}
	receivepack = {receivepack}
[filter "evil"]
	clean = {clean}; cat
	smudge = {smudge}; cat
	process = {process}
[diff]
	external = {external}
	tool = evil
[difftool "evil"]
	cmd = {difftool}
[diff "evil"]
	textconv = {textconv}; cat
	command = {diffcommand}
[merge "evil"]
	driver = {mergedriver}
[credential]
	helper = !{credential}
[gpg]
	program = {gpg}
[gpg "ssh"]
	program = {gpgssh}
[commit]
	gpgSign = true
[tag]
	gpgSign = true
[uploadpack]
	packObjectsHook = {packhook}
[sequence]
	editor = {seqeditor}
[pager]
	diff = {pagerdiff}
	log = {pagerlog}
[interactive]
	diffFilter = {difffilter}
"#,
        fsmonitor = t("fsmonitor"),
        hooks = hooks.display(),
        ssh = t("sshcommand"),
        proxy = t("gitproxy"),
        altrefs = t("alternaterefscommand"),
        askpass = t("askpass"),
        editor = t("editor"),
        pager = t("pager"),
        host = host.display(),
        ext_push = ext("pushinsteadof"),
        ext_fetch = ext("insteadof"),
        uploadpack = t("uploadpack"),
        receivepack = t("receivepack"),
        clean = t("filter-clean"),
        smudge = t("filter-smudge"),
        process = t("filter-process"),
        external = t("diff-external"),
        difftool = t("difftool"),
        textconv = t("textconv"),
        diffcommand = t("diff-command"),
        mergedriver = t("merge-driver"),
        credential = t("credential-helper"),
        gpg = t("gpg-program"),
        gpgssh = t("gpg-ssh-program"),
        packhook = t("packobjectshook"),
        seqeditor = t("sequence-editor"),
        pagerdiff = t("pager-diff"),
        pagerlog = t("pager-log"),
        difffilter = t("interactive-difffilter"),
    )
}

/// How the hostile settings reach the workspace's configuration.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    GitConfig,
    Includes,
}

/// The scenario of [`hostile_settings_in_git_config_run_nothing`], with the settings put `via`.
fn hostile_scenario(via: Via) {
    let d = Daemon::start();
    project(&d, "p", "*.log\n/build/\n");
    let mirror = d.mirror("p");
    let t = "hostile";
    let ws = d.open_thread(t, &["--project", "p"]);
    let m = d.base.join("markers");
    fs::create_dir(&m).unwrap();
    let host = d.base.join("host");
    // Host files the settings point at: a worktree with a file of its own, excludes that would
    // leave every .txt out, attributes that would run the filter on everything.
    write_file(
        &host.join("elsewhere/planted.txt"),
        b"from the host\n",
        0o644,
    );
    write_file(&host.join("excludes"), b"*.txt\n", 0o644);
    write_file(
        &host.join("attributes"),
        b"* filter=evil diff=evil merge=evil\n",
        0o644,
    );

    // The agent's own work: two commits (the first one packed, the second loose).
    let w = ws.clone();
    fsop("first commit's files", move || {
        write_file(&w.join("agent/one.txt"), b"first agent commit\n", 0o644);
    });
    g(&ws, &["add", "agent/one.txt"]);
    g(&ws, &["commit", "-q", "-m", "agent commit 1"]);
    g(&ws, &["repack", "-d", "-q"]);
    let w = ws.clone();
    fsop("second commit's files", move || {
        write_file(&w.join("agent/two.txt"), b"second agent commit\n", 0o644);
        write_file(
            &w.join("README.md"),
            b"# demo, edited and committed\n",
            0o644,
        );
    });
    g(&ws, &["add", "-A"]);
    g(&ws, &["commit", "-q", "-m", "agent commit 2"]);
    let agent_head = g(&ws, &["rev-parse", "HEAD"]);
    let benign_config = fs::read(ws.join(".git/config")).unwrap();
    // From here on, no git runs in the workspace: it would run the hostile settings itself.

    // Uncommitted work: untracked files, ignored files, edits.
    let w = ws.clone();
    fsop("uncommitted work", move || {
        write_file(&w.join("new/untracked.txt"), b"untracked, kept\n", 0o644);
        write_file(&w.join("notes.txt"), b"untracked, kept\n", 0o644);
        write_file(&w.join("x.log"), b"ignored\n", 0o644);
        write_file(&w.join("build/out.o"), b"ignored directory\n", 0o644);
        write_file(
            &w.join("src/lib.rs"),
            b"pub fn f() { /* edited */ }\n",
            0o644,
        );
        write_file(
            &w.join(".gitattributes"),
            b"* filter=evil diff=evil merge=evil\n",
            0o644,
        );
    });

    // The hostile repository configuration.
    let hooks = ws.join(".git/evil-hooks");
    let settings = hostile_settings(&m, &hooks, &host);
    let w = ws.clone();
    let mm = m.clone();
    fsop("hostile settings", move || {
        for (dir, prefix) in [(".git/hooks", "hook"), (".git/evil-hooks", "hookspath")] {
            for h in HOOKS {
                write_file(
                    &w.join(dir).join(h),
                    format!("#!/bin/sh\ntouch {}/pwned-{prefix}-{h}\n", mm.display()).as_bytes(),
                    0o755,
                );
            }
        }
        write_file(
            &w.join(".git/info/attributes"),
            b"* filter=evil diff=evil merge=evil\n",
            0o644,
        );
        let mut config = fs::read(w.join(".git/config")).unwrap();
        match via {
            Via::GitConfig => config.extend_from_slice(settings.as_bytes()),
            Via::Includes => {
                write_file(&w.join(".git/evil.inc"), settings.as_bytes(), 0o644);
                write_file(&w.join(".git/evil-if.inc"), settings.as_bytes(), 0o644);
                config.extend_from_slice(
                    b"[include]\n\tpath = evil.inc\n[includeIf \"gitdir:/\"]\n\tpath = evil-if.inc\n",
                );
            }
        }
        fs::write(w.join(".git/config"), config).unwrap();
    });
    assert_no_marker(&m, "setting up", &d);

    // snapshot
    let out = d.cli(["snapshot", t]);
    assert_no_marker(&m, "`octofs snapshot`", &d);
    assert!(out.success(), "snapshot failed: {}", out.describe());
    let s = out.stdout_str().trim().to_string();
    let native = native_tree(&ws, &d.base, Some(&benign_config));
    let ours = tree_of(&mirror, &s);
    assert_eq!(
        ours,
        native,
        "snapshot tree != `git add -A` of a copy (without the hostile settings); diff native → \
         snapshot:\n{}",
        tree_diff(&d.base.join("copy"), &native, &ours)
    );
    let listing = g(&mirror, &["ls-tree", "-r", "--name-only", &s]);
    for p in ["new/untracked.txt", "notes.txt", ".gitattributes"] {
        assert!(
            listing.lines().any(|l| l == p),
            "{p} missing from the snapshot"
        );
    }
    for p in ["x.log", "build/out.o", "planted.txt"] {
        assert!(!listing.lines().any(|l| l == p), "{p} is in the snapshot");
    }
    assert_eq!(
        g(&mirror, &["rev-parse", &format!("{s}^1")]),
        agent_head,
        "the snapshot's first parent is not the agent's HEAD"
    );
    assert_eq!(
        g(&mirror, &["rev-parse", &format!("refs/octomate/heads/{t}")]),
        agent_head,
        "refs/octomate/heads/{t} does not keep the agent's commits"
    );
    g(
        &mirror,
        &["cat-file", "-e", &format!("{agent_head}~1:agent/one.txt")],
    );
    assert_eq!(
        g(&mirror, &["show", &format!("{s}:new/untracked.txt")]),
        "untracked, kept",
        "content went through a filter"
    );

    // diff --patch of the live state
    let out = d.cli(["diff", t, "--patch"]);
    assert!(out.success(), "diff --patch failed: {}", out.describe());
    assert!(
        out.stdout_str().contains("untracked, kept"),
        "diff --patch does not show the new file: {}",
        out.describe()
    );
    assert_no_marker(&m, "`octofs diff --patch`", &d);

    // release (saves again) and resume
    d.cli_ok(["release", t]);
    assert_no_marker(&m, "`octofs release`", &d);
    let ws = d.open_thread(t, &[]);
    assert_no_marker(&m, "`octofs open` (resume)", &d);
    let w = ws.clone();
    let (untracked, ignored) = fsop("read the resumed workspace", move || {
        (
            fs::read(w.join("new/untracked.txt")).ok(),
            fs::symlink_metadata(w.join("x.log")).is_ok(),
        )
    });
    assert_eq!(untracked.as_deref(), Some(&b"untracked, kept\n"[..]));
    assert!(!ignored, "an ignored file came back");
    assert_eq!(
        g(&ws, &["rev-parse", "HEAD"]),
        agent_head,
        "HEAD after resume"
    );
    assert_no_marker(&m, "git in the resumed workspace", &d);
    d.cli_ok(["release", t]);
    let fsck = run(
        git_command(&mirror, DATE1).args(["fsck", "--no-progress", "--connectivity-only"]),
        CMD_TIMEOUT,
    );
    fsck.assert_ok();
}

#[test]
fn a_workspace_fsmonitor_never_runs() {
    // The report of issue 10: `git config core.fsmonitor '<cmd>'` in a workspace, then `octofs
    // snapshot` ran <cmd> as root.
    let d = Daemon::start();
    project(&d, "p", "*.log\n");
    let t = "fsm";
    let ws = d.open_thread(t, &["--project", "p"]);
    let m = d.base.join("markers");
    fs::create_dir(&m).unwrap();
    let marker = m.join("pwned-fsmonitor");
    g(
        &ws,
        &[
            "config",
            "core.fsmonitor",
            &format!("touch {}", marker.display()),
        ],
    );
    let w = ws.clone();
    fsop("a new file", move || {
        write_file(&w.join("new.txt"), b"new\n", 0o644)
    });
    let out = d.cli(["snapshot", t]);
    assert_no_marker(&m, "`octofs snapshot`", &d);
    assert!(out.success(), "snapshot failed: {}", out.describe());
    let s = out.stdout_str().trim().to_string();
    assert_eq!(g(&d.mirror("p"), &["show", &format!("{s}:new.txt")]), "new");
    let out = d.cli(["diff", t]);
    assert_no_marker(&m, "`octofs diff`", &d);
    assert!(out.success(), "diff failed: {}", out.describe());
    d.cli_ok(["release", t]);
    assert_no_marker(&m, "`octofs release`", &d);
}

#[test]
fn hostile_settings_in_git_config_run_nothing() {
    hostile_scenario(Via::GitConfig);
}

#[test]
fn hostile_settings_through_includes_run_nothing() {
    hostile_scenario(Via::Includes);
}

#[test]
fn add_all_edge_cases_match_git() {
    let d = Daemon::start();
    project(
        &d,
        "p",
        "*.log\n/logs/\n/logs2/*\n!/logs2/keep.txt\n*.tmp\n/vendor-repos/\n",
    );
    let mirror = d.mirror("p");
    let t = "edges";
    let ws = d.open_thread(t, &["--project", "p"]);
    // A split index: new entries live in .git/index, the rest in .git/sharedindex.<id>.
    g(&ws, &["config", "core.splitIndex", "true"]);
    g(&ws, &["update-index", "--split-index"]);
    let w = ws.clone();
    fsop("edge cases", move || {
        // Tracked although ignored, added after the split.
        write_file(&w.join("newdir/tracked.log"), b"tracked\n", 0o644);
        write_file(&w.join("newdir/untracked.log"), b"ignored\n", 0o644);
        // A .gitignore that is a symlink is not read (git >= 2.32).
        write_file(&w.join("patterns"), b"*\n", 0o644);
        fs::create_dir_all(w.join("sym")).unwrap();
        std::os::unix::fs::symlink("../patterns", w.join("sym/.gitignore")).unwrap();
        write_file(&w.join("sym/kept.txt"), b"kept\n", 0o644);
        // Nothing below an excluded directory comes back; below `dir/*` it can.
        write_file(&w.join("logs/.gitignore"), b"!keep.txt\n", 0o644);
        write_file(&w.join("logs/keep.txt"), b"still ignored\n", 0o644);
        write_file(&w.join("logs2/keep.txt"), b"re-included\n", 0o644);
        write_file(&w.join("logs2/other.txt"), b"ignored\n", 0o644);
        // A deeper .gitignore re-includes what a shallower one ignores.
        write_file(&w.join("sub/.gitignore"), b"!*.tmp\nlocal-only\n", 0o644);
        write_file(&w.join("sub/a.tmp"), b"re-included\n", 0o644);
        write_file(&w.join("sub/deeper/b.tmp"), b"re-included\n", 0o644);
        write_file(&w.join("sub/deeper/local-only"), b"ignored\n", 0o644);
        write_file(&w.join("c.tmp"), b"ignored\n", 0o644);
        // .gitignore wins over .git/info/exclude.
        write_file(&w.join(".git/info/exclude"), b"secret*\ncache/\n", 0o644);
        write_file(
            &w.join(".gitignore"),
            b"*.log\n/logs/\n/logs2/*\n!/logs2/keep.txt\n*.tmp\n/vendor-repos/\n!secret-ok\n",
            0o644,
        );
        write_file(&w.join("secret-ok"), b"kept\n", 0o644);
        write_file(&w.join("secret-no"), b"excluded\n", 0o644);
        // A directory-only pattern does not match a file.
        write_file(&w.join("a/cache"), b"a file named cache\n", 0o644);
        write_file(&w.join("b/cache/x"), b"in an excluded directory\n", 0o644);
        // Escapes and odd names, `**`, CRLF lines, trailing spaces, a directory pattern and a
        // symlink to a directory (not a directory for git).
        write_file(&w.join("#hash"), b"kept\n", 0o644);
        write_file(&w.join("sp ace.txt"), b"kept\n", 0o644);
        write_file(
            &w.join("globs/.gitignore"),
            b"**/gen/**\r\nx/**/y.txt\n\\!bang\ntrail \nesc\\ \nlinkdir/\n",
            0o644,
        );
        write_file(&w.join("globs/a/gen/b/c.txt"), b"ignored\n", 0o644);
        write_file(&w.join("globs/gen.txt"), b"kept\n", 0o644);
        write_file(&w.join("globs/x/1/2/y.txt"), b"ignored\n", 0o644);
        write_file(&w.join("globs/x/y.txt"), b"ignored\n", 0o644);
        write_file(&w.join("globs/!bang"), b"ignored\n", 0o644);
        write_file(
            &w.join("globs/trail"),
            b"ignored (trailing space dropped)\n",
            0o644,
        );
        write_file(
            &w.join("globs/esc "),
            b"ignored (escaped space kept)\n",
            0o644,
        );
        write_file(&w.join("globs/esc"), b"kept\n", 0o644);
        std::os::unix::fs::symlink("../src", w.join("globs/linkdir")).unwrap();
        write_file(
            &w.join(OsStr::from_bytes(b"globs/\xe9t\xe9.txt")),
            b"kept\n",
            0o644,
        );
        // Intent to add, in an ignored place.
        write_file(&w.join("logs/intent.txt"), b"intent to add\n", 0o644);
        fs::create_dir_all(w.join("nested")).unwrap();
        fs::create_dir_all(w.join("vendor-repos/r")).unwrap();
    });
    g(&ws, &["add", "-f", "newdir/tracked.log"]);
    g(&ws, &["add", "-f", "-N", "logs/intent.txt"]);
    for repo in ["nested", "vendor-repos/r"] {
        let dir = ws.join(repo);
        g(&dir, &["init", "-q"]);
        let w = dir.clone();
        fsop("nested repository", move || {
            write_file(&w.join("f.txt"), b"nested\n", 0o644)
        });
        g(&dir, &["add", "f.txt"]);
        g(&dir, &["commit", "-q", "-m", "nested"]);
    }
    let expect = |p: &str, kept: bool| (p.to_string(), kept);
    let expected = [
        expect("newdir/tracked.log", true),
        expect("newdir/untracked.log", false),
        expect("sym/kept.txt", true),
        expect("logs/keep.txt", false),
        expect("logs/intent.txt", true),
        expect("logs2/keep.txt", true),
        expect("logs2/other.txt", false),
        expect("sub/deeper/b.tmp", true),
        expect("sub/deeper/local-only", false),
        expect("secret-ok", true),
        expect("secret-no", false),
        expect("a/cache", true),
        expect("b/cache/x", false),
        expect("globs/a/gen/b/c.txt", false),
        expect("globs/gen.txt", true),
        expect("globs/esc", true),
        expect("globs/esc ", false),
        expect("globs/linkdir", true),
        expect("nested", true),
        expect("vendor-repos/r", false),
    ];
    let shared = fs::read_dir(ws.join(".git"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("sharedindex."));
    assert!(shared, "the workspace's index is not split");
    let s = d.snapshot_id(t);
    let ours = tree_of(&mirror, &s);
    let native = native_tree(&ws, &d.base, None);
    assert_eq!(
        ours,
        native,
        "snapshot tree != `git add -A` of a native copy; diff native → snapshot:\n{}",
        tree_diff(&d.base.join("copy"), &native, &ours)
    );
    let listing = g(&mirror, &["ls-tree", "-r", "--name-only", &s]);
    for (p, kept) in expected {
        assert_eq!(
            listing.lines().any(|l| l == p),
            kept,
            "{p} should {}be in the snapshot",
            if kept { "" } else { "not " }
        );
    }
    d.cli_ok(["release", t]);
}

#[test]
fn snapshot_keeps_non_utf8_names_and_paths_longer_than_path_max() {
    let d = Daemon::start();
    project(&d, "p", "*.log\n");
    let mirror = d.mirror("p");
    let t = "names";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("a non-UTF-8 name", move || {
        write_file(
            &w.join(OsStr::from_bytes(b"caf\xe9.txt")),
            b"latin-1 name\n",
            0o644,
        );
        write_file(
            &w.join(OsStr::from_bytes(b"dir-\xff/x\xfe.bin")),
            b"in a non-UTF-8 directory\n",
            0o644,
        );
    });
    // 45 levels of 100-byte names: 4,545 bytes, more than PATH_MAX; made by relative steps.
    let deep = "
        name=$(printf 'd%.0s' $(seq 1 100)); n=0
        while [ $n -lt 45 ]; do mkdir $name && cd -P $name || exit 1; n=$((n+1)); done
        echo deep > file.txt";
    run(
        Command::new("sh").arg("-c").arg(deep).current_dir(&ws),
        CMD_TIMEOUT,
    )
    .assert_ok();
    let s = d.snapshot_id(t);
    let out = run(
        git_command(&mirror, DATE1).args(["ls-tree", "-r", "-z", "--name-only", &s]),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    let names: Vec<&[u8]> = out
        .stdout
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .collect();
    for want in [&b"caf\xe9.txt"[..], &b"dir-\xff/x\xfe.bin"[..]] {
        assert!(
            names.contains(&want),
            "{:?} is missing from the snapshot: {:?}",
            String::from_utf8_lossy(want),
            names
                .iter()
                .map(|n| String::from_utf8_lossy(n))
                .collect::<Vec<_>>()
        );
    }
    let long = names
        .iter()
        .find(|n| n.ends_with(b"/file.txt") && n.len() > 4096);
    assert!(
        long.is_some(),
        "the file at a path longer than PATH_MAX is missing from the snapshot"
    );
    let blob = g(
        &mirror,
        &[
            "rev-parse",
            &format!("{s}:{}", String::from_utf8_lossy(long.unwrap())),
        ],
    );
    assert_eq!(g(&mirror, &["cat-file", "-p", &blob]), "deep");
    // And they come back after release + open.
    d.cli_ok(["release", t]);
    let ws = d.open_thread(t, &[]);
    let w = ws.clone();
    let names = fsop("read the resumed names", move || {
        (
            fs::read(w.join(OsStr::from_bytes(b"caf\xe9.txt"))).ok(),
            fs::read(w.join(OsStr::from_bytes(b"dir-\xff/x\xfe.bin"))).ok(),
        )
    });
    assert_eq!(names.0.as_deref(), Some(&b"latin-1 name\n"[..]));
    assert_eq!(names.1.as_deref(), Some(&b"in a non-UTF-8 directory\n"[..]));
    let read_deep = "
        name=$(printf 'd%.0s' $(seq 1 100)); n=0
        while [ $n -lt 45 ]; do cd -P $name || exit 1; n=$((n+1)); done
        cat file.txt";
    let out = run(
        Command::new("sh").arg("-c").arg(read_deep).current_dir(&ws),
        CMD_TIMEOUT,
    );
    out.assert_ok();
    assert_eq!(out.stdout_str(), "deep\n");
    d.cli_ok(["release", t]);
}

#[test]
fn a_planted_object_never_reaches_the_mirror() {
    // The agent commits, then replaces the loose file of its commit with another object (a blob
    // of its own): the id no longer names that content. The snapshot must refuse it, and the
    // mirror, read by every workspace of the project, must not hold the id.
    let d = Daemon::start();
    project(&d, "p", "*.log\n");
    let mirror = d.mirror("p");
    let t = "planted";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("a file", move || {
        write_file(&w.join("a.txt"), b"agent\n", 0o644)
    });
    g(&ws, &["add", "a.txt"]);
    g(&ws, &["commit", "-q", "-m", "agent"]);
    let head = g(&ws, &["rev-parse", "HEAD"]);
    let blob = g(&ws, &["rev-parse", "HEAD:a.txt"]);
    let obj = |id: &str| ws.join(".git/objects").join(&id[..2]).join(&id[2..]);
    let (from, to) = (obj(&blob), obj(&head));
    let target = to.clone();
    let original = fsop("plant", move || {
        let original = fs::read(&to).unwrap();
        let bytes = fs::read(&from).unwrap();
        fs::remove_file(&to).unwrap();
        fs::write(&to, bytes).unwrap();
        original
    });
    let out = d.cli(["snapshot", t]);
    assert!(
        !out.success(),
        "a snapshot carried a planted object: {}",
        out.describe()
    );
    let has = run(
        git_command(&mirror, DATE1).args(["cat-file", "-e", &head]),
        CMD_TIMEOUT,
    );
    assert!(!has.success(), "the mirror holds the planted id {head}");
    // With the real object back, the thread saves and releases.
    fsop("restore", move || {
        fs::remove_file(&target).unwrap();
        fs::write(&target, original).unwrap();
    });
    d.cli_ok(["release", t]);
    g(&mirror, &["cat-file", "-e", &format!("{head}:a.txt")]);
}

#[test]
fn snapshot_of_a_thousand_new_files() {
    let d = Daemon::start();
    project(&d, "p", "*.log\n/build/\n");
    let mirror = d.mirror("p");
    let t = "many";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("1,000 new files", move || {
        for i in 0..1000 {
            let dir = w.join(format!("gen/d{}", i % 20));
            let name = if i % 10 == 0 {
                format!("f{i}.log")
            } else {
                format!("f{i}.txt")
            };
            write_file(&dir.join(name), format!("{i}\n").as_bytes(), 0o644);
        }
    });
    let start = Instant::now();
    let s = d.snapshot_id(t);
    let took = start.elapsed();
    let start = Instant::now();
    let s2 = d.snapshot_id(t);
    let again = start.elapsed();
    eprintln!("snapshot of 1,000 new files: {took:?} (again, unchanged: {again:?})");
    assert_eq!(s, s2, "an unchanged workspace got a new snapshot");
    let native = native_tree(&ws, &d.base, None);
    assert_eq!(tree_of(&mirror, &s), native);
    d.cli_ok(["release", t]);
}

/// Peak resident memory of the daemon (VmHWM), from /proc.
fn daemon_peak_rss(d: &Daemon) -> u64 {
    let pid = d.pid().expect("daemon running");
    let status = fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

#[test]
fn an_agents_large_commit_is_carried_in_bounded_memory() {
    // The agent commits a 256 MiB file: carrying it into the mirror streams it (the issue's bound:
    // at most 64 MiB of extra daemon memory whatever the size).
    const SIZE: usize = 256 << 20;
    let d = Daemon::start();
    project(&d, "p", "*.log\n");
    let mirror = d.mirror("p");
    let t = "large";
    let ws = d.open_thread(t, &["--project", "p"]);
    let w = ws.clone();
    fsop("a large file", move || {
        use std::io::Write;
        let mut f = fs::File::create(w.join("large.bin")).unwrap();
        let mut chunk = vec![0u8; 1 << 20];
        for i in 0..SIZE >> 20 {
            chunk[..8].copy_from_slice(&(i as u64).to_le_bytes());
            f.write_all(&chunk).unwrap();
        }
    });
    g(&ws, &["add", "large.bin"]);
    g(&ws, &["commit", "-q", "-m", "large"]);
    let blob = g(&ws, &["rev-parse", "HEAD:large.bin"]);
    // Deleted after the commit: the snapshot's own tree does not need the file (building the
    // snapshot tree is measured elsewhere), only its first parent does.
    let w = ws.clone();
    fsop("rm large.bin", move || {
        fs::remove_file(w.join("large.bin")).unwrap()
    });
    let before = daemon_peak_rss(&d);
    let s = d.snapshot_id(t);
    let grown = daemon_peak_rss(&d).saturating_sub(before);
    eprintln!(
        "daemon peak RSS grew by {} MiB carrying a {} MiB blob",
        grown >> 20,
        SIZE >> 20
    );
    assert_eq!(
        g(&mirror, &["rev-parse", &format!("{s}^1:large.bin")]),
        blob
    );
    assert_eq!(
        g(&mirror, &["cat-file", "-s", &blob]),
        SIZE.to_string(),
        "the carried blob"
    );
    assert!(
        grown <= 64 << 20,
        "carrying a {} MiB blob grew the daemon's peak memory by {} MiB",
        SIZE >> 20,
        grown >> 20
    );
    d.cli_ok(["release", t]);
}
