//! A fork (and a resume) applies its saved change set as one catalog batch: checked through real
//! mounts that a 1,000-path change set of every kind (modified, deleted, new and untracked files
//! in new directories, modes, symlinks, an agent commit) arrives byte-identical, and is still
//! byte-identical after the daemon is killed with SIGKILL right after the fork's answer (the
//! workspace then comes back from its catalog alone: a record the batch left out, or a batch
//! not written before the answer, shows as a missing or stale path), and after a release and a
//! resume of the fork.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const FS_TIMEOUT: Duration = Duration::from_secs(60);

#[track_caller]
fn g(dir: &Path, args: &[&str]) -> String {
    let out = run(git_command(dir, DATE1).args(args), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str().trim().to_string()
}

/// Every entry of a workspace but `.git`, and HEAD's commit.
fn state(mount: &Path) -> (BTreeMap<String, String>, String, String) {
    let m = mount.to_path_buf();
    let files = with_timeout("list the workspace", FS_TIMEOUT, move || {
        tree_listing(&m)
            .into_iter()
            .filter(|(k, _)| k != ".git" && !k.starts_with(".git/"))
            .collect()
    });
    let status = g(mount, &["status", "--porcelain=v1", "-uall"]);
    (files, g(mount, &["rev-parse", "HEAD"]), status)
}

fn restart(d: &mut Daemon, mounts: &[&Path]) {
    for m in mounts {
        run(
            Command::new("umount").arg("-l").arg(m),
            Duration::from_secs(10),
        )
        .assert_ok();
    }
    d.spawn();
    let all: Vec<_> = mounts.iter().map(|m| m.to_path_buf()).collect();
    wait_mounted(&all, Duration::from_secs(20));
}

#[test]
fn a_fork_of_1000_changed_paths_is_identical_and_survives_sigkill() {
    let mut d = Daemon::start();
    let up = GitRepo::init(&d.base.join("up"));
    for i in 0..1200 {
        up.write(
            &format!("d{:02}/s{}/f{i}.txt", i / 100, i % 5),
            format!("file {i}\n"),
        );
    }
    up.write_exec("tools/run.sh", "#!/bin/sh\necho hi\n");
    up.symlink("tools/link", "run.sh");
    up.commit_all("base", DATE1);
    d.cli_ok(["mirror", "add", "p", up.path.to_str().unwrap()]);
    let src = d.open_thread("src", &["--project", "p"]);

    let w = src.clone();
    with_timeout("1,000 changes", Duration::from_secs(180), move || {
        // An agent commit first: HEAD moves, the rest stays uncommitted.
        fs::write(w.join("d00/s0/f0.txt"), "committed\n").unwrap();
        g(&w, &["commit", "-q", "-am", "agent"]);
        for i in 0..1200usize {
            let p = w.join(format!("d{:02}/s{}/f{i}.txt", i / 100, i % 5));
            match i % 12 {
                0..=5 => fs::write(&p, format!("changed {i}\n")).unwrap(),
                6 => fs::remove_file(&p).unwrap(),
                7 => fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap(),
                8 => {
                    fs::remove_file(&p).unwrap();
                    std::os::unix::fs::symlink(format!("f{}.txt", i + 1), &p).unwrap();
                }
                _ => {}
            }
        }
        // Untracked files in new directories, and a deleted directory's worth of files.
        for i in 0..150 {
            let p = w.join(format!("new/n{}/u{i}.txt", i % 7));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, format!("untracked {i}\n")).unwrap();
        }
        fs::remove_dir_all(w.join("tools")).unwrap();
    });
    let before = state(&src);
    assert_eq!(
        before.2.lines().count(),
        1200 / 12 * 9 + 150 + 2,
        "the source's change set is not what the test means to fork"
    );

    d.cli_ok_within(["fork", "src", "dst"], Duration::from_secs(60));
    // SIGKILL right after the answer: the fork must come back from what is on disk.
    d.kill9();
    let dst = d.mount("dst");
    restart(&mut d, &[&src, &dst]);
    let after = state(&dst);
    assert_eq!(after.1, before.1, "the fork's HEAD differs after SIGKILL");
    assert_same_listing("the fork after SIGKILL", &before.0, &after.0);
    assert_eq!(
        after.2, before.2,
        "the fork's git status differs after SIGKILL"
    );

    // Released and resumed: the same again (its own snapshot, applied the same way).
    d.cli_ok(["release", "dst"]);
    let dst = d.open_thread("dst", &[]);
    let resumed = state(&dst);
    assert_eq!(resumed.1, before.1, "the resumed fork's HEAD differs");
    assert_same_listing("the resumed fork", &before.0, &resumed.0);
    d.cli_ok(["release", "dst"]);
    d.cli_ok(["release", "src"]);
}
