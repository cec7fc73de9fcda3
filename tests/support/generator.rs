//! The generator of the model test: operations on the core (namespace, content, attributes,
//! xattrs, handles held across steps, clean and unclean reloads), each drawn from the model's
//! current state so that most succeed and every interesting errno is reached: names from a small
//! pool (they collide), 255/256-byte names, non-directories as parents, directories moved into
//! themselves, renames over held files, `RENAME_EXCHANGE`/`RENAME_NOREPLACE`, xattr create/replace
//! flags. A [`Step`] carries the seed of its forget round, so that a shrunk sequence replays the
//! same way.

use super::model::{Id, Kind, Model, NAME_MAX, ROOT, split};
use crate::common::Rng;

#[derive(Clone, Debug)]
pub enum Op {
    Create {
        dir: String,
        name: String,
        mode: u32,
        /// Bytes written through the handle `create` returns: (length, seed).
        data: Option<(usize, u64)>,
    },
    Mknod {
        dir: String,
        name: String,
        mode: u32,
    },
    Mkdir {
        dir: String,
        name: String,
        mode: u32,
    },
    Symlink {
        dir: String,
        name: String,
        target: String,
    },
    Link {
        src: String,
        dir: String,
        name: String,
    },
    Unlink {
        dir: String,
        name: String,
    },
    Rmdir {
        dir: String,
        name: String,
    },
    Rename {
        dir: String,
        name: String,
        newdir: String,
        newname: String,
        flags: u32,
    },
    /// Open O_RDWR, write (length, seed) bytes at `off` into the returned file, release.
    Write {
        path: String,
        off: u64,
        len: usize,
        seed: u64,
    },
    /// What the adapter does for a write-open while readers hold the base content through
    /// passthrough: `reinode_for_write` (the name gets a new, copied-up inode; the readers keep the
    /// old one, now unlinked), then open the name again O_RDWR and write.
    ReinodeWrite {
        path: String,
        off: u64,
        len: usize,
        seed: u64,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    Chown {
        path: String,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    SetXattr {
        path: String,
        name: String,
        len: usize,
        seed: u64,
        flags: i32,
    },
    RemoveXattr {
        path: String,
        name: String,
    },
    /// Open with O_TRUNC (O_RDWR or O_WRONLY) and release.
    OpenTrunc {
        path: String,
        rdwr: bool,
    },
    /// Open and keep the handle (and the kernel's reference) across steps.
    Hold {
        path: String,
        write: bool,
    },
    HeldWrite {
        k: usize,
        off: u64,
        len: usize,
        seed: u64,
    },
    HeldTruncate {
        k: usize,
        size: u64,
    },
    HeldChmod {
        k: usize,
        mode: u32,
    },
    HeldSetXattr {
        k: usize,
        name: String,
        len: usize,
        seed: u64,
    },
    /// Open a held inode once more for writing, without a lookup (as through /proc/self/fd).
    HeldReopen {
        k: usize,
    },
    Close {
        k: usize,
    },
    /// Stop and load again: cleanly (`close`) or as if the daemon was killed.
    Reload {
        clean: bool,
    },
}

/// One step: an operation and the seed of the forgets that follow it (kept with the step so that a
/// shrunk sequence forgets the same way).
#[derive(Clone, Debug)]
pub struct Step {
    pub op: Op,
    pub forget_seed: u64,
}

/// Names for new entries: few, so that they collide. U+FFFD stands for the byte 0xFF (not UTF-8:
/// the catalog must keep such names as bytes); see [`os`].
pub const NAMES: [&str; 14] = [
    "n0",
    "n1",
    "n2",
    "n3",
    "one.txt",
    "a",
    "b",
    "x",
    "deep.txt",
    "g.txt",
    "naïve café",
    "new\nline \"q\" \\",
    "bad\u{FFFD}name",
    "\u{FFFD}",
];
pub const XATTRS: [&str; 3] = ["user.a", "user.b", "user.long.attribute.name"];
pub const FILE_MODES: [u32; 4] = [0o644, 0o600, 0o755, 0o444];
pub const DIR_MODES: [u32; 4] = [0o755, 0o700, 0o777, 0o1777];
pub const CHMODS: [u32; 9] = [
    0o644, 0o600, 0o755, 0o700, 0o2755, 0o1777, 0o000, 0o4755, 0o640,
];

/// Picks the next operation from the model's current state.
pub struct Gen<'a> {
    pub m: &'a Model,
    pub r: &'a mut Rng,
    /// Inodes of the handles held open: unlinking or renaming over them is worth trying often.
    pub held: Vec<Id>,
    pub all: Vec<(String, Id)>,
}

impl Gen<'_> {
    pub fn paths_where(&self, f: impl Fn(Kind) -> bool) -> Vec<(String, Id)> {
        self.all
            .iter()
            .filter(|(_, id)| f(self.m.kind(*id)))
            .cloned()
            .collect()
    }

