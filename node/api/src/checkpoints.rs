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
//! token). A `GET` may show an API token instead: its user reads the checkpoints of what it
//! owns (a trial's are its search's owner's), an admin any (`domain::state::users`,
//! `Action::ReadCheckpoints`); another user's job answers 403 naming its owner (`j-7
//! belongs to alice; bob may not fetch its checkpoints`). An API token never writes.
//! Missing: 401; another place's capability, an expired one, or an API token for a `PUT`:
//! 403; a bad name: 400; a body over the limit: 413; the store failed (a full disk included): 500, and the
//! previous object is kept, since a write goes to a temporary object renamed into place
//! where the store can rename (an S3 `PUT` replaces an object whole).
//!
//! A `PUT` is answered on its path and headers before a byte of its body is read: the
//! capability, the name, a `Content-Length` over [`CHECKPOINT_BYTES_MAX`] (413), and a
//! slot among the bodies received at once ([`super::uploads`]: 429 for the peer's share,
//! 503 for the node's). Only then is the body read, a frame at a time, straight into a
//! store writer (never collected in memory), and cut at [`CHECKPOINT_BYTES_MAX`] (413, the
//! partial object deleted). An unauthorized upload of any size costs the node its headers.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Extension, Path, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};
use futures::StreamExt as _;
use tracing::warn;

use super::{
    server::PeerIp,
    uploads::{NoSlot, UploadSlot, Uploads},
    ApiError, AppState,
};
use crate::{
    domain::state::{tokens::Principal, users::Action, JobId},
    jobs::checkpoint::{allows, check_name, Place, CHECKPOINT_BYTES_MAX},
};

/// The checkpoint routes, with their own body limit, their upload slots and no API-token
/// layer.
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
        .layer(Extension(Arc::new(Uploads::default())))
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

/// What a `PUT` needs besides its place: the node's upload slots and its peer.
type Upload = (Extension<Arc<Uploads>>, Option<Extension<PeerIp>>);

async fn put_job(
    State(app): State<AppState>,
    Path((job, name)): Path<(String, String)>,
    upload: Upload,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let slot = admit(&app, &job_place(&job)?, &name, &headers, upload)?;
    store(&app, job_place(&job)?, &name, slot, body).await
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
    upload: Upload,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let place = trial_place(&search, &trial)?;
    let slot = admit(&app, &place, &name, &headers, upload)?;
    store(&app, place, &name, slot, body).await
}

/// Answers a `PUT` on its path and headers alone, its body unread: the capability and
/// the name ([`authorize`]), the announced length, then a slot among the bodies received
/// at once.
fn admit(
    app: &AppState,
    place: &Place,
    name: &str,
    headers: &HeaderMap,
    (Extension(uploads), peer): Upload,
) -> Result<UploadSlot, ApiError> {
    authorize(app, place, name, headers)?;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > CHECKPOINT_BYTES_MAX as u64) {
        return Err(too_large());
    }
    let peer = peer.map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |Extension(p)| p.0);
    uploads.take(peer).map_err(|e| {
        let code = match e {
            NoSlot::Peer { .. } => StatusCode::TOO_MANY_REQUESTS,
            NoSlot::Node { .. } => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError(code, e.to_string())
    })
}

fn too_large() -> ApiError {
    ApiError(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("a checkpoint holds at most {CHECKPOINT_BYTES_MAX} bytes"),
    )
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

/// Streams `body` to the place, a frame at a time: to a temporary object first, renamed
/// into place, where the store can rename (a `file://` store), so a failure (a full disk, a
/// body over the limit, a connection gone) keeps the previous one. `_slot` is held until
/// the body is in.
async fn store(
    app: &AppState,
    place: Place,
    name: &str,
    _slot: UploadSlot,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let path = format!("{}{name}", place.dir());
    let op = operator(app)?;
    let rename = op.info().capability().rename;
    let target = if rename {
        format!(
            "{}.partial/{name}.{:016x}",
            place.dir().trim_end_matches('/'),
            rand::random::<u64>()
        )
    } else {
        path.clone()
    };
    let streamed = stream_to(&op, &target, body).await;
    let written = match streamed {
        Ok(()) if rename => op
            .rename(&target, &path)
            .await
            .map_err(|e| store_failed(&path, e)),
        other => other,
    };
    if written.is_err() && rename {
        let _ = op.delete(&target).await;
    }
    written.map(|()| StatusCode::NO_CONTENT)
}

/// Writes `body` as the object `path`, cutting it at [`CHECKPOINT_BYTES_MAX`].
async fn stream_to(op: &opendal::Operator, path: &str, body: Body) -> Result<(), ApiError> {
    let mut writer = op.writer(path).await.map_err(|e| store_failed(path, e))?;
    let mut frames = body.into_data_stream();
    let mut received = 0usize;
    while let Some(frame) = frames.next().await {
        let bytes = match frame {
            Ok(bytes) => bytes,
            Err(e) => {
                let _ = writer.abort().await;
                return Err(ApiError(
                    StatusCode::BAD_REQUEST,
                    format!("checkpoint {path}: the body did not arrive whole ({e})"),
                ));
            }
        };
        received += bytes.len();
        if received > CHECKPOINT_BYTES_MAX {
            let _ = writer.abort().await;
            return Err(too_large());
        }
        if let Err(e) = writer.write(bytes).await {
            let _ = writer.abort().await;
            return Err(store_failed(path, e));
        }
    }
    writer
        .close()
        .await
        .map(drop)
        .map_err(|e| store_failed(path, e))
}

/// A `GET`'s authorization: the place's capability, or else an API token whose user may
/// fetch the checkpoints of the place's job ([`Action::ReadCheckpoints`]).
fn authorize_read(
    app: &AppState,
    place: &Place,
    name: &str,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    let refused = match authorize(app, place, name, headers) {
        Ok(path) => return Ok(path),
        Err(e) if e.0 == StatusCode::FORBIDDEN => e,
        Err(e) => return Err(e),
    };
    let principal = match &app.token {
        None => Principal::Admin,
        Some(admin) => {
            let hashes = app.control.read(|s| s.token_hashes());
            match super::auth::check(admin, &hashes, headers) {
                Ok(p) => p,
                // Neither a capability of this place nor an API token.
                Err(_) => return Err(refused),
            }
        }
    };
    let job = match place {
        Place::Job(id) => *id,
        Place::Trial { search, .. } => *search,
    };
    let (actor, owner) = app
        .control
        .read(|s| (s.actor(&principal), s.job(job).map(|j| j.owner.clone())));
    let actor = actor.ok_or(refused)?;
    let owner = owner.ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no job {job}")))?;
    actor
        .may(Action::ReadCheckpoints, Some(&owner))
        .map_err(|r| ApiError(StatusCode::FORBIDDEN, r.message(&job.to_string())))?;
    check_name(name).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
    Ok(format!("{}{name}", place.dir()))
}

async fn load(
    app: &AppState,
    place: Place,
    name: &str,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let path = authorize_read(app, &place, name, headers)?;
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
