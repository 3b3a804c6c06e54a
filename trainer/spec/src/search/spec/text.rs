//! The `[search]` table and each `[[search.params]]` table as serde reads them, through the
//! one reader of a spec's tables ([`crate::read_table`]): each field's rule is in its type
//! (a choice among names, a string, an integer, a count in a range, a finite number, a
//! boolean) and says what is wrong in the search's words ("expected a string, found
//! integer", "unknown algorithm \"bayes\" (expected grid, random, asha, hyperband, tpe)").
//! A parameter's `min`, `max` and `values` are kept as given: their rule depends on its
//! `type`, which [`super::SearchSpec::from_table`] checks first.

use serde::{Deserialize, Deserializer};

use super::{Algorithm, Direction, Stopping, TrialKind, GRID_POINTS_MAX, TRIALS_MAX};
use crate::field_value::{self, Found, Rule};
use crate::search::space::Scale;

/// `[search]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SearchText {
    pub(super) trial: Option<Choice<TrialKind>>,
    pub(super) algorithm: Option<Choice<Algorithm>>,
    pub(super) trials: Option<Count<1, TRIALS_MAX>>,
    pub(super) max_parallel: Option<Count<0, { u32::MAX }>>,
    pub(super) metric: Option<Text>,
    pub(super) direction: Option<Choice<Direction>>,
    pub(super) seed: Option<Integer>,
    pub(super) resource: Option<Text>,
    pub(super) min_resource: Option<Count<1, { u32::MAX }>>,
    pub(super) max_resource: Option<Count<1, { u32::MAX }>>,
    pub(super) reduction_factor: Option<Count<2, { u32::MAX }>>,
    pub(super) stopping: Option<Choice<Stopping>>,
    pub(super) max_trial_failures: Option<Count<0, { u32::MAX }>>,
    pub(super) speculate_factor: Option<Number>,
    pub(super) resumable: Option<Boolean>,
    /// Read item by item from the document (`search.params[i]`), after the rest.
    pub(super) params: Option<toml::Value>,
}

/// One `[[search.params]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ParamText {
    pub(super) name: Option<Text>,
    #[serde(rename = "type")]
    pub(super) kind: Option<Choice<ParamType>>,
    pub(super) min: Option<toml::Value>,
    pub(super) max: Option<toml::Value>,
    pub(super) scale: Option<Choice<Scale>>,
    pub(super) values: Option<toml::Value>,
    pub(super) grid_points: Option<Count<2, GRID_POINTS_MAX>>,
}

/// A parameter's `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ParamType {
    Double,
    Integer,
    Discrete,
    Categorical,
}

/// An enum spelled by names in the spec: what it is called in a problem, and its names.
pub(super) trait Named: Copy + 'static {
    /// E.g. "algorithm", "parameter type".
    const WHAT: &'static str;
    /// Each name with its value, in the order a problem lists them.
    const OPTIONS: &'static [(&'static str, Self)];
}

/// [`Named`] for each enum: what a problem calls it, and its names with their values.
macro_rules! named {
    ($($t:ident, $what:literal: [$($name:literal => $v:ident),* $(,)?];)*) => {$(
        impl Named for $t {
            const WHAT: &'static str = $what;
            const OPTIONS: &'static [(&'static str, Self)] = &[$(($name, $t::$v)),*];
        }
    )*};
}

named! {
    TrialKind, "trial kind": ["train" => Train, "command" => Command];
    Algorithm, "algorithm": [
        "grid" => Grid, "random" => Random, "asha" => Asha, "hyperband" => Hyperband,
        "tpe" => Tpe,
    ];
    Direction, "direction": ["max" => Max, "min" => Min];
    Stopping, "stopping rule": ["none" => None, "median" => Median];
    Scale, "scale": ["linear" => Linear, "log" => Log, "reverse_log" => ReverseLog];
    ParamType, "parameter type": [
        "double" => Double, "integer" => Integer, "discrete" => Discrete,
        "categorical" => Categorical,
    ];
}

/// "expected WHAT, found TYPE": a value of the wrong TOML type.
pub(super) fn expected(what: &str, found: &str) -> String {
    format!("expected {what}, found {found}")
}

/// One of `T`'s names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Choice<T>(pub(super) T);

impl<T: Named> Rule for Choice<T> {
    fn take(found: Found<'_>) -> Result<Self, String> {
        let Found::String(s) = found else {
            return Err(expected("a string", found.type_str()));
        };
        match T::OPTIONS.iter().find(|(name, _)| *name == s) {
            Some((_, t)) => Ok(Choice(*t)),
            None => {
                let names: Vec<&str> = T::OPTIONS.iter().map(|(n, _)| *n).collect();
                Err(format!(
                    "unknown {} \"{s}\" (expected {})",
                    T::WHAT,
                    names.join(", ")
                ))
            }
        }
    }
}

impl<'de, T: Named> Deserialize<'de> for Choice<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        field_value::deserialize(d)
    }
}

/// An integer in `MIN..=MAX` ("must be at least MIN", "must be at most MAX").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Count<const MIN: u32, const MAX: u32>(pub(super) u32);

impl<const MIN: u32, const MAX: u32> Rule for Count<MIN, MAX> {
    fn take(found: Found<'_>) -> Result<Self, String> {
        let Integer(n) = Integer::take(found)?;
        if n < i64::from(MIN) {
            return Err(format!("must be at least {MIN}"));
        }
        if n > i64::from(MAX) {
            return Err(format!("must be at most {MAX}"));
        }
        Ok(Count(n as u32))
    }
}

crate::deserialize_by_rule!(<MIN, MAX> Count);

/// A string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Text(pub(super) String);

impl Rule for Text {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found {
            Found::String(s) => Ok(Text(s.to_owned())),
            other => Err(expected("a string", other.type_str())),
        }
    }
}

/// An integer (TOML's: an `i64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Integer(pub(super) i64);

impl Rule for Integer {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found {
            Found::Integer(n) => i64::try_from(n)
                .map(Integer)
                .map_err(|_| expected("an integer", "integer beyond i64")),
            other => Err(expected("an integer", other.type_str())),
        }
    }
}

/// A finite number; an integer is taken as one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Number(pub(super) f64);

impl Rule for Number {
    fn take(found: Found<'_>) -> Result<Self, String> {
        let x = found
            .number()
            .ok_or_else(|| expected("a number", found.type_str()))?;
        if x.is_finite() {
            Ok(Number(x))
        } else {
            Err("must be finite".into())
        }
    }
}

/// `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Boolean(pub(super) bool);

impl Rule for Boolean {
    fn take(found: Found<'_>) -> Result<Self, String> {
        found
            .boolean()
            .map(Boolean)
            .ok_or_else(|| expected("a boolean", found.type_str()))
    }
}

crate::deserialize_by_rule!(Text, Integer, Number, Boolean);
