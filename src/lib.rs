//! octofs: per-thread copy-on-write git workspaces served as FUSE mounts.
//!
//! The layers, each in its own module and depending only on the ones listed before it:
//! - [`names`], [`layout`], [`records`], [`errno`] and [`sys`]: validated names, where state lives,
//!   durable JSON records, how an errno is shown, and the only `unsafe` code (`sys::uring`: io_uring
//!   for the FUSE ring transport).
//! - [`git`](mod@git): mirrors (one pristine checkout per project) and read access to their object stores.
//! - [`cow`]: the host-wide, content-addressed blob cache (and, later, the per-workspace upper layer).
//! - [`fs`]: the filesystem core (no kernel needed) and the thin fuser adapter that serves it.
//! - [`workspace`]: a thread's durable workspace record (project, base commit, mounted or not).
//! - [`repo`]: the `.git` each workspace gets at fork, and its shared index.
//! - [`access`]: who is calling (peer credentials) and the read grant on a mirror's objects that a
//!   workspace's owner gets.
//! - [`own_repo`]: a workspace's `.git` read in process (never with git, never through the mount):
//!   what `git add -A` would add, and the agent's own commits carried into the mirror.
//! - [`deps`]: dependency layers: ignored dependency trees (`node_modules`, `.venv`) installed once
//!   per host by the package manager, sealed as git trees and presented read-through in workspaces.
//! - [`proto`]: the control protocol's requests (each naming its answer type) and answers, shared
//!   by the daemon and its clients.
//! - [`daemon`]: the one process that serves every mount and the control socket.
//! - [`client`]: what the CLI uses to talk to (and start) the daemon.
//! - [`hooks`]: commit hooks, run by the CLI in a mount as the workspace's owner (never by the daemon).
//! - [`run`]: `octofs run`, a command in a bubblewrap sandbox that sees only the workspace.
//! - [`csi`]: `octofs csi`, a Kubernetes CSI node plugin (a client of the daemon) that publishes
//!   threads as pods' inline volumes.
//! - [`doctor`]: finds (and with `--fix` repairs what is safe of) what crashes and kills left behind
//!   in the state directory and under the root, reading them directly.

#![deny(unsafe_code)]

pub mod access;
pub mod client;
pub mod cow;
pub mod csi;
pub mod daemon;
pub mod deps;
pub mod doctor;
pub mod errno;
pub mod fs;
pub mod git;
pub mod hooks;
pub mod layout;
pub mod names;
pub mod own_repo;
pub mod private_state;
pub mod proto;
pub mod records;
pub mod repo;
pub mod run;
#[allow(unsafe_code)]
pub mod sys;
pub mod workspace;
