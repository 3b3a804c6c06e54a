//! The ringleader node: the `ringleader` binary's library.
//!
//! A node joins a cluster by seed address and learns its members through gossip
//! ([`membership`], a sans-IO SWIM/Lifeguard core driven by [`net`]'s libp2p event loop). It
//! serves an HTTP JSON API ([`api`]) of which the CLI ([`cli`]) is a client. The collective
//! data plane and the trainer are separate crates that know nothing of the node.

pub mod addr;
pub mod api;
pub mod bench;
pub mod bench_control;
pub mod cli;
pub mod client;
pub mod consensus;
pub mod control;
pub mod demo;
pub mod identity;
pub mod jobs;
pub mod local;
pub mod membership;
pub mod meta;
pub mod net;
pub mod node;
pub mod status;
pub mod train;
pub mod wire;
pub mod worker;
