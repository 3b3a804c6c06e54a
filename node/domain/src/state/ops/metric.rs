//! `metric`: a running generation's latest value of a metric, kept with its bounded
//! history (at most [`METRICS_PER_JOB_MAX`] names a job).

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{
    ignored, BadCommand, ControlResponse, ControlState, JobId, METRICS_PER_JOB_MAX,
    METRIC_NAME_BYTES_MAX,
};

/// The metric that counts a job's steps (the trainer's, or a rank's own
/// `ringleader-metric step N`).
pub const STEP_METRIC: &str = "step";

/// Latest value of a metric of a running generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// The job.
    pub id: JobId,
    /// The generation that reported it.
    pub generation: u32,
    /// Metric name.
    pub name: String,
    /// Value; must be finite (a non-finite value travels as `null` and is rejected by
    /// `apply`, so a bad report can neither break the JSON log nor the state).
    #[serde(with = "super::finite_or_null")]
    pub value: f64,
    /// Step, if reported.
    pub step: Option<u64>,
}

impl Command for Metric {
    fn check(&self) -> Result<(), BadCommand> {
        if self.name.is_empty() || self.name.len() > METRIC_NAME_BYTES_MAX {
            return Err(BadCommand::MetricName);
        }
        if !self.value.is_finite() {
            return Err(BadCommand::NonFiniteMetric {
                name: self.name.clone(),
            });
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let Metric {
            id,
            generation,
            ref name,
            value,
            step,
        } = *self;
        let job = match state.current_attempt(id, generation) {
            Ok(job) => job,
            Err(r) => return r,
        };
        if !job.metrics.contains_key(name) && job.metrics.len() >= METRICS_PER_JOB_MAX {
            return ignored(format!("more than {METRICS_PER_JOB_MAX} metric names"));
        }
        job.metrics.insert(
            name.to_owned(),
            crate::state::Metric {
                value,
                step,
                generation,
                at_ms: at.at_ms,
            },
        );
        // Where the step rate of the job's progress is measured from: the generation's
        // first `step` (a resumed run starts at its checkpoint's step, not 0).
        if name == STEP_METRIC && job.first_step.is_none_or(|(g, _, _)| g != generation) {
            job.first_step = Some((generation, value.max(0.0) as u64, at.at_ms));
        }
        job.metric_history
            .entry(name.to_owned())
            .or_default()
            .record(step, value);
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Rank {
            id: self.id,
            generation: self.generation,
            rank: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, running};

    fn metric(id: JobId, value: f64, step: u64) -> Metric {
        Metric {
            id,
            generation: 1,
            name: "loss".into(),
            value,
            step: Some(step),
        }
    }

    #[test]
    fn metric_keeps_the_latest_value_and_its_history() {
        let (mut state, id) = running(1, 1);
        assert_eq!(
            metric(id, 0.5, 1).apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert_eq!(
            metric(id, 0.25, 2).apply(&mut state, at(10)),
            ControlResponse::Applied
        );
        let job = &state.jobs[&id];
        assert_eq!(job.metrics["loss"].value, 0.25);
        assert_eq!(job.metric_history["loss"].points, vec![(1, 0.5), (2, 0.25)]);
    }

    #[test]
    fn the_first_step_of_each_generation_is_kept() {
        let (mut state, id) = running(1, 1);
        for (step, at_ms) in [(5, 100), (9, 200)] {
            let m = Metric {
                name: STEP_METRIC.into(),
                ..metric(id, step as f64, step)
            };
            assert_eq!(m.apply(&mut state, at(at_ms)), ControlResponse::Applied);
        }
        assert_eq!(state.jobs[&id].first_step, Some((1, 5, 100)));
    }

    #[test]
    fn a_value_must_be_finite_and_a_name_short() {
        let id = JobId::from_log_index(1);
        assert!(matches!(
            metric(id, f64::NAN, 1).check(),
            Err(BadCommand::NonFiniteMetric { .. })
        ));
        let mut long = metric(id, 1.0, 1);
        long.name = "x".repeat(METRIC_NAME_BYTES_MAX + 1);
        assert_eq!(long.check(), Err(BadCommand::MetricName));
    }
}
