//! The HTTP JSON API (axum). The CLI is a client of it.

use axum::{extract::State, http::StatusCode, routing::get, Json, Router};

use crate::{net::NodeHandle, status::StatusDoc};

/// Routes of the API.
pub fn router(node: NodeHandle) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(node)
}

async fn status(State(node): State<NodeHandle>) -> Result<Json<StatusDoc>, (StatusCode, String)> {
    node.status()
        .await
        .map(Json)
        .map_err(|e| (StatusCode::SERVICE_UNAVAILABLE, e.to_string()))
}
