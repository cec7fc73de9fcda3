//! `octofs stats` on a real mount (issue 12): the per-opcode counts grow by what the kernel asked
//! for, the daemon-wide sum covers every mount; and the cheaper create of issue 13: a created file's
//! close costs no FLUSH request, and the lock-free `getxattr` answer stays right across a restart;
//! and the metrics of issue 32 item 9: `serve --metrics` read by root only, well-formed (promtool),
//! and scraped by a real Prometheus server.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::op_count as count;
use common::*;
use serde_json::Value;

const N: u64 = 20;

fn stats(d: &Daemon, thread: Option<&str>) -> Value {
    let mut args = vec!["stats", "--json"];
    args.extend(thread);
    parse_json("stats --json", &d.cli_ok(args))
}

/// Waits until `op` of `thread` reached `want` (RELEASE reaches the daemon after `close` returns).
fn wait_count(d: &Daemon, thread: &str, op: &str, want: u64) -> Value {
    poll(Duration::from_secs(10), || {
        let v = stats(d, Some(thread));
        (count(&v, op) >= want).then_some(v)
    })
    .unwrap_or_else(|| stats(d, Some(thread)))
}

fn project(d: &Daemon) {
    let repo = GitRepo::init(&d.base.join("up"));
    for i in 0..N {
        repo.write(&format!("f{i}.txt"), format!("file {i}\n"));
    }
    repo.commit_all("files", DATE1);
    d.cli_ok(["mirror", "add", "p", repo.path.to_str().unwrap()]);
}

fn cat_all(mnt: &Path) -> String {
    let paths: Vec<_> = (0..N).map(|i| mnt.join(format!("f{i}.txt"))).collect();
    let out = run(Command::new("cat").args(&paths), CMD_TIMEOUT);
    out.assert_ok();
    out.stdout_str()
}

#[test]
fn stats_count_the_requests_of_a_mount() {
    let d = Daemon::start();
    project(&d);
    d.cli_ok(["open", "t", "--project", "p"]);
    d.cli_ok(["open", "u", "--project", "p"]);
    let mnt = d.mount("t");

    let s0 = stats(&d, Some("t"));
    assert_eq!(s0["workspaces"][0]["thread"], "t");
    let text = cat_all(&mnt);
    assert!(text.contains("file 7\n"));
    let s1 = wait_count(&d, "t", "RELEASE", count(&s0, "RELEASE") + N);
    assert!(
        count(&s1, "OPEN") >= count(&s0, "OPEN") + N,
        "{N} cats, OPEN {} -> {}",
        count(&s0, "OPEN"),
        count(&s1, "OPEN")
    );
    assert!(count(&s1, "LOOKUP") >= count(&s0, "LOOKUP") + N);
    assert!(count(&s1, "RELEASE") >= count(&s0, "RELEASE") + N);

    // Warm: the names are cached, each open still asks once.
    cat_all(&mnt);
    let s2 = wait_count(&d, "t", "RELEASE", count(&s1, "RELEASE") + N);
    assert_eq!(count(&s2, "OPEN"), count(&s1, "OPEN") + N);
    assert_eq!(count(&s2, "RELEASE"), count(&s1, "RELEASE") + N);
    assert_eq!(count(&s2, "LOOKUP"), count(&s1, "LOOKUP"));
    let open = s2["total"]["ops"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["op"] == "OPEN"))
        .cloned()
        .expect("OPEN figures");
    assert!(open["p50_us"].as_u64().unwrap() <= open["p99_us"].as_u64().unwrap());
    let passthrough = s2["total"]["passthrough_opens"].as_u64().unwrap();
    let read = s2["total"]["bytes_read"].as_u64().unwrap();
    assert!(
        passthrough >= 2 * N || read >= 2 * text.len() as u64,
        "every open is passthrough or its bytes go through the daemon: {s2}"
    );

    // The other workspace saw none of it; the daemon-wide sum covers both.
    let su = stats(&d, Some("u"));
    assert_eq!(count(&su, "OPEN"), 0);
    let all = stats(&d, None);
    let threads: Vec<_> = all["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["thread"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(threads, ["t", "u"]);
    assert!(count(&all, "OPEN") >= count(&s2, "OPEN"));

    let table = d.cli_ok(["stats", "t"]);
    assert!(table.contains("OPEN") && table.contains("p99"), "{table}");
    let out = d.cli(["stats", "nosuch"]);
    out.assert_failed();
    assert!(
        out.stderr_str().contains("not mounted"),
        "{}",
        out.describe()
    );
}

