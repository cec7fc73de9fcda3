//! Validation of thread and project names (docs/usage.md).
//!
//! Every name that reaches a path or a ref goes through [`validate`] first, so that a bad name is refused
//! before any state is touched.

/// A refused name: what it was for, the name, and what to change.
#[derive(Debug, thiserror::Error)]
#[error("invalid {kind} name {name:?}: {why}")]
pub struct InvalidName {
    pub kind: NameKind,
    pub name: String,
    pub why: String,
}

/// The CLI refuses a name with this one line.
impl From<InvalidName> for String {
    fn from(e: InvalidName) -> String {
        e.to_string()
    }
}

/// What a name is used for; only changes the wording of the error.
#[derive(Debug, Clone, Copy)]
pub enum NameKind {
    Thread,
    Project,
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameKind::Thread => "thread",
            NameKind::Project => "project",
        })
    }
}

/// Accepts 1–128 characters of `[A-Za-z0-9._-]`, not starting with `.` or `-`, that are also a valid
/// last component of a git ref: a thread's snapshots live under `refs/octomate/threads/<thread>`, so a
/// name git refuses there (`a..b`, `x.lock`, `z.`) could be opened but never saved or released.
pub fn validate(kind: NameKind, name: &str) -> Result<(), InvalidName> {
    let bad = |why: &str| {
        Err(InvalidName {
            kind,
            name: name.to_string(),
            why: why.to_string(),
        })
    };
    if name.is_empty() {
        return bad("must not be empty");
    }
    if name.len() > 128 {
        return bad("must be at most 128 characters");
    }
    if name.starts_with('.') || name.starts_with('-') {
        return bad("must not start with '.' or '-'");
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return bad(&format!(
            "character {c:?} is not allowed (use A-Z a-z 0-9 . _ -)"
        ));
    }
    // git's own rules (through gix), on the ref the name becomes; the charset above leaves only the
    // rules about dots, which are named here so the error says what to change.
    let full = format!("refs/octomate/threads/{name}");
    if let Err(e) = gix::validate::reference::name(full.as_bytes().into()) {
        use gix::validate::reference::name::Error as E;
        return bad(match e {
            E::RepeatedDot => "must not contain '..' (not a valid git ref name)",
            E::LockFileSuffix => "must not end with '.lock' (not a valid git ref name)",
            E::EndsWithDot => "must not end with '.' (not a valid git ref name)",
            _ => "not a valid git ref name",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_documented_alphabet() {
        for ok in [
            "a",
            "T-1",
            "fix_bug.2",
            "0",
            &"x".repeat(128),
            "a.b",
            "a-",
            "x_lock",
            "x.locked",
            "lock",
            "a.b.c",
        ] {
            assert!(validate(NameKind::Thread, ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else() {
        for bad in [
            "",
            ".hidden",
            "-x",
            "a/b",
            "a b",
            "é",
            "..",
            &"x".repeat(129),
            "a\0b",
            "a..b",
            "x.lock",
            "z.",
            "a.b.",
            "x..",
        ] {
            let err = validate(NameKind::Project, bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid project name"), "{err}");
        }
    }
}
