//! Commit and push gates: checks over the paths a commit (or a push) would carry, each refusing a
//! path with a reason. Pure functions over [`Item`]s (a path and its size), so each rule is testable
//! without a repository; the one exception is the `cmd` gate, which runs the host's own program
//! (never anything a workspace configures) with the environment policy of [`super::Git`].
//!
//! Knows nothing about workspaces, mounts or refs: the caller decides which paths are checked and
//! what a refusal changes (nothing).

use std::io::Write as _;
use std::process::{Command, Stdio};

/// One path a commit or push would carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub path: Vec<u8>,
    /// Bytes of the blob (0 for a symlink target or a gitlink).
    pub size: u64,
}

/// A gate named on the command line (`excludes` is not one: it always runs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    SecretNames,
    MaxSize(u64),
    Cmd(String),
}

/// One refused path and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub path: String,
    pub why: String,
}

/// Parses `NAME[=VALUE]`; an unknown name or a bad value is an error before anything runs.
/// A gate that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("gate max-size wants a number of bytes, not {0:?}")]
    NotBytes(String),
    #[error("gate excludes always runs; it takes no name")]
    ExcludesAlwaysRuns,
    #[error("gate {0:?}: use secret-names, max-size=BYTES or cmd=PROGRAM")]
    BadForm(String),
    #[error("unknown gate {0:?} (known: secret-names, max-size=BYTES, cmd=PROGRAM)")]
    Unknown(String),
}

pub fn parse(spec: &str) -> Result<Gate, GateError> {
    let (name, value) = match spec.split_once('=') {
        Some((n, v)) => (n, Some(v)),
        None => (spec, None),
    };
    match (name, value) {
        ("secret-names", None) => Ok(Gate::SecretNames),
        ("max-size", Some(v)) => v
            .parse::<u64>()
            .map(Gate::MaxSize)
            .map_err(|_| GateError::NotBytes(v.to_string())),
        ("cmd", Some(p)) if !p.is_empty() => Ok(Gate::Cmd(p.to_string())),
        ("excludes", None) => Err(GateError::ExcludesAlwaysRuns),
        ("secret-names" | "max-size" | "cmd", _) => Err(GateError::BadForm(spec.to_string())),
        _ => Err(GateError::Unknown(name.to_string())),
    }
}

