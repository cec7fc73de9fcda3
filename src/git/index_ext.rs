//! Index extensions git reads but gix does not write: a split index's small part (`link`), the
//! untracked cache (`UNTR`), the fsmonitor token (`FSMN`) and the cache tree (`TREE`), in git's
//! on-disk formats
//! (`Documentation/gitformat-index.txt`; `dir.c` `write_untracked_extension`; `ewah/`).
//!
//! Pure encoding: knows nothing of workspaces, mounts or presentation. The caller decides what the
//! cache claims; a wrong claim makes git show a wrong `git status`, so it must only describe a
//! directory tree whose every directory is tracked and holds no untracked file.

/// The flags `git status` (untracked files "normal") runs its directory walk with
/// (`DIR_SHOW_OTHER_DIRECTORIES | DIR_HIDE_EMPTY_DIRECTORIES`): an untracked cache written with
/// other flags is dropped by `git status`.
pub const STATUS_DIR_FLAGS: u32 = (1 << 1) | (1 << 2);

/// The id of the empty blob: what git records for an empty `.git/info/exclude`.
pub const EMPTY_BLOB: [u8; 20] = [
    0xe6, 0x9d, 0xe2, 0x9b, 0xb2, 0xd1, 0xd6, 0x43, 0x4b, 0x8b, 0x29, 0xae, 0x77, 0x5a, 0xd8, 0xc2,
    0xe4, 0x8c, 0x53, 0x91,
];

/// git's variable-length integer (`varint.c`: big-endian 7-bit groups, each continuation group
/// offset by one).
pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    let mut buf = [0u8; 16];
    let mut pos = buf.len() - 1;
    buf[pos] = (value & 127) as u8;
    loop {
        value >>= 7;
        if value == 0 {
            break;
        }
        value -= 1;
        pos -= 1;
        buf[pos] = 128 | (value & 127) as u8;
    }
    out.extend_from_slice(&buf[pos..]);
}

/// An EWAH bitmap of `bits` (ascending positions), serialized as git does (`ewah_serialize_to`:
/// bit size, word count, the words, the position of the last run-length word). Encoded as one
/// run-length word of no run followed by every word as a literal: valid EWAH, uncompressed.
pub fn put_ewah(out: &mut Vec<u8>, bits: &[usize]) {
    let bit_size = bits.last().map_or(0, |b| b + 1);
    let literals = bit_size.div_ceil(64);
    let mut words = vec![0u64; literals];
    for &b in bits {
        words[b / 64] |= 1 << (b % 64);
    }
    out.extend_from_slice(&(bit_size as u32).to_be_bytes());
    out.extend_from_slice(&((literals + 1) as u32).to_be_bytes());
    // Running bit 0, run length 0 (bits 1..=32), literal count in bits 33..=63.
    out.extend_from_slice(&((literals as u64) << 33).to_be_bytes());
    for w in words {
        out.extend_from_slice(&w.to_be_bytes());
    }
    out.extend_from_slice(&0u32.to_be_bytes());
}

/// The stat data git keeps for a path (ctime, mtime, dev, ino, uid, gid, size; 32 bits each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatData {
    pub ctime: (u32, u32),
    pub mtime: (u32, u32),
    pub dev: u32,
    pub ino: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u32,
}

