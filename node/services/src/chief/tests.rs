use libp2p::PeerId;

use super::*;
use crate::domain::state::failure::RankEnd;

/// The default `elastic.rejoin_after_s`, in ms: the specs here leave it out, but one.
const REJOIN_AFTER_MS: u64 = crate::domain::spec::REJOIN_AFTER_S_DEFAULT as u64 * 1_000;
use crate::{
    cluster::meta::NodeMeta,
    domain::state::{ControlResponse, EventKind, JobId},
    jobs::JobSpec,
};

/// A member as gossip shows it.
pub(crate) fn member(name: &str, state: State, cpus: u32) -> MemberView {
    MemberView {
        id: PeerId::random(),
        incarnation: 0,
        state,
        meta: NodeMeta::for_test(name, cpus, "127.0.0.1"),
        meta_version: 0,
        state_since_ms: 0,
    }
}

/// An alive member with `gpus` GPUs, indices `0..gpus`.
pub(crate) fn gpu_member(name: &str, cpus: u32, gpus: u32) -> MemberView {
    let mut m = member(name, State::Alive, cpus);
    m.meta.gpus = (0..gpus)
        .map(|index| crate::cluster::meta::Gpu {
            index,
            model: "H100".into(),
            memory_mb: 81_559,
            uuid: format!("GPU-test-{index}"),
        })
        .collect();
    m
}

