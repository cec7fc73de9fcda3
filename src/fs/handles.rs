//! Open file handles of one mounted workspace, the passthrough backing of each inode, and the
//! directory listings `readdir` serves: what the kernel refers to by `fh` or by a directory offset,
//! kept apart from the fuser adapter so that tests can drive it without a kernel.
//!
//! Owns five rules:
//! - **One backing per inode.** The kernel requires every concurrent passthrough open of one inode to
//!   use the same backing file, so one backing id per inode is shared while any open holds it (the
//!   pattern of fuser's passthrough example: a weak table by inode, a strong reference per handle).
//!   The backing type is generic: the adapter uses fuser's `BackingId`, tests use anything.
//! - **A writer never joins base readers.** A write-open (or truncate) of a base file that readers hold
//!   open through passthrough moves the name to a new, copied-up inode and answers `ESTALE`, so the
//!   kernel looks the name up again; the readers keep the base content, as after a rename-over.
//! - **Handles follow copy-up.** A handle opened on base content before the file was copied up reads
//!   the current content (as every descriptor of a file does); it never writes (`EBADF`).
//! - **A running program is never truncated.** The kernel sends `O_TRUNC` to the open (octofs asks
//!   for atomic `O_TRUNC`) and refuses a running executable with `ETXTBSY` only after that open
//!   answered; for `O_RDONLY|O_TRUNC` nothing refused it before, so the file would already be empty
//!   (and the program killed by `SIGBUS`) when the caller is told `ETXTBSY`. The kernel's exec
//!   opens carry `FMODE_EXEC`; while one of an inode is open, `O_RDONLY|O_TRUNC` gets `ETXTBSY`
//!   here, before anything is truncated. (Write opens are refused by the kernel before they are
//!   sent.)
//! - **Directory offsets are names.** `readdir` keeps no per-open state (the kernel may list a
//!   directory without opening it): each entry's offset is a hash of its name (`.` is 1, `..` is 2),
//!   entries are served in offset order, and a request resumes after the offset it is given. A name
//!   added or removed between two requests of one listing moves no other name, so a name present
//!   throughout is listed exactly once. The sorted names are cached per directory while the
//!   workspace's commit count says they are current.
//!
//! Locks (see `docs/locking.md`): the handle, backing and listing tables are `DashMap`s whose guards
//! are held only to copy an `Arc` in or out, never across I/O. Opens of one inode with passthrough
//! are serialized by that inode's backing slot mutex, held across the core's `open` (which may copy
//! the file up): a concurrent open of the same inode waits, no other inode does. Touches the
//! workspace only through [`WorkspaceFs`]'s request methods.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::fs::FsError;
use dashmap::DashMap;
use fuser::Errno;

use super::{Caller, Context, DirName, Opened, WorkspaceFs};

/// An open file.
struct Handle<B> {
    ino: u64,
    file: Arc<File>,
    /// The file is the workspace's data file (else the read-only blob-cache file).
    upper: bool,
    /// Counted as a writer by the core: its release must say so.
    write: bool,
    /// Opened by the kernel to execute the file (`FMODE_EXEC`): counted in `executing`.
    exec: bool,
    /// Held while this handle is open, keeping the inode's backing id alive.
    _backing: Option<Arc<B>>,
}

/// The names of one directory in offset order, as of a commit count of the workspace.
struct DirListing {
    commits: u64,
    /// `(offset, name)`, sorted by offset then name.
    names: Vec<(u64, DirName)>,
}

/// Directories whose sorted names are kept between requests (a listing of a large directory takes
/// many requests; the kernel caches what it has read, so few directories are listed at once).
const LISTINGS: usize = 64;

/// Up to `size` bytes of `file` at `offset`, short only at its end (a read the kernel asked for is
/// answered whole, whatever short reads the file gives).
pub(crate) fn read_full_at(file: &File, offset: u64, size: u32) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; size as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(filled);
    Ok(buf)
}

/// The `readdir` offset of `name`: `.` 1, `..` 2, anything else a hash of the name in `3..2^62+3`
/// (positive as an `off_t`; two names of one directory share one with a chance of about n²/2^63).
pub fn dir_offset(name: &std::ffi::OsStr) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    match name.as_encoded_bytes() {
        b"." => 1,
        b".." => 2,
        bytes => {
            // SipHash with fixed keys: the same offset for the same name for the daemon's life.
            let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                .hash_one(bytes);
            3 + (h >> 2)
        }
    }
}

