//! `octofs watch` (the thread's changes as JSON lines, across restarts) and git's fsmonitor hook as
//! a command (`octofs fsmonitor`, for workspaces made before the `octofs-fsmonitor` program). Both
//! ask the daemon's journal, never the mount, and never start a daemon.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::Value;

use octofs::client::{self, ClientError};
use octofs::layout::Layout;
use octofs::names::{NameKind, validate};
use octofs::proto::{self, WatchAnswer};

use super::args::{FsmonitorArgs, WatchArgs};

/// How long `watch` asks again while no daemon answers (a restart, a crash recovered from).
const WATCH_RECONNECT: Duration = Duration::from_secs(15);

/// `octofs watch`: polls the daemon's journal of the thread every 100 ms and prints one JSON line per
/// change — `{"path", "kind", "token"}`, kind `changed`, `removed` or `directory` as the path is now
/// in the workspace (the daemon's answer: nothing here looks through the mount) — a `rescan` line
/// when the token cannot be trusted, and a `released` line (exit 0) when the workspace goes away.
/// Each line's token resumes the stream after it (`--since`). The requests of one change (`echo >
/// file`: open, truncate, write, close) are one line: see [`Coalesce`].
/// Across `octofs restart` (or a crash the next daemon recovers from) the stream goes on: while the
/// daemon cannot be reached or says it is restarting, the same token is asked again, for up to
/// [`WATCH_RECONNECT`] (1 s once the control socket is gone: a `stop`); the new daemon's journal
/// starts afresh, so its first answer is a `rescan` line, then changes as before.
pub fn watch(layout: &Layout, a: WatchArgs) -> Result<(), String> {
    validate(NameKind::Thread, &a.thread)?;
    let thread = a.thread;
    let mut token = a.since.unwrap_or_default();
    let mut first = true;
    let mut unreachable_since: Option<Instant> = None;
    let mut held = Coalesce::default();
    let print = |lines: Vec<Value>| -> bool {
        let mut out = std::io::stdout().lock();
        lines
            .into_iter()
            .try_for_each(|v| writeln!(out, "{v}").and_then(|()| out.flush()))
            .is_ok()
    };
    loop {
        let req = proto::Watch {
            thread: thread.clone(),
            token: token.clone(),
        };
        let resp = client::call(layout, req, false).map(|a| a.answer);
        let between_daemons = match &resp {
            Err(ClientError::Refused(e)) => e.contains("restarting"),
            Err(_) => true,
            Ok(_) => false,
        };
        if between_daemons && !first {
            let since = *unreachable_since.get_or_insert_with(Instant::now);
            let budget = if layout.socket().exists() {
                WATCH_RECONNECT
            } else {
                Duration::from_secs(1)
            };
            if since.elapsed() < budget {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        unreachable_since = None;
        let a: WatchAnswer = match resp {
            Ok(a) => a,
            Err(e) if first => return Err(e.to_string()),
            // Refused (the thread is gone), or the daemon stopped: the workspace is gone with it.
            Err(_) => {
                let mut lines = held.flush();
                lines.push(serde_json::json!({"kind": "released", "token": token}));
                print(lines);
                return Ok(());
            }
        };
        first = false;
        let lines = if a.everything {
            let mut lines = held.flush();
            lines.push(serde_json::json!({"kind": "rescan", "token": a.token}));
            lines
        } else {
            held.add(a.entries.iter().map(|e| {
                let mut v = serde_json::json!({"path": e.path, "kind": e.kind, "token": e.token});
                if let Some(h) = &e.path_hex {
                    v["path_hex"] = Value::String(h.clone());
                }
                v
            }));
            held.due(Instant::now())
        };
        if !print(lines) {
            // The reader went away.
            return Ok(());
        }
        token = a.token;
        std::thread::sleep(WATCH_POLL);
    }
}

/// `octofs fsmonitor THREAD 2 TOKEN`: git's hook protocol v2 on stdout — the new token, then the
/// changed paths (or `/`: everything), each NUL-terminated.
pub fn fsmonitor(layout: &Layout, a: FsmonitorArgs) -> Result<(), String> {
    if a.version.as_deref() != Some("2") {
        return Err(format!(
            "fsmonitor: unsupported hook version {:?} (expected 2)",
            a.version
        ));
    }
    let req = proto::Fsmonitor {
        thread: a.thread,
        token: a.token.unwrap_or_default(),
    };
    let a = client::call(layout, req, false)?.answer;
    let out = proto::hook::encode(&a.token, a.everything, &a.paths);
    std::io::stdout()
        .write_all(&out)
        .map_err(|e| format!("fsmonitor: {e}"))
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
}
