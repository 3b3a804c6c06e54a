//! What the chief decides for running searches (pure, like [`super::decide`]): which trial
//! to start or promote next, on which members, while the search has fewer than
//! `max_parallel` active trials and the cluster has room (a promoted trial's run waits
//! for its last run to end and goes to that run's member, where its checkpoint is:
//! [`placement::place_at_home`]); a speculative copy of a trial
//! that runs slower than `speculate_factor` × the median of its peers' runs to the same
//! target (and at least [`SPECULATE_ELAPSED_MS_MIN`]), on another member with room; and
//! the end of a search when the searcher has
//! nothing more and no trial is active.
//!
//! Everything comes from the replicated record, so a new chief carries on where the old
//! one stopped: the searcher is a pure function of the trial table. Reports and the
//! decisions they trigger are applied by the state machine itself (`domain::state::trials`).

use trainer::search::{Suggestion, Trial, TrialState};

use super::placement::{self, place_preferring, take, Candidate, Request};
use crate::domain::state::{
    ops, trials::searcher_of, ControlCommand, ControlState, Job, JobState, Op,
};

/// Fewest finished runs to the same target before a slow trial gets a speculative copy.
pub const SPECULATE_SAMPLES_MIN: usize = 3;
/// A run younger than this never gets a copy, in milliseconds: for runs of a fraction of a
/// second, process start-up and the chief's period alone look "slow".
pub const SPECULATE_ELAPSED_MS_MIN: u64 = 2_000;

/// The commands for every running search among `searches` (running jobs; others are
/// skipped).
pub fn decide<'a>(
    state: &ControlState,
    searches: impl IntoIterator<Item = &'a &'a Job>,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    for job in searches {
        if job.state == JobState::Running && job.search.is_some() {
            out.extend(search(state, job, candidates, now_ms, new_secret));
        }
    }
    out
}

fn search(
    state: &ControlState,
    job: &Job,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let Some((s, searcher)) = searcher_of(job) else {
        return Vec::new();
    };
    let record = job.search.as_ref().expect("a search");
    let req = Request::from_spec(&job.spec);
    let cap = if s.max_parallel == 0 {
        usize::MAX
    } else {
        s.max_parallel as usize
    };
    let mut trials: Vec<Trial> = record.trials.clone();
    let mut active = record.active();
    let mut out = Vec::new();
    let mut unplaceable = None;
    while active < cap {
        match searcher.suggest(&trials) {
            Suggestion::New {
                params,
                bracket,
                target,
            } => {
                let slots = match placement::place(candidates, &req) {
                    Ok(slots) => slots,
                    Err(e) => {
                        unplaceable = Some(e.reason);
                        break;
                    }
                };
                take(candidates, &slots, &req);
                let trial = trials.len() as u32;
                let mut t = Trial::new(trial, params.clone(), bracket, target);
                t.state = TrialState::Running;
                trials.push(t);
                active += 1;
                out.push(ControlCommand {
                    op: Op::TrialStart(ops::TrialStart {
                        search: job.id,
                        trial,
                        params,
                        bracket,
                        target,
                        slots,
                        secret: new_secret(),
                    }),
                    at_ms: now_ms,
                });
            }
            Suggestion::Promote { trial, target } => {
                let last = record
                    .runs
                    .get(trial as usize)
                    .and_then(|r| state.job(r.job));
                let home = last
                    .and_then(|j| j.assignment.first())
                    .map(|s| s.member.as_str());
                // The next run starts once the last has ended (a paused run may still be
                // saving past its rung's report), on the member whose store holds what
                // it saved: it finds all of it.
                let placed = if last.is_some_and(|j| !j.state.is_terminal()) {
                    Err(placement::Unplaceable {
                        reason: "its last run still runs".into(),
                    })
                } else {
                    placement::place_at_home(candidates, &req, home)
                };
                let slots = match placed {
                    Ok(slots) => slots,
                    Err(_) => {
                        // It waits, holding its place among max_parallel, and the searcher
                        // goes on to what comes after it (a new trial on a member with
                        // room); the next round asks again.
                        if let Some(t) = trials.get_mut(trial as usize) {
                            t.state = TrialState::Running;
                        }
                        active += 1;
                        continue;
                    }
                };
                take(candidates, &slots, &req);
                if let Some(t) = trials.get_mut(trial as usize) {
                    t.state = TrialState::Running;
                    t.target = target;
                }
                active += 1;
                out.push(ControlCommand {
                    op: Op::TrialPromote(ops::TrialPromote {
                        search: job.id,
                        trial,
                        target,
                        slots,
                        secret: new_secret(),
                    }),
                    at_ms: now_ms,
                });
            }
            Suggestion::Wait => break,
            Suggestion::Exhausted => {
                if active == 0 && out.is_empty() {
                    out.push(ControlCommand {
                        op: Op::SearchFinished(ops::SearchFinished { search: job.id }),
                        at_ms: now_ms,
                    });
                }
                break;
            }
        }
    }
    if let Some(reason) = unplaceable.filter(|_| active == 0) {
        // No trial runs and none can start: say why on the search, once.
        let reason = format!("no room for a trial: {reason}");
        if job.pending_reason.as_deref() != Some(reason.as_str()) {
            out.push(ControlCommand {
                op: Op::Unplaceable(ops::Unplaceable {
                    id: job.id,
                    reason,
                    quiet: false,
                }),
                at_ms: now_ms,
            });
        }
    }
    if s.speculate_factor > 0.0 {
        out.extend(speculate(
            state,
            job,
            s.speculate_factor,
            &req,
            candidates,
            now_ms,
            new_secret,
        ));
    }
    out
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
