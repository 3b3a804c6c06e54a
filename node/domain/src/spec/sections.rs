//! The node's own parts of a spec's text, its top level, `[resources]`, `[elastic]`,
//! `[preemption]` and each `[[files]]` entry, as serde reads them: each a struct whose
//! fields say their rules (a name, a bounded integer, a number above 1, a flag), read by
//! the one reader of a spec's tables,
//! [`ringleader_spec::read_table`], which names the key or value at fault and its place
//! (the rules are [`ringleader_spec::field_value::Rule`]s, as the search's fields are).
//! The parse ([`super::Document`]) turns them into the stored values
//! ([`super::Resources`], [`super::Elastic`], [`super::PreemptionSpec`]), whose serde form
//! is the Raft log's and has no such rules (a replica applies what the leader committed).

use std::collections::BTreeMap;

use ringleader_spec::field_value::{Deferred, Found, Rule};
use serde::de::IgnoredAny;
use serde::Deserialize;
use toml::Spanned;

use super::{
    check, priority, JobKind, Placement, BLACKLIST_COOLDOWN_S_MAX, CPUS_PER_WORKER_MAX,
    GPUS_PER_WORKER_MAX, MAX_RESTARTS_MAX, PREEMPTION_GRACE_S_MAX, REJOIN_AFTER_S_MAX,
    STRAGGLER_WINDOW_MAX, WORKERS_MAX,
};

/// The top level of a spec as written: the keys it may have, each value with its rule. A
/// value's problem is kept, not raised ([`Deferred`]), and the parse looks at each in its
/// own order: a key's rule can depend on another's value (`command` on `kind`), and a
/// missing `name` or `kind` is named before any other value's problem. The tables are read
/// afterwards by their own structs (below) or kept generic (the trainer's and `[search]`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(
    dead_code,
    reason = "the tables' fields are keys only: each table is read from the document"
)]
pub(super) struct SpecText {
    pub(super) name: Option<Value<Name>>,
    pub(super) priority: Option<Value<Priority>>,
    pub(super) kind: Option<Value<Kind>>,
    pub(super) workers: Option<Value<Bounded<1, WORKERS_MAX>>>,
    pub(super) min_workers: Option<Value<Bounded<1, WORKERS_MAX>>>,
    pub(super) max_workers: Option<Value<Bounded<1, WORKERS_MAX>>>,
    pub(super) max_restarts: Option<Value<Bounded<0, MAX_RESTARTS_MAX>>>,
    pub(super) placement: Option<Value<PlacementText>>,
    pub(super) command: Option<Value<Vec<Value<Text>>>>,
    pub(super) env: Option<Value<Vars>>,
    pub(super) secrets: Option<Value<Vars>>,
    pub(super) preemptible: Option<Value<Flag>>,
    // The tables, declared here as keys only: each is read from the document, where its own
    // keys keep their places.
    pub(super) resources: Option<IgnoredAny>,
    pub(super) model: Option<IgnoredAny>,
    pub(super) data: Option<IgnoredAny>,
    pub(super) train: Option<IgnoredAny>,
    pub(super) checkpoint: Option<IgnoredAny>,
    pub(super) search: Option<IgnoredAny>,
    pub(super) elastic: Option<IgnoredAny>,
    pub(super) files: Option<IgnoredAny>,
    pub(super) preemption: Option<IgnoredAny>,
}

/// A value as written: where it is, and what its rule made of it or the problem.
pub(super) type Value<T> = Spanned<Deferred<T>>;

/// `env` or `secrets` as written: each variable's name and value with their places.
pub(super) type Vars = BTreeMap<Spanned<String>, Value<Text>>;

/// A job's name ([`check::name_is_valid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Name(pub(super) String);

impl Rule for Name {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found {
            Found::String(s) if check::name_is_valid(s) => Ok(Name(s.to_owned())),
            _ => Err(check::name_problem()),
        }
    }
}

/// `kind`: `"train"`, `"search"` or `"command"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Kind(pub(super) JobKind);

impl Rule for Kind {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found {
            Found::String("train") => Ok(Kind(JobKind::Train)),
            Found::String("search") => Ok(Kind(JobKind::Search)),
            Found::String("command") => Ok(Kind(JobKind::Command)),
            _ => Err("expected \"train\", \"search\" or \"command\"".into()),
        }
    }
}

/// `placement`: `"spread"` or `"pack"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PlacementText(pub(super) Placement);

impl Rule for PlacementText {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found {
            Found::String("spread") => Ok(PlacementText(Placement::Spread)),
            Found::String("pack") => Ok(PlacementText(Placement::Pack)),
            _ => Err("expected \"spread\" or \"pack\"".into()),
        }
    }
}

/// `priority`: a class's name or an integer, as [`priority::parse`] reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Priority(pub(super) u32);

impl Rule for Priority {
    fn take(found: Found<'_>) -> Result<Self, String> {
        let text = match found {
            Found::String(s) => s.to_owned(),
            Found::Integer(n) => n.to_string(),
            _ => String::new(),
        };
        priority::parse(&text).map(Priority)
    }
}

/// A string: a command's argument, a variable's value ("expected a string").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Text(pub(super) String);

impl Rule for Text {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found {
            Found::String(s) => Ok(Text(s.to_owned())),
            _ => Err("expected a string".into()),
        }
    }
}

