//! The job spec's `[model]`, `[data]`, `[train]` and `[checkpoint]` tables.
//!
//! The node reads these straight from the job spec's parsed TOML document
//! ([`TrainSpec::from_document`], the one reader of these tables, which the worker's
//! [`TrainSpec::from_toml`] uses too); every field has a serde default, so a spec names only
//! what it changes, and a key a table does not define is refused (`deny_unknown_fields`).
//! [`TrainSpec::validate`] checks the values. Every error is a [`FieldError`]: the dotted
//! field it is about and what is wrong, which the node turns into the field and line users
//! read.

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use toml::de::DeTable;

use crate::FieldError;

/// The trainer's part of a job spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainSpec {
    /// `[model]`: architecture and sizes.
    pub model: ModelSpec,
    /// `[data]`: dataset.
    pub data: DataSpec,
    /// `[train]`: loop, optimizer and schedule.
    pub train: TrainParams,
    /// `[checkpoint]`: commit and checkpoint cadence.
    pub checkpoint: CheckpointSpec,
}

/// Model architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Multi-layer perceptron with ReLU; the input is flattened.
    Mlp,
    /// LeNet-like CNN: two (conv, ReLU, 2×2 max-pool) stages, a hidden dense layer, output.
    #[serde(alias = "lenet")]
    Cnn,
    /// Small character-level transformer language model (pre-norm, causal).
    #[serde(alias = "char-transformer", alias = "gpt")]
    Transformer,
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSpec {
    /// Architecture. Default `mlp`.
    pub arch: Arch,
    /// MLP hidden layer widths. Default `[256, 256]`.
    pub hidden: Vec<usize>,
    /// CNN channels of the two conv stages. Default `[16, 32]`.
    pub channels: Vec<usize>,
    /// CNN square kernel size (odd; "same" padding). Default 3.
    pub kernel: usize,
    /// CNN hidden dense width. Default 128.
    pub fc: usize,
    /// Transformer embedding width. Default 64.
    pub d_model: usize,
    /// Transformer blocks. Default 2.
    pub layers: usize,
    /// Transformer attention heads (divides `d_model`). Default 4.
    pub heads: usize,
    /// Transformer context length, characters. Default 64.
    pub seq_len: usize,
}

impl Default for ModelSpec {
    fn default() -> Self {
        ModelSpec {
            arch: Arch::Mlp,
            hidden: vec![256, 256],
            channels: vec![16, 32],
            kernel: 3,
            fc: 128,
            d_model: 64,
            layers: 2,
            heads: 4,
            seq_len: 64,
        }
    }
}

/// `[data]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataSpec {
    /// `digits` (shipped 8×8 digits), `synthetic` (generated images), `text` (the project's
    /// own sources, for the transformer), or any other name: a shared dataset (see
    /// [`check_dataset_name`]; its files in the directory [`DataSpec::shared_dir`], for
    /// `model.arch` mlp or cnn). Default `digits`.
    pub dataset: String,
    /// Synthetic: training samples. Default 8192.
    pub samples: usize,
    /// Synthetic: validation samples. Default 1024.
    pub val_samples: usize,
    /// Synthetic: image shape `[channels, height, width]`. Default `[1, 28, 28]`.
    pub shape: Vec<usize>,
    /// Synthetic: classes. Default 10.
    pub classes: usize,
    /// Synthetic: noise standard deviation around each class prototype. Default 1.0.
    pub noise: f32,
    /// Not part of the job spec (never read from or written to it): the directory holding a
    /// shared dataset's `train.safetensors` (and `val.safetensors`) on this machine. The
    /// worker sets it from `RINGLEADER_DATASET_DIR` (the trainer's `worker::DATASET_DIR_ENV`);
    /// ignored for the built-in datasets. Default none.
    #[serde(skip)]
    pub shared_dir: Option<PathBuf>,
}

impl Default for DataSpec {
    fn default() -> Self {
        DataSpec {
            dataset: "digits".into(),
            samples: 8192,
            val_samples: 1024,
            shape: vec![1, 28, 28],
            classes: 10,
            noise: 1.0,
            shared_dir: None,
        }
    }
}

/// Optimizers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// SGD with momentum and (coupled, L2) weight decay, PyTorch semantics.
    Sgd,
    /// AdamW (decoupled weight decay), Loshchilov & Hutter.
    #[serde(alias = "adam")]
    Adamw,
}

