//! What one API token may keep in the cluster through this node: at most
//! [`PENDING_JOBS_PER_TOKEN_MAX`] jobs that have not ended, and at most
//! [`SPEC_BYTES_PER_TOKEN_MAX`] bytes of specs among the jobs still in the live state.
//!
//! Why: every submitted spec goes into every node's Raft log and state; without a bound a
//! token that may submit at all fills every node's disk and memory (the review put 23 MB in
//! each log with 100 requests). A submit over either limit is refused before it is
//! proposed, with `429` naming the limit.
//!
//! Scope, as it stands: the replicated tokens (the admin token, the operator's, is not
//! limited), counted per API node in memory (a submit is charged to the node that took
//! it, and a node's restart forgets its charges); the replicated state does not yet record
//! who submitted a job, which a cluster-wide quota per user will need. A charge is taken
//! before the proposal and dropped if it fails, so concurrent submits cannot overshoot.
//!
//! Pure bookkeeping behind a lock: whether a job still counts comes in as a function.

use std::{collections::HashMap, sync::Mutex};

use crate::domain::state::JobId;

/// Most jobs one token may have submitted through a node and not yet ended.
pub const PENDING_JOBS_PER_TOKEN_MAX: usize = 256;
/// Most spec bytes one token's jobs submitted through a node may hold in the live state.
pub const SPEC_BYTES_PER_TOKEN_MAX: u64 = 8 << 20;

/// What a job still costs its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Not ended: counts as pending, and its spec's bytes.
    Pending,
    /// Ended, still in the live state: its spec's bytes.
    Ended,
    /// Gone from the live state: nothing.
    Gone,
}

/// Why a submit is over its token's quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverQuota {
    /// Too many jobs not ended.
    #[error("this token has {pending} jobs that have not ended (at most {PENDING_JOBS_PER_TOKEN_MAX} per token on this node): wait for some to end or cancel them")]
    Pending {
        /// Its jobs not ended.
        pending: usize,
    },
    /// Too many spec bytes.
    #[error("this token's jobs hold {held} bytes of specs in the cluster's state and this spec has {bytes} (at most {SPEC_BYTES_PER_TOKEN_MAX} per token on this node, until ended jobs leave the state)")]
    SpecBytes {
        /// Bytes its jobs hold.
        held: u64,
        /// This spec's bytes.
        bytes: u64,
    },
}

/// One charge: the job once proposed (`None` while its proposal is on the way) and its
/// spec's bytes.
#[derive(Debug)]
struct Charge {
    id: u64,
    job: Option<JobId>,
    bytes: u64,
}

/// Each token's charges, by the token's hash.
#[derive(Debug, Default)]
pub struct SubmitQuota {
    charges: Mutex<(u64, HashMap<String, Vec<Charge>>)>,
}

impl SubmitQuota {
    /// Charges a submit of `bytes` to `token` if it is within its quota, the jobs it holds
    /// weighed by `standing`; returns the charge's number for [`SubmitQuota::submitted`] or
    /// [`SubmitQuota::failed`].
    pub fn charge(
        &self,
        token: &str,
        bytes: u64,
        standing: impl Fn(JobId) -> Standing,
    ) -> Result<u64, OverQuota> {
        let mut guard = self.charges.lock().expect("quota lock");
        let (next, by_token) = &mut *guard;
        let charges = by_token.entry(token.to_string()).or_default();
        let weigh = |c: &Charge| c.job.map_or(Standing::Pending, &standing);
        charges.retain(|c| weigh(c) != Standing::Gone);
        let pending = charges
            .iter()
            .filter(|c| weigh(c) == Standing::Pending)
            .count();
        if pending >= PENDING_JOBS_PER_TOKEN_MAX {
            return Err(OverQuota::Pending { pending });
        }
        let held: u64 = charges.iter().map(|c| c.bytes).sum();
        if held + bytes > SPEC_BYTES_PER_TOKEN_MAX {
            return Err(OverQuota::SpecBytes { held, bytes });
        }
        *next += 1;
        charges.push(Charge {
            id: *next,
            job: None,
            bytes,
        });
        Ok(*next)
    }

    /// The charge `id` of `token` became job `job`.
    pub fn submitted(&self, token: &str, id: u64, job: JobId) {
        let mut guard = self.charges.lock().expect("quota lock");
        if let Some(c) = guard
            .1
            .get_mut(token)
            .and_then(|cs| cs.iter_mut().find(|c| c.id == id))
        {
            c.job = Some(job);
        }
    }

    /// The charge `id` of `token` was not submitted: dropped.
    pub fn failed(&self, token: &str, id: u64) {
        let mut guard = self.charges.lock().expect("quota lock");
        if let Some(cs) = guard.1.get_mut(token) {
            cs.retain(|c| c.id != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_keeps_its_pending_jobs_and_spec_bytes_within_bounds() {
        let q = SubmitQuota::default();
        let all_pending = |_| Standing::Pending;
        for i in 0..PENDING_JOBS_PER_TOKEN_MAX as u64 {
            let c = q.charge("a", 10, all_pending).unwrap();
            q.submitted("a", c, JobId::from_log_index(i + 1));
        }
        let e = q.charge("a", 10, all_pending).unwrap_err();
        assert!(matches!(e, OverQuota::Pending { pending: 256 }), "{e}");
        assert!(e.to_string().contains("at most 256 per token"), "{e}");
        assert!(
            q.charge("b", 10, all_pending).is_ok(),
            "another token has its own"
        );
        // Ended jobs free a pending place; gone ones their bytes too.
        let first_ended = |j: JobId| {
            if j.log_index() == 1 {
                Standing::Ended
            } else {
                Standing::Pending
            }
        };
        let c = q.charge("a", 10, first_ended).unwrap();
        q.failed("a", c);
        // Bytes: a spec that would pass the bound is refused, naming it.
        let gone = |_| Standing::Gone;
        let big = q.charge("c", SPEC_BYTES_PER_TOKEN_MAX - 5, gone).unwrap();
        q.submitted("c", big, JobId::from_log_index(900));
        let e = q
            .charge("c", 10, |_| Standing::Ended)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bytes of specs"), "{e}");
        assert!(q.charge("c", 10, gone).is_ok(), "its job left the state");
    }
}
