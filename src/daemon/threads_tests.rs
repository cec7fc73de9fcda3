//! The lifecycle carried out by the daemon's own code, without a kernel mount: a daemon in a
//! temporary state directory whose mounter holds each core without mounting it
//! ([`super::super::mounter::CoreOnly`]), so that open → write through the core → release → resume
//! runs as an ordinary user, without root or `/dev/fuse`.

use super::*;
use crate::daemon::io_auto::IoSetting;
use crate::daemon::mounter::{CoreOnly, Mounter};
use crate::daemon::{Settings, lock};
use crate::fs::{IoMode, ROOT_INO};
use crate::layout::Layout;
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A daemon serving `dir/state` and `dir/root` through a core-only mounter, with project `p`
/// made from a folder holding `hello.txt`.
fn daemon(dir: &Path) -> (Daemon, Arc<CoreOnly>) {
    let layout = Layout {
        state: dir.join("state"),
        root: dir.join("root"),
    };
    crate::private_state::make_private(&layout.state).expect("state dir");
    crate::layout::create_public_dir(&layout.root).expect("root");
    for d in [layout.mirrors(), layout.projects()] {
        crate::layout::create_private_dir(&d).expect("state subdir");
    }
    let settings = Settings {
        freshness_secs: 3600,
        passthrough: false,
        sweep_idle: 0,
        sweep_every: 0,
        fetch_timeout_secs: 60,
        transport: crate::fs::uring::Transport::Auto,
        io: IoSetting::Mode(IoMode::Handles),
        max_threads_per_user: 0,
        quota_per_user: None,
        keep_connections: false,
        metrics: None,
    };
    let mut d = Daemon::new(layout, settings).expect("daemon");
    let mounter = Arc::new(CoreOnly::default());
    d.mounter = mounter.clone();
    let upstream = dir.join("upstream");
    std::fs::create_dir(&upstream).expect("upstream");
    std::fs::write(upstream.join("hello.txt"), b"hello\n").expect("hello.txt");
    d.mirror_add(
        "p",
        upstream.to_str().expect("a UTF-8 path"),
        None,
        Default::default(),
    )
    .expect("mirror add");
    (d, mounter)
}

fn me() -> Caller {
    Caller {
        uid: crate::sys::euid(),
        gid: crate::sys::egid(),
        groups: Vec::new(),
    }
}

fn core(d: &Daemon, thread: &str) -> Option<Arc<WorkspaceFs>> {
    lock(&d.mounts).get(thread).map(|m| m.core.clone())
}

/// Writes `name` at the workspace's root through its core, as a process in the mount would.
fn write(core: &WorkspaceFs, name: &str, bytes: &[u8]) {
    let c = me();
    let who = crate::fs::Caller {
        uid: c.uid,
        gid: c.gid,
    };
    let (attr, opened) = core
        .create(ROOT_INO, OsStr::new(name), 0o644, libc::O_WRONLY, who)
        .expect("create");
    opened.file.write_all_at(bytes, 0).expect("write");
    drop(opened);
    core.release(attr.ino.0, true);
}

