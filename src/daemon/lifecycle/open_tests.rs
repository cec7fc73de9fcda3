//! `open` decided case by case: who may open, what fits the thread's state, which plan.

use super::*;
use crate::daemon::lifecycle::fixtures::*;

/// One `open` request and what the daemon found.
struct Case {
    caller: Caller,
    admin: bool,
    binding: Option<Binding>,
    live: Option<WorkspaceRecord>,
    project: Option<&'static str>,
    git_ref: Option<&'static str>,
    io: Option<IoMode>,
    access: Option<Gathered<Access>>,
    ref_commit: Option<Gathered<gix::ObjectId>>,
    mount: Mount,
}

impl Case {
    /// `uid` opens thread `t`, which does not exist; root is an admin.
    fn by(uid: u32) -> Case {
        Case {
            caller: caller(uid),
            admin: uid == ROOT,
            binding: None,
            live: None,
            project: None,
            git_ref: None,
            io: None,
            access: None,
            ref_commit: None,
            mount: Mount::default(),
        }
    }

    /// `t` is live on project `p`, `owner`'s, and the kernel has its mount (handles mode).
    fn live_of(mut self, owner: u32) -> Case {
        self.binding = Some(binding("t", "p", owner));
        self.live = Some(live("t", "p", owner));
        self.mount = Mount {
            served: true,
            mode: Some(IoMode::Handles),
        };
        self
    }

    /// `t` was released: a binding to project `p`, `owner`'s.
    fn released_of(mut self, owner: u32) -> Case {
        self.binding = Some(binding("t", "p", owner));
        self
    }

    fn open_access(mut self) -> Case {
        self.access = Some(Ok(Access::default()));
        self
    }

    fn decide(self) -> Result<OpenPlan, OpenRefusal> {
        decide_open(OpenFacts {
            thread: "t",
            caller: &self.caller,
            admin: self.admin,
            binding: self.binding.as_ref(),
            live: self.live.as_ref(),
            project: self.project,
            git_ref: self.git_ref,
            io: self.io,
            access: self.access,
            ref_commit: self.ref_commit,
            mount: self.mount,
        })
    }
}

fn commit(hex: &str) -> gix::ObjectId {
    gix::ObjectId::from_hex(hex.as_bytes()).expect("a commit id")
}

/// The refusal's line, checked to be the daemon error's line too.
fn refused(r: Result<OpenPlan, OpenRefusal>) -> String {
    let r = r.expect_err("a refusal");
    let line = r.to_string();
    assert_eq!(Error::from(r).to_string(), line);
    line
}

/// A ref that does not resolve, as the daemon's error.
fn no_such_ref(spec: &str) -> Error {
    crate::daemon::refusal::DiffRefusal::NotACommit { spec: spec.into() }.into()
}

fn users(holders: Vec<u32>) -> Users {
    Users {
        holders,
        cancels_pending: false,
        io: None,
    }
}

#[test]
fn the_owner_joins_their_live_workspace_once() {
    let plan = Case::by(ALICE).live_of(ALICE).open_access().decide();
    assert_eq!(plan.unwrap(), OpenPlan::Join(users(vec![ALICE])));
}

#[test]
fn another_user_is_refused_a_live_thread_and_a_released_one() {
    let line = refused(Case::by(BOB).live_of(ALICE).open_access().decide());
    assert_eq!(
        line,
        "permission denied: thread t belongs to uid 64001, not to uid 64002"
    );
    let line = refused(Case::by(BOB).released_of(ALICE).open_access().decide());
    assert_eq!(
        line,
        "permission denied: thread t belongs to uid 64001, not to uid 64002"
    );
    let e = Error::from(Case::by(BOB).live_of(ALICE).decide().unwrap_err());
    assert!(matches!(e, Error::PermissionDenied(_)));
}

#[test]
fn root_joins_a_users_thread_as_one_more_holder() {
    let plan = Case::by(ROOT).live_of(ALICE).decide();
    assert_eq!(plan.unwrap(), OpenPlan::Join(users(vec![ALICE, ROOT])));
}

#[test]
fn the_owner_refusal_comes_before_any_read_that_failed() {
    let mut case = Case::by(BOB).live_of(ALICE);
    case.access = Some(Err(Error::UnknownThread("unreadable".into())));
    case.git_ref = Some("main");
    case.ref_commit = Some(Err(no_such_ref("main")));
    assert!(matches!(case.decide(), Err(OpenRefusal::NotOwner { .. })));
}

#[test]
fn a_new_thread_is_created_whatever_the_caller() {
    assert_eq!(Case::by(ALICE).decide().unwrap(), OpenPlan::Create);
    let mut case = Case::by(BOB).open_access();
    case.project = Some("p");
    assert_eq!(case.decide().unwrap(), OpenPlan::Create);
}

