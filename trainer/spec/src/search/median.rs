//! The median stopping rule (Golovin et al. 2017, Google Vizier) for grid, random and TPE
//! searches, and their plain run-to-target rule.
//!
//! On a report at resource `s ≥ min_resource`, a trial is stopped if its best value so far
//! is strictly worse than the median of the other trials' running averages at `s` (each the
//! mean of that trial's reports at resources up to `s`), counting only trials that have
//! reported at `s` or beyond, and only once there are at least [`MEDIAN_PEERS_MIN`] of them.
//! Vizier compares with completed trials; we compare with every other trial that got as far
//! (running, stopped or failed), which lets the rule act early in a search whose trials all
//! run in parallel.

use super::{Decision, Searcher, Stopping, Trial};

/// Fewest peers (other trials with reports at the resource) before the median rule stops
/// anything.
pub const MEDIAN_PEERS_MIN: usize = 3;

impl Searcher {
    /// Grid, random and TPE: done at the target (when it is not 0), else the median rule
    /// when enabled, else continue.
    pub(super) fn median_on_report(&self, trials: &[Trial], trial: u32, resource: u32) -> Decision {
        let t = &trials[trial as usize];
        if t.target > 0 && resource >= t.target {
            return Decision::Done;
        }
        if self.spec.stopping == Stopping::Median
            && resource >= self.spec.min_resource
            && self.below_median(trials, t, resource)
        {
            return Decision::Stop;
        }
        Decision::Continue
    }

    fn below_median(&self, trials: &[Trial], t: &Trial, resource: u32) -> bool {
        let best = t
            .reports
            .iter()
            .filter(|r| r.resource <= resource)
            .map(|r| self.key(r.value))
            .fold(f64::NEG_INFINITY, f64::max);
        let mut peers: Vec<f64> = trials
            .iter()
            .filter(|u| u.id != t.id && u.reports.iter().any(|r| r.resource >= resource))
            .filter_map(|u| {
                let values: Vec<f64> = u
                    .reports
                    .iter()
                    .filter(|r| r.resource <= resource && !r.value.is_nan())
                    .map(|r| r.value)
                    .collect();
                (!values.is_empty())
                    .then(|| self.key(values.iter().sum::<f64>() / values.len() as f64))
            })
            .collect();
        if peers.len() < MEDIAN_PEERS_MIN {
            return false;
        }
        peers.sort_by(f64::total_cmp);
        let mid = peers.len() / 2;
        let median = if peers.len() % 2 == 1 {
            peers[mid]
        } else {
            (peers[mid - 1] + peers[mid]) / 2.0
        };
        best < median
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::testing::spec;
    use crate::search::{Params, Report, TrialState};

    fn trial(id: u32, values: &[f64]) -> Trial {
        Trial {
            id,
            params: Params::new(),
            bracket: 0,
            state: TrialState::Running,
            target: 10,
            reports: values
                .iter()
                .enumerate()
                .map(|(i, &value)| Report {
                    resource: i as u32 + 1,
                    value,
                })
                .collect(),
            promotions: 0,
        }
    }

    fn searcher() -> Searcher {
        spec(
            "random",
            "max",
            "stopping = \"median\"\nmax_resource = 10\nmin_resource = 2",
        )
        .searcher(true)
        .unwrap()
    }

    #[test]
    fn median_rule_stops_a_bad_trial_and_keeps_a_good_one() {
        let s = searcher();
        let mut trials = vec![
            trial(0, &[0.5, 0.6, 0.7]),
            trial(1, &[0.4, 0.6, 0.8]),
            trial(2, &[0.6, 0.7, 0.7]),
            // Bad: best 0.3, below every running average.
            trial(3, &[0.1, 0.3]),
            // Good: best 0.8 at resource 2.
            trial(4, &[0.2, 0.8]),
        ];
        assert_eq!(s.on_report(&trials, 3, 2, 0.3), Decision::Stop);
        assert_eq!(s.on_report(&trials, 4, 2, 0.8), Decision::Continue);
        // Before min_resource the rule waits.
        trials[3].reports.truncate(1);
        assert_eq!(s.on_report(&trials, 3, 1, 0.1), Decision::Continue);
        // Trial 2 at resource 2 (best 0.7, peers' averages 0.55, 0.5, 0.5): fine when
        // maximising, stopped when minimising.
        trials[2].reports.truncate(2);
        assert_eq!(s.on_report(&trials, 2, 2, 0.7), Decision::Continue);
        let min = spec("random", "min", "stopping = \"median\"\nmax_resource = 10")
            .searcher(true)
            .unwrap();
        assert_eq!(min.on_report(&trials, 2, 2, 0.7), Decision::Stop);
        // Without the rule nothing stops before the target; at the target, done.
        let plain = spec("random", "max", "max_resource = 10")
            .searcher(true)
            .unwrap();
        assert_eq!(plain.on_report(&trials, 4, 2, 0.8), Decision::Continue);
        trials[4].reports.push(Report {
            resource: 10,
            value: 0.0,
        });
        assert_eq!(s.on_report(&trials, 4, 10, 0.0), Decision::Done);
    }

    #[test]
    fn median_rule_waits_for_three_peers() {
        let s = searcher();
        let mut trials = vec![
            trial(0, &[0.9, 0.9]),
            trial(1, &[0.9, 0.9]),
            // Only one report: not a peer at resource 2.
            trial(2, &[0.9]),
            trial(3, &[0.1, 0.1]),
        ];
        assert_eq!(s.on_report(&trials, 3, 2, 0.1), Decision::Continue);
        trials[2].reports.push(Report {
            resource: 2,
            value: 0.9,
        });
        assert_eq!(s.on_report(&trials, 3, 2, 0.1), Decision::Stop);
    }
}
