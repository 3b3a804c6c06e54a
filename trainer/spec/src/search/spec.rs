//! The `[search]` table of a search job: [`SearchSpec`] and its reader.
//!
//! Read by serde ([`text`]'s structs, through [`crate::read_table`], the one reader of a
//! spec's tables), then checked across fields. Every error carries the full dotted path of
//! the offending key (`search.params[1].max`, `search.trails` for an unknown key,
//! `search.metric` for a missing one), which the node maps back to a line of the submitted
//! file.

mod text;

use serde::{Deserialize, Serialize};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use self::text::{expected, ParamText, ParamType, SearchText};
use super::space::{self, ParamKind, ParamSpec, Scale};
use crate::field_value::value_as;

/// Most parameters in one search.
pub const PARAMS_MAX: usize = 64;
/// Most values in one discrete or categorical parameter.
pub const VALUES_MAX: usize = 1000;
/// Most values in all the discrete and categorical parameters of one search together
/// ([`PARAMS_MAX`] × [`VALUES_MAX`] would be 64,000): the node checks a trial at every
/// value at submit, and the spec is replicated to every member.
pub(crate) const VALUES_TOTAL_MAX: usize = 10_000;
/// Longest parameter name, bytes.
pub const PARAM_NAME_BYTES_MAX: usize = 128;
/// Most trials in one search.
pub const TRIALS_MAX: u32 = 100_000;
/// Default `grid_points` of a double parameter.
pub const GRID_POINTS_DEFAULT: u32 = 5;
/// Most `grid_points` of a double parameter.
pub const GRID_POINTS_MAX: u32 = 1000;
/// Most values an integer parameter may enumerate in a grid search.
pub const GRID_INTEGER_VALUES_MAX: u64 = 1000;
/// Most points in a grid (the product of the parameters' grid lengths).
pub const GRID_SIZE_MAX: u64 = 100_000;

/// A problem with a `[search]` table: the full path of the key and what is wrong (the
/// same type as the trainer's tables' errors).
pub type SearchError = crate::FieldError;

/// The search algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Every point of the Cartesian product of the parameters' grid values.
    Grid,
    /// Independent draws by each parameter's scale.
    Random,
    /// Asynchronous successive halving (Li et al. 2020).
    Asha,
    /// Hyperband over ASHA brackets (Li et al. 2018, 2020).
    Hyperband,
    /// Tree-structured Parzen estimator (Bergstra et al. 2011).
    Tpe,
}

/// Whether the metric is maximised or minimised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Higher is better (accuracy).
    Max,
    /// Lower is better (loss).
    Min,
}

/// What a trial runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialKind {
    /// A ringleader training job built from the template (resumable from checkpoints).
    Train,
    /// A user command printing metric lines (cannot pause and resume).
    Command,
}

/// Early stopping for grid, random and TPE searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopping {
    /// Trials run to their target.
    None,
    /// The median stopping rule (Golovin et al. 2017).
    Median,
}

/// A search job's `[search]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSpec {
    /// `trial`: what each trial runs. Default `train`.
    pub trial: TrialKind,
    /// `algorithm`: required.
    pub algorithm: Algorithm,
    /// `trials`: number of trials to create, 1..=[`TRIALS_MAX`]; required except for a
    /// grid, where it caps the grid and defaults to the grid's size.
    pub trials: u32,
    /// `max_parallel`: most trials pending or running at once; 0 (default) = no cap.
    pub max_parallel: u32,
    /// `metric`: name of the reported metric to optimise; required.
    pub metric: String,
    /// `direction`: `max` or `min`; required.
    pub direction: Direction,
    /// `seed`: seeds every random choice. Default 0.
    pub seed: u64,
    /// `resource`: what rungs count; only `epochs`. Default `epochs`.
    pub resource: String,
    /// `min_resource`: first rung, epochs (≥ 1). Default 1.
    pub min_resource: u32,
    /// `max_resource`: last rung and every trial's final target, epochs (≥ `min_resource`).
    /// Required for ASHA and Hyperband with command trials; for train trials the node fills
    /// it from the template's `train.epochs` when absent.
    pub max_resource: Option<u32>,
    /// `reduction_factor` η: ASHA keeps the top 1/η of each rung (≥ 2). Default 3.
    pub reduction_factor: u32,
    /// `stopping`: early stopping for grid, random and TPE. Default `none`.
    pub stopping: Stopping,
    /// `max_trial_failures`: failed trials tolerated before the node fails the search.
    /// Default 3.
    pub max_trial_failures: u32,
    /// `speculate_factor`: the node starts a speculative copy of a trial running this many
    /// times longer than the median; 0 = off, else finite and > 1. Default 2.0.
    pub speculate_factor: f64,
    /// `resumable`: command trials run to their rung and exit (they resume from their own
    /// checkpoint when promoted), so ASHA and Hyperband pause and promote them as train
    /// trials. Default false (train trials are always resumable).
    #[serde(default)]
    pub resumable: bool,
    /// `[[search.params]]`: the searched parameters (1..=[`PARAMS_MAX`]).
    pub params: Vec<ParamSpec>,
}

