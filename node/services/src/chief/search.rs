//! What the chief decides for running searches (pure, like [`super::decide`]): which trials
//! to start or promote next while the search has fewer than `max_parallel` active trials
//! ([`plan`]: the trials it *wants*, each a gang of its `workers`); on which members, as
//! the scheduler grants them ([`decide_granted`]: a search's trials wait in the queue at
//! the search's priority, under its owner's quota and fair share, like any job; see
//! `scheduler`'s *Search trials*) or, with the first-come placement, where there is room
//! ([`decide`]); a promoted trial's run waits for its last run to end and goes to that
//! run's member, where its checkpoint is ([`placement::place_at_home`]); a speculative
//! copy of a trial that runs slower than `speculate_factor` × the median of its peers'
//! runs to the same target (and at least [`SPECULATE_ELAPSED_MS_MIN`]), on another member
//! with room; why the search's trials wait (its `pending_reason`: `trials wait: …`); and
//! the end of a search when the searcher has nothing more and no trial is active.
//!
//! Everything comes from the replicated record, so a new chief carries on where the old
//! one stopped: the searcher is a pure function of the trial table. Reports and the
//! decisions they trigger are applied by the state machine itself (`domain::state::trials`).

use std::collections::BTreeMap;

use trainer::search::{Params, Suggestion, Trial, TrialState};

use super::placement::{self, place_preferring, take, Candidate, Request};
use crate::domain::{
    queue::TRIALS_WAIT,
    state::{
        ops, trials::searcher_of, ControlCommand, ControlState, Job, JobId, JobState, Op, Slot,
    },
};

/// Fewest finished runs to the same target before a slow trial gets a speculative copy.
pub const SPECULATE_SAMPLES_MIN: usize = 3;
/// A run younger than this never gets a copy, in milliseconds: for runs of a fraction of a
/// second, process start-up and the chief's period alone look "slow".
pub const SPECULATE_ELAPSED_MS_MIN: u64 = 2_000;
/// Most trials one search wants in one pass (the scheduler's entries for it): a search of
/// `max_parallel = 0` (no cap) does not flood the queue. Below it, a search wants one trial
/// more than the free members hold gangs of its request ([`plan`]'s `room`), so a pass can
/// fill an idle cluster: a cap of 8 with 48 free slots started 8 trivial trials a pass
/// and left most slots empty (bench-search's 500 trials at 130-180 a second instead of
/// 276).
pub const TRIAL_WANTS_MAX: usize = 64;

/// A trial a running search would start or promote now.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    /// A new trial, number `trial`.
    New {
        /// Its id (the trials that exist, plus the new ones wanted before it).
        trial: u32,
        /// Its parameters.
        params: Params,
        /// Hyperband bracket (0 otherwise).
        bracket: u32,
        /// Resource to train to.
        target: u32,
    },
    /// A paused trial's next run, towards `target`, on `home` (its last run's member).
    Promote {
        /// Its id.
        trial: u32,
        /// Resource to train to.
        target: u32,
        /// The member holding its checkpoint.
        home: Option<String>,
    },
}

impl Want {
    /// The member it must run on, if any.
    pub fn home(&self) -> Option<&str> {
        match self {
            Want::New { .. } => None,
            Want::Promote { home, .. } => home.as_deref(),
        }
    }
}

/// What a running search wants this pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The search.
    pub search: JobId,
    /// Each trial's request: a gang of the search's `workers`.
    pub request: Request,
    /// The trials it wants, in the searcher's order, at most [`TRIAL_WANTS_MAX`].
    pub wants: Vec<Want>,
    /// The searcher has nothing more and no trial is active: the search ends.
    pub finished: bool,
}

