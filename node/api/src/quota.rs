//! A user's submits through this node, held to its limits (`domain::state::user_limits`:
//! jobs not ended, spec bytes in the live state; node flags `--user-pending-jobs-max` and
//! `--user-spec-bytes-max`): its holdings in this node's replica, plus the submits this node
//! proposed for it whose proposals have not returned yet, so one node's concurrent submits
//! cannot overshoot. A submit over a limit is refused before it is proposed, with `429`
//! naming the user, the limit and its count. The chief checks a forwarded submit again
//! against its own state (`control::rpc`), so a replica that lags behind submits made
//! through other nodes lets nothing past the limit; submits racing through several nodes
//! at once may pass it by one each. Admins are not limited.

use std::{collections::HashMap, sync::Mutex};

pub use crate::domain::state::user_limits::{
    spec_bytes, OverLimit, Usage, UserLimits, PENDING_JOBS_PER_USER_MAX, SPEC_BYTES_PER_USER_MAX,
};

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
    pub fn charge(&self, user: &str, bytes: u64, held: Usage) -> Result<u64, OverLimit> {
        let mut guard = self.in_flight.lock().expect("quota lock");
        let (next, by_user) = &mut *guard;
        let flying = by_user.get(user).map(Vec::as_slice).unwrap_or_default();
        let with_flying = Usage {
            pending: held.pending + flying.len(),
            spec_bytes: held.spec_bytes + flying.iter().map(|(_, b)| b).sum::<u64>(),
        };
        self.limits.check(user, with_flying, bytes)?;
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
        assert!(matches!(e, OverLimit::Pending { pending: 3, .. }), "{e}");
        assert!(
            q.charge("bob", 10, held).is_ok(),
            "another user has its own"
        );
        // Proposals that returned count from the state, not twice.
        q.done("alice", c1);
        q.done("alice", c2);
        assert!(q.charge("alice", 10, held).is_ok());
        // Bytes on the way count too.
        let c = q.charge("carol", 800, held).unwrap();
        let e = q.charge("carol", 101, held).unwrap_err().to_string();
        assert!(e.contains("carol's jobs hold 900 bytes"), "{e}");
        q.done("carol", c);
        assert!(q.charge("carol", 101, held).is_ok());
    }
}
