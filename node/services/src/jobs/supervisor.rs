//! Runs this node's share of command and train jobs: one process per assigned rank.
//!
//! The supervisor is reconciled against the replicated control state. [`plan`] is the pure
//! part: a worker assigned to this node in a job's current generation, not yet exited, is
//! wanted and, if it has no process, launched ([`super::launch`]); a live elastic rank that
//! lives through re-forms (a train rank, a command rank of `[elastic] protocol =
//! "ringleader"`) whose ring re-formed is told its new generation instead; a process no
//! longer wanted (an old generation of a torchrun command job, an old attempt, a worker left
//! out of the ring, a cancelled or failed job) is stopped. [`Supervisor`] carries the plan out
//! ([`super::process`] runs each rank), and the supervisor's loop reconciles on every applied
//! log entry and once a second. Logs go to
//! `<data-dir>/jobs/<id>/generation-<g>/worker-<w>.log`, `g` being the generation the
//! process was started for.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::PathBuf,
    time::Duration,
};

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use crate::{
    cluster::identity::peer_id_text,
    control::{
        handle::{wall_ms, ControlHandle},
        protocol::ProposeError,
    },
    domain::{
        spec::JobKind,
        state::{ops, ControlCommand, ControlState, JobId, JobState, Op},
    },
    jobs::{
        launch::{default_storage, generation_line, launch, Launch, LaunchContext, STANDBY_ENV},
        process::{Control, Key, ProtocolRank, RankOptions, Run, CONTROL_QUEUE_DEPTH},
    },
};

/// Depth of the queue of worker reports (exits, metrics) waiting to be proposed.
const REPORT_QUEUE_DEPTH: usize = 1_024;
/// Period of the reconcile when nothing is applied, in milliseconds.
const RECONCILE_PERIOD_MS: u64 = 1_000;
/// Pause between two tries of a report that must arrive, in milliseconds.
const REPORT_RETRY_PAUSE_MS: u64 = 500;
/// Tries of a report that must arrive (a rank's exit) before it is dropped.
const REPORT_TRIES_MAX: u32 = 60;

/// A rank process to start.
#[derive(Debug, PartialEq)]
pub struct Start {
    pub key: Key,
    pub launch: Launch,
    /// The generation and rank it starts as.
    pub generation: u32,
    pub rank: u32,
    /// It reads later generations on stdin (an elastic rank that lives through re-forms).
    pub control_stdin: bool,
    /// A command rank of the ringleader protocol: its first generation (on stdin) and the
    /// bound on its first heartbeat.
    pub protocol: Option<ProtocolRank>,
    /// A standby joiner (`domain::state::standby`): started with [`STANDBY_ENV`] and no
    /// generation.
    pub standby: bool,
}

/// A live rank to move to the job's current generation.
#[derive(Debug, PartialEq)]
pub struct Move {
    pub key: Key,
    pub generation: u32,
    pub rank: u32,
    /// The `ringleader-generation` control line for its stdin.
    pub line: String,
}

/// What the supervisor must do to match the state.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Every process that should exist now (running or to start).
    pub wanted: BTreeSet<Key>,
    /// Processes to start.
    pub start: Vec<Start>,
    /// Live processes to move to a new generation.
    pub moves: Vec<Move>,
    /// Wanted processes that cannot start or move yet: a ring member's address is unknown.
    pub waiting: Vec<Key>,
    /// Processes that are no longer wanted.
    pub stop: Vec<Key>,
    /// Live processes of a job being requeued by a preemption: asked to checkpoint and
    /// stop within the grace (ms), with SIGTERM or (an elastic train rank, which stops at
    /// the stop line and checkpoints there) without ([`Control::Preempt`]).
    pub preempt: Vec<(Key, u64, bool)>,
}

/// The pure reconcile: what to start, move and stop, given the state, the processes there
/// are (`have`: key → the generation each runs as; running, or ended by themselves with
/// their exit report on its way) and members' hosts (`host_of`).
pub fn plan(
    state: &ControlState,
    ctx: &LaunchContext,
    have: &BTreeMap<Key, u32>,
    host_of: &dyn Fn(&str) -> Option<String>,
) -> Plan {
    let mut plan = Plan::default();
    for job in state.jobs.values() {
        let runs_ranks = matches!(job.spec.kind, JobKind::Train | JobKind::Command);
        if job.state != JobState::Running || !runs_ranks {
            continue;
        }
        let control_stdin = job.spec.keeps_ranks_through_reforms() && job.is_elastic();
        // A command rank of the ringleader protocol reads even its first generation on
        // stdin (a train rank's is in its arguments).
        let protocol_rank = control_stdin && job.spec.kind == JobKind::Command;
        for slot in job.assignment.iter().filter(|s| s.member == ctx.me) {
            if job.exits.contains_key(&slot.rank) {
                continue;
            }
            let key = (job.id, job.process_generation(), slot.worker);
            plan.wanted.insert(key);
            if let Some(stopping) = &job.stopping {
                // A preemption's requeue: nothing starts or moves; what runs checkpoints
                // and stops.
                if have.contains_key(&key) {
                    let sigterm = !(control_stdin && job.spec.kind == JobKind::Train);
                    plan.preempt
                        .push((key, u64::from(stopping.grace_s) * 1_000, sigterm));
                }
                continue;
            }
            match have.get(&key) {
                Some(g) if *g == job.generation || !control_stdin => {}
                Some(_) => match generation_line(ctx, job, slot, host_of) {
                    Some(line) => plan.moves.push(Move {
                        key,
                        generation: job.generation,
                        rank: slot.rank,
                        line,
                    }),
                    None => plan.waiting.push(key),
                },
                None => {
                    let protocol = match protocol_rank {
                        false => None,
                        true => match generation_line(ctx, job, slot, host_of) {
                            Some(first) => Some(protocol_rank_of(job, Some(first))),
                            None => {
                                plan.waiting.push(key);
                                continue;
                            }
                        },
                    };
                    match launch(ctx, job, slot, host_of) {
                        Some(launch) => plan.start.push(Start {
                            key,
                            launch,
                            generation: job.generation,
                            rank: slot.rank,
                            control_stdin,
                            protocol,
                            standby: false,
                        }),
                        None => plan.waiting.push(key),
                    }
                }
            }
        }
        if let Some(standby) = job.standby.as_ref().filter(|s| s.slot.member == ctx.me) {
            let slot = &standby.slot;
            let key = (job.id, job.process_generation(), slot.worker);
            plan.wanted.insert(key);
            if have.contains_key(&key) {
                continue;
            }
            let Some(mut launch) = launch(ctx, job, slot, host_of) else {
                plan.waiting.push(key);
                continue;
            };
            launch.env.push((STANDBY_ENV.into(), "1".into()));
            plan.start.push(Start {
                key,
                launch,
                generation: job.generation,
                rank: slot.rank,
                control_stdin: true,
                protocol: Some(protocol_rank_of(job, None)),
                standby: true,
            });
        }
    }
    plan.stop = have
        .keys()
        .filter(|k| !plan.wanted.contains(k))
        .copied()
        .collect();
    plan
}

