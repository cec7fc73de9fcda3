//! Issue 28, item 1 (docs/security.md, privilege separation): a remote a caller names (`push --remote`,
//! `pull --remote`, `snapshot --push`) is reached with the caller's authority, never the root
//! daemon's. Each test failed on the code before the far side ran as the caller:
//!
//! 1. [`an_ordinary_user_reaches_no_repository_only_root_can_read`]: user `a` fetched a 0700
//!    root-only repository into the project's mirror (every member then read it) and pushed a
//!    branch and a named snapshot into it; the refusal now says what `a` could learn by itself, and
//!    says the same of a root-only repository as of a missing path.
//! 2. [`a_remote_inside_the_state_or_a_workspace_is_refused`]: `--remote <state>/mirrors/<other>`
//!    read a project whose access list does not name `a`; a repository inside a workspace is a
//!    workspace's content, never a remote (for root either).
//! 3. [`hooks_of_a_remote_never_run_and_a_users_own_repository_works`]: root's push ran the far
//!    repository's `pre-receive` hook as root (the end of the chain of the issue); a push to and a
//!    pull from the user's own repository, refused by git's ownership check while the far side ran
//!    as root, now work — as that user, and with no hook.

use crate::common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};

/// A daemon whose base, state and root an ordinary user can traverse (as on a host), a project
/// `p`, and `a`'s thread `t` of it.
fn setup(a: User) -> (Daemon, PathBuf) {
    let d = Daemon::start();
    open_the_way(&d);
    add_project(&d, "p", &[("README.md", "# p\n", 0o644)]);
    let out = d.cli_as(a, &["open", "t", "--project", "p"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let mount = PathBuf::from(out.stdout_str().trim());
    (d, mount)
}

/// A directory every user can enter, for repositories of their own.
fn public_dir(d: &Daemon, name: &str) -> PathBuf {
    let dir = d.base.join(name);
    fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o755);
    dir
}

fn chown_r(p: &Path, u: User) {
    let out = sh(
        "chown",
        ["-R", &format!("{}:{}", u.uid, u.gid), p.to_str().unwrap()],
    );
    assert!(out.success(), "{}", out.describe());
}

fn has_object(repo: &Path, id: &str) -> bool {
    sh("git", ["-C", repo.to_str().unwrap(), "cat-file", "-e", id]).success()
}

fn refs_of(repo: &Path) -> String {
    // Read as root, also where the repository is a user's (git's ownership check).
    git(
        repo,
        [
            "-c",
            "safe.directory=*",
            "for-each-ref",
            "--format=%(refname) %(objectname)",
        ],
    )
}

#[test]
fn an_ordinary_user_reaches_no_repository_only_root_can_read() {
    let a = user_a();
    let (d, _mount) = setup(a);
    // Root's repository, 0700: the stand-in for the host's secrets.
    let secret = GitRepo::init(&d.base.join("secret"));
    secret.write("secret.txt", "root's secret\n");
    let commit = secret.commit_all("secret", DATE1);
    secret.git(["update-ref", "refs/snapshots/x", &commit]);
    chmod(&secret.path, 0o700);
    let before = refs_of(&secret.path);
    let spath = secret.path.to_str().unwrap().to_string();
    let mirror = d.mirror("p");

    let pull = d.cli_as(a, &["pull", "t", "--remote", &spath, "--name", "x"]);
    pull.assert_one_line_error(&[&spath]);
    assert!(
        !has_object(&mirror, &commit),
        "root's commit was fetched into the project's mirror:\n{}",
        pull.describe()
    );
    // The same words as for a path where nothing is: nothing about what root keeps there.
    let missing = d.base.join("nothing-here");
    let mpath = missing.to_str().unwrap();
    let none = d.cli_as(a, &["pull", "t", "--remote", mpath, "--name", "x"]);
    none.assert_one_line_error(&[mpath]);
    assert_eq!(
        pull.stderr_str().replace(&spath, "PATH"),
        none.stderr_str().replace(mpath, "PATH"),
        "the refusals tell a root-only repository from a missing path"
    );
    assert!(
        !pull.stderr_str().contains("refs/snapshots/x ("),
        "{}",
        pull.describe()
    );

    let push = d.cli_as(a, &["push", "t", "--remote", &spath, "--branch", "stolen"]);
    push.assert_one_line_error(&[&spath]);
    let named = d.cli_as(a, &["snapshot", "t", "--name", "n", "--push", &spath]);
    named.assert_failed();
    assert_eq!(
        refs_of(&secret.path),
        before,
        "an ordinary user wrote refs into root's repository"
    );
    // Root itself still reaches it.
    d.cli_ok(["push", "t", "--remote", &spath, "--branch", "from-root"]);
    assert!(refs_of(&secret.path).contains("refs/heads/from-root"));
}

#[test]
fn a_remote_inside_the_state_or_a_workspace_is_refused() {
    let a = user_a();
    let (d, mount) = setup(a);
    // A project `a` may not bind, with a commit only its mirror has.
    let q = add_project(&d, "q", &[("only-q.txt", "q's\n", 0o644)]);
    d.cli_ok(["mirror", "access", "q", "--allow-user", "root"]);
    let q_head = q.head();
    let qmirror = d.mirror("q");
    let qpath = qmirror.to_str().unwrap().to_string();
    let out = d.cli_as(a, &["pull", "t", "--remote", &qpath, "--name", "x"]);
    out.assert_one_line_error(&[&qpath]);
    let out = d.cli_as(a, &["push", "t", "--remote", &qpath, "--branch", "b"]);
    out.assert_one_line_error(&[&qpath]);
    assert!(
        !has_object(&d.mirror("p"), &q_head),
        "project q's commit reached project p's mirror through a pull by a user q does not allow"
    );
    assert!(!refs_of(&qmirror).contains("refs/heads/b "));

    // A repository the agent made inside its own workspace: content of a workspace, not a remote.
    let out = run(
        as_user(a, "git")
            .args(["init", "-q", "--bare", "inner.git"])
            .current_dir(&mount),
        FS_TIMEOUT,
    );
    assert!(out.success(), "{}", out.describe());
    let inner = mount.join("inner.git");
    let ipath = inner.to_str().unwrap();
    let out = d.cli_as(a, &["push", "t", "--remote", ipath, "--branch", "b"]);
    out.assert_one_line_error(&[ipath, "workspace"]);
    // Root's own push there is refused the same way.
    let out = d.cli(["push", "t", "--remote", ipath, "--branch", "b"]);
    out.assert_one_line_error(&[ipath, "workspace"]);
    let refs = fsop("list the inner refs", {
        let inner = inner.clone();
        move || {
            fs::read_dir(inner.join("refs/heads"))
                .map(|r| r.count())
                .unwrap_or(0)
        }
    });
    assert_eq!(refs, 0, "a branch was pushed into a workspace's repository");
    d.cli_ok(["release", "t", "--discard"]);
}

#[test]
fn hooks_of_a_remote_never_run_and_a_users_own_repository_works() {
    let a = user_a();
    let (d, _mount) = setup(a);
    let public = public_dir(&d, "public");
    let marker = public.join("hook-ran");
    let hook = format!("#!/bin/sh\nid -u >> {}\n", marker.display());

    // Root's own bare repository with a pre-receive hook: root's push sends, the hook stays quiet.
    let rootrepo = public.join("root.git");
    git(
        &public,
        ["init", "-q", "--bare", rootrepo.to_str().unwrap()],
    );
    write_file(&rootrepo.join("hooks/pre-receive"), hook.as_bytes(), 0o755);
    let rpath = rootrepo.to_str().unwrap();
    d.cli_ok(["push", "t", "--remote", rpath, "--branch", "b"]);
    assert!(refs_of(&rootrepo).contains("refs/heads/b "));
    assert!(
        !marker.exists(),
        "the remote's pre-receive hook ran as {}",
        fs::read_to_string(&marker).unwrap_or_default()
    );

    // The user's own repository, with the same hook: pushed to and pulled from as the user.
    let own = public.join("own.git");
    git(&public, ["init", "-q", "--bare", own.to_str().unwrap()]);
    write_file(&own.join("hooks/pre-receive"), hook.as_bytes(), 0o755);
    chown_r(&own, a);
    let opath = own.to_str().unwrap();
    let out = d.cli_as(a, &["push", "t", "--remote", opath, "--branch", "mine"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    assert!(refs_of(&own).contains("refs/heads/mine "));

    // A named snapshot of a change, pushed there, then pulled into a second thread at the same base.
    let mount = d.mount("t");
    let out = run(
        as_user(a, "sh")
            .args(["-c", "echo 'from t' > carried.txt"])
            .current_dir(&mount),
        FS_TIMEOUT,
    );
    assert!(out.success(), "{}", out.describe());
    let out = d.cli_as(a, &["snapshot", "t", "--name", "n", "--push", opath]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    assert!(refs_of(&own).contains("refs/snapshots/n "));
    let out = d.cli_as(a, &["open", "t2", "--project", "p"]);
    assert!(out.success(), "{}", out.describe());
    let out = d.cli_as(a, &["pull", "t2", "--remote", opath, "--name", "n"]);
    assert!(out.success(), "{}\n{}", out.describe(), d.log_tail());
    let shown = run(
        as_user(a, "cat")
            .arg("carried.txt")
            .current_dir(d.mount("t2")),
        FS_TIMEOUT,
    );
    assert_eq!(shown.stdout_str(), "from t\n", "{}", shown.describe());
    assert!(
        !marker.exists(),
        "the remote's pre-receive hook ran as {}",
        fs::read_to_string(&marker).unwrap_or_default()
    );
    // Objects the far side wrote are the user's: it ran as them.
    let owners = sh(
        "find",
        [
            opath,
            "-newer",
            own.join("HEAD").to_str().unwrap(),
            "-not",
            "-user",
            &a.uid.to_string(),
        ],
    );
    assert_eq!(owners.stdout_str(), "", "written by another user than a");
    for t in ["t", "t2"] {
        d.cli_ok(["release", t, "--discard"]);
    }
}

/// `mirror add` of a repository another user owns: git refuses it (its ownership check), and the
/// refusal names the owner in one line instead of advice about a `safe.directory` the daemon's git
/// never reads (issue 32, item 6).
#[test]
fn mirror_add_of_another_users_repository_says_whose_it_is() {
    let a = user_a();
    let d = Daemon::start();
    let public = public_dir(&d, "public");
    let theirs = GitRepo::init(&public.join("theirs"));
    theirs.write("f.txt", "x\n");
    theirs.commit_all("x", DATE1);
    chown_r(&theirs.path, a);
    let path = theirs.path.to_str().unwrap();
    let out = d.cli(["mirror", "add", "theirs", path]);
    out.assert_one_line_error(&[path, "octofs-test-user", "belongs to"]);
    assert!(
        !out.stderr_str().contains("safe.directory"),
        "{}",
        out.describe()
    );
    assert!(!d.mirror("theirs").exists());
}
