//! The rules a spec's values must meet, checked on the typed value: [`check()`].
//!
//! Admission is this check on a [`JobSpec`], however it came: the text the API took is
//! parsed first ([`JobSpec::parse`], which reads types and refuses unknown keys with their
//! lines, and applies the same bounds as it reads, so its errors point at the line), then
//! checked here; a spec another node forwarded (already a value, no text) is checked here
//! alone, with no trip back through TOML. The rules are the parse's, in its order, with the
//! same field names and problems; the one difference is that a value has no line to point
//! at, so an error reads `field: problem`.
//!
//! What only the value holds is checked here too: a train job's trainer tables (read once,
//! and kept typed on the spec) and that the spec was admitted by this version
//! (`reports_required`). A search's `[search]` and every trial it could make are the
//! search's own rules (`domain::search::spec::validate`); admission asks both
//! (`domain::admission::check`).
//!
//! Invariant (property-tested in `jobs`' tests): every spec the text parse accepts passes
//! [`check()`], as parsed and as read back from its stored form.

use std::collections::BTreeMap;

use ringleader_spec::FieldError;

use super::{
    file_path_problem, priority, ElasticProtocol, JobKind, JobSpec, BLACKLIST_COOLDOWN_S_MAX,
    COMMAND_ARGS_MAX, CPUS_PER_WORKER_MAX, DEVICES_ENV, ENV_VARS_MAX, FILES_BYTES_MAX, FILES_MAX,
    FIRST_HEARTBEAT_S_DEFAULT, FIRST_HEARTBEAT_S_MAX, GPUS_PER_WORKER_MAX, MAX_RESTARTS_MAX,
    NAME_BYTES_MAX, NODE_ENV_ALLOWED, NODE_ENV_PREFIX, PREEMPTION_GRACE_S_MAX, REJOIN_AFTER_S_MAX,
    RESERVED_ENV, STRAGGLER_WINDOW_MAX, WORKERS_MAX,
};
use crate::device_order::{DEVICE_ORDER, DEVICE_ORDER_ENV};

/// Checks every rule a spec's values must meet (see the module doc); the error names the
/// field. A train job's trainer tables are read here unless the parse already read them,
/// and kept typed on the spec ([`JobSpec::trainer`]).
pub fn check(spec: &JobSpec) -> Result<(), FieldError> {
    name(&spec.name)?;
    let workers = bounded("workers", spec.workers, 1, WORKERS_MAX)?;
    let min_workers = bounded("min_workers", spec.min_workers, 1, WORKERS_MAX)?;
    if min_workers > workers {
        return Err(FieldError::new(
            "min_workers",
            format!("must be at most workers ({workers}), got {min_workers}"),
        ));
    }
    let max_workers = bounded("max_workers", spec.max_workers, 1, WORKERS_MAX)?;
    if max_workers < workers {
        return Err(FieldError::new(
            "max_workers",
            format!("must be at least workers ({workers}), got {max_workers}"),
        ));
    }
    bounded("max_restarts", spec.max_restarts, 0, MAX_RESTARTS_MAX)?;
    priority::parse(&spec.priority.to_string()).map_err(|e| FieldError::new("priority", e))?;
    command(spec)?;
    env("env", &spec.env)?;
    env("secrets", &spec.secrets)?;
    if let Some(name) = spec.secrets.keys().find(|k| spec.env.contains_key(*k)) {
        return Err(FieldError::new(
            format!("secrets.{name}"),
            format!("env.{name} sets it too: give it in one table"),
        ));
    }
    bounded(
        "resources.cpus_per_worker",
        spec.resources.cpus_per_worker,
        1,
        CPUS_PER_WORKER_MAX,
    )?;
    bounded(
        "resources.gpus_per_worker",
        spec.resources.gpus_per_worker,
        0,
        GPUS_PER_WORKER_MAX,
    )?;
    for (field, section) in spec.sections() {
        if let Some(table) = section {
            for (key, value) in table {
                finite_floats(&format!("{field}.{key}"), value)?;
            }
        }
    }
    match (&spec.search, spec.kind) {
        (None, JobKind::Search) => {
            return Err(FieldError::new("search", "required when kind = \"search\""))
        }
        (Some(_), k) if k != JobKind::Search => {
            return Err(FieldError::new(
                "search",
                format!("only allowed when kind = \"search\", not \"{k}\""),
            ))
        }
        _ => {}
    }
    elastic(spec)?;
    if let (JobKind::Command, Some(data)) = (spec.kind, &spec.tables().data) {
        command_data(data)?;
    }
    files(spec)?;
    bounded(
        "preemption.grace_s",
        spec.preemption.grace_s,
        1,
        PREEMPTION_GRACE_S_MAX,
    )?;
    if spec.kind == JobKind::Train && spec.trainer().is_none() {
        // The tables' reading failed when they were made: read them again for the error.
        super::train::read(spec)?;
    }
    if !spec.reports_required {
        return Err(FieldError::new(
            "reports_required",
            "not set: the spec was not admitted by this version (submit it again)",
        ));
    }
    Ok(())
}

