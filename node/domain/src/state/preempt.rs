//! Preemption's records in the replicated state and the rules that apply its entries
//! ([`PreemptEntry`], `Op::Grow`): a shrunk ring's ceiling and kept batch
//! ([`Preemption`]), a requeue under way ([`Stopping`]). What a preemption does, and the
//! pure function that makes its entries, are `domain::preempt`'s.
//!
//! May use: the state's types (its parent).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{
    ignored, rejected, unknown, ControlResponse, ControlState, EventKind, Job, JobId, JobState,
    Slot, REASON_BYTES_MAX,
};
use crate::spec::JobKind;

/// How long past its grace a requeued job's ranks have to report their exits before the
/// chief ends the attempt without them (a member that died meanwhile, a lost report), ms.
pub const STOP_REPORT_SLACK_MS: u64 = 10_000;

/// What a preemption takes from its victim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptAction {
    /// Shrink an elastic ring to this many workers at a step boundary.
    Shrink {
        /// The ring's size after it: at least `min_workers`, below the current size.
        to_workers: u32,
    },
    /// Checkpoint, stop, and wait in the queue again.
    Requeue,
    /// Pause this many of a search's running trials (each requeued from its checkpoint).
    PauseTrials {
        /// How many, at least 1.
        count: u32,
    },
}

impl PreemptAction {
    /// The label of `ringleader_preemptions_total{action}`.
    pub fn label(self) -> &'static str {
        match self {
            PreemptAction::Shrink { .. } => "shrink",
            PreemptAction::Requeue => "requeue",
            PreemptAction::PauseTrials { .. } => "pause",
        }
    }
}

/// What a shrunk or growing job carries in the replicated state (none once its ring is
/// back to full size).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Preemption {
    /// The chief grows the ring no further than this (below `max_workers`) until a grow
    /// lifts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<u32>,
    /// The world size whose global batch each step keeps (`[elastic] keep_global_batch`):
    /// the ring's size when it was first shrunk. Sent to the ranks in their generation
    /// line; dropped once the ring is that large again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_workers: Option<u32>,
    /// A grow asked with this reason: the chief's next re-forms add joiners up to the
    /// ceiling (or `max_workers`) and say so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growing: Option<String>,
    /// The job the last shrink made room for: the scheduler gives the ring its ranks back
    /// once that job no longer waits (none: an admin's shrink, which only a grow undoes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_job: Option<JobId>,
}

impl Preemption {
    fn is_empty(&self) -> bool {
        self.ceiling.is_none() && self.batch_workers.is_none() && self.growing.is_none()
    }
}

/// A requeue under way: the ranks were asked to checkpoint and stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopping {
    /// When it was asked (proposer's clock, ms).
    pub since_ms: u64,
    /// The ranks' grace before SIGKILL, s (`[preemption] grace_s`).
    pub grace_s: u32,
    /// The history's line start (`preempted for j-12`).
    pub why: String,
    /// The job the capacity is for: the requeued job is not placed while it waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_job: Option<JobId>,
}

impl Stopping {
    /// When the chief stops waiting for the ranks' exits (ms, proposer's clock).
    pub fn overdue_at_ms(&self) -> u64 {
        self.since_ms
            .saturating_add(u64::from(self.grace_s) * 1_000)
            .saturating_add(STOP_REPORT_SLACK_MS)
    }
}

/// Why a preemption cannot be carried out (the API answers 409 with it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No such job.
    #[error("no job {0}")]
    Unknown(JobId),
    /// The job is not running (nothing to take).
    #[error("{id} is {state}, not running: it holds nothing to take")]
    NotRunning {
        /// The job.
        id: JobId,
        /// Its state.
        state: JobState,
    },
    /// The spec says `preemptible = false`.
    #[error("{0} is not preemptible (its spec says preemptible = false)")]
    NotPreemptible(JobId),
    /// Already being requeued.
    #[error("{0} is already checkpointing to be requeued")]
    Stopping(JobId),
    /// A shrink of a job that does not keep its ranks through a re-form.
    #[error("{0} cannot shrink in place (train jobs and command jobs of [elastic] protocol = \"ringleader\" can): requeue it instead")]
    NotElastic(JobId),
    /// A shrink to a size outside `min_workers..current`.
    #[error(
        "{id}: shrink-to {to} must be at least min_workers ({min}) and below its {now} workers"
    )]
    ShrinkSize {
        /// The job.
        id: JobId,
        /// Asked size.
        to: u32,
        /// Its floor.
        min: u32,
        /// Its size now.
        now: u32,
    },
    /// A grow to a size outside `current+1..=max_workers`.
    #[error("{id}: grow to {to} must be above its {now} workers and at most max_workers ({max})")]
    GrowSize {
        /// The job.
        id: JobId,
        /// Asked size.
        to: u32,
        /// Its size now.
        now: u32,
        /// Its ceiling.
        max: u32,
    },
    /// Shrink or requeue of a search, or a pause of a job that is not one.
    #[error("{id}: {problem}")]
    Kind {
        /// The job.
        id: JobId,
        /// What does not fit.
        problem: String,
    },
    /// A pause of a search with no running trial.
    #[error("{0} has no running trial to pause")]
    NoTrials(JobId),
}