#[test]
fn a_project_that_limits_binding_refuses_who_it_does_not_name() {
    let mut case = Case::by(BOB);
    case.project = Some("p");
    case.access = Some(Ok(Access {
        users: vec![ALICE],
        groups: Vec::new(),
    }));
    assert_eq!(
        refused(case.decide()),
        "permission denied: project p may be bound only by the users and groups root allowed, and uid 64002 is not among them"
    );
    // Named by uid, or by a group the caller is in.
    let mut case = Case::by(BOB);
    case.project = Some("p");
    case.access = Some(Ok(Access {
        users: vec![BOB],
        groups: Vec::new(),
    }));
    assert_eq!(case.decide().unwrap(), OpenPlan::Create);
    let mut case = Case::by(BOB);
    case.caller.groups = vec![777];
    case.project = Some("p");
    case.access = Some(Ok(Access {
        users: Vec::new(),
        groups: vec![777],
    }));
    assert_eq!(case.decide().unwrap(), OpenPlan::Create);
    // The owner of a live thread whose project no longer names them is refused too.
    let mut case = Case::by(ALICE).live_of(ALICE);
    case.access = Some(Ok(Access {
        users: vec![BOB],
        groups: Vec::new(),
    }));
    assert!(matches!(case.decide(), Err(OpenRefusal::MayNotBind { .. })));
}

#[test]
fn an_access_list_not_read_is_nobodys_and_one_that_failed_is_its_error() {
    let mut case = Case::by(BOB);
    case.project = Some("p");
    assert!(matches!(case.decide(), Err(OpenRefusal::MayNotBind { .. })));
    let mut case = Case::by(BOB);
    case.project = Some("p");
    case.access = Some(Err(Error::UnknownThread("x".into())));
    let e = Error::from(case.decide().unwrap_err());
    assert!(matches!(e, Error::UnknownThread(_)));
}

#[test]
fn an_admin_and_a_chat_need_no_access_list() {
    assert_eq!(access_needed(true, Some("p")), None);
    assert_eq!(access_needed(false, Some(BLANK)), None);
    assert_eq!(access_needed(false, None), None);
    assert_eq!(access_needed(false, Some("p")), Some("p"));
    let mut case = Case::by(ROOT);
    case.project = Some("p");
    assert_eq!(case.decide().unwrap(), OpenPlan::Create);
}

#[test]
fn the_bound_project_is_the_live_ones_else_the_bindings_else_the_asked_one() {
    let rec = live("t", "p", ALICE);
    let b = binding("t", "q", ALICE);
    let c = chat("t", ALICE);
    assert_eq!(bound_project(Some(&rec), Some(&b), Some("r")), Some("p"));
    assert_eq!(bound_project(Some(&c), Some(&b), Some("r")), None);
    assert_eq!(bound_project(None, Some(&b), Some("r")), Some("q"));
    assert_eq!(bound_project(None, None, Some("r")), Some("r"));
    assert_eq!(bound_project(None, None, None), None);
}

#[test]
fn a_thread_bound_to_one_project_is_not_rebound_to_another() {
    let mut case = Case::by(ALICE).released_of(ALICE).open_access();
    case.project = Some("q");
    assert_eq!(
        refused(case.decide()),
        "thread t is bound to project p; it cannot be re-bound to q"
    );
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.project = Some("q");
    assert!(matches!(case.decide(), Err(OpenRefusal::Rebind { .. })));
    // Its own project again is fine.
    let mut case = Case::by(ALICE).released_of(ALICE).open_access();
    case.project = Some("p");
    assert_eq!(case.decide().unwrap(), OpenPlan::Create);
}

#[test]
fn a_chat_workspace_is_not_bound_to_a_project_while_it_lives() {
    let mut case = Case::by(ALICE);
    case.live = Some(chat("t", ALICE));
    case.mount.served = true;
    case.project = Some("p");
    case.access = Some(Ok(Access::default()));
    assert_eq!(
        refused(case.decide()),
        "thread t has a chat workspace (no project); release it before binding it to p"
    );
    let mut case = Case::by(ALICE);
    case.live = Some(chat("t", ALICE));
    case.mount.served = true;
    assert_eq!(case.decide().unwrap(), OpenPlan::Join(users(vec![ALICE])));
}

#[test]
fn ref_on_a_live_thread_must_name_its_base() {
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.git_ref = Some("main");
    case.ref_commit = Some(Ok(commit("0123456789abcdef0123456789abcdef01234567")));
    assert_eq!(
        refused(case.decide()),
        "thread t already has a workspace based on 3f0c2a9d51e7; --ref main applies only when it is created"
    );
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.git_ref = Some("main");
    case.ref_commit = Some(Ok(commit(BASE)));
    assert_eq!(case.decide().unwrap(), OpenPlan::Join(users(vec![ALICE])));
    // A ref that does not resolve is that error; one not resolved at all is refused.
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.git_ref = Some("nope");
    case.ref_commit = Some(Err(no_such_ref("nope")));
    assert_eq!(
        refused(case.decide()),
        "\"nope\" does not name a commit or tree in the mirror"
    );
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.git_ref = Some("main");
    assert!(matches!(case.decide(), Err(OpenRefusal::RefOnLive { .. })));
}

