//! The chief's side of preemption (`domain::state::preempt`): a shrunk ring stays below its
//! ceiling until a grow, a requeued job is neither re-formed nor grown and its stop is
//! ended when overdue or its member is gone, a job requeued for another waits while that
//! one does, and a chief that dies around the shrink's entry leaves the next chief a state
//! with the whole shrink or none of it.

use super::*;
use crate::domain::preempt::{self, Preempt, PreemptAction, STOP_REPORT_SLACK_MS};

const TRAIN: &str = "name = \"t\"\nkind = \"train\"\nworkers = 4\nmin_workers = 1\nmax_workers = 4\n[model]\narch = \"mlp\"\nhidden = [8]\n[data]\ndataset = \"digits\"\n";

fn members(n: usize) -> Vec<MemberView> {
    (0..n)
        .map(|i| member(&format!("m{i}"), State::Alive, 1))
        .collect()
}

/// Places what is pending on `members` at `now`.
fn place_all(state: &mut ControlState, members: &[MemberView], now: u64) {
    let cmds = decide(state, members, now, &mut secret);
    apply_all(state, &cmds);
}

fn preempt(
    state: &mut ControlState,
    victim: JobId,
    action: PreemptAction,
    for_job: Option<JobId>,
    now: u64,
) {
    let ask = Preempt {
        victim,
        action,
        for_job,
        reason: None,
    };
    let cmds = preempt::execute(state, &ask, now, &mut secret).unwrap();
    apply_all(state, &cmds);
}

/// `TRAIN` placed on 4 members and shrunk to 2 by a preemption at 10 ms.
fn shrunk_to_two(members: &[MemberView]) -> (ControlState, JobId) {
    let mut state = ControlState::default();
    let id = submit_text(&mut state, TRAIN);
    place_all(&mut state, members, 2);
    preempt(
        &mut state,
        id,
        PreemptAction::Shrink { to_workers: 2 },
        None,
        10,
    );
    (state, id)
}

/// The admin's (or capacity returned's) grow of `id` back to 4, at `at`.
fn grow_to_four(state: &mut ControlState, id: JobId, at: u64) {
    let grow = ControlCommand::new(
        at,
        Op::Grow(ops::Grow {
            id,
            to_workers: 4,
            reason: "capacity returned".into(),
        }),
    );
    apply_all(state, &[grow]);
}

#[test]
fn a_shrunk_ring_stays_below_its_ceiling_until_a_grow_then_grows_back_in_one_generation() {
    let members = members(4);
    let (mut state, id) = shrunk_to_two(&members);
    let later = 10 + REJOIN_AFTER_MS + 1;
    assert!(
        decide(&state, &members, later, &mut secret).is_empty(),
        "no growth past the ceiling with two members free"
    );
    grow_to_four(&mut state, id, later);
    let cmds = decide(&state, &members, later, &mut secret);
    let (slots, reason) = reform_of(&cmds);
    assert_eq!(cmds.len(), 1);
    assert_eq!(slots.len(), 4, "every free member joins in one generation");
    assert_eq!(reason, "grown 2 → 4: capacity returned (joined m2, m3)");
    apply_all(&mut state, &cmds);
    let job = state.job(id).unwrap();
    assert_eq!((job.generation, job.attempt), (3, 1));
    assert_eq!(
        job.preemption, None,
        "back to full size: nothing left of it"
    );
    assert!(decide(&state, &members, later + 1, &mut secret).is_empty());
}

/// No job waits with room unused that it fits: a ring held at its ceiling (shrunk for a
/// job that still waits, or by an admin) takes no room in the scheduler's pass as a growth
/// the chief would then drop. Before, its growth went ahead of waiting jobs of its priority
/// and held a free member, so a two-rank job waited `gang of 2: at most 1 fit now` on two
/// idle members.
#[test]
fn a_ring_held_at_its_ceiling_leaves_the_free_room_to_waiting_jobs() {
    let members = members(4);
    let mut state = ControlState::default();
    let ring = submit_text(&mut state, TRAIN);
    place_all(&mut state, &members, 2);
    preempt(
        &mut state,
        ring,
        PreemptAction::Shrink { to_workers: 2 },
        None,
        10,
    );
    let later = 10 + REJOIN_AFTER_MS + 1;
    let index = state.applied_index + 1;
    let two = super::submit(&mut state, index, 2);
    let cmds = decide(&state, &members, later, &mut secret);
    assert_eq!(placed(&cmds), vec![two], "{cmds:?}");
    apply_all(&mut state, &cmds);
    let job = state.job(two).unwrap();
    assert_eq!(job.assignment.len(), 2);
    assert_eq!(job.pending_reason, None, "{:?}", job.events);
    assert!(
        decide(&state, &members, later + 1, &mut secret).is_empty(),
        "the ring stays at its ceiling"
    );
}

