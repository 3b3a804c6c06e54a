//! Who may propose a command: a command's origin rule, asked by the control layer of a
//! command a member forwards to the chief. A member forwards what its users and its own
//! ranks produce; what only the chief decides (placements, failed attempts, searches) is
//! never accepted from the wire: the chief proposes those to its own Raft.

use crate::spec::JobSpec;
use crate::state::{ControlState, JobId};

/// Who may propose a command (see [`Command::origin`](super::Command::origin)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Origin<'a> {
    /// A user's request through any member's API; `command` names it in the audit log.
    /// Token and member changes and key rotations are the admin's alone (`admin_only`).
    User {
        /// Its name (`cancel`, `dataset-add`, …).
        command: &'static str,
        /// Only the admin token may ask for it.
        admin_only: bool,
    },
    /// A user's submit: the chief admits its spec again, exactly as the API admits one
    /// (the control layer's admission function).
    Submit(&'a JobSpec),
    /// A rank's report: only from the member that runs rank `rank` (any rank when `None`)
    /// of job `id` in its generation `generation`.
    Rank {
        /// The job.
        id: JobId,
        /// The generation the report belongs to.
        generation: u32,
        /// The reporting rank, when the rule names one.
        rank: Option<u32>,
    },
    /// A standby's report: only from the member its standby `worker` runs on.
    Standby {
        /// The job.
        id: JobId,
        /// The standby's worker id.
        worker: u32,
    },
    /// What only the chief decides: never accepted from a peer.
    Chief,
}

impl Origin<'_> {
    /// The name of a command a user's API call originates, `None` for what nodes originate
    /// themselves (ranks' exits and metrics, the chief's decisions).
    pub fn user_command(&self) -> Option<&'static str> {
        match self {
            Origin::User { command, .. } => Some(command),
            Origin::Submit(_) => Some("submit"),
            _ => None,
        }
    }

    /// Whether only the admin token may ask for it.
    pub fn admin_only(&self) -> bool {
        matches!(
            self,
            Origin::User {
                admin_only: true,
                ..
            }
        )
    }

    /// Whether the member `from` (a peer id) may have the command committed, as `state`
    /// stands. A submit is allowed here: its rule is its admission, which the caller runs.
    pub fn allows(&self, from: &str, state: &ControlState) -> Result<(), String> {
        match *self {
            Origin::User { .. } | Origin::Submit(_) => Ok(()),
            Origin::Rank {
                id,
                generation,
                rank,
            } => {
                let job = state.job(id).ok_or_else(|| format!("no job {id}"))?;
                if job.generation != generation {
                    return Err(format!(
                        "job {id} is at generation {}, not {generation}",
                        job.generation
                    ));
                }
                let runs = job
                    .assignment
                    .iter()
                    .any(|s| s.member == from && rank.is_none_or(|r| s.rank == r));
                if runs {
                    Ok(())
                } else {
                    Err(match rank {
                        Some(r) => format!("rank {r} of job {id} does not run on the sender"),
                        None => format!("job {id} has no rank on the sender"),
                    })
                }
            }
            Origin::Standby { id, worker } => {
                let job = state.job(id).ok_or_else(|| format!("no job {id}"))?;
                match &job.standby {
                    Some(s) if s.slot.worker == worker && s.slot.member == from => Ok(()),
                    _ => Err(format!(
                        "worker {worker} of job {id} is no standby on the sender"
                    )),
                }
            }
            Origin::Chief => Err("only the chief places jobs, fails attempts and drives searches; not accepted from a peer".into()),
        }
    }

    /// Whether a command refused by [`Origin::allows`] may name what `state` has not applied
    /// yet: a later generation of a job than it holds, or a job or a standby it does not
    /// know. A report of an older generation (a stale rank's) is refused at once.
    pub fn may_be_ahead(&self, state: &ControlState) -> bool {
        let (id, generation) = match *self {
            Origin::Rank { id, generation, .. } => (id, Some(generation)),
            Origin::Standby { id, .. } => (id, None),
            _ => return false,
        };
        state.job(id).is_none_or(|job| match generation {
            Some(g) => g > job.generation,
            None => job.standby.is_none(),
        })
    }
}
