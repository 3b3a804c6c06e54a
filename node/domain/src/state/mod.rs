//! The replicated control state: a deterministic value that every replica builds by applying
//! the same committed [`ControlCommand`]s in log order.
//!
//! Contract for determinism: [`ControlState::apply`] reads nothing but its arguments (no clock,
//! no randomness, no hash-map iteration order); time comes in the command (`at_ms`, the
//! proposer's clock) and job ids come from the log index of the `Submit` entry.
//!
//! Job lifecycle (the only legal transitions):
//!
//! ```text
//!                      Reform (elastic: a new generation of the survivors, or with a joiner)
//!                      +--+
//!                      v  |
//! pending --Place--> running --all ranks exit 0--> succeeded
//!    ^                  |
//!    |  attempt failed  |  (a rank exits non-zero, or AttemptFailed)
//!    +---- retry -------+  while restarts used < max_restarts, else --> failed
//!                          (and the failure does not repeat the last attempt's: `failure`)
//! pending | running --Cancel--> cancelled
//! ```
//!
//! Two counters, both from 1. An *attempt* runs from durable state (the start, or a retry
//! from the last checkpoint); only a new attempt uses up one of `max_restarts`. A
//! *generation* is one formation of the ring: every placement starts one, and so does every
//! [`Op::Reform`] of an elastic job (a member lost, hung or blacklisted, or one
//! that joins), inside the same attempt. Processes, ports, secrets and reports are keyed by
//! generation: a report (exit, failure, metric) naming another generation than the current
//! one is stale and ignored, so a slow report of an old generation can never end the new one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rand::RngCore;
use serde::{Deserialize, Serialize};

pub mod compaction;
pub mod datasets;
pub mod failure;
pub mod key_epoch;
pub mod ops;
pub mod preempt;
pub mod quotas;
pub mod removal;
pub mod standby;
pub mod tokens;
pub mod trials;
pub mod user_limits;
pub mod users;

pub use self::datasets::DatasetRecord;
pub use self::ops::{Command, Op, Origin, Stamp};
pub use crate::id::{BadJobId, JobId};
use crate::{
    search::record::{SearchRecord, TrialOf},
    spec::{JobSpec, GPUS_PER_WORKER_MAX, WORKERS_MAX},
};

/// Most events kept per job; older ones are dropped (and counted).
pub const EVENTS_PER_JOB_MAX: usize = 256;
/// Most distinct metric names per job; new names beyond it are ignored.
pub const METRICS_PER_JOB_MAX: usize = 256;
/// Longest metric name, in bytes.
pub const METRIC_NAME_BYTES_MAX: usize = 128;
/// Most points kept in one metric's history ([`MetricHistory`]). The history lives in the
/// replicated state and its snapshots, so it is kept small: a train job's 7 metrics take
/// about 50 KB of JSON at most.
pub const METRIC_HISTORY_POINTS_MAX: usize = 256;
/// Longest reason kept in an event, in bytes (longer ones are cut at a char boundary).
pub const REASON_BYTES_MAX: usize = 1024;
/// Longest submit token, in bytes.
pub const TOKEN_BYTES_MAX: usize = 128;

/// [`Job::state_text`] of a trial's job its search stopped.
pub const STOPPED_BY_SEARCH: &str = "stopped";

/// Where a job is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for placement (new, or between attempts).
    Pending,
    /// A generation is placed and its workers run.
    Running,
    /// Every rank of the current generation exited 0.
    Succeeded,
    /// The last allowed attempt failed.
    Failed,
    /// Cancelled by a user.
    Cancelled,
}

impl JobState {
    /// The spelling used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Succeeded, failed or cancelled: nothing changes it any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The job entered the log.
    Submitted,
    /// A generation was placed (reason: "start" or "retry …").
    Placed,
    /// An elastic job's ring re-formed as a new generation inside its attempt (reason:
    /// `peer-lost <member> (rank r)`, `hung …`, `straggler …`, `joined …`).
    Reformed,
    /// The job could not be placed (reason: why); recorded when the reason changes.
    Unplaceable,
    /// A rank of the current generation exited.
    WorkerExited,
    /// The current attempt failed and will be retried.
    AttemptFailed,
    /// The job succeeded.
    Succeeded,
    /// The job failed for good.
    Failed,
    /// The job was cancelled.
    Cancelled,
    /// A rank's note (a dataset fetched before it started).
    Note,
    /// A search's trial started, reported a rung, was promoted, paused, stopped, re-run,
    /// copied or failed (on the search job); a trial's job was re-opened to run again (on
    /// the trial's job).
    Trial,
    /// The job was preempted: asked to checkpoint and stop, then requeued (a shrink is a
    /// `reformed` event whose reason starts `preempted`).
    Preempted,
}

