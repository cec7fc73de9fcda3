//! octofs run entirely by an ordinary user: `octofs` (the CLI starting its own daemon) with the XDG
//! defaults the README promises (state in `$XDG_DATA_HOME/octofs`, mounts in
//! `$XDG_RUNTIME_DIR/octofs`), mounting through the setuid `fusermount3` (an ordinary user may not
//! call mount(2)) without passthrough: mirror add, open, write, git status, snapshot, a busy release
//! refused, release, resume with the file back, stop with nothing left mounted.
//!
//! Failed before: the mount was refused (`/dev/fuse` not openable by the user was an error instead
//! of a reason to use `fusermount3`), and an unmount by the daemon (`umount2`, root only) failed
//! with EPERM, so release and stop left the mount to a lazy detach and removed the upper layer
//! under the still-running filesystem.

use crate::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const DATE: &str = "2026-01-01T00:00:00Z";

/// Everything the user's octofs made, torn down whatever happens.
struct UserSetup {
    dir: tempfile::TempDir,
    user: User,
    bin: PathBuf,
}

impl UserSetup {
    fn cli(&self, args: &[&str]) -> Out {
        let mut c = as_user(self.user, &self.bin);
        c.args(args)
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env("XDG_RUNTIME_DIR", self.dir.path().join("run"))
            .current_dir("/");
        run(&mut c, Duration::from_secs(120))
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.success(), "{args:?}: {}", out.describe());
        out.stdout_str()
    }

    /// `program args` run as the user in `cwd` (entered by the user: without `allow_other` not
    /// even root may enter the user's mount).
    fn as_user(&self, program: &str, args: &[&str], cwd: &Path) -> Out {
        let mut c = as_user(self.user, "sh");
        c.args(["-c", "cd \"$0\" && exec \"$@\""])
            .arg(cwd)
            .arg(program)
            .args(args)
            .current_dir("/");
        run(&mut c, Duration::from_secs(60))
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("run/octofs")
    }
}

impl Drop for UserSetup {
    fn drop(&mut self) {
        let _ = self.cli(&["stop"]);
        umount_all_under(self.dir.path());
    }
}

#[test]
fn an_ordinary_user_runs_octofs_without_root() {
    let user = user_a();
    // The distributions' udev rule makes /dev/fuse 0666; scripts/ensure-deps does the same where
    // no udev runs.
    let fuse = Path::new("/dev/fuse");
    let mode = std::fs::metadata(fuse)
        .expect("/dev/fuse")
        .permissions()
        .mode();
    if mode & 0o006 != 0o006 {
        std::fs::set_permissions(fuse, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    }
    let dir = tempfile::Builder::new()
        .prefix("octofs-user-")
        .tempdir()
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("octofs");
    std::fs::copy(bin(), &copy).expect("copy the binary");
    for sub in ["data", "run"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    let upstream = GitRepo::init(&dir.path().join("upstream"));
    upstream.write("README.md", "made by root, read by the user\n");
    upstream.commit_all("initial", DATE);
    let chown = run(
        Command::new("chown")
            .arg("-R")
            .arg(format!("{}:{}", user.uid, user.gid))
            .arg(dir.path()),
        Duration::from_secs(30),
    );
    assert!(chown.success(), "{}", chown.describe());
    let s = UserSetup {
        dir,
        user,
        bin: copy,
    };

    s.ok(&["mirror", "add", "p", &upstream.path.display().to_string()]);
    let mnt = PathBuf::from(s.ok(&["open", "t", "--project", "p"]).trim());
    assert_eq!(mnt, s.root().join("t"));
    assert!(mounts_under(&s.root()).contains(&mnt));
    let status = s.ok(&["status", "t", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(v["passthrough"], false, "{v}");

    let w = s.as_user("sh", &["-c", "echo mine > new.txt && cat README.md"], &mnt);
    assert!(w.success(), "{}", w.describe());
    assert_eq!(w.stdout_str(), "made by root, read by the user\n");
    let st = s.as_user("git", &["status", "--porcelain"], &mnt);
    assert!(st.success(), "{}", st.describe());
    assert_eq!(st.stdout_str(), "?? new.txt\n");
    let snap = s.ok(&["snapshot", "t"]).trim().to_string();
    let shown = s.as_user(
        "git",
        &["cat-file", "-p", &format!("{snap}:new.txt")],
        &s.dir.path().join("data/octofs/mirrors/p"),
    );
    assert_eq!(shown.stdout_str(), "mine\n", "{}", shown.describe());

    // A process inside: release is refused and nothing changes.
    let mut busy = as_user(s.user, "sh");
    busy.args(["-c", "cd \"$0\" && exec sleep 30"])
        .arg(&mnt)
        .current_dir("/");
    let mut child = busy.spawn().expect("sleep in the mount");
    std::thread::sleep(Duration::from_millis(300));
    let refused = s.cli(&["release", "t"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(!refused.success(), "{}", refused.describe());
    assert!(
        refused.stderr_str().contains("busy"),
        "{}",
        refused.describe()
    );
    assert!(mounts_under(&s.root()).contains(&mnt));

    s.ok(&["release", "t"]);
    assert!(!mounts_under(&s.root()).contains(&mnt), "still mounted");
    let mnt = PathBuf::from(s.ok(&["open", "t"]).trim());
    let back = s.as_user("cat", &["new.txt"], &mnt);
    assert_eq!(back.stdout_str(), "mine\n", "{}", back.describe());
    s.ok(&["stop"]);
    assert_eq!(mounts_under(s.dir.path()), Vec::<PathBuf>::new());
    let log =
        std::fs::read_to_string(s.dir.path().join("data/octofs/octofs.log")).unwrap_or_default();
    assert!(!log.contains("ERROR"), "{log}");
}
