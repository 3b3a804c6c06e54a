//! ringleader's job spec as data: the trainer's tables (`[model]`, `[data]`, `[train]`,
//! `[checkpoint]`, [`TrainSpec`]) and a search's `[search]` table with its algorithms
//! ([`search`]: grid, random, ASHA, Hyperband, TPE, median stopping, as pure functions of
//! the trial table), each problem a [`FieldError`] naming its field.
//!
//! Its place: below both the trainer, which trains what a [`TrainSpec`] says and re-exports
//! this crate (`trainer::TrainSpec`, `trainer::search`), and the node's replicated domain,
//! which stores specs and search records and asks the searcher on every replica. Pure data
//! and rules: serde, toml, rand and blake3 (the search's seeds) only; no candle, no storage,
//! no I/O, so the domain builds and tests without the trainer's dependencies.
#![warn(unreachable_pub)]

mod field_error;
pub mod field_value;
pub mod search;
mod train;

pub use field_error::{closest, edit_distance, read_table, FieldError, SpannedFieldError};
pub use train::{
    check_dataset_name, is_builtin_dataset, Arch, CheckpointSpec, DataSpec, DecayKind,
    GradCompression, LrScaling, ModelSpec, OptimizerKind, SpecError, SufficientFactors,
    TrainParams, TrainSpec, BATCH_PER_WORKER_MAX, BUILTIN_DATASETS, DATASET_NAME_BYTES_MAX,
    HIDDEN_LAYERS_MAX, KERNEL_MAX, LABELS_MAX, SEQ_LEN_MAX, SYNTHETIC_CLASSES_MAX,
    SYNTHETIC_SIDE_MAX, SYNTHETIC_VALUES_MAX, TRANSFORMER_LAYERS_MAX, WIDTH_MAX,
};
