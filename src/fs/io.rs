//! How a mount serves file I/O: the mode ([`IoMode`]) a workspace record, the daemon's settings and
//! the control protocol carry (the daemon resolves its own defaults into one of these before
//! mounting), and the one I/O interface ([`FileIo`]) that both ways of holding files open implement:
//! by handle ([`Handles`]) and by inode in no-open mode ([`InodeIo`]). It knows nothing of FUSE
//! requests or replies and decides nothing: [`crate::fs::files`] picks the implementation.

use super::FsError;
use super::handles::Handles;
use super::inode_io::InodeIo;

/// How a mount serves file I/O (`octofs serve --io` for the daemon's default, `octofs open --io` for
/// a thread of its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IoMode {
    /// OPEN and RELEASE per open file, each with a handle; reads and writes handed to the kernel
    /// (passthrough) when it works, the page cache shared with the blob cache's files.
    #[default]
    Handles,
    /// No OPEN, RELEASE or FLUSH (`open` and `flush` answer `ENOSYS`): a warm open, read and close
    /// costs no request. No passthrough (the kernel refuses to mix them); I/O by inode through READ
    /// and WRITE, the page cache kept per mount.
    NoOpen,
}

impl std::str::FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "handles" => Ok(IoMode::Handles),
            "no-open" => Ok(IoMode::NoOpen),
            _ => Err(format!("unknown I/O mode {s:?} (handles or no-open)")),
        }
    }
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoMode::Handles => "handles",
            IoMode::NoOpen => "no-open",
        })
    }
}

/// A file a request names: its inode and the handle the kernel sent (`fh` 0: none, as in no-open
/// mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRef {
    pub ino: u64,
    pub fh: u64,
}

/// File I/O on an open file, the same for both ways a mount holds files open: by handle
/// ([`Handles`], which goes by `fh`) and by inode ([`InodeIo`], which goes by `ino`). Which one serves
/// a request is decided once, by [`crate::fs::files::Files`], not in each request.
pub trait FileIo {
    /// Up to `size` bytes at `offset` (short only at the end of the file).
    fn read(&self, f: FileRef, offset: u64, size: u32) -> Result<Vec<u8>, FsError>;
    /// Writes `data` at `offset`; the bytes written.
    fn write(&self, f: FileRef, offset: u64, data: &[u8]) -> Result<u32, FsError>;
    /// The file's data file to disk (if it has one), then the catalog.
    fn fsync(&self, f: FileRef, datasync: bool) -> Result<(), FsError>;
    fn fallocate(&self, f: FileRef, mode: i32, offset: u64, length: u64) -> Result<(), FsError>;
    fn lseek(&self, f: FileRef, offset: i64, whence: i32) -> Result<i64, FsError>;
    /// Copies up to `len` bytes from `from` at `off_in` to `to` at `off_out`.
    fn copy_file_range(
        &self,
        from: FileRef,
        off_in: u64,
        to: FileRef,
        off_out: u64,
        len: u64,
    ) -> Result<u32, FsError>;
}

impl<B> FileIo for Handles<B> {
    fn read(&self, f: FileRef, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        Handles::read(self, f.fh, offset, size)
    }
    fn write(&self, f: FileRef, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        Handles::write(self, f.fh, offset, data)
    }
    fn fsync(&self, f: FileRef, datasync: bool) -> Result<(), FsError> {
        Handles::fsync(self, f.fh, datasync)
    }
    fn fallocate(&self, f: FileRef, mode: i32, offset: u64, length: u64) -> Result<(), FsError> {
        Handles::fallocate(self, f.fh, mode, offset, length)
    }
    fn lseek(&self, f: FileRef, offset: i64, whence: i32) -> Result<i64, FsError> {
        Handles::lseek(self, f.fh, offset, whence)
    }
    fn copy_file_range(
        &self,
        from: FileRef,
        off_in: u64,
        to: FileRef,
        off_out: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        Handles::copy_file_range(self, from.fh, off_in, to.fh, off_out, len)
    }
}

impl FileIo for InodeIo {
    fn read(&self, f: FileRef, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        InodeIo::read(self, f.ino, offset, size)
    }
    fn write(&self, f: FileRef, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        InodeIo::write(self, f.ino, offset, data)
    }
    fn fsync(&self, f: FileRef, datasync: bool) -> Result<(), FsError> {
        InodeIo::fsync(self, f.ino, datasync)
    }
    fn fallocate(&self, f: FileRef, mode: i32, offset: u64, length: u64) -> Result<(), FsError> {
        InodeIo::fallocate(self, f.ino, mode, offset, length)
    }
    fn lseek(&self, f: FileRef, offset: i64, whence: i32) -> Result<i64, FsError> {
        InodeIo::lseek(self, f.ino, offset, whence)
    }
    fn copy_file_range(
        &self,
        from: FileRef,
        off_in: u64,
        to: FileRef,
        off_out: u64,
        len: u64,
    ) -> Result<u32, FsError> {
        InodeIo::copy_file_range(self, from.ino, off_in, to.ino, off_out, len)
    }
}
