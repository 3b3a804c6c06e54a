//! Which running work gives way to a job that waits for capacity, as requests ([`Preempt`]);
//! the chief hands them to the mechanism that carries them out.
//!
//! A running job is a candidate victim when it is preemptible and either its owner borrows
//! (runs above its quota) while the waiting job's owner would not and its priority is not
//! above the waiting job's, or its priority is below the waiting job's and the waiting job
//! would not borrow, or would but the victim is its own owner's or its owner borrows too (a
//! borrower never takes by priority from another owner's work within its quota).
//!
//! So no two jobs can take each other's ranks in turn: a job taken back (borrowed work, for a
//! job within its quota) is never of higher priority than the job it gave way to, and a job
//! taken by priority is of lower priority and may not take back from a higher one (Kueue's
//! `reclaimWithinCohort: LowerPriority`, with equal priorities reclaimed too). Without the
//! priority bound on taking back, bench-sharing's high job of a borrowing user gave way to a
//! normal job within its owner's quota, took that owner's borrowed ranks back by priority,
//! gave way again, and so on, ten requeues in a minute.
//!
//! Candidates are taken in this order, and only until the waiting job's gang fits:
//!
//! 1. borrowed work first (Kueue's cohorts take borrowing back first);
//! 2. lowest priority first;
//! 3. least work lost: an elastic job above its `min_workers` is shrunk, highest ranks
//!    first, one at a time (its survivors keep their state: nothing lost); then a search's
//!    trial runs are paused (each back to its last checkpoint); then rigid jobs and elastic
//!    ones at their floor are requeued (back to their checkpoint), the youngest run first.
//!
//! When even all candidates would not make room, nothing is asked.
//!
//! # Only for room the job gets
//!
//! Freed room goes to whoever the next pass admits first, not to the job it was freed for.
//! So a choice of victims is planned ([`plan`]) only if the job would start on the room it
//! frees: the pass is run again ([`super::schedule`]'s own rules, no preemption) on the
//! cluster and queue as the victims would leave them (their ranks free, their usage off the
//! ledger, a shrunk ring no growth entry, a requeued job not waiting: it is held for the job
//! it gave way to), and the job must be among its starts. It is not when the freed room is
//! claimed by others' quotas that the job, borrowing, may not use: taking borrowed ranks
//! back puts their owner within its quota, and its waiting jobs then claim what was freed
//! (bench-sharing, 2026-12-07: bob's high job, borrowing, shrank alice's two borrowing
//! rings, alice's rigid job started on the freed slots and bob's still waited); nor when
//! work that goes before the job in the pass (a growth first at its priority, a job that
//! waited on a borrow or a reservation) would take the room first. Then (or when the
//! first choice finds no room), for a job that would borrow, its own owner's lower-priority
//! work alone is tried, until the gang fits and the job no longer borrows (an elastic ring
//! past its floor is then requeued): what that frees, no claim holds back (bench-sharing:
//! bob's high job within his quota, beside his own low train ring). When that does not
//! serve either, nothing is asked and the job says why: `waiting to borrow 1 cpu:
//! preempting would free room claimed by others' quotas`, or `...; preempting would free
//! room that work ahead of it takes`. Such a job blocks nobody's preemption behind it: the
//! next job that waits for capacity is planned for the same way, up to
//! [`PLANS_PER_PASS_MAX`] jobs a pass (a claimant within its quota then takes borrowed work
//! back for itself, rather than a borrower for it).
//!
//! Where the job starts in that second pass ([`Plan::Asked`]'s `start`) is held for it by
//! the pass that asks, the part already free included: a reservation alone lies wherever the
//! job fits once running work ends, and a job behind it could start on the free part while
//! the victims leave, so that the room they free is no longer enough.

use std::collections::BTreeMap;
use std::fmt;

use super::{
    usage::{Ledger, Usage},
    Cause, ClusterView, QueueView, Running, Waiting,
};
use crate::chief::placement::{self, Candidate, Plural, Slot};
use crate::domain::{
    spec::priority,
    state::{quotas::Quota, JobId},
};

/// What a victim is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Re-form an elastic job's ring at a step boundary without its highest ranks.
    Shrink {
        /// Its ring size after.
        to_workers: u32,
    },
    /// Checkpoint, stop and requeue a job at its old place.
    Requeue,
    /// Pause a search's running trials after their checkpoints (back to pending).
    PauseTrials {
        /// How many.
        count: u32,
    },
}

/// A request that `victim` give way for `for_job`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preempt {
    /// The job that gives way (a search, for [`Action::PauseTrials`]).
    pub victim: JobId,
    /// What it does.
    pub action: Action,
    /// The waiting job it makes room for.
    pub for_job: JobId,
    /// The history line's reason: `preempted for j-12 (bob, priority high)`.
    pub reason: String,
}

