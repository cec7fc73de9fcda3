//! The control protocol, as the daemon's modules name it: it lives in `crate::proto` (below the
//! daemon, shared with the client, the hooks, doctor and the CSI plugin).

pub use crate::proto::*;
