//! The job spec: what a user submits (TOML, see docs/book/src/reference/spec.md).
//!
//! [`JobSpec::parse`] is the only way a spec enters the system from text. It reads the TOML
//! document with spans, each part by a serde struct of `sections` through the one reader
//! of a spec's tables ([`ringleader_spec::read_table`]), so every error names the field path
//! and the 1-based line, e.g.
//! `workers: expected a positive integer at line 4` or `unknown field "wrokers" at line 3`.
//! Once parsed, a [`JobSpec`] is a plain serde value: it travels in the Raft log as it is and
//! is not re-validated there (a replica must apply exactly what the leader committed).
//!
//! The sections `model`, `data`, `train`, `checkpoint` and `search` are kept as generic TOML
//! tables here (the form stored in the Raft log); the trainer defines their typed forms. A
//! train job's are read once, by [`ringleader_spec::TrainSpec::from_document`] over the same parsed
//! document, when the spec is parsed (their errors get the field's line from that document),
//! and kept typed beside the tables ([`JobSpec::trainer`]).

/// The rules a spec's values meet, checked on the typed value ([`check()`]).
pub mod check;
/// A job's priority (the key `priority`).
pub mod priority;
/// The top level, `[resources]`, `[elastic]`, `[preemption]` and `[[files]]` as serde reads
/// them from the text.
mod sections;
/// The trainer's sections of a train job's spec (also `domain::train_spec`).
pub mod train;

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

pub use check::check;
use ringleader_spec::{FieldError, TrainSpec};
use serde::{Deserialize, Serialize};
pub use train::{Tables, TrainerTables};

use crate::device_order::{DEVICE_ORDER, DEVICE_ORDER_ENV};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Largest spec text accepted, in bytes.
pub const SPEC_BYTES_MAX: usize = 256 * 1024;
/// Longest job name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;
/// Most workers (ring size) one job may ask for.
pub const WORKERS_MAX: u32 = 1024;
/// Most restarts (attempts after the first) one job may ask for.
pub const MAX_RESTARTS_MAX: u32 = 100;
/// Default `max_restarts` when the spec leaves it out.
pub const MAX_RESTARTS_DEFAULT: u32 = 3;
/// Most cpus one worker may ask for.
pub const CPUS_PER_WORKER_MAX: u32 = 4096;
/// Most gpus one worker may ask for.
pub const GPUS_PER_WORKER_MAX: u32 = 64;
/// Most arguments in `command` (program included).
pub const COMMAND_ARGS_MAX: usize = 256;
/// Most entries in `env`.
pub const ENV_VARS_MAX: usize = 256;
/// Most `[[files]]` one spec may carry.
pub const FILES_MAX: usize = 64;
/// Largest total size of a spec's `[[files]]`, decoded, in bytes. The spec's text (at most
/// [`SPEC_BYTES_MAX`]) holds them, base64 a third larger; every trial of a search carries its
/// template's files in the Raft log, so they stay small: a script, a pickled function.
pub const FILES_BYTES_MAX: usize = 128 * 1024;
/// Longest `files[i].path`, in bytes.
pub const FILE_PATH_BYTES_MAX: usize = 255;

/// Environment variables ringleader sets for every command worker; a spec may not set them.
pub const RESERVED_ENV: [&str; 5] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];

/// The namespace of the node's own variables (`RINGLEADER_SECRET`, `RINGLEADER_STORAGE`,
/// the rank environment, the test-only `RINGLEADER_TEST_*` hooks): a spec's `env` may not
/// set a key that starts with it, so a job can neither override what the node hands its
/// ranks nor drive a test hook's faults into them. [`NODE_ENV_ALLOWED`] are the exceptions.
pub const NODE_ENV_PREFIX: &str = ringleader_protocol::env::PREFIX;

/// The `RINGLEADER_*` keys a spec's `env` may set: the documented per-job switches
/// (`RINGLEADER_NO_SHM`: no shared-memory path between a job's ranks;
/// `RINGLEADER_CUDA_BACKEND`: `ringleader.torch`'s device group for CUDA tensors, `none`
/// refusing them). The node sets neither, so a job setting one overrides nothing of it.
pub const NODE_ENV_ALLOWED: [&str; 2] = [ringleader_protocol::env::NO_SHM, CUDA_BACKEND_ENV];

/// `ringleader.torch`'s switch of the device group for CUDA tensors (`nccl` by default,
/// `none`): a knob of the Python package, not of the node↔rank contract, so not in
/// `ringleader_protocol::env`.
pub const CUDA_BACKEND_ENV: &str = "RINGLEADER_CUDA_BACKEND";

/// The variable that names a rank's devices: the node sets it for every rank on a host that
/// offers GPUs (`jobs::launch`), so a spec may not (exclusive devices hold only if no job
/// picks its own).
pub const DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";

/// Default `preemption.grace_s`: how long a rank asked to checkpoint and stop has, in seconds.
pub const PREEMPTION_GRACE_S_DEFAULT: u32 = 30;
/// Largest `preemption.grace_s`, in seconds (an hour).
pub const PREEMPTION_GRACE_S_MAX: u32 = 3_600;
/// Largest `elastic.straggler_window`, in steps.
pub const STRAGGLER_WINDOW_MAX: u32 = 1_000_000;
/// Largest `elastic.blacklist_cooldown_s`, in seconds (a day).
pub const BLACKLIST_COOLDOWN_S_MAX: u32 = 86_400;
/// Default `elastic.rejoin_after_s`, in seconds.
pub const REJOIN_AFTER_S_DEFAULT: u32 = 10;
/// Largest `elastic.rejoin_after_s`, in seconds (a day).
pub const REJOIN_AFTER_S_MAX: u32 = 86_400;
/// Default `elastic.first_heartbeat_s`, in seconds.
pub const FIRST_HEARTBEAT_S_DEFAULT: u32 = 60;
/// Largest `elastic.first_heartbeat_s`, in seconds (an hour).
pub const FIRST_HEARTBEAT_S_MAX: u32 = 3_600;

/// What a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    /// Data-parallel training with the built-in trainer.
    Train,
    /// A hyperparameter search: many training trials.
    Search,
    /// The user's own program on each worker, with torchrun's environment.
    Command,
}

impl JobKind {
    /// The spelling used in specs, the API and the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Train => "train",
            JobKind::Search => "search",
            JobKind::Command => "command",
        }
    }
}

impl fmt::Display for JobKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the workers of one job are laid over members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// As few workers per member as possible (the default): a lost member costs little.
    #[default]
    Spread,
    /// As many workers per member as fit: less traffic between hosts.
    Pack,
}

