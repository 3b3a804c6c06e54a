//! The control plane on a node: openraft over the swarm's RPC protocol, the autopilot that
//! keeps the right members voting, the chief's loop that places jobs and fails attempts
//! whose workers died, and the write path (any node forwards to the chief).
//!
//! The chief is the Raft leader. Gossip proposes (who is alive), the quorum decides (what is
//! committed): a node never acts as chief because of its gossip view alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libp2p::PeerId;
use openraft::{
    error::{
        ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
        Unreachable,
    },
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
    ChangeMembers, Raft, ServerState,
};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{
    control::{
        state::{ControlCommand, ControlResponse, ControlState, Job, JobId, JobState},
        store::{self, node_id_of, NodeId, RaftNode, StateMachineStore, TypeConfig},
        voters::{self, Change, Health, VoterConfig},
    },
    jobs::placement::{self, Candidate, Request},
    membership::State,
    net::{InboundRpc, MemberView, NodeHandle},
    status::{FreshnessDoc, GenerationDoc, JobDoc, JobSummary, LogChunk, LogsDoc, NodeRef},
    wire,
    worker::Supervisor,
};

/// Raft heartbeat period, in milliseconds.
const HEARTBEAT_MS: u64 = 150;
/// Raft election timeout range, in milliseconds: a chief that dies is replaced within about
/// this (plus a heartbeat), and a loaded host does not start needless elections.
const ELECTION_MIN_MS: u64 = 700;
const ELECTION_MAX_MS: u64 = 1_400;
/// Period of the chief's loop (autopilot, placement, dead workers), in milliseconds.
const CHIEF_PERIOD_MS: u64 = 250;
/// How long a proposal may take, forwarding included, in milliseconds.
const PROPOSE_TIMEOUT_MS: u64 = 5_000;
/// Depth of the queue of worker reports (exits, metrics) waiting to be proposed.
const REPORT_QUEUE_DEPTH: usize = 1_024;
/// A leader that has not heard from a quorum for this long does not call itself chief (it
/// may be on the minority side of a partition), in milliseconds.
const QUORUM_STALE_MS: u64 = ELECTION_MAX_MS;
/// A follower or learner that has not accepted an AppendEntries (heartbeats included) from
/// the leader for this long does not name a chief (it may be on the minority side of a
/// partition; a learner never starts an election, so openraft keeps naming the old leader),
/// in milliseconds.
const LEADER_STALE_MS: u64 = ELECTION_MAX_MS;
/// [`ControlHandle::leader_contact_ms`] before the first AppendEntries is accepted.
const NEVER: u64 = u64::MAX;
/// Largest piece of a log returned by one read, in bytes.
const LOG_CHUNK_BYTES_MAX: u64 = 256 * 1024;

/// RPCs between nodes' control planes.
#[derive(Debug, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub enum RpcRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A write forwarded to the chief.
    Propose(ControlCommand),
    /// A piece of a rank's log kept on the node that ran it.
    Logs {
        job: JobId,
        generation: u32,
        rank: u32,
        offset: u64,
    },
}

/// Answers to [`RpcRequest`]s.
#[derive(Debug, Serialize, Deserialize)]
pub enum RpcResponse {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Propose(Result<ControlResponse, ProposeError>),
    Logs(LogChunk),
    /// The request could not be decoded.
    Malformed(String),
}

/// Why a write did not commit. Every variant but `Rejected` is worth retrying.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum ProposeError {
    /// No chief is known: an election is under way, or this side of a partition has no
    /// quorum. Nothing was committed.
    #[error("no chief: no quorum reachable (an election may be under way); nothing was committed, retry")]
    NoChief,
    /// The chief could not be reached or did not answer in time; the write may or may not
    /// have committed.
    #[error("chief unreachable: {0}; the write may or may not have committed, retry")]
    Unreachable(String),
    /// The command is not valid.
    #[error("rejected: {0}")]
    Rejected(String),
}

/// openraft's network: one client per target, over the node's RPC protocol.
#[derive(Clone)]
struct Network {
    node: NodeHandle,
}

