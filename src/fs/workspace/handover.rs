//! The live inode table as another daemon process needs it to go on serving a kernel connection it
//! was handed: every node the kernel holds a reference to (lookup count) or a file handle of (open
//! and writer counts), with its record, since a node derived from the base or unlinked has none in
//! the catalog. The catalog and the upper layer are on disk; this is only what memory adds to them.
//! Touches nothing else of the core's state.

use serde::{Deserialize, Serialize};

use super::inodes::Node;
use super::{ROOT_INO, WorkspaceFs};
use crate::cow::catalog::InodeRecord;

/// One live node of a handover.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeState {
    pub rec: InodeRecord,
    pub lookups: u64,
    pub opens: u32,
    pub writers: u32,
}

impl WorkspaceFs {
    /// The nodes the kernel or an open handle refers to (the root always). Call it while no
    /// request is being served.
    pub fn export_nodes(&self) -> Vec<NodeState> {
        let st = self.lock();
        let mut out: Vec<NodeState> = st
            .live
            .inodes
            .values()
            .filter(|n| n.lookups > 0 || n.opens > 0 || n.rec.ino == ROOT_INO)
            .map(|n| NodeState {
                rec: n.rec.clone(),
                lookups: n.lookups,
                opens: n.opens,
                writers: n.writers,
            })
            .collect();
        // Light nodes (base files only the kernel refers to) carry their record derived again;
        // the new daemon takes them as full nodes, which go light again at their next lookup.
        for (&ino, l) in &st.live.inodes.light {
            match self.record(&st, ino) {
                Ok(rec) => out.push(NodeState {
                    rec,
                    lookups: u64::from(l.lookups),
                    opens: 0,
                    writers: 0,
                }),
                Err(e) => tracing::warn!(ino, "a light node cannot be handed over: {e}"),
            }
        }
        out
    }

    /// Gives the freshly loaded table the references of a handover: a node the catalog has keeps
    /// its loaded record and takes the counts; any other (derived from the base, or unlinked while
    /// referenced) is added with its handed record.
    pub fn import_nodes(&self, nodes: Vec<NodeState>) {
        let mut st = self.lock();
        for n in nodes {
            let node = st
                .live
                .inodes
                .get_or_insert_with(n.rec.ino, || Node::derived(n.rec, 0));
            node.lookups = n.lookups;
            node.opens = n.opens;
            node.writers = n.writers;
        }
    }
}

impl WorkspaceFs {
    /// After [`WorkspaceFs::close`] for a handover that then failed: the catalog is in use again,
    /// so an unclean stop from here on must be seen as one.
    pub fn reopen_after_handover(&self) -> std::io::Result<()> {
        self.lock().catalog.unmark_clean()
    }
}
