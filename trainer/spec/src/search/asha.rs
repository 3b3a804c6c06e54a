//! ASHA (asynchronous successive halving, Li et al. 2020) and Hyperband over ASHA brackets
//! (Li et al. 2018, and the asynchronous variant of the 2020 paper).
//!
//! A bracket's rungs are `r_0·η^i` for `i = 0, 1, ...` while below `max_resource`, then
//! `max_resource` itself. A trial's value at a rung is its first report at or beyond the
//! rung's resource; `n_i` counts the trials of the bracket that have such a value (also those
//! that have since moved on). Rung comparisons are only ever among trials of one bracket.
//!
//! **Resumable trials** (train trials, and command trials with `resumable = true`) follow the
//! paper: a trial trains to its rung and is promoted at once if it is in the top `⌊n_i/η⌋` of
//! the rung's values, else it pauses (keeping its checkpoint); whenever a slot frees,
//! [`Searcher::suggest`] first promotes a paused trial that has entered its rung's top
//! `⌊n_i/η⌋` since (from the highest rung down, the best first), and only then starts a new
//! trial at the bottom rung.
//!
//! **Non-resumable trials** (other command trials) cannot pause, so ASHA becomes a stopping
//! rule in the spirit of Ray Tune's asynchronous Hyperband: every trial targets `max_resource`;
//! when its reports first reach a rung below the top, it is stopped if its value is strictly
//! worse than the `(1 − 1/η)` quantile (linear interpolation between order statistics) of the
//! rung's values recorded so far, its own included. About `1/η` of each rung goes on; the first
//! trial at a rung always goes on, and the best value so far always does.
//!
//! **Hyperband**: `s_max = ⌊log_η(max/min)⌋`; bracket `b` in `0..=s_max` starts at rung
//! resource `min·η^b` (bracket 0 the most exploratory). Hyperband's bracket `s = s_max − b`
//! has `n = ⌈(s_max + 1)/(s + 1)·η^s⌉` configurations; a new trial goes to the bracket
//! with the smallest `(created_b + ½) / n_b` (ties to the most exploratory), so every prefix
//! follows the proportions `n_b` to about one trial and after `Σ n_b` trials each bracket
//! holds exactly `n_b`.

use super::{Decision, Searcher, Suggestion, Trial, TrialState};

/// The rungs and Hyperband sizes of a search's brackets.
pub(crate) struct Brackets {
    /// Each bracket's rung resources, ascending, the last `max_resource`.
    pub rungs: Vec<Vec<u32>>,
    /// Each bracket's Hyperband size `n_b` (ASHA: one bracket, size 1).
    pub sizes: Vec<u32>,
}

impl Brackets {
    /// Brackets for resources `min..=max` and reduction factor `eta` (≥ 2): one for ASHA,
    /// `s_max + 1` for Hyperband.
    pub(crate) fn new(min: u32, max: u32, eta: u32, hyperband: bool) -> Brackets {
        let (min, max, eta) = (u64::from(min.max(1)), u64::from(max), u64::from(eta.max(2)));
        // s_max: the largest s with min·η^s <= max.
        let mut s_max = 0u32;
        let mut r = min;
        while r * eta <= max {
            r *= eta;
            s_max += 1;
        }
        let count = if hyperband { s_max + 1 } else { 1 };
        let mut rungs = Vec::with_capacity(count as usize);
        let mut sizes = Vec::with_capacity(count as usize);
        for b in 0..count {
            let mut bracket = Vec::new();
            let mut r = min * eta.pow(b);
            while r < max {
                bracket.push(r as u32);
                r *= eta;
            }
            bracket.push(max as u32);
            rungs.push(bracket);
            let size = if hyperband {
                let s = s_max - b;
                let num = u64::from(s_max + 1) * eta.pow(s);
                num.div_ceil(u64::from(s + 1))
            } else {
                1
            };
            sizes.push(size.min(u64::from(u32::MAX)) as u32);
        }
        Brackets { rungs, sizes }
    }
}

/// The bracket for a new trial: the smallest `(created_b + ½) / n_b` (Sainte-Laguë's
/// divisors), ties to the lowest bracket.
///
/// Plain `created_b / n_b` would give every bracket one trial before any gets a second, and
/// `(created_b + 1) / n_b` (D'Hondt) front-loads the big brackets; the half step keeps
/// every prefix of the sequence close to the proportions `n_b / Σ n` (within 1.07 trials for
/// Hyperband's 81/34/15/8/5), so a search with fewer trials than `Σ n_b` is still spread
/// like Hyperband's. A bracket that has its `n_b` gets no more until all have theirs.
pub(crate) fn pick_bracket(sizes: &[u32], trials: &[Trial]) -> u32 {
    let mut created = vec![0u64; sizes.len()];
    for t in trials {
        if let Some(c) = created.get_mut(t.bracket as usize) {
            *c += 1;
        }
    }
    let mut best = 0usize;
    for b in 1..sizes.len() {
        // (2·created[b] + 1)/sizes[b] < (2·created[best] + 1)/sizes[best], in integers.
        let due = |b: usize| 2 * created[b] + 1;
        if due(b) * u64::from(sizes[best]) < due(best) * u64::from(sizes[b]) {
            best = b;
        }
    }
    best as u32
}

