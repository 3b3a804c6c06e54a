//! The server of the control plane's RPCs ([`super::protocol`]): Raft's own messages,
//! writes a member forwards to the chief and reads of a rank's log kept on the node that ran
//! it. Every peer that reaches this server passed
//! the swarm's handshake (and the cluster key, when the cluster has one); that makes it a
//! member, not the chief: [`authorize`] lets it forward only what a member may originate.
//!
//! Raft's own messages are checked against the sender before Raft sees them
//! ([`check_raft_sender`]): a vote request only from the candidate it names, an
//! AppendEntries or snapshot chunk only from the leader it names (a node's Raft id is the
//! hash of its peer id, [`node_id_of`], so the swarm's authenticated peer id pins it), and
//! all three only from a voter or learner of this node's membership config. Two exceptions
//! keep joins and catch-up live: a node whose membership is still empty (joining, or about
//! to bootstrap) hears any sender that names itself, and a sender outside the membership is
//! heard when its request shows a log past this node's (this node may have missed the entry
//! that added it). A removed or stale node (its log no longer than ours) is refused, which
//! is the disruption Raft's §6 warns about. A refusal is a [`PeerRefused`], logged at warn
//! with the peer, and answered as a malformed request (openraft retries, as for a network
//! error).
//!
//! Forwarded writes and log reads carry the [`Principal`] the forwarding node's API checked:
//! the admin, or a replicated token by its hash. The chief trusts a peer holding the cluster
//! key to have checked it, but refuses ([`authorize_principal`]) a user command whose token
//! left the state meanwhile (revoked between the follower's check and the commit), and a
//! token or member change from anyone but the admin (a node's own reports carry
//! [`Principal::Node`], as does every write of an older node). It logs at
//! info which peer (and whether it is a Raft member) forwarded each user command and for
//! whom, so every commit of a submit, cancel or dataset change can be traced to the node
//! whose API took it and the token it came with. The same principal check guards reads of a
//! rank's log.
//!
//! A member an operator removed (`domain::state::removal`) is refused everything: its Raft
//! messages, its writes, its log reads ([`check_not_removed`]).

use std::sync::atomic::Ordering;

use openraft::{
    raft::{AppendEntriesRequest, AppendEntriesResponse, VoteRequest},
    Membership,
};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{
    cluster::{
        calls::{InboundRpc, Reply},
        wire,
    },
    domain::{
        spec::JobSpec,
        state::{
            ops,
            tokens::Principal,
            user_limits::{spec_bytes, UserLimits, OVER_LIMIT},
            users::{Action, Actor, Role, ADMIN_USER},
            ControlCommand, ControlState, JobId, Op, Origin,
        },
    },
    handle::ControlHandle,
    logs::{read_log, LogChunk},
    protocol::{ProposeError, RpcRequest, RpcResponse, SnapshotRequest},
    store::{node_id_of, NodeId, RaftNode, TypeConfig},
};

/// The admission of a spec a member forwarded with a submit: the job layer's gate (the node
/// passes `jobs::admit_forwarded`: its secrets sealed, then every field as the API admits
/// one), handed to the server at start so that the Raft glue imports nothing above it.
pub type Admission = fn(&JobSpec) -> Result<(), String>;

/// Longest a chief waits to apply what it committed before it judges a forwarded write
/// again, in milliseconds (see [`forwarded`]).
const CATCH_UP_MS: u64 = 2_000;

/// Which Raft message a [`PeerRefused`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftRpc {
    /// A vote request: sent by the candidate it names.
    Vote,
    /// An AppendEntries (heartbeats included): sent by the leader it names.
    AppendEntries,
    /// A snapshot chunk: sent by the leader it names.
    InstallSnapshot,
}

impl RaftRpc {
    fn name(self) -> &'static str {
        match self {
            RaftRpc::Vote => "vote request",
            RaftRpc::AppendEntries => "append-entries",
            RaftRpc::InstallSnapshot => "snapshot chunk",
        }
    }

    fn role(self) -> &'static str {
        match self {
            RaftRpc::Vote => "candidate",
            RaftRpc::AppendEntries | RaftRpc::InstallSnapshot => "leader",
        }
    }
}

