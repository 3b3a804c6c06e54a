//! Content addresses: BLAKE3 hashes shown (and kept in JSON) as 64 lowercase hex digits. A
//! dataset's [`Root`] (the hash of its manifest's canonical encoding, `datasets::manifest`)
//! is what the replicated registry names; a [`ChunkHash`] addresses one chunk of its files.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! hash_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The hash's 32 bytes.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
        }

        impl From<blake3::Hash> for $name {
            fn from(hash: blake3::Hash) -> Self {
                Self(*hash.as_bytes())
            }
        }

        /// 64 lowercase hex digits.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self)
            }
        }

        /// Exactly 64 hex digits (either case).
        impl FromStr for $name {
            type Err = hex::FromHexError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let mut bytes = [0u8; 32];
                hex::decode_to_slice(s, &mut bytes)?;
                Ok(Self(bytes))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = String::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

hash_type!(
    /// The BLAKE3 hash of one chunk's bytes; in JSON, 64 lowercase hex digits.
    ChunkHash
);

hash_type!(
    /// A dataset's name: the BLAKE3 hash of its manifest's canonical encoding. Displayed
    /// (and in JSON) as 64 lowercase hex digits.
    Root
);