/// What a command rank of `job` (of the ringleader protocol) starts with: `first_generation`
/// (`None` for a standby) and the job's bound on its first heartbeat.
fn protocol_rank_of(
    job: &crate::domain::state::Job,
    first_generation: Option<String>,
) -> ProtocolRank {
    ProtocolRank {
        first_generation,
        first_heartbeat_ms: u64::from(job.spec.elastic.first_heartbeat_s) * 1_000,
    }
}

/// Runs and stops this node's worker processes.
pub struct Supervisor {
    ctx: LaunchContext,
    reports: mpsc::Sender<ControlCommand>,
    /// Live processes: their control queue and the generation they run as.
    running: HashMap<Key, (mpsc::Sender<Control>, u32)>,
    /// Processes that ended by themselves, while their exit report is on its way: they are
    /// not started again.
    finished: HashMap<Key, u32>,
    clock_ms: fn() -> u64,
    /// Ranks of train jobs waiting for a member's address, already logged.
    waiting: HashSet<Key>,
    /// Ranks already asked to checkpoint and stop for a preemption.
    preempted: HashSet<Key>,
    /// The node's dataset service: train ranks fetch their shared dataset through it.
    datasets: Option<crate::datasets::Datasets>,
    /// Running ranks' process groups on disk (`None` in tests).
    groups: Option<std::sync::Arc<super::groups::Groups>>,
    /// The user ranks run as and their log cap.
    options: RankOptions,
    /// Every rank's task: [`run`] waits for them all once it has stopped the ranks at the
    /// node's shutdown.
    ranks: tokio_util::task::TaskTracker,
}