impl JobSpec {
    /// The tables kept generic (the trainer's and `[search]`), by key.
    pub(super) fn sections(&self) -> [(&'static str, &Option<toml::Table>); 5] {
        let [model, data, train, checkpoint] = self.tables().by_name();
        [model, data, train, checkpoint, ("search", &self.search)]
    }
}

/// `n` in `min..=max`; the message says "positive" or "non-negative" by `min`, as the
/// parse's does.
fn bounded(field: &str, n: u32, min: u32, max: u32) -> Result<u32, FieldError> {
    match bounded_problem(i128::from(n), min, max) {
        Some(problem) => Err(FieldError::new(field, problem)),
        None => Ok(n),
    }
}

/// Why `n` is not an integer in `min..=max` (`None` when it is): "expected a positive
/// integer" ("non-negative" when `min` is 0) below, "must be at most MAX, got N" above. The
/// one wording of a bounded integer's problem, for the parse and the typed check alike.
pub(super) fn bounded_problem(n: i128, min: u32, max: u32) -> Option<String> {
    if n < i128::from(min) {
        Some(format!("expected {}", integer_kind(min)))
    } else if n > i128::from(max) {
        Some(format!("must be at most {max}, got {n}"))
    } else {
        None
    }
}

/// "a positive integer", or "a non-negative integer" when `min` is 0.
pub(super) fn integer_kind(min: u32) -> &'static str {
    if min == 0 {
        "a non-negative integer"
    } else {
        "a positive integer"
    }
}

fn name(name: &str) -> Result<(), FieldError> {
    match name_is_valid(name) {
        true => Ok(()),
        false => Err(FieldError::new("name", name_problem())),
    }
}

/// Whether `name` is a job's name: a non-empty string of A-Z a-z 0-9 _ . - of at most
/// [`NAME_BYTES_MAX`] bytes.
pub(super) fn name_is_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

/// What a name that is not [`name_is_valid`] gets.
pub(super) fn name_problem() -> String {
    format!("expected a non-empty string of A-Z a-z 0-9 _ . - (at most {NAME_BYTES_MAX} bytes)")
}

/// `command`: required for a command job, refused for a train job; at most
/// [`COMMAND_ARGS_MAX`] arguments, the program not empty.
fn command(spec: &JobSpec) -> Result<(), FieldError> {
    match spec.kind {
        JobKind::Command if spec.command.is_empty() => {
            return Err(FieldError::new(
                "command",
                "required when kind = \"command\", e.g. command = [\"python3\", \"train.py\"]",
            ))
        }
        JobKind::Train if !spec.command.is_empty() => return Err(FieldError::new(
            "command",
            "only allowed when kind = \"command\" or \"search\" (command trials), not \"train\"",
        )),
        _ => {}
    }
    if spec.command.len() > COMMAND_ARGS_MAX {
        return Err(FieldError::new(
            "command",
            format!(
                "at most {COMMAND_ARGS_MAX} arguments, got {}",
                spec.command.len()
            ),
        ));
    }
    if spec.command.first().is_some_and(String::is_empty) {
        return Err(FieldError::new(
            "command[0]",
            "the program must not be empty",
        ));
    }
    Ok(())
}

