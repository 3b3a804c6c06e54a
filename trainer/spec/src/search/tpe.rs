//! The tree-structured Parzen estimator (Bergstra et al. 2011), univariate, in the manner of
//! the common default TPE samplers.
//!
//! After [`n_startup`] random trials, each new trial's parameters are chosen independently:
//! the observations (trials with a value, not failed; each judged by its value at its
//! largest resource) are split into the best `γ(n) = min(⌈0.1·n⌉, 25)` ("good", at least
//! one) and the rest ("bad"); each group gets a density over the parameter — `l(x)` for the
//! good, `g(x)` for the bad — and of [`TPE_CANDIDATES`] draws from `l` the one maximising
//! `log l(x) − log g(x)` (the expected improvement's argmax) is taken.
//!
//! Numeric parameters are modelled in their internal space (see `space`) by a Parzen
//! estimator: a Gaussian mixture with one equally weighted component per observation plus a
//! prior component (mean the middle of the interval, σ its width), each component's σ the
//! larger distance to its sorted neighbours (the interval ends standing in at the edges),
//! clipped to `[width / min(100, 1 + components), width]`, the mixture truncated to the
//! interval. Integers are modelled as reals and rounded. Discrete and categorical parameters
//! use counts plus one prior pseudo-count per value.

use rand::Rng;

use super::space::{ParamSpec, Params};

/// Draws from `l(x)` per parameter and suggestion.
pub const TPE_CANDIDATES: usize = 24;
/// Most observations in the good group.
pub const TPE_GOOD_MAX: usize = 25;
/// Most random start-up trials.
pub const TPE_STARTUP_MAX: u32 = 10;
/// Tries to draw a truncated Gaussian by rejection before falling back to clamping.
const REJECTION_TRIES_MAX: usize = 64;

/// Random trials before TPE takes over: `min(10, max(2, trials / 3))`.
pub(crate) fn n_startup(trials: u32) -> usize {
    TPE_STARTUP_MAX.min((trials / 3).max(2)) as usize
}

/// The size of the good group for `n` observations: `min(⌈n/10⌉, 25)`, at least 1.
pub(crate) fn n_good(n: usize) -> usize {
    n.div_ceil(10).clamp(1, TPE_GOOD_MAX)
}

/// New parameters from `observations` (parameters and "higher is better" key, best first;
/// at least two).
pub(crate) fn suggest(
    space: &[ParamSpec],
    observations: &[(&Params, f64)],
    rng: &mut impl Rng,
) -> Params {
    let (good, bad) = observations.split_at(n_good(observations.len()));
    space
        .iter()
        .map(|p| (p.name.clone(), suggest_one(p, good, bad, rng)))
        .collect()
}

fn suggest_one(
    p: &ParamSpec,
    good: &[(&Params, f64)],
    bad: &[(&Params, f64)],
    rng: &mut impl Rng,
) -> toml::Value {
    if let Some(values) = p.choices() {
        let l = Categorical::new(
            values,
            good.iter().filter_map(|(params, _)| params.get(&p.name)),
        );
        let g = Categorical::new(
            values,
            bad.iter().filter_map(|(params, _)| params.get(&p.name)),
        );
        let best = (0..TPE_CANDIDATES)
            .map(|_| l.sample(rng))
            .max_by(|&a, &b| {
                let score = |i: usize| l.log_p(i) - g.log_p(i);
                score(a).total_cmp(&score(b)).then(b.cmp(&a))
            })
            .unwrap_or(0);
        return values[best].clone();
    }
    let (lo, hi) = p.internal_bounds().expect("numeric parameter");
    let internal = |group: &[(&Params, f64)]| -> Vec<f64> {
        group
            .iter()
            .filter_map(|(params, _)| params.get(&p.name).and_then(|v| p.internal_of(v)))
            .collect()
    };
    let l = Parzen::new(&internal(good), lo, hi);
    let g = Parzen::new(&internal(bad), lo, hi);
    let mut best = (f64::NEG_INFINITY, (lo + hi) / 2.0);
    for _ in 0..TPE_CANDIDATES {
        let x = l.sample(rng);
        let score = l.log_pdf(x) - g.log_pdf(x);
        if score > best.0 {
            best = (score, x);
        }
    }
    p.value_at_internal(best.1)
}

/// Counts of a choice parameter's values plus one pseudo-count each.
struct Categorical {
    weights: Vec<f64>,
    total: f64,
}

