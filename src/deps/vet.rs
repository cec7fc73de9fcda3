//! The check of a staged project before any package manager runs: every dependency must be a
//! registry package (or a package of the project's own workspace). A lockfile is content an agent
//! can push, and a dependency on `git+file:///root/repo`, `git+ssh://…`, a local path or tarball
//! would have the manager fetch something of the host's, or with the host's keys, into a layer
//! every workspace of the project presents (docs/deps.md "What a build refuses").
//!
//! Reads the staged manifests only (`package.json`, `package-lock.json`, `npm-shrinkwrap.json`,
//! `pnpm-lock.yaml`, `pnpm-workspace.yaml`, `pyproject.toml`, `uv.lock`); writes nothing. The YAML
//! and TOML files are scanned line by line for the keys and values that name a source (no parser
//! of either is a dependency of octofs): a false refusal fails a build with its reason, a miss is
//! still confined by the build sandbox (src/deps/sandbox.rs).

use std::path::{Component, Path, PathBuf};

use super::Manager;
use super::error::{Error, FsOp, Vet, fs};

/// Refuses the staged project at `staging` when a dependency is not a registry package: the
/// reason names the file, the dependency and its spec, on one line.
pub fn check(manager: Manager, staging: &Path) -> Result<(), Error> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = staging.join(&rel);
        let rd = std::fs::read_dir(&dir).map_err(fs(FsOp::Read, &dir))?;
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel_path = rel.join(&name);
            let ft = entry.file_type().map_err(fs(FsOp::Stat, &rel_path))?;
            if ft.is_dir() {
                stack.push(rel_path);
                continue;
            }
            let text = || std::fs::read_to_string(entry.path()).map_err(fs(FsOp::Read, &rel_path));
            let shown = rel_path.to_string_lossy().into_owned();
            let verdict = match (manager, name.as_str()) {
                (Manager::Npm | Manager::Pnpm, "package.json") => package_json(&text()?, &rel),
                (Manager::Npm | Manager::Pnpm, "package-lock.json" | "npm-shrinkwrap.json") => {
                    package_lock(&text()?, &rel)
                }
                (Manager::Npm | Manager::Pnpm, "pnpm-lock.yaml") => pnpm_lock(&text()?, &rel),
                (Manager::Npm | Manager::Pnpm, "pnpm-workspace.yaml") => {
                    pnpm_workspace(&text()?, &rel)
                }
                (Manager::Uv, "uv.lock") => uv_toml(&text()?, &rel, true),
                (Manager::Uv, "pyproject.toml") => uv_toml(&text()?, &rel, false),
                _ => Ok(()),
            };
            verdict.map_err(|why| Error::Refused { file: shown, why })?;
        }
    }
    Ok(())
}

/// Whether `rel` (relative to the project directory `base`, itself relative to the project's
/// root) stays inside the project.
fn inside(base: &Path, rel: &str) -> bool {
    if rel.starts_with('/') || rel.starts_with('~') || rel.contains('\\') {
        return false;
    }
    let mut depth: i64 = 0;
    for c in base.join(rel).components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Why an npm/pnpm dependency spec (a `package.json` value, a pnpm lock `specifier`) of the
/// package in `base` is not a registry package, or `None` when it is.
fn npm_spec(spec: &str, base: &Path) -> Option<&'static str> {
    let s = spec.trim();
    let l = s.to_ascii_lowercase();
    if let Some(rest) = l.strip_prefix("workspace:") {
        // `workspace:*`, `workspace:^1.2`: a package of the workspace by name; a path form must
        // stay in the project.
        let is_path = rest.contains('/') || rest.starts_with('.');
        return (is_path && !inside(base, rest))
            .then_some("a workspace package outside the project");
    }
    if let Some(rest) = l.strip_prefix("npm:") {
        // An alias: `npm:name@range` (a scoped name has one `/` before the `@` of its range).
        return rest
            .rsplit_once('@')
            .filter(|(name, _)| !name.is_empty())
            .and_then(|(_, range)| npm_spec(range, base));
    }
    for (prefix, why) in [
        ("file:", "a local path"),
        ("link:", "a local link"),
        ("git+", "a git source"),
        ("git:", "a git source"),
        ("github:", "a git source"),
        ("gitlab:", "a git source"),
        ("bitbucket:", "a git source"),
        ("gist:", "a git source"),
        ("ssh:", "a git source"),
    ] {
        if l.starts_with(prefix) {
            return Some(why);
        }
    }
    if l.starts_with("http://") || l.starts_with("https://") {
        // A remote tarball is fetched like a registry's; a git host's URL is a git source.
        return (l.ends_with(".git") || l.contains(".git#")).then_some("a git source");
    }
    if l.contains("://") {
        return Some("not a registry package");
    }
    if l.starts_with('/')
        || l.starts_with("./")
        || l.starts_with("../")
        || l.starts_with('~')
        || l == "."
        || l == ".."
    {
        return Some("a local path");
    }
    if l.ends_with(".tgz") || l.ends_with(".tar.gz") || l.ends_with(".tar") {
        return Some("a local tarball");
    }
    // `user/repo`, `user/repo#ref`: GitHub shorthand (no version range or tag contains `/`).
    if l.contains('/') {
        return Some("a git source (GitHub shorthand)");
    }
    None
}

