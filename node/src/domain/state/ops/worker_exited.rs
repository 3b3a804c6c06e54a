//! `worker_exited`: a rank's process exited. A non-zero code fails a non-elastic job's
//! attempt; the job succeeds once every rank exited 0 (an elastic train job once rank 0
//! did).

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::domain::spec::JobKind;
use crate::domain::state::trials::RunEnd;
use crate::domain::state::{
    ignored, rejected, ControlResponse, ControlState, EventKind, JobId, JobState,
};

/// A rank's process exited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerExited {
    /// The job.
    pub id: JobId,
    /// The generation the process belonged to.
    pub generation: u32,
    /// Its rank.
    pub rank: u32,
    /// Exit code (a signal death is reported as 128 + signal, as shells do).
    pub code: i32,
}

impl Command for WorkerExited {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let WorkerExited {
            id,
            generation,
            rank,
            code,
        } = *self;
        let at_ms = at.at_ms;
        let job = match state.current_attempt(id, generation) {
            Ok(job) => job,
            Err(r) => return r,
        };
        let Some(slot) = job.assignment.get(rank as usize) else {
            return rejected(format!("{id}: no rank {rank} in generation {generation}"));
        };
        let member = slot.name.clone();
        if job.exits.contains_key(&rank) {
            return ignored(format!("rank {rank} already reported"));
        }
        let what = format!("rank {rank} on {member} exited with code {code}");
        job.exits.insert(rank, code);
        job.push_event(at_ms, EventKind::WorkerExited, what.clone());
        if job.stopping.is_some() {
            // Asked to checkpoint and stop (a preemption's requeue): whatever the code, the
            // job is requeued once every rank is out.
            if job.exits.len() == job.assignment.len() {
                let how = match job.exits.values().all(|c| *c == 0) {
                    true => "checkpointed",
                    false => "stopped",
                };
                job.requeue(at_ms, how);
            }
        } else if code != 0 && !job.is_elastic() {
            job.fail_attempt(at_ms, what);
        } else if code != 0 {
            // An elastic job goes on without the rank: the chief re-forms the ring, or fails
            // the attempt when too few would remain.
        } else if rank == 0 && job.is_elastic() && job.spec.kind == JobKind::Train {
            // An elastic train rank exits 0 only when training is over, and rank 0 exits
            // after its final checkpoint is committed: the job is done, and a rank still
            // joining or lingering is stopped.
            job.finish(
                at_ms,
                JobState::Succeeded,
                EventKind::Succeeded,
                format!("rank 0 on {member} finished training"),
            );
        } else if job.exits.len() == job.assignment.len() && job.exits.values().all(|c| *c == 0) {
            let n = job.assignment.len();
            job.finish(
                at_ms,
                JobState::Succeeded,
                EventKind::Succeeded,
                format!("all {n} ranks exited 0"),
            );
        }
        let end = if code == 0 {
            RunEnd::Succeeded
        } else {
            RunEnd::CodeFailed
        };
        state.run_ended(id, end, at_ms);
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
    use crate::domain::state::ops::testing::{at, running};

    #[test]
    fn worker_exited_succeeds_the_job_when_every_rank_exited_0() {
        let (mut state, id) = running(2, 2);
        let exited = |generation, rank| WorkerExited {
            id,
            generation,
            rank,
            code: 0,
        };
        assert_eq!(
            exited(1, 0).apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert!(matches!(
            exited(1, 0).apply(&mut state, at(9)),
            ControlResponse::Ignored { .. }
        ));
        assert_eq!(state.jobs[&id].state, JobState::Running);
        assert_eq!(
            exited(1, 1).apply(&mut state, at(10)),
            ControlResponse::Applied
        );
        assert_eq!(state.jobs[&id].state, JobState::Succeeded);
        assert!(matches!(
            exited(0, 0).apply(&mut state, at(9)),
            ControlResponse::Ignored { .. }
        ));
    }
}
