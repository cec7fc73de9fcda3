//! What a snapshot's POSIX record holds, and putting it back on resume (policy; the format and its
//! place in the mirror are `git::posix_record`, reading and applying metadata is the core's).
//!
//! A snapshot's tree is what `git add -A` makes; git keeps of a file only its bytes and one exec
//! bit. The record holds, relative to what the tree restores, every path whose state git drops:
//! - files, directories and symlinks of the tree whose permission bits differ from what git
//!   restores (0644/0755 files, 0755 directories; setuid, setgid and sticky included), whose owner
//!   is not the workspace's owner, or that carry extended attributes;
//! - the second and later names of a hard-linked file (git stores copies);
//! - fifos, sockets and devices, empty directories, and directories the tree does not have whose
//!   permission bits, owner or extended attributes are not a plain directory's (0755, the
//!   owner's, none: what holds only names git refuses or ignored files), with every directory
//!   above them that the tree does not have (git keeps none of these). They are kept whatever
//!   the ignore rules say: the ignore rules choose among the files git would add, and git adds
//!   none of these.
//!
//! Nothing under a `.git` directory or a submodule (the tree holds the submodule's commit) is
//! recorded. Regular files the ignore rules leave out of the tree stay out of the record too.
//! Ordering and format: `docs/posix-record.md`.
//!
//! A record is data (docs/security.md, privilege separation): it may come from a remote (`pull`, a share
//! remote) or be forged, so applying it sets only what the thread's owner could set by themselves
//! ([`admit`], the kernel's rules for an unprivileged user); what is left out is named to the
//! caller ([`left_out_warnings`]), never dropped silently.

use std::collections::HashMap;

use gix::ObjectId;
use gix::objs::tree::EntryKind;

use super::error::{Context, Error, on_workspace};
use crate::access::Caller;
use crate::fs::{NodeMeta, WorkspaceFs};
use crate::git::posix_record::{self, PosixEntry, PosixKind, PosixRecord};
use crate::git::snapshot as snap;
use crate::workspace::Owner;

/// What the tree has at `path`, if anything.
fn tree_kind(
    repo: &gix::Repository,
    tree: ObjectId,
    path: &[u8],
) -> Result<Option<EntryKind>, Error> {
    let t = repo
        .find_tree(tree)
        .context(|| format!("cannot read the snapshot tree {tree}"))?;
    let found = t.lookup_entry(path.split(|b| *b == b'/')).context(|| {
        format!(
            "cannot look up {} in the snapshot tree",
            String::from_utf8_lossy(path)
        )
    })?;
    Ok(found.map(|e| e.mode().kind()))
}

fn entry_of(m: &NodeMeta) -> PosixEntry {
    PosixEntry {
        path: m.path.clone(),
        kind: m.kind,
        mode: m.mode,
        uid: m.uid,
        gid: m.gid,
        rdev: if matches!(m.kind, PosixKind::Char | PosixKind::Block) {
            m.rdev
        } else {
            0
        },
        xattrs: m.xattrs.clone(),
        link: None,
    }
}

fn under(p: &[u8], d: &[u8]) -> bool {
    p.starts_with(d) && p.get(d.len()) == Some(&b'/')
}

/// What the tree has at `path`, looked up once per path, and not at all below a path the tree
/// does not hold as a directory (an ignored subtree costs one lookup).
fn kind_at(
    repo: &gix::Repository,
    tree: ObjectId,
    memo: &mut HashMap<Vec<u8>, Option<EntryKind>>,
    path: &[u8],
) -> Result<Option<EntryKind>, Error> {
    if let Some(k) = memo.get(path) {
        return Ok(*k);
    }
    let k = match path.iter().rposition(|b| *b == b'/') {
        Some(i) => match kind_at(repo, tree, memo, &path[..i])? {
            Some(EntryKind::Tree) => tree_kind(repo, tree, path)?,
            _ => None,
        },
        None => tree_kind(repo, tree, path)?,
    };
    memo.insert(path.to_vec(), k);
    Ok(k)
}