impl StatData {
    fn put(&self, out: &mut Vec<u8>) {
        for v in [
            self.ctime.0,
            self.ctime.1,
            self.mtime.0,
            self.mtime.1,
            self.dev,
            self.ino,
            self.uid,
            self.gid,
            self.size,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// One directory of an untracked cache: known to hold no untracked file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedDir {
    /// Its name in its parent (empty for the root).
    pub name: Vec<u8>,
    /// Its stat data, as `lstat` through the work tree shows it.
    pub stat: StatData,
    /// The blob id of its `.gitignore`, if it has one.
    pub gitignore: Option<[u8; 20]>,
    /// Its subdirectories, in the order git keeps them.
    pub dirs: Vec<CachedDir>,
}

impl CachedDir {
    pub fn new(name: Vec<u8>, stat: StatData) -> Self {
        CachedDir {
            name,
            stat,
            gitignore: None,
            dirs: Vec::new(),
        }
    }

    /// The subdirectory `name`, added where git's `lookup_untracked` would insert it (its binary
    /// search compares a name with each entry's prefix of the same length), so that git finds each
    /// one as if it had built the cache itself from a listing in this order. `stat` is asked only
    /// when the directory is new.
    pub fn child(&mut self, name: &[u8], stat: impl FnOnce() -> StatData) -> &mut CachedDir {
        let (mut first, mut last) = (0, self.dirs.len());
        while last > first {
            let next = first + ((last - first) >> 1);
            let d = &self.dirs[next].name;
            let prefix = &d[..d.len().min(name.len())];
            let cmp = strncmp(name, prefix, name.len());
            if cmp == std::cmp::Ordering::Equal && d.len() == name.len() {
                return &mut self.dirs[next];
            }
            if cmp == std::cmp::Ordering::Less {
                last = next;
            } else {
                first = next + 1;
            }
        }
        self.dirs
            .insert(first, CachedDir::new(name.to_vec(), stat()));
        &mut self.dirs[first]
    }
}

/// C's `strncmp(a, b, n)` where `b` may be shorter than `n` (it then ends with a NUL).
fn strncmp(a: &[u8], b: &[u8], n: usize) -> std::cmp::Ordering {
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        if x != y {
            return x.cmp(&y);
        }
        if x == 0 {
            break;
        }
    }
    std::cmp::Ordering::Equal
}

/// The part of an `UNTR` extension after its ident: the same for every work tree of one tree
/// (global excludes absent, `.git/info/exclude` empty, `dir_flags` of `git status`), every
/// directory valid with no untracked file.
pub fn untracked_tail(root: &CachedDir) -> Vec<u8> {
    let mut out = Vec::new();
    // info/exclude's and the excludes file's stat data (git compares only their ids), dir flags.
    StatData::default().put(&mut out);
    StatData::default().put(&mut out);
    out.extend_from_slice(&STATUS_DIR_FLAGS.to_be_bytes());
    out.extend_from_slice(&EMPTY_BLOB);
    out.extend_from_slice(&[0u8; 20]);
    out.extend_from_slice(b".gitignore\0");

    let mut blocks = Vec::new();
    let mut stats = Vec::new();
    let mut ids = Vec::new();
    let mut with_ids = Vec::new();
    let mut n = 0usize;
    fn walk(
        d: &CachedDir,
        n: &mut usize,
        blocks: &mut Vec<u8>,
        stats: &mut Vec<u8>,
        ids: &mut Vec<u8>,
        with_ids: &mut Vec<usize>,
    ) {
        let i = *n;
        *n += 1;
        d.stat.put(stats);
        if let Some(id) = &d.gitignore {
            with_ids.push(i);
            ids.extend_from_slice(id);
        }
        put_varint(blocks, 0);
        put_varint(blocks, d.dirs.len() as u64);
        blocks.extend_from_slice(&d.name);
        blocks.push(0);
        for c in &d.dirs {
            walk(c, n, blocks, stats, ids, with_ids);
        }
    }
    walk(
        root,
        &mut n,
        &mut blocks,
        &mut stats,
        &mut ids,
        &mut with_ids,
    );
    put_varint(&mut out, n as u64);
    out.extend_from_slice(&blocks);
    let all: Vec<usize> = (0..n).collect();
    put_ewah(&mut out, &all); // valid
    put_ewah(&mut out, &[]); // check_only
    put_ewah(&mut out, &with_ids); // exclude ids present
    out.extend_from_slice(&stats);
    out.extend_from_slice(&ids);
    out.push(0);
    out
}

/// The ident git requires of an untracked cache it uses (`dir.c` `get_ident_string`, with the NUL
/// git keeps): the work tree's real path and the system name.
pub fn untracked_ident(worktree: &std::path::Path, sysname: &str) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut s = b"Location ".to_vec();
    s.extend_from_slice(worktree.as_os_str().as_bytes());
    s.extend_from_slice(b", system ");
    s.extend_from_slice(sysname.as_bytes());
    s.push(0);
    s
}

/// The `FSMN` payload (version 2): `token`, then an empty bitmap (no entry known to be dirty).
pub fn fsmonitor_payload(token: &str) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&2u32.to_be_bytes());
    p.extend_from_slice(token.as_bytes());
    p.push(0);
    let mut bitmap = Vec::new();
    put_ewah(&mut bitmap, &[]);
    p.extend_from_slice(&(bitmap.len() as u32).to_be_bytes());
    p.extend_from_slice(&bitmap);
    p
}

