//! `token_create`: the admin makes an API token (only its hash is replicated); the rules
//! are `state::tokens`'.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{
    tokens, users::Role, BadCommand, ControlResponse, ControlState, REASON_BYTES_MAX,
};

/// The admin makes an API token (see `domain::state::tokens`): only its hash is replicated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenCreate {
    /// Its name (`tokens::check_token_name`).
    pub name: String,
    /// The BLAKE3 hash of the token, [`tokens::TOKEN_HASH_HEX_LEN`] hex digits.
    pub hash: String,
    /// Who made it, on which node (`admin@<node name>`).
    pub created_by: String,
    /// The user it belongs to (`tokens::check_user`); `None`: the token's own name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// What it may do (default `user`; see `domain::state::users`).
    #[serde(default, skip_serializing_if = "Role::is_user")]
    pub role: Role,
}

impl Command for TokenCreate {
    fn check(&self) -> Result<(), BadCommand> {
        tokens::check_token_name(&self.name).map_err(BadCommand::TokenField)?;
        tokens::check_user(self.user.as_deref().unwrap_or(&self.name), self.role)
            .map_err(BadCommand::TokenField)?;
        if !tokens::is_token_hash(&self.hash) {
            return Err(BadCommand::TokenField(
                "hash: not a BLAKE3 hash in hex".into(),
            ));
        }
        if self.created_by.len() > REASON_BYTES_MAX {
            return Err(BadCommand::TokenField("created_by: too long".into()));
        }
        Ok(())
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let (user, role) = (self.user.as_deref(), self.role);
        state.token_create(
            &self.name,
            &self.hash,
            &self.created_by,
            (user, role),
            at.at_ms,
        )
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "token-create",
            admin_only: true,
        }
    }
}
