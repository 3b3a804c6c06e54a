//! What the chief decides for running searches (pure, like [`super::decide`]): which trial
//! to start or promote next, on which members, while the search has fewer than
//! `max_parallel` active trials and the cluster has room; a speculative copy of a trial
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
use crate::domain::state::{trials::searcher_of, ControlCommand, ControlState, Job, JobState, Op};

/// Fewest finished runs to the same target before a slow trial gets a speculative copy.
pub const SPECULATE_SAMPLES_MIN: usize = 3;
/// A run younger than this never gets a copy, in milliseconds: for runs of a fraction of a
/// second, process start-up and the chief's period alone look "slow".
pub const SPECULATE_ELAPSED_MS_MIN: u64 = 2_000;

/// The commands for every running search.
pub fn decide(
    state: &ControlState,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    for job in state.jobs.values() {
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
                    op: Op::TrialStart {
                        search: job.id,
                        trial,
                        params,
                        bracket,
                        target,
                        slots,
                        secret: new_secret(),
                    },
                    at_ms: now_ms,
                });
            }
            Suggestion::Promote { trial, target } => {
                let last = record
                    .runs
                    .get(trial as usize)
                    .and_then(|r| state.job(r.job))
                    .and_then(|j| j.assignment.first())
                    .map(|s| s.member.clone());
                let slots = match place_preferring(candidates, &req, last.as_deref(), None) {
                    Ok(slots) => slots,
                    Err(e) => {
                        unplaceable = Some(e.reason);
                        break;
                    }
                };
                take(candidates, &slots, &req);
                if let Some(t) = trials.get_mut(trial as usize) {
                    t.state = TrialState::Running;
                    t.target = target;
                }
                active += 1;
                out.push(ControlCommand {
                    op: Op::TrialPromote {
                        search: job.id,
                        trial,
                        target,
                        slots,
                        secret: new_secret(),
                    },
                    at_ms: now_ms,
                });
            }
            Suggestion::Wait => break,
            Suggestion::Exhausted => {
                if active == 0 && out.is_empty() {
                    out.push(ControlCommand {
                        op: Op::SearchFinished { search: job.id },
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
                op: Op::Unplaceable { id: job.id, reason },
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
            op: Op::TrialCopy {
                search: job.id,
                trial: t.id,
                slots,
                secret: new_secret(),
            },
            at_ms: now_ms,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::{
        chief::tests::member,
        cluster::{membership::State, net::MemberView},
        domain::state::{ControlResponse, JobId},
        jobs::JobSpec,
    };

    const GRID: &str = r#"
name = "g"
kind = "search"
command = ["true"]
[search]
trial = "command"
algorithm = "grid"
max_parallel = 2
metric = "m"
direction = "max"
speculate_factor = 2.0
[[search.params]]
name = "x"
type = "discrete"
values = [1, 2, 3, 4]
"#;

    fn secret() -> String {
        "ab".repeat(32)
    }

    /// Applies `cmds` at the next log indexes.
    fn apply(state: &mut ControlState, cmds: &[ControlCommand]) {
        for cmd in cmds {
            let index = state.applied_index + 1;
            let r = state.apply(index, cmd);
            assert!(
                !matches!(r, ControlResponse::Rejected { .. }),
                "{cmd:?}: {r:?}"
            );
        }
    }

    fn candidates_of(state: &ControlState, members: &[MemberView]) -> Vec<Candidate> {
        super::super::candidates(state, members, 0)
    }

    fn submit(state: &mut ControlState) -> JobId {
        let spec = Box::new(JobSpec::parse(GRID).unwrap());
        match state.apply(
            1,
            &ControlCommand {
                op: Op::Submit { spec, token: None },
                at_ms: 1,
            },
        ) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }

    /// The trial jobs' exits, each 0.
    fn exits(state: &ControlState, search: JobId, at_ms: u64) -> Vec<ControlCommand> {
        let record = state.job(search).unwrap().search.as_ref().unwrap();
        record
            .runs
            .iter()
            .filter_map(|r| state.job(r.job))
            .filter(|j| j.state == JobState::Running)
            .map(|j| ControlCommand {
                op: Op::WorkerExited {
                    id: j.id,
                    generation: j.generation,
                    rank: 0,
                    code: 0,
                },
                at_ms,
            })
            .collect()
    }

    #[test]
    fn trials_start_up_to_max_parallel_and_the_search_ends_after_the_last() {
        let mut state = ControlState::default();
        let search = submit(&mut state);
        let members = vec![member("a", State::Alive, 4), member("b", State::Alive, 4)];
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 10, &mut secret);
        assert_eq!(cmds.len(), 2, "max_parallel = 2: {cmds:?}");
        let nodes: BTreeSet<String> = cmds
            .iter()
            .map(|c| match c {
                ControlCommand {
                    op: Op::TrialStart { slots, .. },
                    ..
                } => slots[0].name.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(nodes.len(), 2, "spread over the members");
        apply(&mut state, &cmds);
        let mut c = candidates_of(&state, &members);
        assert!(
            decide(&state, &mut c, 20, &mut secret).is_empty(),
            "at the cap"
        );
        // Both end; two more start; they end; the grid is done and the search ends.
        let done = exits(&state, search, 30);
        apply(&mut state, &done);
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 40, &mut secret);
        assert_eq!(cmds.len(), 2, "{cmds:?}");
        apply(&mut state, &cmds);
        let done = exits(&state, search, 50);
        apply(&mut state, &done);
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 60, &mut secret);
        assert!(
            matches!(
                cmds.as_slice(),
                [ControlCommand {
                    op: Op::SearchFinished { .. },
                    ..
                }]
            ),
            "{cmds:?}"
        );
        apply(&mut state, &cmds);
        let job = state.job(search).unwrap();
        // Its trials exited 0 without reporting the metric: nothing to rank, the search
        // failed, saying so.
        assert_eq!(job.state, JobState::Failed, "{:?}", job.events);
        let last = &job.events.last().unwrap().reason;
        assert!(last.starts_with("no trial reported"), "{last}");
        let xs: Vec<i64> = job
            .search
            .as_ref()
            .unwrap()
            .trials
            .iter()
            .map(|t| t.params["x"].as_integer().unwrap())
            .collect();
        assert_eq!(xs, [1, 2, 3, 4], "the grid, in order");
    }

    #[test]
    fn a_member_that_joins_mid_search_gets_the_next_trials() {
        let mut state = ControlState::default();
        submit(&mut state);
        let mut members = vec![member("a", State::Alive, 1)];
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 10, &mut secret);
        assert_eq!(cmds.len(), 1, "one cpu: one trial: {cmds:?}");
        apply(&mut state, &cmds);
        let mut c = candidates_of(&state, &members);
        assert!(
            decide(&state, &mut c, 20, &mut secret).is_empty(),
            "no room"
        );
        members.push(member("b", State::Alive, 1));
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 30, &mut secret);
        let [ControlCommand {
            op: Op::TrialStart {
                trial: 1, slots, ..
            },
            ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert_eq!(slots[0].name, "b");
    }

    #[test]
    fn a_trial_much_slower_than_its_peers_gets_a_copy_on_another_member() {
        let mut state = ControlState::default();
        let search = submit(&mut state);
        let members = vec![member("a", State::Alive, 4), member("b", State::Alive, 4)];
        // Trials 0 and 1 start at 10; trial 0 ends at 110 (100 ms).
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 10, &mut secret);
        apply(&mut state, &cmds);
        let first: Vec<ControlCommand> = exits(&state, search, 110).into_iter().take(1).collect();
        apply(&mut state, &first);
        // Trial 2 starts at 110 and ends at 210; trial 3 at 210 and ends at 310.
        for t in [110, 210] {
            let mut c = candidates_of(&state, &members);
            let cmds: Vec<_> = decide(&state, &mut c, t, &mut secret)
                .into_iter()
                .filter(|c| {
                    matches!(
                        c,
                        ControlCommand {
                            op: Op::TrialStart { .. },
                            ..
                        }
                    )
                })
                .collect();
            assert_eq!(cmds.len(), 1, "{cmds:?}");
            apply(&mut state, &cmds);
            let record = state.job(search).unwrap().search.as_ref().unwrap();
            let newest = record.runs.last().unwrap().job;
            let generation = state.job(newest).unwrap().generation;
            apply(
                &mut state,
                &[ControlCommand {
                    op: Op::WorkerExited {
                        id: newest,
                        generation,
                        rank: 0,
                        code: 0,
                    },
                    at_ms: t + 100,
                }],
            );
        }
        // Trial 1 still runs at 2010 ms: over 2 × the 100 ms median (and the 2 s floor), a
        // copy away from it; at 1500 ms not yet.
        let mut c = candidates_of(&state, &members);
        assert!(decide(&state, &mut c, 1_500, &mut secret).is_empty());
        let mut c = candidates_of(&state, &members);
        let cmds = decide(&state, &mut c, 2_010, &mut secret);
        let record = state.job(search).unwrap().search.as_ref().unwrap();
        let slow_node = state.job(record.runs[1].job).unwrap().assignment[0]
            .member
            .clone();
        let [ControlCommand {
            op: Op::TrialCopy {
                trial: 1, slots, ..
            },
            ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert_ne!(slots[0].member, slow_node);
        apply(&mut state, &cmds);
        let mut c = candidates_of(&state, &members);
        assert!(
            decide(&state, &mut c, 2_100, &mut secret).is_empty(),
            "one copy at a time"
        );
    }
}
