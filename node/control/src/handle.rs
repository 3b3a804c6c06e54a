//! The control handle: this node's Raft (openraft over the swarm, see `network` and `rpc`),
//! the write path (any node forwards to the chief), reads of the replicated state, and who
//! is chief.
//!
//! The chief is the Raft leader. Gossip proposes (who is alive), the quorum decides (what is
//! committed): a node never acts as chief because of its gossip view alone.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, RwLock,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use libp2p::PeerId;
use openraft::{
    error::{ClientWriteError, RaftError},
    ChangeMembers, Raft, ServerState,
};
use tracing::{info, warn};

use crate::{
    cluster::{
        identity::peer_id_text,
        membership::State,
        meta::NodeRef,
        net::{MemberView, NodeHandle},
        wire,
    },
    domain::state::{
        tokens::Principal, ControlCommand, ControlResponse, ControlState, EventKind, JobId,
        JobState, Slot,
    },
    logs::{read_log, LogChunk},
    network::Network,
    protocol::{ProposeError, RpcRequest, RpcResponse},
    store::{self, node_id_of, NodeId, RaftNode, StateMachineStore, TypeConfig},
    voters::{self, Change, Health, VoterConfig},
};

/// A job's logs, as [`ControlHandle::logs`] read them.
#[derive(Debug, Clone, PartialEq)]
pub struct JobLogs {
    /// The job's state.
    pub state: JobState,
    /// The generation each of the job's runs was placed in, oldest first, as far as its
    /// events go back ([`crate::domain::state::EVENTS_PER_JOB_MAX`]).
    pub runs: Vec<u32>,
    /// One chunk per rank of the run read.
    pub chunks: Vec<LogChunk>,
}

/// Why [`ControlHandle::logs`] read nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogsError {
    /// There is no such job.
    #[error("no such job")]
    NoJob,
    /// The job has no run placed in that generation (or its event was dropped).
    #[error("no run of this job was placed in generation {generation}")]
    NoRun {
        /// The generation asked for.
        generation: u32,
    },
}

/// Raft heartbeat period, in milliseconds: the chief sends one to every member (voters and
/// learners) this often, which is most of an idle node's traffic (issue 27: 150 ms cost an
/// idle follower about a tenth of its CPU more). Under [`ELECTION_MIN_MS`] / 2.5, so that a
/// follower misses two in a row before it starts an election.
const HEARTBEAT_MS: u64 = 250;
/// Raft election timeout range, in milliseconds: a chief that dies is replaced within about
/// this (plus a heartbeat), and a loaded host does not start needless elections.
const ELECTION_MIN_MS: u64 = 700;
pub const ELECTION_MAX_MS: u64 = 1_400;
/// How long one snapshot chunk may take to send, and the last one to install (the whole
/// state decoded and applied), in milliseconds. openraft's default, 200 ms, is less than a
/// 1 MiB chunk takes on a slow link or a busy host, and a late joiner then never catches up:
/// every chunk times out and is sent again.
const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 10_000;
/// How long a proposal may take, forwarding included, in milliseconds.
const PROPOSE_TIMEOUT_MS: u64 = 5_000;
/// A leader that has not heard from a quorum for this long does not call itself chief (it
/// may be on the minority side of a partition), in milliseconds.
pub const QUORUM_STALE_MS: u64 = ELECTION_MAX_MS;
/// A follower or learner that has not accepted an AppendEntries (heartbeats included) from
/// the leader for this long does not name a chief (it may be on the minority side of a
/// partition; a learner never starts an election, so openraft keeps naming the old leader),
/// in milliseconds.
pub const LEADER_STALE_MS: u64 = ELECTION_MAX_MS;
/// How long [`ControlHandle::shutdown`] waits for the control plane's tasks to end, in
/// milliseconds (each ends at its next await).
const CONTROL_TASKS_STOP_MS: u64 = 1_000;
/// [`ControlHandle::leader_contact_ms`] before the first AppendEntries is accepted.
const NEVER: u64 = u64::MAX;

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
    /// Build a snapshot (and purge the log before it) every this many applied entries.
    pub snapshot_every: u64,
    /// The node's cluster key ring, which a rotation's offer fills (`None`: `--insecure`).
    pub key_ring: Option<crate::cluster::key_ring::KeyRing>,
    /// Each user's limits, checked again on a forwarded submit (`rpc`; see
    /// `domain::state::user_limits`).
    pub user_limits: crate::domain::state::user_limits::UserLimits,
}

