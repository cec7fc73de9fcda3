//! The reflog a workspace keeps of its mirror's tips, so that `git fsck` in the workspace finds no
//! "dangling" commit (`docs/overlay.md`, "The mirror's tips in the workspace's reflog").
//!
//! A workspace borrows the mirror's objects through `objects/info/alternates`, and with them every
//! other thread's snapshot, every named snapshot and every commit a sync brought; the refs that
//! reach them (`refs/octomate/*`, `refs/snapshots/*`, the mirror's branches) are not the
//! workspace's, and must not be (`git log --all` and `for-each-ref` show what a clone would). `git
//! fsck` takes reflog entries as roots too, while `git log --all` does not read reflogs: the reflog
//! of the workspace's own mark `refs/octomate/saved` (`.git/logs/refs/octomate/saved`) lists the
//! mirror's tips, written with the mark.
//!
//! Builds bytes only: reads the mirror's refs, writes nothing.

use std::collections::BTreeMap;
use std::path::Path;

use gix::ObjectId;

/// The refs whose tips the reflog lists (tags are the workspace's own, as its `packed-refs` has
/// them).
const KEPT: [&str; 3] = ["refs/octomate/", "refs/snapshots/", "refs/heads/"];

/// The reflog of `refs/octomate/saved` for a workspace of the mirror at `mirror`, dated `time`
/// (Unix seconds): one entry per tip of its snapshot refs and branches (each id once, its first
/// ref's name as the message), in the order of the ids.
pub fn reflog(mirror: &Path, time: i64) -> Result<Vec<u8>, String> {
    let repo = gix::open(mirror).map_err(|e| e.to_string())?;
    let platform = repo.references().map_err(|e| e.to_string())?;
    let mut tips: BTreeMap<ObjectId, String> = BTreeMap::new();
    for prefix in KEPT {
        let refs = platform.prefixed(prefix).map_err(|e| e.to_string())?;
        for r in refs.flatten() {
            if let Some(id) = r.target().try_id() {
                tips.entry(id.to_owned())
                    .or_insert_with(|| r.name().as_bstr().to_string());
            }
        }
    }
    let zero = ObjectId::null(repo.object_hash());
    let mut out = Vec::new();
    for (id, name) in tips {
        // A name is a valid ref name: no tab, no newline to break the line.
        out.extend_from_slice(
            format!("{zero} {id} octofs <octofs@localhost> {time} +0000\tmirror tip {name}\n")
                .as_bytes(),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_each_tip_once() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(args)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@t")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@t")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        git(&["init", "-q", "-b", "main"]);
        git(&["commit", "-q", "--allow-empty", "-m", "one"]);
        let one = git(&["rev-parse", "HEAD"]);
        let snap = git(&["commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "snap"]);
        git(&["update-ref", "refs/octomate/threads/t", &snap]);
        git(&["update-ref", "refs/snapshots/n", &snap]);
        git(&["tag", "v1"]);
        let text = String::from_utf8(reflog(dir, 7).unwrap()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        for id in [&one, &snap] {
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with(&format!("{} {id} ", "0".repeat(40)))
                        && l.contains(" 7 +0000\tmirror tip refs/")),
                "{text}"
            );
        }
    }
}
