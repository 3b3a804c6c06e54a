//! Secrets kept out of logs: the node prints storage URLs through [`redact_url`], whose rules
//! live in `trainer::redact` (train workers print the same URLs into their logs).

pub use trainer::redact::{redact_url, REDACTED};