/// The record of a snapshot whose tree is `tree`, from the view's metadata (the workspace's nodes
/// whose own metadata git may drop, and the directories above them: `WorkspaceFs::view_meta`;
/// a node left out of it is one the tree restores); `None` when the tree restores everything.
/// `kept_links` maps the inode of each hard-linked file kept beside the tree (`super::kept`) to
/// its first kept name: a name of the tree linked to one of those is recorded as that link (the
/// kept side is restored first), not as a copy.
pub fn record_of(
    repo: &gix::Repository,
    tree: ObjectId,
    meta: &[NodeMeta],
    owner: &Owner,
    kept_links: &HashMap<u64, Vec<u8>>,
) -> Result<Option<PosixRecord>, Error> {
    let mut memo: HashMap<Vec<u8>, Option<EntryKind>> = HashMap::new();
    let mut skip: Vec<&[u8]> = Vec::new();
    let mut entries: Vec<PosixEntry> = Vec::new();
    let mut linked: HashMap<u64, Vec<u8>> = kept_links.clone();
    let mut wanted_parents: Vec<&[u8]> = Vec::new();
    // `meta` is sorted by path: a directory comes before everything under it.
    for m in meta {
        let p = m.path.as_slice();
        if skip.iter().any(|d| under(p, d)) {
            continue;
        }
        if m.gitlink || p.split(|b| *b == b'/').any(|c| c == b".git") {
            skip.push(p);
            continue;
        }
        let foreign_owner = m.uid != owner.uid || m.gid != owner.gid;
        let plain = !foreign_owner && m.xattrs.is_empty() && m.nlink <= 1;
        // The common case, decided without reading the tree: a file or symlink whose mode git
        // restores (the exec bit of the tree is the file's own).
        match m.kind {
            PosixKind::File if plain && (m.mode == 0o644 || m.mode == 0o755) => continue,
            PosixKind::Symlink if plain => continue,
            _ => {}
        }
        let kind = kind_at(repo, tree, &mut memo, p)?;
        let e = match (m.kind, kind) {
            (_, Some(EntryKind::Commit)) => {
                skip.push(p);
                continue;
            }
            (PosixKind::Dir, Some(EntryKind::Tree)) => {
                (m.mode != 0o755 || foreign_owner || !m.xattrs.is_empty()).then(|| entry_of(m))
            }
            (PosixKind::File, Some(k @ (EntryKind::Blob | EntryKind::BlobExecutable))) => {
                let git_mode = if k == EntryKind::BlobExecutable {
                    0o755
                } else {
                    0o644
                };
                match linked.get(&m.ino) {
                    Some(first) => Some(PosixEntry {
                        link: Some(first.clone()),
                        ..entry_of(m)
                    }),
                    None => {
                        linked.insert(m.ino, m.path.clone());
                        (m.mode != git_mode || foreign_owner || !m.xattrs.is_empty())
                            .then(|| entry_of(m))
                    }
                }
            }
            (PosixKind::Symlink, Some(EntryKind::Link)) => {
                (foreign_owner || !m.xattrs.is_empty()).then(|| entry_of(m))
            }
            (k, None) if k.is_special() => Some(entry_of(m)),
            // A directory the tree does not have: empty, or holding only what the tree leaves
            // out (names git refuses, kept beside it; files the ignore rules leave out; a nested
            // repository without a commit). Kept when it is empty or when its own state is not
            // what a directory made on the way gets (0755, the owner's, no xattrs): the user's
            // `chmod 700` of it is theirs whatever it holds.
            (PosixKind::Dir, None)
                if m.empty || m.mode != 0o755 || foreign_owner || !m.xattrs.is_empty() =>
            {
                Some(entry_of(m))
            }
            // Left out of the tree by the ignore rules (or a plain directory of only such files).
            _ => None,
        };
        if let Some(e) = e {
            if kind.is_none()
                && let Some(i) = p.iter().rposition(|b| *b == b'/')
            {
                wanted_parents.push(&p[..i]);
            }
            entries.push(e);
        }
    }
    // The directories above a kept special file or directory that the tree does not have come
    // back as they were (their parents are changed nodes too, so they are in `meta`).
    let by_path: HashMap<&[u8], &NodeMeta> = meta.iter().map(|m| (m.path.as_slice(), m)).collect();
    let mut have: std::collections::HashSet<Vec<u8>> =
        entries.iter().map(|e| e.path.clone()).collect();
    while let Some(d) = wanted_parents.pop() {
        if have.contains(d) || kind_at(repo, tree, &mut memo, d)?.is_some() {
            continue;
        }
        if let Some(m) = by_path.get(d) {
            have.insert(d.to_vec());
            entries.push(entry_of(m));
        }
        if let Some(i) = d.iter().rposition(|b| *b == b'/') {
            wanted_parents.push(&d[..i]);
        }
    }
    if entries.is_empty() {
        return Ok(None);
    }
    Ok(Some(PosixRecord::new(tree, entries)))
}

