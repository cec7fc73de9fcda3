//! What lets a ring mount outlive its daemon: the geometry of a mount's ring memory (recorded with
//! the connection's descriptors by the keeper and in a restart's handover), the "answered" mark each
//! entry keeps in that memory, the pause of a mount's ring threads before a handover, and the
//! adoption of a dead (or handed-over) daemon's entries by the next daemon (docs/transport.md,
//! "Surviving the daemon").
//!
//! Owns: which entries of a ring memory hold a request nobody answered, and starting the ring
//! threads of an adopted mount. Must not: touch the keeper or the handover protocol (the daemon's),
//! nor serve requests itself (`QueueEntry` in `mod.rs` does).

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fuser::{Filesystem, RingDispatcher, RingWorker};
use serde::{Deserialize, Serialize};

use super::{ENTRIES_PER_QUEUE, HEADER_LEN, PAYLOAD, QueueEntry};
use crate::sys::uring::{EntryBuffers, RingMemory};

/// Where, in the header page past the kernel's headers (`EntryBuffers::own`), an entry records
/// the `commit_id` it answered last: written right after the COMMIT_AND_FETCH reached the kernel.
const ANSWERED: usize = 0;
/// Where an entry records the `commit_id` whose request its buffers may no longer hold intact:
/// written before the payload pages are given back or the reply is written over the request.
const OVERWRITING: usize = 8;
/// Where an entry records the `commit_id` whose whole reply its buffers hold: written after the
/// reply, before the COMMIT_AND_FETCH. An adopting daemon commits such a reply as it is: the
/// request it answers is no longer in the buffers (the reply's header and body are written over
/// the request's), so serving it again would parse a reply as a request.
const REPLIED: usize = 16;
/// What a reply overwrites of its request, saved first ([`save_request`]): the first 8 bytes of
/// `fuse_in_header` (len, opcode), `payload_sz`, how many payload bytes are saved (`u32::MAX`:
/// none could be), and those bytes from [`SAVED`] on.
const SAVED_HEAD: usize = 24;
const SAVED_PSZ: usize = 32;
const SAVED_LEN: usize = 36;
const SAVED: usize = 64;
/// Where the kernel puts a request's `payload_sz`.
const PAYLOAD_SZ: usize = super::ENT_IN_OUT + 16;
/// Where the kernel puts a request's `commit_id` (`fuse_uring_ent_in_out.commit_id`).
const COMMIT_ID: usize = super::ENT_IN_OUT + 8;
/// How long an adopting daemon waits for the daemon it takes over from to be gone.
const GONE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the kick of the queues waits for the entries of an adopted mount.
const ADOPT_TIMEOUT: Duration = Duration::from_secs(40);

/// The layout of a mount's ring memory: where it is mapped, how many queues and entries, the
/// payload size. Everything a next daemon needs to find each entry's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingGeometry {
    /// The address the memory is mapped at (the kernel keeps the entries' user addresses).
    pub addr: u64,
    pub queues: u16,
    pub per_queue: u16,
    pub payload: u32,
}

impl RingGeometry {
    pub fn new(addr: u64, queues: usize) -> RingGeometry {
        RingGeometry {
            addr,
            queues: queues as u16,
            per_queue: ENTRIES_PER_QUEUE as u16,
            payload: PAYLOAD as u32,
        }
    }

    pub fn entries(&self) -> usize {
        usize::from(self.queues) * usize::from(self.per_queue)
    }

    /// Bytes the memory takes.
    pub fn len(&self) -> usize {
        self.entries() * EntryBuffers::stride(self.payload as usize)
    }

    pub fn is_empty(&self) -> bool {
        self.entries() == 0
    }

    /// Byte offset of entry `i` and its queue.
    pub fn entry(&self, i: usize) -> (usize, u16) {
        (
            i * EntryBuffers::stride(self.payload as usize),
            (i / usize::from(self.per_queue.max(1))) as u16,
        )
    }