/// The passthrough backing of one inode while any open of it exists.
struct Backing<B> {
    id: Weak<B>,
    /// Whether the backing file is the data file (else the blob-cache file).
    upper: bool,
}

impl<B> Default for Backing<B> {
    fn default() -> Self {
        Backing {
            id: Weak::new(),
            upper: false,
        }
    }
}

type Slot<B> = Arc<Mutex<Backing<B>>>;

/// A file handle just opened.
#[derive(Debug)]
pub struct FileOpen<B> {
    pub fh: u64,
    /// The handle reads the workspace's own data file (else immutable base content).
    pub upper: bool,
    /// The backing the kernel should pass I/O through to (`None`: I/O comes to the daemon).
    pub backing: Option<Arc<B>>,
    /// Registering a backing failed: passthrough does not work on this mount.
    pub passthrough_failed: Option<std::io::Error>,
}

/// The handles of one mount.
pub struct Handles<B> {
    core: Arc<WorkspaceFs>,
    next_fh: AtomicU64,
    handles: DashMap<u64, Handle<B>>,
    backing: DashMap<u64, Slot<B>>,
    listings: DashMap<u64, Arc<DirListing>>,
    /// Inodes with open exec handles, and how many.
    executing: DashMap<u64, usize>,
}

/// The kernel's `__FMODE_EXEC` open flag: the open of a program by `execve` (or of its interpreter).
/// The kernel passes it in the flags of FUSE OPEN; `libc` has no constant for it.
pub const FMODE_EXEC: i32 = 0x20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The first handle number of a new table: the time in microseconds times 1024. A daemon that
/// adopts the mounts of one that died (docs/restart.md "A crash") knows nothing of the handles the
/// kernel still holds; numbering from the clock, it never gives out a number the dead one did
/// (that would take 1024 opens per microsecond), so an old handle is unknown here (`EBADF`), never
/// another file.
fn first_fh() -> u64 {
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    (micros << 10).max(1)
}

impl<B> Handles<B> {
    pub fn new(core: Arc<WorkspaceFs>) -> Self {
        Handles {
            core,
            next_fh: AtomicU64::new(first_fh()),
            handles: DashMap::new(),
            backing: DashMap::new(),
            listings: DashMap::new(),
            executing: DashMap::new(),
        }
    }

    pub fn core(&self) -> &WorkspaceFs {
        &self.core
    }

