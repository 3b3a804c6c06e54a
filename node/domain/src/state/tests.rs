//! Tests of the replicated state: its commands through `apply`, as replicas apply them,
//! with the log's checks (each command's own tests are in its file under `ops/`).

use super::ops::testing::{slots, spec};
use super::*;

/// A state and a log-index counter, as a replica sees them.
struct Replica {
    state: ControlState,
    index: u64,
}

impl Replica {
    fn new() -> Replica {
        Replica {
            state: ControlState::default(),
            index: 0,
        }
    }
    fn apply(&mut self, cmd: ControlCommand) -> ControlResponse {
        self.index += 1;
        self.state.apply(self.index, &cmd)
    }
    fn submit(&mut self, workers: u32, max_restarts: u32) -> JobId {
        match self.apply(ControlCommand {
            op: Op::Submit(ops::Submit {
                spec: Box::new(spec(workers, max_restarts)),
                token: None,
                owner: crate::state::users::admin_user(),
            }),
            at_ms: 10,
        }) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }
    fn place(&mut self, id: JobId, generation: u32, n: u32) -> ControlResponse {
        self.apply(ControlCommand {
            op: Op::Place(ops::Place {
                id,
                generation,
                slots: slots(n),
                secret: new_ring_secret(),
            }),
            at_ms: 20,
        })
    }
    fn exit(&mut self, id: JobId, generation: u32, rank: u32, code: i32) -> ControlResponse {
        self.apply(ControlCommand {
            op: Op::WorkerExited(ops::WorkerExited {
                id,
                generation,
                rank,
                code,
                end: None,
            }),
            at_ms: 30,
        })
    }
    fn job(&self, id: JobId) -> &Job {
        self.state.job(id).unwrap()
    }
}

#[test]
fn submit_with_full_spec_roundtrips_through_json() {
    // ControlCommand is internally tagged (serde buffers it): make sure nested tables,
    // arrays and datetimes of a spec come back intact.
    let text = format!(
        "{}\n[search]\nalgorithm = \"asha\"\nas_of = 1979-05-27T07:32:00Z\n",
        include_str!("../../../../examples/jobs/digits-mlp.toml")
            .replace("kind = \"train\"", "kind = \"search\"")
    );
    let spec = JobSpec::parse(&text).unwrap();
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(spec),
            token: Some("t-1".into()),
            owner: crate::state::users::admin_user(),
        }),
        at_ms: 1,
    };
    let json = serde_json::to_string(&cmd).unwrap();
    assert_eq!(serde_json::from_str::<ControlCommand>(&json).unwrap(), cmd);
}

#[test]
fn job_id_format_and_parse() {
    assert_eq!(JobId::from_log_index(1).to_string(), "j-1");
    assert_eq!(JobId::from_log_index(35).to_string(), "j-z");
    assert_eq!(JobId::from_log_index(36).to_string(), "j-10");
    assert_eq!(JobId::from_log_index(0).to_string(), "j-0");
    for i in [0, 1, 35, 36, 1295, u64::MAX] {
        let id = JobId::from_log_index(i);
        assert_eq!(id.to_string().parse::<JobId>().unwrap(), id);
    }
    for bad in [
        "",
        "j-",
        "1",
        "j-01",
        "j-A",
        "x-1",
        "j-!",
        "j-zzzzzzzzzzzzzzzzzzzzzzz",
    ] {
        assert!(bad.parse::<JobId>().is_err(), "{bad}");
    }
    assert_eq!(
        serde_json::to_string(&JobId::from_log_index(36)).unwrap(),
        "\"j-10\""
    );
}

#[test]
fn submit_creates_pending_job_with_id_from_log_index() {
    let mut r = Replica::new();
    r.index = 40;
    let id = r.submit(2, 3);
    assert_eq!(id.to_string(), "j-15"); // 41 in base 36
    let job = r.job(id);
    assert_eq!(
        (job.state, job.generation, job.max_restarts),
        (JobState::Pending, 0, 3)
    );
    assert_eq!(job.events[0].what, EventKind::Submitted);
    assert_eq!(r.state.pending().count(), 1);
}

