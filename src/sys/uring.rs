//! The `unsafe` half of the FUSE-over-io_uring transport: a minimal io_uring (setup, one kind of
//! submission, completions), the ring entries' buffers the kernel reads and writes, and CPU pinning.
//!
//! It knows nothing of FUSE beyond the shape of a `IORING_OP_URING_CMD` submission with 128-byte
//! entries; the protocol lives in `fs::uring`. Like `sys`, every function checks its arguments and
//! turns a failure into an `io::Error` carrying errno. The invariants that make the safe API sound:
//! a [`Ring`] owns its mappings and file descriptor, and an [`EntryBuffers`] is never unmapped while
//! the kernel may still write into it (see its doc). A mount's entry buffers live in one memfd
//! ([`RingMemory`]) at an address the next daemon can map it at again, so that it can take over
//! the entries of a daemon that died or handed over (docs/transport.md, "Surviving the daemon").

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

const IORING_SETUP_SQE128: u32 = 1 << 10;
const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;
const IORING_OFF_SQ_RING: libc::off_t = 0;
const IORING_OFF_CQ_RING: libc::off_t = 0x800_0000;
const IORING_OFF_SQES: libc::off_t = 0x1000_0000;
const IORING_ENTER_GETEVENTS: u32 = 1;
const IORING_OP_URING_CMD: u8 = 46;
const IORING_OP_POLL_ADD: u8 = 6;
const IORING_SETUP_CQSIZE: u32 = 1 << 3;
/// A 128-byte submission entry (`IORING_SETUP_SQE128`).
const SQE_SIZE: usize = 128;
/// Where a `URING_CMD`'s command bytes start inside the entry, and how many fit (SQE128).
const SQE_CMD_OFFSET: usize = 48;
pub const SQE_CMD_LEN: usize = SQE_SIZE - SQE_CMD_OFFSET;

#[repr(C)]
#[derive(Default)]
struct SqringOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CqringOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqringOffsets,
    cq_off: CqringOffsets,
}