fn shown(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// Whether a file name (the last component) names a secret by convention.
pub fn is_secret_name(path: &[u8]) -> bool {
    let name = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
    name == b".env"
        || name.starts_with(b".env.")
        || name == b".npmrc"
        || name == b".pypirc"
        || name == b"credentials.json"
        || name.starts_with(b"id_rsa")
        || name.ends_with(b".pem")
        || name.ends_with(b".key")
}

/// `secret-names`: refuses every path whose name is a conventional secret file.
pub fn secret_names(items: &[Item]) -> Vec<Refusal> {
    items
        .iter()
        .filter(|i| is_secret_name(&i.path))
        .map(|i| Refusal {
            path: shown(&i.path),
            why: "its name is a secret file's (secret-names)".into(),
        })
        .collect()
}

/// `max-size=BYTES`: refuses every blob larger than `max`.
pub fn max_size(items: &[Item], max: u64) -> Vec<Refusal> {
    items
        .iter()
        .filter(|i| i.size > max)
        .map(|i| Refusal {
            path: shown(&i.path),
            why: format!("{} bytes is more than max-size={max}", i.size),
        })
        .collect()
}

/// `excludes`: refuses every path the caller found ignored (`ignored(path)`).
pub fn excludes(items: &[Item], mut ignored: impl FnMut(&[u8]) -> bool) -> Vec<Refusal> {
    let mut out = Vec::new();
    for i in items {
        if ignored(&i.path) {
            out.push(Refusal {
                path: shown(&i.path),
                why: "it is ignored content (excludes)".into(),
            });
        }
    }
    out
}

/// A project's configured excludes: gitignore-style patterns (`mirror set P --exclude PATTERN`) whose
/// paths are never committed or pushed, whatever the workspace's own rules say — a file an old branch
/// tracks (`.npmrc`) included. Part of the `excludes` gate.
pub struct ProjectExcludes {
    list: gix_ignore::glob::search::pattern::List<gix_ignore::search::Ignore>,
}

impl ProjectExcludes {
    pub fn new(patterns: &[String]) -> ProjectExcludes {
        use gix_ignore::glob::search::Pattern as _;
        let text = patterns.join("\n");
        ProjectExcludes {
            list: gix_ignore::glob::search::pattern::List {
                patterns: gix_ignore::search::Ignore::default()
                    .bytes_to_patterns(text.as_bytes(), std::path::Path::new("")),
                source: None,
                base: None,
            },
        }
    }

    /// The pattern that excludes `path` (or one of its directories), if one does.
    pub fn matching(&self, path: &[u8]) -> Option<String> {
        use gix::bstr::ByteSlice as _;
        let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
        for n in 1..=comps.len() {
            let sub = comps[..n].join(&b'/');
            let sub = sub.as_bstr();
            let basename = sub.rfind_byte(b'/').map(|p| p + 1);
            let m = gix_ignore::search::pattern_matching_relative_path(
                &self.list,
                sub,
                basename,
                Some(n < comps.len()),
                gix_ignore::glob::pattern::Case::Sensitive,
            );
            if let Some(m) = m
                && !m.pattern.is_negative()
            {
                return Some(m.pattern.text.to_str_lossy().into_owned());
            }
        }
        None
    }

    /// The refusals of `items`: one per path a pattern excludes.
    pub fn refusals(&self, items: &[Item]) -> Vec<Refusal> {
        items
            .iter()
            .filter_map(|i| {
                self.matching(&i.path).map(|pat| Refusal {
                    path: shown(&i.path),
                    why: format!("the project excludes {pat} (excludes)"),
                })
            })
            .collect()
    }
}

/// `cmd=PROGRAM`: runs the host's program (not in a workspace: in `/`, with git's hardened
/// environment), the paths on stdin one a line; a non-zero exit refuses every path with the
/// program's message.
pub fn cmd(items: &[Item], program: &str) -> Vec<Refusal> {
    let mut c = Command::new(program);
    super::harden(&mut c);
    c.current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let refuse_all = |why: String| {
        if items.is_empty() {
            return vec![Refusal {
                path: String::new(),
                why,
            }];
        }
        items
            .iter()
            .map(|i| Refusal {
                path: shown(&i.path),
                why: why.clone(),
            })
            .collect()
    };
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => return refuse_all(format!("gate cmd={program} cannot run: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let mut input = Vec::new();
        for i in items {
            input.extend_from_slice(&i.path);
            input.push(b'\n');
        }
        // A program that does not read its input is answered by its exit status alone.
        let _ = stdin.write_all(&input);
    }
    let out = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => return refuse_all(format!("gate cmd={program} failed: {e}")),
    };
    if out.status.success() {
        return vec![];
    }
    let text = [out.stderr, out.stdout].concat();
    let msg = String::from_utf8_lossy(&text)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    refuse_all(format!(
        "gate cmd={program} refused ({}): {msg}",
        out.status
    ))
}

/// Runs every gate (excludes first) and returns all refusals.
pub fn run(items: &[Item], gates: &[Gate], ignored: impl FnMut(&[u8]) -> bool) -> Vec<Refusal> {
    let mut out = excludes(items, ignored);
    for g in gates {
        out.extend(match g {
            Gate::SecretNames => secret_names(items),
            Gate::MaxSize(m) => max_size(items, *m),
            Gate::Cmd(p) => cmd(items, p),
        });
    }
    out
}

/// One error line naming each refused path and why.
pub fn refused_message(what: &str, refusals: &[Refusal]) -> String {
    let list: Vec<String> = refusals
        .iter()
        .map(|r| {
            if r.path.is_empty() {
                r.why.clone()
            } else {
                format!("{}: {}", r.path, r.why)
            }
        })
        .collect();
    format!("{what} refused by the gates: {}", list.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(p: &str, size: u64) -> Item {
        Item {
            path: p.as_bytes().to_vec(),
            size,
        }
    }

    #[test]
    fn parses_known_gates_and_refuses_unknown() {
        assert_eq!(parse("secret-names"), Ok(Gate::SecretNames));
        assert_eq!(parse("max-size=10"), Ok(Gate::MaxSize(10)));
        assert_eq!(parse("cmd=/bin/true"), Ok(Gate::Cmd("/bin/true".into())));
        assert!(parse("max-size=ten").is_err());
        assert!(parse("max-size").is_err());
        assert!(parse("cmd=").is_err());
        assert!(
            parse("secrets")
                .unwrap_err()
                .to_string()
                .contains("unknown gate")
        );
    }

    #[test]
    fn secret_names_match_the_conventions_only() {
        for p in [
            ".env",
            "app/.env.local",
            ".npmrc",
            "x/.pypirc",
            "tls/server.pem",
            "a.key",
            "home/id_rsa",
            "id_rsa.pub",
            "cfg/credentials.json",
        ] {
            assert!(is_secret_name(p.as_bytes()), "{p}");
        }
        for p in [
            "env",
            "src/environment.rs",
            "keys.txt",
            "pem/readme",
            "my.env",
        ] {
            assert!(!is_secret_name(p.as_bytes()), "{p}");
        }
        let r = secret_names(&[item("a.txt", 1), item("deploy/.env", 1)]);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].path, "deploy/.env");
    }

    #[test]
    fn max_size_refuses_only_larger_blobs() {
        let r = max_size(&[item("small", 10), item("big", 11)], 10);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].path, "big");
        assert!(r[0].why.contains("11 bytes"));
    }

    #[test]
    fn excludes_names_ignored_paths() {
        let r = excludes(&[item("a.log", 1), item("a.txt", 1)], |p| {
            p.ends_with(b".log")
        });
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].path, "a.log");
    }

    #[test]
    fn cmd_gate_passes_on_zero_and_refuses_with_the_message() {
        assert!(cmd(&[item("a", 1)], "/bin/true").is_empty());
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("check");
        std::fs::write(
            &prog,
            "#!/bin/sh\nwhile read p; do case \"$p\" in *bad*) echo \"no $p\" >&2; exit 3;; esac; done\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let p = prog.to_str().unwrap();
        assert!(cmd(&[item("good", 1)], p).is_empty());
        let r = cmd(&[item("good", 1), item("bad.txt", 1)], p);
        assert_eq!(r.len(), 2);
        assert!(r[0].why.contains("no bad.txt"), "{:?}", r);
    }
}
