//! Issue 10, "a reader saw a file that had just been written as empty": what a process writes through
//! the mount is what every later `stat`/`fstat`/`mmap` sees, whatever else runs at the same time.
//!
//! The report: a from-scratch `cargo build --release` inside a workspace failed once with "failed to
//! build archive …: failed to map object file: memory map must have a non-zero length". rustc
//! writes its object files into `target/*/deps`, closes them and then maps them with the length
//! `fstat` gives; meanwhile every other rustc of the build lists that same directory (its crate
//! search path). The cause (docs/caching.md, "Attributes are never older than the request"): a
//! directory's listing was computed once, at the first `readdirplus`, with every entry's
//! attributes, and the later `readdirplus` requests of the same handle handed those old attributes
//! to the kernel, which applied them to the live inodes (they carried no sign of being old): a file
//! written after the listing began read as its old size — empty — for the attribute timeout.
//!
//! - [`listing_continued_after_writes_keeps_sizes_with_passthrough`] /
//!   [`listing_continued_after_writes_keeps_sizes_without_passthrough`]: deterministic: a listing
//!   of a large directory is begun, every file is then written, the listing is finished, and every
//!   file must still stat (and map) at its written size.
//! - [`listing_continued_after_renames_shows_new_files_with_passthrough`] /
//!   [`listing_continued_after_renames_shows_new_files_without_passthrough`]: the same with a
//!   rename over each name (the `ar` / cargo pattern): the name must lead to the new file, not to the
//!   replaced one the listing remembered.
//! - [`parallel_writers_and_listers_with_passthrough`] /
//!   [`parallel_writers_and_listers_without_passthrough`]: the build-like stress (bounded time):
//!   writer threads create/write/close, rename over, and `O_TRUNC`-rewrite files in one directory,
//!   then `fstat` + `mmap` + read them as rustc's archive builder does, while separate processes
//!   list the directory (`ls -l`) and `stat` the files.

use crate::common;

use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Files in the listed directory: enough that a listing takes many `readdirplus` requests.
const FILES: usize = 1500;

fn setup(passthrough: bool, thread: &str) -> OneFileWorkspace {
    one_file_workspace(passthrough, thread, "write visibility\n")
}

/// Size by `fstat` of a fresh open and, when that is the size written (`want`), the bytes a mapping
/// of that length holds (what rustc's archive builder does with an object file). A size other than
/// `want` is not mapped: touching a mapping past the real end of a file raises SIGBUS.
fn fstat_and_map(path: &Path, want: usize) -> Result<(u64, Vec<u8>), String> {
    let f = File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let len = f
        .metadata()
        .map_err(|e| format!("fstat {}: {e}", path.display()))?
        .len();
    if len == 0 || len != want as u64 {
        return Ok((len, Vec::new()));
    }
    Ok((len, map_file(&f, want)?))
}

/// The first `len` bytes of `f` through a private read-only mapping.
fn map_file(f: &File, len: usize) -> Result<Vec<u8>, String> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh read-only private mapping of an open file, copied out and unmapped before
    // returning; nothing else refers to it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let v = std::slice::from_raw_parts(p as *const u8, len).to_vec();
        libc::munmap(p, len);
        Ok(v)
    }
}

fn content(i: usize, round: usize) -> Vec<u8> {
    pseudo_random(
        1000 + (i * 37 + round * 101) % 9000,
        (i * 7919 + round) as u64,
    )
}

/// Begins a listing of `dir` (the first `readdirplus` computes it), runs `change` on every name,
/// then reads the rest of the listing, as a process listing a directory while others write in it.
fn list_across(dir: &Path, change: impl Fn(&Path, usize)) -> usize {
    let mut rd = fs::read_dir(dir).expect("read_dir");
    rd.next().expect("a first entry").expect("first entry");
    for i in 0..FILES {
        change(&dir.join(format!("f{i:04}.o")), i);
    }
    let mut n = 1;
    for e in rd {
        e.expect("readdir entry");
        n += 1;
    }
    n
}

