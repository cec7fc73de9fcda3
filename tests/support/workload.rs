//! The workload of the fault tests: file-system operations through a mount by path (create in
//! chunks with or without fsync, pwrite, append, truncate, rename over files and empty
//! directories, unlink, mkdir, rmdir, chmod, hardlinks, symlinks), how far each got before a kill
//! or an error ([`Progress`]), their effect on the shared POSIX [`Model`], and a generator of
//! valid sequences drawn from the model's current state.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::model::{Kind, Model, join};
use crate::common::{Rng, pseudo_random};

/// Whether `p` is `dir` or inside it (everything is inside the root `""`).
pub fn under(p: &str, dir: &str) -> bool {
    dir.is_empty()
        || p == dir
        || (p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/')
}

pub fn overlay(content: &mut Vec<u8>, off: usize, data: &[u8]) {
    if content.len() < off + data.len() {
        content.resize(off + data.len(), 0);
    }
    content[off..off + data.len()].copy_from_slice(data);
}

#[derive(Clone)]
pub enum Op {
    /// open(O_CREAT|O_EXCL|O_WRONLY, mode), `write`s of `chunk` bytes, optional fsync, close.
    Create {
        path: String,
        data: Vec<u8>,
        mode: u32,
        chunk: usize,
        fsync: bool,
    },
    /// open(O_WRONLY), pwrite at `offset` (may extend), optional fdatasync, close.
    Write {
        path: String,
        offset: u64,
        data: Vec<u8>,
        fsync: bool,
    },
    /// open(O_WRONLY|O_APPEND), write, optional fsync, close.
    Append {
        path: String,
        data: Vec<u8>,
        fsync: bool,
    },
    /// open(O_WRONLY), ftruncate.
    Truncate {
        path: String,
        len: u64,
    },
    Rename {
        from: String,
        to: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        path: String,
        target: String,
    },
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Create {
                path,
                data,
                mode,
                chunk,
                fsync,
            } => write!(
                f,
                "create {path:?} {} bytes mode {mode:o} in writes of {chunk}{}",
                data.len(),
                if *fsync { " + fsync" } else { "" }
            ),
            Op::Write {
                path,
                offset,
                data,
                fsync,
            } => write!(
                f,
                "pwrite {path:?} {} bytes at {offset}{}",
                data.len(),
                if *fsync { " + fdatasync" } else { "" }
            ),
            Op::Append { path, data, fsync } => write!(
                f,
                "append {path:?} {} bytes{}",
                data.len(),
                if *fsync { " + fsync" } else { "" }
            ),
            Op::Truncate { path, len } => write!(f, "truncate {path:?} to {len}"),
            Op::Rename { from, to } => write!(f, "rename {from:?} -> {to:?}"),
            Op::Unlink { path } => write!(f, "unlink {path:?}"),
            Op::Mkdir { path, mode } => write!(f, "mkdir {path:?} mode {mode:o}"),
            Op::Rmdir { path } => write!(f, "rmdir {path:?}"),
            Op::Chmod { path, mode } => write!(f, "chmod {path:?} {mode:o}"),
            Op::Link { from, to } => write!(f, "link {from:?} -> {to:?}"),
            Op::Symlink { path, target } => write!(f, "symlink {path:?} -> {target:?}"),
        }
    }
}

impl Op {
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Create { fsync: true, .. } => "create+fsync",
            Op::Create { .. } => "create",
            Op::Write { fsync: true, .. } => "pwrite+fdatasync",
            Op::Write { .. } => "pwrite",
            Op::Append { fsync: true, .. } => "append+fsync",
            Op::Append { .. } => "append",
            Op::Truncate { .. } => "truncate",
            Op::Rename { .. } => "rename",
            Op::Unlink { .. } => "unlink",
            Op::Mkdir { .. } => "mkdir",
            Op::Rmdir { .. } => "rmdir",
            Op::Chmod { .. } => "chmod",
            Op::Link { .. } => "link",
            Op::Symlink { .. } => "symlink",
        }
    }

    /// The new name an operation makes, whose inode number is recorded after it succeeds.
    pub fn new_name(&self) -> Option<&str> {
        match self {
            Op::Create { path, .. } | Op::Mkdir { path, .. } | Op::Symlink { path, .. } => {
                Some(path)
            }
            _ => None,
        }
    }
}

