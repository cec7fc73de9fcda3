//! The Prometheus text exposition (format 0.0.4) of one scrape: escaping, the families of the
//! mounts, workspaces, long operations and the process, and `octofs metrics` over the control
//! socket.
//!
//! Must not walk a workspace (upper-layer bytes are the quota's running count) or read anything a
//! caller names: a scrape reads the daemon's own tables, records and `/proc/self`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::events::{EVENT_EDGES, EVENTS, Events, Kind, STARTED};
use crate::access::Caller;
use crate::daemon::{Daemon, Reply, lock};
use crate::fs::stats::BUCKETS;
use crate::workspace::WorkspaceRecord;

/// Escapes a label value (`\`, `"` and newline, as the format says).
pub(super) fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A float as the format writes it.
pub(super) fn float(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

/// The exposition being written: each family once, its samples together.
#[derive(Default)]
pub(super) struct Text {
    out: String,
}

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// The `_bucket`, `_sum` and `_count` samples of one histogram: `buckets` are (upper edge,
    /// cumulative count), without `+Inf` (it is `count`).
    fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        buckets: &[(f64, u64)],
        sum: f64,
        count: u64,
    ) {
        let bucket = format!("{name}_bucket");
        let edges: Vec<String> = buckets.iter().map(|(edge, _)| float(*edge)).collect();
        for (le, (_, n)) in edges.iter().zip(buckets) {
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", le));
            self.sample(&bucket, &with_le, n);
        }
        let mut with_le: Vec<(&str, &str)> = labels.to_vec();
        with_le.push(("le", "+Inf"));
        self.sample(&bucket, &with_le, count);
        self.sample(&format!("{name}_sum"), labels, float(sum));
        self.sample(&format!("{name}_count"), labels, count);
    }
}

/// The log2 µs buckets of `fs::stats` shown: bucket `b` counts requests under `2^b` µs, so the
/// cumulative count up to it is exact at the edge `2^b` µs. Every other one from 16 µs to 17 s
/// (the rest are summed into the next shown edge).
pub(super) const FUSE_EDGES: [usize; 11] = [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24];

/// One mount as a scrape sees it.
pub(super) struct MountView {
    pub(super) thread: String,
    pub(super) stats: crate::fs::stats::StatsReport,
    pub(super) upper_bytes: u64,
}

impl Daemon {
    /// `octofs metrics`: the exposition, for root or the daemon's user.
    pub(in crate::daemon) fn metrics(&self, c: &Caller) -> Reply<String> {
        self.require_admin(c, "read the daemon's metrics")?;
        Ok((self.metrics_text(), vec![]))
    }

    /// Every family, as one scrape answers it.
    pub(in crate::daemon) fn metrics_text(&self) -> String {
        let mut mounts: Vec<MountView> = {
            let m = lock(&self.mounts);
            m.iter()
                .map(|(t, m)| (t.clone(), m.info.clone(), m.core.clone()))
                .collect::<Vec<_>>()
        }
        .into_iter()
        .map(|(thread, info, core)| MountView {
            thread,
            stats: info.stats.report(),
            upper_bytes: core.bytes_used(),
        })
        .collect();
        mounts.sort_by(|a, b| a.thread.cmp(&b.thread));
        let records = WorkspaceRecord::list(&self.layout).unwrap_or_else(|e| {
            tracing::warn!("metrics: cannot list the live threads: {e}");
            Vec::new()
        });
        render(&mounts, &records)
    }
}

