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

//!
//! One file per concept: `events` (the durations), `render` (the text format), `http` (the
//! listener), `access` (who may read it).

mod access;
mod events;
mod http;
mod render;

pub use access::{Allow, Endpoint, parse_addr};
pub(super) use events::{Kind, observe, started, timed};
pub(super) use http::listen;

#[cfg(test)]
mod tests;
