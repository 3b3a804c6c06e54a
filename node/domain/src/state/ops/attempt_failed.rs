//! `attempt_failed`: the chief fails the current attempt as a whole (a worker's node died,
//! too few ranks remain for an elastic job, …); it is retried from durable state while
//! restarts last.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{trials::RunEnd, ControlResponse, ControlState, JobId};

/// The attempt of this generation failed as a whole (a worker's node died, too few
/// ranks remain for an elastic job, …): it is retried from durable state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptFailed {
    /// The job.
    pub id: JobId,
    /// The generation that failed.
    pub generation: u32,
    /// Why, for humans.
    pub reason: String,
}

impl Command for AttemptFailed {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        match state.current_attempt(self.id, self.generation) {
            Ok(job) => {
                job.fail_attempt(at.at_ms, self.reason.clone());
                state.run_ended(self.id, RunEnd::Lost, at.at_ms);
                ControlResponse::Applied
            }
            Err(r) => r,
        }
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, running};
    use crate::state::JobState;

    #[test]
    fn attempt_failed_fails_the_current_attempt_only() {
        let (mut state, id) = running(1, 1);
        let failed = |generation, reason: &str| AttemptFailed {
            id,
            generation,
            reason: reason.into(),
        };
        assert!(matches!(
            failed(2, "x").apply(&mut state, at(9)),
            ControlResponse::Ignored { .. }
        ));
        assert_eq!(
            failed(1, "lost m0").apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        // Retried from durable state: pending again (the default spec keeps restarts).
        assert_eq!(state.jobs[&id].state, JobState::Pending);
        assert!(matches!(
            failed(1, "again").apply(&mut state, at(10)),
            ControlResponse::Ignored { .. }
        ));
    }
}