/// Submits the job `spec` (TOML) at the next log index; returns its id.
pub(crate) fn submit_text(state: &mut ControlState, spec: &str) -> JobId {
    let index = state.applied_index + 1;
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(JobSpec::parse(spec).unwrap()),
            token: None,
            owner: crate::domain::state::users::admin_user(),
        }),
        at_ms: 1,
    };
    match state.apply(index, &cmd) {
        ControlResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

/// Submits a command job of `workers` ranks; returns its id.
pub(crate) fn submit(state: &mut ControlState, index: u64, workers: u32) -> JobId {
    let text =
        format!("name = \"t\"\nkind = \"command\"\nworkers = {workers}\ncommand = [\"true\"]\n");
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(JobSpec::parse(&text).unwrap()),
            token: None,
            owner: crate::domain::state::users::admin_user(),
        }),
        at_ms: 1,
    };
    match state.apply(index, &cmd) {
        ControlResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

fn secret() -> String {
    "ab".repeat(32)
}

/// Applies `cmds` at the next log indexes, each applied.
fn apply_all(state: &mut ControlState, cmds: &[ControlCommand]) {
    for cmd in cmds {
        let index = state.applied_index + 1;
        assert_eq!(state.apply(index, cmd), ControlResponse::Applied, "{cmd:?}");
    }
}

fn devices(state: &ControlState, id: JobId) -> Vec<Vec<u32>> {
    let job = state.job(id).unwrap();
    job.assignment.iter().map(|s| s.gpus.clone()).collect()
}

#[test]
fn a_retry_avoids_the_member_where_the_program_could_not_start_unless_none_else_fits() {
    let members = vec![member("a", State::Alive, 1), member("b", State::Alive, 1)];
    let mut state = ControlState::default();
    let id = submit_text(
        &mut state,
        "name = \"m\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 3\ncommand = [\"nope\"]\n",
    );
    let ring = |state: &ControlState| state.job(id).unwrap().assignment[0].name.clone();
    let fail_start = |state: &mut ControlState, at_ms: u64, why: &str| {
        let generation = state.job(id).unwrap().generation;
        let message = format!("program \"nope\" {why}");
        let note = ControlCommand {
            op: Op::WorkerNote(ops::WorkerNote {
                id,
                generation,
                rank: 0,
                message: message.clone(),
                cannot_start: true,
            }),
            at_ms,
        };
        let exit = ControlCommand {
            op: Op::WorkerExited(ops::WorkerExited {
                id,
                generation,
                rank: 0,
                code: 127,
                end: Some(RankEnd {
                    start_error: Some(message),
                    ..RankEnd::default()
                }),
            }),
            at_ms,
        };
        apply_all(state, &[note, exit]);
    };
    let cmds = decide(&state, &members, 5, &mut secret);
    apply_all(&mut state, &cmds);
    let first = ring(&state);
    fail_start(&mut state, 6, "not found on this node");
    let job = state.job(id).unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert!(job.events.iter().any(|e| e
        .reason
        .contains(&format!("rank 0 could not start on {first}: program"))));
    // The retry goes to the other member…
    let cmds = decide(&state, &members, 7, &mut secret);
    apply_all(&mut state, &cmds);
    let second = ring(&state);
    assert_ne!(first, second);
    // … and when it could start nowhere, to one of them anyway (it may be installed)…
    fail_start(&mut state, 8, "is not executable on this node");
    let cmds = decide(&state, &members, 9, &mut secret);
    apply_all(&mut state, &cmds);
    assert_eq!(state.job(id).unwrap().state, JobState::Running);
    // … unless it failed to start the same way twice: then it is not retried again.
    fail_start(&mut state, 10, "is not executable on this node");
    let job = state.job(id).unwrap();
    let last = &job.events.last().unwrap().reason;
    assert_eq!(job.state, JobState::Failed, "{last}");
    assert!(last.contains("not retried: the same failure twice (could not start: program"));
}

const TWO_BY_ONE_GPU: &str = "name = \"g\"\nkind = \"command\"\nworkers = 2\ncommand = [\"true\"]\n[resources]\ngpus_per_worker = 1\n";

#[test]
fn jobs_get_disjoint_gpus_and_an_ended_job_frees_them() {
    let members = vec![gpu_member("a", 8, 4)];
    let mut state = ControlState::default();
    let first = submit_text(&mut state, TWO_BY_ONE_GPU);
    let cmds = decide(&state, &members, 5, &mut secret);
    apply_all(&mut state, &cmds);
    let second = submit_text(&mut state, TWO_BY_ONE_GPU);
    let cmds = decide(&state, &members, 6, &mut secret);
    apply_all(&mut state, &cmds);
    assert_eq!(devices(&state, first), [vec![0], vec![1]]);
    assert_eq!(devices(&state, second), [vec![2], vec![3]]);
    // No device left: the third waits, with a reason.
    let third = submit_text(&mut state, TWO_BY_ONE_GPU);
    let cmds = decide(&state, &members, 7, &mut secret);
    let [ControlCommand {
        op: Op::Unplaceable(ops::Unplaceable { reason, .. }),
        ..
    }] = cmds.as_slice()
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(reason, "no member has 1 GPU free (largest: 0)");
    apply_all(&mut state, &cmds);
    // The first ends: its devices go to the third.
    for rank in 0..2 {
        let exit = ControlCommand {
            op: Op::WorkerExited(ops::WorkerExited {
                id: first,
                generation: 1,
                rank,
                code: 0,
                end: None,
            }),
            at_ms: 8,
        };
        apply_all(&mut state, &[exit]);
    }
    assert_eq!(state.job(first).unwrap().state, JobState::Succeeded);
    let cmds = decide(&state, &members, 9, &mut secret);
    apply_all(&mut state, &cmds);
    assert_eq!(devices(&state, third), [vec![0], vec![1]]);
}

#[test]
fn a_placement_on_a_held_gpu_is_ignored() {
    let members = vec![gpu_member("a", 8, 4)];
    let mut state = ControlState::default();
    let first = submit_text(&mut state, TWO_BY_ONE_GPU);
    let second = submit_text(&mut state, TWO_BY_ONE_GPU);
    // Both decided on the same (stale) view: the second is refused when applied.
    let stale = decide(&state, &members, 5, &mut secret);
    let [ControlCommand {
        op: Op::Place(ops::Place { slots, .. }),
        ..
    }, _] = stale.as_slice()
    else {
        panic!("{stale:?}")
    };
    apply_all(&mut state, &stale[..1]);
    let again = ControlCommand {
        op: Op::Place(ops::Place {
            id: second,
            generation: 1,
            slots: slots.clone(),
            secret: secret(),
        }),
        at_ms: 6,
    };
    let r = state.apply(state.applied_index + 1, &again);
    assert!(
        matches!(&r, ControlResponse::Ignored { reason } if reason.starts_with("gpu 0 of a is held by")),
        "{r:?}"
    );
    assert_eq!(state.job(first).unwrap().state, JobState::Running);
    assert_eq!(state.job(second).unwrap().state, JobState::Pending);
    // One GPU twice in one placement is malformed.
    let mut twice = slots.clone();
    twice[1].gpus = twice[0].gpus.clone();
    let bad = ControlCommand {
        op: Op::Place(ops::Place {
            id: second,
            generation: 1,
            slots: twice,
            secret: secret(),
        }),
        at_ms: 6,
    };
    assert!(matches!(
        bad.check(),
        Err(crate::domain::state::BadCommand::Gpus)
    ));
}

#[test]
fn a_reform_keeps_survivors_gpus_and_a_joiner_gets_the_lowest_free() {
    let members = vec![gpu_member("a", 8, 4), gpu_member("b", 8, 2)];
    let mut state = ControlState::default();
    let elastic = submit_text(&mut state, "name = \"e\"\nkind = \"command\"\nworkers = 3\nmin_workers = 2\nmax_workers = 3\nplacement = \"pack\"\ncommand = [\"true\"]\n[resources]\ngpus_per_worker = 1\n",
        );
    let cmds = decide(&state, &members, 5, &mut secret);
    apply_all(&mut state, &cmds);
    assert_eq!(devices(&state, elastic), [vec![0], vec![1], vec![2]]);
    // Another job takes b's device 0 (a has one free device, b two: b has more room).
    let other = submit_text(&mut state, "name = \"o\"\nkind = \"command\"\nworkers = 1\nplacement = \"pack\"\ncommand = [\"true\"]\n[resources]\ngpus_per_worker = 1\n",
        );
    let cmds = decide(&state, &members, 6, &mut secret);
    apply_all(&mut state, &cmds);
    assert_eq!(state.job(other).unwrap().assignment[0].name, "b");
    assert_eq!(devices(&state, other), [vec![0]]);
    // Rank 1 crashes: the survivors keep devices 0 and 2 (not re-packed to 0 and 1).
    let exit = ControlCommand {
        op: Op::WorkerExited(ops::WorkerExited {
            id: elastic,
            generation: 1,
            rank: 1,
            code: 137,
            end: None,
        }),
        at_ms: 7,
    };
    apply_all(&mut state, &[exit]);
    let cmds = decide(&state, &members, 8, &mut secret);
    let (slots, _) = reform_of(&cmds);
    assert_eq!(
        slots.iter().map(|s| s.gpus.clone()).collect::<Vec<_>>(),
        [vec![0], vec![2]]
    );
    apply_all(&mut state, &cmds);
    // It grows back with b, whose lowest free device is 1.
    let cmds = decide(&state, &members, 9, &mut secret);
    let (slots, reason) = reform_of(&cmds);
    assert_eq!(reason, "joined b");
    assert_eq!(
        slots
            .iter()
            .map(|s| (s.name.as_str(), s.gpus.clone()))
            .collect::<Vec<_>>(),
        [("a", vec![0]), ("a", vec![2]), ("b", vec![1])]
    );
    apply_all(&mut state, &cmds);
}

#[test]
fn places_a_pending_job_and_then_fails_it_when_a_member_dies() {
    let mut state = ControlState::default();
    let id = submit(&mut state, 1, 2);
    let mut members = vec![member("a", State::Alive, 2), member("b", State::Alive, 2)];
    let cmds = decide(&state, &members, 5, &mut secret);
    let [ControlCommand {
        op:
            Op::Place(ops::Place {
                id: placed,
                generation: 1,
                slots,
                ..
            }),
        ..
    }] = cmds.as_slice()
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(*placed, id);
    assert_eq!(slots.len(), 2);
    assert_eq!(state.apply(2, &cmds[0]), ControlResponse::Applied);
    // Nothing to do while everyone is alive.
    assert!(decide(&state, &members, 6, &mut secret).is_empty());
    members[1].state = State::Dead;
    let cmds = decide(&state, &members, 7, &mut secret);
    let [ControlCommand {
        op:
            Op::AttemptFailed(ops::AttemptFailed {
                generation: 1,
                reason,
                ..
            }),
        ..
    }] = cmds.as_slice()
    else {
        panic!("{cmds:?}")
    };
    assert!(
        reason.starts_with("peer-lost b (rank 1): member dead"),
        "{reason}"
    );
}

#[test]
fn an_unplaceable_reason_is_recorded_once() {
    let mut state = ControlState::default();
    submit(&mut state, 1, 3);
    let members = vec![member("a", State::Alive, 1)];
    let cmds = decide(&state, &members, 5, &mut secret);
    assert!(
        matches!(
            cmds.as_slice(),
            [ControlCommand {
                op: Op::Unplaceable(ops::Unplaceable { .. }),
                ..
            }]
        ),
        "{cmds:?}"
    );
    state.apply(2, &cmds[0]);
    assert!(decide(&state, &members, 6, &mut secret).is_empty());
}

#[test]
fn jobs_of_one_round_do_not_share_a_cpu() {
    let mut state = ControlState::default();
    submit(&mut state, 1, 1);
    submit(&mut state, 2, 1);
    let members = vec![member("a", State::Alive, 1)];
    let cmds = decide(&state, &members, 5, &mut secret);
    assert!(
        matches!(
            cmds[0],
            ControlCommand {
                op: Op::Place(ops::Place { .. }),
                ..
            }
        ),
        "{cmds:?}"
    );
    assert!(
        matches!(
            cmds[1],
            ControlCommand {
                op: Op::Unplaceable(ops::Unplaceable { .. }),
                ..
            }
        ),
        "{cmds:?}"
    );
}

/// An elastic command job of `workers` ranks (min 2, max `max`) placed on `members`.
fn elastic_running(
    members: &[MemberView],
    workers: u32,
    max: u32,
    extra: &str,
) -> (ControlState, JobId) {
    let mut state = ControlState::default();
    let text = format!(
        "name = \"e\"\nkind = \"command\"\nworkers = {workers}\nmin_workers = 2\nmax_workers = {max}\ncommand = [\"true\"]\n{extra}"
    );
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(JobSpec::parse(&text).unwrap()),
            token: None,
            owner: crate::domain::state::users::admin_user(),
        }),
        at_ms: 1,
    };
    let ControlResponse::Submitted { id } = state.apply(1, &cmd) else {
        panic!()
    };
    let place = decide(&state, members, 2, &mut secret);
    assert_eq!(state.apply(2, &place[0]), ControlResponse::Applied);
    (state, id)
}

