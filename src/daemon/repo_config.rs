//! A repository record's `.git/config` across trust boundaries (docs/security.md, "A record's
//! config"; docs/lifecycle.md "The repository record"). The config is the one file of `.git` that
//! makes git run things (`core.pager`, `core.hooksPath`, `alias.* = !…`, `diff.<d>.textconv`,
//! `include.path`, …), so it travels byte for byte only where the daemon can prove the record is
//! the owner's own: a snapshot made on this host from a workspace of the same owner (uid) as the
//! workspace it is written into. Anything else — a snapshot fetched from the share, a fork or
//! teleport to another owner, a snapshot with no mark — has its config reduced to an allowlist of
//! keys git never executes nor uses to find code or data outside the repository ([`filter`]).
//!
//! Owns: the allowlist and the filter (the config parsed as data with gix's parser, includes never
//! read, only allowed keys written out again; a config that does not parse is dropped whole), and
//! the marks `<state>/own-snapshots/<thread>` (`<snapshot> <uid>`: the thread's last snapshot made
//! here from its owner's live workspace, or filed here by a fork or teleport of the same owner's
//! own). Must not: run git, read a workspace or a mirror, follow what a config names.

use std::path::PathBuf;

use gix::bstr::{BStr, BString, ByteSlice as _};
use gix::config::parse::{EventRef, Events};

use crate::layout::Layout;

/// What `core.fsmonitor` says in a record for octofs's own hook (`repo_record` writes it; a
/// resume replaces it with the new workspace's command). Any other value is a command.
pub(super) const FSMONITOR_TOKEN: &str = "octofs-fsmonitor-of-this-workspace";

/// How far a record's config is trusted where it is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trust {
    /// Made on this host from a workspace of the same owner: byte for byte.
    Own,
    /// From the share, another owner, or not provably either: allowlisted keys only.
    Foreign,
}

/// A config after [`filter`]: the bytes to write (`None`: nothing of it is kept) and the names of
/// the keys left out (`section[.subsection].key`, lower case but the subsection).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Filtered {
    pub bytes: Option<Vec<u8>>,
    pub dropped: Vec<String>,
    /// The config did not parse: dropped whole.
    pub unparsable: bool,
}

/// Whether git may be given `section[.sub].key = value` from a record it cannot trust: git never
/// runs it, never reads a file or a program it names, never turns it into a command. An
/// allowlist: a key git adds tomorrow is left out until it is here.
fn allowed(section: &str, sub: Option<&BStr>, key: &str, value: Option<&BStr>) -> bool {
    let s = section.to_ascii_lowercase();
    let k = key.to_ascii_lowercase();
    let k = k.as_str();
    match (s.as_str(), sub.is_some()) {
        ("core", false) => match k {
            "repositoryformatversion"
            | "filemode"
            | "logallrefupdates"
            | "ignorecase"
            | "precomposeunicode"
            | "autocrlf"
            | "eol"
            | "safecrlf"
            | "quotepath"
            | "symlinks"
            | "untrackedcache"
            | "fsmonitorhookversion"
            | "abbrev"
            | "whitespace"
            | "commentchar"
            | "commentstring" => true,
            // A bare repository in a workspace is no workspace (and git would look elsewhere).
            "bare" => value.is_some_and(|v| gix::config::Boolean::try_from(v).is_ok_and(|b| !b.0)),
            // octofs's own hook only: the resume writes this workspace's command for it.
            "fsmonitor" => value.is_some_and(|v| v == FSMONITOR_TOKEN),
            _ => false,
        },
        ("user", false) => matches!(k, "name" | "email" | "useconfigonly"),
        ("author" | "committer", false) => matches!(k, "name" | "email"),
        ("remote", true) => matches!(
            k,
            "url"
                | "pushurl"
                | "fetch"
                | "push"
                | "tagopt"
                | "prune"
                | "prunetags"
                | "mirror"
                | "skipdefaultupdate"
                | "skipfetchall"
        ),
        ("branch", true) => matches!(
            k,
            "remote" | "merge" | "rebase" | "pushremote" | "description"
        ),
        ("init", false) => k == "defaultbranch",
        ("pull", false) => matches!(k, "rebase" | "ff"),
        ("push", false) => matches!(k, "default" | "followtags" | "autosetupremote"),
        ("fetch", false) => matches!(k, "prune" | "prunetags"),
        ("merge", false) => matches!(k, "ff" | "conflictstyle"),
        ("rebase", false) => matches!(k, "autostash" | "autosquash" | "updaterefs"),
        ("diff", false) => matches!(
            k,
            "renames"
                | "algorithm"
                | "noprefix"
                | "mnemonicprefix"
                | "context"
                | "indentheuristic"
                | "renamelimit"
        ),
        ("commit", false) => matches!(k, "gpgsign" | "verbose" | "status" | "cleanup"),
        ("tag", false) => matches!(k, "gpgsign" | "sort"),
        ("i18n", false) => matches!(k, "commitencoding" | "logoutputencoding"),
        // Presentation only: colors, what `status` and `log` show, hints.
        ("color", _) => true,
        ("status" | "log" | "advice", false) => true,
        _ => false,
    }
}

