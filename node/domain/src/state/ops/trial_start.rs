//! `trial_start`: the chief starts a search's next trial as a job of its own (its id from
//! the entry's log index); the rules are `state::trials`'.

use serde::{Deserialize, Serialize};

use ringleader_spec::search::Params;

use super::{check_slots, Command, Origin, Stamp};
use crate::state::{ignored, trials, BadCommand, ControlResponse, ControlState, JobId, Slot};

/// The chief starts a search's next trial (`trial` = the number of trials so far) with
/// `params`, as a job of its own placed on `slots`; the job's id comes from this entry's
/// log index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialStart {
    /// The search job.
    pub search: JobId,
    /// The new trial's id.
    pub trial: u32,
    /// Its parameters.
    pub params: Params,
    /// Its Hyperband bracket (0 otherwise).
    pub bracket: u32,
    /// The resource its first run trains to (0: the trial spec's own length).
    pub target: u32,
    /// Where its job runs, in rank order.
    pub slots: Vec<Slot>,
    /// The data-plane secret of its ring (as in `Place`).
    pub secret: String,
}

impl Command for TrialStart {
    fn check(&self) -> Result<(), BadCommand> {
        check_slots(&self.slots, &self.secret)
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        if let Some(reason) = state.gpu_taken(None, &self.slots) {
            return ignored(reason);
        }
        let new = trials::NewTrial {
            trial: self.trial,
            params: &self.params,
            bracket: self.bracket,
            target: self.target,
        };
        state.trial_start(
            at.log_index,
            self.search,
            new,
            &self.slots,
            &self.secret,
            at.at_ms,
        )
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}
