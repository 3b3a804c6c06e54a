//! The queue's order and each owner's use, as pure functions of the replicated state: the
//! chief's scheduler (`chief::scheduler`) takes waiting jobs in this order, and the API
//! lists the queue (`ringleader queue`) and the quotas' usage (`ringleader quota ls`) from
//! the same rules, on any node.
//!
//! Order: effective priority, highest first (the spec's `priority` plus
//! [`AGING_POINTS_PER_STEP`] for every full [`AGING_STEP_MS`] waited, at most
//! `PRIORITY_MAX`); then the owner's dominant-resource share per weight, smallest first;
//! then age; then id ([`order_key`]).

use std::collections::BTreeMap;

use crate::{
    spec::priority::PRIORITY_MAX,
    state::{quotas::Quota, ControlState, EventKind, Job, JobId, JobState},
};

/// Priority points a waiting job gains per [`AGING_STEP_MS`] waited.
pub const AGING_POINTS_PER_STEP: u32 = 100;
/// The wait that earns [`AGING_POINTS_PER_STEP`], in milliseconds (an hour).
pub const AGING_STEP_MS: u64 = 3_600_000;

/// The sort key of a waiting job (smaller goes first): effective priority (reversed),
/// share, submit time, id.
pub type OrderKey = (std::cmp::Reverse<u32>, u64, u64, JobId);

/// `priority` raised by the wait since `submitted_at_ms`, at most `PRIORITY_MAX`.
pub fn effective_priority(priority: u32, submitted_at_ms: u64, now_ms: u64) -> u32 {
    let steps = now_ms.saturating_sub(submitted_at_ms) / AGING_STEP_MS;
    let aged = u64::from(priority) + steps.saturating_mul(u64::from(AGING_POINTS_PER_STEP));
    aged.min(u64::from(PRIORITY_MAX)) as u32
}

/// A waiting job's place in the order; `share_ppm` is its owner's [`dominant_share_ppm`].
pub fn order_key(
    priority: u32,
    share_ppm: u64,
    submitted_at_ms: u64,
    id: JobId,
    now_ms: u64,
) -> OrderKey {
    (
        std::cmp::Reverse(effective_priority(priority, submitted_at_ms, now_ms)),
        share_ppm,
        submitted_at_ms,
        id,
    )
}

/// Cpus and GPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    /// Cpus.
    pub cpus: u64,
    /// GPUs.
    pub gpus: u64,
}

/// `used` over `totals` on its dominant resource, per `weight`, in millionths.
pub fn dominant_share_ppm(used: Usage, totals: Usage, weight: u32) -> u64 {
    let share = |used: u64, total: u64| (used * 1_000_000).checked_div(total).unwrap_or(0);
    share(used.cpus, totals.cpus).max(share(used.gpus, totals.gpus)) / u64::from(weight.max(1))
}

/// A user's fair-share weight (1 without a record).
pub fn weight_of(owner: &str, quotas: &BTreeMap<String, Quota>) -> u32 {
    quotas.get(owner).map_or(1, Quota::weight)
}

/// What each owner's running jobs hold now (their current rings and standbys).
pub fn usage_by_owner(state: &ControlState) -> BTreeMap<String, Usage> {
    let mut out: BTreeMap<String, Usage> = BTreeMap::new();
    for job in state.jobs.values().filter(|j| j.state == JobState::Running) {
        let ranks = job.assignment.len() as u64 + u64::from(job.standby.is_some());
        let u = out.entry(job.owner.clone()).or_default();
        u.cpus += ranks * u64::from(job.spec.resources.cpus_per_worker);
        u.gpus += ranks * u64::from(job.spec.resources.gpus_per_worker);
    }
    out
}

/// GPU milliseconds `job` held within `[from_ms, to_ms)`, from its history: each placement
/// or re-form holds its ring's GPUs until the next one or the attempt's end (a failed
/// attempt, a requeue by a preemption, the job's end); a running job's last ring until
/// `to_ms`. History dropped past `EVENTS_PER_JOB_MAX` events, and jobs compacted out of the
/// state, are not counted.
///
/// A requeue logs two `Preempted` events: the ask (the ranks keep their GPUs while they
/// checkpoint and stop) and the requeue itself (they are released; the time the job then
/// waits is not its owner's). The second ends the attempt.
pub fn gpu_ms_in_window(job: &Job, from_ms: u64, to_ms: u64) -> u64 {
    let per_rank = u64::from(job.spec.resources.gpus_per_worker);
    if per_rank == 0 {
        return 0;
    }
    let mut total = 0u64;
    let mut open: Option<(u64, u64)> = None;
    // The attempt's ranks were asked to stop (a requeue's first `Preempted`).
    let mut asked = false;
    let mut close = |open: &mut Option<(u64, u64)>, at: u64| {
        if let Some((since, gpus)) = open.take() {
            let (a, b) = (since.max(from_ms), at.min(to_ms));
            total += b.saturating_sub(a) * gpus;
        }
    };
    for e in &job.events {
        match e.what {
            EventKind::Placed | EventKind::Reformed => {
                close(&mut open, e.at_ms);
                asked &= e.what == EventKind::Reformed;
                open = Some((e.at_ms, e.ring.len() as u64 * per_rank));
            }
            EventKind::Preempted if !asked => asked = true,
            EventKind::Preempted
            | EventKind::AttemptFailed
            | EventKind::Succeeded
            | EventKind::Failed
            | EventKind::Cancelled => {
                close(&mut open, e.at_ms);
                asked = false;
            }
            _ => {}
        }
    }
    if job.state == JobState::Running {
        close(&mut open, to_ms);
    }
    total
}