/// Entries between snapshots unless `--raft-snapshot-every` says otherwise.
pub const SNAPSHOT_EVERY_DEFAULT: u64 = 5_000;
// A learner's call waits its moment (`network`) and makes its round trip within openraft's
// limit on it, the heartbeat period.
const _: () = assert!(
    super::network::LEARNER_APPEND_DELAY_MIN_MS + super::network::LEARNER_APPEND_SPREAD_MS
        <= HEARTBEAT_MS / 2
);

/// A cheap handle to the control plane.
#[derive(Clone)]
pub struct ControlHandle {
    /// This node's Raft; replaced when it restarts after a storage failure
    /// ([`super::recovery`]). Read it with [`ControlHandle::raft`].
    pub(super) live: Arc<RwLock<Raft<TypeConfig>>>,
    /// Why this node's Raft is stopped (its log could not be written), until it restarts.
    pub(super) fault: Arc<Mutex<Option<String>>>,
    pub(super) sm: StateMachineStore,
    /// `<data-dir>/raft` and the Raft configuration, to restart Raft on the same files.
    pub(super) raft_dir: std::path::PathBuf,
    pub(super) config: Arc<openraft::Config>,
    pub(super) node: NodeHandle,
    pub(super) node_id: NodeId,
    me: String,
    pub(super) jobs_dir: std::path::PathBuf,
    /// Each user's limits, for a forwarded submit.
    pub(super) user_limits: crate::domain::state::user_limits::UserLimits,
    epoch: Instant,
    /// When (ms since `epoch`) this node last accepted an AppendEntries from a leader, or
    /// [`NEVER`]; written by the RPC server.
    pub(super) leader_contact_ms: Arc<AtomicU64>,
    /// The control plane's tasks (the heartbeat guard, Raft's restart after storage
    /// failures, the RPC server and each RPC it answers), stopped by [`Self::shutdown`].
    pub(super) tasks: crate::tasks::Tasks,
    /// The node's cluster key ring (`None`: `--insecure`): the RPC server puts a rotation's
    /// offered key in it.
    pub key_ring: Option<crate::cluster::key_ring::KeyRing>,
}

/// Milliseconds since the Unix epoch: the clock stamped on proposals.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Starts Raft and the heartbeat guard (see [`super::start`], which also serves the RPCs and
/// restarts Raft after storage failures).
pub async fn open(cfg: ControlConfig<'_>, node: NodeHandle) -> Result<ControlHandle> {
    let raft_dir = cfg.data_dir.join("raft");
    // Reading the log and the snapshot is file I/O: off the async workers.
    let dir = raft_dir.clone();
    let (log, sm) = tokio::task::spawn_blocking(move || store::open(&dir))
        .await
        .context("the Raft state's reader panicked")?
        .with_context(|| format!("opening Raft state in {}", raft_dir.display()))?;
    let config = openraft::Config {
        cluster_name: "ringleader".into(),
        heartbeat_interval: HEARTBEAT_MS,
        election_timeout_min: ELECTION_MIN_MS,
        election_timeout_max: ELECTION_MAX_MS,
        max_payload_entries: super::network::APPEND_ENTRIES_MAX,
        snapshot_max_chunk_size: super::protocol::SNAPSHOT_CHUNK_BYTES,
        install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT_MS,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
        max_in_snapshot_log_to_keep: cfg.snapshot_every / 5,
        ..Default::default()
    }
    .validate()?;
    let config = Arc::new(config);
    let node_id = node_id_of(&cfg.me.to_string());
    let network = Network::new(node.clone(), &sm);
    let raft = Raft::new(node_id, config.clone(), network.clone(), log, sm.clone()).await?;
    if cfg.bootstrap && !raft.is_initialized().await? {
        let me = RaftNode {
            peer_id: cfg.me.to_string(),
            name: cfg.name.clone(),
        };
        raft.initialize(BTreeMap::from([(node_id, me)])).await?;
        info!("bootstrapped a new cluster: this node is its first voter");
    }
    let live = Arc::new(RwLock::new(raft));
    network.runs(live.clone());
    let handle = ControlHandle {
        live,
        fault: Arc::new(Mutex::new(None)),
        sm,
        raft_dir,
        config,
        node,
        node_id,
        me: cfg.me.to_string(),
        jobs_dir: cfg.data_dir.join("jobs"),
        user_limits: cfg.user_limits,
        epoch: Instant::now(),
        leader_contact_ms: Arc::new(AtomicU64::new(NEVER)),
        tasks: crate::tasks::Tasks::new("control"),
        key_ring: cfg.key_ring,
    };
    handle.tasks.spawn(quiet_when_stale_loop(handle.clone()));
    Ok(handle)
}