fn reform_of(cmds: &[ControlCommand]) -> (&Vec<Slot>, &str) {
    match cmds.last() {
        Some(ControlCommand {
            op: Op::Reform(ops::Reform { slots, reason, .. }),
            ..
        }) => (slots, reason),
        other => panic!("expected a re-form, got {other:?} in {cmds:?}"),
    }
}

#[test]
fn an_elastic_job_reforms_without_a_dead_member_and_keeps_its_restarts() {
    let mut members = vec![
        member("a", State::Alive, 1),
        member("b", State::Alive, 1),
        member("c", State::Alive, 1),
    ];
    let (mut state, id) = elastic_running(&members, 3, 3, "");
    members[1].state = State::Dead;
    let cmds = decide(&state, &members, 10, &mut secret);
    let (slots, reason) = reform_of(&cmds);
    assert_eq!(reason, "peer-lost b (rank 1): member dead");
    let names: Vec<&str> = slots.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["a", "c"]);
    assert_eq!(slots[1].rank, 1, "re-ranked");
    assert_eq!(slots[1].worker, 2, "the survivor keeps its worker id");
    assert_eq!(state.apply(3, &cmds[0]), ControlResponse::Applied);
    let job = state.job(id).unwrap();
    assert_eq!((job.generation, job.attempt), (2, 1), "no restart used");
    assert_eq!(job.process_generation(), 2, "command ranks restart");
    // Below min_workers: the attempt fails (a retry from durable state).
    members[2].state = State::Left;
    let cmds = decide(&state, &members, 11, &mut secret);
    assert!(
        matches!(
            cmds.as_slice(),
            [ControlCommand {
                op: Op::AttemptFailed(ops::AttemptFailed { generation: 2, .. }),
                ..
            }]
        ),
        "{cmds:?}"
    );
}

