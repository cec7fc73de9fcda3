//! The refusals' lines, each against the text it had before it was typed.

use super::*;

fn line(r: impl Into<Error>) -> String {
    r.into().to_string()
}

fn enoent() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::ENOENT)
}

fn id(n: u8) -> ObjectId {
    ObjectId::from_bytes_or_panic(&[n; 20])
}

/// Every refusal's line, byte for byte as the daemon wrote it when it was text (the
/// integration tests and users compare them).
#[test]
fn each_refusal_keeps_its_line() {
    let (a, b, c) = (id(0xaa), id(0xbb), id(0xcc));
    let chat = |op| {
        line(Refusal::Chat {
            thread: "t1".into(),
            op,
        })
    };
    let cases: Vec<(String, String)> = vec![
        (
            chat(ChatOp::Commit),
            "thread t1 is a chat workspace (no project): nothing to commit to".into(),
        ),
        (
            chat(ChatOp::Push),
            "thread t1 is a chat workspace (no project): nothing to push".into(),
        ),
        (
            chat(ChatOp::Pull),
            "thread t1 is a chat workspace (no project): nothing to pull into".into(),
        ),
        (
            chat(ChatOp::Resync),
            "thread t1 is a chat workspace (no project): it has no upstream to re-sync with"
                .into(),
        ),
        (
            chat(ChatOp::Snapshot),
            "thread t1 is a chat workspace (no project): it is never saved".into(),
        ),
        (
            chat(ChatOp::Export),
            "thread t1 is a chat workspace (no project): there is no folder to export to"
                .into(),
        ),
        (
            chat(ChatOp::Diff),
            "thread t1 is a chat workspace: nothing is saved to diff".into(),
        ),
        (
            line(RequestRefusal::TooLong { max: 1 << 20 }),
            "bad request: longer than 1024 KiB".into(),
        ),
        (
            line(RequestRefusal::NotUtf8 { offset: 7 }),
            "bad request: not UTF-8 (invalid byte at offset 7)".into(),
        ),
        (
            line(RequestRefusal::NoLine { secs: 10 }),
            "bad request: no request line within 10 s".into(),
        ),
        (
            line(RequestRefusal::NotJson(
                serde_json::from_str::<u8>("x").unwrap_err(),
            )),
            format!(
                "bad request: {}",
                serde_json::from_str::<u8>("x").unwrap_err()
            ),
        ),
        (
            line(GateRefusal::Bad(gates::GateError::Unknown("x".into()))),
            "unknown gate \"x\" (known: secret-names, max-size=BYTES, cmd=PROGRAM)".into(),
        ),
        (
            line(CommitRefusal::NoMessage),
            "a commit needs a message (-m)".into(),
        ),
        (
            line(CommitRefusal::FixupNeedsAnchor),
            "--mode fixup needs --anchor: the commit it fixes".into(),
        ),
        (
            line(CommitRefusal::AnchorOnlyForFixup),
            "--anchor is only for --mode fixup".into(),
        ),
        (
            line(CommitRefusal::NoSuchAnchor { spec: "v9".into() }),
            "--anchor v9: no such commit".into(),
        ),
        (
            line(CommitRefusal::AnchorNotAncestor {
                spec: "v9".into(),
                anchor: a,
            }),
            format!("--anchor v9 ({a}) is not HEAD or an ancestor of it: nothing to fix up"),
        ),
        (
            line(CommitRefusal::IndexLocked),
            ".git/index.lock exists: git is running in the workspace (or died there); try again"
                .into(),
        ),
        (line(CommitRefusal::EmptyBranch), "empty branch name".into()),
        (
            line(CommitRefusal::Nothing { paths: vec![] }),
            "nothing to commit: the working state equals HEAD".into(),
        ),
        (
            line(CommitRefusal::Nothing {
                paths: vec!["src".into(), "docs".into()],
            }),
            "nothing to commit under src, docs: the working state equals HEAD".into(),
        ),
        (
            line(PushRefusal::BadLease {
                lease: "abc".into(),
            }),
            "--lease wants a full commit id, not \"abc\"".into(),
        ),
        (
            line(PushRefusal::Detached),
            "HEAD is detached: name the remote branch with --branch".into(),
        ),
        (
            line(PushRefusal::NotABranch {
                branch: "a..b".into(),
            }),
            "\"a..b\" is not a branch name".into(),
        ),
        (
            line(PushRefusal::Failed {
                head: a,
                branch: "main".into(),
                error: crate::git::Error::Git("rejected".into()),
            }),
            format!(
                "push of {a} to main failed: rejected (when the remote refused it: its branch is not at --lease, or the push is not a fast-forward)"
            ),
        ),
        (
            line(PullRefusal::NoSuchName {
                remote: "origin".into(),
                name_ref: "refs/snapshots/n".into(),
            }),
            "origin has no refs/snapshots/n".into(),
        ),
        (
            line(PullRefusal::NoParent {
                name_ref: "refs/snapshots/n".into(),
                theirs: a,
            }),
            format!("refs/snapshots/n ({a}) has no parent"),
        ),
        (
            line(PullRefusal::NotAtBase {
                head: a,
                name_ref: "refs/snapshots/n".into(),
                theirs: b,
                base: c,
            }),
            format!(
                "HEAD is at {a}, but refs/snapshots/n ({b}) is based on {c}: pull only fast-forwards a workspace whose HEAD is the snapshot's base"
            ),
        ),
        (
            line(PullRefusal::WouldLose {
                name_ref: "refs/snapshots/n".into(),
                thread: "t1".into(),
                changes: "a, b and 3 more".into(),
            }),
            "pull of refs/snapshots/n would lose local changes of thread t1: a, b and 3 more (snapshot or commit them first, or pull --force, which saves them in a snapshot first)".into(),
        ),
        (
            line(SnapshotRefusal::BadName { name: ".x".into() }),
            "bad snapshot name \".x\": 1-128 characters of [A-Za-z0-9._-], not starting with . or -, one component of a git ref".into(),
        ),
        (
            line(SnapshotRefusal::PushNeedsName),
            "--push needs --name: only a named snapshot is pushed".into(),
        ),
        (
            line(SnapshotRefusal::NoHead),
            "the workspace has no .git/HEAD".into(),
        ),
        (
            line(SnapshotRefusal::RefTooLarge {
                path: "HEAD".into(),
                max: 4096,
            }),
            ".git/HEAD is larger than 4096 bytes: not a ref".into(),
        ),
        (
            line(SnapshotRefusal::PackedRefsLine { max: 4096 }),
            ".git/packed-refs has a line longer than 4096 bytes: not refs".into(),
        ),
        (
            line(SnapshotRefusal::Unborn {
                name: "refs/heads/main".into(),
            }),
            "HEAD (refs/heads/main) has no commit yet: nothing to snapshot".into(),
        ),
        (
            line(SnapshotRefusal::NoParent),
            "the snapshot has no parent".into(),
        ),
        (
            line(SnapshotRefusal::ShareNoParent { theirs: a }),
            format!("the share's snapshot {a} has no parent"),
        ),
        (
            line(SnapshotRefusal::Unshared {
                why: "the share diverged".into(),
            }),
            "the share diverged".into(),
        ),
        (
            line(SnapshotRefusal::Diverged {
                name_ref: "refs/snapshots/n".into(),
                remote: "origin".into(),
                theirs: a,
                commit: b,
            }),
            format!(
                "refs/snapshots/n on origin has diverged: it names {a}, which {b} does not descend from; not overwritten (the local snapshot {b} is kept)"
            ),
        ),
        (
            line(SnapshotRefusal::BaseTreeMissing {
                base_tree: a,
                project: "p".into(),
                thread: "t1".into(),
            }),
            format!(
                "the workspace's base tree {a} is not in the mirror of project p (the mirror was re-created without it); `octofs release t1 --discard` drops the workspace without saving"
            ),
        ),
        (
            line(SnapshotRefusal::MovedUnderneath {
                thread_ref: "refs/octomate/threads/t1".into(),
                expected: Some(a),
                found: None,
            }),
            format!(
                "refs/octomate/threads/t1 moved underneath (expected {a}, found none); not overwriting it"
            ),
        ),
        (
            line(SnapshotRefusal::KeptMissing {
                side: a,
                snapshot: b,
                id: c,
                path: "vendor/x".into(),
            }),
            format!(
                "the kept side {a} of snapshot {b} names {c} (vendor/x), which is missing from the mirror"
            ),
        ),
        (
            line(SnapshotRefusal::FileTooLarge {
                path: ".git/config".into(),
                max: 10,
            }),
            ".git/config is larger than 10 bytes: release would not keep it".into(),
        ),
        (
            line(SnapshotRefusal::TooManyRefs { max: 100 }),
            "the workspace has more than 100 refs: release would not keep them all".into(),
        ),
        (
            line(SnapshotRefusal::RefsNotKept {
                error: Box::new(Error::NotMounted("t1".into())),
                thread: "t1".into(),
            }),
            "cannot keep the workspace's refs: thread t1 is not mounted; `octofs release t1 --discard` drops the workspace without saving".into(),
        ),
        (
            line(MoveRefusal::RefNeedsProject),
            "--ref needs --project: without one, teleport carries the source's state".into(),
        ),
        (
            line(MoveRefusal::TeleportToSource { to: "t1".into() }),
            "teleport needs a new thread: t1 is the source".into(),
        ),
        (
            line(MoveRefusal::ToSource { to: "t1".into() }),
            "t1 is the source: name a new thread".into(),
        ),
        (
            line(MoveRefusal::ChatExists { to: "t2".into() }),
            "thread t2 already exists (a chat workspace); choose a new thread".into(),
        ),
        (
            line(MoveRefusal::Bound {
                to: "t2".into(),
                project: "p".into(),
            }),
            "thread t2 is already bound to project p; choose a new thread".into(),
        ),
        (
            line(MoveRefusal::ChatCarry {
                from: "t1".into(),
                to: "t2".into(),
            }),
            "thread t1 is a chat workspace (no project): its files are never saved, so there is no state to carry; `octofs teleport t1 t2 --project P` binds a new thread instead".into(),
        ),
        (
            line(MoveRefusal::NoBinding),
            "the thread has no binding".into(),
        ),
        (
            line(ResyncRefusal::UnknownRole { role: "qa".into() }),
            "unknown role \"qa\": a role is developer or reviewer".into(),
        ),
        (
            line(ResyncRefusal::NoUpstream {
                thread: "t1".into(),
                project: "p".into(),
                last: Some("main".into()),
            }),
            "thread t1 has no upstream branch in the mirror of p (it follows none, and main is not a branch there)".into(),
        ),
        (
            line(ResyncRefusal::NoUpstream {
                thread: "t1".into(),
                project: "p".into(),
                last: None,
            }),
            "thread t1 has no upstream branch in the mirror of p (it follows none, and its base is not a branch there)".into(),
        ),
        (
            line(ResyncRefusal::RevListOutput { text: "x\n".into() }),
            "unexpected `git rev-list --count` output \"x\\n\"".into(),
        ),
        (
            line(ExportRefusal::NotAFolder {
                project: "p".into(),
                upstream: "https://h/r.git".into(),
            }),
            "project p's upstream https://h/r.git is not a folder: export writes back to a plain-directory upstream only (push a git upstream)".into(),
        ),
        (
            line(ExportRefusal::FolderGone {
                project: "p".into(),
                folder: "/srv/p".into(),
            }),
            "project p's folder /srv/p no longer exists (or is not a directory)".into(),
        ),
        (
            line(ExportRefusal::NotTheFolderOwner {
                folder: "/srv/p".into(),
                uid: 7,
            }),
            "only the owner of /srv/p (uid 7) or root may export into it".into(),
        ),
        (
            line(ExportRefusal::NotSynced {
                warning: "w".into(),
            }),
            "w".into(),
        ),
        (
            line(ExportRefusal::NoCommit {
                project: "p".into(),
            }),
            "the mirror of p has no commit to merge into".into(),
        ),
        (
            line(ExportRefusal::Conflicts {
                paths: vec!["a".into(), "b".into()],
            }),
            "export refused: 2 conflict(s) between the folder's changes and the thread's (git cannot merge them): a, b; nothing was written".into(),
        ),
        (
            line(ExportRefusal::MergeTree {
                line: "fatal: x".into(),
            }),
            "git merge-tree failed: fatal: x".into(),
        ),
        (
            line(ExportRefusal::DiffTreeOutput { meta: ":1".into() }),
            "unexpected diff-tree output \":1\"".into(),
        ),
        (
            line(ExportRefusal::DiffTreeEntry { meta: ":1".into() }),
            "unexpected diff-tree entry \":1\"".into(),
        ),
        (
            line(ExportRefusal::Untracked {
                paths: vec!["a".into(), "b".into()],
            }),
            "export refused: the folder holds files git does not track where the thread has files: a, b; nothing was written".into(),
        ),
        (
            line(ExportRefusal::NotADirectory {
                paths: vec!["a".into()],
            }),
            "export refused: in the folder, a symlink or a file stands where the thread has a directory: a; nothing was written".into(),
        ),
        (
            line(DiffRefusal::NoSnapshot),
            "the thread has no snapshot yet".into(),
        ),
        (
            line(DiffRefusal::NotACommit { spec: "v9".into() }),
            "\"v9\" does not name a commit or tree in the mirror".into(),
        ),
        (
            line(LimitRefusal::TooMany {
                uid: 7,
                live: 3,
                cap: 3,
            }),
            "user 7 has 3 live threads, the most one user may have (octofs serve --max-threads-per-user 3); release one first".into(),
        ),
        (
            line(LimitRefusal::AtCap { uid: 7, cap: 3 }),
            "user 7 is at the cap of live threads (octofs serve --max-threads-per-user 3); release one first".into(),
        ),
        (
            line(MirrorRefusal::Blank {
                error: "disk full".into(),
            }),
            "cannot create the blank repository: disk full".into(),
        ),
        (
            line(MirrorRefusal::NotRunning {
                project: "p".into(),
            }),
            "no mirror add or mirror sync of p is running".into(),
        ),
        (
            line(DepsRefusal::UnknownNeeds {
                project: "p".into(),
                error: "e".into(),
            }),
            "cannot tell which layers p needs (e); nothing removed".into(),
        ),
        (
            line(RestartRefusal::UnderWay),
            "a restart is already under way".into(),
        ),
        (
            line(RestartRefusal::Failed {
                why: super::super::takeover::HandoverError::ThreadBusy,
            }),
            "restart failed, the running daemon goes on serving: a workspace stayed busy with another operation".into(),
        ),
        (
            line(RestartRefusal::Restarting),
            "the daemon is restarting; try again in a moment".into(),
        ),
        (
            line(WorkspaceRefusal::RootNotADirectory {
                root: "/run/octofs".into(),
            }),
            "root /run/octofs is not a directory".into(),
        ),
        (
            line(WorkspaceRefusal::Root {
                root: "/run/octofs".into(),
                error: enoent(),
            }),
            "root /run/octofs: No such file or directory (os error 2)".into(),
        ),
        (
            line(WorkspaceRefusal::MountPointSymlink {
                path: "/run/octofs/t1".into(),
            }),
            "mount point /run/octofs/t1 is a symlink: not followed".into(),
        ),
        (
            line(WorkspaceRefusal::MountPointNotEmpty {
                path: "/run/octofs/t1".into(),
            }),
            "mount point /run/octofs/t1 is not empty".into(),
        ),
        (
            line(WorkspaceRefusal::MountPoint {
                path: "/run/octofs/t1".into(),
                error: enoent(),
            }),
            "mount point /run/octofs/t1: No such file or directory (os error 2)".into(),
        ),
        (
            line(WorkspaceRefusal::Strays {
                why: "mount point /run/octofs/t1: denied".into(),
            }),
            "mount point /run/octofs/t1: denied".into(),
        ),
        (
            line(WorkspaceRefusal::NoWorkspace {
                thread: "t1".into(),
            }),
            "thread t1 has no workspace".into(),
        ),
        (
            line(WorkspaceRefusal::NotRecordedMounted {
                thread: "t1".into(),
            }),
            "thread t1 is not recorded as mounted; open it to mount it".into(),
        ),
        (
            line(WorkspaceRefusal::DetachedInUse {
                thread: "t1".into(),
                path: "/run/octofs/t1".into(),
            }),
            "thread t1's mount at /run/octofs/t1 was detached but a process still uses it; stop that process, then open the thread again".into(),
        ),
        (
            line(WorkspaceRefusal::Busy {
                path: "/run/octofs/t1".into(),
            }),
            "/run/octofs/t1 is busy (a process still has its working directory or files in it); stop them or use --force".into(),
        ),
        (
            line(WorkspaceRefusal::NeverDurable {
                thread: "t1".into(),
                done: "set aside".into(),
            }),
            "thread t1: its workspace was never made durable (power loss while it was created) and was set aside; open it again".into(),
        ),
        (
            line(WorkspaceRefusal::SyncLost),
            "a durable write failed".into(),
        ),
        (
            line(OpenRefusal::RefOnChat),
            "a chat workspace (no --project) has no refs to choose from".into(),
        ),
        (
            line(OpenRefusal::RefOnReleased {
                thread: "t1".into(),
            }),
            "thread t1 was released; it resumes from its last snapshot (--ref applies only when a thread is created)".into(),
        ),
        (
            line(ReleaseRefusal::Busy {
                mountpoint: "/run/octofs/t1".into(),
            }),
            "/run/octofs/t1 is busy (a process still has its working directory or files in it); stop them or use --force".into(),
        ),
        (
            line(ReleaseRefusal::BoundElsewhere {
                mountpoint: "/run/octofs/t1".into(),
                pid: 42,
                at: "/sandbox/w".into(),
            }),
            "/run/octofs/t1 is busy: it is also mounted at /sandbox/w for process 42 (a sandbox or a bind); stop it or use --force".into(),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }
}

#[test]
fn gate_refusals_keep_the_gates_line() {
    let refusals = vec![
        gates::Refusal {
            path: "a.pem".into(),
            why: "a secret's name".into(),
        },
        gates::Refusal {
            path: String::new(),
            why: "no path".into(),
        },
    ];
    let want = gates::refused_message("push", &refusals);
    let got = line(GateRefusal::Refused {
        what: "push",
        refusals,
    });
    assert_eq!(got, want);
    assert_eq!(
        got,
        "push refused by the gates: a.pem: a secret's name; no path"
    );
}

/// `open`'s and `release`'s refusals are typed refusals inside the daemon's error; a permission
/// refusal, a failed read and an unknown thread stay the errors they were.
#[test]
fn lifecycle_refusals_are_typed_refusals() {
    let e = Error::from(OpenRefusal::RefOnChat);
    assert!(
        matches!(&e, Error::Refusal(r) if matches!(**r, Refusal::Open(OpenRefusal::RefOnChat)))
    );
    let e = Error::from(OpenRefusal::MayNotBind {
        project: "p".into(),
        caller: 0,
    });
    assert!(matches!(e, Error::PermissionDenied(_)));
    let e = Error::from(OpenRefusal::Failed(Error::UnknownThread("t1".into())));
    assert!(matches!(e, Error::UnknownThread(_)));
    let busy = ReleaseRefusal::Busy {
        mountpoint: "/m".into(),
    };
    let e = Error::from(busy.clone());
    assert!(matches!(&e, Error::Refusal(r) if matches!(&**r, Refusal::Release(b) if *b == busy)));
    let e = Error::from(ReleaseRefusal::Unknown("t1".into()));
    assert!(matches!(e, Error::UnknownThread(t) if t == "t1"));
    let e = Error::from(WorkspaceRefusal::SyncLost);
    assert!(
        matches!(&e, Error::Refusal(r) if matches!(**r, Refusal::Workspace(WorkspaceRefusal::SyncLost)))
    );
}
