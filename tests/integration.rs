//! The integration tests, as one test binary (each binary links the whole crate: one link instead
//! of one per topic). One module per topic, in the file of its name beside this one
//! (`cargo test --test integration restart::` runs one topic); `common` is the shared harness
//! (`Daemon`, `GitRepo`, timeouts, users) and `support` the reference model, generator, checker and
//! shrinker that `model` and `faults` drive.

mod common;
#[allow(dead_code)]
mod support {
    pub mod base;
    pub mod case;
    pub mod checker;
    pub mod generator;
    pub mod model;
    pub mod mount_check;
    pub mod shrinker;
    pub mod workload;
}

mod behind_kernel;
mod big_files;
mod catalog_commit;
mod cli_errors;
mod core_read;
mod create_path;
mod csi;
mod deps_build;
mod deps_view;
mod deps_workspace;
mod doctor;
mod exec_busy;
mod export;
mod faults;
mod first_open;
mod fork_teleport;
mod fsmonitor_hook;
mod git_workspace;
mod handles;
mod install;
mod io_auto;
mod lifecycle;
mod limits;
mod locking;
mod mirror_cancel;
mod model;
mod node_table;
mod noopen;
mod open_cost;
mod pipeline;
mod posix_roundtrip;
mod presented_stat;
mod private_state;
mod push_http;
mod read_mount;
mod readdir_mount;
mod restart;
mod restart_idle;
mod resume_batch;
mod resync;
mod selfcontained;
mod share;
mod snapshot_incremental;
mod snapshot_pack;
mod snapshot_since;
mod snapshots_named;
mod stats;
mod sync_under_load;
mod trust_adversary;
mod trust_git;
mod trust_records;
mod trust_remote;
mod trust_socket;
mod unprivileged;
mod untracked_cache;
mod uring;
mod uring_survives;
mod watch;
mod write_visibility;
