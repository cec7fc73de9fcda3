//! Issue 4, "Done when": a workspace is a complete, normal git repository (docs/architecture.md "The
//! workspace's own repository", invariant 6), checked with real git on real mounts:
//!
//! 1. [`same_git_session_as_a_native_clone`]: one sequence of git commands (status, add, commit,
//!    branch, switch, merges, rebase, stash, cherry-pick, reset, clean, tag, log, gc, fsck) run in a
//!    native clone set up like the workspace and in the workspace gives the same output, the same
//!    commit ids and the same working trees.
//! 2. [`refs_remote_credentials_and_an_untouched_mirror`]: no `refs/octomate/*` in the workspace,
//!    `origin` is the upstream without its credentials, new objects stay in the workspace, and the
//!    mirror is byte-identical after a session of commits, branches, `gc` and `repack -ad`.
//! 3. [`first_status_reads_no_content_and_fsmonitor_misses_nothing`]: the first `git status` of a
//!    fresh workspace opens no base content, the fsmonitor hook is used with tokens, and changes made
//!    by other processes between two statuses are never missed.
//! 4. [`index_lock_contention_and_atomic_index_rename`]: two racing `git add` loops get git's normal
//!    lock error or succeed, never corrupt the repository, and a concurrent reader never sees
//!    `.git/index` missing.

use crate::common;

use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Timeout for one in-process batch of file operations on a mount.
const FS_TIMEOUT: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------------------------
// Helpers

/// Runs git in `dir` with the deterministic identity of [`git_command`] at `date` (not asserted).
fn git_out(dir: &Path, date: &str, args: &[&str]) -> Out {
    run(git_command(dir, date).args(args), CMD_TIMEOUT)
}

/// Runs git in `dir`, asserting success, and returns stdout.
#[track_caller]
fn git_ok(dir: &Path, args: &[&str]) -> String {
    let out = git_out(dir, DATE1, args);
    out.assert_ok();
    out.stdout_str()
}

/// Runs git in `dir` with extra environment variables (not asserted).
fn git_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Out {
    let mut c = git_command(dir, DATE1);
    for (k, v) in env {
        c.env(k, v);
    }
    run(c.args(args), CMD_TIMEOUT)
}

/// `octofs status <thread> --json`.
#[track_caller]
fn ws_status(d: &Daemon, thread: &str) -> serde_json::Value {
    parse_json("status --json", &d.cli_ok(["status", thread, "--json"]))
}

/// Opens of base file content in `thread` since its mount.
#[track_caller]
fn base_content_opens(d: &Daemon, thread: &str) -> u64 {
    let v = ws_status(d, thread);
    v["base_content_opens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no base_content_opens in {v}"))
}

