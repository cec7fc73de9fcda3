//! The durations of the daemon's long operations (snapshots, mirror clones and fetches,
//! dependency layer builds): one [`observe`] where each is timed, and the start of serving.
//!
//! Must not be called on the FUSE request path (its figures are `fs::stats`'s) nor render
//! anything: `render` copies [`EVENTS`] out under its lock.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::daemon::lock;

/// What [`observe`] times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(in crate::daemon) enum Kind {
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
pub(super) const EVENT_EDGES: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
];

#[derive(Debug, Clone, Default)]
pub(super) struct Events {
    /// Per edge of [`EVENT_EDGES`], not cumulative; past the last edge only in `count`.
    pub(super) buckets: [u64; EVENT_EDGES.len()],
    pub(super) count: u64,
    pub(super) sum_secs: f64,
    pub(super) failures: u64,
}

/// Every observed duration, by kind and label. Held only to add one or to copy them out.
pub(super) static EVENTS: Mutex<BTreeMap<(Kind, String), Events>> = Mutex::new(BTreeMap::new());

/// Records one finished operation of `kind` (`label`: its project or manager), failed or not.
pub(in crate::daemon) fn observe(kind: Kind, label: &str, took: Duration, ok: bool) {
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
pub(in crate::daemon) fn timed<T, E>(
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
pub(super) static STARTED: OnceLock<Instant> = OnceLock::new();

/// Marks the start of serving (the first call counts).
pub(in crate::daemon) fn started() {
    STARTED.get_or_init(Instant::now);
}