/// One line of a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    /// Proposer's wall clock, ms since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    pub what: EventKind,
    /// Generation it concerns (0 before the first placement).
    pub generation: u32,
    /// Why, for humans.
    pub reason: String,
    /// The ring, member names in rank order, for `Placed` and `Reformed` events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ring: Vec<String>,
}

/// The latest value of one metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Value (finite).
    pub value: f64,
    /// Step it was measured at, if the worker said.
    pub step: Option<u64>,
    /// Generation that reported it.
    pub generation: u32,
    /// When it was committed (proposer's clock, ms since the Unix epoch).
    pub at_ms: u64,
}

/// One metric's history, bounded by [`METRIC_HISTORY_POINTS_MAX`] points.
///
/// When full it drops every other point and from then on keeps one report in twice as
/// many (`stride` doubles): the whole run's curve keeps its shape at a coarser grain, and
/// points stay evenly spaced in reports. The latest value is always in `Job::metrics`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MetricHistory {
    /// Points kept, oldest first: (the step it was reported at, or the report's sequence
    /// number among this metric's reports when it came without one; the value).
    pub points: Vec<(u64, f64)>,
    /// Reports seen: the next report's sequence number.
    pub reports: u64,
    /// One report in `stride` is kept (a power of two; 0 reads as 1).
    pub stride: u64,
}

impl MetricHistory {
    /// Records one report. Invariant: `points.len() <= METRIC_HISTORY_POINTS_MAX`.
    pub fn record(&mut self, step: Option<u64>, value: f64) {
        let seq = self.reports;
        self.reports += 1;
        self.stride = self.stride.max(1);
        if !seq.is_multiple_of(self.stride) {
            return;
        }
        if self.points.len() >= METRIC_HISTORY_POINTS_MAX {
            self.points = self.points.iter().step_by(2).copied().collect();
            self.stride *= 2;
            if !seq.is_multiple_of(self.stride) {
                return;
            }
        }
        self.points.push((step.unwrap_or(seq), value));
        debug_assert!(self.points.len() <= METRIC_HISTORY_POINTS_MAX);
    }
}

