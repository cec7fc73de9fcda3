//! Benchmarks of the filesystem core without a kernel, over a real git base of 100,000 files (see
//! `support`): lookup and getattr, readdir of a big directory, create + unlink, `changes()` and
//! `view()` after N edits, loading a workspace whose catalog holds 100,000 records (after a clean
//! and after an unclean stop), building the shared index of the 100,000-entry tree, and snapshots
//! of 1 / 100 / 1,000 changed files after 10,000 earlier copy-ups (from the last snapshot's tree,
//! and walking every change from the base as before).
//!
//! `cargo bench --bench core` runs them all (a few minutes; setup is shared and built once);
//! `cargo bench --bench core -- lookup` runs those whose name contains `lookup`.

use std::ffi::OsString;
use std::sync::LazyLock;

use divan::counter::ItemsCount;
use divan::{Bencher, black_box};
use octofs::fs::{SetAttr, WorkspaceFs};
use octofs::layout::Layout;

mod support;

use support::{
    BIG, Base, CALLER, DIRS, OWNER, PER_DIR, Workspace, big_name, copy_dir, dir_name, file_name,
    scratch,
};

static BASE: LazyLock<Base> = LazyLock::new(Base::build);

fn main() {
    divan::main();
}

/// Every (directory inode, name) of the tree's 100,000 files, in a scattered order.
fn every_file(w: &Workspace) -> Vec<(u64, OsString)> {
    let mut out = Vec::with_capacity(BIG + DIRS * PER_DIR);
    let big = w.dir("big");
    out.extend((0..BIG).map(|f| (big, OsString::from(big_name(f)))));
    for d in 0..DIRS {
        let dir = w.dir(&dir_name(d));
        out.extend((0..PER_DIR).map(|f| (dir, OsString::from(file_name(f)))));
    }
    // A fixed shuffle (a multiplicative step coprime with the length), so that consecutive
    // lookups do not walk one directory in order.
    let n = out.len();
    (0..n).map(|i| out[(i * 7919) % n].clone()).collect()
}

/// `lookup` of a name already looked up once (the node is in the inode table), over all 100,000
/// files in a scattered order.
#[divan::bench]
fn lookup_warm_100k_tree(b: Bencher) {
    let w = BASE.workspace();
    let names = every_file(&w);
    for (d, n) in &names {
        w.fs.lookup(*d, n).expect("lookup");
    }
    let mut i = 0;
    b.bench_local(|| {
        let (d, n) = &names[i % names.len()];
        i += 1;
        w.fs.lookup(*d, n).expect("lookup")
    });
}

/// The first `lookup` of every name of a 10,000-entry directory in a freshly loaded workspace
/// (what the first `git status` after a fork does).
#[divan::bench(sample_count = 10, sample_size = 1)]
fn lookup_first_10k_dir(b: Bencher) {
    let names: Vec<OsString> = (0..BIG).map(|f| OsString::from(big_name(f))).collect();
    b.counter(ItemsCount::new(BIG))
        .with_inputs(|| {
            let w = BASE.workspace();
            let big = w.dir("big");
            (w, big)
        })
        .bench_local_refs(|(w, big)| {
            for n in &names {
                black_box(w.fs.lookup(*big, n).expect("lookup"));
            }
        });
}

/// `getattr` of a known inode, over all 100,000 files in a scattered order.
#[divan::bench]
fn getattr_100k_tree(b: Bencher) {
    let w = BASE.workspace();
    let inos: Vec<u64> = every_file(&w)
        .iter()
        .map(|(d, n)| w.fs.lookup(*d, n).expect("lookup").ino.0)
        .collect();
    let mut i = 0;
    b.bench_local(|| {
        let ino = inos[i % inos.len()];
        i += 1;
        w.fs.getattr(ino).expect("getattr")
    });
}

/// `readdir` (names and attributes, as readdirplus needs) of a base directory of 1,000 and of
/// 10,000 entries.
#[divan::bench(args = ["d00", "big"])]
fn readdir(b: Bencher, dir: &str) {
    let w = BASE.workspace();
    let ino = w.dir(dir);
    let n = w.fs.readdir(ino).expect("readdir").len();
    b.counter(ItemsCount::new(n))
        .bench_local(|| w.fs.readdir(ino).expect("readdir"));
}

