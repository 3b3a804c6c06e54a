//! The cluster key's route: `POST /v1/key/rotate` (the admin token only) rotates the cluster
//! key ([`crate::rotation`]): 200 `{"epoch", "fingerprint", "members"}` once every live
//! member took the new key and the switch is committed; from then on the admin token derived
//! from the old key is refused (401) and `<data-dir>/api.token` on every member holds the new
//! one.
//!
//! Errors: 403 (a token that is not the admin's), 409 (the cluster runs without a key, or
//! another rotation switched first), 503 (a member did not take the key, or no chief:
//! nothing was switched, retry).

use axum::{extract::State, http::StatusCode, Json};

use super::{ApiError, AppState};
use crate::rotation::{self, RotateError};

/// `POST /v1/key/rotate`.
pub(super) async fn rotate(
    State(app): State<AppState>,
) -> Result<Json<rotation::Rotated>, ApiError> {
    super::access::require_admin(&app, "rotate the cluster key")?;
    rotation::rotate(&app.control).await.map(Json).map_err(|e| {
        let status = match e {
            RotateError::Insecure | RotateError::Raced { .. } => StatusCode::CONFLICT,
            RotateError::NotTaken { .. } | RotateError::Switch { .. } | RotateError::Members(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        };
        ApiError(status, e.to_string())
    })
}
