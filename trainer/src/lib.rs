//! ringleader's trainer: candle models, data, optimizers and the data-parallel loop.
//!
//! It sits between `collective` (which it uses to average gradients) and the node (which
//! uses it to run the workers of a job; this crate never depends on the node). A job's
//! `[model]`, `[data]`, `[train]` and `[checkpoint]` tables deserialize into [`TrainSpec`];
//! [`Trainer::new`] builds the model ([`Model`]: MLP, LeNet-like CNN or a small character
//! transformer), loads the data ([`Dataset`]: the shipped 8×8 digits, synthetic images, the
//! project's own text, or a shared dataset's safetensors files, [`shared_dataset`]) and
//! takes over one rank's [`collective::Communicator`].
//! [`Trainer::run`] trains: per step forward and backward (layer by layer for the MLP and
//! CNN, [`Layers`], each layer's gradients going on the wire as soon as they are computed;
//! candle's autograd for the transformer), gradients averaged in buckets ([`GradSync`];
//! over the network, wide dense layers' gradients as gathered sufficient factors,
//! [`SufficientFactors`]), each parameter's optimizer update as soon as its average is back
//! ([`Optimizer`], [`LrSchedule`]); per epoch validation; train state ([`TrainState`])
//! committed to memory every K steps and written by rank 0 as a checkpoint
//! ([`CheckpointStore`] through opendal, asynchronously by a [`Checkpointer`]).
//! [`elastic`] keeps a worker alive across lost ranks: commits kept in memory, agreement on
//! the newest common commit in the next ring generation (broadcast to joiners), restore into
//! a trainer for the new world, and go on ([`elastic::ElasticRun`]).
//! [`worker::run`] is one whole worker process (ring, resume, train, metric lines; with
//! `--elastic`, generations from the node on stdin), used by the `train-worker` binary and
//! the node.
//! [`search`] holds the hyperparameter-search algorithms (grid, random, ASHA, Hyperband,
//! TPE, median stopping) as pure functions of a search's trial table; it and the spec's
//! tables are the `ringleader-spec` crate's, re-exported here.
//! [`observe`] shows a job beyond its metric lines: rank 0's TensorBoard event files under
//! `jobs/<job-id>/tb/` and the ranks' phase timeline `jobs/<job-id>/timeline.json` (Chrome
//! trace events), both in the job's storage, written by [`worker::run`].

mod backend;
mod checkpoint;
mod checkpointer;
mod cnn;
mod commit_log;
mod compute_clock;
mod dataset;
pub mod elastic;
mod error;
pub mod faults;
pub mod gpu;
mod grad_sync;
mod kernels;
mod layers;
mod mlp;
mod model;
pub mod observe;
mod optimizer;
pub mod redact;
mod sampler;
mod schedule;
pub mod shared_dataset;
mod state;
mod test_hooks;
mod trainer;
mod transformer;
pub mod worker;

pub use backend::{Backend, Cpu, Host, Staged};
pub use checkpoint::{
    operator_from_url, read_capped, CheckpointStore, ReadCappedError, CHECKPOINT_FILE_BYTES_MAX,
    COMMIT_BYTES_MAX, COMMIT_FILE, META_BYTES_MAX,
};
pub use checkpointer::Checkpointer;
pub use cnn::Cnn;
pub use compute_clock::{ComputeClock, ComputeSection};
pub use dataset::export_digits;
pub use dataset::{Batch, Dataset, DIGITS_TOTAL, DIGITS_TRAIN, TEXT_VOCAB};
pub use error::TrainError;
pub use grad_sync::{GradSync, SyncTimes};
pub use kernels::{Nhwc, Trans};
pub use layers::{LayerEngine, LayerGrads, Layers};
pub use mlp::Mlp;
pub use model::Model;
pub use optimizer::Optimizer;
use ringleader_spec as spec;
/// The job spec's trainer tables and the search, from their own crate (no candle), under
/// the names this crate's users know (`trainer::TrainSpec`, `trainer::search`); the
/// trainer's own files name them as `crate::spec::…`.
pub use ringleader_spec::{
    check_dataset_name, is_builtin_dataset, search, Arch, CheckpointSpec, DataSpec, DecayKind,
    FieldError, GradCompression, LrScaling, ModelSpec, OptimizerKind, SpecError, SufficientFactors,
    TrainParams, TrainSpec, BATCH_PER_WORKER_MAX, BUILTIN_DATASETS, DATASET_NAME_BYTES_MAX,
    HIDDEN_LAYERS_MAX, SYNTHETIC_CLASSES_MAX, SYNTHETIC_VALUES_MAX, WIDTH_MAX,
};
pub use sampler::{DataCursor, Sampler};
pub use schedule::LrSchedule;
pub use shared_dataset::write_shared_dataset;
pub use state::{splitmix64, NamedTensor, StateMeta, TrainState, STATE_FORMAT, TENSOR_ELEMS_MAX};
pub use trainer::{
    EpochMetrics, Event, RunEnd, StepMetrics, Trainer, BUCKET_BYTES, EVAL_BATCH_SAMPLES,
    FIRST_BUCKET_BYTES,
};
pub use transformer::CharTransformer;
