//! `compact`: the chief drops ended jobs past the retention from the live state; the rules
//! are `state::compaction`'s.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{ControlResponse, ControlState, JobId};

/// The chief drops ended jobs past the retention from the live state (see
/// `domain::state::compaction`); their records stay in storage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compact {
    /// The jobs (at most `compaction::COMPACT_IDS_MAX`).
    pub ids: Vec<JobId>,
}

impl Command for Compact {
    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.compact(&self.ids)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}
