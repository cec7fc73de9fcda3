//! `octofs push`: sending a branch of a mirror to its upstream (or a given remote). The only git
//! command besides clone and fetch that talks to a remote; it runs in the mirror through
//! [`network_git`] (hardened environment, the project's stored credential as a header for its own
//! upstream only, stall timeout). Also the parsing of `--raw` change lists shared with `commit`.
//!
//! Never runs in a workspace, never reads a workspace's configuration.

use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::credentials::{load_credential, redact, split_credentials};
use super::far_side::{self, FarSide};
use super::network::{network_command, network_git_with};
use super::{UpstreamKind, require};
use crate::git::error::Error;
use crate::git::refusal::Refusal;
use crate::layout::Layout;

/// One path a commit changed (`--raw`): its new mode (0: removed) and object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: Vec<u8>,
    pub mode: u32,
    pub id: gix::ObjectId,
}

/// Parses `git diff-tree -r -z --raw` (or `git log -z --raw --format=`) output.
pub fn changes(out: &[u8]) -> Result<Vec<Change>, Error> {
    let mut parts = out.split(|b| *b == 0);
    let mut list = Vec::new();
    while let Some(meta) = parts.next() {
        let meta = String::from_utf8_lossy(meta);
        let meta = meta.trim();
        if meta.is_empty() {
            continue;
        }
        let bad = || Error::Git(format!("unexpected --raw line {meta:?}"));
        let path = parts.next().ok_or_else(bad)?;
        let f: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        if f.len() < 5 {
            return Err(bad());
        }
        let mode = u32::from_str_radix(f[1], 8).map_err(|_| bad())?;
        let id = gix::ObjectId::from_hex(f[3].as_bytes()).map_err(|_| bad())?;
        list.push(Change {
            path: path.to_vec(),
            mode,
            id,
        });
    }
    Ok(list)
}

/// Where a push goes: the URL, and the credential the daemon holds for it (only for the project's
/// own upstream).
pub struct PushTarget {
    /// The remote as it was given (and as messages show it).
    pub url: String,
    /// The project's own upstream (whose branches the mirror has as `refs/remotes/origin/*`).
    pub upstream: bool,
    credential: Option<String>,
    /// Whose authority the far side runs with ([`far_side`]).
    far: FarSide,
    /// Where the far side refuses a repository (the state and the mount root, for a caller's
    /// remote).
    deny: Vec<PathBuf>,
}

/// Environment variables one command adds.
type Env = Vec<(String, String)>;

/// How long `ls-remote` may go without a byte before it is killed.
const LS_REMOTE_STALL_SECS: u64 = 300;

impl PushTarget {
    /// The URL git is given.
    fn git_url(&self) -> String {
        far_side::transport_url(&self.url)
    }

    /// The arguments of `git <sub>` with its far-side options, then `rest`, and the far side's
    /// environment. No hook of the mirror runs either.
    fn argv(&self, sub: &str, rest: &[&OsStr]) -> Result<(Vec<OsString>, Env), Error> {
        let exe = std::env::current_exe().map_err(|e| {
            Error::Git(format!(
                "cannot find the octofs binary for the far side: {e}"
            ))
        })?;
        let (opts, env) = self.far.transport(&exe, sub, &self.url, &self.deny);
        let mut args: Vec<OsString> = ["-c", "core.hooksPath=/dev/null", sub]
            .iter()
            .map(OsString::from)
            .collect();
        args.extend(opts.into_iter().map(OsString::from));
        args.extend(rest.iter().map(|a| a.to_os_string()));
        Ok((args, env))
    }

    /// The command `git <sub> … rest` against the target (for a caller that reads its output).
    fn command(&self, mirror: &Path, sub: &str, rest: &[&OsStr]) -> Result<Command, Error> {
        let (args, env) = self.argv(sub, rest)?;
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let mut cmd = network_command(
            Some(mirror),
            &args,
            &self.url,
            self.credential.as_deref(),
            LS_REMOTE_STALL_SECS,
        );
        cmd.envs(env);
        Ok(cmd)
    }

    /// Runs `git <sub> … rest` against the target with [`network_git_with`]'s stall timeout.
    fn run(&self, mirror: &Path, sub: &str, rest: &[&OsStr]) -> Result<(), Error> {
        let (args, env) = self.argv(sub, rest)?;
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        network_git_with(
            Some(mirror),
            &args,
            &self.url,
            self.credential.as_deref(),
            &env,
        )
    }
}

