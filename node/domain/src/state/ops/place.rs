//! `place`: the chief starts a pending job's next generation on its slots (the job's
//! first attempt, or a retry).

use serde::{Deserialize, Serialize};

use super::{check_slots, Command, Origin, Stamp};
use crate::state::{
    ignored, rejected, BadCommand, ControlResponse, ControlState, JobId, JobState, Slot,
};

/// The chief placed generation `generation` (must be the job's next generation) on `slots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Place {
    /// The job.
    pub id: JobId,
    /// The generation being started: the job's current generation + 1.
    pub generation: u32,
    /// Workers in rank order (`slots[i].rank == i`).
    pub slots: Vec<Slot>,
    /// The data-plane secret of this generation (see [`Job::ring_secret`](crate::state::Job::ring_secret)): 32 random bytes
    /// as [`RING_SECRET_HEX_LEN`](crate::state::RING_SECRET_HEX_LEN) lowercase hex digits, drawn by the chief.
    #[serde(default)]
    pub secret: String,
}

impl Command for Place {
    fn check(&self) -> Result<(), BadCommand> {
        check_slots(&self.slots, &self.secret)
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let Place {
            id,
            generation,
            slots,
            secret,
        } = self;
        if let Some(reason) = state.gpu_taken(Some(*id), slots) {
            return ignored(reason);
        }
        let job = match state.next_generation(
            *id,
            *generation,
            JobState::Pending,
            "placement for",
            rejected,
        ) {
            Ok(job) => job,
            Err(r) => return r,
        };
        let why = if job.generation == 0 {
            "start"
        } else {
            "retry"
        };
        job.place(slots, secret, at.at_ms, why);
        state.run_placed(*id, slots, at.at_ms);
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, pending, secret, slots};

    fn place(id: JobId, generation: u32, n: u32) -> Place {
        Place {
            id,
            generation,
            slots: slots(n),
            secret: secret(),
        }
    }

    #[test]
    fn place_starts_the_next_generation_of_a_pending_job_only() {
        let (mut state, id) = pending(2, 2);
        assert!(matches!(
            place(id, 2, 2).apply(&mut state, at(6)),
            ControlResponse::Rejected { reason } if reason.contains("placement for generation 2, expected 1")
        ));
        assert_eq!(
            place(id, 1, 2).apply(&mut state, at(6)),
            ControlResponse::Applied
        );
        assert_eq!(state.jobs[&id].state, JobState::Running);
        assert!(matches!(
            place(id, 2, 2).apply(&mut state, at(7)),
            ControlResponse::Rejected { reason } if reason.contains("is running, not pending")
        ));
        let unknown = JobId::from_log_index(99);
        assert!(matches!(
            place(unknown, 1, 1).apply(&mut state, at(7)),
            ControlResponse::Rejected { .. }
        ));
    }

    #[test]
    fn slots_must_be_ranks_in_order_with_a_secret() {
        let mut bad = place(JobId::from_log_index(1), 1, 2);
        bad.slots.swap(0, 1);
        assert_eq!(bad.check(), Err(BadCommand::Slots));
        let mut bad = place(JobId::from_log_index(1), 1, 2);
        bad.secret = "AB".repeat(32);
        assert_eq!(bad.check(), Err(BadCommand::Secret));
        assert_eq!(place(JobId::from_log_index(1), 1, 2).check(), Ok(()));
    }
}
