//! Tests of `trials` (a sibling file: the module is long enough without them).

use super::*;
use crate::spec::JobSpec;
use crate::state::{failure::RankEnd, ops, ControlCommand, Op};

const ASHA: &str = r#"
name = "s"
kind = "search"
[train]
epochs = 9
[search]
algorithm = "asha"
trials = 9
metric = "val_accuracy"
direction = "max"
max_trial_failures = 1
[[search.params]]
name = "train.lr"
type = "double"
min = 0.01
max = 0.5
"#;

/// A state with the search submitted at index 1; applies commands at the next index.
struct Log {
    state: ControlState,
    index: u64,
}

impl Log {
    fn new(text: &str) -> (Log, JobId) {
        let mut log = Log {
            state: ControlState::default(),
            index: 0,
        };
        let spec = Box::new(JobSpec::parse(text).unwrap());
        let r = log.apply(ControlCommand {
            op: Op::Submit(ops::Submit {
                spec,
                token: None,
                owner: crate::state::users::admin_user(),
            }),
            at_ms: 1,
        });
        let ControlResponse::Submitted { id } = r else {
            panic!("{r:?}")
        };
        (log, id)
    }

    fn apply(&mut self, cmd: ControlCommand) -> ControlResponse {
        self.index += 1;
        self.state.apply(self.index, &cmd)
    }

    /// Starts trial `trial` with `lr` towards `target` on member `m{trial}`; its job id.
    fn start(&mut self, search: JobId, trial: u32, lr: f64, target: u32) -> JobId {
        let mut params = Params::new();
        params.insert("train.lr".into(), toml::Value::Float(lr));
        let r = self.apply(ControlCommand {
            op: Op::TrialStart(ops::TrialStart {
                search,
                trial,
                params,
                bracket: 0,
                target,
                slots: vec![slot(trial)],
                secret: "ab".repeat(32),
            }),
            at_ms: 10,
        });
        assert_eq!(r, ControlResponse::Applied);
        JobId::from_log_index(self.index)
    }

    fn report(&mut self, id: JobId, resource: u32, value: f64) -> ControlResponse {
        let generation = self.state.job(id).unwrap().generation;
        self.apply(ControlCommand {
            op: Op::TrialReport(ops::TrialReport {
                id,
                generation,
                resource,
                value,
            }),
            at_ms: 20,
        })
    }

    fn exit(&mut self, id: JobId, code: i32) {
        self.exit_with(id, code, None);
    }

    /// Rank 0 of `id` exits with `code`, its node saying how (`end`).
    fn exit_with(&mut self, id: JobId, code: i32, end: Option<RankEnd>) {
        let generation = self.state.job(id).unwrap().generation;
        self.apply(ControlCommand {
            op: Op::WorkerExited(ops::WorkerExited {
                id,
                generation,
                rank: 0,
                code,
                end,
            }),
            at_ms: 30,
        });
    }

    fn trial(&self, search: JobId, trial: u32) -> &Trial {
        &self
            .state
            .job(search)
            .unwrap()
            .search
            .as_ref()
            .unwrap()
            .trials[trial as usize]
    }
}

fn slot(i: u32) -> Slot {
    Slot {
        member: format!("id-{i}"),
        name: format!("m{i}"),
        rank: 0,
        local_rank: 0,
        worker: 0,
        gpus: Vec::new(),
    }
}

#[test]
fn a_search_runs_from_its_submit_and_its_trials_are_jobs_of_their_own() {
    let (mut log, search) = Log::new(ASHA);
    assert_eq!(log.state.job(search).unwrap().state, JobState::Running);
    assert_eq!(log.state.pending().count(), 0, "a search is never placed");
    let run = log.start(search, 0, 0.1, 1);
    let job = log.state.job(run).unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.spec.name, "s-t0");
    assert_eq!(
        job.spec.tables().train.as_ref().unwrap()["lr"],
        toml::Value::Float(0.1)
    );
    assert_eq!(job.trial_of.as_ref().unwrap().target, 1);
    // Trials are created in order, once.
    let mut params = Params::new();
    params.insert("train.lr".into(), toml::Value::Float(0.2));
    let again = log.apply(ControlCommand {
        op: Op::TrialStart(ops::TrialStart {
            search,
            trial: 0,
            params,
            bracket: 0,
            target: 1,
            slots: vec![slot(1)],
            secret: "ab".repeat(32),
        }),
        at_ms: 11,
    });
    assert!(
        matches!(again, ControlResponse::Ignored { .. }),
        "{again:?}"
    );
}

