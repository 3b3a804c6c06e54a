//! The API's tokens as the node holds them: the admin token and any `--token-file` beside
//! it ([`ApiToken`], kept as hashes), and the token file's format ([`TokenFileText`]: the
//! token, then optionally the pin of the API's TLS key). Below the API (`api::auth` checks
//! requests against them) so that the node's bootstrap can write and read them.

use std::path::Path;

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

/// The tokens the API accepts, kept as their hashes. `Debug` shows nothing of them. Shared
/// by the API (behind an `Arc`) and changed in place by a key rotation
/// ([`ApiToken::replace`]): the admin token derived from the old key stops matching at once.
pub struct ApiToken {
    hashes: std::sync::RwLock<Vec<blake3::Hash>>,
}

impl Clone for ApiToken {
    fn clone(&self) -> Self {
        ApiToken {
            hashes: std::sync::RwLock::new(self.hashes()),
        }
    }
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
            hashes: std::sync::RwLock::new(vec![blake3::hash(token.as_bytes())]),
        })
    }

    /// These tokens and `other`'s: a request with any of them passes.
    pub fn or(self, other: ApiToken) -> ApiToken {
        let mut hashes = self.hashes();
        hashes.extend(other.hashes());
        ApiToken {
            hashes: std::sync::RwLock::new(hashes),
        }
    }

    fn hashes(&self) -> Vec<blake3::Hash> {
        self.hashes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Accepts `new` in place of `old` from now on (a key rotation's new admin token in
    /// place of the old one's); nothing if `old` is not one of these tokens.
    pub fn replace(&self, old: &str, new: &str) {
        let (old, new) = (blake3::hash(old.as_bytes()), blake3::hash(new.as_bytes()));
        let mut hashes = self.hashes.write().unwrap_or_else(|e| e.into_inner());
        for h in hashes.iter_mut().filter(|h| **h == old) {
            *h = new;
        }
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
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .fold(false, |any, h| (*h == *given) | any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_token_stops_matching_and_its_successor_matches() {
        let t = ApiToken::new("old-admin", "t")
            .unwrap()
            .or(ApiToken::new("mine", "f").unwrap());
        let shared = std::sync::Arc::new(t);
        let seen_by_the_api = shared.clone();
        shared.replace("old-admin", "new-admin");
        assert!(!seen_by_the_api.matches("old-admin"));
        assert!(seen_by_the_api.matches("new-admin"));
        assert!(
            seen_by_the_api.matches("mine"),
            "the --token-file token stays"
        );
        shared.replace("absent", "other");
        assert!(!seen_by_the_api.matches("other"));
    }
}
