//! `standby`: the chief starts a joiner of a running elastic command job of protocol
//! "ringleader" ahead of the re-form that takes it in; the rules are `state::standby`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::spec::GPUS_PER_WORKER_MAX;
use crate::state::{BadCommand, ControlResponse, ControlState, JobId, Slot};

/// The chief starts a joiner of a running elastic command job of protocol
/// "ringleader" ahead of the re-form that takes it in (see [`state::standby`](crate::state::standby)).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standby {
    /// The job.
    pub id: JobId,
    /// The generation it was decided in (a later one makes it stale).
    pub generation: u32,
    /// Where it runs; `worker` is the attempt's next worker id.
    pub slot: Slot,
}

impl Command for Standby {
    fn check(&self) -> Result<(), BadCommand> {
        if self.slot.gpus.len() > GPUS_PER_WORKER_MAX as usize {
            return Err(BadCommand::Gpus);
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.standby(self.id, self.generation, &self.slot, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}