/// One file-system change, applied identically to several trees.
#[derive(Clone, Debug)]
enum Op {
    Write(&'static str, Vec<u8>),
    Exec(&'static str, Vec<u8>),
    Append(&'static str, &'static str),
    Remove(&'static str),
    RemoveDir(&'static str),
    Symlink(&'static str, &'static str),
    Chmod(&'static str, u32),
    Rename(&'static str, &'static str),
}

fn apply_ops(dir: &Path, ops: &[Op]) {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    for op in ops {
        let p = |rel: &str| dir.join(rel);
        let r: std::io::Result<()> = match op {
            Op::Write(rel, bytes) => {
                write_file(&p(rel), bytes, 0o644);
                Ok(())
            }
            Op::Exec(rel, bytes) => {
                write_file(&p(rel), bytes, 0o755);
                Ok(())
            }
            Op::Append(rel, text) => fs::OpenOptions::new()
                .append(true)
                .open(p(rel))
                .and_then(|mut f| f.write_all(text.as_bytes())),
            Op::Remove(rel) => fs::remove_file(p(rel)),
            Op::RemoveDir(rel) => fs::remove_dir_all(p(rel)),
            Op::Symlink(rel, target) => {
                let _ = fs::remove_file(p(rel));
                std::os::unix::fs::symlink(target, p(rel))
            }
            Op::Chmod(rel, mode) => fs::set_permissions(p(rel), fs::Permissions::from_mode(*mode)),
            Op::Rename(a, b) => {
                if let Some(parent) = p(b).parent() {
                    fs::create_dir_all(parent).expect("mkdir rename target parent");
                }
                fs::rename(p(a), p(b))
            }
        };
        if let Err(e) = r {
            panic!("{op:?} in {}: {e}", dir.display());
        }
    }
}

/// The tree under `dir` without the repository itself (`.git`), as [`tree_listing`] reports it.
fn worktree_listing(dir: &Path) -> BTreeMap<String, String> {
    let dir = dir.to_path_buf();
    with_timeout("list a working tree", FS_TIMEOUT, move || {
        let mut m = tree_listing(&dir);
        m.retain(|k, _| k != ".git" && !k.starts_with(".git/"));
        m
    })
}

// ---------------------------------------------------------------------------------------------
// 1. Differential test against a native clone

const DIFF_THREAD: &str = "diff";
const DIFF_BRANCH: &str = "octofs/diff";

/// The upstream of the differential test: branches `main`, `feat` (diverged) and `old`, tags `v1`
/// (lightweight) and `v2` (annotated), nested directories, executables, symlinks, a binary file
/// and a `.gitignore`, ~200 files.
fn build_diff_upstream(repo: &GitRepo) {
    repo.write("README.md", "# project\n\nline 2\nline 3\n");
    repo.write(".gitignore", "*.log\n/build/\n");
    for i in 0..60 {
        repo.write(
            &format!("src/mod{}/file{i}.rs", i % 6),
            format!("// file {i}\npub fn f{i}() -> u32 {{\n    {i}\n}}\n"),
        );
    }
    for i in 0..40 {
        repo.write(
            &format!("docs/guide/part{i}.md"),
            format!("# Part {i}\n\n{}\n", "text ".repeat(i + 1)),
        );
    }
    for i in 0..30 {
        repo.write(
            &format!("deep/a/b/c/d/e{}/leaf{i}.txt", i % 3),
            format!("leaf {i}\n"),
        );
    }
    repo.write("data/blob.bin", pseudo_random(150_000, 9));
    repo.write("data/empty", "");
    repo.write_exec("bin/tool.sh", "#!/bin/sh\necho tool\n");
    repo.write_exec("bin/other", pseudo_random(3000, 4));
    repo.symlink("link-readme", "README.md");
    repo.symlink("src/link-up", "../docs/guide");
    repo.symlink("dangling", "no/such/target");
    repo.commit_all("base", DATE1);
    repo.git(["tag", "v1"]);
    repo.git(["branch", "old"]);

    repo.write("src/mod1/file1.rs", "// file 1, second version\n");
    repo.write("docs/guide/new.md", "new page\n");
    repo.remove("docs/guide/part39.md");
    repo.commit_all("second", DATE2);
    repo.git_at(DATE2, ["tag", "-a", "v2", "-m", "release v2"]);

    repo.git(["switch", "-q", "-c", "feat"]);
    repo.write("feature/feature.txt", "feature work\n");
    repo.write("docs/guide/part5.md", "# Part 5, rewritten on feat\n");
    repo.commit_all("feat 1", "1612224000 +0000");
    repo.write("feature/more.txt", "more feature work\n");
    repo.commit_all("feat 2", "1612310400 +0000");

    repo.git(["switch", "-q", "main"]);
    repo.write("src/mod2/file2.rs", "// file 2 changed on main\n");
    repo.commit_all("third", "1612396800 +0000");
}

/// The native clone and the workspace, driven in lockstep.
struct Pair<'a> {
    d: &'a Daemon,
    native: PathBuf,
    ws: PathBuf,
    /// Unix seconds used as author and committer date of the next command (same on both sides).
    t: u64,
    steps: usize,
}

impl Pair<'_> {
    /// Replaces each side's absolute path by a placeholder: git names the worktree by absolute
    /// path in some messages (e.g. a lock file's path), and the two checkouts necessarily live in
    /// different directories. Nothing else is normalized.
    fn normalize(&self, side: &Path, text: &[u8]) -> String {
        String::from_utf8_lossy(text).replace(&*side.to_string_lossy(), "<worktree>")
    }

    /// Runs `git args` on both sides at the same date; asserts equal exit codes, stdout and stderr.
    /// Returns the (normalized) result.
    #[track_caller]
    fn git_any(&mut self, args: &[&str]) -> (Option<i32>, String, String) {
        self.steps += 1;
        let date = format!("{} +0000", self.t);
        self.t += 60;
        let n = git_out(&self.native, &date, args);
        let w = git_out(&self.ws, &date, args);
        let nn = (
            n.status.code(),
            self.normalize(&self.native, &n.stdout),
            self.normalize(&self.native, &n.stderr),
        );
        let ww = (
            w.status.code(),
            self.normalize(&self.ws, &w.stdout),
            self.normalize(&self.ws, &w.stderr),
        );
        assert!(
            nn == ww,
            "step {}: `git {}` differs between the native clone and the workspace\n\
             === native: exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}\
             === workspace: exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}\
             --- daemon log ---\n{}",
            self.steps,
            args.join(" "),
            nn.0,
            nn.1,
            nn.2,
            ww.0,
            ww.1,
            ww.2,
            self.d.log_tail()
        );
        ww
    }

    /// Like [`Pair::git_any`], and both sides must succeed. Returns stdout.
    #[track_caller]
    fn git(&mut self, args: &[&str]) -> String {
        let (code, out, err) = self.git_any(args);
        assert_eq!(
            code,
            Some(0),
            "`git {}` failed on both sides:\n{out}{err}",
            args.join(" ")
        );
        out
    }

    /// Applies the same file changes to both trees (the workspace's through the mount).
    #[track_caller]
    fn edit(&self, ops: Vec<Op>) {
        apply_ops(&self.native, &ops);
        let ws = self.ws.clone();
        with_timeout("edit the workspace", FS_TIMEOUT, move || {
            apply_ops(&ws, &ops)
        });
    }

    /// Compares the two repositories in depth: index, HEAD, refs, working trees (paths, types,
    /// modes, bytes, link targets), and the workspace's status with and without its fsmonitor.
    #[track_caller]
    fn checkpoint(&mut self, label: &str) {
        for args in [
            &["ls-files", "-s"][..],
            &["rev-parse", "HEAD"],
            &["symbolic-ref", "-q", "HEAD"],
            &[
                "for-each-ref",
                "--format=%(objectname) %(objecttype) %(refname)",
            ],
            &["status", "--porcelain=v2", "--branch", "-uall", "--ignored"],
        ] {
            self.git_any(args);
        }
        let n = worktree_listing(&self.native);
        let w = worktree_listing(&self.ws);
        assert_same_listing(
            &format!("{label}: working tree (native clone => workspace)"),
            &n,
            &w,
        );
        // The workspace answered with its fsmonitor above; the same question without it, without
        // touching the index (so the next fsmonitor query still starts from its token).
        let with = git_out(
            &self.ws,
            DATE1,
            &["status", "--porcelain=v2", "--branch", "-uall", "--ignored"],
        );
        let without = git_out(
            &self.ws,
            DATE1,
            &[
                "--no-optional-locks",
                "-c",
                "core.fsmonitor=false",
                "-c",
                "core.untrackedCache=false",
                "status",
                "--porcelain=v2",
                "--branch",
                "-uall",
                "--ignored",
            ],
        );
        with.assert_ok();
        without.assert_ok();
        assert_eq!(
            with.stdout_str(),
            without.stdout_str(),
            "{label}: workspace status with fsmonitor differs from status without it"
        );
    }
}

#[test]
fn same_git_session_as_a_native_clone() {
    let t0 = Instant::now();
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    build_diff_upstream(&up);
    let upstream = up.path.to_string_lossy().into_owned();
    d.cli_ok(["mirror", "add", "proj", &upstream]);
    let mirror = d.mirror("proj");
    let base = git_ok(&mirror, &["rev-parse", "HEAD"]).trim().to_string();
    assert_eq!(
        base,
        up.head(),
        "the mirror is on the upstream's default branch"
    );

    // The native side: a clone of the mirror directory set up like a workspace — the upstream's
    // branches as `origin/*` (a plain clone of the mirror would only see the mirror's own `main`),
    // its tags, `origin` pointing at the upstream, `origin/HEAD`, and HEAD on `octofs/<thread>` at
    // the base without an upstream branch.
    let native = d.base.join("native");
    let m = mirror.to_string_lossy().into_owned();
    GitRepo::init(&native);
    git_ok(&native, &["remote", "add", "origin", &m]);
    git_ok(
        &native,
        &[
            "fetch",
            "-q",
            "origin",
            "+refs/remotes/origin/*:refs/remotes/origin/*",
            "^refs/remotes/origin/HEAD",
            "+refs/tags/*:refs/tags/*",
        ],
    );
    git_ok(&native, &["remote", "set-url", "origin", &upstream]);
    git_ok(&native, &["remote", "set-head", "origin", "main"]);
    git_ok(
        &native,
        &["switch", "-q", "--no-track", "-c", DIFF_BRANCH, &base],
    );
    // A workspace's root is its owner's only (the trust model), as a private checkout's is.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&native, std::fs::Permissions::from_mode(0o700))
            .expect("chmod native");
    }

    let ws = d.open_thread(DIFF_THREAD, &["--project", "proj"]);
    let mut p = Pair {
        d: &d,
        native,
        ws,
        t: 1_700_000_000,
        steps: 0,
    };

    // --- a fresh workspace looks like the fresh clone
    p.git(&["status", "--porcelain=v2", "--branch"]);
    p.git(&["status"]);
    p.git(&["log", "--all", "--oneline", "--decorate"]);
    p.git(&["branch", "-a", "-vv"]);
    p.git(&["remote", "-v"]);
    p.git(&["tag", "-l", "-n1"]);
    p.git(&["rev-parse", "v2", "v2^{commit}", "origin/HEAD"]);
    p.git_any(&["rev-parse", "--abbrev-ref", "@{upstream}"]);
    p.checkpoint("fresh");

    // --- edits, add, commit
    p.edit(vec![
        Op::Append("README.md", "line 4 from the agent\n"),
        Op::Write("src/mod1/file7.rs", b"// rewritten\n".to_vec()),
        Op::Remove("docs/guide/part3.md"),
        Op::Write("newdir/sub/new.txt", b"brand new\n".to_vec()),
        Op::Exec("newdir/run.sh", b"#!/bin/sh\necho new\n".to_vec()),
        Op::Chmod("docs/guide/part4.md", 0o755),
        Op::Symlink("link-readme", "docs/guide/part1.md"),
        Op::Rename("deep/a/b/c/d/e0/leaf0.txt", "deep/a/leaf0-moved.txt"),
        Op::RemoveDir("deep/a/b/c/d/e2"),
    ]);
    p.git(&["status", "--porcelain=v2", "--branch"]);
    p.git(&["status", "--porcelain=v2", "-uall"]);
    p.git(&["diff"]);
    p.git(&["add", "-A"]);
    p.git(&["status", "--porcelain=v2", "--branch"]);
    p.git(&["diff", "--cached", "--stat"]);
    p.git(&["commit", "-m", "agent: first edit"]);
    p.checkpoint("after the first commit");

    // --- branch, switch, fast-forward merge
    p.git(&["switch", "-c", "topic"]);
    p.edit(vec![Op::Append("src/mod3/file3.rs", "// topic 1\n")]);
    p.git(&["commit", "-am", "topic 1"]);
    p.edit(vec![Op::Write("topic/notes.md", b"topic notes\n".to_vec())]);
    p.git(&["add", "topic"]);
    p.git(&["commit", "-m", "topic 2"]);
    p.git(&["switch", DIFF_BRANCH]);
    p.checkpoint("back on the workspace branch");
    p.git(&["merge", "topic"]);
    p.git(&["log", "--oneline", "-3"]);

    // --- a real (three-way) merge of an upstream branch
    p.git(&["merge", "--no-edit", "origin/feat"]);
    p.git(&["log", "--graph", "--oneline", "-6"]);
    p.checkpoint("after merging origin/feat");

    // --- a conflicting merge, resolved by hand
    p.git(&["switch", "-c", "side", "HEAD~3"]);
    p.edit(vec![Op::Write(
        "README.md",
        b"# project\n\nline 2 from side\nline 3\n".to_vec(),
    )]);
    p.git(&["commit", "-am", "side: README"]);
    p.git(&["switch", DIFF_BRANCH]);
    p.edit(vec![Op::Write(
        "README.md",
        b"# project\n\nline 2 from the workspace branch\nline 3\n".to_vec(),
    )]);
    p.git(&["commit", "-am", "main line: README"]);
    let (code, _, _) = p.git_any(&["merge", "side"]);
    assert_eq!(code, Some(1), "the merge of `side` must conflict");
    p.git(&["status", "--porcelain=v2", "--branch"]);
    p.git(&["diff"]);
    p.checkpoint("in a conflicted merge");
    p.edit(vec![Op::Write(
        "README.md",
        b"# project\n\nline 2, resolved\nline 3\n".to_vec(),
    )]);
    p.git(&["add", "README.md"]);
    p.git(&["commit", "--no-edit"]);
    p.checkpoint("after the resolved merge");

    // --- rebase
    p.git(&["switch", "-c", "rb", "v2"]);
    p.edit(vec![Op::Write("rebased/one.txt", b"one\n".to_vec())]);
    p.git(&["add", "-A"]);
    p.git(&["commit", "-m", "rb 1"]);
    p.edit(vec![Op::Append("rebased/one.txt", "two\n")]);
    p.git(&["commit", "-am", "rb 2"]);
    p.git(&["rebase", DIFF_BRANCH]);
    p.git(&["log", "--oneline", "-4"]);
    p.git(&["switch", DIFF_BRANCH]);
    p.git(&["merge", "--ff-only", "rb"]);
    p.checkpoint("after the rebase");

    // --- stash push/pop, with untracked files (-u) and without
    p.edit(vec![
        Op::Append("src/mod4/file4.rs", "// wip\n"),
        Op::Remove("docs/guide/part6.md"),
        Op::Write("wip/untracked.txt", b"untracked wip\n".to_vec()),
        Op::Write("wip/deeper/more.txt", b"more\n".to_vec()),
        Op::Write("stray.txt", b"stray\n".to_vec()),
    ]);
    p.git(&["add", "stray.txt"]);
    p.git(&["status", "--porcelain=v2", "-uall"]);
    p.git(&["stash", "push", "-u", "-m", "wip with untracked"]);
    p.git(&["status", "--porcelain=v2", "-uall"]);
    p.checkpoint("stashed with -u");
    p.git(&["stash", "list"]);
    p.git(&["stash", "show", "-p", "--include-untracked"]);
    p.git(&["stash", "pop"]);
    p.checkpoint("popped");
    p.git(&["stash", "push"]);
    p.checkpoint("stashed without -u");
    p.git(&["stash", "pop", "--index"]);
    p.git(&["add", "-A"]);
    p.git(&["commit", "-m", "from the stash"]);

    // --- cherry-pick
    p.git(&["switch", "-c", "pick", "v1"]);
    p.edit(vec![Op::Write("picked/file.txt", b"picked\n".to_vec())]);
    p.git(&["add", "-A"]);
    p.git(&["commit", "-m", "to be picked"]);
    p.git(&["switch", DIFF_BRANCH]);
    p.git(&["cherry-pick", "pick"]);
    p.checkpoint("after cherry-pick");

    // --- reset --hard
    p.edit(vec![
        Op::Append("src/mod5/file5.rs", "// lost\n"),
        Op::Write("src/mod0/file0.rs", b"// staged, then lost\n".to_vec()),
    ]);
    p.git(&["add", "src/mod0/file0.rs"]);
    p.git(&["reset", "--hard", "HEAD~1"]);
    p.git(&["status", "--porcelain=v2", "--branch"]);
    p.checkpoint("after reset --hard");

    // --- clean -fdx
    p.edit(vec![
        Op::Write("scratch.txt", b"untracked\n".to_vec()),
        Op::Write("debug.log", b"ignored\n".to_vec()),
        Op::Write("src/mod2/trace.log", b"ignored, nested\n".to_vec()),
        Op::Write("build/out/a.o", b"ignored dir\n".to_vec()),
        Op::Write("untracked-dir/x/y.txt", b"nested untracked\n".to_vec()),
    ]);
    p.git(&["status", "--porcelain=v2", "--ignored"]);
    p.git(&["clean", "-n", "-dx"]);
    p.git(&["clean", "-fdx"]);
    p.checkpoint("after clean -fdx");

    // --- tags, logs
    p.git(&["tag", "light"]);
    p.git(&["tag", "-a", "rel-1", "-m", "release 1"]);
    p.git(&["tag", "-l", "-n1"]);
    p.git(&["show", "--stat", "rel-1"]);
    p.git(&["log", "--all", "--oneline"]);
    p.git(&["log", "--all", "--oneline", "--decorate"]);
    p.git(&[
        "log",
        "--all",
        "--format=%H %P %an %ae %ad %cd %s",
        "--date=raw",
    ]);
    p.git(&["branch", "-vv"]);

    // --- gc, fsck
    p.git(&["gc"]);
    p.git(&["fsck", "--full"]);
    p.git(&["fsck", "--full", "--no-dangling", "--strict"]);
    p.git(&["log", "--all", "--oneline", "--decorate"]);
    p.checkpoint("after gc");

    // --- and life goes on after gc
    p.edit(vec![Op::Append("README.md", "after gc\n")]);
    p.git(&["commit", "-am", "after gc"]);
    p.git(&["log", "--all", "--oneline"]);
    p.checkpoint("final");
    let head = git_ok(&p.ws, &["rev-parse", "HEAD"]);
    assert_eq!(
        head,
        git_ok(&p.native, &["rev-parse", "HEAD"]),
        "commit ids"
    );
    eprintln!(
        "differential test: {} git commands on each side, equal; {:?}",
        p.steps,
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Refs, origin, credentials, and an untouched mirror

/// `python3 -m http.server` serving a directory (git's "dumb" HTTP protocol needs nothing more);
/// killed by its own process-group id on drop.
struct HttpServer {
    child: std::process::Child,
    port: u16,
}

impl HttpServer {
    #[track_caller]
    fn start(dir: &Path, log: &Path) -> HttpServer {
        use std::os::unix::process::CommandExt;
        // A free port: bind, read it, release it (the server binds it again right away).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let logf = fs::File::create(log).expect("http log");
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(logf.try_clone().expect("dup"))
            .stderr(logf)
            .process_group(0)
            .spawn()
            .expect("spawn python3 -m http.server");
        let server = HttpServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "http server did not come up: {}",
                fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        kill_child_group(&self.child);
        let _ = self.child.wait();
    }
}

/// Every regular file under `dir` (not following symlinks), with its bytes.
fn files_with_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).expect("read_dir").flatten() {
            let ft = e.file_type().expect("file type");
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                out.push((e.path(), fs::read(e.path()).expect("read")));
            } else if ft.is_symlink() {
                let t = fs::read_link(e.path()).expect("readlink");
                out.push((e.path(), t.into_os_string().into_encoded_bytes()));
            }
        }
    }
    out
}