#[test]
fn closing_a_created_file_costs_no_flush() {
    let d = Daemon::start();
    project(&d);
    d.cli_ok(["open", "t", "--project", "p"]);
    let mnt = d.mount("t");
    let s0 = stats(&d, Some("t"));
    for i in 0..N {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(mnt.join(format!("new{i}")))
            .expect("create");
        f.write_all(b"x").expect("write");
    }
    let s1 = wait_count(&d, "t", "RELEASE", count(&s0, "RELEASE") + N);
    assert_eq!(count(&s1, "CREATE"), count(&s0, "CREATE") + N);
    assert_eq!(count(&s1, "FLUSH"), count(&s0, "FLUSH"), "{s1}");
    for i in 0..N {
        assert_eq!(std::fs::read(mnt.join(format!("new{i}"))).unwrap(), b"x");
    }
}

/// `getxattr` answers "none" without the workspace lock while no extended attribute exists; one
/// set before a restart must still be read after it.
#[test]
fn xattrs_survive_the_lock_free_answer() {
    let py = |code: &str, path: &Path| {
        let out = run(
            Command::new("python3").args(["-c", code]).arg(path),
            CMD_TIMEOUT,
        );
        out.assert_ok();
        out.stdout_str().trim().to_string()
    };
    let get = "import os,sys\ntry:\n print(os.getxattr(sys.argv[1], 'user.k').decode())\nexcept OSError as e:\n print('errno', e.errno)";
    let mut d = Daemon::start();
    project(&d);
    d.cli_ok(["open", "t", "--project", "p"]);
    let f = d.mount("t").join("f1.txt");
    assert_eq!(py(get, &f), format!("errno {}", libc_enodata()));
    py(
        "import os,sys\nos.setxattr(sys.argv[1], 'user.k', b'v1')",
        &f,
    );
    assert_eq!(py(get, &f), "v1");
    d.stop();
    d.spawn();
    wait_mounted(&[d.mount("t")], Duration::from_secs(20));
    assert_eq!(py(get, &f), "v1");
    let g = d.mount("t").join("f2.txt");
    assert_eq!(py(get, &g), format!("errno {}", libc_enodata()));

    // security.capability is answered without the lock until one is set, other attributes or not;
    // one set before a restart is still read after it.
    let cap = "import os,sys\ntry:\n print(os.getxattr(sys.argv[1], 'security.capability').hex())\nexcept OSError as e:\n print('errno', e.errno)";
    assert_eq!(py(cap, &f), format!("errno {}", libc_enodata()));
    // VFS_CAP_REVISION_2, CAP_NET_BIND_SERVICE permitted.
    let blob = "0000000200040000000000000000000000000000";
    py(
        &format!(
            "import os,sys\nos.setxattr(sys.argv[1], 'security.capability', bytes.fromhex('{blob}'))"
        ),
        &g,
    );
    assert_eq!(py(cap, &g), blob);
    assert_eq!(py(cap, &f), format!("errno {}", libc_enodata()));
    d.stop();
    d.spawn();
    wait_mounted(&[d.mount("t")], Duration::from_secs(20));
    assert_eq!(py(cap, &g), blob);
    assert_eq!(py(get, &f), "v1");
}

fn libc_enodata() -> i32 {
    61
}