#[test]
fn happy_path_to_succeeded() {
    let mut r = Replica::new();
    let id = r.submit(2, 3);
    assert_eq!(r.place(id, 1, 2), ControlResponse::Applied);
    assert_eq!(r.job(id).state, JobState::Running);
    assert_eq!(r.state.used_resources()["id-1"].cpus, 1);
    assert_eq!(r.exit(id, 1, 1, 0), ControlResponse::Applied);
    assert_eq!(r.job(id).state, JobState::Running);
    assert!(
        matches!(r.exit(id, 1, 1, 0), ControlResponse::Ignored { .. }),
        "duplicate exit"
    );
    assert_eq!(r.exit(id, 1, 0, 0), ControlResponse::Applied);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.finished_at_ms, Some(30));
    assert_eq!(job.events.last().unwrap().what, EventKind::Succeeded);
    assert!(r.state.used_resources().is_empty());
}

#[test]
fn nonzero_exit_retries_then_fails_after_max_restarts() {
    let mut r = Replica::new();
    let id = r.submit(2, 1);
    r.place(id, 1, 2);
    r.exit(id, 1, 0, 3);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Pending);
    let ev = job.events.last().unwrap();
    assert_eq!(ev.what, EventKind::AttemptFailed);
    assert_eq!(
        ev.reason,
        "rank 0 on m0 exited with code 3; retrying (restart 1 of 1)"
    );
    // The other rank of the dead generation reports late: ignored.
    assert!(matches!(
        r.exit(id, 1, 1, 0),
        ControlResponse::Ignored { .. }
    ));
    assert_eq!(r.place(id, 2, 2), ControlResponse::Applied);
    assert_eq!(r.job(id).generation, 2);
    assert!(r.job(id).exits.is_empty());
    r.exit(id, 2, 1, 137);
    let job = r.job(id);
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        job.events.last().unwrap().reason,
        "rank 1 on m1 exited with code 137; all 1 restarts used"
    );
}

#[test]
fn no_restarts_allowed_fails_at_once() {
    let mut r = Replica::new();
    let id = r.submit(1, 0);
    r.place(id, 1, 1);
    r.apply(ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed {
            id,
            generation: 1,
            reason: "node m0 died".into(),
        }),
        at_ms: 5,
    });
    let job = r.job(id);
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        job.events.last().unwrap().reason,
        "node m0 died; no restarts allowed"
    );
}

#[test]
fn placement_must_be_for_the_next_attempt_of_a_pending_job() {
    let mut r = Replica::new();
    let id = r.submit(1, 3);
    assert!(matches!(
        r.place(id, 2, 1),
        ControlResponse::Rejected { .. }
    ));
    assert_eq!(r.place(id, 1, 1), ControlResponse::Applied);
    assert!(
        matches!(r.place(id, 2, 1), ControlResponse::Rejected { .. }),
        "running, not pending"
    );
    let bad = ControlCommand {
        op: Op::Place(ops::Place {
            id,
            generation: 2,
            slots: vec![],
            secret: new_ring_secret(),
        }),
        at_ms: 1,
    };
    assert_eq!(bad.check(), Err(BadCommand::Slots));
    for secret in [
        String::new(),
        "AB".repeat(32),
        "0".repeat(63),
        "g".repeat(64),
    ] {
        let cmd = ControlCommand {
            op: Op::Place(ops::Place {
                id,
                generation: 2,
                slots: slots(1),
                secret,
            }),
            at_ms: 1,
        };
        assert_eq!(cmd.check(), Err(BadCommand::Secret));
    }
    let unknown = JobId::from_log_index(999);
    assert!(matches!(
        r.place(unknown, 1, 1),
        ControlResponse::Rejected { .. }
    ));
}

#[test]
fn each_attempt_gets_its_own_ring_secret_which_the_api_never_shows() {
    let mut r = Replica::new();
    let id = r.submit(1, 3);
    assert_eq!(r.place(id, 1, 1), ControlResponse::Applied);
    let first = r.state.jobs[&id].ring_secret.clone();
    assert_eq!(first.len(), RING_SECRET_HEX_LEN);
    assert_eq!(r.exit(id, 1, 0, 1), ControlResponse::Applied);
    assert_eq!(r.state.jobs[&id].state, JobState::Pending, "retried");
    assert_eq!(r.place(id, 2, 1), ControlResponse::Applied);
    let second = r.state.jobs[&id].ring_secret.clone();
    assert_ne!(first, second, "a new generation, a new secret");
    // That the API never shows it: `api::status`'s tests.
}