/// Learning-rate decay after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayKind {
    /// Cosine from the peak to 0 at the last step.
    Cosine,
    /// Multiply by `step_gamma` every `step_epochs` epochs.
    Step,
    /// Keep the peak.
    Constant,
}

/// How the learning rate follows the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrScaling {
    /// Peak = `lr` × world size (Goyal et al. 2017), reached by linear warm-up from `lr`.
    Linear,
    /// Peak = `lr` whatever the world size.
    None,
}

/// How gradients travel in the allreduce.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GradCompression {
    /// f32 gradients: data-parallel training equals one process with the global batch to
    /// float tolerance.
    #[default]
    None,
    /// Gradients rounded to bf16, allreduced as bf16 (summed through f32), widened back to
    /// f32 before the optimizer: half the bytes; equivalence to one process only to bf16
    /// tolerance (about 3 significant digits per gradient value). Ranks stay bit-identical.
    Bf16,
}

/// How the weight gradients of dense layers travel.
///
/// A dense layer's weight gradient over a batch of `b` is a sum of `b` outer products, its
/// *sufficient factors* (the output gradients, `b × out`, and the inputs, `b × in`;
/// Xie et al., "Distributed Machine Learning via Sufficient Factor Broadcasting", 2015).
/// Allgathering the factors of `n` ranks sends `(n−1)·b·(in+out)` values per rank; an
/// allreduce of the gradient sends `2(n−1)/n·in·out`. Each rank then forms the same exact
/// average gradient from the gathered factors (one product with `n·b` terms, `n` times the
/// local work). The bias gradient comes from the same factors.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SufficientFactors {
    /// Gather the factors of a dense layer when that sends at most half the bytes of the
    /// allreduce (`n·b·(in+out) ≤ in·out`), when some rank's links go over the network
    /// (not all through shared memory on one host, where the allreduce is cheap and the
    /// `n`-fold products cost more than they save). Decided at the first step, alike on every
    /// rank.
    #[default]
    Auto,
    /// Always allreduce gradients.
    Never,
    /// Gather the factors of every dense layer (with more than one rank; for tests).
    Always,
}

/// `[train]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainParams {
    /// Epochs (passes over the training set). Default 20.
    pub epochs: u64,
    /// Stop after this many optimizer steps, if set (before `epochs` are done).
    pub max_steps: Option<u64>,
    /// Samples per worker per step. Default 32.
    pub batch_per_worker: usize,
    /// Optimizer. Default `sgd`.
    pub optimizer: OptimizerKind,
    /// Learning rate for one worker. Default 0.05.
    pub lr: f64,
    /// Learning-rate scaling with world size. Default `linear`.
    pub lr_scaling: LrScaling,
    /// Linear warm-up length, epochs (fractions allowed). Default 1.
    pub warmup_epochs: f64,
    /// Decay after warm-up. Default `cosine`.
    pub decay: DecayKind,
    /// Step decay: period, epochs. Default 10.
    pub step_epochs: u64,
    /// Step decay: factor. Default 0.1.
    pub step_gamma: f64,
    /// SGD momentum. Default 0.9.
    pub momentum: f64,
    /// Weight decay (L2 for SGD, decoupled for AdamW). Default 0 for SGD-style specs.
    pub weight_decay: f64,
    /// AdamW β₁. Default 0.9.
    pub beta1: f64,
    /// AdamW β₂. Default 0.999.
    pub beta2: f64,
    /// AdamW ε. Default 1e-8.
    pub eps: f64,
    /// Seed of parameter initialisation, shuffles and every other random draw. Default 7.
    pub seed: u64,
    /// Validate every this many epochs (0 = only at the end). Default 1.
    pub eval_every_epochs: u64,
    /// Gradient compression in the allreduce: `none` or `bf16` (any other value is refused
    /// when the spec is parsed). Default `none`.
    pub grad_compression: GradCompression,
    /// Dense layers' weight gradients as gathered sufficient factors: `auto`, `never` or
    /// `always` (see [`SufficientFactors`]; with `grad_compression = "bf16"` the factors
    /// travel as bf16). Default `auto`.
    pub sufficient_factors: SufficientFactors,
}

impl Default for TrainParams {
    fn default() -> Self {
        TrainParams {
            epochs: 20,
            max_steps: None,
            batch_per_worker: 32,
            optimizer: OptimizerKind::Sgd,
            lr: 0.05,
            lr_scaling: LrScaling::Linear,
            warmup_epochs: 1.0,
            decay: DecayKind::Cosine,
            step_epochs: 10,
            step_gamma: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            seed: 7,
            eval_every_epochs: 1,
            grad_compression: GradCompression::None,
            sufficient_factors: SufficientFactors::Auto,
        }
    }
}