#[test]
fn a_crashed_or_hung_rank_is_left_out() {
    let members = vec![
        member("a", State::Alive, 1),
        member("b", State::Alive, 1),
        member("c", State::Alive, 1),
    ];
    let (mut state, id) = elastic_running(&members, 3, 3, "");
    let exit = ControlCommand {
        op: Op::WorkerExited(ops::WorkerExited {
            id,
            generation: 1,
            rank: 2,
            code: 137,
            end: None,
        }),
        at_ms: 5,
    };
    assert_eq!(state.apply(3, &exit), ControlResponse::Applied);
    assert_eq!(
        state.job(id).unwrap().state,
        JobState::Running,
        "an elastic job goes on"
    );
    let cmds = decide(&state, &members, 10, &mut secret);
    assert_eq!(
        reform_of(&cmds).1,
        "peer-lost c (rank 2): exited with code 137"
    );
    state.apply(4, &cmds[0]);
    let hung = ControlCommand {
        op: Op::RankLost(ops::RankLost {
            id,
            generation: 2,
            rank: 1,
            hung: true,
            reason: "process stopped for 3000 ms".into(),
        }),
        at_ms: 11,
    };
    assert_eq!(state.apply(5, &hung), ControlResponse::Applied);
    // Two ranks left, min_workers 2: the hung one cannot be dropped, the attempt fails.
    let cmds = decide(&state, &members, 12, &mut secret);
    let [ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed { reason, .. }),
        ..
    }] = cmds.as_slice()
    else {
        panic!("{cmds:?}")
    };
    assert!(
        reason.starts_with("hung b (rank 1): process stopped"),
        "{reason}"
    );
}

