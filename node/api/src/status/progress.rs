//! A job's progress as users read it: the steps done of the total, and when it should end.
//!
//! While a job runs, the total is its plan ([`super::total_steps`]: `max_steps`, a
//! `total_steps` metric, or epochs × the steps of an epoch) and its end is estimated from
//! the step rate of its current generation: from the generation's first `step` report
//! (`Job::first_step`; a resumed run starts at its checkpoint's step) to its latest.
//!
//! Once a job ended the plan is no longer the measure. A trial its search stopped after
//! one epoch of nine, a cancelled or failed job, one whose estimate was off: each did the
//! steps it did, so its total is its final step (`150 / 150`) and it has no end time. The
//! plan alone (`150 / 1350`, an ETA computed by clients for a job long over) read as a job
//! still running, or one that lost most of its work.

use serde::{Deserialize, Serialize};

use crate::domain::state::{ops::STEP_METRIC, Job, JobState};

/// [`progress`] of a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Steps done: the newest of the `step` metric and the steps of the newest
    /// generation's reports (the `step` metric is thinned like any other).
    pub step: Option<u64>,
    /// The steps of the whole job: its plan while it has not ended, the steps it did once
    /// it has (see the module doc).
    pub total_steps: Option<u64>,
    /// When a running job should reach `total_steps` at its current generation's step rate
    /// (ms since the Unix epoch, the reporters' clock).
    pub eta_at_ms: Option<u64>,
}