    pub fn dirs(&self) -> Vec<(String, Id)> {
        let mut d = vec![(String::new(), ROOT)];
        d.extend(self.paths_where(|k| k == Kind::Dir));
        d
    }

    pub fn path_of(&mut self, v: &[(String, Id)]) -> Option<(String, Id)> {
        (!v.is_empty()).then(|| self.r.pick(v).clone())
    }

    /// A directory mostly; now and then a non-directory (ENOTDIR).
    pub fn parent(&mut self) -> (String, Id) {
        if self.r.pct(4) {
            let others = self.paths_where(|k| k != Kind::Dir);
            if let Some(p) = self.path_of(&others) {
                return p;
            }
        }
        let dirs = self.dirs();
        self.r.pick(&dirs).clone()
    }

    /// A name for something new: from a small pool (so names collide), rarely 255 or 256 bytes.
    pub fn new_name(&mut self, dir: Id) -> String {
        if self.m.kind(dir) == Kind::Dir {
            match self.r.below(100) {
                0..=2 => return "l".repeat(NAME_MAX),
                3 => return "l".repeat(NAME_MAX + 1),
                _ => {}
            }
        }
        self.r.pick(&NAMES).to_string()
    }

    /// An existing name in `dir` half of the time, else a pool name.
    pub fn some_name(&mut self, dir: Id) -> String {
        let names: Vec<&String> = match self.m.kind(dir) {
            Kind::Dir => self.m.node(dir).children.keys().collect(),
            _ => Vec::new(),
        };
        if !names.is_empty() && self.r.pct(50) {
            return self.r.pick(&names).to_string();
        }
        self.r.pick(&NAMES).to_string()
    }

    pub fn data_len(&mut self) -> usize {
        if self.r.pct(10) {
            60_000 + self.r.below(30_000) as usize
        } else {
            1 + self.r.below(3000) as usize
        }
    }

    pub fn offset(&mut self, size: u64) -> u64 {
        match self.r.below(10) {
            0..=3 => self.r.below(size + 1),
            4..=6 => size,
            7 => size + 1 + self.r.below(5000),
            _ => self.r.below(150_000),
        }
    }

    pub fn size(&mut self, size: u64) -> u64 {
        match self.r.below(4) {
            0 => 0,
            1 => self.r.below(size + 1),
            2 => size + 1 + self.r.below(5000),
            _ => self.r.below(150_000),
        }
    }

    pub fn file_or_any(&mut self) -> Option<(String, Id)> {
        let files = self.paths_where(|k| k == Kind::File);
        if !files.is_empty() && self.r.pct(90) {
            return self.path_of(&files);
        }
        let any = self.paths_where(|k| k != Kind::Fifo);
        self.path_of(&any)
    }

    /// A path of an inode that is held open (and still linked).
    pub fn held_path(&mut self) -> Option<(String, Id)> {
        let paths: Vec<(String, Id)> = self
            .all
            .iter()
            .filter(|(_, id)| self.held.contains(id))
            .cloned()
            .collect();
        self.path_of(&paths)
    }

    pub fn op(&mut self, held: usize) -> Op {
        loop {
            if let Some(op) = self.try_op(held) {
                return op;
            }
        }
    }

