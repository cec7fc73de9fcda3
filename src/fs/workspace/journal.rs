//! The fsmonitor journal: paths changed through the mount, in order, and git's fsmonitor query answered
//! from it (or, for the shared index's [`BASE_TOKEN`], from the catalog). In memory only; reads and
//! writes nothing on disk.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cow::catalog::Kind;

use super::{ROOT_INO, State, WorkspaceFs, convert::join};

/// Paths changed through the mount, in order, for git's file-system monitor: a token names a
/// position; a query answers every path changed after it. Kept in memory: a token from another
/// daemon run (other epoch) or older than what is retained answers "everything", which is always safe.
pub(super) struct Journal {
    pub(super) epoch: u64,
    pub(super) seq: u64,
    /// The sequence number just before the oldest retained entry.
    pub(super) floor: u64,
    /// (sequence, path); an empty path means "everything".
    pub(super) entries: VecDeque<(u64, Vec<u8>)>,
}

const JOURNAL_MAX: usize = 1 << 16;

/// The fsmonitor token that names "the state of the fork's base": the shared index of a new
/// workspace carries it, so the first `git status` asks what changed since the fork instead of
/// examining every file. Answered from the catalog (what differs from the base), not the journal.
pub const BASE_TOKEN: &str = "octofs:base";

/// One journal entry for a watcher: the token naming the state just after it, and the path.
pub type Watched = (String, Vec<u8>);

/// What changed since an fsmonitor token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Everything,
    Paths(Vec<Vec<u8>>),
}

impl Journal {
    pub(super) fn new() -> Journal {
        let epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id());
        Journal {
            epoch,
            seq: 0,
            floor: 0,
            entries: VecDeque::new(),
        }
    }

    pub(super) fn note(&mut self, path: Vec<u8>) {
        // git ignores what happens inside its own directory.
        if path == b".git" || path.starts_with(b".git/") {
            return;
        }
        self.seq += 1;
        self.entries.push_back((self.seq, path));
        if self.entries.len() > JOURNAL_MAX
            && let Some((s, _)) = self.entries.pop_front()
        {
            self.floor = s;
        }
    }

    pub(super) fn token(&self) -> String {
        format!("octofs:{}:{}", self.epoch, self.seq)
    }

    /// Entries after `token`, or `None` when the token cannot be trusted.
    pub(super) fn since(&self, token: &str) -> Option<Vec<Vec<u8>>> {
        let mut parts = token.trim().split(':');
        if parts.next() != Some("octofs") {
            return None;
        }
        let epoch: u64 = parts.next()?.parse().ok()?;
        let seq: u64 = parts.next()?.parse().ok()?;
        if epoch != self.epoch || seq < self.floor || seq > self.seq {
            return None;
        }
        let mut out = Vec::new();
        for (s, p) in &self.entries {
            if *s > seq {
                if p.is_empty() {
                    return None;
                }
                out.push(p.clone());
            }
        }
        Some(out)
    }
}

