//! The sharing routes: quotas and the queue (see `domain::state::quotas`,
//! `domain::queue`, and the chief's scheduler in docs/book/src/design/design.md).
//!
//! | route | does |
//! | --- | --- |
//! | `POST /v1/quotas` `{"user", "cpus"?, "gpus"?, "borrow_cpus"?, "borrow_gpus"?, "gpu_hours"?, "weight"?, "max_priority"?, "group"?, "may_refuse_preemption"?}` | sets the fields given of a user's (or `@GROUP`'s) quota (the admin only) |
//! | `GET /v1/quotas` | `[{user, quota, used, borrowed, gpu_hours_used}]`: every user with a quota or running ranks |
//! | `GET /v1/queue` | `{jobs: [{position, id, name, owner, priority, priority_label, effective_priority, workers, cpus_per_worker, gpus_per_worker, submitted_at_ms, pending_reason, trials}]}`: waiting jobs, and running searches whose trials wait (`trials`), in the order the scheduler takes them |
//!
//! Errors: 400 (a field out of its bound, named), 403 (a quota change without the admin
//! token), 503 (no chief).
//!
//! Also here, for the submit route: the members' sizes that `domain::admission` judges a
//! spec against (`member_sizes`).

use axum::{extract::State, http::StatusCode, Json};
use serde::{Deserialize, Serialize};

use super::{access::require_admin, status::QuotaRow, ApiError, AppState};
use crate::control::handle::wall_ms;
use crate::domain::{
    admission::MemberSize,
    queue::{self, Usage},
    spec::priority,
    state::{
        ops,
        quotas::{check_quota_name, Quota},
        ControlCommand, ControlResponse, ControlState, Op,
    },
};

/// `POST /v1/quotas` body: the user and the fields to set (absent or null: kept).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetRequest {
    /// The user, or `@GROUP`.
    pub user: String,
    /// Nominal cpus.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// Nominal GPUs.
    #[serde(default)]
    pub gpus: Option<u32>,
    /// Most cpus borrowed above `cpus`.
    #[serde(default)]
    pub borrow_cpus: Option<u32>,
    /// Most GPUs borrowed above `gpus`.
    #[serde(default)]
    pub borrow_gpus: Option<u32>,
    /// GPU-hours budget over 7 days.
    #[serde(default)]
    pub gpu_hours: Option<f64>,
    /// Fair-share weight.
    #[serde(default)]
    pub weight: Option<u32>,
    /// Highest priority the user may submit with.
    #[serde(default)]
    pub max_priority: Option<u32>,
    /// The user's group.
    #[serde(default)]
    pub group: Option<String>,
    /// Whether the user may submit `preemptible = false`.
    #[serde(default)]
    pub may_refuse_preemption: Option<bool>,
}

impl SetRequest {
    /// The fields to set, as the registry's record.
    pub fn quota(&self) -> Quota {
        Quota {
            cpus: self.cpus,
            gpus: self.gpus,
            borrow_cpus: self.borrow_cpus,
            borrow_gpus: self.borrow_gpus,
            gpu_hours: self.gpu_hours,
            weight: self.weight,
            max_priority: self.max_priority,
            group: self.group.clone(),
            may_refuse_preemption: self.may_refuse_preemption,
        }
    }
}

/// A row of `GET /v1/queue`.
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueRow {
    /// 1-based place in the order.
    pub position: usize,
    /// Job id.
    pub id: String,
    /// Job name.
    pub name: String,
    /// Its owner.
    pub owner: String,
    /// Its spec's priority.
    pub priority: u32,
    /// `low`, `normal`, `high`, or the number.
    pub priority_label: String,
    /// Its priority raised by its wait.
    pub effective_priority: u32,
    /// Ranks it asks for.
    pub workers: u32,
    /// Cpus per rank.
    pub cpus_per_worker: u32,
    /// GPUs per rank.
    pub gpus_per_worker: u32,
    /// When it was submitted, ms since the Unix epoch.
    pub submitted_at_ms: u64,
    /// Why it waits, as the chief last recorded it.
    pub pending_reason: Option<String>,
    /// A running search whose next trials wait (its row stands for them; `workers` and the
    /// resources are one trial's).
    #[serde(default)]
    pub trials: bool,
}

/// `GET /v1/queue` document.
#[derive(Debug, Serialize, Deserialize)]
pub struct QueueDoc {
    /// Waiting jobs, first to start first.
    pub jobs: Vec<QueueRow>,
}

