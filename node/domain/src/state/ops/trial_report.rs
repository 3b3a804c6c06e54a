//! `trial_report`: a trial's rank 0 reported the search's metric at a resource; the
//! searcher decides at once (the rules are `state::trials`').

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{BadCommand, ControlResponse, ControlState, JobId};

/// A trial's run reported the search's metric at `resource` (its rank 0's
/// `ringleader-report` line); the searcher decides at once whether the trial goes on,
/// pauses at its rung, is promoted, or stops.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialReport {
    /// The run job.
    pub id: JobId,
    /// The generation that reported it.
    pub generation: u32,
    /// Resource done (epochs).
    pub resource: u32,
    /// The metric's value; finite.
    #[serde(with = "super::finite_or_null")]
    pub value: f64,
}

impl Command for TrialReport {
    fn check(&self) -> Result<(), BadCommand> {
        if !self.value.is_finite() {
            return Err(BadCommand::NonFiniteMetric {
                name: "trial report".into(),
            });
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.trial_report(
            self.id,
            self.generation,
            self.resource,
            self.value,
            at.at_ms,
        )
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Rank {
            id: self.id,
            generation: self.generation,
            rank: Some(0),
        }
    }
}
