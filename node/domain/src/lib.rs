//! The replicated domain: what the cluster agrees on, as plain data and deterministic rules,
//! below the Raft glue (`control`) that replicates it. A crate of its own
//! (`ringleader-domain`) that depends on no part of the node and not on the `trainer` crate
//! (so not on candle): the node re-exports it as `ringleader::domain`.
//!
//! - [`state`]: the replicated state machine ([`ControlState`]) and its commands
//!   ([`ControlCommand`]): one method per command, `apply` only dispatches. Its registries
//!   and their commands are its children: a search's trials (`state::trials`), compaction of
//!   ended jobs, datasets, API tokens, removed members.
//! - [`id`]: job ids; [`content`]: content addresses (a dataset's root).
//! - [`spec`] and [`train_spec`]: a job's spec as stored in the log (parsed and checked at
//!   admission), and its `[train]` table checked against the trainer's.
//! - [`search`]: a search's spec and trial specs, its replicated record, the leaderboard.
//! - [`admission`]: the sharing rules a submit must pass (a priority ceiling, who may refuse
//!   preemption, a job that could never fit).
//! - [`device_order`]: the order CUDA devices are numbered in (the node's `gpus` re-exports
//!   it).
//!
//! Nothing here does I/O, reads a clock or draws randomness while applying (the one draw,
//! [`state::new_ring_secret`], is the proposer's). May use: no part of the node; the
//! `ringleader-spec` crate's trainer tables and search types, the protocol crate's names.
//! Used by every part above: `control` (which replicates it), `jobs`, `search`, `datasets`,
//! `chief`, `api`.

// `pub` means reachable from outside the crate: an item the node cannot name is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod admission;
pub mod content;
pub mod device_order;
pub mod id;
pub mod preempt;
pub mod queue;
pub mod search;
pub mod spec;
pub mod state;
pub use spec::train as train_spec;

pub use state::{ops, ControlCommand, ControlResponse, ControlState, Job, JobId, JobState, Op};
