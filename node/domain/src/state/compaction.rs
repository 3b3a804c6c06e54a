//! Compaction: finished jobs older than the retention leave the live state, so the state
//! (and every snapshot) stays bounded however long the cluster runs. Their records stay in
//! storage: each ended job is written to `jobs/<id>/record.json` in every node's store, once
//! between members sharing one (`jobs::archive`), and the API answers for a compacted job
//! from there.
//!
//! The chief proposes [`Op::Compact`] with the ids [`compactable`] names; the
//! state machine removes those still ended (and the submit tokens that named them). A trial
//! job stays while its search runs (the search's leaderboard names it).

use super::{ignored, ops, ControlCommand, ControlResponse, ControlState, JobId, Op};

/// Most ids in one `Compact` command.
pub const COMPACT_IDS_MAX: usize = 1_000;

/// Ended jobs that finished at least `retention_ms` before `now_ms`, at most
/// [`COMPACT_IDS_MAX`] of them, oldest first.
pub fn compactable(state: &ControlState, now_ms: u64, retention_ms: u64) -> Vec<JobId> {
    let search_running = |search: JobId| state.job(search).is_some_and(|s| !s.state.is_terminal());
    state
        .jobs
        .values()
        .filter(|j| j.state.is_terminal())
        .filter(|j| {
            j.finished_at_ms
                .is_some_and(|t| t.saturating_add(retention_ms) <= now_ms)
        })
        .filter(|j| {
            !j.trial_of
                .as_ref()
                .is_some_and(|t| search_running(t.search))
        })
        .map(|j| j.id)
        .take(COMPACT_IDS_MAX)
        .collect()
}

impl ControlState {
    /// Applies `Compact`: removes the named jobs that are ended.
    pub(super) fn compact(&mut self, ids: &[JobId]) -> ControlResponse {
        let before = self.jobs.len();
        for id in ids {
            if self.jobs.get(id).is_some_and(|j| j.state.is_terminal()) {
                self.jobs.remove(id);
            }
        }
        if self.jobs.len() == before {
            return ignored("no ended job to compact".into());
        }
        let jobs = &self.jobs;
        self.tokens.retain(|_, id| jobs.contains_key(id));
        ControlResponse::Applied
    }
}

/// The command compacting `ids`, if any.
pub fn command(ids: Vec<JobId>, at_ms: u64) -> Option<ControlCommand> {
    (!ids.is_empty()).then_some(ControlCommand {
        op: Op::Compact(ops::Compact { ids }),
        at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::JobSpec;

    fn submit(s: &mut ControlState, at_ms: u64) -> JobId {
        let spec =
            JobSpec::parse("name = \"a\"\nkind = \"command\"\ncommand = [\"true\"]\n").unwrap();
        let cmd = ControlCommand {
            op: Op::Submit(ops::Submit {
                spec: Box::new(spec),
                token: Some(format!("t{at_ms}")),
                owner: crate::state::users::admin_user(),
            }),
            at_ms,
        };
        match s.apply(s.applied_index + 1, &cmd) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ended_jobs_past_the_retention_go_and_running_ones_stay() {
        let mut s = ControlState::default();
        let old = submit(&mut s, 10);
        let young = submit(&mut s, 20);
        let running = submit(&mut s, 30);
        for (id, at) in [(old, 100), (young, 900)] {
            let cancel = ControlCommand {
                op: Op::Cancel(ops::Cancel { id }),
                at_ms: at,
            };
            assert_eq!(
                s.apply(s.applied_index + 1, &cancel),
                ControlResponse::Applied
            );
        }
        assert_eq!(compactable(&s, 1_000, 500), vec![old]);
        let cmd = command(compactable(&s, 1_000, 500), 1_000).unwrap();
        assert_eq!(s.apply(s.applied_index + 1, &cmd), ControlResponse::Applied);
        assert!(s.job(old).is_none());
        assert!(s.job(young).is_some() && s.job(running).is_some());
        assert!(
            !s.tokens.values().any(|id| *id == old),
            "its token went with it"
        );
        // Compacting a running job is a no-op.
        let cmd = ControlCommand {
            op: Op::Compact(ops::Compact { ids: vec![running] }),
            at_ms: 1_001,
        };
        assert!(matches!(
            s.apply(s.applied_index + 1, &cmd),
            ControlResponse::Ignored { .. }
        ));
        assert!(s.job(running).is_some());
        assert!(command(Vec::new(), 1).is_none());
    }
}
