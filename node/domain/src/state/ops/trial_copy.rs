//! `trial_copy`: the chief starts a speculative copy of a slow running trial (its job id
//! from the entry's log index); the rules are `state::trials`'.

use serde::{Deserialize, Serialize};

use super::{check_slots, Command, Origin, Stamp};
use crate::state::{ignored, BadCommand, ControlResponse, ControlState, JobId, Slot};

/// The chief starts a speculative copy of a slow running trial on `slots` (another
/// member); the first of the two to finish wins and the other is stopped. The copy's
/// job id comes from this entry's log index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialCopy {
    /// The search job.
    pub search: JobId,
    /// The trial.
    pub trial: u32,
    /// Where the copy runs, in rank order.
    pub slots: Vec<Slot>,
    /// The data-plane secret (as in `Place`).
    pub secret: String,
}

impl Command for TrialCopy {
    fn check(&self) -> Result<(), BadCommand> {
        check_slots(&self.slots, &self.secret)
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        if let Some(reason) = state.gpu_taken(None, &self.slots) {
            return ignored(reason);
        }
        state.trial_copy(
            at.log_index,
            self.search,
            self.trial,
            &self.slots,
            &self.secret,
            at.at_ms,
        )
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}
