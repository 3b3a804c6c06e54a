//! The elastic loop's error type.

use thiserror::Error;

use crate::error::TrainError;

/// Why the elastic loop stopped with an error (a re-formable collective failure never
/// ends up here: the loop waits for the next generation instead).
#[derive(Debug, Error)]
pub enum ElasticError {
    /// The trainer failed in a way a new generation does not cure (bad spec, corrupt or
    /// mismatched state, storage, tensor bug).
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The collective failed in a way a new generation does not cure (malformed frames,
    /// invalid configuration, CUDA).
    #[error("collective: {0}")]
    Collective(#[from] collective::CollectiveError),
    /// The generation source failed.
    #[error("generation source: {0}")]
    Source(String),
}