impl SearchSpec {
    /// Parses and validates the `[search]` table (its `[[search.params]]` being the array of
    /// tables under key `params`). Unknown keys are refused; integers are accepted where
    /// floats are expected.
    pub fn from_table(search: &toml::Table) -> Result<SearchSpec, SearchError> {
        // Written as text and parsed again, for the spans serde names a field by (the node
        // finds the field's line in the user's own text).
        let mut doc = toml::Table::new();
        doc.insert("search".into(), toml::Value::Table(search.clone()));
        let written =
            toml::to_string(&doc).map_err(|e| SearchError::new("search", e.to_string()))?;
        let parsed = DeTable::parse(&written)
            .map_err(|e| SearchError::new("search", e.message().trim().to_owned()))?;
        let Some(table) = parsed.get_ref().get("search") else {
            return Err(SearchError::new("search", "expected a table"));
        };
        let t: SearchText = read(SEARCH, table)?;
        let err = |key: &str, problem: String| SearchError::new(format!("{SEARCH}.{key}"), problem);
        let required = |key: &str| err(key, "missing (required)".into());

        let trial = t.trial.map_or(TrialKind::Train, |c| c.0);
        let algorithm = t.algorithm.ok_or_else(|| required("algorithm"))?.0;
        let trials = t.trials.map(|n| n.0);
        let max_parallel = t.max_parallel.map_or(0, |n| n.0);
        let metric = t.metric.ok_or_else(|| required("metric"))?.0;
        if metric.is_empty() {
            return Err(err("metric", "must not be empty".into()));
        }
        let direction = t.direction.ok_or_else(|| required("direction"))?.0;
        let seed = match t.seed.map(|s| s.0) {
            None => 0,
            Some(s) if s >= 0 => s as u64,
            Some(_) => return Err(err("seed", "must be a non-negative integer".into())),
        };
        let resource = t.resource.map_or_else(|| "epochs".to_owned(), |r| r.0);
        if resource != "epochs" {
            return Err(err(
                "resource",
                format!("unknown resource \"{resource}\" (only \"epochs\" is supported)"),
            ));
        }
        let min_resource = t.min_resource.map_or(1, |n| n.0);
        let max_resource = t.max_resource.map(|n| n.0);
        if let Some(max) = max_resource {
            if max < min_resource {
                return Err(err(
                    "max_resource",
                    format!("must be at least min_resource ({min_resource})"),
                ));
            }
        }
        let reduction_factor = t.reduction_factor.map_or(3, |n| n.0);
        let stopping = t.stopping.map_or(Stopping::None, |c| c.0);
        let max_trial_failures = t.max_trial_failures.map_or(3, |n| n.0);
        let speculate_factor = t.speculate_factor.map_or(2.0, |x| x.0);
        if speculate_factor != 0.0 && speculate_factor <= 1.0 {
            return Err(err(
                "speculate_factor",
                "must be 0 (off) or greater than 1".into(),
            ));
        }

        let resumable = t.resumable.is_some_and(|b| b.0);
        if resumable && trial != TrialKind::Command {
            return Err(err(
                "resumable",
                "only for command trials (search.trial = \"command\"): train trials always resume"
                    .into(),
            ));
        }

        let params = parse_params(t.params.as_ref(), table.get_ref().as_table())?;

        let asha = matches!(algorithm, Algorithm::Asha | Algorithm::Hyperband);
        if asha && stopping == Stopping::Median {
            return Err(err(
                "stopping",
                "median stopping applies to grid, random and tpe searches (asha and hyperband stop trials themselves)".into(),
            ));
        }
        if asha && trial == TrialKind::Command && max_resource.is_none() {
            return Err(err(
                "max_resource",
                "missing (required for asha and hyperband with command trials)".into(),
            ));
        }
        let trials = if algorithm == Algorithm::Grid {
            for (i, p) in params.iter().enumerate() {
                if matches!(p.kind, ParamKind::Integer { .. })
                    && p.grid_len() > GRID_INTEGER_VALUES_MAX
                {
                    return Err(SearchError::new(
                        format!("search.params[{i}].max"),
                        format!(
                            "an integer range of {} values is too large for a grid (at most {GRID_INTEGER_VALUES_MAX})",
                            p.grid_len()
                        ),
                    ));
                }
            }
            let size = space::grid_size(&params);
            if size > GRID_SIZE_MAX {
                return Err(err(
                    "params",
                    format!("the grid has {size} points (at most {GRID_SIZE_MAX})"),
                ));
            }
            trials.map_or(size as u32, |cap| cap.min(size as u32))
        } else {
            trials.ok_or_else(|| required("trials"))?
        };

        Ok(SearchSpec {
            trial,
            algorithm,
            trials,
            max_parallel,
            metric,
            direction,
            seed,
            resource,
            min_resource,
            max_resource,
            reduction_factor,
            stopping,
            max_trial_failures,
            speculate_factor,
            resumable,
            params,
        })
    }

