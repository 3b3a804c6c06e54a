//! Whether this node's Raft reaches each member it replicates to, logged once per change:
//! the first failed replication call to a target at WARN, then nothing while it stays
//! unreachable, then one INFO line `replication to X recovered after N s` (sans-IO: times
//! come in, what to log goes out).
//!
//! openraft logs every failed replication call itself (an ERROR `RPCError` and a WARN at
//! each retry: one dead member made 99 ERROR lines in 20 s); the node's default log filter
//! silences its `openraft::replication` module, and the network adapter reports each
//! call's outcome here instead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::store::NodeId;

/// What to log about one target after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The first failed call since it was last reached: WARN, with the error.
    Lost {
        /// The call's error.
        error: String,
    },
    /// A call succeeded after failures: INFO, with how long it was unreachable.
    Recovered {
        /// Since the first failed call.
        after: Duration,
    },
}

/// Each target's reach, from the outcomes of the calls to it.
#[derive(Debug, Default)]
pub struct Reach {
    /// Targets whose last call failed, with when the first of those failures was.
    down_since: BTreeMap<NodeId, Instant>,
}

impl Reach {
    /// A call to `target` at `now` succeeded (`Ok`) or failed with the error; what to log,
    /// if the target's reach changed.
    pub fn on_call(
        &mut self,
        target: NodeId,
        now: Instant,
        outcome: Result<(), String>,
    ) -> Option<Change> {
        match outcome {
            Ok(()) => self
                .down_since
                .remove(&target)
                .map(|since| Change::Recovered {
                    after: now.saturating_duration_since(since),
                }),
            Err(error) => match self.down_since.entry(target) {
                std::collections::btree_map::Entry::Occupied(_) => None,
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(now);
                    Some(Change::Lost { error })
                }
            },
        }
    }
}

/// Logs `change` of `target` (a member's peer id; see the module doc).
pub fn log(target: &str, change: &Change) {
    match change {
        Change::Lost { error } => {
            tracing::warn!(peer = %target, "replication to {target} failed: {error} (logged again when it recovers)");
        }
        Change::Recovered { after } => {
            tracing::info!(peer = %target, "replication to {target} recovered after {} s", after.as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_when_a_target_is_lost_none_while_it_stays_down_one_when_it_recovers() {
        let mut reach = Reach::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(reach.on_call(1, at(0), Ok(())), None, "reached: nothing");
        assert_eq!(
            reach.on_call(2, at(1), Err("unreachable".into())),
            Some(Change::Lost {
                error: "unreachable".into()
            })
        );
        for s in 2..100 {
            assert_eq!(reach.on_call(2, at(s), Err("unreachable".into())), None);
            assert_eq!(reach.on_call(1, at(s), Ok(())), None, "another target");
        }
        assert_eq!(
            reach.on_call(2, at(21), Ok(())),
            Some(Change::Recovered {
                after: Duration::from_secs(20)
            })
        );
        assert_eq!(reach.on_call(2, at(22), Ok(())), None);
        assert!(matches!(
            reach.on_call(2, at(23), Err("again".into())),
            Some(Change::Lost { .. })
        ));
    }
}
