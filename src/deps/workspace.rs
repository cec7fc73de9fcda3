//! Workspace packages of a node project: the directories a `pnpm-workspace.yaml` (`packages:`) or
//! the root `package.json`'s `"workspaces"` name, found in a commit's tree by their globs, and the
//! manifests of theirs that an install reads (what a layer's key covers besides the lockfile).
//!
//! Reads a commit's tree through the object store only (a few trees and blobs; directories named
//! `node_modules`, `.venv` or `.git` are never looked into); runs nothing, writes nothing.

use std::collections::BTreeSet;

use gix::bstr::ByteSlice;

use super::Manager;
use crate::git::objects::{EntryKind, ObjectStore};

/// Directories never looked into for workspace packages.
const SKIPPED: [&[u8]; 3] = [b"node_modules", b".venv", b".git"];

/// A project's workspace declaration: the workspace file the install reads besides the manifests
/// (pnpm's, with its bytes), and the globs.
type Globs = (Option<(String, Vec<u8>)>, Vec<String>);

/// The workspace globs of a node project whose root tree is `tree`: pnpm's `packages:` list, or
/// npm's `"workspaces"` (an array, or `{"packages": [...]}`). `None` without workspaces.
fn globs(
    store: &ObjectStore,
    tree: gix::ObjectId,
    manager: Manager,
) -> std::io::Result<Option<Globs>> {
    let entries = store.tree(tree)?;
    let blob = |name: &str| {
        entries
            .iter()
            .find(|e| &*e.name == name.as_bytes() && e.kind == EntryKind::Blob)
            .map(|e| e.id)
    };
    match manager {
        Manager::Pnpm => {
            let Some(id) = blob("pnpm-workspace.yaml") else {
                return Ok(None);
            };
            let bytes = store.blob(id)?;
            let list = pnpm_packages(&String::from_utf8_lossy(&bytes));
            Ok(Some((Some(("pnpm-workspace.yaml".into(), bytes)), list)))
        }
        Manager::Npm => {
            let Some(id) = blob("package.json") else {
                return Ok(None);
            };
            let Ok(json) = serde_json::from_slice::<serde_json::Value>(&store.blob(id)?) else {
                return Ok(None);
            };
            let ws = match &json["workspaces"] {
                serde_json::Value::Array(a) => a,
                serde_json::Value::Object(o) => match o.get("packages") {
                    Some(serde_json::Value::Array(a)) => a,
                    _ => return Ok(None),
                },
                _ => return Ok(None),
            };
            let list: Vec<String> = ws
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            Ok((!list.is_empty()).then_some((None, list)))
        }
        Manager::Uv => Ok(None),
    }
}

/// The `packages:` list of a `pnpm-workspace.yaml` (block or flow style, quoted or not).
pub fn pnpm_packages(yaml: &str) -> Vec<String> {
    let unquote = |s: &str| {
        let s = s.trim();
        let s = s.split(" #").next().unwrap_or(s).trim();
        s.trim_matches(|c| c == '\'' || c == '"').to_string()
    };
    let mut out = Vec::new();
    let mut lines = yaml.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("packages:") else {
            continue;
        };
        let rest = rest.trim();
        if let Some(flow) = rest.strip_prefix('[') {
            let flow = flow.split(']').next().unwrap_or("");
            out.extend(flow.split(',').map(unquote).filter(|s| !s.is_empty()));
            continue;
        }
        while let Some(next) = lines.peek() {
            let t = next.trim_start();
            if t.is_empty() || t.starts_with('#') {
                lines.next();
                continue;
            }
            if !next.starts_with([' ', '\t', '-']) {
                break;
            }
            if let Some(item) = t.strip_prefix('-') {
                let item = unquote(item);
                if !item.is_empty() {
                    out.push(item);
                }
            }
            lines.next();
        }
    }
    out
}

/// Whether `name` matches one glob component (`*`, `?` and `[...]` as git's wildmatch).
fn matches(pattern: &str, name: &[u8]) -> bool {
    gix_ignore::glob::wildmatch(
        pattern.as_bytes().as_bstr(),
        name.as_bstr(),
        gix_ignore::glob::wildmatch::Mode::NO_MATCH_SLASH_LITERAL,
    )
}

