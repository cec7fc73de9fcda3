//! The daemon-wide ring service: per possible CPU, [`ENTRIES_PER_QUEUE`] threads pinned to it,
//! each owning ONE io_uring in which it holds one entry of every ring mount for that CPU's queue
//! (docs/transport.md, "Threads"). A mount adds its entries by posting them to the threads (woken
//! through an eventfd each keeps a poll on, in its ring); completions are told apart by their
//! `user_data` (the mount's id and the entry's index, [`entry_id`]); a command that ends with the
//! connection (unmount, abort) drops that entry only, and with the mount's last entry its
//! dispatcher goes, which ends the fuser session.
//!
//! Owns: the threads, their rings, which entries each holds, registering and committing entries.
//! Must not: parse or answer requests itself (`QueueEntry::serve` in `mod.rs` does), nor touch the
//! mount-time rules (`mount`) or the adoption of another daemon's entries (`keep`) beyond serving
//! what they post. A thread serves one request at a time: it blocks on the reply as a per-mount
//! thread did, so a slow request of one mount delays the others of that thread (the second
//! thread of the CPU keeps them moving).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{Filesystem, RingDispatcher, RingReplySink};

use super::keep::{self, mark_answered};
use super::{
    ENTRIES_PER_QUEUE, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, FUSE_IO_URING_CMD_REGISTER, QueueEntry,
    REGISTER_TIMEOUT, ReplySlot, cmd_req,
};
use crate::sys::uring::{Completion, EventFd, Ring};

/// Completions a thread's ring holds: one pending command per entry it holds plus its wake-up
/// poll. The kernel keeps completions beyond it too (`IORING_FEAT_NODROP`, every kernel with FUSE
/// over io_uring has it), but a thread takes no more than `CQ_ENTRIES - 1` mounts: a mount beyond
/// that fails to get a ring (`--transport auto` serves it on `/dev/fuse`).
pub(super) const CQ_ENTRIES: u32 = 4096;
/// Submissions are handed to the kernel one at a time.
const SQ_ENTRIES: u32 = 8;
/// The `user_data` of a thread's wake-up poll (entry ids start at 1 << 16).
const WAKE: u64 = 0;
/// The `user_data` of a thread's exit guard: a poll on an io_uring nobody uses (so it never
/// completes) that the kernel counts as a *tracked* request of the thread (a request on an
/// io_uring descriptor, `REQ_F_INFLIGHT`). Only a thread with one tracked request cancels its
/// commands itself when it exits (`io_uring_files_cancel`, run in `do_exit` before the thread is
/// marked exiting): its entries waiting for a request leave the queues at once. Without it they
/// stay available until the whole process is gone and its rings' exit work cancels them, and a
/// request the kernel hands one of them meanwhile is ended with `ECANCELED` for its caller (the
/// copy into the entry runs as task work of a dead task): docs/transport.md, "ECANCELED across a
/// crash".
const GUARD: u64 = 1;

/// Feeds a request to one mount's filesystem (fuser's `RingDispatcher`, whatever the filesystem).
pub(super) trait Dispatch: Send {
    fn dispatch(&mut self, parts: &[&[u8]], sink: Arc<dyn RingReplySink>) -> bool;
}

impl<FS: Filesystem> Dispatch for RingDispatcher<FS> {
    fn dispatch(&mut self, parts: &[&[u8]], sink: Arc<dyn RingReplySink>) -> bool {
        RingDispatcher::dispatch(self, parts, sink)
    }
}

/// The `user_data` of entry `index` of mount `mount` (from [`new_mount`]).
pub(super) fn entry_id(mount: u64, index: usize) -> u64 {
    (mount << 16) | (index as u64 & 0xffff)
}

/// A fresh mount id.
pub(super) fn new_mount() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What a thread is told.
enum Cmd {
    Add(Box<Held>),
    /// Forget an entry that never registered (the `no-register` fault).
    Drop(u64),
}

/// One thread's mailbox.
struct Inbox {
    cmds: Mutex<Vec<Cmd>>,
    wake: EventFd,
    /// Entries it holds or was sent.
    held: AtomicUsize,
}

impl Inbox {
    fn post(&self, c: Cmd) {
        self.cmds.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        self.wake.signal();
    }
}

