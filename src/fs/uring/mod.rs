//! The request transport of a mount: FUSE over io_uring with one queue per CPU when the kernel
//! offers it, else the classic `/dev/fuse` reader threads. See `docs/transport.md`.
//!
//! It owns how requests reach the filesystem and how replies go back, nothing else: the one
//! `fuser::Filesystem` (the adapter in `fs::fuse`) answers both transports through fuser's own
//! parser and reply encoders (via the patch series in `vendor/fuser-patches`). All `unsafe` is in
//! `crate::sys::uring`. The rules that keep a mount from hanging: every ring and buffer exists
//! before the INIT reply, `FUSE_OVER_IO_URING` is advertised only then, and if registering the
//! entries fails or stalls afterwards the connection is aborted and the mount fails with the
//! reason. Without the kernel feature (or with `--transport dev`) the mount runs on `/dev/fuse`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use fuser::{Filesystem, InitFlags, RingDispatcher, RingReplySink, RingWorker};

use crate::sys::uring::{EntryBuffers, RingMemory};

mod keep;
mod service;
use keep::Adopt;
pub use keep::{KeptRing, RingGeometry, RingPause, RingShare, holds_unanswered, serve_adopted};

/// Which transport a mount should use (`octofs serve --transport`). The default is `Dev` until
/// the ring is shown to win on a quiet machine (docs/transport.md, "Measurements").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// io_uring when the kernel offers it, else `/dev/fuse`.
    Auto,
    /// io_uring or the mount fails.
    Uring,
    /// `/dev/fuse` reader threads only.
    #[default]
    Dev,
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Transport::Auto),
            "uring" => Ok(Transport::Uring),
            "dev" => Ok(Transport::Dev),
            _ => Err(format!("unknown transport {s:?} (auto, uring or dev)")),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Auto => "auto",
            Transport::Uring => "uring",
            Transport::Dev => "dev",
        })
    }
}

/// Payload buffer of one ring entry; the INIT reply pins `max_write` to it (the kernel requires
/// every entry's payload to hold `max(max_write, max_pages * PAGE_SIZE)`).
pub const PAYLOAD: usize = 1 << 20;
/// Ring entries per CPU queue of a mount, and ring threads per CPU (`service`, each holding one
/// entry of every mount): octofs answers synchronously, so a second entry and thread keep a CPU's
/// requests moving while one waits on the disk or a lock.
pub const ENTRIES_PER_QUEUE: usize = 2;
/// `sizeof(struct fuse_uring_req_header)`: in_out[128], op_in[128], fuse_uring_ent_in_out (32).
const HEADER_LEN: usize = 288;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;
const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;
/// Requests that get no reply (they should never come through a ring: the kernel sends them on
/// `/dev/fuse`).
const FUSE_FORGET: u32 = 2;
const FUSE_BATCH_FORGET: u32 = 42;
/// `FUSE_UNIQUE_RESEND`: bit 63 of a request's unique marks it as sent again.
const UNIQUE_RESEND: u64 = 1 << 63;
/// How long the entries may take to register before the connection is aborted.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
/// Fault injection for the tests of the never-hang rules, applied to every entry of the last
/// queue: `bad-queue` makes them register on a queue that does not exist (the kernel refuses it),
/// `no-register` makes them never register (the kernel holds every request meanwhile).
const FAULT_ENV: &str = "OCTOFS_URING_FAULT";

