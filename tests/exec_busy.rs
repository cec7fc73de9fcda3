//! A program running from a workspace is protected as on a local file system: every open that would
//! truncate it is refused with `ETXTBSY` and leaves it whole, and once it has exited the same open
//! truncates.
//!
//! The case that needs the daemon: the kernel sends `O_TRUNC` with the FUSE open (octofs asks for
//! atomic `O_TRUNC`) and checks for a running executable only after that open answered. Write opens
//! are refused before they are sent, but `open(O_RDONLY|O_TRUNC)` reached the daemon, which emptied
//! the file — the caller was told `ETXTBSY`, and the running program died of `SIGBUS` on its next
//! page fault (pjdfstest's `open::etxtbsy` caught it now and then). Each round below failed on that
//! code; the daemon now counts the kernel's exec opens (`FMODE_EXEC`) per inode.

use crate::common;

use common::*;
use std::fs;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn open_flags(path: &Path, flags: i32) -> std::io::Result<fs::File> {
    let mut o = fs::OpenOptions::new();
    o.custom_flags(flags & !libc::O_ACCMODE);
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    o.open(path)
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn sleep_binary() -> Vec<u8> {
    let which = sh("sh", ["-c", "command -v sleep"]);
    fs::read(which.stdout_str().trim()).expect("read the sleep binary")
}

fn run_program(path: &Path) -> Child {
    spawn_written_program(Command::new(path).arg("30"))
}

fn rounds(passthrough: bool) {
    // The two tests run in threads of one process: a fork by one (a daemon, a shell, a program)
    // while the other holds a program open for writing gives the child a writable copy of that
    // descriptor until it execs, and the other's exec then fails with ETXTBSY (the kernel is
    // right). They run one after the other.
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let thread = if passthrough { "exec-pt" } else { "exec-np" };
    let s = one_file_workspace(passthrough, thread, "exec\n");
    let program = sleep_binary();
    for round in 0..15 {
        let path = s.mount.join(format!("prog-{round}"));
        fs::write(&path, &program).expect("copy the program in");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut child = run_program(&path);
        for flags in [
            libc::O_WRONLY,
            libc::O_RDWR,
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_TRUNC,
        ] {
            let err = open_flags(&path, flags).expect_err("a running program opened to truncate");
            assert_eq!(
                err.raw_os_error(),
                Some(libc::ETXTBSY),
                "round {round}, flags {flags:#x}: {err}"
            );
        }
        assert_eq!(
            fs::metadata(&path).expect("stat").len(),
            program.len() as u64,
            "round {round}: a refused open changed the running program"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            child.try_wait().expect("wait").is_none(),
            "round {round}: the program died while running ({:?})",
            child.try_wait()
        );
        child.kill().expect("kill");
        child.wait().expect("reap");
        // The exec handle's release reaches the daemon after the exit: until then the kernel may
        // already allow what the daemon still refuses, never the other way round.
        let started = Instant::now();
        let truncated = loop {
            match open_flags(&path, libc::O_RDONLY | libc::O_TRUNC) {
                Ok(f) => break f,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(5),
                        "round {round}: still ETXTBSY 5 s after the program exited"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("round {round}: open after exit: {e}"),
            }
        };
        drop(truncated);
        assert_eq!(fs::metadata(&path).expect("stat").len(), 0, "round {round}");
        fs::remove_file(&path).expect("unlink");
    }
}

#[test]
fn a_running_program_is_not_truncated_with_passthrough() {
    rounds(true);
}

#[test]
fn a_running_program_is_not_truncated_without_passthrough() {
    rounds(false);
}