impl Placement {
    /// The spelling used in specs.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Spread => "spread",
            Placement::Pack => "pack",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Resources one worker needs on its member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources {
    /// Cpus per worker; at least 1, default 1.
    pub cpus_per_worker: u32,
    /// Gpus per worker; default 0.
    pub gpus_per_worker: u32,
}

impl Default for Resources {
    fn default() -> Self {
        Resources {
            cpus_per_worker: 1,
            gpus_per_worker: 0,
        }
    }
}

/// How an elastic command job's ranks live through a re-form (`[elastic] protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElasticProtocol {
    /// torchrun's semantics (the default): a new generation starts every rank again, with
    /// the new `WORLD_SIZE`.
    #[default]
    Torchrun,
    /// As train ranks: the surviving processes are kept, read each new generation on stdin
    /// (`ringleader-generation {json}`) and must speak the rank protocol (heartbeats, rank
    /// stats) within `first_heartbeat_s`; `ringleader.torch` does this.
    Ringleader,
}

impl ElasticProtocol {
    /// The spelling used in specs and in the rank's `RINGLEADER_ELASTIC_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            ElasticProtocol::Torchrun => "torchrun",
            ElasticProtocol::Ringleader => "ringleader",
        }
    }
}

/// `[elastic]`: how an elastic job treats slow ranks, and how a command job's ranks live
/// through a re-form. Every field has a default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Elastic {
    /// A rank whose compute time per step stays above this many times the ring's median is
    /// a straggler; finite, above 1; default 2.
    pub straggler_factor: f64,
    /// For this many steps in a row, at least 1; default 20.
    pub straggler_window: u32,
    /// A straggler's member is blacklisted for this job for this long, in seconds, doubled
    /// at each repeat (Spark's executor blacklist); default 60.
    pub blacklist_cooldown_s: u32,
    /// A member that left the ring (its rank lost or hung, or its standby dropped) may join
    /// it again this long after, in seconds, so that a member whose rank keeps crashing
    /// does not flap in and out; 1 to [`REJOIN_AFTER_S_MAX`], default
    /// [`REJOIN_AFTER_S_DEFAULT`].
    #[serde(
        default = "rejoin_after_s_default",
        skip_serializing_if = "is_rejoin_after_s_default"
    )]
    pub rejoin_after_s: u32,
    /// How a command job's ranks go through a re-form (`kind = "command"` only; default
    /// torchrun). `ringleader` needs an elastic ring (`min_workers < workers` or
    /// `max_workers > workers`).
    #[serde(default)]
    pub protocol: ElasticProtocol,
    /// A rank of a `protocol = "ringleader"` job must print its first
    /// `ringleader-heartbeat` or `ringleader-rank-stats` line within this many seconds of
    /// starting, or it is lost and the job fails saying the script must use
    /// `ringleader.torch`; 1 to [`FIRST_HEARTBEAT_S_MAX`], default
    /// [`FIRST_HEARTBEAT_S_DEFAULT`] (only with that protocol).
    #[serde(default = "first_heartbeat_s_default")]
    pub first_heartbeat_s: u32,
    /// A ring shrunk by a preemption keeps the global batch it had (each survivor
    /// accumulates the gradients of several micro-batches per step), so the learning rate
    /// and its schedule are unchanged; `false`: the batch shrinks with the ring and the
    /// learning rate is rescaled linearly, as after a lost rank. Default true.
    #[serde(default = "keep_global_batch_default", skip_serializing_if = "is_true")]
    pub keep_global_batch: bool,
}

impl Elastic {
    /// [`Elastic::rejoin_after_s`] in milliseconds.
    pub fn rejoin_after_ms(&self) -> u64 {
        u64::from(self.rejoin_after_s) * 1_000
    }
}

fn rejoin_after_s_default() -> u32 {
    REJOIN_AFTER_S_DEFAULT
}

/// Left out of the log when the default: logs written before the key read alike.
fn is_rejoin_after_s_default(s: &u32) -> bool {
    *s == REJOIN_AFTER_S_DEFAULT
}

fn first_heartbeat_s_default() -> u32 {
    FIRST_HEARTBEAT_S_DEFAULT
}

fn keep_global_batch_default() -> bool {
    true
}

/// Left out of the log when true (the default): logs written before the key read alike.
fn is_true(b: &bool) -> bool {
    *b
}

fn preemptible_default() -> bool {
    true
}

/// `[preemption]`: how a job is stopped when it is preempted and requeued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionSpec {
    /// How long a rank asked to checkpoint and stop (SIGTERM, `ringleader-stop`) has
    /// before it is killed, in seconds; 1 to [`PREEMPTION_GRACE_S_MAX`], default
    /// [`PREEMPTION_GRACE_S_DEFAULT`].
    pub grace_s: u32,
}

impl PreemptionSpec {
    fn is_default(&self) -> bool {
        *self == PreemptionSpec::default()
    }
}

impl Default for PreemptionSpec {
    fn default() -> Self {
        PreemptionSpec {
            grace_s: PREEMPTION_GRACE_S_DEFAULT,
        }
    }
}

impl Default for Elastic {
    fn default() -> Self {
        Elastic {
            straggler_factor: 2.0,
            straggler_window: 20,
            blacklist_cooldown_s: 60,
            rejoin_after_s: REJOIN_AFTER_S_DEFAULT,
            protocol: ElasticProtocol::default(),
            first_heartbeat_s: FIRST_HEARTBEAT_S_DEFAULT,
            keep_global_batch: true,
        }
    }
}

/// One `[[files]]` entry: a small file written into each rank's working directory before
/// the rank starts. Exactly one of `text` and `base64` is set; `path` is relative, of
/// normal components only (see [`file_path_problem`]). Kept as the spec gave it, so the
/// spec prints back to the same TOML.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecFile {
    /// Where, relative to the rank's working directory, e.g. `train.py` or `lib/util.py`.
    pub path: String,
    /// The contents as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The contents as standard base64 (with padding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

impl SpecFile {
    /// The file's bytes (`None` only for base64 that does not decode, which admission
    /// refuses).
    pub fn bytes(&self) -> Option<Vec<u8>> {
        use base64::Engine as _;
        match (&self.text, &self.base64) {
            (Some(text), _) => Some(text.as_bytes().to_vec()),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD.decode(b64).ok(),
            (None, None) => Some(Vec::new()),
        }
    }
}

