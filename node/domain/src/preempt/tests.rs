//! Tests of preemption's entries: made by `state::preempt::execute`, applied whole from
//! one entry.

use super::{execute, Preempt, PreemptAction, Refused, STOP_REPORT_SLACK_MS};
use crate::spec::JobSpec;
use crate::state::{
    new_ring_secret, ops, ControlCommand, ControlResponse, ControlState, Job, JobId, JobState, Op,
    Slot,
};

fn slots(n: u32) -> Vec<Slot> {
    (0..n)
        .map(|r| Slot {
            member: format!("id-{r}"),
            name: format!("m{r}"),
            rank: r,
            local_rank: 0,
            worker: r,
            gpus: Vec::new(),
        })
        .collect()
}

fn train(extra: &str) -> String {
    format!(
        "name = \"t\"\nkind = \"train\"\nworkers = 4\nmin_workers = 1\nmax_workers = 4\nmax_restarts = 0\n{extra}\n[model]\narch = \"mlp\"\nhidden = [8]\n[data]\ndataset = \"digits\"\n"
    )
}

const RIGID: &str = "name = \"r\"\nkind = \"command\"\nworkers = 2\nmax_restarts = 0\ncommand = [\"true\"]\n[preemption]\ngrace_s = 7\n";

/// A replica: the state and its next log index.
struct Replica(ControlState);

impl Replica {
    fn apply(&mut self, cmd: &ControlCommand) -> ControlResponse {
        let index = self.0.applied_index + 1;
        self.0.apply(index, cmd)
    }
    fn applied(&mut self, cmds: &[ControlCommand]) {
        for c in cmds {
            assert_eq!(self.apply(c), ControlResponse::Applied, "{c:?}");
        }
    }
    /// A running job of `spec` on `n` slots.
    fn running(&mut self, spec: &str, n: u32) -> JobId {
        let submit = ControlCommand::new(
            1,
            Op::Submit(ops::Submit {
                spec: Box::new(JobSpec::parse(spec).unwrap()),
                token: None,
                owner: "admin".into(),
            }),
        );
        let ControlResponse::Submitted { id } = self.apply(&submit) else {
            panic!("not submitted")
        };
        let place = ControlCommand::new(
            2,
            Op::Place(ops::Place {
                id,
                generation: 1,
                slots: slots(n),
                secret: new_ring_secret(),
            }),
        );
        self.applied(&[place]);
        id
    }
    fn job(&self, id: JobId) -> &Job {
        self.0.job(id).unwrap()
    }
}

fn ask(victim: JobId, action: PreemptAction) -> Preempt {
    Preempt {
        victim,
        action,
        for_job: None,
        reason: None,
    }
}

#[test]
fn a_shrink_is_one_entry_that_drops_the_highest_ranks_and_keeps_the_batch() {
    let mut r = Replica(ControlState::default());
    let id = r.running(&train(""), 4);
    let want = r.running(&train(""), 1);
    let mut p = ask(id, PreemptAction::Shrink { to_workers: 2 });
    p.for_job = Some(want);
    let cmds = execute(&r.0, &p, 100, &mut new_ring_secret).unwrap();
    assert_eq!(cmds.len(), 1, "one entry makes the whole change");
    let before = r.0.clone();
    r.applied(&cmds);
    let job = r.job(id);
    assert_eq!(job.generation, 2);
    assert_eq!(job.attempt, 1, "no restart");
    let workers: Vec<(u32, u32)> = job.assignment.iter().map(|s| (s.rank, s.worker)).collect();
    assert_eq!(
        workers,
        vec![(0, 0), (1, 1)],
        "ranks 0 and 1 stay, as themselves"
    );
    let p = job.preemption.clone().unwrap();
    assert_eq!((p.ceiling, p.batch_workers), (Some(2), Some(4)));
    assert_eq!(job.batch_workers(), Some(4));
    assert_eq!(job.growth_ceiling(), 2);
    assert_eq!(
        job.events.last().unwrap().reason,
        format!("preempted for {want} (admin, priority normal): shrunk 4 → 2 (global batch kept)")
    );
    assert_eq!(r.0.preemptions.get("shrink"), Some(&1));
    // A second replica that applies the same log gets the same state; the entry again (a
    // decision on a view the log moved past) changes nothing.
    let mut other = Replica(before);
    other.applied(&cmds);
    assert_eq!(other.0.jobs, r.0.jobs);
    assert!(matches!(r.apply(&cmds[0]), ControlResponse::Ignored { .. }));
    // Shrunk again, it keeps the first size's batch.
    let again = execute(
        &r.0,
        &ask(id, PreemptAction::Shrink { to_workers: 1 }),
        200,
        &mut new_ring_secret,
    )
    .unwrap();
    r.applied(&again);
    assert_eq!(r.job(id).batch_workers(), Some(4));
}