/// Mounts `fs` at `mountpoint` and serves it on background threads with the transport `want`
/// asks for; `served` is set to what the mount actually runs on (shown by `octofs status`).
pub fn mount<FS: Filesystem>(
    fs: FS,
    mountpoint: &Path,
    cfg: &fuser::Config,
    want: Transport,
    served: &OnceLock<String>,
    share: &OnceLock<RingShare>,
) -> io::Result<fuser::BackgroundSession> {
    let dev = |fs: FS, why: Option<String>| {
        let s = fuser::Session::new(fs, mountpoint, cfg)?.spawn()?;
        let _ = served.set(match why {
            Some(why) => format!("dev ({why})"),
            None => "dev".into(),
        });
        Ok(s)
    };
    if want == Transport::Dev {
        return dev(fs, None);
    }
    let (queues, mem, geometry) = match prepare(keep::key_of(mountpoint)) {
        Ok(q) => q,
        Err(why) if want == Transport::Auto => return dev(fs, Some(why)),
        Err(why) => return Err(io::Error::other(format!("io_uring transport: {why}"))),
    };
    // One /dev/fuse thread stays for what the kernel never sends through a ring (FORGET,
    // INTERRUPT) and for the requests before the rings are ready.
    let mut ring_cfg = cfg.clone();
    ring_cfg.n_threads = Some(1);
    // Why the INIT reply does not carry FUSE_OVER_IO_URING, when it does not. `max_write` is
    // pinned first, so that the flag is only ever added with it.
    let mut refused: Option<String> = None;
    let session = fuser::Session::new_with_init_hook(fs, mountpoint, &ring_cfg, |kc| {
        refused = if !kc.capabilities().contains(InitFlags::FUSE_OVER_IO_URING) {
            Some("the kernel did not offer FUSE_OVER_IO_URING".into())
        } else if let Err(near) = kc.set_max_write(PAYLOAD as u32) {
            Some(format!(
                "fuser refused max_write {PAYLOAD} (nearest {near})"
            ))
        } else if let Err(bits) = kc.add_capabilities(InitFlags::FUSE_OVER_IO_URING) {
            // Upstream fuser after 0.18.0 refuses this flag here ("Refuse capabilities fuser
            // cannot honor"): a rebase onto it needs a patch that accepts it again when a ring
            // transport is attached (vendor/fuser-patches/README.md, "Rebasing").
            Some(format!(
                "fuser refused FUSE_OVER_IO_URING (add_capabilities: {bits:?})"
            ))
        } else {
            None
        };
    })?;
    // The flags fuser recorded for its INIT reply (`Negotiated`) must agree with the hook: the
    // kernel serves the connection from the rings only if the reply carries the flag, and holds
    // every request until the rings exist once it does. Should they disagree (a fuser that
    // filters flags after the hook), the rings are still set up, which cannot hang the mount
    // either way, and the status says so; tests/uring.rs fails on it.
    let recorded = session
        .negotiated()
        .is_some_and(|n| n.flags & InitFlags::FUSE_OVER_IO_URING.bits() != 0);
    let mut disagree = None;
    if refused.is_some() && recorded {
        disagree = refused
            .take()
            .map(|why| format!("{why}, yet fuser recorded FUSE_OVER_IO_URING in its INIT reply"));
    } else if refused.is_none() && !recorded {
        disagree = Some("fuser recorded its INIT reply without FUSE_OVER_IO_URING".to_string());
    }
    if let Some(why) = &disagree {
        tracing::warn!(mountpoint = %mountpoint.display(), "io_uring transport: {why}");
    }
    if let Some(why) = refused {
        // Nothing was advertised: a plain /dev/fuse session when the caller allowed the fallback.
        if want == Transport::Uring {
            drop(session);
            return Err(io::Error::other(format!("io_uring transport: {why}")));
        }
        let _ = served.set(format!("dev ({why})"));
        return session.spawn();
    }
    // From here the kernel holds every new request until all queues have an entry.
    let (tx, rx) = mpsc::channel();
    let mut workers: Vec<RingWorker<FS>> = Vec::new();
    let mut first_err = None;
    let pause = Arc::new(RingPause::default());
    let fault = std::env::var(FAULT_ENV).unwrap_or_default();
    let last = queues.iter().map(|q| q.qid).max().unwrap_or(0);
    for (i, mut q) in queues.into_iter().enumerate() {
        if q.qid == last {
            q.fault = fault.clone();
        }
        q.pause = pause.clone();
        match session.as_fd().try_clone_to_owned() {
            Ok(dev_fd) => {
                let tx = tx.clone();
                workers.push(Box::new(move |d: RingDispatcher<FS>| {
                    q.run(i, dev_fd, d, tx)
                }));
            }
            Err(e) => {
                first_err.get_or_insert(format!("cannot duplicate /dev/fuse: {e}"));
            }
        }
    }
    drop(tx);
    let expected = workers.len();
    let bg = session.spawn_with_ring(workers)?;
    let mut ok = 0;
    while ok < expected && first_err.is_none() {
        match rx.recv_timeout(REGISTER_TIMEOUT) {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => first_err = Some(e),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                first_err = Some(format!(
                    "{ok} of {expected} ring entries registered within {REGISTER_TIMEOUT:?}"
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                first_err = Some(format!(
                    "{ok} of {expected} ring entries registered; a ring thread ended before \
                     registering"
                ))
            }
        }
    }
    match first_err {
        None => {
            let _ = served.set(format!(
                "uring ({} queues x {} entries, {} KiB payload{})",
                expected / ENTRIES_PER_QUEUE,
                ENTRIES_PER_QUEUE,
                PAYLOAD / 1024,
                disagree.map(|d| format!("; {d}")).unwrap_or_default()
            ));
            let _ = share.set(RingShare {
                geometry,
                mem,
                pause,
            });
            tracing::info!(
                mountpoint = %mountpoint.display(),
                entries = expected,
                "serving over FUSE io_uring"
            );
            Ok(bg)
        }
        Some(why) => {
            // A failed REGISTER makes the kernel drop io_uring for this connection and serve from
            // /dev/fuse; an entry that never reached the kernel would leave requests held, so the
            // connection is aborted unless every failure came back from the kernel.
            tracing::warn!(mountpoint = %mountpoint.display(), "io_uring registration: {why}");
            if let Err(e) = abort_connection(mountpoint) {
                tracing::warn!("cannot abort the FUSE connection: {e}");
            }
            let _ = crate::sys::lazy_unmount(mountpoint);
            // Not joined: were the abort refused, a thread could wait on the connection forever.
            drop(bg);
            Err(io::Error::other(format!(
                "io_uring transport: registering the ring entries failed ({why}); the mount was \
                 aborted (serve with --transport dev to avoid io_uring)"
            )))
        }
    }
}

/// Turns on the kernel's switch and builds every queue's rings and buffers (before INIT): the
/// buffers in one ring memory (`key` chooses where it tries to be mapped).
type Prepared = (Vec<QueueEntry>, Arc<RingMemory>, RingGeometry);
fn prepare(key: u64) -> Result<Prepared, String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => {
            return Err("this kernel has no FUSE over io_uring (no fuse.enable_uring)".into());
        }
        Ok(v) if v.trim() == "Y" => {}
        Ok(_) => {
            std::fs::write(ENABLE_URING, "Y")
                .map_err(|e| format!("cannot enable it ({ENABLE_URING}: {e})"))?;
            tracing::info!("enabled FUSE over io_uring ({ENABLE_URING} = Y)");
        }
    }
    let cpus = possible_cpus().map_err(|e| format!("cannot count CPUs: {e}"))?;
    service::ready(cpus)?;
    let len = RingGeometry::new(1, cpus).len();
    let mem = Arc::new(RingMemory::create(len, key).map_err(|e| format!("ring buffers: {e}"))?);
    let geometry = RingGeometry::new(mem.addr(), cpus);
    let mut v = Vec::with_capacity(geometry.entries());
    let mount = service::new_mount();
    for i in 0..geometry.entries() {
        let (off, qid) = geometry.entry(i);
        let buf = mem
            .entry(off, HEADER_LEN, PAYLOAD)
            .map_err(|e| format!("ring buffers: {e}"))?;
        v.push(QueueEntry {
            qid,
            id: service::entry_id(mount, i),
            cpus,
            buf,
            fault: String::new(),
            adopt: None,
            pause: Arc::default(),
        });
    }
    Ok((v, mem, geometry))
}

