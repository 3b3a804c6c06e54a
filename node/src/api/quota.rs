//! What one user may keep in the cluster: at most [`UserLimits::pending_jobs_max`] jobs that
//! have not ended, and at most [`UserLimits::spec_bytes_max`] bytes of specs among its jobs
//! still in the live state (node flags `--user-pending-jobs-max`, default
//! [`PENDING_JOBS_PER_USER_MAX`], and `--user-spec-bytes-max`, default
//! [`SPEC_BYTES_PER_USER_MAX`]).
//!
//! Why: every submitted spec goes into every node's Raft log and state; without a bound a
//! user that may submit at all fills every node's disk and memory (the review put 23 MB in
//! each log with 100 requests). A submit over either limit is refused before it is
//! proposed, with `429` naming the limit, the user and its count.
//!
//! What is replicated: the count comes from the replicated state (each job records its
//! owner, `domain::state::users`), so a user's jobs count the same on every node, whichever
//! took them, and across restarts; a spec's bytes are those of its JSON as the log holds
//! it. The limits themselves are node flags, checked by the node whose API takes the
//! submit; give every node the same. Submits this node proposed and its replica has not
//! applied yet are counted too (in memory, dropped when the proposal returns), so one
//! node's concurrent submits cannot overshoot; submits racing through several nodes at once
//! can pass the limit by one each. Admins (the admin token, tokens of role admin) are not
//! limited. A search's trials are its search's: they are not counted apart.

use std::{collections::HashMap, sync::Mutex};

use crate::domain::state::ControlState;

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

/// What a user holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Its jobs not ended (its trials not counted).
    pub pending: usize,
    /// Its jobs' spec bytes in the live state.
    pub spec_bytes: u64,
}

/// A spec's bytes as the log holds it (its JSON).
pub fn spec_bytes(spec: &crate::domain::spec::JobSpec) -> u64 {
    serde_json::to_vec(spec).map_or(0, |v| v.len() as u64)
}

/// What `user` holds in `state`: its submitted jobs (a search counts, its trials do not).
pub fn usage(state: &ControlState, user: &str) -> Usage {
    let mut u = Usage::default();
    for job in state
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

/// Why a submit is over its user's limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverQuota {
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

/// This node's submits on their way, by user: (charge id, spec bytes) each.
type InFlight = HashMap<String, Vec<(u64, u64)>>;

/// The limits and this node's submits on their way (with the last charge id given).
#[derive(Debug, Default)]
pub struct SubmitQuota {
    limits: UserLimits,
    in_flight: Mutex<(u64, InFlight)>,
}

impl SubmitQuota {
    /// A quota of `limits`.
    pub fn new(limits: UserLimits) -> SubmitQuota {
        SubmitQuota {
            limits,
            in_flight: Mutex::default(),
        }
    }

    /// Charges a submit of `bytes` by `user`, who holds `held` in the replicated state, if
    /// that and this node's submits on their way stay within the limits; the charge's id
    /// goes to [`SubmitQuota::done`] once the proposal returns.
    pub fn charge(&self, user: &str, bytes: u64, held: Usage) -> Result<u64, OverQuota> {
        let mut guard = self.in_flight.lock().expect("quota lock");
        let (next, by_user) = &mut *guard;
        let flying = by_user.get(user).map(Vec::as_slice).unwrap_or_default();
        let pending = held.pending + flying.len();
        let limits = self.limits;
        if limits.pending_jobs_max > 0 && pending >= limits.pending_jobs_max {
            return Err(OverQuota::Pending {
                user: user.to_owned(),
                pending,
                max: limits.pending_jobs_max,
            });
        }
        let held_bytes = held.spec_bytes + flying.iter().map(|(_, b)| b).sum::<u64>();
        if limits.spec_bytes_max > 0 && held_bytes + bytes > limits.spec_bytes_max {
            return Err(OverQuota::SpecBytes {
                user: user.to_owned(),
                held: held_bytes,
                bytes,
                max: limits.spec_bytes_max,
            });
        }
        *next += 1;
        by_user
            .entry(user.to_owned())
            .or_default()
            .push((*next, bytes));
        Ok(*next)
    }

    /// The proposal of charge `id` of `user` returned (the job is in the state, or was
    /// never made): it counts from the state from now on.
    pub fn done(&self, user: &str, id: u64) {
        let mut guard = self.in_flight.lock().expect("quota lock");
        if let Some(cs) = guard.1.get_mut(user) {
            cs.retain(|(c, _)| *c != id);
            if cs.is_empty() {
                guard.1.remove(user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::spec::JobSpec;
    use crate::domain::state::{ControlCommand, ControlResponse, Op};

    fn submit(s: &mut ControlState, index: u64, owner: &str) -> crate::domain::state::JobId {
        let spec =
            JobSpec::parse("name = \"a\"\nkind = \"command\"\ncommand = [\"true\"]\n").unwrap();
        let cmd = ControlCommand::new(
            index,
            Op::Submit {
                spec: Box::new(spec),
                token: None,
                owner: owner.into(),
            },
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
        let alice = usage(&s, "alice");
        assert_eq!(alice.pending, 2);
        assert_eq!(alice.spec_bytes, 2 * spec_bytes(&s.job(a1).unwrap().spec));
        assert_eq!(usage(&s, "bob").pending, 1);
        assert_eq!(usage(&s, "carol"), Usage::default());
        // An ended job frees its place, not its bytes (it is still in the state).
        s.apply(4, &ControlCommand::new(4, Op::Cancel { id: a1 }));
        let after = usage(&s, "alice");
        assert_eq!(after.pending, 1);
        assert_eq!(after.spec_bytes, alice.spec_bytes);
    }

    #[test]
    fn a_user_is_held_to_its_limits_with_its_submits_on_the_way() {
        let q = SubmitQuota::new(UserLimits {
            pending_jobs_max: 3,
            spec_bytes_max: 1_000,
        });
        let held = Usage {
            pending: 1,
            spec_bytes: 100,
        };
        let c1 = q.charge("alice", 10, held).unwrap();
        let c2 = q.charge("alice", 10, held).unwrap();
        let e = q.charge("alice", 10, held).unwrap_err();
        assert!(matches!(e, OverQuota::Pending { pending: 3, .. }), "{e}");
        assert!(e.to_string().contains("alice has 3 jobs"), "{e}");
        assert!(e.to_string().contains("at most 3 per user"), "{e}");
        assert!(
            q.charge("bob", 10, held).is_ok(),
            "another user has its own"
        );
        // Proposals that returned count from the state, not twice.
        q.done("alice", c1);
        q.done("alice", c2);
        assert!(q.charge("alice", 10, held).is_ok());
        // Bytes: a spec that would pass the bound is refused, naming it.
        let e = q.charge("carol", 901, held).unwrap_err().to_string();
        assert!(e.contains("carol's jobs hold 100 bytes"), "{e}");
        assert!(e.contains("this spec has 901"), "{e}");
        assert!(q.charge("carol", 900, held).is_ok());
        // 0: no limit.
        let open = SubmitQuota::new(UserLimits {
            pending_jobs_max: 0,
            spec_bytes_max: 0,
        });
        let lots = Usage {
            pending: 1 << 20,
            spec_bytes: 1 << 40,
        };
        assert!(open.charge("dave", 1 << 30, lots).is_ok());
    }
}
