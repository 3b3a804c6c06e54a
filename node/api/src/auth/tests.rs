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
    use crate::domain::state::{ops, tokens::new_token, ControlCommand, ControlState, Op};
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
        op: Op::TokenCreate(ops::TokenCreate {
            name: "ci".into(),
            hash: hash.clone(),
            created_by: "admin".into(),
            user: None,
            role: Default::default(),
        }),
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
        op: Op::TokenRevoke(ops::TokenRevoke { name: "ci".into() }),
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