/// The checks of a grow to `to_workers`, for the API's answer before it proposes.
pub fn check_grow(state: &ControlState, id: JobId, to_workers: u32) -> Result<(), Refused> {
    let job = state.job(id).ok_or(Refused::Unknown(id))?;
    if job.state != JobState::Running {
        return Err(Refused::NotRunning {
            id,
            state: job.state,
        });
    }
    let now = job.assignment.len() as u32;
    if !job.is_elastic() || to_workers <= now || to_workers > job.spec.max_workers {
        return Err(Refused::GrowSize {
            id,
            to: to_workers,
            now,
            max: job.spec.max_workers,
        });
    }
    Ok(())
}

/// Whether `job` may be preempted at all. Who may set `preemptible = false` is decided at
/// submit (`domain::admission`: admins, and users the admin allowed).
pub(crate) fn check_preemptible(job: &Job) -> Result<(), Refused> {
    if job.state != JobState::Running {
        return Err(Refused::NotRunning {
            id: job.id,
            state: job.state,
        });
    }
    if !job.spec.preemptible {
        return Err(Refused::NotPreemptible(job.id));
    }
    if job.stopping.is_some() {
        return Err(Refused::Stopping(job.id));
    }
    Ok(())
}

pub(crate) fn check_shrink(job: &Job, to: u32) -> Result<(), Refused> {
    let shrinks_in_place = job.is_elastic()
        && job.spec.keeps_ranks_through_reforms()
        && matches!(job.spec.kind, JobKind::Train | JobKind::Command);
    if !shrinks_in_place || job.search.is_some() {
        return Err(Refused::NotElastic(job.id));
    }
    let now = job.assignment.len() as u32;
    if to < job.spec.min_workers || to >= now {
        return Err(Refused::ShrinkSize {
            id: job.id,
            to,
            min: job.spec.min_workers,
            now,
        });
    }
    Ok(())
}

/// `slots` in ring order with ranks `0..n` and local ranks counted per member (a re-form's
/// ring: the chief's and a shrink's).
pub fn reranked(slots: impl IntoIterator<Item = Slot>) -> Vec<Slot> {
    let mut out: Vec<Slot> = Vec::new();
    for mut slot in slots {
        slot.rank = out.len() as u32;
        slot.local_rank = out.iter().filter(|s| s.member == slot.member).count() as u32;
        out.push(slot);
    }
    out
}

/// The log entry of one job's preemption (`Op::Preempt`; its command rules are in
/// `ops/preempt.rs`): a shrink's new generation, or a requeue's request to checkpoint and
/// stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreemptEntry {
    /// The job.
    pub id: JobId,
    /// The generation it was decided in (a later one makes it stale: ignored).
    pub generation: u32,
    /// What it gives up (`shrink` or `requeue`; a pause is a requeue of each trial).
    pub action: PreemptAction,
    /// The job the capacity is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_job: Option<JobId>,
    /// The history's line start: `preempted for j-12`.
    pub why: String,
    /// A shrink: the workers (ids) that leave the ring.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_workers: Vec<u32>,
    /// A shrink: the new generation's data-plane secret (as in `Place`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
}