/// The target of a push of `project`: its upstream (`remote` none or `origin`), or `remote` (a URL
/// without credentials, or an absolute path to a repository) named by a caller whose authority its
/// far side runs with (`far`, [`far_side`]). A caller's remote is never inside the daemon's state
/// or under the mount root.
pub fn push_target(
    layout: &Layout,
    project: &str,
    remote: Option<&str>,
    far: FarSide,
) -> Result<PushTarget, Error> {
    match remote {
        None | Some("origin") => {
            let p = require(layout, project)?;
            if p.kind == UpstreamKind::Directory {
                return Err(Refusal::FolderUpstream {
                    project: project.to_string(),
                    upstream: p.upstream,
                }
                .into());
            }
            Ok(PushTarget {
                credential: load_credential(layout, project)?,
                url: p.upstream,
                upstream: true,
                far: FarSide::Daemon,
                deny: Vec::new(),
            })
        }
        Some(r) => {
            let (url, cred) = split_credentials(r)?;
            if cred.is_some() {
                return Err(Refusal::RemoteCredentials.into());
            }
            if !super::is_url(&url) && !Path::new(&url).is_absolute() {
                return Err(Refusal::BadRemote { url }.into());
            }
            super::check_upstream(&url)?;
            // Compared with the caller's canonical path by the far side; canonical here too.
            let deny = [&layout.state, &layout.root]
                .into_iter()
                .map(|d| d.canonicalize().unwrap_or_else(|_| d.clone()))
                .collect();
            Ok(PushTarget {
                url,
                upstream: false,
                credential: None,
                far,
                deny,
            })
        }
    }
}

/// The commit `branch` names on the target (`None`: no such branch), and that commit fetched into
/// the mirror when it is missing there (for the outgoing range).
pub fn remote_tip(
    mirror: &Path,
    t: &PushTarget,
    branch: &str,
) -> Result<Option<gix::ObjectId>, Error> {
    remote_ref_tip(mirror, t, &format!("refs/heads/{branch}"))
}

/// The commit the ref `full` names on the target (`None`: no such ref), and that commit fetched
/// into the mirror when it is missing there.
pub fn remote_ref_tip(
    mirror: &Path,
    t: &PushTarget,
    full: &str,
) -> Result<Option<gix::ObjectId>, Error> {
    let url = t.git_url();
    let mut cmd = t.command(
        mirror,
        "ls-remote",
        &[OsStr::new("--"), OsStr::new(&url), OsStr::new(full)],
    )?;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(Error::Spawn)?;
    let mut out = Vec::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_end(&mut out)
            .map_err(|e| Error::Git(format!("cannot read git ls-remote: {e}")))?;
    }
    let mut err = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_end(&mut err);
    }
    let status = child.wait().map_err(Error::Spawn)?;
    if !status.success() {
        let e = String::from_utf8_lossy(&err);
        let lines: Vec<&str> = e.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        // The far side's own reason (`fatal: …` first), not git's advice after it.
        let line = lines
            .iter()
            .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
            .or(lines.last())
            .copied()
            .unwrap_or("");
        return Err(Error::Git(format!(
            "cannot read {} of {}: {}",
            full,
            redact(&t.url),
            redact(line)
        )));
    }
    let text = String::from_utf8_lossy(&out);
    let Some(tip) = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .find(|(_, n)| *n == full)
        .and_then(|(id, _)| gix::ObjectId::from_hex(id.as_bytes()).ok())
    else {
        return Ok(None);
    };
    let have = crate::git!(Some(mirror); "cat-file", "-e", &format!("{tip}^{{commit}}")).is_ok();
    if !have {
        t.run(
            mirror,
            "fetch",
            &[
                OsStr::new("--no-tags"),
                OsStr::new("--"),
                OsStr::new(&url),
                OsStr::new(full),
            ],
        )?;
    }
    Ok(Some(tip))
}

/// Pushes `tip` to `branch` of the target, with `--force-with-lease` against exactly `lease` when
/// given (otherwise a fast-forward only). No hooks run.
pub fn push(
    mirror: &Path,
    t: &PushTarget,
    tip: gix::ObjectId,
    branch: &str,
    lease: Option<gix::ObjectId>,
) -> Result<(), Error> {
    let full = format!("refs/heads/{branch}");
    let refspec = format!("{tip}:{full}");
    let lease_arg = lease.map(|l| format!("--force-with-lease={full}:{l}"));
    let url = t.git_url();
    let mut args: Vec<&OsStr> = vec![OsStr::new("--progress"), OsStr::new("--no-verify")];
    if let Some(l) = &lease_arg {
        args.push(OsStr::new(l));
    }
    args.extend([OsStr::new("--"), OsStr::new(&url), OsStr::new(&refspec)]);
    t.run(mirror, "push", &args)
}

/// A share remote as a project stores it: a URL or an absolute path, without credentials.
pub fn check_share(remote: &str) -> Result<String, Error> {
    super::check_upstream(remote)?;
    let (url, cred) = split_credentials(remote)?;
    if cred.is_some() {
        return Err(Refusal::ShareCredentials.into());
    }
    if !super::is_url(&url) && !Path::new(&url).is_absolute() {
        return Err(Refusal::BadShare { url }.into());
    }
    Ok(url)
}