/// How a key is shown in a warning: one line, printable.
fn shown(section: &str, sub: Option<&BStr>, key: &str) -> String {
    let mut out = section.to_ascii_lowercase();
    if let Some(sub) = sub {
        out.push('.');
        out.extend(
            sub.to_str_lossy()
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .take(64),
        );
    }
    out.push('.');
    out.push_str(&key.to_ascii_lowercase());
    out
}

/// One key of a section as the parser gave it: its name and value (`None`: the key alone, which
/// git reads as `true`), the value unquoted and unescaped.
type Pair = (String, Option<BString>);

/// The keys of one section's events, in order.
fn pairs<'a>(events: impl Iterator<Item = EventRef<'a>>) -> Vec<Pair> {
    let mut out: Vec<Pair> = Vec::new();
    // The key being read: its name, whether `=` followed, the value so far.
    let mut open: Option<(String, bool, BString)> = None;
    let close = |open: &mut Option<(String, bool, BString)>, out: &mut Vec<Pair>| {
        if let Some((k, sep, v)) = open.take() {
            let value = sep.then(|| gix::config::value::normalize(v.as_bstr()).into_owned());
            out.push((k, value));
        }
    };
    for e in events {
        match e {
            EventRef::SectionValueName(k) => {
                close(&mut open, &mut out);
                open = Some((k.to_str_lossy().into_owned(), false, BString::default()));
            }
            EventRef::KeyValueSeparator => {
                if let Some(o) = open.as_mut() {
                    o.1 = true;
                }
            }
            EventRef::Value(v) | EventRef::ValueDone(v) => {
                if let Some(o) = open.as_mut() {
                    o.2.extend_from_slice(v);
                }
                close(&mut open, &mut out);
            }
            EventRef::ValueNotDone(v) => {
                if let Some(o) = open.as_mut() {
                    o.2.extend_from_slice(v);
                }
            }
            _ => {}
        }
    }
    close(&mut open, &mut out);
    out
}

