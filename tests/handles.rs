//! The handle table of a mount without a kernel: the stale-base-handle rule, `EBADF` on base handles,
//! one passthrough backing per inode, and a writer (or truncate) never joining base readers.
//! The backing type is a plain number here; the adapter uses fuser's `BackingId`.

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::File;
use std::sync::Arc;

use fuser::Errno;
use octofs::fs::handles::Handles;
use octofs::fs::{ROOT_INO, WorkspaceFs};

use crate::common;

use common::core_of_files;

struct Fixture {
    _tmp: tempfile::TempDir,
    core: Arc<WorkspaceFs>,
    handles: Handles<u32>,
}

fn fixture() -> Fixture {
    let (tmp, core) = core_of_files(&[("f.txt", "base content\n"), ("d/g.txt", "g\n")]);
    let core = Arc::new(core);
    Fixture {
        handles: Handles::new(core.clone()),
        core,
        _tmp: tmp,
    }
}

/// The inode of `name` in the root, looked up as the kernel does (holding a reference to it).
fn ino_of(core: &WorkspaceFs, name: &str) -> u64 {
    core.lookup(ROOT_INO, OsStr::new(name))
        .expect("lookup")
        .ino
        .0
}

fn no_passthrough() -> Option<fn(&File) -> std::io::Result<u32>> {
    None
}

/// A registration that counts how often it ran and hands out that count as the backing id.
fn counting(calls: &Cell<u32>) -> Option<impl FnOnce(&File) -> std::io::Result<u32> + '_> {
    Some(move |_: &File| {
        calls.set(calls.get() + 1);
        Ok(calls.get())
    })
}

#[test]
fn a_base_handle_reads_the_copied_up_content_and_never_writes() {
    let fx = fixture();
    let ino = ino_of(&fx.core, "f.txt");
    let reader = fx
        .handles
        .open(ino, libc::O_RDONLY, no_passthrough())
        .expect("open ro");
    assert!(!reader.upper, "a read-only open serves the base content");
    assert_eq!(
        fx.handles.write(reader.fh, 0, b"x").map_err(|e| e.errno),
        Err(Errno::EBADF),
        "a base handle is not open for writing"
    );
    let writer = fx
        .handles
        .open(ino, libc::O_RDWR, no_passthrough())
        .expect("open rw");
    assert!(writer.upper, "a write-open copies up");
    assert_eq!(fx.handles.write(writer.fh, 0, b"BASE"), Ok(4));
    // The reader opened before the copy-up reads the current content, as any descriptor would.
    assert_eq!(
        fx.handles.read(reader.fh, 0, 100).expect("read"),
        b"BASE content\n"
    );
    // ... and from then on it is a handle on the data file.
    assert_eq!(fx.handles.write(reader.fh, 0, b"b"), Ok(1));
    fx.handles.release(ino, reader.fh);
    fx.handles.release(ino, writer.fh);
    assert!(fx.handles.is_empty());
    assert_eq!(
        fx.handles.read(reader.fh, 0, 1).map_err(|e| e.errno),
        Err(Errno::EBADF)
    );
}

#[test]
fn opens_of_one_inode_share_one_backing_while_any_is_open() {
    let fx = fixture();
    let ino = ino_of(&fx.core, "f.txt");
    let calls = Cell::new(0);
    let a = fx
        .handles
        .open(ino, libc::O_RDONLY, counting(&calls))
        .expect("open a");
    let b = fx
        .handles
        .open(ino, libc::O_RDONLY, counting(&calls))
        .expect("open b");
    assert_eq!(calls.get(), 1, "the second open reuses the inode's backing");
    let (ida, idb) = (a.backing.expect("backing a"), b.backing.expect("backing b"));
    assert!(Arc::ptr_eq(&ida, &idb));
    drop((ida, idb));
    fx.handles.release(ino, a.fh);
    let c = fx
        .handles
        .open(ino, libc::O_RDONLY, counting(&calls))
        .expect("open c");
    assert_eq!(calls.get(), 1, "still held by b");
    drop(c.backing);
    fx.handles.release(ino, b.fh);
    fx.handles.release(ino, c.fh);
    let d = fx
        .handles
        .open(ino, libc::O_RDONLY, counting(&calls))
        .expect("open d");
    assert_eq!(calls.get(), 2, "the last release dropped the backing");
    drop(d.backing);
    fx.handles.release(ino, d.fh);
}