const RIGID: &str = "name = \"r\"\nkind = \"command\"\nworkers = 2\nmin_workers = 1\nmax_workers = 2\nmax_restarts = 0\ncommand = [\"true\"]\n";

#[test]
fn a_requeued_job_is_not_reformed_and_its_stop_ends_when_overdue_or_its_member_is_gone() {
    let mut members = members(2);
    let mut state = ControlState::default();
    let id = submit_text(&mut state, RIGID);
    place_all(&mut state, &members, 2);
    preempt(&mut state, id, PreemptAction::Requeue, None, 10);
    let overdue = state
        .job(id)
        .unwrap()
        .stopping
        .as_ref()
        .unwrap()
        .overdue_at_ms();
    assert_eq!(overdue, 10 + 30_000 + STOP_REPORT_SLACK_MS);
    // A rank that exits non-zero meanwhile (SIGTERM) is no loss to re-form around.
    let exit = ControlCommand::new(
        20,
        Op::WorkerExited(ops::WorkerExited {
            id,
            generation: 1,
            rank: 1,
            code: 143,
            end: None,
        }),
    );
    apply_all(&mut state, &[exit]);
    assert!(decide(&state, &members, 30, &mut secret).is_empty());
    let mut overdue_state = state.clone();
    let cmds = decide(&overdue_state, &members, overdue, &mut secret);
    assert!(
        matches!(
            &cmds[..],
            [ControlCommand {
                op: Op::AttemptFailed(ops::AttemptFailed { .. }),
                ..
            }]
        ),
        "{cmds:?}"
    );
    apply_all(&mut overdue_state, &cmds);
    assert_eq!(overdue_state.job(id).unwrap().state, JobState::Pending);
    assert_eq!(overdue_state.job(id).unwrap().restarts_used(), 0);
    // Its member gone, the exit never comes: ended at once.
    members[0].state = State::Dead;
    let cmds = decide(&state, &members, 40, &mut secret);
    let [ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed { reason, .. }),
        ..
    }] = &cmds[..]
    else {
        panic!("{cmds:?}")
    };
    assert_eq!(reason, "rank 0 on m0 gone");
}

/// A ring growing back after a grow takes in one generation only what its owner's quota
/// allows: the scheduler grants its ranks one by one as it would a start's (it checked one,
/// and the re-form took every free member).
#[test]
fn a_ring_growing_back_takes_only_what_its_owners_quota_allows() {
    let members = members(4);
    let (mut state, id) = shrunk_to_two(&members);
    let owner = state.job(id).unwrap().owner.clone();
    let quota = crate::domain::state::quotas::Quota {
        cpus: Some(3),
        borrow_cpus: Some(0),
        ..Default::default()
    };
    state.quotas.insert(owner, quota);
    let later = 10 + REJOIN_AFTER_MS + 1;
    grow_to_four(&mut state, id, later);
    let cmds = decide(&state, &members, later, &mut secret);
    let (slots, _) = reform_of(&cmds);
    assert_eq!(
        slots.len(),
        3,
        "one joiner within the quota of 3 cpus: {cmds:?}"
    );
}

/// A one-rank command job that never restarts.
const ONE: &str =
    "name = \"o\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 0\ncommand = [\"true\"]\n";

/// Rank 0 of `id`'s `generation` exited 0 at `at`.
fn exited(id: JobId, generation: u32, at: u64) -> ControlCommand {
    ControlCommand::new(
        at,
        Op::WorkerExited(ops::WorkerExited {
            id,
            generation,
            rank: 0,
            code: 0,
            end: None,
        }),
    )
}

