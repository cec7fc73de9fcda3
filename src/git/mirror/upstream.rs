//! Upstreams come in three kinds — a git URL, a git repository path, a plain directory — and are
//! checked before git sees them: an absolute path or a URL of an allowed transport (`file`, `git`,
//! `http(s)`, `ssh`), never an option (`-…`) nor a remote helper (`fd::`, `ext::`). Decides only;
//! creates nothing.

use crate::git::error::{Context, Error};
use crate::git::refusal::Refusal;
use std::path::Path;

use super::UpstreamKind;
use super::credentials::redact;
use crate::git;

/// Whether `upstream` is a URL (`scheme://…` or scp-like `user@host:path`) rather than a path.
pub fn is_url(upstream: &str) -> bool {
    upstream.contains("://")
        || (upstream.contains(':') && !upstream.starts_with('/') && upstream.contains('@'))
}

/// The URL schemes an upstream may use: the transports of [`crate::git::ALLOWED_PROTOCOLS`] (what
/// `GIT_ALLOW_PROTOCOL` lets every git of the daemon speak), with ssh's aliases.
const ALLOWED_SCHEMES: [&str; 7] = ["file", "git", "http", "https", "ssh", "git+ssh", "ssh+git"];

/// Refuses, before anything is created, an upstream git could read as an option or hand to a remote
/// helper or a transport a project does not need. `shown` is the upstream as messages show it.
pub fn check_upstream(upstream: &str) -> Result<(), Error> {
    let shown = redact(upstream);
    if upstream.is_empty() {
        return Err(Refusal::EmptyUpstream.into());
    }
    if upstream.starts_with('-') {
        return Err(Refusal::OptionLike { upstream: shown }.into());
    }
    if upstream.contains(['\0', '\n']) {
        return Err(Refusal::ControlCharacter { upstream: shown }.into());
    }
    // `<transport>::<address>` makes git run `git-remote-<transport>` (`fd::`, `ext::` run
    // anything): never an upstream.
    if let Some((helper, _)) = upstream.split_once("::")
        && !helper.is_empty()
        && helper
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
    {
        return Err(Refusal::RemoteHelper {
            upstream: shown,
            helper: helper.to_string(),
        }
        .into());
    }
    if let Some((scheme, _)) = upstream.split_once("://")
        && !ALLOWED_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str())
    {
        return Err(Refusal::Transport {
            upstream: shown,
            scheme: scheme.to_string(),
        }
        .into());
    }
    if !is_url(upstream) && !Path::new(upstream).is_absolute() {
        return Err(Refusal::Relative { upstream: shown }.into());
    }
    Ok(())
}

/// Decides what kind of upstream `upstream` names, without creating anything.
pub fn classify(upstream: &str) -> Result<(UpstreamKind, String), Error> {
    check_upstream(upstream)?;
    if is_url(upstream) {
        if let Some(path) = upstream.strip_prefix("file://")
            && !Path::new(path).exists()
        {
            return Err(Refusal::Missing {
                upstream: redact(upstream),
            }
            .into());
        }
        return Ok((UpstreamKind::Url, upstream.to_string()));
    }
    let path = std::path::absolute(upstream).context(|| format!("upstream {upstream}"))?;
    let meta = match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Refusal::Missing {
                upstream: upstream.to_string(),
            }
            .into());
        }
        r => r.context(|| format!("upstream {upstream}"))?,
    };
    if !meta.is_dir() {
        return Err(Refusal::NotARepository {
            upstream: upstream.to_string(),
        }
        .into());
    }
    let shown = path.to_string_lossy().into_owned();
    let is_repo = path.join(".git").exists()
        || (path.join("HEAD").is_file()
            && path.join("objects").is_dir()
            && path.join("refs").is_dir());
    if is_repo {
        match git!(Some(&path); "rev-parse", "--git-dir", "--end-of-options") {
            Ok(_) => {}
            // git's ownership check; its advice names a `safe.directory` the daemon never reads.
            Err(Error::Git(line)) if line.contains("safe.directory") => {
                return Err(super::network::not_ours(
                    &shown,
                    &crate::access::describe_uid(std::os::unix::fs::MetadataExt::uid(&meta)),
                )
                .into());
            }
            r => {
                r.context(|| format!("upstream {upstream} is not a usable git repository"))?;
            }
        }
        Ok((UpstreamKind::Repository, shown))
    } else {
        Ok((UpstreamKind::Directory, shown))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_options_helpers_and_other_transports() {
        for bad in [
            "-oProxyCommand=x",
            "--upload-pack=x",
            "fd::17",
            "ext::sh -c x",
            "ftp://h/x",
            "relative/path",
        ] {
            assert!(check_upstream(bad).is_err(), "{bad}");
        }
        for good in [
            "/abs",
            "https://h/x",
            "git@h:x.git",
            "file:///x",
            "ssh://h/x",
        ] {
            assert!(check_upstream(good).is_ok(), "{good}");
        }
    }
}