impl Preempt {
    /// `j-3 (shrink to 2)`, `j-4 (requeue)`, `j-5 (pause 2 trials)`.
    pub fn summary(&self) -> String {
        format!("{} ({})", self.victim, self.action)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Shrink { to_workers } => write!(f, "shrink to {to_workers}"),
            Action::Requeue => f.write_str("requeue"),
            Action::PauseTrials { count } => write!(f, "pause {count} trials"),
        }
    }
}

/// How much work a kind of victim loses (the order of point 3 above).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Loss {
    Shrink,
    Trial,
    Requeue,
}

/// Most waiting jobs one pass plans a preemption for: the first that waits for capacity,
/// and while the room each would free goes elsewhere ([`Plan::Claimed`],
/// [`Plan::TakenAhead`]), the next.
pub const PLANS_PER_PASS_MAX: usize = 4;

/// What preempting for a waiting job comes to ([`plan`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Ask these; the job then starts on `start`, the room they free and what is free now.
    /// The pass holds `start` for the job from now on, so that no job behind it starts on
    /// the part of it that is free already while the victims leave.
    Asked {
        /// The requests.
        asked: Vec<Preempt>,
        /// Where the job starts once they are out (the pass run again).
        start: Vec<Slot>,
    },
    /// No choice of victims makes room for the job.
    NoRoom,
    /// The room the victims would free is claimed by others' quotas, and the job would
    /// borrow this much of it.
    Claimed(Usage),
    /// Work that goes before the job in the pass would take the room first.
    TakenAhead,
}

impl Plan {
    /// The job's pending reason, given the one it waits with (`waiting for 2 cpus: 0 free`).
    pub fn reason(&self, waits: String) -> String {
        match self {
            Plan::Asked { asked, .. } => match asked.first() {
                Some(first) => format!("{waits}; preempting {}", first.summary()),
                None => format!("{waits}; the work preempted for it is stopping"),
            },
            Plan::NoRoom => waits,
            Plan::Claimed(borrowed) => format!(
                "waiting to borrow {}: preempting would free room claimed by others' quotas",
                amount(borrowed)
            ),
            Plan::TakenAhead => {
                format!("{waits}; preempting would free room that work ahead of it takes")
            }
        }
    }
}

/// `3 cpus`, `1 gpu`, `2 cpus and 1 gpu` (as `usage::Claims::refuses` names them).
fn amount(u: &Usage) -> String {
    let cpus = Plural(u.cpus, "cpu");
    let gpus = Plural(u.gpus, "gpu");
    match (u.cpus, u.gpus) {
        (_, 0) => cpus.to_string(),
        (0, _) => gpus.to_string(),
        _ => format!("{cpus} and {gpus}"),
    }
}

/// The victims for `w` (see the module doc), planned only when `w` would start on the room
/// they free: the first choice, else for a job that would borrow its own owner's work alone.
/// `now` is the cluster as the pass has it at `w` (starts and reservations taken); `cluster`
/// and `queue` are the pass's input, run again as the victims would leave them.
pub fn plan(
    w: &Waiting<'_>,
    now: &[Candidate],
    cluster: &ClusterView<'_>,
    queue: &QueueView<'_>,
    ledger: &Ledger,
    now_ms: u64,
) -> Plan {
    let quotas = cluster.quotas;
    let first = victims(w, now, &queue.running, ledger, quotas, now_ms, Among::All);
    let unserved = match &first {
        None => Plan::NoRoom,
        Some(first) => {
            match served(w, first, cluster, queue, now_ms).and_then(|()| held(w, first)) {
                Ok(start) => {
                    return Plan::Asked {
                        asked: first.asked.clone(),
                        start,
                    }
                }
                Err(unserved) => unserved,
            }
        }
    };
    if borrows(w, ledger, quotas) {
        let own = victims(w, now, &queue.running, ledger, quotas, now_ms, Among::Own);
        let differs = |own: &Victims| first.as_ref().is_none_or(|f| f.kept != own.kept);
        if let Some(own) = own.filter(differs) {
            if let Ok(start) = served(w, &own, cluster, queue, now_ms).and_then(|()| held(w, &own))
            {
                return Plan::Asked {
                    asked: own.asked,
                    start,
                };
            }
        }
    }
    unserved
}

