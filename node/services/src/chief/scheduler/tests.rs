//! The scheduler's rules, one per test, and its invariants as properties over random
//! clusters and arrival traces.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::chief::placement::tests::member;
use crate::domain::spec::Placement;

static NOTHING: BTreeSet<String> = BTreeSet::new();

fn id(n: u64) -> JobId {
    JobId::from_log_index(n)
}

fn req(workers: u32, cpus: u32, gpus: u32) -> Request {
    Request {
        workers,
        cpus_per_worker: cpus,
        gpus_per_worker: gpus,
        placement: Placement::Spread,
    }
}

fn waiting<'a>(n: u64, owner: &'a str, priority: u32, request: Request) -> Waiting<'a> {
    Waiting {
        id: id(n),
        owner,
        priority,
        submitted_at_ms: n,
        request,
        min_workers: request.workers,
        home: None,
        avoid: &NOTHING,
        trial: None,
    }
}

fn running<'a>(
    n: u64,
    owner: &'a str,
    priority: u32,
    slots: &'a [Slot],
    r: Request,
) -> Running<'a> {
    Running {
        id: id(n),
        owner,
        priority,
        slots,
        cpus_per_worker: r.cpus_per_worker,
        gpus_per_worker: r.gpus_per_worker,
        min_workers: slots.len() as u32,
        elastic: false,
        may_grow: false,
        grow_by: 1,
        joiners_exclude: slots.iter().map(|s| s.member.as_str()).collect(),
        trial_of: None,
        preemptible: true,
        started_at_ms: 0,
        stopping: None,
    }
}

/// `ranks` slots of `r` on `members` (in turn), taken from them.
fn hold(members: &mut [Candidate], on: &[usize], r: &Request) -> Vec<Slot> {
    let mut slots = Vec::new();
    for (rank, i) in on.iter().enumerate() {
        let c = &mut members[*i];
        let gpus: Vec<u32> = placement::free_gpus(c)
            .into_iter()
            .take(r.gpus_per_worker as usize)
            .collect();
        c.used_cpus += r.cpus_per_worker;
        c.used_gpus.extend(&gpus);
        slots.push(Slot {
            member: c.id.clone(),
            name: c.name.clone(),
            rank: rank as u32,
            local_rank: 0,
            worker: rank as u32,
            gpus,
        });
    }
    slots
}

fn reason_of(d: &Decisions, n: u64) -> Option<&str> {
    d.reasons
        .iter()
        .find(|r| r.id == id(n))
        .map(|r| r.text.as_str())
}

fn started(d: &Decisions) -> Vec<JobId> {
    d.starts.iter().map(|s| s.id).collect()
}

fn quota(cpus: u32, borrow_cpus: Option<u32>) -> Quota {
    Quota {
        cpus: Some(cpus),
        borrow_cpus,
        ..Quota::default()
    }
}

#[test]
fn higher_priority_starts_first_and_the_other_says_why_it_waits() {
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members: vec![member("a", 2, 0)],
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![
            waiting(1, "alice", priority::LOW, req(1, 2, 0)),
            waiting(2, "bob", priority::HIGH, req(1, 2, 0)),
        ],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(started(&d), vec![id(2)]);
    assert_eq!(d.order, vec![(id(2), None), (id(1), None)]);
    assert_eq!(reason_of(&d, 1), Some("waiting for 2 cpus: 0 free"));
}

#[test]
fn a_user_at_quota_waits_with_the_quota_named() {
    let mut members = vec![member("a", 8, 0)];
    let r = req(4, 1, 0);
    let slots = hold(&mut members, &[0, 0, 0, 0], &r);
    let quotas = BTreeMap::from([("alice".to_owned(), quota(4, Some(0)))]);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![
            waiting(2, "alice", priority::NORMAL, req(2, 1, 0)),
            waiting(3, "bob", priority::NORMAL, req(2, 1, 0)),
        ],
        running: vec![running(1, "alice", priority::NORMAL, &slots, r)],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(started(&d), vec![id(3)]);
    assert_eq!(
        reason_of(&d, 2),
        Some("waiting for 2 cpus: alice's quota 4/4 cpus in use")
    );
}

