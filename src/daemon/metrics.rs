//! Metrics an operator can scrape (docs/metrics.md): the Prometheus text exposition
//! (format 0.0.4) of what the daemon already counts, served by `octofs metrics` (root, over the
//! control socket) and by the opt-in HTTP listener of `octofs serve --metrics ADDR`.
//!
//! Owns the durations of the daemon's long operations (snapshots, mirror clones and fetches,
//! dependency layer builds: one [`observe`] where each is timed, never on the FUSE request path),
//! the rendering of every family, and the listener with its access rule: a connection is answered
//! only when the socket at the other end belongs to root or the daemon's user (read from the
//! kernel's `/proc/net/tcp{,6}`, never from the request), unless `--metrics-allow` widens it.
//!
//! Must not add a counter on the FUSE request path (the per-mount figures are `fs::stats`'s, the
//! errors `fs::failures`'s), walk a workspace (upper-layer bytes are the quota's running count), or
//! read anything a caller names: a scrape reads the daemon's own tables, records and `/proc/self`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Daemon, Reply, lock};
use crate::access::Caller;
use crate::fs::stats::BUCKETS;
use crate::workspace::WorkspaceRecord;

/// Who may read the listener besides root and the daemon's user (`serve --metrics-allow`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Allow {
    /// Root and the daemon's user only (the default).
    #[default]
    Root,
    /// Also these uids.
    Uids(Vec<u32>),
    /// Every client, local or not (the operator's network decides).
    Any,
}

impl std::str::FromStr for Allow {
    type Err = String;

    fn from_str(s: &str) -> Result<Allow, String> {
        match s.trim() {
            "" | "root" => Ok(Allow::Root),
            "any" => Ok(Allow::Any),
            list => list
                .split(',')
                .map(|u| {
                    u.trim().parse::<u32>().map_err(|_| {
                        format!(
                            "--metrics-allow: {u:?} is not a uid (give uid[,uid…], root or any)"
                        )
                    })
                })
                .collect::<Result<Vec<u32>, String>>()
                .map(Allow::Uids),
        }
    }
}

impl std::fmt::Display for Allow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Allow::Root => f.write_str("root"),
            Allow::Any => f.write_str("any"),
            Allow::Uids(u) => {
                let list: Vec<String> = u.iter().map(u32::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

impl Allow {
    /// Whether a client whose socket belongs to `uid` (`None`: unknown, not a local socket of
    /// this network namespace) may read the metrics.
    pub fn admits(&self, uid: Option<u32>) -> bool {
        match (self, uid) {
            (Allow::Any, _) => true,
            (_, Some(u)) if u == 0 || u == crate::sys::euid() => true,
            (Allow::Uids(list), Some(u)) => list.contains(&u),
            _ => false,
        }
    }
}

/// The listener of `serve --metrics ADDR`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub addr: SocketAddr,
    pub allow: Allow,
}

// ----- durations of the daemon's long operations -----

/// What [`observe`] times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    /// A snapshot's assembly (label: project).
    Snapshot,
    /// `mirror add`'s clone (label: project).
    MirrorClone,
    /// `mirror sync`'s fetch (label: project).
    MirrorFetch,
    /// A dependency layer build that ran (label: manager).
    LayerBuild,
}

/// Upper edges (seconds) of the duration histograms of [`Kind`].
const EVENT_EDGES: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];

#[derive(Debug, Clone, Default)]
struct Events {
    /// Per edge of [`EVENT_EDGES`], not cumulative; past the last edge only in `count`.
    buckets: [u64; EVENT_EDGES.len()],
    count: u64,
    sum_secs: f64,
    failures: u64,
}

/// Every observed duration, by kind and label. Held only to add one or to copy them out.
static EVENTS: Mutex<BTreeMap<(Kind, String), Events>> = Mutex::new(BTreeMap::new());

/// Records one finished operation of `kind` (`label`: its project or manager), failed or not.
pub(super) fn observe(kind: Kind, label: &str, took: Duration, ok: bool) {
    let secs = took.as_secs_f64();
    let mut all = lock(&EVENTS);
    let e = all.entry((kind, label.to_string())).or_default();
    if let Some(i) = EVENT_EDGES.iter().position(|edge| secs <= *edge) {
        e.buckets[i] += 1;
    }
    e.count += 1;
    e.sum_secs += secs;
    if !ok {
        e.failures += 1;
    }
}

/// Times `f` as one operation of `kind`: `Err` counts as a failure.
pub(super) fn timed<T, E>(
    kind: Kind,
    label: &str,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let start = Instant::now();
    let r = f();
    observe(kind, label, start.elapsed(), r.is_ok());
    r
}