/// Why a Raft message from a peer was refused before it reached Raft.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerRefused {
    /// The message names another node than its sender as its candidate or leader: a peer
    /// speaking for another node.
    #[error("{} names node {named:?} as its {}, but the sender is node {sender}", .rpc.name(), .rpc.role())]
    NotTheNamedNode {
        /// The message.
        rpc: RaftRpc,
        /// The candidate or leader it names (`None`: none).
        named: Option<NodeId>,
        /// The sender's node id (the hash of its peer id).
        sender: NodeId,
    },
    /// The sender is not a voter or learner of this node's membership config, and its
    /// message shows no log past this node's.
    #[error("{} from node {sender}, which is not a voter or learner here (its log reaches {sender_log:?}, ours {our_log:?})", .rpc.name())]
    NotAMember {
        /// The message.
        rpc: RaftRpc,
        /// The sender's node id.
        sender: NodeId,
        /// The last log index its message shows.
        sender_log: Option<u64>,
        /// This node's last log index.
        our_log: Option<u64>,
    },
    /// The sender was removed from the cluster (`ringleader member remove`).
    #[error("peer {peer} was removed from the cluster")]
    Removed {
        /// Its peer id.
        peer: String,
    },
}

/// Refuses a peer an operator removed from the cluster, whatever it sends.
pub fn check_not_removed(peer: &str, state: &ControlState) -> Result<(), PeerRefused> {
    if state.is_removed(peer) {
        Err(PeerRefused::Removed { peer: peer.into() })
    } else {
        Ok(())
    }
}

/// Checks a Raft message's sender (see the module doc): `peer` is the sender's
/// authenticated peer id, `named` the candidate or leader the message names, `sender_log`
/// the last log index it shows; `membership` and `our_log` are this node's.
pub fn check_raft_sender(
    rpc: RaftRpc,
    peer: &str,
    named: Option<NodeId>,
    sender_log: Option<u64>,
    membership: &Membership<NodeId, RaftNode>,
    our_log: Option<u64>,
) -> Result<(), PeerRefused> {
    let sender = node_id_of(peer);
    if named != Some(sender) {
        return Err(PeerRefused::NotTheNamedNode { rpc, named, sender });
    }
    if membership.nodes().next().is_none() {
        return Ok(()); // joining, or not bootstrapped yet
    }
    if membership
        .get_node(&sender)
        .is_some_and(|n| n.peer_id == peer)
    {
        return Ok(());
    }
    if sender_log > our_log {
        return Ok(()); // we lag: the entry adding the sender may not be here yet
    }
    Err(PeerRefused::NotAMember {
        rpc,
        sender,
        sender_log,
        our_log,
    })
}

/// The sender facts of a vote request: the candidate and its last log index.
fn vote_sender(r: &VoteRequest<NodeId>) -> (Option<NodeId>, Option<u64>) {
    (
        r.vote.leader_id().voted_for(),
        r.last_log_id.map(|l| l.index),
    )
}

/// The sender facts of an AppendEntries: the leader and the last log index it shows.
fn append_sender(r: &AppendEntriesRequest<TypeConfig>) -> (Option<NodeId>, Option<u64>) {
    let last = r
        .entries
        .last()
        .map(|e| e.log_id.index)
        .or(r.prev_log_id.map(|l| l.index));
    (r.vote.leader_id().voted_for(), last)
}

/// The sender facts of a snapshot chunk: the leader and the snapshot's last log index.
fn snapshot_sender(r: &SnapshotRequest) -> (Option<NodeId>, Option<u64>) {
    (
        r.vote.leader_id().voted_for(),
        r.meta.last_log_id.map(|l| l.index),
    )
}

/// [`check_raft_sender`] against this node's current membership and log.
fn check_live(
    ctl: &ControlHandle,
    rpc: RaftRpc,
    from: &libp2p::PeerId,
    (named, sender_log): (Option<NodeId>, Option<u64>),
) -> Result<(), String> {
    let m = ctl.raft().metrics().borrow().clone();
    ctl.read(|s| check_not_removed(&from.to_string(), s))
        .and_then(|()| {
            check_raft_sender(
                rpc,
                &from.to_string(),
                named,
                sender_log,
                m.membership_config.membership(),
                m.last_log_index,
            )
        })
        .map_err(|e| {
            warn!(peer = %from, "raft message refused: {e}");
            format!("refused: {e}")
        })
}