/// Counts an entry in its thread's `held` until dropped.
struct Counted(Arc<Inbox>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An entry a thread holds: its buffers, the connection, the mount's dispatcher.
pub(super) struct Held {
    q: QueueEntry,
    dev: OwnedFd,
    d: Box<dyn Dispatch>,
    /// Told once the entry registered (or why not); kept while a fault holds it back.
    registered: Option<mpsc::Sender<Result<(), String>>>,
    /// The commit id of an adopted entry's first commit, until the kernel took it.
    adopted: Option<u64>,
    _count: Counted,
}

struct Service {
    cpus: usize,
    threads: Vec<Arc<Inbox>>,
}

static SERVICE: Mutex<Option<Arc<Service>>> = Mutex::new(None);

/// The service, started on first use (`cpus` possible CPUs); an error says why it cannot run.
fn service(cpus: usize) -> Result<Arc<Service>, String> {
    let mut g = SERVICE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = &*g {
        return Ok(s.clone());
    }
    let mut rings = Vec::new();
    for _ in 0..cpus * ENTRIES_PER_QUEUE {
        let ring =
            Ring::with_cq(SQ_ENTRIES, CQ_ENTRIES).map_err(|e| format!("io_uring_setup: {e}"))?;
        let guard = Ring::new(1).map_err(|e| format!("io_uring_setup: {e}"))?;
        let wake = EventFd::new().map_err(|e| format!("eventfd: {e}"))?;
        rings.push((ring, guard, wake));
    }
    let mut threads = Vec::new();
    for (i, (ring, guard, wake)) in rings.into_iter().enumerate() {
        let inbox = Arc::new(Inbox {
            cmds: Mutex::default(),
            wake,
            held: AtomicUsize::new(0),
        });
        let cpu = i / ENTRIES_PER_QUEUE;
        let t = Worker {
            ring,
            guard,
            inbox: inbox.clone(),
            held: HashMap::new(),
            backlog: VecDeque::new(),
            slot: Arc::default(),
            cpu,
        };
        std::thread::Builder::new()
            .name(format!("fuser-ring-{cpu}-{}", i % ENTRIES_PER_QUEUE))
            .spawn(move || t.run())
            .map_err(|e| format!("cannot start a ring thread: {e}"))?;
        threads.push(inbox);
    }
    let s = Arc::new(Service { cpus, threads });
    *g = Some(s.clone());
    Ok(s)
}

/// Checks, before a mount's INIT reply, that the service runs and has room for one more mount.
pub(super) fn ready(cpus: usize) -> Result<(), String> {
    let s = service(cpus)?;
    let most = s
        .threads
        .iter()
        .map(|t| t.held.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    if most + 1 >= CQ_ENTRIES as usize {
        return Err(format!(
            "the ring threads hold {most} mounts already (at most {})",
            CQ_ENTRIES - 1
        ));
    }
    Ok(())
}

/// Hands entry `q` (index `index` of its mount) to the thread of its queue: it serves what an
/// adopted entry holds, else registers it, and tells `registered` either way.
pub(super) fn post(
    q: QueueEntry,
    index: usize,
    dev: OwnedFd,
    d: Box<dyn Dispatch>,
    registered: mpsc::Sender<Result<(), String>>,
) {
    let cpus = q.cpus.max(1);
    let s = match service(cpus) {
        Ok(s) => s,
        Err(why) => {
            let _ = registered.send(Err(format!("queue {}: {why}", q.qid)));
            return;
        }
    };
    let t = (usize::from(q.qid) % s.cpus) * ENTRIES_PER_QUEUE + index % ENTRIES_PER_QUEUE;
    let inbox = s.threads[t % s.threads.len()].clone();
    inbox.held.fetch_add(1, Ordering::Relaxed);
    let held = Held {
        q,
        dev,
        d,
        registered: Some(registered),
        adopted: None,
        _count: Counted(inbox.clone()),
    };
    inbox.post(Cmd::Add(Box::new(held)));
}

/// One ring thread.
struct Worker {
    ring: Ring,
    /// The never-used io_uring the exit guard polls ([`GUARD`]).
    guard: Ring,
    inbox: Arc<Inbox>,
    held: HashMap<u64, Held>,
    /// Completions taken off the ring while registering, not yet handled.
    backlog: VecDeque<Completion>,
    slot: Arc<ReplySlot>,
    cpu: usize,
}

impl Worker {
    fn run(mut self) {
        if let Err(e) = crate::sys::uring::pin_to_cpu(self.cpu) {
            tracing::debug!(cpu = self.cpu, "cannot pin ring thread: {e}");
        }
        self.arm();
        self.arm_guard();
        loop {
            let Some(c) = self.backlog.pop_front().or_else(|| self.ring.pop()) else {
                if let Err(e) = self.ring.submit_and_wait(true) {
                    tracing::error!(cpu = self.cpu, "io_uring_enter: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
                continue;
            };
            if c.user_data == GUARD {
                // Never ready; a poll the kernel ended (or refused) is not retried in a loop.
                if c.res >= 0 {
                    self.arm_guard();
                } else {
                    let e = io::Error::from_raw_os_error(-c.res);
                    tracing::warn!(cpu = self.cpu, "the ring thread's exit guard ended: {e}");
                }
                continue;
            }
            if c.user_data == WAKE {
                self.inbox.wake.drain();
                self.arm();
                let cmds =
                    std::mem::take(&mut *self.inbox.cmds.lock().unwrap_or_else(|p| p.into_inner()));
                for cmd in cmds {
                    match cmd {
                        Cmd::Add(h) => self.add(*h),
                        Cmd::Drop(id) => drop(self.held.remove(&id)),
                    }
                }
                continue;
            }
            self.complete(c);
        }
    }

    /// (Re)arms the wake-up poll.
    fn arm(&mut self) {
        let r = self
            .ring
            .push_poll(self.inbox.wake.raw(), libc::POLLIN as u32, WAKE)
            .and_then(|()| self.ring.submit_and_wait(false));
        if let Err(e) = r {
            tracing::error!(cpu = self.cpu, "cannot arm the ring thread's wake-up: {e}");
        }
    }

    /// (Re)arms the exit guard ([`GUARD`]).
    fn arm_guard(&mut self) {
        let r = self
            .ring
            .push_poll(self.guard.raw(), libc::POLLIN as u32, GUARD)
            .and_then(|()| self.ring.submit_and_wait(false));
        if let Err(e) = r {
            tracing::error!(
                cpu = self.cpu,
                "cannot arm the ring thread's exit guard: {e}"
            );
        }
    }

    /// A new entry: serve what an adopted one holds unanswered, else register it.
    fn add(&mut self, mut h: Held) {
        let id = h.q.id;
        let held = h.q.adopt.and_then(|_| keep::unanswered(&h.q.buf));
        if held.is_none() {
            keep::clear(&mut h.q.buf);
            if h.q.fault == "no-register" {
                // Silent until the mount gave up on it (as a thread stuck before registering).
                let inbox = self.inbox.clone();
                let _ = std::thread::Builder::new()
                    .name("ring-fault".into())
                    .spawn(move || {
                        std::thread::sleep(REGISTER_TIMEOUT + Duration::from_secs(2));
                        inbox.post(Cmd::Drop(id));
                    });
                self.held.insert(id, h);
                return;
            }
            if let Err(why) = self.register(&mut h) {
                if let Some(tx) = h.registered.take() {
                    let _ = tx.send(Err(why));
                }
                return;
            }
        }
        if let Some(tx) = h.registered.take() {
            let _ = tx.send(Ok(()));
        }
        if let Some(commit_id) = held {
            tracing::info!(
                qid = h.q.qid,
                commit_id,
                "serving a request the old daemon held"
            );
            let mut holds = keep::holds(&h.q.buf, commit_id);
            if holds == keep::Holds::Lost && keep::restore_request(&mut h.q.buf) {
                holds = keep::Holds::Request;
            }
            let r = match holds {
                keep::Holds::Request => self.answer(&mut h, true),
                // The old daemon had written its reply and died before committing it.
                keep::Holds::Reply => self.commit(&mut h, commit_id).map(|()| commit_id),
                keep::Holds::Lost => {
                    tracing::warn!(
                        qid = h.q.qid,
                        commit_id,
                        "the old daemon died while writing its reply: answered EIO"
                    );
                    let c = h.q.answer_lost(commit_id);
                    self.commit(&mut h, c).map(|()| c)
                }
            };
            match r {
                Ok(c) => h.adopted = Some(c),
                Err(_) => return leak(h),
            }
        }
        self.held.insert(id, h);
    }

    /// A completion of entry `c.user_data`: a request to answer, or the end of the entry.
    fn complete(&mut self, c: Completion) {
        let Some(mut h) = self.held.remove(&c.user_data) else {
            return;
        };
        if c.res < 0 {
            match -c.res {
                // The request of an adopted entry is no longer the kernel's (the old daemon
                // answered it and died before marking it): the entry was the old ring's,
                // cancelled with it; this one registers afresh instead.
                libc::ENOENT if h.adopted.is_some() => {
                    tracing::info!(
                        qid = h.q.qid,
                        commit_id = h.adopted,
                        "the old daemon had answered it; registering afresh"
                    );
                    h.adopted = None;
                    keep::clear(&mut h.q.buf);
                    match self.register(&mut h) {
                        Ok(()) => {
                            self.held.insert(c.user_data, h);
                        }
                        Err(why) => tracing::error!(qid = h.q.qid, "{why}"),
                    }
                }
                // Unmount or abort: the kernel tore the entry down.
                libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV => {}
                e => {
                    let e = io::Error::from_raw_os_error(e);
                    tracing::error!(qid = h.q.qid, "ring entry failed: {e}");
                    leak(h);
                }
            }
            return;
        }
        h.adopted = None;
        // While paused (a handover), the request stays in the buffers, unanswered: the next
        // daemon serves it.
        match self.answer(&mut h, false) {
            Ok(_) => {
                self.held.insert(c.user_data, h);
            }
            Err(_) => leak(h),
        }
    }

    /// Serves the request in `h`'s buffers and commits the reply; returns its commit id.
    fn answer(&mut self, h: &mut Held, resent: bool) -> io::Result<u64> {
        h.q.pause.enter();
        let commit_id = h.q.serve(h.d.as_mut(), &self.slot, resent);
        let r = self.commit(h, commit_id);
        h.q.pause.leave();
        r.map(|()| commit_id)
    }

    /// Registers the entry's buffers on its queue; an error says why (the kernel refused it, or
    /// never saw it).
    fn register(&mut self, h: &mut Held) -> Result<(), String> {
        let qid = match h.q.fault.as_str() {
            "bad-queue" => u16::MAX,
            _ => h.q.qid,
        };
        self.ring
            .push_uring_cmd(
                h.dev.as_raw_fd(),
                FUSE_IO_URING_CMD_REGISTER,
                h.q.id,
                h.q.buf.iovec_addr(),
                2,
                &cmd_req(0, qid),
            )
            .and_then(|()| self.ring.submit_and_wait(false))
            .map_err(|e| format!("queue {}: submit: {e}", h.q.qid))?;
        // A refused REGISTER completes at once; an accepted one stays pending until a request.
        // Other entries' completions taken meanwhile wait in the backlog.
        let mut refused = None;
        while let Some(c) = self.ring.pop() {
            if c.user_data == h.q.id && c.res < 0 && refused.is_none() {
                refused = Some(c.res);
            } else {
                self.backlog.push_back(c);
            }
        }
        if let Some(res) = refused {
            let e = io::Error::from_raw_os_error(-res);
            return Err(format!("queue {}: register: {e}", h.q.qid));
        }
        Ok(())
    }

    /// Hands the reply now in the buffers to the kernel (COMMIT_AND_FETCH, which also asks for the
    /// next request), then marks it answered: a next daemon serves again only what is not.
    fn commit(&mut self, h: &mut Held, commit_id: u64) -> io::Result<()> {
        let r = self
            .ring
            .push_uring_cmd(
                h.dev.as_raw_fd(),
                FUSE_IO_URING_CMD_COMMIT_AND_FETCH,
                h.q.id,
                0,
                0,
                &cmd_req(commit_id, h.q.qid),
            )
            .and_then(|()| self.ring.submit_and_wait(false));
        if let Err(e) = r {
            tracing::error!(qid = h.q.qid, "cannot commit: {e}");
            return Err(e);
        }
        mark_answered(&mut h.q.buf, commit_id);
        Ok(())
    }
}

/// Drops an entry whose buffers the kernel may still write into: they stay mapped forever, the
/// rest (the mount's dispatcher) goes.
fn leak(h: Held) {
    let Held { q, .. } = h;
    let QueueEntry { buf, .. } = q;
    buf.leak();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_are_never_the_wake_up_and_keep_mount_and_index() {
        let a = new_mount();
        let b = new_mount();
        assert_ne!(a, b);
        assert_ne!(entry_id(a, 0), WAKE);
        assert_ne!(entry_id(a, 0), GUARD);
        assert_ne!(entry_id(a, 3), entry_id(b, 3));
        assert_eq!(entry_id(a, 3) >> 16, a);
        assert_eq!(entry_id(a, 3) & 0xffff, 3);
    }
}
