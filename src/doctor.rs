//! `octofs doctor`: finds what a crash, a kill, a full disk or a hand in the state directory left
//! behind, explains each finding in one line, and with `--fix` repairs what is safe to repair.
//!
//! What it looks at: the daemon (does its socket answer within a bounded time), every FUSE mount
//! under the root (stale: `ENOTCONN`; hung: no answer within [`PROBE`]), every workspace directory
//! (its record, its upper layer, its binding, whether it is mounted), the shared indexes (leftover
//! temporary files, checksums), the blob cache (every file must hash to its name) and the mirrors
//! (a mirror is a checkout on its default branch that only octofs writes).
//!
//! What `--fix` does, and never more: unmounts stale mounts (and hung ones when the daemon does not
//! answer, after aborting their connection); removes derived data that is wrong (a blob-cache file
//! that does not hash to its id, a shared index whose checksum fails, temporary files of fills and
//! builds) — all of it is rebuilt from the mirror on demand; moves a workspace directory that
//! cannot be served to `<state>/quarantine/` (never deletes it: it may hold a user's files); and asks
//! the running daemon to mount again a thread recorded as mounted that the kernel has no mount of
//! (`not-mounted`; files in its bare mount point go into the workspace, docs/restart.md). Changes
//! to workspaces and temporary files are made only while no daemon runs (it holds the daemon lock),
//! so a fix never races a live `open`. It reads the state directory directly (root, or the daemon's
//! user) and runs no git; it never touches a mirror (a finding there says what to run).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use crate::layout::Layout;
use crate::workspace::{Binding, WorkspaceRecord};

/// How long a mount or the daemon may take to answer before it counts as hung.
pub const PROBE: Duration = Duration::from_secs(3);

/// One thing found wrong.
#[derive(Debug, Serialize)]
pub struct Finding {
    /// A stable name: `stale-mount`, `hung-mount`, `kept-mount`, `unknown-mount`, `daemon-unresponsive`,
    /// `orphaned-workspace`, `bad-record`, `missing-upper`, `missing-binding`, `not-mounted`,
    /// `index-leftover`, `corrupt-index`, `blob-leftover`, `corrupt-blob`, `mirror-broken`,
    /// `mirror-changed`.
    pub kind: &'static str,
    pub path: String,
    /// What is wrong, in one line.
    pub detail: String,
    /// What `--fix` does about it, or what the operator should do.
    pub remedy: String,
    /// `--fix` repaired it.
    pub fixed: bool,
}

/// Counts of what was looked at.
#[derive(Debug, Default, Serialize)]
pub struct Checked {
    pub mounts: usize,
    pub workspaces: usize,
    pub indexes: usize,
    pub blobs: usize,
    pub mirrors: usize,
}

/// Something of the host that costs workspaces speed, not a fault: printed, never counted.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Note {
    /// A stable name: `idle-exits`.
    pub kind: &'static str,
    /// What it is and what it costs, in one line.
    pub detail: String,
    /// What the operator can do about it.
    pub remedy: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    /// `running`, `not running` or `not answering`.
    pub daemon: &'static str,
    pub checked: Checked,
    pub findings: Vec<Finding>,
    /// Host settings that slow workspaces down (`doctor` does not fail for them).
    pub notes: Vec<Note>,
}

