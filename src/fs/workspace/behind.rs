//! The changes the daemon makes behind the kernel: once a workspace is mounted
//! ([`WorkspaceFs::watch_kernel`]), every name or inode the daemon changes other than through a FUSE
//! request is noted as a [`Behind`], and the daemon takes the list ([`WorkspaceFs::take_behind`])
//! to tell the kernel to forget what it cached. Owns that list only; it changes nothing itself.

use super::{WorkspaceFs, types::Behind};

impl WorkspaceFs {
    /// From now on the kernel may cache this workspace (it is being mounted): what the daemon
    /// changes other than through a FUSE request is recorded for [`Self::take_behind`].
    pub fn watch_kernel(&self) {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        b.get_or_insert_with(Vec::new);
    }

    /// What the daemon changed behind the kernel since the last call, for the kernel to forget.
    pub fn take_behind(&self) -> Vec<Behind> {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        b.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub(super) fn note_behind(&self, what: Behind) {
        let mut b = self.behind.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = b.as_mut() {
            v.push(what);
        }
    }

    /// [`Self::note_behind`] of a name.
    pub(super) fn entry_behind(&self, parent: u64, name: &[u8]) {
        self.note_behind(Behind::Entry {
            parent,
            name: name.to_vec(),
        });
    }
}