/// One job's replicated record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// The user it belongs to (see [`users`]): the submitting token's user; a trial's job,
    /// its search's owner; a job of a log from before owners, [`users::ADMIN_USER`].
    #[serde(
        default = "users::admin_user",
        skip_serializing_if = "users::is_admin_user"
    )]
    pub owner: String,
    /// The spec as submitted.
    pub spec: JobSpec,
    /// Lifecycle state.
    pub state: JobState,
    /// Current generation of the ring, 1-based; 0 while never placed.
    pub generation: u32,
    /// Current attempt, 1-based; 0 while never placed. `attempt - 1` restarts are used.
    #[serde(default)]
    pub attempt: u32,
    /// The generation the current attempt was placed in: train ranks keep their process
    /// through the attempt's re-forms, so their processes and logs are keyed by it.
    #[serde(default)]
    pub attempt_generation: u32,
    /// Ranks of the current generation reported lost while their member lives (a peer saw
    /// the connection break, or the rank's node saw its process stopped), with the report:
    /// the chief re-forms without them.
    #[serde(default)]
    pub suspects: BTreeMap<u32, Suspect>,
    /// Each rank's latest step timing in the current generation (straggler detection).
    #[serde(default)]
    pub rank_stats: BTreeMap<u32, RankStat>,
    /// Members that left the current attempt's ring, and when (proposer's clock, ms): one
    /// may join again the spec's `elastic.rejoin_after_s` later
    /// ([`Elastic::rejoin_after_ms`](crate::spec::Elastic::rejoin_after_ms)).
    #[serde(default)]
    pub departed: BTreeMap<String, u64>,
    /// The next unused worker id of the current attempt (a joiner's).
    #[serde(default)]
    pub next_worker: u32,
    /// Restarts allowed (from the spec): attempts `1..=max_restarts + 1`.
    pub max_restarts: u32,
    /// Workers of the current (or last) generation, in rank order.
    pub assignment: Vec<Slot>,
    /// Exit codes reported by ranks of the current generation.
    pub exits: BTreeMap<u32, i32>,
    /// Why the job is pending, when it could not be placed.
    pub pending_reason: Option<String>,
    /// History, oldest first, at most [`EVENTS_PER_JOB_MAX`].
    pub events: Vec<JobEvent>,
    /// Events dropped from the front of `events`.
    pub events_dropped: u64,
    /// Latest value per metric name.
    pub metrics: BTreeMap<String, Metric>,
    /// Each metric's bounded history (names as in `metrics`).
    #[serde(default)]
    pub metric_history: BTreeMap<String, MetricHistory>,
    /// The shared secret of the current generation's data-plane connections, drawn at random by
    /// the chief at placement. It lives only in the replicated log and state, which travel
    /// only between members (over the swarm, keyed when the cluster has a key), and in the
    /// environment of the generation's workers; the API never shows it. A new generation gets a new
    /// one, so a stale worker cannot join the next ring.
    #[serde(default)]
    pub ring_secret: String,
    /// When the submit was committed.
    pub submitted_at_ms: u64,
    /// When the first generation was placed.
    pub started_at_ms: Option<u64>,
    /// When the job reached a terminal state.
    pub finished_at_ms: Option<u64>,
    /// A search job's trials (`kind = "search"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchRecord>,
    /// A trial's run job: which search and trial it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial_of: Option<TrialOf>,
    /// Members (peer ids) where a rank of this job could not start its program (missing,
    /// not executable): a retried attempt is placed on other members when it fits there.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub cannot_start: BTreeSet<String>,
    /// A joiner started ahead of the re-form that takes it into the ring (see
    /// [`standby`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standby: Option<standby::Standby>,
    /// A preemption's lasting effect on a running elastic ring: its ceiling, the global
    /// batch it keeps, a grow under way (see [`preempt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<preempt::Preemption>,
    /// A requeue under way: the ranks were asked to checkpoint and stop (see [`preempt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopping: Option<preempt::Stopping>,
    /// Attempts ended by a preemption's requeue: they use none of `max_restarts`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub requeues: u32,
    /// A requeued job waits while the job it was preempted for is pending (cleared when it
    /// is placed again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_for: Option<JobId>,
    /// A trial's job its search stopped (ASHA, the median rule, a speculative copy that
    /// lost its race): cancelled in [`state`](Job::state), shown as `stopped`
    /// ([`Job::state_text`]). Set when the search's decision is applied, so a log from
    /// before the field replays to it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped_by_search: bool,
    /// The first `step` metric of the current generation: (generation, step, at_ms), what
    /// the step rate of a job's progress is measured from (`api::status::progress`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step: Option<(u32, u64, u64)>,
    /// Why its latest failed attempts failed, oldest first, at most
    /// [`failure::FAILURES_KEPT`] (see [`failure`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<failure::Failure>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Why a rank of the current generation is thought lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    /// Its process lives but makes no progress (stopped); else its connection broke.
    pub hung: bool,
    /// What was seen, by whom.
    pub reason: String,
}

/// A rank's step timing as it last reported it (`ringleader-rank-stats` lines, about once a
/// second, averaged over the steps since the previous report).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankStat {
    /// Steps done.
    pub step: u64,
    /// Compute time per step (forward, backward, optimizer), ms.
    pub compute_ms: f64,
    /// Time per step waiting for the network, ms.
    pub wait_ms: f64,
    /// The step since which the rank has been slower than `straggler_factor` × the median
    /// of the others, if it is now.
    pub slow_since_step: Option<u64>,
}

/// A member kept out of new rings for a while (a straggler), cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blacklisting {
    /// Its name when it was blacklisted.
    pub name: String,
    /// Until when (proposer's clock, ms since the Unix epoch).
    pub until_ms: u64,
    /// How many times it was blacklisted: the cooldown doubles each time.
    pub strikes: u32,
    /// Why, for humans.
    pub reason: String,
}