/// `env` or `secrets` (`section`): variable names a spec may set.
fn env(section: &str, vars: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if vars.len() > ENV_VARS_MAX {
        return Err(FieldError::new(
            section,
            format!("at most {ENV_VARS_MAX} variables, got {}", vars.len()),
        ));
    }
    for (key, value) in vars {
        let field = format!("{section}.{key}");
        let problem = if let Some(problem) = env_name_problem(key) {
            problem
        } else if key == DEVICE_ORDER_ENV && value != DEVICE_ORDER {
            format!(
                "the node numbers GPUs in PCI bus order, as nvidia-smi does: only \
                 {DEVICE_ORDER:?} (another order could put two ranks on one GPU)"
            )
        } else {
            continue;
        };
        return Err(FieldError::new(field, problem));
    }
    Ok(())
}

/// Why `key` cannot be a variable of a spec's `env` or `secrets`, or `None` when it can:
/// a name of A-Z a-z 0-9 _ not starting with a digit, none ringleader sets for every
/// worker ([`RESERVED_ENV`], [`DEVICES_ENV`]) and none of the node's namespace
/// ([`NODE_ENV_PREFIX`]) but [`NODE_ENV_ALLOWED`].
pub(super) fn env_name_problem(key: &str) -> Option<String> {
    let valid_name = key
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid_name {
        Some("expected a variable name of A-Z a-z 0-9 _ not starting with a digit".to_owned())
    } else if RESERVED_ENV.contains(&key) {
        Some("reserved: ringleader sets it for every worker".to_owned())
    } else if key == DEVICES_ENV {
        Some(
            "reserved: the node gives each rank its GPUs (see [resources] gpus_per_worker)"
                .to_owned(),
        )
    } else if key.starts_with(NODE_ENV_PREFIX) && !NODE_ENV_ALLOWED.contains(&key) {
        Some(format!(
            "reserved: the node owns the {NODE_ENV_PREFIX}* variables (a job may set only {})",
            NODE_ENV_ALLOWED.join(", ")
        ))
    } else {
        None
    }
}

/// Floats in a trainer's or a search's table are finite (the log's JSON has no NaN).
fn finite_floats(path: &str, value: &toml::Value) -> Result<(), FieldError> {
    match value {
        toml::Value::Float(f) if !f.is_finite() => {
            Err(FieldError::new(path, "expected a finite number"))
        }
        toml::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| finite_floats(&format!("{path}[{i}]"), item)),
        toml::Value::Table(t) => t
            .iter()
            .try_for_each(|(k, item)| finite_floats(&format!("{path}.{k}"), item)),
        _ => Ok(()),
    }
}

/// `[elastic]` of the spec's kind and ring.
fn elastic(spec: &JobSpec) -> Result<(), FieldError> {
    let e = &spec.elastic;
    if !(e.straggler_factor.is_finite() && e.straggler_factor > 1.0) {
        return Err(FieldError::new(
            "elastic.straggler_factor",
            "expected a number above 1",
        ));
    }
    bounded(
        "elastic.straggler_window",
        e.straggler_window,
        1,
        STRAGGLER_WINDOW_MAX,
    )?;
    bounded(
        "elastic.blacklist_cooldown_s",
        e.blacklist_cooldown_s,
        1,
        BLACKLIST_COOLDOWN_S_MAX,
    )?;
    bounded(
        "elastic.rejoin_after_s",
        e.rejoin_after_s,
        1,
        REJOIN_AFTER_S_MAX,
    )?;
    let elastic_ring = spec.min_workers < spec.workers || spec.max_workers > spec.workers;
    if e.protocol == ElasticProtocol::Ringleader {
        if spec.kind != JobKind::Command {
            let why = match spec.kind {
                JobKind::Train => "a train job's ranks always speak the ringleader protocol",
                _ => "a search's trials are not elastic",
            };
            return Err(FieldError::new(
                "elastic.protocol",
                format!("only for kind = \"command\", not \"{}\" ({why})", spec.kind),
            ));
        }
        if !elastic_ring {
            return Err(FieldError::new(
                "elastic.protocol",
                "\"ringleader\" keeps ranks through a re-form of an elastic ring: set min_workers below workers or max_workers above it (or leave protocol out)",
            ));
        }
        bounded(
            "elastic.first_heartbeat_s",
            e.first_heartbeat_s,
            1,
            FIRST_HEARTBEAT_S_MAX,
        )?;
    } else if e.first_heartbeat_s != FIRST_HEARTBEAT_S_DEFAULT {
        return Err(FieldError::new(
            "elastic.first_heartbeat_s",
            "only with protocol = \"ringleader\" (the ranks that must speak the protocol)",
        ));
    }
    Ok(())
}

