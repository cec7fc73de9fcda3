//! The control protocol between the daemon and its clients (the CLI, git's fsmonitor hook, doctor,
//! the CSI plugin): one JSON request line, one JSON response line, over the Unix socket
//! `<state>/octofs.sock`. Who is asking is never part of a request: the daemon takes it from the
//! socket's peer credentials.
//!
//! Every request is a struct ([`requests`]) that names its answer through [`Call`]
//! (`Commit`'s is [`Committed`]); [`Request`] is their sum, tagged by `"cmd"` on the wire. The daemon
//! serializes each answer as the response's `result` and `crate::client::call` reads it back as
//! that type. `src/proto/requests.jsonl` and `src/proto/answers.tsv` hold the wire as it is: a test
//! fails when it changes.
//!
//! Owns the requests' and answers' types and their wire form; must not depend on the daemon, the
//! client or the CLI (it sits below all three), and does no I/O.

mod answers;
pub mod hook;
mod requests;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use answers::*;
pub use requests::*;

pub use crate::deps::build::{BuildAnswer, Outcome, OutcomeKind, ProgressAnswer, ProgressEvent};
pub use crate::deps::gc::{GcAnswer, LayerInfo, Removed};
pub use crate::fs::stats::{OpStats, StatsReport};
pub use crate::git::mirror::{Access, MirrorInfo, SyncOutcome, is_url};

/// Refuses, before it is sent, an upstream the daemon would refuse (the daemon's own check).
pub fn check_upstream(upstream: &str) -> Result<(), String> {
    crate::git::mirror::check_upstream(upstream).map_err(|e| e.to_string())
}

/// A request that names its answer: what the daemon answers `Self` with, as the response's
/// `result`.
pub trait Call: Into<Request> {
    type Answer: Serialize + DeserializeOwned;
}

/// Every request, as it travels: `{"cmd":"<kebab-case name>", …its fields}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Ping,
    MirrorAdd(MirrorAdd),
    MirrorAccess(MirrorAccess),
    MirrorSync(MirrorSync),
    MirrorList,
    Open(Open),
    List,
    Status(Status),
    Fsmonitor(Fsmonitor),
    Snapshot(Snapshot),
    Release(Release),
    Sweep(Sweep),
    Diff(Diff),
    Stats(Stats),
    Metrics,
    Stop,
    Watch(Watch),
    Fork(Fork),
    Teleport(Teleport),
    ReleaseWhenIdle(ReleaseWhenIdle),
    Commit(Commit),
    Push(Push),
    DepsBuild(DepsBuild),
    DepsList,
    DepsGc,
    DepsProgress(DepsProgress),
    Export(Export),
    Resync(Resync),
    SnapshotNamed(SnapshotNamed),
    Pull(Pull),
    MirrorShare(MirrorShare),
    MirrorExcludes(MirrorExcludes),
    MirrorProgress(MirrorProgress),
    MirrorCancel(MirrorCancel),
    Restart(Restart),
    Remount(Remount),
}

/// One response line: `ok` with the answer as `result` (and warnings), or the error's one line.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub result: serde_json::Value,
}

impl Response {
    pub fn ok(result: serde_json::Value, warnings: Vec<String>) -> Response {
        Response {
            ok: true,
            error: None,
            warnings,
            result,
        }
    }
    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire stays what the CLI of the previous release read by key.
    #[test]
    fn answers_keep_their_wire_form() {
        let v = serde_json::to_value(Opened {
            path: "/r/t".into(),
        })
        .unwrap();
        assert_eq!(v, serde_json::json!("/r/t"));
        let r = ReleaseAnswer {
            thread: "t".into(),
            released: false,
            already: false,
            users: Some(2),
            user_names: Vec::new(),
            snapshot: None,
            pending: false,
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"thread": "t", "released": false, "users": 2})
        );
        let back: ReleaseAnswer = serde_json::from_value(
            serde_json::json!({"thread": "t", "released": true, "already": true}),
        )
        .unwrap();
        assert!(back.already && back.released && back.snapshot.is_none());
        let s = SweepAnswer {
            released: vec!["a".into()],
            kept: vec![Kept {
                thread: "b".into(),
                why: "active".into(),
            }],
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"released": ["a"], "kept": [{"thread": "b", "why": "active"}]})
        );
    }

    /// Every checked-in request and answer line reads and writes back byte for byte: a field
    /// renamed, reordered, dropped or newly written changes the wire, and fails here
    /// (`src/proto/requests.jsonl`, `src/proto/answers.tsv`). A response's `result` is a JSON value:
    /// its keys come sorted, as `--json` prints them.
    #[test]
    fn the_wire_is_the_checked_in_one() {
        fn same<T: serde::de::DeserializeOwned + Serialize>(line: &str) {
            let v: T = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(serde_json::to_string(&v).unwrap(), line);
        }
        let requests = include_str!("requests.jsonl");
        for line in requests.lines() {
            same::<Request>(line);
        }
        let answers = include_str!("answers.tsv");
        for row in answers.lines() {
            let (kind, line) = row.split_once('\t').expect("kind<TAB>json");
            match kind {
                "response" => same::<Response>(line),
                "ack" => same::<Ack>(line),
                "opened" => same::<Opened>(line),
                "snapshotted" => same::<Snapshotted>(line),
                "committed" => same::<Committed>(line),
                "status" => same::<WorkspaceStatus>(line),
                "release" => same::<ReleaseAnswer>(line),
                "forked" => same::<Forked>(line),
                "sweep" => same::<SweepAnswer>(line),
                "diff" => same::<DiffAnswer>(line),
                "pushed" => same::<Pushed>(line),
                "watch" => same::<WatchAnswer>(line),
                "fsmonitor" => same::<FsmonitorAnswer>(line),
                "access" => same::<AccessAnswer>(line),
                "resynced" => same::<Resynced>(line),
                "pulled" => same::<Pulled>(line),
                "named" => same::<NamedSnapshot>(line),
                "exported" => same::<Exported>(line),
                "restarted" => same::<Restarted>(line),
                "progress" => same::<FetchProgress>(line),
                _ => panic!("unknown kind {kind}"),
            }
        }
    }
}
