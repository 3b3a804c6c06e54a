//! `preempt`: the whole of one job's preemption from one entry (see `state::preempt`, which
//! decides the entries and holds the rules it applies): a shrink's next generation, or a
//! requeue's request to checkpoint and stop.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::domain::state::{
    preempt::{Entry, PreemptAction},
    BadCommand, ControlResponse, ControlState, JobId, REASON_BYTES_MAX, RING_SECRET_HEX_LEN,
};

/// A preemption of one job, whole: a shrink's new generation, or a requeue's request to
/// checkpoint and stop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preempt {
    /// The job.
    pub id: JobId,
    /// The generation it was decided in (a later one makes it stale: ignored).
    pub generation: u32,
    /// What it gives up (`shrink` or `requeue`; a pause is a requeue of each trial).
    pub action: PreemptAction,
    /// The job the capacity is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_job: Option<JobId>,
    /// The history's line start: `preempted for j-12`.
    pub why: String,
    /// A shrink: the workers (ids) that leave the ring.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drop_workers: Vec<u32>,
    /// A shrink: the new generation's data-plane secret (as in `Place`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
}

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
        let entry = Entry {
            id: self.id,
            generation: self.generation,
            action: self.action,
            for_job: self.for_job,
            why: &self.why,
            drop_workers: &self.drop_workers,
            secret: &self.secret,
        };
        state.preempt(entry, at.at_ms)
    }

    fn origin(&self) -> Origin<'_> {
        Origin::User {
            command: "preempt",
            admin_only: true,
        }
    }
}