    fn add(&self, h: Handle<B>) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.insert(fh, h);
        fh
    }

    fn add_file(
        &self,
        ino: u64,
        opened: Opened,
        exec: bool,
        backing: Option<Arc<B>>,
        passthrough_failed: Option<std::io::Error>,
    ) -> FileOpen<B> {
        let upper = opened.upper;
        if exec {
            *self.executing.entry(ino).or_default() += 1;
        }
        let fh = self.add(Handle {
            ino,
            file: Arc::new(opened.file),
            upper,
            write: opened.write,
            exec,
            _backing: backing.clone(),
        });
        FileOpen {
            fh,
            upper,
            backing,
            passthrough_failed,
        }
    }

    /// Locks the backing slot of `ino` and runs `f` on it, the slot being the one in the table.
    fn with_slot<R>(&self, ino: u64, f: impl FnOnce(&mut Backing<B>) -> R) -> R {
        loop {
            // The table's guard is held only to clone the Arc.
            let slot = self.backing.entry(ino).or_default().clone();
            let mut b = lock(&slot);
            let current = self
                .backing
                .get(&ino)
                .is_some_and(|s| Arc::ptr_eq(&s, &slot));
            if current {
                return f(&mut b);
            }
        }
    }

    /// Opens `ino` (`flags` as `open(2)`). With `register` (passthrough on), finds or registers the
    /// inode's backing. `Err(ESTALE)` asks the kernel to look the name up again (the name now has a
    /// new inode); `Err(EBUSY)` when the inode's backing cannot be shared with this open.
    pub fn open(
        &self,
        ino: u64,
        flags: i32,
        register: Option<impl FnOnce(&File) -> std::io::Result<B>>,
    ) -> Result<FileOpen<B>, FsError> {
        let exec = flags & FMODE_EXEC != 0;
        if flags & libc::O_ACCMODE == libc::O_RDONLY
            && flags & libc::O_TRUNC != 0
            && self.executing.get(&ino).is_some_and(|n| *n > 0)
        {
            return Err(Errno::ETXTBSY.into());
        }
        let Some(register) = register else {
            let opened = self.core.open(ino, flags)?;
            return Ok(self.add_file(ino, opened, exec, None, None));
        };
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let r = self.with_slot(ino, |slot| {
            let live = slot.id.upgrade();
            if write && live.is_some() && !slot.upper {
                // Readers hold the base content through passthrough: the kernel would refuse a
                // second backing file for this inode, so the writer gets a new inode.
                return Err(FsError::from(if self.core.reinode_for_write(ino)? {
                    Errno::ESTALE
                } else {
                    Errno::EBUSY
                }));
            }
            let opened = self.core.open(ino, flags)?;
            if let Some(id) = live {
                if slot.upper == opened.upper {
                    return Ok((opened, Some(id), None));
                }
                self.core.release(ino, opened.write);
                return Err(Errno::EBUSY.into());
            }
            match register(&opened.file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    *slot = Backing {
                        id: Arc::downgrade(&id),
                        upper: opened.upper,
                    };
                    Ok((opened, Some(id), None))
                }
                Err(e) => Ok((opened, None, Some(e))),
            }
        });
        let (opened, backing, failed) = r?;
        Ok(self.add_file(ino, opened, exec, backing, failed))
    }

    /// `create`: a new regular file in `parent`, opened; with `register`, its backing registered.
    pub fn create(
        &self,
        parent: u64,
        name: &std::ffi::OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
        register: Option<impl FnOnce(&File) -> std::io::Result<B>>,
    ) -> Result<(fuser::FileAttr, FileOpen<B>), FsError> {
        let (attr, opened) = self.core.create(parent, name, mode, flags, caller)?;
        let ino = attr.ino.0;
        let (backing, failed) = match register.map(|r| r(&opened.file)) {
            None => (None, None),
            Some(Ok(id)) => {
                let id = Arc::new(id);
                self.with_slot(ino, |slot| {
                    *slot = Backing {
                        id: Arc::downgrade(&id),
                        upper: true,
                    }
                });
                (Some(id), None)
            }
            Some(Err(e)) => (None, Some(e)),
        };
        // A writer exactly when the core counted one: `O_RDONLY|O_CREAT` is none, and its release
        // must not un-count another handle's write-open of the file.
        Ok((attr, self.add_file(ino, opened, false, backing, failed)))
    }

    /// Before a truncate of `ino`: a base file that readers hold through passthrough moves its name
    /// to a new inode first (`Err(ESTALE)`: look the name up again; `Err(EBUSY)`: not possible).
    pub fn before_truncate(&self, ino: u64) -> Result<(), FsError> {
        let live_base = self.backing.get(&ino).map(|s| s.clone()).is_some_and(|s| {
            let b = lock(&s);
            b.id.strong_count() > 0 && !b.upper
        });
        if !live_base || self.core.is_upper(ino) {
            return Ok(());
        }
        match self.core.reinode_for_write(ino)? {
            true => Err(Errno::ESTALE.into()),
            false => Err(Errno::EBUSY.into()),
        }
    }

    /// The file behind `fh`, whether it is the data file, and its inode.
    fn file(&self, fh: u64) -> Result<(Arc<File>, bool, u64), FsError> {
        match self.handles.get(&fh).as_deref() {
            Some(Handle {
                file, upper, ino, ..
            }) => Ok((file.clone(), *upper, *ino)),
            None => Err(Errno::EBADF.into()),
        }
    }

    /// The data file behind `fh`; a handle on base content is not open for writing (`EBADF`).
    fn upper_file(&self, fh: u64) -> Result<(Arc<File>, u64), FsError> {
        match self.file(fh)? {
            (file, true, ino) => Ok((file, ino)),
            _ => Err(Errno::EBADF.into()),
        }
    }

    /// The file `fh` reads now: a handle opened on the base content before the file was copied up
    /// switches to the data file.
    fn current_file(&self, fh: u64) -> Result<(Arc<File>, bool, u64), FsError> {
        let (file, upper, ino) = self.file(fh)?;
        if upper || !self.core.is_upper(ino) {
            return Ok((file, upper, ino));
        }
        let Ok(data) = self.core.open_data(ino) else {
            return Ok((file, upper, ino));
        };
        let data = Arc::new(data);
        if let Some(mut h) = self.handles.get_mut(&fh) {
            h.file = data.clone();
            h.upper = true;
        }
        Ok((data, true, ino))
    }

    /// What an I/O error on a handle's file was about, for its context: "write to the data file
    /// /…/data/8000000000000002a" (or "read of the base content of inode 0x2a").
    fn what(&self, ino: u64, upper: bool, op: &str) -> String {
        if upper {
            format!("{op} of data file {}", self.core.data_path(ino).display())
        } else {
            format!("{op} of the base content of inode {ino:#x}")
        }
    }

    /// Up to `size` bytes of `fh` at `offset` (short only at the end of the file).
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let (file, upper, ino) = self.current_file(fh)?;
        read_full_at(&file, offset, size).context(|| self.what(ino, upper, "read"))
    }

    /// Writes `data` at `offset` of `fh`.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let (file, ino) = self.upper_file(fh)?;
        self.core
            .grow_data(ino, offset.saturating_add(data.len() as u64))?;
        file.write_all_at(data, offset)
            .context(|| self.what(ino, true, "write"))?;
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL.into())
    }

    /// `fsync` of `fh`: its data file, then the catalog.
    pub fn fsync(&self, fh: u64, datasync: bool) -> Result<(), FsError> {
        let (file, upper, ino) = self.file(fh)?;
        if upper {
            if datasync {
                file.sync_data()
            } else {
                file.sync_all()
            }
            .context(|| self.what(ino, true, "fsync"))?;
        }
        self.core.sync_catalog()
    }

    pub fn fallocate(&self, fh: u64, mode: i32, offset: u64, length: u64) -> Result<(), FsError> {
        let (file, ino) = self.upper_file(fh)?;
        self.core
            .grow_for_fallocate(ino, &file, mode, offset, length)?;
        crate::sys::fallocate(&file, mode, offset, length)
            .context(|| self.what(ino, true, "fallocate"))
    }

    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> Result<i64, FsError> {
        let (file, _, _) = self.file(fh)?;
        crate::sys::lseek(&file, offset, whence).map_err(FsError::from)
    }

    /// Copies up to `len` bytes from `fh_in` at `off_in` to `fh_out` at `off_out`.
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        off_in: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        let (src, _, _) = self.file(fh_in)?;
        let (dst, ino) = self.upper_file(fh_out)?;
        let len = len.min(u64::from(u32::MAX) & !0xfff);
        let len = self.core.grow_for_copy(ino, &src, off_in, off_out, len)?;
        let n = crate::sys::copy_file_range(&src, off_in, &dst, off_out, len)
            .context(|| self.what(ino, true, "copy_file_range into"))?;
        u32::try_from(n).map_err(|_| FsError::eio("copy_file_range copied more than asked"))
    }

    /// `release` of file handle `fh` of `ino`.
    /// Whether `fh` is a handle of this table (a daemon that adopted a dead one's mount does not
    /// know the handles the kernel still holds: those are served by inode).
    pub fn knows(&self, fh: u64) -> bool {
        self.handles.contains_key(&fh)
    }

    pub fn release(&self, ino: u64, fh: u64) {
        let (wrote, exec) = match self.handles.remove(&fh) {
            Some((_, Handle { write, exec, .. })) => (write, exec),
            None => (false, false),
        };
        if exec {
            self.executing.remove_if_mut(&ino, |_, n| {
                *n = n.saturating_sub(1);
                *n == 0
            });
        }
        // Drop the inode's slot once its last backing reference is gone. A slot locked now is
        // being used by an open of the inode: it stays.
        self.backing.remove_if(&ino, |_, s| {
            s.try_lock().is_ok_and(|b| b.id.strong_count() == 0)
        });
        self.core.release(ino, wrote);
    }

    /// Runs `f` on the names of directory `ino` that come after `offset` (0: from the start), in
    /// offset order, each with its offset; `f` returns false to stop. Keeps no state per listing.
    pub fn readdir(
        &self,
        ino: u64,
        offset: u64,
        mut f: impl FnMut(u64, &DirName) -> bool,
    ) -> Result<(), FsError> {
        let list = self.listing(ino)?;
        let start = list.names.partition_point(|(o, _)| *o <= offset);
        for (o, name) in &list.names[start..] {
            if !f(*o, name) {
                break;
            }
        }
        Ok(())
    }

    /// The sorted names of directory `ino`: the cached ones while no commit happened since they
    /// were read, else read again.
    fn listing(&self, ino: u64) -> Result<Arc<DirListing>, FsError> {
        let now = self.core.commits();
        // The table's guard is held only to clone the Arc.
        let cached = self.listings.get(&ino).map(|l| l.clone());
        if let Some(l) = cached.filter(|l| l.commits == now) {
            return Ok(l);
        }
        let (commits, names) = self.core.dir_names(ino)?;
        let mut names: Vec<(u64, DirName)> = names
            .into_iter()
            .map(|n| (dir_offset(&n.name), n))
            .collect();
        names.sort_unstable_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.name.cmp(&y.name)));
        let list = Arc::new(DirListing { commits, names });
        if self.listings.len() >= LISTINGS {
            self.listings.retain(|_, l| l.commits == commits);
            if self.listings.len() >= LISTINGS {
                self.listings.clear();
            }
        }
        self.listings.insert(ino, list.clone());
        Ok(list)
    }

    /// Directory listings kept between requests.
    pub fn cached_listings(&self) -> usize {
        self.listings.len()
    }

    /// Open file handles.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

