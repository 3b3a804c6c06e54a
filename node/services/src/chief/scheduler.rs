//! The scheduler: which waiting jobs start now, which running elastic jobs grow, why every
//! other waiting job waits, and what lower-priority work should give way, as one pure
//! function, [`schedule`], of the cluster ([`ClusterView`]), the queue ([`QueueView`]) and
//! the time. No I/O, no clock but `now_ms`, no hash-map order: every replica that ran it on
//! the same state would decide alike, so a new chief continues where the old one was.
//!
//! # Order
//!
//! Waiting jobs (and running elastic jobs below `max_workers`, as *growth*, one rank a
//! pass) are taken in this order:
//!
//! 1. **Effective priority**, highest first: the spec's `priority` (`low` 100, `normal` 500,
//!    `high` 900, or 0..=1000) plus [`AGING_POINTS_PER_STEP`] for every full
//!    [`AGING_STEP_MS`] the job has waited since its submit, at most 1000. A low job thus
//!    goes ahead of fresh normal ones after 4 hours of waiting (equal, and older) and of
//!    fresh high ones after 8: no job starves while others come and go. Growth counts at its job's own priority and goes
//!    before waiting jobs of the same priority (a shrunk job grows back before lower or
//!    equal work starts).
//! 2. **Fair share**: the owner's dominant-resource share (the larger of its running cpus
//!    over the cluster's and its GPUs over the cluster's) divided by its weight (`quota set
//!    --weight`, default 1), smallest first, as it was at the start of the pass.
//! 3. **Age**: submitted first goes first; then job id.
//!
//! # Admission of one job
//!
//! - A GPU job of an owner whose rolling GPU-hours budget is spent waits (`gpu-hours of
//!   alice spent (40.0/40.0 in 7 d)`).
//! - **Quota**: the owner's running ranks plus the job's never exceed its quota plus its
//!   borrow limit, per resource, for the user and for its group (`@GROUP`) when that has a
//!   quota. Ranks above the quota are *borrowed*; what a job borrows must fit in capacity
//!   that no other owner's waiting job claims: a job that fits its owner's unused quota
//!   claims what it asks for ([`usage::Claims`]). Borrowed work is what preemption takes
//!   back first.
//!   A growth borrows under the same rule.
//! - **Gang**: a job is placed whole: `workers` ranks, or for an elastic job as many as fit
//!   down to `min_workers`, or none (`gang of 4: at most 3 fit now`).
//! - **Backfill**: a job that cannot start because of capacity *reserves* what it needs
//!   (the first [`RESERVATIONS_MAX`] such jobs, in order) on the cluster as it will be once
//!   running work ends; later jobs start only on what no reservation holds, so a smaller
//!   job runs ahead only when that does not delay the start of a job ahead of it. Those
//!   that wait for a reservation say `position 3 of 5 (priority normal)`.
//!
//! # Search trials
//!
//! A running search that wants more trials (below its `max_parallel`, its searcher has one
//! to start or promote) waits with one entry per trial it wants, up to one more than the
//! free members hold gangs of it and at most `chief::search::TRIAL_WANTS_MAX`
//! ([`Waiting::trial`]): at the search's priority, owner
//! and submit time, each a gang of the search's `workers`, admitted under the same quotas,
//! fair share and reservations as any job. A trial entry does not age (its search has had
//! its start: a search running for hours does not rise above fresh high-priority work),
//! asks for no preemption (a search's wish for another trial stops nobody's work), and
//! only a search's first waiting trial holds a reservation. A promotion's entry goes to
//! its trial's home member (`placement::place_at_home`).
//!
//! # Preemption and growth, as data
//!
//! For the first job that waits for capacity, [`preemption`] picks victims among running
//! preemptible jobs of owners that borrow (taken back first) or of lower priority, by the
//! least work lost: an elastic job above its floor is shrunk, a search gives up trials, a
//! rigid job (or one at its floor) is requeued; just enough to make the job fit, and only
//! if the job would then start on the freed room (the pass run again as the victims would
//! leave the cluster): room claimed by others' quotas, or taken by work ahead of the job,
//! is freed for nobody (`waiting to borrow 1 cpu: preempting would free room claimed by
//! others' quotas`). The requests ([`Preempt`]) and growths ([`Grow`]) are data the chief
//! hands on.