#[test]
fn unplaceable_records_reason_once_until_it_changes() {
    let mut r = Replica::new();
    let id = r.submit(4, 3);
    let un = |reason: &str| ControlCommand {
        op: Op::Unplaceable(ops::Unplaceable {
            id,
            reason: reason.into(),
            quiet: false,
        }),
        at_ms: 7,
    };
    assert_eq!(r.apply(un("needs 4 workers")), ControlResponse::Applied);
    assert!(matches!(
        r.apply(un("needs 4 workers")),
        ControlResponse::Ignored { .. }
    ));
    assert_eq!(r.apply(un("other")), ControlResponse::Applied);
    let job = r.job(id);
    assert_eq!(job.pending_reason.as_deref(), Some("other"));
    assert_eq!(
        job.events
            .iter()
            .filter(|e| e.what == EventKind::Unplaceable)
            .count(),
        2
    );
    r.place(id, 1, 4);
    assert_eq!(r.job(id).pending_reason, None);
    assert!(matches!(
        r.apply(un("late")),
        ControlResponse::Ignored { .. }
    ));
}

#[test]
fn cancel_from_pending_and_running_not_from_terminal() {
    let mut r = Replica::new();
    let a = r.submit(1, 3);
    assert_eq!(
        r.apply(ControlCommand {
            op: Op::Cancel(ops::Cancel { id: a }),
            at_ms: 9
        }),
        ControlResponse::Applied
    );
    assert_eq!(r.job(a).state, JobState::Cancelled);
    assert!(matches!(
        r.apply(ControlCommand {
            op: Op::Cancel(ops::Cancel { id: a }),
            at_ms: 9
        }),
        ControlResponse::Rejected { .. }
    ));
    let b = r.submit(1, 3);
    r.place(b, 1, 1);
    assert_eq!(
        r.apply(ControlCommand {
            op: Op::Cancel(ops::Cancel { id: b }),
            at_ms: 9
        }),
        ControlResponse::Applied
    );
    assert_eq!(r.job(b).state, JobState::Cancelled);
    // Reports after cancel change nothing.
    assert!(matches!(
        r.exit(b, 1, 0, 1),
        ControlResponse::Ignored { .. }
    ));
    assert!(matches!(r.place(b, 2, 1), ControlResponse::Rejected { .. }));
    assert_eq!(r.job(b).state, JobState::Cancelled);
}

#[test]
fn exit_for_unknown_rank_is_rejected() {
    let mut r = Replica::new();
    let id = r.submit(2, 3);
    r.place(id, 1, 2);
    assert!(matches!(
        r.exit(id, 1, 5, 0),
        ControlResponse::Rejected { .. }
    ));
    assert_eq!(r.job(id).state, JobState::Running);
}

#[test]
fn metrics_latest_value_current_attempt_only() {
    let mut r = Replica::new();
    let id = r.submit(1, 3);
    let m = |generation, value, step| ControlCommand {
        op: Op::Metric(ops::Metric {
            id,
            generation,
            name: "loss".into(),
            value,
            step,
        }),
        at_ms: 3,
    };
    assert!(
        matches!(r.apply(m(1, 1.0, None)), ControlResponse::Ignored { .. }),
        "not running yet"
    );
    r.place(id, 1, 1);
    assert_eq!(r.apply(m(1, 0.5, Some(10))), ControlResponse::Applied);
    assert_eq!(r.apply(m(1, 0.25, Some(20))), ControlResponse::Applied);
    assert!(matches!(
        r.apply(m(0, 9.0, None)),
        ControlResponse::Ignored { .. }
    ));
    assert!(matches!(
        r.apply(m(1, f64::NAN, None)),
        ControlResponse::Rejected { .. }
    ));
    // A non-finite value survives the JSON log (as null) and is still rejected.
    let json = serde_json::to_string(&m(1, f64::INFINITY, None)).unwrap();
    let back: ControlCommand = serde_json::from_str(&json).unwrap();
    assert!(matches!(r.apply(back), ControlResponse::Rejected { .. }));
    let metric = r.job(id).metrics["loss"];
    assert_eq!((metric.value, metric.step), (0.25, Some(20)));
}

#[test]
fn metric_names_are_bounded() {
    let mut r = Replica::new();
    let id = r.submit(1, 3);
    r.place(id, 1, 1);
    for i in 0..METRICS_PER_JOB_MAX + 5 {
        r.apply(ControlCommand {
            op: Op::Metric(ops::Metric {
                id,
                generation: 1,
                name: format!("m{i}"),
                value: 1.0,
                step: None,
            }),
            at_ms: 1,
        });
    }
    assert_eq!(r.job(id).metrics.len(), METRICS_PER_JOB_MAX);
    let long = ControlCommand {
        op: Op::Metric(ops::Metric {
            id,
            generation: 1,
            name: "x".repeat(200),
            value: 1.0,
            step: None,
        }),
        at_ms: 1,
    };
    assert_eq!(long.check(), Err(BadCommand::MetricName));
}