    /// Whether this binary can serve entries of this shape (the payload is what the INIT reply
    /// pinned `max_write` to).
    pub fn usable(&self) -> bool {
        self.queues > 0 && self.per_queue > 0 && self.payload as usize == PAYLOAD && self.addr != 0
    }
}

/// Whether an entry holds a request its daemon never answered: the kernel put a request
/// (`commit_id`) into it after the one the daemon marked answered. Zero is never a request.
pub fn holds_unanswered(commit_id: u64, answered: u64) -> bool {
    commit_id != 0 && commit_id != answered
}

pub(super) fn read_u64(b: &[u8], at: usize) -> u64 {
    super::le_u64(b, at)
}

/// The request an entry's buffers hold unanswered, if any.
pub(super) fn unanswered(buf: &EntryBuffers) -> Option<u64> {
    let c = read_u64(buf.header(), COMMIT_ID);
    holds_unanswered(c, read_u64(buf.own(), ANSWERED)).then_some(c)
}

/// Marks `commit_id` answered (after its COMMIT_AND_FETCH reached the kernel).
pub(super) fn mark_answered(buf: &mut EntryBuffers, commit_id: u64) {
    buf.own_mut()[ANSWERED..ANSWERED + 8].copy_from_slice(&commit_id.to_ne_bytes());
}

/// Marks that the buffers are about to stop holding request `commit_id` intact.
pub(super) fn mark_overwriting(buf: &mut EntryBuffers, commit_id: u64) {
    buf.own_mut()[OVERWRITING..OVERWRITING + 8].copy_from_slice(&commit_id.to_ne_bytes());
    // The mark must be in memory before the first byte of the request is overwritten (a process
    // killed in between leaves both to the next daemon).
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Marks that the buffers hold the whole reply to `commit_id`.
pub(super) fn mark_replied(buf: &mut EntryBuffers, commit_id: u64) {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    buf.own_mut()[REPLIED..REPLIED + 8].copy_from_slice(&commit_id.to_ne_bytes());
}

/// Saves what a reply of `body` bytes will overwrite of the request in the buffers (before
/// [`mark_overwriting`]); `intact` false (its payload pages are given back) saves nothing.
pub(super) fn save_request(buf: &mut EntryBuffers, body: usize, intact: bool) {
    let psz = read_u32(buf.header(), PAYLOAD_SZ);
    let n = body.min(psz as usize);
    let mut head = [0u8; 8];
    head.copy_from_slice(&buf.header()[..8]);
    let room = buf.own().len() - SAVED;
    let saved = if intact && n <= room { n } else { 0 };
    let mut keep = vec![0u8; saved];
    keep.copy_from_slice(&buf.payload()[..saved]);
    let own = buf.own_mut();
    own[SAVED_HEAD..SAVED_HEAD + 8].copy_from_slice(&head);
    own[SAVED_PSZ..SAVED_PSZ + 4].copy_from_slice(&psz.to_ne_bytes());
    let len = if intact && n <= room {
        n as u32
    } else {
        u32::MAX
    };
    own[SAVED_LEN..SAVED_LEN + 4].copy_from_slice(&len.to_ne_bytes());
    own[SAVED..SAVED + saved].copy_from_slice(&keep);
}

/// Puts back what [`save_request`] saved, making a [`Holds::Lost`] entry hold its request again;
/// false if it could not be saved.
pub(super) fn restore_request(buf: &mut EntryBuffers) -> bool {
    let len = read_u32(buf.own(), SAVED_LEN);
    if len == u32::MAX {
        return false;
    }
    let len = len as usize;
    let mut head = [0u8; 8];
    head.copy_from_slice(&buf.own()[SAVED_HEAD..SAVED_HEAD + 8]);
    let mut psz = [0u8; 4];
    psz.copy_from_slice(&buf.own()[SAVED_PSZ..SAVED_PSZ + 4]);
    let keep = buf.own()[SAVED..SAVED + len].to_vec();
    buf.header_mut()[..8].copy_from_slice(&head);
    buf.header_mut()[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&psz);
    buf.payload_mut()[..len].copy_from_slice(&keep);
    buf.own_mut()[OVERWRITING..OVERWRITING + 8].fill(0);
    true
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(x)
}

/// What an entry that holds unanswered `commit_id` (see [`unanswered`]) has in its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// The request, intact: serve it again.
    Request,
    /// The whole reply, not yet committed: commit it as it is.
    Reply,
    /// Neither (the daemon died while writing the reply): put the request back from what was
    /// saved ([`restore_request`]), else answer `EIO`.
    Lost,
}

