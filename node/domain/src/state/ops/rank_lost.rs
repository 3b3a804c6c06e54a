//! `rank_lost`: a rank of the current generation is suspect although its member lives (a
//! peer's collective lost its connection, or its own node saw its process stopped); the
//! chief re-forms without it or fails the attempt. Its own node's word that it hangs
//! outranks a peer's.

use serde::{Deserialize, Serialize};

use super::{Command, Origin, Stamp};
use crate::state::{
    rejected, truncate_at_char, ControlResponse, ControlState, JobId, Suspect, REASON_BYTES_MAX,
};

/// A rank is lost although its member lives: a peer's collective lost its connection
/// (reported by that peer's node), or its own node saw its process stopped (`hung`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankLost {
    /// The job.
    pub id: JobId,
    /// The generation it was lost in.
    pub generation: u32,
    /// The lost rank.
    pub rank: u32,
    /// Its process lives but makes no progress.
    #[serde(default)]
    pub hung: bool,
    /// What the reporting rank saw.
    pub reason: String,
}

impl Command for RankLost {
    fn apply(&self, state: &mut ControlState, _at: Stamp) -> ControlResponse {
        let RankLost {
            id,
            generation,
            rank,
            hung,
            ref reason,
        } = *self;
        let job = match state.current_attempt(id, generation) {
            Ok(job) => job,
            Err(r) => return r,
        };
        if rank as usize >= job.assignment.len() {
            return rejected(format!("{id}: no rank {rank} in generation {generation}"));
        }
        let mut reason = reason.to_owned();
        truncate_at_char(&mut reason, REASON_BYTES_MAX);
        let suspect = job.suspects.entry(rank).or_insert(Suspect {
            hung,
            reason: reason.clone(),
        });
        // Its own node's word that it hangs outranks a peer's broken connection.
        if hung && !suspect.hung {
            *suspect = Suspect { hung: true, reason };
        }
        ControlResponse::Applied
    }

    fn origin(&self) -> Origin<'_> {
        Origin::Rank {
            id: self.id,
            generation: self.generation,
            rank: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::ops::testing::{at, running};

    #[test]
    fn rank_lost_lets_a_hang_outrank_a_broken_connection() {
        let (mut state, id) = running(2, 1);
        let lost = |rank, hung, reason: &str| RankLost {
            id,
            generation: 1,
            rank,
            hung,
            reason: reason.into(),
        };
        assert_eq!(
            lost(1, false, "peer lost it").apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert_eq!(
            lost(1, true, "stopped").apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert_eq!(
            lost(1, false, "again").apply(&mut state, at(9)),
            ControlResponse::Applied
        );
        assert!(state.jobs[&id].suspects[&1].hung);
        assert!(matches!(
            lost(5, true, "x").apply(&mut state, at(9)),
            ControlResponse::Rejected { .. }
        ));
    }
}
