//! Why a line does not parse.

use thiserror::Error;

/// A rank line ([`crate::RankLine`]) that cannot be used. The node logs it (with the line)
/// and ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LineError {
    /// Longer than [`crate::LINE_BYTES_MAX`].
    #[error("line of {bytes} bytes, at most {max}")]
    TooLong {
        /// Bytes in the line.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Not a kind this version knows (its first 40 characters).
    #[error("unknown line kind {0:?}")]
    Kind(String),
    /// The words after the kind are not the kind's shape (which is named).
    #[error("expected {0}")]
    Shape(&'static str),
    /// A required `key=value` field is missing.
    #[error("missing field {0}")]
    Missing(&'static str),
    /// A field's value does not read (a number that is not one, not finite, negative).
    #[error("field {field}: {text:?} does not read")]
    Field {
        /// The field.
        field: &'static str,
        /// Its text (the first 40 characters).
        text: String,
    },
    /// A metric name that is empty, too long or holds whitespace (its first 40 characters).
    #[error("metric name {0:?}: 1 to 128 bytes without whitespace")]
    Name(String),
}

/// A node line ([`crate::NodeLine`]) that cannot be used. The rank logs it and ignores it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NodeLineError {
    /// Longer than [`crate::NODE_LINE_BYTES_MAX`].
    #[error("control line of {bytes} bytes, at most {max}")]
    TooLong {
        /// Bytes read (at least; reading stops past the limit).
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Not UTF-8.
    #[error("control line is not utf-8")]
    NotUtf8,
    /// Neither a generation nor a stop line (the start of the line is quoted).
    #[error(
        "unknown control line {0:?}: want `ringleader-generation {{json}}` or `ringleader-stop`"
    )]
    Unknown(String),
    /// The generation's JSON does not parse.
    #[error("generation line: {0}")]
    Json(String),
    /// The generation parses but is unusable.
    #[error("generation line: {0}")]
    Invalid(String),
}
