//! Who a request acts as, and whether it may do what it asks: the API's use of the pure
//! rules of `domain::state::users`.
//!
//! [`auth`](super::auth) found the request's [`Principal`]; here it becomes an [`Actor`]
//! (user and role) through this node's replica of the token registry, and each handler asks
//! [`require`] (or [`require_on_job`]) before it acts. A refusal is `403` naming the
//! subject's owner (`j-7 belongs to alice; bob may not cancel it`). The node forwards the
//! principal with its writes and log reads, and the chief and the member holding a log ask
//! the same rules again (`control::rpc::authorize_principal`).

use axum::http::StatusCode;

use super::{ApiError, AppState};
use crate::domain::state::{
    tokens::Principal,
    users::{Action, Actor},
    JobId,
};

/// The actor of the request this task serves: the admin for the admin token, an open API
/// and the node itself; a replicated token's user and role. A token revoked since the
/// request was let in: 401.
pub(super) fn actor(app: &AppState) -> Result<Actor, ApiError> {
    let principal = Principal::current();
    app.control.read(|s| s.actor(&principal)).ok_or_else(|| {
        ApiError(
            StatusCode::UNAUTHORIZED,
            "the API token of this request was revoked".into(),
        )
    })
}

/// The actor, if it may do `action` to `subject` (a job id, a dataset's name) owned by
/// `owner`; 403 naming the owner otherwise.
pub(super) fn require(
    app: &AppState,
    action: Action,
    subject: &str,
    owner: Option<&str>,
) -> Result<Actor, ApiError> {
    let actor = actor(app)?;
    actor
        .may(action, owner)
        .map_err(|r| ApiError(StatusCode::FORBIDDEN, r.message(subject)))?;
    Ok(actor)
}

/// Longest a request naming a job waits for this replica to apply the job's submit, in
/// milliseconds: a job submitted through another node (or just now through this one, whose
/// proposal returned once the chief applied it) may be a heartbeat away here.
pub(crate) const JOB_CATCH_UP_MS: u64 = 2_000;

/// [`require`] on job `id`, owned as the live state says (once this replica applied the
/// job's submit, waited for up to [`JOB_CATCH_UP_MS`]); 404 for a job the state does not
/// hold.
pub(super) async fn require_on_job(
    app: &AppState,
    id: JobId,
    action: Action,
) -> Result<Actor, ApiError> {
    if app.control.read(|s| s.job(id).is_none()) {
        let bound = std::time::Duration::from_millis(JOB_CATCH_UP_MS);
        app.control.applied_up_to(id.log_index(), bound).await;
    }
    let owner = app
        .control
        .read(|s| s.job(id).map(|j| j.owner.clone()))
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no job {id}")))?;
    require(app, action, &id.to_string(), Some(&owner))
}

/// Refuses anyone but an admin (the admin token, or a token of role admin): `what` is
/// what they asked to do.
pub(super) fn require_admin(app: &AppState, what: &str) -> Result<Actor, ApiError> {
    let actor = actor(app)?;
    match actor.may(Action::Administer, None) {
        Ok(()) => Ok(actor),
        Err(_) => Err(ApiError(
            StatusCode::FORBIDDEN,
            format!(
                "only the admin token or one of role admin may {what} (this request came with {}: user {}, role {})",
                Principal::current().describe(),
                actor.user,
                actor.role
            ),
        )),
    }
}