/// Longest blacklisting, whatever the strikes, in milliseconds (a day).
pub const BLACKLIST_MS_MAX: u64 = 86_400_000;

impl Job {
    /// A new pending job of `owner`, submitted at `at_ms`.
    pub(super) fn new(id: JobId, spec: JobSpec, owner: &str, at_ms: u64) -> Job {
        Job {
            id,
            owner: owner.to_owned(),
            max_restarts: spec.max_restarts,
            spec,
            state: JobState::Pending,
            generation: 0,
            attempt: 0,
            attempt_generation: 0,
            suspects: BTreeMap::new(),
            rank_stats: BTreeMap::new(),
            departed: BTreeMap::new(),
            next_worker: 0,
            assignment: Vec::new(),
            exits: BTreeMap::new(),
            pending_reason: None,
            events: Vec::new(),
            events_dropped: 0,
            metrics: BTreeMap::new(),
            metric_history: BTreeMap::new(),
            ring_secret: String::new(),
            submitted_at_ms: at_ms,
            started_at_ms: None,
            finished_at_ms: None,
            search: None,
            trial_of: None,
            cannot_start: BTreeSet::new(),
            standby: None,
            preemption: None,
            stopping: None,
            requeues: 0,
            preempted_for: None,
            stopped_by_search: false,
            first_step: None,
            failures: Vec::new(),
        }
    }