pub mod preemption;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use super::placement::{self, Candidate, Plural, Request};
use crate::domain::{
    queue,
    spec::priority,
    state::{
        quotas::{Quota, GPU_HOURS_WINDOW_MS},
        JobId, Slot,
    },
};
pub use preemption::{Action, Preempt};
pub use usage::Usage;

pub use crate::domain::queue::{AGING_POINTS_PER_STEP, AGING_STEP_MS};
/// Most jobs that hold a reservation at once (later blocked jobs may be passed by backfill
/// until they move up).
pub const RESERVATIONS_MAX: usize = 8;

/// How the chief places waiting jobs (`ringleader node --scheduler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Priorities, quotas, fair share, gang admission and backfill ([`schedule`]).
    #[default]
    Fair,
    /// First come, first served while there is room (the placement before the scheduler,
    /// kept for the sharing benchmark).
    Fifo,
}

impl std::str::FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fair" => Ok(Policy::Fair),
            "fifo" => Ok(Policy::Fifo),
            other => Err(format!("expected fair or fifo, got {other:?}")),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Fair => "fair",
            Policy::Fifo => "fifo",
        })
    }
}

/// The cluster as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct ClusterView<'a> {
    /// Members in (name, id) order, with what running jobs hold.
    pub members: Vec<Candidate>,
    /// The quota registry (`domain::state::quotas`).
    pub quotas: &'a BTreeMap<String, Quota>,
}

/// A job waiting for placement.
#[derive(Debug, Clone)]
pub struct Waiting<'a> {
    /// Its id.
    pub id: JobId,
    /// Its owner.
    pub owner: &'a str,
    /// Its spec's priority.
    pub priority: u32,
    /// When it was submitted (its age; a requeued job keeps it).
    pub submitted_at_ms: u64,
    /// What it asks for at its nominal size (`workers`).
    pub request: Request,
    /// The fewest ranks it starts with (its `min_workers`; `workers` for a rigid job).
    pub min_workers: u32,
    /// A trial's member holding its checkpoint (see `placement::place_at_home`).
    pub home: Option<&'a str>,
    /// Members where its program could not start.
    pub avoid: &'a BTreeSet<String>,
    /// A running search's wanted trial: its index among the trials the search wants this
    /// pass (`id` is then the search's; see the module doc's *Search trials*).
    pub trial: Option<u32>,
}

impl Waiting<'_> {
    /// What it asks for at its floor (`min_workers` ranks): the least it starts with.
    pub fn floor(&self) -> Request {
        Request {
            workers: self.min_workers,
            ..self.request
        }
    }
}

/// A running job, as usage, growth and preemption see it.
#[derive(Debug, Clone)]
pub struct Running<'a> {
    /// Its id.
    pub id: JobId,
    /// Its owner.
    pub owner: &'a str,
    /// Its spec's priority.
    pub priority: u32,
    /// Its ranks now, in rank order.
    pub slots: &'a [Slot],
    /// Cpus per rank.
    pub cpus_per_worker: u32,
    /// GPUs per rank.
    pub gpus_per_worker: u32,
    /// Its floor: an elastic job may shrink to it.
    pub min_workers: u32,
    /// Whether its ring may shrink and grow (`min_workers < workers` or `max_workers >
    /// workers`).
    pub elastic: bool,
    /// Whether it may take a joiner now (elastic, below `max_workers`, nothing lost or
    /// staged); `joiners_exclude` are the members that may not hold its joiner.
    pub may_grow: bool,
    /// The ranks it takes at once when it grows (after a grow, all it lacks; else 1), each
    /// granted only within its owner's quota and others' claims.
    pub grow_by: u32,
    /// Members its joiner may not go to (those in its ring, recently departed ones).
    pub joiners_exclude: BTreeSet<&'a str>,
    /// The search it is a trial of.
    pub trial_of: Option<JobId>,
    /// Whether it may be preempted at all.
    pub preemptible: bool,
    /// When its current run started (what a requeue would lose), ms.
    pub started_at_ms: u64,
    /// Asked to checkpoint and stop (a requeue, a paused trial), for the job named
    /// (`Some(None)`: for none in particular): it is never asked again, and its ranks count
    /// as leaving when that job plans (else each pass would ask one more victim while it
    /// stops).
    pub stopping: Option<Option<JobId>>,
}

