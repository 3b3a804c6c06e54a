//! `member_remove`: the admin removes a member from the cluster for good; the rules are
//! `state::removal`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{removal, BadCommand, ControlResponse, ControlState, REASON_BYTES_MAX};

/// The admin removes a member from the cluster for good (see `domain::state::removal`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberRemove {
    /// Its peer id.
    pub peer_id: String,
    /// Its name, for humans.
    pub name: String,
}

impl Command for MemberRemove {
    fn check(&self) -> Result<(), BadCommand> {
        let parses = self.peer_id.len() <= removal::PEER_ID_BYTES_MAX
            && self.peer_id.parse::<libp2p::PeerId>().is_ok();
        if !parses || self.name.len() > REASON_BYTES_MAX {
            return Err(BadCommand::PeerId(self.peer_id.chars().take(64).collect()));
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        state.member_remove(&self.peer_id, &self.name, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "member-remove",
            admin_only: true,
        }
    }
}