/// Create a new empty file in a base directory of 1,000 and of 10,000 entries, release it,
/// forget it, unlink it: one catalog batch for the create and one for the unlink.
#[divan::bench(args = ["d00", "big"])]
fn create_unlink(b: Bencher, dir: &str) {
    let w = BASE.workspace();
    let dir = w.dir(dir);
    let name = OsString::from("bench-new-file");
    b.bench_local(|| {
        let (attr, opened) =
            w.fs.create(
                dir,
                &name,
                libc::S_IFREG | 0o644,
                libc::O_RDWR | libc::O_CREAT,
                CALLER,
            )
            .expect("create");
        drop(opened.file);
        w.fs.release(attr.ino.0, opened.write);
        w.fs.forget(attr.ino.0, 1);
        w.fs.unlink(dir, &name).expect("unlink");
    });
}

/// A workspace with `n` edits: half new files (with a few bytes each), half chmods of base files,
/// spread over the directories.
fn edited(n: usize) -> Workspace {
    let w = BASE.workspace();
    let dirs: Vec<u64> = (0..DIRS).map(|d| w.dir(&dir_name(d))).collect();
    for i in 0..n {
        let dir = dirs[i % DIRS];
        if i % 2 == 0 {
            let name = OsString::from(format!("new{i:06}"));
            let (attr, opened) =
                w.fs.create(
                    dir,
                    &name,
                    libc::S_IFREG | 0o644,
                    libc::O_RDWR | libc::O_CREAT,
                    CALLER,
                )
                .expect("create");
            std::os::unix::fs::FileExt::write_all_at(&opened.file, b"new content\n", 0)
                .expect("write");
            drop(opened.file);
            w.fs.release(attr.ino.0, opened.write);
        } else {
            let name = OsString::from(file_name((i / DIRS) % PER_DIR));
            let ino = w.fs.lookup(dir, &name).expect("lookup").ino.0;
            let set = SetAttr {
                mode: Some(0o600),
                ..SetAttr::default()
            };
            w.fs.setattr(ino, set).expect("chmod");
        }
    }
    w
}

/// `changes()` (what `octofs status` lists) after 100 and 10,000 edits.
#[divan::bench(args = [100, 10_000], sample_count = 20)]
fn changes_after_edits(b: Bencher, n: usize) {
    let w = edited(n);
    b.bench_local(|| w.fs.changes().expect("changes"));
}

/// `view()` (what a snapshot is built from) after 100 and 10,000 edits.
#[divan::bench(args = [100, 10_000], sample_count = 20)]
fn view_after_edits(b: Bencher, n: usize) {
    let w = edited(n);
    b.bench_local(|| w.fs.view().expect("view"));
}

/// Log batches after which every commit counts the workspace's inodes (to decide on compaction).
const LONG_LOG: usize = 20_000;

/// An upper layer whose catalog holds 100,000 inode records (a chmod of every base file), left
/// by a clean stop (`close`) or an unclean one (dropped, as a SIGKILL leaves it; its log then
/// holds the last 20,000 records, the snapshot the others).
///
/// Written in rounds of [`LONG_LOG`] chmods with a clean stop (which compacts the log) between
/// them: past that many batches in the log every commit counts all inodes (see `chmod`), and
/// 100,000 chmods in one go would take minutes.
fn catalog_100k(clean: bool) -> tempfile::TempDir {
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    let mut w = BASE.workspace();
    let names = every_file(&w);
    for (i, round) in names.chunks(LONG_LOG).enumerate() {
        if i > 0 {
            w.fs.close();
            let Workspace { upper, fs } = w;
            drop::<WorkspaceFs>(fs);
            let fs = BASE.load(upper.path());
            w = Workspace { upper, fs };
        }
        for (d, n) in round {
            let ino = w.fs.lookup(*d, n).expect("lookup").ino.0;
            w.fs.setattr(ino, set).expect("chmod");
        }
    }
    let Workspace { upper, fs } = w;
    if clean {
        fs.close();
    }
    drop::<WorkspaceFs>(fs);
    // The catalog must really hold them (a record is well over 40 bytes of JSON).
    let bytes: u64 = std::fs::read_dir(upper.path())
        .expect("upper dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("catalog"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert!(
        bytes > 40 * 100_000,
        "the catalog holds {bytes} bytes after 100,000 chmods"
    );
    eprintln!(
        "catalog after 100,000 chmods ({} stop): {:.1} MiB",
        if clean { "clean" } else { "unclean" },
        bytes as f64 / (1 << 20) as f64
    );
    upper
}