    /// Its state as the API spells it: [`JobState::as_str`], but `stopped` for a trial's
    /// job its search stopped ([`Job::stopped_by_search`]), which users read as an outcome
    /// of the search, not a cancel of theirs.
    pub fn state_text(&self) -> &'static str {
        if self.state == JobState::Cancelled && self.stopped_by_search {
            STOPPED_BY_SEARCH
        } else {
            self.state.as_str()
        }
    }

    /// The generation this job's rank processes are keyed by: train ranks, and command ranks
    /// of `[elastic] protocol = "ringleader"`, live through the re-forms of an attempt
    /// (survivors keep their state in memory), other command ranks are started again at
    /// each generation with the new `WORLD_SIZE` (torchrun's elastic semantics).
    pub fn process_generation(&self) -> u32 {
        if self.spec.keeps_ranks_through_reforms() {
            self.attempt_generation
        } else {
            self.generation
        }
    }

    /// Starts generation `generation` on `slots`: the ring, its secret and the per-generation
    /// records.
    fn start_generation(&mut self, generation: u32, slots: &[Slot], secret: &str, at_ms: u64) {
        for old in &self.assignment {
            if !slots.iter().any(|s| s.member == old.member) {
                self.departed.insert(old.member.clone(), at_ms);
            }
        }
        self.generation = generation;
        // A standby this ring takes in is a rank now (one it leaves out stays staged).
        self.standby
            .take_if(|s| slots.iter().any(|slot| slot.worker == s.slot.worker));
        let past = slots.iter().map(|s| s.worker.saturating_add(1)).max();
        self.next_worker = self.next_worker.max(past.unwrap_or(0));
        self.assignment = slots.to_vec();
        self.ring_secret = secret.to_owned();
        self.exits.clear();
        self.suspects.clear();
        self.rank_stats.clear();
    }

    pub(super) fn push_event(&mut self, at_ms: u64, what: EventKind, reason: impl Into<String>) {
        let mut reason = reason.into();
        truncate_at_char(&mut reason, REASON_BYTES_MAX);
        self.events.push(JobEvent {
            at_ms,
            what,
            generation: self.generation,
            reason,
            ring: Vec::new(),
        });
        if self.events.len() > EVENTS_PER_JOB_MAX {
            let extra = self.events.len() - EVENTS_PER_JOB_MAX;
            self.events.drain(..extra);
            self.events_dropped += extra as u64;
        }
    }

    pub(super) fn finish(
        &mut self,
        at_ms: u64,
        state: JobState,
        what: EventKind,
        reason: impl Into<String>,
    ) {
        debug_assert!(state.is_terminal() && !self.state.is_terminal());
        self.state = state;
        self.finished_at_ms = Some(at_ms);
        self.pending_reason = None;
        self.standby = None;
        self.stopping = None;
        self.preemption = None;
        self.push_event(at_ms, what, reason);
    }

    /// Starts the next generation as a new attempt on `slots` (a placement: `why` is
    /// `start`, `retry`, or a trial's `promoted …`).
    pub(super) fn place(&mut self, slots: &[Slot], secret: &str, at_ms: u64, why: &str) {
        let first = self.generation == 0;
        let generation = self.generation + 1;
        self.next_worker = 0;
        self.standby = None;
        self.stopping = None;
        self.preemption = None;
        self.preempted_for = None;
        self.start_generation(generation, slots, secret, at_ms);
        self.departed.clear();
        self.attempt += 1;
        self.attempt_generation = generation;
        self.state = JobState::Running;
        self.pending_reason = None;
        self.finished_at_ms = None;
        if first {
            self.started_at_ms = Some(at_ms);
        }
        let ring: Vec<&str> = slots.iter().map(|s| s.name.as_str()).collect();
        self.push_ring_event(
            at_ms,
            EventKind::Placed,
            format!("{why}: {} workers on {}", slots.len(), ring.join(", ")),
        );
    }

    /// Records a new ring (a placement or a re-form) as an event with its members.
    fn push_ring_event(&mut self, at_ms: u64, what: EventKind, reason: String) {
        self.push_event(at_ms, what, reason);
        if let Some(last) = self.events.last_mut() {
            last.ring = self.assignment.iter().map(|s| s.name.clone()).collect();
        }
    }

    /// Restarts used: attempts after the first, less those a preemption's requeue ended.
    pub fn restarts_used(&self) -> u32 {
        self.attempt.saturating_sub(1).saturating_sub(self.requeues)
    }

    /// Whether the job's ring may shrink or grow instead of restarting: `min_workers <
    /// workers` or `max_workers > workers`.
    pub fn is_elastic(&self) -> bool {
        self.spec.min_workers < self.spec.workers || self.spec.max_workers > self.spec.workers
    }

    /// Ends the current attempt as failed: retry (back to pending) or fail the job.
    fn fail_attempt(&mut self, at_ms: u64, reason: String) {
        debug_assert_eq!(self.state, JobState::Running);
        if self.stopping.is_some() {
            // A preemption's requeue the ranks did not finish reporting: it still uses no
            // restart.
            self.requeue(at_ms, &format!("stopped ({reason})"));
            return;
        }
        // A standby belongs to the attempt.
        self.standby = None;
        self.preemption = None;
        // No rank's end caused it (a member lost, too few ranks left): the reason is.
        self.note_failure(failure::Failure::of_reason(self.attempt, &reason));
        let restarts_used = self.restarts_used();
        if let Some(same) = self
            .repeated_failure()
            .filter(|_| restarts_used < self.max_restarts)
        {
            // Deterministic: another retry would fail the same way.
            let why = format!(
                "{reason}; not retried: the same failure twice ({})",
                same.cause()
            );
            self.finish(at_ms, JobState::Failed, EventKind::Failed, why);
        } else if restarts_used < self.max_restarts {
            self.state = JobState::Pending;
            self.push_event(
                at_ms,
                EventKind::AttemptFailed,
                format!(
                    "{reason}; retrying (restart {} of {})",
                    restarts_used + 1,
                    self.max_restarts
                ),
            );
        } else {
            let why = if self.max_restarts == 0 {
                format!("{reason}; no restarts allowed")
            } else {
                format!("{reason}; all {} restarts used", self.max_restarts)
            };
            self.finish(at_ms, JobState::Failed, EventKind::Failed, why);
        }
    }
}

/// A change to the control state, as committed in the Raft log: what changes ([`Op`]) and
/// when, on the proposer's clock.
///
/// Commands carry the proposer's clock (`at_ms`) so every replica records the same times.
/// Reports from workers carry the generation they belong to; stale ones are ignored.
///
/// In the log (JSON) a command is one object: its operation's `op` tag and fields, with
/// `at_ms` among them, where it always was (the last field, and after `spec` in a submit):
/// the serde impls below write that form and read it, so logs and snapshots written before
/// the envelope still load (`node/tests/control_format.rs` pins the bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlCommand {
    /// Proposer's clock, ms since the Unix epoch.
    pub at_ms: u64,
    /// What changes.
    pub op: Op,
}

impl ControlCommand {
    /// `op` at the proposer's time `at_ms`.
    pub fn new(at_ms: u64, op: Op) -> ControlCommand {
        ControlCommand { at_ms, op }
    }
}

