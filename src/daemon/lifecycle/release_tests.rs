//! `release`, `release --when-idle` and the idle timer decided case by case.

use super::*;
use crate::daemon::lifecycle::fixtures::*;

/// `t`'s release by `by`, the live workspace `live` (none: released or unknown), served.
fn facts<'a>(
    live: Option<&'a WorkspaceRecord>,
    by: Option<u32>,
    mountpoint: &'a Path,
) -> ReleaseFacts<'a> {
    ReleaseFacts {
        thread: "t",
        live,
        bound: false,
        by,
        force: false,
        discard: false,
        served: true,
        busy: Busy::Idle,
        mountpoint,
    }
}

fn held_by(uids: &[u32]) -> WorkspaceRecord {
    let mut rec = live("t", "p", uids[0]);
    rec.set_holders(uids.to_vec());
    rec
}

fn refused(r: Result<ReleasePlan, ReleaseRefusal>) -> String {
    let r = r.expect_err("a refusal");
    let line = r.to_string();
    assert_eq!(Error::from(r).to_string(), line);
    line
}

const MP: &str = "/workspaces/t";

#[test]
fn a_released_thread_is_already_released_and_an_unknown_one_is_refused() {
    let mp = Path::new(MP);
    let mut f = facts(None, Some(ALICE), mp);
    f.bound = true;
    assert_eq!(decide_release(&f), Ok(ReleasePlan::Already));
    f.bound = false;
    assert_eq!(refused(decide_release(&f)), "unknown thread \"t\"");
    assert!(matches!(
        Error::from(decide_release(&f).unwrap_err()),
        Error::UnknownThread(_)
    ));
}

#[test]
fn the_last_user_saves_and_unmounts() {
    let rec = held_by(&[ALICE]);
    let mp = Path::new(MP);
    let f = facts(Some(&rec), Some(ALICE), mp);
    assert!(busy_matters(&f));
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::SaveAndUnmount { force: false })
    );
    // The daemon's own release of the last user, too.
    let f = facts(Some(&rec), None, mp);
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::SaveAndUnmount { force: false })
    );
}

#[test]
fn a_chat_workspace_is_unmounted_with_nothing_saved() {
    let rec = chat("t", ALICE);
    let mp = Path::new(MP);
    let f = facts(Some(&rec), Some(ALICE), mp);
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::Unmount { force: false })
    );
}

#[test]
fn one_user_of_several_drops_only_their_hold() {
    let rec = held_by(&[ALICE, ROOT]);
    let mp = Path::new(MP);
    let mut f = facts(Some(&rec), Some(ROOT), mp);
    f.busy = Busy::InUse;
    assert!(!busy_matters(&f));
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::DropHolder {
            holders: vec![ALICE]
        })
    );
    let f = facts(Some(&rec), Some(ALICE), mp);
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::DropHolder {
            holders: vec![ROOT]
        })
    );
}

#[test]
fn a_release_by_a_non_holder_ends_the_oldest_hold() {
    let rec = held_by(&[ALICE, BOB]);
    let mp = Path::new(MP);
    let f = facts(Some(&rec), Some(ROOT), mp);
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::DropHolder { holders: vec![BOB] })
    );
    assert_eq!(after_release(&rec, None), vec![BOB]);
    let none = held_by(&[ALICE]);
    let mut none = none;
    none.set_holders(Vec::new());
    assert_eq!(after_release(&none, Some(ALICE)), Vec::<u32>::new());
}

#[test]
fn force_ends_every_hold_and_skips_the_busy_check() {
    let rec = held_by(&[ALICE, ROOT]);
    let mp = Path::new(MP);
    let mut f = facts(Some(&rec), Some(ROOT), mp);
    f.force = true;
    f.busy = Busy::NotAsked;
    assert!(!busy_matters(&f));
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::SaveAndUnmount { force: true })
    );
}

