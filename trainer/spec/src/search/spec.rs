//! The `[search]` table of a search job: [`SearchSpec`] and its parser.
//!
//! Parsed by hand from a `toml::Table` rather than through serde so every error carries the
//! full dotted path of the offending key (`search.params[1].max`, `search.trails` for an
//! unknown key, `search.metric` for a missing one), which the node maps back to a line of
//! the submitted file.

use serde::{Deserialize, Serialize};

use super::space::{self, ParamKind, ParamSpec, Scale};

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

const SEARCH_KEYS: &[&str] = &[
    "trial",
    "algorithm",
    "trials",
    "max_parallel",
    "metric",
    "direction",
    "seed",
    "resource",
    "min_resource",
    "max_resource",
    "reduction_factor",
    "stopping",
    "max_trial_failures",
    "speculate_factor",
    "resumable",
    "params",
];

const PARAM_KEYS: &[&str] = &[
    "name",
    "type",
    "min",
    "max",
    "scale",
    "values",
    "grid_points",
];

impl SearchSpec {
    /// Parses and validates the `[search]` table (its `[[search.params]]` being the array of
    /// tables under key `params`). Unknown keys are refused; integers are accepted where
    /// floats are expected.
    pub fn from_table(search: &toml::Table) -> Result<SearchSpec, SearchError> {
        let f = Fields::new(search, "search".to_string());
        f.check_keys(SEARCH_KEYS)?;

        let trial = f
            .choice(
                "trial",
                "trial kind",
                &[("train", TrialKind::Train), ("command", TrialKind::Command)],
            )?
            .unwrap_or(TrialKind::Train);
        let algorithm = f.required(
            "algorithm",
            f.choice(
                "algorithm",
                "algorithm",
                &[
                    ("grid", Algorithm::Grid),
                    ("random", Algorithm::Random),
                    ("asha", Algorithm::Asha),
                    ("hyperband", Algorithm::Hyperband),
                    ("tpe", Algorithm::Tpe),
                ],
            )?,
        )?;
        let trials = f.u32_in("trials", 1, TRIALS_MAX)?;
        let max_parallel = f.u32_in("max_parallel", 0, u32::MAX)?.unwrap_or(0);
        let metric = f.required("metric", f.str("metric")?)?;
        if metric.is_empty() {
            return Err(f.err("metric", "must not be empty"));
        }
        let direction = f.required(
            "direction",
            f.choice(
                "direction",
                "direction",
                &[("max", Direction::Max), ("min", Direction::Min)],
            )?,
        )?;
        let seed = match f.int("seed")? {
            None => 0,
            Some(s) if s >= 0 => s as u64,
            Some(_) => return Err(f.err("seed", "must be a non-negative integer")),
        };
        let resource = f.str("resource")?.unwrap_or("epochs");
        if resource != "epochs" {
            return Err(f.err(
                "resource",
                format!("unknown resource \"{resource}\" (only \"epochs\" is supported)"),
            ));
        }
        let min_resource = f.u32_in("min_resource", 1, u32::MAX)?.unwrap_or(1);
        let max_resource = f.u32_in("max_resource", 1, u32::MAX)?;
        if let Some(max) = max_resource {
            if max < min_resource {
                return Err(f.err(
                    "max_resource",
                    format!("must be at least min_resource ({min_resource})"),
                ));
            }
        }
        let reduction_factor = f.u32_in("reduction_factor", 2, u32::MAX)?.unwrap_or(3);
        let stopping = f
            .choice(
                "stopping",
                "stopping rule",
                &[("none", Stopping::None), ("median", Stopping::Median)],
            )?
            .unwrap_or(Stopping::None);
        let max_trial_failures = f.u32_in("max_trial_failures", 0, u32::MAX)?.unwrap_or(3);
        let speculate_factor = f.float("speculate_factor")?.unwrap_or(2.0);
        if speculate_factor != 0.0 && speculate_factor <= 1.0 {
            return Err(f.err("speculate_factor", "must be 0 (off) or greater than 1"));
        }

        let resumable = match f.table.get("resumable") {
            None => false,
            Some(toml::Value::Boolean(b)) => *b,
            Some(v) => return Err(f.err("resumable", expected("a boolean", v))),
        };
        if resumable && trial != TrialKind::Command {
            return Err(f.err(
                "resumable",
                "only for command trials (search.trial = \"command\"): train trials always resume",
            ));
        }

        let params = parse_params(&f)?;

        let asha = matches!(algorithm, Algorithm::Asha | Algorithm::Hyperband);
        if asha && stopping == Stopping::Median {
            return Err(f.err(
                "stopping",
                "median stopping applies to grid, random and tpe searches (asha and hyperband stop trials themselves)",
            ));
        }
        if asha && trial == TrialKind::Command && max_resource.is_none() {
            return Err(f.err(
                "max_resource",
                "missing (required for asha and hyperband with command trials)",
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
                return Err(f.err(
                    "params",
                    format!("the grid has {size} points (at most {GRID_SIZE_MAX})"),
                ));
            }
            trials.map_or(size as u32, |cap| cap.min(size as u32))
        } else {
            f.required("trials", trials)?
        };

        Ok(SearchSpec {
            trial,
            algorithm,
            trials,
            max_parallel,
            metric: metric.to_string(),
            direction,
            seed,
            resource: resource.to_string(),
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

fn parse_params(f: &Fields<'_>) -> Result<Vec<ParamSpec>, SearchError> {
    let value = f.required("params", f.table.get("params"))?;
    let array = value
        .as_array()
        .ok_or_else(|| f.err("params", expected("an array of tables", value)))?;
    if array.is_empty() {
        return Err(f.err("params", "must list at least one parameter"));
    }
    if array.len() > PARAMS_MAX {
        return Err(f.err(
            "params",
            format!("{} parameters (at most {PARAMS_MAX})", array.len()),
        ));
    }
    let mut params: Vec<ParamSpec> = Vec::with_capacity(array.len());
    let mut values_total = 0usize;
    for (i, item) in array.iter().enumerate() {
        let path = format!("search.params[{i}]");
        let table = item
            .as_table()
            .ok_or_else(|| SearchError::new(&path, expected("a table", item)))?;
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
        let p = parse_param(&Fields::new(table, path))?;
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

fn parse_param(f: &Fields<'_>) -> Result<ParamSpec, SearchError> {
    f.check_keys(PARAM_KEYS)?;
    let name = f.required("name", f.str("name")?)?;
    check_name(name).map_err(|problem| f.err("name", problem))?;
    let kind = f.required(
        "type",
        f.choice(
            "type",
            "parameter type",
            &[
                ("double", "double"),
                ("integer", "integer"),
                ("discrete", "discrete"),
                ("categorical", "categorical"),
            ],
        )?,
    )?;
    let numeric = matches!(kind, "double" | "integer");
    for key in ["min", "max", "scale"] {
        if !numeric && f.table.contains_key(key) {
            return Err(f.err(
                key,
                format!("only double and integer parameters take `{key}`"),
            ));
        }
    }
    if numeric && f.table.contains_key("values") {
        return Err(f.err(
            "values",
            "only discrete and categorical parameters take `values`",
        ));
    }
    if kind != "double" && f.table.contains_key("grid_points") {
        return Err(f.err("grid_points", "only double parameters take `grid_points`"));
    }
    let scale = f
        .choice(
            "scale",
            "scale",
            &[
                ("linear", Scale::Linear),
                ("log", Scale::Log),
                ("reverse_log", Scale::ReverseLog),
            ],
        )?
        .unwrap_or(Scale::Linear);
    let grid_points = f
        .u32_in("grid_points", 2, GRID_POINTS_MAX)?
        .unwrap_or(GRID_POINTS_DEFAULT);
    let kind = match kind {
        "double" => {
            let min = f.required("min", f.float("min")?)?;
            let max = f.required("max", f.float("max")?)?;
            if max <= min {
                return Err(f.err("max", format!("must be greater than min ({min})")));
            }
            match scale {
                Scale::Linear => {}
                Scale::Log if min <= 0.0 => {
                    return Err(f.err("min", "log scale needs min > 0"));
                }
                Scale::Log => {}
                Scale::ReverseLog if min < 0.0 => {
                    return Err(f.err("min", "reverse_log scale needs 0 <= min < max < 1"));
                }
                Scale::ReverseLog if max >= 1.0 => {
                    return Err(f.err("max", "reverse_log scale needs 0 <= min < max < 1"));
                }
                Scale::ReverseLog => {}
            }
            ParamKind::Double { min, max, scale }
        }
        "integer" => {
            let min = f.required("min", f.int("min")?)?;
            let max = f.required("max", f.int("max")?)?;
            if max < min {
                return Err(f.err("max", format!("must be at least min ({min})")));
            }
            match scale {
                Scale::Log if min <= 0 => {
                    return Err(f.err("min", "log scale needs min > 0"));
                }
                Scale::ReverseLog => {
                    return Err(f.err(
                        "scale",
                        "reverse_log needs 0 <= min < max < 1, which no integer range has",
                    ));
                }
                Scale::Linear | Scale::Log => {}
            }
            ParamKind::Integer { min, max, scale }
        }
        discrete_or_categorical => {
            let discrete = discrete_or_categorical == "discrete";
            let value = f.required("values", f.table.get("values"))?;
            let values = value
                .as_array()
                .ok_or_else(|| f.err("values", expected("an array", value)))?;
            if values.is_empty() {
                return Err(f.err("values", "must not be empty"));
            }
            if values.len() > VALUES_MAX {
                return Err(f.err(
                    "values",
                    format!("{} values (at most {VALUES_MAX})", values.len()),
                ));
            }
            // Duplicates found through a set of each value's key: linear, where comparing
            // each value with those before it was quadratic (seconds for 64 × 1,000 values).
            let mut seen: std::collections::HashMap<ValueKey, usize> =
                std::collections::HashMap::with_capacity(values.len());
            for (j, v) in values.iter().enumerate() {
                let path = format!("{}.values[{j}]", f.path);
                let number = match v {
                    toml::Value::Integer(_) => true,
                    toml::Value::Float(x) => x.is_finite(),
                    _ => false,
                };
                if discrete && !number {
                    return Err(SearchError::new(path, expected("a finite number", v)));
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
        name: name.to_string(),
        kind,
        grid_points,
    })
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

fn expected(what: &str, found: &toml::Value) -> String {
    format!("expected {what}, found {}", found.type_str())
}

/// One TOML table being parsed, with its path for errors.
struct Fields<'a> {
    table: &'a toml::Table,
    path: String,
}

impl<'a> Fields<'a> {
    fn new(table: &'a toml::Table, path: String) -> Fields<'a> {
        Fields { table, path }
    }

    fn err(&self, key: &str, problem: impl Into<String>) -> SearchError {
        SearchError::new(format!("{}.{key}", self.path), problem)
    }

    fn check_keys(&self, allowed: &[&str]) -> Result<(), SearchError> {
        match self.table.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(key) => Err(self.err(key, "unknown field")),
            None => Ok(()),
        }
    }

    fn required<T>(&self, key: &str, value: Option<T>) -> Result<T, SearchError> {
        value.ok_or_else(|| self.err(key, "missing (required)"))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>, SearchError> {
        self.table
            .get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.err(key, expected("a string", v)))
            })
            .transpose()
    }

    fn int(&self, key: &str) -> Result<Option<i64>, SearchError> {
        self.table
            .get(key)
            .map(|v| {
                v.as_integer()
                    .ok_or_else(|| self.err(key, expected("an integer", v)))
            })
            .transpose()
    }

    /// A finite float; an integer is accepted.
    fn float(&self, key: &str) -> Result<Option<f64>, SearchError> {
        let Some(v) = self.table.get(key) else {
            return Ok(None);
        };
        let x = match v {
            toml::Value::Float(x) => *x,
            toml::Value::Integer(i) => *i as f64,
            _ => return Err(self.err(key, expected("a number", v))),
        };
        if !x.is_finite() {
            return Err(self.err(key, "must be finite"));
        }
        Ok(Some(x))
    }

    fn u32_in(&self, key: &str, min: u32, max: u32) -> Result<Option<u32>, SearchError> {
        let Some(i) = self.int(key)? else {
            return Ok(None);
        };
        if i < i64::from(min) {
            return Err(self.err(key, format!("must be at least {min}")));
        }
        if i > i64::from(max) {
            return Err(self.err(key, format!("must be at most {max}")));
        }
        Ok(Some(i as u32))
    }

    fn choice<T: Copy>(
        &self,
        key: &str,
        what: &str,
        options: &[(&str, T)],
    ) -> Result<Option<T>, SearchError> {
        let Some(s) = self.str(key)? else {
            return Ok(None);
        };
        match options.iter().find(|(name, _)| *name == s) {
            Some((_, t)) => Ok(Some(*t)),
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                Err(self.err(
                    key,
                    format!("unknown {what} \"{s}\" (expected {})", names.join(", ")),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests;