impl ControlState {
    /// `Preempt`: the whole of one job's preemption, from one entry (see the module doc).
    pub(super) fn preempt(&mut self, e: &PreemptEntry, at_ms: u64) -> ControlResponse {
        let Some(job) = self.jobs.get_mut(&e.id) else {
            return unknown(e.id);
        };
        if job.generation != e.generation || job.state != JobState::Running {
            return ignored(format!(
                "{} is {} in generation {}: a preemption decided in generation {} is stale",
                e.id, job.state, job.generation, e.generation
            ));
        }
        if let Err(r) = check_preemptible(job) {
            return rejected(r.to_string());
        }
        match e.action {
            PreemptAction::Shrink { to_workers } => {
                if let Err(r) = check_shrink(job, to_workers) {
                    return rejected(r.to_string());
                }
                let dropped: BTreeSet<u32> = e.drop_workers.iter().copied().collect();
                let keep: Vec<Slot> = job
                    .assignment
                    .iter()
                    .filter(|s| !dropped.contains(&s.worker))
                    .cloned()
                    .collect();
                let named_all = dropped.len() == e.drop_workers.len()
                    && job.assignment.len() - keep.len() == dropped.len();
                if !named_all || keep.len() != to_workers as usize {
                    return rejected(format!(
                        "{}: a shrink to {to_workers} must name {} distinct workers of the ring to drop",
                        e.id,
                        job.assignment.len() as u32 - to_workers
                    ));
                }
                let from = job.assignment.len() as u32;
                let mut record = job.preemption.take().unwrap_or_default();
                record.ceiling = Some(to_workers);
                record.growing = None;
                record.for_job = e.for_job;
                record.batch_workers = match job.spec.elastic.keep_global_batch {
                    true => Some(record.batch_workers.unwrap_or(from)),
                    false => None,
                };
                job.preemption = Some(record);
                let generation = job.generation + 1;
                job.start_generation(generation, &reranked(keep), &e.secret, at_ms);
                let kept = match job.spec.elastic.keep_global_batch {
                    true => "global batch kept",
                    false => "learning rate rescaled",
                };
                job.push_ring_event(
                    at_ms,
                    EventKind::Reformed,
                    format!("{}: shrunk {from} → {to_workers} ({kept})", e.why),
                );
            }
            PreemptAction::Requeue => {
                let grace_s = job.spec.preemption.grace_s;
                job.stopping = Some(Stopping {
                    since_ms: at_ms,
                    grace_s,
                    why: e.why.clone(),
                    for_job: e.for_job,
                });
                job.push_event(
                    at_ms,
                    EventKind::Preempted,
                    format!(
                        "{}: asked to checkpoint and stop (SIGTERM, SIGKILL after {grace_s} s)",
                        e.why
                    ),
                );
            }
            PreemptAction::PauseTrials { .. } => {
                return rejected(
                    "a pause is logged as a requeue of each trial's job, not as one entry".into(),
                );
            }
        }
        let label = match (e.action, job.trial_of.is_some()) {
            (PreemptAction::Requeue, true) => "pause",
            (action, _) => action.label(),
        };
        *self.preemptions.entry(label.to_owned()).or_default() += 1;
        ControlResponse::Applied
    }

    /// `Grow`: lifts a running elastic job's ceiling to `to_workers`; the chief re-forms
    /// it with joiners up to that size.
    pub(super) fn grow(&mut self, id: JobId, to_workers: u32, reason: &str) -> ControlResponse {
        if let Err(r) = check_grow(self, id, to_workers) {
            return rejected(r.to_string());
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return unknown(id);
        };
        let mut record = job.preemption.take().unwrap_or_default();
        record.ceiling = (to_workers < job.spec.max_workers).then_some(to_workers);
        let mut reason = reason.to_owned();
        super::truncate_at_char(&mut reason, REASON_BYTES_MAX / 2);
        record.growing = Some(reason);
        job.preemption = Some(record);
        ControlResponse::Applied
    }
}

impl Job {
    /// The most workers the chief grows this ring to now: `max_workers`, or a
    /// preemption's ceiling.
    pub fn growth_ceiling(&self) -> u32 {
        let ceiling = self.preemption.as_ref().and_then(|p| p.ceiling);
        ceiling.map_or(self.spec.max_workers, |c| c.min(self.spec.max_workers))
    }

    /// The world size whose global batch the ring's steps keep, when a preemption shrunk
    /// it with `keep_global_batch` (sent to its ranks).
    pub fn batch_workers(&self) -> Option<u32> {
        self.preemption.as_ref().and_then(|p| p.batch_workers)
    }

    /// After a re-form to the current assignment: what of the preemption record still
    /// holds (the ceiling and the kept batch end once the ring is that large again).
    pub(super) fn preemption_after_reform(&mut self) {
        let n = self.assignment.len() as u32;
        let max = self.spec.max_workers;
        if let Some(p) = &mut self.preemption {
            let target = p.ceiling.unwrap_or(max);
            if n >= target {
                p.growing = None;
            }
            if p.ceiling.is_some_and(|c| c >= max) {
                p.ceiling = None;
            }
            if p.batch_workers.is_some_and(|b| n >= b) {
                p.batch_workers = None;
            }
        }
        self.preemption.take_if(|p| p.is_empty());
    }

    /// Ends a requeue (every rank exited, or the chief gave up waiting): the job waits in
    /// the queue again at its old place, without using a restart.
    pub(super) fn requeue(&mut self, at_ms: u64, how: &str) {
        let Some(stopping) = self.stopping.take() else {
            return;
        };
        self.state = JobState::Pending;
        self.requeues = self.requeues.saturating_add(1);
        self.standby = None;
        self.preemption = None;
        self.preempted_for = stopping.for_job;
        let what = match self.trial_of {
            Some(_) => "trial paused",
            None => "requeued",
        };
        self.push_event(
            at_ms,
            EventKind::Preempted,
            format!("{}: {how} and {what}", stopping.why),
        );
    }
}
