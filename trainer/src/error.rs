//! The trainer's error type.

use ringleader_spec::{FieldError, SpecError};
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

impl From<SpecError> for TrainError {
    fn from(e: SpecError) -> TrainError {
        match e {
            SpecError::Toml(problem) => TrainError::Spec(problem),
            SpecError::Field(field) => TrainError::Field(field),
        }
    }
}