#[test]
fn a_straggler_is_dropped_and_blacklisted_after_its_window_but_never_below_min() {
    let members = vec![
        member("a", State::Alive, 1),
        member("b", State::Alive, 1),
        member("c", State::Alive, 1),
    ];
    let (mut state, id) = elastic_running(&members, 3, 3, "[elastic]\nstraggler_window = 10\n");
    let mut index = 3;
    let mut stats = |state: &mut ControlState, rank: u32, step: u64, ms: f64| {
        index += 1;
        let cmd = ControlCommand {
            op: Op::RankStats(ops::RankStats {
                id,
                generation: 1,
                rank,
                step,
                compute_ms: ms,
                wait_ms: 1.0,
            }),
            at_ms: 5,
        };
        assert_eq!(state.apply(index, &cmd), ControlResponse::Applied);
    };
    for step in [5, 10, 14] {
        stats(&mut state, 0, step, 10.0);
        stats(&mut state, 1, step, 11.0);
        stats(&mut state, 2, step, 50.0);
    }
    let slow = state.job(id).unwrap().rank_stats[&2];
    assert_eq!(slow.slow_since_step, Some(5));
    assert!(
        decide(&state, &members, 10, &mut secret).is_empty(),
        "10 steps not reached"
    );
    stats(&mut state, 2, 16, 50.0);
    let cmds = decide(&state, &members, 10, &mut secret);
    assert!(
        matches!(&cmds[0], ControlCommand { op: Op::Blacklist(ops::Blacklist { name, .. }), .. } if name == "c"),
        "{cmds:?}"
    );
    assert!(reform_of(&cmds).1.starts_with("straggler c (rank 2)"));
    state.apply(20, &cmds[0]);
    state.apply(21, &cmds[1]);
    assert!(state.is_blacklisted(&members[2].id.to_string(), 10 + 59_000));
    assert!(!state.is_blacklisted(&members[2].id.to_string(), 10 + 60_001));
    // Now at min_workers: a straggler stays.
    let (mut state, id) = elastic_running(&members[..2], 2, 3, "[elastic]\nstraggler_window = 1\n");
    for (i, (rank, ms)) in [(0, 10.0), (1, 50.0), (1, 50.0)].into_iter().enumerate() {
        let cmd = ControlCommand {
            op: Op::RankStats(ops::RankStats {
                id,
                generation: 1,
                rank,
                step: 5 + i as u64,
                compute_ms: ms,
                wait_ms: 1.0,
            }),
            at_ms: 5,
        };
        state.apply(10 + i as u64, &cmd);
    }
    assert!(decide(&state, &members[..2], 10, &mut secret).is_empty());
}

