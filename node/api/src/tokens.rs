//! The token and member routes: the cluster's access list, changed by the admin only.
//!
//! | route | does |
//! | --- | --- |
//! | `POST /v1/tokens` `{"name", "user"?, "role"?}` | makes a random token named `name` for `user` (default: `name`) with `role` (`admin`, `user` or `viewer`; default `user`; see `domain::state::users`); 201 `{"name", "user", "role", "token", "created_at_ms"}`: the token is shown this once, the cluster keeps its hash |
//! | `GET /v1/tokens` | `[{"name", "user", "role", "created_at_ms", "created_by", "hash_prefix"}]` |
//! | `DELETE /v1/tokens/{name}` | revokes the token: every node refuses it once its replica applies the revocation |
//! | `POST /v1/members/{id}/remove` | removes the member (peer id or name) from the cluster for good |
//!
//! Errors: 400 (a bad name, user or role: `name: …`, `user: …`, `role: …`), 403 (a token
//! that is not an admin's asks for a change), 404 (no such token or member), 409 (the name exists; the member is the chief),
//! 503 (no chief).

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Json,
};
use serde::Deserialize;

use super::{access::require_admin, ApiError, AppState};
use crate::control::handle::wall_ms;
use crate::domain::state::{
    ops,
    tokens::{check_token_name, check_user, listing, new_token},
    users::Role,
    ControlCommand, ControlResponse, Op,
};

/// `POST /v1/tokens` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    /// The token's name (letters, digits, `.`, `_`, `-`; at most 64 bytes).
    pub name: String,
    /// The user it belongs to (the same rule; default: `name`).
    #[serde(default)]
    pub user: Option<String>,
    /// `admin`, `user` or `viewer` (default `user`).
    #[serde(default)]
    pub role: Option<String>,
}

/// This node's name, for the record of who made a token.
async fn node_name(app: &AppState) -> String {
    app.node
        .view()
        .await
        .ok()
        .and_then(|v| {
            super::status::StatusDoc::from_view(&v)
                .members
                .into_iter()
                .find(|m| m.is_self)
                .map(|m| m.name)
        })
        .unwrap_or_default()
}

fn bad_name(e: String) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, e)
}

pub(super) async fn create(
    State(app): State<AppState>,
    Json(req): Json<CreateRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let admin = require_admin(&app, "create tokens")?;
    check_token_name(&req.name).map_err(bad_name)?;
    let role: Role = match req.role.as_deref() {
        Some(r) => r.parse().map_err(bad_name)?,
        None => Role::User,
    };
    let user = req.user.clone().unwrap_or_else(|| req.name.clone());
    check_user(&user, role).map_err(bad_name)?;
    let (token, hash) = new_token();
    let at_ms = wall_ms();
    let cmd = ControlCommand {
        op: Op::TokenCreate(ops::TokenCreate {
            name: req.name.clone(),
            hash,
            created_by: format!("{}@{}", admin.user, node_name(&app).await),
            user: Some(user.clone()),
            role,
        }),
        at_ms,
    };
    match app.control.propose(cmd).await? {
        ControlResponse::Applied => Ok((
            StatusCode::CREATED,
            Json(serde_json::json!({
                "name": req.name,
                "user": user,
                "role": role,
                "token": token,
                "created_at_ms": at_ms,
            })),
        )),
        ControlResponse::Rejected { reason } if reason.contains("exists") => {
            Err(ApiError(StatusCode::CONFLICT, reason))
        }
        ControlResponse::Rejected { reason } | ControlResponse::Ignored { reason } => {
            Err(ApiError(StatusCode::BAD_REQUEST, reason))
        }
        other => Err(ApiError(StatusCode::BAD_REQUEST, format!("{other:?}"))),
    }
}

pub(super) async fn list(State(app): State<AppState>) -> Json<Vec<serde_json::Value>> {
    Json(app.control.read(|s| listing(&s.api_tokens)))
}

pub(super) async fn revoke(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&app, "revoke tokens")?;
    check_token_name(&name).map_err(bad_name)?;
    let cmd = ControlCommand {
        op: Op::TokenRevoke(ops::TokenRevoke { name: name.clone() }),
        at_ms: wall_ms(),
    };
    match app.control.propose(cmd).await? {
        ControlResponse::Applied => Ok(Json(serde_json::json!({ "revoked": name }))),
        ControlResponse::Ignored { reason } => Err(ApiError(StatusCode::NOT_FOUND, reason)),
        ControlResponse::Rejected { reason } => Err(ApiError(StatusCode::BAD_REQUEST, reason)),
        other => Err(ApiError(StatusCode::BAD_REQUEST, format!("{other:?}"))),
    }
}

pub(super) async fn remove_member(
    State(app): State<AppState>,
    Path(member): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    require_admin(&app, "remove members")?;
    let view = app
        .node
        .view()
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let doc = super::status::StatusDoc::from_view(&view);
    let matching: Vec<(String, String)> = doc
        .members
        .iter()
        .filter(|m| m.id == member || m.name == member)
        .map(|m| (m.id.clone(), m.name.clone()))
        .collect();
    let (peer_id, name) = match matching.as_slice() {
        [one] => one.clone(),
        [] if member.parse::<libp2p::PeerId>().is_ok() => (member.clone(), String::new()),
        [] => {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no member {member:?} (give a name or peer id from `ringleader status`)"),
            ))
        }
        _ => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!(
                    "{} members are named {member:?}: give the peer id",
                    matching.len()
                ),
            ))
        }
    };
    if app.control.chief().0.is_some_and(|c| c.id == peer_id) {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "{member} is the chief: stop its node (another becomes chief) and remove it then"
            ),
        ));
    }
    let cmd = ControlCommand {
        op: Op::MemberRemove(ops::MemberRemove {
            peer_id: peer_id.clone(),
            name: name.clone(),
        }),
        at_ms: wall_ms(),
    };
    match app.control.propose(cmd).await? {
        ControlResponse::Applied | ControlResponse::Ignored { .. } => Ok(Json(
            serde_json::json!({ "removed": peer_id, "name": name }),
        )),
        ControlResponse::Rejected { reason } => Err(ApiError(StatusCode::BAD_REQUEST, reason)),
        other => Err(ApiError(StatusCode::BAD_REQUEST, format!("{other:?}"))),
    }
}