    /// Whether trials run to their rung and resume from their own checkpoint when
    /// promoted: train trials, and command trials with `resumable = true`.
    pub fn resumable_trials(&self) -> bool {
        self.trial == TrialKind::Train || self.resumable
    }

    /// The grid's size (product of the parameters' grid lengths), saturating.
    pub fn grid_size(&self) -> u64 {
        space::grid_size(&self.params)
    }

    /// The checks sampling and the rungs rely on, repeated by [`SearchSpec::searcher`] for a
    /// spec built or completed outside [`SearchSpec::from_table`].
    pub(crate) fn validate_for_searcher(&self) -> Result<(), SearchError> {
        if self.min_resource < 1 {
            return Err(SearchError::new(
                "search.min_resource",
                "must be at least 1",
            ));
        }
        if self.reduction_factor < 2 {
            return Err(SearchError::new(
                "search.reduction_factor",
                "must be at least 2",
            ));
        }
        if self.params.is_empty() {
            return Err(SearchError::new("search.params", "must not be empty"));
        }
        for (i, p) in self.params.iter().enumerate() {
            let bad = match &p.kind {
                ParamKind::Double { min, max, .. } => {
                    !(min.is_finite() && max.is_finite() && min < max)
                }
                ParamKind::Integer { min, max, .. } => min > max,
                ParamKind::Discrete { values } | ParamKind::Categorical { values } => {
                    values.is_empty()
                }
            };
            if bad {
                return Err(SearchError::new(
                    format!("search.params[{i}]"),
                    "empty range or list",
                ));
            }
        }
        match self.max_resource {
            Some(max) if max < self.min_resource => Err(SearchError::new(
                "search.max_resource",
                format!("must be at least min_resource ({})", self.min_resource),
            )),
            None if matches!(self.algorithm, Algorithm::Asha | Algorithm::Hyperband) => {
                Err(SearchError::new(
                    "search.max_resource",
                    "missing (asha and hyperband need the largest resource; for train trials it defaults to the template's train.epochs)",
                ))
            }
            _ => Ok(()),
        }
    }
}

/// The path of the `[search]` table.
const SEARCH: &str = "search";

/// The table `value` at `path` read as `T` by the one reader of a spec's tables; an unknown
/// key's problem worded as the search's always has been ("unknown field").
fn read<T: serde::de::DeserializeOwned>(
    path: &str,
    value: &Spanned<DeValue<'_>>,
) -> Result<T, SearchError> {
    crate::read_table(path, value).map_err(|e| {
        if e.error.unknown {
            SearchError::new(e.error.field, "unknown field")
        } else {
            e.error
        }
    })
}