pub(super) fn render(mounts: &[MountView], records: &[WorkspaceRecord]) -> String {
    let project_of: HashMap<&str, &str> = records
        .iter()
        .map(|r| (r.thread.as_str(), r.project.as_str()))
        .collect();
    let mut t = Text::default();

    // Build info and the process.
    t.family(
        "octofs_build_info",
        "gauge",
        "The running daemon's version (always 1).",
    );
    t.sample(
        "octofs_build_info",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1,
    );
    let (threads, rss) = process_status();
    t.family(
        "octofs_process_threads",
        "gauge",
        "Threads of the daemon process.",
    );
    t.sample("octofs_process_threads", &[], threads);
    t.family(
        "octofs_process_resident_memory_bytes",
        "gauge",
        "Resident memory of the daemon process.",
    );
    t.sample("octofs_process_resident_memory_bytes", &[], rss);
    t.family(
        "octofs_process_uptime_seconds",
        "gauge",
        "Seconds since this daemon process started serving.",
    );
    let up = STARTED
        .get()
        .map(|s| s.elapsed().as_secs_f64())
        .unwrap_or(0.0);
    t.sample("octofs_process_uptime_seconds", &[], float(up));

    // Live threads and layers in use, from the records.
    let mut live: BTreeMap<(u32, &str), u64> = BTreeMap::new();
    let mut layers: BTreeMap<&'static str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for r in records {
        *live.entry((r.owner.uid, r.project.as_str())).or_default() += 1;
        for l in &r.layers {
            layers
                .entry(l.manager.name())
                .or_default()
                .insert(l.key.as_str());
        }
    }
    t.family(
        "octofs_live_threads",
        "gauge",
        "Live threads (workspaces not released) by owner uid and project.",
    );
    for ((uid, project), n) in &live {
        t.sample(
            "octofs_live_threads",
            &[("uid", &uid.to_string()), ("project", project)],
            n,
        );
    }
    t.family(
        "octofs_mounted_workspaces",
        "gauge",
        "Workspaces this daemon serves a mount of.",
    );
    t.sample("octofs_mounted_workspaces", &[], mounts.len());
    t.family(
        "octofs_layers_in_use",
        "gauge",
        "Distinct dependency layers presented by live threads, by manager.",
    );
    for (manager, keys) in &layers {
        t.sample("octofs_layers_in_use", &[("manager", manager)], keys.len());
    }

    // Per mount: FUSE requests, their latency, bytes, upper-layer bytes.
    let label = |m: &MountView| -> (String, String) {
        (
            m.thread.clone(),
            project_of
                .get(m.thread.as_str())
                .copied()
                .unwrap_or("")
                .to_string(),
        )
    };
    t.family(
        "octofs_fuse_requests_total",
        "counter",
        "FUSE requests a mount answered, by opcode.",
    );
    for m in mounts {
        let (thread, project) = label(m);
        for o in &m.stats.ops {
            let op = o.op.to_ascii_lowercase();
            let n: u64 = o.buckets.iter().sum();
            t.sample(
                "octofs_fuse_requests_total",
                &[("thread", &thread), ("project", &project), ("op", &op)],
                n,
            );
        }
    }
    t.family(
        "octofs_fuse_request_duration_seconds",
        "histogram",
        "Time the daemon took to answer a mount's FUSE requests, by opcode.",
    );
    for m in mounts {
        let (thread, project) = label(m);
        for o in &m.stats.ops {
            let op = o.op.to_ascii_lowercase();
            let mut cumulative = 0u64;
            let mut next = 0usize;
            let mut buckets = Vec::with_capacity(FUSE_EDGES.len());
            for edge in FUSE_EDGES {
                while next < edge && next < o.buckets.len() {
                    cumulative += o.buckets[next];
                    next += 1;
                }
                buckets.push(((1u64 << edge) as f64 / 1e6, cumulative));
            }
            // The count is the buckets' sum, so that `+Inf` is never below a bucket even while
            // requests are recorded during the scrape.
            let count: u64 = o.buckets.iter().take(BUCKETS).sum();
            t.histogram(
                "octofs_fuse_request_duration_seconds",
                &[("thread", &thread), ("project", &project), ("op", &op)],
                &buckets,
                o.total_us as f64 / 1e6,
                count,
            );
        }
    }
    for (name, help, get) in [
        (
            "octofs_fuse_read_bytes_total",
            "Bytes a mount served by READ requests (passthrough reads never reach the daemon).",
            (|s: &crate::fs::stats::StatsReport| s.bytes_read) as fn(&_) -> u64,
        ),
        (
            "octofs_fuse_written_bytes_total",
            "Bytes a mount took by WRITE requests.",
            |s| s.bytes_written,
        ),
        (
            "octofs_fuse_passthrough_opens_total",
            "Opens and creates a mount handed to the kernel (FUSE passthrough).",
            |s| s.passthrough_opens,
        ),
    ] {
        t.family(name, "counter", help);
        for m in mounts {
            let (thread, project) = label(m);
            t.sample(
                name,
                &[("thread", &thread), ("project", &project)],
                get(&m.stats),
            );
        }
    }
    t.family(
        "octofs_upper_bytes",
        "gauge",
        "Bytes a mounted workspace's upper layer holds (its written files, as the quota counts them).",
    );
    for m in mounts {
        let (thread, project) = label(m);
        t.sample(
            "octofs_upper_bytes",
            &[("thread", &thread), ("project", &project)],
            m.upper_bytes,
        );
    }
    t.family(
        "octofs_fuse_errors_total",
        "counter",
        "FUSE requests answered with an error, by opcode and errno, over every mount of this process.",
    );
    for (op, errno, n) in crate::fs::failures::error_counts() {
        let op = op.name().to_ascii_lowercase();
        t.sample(
            "octofs_fuse_errors_total",
            &[("op", &op), ("errno", &errno)],
            n,
        );
    }

    // The long operations.
    let events = lock(&EVENTS).clone();
    for (kind, name, help, label_name) in [
        (
            Kind::Snapshot,
            "octofs_snapshot",
            "snapshots (assembly of the workspace into a commit)",
            "project",
        ),
        (
            Kind::MirrorClone,
            "octofs_mirror_clone",
            "mirror clones (mirror add)",
            "project",
        ),
        (
            Kind::MirrorFetch,
            "octofs_mirror_fetch",
            "mirror fetches (mirror sync)",
            "project",
        ),
        (
            Kind::LayerBuild,
            "octofs_layer_build",
            "dependency layer builds that ran",
            "manager",
        ),
    ] {
        let of_kind: Vec<(&String, &Events)> = events
            .iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|((_, l), e)| (l, e))
            .collect();
        let hist = format!("{name}_duration_seconds");
        t.family(
            &hist,
            "histogram",
            &format!("Duration of {help}, failed or not."),
        );
        for (l, e) in &of_kind {
            let mut cumulative = 0;
            let buckets: Vec<(f64, u64)> = EVENT_EDGES
                .iter()
                .zip(e.buckets)
                .map(|(edge, n)| {
                    cumulative += n;
                    (*edge, cumulative)
                })
                .collect();
            t.histogram(&hist, &[(label_name, l)], &buckets, e.sum_secs, e.count);
        }
        let failures = format!("{name}_failures_total");
        t.family(&failures, "counter", &format!("Failed {help}."));
        for (l, e) in &of_kind {
            t.sample(&failures, &[(label_name, l)], e.failures);
        }
    }
    t.out
}

/// The process's threads and resident bytes, from `/proc/self/status` (0 when unreadable).
pub(super) fn process_status() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:") * 1024)
}
