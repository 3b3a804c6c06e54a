//! The ringleader node: the `ringleader` binary's library, one module per part.
//!
//! Data flows one way, from the network up to the user: [`cluster`] (the swarm, membership,
//! the wire codec), [`gpus`], [`domain`] (the replicated state and its rules), [`control`]
//! (Raft around it), [`datasets`], [`security`], [`jobs`], [`search`], [`chief`], [`api`],
//! [`cli`]. The parts below [`cli`] and [`node`] are crates of their own, re-exported here
//! under their old paths:
//! [`cluster`] (with [`tasks`] and [`data_dir`]) is `ringleader-cluster` under `node/cluster/`,
//! [`domain`] is `ringleader-domain` under `node/domain/` (no `trainer`, no candle),
//! [`control`] is `ringleader-control` under `node/control/`, and [`gpus`], [`datasets`],
//! [`security`], [`rotation`], [`jobs`], [`search`] and [`chief`] are the parts of
//! `ringleader-services` under `node/services/` (with `sim`, tests only: `control` and `chief`
//! simulated together in process), and [`api`] is `ringleader-api` under `node/api/`. What
//! this package holds itself is the binary: [`cli`], [`node`] and `main.rs`. The table
//! of parts, what each owns and what it may use is kept in one place,
//! `docs/book/src/design/design.md` ("The node, by part"); `scripts/check-layers.py` reads it and
//! fails on an import it does not allow or an import cycle.
//!
//! [`node`] wires the parts together at start-up, holding [`data_dir`]'s lock; each part spawns
//! into its own [`tasks::Tasks`], which `node` stops in order at SIGTERM. The collective data plane
//! and the trainer are separate crates that know nothing of the node. The project's architecture is
//! in `docs/book/src/design/design.md`.

pub use ringleader_api as api;
pub mod cli;
pub use ringleader_cluster as cluster;
pub use ringleader_cluster::data_dir;
pub use ringleader_control as control;
pub use ringleader_domain as domain;
pub mod node;
pub use ringleader_cluster::tasks;
pub use ringleader_services::{chief, datasets, gpus, jobs, rotation, search, security};
