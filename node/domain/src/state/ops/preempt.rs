//! `preempt`: the whole of one job's preemption from one entry (see `state::preempt`, which
//! decides the entries and holds the rules it applies): a shrink's next generation, or a
//! requeue's request to checkpoint and stop.

use super::{Command, Origin, Stamp};
/// The entry's struct lives with the rules that make and apply it (`state::preempt`).
pub use crate::state::preempt::PreemptEntry as Preempt;
use crate::state::{
    preempt::PreemptAction, BadCommand, ControlResponse, ControlState, REASON_BYTES_MAX,
    RING_SECRET_HEX_LEN,
};

impl Command for Preempt {
    fn check(&self) -> Result<(), BadCommand> {
        if self.why.len() > REASON_BYTES_MAX {
            return Err(BadCommand::Reason);
        }
        if let PreemptAction::Shrink { .. } = self.action {
            let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
            if self.secret.len() != RING_SECRET_HEX_LEN || !self.secret.chars().all(hex) {
                return Err(BadCommand::Secret);
            }
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.preempt(self, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "preempt",
            admin_only: true,
        }
    }
}