#[test]
fn a_shrink_without_keep_global_batch_rescales_instead() {
    let mut r = Replica(ControlState::default());
    let id = r.running(&train("[elastic]\nkeep_global_batch = false"), 4);
    let cmds = execute(
        &r.0,
        &ask(id, PreemptAction::Shrink { to_workers: 3 }),
        100,
        &mut new_ring_secret,
    )
    .unwrap();
    r.applied(&cmds);
    assert_eq!(r.job(id).batch_workers(), None);
    assert!(r
        .job(id)
        .events
        .last()
        .unwrap()
        .reason
        .ends_with("(learning rate rescaled)"));
}

#[test]
fn what_cannot_be_preempted_is_refused_naming_why() {
    let mut r = Replica(ControlState::default());
    let elastic = r.running(&train(""), 4);
    let rigid = r.running(RIGID, 2);
    let exempt = r.running(&train("preemptible = false"), 4);
    let refuse = |p: Preempt| execute(&r.0, &p, 100, &mut new_ring_secret).unwrap_err();
    assert!(matches!(
        refuse(ask(elastic, PreemptAction::Shrink { to_workers: 0 })),
        Refused::ShrinkSize { .. }
    ));
    assert!(matches!(
        refuse(ask(elastic, PreemptAction::Shrink { to_workers: 4 })),
        Refused::ShrinkSize { .. }
    ));
    assert_eq!(
        refuse(ask(rigid, PreemptAction::Shrink { to_workers: 1 })),
        Refused::NotElastic(rigid)
    );
    assert_eq!(
        refuse(ask(exempt, PreemptAction::Requeue)),
        Refused::NotPreemptible(exempt)
    );
    assert!(refuse(ask(exempt, PreemptAction::Requeue))
        .to_string()
        .contains("preemptible = false"));
    assert!(matches!(
        refuse(ask(rigid, PreemptAction::PauseTrials { count: 1 })),
        Refused::Kind { .. }
    ));
    // An entry that names too few workers is refused by every replica.
    let bad = ControlCommand::new(
        5,
        Op::Preempt(ops::Preempt {
            id: elastic,
            generation: 1,
            action: PreemptAction::Shrink { to_workers: 2 },
            for_job: None,
            why: "preempted".into(),
            drop_workers: vec![3],
            secret: new_ring_secret(),
        }),
    );
    assert!(matches!(r.apply(&bad), ControlResponse::Rejected { .. }));
    assert_eq!(r.job(elastic).generation, 1);
}

