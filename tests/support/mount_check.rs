//! What the fault tests compare a mount with: a scan of the whole tree through the mount (kinds,
//! permission bits, link counts, inode numbers, bytes, symlink targets), one comparable line per
//! path for the scan and for the shared POSIX [`Model`] (hardlink groups named by their first
//! path), and the comparison itself, which also checks every inode number seen before and names the
//! first differing byte of differing content.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::model::{Kind, Model, ROOT, join};
use crate::common::CORE_OWNER;

pub fn describe_file(mode: u32, nlink: u64, content: &[u8], group: Option<&str>) -> String {
    let hash = blake3::hash(content).to_hex();
    let mut s = format!(
        "file {mode:04o} nlink={nlink} size={} blake3={}",
        content.len(),
        &hash[..16]
    );
    if let Some(g) = group {
        s.push_str(&format!(" hardlinked-with={g}"));
    }
    s
}

pub fn describe_dir(mode: u32, nlink: u64) -> String {
    format!("dir {mode:04o} nlink={nlink}")
}

/// One path as seen through a mount (or in a plain directory).
#[derive(Clone, Debug)]
pub struct Seen {
    /// 'f', 'd', 'l' or '?'.
    pub kind: char,
    pub mode: u32,
    pub nlink: u64,
    pub ino: u64,
    /// File content or symlink target.
    pub data: Vec<u8>,
}

/// Reads the whole tree under `root` without following symlinks. A top-level `.git` (the
/// workspace's own repository, once it has one) is not part of the model and is skipped.
pub fn scan(root: &Path) -> BTreeMap<String, Seen> {
    fn walk(root: &Path, rel: &str, out: &mut BTreeMap<String, Seen>) {
        let p = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let meta = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("stat {rel:?}: {e}"));
        let ft = meta.file_type();
        let mut nlink = meta.nlink();
        let (kind, data) = if ft.is_dir() {
            let mut names: Vec<String> = fs::read_dir(&p)
                .unwrap_or_else(|e| panic!("readdir {rel:?}: {e}"))
                .map(|e| {
                    e.unwrap_or_else(|e| panic!("readdir {rel:?}: {e}"))
                        .file_name()
                        .into_string()
                        .expect("UTF-8 name")
                })
                .collect();
            names.sort();
            for n in names {
                if rel.is_empty() && n == ".git" {
                    if fs::symlink_metadata(p.join(&n)).is_ok_and(|m| m.is_dir()) {
                        nlink -= 1;
                    }
                    continue;
                }
                walk(root, &join(rel, &n), out);
            }
            ('d', Vec::new())
        } else if ft.is_symlink() {
            let t = fs::read_link(&p).unwrap_or_else(|e| panic!("readlink {rel:?}: {e}"));
            ('l', t.into_os_string().into_vec())
        } else if ft.is_file() {
            (
                'f',
                fs::read(&p).unwrap_or_else(|e| panic!("read {rel:?}: {e}")),
            )
        } else {
            ('?', Vec::new())
        };
        out.insert(
            rel.to_string(),
            Seen {
                kind,
                mode: meta.mode() & 0o7777,
                nlink,
                ino: meta.ino(),
                data,
            },
        );
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

pub fn describe_scan(seen: &BTreeMap<String, Seen>) -> BTreeMap<String, String> {
    let mut by_ino: BTreeMap<u64, Vec<&String>> = BTreeMap::new();
    for (p, s) in seen {
        if s.kind == 'f' {
            by_ino.entry(s.ino).or_default().push(p);
        }
    }
    seen.iter()
        .map(|(p, s)| {
            let d = match s.kind {
                'f' => {
                    let g = &by_ino[&s.ino];
                    describe_file(
                        s.mode,
                        s.nlink,
                        &s.data,
                        (g.len() > 1).then(|| g[0].as_str()),
                    )
                }
                'd' => describe_dir(s.mode, s.nlink),
                'l' => format!("symlink -> {}", String::from_utf8_lossy(&s.data)),
                _ => format!("other {:04o}", s.mode),
            };
            (p.clone(), d)
        })
        .collect()
}

pub fn listing_diff(
    want: &BTreeMap<String, String>,
    got: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut diffs = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => diffs.push(format!("  missing {k:?}: want {v}")),
            Some(w) if w != v => {
                diffs.push(format!("  differs {k:?}: want {v}\n            got  {w}"))
            }
            _ => {}
        }
    }
    for (k, v) in got {
        if !want.contains_key(k) {
            diffs.push(format!("  extra   {k:?}: {v}"));
        }
    }
    diffs
}