/// Whether the member `from` (a peer id) may have `cmd` committed by forwarding it to the
/// chief: the command's origin rule ([`Origin`]), with a submit's spec admitted again
/// exactly as the API admits one, by `admit` (see [`Admission`]). What only the chief
/// decides (placements, failed attempts, unplaceable jobs) is never accepted from the wire:
/// the chief proposes those to its own Raft.
pub fn authorize(
    from: &str,
    cmd: &ControlCommand,
    state: &ControlState,
    admit: Admission,
) -> Result<(), String> {
    match cmd.origin() {
        Origin::Submit(spec) => admit(spec),
        origin => origin.allows(from, state),
    }
}

/// Whether only the admin token may ask for `cmd` (token and member changes).
pub fn admin_only(cmd: &ControlCommand) -> bool {
    cmd.origin().admin_only()
}

/// Who `principal` acts as, if it may have a user's request served here: a token only
/// while its hash is in `state`. The admin, and a member that states no principal (an
/// older node), are served as the admin: the sender holds the cluster key, which grants
/// what the admin token does.
pub fn check_user_principal(principal: &Principal, state: &ControlState) -> Result<Actor, String> {
    state
        .actor(principal)
        .ok_or_else(|| "the API token of this request was revoked".into())
}

/// The refusal of a token or member change asked by anyone but an admin.
const ADMIN_ONLY: &str = "only the admin token or one of role admin may create or revoke tokens, remove members and rotate the key";

/// Whether `actor` may have the user command `cmd` committed, by the rules of
/// `domain::state::users` (the forwarding node's API asked them first): a submit or a
/// dataset only as its own owner (an admin as anyone), a cancel or a dataset's removal
/// of what it owns (an admin of anything), the rest by its role.
fn check_owner(actor: &Actor, cmd: &ControlCommand, state: &ControlState) -> Result<(), String> {
    let as_owner = |action: Action, owner: &str| {
        actor.may(action, None).map_err(|r| r.message(""))?;
        if actor.role != Role::Admin && owner != actor.user {
            return Err(format!(
                "{} may not act as {owner}: a token's writes are its own user's",
                actor.user
            ));
        }
        Ok(())
    };
    match &cmd.op {
        Op::Submit(ops::Submit { owner, .. }) => as_owner(Action::Submit, owner),
        Op::DatasetAdd(ops::DatasetAdd { record, .. }) => {
            as_owner(Action::AddDataset, &record.owner)
        }
        Op::Cancel(ops::Cancel { id }) => {
            let owner = state.job(*id).map(|j| j.owner.as_str());
            actor
                .may(Action::Cancel, owner.or(Some(ADMIN_USER)))
                .map_err(|r| r.message(&id.to_string()))
        }
        Op::DatasetRemove(ops::DatasetRemove { name }) => {
            let owner = state.datasets.get(name).map(|r| r.owner.as_str());
            actor
                .may(Action::RemoveDataset, owner.or(Some(ADMIN_USER)))
                .map_err(|r| r.message(&format!("dataset {name:?}")))
        }
        _ if admin_only(cmd) => actor
            .may(Action::Administer, None)
            .map_err(|_| ADMIN_ONLY.to_owned()),
        _ => Ok(()),
    }
}