impl Categorical {
    fn new<'a>(values: &[toml::Value], observed: impl Iterator<Item = &'a toml::Value>) -> Self {
        let mut weights = vec![1.0; values.len()];
        for v in observed {
            if let Some(i) = values.iter().position(|w| w == v) {
                weights[i] += 1.0;
            }
        }
        let total = weights.iter().sum();
        Categorical { weights, total }
    }

    fn sample(&self, rng: &mut impl Rng) -> usize {
        let mut u = rng.gen_range(0.0..self.total);
        for (i, w) in self.weights.iter().enumerate() {
            if u < *w {
                return i;
            }
            u -= w;
        }
        self.weights.len() - 1
    }

    fn log_p(&self, i: usize) -> f64 {
        (self.weights[i] / self.total).ln()
    }
}

/// A truncated Gaussian mixture on `[lo, hi]`: one component per observation plus a prior.
#[derive(Debug)]
pub(crate) struct Parzen {
    lo: f64,
    hi: f64,
    mus: Vec<f64>,
    sigmas: Vec<f64>,
    /// ln(weight / mass inside [lo, hi]) per component.
    log_scale: Vec<f64>,
}

impl Parzen {
    /// The estimator for `observations` (internal coordinates inside `[lo, hi]`, `lo < hi`).
    pub(crate) fn new(observations: &[f64], lo: f64, hi: f64) -> Parzen {
        let width = hi - lo;
        let mut points: Vec<(f64, bool)> = observations
            .iter()
            .map(|&x| (x.clamp(lo, hi), false))
            .chain([((lo + hi) / 2.0, true)])
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let n = points.len();
        let sigma_min = width / (1.0 + n as f64).min(100.0);
        let mut mus = Vec::with_capacity(n);
        let mut sigmas = Vec::with_capacity(n);
        for (i, &(mu, prior)) in points.iter().enumerate() {
            let left = mu - if i == 0 { lo } else { points[i - 1].0 };
            let right = if i + 1 == n { hi } else { points[i + 1].0 } - mu;
            let sigma = if prior { width } else { left.max(right) };
            mus.push(mu);
            sigmas.push(sigma.clamp(sigma_min, width));
        }
        let log_weight = -(n as f64).ln();
        let log_scale = mus
            .iter()
            .zip(&sigmas)
            .map(|(&mu, &s)| {
                let mass = normal_cdf((hi - mu) / s) - normal_cdf((lo - mu) / s);
                log_weight - mass.max(1e-12).ln()
            })
            .collect();
        Parzen {
            lo,
            hi,
            mus,
            sigmas,
            log_scale,
        }
    }

    /// A draw: a component chosen by weight, then its Gaussian truncated to `[lo, hi]`.
    pub(crate) fn sample(&self, rng: &mut impl Rng) -> f64 {
        let i = rng.gen_range(0..self.mus.len());
        let (mu, sigma) = (self.mus[i], self.sigmas[i]);
        for _ in 0..REJECTION_TRIES_MAX {
            let x = mu + sigma * standard_normal(rng);
            if (self.lo..=self.hi).contains(&x) {
                return x;
            }
        }
        mu
    }

    /// The log density at `x` (in `[lo, hi]`).
    pub(crate) fn log_pdf(&self, x: f64) -> f64 {
        const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;
        let terms: Vec<f64> = self
            .mus
            .iter()
            .zip(&self.sigmas)
            .zip(&self.log_scale)
            .map(|((&mu, &s), &scale)| {
                let z = (x - mu) / s;
                scale - 0.5 * z * z - LN_SQRT_2PI - s.ln()
            })
            .collect();
        let top = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        top + terms.iter().map(|t| (t - top).exp()).sum::<f64>().ln()
    }
}

