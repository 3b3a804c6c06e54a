//! Preemption, the mechanism: what taking capacity from a running job does to it, decided
//! by [`execute`] (a pure function of the replicated state, called by the admin's API
//! call `ringleader job preempt` today and by the scheduler's decision later) and applied
//! by the state machine from **one log entry per job** ([`Op::Preempt`]), so no replica and
//! no later chief ever sees half of it.
//!
//! What each action does (`docs/book/src/design/design.md`, *Preemption*):
//! - [`PreemptAction::Shrink`]: an elastic job that keeps its ranks through re-forms (a
//!   train job, a command job of `[elastic] protocol = "ringleader"`) above `min_workers`
//!   goes on in a new generation without its highest ranks. The entry names the workers
//!   that leave and the new ring's secret; applying it starts the generation (the
//!   survivors' nodes tell them on stdin, they leave the old ring at a step boundary and
//!   agree on the step they all reached: no step is lost; the leavers' nodes stop them)
//!   and records a ceiling
//!   ([`Preemption::ceiling`](crate::state::preempt::Preemption::ceiling)) so the
//!   chief does not grow the ring back at once. With `[elastic] keep_global_batch` (the
//!   default) the ring keeps the global batch it had
//!   ([`Preemption::batch_workers`](crate::state::preempt::Preemption::batch_workers)):
//!   each survivor accumulates ⌈W/W'⌉ micro-batches per step, so the learning rate and its
//!   schedule stay as they were (exactly when W' divides W; otherwise the batch is
//!   W'·⌈W/W'⌉/W times the old one and the learning rate follows it linearly).
//! - [`PreemptAction::Requeue`]: a job (rigid, or elastic at its floor) is asked to
//!   checkpoint and stop: its ranks get `ringleader-stop` and SIGTERM, and SIGKILL after
//!   `[preemption] grace_s` ([`Stopping`](crate::state::preempt::Stopping)); the
//!   job keeps its slots until every rank has
//!   exited (or the grace and [`STOP_REPORT_SLACK_MS`] are over, when the chief ends the
//!   attempt), then goes back to pending at its old place in the queue (its id), uses none
//!   of its `max_restarts` ([`Job::requeues`]) and resumes from its checkpoint when placed
//!   again. While the job it was preempted for waits, it is not placed ahead of it.
//! - [`PreemptAction::PauseTrials`]: a search gives up its newest running trials: each
//!   trial's job is requeued as above (a checkpoint, then pending), and runs again from
//!   that checkpoint on the member that holds it, as a promotion does.
//!
//! `grow` ([`Op::Grow`]) lifts a shrunk ring's ceiling: the chief re-forms it with joiners
//! up to the new size at the next generation (`grown 2 → 4: capacity returned`).
//!
//! The records and the rules that apply the entries are `domain::state::preempt`'s and the
//! entry's command `domain::state::ops::Preempt`; this module decides entries, above both.
//!
//! May use: `domain::state`.

pub use crate::state::preempt::{
    check_grow, PreemptAction, PreemptEntry, Refused, STOP_REPORT_SLACK_MS,
};
use crate::state::preempt::{check_preemptible, check_shrink};
use crate::state::{
    ControlCommand, ControlState, Job, JobId, JobState, Op, Slot, REASON_BYTES_MAX,
};

/// A preemption as asked: by the admin (`ringleader job preempt`), or by the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preempt {
    /// The job that gives up capacity.
    pub victim: JobId,
    /// What it gives up.
    pub action: PreemptAction,
    /// The job the capacity is for, if any (named in the victim's history).
    pub for_job: Option<JobId>,
    /// Why, for humans (appended to the history's line).
    pub reason: Option<String>,
}

/// The log entries that carry out `ask` on `state` (one per job it changes), or why it
/// cannot be. `new_secret` draws a shrunk ring's secret. Pure: the scheduler calls it
/// inside the chief's decision, the API on its node's replica (a decision on a stale view
/// is ignored by the state machine: the entry names the generation it was decided in).
///
/// A shrink drops the highest ranks (rank 0, which reports and checkpoints, stays).
pub fn execute(
    state: &ControlState,
    ask: &Preempt,
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Result<Vec<ControlCommand>, Refused> {
    let id = ask.victim;
    let job = state.job(id).ok_or(Refused::Unknown(id))?;
    check_preemptible(job)?;
    let why = history_prefix(state, ask);
    let entry = |job: &Job, action, drop_workers: Vec<u32>, secret: String| ControlCommand {
        at_ms: now_ms,
        op: Op::Preempt(PreemptEntry {
            id: job.id,
            generation: job.generation,
            action,
            for_job: ask.for_job,
            why: why.clone(),
            drop_workers,
            secret,
        }),
    };
    match ask.action {
        PreemptAction::Shrink { to_workers } => {
            check_shrink(job, to_workers)?;
            let mut by_rank: Vec<&Slot> = job.assignment.iter().collect();
            by_rank.sort_by_key(|s| s.rank);
            let drop: Vec<u32> = by_rank
                .iter()
                .skip(to_workers as usize)
                .map(|s| s.worker)
                .collect();
            Ok(vec![entry(job, ask.action, drop, new_secret())])
        }
        PreemptAction::Requeue => {
            if job.search.is_some() {
                return Err(Refused::Kind {
                    id,
                    problem: "a search holds no ranks itself: pause its trials".into(),
                });
            }
            Ok(vec![entry(job, ask.action, Vec::new(), String::new())])
        }
        PreemptAction::PauseTrials { count } => {
            if job.search.is_none() {
                return Err(Refused::Kind {
                    id,
                    problem: "only a search's trials can be paused".into(),
                });
            }
            let trials: Vec<&Job> = state
                .jobs
                .values()
                .rev()
                .filter(|t| {
                    t.trial_of.as_ref().is_some_and(|of| of.search == id)
                        && t.state == JobState::Running
                        && t.stopping.is_none()
                        && t.spec.preemptible
                })
                .take(count.max(1) as usize)
                .collect();
            if trials.is_empty() {
                return Err(Refused::NoTrials(id));
            }
            Ok(trials
                .into_iter()
                .map(|t| entry(t, PreemptAction::Requeue, Vec::new(), String::new()))
                .collect())
        }
    }
}

/// `preempted for j-12 (bob, priority high)` (the requester, its owner and priority), or
/// `preempted`, with the
/// asker's reason in parentheses when given.
fn history_prefix(state: &ControlState, ask: &Preempt) -> String {
    let mut why = match ask.for_job {
        Some(j) => match state.job(j) {
            Some(job) => format!(
                "preempted for {j} ({}, priority {})",
                job.owner,
                crate::spec::priority::label(job.spec.priority)
            ),
            None => format!("preempted for {j} (unknown job)"),
        },
        None => "preempted".to_owned(),
    };
    if let Some(r) = ask.reason.as_deref().filter(|r| !r.is_empty()) {
        why.push_str(" (");
        why.push_str(r);
        why.push(')');
    }
    crate::state::truncate_at_char(&mut why, REASON_BYTES_MAX / 2);
    why
}

#[cfg(test)]
mod tests;
