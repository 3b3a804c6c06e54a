//! `standby_ready`: a standby rank printed `ringleader-ready` (reported by its node); the
//! rules are `state::standby`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{ControlResponse, ControlState, JobId};

/// A standby rank printed `ringleader-ready` (reported by its node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StandbyReady {
    /// The job.
    pub id: JobId,
    /// The standby's worker id.
    pub worker: u32,
}

impl Command for StandbyReady {
    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.standby_ready(self.id, self.worker)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Standby {
            id: self.id,
            worker: self.worker,
        }
    }
}
