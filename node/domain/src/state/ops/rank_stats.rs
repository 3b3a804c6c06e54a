//! `rank_stats`: a rank's step timing; it is slow since the first step its compute time
//! passed `straggler_factor` × the other ranks' median.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{rejected, BadCommand, ControlResponse, ControlState, JobId, RankStat};

/// A rank's step timing (see [`RankStat`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankStats {
    /// The job.
    pub id: JobId,
    /// The generation it runs in.
    pub generation: u32,
    /// Its rank.
    pub rank: u32,
    /// Steps done.
    pub step: u64,
    /// Compute time per step, ms; finite and non-negative.
    #[serde(with = "super::finite_or_null")]
    pub compute_ms: f64,
    /// Network wait per step, ms; finite and non-negative.
    #[serde(with = "super::finite_or_null")]
    pub wait_ms: f64,
}

impl Command for RankStats {
    fn check(&self) -> Result<(), BadCommand> {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if ok(self.compute_ms) && ok(self.wait_ms) {
            Ok(())
        } else {
            Err(BadCommand::NonFiniteMetric {
                name: "rank stats".into(),
            })
        }
    }

    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        let RankStats {
            id,
            generation,
            rank,
            step,
            compute_ms,
            wait_ms,
        } = *self;
        let job = match state.current_attempt(id, generation) {
            Ok(job) => job,
            Err(r) => return r,
        };
        if rank as usize >= job.assignment.len() {
            return rejected(format!("{id}: no rank {rank} in generation {generation}"));
        }
        let mut others: Vec<f64> = job
            .rank_stats
            .iter()
            .filter(|(r, _)| **r != rank)
            .map(|(_, s)| s.compute_ms)
            .collect();
        others.sort_by(f64::total_cmp);
        let median = others.get(others.len() / 2).copied();
        let slow = median.is_some_and(|m| compute_ms > job.spec.elastic.straggler_factor * m);
        let before = job.rank_stats.get(&rank).and_then(|s| s.slow_since_step);
        job.rank_stats.insert(
            rank,
            RankStat {
                step,
                compute_ms,
                wait_ms,
                slow_since_step: if slow {
                    Some(before.unwrap_or(step))
                } else {
                    None
                },
            },
        );
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
    fn rank_stats_marks_a_straggler_since_its_first_slow_step() {
        let (mut state, id) = running(3, 1);
        let stats = |rank, step, compute_ms, wait_ms| RankStats {
            id,
            generation: 1,
            rank,
            step,
            compute_ms,
            wait_ms,
        };
        for rank in 0..2 {
            assert_eq!(
                stats(rank, 10, 10.0, 1.0).apply(&mut state, at(9)),
                ControlResponse::Applied
            );
        }
        assert_eq!(
            stats(2, 10, 100.0, 0.0).apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert_eq!(
            stats(2, 12, 100.0, 0.0).apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert_eq!(state.jobs[&id].rank_stats[&2].slow_since_step, Some(10));
        assert_eq!(state.jobs[&id].rank_stats[&0].slow_since_step, None);
        assert!(stats(0, 1, -1.0, 0.0).check().is_err());
    }
}
