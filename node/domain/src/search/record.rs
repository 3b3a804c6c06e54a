//! A search's replicated record: every trial (the searcher's [`Trial`]: params, bracket,
//! state, target, reports, promotions) beside the node's side of it (the job that runs it,
//! a speculative copy, where, since when), and the record of a trial's run job pointing
//! back at its search.
//!
//! These are plain data; the control state's `apply` changes them (`domain::state::trials`), the
//! chief reads them to decide (`chief::search`). Nothing here reads a clock.

use ringleader_spec::search::{Trial, TrialState};
use serde::{Deserialize, Serialize};

use crate::id::JobId;

/// A search job's record, in its `Job`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchRecord {
    /// Every trial created, by id (`trials[i].id == i`): what the searcher decides from.
    pub trials: Vec<Trial>,
    /// The node's side of each trial, by the same index.
    pub runs: Vec<TrialRun>,
    /// Failures of trials' own code so far (exits, not lost nodes), against
    /// `max_trial_failures`.
    pub failures: u32,
}

/// How a trial runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialRun {
    /// The job that runs the trial (its logs and checkpoints): the same job through
    /// promotions and re-runs, so a promoted train trial resumes from its own checkpoint.
    pub job: JobId,
    /// A speculative copy of it started because it ran slow, while it runs.
    #[serde(default)]
    pub copy: Option<JobId>,
    /// The member that ran it last (name).
    pub node: String,
    /// When its current run (towards `target`) started, proposer's clock, ms.
    pub run_started_at_ms: u64,
    /// How long its runs took, by the target they reached: (target, ms).
    #[serde(default)]
    pub run_ms: Vec<(u32, u64)>,
    /// Why it stopped or failed, for humans.
    #[serde(default)]
    pub note: String,
    /// Promoted at its rung while running: when its job exits 0, it is re-opened to go on
    /// to this resource.
    #[serde(default)]
    pub continue_to: Option<u32>,
}

/// On a trial's run job: which search and trial it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialOf {
    /// The search job.
    pub search: JobId,
    /// The trial's id in the search.
    pub trial: u32,
    /// The search's metric: the value its `ringleader-report` lines report.
    pub metric: String,
    /// Train up to this many epochs in this run (0: the spec's own length).
    pub target: u32,
    /// This job is a speculative copy of the trial's run.
    #[serde(default)]
    pub copy: bool,
    /// A command trial of a `resumable = true` search: each run ends at `target` (its
    /// rung), the node stopping a rank 0 that goes on past it, and a promotion resumes the
    /// trial in a new run (`RINGLEADER_TRIAL_RESUMABLE=1`).
    #[serde(default)]
    pub resumable: bool,
}

impl SearchRecord {
    /// Trials that hold a slot or wait for one (`running`, whose run may be pending).
    pub fn active(&self) -> usize {
        self.trials
            .iter()
            .filter(|t| matches!(t.state, TrialState::Running | TrialState::Pending))
            .count()
    }

    /// The trial and run of `trial`, if it exists.
    pub fn get_mut(&mut self, trial: u32) -> Option<(&mut Trial, &mut TrialRun)> {
        let i = trial as usize;
        match (self.trials.get_mut(i), self.runs.get_mut(i)) {
            (Some(t), Some(r)) => Some((t, r)),
            _ => None,
        }
    }

    /// The largest resource a trial reported so far (0 if none).
    pub fn reached(&self, trial: u32) -> u32 {
        self.trials
            .get(trial as usize)
            .and_then(|t| t.reports.last())
            .map_or(0, |r| r.resource)
    }
}