/// `config` reduced to the allowlisted keys ([`allowed`]), each with its values in its section
/// (sections and keys in their order; a section left with nothing is left out), written out
/// again by gix (quoting and escaping its own). Includes are never read: `include.*` and
/// `includeIf.*` are keys like any other, and not allowed. A config that does not parse, or that
/// cannot be written out again, is dropped whole. Never panics, whatever the bytes.
pub(super) fn filter(config: &[u8]) -> Filtered {
    let whole = |dropped: &str| Filtered {
        bytes: None,
        dropped: vec![dropped.to_string()],
        unparsable: true,
    };
    let Ok(events) = Events::from_bytes(config, None) else {
        return whole("the whole file (it does not parse as a git config)");
    };
    let mut out = gix::config::File::default();
    let mut dropped: Vec<String> = Vec::new();
    for section in events.sections() {
        let EventRef::SectionHeader {
            name,
            separator,
            subsection_name,
        } = section.header()
        else {
            continue;
        };
        let name = name.to_str_lossy().into_owned();
        // `[remote.Origin]` (the old form) is `remote.origin` to git.
        let legacy = separator.is_some_and(|s| s == ".");
        let sub: Option<BString> = subsection_name.map(|s| {
            if legacy {
                s.to_ascii_lowercase().into()
            } else {
                s.to_owned()
            }
        });
        let keys = pairs(section.body());
        let (keep, drop): (Vec<Pair>, Vec<Pair>) = keys.into_iter().partition(|(k, v)| {
            allowed(
                &name,
                sub.as_ref().map(|s| s.as_bstr()),
                k,
                v.as_ref().map(|v| v.as_bstr()),
            )
        });
        for (k, _) in &drop {
            let s = shown(&name, sub.as_ref().map(|s| s.as_bstr()), k);
            if !dropped.contains(&s) {
                dropped.push(s);
            }
        }
        if keep.is_empty() {
            continue;
        }
        let Ok(mut new) = out.new_section(name.as_str(), sub.clone()) else {
            return whole("the whole file (a section cannot be written again)");
        };
        for (k, v) in &keep {
            if new
                .push(k.as_str(), v.as_ref().map(|v| v.as_bstr()))
                .is_err()
            {
                return whole("the whole file (a key cannot be written again)");
            }
        }
    }
    let bytes: Vec<u8> = out.to_bstring().into();
    Filtered {
        bytes: (!bytes.is_empty()).then_some(bytes),
        dropped,
        unparsable: false,
    }
}

/// `<state>/own-snapshots/<thread>`.
fn mark_path(layout: &Layout, thread: &str) -> PathBuf {
    layout.own_snapshot(thread)
}

/// Records that `snapshot` of `thread` is its owner `uid`'s own, made on this host (replacing the
/// thread's previous mark). Not synced: a mark lost to a power loss only means the next resume
/// filters the config. A failure is logged, never an error (the same fallback).
pub(super) fn mark_own(layout: &Layout, thread: &str, snapshot: &str, uid: u32) {
    let path = mark_path(layout, thread);
    let line = format!("{snapshot} {uid}\n");
    // An unchanged snapshot (nothing written since) has its mark already.
    if std::fs::read(&path).is_ok_and(|b| b == line.as_bytes()) {
        return;
    }
    let done = path
        .parent()
        .map_or(Ok(()), crate::layout::create_private_dir)
        .and_then(|()| crate::records::Staged::write(&path, line.as_bytes()))
        .and_then(|s| s.publish().map(|_| ()));
    if let Err(e) = done {
        tracing::warn!(%thread, %snapshot, "cannot mark the snapshot as its owner's own (its config will be filtered on resume): {e}");
    }
}

/// Removes `thread`'s mark (a new thread whose first snapshot is not provably its owner's).
pub(super) fn forget(layout: &Layout, thread: &str) {
    let _ = std::fs::remove_file(mark_path(layout, thread));
}