/// The target of a push to (or a fetch from) a share remote (checked by [`check_share`]).
pub fn share_target(remote: &str) -> Result<PushTarget, Error> {
    Ok(PushTarget {
        url: check_share(remote)?,
        upstream: false,
        credential: None,
        far: FarSide::Daemon,
        deny: Vec::new(),
    })
}

/// What a fast-forward push of a ref did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shared {
    /// The remote ref now names the commit (it was missing, or an ancestor of it).
    Pushed,
    /// The remote ref named the commit already: nothing was sent.
    Already,
    /// The remote ref names a commit that descends from ours (ours is behind it): nothing was
    /// sent, and nothing of ours is missing there.
    Behind(gix::ObjectId),
    /// The remote ref names a commit that is neither an ancestor of ours nor descends from it:
    /// nothing was sent.
    Diverged(gix::ObjectId),
}

/// Whether commit `a` is an ancestor of (or is) `b` in the mirror.
pub fn is_ancestor(mirror: &Path, a: gix::ObjectId, b: gix::ObjectId) -> bool {
    crate::git::Git::new(Some(mirror))
        .args(["merge-base", "--is-ancestor", "--end-of-options"])
        .args([a.to_string(), b.to_string()])
        .output_bytes()
        .is_ok()
}

/// Pushes `tip` to the ref `full` of the target as a fast-forward only: a remote ref that names a
/// commit which is not an ancestor of `tip` is never overwritten ([`Shared::Behind`] when it
/// descends from `tip`, [`Shared::Diverged`] otherwise; git's own fast-forward check refuses a
/// race the same way). `forced` refs (`(commit, ref)`) travel in
/// the same atomic push, overwritten (containers that only keep objects reachable); they move
/// only if `full` does. No hooks run.
pub fn push_ref(
    mirror: &Path,
    t: &PushTarget,
    tip: gix::ObjectId,
    full: &str,
    forced: &[(gix::ObjectId, String)],
) -> Result<Shared, Error> {
    let remote = remote_ref_tip(mirror, t, full)?;
    match remote {
        Some(r) if r == tip => return Ok(Shared::Already),
        // The remote's commit is there only if it descends from ours (a fetch of it brought
        // it); one the mirror lacks is not ours to judge: diverged.
        Some(r) if !is_ancestor(mirror, r, tip) => {
            if is_ancestor(mirror, tip, r) {
                return Ok(Shared::Behind(r));
            }
            return Ok(Shared::Diverged(r));
        }
        _ => {}
    }
    let mut specs = vec![format!("{tip}:{full}")];
    specs.extend(forced.iter().map(|(id, r)| format!("+{id}:{r}")));
    let url = t.git_url();
    let mut args: Vec<&OsStr> = vec![
        OsStr::new("--no-verify"),
        OsStr::new("--atomic"),
        OsStr::new("--"),
        OsStr::new(&url),
    ];
    args.extend(specs.iter().map(OsStr::new));
    t.run(mirror, "push", &args)?;
    Ok(Shared::Pushed)
}

/// Fetches the ref `full` of the target into the mirror's `local` ref (overwritten: a ref of the
/// remote's, never one of the mirror's own). Only the objects the mirror lacks travel. `None`: the
/// remote has no such ref (and `local` is left as it was).
pub fn fetch_ref(
    mirror: &Path,
    t: &PushTarget,
    full: &str,
    local: &str,
) -> Result<Option<gix::ObjectId>, Error> {
    let Some(tip) = remote_ref_tip(mirror, t, full)? else {
        return Ok(None);
    };
    let spec = format!("+{full}:{local}");
    let url = t.git_url();
    t.run(
        mirror,
        "fetch",
        &[
            OsStr::new("--no-tags"),
            OsStr::new("--no-write-fetch-head"),
            OsStr::new("--"),
            OsStr::new(&url),
            OsStr::new(&spec),
        ],
    )?;
    Ok(Some(tip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_changes_of_a_diff_and_of_a_log_are_parsed() {
        let z = "0".repeat(40);
        let a = "a".repeat(40);
        let raw = format!(":100644 100755 {z} {a} M\0run.sh\0\n:100644 000000 {a} {z} D\0gone\0");
        let ch = changes(raw.as_bytes()).unwrap();
        assert_eq!(ch.len(), 2);
        assert_eq!(
            (ch[0].path.as_slice(), ch[0].mode),
            (&b"run.sh"[..], 0o100755)
        );
        assert_eq!(ch[1].mode, 0);
        assert!(changes(b":100644\0x\0").is_err());
    }
}
