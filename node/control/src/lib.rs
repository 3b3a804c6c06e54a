//! Control: chief election and the replication of the domain's state (Raft, via openraft).
//! The state machine itself, its commands and records are the domain's (`ringleader_domain`);
//! this part is the openraft plumbing around it.
//!
//! A crate of its own, `ringleader-control` (`node/control/`), above `ringleader-cluster` and
//! `ringleader-domain`; the node's `lib.rs` re-exports it as `control`. Its root names the
//! crates below under their parts' names (`cluster`, `tasks`, `domain`, as the node does), so
//! its files read `crate::cluster::…` and `crate::domain::…` as they did inside the node.
//!
//! - [`store`]: openraft log store and state machine persisted as checksummed files.
//! - [`voters`]: sans-IO voter reconciliation (which members vote), autopilot-like.
//! - [`handle`]: starting Raft on a node, [`handle::ControlHandle`] (the write path through
//!   the chief, reads, who is chief, the voter upkeep's Raft calls).
//! - [`recovery`]: Raft restarts on its files once a full disk takes writes again.
//! - [`protocol`]: the control plane's RPC messages between nodes.
//! - [`rpc`]: their server, with what a peer may forward ([`rpc::authorize`]); a forwarded
//!   submit's admission is handed in at [`start`] ([`rpc::Admission`]).
//! - [`logs`]: ranks' logs on the node that ran them, read in bounded pieces (locally or for
//!   a peer over RPC).
//! - `network`: openraft's network adapter over those RPCs.
//! - [`reach`]: whether replication reaches each member, logged once per change.
//!
//! May use: `cluster` (the swarm handle, member view, wire codec), `domain`. Used by:
//! `datasets`, `jobs`, `search`, `chief`, `api`, the node's start-up.

#![warn(unreachable_pub)]

use ringleader_cluster as cluster;
use ringleader_cluster::tasks;
use ringleader_domain as domain;

pub mod handle;
pub mod logs;
mod network;
pub mod protocol;
pub mod reach;
pub mod recovery;
pub mod rpc;
pub mod store;
pub mod voters;

/// Starts this node's control plane: Raft on `node`'s swarm, its restart after storage
/// failures, and the server of the peers' RPCs arriving on `rpc_rx` (a forwarded submit's
/// spec admitted by `admit`, the job layer's gate). The chief's loop and the supervisor are started by the node on
/// top of the returned handle.
pub async fn start(
    cfg: handle::ControlConfig<'_>,
    node: crate::cluster::net::NodeHandle,
    rpc_rx: tokio::sync::mpsc::Receiver<crate::cluster::net::InboundRpc>,
    admit: rpc::Admission,
) -> anyhow::Result<handle::ControlHandle> {
    let ctl = handle::open(cfg, node).await?;
    ctl.tasks
        .spawn(recovery::restart_after_storage_failures(ctl.clone()));
    ctl.tasks.spawn(rpc::serve(ctl.clone(), rpc_rx, admit));
    ctl.tasks.spawn(keep_voters_connected(ctl.clone()));
    ctl.tasks.spawn(shut_out_removed(ctl.clone()));
    Ok(ctl)
}

/// Longest [`keep_voters_connected`] goes without looking at the voters, in milliseconds
/// (they change with a log entry, which wakes it at once).
const VOTERS_CHECK_MS: u64 = 10_000;

/// Keeps this node connected to the Raft voters (the chief's possible successors). Membership
/// needs no connections (its probes are datagrams), so without this a node would reach a
/// new chief only when its first call dials, and at 128 nodes the calls of an election and
/// of a new chief's first heartbeats waited on hundreds of handshakes at once: failover took
/// 12–32 s in place of 2.4 s. The voters change only with an entry of the log, so it looks
/// again when this replica applies entries (or a snapshot), not on a timer: an idle node
/// does not wake for it.
async fn keep_voters_connected(ctl: handle::ControlHandle) {
    let mut kept = Vec::new();
    // The membership's log index when the voters were last read: entries that leave it
    // alone cost a look at it, not a read of every member.
    let mut seen = None;
    let mut applied = ctl.subscribe_applied();
    loop {
        let index = ctl.membership_index();
        if seen != Some(index) {
            seen = Some(index);
            let voters: Vec<libp2p::PeerId> =
                ctl.voters().iter().filter_map(|p| p.parse().ok()).collect();
            if voters != kept {
                ctl.node.keep_connected(voters.clone()).await;
                kept = voters;
            }
        }
        let wait = std::time::Duration::from_millis(VOTERS_CHECK_MS);
        if let Ok(Err(_)) = tokio::time::timeout(wait, applied.changed()).await {
            return;
        }
    }
}

/// Tells the event loop which members an operator removed (`domain::state::removal`), so that
/// their membership datagrams and frames are dropped (a removed host may still hold the
/// cluster key until it is rotated). The set changes only with an entry of the log, so it
/// looks again when this replica applies entries, as [`keep_voters_connected`] does.
async fn shut_out_removed(ctl: handle::ControlHandle) {
    let mut told: Option<Vec<libp2p::PeerId>> = None;
    let mut applied = ctl.subscribe_applied();
    loop {
        let removed: Vec<libp2p::PeerId> =
            ctl.read(|s| s.removed.keys().filter_map(|p| p.parse().ok()).collect());
        if told.as_ref() != Some(&removed) {
            ctl.node.set_removed(removed.clone()).await;
            told = Some(removed);
        }
        let wait = std::time::Duration::from_millis(VOTERS_CHECK_MS);
        if let Ok(Err(_)) = tokio::time::timeout(wait, applied.changed()).await {
            return;
        }
    }
}
