use std::collections::BTreeSet;

use super::*;
use crate::{
    chief::tests::member,
    cluster::{membership::State, net::MemberView},
    domain::state::{ControlResponse, JobId},
    jobs::JobSpec,
};

/// [`super::decide`] over every job of `state`.
fn decide(
    state: &ControlState,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let jobs: Vec<&Job> = state.jobs.values().collect();
    super::decide(state, &jobs, candidates, now_ms, new_secret)
}

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
    submit_spec(state, GRID)
}

/// Submits the search `spec` as the admin.
fn submit_spec(state: &mut ControlState, spec: &str) -> JobId {
    let spec = Box::new(JobSpec::parse(spec).unwrap());
    match state.apply(
        1,
        &ControlCommand {
            op: Op::Submit(ops::Submit {
                spec,
                token: None,
                owner: crate::domain::state::users::admin_user(),
            }),
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
            op: Op::WorkerExited(ops::WorkerExited {
                id: j.id,
                generation: j.generation,
                rank: 0,
                code: 0,
                end: None,
            }),
            at_ms,
        })
        .collect()
}

/// A search of 500 trivial trials with no `max_parallel` (bench-search's overhead part).
const WIDE: &str = r#"
name = "w"
kind = "search"
command = ["true"]
[search]
trial = "command"
algorithm = "random"
trials = 500
metric = "m"
direction = "max"
[[search.params]]
name = "x"
type = "double"
min = 0.0
max = 1.0
"#;