#[test]
fn events_are_bounded_and_dropped_counted() {
    let mut r = Replica::new();
    let id = r.submit(1, 3);
    for i in 0..EVENTS_PER_JOB_MAX + 10 {
        r.apply(ControlCommand {
            op: Op::Unplaceable(ops::Unplaceable {
                id,
                reason: format!("r{i}"),
                quiet: false,
            }),
            at_ms: 1,
        });
    }
    let job = r.job(id);
    assert_eq!(job.events.len(), EVENTS_PER_JOB_MAX);
    assert_eq!(job.events_dropped, 11);
    // Long reasons are cut.
    r.apply(ControlCommand {
        op: Op::Unplaceable(ops::Unplaceable {
            id,
            reason: "é".repeat(REASON_BYTES_MAX),
            quiet: false,
        }),
        at_ms: 1,
    });
    assert!(r.job(id).pending_reason.as_ref().unwrap().len() <= REASON_BYTES_MAX);
}

#[test]
fn replicas_applying_the_same_log_agree_and_snapshot_roundtrips() {
    let log = |id: JobId| {
        vec![
            ControlCommand {
                op: Op::Place(ops::Place {
                    id,
                    generation: 1,
                    slots: slots(2),
                    secret: new_ring_secret(),
                }),
                at_ms: 2,
            },
            ControlCommand {
                op: Op::Metric(ops::Metric {
                    id,
                    generation: 1,
                    name: "acc".into(),
                    value: 0.9,
                    step: Some(3),
                }),
                at_ms: 3,
            },
            ControlCommand {
                op: Op::WorkerExited(ops::WorkerExited {
                    id,
                    generation: 1,
                    rank: 0,
                    code: 1,
                    end: None,
                }),
                at_ms: 4,
            },
            ControlCommand {
                op: Op::Place(ops::Place {
                    id,
                    generation: 2,
                    slots: slots(2),
                    secret: new_ring_secret(),
                }),
                at_ms: 5,
            },
        ]
    };
    let mut a = Replica::new();
    let mut b = Replica::new();
    let ia = a.submit(2, 3);
    let ib = b.submit(2, 3);
    assert_eq!(ia, ib);
    for cmd in log(ia) {
        assert_eq!(a.apply(cmd.clone()), b.apply(cmd));
    }
    assert_eq!(a.state, b.state);
    assert_eq!(a.state.applied_index, 5);
    assert_eq!(a.state.applied_at_ms, 10);
    let json = serde_json::to_vec(&a.state).unwrap();
    let back: ControlState = serde_json::from_slice(&json).unwrap();
    assert_eq!(back, a.state);
    for cmd in log(ia).into_iter().chain([ControlCommand {
        op: Op::Cancel(ops::Cancel { id: ia }),
        at_ms: 1,
    }]) {
        let json = serde_json::to_string(&cmd).unwrap();
        assert_eq!(serde_json::from_str::<ControlCommand>(&json).unwrap(), cmd);
    }
}

#[test]
fn a_retried_submit_with_the_same_token_returns_the_first_id() {
    let mut state = ControlState::default();
    let submit = |token: Option<&str>| ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(spec(1, 0)),
            token: token.map(str::to_string),
            owner: crate::state::users::admin_user(),
        }),
        at_ms: 5,
    };
    let first = state.apply(1, &submit(Some("abc")));
    let again = state.apply(2, &submit(Some("abc")));
    assert_eq!(first, again, "same token, same job");
    assert_eq!(state.jobs.len(), 1);
    let other = state.apply(3, &submit(Some("def")));
    assert_ne!(first, other);
    state.apply(4, &submit(None));
    assert_eq!(state.jobs.len(), 3);
    assert!(matches!(
        state.apply(5, &submit(Some(""))),
        ControlResponse::Rejected { .. }
    ));
}

mod metric_history {
    use super::*;

    #[test]
    fn history_is_bounded_and_keeps_the_whole_curve() {
        let mut h = MetricHistory::default();
        let reports = 10 * METRIC_HISTORY_POINTS_MAX as u64 + 3;
        for i in 0..reports {
            h.record(Some(i * 10), i as f64);
            assert!(h.points.len() <= METRIC_HISTORY_POINTS_MAX);
        }
        assert!(h.points.len() >= METRIC_HISTORY_POINTS_MAX / 2);
        assert_eq!(h.points[0], (0, 0.0), "the start of the curve stays");
        let last = h.points.last().unwrap().0;
        assert!(last >= (reports - h.stride) * 10, "the end too: {last}");
        let gaps: std::collections::BTreeSet<u64> =
            h.points.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert_eq!(gaps.len(), 1, "evenly spaced: {gaps:?}");
    }

