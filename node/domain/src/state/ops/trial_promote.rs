//! `trial_promote`: the chief promotes a paused trial to its next rung; the rules are
//! `state::trials`'.

use serde::{Deserialize, Serialize};

use super::{check_slots, Command, Origin, Stamp};
use crate::state::{ignored, BadCommand, ControlResponse, ControlState, JobId, Slot};

/// The chief promotes a paused trial to `target` (ASHA's promotion of a trial that
/// waited at its rung): its job runs again on `slots`, resuming from its checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialPromote {
    /// The search job.
    pub search: JobId,
    /// The trial.
    pub trial: u32,
    /// The next rung's resource.
    pub target: u32,
    /// Where it runs, in rank order.
    pub slots: Vec<Slot>,
    /// The data-plane secret (as in `Place`).
    pub secret: String,
}

impl Command for TrialPromote {
    fn check(&self) -> Result<(), BadCommand> {
        check_slots(&self.slots, &self.secret)
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        if let Some(reason) = state.gpu_taken(None, &self.slots) {
            return ignored(reason);
        }
        state.trial_promote(
            self.search,
            self.trial,
            self.target,
            &self.slots,
            &self.secret,
            at.at_ms,
        )
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}
