//! The command line's own helpers, used by `main.rs` only: what the arguments mean before a
//! request is sent (durations, upstreams, who may bind a project) and how answers are printed for
//! people. Nothing here talks to the daemon.

use std::time::{Duration, Instant};

use octofs::daemon::proto::{self, Access, StatsReport, WorkspaceStatus};

/// Who may bind a project; without any, every local user may.
#[derive(clap::Args)]
pub struct AllowArgs {
    /// A user (name or uid) allowed to bind the project (repeatable)
    #[arg(long = "allow-user", value_name = "USER")]
    pub allow_user: Vec<String>,
    /// A group (name or gid) whose members may bind the project (repeatable)
    #[arg(long = "allow-group", value_name = "GROUP")]
    pub allow_group: Vec<String>,
}

impl AllowArgs {
    pub fn is_empty(&self) -> bool {
        self.allow_user.is_empty() && self.allow_group.is_empty()
    }

    /// Resolves names to ids here, where the caller's user database is.
    pub fn resolve(&self) -> Result<Access, String> {
        let user = |u: &String| match u.parse::<u32>() {
            Ok(id) => Ok(id),
            Err(_) => match octofs::sys::user_by_name(u) {
                Ok(Some((uid, _))) => Ok(uid),
                Ok(None) => Err(format!("no such user {u:?}")),
                Err(e) => Err(format!("cannot look up user {u:?}: {e}")),
            },
        };
        let group = |g: &String| match g.parse::<u32>() {
            Ok(id) => Ok(id),
            Err(_) => match octofs::sys::group_by_name(g) {
                Ok(Some(gid)) => Ok(gid),
                Ok(None) => Err(format!("no such group {g:?}")),
                Err(e) => Err(format!("cannot look up group {g:?}: {e}")),
            },
        };
        Ok(Access {
            users: self.allow_user.iter().map(user).collect::<Result<_, _>>()?,
            groups: self
                .allow_group
                .iter()
                .map(group)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A duration: plain seconds, or a number with s, m, h or d.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (use e.g. 90s, 30m, 2h, 1d)"))?;
    let mult = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("bad duration {s:?} (use e.g. 90s, 30m, 2h, 1d)")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

/// A size: bytes, or with a binary unit `K`, `M`, `G`, `T` (`10G` is 10 GiB; `B`/`iB` may follow).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("bad size {s:?} (use e.g. 4096, 512M, 10G)");
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let unit = unit.trim().to_ascii_uppercase();
    let shift = match unit.trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// An upstream as the daemon must see it: a path is made absolute against the caller's working
/// directory (the daemon's is another); a URL is sent as given. Refused up front: anything git could
/// read as an option.
pub fn resolve_upstream(upstream: &str) -> Result<String, String> {
    if upstream.starts_with('-') {
        // The daemon refuses it too; checked here so that it is not made a path below.
        return proto::check_upstream(upstream).map(|()| upstream.to_string());
    }
    if upstream.is_empty() || proto::is_url(upstream) || upstream.contains("::") {
        return Ok(upstream.to_string());
    }
    // Canonical when it exists; a missing path is left for the daemon to report.
    std::fs::canonicalize(upstream)
        .or_else(|_| std::path::absolute(upstream))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| format!("upstream {upstream}: {e}"))
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

/// How often `octofs watch` asks the daemon for new journal entries.
pub const WATCH_POLL: Duration = Duration::from_millis(100);
/// The most a line of `octofs watch` is held back while its path keeps changing.
pub const WATCH_HOLD_MAX: Duration = Duration::from_secs(1);

/// The lines of `octofs watch` held back until their paths have been quiet for one poll
/// ([`WATCH_POLL`], 100 ms): one change made of several requests (`echo x > file` is an open
/// with truncation, a write and a close; `sed -i` creates, writes, chmods and renames its temp
/// file) is one line per path, the last, whose kind says what the path is now and whose token
/// resumes after all of them. Paths keep the order of their last change. A path changing without
/// pause is still reported every [`WATCH_HOLD_MAX`].
#[derive(Default)]
pub struct Coalesce {
    /// (path key, line), oldest first.
    held: Vec<(String, serde_json::Value)>,
    /// When the oldest held line arrived, and whether the last poll brought anything.
    since: Option<Instant>,
    fresh: bool,
}

impl Coalesce {
    /// Takes one poll's lines (each replaces a held line of the same path).
    pub fn add(&mut self, lines: impl IntoIterator<Item = serde_json::Value>) {
        self.fresh = false;
        for v in lines {
            let key = match v.get("path_hex").and_then(|h| h.as_str()) {
                Some(h) => format!("hex:{h}"),
                None => format!("path:{}", v["path"].as_str().unwrap_or("")),
            };
            self.held.retain(|(k, _)| *k != key);
            self.held.push((key, v));
            self.fresh = true;
        }
        if self.fresh && self.since.is_none() {
            self.since = Some(Instant::now());
        }
    }

    /// The lines to print after a poll: every held line once a poll brought nothing new, or once
    /// the oldest has waited [`WATCH_HOLD_MAX`].
    pub fn due(&mut self, now: Instant) -> Vec<serde_json::Value> {
        let waited = self
            .since
            .is_some_and(|t| now.duration_since(t) >= WATCH_HOLD_MAX);
        if self.fresh && !waited {
            return Vec::new();
        }
        self.flush()
    }

    /// Every held line, now.
    pub fn flush(&mut self) -> Vec<serde_json::Value> {
        self.since = None;
        self.fresh = false;
        self.held.drain(..).map(|(_, v)| v).collect()
    }
}

/// `octofs status` for people: one line per field.
pub fn print_status(w: &WorkspaceStatus) {
    println!("thread:        {}", w.thread);
    println!("project:       {}", w.project);
    println!("base:          {}", w.base_commit);
    println!(
        "branch:        {}",
        w.branch.as_deref().unwrap_or("(detached)")
    );
    println!("path:          {}", w.path);
    println!(
        "state:         {}{}",
        w.state,
        if w.chat { " (chat)" } else { "" }
    );
    if !w.owner.is_empty() {
        println!("owner:         {}", w.owner);
    }
    if let Some(a) = &w.access {
        println!("access:        {a}");
    }
    if w.users > 1 {
        println!("users:         {} ({})", w.users, w.user_names.join(", "));
    }
    if w.release_when_idle {
        println!("release:       pending (when no process uses the mount)");
    }
    if let Some(p) = w.passthrough {
        println!("passthrough:   {}", if p { "yes" } else { "no" });
    }
    if let Some(t) = &w.transport {
        println!("transport:     {t}");
    }
    if let Some(io) = io_shown(w.io.as_deref(), w.io_why.as_deref()) {
        println!("io:            {io}");
    }
    for l in &w.layers {
        println!(
            "layer:         {} {} ({})",
            l.manager.name(),
            l.path,
            short(&l.key)
        );
    }
    for d in &w.dependencies {
        println!("dependencies:  {d}");
    }
    println!("changed paths: {}", w.changed_paths);
    if let Some(k) = &w.kept {
        println!("kept:          {k}");
    }
    if let Some(b) = w.bytes_used {
        println!("bytes used:    {b}");
    }
    if let (Some(b), Some(q)) = (w.owner_bytes, w.owner_quota) {
        println!("owner's quota: {b} of {q} bytes");
    }
    println!("base reads:    {}", w.base_content_opens);
    if w.quarantined > 0 {
        println!(
            "quarantined:   {} (see <state>/workspaces/<thread>/upper/quarantine)",
            w.quarantined
        );
    }
    if !w.damaged.is_empty() {
        println!(
            "damaged:       {} catalog record(s) lost (see the quarantine README)",
            w.damaged.len()
        );
        for d in &w.damaged {
            println!("  {d}");
        }
    }
    println!(
        "last snapshot: {}",
        w.last_snapshot.as_deref().unwrap_or("none")
    );
}

/// A mount's I/O mode and why (`no-open (auto: 210 MiB of 4.0 GiB budget)`), for `status` and
/// `stats`; none when not mounted.
pub fn io_shown(io: Option<&str>, why: Option<&str>) -> Option<String> {
    Some(match (io?, why) {
        (io, Some(why)) => format!("{io} ({why})"),
        (io, None) => io.to_string(),
    })
}

/// One table of request figures: opcode, count, p50, p99 (upper edge of a log2 bucket), total time.
pub fn print_stats(s: &StatsReport) {
    println!(
        "{:<16} {:>12} {:>10} {:>10} {:>14}",
        "opcode", "count", "p50 µs", "p99 µs", "total ms"
    );
    for o in &s.ops {
        println!(
            "{:<16} {:>12} {:>10} {:>10} {:>14.1}",
            o.op,
            o.count,
            format!("≤{}", o.p50_us),
            format!("≤{}", o.p99_us),
            o.total_us as f64 / 1000.0
        );
    }
    println!("{:<16} {:>12}", "all", s.requests());
    println!("bytes read through the daemon:    {}", s.bytes_read);
    println!("bytes written through the daemon: {}", s.bytes_written);
    println!("passthrough opens:                {}", s.passthrough_opens);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_lines_of_one_change_are_one() {
        let line = |p: &str, k: &str, t: u32| serde_json::json!({"path": p, "kind": k, "token": t});
        let mut c = Coalesce::default();
        let t0 = Instant::now();
        c.add([line("f", "changed", 1), line("f", "changed", 2)]);
        c.add([line(".sedX", "removed", 3), line("f", "changed", 4)]);
        c.add([line(".sedX", "removed", 5)]);
        assert!(c.due(t0).is_empty(), "held while the paths change");
        c.add([]);
        let out = c.due(Instant::now());
        assert_eq!(
            out,
            vec![line("f", "changed", 4), line(".sedX", "removed", 5)]
        );
        assert!(c.flush().is_empty());
        // A path that never pauses is still reported once the oldest line has waited long enough.
        c.add([line("g", "changed", 6)]);
        assert_eq!(c.due(Instant::now() + WATCH_HOLD_MAX).len(), 1);
    }

    #[test]
    fn short_ids_never_cut_a_character() {
        assert_eq!(short("0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
        // 13 bytes, byte 12 inside the last 'é': shown whole (slicing at 12 panicked).
        assert_eq!(short("aéééééé"), "aéééééé");
    }

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("30m"), Ok(1800));
        assert_eq!(parse_duration("2h"), Ok(7200));
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
    }
}