#[test]
fn lifecycle_open_write_release_resume_without_a_kernel_mount() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (d, mounter) = daemon(dir.path());
    let me = me();

    // A new thread: a fork of the project, "mounted" by the core-only mounter.
    let (opened, _) = d.open("t", Some("p"), None, None, &me).expect("open");
    assert_eq!(opened.path, d.layout.mountpoint("t").display().to_string());
    let c = core(&d, "t").expect("served");
    assert_eq!(
        c.read_file(&[b"hello.txt"]).expect("read"),
        Some(b"hello\n".to_vec())
    );
    write(&c, "note.txt", b"written through the core\n");
    drop(c);

    // A second open by the same caller joins it (one holder); a busy mount refuses the release.
    d.open("t", None, None, None, &me).expect("join");
    let rec = WorkspaceRecord::load(&d.layout, "t")
        .expect("record")
        .expect("live");
    assert_eq!(rec.holders(), vec![me.uid]);
    let mountpoint = d.layout.mountpoint("t");
    mounter.set_busy(&mountpoint, true);
    let e = d.release("t", false, false, &me).expect_err("busy");
    assert_eq!(
        e.to_string(),
        format!(
            "{} is busy (a process still has its working directory or files in it); stop them or use --force",
            mountpoint.display()
        )
    );
    assert!(core(&d, "t").is_some(), "a refused release changes nothing");
    mounter.set_busy(&mountpoint, false);

    // The release saves, "unmounts" and drops the upper layer.
    let (answer, _) = d.release("t", false, false, &me).expect("release");
    assert!(answer.released && !answer.already);
    assert!(answer.snapshot.is_some(), "saved: {answer:?}");
    assert!(core(&d, "t").is_none());
    assert!(!d.layout.workspace("t").exists());
    let (again, _) = d.release("t", false, false, &me).expect("release again");
    assert!(again.already);

    // --ref on a released thread is refused; a plain open resumes what was written.
    let e = d
        .open("t", None, Some("main"), None, &me)
        .expect_err("--ref");
    assert_eq!(
        e.to_string(),
        "thread t was released; it resumes from its last snapshot (--ref applies only when a thread is created)"
    );
    d.open("t", None, None, None, &me).expect("resume");
    let c = core(&d, "t").expect("served again");
    assert_eq!(
        c.read_file(&[b"note.txt"]).expect("read"),
        Some(b"written through the core\n".to_vec())
    );
    drop(c);

    // A mount taken away behind the daemon is mounted again by the next open.
    mounter.take_away(&mountpoint);
    d.open("t", None, None, None, &me).expect("remount");
    assert!(mounter.kernel_dev(&mountpoint, "t").is_some());

    // Sweep keeps it (just active), then a forced release drops it.
    let (swept, _) = d.sweep(3600).expect("sweep");
    assert!(swept.released.is_empty());
    assert_eq!(swept.kept.first().map(|k| k.why.as_str()), Some("active"));
    let (answer, _) = d.release("t", true, false, &me).expect("release");
    assert!(answer.released);
}

#[test]
fn lifecycle_when_idle_waits_for_the_mount_and_the_sweep_releases_a_saved_idle_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (d, mounter) = daemon(dir.path());
    let me = me();
    d.open("t", Some("p"), None, None, &me).expect("open");
    let mountpoint = d.layout.mountpoint("t");

    // Another user may neither open nor release it.
    let other = Caller {
        uid: me.uid.wrapping_add(1),
        gid: me.gid,
        groups: Vec::new(),
    };
    let e = d
        .open("t", None, None, None, &other)
        .expect_err("not theirs");
    assert!(matches!(e, Error::PermissionDenied(_)), "{e}");

    // The last user's release --when-idle waits while a process uses the mount ...
    mounter.set_busy(&mountpoint, true);
    let (answer, _) = d.release_when_idle("t", &me).expect("when idle");
    assert!(answer.pending && !answer.released);
    assert!(d.has_idle_waits());
    assert!(d.release_idle_waits().is_empty(), "still in use");
    // ... an open cancels it ...
    d.open("t", None, None, None, &me).expect("open again");
    let rec = WorkspaceRecord::load(&d.layout, "t")
        .expect("record")
        .expect("live");
    assert!(!rec.release_when_idle);
    // ... and once asked again, the timer releases it when nothing uses it any more.
    d.release_when_idle("t", &me).expect("when idle");
    mounter.set_busy(&mountpoint, false);
    assert_eq!(d.release_idle_waits(), vec!["t".to_string()]);
    assert!(core(&d, "t").is_none());
    assert!(!d.has_idle_waits());

    // Resumed, it is saved as it was: the sweep's idle rule releases it.
    d.open("t", None, None, None, &me).expect("resume");
    let (swept, _) = d.sweep(0).expect("sweep");
    assert_eq!(swept.released, vec!["t".to_string()], "{:?}", swept.kept);
    assert!(core(&d, "t").is_none());
}
