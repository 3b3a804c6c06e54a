//! `POST /v1/jobs/{id}/preempt` and `POST /v1/jobs/{id}/grow`: the admin's preemption and
//! grow (the admin token only; 403 otherwise). The entries are made by
//! `domain::state::preempt::execute` on this node's replica and proposed through the chief;
//! a decision on a view the log has moved past is ignored by the state machine (409).
//!
//! Bodies (JSON): `{"action": {"shrink": {"to_workers": 2}} | "requeue" | {"pause_trials":
//! {"count": 1}}, "for": "j-12"?, "reason": "…"?}`; `{"to_workers": 4, "reason": "…"?}`.
//! Answers: `{"id", "done"}` (200), `{"error"}` with 400 (a bad body), 403, 404 (no such
//! job) or 409 (the job cannot be preempted or grown so: not running, not preemptible, a
//! size outside its bounds).

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Json,
};
use serde::Deserialize;

use super::{access::require_admin, job_id, ApiError, AppState};
use crate::{
    control::handle::wall_ms,
    domain::{
        preempt::{self, Preempt, PreemptAction, Refused},
        state::{new_ring_secret, ops, ControlCommand, ControlResponse, Op},
    },
};

/// Longest `reason`, in bytes.
pub const PREEMPT_REASON_BYTES_MAX: usize = 256;

/// The body of `POST /v1/jobs/{id}/preempt`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreemptRequest {
    /// What the job gives up.
    pub action: PreemptAction,
    /// The job the capacity is for.
    #[serde(default, rename = "for")]
    pub for_job: Option<String>,
    /// Why, for the history.
    #[serde(default)]
    pub reason: Option<String>,
}

/// The body of `POST /v1/jobs/{id}/grow`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrowRequest {
    /// The ring's size to grow to.
    pub to_workers: u32,
    /// Why, for the history (default `capacity returned`).
    #[serde(default)]
    pub reason: Option<String>,
}

fn refused(e: Refused) -> ApiError {
    let code = match e {
        Refused::Unknown(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::CONFLICT,
    };
    ApiError(code, e.to_string())
}

fn reason_field(reason: Option<String>) -> Result<Option<String>, ApiError> {
    match reason {
        Some(r) if r.len() > PREEMPT_REASON_BYTES_MAX || r.contains('\n') => Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("reason: one line of at most {PREEMPT_REASON_BYTES_MAX} bytes"),
        )),
        r => Ok(r),
    }
}

/// Proposes `cmds` in order; the first refused or ignored one answers 409.
async fn propose_all(app: &AppState, cmds: Vec<ControlCommand>) -> Result<(), ApiError> {
    for cmd in cmds {
        match app.control.propose(cmd).await? {
            ControlResponse::Applied => {}
            ControlResponse::Rejected { reason } | ControlResponse::Ignored { reason } => {
                return Err(ApiError(StatusCode::CONFLICT, reason))
            }
            other => return Err(ApiError(StatusCode::CONFLICT, format!("{other:?}"))),
        }
    }
    Ok(())
}

/// `POST /v1/jobs/{id}/preempt`.
pub(super) async fn preempt(
    State(app): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<PreemptRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&app, "preempt jobs")?;
    let id = job_id(&id)?;
    let Json(req) = body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let for_job = match req.for_job.as_deref() {
        Some(f) => Some(job_id(f).map_err(|ApiError(c, m)| ApiError(c, format!("for: {m}")))?),
        None => None,
    };
    if let PreemptAction::Shrink { to_workers: 0 } | PreemptAction::PauseTrials { count: 0 } =
        req.action
    {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            "action: to_workers and count must be at least 1".into(),
        ));
    }
    let ask = Preempt {
        victim: id,
        action: req.action,
        for_job,
        reason: reason_field(req.reason)?,
    };
    let now = wall_ms();
    let cmds = app
        .control
        .read(|s| preempt::execute(s, &ask, now, &mut new_ring_secret))
        .map_err(refused)?;
    propose_all(&app, cmds).await?;
    let done = match ask.action {
        PreemptAction::Shrink { to_workers } => format!("{id} shrinking to {to_workers} workers"),
        PreemptAction::Requeue => format!("{id} checkpointing to be requeued"),
        PreemptAction::PauseTrials { count } => format!("{id}: pausing up to {count} trials"),
    };
    Ok(Json(
        serde_json::json!({ "id": id.to_string(), "done": done }),
    ))
}

/// `POST /v1/jobs/{id}/grow`.
pub(super) async fn grow(
    State(app): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<GrowRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&app, "grow jobs")?;
    let id = job_id(&id)?;
    let Json(req) = body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let reason = reason_field(req.reason)?.unwrap_or_else(|| "capacity returned".into());
    app.control
        .read(|s| preempt::check_grow(s, id, req.to_workers))
        .map_err(refused)?;
    let cmd = ControlCommand::new(
        wall_ms(),
        Op::Grow(ops::Grow {
            id,
            to_workers: req.to_workers,
            reason,
        }),
    );
    propose_all(&app, vec![cmd]).await?;
    let done = format!("{id} growing to {} workers", req.to_workers);
    Ok(Json(
        serde_json::json!({ "id": id.to_string(), "done": done }),
    ))
}
