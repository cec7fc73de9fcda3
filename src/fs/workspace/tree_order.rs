//! Finding a name in a tree in git's order of entries ([`git_order`], kept with the parsed trees in
//! `git::objects`). Pure functions over tree entries read from the object store.

use crate::git::objects::{EntryKind, TreeEntry, git_order};

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