/// Why `path` cannot be a `[[files]]` path, or `None` when it can: it must be relative,
/// 1 to [`FILE_PATH_BYTES_MAX`] bytes, with no empty, `.` or `..` component and no NUL, so
/// that it stays inside the rank's working directory.
pub fn file_path_problem(path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("expected a relative path such as \"train.py\"".into());
    }
    if path.len() > FILE_PATH_BYTES_MAX {
        return Some(format!(
            "at most {FILE_PATH_BYTES_MAX} bytes, got {}",
            path.len()
        ));
    }
    if path.starts_with('/') {
        return Some(format!(
            "{path:?} is absolute: give a path relative to the rank's working directory"
        ));
    }
    if path.contains('\0') {
        return Some("must not contain NUL".into());
    }
    for part in path.split('/') {
        match part {
            "" => {
                return Some(format!(
                    "{path:?} has an empty component (\"//\" or a trailing \"/\")"
                ))
            }
            "." | ".." => {
                return Some(format!(
                    "{path:?} has a {part:?} component: give a plain relative path"
                ))
            }
            _ => {}
        }
    }
    None
}

/// A validated job spec.
///
/// Invariants (established by [`JobSpec::parse`]): `name` matches `[A-Za-z0-9_.-]{1,64}`;
/// `1 <= min_workers <= workers <= max_workers <= WORKERS_MAX`; `command` is non-empty exactly
/// when `kind` is `Command` (and may be for a `Search` of command trials); `search` is
/// present exactly when `kind` is `Search`; `env` sets no
/// name of [`RESERVED_ENV`], nor [`DEVICES_ENV`], and no [`NODE_ENV_PREFIX`] name but
/// [`NODE_ENV_ALLOWED`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Human name; not unique (the job id is).
    pub name: String,
    /// What the job runs.
    pub kind: JobKind,
    /// Ring size wanted; default 1.
    pub workers: u32,
    /// Smallest ring the job accepts (elastic jobs); default `workers`.
    pub min_workers: u32,
    /// Largest ring the job accepts (elastic jobs); default `workers`.
    pub max_workers: u32,
    /// Attempts allowed after the first one fails; default [`MAX_RESTARTS_DEFAULT`].
    pub max_restarts: u32,
    /// Spread or pack workers over members; default spread.
    pub placement: Placement,
    /// Scheduling priority, `0..=priority::PRIORITY_MAX` (see [`priority`]); default
    /// `normal` (500). Left out of the stored form at the default, so older logs read alike.
    #[serde(
        default = "priority::default_priority",
        skip_serializing_if = "priority::is_default_priority"
    )]
    pub priority: u32,
    /// Program and arguments (`kind = "command"` only).
    pub command: Vec<String>,
    /// Extra environment for every worker.
    pub env: BTreeMap<String, String>,
    /// `[secrets]`: environment for every worker whose values are secret. The API node seals
    /// each value (the node's `security::sealed`) before the spec enters the Raft log, so past
    /// admission they are `sealed:v1:…` text; the node that starts a rank opens them. Never
    /// a name that `env` sets too.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub secrets: BTreeMap<String, String>,
    /// Per-worker resources.
    pub resources: Resources,
    /// `[model]`, `[data]`, `[train]` and `[checkpoint]`, for the trainer, with their typed
    /// reading ([`JobSpec::tables`], [`JobSpec::trainer`]); stored as four keys of the spec.
    #[serde(flatten)]
    trainer: TrainerTables,
    /// `[search]` (`kind = "search"` only).
    pub search: Option<toml::Table>,
    /// `[elastic]`, with defaults.
    #[serde(default)]
    pub elastic: Elastic,
    /// Not a TOML key: set on every spec this version admits. A search of such a spec in
    /// which no trial reports the search's metric ends `failed`, naming the metric. Specs
    /// in logs written before read `false`, and their searches end as they did then
    /// (`succeeded` when a trial succeeded).
    #[serde(default)]
    pub reports_required: bool,
    /// `[[files]]`: small files written into each rank's working directory before it
    /// starts (command jobs and command trials only), at most [`FILES_MAX`] of them and
    /// [`FILES_BYTES_MAX`] bytes in all; no two with the same path, nor one inside another.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<SpecFile>,
    /// Whether the job may be preempted (shrunk, requeued, its trials paused) for another
    /// job; default true.
    #[serde(default = "preemptible_default", skip_serializing_if = "is_true")]
    pub preemptible: bool,
    /// `[preemption]`, with defaults.
    #[serde(default, skip_serializing_if = "PreemptionSpec::is_default")]
    pub preemption: PreemptionSpec,
}

/// Why a spec was refused. Each variant names the field path (dotted, with `[i]` for array
/// elements) and, where the field is present in the text, its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The text is not valid TOML (or has a duplicate key).
    #[error("invalid TOML at line {line}: {message}")]
    Syntax {
        /// 1-based line of the problem.
        line: usize,
        /// The TOML parser's message.
        message: String,
    },
    /// A key the spec does not define (typos included).
    #[error("unknown field \"{field}\" at line {line}{}", did_you_mean(suggestion))]
    UnknownField {
        /// Dotted path of the key.
        field: String,
        /// 1-based line of the key.
        line: usize,
        /// A known field spelled closely, if any.
        suggestion: Option<String>,
    },
    /// A field is present but its value is wrong.
    #[error("{field}: {problem} at line {line}")]
    Invalid {
        /// Dotted path of the field.
        field: String,
        /// What is wrong, lowercase, e.g. "expected a positive integer".
        problem: String,
        /// 1-based line of the value.
        line: usize,
    },
    /// A required field is absent.
    #[error("{field}: {problem}")]
    Missing {
        /// Dotted path of the field.
        field: String,
        /// Why it is required, e.g. "required when kind = \"command\"".
        problem: String,
    },
    /// A JSON spec that is not valid JSON.
    #[error("invalid JSON at line {line} column {column}: {message}")]
    Json {
        /// 1-based line of the problem in the JSON text.
        line: usize,
        /// 1-based column.
        column: usize,
        /// serde_json's message.
        message: String,
    },
    /// A JSON spec's value that TOML cannot hold (`null`, an integer above `i64::MAX`).
    #[error("{field}: {problem}")]
    NotToml {
        /// Dotted path of the value (empty: the document itself).
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// The text is larger than [`SPEC_BYTES_MAX`].
    #[error("spec is {bytes} bytes; at most {limit} are accepted")]
    TooLarge {
        /// Size of the text.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

fn did_you_mean(suggestion: &Option<String>) -> String {
    match suggestion {
        Some(s) => format!(" (did you mean \"{s}\"?)"),
        None => String::new(),
    }
}

impl SpecError {
    /// The dotted field path the error is about, if it is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            SpecError::UnknownField { field, .. }
            | SpecError::Invalid { field, .. }
            | SpecError::Missing { field, .. }
            | SpecError::NotToml { field, .. } => Some(field),
            SpecError::Syntax { .. } | SpecError::Json { .. } | SpecError::TooLarge { .. } => None,
        }
    }

    /// The message without the line it points at (for a spec whose text the user did not
    /// write: a JSON spec's TOML).
    pub fn message_without_line(&self) -> String {
        match self {
            SpecError::UnknownField {
                field, suggestion, ..
            } => format!("unknown field \"{field}\"{}", did_you_mean(suggestion)),
            SpecError::Invalid { field, problem, .. } => format!("{field}: {problem}"),
            other => other.to_string(),
        }
    }

    /// The 1-based line the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            SpecError::Syntax { line, .. }
            | SpecError::Json { line, .. }
            | SpecError::UnknownField { line, .. }
            | SpecError::Invalid { line, .. } => Some(*line),
            SpecError::Missing { .. } | SpecError::NotToml { .. } | SpecError::TooLarge { .. } => {
                None
            }
        }
    }
}

