//! The node's services: the parts between the control plane and the API, one module each.
//!
//! A crate of its own, `ringleader-services` (`node/services/`), above `ringleader-cluster`,
//! `ringleader-domain` and `ringleader-control`, below `ringleader-api` and the `ringleader`
//! binary, whose `lib.rs` re-exports each part under its old name (`pub use
//! ringleader_services::chief;` …), so every path to them reads as before. Its parts, lowest
//! first: [`gpus`] (this host's GPUs), [`datasets`] (datasets shared peer to peer),
//! [`security`] (the node's secrets at start), [`rotation`] (key rotation), [`jobs`] (admission
//! and the per-node supervisor), [`search`] (a search's summary), [`chief`] (what the Raft
//! leader decides), and `sim` (tests only: the control plane and the chief simulated together).
//! Below them all, `fs_at` (crate-private): the system calls at a directory descriptor that the
//! two walkers never following a link (`datasets::confined`, `security::rank_dir`) stand on.
//! What each may use is the table in `docs/book/src/design/design.md` ("The node, by part"),
//! which `scripts/check-layers.py` holds inside this crate as it does inside the node.
//!
//! The root names the crates below under their parts' names (`cluster`, `tasks`, `domain`,
//! `control`, as the node's `lib.rs` does), so the parts' files read `crate::domain::…` and
//! `crate::control::…` as they did inside the node.

#![warn(unreachable_pub)]

use ringleader_cluster as cluster;
use ringleader_cluster::tasks;
use ringleader_control as control;
use ringleader_domain as domain;

pub mod chief;
pub mod datasets;
mod fs_at;
pub mod gpus;
pub mod jobs;
pub mod rotation;
pub mod search;
pub mod security;
#[cfg(test)]
mod sim;
