//! The HTTP JSON API (axum). The CLI is a client of it.
//!
//! | route | does |
//! | --- | --- |
//! | `GET /` | the dashboard ([`dashboard`]); open even with a token, its API calls send it |
//! | `GET /v1/status[?member_state=S&job_state=S&limit=N&members_after=NAME&jobs_before=ID]` | this
//! node, chief and term, a page of members and of jobs, a summary ([`listing`]) |
//! | `POST /v1/jobs` (body: the TOML spec, or with `Content-Type: application/json` an object with
//! its keys) | validates and commits a job; `{"id": …}` |
//! | `GET /v1/jobs[?state=S&limit=N&before=ID]` | a page of job summaries, oldest first;
//! `x-ringleader-next-before` names the next page ([`listing`]) |
//! | `GET /v1/jobs/{id}` | one job |
//! | `POST /v1/jobs/{id}/cancel` | cancels a job |
//! | `POST /v1/jobs/{id}/preempt`, `POST /v1/jobs/{id}/grow` | shrinks, requeues or pauses the
//! trials of a running job; lets a shrunk ring grow back ([`preempt`]; the admin token only) |
//! | `GET /v1/jobs/{id}/logs?offsets=W:N,…[&generation=G]` | the current run's logs (with
//! `generation`, the past run placed in generation `G`), one chunk per rank, read from byte `N` of
//! worker `W`'s log; `runs`: the generation each run was placed in |
//! | `GET /v1/jobs/{id}/metrics` | each metric's history: `{"id": …, "metrics": {"loss": [[step,
//! value], …]}}` |
//! | `/v1/datasets…` | datasets shared peer to peer ([`datasets`]) |
//! | `GET`/`POST /v1/tokens`, `DELETE /v1/tokens/{name}` | API tokens ([`tokens`]; making and
//! revoking them: the admin token only) |
//! | `POST /v1/members/{id}/remove` | removes a member (id or name) for good (the admin token only)
//! |
//! | `GET`/`POST /v1/quotas`, `GET /v1/queue` | quotas (setting one: the admin token only) and the
//! waiting jobs in start order ([`sharing`]) |
//! | `POST /v1/key/rotate` | a new cluster key for every live member, none for a removed one; the
//! admin token changes with it ([`keys`]; the admin token only) |
//! | `GET /metrics` | Prometheus text exposition ([`prometheus`]) |
//! | `GET /healthz` | `ok`; open even with a token |
//! | `PUT`/`GET /v1/checkpoints/…` | a command rank's checkpoints ([`checkpoints`]; a place's
//! capability, not the API token) |
//!
//! Who may do what (`access`, the rules of `domain::state::users`): an admin (the admin
//! token, a token of role admin) everything; a `user` submits, reads every job's summary
//! and cancels, reads the logs and metrics of, and fetches the checkpoints of what it owns
//! (a job's `owner` is the submitting token's user); a `viewer` reads summaries. A job
//! another user owns is shown to a `user` or `viewer` as its summary: its metrics and its
//! search's trial values are left out.
//!
//! Errors are `{"error": "…"}` with 400 (bad input), 401 (API token missing or wrong, see
//! [`auth`]), 403 (the token's user or role may not: the message names the owner, as
//! `j-7 belongs to alice; bob may not cancel it`), 404 (no such job), 429 (the user's
//! pending jobs or spec bytes at their limit, [`quota`]) or 503 (no chief or chief
//! unreachable: retry). A refused
//! spec (`POST /v1/jobs`) adds `"field"` (dotted path) and `"line"` (1-based), each null
//! where unknown.
//!
//! - [`listing`]: filters, pages and the summary of the status and job lists at size.
//! - [`datasets`]: the dataset routes.
//! - [`checkpoints`]: command ranks' checkpoints, behind their place's capability.
//! - [`dashboard`]: the single-page dashboard served at `/`.
//! - [`auth`]: the bearer-token middleware (`ringleader node --token-file`).
//! - `access`: the request's user and role, and the ownership checks of each route.
//! - [`quota`]: each user's pending jobs and spec bytes, bounded at submit.
//! - [`tokens`]: the token and member-removal routes.
//! - [`sharing`]: the quota and queue routes; the scheduler's checks at submit.
//! - [`preempt`]: the admin's preemption and grow routes.
//! - [`keys`]: the key rotation route (`POST /v1/key/rotate`, the admin only).
//! - [`prometheus`]: the `/metrics` exposition, written by hand.
//! - [`redact`]: URLs with their credentials hidden, for logs.
//! - [`server`]: the accept loop in front of the router: connection caps, timeouts, header
//!   size, per-IP rate; then [`origin`]: only the node's own `Host` and `Origin` (403 else).
//! - [`status`]: the documents the API returns (`status`, `job`, `logs`), the user-facing
//!   contract (docs/book/src/reference/json.md); fields may be added, never renamed.
//! - [`client`]: the CLI's HTTP client for these routes.
//!
//! May use: `control` (reads, proposals), `cluster` (the member view), `jobs` (admitting a
//! spec), `datasets` (the service), `rotation` (a key rotation). Used by: `cli`, the node's
//! start-up.
//!
//! A crate of its own, `ringleader-api` (`node/api/`), above `ringleader-services`; the node's
//! `lib.rs` re-exports it as `api`. Its root names the crates and parts below under their
//! parts' names (`cluster`, `tasks`, `domain`, `control`, `jobs`, `rotation`, `security`, as
//! the node does), so its files read `crate::control::…` as they did inside the node; the
//! dataset service is `ringleader_services::datasets` (here `datasets` is the API's routes).