/// A command job's `[data]`: only `dataset`, a shared dataset's name.
fn command_data(data: &toml::Table) -> Result<(), FieldError> {
    if let Some(key) = data.keys().find(|k| *k != "dataset") {
        return Err(FieldError::new(
            format!("data.{key}"),
            "a command job's [data] has only dataset (a shared dataset's name)",
        ));
    }
    match data.get("dataset") {
        Some(d) if d.as_str().is_none_or(str::is_empty) => Err(FieldError::new(
            "data.dataset",
            "expected a shared dataset's name",
        )),
        _ => Ok(()),
    }
}

/// `[[files]]`: not for a train job; at most [`FILES_MAX`] of [`FILES_BYTES_MAX`] in all,
/// each with a plain relative path that clashes with no other and one of text or base64.
fn files(spec: &JobSpec) -> Result<(), FieldError> {
    if spec.files.is_empty() {
        return Ok(());
    }
    if spec.kind == JobKind::Train {
        return Err(FieldError::new(
            "files",
            "only for kind = \"command\" and searches of command trials, not \"train\"",
        ));
    }
    if spec.files.len() > FILES_MAX {
        return Err(FieldError::new(
            "files",
            format!("at most {FILES_MAX} files, got {}", spec.files.len()),
        ));
    }
    let mut total = 0usize;
    for (i, file) in spec.files.iter().enumerate() {
        let at = format!("files[{i}]");
        let path = &file.path;
        if let Some(why) = file_path_problem(path) {
            return Err(FieldError::new(format!("{at}.path"), why));
        }
        let nested = |a: &str, b: &str| {
            a.len() > b.len() && a.starts_with(b) && a.as_bytes()[b.len()] == b'/'
        };
        if let Some((j, other)) = spec.files[..i].iter().enumerate().find(|(_, other)| {
            other.path == *path || nested(path, &other.path) || nested(&other.path, path)
        }) {
            return Err(FieldError::new(
                format!("{at}.path"),
                format!("{path:?} clashes with files[{j}].path {:?}", other.path),
            ));
        }
        let size = match (&file.text, &file.base64) {
            (Some(_), Some(_)) => {
                return Err(FieldError::new(
                    format!("{at}.base64"),
                    "give text or base64, not both",
                ))
            }
            (None, None) => {
                return Err(FieldError::new(
                    format!("{at}.text"),
                    "required: the contents as text = \"…\" or base64 = \"…\"",
                ))
            }
            (Some(text), None) => text.len(),
            (None, Some(encoded)) => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| {
                        FieldError::new(
                            format!("{at}.base64"),
                            format!("not standard base64 with padding ({e})"),
                        )
                    })?
                    .len()
            }
        };
        total += size;
        if total > FILES_BYTES_MAX {
            return Err(FieldError::new(
                at,
                format!(
                    "the files come to {total} bytes by here; at most {FILES_BYTES_MAX} are accepted in all"
                ),
            ));
        }
    }
    Ok(())
}