ringleader_spec::deserialize_by_rule!(Name, Kind, PlacementText, Priority, Text);

/// `[resources]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResourcesText {
    pub(super) cpus_per_worker: Option<Bounded<1, CPUS_PER_WORKER_MAX>>,
    pub(super) gpus_per_worker: Option<Bounded<0, GPUS_PER_WORKER_MAX>>,
}

/// `[preemption]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PreemptionText {
    pub(super) grace_s: Option<Bounded<1, PREEMPTION_GRACE_S_MAX>>,
}

/// `[elastic]` as written. `protocol` and `first_heartbeat_s` are kept as given, with their
/// places: whether they may be given depends on the job's kind and ring, which the parse
/// checks before their values.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ElasticText {
    pub(super) straggler_factor: Option<AboveOne>,
    pub(super) straggler_window: Option<Bounded<1, STRAGGLER_WINDOW_MAX>>,
    pub(super) blacklist_cooldown_s: Option<Bounded<1, BLACKLIST_COOLDOWN_S_MAX>>,
    pub(super) rejoin_after_s: Option<Bounded<1, REJOIN_AFTER_S_MAX>>,
    pub(super) protocol: Option<Spanned<toml::Value>>,
    pub(super) first_heartbeat_s: Option<Spanned<toml::Value>>,
    pub(super) keep_global_batch: Option<Flag>,
}

/// One `[[files]]` entry as written: the keys it may have. Its values are kept as given,
/// with their places, and checked in the parse's order (`path`, then `text` or `base64`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileText {
    pub(super) path: Option<Spanned<toml::Value>>,
    pub(super) text: Option<Spanned<toml::Value>>,
    pub(super) base64: Option<Spanned<toml::Value>>,
}

/// An integer in `MIN..=MAX`. Its problems read "expected a positive integer" (or
/// "non-negative" when `MIN` is 0; a literal beyond TOML's 64-bit integers is none) and
/// "must be at most MAX, got N".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounded<const MIN: u32, const MAX: u32>(pub(super) u32);

impl<const MIN: u32, const MAX: u32> Rule for Bounded<MIN, MAX> {
    fn take(found: Found<'_>) -> Result<Self, String> {
        let n = match found {
            Found::Integer(n) if i64::try_from(n).is_ok() => n,
            _ => return Err(format!("expected {}", check::integer_kind(MIN))),
        };
        match check::bounded_problem(n, MIN, MAX) {
            Some(problem) => Err(problem),
            None => Ok(Bounded(u32::try_from(n).expect("bounded by MAX: u32"))),
        }
    }
}

ringleader_spec::deserialize_by_rule!(<MIN, MAX> Bounded);

/// A finite number above 1, an integer or a float ("expected a number above 1").
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct AboveOne(pub(super) f64);

impl Rule for AboveOne {
    fn take(found: Found<'_>) -> Result<Self, String> {
        match found.number() {
            Some(f) if f.is_finite() && f > 1.0 => Ok(AboveOne(f)),
            _ => Err("expected a number above 1".into()),
        }
    }
}

/// `true` or `false` ("expected true or false").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Flag(pub(super) bool);

impl Rule for Flag {
    fn take(found: Found<'_>) -> Result<Self, String> {
        let problem = || "expected true or false".to_owned();
        found.boolean().map(Flag).ok_or_else(problem)
    }
}

ringleader_spec::deserialize_by_rule!(AboveOne, Flag);

#[cfg(test)]
mod tests {
    use super::*;
    use ringleader_spec::field_value::value_as;

    fn value(text: &str) -> toml::Value {
        toml::from_str::<toml::Table>(&format!("v = {text}")).unwrap()["v"].clone()
    }

    #[test]
    fn a_bounded_integer_words_each_problem() {
        type Workers = Bounded<1, 8>;
        type Gpus = Bounded<0, 8>;
        assert_eq!(value_as::<Workers>(&value("3")), Ok(Bounded(3)));
        assert_eq!(value_as::<Gpus>(&value("0")), Ok(Bounded(0)));
        let positive = Err("expected a positive integer".to_owned());
        for bad in ["0", "-1", "1.5", "\"2\"", "true", "[1]", "{ a = 1 }"] {
            assert_eq!(value_as::<Workers>(&value(bad)), positive, "{bad}");
        }
        let non_negative = Err("expected a non-negative integer".to_owned());
        assert_eq!(value_as::<Gpus>(&value("-1")), non_negative);
        assert_eq!(
            value_as::<Workers>(&value("9")),
            Err("must be at most 8, got 9".to_owned())
        );
    }

    #[test]
    fn a_number_above_one_and_a_flag() {
        assert_eq!(value_as::<AboveOne>(&value("3")), Ok(AboveOne(3.0)));
        assert_eq!(value_as::<AboveOne>(&value("1.5")), Ok(AboveOne(1.5)));
        for bad in ["1", "0.5", "nan", "inf", "\"2\""] {
            assert_eq!(
                value_as::<AboveOne>(&value(bad)),
                Err("expected a number above 1".to_owned()),
                "{bad}"
            );
        }
        assert_eq!(value_as::<Flag>(&value("false")), Ok(Flag(false)));
        assert_eq!(
            value_as::<Flag>(&value("1")),
            Err("expected true or false".to_owned())
        );
    }
}