/// How far an operation got: whether its create returned success and how many bytes its writes
/// returned success for.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub created: bool,
    pub acked: usize,
}

/// Counters shared between a workload and the thread that kills the daemon.
#[derive(Default)]
pub struct Live {
    pub ops_done: AtomicUsize,
    /// Bytes acknowledged so far by the running operation.
    pub op_bytes: AtomicUsize,
    pub finished: AtomicBool,
    pub killed: AtomicBool,
}

pub fn tracked_writes(
    data: &[u8],
    chunk: usize,
    prog: &mut Progress,
    live: &Live,
    mut w: impl FnMut(&[u8], usize) -> io::Result<usize>,
) -> io::Result<()> {
    while prog.acked < data.len() {
        let end = (prog.acked + chunk).min(data.len());
        let n = w(&data[prog.acked..end], prog.acked)?;
        if n == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        prog.acked += n;
        live.op_bytes.store(prog.acked, Ordering::SeqCst);
    }
    Ok(())
}

/// Runs `op` through the mount at `root`, recording its progress.
pub fn exec(op: &Op, root: &Path, prog: &mut Progress, live: &Live) -> io::Result<()> {
    let p = |rel: &str| root.join(rel);
    match op {
        Op::Create {
            path,
            data,
            mode,
            chunk,
            fsync,
        } => {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(*mode)
                .open(p(path))?;
            prog.created = true;
            tracked_writes(data, *chunk, prog, live, |b, _| f.write(b))?;
            if *fsync {
                f.sync_all()?;
            }
            Ok(())
        }
        Op::Write {
            path,
            offset,
            data,
            fsync,
        } => {
            let f = OpenOptions::new().write(true).open(p(path))?;
            tracked_writes(data, data.len(), prog, live, |b, at| {
                f.write_at(b, offset + at as u64)
            })?;
            if *fsync {
                f.sync_data()?;
            }
            Ok(())
        }
        Op::Append { path, data, fsync } => {
            let mut f = OpenOptions::new().append(true).open(p(path))?;
            tracked_writes(data, data.len(), prog, live, |b, _| f.write(b))?;
            if *fsync {
                f.sync_all()?;
            }
            Ok(())
        }
        Op::Truncate { path, len } => OpenOptions::new().write(true).open(p(path))?.set_len(*len),
        Op::Rename { from, to } => fs::rename(p(from), p(to)),
        Op::Unlink { path } => fs::remove_file(p(path)),
        Op::Mkdir { path, mode } => fs::DirBuilder::new().mode(*mode).create(p(path)),
        Op::Rmdir { path } => fs::remove_dir(p(path)),
        Op::Chmod { path, mode } => fs::set_permissions(p(path), fs::Permissions::from_mode(*mode)),
        Op::Link { from, to } => fs::hard_link(p(from), p(to)),
        Op::Symlink { path, target } => std::os::unix::fs::symlink(target, p(path)),
    }
}

