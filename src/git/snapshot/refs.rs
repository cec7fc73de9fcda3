//! The refs a snapshot moves: `refs/octomate/threads/<thread>`, read, and moved by
//! compare-and-swap with a reflog entry, past a lock a dead process left.
//!
//! Owns the ref edit and the stale-lock rule (a lock unchanged for [`STALE_LOCK_AFTER`] is
//! removed); must not write objects (a ref moves only to what is already in the mirror).

use super::commit::signature;
use crate::git::error::{Context, Error};

use gix::ObjectId;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
use gix::refs::{FullName, Target};

pub fn thread_ref(thread: &str) -> String {
    format!("refs/octomate/threads/{thread}")
}

/// The commit a ref points at, if it exists.
pub fn read_ref(repo: &gix::Repository, name: &str) -> Option<ObjectId> {
    repo.find_reference(name)
        .ok()
        .and_then(|mut r| r.peel_to_id().ok())
        .map(|id| id.detach())
}

/// Moves `name` from `expected` (`None`: must not exist) to `new`, with a reflog entry. A ref that
/// moved underneath is an error, never an overwrite.
pub fn cas_ref(
    repo: &gix::Repository,
    name: &str,
    expected: Option<ObjectId>,
    new: ObjectId,
    log: &str,
) -> Result<(), Error> {
    let full = FullName::try_from(name).context(|| format!("bad ref name {name}"))?;
    let edit = RefEdit {
        name: full,
        deref: false,
        change: Change::Update {
            log: LogChange {
                mode: RefLog::AndReference,
                force_create_reflog: true,
                message: log.into(),
            },
            expected: match expected {
                Some(id) => PreviousValue::MustExistAndMatch(Target::Object(id)),
                None => PreviousValue::MustNotExist,
            },
            new: Target::Object(new),
        },
    };
    let sig = signature();
    let mut tb = gix::date::parse::TimeBuf::default();
    let first = repo.edit_references_as(Some(edit.clone()), Some(sig.to_ref(&mut tb)));
    let result = match first {
        Err(e) if clear_stale_locks(repo, name) => {
            tracing::debug!("{name}: retrying after a stale lock: {e}");
            repo.edit_references_as(Some(edit), Some(sig.to_ref(&mut tb)))
        }
        other => other,
    };
    result
        .map(|_| ())
        .context(|| format!("{name} moved underneath (another snapshot won the race?)"))
}

/// How long a ref lock may stay unchanged before it counts as left by a process that died while
/// holding it (git and gix hold one for milliseconds).
const STALE_LOCK_AFTER: std::time::Duration = std::time::Duration::from_secs(2);

/// After a failed edit of `name`: waits for `packed-refs.lock` and `<name>.lock` in `repo` to go
/// away, and removes one that stays unchanged for [`STALE_LOCK_AFTER`] — the daemon killed while
/// it updated a ref leaves one, and every later edit of any ref of the mirror would fail on it
/// for good. `true` when a lock was there (gone or removed now: worth retrying).
fn clear_stale_locks(repo: &gix::Repository, name: &str) -> bool {
    let locks = [
        repo.git_dir().join("packed-refs.lock"),
        repo.git_dir().join(format!("{name}.lock")),
    ];
    let mut found = false;
    for lock in locks {
        let stamp = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        let Some(seen) = stamp(&lock) else {
            continue;
        };
        found = true;
        let since = std::time::Instant::now();
        loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
            match stamp(&lock) {
                None => break,
                Some(t) if t != seen => break,
                Some(_) if since.elapsed() >= STALE_LOCK_AFTER => {
                    match std::fs::remove_file(&lock) {
                        Ok(()) => tracing::warn!(
                            "removed {}: unchanged for {} s, left by a process that died while \
                             updating a ref",
                            lock.display(),
                            STALE_LOCK_AFTER.as_secs()
                        ),
                        Err(e) => tracing::warn!("cannot remove stale {}: {e}", lock.display()),
                    }
                    break;
                }
                Some(_) => {}
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon killed while it updated a ref leaves `packed-refs.lock` in the mirror. Catches:
    /// every later edit of the mirror's refs failing on it for good; a lock someone still holds
    /// (one that goes away) being removed.
    #[test]
    fn a_ref_edit_gets_past_a_lock_left_by_a_dead_process() {
        let dir = tempfile::tempdir().unwrap();
        let repo = gix::init_bare(dir.path()).unwrap();
        let empty = ObjectId::empty_tree(repo.object_hash());
        let name = "refs/octomate/threads/t";
        cas_ref(&repo, name, None, empty, "first").unwrap();
        // A stale lock: nobody removes it.
        let lock = dir.path().join("packed-refs.lock");
        std::fs::write(&lock, b"").unwrap();
        let blob = repo.write_blob(b"x").unwrap().detach();
        let t0 = std::time::Instant::now();
        cas_ref(&repo, name, Some(empty), blob, "second").unwrap();
        assert!(t0.elapsed() >= STALE_LOCK_AFTER);
        assert!(!lock.exists());
        assert_eq!(repo.find_reference(name).unwrap().id().detach(), blob);
        // A live holder: it lets go after 300 ms, and its lock is not removed under it.
        std::fs::write(&lock, b"").unwrap();
        let held = lock.clone();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            std::fs::remove_file(&held).unwrap();
        });
        let t0 = std::time::Instant::now();
        cas_ref(&repo, name, Some(blob), empty, "third").unwrap();
        assert!(t0.elapsed() < STALE_LOCK_AFTER);
        holder.join().expect("the holder removed its own lock");
        // A moved ref is still refused.
        assert!(cas_ref(&repo, name, Some(blob), blob, "fourth").is_err());
    }
}