impl Report {
    /// Findings `--fix` did not repair.
    pub fn unresolved(&self) -> usize {
        self.findings.iter().filter(|f| !f.fixed).count()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum DaemonState {
    Running,
    NotRunning,
    NotAnswering,
}

/// Runs every check; with `fix`, repairs what is safe (module doc).
pub fn run(layout: &Layout, fix: bool) -> Report {
    let daemon = probe_daemon(layout);
    let mut r = Report {
        daemon: match daemon {
            DaemonState::Running => "running",
            DaemonState::NotRunning => "not running",
            DaemonState::NotAnswering => "not answering",
        },
        checked: Checked::default(),
        findings: Vec::new(),
        notes: host_notes(),
    };
    if daemon == DaemonState::NotAnswering {
        r.findings.push(Finding {
            kind: "daemon-unresponsive",
            path: layout.socket().display().to_string(),
            detail: format!(
                "the daemon accepts connections but did not answer within {} s",
                PROBE.as_secs()
            ),
            remedy: format!(
                "see {}; stop it (SIGTERM to its pid) and start it again",
                layout.log_file().display()
            ),
            fixed: false,
        });
    }
    // Changes to workspaces and temporary files only while no daemon can be making them.
    let lock = if fix { take_daemon_lock(layout) } else { None };
    let quiet = lock.is_some();
    check_mounts(layout, daemon, fix, &mut r);
    check_workspaces(layout, daemon, fix && quiet, fix, &mut r);
    check_indexes(layout, fix, quiet, &mut r);
    check_blobs(layout, fix, quiet, &mut r);
    check_mirrors(layout, &mut r);
    if fix && !quiet {
        for f in r.findings.iter_mut().filter(|f| !f.fixed) {
            if matches!(
                f.kind,
                "orphaned-workspace"
                    | "bad-record"
                    | "missing-upper"
                    | "index-leftover"
                    | "blob-leftover"
                    | "corrupt-index"
            ) {
                f.remedy = format!(
                    "stop the daemon, then run doctor --fix again ({})",
                    f.remedy
                );
            }
        }
    }
    drop(lock);
    r
}

fn probe_daemon(layout: &Layout) -> DaemonState {
    let Ok(mut s) = UnixStream::connect(layout.socket()) else {
        return DaemonState::NotRunning;
    };
    let _ = s.set_read_timeout(Some(PROBE));
    let _ = s.set_write_timeout(Some(PROBE));
    let Ok(mut req) = serde_json::to_vec(&crate::proto::Request::List) else {
        return DaemonState::NotAnswering;
    };
    req.push(b'\n');
    if s.write_all(&req).is_err() {
        return DaemonState::NotAnswering;
    }
    let mut line = String::new();
    match BufReader::new(s).read_line(&mut line) {
        Ok(n) if n > 0 => DaemonState::Running,
        _ => DaemonState::NotAnswering,
    }
}

/// The daemon's lock, when no daemon holds it.
fn take_daemon_lock(layout: &Layout) -> Option<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(layout.daemon_lock())
        .ok()?;
    f.try_lock().ok().map(|()| f)
}

/// How a mount answered a `statfs` within [`PROBE`].
enum Probe {
    Ok,
    Stale,
    Hung,
    Failed(std::io::Error),
}

fn probe_mount(path: &Path) -> Probe {
    // In a child process: a probe stuck in a mount whose server took its request cannot be killed
    // out of it, and would keep this process from ending (`sys::statfs_in_child`).
    match crate::sys::statfs_in_child(path, PROBE) {
        Ok(Some(Ok(()))) => Probe::Ok,
        Ok(Some(Err(e))) if e.raw_os_error() == Some(libc::ENOTCONN) => Probe::Stale,
        Ok(Some(Err(e))) => Probe::Failed(e),
        Ok(None) => Probe::Hung,
        Err(e) => Probe::Failed(std::io::Error::other(format!("cannot start a probe: {e}"))),
    }
}

fn check_mounts(layout: &Layout, daemon: DaemonState, fix: bool, r: &mut Report) {
    // A daemon died and its connection keeper holds the mounts for the next one: they wait for a
    // server (a probe would hang), and must not be unmounted (docs/restart.md "A crash").
    // (A daemon that accepts connections but does not answer is not gone: its mounts are hung.)
    let kept = daemon == DaemonState::NotRunning
        && UnixStream::connect(layout.state.join("keeper.sock")).is_ok();
    for mp in crate::sys::fuse_mounts_under(&layout.root) {
        r.checked.mounts += 1;
        let path = mp.display().to_string();
        if kept {
            let mut detail = "the daemon is gone; its connection keeper holds this mount for the \
                              next one (requests wait meanwhile)"
                .to_string();
            if let Some(why) = no_resend() {
                detail.push_str(&format!(
                    "; but {why}: a process waiting for a request the dead daemon had read waits \
                     until it is killed"
                ));
            }
            r.findings.push(Finding {
                kind: "kept-mount",
                path,
                detail,
                remedy: "start the daemon (octofs serve, or any octofs command): it adopts the \
                         mount, nothing is lost"
                    .into(),
                fixed: false,
            });
            continue;
        }
        match probe_mount(&mp) {
            Probe::Ok => {
                let known = mp
                    .strip_prefix(&layout.root)
                    .ok()
                    .and_then(|t| t.to_str())
                    .is_some_and(|t| layout.workspace(t).join("workspace.json").exists());
                if !known && daemon != DaemonState::Running {
                    r.findings.push(Finding {
                        kind: "unknown-mount",
                        path,
                        detail: "a FUSE mount under the root that no workspace of this state \
                                 directory serves"
                            .into(),
                        remedy: "unmount it if it is not another octofs's (umount -l)".into(),
                        fixed: false,
                    });
                }
            }
            Probe::Stale => {
                let fixed = fix && crate::sys::lazy_unmount(&mp).is_ok();
                r.findings.push(Finding {
                    kind: "stale-mount",
                    path,
                    detail: format!(
                        "the mount answers ENOTCONN: the daemon that served it is gone, and {}",
                        why_not_kept(layout)
                    ),
                    remedy: "unmount it (lazily); the workspace is remounted by the next open or \
                             daemon start, nothing in it is lost"
                        .into(),
                    fixed,
                });
            }
            Probe::Hung => {
                let may = daemon != DaemonState::Running;
                let fixed = fix
                    && may
                    && crate::fs::uring::abort_connection(&mp).is_ok()
                    && crate::sys::lazy_unmount(&mp).is_ok();
                r.findings.push(Finding {
                    kind: "hung-mount",
                    path,
                    detail: format!("the mount did not answer within {} s", PROBE.as_secs()),
                    remedy: if may {
                        "abort its FUSE connection and unmount it (lazily); the workspace's \
                         files are in its upper layer"
                            .into()
                    } else {
                        "the daemon answers but this mount does not: see the daemon log; \
                         restart the daemon"
                            .into()
                    },
                    fixed,
                });
            }
            Probe::Failed(e) => r.findings.push(Finding {
                kind: "hung-mount",
                path,
                detail: format!("statfs failed: {e}"),
                remedy: "see the daemon log".into(),
                fixed: false,
            }),
        }
    }
}

/// Why a mount died with its daemon instead of waiting for the next one (docs/restart.md "A
/// crash"): said with every `stale-mount`.
fn why_not_kept(layout: &Layout) -> String {
    if UnixStream::connect(layout.state.join("keeper.sock")).is_ok() {
        // A keeper answers but does not hold this one: it was not given to it.
        return "its connection keeper does not hold it (the daemon could not give it: see the \
                daemon log)"
            .into();
    }
    "no connection keeper held it (the daemon ran with --keep-connections false, or its keeper \
     could not start, or let the connections go after 120 s with no daemon)"
        .into()
}

/// Why this kernel cannot send again the requests a dead daemon had read (`FUSE_NOTIFY_RESEND`,
/// Linux 6.9); `None` when it can.
fn no_resend() -> Option<String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let release = release.trim();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    let (major, minor) = (parts.next()?, parts.next()?);
    ((major, minor) < (6, 9)).then(|| {
        format!(
            "this kernel ({release}) cannot send requests again (FUSE_NOTIFY_RESEND, Linux 6.9)"
        )
    })
}

