//! The command line's own helpers, used by `main.rs` only: what the arguments mean before a
//! request is sent (durations, upstreams, who may bind a project) and how answers are printed for
//! people. Nothing here talks to the daemon.

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
    if w.users > 1 {
        println!("users:         {}", w.users);
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
    if let Some(io) = &w.io {
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
