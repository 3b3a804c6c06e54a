//! The ringleader node: the `ringleader` binary's library, one module per part.
//!
//! Data flows one way, from the network up to the user:
//!
//! | part | owns | may use |
//! | --- | --- | --- |
//! | [`cluster`] | the libp2p swarm, identity, addresses, the wire codec, gossip membership, member metadata | nothing above it |
//! | [`search`] | search jobs: the spec and trial specs, the replicated trial records, the leaderboard and `summary.json` | `jobs`' leaf modules, `domain::id` (its writer: the control handle) |
//! | [`control`] | openraft glue, the replicated control state (a search's commands included), its store, voters, the RPC server | `cluster`, `jobs`' leaf modules (spec, logs), `search`'s records |
//! | [`datasets`] | datasets shared peer to peer: manifests, the store, the authenticated transport, serving, multi-source fetch, the service | `cluster`, `control`, `domain::spec` |
//! | [`chief`] | what the chief decides (`decide`: placement, lost attempts, re-forms, searches' trials) and its loop | `control`, `cluster`, `search` |
//! | [`gpus`] | this host's GPUs: discovery (the CUDA driver, or a test-only fake source), `--gpus`, PCI bus order, the CUDA libraries linked for ranks, a rank's `CUDA_VISIBLE_DEVICES` | `cluster::meta` |
//! | [`jobs`] | job specs, the per-node supervisor (pure plan + process I/O), rank launch | `control`, `cluster`, `gpus` |
//! | [`api`] | HTTP routes, the dashboard, the status and job documents, token auth, Prometheus, the CLI's HTTP client | `control`, `cluster`, `jobs`, `search` |
//! | [`security`] | the node's secrets at start: the cluster key and API token (made at first start, required to join), file modes | `cluster::identity`, `api::auth` |
//! | [`cli`] | commands, the demo, benchmarks, local clusters of real processes | everything |
//!
//! [`node`] wires the parts together at start-up, holding [`data_dir`]'s lock. The collective data plane and the trainer
//! are separate crates that know nothing of the node. The project's architecture is in
//! `docs/design.md`.

pub mod api;
pub mod chief;
pub mod cli;
pub mod cluster;
pub mod control;
pub mod data_dir;
pub mod datasets;
pub mod domain;
pub mod gpus;
pub mod jobs;
pub mod node;
pub mod search;
pub mod security;
