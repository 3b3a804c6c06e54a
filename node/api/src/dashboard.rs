//! The dashboard: `GET /` on every node serves one self-contained HTML page
//! (`dashboard/index.html`, built into the binary: inline CSS and plain JavaScript, no
//! external requests, so it works on hosts without internet).
//!
//! The page polls the JSON API every 2 s (`/v1/status`, `/v1/queue`, `/v1/datasets`,
//! `/v1/jobs/{id}`, `/v1/jobs/{id}/metrics`) and shows this node, the chief and term; the
//! members with their state, voter and blacklist flags and resources; the jobs with their
//! generation, attempt, ring and generation history; each user's cpus (and GPUs) in use
//! against its quota as a bar, the borrowed part in a lighter shade, a user without a
//! quota against the cluster's capacity (the status's `users` rows, `GET /v1/quotas`'s, and
//! its summary's `capacity`), with GPU-hours against a budget; the waiting jobs in the
//! order they start, with owner, priority, ranks and the scheduler's reason (`/v1/queue`;
//! every token's role reads both); a selected job's loss and accuracy curves
//! (inline SVG); a search's leaderboard and a scatter plot of its trials by one parameter
//! against the metric.
//!
//! The page itself is open (see [`super::auth::OPEN_PATHS`]): it holds no data. With
//! `--token-file`, the API calls it makes need the token: open `http://NODE:PORT/#token=…`.
//! The fragment never leaves the browser (it is not sent with requests); the page moves
//! the token to the tab's `sessionStorage` and removes it from the address bar, then sends
//! it as `Authorization: Bearer …`. Data reaches the DOM as text only, never as markup.

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
};

/// The page, as built into the binary.
pub const INDEX_HTML: &str = include_str!("dashboard/index.html");

/// The page's content security policy: nothing but its own inline script and style, and
/// requests to its own origin (the API).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the dashboard page, with a restrictive content security policy.
pub async fn page() -> Response {
    let mut resp = INDEX_HTML.into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{require_token, ApiToken};
    use axum::{body::Body, extract::Request, http::StatusCode, routing::get, Router};
    use std::sync::Arc;
    use tower::ServiceExt;

    #[tokio::test]
    async fn the_page_is_open_with_a_token_and_carries_its_policy() {
        let token = Arc::new(ApiToken::new("s3cret", "test").unwrap());
        let app = Router::new()
            .route("/", get(page))
            .route("/v1/status", get(|| async { "status" }))
            .layer(axum::middleware::from_fn_with_state(token, require_token));
        let resp = app
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let h = resp.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        let csp = h[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{csp}");
        assert!(csp.contains("connect-src 'self'"), "{csp}");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(body, INDEX_HTML.as_bytes());
        let resp = app
            .oneshot(Request::get("/v1/status").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(
            resp.status(),
            StatusCode::UNAUTHORIZED,
            "the data is not open"
        );
    }

    #[test]
    fn the_page_is_self_contained_and_writes_text_only() {
        // No CDN or other origin: the only absolute URLs are the SVG namespace and the
        // `http://NODE:PORT/#token=…` of the comment on top.
        for (i, _) in INDEX_HTML.match_indices("://") {
            let after = &INDEX_HTML[i..(i + 22).min(INDEX_HTML.len())];
            assert!(
                after.starts_with("://www.w3.org/2000/svg") || after.starts_with("://NODE:PORT/"),
                "an absolute URL in the page: {after}"
            );
        }
        for banned in ["<script src", "<link", "@import", "url("] {
            assert!(
                !INDEX_HTML.contains(banned),
                "the page loads something: {banned}"
            );
        }
        for banned in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!INDEX_HTML.contains(banned), "the page uses {banned}");
        }
        for needed in [
            "/v1/status",
            "/v1/queue",
            "/metrics",
            "sessionStorage",
            "replaceState",
            "#token=",
        ] {
            assert!(INDEX_HTML.contains(needed), "the page lacks {needed}");
        }
    }
}
