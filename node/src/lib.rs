//! The ringleader node: the `ringleader` binary's library, one module per part.
//!
//! Data flows one way, from the network up to the user:
//!
//! | part | owns | may use |
//! | --- | --- | --- |
//! | [`datasets`] | content-addressed datasets: manifests, chunks, verification | nothing of the node yet |
//! | [`cluster`] | the libp2p swarm, identity, addresses, the wire codec, gossip membership, member metadata | nothing above it |
//! | [`control`] | openraft glue, the replicated control state, its store, voters, the RPC server | `cluster`, `jobs`' leaf modules (spec, logs) |
//! | [`chief`] | what the chief decides (`decide`: placement, lost attempts) and its loop | `control`, `cluster` |
//! | [`jobs`] | job specs, the per-node supervisor (pure plan + process I/O), rank launch | `control`, `cluster` |
//! | [`api`] | HTTP routes, the status and job documents, the CLI's HTTP client | `control`, `cluster`, `jobs` |
//! | [`cli`] | commands, the demo, benchmarks, local clusters of real processes | everything |
//!
//! [`node`] wires the parts together at start-up. The collective data plane and the trainer
//! are separate crates that know nothing of the node. The project's architecture is in
//! `docs/design.md`.

pub mod api;
pub mod chief;
pub mod cli;
pub mod cluster;
pub mod control;
pub mod datasets;
pub mod jobs;
pub mod node;
pub mod search;