/// The room `w` is held on while `v` leaves: placed on the pass's own view with the
/// victims' ranks given back, where the jobs ahead of it in this pass have started. (The
/// pass run again, `served`, says whether it starts; its slots may lie where a job ahead
/// started in this pass, placed elsewhere there: holding those let a job behind take the
/// room `w` needs.)
fn held(w: &Waiting<'_>, v: &Victims) -> Result<Vec<Slot>, Plan> {
    let mut req = w.request;
    req.workers = placement::room(&v.view, &w.request).min(u64::from(w.request.workers)) as u32;
    if req.workers < w.min_workers {
        return Err(Plan::TakenAhead);
    }
    placement::place_job(&v.view, &req, w.home, w.avoid).map_err(|_| Plan::TakenAhead)
}

/// Whether `w` would borrow at its floor.
fn borrows(w: &Waiting<'_>, ledger: &Ledger, quotas: &BTreeMap<String, Quota>) -> bool {
    ledger.borrowed_by(w.owner, &w.floor(), quotas) != Usage::default()
}

/// Whether `w` starts in the pass run again on what `v` leaves (where is `held`'s), else
/// why it does not.
fn served(
    w: &Waiting<'_>,
    v: &Victims,
    cluster: &ClusterView<'_>,
    queue: &QueueView<'_>,
    now_ms: u64,
) -> Result<(), Plan> {
    let mut members = cluster.members.clone();
    let mut running = Vec::with_capacity(queue.running.len());
    for (i, r) in queue.running.iter().enumerate() {
        let Some(&(_, kept)) = v.kept.iter().find(|(at, _)| *at == i) else {
            running.push(r.clone());
            continue;
        };
        r.slots[kept..]
            .iter()
            .for_each(|s| release(&mut members, r, s));
        // A shrunk ring is held at its ceiling while `w` waits (`chief::held_at_ceiling`):
        // no growth entry. A requeued job is held for `w` (`chief::held_for_others`).
        if kept > 0 {
            running.push(Running {
                slots: &r.slots[..kept],
                may_grow: false,
                ..r.clone()
            });
        }
    }
    let after = QueueView {
        waiting: queue.waiting.clone(),
        running,
        gpu_ms: queue.gpu_ms.clone(),
    };
    let cluster = ClusterView {
        members,
        quotas: cluster.quotas,
    };
    let d = super::pass(&cluster, &after, now_ms, false);
    if d.starts.iter().any(|s| s.id == w.id && s.trial == w.trial) {
        return Ok(());
    }
    let cause = d
        .reasons
        .iter()
        .find(|r| r.id == w.id && r.trial == w.trial)
        .map(|r| r.cause);
    Err(match cause {
        Some(Cause::Borrow) => {
            let ledger = Ledger::of(&after.running, cluster.quotas);
            Plan::Claimed(ledger.borrowed_by(w.owner, &w.floor(), cluster.quotas))
        }
        _ => Plan::TakenAhead,
    })
}

/// Which running jobs may be victims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Among {
    /// Every candidate of the module doc's rule.
    All,
    /// Only the waiting job's own owner's.
    Own,
}

/// A choice of victims: the requests, and the ranks each victim keeps (by index in the
/// queue's running jobs; 0 for a requeue or a paused trial).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Victims {
    asked: Vec<Preempt>,
    kept: Vec<(usize, usize)>,
    /// The pass's view at the waiting job with the victims' ranks given back.
    view: Vec<Candidate>,
}