impl JobSpec {
    /// Parses and validates a spec from TOML text. See [`SpecError`] for how errors read.
    pub fn parse(text: &str) -> Result<JobSpec, SpecError> {
        Document::parse(text)?.job_spec()
    }

    /// A train job's trainer tables, typed (`None` for other kinds, and for tables the
    /// trainer would refuse, which admission never lets through). Read when the tables are
    /// made or changed, never here.
    pub fn trainer(&self) -> Option<&TrainSpec> {
        match self.kind {
            JobKind::Train => self.trainer.typed(),
            JobKind::Search | JobKind::Command => None,
        }
    }

    /// `[model]`, `[data]`, `[train]` and `[checkpoint]` as the user gave them.
    pub fn tables(&self) -> &Tables {
        self.trainer.tables()
    }

    /// Changes the trainer's tables with `change` (a search trial's parameters written into
    /// its template's); [`JobSpec::trainer`] reads the changed tables.
    pub fn edit_tables<R>(&mut self, change: impl FnOnce(&mut Tables) -> R) -> R {
        self.trainer.edit(change)
    }

    /// Whether the job's rank processes live through its ring's re-forms (keyed by attempt
    /// and worker, told each new generation on stdin) rather than start again: a train
    /// job's, and a command job's with `[elastic] protocol = "ringleader"`.
    pub fn keeps_ranks_through_reforms(&self) -> bool {
        self.kind == JobKind::Train || self.elastic.protocol == ElasticProtocol::Ringleader
    }
}

impl JobSpec {
    /// A spec given as JSON (an object with the TOML's keys, as `POST /v1/jobs` takes it
    /// with `Content-Type: application/json`) written as the TOML text that means the same,
    /// for [`JobSpec::parse`] and the rest of admission: one gate, the same field names in
    /// its errors. JSON has values TOML lacks: `null` is refused naming its field (leave
    /// the key out instead), and so is an integer beyond `i64`.
    pub fn toml_of_json(json: &str) -> Result<String, SpecError> {
        if json.len() > SPEC_BYTES_MAX {
            return Err(SpecError::TooLarge {
                bytes: json.len(),
                limit: SPEC_BYTES_MAX,
            });
        }
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| SpecError::Json {
            line: e.line().max(1),
            column: e.column().max(1),
            message: e
                .to_string()
                .split(" at line ")
                .next()
                .unwrap_or("")
                .to_owned(),
        })?;
        let serde_json::Value::Object(_) = value else {
            return Err(SpecError::NotToml {
                field: "spec".into(),
                problem: "expected a JSON object with the TOML's keys, e.g. {\"name\": \"a\", \"kind\": \"command\"}".into(),
            });
        };
        match toml_of_json_value("", &value)? {
            toml::Value::Table(t) => toml::to_string(&t).map_err(|e| SpecError::NotToml {
                field: "spec".into(),
                problem: format!("cannot be written as TOML: {e}"),
            }),
            _ => unreachable!("an object makes a table"),
        }
    }
}

/// One JSON value as TOML, `path` naming it in errors.
fn toml_of_json_value(path: &str, v: &serde_json::Value) -> Result<toml::Value, SpecError> {
    use serde_json::Value as J;
    use toml::Value as T;
    let at = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    Ok(match v {
        J::Null => {
            return Err(SpecError::NotToml {
                field: path.to_owned(),
                problem: "null has no TOML form: leave the key out for its default".into(),
            })
        }
        J::Bool(b) => T::Boolean(*b),
        J::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => T::Integer(i),
            (None, Some(_)) if n.is_u64() => {
                return Err(SpecError::NotToml {
                    field: path.to_owned(),
                    problem: format!("{n} is beyond TOML's integers (at most {})", i64::MAX),
                })
            }
            (None, Some(f)) => T::Float(f),
            (None, None) => {
                return Err(SpecError::NotToml {
                    field: path.to_owned(),
                    problem: format!("{n} is not a number TOML can hold"),
                })
            }
        },
        J::String(s) => T::String(s.clone()),
        J::Array(items) => T::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| toml_of_json_value(&format!("{path}[{i}]"), item))
                .collect::<Result<_, _>>()?,
        ),
        J::Object(map) => T::Table(
            map.iter()
                .map(|(k, item)| Ok((k.clone(), toml_of_json_value(&at(k), item)?)))
                .collect::<Result<_, SpecError>>()?,
        ),
    })
}

