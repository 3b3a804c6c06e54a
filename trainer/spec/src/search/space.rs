//! The search space: parameters, their scales, random sampling and the grid.
//!
//! Numeric parameters live in an "internal" real interval where their scale is uniform:
//! the value itself for `linear`, `ln x` for `log`, `ln(1 − x)` for `reverse_log`;
//! integers are widened by half a step each side (`[min − 0.5, max + 0.5]`) and rounded
//! back, so each integer owns an equal share of the interval. Random sampling draws
//! uniformly there; TPE fits its Parzen estimators there; the grid spaces double points
//! evenly there.

use std::collections::BTreeMap;

use rand::Rng;
use serde::{Deserialize, Serialize};

/// A trial's parameter values by dotted name (`train.lr`, `model.hidden`): TOML floats for
/// doubles, integers for integers, the listed value itself for discrete and categorical
/// parameters (any TOML value, arrays included).
pub type Params = BTreeMap<String, toml::Value>;

/// How a numeric parameter's range is sampled (as in CloudML and SageMaker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// Uniform in `[min, max]`.
    #[default]
    Linear,
    /// Log-uniform: uniform in `[ln min, ln max]`; needs `min > 0`.
    Log,
    /// `1 − exp(U(ln(1 − max), ln(1 − min)))`: dense near `max` (momentum-like values);
    /// needs `0 <= min < max < 1`.
    ReverseLog,
}

/// A parameter's type and range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum ParamKind {
    /// A real in `[min, max]` (`min < max`).
    Double {
        /// Lower bound, inclusive.
        min: f64,
        /// Upper bound, inclusive.
        max: f64,
        /// Sampling scale.
        scale: Scale,
    },
    /// An integer in `[min, max]`, both ends included.
    Integer {
        /// Lower bound, inclusive.
        min: i64,
        /// Upper bound, inclusive.
        max: i64,
        /// Sampling scale (`reverse_log` is refused for integers).
        scale: Scale,
    },
    /// One of a list of numbers (TOML integers or floats).
    Discrete {
        /// The numbers, distinct, non-empty.
        values: Vec<toml::Value>,
    },
    /// One of a list of arbitrary TOML values (strings, arrays, tables...).
    Categorical {
        /// The values, distinct, non-empty.
        values: Vec<toml::Value>,
    },
}

/// One searched parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// Dotted path of the value it sets (`train.lr`); characters `[A-Za-z0-9_.-]`.
    pub name: String,
    /// Type and range.
    pub kind: ParamKind,
    /// Points of a double's range in a grid search, evenly spaced by its scale, both ends
    /// included. Default 5.
    pub grid_points: u32,
}

impl ParamSpec {
    /// The internal interval of a numeric parameter (see the module doc); `None` for
    /// discrete and categorical ones.
    pub(crate) fn internal_bounds(&self) -> Option<(f64, f64)> {
        match self.kind {
            ParamKind::Double { min, max, scale } => Some(match scale {
                Scale::Linear => (min, max),
                Scale::Log => (min.ln(), max.ln()),
                Scale::ReverseLog => ((1.0 - max).ln(), (1.0 - min).ln()),
            }),
            ParamKind::Integer { min, max, scale } => {
                let (lo, hi) = (min as f64 - 0.5, max as f64 + 0.5);
                Some(match scale {
                    Scale::Log => (lo.ln(), hi.ln()),
                    Scale::Linear | Scale::ReverseLog => (lo, hi),
                })
            }
            ParamKind::Discrete { .. } | ParamKind::Categorical { .. } => None,
        }
    }

    /// A value of this numeric parameter in the internal space (clamped into it); `None` for
    /// a value that is not a number, or a choice parameter.
    pub(crate) fn internal_of(&self, value: &toml::Value) -> Option<f64> {
        let x = match value {
            toml::Value::Float(f) => *f,
            toml::Value::Integer(i) => *i as f64,
            _ => return None,
        };
        let (lo, hi) = self.internal_bounds()?;
        let t = match self.kind {
            ParamKind::Double {
                scale: Scale::Log, ..
            }
            | ParamKind::Integer {
                scale: Scale::Log, ..
            } => x.ln(),
            ParamKind::Double {
                scale: Scale::ReverseLog,
                ..
            } => (1.0 - x).ln(),
            _ => x,
        };
        (!t.is_nan()).then(|| t.clamp(lo, hi))
    }