/// Moves `dir` to `<state>/quarantine/<what>-<name>-<unix time>`; the new path.
fn quarantine(layout: &Layout, dir: &Path, what: &str) -> std::io::Result<PathBuf> {
    let q = layout.state.join("quarantine");
    crate::layout::create_private_dir(&q)?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let dest = q.join(format!("{what}-{name}-{secs}"));
    std::fs::rename(dir, &dest)?;
    Ok(dest)
}

/// `fix`: workspace directories may be moved (no daemon runs); `remount`: a running daemon is
/// asked to mount again what it should serve and the kernel has no mount of.
fn check_workspaces(
    layout: &Layout,
    daemon: DaemonState,
    fix: bool,
    remount: bool,
    r: &mut Report,
) {
    let Ok(dir) = std::fs::read_dir(layout.workspaces()) else {
        return;
    };
    for e in dir.flatten() {
        let ws = e.path();
        if !ws.is_dir() {
            continue;
        }
        let Some(thread) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        r.checked.workspaces += 1;
        let path = ws.display().to_string();
        let has_upper = ws.join("upper").is_dir();
        let record = if ws.join("workspace.json").exists() {
            WorkspaceRecord::load(layout, &thread).map_err(|e| e.to_string())
        } else {
            Ok(None)
        };
        let mut finding = |kind, detail: String, remedy: &str, movable: bool| {
            let fixed = fix && movable && quarantine(layout, &ws, "workspace").is_ok();
            r.findings.push(Finding {
                kind,
                path: path.clone(),
                detail,
                remedy: remedy.into(),
                fixed,
            });
        };
        match record {
            Err(e) => finding(
                "bad-record",
                format!("its record cannot be read: {e}"),
                "move the workspace to <state>/quarantine (its files stay there); the thread's \
                 next open resumes from its last snapshot",
                true,
            ),
            Ok(None) if has_upper => finding(
                "orphaned-workspace",
                "an upper layer without a workspace record (an open or release cut short)".into(),
                "move it to <state>/quarantine; nothing is deleted",
                true,
            ),
            Ok(None) => finding(
                "orphaned-workspace",
                "a workspace directory without a record or an upper layer".into(),
                "move it to <state>/quarantine",
                true,
            ),
            Ok(Some(rec)) => {
                if !has_upper {
                    finding(
                        "missing-upper",
                        "the record names a workspace whose upper layer is gone".into(),
                        "move the record to <state>/quarantine; the thread's next open resumes \
                         from its last snapshot",
                        true,
                    );
                    continue;
                }
                if !rec.chat && !matches!(Binding::load(layout, &thread), Ok(Some(_))) {
                    finding(
                        "missing-binding",
                        format!("no binding of thread {thread} to project {}", rec.project),
                        "open the thread with --project to bind it again",
                        false,
                    );
                }
                let mp = layout.mountpoint(&thread);
                if daemon == DaemonState::Running && rec.mounted && !octofs_mount_at(&mp, &thread) {
                    let mut detail =
                        format!("recorded as mounted at {}, but not mounted", mp.display());
                    if std::fs::read_dir(&mp).is_ok_and(|mut d| d.next().is_some()) {
                        detail.push_str(" (files were written into the bare directory)");
                    }
                    let mut fixed = false;
                    if remount {
                        match ask_remount(layout, &thread) {
                            Ok(notes) => {
                                fixed = true;
                                for n in notes {
                                    detail.push_str(&format!("; {n}"));
                                }
                            }
                            Err(e) => detail.push_str(&format!("; remount failed: {e}")),
                        }
                    }
                    r.findings.push(Finding {
                        kind: "not-mounted",
                        path: path.clone(),
                        detail,
                        remedy: "doctor --fix (or octofs open <thread>) mounts it again; files \
                                 found in the bare mount point are moved into the workspace, \
                                 under .octofs-stray/"
                            .into(),
                        fixed,
                    });
                }
            }
        }
    }
}