/// The model side of the operations.
impl Model {
    /// The effect of an operation every syscall of which succeeded (the model must agree that it
    /// succeeds).
    #[track_caller]
    pub fn apply(&mut self, op: &Op, umask: u32) {
        let path_of = |m: &Model, p: &str| m.at(p);
        let done = match op {
            Op::Create {
                path, data, mode, ..
            } => {
                self.new_file(path, data.clone(), mode & !umask);
                Ok(())
            }
            Op::Write {
                path, offset, data, ..
            } => {
                overlay(self.content_mut(path), *offset as usize, data);
                Ok(())
            }
            Op::Append { path, data, .. } => {
                self.content_mut(path).extend_from_slice(data);
                Ok(())
            }
            Op::Truncate { path, len } => self.truncate(self.file_id(path), *len),
            Op::Rename { from, to } => {
                let (p, name) = self.entry_of(from);
                let (np, newname) = self.entry_of(to);
                self.rename(p, &name, np, &newname, 0)
            }
            Op::Unlink { path } => {
                let (d, name) = self.entry_of(path);
                self.unlink(d, &name)
            }
            Op::Rmdir { path } => {
                let (d, name) = self.entry_of(path);
                self.rmdir(d, &name)
            }
            Op::Mkdir { path, mode } => {
                let (d, name) = self.entry_of(path);
                self.make(d, &name, Kind::Dir, mode & !umask, Vec::new())
                    .map(|_| ())
            }
            Op::Chmod { path, mode } => {
                let id = path_of(self, path);
                self.node_mut(id).mode = *mode;
                Ok(())
            }
            Op::Link { from, to } => {
                let src = self.file_id(from);
                let (d, name) = self.entry_of(to);
                self.link(src, d, &name)
            }
            Op::Symlink { path, target } => {
                let (d, name) = self.entry_of(path);
                self.make(d, &name, Kind::Symlink, 0o777, target.as_bytes().to_vec())
                    .map(|_| ())
            }
        };
        if let Err(e) = done {
            panic!("model: {op} succeeded through the mount, the model answers {e:?}");
        }
    }

    /// The effect of an operation that failed with a definite error (ENOSPC): what its successful
    /// syscalls did (a created file, the bytes `write` returned success for), nothing more.
    pub fn apply_partial(&mut self, op: &Op, prog: &Progress, umask: u32) {
        match op {
            Op::Create {
                path, data, mode, ..
            } if prog.created => self.new_file(path, data[..prog.acked].to_vec(), mode & !umask),
            Op::Write {
                path, offset, data, ..
            } if prog.acked > 0 => overlay(
                self.content_mut(path),
                *offset as usize,
                &data[..prog.acked],
            ),
            Op::Append { path, data, .. } if prog.acked > 0 => self
                .content_mut(path)
                .extend_from_slice(&data[..prog.acked]),
            _ => {}
        }
    }
}

