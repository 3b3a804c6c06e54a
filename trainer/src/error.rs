//! The trainer's error type.

use thiserror::Error;

/// Everything that can go wrong in the trainer.
///
/// Operator errors (a bad spec, storage unreachable, a peer lost) are kept apart from
/// corruption (a checkpoint that fails its hash) so callers can retry the former and refuse
/// the latter.
#[derive(Debug, Error)]
pub enum TrainError {
    /// The job spec is invalid (message says which field and why).
    #[error("invalid spec: {0}")]
    Spec(String),
    /// A field of the spec's tables is unknown or invalid (which, and why).
    #[error("invalid spec: {0}")]
    Field(#[from] FieldError),
    /// A tensor operation failed (shape mismatch, unsupported op): a bug, not an operator error.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The collective failed (peer lost, aborted, timed out): the generation must be rebuilt.
    #[error("collective: {0}")]
    Collective(#[from] collective::CollectiveError),
    /// Checkpoint storage failed (unreachable, permission, missing object).
    #[error("storage: {0}")]
    Storage(#[from] opendal::Error),
    /// A checkpoint or the shipped data is malformed or fails its integrity check.
    #[error("corrupt {what}: {detail}")]
    Corrupt {
        /// The object (path or name).
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A shared dataset's file is missing, unreadable, too large or not in the expected
    /// format (an operator error: fix the dataset; see [`crate::shared_dataset`]).
    #[error("dataset {path}: {detail}")]
    Dataset {
        /// The file (or directory).
        path: String,
        /// What is wrong with it, naming the tensor where one is at fault.
        detail: String,
    },
    /// A saved train state does not fit this model or run (names, shapes, world).
    #[error("state mismatch: {0}")]
    StateMismatch(String),
    /// The GPU this rank was given cannot be used (no driver or library, not built with
    /// `cuda`) or failed (a CUDA, cuBLAS or NVRTC call); the message names the call.
    #[error("device: {0}")]
    Device(String),
    /// The checkpoint writer task has stopped.
    #[error("checkpoint writer stopped: {0}")]
    WriterStopped(String),
}

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
