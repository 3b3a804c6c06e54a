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

use std::collections::BTreeMap;
use std::fmt;

use super::{usage::Ledger, Running, Waiting};
use crate::chief::placement::{self, Candidate};
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

/// The requests that make room for `w` on `now` (empty when no choice of victims would).
pub fn victims(
    w: &Waiting<'_>,
    now: &[Candidate],
    running: &[Running<'_>],
    ledger: &Ledger,
    quotas: &BTreeMap<String, Quota>,
    now_ms: u64,
) -> Vec<Preempt> {
    let need = u64::from(w.min_workers);
    let mut req = w.request;
    req.workers = w.min_workers;
    let reclaims = ledger.borrowed_by(w.owner, &req, quotas) == Default::default();
    // (not borrowed, priority, loss, work lost, youngest first) and the job.
    type Order = (bool, u32, Loss, u64, std::cmp::Reverse<JobId>);
    let mut candidates: Vec<(Order, &Running<'_>)> = running
        .iter()
        .filter(|r| r.preemptible && !r.slots.is_empty())
        .filter_map(|r| {
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
            Some((order, r))
        })
        .collect();
    candidates.sort_by_key(|(order, _)| *order);

    let mut view = now.to_vec();
    let reason = format!(
        "preempted for {} ({}, priority {})",
        w.id,
        w.owner,
        priority::label(w.priority)
    );
    let mut out: Vec<Preempt> = Vec::new();
    let mut paused: BTreeMap<JobId, u32> = BTreeMap::new();
    for ((_, _, loss, _, _), r) in candidates {
        if placement::room(&view, &w.request) >= need {
            break;
        }
        match loss {
            Loss::Shrink => {
                let mut left = r.slots.len() as u32;
                for slot in r.slots.iter().rev() {
                    if left <= r.min_workers {
                        break;
                    }
                    release(&mut view, r, slot);
                    left -= 1;
                    if placement::room(&view, &w.request) >= need {
                        break;
                    }
                }
                out.push(Preempt {
                    victim: r.id,
                    action: Action::Shrink { to_workers: left },
                    for_job: w.id,
                    reason: reason.clone(),
                });
            }
            Loss::Trial => {
                r.slots.iter().for_each(|s| release(&mut view, r, s));
                *paused.entry(r.trial_of.expect("a trial")).or_default() += 1;
            }
            Loss::Requeue => {
                r.slots.iter().for_each(|s| release(&mut view, r, s));
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
        return Vec::new();
    }
    for (search, count) in paused {
        out.push(Preempt {
            victim: search,
            action: Action::PauseTrials { count },
            for_job: w.id,
            reason: reason.clone(),
        });
    }
    out
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