/// Whether the topmost mount at `mp` is octofs's mount of `thread` (mountinfo; the mount itself is
/// not asked).
fn octofs_mount_at(mp: &Path, thread: &str) -> bool {
    let canonical = match (mp.parent().map(std::fs::canonicalize), mp.file_name()) {
        (Some(Ok(dir)), Some(name)) => dir.join(name),
        _ => mp.to_path_buf(),
    };
    crate::sys::fuse_mount_at(&canonical)
        .is_some_and(|(_, source)| source == format!("octofs:{thread}"))
}

/// Asks the running daemon to mount `thread` again; its notes (files moved in) on success.
fn ask_remount(layout: &Layout, thread: &str) -> Result<Vec<String>, String> {
    let req = crate::proto::Remount {
        thread: thread.to_string(),
    };
    crate::client::call(layout, req, false)
        .map(|a| a.warnings)
        .map_err(|e| e.to_string())
}

fn remove_leftovers(
    dir: &Path,
    prefix: &str,
    kind: &'static str,
    fix: bool,
    quiet: bool,
    r: &mut Report,
) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with(prefix) {
            continue;
        }
        let fixed = fix && quiet && std::fs::remove_file(e.path()).is_ok();
        r.findings.push(Finding {
            kind,
            path: e.path().display().to_string(),
            detail: "a temporary file of a build or fill that did not finish".into(),
            remedy: "remove it (it is rebuilt when needed)".into(),
            fixed,
        });
    }
}

