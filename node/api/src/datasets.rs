//! The dataset routes: `/v1/datasets`.
//!
//! | route | does |
//! | --- | --- |
//! | `GET /v1/datasets` | every registered dataset with its live holders ([`DatasetDoc`]) |
//! | `POST /v1/datasets` `{"name", "path", "chunk_mib"?}` | adds the file or directory at `path` on this node (blocks while it is copied in); 201 and the dataset |
//! | `DELETE /v1/datasets/{name}` | removes the name; holders delete the content |
//! | `POST /v1/datasets/{name}/get` `{"to": optional dir}` | starts (or joins) a fetch to this node; 202 and its [`FetchStatus`] |
//! | `GET /v1/datasets/{name}/get[?wait_ms=N]` | the latest fetch on this node; with `wait_ms`, answered when the fetch ends or after N ms (at most [`FETCH_WAIT_MS_MAX`]), whichever is first |
//!
//! Who may: a `user` adds and fetches datasets and removes its own (a dataset records the
//! user who added it, `owner`); a `viewer` lists them; an admin does everything
//! (`domain::state::users`).
//!
//! What `path` and `to` may name is bounded per token (`datasets::roots`): a token that is
//! not an admin's reads only below the node's `--dataset-source` roots and writes only
//! below its `--dataset-dest` roots; no token reaches the node's data directory, its store, `/proc`,
//! `/sys` or `/dev`; under `--run-as` both go with the user's file access.
//!
//! Errors: 400 (a bad name or path, a file that cannot be shared), 403 (a path the token
//! may not read or write here; a role that may not; another user's dataset to remove), 404 (no such dataset, or no fetch of it here), 409 (the
//! name exists), 503 (no chief), 500 (this node failed, a full disk included).

use std::time::Duration;

use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    Json,
};
use serde::Deserialize;

use super::{access, ApiError, AppState};
use crate::domain::state::users::{Action, Role};
use ringleader_services::datasets::{fetch::FetchStatus, DatasetDoc, DatasetsError};

impl From<DatasetsError> for ApiError {
    fn from(e: DatasetsError) -> Self {
        let code = match &e {
            DatasetsError::NotFound(_) => StatusCode::NOT_FOUND,
            DatasetsError::Exists(_) => StatusCode::CONFLICT,
            DatasetsError::BadInput(_) => StatusCode::BAD_REQUEST,
            DatasetsError::Refused(_) => StatusCode::FORBIDDEN,
            DatasetsError::Propose(p) => return ApiError::from(p.clone()),
            DatasetsError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError(code, e.to_string())
    }
}

/// `POST /v1/datasets` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddRequest {
    /// The dataset's name.
    pub name: String,
    /// An absolute path on the node.
    pub path: String,
    /// Chunk size in MiB, 1 to 4 (default: by the dataset's size).
    #[serde(default)]
    pub chunk_mib: Option<u32>,
}

/// `POST /v1/datasets/{name}/get` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetRequest {
    /// Also write the files under this absolute directory on the node.
    #[serde(default)]
    pub to: Option<String>,
}

/// Longest `wait_ms` a fetch's status request may wait for the fetch to end, ms.
pub const FETCH_WAIT_MS_MAX: u64 = 10_000;

/// `GET /v1/datasets/{name}/get` query.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// Answer once the fetch has ended, or after this many ms (capped at
    /// [`FETCH_WAIT_MS_MAX`]); default 0: at once.
    #[serde(default)]
    pub wait_ms: u64,
}

pub(super) async fn list(State(app): State<AppState>) -> Json<Vec<DatasetDoc>> {
    Json(app.datasets.list().await)
}

pub(super) async fn add(
    State(app): State<AppState>,
    Json(req): Json<AddRequest>,
) -> Result<(StatusCode, Json<DatasetDoc>), ApiError> {
    // An admin reads any path but the refused ones; anyone else only below the node's
    // `--dataset-source` roots.
    let actor = access::require(&app, Action::AddDataset, &req.name, None)?;
    let doc = app
        .datasets
        .add(
            &req.name,
            std::path::Path::new(&req.path),
            req.chunk_mib.map(|m| m.saturating_mul(1 << 20)),
            (actor.role == Role::Admin, &actor.user),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(doc)))
}

pub(super) async fn remove(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    // No such dataset: the service's 404.
    if let Some(owner) = app
        .control
        .read(|s| s.datasets.get(&name).map(|r| r.owner.clone()))
    {
        let subject = format!("dataset {name:?}");
        access::require(&app, Action::RemoveDataset, &subject, Some(&owner))?;
    }
    app.datasets.remove(&name).await?;
    Ok(Json(serde_json::json!({ "removed": name })))
}

pub(super) async fn get(
    State(app): State<AppState>,
    Path(name): Path<String>,
    body: Option<Json<GetRequest>>,
) -> Result<(StatusCode, Json<FetchStatus>), ApiError> {
    let req = body.map(|Json(r)| r).unwrap_or_default();
    let actor = access::require(
        &app,
        Action::FetchDataset,
        &format!("dataset {name:?}"),
        None,
    )?;
    let fetch = app
        .datasets
        .get(
            &name,
            req.to.map(std::path::PathBuf::from),
            actor.role == Role::Admin,
        )
        .await?;
    Ok((StatusCode::ACCEPTED, Json(fetch.status())))
}

pub(super) async fn get_status(
    State(app): State<AppState>,
    Path(name): Path<String>,
    Query(q): Query<StatusQuery>,
) -> Result<Json<FetchStatus>, ApiError> {
    let wait = Duration::from_millis(q.wait_ms.min(FETCH_WAIT_MS_MAX));
    let status = app.datasets.fetch_status_after(&name, wait).await;
    status.map(Json).ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("no fetch of dataset {name:?} on this node"),
        )
    })
}
