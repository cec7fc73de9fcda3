//! The small-file write path of the core without a kernel: a created file's handle is its data
//! file (made once, not created, closed and opened again), its open is counted with the create, and
//! the handle of a write-open that copies a base file up is the data file the copy-up made.

use std::ffi::OsStr;
use std::os::unix::fs::FileExt;

use octofs::fs::{Caller, Changed, ROOT_INO, WorkspaceFs};

use crate::common;

use common::core_of_files;

const ROOT: Caller = Caller { uid: 0, gid: 0 };

struct Fixture {
    _tmp: tempfile::TempDir,
    core: WorkspaceFs,
}

fn fixture() -> Fixture {
    let (tmp, core) = core_of_files(&[("base.txt", "base content\n")]);
    Fixture { core, _tmp: tmp }
}

/// The paths git's fsmonitor would be told about now: files open for writing are among them.
fn open_writers(core: &WorkspaceFs) -> Vec<String> {
    let (token, _) = core.fsmonitor_query("");
    match core.fsmonitor_query(&token).1 {
        Changed::Paths(p) => p
            .into_iter()
            .map(|p| String::from_utf8_lossy(&p).into_owned())
            .collect(),
        Changed::Everything => panic!("the journal answered everything"),
    }
}

/// Fails if the handle were another file than the data file (a second, stale or read-only open),
/// or if the create did not count its open (the data file would go with the last name and
/// reference while the handle is still open).
#[test]
fn a_created_files_handle_is_its_data_file_and_its_open_is_counted() {
    let fx = fixture();
    let core = &fx.core;
    let name = OsStr::new("new.txt");
    let (attr, opened) = core
        .create(ROOT_INO, name, 0o644, libc::O_WRONLY | libc::O_EXCL, ROOT)
        .expect("create");
    let ino = attr.ino.0;
    assert_eq!(attr.size, 0);
    assert!(opened.upper && opened.write);
    // The attributes came from the descriptor: the same as a getattr reads from the path.
    let again = core.getattr(ino).expect("getattr");
    assert_eq!(
        (again.size, again.mtime, again.ctime, again.perm),
        (attr.size, attr.mtime, attr.ctime, attr.perm)
    );
    opened.file.write_all_at(b"hello", 0).expect("write");
    assert_eq!(std::fs::read(core.data_path(ino)).expect("read"), b"hello");
    assert_eq!(core.getattr(ino).expect("getattr").size, 5);
    // Counted as a writer: fsmonitor names it while it is open for writing.
    assert!(open_writers(core).contains(&"new.txt".to_string()));

    // Unlinked and forgotten by the kernel while still open: the data file stays for the handle.
    core.unlink(ROOT_INO, name).expect("unlink");
    core.forget(ino, 1);
    assert!(
        core.data_path(ino).exists(),
        "the open handle keeps the data"
    );
    let mut buf = [0u8; 5];
    opened.file.read_exact_at(&mut buf, 0).expect("read");
    assert_eq!(&buf, b"hello");
    drop(opened);
    core.release(ino, true);
    assert!(
        !core.data_path(ino).exists(),
        "the last release of an unlinked file removes its data"
    );
    assert!(open_writers(core).is_empty());
}

/// `O_RDONLY|O_CREAT` makes no writer: its release must not un-count another handle's write-open.
#[test]
fn a_read_only_create_is_no_writer() {
    let fx = fixture();
    let core = &fx.core;
    let (attr, opened) = core
        .create(ROOT_INO, OsStr::new("ro.txt"), 0o644, libc::O_RDONLY, ROOT)
        .expect("create");
    let ino = attr.ino.0;
    assert!(!opened.write);
    assert!(open_writers(core).is_empty());
    let w = core.open(ino, libc::O_WRONLY).expect("open for writing");
    assert_eq!(open_writers(core), vec!["ro.txt".to_string()]);
    drop(opened);
    core.release(ino, false);
    assert_eq!(
        open_writers(core),
        vec!["ro.txt".to_string()],
        "the writer is still open"
    );
    drop(w);
    core.release(ino, true);
    assert!(open_writers(core).is_empty());
}

/// A write-open copies the base file up; its handle is the data file just made (not the blob),
/// positioned nowhere in particular (I/O is by offset), holding the base content — or nothing
/// with `O_TRUNC`.
#[test]
fn the_handle_of_a_copy_up_is_the_new_data_file() {
    let fx = fixture();
    let core = &fx.core;
    let ino = core
        .lookup(ROOT_INO, OsStr::new("base.txt"))
        .expect("lookup")
        .ino
        .0;
    let rw = core.open(ino, libc::O_RDWR).expect("open rw");
    assert!(rw.upper && rw.write);
    let mut buf = vec![0u8; 13];
    rw.file.read_exact_at(&mut buf, 0).expect("read");
    assert_eq!(buf, b"base content\n");
    rw.file.write_all_at(b"BASE", 0).expect("write");
    assert_eq!(
        std::fs::read(core.data_path(ino)).expect("read"),
        b"BASE content\n"
    );
    drop(rw);
    core.release(ino, true);

    let name = OsStr::new("trunc.txt");
    let (attr, made) = core
        .create(ROOT_INO, name, 0o644, libc::O_WRONLY, ROOT)
        .expect("create");
    made.file.write_all_at(b"old bytes", 0).expect("write");
    drop(made);
    core.release(attr.ino.0, true);
    let t = core
        .open(attr.ino.0, libc::O_WRONLY | libc::O_TRUNC)
        .expect("open");
    t.file.write_all_at(b"new", 0).expect("write");
    assert_eq!(
        std::fs::read(core.data_path(attr.ino.0)).expect("read"),
        b"new"
    );
    drop(t);
    core.release(attr.ino.0, true);
}