/// The extended attributes an unprivileged owner may set on their own files: the `user.`
/// namespace and POSIX ACLs. `security.*` (`security.capability` needs CAP_SETFCAP), `trusted.*`
/// (CAP_SYS_ADMIN) and every other namespace are root's.
fn owner_may_set_xattr(name: &[u8]) -> bool {
    name.starts_with(b"user.")
        || name == b"system.posix_acl_access"
        || name == b"system.posix_acl_default"
}

/// Whether `p` is a relative path a workspace can hold: `/`-separated names, none empty, `.`,
/// `..` or holding a NUL byte.
fn holdable_path(p: &[u8]) -> bool {
    !p.is_empty()
        && p.split(|b| *b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b".." && !c.contains(&0))
}

/// `major:minor` of a device number as the record keeps it (the kernel's `new_encode_dev`).
fn device(rdev: u32) -> String {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    format!("{major}:{minor}")
}

/// What of one record entry is applied for a thread owned by `who`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The entry as it may be applied; `None`: nothing of it is (a device node is not created).
    pub entry: Option<PosixEntry>,
    /// What was left out, one short phrase each ("owner uid 0", "the setuid bit", ...); empty
    /// when the entry is applied as written.
    pub left_out: Vec<String>,
}

/// What of record entry `e` may be applied to a workspace whose owner is `who` (uid, primary gid
/// and every group; `Caller` is the identity type of the daemon), by the kernel's rules for an
/// unprivileged user acting on their own files. Pure: the same entry and identity always give
/// the same answer. Root's threads (uid 0) keep the exact round trip.
///
/// For anyone else, the nearest state that owner could make themselves:
/// - the owner becomes `who.uid` (chown to another uid needs CAP_CHOWN);
/// - a group none of `who`'s becomes `who.gid`;
/// - the setuid bit stays only when the entry's owner is `who.uid`; the setgid bit only when the
///   entry's group is one of `who`'s (files and directories alike);
/// - a character or block device is not made at all (mknod needs CAP_MKNOD); fifos and sockets
///   are;
/// - extended attributes only of the `user.` namespace and POSIX ACLs.
///
/// For everyone: an entry whose path (or hard-link target) no workspace can hold (empty names,
/// `.`, `..`, NUL) is left out whole; the mode keeps only permission bits, and only devices keep
/// a device number.
pub fn admit(e: &PosixEntry, who: &Caller) -> Admitted {
    let mut left_out = Vec::new();
    if !holdable_path(&e.path) || e.link.as_deref().is_some_and(|l| !holdable_path(l)) {
        left_out.push("a path no workspace can hold".to_string());
        return Admitted {
            entry: None,
            left_out,
        };
    }
    let mut a = e.clone();
    a.mode &= 0o7777;
    if !matches!(a.kind, PosixKind::Char | PosixKind::Block) {
        a.rdev = 0;
    }
    if who.uid == 0 {
        return Admitted {
            entry: Some(a),
            left_out,
        };
    }
    if matches!(a.kind, PosixKind::Char | PosixKind::Block) {
        let kind = if a.kind == PosixKind::Char {
            "character"
        } else {
            "block"
        };
        left_out.push(format!("a {kind} device {} (not created)", device(a.rdev)));
        return Admitted {
            entry: None,
            left_out,
        };
    }
    if a.uid != who.uid {
        left_out.push(format!("owner uid {}", a.uid));
        if a.mode & 0o4000 != 0 {
            left_out.push("the setuid bit".to_string());
            a.mode &= !0o4000;
        }
        a.uid = who.uid;
    }
    if !who.in_group(a.gid) {
        left_out.push(format!("group gid {}", a.gid));
        if a.mode & 0o2000 != 0 {
            left_out.push("the setgid bit".to_string());
            a.mode &= !0o2000;
        }
        a.gid = who.gid;
    }
    a.xattrs.retain(|(k, _)| {
        let keep = owner_may_set_xattr(k);
        if !keep {
            left_out.push(format!(
                "extended attribute {}",
                String::from_utf8_lossy(k).escape_debug()
            ));
        }
        keep
    });
    Admitted {
        entry: Some(a),
        left_out,
    }
}

