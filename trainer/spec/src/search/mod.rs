//! Hyperparameter search: grid, random, ASHA, Hyperband and TPE, with the median stopping
//! rule, as pure logic.
//!
//! A search job's `[search]` table parses into a [`SearchSpec`] ([`SearchSpec::from_table`],
//! every error naming the offending key's full path, e.g. `search.params[1].max`);
//! [`SearchSpec::searcher`] turns it into a [`Searcher`].
//!
//! # Design: a pure function of the trial table
//!
//! The node keeps a search's trials (their parameters, bracket, state, target resource and
//! reported values, [`Trial`]) in its replicated Raft log. The [`Searcher`] holds no state of
//! its own beyond the spec: [`Searcher::suggest`] (what to start next) and
//! [`Searcher::on_report`] (what a trial should do after a report) are deterministic
//! functions of (spec, trial table). A new chief therefore rebuilds nothing: it reads the
//! table from the log and asks the same questions, getting the same answers the old chief
//! would have got. Randomness comes from an RNG seeded by (`seed`, number of trials created
//! so far) through BLAKE3, so asking again before the node has recorded a suggestion gives
//! the same suggestion, and a replay gives the same sequence (within one build: `SmallRng`'s
//! algorithm is not promised stable across `rand` versions; the suggested parameters are in
//! the log anyway).
//!
//! No I/O, clocks or async here; the node drives it:
//!
//! 1. when it has room to start something, it calls [`Searcher::suggest`] and applies the
//!    answer to the table: [`Suggestion::New`] appends a trial (id = its index, state
//!    [`TrialState::Pending`]), [`Suggestion::Promote`] sets a paused trial's target and
//!    resumes it, [`Suggestion::Wait`] waits for the next report, [`Suggestion::Exhausted`]
//!    stops the paused trials and lets the running ones finish;
//! 2. on each metric line of a trial it appends a [`Report`] to the trial and calls
//!    [`Searcher::on_report`], applying the [`Decision`].
//!
//! The searcher's own cap on concurrency (`max_parallel`) is applied in `suggest` (it answers
//! `Wait` while that many trials are pending or running). `max_trial_failures` and
//! `speculate_factor` are carried for the node, which retries and speculates; failed trials
//! count towards the trial budget.
//!
//! Files: `spec` parses the table; `space` holds parameters, sampling and the grid; `asha` ASHA and Hyperband (rungs, brackets, promotions, early stops); `tpe` the
//! tree-structured Parzen estimator; `median` the median stopping rule.

mod asha;
mod median;
mod space;
mod spec;
#[cfg(test)]
mod testing;
mod tpe;

use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

pub use median::MEDIAN_PEERS_MIN;
pub use space::{ParamKind, ParamSpec, Params, Scale};
pub use spec::{
    Algorithm, Direction, SearchError, SearchSpec, Stopping, TrialKind, GRID_INTEGER_VALUES_MAX,
    GRID_POINTS_DEFAULT, GRID_POINTS_MAX, GRID_SIZE_MAX, PARAMS_MAX, PARAM_NAME_BYTES_MAX,
    TRIALS_MAX, VALUES_MAX,
};
pub use tpe::{TPE_CANDIDATES, TPE_GOOD_MAX, TPE_STARTUP_MAX};

/// Where a trial is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrialState {
    /// Created by a suggestion; the node has not started it yet.
    Pending,
    /// Training (or, for a command trial, its process is running).
    Running,
    /// Reached a rung and waits for a possible promotion (ASHA with resumable trials); it
    /// resumes from its checkpoint when promoted.
    Paused,
    /// Trained to its final target.
    Succeeded,
    /// Stopped early by the searcher (an early-stopping rule, or left paused at the end).
    Stopped,
    /// Failed (process error, lost node); its reports so far still count.
    Failed,
}

impl TrialState {
    /// Pending or running: counts against `max_parallel`, may still report.
    pub fn is_active(self) -> bool {
        matches!(self, TrialState::Pending | TrialState::Running)
    }
}

/// One reported metric value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Resource used so far when the value was measured (epochs).
    pub resource: u32,
    /// The metric's value.
    pub value: f64,
}