    pub fn try_op(&mut self, held: usize) -> Option<Op> {
        let roll = self.r.below(100);
        Some(match roll {
            0..=8 => {
                let (dir, d) = self.parent();
                let data = self.r.pct(50).then(|| (self.data_len(), self.r.next()));
                Op::Create {
                    name: self.new_name(d),
                    dir,
                    mode: *self.r.pick(&FILE_MODES),
                    data,
                }
            }
            9..=10 => {
                let (dir, d) = self.parent();
                Op::Mknod {
                    name: self.new_name(d),
                    dir,
                    mode: *self.r.pick(&[0o644, 0o600]),
                }
            }
            11..=16 => {
                let (dir, d) = self.parent();
                Op::Mkdir {
                    name: self.new_name(d),
                    dir,
                    mode: *self.r.pick(&DIR_MODES),
                }
            }
            17..=19 => {
                let (dir, d) = self.parent();
                let target = if self.r.pct(2) {
                    "t".repeat(4096)
                } else {
                    self.r
                        .pick(&["a/one.txt", "../x", "/abs/path", "nowhere", "n0"])
                        .to_string()
                };
                Op::Symlink {
                    name: self.new_name(d),
                    dir,
                    target,
                }
            }
            20..=25 => {
                let nondirs = self.paths_where(|k| k != Kind::Dir);
                let (src, _) = if nondirs.is_empty() || self.r.pct(8) {
                    let dirs = self.paths_where(|k| k == Kind::Dir);
                    self.path_of(&dirs)?
                } else {
                    self.path_of(&nondirs)?
                };
                let (dir, d) = self.parent();
                Op::Link {
                    src,
                    name: self.some_name(d),
                    dir,
                }
            }
            26..=32 => {
                let (dir, name) = match self.r.below(20) {
                    0..=2 => split(&self.held_path()?.0),
                    3..=14 => split(&self.path_of(&self.paths_where(|k| k != Kind::Dir))?.0),
                    15..=16 => split(&self.path_of(&self.paths_where(|k| k == Kind::Dir))?.0),
                    _ => {
                        let (dir, _) = self.parent();
                        (dir, self.r.pick(&NAMES).to_string())
                    }
                };
                Op::Unlink { dir, name }
            }
            33..=37 => {
                let dirs = self.paths_where(|k| k == Kind::Dir);
                let empty: Vec<(String, Id)> = dirs
                    .iter()
                    .filter(|(_, id)| self.m.node(*id).children.is_empty())
                    .cloned()
                    .collect();
                let (dir, name) = match self.r.below(20) {
                    0..=8 if !empty.is_empty() => split(&self.path_of(&empty)?.0),
                    0..=13 => split(&self.path_of(&dirs)?.0),
                    14..=16 => split(&self.path_of(&self.paths_where(|k| k != Kind::Dir))?.0),
                    _ => {
                        let (dir, _) = self.parent();
                        (dir, self.r.pick(&NAMES).to_string())
                    }
                };
                Op::Rmdir { dir, name }
            }
            38..=52 => self.rename()?,
            53..=61 => {
                let (path, id) = self.file_or_any()?;
                let size = self.m.node(id).data.len() as u64;
                Op::Write {
                    path,
                    off: self.offset(size),
                    len: self.data_len(),
                    seed: self.r.next(),
                }
            }
            62 => {
                let files = self.paths_where(|k| k == Kind::File);
                Op::ReinodeWrite {
                    path: self.path_of(&files)?.0,
                    off: self.r.below(5000),
                    len: self.data_len(),
                    seed: self.r.next(),
                }
            }
            63..=66 => {
                let (path, id) = self.file_or_any()?;
                let size = self.m.node(id).data.len() as u64;
                Op::Truncate {
                    path,
                    size: self.size(size),
                }
            }
            67..=69 => {
                let mut targets = self.dirs();
                targets.extend(self.paths_where(|k| k == Kind::File || k == Kind::Fifo));
                Op::Chmod {
                    path: self.path_of(&targets)?.0,
                    mode: *self.r.pick(&CHMODS),
                }
            }
            70 => {
                let mut targets = self.dirs();
                targets.extend(self.paths_where(|k| k != Kind::Dir));
                let owners = [None, Some(0), Some(1000), Some(4242)];
                Op::Chown {
                    path: self.path_of(&targets)?.0,
                    uid: *self.r.pick(&owners),
                    gid: *self.r.pick(&owners),
                }
            }
            71..=75 => {
                let flags = match self.r.below(20) {
                    0..=13 => 0,
                    14..=16 => libc::XATTR_CREATE,
                    _ => libc::XATTR_REPLACE,
                };
                // XATTR_CREATE mostly on a name that exists (EEXIST), XATTR_REPLACE on one that
                // may not (ENODATA).
                let (path, id) = self.xattr_target(flags == libc::XATTR_CREATE)?;
                let len = if self.r.pct(10) {
                    3000
                } else {
                    self.r.below(40) as usize
                };
                let have: Vec<&String> = self.m.node(id).xattrs.keys().collect();
                let name = if flags == libc::XATTR_CREATE && !have.is_empty() && self.r.pct(60) {
                    self.r.pick(&have).to_string()
                } else {
                    self.r.pick(&XATTRS).to_string()
                };
                Op::SetXattr {
                    path,
                    name,
                    len,
                    seed: self.r.next(),
                    flags,
                }
            }
            76..=77 => {
                let (path, id) = self.xattr_target(true)?;
                let have: Vec<&String> = self.m.node(id).xattrs.keys().collect();
                let name = if !have.is_empty() && self.r.pct(60) {
                    self.r.pick(&have).to_string()
                } else {
                    self.r.pick(&XATTRS).to_string()
                };
                Op::RemoveXattr { path, name }
            }
            78..=79 => {
                let (path, _) = self.file_or_any()?;
                Op::OpenTrunc {
                    path,
                    rdwr: self.r.pct(50),
                }
            }
            80..=84 if held >= 4 => Op::Close {
                k: self.r.below(held as u64) as usize,
            },
            80..=84 => {
                let files = self.paths_where(|k| k == Kind::File);
                Op::Hold {
                    path: self.path_of(&files)?.0,
                    write: self.r.pct(60),
                }
            }
            85..=96 if held > 0 => {
                let k = self.r.below(held as u64) as usize;
                match self.r.below(20) {
                    0..=6 => Op::HeldWrite {
                        k,
                        off: self.r.below(100_000),
                        len: self.data_len(),
                        seed: self.r.next(),
                    },
                    7..=9 => Op::HeldTruncate {
                        k,
                        size: self.size(4096),
                    },
                    10..=11 => Op::HeldChmod {
                        k,
                        mode: *self.r.pick(&CHMODS),
                    },
                    14 if held < 6 => Op::HeldReopen { k },
                    12..=13 => Op::HeldSetXattr {
                        k,
                        name: self.r.pick(&XATTRS).to_string(),
                        len: self.r.below(20) as usize,
                        seed: self.r.next(),
                    },
                    _ => Op::Close { k },
                }
            }
            85..=96 => return None,
            _ => Op::Reload {
                clean: self.r.pct(50),
            },
        })
    }