impl Supervisor {
    /// A supervisor for the member `me` (peer id), keeping logs under `jobs_dir` and sending
    /// its reports (exits, metrics) to `reports`; `clock_ms` stamps them.
    pub fn new(
        me: String,
        jobs_dir: PathBuf,
        reports: mpsc::Sender<ControlCommand>,
        clock_ms: fn() -> u64,
    ) -> Self {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "ringleader".into());
        Supervisor {
            ctx: LaunchContext {
                me,
                storage: default_storage(&jobs_dir),
                jobs_dir,
                exe,
                device_names: None,
                offers_gpus: false,
                socket_ifname: None,
                libraries: Default::default(),
                ring_key: None,
                secrets_key: None,
                checkpoints: None,
            },
            reports,
            running: HashMap::new(),
            finished: HashMap::new(),
            clock_ms,
            waiting: HashSet::new(),
            preempted: HashSet::new(),
            datasets: None,
            groups: None,
            options: RankOptions::default(),
            ranks: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Runs ranks as `options` says (`--run-as`, the log cap; default: as the node, the
    /// default cap).
    pub fn with_rank_options(mut self, options: RankOptions) -> Self {
        self.options = options;
        self
    }

    /// Records running ranks' process groups under the jobs directory, first killing what a
    /// previous run of this node left there (see `jobs::groups`).
    pub fn with_groups(mut self) -> Self {
        self.groups = Some(std::sync::Arc::new(super::groups::Groups::open(
            &self.ctx.jobs_dir,
        )));
        self
    }

    /// Gives train ranks the node's dataset service.
    pub fn with_datasets(mut self, datasets: crate::datasets::Datasets) -> Self {
        self.datasets = Some(datasets);
        self
    }

    /// Names a rank's devices in its `CUDA_VISIBLE_DEVICES` by the node's own entries
    /// (`gpus::inherited_visible_devices`; default: by index); `offers`: the node offers
    /// GPUs, so a rank given none is shown none (default: no GPUs, nothing said).
    pub fn with_devices(mut self, names: Option<Vec<String>>, offers: bool) -> Self {
        self.ctx.device_names = names;
        self.ctx.offers_gpus = offers;
        self
    }

    /// Gives ranks `ifname`, the interface of the node's data-plane address, as
    /// `NCCL_SOCKET_IFNAME`/`GLOO_SOCKET_IFNAME` (default: none, unset).
    pub fn with_socket_ifname(mut self, ifname: Option<String>) -> Self {
        self.ctx.socket_ifname = ifname;
        self
    }

    /// Puts `libraries` first on the `LD_LIBRARY_PATH` of ranks given devices (default:
    /// none, the path is left alone).
    pub fn with_libraries(mut self, libraries: crate::gpus::RankLibraries) -> Self {
        self.ctx.libraries = libraries;
        self
    }

    /// Derives rings' secrets and opens jobs' `[secrets]` with `keys` (from the cluster key;
    /// none under `--insecure`).
    pub fn with_keys(mut self, keys: NodeKeys) -> Self {
        self.ctx.ring_key = keys.ring;
        self.ctx.secrets_key = keys.secrets;
        self
    }

    /// Sets the checkpoint storage URL of train jobs (default: `file://<data-dir>/store`,
    /// the data dir being the parent of `jobs_dir`, as `ringleader node` defaults it).
    pub fn with_storage(mut self, url: String) -> Self {
        self.ctx.storage = url;
        self
    }

    /// Gives command ranks their checkpoint place through this node's API (default: none).
    pub fn with_checkpoints(mut self, access: Option<super::checkpoint::CheckpointAccess>) -> Self {
        self.ctx.checkpoints = access;
        self
    }

    /// Brings the processes in line with `state`. `host_of` gives a member's host for
    /// `MASTER_ADDR` and the train ring.
    pub fn reconcile(&mut self, state: &ControlState, host_of: &dyn Fn(&str) -> Option<String>) {
        // A process that ended by itself is finished, not to be started again.
        let finished = &mut self.finished;
        self.running.retain(|key, (control, generation)| {
            let alive = !control.is_closed();
            if !alive {
                finished.insert(*key, *generation);
            }
            alive
        });
        let have: BTreeMap<Key, u32> = self
            .running
            .iter()
            .map(|(k, (_, g))| (*k, *g))
            .chain(self.finished.iter().map(|(k, g)| (*k, *g)))
            .collect();
        let plan = plan(state, &self.ctx, &have, host_of);
        for key in &plan.waiting {
            if self.waiting.insert(*key) {
                info!(job = %key.0, generation = key.1, rank = key.2, "waiting for the ring members' addresses");
            }
        }
        for start in plan.start {
            let (control_tx, control_rx) = mpsc::channel(CONTROL_QUEUE_DEPTH);
            let run = Run {
                key: start.key,
                generation: start.generation,
                rank: start.rank,
                launch: start.launch,
                control_stdin: start.control_stdin,
                protocol: start.protocol,
                standby: start.standby,
                reports: self.reports.clone(),
                clock_ms: self.clock_ms,
                datasets: self.datasets.clone(),
                groups: self.groups.clone(),
                options: self.options.clone(),
            };
            let (job, generation, rank) = (start.key.0, start.generation, start.rank);
            info!(job = %job, generation, rank, worker = start.key.2, "starting worker");
            debug!(target: "ringleader::hops", job = %job, at_ms = (self.clock_ms)(), hop = "seen");
            self.ranks.spawn(run.run(control_rx));
            self.running
                .insert(start.key, (control_tx, start.generation));
        }
        for m in plan.moves {
            if let Some((control, generation)) = self.running.get_mut(&m.key) {
                let msg = Control::Generation {
                    generation: m.generation,
                    rank: m.rank,
                    line: m.line,
                };
                if control.try_send(msg).is_ok() {
                    *generation = m.generation;
                }
            }
        }
        for (key, grace_ms, sigterm) in plan.preempt {
            if !self.preempted.insert(key) {
                continue;
            }
            if let Some((control, _)) = self.running.get(&key) {
                info!(job = %key.0, worker = key.2, grace_ms, sigterm, "preempted: asking the worker to checkpoint and stop");
                let _ = control.try_send(Control::Preempt { grace_ms, sigterm });
            }
        }
        for key in plan.stop {
            if let Some((control, _)) = self.running.remove(&key) {
                // A cancelled job's ranks (a trial stopped early included) may clean up:
                // SIGTERM, then SIGKILL after a grace period. A rank a running ring left
                // out (a shrink) leaves at its step boundary. Others go at once.
                let job = state.job(key.0);
                let graceful = job.is_some_and(|j| j.state == JobState::Cancelled);
                let leaves = job.is_some_and(|j| {
                    j.state == JobState::Running && j.spec.keeps_ranks_through_reforms()
                });
                info!(job = %key.0, generation = key.1, worker = key.2, graceful, leaves, "stopping worker");
                if graceful {
                    let _ = control.try_send(Control::Stop);
                } else if leaves {
                    let _ = control.try_send(Control::Leave);
                } else {
                    stop(&control);
                }
            }
        }
        self.finished.retain(|key, _| plan.wanted.contains(key));
        self.waiting.retain(|key| plan.wanted.contains(key));
        self.preempted.retain(|key| plan.wanted.contains(key));
        if let Some(users) = &self.options.job_users {
            // A job's uid of `--run-as-range` is freed once it has ended and no rank of it
            // runs here (`security::uid_range`).
            users
                .lock()
                .expect("job users lock")
                .retain(|job| state.job(job).is_some_and(|j| !j.state.is_terminal()));
        }
    }

    /// Kills every process (node shutdown).
    pub fn stop_all(&mut self) {
        for (_, (control, _)) in self.running.drain() {
            stop(&control);
        }
    }

    /// The node's shutdown: kills every process and waits until each rank's task has
    /// reaped it.
    pub async fn stop_all_and_wait(&mut self) {
        self.stop_all();
        self.ranks.close();
        self.ranks.wait().await;
    }
}

/// Kills a rank's process: by message, or, when its queue is full, by dropping the queue
/// (its task kills the process group when the queue closes).
fn stop(control: &mpsc::Sender<Control>) {
    let _ = control.try_send(Control::Kill);
}

use crate::cluster::key_ring::DerivedKey;

/// The keys a node launches ranks with, derived from the cluster key at each launch (a key
/// rotation changes them; none under `--insecure`).
#[derive(Clone, Default)]
pub struct NodeKeys {
    /// Rings' secrets ([`super::launch::ring_secret`]).
    pub ring: Option<DerivedKey>,
    /// Jobs' `[secrets]` ([`crate::security::sealed`]).
    pub secrets: Option<DerivedKey>,
}

impl NodeKeys {
    /// The keys of the node whose cluster key ring is `ring`.
    pub fn of(ring: Option<&crate::cluster::key_ring::KeyRing>) -> NodeKeys {
        NodeKeys {
            ring: ring.map(|r| DerivedKey::of(r, super::launch::RING_KEY_CONTEXT)),
            secrets: ring.map(|r| DerivedKey::of(r, crate::security::sealed::SECRETS_KEY_CONTEXT)),
        }
    }
}

/// What this node's supervisor launches ranks with ([`start`]; `node::run` fills it from
/// the node's flags and what start-up found).
pub struct SupervisorConfig {
    /// This node's peer id.
    pub me: String,
    /// `<data-dir>/jobs`: the ranks' working directories and logs.
    pub jobs_dir: PathBuf,
    /// The storage URL ranks write checkpoints and records to.
    pub storage: String,
    /// The devices the node itself was given (`CUDA_VISIBLE_DEVICES` at start), which a
    /// rank's device numbers index.
    pub device_names: Option<Vec<String>>,
    /// Whether the node offers GPUs to jobs.
    pub offers_gpus: bool,
    /// The interface of the data-plane address (ranks' `NCCL_SOCKET_IFNAME`).
    pub socket_ifname: Option<String>,
    /// The CUDA libraries ranks given GPUs load.
    pub libraries: crate::gpus::RankLibraries,
    /// The keys ranks are launched with.
    pub keys: NodeKeys,
    /// `--run-as`, `--run-as-range` and the rank log cap.
    pub options: RankOptions,
    /// A command rank's checkpoint place, through this node's API.
    pub checkpoints: super::checkpoint::CheckpointAccess,
}

/// Starts this node's supervisor on top of the control plane, in `tasks`: ranks follow the
/// replicated state, and their reports are proposed to the chief. When `tasks` stop (the
/// node's shutdown) every rank is killed and reaped, and reports not yet proposed are
/// dropped: the ranks end with their member, which leaves the cluster next.
pub fn start(
    tasks: &crate::tasks::Tasks,
    ctl: ControlHandle,
    datasets: crate::datasets::Datasets,
    config: SupervisorConfig,
) {
    let (reports_tx, reports_rx) = mpsc::channel(REPORT_QUEUE_DEPTH);
    tasks.spawn(report_loop(ctl.clone(), reports_rx));
    let supervisor = Supervisor::new(config.me, config.jobs_dir, reports_tx, wall_ms)
        .with_storage(config.storage)
        .with_datasets(datasets)
        .with_devices(config.device_names, config.offers_gpus)
        .with_socket_ifname(config.socket_ifname)
        .with_libraries(config.libraries)
        .with_keys(config.keys)
        .with_checkpoints(Some(config.checkpoints))
        .with_rank_options(config.options);
    tasks.spawn_owned(run(ctl, supervisor, tasks.stopping()));
}

/// Proposes the workers' reports, retrying while there is no chief (reports are idempotent:
/// a duplicate or stale one is ignored by the state machine).
///
/// One job's reports are proposed one after the other, in the order they were made (a
/// trial's report before its rank's exit, a metric before the exit that ends the job); the
/// reports of different jobs are proposed at once, each job's chain of its own. One chain
/// for the whole node waited for every commit in turn: with 16 trials a node exiting within
/// a few ms of each other, each exit waited for the ones before it, and a 3-node search of
/// trivial trials placed its next trials at the pace of one commit round trip per node.
async fn report_loop(ctl: ControlHandle, mut rx: mpsc::Receiver<ControlCommand>) {
    // Reports waiting for their job's chain, and the jobs whose chain runs.
    let mut waiting: HashMap<Option<JobId>, std::collections::VecDeque<ControlCommand>> =
        HashMap::new();
    let mut chains = tokio::task::JoinSet::new();
    // Each chain's job by its task (a chain that panicked still hands its job on).
    let mut jobs: HashMap<tokio::task::Id, Option<JobId>> = HashMap::new();
    let mut open = true;
    while open || !chains.is_empty() {
        tokio::select! {
            cmd = rx.recv(), if open => match cmd {
                Some(cmd) => {
                    let job = report_job(&cmd.op);
                    match waiting.get_mut(&job) {
                        Some(queue) => queue.push_back(cmd),
                        None => {
                            waiting.insert(job, Default::default());
                            let task = chains.spawn(propose_report(ctl.clone(), cmd));
                            jobs.insert(task.id(), job);
                        }
                    }
                }
                None => open = false,
            },
            Some(done) = chains.join_next_with_id() => {
                let task = done.map_or_else(|e| e.id(), |(task, ())| task);
                let Some(job) = jobs.remove(&task) else { continue };
                match waiting.get_mut(&job).and_then(|q| q.pop_front()) {
                    Some(next) => {
                        let task = chains.spawn(propose_report(ctl.clone(), next));
                        jobs.insert(task.id(), job);
                    }
                    None => {
                        waiting.remove(&job);
                    }
                }
            }
        }
    }
}

/// The job a report is about (`None`: one chain for the rest).
fn report_job(op: &Op) -> Option<JobId> {
    match op {
        Op::WorkerExited(ops::WorkerExited { id, .. })
        | Op::TrialReport(ops::TrialReport { id, .. })
        | Op::WorkerNote(ops::WorkerNote { id, .. })
        | Op::StandbyReady(ops::StandbyReady { id, .. })
        | Op::StandbyDropped(ops::StandbyDropped { id, .. })
        | Op::Metric(ops::Metric { id, .. })
        | Op::RankStats(ops::RankStats { id, .. })
        | Op::RankLost(ops::RankLost { id, .. }) => Some(*id),
        _ => None,
    }
}

/// Proposes one report, retrying one that must arrive while there is no chief.
async fn propose_report(ctl: ControlHandle, cmd: ControlCommand) {
    let must_arrive = matches!(
        cmd.op,
        Op::WorkerExited(ops::WorkerExited { .. })
            | Op::TrialReport(ops::TrialReport { .. })
            | Op::WorkerNote(ops::WorkerNote { .. })
            | Op::StandbyReady(ops::StandbyReady { .. })
            | Op::StandbyDropped(ops::StandbyDropped { .. })
    );
    for tries in 0u32.. {
        match ctl.propose(cmd.clone()).await {
            Ok(_) => {
                if let Op::WorkerExited(ops::WorkerExited { id, .. }) = &cmd.op {
                    debug!(target: "ringleader::hops", job = %id, at_ms = wall_ms(), hop = "committed");
                }
                break;
            }
            Err(ProposeError::Rejected(_)) => break,
            Err(e) if !must_arrive || tries >= REPORT_TRIES_MAX => {
                warn!("worker report dropped: {e}");
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(REPORT_RETRY_PAUSE_MS)).await,
        }
    }
}

/// Keeps this node's worker processes in line with the replicated state, until `stop`
/// (then kills and reaps them).
async fn run(
    ctl: ControlHandle,
    mut supervisor: Supervisor,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut applied = ctl.subscribe_applied();
    let mut tick = tokio::time::interval(Duration::from_millis(RECONCILE_PERIOD_MS));
    let mut fence = Fence::default();
    // Members' hosts, by peer id: looked up again when the view changed (seen at a tick)
    // and when one is missing, not at every applied entry (fetching the view and writing
    // every peer id as text at each entry, on every node, was a quarter of a 128-node host's
    // CPU while jobs ran), nor at every tick (a copy of the whole view each second on every
    // node, though an idle cluster's view does not change).
    let mut changes = ctl.node().member_changes();
    let (mut hosts, mut stale) = (BTreeMap::new(), true);
    loop {
        let now = tokio::time::Instant::now().into_std();
        let (applied_index, last_log) = ctl.log_progress();
        match fence.observe(ctl.chief().0.is_some(), applied_index, last_log, now) {
            FenceStep::Run => {}
            FenceStep::Stop => {
                warn!(
                    "no chief for {FENCE_AFTER_MS} ms (this side of a partition has no quorum): stopping this node's ranks; the chief's side goes on without them"
                );
                supervisor.stop_all();
            }
            FenceStep::Wait => {}
        }
        if fence.fenced {
            // While fenced nothing runs here: the replicated state may still name this
            // node's ranks, but the chief has (or will have) re-formed without them.
            tokio::select! {
                _ = stop.cancelled() => return supervisor.stop_all_and_wait().await,
                r = applied.changed() => if r.is_err() { return },
                _ = tick.tick() => {}
            }
            continue;
        }
        // Looked up at most once a pass: when the tick made the hosts stale, or when a
        // rank's member is missing from them.
        let mut looked_up = false;
        loop {
            if stale {
                // Changes from here on are seen at a later tick.
                changes.borrow_and_update();
                let Some(fresh) = member_hosts(&ctl).await else {
                    supervisor.stop_all();
                    return;
                };
                (hosts, stale, looked_up) = (fresh, false, true);
            }
            if !reconcile_missed(&ctl, &mut supervisor, &hosts) || looked_up {
                break;
            }
            stale = true;
        }
        tokio::select! {
            _ = stop.cancelled() => return supervisor.stop_all_and_wait().await,
            r = applied.changed() => if r.is_err() { supervisor.stop_all(); return },
            // A loop that is gone errs: looked up, which ends this loop.
            _ = tick.tick() => stale = stale || changes.has_changed().unwrap_or(true),
        }
    }
}

/// Reconciles `supervisor` with the replicated state, members' hosts from `hosts`; returns
/// whether a rank's member was missing from them.
fn reconcile_missed(
    ctl: &ControlHandle,
    supervisor: &mut Supervisor,
    hosts: &BTreeMap<String, String>,
) -> bool {
    let missed = std::cell::Cell::new(false);
    let host_of = |id: &str| {
        let host = hosts.get(id).cloned();
        missed.set(missed.get() || host.is_none());
        host
    };
    ctl.read(|s| supervisor.reconcile(s, &host_of));
    missed.get()
}

/// Each member's host (its advertised data address without the port), by peer id; `None`
/// once the node's event loop is gone.
async fn member_hosts(ctl: &ControlHandle) -> Option<BTreeMap<String, String>> {
    let (_, members) = ctl.node().members().await.ok()?;
    let hosts = members
        .iter()
        .filter_map(|m| {
            let host = m
                .meta
                .data_addr
                .rsplit_once(':')
                .map(|(h, _)| h.trim_matches(['[', ']']).to_string())?;
            Some((peer_id_text(&m.id), host))
        })
        .collect();
    Some(hosts)
}

/// How long a node goes on running its ranks without a chief (no quorum on its side of a
/// partition) before it stops them, in milliseconds. Longer than an election (a chief's
/// death is not a partition) and than the majority's failure detection, so the majority
/// has re-formed the ring before the minority's ranks stop.
pub const FENCE_AFTER_MS: u64 = 10_000;

/// How long a chief must have been seen before ranks start (at start-up and after a
/// fence), in milliseconds; they start once, besides, this node has applied its log as it
/// was when the chief was first seen: a node restarted from its own old log would otherwise
/// start ranks of generations the cluster has moved past.
pub const SETTLE_MS: u64 = 1_000;

/// Whether this node may run ranks (sans-IO; time and the log's progress passed in): not
/// before it has seen a chief for [`SETTLE_MS`] and applied its log as it was then (at start
/// and after a fence), and not once it has had no chief for [`FENCE_AFTER_MS`].
///
/// The catch-up is judged against the log as it was when the chief was first seen, not
/// against the log at each look: a follower of a busy chief has always just appended an
/// entry it has not applied yet (the commit comes with the next append), so "applied
/// everything" was seldom true at a look, and a node that started beside a 500-trial search
/// stayed fenced (its placed trials waiting) until the search was nearly over. Nor does a
/// log behind its appends ever count as a missing chief: only the chief's absence fences.
#[derive(Debug)]
struct Fence {
    /// Since when no chief has been seen.
    no_chief_since: Option<std::time::Instant>,
    /// Since when a chief has been seen, and the last log index then: what must be applied
    /// before ranks start.
    chief_since: Option<(std::time::Instant, Option<u64>)>,
    /// Ranks may not run (they were stopped, or none started yet).
    fenced: bool,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            no_chief_since: None,
            chief_since: None,
            fenced: true,
        }
    }
}