/// One open handle as handed to another daemon process: its file goes alongside as a descriptor
/// (`HandlesState::handles[i]` is `files[i]`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HandleState {
    pub fh: u64,
    pub ino: u64,
    pub upper: bool,
    pub write: bool,
    pub exec: bool,
    /// The passthrough backing id the kernel holds for this handle's inode.
    pub backing: Option<u32>,
}

/// The open handles of one mount as another daemon process needs them to go on serving the same
/// kernel connection: the kernel refers to them by `fh` and to backing ids by number.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct HandlesState {
    pub next_fh: u64,
    pub handles: Vec<HandleState>,
    /// `(inode, backing file is the data file)` of each inode with a live backing id.
    pub backing: Vec<(u64, bool)>,
}

impl<B> Handles<B> {
    /// The handle table and the file of each handle, in the same order, for a handover. `raw`
    /// names a backing id. Call it while no request is being served (the readers are paused).
    pub fn export_state(&self, raw: impl Fn(&B) -> u32) -> (HandlesState, Vec<Arc<File>>) {
        let mut handles = Vec::new();
        let mut files = Vec::new();
        for h in self.handles.iter() {
            handles.push(HandleState {
                fh: *h.key(),
                ino: h.ino,
                upper: h.upper,
                write: h.write,
                exec: h.exec,
                backing: h._backing.as_deref().map(&raw),
            });
            files.push(h.file.clone());
        }
        let backing = self
            .backing
            .iter()
            .filter_map(|s| {
                let b = lock(s.value());
                (b.id.strong_count() > 0).then_some((*s.key(), b.upper))
            })
            .collect();
        let state = HandlesState {
            next_fh: self.next_fh.load(Ordering::Relaxed),
            handles,
            backing,
        };
        (state, files)
    }