/// Three members run an elastic job (`extra` in its spec); `c` dies at 1,000 ms (the ring
/// re-forms without it) and is back alive. Returns the state, the members and the job, and
/// checks that `c` may not join before `rejoin_after_ms` has passed since.
fn member_back_before_it_may_rejoin(
    extra: &str,
    rejoin_after_ms: u64,
) -> (ControlState, Vec<MemberView>, JobId) {
    let mut members = vec![
        member("a", State::Alive, 1),
        member("b", State::Alive, 1),
        member("c", State::Alive, 1),
    ];
    let (mut state, id) = elastic_running(&members, 3, 3, extra);
    members[2].state = State::Dead;
    let cmds = decide(&state, &members, 1_000, &mut secret);
    state.apply(3, &cmds[0]);
    members[2].state = State::Alive;
    assert!(
        decide(&state, &members, 1_000 + rejoin_after_ms - 1, &mut secret).is_empty(),
        "too soon"
    );
    (state, members, id)
}

#[test]
fn an_elastic_ring_grows_back_with_a_member_after_the_rejoin_delay() {
    let (mut state, members, id) = member_back_before_it_may_rejoin("", REJOIN_AFTER_MS);
    let cmds = decide(&state, &members, 1_000 + REJOIN_AFTER_MS, &mut secret);
    let (slots, reason) = reform_of(&cmds);
    assert_eq!(reason, "joined c");
    assert_eq!(slots.len(), 3);
    assert_eq!(slots[2].worker, 3, "a joiner gets a new worker id");
    state.apply(4, &cmds[0]);
    let job = state.job(id).unwrap();
    let reasons: Vec<&str> = job
        .events
        .iter()
        .filter(|e| e.what == crate::domain::state::EventKind::Reformed)
        .map(|e| e.reason.as_str())
        .collect();
    assert_eq!(reasons, ["peer-lost c (rank 2): member dead", "joined c"]);
    assert_eq!(job.generation, 3);
    // Full again: nothing more.
    assert!(decide(&state, &members, 100_000, &mut secret).is_empty());
}

/// `elastic.rejoin_after_s` is the job's own: a member may join again that long after it
/// left, not the default's.
#[test]
fn a_jobs_rejoin_delay_is_its_specs() {
    let (state, members, _) =
        member_back_before_it_may_rejoin("[elastic]\nrejoin_after_s = 2\n", 2_000);
    let cmds = decide(&state, &members, 1_000 + 2_000, &mut secret);
    assert_eq!(reform_of(&cmds).1, "joined c");
}

/// A member an operator removed gets no rank, however much room it has.
#[test]
fn a_removed_member_is_never_placed_on() {
    let members = vec![member("a", State::Alive, 1), member("b", State::Alive, 8)];
    let mut state = ControlState::default();
    let removal = ControlCommand {
        op: Op::MemberRemove(ops::MemberRemove {
            peer_id: members[1].id.to_string(),
            name: "b".into(),
        }),
        at_ms: 1,
    };
    apply_all(&mut state, &[removal]);
    let one = submit_text(
        &mut state,
        "name = \"x\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n",
    );
    let two = submit_text(
        &mut state,
        "name = \"y\"\nkind = \"command\"\nworkers = 2\ncommand = [\"true\"]\n",
    );
    let cmds = decide(&state, &members, 5, &mut secret);
    apply_all(&mut state, &cmds);
    let job = state.job(one).unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.assignment[0].name, "a");
    assert_eq!(
        state.job(two).unwrap().state,
        JobState::Pending,
        "b is not counted"
    );
}

/// The `Standby` command among `cmds`.
fn standby_of(cmds: &[ControlCommand]) -> &Slot {
    match cmds {
        [ControlCommand {
            op: Op::Standby(ops::Standby { slot, .. }),
            ..
        }] => slot,
        other => panic!("expected a standby, got {other:?}"),
    }
}

