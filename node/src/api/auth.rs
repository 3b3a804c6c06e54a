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

    /// An app behind the admin token `admin` and the replicated tokens in `state`, whose
    /// `/whoami` answers the principal the handler runs as.
    fn replicated_app(
        admin: &str,
        state: Arc<std::sync::Mutex<crate::domain::ControlState>>,
    ) -> Router {
        let gate = Gate {
            admin: Some(Arc::new(ApiToken::new(admin, "test").unwrap())),
            replicated: Arc::new(move || state.lock().unwrap().token_hashes()),
        };
        Router::new()
            .route("/whoami", get(|| async { Principal::current().describe() }))
            .layer(axum::middleware::from_fn_with_state(gate, require_token))
    }

    #[tokio::test]
    async fn middleware_accepts_replicated_tokens_until_revoked() {
        use crate::domain::state::{tokens::new_token, ControlCommand, ControlState, Op};
        let state = Arc::new(std::sync::Mutex::new(ControlState::default()));
        let (token, hash) = new_token();
        let bearer = format!("Bearer {token}");
        let (code, _) = call(
            replicated_app("adm", state.clone()),
            "/whoami",
            Some(bearer.as_str()),
        )
        .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED, "not created yet");
        let create = ControlCommand {
            op: Op::TokenCreate {
                name: "ci".into(),
                hash: hash.clone(),
                created_by: "admin".into(),
            },
            at_ms: 1,
        };
        state.lock().unwrap().apply(1, &create);
        let (code, body) = call(
            replicated_app("adm", state.clone()),
            "/whoami",
            Some(bearer.as_str()),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(body, format!("token:{}", &hash[..8]));
        let (code, body) = call(
            replicated_app("adm", state.clone()),
            "/whoami",
            Some("Bearer adm"),
        )
        .await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "admin"));
        // The hash itself is no token.
        let by_hash = format!("Bearer {hash}");
        let (code, _) = call(
            replicated_app("adm", state.clone()),
            "/whoami",
            Some(by_hash.as_str()),
        )
        .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        let revoke = ControlCommand {
            op: Op::TokenRevoke { name: "ci".into() },
            at_ms: 2,
        };
        state.lock().unwrap().apply(2, &revoke);
        let (code, body) = call(
            replicated_app("adm", state),
            "/whoami",
            Some(bearer.as_str()),
        )
        .await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        assert!(body.contains("wrong"), "{body}");
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
    fn token_file_text_round_trips_and_refuses_strays() {
        let pin: crate::security::tls::Fingerprint =
            format!("sha256:{}", "ab".repeat(32)).parse().unwrap();
        for doc in [
            TokenFileText {
                token: "tok".into(),
                tls: None,
            },
            TokenFileText {
                token: "tok".into(),
                tls: Some(pin),
            },
        ] {
            let text = doc.to_string();
            assert_eq!(text.parse::<TokenFileText>().unwrap(), doc, "{text}");
        }
        // The golden line every reader (the CLI, cluster_api.py) expects.
        let golden = format!("tok\ntls sha256:{}\n", "ab".repeat(32));
        assert_eq!(
            TokenFileText {
                token: "tok".into(),
                tls: Some(pin)
            }
            .to_string(),
            golden
        );
        assert_eq!("  tok \n\n".parse::<TokenFileText>().unwrap().token, "tok");
        for (bad, want) in [
            ("", TokenTextError::Empty),
            ("tok\nother\n", TokenTextError::ExtraLine(2)),
            ("tok\ntls sha256:00\n", TokenTextError::BadFingerprint(2)),
            ("a\u{7}b", TokenTextError::Unprintable),
        ] {
            assert_eq!(bad.parse::<TokenFileText>().unwrap_err(), want, "{bad:?}");
        }
        let secret = golden.replace("tok", "s3cret");
        let shown = format!("{:?}", secret.parse::<TokenFileText>().unwrap());
        assert!(!shown.contains("s3cret"), "{shown}");
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