impl Serialize for ControlCommand {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// Any operation, `at_ms` after its fields.
        #[derive(Serialize)]
        struct Stamped<'a> {
            #[serde(flatten)]
            op: &'a Op,
            at_ms: u64,
        }
        /// A submit, whose `at_ms` came before its token (and its owner, when not the
        /// admin: a submit from before owners keeps its bytes).
        #[derive(Serialize)]
        struct Submitted<'a> {
            op: &'static str,
            spec: &'a JobSpec,
            at_ms: u64,
            #[serde(skip_serializing_if = "Option::is_none")]
            token: &'a Option<String>,
            #[serde(skip_serializing_if = "is_admin_owner")]
            owner: &'a str,
        }
        fn is_admin_owner(owner: &&str) -> bool {
            users::is_admin_user(owner)
        }
        match &self.op {
            Op::Submit(ops::Submit { spec, token, owner }) => Submitted {
                op: "submit",
                spec,
                at_ms: self.at_ms,
                token,
                owner,
            }
            .serialize(serializer),
            op => Stamped {
                op,
                at_ms: self.at_ms,
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ControlCommand {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Stamped {
            #[serde(flatten)]
            op: Op,
            at_ms: u64,
        }
        let Stamped { op, at_ms } = Stamped::deserialize(deserializer)?;
        Ok(ControlCommand { at_ms, op })
    }
}

/// One worker of a placed job.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slot {
    /// Peer id of the member that runs the worker.
    pub member: String,
    /// That member's name when the job was placed (for `ring` in the API).
    pub name: String,
    /// Rank in the ring, 0-based; rank 0 is the job's chief worker.
    pub rank: u32,
    /// Rank among the job's workers on the same member, 0-based.
    pub local_rank: u32,
    /// The worker's id within its attempt: its rank when placed, kept through re-forms (its
    /// rank may change); a joiner gets the next unused id.
    #[serde(default)]
    pub worker: u32,
    /// The member's GPUs given to this worker, by device index: chosen at placement (the
    /// lowest-indexed ones no running job's slot on the member holds), kept through
    /// re-forms. While the job runs, no other slot on the member holds any of them.
    #[serde(default)]
    pub gpus: Vec<u32>,
}

/// What the slots of running jobs hold on one member.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Cpus (`cpus_per_worker` per slot).
    pub cpus: u32,
    /// GPUs, by device index.
    pub gpus: BTreeSet<u32>,
}

/// A command a proposer must not put in the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadCommand {
    /// A metric value is NaN or infinite (the log is JSON, which cannot hold it).
    #[error("metric {name:?}: value must be finite")]
    NonFiniteMetric {
        /// The metric.
        name: String,
    },
    /// A metric name is empty or longer than [`METRIC_NAME_BYTES_MAX`].
    #[error("metric name must be 1 to {METRIC_NAME_BYTES_MAX} bytes")]
    MetricName,
    /// A submit token that is empty or longer than [`TOKEN_BYTES_MAX`].
    #[error("submit token must be 1 to {TOKEN_BYTES_MAX} bytes")]
    Token,
    /// A placement whose slots are not ranks `0..n` or more than [`WORKERS_MAX`].
    #[error("placement slots must have ranks 0..n in order, at most {WORKERS_MAX}")]
    Slots,
    /// A placement that gives a slot more than [`GPUS_PER_WORKER_MAX`] GPUs, or one GPU of a
    /// member to two slots.
    #[error("placement slots must hold at most {GPUS_PER_WORKER_MAX} gpus each, no gpu of a member twice")]
    Gpus,
    /// A placement whose secret is not [`RING_SECRET_HEX_LEN`] lowercase hex digits.
    #[error("placement secret must be {RING_SECRET_HEX_LEN} lowercase hex digits")]
    Secret,
    /// A `Compact` naming more than `compaction::COMPACT_IDS_MAX` jobs.
    #[error("compact: more than {} jobs", compaction::COMPACT_IDS_MAX)]
    Compact,
    /// A dataset name outside the naming rule (`datasets::check_name`).
    #[error("{0}")]
    DatasetName(String),
    /// A token name outside `tokens::check_token_name`, or a hash that is not one.
    #[error("token {0}")]
    TokenField(String),
    /// A removal naming something that is not a peer id.
    #[error("member remove: {0:?} is not a peer id")]
    PeerId(String),
    /// A key switch whose fingerprint or epoch is not one.
    #[error("{0}")]
    KeySwitch(String),
    /// A preemption's or grow's reason longer than [`REASON_BYTES_MAX`].
    #[error("reason: at most {REASON_BYTES_MAX} bytes")]
    Reason,
    /// A submit whose owner is not a user name (`tokens::check_token_name`).
    #[error("owner: {0}")]
    Owner(String),
    /// A quota naming no user, or a field out of its bound (named).
    #[error("quota {0}")]
    QuotaField(String),
}