/// GPU milliseconds each owner with a GPU-hours budget used in the budget's window ending
/// at `now_ms`.
pub fn gpu_ms_by_owner(state: &ControlState, now_ms: u64) -> BTreeMap<String, u64> {
    let from = now_ms.saturating_sub(crate::state::quotas::GPU_HOURS_WINDOW_MS);
    let mut out = BTreeMap::new();
    let budgeted = |owner: &str| {
        state
            .quotas
            .get(owner)
            .is_some_and(|q| q.gpu_hours.is_some())
    };
    if !state.quotas.values().any(|q| q.gpu_hours.is_some()) {
        return out;
    }
    for job in state.jobs.values().filter(|j| budgeted(&j.owner)) {
        *out.entry(job.owner.clone()).or_default() += gpu_ms_in_window(job, from, now_ms);
    }
    out
}

/// The start of a running search's `pending_reason` while its trials wait for the
/// scheduler (`chief::search`).
pub const TRIALS_WAIT: &str = "trials wait: ";

/// Whether `job` is a running search whose trials wait (it has a place in the queue).
pub fn trials_wait(job: &Job) -> bool {
    job.state == JobState::Running
        && job.search.is_some()
        && job
            .pending_reason
            .as_deref()
            .is_some_and(|r| r.starts_with(TRIALS_WAIT))
}

/// The waiting (pending) jobs, and the running searches whose trials wait ([`trials_wait`]:
/// their trials are taken at the search's priority, not aged), in the order the scheduler
/// takes them, given the cluster's `totals` (cpus and GPUs of its usable members).
pub fn waiting_in_order(state: &ControlState, totals: Usage, now_ms: u64) -> Vec<&Job> {
    let used = usage_by_owner(state);
    let share = |owner: &str| {
        let u = used.get(owner).copied().unwrap_or_default();
        dominant_share_ppm(u, totals, weight_of(owner, &state.quotas))
    };
    let searches = state
        .jobs
        .values()
        .filter(|j| j.search.is_some() && trials_wait(j));
    let mut waiting: Vec<(OrderKey, &Job)> = state
        .pending()
        .chain(searches)
        .map(|j| {
            let aged_to = if j.state == JobState::Pending {
                now_ms
            } else {
                j.submitted_at_ms
            };
            let key = order_key(
                j.spec.priority,
                share(&j.owner),
                j.submitted_at_ms,
                j.id,
                aged_to,
            );
            (key, j)
        })
        .collect();
    waiting.sort_by_key(|(key, _)| *key);
    waiting.into_iter().map(|(_, j)| j).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_raises_priority_a_class_an_hour_up_to_the_top() {
        assert_eq!(effective_priority(100, 0, AGING_STEP_MS - 1), 100);
        assert_eq!(effective_priority(100, 0, 4 * AGING_STEP_MS), 500);
        assert_eq!(
            effective_priority(900, 0, 100 * AGING_STEP_MS),
            PRIORITY_MAX
        );
    }

    /// A job requeued for another holds its GPUs until its ranks stop, not while it waits
    /// again (that time was charged to its owner's `--gpu-hours` at its next placement).
    #[test]
    fn a_requeued_jobs_wait_is_not_gpu_time() {
        use crate::state::{ops, users, ControlCommand, JobEvent, Op};
        let mut spec = ops::testing::spec(2, 0);
        spec.resources.gpus_per_worker = 1;
        let mut state = ControlState::default();
        let submit = Op::Submit(ops::Submit {
            spec: Box::new(spec),
            token: None,
            owner: users::admin_user(),
        });
        state.apply(
            1,
            &ControlCommand {
                op: submit,
                at_ms: 0,
            },
        );
        let mut job = state.job(JobId::from_log_index(1)).unwrap().clone();
        let event = |at_ms, what| JobEvent {
            at_ms,
            what,
            generation: 1,
            reason: String::new(),
            ring: match what {
                EventKind::Placed => vec!["a".into(), "b".into()],
                _ => Vec::new(),
            },
        };
        job.events = vec![
            event(0, EventKind::Placed),
            event(10, EventKind::Preempted), // asked: the 2 GPUs held while the ranks stop
            event(30, EventKind::Preempted), // requeued: released
            event(1_000, EventKind::Placed),
        ];
        job.state = JobState::Running;
        assert_eq!(gpu_ms_in_window(&job, 0, 1_100), 2 * 30 + 2 * 100);
        job.state = JobState::Pending;
        job.events.pop();
        assert_eq!(gpu_ms_in_window(&job, 0, 1_100), 2 * 30);
    }

    #[test]
    fn the_dominant_share_is_the_larger_one_per_weight() {
        let totals = Usage { cpus: 10, gpus: 4 };
        let used = Usage { cpus: 1, gpus: 2 };
        assert_eq!(dominant_share_ppm(used, totals, 1), 500_000);
        assert_eq!(dominant_share_ppm(used, totals, 2), 250_000);
        assert_eq!(dominant_share_ppm(used, Usage::default(), 1), 0);
    }
}