/// Every file of the directory must read, by `fstat` and `mmap`, as `expect(i)`.
fn check_all(dir: &Path, what: &str, expect: impl Fn(usize) -> Vec<u8>) {
    let mut wrong = Vec::new();
    for i in 0..FILES {
        let p = dir.join(format!("f{i:04}.o"));
        let want = expect(i);
        let stat_len = fs::metadata(&p).map(|m| m.len()).unwrap_or(u64::MAX);
        match fstat_and_map(&p, want.len()) {
            Ok((len, bytes)) if len == want.len() as u64 && bytes == want => {}
            Ok((len, _)) => wrong.push(format!(
                "{}: fstat size {len} (stat {stat_len}), written {}",
                p.display(),
                want.len()
            )),
            Err(e) => wrong.push(e),
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} of {FILES} files do not read as written, e.g.:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(8)].join("\n")
    );
}

fn listing_continued_after_writes(passthrough: bool) {
    let s = setup(passthrough, "lw");
    let dir = s.mount.join("deps");
    with_timeout(
        "listing across writes",
        Duration::from_secs(120),
        move || {
            fs::create_dir(&dir).expect("mkdir deps");
            for i in 0..FILES {
                File::create(dir.join(format!("f{i:04}.o"))).expect("create");
            }
            // Every name is in the kernel's cache (as after rustc created its object files).
            for i in 0..FILES {
                fs::metadata(dir.join(format!("f{i:04}.o"))).expect("stat");
            }
            let listed = list_across(&dir, |p, i| {
                let mut f = OpenOptions::new().write(true).open(p).expect("open");
                f.write_all(&content(i, 0)).expect("write");
            });
            assert_eq!(listed, FILES, "the listing has every name");
            check_all(&dir, "after a listing that began before the writes", |i| {
                content(i, 0)
            });
        },
    );
    drop(s.d);
}

#[test]
fn listing_continued_after_writes_keeps_sizes_with_passthrough() {
    listing_continued_after_writes(true);
}

#[test]
fn listing_continued_after_writes_keeps_sizes_without_passthrough() {
    listing_continued_after_writes(false);
}

fn listing_continued_after_renames(passthrough: bool) {
    let s = setup(passthrough, "lr");
    let dir = s.mount.join("deps");
    with_timeout(
        "listing across renames",
        Duration::from_secs(120),
        move || {
            fs::create_dir(&dir).expect("mkdir deps");
            for i in 0..FILES {
                fs::write(dir.join(format!("f{i:04}.o")), b"old").expect("write old");
            }
            let listed = list_across(&dir, |p, i| {
                // `ar`: the new archive is written beside the old one and renamed over it.
                let tmp = p.with_extension("tmp");
                fs::write(&tmp, content(i, 1)).expect("write tmp");
                fs::rename(&tmp, p).expect("rename over");
            });
            assert!(listed >= FILES, "the listing lost names: {listed} entries");
            check_all(
                &dir,
                "after a listing that began before renames over",
                |i| content(i, 1),
            );
        },
    );
    drop(s.d);
}

#[test]
fn listing_continued_after_renames_shows_new_files_with_passthrough() {
    listing_continued_after_renames(true);
}

#[test]
fn listing_continued_after_renames_shows_new_files_without_passthrough() {
    listing_continued_after_renames(false);
}

/// Kills (by its own process group) and reaps a helper process when dropped.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        kill_child_group(&self.0);
        let _ = self.0.wait();
    }
}

fn spawn_loop(script: &str, dir: &Path) -> Helper {
    use std::os::unix::process::CommandExt;
    Helper(
        Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn helper loop"),
    )
}

/// One writer step on `p` (file `i`): a fresh file (`create`), a temp file renamed over it
/// (`rename over`), or an `O_TRUNC` rewrite.
fn write_one(dir: &Path, i: usize, p: &Path, want: &[u8], how: &str) -> std::io::Result<()> {
    match how {
        "create" => {
            let _ = fs::remove_file(p);
            File::create(p)?.write_all(want)
        }
        "rename over" => {
            let tmp = dir.join(format!("w{i:04}.tmp"));
            fs::write(&tmp, want)?;
            fs::rename(&tmp, p)
        }
        _ => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(p)?
            .write_all(want),
    }
}

