//! A search's document: its trials as a leaderboard and the best one. The API shows it in
//! `job ID --json` (`trials`, `best`) and `ringleader trials ID`; when the search ends, each
//! node writes it with the spec to its storage as `experiments/<job-id>/summary.json`, so
//! the record outlives the cluster.

use serde::{Deserialize, Serialize};
use trainer::search::Direction;

pub use crate::domain::search::leaderboard::{
    best, leaderboard, sort_best_first, state_str, trials, BestDoc, TrialDoc,
};
use crate::domain::state::Job;

/// Where a search's summary lives in storage.
pub fn summary_path(search: &str) -> String {
    format!("experiments/{search}/summary.json")
}

/// What `experiments/<job-id>/summary.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The search job's id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The user it belongs to.
    #[serde(default = "crate::domain::state::users::admin_user")]
    pub owner: String,
    /// `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// The spec as submitted (TOML).
    pub spec: String,
    /// The metric searched on.
    pub metric: String,
    /// `max` or `min`.
    pub direction: String,
    /// Every trial, best first.
    pub trials: Vec<TrialDoc>,
    /// The best trial.
    pub best: Option<BestDoc>,
    /// When the search was submitted and ended, ms since the Unix epoch.
    pub submitted_at_ms: u64,
    /// When it ended.
    pub finished_at_ms: Option<u64>,
}

impl Summary {
    /// The summary of a search job; `None` for other jobs.
    pub fn of(job: &Job) -> Option<Summary> {
        let record = job.search.as_ref()?;
        let s = crate::domain::search::spec::search_spec(&job.spec).ok()?;
        Some(Summary {
            id: job.id.to_string(),
            name: job.spec.name.clone(),
            owner: job.owner.clone(),
            state: job.state.to_string(),
            spec: job.spec.to_toml(),
            metric: s.metric.clone(),
            direction: match s.direction {
                Direction::Max => "max".into(),
                Direction::Min => "min".into(),
            },
            trials: leaderboard(record, &job.owner, s.direction),
            best: best(record, s.direction),
            submitted_at_ms: job.submitted_at_ms,
            finished_at_ms: job.finished_at_ms,
        })
    }
}