struct Conn {
    node: NodeHandle,
    target: NodeId,
    peer: Option<PeerId>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Conn;

    async fn new_client(&mut self, target: NodeId, node: &RaftNode) -> Conn {
        Conn {
            node: self.node.clone(),
            target,
            peer: node.peer_id.parse().ok(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failure(String);

impl Conn {
    async fn call<E: std::error::Error>(
        &self,
        req: &RpcRequest,
        ttl: Duration,
    ) -> Result<RpcResponse, RPCError<NodeId, RaftNode, E>> {
        let peer = self.peer.ok_or_else(|| {
            RPCError::Unreachable(Unreachable::new(&Failure("bad peer id".into())))
        })?;
        let payload =
            wire::encode_json(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let bytes = tokio::time::timeout(ttl, self.node.rpc(peer, payload))
            .await
            .map_err(|_| {
                RPCError::Unreachable(Unreachable::new(&Failure(format!("no answer in {ttl:?}"))))
            })?
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        wire::decode_json(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

fn unexpected<E: std::error::Error>() -> RPCError<NodeId, RaftNode, E> {
    RPCError::Network(NetworkError::new(&Failure("unexpected answer".into())))
}

impl RaftNetwork<TypeConfig> for Conn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, RaftNode, RaftError<NodeId>>> {
        match self
            .call(&RpcRequest::AppendEntries(rpc), option.hard_ttl())
            .await?
        {
            RpcResponse::AppendEntries(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(unexpected()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, RaftNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(&RpcRequest::InstallSnapshot(rpc), option.hard_ttl())
            .await?
        {
            RpcResponse::InstallSnapshot(r) => {
                r.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            _ => Err(unexpected()),
        }
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

/// What the node's control plane is started with.
pub struct ControlConfig<'a> {
    /// This node's peer id and name.
    pub me: PeerId,
    pub name: String,
    /// `<data-dir>`: Raft keeps its files in `<data-dir>/raft`, workers their logs in
    /// `<data-dir>/jobs`.
    pub data_dir: &'a Path,
    /// Start a new cluster (a node started without `--join`) if this node has no Raft state.
    pub bootstrap: bool,
    /// Storage URL train workers checkpoint to (`--storage`).
    pub storage: String,
}

/// A cheap handle to the control plane.
#[derive(Clone)]
pub struct ControlHandle {
    raft: Raft<TypeConfig>,
    sm: StateMachineStore,
    node: NodeHandle,
    node_id: NodeId,
    me: String,
    jobs_dir: std::path::PathBuf,
    epoch: Instant,
    /// When (ms since `epoch`) this node last accepted an AppendEntries from a leader, or
    /// [`NEVER`]; written by [`serve_rpcs`].
    leader_contact_ms: Arc<AtomicU64>,
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Starts Raft and the control plane's loops.
pub async fn start(
    cfg: ControlConfig<'_>,
    node: NodeHandle,
    rpc_rx: mpsc::Receiver<InboundRpc>,
) -> Result<ControlHandle> {
    let raft_dir = cfg.data_dir.join("raft");
    let (log, sm) = store::open(&raft_dir)
        .with_context(|| format!("opening Raft state in {}", raft_dir.display()))?;
    let config = openraft::Config {
        cluster_name: "ringleader".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_MIN_MS,
        election_timeout_max: ELECTION_MAX_MS,
        ..Default::default()
    }
    .validate()?;
    let node_id = node_id_of(&cfg.me.to_string());
    let raft = Raft::new(
        node_id,
        Arc::new(config),
        Network { node: node.clone() },
        log,
        sm.clone(),
    )
    .await?;
    if cfg.bootstrap && !raft.is_initialized().await? {
        let me = RaftNode {
            peer_id: cfg.me.to_string(),
            name: cfg.name.clone(),
        };
        raft.initialize(BTreeMap::from([(node_id, me)])).await?;
        info!("bootstrapped a new cluster: this node is its first voter");
    }
    let handle = ControlHandle {
        raft,
        sm,
        node,
        node_id,
        me: cfg.me.to_string(),
        jobs_dir: cfg.data_dir.join("jobs"),
        epoch: Instant::now(),
        leader_contact_ms: Arc::new(AtomicU64::new(NEVER)),
    };
    tokio::spawn(serve_rpcs(handle.clone(), rpc_rx));
    tokio::spawn(chief_loop(handle.clone()));
    tokio::spawn(quiet_when_stale_loop(handle.clone()));
    let (reports_tx, reports_rx) = mpsc::channel(REPORT_QUEUE_DEPTH);
    tokio::spawn(report_loop(handle.clone(), reports_rx));
    let supervisor = Supervisor::new(
        cfg.me.to_string(),
        cfg.data_dir.join("jobs"),
        reports_tx,
        wall_ms,
    )
    .with_storage(cfg.storage.clone());
    tokio::spawn(supervise_loop(handle.clone(), supervisor));
    Ok(handle)
}

impl ControlHandle {
    /// The chief and the term, if this node knows a chief that is in touch with a quorum:
    /// a leader that a quorum acknowledged within [`QUORUM_STALE_MS`], or, on any other node,
    /// the leader it accepted an AppendEntries from within [`LEADER_STALE_MS`]. So the
    /// minority side of a partition names no chief.
    pub fn chief(&self) -> (Option<NodeRef>, u64) {
        let m = self.raft.metrics().borrow().clone();
        let stale = if m.state == ServerState::Leader {
            m.millis_since_quorum_ack
                .is_none_or(|ms| ms > QUORUM_STALE_MS)
        } else {
            let last = self.leader_contact_ms.load(Ordering::Relaxed);
            last == NEVER || self.uptime_ms().saturating_sub(last) > LEADER_STALE_MS
        };
        let chief = m.current_leader.filter(|_| !stale).and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| NodeRef {
                    id: n.peer_id.clone(),
                    name: n.name.clone(),
                })
        });
        (chief, m.current_term)
    }

    /// Peer ids of the current voters.
    pub fn voters(&self) -> BTreeSet<String> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| n.peer_id.clone()))
            .collect()
    }

    /// Reads this replica's state.
    pub fn read<T>(&self, f: impl FnOnce(&ControlState) -> T) -> T {
        self.sm.read(f)
    }

    /// How this replica's reads relate to the chief's: applied index and whether this node
    /// is the chief.
    pub fn freshness(&self) -> (u64, bool) {
        let m = self.raft.metrics().borrow().clone();
        (
            m.last_applied.map_or(0, |l| l.index),
            m.state == ServerState::Leader,
        )
    }

    /// Commits `cmd`, here if this node is the chief, else through the chief.
    pub async fn propose(&self, cmd: ControlCommand) -> Result<ControlResponse, ProposeError> {
        cmd.check()
            .map_err(|e| ProposeError::Rejected(e.to_string()))?;
        tokio::time::timeout(
            Duration::from_millis(PROPOSE_TIMEOUT_MS),
            self.propose_inner(cmd),
        )
        .await
        .unwrap_or_else(|_| {
            Err(ProposeError::Unreachable(format!(
                "no commit within {PROPOSE_TIMEOUT_MS} ms"
            )))
        })
    }

    async fn propose_inner(&self, cmd: ControlCommand) -> Result<ControlResponse, ProposeError> {
        // Fail fast where no chief is in touch with a quorum (a minority side): forwarding
        // to an old leader, or appending as one, would only wait for the timeout.
        if self.chief().0.is_none() {
            return Err(ProposeError::NoChief);
        }
        let m = self.raft.metrics().borrow().clone();
        let Some(leader) = m.current_leader else {
            return Err(ProposeError::NoChief);
        };
        if leader == self.node_id {
            return self.propose_local(cmd).await;
        }
        let peer = m
            .membership_config
            .membership()
            .get_node(&leader)
            .and_then(|n| n.peer_id.parse::<PeerId>().ok())
            .ok_or(ProposeError::NoChief)?;
        let payload = wire::encode_json(&RpcRequest::Propose(cmd))
            .map_err(|e| ProposeError::Rejected(e.to_string()))?;
        let bytes = self
            .node
            .rpc(peer, payload)
            .await
            .map_err(|e| ProposeError::Unreachable(e.to_string()))?;
        match wire::decode_json::<RpcResponse>(&bytes) {
            Ok(RpcResponse::Propose(r)) => r,
            Ok(_) => Err(ProposeError::Unreachable(
                "unexpected answer from the chief".into(),
            )),
            Err(e) => Err(ProposeError::Unreachable(e.to_string())),
        }
    }

    async fn propose_local(&self, cmd: ControlCommand) -> Result<ControlResponse, ProposeError> {
        if self.chief().0.is_none() {
            return Err(ProposeError::NoChief);
        }
        match self.raft.client_write(cmd).await {
            Ok(resp) => Ok(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(ProposeError::NoChief)
            }
            Err(e) => Err(ProposeError::Unreachable(e.to_string())),
        }
    }

    /// Job summaries for `status` and `jobs`.
    pub fn job_summaries(&self) -> Vec<JobSummary> {
        self.read(|s| {
            s.jobs
                .values()
                .map(|j| JobSummary {
                    id: j.id.to_string(),
                    name: j.spec.name.clone(),
                    kind: j.spec.kind.to_string(),
                    state: j.state.to_string(),
                })
                .collect()
        })
    }

    /// One job as the API shows it.
    pub fn job_doc(&self, id: JobId) -> Option<JobDoc> {
        let (applied_index, chief) = self.freshness();
        self.read(|s| s.job(id).map(|j| job_doc(j, applied_index, chief)))
    }

    /// The logs of a job's current generation, each rank read from `offsets[rank]` on.
    pub async fn logs(&self, id: JobId, offsets: &BTreeMap<u32, u64>) -> Option<LogsDoc> {
        let (state, generation, slots) = self.read(|s| {
            s.job(id)
                .map(|j| (j.state.to_string(), j.attempt, j.assignment.clone()))
        })?;
        let mut chunks = Vec::new();
        for slot in slots {
            let offset = offsets.get(&slot.rank).copied().unwrap_or(0);
            let chunk = if slot.member == self.me {
                read_log(&self.jobs_dir, id, generation, slot.rank, offset)
            } else {
                self.remote_log(&slot.member, id, generation, slot.rank, offset)
                    .await
            };
            chunks.push(chunk);
        }
        Some(LogsDoc {
            id: id.to_string(),
            state,
            chunks,
        })
    }

    async fn remote_log(
        &self,
        member: &str,
        job: JobId,
        generation: u32,
        rank: u32,
        offset: u64,
    ) -> LogChunk {
        let failed = |e: String| LogChunk {
            rank,
            generation,
            offset,
            text: String::new(),
            next_offset: offset,
            error: Some(e),
        };
        let Ok(peer) = member.parse::<PeerId>() else {
            return failed("bad peer id".into());
        };
        let req = RpcRequest::Logs {
            job,
            generation,
            rank,
            offset,
        };
        let payload = match wire::encode_json(&req) {
            Ok(p) => p,
            Err(e) => return failed(e.to_string()),
        };
        match self.node.rpc(peer, payload).await {
            Ok(bytes) => match wire::decode_json::<RpcResponse>(&bytes) {
                Ok(RpcResponse::Logs(chunk)) => chunk,
                Ok(_) => failed("unexpected answer".into()),
                Err(e) => failed(e.to_string()),
            },
            Err(e) => failed(e.to_string()),
        }
    }

    /// Stops Raft (node shutdown).
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }

    /// Milliseconds since this handle started (for logs).
    pub fn uptime_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

async fn serve_rpcs(ctl: ControlHandle, mut rx: mpsc::Receiver<InboundRpc>) {
    while let Some(rpc) = rx.recv().await {
        let ctl = ctl.clone();
        tokio::spawn(async move {
            let resp = match wire::decode_json::<RpcRequest>(&rpc.payload) {
                Ok(RpcRequest::AppendEntries(r)) => {
                    let r = ctl.raft.append_entries(r).await;
                    // Anything but a higher vote means the sender leads this node's term.
                    if matches!(&r, Ok(resp) if !matches!(resp, AppendEntriesResponse::HigherVote(_)))
                    {
                        ctl.leader_contact_ms
                            .store(ctl.uptime_ms(), Ordering::Relaxed);
                    }
                    RpcResponse::AppendEntries(r)
                }
                Ok(RpcRequest::Vote(r)) => RpcResponse::Vote(ctl.raft.vote(r).await),
                Ok(RpcRequest::InstallSnapshot(r)) => {
                    RpcResponse::InstallSnapshot(ctl.raft.install_snapshot(r).await)
                }
                Ok(RpcRequest::Propose(cmd)) => {
                    let r = match cmd.check() {
                        Err(e) => Err(ProposeError::Rejected(e.to_string())),
                        Ok(()) => ctl.propose_local(cmd).await,
                    };
                    RpcResponse::Propose(r)
                }
                Ok(RpcRequest::Logs {
                    job,
                    generation,
                    rank,
                    offset,
                }) => RpcResponse::Logs(read_log(&ctl.jobs_dir, job, generation, rank, offset)),
                Err(e) => {
                    debug!(peer = %rpc.from, "malformed rpc: {e}");
                    RpcResponse::Malformed(e.to_string())
                }
            };
            let payload = wire::encode_json(&resp).unwrap_or_default();
            ctl.node.respond(rpc.key, payload).await;
        });
    }
}

fn health(state: State) -> Health {
    match state {
        State::Alive => Health::Alive,
        State::Suspect => Health::Suspect,
        State::Dead => Health::Dead,
        State::Left => Health::Left,
    }
}

/// A leader out of touch with a quorum stops its heartbeats (openraft 0.9's leader never
/// steps down by itself), so the followers and learners on its side of a partition stop
/// naming it after [`LEADER_STALE_MS`], and its voters elect. Heartbeats resume when a
/// quorum answers again or the node is no longer leader.
async fn quiet_when_stale_loop(ctl: ControlHandle) {
    let mut tick = tokio::time::interval(Duration::from_millis(HEARTBEAT_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quiet = false;
    loop {
        tick.tick().await;
        let m = ctl.raft.metrics().borrow().clone();
        let stale = m.state == ServerState::Leader
            && m.millis_since_quorum_ack
                .is_none_or(|ms| ms > QUORUM_STALE_MS);
        if stale != quiet {
            quiet = stale;
            if quiet {
                warn!("no quorum heard from: stopping heartbeats until one answers");
            } else {
                info!("heartbeats resumed");
            }
            ctl.raft.runtime_config().heartbeat(!quiet);
        }
    }
}

/// The chief's work, every [`CHIEF_PERIOD_MS`] while this node leads: one voter change,
/// failing attempts whose workers are gone, placing pending jobs.
async fn chief_loop(ctl: ControlHandle) {
    let voter_config = VoterConfig::default();
    let mut tick = tokio::time::interval(Duration::from_millis(CHIEF_PERIOD_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let m = ctl.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader || ctl.chief().0.is_none() {
            continue;
        }
        let Ok((now_ms, members)) = ctl.node.members().await else {
            return;
        };
        if let Err(e) = autopilot(&ctl, &voter_config, now_ms, &members, &m).await {
            debug!("voter change not made: {e}");
        }
        fail_lost_attempts(&ctl, &members).await;
        place_pending(&ctl, &members).await;
    }
}

async fn autopilot(
    ctl: &ControlHandle,
    config: &VoterConfig,
    now_ms: u64,
    members: &[MemberView],
    m: &openraft::RaftMetrics<NodeId, RaftNode>,
) -> Result<()> {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let learners: BTreeSet<NodeId> = membership.learner_ids().collect();
    let mut view = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for member in members {
        let id = node_id_of(&member.id.to_string());
        view.insert(
            id,
            voters::MemberView {
                health: health(member.state),
                since_ms: member.state_since_ms,
            },
        );
        nodes.insert(
            id,
            RaftNode {
                peer_id: member.id.to_string(),
                name: member.meta.name.clone(),
            },
        );
    }
    let input = voters::Input {
        leader: &ctl.node_id,
        voters: &voters,
        learners: &learners,
        members: &view,
        now_ms,
    };
    let Some(change) = voters::next_change(&input, config) else {
        return Ok(());
    };
    info!(?change, "voter change");
    match change {
        Change::AddLearner(id) => {
            let node = nodes.get(&id).cloned().unwrap_or_default();
            ctl.raft.add_learner(id, node, false).await?;
        }
        Change::Promote(id) => {
            ctl.raft
                .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
                .await?;
        }
        Change::Demote(id) => {
            ctl.raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), true)
                .await?;
        }
        Change::Remove(id) => {
            if voters.contains(&id) {
                ctl.raft
                    .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                    .await?;
            } else {
                ctl.raft
                    .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                    .await?;
            }
        }
    }
    Ok(())
}

/// A running attempt with a worker on a member that gossip reports dead or left is failed
/// as a whole (torchrun's semantics: the survivors are stopped, and it is retried).
async fn fail_lost_attempts(ctl: &ControlHandle, members: &[MemberView]) {
    let gone: BTreeMap<String, String> = members
        .iter()
        .filter(|m| matches!(m.state, State::Dead | State::Left))
        .map(|m| (m.id.to_string(), m.state.as_str().to_string()))
        .collect();
    let lost: Vec<ControlCommand> = ctl.read(|s| {
        s.jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .filter_map(|j| {
                let slot = j.assignment.iter().find(|s| gone.contains_key(&s.member))?;
                Some(ControlCommand::AttemptFailed {
                    id: j.id,
                    attempt: j.attempt,
                    reason: format!(
                        "peer-lost: rank {} on {} is {}",
                        slot.rank, slot.name, gone[&slot.member]
                    ),
                    at_ms: wall_ms(),
                })
            })
            .collect()
    });
    for cmd in lost {
        if let Err(e) = ctl.propose(cmd).await {
            debug!("attempt failure not recorded: {e}");
        }
    }
}

async fn place_pending(ctl: &ControlHandle, members: &[MemberView]) {
    let (pending, used) = ctl.read(|s| {
        (
            s.pending()
                .map(|j| (j.id, j.attempt, j.spec.clone(), j.pending_reason.clone()))
                .collect::<Vec<_>>(),
            s.used_resources(),
        )
    });
    let mut candidates: Vec<Candidate> = members
        .iter()
        .map(|m| {
            let id = m.id.to_string();
            let (used_cpus, used_gpus) = used.get(&id).copied().unwrap_or((0, 0));
            Candidate {
                id,
                name: m.meta.name.clone(),
                alive: m.state == State::Alive,
                blacklisted: false,
                cpus: m.meta.cpus,
                gpus: m.meta.gpus.len() as u32,
                used_cpus,
                used_gpus,
            }
        })
        .collect();
    candidates.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
    for (id, attempt, spec, last_reason) in pending {
        let req = Request::from_spec(&spec);
        let cmd = match placement::place(&candidates, &req) {
            Ok(slots) => {
                // Later jobs in this round see these resources as taken.
                for slot in &slots {
                    if let Some(c) = candidates.iter_mut().find(|c| c.id == slot.member) {
                        c.used_cpus += req.cpus_per_worker;
                        c.used_gpus += req.gpus_per_worker;
                    }
                }
                ControlCommand::Place {
                    id,
                    attempt: attempt + 1,
                    slots,
                    secret: crate::control::state::new_ring_secret(),
                    at_ms: wall_ms(),
                }
            }
            Err(e) if last_reason.as_deref() == Some(e.reason.as_str()) => continue,
            Err(e) => ControlCommand::Unplaceable {
                id,
                reason: e.reason,
                at_ms: wall_ms(),
            },
        };
        if let Err(e) = ctl.propose(cmd).await {
            debug!(job = %id, "placement not recorded: {e}");
        }
    }
}

/// Proposes the workers' reports, retrying while there is no chief (reports are idempotent:
/// a duplicate or stale one is ignored by the state machine).
async fn report_loop(ctl: ControlHandle, mut rx: mpsc::Receiver<ControlCommand>) {
    while let Some(cmd) = rx.recv().await {
        let must_arrive = matches!(cmd, ControlCommand::WorkerExited { .. });
        for attempt in 0u32.. {
            match ctl.propose(cmd.clone()).await {
                Ok(_) | Err(ProposeError::Rejected(_)) => break,
                Err(e) if !must_arrive || attempt >= 60 => {
                    warn!("worker report dropped: {e}");
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
}

/// Keeps this node's worker processes in line with the replicated state.
async fn supervise_loop(ctl: ControlHandle, mut supervisor: Supervisor) {
    let mut applied = ctl.sm.subscribe();
    let mut tick = tokio::time::interval(Duration::from_millis(1_000));
    loop {
        let members = match ctl.node.members().await {
            Ok((_, m)) => m,
            Err(_) => {
                supervisor.stop_all();
                return;
            }
        };
        let hosts: BTreeMap<String, String> = members
            .iter()
            .filter_map(|m| {
                let host = m
                    .meta
                    .data_addr
                    .rsplit_once(':')
                    .map(|(h, _)| h.trim_matches(['[', ']']).to_string())?;
                Some((m.id.to_string(), host))
            })
            .collect();
        ctl.read(|s| supervisor.reconcile(s, &|id| hosts.get(id).cloned()));
        tokio::select! {
            r = applied.changed() => if r.is_err() { supervisor.stop_all(); return },
            _ = tick.tick() => {}
        }
    }
}

/// Reads up to [`LOG_CHUNK_BYTES_MAX`] of a local rank log from `offset`.
fn read_log(jobs_dir: &Path, job: JobId, generation: u32, rank: u32, offset: u64) -> LogChunk {
    use std::io::{Read, Seek, SeekFrom};
    let path = crate::worker::log_path(jobs_dir, job, generation, rank);
    let mut chunk = LogChunk {
        rank,
        generation,
        offset,
        text: String::new(),
        next_offset: offset,
        error: None,
    };
    let result = (|| -> std::io::Result<()> {
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = Vec::new();
        f.take(LOG_CHUNK_BYTES_MAX).read_to_end(&mut buf)?;
        chunk.next_offset = offset + buf.len() as u64;
        chunk.text = String::from_utf8_lossy(&buf).into_owned();
        Ok(())
    })();
    if let Err(e) = result {
        chunk.error = Some(format!("{}: {e}", path.display()));
    }
    chunk
}

/// The API's view of a job record.
pub fn job_doc(j: &Job, applied_index: u64, chief: bool) -> JobDoc {
    let metric = |name: &str| j.metrics.get(name).map(|m| m.value.max(0.0) as u64);
    let step = metric("step").or_else(|| j.metrics.values().filter_map(|m| m.step).max());
    let history = j
        .events
        .iter()
        .filter(|e| e.what == crate::control::state::EventKind::Placed)
        .map(|e| GenerationDoc {
            generation: e.attempt,
            reason: e.reason.clone(),
            at_ms: e.at_ms,
        })
        .collect();
    JobDoc {
        id: j.id.to_string(),
        name: j.spec.name.clone(),
        kind: j.spec.kind.to_string(),
        state: j.state.to_string(),
        generation: j.attempt,
        max_restarts: j.max_restarts,
        workers: j.spec.workers,
        ring: j.assignment.iter().map(|s| s.name.clone()).collect(),
        pending_reason: j.pending_reason.clone(),
        step,
        epoch: metric("epoch"),
        metrics: j
            .metrics
            .iter()
            .map(|(k, m)| (k.clone(), m.value))
            .collect(),
        history,
        events: j
            .events
            .iter()
            .filter_map(|e| serde_json::to_value(e).ok())
            .collect(),
        exits: j.exits.clone(),
        submitted_at_ms: j.submitted_at_ms,
        started_at_ms: j.started_at_ms,
        finished_at_ms: j.finished_at_ms,
        freshness: FreshnessDoc {
            applied_index,
            served_by: if chief { "chief" } else { "replica" }.into(),
        },
    }
}