#[test]
fn one_pass_fills_an_idle_cluster_with_trials_and_a_full_one_wants_one_more() {
    let mut state = ControlState::default();
    submit_spec(&mut state, WIDE);
    let members: Vec<MemberView> = ["a", "b", "c"]
        .iter()
        .map(|n| member(n, State::Alive, 16))
        .collect();
    let starts = |cmds: &[ControlCommand]| {
        cmds.iter()
            .filter(|c| matches!(c.op, Op::TrialStart(_)))
            .count()
    };
    // A search runs from its submit: the first pass fills every slot at once.
    let cmds = crate::chief::decide(&state, &members, 20, &mut secret);
    assert_eq!(
        starts(&cmds),
        48,
        "48 free slots, 48 trials: {}",
        cmds.len()
    );
    apply(&mut state, &cmds);
    let search = state.jobs.values().find(|j| j.search.is_some()).unwrap();
    let candidates = candidates_of(&state, &members);
    assert_eq!(room(search, &candidates), 0);
    let plan = plan(&state, search, 0).unwrap();
    assert_eq!(
        plan.wants.len(),
        1,
        "full: one trial waits, with the reason"
    );
    let search = search.id;
    // Full: no start, the reason why its trials wait.
    let cmds = crate::chief::decide(&state, &members, 30, &mut secret);
    assert_eq!(starts(&cmds), 0, "{cmds:?}");
    apply(&mut state, &cmds);
    // Three trials end: the next pass starts three.
    let ended: Vec<ControlCommand> = exits(&state, search, 40).into_iter().take(3).collect();
    apply(&mut state, &ended);
    let cmds = crate::chief::decide(&state, &members, 50, &mut secret);
    assert_eq!(starts(&cmds), 3, "{cmds:?}");
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
                op: Op::TrialStart(ops::TrialStart { slots, .. }),
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
                op: Op::SearchFinished(ops::SearchFinished { .. }),
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
    // No room for the second: the search says why its trials wait.
    let mut c = candidates_of(&state, &members);
    let cmds = decide(&state, &mut c, 20, &mut secret);
    let [ControlCommand {
        op: Op::Unplaceable(ops::Unplaceable { reason, .. }),
        ..
    }] = cmds.as_slice()
    else {
        panic!("{cmds:?}")
    };
    assert!(
        reason.starts_with("trials wait: no room for a trial"),
        "{reason}"
    );
    apply(&mut state, &cmds);
    members.push(member("b", State::Alive, 1));
    let mut c = candidates_of(&state, &members);
    let cmds = decide(&state, &mut c, 30, &mut secret);
    let [ControlCommand {
        op: Op::TrialStart(ops::TrialStart {
            trial: 1, slots, ..
        }),
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
                        op: Op::TrialStart(ops::TrialStart { .. }),
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
                op: Op::WorkerExited(ops::WorkerExited {
                    id: newest,
                    generation,
                    rank: 0,
                    code: 0,
                    end: None,
                }),
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
        op: Op::TrialCopy(ops::TrialCopy {
            trial: 1, slots, ..
        }),
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

const ASHA: &str = r#"
name = "a"
kind = "search"
command = ["true"]
[search]
trial = "command"
algorithm = "asha"
trials = 9
max_parallel = 2
metric = "m"
direction = "max"
max_resource = 9
min_resource = 1
reduction_factor = 3
resumable = true
speculate_factor = 0
seed = 4
[[search.params]]
name = "x"
type = "double"
min = 0.0
max = 1.0
"#;

#[test]
fn a_promoted_trial_runs_after_its_last_run_on_that_runs_member() {
    // Two members of one cpu each: a trial paused on one often finds it full while the
    // other has room. Its next run still goes to its own member (whose store holds its
    // checkpoint), and only once its last run has ended.
    let mut state = ControlState::default();
    let spec = Box::new(JobSpec::parse(ASHA).unwrap());
    let ControlResponse::Submitted { id: search } = state.apply(
        1,
        &ControlCommand {
            op: Op::Submit(ops::Submit {
                spec,
                token: None,
                owner: crate::domain::state::users::admin_user(),
            }),
            at_ms: 1,
        },
    ) else {
        panic!("not submitted")
    };
    let members = vec![member("a", State::Alive, 1), member("b", State::Alive, 1)];
    let (mut promotions, mut waited) = (0, 0);
    for step in 1..1_000u64 {
        let now = step * 10;
        // The whole chief: a trial promoted at its report is re-opened and placed as a
        // pending job; one paused first is promoted by the search's decision.
        let cmds = crate::chief::decide(&state, &members, now, &mut secret);
        let c = candidates_of(&state, &members);
        let record = state.job(search).unwrap().search.as_ref().unwrap();
        for cmd in &cmds {
            let (last, slots) = match &cmd.op {
                Op::TrialPromote(ops::TrialPromote { trial, slots, .. }) => {
                    (state.job(record.runs[*trial as usize].job).unwrap(), slots)
                }
                Op::Place(ops::Place { id, slots, .. })
                    if state.job(*id).unwrap().generation > 0 =>
                {
                    (state.job(*id).unwrap(), slots)
                }
                _ => continue,
            };
            assert!(
                last.state.is_terminal() || last.state == JobState::Pending,
                "its last run still runs: {cmd:?}"
            );
            assert_eq!(slots[0].member, last.assignment[0].member, "{cmd:?}");
            promotions += 1;
        }
        // A paused trial whose home is full while the other member is free waits.
        let free: Vec<&Candidate> = c.iter().filter(|c| c.used_cpus < c.cpus).collect();
        waited += usize::from(record.trials.iter().zip(&record.runs).any(|(t, r)| {
            t.state == TrialState::Paused
                && !free.is_empty()
                && free.iter().all(|c| {
                    Some(c.id.as_str())
                        != state
                            .job(r.job)
                            .and_then(|j| j.assignment.first())
                            .map(|s| s.member.as_str())
                })
        }));
        apply(&mut state, &cmds);
        if state.job(search).unwrap().state.is_terminal() {
            break;
        }
        // The oldest running trial job reports its rung (its value: its x) and exits.
        let record = state.job(search).unwrap().search.as_ref().unwrap();
        let running = record
            .trials
            .iter()
            .zip(&record.runs)
            .filter_map(|(t, r)| Some((t, state.job(r.job)?)))
            .find(|(_, j)| j.state == JobState::Running);
        let Some((t, j)) = running else { continue };
        let (id, generation) = (j.id, j.generation);
        let target = j.trial_of.as_ref().unwrap().target;
        let value = t.params["x"].as_float().unwrap();
        apply(
            &mut state,
            &[
                ControlCommand {
                    op: Op::TrialReport(ops::TrialReport {
                        id,
                        generation,
                        resource: target,
                        value,
                    }),
                    at_ms: now + 1,
                },
                ControlCommand {
                    op: Op::WorkerExited(ops::WorkerExited {
                        id,
                        generation,
                        rank: 0,
                        code: 0,
                        end: None,
                    }),
                    at_ms: now + 2,
                },
            ],
        );
    }
    let job = state.job(search).unwrap();
    assert_eq!(job.state, JobState::Succeeded, "{:?}", job.events);
    assert!(promotions > 0, "{:?}", job.events);
    assert!(waited > 0, "no promotion had to wait: {:?}", job.events);
}

const SHARED: &str = r#"
name = "s"
kind = "search"
command = ["true"]
priority = "low"
[search]
trial = "command"
algorithm = "grid"
max_parallel = 4
metric = "m"
direction = "max"
[[search.params]]
name = "x"
type = "discrete"
values = [1, 2, 3, 4, 5, 6]
"#;

/// Submits `text` as `owner`'s job at the next index.
fn submit_as(state: &mut ControlState, owner: &str, text: &str) -> JobId {
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(JobSpec::parse(text).unwrap()),
            token: None,
            owner: owner.into(),
        }),
        at_ms: state.applied_index + 1,
    };
    match state.apply(state.applied_index + 1, &cmd) {
        ControlResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

fn trial_starts(cmds: &[ControlCommand]) -> usize {
    cmds.iter()
        .filter(|c| matches!(c.op, Op::TrialStart(_)))
        .count()
}

#[test]
fn a_searchs_trials_wait_behind_a_high_job_and_within_its_owners_quota_saying_why() {
    let mut state = ControlState::default();
    use crate::domain::state::{ops::testing::set_quota, quotas::Quota};
    let alices = Quota {
        cpus: Some(2),
        borrow_cpus: Some(0),
        ..Quota::default()
    };
    set_quota(&mut state, "alice", alices);
    // Bob's quota covers his job: he borrows nothing, so alice's claim on her own unused
    // quota does not hold him back (borrowing would wait for it).
    let bobs = Quota {
        cpus: Some(4),
        ..Quota::default()
    };
    set_quota(&mut state, "bob", bobs);
    let search = submit_as(&mut state, "alice", SHARED);
    let high = submit_as(
        &mut state,
        "bob",
        "name = \"h\"\nkind = \"command\"\nworkers = 4\npriority = \"high\"\ncommand = [\"true\"]\n",
    );
    let members = vec![member("a", State::Alive, 4)];

    // Both wait: the high job takes the member; no trial starts, and the search says why.
    let cmds = crate::chief::decide(&state, &members, 10, &mut secret);
    assert_eq!(trial_starts(&cmds), 0, "{cmds:?}");
    apply(&mut state, &cmds);
    assert_eq!(state.job(high).unwrap().state, JobState::Running);
    let reason = state.job(search).unwrap().pending_reason.clone();
    assert_eq!(
        reason.as_deref(),
        Some("trials wait: waiting for 1 cpu: 0 free")
    );

    // The high job ends: trials start up to alice's quota of 2 cpus, not max_parallel's 4.
    apply(
        &mut state,
        &[ControlCommand {
            op: Op::Cancel(ops::Cancel { id: high }),
            at_ms: 20,
        }],
    );
    let cmds = crate::chief::decide(&state, &members, 30, &mut secret);
    assert_eq!(trial_starts(&cmds), 2, "{cmds:?}");
    apply(&mut state, &cmds);
    assert_eq!(state.job(search).unwrap().pending_reason, None);
    let cmds = crate::chief::decide(&state, &members, 40, &mut secret);
    assert_eq!(trial_starts(&cmds), 0, "{cmds:?}");
    apply(&mut state, &cmds);
    let job = state.job(search).unwrap();
    assert_eq!(
        job.pending_reason.as_deref(),
        Some("trials wait: waiting for 1 cpu: alice's quota 2/2 cpus in use")
    );
    // The queue lists the search for its waiting trials.
    let totals = crate::domain::queue::Usage { cpus: 4, gpus: 0 };
    let queue = crate::domain::queue::waiting_in_order(&state, totals, 40);
    assert_eq!(queue.iter().map(|j| j.id).collect::<Vec<_>>(), vec![search]);

    // Its trials end: the rest start, and once none waits the reason is gone.
    let done = exits(&state, search, 50);
    apply(&mut state, &done);
    let cmds = crate::chief::decide(&state, &members, 60, &mut secret);
    assert_eq!(trial_starts(&cmds), 2, "{cmds:?}");
    apply(&mut state, &cmds);
    assert_eq!(state.job(search).unwrap().pending_reason, None);
}
