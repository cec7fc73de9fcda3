//! Commit hooks, run by the CLI (never by the daemon) inside a mounted workspace as the
//! workspace's owner: `octofs commit --hook CMD` and, with `--git-hooks`, the workspace's own
//! `pre-commit`, `commit-msg` and `post-commit`.
//!
//! A hook is code a workspace can configure (its `.git/hooks`, its `core.hooksPath`, the
//! `package.json` scripts a formatter reads), so it never runs with more privilege than the
//! workspace's owner has: a root caller (an orchestrator) runs it as the owner, with the owner's
//! home and no supplementary groups; an owner runs it as themself; anyone else is refused before
//! anything runs. It owns no state and touches nothing but the processes it starts.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::proto::WorkspaceStatus;

/// Runs hooks in one mounted workspace as its owner.
#[derive(Debug)]
pub struct Runner {
    mount: PathBuf,
    uid: u32,
    gid: u32,
    /// Set when the caller is root and the owner is not: the owner's home, user name.
    drop_to: Option<(PathBuf, String)>,
}

/// The home directory and name of `uid` from `/etc/passwd` (`/` and the number when absent).
fn user_of(uid: u32) -> (PathBuf, String) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 7 && f[2].parse::<u32>().ok() == Some(uid))
                .then(|| (PathBuf::from(f[5]), f[0].to_string()))
        })
        .next()
        .unwrap_or_else(|| (PathBuf::from("/"), uid.to_string()))
}

impl Runner {
    /// The runner of a workspace as `status` describes it: it must be mounted, and the caller must
    /// be its owner or root.
    pub fn for_workspace(w: &WorkspaceStatus) -> Result<Runner, String> {
        if !w.mounted {
            return Err(format!(
                "thread {}: not mounted: hooks run in the mount (octofs open it first)",
                w.thread
            ));
        }
        let mount = PathBuf::from(&w.path);
        let meta = std::fs::metadata(&mount)
            .map_err(|e| format!("cannot stat {}: {e}", mount.display()))?;
        let (uid, gid) = (meta.uid(), meta.gid());
        let me = crate::sys::euid();
        let drop_to = if me == uid {
            None
        } else if me == 0 {
            Some(user_of(uid))
        } else {
            return Err(format!(
                "thread {}: its workspace is another user's: its hooks run only as its owner",
                w.thread
            ));
        };
        Ok(Runner {
            mount,
            uid,
            gid,
            drop_to,
        })
    }

    /// A command in the mount, as the owner.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.mount).stdin(Stdio::null());
        // Hooks see the workspace as git would: no repository variables of the caller's.
        for v in ["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG"] {
            cmd.env_remove(v);
        }
        if let Some((home, name)) = &self.drop_to {
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(self.uid).gid(self.gid);
            cmd.env("HOME", home).env("USER", name).env("LOGNAME", name);
        }
        cmd
    }

    /// `sh -c CMD` in the mount; an error names the hook and its exit status.
    pub fn hook(&self, cmd: &str) -> Result<(), String> {
        let status = self
            .command("/bin/sh")
            .args(["-c", cmd])
            .status()
            .map_err(|e| format!("hook `{cmd}`: cannot run: {e}"))?;
        if !status.success() {
            return Err(format!(
                "hook `{cmd}` failed ({status}): nothing was committed"
            ));
        }
        Ok(())
    }

    /// Where git in the workspace keeps `rel` (`hooks/pre-commit`, `COMMIT_EDITMSG`), asked of git
    /// as the owner (it follows `core.hooksPath`), relative to the mount or absolute.
    fn git_path(&self, rel: &str) -> Result<PathBuf, String> {
        let out = self
            .command("git")
            .args(["rev-parse", "--git-path", rel])
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| format!("cannot run git in {}: {e}", self.mount.display()))?;
        if !out.status.success() {
            return Err(format!(
                "git rev-parse in {} failed: {}",
                self.mount.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        Ok(if p.is_absolute() {
            p
        } else {
            self.mount.join(p)
        })
    }

    /// The workspace's git hook `name`, if it has one that git would run (an executable file).
    fn find_git_hook(&self, name: &str) -> Result<Option<PathBuf>, String> {
        let p = self.git_path(&format!("hooks/{name}"))?;
        Ok(std::fs::metadata(&p)
            .ok()
            .filter(|m| m.is_file() && m.mode() & 0o111 != 0)
            .map(|_| p))
    }

    /// Runs git hook `name` with `args` when the workspace has it; its failure stops the commit.
    pub fn git_hook(&self, name: &str, args: &[&str]) -> Result<(), String> {
        let Some(hook) = self.find_git_hook(name)? else {
            return Ok(());
        };
        let status = self
            .command(&hook)
            .args(args)
            .status()
            .map_err(|e| format!("{name} hook: cannot run {}: {e}", hook.display()))?;
        if !status.success() {
            return Err(format!(
                "{name} hook failed ({status}): nothing was committed"
            ));
        }
        Ok(())
    }

    /// Runs the `commit-msg` hook (when there is one) on `message` in `COMMIT_EDITMSG`, as git
    /// does, and returns the message as the hook left it.
    pub fn commit_msg(&self, message: &str) -> Result<String, String> {
        let Some(hook) = self.find_git_hook("commit-msg")? else {
            return Ok(message.to_string());
        };
        let file = self.git_path("COMMIT_EDITMSG")?;
        // The owner writes the file, the hook edits it, the owner reads it back: nothing here
        // opens a workspace file with the caller's (possibly root's) rights.
        let mut child = self
            .command("/bin/sh")
            .args(["-c", r#"cat > "$1" && "$2" "$1" && cat "$1""#, "sh"])
            .arg(OsString::from(&file))
            .arg(OsString::from(&hook))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("commit-msg hook: cannot run: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            let mut text = message.to_string();
            if !text.ends_with('\n') {
                text.push('\n');
            }
            stdin
                .write_all(text.as_bytes())
                .map_err(|e| format!("commit-msg hook: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("commit-msg hook: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "commit-msg hook failed ({}): nothing was committed",
                out.status
            ));
        }
        let edited = String::from_utf8_lossy(&out.stdout).into_owned();
        if edited.trim().is_empty() {
            return Err("the commit-msg hook left an empty message: nothing was committed".into());
        }
        Ok(edited)
    }

    pub fn mount(&self) -> &Path {
        &self.mount
    }
}
