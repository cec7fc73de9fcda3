//! The sweep's rule, one workspace at a time.

use super::*;

const IDLE: u64 = 600;
const NOW: u64 = 1_000_000;

/// A project workspace idle for `idle_for` seconds, no file open, its state saved.
fn idle_for(idle_for: u64) -> SweepFacts {
    SweepFacts {
        chat: false,
        files_open: false,
        last_activity: NOW - idle_for,
        now: NOW,
        unsaved: Some(false),
    }
}

#[test]
fn an_idle_saved_project_workspace_is_released() {
    assert_eq!(verdict(&idle_for(IDLE), IDLE), None);
    assert_eq!(verdict(&idle_for(IDLE * 10), IDLE), None);
}

#[test]
fn a_recently_active_one_is_kept() {
    assert_eq!(verdict(&idle_for(IDLE - 1), IDLE), Some(Keep::Active));
    assert_eq!(verdict(&idle_for(0), IDLE), Some(Keep::Active));
    // An activity time ahead of the clock is no idleness.
    let f = SweepFacts {
        last_activity: NOW + 5,
        ..idle_for(0)
    };
    assert_eq!(verdict(&f, IDLE), Some(Keep::Active));
    // `sweep --idle 0`: any idle workspace.
    assert_eq!(verdict(&idle_for(0), 0), None);
}

#[test]
fn a_chat_workspace_and_open_files_are_kept_before_anything_else() {
    let f = SweepFacts {
        chat: true,
        files_open: true,
        unsaved: Some(true),
        ..idle_for(0)
    };
    assert_eq!(verdict(&f, IDLE), Some(Keep::Chat));
    let f = SweepFacts {
        files_open: true,
        unsaved: Some(true),
        ..idle_for(0)
    };
    assert_eq!(verdict(&f, IDLE), Some(Keep::FilesOpen));
}

#[test]
fn unsaved_work_is_kept_and_asked_about_only_when_it_decides() {
    let f = SweepFacts {
        unsaved: Some(true),
        ..idle_for(IDLE)
    };
    assert_eq!(verdict(&f, IDLE), Some(Keep::Unsaved));
    let f = SweepFacts {
        unsaved: None,
        ..idle_for(IDLE)
    };
    assert!(unsaved_matters(&f, IDLE));
    assert_eq!(verdict(&f, IDLE), Some(Keep::Unsaved));
    assert!(!unsaved_matters(&idle_for(1), IDLE));
    let f = SweepFacts {
        chat: true,
        ..idle_for(IDLE)
    };
    assert!(!unsaved_matters(&f, IDLE));
}

#[test]
fn the_reasons_read_as_the_answer_says_them() {
    let shown: Vec<String> = [Keep::Chat, Keep::FilesOpen, Keep::Active, Keep::Unsaved]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        shown,
        ["chat workspace", "files open", "active", "unsaved changes"]
    );
}