/// Length of a ring secret in hex digits (32 bytes).
pub const RING_SECRET_HEX_LEN: usize = 64;

/// A new ring secret: 32 bytes from the operating system's generator, as hex.
pub fn new_ring_secret() -> String {
    let mut bytes = [0u8; RING_SECRET_HEX_LEN / 2];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ControlCommand {
    /// Checks what the log format and `apply` need (its [`Command::check`]); proposers call
    /// it before proposing.
    pub fn check(&self) -> Result<(), BadCommand> {
        self.op.command().check()
    }

    /// Who may propose it (its [`Command::origin`]).
    pub fn origin(&self) -> Origin<'_> {
        self.op.command().origin()
    }
}

/// What applying a command did; returned to the proposer through Raft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum ControlResponse {
    /// A job was created.
    Submitted {
        /// Its id.
        id: JobId,
    },
    /// The command changed the state.
    Applied,
    /// The command was a no-op: a stale or duplicate report (normal, not an error).
    Ignored {
        /// Why.
        reason: String,
    },
    /// The command is not allowed in the current state (unknown job, job already finished,
    /// a placement for the wrong generation, …). Nothing changed.
    Rejected {
        /// Why.
        reason: String,
    },
    /// A Raft entry without a command (blank or membership).
    Empty,
}

/// The replicated state machine's data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlState {
    /// All jobs by id (ordered by submission).
    pub jobs: BTreeMap<JobId, Job>,
    /// Largest `at_ms` of any applied command: how fresh this replica is, on the proposer's
    /// clock.
    pub applied_at_ms: u64,
    /// Log index of the last applied command (0 if none).
    pub applied_index: u64,
    /// Submit tokens seen, with the job each created (see `Op::Submit`).
    #[serde(default)]
    pub tokens: BTreeMap<String, JobId>,
    /// Blacklisted members by peer id (expired entries are kept for their strikes).
    #[serde(default)]
    pub blacklist: BTreeMap<String, Blacklisting>,
    /// The dataset registry: name → what it names (see `domain::state::datasets`).
    #[serde(default)]
    pub datasets: BTreeMap<String, DatasetRecord>,
    /// API tokens by name, each kept as its hash (see `domain::state::tokens`).
    #[serde(default)]
    pub api_tokens: BTreeMap<String, tokens::TokenRecord>,
    /// Members removed from the cluster, by peer id (see `domain::state::removal`).
    #[serde(default)]
    pub removed: BTreeMap<String, removal::Removal>,
    /// The cluster key's epoch since its last rotation (`None`: never rotated; see
    /// `domain::state::key_epoch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<key_epoch::KeyEpoch>,
    /// Quotas, weights and priority ceilings by user (and `@group`; see
    /// `domain::state::quotas`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub quotas: BTreeMap<String, quotas::Quota>,
    /// Preemptions applied, by action (`shrink`, `requeue`, `pause`): the counter
    /// `ringleader_preemptions_total`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub preemptions: BTreeMap<String, u64>,
}

impl ControlState {
    /// Applies the command committed at `log_index`. Deterministic; never panics on any input
    /// (bad commands are `Rejected`, stale reports and replays of indexes at or below
    /// `applied_index` are `Ignored`).
    pub fn apply(&mut self, log_index: u64, cmd: &ControlCommand) -> ControlResponse {
        if log_index <= self.applied_index {
            // A replay of an entry already in this state (e.g. after a restart): no effect.
            return ignored(format!("log index {log_index} already applied"));
        }
        self.applied_index = log_index;
        self.applied_at_ms = self.applied_at_ms.max(cmd.at_ms);
        if let Err(e) = cmd.check() {
            return ControlResponse::Rejected {
                reason: e.to_string(),
            };
        }
        cmd.op.command().apply(
            self,
            Stamp {
                log_index,
                at_ms: cmd.at_ms,
            },
        )
    }