    /// A file or directory; with `having`, mostly one that has xattrs already.
    pub fn xattr_target(&mut self, having: bool) -> Option<(String, Id)> {
        let mut targets = self.dirs();
        targets.extend(self.paths_where(|k| k == Kind::File));
        let with: Vec<(String, Id)> = targets
            .iter()
            .filter(|(_, id)| !self.m.node(*id).xattrs.is_empty())
            .cloned()
            .collect();
        if having && !with.is_empty() && self.r.pct(70) {
            return self.path_of(&with);
        }
        self.path_of(&targets)
    }

    pub fn rename(&mut self) -> Option<Op> {
        let dirs = self.paths_where(|k| k == Kind::Dir);
        let nondirs = self.paths_where(|k| k != Kind::Dir);
        let (dir, name, src) = match self.r.below(20) {
            0..=7 if !dirs.is_empty() => {
                let (p, id) = self.path_of(&dirs)?;
                let (d, n) = split(&p);
                (d, n, Some(id))
            }
            0..=17 => {
                let (p, id) = self.path_of(&nondirs)?;
                let (d, n) = split(&p);
                (d, n, Some(id))
            }
            _ => {
                // Maybe missing (ENOENT).
                let (d, _) = self.parent();
                (d, self.r.pick(&NAMES).to_string(), None)
            }
        };
        let (newdir, nd) = match src {
            // Into its own subtree (EINVAL).
            Some(s) if self.m.kind(s) == Kind::Dir && self.r.pct(20) => {
                let inside: Vec<(String, Id)> = self
                    .dirs()
                    .into_iter()
                    .filter(|(_, d)| self.m.is_within(*d, s))
                    .collect();
                self.path_of(&inside)?
            }
            _ if self.r.pct(30) => {
                let id = self.m.resolve(&dir).ok().and_then(|v| v.last().copied())?;
                (dir.clone(), id)
            }
            _ => self.parent(),
        };
        // Now and then over a file held open (which then lives on unlinked).
        let (newdir, newname) = match self.held_path() {
            Some((p, _)) if self.r.pct(10) => split(&p),
            _ => (newdir, self.some_name(nd)),
        };
        let flags = match self.r.below(100) {
            0..=59 => 0,
            60..=74 => libc::RENAME_NOREPLACE,
            75..=96 => libc::RENAME_EXCHANGE,
            _ => libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE,
        };
        Some(Op::Rename {
            dir,
            name,
            newdir,
            newname,
            flags,
        })
    }
}
