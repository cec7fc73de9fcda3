//! Git's order of tree entries, and finding a name in a tree in that order. Pure functions over tree
//! entries read from the object store.

use crate::git::objects::{EntryKind, TreeEntry};

/// Git orders tree entries by name, with a tree's name compared as if it ended in '/'.
pub(super) fn git_order(a: &[u8], a_tree: bool, b: &[u8], b_tree: bool) -> std::cmp::Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        std::cmp::Ordering::Equal => {
            let ac = a.get(n).copied().or(if a_tree { Some(b'/') } else { None });
            let bc = b.get(n).copied().or(if b_tree { Some(b'/') } else { None });
            ac.cmp(&bc)
        }
        o => o,
    }
}

/// Finds `name` in a tree in git order (binary search, trying it as a blob and as a tree).
pub(super) fn find_entry<'a>(entries: &'a [TreeEntry], name: &[u8]) -> Option<&'a TreeEntry> {
    find_index(entries, name).map(|i| &entries[i])
}

/// The index of `name` in a tree (see [`find_entry`]).
pub(super) fn find_index(entries: &[TreeEntry], name: &[u8]) -> Option<usize> {
    for as_tree in [false, true] {
        if let Ok(i) = entries.binary_search_by(|e| {
            let e_tree = matches!(e.kind, EntryKind::Tree);
            git_order(&e.name, e_tree, name, as_tree)
        }) && &*entries[i].name == name
        {
            return Some(i);
        }
    }
    entries.iter().position(|e| &*e.name == name)
}