/// The directories under `tree` (at `prefix`) that the glob components `comps` match.
fn expand(
    store: &ObjectStore,
    tree: gix::ObjectId,
    prefix: &str,
    comps: &[&str],
    out: &mut BTreeSet<String>,
) -> std::io::Result<()> {
    let Some((first, rest)) = comps.split_first() else {
        if !prefix.is_empty() {
            out.insert(prefix.to_string());
        }
        return Ok(());
    };
    if *first == "**" {
        expand(store, tree, prefix, rest, out)?;
    }
    for e in store.tree(tree)?.iter() {
        if e.kind != EntryKind::Tree || SKIPPED.contains(&&*e.name) {
            continue;
        }
        let Ok(name) = std::str::from_utf8(&e.name) else {
            continue;
        };
        let path = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        if *first == "**" {
            expand(store, e.id, &path, comps, out)?;
        } else if matches(first, &e.name) {
            expand(store, e.id, &path, rest, out)?;
        }
    }
    Ok(())
}

/// The workspace package directories of a node project (relative, `/`-separated, sorted); empty
/// without workspaces.
pub fn packages(
    store: &ObjectStore,
    tree: gix::ObjectId,
    manager: Manager,
) -> std::io::Result<Vec<String>> {
    Ok(match globs(store, tree, manager)? {
        Some((_, list)) => dirs(store, tree, &list)?,
        None => Vec::new(),
    })
}

fn dirs(store: &ObjectStore, tree: gix::ObjectId, list: &[String]) -> std::io::Result<Vec<String>> {
    let (mut yes, mut no) = (BTreeSet::new(), BTreeSet::new());
    for glob in list {
        let (neg, g) = match glob.strip_prefix('!') {
            Some(g) => (true, g),
            None => (false, glob.as_str()),
        };
        let g = g.trim_start_matches("./").trim_end_matches('/');
        let comps: Vec<&str> = g
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if comps.is_empty() || comps.contains(&"..") {
            continue;
        }
        expand(
            store,
            tree,
            "",
            &comps,
            if neg { &mut no } else { &mut yes },
        )?;
    }
    Ok(yes.difference(&no).cloned().collect())
}

/// What an install of a node project with workspace packages reads besides the lockfile: the
/// workspace file (pnpm's) and each package's `package.json`, by path, sorted. Empty without
/// workspaces.
pub fn manifests(
    store: &ObjectStore,
    tree: gix::ObjectId,
    manager: Manager,
) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let Some((file, list)) = globs(store, tree, manager)? else {
        return Ok(Vec::new());
    };
    let mut out: Vec<(String, Vec<u8>)> = file.into_iter().collect();
    for dir in dirs(store, tree, &list)? {
        let mut at = Some(tree);
        for c in dir.split('/') {
            at = match at {
                Some(t) => store
                    .tree(t)?
                    .iter()
                    .find(|e| &*e.name == c.as_bytes() && e.kind == EntryKind::Tree)
                    .map(|e| e.id),
                None => None,
            };
        }
        let Some(t) = at else { continue };
        if let Some(e) = store
            .tree(t)?
            .iter()
            .find(|e| &*e.name == b"package.json" && e.kind == EntryKind::Blob)
        {
            out.push((format!("{dir}/package.json"), store.blob(e.id)?));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pnpm_workspace_lists() {
        let block = "packages:\n  - 'packages/*'\n  # a comment\n  - \"apps/**\"\n  - '!packages/skip'\ncatalog:\n  x: 1\n";
        assert_eq!(
            pnpm_packages(block),
            ["packages/*", "apps/**", "!packages/skip"]
        );
        assert_eq!(pnpm_packages("packages: ['a/*', \"b\"]\n"), ["a/*", "b"]);
        assert!(pnpm_packages("catalog:\n  - x\n").is_empty());
        assert!(matches("*", b"app"));
        assert!(matches("pkg-?", b"pkg-a"));
        assert!(!matches("pkg-?", b"pkg-ab"));
    }
}