#[test]
fn discard_drops_at_once_without_saving_busy_or_not() {
    let rec = held_by(&[ALICE, ROOT]);
    let mp = Path::new(MP);
    let mut f = facts(Some(&rec), Some(ALICE), mp);
    f.discard = true;
    f.busy = Busy::InUse;
    assert!(!busy_matters(&f));
    assert_eq!(decide_release(&f), Ok(ReleasePlan::Discard));
    let rec = chat("t", ALICE);
    let mut f = facts(Some(&rec), Some(ALICE), mp);
    f.discard = true;
    assert_eq!(decide_release(&f), Ok(ReleasePlan::Discard));
}

#[test]
fn a_busy_mount_is_refused_before_anything_is_saved() {
    let rec = held_by(&[ALICE]);
    let mp = Path::new(MP);
    let mut f = facts(Some(&rec), Some(ALICE), mp);
    f.busy = Busy::InUse;
    assert_eq!(
        refused(decide_release(&f)),
        "/workspaces/t is busy (a process still has its working directory or files in it); stop them or use --force"
    );
    // Not asked is taken as busy.
    f.busy = Busy::NotAsked;
    assert!(matches!(
        decide_release(&f),
        Err(ReleaseRefusal::Busy { .. })
    ));
    f.busy = Busy::Elsewhere {
        pid: 4242,
        at: "/sandbox/w".into(),
    };
    assert_eq!(
        refused(decide_release(&f)),
        "/workspaces/t is busy: it is also mounted at /sandbox/w for process 4242 (a sandbox or a bind); stop it or use --force"
    );
}

#[test]
fn a_workspace_the_daemon_does_not_serve_is_released_without_a_busy_check() {
    let rec = held_by(&[ALICE]);
    let mp = Path::new(MP);
    let mut f = facts(Some(&rec), Some(ALICE), mp);
    f.served = false;
    f.busy = Busy::NotAsked;
    assert!(!busy_matters(&f));
    assert_eq!(
        decide_release(&f),
        Ok(ReleasePlan::SaveAndUnmount { force: false })
    );
}

#[test]
fn when_idle_releases_now_an_idle_mount_and_waits_for_a_used_one() {
    let rec = held_by(&[ALICE]);
    let mut f = WhenIdleFacts {
        live: Some(&rec),
        by: ALICE,
        served: true,
        in_use: None,
    };
    assert!(in_use_matters(&f));
    f.in_use = Some(true);
    assert_eq!(decide_when_idle(&f), WhenIdlePlan::Pending);
    f.in_use = Some(false);
    assert_eq!(decide_when_idle(&f), WhenIdlePlan::ReleaseNow);
    // Not served: nothing to wait for.
    f.served = false;
    f.in_use = None;
    assert!(!in_use_matters(&f));
    assert_eq!(decide_when_idle(&f), WhenIdlePlan::ReleaseNow);
}

#[test]
fn when_idle_by_one_of_several_users_or_of_no_workspace_is_a_plain_release() {
    let rec = held_by(&[ALICE, ROOT]);
    let f = WhenIdleFacts {
        live: Some(&rec),
        by: ROOT,
        served: true,
        in_use: Some(true),
    };
    assert!(!in_use_matters(&f));
    assert_eq!(decide_when_idle(&f), WhenIdlePlan::Release);
    let f = WhenIdleFacts {
        live: None,
        by: ROOT,
        served: false,
        in_use: None,
    };
    assert_eq!(decide_when_idle(&f), WhenIdlePlan::Release);
}

#[test]
fn the_timer_releases_a_pending_release_once_idle() {
    assert_eq!(idle_wait(false, true, Some(true)), IdleWait::Gone);
    assert_eq!(idle_wait(true, true, Some(true)), IdleWait::Wait);
    assert_eq!(idle_wait(true, true, None), IdleWait::Wait);
    assert_eq!(idle_wait(true, true, Some(false)), IdleWait::Release);
    assert_eq!(idle_wait(true, false, None), IdleWait::Release);
}
