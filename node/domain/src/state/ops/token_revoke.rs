//! `token_revoke`: the admin revokes an API token; the rules are `state::tokens`'.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{tokens, BadCommand, ControlResponse, ControlState};

/// The admin revokes an API token: its hash leaves the state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRevoke {
    /// Its name.
    pub name: String,
}

impl Command for TokenRevoke {
    fn check(&self) -> Result<(), BadCommand> {
        tokens::check_token_name(&self.name).map_err(BadCommand::TokenField)
    }

    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.token_revoke(&self.name)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "token-revoke",
            admin_only: true,
        }
    }
}