/// With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves dropping set-user/group-ID to octofs, and stops
/// asking `security.capability` before every write: each new file's second write costs no GETXATTR
/// (two per file before). An unprivileged write still drops set-user-ID, and set-group-ID with
/// group execution (pjdfstest chmod/12.t), through the daemon and through passthrough (where the
/// kernel sends a SETATTR that changes nothing, which octofs must read as "drop privileges").
#[test]
fn writes_drop_set_id_bits_without_asking_for_capabilities() {
    use std::os::unix::fs::PermissionsExt;
    for passthrough in [true, false] {
        let mut d = Daemon::unstarted();
        d.spawn_with(if passthrough {
            &[]
        } else {
            &["--passthrough", "false"]
        });
        project(&d);
        d.cli_ok(["open", "t", "--project", "p"]);
        let mnt = d.mount("t");
        std::fs::set_permissions(&mnt, std::fs::Permissions::from_mode(0o755)).unwrap();
        let s0 = stats(&d, Some("t"));
        for i in 0..N {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(mnt.join(format!("new{i}")))
                .expect("create");
            f.write_all(b"x").expect("write");
            f.write_all(b"y").expect("write");
        }
        let s1 = wait_count(&d, "t", "RELEASE", count(&s0, "RELEASE") + N);
        assert!(
            count(&s1, "GETXATTR") <= count(&s0, "GETXATTR") + N,
            "passthrough {passthrough}: at most one GETXATTR per new file: {s1}"
        );
        for (mode, left) in [(0o4777, 0o777), (0o2777, 0o777), (0o6777, 0o777)] {
            let f = mnt.join(format!("set-id-{mode:o}"));
            std::fs::write(&f, b"").unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let out = run(
                Command::new("setpriv")
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                    .args(["sh", "-c", "printf x >> \"$0\""])
                    .arg(&f),
                CMD_TIMEOUT,
            );
            out.assert_ok();
            let now = std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777;
            assert_eq!(
                now, left,
                "passthrough {passthrough}: {mode:o} after an unprivileged write"
            );
            assert_eq!(std::fs::read(&f).unwrap(), b"x");
        }
        // Root (CAP_FSETID) keeps them.
        let f = mnt.join("root-writes");
        std::fs::write(&f, b"").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4755)).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .and_then(|mut h| std::io::Write::write_all(&mut h, b"x"))
            .unwrap();
        let now = std::fs::metadata(&f).unwrap().permissions().mode() & 0o7777;
        assert_eq!(now, 0o4755, "passthrough {passthrough}: root's write");
        d.stop();
    }
}

// ---------------------------------------------------------------------------------------------
// Metrics (issue 32 item 9).

/// A port nobody listens on now (bound and let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `curl` of `url` (as `user`, else root): the HTTP status and the body.
fn curl(user: Option<User>, url: &str) -> (String, String) {
    let mut c = match user {
        Some(u) => as_user(u, "curl"),
        None => Command::new("curl"),
    };
    c.args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", url]);
    let out = run(&mut c, CMD_TIMEOUT);
    out.assert_ok();
    let text = out.stdout_str();
    let (body, code) = text.rsplit_once('\n').expect("curl's status line");
    (code.to_string(), body.to_string())
}

/// The value of the first sample of `text` named `name` with every label of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, ""));
        (n == name
            && labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
        .then(|| value.parse().ok())
        .flatten()
    })
}

/// Waits until the daemon's listener answers root with 200.
fn wait_metrics(url: &str) -> String {
    poll(Duration::from_secs(20), || {
        let mut c = Command::new("curl");
        c.args(["-sS", "--max-time", "5", "-w", "\n%{http_code}", url]);
        let text = try_run(&mut c, CMD_TIMEOUT).ok()?.stdout_str();
        match text.rsplit_once('\n') {
            Some((body, "200")) => Some(body.to_string()),
            _ => None,
        }
    })
    .unwrap_or_else(|| panic!("the metrics listener at {url} never answered"))
}