impl JobSpec {
    /// The spec as TOML text that [`JobSpec::parse`] reads back to an equal spec (fields at
    /// their defaults are written too; an empty `command` or `env` is left out).
    pub fn to_toml(&self) -> String {
        use toml::Value;
        let int = |n: u32| Value::Integer(i64::from(n));
        let mut t = toml::Table::new();
        t.insert("name".into(), Value::String(self.name.clone()));
        t.insert("kind".into(), Value::String(self.kind.as_str().into()));
        t.insert("workers".into(), int(self.workers));
        t.insert("min_workers".into(), int(self.min_workers));
        t.insert("max_workers".into(), int(self.max_workers));
        t.insert("max_restarts".into(), int(self.max_restarts));
        t.insert(
            "placement".into(),
            Value::String(self.placement.as_str().into()),
        );
        t.insert("priority".into(), int(self.priority));
        if !self.command.is_empty() {
            let args = self.command.iter().cloned().map(Value::String).collect();
            t.insert("command".into(), Value::Array(args));
        }
        if !self.env.is_empty() {
            let env = self
                .env
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            t.insert("env".into(), Value::Table(env));
        }
        if !self.secrets.is_empty() {
            let secrets = self
                .secrets
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect();
            t.insert("secrets".into(), Value::Table(secrets));
        }
        let mut resources = toml::Table::new();
        resources.insert(
            "cpus_per_worker".into(),
            int(self.resources.cpus_per_worker),
        );
        resources.insert(
            "gpus_per_worker".into(),
            int(self.resources.gpus_per_worker),
        );
        t.insert("resources".into(), Value::Table(resources));
        for (name, section) in self.sections() {
            if let Some(section) = section {
                t.insert(name.into(), Value::Table(section.clone()));
            }
        }
        let mut elastic = toml::Table::new();
        elastic.insert(
            "straggler_factor".into(),
            Value::Float(self.elastic.straggler_factor),
        );
        elastic.insert(
            "straggler_window".into(),
            int(self.elastic.straggler_window),
        );
        elastic.insert(
            "blacklist_cooldown_s".into(),
            int(self.elastic.blacklist_cooldown_s),
        );
        elastic.insert("rejoin_after_s".into(), int(self.elastic.rejoin_after_s));
        // Only where they may be given: with the ringleader protocol (command jobs).
        if self.elastic.protocol == ElasticProtocol::Ringleader {
            elastic.insert(
                "protocol".into(),
                Value::String(self.elastic.protocol.as_str().into()),
            );
            elastic.insert(
                "first_heartbeat_s".into(),
                int(self.elastic.first_heartbeat_s),
            );
        }
        elastic.insert(
            "keep_global_batch".into(),
            Value::Boolean(self.elastic.keep_global_batch),
        );
        t.insert("elastic".into(), Value::Table(elastic));
        t.insert("preemptible".into(), Value::Boolean(self.preemptible));
        let mut preemption = toml::Table::new();
        preemption.insert("grace_s".into(), int(self.preemption.grace_s));
        t.insert("preemption".into(), Value::Table(preemption));
        if !self.files.is_empty() {
            let files = self
                .files
                .iter()
                .map(|f| {
                    let mut file = toml::Table::new();
                    file.insert("path".into(), Value::String(f.path.clone()));
                    if let Some(text) = &f.text {
                        file.insert("text".into(), Value::String(text.clone()));
                    }
                    if let Some(b64) = &f.base64 {
                        file.insert("base64".into(), Value::String(b64.clone()));
                    }
                    Value::Table(file)
                })
                .collect();
            t.insert("files".into(), Value::Array(files));
        }
        toml::to_string(&t).unwrap_or_default()
    }
}

/// A spec's text parsed once as a TOML document with spans: [`Document::job_spec`] reads the
/// spec from it, and an error found past that (a search's, [`Document::field_error`]) gets
/// its field's line from the same document.
pub struct Document<'t> {
    text: &'t str,
    root: Spanned<DeTable<'t>>,
}

impl<'t> Document<'t> {
    /// Parses `text` (at most [`SPEC_BYTES_MAX`] bytes) as TOML.
    pub fn parse(text: &'t str) -> Result<Document<'t>, SpecError> {
        if text.len() > SPEC_BYTES_MAX {
            return Err(SpecError::TooLarge {
                bytes: text.len(),
                limit: SPEC_BYTES_MAX,
            });
        }
        let root = DeTable::parse(text).map_err(|e| SpecError::Syntax {
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            message: e.message().trim().to_owned(),
        })?;
        Ok(Document { text, root })
    }

    /// The job spec this document holds, checked field by field.
    pub fn job_spec(&self) -> Result<JobSpec, SpecError> {
        Parser { text: self.text }.spec(self.root.get_ref())
    }

    /// The 1-based line of the field at `path` (dotted, `[i]` for array elements, as
    /// [`SpecError`] names fields): the line of its value, or, when the field is absent, of
    /// the deepest part of the path that is present (its table). `None` when nothing of the
    /// path is in the document.
    pub fn line_of(&self, path: &str) -> Option<usize> {
        field_line(self.text, self.root.get_ref(), path)
    }

    /// `error` (a field's problem found past the parse) with its field's line in this
    /// document: [`SpecError::Invalid`], or [`SpecError::Missing`] when nothing of the
    /// field is in the text.
    pub fn field_error(&self, error: FieldError) -> SpecError {
        Parser { text: self.text }.field_error(self.root.get_ref(), error)
    }
}

/// Walks a parsed document; holds the text only to turn spans into lines.
struct Parser<'t> {
    text: &'t str,
}