/// A standard normal draw (Box–Muller).
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    let v: f64 = rng.gen();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// Φ(z), the standard normal CDF.
fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// The complementary error function, by the Chebyshev fit of Numerical Recipes (`erfcc`,
/// fractional error below 1.2e-7 everywhere).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::testing::{spec, Sim};
    use crate::search::{rng_for, Algorithm, Searcher, Trial};

    #[test]
    fn startup_and_good_group_sizes() {
        assert_eq!(
            [1, 6, 9, 30, 60, 1000].map(n_startup),
            [2, 2, 3, 10, 10, 10]
        );
        assert_eq!([1, 2, 10, 11, 100, 1000].map(n_good), [1, 1, 1, 2, 10, 25]);
    }

    #[test]
    fn erfc_matches_known_values() {
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((erfc(1.0) - 0.157_299_207).abs() < 1e-7);
        assert!((erfc(-1.0) - 1.842_700_793).abs() < 1e-7);
        assert!((normal_cdf(1.959_964) - 0.975).abs() < 1e-6);
    }

    #[test]
    fn parzen_density_integrates_to_one_and_samples_inside() {
        let p = Parzen::new(&[0.1, 0.15, 0.9, 1.0], 0.0, 1.0);
        let steps = 20_000;
        let h = 1.0 / steps as f64;
        let integral: f64 = (0..steps)
            .map(|i| p.log_pdf((i as f64 + 0.5) * h).exp() * h)
            .sum();
        assert!((integral - 1.0).abs() < 1e-3, "{integral}");
        // Mass concentrates near the observations.
        assert!(p.log_pdf(0.12) > p.log_pdf(0.5));
        let mut rng = rng_for(1, 1);
        assert!((0..1000).all(|_| (0.0..=1.0).contains(&p.sample(&mut rng))));
    }

    #[test]
    fn tpe_starts_like_random() {
        let startup = n_startup(30);
        let run = |algorithm: &str| {
            let mut sim = Sim::new(spec(algorithm, "min", "trials = 30"), true);
            while sim.trials.len() < startup {
                sim.start_one();
            }
            sim.trials
                .iter()
                .map(|t| t.params.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(run("tpe"), run("random"));
    }

    /// Best value found by a sequential search of `trials` on
    /// `(x − 0.7)² + (log10 y + 2)²`, each trial reporting once.
    fn best_on_quadratic(algorithm: &str, seed: u64, trials: u32) -> f64 {
        let extra = format!(
            r#"
            trials = {trials}
            seed = {seed}
            max_resource = 1
            params = [
              {{ name = "x", type = "double", min = 0, max = 1 }},
              {{ name = "y", type = "double", min = 1e-4, max = 1, scale = "log" }},
            ]
            "#
        );
        let searcher: Searcher = spec(algorithm, "min", &extra).searcher(true).unwrap();
        let mut trials: Vec<Trial> = Vec::new();
        while let crate::search::Suggestion::New {
            params,
            bracket,
            target,
        } = searcher.suggest(&trials)
        {
            let id = trials.len() as u32;
            let x = params["x"].as_float().unwrap();
            let y = params["y"].as_float().unwrap();
            let value = (x - 0.7).powi(2) + (y.log10() + 2.0).powi(2);
            let mut t = Trial::new(id, params, bracket, target);
            t.state = crate::search::TrialState::Running;
            trials.push(t);
            trials[id as usize]
                .reports
                .push(crate::search::Report { resource: 1, value });
            let decision = searcher.on_report(&trials, id, 1, value);
            assert_eq!(decision, crate::search::Decision::Done);
            trials[id as usize].state = crate::search::TrialState::Succeeded;
        }
        assert_eq!(trials.len(), 60);
        searcher.best(&trials).unwrap().1
    }

    #[test]
    fn tpe_beats_random_on_a_quadratic() {
        assert_eq!(spec("tpe", "min", "").algorithm, Algorithm::Tpe);
        let seeds = 0..5u64;
        let mean = |algorithm: &str| {
            seeds
                .clone()
                .map(|s| best_on_quadratic(algorithm, s, 60))
                .sum::<f64>()
                / 5.0
        };
        let (tpe, random) = (mean("tpe"), mean("random"));
        assert!(tpe < random, "tpe {tpe} random {random}");
    }

    #[test]
    fn tpe_favours_the_good_categories() {
        let extra = r#"
            trials = 40
            params = [{ name = "c", type = "categorical", values = ["a", "b", ["c"]] }]
        "#;
        let searcher = spec("tpe", "max", extra).searcher(true).unwrap();
        let mut trials: Vec<Trial> = Vec::new();
        let mut picks = Vec::new();
        while let crate::search::Suggestion::New { params, .. } = searcher.suggest(&trials) {
            let id = trials.len() as u32;
            let value = if params["c"] == toml::Value::Array(vec!["c".into()]) {
                1.0
            } else {
                0.0
            };
            picks.push(value);
            let mut t = Trial::new(id, params, 0, 9);
            t.state = crate::search::TrialState::Succeeded;
            t.reports.push(crate::search::Report { resource: 9, value });
            trials.push(t);
        }
        let late = picks[20..].iter().sum::<f64>() / 20.0;
        assert!(late > 0.6, "{late}");
    }
}