#[test]
fn refs_remote_credentials_and_an_untouched_mirror() {
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    up.write("README.md", "hello\n");
    up.write("src/lib.rs", "pub fn f() {}\n");
    up.write_exec("run.sh", "#!/bin/sh\n");
    up.commit_all("one", DATE1);
    up.git(["tag", "v1"]);
    up.git(["switch", "-q", "-c", "dev"]);
    up.write("dev.txt", "dev\n");
    up.commit_all("dev work", DATE2);
    up.git(["switch", "-q", "main"]);
    up.write("src/lib.rs", "pub fn f() -> u8 { 1 }\n");
    up.commit_all("two", DATE2);
    up.git_at(DATE2, ["tag", "-a", "v2", "-m", "v2"]);

    // Served over http with credentials in the URL: they must stay with the mirror (the daemon's
    // side) and never reach the workspace.
    let served = d.base.join("served");
    fs::create_dir(&served).unwrap();
    git_ok(
        &d.base,
        &[
            "clone",
            "-q",
            "--bare",
            &up.path.to_string_lossy(),
            &served.join("up.git").to_string_lossy(),
        ],
    );
    git_ok(&served.join("up.git"), &["update-server-info"]);
    let server = HttpServer::start(&served, &d.base.join("http.log"));
    let secret = "s3cret-Tok3n";
    let url = format!("http://alice:{secret}@127.0.0.1:{}/up.git", server.port);
    let clean_url = format!("http://127.0.0.1:{}/up.git", server.port);
    d.cli_ok(["mirror", "add", "proj", &url]);
    drop(server); // nothing below needs the network

    // A snapshot of another thread, only reachable from refs/octomate/* (test setup: the mirror
    // is written here by the test, never by a workspace).
    let mirror = d.mirror("proj");
    let snap = git_ok(
        &mirror,
        &[
            "commit-tree",
            "HEAD^{tree}",
            "-p",
            "HEAD",
            "-m",
            "octomate snapshot of x",
        ],
    )
    .trim()
    .to_string();
    git_ok(&mirror, &["update-ref", "refs/octomate/threads/x", &snap]);
    git_ok(&mirror, &["update-ref", "refs/octomate/threads/y", "HEAD"]);
    let mirror_before = tree_listing(&mirror);

    let ws = d.open_thread("w", &["--project", "proj"]);

    // --- no refs/octomate/* anywhere
    let log_all = git_ok(&ws, &["log", "--all", "--format=%H %D"]);
    assert!(
        !log_all.contains(&snap) && !log_all.contains("octomate"),
        "git log --all shows another thread's snapshot:\n{log_all}"
    );
    let refs = git_ok(&ws, &["for-each-ref", "--format=%(refname)"]);
    assert!(
        !refs.contains("refs/octomate/"),
        "refs/octomate/* in the workspace:\n{refs}"
    );
    let want: BTreeSet<String> = git_ok(&up.path, &["rev-list", "--all"])
        .lines()
        .map(str::to_string)
        .collect();
    let got: BTreeSet<String> = git_ok(&ws, &["rev-list", "--all"])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        got, want,
        "commits reachable in a fresh workspace = the upstream's"
    );
    assert_eq!(
        refs.lines().collect::<BTreeSet<_>>(),
        [
            "refs/heads/octofs/w",
            "refs/remotes/origin/HEAD",
            "refs/remotes/origin/dev",
            "refs/remotes/origin/main",
            "refs/tags/v1",
            "refs/tags/v2",
        ]
        .into_iter()
        .collect(),
        "the workspace's refs"
    );

    // --- origin is the upstream, without credentials
    let remotes = git_ok(&ws, &["remote", "-v"]);
    assert_eq!(
        remotes,
        format!("origin\t{clean_url} (fetch)\norigin\t{clean_url} (push)\n")
    );
    assert_eq!(
        git_ok(&ws, &["config", "--get-all", "remote.origin.url"]).trim(),
        clean_url
    );
    let ws_git = ws.join(".git");
    let leaks: Vec<String> = with_timeout("read .git", FS_TIMEOUT, move || {
        files_with_bytes(&ws_git)
            .into_iter()
            .filter(|(_, b)| {
                let s = String::from_utf8_lossy(b);
                s.contains(secret) || s.contains("alice")
            })
            .map(|(p, _)| p.display().to_string())
            .collect()
    });
    assert!(
        leaks.is_empty(),
        "credentials inside the workspace: {leaks:?}"
    );

    // --- a session: commits, branches, a merge, tags, gc, repack -ad
    let mut made = Vec::new();
    let commit = |msg: &str, made: &mut Vec<String>| {
        git_ok(&ws, &["add", "-A"]);
        git_ok(&ws, &["commit", "-q", "-m", msg]);
        made.push(git_ok(&ws, &["rev-parse", "HEAD"]).trim().to_string());
    };
    let w2 = ws.clone();
    with_timeout("write", FS_TIMEOUT, move || {
        write_file(&w2.join("src/new.rs"), b"// new\n", 0o644);
        write_file(&w2.join("README.md"), b"hello from the workspace\n", 0o644);
    });
    commit("ws 1", &mut made);
    git_ok(&ws, &["switch", "-q", "-c", "feature"]);
    let w2 = ws.clone();
    with_timeout("write", FS_TIMEOUT, move || {
        write_file(&w2.join("feature.txt"), &pseudo_random(40_000, 3), 0o644)
    });
    commit("ws feature", &mut made);
    git_ok(&ws, &["switch", "-q", "octofs/w"]);
    git_ok(&ws, &["merge", "-q", "--no-edit", "origin/dev"]);
    made.push(git_ok(&ws, &["rev-parse", "HEAD"]).trim().to_string());
    git_ok(&ws, &["merge", "-q", "--no-edit", "feature"]);
    made.push(git_ok(&ws, &["rev-parse", "HEAD"]).trim().to_string());
    git_ok(&ws, &["tag", "-a", "ws-tag", "-m", "a workspace tag"]);
    made.push(git_ok(&ws, &["rev-parse", "ws-tag"]).trim().to_string());
    git_ok(&ws, &["gc", "-q"]);
    let w2 = ws.clone();
    with_timeout("write", FS_TIMEOUT, move || {
        write_file(&w2.join("after-gc.txt"), b"after gc\n", 0o644)
    });
    commit("ws after gc", &mut made);
    git_ok(&ws, &["repack", "-a", "-d", "-q"]);
    git_ok(&ws, &["branch", "-D", "feature"]);
    git_ok(&ws, &["gc", "-q", "--prune=now"]);
    let fsck = git_out(&ws, DATE1, &["fsck", "--full", "--strict"]);
    fsck.assert_ok();
    assert!(
        git_ok(&ws, &["status", "--porcelain"]).is_empty(),
        "clean after the session"
    );

    // New objects exist in the workspace, and only there.
    let tree = git_ok(&ws, &["rev-parse", "HEAD^{tree}"])
        .trim()
        .to_string();
    let blob = git_ok(&ws, &["rev-parse", "HEAD:after-gc.txt"])
        .trim()
        .to_string();
    for id in made.iter().chain([&tree, &blob]) {
        git_ok(&ws, &["cat-file", "-e", id]);
        let m = git_out(&mirror, DATE1, &["cat-file", "-e", id]);
        assert!(
            !m.success(),
            "object {id} made in the workspace exists in the mirror"
        );
    }
    // `repack -a` copied what it needed from the alternate into the workspace's own pack; the
    // mirror's objects stayed where they were.
    let pack_dir = ws.join(".git/objects/pack");
    let packs: Vec<String> = with_timeout("list packs", FS_TIMEOUT, move || {
        fs::read_dir(pack_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".pack"))
            .collect()
    });
    assert!(
        !packs.is_empty(),
        "no pack in the workspace after repack/gc"
    );
    let alternates = ws.join(".git/objects/info/alternates");
    assert_eq!(
        with_timeout("read alternates", FS_TIMEOUT, move || {
            fs::read_to_string(alternates).unwrap()
        }),
        "../octofs/objects\n",
        "alternates (the mirror's objects as the mount presents them)"
    );

    let mirror_after = tree_listing(&mirror);
    assert_same_listing(
        "mirror (worktree and .git) after a workspace session",
        &mirror_before,
        &mirror_after,
    );
}