    #[test]
    fn reports_without_a_step_are_numbered() {
        let mut h = MetricHistory::default();
        h.record(None, 1.0);
        h.record(Some(7), 2.0);
        h.record(None, 3.0);
        assert_eq!(h.points, vec![(0, 1.0), (7, 2.0), (2, 3.0)]);
    }

    /// A snapshot written before tokens and removals existed still loads, with none.
    #[test]
    fn a_state_without_tokens_or_removals_still_loads() {
        let old = r#"{"jobs":{},"applied_at_ms":5,"applied_index":3,"tokens":{},"blacklist":{},"datasets":{}}"#;
        let s: ControlState = serde_json::from_str(old).unwrap();
        assert_eq!(s.applied_index, 3);
        assert!(s.api_tokens.is_empty() && s.removed.is_empty());
        let mut s = s;
        let cmd = ControlCommand {
            op: Op::MemberRemove(ops::MemberRemove {
                peer_id: libp2p::PeerId::random().to_string(),
                name: "c".into(),
            }),
            at_ms: 6,
        };
        assert_eq!(s.apply(4, &cmd), ControlResponse::Applied);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<ControlState>(&json).unwrap(), s);
        // The new commands as log entries, and an old entry beside them.
        let line = serde_json::to_string(&cmd).unwrap();
        assert!(line.contains(r#""op":"member_remove""#), "{line}");
        assert_eq!(serde_json::from_str::<ControlCommand>(&line).unwrap(), cmd);
        let cancel = r#"{"op":"cancel","id":"j-1","at_ms":1}"#;
        assert!(serde_json::from_str::<ControlCommand>(cancel).is_ok());
    }
}

/// A standby is staged only on a running ringleader-protocol elastic command job, in its
/// current generation, once, with an unused worker id; a new attempt or the job's end drops
/// it.
#[test]
fn a_standby_is_staged_once_per_job_and_dropped_with_its_attempt() {
    let mut r = Replica::new();
    let submit = |r: &mut Replica, protocol: &str| {
        match r.apply(ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(
                JobSpec::parse(&format!(
                    "name = \"e\"\nkind = \"command\"\nworkers = 2\nmin_workers = 1\nmax_workers = 3\nmax_restarts = 1\ncommand = [\"true\"]\n[elastic]\nprotocol = \"{protocol}\"\n"
                ))
                .unwrap(),
            ),
            token: None,
            owner: crate::state::users::admin_user(),
        }),
        at_ms: 10,
    }) {
        ControlResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
    };
    let standby = |id, generation, worker| ControlCommand {
        op: Op::Standby(ops::Standby {
            id,
            generation,
            slot: Slot {
                member: "id-9".into(),
                name: "m9".into(),
                rank: 2,
                local_rank: 0,
                worker,
                gpus: Vec::new(),
            },
        }),
        at_ms: 20,
    };
    let torchrun = submit(&mut r, "torchrun");
    assert_eq!(r.place(torchrun, 1, 2), ControlResponse::Applied);
    assert!(matches!(
        r.apply(standby(torchrun, 1, 2)),
        ControlResponse::Rejected { .. }
    ));
    let id = submit(&mut r, "ringleader");
    assert!(
        matches!(r.apply(standby(id, 0, 2)), ControlResponse::Ignored { .. }),
        "not running"
    );
    assert_eq!(r.place(id, 1, 2), ControlResponse::Applied);
    for (cmd, why) in [
        (standby(id, 2, 2), "a later generation"),
        (standby(id, 1, 1), "a worker id in use"),
    ] {
        assert!(
            matches!(r.apply(cmd), ControlResponse::Ignored { .. }),
            "{why}"
        );
    }
    assert_eq!(r.apply(standby(id, 1, 2)), ControlResponse::Applied);
    assert!(
        matches!(r.apply(standby(id, 1, 3)), ControlResponse::Ignored { .. }),
        "one at a time"
    );
    let job = r.state.job(id).unwrap();
    assert_eq!(
        (job.next_worker, job.standby.as_ref().unwrap().ready),
        (3, false)
    );
    // The attempt fails: the retry starts without it.
    assert_eq!(
        r.apply(ControlCommand {
            op: Op::AttemptFailed(ops::AttemptFailed {
                id,
                generation: 1,
                reason: "test".into(),
            }),
            at_ms: 30,
        }),
        ControlResponse::Applied
    );
    assert!(r.state.job(id).unwrap().standby.is_none());
}