/// How far the record of `snapshot`, resumed into `thread`'s workspace of owner `uid`, is
/// trusted: [`Trust::Own`] only when the thread's mark names that snapshot and that owner.
pub(super) fn trust(layout: &Layout, thread: &str, snapshot: &str, uid: u32) -> Trust {
    let Ok(text) = std::fs::read_to_string(mark_path(layout, thread)) else {
        return Trust::Foreign;
    };
    let mut parts = text.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(s), Some(u), None) if s == snapshot && u.parse::<u32>() == Ok(uid) => Trust::Own,
        _ => Trust::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(config: &str) -> String {
        String::from_utf8(filter(config.as_bytes()).bytes.unwrap_or_default()).unwrap()
    }

    /// What git itself reads of `bytes` (`git config --file … --list`, includes off).
    fn git_reads(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("config");
        std::fs::write(&f, bytes).unwrap();
        let out = std::process::Command::new("git")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["config", "--no-includes", "--file"])
            .arg(&f)
            .arg("--list")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    const EVIL: &str = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\
        \tbare = false\n\tlogallrefupdates = true\n\tfsmonitor = octofs-fsmonitor-of-this-workspace\n\
        \tfsmonitorHookVersion = 2\n\tuntrackedCache = true\n\thooksPath = /tmp/h\n\
        \tpager = touch /tmp/p; less\n\teditor = vi\n\tsshCommand = ssh -oProxyCommand=x\n\
        \tworktree = /etc\n\
        [remote \"o\"]\n\turl = https://example.invalid/x.git\n\
        \tfetch = +refs/heads/*:refs/remotes/o/*\n\tfetch = +refs/tags/*:refs/tags/*\n\
        \tuploadpack = touch /tmp/u\n\treceivepack = x\n\tvcs = evil\n\
        [branch \"main\"]\n\tremote = o\n\tmerge = refs/heads/main\n\
        [user]\n\tname = Agent Smith\n\temail = smith@example.invalid\n\tsigningKey = /root/.ssh/id\n\
        [alias]\n\tx = !touch /tmp/a\n\
        [diff]\n\trenames = copies\n\texternal = touch /tmp/e\n\
        [diff \"x\"]\n\ttextconv = touch /tmp/t\n\
        [filter \"lfs\"]\n\tclean = touch /tmp/c\n\
        [include]\n\tpath = /tmp/inc\n\
        [includeIf \"gitdir:/\"]\n\tpath = /tmp/inc2\n\
        [credential]\n\thelper = !touch /tmp/cr\n\
        [color \"diff\"]\n\tmeta = blue bold\n\
        [status]\n\tshowUntrackedFiles = no\n\
        [commit]\n\tgpgSign = true\n\ttemplate = /etc/shadow\n\
        [gpg]\n\tprogram = touch /tmp/g\n";

    #[test]
    fn only_allowlisted_keys_are_kept_with_their_values_and_sections() {
        let f = filter(EVIL.as_bytes());
        assert!(!f.unparsable);
        let read = git_reads(f.bytes.as_deref().unwrap());
        assert_eq!(
            read,
            "core.repositoryformatversion=0\ncore.filemode=true\ncore.bare=false\n\
             core.logallrefupdates=true\ncore.fsmonitor=octofs-fsmonitor-of-this-workspace\n\
             core.fsmonitorhookversion=2\ncore.untrackedcache=true\n\
             remote.o.url=https://example.invalid/x.git\n\
             remote.o.fetch=+refs/heads/*:refs/remotes/o/*\nremote.o.fetch=+refs/tags/*:refs/tags/*\n\
             branch.main.remote=o\nbranch.main.merge=refs/heads/main\n\
             user.name=Agent Smith\nuser.email=smith@example.invalid\n\
             diff.renames=copies\ncolor.diff.meta=blue bold\nstatus.showuntrackedfiles=no\n\
             commit.gpgsign=true\n"
        );
        for gone in [
            "core.hookspath",
            "core.pager",
            "core.editor",
            "core.sshcommand",
            "core.worktree",
            "remote.o.uploadpack",
            "remote.o.receivepack",
            "remote.o.vcs",
            "user.signingkey",
            "alias.x",
            "diff.external",
            "diff.x.textconv",
            "filter.lfs.clean",
            "include.path",
            "includeif.gitdir:/.path",
            "credential.helper",
            "commit.template",
            "gpg.program",
        ] {
            assert!(
                f.dropped.contains(&gone.to_string()),
                "{gone}: {:?}",
                f.dropped
            );
        }
        // The pager's value is nowhere in what is kept.
        assert!(!read.contains("touch"));
    }

    #[test]
    fn an_fsmonitor_other_than_octofs_own_and_a_bare_repository_are_left_out() {
        let k =
            kept("[core]\n\tfsmonitor = touch /tmp/f\n\tbare = true\n\tbare\n\tfilemode = false\n");
        assert_eq!(git_reads(k.as_bytes()), "core.filemode=false\n");
    }

    #[test]
    fn values_that_need_quoting_stay_exactly_what_git_read() {
        // Quotes, escapes, a continuation, `#` and `;`, surrounding spaces, and a value that
        // tries to open a section of its own: git reads the filtered file as it read the original
        // (for the kept keys), and reads no other key.
        let tricky = "[user]\n\tname = \" A \\\"q\\\" # ; b \"\n\temail = a\\\n@b\n\
                      [branch \"we\\\"ird\\\\name\"]\n\tdescription = line1\\nline2\\n[core]\\n\tpager = x\n\
                      [remote \"o\"]\n\turl\n";
        let f = filter(tricky.as_bytes());
        let want: String = git_reads(tricky.as_bytes())
            .lines()
            .filter(|l| !l.starts_with("remote.o.url"))
            .map(|l| format!("{l}\n"))
            .collect();
        let got = git_reads(f.bytes.as_deref().unwrap());
        // (`remote.o.url` alone is a key without a value: git reads it as "true"; kept alone.)
        assert_eq!(got.replace("remote.o.url\n", ""), want);
        assert!(!got.contains("core.pager"), "{got}");
    }

    #[test]
    fn a_legacy_subsection_is_the_lower_case_one_git_reads() {
        let k = kept("[remote.Origin]\n\turl = x\n[alias.y]\n\tz = !sh\n");
        assert_eq!(git_reads(k.as_bytes()), "remote.origin.url=x\n");
    }

    #[test]
    fn non_utf8_values_are_kept_and_odd_bytes_never_panic() {
        let mut cfg =
            b"[user]\n\tname = caf\xe9 \xff\n[remote \"\xfe\"]\n\turl = \xc3\x28\n".to_vec();
        let f = filter(&cfg);
        assert!(!f.unparsable);
        let bytes = f.bytes.unwrap();
        assert!(bytes.windows(5).any(|w| w == b"caf\xe9 "), "{bytes:?}");
        assert!(bytes.windows(2).any(|w| w == b"\xc3\x28"));
        // Every prefix, and some garbage: a result or "dropped whole", never a panic.
        cfg.extend_from_slice(b"[alias]\n\tx = !sh\n[\"\n\0\x01=\n[core\n\tpager = x\n");
        for n in 0..=cfg.len() {
            let f = filter(&cfg[..n]);
            if let Some(b) = &f.bytes {
                assert!(!b.windows(5).any(|w| w == b"pager"));
                assert!(!b.windows(5).any(|w| w == b"alias"));
            }
        }
        for junk in [
            &b"\0\0\0"[..],
            b"[",
            b"[a \"b",
            b"= x",
            b"\xff\xfe[core]\n",
            b"[core]\n\t\xff = 1\n",
        ] {
            let _ = filter(junk);
        }
    }

    #[test]
    fn a_config_that_does_not_parse_is_dropped_whole() {
        let f = filter(b"[core\n\tpager = x\n");
        assert!(f.unparsable && f.bytes.is_none(), "{f:?}");
        assert_eq!(f.dropped.len(), 1);
    }

    #[test]
    fn an_empty_or_all_dropped_config_writes_nothing() {
        assert_eq!(filter(b"").bytes, None);
        assert_eq!(filter(b"[alias]\n\tx = !sh\n").bytes, None);
    }

    #[test]
    fn a_mark_trusts_one_snapshot_of_one_owner() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            state: dir.path().to_path_buf(),
            root: dir.path().join("root"),
        };
        assert_eq!(trust(&layout, "t", "abc", 7), Trust::Foreign);
        mark_own(&layout, "t", "abc", 7);
        assert_eq!(trust(&layout, "t", "abc", 7), Trust::Own);
        assert_eq!(trust(&layout, "t", "abd", 7), Trust::Foreign);
        assert_eq!(trust(&layout, "t", "abc", 0), Trust::Foreign);
        assert_eq!(trust(&layout, "u", "abc", 7), Trust::Foreign);
        forget(&layout, "t");
        assert_eq!(trust(&layout, "t", "abc", 7), Trust::Foreign);
    }
}