/// What [`Fence::observe`] asks for.
#[derive(Debug, PartialEq, Eq)]
enum FenceStep {
    /// Run as usual.
    Run,
    /// Stop every rank now (entering the fence).
    Stop,
    /// Start nothing new (fenced), or wait out a grace.
    Wait,
}

impl Fence {
    /// `chief`: a chief is seen; `applied` and `last_log`: this replica's last applied and
    /// last log indexes now.
    fn observe(
        &mut self,
        chief: bool,
        applied: Option<u64>,
        last_log: Option<u64>,
        now: std::time::Instant,
    ) -> FenceStep {
        if chief {
            self.no_chief_since = None;
            let (since, target) = *self.chief_since.get_or_insert((now, last_log));
            // A tail the chief cut off (never committed) is never applied: the log as it is
            // now bounds the target.
            let caught_up = applied >= target.min(last_log);
            if self.fenced
                && caught_up
                && now.duration_since(since) >= Duration::from_millis(SETTLE_MS)
            {
                info!("a chief for {SETTLE_MS} ms with the log applied: this node runs ranks");
                self.fenced = false;
            }
            return if self.fenced {
                FenceStep::Wait
            } else {
                FenceStep::Run
            };
        }
        self.chief_since = None;
        let since = *self.no_chief_since.get_or_insert(now);
        if !self.fenced && now.duration_since(since) >= Duration::from_millis(FENCE_AFTER_MS) {
            self.fenced = true;
            return FenceStep::Stop;
        }
        if self.fenced {
            FenceStep::Wait
        } else {
            FenceStep::Run
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        chief::{decide, tests as chief},
        cluster::membership::State,
        domain::state::JobId,
    };

    #[test]
    fn ranks_wait_for_a_settled_chief_and_stop_after_the_fence_time_without_one() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut f = Fence::default();
        assert_eq!(
            f.observe(false, Some(5), Some(5), at(0)),
            FenceStep::Wait,
            "nothing runs before a chief"
        );
        assert_eq!(
            f.observe(true, Some(5), Some(5), at(10)),
            FenceStep::Wait,
            "a chief seen just now"
        );
        assert_eq!(
            f.observe(true, Some(5), Some(5), at(10 + SETTLE_MS)),
            FenceStep::Run
        );
        let t = 10 + SETTLE_MS;
        assert_eq!(
            f.observe(false, Some(5), Some(5), at(t + 100)),
            FenceStep::Run,
            "an election is not a partition"
        );
        assert_eq!(
            f.observe(false, Some(5), Some(5), at(t + 99 + FENCE_AFTER_MS)),
            FenceStep::Run
        );
        assert_eq!(
            f.observe(false, Some(5), Some(5), at(t + 100 + FENCE_AFTER_MS)),
            FenceStep::Stop
        );
        assert!(f.fenced);
        assert_eq!(
            f.observe(false, Some(5), Some(5), at(t + 200 + FENCE_AFTER_MS)),
            FenceStep::Wait,
            "stopped once"
        );
        let back = t + 300 + FENCE_AFTER_MS;
        assert_eq!(
            f.observe(true, Some(5), Some(5), at(back)),
            FenceStep::Wait,
            "settling again"
        );
        assert_eq!(
            f.observe(true, Some(5), Some(5), at(back + SETTLE_MS)),
            FenceStep::Run
        );
    }