/// What the buffers hold for unanswered `commit_id`.
pub(super) fn holds(buf: &EntryBuffers, commit_id: u64) -> Holds {
    if read_u64(buf.own(), REPLIED) == commit_id {
        Holds::Reply
    } else if read_u64(buf.own(), OVERWRITING) == commit_id {
        Holds::Lost
    } else {
        Holds::Request
    }
}

/// Forgets what a slot held (before it is registered afresh).
pub(super) fn clear(buf: &mut EntryBuffers) {
    buf.header_mut()[COMMIT_ID..COMMIT_ID + 8].fill(0);
    mark_answered(buf, 0);
    buf.own_mut()[OVERWRITING..REPLIED + 8].fill(0);
}

/// A mount's ring memory and the pause of its ring threads, kept in its `MountInfo`: the daemon
/// hands the memory's descriptor and geometry to the keeper and to a restart's new daemon.
pub struct RingShare {
    pub geometry: RingGeometry,
    pub mem: Arc<RingMemory>,
    pub pause: Arc<RingPause>,
}

impl std::fmt::Debug for RingShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingShare")
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl RingShare {
    /// A duplicate of the memory's memfd, to give away.
    pub fn dup_fd(&self) -> io::Result<OwnedFd> {
        self.mem.fd().try_clone_to_owned()
    }
}

/// Stops a mount's ring threads from dispatching (a restart's handover): a thread that gets a
/// request while paused leaves it in its buffers, unanswered, for the next daemon.
///
/// Every request passes [`Self::enter`] and [`Self::leave`], on every ring thread of the mount:
/// while nothing pauses they only touch two atomics (no lock shared between the CPUs, no wake-up
/// system call); the lock and the condition variable are for the handover.
#[derive(Debug, Default)]
pub struct RingPause {
    paused: AtomicBool,
    /// Requests counted in and not yet left.
    busy: AtomicUsize,
    lock: Mutex<()>,
    changed: Condvar,
}

