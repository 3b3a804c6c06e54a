use std::collections::BTreeSet;

use super::*;
use crate::search::testing::{spec, Sim};
use crate::search::{Params, Report};

const RUNGS_1_3_9: &str = "trials = 27\nmin_resource = 1\nmax_resource = 9";

fn ids(trials: &[&Trial]) -> BTreeSet<u32> {
    trials.iter().map(|t| t.id).collect()
}

#[test]
fn asha_promotes_exactly_the_top_third_of_each_rung() {
    // Synchronous order: all 27 start together and report in id order; lower id is
    // better, so each rung's top third is known in advance.
    let mut sim = Sim::new(spec("asha", "min", RUNGS_1_3_9), true);
    assert_eq!(sim.searcher.rungs(0), vec![1, 3, 9]);
    sim.run(|t, _| t.id as f64);
    assert_eq!(sim.trials.len(), 27);
    assert_eq!(ids(&sim.reached(1)), (0..27).collect());
    assert_eq!(ids(&sim.reached(3)), (0..9).collect());
    assert_eq!(ids(&sim.reached(9)), (0..3).collect());
    for t in &sim.trials {
        let (state, promotions) = match t.id {
            0..=2 => (TrialState::Succeeded, 2),
            3..=8 => (TrialState::Stopped, 1),
            _ => (TrialState::Stopped, 0),
        };
        assert_eq!(
            (t.state, t.promotions),
            (state, promotions),
            "trial {}",
            t.id
        );
    }
    let (best, value) = sim.searcher.best(&sim.trials).unwrap();
    assert_eq!((best.id, value), (0, 0.0));
}

/// Quality of a trial in a shuffled order: a permutation of 0..27, 0 best (trial 13).
fn shuffled(id: u32) -> f64 {
    f64::from((id * 10 + 5) % 27)
}

#[test]
fn asha_promotes_every_rungs_final_top_and_the_best_trial_finishes() {
    let mut sim = Sim::new(
        spec("asha", "min", &format!("{RUNGS_1_3_9}\nmax_parallel = 5")),
        true,
    );
    sim.run(|t, r| shuffled(t.id) + 0.01 * f64::from(9 - r));
    let rungs = sim.searcher.rungs(0);
    for i in 0..rungs.len() - 1 {
        let ranking = sim.searcher.rung_ranking(&sim.trials, 0, rungs[i]);
        let top = ranking.len() / 3;
        let next = ids(&sim.reached(rungs[i + 1]));
        for (t, _) in &ranking[..top] {
            assert!(
                next.contains(&t.id),
                "trial {} of rung {i}'s top not promoted",
                t.id
            );
        }
        assert!(
            next.len() >= top && next.len() <= ranking.len() / 2,
            "rung {i}"
        );
    }
    for t in &sim.trials {
        let finished = t.last_resource() == Some(9);
        let expected = if finished {
            TrialState::Succeeded
        } else {
            TrialState::Stopped
        };
        assert_eq!(t.state, expected, "trial {}", t.id);
    }
    assert_eq!(sim.searcher.best(&sim.trials).unwrap().0.id, 13);
    assert!(sim.max_active <= 5);
}

#[test]
fn asha_stops_command_trials_below_the_rung_quantile() {
    let mut sim = Sim::new(spec("asha", "min", RUNGS_1_3_9), false);
    sim.run(|t, _| shuffled(t.id));
    assert!(sim
        .trials
        .iter()
        .all(|t| t.target == 9 && t.promotions == 0));
    let past_first = sim.reached(2).len();
    let past_second = sim.reached(4).len();
    let finished = sim.reached(9).len();
    assert!((5..=15).contains(&past_first), "{past_first}");
    assert!(
        past_second < past_first && finished == past_second,
        "{past_second}"
    );
    for t in &sim.trials {
        let expected = if t.last_resource() == Some(9) {
            TrialState::Succeeded
        } else {
            TrialState::Stopped
        };
        assert_eq!(t.state, expected, "trial {}", t.id);
    }
    let best = sim.trials.iter().find(|t| shuffled(t.id) == 0.0).unwrap();
    assert_eq!(best.state, TrialState::Succeeded);
}

#[test]
fn quantile_interpolates() {
    assert_eq!(quantile(&[1.0], 0.66), 1.0);
    assert_eq!(quantile(&[0.0, 3.0], 2.0 / 3.0), 2.0);
    assert_eq!(quantile(&[0.0, 1.0, 2.0, 3.0], 2.0 / 3.0), 2.0);
    assert_eq!(quantile(&[f64::NEG_INFINITY, 1.0], 0.75), 1.0);
}