// ---------------------------------------------------------------------------------------------
// 3. The first status reads no content; fsmonitor is used and misses nothing

/// What `git status` reports, with the workspace's fsmonitor and untracked cache (as configured),
/// and the trace of its fsmonitor use.
struct TracedStatus {
    stdout: String,
    trace: String,
}

#[track_caller]
fn traced_status(ws: &Path, args: &[&str]) -> TracedStatus {
    let mut all = vec!["status"];
    all.extend_from_slice(args);
    let out = git_env(
        ws,
        &[("GIT_TRACE2_PERF", "1"), ("GIT_TRACE_FSMONITOR", "1")],
        &all,
    );
    out.assert_ok();
    TracedStatus {
        stdout: out.stdout_str(),
        trace: out.stderr_str(),
    }
}

/// The token git read from the index's fsmonitor extension (none on a first query).
fn token_read(trace: &str) -> Option<String> {
    trace
        .lines()
        .find_map(|l| l.split("read fsmonitor extension successful '").nth(1))
        .map(|r| r.trim_end_matches('\'').to_string())
}

/// `git status` without fsmonitor and untracked cache and without writing the index: the truth the
/// fsmonitor-assisted status must equal.
#[track_caller]
fn reference_status(ws: &Path, args: &[&str]) -> String {
    let mut all = vec![
        "--no-optional-locks",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.untrackedCache=false",
        "status",
    ];
    all.extend_from_slice(args);
    let out = git_out(ws, DATE1, &all);
    out.assert_ok();
    out.stdout_str()
}