/// What `job` (a running search) wants now: the searcher's suggestions while the search
/// has fewer than `max_parallel` active trials, each taken as started (a promotion whose
/// last run still runs holds its place among `max_parallel` and is no want: it starts in
/// a later pass), at most `room + 1` of them (`room`: the gangs of its request the free
/// members hold now, [`room`]; the one more waits with the reason) and at most
/// [`TRIAL_WANTS_MAX`]. `None` for anything but a running search whose spec reads.
pub fn plan(state: &ControlState, job: &Job, room: usize) -> Option<Plan> {
    if job.state != JobState::Running {
        return None;
    }
    let record = job.search.as_ref()?;
    let (s, searcher) = searcher_of(job)?;
    let cap = if s.max_parallel == 0 {
        usize::MAX
    } else {
        s.max_parallel as usize
    };
    let mut trials: Vec<Trial> = record.trials.clone();
    let mut active = record.active();
    let mut plan = Plan {
        search: job.id,
        request: Request::from_spec(&job.spec),
        wants: Vec::new(),
        finished: false,
    };
    let wants_max = room.saturating_add(1).min(TRIAL_WANTS_MAX);
    while active < cap && plan.wants.len() < wants_max {
        match searcher.suggest(&trials) {
            Suggestion::New {
                params,
                bracket,
                target,
            } => {
                let trial = trials.len() as u32;
                let mut t = Trial::new(trial, params.clone(), bracket, target);
                t.state = TrialState::Running;
                trials.push(t);
                plan.wants.push(Want::New {
                    trial,
                    params,
                    bracket,
                    target,
                });
            }
            Suggestion::Promote { trial, target } => {
                let last = record
                    .runs
                    .get(trial as usize)
                    .and_then(|r| state.job(r.job));
                if let Some(t) = trials.get_mut(trial as usize) {
                    t.state = TrialState::Running;
                    t.target = target;
                }
                // The next run starts once the last has ended (a paused run may still be
                // saving past its rung's report), on the member whose store holds what
                // it saved: it finds all of it.
                if last.is_none_or(|j| j.state.is_terminal()) {
                    let home = last.and_then(|j| j.assignment.first());
                    plan.wants.push(Want::Promote {
                        trial,
                        target,
                        home: home.map(|s| s.member.clone()),
                    });
                }
            }
            Suggestion::Wait => break,
            Suggestion::Exhausted => {
                plan.finished = active == 0;
                break;
            }
        }
        active += 1;
    }
    Some(plan)
}

/// How many gangs of `job`'s request the free `candidates` hold now: an upper bound of
/// the trials a pass can start (a gang may not fit where its workers' room is split).
pub fn room(job: &Job, candidates: &[Candidate]) -> usize {
    let req = Request::from_spec(&job.spec);
    let workers = placement::room(candidates, &req) / u64::from(req.workers.max(1));
    usize::try_from(workers).unwrap_or(usize::MAX)
}

/// What the scheduler granted the searches' wants: slots per (search, want index), and
/// for each search whose wants wait, why its first one does.
#[derive(Debug, Clone, Default)]
pub struct Granted {
    /// The slots of each granted want.
    pub slots: BTreeMap<(JobId, u32), Vec<Slot>>,
    /// Why a search's first waiting want waits.
    pub reasons: BTreeMap<JobId, String>,
}

/// The commands for every running search among `searches` (running jobs; others are
/// skipped), each placing its trials itself on `candidates` in the searcher's order (the
/// first-come placement, `--scheduler fifo`).
pub fn decide<'a>(
    state: &ControlState,
    searches: impl IntoIterator<Item = &'a &'a Job>,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    for job in searches {
        let Some(plan) = plan(state, job, room(job, candidates)) else {
            continue;
        };
        let mut granted = Granted::default();
        let mut news_stop = false;
        for (i, want) in plan.wants.iter().enumerate() {
            let placed = match want {
                Want::New { .. } if news_stop => continue,
                Want::New { .. } => placement::place(candidates, &plan.request),
                Want::Promote { home, .. } => {
                    placement::place_at_home(candidates, &plan.request, home.as_deref())
                }
            };
            match placed {
                Ok(slots) => {
                    take(candidates, &slots, &plan.request);
                    granted.slots.insert((job.id, i as u32), slots);
                }
                Err(e) => {
                    news_stop |= matches!(want, Want::New { .. });
                    granted
                        .reasons
                        .entry(job.id)
                        .or_insert(format!("no room for a trial: {}", e.reason));
                }
            }
        }
        out.extend(carry_out(job, &plan, &mut granted, now_ms, new_secret));
        out.extend(speculation(state, job, candidates, now_ms, new_secret));
    }
    out
}

/// The commands for each search's `plans` given what the scheduler `granted` them;
/// speculative copies on what is left of `candidates`.
pub fn decide_granted(
    state: &ControlState,
    plans: &[(&Job, Plan)],
    mut granted: Granted,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    for (job, plan) in plans {
        out.extend(carry_out(job, plan, &mut granted, now_ms, new_secret));
        out.extend(speculation(state, job, candidates, now_ms, new_secret));
    }
    out
}