#[test]
fn hyperband_bracket_sizes_and_first_rungs_follow_the_paper() {
    let s = spec(
        "hyperband",
        "max",
        "trials = 143\nmin_resource = 1\nmax_resource = 81",
    )
    .searcher(true)
    .unwrap();
    assert_eq!(s.brackets(), 5);
    assert_eq!(s.bracket_sizes(), vec![81, 34, 15, 8, 5]);
    let first: Vec<u32> = (0..5).map(|b| s.rungs(b)[0]).collect();
    assert_eq!(first, vec![1, 3, 9, 27, 81]);
    assert_eq!(s.rungs(0), vec![1, 3, 9, 27, 81]);
    assert_eq!(s.rungs(3), vec![27, 81]);
    assert_eq!(s.rungs(4), vec![81]);
    assert!(s.rungs(5).is_empty());
    // A max that is not a power: the last rung is max itself.
    let s = spec("hyperband", "max", "min_resource = 2\nmax_resource = 100")
        .searcher(true)
        .unwrap();
    assert_eq!(s.rungs(0), vec![2, 6, 18, 54, 100]);
    assert_eq!(s.rungs(3), vec![54, 100]);
    let asha = spec("asha", "max", "max_resource = 10")
        .searcher(true)
        .unwrap();
    assert_eq!((asha.brackets(), asha.rungs(0)), (1, vec![1, 3, 9, 10]));
}

#[test]
fn hyperband_spreads_new_trials_by_bracket_size() {
    let s = spec(
        "hyperband",
        "max",
        "trials = 143\nmin_resource = 1\nmax_resource = 81",
    )
    .searcher(true)
    .unwrap();
    let sizes = s.bracket_sizes();
    let mut trials = Vec::new();
    let mut counts = [0u32; 5];
    while let Suggestion::New {
        params,
        bracket,
        target,
    } = s.suggest(&trials)
    {
        assert_eq!(target, s.rungs(bracket)[0]);
        counts[bracket as usize] += 1;
        trials.push(Trial::new(trials.len() as u32, params, bracket, target));
        // Every prefix is within about one trial of the proportions.
        let k = trials.len() as f64;
        for b in 0..5 {
            let ideal = k * f64::from(sizes[b]) / 143.0;
            assert!(
                (f64::from(counts[b]) - ideal).abs() < 1.1,
                "bracket {b} after {k}"
            );
        }
    }
    assert_eq!(counts.to_vec(), sizes);
    // Command trials all target max_resource.
    let s = s.spec().searcher(false).unwrap();
    let Suggestion::New { target, .. } = s.suggest(&trials[..3]) else {
        panic!("expected a new trial");
    };
    assert_eq!(target, 81);
}

#[test]
fn hyperband_compares_trials_within_their_bracket_only() {
    let s = spec(
        "hyperband",
        "min",
        "trials = 50\nmin_resource = 1\nmax_resource = 27",
    )
    .searcher(true)
    .unwrap();
    assert_eq!(s.rungs(1), vec![3, 9, 27]);
    let trial = |id: u32, bracket: u32, value: f64, state: TrialState| Trial {
        id,
        params: Params::new(),
        bracket,
        state,
        target: 3,
        reports: vec![Report { resource: 3, value }],
        promotions: 0,
    };
    let mut trials: Vec<Trial> = (0..6)
        .map(|id| trial(id, 0, 0.0, TrialState::Running))
        .collect();
    trials.push(trial(6, 1, 1.0, TrialState::Paused));
    trials.push(trial(7, 1, 2.0, TrialState::Paused));
    trials.push(trial(8, 1, 0.5, TrialState::Running));
    // Best of bracket 1's three at rung 3, though bracket 0 has six better values there.
    assert_eq!(
        s.on_report(&trials, 8, 3, 0.5),
        Decision::Promote { target: 9 }
    );
    trials[8].reports[0].value = 1.5;
    assert_eq!(s.on_report(&trials, 8, 3, 1.5), Decision::Pause);
    // Now trial 6 leads bracket 1's rung: suggest promotes it (bracket 0's trials are
    // running, nothing to promote there).
    trials[8].state = TrialState::Paused;
    assert_eq!(
        s.suggest(&trials),
        Suggestion::Promote {
            trial: 6,
            target: 9
        }
    );
}
