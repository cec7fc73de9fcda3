//! Credentials (`user:token@` in an http(s) URL, or a credential file) never reach the project
//! record, the mirror's `.git/config` or a workspace: they live in `<state>/credentials/<project>`
//! (0600) and are handed to clone/fetch only through the git child's environment
//! (`http.<origin>.extraHeader`), never on a command line. Every URL that can be printed is redacted
//! ([`redact`]). A record of an older octofs that still holds credentials is migrated when loaded.

use super::{Project, save};
use crate::git;
use crate::git::error::{Context, Error};
use crate::git::refusal::Refusal;
use crate::layout::Layout;

/// Moves the credentials of `p`'s upstream URL into its credentials file, and the URL without them
/// into the mirror's config and the record (in that order: the secret is kept before it is removed
/// elsewhere). Idempotent, so concurrent loads of one record agree.
pub(super) fn migrate_credentials(
    layout: &Layout,
    p: &mut Project,
    clean: String,
) -> Result<(), Error> {
    let project = p.project.clone();
    let fail = || format!("project {project}: cannot move its credentials out of its record");
    if let Ok((_, Some(cred))) = split_credentials(&p.upstream) {
        save_credential(layout, &p.project, &cred).context(fail)?;
    }
    let mirror = layout.mirror(&p.project);
    if mirror.join(".git").is_dir() {
        git!(Some(&mirror); "config", "--", "remote.origin.url", &clean)
            .map_err(|e| redact(&e.to_string()))
            .context(fail)?;
    }
    p.upstream = clean;
    save(layout, p)
        .map_err(|e| redact(&e.to_string()))
        .context(fail)?;
    tracing::info!(project = %p.project, "moved the upstream's credentials into <state>/credentials");
    Ok(())
}

