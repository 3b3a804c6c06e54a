//! The checkpoint routes: a command rank's `ringleader.checkpoint.save`/`load`, through its
//! own node, into its place in the node's storage ([`crate::jobs::checkpoint`]).
//!
//! | route | does |
//! | --- | --- |
//! | `PUT /v1/checkpoints/job/{job}/{name}` | stores the body (at most [`CHECKPOINT_BYTES_MAX`]) as `jobs/<job>/files/<name>`; 204 |
//! | `GET /v1/checkpoints/job/{job}/{name}` | the bytes, or 404 |
//! | `PUT`/`GET /v1/checkpoints/trial/{search}/{trial}/{name}` | the same in `experiments/<search>/trials/<trial>/files/` |
//!
//! These routes are not behind the API token: the caller shows the place's capability
//! (`Authorization: Bearer <RINGLEADER_CHECKPOINT_TOKEN>`), which opens that place and
//! nothing else (the API's token check refuses it everywhere else, as it refuses any wrong
//! token). Missing: 401; another place's, or an API token: 403; a bad name: 400; a body
//! over the limit: 413; the store failed (a full disk included): 500, and the previous
//! object is kept, since a write goes to a temporary object renamed into place where the
//! store can rename (an S3 `PUT` replaces an object whole).

use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, Path, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use tracing::warn;

use super::{ApiError, AppState};
use crate::{
    domain::state::JobId,
    jobs::checkpoint::{allows, check_name, Place, CHECKPOINT_BYTES_MAX},
};

/// The checkpoint routes, with their own body limit and no API-token layer.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/checkpoints/job/{job}/{name}",
            get(get_job).put(put_job),
        )
        .route(
            "/v1/checkpoints/trial/{search}/{trial}/{name}",
            get(get_trial).put(put_trial),
        )
        .layer(DefaultBodyLimit::max(CHECKPOINT_BYTES_MAX))
}

fn job_place(job: &str) -> Result<Place, ApiError> {
    Ok(Place::Job(super::job_id(job)?))
}

fn trial_place(search: &str, trial: &str) -> Result<Place, ApiError> {
    let search: JobId = super::job_id(search)?;
    let trial = trial.parse().map_err(|_| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("{trial:?} is not a trial number"),
        )
    })?;
    Ok(Place::Trial { search, trial })
}

async fn put_job(
    State(app): State<AppState>,
    Path((job, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    store(&app, job_place(&job)?, &name, &headers, body).await
}

async fn get_job(
    State(app): State<AppState>,
    Path((job, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    load(&app, job_place(&job)?, &name, &headers).await
}

async fn put_trial(
    State(app): State<AppState>,
    Path((search, trial, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    store(&app, trial_place(&search, &trial)?, &name, &headers, body).await
}

async fn get_trial(
    State(app): State<AppState>,
    Path((search, trial, name)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    load(&app, trial_place(&search, &trial)?, &name, &headers).await
}

/// Checks the request's capability for `place` and the name; gives the object's path.
fn authorize(
    app: &AppState,
    place: &Place,
    name: &str,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing checkpoint token: send Authorization: Bearer $RINGLEADER_CHECKPOINT_TOKEN"
                .into(),
        ));
    };
    let given = super::auth::bearer(value).unwrap_or("");
    let Some(grant) = allows(&app.checkpoint_key, place, given) else {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "this token does not open the checkpoint place {}",
                place.dir()
            ),
        ));
    };
    if !app
        .control
        .read(|s| grant.is_current(s.job(grant.job), place))
    {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "this checkpoint token has expired: job {} generation {} is over",
                grant.job, grant.generation
            ),
        ));
    }
    check_name(name).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(format!("{}{name}", place.dir()))
}

fn operator(app: &AppState) -> Result<opendal::Operator, ApiError> {
    trainer::operator_from_url(&app.node_storage).map_err(|e| {
        ApiError(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checkpoint storage: {e}"),
        )
    })
}

fn store_failed(path: &str, e: opendal::Error) -> ApiError {
    warn!(path, error = %e, "checkpoint store failed");
    ApiError(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "checkpoint {path}: the store failed ({}); the previous one is kept",
            e.kind()
        ),
    )
}

/// Writes `body` at the place: to a temporary object first, renamed into place, where the
/// store can rename (a `file://` store), so a failure (a full disk) keeps the previous one.
async fn store(
    app: &AppState,
    place: Place,
    name: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let path = authorize(app, &place, name, headers)?;
    let op = operator(app)?;
    if op.info().capability().rename {
        let tmp = format!(
            "{}.partial/{name}.{:016x}",
            place.dir().trim_end_matches('/'),
            rand::random::<u64>()
        );
        let written = match op.write(&tmp, body).await {
            Ok(_) => op.rename(&tmp, &path).await,
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            let _ = op.delete(&tmp).await;
            return Err(store_failed(&path, e));
        }
    } else {
        op.write(&path, body)
            .await
            .map_err(|e| store_failed(&path, e))?;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn load(
    app: &AppState,
    place: Place,
    name: &str,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let path = authorize(app, &place, name, headers)?;
    let op = operator(app)?;
    match op.read(&path).await {
        Ok(buf) => Ok((
            [(header::CONTENT_TYPE, "application/octet-stream")],
            buf.to_bytes(),
        )
            .into_response()),
        Err(e) if e.kind() == opendal::ErrorKind::NotFound => Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no checkpoint {name:?} in {}", place.dir()),
        )),
        Err(e) => Err(store_failed(&path, e)),
    }
}