/// The `TREE` extension (git's cache tree, `cache-tree.c` `write_one`) of an index that holds
/// exactly the entries of tree `root`: per tree, its name (empty for the root), the index entries
/// under it and its subtree count, then its id; subtrees follow their parent, in git's order
/// (shorter names first, then bytewise). `read` gives a tree's entries as (name, is a tree, id);
/// a gitlink is an entry, not a subtree. With it, `git status` compares HEAD with the index by tree
/// id instead of reading every tree of HEAD.
pub fn cache_tree<E>(
    root: gix::ObjectId,
    read: &mut impl FnMut(gix::ObjectId) -> Result<Vec<(Vec<u8>, bool, gix::ObjectId)>, E>,
) -> Result<Vec<u8>, E> {
    let mut out = Vec::new();
    cache_tree_node(root, b"", read, &mut out)?;
    Ok(out)
}

/// Appends the node of tree `id` named `name` and its subtrees; returns its entry count.
fn cache_tree_node<E>(
    id: gix::ObjectId,
    name: &[u8],
    read: &mut impl FnMut(gix::ObjectId) -> Result<Vec<(Vec<u8>, bool, gix::ObjectId)>, E>,
    out: &mut Vec<u8>,
) -> Result<u64, E> {
    let entries = read(id)?;
    let mut count = 0u64;
    let mut subs = Vec::new();
    for (n, is_tree, sub) in entries {
        if is_tree {
            subs.push((n, sub));
        } else {
            count += 1;
        }
    }
    subs.sort_by(|a, b| a.0.len().cmp(&b.0.len()).then_with(|| a.0.cmp(&b.0)));
    let mut below = Vec::new();
    for (n, sub) in &subs {
        count += cache_tree_node(*sub, n, read, &mut below)?;
    }
    out.extend_from_slice(name);
    out.push(0);
    out.extend_from_slice(format!("{count} {}\n", subs.len()).as_bytes());
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&below);
    Ok(count)
}