/// The jobs `cmds` place.
fn placed(cmds: &[ControlCommand]) -> Vec<JobId> {
    cmds.iter()
        .filter_map(|c| match &c.op {
            Op::Place(ops::Place { id, .. }) => Some(*id),
            _ => None,
        })
        .collect()
}

#[test]
fn a_job_requeued_for_another_waits_while_that_one_does() {
    let members = members(1);
    let mut state = ControlState::default();
    let one = ONE;
    let victim = submit_text(&mut state, one);
    place_all(&mut state, &members, 2);
    let wanted = submit_text(&mut state, one);
    place_all(&mut state, &members, 3);
    assert_eq!(state.job(wanted).unwrap().state, JobState::Pending);
    preempt(&mut state, victim, PreemptAction::Requeue, Some(wanted), 10);
    apply_all(&mut state, &[exited(victim, 1, 20)]);
    assert_eq!(state.job(victim).unwrap().state, JobState::Pending);
    let cmds = decide(&state, &members, 30, &mut secret);
    assert_eq!(
        placed(&cmds),
        [wanted],
        "the older victim does not take the room back"
    );
    apply_all(&mut state, &cmds);
    assert_eq!(state.job(victim).unwrap().preempted_for, Some(wanted));
}

/// A job held for the one it was requeued for is no scheduler entry: its pending reason
/// says what it waits for (it had none), and is not written in the pass that starts that
/// job.
#[test]
fn a_job_held_for_another_says_so() {
    let members = members(1);
    let mut state = ControlState::default();
    let victim = submit_text(&mut state, ONE);
    place_all(&mut state, &members, 2);
    let wanted = submit_text(&mut state, ONE);
    place_all(&mut state, &members, 3);
    preempt(&mut state, victim, PreemptAction::Requeue, Some(wanted), 10);
    apply_all(&mut state, &[exited(victim, 1, 20)]);
    let reasons = |cmds: &[ControlCommand]| -> Vec<(JobId, String)> {
        cmds.iter()
            .filter_map(|c| match &c.op {
                Op::Unplaceable(u) => Some((u.id, u.reason.clone())),
                _ => None,
            })
            .collect()
    };
    // Its member gone for now, the job it was requeued for still waits.
    let cmds = decide(&state, &[], 30, &mut secret);
    assert!(
        reasons(&cmds).contains(&(victim, format!("preempted for {wanted}, which still waits"))),
        "{cmds:?}"
    );
    let cmds = decide(&state, &members, 40, &mut secret);
    assert_eq!(placed(&cmds), [wanted]);
    assert!(
        reasons(&cmds).iter().all(|(id, _)| *id != victim),
        "{cmds:?}"
    );
}

/// Two jobs requeued for each other (bench-sharing's deadlock: a borrower taken back for a
/// job within its quota, which it then took back by priority) do not hold each other
/// forever: a claim ends when its holder is requeued itself, and one of them is placed.
#[test]
fn two_jobs_requeued_for_each_other_do_not_wait_on_each_other_forever() {
    let members = members(1);
    let mut state = ControlState::default();
    let one = ONE;
    let a = submit_text(&mut state, one);
    place_all(&mut state, &members, 2);
    let b = submit_text(&mut state, one);
    place_all(&mut state, &members, 3);
    preempt(&mut state, a, PreemptAction::Requeue, Some(b), 10);
    apply_all(&mut state, &[exited(a, 1, 20)]);
    place_all(&mut state, &members, 30);
    assert_eq!(state.job(b).unwrap().state, JobState::Running);
    let b_generation = state.job(b).unwrap().generation;
    preempt(&mut state, b, PreemptAction::Requeue, Some(a), 40);
    apply_all(&mut state, &[exited(b, b_generation, 50)]);
    assert_eq!(state.job(a).unwrap().preempted_for, Some(b));
    assert_eq!(state.job(b).unwrap().preempted_for, Some(a));
    let cmds = decide(&state, &members, 60, &mut secret);
    assert_eq!(placed(&cmds).len(), 1, "one of the two is placed: {cmds:?}");
}