/// Whether the daemon may answer a current token with "everything" (always correct, never
/// incremental): only after a write through a multiply-linked file, whose names the journal cannot
/// all list.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Paths,
    MayBeEverything,
}

/// Runs fsmonitor-assisted statuses in one workspace and checks each against the reference.
/// A wrong status fails at once; a status whose hook answered "everything" although nothing but
/// paths changed (correct, but not O(changed paths)) is recorded and reported at the end, so that
/// every later round still runs.
struct Monitor {
    ws: PathBuf,
    not_incremental: Vec<String>,
}

impl Monitor {
    /// Asserts that the hook ran and was asked with the token the previous status stored, that it
    /// answered with a list of paths (not "everything", unless `answer` allows it), and that the
    /// status equals the reference. Returns the status output.
    #[track_caller]
    fn status(&mut self, label: &str, args: &[&str], answer: Answer) -> String {
        let st = traced_status(&self.ws, args);
        assert!(
            st.trace.contains("fsmonitor process") && st.trace.contains("returned success"),
            "{label}: the fsmonitor hook did not run successfully:\n{}",
            st.trace
        );
        let token = token_read(&st.trace)
            .unwrap_or_else(|| panic!("{label}: no fsmonitor token in the index:\n{}", st.trace));
        assert!(
            token.starts_with("octofs:"),
            "{label}: token {token:?} is not the daemon's"
        );
        let hook_line = st
            .trace
            .lines()
            .find(|l| l.contains("child_start") && l.contains("fsmonitor"))
            .unwrap_or_else(|| panic!("{label}: no hook invocation in the trace:\n{}", st.trace));
        assert!(
            hook_line.contains(&format!(" 2 {token}")),
            "{label}: the hook was not asked with the index's token {token}: {hook_line}"
        );
        let want = reference_status(&self.ws, args);
        assert_eq!(
            st.stdout,
            want,
            "{label}: `git status {}` with fsmonitor (left) differs from the reference without it \
             (right): a change was missed",
            args.join(" ")
        );
        if answer == Answer::Paths && st.trace.contains("query/trivial-response") {
            self.not_incremental.push(format!(
                "{label}: `git status {}` asked with token {token}: the daemon answered \
                 \"everything\"",
                args.join(" ")
            ));
        }
        st.stdout
    }

