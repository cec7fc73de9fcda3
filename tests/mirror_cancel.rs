//! Ctrl-C of `octofs mirror add`: the CLI asks the daemon to cancel, the daemon stops git (its
//! whole process group) and keeps nothing — no mirror, no project record, no staging directory —
//! and the CLI exits 130 with one line saying so. The upstream is a server that accepts and never
//! answers, so the clone cannot finish on its own before the cancel (the stall timeout is 300 s).
//! Fails on a CLI that dies on Ctrl-C leaving the daemon cloning (the exit code, the process
//! that keeps the connection), and on a daemon that does not stop git.

use crate::common;

use common::*;
use std::io::Read;
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn state_listing(d: &Daemon) -> Vec<String> {
    let mut names = Vec::new();
    for dir in ["mirrors", "projects"] {
        if let Ok(rd) = std::fs::read_dir(d.state.join(dir)) {
            for e in rd.flatten() {
                names.push(format!("{dir}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    names.sort();
    names
}

#[test]
fn ctrl_c_cancels_a_clone_and_keeps_nothing() {
    let d = Daemon::start();
    // Another project first, so that the state directories exist and must stay as they are.
    let up = GitRepo::init(&d.base.join("upstream"));
    up.write("a.txt", "alpha\n");
    up.commit_all("initial", DATE1);
    d.cli_ok(["mirror", "add", "other", up.path.to_str().unwrap()]);
    let before = state_listing(&d);

    let server = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // Accepts and never answers; hands each connection to the test.
        for c in server.incoming().flatten() {
            if tx.send(c).is_err() {
                break;
            }
        }
    });

    let mut cli = d
        .command()
        .args([
            "mirror",
            "add",
            "p",
            &format!("http://127.0.0.1:{port}/repo.git"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // git is talking to the server: the clone runs.
    let mut conn = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(c) => c,
        Err(e) => {
            let _ = cli.kill();
            let _ = cli.wait();
            panic!("the clone never reached the server: {e}");
        }
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    run(
        std::process::Command::new("kill").args(["-INT", &cli.id().to_string()]),
        CMD_TIMEOUT,
    )
    .assert_ok();
    let Some(status) = wait_timeout(&mut cli, Duration::from_secs(30)) else {
        let _ = cli.kill();
        let _ = cli.wait();
        panic!("mirror add did not end within 30 s of Ctrl-C");
    };
    let mut err = String::new();
    cli.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    eprintln!("cancelled in {} ms: {err}", started.elapsed().as_millis());
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("cancelling"), "{err}");
    let last = err.trim().lines().last().unwrap_or("");
    assert!(
        last.contains("cancelled; nothing was kept"),
        "the last line does not say it was cancelled: {err}"
    );
    // git was stopped: its connection to the server is closed.
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) => panic!("git still holds its connection after the cancel: {e}"),
        }
    }
    // Nothing of `p` was kept.
    assert_eq!(state_listing(&d), before);
    assert!(!d.cli_ok(["mirror", "list"]).contains("p "));
    // And the name is free: the same project added from a real upstream works.
    d.cli_ok(["mirror", "add", "p", up.path.to_str().unwrap()]);
    d.cli_ok(["mirror", "sync", "p"]);
}