#[test]
fn metrics_are_served_to_root_only_and_well_formed() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let url = format!("http://{addr}/metrics");
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--metrics", &addr, "--passthrough", "false"]);
    open_the_way(&d);
    project(&d);
    let mnt = d.open_thread("t1", &["--project", "p"]);
    cat_all(&mnt);
    std::fs::write(mnt.join("new.txt"), b"hello\n").unwrap();
    assert!(std::fs::metadata(mnt.join("missing")).is_err());
    d.snapshot_id("t1");

    let body = wait_metrics(&url);
    // promtool (Prometheus's own checker) reads every line; `check metrics` fails on a malformed
    // exposition, and only lints names (its lint lines go to stdout with exit 3 at worst).
    let mut check = Command::new("promtool");
    check
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped());
    let checked = {
        use std::io::Write;
        let mut child = check
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("promtool (Debian's prometheus package: scripts/ensure-deps installs it)");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(
        !said.contains("error while linting") && !said.contains("text format parsing error"),
        "promtool: {said}\n{body}"
    );
    // Every histogram is whole: monotone buckets, +Inf equal to _count.
    let mut last: Option<(String, f64, f64)> = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value.parse().expect("a number");
        if let Some((name, le)) = series
            .split_once("_bucket{")
            .and_then(|(n, rest)| Some((n, rest.split("le=\"").nth(1)?.trim_end_matches("\"}"))))
        {
            let le: f64 = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            let key = format!("{name}{}", series.split("le=").next().unwrap());
            if let Some((k, l, v)) = &last
                && *k == key
            {
                assert!(le > *l && value >= *v, "{line} after le={l} {v}");
            }
            last = Some((key, le, value));
        } else if let Some((k, l, v)) = last.take() {
            assert!(l.is_infinite(), "{k} has no +Inf bucket");
            assert!(series.contains("_sum"), "{k} has no _sum after its buckets");
            let _ = v;
        }
    }
    assert!(
        sample(
            &body,
            "octofs_fuse_requests_total",
            &[("thread", "t1"), ("project", "p"), ("op", "write")]
        )
        .is_some_and(|n| n >= 1.0),
        "{body}"
    );
    assert!(
        sample(
            &body,
            "octofs_fuse_request_duration_seconds_count",
            &[("thread", "t1"), ("op", "lookup")]
        )
        .is_some_and(|n| n >= N as f64),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "octofs_snapshot_duration_seconds_count",
            &[("project", "p")]
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "octofs_mirror_clone_duration_seconds_count",
            &[("project", "p")]
        ),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        sample(
            &body,
            "octofs_live_threads",
            &[("uid", "0"), ("project", "p")]
        ),
        Some(1.0),
        "{body}"
    );
    assert!(
        sample(&body, "octofs_upper_bytes", &[("thread", "t1")]).is_some_and(|b| b >= 6.0),
        "{body}"
    );
    assert!(
        sample(&body, "octofs_process_resident_memory_bytes", &[]).is_some_and(|b| b > 0.0),
        "{body}"
    );

    // An ordinary user's client is refused with 403 and nothing else, over HTTP and the socket.
    let (code, refused) = curl(Some(user_a()), &url);
    assert_eq!(
        (code.as_str(), refused.as_str()),
        ("403", ""),
        "user's curl"
    );
    let out = d.cli_as(user_a(), &["metrics"]);
    out.assert_failed();
    assert!(out.stdout_str().is_empty(), "{}", out.describe());
    // Root's `octofs metrics` is the same exposition; a bad request is a 400 and the daemon lives.
    let text = d.cli_ok(["metrics"]);
    assert!(
        text.contains("# TYPE octofs_fuse_requests_total counter"),
        "{text}"
    );
    let mut bad = std::net::TcpStream::connect(&addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::io::Write::write_all(&mut bad, b"BOGUS\r\n\r\n").unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut bad, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer:?}");
    let (code, _) = curl(None, &format!("http://{addr}/nothing"));
    assert_eq!(code, "404");

    // A released thread leaves the per-thread series.
    d.cli_ok(["release", "t1"]);
    let body = wait_metrics(&url);
    assert!(!body.contains("thread=\"t1\""), "{body}");
    d.stop();
}

