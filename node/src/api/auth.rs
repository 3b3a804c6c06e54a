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

use std::{path::Path, sync::Arc};

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

/// Longest token file read, in bytes (a token is a line; this bounds a wrong path).
pub const TOKEN_FILE_BYTES_MAX: u64 = 4_096;

/// How the token file's optional second line starts: `tls sha256:HEX`, the fingerprint of
/// the API's TLS key ([`crate::security::tls`]).
pub const TOKEN_FILE_TLS_PREFIX: &str = "tls ";

/// A token file's text: the token on the first line, then optionally `tls sha256:HEX`
/// (every keyed node writes both to `<data-dir>/api.token`; a file of the operator's
/// choosing holds the token alone). Blank lines after the token are allowed; anything else
/// is refused. The one format the node writes and every reader (the node's `--token-file`,
/// the CLI, `LocalCluster`; `scripts/cluster_api.py` mirrors it) parses.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenFileText {
    /// The token, trimmed.
    pub token: String,
    /// The pin of the API's TLS key, when the file carries one.
    pub tls: Option<crate::security::tls::Fingerprint>,
}

impl std::fmt::Debug for TokenFileText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFileText")
            .field("token", &"REDACTED")
            .field("tls", &self.tls)
            .finish()
    }
}

impl std::fmt::Display for TokenFileText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.token)?;
        if let Some(pin) = &self.tls {
            writeln!(f, "{TOKEN_FILE_TLS_PREFIX}{pin}")?;
        }
        Ok(())
    }
}

/// Why a token file's text was refused (the path is added by [`TokenError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenTextError {
    /// Nothing but whitespace.
    #[error("it is empty")]
    Empty,
    /// The token holds control characters.
    #[error("the token holds control characters")]
    Unprintable,
    /// A line after the token that is neither blank nor `tls sha256:HEX`.
    #[error("line {0} is not `tls sha256:HEX` (a token is one line)")]
    ExtraLine(usize),
    /// A `tls` line whose fingerprint does not parse.
    #[error("line {0}: not a TLS fingerprint (expected tls sha256: and 64 hex digits)")]
    BadFingerprint(usize),
}

impl std::str::FromStr for TokenFileText {
    type Err = TokenTextError;

    fn from_str(text: &str) -> Result<Self, TokenTextError> {
        let mut lines = text
            .lines()
            .enumerate()
            .skip_while(|(_, l)| l.trim().is_empty());
        let token = lines
            .next()
            .map(|(_, l)| l.trim().to_string())
            .ok_or(TokenTextError::Empty)?;
        if token.chars().any(char::is_control) {
            return Err(TokenTextError::Unprintable);
        }
        let mut tls = None;
        for (i, line) in lines {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            match line.strip_prefix(TOKEN_FILE_TLS_PREFIX) {
                Some(pin) if tls.is_none() => {
                    tls = Some(
                        pin.trim()
                            .parse()
                            .map_err(|_| TokenTextError::BadFingerprint(i + 1))?,
                    );
                }
                _ => return Err(TokenTextError::ExtraLine(i + 1)),
            }
        }
        Ok(TokenFileText { token, tls })
    }
}

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
    /// A line after the token is not `tls sha256:HEX`.
    #[error("token file {path}: {why}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        why: TokenTextError,
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

    /// Reads the token from `path` (its first line; a `tls` line after it is allowed, see
    /// [`TokenFileText`]): at most [`TOKEN_FILE_BYTES_MAX`] bytes, trimmed, not empty, and the file readable and writable by its owner only (like an ssh key: a
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
        let parsed = text.parse::<TokenFileText>().map_err(|why| match why {
            TokenTextError::Empty => TokenError::Empty { path: name.clone() },
            TokenTextError::Unprintable => TokenError::Unprintable { path: name.clone() },
            why => TokenError::Format {
                path: name.clone(),
                why,
            },
        })?;
        ApiToken::new(&parsed.token, &name)
    }

    /// Whether `given` is one of the tokens, in time independent of where they differ and
    /// of their lengths (BLAKE3 hashes compared in constant time, every one of them).
    pub fn matches(&self, given: &str) -> bool {
        self.matches_hash(&blake3::hash(given.as_bytes()))
    }

    /// Whether a token whose hash is `given` is one of these (constant time, every hash).
    pub fn matches_hash(&self, given: &blake3::Hash) -> bool {
        self.hashes
            .iter()
            .fold(false, |any, h| (*h == *given) | any)
    }
}

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
