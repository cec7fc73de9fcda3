//! The stat data of a new workspace's shared index equals, field for field, what the mount presents
//! for every base file (`getattr` through the core): if either side drifts (times, owner, inode
//! numbers, sizes), the first `git status` in every fork re-reads every file.

use std::ffi::OsStr;
use std::time::{Duration, UNIX_EPOCH};

use octofs::fs::{ROOT_INO, WorkspaceFs};
use octofs::layout::Layout;

use crate::common;

use common::{CORE_OWNER, DATE1, GitRepo, core_of_repo};

fn lookup_path(fs: &WorkspaceFs, path: &[u8]) -> fuser::FileAttr {
    let mut ino = ROOT_INO;
    let mut attr = fs.getattr(ino).expect("root");
    for c in path.split(|b| *b == b'/') {
        attr = fs
            .lookup(ino, OsStr::new(std::str::from_utf8(c).expect("utf-8 path")))
            .unwrap_or_else(|e| panic!("lookup {}: {e:?}", String::from_utf8_lossy(path)));
        ino = attr.ino.0;
    }
    attr
}

fn secs_nsecs(t: std::time::SystemTime) -> (u32, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    (d.as_secs() as u32, d.subsec_nanos())
}

#[test]
fn shared_index_stat_equals_what_getattr_presents() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let repo_dir = tmp.path().join("repo");
    std::fs::create_dir_all(&repo_dir).expect("mkdir");
    let r = GitRepo::init(&repo_dir);
    r.write("top.txt", "top\n");
    r.write("a/b/deep.txt", "deeper content\n");
    r.write("a/empty", "");
    r.write_exec("run.sh", "#!/bin/sh\necho hi\n");
    r.symlink("link", "a/b/deep.txt");
    let c = r.commit_all("one", DATE1);
    r.gitlink("sub", &c);
    r.commit_all("gitlink", DATE1);

    let (store, base, fs) = core_of_repo(tmp.path(), &repo_dir);
    let layout = Layout {
        state: tmp.path().join("state"),
        root: tmp.path().join("root"),
    };
    let index_path = octofs::repo::shared_index(
        &layout,
        &store,
        base.tree,
        base.tree,
        base.time,
        CORE_OWNER.0,
        CORE_OWNER.1,
    )
    .expect("shared index");
    let index = gix::index::File::at(
        &index_path,
        gix::hash::Kind::Sha1,
        false,
        Default::default(),
    )
    .expect("read index");
    let mut compared = 0;
    for e in index.entries() {
        let path = e.path(&index).to_vec();
        if e.mode == gix::index::entry::Mode::COMMIT {
            // A gitlink is a directory in the mount: git never compares its stat.
            assert_eq!(e.stat, Default::default(), "gitlink stat");
            continue;
        }
        let attr = lookup_path(&fs, &path);
        let name = String::from_utf8_lossy(&path);
        let (ms, mn) = secs_nsecs(attr.mtime);
        let (cs, cn) = secs_nsecs(attr.ctime);
        assert_eq!(
            (e.stat.mtime.secs, e.stat.mtime.nsecs),
            (ms, mn),
            "{name}: mtime"
        );
        assert_eq!(
            (e.stat.ctime.secs, e.stat.ctime.nsecs),
            (cs, cn),
            "{name}: ctime"
        );
        assert_eq!(e.stat.ino, attr.ino.0 as u32, "{name}: ino");
        assert_eq!(e.stat.uid, attr.uid, "{name}: uid");
        assert_eq!(e.stat.gid, attr.gid, "{name}: gid");
        assert_eq!(u64::from(e.stat.size), attr.size, "{name}: size");
        compared += 1;
    }
    assert_eq!(compared, 5, "every base file and symlink compared");
}