/// The steps done by `j` (see [`Progress::step`]).
pub fn step(j: &Job) -> Option<u64> {
    let metric = j.metrics.get(STEP_METRIC).map(|m| m.value.max(0.0) as u64);
    // The step metric may lag: a `val_accuracy` measured at step 15 may arrive while
    // `step` still says 1. Only the newest generation's reports count (a retry resumes
    // from an older step).
    let newest = j.metrics.values().map(|m| m.generation).max();
    let reported = j
        .metrics
        .values()
        .filter(|m| Some(m.generation) == newest)
        .filter_map(|m| m.step)
        .max();
    match (metric, reported) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// `j`'s progress (see the module doc).
pub fn progress(j: &Job) -> Progress {
    let step = step(j);
    if j.state.is_terminal() {
        return Progress {
            step,
            total_steps: step,
            eta_at_ms: None,
        };
    }
    let total_steps = super::total_steps(j).map(|t| step.map_or(t, |s| t.max(s)));
    let eta_at_ms = match (j.state, step, total_steps) {
        (JobState::Running, Some(done), Some(total)) => eta_at_ms(j, done, total),
        _ => None,
    };
    Progress {
        step,
        total_steps,
        eta_at_ms,
    }
}

/// When `j` reaches `total` steps from `done`, at the rate of its current generation's
/// `step` reports; `None` until two reports of the generation are apart in steps and time.
fn eta_at_ms(j: &Job, done: u64, total: u64) -> Option<u64> {
    let latest = j.metrics.get(STEP_METRIC)?;
    let (generation, first, first_ms) = j.first_step?;
    if generation != latest.generation {
        return None;
    }
    let steps = (latest.value.max(0.0) as u64).checked_sub(first)?;
    let ms = latest.at_ms.checked_sub(first_ms)?;
    if steps == 0 || ms == 0 {
        return None;
    }
    let left = total.saturating_sub(done);
    let left_ms = (left as f64 * ms as f64 / steps as f64).round() as u64;
    Some(latest.at_ms.saturating_add(left_ms))
}

/// Progress as the CLI prints it: `900 / 1350  ETA 1m20s`, `1350 / 1350`, `step 900` while
/// the total is unknown, `-` before the first step. `now_ms`: the reader's clock.
pub fn progress_text(p: &Progress, now_ms: u64) -> String {
    let Some(step) = p.step else {
        return "-".into();
    };
    let Some(total) = p.total_steps else {
        return format!("step {step}");
    };
    let mut s = format!("{step} / {total}");
    if let Some(eta) = p.eta_at_ms {
        s.push_str(&format!(
            "  ETA {}",
            duration_text(eta.saturating_sub(now_ms))
        ));
    }
    s
}

/// `45s`, `3m05s`, `2h07m`.
pub fn duration_text(ms: u64) -> String {
    let s = ms.div_ceil(1000);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{ops, ControlCommand, ControlResponse, ControlState, Op};

    /// A running train job of 9 epochs, one worker, its state and id.
    fn running_train() -> (ControlState, crate::domain::state::JobId) {
        let text = "name = \"t\"\nkind = \"train\"\nworkers = 1\n[train]\nepochs = 9\n";
        let mut state = ControlState::default();
        let ControlResponse::Submitted { id } = state.apply(
            1,
            &ControlCommand {
                op: Op::Submit(ops::Submit {
                    spec: Box::new(crate::domain::spec::JobSpec::parse(text).unwrap()),
                    token: None,
                    owner: crate::domain::state::users::admin_user(),
                }),
                at_ms: 1,
            },
        ) else {
            panic!("not submitted")
        };
        let slot = crate::domain::state::Slot {
            member: "id-a".into(),
            name: "a".into(),
            rank: 0,
            local_rank: 0,
            worker: 0,
            gpus: Vec::new(),
        };
        let placed = state.apply(
            2,
            &ControlCommand {
                op: Op::Place(ops::Place {
                    id,
                    generation: 1,
                    slots: vec![slot],
                    secret: "ab".repeat(32),
                }),
                at_ms: 2,
            },
        );
        assert_eq!(placed, ControlResponse::Applied);
        (state, id)
    }

    fn metric(state: &mut ControlState, index: u64, m: ops::Metric, at_ms: u64) {
        let r = state.apply(
            index,
            &ControlCommand {
                op: Op::Metric(m),
                at_ms,
            },
        );
        assert_eq!(r, ControlResponse::Applied);
    }

    fn step(id: crate::domain::state::JobId, step: u64) -> ops::Metric {
        ops::Metric {
            id,
            generation: 1,
            name: STEP_METRIC.into(),
            value: step as f64,
            step: None,
        }
    }

    fn validated(id: crate::domain::state::JobId, step: u64) -> ops::Metric {
        ops::Metric {
            id,
            generation: 1,
            name: "val_loss".into(),
            value: 0.5,
            step: Some(step),
        }
    }

    #[test]
    fn a_running_job_has_its_plan_and_an_eta_from_its_step_rate() {
        let (mut state, id) = running_train();
        metric(&mut state, 3, step(id, 0), 10_000);
        metric(&mut state, 4, validated(id, 150), 25_000);
        metric(&mut state, 5, step(id, 300), 40_000);
        let p = progress(state.job(id).unwrap());
        // 300 steps in 30 s: the 1050 left take 105 s more.
        assert_eq!(
            p,
            Progress {
                step: Some(300),
                total_steps: Some(1350),
                eta_at_ms: Some(145_000),
            }
        );
        assert_eq!(progress_text(&p, 40_000), "300 / 1350  ETA 1m45s");
    }

    #[test]
    fn an_ended_job_shows_the_steps_it_did_not_its_plan() {
        // The "150 / 1350" of a trial its search stopped after one epoch of nine: the
        // plan stayed the total after the job ended, and clients took it as running.
        let (mut state, id) = running_train();
        metric(&mut state, 3, step(id, 10), 10_000);
        metric(&mut state, 4, validated(id, 150), 25_000);
        metric(&mut state, 5, step(id, 150), 25_000);
        assert_eq!(progress(state.job(id).unwrap()).total_steps, Some(1350));
        let r = state.apply(
            6,
            &ControlCommand {
                op: Op::Cancel(ops::Cancel { id }),
                at_ms: 26_000,
            },
        );
        assert_eq!(r, ControlResponse::Applied);
        let p = progress(state.job(id).unwrap());
        assert_eq!(
            p,
            Progress {
                step: Some(150),
                total_steps: Some(150),
                eta_at_ms: None,
            }
        );
        assert_eq!(progress_text(&p, 99_000), "150 / 150");
    }

    #[test]
    fn a_job_past_its_estimate_is_never_shown_beyond_its_total() {
        let (mut state, id) = running_train();
        metric(&mut state, 3, validated(id, 100), 10_000);
        metric(&mut state, 4, step(id, 1000), 20_000);
        let p = progress(state.job(id).unwrap());
        assert_eq!((p.step, p.total_steps), (Some(1000), Some(1000)));
    }

    #[test]
    fn text_before_a_step_and_without_a_total() {
        assert_eq!(progress_text(&Progress::default(), 0), "-");
        let p = Progress {
            step: Some(7),
            ..Progress::default()
        };
        assert_eq!(progress_text(&p, 0), "step 7");
        assert_eq!(duration_text(0), "0s");
        assert_eq!(duration_text(59_001), "1m00s");
        assert_eq!(duration_text(7_620_000), "2h07m");
    }
}
