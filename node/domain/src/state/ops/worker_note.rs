//! `worker_note`: a rank's note in its job's history (its dataset was fetched, say); a rank
//! that could not start its program marks its member for the next attempt to avoid.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{
    truncate_at_char, ControlResponse, ControlState, EventKind, JobId, REASON_BYTES_MAX,
};

/// A rank says something worth the job's history (its dataset was fetched, say).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerNote {
    /// The job.
    pub id: JobId,
    /// The rank's generation.
    pub generation: u32,
    /// The rank.
    pub rank: u32,
    /// What happened (cut to [`REASON_BYTES_MAX`]).
    pub message: String,
    /// The rank's program could not start on its member (missing, not executable): the
    /// job's next attempt avoids that member when it can ([`Job::cannot_start`](crate::state::Job::cannot_start)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cannot_start: bool,
}

impl Command for WorkerNote {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let WorkerNote {
            id,
            generation,
            rank,
            ref message,
            cannot_start,
        } = *self;
        let job = match state.current_attempt(id, generation) {
            Ok(job) => job,
            Err(r) => return r,
        };
        let slot = job.assignment.get(rank as usize);
        let mut message = match slot.filter(|_| cannot_start) {
            Some(slot) => {
                job.cannot_start.insert(slot.member.clone());
                format!("rank {rank} could not start on {}: {message}", slot.name)
            }
            None => format!("rank {rank}: {message}"),
        };
        truncate_at_char(&mut message, REASON_BYTES_MAX);
        job.push_event(at.at_ms, EventKind::Note, message);
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Rank {
            id: self.id,
            generation: self.generation,
            rank: Some(self.rank),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, running};

    #[test]
    fn worker_note_of_a_rank_that_could_not_start_marks_its_member() {
        let (mut state, id) = running(2, 2);
        let note = |rank, message: &str, cannot_start| WorkerNote {
            id,
            generation: 1,
            rank,
            message: message.into(),
            cannot_start,
        };
        assert_eq!(
            note(0, "fetched", false).apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert!(state.jobs[&id].cannot_start.is_empty());
        assert_eq!(
            note(1, "no such file", true).apply(&mut state, at(10)),
            ControlResponse::Applied
        );
        assert!(state.jobs[&id].cannot_start.contains("id-1"));
    }
}
