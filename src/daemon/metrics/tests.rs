//! The metrics' unit tests: the exposition as Prometheus reads it, the `/proc/net/tcp` rows,
//! request heads, the allow lists and what a scrape costs.
//!
//! Must not bind a port or mount anything.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::access::*;
use super::events::*;
use super::http::*;
use super::render::*;
use crate::fs::stats::BUCKETS;

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