/// A chmod of a base file (one catalog batch), with 100,000 inodes in the table: in a workspace
/// whose log is short, and in one whose log holds more than [`LONG_LOG`] batches (where every
/// commit counts the inodes to decide whether to compact).
#[divan::bench(args = ["short log", "long log"], sample_count = 20)]
fn chmod(b: Bencher, log: &str) {
    let w = BASE.workspace();
    let inos: Vec<u64> = every_file(&w)
        .iter()
        .map(|(d, n)| w.fs.lookup(*d, n).expect("lookup").ino.0)
        .collect();
    let mut mode = 0o600;
    let mut set = |ino: u64| {
        mode ^= 0o040;
        let set = SetAttr {
            mode: Some(mode),
            ..SetAttr::default()
        };
        w.fs.setattr(ino, set).expect("chmod")
    };
    if log == "long log" {
        for &ino in &inos[..LONG_LOG + 1] {
            set(ino);
        }
    }
    let mut i = 0;
    b.bench_local(|| {
        i += 1;
        set(inos[(i * 7) % inos.len()])
    });
}

static CLEAN_100K: LazyLock<tempfile::TempDir> = LazyLock::new(|| catalog_100k(true));
static UNCLEAN_100K: LazyLock<tempfile::TempDir> = LazyLock::new(|| catalog_100k(false));

/// `WorkspaceFs::load` of an upper layer whose catalog holds 100,000 records, after a clean stop
/// (the snapshot) and after an unclean one (the log, and the checks of an unclean load). Each
/// sample loads a fresh copy.
#[divan::bench(args = ["clean", "unclean"], sample_count = 5, sample_size = 1)]
fn load_catalog_100k(b: Bencher, stop: &str) {
    let template = if stop == "clean" {
        &*CLEAN_100K
    } else {
        &*UNCLEAN_100K
    };
    b.with_inputs(|| copy_dir(template.path()))
        .bench_local_values(|(keep, upper)| (BASE.load(&upper), keep));
}

/// The shared index of the 100,000-entry tree (what every fork's `.git/index` starts from), built
/// into a fresh state directory each sample.
#[divan::bench(sample_count = 5, sample_size = 1)]
fn shared_index_100k(b: Bencher) {
    b.with_inputs(scratch).bench_local_values(|state| {
        let layout = Layout {
            state: state.path().to_path_buf(),
            root: state.path().join("root"),
        };
        let path = octofs::repo::shared_index(
            &layout,
            &BASE.store,
            BASE.tree,
            BASE.tree,
            BASE.time,
            OWNER.0,
            OWNER.1,
        )
        .expect("shared index");
        (path, state)
    });
}

/// Files copied up before the snapshot benchmarks.
const COPIED_UP: usize = 10_000;

/// The i-th copied-up file: spread over the directories `d00`.. (about 111 in each).
fn copied(i: usize) -> (usize, usize) {
    (i % DIRS, (i / DIRS) % PER_DIR)
}

/// Appends one line to each file of `which` through the core (open for writing, write, release).
fn append(w: &Workspace, dirs: &[u64], which: impl Iterator<Item = usize>, line: &[u8]) {
    for i in which {
        let (d, f) = copied(i);
        let ino =
            w.fs.lookup(dirs[d], &OsString::from(file_name(f)))
                .expect("lookup")
                .ino
                .0;
        let opened = w.fs.open(ino, libc::O_WRONLY).expect("open");
        let size = opened.file.metadata().expect("fstat").len();
        std::os::unix::fs::FileExt::write_all_at(&opened.file, line, size).expect("append");
        drop(opened.file);
        w.fs.release(ino, opened.write);
    }
}

