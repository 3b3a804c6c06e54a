//! The cluster: how nodes reach, know and trust each other; the node's bottom layer, a crate
//! of its own (`ringleader-cluster`) that depends on no other part of the node. The node
//! re-exports it as `ringleader::cluster` (and [`tasks`], [`data_dir`] at its root).
//!
//! - [`net`]: the libp2p swarm (TCP, optional pre-shared key, Noise, Yamux), the datagram
//!   socket and the one event loop that owns both, drives [`membership`] and carries the
//!   control plane's RPCs; other tasks hold a cheap [`net::NodeHandle`].
//! - [`datagrams`]: membership's probes and gossip as UDP datagrams sealed with the cluster
//!   key, on the p2p port's number.
//! - [`streams`]: membership's joins, syncs and leaves on one long-lived stream per peer
//!   (writers, readers).
//! - [`calls`]: the control plane's calls (Raft, forwarded writes, log reads) on one
//!   long-lived stream per peer, answers matched to calls by id.
//! - [`membership`]: gossip membership, a sans-IO SWIM/Lifeguard core with its simulation.
//! - [`meta`]: what a member advertises (name, addresses, cpus, memory, gpus, labels).
//! - [`claim_keys`]: the node's identity signs its membership claims, peer ids check others'.
//! - [`identity`]: the persistent Ed25519 identity and the cluster key.
//! - [`key_ring`]: the cluster key at run time, swapped by a key rotation (the current key,
//!   the previous one for a bounded overlap, an offered one pending).
//! - [`addr`]: addresses as users write them (`host:port` or a multiaddr).
//! - [`wire`]: the node's one wire codec, with its size limits.
//! - [`tasks`]: the tasks each part of the node spawns, owned and stopped in order.
//! - [`data_dir`]: the data directory's lock (one node per directory).
//!
//! May use: nothing else of the node. Used by every other part.

// `pub` means reachable from outside the crate: an item the node cannot name is `pub(crate)`.
#![warn(unreachable_pub)]

pub mod addr;
pub mod calls;
pub mod claim_keys;
pub mod data_dir;
pub mod datagrams;
pub mod identity;
pub mod key_ring;
pub mod membership;
pub mod meta;
pub mod net;
pub mod streams;
pub mod tasks;
pub mod wire;
