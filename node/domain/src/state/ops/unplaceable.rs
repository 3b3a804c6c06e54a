//! `unplaceable`: why a pending job (or a running search's next trials) waits; the same
//! reason twice is one event. An empty reason for a running search clears its reason (its
//! trials no longer wait).

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{
    ignored, truncate_at_char, unknown, ControlResponse, ControlState, EventKind, JobId, JobState,
    REASON_BYTES_MAX,
};

/// The chief could not place a pending job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unplaceable {
    /// The job.
    pub id: JobId,
    /// Why, for humans (empty, for a running search: its trials no longer wait).
    pub reason: String,
    /// Only the job's `pending_reason` changes, with no history event: the scheduler's
    /// later reasons for a job (its place in a moving queue), not a new kind of wait.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiet: bool,
}

impl Command for Unplaceable {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let id = self.id;
        let Some(job) = state.jobs.get_mut(&id) else {
            return unknown(id);
        };
        let running_search = job.search.is_some() && job.state == JobState::Running;
        if job.state != JobState::Pending && !running_search {
            return ignored(format!("{id} is {}, not pending", job.state));
        }
        if running_search && self.reason.is_empty() {
            // Its trials no longer wait.
            return match job.pending_reason.take() {
                Some(_) => ControlResponse::Applied,
                None => ignored("no reason to clear".to_owned()),
            };
        }
        let mut reason = self.reason.clone();
        truncate_at_char(&mut reason, REASON_BYTES_MAX);
        if job.pending_reason.as_ref() == Some(&reason) {
            return ignored("same reason as before".to_owned());
        }
        job.pending_reason = Some(reason.clone());
        if !self.quiet {
            job.push_event(at.at_ms, EventKind::Unplaceable, reason);
        }
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, pending};

    #[test]
    fn unplaceable_records_a_reason_once() {
        let (mut state, id) = pending(1, 1);
        let unplaceable = Unplaceable {
            id,
            reason: "no room".into(),
            quiet: false,
        };
        assert_eq!(
            unplaceable.apply(&mut state, at(7)),
            ControlResponse::Applied
        );
        assert!(matches!(
            unplaceable.apply(&mut state, at(8)),
            ControlResponse::Ignored { .. }
        ));
        assert_eq!(state.jobs[&id].pending_reason.as_deref(), Some("no room"));
    }
}