/// The queue: waiting and running jobs (in any order: the scheduler sorts), and each
/// owner's GPU use in the budget's window.
#[derive(Debug, Clone, Default)]
pub struct QueueView<'a> {
    /// Jobs waiting for placement.
    pub waiting: Vec<Waiting<'a>>,
    /// Running jobs that hold ranks.
    pub running: Vec<Running<'a>>,
    /// GPU milliseconds each owner with a GPU-hours budget used in the last
    /// [`GPU_HOURS_WINDOW_MS`] (`domain::queue::gpu_ms_by_owner`).
    pub gpu_ms: BTreeMap<String, u64>,
}

/// Start a waiting job on `slots` (a whole gang).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// The job (the search, for a trial).
    pub id: JobId,
    /// The search's wanted trial it starts ([`Waiting::trial`]).
    pub trial: Option<u32>,
    /// Its ranks, in rank order.
    pub slots: Vec<Slot>,
}

/// Grow a running elastic job by one rank (the chief's re-form with a joiner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grow {
    /// The job.
    pub job: JobId,
    /// Its ring size after the growth.
    pub to_workers: u32,
}

/// What kind of wait a reason tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cause {
    /// The owner's GPU-hours budget is spent.
    GpuHours,
    /// The owner's (or its group's) quota plus borrowing is full.
    Quota,
    /// What the job would borrow is claimed by others' quotas.
    Borrow,
    /// The cluster has no room for the gang now.
    Capacity,
    /// It fits, but jobs ahead of it hold reservations.
    Queue,
}

/// Why a waiting job waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// The job (the search, for a trial).
    pub id: JobId,
    /// The search's wanted trial that waits ([`Waiting::trial`]).
    pub trial: Option<u32>,
    /// What kind of wait.
    pub cause: Cause,
    /// One line for humans.
    pub text: String,
}

/// What one pass decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decisions {
    /// The waiting jobs (and searches' trial entries, [`Waiting::trial`]) in the order the
    /// pass took them: the order they start in.
    pub order: Vec<(JobId, Option<u32>)>,
    /// Jobs to start, in start order.
    pub starts: Vec<Start>,
    /// Running jobs to grow by one rank.
    pub grows: Vec<Grow>,
    /// Why each waiting job that does not start waits, in start order.
    pub reasons: Vec<Reason>,
    /// What should give way for the first job that waits for capacity.
    pub preempt: Vec<Preempt>,
    /// The members as the pass leaves them: starts taken, reservations held, growth not
    /// taken (the chief's re-form picks its joiner from these). Speculative copies of
    /// search trials start on what is left here.
    pub left: Vec<Candidate>,
}

/// One entry of the pass: a waiting job or a running job's growth.
enum Entry<'q, 'a> {
    Wait(&'q Waiting<'a>),
    Grow(&'q Running<'a>),
}

/// Decides one pass; see the module doc for the rules.
pub fn schedule(cluster: &ClusterView<'_>, queue: &QueueView<'_>, now_ms: u64) -> Decisions {
    pass(cluster, queue, now_ms, true)
}