const RINGLEADER_PROTOCOL: &str = "[elastic]\nprotocol = \"ringleader\"\n";

/// A ringleader-protocol command job stages its joiner and re-forms only once the joiner
/// said it is ready: the ring trains on meanwhile.
#[test]
fn a_ringleader_command_job_stages_its_joiner_and_reforms_once_it_is_ready() {
    let mut members = vec![
        member("a", State::Alive, 1),
        member("b", State::Alive, 1),
        member("c", State::Alive, 1),
    ];
    let (mut state, id) = elastic_running(&members, 3, 3, RINGLEADER_PROTOCOL);
    members[2].state = State::Dead;
    let cmds = decide(&state, &members, 1_000, &mut secret);
    apply_all(&mut state, &cmds);
    members[2].state = State::Alive;
    let at = 1_000 + REJOIN_AFTER_MS;
    let cmds = decide(&state, &members, at, &mut secret);
    let slot = standby_of(&cmds).clone();
    assert_eq!((slot.name.as_str(), slot.worker, slot.rank), ("c", 3, 2));
    apply_all(&mut state, &cmds);
    let job = state.job(id).unwrap();
    assert_eq!(job.generation, 2, "no re-form yet");
    assert_eq!(job.next_worker, 4);
    assert!(
        decide(&state, &members, at + 1, &mut secret).is_empty(),
        "waits for the standby"
    );
    // A ready report from another worker id changes nothing.
    let ready = |worker| ControlCommand {
        op: Op::StandbyReady(ops::StandbyReady { id, worker }),
        at_ms: at + 2,
    };
    let index = state.applied_index + 1;
    assert!(matches!(
        state.apply(index, &ready(7)),
        ControlResponse::Ignored { .. }
    ));
    apply_all(&mut state, &[ready(3)]);
    let cmds = decide(&state, &members, at + 3, &mut secret);
    let (slots, reason) = reform_of(&cmds);
    assert_eq!(reason, "joined c");
    assert_eq!(
        slots.iter().map(|s| s.worker).collect::<Vec<_>>(),
        [0, 1, 3]
    );
    apply_all(&mut state, &cmds);
    let job = state.job(id).unwrap();
    assert_eq!(job.generation, 3);
    assert!(job.standby.is_none(), "the re-form took it in");
    assert!(decide(&state, &members, at + 4, &mut secret).is_empty());
}

/// A standby whose member dies is dropped (with a note in the history) and its member is
/// staged again only after the rejoin delay; a shrinking re-form keeps a standby.
#[test]
fn a_standby_is_dropped_when_its_member_dies_and_kept_through_a_shrink() {
    let mut members = vec![
        member("a", State::Alive, 1),
        member("b", State::Alive, 1),
        member("c", State::Alive, 1),
        member("d", State::Alive, 1),
    ];
    let (mut state, id) = elastic_running(&members[..3], 3, 4, RINGLEADER_PROTOCOL);
    let cmds = decide(&state, &members, 10, &mut secret);
    assert_eq!(standby_of(&cmds).name, "d");
    apply_all(&mut state, &cmds);
    // c dies: the ring shrinks, d stays staged.
    members[2].state = State::Dead;
    let cmds = decide(&state, &members, 20, &mut secret);
    let (slots, _) = reform_of(&cmds);
    assert_eq!(slots.len(), 2);
    apply_all(&mut state, &cmds);
    assert_eq!(
        state
            .job(id)
            .unwrap()
            .standby
            .as_ref()
            .map(|s| s.slot.worker),
        Some(3)
    );
    // d dies before it is ready: dropped.
    members[3].state = State::Dead;
    let cmds = decide(&state, &members, 30, &mut secret);
    match cmds.as_slice() {
        [ControlCommand {
            op: Op::StandbyDropped(ops::StandbyDropped { worker, reason, .. }),
            ..
        }] => assert_eq!((*worker, reason.as_str()), (3, "member dead")),
        other => panic!("{other:?}"),
    }
    apply_all(&mut state, &cmds);
    let job = state.job(id).unwrap();
    assert!(job.standby.is_none());
    assert!(job
        .events
        .last()
        .is_some_and(|e| e.reason == "standby on d dropped before joining: member dead"));
    // Back, but too soon; then staged again with a new worker id.
    members[3].state = State::Alive;
    assert!(decide(&state, &members, 31, &mut secret).is_empty());
    let cmds = decide(&state, &members, 30 + REJOIN_AFTER_MS, &mut secret);
    assert_eq!(standby_of(&cmds).worker, 4);
}