/// What the principal and the sender of a forwarded write are allowed, before
/// [`authorize`] looks at the command itself: a removed member nothing; a user command
/// needs a principal [`check_user_principal`] accepts, acting within its user and role
/// (`check_owner`); a token or member change an admin.
pub fn authorize_principal(
    from: &str,
    principal: &Principal,
    cmd: &ControlCommand,
    state: &ControlState,
) -> Result<(), String> {
    check_not_removed(from, state).map_err(|e| e.to_string())?;
    // A member that states no principal (an older node) is served as the admin, but never
    // changes the access list: only the admin's own request does.
    if admin_only(cmd) && *principal == Principal::Node {
        return Err(ADMIN_ONLY.into());
    }
    if let Some(what) = cmd.origin().user_command() {
        let actor = check_user_principal(principal, state).map_err(|e| format!("{what}: {e}"))?;
        check_owner(&actor, cmd, state).map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(())
}

/// Whether a forwarded submit keeps its owner within `limits`, counted in this (the
/// chief's) state, which holds every submit it committed: the forwarding node checked
/// against its replica, which may lag behind submits made through other nodes. Admins are
/// not limited, nor a member that states no principal (an older node).
pub fn check_user_limits(
    principal: &Principal,
    cmd: &ControlCommand,
    state: &ControlState,
    limits: &UserLimits,
) -> Result<(), String> {
    let Op::Submit(ops::Submit { spec, owner, .. }) = &cmd.op else {
        return Ok(());
    };
    match state.actor(principal) {
        Some(actor) if actor.role != Role::Admin => limits
            .check(owner, state.usage(owner), spec_bytes(spec))
            .map_err(|e| format!("submit {OVER_LIMIT}: {e}")),
        _ => Ok(()),
    }
}

/// A forwarded write: checked ([`authorize_principal`], then [`authorize`]), logged with
/// its principal when a user asked for it, and proposed to this node's Raft.
async fn forwarded(
    ctl: &ControlHandle,
    admit: Admission,
    peer: &libp2p::PeerId,
    cmd: ControlCommand,
    principal: Principal,
) -> RpcResponse {
    let from = peer.to_string();
    let allowed = match cmd
        .check()
        .map_err(|e| e.to_string())
        .and_then(|()| ctl.read(|s| authorize_principal(&from, &principal, &cmd, s)))
        .and_then(|()| ctl.read(|s| check_user_limits(&principal, &cmd, s, &ctl.user_limits)))
    {
        Err(e) => Err(e),
        // A submit's authorization is its admission (see `authorize`): CPU work on the spec
        // alone, run off the async runtime and outside the state's lock so Raft's timers and
        // applies go on meanwhile.
        Ok(()) => match cmd.origin() {
            Origin::Submit(spec) => {
                let owned = spec.clone();
                tokio::task::spawn_blocking(move || admit(&owned))
                    .await
                    .unwrap_or_else(|e| Err(format!("admission failed: {e}")))
                    .and_then(|()| match ctl.read(|s| s.unknown_dataset(spec)) {
                        Some((field, problem)) => Err(format!("{field}: {problem}")),
                        None => Ok(()),
                    })
            }
            _ => match ctl.read(|s| authorize(&from, &cmd, s, admit)) {
                // A rank's report can outrun this chief's own state machine: the rank's node
                // applied the placement as soon as it learned the entry was committed, and a
                // rank that exits at once (`true`) reports before the chief applied the
                // entry it committed itself. Judge again once this chief applied everything
                // it committed (bounded): a report refused as stale lost the rank's exit and
                // the job never ended.
                Err(_) if ctl.read(|s| cmd.origin().may_be_ahead(s)) => {
                    ctl.apply_committed(std::time::Duration::from_millis(CATCH_UP_MS))
                        .await;
                    ctl.read(|s| authorize(&from, &cmd, s, admit))
                }
                ok => ok,
            },
        },
    };
    let r = match allowed {
        Err(e) => {
            warn!(peer = %peer, principal = %principal.describe(), "forwarded command refused: {e}");
            Err(ProposeError::Rejected(e))
        }
        Ok(()) => {
            if let Some(command) = cmd.origin().user_command() {
                let m = ctl.raft().metrics().borrow().clone();
                let member = m
                    .membership_config
                    .membership()
                    .get_node(&node_id_of(&from))
                    .is_some_and(|n| n.peer_id == from);
                let token = match &principal {
                    Principal::Token { hash } => ctl
                        .read(|s| s.token_named_by_hash(hash).map(str::to_owned))
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                info!(peer = %peer, member, command, principal = %principal.describe(), token = %token, "forwarded user command accepted");
            }
            ctl.propose_local(cmd).await
        }
    };
    RpcResponse::Propose(r)
}

/// A read of a rank's log kept here, for a member whose API checked `principal`.
fn log_read(
    ctl: &ControlHandle,
    peer: &libp2p::PeerId,
    (job, generation, worker, offset): (JobId, u32, u32, u64),
    principal: &Principal,
) -> LogChunk {
    let from = peer.to_string();
    let allowed = ctl.read(|s| {
        check_not_removed(&from, s).map_err(|e| e.to_string())?;
        let actor = check_user_principal(principal, s)?;
        let owner = s.job(job).map(|j| j.owner.as_str());
        actor
            .may(Action::ReadLogs, owner.or(Some(ADMIN_USER)))
            .map_err(|r| r.message(&job.to_string()))
    });
    match allowed {
        Ok(()) => {
            debug!(peer = %peer, principal = %principal.describe(), %job, worker, "log read");
            read_log(&ctl.jobs_dir, job, generation, worker, offset)
        }
        Err(e) => {
            warn!(peer = %peer, principal = %principal.describe(), %job, "log read refused: {e}");
            LogChunk::empty(worker, generation, offset, Some(format!("refused: {e}")))
        }
    }
}

/// Answers the peers' RPCs, each on a task of its own, until the node's event loop closes
/// the queue.
pub async fn serve(ctl: ControlHandle, mut rx: mpsc::Receiver<InboundRpc>, admit: Admission) {
    while let Some(InboundRpc {
        from,
        payload,
        reply,
    }) = rx.recv().await
    {
        let tasks = ctl.tasks.clone();
        let ctl = ctl.clone();
        tasks.spawn(async move {
            let resp = match wire::decode_json::<RpcRequest>(&payload) {
                Ok(RpcRequest::AppendEntries(r)) => {
                    if let Err(e) =
                        check_live(&ctl, RaftRpc::AppendEntries, &from, append_sender(&r))
                    {
                        return respond(reply, RpcResponse::Malformed(e)).await;
                    }
                    let r = ctl.raft().append_entries(r).await;
                    // Anything but a higher vote means the sender leads this node's term.
                    if matches!(&r, Ok(resp) if !matches!(resp, AppendEntriesResponse::HigherVote(_)))
                    {
                        ctl.leader_contact_ms
                            .store(ctl.uptime_ms(), Ordering::Relaxed);
                    }
                    RpcResponse::AppendEntries(r)
                }
                Ok(RpcRequest::Vote(r)) => {
                    match check_live(&ctl, RaftRpc::Vote, &from, vote_sender(&r)) {
                        Ok(()) => RpcResponse::Vote(ctl.raft().vote(r).await),
                        Err(e) => RpcResponse::Malformed(e),
                    }
                }
                Ok(RpcRequest::InstallSnapshot(chunk)) => {
                    match SnapshotRequest::try_from(chunk).and_then(|r| {
                        check_live(
                            &ctl,
                            RaftRpc::InstallSnapshot,
                            &from,
                            snapshot_sender(&r),
                        )
                        .map(|()| r)
                    }) {
                        Ok(r) => RpcResponse::InstallSnapshot(ctl.raft().install_snapshot(r).await),
                        Err(e) => RpcResponse::Malformed(e),
                    }
                }
                Ok(RpcRequest::Propose(cmd)) => {
                    forwarded(&ctl, admit, &from, cmd, Principal::Node).await
                }
                Ok(RpcRequest::ProposeAs { command, principal }) => {
                    forwarded(&ctl, admit, &from, command, principal).await
                }
                Ok(RpcRequest::Logs {
                    job,
                    generation,
                    worker,
                    offset,
                    principal,
                }) => RpcResponse::Logs(log_read(
                    &ctl,
                    &from,
                    (job, generation, worker, offset),
                    &principal,
                )),
                Ok(RpcRequest::KeyOffer { epoch, key }) => {
                    RpcResponse::KeyTaken(key_offer(&ctl, &from, epoch, &key.0))
                }
                Ok(RpcRequest::Alive) => RpcResponse::Alive,
                Err(e) => {
                    debug!(peer = %from, "malformed rpc: {e}");
                    RpcResponse::Malformed(e.to_string())
                }
            };
            respond(reply, resp).await;
        });
    }
}

/// Takes a key rotation's offer from `from` (see `domain::state::key_epoch`): refused from a
/// removed member, for an epoch the cluster has reached already, and on a node without a
/// cluster key; otherwise the key is pending in this node's ring until the switch.
fn key_offer(
    ctl: &ControlHandle,
    from: &libp2p::PeerId,
    epoch: u64,
    key: &str,
) -> Result<String, String> {
    let peer = from.to_string();
    ctl.read(|s| {
        check_not_removed(&peer, s).map_err(|e| e.to_string())?;
        let current = s.key_epoch();
        if epoch <= current {
            return Err(format!(
                "key offer for epoch {epoch}: the cluster's key is at epoch {current} already"
            ));
        }
        Ok(())
    })?;
    let ring = ctl
        .key_ring
        .as_ref()
        .ok_or("this member runs without a cluster key (--insecure)")?;
    let fingerprint = ring.offer(epoch, key).map_err(|e| e.to_string())?;
    info!(peer = %from, epoch, %fingerprint, "took a rotation's new cluster key (pending until the switch)");
    Ok(fingerprint)
}

async fn respond(reply: Reply, resp: RpcResponse) {
    let payload = wire::encode_json(&resp).unwrap_or_default();
    reply.send(payload).await;
}

#[cfg(test)]
mod tests;