/// The kernel makes one queue per *possible* CPU (`num_possible_cpus()`), and switches to the
/// ring only when each has an entry.
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut n = 0;
    for range in s.trim().split(',') {
        let mut it = range.split('-');
        let parse = |x: Option<&str>| {
            x.and_then(|x| x.trim().parse::<usize>().ok())
                .ok_or_else(|| io::Error::other(format!("bad cpu list {s:?}")))
        };
        let lo = parse(it.next())?;
        let hi = match it.next() {
            Some(h) => parse(Some(h))?,
            None => lo,
        };
        n = n.max(hi + 1);
        let _ = lo;
    }
    Ok(n.max(1))
}

/// Aborts the FUSE connection behind `mountpoint` through fusectl (`/sys/fs/fuse/connections/N/
/// abort`), so nothing stays blocked on it; mounts fusectl if needed. The connection number is
/// the mount's device minor, read from mountinfo (a stat would itself wait on the connection).
pub(crate) fn abort_connection(mountpoint: &Path) -> io::Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = mountpoint.to_string_lossy();
    let minor = info
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() > 4 && f[4] == want).then(|| f[2].rsplit(':').next().map(str::to_string))?
        })
        .next_back()
        .ok_or_else(|| io::Error::other("mount not found in mountinfo"))?;
    let dir = Path::new("/sys/fs/fuse/connections");
    let mounted_here = std::fs::read_dir(dir)?.next().is_none()
        && std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
    let r = std::fs::write(dir.join(minor).join("abort"), "1");
    if mounted_here {
        let _ = std::process::Command::new("umount").arg(dir).status();
    }
    r
}