/// A search's starts and promotions on the slots `granted` to its wants, its end, and its
/// `pending_reason` ([`TRIALS_WAIT`] and why, while it wants trials and none starts; none
/// once no trial waits). A new trial after one that was not granted does not start (its
/// id would not be the next; a later pass decides again).
fn carry_out(
    job: &Job,
    plan: &Plan,
    granted: &mut Granted,
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    let mut news_stop = false;
    for (i, want) in plan.wants.iter().enumerate() {
        let slots = granted.slots.remove(&(job.id, i as u32));
        let new = matches!(want, Want::New { .. });
        let Some(slots) = slots.filter(|_| !(new && news_stop)) else {
            news_stop |= new;
            continue;
        };
        let op = match want.clone() {
            Want::New {
                trial,
                params,
                bracket,
                target,
            } => Op::TrialStart(ops::TrialStart {
                search: job.id,
                trial,
                params,
                bracket,
                target,
                slots,
                secret: new_secret(),
            }),
            Want::Promote { trial, target, .. } => Op::TrialPromote(ops::TrialPromote {
                search: job.id,
                trial,
                target,
                slots,
                secret: new_secret(),
            }),
        };
        out.push(ControlCommand { op, at_ms: now_ms });
    }
    if plan.finished {
        out.push(ControlCommand {
            op: Op::SearchFinished(ops::SearchFinished { search: job.id }),
            at_ms: now_ms,
        });
    }
    let reason = match granted.reasons.remove(&job.id) {
        _ if !out.is_empty() => None,
        Some(why) if !plan.wants.is_empty() => Some(format!("{TRIALS_WAIT}{why}")),
        _ => None,
    };
    match (reason, &job.pending_reason) {
        (Some(reason), had) if had.as_deref() != Some(reason.as_str()) => {
            out.push(ControlCommand {
                op: Op::Unplaceable(ops::Unplaceable {
                    id: job.id,
                    reason,
                    // Its place in a moving queue changes often: one event per new wait.
                    quiet: had.as_deref().is_some_and(|h| h.starts_with(TRIALS_WAIT)),
                }),
                at_ms: now_ms,
            });
        }
        // Its trials no longer wait (a start or promotion clears it in the state).
        (None, Some(_)) if out.is_empty() => out.push(ControlCommand {
            op: Op::Unplaceable(ops::Unplaceable {
                id: job.id,
                reason: String::new(),
                quiet: true,
            }),
            at_ms: now_ms,
        }),
        _ => {}
    }
    out
}

/// A search's speculative copies, when its spec asks for them.
fn speculation(
    state: &ControlState,
    job: &Job,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let Some((s, _)) = searcher_of(job) else {
        return Vec::new();
    };
    if s.speculate_factor <= 0.0 {
        return Vec::new();
    }
    let req = Request::from_spec(&job.spec);
    speculate(
        state,
        job,
        s.speculate_factor,
        &req,
        candidates,
        now_ms,
        new_secret,
    )
}

/// Speculative copies of running trials slower than `factor` × the median duration of the
/// search's finished runs to the same target.
fn speculate(
    state: &ControlState,
    job: &Job,
    factor: f64,
    req: &Request,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let record = job.search.as_ref().expect("a search");
    let mut out = Vec::new();
    for (t, run) in record.trials.iter().zip(&record.runs) {
        if t.state != TrialState::Running || run.copy.is_some() {
            continue;
        }
        let Some(original) = state.job(run.job).filter(|j| j.state == JobState::Running) else {
            continue;
        };
        let mut peers: Vec<u64> = record
            .runs
            .iter()
            .flat_map(|r| r.run_ms.iter())
            .filter(|(target, _)| *target == t.target)
            .map(|(_, ms)| *ms)
            .collect();
        if peers.len() < SPECULATE_SAMPLES_MIN {
            continue;
        }
        peers.sort_unstable();
        let median = peers[peers.len() / 2] as f64;
        let elapsed_ms = now_ms.saturating_sub(run.run_started_at_ms);
        if median <= 0.0
            || elapsed_ms < SPECULATE_ELAPSED_MS_MIN
            || elapsed_ms as f64 <= factor * median
        {
            continue;
        }
        let avoid = original.assignment.first().map(|s| s.member.as_str());
        let Ok(slots) = place_preferring(candidates, req, None, avoid) else {
            continue;
        };
        take(candidates, &slots, req);
        out.push(ControlCommand {
            op: Op::TrialCopy(ops::TrialCopy {
                search: job.id,
                trial: t.id,
                slots,
                secret: new_secret(),
            }),
            at_ms: now_ms,
        });
    }
    out
}

#[cfg(test)]
mod tests;