/// Writers, each on its own names, in rounds: create + write + close (a fresh object file), rename a
/// temp file over the name (an archive), or `O_TRUNC` + write (a rebuilt file); after each, the
/// writer maps the file as rustc does. Separate processes list and `stat` the directory all along.
fn parallel_writers_and_listers(passthrough: bool) {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 40;
    const RUN: Duration = Duration::from_secs(15);
    let s = setup(passthrough, "pw");
    let dir = s.mount.join("deps");
    fs::create_dir(&dir).expect("mkdir deps");
    // Enough other entries that each listing takes several requests.
    for i in 0..FILES {
        fs::write(dir.join(format!("pad{i:04}")), b"").expect("pad");
    }
    let listers = [
        spawn_loop("while :; do ls -l \"$1\" >/dev/null 2>&1; done", &dir),
        spawn_loop("while :; do ls -lU \"$1\" >/dev/null 2>&1; done", &dir),
        spawn_loop(
            "while :; do stat -c '%n %s' \"$1\"/w* >/dev/null 2>&1; done",
            &dir,
        ),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let dir2 = dir.clone();
    let failures = with_timeout("parallel writers", RUN * 4, move || {
        let started = Instant::now();
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let dir = dir2.clone();
            let stop = stop.clone();
            writers.push(std::thread::spawn(move || {
                let mut bad = Vec::new();
                let mut round = 0;
                while started.elapsed() < RUN && !stop.load(Ordering::Relaxed) && bad.len() < 10 {
                    for k in 0..PER_WRITER {
                        let i = w * PER_WRITER + k;
                        let p = dir.join(format!("w{i:04}.o"));
                        let want = content(i, round);
                        let how = ["create", "rename over", "O_TRUNC"][(round + k) % 3];
                        if let Err(e) = write_one(&dir, i, &p, &want, how) {
                            bad.push(format!("{}: round {round}, {how}: {e}", p.display()));
                            continue;
                        }
                        match fstat_and_map(&p, want.len()) {
                            Ok((len, bytes)) if len == want.len() as u64 && bytes == want => {}
                            Ok((len, bytes)) => bad.push(format!(
                                "{}: round {round}, {how}: fstat size {len}, written {}{}",
                                p.display(),
                                want.len(),
                                if len == want.len() as u64 && bytes != want {
                                    " (same size, other bytes)"
                                } else {
                                    ""
                                }
                            )),
                            Err(e) => bad.push(e),
                        }
                        // Another process's view of the same file.
                        let out = run(
                            Command::new("stat").args(["-c", "%s"]).arg(&p),
                            Duration::from_secs(10),
                        );
                        let seen = out.stdout_str().trim().to_string();
                        if seen != want.len().to_string() {
                            bad.push(format!(
                                "{}: round {round}: `stat` in another process says {seen:?}, \
                                 written {}",
                                p.display(),
                                want.len()
                            ));
                        }
                    }
                    round += 1;
                }
                (round, bad)
            }));
        }
        let mut all = Vec::new();
        let mut rounds = 0;
        for h in writers {
            let (r, bad) = h.join().expect("writer thread");
            rounds += r;
            all.extend(bad);
        }
        eprintln!("{WRITERS} writers, {rounds} rounds of {PER_WRITER} files in total");
        all
    });
    drop(listers);
    assert!(
        failures.is_empty(),
        "passthrough {passthrough}: {} files read other than written, e.g.:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    drop(s.d);
}

#[test]
fn parallel_writers_and_listers_with_passthrough() {
    parallel_writers_and_listers(true);
}

#[test]
fn parallel_writers_and_listers_without_passthrough() {
    parallel_writers_and_listers(false);
}
