//! Control: chief election and the replicated control state (Raft, via openraft).
//!
//! - [`state`]: the replicated state machine's data and its deterministic `apply`.
//! - [`voters`]: sans-IO voter reconciliation (which members vote), autopilot-like.
//! - [`store`]: openraft log store and state machine persisted as checksummed files.
//!
//! The network half (Raft RPCs over libp2p request-response) and the driver that ties
//! gossip, placement and Raft together are wired by the node.

pub mod state;
pub mod store;
pub mod voters;

pub use state::{ControlCommand, ControlResponse, ControlState, Job, JobId, JobState};