/// `[checkpoint]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Rank 0 writes a checkpoint to storage every this many steps (0 = never). Default 200.
    pub every_steps: u64,
    /// Committed checkpoints kept in storage; older ones are pruned. Default 3.
    pub keep: usize,
    /// Every worker commits its train state to memory every this many steps; elastic
    /// recovery restores the newest commit all surviving ranks share (see
    /// the trainer's `elastic`), so at most about this many steps are trained again after a
    /// lost rank. 0 = never (a re-form then falls back to the durable checkpoint). Default
    /// 50.
    pub commit_every_steps: u64,
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec {
            every_steps: 200,
            keep: 3,
            commit_every_steps: 50,
        }
    }
}

/// The datasets built into the trainer (every other `data.dataset` names a shared dataset).
pub const BUILTIN_DATASETS: [&str; 3] = ["digits", "synthetic", "text"];
/// Longest shared dataset name, bytes.
pub const DATASET_NAME_BYTES_MAX: usize = 64;

/// Whether `name` is one of the [`BUILTIN_DATASETS`].
pub fn is_builtin_dataset(name: &str) -> bool {
    BUILTIN_DATASETS.contains(&name)
}

/// Checks a `data.dataset` value: a built-in, or a shared dataset name matching
/// `[A-Za-z0-9][A-Za-z0-9._-]{0,63}` (so it is a safe single path component: never empty,
/// never `.` or `..`, no separator). The error names the field.
pub fn check_dataset_name(name: &str) -> Result<(), String> {
    match dataset_name_problem(name) {
        None => Ok(()),
        Some(problem) => Err(format!("data.dataset {problem}")),
    }
}

/// What is wrong with `name` as a `data.dataset` value ([`check_dataset_name`]), or `None`.
fn dataset_name_problem(name: &str) -> Option<String> {
    if is_builtin_dataset(name) {
        return None;
    }
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if first_ok && rest_ok && name.len() <= DATASET_NAME_BYTES_MAX {
        None
    } else {
        Some(format!(
            "{name:?}: a shared dataset name is letters, digits, '.', '_', '-' \
             (at most {DATASET_NAME_BYTES_MAX}), starting with a letter or digit"
        ))
    }
}

/// Largest batch per worker accepted, samples.
pub const BATCH_PER_WORKER_MAX: usize = 1 << 16;
/// Largest layer width accepted by the spec, units.
pub const WIDTH_MAX: usize = 1 << 16;
/// Most hidden layers of an MLP (`model.hidden`'s length).
pub const HIDDEN_LAYERS_MAX: usize = 64;
/// Most values a synthetic dataset generates, f32 (2^28: 1 GiB): its training and
/// validation samples and its class prototypes, times the values of one sample
/// (`data.shape`'s product). Checked before anything is allocated.
pub const SYNTHETIC_VALUES_MAX: usize = 1 << 28;
/// Labels of a dataset (synthetic or shared, see `shared_dataset`) are below this: the
/// classes a model may have.
pub const LABELS_MAX: u64 = 1 << 16;
/// Most classes of a synthetic dataset (the labels a shared dataset may use, too).
pub const SYNTHETIC_CLASSES_MAX: usize = LABELS_MAX as usize;
/// Largest convolution kernel (`model.kernel`, odd).
pub const KERNEL_MAX: usize = 15;
/// Most transformer blocks (`model.layers`).
pub const TRANSFORMER_LAYERS_MAX: usize = 64;
/// Longest transformer context (`model.seq_len`), tokens.
pub const SEQ_LEN_MAX: usize = 4096;
/// Largest side of a synthetic sample (each of `data.shape`'s c, h, w).
pub const SYNTHETIC_SIDE_MAX: usize = 1024;

/// Why a job spec's text gave no [`TrainSpec`] ([`TrainSpec::from_toml`]).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The text is not TOML (the parser's message, with its line).
    #[error("invalid spec: {0}")]
    Toml(String),
    /// A field of the trainer's tables is unknown or invalid (which, and why).
    #[error("invalid spec: {0}")]
    Field(#[from] FieldError),
}

impl TrainSpec {
    /// Parses the trainer's tables from a whole job spec (other top-level keys are ignored).
    pub fn from_toml(text: &str) -> Result<Self, SpecError> {
        let doc = DeTable::parse(text).map_err(|e| SpecError::Toml(e.to_string()))?;
        Ok(Self::from_document(doc.get_ref())?)
    }