#[test]
fn a_promoted_trial_goes_on_in_the_same_job_and_a_paused_one_waits() {
    let (mut log, search) = Log::new(ASHA);
    let a = log.start(search, 0, 0.1, 1);
    let b = log.start(search, 1, 0.2, 1);
    let c = log.start(search, 2, 0.3, 1);
    // ⌊n/η⌋ of the rung so far: the first two pause, the third (best, n = 3) goes on.
    log.report(a, 1, 0.5);
    assert_eq!(log.trial(search, 0).state, TrialState::Paused);
    log.report(b, 1, 0.6);
    assert_eq!(log.trial(search, 1).state, TrialState::Paused);
    log.report(c, 1, 0.9);
    let t = log.trial(search, 2);
    assert_eq!(
        (t.state, t.target, t.promotions),
        (TrialState::Running, 3, 1)
    );
    // A report behind the trial's progress, or of an old generation, changes nothing.
    assert!(matches!(
        log.report(c, 1, 0.1),
        ControlResponse::Ignored { .. }
    ));
    // It exits at its rung; the same job is placed again towards rung 3.
    log.exit(c, 0);
    let job = log.state.job(c).unwrap();
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.trial_of.as_ref().unwrap().target, 3);
    let old_generation = job.generation;
    log.apply(ControlCommand {
        op: Op::Place(ops::Place {
            id: c,
            generation: old_generation + 1,
            slots: vec![slot(2)],
            secret: "cd".repeat(32),
        }),
        at_ms: 40,
    });
    let stale = log.apply(ControlCommand {
        op: Op::TrialReport(ops::TrialReport {
            id: c,
            generation: old_generation,
            resource: 2,
            value: 0.95,
        }),
        at_ms: 41,
    });
    assert!(
        matches!(stale, ControlResponse::Ignored { .. }),
        "{stale:?}"
    );
    // Alone at rung 3 (⌊1/3⌋ = 0 go on at once) it pauses; its job ends there.
    log.report(c, 3, 0.95);
    assert_eq!(log.trial(search, 2).state, TrialState::Paused);
    log.exit(c, 0);
    assert_eq!(log.state.job(c).unwrap().state, JobState::Succeeded);
    // The chief promotes it later (ASHA's late promotion): the same job runs again.
    let r = log.apply(ControlCommand {
        op: Op::TrialPromote(ops::TrialPromote {
            search,
            trial: 2,
            target: 9,
            slots: vec![slot(2)],
            secret: "cd".repeat(32),
        }),
        at_ms: 50,
    });
    assert_eq!(r, ControlResponse::Applied);
    let job = log.state.job(c).unwrap();
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.trial_of.as_ref().unwrap().target, 9);
    assert_eq!(log.trial(search, 2).promotions, 2);
    log.report(c, 9, 0.97);
    assert_eq!(log.trial(search, 2).state, TrialState::Succeeded);
    log.exit(c, 0);
    assert_eq!(log.state.job(c).unwrap().state, JobState::Succeeded);
    // The paused trials stay until the search ends; then they are stopped.
    assert_eq!(log.trial(search, 0).state, TrialState::Paused);
    assert!(matches!(
        log.apply(ControlCommand {
            op: Op::SearchFinished(ops::SearchFinished { search }),
            at_ms: 60
        }),
        ControlResponse::Applied
    ));
    assert_eq!(log.trial(search, 0).state, TrialState::Stopped);
    let s = log.state.job(search).unwrap();
    assert_eq!(s.state, JobState::Succeeded);
    assert!(s.events.last().unwrap().reason.contains("best trial 2"));
}

