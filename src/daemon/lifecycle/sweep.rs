//! `octofs sweep` decided, one thread at a time: a project workspace idle for the given time whose
//! state the mirror has seen is released; a chat workspace, one with open files, a recently active
//! one or one with unsaved work is kept, and the answer says why.
//!
//! Pure: the facts come from `super::super::threads` (which asks the core about unsaved work only
//! when [`unsaved_matters`]) and it unmounts what is released.

/// What one thread's sweep is decided from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) struct SweepFacts {
    pub chat: bool,
    /// Whether a file is open in the workspace.
    pub files_open: bool,
    /// Unix seconds of the last request, and now.
    pub last_activity: u64,
    pub now: u64,
    /// Whether the workspace changed since its state was last saved (no saved mark: it did);
    /// asked when [`unsaved_matters`] only (not asked: taken as changed).
    pub unsaved: Option<bool>,
}

/// Why a sweep keeps a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::daemon) enum Keep {
    Chat,
    FilesOpen,
    Active,
    Unsaved,
}

impl std::fmt::Display for Keep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Keep::Chat => "chat workspace",
            Keep::FilesOpen => "files open",
            Keep::Active => "active",
            Keep::Unsaved => "unsaved changes",
        })
    }
}

/// Whether the verdict depends on unsaved work (the question costs a look at the data files).
pub(in crate::daemon) fn unsaved_matters(f: &SweepFacts, idle: u64) -> bool {
    let known = SweepFacts {
        unsaved: Some(false),
        ..*f
    };
    verdict(&known, idle).is_none()
}

/// The sweep's verdict on one workspace idle rule `idle` (seconds): none to release it, else why it
/// is kept.
pub(in crate::daemon) fn verdict(f: &SweepFacts, idle: u64) -> Option<Keep> {
    if f.chat {
        Some(Keep::Chat)
    } else if f.files_open {
        Some(Keep::FilesOpen)
    } else if f.now.saturating_sub(f.last_activity) < idle {
        Some(Keep::Active)
    } else if f.unsaved != Some(false) {
        Some(Keep::Unsaved)
    } else {
        None
    }
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