fn put_extension(out: &mut Vec<u8>, sig: &[u8; 4], payload: &[u8]) {
    out.extend_from_slice(sig);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends git's trailing SHA-1 of everything before it (a file checksum: [`super::checksum`]).
pub fn seal(mut index: Vec<u8>) -> Result<Vec<u8>, gix::Error> {
    let digest = super::checksum::sha1(&index);
    index.extend_from_slice(digest.as_slice());
    Ok(index)
}

/// The small part of a split index has no entries of its own (all are the shared index's, named
/// by the shared file's trailing hash), then extensions (signature, payload), sealed.
///
/// Its start that is the same for every fork of one shared index:
/// the header, the `link` to the shared index and the extensions every fork carries unchanged
/// (e.g. the cache tree), with the checksum already run over them. [`SplitIndexHead::finish`]
/// then adds one fork's own extensions: each fork checksums and copies only what is its own.
#[derive(Clone)]
pub struct SplitIndexHead {
    bytes: Vec<u8>,
    sum: super::checksum::Sha1,
}

impl SplitIndexHead {
    /// The head of the small index of the shared index whose trailing hash is `shared`, with
    /// `extensions` (signature, payload) first.
    pub fn new(shared: &[u8; 20], extensions: &[(&[u8; 4], &[u8])]) -> Self {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"DIRC");
        bytes.extend_from_slice(&2u32.to_be_bytes());
        bytes.extend_from_slice(&0u32.to_be_bytes());
        // The shared index's hash, then the entries it deletes and replaces (none). git reads
        // both bitmaps unconditionally once the extension is longer than the hash.
        let mut link = shared.to_vec();
        put_ewah(&mut link, &[]);
        put_ewah(&mut link, &[]);
        put_extension(&mut bytes, b"link", &link);
        for (sig, payload) in extensions {
            put_extension(&mut bytes, sig, payload);
        }
        let mut sum = super::checksum::Sha1::new();
        sum.update(&bytes);
        SplitIndexHead { bytes, sum }
    }

    /// The whole small index: the head, then `extensions` (signature, payload given as the
    /// pieces it is the concatenation of), sealed. One allocation of the final size.
    pub fn finish(&self, extensions: &[(&[u8; 4], &[&[u8]])]) -> Vec<u8> {
        let more: usize = extensions
            .iter()
            .map(|(_, parts)| 8 + parts.iter().map(|p| p.len()).sum::<usize>())
            .sum();
        let mut out = Vec::with_capacity(self.bytes.len() + more + 20);
        out.extend_from_slice(&self.bytes);
        for (sig, parts) in extensions {
            out.extend_from_slice(*sig);
            let len: usize = parts.iter().map(|p| p.len()).sum();
            out.extend_from_slice(&(len as u32).to_be_bytes());
            for p in *parts {
                out.extend_from_slice(p);
            }
        }
        let mut sum = self.sum.clone();
        sum.update(&out[self.bytes.len()..]);
        out.extend_from_slice(sum.finish().as_slice());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_gits() {
        // Values and encodings from git's varint.c: each continuation group is offset by one.
        for (v, want) in [
            (0u64, vec![0u8]),
            (127, vec![127]),
            (128, vec![0x80, 0x00]),
            (255, vec![0x80, 0x7f]),
            (16511, vec![0xff, 0x7f]),
            (16512, vec![0x80, 0x80, 0x00]),
        ] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out, want, "{v}");
        }
    }

    #[test]
    fn an_empty_bitmap_is_the_one_git_writes() {
        let mut out = Vec::new();
        put_ewah(&mut out, &[]);
        // bit size 0, one word (a run-length word of nothing), rlw at 0.
        let mut want = Vec::new();
        want.extend_from_slice(&0u32.to_be_bytes());
        want.extend_from_slice(&1u32.to_be_bytes());
        want.extend_from_slice(&0u64.to_be_bytes());
        want.extend_from_slice(&0u32.to_be_bytes());
        assert_eq!(out, want);
        let mut out = Vec::new();
        put_ewah(&mut out, &[0, 64, 65]);
        assert_eq!(&out[..8], &[0, 0, 0, 66, 0, 0, 0, 3]);
        assert_eq!(u64::from_be_bytes(out[8..16].try_into().unwrap()), 2 << 33);
        assert_eq!(u64::from_be_bytes(out[16..24].try_into().unwrap()), 1);
        assert_eq!(u64::from_be_bytes(out[24..32].try_into().unwrap()), 3);
    }

    /// Catches a small index built from a kept head that differs from the same file built in one
    /// go (header, link, every extension, then gix's SHA-1 of it all): bytes lost, doubled or
    /// reordered between the head and a fork's own extensions, a wrong extension length for a
    /// payload given in pieces, or a checksum that does not cover the whole file.
    #[test]
    fn a_kept_head_gives_the_whole_files_bytes() {
        let shared = [0xab; 20];
        let tree: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
        let tail: Vec<u8> = (0..100_001u32).map(|i| (i * 13) as u8).collect();
        let ident = b"/root/t1\0Linux\0";
        let fsmn = fsmonitor_payload("octofs:0");
        let mut untr = Vec::new();
        put_varint(&mut untr, ident.len() as u64);
        untr.extend_from_slice(ident);
        untr.extend_from_slice(&tail);
        // The whole file in one go.
        let mut want = Vec::new();
        want.extend_from_slice(b"DIRC");
        want.extend_from_slice(&2u32.to_be_bytes());
        want.extend_from_slice(&0u32.to_be_bytes());
        let mut link = shared.to_vec();
        put_ewah(&mut link, &[]);
        put_ewah(&mut link, &[]);
        put_extension(&mut want, b"link", &link);
        put_extension(&mut want, b"TREE", &tree);
        put_extension(&mut want, b"UNTR", &untr);
        put_extension(&mut want, b"FSMN", &fsmn);
        let mut h = gix::hash::hasher(gix::hash::Kind::Sha1);
        h.update(&want);
        want.extend_from_slice(h.try_finalize().unwrap().as_slice());

        let head = SplitIndexHead::new(&shared, &[(b"TREE", &tree)]);
        let mut len = Vec::new();
        put_varint(&mut len, ident.len() as u64);
        let untr_parts: [&[u8]; 3] = [&len, ident, &tail];
        let fsmn_parts: [&[u8]; 1] = [&fsmn];
        let got = head.finish(&[(b"UNTR", &untr_parts), (b"FSMN", &fsmn_parts)]);
        assert_eq!(got.len(), want.len());
        assert!(
            got == want,
            "the small index differs from the one built in one go"
        );
        // The head is reusable: a second fork's file from the same head is the same again.
        assert!(head.finish(&[(b"UNTR", &untr_parts), (b"FSMN", &fsmn_parts)]) == want);
    }

    #[test]
    fn children_go_where_git_inserts_them() {
        let mut root = CachedDir::new(Vec::new(), StatData::default());
        for n in [&b"b"[..], b"a-b", b"a", b"c"] {
            root.child(n, StatData::default);
        }
        root.child(b"a", || unreachable!("found, not made again"));
        let names: Vec<&[u8]> = root.dirs.iter().map(|d| &d.name[..]).collect();
        // "a" inserted after "a-b" (its prefix compares equal, so the search moves right), and
        // found again rather than inserted twice.
        assert_eq!(names, vec![&b"a-b"[..], b"a", b"b", b"c"]);
    }
}
