//! Request statistics of one mount: per-opcode counts, total time and a log2 latency histogram,
//! bytes served through the daemon and passthrough opens, as `octofs stats` reports them.
//!
//! Recording is a handful of relaxed atomic adds into fixed arrays: no allocation and no lock on the
//! request path. Figures are read without stopping the mount, so one report may mix a request's
//! count with the previous request's time; each figure on its own is exact. This module only counts:
//! it must not touch the workspace or the kernel connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Histogram buckets: bucket `b > 0` holds latencies of `2^(b-1) ..= 2^b - 1` µs, bucket 0 under
/// 1 µs; the last bucket also holds everything longer (over ~18 minutes).
pub const BUCKETS: usize = 32;

macro_rules! ops {
    ($($v:ident => $name:literal),* $(,)?) => {
        /// The FUSE requests the adapter answers.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Op { $($v),* }

        impl Op {
            pub const ALL: &[Op] = &[$(Op::$v),*];

            pub fn name(self) -> &'static str {
                match self { $(Op::$v => $name),* }
            }
        }
    };
}

ops! {
    Lookup => "LOOKUP",
    Forget => "FORGET",
    Getattr => "GETATTR",
    Setattr => "SETATTR",
    Readlink => "READLINK",
    Mknod => "MKNOD",
    Mkdir => "MKDIR",
    Unlink => "UNLINK",
    Rmdir => "RMDIR",
    Symlink => "SYMLINK",
    Rename => "RENAME",
    Link => "LINK",
    Open => "OPEN",
    Create => "CREATE",
    Read => "READ",
    Write => "WRITE",
    Flush => "FLUSH",
    Release => "RELEASE",
    Fsync => "FSYNC",
    Opendir => "OPENDIR",
    Readdir => "READDIR",
    Readdirplus => "READDIRPLUS",
    Releasedir => "RELEASEDIR",
    Fsyncdir => "FSYNCDIR",
    Statfs => "STATFS",
    Setxattr => "SETXATTR",
    Getxattr => "GETXATTR",
    Listxattr => "LISTXATTR",
    Removexattr => "REMOVEXATTR",
    Access => "ACCESS",
    Fallocate => "FALLOCATE",
    Lseek => "LSEEK",
    CopyFileRange => "COPY_FILE_RANGE",
}

const OPS: usize = Op::ALL.len();

struct OpCounters {
    count: AtomicU64,
    total_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS],
}

impl OpCounters {
    const fn new() -> OpCounters {
        OpCounters {
            count: AtomicU64::new(0),
            total_ns: AtomicU64::new(0),
            buckets: [const { AtomicU64::new(0) }; BUCKETS],
        }
    }
}

/// The live counters of one mount.
pub struct Stats {
    ops: [OpCounters; OPS],
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    passthrough_opens: AtomicU64,
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            ops: [const { OpCounters::new() }; OPS],
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            passthrough_opens: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stats").finish_non_exhaustive()
    }
}

fn bucket(us: u64) -> usize {
    ((u64::BITS - us.leading_zeros()) as usize).min(BUCKETS - 1)
}

impl Stats {
    /// Starts timing one request of `op`; it is recorded when the guard drops.
    pub fn time(&self, op: Op) -> Timer<'_> {
        Timer {
            stats: self,
            op,
            start: Instant::now(),
        }
    }

    fn record(&self, op: Op, ns: u64) {
        let c = &self.ops[op as usize];
        c.count.fetch_add(1, Ordering::Relaxed);
        c.total_ns.fetch_add(ns, Ordering::Relaxed);
        c.buckets[bucket(ns / 1000)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn read_bytes(&self, n: u64) {
        self.bytes_read.fetch_add(n, Ordering::Relaxed);
    }

    pub fn wrote_bytes(&self, n: u64) {
        self.bytes_written.fetch_add(n, Ordering::Relaxed);
    }

    pub fn passthrough_open(&self) {
        self.passthrough_opens.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as they are now (opcodes never seen are left out).
    pub fn report(&self) -> StatsReport {
        let ops = Op::ALL
            .iter()
            .filter_map(|op| {
                let c = &self.ops[*op as usize];
                let count = c.count.load(Ordering::Relaxed);
                (count > 0).then(|| {
                    let buckets: Vec<u64> = c
                        .buckets
                        .iter()
                        .map(|b| b.load(Ordering::Relaxed))
                        .collect();
                    OpStats::new(
                        op.name(),
                        count,
                        c.total_ns.load(Ordering::Relaxed) / 1000,
                        buckets,
                    )
                })
            })
            .collect();
        StatsReport {
            ops,
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            passthrough_opens: self.passthrough_opens.load(Ordering::Relaxed),
        }
    }
}

/// Times one request (see [`Stats::time`]).
pub struct Timer<'a> {
    stats: &'a Stats,
    op: Op,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.record(self.op, ns);
    }
}

