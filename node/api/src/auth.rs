//! Bearer-token authentication of the API: the cluster's admin token (derived from the
//! cluster key, see [`crate::security::bootstrap`]) and any `--token-file` beside it, or a
//! token made with `ringleader token create`, whose hash is in the replicated state
//! ([`crate::domain::state::tokens`]; at most [`crate::domain::state::tokens::TOKENS_MAX`]).
//!
//! The middleware ([`require_token`]) finds who the request acts as, a
//! [`Principal`] (the admin, or a replicated token by its hash), and runs the handler inside
//! [`Principal::scope`]: what the handler forwards to other nodes carries it. Only the admin
//! makes and revokes tokens and removes members (the handlers check [`Principal::current`]).
//! A revoked token is refused as soon as this node's replica applies the revocation.
//!
//! Every route except [`OPEN_PATHS`] (`/healthz`, `/`) needs
//! `Authorization: Bearer <token>`; anything else gets 401 with `{"error": "…", "reason":
//! "missing" | "wrong"}` and a `WWW-Authenticate: Bearer` header (RFC 6750). Tokens are
//! compared through their BLAKE3 hashes, whose equality is constant-time, so neither the
//! token's bytes nor its length leak through timing. The node keeps only the hash: the
//! token itself is never stored past start-up, printed or logged.
//!
//! Without a token the API is open to anyone who can reach its address: only under
//! `--insecure`, which the node, `status` and the dashboard say.

use std::sync::Arc;

use axum::{
    extract::{FromRef, Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    Json,
};

use crate::domain::state::tokens::Principal;

/// Paths served without a token: liveness probes and the landing page.
pub const OPEN_PATHS: [&str; 2] = ["/healthz", "/"];

pub use crate::security::api_token::{
    ApiToken, TokenError, TokenFileText, TokenTextError, TOKEN_FILE_BYTES_MAX,
    TOKEN_FILE_TLS_PREFIX,
};

/// The replicated tokens' hashes as this node's replica holds them now.
pub type ReplicatedHashes = Arc<dyn Fn() -> Vec<blake3::Hash> + Send + Sync>;

/// What [`require_token`] checks a request against.
#[derive(Clone)]
pub struct Gate {
    /// The admin token (and `--token-file`'s); `None`: an open API (`--insecure` without a
    /// token file), where every caller is the admin.
    pub admin: Option<Arc<ApiToken>>,
    /// The replicated tokens' hashes, read at each request.
    pub replicated: ReplicatedHashes,
}

impl FromRef<Arc<ApiToken>> for Gate {
    /// A gate of the admin token alone (no replicated tokens).
    fn from_ref(admin: &Arc<ApiToken>) -> Gate {
        Gate {
            admin: Some(admin.clone()),
            replicated: Arc::new(Vec::<blake3::Hash>::new),
        }
    }
}

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization` header.
    Missing,
    /// A header that is not `Bearer <the token>`.
    Wrong,
}

impl Denied {
    /// The `reason` field of the 401 answer.
    pub fn as_str(self) -> &'static str {
        match self {
            Denied::Missing => "missing",
            Denied::Wrong => "wrong",
        }
    }

    /// The `error` field of the 401 answer.
    pub fn message(self) -> &'static str {
        match self {
            Denied::Missing => {
                "missing API token: this node wants an Authorization: Bearer <token> header"
            }
            Denied::Wrong => "wrong API token",
        }
    }
}

impl IntoResponse for Denied {
    fn into_response(self) -> Response {
        let challenge = match self {
            Denied::Missing => "Bearer",
            Denied::Wrong => "Bearer error=\"invalid_token\"",
        };
        let mut resp = (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": self.message(), "reason": self.as_str() })),
        )
            .into_response();
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
        resp
    }
}

/// The token of an `Authorization: Bearer TOKEN` header value (the scheme in any case),
/// or `None` when the value is not one.
pub fn bearer(value: &axum::http::HeaderValue) -> Option<&str> {
    let (scheme, rest) = value.to_str().ok()?.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Checks a request's headers against the admin `token` and the `replicated` tokens'
/// hashes: the pure core of [`require_token`]. Every hash is compared, in constant time, so
/// the answer's timing says nothing of which matched.
pub fn check(
    token: &ApiToken,
    replicated: &[blake3::Hash],
    headers: &HeaderMap,
) -> Result<Principal, Denied> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Denied::Missing);
    };
    let given = bearer(value).ok_or(Denied::Wrong)?;
    let given = blake3::hash(given.as_bytes());
    let admin = token.matches_hash(&given);
    let replicated = replicated.iter().fold(false, |any, h| (*h == given) | any);
    match (admin, replicated) {
        (true, _) => Ok(Principal::Admin),
        (false, true) => Ok(Principal::Token {
            hash: given.to_hex().to_string(),
        }),
        (false, false) => Err(Denied::Wrong),
    }
}

/// The axum middleware: passes [`OPEN_PATHS`], and requests with a token it accepts, run
/// as the token's [`Principal`] (also in the request's extensions); answers 401 to the rest.
pub async fn require_token(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    let principal = match &gate.admin {
        None => Principal::Admin,
        Some(admin) => match check(admin, &(gate.replicated)(), req.headers()) {
            Ok(p) => p,
            Err(denied) => return denied.into_response(),
        },
    };
    req.extensions_mut().insert(principal.clone());
    principal.scope(next.run(req)).await
}

#[cfg(test)]
mod tests;