#![warn(unreachable_pub)]

use ringleader_cluster as cluster;
use ringleader_cluster::tasks;
use ringleader_control as control;
use ringleader_domain as domain;
use ringleader_services::{jobs, rotation, security};

mod access;
pub mod auth;
pub mod budget;
pub mod checkpoints;
pub mod client;
pub mod dashboard;
pub mod datasets;
pub mod keys;
/// Filters, pages and the summary of the status and job lists (a child of `status`).
pub use status::listing;
pub mod origin;
pub mod preempt;
pub mod prometheus;
pub mod quota;
pub mod redact;
pub mod server;
pub mod sharing;
pub mod status;
pub mod tokens;
pub mod uploads;

use std::{collections::BTreeMap, sync::Arc};

use axum::{
    extract::{DefaultBodyLimit, Path, Query, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use serde::Deserialize;

use crate::{
    cluster::net::NodeHandle,
    control::{
        handle::{wall_ms, ControlHandle, LogsError},
        protocol::ProposeError,
    },
    domain::{
        spec::SPEC_BYTES_MAX,
        state::{
            ops,
            user_limits::OVER_LIMIT,
            users::{Action, Role},
            ControlCommand, ControlResponse, JobId, Op,
        },
    },
    status::{job_doc, JobDoc, JobSummary, LogsDoc, MetricsDoc, StatusDoc},
};

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// The membership event loop's handle (the member view).
    pub node: NodeHandle,
    /// The control plane's handle (reads, proposals).
    pub control: ControlHandle,
    /// The dataset service.
    pub datasets: ringleader_services::datasets::Datasets,
    /// The storage URL, where ended jobs' records are (`jobs::archive`).
    pub storage: String,
    /// The API token; `None`: the API is open (see [`auth`]).
    pub token: Option<Arc<auth::ApiToken>>,
    /// Whether the node runs an open cluster (`--insecure`): shown by `status` and the
    /// dashboard.
    pub insecure: bool,
    /// The fingerprint of the API's TLS key (`sha256:HEX`) when it speaks TLS beyond
    /// loopback ([`server::tls_for`]): shown by `status`.
    pub api_tls: Option<String>,
    /// The key a spec's `[secrets]` are sealed with (derived from the cluster key; `None`
    /// under `--insecure`, where `[secrets]` are refused).
    pub secrets_key: Option<crate::cluster::key_ring::DerivedKey>,
    /// The checkpoint capability key ([`crate::jobs::checkpoint`]).
    pub checkpoint_key: [u8; 32],
    /// The storage URL the node itself writes with (`--run-as`: through renames, see
    /// `security::run_as::RunAs::node_storage`): where checkpoints go.
    pub node_storage: String,
    /// Each user's limits on pending jobs and spec bytes ([`quota`]).
    pub user_limits: quota::UserLimits,
    /// The interpreter with the package that `Client.launch` uses by default
    /// (`--python`): shown by `status`.
    pub python: Option<String>,
}

/// An error answer: status and message.
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> Self {
        let code = match e {
            ProposeError::Rejected(_) => StatusCode::BAD_REQUEST,
            ProposeError::NoChief | ProposeError::Unreachable(_) | ProposeError::Stopped(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError(code, e.to_string())
    }
}

type ApiResult<T> = Result<Json<T>, ApiError>;

/// A submit's error: a refused spec answers `{"error", "field", "line"}` (400; `field` and
/// `line` null where unknown), anything else as [`ApiError`].
enum SubmitError {
    Spec(crate::jobs::AdmitError),
    Api(ApiError),
}

impl From<ApiError> for SubmitError {
    fn from(e: ApiError) -> Self {
        SubmitError::Api(e)
    }
}

impl From<ProposeError> for SubmitError {
    fn from(e: ProposeError) -> Self {
        SubmitError::Api(e.into())
    }
}

impl IntoResponse for SubmitError {
    fn into_response(self) -> Response {
        match self {
            SubmitError::Spec(e) => (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({ "error": e.message, "field": e.field, "line": e.line })),
            )
                .into_response(),
            SubmitError::Api(e) => e.into_response(),
        }
    }
}

/// Routes of the API, behind [`auth::require_token`] (which, without a token, lets every
/// caller in as the admin).
pub fn router(state: AppState) -> Router {
    let control = state.control.clone();
    let gate = auth::Gate {
        admin: state.token.clone(),
        replicated: Arc::new(move || control.read(|s| s.token_hashes())),
    };
    let routes = Router::new()
        .route("/", get(dashboard::page))
        .route("/v1/status", get(status))
        .route("/v1/jobs", get(jobs).post(submit))
        .route("/v1/jobs/{id}", get(job))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/jobs/{id}/preempt", post(preempt::preempt))
        .route("/v1/jobs/{id}/grow", post(preempt::grow))
        .route("/v1/jobs/{id}/logs", get(logs))
        .route("/v1/jobs/{id}/metrics", get(job_metrics))
        .route("/v1/datasets", get(datasets::list).post(datasets::add))
        .route(
            "/v1/datasets/{name}",
            axum::routing::delete(datasets::remove),
        )
        .route(
            "/v1/datasets/{name}/get",
            get(datasets::get_status).post(datasets::get),
        )
        .route("/v1/tokens", get(tokens::list).post(tokens::create))
        .route("/v1/tokens/{name}", axum::routing::delete(tokens::revoke))
        .route("/v1/members/{id}/remove", post(tokens::remove_member))
        .route("/v1/key/rotate", post(keys::rotate))
        .route("/v1/quotas", get(sharing::list).post(sharing::set))
        .route("/v1/queue", get(sharing::queue))
        .route("/metrics", get(prometheus_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(SPEC_BYTES_MAX))
        .layer(axum::Extension(Arc::new(quota::SubmitQuota::new(
            state.user_limits,
        ))))
        .layer(axum::middleware::from_fn_with_state(
            gate,
            auth::require_token,
        ))
        // Merged after the token layer: these routes take their place's capability instead.
        .merge(checkpoints::routes());
    routes.with_state(state)
}

fn job_id(id: &str) -> Result<JobId, ApiError> {
    id.parse().map_err(|_| {
        ApiError(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a job id (like j-1a)"),
        )
    })
}

/// `GET /v1/status[?member_state=…&job_state=…&limit=N&members_after=NAME&jobs_before=ID]`:
/// a page of each list and the summary ([`listing`]).
async fn status(
    State(app): State<AppState>,
    Query(q): Query<listing::StatusQuery>,
) -> ApiResult<StatusDoc> {
    let mut doc = status_doc(&app).await?;
    app.control
        .read(|s| listing::page_status(&mut doc, s, &q))
        .map_err(bad_query)?;
    summaries_only(&app, &mut doc.jobs)?;
    let now = wall_ms();
    doc.users = app.control.read(|s| sharing::quota_rows(s, now));
    Ok(Json(doc))
}

/// Takes the progress out of the rows of jobs whose metrics the request's actor may not
/// read (as [`JobDoc::summary_only`] does to a job's document).
fn summaries_only(app: &AppState, rows: &mut [JobSummary]) -> Result<(), ApiError> {
    let actor = access::actor(app)?;
    for row in rows {
        if actor.may(Action::ReadMetrics, Some(&row.owner)).is_err() {
            row.summary_only();
        }
    }
    Ok(())
}

fn bad_query(e: listing::BadQuery) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, e.to_string())
}

