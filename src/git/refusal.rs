//! Why the git layer refused a request before changing anything (an upstream, a remote, a
//! credential, an exclude pattern, publishing a mirror), as data. Its `Display` is the one line
//! the CLI prints, byte for byte as when it was text.
//!
//! Owns only the refusals' shapes and texts; must not do I/O (what a refusal names is found by
//! whoever refuses).

use std::path::PathBuf;

/// A refusal of the git layer.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("upstream must not be empty")]
    EmptyUpstream,
    #[error("upstream {upstream:?} must not start with '-' (git would read it as an option)")]
    OptionLike { upstream: String },
    #[error("upstream {upstream:?} contains a NUL or a newline")]
    ControlCharacter { upstream: String },
    #[error(
        "upstream {upstream}: remote helpers ({helper}::) are not allowed; use a path or a file://, git://, http(s):// or ssh URL"
    )]
    RemoteHelper { upstream: String, helper: String },
    #[error(
        "upstream {upstream}: transport {scheme:?} is not allowed (allowed: file, git, http, https, ssh)"
    )]
    Transport { upstream: String, scheme: String },
    #[error(
        "upstream path {upstream} is relative: give an absolute path (the octofs command resolves it against its working directory)"
    )]
    Relative { upstream: String },
    #[error("upstream {upstream} does not exist")]
    Missing { upstream: String },
    #[error("upstream {upstream} is not a git repository or a directory")]
    NotARepository { upstream: String },
    /// A repository another user owns (`daemon_user` is the daemon's, described when refused).
    #[error(
        "the repository {path} belongs to {owner}, not to the daemon's user ({daemon_user}): git reads no repository another user owns; add a clone the daemon's user owns (git clone --bare), or serve it over ssh, git:// or http(s)"
    )]
    NotOurs {
        path: String,
        owner: String,
        daemon_user: String,
    },
    #[error(
        "upstream {upstream}: a password in the URL is only supported over http(s) (use an ssh key)"
    )]
    PasswordNotHttp { upstream: String },
    #[error("upstream {upstream} carries a password and a credential file was given: use one")]
    TwoCredentials { upstream: String },
    #[error("upstream {upstream}: credentials are only used with http(s) upstreams")]
    CredentialNotHttp { upstream: String },
    #[error("the credential file is empty")]
    EmptyCredential,
    #[error("the credential file must hold one line: a token or user:token")]
    CredentialLines,
    #[error("{pattern:?} is not an exclude pattern (one gitignore line, not empty, not a comment)")]
    BadExclude { pattern: String },
    #[error(
        "project {project}'s upstream {upstream} is a plain directory, not a repository: give --remote"
    )]
    FolderUpstream { project: String, upstream: String },
    #[error("a remote given on the command line may not carry credentials")]
    RemoteCredentials,
    #[error("remote {url:?}: give `origin`, a URL or an absolute path")]
    BadRemote { url: String },
    #[error("a share remote may not carry credentials")]
    ShareCredentials,
    #[error("share remote {url:?}: give a URL or an absolute path")]
    BadShare { url: String },
    #[error("cannot publish mirror {}: {source}", .dest.display())]
    Publish {
        dest: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot move the broken mirror {} aside: {source}", .dest.display())]
    MoveAside {
        dest: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot re-create the mirror of {project}: {error}")]
    Recreate {
        project: String,
        error: Box<super::Error>,
    },
}

impl From<Refusal> for super::Error {
    fn from(r: Refusal) -> super::Error {
        super::Error::Refused(Box::new(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal's line, byte for byte as the git layer wrote it when it was text.
    #[test]
    fn each_refusal_keeps_its_line() {
        let io = || std::io::Error::from_raw_os_error(libc::EXDEV);
        let u = || "https://h/r.git".to_string();
        let cases: Vec<(Refusal, &str)> = vec![
            (Refusal::EmptyUpstream, "upstream must not be empty"),
            (
                Refusal::OptionLike {
                    upstream: "-x".into(),
                },
                "upstream \"-x\" must not start with '-' (git would read it as an option)",
            ),
            (
                Refusal::ControlCharacter {
                    upstream: "a\nb".into(),
                },
                "upstream \"a\\nb\" contains a NUL or a newline",
            ),
            (
                Refusal::RemoteHelper {
                    upstream: "ext::sh".into(),
                    helper: "ext".into(),
                },
                "upstream ext::sh: remote helpers (ext::) are not allowed; use a path or a file://, git://, http(s):// or ssh URL",
            ),
            (
                Refusal::Transport {
                    upstream: "ftp://h/r".into(),
                    scheme: "ftp".into(),
                },
                "upstream ftp://h/r: transport \"ftp\" is not allowed (allowed: file, git, http, https, ssh)",
            ),
            (
                Refusal::Relative {
                    upstream: "r".into(),
                },
                "upstream path r is relative: give an absolute path (the octofs command resolves it against its working directory)",
            ),
            (
                Refusal::Missing {
                    upstream: "/srv/r".into(),
                },
                "upstream /srv/r does not exist",
            ),
            (
                Refusal::NotARepository {
                    upstream: "/srv/r".into(),
                },
                "upstream /srv/r is not a git repository or a directory",
            ),
            (
                Refusal::NotOurs {
                    path: "/srv/r".into(),
                    owner: "uid 7".into(),
                    daemon_user: "uid 0 (root)".into(),
                },
                "the repository /srv/r belongs to uid 7, not to the daemon's user (uid 0 (root)): git reads no repository another user owns; add a clone the daemon's user owns (git clone --bare), or serve it over ssh, git:// or http(s)",
            ),
            (
                Refusal::PasswordNotHttp { upstream: u() },
                "upstream https://h/r.git: a password in the URL is only supported over http(s) (use an ssh key)",
            ),
            (
                Refusal::TwoCredentials { upstream: u() },
                "upstream https://h/r.git carries a password and a credential file was given: use one",
            ),
            (
                Refusal::CredentialNotHttp { upstream: u() },
                "upstream https://h/r.git: credentials are only used with http(s) upstreams",
            ),
            (Refusal::EmptyCredential, "the credential file is empty"),
            (
                Refusal::CredentialLines,
                "the credential file must hold one line: a token or user:token",
            ),
            (
                Refusal::BadExclude {
                    pattern: "#x".into(),
                },
                "\"#x\" is not an exclude pattern (one gitignore line, not empty, not a comment)",
            ),
            (
                Refusal::FolderUpstream {
                    project: "p".into(),
                    upstream: "/srv/p".into(),
                },
                "project p's upstream /srv/p is a plain directory, not a repository: give --remote",
            ),
            (
                Refusal::RemoteCredentials,
                "a remote given on the command line may not carry credentials",
            ),
            (
                Refusal::BadRemote { url: "r".into() },
                "remote \"r\": give `origin`, a URL or an absolute path",
            ),
            (
                Refusal::ShareCredentials,
                "a share remote may not carry credentials",
            ),
            (
                Refusal::BadShare { url: "r".into() },
                "share remote \"r\": give a URL or an absolute path",
            ),
            (
                Refusal::Publish {
                    dest: "/m/p".into(),
                    source: io(),
                },
                "cannot publish mirror /m/p: Invalid cross-device link (os error 18)",
            ),
            (
                Refusal::MoveAside {
                    dest: "/m/p".into(),
                    source: io(),
                },
                "cannot move the broken mirror /m/p aside: Invalid cross-device link (os error 18)",
            ),
            (
                Refusal::Recreate {
                    project: "p".into(),
                    error: Box::new(super::super::Error::Cancelled),
                },
                "cannot re-create the mirror of p: cancelled; nothing was kept",
            ),
        ];
        for (r, want) in cases {
            assert_eq!(super::super::Error::from(r).to_string(), want);
        }
    }
}
