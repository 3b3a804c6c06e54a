//! A search's leaderboard: its trials as documents, best first, and the best one. A pure
//! function of the replicated record: the state machine records the best trial when a search
//! ends (`state::trials`), the API and `search::summary` show the same documents.

use ringleader_spec::search::{Direction, Params, TrialState};
use serde::{Deserialize, Serialize};

use super::record::SearchRecord;

/// One trial, as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialDoc {
    /// Its id in the search.
    pub id: u32,
    /// The job that runs it (`ringleader logs` takes it).
    pub job: String,
    /// The user it belongs to: its search's owner.
    #[serde(default = "crate::state::users::admin_user")]
    pub owner: String,
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

/// The trials in id order, each owned by `owner` (the search's).
pub fn trials(record: &SearchRecord, owner: &str) -> Vec<TrialDoc> {
    record
        .trials
        .iter()
        .zip(&record.runs)
        .map(|(t, r)| TrialDoc {
            id: t.id,
            job: r.job.to_string(),
            owner: owner.to_owned(),
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

/// The trials best first, each owned by `owner` (the search's).
pub fn leaderboard(record: &SearchRecord, owner: &str, direction: Direction) -> Vec<TrialDoc> {
    let mut docs = trials(record, owner);
    sort_best_first(&mut docs, direction);
    docs
}

/// The best trial: the leaderboard's first with a metric.
pub fn best(record: &SearchRecord, direction: Direction) -> Option<BestDoc> {
    leaderboard(record, "", direction)
        .into_iter()
        .find_map(|d| {
            d.metric.map(|metric| BestDoc {
                id: d.id,
                params: d.params,
                metric,
            })
        })
}