impl WorkspaceFs {
    /// unique (a file with several links) or not known.
    pub(super) fn path_of(st: &State, ino: u64) -> Option<Vec<u8>> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ROOT_INO {
                parts.reverse();
                return Some(parts.join(&b'/'));
            }
            let n = st.live.inodes.get(&cur)?;
            if n.rec.kind != Kind::Dir && n.rec.nlink > 1 {
                return None;
            }
            parts.push(&n.rec.name);
            cur = n.rec.parent;
        }
        None
    }

    pub(super) fn journal_ino(&self, st: &mut State, ino: u64) {
        // Content changes without a catalog record (a write through an open file): the snapshot
        // tracker counts the inode now, and while it stays open for writing.
        st.track.open.ino(ino);
        if st.live.inodes.get(&ino).is_some_and(|n| n.writers > 0) {
            st.track.writing.insert(ino);
        } else {
            st.track.writing.remove(&ino);
        }
        let path = Self::path_of(st, ino).map(|mut p| {
            if st
                .live
                .inodes
                .get(&ino)
                .is_some_and(|n| n.rec.kind == Kind::Dir)
                && !p.is_empty()
            {
                p.push(b'/');
            }
            p
        });
        if let Some(p) = path {
            st.journal.note(p);
            return;
        }
        // A file with several links (git links each new object from its `tmp_obj_*` name before it
        // unlinks that name, and the kernel's RELEASE of the handle that wrote it may come in
        // between): each of its names, or "unknown" (an empty entry: everything) when fewer are
        // found.
        let names = st
            .live
            .inodes
            .get(&ino)
            .filter(|n| n.rec.kind != Kind::Dir && n.rec.nlink > 1)
            .and_then(|n| Self::link_paths(st, ino, n.rec.nlink));
        match names {
            Some(names) => {
                for p in names {
                    st.journal.note(p);
                }
            }
            None => st.journal.note(Vec::new()),
        }
    }

    pub(super) fn journal_name(&self, st: &mut State, dir: u64, name: &[u8], is_dir: bool) {
        let path = Self::path_of(st, dir).map(|p| {
            let mut p = join(&p, name);
            if is_dir {
                p.push(b'/');
            }
            p
        });
        st.journal.note(path.unwrap_or_default());
    }

    /// `octofs watch`: every journal entry after `token`, each with the token that names the state
    /// just after it, and the new token. An empty `token` starts at the present (no entries);
    /// `None` for the entries when `token` cannot be trusted (another daemon run, or older than what
    /// is retained, or a change whose path could not be told): the watcher must rescan. Unlike the
    /// fsmonitor query, files open for writing are not added: a watcher sees a write when it is
    /// closed.
    pub fn watch_query(&self, token: &str) -> (String, Option<Vec<Watched>>) {
        let st = self.lock();
        let j = &st.journal;
        let new = j.token();
        if token.is_empty() {
            return (new, Some(Vec::new()));
        }
        if j.since(token).is_none() {
            return (new, None);
        }
        let from: u64 = token
            .rsplit(':')
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(u64::MAX);
        let entries = j
            .entries
            .iter()
            .filter(|(s, _)| *s > from)
            .map(|(s, p)| (format!("octofs:{}:{s}", j.epoch), p.clone()))
            .collect();
        (new, Some(entries))
    }

    /// git's fsmonitor query: the new token and what changed since `token` (paths relative to the
    /// workspace root; directories end in `/`), including files open for writing right now.
    pub fn fsmonitor_query(&self, token: &str) -> (String, Changed) {
        if token == BASE_TOKEN {
            // The state the shared index describes: what differs from the base is in the catalog.
            let new = self.lock().journal.token();
            return match self.changes() {
                Ok(changes) => {
                    let st = self.lock();
                    let paths: Vec<Vec<u8>> = changes
                        .into_iter()
                        .map(|c| {
                            let mut p = c.path.into_bytes();
                            if c.dir {
                                p.push(b'/');
                            }
                            p
                        })
                        .collect();
                    (new, Self::with_open_writers(&st, paths))
                }
                Err(_) => (new, Changed::Everything),
            };
        }
        let st = self.lock();
        let new = st.journal.token();
        let Some(paths) = st.journal.since(token) else {
            return (new, Changed::Everything);
        };
        (new, Self::with_open_writers(&st, paths))
    }

    /// `paths` plus every name of every file open for writing right now (its content may change
    /// without a journal entry until it is closed), sorted and without repeats; everything when
    /// the names of such a file cannot be told.
    ///
    /// A file unlinked while open has no name git could look at and adds nothing. A file with
    /// several links (git links each new object from its `tmp_obj_*` name before it unlinks that
    /// name, and the kernel's RELEASE of the handle that wrote it may come after both) adds each
    /// of its names.
    fn with_open_writers(st: &State, mut paths: Vec<Vec<u8>>) -> Changed {
        for n in st.live.inodes.values().filter(|n| n.writers > 0) {
            let rec = &n.rec;
            let known = match (rec.kind, rec.nlink) {
                (Kind::Dir, _) | (_, 1) => Self::path_of(st, rec.ino).map(|p| vec![p]),
                (_, 0) => Some(Vec::new()),
                _ => Self::link_paths(st, rec.ino, rec.nlink),
            };
            match known {
                Some(names) => paths.extend(names),
                None => return Changed::Everything,
            }
        }
        for p in &mut paths {
            git_visible(p);
        }
        paths.sort();
        paths.dedup();
        Changed::Paths(paths)
    }

    /// Every name of a file with `nlink` links, or `None` when fewer are found. Only the upper
    /// layer makes links, so each name is an entry of a changed directory, or the primary name
    /// the record keeps. Scans the changed directories: for open writers with several links only.
    fn link_paths(st: &State, ino: u64, nlink: u32) -> Option<Vec<Vec<u8>>> {
        let rec = &st.live.inodes.get(&ino)?.rec;
        let mut names: Vec<(u64, &[u8])> = vec![(rec.parent, rec.name.as_slice())];
        for (dir, entries) in &st.live.dirs {
            for (name, entry) in entries {
                if *entry == Some(ino) {
                    names.push((*dir, name.as_slice()));
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        if names.len() < nlink as usize {
            return None;
        }
        names
            .into_iter()
            .map(|(dir, name)| Some(join(&Self::path_of(st, dir)?, name)))
            .collect()
    }
}

/// git drops a change its fsmonitor reports at a path holding a name it refuses in a tree
/// (`.GIT`, `src/.Git/x`, a nested `vend/.git/x`: `verify_path` fails), and its untracked cache then
/// keeps trusting the directory above that name. Such a path becomes a sibling name git accepts
/// in the same directory (the refused name with `~octofs` appended, which need not exist), so that
/// git looks at that directory again. The workspace's own `.git/…` is left as it is.
fn git_visible(p: &mut Vec<u8>) {
    let mut start = 0;
    for (i, c) in p.split(|b| *b == b'/').enumerate() {
        let end = start + c.len();
        let own_git = i == 0 && c == b".git";
        if !own_git && !c.is_empty() && crate::git::kept::refused_name(c, false) {
            p.truncate(end);
            p.extend_from_slice(b"~octofs");
            return;
        }
        start = end + 1;
    }
}

#[cfg(test)]
mod git_visible_tests {
    #[test]
    fn a_path_at_a_refused_name_names_a_sibling_git_accepts() {
        let seen = |p: &[u8]| {
            let mut v = p.to_vec();
            super::git_visible(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        };
        assert_eq!(seen(b"src/.Git/HEAD"), "src/.Git~octofs");
        assert_eq!(seen(b".GIT/"), ".GIT~octofs");
        assert_eq!(seen(b"vend/.git/index"), "vend/.git~octofs");
        assert_eq!(seen(b".git/index"), ".git/index");
        assert_eq!(seen(b"src/lib.rs"), "src/lib.rs");
        assert_eq!(seen(b"dir/"), "dir/");
    }
}