#[test]
fn an_unset_borrow_limit_borrows_idle_capacity_and_a_group_quota_binds_its_members() {
    let quotas = BTreeMap::from([
        (
            "alice".to_owned(),
            Quota {
                group: Some("lab".into()),
                ..quota(1, None)
            },
        ),
        ("@lab".to_owned(), quota(2, Some(0))),
    ]);
    let cluster = ClusterView {
        members: vec![member("a", 8, 0)],
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![
            waiting(1, "alice", priority::NORMAL, req(2, 1, 0)),
            waiting(2, "alice", priority::NORMAL, req(1, 1, 0)),
        ],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    // Alice borrows one cpu above her own quota of 1, and her group's 2 are then full.
    assert_eq!(started(&d), vec![id(1)]);
    assert_eq!(
        reason_of(&d, 2),
        Some("waiting for 1 cpu: @lab's quota 2/2 cpus in use")
    );
}

/// A borrower leaves what another user's waiting job claims from its unused quota; the
/// part of its job within its own quota comes from the same free room, so the whole job
/// must leave the claim free (sharing.md: capacity "that no other user's waiting job
/// claims").
#[test]
fn borrowing_leaves_what_a_waiting_users_quota_claims() {
    for (bobs_quota, reason) in [
        (
            None,
            "waiting to borrow 4 cpus: 4 free, 2 claimed by others' quotas",
        ),
        (
            Some(2),
            "waiting to borrow 2 cpus (4 cpus in all): 4 free, 2 claimed by others' quotas",
        ),
    ] {
        let mut quotas = BTreeMap::from([("alice".to_owned(), quota(2, None))]);
        if let Some(cpus) = bobs_quota {
            quotas.insert("bob".to_owned(), quota(cpus, None));
        }
        let cluster = ClusterView {
            members: vec![member("a", 4, 0)],
            quotas: &quotas,
        };
        let queue = QueueView {
            waiting: vec![
                waiting(1, "bob", priority::HIGH, req(4, 1, 0)),
                waiting(2, "alice", priority::LOW, req(2, 1, 0)),
            ],
            ..QueueView::default()
        };
        let d = schedule(&cluster, &queue, 10);
        assert_eq!(started(&d), vec![id(2)], "bob's quota {bobs_quota:?}");
        assert_eq!(reason_of(&d, 1), Some(reason));
    }
}

#[test]
fn a_gang_is_placed_whole_and_an_elastic_one_down_to_its_floor() {
    let quotas = BTreeMap::new();
    let mut members: Vec<Candidate> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| member(n, 1, 0))
        .collect();
    let r = req(1, 1, 0);
    let slots = hold(&mut members, &[3], &r);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let rigid = waiting(1, "alice", priority::HIGH, req(4, 1, 0));
    let mut elastic = waiting(2, "bob", priority::NORMAL, req(4, 1, 0));
    elastic.min_workers = 2;
    let queue = QueueView {
        waiting: vec![rigid, elastic],
        running: vec![running(9, "carol", priority::HIGH, &slots, r)],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(reason_of(&d, 1), Some("gang of 4: at most 3 fit now"));
    // The rigid job's reservation holds what it will need: the elastic one waits behind it.
    assert!(d.starts.is_empty());
    assert_eq!(reason_of(&d, 2), Some("position 2 of 2 (priority normal)"));

    let queue = QueueView {
        waiting: vec![queue.waiting[1].clone()],
        running: queue.running.clone(),
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(d.starts.len(), 1);
    assert_eq!(d.starts[0].slots.len(), 3);
}

#[test]
fn a_gpu_job_names_the_largest_free_gpu_count() {
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members: vec![member("a", 8, 1), member("b", 8, 1)],
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![waiting(1, "alice", priority::NORMAL, req(1, 1, 2))],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(
        reason_of(&d, 1),
        Some("no member has 2 GPUs free (largest: 1)")
    );
}

/// Spent GPU-hours hold alice's GPU job back, not her CPU job; and her held job cannot
/// start, so her GPU quota claims nothing for it: bob borrows the GPUs meanwhile.
#[test]
fn spent_gpu_hours_hold_gpu_jobs_but_not_cpu_jobs() {
    let quotas = BTreeMap::from([(
        "alice".to_owned(),
        Quota {
            gpus: Some(2),
            gpu_hours: Some(40.0),
            ..Quota::default()
        },
    )]);
    let cluster = ClusterView {
        members: vec![member("a", 8, 2)],
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![
            waiting(1, "alice", priority::NORMAL, req(2, 1, 1)),
            waiting(2, "alice", priority::NORMAL, req(1, 1, 0)),
            waiting(3, "bob", priority::NORMAL, req(2, 1, 1)),
        ],
        gpu_ms: BTreeMap::from([("alice".to_owned(), 40 * 3_600_000)]),
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(started(&d), vec![id(2), id(3)]);
    assert_eq!(
        reason_of(&d, 1),
        Some("gpu-hours of alice spent (40.0/40.0 in 7 d)")
    );
}

#[test]
fn backfill_uses_only_what_the_blocked_head_cannot_use() {
    let quotas = BTreeMap::new();
    // Member a has 4 cpus, 2 held; b has 2 cpus. The head needs one rank of 4 cpus: only a
    // can ever hold it, so a's 2 free cpus are kept for it and b's go to a small job.
    let mut members = vec![member("a", 4, 0), member("b", 2, 0)];
    let r = req(1, 2, 0);
    let slots = hold(&mut members, &[0], &r);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![
            waiting(2, "alice", priority::HIGH, req(1, 4, 0)),
            waiting(3, "bob", priority::NORMAL, req(2, 1, 0)),
            waiting(4, "bob", priority::NORMAL, req(1, 1, 0)),
        ],
        running: vec![running(1, "carol", priority::HIGH, &slots, r)],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(started(&d), vec![id(3)]);
    assert!(d.starts[0].slots.iter().all(|s| s.member == "id-b"));
    assert_eq!(reason_of(&d, 4), Some("position 3 of 3 (priority normal)"));
}

#[test]
fn at_equal_priority_the_smaller_share_goes_first() {
    let mut members = vec![member("a", 3, 0)];
    let r = req(2, 1, 0);
    let slots = hold(&mut members, &[0, 0], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let queue = QueueView {
        waiting: vec![
            waiting(2, "alice", priority::NORMAL, req(1, 1, 0)),
            waiting(3, "bob", priority::NORMAL, req(1, 1, 0)),
        ],
        running: vec![running(1, "alice", priority::NORMAL, &slots, r)],
        ..QueueView::default()
    };
    assert_eq!(started(&schedule(&cluster, &queue, 10)), vec![id(3)]);

    // With weight 4, alice's share per weight is below bob's 0.
    let weighted = BTreeMap::from([(
        "alice".to_owned(),
        Quota {
            weight: Some(4),
            ..Quota::default()
        },
    )]);
    let mut queue = queue;
    queue.running.clear();
    let cluster = ClusterView {
        members: vec![member("a", 1, 0)],
        quotas: &weighted,
    };
    assert_eq!(started(&schedule(&cluster, &queue, 10)), vec![id(2)]);
}

#[test]
fn a_long_wait_raises_a_low_job_above_a_fresh_normal_one() {
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members: vec![member("a", 1, 0)],
        quotas: &quotas,
    };
    let mut old = waiting(1, "alice", priority::LOW, req(1, 1, 0));
    old.submitted_at_ms = 0;
    let mut fresh = waiting(2, "bob", priority::NORMAL, req(1, 1, 0));
    let now = 4 * AGING_STEP_MS;
    fresh.submitted_at_ms = now - 1;
    let queue = QueueView {
        waiting: vec![fresh, old],
        ..QueueView::default()
    };
    assert_eq!(started(&schedule(&cluster, &queue, now - 1)), vec![id(2)]);
    assert_eq!(started(&schedule(&cluster, &queue, now)), vec![id(1)]);
}

#[test]
fn a_high_job_shrinks_an_elastic_job_before_requeueing_a_rigid_one() {
    let mut members: Vec<Candidate> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| member(n, 1, 0))
        .collect();
    members.push(member("e", 2, 0));
    let r = req(1, 1, 0);
    let elastic_slots = hold(&mut members, &[0, 1, 2, 3], &r);
    let rigid_slots = hold(&mut members, &[4, 4], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut elastic = running(1, "alice", priority::LOW, &elastic_slots, r);
    elastic.elastic = true;
    elastic.min_workers = 2;
    let rigid = running(2, "alice", priority::LOW, &rigid_slots, r);
    let queue = QueueView {
        waiting: vec![waiting(3, "bob", priority::HIGH, req(2, 1, 0))],
        running: vec![rigid, elastic],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(
        d.preempt,
        vec![Preempt {
            victim: id(1),
            action: Action::Shrink { to_workers: 2 },
            for_job: id(3),
            reason: format!("preempted for {} (bob, priority high)", id(3)),
        }]
    );
    assert!(
        reason_of(&d, 3)
            .unwrap()
            .ends_with("; preempting j-1 (shrink to 2)")
            || reason_of(&d, 3).unwrap().contains("(shrink to 2)")
    );

    // Nothing of lower priority: nothing asked.
    let mut queue = queue;
    queue.waiting[0].priority = priority::LOW;
    assert!(schedule(&cluster, &queue, 10).preempt.is_empty());
}

/// bench-sharing's deadlock: bob's high job borrowed a rank, was requeued for carol's job
/// within her quota, and then took carol's ranks back by priority, and so on. A job that
/// would borrow takes by priority only from its own owner or from others that borrow.
#[test]
fn a_borrowing_job_never_preempts_another_owners_work_within_its_quota() {
    let mut members = vec![member("a", 2, 0), member("b", 2, 0)];
    let r = req(1, 1, 0);
    let carol_slots = hold(&mut members, &[0, 0, 1], &r);
    let quotas = BTreeMap::from([
        ("bob".to_owned(), quota(3, None)),
        ("carol".to_owned(), quota(3, None)),
    ]);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let carol = running(1, "carol", priority::LOW, &carol_slots, r);
    // Bob's 4-rank high job would borrow one rank above his quota of 3.
    let queue = QueueView {
        waiting: vec![waiting(2, "bob", priority::HIGH, req(4, 1, 0))],
        running: vec![carol],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert!(d.preempt.is_empty(), "{:?}", d.preempt);
    assert!(reason_of(&d, 2).is_some());

    // Within his quota (3 ranks), bob's high job takes carol's low work by priority.
    let mut queue = queue;
    queue.waiting[0].request = req(3, 1, 0);
    queue.waiting[0].min_workers = 3;
    assert_eq!(schedule(&cluster, &queue, 10).preempt.len(), 1);

    // Borrowing, it still takes from carol when she borrows too.
    let quotas = BTreeMap::from([
        ("bob".to_owned(), quota(3, None)),
        ("carol".to_owned(), quota(2, None)),
    ]);
    let cluster = ClusterView {
        members: cluster.members.clone(),
        quotas: &quotas,
    };
    queue.waiting[0].request = req(4, 1, 0);
    queue.waiting[0].min_workers = 4;
    assert_eq!(schedule(&cluster, &queue, 10).preempt.len(), 1);
}

/// bench-sharing's circle in two steps: bob's high job, borrowing, took alice's ranks by
/// priority while she borrowed; her normal job, then within her quota, took bob's borrowed
/// rank back, and so on. Borrowed work is taken back only for a job of at least its
/// priority.
#[test]
fn borrowed_work_is_taken_back_only_for_a_job_of_at_least_its_priority() {
    let mut members = vec![member("a", 2, 0), member("b", 2, 0)];
    let r = req(1, 1, 0);
    let bob_slots = hold(&mut members, &[0, 0, 1, 1], &r);
    let quotas = BTreeMap::from([
        ("alice".to_owned(), quota(2, None)),
        ("bob".to_owned(), quota(3, None)),
    ]);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    // Bob's high job holds 4 ranks, one borrowed; alice's normal job of 1 is within quota.
    let queue = QueueView {
        waiting: vec![waiting(2, "alice", priority::NORMAL, req(1, 1, 0))],
        running: vec![running(1, "bob", priority::HIGH, &bob_slots, r)],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert!(d.preempt.is_empty(), "{:?}", d.preempt);
    assert!(reason_of(&d, 2).is_some());
    // Bob's borrowing job of normal priority (as alice's) is taken back.
    let mut queue = queue;
    queue.running[0].priority = priority::NORMAL;
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(d.preempt.len(), 1, "{:?}", d.preempt);
    assert_eq!(d.preempt[0].victim, id(1));
}

#[test]
fn a_rigid_victim_is_requeued_and_trials_are_paused_per_search() {
    let mut members = vec![member("a", 1, 0), member("b", 1, 0)];
    let r = req(1, 1, 0);
    let trial_slots = hold(&mut members, &[0], &r);
    let rigid_slots = hold(&mut members, &[1], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut trial = running(1, "alice", priority::LOW, &trial_slots, r);
    trial.trial_of = Some(id(9));
    let rigid = running(2, "alice", priority::LOW, &rigid_slots, r);
    let queue = QueueView {
        waiting: vec![waiting(3, "bob", priority::HIGH, req(2, 1, 0))],
        running: vec![rigid, trial],
        ..QueueView::default()
    };
    let actions: Vec<(JobId, Action)> = schedule(&cluster, &queue, 10)
        .preempt
        .into_iter()
        .map(|p| (p.victim, p.action))
        .collect();
    assert_eq!(
        actions,
        vec![
            (id(2), Action::Requeue),
            (id(9), Action::PauseTrials { count: 1 })
        ]
    );
}

/// A trial paused for a job holds its ranks until it stops (up to its grace): the passes
/// meanwhile count them as leaving for that job and ask no one else (they paused one more
/// trial every pass, until the search had none running).
#[test]
fn a_victim_still_stopping_is_not_replaced_by_another_at_the_next_pass() {
    let mut members = vec![member("a", 1, 0), member("b", 1, 0), member("c", 1, 0)];
    let r = req(1, 1, 0);
    let stopping_slots = hold(&mut members, &[0], &r);
    let other_slots = hold(&mut members, &[1], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut stopping = running(1, "alice", priority::LOW, &stopping_slots, r);
    stopping.trial_of = Some(id(9));
    stopping.stopping = Some(Some(id(3)));
    let mut other = running(2, "alice", priority::LOW, &other_slots, r);
    other.trial_of = Some(id(9));
    let queue = QueueView {
        waiting: vec![waiting(3, "bob", priority::HIGH, req(2, 1, 0))],
        running: vec![stopping, other],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(d.preempt, vec![]);
    assert_eq!(
        reason_of(&d, 3),
        Some("gang of 2: at most 1 fit now; the work preempted for it is stopping")
    );
    // Its room is held: a job behind it does not take the free member meanwhile.
    let mut queue = queue;
    queue
        .waiting
        .push(waiting(4, "carol", priority::LOW, req(1, 1, 0)));
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(started(&d), vec![]);

    // A victim stopping for another job is not counted for this one, nor asked again.
    queue.running[0].stopping = Some(Some(id(7)));
    queue.waiting.truncate(1);
    let d = schedule(&cluster, &queue, 10);
    let actions: Vec<(JobId, Action)> = d
        .preempt
        .into_iter()
        .map(|p| (p.victim, p.action))
        .collect();
    assert_eq!(actions, vec![(id(9), Action::PauseTrials { count: 1 })]);
}

/// A ring that grows back after a grow asks for all it lacks at once; each rank is granted
/// as a start's would be, within its owner's quota.
#[test]
fn a_ring_growing_back_is_granted_its_ranks_within_its_owners_quota() {
    for (cpus, to_workers) in [(4, 3), (5, 4)] {
        let mut members: Vec<Candidate> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|n| member(n, 1, 0))
            .collect();
        let r = req(1, 1, 0);
        let ring_slots = hold(&mut members, &[0, 1], &r);
        let other_slots = hold(&mut members, &[2], &r);
        let quotas = BTreeMap::from([("alice".to_owned(), quota(cpus, Some(0)))]);
        let cluster = ClusterView {
            members,
            quotas: &quotas,
        };
        let mut ring = running(1, "alice", priority::NORMAL, &ring_slots, r);
        ring.elastic = true;
        ring.may_grow = true;
        ring.grow_by = 2;
        let queue = QueueView {
            running: vec![ring, running(2, "alice", priority::NORMAL, &other_slots, r)],
            ..QueueView::default()
        };
        let d = schedule(&cluster, &queue, 10);
        assert_eq!(
            d.grows,
            vec![Grow {
                job: id(1),
                to_workers
            }],
            "quota {cpus}"
        );
    }
}

/// A low job aged to the head of the queue that nothing can make room for does not stop a
/// fresh high job behind it from preempting: the high job's plan comes next.
#[test]
fn a_head_that_no_preemption_helps_leaves_the_next_job_its_plan() {
    let mut members = vec![member("a", 2, 0)];
    let r = req(1, 2, 0);
    let slots = hold(&mut members, &[0], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let now_ms = 9 * 3_600_000;
    let aged = waiting(1, "alice", priority::LOW, req(1, 3, 0));
    let mut fresh = waiting(2, "bob", priority::HIGH, r);
    fresh.submitted_at_ms = now_ms - 1;
    let queue = QueueView {
        waiting: vec![aged, fresh],
        running: vec![running(3, "carol", priority::NORMAL, &slots, r)],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, now_ms);
    assert_eq!(d.order[0], (id(1), None), "aged to the head");
    let actions: Vec<(JobId, Action, JobId)> = d
        .preempt
        .iter()
        .map(|p| (p.victim, p.action, p.for_job))
        .collect();
    assert_eq!(actions, vec![(id(3), Action::Requeue, id(2))]);
}

#[test]
fn a_shrunk_job_grows_back_before_lower_priority_work_starts() {
    let mut members = vec![member("a", 1, 0), member("b", 1, 0)];
    let r = req(1, 1, 0);
    let slots = hold(&mut members, &[0], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut shrunk = running(1, "alice", priority::NORMAL, &slots, r);
    shrunk.elastic = true;
    shrunk.may_grow = true;
    let queue = QueueView {
        waiting: vec![waiting(2, "bob", priority::LOW, req(1, 1, 0))],
        running: vec![shrunk],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(
        d.grows,
        vec![Grow {
            job: id(1),
            to_workers: 2
        }]
    );
    assert!(d.starts.is_empty());
    // The growth's room is left for the re-form to take.
    assert_eq!(placement::room(&d.left, &r), 1);
}

/// A ring whose owner borrows does not grow into what another owner's waiting job claims
/// within its quota: taken back from a borrower, the room goes to that job, not to the
/// borrower's growth (which goes first at its priority).
#[test]
fn a_borrowers_growth_leaves_what_a_waiting_users_quota_claims() {
    let mut members = vec![member("a", 2, 0), member("b", 2, 0)];
    let r = req(1, 1, 0);
    let slots = hold(&mut members, &[0, 0, 1], &r);
    let quotas = BTreeMap::from([
        ("alice".to_owned(), quota(2, None)),
        ("carol".to_owned(), quota(2, None)),
    ]);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut ring = running(1, "alice", priority::LOW, &slots, r);
    ring.elastic = true;
    ring.may_grow = true;
    ring.min_workers = 2;
    ring.joiners_exclude = BTreeSet::new();
    let queue = QueueView {
        waiting: vec![waiting(2, "carol", priority::LOW, req(1, 1, 0))],
        running: vec![ring],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert!(d.grows.is_empty(), "{:?}", d.grows);
    assert_eq!(started(&d), vec![id(2)]);
}

/// One member of `cpus` one-cpu slots, wholly held: alice's elastic ring of 4 ranks (floor 2)
/// and `others` ranks of another job; quotas of cpus with unlimited borrowing.
struct Held {
    members: Vec<Candidate>,
    ring: Vec<Slot>,
    others: Vec<Slot>,
    quotas: BTreeMap<String, Quota>,
}

impl Held {
    fn new(cpus: u32, quotas: &[(&str, u32)]) -> Held {
        let mut members = vec![member("a", cpus, 0)];
        let ring = hold(&mut members, &[0; 4], &req(1, 1, 0));
        let others = hold(&mut members, &vec![0; cpus as usize - 4], &req(1, 1, 0));
        let quotas = quotas
            .iter()
            .map(|(owner, cpus)| (owner.to_string(), quota(*cpus, None)))
            .collect();
        Held {
            members,
            ring,
            others,
            quotas,
        }
    }

    fn cluster(&self) -> ClusterView<'_> {
        ClusterView {
            members: self.members.clone(),
            quotas: &self.quotas,
        }
    }

    /// Alice's ring, j-1.
    fn ring(&self, priority: u32) -> Running<'_> {
        let mut ring = running(1, "alice", priority, &self.ring, req(1, 1, 0));
        ring.elastic = true;
        ring.min_workers = 2;
        ring
    }

    /// A pass with `waiting` beside alice's ring of normal priority alone.
    fn schedule(&self, waiting: Vec<Waiting<'_>>) -> Decisions {
        let queue = QueueView {
            waiting,
            running: vec![self.ring(priority::NORMAL)],
            ..QueueView::default()
        };
        schedule(&self.cluster(), &queue, 10)
    }
}

/// What a pass asks to give way: (victim, action, for whom).
fn asked(d: &Decisions) -> Vec<(JobId, Action, JobId)> {
    d.preempt
        .iter()
        .map(|p| (p.victim, p.action, p.for_job))
        .collect()
}

/// bench-sharing's detour (2026-12-07): bob's high job, which would borrow, shrank alice's
/// borrowing ring; alice, back within her quota, had a job waiting that claimed the freed
/// room, so it started there and bob's job still waited. Preemption is planned only for
/// room its requester would get.
#[test]
fn a_borrower_preempts_nobody_when_a_claimant_would_take_the_freed_room() {
    let held = Held::new(4, &[("alice", 3), ("bob", 0)]);
    // Alice's ring borrows 1 of its 4 ranks; her waiting job would borrow too, so it claims
    // nothing now, but would claim a cpu of her quota once the ring is shrunk to 2 for bob.
    let d = held.schedule(vec![
        waiting(2, "alice", priority::NORMAL, req(1, 1, 0)),
        waiting(3, "bob", priority::HIGH, req(2, 1, 0)),
    ]);
    assert_eq!(asked(&d), vec![]);
    assert_eq!(
        reason_of(&d, 3),
        Some("waiting to borrow 2 cpus: preempting would free room claimed by others' quotas")
    );
}

/// The same borrower, with no claimant waiting: the freed room is its, and it preempts.
#[test]
fn a_borrower_still_preempts_when_the_freed_room_is_unclaimed() {
    let held = Held::new(4, &[("alice", 3), ("bob", 0)]);
    let d = held.schedule(vec![waiting(3, "bob", priority::HIGH, req(2, 1, 0))]);
    assert_eq!(
        asked(&d),
        vec![(id(1), Action::Shrink { to_workers: 2 }, id(3))]
    );
    assert_eq!(
        reason_of(&d, 3),
        Some("waiting for 2 cpus: 0 free; preempting j-1 (shrink to 2)")
    );
}

/// A job within its owner's quota takes borrowed work back as before: the room it frees is
/// its own quota's, which no borrower behind it (bob) may take.
#[test]
fn a_job_within_its_quota_still_takes_borrowed_work_back() {
    let held = Held::new(4, &[("alice", 2), ("bob", 0), ("carol", 2)]);
    let d = held.schedule(vec![
        waiting(2, "carol", priority::NORMAL, req(2, 1, 0)),
        waiting(3, "bob", priority::NORMAL, req(2, 1, 0)),
    ]);
    assert_eq!(
        asked(&d),
        vec![(id(1), Action::Shrink { to_workers: 2 }, id(2))]
    );
    assert_eq!(
        reason_of(&d, 2),
        Some("waiting for 2 cpus: 0 free; preempting j-1 (shrink to 2)")
    );
}

/// When the room others' victims would free is claimed, a borrower's own owner's work is
/// taken instead: what that frees, the job no longer borrows.
#[test]
fn a_borrower_takes_its_owners_own_work_when_others_freed_room_is_claimed() {
    let held = Held::new(6, &[("alice", 3), ("bob", 2)]);
    // Alice's low ring borrows 1; shrunk to 2 for bob, her waiting job would claim one of
    // the 2 freed cpus. Bob's high job would borrow 2 beside his normal one.
    let bobs = running(2, "bob", priority::NORMAL, &held.others, req(1, 1, 0));
    let queue = QueueView {
        waiting: vec![
            waiting(3, "alice", priority::LOW, req(1, 1, 0)),
            waiting(4, "bob", priority::HIGH, req(2, 1, 0)),
        ],
        running: vec![held.ring(priority::LOW), bobs],
        ..QueueView::default()
    };
    let d = schedule(&held.cluster(), &queue, 10);
    assert_eq!(asked(&d), vec![(id(2), Action::Requeue, id(4))]);
    assert_eq!(
        reason_of(&d, 4),
        Some("waiting for 2 cpus: 0 free; preempting j-2 (requeue)")
    );
}

/// bench-sharing, 2026-12-07 (after the rule above): bob's high job, within his quota but
/// for his own low train ring, waited 239 s: shrinking alice's borrowing ring put her back
/// within her quota, her waiting job claimed the room, and bob's ring at its floor was no
/// victim. His own work alone is taken, past the ring's floor, until he no longer borrows.
#[test]
fn a_borrower_requeues_its_owners_own_ring_to_come_within_its_quota() {
    let mut members = vec![member("a", 8, 0)];
    let r = req(1, 1, 0);
    let bob_slots = hold(&mut members, &[0; 3], &r);
    let alice_slots = hold(&mut members, &[0; 5], &r);
    let quotas = BTreeMap::from([
        ("alice".to_owned(), quota(4, None)),
        ("bob".to_owned(), quota(3, None)),
    ]);
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut bobs = running(1, "bob", priority::LOW, &bob_slots, r);
    let mut alices = running(2, "alice", priority::LOW, &alice_slots, r);
    for ring in [&mut bobs, &mut alices] {
        ring.elastic = true;
        ring.min_workers = 2;
    }
    let queue = QueueView {
        waiting: vec![
            waiting(3, "alice", priority::LOW, req(2, 1, 0)),
            waiting(4, "bob", priority::HIGH, req(3, 1, 0)),
        ],
        running: vec![bobs, alices],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(asked(&d), vec![(id(1), Action::Requeue, id(4))]);
}

/// A borrower's room claimed by a job within its quota behind it: that job takes the
/// borrowed work back for itself (before, the borrower asked and the claimant took it). It
/// frees two ranks: one beside the one bob's reservation holds; with both free, bob's
/// borrow fits beside carol's claim and both start.
#[test]
fn a_claimant_behind_a_borrower_whose_room_it_claims_takes_borrowed_work_back() {
    let held = Held::new(4, &[("alice", 3), ("bob", 0), ("carol", 1)]);
    let d = held.schedule(vec![
        waiting(2, "bob", priority::HIGH, req(1, 1, 0)),
        waiting(3, "carol", priority::NORMAL, req(1, 1, 0)),
    ]);
    assert_eq!(
        asked(&d),
        vec![(id(1), Action::Shrink { to_workers: 2 }, id(3))]
    );
    assert_eq!(
        reason_of(&d, 2),
        Some("waiting to borrow 1 cpu: preempting would free room claimed by others' quotas")
    );
}

/// A growth that goes first at its priority would take what requeueing a low job frees for
/// a normal one: nothing is requeued, and the job says why.
#[test]
fn nothing_is_preempted_for_room_that_work_ahead_would_take() {
    let mut members = vec![member("a", 2, 0)];
    let r = req(1, 1, 0);
    let ring_slots = hold(&mut members, &[0], &r);
    let low_slots = hold(&mut members, &[0], &r);
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let mut ring = running(1, "dave", priority::HIGH, &ring_slots, r);
    ring.elastic = true;
    ring.may_grow = true;
    ring.joiners_exclude = BTreeSet::new();
    let queue = QueueView {
        waiting: vec![waiting(3, "bob", priority::NORMAL, req(1, 1, 0))],
        running: vec![ring, running(2, "erin", priority::LOW, &low_slots, r)],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(asked(&d), vec![]);
    assert_eq!(
        reason_of(&d, 3),
        Some("waiting for 1 cpu: 0 free; preempting would free room that work ahead of it takes")
    );
}

/// bench-sharing (2026-12-07, late): a ring was shrunk for carol's 3-rank job, whose start
/// counted on two slots free already; a 1-rank job of hers behind it took one of them in the
/// same pass (its reservation lay elsewhere), and the 3-rank job waited 57 s more. The room a
/// job is preempted for is held for it from the pass that asks, its free part included.
#[test]
fn the_room_a_job_preempts_for_is_held_for_it_while_the_victims_leave() {
    let mut members: Vec<Candidate> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| member(n, 3, 0))
        .collect();
    let bobs = hold(&mut members, &[0, 0, 0, 1, 1, 1], &req(1, 1, 0));
    let ring = hold(&mut members, &[3, 3, 3, 2], &req(1, 1, 0));
    let quotas: BTreeMap<String, Quota> = [("alice", 2), ("bob", 6), ("carol", 4)]
        .iter()
        .map(|(owner, cpus)| (owner.to_string(), quota(*cpus, None)))
        .collect();
    let mut alices = running(1, "alice", priority::NORMAL, &ring, req(1, 1, 0));
    alices.elastic = true;
    alices.min_workers = 2;
    let queue = QueueView {
        waiting: vec![
            waiting(3, "carol", priority::NORMAL, req(3, 1, 0)),
            waiting(4, "carol", priority::NORMAL, req(1, 1, 0)),
        ],
        running: vec![
            alices,
            running(2, "bob", priority::NORMAL, &bobs, req(1, 1, 0)),
        ],
        ..QueueView::default()
    };
    let cluster = ClusterView {
        members,
        quotas: &quotas,
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(
        asked(&d),
        vec![(id(1), Action::Shrink { to_workers: 3 }, id(3))]
    );
    assert_eq!(started(&d), Vec::<JobId>::new(), "{:?}", d.reasons);
}

fn trial<'a>(n: u64, i: u32, owner: &'a str, priority: u32, request: Request) -> Waiting<'a> {
    Waiting {
        submitted_at_ms: 0,
        trial: Some(i),
        ..waiting(n, owner, priority, request)
    }
}

#[test]
fn a_high_job_starts_before_a_low_searchs_trials_which_take_only_what_is_left() {
    let quotas = BTreeMap::new();
    let cluster = ClusterView {
        members: vec![member("a", 4, 0), member("b", 2, 0)],
        quotas: &quotas,
    };
    let t = req(1, 2, 0);
    let queue = QueueView {
        waiting: vec![
            trial(9, 0, "alice", priority::LOW, t),
            trial(9, 1, "alice", priority::LOW, t),
            trial(9, 2, "alice", priority::LOW, t),
            waiting(2, "bob", priority::HIGH, req(2, 2, 0)),
        ],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(
        d.order,
        vec![
            (id(2), None),
            (id(9), Some(0)),
            (id(9), Some(1)),
            (id(9), Some(2))
        ]
    );
    let starts: Vec<(JobId, Option<u32>)> = d.starts.iter().map(|s| (s.id, s.trial)).collect();
    assert_eq!(starts, vec![(id(2), None), (id(9), Some(0))]);
    assert!(
        d.starts[1].slots.len() == 1,
        "a trial is a gang of its workers"
    );
    let waits: Vec<Option<u32>> = d.reasons.iter().map(|r| r.trial).collect();
    assert_eq!(waits, vec![Some(1), Some(2)]);
    assert_eq!(d.reasons[0].text, "waiting for 2 cpus: 0 free");
    assert!(
        d.preempt.is_empty(),
        "a trial entry asks nobody to give way"
    );
}

#[test]
fn a_searchs_trials_stay_within_its_owners_quota_and_say_so() {
    let quotas = BTreeMap::from([("alice".to_owned(), quota(4, Some(0)))]);
    let cluster = ClusterView {
        members: vec![member("a", 16, 0)],
        quotas: &quotas,
    };
    let t = req(1, 2, 0);
    let queue = QueueView {
        waiting: (0..4)
            .map(|i| trial(9, i, "alice", priority::NORMAL, t))
            .collect(),
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, 10);
    assert_eq!(d.starts.len(), 2);
    assert_eq!(d.reasons.len(), 2);
    assert!(d.reasons.iter().all(|r| r.cause == Cause::Quota));
    assert_eq!(
        d.reasons[0].text,
        "waiting for 2 cpus: alice's quota 4/4 cpus in use"
    );
}

#[test]
fn a_searchs_trials_do_not_age_past_fresh_work() {
    let quotas = BTreeMap::new();
    let mut members = vec![member("a", 4, 0)];
    let busy = hold(&mut members, &[0], &req(1, 4, 0));
    let cluster = ClusterView {
        members: members.clone(),
        quotas: &quotas,
    };
    let t = req(1, 4, 0);
    // Ten hours after the search's submit: a job that waited so long would be at the top,
    // a search's trials stay at its priority.
    let now = 10 * AGING_STEP_MS;
    let mut fresh = waiting(2, "bob", priority::NORMAL, req(1, 4, 0));
    fresh.submitted_at_ms = now;
    let queue = QueueView {
        waiting: vec![
            trial(9, 0, "alice", priority::LOW, t),
            trial(9, 1, "alice", priority::LOW, t),
            fresh,
        ],
        running: vec![running(5, "carol", priority::HIGH, &busy, req(1, 4, 0))],
        ..QueueView::default()
    };
    let d = schedule(&cluster, &queue, now);
    assert_eq!(d.order[0], (id(2), None));
    // Bob's job holds the one reservation the cluster has room for; the trials wait.
    assert!(d.starts.is_empty());
    assert_eq!(d.reasons.len(), 3);
    assert!(d.reasons[1..].iter().all(|r| r.trial.is_some()));
}

// --- Properties --------------------------------------------------------------------------

const USERS: [&str; 3] = ["alice", "bob", "carol"];

#[derive(Debug, Clone)]
struct Arrival {
    at_step: u32,
    owner: usize,
    priority: u32,
    workers: u32,
    min_workers: u32,
    cpus: u32,
    gpus: u32,
    steps: u32,
}

fn arrival() -> impl Strategy<Value = Arrival> {
    (
        0u32..6,
        0usize..3,
        prop_oneof![Just(100u32), Just(500), Just(900), 0u32..=1000],
        1u32..4,
        0u32..3,
        1u32..3,
        0u32..2,
        1u32..4,
    )
        .prop_map(
            |(at_step, owner, priority, workers, shrink, cpus, gpus, steps)| Arrival {
                at_step,
                owner,
                priority,
                workers,
                min_workers: workers.saturating_sub(shrink).max(1),
                cpus,
                gpus,
                steps,
            },
        )
}

fn cluster_members() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec((1u32..6, 0u32..3), 1..5).prop_map(|ms| {
        ms.into_iter()
            .enumerate()
            .map(|(i, (cpus, gpus))| member(&format!("m{i}"), cpus, gpus))
            .collect()
    })
}

fn quota_map() -> impl Strategy<Value = BTreeMap<String, Quota>> {
    prop::collection::vec(
        (
            prop::option::of(0u32..6),
            prop::option::of(0u32..4),
            prop::option::of(0u32..3),
            prop::option::of(0u32..3),
            prop::option::of(1u32..4),
        ),
        3,
    )
    .prop_map(|qs| {
        qs.into_iter()
            .zip(USERS)
            .filter(|((c, g, bc, bg, w), _)| {
                c.is_some() || g.is_some() || bc.is_some() || bg.is_some() || w.is_some()
            })
            .map(|((cpus, gpus, borrow_cpus, borrow_gpus, weight), u)| {
                (
                    u.to_owned(),
                    Quota {
                        cpus,
                        gpus,
                        borrow_cpus,
                        borrow_gpus,
                        weight,
                        ..Quota::default()
                    },
                )
            })
            .collect()
    })
}

/// A job of the simulation: its arrival, and its slots while it runs.
struct Sim {
    arrival: Arrival,
    id: JobId,
    slots: Vec<Slot>,
    started_step: Option<u32>,
    done: bool,
}

/// Whether the job could ever start: its floor fits the idle cluster and its owner's
/// limits (quota plus borrowing) from nothing.
fn could_ever_start(a: &Arrival, members: &[Candidate], quotas: &BTreeMap<String, Quota>) -> bool {
    let mut r = req(a.min_workers, a.cpus, a.gpus);
    let fits = placement::room(members, &r) >= u64::from(a.min_workers);
    r.workers = a.workers;
    let w = Waiting {
        id: id(1),
        owner: USERS[a.owner],
        priority: a.priority,
        submitted_at_ms: 0,
        request: r,
        min_workers: a.min_workers,
        home: None,
        avoid: &NOTHING,
        trial: None,
    };
    fits && usage::Ledger::default().ranks_allowed(&w, quotas) >= u64::from(a.min_workers)
}

/// Every account's running usage, a search's trials counted, within its quota plus borrow
/// limit.
fn within_limits<'a>(
    sims: &'a [Sim],
    trials: Option<(&SearchArrival, impl Iterator<Item = &'a [Slot]>)>,
    quotas: &BTreeMap<String, Quota>,
) -> Result<(), String> {
    let mut all: Vec<Running<'_>> = sims
        .iter()
        .filter(|s| !s.slots.is_empty())
        .map(|s| {
            running(
                0,
                USERS[s.arrival.owner],
                s.arrival.priority,
                &s.slots,
                req(1, s.arrival.cpus, s.arrival.gpus),
            )
        })
        .collect();
    if let Some((sa, slots)) = trials {
        let r = req(1, sa.cpus, sa.gpus);
        all.extend(slots.map(|s| running(0, USERS[sa.owner], sa.priority, s, r)));
    }
    let ledger = usage::Ledger::of(&all, quotas);
    for (account, q) in quotas {
        let used = ledger.used(account);
        if let Some(b) = q.borrow_cpus {
            let limit = u64::from(q.cpus.unwrap_or(0) + b);
            if used.cpus > limit {
                return Err(format!("{account} runs {} cpus over {limit}", used.cpus));
            }
        }
        if let Some(b) = q.borrow_gpus {
            let limit = u64::from(q.gpus.unwrap_or(0) + b);
            if used.gpus > limit {
                return Err(format!("{account} runs {} gpus over {limit}", used.gpus));
            }
        }
    }
    Ok(())
}

/// A search of the simulation, running from the start: it wants trials up to its
/// `max_parallel`, each a gang of `workers` that runs `steps` passes.
#[derive(Debug, Clone)]
struct SearchArrival {
    owner: usize,
    priority: u32,
    workers: u32,
    cpus: u32,
    gpus: u32,
    max_parallel: u32,
    steps: u32,
}

/// The simulated search's id (jobs are 1..).
const SEARCH: u64 = 1_000;

fn search_arrival() -> impl Strategy<Value = SearchArrival> {
    (0usize..3, 1u32..3, 1u32..3, 0u32..2, 1u32..5, 1u32..4).prop_map(
        |(owner, workers, cpus, gpus, max_parallel, steps)| SearchArrival {
            owner,
            priority: priority::LOW,
            workers,
            cpus,
            gpus,
            max_parallel,
            steps,
        },
    )
}

/// A trial run of the simulated search: its id, slots and start.
struct TrialSim {
    id: JobId,
    slots: Vec<Slot>,
    started_step: u32,
}

/// Runs the trace step by step (a step is one pass; a job runs for its `steps`), with
/// `search`'s trials beside it when given, checking the invariants at every pass. Returns
/// the sims at the end.
fn simulate(
    members: &[Candidate],
    quotas: &BTreeMap<String, Quota>,
    arrivals: &[Arrival],
    search: Option<&SearchArrival>,
    steps: u32,
) -> Result<Vec<Sim>, TestCaseError> {
    let mut trials: Vec<TrialSim> = Vec::new();
    let mut sims: Vec<Sim> = arrivals
        .iter()
        .enumerate()
        .map(|(i, a)| Sim {
            arrival: a.clone(),
            id: id(i as u64 + 1),
            slots: Vec::new(),
            started_step: None,
            done: false,
        })
        .collect();
    for step in 0..steps {
        let now_ms = u64::from(step) * 1_000;
        for s in sims.iter_mut() {
            if let Some(at) = s.started_step {
                if !s.done && step >= at + s.arrival.steps {
                    s.done = true;
                    s.slots.clear();
                }
            }
        }
        if let Some(sa) = search {
            trials.retain(|t| step < t.started_step + sa.steps);
        }
        let mut view = members.to_vec();
        for s in sims.iter().filter(|s| !s.slots.is_empty()) {
            placement::take(&mut view, &s.slots, &req(1, s.arrival.cpus, s.arrival.gpus));
        }
        for (t, sa) in trials.iter().zip(std::iter::repeat(search)) {
            let sa = sa.expect("trials only with a search");
            placement::take(&mut view, &t.slots, &req(1, sa.cpus, sa.gpus));
        }
        let wanted = search.map_or(0, |sa| sa.max_parallel as usize - trials.len());
        let trial_entries = search.into_iter().flat_map(|sa| {
            (0..wanted as u32).map(|i| Waiting {
                id: id(SEARCH),
                owner: USERS[sa.owner],
                priority: sa.priority,
                submitted_at_ms: 0,
                request: req(sa.workers, sa.cpus, sa.gpus),
                min_workers: sa.workers,
                home: None,
                avoid: &NOTHING,
                trial: Some(i),
            })
        });
        let waiting: Vec<Waiting<'_>> = sims
            .iter()
            .filter(|s| s.started_step.is_none() && s.arrival.at_step <= step)
            .map(|s| {
                let a = &s.arrival;
                Waiting {
                    id: s.id,
                    owner: USERS[a.owner],
                    priority: a.priority,
                    submitted_at_ms: u64::from(a.at_step) * 1_000,
                    request: req(a.workers, a.cpus, a.gpus),
                    min_workers: a.min_workers,
                    home: None,
                    avoid: &NOTHING,
                    trial: None,
                }
            })
            .chain(trial_entries)
            .collect();
        let trial_runs = search.into_iter().flat_map(|sa| {
            trials.iter().map(|t| {
                let mut r = running(
                    0,
                    USERS[sa.owner],
                    sa.priority,
                    &t.slots,
                    req(1, sa.cpus, sa.gpus),
                );
                r.id = t.id;
                r.trial_of = Some(id(SEARCH));
                r
            })
        });
        let running: Vec<Running<'_>> = sims
            .iter()
            .filter(|s| !s.slots.is_empty())
            .map(|s| {
                let a = &s.arrival;
                let mut r = running(
                    0,
                    USERS[a.owner],
                    a.priority,
                    &s.slots,
                    req(1, a.cpus, a.gpus),
                );
                r.id = s.id;
                r
            })
            .chain(trial_runs)
            .collect();
        let cluster = ClusterView {
            members: view.clone(),
            quotas,
        };
        let queue = QueueView {
            waiting,
            running,
            gpu_ms: BTreeMap::new(),
        };
        let d = schedule(&cluster, &queue, now_ms);

        // Decisions are the same on replay, and whatever order the queue lists jobs in.
        prop_assert_eq!(&d, &schedule(&cluster, &queue, now_ms));
        let mut reversed = queue.clone();
        reversed.waiting.reverse();
        reversed.running.reverse();
        prop_assert_eq!(&d, &schedule(&cluster, &reversed, now_ms));

        // Every waiting job (and trial entry) either starts or has exactly one reason, and
        // the order names each once.
        let entry = |id: JobId, trial: Option<u32>| {
            queue
                .waiting
                .iter()
                .find(|w| (w.id, w.trial) == (id, trial))
                .unwrap()
        };
        let waiting_ids: BTreeSet<(JobId, Option<u32>)> =
            queue.waiting.iter().map(|w| (w.id, w.trial)).collect();
        let mut accounted: Vec<(JobId, Option<u32>)> =
            d.starts.iter().map(|s| (s.id, s.trial)).collect();
        accounted.extend(d.reasons.iter().map(|r| (r.id, r.trial)));
        accounted.sort();
        prop_assert_eq!(accounted, waiting_ids.iter().copied().collect::<Vec<_>>());
        prop_assert!(d.reasons.iter().all(|r| !r.text.is_empty()));
        prop_assert_eq!(d.order.len(), waiting_ids.len());
        // A trial entry asks for nothing to give way.
        prop_assert!(d.preempt.iter().all(|p| p.for_job != id(SEARCH)));

        // Gangs are whole: between the floor and `workers` ranks, each with its GPUs, on
        // members that have room for them beside what runs (a trial: all its `workers`).
        for start in &d.starts {
            let w = entry(start.id, start.trial);
            if start.trial.is_some() {
                prop_assert_eq!(start.slots.len() as u32, w.request.workers, "trial split");
            }
            let n = start.slots.len() as u32;
            prop_assert!(
                w.min_workers <= n && n <= w.request.workers,
                "gang split: {n} ranks of {}..={}",
                w.min_workers,
                w.request.workers
            );
            prop_assert!(start
                .slots
                .iter()
                .all(|s| s.gpus.len() == w.request.gpus_per_worker as usize));
            let mut r = w.request;
            r.workers = n;
            placement::take(&mut view, &start.slots, &r);
        }
        for c in &view {
            prop_assert!(
                c.used_cpus <= c.cpus,
                "{} over-committed: {} of {} cpus",
                c.name,
                c.used_cpus,
                c.cpus
            );
        }

        // Priority order: the first job that waits for capacity is not delayed by any job
        // started after it in the order: once running work ends, it fits beside every start
        // (a low search's trials included: they come after every higher job).
        let head = d
            .reasons
            .iter()
            .find(|r| matches!(r.cause, Cause::Capacity | Cause::Queue));
        if let (Some(sa), Some(head)) = (search, head) {
            let higher_waits = d.reasons.iter().any(|r| {
                r.trial.is_none()
                    && matches!(r.cause, Cause::Capacity | Cause::Queue)
                    && entry(r.id, None).priority > sa.priority
            });
            prop_assert!(
                !higher_waits || head.trial.is_none(),
                "a low search's trial waits ahead of a higher job"
            );
        }
        if let Some(head) = head.map(|r| (r.id, r.trial)) {
            let pos = |key: (JobId, Option<u32>)| d.order.iter().position(|o| *o == key).unwrap();
            let w = entry(head.0, head.1);
            let floor = w.floor();
            let mut before = usage::Room::idle(members);
            let mut all = usage::Room::idle(members);
            for start in &d.starts {
                let sw = entry(start.id, start.trial);
                let mut r = sw.request;
                r.workers = start.slots.len() as u32;
                if pos((start.id, start.trial)) < pos(head) {
                    before.take(&start.slots, &r);
                }
                all.take(&start.slots, &r);
            }
            let mut scratch = members.to_vec();
            let fit_before = before.clone().reserve(&mut scratch, &floor);
            let fit_after = all.reserve(&mut scratch, &floor);
            prop_assert!(
                !fit_before || fit_after,
                "a later start took what {:?} needs",
                head
            );
        }

        for start in d.starts {
            if start.trial.is_some() {
                trials.push(TrialSim {
                    id: id(SEARCH + 1 + u64::from(step) * 100 + trials.len() as u64),
                    slots: start.slots,
                    started_step: step,
                });
                continue;
            }
            let s = sims.iter_mut().find(|s| s.id == start.id).unwrap();
            s.slots = start.slots;
            s.started_step = Some(step);
        }
        let trial_load = search.map(|sa| (sa, trials.iter().map(|t| t.slots.as_slice())));
        within_limits(&sims, trial_load, quotas).map_err(TestCaseError::fail)?;
    }
    Ok(sims)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_scheduler_keeps_its_invariants_over_random_traces(
        members in cluster_members(),
        quotas in quota_map(),
        arrivals in prop::collection::vec(arrival(), 1..12),
    ) {
        simulate(&members, &quotas, &arrivals, None, 20)?;
    }

    #[test]
    fn a_searchs_trials_keep_the_invariants_beside_jobs(
        members in cluster_members(),
        quotas in quota_map(),
        arrivals in prop::collection::vec(arrival(), 0..10),
        search in search_arrival(),
    ) {
        // Its trials' gangs are never split, its owner's quota holds with them counted,
        // and a higher job that waits is first in line ahead of them (see `simulate`).
        simulate(&members, &quotas, &arrivals, Some(&search), 20)?;
    }

    #[test]
    fn every_job_that_could_ever_start_starts_within_a_bounded_trace(
        members in cluster_members(),
        quotas in quota_map(),
        arrivals in prop::collection::vec(arrival(), 1..10),
    ) {
        // Each job runs at most 3 steps and all arrive by step 5: after enough passes
        // every job that fits the idle cluster and its owner's limits has started.
        let bound = 6 + 4 * arrivals.len() as u32 + 2;
        let sims = simulate(&members, &quotas, &arrivals, None, bound)?;
        for s in &sims {
            if could_ever_start(&s.arrival, &members, &quotas) {
                prop_assert!(s.started_step.is_some(), "{} never started: {:?}", s.id, s.arrival);
            }
        }
    }
}

/// Found by `every_job_that_could_ever_start_starts_within_a_bounded_trace`: at step 3 a
/// high job of alice starts on m0 and her 3-rank GPU job j-2 plans to requeue her j-3. The
/// pass run again without j-3 (`served`) placed the high job elsewhere and j-2 on m0, and
/// that room was held, so carol's j-4 took the room j-2 needs on m1 and m3: the hold is
/// placed where this pass's starts left room.
#[test]
fn a_job_preempted_for_is_held_where_the_jobs_ahead_of_it_left_room() {
    let members = vec![
        member("m0", 3, 1),
        member("m1", 4, 2),
        member("m2", 2, 0),
        member("m3", 4, 2),
    ];
    let quotas = BTreeMap::from([("carol".to_owned(), quota(1, Some(2)))]);
    let a = |at_step, owner, priority, workers, cpus, gpus, steps| Arrival {
        at_step,
        owner,
        priority,
        workers,
        min_workers: workers,
        cpus,
        gpus,
        steps,
    };
    let arrivals = vec![
        a(3, 0, 500, 1, 2, 0, 1),
        a(2, 0, 101, 3, 2, 1, 1),
        a(1, 0, 100, 3, 1, 1, 3),
        a(1, 2, 100, 3, 1, 0, 1),
        a(1, 2, 500, 1, 1, 0, 2),
    ];
    let bound = 6 + 4 * arrivals.len() as u32 + 2;
    simulate(&members, &quotas, &arrivals, None, bound).unwrap();
}
