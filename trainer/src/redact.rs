//! Secrets kept out of logs: a URL with its credentials hidden.
//!
//! A storage URL may carry keys (`s3://bucket?access_key_id=…&secret_access_key=…`, see
//! `checkpoint`'s `operator_from_url`) or a password in its userinfo
//! (`webdav://user:pass@host/…`). [`redact_url`] is what logs and documents print instead:
//! the node's and the workers' (whose logs any API client may read).

/// What a hidden value is replaced by.
pub const REDACTED: &str = "REDACTED";

/// Query keys whose value is hidden: any key containing one of these (ASCII case
/// insensitive).
const SECRET_KEY_PARTS: [&str; 4] = ["key", "secret", "token", "password"];

/// Whether a query key names a secret.
pub fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_KEY_PARTS.iter().any(|p| key.contains(p))
}

/// `url` with the userinfo password and the values of secret-looking query keys (any key
/// containing `key`, `secret`, `token` or `password`) replaced by [`REDACTED`]; the rest
/// (scheme, user, host, path, other query pairs, fragment) is kept as written. Text that is
/// not a URL comes back unchanged except for a `?query`, which is treated the same way.
pub fn redact_url(url: &str) -> String {
    let (before_fragment, fragment) = match url.split_once('#') {
        Some((b, f)) => (b, Some(f)),
        None => (url, None),
    };
    let (base, query) = match before_fragment.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (before_fragment, None),
    };
    let mut out = redact_userinfo(base);
    if let Some(q) = query {
        out.push('?');
        let pairs: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if is_secret_key(k) => format!("{k}={REDACTED}"),
                _ => pair.to_string(),
            })
            .collect();
        out.push_str(&pairs.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// `scheme://user:password@host/…` → `scheme://user:REDACTED@host/…`.
fn redact_userinfo(base: &str) -> String {
    let Some((scheme, rest)) = base.split_once("://") else {
        return base.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:{REDACTED}@{host}{path}"),
            None => base.to_string(),
        },
        None => base.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_secret_query_values_and_passwords() {
        assert_eq!(
            redact_url("s3://bucket/ckpt?region=eu&access_key_id=AKIA1&secret_access_key=s3cr3t"),
            "s3://bucket/ckpt?region=eu&access_key_id=REDACTED&secret_access_key=REDACTED"
        );
        assert_eq!(
            redact_url("webdav://alice:hunter2@dav.example:8080/store?Session_Token=x#frag"),
            "webdav://alice:REDACTED@dav.example:8080/store?Session_Token=REDACTED#frag"
        );
        assert_eq!(
            redact_url("gcs://b?credential_path=/x&password="),
            "gcs://b?credential_path=/x&password=REDACTED"
        );
    }

    #[test]
    fn leaves_plain_urls_alone() {
        for url in [
            "file:///var/lib/ringleader/store",
            "s3://bucket/prefix?region=us-east-1&endpoint=http://minio:9000",
            "webdav://alice@dav.example/store",
            "not a url",
            "",
        ] {
            assert_eq!(redact_url(url), url);
        }
        assert!(!redact_url("s3://b?secret_access_key=abc").contains("abc"));
    }
}
