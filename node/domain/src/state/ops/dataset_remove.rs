//! `dataset_remove`: a user removes a dataset's name; the registry's rules are
//! `state::datasets`'.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{datasets, BadCommand, ControlResponse, ControlState};

/// A dataset's name is removed; holders delete content no name refers to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetRemove {
    /// The name.
    pub name: String,
}

impl Command for DatasetRemove {
    fn check(&self) -> Result<(), BadCommand> {
        datasets::check_name(&self.name).map_err(BadCommand::DatasetName)
    }

    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.dataset_remove(&self.name)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "dataset-remove",
            admin_only: false,
        }
    }
}
