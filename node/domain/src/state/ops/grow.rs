//! `grow`: the admin (or the scheduler) lets a running elastic ring grow again up to
//! `to_workers`; the chief re-forms it with joiners (see `state::preempt`).

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{BadCommand, ControlResponse, ControlState, JobId, REASON_BYTES_MAX};

/// A shrunk ring may grow again, up to `to_workers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grow {
    /// The job.
    pub id: JobId,
    /// The ring's size to grow to (at most `max_workers`).
    pub to_workers: u32,
    /// Why (`capacity returned`).
    pub reason: String,
}

impl Command for Grow {
    fn check(&self) -> Result<(), BadCommand> {
        if self.reason.len() > REASON_BYTES_MAX {
            return Err(BadCommand::Reason);
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.grow(self.id, self.to_workers, &self.reason)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "grow",
            admin_only: true,
        }
    }
}
