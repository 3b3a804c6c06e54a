//! openraft's network: Raft's own RPCs (append entries, vote, install snapshot) sent to a
//! peer over the swarm's request-response protocol as [`RpcRequest`]s, in the node's wire
//! codec. One client per target; an unreachable peer is reported to openraft, which retries.
//!
//! Learners hear fewer heartbeats than voters. openraft sends every member one each
//! heartbeat period, which voters need (a voter that misses them for an election timeout
//! starts an election), but a learner never elects: a heartbeat that would tell it nothing
//! new (the vote, last entry and commit it knew after the last call it accepted) is answered
//! here, unsent, while that one is younger than [`LEARNER_HEARTBEAT_MS`]. Anything new (an
//! entry, a commit, a new term or chief) is sent at once. With every member a learner this
//! was most of an idle node's Raft traffic and most of the chief's.
//!
//! Learners hear of entries once they are committed. An AppendEntries with entries for a
//! learner waits (at most [`LEARNER_COMMIT_WAIT_MS`]) until this node, still leading with the
//! same vote, has applied its last entry, and then carries that entry as the commit: the
//! learner appends and applies in one call, and the heartbeat openraft sends after the commit
//! says nothing new to it. Otherwise a learner took each entry in two calls (the entry, then
//! its commit), the first while the voters' own appends were under way: on a host shared by
//! 128 nodes, the work that made submits slow.
//!
//! Learners take entries at a moment of their own. Such an AppendEntries goes out no sooner
//! than [`learner_append_delay`] after openraft began it (40–119 ms, by the learner's id),
//! and entries committed meanwhile wait for the next one: a learner takes a burst of writes
//! in a few calls of up to [`APPEND_ENTRIES_MAX`] entries, and the learners
//! do not all wake at the moment a write commits, when the chief answers its client. A full
//! batch goes at once (the learner is behind, and catches up as fast as it can). A call
//! whose entries do not fit one frame carries the first half of them, again until they fit,
//! and is answered as a partial success (openraft sends the rest next).

use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use libp2p::PeerId;
use openraft::{
    error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable},
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
    LogId, Raft, RaftMetrics, ServerState, Vote,
};

use crate::{
    cluster::{net::NodeHandle, wire},
    protocol::{RpcRequest, RpcResponse},
    reach::{self, Reach},
    store::{NodeId, RaftNode, StateMachineStore, TypeConfig},
};

/// Longest time a learner goes without a heartbeat sent to it, in milliseconds: every third
/// heartbeat period. Well under [`super::handle::LEADER_STALE_MS`], after which a learner
/// stops naming the chief it has not heard from.
pub(crate) const LEARNER_HEARTBEAT_MS: u64 = 700;

/// Longest time an AppendEntries with entries to a learner waits for this (the leading)
/// node to apply its last entry, so that it carries their commit and the learner applies
/// them at once, in milliseconds.
pub(crate) const LEARNER_COMMIT_WAIT_MS: u64 = 100;

/// Most entries in one AppendEntries (openraft's `max_payload_entries`): a learner takes a
/// burst of writes in a few calls. A spec may be 256 KiB (more as JSON), so a batch need not
/// fit one 4 MiB frame: then its first half goes, again until it fits ([`encode_append`]).
pub(crate) const APPEND_ENTRIES_MAX: u64 = 64;

/// Shortest wait of an AppendEntries with entries to a learner, in milliseconds (see
/// [`learner_append_delay`]).
pub(crate) const LEARNER_APPEND_DELAY_MIN_MS: u64 = 40;

/// Over how many milliseconds beyond [`LEARNER_APPEND_DELAY_MIN_MS`] the learners' waits are
/// spread. The whole wait stays well under the heartbeat period, openraft's limit on a call.
pub(crate) const LEARNER_APPEND_SPREAD_MS: u64 = 80;

/// How long after it began an AppendEntries with entries to learner `target` goes out: long
/// enough for the chief to answer the write that committed them (which would otherwise
/// share the cores with every learner at once, on a host of many nodes), spread by the
/// learner's id so that the learners come one after another.
pub(crate) fn learner_append_delay(target: NodeId) -> Duration {
    Duration::from_millis(LEARNER_APPEND_DELAY_MIN_MS + target % LEARNER_APPEND_SPREAD_MS)
}

/// When an AppendEntries of `entries` entries to learner `target`, begun at `t0`, goes out:
/// [`learner_append_delay`] after `t0`, or (`None`) at once for a full batch, which means
/// the learner is behind and takes the rest as fast as it can.
fn learner_due(t0: Instant, target: NodeId, entries: usize) -> Option<Instant> {
    (entries < APPEND_ENTRIES_MAX as usize).then(|| t0 + learner_append_delay(target))
}