    /// The value of this numeric parameter at internal coordinate `t`, within its bounds.
    pub(crate) fn value_at_internal(&self, t: f64) -> toml::Value {
        match self.kind {
            ParamKind::Double { min, max, scale } => {
                let x = match scale {
                    Scale::Linear => t,
                    Scale::Log => t.exp(),
                    Scale::ReverseLog => 1.0 - t.exp(),
                };
                toml::Value::Float(x.clamp(min, max))
            }
            ParamKind::Integer { min, max, scale } => {
                let x = match scale {
                    Scale::Log => t.exp(),
                    Scale::Linear | Scale::ReverseLog => t,
                };
                // `as` saturates at the i64 range; the clamp keeps it in bounds.
                toml::Value::Integer((x.round() as i64).clamp(min, max))
            }
            ParamKind::Discrete { .. } | ParamKind::Categorical { .. } => {
                unreachable!("value_at_internal of a choice parameter")
            }
        }
    }

    /// The listed values of a discrete or categorical parameter.
    pub(crate) fn choices(&self) -> Option<&[toml::Value]> {
        match &self.kind {
            ParamKind::Discrete { values } | ParamKind::Categorical { values } => Some(values),
            ParamKind::Double { .. } | ParamKind::Integer { .. } => None,
        }
    }

    /// One value drawn by the parameter's scale: uniform in the internal space for numbers
    /// (exactly uniform over `min..=max` for linear integers), uniform over the list for
    /// choices.
    pub fn sample(&self, rng: &mut impl Rng) -> toml::Value {
        match &self.kind {
            ParamKind::Integer {
                min,
                max,
                scale: Scale::Linear | Scale::ReverseLog,
            } => toml::Value::Integer(rng.gen_range(*min..=*max)),
            ParamKind::Double { .. } | ParamKind::Integer { .. } => {
                let (lo, hi) = self.internal_bounds().expect("numeric parameter");
                let t = if lo < hi { rng.gen_range(lo..=hi) } else { lo };
                self.value_at_internal(t)
            }
            ParamKind::Discrete { values } | ParamKind::Categorical { values } => {
                values[rng.gen_range(0..values.len())].clone()
            }
        }
    }

    /// Number of values this parameter takes in a grid: `grid_points` for a double,
    /// `max − min + 1` for an integer, the list's length for a choice.
    pub fn grid_len(&self) -> u64 {
        match &self.kind {
            ParamKind::Double { .. } => u64::from(self.grid_points),
            ParamKind::Integer { min, max, .. } => {
                let n = i128::from(*max) - i128::from(*min) + 1;
                n.clamp(0, i128::from(u64::MAX)) as u64
            }
            ParamKind::Discrete { values } | ParamKind::Categorical { values } => {
                values.len() as u64
            }
        }
    }

    /// The `index`-th grid value (`index < grid_len()`): doubles evenly spaced by scale with
    /// both ends exact, integers `min + index`, choices in list order.
    pub fn grid_value(&self, index: u64) -> toml::Value {
        match &self.kind {
            ParamKind::Double { min, max, scale } => {
                let n = u64::from(self.grid_points.max(2));
                if index == 0 {
                    return toml::Value::Float(*min);
                }
                if index + 1 >= n {
                    return toml::Value::Float(*max);
                }
                let p = index as f64 / (n - 1) as f64;
                let x = match scale {
                    Scale::Linear => min + (max - min) * p,
                    Scale::Log => (min.ln() + (max.ln() - min.ln()) * p).exp(),
                    Scale::ReverseLog => {
                        let (a, b) = ((1.0 - min).ln(), (1.0 - max).ln());
                        1.0 - (a + (b - a) * p).exp()
                    }
                };
                toml::Value::Float(x.clamp(*min, *max))
            }
            ParamKind::Integer { min, max, .. } => {
                let x = i128::from(*min) + i128::from(index);
                toml::Value::Integer(x.min(i128::from(*max)) as i64)
            }
            ParamKind::Discrete { values } | ParamKind::Categorical { values } => {
                values[(index as usize).min(values.len() - 1)].clone()
            }
        }
    }
}

