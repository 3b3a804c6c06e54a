//! Bearer-token authentication of the API: the cluster's admin token (derived from the
//! cluster key, see [`crate::security::bootstrap`]) and any `--token-file` beside it, or a
//! token made with `ringleader token create`, whose hash is in the replicated state
//! ([`crate::control::tokens`]; at most [`crate::control::tokens::TOKENS_MAX`]).
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

use crate::control::tokens::Principal;

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
mod tests;
