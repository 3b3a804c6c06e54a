//! The node's own tables of a spec's text, `[resources]`, `[elastic]` and `[preemption]`, as
//! serde reads them: each a struct whose fields say their rules (a bounded integer, a number
//! above 1, a flag), read by the one reader of a spec's tables,
//! [`ringleader_spec::read_table`], which names the key or value at fault and its place.
//! The parse ([`super::Document`]) turns them into the stored values
//! ([`super::Resources`], [`super::Elastic`], [`super::PreemptionSpec`]), whose serde form
//! is the Raft log's and has no such rules (a replica applies what the leader committed).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::{
    check, BLACKLIST_COOLDOWN_S_MAX, CPUS_PER_WORKER_MAX, GPUS_PER_WORKER_MAX,
    PREEMPTION_GRACE_S_MAX, STRAGGLER_WINDOW_MAX,
};

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
    pub(super) protocol: Option<Spanned<toml::Value>>,
    pub(super) first_heartbeat_s: Option<Spanned<toml::Value>>,
    pub(super) keep_global_batch: Option<Flag>,
}

/// An integer in `MIN..=MAX`. Its problems read "expected a positive integer" (or
/// "non-negative" when `MIN` is 0) and "must be at most MAX, got N".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounded<const MIN: u32, const MAX: u32>(pub(super) u32);

impl<'de, const MIN: u32, const MAX: u32> Deserialize<'de> for Bounded<MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Only(PhantomData::<Self>))
    }
}

impl<const MIN: u32, const MAX: u32> Accepts for Bounded<MIN, MAX> {
    fn expected() -> String {
        format!("expected {}", check::integer_kind(MIN))
    }
    fn integer<E: de::Error>(n: i128) -> Result<Self, E> {
        match check::bounded_problem(n, MIN, MAX) {
            Some(problem) => Err(E::custom(problem)),
            None => Ok(Bounded(u32::try_from(n).expect("bounded by MAX: u32"))),
        }
    }
}

/// A finite number above 1, an integer or a float ("expected a number above 1").
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct AboveOne(pub(super) f64);

impl Accepts for AboveOne {
    fn expected() -> String {
        "expected a number above 1".into()
    }
    fn integer<E: de::Error>(n: i128) -> Result<Self, E> {
        Self::float(n as f64)
    }
    fn float<E: de::Error>(f: f64) -> Result<Self, E> {
        if f.is_finite() && f > 1.0 {
            Ok(AboveOne(f))
        } else {
            Err(E::custom(Self::expected()))
        }
    }
}

/// `true` or `false` ("expected true or false").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Flag(pub(super) bool);

impl Accepts for Flag {
    fn expected() -> String {
        "expected true or false".into()
    }
    fn boolean<E: de::Error>(b: bool) -> Result<Self, E> {
        Ok(Flag(b))
    }
}

/// `Deserialize` for [`Accepts`] types without generics: any value, through [`Only`].
macro_rules! deserialize_accepted {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                d.deserialize_any(Only(PhantomData::<Self>))
            }
        }
    )*};
}

deserialize_accepted!(AboveOne, Flag);

/// A value type that takes some TOML values and refuses every other with one problem
/// ([`Accepts::expected`]), not serde's "invalid type: ..., expected ...".
trait Accepts: Sized {
    /// The problem of a value of a type it does not take.
    fn expected() -> String;
    fn integer<E: de::Error>(_: i128) -> Result<Self, E> {
        Err(E::custom(Self::expected()))
    }
    fn float<E: de::Error>(_: f64) -> Result<Self, E> {
        Err(E::custom(Self::expected()))
    }
    fn boolean<E: de::Error>(_: bool) -> Result<Self, E> {
        Err(E::custom(Self::expected()))
    }
}

/// The visitor of an [`Accepts`] type: every kind of value goes to it.
struct Only<T>(PhantomData<T>);

impl<'de, T: Accepts> Visitor<'de> for Only<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&T::expected())
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<T, E> {
        T::integer(i128::from(n))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<T, E> {
        T::integer(i128::from(n))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<T, E> {
        T::float(f)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<T, E> {
        T::boolean(b)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<T, E> {
        Err(E::custom(T::expected()))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<T, A::Error> {
        Err(de::Error::custom(T::expected()))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<T, A::Error> {
        Err(de::Error::custom(T::expected()))
    }
}

/// `value` (one kept as given, [`ElasticText::first_heartbeat_s`]) read as `T`, the problem
/// as `T` words it.
pub(super) fn value_as<T: for<'de> Deserialize<'de>>(value: &toml::Value) -> Result<T, String> {
    T::deserialize(value.clone()).map_err(|e| e.message().trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

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