    /// A follower of a busy chief has always appended an entry more than it applied: it
    /// starts ranks once it has applied the log it had when it first saw the chief, and a
    /// log behind its appends never fences a running node.
    #[test]
    fn a_busy_log_neither_holds_ranks_back_nor_fences_them() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut f = Fence::default();
        // Restarted with entries up to 10 in its own log, 3 of them applied.
        assert_eq!(f.observe(true, Some(3), Some(10), at(0)), FenceStep::Wait);
        assert_eq!(
            f.observe(true, Some(9), Some(12), at(SETTLE_MS)),
            FenceStep::Wait,
            "its old log not applied yet"
        );
        assert_eq!(
            f.observe(true, Some(10), Some(13), at(SETTLE_MS + 5)),
            FenceStep::Run,
            "the old log applied, one new entry not yet: it runs"
        );
        for k in 0..100u64 {
            assert_eq!(
                f.observe(
                    true,
                    Some(20 + k),
                    Some(21 + k),
                    at(SETTLE_MS + 10 + k * 1_000)
                ),
                FenceStep::Run,
                "always one entry behind, for {} s",
                k
            );
        }
    }

    /// A tail that was never committed is cut off by the chief and never applied: the log as
    /// it is now bounds what must be applied.
    #[test]
    fn a_cut_tail_does_not_hold_ranks_back() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut f = Fence::default();
        assert_eq!(f.observe(true, Some(7), Some(10), at(0)), FenceStep::Wait);
        assert_eq!(
            f.observe(true, Some(8), Some(8), at(SETTLE_MS)),
            FenceStep::Run
        );
    }

    fn ctx(me: &str) -> LaunchContext {
        LaunchContext::for_test(me)
    }

    /// A re-form of a 3-rank command job on one member to ranks 0 and 2 of the first
    /// generation (rank 1 lost): the plans of `protocol` before and after.
    fn command_reform(protocol: &str) -> (JobId, Plan, Plan) {
        let mut state = ControlState::default();
        let id = chief::submit_text(
            &mut state,
            &format!(
                "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 3\nmin_workers = 2\n[elastic]\nprotocol = \"{protocol}\"\n"
            ),
        );
        let members = vec![chief::member("a", State::Alive, 3)];
        for cmd in decide(&state, &members, 5, &mut || "ab".repeat(32)) {
            state.apply(state.applied_index + 1, &cmd);
        }
        let me = members[0].id.to_string();
        let host = |_: &str| Some("127.0.0.1".to_string());
        let first = plan(&state, &ctx(&me), &BTreeMap::new(), &host);
        let job = state.job(id).unwrap();
        let keep = vec![job.assignment[0].clone(), {
            let mut s = job.assignment[2].clone();
            s.rank = 1;
            s
        }];
        let reform = ControlCommand {
            op: Op::Reform(ops::Reform {
                id,
                generation: 2,
                slots: keep,
                secret: "cd".repeat(32),
                reason: "peer-lost a (rank 1): exited with code 137".into(),
            }),
            at_ms: 6,
        };
        state.apply(state.applied_index + 1, &reform);
        let have: BTreeMap<Key, u32> = first.wanted.iter().map(|k| (*k, 1)).collect();
        let second = plan(&state, &ctx(&me), &have, &host);
        (id, first, second)
    }

    /// A requeue's ranks are asked to checkpoint and stop: an elastic train rank by the stop
    /// line alone (SIGTERM, which the train worker leaves at its default, would kill it
    /// mid-step, before the checkpoint it stops with), a rigid train rank and a command rank
    /// with SIGTERM too.
    #[test]
    fn a_requeue_sends_sigterm_to_every_rank_but_an_elastic_train_one() {
        let members = vec![chief::member("a", State::Alive, 4)];
        let me = members[0].id.to_string();
        let host = |_: &str| Some("127.0.0.1".to_string());
        let train = "name = \"t\"\nkind = \"train\"\nworkers = 2\n";
        let tables = "[model]\narch = \"mlp\"\n[data]\ndataset = \"digits\"\n";
        let command = "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 2\nmin_workers = 1\n";
        for (spec, sigterm) in [
            (format!("{train}min_workers = 1\n{tables}"), false),
            (format!("{train}{tables}"), true),
            (command.to_owned(), true),
        ] {
            let mut state = ControlState::default();
            let id = chief::submit_text(&mut state, &spec);
            for cmd in decide(&state, &members, 5, &mut || "ab".repeat(32)) {
                state.apply(state.applied_index + 1, &cmd);
            }
            let job = state.jobs.get_mut(&id).unwrap();
            assert_eq!(job.state, JobState::Running, "{spec}");
            job.stopping = Some(crate::domain::state::preempt::Stopping {
                since_ms: 6,
                grace_s: 30,
                why: "preempted for j-9".into(),
                for_job: None,
            });
            let have: BTreeMap<Key, u32> = job
                .assignment
                .iter()
                .map(|s| ((id, job.process_generation(), s.worker), job.generation))
                .collect();
            let p = plan(&state, &ctx(&me), &have, &host);
            assert_eq!(p.preempt.len(), 2, "{spec}");
            for (_, grace_ms, term) in &p.preempt {
                assert_eq!((*grace_ms, *term), (30_000, sigterm), "{spec}");
            }
        }
    }

    /// A standby joiner on this member starts with no generation and `RINGLEADER_STANDBY=1`;
    /// the re-form that takes it in moves it into the ring.
    #[test]
    fn a_standby_starts_without_a_generation_and_the_reform_moves_it_in() {
        let mut state = ControlState::default();
        let id = chief::submit_text(
            &mut state,
            "name = \"c\"\nkind = \"command\"\ncommand = [\"true\"]\nworkers = 1\nmin_workers = 1\nmax_workers = 2\n[elastic]\nprotocol = \"ringleader\"\n",
        );
        let members = vec![
            chief::member("a", State::Alive, 1),
            chief::member("b", State::Alive, 1),
        ];
        let step = |state: &mut ControlState, at_ms| {
            for cmd in decide(state, &members, at_ms, &mut || "ab".repeat(32)) {
                state.apply(state.applied_index + 1, &cmd);
            }
        };
        step(&mut state, 5); // placed on a
        step(&mut state, 6); // b staged
        let b = members[1].id.to_string();
        let host = |_: &str| Some("127.0.0.1".to_string());
        let staged = plan(&state, &ctx(&b), &BTreeMap::new(), &host);
        let [start] = staged.start.as_slice() else {
            panic!("{staged:?}")
        };
        assert_eq!(start.key, (id, 1, 1));
        assert!(start.standby && start.control_stdin);
        let p = start.protocol.as_ref().expect("a protocol rank");
        assert!(
            p.first_generation.is_none(),
            "no generation before the re-form"
        );
        assert!(start
            .launch
            .env
            .contains(&(STANDBY_ENV.to_owned(), "1".to_owned())));
        // Running: nothing to do until it is ready; then the re-form moves it in.
        let have: BTreeMap<Key, u32> = [((id, 1, 1), 1)].into();
        assert_eq!(plan(&state, &ctx(&b), &have, &host).start.len(), 0);
        let ready = ControlCommand {
            op: Op::StandbyReady(ops::StandbyReady { id, worker: 1 }),
            at_ms: 7,
        };
        state.apply(state.applied_index + 1, &ready);
        step(&mut state, 8);
        assert_eq!(state.job(id).unwrap().generation, 2);
        let joined = plan(&state, &ctx(&b), &have, &host);
        assert!(
            joined.start.is_empty() && joined.stop.is_empty(),
            "{joined:?}"
        );
        let moves: Vec<(Key, u32, u32)> = joined
            .moves
            .iter()
            .map(|m| (m.key, m.generation, m.rank))
            .collect();
        assert_eq!(moves, [((id, 1, 1), 2, 1)]);
    }

    #[test]
    fn ringleader_command_ranks_live_through_a_reform_torchrun_ones_start_again() {
        let (id, first, second) = command_reform("ringleader");
        assert_eq!(first.start.len(), 3);
        for s in &first.start {
            assert!(s.control_stdin);
            let p = s.protocol.as_ref().expect("a protocol rank");
            assert_eq!(p.first_heartbeat_ms, 60_000);
            let first = p.first_generation.as_ref().expect("its first generation");
            let line: ringleader_protocol::NodeLine = first.parse().unwrap();
            let ringleader_protocol::NodeLine::Generation(g) = line else {
                panic!("{line:?}")
            };
            assert_eq!(
                (g.generation, g.rank, g.addrs.len()),
                (1, s.rank as usize, 3)
            );
            let env: BTreeMap<_, _> = s.launch.env.iter().cloned().collect();
            assert_eq!(env["RINGLEADER_ELASTIC_PROTOCOL"], "ringleader");
        }
        // The survivors keep their processes (keyed by the attempt's generation and their
        // worker) and are told generation 2; the lost rank's process is stopped.
        assert!(second.start.is_empty(), "{:?}", second.start);
        assert_eq!(second.stop, vec![(id, 1, 1)]);
        let moves: Vec<(Key, u32, u32)> = second
            .moves
            .iter()
            .map(|m| (m.key, m.generation, m.rank))
            .collect();
        assert_eq!(moves, [((id, 1, 0), 2, 0), ((id, 1, 2), 2, 1)]);
        assert!(second.moves[1].line.contains("\"generation\":2"));

        // torchrun (the default): every rank of generation 2 starts again, none reads stdin.
        let (id, first, second) = command_reform("torchrun");
        assert!(first
            .start
            .iter()
            .all(|s| !s.control_stdin && s.protocol.is_none()));
        assert_eq!(second.stop, vec![(id, 1, 0), (id, 1, 1), (id, 1, 2)]);
        let started: Vec<Key> = second.start.iter().map(|s| s.key).collect();
        assert_eq!(started, [(id, 2, 0), (id, 2, 2)]);
        let env: BTreeMap<_, _> = second.start[0].launch.env.iter().cloned().collect();
        assert_eq!(env["RINGLEADER_ELASTIC_PROTOCOL"], "torchrun");
        assert_eq!(env["WORLD_SIZE"], "2");
    }

    #[test]
    fn starts_this_members_ranks_and_stops_them_when_the_attempt_ends() {
        let mut state = ControlState::default();
        let id = chief::submit(&mut state, 1, 2);
        let members = vec![
            chief::member("a", State::Alive, 1),
            chief::member("b", State::Alive, 1),
        ];
        let place = decide(&state, &members, 5, &mut || "ab".repeat(32));
        state.apply(2, &place[0]);
        let me = members[1].id.to_string();
        let host = |_: &str| Some("127.0.0.1".to_string());
        let p = plan(&state, &ctx(&me), &BTreeMap::new(), &host);
        assert_eq!(p.wanted, BTreeSet::from([(id, 1, 1)]));
        let [start] = p.start.as_slice() else {
            panic!("{p:?}")
        };
        assert_eq!(start.key, (id, 1, 1));
        assert_eq!(start.launch.command, vec!["true".to_string()]);
        let env: BTreeMap<_, _> = start.launch.env.iter().cloned().collect();
        assert_eq!(env["RANK"], "1");
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["TORCHELASTIC_RESTART_COUNT"], "0");
        // Running: nothing to start; after the generation fails, it is stopped.
        let have = BTreeMap::from([((id, 1, 1), 1)]);
        assert!(plan(&state, &ctx(&me), &have, &host).start.is_empty());
        state.apply(
            3,
            &ControlCommand {
                op: Op::AttemptFailed(ops::AttemptFailed {
                    id,
                    generation: 1,
                    reason: "test".into(),
                }),
                at_ms: 6,
            },
        );
        let p = plan(&state, &ctx(&me), &have, &host);
        assert_eq!(p.stop, vec![(id, 1, 1)]);
        assert!(p.wanted.is_empty());
    }
}
