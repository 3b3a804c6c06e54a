//! `standby_dropped`: a standby will not join (its process exited or stayed silent, or its
//! member is gone); the rules are `state::standby`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{ControlResponse, ControlState, JobId};

/// A standby will not join: its process exited or stayed silent, or its member is
/// gone (reported by its node or decided by the chief).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StandbyDropped {
    /// The job.
    pub id: JobId,
    /// The standby's worker id.
    pub worker: u32,
    /// Why (cut to [`REASON_BYTES_MAX`](crate::state::REASON_BYTES_MAX) in the history).
    pub reason: String,
}

impl Command for StandbyDropped {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.standby_dropped(self.id, self.worker, &self.reason, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Standby {
            id: self.id,
            worker: self.worker,
        }
    }
}
