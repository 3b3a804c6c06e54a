//! A problem with one field of a spec's tables, the error every reader here returns, and
//! the one reader of a spec's table by serde ([`read_table`]): the trainer's tables and the
//! node's own sections (`[resources]`, `[elastic]`, `[preemption]`) are read through it, so
//! a key or value at fault is named the same way everywhere (its dotted path, where it is
//! in the text, the known key a typo is closest to).

use std::ops::Range;

use serde::de::DeserializeOwned;
use toml::de::DeValue;
use toml::Spanned;

/// A problem with one field of a spec's tables: its dotted path (`[i]` for array elements)
/// and what is wrong. Shared by the trainer's tables and the `[search]` table
/// ([`crate::search::SearchError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// Dotted path of the offending (or missing) key: `train.lr`, `model.hidden`,
    /// `search.params[1].max`.
    pub field: String,
    /// What is wrong, lowercase.
    pub problem: String,
    /// Whether the key is one its table does not define (a typo, most often).
    pub unknown: bool,
}

impl FieldError {
    /// An error at `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> FieldError {
        FieldError {
            field: field.into(),
            problem: problem.into(),
            unknown: false,
        }
    }

    /// `field` is not a key of its table, whose keys are `known`.
    pub fn unknown(field: impl Into<String>, known: &[&str]) -> FieldError {
        let mut known = known.to_vec();
        known.sort_unstable();
        FieldError {
            field: field.into(),
            problem: format!("unknown field (known: {})", known.join(", ")),
            unknown: true,
        }
    }
}

/// A [`FieldError`] found by [`read_table`], with where its key or value is in the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpannedFieldError {
    /// The field (`section.key`) and what is wrong.
    pub error: FieldError,
    /// The byte range of the key (an unknown one) or value at fault in the document the
    /// table was parsed from; `None` when serde named no place.
    pub span: Option<Range<usize>>,
    /// For an unknown key: the known key spelled closest to it, within edit distance 2, as
    /// a full path (`resources.cpus_per_worker`).
    pub suggestion: Option<String>,
}

/// Reads the table `value` at dotted `path` (`model`, `elastic`; empty for a document's top
/// level) as `T`, a struct with a
/// derived `Deserialize` (its field attributes and `deserialize_with` say each value's rules
/// and problem). First a key `T` does not define, in text order, so a typo is reported as a
/// typo and not as the value it was meant to be; then serde's first error, named through its
/// span: `path.key` when it lies in a key or value of the table, `path` otherwise.
pub fn read_table<T: DeserializeOwned>(
    path: &str,
    value: &Spanned<DeValue<'_>>,
) -> Result<T, SpannedFieldError> {
    let known = field_names::<T>();
    // A key's full path: `path.key`, or `key` at the top level (`path` empty).
    let full = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    if let (Some(table), false) = (value.get_ref().as_table(), known.is_empty()) {
        let unknown = table
            .iter()
            .filter(|(k, _)| !known.contains(&k.get_ref().as_ref()))
            .min_by_key(|(k, _)| k.span().start);
        if let Some((k, _)) = unknown {
            let key: &str = k.get_ref();
            return Err(SpannedFieldError {
                error: FieldError::unknown(full(key), known),
                span: Some(k.span()),
                suggestion: closest(key, known).map(full),
            });
        }
    }
    T::deserialize(toml::de::ValueDeserializer::from(value.clone())).map_err(|e| {
        let problem = e.message().trim().to_owned();
        let span = e.span();
        let at = span.clone().and_then(|span| {
            value.get_ref().as_table()?.iter().find_map(|(k, v)| {
                let key: &str = k.get_ref();
                if k.span() == span {
                    Some((key.to_owned(), true))
                } else if v.span().start <= span.start && span.end <= v.span().end {
                    Some((key.to_owned(), false))
                } else {
                    None
                }
            })
        });
        let error = match at {
            Some((key, true)) => FieldError::unknown(full(&key), known),
            Some((key, false)) => FieldError::new(full(&key), problem),
            None => FieldError::new(path, problem),
        };
        SpannedFieldError {
            error,
            span,
            suggestion: None,
        }
    })
}

/// The field names a derived `Deserialize` struct `T` reads: the list serde passes to
/// `deserialize_struct`, caught by a deserializer that reads nothing (empty for a type that
/// is not a struct).
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};
    struct Names<'a>(&'a mut &'static [&'static str]);
    impl<'de> de::Deserializer<'de> for Names<'_> {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("names read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut names: &'static [&'static str] = &[];
    let _ = T::deserialize(Names(&mut names));
    names
}

/// The known key closest to `key` if it is within edit distance 2 (typos).
pub fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance with adjacent transpositions (optimal string alignment).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use toml::de::DeTable;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Section {
        width: Option<u32>,
        depth: Option<u32>,
    }

    /// `[s]` of `text` read as a `Section`, and the 1-based line of the error's span.
    fn read(text: &str) -> Result<Section, (SpannedFieldError, usize)> {
        let doc = DeTable::parse(text).unwrap();
        let value = doc.get_ref().get("s").unwrap();
        read_table::<Section>("s", value).map_err(|e| {
            let line = text[..e.span.clone().unwrap().start].matches('\n').count() + 1;
            (e, line)
        })
    }

    #[test]
    fn a_table_reads_as_its_struct() {
        let s = read("[s]\nwidth = 3\n").unwrap();
        assert_eq!(
            s,
            Section {
                width: Some(3),
                depth: None
            }
        );
    }

    #[test]
    fn the_first_unknown_key_in_text_order_is_named_before_any_bad_value() {
        let (e, line) = read("[s]\nwidth = \"x\"\nzzz = 1\ndepht = 2\n").unwrap_err();
        assert_eq!(e.error.field, "s.zzz");
        assert!(e.error.unknown);
        assert_eq!(e.error.problem, "unknown field (known: depth, width)");
        assert_eq!((line, e.suggestion), (3, None));
        let (e, line) = read("[s]\ndepht = 2\n").unwrap_err();
        assert_eq!((e.error.field.as_str(), line), ("s.depht", 2));
        assert_eq!(e.suggestion.as_deref(), Some("s.depth"));
    }

    #[test]
    fn a_bad_value_is_named_by_its_key_and_line() {
        let (e, line) = read("[s]\nwidth = 1\n\ndepth = \"x\"\n").unwrap_err();
        assert_eq!(e.error.field, "s.depth");
        assert!(!e.error.unknown);
        assert_eq!(line, 4);
    }

    #[test]
    fn edit_distance_counts_a_transposition_as_one() {
        assert_eq!(edit_distance("wrokers", "workers"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("nmae", &["name", "kind"]), Some("name"));
        assert_eq!(closest("zzzzzz", &["name"]), None);
    }
}