#[test]
fn ref_on_a_released_thread_or_a_chat_is_refused_at_create() {
    let b = binding("t", "p", ALICE);
    let r = decide_create("t", Some(&b), None, Some("main")).map(|_| OpenPlan::Create);
    assert_eq!(
        refused(r),
        "thread t was released; it resumes from its last snapshot (--ref applies only when a thread is created)"
    );
    let r = decide_create("t", None, None, Some("main")).map(|_| OpenPlan::Create);
    assert_eq!(
        refused(r),
        "a chat workspace (no --project) has no refs to choose from"
    );
}

#[test]
fn create_resumes_a_bound_thread_forks_a_project_or_makes_a_chat() {
    let b = binding("t", "p", ALICE);
    assert!(matches!(
        decide_create("t", Some(&b), Some("p"), None),
        Ok(CreatePlan::Resume(x)) if x.project == "p"
    ));
    assert!(matches!(
        decide_create("t", None, Some("p"), Some("v1")),
        Ok(CreatePlan::Fork("p"))
    ));
    assert!(matches!(
        decide_create("t", None, Some("p"), None),
        Ok(CreatePlan::Fork("p"))
    ));
    assert!(matches!(
        decide_create("t", None, None, None),
        Ok(CreatePlan::Chat)
    ));
}

#[test]
fn a_fork_goes_on_the_named_branch_else_its_own() {
    assert_eq!(fork_branch("t", None, Some("main".into())), "octofs/t");
    assert_eq!(fork_branch("t", Some("main"), Some("main".into())), "main");
    assert_eq!(fork_branch("t", Some("v1.0"), None), "octofs/t");
}

#[test]
fn io_mode_clash_is_refused_only_while_the_kernel_has_the_mount() {
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.io = Some(IoMode::NoOpen);
    assert_eq!(
        refused(case.decide()),
        "thread t is mounted in handles mode; release it to reopen it in no-open mode"
    );
    // Not served: mounted again in the mode asked for, which is the thread's from now on.
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.io = Some(IoMode::NoOpen);
    case.mount.served = false;
    assert_eq!(
        case.decide().unwrap(),
        OpenPlan::Remount(Users {
            holders: vec![ALICE],
            cancels_pending: false,
            io: Some(IoMode::NoOpen),
        })
    );
    // The same mode, or none asked: joined; the thread keeps its own mode.
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    case.io = Some(IoMode::Handles);
    assert!(matches!(case.decide(), Ok(OpenPlan::Join(_))));
    let mut case = Case::by(ALICE).live_of(ALICE).open_access();
    if let Some(r) = case.live.as_mut() {
        r.io = Some(IoMode::NoOpen);
    }
    case.mount.mode = Some(IoMode::NoOpen);
    assert_eq!(
        case.decide().unwrap(),
        OpenPlan::Join(Users {
            holders: vec![ALICE],
            cancels_pending: false,
            io: Some(IoMode::NoOpen),
        })
    );
}

#[test]
fn a_remount_keeps_the_recorded_users_unless_it_was_not_mounted() {
    let mut case = Case::by(ROOT).live_of(ALICE);
    case.mount = Mount::default();
    assert_eq!(
        case.decide().unwrap(),
        OpenPlan::Remount(users(vec![ALICE, ROOT]))
    );
    let mut case = Case::by(ROOT).live_of(ALICE);
    case.mount = Mount::default();
    if let Some(r) = case.live.as_mut() {
        r.mounted = false;
    }
    assert_eq!(case.decide().unwrap(), OpenPlan::Remount(users(vec![ROOT])));
}

#[test]
fn an_open_cancels_a_pending_release_and_is_its_one_user() {
    let mut case = Case::by(ROOT).live_of(ALICE);
    if let Some(r) = case.live.as_mut() {
        r.release_when_idle = true;
    }
    assert_eq!(
        case.decide().unwrap(),
        OpenPlan::Join(Users {
            holders: vec![ROOT],
            cancels_pending: true,
            io: None,
        })
    );
}

#[test]
fn the_same_caller_counts_once_and_old_records_count_their_owner() {
    let mut case = Case::by(ROOT).live_of(ALICE);
    if let Some(r) = case.live.as_mut() {
        r.user_uids = vec![ALICE, ROOT];
        r.users = 2;
    }
    assert_eq!(
        case.decide().unwrap(),
        OpenPlan::Join(users(vec![ALICE, ROOT]))
    );
    // A record written before holders were kept: its users are its owner.
    let mut case = Case::by(ROOT).live_of(ALICE);
    if let Some(r) = case.live.as_mut() {
        r.user_uids = Vec::new();
    }
    assert_eq!(
        case.decide().unwrap(),
        OpenPlan::Join(users(vec![ALICE, ROOT]))
    );
}
