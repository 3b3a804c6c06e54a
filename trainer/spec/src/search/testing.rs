//! Test harness: drives a [`Searcher`] over a local trial table the way the node does.

use super::{Decision, SearchSpec, Searcher, Suggestion, Trial, TrialState};

/// The `[search]` table the tests start from; `extra` (TOML) adds or replaces keys.
const BASE: &str = r#"
trials = 20
metric = "loss"
max_resource = 9
[[params]]
name = "x"
type = "double"
min = 0
max = 1
[[params]]
name = "y"
type = "double"
min = 1e-4
max = 1
scale = "log"
[[params]]
name = "n"
type = "integer"
min = 1
max = 4
[[params]]
name = "c"
type = "categorical"
values = ["a", "b"]
"#;

/// A valid spec with this algorithm and direction, `extra` overriding keys.
pub(crate) fn spec(algorithm: &str, direction: &str, extra: &str) -> SearchSpec {
    let mut table: toml::Table = toml::from_str(BASE).expect("base table");
    table.insert("algorithm".into(), algorithm.into());
    table.insert("direction".into(), direction.into());
    let extra: toml::Table = toml::from_str(extra).expect("extra keys");
    table.extend(extra);
    SearchSpec::from_table(&table).expect("valid test spec")
}

/// A searcher and the trial table the node would keep for it.
pub(crate) struct Sim {
    pub searcher: Searcher,
    pub trials: Vec<Trial>,
    /// Whether `suggest` has answered `Exhausted`.
    pub exhausted: bool,
    /// Most trials active at once.
    pub max_active: usize,
}

impl Sim {
    pub(crate) fn new(spec: SearchSpec, resumable: bool) -> Sim {
        Sim {
            searcher: spec.searcher(resumable).expect("searcher"),
            trials: Vec::new(),
            exhausted: false,
            max_active: 0,
        }
    }

    /// Asks for one suggestion and applies it (a new trial starts running at once).
    pub(crate) fn start_one(&mut self) -> Suggestion {
        let s = self.searcher.suggest(&self.trials);
        match &s {
            Suggestion::New {
                params,
                bracket,
                target,
            } => {
                let mut t = Trial::new(self.trials.len() as u32, params.clone(), *bracket, *target);
                t.state = TrialState::Running;
                self.trials.push(t);
            }
            Suggestion::Promote { trial, target } => {
                let t = &mut self.trials[*trial as usize];
                assert_eq!(
                    t.state,
                    TrialState::Paused,
                    "promoted trial {trial} not paused"
                );
                assert!(*target > t.target);
                t.state = TrialState::Running;
                t.target = *target;
                t.promotions += 1;
            }
            Suggestion::Wait => {}
            Suggestion::Exhausted => self.exhausted = true,
        }
        let active = self.trials.iter().filter(|t| t.state.is_active()).count();
        self.max_active = self.max_active.max(active);
        s
    }

    /// Applies suggestions until `Wait` or `Exhausted`.
    pub(crate) fn start_all(&mut self) {
        while matches!(
            self.start_one(),
            Suggestion::New { .. } | Suggestion::Promote { .. }
        ) {}
    }

    /// Records a report and applies the searcher's decision.
    pub(crate) fn report(&mut self, id: u32, resource: u32, value: f64) -> Decision {
        let t = &mut self.trials[id as usize];
        t.reports.push(super::Report { resource, value });
        let d = self.searcher.on_report(&self.trials, id, resource, value);
        let t = &mut self.trials[id as usize];
        match d {
            Decision::Continue => {}
            Decision::Stop => t.state = TrialState::Stopped,
            Decision::Pause => t.state = TrialState::Paused,
            Decision::Promote { target } => {
                assert!(target > t.target);
                t.target = target;
                t.promotions += 1;
            }
            Decision::Done => t.state = TrialState::Succeeded,
        }
        d
    }

    /// Runs the search to its end. Each running trial advances one epoch per tick, the one
    /// furthest behind first (ties to the lower id), reporting `value(trial, epoch)`; at the
    /// end the paused trials are stopped, as the node does on `Exhausted`.
    pub(crate) fn run(&mut self, value: impl Fn(&Trial, u32) -> f64) {
        for _ in 0..1_000_000 {
            self.start_all();
            let next = self
                .trials
                .iter()
                .filter(|t| t.state == TrialState::Running)
                .min_by_key(|t| (t.last_resource().unwrap_or(0), t.id));
            let Some(t) = next else {
                assert!(self.exhausted, "the searcher waits with nothing running");
                for t in &mut self.trials {
                    if t.state == TrialState::Paused {
                        t.state = TrialState::Stopped;
                    }
                }
                return;
            };
            let resource = t.last_resource().unwrap_or(0) + 1;
            let v = value(t, resource);
            self.report(t.id, resource, v);
        }
        panic!("the search did not end");
    }

    /// The trials that reported at `resource` or beyond.
    pub(crate) fn reached(&self, resource: u32) -> Vec<&Trial> {
        self.trials
            .iter()
            .filter(|t| t.last_resource().is_some_and(|r| r >= resource))
            .collect()
    }
}