/// `[[search.params]]`: `raw` as the table held it, `search` the table as parsed with spans.
fn parse_params(
    raw: Option<&toml::Value>,
    search: Option<&DeTable<'_>>,
) -> Result<Vec<ParamSpec>, SearchError> {
    let err = |problem: String| SearchError::new(format!("{SEARCH}.params"), problem);
    let value = raw.ok_or_else(|| err("missing (required)".into()))?;
    let array = value
        .as_array()
        .ok_or_else(|| err(expected("an array of tables", value.type_str())))?;
    if array.is_empty() {
        return Err(err("must list at least one parameter".into()));
    }
    if array.len() > PARAMS_MAX {
        return Err(err(format!(
            "{} parameters (at most {PARAMS_MAX})",
            array.len()
        )));
    }
    // The same items with their spans, for serde's errors.
    let spanned = search
        .and_then(|t| t.get("params"))
        .and_then(|v| v.get_ref().as_array());
    let mut params: Vec<ParamSpec> = Vec::with_capacity(array.len());
    let mut values_total = 0usize;
    for (i, item) in array.iter().enumerate() {
        let path = format!("{SEARCH}.params[{i}]");
        let table = item
            .as_table()
            .ok_or_else(|| SearchError::new(&path, expected("a table", item.type_str())))?;
        // Counted before the values are parsed, so an oversized spec costs nothing more.
        values_total += table
            .get("values")
            .and_then(toml::Value::as_array)
            .map_or(0, Vec::len);
        if values_total > VALUES_TOTAL_MAX {
            return Err(SearchError::new(
                format!("{path}.values"),
                format!(
                    "{values_total} values in search.params[0..={i}] (at most {VALUES_TOTAL_MAX} in all parameters together)"
                ),
            ));
        }
        let Some(item) = spanned.and_then(|a| a.get(i)) else {
            return Err(SearchError::new(&path, "expected a table"));
        };
        let p = parse_param(&path, table, read(&path, item)?)?;
        for (j, other) in params.iter().enumerate() {
            let clash = if other.name == p.name {
                Some("duplicate parameter name")
            } else if is_prefix(&other.name, &p.name) || is_prefix(&p.name, &other.name) {
                Some("one name is a prefix of the other")
            } else {
                None
            };
            if let Some(clash) = clash {
                return Err(SearchError::new(
                    format!("search.params[{i}].name"),
                    format!("{clash} (\"{}\", search.params[{j}])", other.name),
                ));
            }
        }
        params.push(p);
    }
    Ok(params)
}

/// `a` is a dotted prefix of `b` (`train` of `train.lr`).
fn is_prefix(a: &str, b: &str) -> bool {
    b.len() > a.len() && b.starts_with(a) && b.as_bytes()[a.len()] == b'.'
}

/// One parameter at `path`: `t` as serde read it from `table`.
fn parse_param(path: &str, table: &toml::Table, t: ParamText) -> Result<ParamSpec, SearchError> {
    let err = |key: &str, problem: String| SearchError::new(format!("{path}.{key}"), problem);
    let required = |key: &str| err(key, "missing (required)".into());
    let name = t.name.ok_or_else(|| required("name"))?.0;
    check_name(&name).map_err(|problem| err("name", problem))?;
    let kind = t.kind.ok_or_else(|| required("type"))?.0;
    let numeric = matches!(kind, ParamType::Double | ParamType::Integer);
    for key in ["min", "max", "scale"] {
        if !numeric && table.contains_key(key) {
            return Err(err(
                key,
                format!("only double and integer parameters take `{key}`"),
            ));
        }
    }
    if numeric && table.contains_key("values") {
        return Err(err(
            "values",
            "only discrete and categorical parameters take `values`".into(),
        ));
    }
    if kind != ParamType::Double && table.contains_key("grid_points") {
        return Err(err(
            "grid_points",
            "only double parameters take `grid_points`".into(),
        ));
    }
    let scale = t.scale.map_or(Scale::Linear, |c| c.0);
    let grid_points = t.grid_points.map_or(GRID_POINTS_DEFAULT, |n| n.0);
    let kind = match kind {
        ParamType::Double => {
            let (text::Number(min), text::Number(max)) = bounds(path, t.min, t.max)?;
            if max <= min {
                return Err(err("max", format!("must be greater than min ({min})")));
            }
            match scale {
                Scale::Linear => {}
                Scale::Log if min <= 0.0 => {
                    return Err(err("min", "log scale needs min > 0".into()));
                }
                Scale::Log => {}
                Scale::ReverseLog if min < 0.0 => {
                    return Err(err(
                        "min",
                        "reverse_log scale needs 0 <= min < max < 1".into(),
                    ));
                }
                Scale::ReverseLog if max >= 1.0 => {
                    return Err(err(
                        "max",
                        "reverse_log scale needs 0 <= min < max < 1".into(),
                    ));
                }
                Scale::ReverseLog => {}
            }
            ParamKind::Double { min, max, scale }
        }
        ParamType::Integer => {
            let (text::Integer(min), text::Integer(max)) = bounds(path, t.min, t.max)?;
            if max < min {
                return Err(err("max", format!("must be at least min ({min})")));
            }
            match scale {
                Scale::Log if min <= 0 => {
                    return Err(err("min", "log scale needs min > 0".into()));
                }
                Scale::ReverseLog => {
                    return Err(err(
                        "scale",
                        "reverse_log needs 0 <= min < max < 1, which no integer range has".into(),
                    ));
                }
                Scale::Linear | Scale::Log => {}
            }
            ParamKind::Integer { min, max, scale }
        }
        ParamType::Discrete | ParamType::Categorical => {
            let discrete = kind == ParamType::Discrete;
            let value = t.values.ok_or_else(|| required("values"))?;
            let Some(values) = value.as_array() else {
                return Err(err("values", expected("an array", value.type_str())));
            };
            if values.is_empty() {
                return Err(err("values", "must not be empty".into()));
            }
            if values.len() > VALUES_MAX {
                return Err(err(
                    "values",
                    format!("{} values (at most {VALUES_MAX})", values.len()),
                ));
            }
            // Duplicates found through a set of each value's key: linear, where comparing
            // each value with those before it was quadratic (seconds for 64 × 1,000 values).
            let mut seen: std::collections::HashMap<ValueKey, usize> =
                std::collections::HashMap::with_capacity(values.len());
            for (j, v) in values.iter().enumerate() {
                let path = format!("{path}.values[{j}]");
                let number = match v {
                    toml::Value::Integer(_) => true,
                    toml::Value::Float(x) => x.is_finite(),
                    _ => false,
                };
                if discrete && !number {
                    return Err(SearchError::new(
                        path,
                        expected("a finite number", v.type_str()),
                    ));
                }
                if let Some(key) = ValueKey::of(v) {
                    if let Some(k) = seen.insert(key, j) {
                        return Err(SearchError::new(path, format!("duplicate of values[{k}]")));
                    }
                }
            }
            if discrete {
                ParamKind::Discrete {
                    values: values.clone(),
                }
            } else {
                ParamKind::Categorical {
                    values: values.clone(),
                }
            }
        }
    };
    Ok(ParamSpec {
        name,
        kind,
        grid_points,
    })
}