/// One opcode's figures. Percentiles are the upper edge of their log2 bucket (so within 2×).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStats {
    pub op: String,
    pub count: u64,
    pub total_us: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    /// Requests per log2 µs bucket (see [`BUCKETS`]); kept so reports can be summed.
    pub buckets: Vec<u64>,
}

impl OpStats {
    fn new(op: &str, count: u64, total_us: u64, buckets: Vec<u64>) -> OpStats {
        OpStats {
            op: op.to_string(),
            count,
            total_us,
            p50_us: percentile(&buckets, 50),
            p99_us: percentile(&buckets, 99),
            buckets,
        }
    }
}

/// The upper edge (µs) of the bucket holding the `pct`th percentile request.
fn percentile(buckets: &[u64], pct: u64) -> u64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = (total * pct).div_ceil(100).max(1);
    let mut seen = 0;
    for (b, n) in buckets.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return 1u64 << b.min(63);
        }
    }
    1u64 << (buckets.len().max(1) - 1).min(63)
}

/// A mount's figures (or a sum of several).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsReport {
    pub ops: Vec<OpStats>,
    /// Bytes served by READ requests (passthrough reads never reach the daemon).
    pub bytes_read: u64,
    /// Bytes written by WRITE requests.
    pub bytes_written: u64,
    /// Opens and creates handed to the kernel (FUSE passthrough).
    pub passthrough_opens: u64,
}

impl StatsReport {
    /// Adds `other` into `self`, opcode by opcode.
    pub fn add(&mut self, other: &StatsReport) {
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
        self.passthrough_opens += other.passthrough_opens;
        for o in &other.ops {
            match self.ops.iter_mut().find(|m| m.op == o.op) {
                Some(m) => {
                    let mut buckets = m.buckets.clone();
                    buckets.resize(buckets.len().max(o.buckets.len()), 0);
                    for (b, n) in buckets.iter_mut().zip(&o.buckets) {
                        *b += n;
                    }
                    *m = OpStats::new(&o.op, m.count + o.count, m.total_us + o.total_us, buckets);
                }
                None => self.ops.push(o.clone()),
            }
        }
        let order = |name: &str| Op::ALL.iter().position(|op| op.name() == name);
        self.ops.sort_by_key(|o| order(&o.op));
    }

    /// Requests of opcode `op` (0 if none).
    pub fn count(&self, op: &str) -> u64 {
        self.ops
            .iter()
            .find(|o| o.op == op)
            .map(|o| o.count)
            .unwrap_or(0)
    }

    /// Requests of every opcode.
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|o| o.count).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_and_percentiles() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 1);
        assert_eq!(bucket(3), 2);
        assert_eq!(bucket(4), 3);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        let s = Stats::default();
        for _ in 0..99 {
            s.record(Op::Open, 3_000); // 3 µs: bucket 2, edge 4
        }
        s.record(Op::Open, 1_000_000); // 1 ms: bucket 10, edge 1024
        let r = s.report();
        assert_eq!(r.ops.len(), 1);
        assert_eq!(r.count("OPEN"), 100);
        assert_eq!(r.ops[0].p50_us, 4);
        assert_eq!(r.ops[0].p99_us, 4);
        assert_eq!(r.ops[0].total_us, 99 * 3 + 1000);
        let mut sum = r.clone();
        sum.add(&r);
        assert_eq!(sum.count("OPEN"), 200);
        assert_eq!(sum.ops[0].p99_us, 4);
        s.record(Op::Open, 1_000_000);
        s.record(Op::Lookup, 0);
        let r2 = s.report();
        assert_eq!(r2.ops[0].op, "LOOKUP");
        assert_eq!(r2.ops[1].p99_us, 1024);
    }
}