/// A command job of `workers` ranks with `priority`, owned by `owner`; returns its id.
fn submit_owned(state: &mut ControlState, owner: &str, priority: &str, workers: u32) -> JobId {
    let text = format!(
        "name = \"p\"\nkind = \"command\"\nworkers = {workers}\npriority = \"{priority}\"\ncommand = [\"true\"]\n"
    );
    let cmd = ControlCommand::new(
        1,
        Op::Submit(ops::Submit {
            spec: Box::new(JobSpec::parse(&text).unwrap()),
            token: None,
            owner: owner.into(),
        }),
    );
    match state.apply(state.applied_index + 1, &cmd) {
        ControlResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_fair_scheduler_starts_priority_first_and_fifo_keeps_submit_order() {
    let members = vec![member("a", State::Alive, 2)];
    let mut state = ControlState::default();
    let low = submit_owned(&mut state, "alice", "low", 2);
    let high = submit_owned(&mut state, "bob", "high", 2);
    let placed = |cmds: &[ControlCommand]| -> Vec<JobId> {
        cmds.iter()
            .filter_map(|c| match &c.op {
                Op::Place(ops::Place { id, .. }) => Some(*id),
                _ => None,
            })
            .collect()
    };
    let fifo = decide_with(Policy::Fifo, &state, &members, 5, &mut secret);
    assert_eq!(placed(&fifo), vec![low]);
    let fair = decide(&state, &members, 5, &mut secret);
    assert_eq!(placed(&fair), vec![high]);
    apply_all(&mut state, &fair);
    let job = state.job(low).unwrap();
    assert_eq!(
        job.pending_reason.as_deref(),
        Some("waiting for 2 cpus: 0 free")
    );
    assert_eq!(job.events.last().unwrap().what, EventKind::Unplaceable);
}

#[test]
fn a_quota_holds_a_users_job_and_a_changed_reason_is_recorded_without_an_event() {
    let members = vec![member("a", State::Alive, 4)];
    let mut state = ControlState::default();
    let quota = crate::domain::state::quotas::Quota {
        cpus: Some(1),
        borrow_cpus: Some(0),
        ..Default::default()
    };
    let set = ControlCommand::new(
        1,
        Op::QuotaSet(ops::QuotaSet {
            user: "alice".into(),
            quota,
        }),
    );
    assert_eq!(state.apply(1, &set), ControlResponse::Applied);
    let held = submit_owned(&mut state, "alice", "normal", 2);
    let cmds = decide(&state, &members, 5, &mut secret);
    apply_all(&mut state, &cmds);
    let job = state.job(held).unwrap();
    assert_eq!(
        job.pending_reason.as_deref(),
        Some("waiting for 2 cpus: alice's quota 0/1 cpus in use")
    );
    let events = job.events.len();
    // The admin lowers the quota: the reason changes, quietly.
    let quota = crate::domain::state::quotas::Quota {
        cpus: Some(0),
        ..Default::default()
    };
    let set = ControlCommand::new(
        6,
        Op::QuotaSet(ops::QuotaSet {
            user: "alice".into(),
            quota,
        }),
    );
    assert_eq!(
        state.apply(state.applied_index + 1, &set),
        ControlResponse::Applied
    );
    let cmds = decide(&state, &members, 7, &mut secret);
    apply_all(&mut state, &cmds);
    let job = state.job(held).unwrap();
    assert_eq!(
        job.pending_reason.as_deref(),
        Some("waiting for 2 cpus: alice's quota 0/0 cpus in use")
    );
    assert_eq!(job.events.len(), events, "a changed reason adds no event");
}
mod forwarding;
mod preemption;
