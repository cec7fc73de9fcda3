//! A thread's lifecycle policy as pure plans: what `open`, `release` (also `--when-idle`) and
//! `sweep` do, decided from the facts the daemon gathered (records, the caller, whether the kernel
//! has the mount, idle times, holders, busy), without any side effect. Each decision answers a plan
//! (an enum its execution in `super::threads` carries out) or a typed refusal whose one-line
//! `Display` is the message the CLI prints, converted into the daemon's [`Error`].
//!
//! Owns the decisions only: it must not read or write a record, ask the kernel or a workspace's
//! core, mount, unmount or log — the facts come in plain structs, the plans go out as values (so
//! that every branch is unit-tested without root or `/dev/fuse`). Gathering the facts and carrying
//! out the plans is `super::threads`.

pub(super) mod open;
pub(super) mod release;
pub(super) mod sweep;

use super::error::Error;

/// Holders in the order given, each once (the first occurrence kept), as
/// [`crate::workspace::WorkspaceRecord::set_holders`] keeps them.
fn each_once(mut uids: Vec<u32>) -> Vec<u32> {
    let mut seen = Vec::with_capacity(uids.len());
    uids.retain(|u| {
        let new = !seen.contains(u);
        seen.push(*u);
        new
    });
    uids
}

/// A failure met while the facts were gathered (a record or a ref that could not be read),
/// reported at the point where the decision needed it, so that the refusals before it keep their
/// precedence.
pub(super) type Gathered<T> = Result<T, Error>;

#[cfg(test)]
pub(super) mod fixtures;
