//! The rules of a rank's life, by events and times (no process, no clock).

use super::*;

fn at(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

fn id() -> JobId {
    JobId::from_log_index(7)
}

/// Rank `rank` of generation 1, a trial's rank reporting `metric` up to `rung` when given.
fn watch(rank: u32, metric: Option<&str>, rung: Option<u32>, t0: Instant) -> RankWatch {
    RankWatch::new(
        Watched {
            id: id(),
            worker: rank,
            generation: 1,
            rank,
            standby: false,
            first_heartbeat_ms: None,
            trial: TrialReports {
                metric: metric.map(str::to_owned),
                from_metric_lines: false,
                rung,
                ..TrialReports::default()
            },
        },
        t0,
    )
}

/// A protocol rank whose first heartbeat is due within `bound_ms`.
fn protocol(standby: bool, bound_ms: u64, t0: Instant) -> RankWatch {
    RankWatch::new(
        Watched {
            id: id(),
            worker: 4,
            generation: 1,
            rank: 0,
            standby,
            first_heartbeat_ms: Some(bound_ms),
            trial: TrialReports::default(),
        },
        t0,
    )
}

fn metric(name: &str, value: f64, step: Option<u64>) -> Action {
    Action::Offer(Op::Metric(ops::Metric {
        id: id(),
        generation: 1,
        name: name.into(),
        value,
        step,
    }))
}

fn losses(actions: &[Action]) -> Vec<(u32, u32, bool, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Report(Op::RankLost(ops::RankLost {
                generation,
                rank,
                hung,
                reason,
                ..
            })) => Some((*generation, *rank, *hung, reason.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn metrics_are_thinned_per_name_and_the_last_value_is_offered_at_the_end() {
    let t0 = Instant::now();
    let mut w = watch(1, None, None, t0);
    assert_eq!(
        w.on_line(at(t0, 0), true, "ringleader-metric loss 1 1"),
        vec![metric("loss", 1.0, Some(1))]
    );
    assert_eq!(
        w.on_line(at(t0, 100), true, "ringleader-metric loss 2 2"),
        vec![]
    );
    assert_eq!(
        w.on_line(at(t0, 100), true, "ringleader-metric acc 0.5 2"),
        vec![metric("acc", 0.5, Some(2))],
        "each name has its own interval"
    );
    assert_eq!(
        w.on_line(
            at(t0, METRIC_REPORT_INTERVAL_MS),
            true,
            "ringleader-metric loss 3 3"
        ),
        vec![metric("loss", 3.0, Some(3))]
    );
    assert_eq!(
        w.on_line(at(t0, 600), true, "ringleader-metric loss 4 4"),
        vec![]
    );
    // Stderr and ordinary output are only logged; a malformed line is ignored.
    assert_eq!(
        w.on_line(at(t0, 700), false, "ringleader-metric loss 9 9"),
        vec![]
    );
    assert_eq!(w.on_line(at(t0, 700), true, "epoch 4 done"), vec![]);
    assert_eq!(
        w.on_line(at(t0, 700), true, "ringleader-metric loss"),
        vec![]
    );
    w.on_exit(at(t0, 800));
    assert_eq!(
        w.on_end(Some(0), None),
        (vec![metric("loss", 4.0, Some(4))], Some(0))
    );
}

#[test]
fn rank_zero_reports_the_trial_after_the_lines_metrics_and_only_progress() {
    let t0 = Instant::now();
    let mut w = watch(0, Some("accuracy"), None, t0);
    let report = |resource, value| {
        Action::Report(Op::TrialReport(ops::TrialReport {
            id: id(),
            generation: 1,
            resource,
            value,
        }))
    };
    assert_eq!(
        w.on_line(t0, true, "ringleader-report 1 accuracy 0.5 loss 2"),
        vec![
            metric("accuracy", 0.5, None),
            metric("loss", 2.0, None),
            report(1, 0.5)
        ]
    );
    assert_eq!(
        w.on_line(at(t0, 1_000), true, "ringleader-report 1 accuracy 0.6"),
        vec![metric("accuracy", 0.6, None)],
        "not beyond the last report: a job metric, not a report"
    );
    // Another rank's reports are job metrics only.
    let mut w = watch(1, Some("accuracy"), None, t0);
    assert_eq!(
        w.on_line(t0, true, "ringleader-report 1 accuracy 0.5"),
        vec![metric("accuracy", 0.5, None)]
    );
}

#[test]
fn a_run_past_its_rung_is_stopped_after_the_grace_and_counts_as_reaching_it() {
    let t0 = Instant::now();
    let mut w = watch(0, Some("accuracy"), Some(3), t0);
    w.on_line(t0, true, "ringleader-report 1 accuracy 0.5");
    assert_eq!(w.next_deadline(), None);
    w.on_line(at(t0, 10), true, "ringleader-report 3 accuracy 0.7");
    assert_eq!(w.next_deadline(), Some(at(t0, 10 + RUNG_EXIT_GRACE_MS)));
    assert_eq!(w.on_timer(at(t0, 9 + RUNG_EXIT_GRACE_MS)), vec![]);
    let stop = w.on_timer(at(t0, 10 + RUNG_EXIT_GRACE_MS));
    assert!(
        matches!(stop.as_slice(), [Action::Log(note), Action::Signal(Signal::SIGTERM)] if note.contains("reached its rung (3)")),
        "{stop:?}"
    );
    let grace_end = at(t0, 10 + RUNG_EXIT_GRACE_MS + STOP_GRACE_MS);
    assert_eq!(w.next_deadline(), Some(grace_end));
    assert_eq!(w.on_timer(grace_end), vec![Action::Signal(Signal::SIGKILL)]);
    assert_eq!(w.on_exit(grace_end), vec![Action::Signal(Signal::SIGKILL)]);
    assert_eq!(
        w.on_end(None, Some(9)),
        (vec![metric("accuracy", 0.7, None)], Some(0)),
        "the value held back (10 ms after the last) is offered at the end"
    );
}

#[test]
fn a_run_that_exits_by_itself_at_its_rung_keeps_its_code() {
    let t0 = Instant::now();
    let mut w = watch(0, Some("accuracy"), Some(3), t0);
    w.on_line(t0, true, "ringleader-report 3 accuracy 0.7");
    w.on_exit(at(t0, 100));
    assert_eq!(
        w.next_deadline(),
        Some(at(t0, 100 + EXIT_DRAIN_MS)),
        "no rung deadline once exited"
    );
    assert_eq!(w.on_end(Some(2), None).1, Some(2));
}

#[test]
fn a_process_stopped_too_long_is_reported_hung_once() {
    let t0 = Instant::now();
    let mut w = watch(2, None, None, t0);
    assert_eq!(w.on_watch(at(t0, 0), true), vec![]);
    assert_eq!(w.on_watch(at(t0, HUNG_STOPPED_MS - 1), true), vec![]);
    assert_eq!(
        w.on_watch(at(t0, HUNG_STOPPED_MS), false),
        vec![],
        "it ran again"
    );
    assert_eq!(w.on_watch(at(t0, HUNG_STOPPED_MS + 1), true), vec![]);
    let hung = w.on_watch(at(t0, 2 * HUNG_STOPPED_MS + 1), true);
    assert!(
        matches!(losses(&hung).as_slice(), [(1, 2, true, reason)] if reason.contains("stopped (run state T)")),
        "{hung:?}"
    );
    assert!(!w.watches());
    assert_eq!(w.on_watch(at(t0, 3 * HUNG_STOPPED_MS), true), vec![]);
}

#[test]
fn a_compute_section_far_past_the_usual_step_is_a_hang() {
    let t0 = Instant::now();
    let mut w = watch(1, None, None, t0);
    let stats = w.on_line(
        t0,
        true,
        "ringleader-rank-stats generation=1 rank=1 step=20 compute_ms=400 wait_ms=1",
    );
    assert!(matches!(
        stats.as_slice(),
        [Action::Offer(Op::RankStats(ops::RankStats {
            step: 20,
            ..
        }))]
    ));
    // 20 × 400 ms: 8 s, above the 5 s floor.
    assert_eq!(
        w.on_line(t0, true, "ringleader-heartbeat computing_ms=7999"),
        vec![]
    );
    let hung = w.on_line(t0, true, "ringleader-heartbeat computing_ms=8000");
    assert!(
        matches!(losses(&hung).as_slice(), [(1, 1, true, reason)] if reason.contains("8000 ms inside one compute section")),
        "{hung:?}"
    );
    assert_eq!(
        w.on_line(t0, true, "ringleader-heartbeat computing_ms=9000"),
        vec![],
        "once"
    );
    // Before any step is reported, a first step's compile and warm-up: minutes, not 5 s.
    let mut w = watch(1, None, None, t0);
    let floor = format!("ringleader-heartbeat computing_ms={HUNG_COMPUTING_MS_MIN}");
    assert_eq!(w.on_line(t0, true, &floor), vec![]);
    let first = format!("ringleader-heartbeat computing_ms={HUNG_FIRST_COMPUTE_MS}");
    let hung = w.on_line(t0, true, &first);
    assert!(
        matches!(losses(&hung).as_slice(), [(_, _, true, reason)] if reason.contains("no step reported yet")),
        "{hung:?}"
    );
}

#[test]
fn a_silent_protocol_rank_is_lost_in_each_generation_it_survives_into() {
    let t0 = Instant::now();
    let mut w = protocol(false, 300, t0);
    assert_eq!(w.on_watch(at(t0, 299), false), vec![]);
    let first = w.on_watch(at(t0, 300), false);
    assert!(
        matches!(losses(&first).as_slice(), [(1, 0, false, reason)] if reason.contains("rlt.init()")),
        "{first:?}"
    );
    assert_eq!(w.on_watch(at(t0, 800), false), vec![], "once a generation");
    let line = "ringleader-generation {\"generation\":2}".to_owned();
    let told = w.on_control(
        at(t0, 900),
        Some(Control::Generation {
            generation: 2,
            rank: 1,
            line: line.clone(),
        }),
    );
    assert_eq!(told, vec![Action::Tell(line)]);
    assert_eq!(w.position(), (2, 1, false));
    assert!(matches!(
        losses(&w.on_watch(at(t0, 1_000), false)).as_slice(),
        [(2, 1, false, _)]
    ));
    // One that speaks in time is never reported.
    let mut w = protocol(false, 300, t0);
    w.on_line(at(t0, 10), true, "ringleader-heartbeat computing_ms=0");
    assert_eq!(w.on_watch(at(t0, 10_000), false), vec![]);
}

#[test]
fn a_standby_reports_ready_and_a_silent_one_is_dropped() {
    let t0 = Instant::now();
    let mut w = protocol(true, 300, t0);
    assert_eq!(
        w.on_line(t0, true, "ringleader-ready"),
        vec![Action::Report(Op::StandbyReady(ops::StandbyReady {
            id: id(),
            worker: 4
        }))]
    );
    let dropped = w.on_watch(at(t0, 300), false);
    assert!(
        matches!(dropped.as_slice(), [Action::Report(Op::StandbyDropped(ops::StandbyDropped { worker: 4, reason, .. }))] if reason.contains("rlt.init()")),
        "{dropped:?}"
    );
    // A ready line from a rank that is no standby means nothing.
    let mut w = protocol(false, 300, t0);
    assert_eq!(w.on_line(t0, true, "ringleader-ready"), vec![]);
}

#[test]
fn an_elastic_failure_names_the_lost_rank_and_a_resume_is_two_metrics() {
    let t0 = Instant::now();
    let mut w = watch(0, None, None, t0);
    let failed = w.on_line(
        t0,
        true,
        "ringleader-elastic failed generation=2 lost_rank=1 error=\"peer gone\"",
    );
    assert_eq!(
        losses(&failed),
        vec![(2, 1, false, "rank 0 saw: peer gone".to_owned())]
    );
    let resumed = w.on_line(
        t0,
        true,
        "ringleader-elastic resumed generation=3 restored_step=15 steps_lost=2",
    );
    assert_eq!(
        resumed,
        vec![
            metric("restored_step", 15.0, None),
            metric("steps_lost", 2.0, None)
        ]
    );
}

#[test]
fn a_graceful_stop_tells_then_terms_then_kills_and_reports_nothing() {
    let t0 = Instant::now();
    let mut w = watch(0, None, None, t0);
    assert_eq!(
        w.on_control(t0, Some(Control::Stop)),
        vec![
            Action::Tell(ringleader_protocol::STOP_LINE.to_owned()),
            Action::CloseStdin,
            Action::Signal(Signal::SIGTERM)
        ]
    );
    assert!(!w.takes_control() && !w.watches());
    let grace_end = at(t0, STOP_GRACE_MS);
    assert_eq!(w.next_deadline(), Some(grace_end));
    // It exits within the grace: its group is left the rest of it (children may be saving).
    assert_eq!(w.on_exit(at(t0, 1_000)), vec![]);
    assert_eq!(w.on_timer(grace_end), vec![Action::Signal(Signal::SIGKILL)]);
    let drained = grace_end + Duration::from_millis(EXIT_DRAIN_MS);
    assert_eq!(w.next_deadline(), Some(drained));
    assert_eq!(w.on_timer(drained), vec![Action::StopDraining]);
    assert_eq!(w.on_end(Some(0), None), (vec![], None));
}

/// A rank a shrink left out finishes the step it is in with the survivors: told to stop,
/// never sent SIGTERM (an elastic train rank has no handler: it would die mid-step and the
/// survivors would lose steps), killed only when the grace is over.
#[test]
fn a_rank_left_out_of_its_ring_is_told_to_stop_and_killed_only_after_the_grace() {
    let t0 = Instant::now();
    let mut w = watch(0, None, None, t0);
    assert_eq!(
        w.on_control(t0, Some(Control::Leave)),
        vec![
            Action::Tell(ringleader_protocol::STOP_LINE.to_owned()),
            Action::CloseStdin,
        ]
    );
    assert!(!w.takes_control() && !w.watches());
    let grace_end = at(t0, STOP_GRACE_MS);
    assert_eq!(w.next_deadline(), Some(grace_end));
    // Its step done, it exits 0 within the grace; the group is killed when the grace ends.
    assert_eq!(w.on_exit(at(t0, 1_000)), vec![]);
    assert_eq!(w.on_timer(grace_end), vec![Action::Signal(Signal::SIGKILL)]);
    let drained = grace_end + Duration::from_millis(EXIT_DRAIN_MS);
    assert_eq!(w.on_timer(drained), vec![Action::StopDraining]);
    assert_eq!(w.on_end(Some(0), None), (vec![], None));
}

#[test]
fn a_kill_is_immediate_and_an_exit_kills_the_group_and_bounds_the_drain() {
    let t0 = Instant::now();
    let mut w = watch(0, None, None, t0);
    w.on_line(t0, true, "ringleader-metric loss 1 1");
    w.on_line(t0, true, "ringleader-metric loss 2 2");
    assert_eq!(
        w.on_control(t0, None),
        vec![Action::Signal(Signal::SIGKILL)],
        "a supervisor gone is a kill"
    );
    assert_eq!(w.on_end(None, Some(9)), (vec![], None), "killed: nothing");

    let mut w = watch(0, None, None, t0);
    assert_eq!(w.on_exit(at(t0, 5)), vec![Action::Signal(Signal::SIGKILL)]);
    assert_eq!(w.next_deadline(), Some(at(t0, 5 + EXIT_DRAIN_MS)));
    assert_eq!(w.on_timer(at(t0, 4 + EXIT_DRAIN_MS)), vec![]);
    assert_eq!(
        w.on_timer(at(t0, 5 + EXIT_DRAIN_MS)),
        vec![Action::StopDraining]
    );
    assert_eq!(
        w.on_end(None, Some(9)).1,
        Some(137),
        "a signal as a shell says it"
    );
    let mut w = watch(0, None, None, t0);
    w.on_exit(t0);
    assert_eq!(w.on_end(Some(3), None).1, Some(3));
}

/// A preemption's requeue: told to stop, SIGTERM (not an elastic train rank: it would die
/// of it mid-step, before the checkpoint it stops with), SIGKILL only after the job's own
/// grace, asked once, and its exit reported (the state machine requeues the job once every
/// rank is out).
#[test]
fn a_preempted_rank_gets_its_grace_and_its_exit_is_reported() {
    let t0 = Instant::now();
    let preempt = |grace_ms, sigterm| Some(Control::Preempt { grace_ms, sigterm });
    for sigterm in [true, false] {
        let mut w = watch(0, None, None, t0);
        let actions = w.on_control(t0, preempt(30_000, sigterm));
        let mut told = vec![
            Action::Tell(ringleader_protocol::STOP_LINE.to_owned()),
            Action::CloseStdin,
        ];
        if sigterm {
            told.push(Action::Signal(Signal::SIGTERM));
        }
        assert_eq!(actions[1..], told, "sigterm {sigterm}");
        assert!(matches!(&actions[0], Action::Log(l) if l.contains("preempted")));
        assert!(w.takes_control(), "a kill may still come");
        assert_eq!(w.next_deadline(), Some(at(t0, 30_000)));
        assert_eq!(
            w.on_control(at(t0, 10), preempt(30_000, sigterm)),
            vec![],
            "asked once"
        );
        assert_eq!(w.on_timer(at(t0, 29_999)), vec![]);
        assert_eq!(w.on_exit(at(t0, 5_000)), vec![]);
        assert_eq!(w.on_end(Some(0), None), (vec![], Some(0)), "reported");
    }
    // One that outlives the grace is killed, and its signal death reported.
    let mut late = watch(1, None, None, t0);
    late.on_control(t0, preempt(1_000, true));
    assert_eq!(
        late.on_timer(at(t0, 1_000)),
        vec![Action::Signal(Signal::SIGKILL)]
    );
    assert_eq!(late.on_end(None, Some(9)).1, Some(137));
}