#[test]
fn a_requeue_waits_for_every_rank_then_queues_the_job_without_a_restart() {
    let mut r = Replica(ControlState::default());
    let id = r.running(RIGID, 2);
    let cmds = execute(
        &r.0,
        &ask(id, PreemptAction::Requeue),
        100,
        &mut new_ring_secret,
    )
    .unwrap();
    r.applied(&cmds);
    let stopping = r.job(id).stopping.clone().unwrap();
    assert_eq!(stopping.grace_s, 7);
    assert_eq!(stopping.overdue_at_ms(), 100 + 7_000 + STOP_REPORT_SLACK_MS);
    assert_eq!(
        r.job(id).state,
        JobState::Running,
        "it holds its slots meanwhile"
    );
    assert_eq!(r.0.preemptions.get("requeue"), Some(&1));
    let exit = |rank, code| {
        ControlCommand::new(
            200,
            Op::WorkerExited(ops::WorkerExited {
                id,
                generation: 1,
                rank,
                code,
                end: None,
            }),
        )
    };
    // A non-zero code (SIGTERM's) does not fail a job asked to stop.
    r.applied(&[exit(0, 143)]);
    assert_eq!(r.job(id).state, JobState::Running);
    r.applied(&[exit(1, 0)]);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Pending);
    assert_eq!((job.requeues, job.restarts_used()), (1, 0));
    assert_eq!(
        job.events.last().unwrap().reason,
        "preempted: stopped and requeued"
    );
    // Placed again: a new attempt, still no restart used (max_restarts = 0 allows it).
    let place = ControlCommand::new(
        300,
        Op::Place(ops::Place {
            id,
            generation: 2,
            slots: slots(2),
            secret: new_ring_secret(),
        }),
    );
    r.applied(&[place]);
    assert_eq!((r.job(id).attempt, r.job(id).restarts_used()), (2, 0));
}

#[test]
fn a_requeue_whose_ranks_never_report_ends_when_the_chief_fails_the_attempt() {
    let mut r = Replica(ControlState::default());
    let id = r.running(RIGID, 2);
    r.applied(
        &execute(
            &r.0,
            &ask(id, PreemptAction::Requeue),
            100,
            &mut new_ring_secret,
        )
        .unwrap(),
    );
    let failed = ControlCommand::new(
        50_000,
        Op::AttemptFailed(ops::AttemptFailed {
            id,
            generation: 1,
            reason: "rank 1 on m1 gone".into(),
        }),
    );
    r.applied(&[failed]);
    let job = r.job(id);
    assert_eq!(
        job.state,
        JobState::Pending,
        "requeued, not failed (max_restarts = 0)"
    );
    assert_eq!(job.restarts_used(), 0);
    assert!(job.stopping.is_none());
}

#[test]
fn a_grow_lifts_the_ceiling_and_the_reform_to_full_size_clears_the_record() {
    let mut r = Replica(ControlState::default());
    let id = r.running(&train(""), 4);
    r.applied(
        &execute(
            &r.0,
            &ask(id, PreemptAction::Shrink { to_workers: 2 }),
            100,
            &mut new_ring_secret,
        )
        .unwrap(),
    );
    assert!(matches!(
        r.apply(&ControlCommand::new(
            110,
            Op::Grow(ops::Grow {
                id,
                to_workers: 5,
                reason: "x".into()
            })
        )),
        ControlResponse::Rejected { .. }
    ));
    r.applied(&[ControlCommand::new(
        120,
        Op::Grow(ops::Grow {
            id,
            to_workers: 4,
            reason: "capacity returned".into(),
        }),
    )]);
    assert_eq!(r.job(id).growth_ceiling(), 4);
    assert_eq!(
        r.job(id).batch_workers(),
        Some(4),
        "kept until the ring is back"
    );
    let mut back = r.job(id).assignment.clone();
    back.extend(slots(4).into_iter().skip(2).map(|mut s| {
        s.worker += 2;
        s
    }));
    let reform = ControlCommand::new(
        130,
        Op::Reform(ops::Reform {
            id,
            generation: 3,
            slots: back,
            secret: new_ring_secret(),
            reason: "grown 2 → 4: capacity returned".into(),
        }),
    );
    r.applied(&[reform]);
    assert_eq!(r.job(id).preemption, None);
    assert_eq!(r.job(id).batch_workers(), None);
}