/// `min` and `max` of the parameter at `path`, both required, read as `T` (its type's).
fn bounds<T: serde::de::DeserializeOwned>(
    path: &str,
    min: Option<toml::Value>,
    max: Option<toml::Value>,
) -> Result<(T, T), SearchError> {
    let read = |key: &str, value: Option<toml::Value>| {
        let field = format!("{path}.{key}");
        let value = value.ok_or_else(|| SearchError::new(&field, "missing (required)"))?;
        value_as(&value).map_err(|problem| SearchError::new(&field, problem))
    };
    Ok((read("min", min)?, read("max", max)?))
}

/// What two equal values (`toml::Value`'s `==`) share, hashable: scalars by value (floats
/// by their bits, `-0.0` as `0.0`), arrays and tables by their TOML text. `None` for NaN,
/// which equals nothing.
#[derive(Debug, PartialEq, Eq, Hash)]
enum ValueKey {
    Integer(i64),
    Float(u64),
    Text(String),
    Boolean(bool),
    Datetime(String),
    Nested(String),
}

impl ValueKey {
    fn of(v: &toml::Value) -> Option<ValueKey> {
        Some(match v {
            toml::Value::Integer(i) => ValueKey::Integer(*i),
            toml::Value::Float(x) if x.is_nan() => return None,
            toml::Value::Float(x) => ValueKey::Float(if *x == 0.0 { 0 } else { x.to_bits() }),
            toml::Value::String(s) => ValueKey::Text(s.clone()),
            toml::Value::Boolean(b) => ValueKey::Boolean(*b),
            toml::Value::Datetime(d) => ValueKey::Datetime(d.to_string()),
            toml::Value::Array(_) | toml::Value::Table(_) => ValueKey::Nested(v.to_string()),
        })
    }
}

/// A parameter name: a dotted path of non-empty segments of `[A-Za-z0-9_-]`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > PARAM_NAME_BYTES_MAX {
        return Err(format!("longer than {PARAM_NAME_BYTES_MAX} bytes"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "character {c:?} not allowed (a dotted path of [A-Za-z0-9_-] like \"train.lr\")"
        ));
    }
    if name.split('.').any(str::is_empty) {
        return Err("empty path segment (a dotted path like \"train.lr\")".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
