//! A field's value whose rule is in its type: serde hands it whatever TOML value the key has
//! ([`Found`]) and the type takes it or says, in its own words, what is wrong ([`Rule`]).
//! The spec's words ("expected a positive integer", "expected a string, found integer")
//! instead of serde's ("invalid type: integer `3`, expected a string"), for the structs
//! [`crate::read_table`] reads.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, Visitor};

/// A TOML value as serde visits it: numbers and booleans by value, a string by reference,
/// an array or table by its type only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Found<'a> {
    /// An integer.
    Integer(i128),
    /// A float (`nan` and `inf` included).
    Float(f64),
    /// `true` or `false`.
    Boolean(bool),
    /// A string.
    String(&'a str),
    /// An array.
    Array,
    /// A table (an inline one, or a date-time, which serde sees as one).
    Table,
}

impl Found<'_> {
    /// A number's value, an integer's as a float too (`None` for other types).
    pub fn number(&self) -> Option<f64> {
        match *self {
            Found::Integer(n) => Some(n as f64),
            Found::Float(f) => Some(f),
            _ => None,
        }
    }

    /// A boolean's value (`None` for other types).
    pub fn boolean(&self) -> Option<bool> {
        match *self {
            Found::Boolean(b) => Some(b),
            _ => None,
        }
    }

    /// The value's TOML type as `toml::Value::type_str` names it (`integer`, `float`, ...).
    pub fn type_str(&self) -> &'static str {
        match self {
            Found::Integer(_) => "integer",
            Found::Float(_) => "float",
            Found::Boolean(_) => "boolean",
            Found::String(_) => "string",
            Found::Array => "array",
            Found::Table => "table",
        }
    }
}

/// A value type with its rule: [`Rule::take`] keeps a value or gives the problem.
/// Its `Deserialize` is [`deserialize`].
pub trait Rule: Sized {
    /// The value, or what is wrong with `found` (lowercase, no field name).
    fn take(found: Found<'_>) -> Result<Self, String>;
}

/// Deserializes any TOML value and hands it to `R`'s rule: what `R`'s `Deserialize` calls.
pub fn deserialize<'de, R: Rule, D: Deserializer<'de>>(d: D) -> Result<R, D::Error> {
    d.deserialize_any(Taker(PhantomData::<R>))
}

/// `Deserialize` for [`Rule`] types, through [`deserialize`]: types without generic
/// parameters (`deserialize_by_rule!(A, B)`), or one with two `u32` bounds
/// (`deserialize_by_rule!(<MIN, MAX> Bounded)`).
#[macro_export]
macro_rules! deserialize_by_rule {
    (<$min:ident, $max:ident> $t:ident) => {
        impl<'de, const $min: u32, const $max: u32> ::serde::Deserialize<'de> for $t<$min, $max> {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::field_value::deserialize(d)
            }
        }
    };
    ($($t:ty),* $(,)?) => {$(
        impl<'de> ::serde::Deserialize<'de> for $t {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::field_value::deserialize(d)
            }
        }
    )*};
}

/// The visitor of a [`Rule`] type: every kind of value goes to its rule.
struct Taker<R>(PhantomData<R>);

impl<R: Rule> Taker<R> {
    fn take<E: de::Error>(found: Found<'_>) -> Result<R, E> {
        R::take(found).map_err(E::custom)
    }
}

impl<'de, R: Rule> Visitor<'de> for Taker<R> {
    type Value = R;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<R, E> {
        Self::take(Found::Integer(i128::from(n)))
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<R, E> {
        Self::take(Found::Integer(i128::from(n)))
    }
    // TOML's integers are 64-bit: a literal beyond them comes as a 128-bit integer (whose
    // rule may refuse it as no integer of its kind).
    fn visit_i128<E: de::Error>(self, n: i128) -> Result<R, E> {
        Self::take(Found::Integer(n))
    }
    fn visit_u128<E: de::Error>(self, n: u128) -> Result<R, E> {
        Self::take(Found::Integer(i128::try_from(n).unwrap_or(i128::MAX)))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<R, E> {
        Self::take(Found::Float(f))
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<R, E> {
        Self::take(Found::Boolean(b))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<R, E> {
        Self::take(Found::String(s))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<R, A::Error> {
        Self::take(Found::Array)
    }
    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<R, A::Error> {
        Self::take(Found::Table)
    }
}

/// A value read by `T`'s `Deserialize` with its problem kept instead of raised: serde reads
/// every value of a struct in text order and stops at the first problem, but a reader may
/// need to name problems in an order of its own (a missing `name` before a bad `workers`,
/// `command` by `kind`). Reading never fails; the reader looks at the verdict when it comes
/// to the field. The problem is `T`'s own words (a [`Rule`]'s) or serde's.
#[derive(Debug, Clone, PartialEq)]
pub struct Deferred<T>(pub Result<T, String>);

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Deferred<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Deferred(
            T::deserialize(d).map_err(|e| e.to_string().trim().to_owned()),
        ))
    }
}

/// A value (one kept as given, a `toml::Value`) read as `T`, the problem as `T` words it.
pub fn value_as<T: de::DeserializeOwned>(value: &toml::Value) -> Result<T, String> {
    T::deserialize(value.clone()).map_err(|e| e.message().trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes integers only, and names the type of anything else.
    #[derive(Debug, PartialEq)]
    struct Whole(i128);

    impl Rule for Whole {
        fn take(found: Found<'_>) -> Result<Self, String> {
            match found {
                Found::Integer(n) => Ok(Whole(n)),
                other => Err(format!("expected an integer, found {}", other.type_str())),
            }
        }
    }

    crate::deserialize_by_rule!(Whole);

    fn value(text: &str) -> toml::Value {
        toml::from_str::<toml::Table>(&format!("v = {text}")).unwrap()["v"].clone()
    }

    #[test]
    fn a_deferred_value_keeps_its_problem_and_reading_goes_on() {
        #[derive(Debug, serde::Deserialize)]
        struct Two {
            a: Deferred<Whole>,
            b: Deferred<Whole>,
        }
        let two: Two = toml::from_str("a = \"x\"\nb = 99999999999999999999\n").unwrap();
        assert_eq!(
            two.a,
            Deferred(Err("expected an integer, found string".into()))
        );
        assert_eq!(two.b, Deferred(Ok(Whole(99_999_999_999_999_999_999))));
    }

    #[test]
    fn every_kind_of_value_reaches_the_rule() {
        assert_eq!(value_as::<Whole>(&value("-3")), Ok(Whole(-3)));
        for (text, found) in [
            ("1.5", "float"),
            ("true", "boolean"),
            ("\"x\"", "string"),
            ("[1]", "array"),
            ("{ a = 1 }", "table"),
        ] {
            let want = Err(format!("expected an integer, found {found}"));
            assert_eq!(value_as::<Whole>(&value(text)), want, "{text}");
        }
    }
}
