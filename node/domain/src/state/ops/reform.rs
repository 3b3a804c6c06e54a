//! `reform`: the chief re-forms a running elastic job's ring as its next generation inside
//! the same attempt (within `min_workers..=max_workers`), without lost, hung or straggling
//! members, or with one that joined. Uses up no restart.

use serde::{Deserialize, Serialize};

use super::{check_slots, Command, Origin, Stamp};
use crate::state::{
    ignored, rejected, BadCommand, ControlResponse, ControlState, EventKind, JobId, JobState, Slot,
};

/// The chief re-formed a running elastic job's ring as generation `generation` (the
/// job's current generation + 1) inside the same attempt: without lost, hung or
/// straggling members, or with one that joined. Uses up no restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reform {
    /// The job.
    pub id: JobId,
    /// The job's current generation + 1.
    pub generation: u32,
    /// Workers in rank order (`slots[i].rank == i`); survivors keep their `worker`.
    pub slots: Vec<Slot>,
    /// The new generation's data-plane secret (as in `Place`).
    pub secret: String,
    /// Why (`peer-lost <member> (rank r)`, `hung …`, `straggler …`, `joined …`).
    pub reason: String,
}

impl Command for Reform {
    fn check(&self) -> Result<(), BadCommand> {
        check_slots(&self.slots, &self.secret)
    }

    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let Reform {
            id,
            generation,
            ref slots,
            ref secret,
            ref reason,
        } = *self;
        if let Some(reason) = state.gpu_taken(Some(id), slots) {
            return ignored(reason);
        }
        let job =
            match state.next_generation(id, generation, JobState::Running, "re-form as", ignored) {
                Ok(job) => job,
                Err(r) => return r,
            };
        let n = slots.len() as u32;
        if !job.is_elastic() || n < job.spec.min_workers || n > job.spec.max_workers {
            return rejected(format!(
                "{id}: a ring of {n} is outside {}..={} or the job is not elastic",
                job.spec.min_workers, job.spec.max_workers
            ));
        }
        if job.stopping.is_some() {
            return ignored(format!("{id} is checkpointing to be requeued"));
        }
        job.start_generation(generation, slots, secret, at.at_ms);
        job.preemption_after_reform();
        job.push_ring_event(at.at_ms, EventKind::Reformed, reason.to_owned());
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Chief
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, pending, running, secret, slots};

    fn reform(id: JobId, generation: u32, n: u32) -> Reform {
        Reform {
            id,
            generation,
            slots: slots(n),
            secret: secret(),
            reason: "lost".into(),
        }
    }

    #[test]
    fn reform_is_ignored_on_a_stale_view_and_refused_outside_the_bounds() {
        let (mut state, id) = running(3, 2);
        // The guard Place shares: a re-form decided on an old view is ignored, not refused.
        assert!(matches!(
            reform(id, 3, 2).apply(&mut state, at(8)),
            ControlResponse::Ignored { reason } if reason.contains("re-form as generation 3, expected 2")
        ));
        assert!(matches!(
            reform(id, 2, 1).apply(&mut state, at(8)),
            ControlResponse::Rejected { .. }
        ));
        assert_eq!(
            reform(id, 2, 2).apply(&mut state, at(8)),
            ControlResponse::Applied
        );
        assert_eq!(state.jobs[&id].generation, 2);
        let (mut fixed, id) = running(2, 2);
        assert!(matches!(
            reform(id, 2, 2).apply(&mut fixed, at(8)),
            ControlResponse::Rejected { .. }
        ));
        let (mut waiting, id) = pending(2, 1);
        assert!(matches!(
            reform(id, 1, 2).apply(&mut waiting, at(8)),
            ControlResponse::Ignored { reason } if reason.contains("is pending, not running")
        ));
    }
}
