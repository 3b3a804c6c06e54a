//! Bearer-token authentication of the API: the cluster's admin token (derived from the
//! cluster key, see [`crate::security::bootstrap`]) and any `--token-file` beside it.
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

use std::{path::Path, sync::Arc};

use axum::{
    extract::{Request, State},
    http::{header, HeaderMap, HeaderValue, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
    Json,
};

/// Paths served without a token: liveness probes and the landing page.
pub const OPEN_PATHS: [&str; 2] = ["/healthz", "/"];

/// Longest token file read, in bytes (a token is a line; this bounds a wrong path).
pub const TOKEN_FILE_BYTES_MAX: u64 = 4_096;

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("reading token file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file holds no token (only whitespace).
    #[error("token file {path} is empty")]
    Empty {
        /// The file.
        path: String,
    },
    /// The file is longer than [`TOKEN_FILE_BYTES_MAX`].
    #[error("token file {path} is larger than {TOKEN_FILE_BYTES_MAX} bytes")]
    TooLarge {
        /// The file.
        path: String,
    },
    /// The token holds control characters, which cannot travel in an HTTP header.
    #[error("token file {path}: the token holds control characters")]
    Unprintable {
        /// The file.
        path: String,
    },
    /// Others than the owner may read or write the file.
    #[error("token file {path} is open to group or others (mode {mode:o}): chmod 600 {path}")]
    Readable {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
}

/// The tokens the API accepts, kept as their hashes. `Debug` shows nothing of them.
#[derive(Clone)]
pub struct ApiToken {
    hashes: Vec<blake3::Hash>,
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiToken(REDACTED)")
    }
}

impl ApiToken {
    /// A token from its text, trimmed of surrounding whitespace; refuses an empty or
    /// unprintable one (`path` names the source in errors).
    pub fn new(text: &str, path: &str) -> Result<Self, TokenError> {
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty { path: path.into() });
        }
        if token.chars().any(char::is_control) {
            return Err(TokenError::Unprintable { path: path.into() });
        }
        Ok(ApiToken {
            hashes: vec![blake3::hash(token.as_bytes())],
        })
    }

    /// These tokens and `other`'s: a request with any of them passes.
    pub fn or(mut self, other: ApiToken) -> ApiToken {
        self.hashes.extend(other.hashes);
        self
    }

    /// Reads the token from `path`: at most [`TOKEN_FILE_BYTES_MAX`] bytes, trimmed, not
    /// empty, and the file readable and writable by its owner only (like an ssh key: a
    /// world-writable token file lets any local user choose the token).
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        use std::os::unix::fs::PermissionsExt;
        let name = path.display().to_string();
        let read_err = |source| TokenError::Read {
            path: name.clone(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o066 != 0 {
            return Err(TokenError::Readable { path: name, mode });
        }
        if meta.len() > TOKEN_FILE_BYTES_MAX {
            return Err(TokenError::TooLarge { path: name });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        ApiToken::new(&text, &name)
    }

    /// Whether `given` is one of the tokens, in time independent of where they differ and
    /// of their lengths (BLAKE3 hashes compared in constant time, every one of them).
    pub fn matches(&self, given: &str) -> bool {
        let given = blake3::hash(given.as_bytes());
        self.hashes.iter().fold(false, |any, h| (*h == given) | any)
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

/// Checks a request's headers against `token`: the pure core of [`require_token`].
pub fn check(token: &ApiToken, headers: &HeaderMap) -> Result<(), Denied> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(Denied::Missing);
    };
    let given = value
        .to_str()
        .ok()
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .ok_or(Denied::Wrong)?;
    if token.matches(given) {
        Ok(())
    } else {
        Err(Denied::Wrong)
    }
}

/// The axum middleware: passes [`OPEN_PATHS`] and requests with the token, answers 401 to
/// the rest.
pub async fn require_token(
    State(token): State<Arc<ApiToken>>,
    req: Request,
    next: Next,
) -> Response {
    if OPEN_PATHS.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    match check(&token, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(denied) => denied.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{body::Body, routing::get, Router};
    use tower::ServiceExt;

    fn app(token: &str) -> Router {
        let token = Arc::new(ApiToken::new(token, "test").unwrap());
        Router::new()
            .route("/v1/status", get(|| async { "status" }))
            .route("/metrics", get(|| async { "metrics" }))
            .route("/healthz", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(token, require_token))
    }

    async fn call(app: Router, path: &str, auth: Option<&str>) -> (StatusCode, String) {
        let mut req = Request::builder().uri(path);
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    #[tokio::test]
    async fn middleware_refuses_missing_and_wrong_tokens() {
        let (code, body) = call(app("s3cret"), "/v1/status", None).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["reason"], "missing");
        assert!(v["error"].as_str().unwrap().contains("missing"), "{body}");

        for bad in [
            "Bearer nope",
            "Bearer s3cret2",
            "Basic czNjcmV0",
            "Bearer",
            "s3cret",
        ] {
            let (code, body) = call(app("s3cret"), "/metrics", Some(bad)).await;
            assert_eq!(code, StatusCode::UNAUTHORIZED, "{bad}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["reason"], "wrong", "{bad}");
            assert!(
                !body.contains("s3cret"),
                "the answer never echoes the token"
            );
        }
    }

    #[tokio::test]
    async fn middleware_passes_the_right_token_and_open_paths() {
        let (code, body) = call(app("s3cret"), "/v1/status", Some("Bearer s3cret")).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "status"));
        let (code, _) = call(app("s3cret"), "/metrics", Some("bearer  s3cret ")).await;
        assert_eq!(code, StatusCode::OK);
        let (code, body) = call(app("s3cret"), "/healthz", None).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "ok"));
    }

    #[test]
    fn tokens_are_trimmed_and_never_empty() {
        let t = ApiToken::new("  abc\n", "f").unwrap();
        assert!(t.matches("abc"));
        assert!(!t.matches("abc "));
        assert!(!t.matches(""));
        assert!(matches!(
            ApiToken::new(" \n\t", "f"),
            Err(TokenError::Empty { .. })
        ));
        assert!(matches!(
            ApiToken::new("a\u{7}b", "f"),
            Err(TokenError::Unprintable { .. })
        ));
        assert_eq!(format!("{t:?}"), "ApiToken(REDACTED)");
    }

    #[test]
    fn token_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "tok\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = ApiToken::from_file(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o602)).unwrap();
        let err = ApiToken::from_file(&path).unwrap_err();
        assert!(
            err.to_string().contains("chmod 600"),
            "world-writable: {err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ApiToken::from_file(&path).unwrap().matches("tok"));
        std::fs::write(&path, "\n").unwrap();
        assert!(matches!(
            ApiToken::from_file(&path),
            Err(TokenError::Empty { .. })
        ));
    }
}