impl ControlHandle {
    /// This node's Raft as it is now (a cheap clone).
    pub(super) fn raft(&self) -> Raft<TypeConfig> {
        self.live.read().expect("raft lock").clone()
    }

    /// Puts `raft` in place of the stopped one.
    pub(super) fn replace_raft(&self, raft: Raft<TypeConfig>) {
        *self.live.write().expect("raft lock") = raft;
    }

    /// Why this node's Raft is stopped, while it is (its log or snapshot could not be
    /// written: a full or failing disk). It restarts by itself once writes succeed again.
    pub fn fault(&self) -> Option<String> {
        self.fault.lock().expect("fault lock").clone()
    }

    /// The chief and the term, if this node knows a chief that is in touch with a quorum:
    /// a leader that a quorum acknowledged within [`QUORUM_STALE_MS`], or, on any other node,
    /// the leader it accepted an AppendEntries from within [`LEADER_STALE_MS`]. So the
    /// minority side of a partition names no chief.
    pub fn chief(&self) -> (Option<NodeRef>, u64) {
        let m = self.raft().metrics().borrow().clone();
        if self.fault().is_some() {
            return (None, m.current_term);
        }
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

    /// This replica's last applied log index and its last log index (`None` before any
    /// entry): a node restarted from its own log has not caught up before the first reaches
    /// what the second was.
    pub fn log_progress(&self) -> (Option<u64>, Option<u64>) {
        let m = self.raft().metrics().borrow().clone();
        (m.last_applied.map(|l| l.index), m.last_log_index)
    }

    /// On the chief: waits (at most `bound`) until its state machine applied every entry it
    /// committed, after checking with a quorum that it is still the chief. Elsewhere, or past
    /// `bound`, returns at once or at the bound: the caller judges with what it has.
    pub async fn apply_committed(&self, bound: Duration) {
        let _ = tokio::time::timeout(bound, self.raft().ensure_linearizable()).await;
    }

    /// Waits (at most `bound`) until this replica applied the entry at `index`: a job the
    /// chief committed (its id is its submit's index) is then known here. Returns at the
    /// bound either way: the caller judges with what it has.
    pub async fn applied_up_to(&self, index: u64, bound: Duration) {
        let _ = self
            .raft()
            .wait(Some(bound))
            .applied_index_at_least(Some(index), "the entry a request names")
            .await;
    }

    /// Peer ids of the current voters.
    pub fn voters(&self) -> BTreeSet<String> {
        let m = self.raft().metrics().borrow().clone();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| n.peer_id.clone()))
            .collect()
    }

    /// The log index of the Raft membership this replica goes by (`None` before any): it
    /// changes exactly when the voters or learners do.
    pub fn membership_index(&self) -> Option<u64> {
        let raft = self.raft();
        let metrics = raft.metrics();
        let m = metrics.borrow();
        m.membership_config.log_id().map(|l| l.index)
    }

    /// Members in the Raft membership this replica knows (voters and learners).
    pub fn raft_members(&self) -> usize {
        let raft = self.raft();
        let metrics = raft.metrics();
        let m = metrics.borrow();
        m.membership_config.membership().nodes().count()
    }

    /// Reads this replica's state.
    pub fn read<T>(&self, f: impl FnOnce(&ControlState) -> T) -> T {
        self.sm.read(f)
    }

    /// How this replica's reads relate to the chief's: applied index and whether this node
    /// is the chief.
    pub fn freshness(&self) -> (u64, bool) {
        let m = self.raft().metrics().borrow().clone();
        (
            m.last_applied.map_or(0, |l| l.index),
            m.state == ServerState::Leader,
        )
    }

    /// Commits `cmd`, here if this node is the chief, else through the chief; forwarded with
    /// the [`Principal::current`] of the API request this task serves, if any.
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
        if let Some(fault) = self.fault() {
            return Err(ProposeError::Stopped(fault));
        }
        // Fail fast where no chief is in touch with a quorum (a minority side): forwarding
        // to an old leader, or appending as one, would only wait for the timeout.
        if self.chief().0.is_none() {
            return Err(ProposeError::NoChief);
        }
        let m = self.raft().metrics().borrow().clone();
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
        // A user's write carries who the API checked the caller to be (the chief refuses a
        // token revoked meanwhile); a node's own report keeps the older form.
        let req = match Principal::current() {
            Principal::Node => RpcRequest::Propose(cmd),
            principal => RpcRequest::ProposeAs {
                command: cmd,
                principal,
            },
        };
        let payload = wire::encode_json(&req).map_err(|e| ProposeError::Rejected(e.to_string()))?;
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

    /// Commits `cmds` in their order, all in flight at once: on the chief each is appended
    /// behind the one before without waiting for that one's commit, so the batch costs about
    /// one commit round trip instead of one per command (the chief's pass: the trials of a
    /// search each name the next trial id, so their order is the log's). Elsewhere, or when
    /// this node is not the leader, one after the other through [`ControlHandle::propose`].
    /// One result per command, in order.
    pub async fn propose_in_order(
        &self,
        cmds: Vec<ControlCommand>,
    ) -> Vec<Result<ControlResponse, ProposeError>> {
        let raft = self.raft();
        let leads = raft.metrics().borrow().current_leader == Some(self.node_id);
        if !leads || self.fault().is_some() || self.chief().0.is_none() {
            let mut out = Vec::with_capacity(cmds.len());
            for cmd in cmds {
                out.push(self.propose(cmd).await);
            }
            return out;
        }
        // Each send reaches Raft's core before the next is made: the log keeps this order.
        let mut sent = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            if let Err(e) = cmd.check() {
                sent.push(Err(ProposeError::Rejected(e.to_string())));
                continue;
            }
            sent.push(
                raft.client_write_ff(cmd)
                    .await
                    .map_err(|e| ProposeError::Unreachable(e.to_string())),
            );
        }
        let deadline = Duration::from_millis(PROPOSE_TIMEOUT_MS);
        futures::future::join_all(sent.into_iter().map(|rx| async move {
            match tokio::time::timeout(deadline, rx?).await {
                Err(_) => Err(ProposeError::Unreachable(format!(
                    "no commit within {PROPOSE_TIMEOUT_MS} ms"
                ))),
                Ok(Err(_)) => Err(ProposeError::Unreachable("raft stopped".into())),
                Ok(Ok(Ok(resp))) => Ok(resp.data),
                Ok(Ok(Err(ClientWriteError::ForwardToLeader(_)))) => Err(ProposeError::NoChief),
                Ok(Ok(Err(e))) => Err(ProposeError::Unreachable(e.to_string())),
            }
        }))
        .await
    }

    pub(super) async fn propose_local(
        &self,
        cmd: ControlCommand,
    ) -> Result<ControlResponse, ProposeError> {
        if let Some(fault) = self.fault() {
            return Err(ProposeError::Stopped(fault));
        }
        if self.chief().0.is_none() {
            return Err(ProposeError::NoChief);
        }
        match self.raft().client_write(cmd).await {
            Ok(resp) => Ok(resp.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(ProposeError::NoChief)
            }
            Err(e) => Err(ProposeError::Unreachable(e.to_string())),
        }
    }

    /// A job's logs: one chunk per rank of one of its runs, each read from
    /// `offsets[worker]` on. A run is a placement (a trial's first run, each promotion and
    /// re-run; a plain job's first attempt and each retry); `generation` names a past one
    /// by the generation it was placed in ([`JobLogs::runs`]), `None` (or the current
    /// generation) reads the current one. A past run's ranks are found by the member names
    /// of its placement event (its workers were its ranks), on whichever member of that
    /// name keeps the log.
    pub async fn logs(
        &self,
        id: JobId,
        offsets: &BTreeMap<u32, u64>,
        generation: Option<u32>,
    ) -> Result<JobLogs, LogsError> {
        let (state, current, slots, runs, past) = self
            .read(|s| {
                let j = s.job(id)?;
                let placed = || j.events.iter().filter(|e| e.what == EventKind::Placed);
                let past = generation
                    .filter(|g| *g != j.process_generation())
                    .map(|g| placed().find(|e| e.generation == g).map(|e| e.ring.clone()));
                let runs = placed().map(|e| e.generation).collect::<Vec<u32>>();
                Some((
                    j.state,
                    j.process_generation(),
                    j.assignment.clone(),
                    runs,
                    past,
                ))
            })
            .ok_or(LogsError::NoJob)?;
        // (rank, worker, the members that may keep its log)
        let (generation, ranks): (u32, Vec<(u32, u32, Vec<String>)>) = match past {
            None => (
                current,
                slots
                    .iter()
                    .map(|s| (s.rank, s.worker, vec![s.member.clone()]))
                    .collect(),
            ),
            Some(None) => {
                return Err(LogsError::NoRun {
                    generation: generation.unwrap_or_default(),
                })
            }
            Some(Some(ring)) => {
                let members = self.members_by_name(&slots).await;
                let ranks = ring
                    .iter()
                    .enumerate()
                    .map(|(rank, name)| {
                        let rank = u32::try_from(rank).unwrap_or(u32::MAX);
                        let ids = members.get(name).cloned().unwrap_or_default();
                        (rank, rank, ids)
                    })
                    .collect();
                (generation.unwrap_or_default(), ranks)
            }
        };
        let mut chunks = Vec::with_capacity(ranks.len());
        for (rank, worker, members) in ranks {
            let offset = offsets.get(&worker).copied().unwrap_or(0);
            let mut chunk = self
                .rank_log(&members, id, generation, worker, offset)
                .await;
            chunk.rank = rank;
            chunks.push(chunk);
        }
        Ok(JobLogs {
            state,
            runs,
            chunks,
        })
    }

    /// Member ids by name: the current ring's, then every member this node knows (a name
    /// may be several members'; a log is on one of them).
    async fn members_by_name(&self, slots: &[Slot]) -> BTreeMap<String, Vec<String>> {
        let mut by_name: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let known = self
            .node
            .members()
            .await
            .map(|(_, m)| m)
            .unwrap_or_default();
        let pairs = slots
            .iter()
            .map(|s| (s.name.clone(), s.member.clone()))
            .chain(
                known
                    .iter()
                    .map(|m| (m.meta.name.clone(), peer_id_text(&m.id))),
            );
        for (name, id) in pairs {
            let ids = by_name.entry(name).or_default();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        by_name
    }

    /// `worker`'s log of `generation` from `offset`, from the first of `members` that has
    /// any of it (here or over RPC).
    async fn rank_log(
        &self,
        members: &[String],
        job: JobId,
        generation: u32,
        worker: u32,
        offset: u64,
    ) -> LogChunk {
        let mut last = None;
        for member in members {
            let chunk = if *member == self.me {
                read_log(&self.jobs_dir, job, generation, worker, offset)
            } else {
                self.remote_log(member, job, generation, worker, offset)
                    .await
            };
            if !chunk.text.is_empty() {
                return chunk;
            }
            // A member without that log answers an empty chunk; keep the one that is not
            // an error if any is.
            if last.as_ref().is_none_or(|l: &LogChunk| l.error.is_some()) {
                last = Some(chunk);
            }
        }
        last.unwrap_or_else(|| {
            LogChunk::empty(
                worker,
                generation,
                offset,
                Some("the member that ran it is no longer known".into()),
            )
        })
    }

    async fn remote_log(
        &self,
        member: &str,
        job: JobId,
        generation: u32,
        worker: u32,
        offset: u64,
    ) -> LogChunk {
        let failed = |e: String| LogChunk::empty(worker, generation, offset, Some(e));
        let Ok(peer) = member.parse::<PeerId>() else {
            return failed("bad peer id".into());
        };
        let req = RpcRequest::Logs {
            job,
            generation,
            worker,
            offset,
            principal: Principal::current(),
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

    /// Whether `peer` answers a direct call within [`CONFIRM_TIMEOUT_MS`] (any answer: an
    /// older node answers `Malformed`).
    async fn answers(&self, peer: PeerId) -> bool {
        let Ok(payload) = wire::encode_json(&RpcRequest::Alive) else {
            return false;
        };
        let wait = Duration::from_millis(CONFIRM_TIMEOUT_MS);
        matches!(
            tokio::time::timeout(wait, self.node.rpc(peer, payload)).await,
            Ok(Ok(_))
        )
    }

    /// Stops Raft (node shutdown).
    pub async fn shutdown(&self) {
        // The RPCs first (no new work for Raft), then Raft.
        self.tasks
            .stop(Duration::from_millis(CONTROL_TASKS_STOP_MS))
            .await;
        let _ = self.raft().shutdown().await;
    }

    /// Milliseconds since this handle started (for logs).
    pub fn uptime_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// This node's peer id, as text.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Whether this node is the chief now: the Raft leader, in touch with a quorum.
    pub fn is_chief(&self) -> bool {
        self.raft().metrics().borrow().state == ServerState::Leader && self.chief().0.is_some()
    }

    /// Returns once this node's Raft is leader (at once if it is). Waits on openraft's
    /// server metrics, which change only with the state, leader or membership: a follower's
    /// loops that matter only on the leader sleep instead of polling (an idle node's wake-ups
    /// are its CPU). A Raft that stopped (restarted after a storage failure) is looked at
    /// again every heartbeat period (`HEARTBEAT_MS`).
    pub async fn until_leader(&self) {
        loop {
            let raft = self.raft();
            let mut server = raft.server_metrics();
            if server.borrow_and_update().state == ServerState::Leader {
                return;
            }
            if server.changed().await.is_err() {
                tokio::time::sleep(Duration::from_millis(HEARTBEAT_MS)).await;
            }
        }
    }

    /// The node's event-loop handle (membership, RPCs).
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// A receiver that changes whenever this replica applies log entries.
    pub fn subscribe_applied(&self) -> tokio::sync::watch::Receiver<u64> {
        self.sm.subscribe()
    }

    /// The chief's voter upkeep: at most one change of who votes (add learners, promote,
    /// demote or remove a member), chosen by [`voters::next_change`] from gossip's view.
    pub async fn reconcile_voters(
        &self,
        config: &VoterConfig,
        now_ms: u64,
        members: &[MemberView],
    ) -> Result<()> {
        let ctl = self;
        let m = self.raft().metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let learners: BTreeSet<NodeId> = membership.learner_ids().collect();
        let mut view = BTreeMap::new();
        let mut nodes = BTreeMap::new();
        for member in members {
            let text = peer_id_text(&member.id);
            let id = node_id_of(&text);
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
                    peer_id: text,
                    name: member.meta.name.clone(),
                },
            );
        }
        let removed: Vec<NodeId> =
            self.read(|s| s.removed.keys().map(|p| node_id_of(p.as_str())).collect());
        voters::exclude_removed(&mut view, removed.iter().copied());
        // A change on gossip's word waits for the member's own silence: one that answers
        // directly is kept (`voters::Round`).
        let mut round = voters::Round::new(view, removed.into_iter().collect());
        let change = loop {
            match round.step(&ctl.node_id, &voters, &learners, now_ms, config) {
                voters::Step::Done => return Ok(()),
                voters::Step::Apply(change) => break change,
                voters::Step::Ask(id) => {
                    let peer = nodes
                        .get(&id)
                        .and_then(|n| n.peer_id.parse::<PeerId>().ok());
                    match peer {
                        Some(peer) if self.answers(peer).await => {
                            warn!(%peer, "gossip reports a member down that answers directly: kept");
                            round.answered(&id);
                        }
                        _ => round.silent(&id),
                    }
                }
            }
        };
        info!(?change, "voter change");
        match change {
            Change::AddLearners(ids) => {
                let added = ids
                    .into_iter()
                    .map(|id| (id, nodes.get(&id).cloned().unwrap_or_default()))
                    .collect();
                ctl.raft()
                    .change_membership(ChangeMembers::AddNodes(added), true)
                    .await?;
            }
            Change::Promote(id) => {
                ctl.raft()
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), true)
                    .await?;
            }
            Change::PromotePair(a, b) => {
                ctl.raft()
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([a, b])), true)
                    .await?;
            }
            Change::Demote(id) => {
                ctl.raft()
                    .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), true)
                    .await?;
            }
            Change::Remove(id) => {
                if voters.contains(&id) {
                    ctl.raft()
                        .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                        .await?;
                } else {
                    ctl.raft()
                        .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                        .await?;
                }
            }
        }
        Ok(())
    }
}

/// How long the chief waits for a member that gossip reports down to answer it directly
/// before it takes the member's vote away (ms): a few round trips on a loaded host, far
/// below the dead grace that went before.
pub const CONFIRM_TIMEOUT_MS: u64 = 3_000;

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
        if !quiet {
            // Only a leader's heartbeats are ever stopped: a follower sleeps until it leads.
            ctl.until_leader().await;
        }
        tick.tick().await;
        let m = ctl.raft().metrics().borrow().clone();
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
            ctl.raft().runtime_config().heartbeat(!quiet);
        }
    }
}