fn check_indexes(layout: &Layout, fix: bool, quiet: bool, r: &mut Report) {
    let dir = layout.state.join("indexes");
    remove_leftovers(&dir, ".tmp-", "index-leftover", fix, quiet, r);
    for side in ["untracked", "cachetree", "bytes"] {
        remove_leftovers(&dir.join(side), ".tmp-", "index-leftover", fix, quiet, r);
    }
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if e.file_name().to_string_lossy().starts_with('.') || !p.is_file() {
            continue;
        }
        r.checked.indexes += 1;
        if let Err(why) = index_checksum(&p) {
            let fixed = fix && quiet && std::fs::remove_file(&p).is_ok();
            r.findings.push(Finding {
                kind: "corrupt-index",
                path: p.display().to_string(),
                detail: why,
                remedy: "remove it (the next fork of its base builds it again)".into(),
                fixed,
            });
        }
    }
}

/// A git index ends with the hash of everything before it.
fn index_checksum(p: &Path) -> Result<(), String> {
    let data = std::fs::read(p).map_err(|e| format!("cannot read it: {e}"))?;
    if data.len() < 12 + 20 || &data[..4] != b"DIRC" {
        return Err("not a git index".into());
    }
    let (body, sum) = data.split_at(data.len() - 20);
    if crate::git::checksum::sha1(body).as_bytes() != sum {
        return Err("its checksum does not match its content".into());
    }
    Ok(())
}

fn check_blobs(layout: &Layout, fix: bool, quiet: bool, r: &mut Report) {
    let blobs = layout.blobs();
    remove_leftovers(&blobs.join("tmp"), "", "blob-leftover", fix, quiet, r);
    let Ok(rd) = std::fs::read_dir(&blobs) else {
        return;
    };
    for fan in rd.flatten() {
        let prefix = fan.file_name().to_string_lossy().into_owned();
        if prefix.len() != 2 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(fan.path()) else {
            continue;
        };
        for f in files.flatten() {
            r.checked.blobs += 1;
            let p = f.path();
            let name = format!("{prefix}{}", f.file_name().to_string_lossy());
            let why = match gix::ObjectId::from_hex(name.as_bytes()) {
                Err(_) => Some("its name is not an object id".to_string()),
                Ok(id) => match blob_id(&p, id.kind()) {
                    Ok(got) if got == id => None,
                    Ok(got) => Some(format!("its content hashes to {got}")),
                    Err(e) => Some(format!("cannot read it: {e}")),
                },
            };
            if let Some(detail) = why {
                // Removing is safe with a daemon running: open descriptors keep the old file,
                // the next open fills it again from the mirror (verified).
                let fixed = fix && std::fs::remove_file(&p).is_ok();
                r.findings.push(Finding {
                    kind: "corrupt-blob",
                    path: p.display().to_string(),
                    detail,
                    remedy: "remove it (the next read fills it again from the mirror)".into(),
                    fixed,
                });
            }
        }
    }
}