/// Stops the Prometheus server it holds (by its pid) when dropped.
struct Prometheus(std::process::Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET` of Prometheus's HTTP API `path?query`, parsed.
fn prom_api(port: u16, path: &str, query: Option<&str>) -> Option<Value> {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--max-time",
        "5",
        "-G",
        &format!("http://127.0.0.1:{port}{path}"),
    ]);
    if let Some(q) = query {
        c.args(["--data-urlencode", &format!("query={q}")]);
    }
    let out = try_run(&mut c, CMD_TIMEOUT).ok()?;
    serde_json::from_str(&out.stdout_str()).ok()
}

/// The value of a PromQL query answering one series (none while Prometheus has no such sample).
fn prom_value(port: u16, q: &str) -> Option<f64> {
    let v = prom_api(port, "/api/v1/query", Some(q))?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn a_real_prometheus_scrapes_the_daemon() {
    let prometheus = "/usr/bin/prometheus";
    assert!(
        Path::new(prometheus).exists(),
        "{prometheus} is missing: install Debian's prometheus package (scripts/ensure-deps does, as root)"
    );
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = Daemon::unstarted();
    d.spawn_with(&["--metrics", &addr, "--passthrough", "false"]);
    open_the_way(&d);
    project(&d);
    let (a, b) = (user_a(), user_b());
    d.cli_as(a, &["open", "t1", "--project", "p"]).assert_ok();
    d.cli_as(b, &["open", "t2", "--project", "p"]).assert_ok();
    for (u, t) in [(a, "t1"), (b, "t2")] {
        let mut c = as_user(u, "sh");
        c.args(["-c", "echo written > \"$0\"/new.txt && cat \"$0\"/f1.txt"])
            .arg(d.mount(t));
        run(&mut c, CMD_TIMEOUT).assert_ok();
    }
    d.cli_as(a, &["snapshot", "t1"]).assert_ok();
    wait_metrics(&format!("http://{addr}/metrics"));

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: octofs\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let prom_port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let _prom = Prometheus(child);

    let (ua, ub) = (a.uid.to_string(), b.uid.to_string());
    let checks: Vec<(String, f64)> = vec![
        (
            r#"octofs_fuse_requests_total{thread="t1",op="write"}"#.into(),
            1.0,
        ),
        (
            r#"octofs_fuse_requests_total{thread="t2",op="write"}"#.into(),
            1.0,
        ),
        (format!(r#"sum(octofs_live_threads{{uid="{ua}"}})"#), 1.0),
        (format!(r#"sum(octofs_live_threads{{uid="{ub}"}})"#), 1.0),
        (
            r#"octofs_snapshot_duration_seconds_count{project="p"}"#.into(),
            1.0,
        ),
        (r#"octofs_upper_bytes{thread="t2"}"#.into(), 8.0),
    ];
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut seen: Vec<Option<f64>>;
    loop {
        seen = checks
            .iter()
            .map(|(q, _)| prom_value(prom_port, q))
            .collect();
        let done = checks.iter().zip(&seen).all(|((q, want), got)| {
            // Live threads and the snapshot count are exact; the others at least.
            got.is_some_and(|g| {
                if q.contains("live") || q.contains("snapshot") {
                    g == *want
                } else {
                    g >= *want
                }
            })
        });
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw {:?}: {seen:?}\nprometheus log: {}",
            checks,
            std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let targets = prom_api(prom_port, "/api/v1/targets", None).expect("targets");
    let active = &targets["data"]["activeTargets"][0];
    assert_eq!(active["health"], "up", "{targets}");
    assert_eq!(
        active["scrapeUrl"],
        format!("http://{addr}/metrics"),
        "{targets}"
    );
    drop(_prom);
    d.stop();
}