/// One anonymous or ring mapping, unmapped on drop.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn map(len: usize, fd: Option<(RawFd, libc::off_t)>) -> io::Result<Mapping> {
        let (flags, fd, off) = match fd {
            Some((fd, off)) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd, off),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0),
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) aliases nothing; the result is
        // checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(p.cast::<u8>())
            .map(|ptr| Mapping { ptr, len })
            .ok_or_else(|| io::Error::other("mmap returned NULL"))
    }

    /// A pointer `off` bytes in; `off + size` must lie within the mapping.
    fn at<T>(&self, off: u32) -> *mut T {
        debug_assert!(off as usize + std::mem::size_of::<T>() <= self.len);
        // SAFETY: callers pass offsets the kernel reported for this mapping (within `len`).
        unsafe { self.ptr.as_ptr().add(off as usize).cast::<T>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `map` with this length and is not used after drop.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

// SAFETY: a Mapping is plain memory; which thread touches it is decided by its owner.
unsafe impl Send for Mapping {}

/// A completion: the `user_data` given at submission and the result (`>= 0` or `-errno`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub user_data: u64,
    pub res: i32,
}

/// An io_uring instance with 128-byte submission entries, used by one thread.
pub struct Ring {
    fd: OwnedFd,
    sq: Mapping,
    /// The CQ ring's own mapping, unless the kernel maps SQ and CQ together.
    cq: Option<Mapping>,
    sqes: Mapping,
    sq_off: SqringOffsets,
    cq_off: CqringOffsets,
    sq_entries: u32,
    /// Entries filled but not yet handed to the kernel.
    pending: u32,
}

impl Ring {
    /// Sets up a ring of `entries` submission slots (the kernel rounds up to a power of two).
    pub fn new(entries: u32) -> io::Result<Ring> {
        Self::with_cq(entries, 0)
    }

    /// As [`Ring::new`], with room for `cq_entries` completions (0: the kernel's default, twice
    /// the submission slots).
    pub fn with_cq(entries: u32, cq_entries: u32) -> io::Result<Ring> {
        let mut p = Params {
            flags: IORING_SETUP_SQE128,
            ..Params::default()
        };
        if cq_entries > 0 {
            p.flags |= IORING_SETUP_CQSIZE;
            p.cq_entries = cq_entries;
        }
        // SAFETY: io_uring_setup reads and writes only `p`, which lives across the call.
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, entries, &mut p as *mut Params) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: io_uring_setup returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let sq_len = p.sq_off.array as usize + p.sq_entries as usize * 4;
        let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * 16;
        let raw = fd.as_raw_fd();
        let (sq, cq) = if p.features & IORING_FEAT_SINGLE_MMAP != 0 {
            (
                Mapping::map(sq_len.max(cq_len), Some((raw, IORING_OFF_SQ_RING)))?,
                None,
            )
        } else {
            (
                Mapping::map(sq_len, Some((raw, IORING_OFF_SQ_RING)))?,
                Some(Mapping::map(cq_len, Some((raw, IORING_OFF_CQ_RING)))?),
            )
        };
        let sqes = Mapping::map(
            p.sq_entries as usize * SQE_SIZE,
            Some((raw, IORING_OFF_SQES)),
        )?;
        Ok(Ring {
            fd,
            sq,
            cq,
            sqes,
            sq_entries: p.sq_entries,
            sq_off: p.sq_off,
            cq_off: p.cq_off,
            pending: 0,
        })
    }

    fn cq_map(&self) -> &Mapping {
        self.cq.as_ref().unwrap_or(&self.sq)
    }

    fn atomic(m: &Mapping, off: u32) -> &AtomicU32 {
        // SAFETY: the kernel reported `off` as a 4-byte aligned u32 in this shared mapping, which
        // lives as long as `m`; the kernel updates it concurrently, hence atomic access only.
        unsafe { &*m.at::<AtomicU32>(off) }
    }

    /// Queues an `IORING_OP_URING_CMD` on `fd` (not yet submitted: see [`Ring::submit_and_wait`]).
    /// `addr`/`len` are the entry's `addr` and `len` fields, `cmd` its command bytes.
    ///
    /// The memory `addr` points to (and whatever it points to in turn) must stay valid until the
    /// kernel has consumed the entry and for as long as the command may use it; the caller keeps it
    /// alive ([`EntryBuffers`] is built for that).
    pub fn push_uring_cmd(
        &mut self,
        fd: RawFd,
        cmd_op: u32,
        user_data: u64,
        addr: u64,
        len: u32,
        cmd: &[u8],
    ) -> io::Result<()> {
        if cmd.len() > SQE_CMD_LEN {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut sqe = [0u8; SQE_SIZE];
        sqe[0] = IORING_OP_URING_CMD;
        sqe[4..8].copy_from_slice(&fd.to_ne_bytes());
        sqe[8..12].copy_from_slice(&cmd_op.to_ne_bytes());
        sqe[16..24].copy_from_slice(&addr.to_ne_bytes());
        sqe[24..28].copy_from_slice(&len.to_ne_bytes());
        sqe[32..40].copy_from_slice(&user_data.to_ne_bytes());
        sqe[SQE_CMD_OFFSET..SQE_CMD_OFFSET + cmd.len()].copy_from_slice(cmd);
        self.push_sqe(&sqe)
    }

    /// Queues a one-shot `IORING_OP_POLL_ADD` of `events` (`POLLIN`…) on `fd`: it completes with
    /// `user_data` once `fd` is ready. Nothing but the descriptor is referenced.
    pub fn push_poll(&mut self, fd: RawFd, events: u32, user_data: u64) -> io::Result<()> {
        let mut sqe = [0u8; SQE_SIZE];
        sqe[0] = IORING_OP_POLL_ADD;
        sqe[4..8].copy_from_slice(&fd.to_ne_bytes());
        sqe[28..32].copy_from_slice(&events.to_ne_bytes());
        sqe[32..40].copy_from_slice(&user_data.to_ne_bytes());
        self.push_sqe(&sqe)
    }

    /// Copies a built submission entry into the next free slot and publishes it.
    fn push_sqe(&mut self, sqe: &[u8; SQE_SIZE]) -> io::Result<()> {
        let head = Self::atomic(&self.sq, self.sq_off.head).load(Ordering::Acquire);
        let tail_a = Self::atomic(&self.sq, self.sq_off.tail);
        let tail = tail_a.load(Ordering::Relaxed);
        if tail.wrapping_sub(head) >= self.sq_entries {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        // SAFETY: the ring mask is a u32 in the SQ mapping at a kernel-given offset.
        let mask = unsafe { *self.sq.at::<u32>(self.sq_off.ring_mask) };
        let idx = tail & mask;
        // SAFETY: slot `idx` < sq_entries lies within the SQE mapping; the kernel reads it only
        // after the tail store below publishes it, and the slot is free (checked against head).
        unsafe {
            std::ptr::copy_nonoverlapping(
                sqe.as_ptr(),
                self.sqes.ptr.as_ptr().add(idx as usize * SQE_SIZE),
                SQE_SIZE,
            );
            *self.sq.at::<u32>(self.sq_off.array + idx * 4) = idx;
        }
        tail_a.store(tail.wrapping_add(1), Ordering::Release);
        self.pending += 1;
        Ok(())
    }

    /// Hands the queued entries to the kernel and, if `wait`, blocks until at least one
    /// completion is there. Interrupted waits are retried.
    pub fn submit_and_wait(&mut self, wait: bool) -> io::Result<()> {
        loop {
            let flags = if wait { IORING_ENTER_GETEVENTS } else { 0 };
            // SAFETY: io_uring_enter on our own ring fd with no signal mask.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    self.fd.as_raw_fd(),
                    self.pending,
                    u32::from(wait),
                    flags,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(e);
            }
            self.pending = self.pending.saturating_sub(r as u32);
            if self.pending == 0 {
                return Ok(());
            }
        }
    }

    /// The ring's descriptor (for a poll on the ring itself from another ring).
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Takes the next completion, if any.
    pub fn pop(&mut self) -> Option<Completion> {
        let cq = self.cq_map();
        let head_a = Self::atomic(cq, self.cq_off.head);
        let head = head_a.load(Ordering::Relaxed);
        let tail = Self::atomic(cq, self.cq_off.tail).load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        // SAFETY: mask and CQE slot are within the CQ mapping at kernel-given offsets; the
        // acquire load of tail ordered the kernel's write of this CQE before our read.
        let c = unsafe {
            let mask = *cq.at::<u32>(self.cq_off.ring_mask);
            let p = cq.at::<u8>(self.cq_off.cqes + (head & mask) * 16);
            Completion {
                user_data: std::ptr::read_unaligned(p.cast::<u64>()),
                res: std::ptr::read_unaligned(p.add(8).cast::<i32>()),
            }
        };
        head_a.store(head.wrapping_add(1), Ordering::Release);
        Some(c)
    }
}

/// Where the ring memories of a process are mapped: slots of [`RING_SLOT`] bytes from
/// [`RING_BASE`], far from where the kernel puts mappings by itself (just below the top of the
/// 47-bit user address space), so that the next daemon finds the same addresses free and can map a
/// dead daemon's ring memory exactly where the kernel expects it.
const RING_BASE: u64 = 0x5000_0000_0000;
const RING_SLOT: u64 = 1 << 30;
const RING_SLOTS: u64 = 4096;
/// How many slots a new ring memory tries (from the one its key hashes to) before it lets the
/// kernel choose (then a next daemon can rarely map it again: only fresh entries).
const RING_TRIES: u64 = 64;

/// The buffers of every ring entry of one mount, in one memfd mapped shared at an address a later
/// process can map the same memfd at (`MAP_FIXED_NOREPLACE`): the kernel keeps the *user
/// addresses* an entry was registered with and copies replies from them in the committing task's
/// address space, so a daemon that adopts a dead daemon's entries must have their buffers at the
/// same addresses. Unmapped when the last [`EntryBuffers`] of it goes (see its contract).
pub struct RingMemory {
    fd: OwnedFd,
    map: Mapping,
}

impl RingMemory {
    /// A new memfd of `len` bytes, mapped at a free slot of the reserved range (the first tried is
    /// chosen by `key`), or where the kernel chooses if none is free.
    pub fn create(len: usize, key: u64) -> io::Result<RingMemory> {
        // SAFETY: memfd_create reads the NUL-terminated name only.
        let fd = unsafe { libc::memfd_create(c"octofs-ring".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let span = (len as u64).div_ceil(RING_SLOT);
        for t in 0..RING_TRIES {
            let slot = (key.wrapping_add(t * span)) % RING_SLOTS.saturating_sub(span).max(1);
            if let Ok(map) = map_shared_at(&fd, RING_BASE + slot * RING_SLOT, len) {
                return Ok(RingMemory { fd, map });
            }
        }
        let map = map_shared_at(&fd, 0, len)?;
        Ok(RingMemory { fd, map })
    }

    /// Maps a ring memory another process made (`fd`, at least `len` bytes) at the same address
    /// `addr` it had there; fails (`EEXIST`) if something of this process is in the way.
    pub fn adopt(fd: OwnedFd, addr: u64, len: usize) -> io::Result<RingMemory> {
        // SAFETY: fstat fills `st` only.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as u64) < len as u64 || addr == 0 {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let map = map_shared_at(&fd, addr, len)?;
        Ok(RingMemory { fd, map })
    }

    /// The address the memory is mapped at (to record with the geometry).
    pub fn addr(&self) -> u64 {
        self.map.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.map.len
    }

    pub fn is_empty(&self) -> bool {
        self.map.len == 0
    }

    /// The memfd, to hand to the keeper or to the next daemon.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.fd.as_fd()
    }

    /// The buffers of the entry at byte `off` of this memory: a header page, `payload_len` bytes
    /// of payload, a page holding the iovec pair that registers them
    /// ([`EntryBuffers::stride`] bytes in all). The iovec pair is (re)written; nothing else is.
    pub fn entry(
        self: &std::sync::Arc<Self>,
        off: usize,
        header_len: usize,
        payload_len: usize,
    ) -> io::Result<EntryBuffers> {
        if header_len > PAGE
            || !payload_len.is_multiple_of(PAGE)
            || !off.is_multiple_of(PAGE)
            || off
                .checked_add(EntryBuffers::stride(payload_len))
                .is_none_or(|e| e > self.map.len)
        {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let b = EntryBuffers {
            mem: self.clone(),
            off,
            header_len,
            payload_len,
        };
        // SAFETY: `off` and the entry's stride lie within the mapping (checked above).
        let base = unsafe { self.map.ptr.as_ptr().add(off) };
        let iovs = [
            libc::iovec {
                iov_base: base.cast(),
                iov_len: header_len,
            },
            libc::iovec {
                // SAFETY: within the entry (checked above).
                iov_base: unsafe { base.add(PAGE) }.cast(),
                iov_len: payload_len,
            },
        ];
        // SAFETY: the iovec page lies after the payload, page-aligned (checked above); the kernel
        // reads it only during a REGISTER of this entry.
        unsafe {
            std::ptr::write(
                base.add(PAGE + payload_len).cast::<[libc::iovec; 2]>(),
                iovs,
            );
        }
        Ok(b)
    }
}

const PAGE: usize = 4096;

/// Maps `len` bytes of `fd` shared at `addr` exactly (`MAP_FIXED_NOREPLACE`: never over an
/// existing mapping), or where the kernel chooses when `addr` is 0.
fn map_shared_at(fd: &OwnedFd, addr: u64, len: usize) -> io::Result<Mapping> {
    let flags = if addr == 0 {
        libc::MAP_SHARED
    } else {
        libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE
    };
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping of ours (EEXIST instead); the result is
    // checked before use.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let m = NonNull::new(p.cast::<u8>())
        .map(|ptr| Mapping { ptr, len })
        .ok_or_else(|| io::Error::other("mmap returned NULL"))?;
    if addr != 0 && m.ptr.as_ptr() as u64 != addr {
        // A kernel before 4.17 takes the address as a hint only.
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    Ok(m)
}

// SAFETY: shared plain memory; which thread touches which entry is decided by the owners of the
// entries (one thread each).
unsafe impl Sync for RingMemory {}

/// The two buffers of one FUSE ring entry — headers and payload — plus the two-element iovec that
/// registers them (`sqe.addr`), a slice of the mount's [`RingMemory`] at stable addresses.
///
/// Soundness contract: while the entry is registered with the kernel and not handed back to us in
/// a completion, the kernel may write into these buffers at any time. The owner therefore reads
/// or writes them only between a completion and the next submission for the entry, and never
/// unmaps them while the connection may still use them: dropping is fine after the kernel tore
/// the entry down (a completion with an error), otherwise call [`EntryBuffers::leak`].
pub struct EntryBuffers {
    mem: std::sync::Arc<RingMemory>,
    off: usize,
    header_len: usize,
    payload_len: usize,
}

impl EntryBuffers {
    /// One entry's buffers in a memory of their own (for tests and one-off entries).
    pub fn new(header_len: usize, payload_len: usize) -> io::Result<EntryBuffers> {
        let mem = std::sync::Arc::new(RingMemory::create(Self::stride(payload_len), 0)?);
        mem.entry(0, header_len, payload_len)
    }

    /// The bytes one entry takes in a [`RingMemory`]: header page, payload, iovec page.
    pub const fn stride(payload_len: usize) -> usize {
        PAGE + payload_len + PAGE
    }

    fn base(&self) -> *mut u8 {
        // SAFETY: `off` lies within the mapping (checked by `RingMemory::entry`).
        unsafe { self.mem.map.ptr.as_ptr().add(self.off) }
    }

    /// The address of the two-element iovec to put in the REGISTER submission's `addr`.
    pub fn iovec_addr(&self) -> u64 {
        self.base() as u64 + (PAGE + self.payload_len) as u64
    }

    pub fn header(&self) -> &[u8] {
        // SAFETY: within the mapping; see the type's soundness contract for when to call.
        unsafe { std::slice::from_raw_parts(self.base(), self.header_len) }
    }

    pub fn header_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `header`, exclusive through `&mut self` (one owner per entry).
        unsafe { std::slice::from_raw_parts_mut(self.base(), self.header_len) }
    }

    /// The header page past the kernel's headers: octofs's own bookkeeping, which the kernel never
    /// reads or writes (`PAGE - header_len` bytes).
    pub fn own(&self) -> &[u8] {
        // SAFETY: within the entry's header page.
        unsafe {
            std::slice::from_raw_parts(self.base().add(self.header_len), PAGE - self.header_len)
        }
    }

    pub fn own_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `own`, exclusive through `&mut self`.
        unsafe {
            std::slice::from_raw_parts_mut(self.base().add(self.header_len), PAGE - self.header_len)
        }
    }

    pub fn payload(&self) -> &[u8] {
        // SAFETY: within the mapping; see the type's soundness contract.
        unsafe { std::slice::from_raw_parts(self.base().add(PAGE), self.payload_len) }
    }

    pub fn payload_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `payload`, exclusive through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.base().add(PAGE), self.payload_len) }
    }

    /// Gives the payload's pages back to the system (they read as zeros afterwards); for after
    /// a large request, so a rare big write does not keep its memory resident.
    pub fn release_payload_pages(&mut self) {
        // SAFETY: MADV_REMOVE on a shared memfd range of this entry; it only frees its pages.
        unsafe {
            libc::madvise(
                self.base().add(PAGE).cast(),
                self.payload_len,
                libc::MADV_REMOVE,
            );
        }
    }

    /// Keeps the mapping forever: for when the kernel may still write into it (the connection
    /// outlives this entry's owner).
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