    /// Takes the handles of a handover into an empty table: `files[i]` is the file of
    /// `state.handles[i]`, and `adopt` takes ownership of a backing id the kernel holds (called once
    /// per id; `None`: it cannot be). Refuses a state whose files do not match its handles.
    pub fn import_state(
        &self,
        state: HandlesState,
        files: Vec<File>,
        mut adopt: impl FnMut(u32) -> Option<B>,
    ) -> Result<(), String> {
        if files.len() != state.handles.len() {
            return Err(format!(
                "{} handles but {} files",
                state.handles.len(),
                files.len()
            ));
        }
        let upper_of: std::collections::HashMap<u64, bool> = state.backing.into_iter().collect();
        let mut ids: std::collections::HashMap<u32, Arc<B>> = std::collections::HashMap::new();
        let mut max_fh = 0;
        for (h, file) in state.handles.into_iter().zip(files) {
            let backing = match h.backing {
                None => None,
                Some(id) => {
                    let b = match ids.get(&id) {
                        Some(b) => b.clone(),
                        None => {
                            let b = Arc::new(
                                adopt(id).ok_or_else(|| format!("backing id {id} not adopted"))?,
                            );
                            ids.insert(id, b.clone());
                            b
                        }
                    };
                    let upper = upper_of.get(&h.ino).copied().unwrap_or(h.upper);
                    self.with_slot(h.ino, |slot| {
                        *slot = Backing {
                            id: Arc::downgrade(&b),
                            upper,
                        }
                    });
                    Some(b)
                }
            };
            if h.exec {
                *self.executing.entry(h.ino).or_default() += 1;
            }
            max_fh = max_fh.max(h.fh);
            self.handles.insert(
                h.fh,
                Handle {
                    ino: h.ino,
                    file: Arc::new(file),
                    upper: h.upper,
                    write: h.write,
                    exec: h.exec,
                    _backing: backing,
                },
            );
        }
        self.next_fh
            .store(state.next_fh.max(max_fh + 1), Ordering::Relaxed);
        Ok(())
    }
}