/// Generates a deterministic, valid sequence of operations against the current model.
pub struct Gen {
    pub rng: Rng,
    pub seq: u64,
}

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
            seq: 0,
        }
    }

    pub fn name(&mut self, dir: &str) -> String {
        self.seq += 1;
        join(dir, &format!("n{}", self.seq))
    }

    pub fn fresh(&mut self, m: &Model) -> String {
        let d = self.rng.pick(&m.dirs()).clone();
        self.name(&d)
    }

    pub fn data(&mut self, len: usize) -> Vec<u8> {
        pseudo_random(len, self.rng.next())
    }

    pub fn create(&mut self, m: &Model) -> Op {
        let r = self.rng.below(100);
        let len = if r < 70 {
            self.rng.below(8193) as usize
        } else if r < 90 {
            self.rng.range(8192, 128 * 1024) as usize
        } else {
            self.rng.range(128 * 1024, 400 * 1024) as usize
        };
        Op::Create {
            path: self.fresh(m),
            data: self.data(len),
            mode: *self.rng.pick(&[0o644, 0o600, 0o755, 0o640]),
            chunk: *self.rng.pick(&[4096, 65536, 1 << 20]),
            fsync: self.rng.pct(30),
        }
    }

    /// A large file written in 64 KiB writes (a kill can land in the middle of it).
    pub fn big(&mut self, m: &Model, len: usize) -> Op {
        Op::Create {
            path: self.fresh(m),
            data: self.data(len),
            mode: 0o644,
            chunk: 64 * 1024,
            fsync: false,
        }
    }

    pub fn rename(&mut self, m: &Model) -> Option<Op> {
        let r = self.rng.below(10);
        if r < 5 {
            let nondirs = m.paths(|k| k != Kind::Dir);
            if nondirs.is_empty() {
                return None;
            }
            let from = self.rng.pick(&nondirs).clone();
            return Some(Op::Rename {
                from,
                to: self.fresh(m),
            });
        }
        if r < 7 {
            // Over another existing file.
            let files = m.files();
            if files.len() < 2 {
                return None;
            }
            let (from, to) = (self.rng.pick(&files).clone(), self.rng.pick(&files).clone());
            return (m.file_id(&from) != m.file_id(&to)).then_some(Op::Rename { from, to });
        }
        let dirs: Vec<String> = m.dirs().into_iter().filter(|d| !d.is_empty()).collect();
        if dirs.is_empty() {
            return None;
        }
        let from = self.rng.pick(&dirs).clone();
        if r == 9 {
            // Over an empty directory.
            let empty: Vec<String> = dirs
                .iter()
                .filter(|d| **d != from && !under(d, &from) && m.is_empty_dir(d))
                .cloned()
                .collect();
            if !empty.is_empty() {
                let to = self.rng.pick(&empty).clone();
                return Some(Op::Rename { from, to });
            }
        }
        let parents: Vec<String> = m.dirs().into_iter().filter(|d| !under(d, &from)).collect();
        let parent = self.rng.pick(&parents).clone();
        Some(Op::Rename {
            from,
            to: self.name(&parent),
        })
    }

    pub fn next(&mut self, m: &Model) -> Op {
        let files = m.files();
        let roll = self.rng.below(100);
        let op = match roll {
            0..22 => None,
            22..34 if !files.is_empty() => {
                let path = self.rng.pick(&files).clone();
                let len = m.content(&path).len();
                let offset = self.rng.below(len as u64 + 1);
                let n = self.rng.range(1, 16 * 1024) as usize;
                Some(Op::Write {
                    path,
                    offset,
                    data: self.data(n),
                    fsync: self.rng.pct(25),
                })
            }
            34..46 if !files.is_empty() => {
                let path = self.rng.pick(&files).clone();
                let n = self.rng.range(1, 8 * 1024) as usize;
                Some(Op::Append {
                    path,
                    data: self.data(n),
                    fsync: self.rng.pct(25),
                })
            }
            46..50 if !files.is_empty() => {
                let path = self.rng.pick(&files).clone();
                let len = m.content(&path).len();
                Some(Op::Truncate {
                    path,
                    len: self.rng.below(len as u64 + 4097),
                })
            }
            50..62 => self.rename(m),
            62..72 => {
                let names = m.paths(|k| k != Kind::Dir);
                (!names.is_empty()).then(|| Op::Unlink {
                    path: self.rng.pick(&names).clone(),
                })
            }
            72..79 => Some(Op::Mkdir {
                path: self.fresh(m),
                mode: *self.rng.pick(&[0o755, 0o700, 0o750]),
            }),
            79..83 => {
                let empty: Vec<String> = m
                    .dirs()
                    .into_iter()
                    .filter(|d| !d.is_empty() && m.is_empty_dir(d))
                    .collect();
                (!empty.is_empty()).then(|| Op::Rmdir {
                    path: self.rng.pick(&empty).clone(),
                })
            }
            83..90 => {
                if self.rng.pct(70) && !files.is_empty() {
                    Some(Op::Chmod {
                        path: self.rng.pick(&files).clone(),
                        mode: *self.rng.pick(&[0o600, 0o644, 0o755, 0o700, 0o444, 0o640]),
                    })
                } else {
                    let dirs: Vec<String> =
                        m.dirs().into_iter().filter(|d| !d.is_empty()).collect();
                    (!dirs.is_empty()).then(|| Op::Chmod {
                        path: self.rng.pick(&dirs).clone(),
                        mode: *self.rng.pick(&[0o755, 0o700, 0o750]),
                    })
                }
            }
            90..95 if !files.is_empty() => Some(Op::Link {
                from: self.rng.pick(&files).clone(),
                to: self.fresh(m),
            }),
            95..100 => {
                let mut existing = self.rng.pick(&m.paths(|_| true)).clone();
                if existing.is_empty() {
                    existing = ".".to_string();
                }
                let target = self
                    .rng
                    .pick(&[
                        "README.md".to_string(),
                        "../README.md".to_string(),
                        "dangling/target".to_string(),
                        "/absolute/elsewhere".to_string(),
                        existing,
                    ])
                    .clone();
                Some(Op::Symlink {
                    path: self.fresh(m),
                    target,
                })
            }
            _ => None,
        };
        op.unwrap_or_else(|| self.create(m))
    }
}
