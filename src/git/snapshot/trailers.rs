//! A snapshot commit's message: its trailers record where HEAD was and whose thread it is.
//!
//! Owns the format of those trailers, both ways (written by [`message`], read by [`head_of`] and
//! [`owner_of`]); must not touch a repository (it only makes and reads bytes).

use gix::bstr::ByteSlice;

/// Where HEAD of a workspace was when a snapshot was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadRef {
    Branch(String),
    Detached,
}

const HEAD_TRAILER: &str = "Octofs-Head: ";

const OWNER_TRAILER: &str = "Octofs-Owner: ";

/// The message of a snapshot commit; its trailers record where HEAD was and whose thread it is
/// (uid and, when the host knows it, the user name: a share carries snapshots to hosts where
/// only the name means the same user).
pub fn message(thread: &str, head: &HeadRef, owner: &SnapshotOwner) -> String {
    let h = match head {
        HeadRef::Branch(b) => format!("refs/heads/{b}"),
        HeadRef::Detached => "detached".to_string(),
    };
    let o = match &owner.name {
        Some(n) => format!("{} {n}", owner.uid),
        None => owner.uid.to_string(),
    };
    format!("octofs snapshot of thread {thread}\n\n{HEAD_TRAILER}{h}\n{OWNER_TRAILER}{o}\n")
}

/// Whose thread a snapshot is, as its message records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOwner {
    pub uid: u32,
    pub name: Option<String>,
}

impl SnapshotOwner {
    /// The owner `uid` of this host, named as this host names it.
    pub fn local(uid: u32) -> SnapshotOwner {
        SnapshotOwner {
            uid,
            name: crate::sys::user_name(uid),
        }
    }
}

/// The owner a snapshot's message records; `None` for a snapshot made before owners were
/// recorded (or by anything else).
pub fn owner_of(message: &[u8]) -> Option<SnapshotOwner> {
    message.lines().find_map(|line| {
        let rest = line.to_str().ok()?.strip_prefix(OWNER_TRAILER)?.trim();
        let (uid, name) = match rest.split_once(' ') {
            Some((u, n)) => (u, Some(n.to_string())),
            None => (rest, None),
        };
        Some(SnapshotOwner {
            uid: uid.parse().ok()?,
            name,
        })
    })
}

/// Where HEAD was, from a snapshot commit's message.
pub fn head_of(message: &[u8]) -> HeadRef {
    for line in message.lines() {
        if let Some(rest) = line
            .to_str()
            .ok()
            .and_then(|l| l.strip_prefix(HEAD_TRAILER))
            && let Some(b) = rest.trim().strip_prefix("refs/heads/")
        {
            return HeadRef::Branch(b.to_string());
        }
    }
    HeadRef::Detached
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_head_and_owner_trailers_round_trip() {
        let alice = SnapshotOwner {
            uid: 1001,
            name: Some("alice".into()),
        };
        let m = message("t1", &HeadRef::Branch("feature/x".into()), &alice);
        assert_eq!(head_of(m.as_bytes()), HeadRef::Branch("feature/x".into()));
        assert_eq!(owner_of(m.as_bytes()), Some(alice));
        let nameless = SnapshotOwner { uid: 7, name: None };
        let m = message("t1", &HeadRef::Detached, &nameless);
        assert_eq!(head_of(m.as_bytes()), HeadRef::Detached);
        assert_eq!(owner_of(m.as_bytes()), Some(nameless));
        assert_eq!(head_of(b"some other commit"), HeadRef::Detached);
        assert_eq!(owner_of(b"some other commit\n\nOctofs-Owner: x\n"), None);
        assert_eq!(owner_of(b"some other commit"), None);
    }
}
