//! `search_finished`: the chief ends a search; the rules are `state::trials`'.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{ControlResponse, ControlState, JobId};

/// The chief ends a search: no trial runs and none will start; paused trials are
/// stopped and the best is recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchFinished {
    /// The search job.
    pub search: JobId,
}

impl Command for SearchFinished {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.search_finished(self.search, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}