impl Parser<'_> {
    fn line(&self, span: Range<usize>) -> usize {
        line_of(self.text, span.start)
    }

    fn invalid(
        &self,
        field: &str,
        value: &Spanned<DeValue<'_>>,
        problem: impl Into<String>,
    ) -> SpecError {
        self.invalid_at(field, value.span(), problem)
    }

    /// `field`'s `problem`, at the line of the value at `span`.
    fn invalid_at(&self, field: &str, span: Range<usize>, problem: impl Into<String>) -> SpecError {
        SpecError::Invalid {
            field: field.to_owned(),
            problem: problem.into(),
            line: self.line(span),
        }
    }

    fn spec(&self, doc: &DeTable<'_>) -> Result<JobSpec, SpecError> {
        // Unknown keys first, in text order, so a typo is reported as a typo and not as the
        // missing field it was meant to be; then each value in the order below.
        let root = Spanned::new(0..self.text.len(), DeValue::Table(doc.clone()));
        let top: sections::SpecText = self.read_table("", &root)?;
        let get = |k: &str| -> Option<&Spanned<DeValue<'_>>> { doc.get(k) };

        let name = match &top.name {
            None => {
                return Err(SpecError::Missing {
                    field: "name".into(),
                    problem: "required".into(),
                })
            }
            Some(v) => self.value("name", v)?.0,
        };
        let (kind, kind_line) = match &top.kind {
            None => {
                return Err(SpecError::Missing {
                    field: "kind".into(),
                    problem: "required (one of train, search, command)".into(),
                })
            }
            Some(v) => (self.value("kind", v)?.0, self.line(v.span())),
        };
        let workers = match &top.workers {
            None => 1,
            Some(v) => self.value("workers", v)?.0,
        };
        let min_workers = match &top.min_workers {
            None => workers,
            Some(v) => {
                let n = self.value("min_workers", v)?.0;
                if n > workers {
                    return Err(self.invalid_at(
                        "min_workers",
                        v.span(),
                        format!("must be at most workers ({workers}), got {n}"),
                    ));
                }
                n
            }
        };
        let max_workers = match &top.max_workers {
            None => workers,
            Some(v) => {
                let n = self.value("max_workers", v)?.0;
                if n < workers {
                    return Err(self.invalid_at(
                        "max_workers",
                        v.span(),
                        format!("must be at least workers ({workers}), got {n}"),
                    ));
                }
                n
            }
        };
        let max_restarts = match &top.max_restarts {
            None => MAX_RESTARTS_DEFAULT,
            Some(v) => self.value("max_restarts", v)?.0,
        };
        let placement = match &top.placement {
            None => Placement::default(),
            Some(v) => self.value("placement", v)?.0,
        };
        let priority = match &top.priority {
            None => priority::NORMAL,
            Some(v) => self.value("priority", v)?.0,
        };
        let command = match &top.command {
            None if kind == JobKind::Command => {
                return Err(SpecError::Missing {
                    field: "command".into(),
                    problem: format!(
                        "required when kind = \"command\" (kind at line {kind_line}), e.g. command = [\"python3\", \"train.py\"]"
                    ),
                })
            }
            None => Vec::new(),
            Some(v) if kind == JobKind::Train => {
                return Err(self.invalid_at("command", v.span(), "only allowed when kind = \"command\" or \"search\" (command trials), not \"train\""))
            }
            Some(v) => self.command(v)?,
        };
        let env = match &top.env {
            None => BTreeMap::new(),
            Some(v) => self.env("env", v)?,
        };
        let secrets = match &top.secrets {
            None => BTreeMap::new(),
            Some(v) => self.env("secrets", v)?,
        };
        if let (Some(name), Some(v)) = (secrets.keys().find(|k| env.contains_key(*k)), &top.secrets)
        {
            return Err(self.invalid_at(
                &format!("secrets.{name}"),
                v.span(),
                format!("env.{name} sets it too: give it in one table"),
            ));
        }
        let resources = match get("resources") {
            None => Resources::default(),
            Some(v) => self.resources(v)?,
        };
        let model = self.section("model", get("model"))?;
        let data = self.section("data", get("data"))?;
        let train = self.section("train", get("train"))?;
        let checkpoint = self.section("checkpoint", get("checkpoint"))?;
        let search = match (get("search"), kind) {
            (None, JobKind::Search) => {
                return Err(SpecError::Missing {
                    field: "search".into(),
                    problem: format!("required when kind = \"search\" (kind at line {kind_line})"),
                })
            }
            (Some(v), k) if k != JobKind::Search => {
                return Err(self.invalid(
                    "search",
                    v,
                    format!("only allowed when kind = \"search\", not \"{k}\""),
                ))
            }
            (v, _) => self.section("search", v)?,
        };
        let elastic = match get("elastic") {
            None => Elastic::default(),
            Some(v) => self.elastic(v, kind, min_workers < workers || max_workers > workers)?,
        };
        if let (JobKind::Command, Some(v)) = (kind, get("data")) {
            self.command_data(v)?;
        }
        let files = match get("files") {
            None => Vec::new(),
            Some(v) if kind == JobKind::Train => {
                return Err(self.invalid(
                    "files",
                    v,
                    "only for kind = \"command\" and searches of command trials, not \"train\"",
                ))
            }
            Some(v) => self.files(v)?,
        };
        let preemptible = match &top.preemptible {
            None => true,
            Some(v) => self.value("preemptible", v)?.0,
        };
        let preemption = match get("preemption") {
            None => PreemptionSpec::default(),
            Some(v) => self.preemption(v)?,
        };
        let tables = Tables {
            model,
            data,
            train,
            checkpoint,
        };
        // Last, as admission did before the parse read them: the trainer's own checks.
        let trainer = match kind {
            JobKind::Train => TrainerTables::read_as(
                tables,
                TrainSpec::from_document(doc).map_err(|e| self.field_error(doc, e))?,
            ),
            JobKind::Search | JobKind::Command => TrainerTables::new(tables),
        };
        Ok(JobSpec {
            name,
            kind,
            workers,
            min_workers,
            max_workers,
            max_restarts,
            placement,
            priority,
            command,
            env,
            secrets,
            resources,
            trainer,
            search,
            elastic,
            reports_required: true,
            files,
            preemptible,
            preemption,
        })
    }

    /// A field's problem found past the walk (the trainer's, a search's) with the field's
    /// line in `doc`.
    fn field_error(&self, doc: &DeTable<'_>, error: FieldError) -> SpecError {
        let FieldError { field, problem, .. } = error;
        match field_line(self.text, doc, &field) {
            Some(line) => SpecError::Invalid {
                field,
                problem,
                line,
            },
            None => SpecError::Missing { field, problem },
        }
    }

    /// A command job's `[data]`: only `dataset`, a shared dataset's name (fetched to the
    /// rank's node before it starts, its directory in `RINGLEADER_DATASET_DIR`).
    fn command_data(&self, v: &Spanned<DeValue<'_>>) -> Result<(), SpecError> {
        let Some(table) = v.get_ref().as_table() else {
            return Err(self.invalid("data", v, "expected a table"));
        };
        if let Some((k, _)) = table.iter().find(|(k, _)| &**k.get_ref() != "dataset") {
            let key: &str = k.get_ref();
            return Err(SpecError::Invalid {
                field: format!("data.{key}"),
                problem: "a command job's [data] has only dataset (a shared dataset's name)".into(),
                line: self.line(k.span()),
            });
        }
        match table.get("dataset") {
            Some(d) if d.get_ref().as_str().is_none_or(str::is_empty) => {
                Err(self.invalid("data.dataset", d, "expected a shared dataset's name"))
            }
            _ => Ok(()),
        }
    }

    /// `[[files]]`: an array of tables `{path, text | base64}`.
    fn files(&self, v: &Spanned<DeValue<'_>>) -> Result<Vec<SpecFile>, SpecError> {
        use base64::Engine as _;
        let problem = "expected an array of tables [[files]] with path and text or base64";
        let Some(items) = v.get_ref().as_array() else {
            return Err(self.invalid("files", v, problem));
        };
        if items.len() > FILES_MAX {
            return Err(self.invalid(
                "files",
                v,
                format!("at most {FILES_MAX} files, got {}", items.len()),
            ));
        }
        let mut out: Vec<SpecFile> = Vec::with_capacity(items.len());
        let mut total = 0usize;
        for (i, item) in items.iter().enumerate() {
            let at = format!("files[{i}]");
            if !item.get_ref().is_table() {
                return Err(self.invalid(&at, item, problem));
            }
            let file: sections::FileText = self.read_table(&at, item)?;
            let path = match &file.path {
                None => {
                    return Err(self.invalid(
                        &format!("{at}.path"),
                        item,
                        "required, e.g. path = \"train.py\"",
                    ))
                }
                Some(p) => {
                    let field = format!("{at}.path");
                    let invalid = |problem: String| self.invalid_at(&field, p.span(), problem);
                    let Some(path) = p.get_ref().as_str() else {
                        return Err(invalid("expected a relative path".into()));
                    };
                    if let Some(why) = file_path_problem(path) {
                        return Err(invalid(why));
                    }
                    for (j, other) in out.iter().enumerate() {
                        let nested = |a: &str, b: &str| {
                            a.len() > b.len() && a.starts_with(b) && a.as_bytes()[b.len()] == b'/'
                        };
                        if other.path == path
                            || nested(path, &other.path)
                            || nested(&other.path, path)
                        {
                            return Err(invalid(format!(
                                "{path:?} clashes with files[{j}].path {:?}",
                                other.path
                            )));
                        }
                    }
                    path.to_owned()
                }
            };
            let string = |key: &str, value: &Spanned<toml::Value>| match value.get_ref().as_str() {
                Some(s) => Ok(s.to_owned()),
                None => {
                    Err(self.invalid_at(&format!("{at}.{key}"), value.span(), "expected a string"))
                }
            };
            let (text, b64, size) = match (&file.text, &file.base64) {
                (Some(_), Some(b)) => {
                    return Err(self.invalid_at(
                        &format!("{at}.base64"),
                        b.span(),
                        "give text or base64, not both",
                    ))
                }
                (None, None) => {
                    return Err(self.invalid(
                        &format!("{at}.text"),
                        item,
                        "required: the contents as text = \"…\" or base64 = \"…\"",
                    ))
                }
                (Some(t), None) => {
                    let text = string("text", t)?;
                    let size = text.len();
                    (Some(text), None, size)
                }
                (None, Some(b)) => {
                    let encoded = string("base64", b)?;
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(&encoded)
                        .map_err(|e| {
                            self.invalid_at(
                                &format!("{at}.base64"),
                                b.span(),
                                format!("not standard base64 with padding ({e})"),
                            )
                        })?;
                    (None, Some(encoded), decoded.len())
                }
            };
            total += size;
            if total > FILES_BYTES_MAX {
                return Err(self.invalid(
                    &at,
                    item,
                    format!(
                        "the files come to {total} bytes by here; at most {FILES_BYTES_MAX} are accepted in all"
                    ),
                ));
            }
            out.push(SpecFile {
                path,
                text,
                base64: b64,
            });
        }
        Ok(out)
    }

    /// `[elastic]` of a job of `kind`, whose ring is elastic (`min_workers < workers` or
    /// `max_workers > workers`) when `elastic_ring`.
    fn elastic(
        &self,
        v: &Spanned<DeValue<'_>>,
        kind: JobKind,
        elastic_ring: bool,
    ) -> Result<Elastic, SpecError> {
        if !v.get_ref().is_table() {
            return Err(self.invalid("elastic", v, "expected a table"));
        }
        let text: sections::ElasticText = self.read_table("elastic", v)?;
        let mut e = Elastic::default();
        if let Some(f) = text.straggler_factor {
            e.straggler_factor = f.0;
        }
        if let Some(n) = text.straggler_window {
            e.straggler_window = n.0;
        }
        if let Some(n) = text.blacklist_cooldown_s {
            e.blacklist_cooldown_s = n.0;
        }
        if let Some(n) = text.rejoin_after_s {
            e.rejoin_after_s = n.0;
        }
        if let Some(v) = &text.protocol {
            let invalid = |problem: String| SpecError::Invalid {
                field: "elastic.protocol".into(),
                problem,
                line: self.line(v.span()),
            };
            e.protocol = match v.get_ref().as_str() {
                _ if kind != JobKind::Command => {
                    let why = match kind {
                        JobKind::Train => "a train job's ranks always speak the ringleader protocol",
                        _ => "a search's trials are not elastic",
                    };
                    return Err(invalid(format!(
                        "only for kind = \"command\", not \"{kind}\" ({why})"
                    )));
                }
                Some("torchrun") => ElasticProtocol::Torchrun,
                Some("ringleader") if !elastic_ring => {
                    return Err(invalid(
                        "\"ringleader\" keeps ranks through a re-form of an elastic ring: set min_workers below workers or max_workers above it (or leave protocol out)".into(),
                    ))
                }
                Some("ringleader") => ElasticProtocol::Ringleader,
                _ => return Err(invalid("expected \"ringleader\" or \"torchrun\"".into())),
            };
        }
        if let Some(v) = &text.first_heartbeat_s {
            let invalid = |problem: String| SpecError::Invalid {
                field: "elastic.first_heartbeat_s".into(),
                problem,
                line: self.line(v.span()),
            };
            if e.protocol != ElasticProtocol::Ringleader {
                return Err(invalid(
                    "only with protocol = \"ringleader\" (the ranks that must speak the protocol)"
                        .into(),
                ));
            }
            let n: sections::Bounded<1, FIRST_HEARTBEAT_S_MAX> =
                ringleader_spec::field_value::value_as(v.get_ref()).map_err(invalid)?;
            e.first_heartbeat_s = n.0;
        }
        if let Some(b) = text.keep_global_batch {
            e.keep_global_batch = b.0;
        }
        Ok(e)
    }

    /// `[preemption]`: `grace_s`.
    fn preemption(&self, v: &Spanned<DeValue<'_>>) -> Result<PreemptionSpec, SpecError> {
        if !v.get_ref().is_table() {
            return Err(self.invalid("preemption", v, "expected a table"));
        }
        let text: sections::PreemptionText = self.read_table("preemption", v)?;
        let mut p = PreemptionSpec::default();
        if let Some(n) = text.grace_s {
            p.grace_s = n.0;
        }
        Ok(p)
    }

    /// The table `v` at `path` read as `T` by the one reader of a spec's tables
    /// ([`ringleader_spec::read_table`]), its error given its line.
    fn read_table<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        v: &Spanned<DeValue<'_>>,
    ) -> Result<T, SpecError> {
        ringleader_spec::read_table(path, v).map_err(|e| {
            let line = self.line(e.span.unwrap_or_else(|| v.span()));
            let FieldError {
                field,
                problem,
                unknown,
            } = e.error;
            if unknown {
                SpecError::UnknownField {
                    field,
                    line,
                    suggestion: e.suggestion,
                }
            } else {
                SpecError::Invalid {
                    field,
                    problem,
                    line,
                }
            }
        })
    }

    /// A top-level value read by its rule ([`sections::SpecText`]): what the rule made of
    /// it, or its problem at its line.
    fn value<T: Clone>(&self, field: &str, v: &sections::Value<T>) -> Result<T, SpecError> {
        v.get_ref()
            .0
            .clone()
            .map_err(|problem| self.invalid_at(field, v.span(), problem))
    }

    /// `command`: a non-empty array of strings, the program not empty.
    fn command(
        &self,
        v: &sections::Value<Vec<sections::Value<sections::Text>>>,
    ) -> Result<Vec<String>, SpecError> {
        let problem = "expected a non-empty array of strings, e.g. [\"python3\", \"train.py\"]";
        let items = match &v.get_ref().0 {
            Ok(items) if !items.is_empty() => items,
            _ => return Err(self.invalid_at("command", v.span(), problem)),
        };
        if items.len() > COMMAND_ARGS_MAX {
            return Err(self.invalid_at(
                "command",
                v.span(),
                format!("at most {COMMAND_ARGS_MAX} arguments, got {}", items.len()),
            ));
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let arg = self.value(&format!("command[{i}]"), item)?.0;
            if i == 0 && arg.is_empty() {
                return Err(self.invalid_at(
                    "command[0]",
                    item.span(),
                    "the program must not be empty",
                ));
            }
            out.push(arg);
        }
        Ok(out)
    }

    /// `env` or `secrets` (`section`): a table of variable names to strings, read in text
    /// order.
    fn env(
        &self,
        section: &str,
        v: &sections::Value<sections::Vars>,
    ) -> Result<BTreeMap<String, String>, SpecError> {
        let Ok(vars) = &v.get_ref().0 else {
            return Err(self.invalid_at(section, v.span(), "expected a table of NAME = \"value\""));
        };
        if vars.len() > ENV_VARS_MAX {
            return Err(self.invalid_at(
                section,
                v.span(),
                format!("at most {ENV_VARS_MAX} variables, got {}", vars.len()),
            ));
        }
        let mut entries: Vec<_> = vars.iter().collect();
        entries.sort_by_key(|(k, _)| k.span().start);
        let mut out = BTreeMap::new();
        for (k, val) in entries {
            let key = k.get_ref();
            let field = format!("{section}.{key}");
            if let Some(problem) = check::env_name_problem(key) {
                return Err(self.invalid_at(&field, k.span(), problem));
            }
            let value = self.value(&field, val)?.0;
            if key == DEVICE_ORDER_ENV && value != DEVICE_ORDER {
                return Err(self.invalid_at(
                    &field,
                    val.span(),
                    format!(
                        "the node numbers GPUs in PCI bus order, as nvidia-smi does: only \
                         {DEVICE_ORDER:?} (another order could put two ranks on one GPU)"
                    ),
                ));
            }
            out.insert(key.clone(), value);
        }
        Ok(out)
    }

    fn resources(&self, v: &Spanned<DeValue<'_>>) -> Result<Resources, SpecError> {
        if !v.get_ref().is_table() {
            return Err(self.invalid("resources", v, "expected a table"));
        }
        let text: sections::ResourcesText = self.read_table("resources", v)?;
        let mut r = Resources::default();
        if let Some(n) = text.cpus_per_worker {
            r.cpus_per_worker = n.0;
        }
        if let Some(n) = text.gpus_per_worker {
            r.gpus_per_worker = n.0;
        }
        Ok(r)
    }

    /// A section kept generic for the trainer: it must be a table; floats must be finite (the
    /// spec travels as JSON in the Raft log, which has no NaN or infinity).
    fn section(
        &self,
        field: &str,
        v: Option<&Spanned<DeValue<'_>>>,
    ) -> Result<Option<toml::Table>, SpecError> {
        let Some(v) = v else { return Ok(None) };
        if !v.get_ref().is_table() {
            return Err(self.invalid(field, v, "expected a table"));
        }
        self.finite_floats(field, v)?;
        let value =
            <toml::Value as Deserialize>::deserialize(toml::de::ValueDeserializer::from(v.clone()))
                .map_err(|e| self.invalid(field, v, e.message().trim().to_owned()))?;
        match value {
            toml::Value::Table(t) => Ok(Some(t)),
            _ => Err(self.invalid(field, v, "expected a table")),
        }
    }

    fn finite_floats(&self, path: &str, v: &Spanned<DeValue<'_>>) -> Result<(), SpecError> {
        match v.get_ref() {
            DeValue::Float(f) => {
                let finite = f.as_str().parse::<f64>().is_ok_and(f64::is_finite);
                if finite {
                    Ok(())
                } else {
                    Err(self.invalid(path, v, "expected a finite number"))
                }
            }
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    self.finite_floats(&format!("{path}[{i}]"), item)?;
                }
                Ok(())
            }
            DeValue::Table(t) => {
                for (k, item) in t.iter() {
                    let key: &str = k.get_ref();
                    self.finite_floats(&format!("{path}.{key}"), item)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The 1-based line of the field at `path` in the spec `text` ([`Document::line_of`]);
/// `None` when the text does not parse or nothing of the path is in it.
pub fn line_of_field(text: &str, path: &str) -> Option<usize> {
    Document::parse(text).ok()?.line_of(path)
}

/// [`Document::line_of`] over `doc`, parsed from `text`.
fn field_line(text: &str, doc: &DeTable<'_>, path: &str) -> Option<usize> {
    let mut value: Option<&Spanned<DeValue<'_>>> = None;
    let mut table: Option<&DeTable<'_>> = Some(doc);
    let mut line = None;
    for part in path.split('.') {
        let (key, indexes) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        let Some(v) = table.and_then(|t| t.get(key)) else {
            return line;
        };
        let mut v = v;
        line = Some(line_of(text, v.span().start));
        for index in indexes
            .split(['[', ']'])
            .filter(|s| !s.is_empty())
            .filter_map(|s| s.parse::<usize>().ok())
        {
            match v.get_ref().as_array().and_then(|a| a.get(index)) {
                Some(item) => {
                    v = item;
                    line = Some(line_of(text, v.span().start));
                }
                None => return line,
            }
        }
        value = Some(v);
        table = v.get_ref().as_table();
    }
    value.map(|v| line_of(text, v.span().start)).or(line)
}

/// 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests;