/// One trial of a search, as the node keeps it in its log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// Index in the search's trial table (`trials[i].id == i`).
    pub id: u32,
    /// Parameter values, by dotted name.
    pub params: Params,
    /// Hyperband bracket (0 for every other algorithm).
    pub bracket: u32,
    /// Current state.
    pub state: TrialState,
    /// Resource the current run trains to (epochs); 0 means the template's own length.
    pub target: u32,
    /// Reported values, in the order they came.
    pub reports: Vec<Report>,
    /// Times the trial was promoted to a higher rung.
    pub promotions: u32,
}

impl Trial {
    /// A new pending trial, as [`Suggestion::New`] describes it.
    pub fn new(id: u32, params: Params, bracket: u32, target: u32) -> Trial {
        Trial {
            id,
            params,
            bracket,
            state: TrialState::Pending,
            target,
            reports: Vec::new(),
            promotions: 0,
        }
    }

    /// The report at the largest resource (the latest of those, if several).
    pub fn final_report(&self) -> Option<&Report> {
        self.reports.iter().max_by_key(|r| r.resource)
    }

    /// The largest resource reported.
    pub fn last_resource(&self) -> Option<u32> {
        self.reports.iter().map(|r| r.resource).max()
    }

    /// The first report at or beyond `resource`: the trial's value at a rung.
    pub fn first_report_at_least(&self, resource: u32) -> Option<&Report> {
        self.reports.iter().find(|r| r.resource >= resource)
    }
}

/// What the node should start next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Suggestion {
    /// Create trial number `trials.len()` with these parameters.
    New {
        /// Parameter values.
        params: Params,
        /// Hyperband bracket (0 otherwise).
        bracket: u32,
        /// Resource to train to; 0 means the template's own length.
        target: u32,
    },
    /// Resume a paused trial (from its checkpoint) and train it to `target`.
    Promote {
        /// Trial id.
        trial: u32,
        /// New target resource.
        target: u32,
    },
    /// Nothing to start now; trials are still running and may change that.
    Wait,
    /// No more trials will be created or promoted: stop the paused ones, let the running ones
    /// finish; the search ends when none is active.
    Exhausted,
}

/// What a trial should do after a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Keep training.
    Continue,
    /// Stop early (state [`TrialState::Stopped`]).
    Stop,
    /// Stop at this rung, keep the checkpoint, wait for a promotion (state
    /// [`TrialState::Paused`]).
    Pause,
    /// Keep training, now to `target` (counts as a promotion).
    Promote {
        /// New target resource.
        target: u32,
    },
    /// The trial reached its final target (state [`TrialState::Succeeded`]).
    Done,
}

/// The search algorithm of one search, a pure function of its trial table (see the module
/// doc). Built by [`SearchSpec::searcher`].
#[derive(Debug, Clone, PartialEq)]
pub struct Searcher {
    spec: SearchSpec,
    resumable: bool,
    /// ASHA/Hyperband: each bracket's rung resources, ascending, last = `max_resource`.
    /// Other algorithms: one bracket with one rung, the target.
    rungs: Vec<Vec<u32>>,
    /// Hyperband's bracket sizes (one entry for the other algorithms).
    sizes: Vec<u32>,
    /// Number of trials the search creates.
    budget: u32,
}

impl SearchSpec {
    /// The searcher for this spec. `resumable`: trials can pause at a rung and resume from
    /// their checkpoint (train trials); false for command trials, which ASHA can only stop.
    ///
    /// Refuses a spec whose resource settings do not fit its algorithm, notably ASHA or
    /// Hyperband with `max_resource` still unset (the node fills it from the template's
    /// `train.epochs` for train trials).
    pub fn searcher(&self, resumable: bool) -> Result<Searcher, SearchError> {
        self.validate_for_searcher()?;
        let budget = match self.algorithm {
            Algorithm::Grid => {
                let size = self.grid_size().min(u64::from(u32::MAX)) as u32;
                size.min(self.trials)
            }
            _ => self.trials,
        };
        let (rungs, sizes) = match (self.algorithm, self.max_resource) {
            (Algorithm::Asha | Algorithm::Hyperband, Some(max)) => {
                let hyperband = self.algorithm == Algorithm::Hyperband;
                let brackets =
                    asha::Brackets::new(self.min_resource, max, self.reduction_factor, hyperband);
                (brackets.rungs, brackets.sizes)
            }
            _ => (vec![vec![self.max_resource.unwrap_or(0)]], vec![budget]),
        };
        Ok(Searcher {
            spec: self.clone(),
            resumable,
            rungs,
            sizes,
            budget,
        })
    }
}

