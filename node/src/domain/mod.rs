//! The replicated domain: what the cluster agrees on, as plain data and deterministic rules,
//! below the Raft glue (`control`) that replicates it.
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
//!
//! Nothing here does I/O, reads a clock or draws randomness while applying (the one draw,
//! [`state::new_ring_secret`], is the proposer's). May use: `cluster` (its leaf types),
//! `gpus`' constants, the `trainer` crate's spec and search types. Used by every part above:
//! `control` (which replicates it), `jobs`, `search`, `datasets`, `chief`, `api`.

pub mod admission;
pub mod content;
pub mod id;
pub mod preempt;
pub mod queue;
pub mod search;
pub mod spec;
pub mod state;
pub use spec::train as train_spec;

pub use state::{ops, ControlCommand, ControlResponse, ControlState, Job, JobId, JobState, Op};