/// A base file opened with `O_TRUNC`: the copy-up makes an empty data file and that is the handle.
#[test]
fn a_truncating_open_of_a_base_file_writes_the_empty_copy() {
    let fx = fixture();
    let core = &fx.core;
    let ino = core
        .lookup(ROOT_INO, OsStr::new("base.txt"))
        .expect("lookup")
        .ino
        .0;
    let t = core
        .open(ino, libc::O_WRONLY | libc::O_TRUNC)
        .expect("open");
    assert_eq!(core.getattr(ino).expect("getattr").size, 0);
    t.file.write_all_at(b"xy", 0).expect("write");
    assert_eq!(std::fs::read(core.data_path(ino)).expect("read"), b"xy");
    assert_eq!(core.getattr(ino).expect("getattr").size, 2);
    drop(t);
    core.release(ino, true);
}

/// git writes each new object to `objects/xx/tmp_obj_*`, links it to its real name and unlinks
/// the first name; the kernel's RELEASE of the handle that wrote it may reach the daemon after
/// both. Fails if a writer with two links, or one with none left, made the fsmonitor answer
/// "everything" (each `git status` in that window would rescan the whole tree), or if a name of
/// such a writer were left out (git would trust a stale stat of a file that may still change).
#[test]
fn an_open_writer_is_named_by_each_of_its_links_and_by_none_once_unlinked() {
    let fx = fixture();
    let core = &fx.core;
    let dir = core
        .mkdir(ROOT_INO, OsStr::new("objects"), 0o755, ROOT)
        .expect("mkdir")
        .ino
        .0;
    let (attr, opened) = core
        .create(
            dir,
            OsStr::new("tmp_obj_1"),
            0o444,
            libc::O_RDWR | libc::O_EXCL,
            ROOT,
        )
        .expect("create");
    let ino = attr.ino.0;
    opened.file.write_all_at(b"object", 0).expect("write");
    assert_eq!(open_writers(core), ["objects/tmp_obj_1"]);

    core.link(ino, dir, OsStr::new("ab12")).expect("link");
    core.link(ino, ROOT_INO, OsStr::new("outside"))
        .expect("link");
    assert_eq!(
        open_writers(core),
        ["objects/ab12", "objects/tmp_obj_1", "outside"]
    );
    core.unlink(dir, OsStr::new("tmp_obj_1")).expect("unlink");
    assert_eq!(open_writers(core), ["objects/ab12", "outside"]);
    core.unlink(ROOT_INO, OsStr::new("outside"))
        .expect("unlink");
    assert_eq!(open_writers(core), ["objects/ab12"]);
    core.unlink(dir, OsStr::new("ab12")).expect("unlink");
    assert!(
        open_writers(core).is_empty(),
        "an unlinked writer has no name"
    );

    drop(opened);
    core.release(ino, true);
    assert!(open_writers(core).is_empty());
}

/// git writes a new object as `tmp_obj_*`, links it to its final name and unlinks the first; the
/// kernel's RELEASE of the handle that wrote it may be served between the link and the unlink (on
/// the io_uring transport it waits on the caller's CPU). The journal then records both names, not
/// "a change whose path is unknown", and the next fsmonitor query names what changed instead of
/// answering everything. Failed before: `git_workspace::first_status_reads_no_content_and_
/// fsmonitor_misses_nothing` saw "everything" after `git add` in 1 run of 5 on the ring.
#[test]
fn a_release_between_link_and_unlink_journals_both_names() {
    let fx = fixture();
    let core = &fx.core;
    let (token, _) = core.fsmonitor_query("");
    let (attr, opened) = core
        .create(
            ROOT_INO,
            OsStr::new("tmp_obj_1"),
            0o444,
            libc::O_WRONLY | libc::O_EXCL,
            ROOT,
        )
        .expect("create");
    let ino = attr.ino.0;
    opened.file.write_all_at(b"blob", 0).expect("write");
    core.link(ino, ROOT_INO, OsStr::new("final")).expect("link");
    drop(opened);
    core.release(ino, true);
    core.unlink(ROOT_INO, OsStr::new("tmp_obj_1"))
        .expect("unlink");
    match core.fsmonitor_query(&token).1 {
        Changed::Paths(p) => {
            let p: Vec<String> = p
                .into_iter()
                .map(|p| String::from_utf8_lossy(&p).into_owned())
                .collect();
            assert!(p.contains(&"final".to_string()), "{p:?}");
        }
        Changed::Everything => {
            panic!("the journal answered everything after link, release, unlink")
        }
    }
}