/// This node's status document: its member view, the chief and term (no jobs: see
/// [`listing::page_status`]).
async fn status_doc(app: &AppState) -> Result<StatusDoc, ApiError> {
    let view = app
        .node
        .view()
        .await
        .map_err(|e| ApiError(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    let mut doc = StatusDoc::from_view(&view);
    let (chief, term) = app.control.chief();
    let voters = app.control.voters();
    doc.chief = chief;
    doc.term = Some(term);
    doc.control_fault = app.control.fault();
    doc.insecure = app.insecure;
    doc.api_tls = app.api_tls.clone();
    doc.python = app.python.clone();
    let blacklist = app.control.read(|s| s.blacklist.clone());
    let removed = app.control.read(|s| s.removed.clone());
    let now = wall_ms();
    for m in &mut doc.members {
        m.voter = voters.contains(&m.id);
        if removed.contains_key(&m.id) {
            m.state = "removed".into();
        }
        if let Some(b) = blacklist.get(&m.id).filter(|b| b.until_ms > now) {
            m.blacklisted = true;
            m.blacklist_reason = Some(format!(
                "{} (until {} ms, strike {})",
                b.reason, b.until_ms, b.strikes
            ));
        }
    }
    Ok(doc)
}

/// `GET /metrics`: the Prometheus exposition of this node's view.
async fn prometheus_metrics(State(app): State<AppState>) -> Result<Response, ApiError> {
    let doc = status_doc(&app).await?;
    let jobs = app.control.read(|s| {
        s.jobs
            .values()
            .map(|j| {
                let metrics: BTreeMap<String, f64> = j
                    .metrics
                    .iter()
                    .map(|(k, m)| (k.clone(), m.value))
                    .collect();
                let step = metrics
                    .get("step")
                    .map(|v| v.max(0.0) as u64)
                    .or_else(|| j.metrics.values().filter_map(|m| m.step).max());
                prometheus::JobSample {
                    id: j.id.to_string(),
                    name: j.spec.name.clone(),
                    kind: j.spec.kind.to_string(),
                    state: j.state.to_string(),
                    step,
                    metrics,
                }
            })
            .collect::<Vec<_>>()
    });
    let mut text = prometheus::render(&doc, &jobs);
    let now = wall_ms();
    let sharing = app.control.read(|s| {
        let mut sample = prometheus::SharingSample::default();
        for row in sharing::quota_rows(s, now) {
            let quota = [row.quota.cpus, row.quota.gpus];
            for (i, resource) in ["cpus", "gpus"].into_iter().enumerate() {
                let (used, borrowed) = match i {
                    0 => (row.used.cpus, row.borrowed.cpus),
                    _ => (row.used.gpus, row.borrowed.gpus),
                };
                let user = &row.user;
                sample
                    .user_resources
                    .push((user.clone(), resource, "used", used));
                sample
                    .user_resources
                    .push((user.clone(), resource, "borrowed", borrowed));
                if let Some(q) = quota[i] {
                    sample
                        .user_resources
                        .push((user.clone(), resource, "quota", u64::from(q)));
                }
            }
        }
        for job in s.pending() {
            let label = crate::domain::spec::priority::label(job.spec.priority);
            *sample.queue_jobs.entry(label).or_default() += 1;
        }
        sample
    });
    text.push_str(&prometheus::render_sharing(&sharing));
    text.push_str(&prometheus::render_datasets(&prometheus::DatasetSample {
        served_bytes: app.datasets.served_bytes(),
        fetched_bytes: app.datasets.fetched_bytes(),
        registered: app.control.read(|s| s.datasets.len()),
    }));
    text.push_str(&prometheus::render_preemptions(
        &app.control.read(|s| s.preemptions.clone()),
    ));
    Ok(([(header::CONTENT_TYPE, prometheus::CONTENT_TYPE)], text).into_response())
}

/// `GET /v1/jobs/{id}/metrics`: each metric's history.
async fn job_metrics(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<MetricsDoc> {
    let id = job_id(&id)?;
    access::require_on_job(&app, id, Action::ReadMetrics).await?;
    app.control
        .read(|s| s.job(id).map(MetricsDoc::of))
        .map(Json)
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no job {id}")))
}

#[derive(Deserialize)]
struct SubmitQuery {
    /// Idempotency token: a retried submit with the same token gets the same job.
    token: Option<String>,
}

/// How long a submit keeps retrying while there is no chief, in milliseconds: long enough
/// for an election (a new chief is known within about 3 s), short enough that the minority
/// side of a partition refuses writes promptly.
const SUBMIT_RETRY_MS: u64 = 4_000;
/// Pause between those retries, in milliseconds.
const SUBMIT_RETRY_PAUSE_MS: u64 = 200;

/// Validates and commits a job, owned by the request's user. The write carries an
/// idempotency token (the client's, or one made here), so retrying it through an election
/// commits the job once: the answer is either the job's id or a clear retryable error,
/// never a duplicate job.
async fn submit(
    State(app): State<AppState>,
    axum::Extension(quota): axum::Extension<Arc<quota::SubmitQuota>>,
    q: Query<SubmitQuery>,
    headers: header::HeaderMap,
    body: String,
) -> Result<Json<serde_json::Value>, SubmitError> {
    let actor = access::require(&app, Action::Submit, "the cluster", None)?;
    let spec = admit_spec(&app, &headers, body, &actor).await?;
    // A user's submits are held to its limits ([`quota`]); an admin's are not.
    let charge = if actor.role == Role::Admin {
        None
    } else {
        let held = app.control.read(|s| s.usage(&actor.user));
        let charge = quota
            .charge(&actor.user, quota::spec_bytes(&spec), held)
            .map_err(|e| ApiError(StatusCode::TOO_MANY_REQUESTS, e.to_string()))?;
        Some(charge)
    };
    let answer = propose_submit(&app, q, spec, &actor.user).await;
    if let Some(charge) = charge {
        quota.done(&actor.user, charge);
    }
    answer
}

/// Admits and seals a spec (the body: TOML, or JSON by its `Content-Type`) through
/// [`crate::jobs::admission::admit_submit`]; this only maps its refusals to HTTP.
async fn admit_spec(
    app: &AppState,
    headers: &header::HeaderMap,
    body: String,
    actor: &crate::domain::state::users::Actor,
) -> Result<crate::domain::spec::JobSpec, SubmitError> {
    use crate::jobs::admission::{admit_submit, Refused, SubmitContext};
    // `Content-Type: application/json`: an object with the TOML's keys; anything else is
    // the TOML text (curl's default form type included).
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    let members = sharing::member_sizes(app).await;
    let context = SubmitContext {
        actor,
        secrets_key: app.secrets_key.as_ref(),
        datasets: &app.datasets,
        control: &app.control,
        members: &members,
    };
    admit_submit(body, json, context)
        .await
        .map_err(|refused| match refused {
            Refused::Spec(e) => SubmitError::Spec(e),
            Refused::NoSecretsKey(e) => SubmitError::Api(ApiError(StatusCode::BAD_REQUEST, e)),
            Refused::Role(e) => SubmitError::Api(ApiError(StatusCode::FORBIDDEN, e)),
            Refused::Failed(e) => SubmitError::Api(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e)),
        })
}

/// Proposes an admitted spec as `owner`'s job: the answer with the new job's id.
async fn propose_submit(
    app: &AppState,
    Query(q): Query<SubmitQuery>,
    spec: crate::domain::spec::JobSpec,
    owner: &str,
) -> Result<Json<serde_json::Value>, SubmitError> {
    let token = q
        .token
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    let cmd = ControlCommand {
        op: Op::Submit(ops::Submit {
            spec: Box::new(spec),
            token: Some(token),
            owner: owner.to_owned(),
        }),
        at_ms: wall_ms(),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(SUBMIT_RETRY_MS);
    let answer = loop {
        match app.control.propose(cmd.clone()).await {
            Err(ProposeError::NoChief | ProposeError::Unreachable(_))
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(SUBMIT_RETRY_PAUSE_MS)).await;
            }
            // The chief counted the user's jobs past a limit this replica had not seen yet.
            Err(ProposeError::Rejected(reason)) if reason.contains(OVER_LIMIT) => {
                return Err(ApiError(StatusCode::TOO_MANY_REQUESTS, reason).into())
            }
            other => break other?,
        }
    };
    match answer {
        ControlResponse::Submitted { id } => Ok(Json(
            serde_json::json!({ "id": id.to_string(), "owner": owner }),
        )),
        other => Err(SubmitError::Api(ApiError(
            StatusCode::BAD_REQUEST,
            format!("not submitted: {other:?}"),
        ))),
    }
}

/// The header that carries `GET /v1/jobs`'s next (older) page's `before`.
pub const NEXT_BEFORE_HEADER: &str = "x-ringleader-next-before";

/// `GET /v1/jobs[?state=…&limit=N&before=ID]`: a page of job summaries, oldest first;
/// [`NEXT_BEFORE_HEADER`] names the next page's `before` while older jobs remain.
async fn jobs(
    State(app): State<AppState>,
    Query(q): Query<listing::JobsQuery>,
) -> Result<Response, ApiError> {
    let (mut page, next) = app
        .control
        .read(|s| listing::jobs(s, &q))
        .map_err(bad_query)?;
    summaries_only(&app, &mut page)?;
    let mut resp = Json(page).into_response();
    if let Some(next) = next.and_then(|n| header::HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert(NEXT_BEFORE_HEADER, next);
    }
    Ok(resp)
}

/// `GET /v1/jobs/{id}`: the whole document to whoever may read the job's metrics (its
/// owner, an admin), its summary to everyone else ([`JobDoc::summary_only`]).
async fn job(State(app): State<AppState>, Path(id): Path<String>) -> ApiResult<JobDoc> {
    let id = job_id(&id)?;
    let actor = access::require(&app, Action::ReadSummary, &id.to_string(), None)?;
    let (applied_index, chief) = app.control.freshness();
    let mut doc = match app
        .control
        .read(|s| s.job(id).map(|j| job_doc(j, applied_index, chief)))
    {
        Some(doc) => doc,
        // Compacted out of the live state: its record in the store.
        None => match crate::jobs::archive::read_record(&app.storage, id).await {
            Some(job) => {
                let mut doc = job_doc(&job, applied_index, chief);
                doc.freshness.served_by = "archive".into();
                doc
            }
            None => return Err(ApiError(StatusCode::NOT_FOUND, format!("no job {id}"))),
        },
    };
    if actor.may(Action::ReadMetrics, Some(&doc.owner)).is_err() {
        doc.summary_only();
    }
    Ok(Json(doc))
}

async fn cancel(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = job_id(&id)?;
    access::require_on_job(&app, id, Action::Cancel).await?;
    match app
        .control
        .propose(ControlCommand {
            op: Op::Cancel(ops::Cancel { id }),
            at_ms: wall_ms(),
        })
        .await?
    {
        ControlResponse::Applied => Ok(Json(
            serde_json::json!({ "id": id.to_string(), "state": "cancelled" }),
        )),
        ControlResponse::Rejected { reason } | ControlResponse::Ignored { reason } => {
            Err(ApiError(StatusCode::BAD_REQUEST, reason))
        }
        other => Err(ApiError(StatusCode::BAD_REQUEST, format!("{other:?}"))),
    }
}

#[derive(Deserialize)]
struct LogsQuery {
    /// `worker:offset` pairs, comma separated (worker ids equal ranks until an elastic
    /// ring re-forms).
    offsets: Option<String>,
    /// A past run's logs: the generation it was placed in (one of the answer's `runs`).
    generation: Option<u32>,
}

async fn logs(
    State(app): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> ApiResult<LogsDoc> {
    let id = job_id(&id)?;
    access::require_on_job(&app, id, Action::ReadLogs).await?;
    let mut offsets = BTreeMap::new();
    for pair in q
        .offsets
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let parsed = pair
            .split_once(':')
            .and_then(|(r, o)| Some((r.parse::<u32>().ok()?, o.parse::<u64>().ok()?)));
        let (rank, offset) = parsed.ok_or_else(|| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("offsets: {pair:?} is not worker:offset"),
            )
        })?;
        offsets.insert(rank, offset);
    }
    let read = app
        .control
        .logs(id, &offsets, q.generation)
        .await
        .map_err(|e| match e {
            LogsError::NoJob => ApiError(StatusCode::NOT_FOUND, format!("no job {id}")),
            LogsError::NoRun { .. } => ApiError(StatusCode::NOT_FOUND, format!("job {id}: {e}")),
        })?;
    Ok(Json(LogsDoc {
        id: id.to_string(),
        state: read.state.to_string(),
        runs: read.runs,
        chunks: read.chunks,
    }))
}