/// The identity a record is applied with for a thread owned by `owner`: its uid, primary gid and
/// every group the host gives that user (none needed for root).
pub fn authority(owner: &Owner) -> Caller {
    Caller {
        uid: owner.uid,
        gid: owner.gid,
        groups: if owner.uid == 0 {
            Vec::new()
        } else {
            crate::sys::user_groups(owner.uid)
        },
    }
}

/// An entry of a record left out, wholly or in part: its path and what was left out of it.
pub type LeftOut = (Vec<u8>, Vec<String>);

/// The most left-out entries a command names (the rest are counted).
const NAMED_MAX: usize = 20;

/// One warning line per left-out entry of the record of `what`, the first [`NAMED_MAX`] named,
/// then one line counting the rest; each named one also goes to the log as a warning. Paths and
/// names are escaped, so each warning is one line whatever bytes the record held.
pub fn left_out_warnings(what: &str, who: &Caller, left: &[LeftOut]) -> Vec<String> {
    let mut out: Vec<String> = left
        .iter()
        .take(NAMED_MAX)
        .map(|(path, parts)| {
            let path = String::from_utf8_lossy(path).escape_debug().to_string();
            let parts = parts.join(", ");
            tracing::warn!(record = %what, uid = who.uid, %path, left_out = %parts,
                "a POSIX record entry was applied only in part");
            format!(
                "the POSIX record of {what} sets more than uid {} may: {path}: left out {parts}",
                who.uid
            )
        })
        .collect();
    if left.len() > NAMED_MAX {
        let more = left.len() - NAMED_MAX;
        tracing::warn!(record = %what, uid = who.uid, more, "more POSIX record entries applied only in part");
        out.push(format!(
            "the POSIX record of {what}: and {more} more entries left out in part"
        ));
    }
    out
}