impl Searcher {
    /// The spec this searcher was built from.
    pub fn spec(&self) -> &SearchSpec {
        &self.spec
    }

    /// Whether trials can pause and resume (train trials).
    pub fn resumable(&self) -> bool {
        self.resumable
    }

    /// Number of trials the search creates: the grid's size capped by `trials` for a grid,
    /// `trials` otherwise. Failed trials count.
    pub fn budget(&self) -> u32 {
        self.budget
    }

    /// Number of brackets: `s_max + 1` for Hyperband, 1 otherwise.
    pub fn brackets(&self) -> u32 {
        self.rungs.len() as u32
    }

    /// Hyperband's bracket sizes `n_b`, the proportions in which new trials go to brackets
    /// (bracket 0 the most exploratory). One entry, the budget, for the other algorithms.
    pub fn bracket_sizes(&self) -> Vec<u32> {
        self.sizes.clone()
    }

    /// The resource levels of a bracket's rungs, ascending, the last being `max_resource`.
    /// For grid, random and TPE: one rung, the target (0 when `max_resource` is unset).
    /// Empty for a bracket that does not exist.
    pub fn rungs(&self, bracket: u32) -> Vec<u32> {
        self.rungs
            .get(bracket as usize)
            .cloned()
            .unwrap_or_default()
    }

    /// Whether `a` is strictly better than `b` in the search's direction (NaN is worse than
    /// everything).
    pub fn value_better(&self, a: f64, b: f64) -> bool {
        self.key(a) > self.key(b)
    }

    /// A value as a "higher is better" key: the value for `max`, its negation for `min`,
    /// −∞ for NaN.
    pub fn key(&self, value: f64) -> f64 {
        if value.is_nan() {
            return f64::NEG_INFINITY;
        }
        match self.spec.direction {
            Direction::Max => value,
            Direction::Min => -value,
        }
    }