pub(super) fn is_http(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

/// `scheme://`, the userinfo (without its `@`) and the rest of a `scheme://userinfo@host/…` URL.
fn userinfo(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let at = rest[..end].rfind('@')?;
    Some((&url[..scheme.len() + 3], &rest[..at], &rest[at + 1..]))
}

/// `url` without its secret: over http(s) the whole userinfo (a user name there is often a token),
/// elsewhere a password (a bare ssh user name is needed to connect and is no secret).
pub(super) fn redact_url(url: &str) -> String {
    match userinfo(url) {
        Some((scheme, info, rest)) if is_http(url) || info.contains(':') => {
            format!("{scheme}{rest}")
        }
        _ => url.to_string(),
    }
}

/// `text` with the secret of every URL in it removed (git's messages can echo URLs).
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        // The URL starts at its scheme: the run of scheme characters before `://`.
        let start = rest[..i]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || "+.-".contains(*c)))
            .map(|(j, c)| j + c.len_utf8())
            .unwrap_or(0);
        let end = rest[i + 3..]
            .find(|c: char| c.is_whitespace() || "'\"<>`".contains(c))
            .map(|j| i + 3 + j)
            .unwrap_or(rest.len());
        out.push_str(&rest[..start]);
        out.push_str(&redact_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Splits an upstream into the URL to store and the credentials to keep apart (`user:password`,
/// decoded). A password in a non-http URL is refused: no transport of ours would use it.
pub(super) fn split_credentials(upstream: &str) -> Result<(String, Option<String>), Error> {
    let Some((_, info, _)) = userinfo(upstream) else {
        return Ok((upstream.to_string(), None));
    };
    let clean = redact_url(upstream);
    if !is_http(upstream) {
        if info.contains(':') {
            return Err(Refusal::PasswordNotHttp { upstream: clean }.into());
        }
        return Ok((clean, None));
    }
    let (user, password) = info.split_once(':').unwrap_or((info, ""));
    Ok((
        clean,
        Some(format!(
            "{}:{}",
            percent_decode(user),
            percent_decode(password)
        )),
    ))
}

/// The user a bare token from a credential file is sent as, when the URL names none: what GitHub
/// expects, and any name does for GitLab and most servers.
const TOKEN_USER: &str = "x-access-token";

/// The credentials of a credential file: `user:token`, or a bare token sent as `user` (the URL's),
/// else as [`TOKEN_USER`].
pub(super) fn credential_from_file(user: Option<&str>, content: &str) -> Result<String, Error> {
    let c = content.trim_end_matches(['\n', '\r']);
    if c.is_empty() {
        return Err(Refusal::EmptyCredential.into());
    }
    if c.contains(['\n', '\r', '\0']) {
        return Err(Refusal::CredentialLines.into());
    }
    if c.contains(':') {
        return Ok(c.to_string());
    }
    Ok(format!("{}:{c}", user.unwrap_or(TOKEN_USER)))
}

pub(super) fn save_credential(
    layout: &Layout,
    project: &str,
    credential: &str,
) -> Result<(), Error> {
    crate::layout::create_private_dir(&layout.credentials())
        .context(|| format!("cannot create {}", layout.credentials().display()))?;
    crate::records::write_atomic(&layout.credential(project), credential.as_bytes())
        .context(|| format!("cannot save the credentials of {project}"))
}

/// The stored credentials of `project`, if it has any.
pub(super) fn load_credential(layout: &Layout, project: &str) -> Result<Option<String>, Error> {
    match std::fs::read_to_string(layout.credential(project)) {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).context(|| format!("cannot read the credentials of {project}")),
    }
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(T[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The environment that hands `credential` to git for requests to `url`'s origin only: an
/// `Authorization` header set through `GIT_CONFIG_*` (the environment of a root process is readable
/// by root only, unlike a command line).
pub(super) fn credential_env(url: &str, credential: &str) -> Vec<(String, String)> {
    let origin = match url.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            format!("{}://{}/", scheme.to_ascii_lowercase(), &rest[..end])
        }
        None => return Vec::new(),
    };
    vec![
        ("GIT_CONFIG_COUNT".into(), "1".into()),
        (
            "GIT_CONFIG_KEY_0".into(),
            format!("http.{origin}.extraHeader"),
        ),
        (
            "GIT_CONFIG_VALUE_0".into(),
            format!("Authorization: Basic {}", base64(credential.as_bytes())),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_urls_in_text() {
        assert_eq!(
            redact("fatal: unable to access 'https://alice:tok@example.com/a.git/': 403"),
            "fatal: unable to access 'https://example.com/a.git/': 403"
        );
        assert_eq!(
            redact("https://tok@h/x and ssh://git@h/y"),
            "https://h/x and ssh://git@h/y"
        );
        assert_eq!(redact("ssh://git:pw@h:22/y"), "ssh://h:22/y");
        assert_eq!(redact("/srv/repo"), "/srv/repo");
        assert_eq!(redact("http://h/a@b"), "http://h/a@b");
        // A scheme right after a character of more than one byte (the cut must fall between
        // characters).
        assert_eq!(redact("é://u:p@h/x"), "é://h/x");
        assert_eq!(redact("«https://u:p@h/x»"), "«https://h/x»");
    }

    #[test]
    fn splits_credentials() {
        assert_eq!(
            split_credentials("https://al%40ce:t%3Ak@h:8443/x.git").unwrap(),
            ("https://h:8443/x.git".into(), Some("al@ce:t:k".into()))
        );
        assert_eq!(
            split_credentials("https://TOKEN@h/x").unwrap(),
            ("https://h/x".into(), Some("TOKEN:".into()))
        );
        assert_eq!(
            split_credentials("ssh://git@h/x").unwrap(),
            ("ssh://git@h/x".into(), None)
        );
        assert!(split_credentials("ssh://git:pw@h/x").is_err());
        assert_eq!(
            credential_from_file(Some("oauth2"), "tok\n").unwrap(),
            "oauth2:tok"
        );
        assert_eq!(
            credential_from_file(None, "tok").unwrap(),
            "x-access-token:tok"
        );
        assert_eq!(credential_from_file(Some("u"), "v:tok").unwrap(), "v:tok");
    }

    #[test]
    fn base64_matches_the_rfc() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }
}
