//! A job's `[secrets]`: values sealed by the API node that takes the submit, before they
//! enter the Raft log, and opened only by the node that starts a rank.
//!
//! The key is derived from the cluster key ([`SECRETS_KEY_CONTEXT`]), so every member can
//! open what any member sealed and nobody else can: the log, its snapshots, job records and
//! the replicas other hosts keep hold only ciphertext. ChaCha20-Poly1305 with a random
//! 96-bit nonce per value and the variable's name as associated data (a sealed value moved to
//! another name does not open). The text form is `sealed:v1:` then the hex of nonce and
//! ciphertext. A cluster without a key (`--insecure`) refuses `[secrets]` rather than keep
//! them in clear.

use chacha20poly1305::{
    aead::{Aead, KeyInit, Payload},
    ChaCha20Poly1305, Key, Nonce,
};

/// The key-derivation context of the secrets key (changing it makes every sealed value
/// unreadable).
pub const SECRETS_KEY_CONTEXT: &str = "ringleader 2026-11 job secrets v1";

/// What a sealed value starts with.
pub const SEALED_PREFIX: &str = "sealed:v1:";

/// Bytes of a nonce.
const NONCE_BYTES: usize = 12;

/// Why a sealed value did not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Not in the `sealed:v1:HEX` form.
    #[error("secret {name}: not a sealed value")]
    NotSealed {
        /// The variable.
        name: String,
    },
    /// The key or the name is not the one it was sealed with, or the text was altered.
    #[error("secret {name}: does not open with this cluster's key")]
    Forged {
        /// The variable.
        name: String,
    },
}

/// Whether `text` is in the sealed form (says nothing of whether it opens).
pub fn is_sealed(text: &str) -> bool {
    text.strip_prefix(SEALED_PREFIX)
        .is_some_and(|h| h.len() > 2 * NONCE_BYTES && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `value` sealed under `key` for the variable `name`.
pub fn seal(key: &[u8; 32], name: &str, value: &str) -> String {
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: value.as_bytes(),
                aad: name.as_bytes(),
            },
        )
        .expect("ChaCha20-Poly1305 encrypts any length a spec holds");
    let mut out = String::with_capacity(SEALED_PREFIX.len() + 2 * (NONCE_BYTES + sealed.len()));
    out.push_str(SEALED_PREFIX);
    out.push_str(&hex::encode(nonce));
    out.push_str(&hex::encode(sealed));
    out
}

/// The value `sealed` holds for the variable `name`.
pub fn unseal(key: &[u8; 32], name: &str, sealed: &str) -> Result<String, SealError> {
    let not_sealed = || SealError::NotSealed { name: name.into() };
    let forged = || SealError::Forged { name: name.into() };
    if !is_sealed(sealed) {
        return Err(not_sealed());
    }
    let bytes = hex::decode(&sealed[SEALED_PREFIX.len()..]).map_err(|_| not_sealed())?;
    let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    let plain = cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: ciphertext,
                aad: name.as_bytes(),
            },
        )
        .map_err(|_| forged())?;
    String::from_utf8(plain).map_err(|_| forged())
}

/// The value `sealed` holds for `name`, opened with the first of `keys` that opens it (the
/// current key, then the one before a key rotation).
pub fn unseal_any(keys: &[[u8; 32]], name: &str, sealed: &str) -> Result<String, SealError> {
    let mut last = Err(SealError::Forged { name: name.into() });
    for key in keys {
        last = unseal(key, name, sealed);
        if !matches!(last, Err(SealError::Forged { .. })) {
            return last;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_name() {
        let key = [3u8; 32];
        let s = seal(&key, "AWS_SECRET_ACCESS_KEY", "hunter2");
        assert!(is_sealed(&s) && !s.contains("hunter2"), "{s}");
        assert_ne!(
            s,
            seal(&key, "AWS_SECRET_ACCESS_KEY", "hunter2"),
            "fresh nonce"
        );
        assert_eq!(
            unseal(&key, "AWS_SECRET_ACCESS_KEY", &s).unwrap(),
            "hunter2"
        );
        assert!(matches!(
            unseal(&[4u8; 32], "AWS_SECRET_ACCESS_KEY", &s),
            Err(SealError::Forged { .. })
        ));
        assert!(matches!(
            unseal(&key, "OTHER", &s),
            Err(SealError::Forged { .. })
        ));
        let mut altered = s.clone().into_bytes();
        let last = altered.len() - 1;
        altered[last] = if altered[last] == b'0' { b'1' } else { b'0' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(matches!(
            unseal(&key, "AWS_SECRET_ACCESS_KEY", &altered),
            Err(SealError::Forged { .. })
        ));
        assert!(matches!(
            unseal(&key, "A", "hunter2"),
            Err(SealError::NotSealed { .. })
        ));
        assert!(!is_sealed("sealed:v1:zz") && !is_sealed("plain"));
        assert_eq!(unseal(&key, "E", &seal(&key, "E", "")).unwrap(), "");
    }

    #[test]
    fn a_value_sealed_before_a_rotation_opens_with_the_retired_key() {
        let (old, new) = ([1u8; 32], [2u8; 32]);
        let s = seal(&old, "TOKEN", "v");
        assert_eq!(unseal_any(&[new, old], "TOKEN", &s).unwrap(), "v");
        assert!(matches!(
            unseal_any(&[new], "TOKEN", &s),
            Err(SealError::Forged { .. })
        ));
        assert!(matches!(
            unseal_any(&[new, old], "TOKEN", "plain"),
            Err(SealError::NotSealed { .. })
        ));
    }
}