/// Puts back the record of snapshot `snapshot` (named in its message) into a workspace that holds
/// the snapshot's tree, with the authority of `who`, the thread's owner ([`admit`]); returns the
/// entries it applied only in part or not at all. A snapshot without a record changes nothing; a
/// record that cannot be read or applied fails the resume (a resume never widens a file's
/// permissions); a record of another tree is ignored with a warning.
pub fn restore(
    core: &WorkspaceFs,
    repo: &gix::Repository,
    snapshot: ObjectId,
    who: &Caller,
) -> Result<Vec<LeftOut>, Error> {
    let (tree, _, message, _) = snap::commit_info(repo, snapshot)?;
    let Some(blob) = posix_record::blob_of(&message) else {
        return Ok(Vec::new());
    };
    let obj = repo.find_object(blob).context(|| {
        format!("the POSIX record {blob} of snapshot {snapshot} is missing from the mirror")
    })?;
    let record = PosixRecord::decode(&obj.data).context(|| format!("the POSIX record {blob}"))?;
    if record.tree != tree {
        tracing::warn!(%snapshot, %blob, record_tree = %record.tree, %tree,
            "the POSIX record describes another tree; not applied");
        return Ok(Vec::new());
    }
    let mut left = Vec::new();
    for e in &record.entries {
        let Admitted { entry, left_out } = admit(e, who);
        if !left_out.is_empty() {
            left.push((e.path.clone(), left_out));
        }
        let Some(e) = entry else { continue };
        core.restore_entry(&e).map_err(on_workspace(format!(
            "cannot restore the POSIX state of {} ({:?})",
            String::from_utf8_lossy(&e.path).escape_debug(),
            e.kind
        )))?;
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Caller = Caller {
        uid: 1001,
        gid: 1001,
        groups: Vec::new(),
    };

    fn a_in(groups: &[u32]) -> Caller {
        Caller {
            groups: groups.to_vec(),
            ..A
        }
    }

    fn entry(path: &[u8], kind: PosixKind, mode: u32, uid: u32, gid: u32) -> PosixEntry {
        PosixEntry {
            path: path.to_vec(),
            kind,
            mode,
            uid,
            gid,
            rdev: 0,
            xattrs: vec![],
            link: None,
        }
    }

    fn applied(e: &PosixEntry, who: &Caller) -> (PosixEntry, Vec<String>) {
        let a = admit(e, who);
        (a.entry.expect("applied"), a.left_out)
    }

    #[test]
    fn the_owners_own_state_is_applied_as_written() {
        let mut e = entry(b"bin/tool", PosixKind::File, 0o6755, 1001, 1001);
        e.xattrs = vec![
            (b"user.note".to_vec(), b"x".to_vec()),
            (b"system.posix_acl_access".to_vec(), vec![2, 0, 0, 0]),
        ];
        let a = admit(&e, &A);
        assert_eq!(a.entry.as_ref(), Some(&e));
        assert!(a.left_out.is_empty(), "{:?}", a.left_out);
        for kind in [PosixKind::Fifo, PosixKind::Socket, PosixKind::Dir] {
            let e = entry(b"x", kind, 0o1777, 1001, 1001);
            assert_eq!(admit(&e, &A).entry, Some(e));
        }
    }

    #[test]
    fn root_keeps_the_exact_round_trip() {
        let root = Caller::default();
        let mut dev = entry(b"dev/sda", PosixKind::Block, 0o666, 0, 6);
        dev.rdev = 8 << 8;
        let mut suid = entry(b"evil.git/hooks/pre-receive", PosixKind::File, 0o4755, 0, 0);
        suid.xattrs = vec![(b"security.capability".to_vec(), vec![1, 2, 3])];
        let other = entry(b"theirs", PosixKind::File, 0o2644, 4321, 8765);
        for e in [dev, suid, other] {
            let a = admit(&e, &root);
            assert_eq!(a.entry, Some(e));
            assert!(a.left_out.is_empty());
        }
    }

    #[test]
    fn another_owner_becomes_the_thread_owner_and_loses_setuid() {
        let e = entry(b"tool", PosixKind::File, 0o4755, 0, 1001);
        let (got, left) = applied(&e, &A);
        assert_eq!((got.uid, got.gid, got.mode), (1001, 1001, 0o755));
        assert_eq!(left, ["owner uid 0", "the setuid bit"]);
        // The owner's own setuid file keeps it.
        let e = entry(b"tool", PosixKind::File, 0o4755, 1001, 1001);
        assert_eq!(applied(&e, &A).0.mode, 0o4755);
    }

    #[test]
    fn a_group_is_kept_only_when_the_owner_is_in_it() {
        let e = entry(b"f", PosixKind::File, 0o2755, 1001, 50);
        let (got, left) = applied(&e, &a_in(&[1001, 50]));
        assert_eq!((got.gid, got.mode), (50, 0o2755));
        assert!(left.is_empty());
        let (got, left) = applied(&e, &A);
        assert_eq!((got.uid, got.gid, got.mode), (1001, 1001, 0o755));
        assert_eq!(left, ["group gid 50", "the setgid bit"]);
        // Directories alike: a setgid directory of a group not the owner's loses both.
        let d = entry(b"d", PosixKind::Dir, 0o2775, 1001, 0);
        let (got, left) = applied(&d, &A);
        assert_eq!((got.gid, got.mode), (1001, 0o775));
        assert_eq!(left, ["group gid 0", "the setgid bit"]);
        // A foreign owner alone keeps a setgid of the owner's group.
        let e = entry(b"f", PosixKind::File, 0o2755, 0, 1001);
        let (got, left) = applied(&e, &A);
        assert_eq!((got.uid, got.mode), (1001, 0o2755));
        assert_eq!(left, ["owner uid 0"]);
    }

    #[test]
    fn devices_are_not_made_fifos_and_sockets_are() {
        let mut mem = entry(b"dev/mem", PosixKind::Char, 0o666, 1001, 1001);
        mem.rdev = (1 << 8) | 1;
        let a = admit(&mem, &A);
        assert_eq!(a.entry, None);
        assert_eq!(a.left_out, ["a character device 1:1 (not created)"]);
        let mut disk = entry(b"dev/disk", PosixKind::Block, 0o666, 0, 0);
        disk.rdev = (259 << 8) | 0x12;
        let a = admit(&disk, &A);
        assert_eq!(a.entry, None);
        assert_eq!(a.left_out, ["a block device 259:18 (not created)"]);
        // Only a device keeps a device number.
        let mut fifo = entry(b"p", PosixKind::Fifo, 0o600, 1001, 1001);
        fifo.rdev = 0x0801;
        assert_eq!(applied(&fifo, &A).0.rdev, 0);
    }

    #[test]
    fn only_user_xattrs_and_acls_are_set() {
        let mut e = entry(b"f", PosixKind::File, 0o644, 1001, 1001);
        e.xattrs = vec![
            (b"security.capability".to_vec(), vec![1]),
            (b"security.selinux".to_vec(), vec![2]),
            (b"system.posix_acl_default".to_vec(), vec![3]),
            (b"trusted.overlay.opaque".to_vec(), vec![4]),
            (b"user.kept".to_vec(), vec![5]),
            (b"userx".to_vec(), vec![6]),
            (b"user\n.x".to_vec(), vec![7]),
        ];
        let (got, left) = applied(&e, &A);
        let names: Vec<&[u8]> = got.xattrs.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(names, [&b"system.posix_acl_default"[..], &b"user.kept"[..]]);
        assert_eq!(
            left,
            [
                "extended attribute security.capability",
                "extended attribute security.selinux",
                "extended attribute trusted.overlay.opaque",
                "extended attribute userx",
                "extended attribute user\\n.x",
            ]
        );
    }

    #[test]
    fn a_path_no_workspace_can_hold_is_left_out_for_everyone() {
        for who in [A, Caller::default()] {
            for p in [
                &b""[..],
                b"/abs",
                b"a//b",
                b"a/./b",
                b"../up",
                b"a/..",
                b"nul\0",
            ] {
                let a = admit(&entry(p, PosixKind::Dir, 0o755, who.uid, who.gid), &who);
                assert_eq!(a.entry, None, "{p:?}");
                assert_eq!(a.left_out, ["a path no workspace can hold"]);
            }
            let mut l = entry(b"second", PosixKind::File, 0o644, who.uid, who.gid);
            l.link = Some(b"../../etc/shadow".to_vec());
            assert_eq!(admit(&l, &who).entry, None);
        }
    }

    #[test]
    fn only_permission_bits_are_applied() {
        let e = entry(b"f", PosixKind::File, 0o100644 | 0o4000, 1001, 1001);
        assert_eq!(applied(&e, &A).0.mode, 0o4644);
        assert_eq!(applied(&e, &Caller::default()).0.mode, 0o4644);
    }

    #[test]
    fn warnings_are_one_line_each_and_bounded() {
        let left: Vec<LeftOut> = (0..25)
            .map(|i| {
                (
                    format!("f{i}\nx").into_bytes(),
                    vec!["owner uid 0".to_string()],
                )
            })
            .collect();
        let w = left_out_warnings("snapshot s", &A, &left);
        assert_eq!(w.len(), 21);
        assert!(w.iter().all(|l| !l.contains('\n')), "{w:?}");
        assert!(
            w[0].contains("f0\\nx") && w[0].contains("owner uid 0"),
            "{}",
            w[0]
        );
        assert!(w[20].contains("and 5 more"), "{}", w[20]);
        assert!(left_out_warnings("s", &A, &left[..3]).len() == 3);
    }
}
