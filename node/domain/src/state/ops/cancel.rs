//! `cancel`: a user cancels a job that has not ended.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::trials::RunEnd;
use crate::state::{rejected, unknown, ControlResponse, ControlState, EventKind, JobId, JobState};

/// A user cancels a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cancel {
    /// The job.
    pub id: JobId,
}

impl Command for Cancel {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let id = self.id;
        let Some(job) = state.jobs.get_mut(&id) else {
            return unknown(id);
        };
        if job.state.is_terminal() {
            return rejected(format!("{id} already {}", job.state));
        }
        let was = job.state;
        job.finish(
            at.at_ms,
            JobState::Cancelled,
            EventKind::Cancelled,
            format!("cancelled by user while {was}"),
        );
        state.search_cancelled(id, at.at_ms);
        state.run_ended(id, RunEnd::Cancelled, at.at_ms);
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "cancel",
            admin_only: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, running};

    #[test]
    fn cancel_ends_a_job_that_has_not_ended() {
        let (mut state, id) = running(1, 1);
        assert_eq!(
            Cancel { id }.apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert_eq!(state.jobs[&id].state, JobState::Cancelled);
        assert!(matches!(
            Cancel { id }.apply(&mut state, at(10)),
            ControlResponse::Rejected { .. }
        ));
    }
}