/// Compares a model with what a scan saw: every line of [`Model::describe`], every known inode
/// number, and for differing file content the first differing byte.
pub fn check_against(m: &Model, seen: &BTreeMap<String, Seen>) -> Result<(), String> {
    let mut diffs = listing_diff(&m.describe(), &describe_scan(seen));
    for (p, ino) in m.known_inos() {
        if let Some(s) = seen.get(&p)
            && s.ino != ino
        {
            diffs.push(format!("  inode   {p:?}: was {ino:#x}, now {:#x}", s.ino));
        }
    }
    for p in m.files() {
        if let Some(s) = seen.get(&p)
            && s.kind == 'f'
        {
            let want = m.content(&p);
            if *want != s.data {
                let first = want
                    .iter()
                    .zip(&s.data)
                    .position(|(a, b)| a != b)
                    .unwrap_or(want.len().min(s.data.len()));
                diffs.push(format!(
                    "  content {p:?}: want {} bytes, got {}; first difference at byte {first}",
                    want.len(),
                    s.data.len()
                ));
            }
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n"))
    }
}

/// The model side of the comparison.
impl Model {
    /// The tree a scan saw (hardlinks, found by inode number, become one model inode); with
    /// `keep_inos`, the inode numbers it saw must stay.
    pub fn from_scan(seen: &BTreeMap<String, Seen>, keep_inos: bool) -> Model {
        let root = seen.get("").expect("a scan holds its root");
        let mut m = Model::with_root(root.mode, CORE_OWNER);
        let mut by_ino: BTreeMap<u64, u64> = BTreeMap::new();
        if keep_inos {
            m.inos.insert(ROOT, root.ino);
        }
        // Sorted paths: a directory comes before everything in it.
        for (p, s) in seen.iter().filter(|(p, _)| !p.is_empty()) {
            let (dir, name) = m.entry_of(p);
            let id = match (s.kind, by_ino.get(&s.ino)) {
                ('f', Some(&id)) => {
                    m.link(id, dir, &name)
                        .unwrap_or_else(|e| panic!("model: hardlink {p:?}: {e:?}"));
                    continue;
                }
                ('f', None) => {
                    let node = Model::new_node(Kind::File, s.mode, CORE_OWNER, s.data.clone());
                    let id = m.add(dir, &name, node);
                    by_ino.insert(s.ino, id);
                    id
                }
                ('d', _) => m.add(
                    dir,
                    &name,
                    Model::new_node(Kind::Dir, s.mode, CORE_OWNER, Vec::new()),
                ),
                ('l', _) => m.add(
                    dir,
                    &name,
                    Model::new_node(Kind::Symlink, 0o777, CORE_OWNER, s.data.clone()),
                ),
                (k, _) => panic!("unexpected file type {k:?} at {p:?}"),
            };
            if keep_inos {
                m.inos.insert(id, s.ino);
            }
        }
        m
    }

    /// One comparable line per path, the root (`""`) included (inode numbers are checked
    /// separately).
    pub fn describe(&self) -> BTreeMap<String, String> {
        let mut all = vec![(String::new(), ROOT)];
        all.extend(self.entries());
        let mut names: BTreeMap<u64, Vec<&String>> = BTreeMap::new();
        for (p, id) in &all {
            if self.kind(*id) == Kind::File {
                names.entry(*id).or_default().push(p);
            }
        }
        let mut out = BTreeMap::new();
        for (p, id) in &all {
            let n = self.node(*id);
            let d = match n.kind {
                Kind::File => {
                    let g = &names[id];
                    describe_file(
                        n.mode,
                        self.nlink(*id) as u64,
                        &n.data,
                        (g.len() > 1).then(|| g[0].as_str()),
                    )
                }
                Kind::Dir => describe_dir(n.mode, self.nlink(*id) as u64),
                Kind::Symlink => format!("symlink -> {}", String::from_utf8_lossy(&n.data)),
                Kind::Fifo => format!("other {:04o}", n.mode),
            };
            out.insert(p.clone(), d);
        }
        out
    }
}
