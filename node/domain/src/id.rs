//! Job ids: `j-` and the base-36 log index of the entry that created the job. A leaf, so
//! that the records of other parts kept in the control state (a search's trials) can name
//! jobs without depending on the state machine.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A job's id: `j-` and the base-36 log index of its `Submit` entry, e.g. `j-2s`.
///
/// Unique within one cluster's log; ordered by submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(u64);

impl JobId {
    /// The id of the job submitted by the log entry at `log_index`.
    pub fn from_log_index(log_index: u64) -> JobId {
        JobId(log_index)
    }

    /// The log index it was derived from.
    pub fn log_index(self) -> u64 {
        self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = Vec::new();
        let mut n = self.0;
        loop {
            digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
            n /= 36;
            if n == 0 {
                break;
            }
        }
        digits.reverse();
        write!(f, "j-{}", String::from_utf8(digits).expect("ascii digits"))
    }
}

/// A string that is not a job id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a job id: {0:?} (expected j- and base-36 digits, e.g. j-2s)")]
pub struct BadJobId(pub String);

impl FromStr for JobId {
    type Err = BadJobId;

    fn from_str(s: &str) -> Result<JobId, BadJobId> {
        let bad = || BadJobId(s.to_owned());
        let digits = s.strip_prefix("j-").ok_or_else(bad)?;
        // Canonical form only: no leading zeros, no upper case, so one id has one spelling.
        if digits.is_empty()
            || (digits.len() > 1 && digits.starts_with('0'))
            || digits.bytes().any(|b| b.is_ascii_uppercase())
        {
            return Err(bad());
        }
        u64::from_str_radix(digits, 36)
            .map(JobId)
            .map_err(|_| bad())
    }
}

impl Serialize for JobId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<JobId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}
