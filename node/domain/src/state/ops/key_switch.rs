//! `key_switch`: the admin's key rotation, every member switching to the key it was
//! offered with this fingerprint; the rules are `state::key_epoch`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{key_epoch, BadCommand, ControlResponse, ControlState};

/// The admin's key rotation: every member switches to the key it was offered with this
/// fingerprint (see `domain::state::key_epoch`; the key itself is never in the log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeySwitch {
    /// The epoch the key enters: the current one + 1.
    pub epoch: u64,
    /// The new key's public fingerprint.
    pub fingerprint: String,
}

impl Command for KeySwitch {
    fn check(&self) -> Result<(), BadCommand> {
        key_epoch::check_fingerprint(&self.fingerprint).map_err(BadCommand::KeySwitch)?;
        if self.epoch == 0 {
            return Err(BadCommand::KeySwitch("key switch: epoch 0".into()));
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.key_switch(self.epoch, &self.fingerprint, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "key-rotate",
            admin_only: true,
        }
    }
}