#[test]
fn a_resumable_command_trials_run_reports_nothing_beyond_its_rung() {
    // The train search's settings, as command trials that resume from their checkpoints.
    let command = ASHA
        .replace(
            "[train]\nepochs = 9\n",
            "command = [\"python3\", \"t.py\"]\n",
        )
        .replace(
            "algorithm = \"asha\"",
            "trial = \"command\"\nalgorithm = \"asha\"\nmax_resource = 9\nresumable = true",
        );
    let (mut log, search) = Log::new(&command);
    let a = log.start(search, 0, 0.1, 1);
    let b = log.start(search, 1, 0.2, 1);
    let c = log.start(search, 2, 0.3, 1);
    let of = log.state.job(c).unwrap().trial_of.clone().unwrap();
    assert!(of.resumable && of.target == 1, "{of:?}");
    log.report(a, 1, 0.5);
    log.report(b, 1, 0.6);
    log.report(c, 1, 0.9);
    assert_eq!(log.trial(search, 2).target, 3, "promoted");
    // The run promoted at rung 1 went on past it: no result of rung 3's run.
    let past = log.report(c, 2, 0.99);
    assert!(matches!(past, ControlResponse::Ignored { .. }), "{past:?}");
    assert_eq!(log.trial(search, 2).reports.len(), 1);
    log.exit(c, 0);
    assert_eq!(
        log.state.job(c).unwrap().trial_of.as_ref().unwrap().target,
        3
    );
    // Placed again, the promoted run resumed past rung 3 (its last run saved beyond its
    // rung): its first report beyond the rung is the rung's, the next beyond it nothing.
    let generation = log.state.job(c).unwrap().generation;
    log.apply(ControlCommand {
        op: Op::Place(ops::Place {
            id: c,
            generation: generation + 1,
            slots: vec![slot(2)],
            secret: "cd".repeat(32),
        }),
        at_ms: 40,
    });
    log.report(c, 4, 0.95);
    let reports = &log.trial(search, 2).reports;
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert_eq!((reports[1].resource, reports[1].value), (3, 0.95));
    let again = log.report(c, 5, 0.97);
    assert!(
        matches!(again, ControlResponse::Ignored { .. }),
        "{again:?}"
    );
    // A train trial stops at its rung itself: it is not marked.
    let (mut train, search) = Log::new(ASHA);
    let t = train.start(search, 0, 0.1, 1);
    assert!(
        !train
            .state
            .job(t)
            .unwrap()
            .trial_of
            .as_ref()
            .unwrap()
            .resumable
    );
}

/// A search whose trials all exit 0 without a report ends failed naming the metric, and
/// each such trial is named in its events; a search from an older log (its spec without
/// `reports_required`) still ends succeeded, as it did.
#[test]
fn a_search_without_reports_fails_naming_the_metric_unless_from_an_older_log() {
    let one = ASHA.replace("trials = 9", "trials = 1");
    for required in [true, false] {
        let mut log = Log {
            state: ControlState::default(),
            index: 0,
        };
        let mut spec = JobSpec::parse(&one).unwrap();
        assert!(spec.reports_required, "set on every spec admitted now");
        spec.reports_required = required;
        let r = log.apply(ControlCommand {
            op: Op::Submit(ops::Submit {
                spec: Box::new(spec),
                token: None,
                owner: crate::state::users::admin_user(),
            }),
            at_ms: 1,
        });
        let ControlResponse::Submitted { id: search } = r else {
            panic!("{r:?}")
        };
        let a = log.start(search, 0, 0.1, 9);
        log.exit(a, 0);
        assert_eq!(log.trial(search, 0).state, TrialState::Succeeded);
        log.apply(ControlCommand {
            op: Op::SearchFinished(ops::SearchFinished { search }),
            at_ms: 60,
        });
        let s = log.state.job(search).unwrap();
        assert!(
            s.events
                .iter()
                .any(|e| e.reason.contains("trial 0 never printed val_accuracy")),
            "{:?}",
            s.events
        );
        let last = &s.events.last().unwrap().reason;
        if required {
            assert_eq!(s.state, JobState::Failed);
            assert!(last.starts_with("no trial reported val_accuracy"), "{last}");
        } else {
            assert_eq!(s.state, JobState::Succeeded);
            assert!(last.contains("none reported its metric"), "{last}");
        }
    }
}