/// `POST /v1/quotas`.
pub(super) async fn set(
    State(app): State<AppState>,
    Json(req): Json<SetRequest>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&app, "set quotas")?;
    check_quota_name(&req.user).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
    let quota = req.quota();
    quota
        .check()
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
    let cmd = ControlCommand::new(
        wall_ms(),
        Op::QuotaSet(ops::QuotaSet {
            user: req.user.clone(),
            quota,
        }),
    );
    match app.control.propose(cmd).await? {
        ControlResponse::Applied => {
            let quota = app.control.read(|s| s.quotas.get(&req.user).cloned());
            Ok(Json(
                serde_json::json!({ "user": req.user, "quota": quota }),
            ))
        }
        ControlResponse::Rejected { reason } | ControlResponse::Ignored { reason } => {
            Err(ApiError(StatusCode::BAD_REQUEST, reason))
        }
        other => Err(ApiError(StatusCode::BAD_REQUEST, format!("{other:?}"))),
    }
}

/// The rows of `GET /v1/quotas` at `now_ms`.
pub fn quota_rows(state: &ControlState, now_ms: u64) -> Vec<QuotaRow> {
    let used = queue::usage_by_owner(state);
    let gpu_ms = queue::gpu_ms_by_owner(state, now_ms);
    // A group's use: its members'.
    let mut group_used: std::collections::BTreeMap<String, Usage> = Default::default();
    for (user, u) in &used {
        if let Some(g) = state.quotas.get(user).and_then(|q| q.group.as_ref()) {
            let t = group_used.entry(format!("@{g}")).or_default();
            t.cpus += u.cpus;
            t.gpus += u.gpus;
        }
    }
    let mut users: std::collections::BTreeSet<&String> = state.quotas.keys().collect();
    users.extend(used.keys());
    users
        .into_iter()
        .map(|user| {
            let quota = state.quotas.get(user).cloned().unwrap_or_default();
            let u = used
                .get(user)
                .or_else(|| group_used.get(user))
                .copied()
                .unwrap_or_default();
            let borrowed = Usage {
                cpus: u.cpus.saturating_sub(quota.cpus.map_or(0, u64::from)),
                gpus: u.gpus.saturating_sub(quota.gpus.map_or(0, u64::from)),
            };
            let gpu_hours_used = quota
                .gpu_hours
                .map(|_| gpu_ms.get(user).copied().unwrap_or(0) as f64 / 3_600_000.0);
            QuotaRow {
                user: user.clone(),
                quota,
                used: u.into(),
                borrowed: borrowed.into(),
                gpu_hours_used,
            }
        })
        .collect()
}

/// `GET /v1/quotas`.
pub(super) async fn list(State(app): State<AppState>) -> Json<Vec<QuotaRow>> {
    let now = wall_ms();
    Json(app.control.read(|s| quota_rows(s, now)))
}

/// The queue document at `now_ms` for a cluster of `totals`.
pub fn queue_doc(state: &ControlState, totals: Usage, now_ms: u64) -> QueueDoc {
    let jobs = queue::waiting_in_order(state, totals, now_ms)
        .into_iter()
        .enumerate()
        .map(|(i, j)| QueueRow {
            position: i + 1,
            id: j.id.to_string(),
            name: j.spec.name.clone(),
            owner: j.owner.clone(),
            priority: j.spec.priority,
            priority_label: priority::label(j.spec.priority),
            effective_priority: if queue::trials_wait(j) {
                j.spec.priority
            } else {
                queue::effective_priority(j.spec.priority, j.submitted_at_ms, now_ms)
            },
            workers: j.spec.workers,
            cpus_per_worker: j.spec.resources.cpus_per_worker,
            gpus_per_worker: j.spec.resources.gpus_per_worker,
            submitted_at_ms: j.submitted_at_ms,
            pending_reason: j.pending_reason.clone(),
            trials: queue::trials_wait(j),
        })
        .collect();
    QueueDoc { jobs }
}

/// `GET /v1/queue`.
pub(super) async fn queue(State(app): State<AppState>) -> Result<Json<QueueDoc>, ApiError> {
    let totals = cluster_totals(&app).await?;
    let now = wall_ms();
    Ok(Json(app.control.read(|s| queue_doc(s, totals, now))))
}

/// The cpus and GPUs of the alive members this node sees.
async fn cluster_totals(app: &AppState) -> Result<Usage, ApiError> {
    Ok(super::status_doc(app).await?.alive_capacity())
}

/// The sizes of the members that could hold ranks (alive or suspect, not removed).
pub(super) async fn member_sizes(app: &AppState) -> Vec<MemberSize> {
    match super::status_doc(app).await {
        Ok(doc) => doc
            .members
            .iter()
            .filter(|m| m.state == "alive" || m.state == "suspect")
            .map(|m| MemberSize {
                cpus: m.cpus,
                gpus: m.gpus.len() as u32,
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
