//! Benchmarks of the filesystem core without a kernel, over a real git base of 100,000 files (see
//! `support`): lookup and getattr, readdir of a big directory, create + unlink, `changes()` and
//! `view()` after N edits, loading a workspace whose catalog holds 100,000 records (after a clean
//! and after an unclean stop), and building the shared index of the 100,000-entry tree.
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

/// Create a new empty file in a base directory, release it, forget it, unlink it: one catalog
/// batch for the create and one for the unlink.
#[divan::bench]
fn create_unlink(b: Bencher) {
    let w = BASE.workspace();
    let dir = w.dir("d00");
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

/// An upper layer whose catalog holds 100,000 inode records (a chmod of every base file), left
/// by a clean stop (`close`) or an unclean one (dropped, as a SIGKILL leaves it).
fn catalog_100k(clean: bool) -> tempfile::TempDir {
    let w = BASE.workspace();
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    for (d, n) in every_file(&w) {
        let ino = w.fs.lookup(d, &n).expect("lookup").ino.0;
        w.fs.setattr(ino, set).expect("chmod");
    }
    let Workspace { upper, fs } = w;
    if clean {
        fs.close();
    }
    drop::<WorkspaceFs>(fs);
    upper
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
