//! A problem with one field of a spec's tables, the error every reader here returns.

/// A problem with one field of a spec's tables: its dotted path (`[i]` for array elements)
/// and what is wrong. Shared by the trainer's tables and the `[search]` table
/// ([`crate::search::SearchError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// Dotted path of the offending (or missing) key: `train.lr`, `model.hidden`,
    /// `search.params[1].max`.
    pub field: String,
    /// What is wrong, lowercase.
    pub problem: String,
    /// Whether the key is one its table does not define (a typo, most often).
    pub unknown: bool,
}

impl FieldError {
    /// An error at `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            problem: problem.into(),
            unknown: false,
        }
    }

    /// `field` is not a key of its table, whose keys are `known`.
    pub fn unknown(field: impl Into<String>, known: &[&str]) -> FieldError {
        let mut known = known.to_vec();
        known.sort_unstable();
        FieldError {
            field: field.into(),
            problem: format!("unknown field (known: {})", known.join(", ")),
            unknown: true,
        }
    }
}
