//! `octofs stats` on a real mount (issue 12): the per-opcode counts grow by what the kernel asked
//! for, the daemon-wide sum covers every mount; and the cheaper create of issue 13: a created file's
//! close costs no FLUSH request, and the lock-free `getxattr` answer stays right across a restart.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const N: u64 = 20;

fn stats(d: &Daemon, thread: Option<&str>) -> Value {
    let mut args = vec!["stats", "--json"];
    args.extend(thread);
    parse_json("stats --json", &d.cli_ok(args))
}

/// Requests of `op` in the answer's total.
fn count(v: &Value, op: &str) -> u64 {
    v["total"]["ops"]
        .as_array()
        .and_then(|ops| ops.iter().find(|o| o["op"] == op))
        .and_then(|o| o["count"].as_u64())
        .unwrap_or(0)
}

/// Waits until `op` of `thread` reached `want` (RELEASE reaches the daemon after `close` returns).
fn wait_count(d: &Daemon, thread: &str, op: &str, want: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = stats(d, Some(thread));
        if count(&v, op) >= want || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
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
