//! Installing and running octofs as a system service: `scripts/install` (staged with `DESTDIR`)
//! puts the binary, a systemd unit that `systemd-analyze verify` accepts, completions for three
//! shells and a man page per command in place; and the daemon speaks systemd's readiness protocol
//! (`Type=notify`): `READY=1` only once its control socket answers, `STOPPING=1` when it stops.

use crate::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn repo_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn install_stages_binary_unit_completions_and_man_pages() {
    let dest = tempfile::tempdir().expect("tempdir");
    let out = run(
        Command::new(repo_dir().join("scripts/install"))
            .args(["--bin", bin()])
            .env("DESTDIR", dest.path())
            .env("PREFIX", "/usr/local"),
        Duration::from_secs(120),
    );
    out.assert_ok();
    let root = dest.path();
    let installed = root.join("usr/local/bin/octofs");
    let mode = std::fs::metadata(&installed)
        .expect("binary")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "binary mode");

    let unit =
        std::fs::read_to_string(root.join("etc/systemd/system/octofs.service")).expect("unit");
    assert!(
        unit.contains("ExecStart=/usr/local/bin/octofs serve"),
        "{unit}"
    );
    assert!(unit.contains("Type=notify"), "{unit}");
    assert!(unit.contains("KillMode=process"), "{unit}");
    assert!(!unit.contains("@BIN@"), "{unit}");
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        // The installed unit, with ExecStart pointing at the staged binary, verifies.
        let check = tempfile::tempdir().expect("tempdir");
        let staged = unit.replace("/usr/local/bin/octofs", &installed.display().to_string());
        std::fs::write(check.path().join("octofs.service"), staged).expect("write");
        let v = run(
            Command::new("systemd-analyze")
                .args(["verify", "--man=no"])
                .arg(check.path().join("octofs.service")),
            Duration::from_secs(60),
        );
        assert!(v.success() && v.stderr.is_empty(), "{}", v.describe());
    }

    let bash = root.join("usr/local/share/bash-completion/completions/octofs");
    let b = run(
        Command::new("bash").args([
            "-c",
            &format!(
                "source {} && complete -p octofs && COMP_WORDS=(octofs mir); COMP_CWORD=1; COMP_LINE='octofs mir'; COMP_POINT=10; _octofs octofs mir octofs; echo \"${{COMPREPLY[@]}}\"",
                bash.display()
            ),
        ]),
        Duration::from_secs(30),
    );
    b.assert_ok();
    assert!(b.stdout_str().contains("mirror"), "{}", b.describe());
    for f in [
        "usr/local/share/zsh/site-functions/_octofs",
        "usr/local/share/fish/vendor_completions.d/octofs.fish",
    ] {
        let text = std::fs::read_to_string(root.join(f)).expect(f);
        assert!(text.contains("snapshot") && text.contains("mirror"), "{f}");
    }
    let man = root.join("usr/local/share/man/man1");
    for page in [
        "octofs.1",
        "octofs-open.1",
        "octofs-mirror-add.1",
        "octofs-serve.1",
    ] {
        let text = std::fs::read_to_string(man.join(page)).expect(page);
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}: {text}"
        );
    }
    // The fsmonitor hook is internal: no page for it.
    assert!(!man.join("octofs-fsmonitor.1").exists());

    // Installing again (an upgrade) replaces everything and still succeeds.
    run(
        Command::new(repo_dir().join("scripts/install"))
            .args(["--bin", bin()])
            .env("DESTDIR", dest.path()),
        Duration::from_secs(120),
    )
    .assert_ok();
}

fn readiness(abstract_name: bool) {
    let d = Daemon::unstarted();
    let dir = tempfile::tempdir().expect("tempdir");
    let (listener, addr) = if abstract_name {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("octofs-test-notify-{}", std::process::id());
        let a = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        (
            UnixDatagram::bind_addr(&a).expect("bind"),
            format!("@{name}"),
        )
    } else {
        let p = dir.path().join("notify.sock");
        (
            UnixDatagram::bind(&p).expect("bind"),
            p.display().to_string(),
        )
    };
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut child = Reaped(
        d.command()
            .arg("serve")
            .env("NOTIFY_SOCKET", &addr)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn serve"),
    );
    let mut buf = [0u8; 512];
    let n = listener.recv(&mut buf).expect("READY=1 within 30 s");
    // The control socket answers at the moment READY=1 arrives (connecting directly: the CLI would
    // start a daemon of its own).
    let connected = std::os::unix::net::UnixStream::connect(d.socket());
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(
        msg.lines()
            .any(|l| l == format!("MAINPID={}", child.0.id())),
        "{msg}"
    );
    assert!(
        connected.is_ok(),
        "the socket did not answer at READY: {connected:?}"
    );
    d.cli_ok(["stop"]);
    let n = listener.recv(&mut buf).expect("STOPPING=1");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg}");
    let status = wait_timeout(&mut child.0, Duration::from_secs(30)).expect("daemon exits");
    assert!(status.success(), "{status:?}");
}

/// A daemon this test started: killed and reaped if the test fails before it stopped.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn serve_notifies_readiness_and_stopping_on_a_path_socket() {
    readiness(false);
}

#[test]
fn serve_notifies_readiness_and_stopping_on_an_abstract_socket() {
    readiness(true);
}