/// The git blob id of the file's content, read in chunks.
fn blob_id(p: &Path, kind: gix::hash::Kind) -> std::io::Result<gix::ObjectId> {
    let mut f = std::fs::File::open(p)?;
    let size = f.metadata()?.len();
    let mut h = gix::hash::hasher(kind);
    h.update(format!("blob {size}\0").as_bytes());
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.try_finalize()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

fn check_mirrors(layout: &Layout, r: &mut Report) {
    let Ok(rd) = std::fs::read_dir(layout.mirrors()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !e.path().is_dir() {
            continue;
        }
        r.checked.mirrors += 1;
        let path = e.path().display().to_string();
        let repo = match gix::open(e.path()) {
            Ok(repo) => repo,
            Err(err) => {
                r.findings.push(Finding {
                    kind: "mirror-broken",
                    path,
                    detail: format!("not a git repository: {err}"),
                    remedy: format!(
                        "octofs mirror sync {name} (a broken mirror is set aside and cloned again)"
                    ),
                    fixed: false,
                });
                continue;
            }
        };
        let head = repo
            .head_name()
            .ok()
            .flatten()
            .map(|h| h.as_bstr().to_string());
        // The project's record names the branch the mirror must be on.
        let default = std::fs::read(layout.projects().join(format!("{name}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("default_branch")?.as_str().map(str::to_string));
        let wrong = match (&head, &default) {
            (None, _) => Some("its HEAD is detached".to_string()),
            (Some(h), Some(d)) if *h != format!("refs/heads/{d}") => {
                Some(format!("its HEAD is {h}, not its default branch {d}"))
            }
            _ => None,
        };
        if let Some(detail) = wrong {
            r.findings.push(Finding {
                kind: "mirror-changed",
                path,
                detail: format!("{detail}; only octofs may move a mirror's HEAD"),
                remedy: format!(
                    "git -C {} checkout {}, then octofs mirror sync {name}",
                    e.path().display(),
                    default.as_deref().unwrap_or("<default branch>")
                ),
                fixed: false,
            });
        }
    }
}

/// The host's CPU idle setting, as sysfs says it.
fn host_notes() -> Vec<Note> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    idle_note(
        read("/sys/devices/system/cpu/cpuidle/current_driver").as_deref(),
        read("/sys/module/haltpoll/parameters/guest_halt_poll_ns").as_deref(),
    )
    .into_iter()
    .collect()
}

/// A virtual machine whose idle CPUs halt at once (the `haltpoll` cpuidle driver with guest halt
/// polling off): a FUSE request or its reply that wakes a thread on an idle CPU then costs a VM
/// exit and entry, and on a quiet host most of a workspace's requests do (docs/performance.md "An
/// idle virtual machine").
fn idle_note(driver: Option<&str>, poll_ns: Option<&str>) -> Option<Note> {
    if driver.map(str::trim) != Some("haltpoll") || poll_ns.map(str::trim) != Some("0") {
        return None;
    }
    Some(Note {
        kind: "idle-exits",
        detail: "this virtual machine's idle CPUs halt at once (cpuidle haltpoll, \
                 guest_halt_poll_ns 0): a FUSE round trip that finds a CPU idle pays a VM exit \
                 (on a quiet 2-vCPU host a 3,311-file checkout ran 3.95x native, 1.72x with \
                 200000)"
            .into(),
        remedy: "echo 200000 > /sys/module/haltpoll/parameters/guest_halt_poll_ns (boot: \
                 haltpoll.guest_halt_poll_ns=200000); an idle CPU then polls up to 0.2 ms \
                 before it halts"
            .into(),
    })
}

/// `octofs doctor` for people: one line per finding, then a summary.
pub fn print(r: &Report, fix: bool) {
    for f in &r.findings {
        let state = if f.fixed {
            "fixed"
        } else if fix {
            "left"
        } else {
            "found"
        };
        println!("{state:5} {:20} {}: {}", f.kind, f.path, f.detail);
        if !f.fixed {
            println!("      {:20} → {}", "", f.remedy);
        }
    }
    for n in &r.notes {
        println!("note  {:20} {}", n.kind, n.detail);
        println!("      {:20} → {}", "", n.remedy);
    }
    let c = &r.checked;
    println!(
        "daemon {}; checked {} mounts, {} workspaces, {} indexes, {} blobs, {} mirrors: {} findings, {} unresolved",
        r.daemon,
        c.mounts,
        c.workspaces,
        c.indexes,
        c.blobs,
        c.mirrors,
        r.findings.len(),
        r.unresolved()
    );
}

#[cfg(test)]
mod tests {
    use super::idle_note;

    #[test]
    fn idle_exits_are_noted_only_for_haltpoll_without_polling() {
        let n = idle_note(Some("haltpoll\n"), Some("0\n")).expect("a note");
        assert_eq!(n.kind, "idle-exits");
        assert!(n.remedy.contains("guest_halt_poll_ns"), "{}", n.remedy);
        assert_eq!(idle_note(Some("haltpoll\n"), Some("200000\n")), None);
        assert_eq!(idle_note(Some("acpi_idle\n"), Some("0\n")), None);
        assert_eq!(idle_note(None, None), None);
    }
}