#[test]
fn a_writer_never_joins_passthrough_readers_of_the_base() {
    let fx = fixture();
    let ino = ino_of(&fx.core, "f.txt");
    let calls = Cell::new(0);
    let reader = fx
        .handles
        .open(ino, libc::O_RDONLY, counting(&calls))
        .expect("open ro");
    assert_eq!(
        fx.handles
            .open(ino, libc::O_WRONLY, counting(&calls))
            .map(|o| o.fh)
            .map_err(|e| e.errno),
        Err(Errno::ESTALE),
        "the kernel must look the name up again"
    );
    let moved = ino_of(&fx.core, "f.txt");
    assert_ne!(moved, ino, "the name now leads to a new, copied-up inode");
    assert!(fx.core.is_upper(moved));
    let writer = fx
        .handles
        .open(moved, libc::O_WRONLY, counting(&calls))
        .expect("open the new inode");
    fx.handles.write(writer.fh, 0, b"NEW!").expect("write");
    assert_eq!(
        fx.handles.read(reader.fh, 0, 100).expect("read"),
        b"base content\n",
        "the readers keep the base content, as after a rename-over"
    );
    drop((reader.backing, writer.backing));
    fx.handles.release(ino, reader.fh);
    fx.handles.release(moved, writer.fh);
}

#[test]
fn a_truncate_of_a_base_file_readers_hold_moves_the_name_first() {
    let fx = fixture();
    let ino = ino_of(&fx.core, "f.txt");
    assert_eq!(
        fx.handles.before_truncate(ino),
        Ok(()),
        "nobody holds it: truncate in place"
    );
    let calls = Cell::new(0);
    let reader = fx
        .handles
        .open(ino, libc::O_RDONLY, counting(&calls))
        .expect("open ro");
    assert_eq!(
        fx.handles.before_truncate(ino).map_err(|e| e.errno),
        Err(Errno::ESTALE)
    );
    assert_ne!(ino_of(&fx.core, "f.txt"), ino);
    drop(reader.backing);
    fx.handles.release(ino, reader.fh);
}

/// All names of directory `ino` from `offset` on, with their offsets, up to `max` of them.
fn page(fx: &Fixture, ino: u64, offset: u64, max: usize) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    fx.handles
        .readdir(ino, offset, |off, e| {
            out.push((off, e.name.to_string_lossy().into_owned()));
            out.len() < max
        })
        .expect("readdir");
    out
}

/// A listing served a few names per request while other names come and go between the requests
/// lists every name present throughout exactly once (offsets by position would skip or repeat
/// names when a name before the position is added or removed), and a fresh listing shows the
/// changes (the cached names are read again after a commit).
#[test]
fn readdir_is_stateless_and_stable_across_changes() {
    let fx = fixture();
    let who = octofs::fs::Caller { uid: 0, gid: 0 };
    let mkdir = |name: &str| {
        fx.core
            .mkdir(ROOT_INO, OsStr::new(name), 0o755, who)
            .expect("mkdir");
    };
    let rmdir = |name: &str| fx.core.rmdir(ROOT_INO, OsStr::new(name)).expect("rmdir");
    for i in 0..40 {
        mkdir(&format!("keep{i}"));
    }
    for i in 0..20 {
        mkdir(&format!("gone{i}"));
    }
    let mut seen: Vec<String> = Vec::new();
    let mut offset = 0;
    let mut last = 0;
    let mut round = 0;
    loop {
        let got = page(&fx, ROOT_INO, offset, 3);
        let Some(&(off, _)) = got.last() else { break };
        for (o, name) in got {
            assert!(o > last, "offsets increase: {o} after {last} ({name})");
            last = o;
            seen.push(name);
        }
        offset = off;
        // Between two requests: one name goes, one comes.
        if round < 20 {
            rmdir(&format!("gone{round}"));
        }
        mkdir(&format!("new{round}"));
        round += 1;
    }
    assert_eq!(seen[..2], [".", ".."]);
    let mut throughout: Vec<String> = (0..40).map(|i| format!("keep{i}")).collect();
    throughout.extend(["d".to_string(), "f.txt".to_string()]);
    for name in &throughout {
        let n = seen.iter().filter(|s| *s == name).count();
        assert_eq!(n, 1, "{name} listed {n} times: {seen:?}");
    }
    let mut dedup = seen.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(dedup.len(), seen.len(), "no name twice: {seen:?}");

    // A fresh listing is the directory as it is now.
    let now: Vec<String> = page(&fx, ROOT_INO, 0, usize::MAX)
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert!(now.contains(&format!("new{}", round - 1)), "{now:?}");
    assert!(!now.iter().any(|n| n.starts_with("gone")), "{now:?}");
    assert_eq!(now.len(), 2 + 40 + 2 + round);
    // A file is not a directory.
    let file = ino_of(&fx.core, "f.txt");
    assert_eq!(
        fx.handles
            .readdir(file, 0, |_, _| true)
            .map_err(|e| e.errno),
        Err(Errno::ENOTDIR)
    );
}