impl RingPause {
    /// Before dispatching a request: waits while paused, then counts it in.
    pub(super) fn enter(&self) {
        loop {
            // Counted in before looking at `paused` (both SeqCst): a pause that set it first sees
            // this request busy and waits for it; one that sets it later waits too.
            self.busy.fetch_add(1, Ordering::SeqCst);
            if !self.paused.load(Ordering::SeqCst) {
                return;
            }
            self.leave();
            let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            while self.paused.load(Ordering::SeqCst) {
                g = self.changed.wait(g).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// After the request's reply reached the kernel and was marked answered.
    pub(super) fn leave(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
        if self.paused.load(Ordering::SeqCst) {
            let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.changed.notify_all();
        }
    }

    /// Stops new dispatches and waits for the ones under way (`timeout`; then resumed, error).
    pub fn pause(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.paused.store(true, Ordering::SeqCst);
        loop {
            let busy = self.busy.load(Ordering::SeqCst);
            if busy == 0 {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.paused.store(false, Ordering::SeqCst);
                self.changed.notify_all();
                return Err(io::Error::other(format!(
                    "{busy} ring requests still being served"
                )));
            }
            // A `leave` after the load above notifies under the lock, which this wait releases
            // atomically: no wake-up is lost. The timeout bounds a wait that finds none anyway.
            g = self
                .changed
                .wait_timeout(g, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    pub fn resume(&self) {
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.paused.store(false, Ordering::SeqCst);
        self.changed.notify_all();
    }
}

/// A dead or handing-over daemon's ring memory, mapped by the next daemon before it serves.
pub struct KeptRing {
    pub geometry: RingGeometry,
    /// The memory at its old address; `Err`: why it could not be mapped there.
    mem: Result<Arc<RingMemory>, String>,
    /// The daemon that handed it over, still alive: its entries are taken once it is gone.
    pub wait_for: Option<u32>,
}

impl KeptRing {
    /// A ring connection whose memory was not kept: served with fresh entries only.
    pub fn lost(geometry: RingGeometry, wait_for: Option<u32>) -> KeptRing {
        KeptRing {
            geometry,
            mem: Err("it was not kept with the connection".into()),
            wait_for,
        }
    }

    /// Maps the memory `fd` of `geometry` at its old address (now: nothing else of this process
    /// may take it first).
    pub fn map(geometry: RingGeometry, fd: OwnedFd, wait_for: Option<u32>) -> KeptRing {
        let mem = if !geometry.usable() {
            Err(format!("a ring of another shape ({geometry:?})"))
        } else {
            RingMemory::adopt(fd, geometry.addr, geometry.len())
                .map(Arc::new)
                .map_err(|e| format!("cannot map it at {:#x}: {e}", geometry.addr))
        };
        KeptRing {
            geometry,
            mem,
            wait_for,
        }
    }
}

/// Serves an adopted connection `session` (a restart's or a dead daemon's, through the keeper):
/// on `/dev/fuse` alone if it ran there (`ring` none), else with a ring thread per entry of the old
/// ring memory — each serves the request its entry holds unanswered, as sent again (the dead
/// daemon may have carried it out), and commits it from its own ring, which makes the entry this
/// daemon's; an entry holding none (its old command was cancelled when its daemon's ring went) is
/// registered afresh at the same addresses — then each queue is kicked once so that the requests
/// the kernel queued meanwhile are served. `served`/`share` as for `super::mount`.
pub fn serve_adopted<FS: Filesystem>(
    session: fuser::Session<FS>,
    mountpoint: &Path,
    ring: Option<KeptRing>,
    served: &OnceLock<String>,
    share: &OnceLock<RingShare>,
) -> io::Result<fuser::BackgroundSession> {
    use std::os::fd::AsFd;
    let Some(ring) = ring else {
        let _ = served.set("dev".into());
        return session.spawn();
    };
    let g = ring.geometry;
    let (mem, lost) = match ring.mem {
        Ok(m) => (m, None),
        Err(why) => {
            tracing::warn!(mountpoint = %mountpoint.display(),
                "the old daemon's ring memory: {why}; registering fresh entries only (a process \
                 waiting for a request the old daemon held waits until killed)");
            let fresh = Arc::new(
                RingMemory::create(g.len(), key_of(mountpoint)).map_err(io::Error::other)?,
            );
            (fresh, Some(why))
        }
    };
    let queues = usize::from(g.queues);
    // The old shape (entries per queue included), at the address the memory is mapped at.
    let geometry = RingGeometry {
        addr: mem.addr(),
        ..g
    };
    let pause = Arc::new(RingPause::default());
    // With a fresh memory there is nothing to take over, and no buffer shared with the old
    // daemon's entries: register at once.
    let adopt = lost.is_none().then_some(Adopt {
        wait_for: ring.wait_for,
    });
    let (tx, rx) = mpsc::channel();
    let mut workers: Vec<RingWorker<FS>> = Vec::new();
    let mount = super::service::new_mount();
    let cpus = super::possible_cpus()?;
    for i in 0..geometry.entries() {
        let (off, qid) = geometry.entry(i);
        let buf = mem
            .entry(off, HEADER_LEN, PAYLOAD)
            .map_err(|e| io::Error::other(format!("ring entry {i}: {e}")))?;
        let q = QueueEntry {
            qid,
            id: super::service::entry_id(mount, i),
            cpus,
            buf,
            fault: String::new(),
            adopt,
            pause: pause.clone(),
        };
        let dev_fd = session.as_fd().try_clone_to_owned()?;
        let tx = tx.clone();
        workers.push(Box::new(move |d: RingDispatcher<FS>| {
            q.run(i, dev_fd, d, tx)
        }));
    }
    drop(tx);
    let expected = workers.len();
    let bg = session.spawn_with_ring(workers)?;
    let _ = served.set(format!(
        "uring ({queues} queues x {} entries, {} KiB payload{})",
        geometry.per_queue,
        PAYLOAD / 1024,
        lost.map(|why| format!(
            "; the old daemon's ring memory was lost ({why}): requests it held are not answered"
        ))
        .unwrap_or_default()
    ));
    let _ = share.set(RingShare {
        geometry,
        mem,
        pause,
    });
    let mp = mountpoint.to_path_buf();
    std::thread::Builder::new()
        .name("ring-adopt".into())
        .spawn(move || kick_when_registered(&mp, rx, expected, queues))?;
    Ok(bg)
}

/// Taking over another daemon's ring entry: once `wait_for` (the daemon that handed it over) is
/// gone, serve what the entry holds, or register it afresh.
#[derive(Debug, Clone, Copy)]
pub(super) struct Adopt {
    pub wait_for: Option<u32>,
}

impl Adopt {
    /// Waits until the process that handed the ring over has exited (its ring threads' commands
    /// are cancelled then, and nothing more lands in their buffers).
    pub(super) fn wait(&self) {
        let Some(pid) = self.wait_for else { return };
        let deadline = Instant::now() + GONE_TIMEOUT;
        let stat = PathBuf::from(format!("/proc/{pid}/stat"));
        while !gone(&std::fs::read_to_string(&stat).ok()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Whether a process whose `/proc/<pid>/stat` reads `stat` has exited: no such process, or a
/// zombie (its rings were torn down at exit; only its parent has not reaped it yet).
fn gone(stat: &Option<String>) -> bool {
    match stat {
        None => true,
        Some(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
    }
}

/// Once every entry of an adopted mount reported, one request from each queue's CPU: the kernel
/// does not hand requests it queued while no entry was available to an entry registered later;
/// they move only at the next COMMIT_AND_FETCH of that queue, which this request's answer is.
fn kick_when_registered(
    mountpoint: &Path,
    rx: mpsc::Receiver<Result<(), String>>,
    expected: usize,
    queues: usize,
) {
    let deadline = Instant::now() + ADOPT_TIMEOUT;
    let mut ok = 0;
    while ok < expected {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => tracing::error!(mountpoint = %mountpoint.display(),
                "adopted ring entry: {e}"),
            Err(_) => break,
        }
    }
    if ok < expected {
        tracing::error!(mountpoint = %mountpoint.display(),
            "{ok} of {expected} adopted ring entries registered");
    }
    for qid in 0..queues {
        let mp = mountpoint.to_path_buf();
        // Detached: a kick answers when the queue moves; it must never hold anything up.
        let _ = std::thread::Builder::new()
            .name("ring-kick".into())
            .spawn(move || {
                if crate::sys::uring::pin_to_cpu(qid).is_ok()
                    && let Err(e) = crate::sys::uring::statfs(&mp)
                {
                    tracing::debug!(qid, "ring kick: {e}");
                }
            });
    }
    tracing::info!(mountpoint = %mountpoint.display(), entries = ok, "took over the ring entries");
}

/// The slot of the reserved address range a mount's ring memory tries first.
pub(super) fn key_of(mountpoint: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    mountpoint.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_round_trips_and_places_entries() {
        let g = RingGeometry::new(0x5000_4000_0000, 3);
        let back: RingGeometry =
            serde_json::from_str(&serde_json::to_string(&g).expect("json")).expect("parse");
        assert_eq!(back, g);
        assert!(g.usable());
        assert_eq!(g.entries(), 3 * ENTRIES_PER_QUEUE);
        let stride = EntryBuffers::stride(PAYLOAD);
        assert_eq!(g.len(), g.entries() * stride);
        assert_eq!(g.entry(0), (0, 0));
        assert_eq!(g.entry(1), (stride, 0));
        assert_eq!(g.entry(2), (2 * stride, 1));
        assert_eq!(g.entry(5), (5 * stride, 2));
        assert!(!RingGeometry { payload: 4096, ..g }.usable());
        assert!(!RingGeometry { addr: 0, ..g }.usable());
        assert!(!RingGeometry { queues: 0, ..g }.usable());
    }

    #[test]
    fn only_a_request_after_the_last_answered_is_unanswered() {
        // Never used, or cleared before a fresh registration.
        assert!(!holds_unanswered(0, 0));
        // Zero is never a request, whatever the mark says.
        assert!(!holds_unanswered(0, 42));
        // Answered, then idle (its command cancelled with its daemon): nothing held.
        assert!(!holds_unanswered(42, 42));
        // A request arrived after 42 was answered, or one being served when the daemon died.
        assert!(holds_unanswered(44, 42));
        assert!(holds_unanswered(7, 0));
    }

    #[test]
    fn the_answered_mark_lives_in_the_entry_s_own_bytes() {
        let mut b = EntryBuffers::new(HEADER_LEN, 8192).expect("map");
        assert_eq!(unanswered(&b), None);
        b.header_mut()[COMMIT_ID..COMMIT_ID + 8].copy_from_slice(&9u64.to_ne_bytes());
        assert_eq!(unanswered(&b), Some(9));
        mark_answered(&mut b, 9);
        assert_eq!(unanswered(&b), None);
        b.header_mut()[COMMIT_ID..COMMIT_ID + 8].copy_from_slice(&11u64.to_ne_bytes());
        assert_eq!(unanswered(&b), Some(11));
        clear(&mut b);
        assert_eq!(unanswered(&b), None);
    }

    #[test]
    fn an_unanswered_entry_holds_its_request_its_whole_reply_or_neither() {
        let mut b = EntryBuffers::new(HEADER_LEN, 4096).expect("buffers");
        b.header_mut()[COMMIT_ID..COMMIT_ID + 8].copy_from_slice(&7u64.to_ne_bytes());
        assert_eq!(holds(&b, 7), Holds::Request);
        // A daemon killed while writing its reply over the request.
        mark_overwriting(&mut b, 7);
        assert_eq!(holds(&b, 7), Holds::Lost);
        // Its overwritten bytes come back from what was saved first.
        b.header_mut()[..8].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        b.header_mut()[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&5u32.to_ne_bytes());
        b.payload_mut()[..5].copy_from_slice(b"name\0");
        save_request(&mut b, 16, true);
        b.header_mut()[..8].fill(0);
        b.header_mut()[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&16u32.to_ne_bytes());
        b.payload_mut()[..16].fill(9);
        assert!(restore_request(&mut b));
        assert_eq!(&b.header()[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(read_u32(b.header(), PAYLOAD_SZ), 5);
        assert_eq!(&b.payload()[..5], b"name\0");
        assert_eq!(holds(&b, 7), Holds::Request);
        save_request(&mut b, 16, false);
        assert!(!restore_request(&mut b));
        mark_overwriting(&mut b, 7);
        // ... or after the reply was whole, before (or right after) the commit.
        mark_replied(&mut b, 7);
        assert_eq!(holds(&b, 7), Holds::Reply);
        // Marks of an earlier request say nothing about the next one.
        b.header_mut()[COMMIT_ID..COMMIT_ID + 8].copy_from_slice(&9u64.to_ne_bytes());
        assert_eq!(holds(&b, 9), Holds::Request);
        clear(&mut b);
        assert_eq!(holds(&b, 7), Holds::Request);
    }

    #[test]
    fn a_zombie_or_a_missing_process_is_gone() {
        assert!(gone(&None));
        assert!(gone(&Some("12 (octofs (x)) Z 1 2".into())));
        assert!(!gone(&Some("12 (octofs) S 1 2".into())));
        assert!(!gone(&Some("12 (octofs Z) R 1 2".into())));
    }

    #[test]
    fn a_pause_waits_for_requests_under_way() {
        let p = Arc::new(RingPause::default());
        p.enter();
        assert!(p.pause(Duration::from_millis(20)).is_err());
        let q = p.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            q.leave();
        });
        p.pause(Duration::from_secs(5)).expect("paused");
        t.join().expect("join");
        p.resume();
        p.enter();
        p.leave();
    }
}