    /// The job whose generation `generation` is about to start, if it is `state` and that is
    /// its next generation; otherwise the response, made by `refuse` (a placement that does
    /// not fit is rejected; a re-form, decided on a view the log has moved past, ignored).
    /// `what` names the command in the message.
    pub(super) fn next_generation(
        &mut self,
        id: JobId,
        generation: u32,
        state: JobState,
        what: &str,
        refuse: fn(String) -> ControlResponse,
    ) -> Result<&mut Job, ControlResponse> {
        let job = self.jobs.get_mut(&id).ok_or_else(|| unknown(id))?;
        if job.state != state {
            return Err(refuse(format!("{id} is {}, not {state}", job.state)));
        }
        if generation != job.generation + 1 {
            return Err(refuse(format!(
                "{id}: {what} generation {generation}, expected {}",
                job.generation + 1
            )));
        }
        Ok(job)
    }

    /// The job, if `generation` is its current generation and it is running; otherwise the response
    /// to give (unknown job: rejected; stale generation or finished job: ignored).
    pub(super) fn current_attempt(
        &mut self,
        id: JobId,
        generation: u32,
    ) -> Result<&mut Job, ControlResponse> {
        let job = self.jobs.get_mut(&id).ok_or_else(|| unknown(id))?;
        if generation != job.generation {
            return Err(ignored(format!(
                "stale report for generation {generation}; current is {}",
                job.generation
            )));
        }
        if job.state != JobState::Running {
            return Err(ignored(format!("{id} is {}", job.state)));
        }
        Ok(job)
    }

    /// A job by id.
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// Pending jobs in submission order (the chief places them in this order).
    pub fn pending(&self) -> impl Iterator<Item = &Job> + '_ {
        self.jobs.values().filter(|j| j.state == JobState::Pending)
    }

    /// Whether `member` is blacklisted at `now_ms`.
    pub fn is_blacklisted(&self, member: &str, now_ms: u64) -> bool {
        self.blacklist
            .get(member)
            .is_some_and(|b| b.until_ms > now_ms)
    }

    /// What the slots of running jobs' current generations hold on each member (by peer
    /// id), for placement: a job that ends, or an attempt that fails, holds nothing.
    pub fn used_resources(&self) -> BTreeMap<String, Held> {
        let mut used: BTreeMap<String, Held> = BTreeMap::new();
        for job in self.jobs.values().filter(|j| j.state == JobState::Running) {
            for slot in &job.assignment {
                let held = used.entry(slot.member.clone()).or_default();
                held.cpus = held.cpus.saturating_add(job.spec.resources.cpus_per_worker);
                held.gpus.extend(&slot.gpus);
            }
        }
        used
    }

    /// Why a placement's `slots` cannot have their GPUs: one is held by a slot of another
    /// running job (not `own`, the job being placed or re-formed) on the same member (a
    /// decision made on a stale view). Keeps "no two ranks share a GPU" whatever the proposer
    /// saw.
    pub(super) fn gpu_taken(&self, own: Option<JobId>, slots: &[Slot]) -> Option<String> {
        if slots.iter().all(|s| s.gpus.is_empty()) {
            return None;
        }
        let others = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Running && Some(j.id) != own);
        for job in others {
            for held in &job.assignment {
                for slot in slots.iter().filter(|s| s.member == held.member) {
                    if let Some(gpu) = slot.gpus.iter().find(|g| held.gpus.contains(g)) {
                        return Some(format!(
                            "gpu {gpu} of {} is held by {} (rank {})",
                            slot.name, job.id, held.rank
                        ));
                    }
                }
            }
        }
        None
    }
}

pub(super) fn unknown(id: JobId) -> ControlResponse {
    ControlResponse::Rejected {
        reason: format!("no job {id}"),
    }
}

pub(super) fn rejected(reason: String) -> ControlResponse {
    ControlResponse::Rejected { reason }
}

pub(super) fn ignored(reason: String) -> ControlResponse {
    ControlResponse::Ignored { reason }
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
pub fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

#[cfg(test)]
mod tests;