/// The requests that make room for `w` on `now` (`None` when no choice of victims would).
fn victims(
    w: &Waiting<'_>,
    now: &[Candidate],
    running: &[Running<'_>],
    ledger: &Ledger,
    quotas: &BTreeMap<String, Quota>,
    now_ms: u64,
    among: Among,
) -> Option<Victims> {
    let need = u64::from(w.min_workers);
    let req = w.floor();
    let reclaims = ledger.borrowed_by(w.owner, &req, quotas) == Default::default();
    // (not borrowed, priority, loss, work lost, youngest first) and the job's index.
    type Order = (bool, u32, Loss, u64, std::cmp::Reverse<JobId>);
    let mut candidates: Vec<(Order, usize)> = running
        .iter()
        .enumerate()
        .filter(|(_, r)| r.preemptible && !r.slots.is_empty() && r.stopping.is_none())
        .filter(|(_, r)| among == Among::All || r.owner == w.owner)
        .filter_map(|(i, r)| {
            let borrowing = reclaims
                && r.owner != w.owner
                && r.priority <= w.priority
                && ledger.borrowing(r.owner, quotas);
            if !borrowing && r.priority >= w.priority {
                return None;
            }
            // By priority, a job that would borrow takes only from its own owner or from
            // others that borrow too, never from another owner's work within its quota (as
            // Kueue's borrowing preemptor): else a borrower taken back for a job within its
            // quota would take that job's ranks back again by priority, and so on.
            if !borrowing && !reclaims && r.owner != w.owner && !ledger.borrowing(r.owner, quotas) {
                return None;
            }
            let loss = if r.elastic && r.slots.len() as u32 > r.min_workers {
                Loss::Shrink
            } else if r.trial_of.is_some() {
                Loss::Trial
            } else {
                Loss::Requeue
            };
            let lost_ms = match loss {
                Loss::Shrink => 0,
                _ => now_ms.saturating_sub(r.started_at_ms),
            };
            let order = (
                !borrowing,
                r.priority,
                loss,
                lost_ms,
                std::cmp::Reverse(r.id),
            );
            Some((order, i))
        })
        .collect();
    candidates.sort_by_key(|(order, _)| *order);

    // Enough: the gang fits; for own work alone, also the job no longer borrows (else what
    // is freed may be claimed by others' quotas again), as far as own work goes.
    let mut left_ledger = ledger.clone();
    let mut view = now.to_vec();
    let mut kept: Vec<(usize, usize)> = Vec::new();
    // Jobs already stopping for `w` (or for none in particular) leave without being asked.
    for (i, r) in running.iter().enumerate() {
        if r.stopping.is_some_and(|f| f.is_none_or(|f| f == w.id)) {
            r.slots.iter().for_each(|s| release(&mut view, r, s));
            left_ledger.remove(r.owner, &super::one_rank(r), r.slots.len() as u64, quotas);
            kept.push((i, 0));
        }
    }
    let enough = |view: &[Candidate], left_ledger: &Ledger| {
        placement::room(view, &w.request) >= need
            && (among == Among::All
                || left_ledger.borrowed_by(w.owner, &req, quotas) == Usage::default())
    };
    let reason = format!(
        "preempted for {} ({}, priority {})",
        w.id,
        w.owner,
        priority::label(w.priority)
    );
    let mut out: Vec<Preempt> = Vec::new();
    let mut paused: BTreeMap<JobId, u32> = BTreeMap::new();
    for ((_, _, loss, _, _), i) in candidates {
        if enough(&view, &left_ledger) {
            break;
        }
        let r = &running[i];
        let rank = super::one_rank(r);
        let free = |view: &mut Vec<Candidate>, ledger: &mut Ledger, slots: &[placement::Slot]| {
            slots.iter().for_each(|s| release(view, r, s));
            ledger.remove(r.owner, &rank, slots.len() as u64, quotas);
        };
        match loss {
            Loss::Shrink => {
                // Own work is shrunk past its floor when that is not enough: it is then
                // requeued (a ring does not run below its floor).
                let floor = match among {
                    Among::All => r.min_workers,
                    Among::Own => 0,
                };
                let mut left = r.slots.len();
                while left as u32 > floor && !enough(&view, &left_ledger) {
                    free(&mut view, &mut left_ledger, &r.slots[left - 1..left]);
                    left -= 1;
                }
                if (left as u32) < r.min_workers {
                    free(&mut view, &mut left_ledger, &r.slots[..left]);
                    left = 0;
                }
                kept.push((i, left));
                let action = match left {
                    0 => Action::Requeue,
                    _ => Action::Shrink {
                        to_workers: left as u32,
                    },
                };
                out.push(Preempt {
                    victim: r.id,
                    action,
                    for_job: w.id,
                    reason: reason.clone(),
                });
            }
            Loss::Trial => {
                free(&mut view, &mut left_ledger, r.slots);
                kept.push((i, 0));
                *paused.entry(r.trial_of.expect("a trial")).or_default() += 1;
            }
            Loss::Requeue => {
                free(&mut view, &mut left_ledger, r.slots);
                kept.push((i, 0));
                out.push(Preempt {
                    victim: r.id,
                    action: Action::Requeue,
                    for_job: w.id,
                    reason: reason.clone(),
                });
            }
        }
    }
    if placement::room(&view, &w.request) < need {
        return None;
    }
    for (search, count) in paused {
        out.push(Preempt {
            victim: search,
            action: Action::PauseTrials { count },
            for_job: w.id,
            reason: reason.clone(),
        });
    }
    Some(Victims {
        asked: out,
        kept,
        view,
    })
}

/// Gives `slot` of `r` back to its member in `view`.
fn release(view: &mut [Candidate], r: &Running<'_>, slot: &placement::Slot) {
    if let Some(c) = view.iter_mut().find(|c| c.id == slot.member) {
        c.used_cpus = c.used_cpus.saturating_sub(r.cpus_per_worker);
        for g in &slot.gpus {
            c.used_gpus.remove(g);
        }
    }
}
