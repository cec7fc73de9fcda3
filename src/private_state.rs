//! The state directory made private once at start: every mode under `<state>` narrowed to the
//! private modes [`crate::layout`] names, and a marker written durably ([`crate::records`]) so that
//! later starts check only the top level. Apart from `layout` so that `layout` needs nothing of
//! `records` (which builds on it). Touches nothing but modes under `<state>` and its marker.

use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use crate::layout::{PRIVATE_DIR_MODE, STATE_DIR_MODE, create_public_dir};

/// Written once every mode under `<state>` was made private: later starts check only the top level
/// (a daemon creates everything private, so only a state from an older octofs needs the walk, which
/// costs a stat per file of every mirror and of the blob cache).
const PRIVATE_MARKER: &str = "private-modes";

/// Creates `<state>` (mode 0711) if needed and narrows every mode under it that is wider than
/// private: directories to 0700, files to 0600 or less (blob cache files keep 0400). Symlinks and
/// sockets are left alone (a symlink's mode means nothing; sockets belong to their server), and so
/// are other file systems mounted below. Once done, later calls only check `<state>` and what is
/// directly in it. Returns how many modes were narrowed.
pub fn make_private(state: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    // Its parents must stay reachable (the control socket is in it): not made private.
    if let Some(parent) = state.parent() {
        create_public_dir(parent)?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(STATE_DIR_MODE)
        .create(state)?;
    let top = std::fs::symlink_metadata(state)?;
    let mut fixed = 0;
    if top.mode() & 0o7777 != STATE_DIR_MODE {
        std::fs::set_permissions(state, std::fs::Permissions::from_mode(STATE_DIR_MODE))?;
        fixed += 1;
    }
    let marker = state.join(PRIVATE_MARKER);
    let whole = !marker.exists();
    let mut stack = vec![state.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let path = entry?.path();
            let Ok(m) = std::fs::symlink_metadata(&path) else {
                continue; // gone meanwhile
            };
            let mode = m.mode() & 0o7777;
            let mut want = if m.is_dir() {
                if m.dev() != top.dev() {
                    continue;
                }
                if whole {
                    stack.push(path.clone());
                }
                PRIVATE_DIR_MODE
            } else if m.is_file() {
                // Keep what is narrower (0400 blobs, read-only git objects); drop group, other and
                // the set-id bits.
                mode & 0o700
            } else {
                continue;
            };
            // An ACL is a deliberate grant (mirrors' object stores, for workspace owners): its
            // mask lives in the group bits, which stay; "other" never gets anything.
            if mode & 0o070 != 0 && crate::sys::has_acl(&path)? {
                want |= mode & 0o070;
            }
            if mode != want {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(want))?;
                fixed += 1;
            }
        }
    }
    if whole {
        crate::records::write_atomic(
            &marker,
            b"every mode under this directory was made private once\n",
        )?;
    }
    Ok(fixed)
}
