//! The old side of a restart ([`Daemon::restart`]): quiesce, take every mount out of the table,
//! start the new process, hand the connections, nodes and handles over, and exit once it serves —
//! or give everything back and keep serving. Must not: build sessions (the new side's, `take.rs`).

use super::*;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::access::Caller;
use crate::daemon::guard::LockKey;
use crate::daemon::proto::Restarted;
use crate::daemon::{Daemon, Mounted, Reply, lock};

/// A mount taken out of the daemon's table for the handover.
struct Taken {
    thread: String,
    m: Mounted,
}

/// Stops a mount's request readers: the `/dev/fuse` side, and the ring threads of a ring mount
/// (a request they get meanwhile stays in their buffers for the new daemon).
fn pause(t: &Taken) -> std::io::Result<()> {
    t.m.session.pause_readers(Duration::from_secs(5))?;
    if let Some(r) = t.m.info.ring.get() {
        r.pause.pause(Duration::from_secs(5))?;
    }
    Ok(())
}

fn resume(t: &Taken) {
    t.m.session.resume_readers();
    if let Some(r) = t.m.info.ring.get() {
        r.pause.resume();
    }
}

impl Daemon {
    /// `octofs restart`: hands everything to a new daemon process (`exe`, else the binary now at
    /// this daemon's path); on success this process exits once the answer is written.
    pub(in crate::daemon) fn restart(&self, exe: Option<&Path>, c: &Caller) -> Reply<Restarted> {
        self.require_admin(c, "restart the daemon")?;
        if HANDING_OVER.swap(true, Ordering::SeqCst) {
            return Err(RestartRefusal::UnderWay.into());
        }
        match self.hand_over(exe) {
            Ok(r) => {
                tracing::info!(
                    new_pid = r.new_pid,
                    pause_ms = r.pause_ms,
                    "handed over to the new daemon"
                );
                EXIT_AFTER_ANSWER.store(true, Ordering::SeqCst);
                // Should the answer never be taken, exit anyway: the new daemon serves.
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_secs(5));
                    exit_if_handed_over();
                });
                Ok((r, vec![]))
            }
            Err(why) => {
                HANDING_OVER.store(false, Ordering::SeqCst);
                tracing::warn!("restart failed, this daemon goes on serving: {why}");
                Err(RestartRefusal::Failed { why }.into())
            }
        }
    }

    fn hand_over(&self, exe: Option<&Path>) -> Result<Restarted, HandoverError> {
        let deadline = Instant::now() + QUIESCE_TIMEOUT;
        // Only this request may run.
        while IN_FLIGHT.load(Ordering::SeqCst) > 1 {
            if Instant::now() >= deadline {
                return Err(HandoverError::Busy {
                    running: IN_FLIGHT.load(Ordering::SeqCst) - 1,
                    timeout: QUIESCE_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // New workspaces' background syncs end in this process, before it goes.
        self.settle_all();
        let lock_file = LOCK_FILE.get().ok_or(HandoverError::NoLockFile)?;
        // Every mounted thread's lock: the timers (sweep, release when idle) wait meanwhile.
        let threads: Vec<String> = lock(&self.mounts).keys().cloned().collect();
        let locks: Vec<_> = threads
            .iter()
            .map(|t| self.locks.get(&LockKey::thread(t)))
            .collect();
        let _guards = loop {
            let guards: Vec<_> = locks.iter().filter_map(|l| l.try_lock().ok()).collect();
            if guards.len() == locks.len() {
                break guards;
            }
            drop(guards);
            if Instant::now() >= deadline {
                return Err(HandoverError::ThreadBusy);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut taken: Vec<Taken> = {
            let mut mounts = lock(&self.mounts);
            threads
                .iter()
                .filter_map(|t| {
                    mounts.remove(t).map(|m| Taken {
                        thread: t.clone(),
                        m,
                    })
                })
                .collect()
        };
        let r = self.hand_over_taken(exe, lock_file, &mut taken);
        if r.is_err() {
            let mut mounts = lock(&self.mounts);
            for t in taken {
                mounts.insert(t.thread, t.m);
            }
        } else {
            // The new daemon serves these mounts now. Dropping a session unmounts (fuser's
            // `Mount`): that failed with EBUSY on a mount a process was using and took every idle
            // one away from the new daemon, leaving a bare directory. Nothing here may unmount.
            for t in taken {
                t.m.session.disown();
            }
        }
        r
    }

    fn hand_over_taken(
        &self,
        exe: Option<&Path>,
        lock_file: &File,
        taken: &mut [Taken],
    ) -> Result<Restarted, HandoverError> {
        let exe = match exe {
            Some(p) => p.to_path_buf(),
            None => own_path()?,
        };
        let sock_path = self.layout.state.join("takeover.sock");
        let _ = std::fs::remove_file(&sock_path);
        let listener = UnixListener::bind(&sock_path).map_err(|source| HandoverError::Listen {
            path: sock_path.clone(),
            source,
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sock_path, std::fs::Permissions::from_mode(0o600)).map_err(
                |source| HandoverError::Private {
                    path: sock_path.clone(),
                    source,
                },
            )?;
        }
        let child = Command::new(&exe)
            .arg("--state")
            .arg(&self.layout.state)
            .arg("--root")
            .arg(&self.layout.root)
            .arg("takeover-serve")
            .arg("--from")
            .arg(&sock_path)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| HandoverError::Start {
                exe: exe.clone(),
                source,
            });
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_file(&sock_path);
                return Err(e);
            }
        };
        let started = Instant::now();
        let r = self.exchange(&listener, &mut child, started, lock_file, taken);
        let _ = std::fs::remove_file(&sock_path);
        match r {
            Ok(r) => Ok(r),
            Err(why) => {
                // The new process must never serve next to this one.
                let _ = child.kill();
                let _ = child.wait();
                for t in taken.iter() {
                    if let Err(e) = t.m.core.reopen_after_handover() {
                        tracing::error!(thread = %t.thread, "catalog: {e}");
                    }
                    resume(t);
                    // The new process may have given the keeper its own descriptors before it
                    // was stopped: the keeper gets this daemon's again.
                    crate::daemon::mounts::keep_mount(&t.thread, &t.m);
                }
                Err(why)
            }
        }
    }

    fn exchange(
        &self,
        listener: &UnixListener,
        child: &mut Child,
        started: Instant,
        lock_file: &File,
        taken: &mut [Taken],
    ) -> Result<Restarted, HandoverError> {
        let deadline = started + HANDOVER_TIMEOUT;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let mut s = accept_child(listener, child, deadline)?;
        s.set_read_timeout(Some(left()))?;
        match read_frame(&mut s).map(serde_json::from_value::<ChildMsg>) {
            Ok(Ok(ChildMsg::Hello { .. })) => {}
            Ok(Ok(other)) => return Err(said(&other)),
            Ok(Err(e)) => return Err(HandoverError::Garbled(e)),
            Err(e) => return Err(child_gone(child, e)),
        }
        // Quiesce: from here requests wait in the kernel.
        let pause_start = Instant::now();
        for (i, t) in taken.iter().enumerate() {
            if let Err(e) = pause(t) {
                for t in &taken[..=i] {
                    resume(t);
                }
                return Err(HandoverError::Mount {
                    thread: t.thread.clone(),
                    source: e,
                });
            }
        }
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut files_kept = Vec::new();
        let dup = |f: BorrowedFd<'_>| f.try_clone_to_owned();
        fds.push(dup(lock_file.as_fd())?);
        let mut mounts = Vec::new();
        let mut handles = 0;
        for t in taken.iter() {
            let negotiated =
                t.m.session
                    .negotiated()
                    .ok_or_else(|| HandoverError::InitUnknown {
                        thread: t.thread.clone(),
                    })?;
            let dev_fd = fds.len();
            fds.push(t.m.session.dup_dev_fd()?);
            // A ring mount's memory: the new daemon serves what its paused entries hold.
            let ring = match t.m.info.ring.get() {
                Some(r) => {
                    fds.push(r.dup_fd()?);
                    Some((r.geometry, fds.len() - 1))
                }
                None => None,
            };
            let (adapter, files) =
                crate::fs::fuse::export_state(&t.m.info, &t.m.core).map_err(|source| {
                    HandoverError::Mount {
                        thread: t.thread.clone(),
                        source,
                    }
                })?;
            let mut idx = Vec::with_capacity(files.len());
            for f in &files {
                idx.push(fds.len());
                fds.push(dup(f.as_fd())?);
            }
            handles += files.len();
            files_kept.push(files);
            // The durable state, compacted with the clean mark: the new daemon loads it as at start.
            t.m.core.close();
            mounts.push(MountHandover {
                thread: t.thread.clone(),
                path: t.m.path.clone(),
                dev_fd,
                negotiated: NegotiatedState {
                    kernel_major: negotiated.kernel_major,
                    kernel_minor: negotiated.kernel_minor,
                    flags: negotiated.flags,
                    max_write: negotiated.max_write,
                    max_readahead: negotiated.max_readahead,
                },
                adapter,
                files: idx,
                ring: ring.map(|r| r.0),
                ring_fd: ring.map(|r| r.1),
            });
        }
        let st = &self.settings;
        let handover = Handover {
            version: VERSION,
            old_pid: std::process::id(),
            settings: SettingsState {
                freshness_secs: st.freshness_secs,
                passthrough: st.passthrough,
                sweep_idle: st.sweep_idle,
                sweep_every: st.sweep_every,
                fetch_timeout_secs: st.fetch_timeout_secs,
                transport: transport_name(st.transport).into(),
                io: st.io.to_string(),
                max_threads_per_user: Some(st.max_threads_per_user),
                quota_per_user: st.quota_per_user,
                keep_connections: st.keep_connections,
                metrics: st.metrics.as_ref().map(|m| m.addr.to_string()),
                metrics_allow: st.metrics.as_ref().map(|m| m.allow.to_string()),
            },
            fds: fds.len(),
            lock_fd: 0,
            mounts,
        };
        let n_mounts = handover.mounts.len();
        write_frame(&mut s, &handover).map_err(|e| child_gone(child, e))?;
        for chunk in fds.chunks(crate::sys::FDS_PER_MESSAGE) {
            let borrowed: Vec<BorrowedFd<'_>> = chunk.iter().map(|f| f.as_fd()).collect();
            crate::sys::send_fds(&s, &borrowed).map_err(|e| child_gone(child, e))?;
        }
        s.set_read_timeout(Some(left()))?;
        let answer = read_frame(&mut s).map_err(|e| child_gone(child, e))?;
        match serde_json::from_value::<ChildMsg>(answer) {
            Ok(ChildMsg::Serving { pid }) => {
                let pause_ms = pause_start.elapsed().as_secs_f64() * 1000.0;
                // The service manager follows the new process (this one is its main pid).
                crate::daemon::notify::notify(&format!(
                    "MAINPID={pid}\nREADY=1\nSTATUS=serving workspaces (restarted)"
                ));
                Ok(Restarted {
                    old_pid: std::process::id(),
                    new_pid: pid,
                    mounts: n_mounts,
                    handles,
                    pause_ms,
                })
            }
            Ok(ChildMsg::Refused { why }) => Err(HandoverError::Refused { why }),
            Ok(other) => Err(said(&other)),
            Err(e) => Err(HandoverError::Garbled(e)),
        }
    }
}

/// The new process's connection, checked to come from it.
fn accept_child(
    listener: &UnixListener,
    child: &mut Child,
    deadline: Instant,
) -> Result<UnixStream, HandoverError> {
    listener.set_nonblocking(true)?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                match crate::sys::peer_pid(&s) {
                    Ok(pid) if pid == child.id() => return Ok(s),
                    // Someone else (root only: the socket is 0600): not the new daemon.
                    _ => continue,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(HandoverError::Accept(e)),
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(HandoverError::ExitedEarly(status));
        }
        if Instant::now() >= deadline {
            return Err(HandoverError::NoConnect(HANDOVER_TIMEOUT));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Why the exchange with the new process broke off.
fn child_gone(child: &mut Child, e: std::io::Error) -> HandoverError {
    std::thread::sleep(Duration::from_millis(20));
    match child.try_wait() {
        Ok(Some(status)) => HandoverError::Exited(status),
        _ if e.kind() == std::io::ErrorKind::WouldBlock
            || e.kind() == std::io::ErrorKind::TimedOut =>
        {
            HandoverError::NoAnswer(HANDOVER_TIMEOUT)
        }
        _ => HandoverError::Broke(e),
    }
}

/// The new process answered out of turn.
fn said(msg: &ChildMsg) -> HandoverError {
    HandoverError::Said {
        said: format!("{msg:?}"),
    }
}