/// One pass; with `may_preempt` false it plans no preemption (`preemption::plan` runs the
/// pass again so on what its victims would leave, to see whether its job would start).
fn pass(
    cluster: &ClusterView<'_>,
    queue: &QueueView<'_>,
    now_ms: u64,
    may_preempt: bool,
) -> Decisions {
    let quotas = cluster.quotas;
    let mut ledger = usage::Ledger::of(&queue.running, quotas);
    let totals = usage::totals(&cluster.members);
    let order = ordered(queue, &ledger, &totals, quotas, now_ms);
    let waiting_total = queue.waiting.len();

    // `free`: what is free now, this pass's starts and growth taken. `now`: the same less
    // what reservations hold. `future`: the cluster once running work ends, less this
    // pass's starts, growth and reservations (counts per member).
    let mut free = cluster.members.clone();
    let mut now = cluster.members.clone();
    let mut future = usage::Room::idle(&cluster.members);
    // A job its owner's spent GPU-hours hold back claims nothing: it cannot start.
    let claimants = queue
        .waiting
        .iter()
        .filter(|w| gpu_hours_spent(w, quotas, &queue.gpu_ms).is_none());
    let mut claims = usage::Claims::of(claimants, &cluster.members, &ledger, quotas);
    let mut out = Decisions::default();
    let mut grown: Vec<(Slot, Request)> = Vec::new();
    let mut reservations = 0usize;
    let mut position = 0usize;
    // Whether a waiting job may still plan a preemption, and how many did.
    let mut planning = true;
    let mut plans = 0usize;
    // Searches whose first waiting trial holds a reservation.
    let mut reserved_trials: BTreeSet<JobId> = BTreeSet::new();
    for entry in &order {
        let w = match entry {
            Entry::Grow(r) => {
                let req = one_rank(r);
                // Rank by rank, up to `grow_by`: a growth borrows under the rule a start
                // does, not what another owner's waiting job claims within its quota. Else
                // a borrower's ring shrunk to take its borrowed ranks back for such a job
                // grew (or its owner's other ring did) into the freed room at once, ahead
                // of that job, each pass (bench-sharing, 2026-12-07: carol's job waited
                // 131 s after a shrink).
                let mut granted: Vec<String> = Vec::new();
                while (granted.len() as u32) < r.grow_by.max(1) {
                    if claims
                        .refuses(r.owner, &req, &now, &ledger, quotas)
                        .is_some()
                    {
                        break;
                    }
                    let Some(slot) = grow(r, &req, &now, &ledger, quotas, &granted) else {
                        break;
                    };
                    for view in [&mut free, &mut now] {
                        placement::take(view, std::slice::from_ref(&slot), &req);
                    }
                    future.take(std::slice::from_ref(&slot), &req);
                    ledger.add(r.owner, &req, quotas);
                    granted.push(slot.member.clone());
                    grown.push((slot, req));
                }
                if !granted.is_empty() {
                    out.grows.push(Grow {
                        job: r.id,
                        to_workers: (r.slots.len() + granted.len()) as u32,
                    });
                }
                continue;
            }
            Entry::Wait(w) => w,
        };
        position += 1;
        out.order.push((w.id, w.trial));
        let mut wait = |cause: Cause, text: String| {
            out.reasons.push(Reason {
                id: w.id,
                trial: w.trial,
                cause,
                text,
            })
        };
        if let Some(text) = gpu_hours_spent(w, quotas, &queue.gpu_ms) {
            wait(Cause::GpuHours, text);
            continue;
        }
        let most = ledger.ranks_allowed(w, quotas);
        if most < u64::from(w.min_workers) {
            wait(Cause::Quota, ledger.quota_reason(w, quotas));
            continue;
        }
        // The gang: all `workers`, or for an elastic job what fits down to its floor.
        let room_now = placement::room(&now, &w.request);
        let size = room_now.min(u64::from(w.request.workers)).min(most);
        if size < u64::from(w.min_workers) {
            let floor = w.floor();
            let behind = placement::room(&free, &w.request) >= u64::from(w.min_workers);
            let (cause, mut text) = if behind {
                let label = priority::label(w.priority);
                (
                    Cause::Queue,
                    format!("position {position} of {waiting_total} (priority {label})"),
                )
            } else {
                (Cause::Capacity, capacity_reason(&now, w, room_now))
            };
            let mut held = None;
            if cause == Cause::Capacity && may_preempt && planning && w.trial.is_none() {
                plans += 1;
                let plan = preemption::plan(w, &now, cluster, queue, &ledger, now_ms);
                text = plan.reason(text);
                // Room that would go elsewhere, or no room at all, blocks nobody behind the
                // job: the next job that waits for capacity may plan (its plan is checked
                // the same way: it asks only when it would start on what it frees). A low
                // job aged to the head of the queue finds nothing below its own priority
                // to take, and turned preemption off for every job behind it.
                planning = plans < preemption::PLANS_PER_PASS_MAX
                    && !matches!(plan, preemption::Plan::Asked { .. });
                if let preemption::Plan::Asked { asked, start } = plan {
                    out.preempt = asked;
                    held = Some(start);
                }
            }
            let first_trial = w.trial.is_none_or(|_| reserved_trials.insert(w.id));
            if let Some(start) = held {
                // Preempted for: the room it starts on once the victims are out is held
                // from now on, its free part included, so no job behind it starts there
                // while they leave (bench-sharing, 2026-12-07: a ring shrunk for carol's
                // 3-rank job while a 1-rank job of hers took one of the two slots the
                // search had just freed; the 3-rank job waited 57 s more).
                let mut req = w.request;
                req.workers = start.len() as u32;
                placement::take(&mut now, &start, &req);
                future.take(&start, &req);
                reservations += 1;
            } else if first_trial
                && reservations < RESERVATIONS_MAX
                && future.reserve(&mut now, &floor)
            {
                reservations += 1;
            }
            wait(cause, text);
            continue;
        }
        let mut req = w.request;
        req.workers = size as u32;
        if let Some(text) = claims.refuses(w.owner, &req, &now, &ledger, quotas) {
            wait(Cause::Borrow, text);
            continue;
        }
        match placement::place_job(&now, &req, w.home, w.avoid) {
            Ok(slots) => {
                for view in [&mut free, &mut now] {
                    placement::take(view, &slots, &req);
                }
                future.take(&slots, &req);
                ledger.add(w.owner, &req, quotas);
                claims.started(w.owner, (w.id, w.trial));
                out.starts.push(Start {
                    id: w.id,
                    trial: w.trial,
                    slots,
                });
            }
            Err(e) => wait(Cause::Capacity, e.reason),
        }
    }
    // Growth's room goes back: the re-form picks its joiner from what is left.
    for (slot, req) in &grown {
        if let Some(c) = now.iter_mut().find(|c| c.id == slot.member) {
            c.used_cpus = c.used_cpus.saturating_sub(req.cpus_per_worker);
            for g in &slot.gpus {
                c.used_gpus.remove(g);
            }
        }
    }
    out.left = now;
    out
}