/// One ring entry of one CPU queue, served by a thread of the ring service pinned to that CPU.
struct QueueEntry {
    qid: u16,
    /// Its `user_data` in the thread's ring (`service::entry_id`).
    id: u64,
    /// Possible CPUs (the ring service's threads are per CPU).
    cpus: usize,
    buf: EntryBuffers,
    /// `FAULT_ENV`'s value for this entry (empty: none).
    fault: String,
    /// Set when the entry's buffers are another daemon's: serve what they hold, else register.
    adopt: Option<Adopt>,
    /// The mount's pause (a restart's handover).
    pause: Arc<RingPause>,
}

/// Where a request's reply lands: fuser's encoder writes it here (possibly from another thread),
/// the entry's thread copies it into the ring buffers. Most replies are written by the entry's
/// own thread before it looks: only a thread that found none waits, and only then is it woken.
#[derive(Debug, Default)]
struct ReplySlot {
    reply: Mutex<SlotState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct SlotState {
    reply: Option<Vec<u8>>,
    /// The entry's thread waits on `ready`.
    waiting: bool,
}

impl RingReplySink for ReplySlot {
    fn send(&self, data: &[io::IoSlice<'_>]) -> io::Result<()> {
        let mut v = Vec::with_capacity(data.iter().map(|d| d.len()).sum());
        for d in data {
            v.extend_from_slice(d);
        }
        let mut g = self.reply.lock().unwrap_or_else(|p| p.into_inner());
        g.reply = Some(v);
        if g.waiting {
            self.ready.notify_one();
        }
        Ok(())
    }
}

impl ReplySlot {
    fn wait(&self) -> Vec<u8> {
        let mut g = self.reply.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(v) = g.reply.take() {
                g.waiting = false;
                return v;
            }
            g.waiting = true;
            g = self.ready.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(x)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(x)
}

/// The `fuse_uring_cmd_req` of a submission: flags, commit_id, qid.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 24] {
    let mut c = [0u8; 24];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

impl QueueEntry {
    /// The entry's fuser worker (a thread of its own, for a moment): waits until the daemon an
    /// adopted entry comes from is gone, then hands the entry and its dispatcher to the ring
    /// service, which registers it (or serves what it holds) and tells `registered`.
    fn run<FS: Filesystem>(
        self,
        index: usize,
        dev: OwnedFd,
        d: RingDispatcher<FS>,
        registered: mpsc::Sender<Result<(), String>>,
    ) -> io::Result<()> {
        if let Some(a) = self.adopt {
            a.wait();
        }
        service::post(self, index, dev, Box::new(d), registered);
        Ok(())
    }