/// Every parameter drawn independently by its scale, in order (one RNG stream).
pub(crate) fn sample_all(params: &[ParamSpec], rng: &mut impl Rng) -> Params {
    params
        .iter()
        .map(|p| (p.name.clone(), p.sample(rng)))
        .collect()
}

/// The `k`-th point of the grid: the Cartesian product of the parameters' grid values in
/// mixed radix, the first parameter varying slowest. `k` beyond the grid wraps around.
pub(crate) fn grid_point(params: &[ParamSpec], k: u64) -> Params {
    let mut rest = k;
    let mut point = Params::new();
    for p in params.iter().rev() {
        let n = p.grid_len().max(1);
        point.insert(p.name.clone(), p.grid_value(rest % n));
        rest /= n;
    }
    point
}

/// The grid's size, saturating at `u64::MAX`.
pub(crate) fn grid_size(params: &[ParamSpec]) -> u64 {
    params
        .iter()
        .fold(1u64, |acc, p| acc.saturating_mul(p.grid_len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::rng_for;
    use proptest::prelude::*;

    fn double(min: f64, max: f64, scale: Scale) -> ParamSpec {
        ParamSpec {
            name: "x".into(),
            kind: ParamKind::Double { min, max, scale },
            grid_points: 5,
        }
    }

    fn integer(min: i64, max: i64, scale: Scale) -> ParamSpec {
        ParamSpec {
            name: "n".into(),
            kind: ParamKind::Integer { min, max, scale },
            grid_points: 5,
        }
    }

    fn floats(p: &ParamSpec, n: usize) -> Vec<f64> {
        let mut rng = rng_for(7, 0);
        (0..n)
            .map(|_| p.sample(&mut rng).as_float().unwrap())
            .collect()
    }

    #[test]
    fn log_scale_samples_are_log_uniform() {
        let p = double(1e-4, 1.0, Scale::Log);
        let xs = floats(&p, 2000);
        assert!(xs.iter().all(|x| (1e-4..=1.0).contains(x)));
        // Half below the geometric mean, a quarter in each decade.
        let below = xs.iter().filter(|&&x| x < 1e-2).count() as f64 / 2000.0;
        assert!((0.45..0.55).contains(&below), "{below}");
        for decade in 0..4 {
            let lo = 10f64.powi(-4 + decade);
            let share = xs.iter().filter(|&&x| x >= lo && x < lo * 10.0).count() as f64;
            assert!((400.0..600.0).contains(&share), "decade {decade}: {share}");
        }
    }

    #[test]
    fn reverse_log_scale_is_dense_near_max() {
        let p = double(0.0, 0.999, Scale::ReverseLog);
        let xs = floats(&p, 2000);
        assert!(xs.iter().all(|x| (0.0..=0.999).contains(x)));
        // 1 − x is log-uniform in [0.001, 1]: two thirds of the mass above 0.9.
        let high = xs.iter().filter(|&&x| x > 0.9).count() as f64 / 2000.0;
        assert!((0.61..0.72).contains(&high), "{high}");
        let linear = floats(&double(0.0, 0.999, Scale::Linear), 2000);
        let linear_high = linear.iter().filter(|&&x| x > 0.9).count() as f64 / 2000.0;
        assert!(linear_high < 0.15, "{linear_high}");
    }

    #[test]
    fn integers_stay_within_bounds_and_hit_both_ends() {
        for p in [integer(3, 7, Scale::Linear), integer(1, 16, Scale::Log)] {
            let ParamKind::Integer { min, max, .. } = p.kind else {
                unreachable!()
            };
            let mut rng = rng_for(3, 0);
            let xs: Vec<i64> = (0..2000)
                .map(|_| p.sample(&mut rng).as_integer().unwrap())
                .collect();
            assert!(xs.iter().all(|x| (min..=max).contains(x)), "{p:?}");
            assert!(xs.contains(&min) && xs.contains(&max), "{p:?}");
        }
        // Log scale favours small integers.
        let mut rng = rng_for(3, 1);
        let p = integer(1, 16, Scale::Log);
        let small = (0..2000)
            .filter(|_| p.sample(&mut rng).as_integer().unwrap() <= 4)
            .count();
        assert!(small > 1000, "{small}");
    }

    #[test]
    fn grid_values_follow_the_scale_with_exact_ends() {
        let mut p = double(1e-3, 1e-1, Scale::Log);
        p.grid_points = 3;
        let xs: Vec<f64> = (0..3)
            .map(|i| p.grid_value(i).as_float().unwrap())
            .collect();
        assert_eq!(xs[0], 1e-3);
        assert!((xs[1] - 1e-2).abs() < 1e-12);
        assert_eq!(xs[2], 1e-1);
        let mut p = double(0.0, 0.99, Scale::ReverseLog);
        p.grid_points = 3;
        let mid = p.grid_value(1).as_float().unwrap();
        assert!((mid - 0.9).abs() < 1e-12, "{mid}");
        assert_eq!(integer(-2, 2, Scale::Log).grid_len(), 5);
        assert_eq!(
            integer(-2, 2, Scale::Linear).grid_value(4),
            toml::Value::Integer(2)
        );
    }

    #[test]
    fn internal_space_round_trips() {
        for p in [
            double(0.5, 2.0, Scale::Linear),
            double(1e-3, 1.0, Scale::Log),
            double(0.1, 0.99, Scale::ReverseLog),
        ] {
            let v = toml::Value::Float(0.7);
            let back = p.value_at_internal(p.internal_of(&v).unwrap());
            assert!((back.as_float().unwrap() - 0.7).abs() < 1e-12, "{p:?}");
        }
        let p = integer(1, 100, Scale::Log);
        let v = toml::Value::Integer(37);
        assert_eq!(p.value_at_internal(p.internal_of(&v).unwrap()), v);
        assert_eq!(p.internal_of(&toml::Value::String("a".into())), None);
    }

    fn any_scale() -> impl Strategy<Value = Scale> {
        prop_oneof![
            Just(Scale::Linear),
            Just(Scale::Log),
            Just(Scale::ReverseLog)
        ]
    }

    proptest! {
        #[test]
        fn doubles_sample_within_bounds(
            a in 0.0f64..1.0, b in 0.0f64..1.0, span in 1e-9f64..1e9,
            scale in any_scale(), seed in any::<u64>(),
        ) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assume!(lo < hi);
            let (min, max) = match scale {
                Scale::ReverseLog => (lo, hi.min(1.0 - 1e-12)),
                Scale::Log => ((lo + 1e-12) * span, (hi + 1e-12) * span),
                Scale::Linear => ((lo - 0.5) * span, (hi - 0.5) * span),
            };
            prop_assume!(min < max);
            let p = double(min, max, scale);
            let mut rng = rng_for(seed, 0);
            for _ in 0..20 {
                let x = p.sample(&mut rng).as_float().unwrap();
                prop_assert!(x >= min && x <= max, "{} not in [{}, {}]", x, min, max);
            }
            for i in 0..5 {
                let x = p.grid_value(i).as_float().unwrap();
                prop_assert!(x >= min && x <= max);
            }
        }

        #[test]
        fn integers_sample_within_bounds(
            min in -1_000_000_000_000i64..1_000_000_000_000, len in 0i64..1_000_000,
            log in any::<bool>(), seed in any::<u64>(),
        ) {
            let (min, scale) = if log { (min.abs() + 1, Scale::Log) } else { (min, Scale::Linear) };
            let max = min + len;
            let p = integer(min, max, scale);
            let mut rng = rng_for(seed, 0);
            for _ in 0..20 {
                let x = p.sample(&mut rng).as_integer().unwrap();
                prop_assert!(x >= min && x <= max);
            }
        }
    }
}
