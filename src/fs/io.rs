//! How a mount serves file I/O ([`IoMode`]): the choice a workspace record, the daemon's settings
//! and the control protocol carry. It knows nothing of FUSE requests or of the adapter that acts on
//! it (`fuse.rs`); the daemon resolves its own defaults into one of these before mounting.

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