    /// Answers the request now in the entry's buffers; returns its commit id.
    /// `resent`: the request was read by a daemon that may have carried it out (marked as
    /// `FUSE_UNIQUE_RESEND` for the filesystem, the reply still carrying the kernel's unique).
    fn serve(&mut self, d: &mut dyn service::Dispatch, slot: &Arc<ReplySlot>, resent: bool) -> u64 {
        let hdr = self.buf.header();
        let len = le_u32(hdr, 0) as usize;
        let opcode = le_u32(hdr, 4);
        let unique = le_u64(hdr, 8);
        let commit_id = le_u64(hdr, ENT_IN_OUT + 8);
        let payload_sz = le_u32(hdr, ENT_IN_OUT + 16) as usize;
        // The first in-argument went to op_in, the rest to the payload; the header's len counts
        // all of them.
        let op_in = len
            .checked_sub(IN_HEADER_LEN + payload_sz)
            .filter(|&n| n <= OP_IN && payload_sz <= PAYLOAD);
        let reply = match op_in {
            None => None,
            Some(op_in) => {
                let mut in_header = [0u8; IN_HEADER_LEN];
                in_header.copy_from_slice(&hdr[..IN_HEADER_LEN]);
                if resent {
                    in_header[8..16].copy_from_slice(&(unique | UNIQUE_RESEND).to_ne_bytes());
                }
                let parts: [&[u8]; 3] = [
                    &in_header,
                    &hdr[OP_IN..OP_IN + op_in],
                    &self.buf.payload()[..payload_sz],
                ];
                let sink: Arc<dyn RingReplySink> = slot.clone();
                if !d.dispatch(&parts, sink) {
                    None
                } else if opcode == FUSE_FORGET || opcode == FUSE_BATCH_FORGET {
                    Some(empty_reply(unique, 0))
                } else {
                    Some(slot.wait())
                }
            }
        };
        let reply = reply.unwrap_or_else(|| {
            tracing::warn!(opcode, "malformed request from a ring entry");
            empty_reply(unique, -libc::EIO)
        });
        let reply = if reply.len() < OUT_HEADER_LEN || reply.len() - OUT_HEADER_LEN > PAYLOAD {
            empty_reply(unique, -libc::EIO)
        } else {
            reply
        };
        let body = reply.len() - OUT_HEADER_LEN;
        // A rare big request (a WRITE through the daemon): its data is consumed, so its pages are
        // given back now, before the reply is written into the same payload. Never after: the
        // kernel reads the reply from these pages at the commit (pages given back read as zeros:
        // a WRITE answered "0 bytes written", a READ answered with zeros), and once committed the
        // entry may already hold the next request. A big reply (a READ) keeps its pages.
        let release = payload_sz > BIG_PAYLOAD && body <= BIG_PAYLOAD;
        keep::save_request(&mut self.buf, body, !release);
        keep::mark_overwriting(&mut self.buf, commit_id);
        if release {
            self.buf.release_payload_pages();
        }
        self.buf.header_mut()[..OUT_HEADER_LEN].copy_from_slice(&reply[..OUT_HEADER_LEN]);
        // The kernel matches the reply by its own unique (without a resend mark).
        self.buf.header_mut()[8..16].copy_from_slice(&unique.to_ne_bytes());
        self.buf.header_mut()[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
            .copy_from_slice(&(body as u32).to_ne_bytes());
        self.buf.payload_mut()[..body].copy_from_slice(&reply[OUT_HEADER_LEN..]);
        keep::mark_replied(&mut self.buf, commit_id);
        commit_id
    }

    /// Answers the request `commit_id` in the buffers with `EIO` (its bytes are lost); returns
    /// `commit_id`. The unique (bytes 8..16) is the kernel's in a request and in a reply alike.
    fn answer_lost(&mut self, commit_id: u64) -> u64 {
        let unique = le_u64(self.buf.header(), 8);
        let reply = empty_reply(unique, -libc::EIO);
        keep::mark_overwriting(&mut self.buf, commit_id);
        self.buf.header_mut()[..OUT_HEADER_LEN].copy_from_slice(&reply);
        self.buf.header_mut()[ENT_IN_OUT + 16..ENT_IN_OUT + 20]
            .copy_from_slice(&0u32.to_ne_bytes());
        keep::mark_replied(&mut self.buf, commit_id);
        commit_id
    }
}

/// A request payload over this many bytes gives its pages back once it is served, so an entry does
/// not keep a megabyte resident for a rare big WRITE.
const BIG_PAYLOAD: usize = 256 * 1024;

/// A reply that is only a `fuse_out_header`.
fn empty_reply(unique: u64, error: i32) -> Vec<u8> {
    let mut v = Vec::with_capacity(OUT_HEADER_LEN);
    v.extend_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
    v.extend_from_slice(&error.to_ne_bytes());
    v.extend_from_slice(&unique.to_ne_bytes());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_names_round_trip() {
        for t in [Transport::Auto, Transport::Uring, Transport::Dev] {
            assert_eq!(t.to_string().parse::<Transport>(), Ok(t));
        }
        assert!("ring".parse::<Transport>().is_err());
    }

    #[test]
    fn commands_carry_commit_id_and_queue() {
        let c = cmd_req(0x0102_0304_0506_0708, 3);
        assert_eq!(le_u64(&c, 0), 0);
        assert_eq!(le_u64(&c, 8), 0x0102_0304_0506_0708);
        assert_eq!(u16::from_ne_bytes([c[16], c[17]]), 3);
    }

    #[test]
    fn possible_cpus_counts_this_machine() {
        let n = possible_cpus().expect("cpus");
        assert!(n >= std::thread::available_parallelism().map_or(1, |n| n.get()));
    }
}
