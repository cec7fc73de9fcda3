//! The data files of one workspace's upper layer: `<upper>/data/<inode as 16 hex digits>`.
//!
//! A data file appears complete or not at all (written under `data/.tmp-*`, then renamed), and before
//! any catalog record points at it. Copy-up streams from the blob cache with `copy_file_range`, never
//! holding a file in memory, and copies only the data ranges (`SEEK_DATA`/`SEEK_HOLE`): a sparse file
//! stays sparse. Files the catalog does not know after an unclean
//! stop are moved to `<upper>/quarantine/`, never deleted.

use std::fs::{File, FileTimes, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::catalog::Ts;

/// How a note about a damaged catalog batch starts in `quarantine/README`.
const DAMAGE_NOTE: &str = "catalog: ";

/// Copies all of `src` into the empty file `dst`, leaving `src`'s holes as holes (a 5 GiB sparse base
/// file must not become 5 GiB of zeros on disk when one byte of it is written).
pub(crate) fn copy_sparse(src: &File, dst: &mut File) -> io::Result<()> {
    let len = src.metadata()?.len();
    let mut off = 0u64;
    while off < len {
        let at = i64::try_from(off).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let start = match crate::sys::lseek(src, at, libc::SEEK_DATA) {
            Ok(s) => s as u64,
            // Only a hole from here to the end.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            // A file system without SEEK_DATA: everything is data.
            Err(_) => off,
        };
        let end = match crate::sys::lseek(src, start as i64, libc::SEEK_HOLE) {
            Ok(h) => (h as u64).min(len),
            Err(_) => len,
        };
        copy_range(src, dst, start, end)?;
        off = end.max(start + 1);
    }
    dst.set_len(len)
}

/// Copies bytes `at..end` of `src` to the same offsets of `dst`.
fn copy_range(src: &File, dst: &File, mut at: u64, end: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    while at < end {
        match crate::sys::copy_file_range(src, at, dst, at, end - at) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file being copied up shrank",
                ));
            }
            Ok(n) => at += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                ) =>
            {
                // No copy_file_range between these files: through a bounded buffer.
                let mut buf = vec![0u8; (end - at).min(1 << 20) as usize];
                while at < end {
                    let n = buf.len().min((end - at) as usize);
                    src.read_exact_at(&mut buf[..n], at)?;
                    dst.write_all_at(&buf[..n], at)?;
                    at += n as u64;
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[derive(Debug)]
pub struct Upper {
    dir: PathBuf,
}

pub fn system_time(t: Ts) -> std::time::SystemTime {
    if t.0 >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::new(t.0 as u64, t.1)
    } else {
        std::time::UNIX_EPOCH - std::time::Duration::from_secs(t.0.unsigned_abs())
            + std::time::Duration::from_nanos(t.1 as u64)
    }
}

impl Upper {
    pub fn open(dir: &Path) -> io::Result<Upper> {
        crate::layout::create_private_dir(&dir.join("data"))?;
        Ok(Upper {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn data_path(&self, ino: u64) -> PathBuf {
        self.dir.join("data").join(format!("{ino:016x}"))
    }

    fn tmp_path(&self, ino: u64) -> PathBuf {
        self.dir.join("data").join(format!(".tmp-{ino:016x}"))
    }

    /// Creates the data file of `ino` with the content of `from` (empty when `None`) and the given
    /// times, atomically.
    pub fn create(
        &self,
        ino: u64,
        from: Option<&mut File>,
        atime: Ts,
        mtime: Ts,
    ) -> io::Result<()> {
        let tmp = self.tmp_path(ino);
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            if let Some(src) = from {
                copy_sparse(src, &mut f)?;
            }
            f.set_times(
                FileTimes::new()
                    .set_accessed(system_time(atime))
                    .set_modified(system_time(mtime)),
            )?;
            std::fs::rename(&tmp, self.data_path(ino))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// "Now" on the data files' own clock: file times come from the kernel's coarse clock, which can
    /// lag the precise one by a tick, so a write right after a precise "now" may carry an earlier
    /// time. Touching a file here and reading its ctime gives a time no later write can precede.
    pub fn clock(&self) -> io::Result<Ts> {
        use std::os::unix::fs::MetadataExt;
        // Waits for the next tick of that clock, so that everything written before this call has
        // an earlier time than the answer and everything written after it a time at least as late.
        let p = self.dir.join("clock");
        let touch = || -> io::Result<Ts> {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&p)?;
            let m = std::fs::metadata(&p)?;
            Ok(Ts(m.ctime(), m.ctime_nsec() as u32))
        };
        let first = touch()?;
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_micros(500));
            let t = touch()?;
            if t > first {
                return Ok(t);
            }
        }
        touch()
    }

    /// Opens the data file of `ino` read-write.
    pub fn open_data(&self, ino: u64) -> io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.data_path(ino))
    }

    pub fn remove(&self, ino: u64) {
        if let Err(e) = std::fs::remove_file(self.data_path(ino))
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(ino, "cannot remove data file: {e}");
        }
    }

    /// Inode numbers of every data file, and leftover temp files (incomplete copy-ups) removed.
    pub fn data_inodes(&self) -> io::Result<Vec<u64>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.dir.join("data"))? {
            let e = e?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(".tmp-") {
                // A copy-up that never completed holds only base content: nothing of the user's.
                let _ = std::fs::remove_file(e.path());
            } else if let Ok(ino) = u64::from_str_radix(&name, 16) {
                out.push(ino);
            }
        }
        Ok(out)
    }

    /// Moves the data file of `ino` into `<upper>/quarantine/` and records why.
    pub fn quarantine(&self, ino: u64, why: &str) -> io::Result<PathBuf> {
        let q = self.dir.join("quarantine");
        crate::layout::create_private_dir(&q)?;
        let dest = q.join(format!("{ino:016x}"));
        std::fs::rename(self.data_path(ino), &dest)?;
        use std::io::Write;
        let mut notes = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(q.join("README"))?;
        writeln!(notes, "{ino:016x}: {why}")?;
        Ok(dest)
    }

    /// Records in `quarantine/README` that a damaged catalog batch was skipped.
    pub fn note_damage(&self, what: &str) -> io::Result<()> {
        let q = self.dir.join("quarantine");
        std::fs::create_dir_all(&q)?;
        use std::io::Write;
        let mut notes = OpenOptions::new()
            .create(true)
            .append(true)
            .open(q.join("README"))?;
        writeln!(notes, "{DAMAGE_NOTE}{what}")
    }

    /// The notes [`Upper::note_damage`] left.
    pub fn damage_notes(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("quarantine").join("README"))
            .map(|t| {
                t.lines()
                    .filter_map(|l| l.strip_prefix(DAMAGE_NOTE))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Files currently in quarantine.
    pub fn quarantined(&self) -> usize {
        std::fs::read_dir(self.dir.join("quarantine"))
            .map(|d| d.flatten().filter(|e| e.file_name() != "README").count())
            .unwrap_or(0)
    }
}