/// One rank of a running job, as growth asks for it.
fn one_rank(r: &Running<'_>) -> Request {
    Request {
        workers: 1,
        cpus_per_worker: r.cpus_per_worker,
        gpus_per_worker: r.gpus_per_worker,
        placement: crate::domain::spec::Placement::Spread,
    }
}

/// The pass's entries in order (see the module doc).
fn ordered<'q, 'a>(
    queue: &'q QueueView<'a>,
    ledger: &usage::Ledger,
    totals: &Usage,
    quotas: &BTreeMap<String, Quota>,
    now_ms: u64,
) -> Vec<Entry<'q, 'a>> {
    // The queue's order (`domain::queue`); growth goes before waiting jobs of its priority;
    // a search's trial entries follow each other in the search's order.
    type Key = (queue::OrderKey, u8, u32);
    let share = |owner: &str| ledger.dominant_share_ppm(owner, totals, quotas);
    let mut keyed: Vec<(Key, Entry<'q, 'a>)> = Vec::new();
    for w in &queue.waiting {
        // A trial entry is not aged: its age is its search's, and no time has passed.
        let aged_to = if w.trial.is_some() {
            w.submitted_at_ms
        } else {
            now_ms
        };
        let key = queue::order_key(w.priority, share(w.owner), w.submitted_at_ms, w.id, aged_to);
        keyed.push(((key, 1, w.trial.unwrap_or(0)), Entry::Wait(w)));
    }
    for r in queue.running.iter().filter(|r| r.may_grow) {
        // Growth is not aged and goes first at its priority: share and age 0.
        let key = (std::cmp::Reverse(r.priority), 0, 0, r.id);
        keyed.push(((key, 0, 0), Entry::Grow(r)));
    }
    keyed.sort_by_key(|(key, _)| *key);
    keyed.into_iter().map(|(_, e)| e).collect()
}