/// When this process started serving (for `octofs_process_uptime_seconds`).
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the start of serving (the first call counts).
pub(super) fn started() {
    STARTED.get_or_init(Instant::now);
}

// ----- the text format -----

/// Escapes a label value (`\`, `"` and newline, as the format says).
fn escape(v: &str) -> String {
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
fn float(v: f64) -> String {
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
struct Text {
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
const FUSE_EDGES: [usize; 11] = [4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24];

/// One mount as a scrape sees it.
struct MountView {
    thread: String,
    stats: crate::fs::stats::StatsReport,
    upper_bytes: u64,
}

impl Daemon {
    /// `octofs metrics`: the exposition, for root or the daemon's user.
    pub(super) fn metrics(&self, c: &Caller) -> Reply<String> {
        self.require_admin(c, "read the daemon's metrics")?;
        Ok((self.metrics_text(), vec![]))
    }

    /// Every family, as one scrape answers it.
    pub(super) fn metrics_text(&self) -> String {
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

fn render(mounts: &[MountView], records: &[WorkspaceRecord]) -> String {
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
fn process_status() -> (u64, u64) {
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

// ----- the listener -----

/// The most bytes of a request head read.
const MAX_HEAD: usize = 8 << 10;
/// How long a client may take to send its request and take the answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections answered at once; more wait in the backlog.
const HTTP_CONNECTIONS: usize = 16;
/// How long a listener keeps trying an address in use (a restart's old process may hold it
/// until it exits).
const BIND_PATIENCE: Duration = Duration::from_secs(30);

/// Serves `GET /metrics` on `ep.addr` until the runtime stops. Never fails the daemon: an address
/// that cannot be bound is logged.
pub(super) async fn listen(daemon: Arc<Daemon>, ep: Endpoint) {
    let deadline = Instant::now() + BIND_PATIENCE;
    let listener = loop {
        match tokio::net::TcpListener::bind(ep.addr).await {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => {
                tracing::error!("metrics: cannot listen on {}: {e}", ep.addr);
                return;
            }
        }
    };
    tracing::info!(addr = %ep.addr, allow = %ep.allow, "metrics listener ready");
    let slots = Arc::new(tokio::sync::Semaphore::new(HTTP_CONNECTIONS));
    let allow = Arc::new(ep.allow);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let d = daemon.clone();
        let allow = allow.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HTTP_TIMEOUT, http(d, &allow, stream, peer)).await;
            drop(slot);
        });
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics { head_only: bool },
    NotFound,
    Method,
    Bad,
}

/// Reads the request line of `head` (the bytes up to the blank line).
fn parse_head(head: &[u8]) -> Asked {
    let Ok(text) = std::str::from_utf8(head) else {
        return Asked::Bad;
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Asked::Bad;
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Asked::Bad;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => Asked::Metrics { head_only: false },
        ("HEAD", "/metrics") => Asked::Metrics { head_only: true },
        ("GET" | "HEAD", _) => Asked::NotFound,
        _ => Asked::Method,
    }
}

/// Reads the head of one request (at most [`MAX_HEAD`] bytes): `None` when it is longer or the
/// client closed before its end.
async fn read_head(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = find_end(&head) {
            head.truncate(end);
            return Some(head);
        }
        if head.len() > MAX_HEAD {
            return None;
        }
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
}

fn find_end(head: &[u8]) -> Option<usize> {
    head.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .or_else(|| head.windows(2).position(|w| w == b"\n\n"))
}

fn response(status: &str, content_type: Option<&str>, body: &[u8], head_only: bool) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    if let Some(ct) = content_type {
        let _ = write!(out, "Content-Type: {ct}\r\n");
    }
    let _ = write!(
        out,
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

async fn http(
    daemon: Arc<Daemon>,
    allow: &Allow,
    mut stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    // The head is read first, whoever asks: closing on unread bytes would reset the connection
    // and the client would see an error instead of the refusal.
    let asked = match read_head(&mut stream).await {
        Some(head) => parse_head(&head),
        None => Asked::Bad,
    };
    let local = stream.local_addr().ok();
    let uid = match local {
        Some(local) => tokio::task::spawn_blocking(move || peer_uid(peer, local))
            .await
            .ok()
            .flatten(),
        None => None,
    };
    let out = if !allow.admits(uid) {
        tracing::debug!(%peer, ?uid, "metrics: refused");
        response("403 Forbidden", None, b"", false)
    } else {
        match asked {
            Asked::Metrics { head_only } => {
                let text = tokio::task::spawn_blocking(move || daemon.metrics_text())
                    .await
                    .unwrap_or_default();
                response(
                    "200 OK",
                    Some("text/plain; version=0.0.4; charset=utf-8"),
                    text.as_bytes(),
                    head_only,
                )
            }
            Asked::NotFound => response("404 Not Found", None, b"", false),
            Asked::Method => response("405 Method Not Allowed", None, b"", false),
            Asked::Bad => response("400 Bad Request", None, b"", false),
        }
    };
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

/// The uid owning the local socket at the other end of our connection from `local` to `peer`:
/// its row in `/proc/net/tcp` or `tcp6` has `peer` as its local address and `local` as its
/// remote. `None` when no such row is there (the client is on another host or in another network
/// namespace).
fn peer_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            find_owner(&text, peer, local)
        })
}

/// [`peer_uid`] in one table's text.
fn find_owner(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    let same = |a: SocketAddr, b: SocketAddr| {
        a.port() == b.port() && a.ip().to_canonical() == b.ip().to_canonical()
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (own, other, uid) = (f.get(1)?, f.get(2)?, f.get(7)?);
        (same(parse_proc_addr(own)?, peer) && same(parse_proc_addr(other)?, local))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// An address as `/proc/net/tcp{,6}` writes it: the address's 32-bit words in hex, each in host
/// byte order, a colon and the port in hex.
fn parse_proc_addr(s: &str) -> Option<SocketAddr> {
    let (ip, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |w: &str| u32::from_str_radix(w, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::from(word(ip)?),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(&ip[i * 8..i * 8 + 8])?);
            }
            IpAddr::from(b)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Refuses an address `serve --metrics` cannot use, before the daemon starts.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        format!("--metrics: {s:?} is not an address and port (e.g. 127.0.0.1:9464 or [::1]:9464)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series' labels other than `le`, in order.
    type Labels = Vec<(String, String)>;

    /// Checks the exposition as Prometheus reads it: every line a comment or a sample, each family
    /// declared once before its samples, histograms whole (monotone buckets ending in `+Inf` equal
    /// to `_count`, a `_sum`). Returns the samples.
    pub(crate) fn check_exposition(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
        let mut declared: BTreeMap<String, String> = BTreeMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE line");
                assert!(
                    declared.insert(name.into(), kind.into()).is_none(),
                    "{name} declared twice"
                );
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            assert!(!line.is_empty() && !line.starts_with('#'), "line {line:?}");
            let (name, labels, value) = parse_sample(line);
            samples.push((name, labels, value));
        }
        for (name, labels, _) in &samples {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| declared.get(*f).is_some_and(|k| k == "histogram"))
                })
                .unwrap_or(name);
            assert!(declared.contains_key(family), "{name} not declared");
            assert!(name.starts_with("octofs_"), "{name} is not an octofs_ name");
            let _ = labels;
        }
        for (family, kind) in &declared {
            if kind != "histogram" {
                continue;
            }
            // Group the buckets by their labels other than `le`.
            let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
            for (name, labels, v) in &samples {
                if *name == format!("{family}_bucket") {
                    let le = labels.get("le").expect("le");
                    let le = if le == "+Inf" {
                        f64::INFINITY
                    } else {
                        le.parse().expect("le value")
                    };
                    let key: Vec<_> = labels
                        .iter()
                        .filter(|(k, _)| *k != "le")
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    series.entry(key).or_default().push((le, *v));
                }
            }
            for (key, buckets) in series {
                let mut last = (f64::NEG_INFINITY, 0.0);
                for b in &buckets {
                    assert!(
                        b.0 > last.0 && b.1 >= last.1,
                        "{family}{key:?}: {buckets:?}"
                    );
                    last = *b;
                }
                assert!(last.0.is_infinite(), "{family}{key:?} has no +Inf bucket");
                let of = |suffix: &str| {
                    samples
                        .iter()
                        .find(|(n, l, _)| {
                            *n == format!("{family}{suffix}")
                                && l.iter()
                                    .map(|(k, v)| (k.clone(), v.clone()))
                                    .collect::<Vec<_>>()
                                    == key
                        })
                        .map(|s| s.2)
                };
                assert_eq!(of("_count"), Some(last.1), "{family}{key:?} _count");
                assert!(of("_sum").is_some(), "{family}{key:?} has no _sum");
            }
        }
        samples
    }

    fn parse_sample(line: &str) -> (String, BTreeMap<String, String>, f64) {
        let name_end = line
            .find(['{', ' '])
            .unwrap_or_else(|| panic!("sample {line:?}"));
        let name = &line[..name_end];
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "name {name:?}"
        );
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(r) = rest.strip_prefix('{') {
            let mut chars = r.char_indices().peekable();
            let mut key = String::new();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '}' => {
                        end = Some(i + 1);
                        break;
                    }
                    ',' => {}
                    '=' => {
                        assert_eq!(chars.next().map(|x| x.1), Some('"'), "{line}");
                        let mut v = String::new();
                        loop {
                            match chars.next().map(|x| x.1) {
                                Some('\\') => match chars.next().map(|x| x.1) {
                                    Some('n') => v.push('\n'),
                                    Some(c @ ('\\' | '"')) => v.push(c),
                                    other => panic!("bad escape {other:?} in {line}"),
                                },
                                Some('"') => break,
                                Some(c) => v.push(c),
                                None => panic!("unterminated value in {line}"),
                            }
                        }
                        assert!(labels.insert(std::mem::take(&mut key), v).is_none());
                    }
                    c => key.push(c),
                }
            }
            rest = &r[end.unwrap_or_else(|| panic!("unterminated labels in {line}"))..];
        }
        let value = rest.trim();
        let v = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("value {v:?} in {line}")),
        };
        (name.to_string(), labels, v)
    }

    #[test]
    fn the_exposition_is_well_formed() {
        use crate::fs::stats::{OpStats, StatsReport};
        // log2 µs buckets as `fs::stats` keeps them: 500 ns (0), 3 µs (2), 70 µs (7), 2 ms (11),
        // 20 s (31, past the last shown edge, 2^24 µs).
        let mut write = vec![0u64; BUCKETS];
        for b in [0, 2, 7, 11, 31] {
            write[b] += 1;
        }
        let mut lookup = vec![0u64; BUCKETS];
        lookup[4] = 1;
        let op = |name: &str, buckets: Vec<u64>| OpStats {
            op: name.into(),
            count: buckets.iter().sum(),
            total_us: 1234,
            p50_us: 0,
            p99_us: 0,
            buckets,
        };
        let report = StatsReport {
            ops: vec![op("LOOKUP", lookup), op("WRITE", write)],
            bytes_read: 1,
            bytes_written: 2,
            passthrough_opens: 0,
        };
        observe(Kind::Snapshot, "p\"1\\\n", Duration::from_millis(30), true);
        observe(Kind::Snapshot, "p\"1\\\n", Duration::from_secs(2000), false);
        observe(Kind::LayerBuild, "npm", Duration::from_secs(3), true);
        let mounts = vec![
            MountView {
                thread: "t1".into(),
                stats: report,
                upper_bytes: 42,
            },
            MountView {
                thread: "t2".into(),
                stats: StatsReport::default(),
                upper_bytes: 0,
            },
        ];
        let text = render(&mounts, &[]);
        let samples = check_exposition(&text);
        let find = |name: &str, want: &[(&str, &str)]| {
            samples
                .iter()
                .find(|(n, l, _)| {
                    n == name
                        && want
                            .iter()
                            .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
                })
                .map(|s| s.2)
        };
        assert_eq!(
            find(
                "octofs_fuse_requests_total",
                &[("thread", "t1"), ("op", "write")]
            ),
            Some(5.0)
        );
        // 500 ns, 3 µs and 70 µs are under 256 µs; 2 ms under 4.096 ms; 20 s only at +Inf.
        assert_eq!(
            find(
                "octofs_fuse_request_duration_seconds_bucket",
                &[("thread", "t1"), ("op", "write"), ("le", "0.000256")]
            ),
            Some(3.0)
        );
        assert_eq!(
            find(
                "octofs_fuse_request_duration_seconds_bucket",
                &[("thread", "t1"), ("op", "write"), ("le", "0.004096")]
            ),
            Some(4.0)
        );
        assert_eq!(find("octofs_upper_bytes", &[("thread", "t1")]), Some(42.0));
        assert_eq!(
            find("octofs_snapshot_failures_total", &[("project", "p\"1\\\n")]),
            Some(1.0)
        );
        assert_eq!(
            find(
                "octofs_snapshot_duration_seconds_bucket",
                &[("project", "p\"1\\\n"), ("le", "900")]
            ),
            Some(1.0)
        );
        assert_eq!(
            find(
                "octofs_layer_build_duration_seconds_count",
                &[("manager", "npm")]
            ),
            Some(1.0)
        );
        assert!(find("octofs_build_info", &[]).is_some());
        assert!(find("octofs_process_threads", &[]).unwrap() >= 1.0);
    }

    #[test]
    fn proc_net_tcp_rows_name_the_peer_socket_owner() {
        // Two rows of one loopback connection 127.0.0.1:40000 -> 127.0.0.1:9464 (the client's,
        // uid 1000, and ours, uid 0), as the kernel writes them on a little-endian host.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:9C40 0100007F:24F8 01 00000000:00000000 00:00000000 00000000  1000        0 1 1 0000000000000000 20 4 30 10 -1\n\
   1: 0100007F:24F8 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 20 4 30 10 -1\n";
        if cfg!(target_endian = "little") {
            let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
            let us: SocketAddr = "127.0.0.1:9464".parse().unwrap();
            assert_eq!(find_owner(table, client, us), Some(1000));
            assert_eq!(find_owner(table, us, client), Some(0));
            let other: SocketAddr = "127.0.0.1:40001".parse().unwrap();
            assert_eq!(find_owner(table, other, us), None);
            // A v4 client of a listener on [::] is seen as ::ffff:127.0.0.1.
            let mapped: SocketAddr = "[::ffff:127.0.0.1]:40000".parse().unwrap();
            let us6: SocketAddr = "[::ffff:127.0.0.1]:9464".parse().unwrap();
            assert_eq!(find_owner(table, mapped, us6), Some(1000));
            let v6 = "00000000000000000000000001000000:9C40";
            assert_eq!(parse_proc_addr(v6), Some("[::1]:40000".parse().unwrap()));
        }
    }

    /// What the metrics cost: the per-request accounting they read (one `Stats::time` guard: two
    /// clock reads and three relaxed adds; the metrics add nothing to it) and a scrape of 200
    /// mounts with 15 opcodes each. Printed for docs/metrics.md; bounded loosely (shared CI).
    #[test]
    fn what_the_metrics_cost() {
        use crate::fs::stats::{Op, OpStats, Stats, StatsReport};
        let s = Stats::default();
        let n = 2_000_000u32;
        let start = Instant::now();
        for _ in 0..n {
            let _t = s.time(Op::Getattr);
        }
        let per_request = start.elapsed() / n;
        let ops: Vec<OpStats> = Op::ALL[..15]
            .iter()
            .map(|op| OpStats {
                op: op.name().into(),
                count: 1000,
                total_us: 5000,
                p50_us: 4,
                p99_us: 64,
                buckets: (0..BUCKETS as u64).collect(),
            })
            .collect();
        let mounts: Vec<MountView> = (0..200)
            .map(|i| MountView {
                thread: format!("thread-{i}"),
                stats: StatsReport {
                    ops: ops.clone(),
                    ..StatsReport::default()
                },
                upper_bytes: i,
            })
            .collect();
        let start = Instant::now();
        let text = render(&mounts, &[]);
        let scrape = start.elapsed();
        println!(
            "per request: {per_request:?} (Stats::time guard); scrape of 200 mounts x 15 ops: {scrape:?}, {} KiB, {} lines",
            text.len() >> 10,
            text.lines().count()
        );
        assert!(per_request < Duration::from_micros(5), "{per_request:?}");
        assert!(scrape < Duration::from_secs(2), "{scrape:?}");
    }

    #[test]
    fn request_heads_and_allow_lists() {
        assert_eq!(
            parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"),
            Asked::Metrics { head_only: false }
        );
        assert_eq!(
            parse_head(b"GET /metrics?x=1 HTTP/1.0"),
            Asked::Metrics { head_only: false }
        );
        assert_eq!(parse_head(b"GET / HTTP/1.1"), Asked::NotFound);
        assert_eq!(parse_head(b"POST /metrics HTTP/1.1"), Asked::Method);
        assert_eq!(parse_head(b"GET /metrics"), Asked::Bad);
        assert_eq!(parse_head(b"\xff\xfe"), Asked::Bad);
        assert_eq!(parse_head(b""), Asked::Bad);
        assert_eq!("any".parse::<Allow>(), Ok(Allow::Any));
        assert_eq!(
            "1000, 1001".parse::<Allow>(),
            Ok(Allow::Uids(vec![1000, 1001]))
        );
        assert!("bob".parse::<Allow>().is_err());
        assert!(Allow::Root.admits(Some(0)));
        assert!(!Allow::Root.admits(None));
        assert!(!Allow::Root.admits(Some(4242)));
        assert!(Allow::Uids(vec![4242]).admits(Some(4242)));
        assert!(Allow::Any.admits(None));
    }
}