/// This node's Raft, once it runs: the network asks it which targets vote.
type LiveRaft = Arc<OnceLock<Arc<RwLock<Raft<TypeConfig>>>>>;

/// openraft's network: one client per target, over the node's RPC protocol.
#[derive(Clone)]
pub(super) struct Network {
    node: NodeHandle,
    /// This node's last applied index (`StateMachineStore::subscribe`).
    applied: tokio::sync::watch::Receiver<u64>,
    raft: LiveRaft,
    /// Whether replication reaches each target, shared by their connections.
    reach: Arc<Mutex<Reach>>,
}

impl Network {
    /// The network of a Raft on `sm`; [`Network::runs`] then names the Raft it serves.
    pub(super) fn new(node: NodeHandle, sm: &StateMachineStore) -> Self {
        Network {
            node,
            applied: sm.subscribe(),
            raft: LiveRaft::default(),
            reach: Arc::default(),
        }
    }

    /// Names this node's Raft (the lock [`super::ControlHandle`] holds it in), once it runs.
    pub(super) fn runs(&self, raft: Arc<RwLock<Raft<TypeConfig>>>) {
        let _ = self.raft.set(raft);
    }
}

/// What a heartbeat tells a follower: the leader's vote, its previous log id and commit.
type Beat = (Vote<NodeId>, Option<LogId<NodeId>>, Option<LogId<NodeId>>);