    /// One round: all untracked files, git's default "normal" mode that the untracked cache
    /// serves, and the short format. Returns the `-uall` porcelain v2 output.
    #[track_caller]
    fn round(&mut self, label: &str) -> String {
        self.round_answer(label, Answer::Paths)
    }

    #[track_caller]
    fn round_answer(&mut self, label: &str, answer: Answer) -> String {
        let all = self.status(
            &format!("{label} (-uall)"),
            &["--porcelain=v2", "-uall"],
            answer,
        );
        self.status(
            &format!("{label} (-unormal)"),
            &["--porcelain=v2"],
            Answer::Paths,
        );
        self.status(&format!("{label} (short)"), &["--short"], Answer::Paths);
        all
    }
}

/// Runs a shell script in `dir` as another process (changes through the mount by someone other
/// than git and the test).
#[track_caller]
fn sh_in(dir: &Path, script: &str) {
    let out = run(
        Command::new("sh").arg("-ec").arg(script).current_dir(dir),
        CMD_TIMEOUT,
    );
    out.assert_ok();
}

#[test]
fn first_status_reads_no_content_and_fsmonitor_misses_nothing() {
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    // `plain`: 400 files in 40 directories, no .gitignore or .gitattributes.
    for i in 0..400 {
        up.write(
            &format!("pkg{}/sub{}/file{i}.txt", i % 8, i % 5),
            format!("file {i}\n{}", "x".repeat(i)),
        );
    }
    up.write_exec("tools/build.sh", "#!/bin/sh\n");
    up.symlink("tools/link", "build.sh");
    up.commit_all("plain", DATE1);
    up.git(["tag", "plain"]);
    // `main`: the same plus four files git itself reads during status.
    up.write(".gitignore", "*.log\n");
    up.write("pkg1/.gitignore", "*.tmp\n");
    up.write("pkg2/sub2/.gitignore", "out/\n");
    up.write(".gitattributes", "*.bin binary\n");
    up.commit_all("ignore files", DATE2);
    d.cli_ok(["mirror", "add", "proj", &up.path.to_string_lossy()]);

    // --- the first status opens no base content at all
    let ws = d.open_thread("a", &["--project", "proj", "--ref", "plain"]);
    assert_eq!(base_content_opens(&d, "a"), 0, "before any status");
    let first = traced_status(&ws, &["--porcelain=v2", "--branch"]);
    assert_eq!(
        base_content_opens(&d, "a"),
        0,
        "the first `git status` in a fresh workspace opened base content (re-hashed files?)\n{}",
        first.trace
    );
    assert_eq!(
        first.stdout,
        format!(
            "# branch.oid {}\n# branch.head octofs/a\n",
            git_ok(&up.path, &["rev-parse", "plain"]).trim()
        ),
        "the first status is clean"
    );
    assert!(
        first.trace.contains("fsmonitor process") && first.trace.contains("returned success"),
        "the first status did not run the fsmonitor hook:\n{}",
        first.trace
    );
    // The seeded index carries a token for the fork, so even the first status is incremental: git
    // asks what changed since the fork instead of examining all 402 files.
    assert!(
        token_read(&first.trace).is_some_and(|t| t.starts_with("octofs:"))
            && !first.trace.contains("query/trivial-response"),
        "the first status was not answered from the journal (no token in the seeded index, or \
         \"everything\"):\n{}",
        first.trace
    );
    let long = git_ok(&ws, &["status"]);
    assert!(
        long.contains("nothing to commit, working tree clean"),
        "{long}"
    );
    assert_eq!(base_content_opens(&d, "a"), 0, "after the second status");

    // With .gitignore/.gitattributes files in the base, git reads exactly those (as it does in any
    // checkout); no tracked content beyond them.
    let ws_b = d.open_thread("b", &["--project", "proj"]);
    let st = git_ok(&ws_b, &["status", "--porcelain"]);
    assert!(st.is_empty(), "fresh workspace b is not clean:\n{st}");
    let opens_b = base_content_opens(&d, "b");
    assert!(
        opens_b <= 4,
        "first status with 4 ignore/attribute files opened {opens_b} base files"
    );
    eprintln!("first status, base with 3 .gitignore + 1 .gitattributes: {opens_b} base opens");

    // --- the second status asks the hook with the token the first one stored
    let mut mon = Monitor {
        ws: ws.clone(),
        not_incremental: Vec::new(),
    };
    mon.status("unchanged", &["--porcelain=v2", "--branch"], Answer::Paths);

    // --- modify 10 files (in-process, through the mount): status lists exactly those 10
    let ten: Vec<String> = (0..10)
        .map(|k| {
            let i = k * 37 + 3;
            format!("pkg{}/sub{}/file{i}.txt", i % 8, i % 5)
        })
        .collect();
    let (w2, t2) = (ws.clone(), ten.clone());
    with_timeout("modify 10 files", FS_TIMEOUT, move || {
        for p in &t2 {
            use std::io::Write;
            let mut f = fs::OpenOptions::new()
                .append(true)
                .open(w2.join(p))
                .expect("open for append");
            f.write_all(b"modified\n").expect("append");
        }
    });
    let opens_before = base_content_opens(&d, "a");
    let short = mon.status("10 modified", &["--porcelain"], Answer::Paths);
    let listed: BTreeSet<String> = short.lines().map(str::to_string).collect();
    let expected: BTreeSet<String> = ten.iter().map(|p| format!(" M {p}")).collect();
    assert_eq!(listed, expected, "git status after modifying 10 files");
    assert_eq!(
        base_content_opens(&d, "a"),
        opens_before,
        "git status opened base content in a workspace with 10 modified files"
    );

    // --- changes by another process between two statuses, round after round
    sh_in(
        &ws,
        "echo new > top-new.txt
         echo new > pkg0/sub0/new-in-base-dir.txt
         echo appended >> pkg1/sub1/file1.txt
         printf 'file 2\\nxX' > pkg2/sub2/file2.txt   # same size, other bytes
         rm pkg3/sub3/file3.txt
         mv pkg4/sub4/file4.txt pkg4/sub4/file4-renamed.txt
         mv pkg5/sub0/file5.txt pkg6/file5-moved.txt",
    );
    mon.round("files created, modified, deleted, renamed");

    sh_in(
        &ws,
        "mkdir -p fresh/a/b && echo x > fresh/a/b/c.txt && echo y > fresh/a/d.txt
         mv pkg7/sub2 pkg7/sub2-renamed
         rm -r pkg6/sub1
         mv fresh/a fresh/a-renamed
         mkdir empty-dir",
    );
    mon.round("directories created, renamed, deleted");

    sh_in(
        &ws,
        "chmod +x pkg0/sub1/file16.txt
         rm pkg0/sub2/file32.txt && ln -s file16.txt pkg0/sub2/file32.txt
         ln -sf ../tools tools/link
         touch pkg1/sub3/file33.txt
         cat pkg1/sub4/file9.txt > /tmp/octofs-git-ws-$$ && cat /tmp/octofs-git-ws-$$ > pkg1/sub4/file9.txt && rm /tmp/octofs-git-ws-$$
         mv -f pkg2/sub1/file26.txt pkg2/sub3/file18.txt
         echo ignored > debug.log",
    );
    mon.round("mode change, type change, touch, same content, rename-over");

    // A hard link reports its new name (the content did not change). A later write through one
    // name must show under both; the journal cannot name every path of a multiply-linked inode, so
    // the daemon may answer "everything" for it (safe).
    sh_in(&ws, "ln pkg2/sub0/file10.txt pkg2/hardlink.txt");
    mon.round("a hard link");
    sh_in(&ws, "echo via-the-link >> pkg2/hardlink.txt");
    mon.round_answer("a write through the hard link", Answer::MayBeEverything);
    sh_in(&ws, "echo after > pkg3/after-the-link.txt");
    mon.round("a change after the hard-link rounds");

    // git itself changes the tree (checkout of some paths, add, commit): still exact.
    git_ok(&ws, &["checkout", "--", "pkg1", "pkg2/sub2"]);
    mon.round("after git checkout -- paths");
    // git writes each loose object as a temporary file hard-linked to its final name in .git.
    git_ok(&ws, &["add", "-A", "pkg0", "fresh"]);
    mon.round("after git add");
    git_ok(&ws, &["commit", "-q", "-m", "some of it"]);
    mon.round("after a commit");

    // A file held open for writing while status runs, then closed.
    let w2 = ws.clone();
    let mut held = with_timeout("open for writing", FS_TIMEOUT, move || {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .open(w2.join("pkg3/sub1/file11.txt"))
            .expect("open");
        f.write_all(b"FILE").expect("write");
        f
    });
    mon.round("a file open for writing");
    with_timeout("write more and close", FS_TIMEOUT, move || {
        use std::io::Write;
        held.write_all(b"more bytes\n").expect("write");
        drop(held);
    });
    mon.round("after it was closed");

    // Back to clean, then one more change: a status after a clean one still sees it.
    git_ok(&ws, &["reset", "-q", "--hard"]);
    git_ok(&ws, &["clean", "-q", "-fdx"]);
    let clean = mon.round("reset --hard + clean -fdx");
    assert!(clean.is_empty(), "not clean after reset/clean:\n{clean}");
    sh_in(&ws, "echo late >> pkg5/sub0/file5.txt");
    let late = mon.round("one change after a clean status");
    assert!(
        late.lines().count() == 1
            && late.starts_with("1 .M ")
            && late.trim_end().ends_with(" pkg5/sub0/file5.txt"),
        "{late}"
    );

    // Every answer above was correct; this checks that they were also incremental (O(changed
    // paths)), as invariant 6 requires.
    assert!(
        mon.not_incremental.is_empty(),
        "the fsmonitor hook answered \"everything\" to a current token (status correct, but it \
         then costs O(files), not O(changed paths)):\n{}",
        mon.not_incremental.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Lock contention

#[test]
fn index_lock_contention_and_atomic_index_rename() {
    let d = Daemon::start();
    let up = GitRepo::init(&d.base.join("upstream"));
    for i in 0..50 {
        up.write(&format!("d{}/f{i}.txt", i % 5), format!("{i}\n"));
    }
    up.commit_all("base", DATE1);
    d.cli_ok(["mirror", "add", "proj", &up.path.to_string_lossy()]);
    let ws = d.open_thread("w", &["--project", "proj"]);
    git_ok(&ws, &["status", "--porcelain"]);

    // --- two writers racing for index.lock
    const ROUNDS: usize = 60;
    let script = |tag: &str| {
        format!(
            "i=0; while [ $i -lt {ROUNDS} ]; do i=$((i+1)); f=race-{tag}-$i.txt; echo $i > $f; \
             if git add $f 2>{err}; then echo ok $f; else echo \"fail $f $?\"; \
             cat {err}; echo .; fi; done",
            err = d.base.join(format!("err-{tag}")).display()
        )
    };
    let spawn = |tag: &str| {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(script(tag))
            .current_dir(&ws)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .process_group(0);
        c
    };
    // Both run concurrently; each captures its own output.
    let (a, b) = std::thread::scope(|s| {
        let ha = s.spawn(|| run(&mut spawn("a"), Duration::from_secs(60)));
        let hb = s.spawn(|| run(&mut spawn("b"), Duration::from_secs(60)));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    a.assert_ok();
    b.assert_ok();
    let lock_msg = format!(
        "fatal: Unable to create '{}/.git/index.lock': File exists.",
        ws.display()
    );
    let mut ok_files = Vec::new();
    let mut failures = 0;
    for out in [&a, &b] {
        let text = out.stdout_str();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if let Some(f) = l.strip_prefix("ok ") {
                ok_files.push(f.to_string());
            } else if l.starts_with("fail ") {
                failures += 1;
                let mut msg = Vec::new();
                for m in lines.by_ref() {
                    if m == "." {
                        break;
                    }
                    msg.push(m);
                }
                assert!(
                    msg.first() == Some(&lock_msg.as_str()),
                    "`git add` failed with something other than git's lock error ({l}):\n{}\n\
                     --- daemon log ---\n{}",
                    msg.join("\n"),
                    d.log_tail()
                );
            } else {
                panic!("unexpected output line {l:?}");
            }
        }
    }
    eprintln!(
        "lock race: {} adds succeeded, {failures} got git's lock error",
        ok_files.len()
    );
    assert_eq!(ok_files.len() + failures, 2 * ROUNDS);
    let lock = ws.join(".git/index.lock");
    assert!(
        !with_timeout("stat index.lock", FS_TIMEOUT, move || lock.exists()),
        "index.lock left behind"
    );
    let fsck = git_out(&ws, DATE1, &["fsck", "--full", "--strict", "--no-dangling"]);
    assert!(
        fsck.success() && fsck.stdout.is_empty(),
        "fsck after the race: {}",
        fsck.describe()
    );
    let staged: BTreeSet<String> = git_ok(&ws, &["diff", "--cached", "--name-only"])
        .lines()
        .map(str::to_string)
        .collect();
    for f in &ok_files {
        assert!(
            staged.contains(f),
            "{f}: `git add` succeeded but it is not in the index (lost update)"
        );
    }
    // The files whose add failed are simply untracked; status works and agrees with itself.
    let status = git_ok(&ws, &["status", "--porcelain=v2", "-uall"]);
    assert_eq!(status, reference_status(&ws, &["--porcelain=v2", "-uall"]));
    assert_eq!(status.lines().count(), 2 * ROUNDS, "{status}");

    // --- a reader never sees .git/index missing while git renames index.lock over it
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(AtomicU64::new(0));
    let inos = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let index = ws.join(".git/index");
    let reader = {
        let (stop, stats, inos, index) = (stop.clone(), stats.clone(), inos.clone(), index.clone());
        std::thread::spawn(move || -> Result<(), String> {
            while !stop.load(Ordering::Relaxed) {
                match fs::symlink_metadata(&index) {
                    Ok(m) => {
                        inos.lock().unwrap().insert(m.ino());
                    }
                    Err(e) => return Err(format!("stat .git/index: {e}")),
                }
                if let Err(e) = fs::File::open(&index) {
                    return Err(format!("open .git/index: {e}"));
                }
                stats.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        })
    };
    let writer = run(
        Command::new("sh")
            .arg("-ec")
            .arg(
                "i=0; while [ $i -lt 150 ]; do i=$((i+1)); echo $i >> stream.txt; \
                 git add stream.txt; done",
            )
            .current_dir(&ws)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1"),
        Duration::from_secs(60),
    );
    stop.store(true, Ordering::Relaxed);
    let reader_result = with_timeout("join the reader", FS_TIMEOUT, move || reader.join());
    writer.assert_ok();
    let n = stats.load(Ordering::Relaxed);
    let distinct = inos.lock().unwrap().len();
    eprintln!("index rename race: {n} stat+open pairs, {distinct} distinct index inode numbers");
    match reader_result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!(
            "a concurrent reader saw .git/index missing after {n} successful reads: {e}\n\
             --- daemon log ---\n{}",
            d.log_tail()
        ),
        Err(p) => std::panic::resume_unwind(p),
    }
    assert!(
        n > 100,
        "the reader ran too few times ({n}) to prove anything"
    );
    assert!(
        distinct > 10,
        "the reader saw only {distinct} index versions: the race was not exercised"
    );
    let fsck = git_out(&ws, DATE1, &["fsck", "--full", "--strict", "--no-dangling"]);
    assert!(
        fsck.success() && fsck.stdout.is_empty(),
        "{}",
        fsck.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// `git fsck` in a workspace (issue 32, item 8)

/// `git fsck` in a workspace calls none of the mirror's commits dangling: the snapshots of other
/// threads, a named snapshot and the thread's own are reachable from the reflog of its
/// `refs/octomate/saved` mark (written with the mark), while `git log --all` and `for-each-ref`
/// still show only what a clone has. Before: `dangling commit <id>` for the other thread's snapshot
/// and the named one.
#[test]
fn fsck_in_a_workspace_finds_nothing_dangling() {
    let d = Daemon::start();
    add_project(&d, "p", &[("a.txt", "a\n", 0o644)]);
    let other = d.open_thread("other", &["--project", "p"]);
    let o = other.clone();
    with_timeout("write", FS_TIMEOUT, move || {
        write_file(&o.join("o.txt"), b"other\n", 0o644)
    });
    let other_snap = d.cli_ok(["snapshot", "other"]).trim().to_string();
    let named = d
        .cli_ok(["snapshot", "other", "--name", "n"])
        .trim()
        .to_string();
    let ws = d.open_thread("t", &["--project", "p"]);
    let w = ws.clone();
    with_timeout("write", FS_TIMEOUT, move || {
        write_file(&w.join("t.txt"), b"mine\n", 0o644)
    });
    d.cli_ok(["snapshot", "t"]);
    let check = |ws: &Path, when: &str| {
        let out = git_out(ws, DATE1, &["fsck"]);
        out.assert_ok();
        let said = format!("{}{}", out.stdout_str(), out.stderr_str());
        assert!(
            !said.contains("dangling") && !said.contains("error"),
            "{when}: git fsck says:\n{said}"
        );
        let all = git_ok(ws, &["log", "--all", "--format=%H %D"]);
        assert!(
            !all.contains(&other_snap) && !all.contains(&named) && !all.contains("octomate"),
            "{when}: git log --all shows the mirror's snapshots:\n{all}"
        );
        // (The workspace's own mark, refs/octomate/saved, is its only octofs ref, as before.)
        let refs = git_ok(ws, &["for-each-ref", "--format=%(refname)"]);
        assert!(
            refs.lines()
                .all(|r| r == "refs/octomate/saved" || !r.contains("octomate"))
                && !refs.contains("refs/snapshots"),
            "{when}: {refs}"
        );
    };
    check(&ws, "after a snapshot");
    d.cli_ok(["release", "t"]);
    let ws = d.open_thread("t", &[]);
    check(&ws, "resumed");
    d.cli_ok(["release", "t"]);
    d.cli_ok(["release", "other"]);
}
