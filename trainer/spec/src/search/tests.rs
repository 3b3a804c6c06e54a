use super::testing::{spec, Sim};
use super::*;

fn trial_with(id: u32, reports: &[(u32, f64)]) -> Trial {
    let mut t = Trial::new(id, Params::new(), 0, 0);
    t.state = TrialState::Succeeded;
    t.reports = reports
        .iter()
        .map(|&(resource, value)| Report { resource, value })
        .collect();
    t
}

#[test]
fn best_uses_each_trials_largest_resource_and_breaks_ties() {
    let s = spec("random", "min", "").searcher(true).unwrap();
    let trials = vec![
        // Best value 0.1 early, but 0.5 at its largest resource.
        trial_with(0, &[(1, 0.1), (2, 0.5)]),
        trial_with(1, &[(1, 0.3)]),
        trial_with(2, &[(3, 0.3)]),
        trial_with(3, &[(3, 0.3)]),
        trial_with(4, &[(3, f64::NAN)]),
        trial_with(5, &[]),
    ];
    let (t, v) = s.best(&trials).unwrap();
    // 0.3 ties between trials 1, 2, 3: larger resource wins, then lower id.
    assert_eq!((t.id, v), (2, 0.3));
    assert!(s.value_better(0.1, 0.2));
    assert!(!s.value_better(f64::NAN, 0.2));
    let max = spec("random", "max", "").searcher(true).unwrap();
    assert_eq!(max.best(&trials).unwrap().0.id, 0);
    assert!(s.best(&trials[5..]).is_none());
}

#[test]
fn random_is_reproducible_by_seed_and_differs_across_seeds() {
    let run = |seed: u64| {
        let text = format!("seed = {seed}");
        let mut sim = Sim::new(spec("random", "min", &text), true);
        sim.start_all();
        sim.trials
            .iter()
            .map(|t| t.params.clone())
            .collect::<Vec<_>>()
    };
    let a = run(1);
    assert_eq!(a.len(), 20);
    assert_eq!(a, run(1));
    assert_ne!(a, run(2));
    // Suggestions within one run differ too.
    assert_ne!(a[0], a[1]);
}

#[test]
fn suggest_is_stable_until_recorded_and_respects_max_parallel() {
    let s = spec("random", "min", "max_parallel = 2")
        .searcher(true)
        .unwrap();
    let mut trials = Vec::new();
    for id in 0..2 {
        let first = s.suggest(&trials);
        assert_eq!(first, s.suggest(&trials));
        let Suggestion::New {
            params,
            bracket,
            target,
        } = first
        else {
            panic!("expected a new trial, got {first:?}");
        };
        assert_eq!(target, 9);
        trials.push(Trial::new(id, params, bracket, target));
    }
    assert_eq!(s.suggest(&trials), Suggestion::Wait);
    trials[0].state = TrialState::Failed;
    assert!(matches!(s.suggest(&trials), Suggestion::New { .. }));
}

#[test]
fn grid_suggests_every_point_of_the_product_once_first_param_slowest() {
    // x, y: 5 grid points each; n: the integers 1..=4; c: 2 values.
    let s = spec("grid", "max", "trials = 100000")
        .searcher(false)
        .unwrap();
    assert_eq!(s.budget(), 5 * 5 * 4 * 2);
    let mut trials: Vec<Trial> = Vec::new();
    loop {
        match s.suggest(&trials) {
            Suggestion::New { params, .. } => {
                let mut t = Trial::new(trials.len() as u32, params, 0, 0);
                t.state = TrialState::Succeeded;
                trials.push(t);
            }
            Suggestion::Exhausted => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(trials.len(), 200);
    let points: std::collections::BTreeSet<String> =
        trials.iter().map(|t| format!("{:?}", t.params)).collect();
    assert_eq!(points.len(), 200, "every point once");
    // The first parameter changes every 5 * 4 * 2 = 40 trials, the last every trial.
    let changes = |name: &str| {
        trials
            .windows(2)
            .filter(|w| w[0].params[name] != w[1].params[name])
            .count()
    };
    assert_eq!(changes("x"), 4);
    assert_eq!(changes("c"), 199);
    assert_eq!(trials[0].params["x"], toml::Value::Float(0.0));
    assert_eq!(trials[199].params["x"], toml::Value::Float(1.0));
}

#[test]
fn plain_trials_run_to_their_target() {
    let s = spec("random", "min", "").searcher(true).unwrap();
    let mut t = Trial::new(0, Params::new(), 0, 9);
    t.state = TrialState::Running;
    t.reports.push(Report {
        resource: 8,
        value: 1.0,
    });
    let mut trials = vec![t];
    assert_eq!(s.on_report(&trials, 0, 8, 1.0), Decision::Continue);
    trials[0].reports.push(Report {
        resource: 9,
        value: 1.0,
    });
    assert_eq!(s.on_report(&trials, 0, 9, 1.0), Decision::Done);
    // Not yet appended: judged as if it were.
    trials[0].reports.pop();
    assert_eq!(s.on_report(&trials, 0, 9, 1.0), Decision::Done);
    assert_eq!(s.on_report(&trials, 7, 9, 1.0), Decision::Stop);
    // Target 0: the template's length, the node decides.
    trials[0].target = 0;
    assert_eq!(s.on_report(&trials, 0, 9, 1.0), Decision::Continue);
}

#[test]
fn rng_streams_depend_on_seed_and_count() {
    use rand::Rng;
    let draw = |seed, k| rng_for(seed, k).gen::<u64>();
    assert_eq!(draw(0, 0), draw(0, 0));
    assert_ne!(draw(0, 0), draw(0, 1));
    assert_ne!(draw(0, 0), draw(1, 0));
}