/// A snapshot's tree as the daemon builds it (the view, then the tree from the edits; the files'
/// blob ids remembered by stamp), saved as the core's last snapshot.
fn snapshot_tree(
    w: &Workspace,
    repo: &gix::Repository,
    last: Option<gix::ObjectId>,
    caches: &octofs::git::snapshot::Caches,
) -> gix::ObjectId {
    let v = w.fs.snapshot_view(last).expect("snapshot view");
    assert_eq!(
        v.since_last,
        last.is_some(),
        "the snapshot view is built from the last snapshot exactly when it is given"
    );
    let mut edits = v.edits;
    edits.sort_by(|a, b| a.path().cmp(b.path()));
    let clock = Some((v.taken_at.0, i64::from(v.taken_at.1)));
    let tree =
        octofs::git::snapshot::build_tree(repo, v.onto, &edits, clock, caches).expect("build tree");
    w.fs.snapshot_saved(v.epoch, tree);
    tree
}

/// A snapshot of `k` changed files after 10,000 earlier copy-ups and a first snapshot: from the
/// last snapshot's tree (`since_last`, rebuilding only the paths changed since) or walking every
/// change from the base (what every snapshot did before). Each sample appends to `k` other files
/// first (not timed).
fn snapshot_after_copy_ups(b: Bencher, k: usize, since_last: bool) {
    let cpu = std::cell::RefCell::new(Vec::new());
    let w = BASE.workspace();
    let repo = gix::open(BASE._repo.path()).expect("open the base repository");
    let dirs: Vec<u64> = (0..DIRS).map(|d| w.dir(&dir_name(d))).collect();
    append(&w, &dirs, 0..COPIED_UP, b"copied up\n");
    // One set of snapshot caches across the samples, as the daemon keeps one across snapshots.
    let caches = octofs::git::snapshot::Caches::new();
    let last = std::cell::Cell::new(Some(snapshot_tree(&w, &repo, None, &caches)));
    let next = std::cell::Cell::new(0usize);
    b.with_inputs(|| {
        let from = next.get();
        next.set(from + k);
        append(
            &w,
            &dirs,
            (from..from + k).map(|i| i % COPIED_UP),
            b"changed\n",
        );
    })
    .bench_local_values(|()| {
        let before = thread_cpu_ns();
        let tree = snapshot_tree(
            &w,
            &repo,
            if since_last { last.get() } else { None },
            &caches,
        );
        cpu.borrow_mut()
            .push(thread_cpu_ns().saturating_sub(before));
        last.set(Some(tree));
        tree
    });
    // On a loaded machine the wall time is mostly waiting for a CPU; the thread's own CPU time is
    // what a snapshot costs.
    let mut cpu = cpu.into_inner();
    cpu.sort_unstable();
    if let (Some(lo), Some(hi)) = (cpu.first(), cpu.last()) {
        let ms = |ns: u64| ns as f64 / 1e6;
        eprintln!(
            "snapshot_{}({k}): CPU time of the snapshot thread: median {:.1} ms ({:.1}-{:.1}), {} samples",
            if since_last {
                "since_last"
            } else {
                "full_walk"
            },
            ms(cpu[cpu.len() / 2]),
            ms(*lo),
            ms(*hi),
            cpu.len()
        );
    }
}

/// Nanoseconds of CPU this thread has used.
fn thread_cpu_ns() -> u64 {
    u64::try_from(octofs::sys::thread_cpu_time().as_nanos()).unwrap_or(u64::MAX)
}

#[divan::bench(args = [1, 100, 1_000], sample_count = 10, sample_size = 1)]
fn snapshot_since_last(b: Bencher, k: usize) {
    snapshot_after_copy_ups(b, k, true);
}

#[divan::bench(args = [1, 100, 1_000], sample_count = 10, sample_size = 1)]
fn snapshot_full_walk(b: Bencher, k: usize) {
    snapshot_after_copy_ups(b, k, false);
}