    /// The best trial so far and its value.
    ///
    /// Each trial is judged by its value at the largest resource it reported (the latest
    /// such report), whatever its state: a trial stopped early competes with the value it
    /// had when stopped, not with a better value it showed earlier. The best by direction
    /// wins; ties go to the larger resource, then the lower id. Trials whose value is NaN
    /// are skipped.
    pub fn best<'a>(&self, trials: &'a [Trial]) -> Option<(&'a Trial, f64)> {
        trials
            .iter()
            .filter_map(|t| {
                t.final_report()
                    .filter(|r| !r.value.is_nan())
                    .map(|r| (t, *r))
            })
            .max_by(|(ta, ra), (tb, rb)| {
                self.key(ra.value)
                    .total_cmp(&self.key(rb.value))
                    .then(ra.resource.cmp(&rb.resource))
                    .then(tb.id.cmp(&ta.id))
            })
            .map(|(t, r)| (t, r.value))
    }

    /// What to start next, given every trial created so far (`trials[i].id == i`).
    ///
    /// Deterministic in (spec, `trials`): asking twice before the node records the answer
    /// gives the same answer.
    pub fn suggest(&self, trials: &[Trial]) -> Suggestion {
        let active = trials.iter().filter(|t| t.state.is_active()).count();
        let cap = self.spec.max_parallel as usize;
        let cap_reached = cap > 0 && active >= cap;
        let promoting = self.is_asha() && self.resumable;
        if promoting && !cap_reached {
            if let Some(promotion) = self.promotion(trials) {
                return promotion;
            }
        }
        if trials.len() < self.budget as usize {
            if cap_reached {
                return Suggestion::Wait;
            }
            return self.new_trial(trials);
        }
        if promoting && active > 0 {
            // A running trial's next rung value may open a promotion.
            return Suggestion::Wait;
        }
        Suggestion::Exhausted
    }

    /// What trial `trial` should do after reporting `value` at `resource`. Called after the
    /// node appended that report to `trials[trial].reports` (if it has not, the searcher
    /// judges as if it had). An unknown trial id is answered [`Decision::Stop`].
    pub fn on_report(&self, trials: &[Trial], trial: u32, resource: u32, value: f64) -> Decision {
        let Some(t) = trials.get(trial as usize) else {
            return Decision::Stop;
        };
        let recorded = t.reports.last().is_some_and(|r| {
            r.resource == resource && (r.value == value || (r.value.is_nan() && value.is_nan()))
        });
        let owned;
        let trials = if recorded {
            trials
        } else {
            let mut copy = trials.to_vec();
            copy[trial as usize]
                .reports
                .push(Report { resource, value });
            owned = copy;
            &owned[..]
        };
        if self.is_asha() {
            if self.resumable {
                self.asha_on_report(trials, trial, resource)
            } else {
                self.asha_stop_on_report(trials, trial, resource)
            }
        } else {
            self.median_on_report(trials, trial, resource)
        }
    }

    fn is_asha(&self) -> bool {
        matches!(self.spec.algorithm, Algorithm::Asha | Algorithm::Hyperband)
    }

    /// The trials' final values as (trial, key), best first, ties by lower id: the
    /// observations TPE learns from (failed trials and NaN values left out).
    fn observations<'a>(&self, trials: &'a [Trial]) -> Vec<(&'a Trial, f64)> {
        // Finished, paused and stopped trials count with their last value (a pruned trial's
        // last intermediate value, as Optuna's TPE uses it); running ones do not: their
        // partial values would make the suggestion depend on timing.
        let mut obs: Vec<(&Trial, f64)> = trials
            .iter()
            .filter(|t| {
                matches!(
                    t.state,
                    TrialState::Succeeded | TrialState::Stopped | TrialState::Paused
                )
            })
            .filter_map(|t| {
                t.final_report()
                    .filter(|r| !r.value.is_nan())
                    .map(|r| (t, self.key(r.value)))
            })
            .collect();
        obs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.id.cmp(&b.0.id)));
        obs
    }

    fn new_trial(&self, trials: &[Trial]) -> Suggestion {
        let k = trials.len() as u64;
        let params = &self.spec.params;
        let plain_target = self.spec.max_resource.unwrap_or(0);
        match self.spec.algorithm {
            Algorithm::Grid => Suggestion::New {
                params: space::grid_point(params, k),
                bracket: 0,
                target: plain_target,
            },
            Algorithm::Random => Suggestion::New {
                params: space::sample_all(params, &mut rng_for(self.spec.seed, k)),
                bracket: 0,
                target: plain_target,
            },
            Algorithm::Tpe => {
                let mut rng = rng_for(self.spec.seed, k);
                let startup = tpe::n_startup(self.spec.trials);
                let obs = self.observations(trials);
                let params = if trials.len() < startup || obs.len() < 2 {
                    space::sample_all(params, &mut rng)
                } else {
                    let obs: Vec<(&Params, f64)> =
                        obs.iter().map(|(t, key)| (&t.params, *key)).collect();
                    tpe::suggest(params, &obs, &mut rng)
                };
                Suggestion::New {
                    params,
                    bracket: 0,
                    target: plain_target,
                }
            }
            Algorithm::Asha | Algorithm::Hyperband => {
                let bracket = asha::pick_bracket(&self.sizes, trials);
                let rungs = &self.rungs[bracket as usize];
                let target = if self.resumable {
                    rungs[0]
                } else {
                    *rungs.last().unwrap_or(&plain_target)
                };
                Suggestion::New {
                    params: space::sample_all(params, &mut rng_for(self.spec.seed, k)),
                    bracket,
                    target,
                }
            }
        }
    }
}

/// The RNG for the suggestion made when `created` trials exist: seeded through BLAKE3 by
/// (`seed`, `created`), so streams of nearby seeds and counts are unrelated.
pub(crate) fn rng_for(seed: u64, created: u64) -> SmallRng {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"ringleader.search.rng.v1");
    hasher.update(&seed.to_le_bytes());
    hasher.update(&created.to_le_bytes());
    let hash = hasher.finalize();
    let mut word = [0u8; 8];
    word.copy_from_slice(&hash.as_bytes()[..8]);
    SmallRng::seed_from_u64(u64::from_le_bytes(word))
}

#[cfg(test)]
mod tests;