/// A non-blocking `eventfd(2)`: how one thread wakes another that waits in its ring (a poll of it).
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Makes it readable (a waiter's poll completes).
    pub fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes the 8 bytes of `one`.
        unsafe {
            libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), 8);
        }
    }

    /// Resets it to not readable.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reads at most 8 bytes into `b`.
        unsafe {
            libc::read(self.0.as_raw_fd(), b.as_mut_ptr().cast(), 8);
        }
    }
}

/// `statfs(2)` of `path`, result dropped: on a FUSE mount root, one STATFS request from the
/// caller's CPU (the ring transport's queue kick).
pub fn statfs(path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: statfs reads the NUL-terminated path and fills `st` only.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs the calling thread on `cpu` only.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain bits; CPU_SET is in range (checked); sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NOP-free smoke test of the ring plumbing: a URING_CMD on a file that does not support it
    /// completes with an error (EOPNOTSUPP or EBADF), proving submission and completion work.
    #[test]
    fn uring_cmd_on_a_plain_file_completes_with_an_error() {
        let mut ring = match Ring::new(2) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: io_uring unavailable: {e}");
                return;
            }
        };
        let f = std::fs::File::open("/proc/self/stat").expect("open");
        ring.push_uring_cmd(f.as_raw_fd(), 1, 42, 0, 0, &[0; 16])
            .expect("push");
        ring.submit_and_wait(true).expect("submit");
        let c = ring.pop().expect("a completion");
        assert_eq!(c.user_data, 42);
        assert!(c.res < 0, "expected an error, got {}", c.res);
        assert!(ring.pop().is_none());
    }

    /// The ring service's wake-up: a poll on an eventfd completes once it is signalled, and a
    /// drained eventfd is not readable again.
    #[test]
    fn a_poll_on_an_eventfd_completes_when_signalled() {
        let mut ring = match Ring::with_cq(8, 64) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: io_uring unavailable: {e}");
                return;
            }
        };
        let ev = EventFd::new().expect("eventfd");
        ring.push_poll(ev.raw(), libc::POLLIN as u32, 7)
            .expect("push");
        ring.submit_and_wait(false).expect("submit");
        assert!(ring.pop().is_none(), "completed before the signal");
        ev.signal();
        ring.submit_and_wait(true).expect("wait");
        let c = ring.pop().expect("a completion");
        assert_eq!(c.user_data, 7);
        assert!(c.res & libc::POLLIN as i32 != 0, "res {}", c.res);
        ev.drain();
        ring.push_poll(ev.raw(), libc::POLLIN as u32, 8)
            .expect("push");
        ring.submit_and_wait(false).expect("submit");
        assert!(ring.pop().is_none(), "a drained eventfd polled readable");
    }

    #[test]
    fn entry_buffers_are_separate_and_writable() {
        let mut b = EntryBuffers::new(288, 8192).expect("map");
        b.own_mut()[0] = 5;
        assert_eq!(b.own()[0], 5);
        assert_eq!(b.own().len(), 4096 - 288);
        b.header_mut()[0] = 7;
        b.payload_mut()[8191] = 9;
        assert_eq!(b.header()[0], 7);
        assert_eq!(b.payload()[8191], 9);
        assert_eq!(b.payload()[0], 0);
        b.release_payload_pages();
        assert_eq!(b.payload()[8191], 0);
    }
}
