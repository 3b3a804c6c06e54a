//! Each user's limits on what it keeps in the replicated state: jobs that have not ended and
//! bytes of specs among its jobs in the live state, with a pure check every node asks alike.
//!
//! Why: every submitted spec goes into every node's Raft log and state; without a bound a
//! user that may submit at all fills every node's disk and memory (the review put 23 MB in
//! each log with 100 requests). A user's holdings come from the state itself (each job
//! records its owner, `domain::state::users`), so they count the same on every replica. The
//! limits are node flags (`--user-pending-jobs-max`, `--user-spec-bytes-max`): the node
//! whose API takes a submit checks them against its replica (with its own submits still on
//! their way, `api::quota`), and the chief checks them again on a forwarded submit against
//! its own state, which holds every submit it committed. Admins are not limited; a search's
//! trials are their search's and are not counted apart.

use super::ControlState;
use crate::spec::JobSpec;

/// Default most jobs one user may have that have not ended.
pub const PENDING_JOBS_PER_USER_MAX: usize = 256;
/// Default most spec bytes one user's jobs may hold in the live state.
pub const SPEC_BYTES_PER_USER_MAX: u64 = 8 << 20;

/// The per-user limits (node flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserLimits {
    /// Most jobs not ended (0: no limit).
    pub pending_jobs_max: usize,
    /// Most spec bytes among its jobs in the live state (0: no limit).
    pub spec_bytes_max: u64,
}

impl Default for UserLimits {
    fn default() -> Self {
        UserLimits {
            pending_jobs_max: PENDING_JOBS_PER_USER_MAX,
            spec_bytes_max: SPEC_BYTES_PER_USER_MAX,
        }
    }
}

/// What a user holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Its jobs not ended (its trials not counted).
    pub pending: usize,
    /// Its jobs' spec bytes in the live state.
    pub spec_bytes: u64,
}

/// A spec's bytes as the log holds it (its JSON).
pub fn spec_bytes(spec: &JobSpec) -> u64 {
    serde_json::to_vec(spec).map_or(0, |v| v.len() as u64)
}

/// What the chief's refusal of a forwarded submit over its user's limits says first (the
/// forwarding node answers it as the API's own refusal, 429).
pub const OVER_LIMIT: &str = "over its user's limits";

/// Why a submit is over its user's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverLimit {
    /// Too many jobs not ended.
    #[error("{user} has {pending} jobs that have not ended (at most {max} per user): wait for some to end or cancel them")]
    Pending {
        /// The user.
        user: String,
        /// Its jobs not ended.
        pending: usize,
        /// The limit.
        max: usize,
    },
    /// Too many spec bytes.
    #[error("{user}'s jobs hold {held} bytes of specs in the cluster's state and this spec has {bytes} (at most {max} per user, until ended jobs leave the state)")]
    SpecBytes {
        /// The user.
        user: String,
        /// Bytes its jobs hold.
        held: u64,
        /// This spec's bytes.
        bytes: u64,
        /// The limit.
        max: u64,
    },
}

impl UserLimits {
    /// Whether `user`, holding `held`, may add a job of `bytes` spec bytes.
    pub fn check(&self, user: &str, held: Usage, bytes: u64) -> Result<(), OverLimit> {
        if self.pending_jobs_max > 0 && held.pending >= self.pending_jobs_max {
            return Err(OverLimit::Pending {
                user: user.to_owned(),
                pending: held.pending,
                max: self.pending_jobs_max,
            });
        }
        if self.spec_bytes_max > 0 && held.spec_bytes + bytes > self.spec_bytes_max {
            return Err(OverLimit::SpecBytes {
                user: user.to_owned(),
                held: held.spec_bytes,
                bytes,
                max: self.spec_bytes_max,
            });
        }
        Ok(())
    }
}

impl ControlState {
    /// What `user` holds: its submitted jobs (a search counts, its trials do not).
    pub fn usage(&self, user: &str) -> Usage {
        let mut u = Usage::default();
        for job in self
            .jobs
            .values()
            .filter(|j| j.owner == user && j.trial_of.is_none())
        {
            if !job.state.is_terminal() {
                u.pending += 1;
            }
            u.spec_bytes += spec_bytes(&job.spec);
        }
        u
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ops, ControlCommand, ControlResponse, JobId, Op};

    fn submit(s: &mut ControlState, index: u64, owner: &str) -> JobId {
        let spec =
            JobSpec::parse("name = \"a\"\nkind = \"command\"\ncommand = [\"true\"]\n").unwrap();
        let cmd = ControlCommand::new(
            index,
            Op::Submit(ops::Submit {
                spec: Box::new(spec),
                token: None,
                owner: owner.into(),
            }),
        );
        match s.apply(index, &cmd) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_users_jobs_are_counted_from_the_replicated_state() {
        let mut s = ControlState::default();
        let a1 = submit(&mut s, 1, "alice");
        submit(&mut s, 2, "alice");
        submit(&mut s, 3, "bob");
        let alice = s.usage("alice");
        assert_eq!(alice.pending, 2);
        assert_eq!(alice.spec_bytes, 2 * spec_bytes(&s.job(a1).unwrap().spec));
        assert_eq!(s.usage("bob").pending, 1);
        assert_eq!(s.usage("carol"), Usage::default());
        // An ended job frees its place, not its bytes (it is still in the state).
        s.apply(
            4,
            &ControlCommand::new(4, Op::Cancel(ops::Cancel { id: a1 })),
        );
        let after = s.usage("alice");
        assert_eq!(after.pending, 1);
        assert_eq!(after.spec_bytes, alice.spec_bytes);
    }

    #[test]
    fn the_limits_name_the_user_and_the_bound() {
        let limits = UserLimits {
            pending_jobs_max: 3,
            spec_bytes_max: 1_000,
        };
        let held = |pending, spec_bytes| Usage {
            pending,
            spec_bytes,
        };
        assert_eq!(limits.check("alice", held(2, 100), 900), Ok(()));
        let e = limits
            .check("alice", held(3, 0), 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("alice has 3 jobs") && e.contains("at most 3 per user"),
            "{e}"
        );
        let e = limits
            .check("bob", held(0, 100), 901)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("bob's jobs hold 100 bytes") && e.contains("this spec has 901"),
            "{e}"
        );
        let open = UserLimits {
            pending_jobs_max: 0,
            spec_bytes_max: 0,
        };
        assert_eq!(open.check("dave", held(1 << 20, 1 << 40), 1 << 30), Ok(()));
    }
}
