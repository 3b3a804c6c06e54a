//! `worker_exited`: a rank's process exited. A non-zero code fails a non-elastic job's
//! attempt; the job succeeds once every rank exited 0 (an elastic train job once rank 0
//! did).

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::spec::JobKind;
use crate::state::failure::{Failure, RankEnd};
use crate::state::trials::RunEnd;
use crate::state::{ignored, rejected, ControlResponse, ControlState, EventKind, JobId, JobState};

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
    /// A failed rank's end as its node saw it: the signal, its stderr's last lines, why it
    /// could not start (none from a node that sends no detail, or for code 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<RankEnd>,
}

impl Command for WorkerExited {
    fn apply(&self, state: &mut ControlState, at: Stamp) -> ControlResponse {
        let WorkerExited {
            id,
            generation,
            rank,
            code,
            ref end,
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
        let failure = (code != 0 && job.stopping.is_none())
            .then(|| Failure::of_rank(job.attempt, rank, &member, code, end.as_ref()));
        let what = match &failure {
            Some(Failure {
                start_error: Some(e),
                ..
            }) => format!("rank {rank} on {member} could not start: {e}"),
            Some(Failure {
                stderr_tail: tail, ..
            }) if !tail.is_empty() => format!(
                "rank {rank} on {member} exited with code {code}: {}",
                tail.last().expect("not empty")
            ),
            _ => format!("rank {rank} on {member} exited with code {code}"),
        };
        job.exits.insert(rank, code);
        job.push_event(at_ms, EventKind::WorkerExited, what.clone());
        if let Some(failure) = failure {
            job.note_failure(failure);
        }
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
    use crate::state::ops::testing::{at, running};

    #[test]
    fn worker_exited_succeeds_the_job_when_every_rank_exited_0() {
        let (mut state, id) = running(2, 2);
        let exited = |generation, rank| WorkerExited {
            id,
            generation,
            rank,
            code: 0,
            end: None,
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

    /// Places the next attempt of pending job `id` on one member.
    fn retry(state: &mut ControlState, id: JobId) {
        let generation = state.jobs[&id].generation + 1;
        let place = crate::state::ops::Place {
            id,
            generation,
            slots: crate::state::ops::testing::slots(1),
            secret: crate::state::ops::testing::secret(),
        };
        assert_eq!(place.apply(state, at(20)), ControlResponse::Applied);
    }

    #[test]
    fn a_failure_repeated_identically_on_the_retry_is_not_retried_again() {
        let (mut state, id) = running(1, 1);
        state.jobs.get_mut(&id).unwrap().max_restarts = 5;
        let failed = |generation, last: &str| WorkerExited {
            id,
            generation,
            rank: 0,
            code: 1,
            end: Some(RankEnd {
                stderr_tail: vec!["Traceback …".into(), last.into()],
                ..RankEnd::default()
            }),
        };
        let missing = "ModuleNotFoundError: No module named 'foo'";
        // Attempt 1 fails: retried, its cause recorded.
        failed(1, missing).apply(&mut state, at(10));
        let job = &state.jobs[&id];
        assert_eq!(job.state, JobState::Pending);
        let cause = job.failure().unwrap();
        assert_eq!(cause.headline(), format!("rank 0 on m0: exit 1: {missing}"));
        assert_eq!(cause.stderr_tail.len(), 2);
        assert_eq!(
            job.events.last().unwrap().reason,
            format!("rank 0 on m0 exited with code 1: {missing}; retrying (restart 1 of 5)")
        );
        // Attempt 2 fails otherwise: retried again.
        retry(&mut state, id);
        failed(2, "MemoryError").apply(&mut state, at(30));
        assert_eq!(state.jobs[&id].state, JobState::Pending);
        // Attempt 3 fails as attempt 2 did: failed, with 3 of 5 restarts left.
        retry(&mut state, id);
        failed(3, "MemoryError").apply(&mut state, at(40));
        let job = &state.jobs[&id];
        assert_eq!((job.state, job.attempt), (JobState::Failed, 3));
        assert!(
            job.events
                .last()
                .unwrap()
                .reason
                .ends_with("; not retried: the same failure twice (exit 1: MemoryError)"),
            "{:?}",
            job.events.last()
        );
        assert_eq!(job.failures.len(), 2, "bounded");
    }

    #[test]
    fn the_same_start_error_twice_is_not_retried_again() {
        let (mut state, id) = running(1, 1);
        state.jobs.get_mut(&id).unwrap().max_restarts = 3;
        let cannot = |generation| WorkerExited {
            id,
            generation,
            rank: 0,
            code: 127,
            end: Some(RankEnd {
                start_error: Some("program \"x\" not found on this node".into()),
                ..RankEnd::default()
            }),
        };
        cannot(1).apply(&mut state, at(10));
        assert_eq!(
            state.jobs[&id].events[state.jobs[&id].events.len() - 2].reason,
            "rank 0 on m0 could not start: program \"x\" not found on this node"
        );
        retry(&mut state, id);
        cannot(2).apply(&mut state, at(30));
        let job = &state.jobs[&id];
        assert_eq!(job.state, JobState::Failed);
        assert!(job
            .events
            .last()
            .unwrap()
            .reason
            .ends_with("(could not start: program \"x\" not found on this node)"));
    }
}
