//! How answers are printed: one line of the daemon's JSON answer, as it came, with `--json`, or
//! text for people ([`Text`]), through one helper ([`emit`]); and the small formats the text shares
//! (short ids, sizes, ages, who may bind a project). Prints to stdout only; never asks the daemon.

use octofs::client::Answered;
use octofs::proto::Access;

/// An answer as text for people, printed to stdout; an answer that reports a failure (a layer
/// that did not build) prints it, then says so as the command's error.
pub trait Text {
    fn print(self) -> Result<(), String>;
}

/// `--json`: the daemon's answer on one line, as it came; else the answer as text.
pub fn emit<A: Text>(a: Answered<A>, json: bool) -> Result<(), String> {
    if json {
        println!("{}", a.result);
        Ok(())
    } else {
        a.answer.print()
    }
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// How long ago, in the largest whole unit.
pub fn ago(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s if s < 172_800 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

/// The first 12 characters of an object id (all of a shorter or odd one: never a cut mid-character).
pub fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// Who may bind a project, on one line: `anyone`, or `users=a,b groups=g` (names where the host
/// has them).
pub fn access_line(a: &Access) -> String {
    if a.is_open() {
        return "anyone".into();
    }
    let mut parts = Vec::new();
    if !a.users.is_empty() {
        let users: Vec<String> = a
            .users
            .iter()
            .map(|u| octofs::access::user_label(*u))
            .collect();
        parts.push(format!("users={}", users.join(",")));
    }
    if !a.groups.is_empty() {
        let groups: Vec<String> = a.groups.iter().map(|g| g.to_string()).collect();
        parts.push(format!("groups={}", groups.join(",")));
    }
    parts.join(" ")
}

/// A mount's I/O mode and why (`no-open (auto: 210 MiB of 4.0 GiB budget)`), for `status` and
/// `stats`; none when not mounted.
pub fn io_shown(io: Option<&str>, why: Option<&str>) -> Option<String> {
    Some(match (io?, why) {
        (io, Some(why)) => format!("{io} ({why})"),
        (io, None) => io.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_ids_never_cut_a_character() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
        // 13 bytes, byte 12 inside the last 'é': shown whole (slicing at 12 panicked).
        assert_eq!(short("aéééééé"), "aéééééé");
    }
}