    /// Reads and checks the trainer's tables (`[model]`, `[data]`, `[train]`,
    /// `[checkpoint]`) from a parsed job spec (other top-level keys are ignored): a key a
    /// table does not define, a value of the wrong type and a value [`TrainSpec::validate`]
    /// refuses are each a [`FieldError`] naming the field.
    pub fn from_document(doc: &DeTable<'_>) -> Result<Self, FieldError> {
        let spec = TrainSpec {
            model: section(doc, "model")?,
            data: section(doc, "data")?,
            train: section(doc, "train")?,
            checkpoint: section(doc, "checkpoint")?,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every value is usable; the error names the field.
    pub fn validate(&self) -> Result<(), FieldError> {
        let bad = |field: &str, problem: String| Err(FieldError::new(field, problem));
        let m = &self.model;
        let t = &self.train;
        let width_ok = |w: usize| (1..=WIDTH_MAX).contains(&w);
        if m.hidden.len() > HIDDEN_LAYERS_MAX {
            return bad(
                "model.hidden",
                format!("{} layers, at most {HIDDEN_LAYERS_MAX}", m.hidden.len()),
            );
        }
        if !m.hidden.iter().all(|&w| width_ok(w)) {
            return bad(
                "model.hidden",
                format!("{:?}: widths must be 1..={WIDTH_MAX}", m.hidden),
            );
        }
        if m.arch == Arch::Cnn {
            if m.channels.len() != 2 || !m.channels.iter().all(|&c| width_ok(c)) {
                return bad(
                    "model.channels",
                    format!("{:?}: two widths, each 1..={WIDTH_MAX}", m.channels),
                );
            }
            if m.kernel.is_multiple_of(2) || m.kernel > KERNEL_MAX {
                return bad(
                    "model.kernel",
                    format!("{}: odd, at most {KERNEL_MAX}", m.kernel),
                );
            }
            if !width_ok(m.fc) {
                return bad("model.fc", format!("{}: 1..={WIDTH_MAX}", m.fc));
            }
        }
        if m.arch == Arch::Transformer {
            if m.heads == 0
                || m.d_model == 0
                || !m.d_model.is_multiple_of(m.heads)
                || !width_ok(m.d_model)
            {
                return bad(
                    "model.d_model",
                    format!(
                        "{} must be a positive multiple of model.heads {}",
                        m.d_model, m.heads
                    ),
                );
            }
            if m.layers == 0 || m.layers > TRANSFORMER_LAYERS_MAX {
                return bad(
                    "model.layers",
                    format!("{}: 1..={TRANSFORMER_LAYERS_MAX}", m.layers),
                );
            }
            if m.seq_len < 2 || m.seq_len > SEQ_LEN_MAX {
                return bad("model.seq_len", format!("{}: 2..={SEQ_LEN_MAX}", m.seq_len));
            }
            if self.data.dataset != "text" {
                return bad(
                    "model.arch",
                    format!(
                        "transformer needs data.dataset = \"text\", not {:?} (shared \
                         datasets are for model.arch mlp or cnn)",
                        self.data.dataset
                    ),
                );
            }
        } else if self.data.dataset == "text" {
            return bad(
                "data.dataset",
                "text needs model.arch = \"transformer\"".into(),
            );
        }
        match self.data.dataset.as_str() {
            "digits" | "text" => {}
            "synthetic" => {
                let d = &self.data;
                if d.shape.len() != 3 || d.shape.iter().any(|&s| s == 0 || s > SYNTHETIC_SIDE_MAX) {
                    return bad(
                        "data.shape",
                        format!("{:?}: [c, h, w], each 1..={SYNTHETIC_SIDE_MAX}", d.shape),
                    );
                }
                if d.classes < 2 {
                    return bad("data.classes", format!("{}: at least 2", d.classes));
                }
                if d.samples == 0 {
                    return bad("data.samples", "0: at least 1".into());
                }
                if d.val_samples == 0 {
                    return bad("data.val_samples", "0: at least 1".into());
                }
                if d.classes > SYNTHETIC_CLASSES_MAX {
                    return bad(
                        "data.classes",
                        format!("{}: at most {SYNTHETIC_CLASSES_MAX}", d.classes),
                    );
                }
                // Each term is at most SYNTHETIC_SIDE_MAX (checked above): the product fits a
                // u64.
                let per_sample = d.shape.iter().map(|&s| s as u64).product::<u64>();
                let values = (d.samples as u64)
                    .checked_add(d.val_samples as u64)
                    .and_then(|n| n.checked_add(d.classes as u64))
                    .and_then(|n| n.checked_mul(per_sample));
                if values.is_none_or(|v| v > SYNTHETIC_VALUES_MAX as u64) {
                    return bad(
                        "data.samples",
                        format!(
                            "{} + data.val_samples {} + data.classes {} times the \
                             {per_sample} values of data.shape {:?}: over the limit of \
                             {SYNTHETIC_VALUES_MAX} values",
                            d.samples, d.val_samples, d.classes, d.shape
                        ),
                    );
                }
                if !(d.noise.is_finite() && d.noise >= 0.0) {
                    return bad("data.noise", "must be finite and ≥ 0".into());
                }
            }
            // A shared dataset: its shape and classes come from its files, checked when loaded.
            other => {
                if let Some(problem) = dataset_name_problem(other) {
                    return bad("data.dataset", problem);
                }
            }
        }
        if t.batch_per_worker == 0 || t.batch_per_worker > BATCH_PER_WORKER_MAX {
            return bad(
                "train.batch_per_worker",
                format!("{}: 1..={BATCH_PER_WORKER_MAX}", t.batch_per_worker),
            );
        }
        if !(t.lr.is_finite() && t.lr > 0.0) {
            return bad("train.lr", format!("{} must be positive", t.lr));
        }
        if !(t.warmup_epochs.is_finite() && t.warmup_epochs >= 0.0) {
            return bad("train.warmup_epochs", "must be ≥ 0".into());
        }
        for (field, value) in [
            ("train.momentum", t.momentum),
            ("train.beta1", t.beta1),
            ("train.beta2", t.beta2),
        ] {
            if !(0.0..1.0).contains(&value) {
                return bad(field, format!("{value} must be in [0, 1)"));
            }
        }
        if t.weight_decay.is_nan() || t.weight_decay < 0.0 {
            return bad("train.weight_decay", "must be ≥ 0".into());
        }
        if t.eps.is_nan() || t.eps <= 0.0 {
            return bad("train.eps", "must be > 0".into());
        }
        if t.step_gamma.is_nan() || t.step_gamma <= 0.0 {
            return bad("train.step_gamma", "must be > 0".into());
        }
        if t.epochs == 0 && t.max_steps.is_none() {
            return bad(
                "train.epochs",
                "must be ≥ 1 (or set train.max_steps)".into(),
            );
        }
        if self.checkpoint.keep == 0 {
            return bad("checkpoint.keep", "must be ≥ 1".into());
        }
        Ok(())
    }
}

/// The table `name` of `doc` read as `T` (`T`'s defaults when it is absent), by the one
/// reader of a spec's tables ([`crate::read_table`]).
fn section<T: DeserializeOwned + Default>(doc: &DeTable<'_>, name: &str) -> Result<T, FieldError> {
    match doc.get(name) {
        None => Ok(T::default()),
        Some(value) => crate::read_table(name, value).map_err(|e| e.error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn design_md_example_parses_with_defaults() {
        let text = r#"
name = "digits-mlp"
kind = "train"
workers = 4
[resources]
gpus_per_worker = 0
[model]
arch = "mlp"
hidden = [256, 256]
[data]
dataset = "digits"
[train]
epochs = 20
batch_per_worker = 32
optimizer = "sgd"
lr = 0.05
warmup_epochs = 1
seed = 7
[checkpoint]
every_steps = 200
keep = 3
"#;
        let spec = TrainSpec::from_toml(text).unwrap();
        assert_eq!(spec.model.hidden, vec![256, 256]);
        assert_eq!(spec.train.optimizer, OptimizerKind::Sgd);
        assert_eq!(spec.train.warmup_epochs, 1.0);
        assert_eq!(spec.checkpoint.keep, 3);
        assert_eq!(spec.train.decay, DecayKind::Cosine);
    }

    #[test]
    fn bad_values_are_refused() {
        let mut s = TrainSpec::default();
        s.train.batch_per_worker = 0;
        assert_eq!(s.validate().unwrap_err().field, "train.batch_per_worker");
        let mut s = TrainSpec::default();
        s.model.arch = Arch::Transformer;
        assert!(s.validate().is_err(), "transformer needs text");
        assert!(TrainSpec::from_toml("[data]\ndataset = \"image/net\"").is_err());
    }

    /// Counts that size allocations (synthetic samples and classes, hidden layers) are
    /// refused past their limits, with the field and the limit in the message.
    #[test]
    fn sizes_past_their_limits_are_refused() {
        let synthetic = |samples: &str, classes: usize, shape: &str| {
            TrainSpec::from_toml(&format!(
                "[data]\ndataset = \"synthetic\"\nsamples = {samples}\nclasses = {classes}\nshape = {shape}\n"
            ))
        };
        assert!(synthetic("8192", 10, "[1, 28, 28]").is_ok());
        let msg = |r: Result<TrainSpec, SpecError>| r.unwrap_err().to_string();
        for (samples, classes, shape) in [
            ("9223372036854775807", 10, "[1, 28, 28]"),
            ("1000000", 10, "[1, 28, 28]"),
            ("1", 2, "[1024, 1024, 1024]"),
        ] {
            let m = msg(synthetic(samples, classes, shape));
            assert!(m.contains(&SYNTHETIC_VALUES_MAX.to_string()), "{m}");
        }
        let m = msg(synthetic("10", SYNTHETIC_CLASSES_MAX + 1, "[1, 2, 2]"));
        assert!(m.contains("data.classes"), "{m}");
        let mut s = TrainSpec::default();
        s.model.hidden = vec![8; HIDDEN_LAYERS_MAX + 1];
        let m = s.validate().unwrap_err().to_string();
        assert!(
            m.contains("model.hidden") && m.contains("at most 64"),
            "{m}"
        );
        s.model.hidden = vec![8; HIDDEN_LAYERS_MAX];
        assert!(s.validate().is_ok());
    }

    #[test]
    fn shared_dataset_names_are_checked_and_exclude_the_transformer() {
        for ok in ["imagenet", "mnist-2024.v1", "a", "9_x", &"a".repeat(64)] {
            assert_eq!(check_dataset_name(ok), Ok(()), "{ok}");
            assert!(!is_builtin_dataset(ok));
        }
        for builtin in BUILTIN_DATASETS {
            assert!(is_builtin_dataset(builtin));
            assert_eq!(check_dataset_name(builtin), Ok(()));
        }
        for bad in [
            "",
            "a/b",
            "..",
            ".hidden",
            "-x",
            "_x",
            "a b",
            "é",
            &"a".repeat(65),
        ] {
            let e = check_dataset_name(bad).unwrap_err();
            assert!(
                e.starts_with(&format!("data.dataset {bad:?}: a shared")),
                "{e}"
            );
        }
        let e = check_dataset_name("a/b").unwrap_err();
        assert!(
            e.contains("letters, digits, '.', '_', '-' (at most 64)"),
            "{e}"
        );
        let s =
            TrainSpec::from_toml("[model]\narch = \"cnn\"\n[data]\ndataset = \"mnist\"").unwrap();
        assert_eq!(
            (s.data.dataset.as_str(), s.data.shared_dir),
            ("mnist", None)
        );
        let e =
            TrainSpec::from_toml("[model]\narch = \"transformer\"\n[data]\ndataset = \"mnist\"")
                .unwrap_err();
        assert!(e.to_string().contains("model.arch: transformer"), "{e}");
        let e = TrainSpec::from_toml("[data]\ndataset = \"a/b\"").unwrap_err();
        assert!(e.to_string().contains("data.dataset: \"a/b\""), "{e}");
        // The directory is never part of the spec text: a spec that names it is refused.
        let e = TrainSpec::from_toml("[data]\nshared_dir = \"/etc\"").unwrap_err();
        assert!(
            e.to_string().contains("data.shared_dir: unknown field"),
            "{e}"
        );
        let mut s = TrainSpec::default();
        s.data.shared_dir = Some("/data/x".into());
        assert!(!toml::to_string(&s).unwrap().contains("/data/x"));
    }

    #[test]
    fn grad_compression_parses_and_refuses_unknown_values() {
        let s = TrainSpec::from_toml("[train]\ngrad_compression = \"bf16\"").unwrap();
        assert_eq!(s.train.grad_compression, GradCompression::Bf16);
        let s = TrainSpec::from_toml("[train]\nepochs = 2").unwrap();
        assert_eq!(s.train.grad_compression, GradCompression::None);
        let e = TrainSpec::from_toml("[train]\ngrad_compression = \"fp8\"").unwrap_err();
        assert!(e.to_string().contains("grad_compression"), "{e}");
    }
}
