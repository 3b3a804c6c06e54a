//! A search's document: its trials as a leaderboard and the best one. The API shows it in
//! `job ID --json` (`trials`, `best`) and `ringleader trials ID`; when the search ends, each
//! node writes it with the spec to its storage as `experiments/<job-id>/summary.json`, so
//! the record outlives the cluster.

use serde::{Deserialize, Serialize};
use trainer::search::{Direction, Params, TrialState};

use super::record::SearchRecord;
use crate::control::state::Job;

/// Where a search's summary lives in storage.
pub fn summary_path(search: &str) -> String {
    format!("experiments/{search}/summary.json")
}

/// One trial, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialDoc {
    /// Its id in the search.
    pub id: u32,
    /// The job that runs it (`ringleader logs` takes it).
    pub job: String,
    /// Its parameters.
    pub params: Params,
    /// `pending`, `running`, `paused` (at a rung, may still be promoted), `succeeded`,
    /// `stopped` (early, by the search), `failed`.
    pub state: String,
    /// The metric at the largest resource reported, if any.
    pub metric: Option<f64>,
    /// Resource trained (epochs; a promotion's continuation counted once).
    pub resource: u32,
    /// Times promoted to a higher rung.
    pub promotions: u32,
    /// Hyperband bracket (0 for the other algorithms).
    pub bracket: u32,
    /// The member that ran it last.
    pub node: String,
    /// Why it stopped or failed, if it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

impl TrialDoc {
    /// Its parameters as `name=value` pairs separated by spaces (the leaderboard and `job
    /// --watch` print them so).
    pub fn params_text(&self) -> String {
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The best trial so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BestDoc {
    /// Its id.
    pub id: u32,
    /// Its parameters.
    pub params: Params,
    /// Its metric.
    pub metric: f64,
}

/// A trial state as the API spells it.
pub fn state_str(s: TrialState) -> &'static str {
    match s {
        TrialState::Pending => "pending",
        TrialState::Running => "running",
        TrialState::Paused => "paused",
        TrialState::Succeeded => "succeeded",
        TrialState::Stopped => "stopped",
        TrialState::Failed => "failed",
    }
}

/// The trials in id order.
pub fn trials(record: &SearchRecord) -> Vec<TrialDoc> {
    record
        .trials
        .iter()
        .zip(&record.runs)
        .map(|(t, r)| TrialDoc {
            id: t.id,
            job: r.job.to_string(),
            params: t.params.clone(),
            state: state_str(t.state).to_owned(),
            metric: t.reports.last().map(|r| r.value),
            resource: t.reports.last().map_or(0, |r| r.resource),
            promotions: t.promotions,
            bracket: t.bracket,
            node: r.node.clone(),
            note: r.note.clone(),
        })
        .collect()
}

/// Sorts trials best first (by metric in `direction`; trials without a metric last), ties
/// by more resource, then id.
pub fn sort_best_first(docs: &mut [TrialDoc], direction: Direction) {
    docs.sort_by(|a, b| {
        let key = |d: &TrialDoc| match (d.metric, direction) {
            (Some(m), Direction::Max) => m,
            (Some(m), Direction::Min) => -m,
            (None, _) => f64::NEG_INFINITY,
        };
        key(b)
            .total_cmp(&key(a))
            .then(b.resource.cmp(&a.resource))
            .then(a.id.cmp(&b.id))
    });
}

/// The trials best first.
pub fn leaderboard(record: &SearchRecord, direction: Direction) -> Vec<TrialDoc> {
    let mut docs = trials(record);
    sort_best_first(&mut docs, direction);
    docs
}

/// The best trial: the leaderboard's first with a metric.
pub fn best(record: &SearchRecord, direction: Direction) -> Option<BestDoc> {
    leaderboard(record, direction).into_iter().find_map(|d| {
        d.metric.map(|metric| BestDoc {
            id: d.id,
            params: d.params,
            metric,
        })
    })
}

/// What `experiments/<job-id>/summary.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The search job's id.
    pub id: String,
    /// Its name.
    pub name: String,
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
        let s = super::spec::search_spec(&job.spec).ok()?;
        Some(Summary {
            id: job.id.to_string(),
            name: job.spec.name.clone(),
            state: job.state.to_string(),
            spec: job.spec.to_toml(),
            metric: s.metric.clone(),
            direction: match s.direction {
                Direction::Max => "max".into(),
                Direction::Min => "min".into(),
            },
            trials: leaderboard(record, s.direction),
            best: best(record, s.direction),
            submitted_at_ms: job.submitted_at_ms,
            finished_at_ms: job.finished_at_ms,
        })
    }
}
