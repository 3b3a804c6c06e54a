//! `dataset_add`: a user registers a dataset under a new name; the registry's rules are
//! `state::datasets`'.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{datasets, BadCommand, ControlResponse, ControlState, DatasetRecord};

/// A dataset is registered under `name` (refused if the name exists).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetAdd {
    /// Its name (`datasets::check_name`).
    pub name: String,
    /// What it names.
    pub record: DatasetRecord,
}

impl Command for DatasetAdd {
    fn check(&self) -> Result<(), BadCommand> {
        datasets::check_name(&self.name).map_err(BadCommand::DatasetName)
    }

    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        state.dataset_add(&self.name, &self.record)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "dataset-add",
            admin_only: false,
        }
    }
}