/// The dependency fields of a `package.json`.
const DEP_FIELDS: [&str; 5] = [
    "dependencies",
    "devDependencies",
    "optionalDependencies",
    "peerDependencies",
    "overrides",
];

fn package_json(text: &str, base: &Path) -> Result<(), Vet> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(Vet::NotJson)?;
    for field in DEP_FIELDS {
        let mut stack: Vec<(String, &serde_json::Value)> = vec![(String::new(), &v[field])];
        // `overrides` nests: every string in it is a spec.
        while let Some((name, value)) = stack.pop() {
            match value {
                serde_json::Value::Object(map) => {
                    stack.extend(map.iter().map(|(k, v)| (k.clone(), v)));
                }
                serde_json::Value::String(spec) if !name.is_empty() => {
                    // `"$name"` in overrides refers to the root's own spec of that name.
                    if field == "overrides" && spec.starts_with('$') {
                        continue;
                    }
                    if let Some(why) = npm_spec(spec, base) {
                        return Err(Vet::Spec {
                            name,
                            spec: spec.clone(),
                            why,
                        });
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn package_lock(text: &str, base: &Path) -> Result<(), Vet> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(Vet::NotJson)?;
    if let Some(packages) = v["packages"].as_object() {
        for (key, entry) in packages {
            if !key.is_empty() && !inside(base, key) {
                return Err(Vet::Outside { key: key.clone() });
            }
            let name = key.rsplit("node_modules/").next().unwrap_or(key);
            if let Some(resolved) = entry["resolved"].as_str() {
                let linked = entry["link"].as_bool().unwrap_or(false);
                let l = resolved.to_ascii_lowercase();
                let ok = if linked {
                    inside(base, resolved) && !l.contains(':')
                } else {
                    (l.starts_with("https://") || l.starts_with("http://"))
                        && npm_spec(resolved, base).is_none()
                };
                if !ok {
                    return Err(Vet::Resolved {
                        name: name.to_string(),
                        resolved: resolved.to_string(),
                    });
                }
            }
            if let Some(version) = entry["version"].as_str()
                && let Some(why) = npm_spec(version, base).filter(|_| version.contains(':'))
            {
                return Err(Vet::Spec {
                    name: name.to_string(),
                    spec: version.to_string(),
                    why,
                });
            }
        }
    }
    // lockfileVersion 1: a nested `dependencies` tree whose `version` may be a spec.
    let mut stack = vec![&v["dependencies"]];
    while let Some(deps) = stack.pop() {
        let Some(map) = deps.as_object() else {
            continue;
        };
        for (name, entry) in map {
            for field in ["version", "resolved"] {
                if let Some(spec) = entry[field].as_str()
                    && spec.contains(':')
                    && let Some(why) = npm_spec(spec, base)
                {
                    return Err(Vet::Spec {
                        name: name.clone(),
                        spec: spec.to_string(),
                        why,
                    });
                }
            }
            stack.push(&entry["dependencies"]);
        }
    }
    Ok(())
}

/// The `key: value` pairs of one YAML line, its inline map (`{a: 1, b: 2}`) included, unquoted.
fn yaml_pairs(line: &str) -> Vec<(String, String)> {
    let unquote = |s: &str| s.trim().trim_matches(['\'', '"']).to_string();
    let mut out = Vec::new();
    let t = line.trim().trim_start_matches("- ");
    let Some((k, v)) = t.split_once(':') else {
        return out;
    };
    let v = v.trim();
    if let Some(inner) = v.strip_prefix('{').and_then(|x| x.strip_suffix('}')) {
        for part in inner.split(',') {
            if let Some((a, b)) = part.split_once(':') {
                out.push((unquote(a), unquote(b)));
            }
        }
    }
    out.push((unquote(k), unquote(v)));
    out
}

/// Why a key of pnpm's lockfile (`'foo@git+ssh://…'`, `foo@file:../x`) names a source that is not
/// a registry's.
fn pnpm_key(key: &str) -> Option<&'static str> {
    let l = key.to_ascii_lowercase();
    [
        ("@git+", "a git source"),
        ("@file:", "a local path"),
        ("@link:", "a local link"),
        ("@github:", "a git source"),
        ("codeload.github.com", "a git source"),
    ]
    .into_iter()
    .find(|(p, _)| l.contains(p))
    .map(|(_, why)| why)
}

fn pnpm_lock(text: &str, _base: &Path) -> Result<(), Vet> {
    let mut section = String::new();
    let mut importer = PathBuf::new();
    for line in text.lines() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if indent == 0 {
            section = line.trim().trim_end_matches(':').to_string();
            continue;
        }
        if section == "importers" && indent == 2 {
            let name = line.trim().trim_end_matches(':').trim_matches(['\'', '"']);
            importer = if name == "." {
                PathBuf::new()
            } else {
                PathBuf::from(name)
            };
        }
        if let Some(why) = pnpm_key(line) {
            return Err(Vet::Line {
                line: line.trim().to_string(),
                why,
            });
        }
        let pairs = yaml_pairs(line);
        for (key, value) in &pairs {
            let refused = match key.as_str() {
                "specifier" if section == "importers" => npm_spec(value, &importer),
                "version" if value.starts_with("link:") => {
                    let target = value.trim_start_matches("link:");
                    let base = if section == "importers" {
                        importer.clone()
                    } else {
                        PathBuf::new()
                    };
                    (!inside(&base, target)).then_some("a link outside the project")
                }
                "version" if value.contains(':') => npm_spec(value, &importer),
                "tarball" => (!(value.starts_with("https://") || value.starts_with("http://")))
                    .then_some("a local tarball"),
                "directory" => Some("a local directory"),
                "repo" | "commit" => Some("a git source"),
                "type" if value == "git" || value == "directory" => Some("not a registry package"),
                _ => None,
            };
            if let Some(why) = refused {
                return Err(Vet::Yaml {
                    key: key.clone(),
                    value: value.clone(),
                    why,
                });
            }
        }
    }
    Ok(())
}

fn pnpm_workspace(text: &str, base: &Path) -> Result<(), Vet> {
    let mut section = String::new();
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if indent == 0 && !t.starts_with('-') {
            section = t.split(':').next().unwrap_or("").to_string();
            continue;
        }
        if section == "packages"
            && let Some(glob) = t.strip_prefix('-')
        {
            let glob = glob.trim().trim_matches(['\'', '"']);
            let glob = glob.trim_start_matches('!');
            if !inside(base, glob) {
                return Err(Vet::GlobOutside {
                    glob: glob.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// The `key = value` pairs of one TOML line, its inline table (`{ a = 1, b = "x" }`) included,
/// unquoted.
fn toml_pairs(line: &str) -> Vec<(String, String)> {
    let unquote = |s: &str| s.trim().trim_matches(['\'', '"']).to_string();
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        for part in rest[open + 1..open + close].split(',') {
            if let Some((a, b)) = part.split_once('=') {
                out.push((unquote(a), unquote(b)));
            }
        }
        rest = &rest[open + close + 1..];
    }
    let t = line.trim();
    if !t.starts_with('{')
        && let Some((k, v)) = t.split_once('=')
        && !v.trim_start().starts_with('{')
    {
        out.push((unquote(k), unquote(v)));
    }
    out
}

/// `uv.lock` and `pyproject.toml`: no git source, no path or directory source, no editable or
/// virtual package outside the project, no local index, no direct reference to a file or a git
/// repository in a requirement string.
/// In a `pyproject.toml` (`lock` false) only the tables that uv reads dependencies from are
/// looked at: other tools' tables have `path =` and `directory =` keys of their own.
fn uv_toml(text: &str, base: &Path, lock: bool) -> Result<(), Vet> {
    let mut relevant = lock;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if !lock && t.starts_with('[') {
            let table = t.trim_matches(['[', ']']).trim();
            relevant = table == "project"
                || table.starts_with("project.")
                || table == "dependency-groups"
                || table.starts_with("tool.uv");
            continue;
        }
        if !relevant {
            continue;
        }
        let l = t.to_ascii_lowercase();
        for (needle, why) in [
            ("@ git+", "a git source"),
            ("@git+", "a git source"),
            ("@ file:", "a local path"),
            ("@file:", "a local path"),
        ] {
            if l.contains(needle) {
                return Err(Vet::Line {
                    line: t.to_string(),
                    why,
                });
            }
        }
        for (key, value) in toml_pairs(t) {
            let local = |v: &str| {
                let l = v.to_ascii_lowercase();
                !(l.starts_with("https://") || l.starts_with("http://"))
            };
            let refused = match key.as_str() {
                "git" => Some("a git source"),
                "path" | "directory" => Some("a path source"),
                "editable" | "virtual" if value != "true" && value != "false" => {
                    (!inside(base, &value)).then_some("a package outside the project")
                }
                "registry" | "url" | "index-url" | "extra-index-url" | "find-links"
                    if local(&value) =>
                {
                    Some("a local index or file")
                }
                _ => None,
            };
            if let Some(why) = refused {
                return Err(Vet::Toml { key, value, why });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> PathBuf {
        PathBuf::new()
    }

    #[test]
    fn registry_specs_pass_and_others_are_named() {
        for ok in [
            "^1.2.3",
            "7.0.0",
            "latest",
            "*",
            ">=1 <2",
            "npm:@scope/pkg@^1",
            "workspace:*",
            "workspace:^1.0.0",
            "https://registry.npmjs.org/a/-/a-1.0.0.tgz",
        ] {
            assert_eq!(npm_spec(ok, &root()), None, "{ok}");
        }
        for bad in [
            "git+file:///root/secret-repo",
            "git+ssh://git@github.com/a/b.git",
            "git+https://github.com/a/b.git",
            "git://github.com/a/b",
            "github:a/b",
            "a/b#v1",
            "file:../x",
            "link:../x",
            "/abs/pkg.tgz",
            "./pkg.tgz",
            "pkg.tgz",
            "workspace:../../elsewhere",
            "npm:x@git+ssh://h/r.git",
        ] {
            assert!(npm_spec(bad, &root()).is_some(), "{bad}");
        }
        assert_eq!(npm_spec("workspace:../b", Path::new("packages/a")), None);
    }

    #[test]
    fn package_json_and_lock_name_the_dependency() {
        let err = package_json(
            r#"{"dependencies":{"left-pad":"1.3.0","secret":"git+file:///root/secret-repo"}}"#,
            &root(),
        )
        .expect_err("refused")
        .to_string();
        assert!(
            err.contains("\"secret\"") && err.contains("git+file:///root/secret-repo"),
            "{err}"
        );
        assert!(
            package_json(
                r#"{"overrides":{"a":{"b":"$b"}},"dependencies":{"b":"1"}}"#,
                &root()
            )
            .is_ok()
        );
        let lock = r#"{"packages":{"":{},"node_modules/a":{"resolved":"packages/a","link":true},
            "packages/a":{"version":"1.0.0"},
            "node_modules/b":{"version":"1.0.0","resolved":"https://registry.npmjs.org/b/-/b-1.0.0.tgz"}}}"#;
        assert!(package_lock(lock, &root()).is_ok());
        let git = r#"{"packages":{"node_modules/s":{"version":"1.0.0","resolved":"git+ssh://git@github.com/a/s.git#abc"}}}"#;
        assert!(
            package_lock(git, &root())
                .expect_err("git")
                .to_string()
                .contains("\"s\"")
        );
        let out = r#"{"packages":{"node_modules/s":{"resolved":"../../root/s","link":true},"../../root/s":{}}}"#;
        assert!(package_lock(out, &root()).is_err());
    }

    #[test]
    fn pnpm_and_uv_lockfiles() {
        let ok = "lockfileVersion: '9.0'\nimporters:\n  .:\n    dependencies:\n      a:\n        specifier: workspace:*\n        version: link:packages/a\n  packages/a:\n    dependencies:\n      b:\n        specifier: ^1.0.0\n        version: 1.0.0\npackages:\n  b@1.0.0:\n    resolution: {integrity: sha512-x}\n";
        assert!(pnpm_lock(ok, &root()).is_ok());
        let git = "importers:\n  .:\n    dependencies:\n      s:\n        specifier: git+file:///root/secret\n        version: git+file:///root/secret#abc\n";
        assert!(pnpm_lock(git, &root()).is_err());
        let dir = "packages:\n  s@file:../x:\n    resolution: {directory: ../x, type: directory}\n";
        assert!(pnpm_lock(dir, &root()).is_err());
        let uv_ok = "[[package]]\nname = \"app\"\nsource = { virtual = \".\" }\n[[package]]\nname = \"six\"\nsource = { registry = \"https://pypi.org/simple\" }\n";
        assert!(uv_toml(uv_ok, &root(), true).is_ok());
        let uv_git = "[[package]]\nname = \"s\"\nsource = { git = \"file:///root/s\" }\n";
        assert!(uv_toml(uv_git, &root(), true).is_err());
        assert!(uv_toml("source = { editable = \"../../x\" }\n", &root(), true).is_err());
        assert!(
            uv_toml(
                "[project]\ndependencies = [\"s @ git+ssh://h/r\"]\n",
                &root(),
                false
            )
            .is_err()
        );
        assert!(
            uv_toml(
                "[tool.coverage.html]\ndirectory = \"htmlcov\"\n",
                &root(),
                false
            )
            .is_ok()
        );
        assert!(
            uv_toml(
                "[tool.uv.sources]\ns = { path = \"/root/s\" }\n",
                &root(),
                false
            )
            .is_err()
        );
    }
}
