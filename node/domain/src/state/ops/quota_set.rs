//! `quota_set`: the admin sets fields of a user's (or a group's) quota; the rules are
//! `state::quotas`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{quotas, BadCommand, ControlResponse, ControlState};

/// The admin sets a user's (or `@GROUP`'s) quota: the fields `quota` gives replace the
/// record's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaSet {
    /// The user, or `@GROUP`.
    pub user: String,
    /// The fields to set.
    pub quota: quotas::Quota,
}

impl Command for QuotaSet {
    fn check(&self) -> Result<(), BadCommand> {
        quotas::check_quota_name(&self.user).map_err(BadCommand::QuotaField)?;
        self.quota.check().map_err(BadCommand::QuotaField)
    }

    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.quota_set(&self.user, &self.quota)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "quota-set",
            admin_only: true,
        }
    }
}