#[test]
fn a_lost_trial_is_rerun_and_its_own_failures_are_counted() {
    let (mut log, search) = Log::new(ASHA);
    let a = log.start(search, 0, 0.1, 1);
    let generation = log.state.job(a).unwrap().generation;
    log.apply(ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed {
            id: a,
            generation,
            reason: "peer-lost m0 (rank 0): member dead".into(),
        }),
        at_ms: 20,
    });
    assert_eq!(log.state.job(a).unwrap().state, JobState::Pending, "re-run");
    assert_eq!(
        log.state
            .job(search)
            .unwrap()
            .search
            .as_ref()
            .unwrap()
            .failures,
        0
    );
    log.apply(ControlCommand {
        op: Op::Place(ops::Place {
            id: a,
            generation: generation + 1,
            slots: vec![slot(1)],
            secret: "cd".repeat(32),
        }),
        at_ms: 21,
    });
    let record = log.state.job(search).unwrap().search.as_ref().unwrap();
    assert_eq!(record.runs[0].node, "m1", "where it runs now");
    // Its own code fails: retried once (max_trial_failures = 1), then failed.
    log.exit(a, 3);
    assert_eq!(log.state.job(a).unwrap().state, JobState::Pending);
    log.apply(ControlCommand {
        op: Op::Place(ops::Place {
            id: a,
            generation: generation + 2,
            slots: vec![slot(1)],
            secret: "cd".repeat(32),
        }),
        at_ms: 22,
    });
    log.exit(a, 3);
    assert_eq!(log.state.job(a).unwrap().state, JobState::Failed);
    assert_eq!(log.trial(search, 0).state, TrialState::Failed);
}

/// A search whose trials all failed names their most common cause with its count.
#[test]
fn a_search_with_no_successful_trial_names_its_trials_most_common_failure() {
    let spec = ASHA
        .replace("trials = 9", "trials = 3")
        .replace("max_trial_failures = 1", "max_trial_failures = 0");
    let (mut log, search) = Log::new(&spec);
    let tail = |line: &str| RankEnd {
        stderr_tail: vec!["Traceback …".into(), line.into()],
        ..RankEnd::default()
    };
    let missing = "ModuleNotFoundError: No module named 'foo'";
    for (trial, line) in [(0, missing), (1, "MemoryError"), (2, missing)] {
        let id = log.start(search, trial, 0.1, 9);
        log.exit_with(id, 1, Some(tail(line)));
        assert_eq!(log.trial(search, trial).state, TrialState::Failed);
    }
    log.apply(ControlCommand {
        op: Op::SearchFinished(ops::SearchFinished { search }),
        at_ms: 60,
    });
    let s = log.state.job(search).unwrap();
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(
        s.events.last().unwrap().reason,
        format!("3 trials, none succeeded; 2 failed with exit 1: {missing}")
    );
}

#[test]
fn cancelling_a_search_stops_its_trials() {
    let (mut log, search) = Log::new(ASHA);
    let a = log.start(search, 0, 0.1, 1);
    log.apply(ControlCommand {
        op: Op::Cancel(ops::Cancel { id: search }),
        at_ms: 20,
    });
    assert_eq!(log.state.job(a).unwrap().state, JobState::Cancelled);
    assert_eq!(log.trial(search, 0).state, TrialState::Stopped);
}

#[test]
fn a_trial_its_search_stops_reads_stopped_not_cancelled() {
    // Command trials that are not resumable run to max_resource; ASHA stops the laggards.
    let (mut log, search) = Log::new(
        r#"
name = "s"
kind = "search"
command = ["true"]
[search]
trial = "command"
algorithm = "asha"
trials = 9
max_resource = 9
metric = "score"
direction = "max"
[[search.params]]
name = "lr"
type = "double"
min = 0.01
max = 0.5
"#,
    );
    let jobs: Vec<JobId> = (0..3).map(|t| log.start(search, t, 0.1, 9)).collect();
    for (job, value) in jobs.iter().zip([0.9, 0.8, 0.1]) {
        log.report(*job, 1, value);
    }
    let stopped = log.state.job(jobs[2]).unwrap();
    assert_eq!(log.trial(search, 2).state, TrialState::Stopped);
    assert_eq!(
        (stopped.state, stopped.state_text()),
        (JobState::Cancelled, "stopped")
    );
    // A search cancelled by its user cancels its running trials: those read `cancelled`.
    log.apply(ControlCommand {
        op: Op::Cancel(ops::Cancel { id: search }),
        at_ms: 40,
    });
    let cancelled = log.state.job(jobs[0]).unwrap();
    assert_eq!(cancelled.state_text(), "cancelled");
    assert_eq!(log.state.job(jobs[2]).unwrap().state_text(), "stopped");
}