/// The chief dies around the shrink's entry: a new chief deciding on either side of it
/// finds the job whole (4 ranks, generation 1, as if nothing was asked: the admin asks
/// again) or shrunk (2 ranks, generation 2, held at 2), never in between; every replica
/// that applies the log to that point has the same state.
#[test]
fn a_chief_that_dies_mid_shrink_leaves_the_whole_shrink_or_none_of_it() {
    let members = members(4);
    let mut before = ControlState::default();
    let id = submit_text(&mut before, TRAIN);
    place_all(&mut before, &members, 2);
    let ask = Preempt {
        victim: id,
        action: PreemptAction::Shrink { to_workers: 2 },
        for_job: None,
        reason: None,
    };
    let entry = preempt::execute(&before, &ask, 10, &mut secret).unwrap();
    assert_eq!(entry.len(), 1);
    // Died before the entry committed: the new chief has nothing to finish.
    let later = 10 + REJOIN_AFTER_MS + 1;
    assert!(decide(&before, &members, later, &mut secret).is_empty());
    let job = before.job(id).unwrap();
    assert_eq!(
        (job.generation, job.assignment.len(), job.preemption.clone()),
        (1, 4, None)
    );
    // Died after: the new chief's replica holds the whole shrink and keeps it.
    let mut after = before.clone();
    apply_all(&mut after, &entry);
    let mut replayed = before.clone();
    apply_all(&mut replayed, &entry);
    assert_eq!(replayed, after);
    assert!(decide(&after, &members, later, &mut secret).is_empty());
    let job = after.job(id).unwrap();
    assert_eq!((job.generation, job.assignment.len()), (2, 2));
    assert_eq!(job.growth_ceiling(), 2);
    // The old chief's entry proposed again (a retry after the election) changes nothing.
    let index = after.applied_index + 1;
    assert!(matches!(
        after.apply(index, &entry[0]),
        ControlResponse::Ignored { .. }
    ));
}

/// The scheduler's side: a high-priority job that cannot start shrinks a lower-priority
/// elastic ring (one entry, its history naming the job and its owner), starts on the freed
/// members, and once it is gone the ring is given its ranks back.
#[test]
fn the_scheduler_shrinks_a_low_ring_for_a_high_job_and_gives_the_ranks_back() {
    let members = members(4);
    let mut state = ControlState::default();
    let ring = submit_text(&mut state, TRAIN);
    place_all(&mut state, &members, 2);
    assert_eq!(state.job(ring).unwrap().assignment.len(), 4);
    let high = super::submit_owned(&mut state, "bob", "high", 2);
    let cmds = decide(&state, &members, 20, &mut secret);
    let shrink: Vec<_> = cmds
        .iter()
        .filter_map(|c| match &c.op {
            Op::Preempt(e) => Some(e.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(shrink.len(), 1, "{cmds:?}");
    assert_eq!(shrink[0].id, ring);
    assert_eq!(shrink[0].action, PreemptAction::Shrink { to_workers: 2 });
    apply_all(&mut state, &cmds);
    let job = state.job(ring).unwrap();
    assert_eq!(job.assignment.len(), 2);
    let said: Vec<&str> = job.events.iter().map(|e| e.reason.as_str()).collect();
    let want = format!("preempted for {high} (bob, priority high): shrunk 4 → 2");
    assert!(said.iter().any(|d| d.starts_with(&want)), "{said:?}");
    // The next pass starts the high job on the freed members; the ring waits for them.
    let later = 20 + REJOIN_AFTER_MS + 1;
    let cmds = decide(&state, &members, later, &mut secret);
    assert!(
        cmds.iter()
            .any(|c| matches!(&c.op, Op::Place(p) if p.id == high)),
        "{cmds:?}"
    );
    assert!(
        !cmds.iter().any(|c| matches!(&c.op, Op::Grow(_))),
        "{cmds:?}"
    );
    apply_all(&mut state, &cmds);
    // The high job gone, the capacity is returned to the ring.
    let cancel = ControlCommand::new(later, Op::Cancel(ops::Cancel { id: high }));
    apply_all(&mut state, &[cancel]);
    let cmds = decide(&state, &members, later + 1, &mut secret);
    assert!(
        cmds.iter().any(|c| matches!(
            &c.op,
            Op::Grow(g) if g.id == ring && g.to_workers == 4 && g.reason == "capacity returned"
        )),
        "{cmds:?}"
    );
}