/// The index of the highest rung at or below `resource`.
fn rung_index(rungs: &[u32], resource: u32) -> Option<usize> {
    rungs.iter().rposition(|&r| r <= resource)
}

/// The `q` quantile of ascending `keys` (non-empty), interpolating linearly between order
/// statistics.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    let frac = pos - lo as f64;
    let (a, b) = (sorted[lo], sorted[hi]);
    if frac == 0.0 || a == b {
        a
    } else if a.is_finite() && b.is_finite() {
        a + (b - a) * frac
    } else if frac < 0.5 {
        a
    } else {
        b
    }
}

impl Searcher {
    fn eta(&self) -> usize {
        self.spec.reduction_factor.max(2) as usize
    }

    /// The trials of `bracket` with a value at rung resource `rung`, with their keys, best
    /// first (ties to the lower id).
    fn rung_ranking<'a>(
        &self,
        trials: &'a [Trial],
        bracket: u32,
        rung: u32,
    ) -> Vec<(&'a Trial, f64)> {
        let mut ranking: Vec<(&Trial, f64)> = trials
            .iter()
            .filter(|t| t.bracket == bracket)
            .filter_map(|t| {
                t.first_report_at_least(rung)
                    .map(|r| (t, self.key(r.value)))
            })
            .collect();
        ranking.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.id.cmp(&b.0.id)));
        ranking
    }

    /// A paused trial to promote: from the highest rung below the top down to rung 0, the
    /// best paused trial that completed that rung and is in its top `⌊n_i/η⌋`.
    pub(super) fn promotion(&self, trials: &[Trial]) -> Option<Suggestion> {
        for (b, rungs) in self.rungs.iter().enumerate() {
            for i in (0..rungs.len().saturating_sub(1)).rev() {
                let ranking = self.rung_ranking(trials, b as u32, rungs[i]);
                let top = ranking.len() / self.eta();
                let promotable = ranking[..top].iter().find(|(t, _)| {
                    t.state == TrialState::Paused
                        && t.last_resource().and_then(|r| rung_index(rungs, r)) == Some(i)
                });
                if let Some((t, _)) = promotable {
                    return Some(Suggestion::Promote {
                        trial: t.id,
                        target: rungs[i + 1],
                    });
                }
            }
        }
        None
    }

    /// ASHA with resumable trials: continue below the target; at a rung, promote if in the
    /// rung's top `⌊n_i/η⌋` now, else pause; done at the top rung.
    pub(super) fn asha_on_report(&self, trials: &[Trial], trial: u32, resource: u32) -> Decision {
        let t = &trials[trial as usize];
        if resource < t.target {
            return Decision::Continue;
        }
        let Some(rungs) = self.rungs.get(t.bracket as usize) else {
            return self.past_top(resource);
        };
        let Some(i) = rung_index(rungs, resource) else {
            return Decision::Continue;
        };
        if i + 1 == rungs.len() {
            return Decision::Done;
        }
        let ranking = self.rung_ranking(trials, t.bracket, rungs[i]);
        let top = ranking.len() / self.eta();
        if ranking[..top].iter().any(|(u, _)| u.id == trial) {
            Decision::Promote {
                target: rungs[i + 1],
            }
        } else {
            Decision::Pause
        }
    }

    /// ASHA with non-resumable trials: stop a trial whose value at a rung it just reached is
    /// strictly worse than the rung's `(1 − 1/η)` quantile; done at the top rung.
    pub(super) fn asha_stop_on_report(
        &self,
        trials: &[Trial],
        trial: u32,
        resource: u32,
    ) -> Decision {
        let t = &trials[trial as usize];
        let Some(rungs) = self.rungs.get(t.bracket as usize) else {
            return self.past_top(resource);
        };
        let top = *rungs.last().expect("a bracket has a rung");
        if resource >= top || (t.target > 0 && resource >= t.target) {
            return Decision::Done;
        }
        // The report just appended is the last one; rungs crossed since the one before.
        let before = t.reports[..t.reports.len().saturating_sub(1)]
            .iter()
            .map(|r| r.resource)
            .max();
        let q = 1.0 - 1.0 / self.eta() as f64;
        for &rung in &rungs[..rungs.len() - 1] {
            if rung > resource || before.is_some_and(|b| b >= rung) {
                continue;
            }
            let Some(own) = t.first_report_at_least(rung) else {
                continue;
            };
            let mut keys: Vec<f64> = self
                .rung_ranking(trials, t.bracket, rung)
                .into_iter()
                .map(|(_, key)| key)
                .collect();
            keys.reverse();
            if self.key(own.value) < quantile(&keys, q) {
                return Decision::Stop;
            }
        }
        Decision::Continue
    }

    /// A trial in a bracket that does not exist (a corrupt table): run to `max_resource`.
    fn past_top(&self, resource: u32) -> Decision {
        match self.spec.max_resource {
            Some(max) if resource >= max => Decision::Done,
            _ => Decision::Continue,
        }
    }
}

#[cfg(test)]
mod tests;