pub(super) struct Conn {
    node: NodeHandle,
    applied: tokio::sync::watch::Receiver<u64>,
    target: NodeId,
    peer: Option<PeerId>,
    raft: LiveRaft,
    /// What the target knew after the last call it accepted (the vote, its last entry, the
    /// commit), and when that call was sent.
    accepted: Option<(Beat, Instant)>,
    /// Every target's reach (shared by the connections), and this target's peer id.
    reach: Arc<Mutex<Reach>>,
    peer_name: String,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: NodeId, node: &RaftNode) -> Conn {
        Conn {
            node: self.node.clone(),
            applied: self.applied.clone(),
            target,
            peer: node.peer_id.parse().ok(),
            raft: self.raft.clone(),
            accepted: None,
            reach: self.reach.clone(),
            peer_name: node.peer_id.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failure(String);

impl Conn {
    /// Tells the target's [`Reach`] how a replication call went, and logs a change.
    fn note_reach<E: std::fmt::Display>(&self, outcome: Result<(), &E>) {
        let change = self
            .reach
            .lock()
            .map(|mut r| {
                r.on_call(
                    self.target,
                    Instant::now(),
                    outcome.map_err(|e| e.to_string()),
                )
            })
            .ok()
            .flatten();
        if let Some(change) = change {
            reach::log(&self.peer_name, &change);
        }
    }

    /// This node's Raft metrics, once its Raft runs.
    fn metrics(&self) -> Option<tokio::sync::watch::Receiver<RaftMetrics<NodeId, RaftNode>>> {
        let live = self.raft.get()?;
        let raft = live.read().expect("raft lock").clone();
        Some(raft.metrics())
    }

    /// Whether the target is a learner in this (the leading) node's membership; `false`
    /// while unknown.
    fn to_learner(&self) -> bool {
        self.metrics().is_some_and(|metrics| {
            let learner = metrics
                .borrow()
                .membership_config
                .membership()
                .learner_ids()
                .any(|id| id == self.target);
            learner
        })
    }

    /// Whether this node is the leader, with `vote`.
    fn leads_with(&self, vote: &Vote<NodeId>) -> bool {
        self.metrics().is_some_and(|metrics| {
            let m = metrics.borrow();
            m.state == ServerState::Leader && m.vote == *vote
        })
    }

    async fn call<E: std::error::Error>(
        &self,
        req: &RpcRequest,
        ttl: Duration,
    ) -> Result<RpcResponse, RPCError<NodeId, RaftNode, E>> {
        let payload =
            wire::encode_json(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        self.call_encoded(payload, ttl).await
    }

    async fn call_encoded<E: std::error::Error>(
        &self,
        payload: Vec<u8>,
        ttl: Duration,
    ) -> Result<RpcResponse, RPCError<NodeId, RaftNode, E>> {
        let peer = self.peer.ok_or_else(|| {
            RPCError::Unreachable(Unreachable::new(&Failure("bad peer id".into())))
        })?;
        let bytes = tokio::time::timeout(ttl, self.node.rpc(peer, payload))
            .await
            .map_err(|_| {
                RPCError::Unreachable(Unreachable::new(&Failure(format!("no answer in {ttl:?}"))))
            })?
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        wire::decode_json(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

/// An AppendEntries encoded for the wire ([`encode_append`]).
struct EncodedAppend {
    bytes: Vec<u8>,
    /// The last entry it carries.
    last: Option<LogId<NodeId>>,
    /// Whether some of the batch's entries were left out.
    cut: bool,
}

/// An AppendEntries encoded for the wire: the first of `rpc`'s entries that fit one frame
/// (all, or half, or a quarter…: at least one; an entry alone over the limit is the codec's
/// error).
fn encode_append(rpc: AppendEntriesRequest<TypeConfig>) -> Result<EncodedAppend, wire::WireError> {
    let mut req = RpcRequest::AppendEntries(rpc);
    let mut cut = false;
    loop {
        let encoded = wire::encode_json(&req);
        let RpcRequest::AppendEntries(rpc) = &mut req else {
            unreachable!("built as an AppendEntries above")
        };
        match encoded {
            Err(wire::WireError::TooLarge { .. }) if rpc.entries.len() > 1 => {
                rpc.entries.truncate(rpc.entries.len() / 2);
                cut = true;
            }
            other => {
                return other.map(|bytes| EncodedAppend {
                    bytes,
                    last: rpc.entries.last().map(|e| e.log_id),
                    cut,
                })
            }
        }
    }
}

/// Whether the AppendEntries about to go out at `now` may be answered unsent: a heartbeat
/// (`beat`: entries empty) that tells the target what it knew after the last call it
/// accepted, sent to it less than [`LEARNER_HEARTBEAT_MS`] ago, and the target a learner
/// (asked last: it reads the metrics).
fn unsent(
    beat: Option<&Beat>,
    accepted: Option<&(Beat, Instant)>,
    now: Instant,
    to_learner: impl FnOnce() -> bool,
) -> bool {
    match (beat, accepted) {
        (Some(beat), Some((last, sent))) => {
            beat == last
                && now.duration_since(*sent) < Duration::from_millis(LEARNER_HEARTBEAT_MS)
                && to_learner()
        }
        _ => false,
    }
}

fn unexpected<E: std::error::Error>() -> RPCError<NodeId, RaftNode, E> {
    RPCError::Network(NetworkError::new(&Failure("unexpected answer".into())))
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        let beat = rpc
            .entries
            .is_empty()
            .then_some((rpc.vote, rpc.prev_log_id, rpc.leader_commit));
        let t0 = Instant::now();
        if unsent(beat.as_ref(), self.accepted.as_ref(), t0, || {
            self.to_learner()
        }) {
            return Ok(AppendEntriesResponse::Success);
        }
        let last = rpc.entries.last().map(|e| e.log_id);
        if let Some(last) = last {
            if self.to_learner() {
                if rpc.leader_commit.is_none_or(|c| c.index < last.index) {
                    let mut applied = self.applied.clone();
                    let wait = Duration::from_millis(LEARNER_COMMIT_WAIT_MS);
                    let done = applied.wait_for(|&i| i >= last.index);
                    // Applied here means committed only while this node still leads with the
                    // vote it sent these entries under (votes only grow, and a leader's log
                    // only grows within its term).
                    if matches!(tokio::time::timeout(wait, done).await, Ok(Ok(_)))
                        && self.leads_with(&rpc.vote)
                    {
                        rpc.leader_commit = Some(last);
                    }
                }
                if let Some(due) = learner_due(t0, self.target, rpc.entries.len()) {
                    tokio::time::sleep_until(due.into()).await;
                }
            }
        }
        // A target commits at most what it holds (openraft's follower takes the lesser of
        // the two), so a cut batch may keep the commit of the whole one.
        let (vote, prev_log_id, leader_commit) = (rpc.vote, rpc.prev_log_id, rpc.leader_commit);
        let EncodedAppend {
            bytes: payload,
            last: sent_last,
            cut,
        } = encode_append(rpc).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let after = (vote, sent_last.or(prev_log_id), leader_commit);
        let sent = Instant::now();
        let ttl = option.hard_ttl().saturating_sub(sent - t0);
        let answer = match self.call_encoded(payload, ttl).await {
            Ok(RpcResponse::AppendEntries(r)) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(unexpected()),
            Err(e) => Err(e),
        };
        let answer = match answer {
            Ok(AppendEntriesResponse::Success) if cut => {
                Ok(AppendEntriesResponse::PartialSuccess(sent_last))
            }
            other => other,
        };
        self.accepted = match &answer {
            Ok(AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_)) => {
                Some((after, sent))
            }
            _ => None,
        };
        self.note_reach(answer.as_ref().map(|_| ()));
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, RaftNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let answer = match self
            .call(&RpcRequest::InstallSnapshot(rpc.into()), option.hard_ttl())
            .await
        {
            Ok(RpcResponse::InstallSnapshot(r)) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(unexpected()),
            Err(e) => Err(e),
        };
        self.note_reach(answer.as_ref().map(|_| ()));
        answer
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        match self.call(&RpcRequest::Vote(rpc), option.hard_ttl()).await? {
            RpcResponse::Vote(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(unexpected()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn beat(term: u64, prev: u64, commit: u64) -> Beat {
        let id = |i| Some(LogId::new(CommittedLeaderId::new(term, 1), i));
        (Vote::new_committed(term, 1), id(prev), id(commit))
    }

    /// An entry of about `bytes` bytes on the wire.
    fn entry(index: u64, bytes: usize) -> openraft::Entry<TypeConfig> {
        use crate::domain::state::{ops, ControlCommand, Op};
        openraft::Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(ControlCommand {
                op: Op::Unplaceable(ops::Unplaceable {
                    id: crate::domain::id::JobId::from_log_index(index),
                    reason: "x".repeat(bytes),
                    quiet: false,
                }),
                at_ms: index,
            }),
        }
    }

    fn append(entries: Vec<openraft::Entry<TypeConfig>>) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: entries.last().map(|e| e.log_id),
            entries,
        }
    }

    /// A batch over the frame limit goes out as its first half, quarter…, down to one entry
    /// (then the codec's error); one within it goes out whole, and decodes to what was sent.
    #[test]
    fn a_batch_over_the_frame_is_cut_to_its_first_entries_that_fit() {
        let mb = 1 << 20;
        let cut = encode_append(append((1..=8).map(|i| entry(i, mb)).collect())).unwrap();
        assert!(cut.cut);
        assert_eq!(cut.last.map(|l| l.index), Some(2));
        assert!(cut.bytes.len() <= wire::FRAME_BYTES_MAX);
        let RpcRequest::AppendEntries(sent) = wire::decode_json(&cut.bytes).unwrap() else {
            panic!("an AppendEntries");
        };
        assert_eq!(sent.entries.len(), 2);
        assert_eq!(sent.leader_commit.map(|c| c.index), Some(8));

        let whole = encode_append(append((1..=64).map(|i| entry(i, 100)).collect())).unwrap();
        assert!(!whole.cut);
        assert_eq!(whole.last.map(|l| l.index), Some(64));
        let none = encode_append(append(Vec::new())).unwrap();
        assert_eq!((none.last, none.cut), (None, false));

        let huge = encode_append(append(vec![entry(1, 5 * mb), entry(2, 10)]));
        assert!(matches!(huge, Err(wire::WireError::TooLarge { .. })));
    }

    /// Learners' waits lie in their window, spread over it by id.
    #[test]
    fn learners_wait_their_own_time_within_the_window() {
        let waits: std::collections::BTreeSet<u128> = (0..1000u64)
            .map(|id| learner_append_delay(id.wrapping_mul(0x9e37_79b9_7f4a_7c15)).as_millis())
            .collect();
        let lo = LEARNER_APPEND_DELAY_MIN_MS as u128;
        let hi = lo + LEARNER_APPEND_SPREAD_MS as u128;
        assert!(waits.iter().all(|w| (lo..hi).contains(w)), "{waits:?}");
        assert!(
            waits.len() > LEARNER_APPEND_SPREAD_MS as usize / 2,
            "{waits:?}"
        );
    }

    #[test]
    fn a_learner_skips_only_heartbeats_that_say_nothing_new() {
        let t0 = Instant::now();
        let soon = t0 + Duration::from_millis(LEARNER_HEARTBEAT_MS / 2);
        let late = t0 + Duration::from_millis(LEARNER_HEARTBEAT_MS);
        let last = (beat(3, 10, 10), t0);
        let same = beat(3, 10, 10);
        assert!(unsent(Some(&same), Some(&last), soon, || true));
        // A voter always hears it: it would start an election.
        assert!(!unsent(Some(&same), Some(&last), soon, || false));
        // Once the last one sent is old enough, it goes out.
        assert!(!unsent(Some(&same), Some(&last), late, || true));
        // A new commit, a new entry matched, a new term: sent at once.
        for new in [beat(3, 10, 11), beat(3, 11, 10), beat(4, 10, 10)] {
            assert!(!unsent(Some(&new), Some(&last), soon, || true), "{new:?}");
        }
        // Entries (no beat), or nothing accepted yet: sent.
        assert!(!unsent(None, Some(&last), soon, || true));
        assert!(!unsent(Some(&same), None, soon, || true));
    }
}