/// Where a growing job's next rank would go: a member outside its exclusions with room
/// outside reservations, within its owner's quota.
fn grow(
    r: &Running<'_>,
    req: &Request,
    now: &[Candidate],
    ledger: &usage::Ledger,
    quotas: &BTreeMap<String, Quota>,
    granted: &[String],
) -> Option<Slot> {
    if !ledger.may_add(r.owner, req, quotas) {
        return None;
    }
    let joiner = now.iter().find(|c| {
        !r.joiners_exclude.contains(c.id.as_str())
            && !granted.contains(&c.id)
            && placement::room(std::slice::from_ref(c), req) >= 1
    })?;
    let gpus: Vec<u32> = placement::free_gpus(joiner)
        .into_iter()
        .take(r.gpus_per_worker as usize)
        .collect();
    Some(Slot {
        member: joiner.id.clone(),
        name: joiner.name.clone(),
        rank: 0,
        local_rank: 0,
        worker: 0,
        gpus,
    })
}

/// The reason a GPU job waits when its owner's GPU-hours are spent.
fn gpu_hours_spent(
    w: &Waiting<'_>,
    quotas: &BTreeMap<String, Quota>,
    gpu_ms: &BTreeMap<String, u64>,
) -> Option<String> {
    if w.request.gpus_per_worker == 0 {
        return None;
    }
    let budget = quotas.get(w.owner)?.gpu_hours?;
    let used = gpu_ms.get(w.owner).copied().unwrap_or(0) as f64 / 3_600_000.0;
    (used >= budget).then(|| {
        format!(
            "gpu-hours of {} spent ({used:.1}/{budget:.1} in {} d)",
            w.owner,
            GPU_HOURS_WINDOW_MS / 86_400_000
        )
    })
}

/// Why a gang does not fit `now`: no member with the GPUs a rank needs, or too few ranks.
fn capacity_reason(now: &[Candidate], w: &Waiting<'_>, room: u64) -> String {
    let req = &w.request;
    let usable = now.iter().filter(|c| c.alive && !c.blacklisted);
    if req.gpus_per_worker > 0 {
        let largest = usable
            .clone()
            .map(|c| placement::free_gpus(c).len())
            .max()
            .unwrap_or(0);
        if largest < req.gpus_per_worker as usize {
            return format!(
                "no member has {} free (largest: {largest})",
                Plural(u64::from(req.gpus_per_worker), "GPU")
            );
        }
    }
    if room == 0 {
        let free: u64 = usable
            .map(|c| u64::from(c.cpus.saturating_sub(c.used_cpus)))
            .sum();
        let need = u64::from(req.cpus_per_worker.max(1)) * u64::from(w.min_workers);
        return format!("waiting for {}: {free} free", Plural(need, "cpu"));
    }
    format!("gang of {}: at most {room} fit now", w.min_workers)
}

#[cfg(test)]
mod tests;
