//! The elastic agreement's pure logic: after a re-form, which commit every rank restores
//! and which rank broadcasts it. Sans I/O: [`Agree`] asks for reductions over the new
//! generation's ranks and is fed their results, so the trainer (its collective) and a
//! Python rank (its own allreduce) drive the same rounds; [`agree_directly`] computes the
//! same outcome from every rank's holding at once, for tests and simulations.
//!
//! Protocol, run by every rank of the new generation (every step is a reduction over all
//! ranks, so all ranks take the same branches):
//! 1. `Max` of `[last generation (-1 for a joiner), steps reached]`. Only the ranks whose
//!    last generation is the newest and that hold a commit are *holders*: ranks that missed
//!    a generation may hold commits of an abandoned history at the same step numbers.
//! 2. The newest step every holder has: start from `c = ∞`; each round is a `Min` of each
//!    holder's newest commit at or before `c` (non-holders say ∞, a holder with none -1).
//!    A fixpoint is a step every holder has; each round lowers `c` to a step some holder
//!    has, so it ends within the commits held ([`AGREE_ROUNDS_MAX`] caps it). All ∞: no
//!    holder ([`Outcome::Fresh`]). A -1: no common commit; then the newest commit any holder
//!    has is taken instead (`Max`).
//! 3. `Min` of `[rank if it holds the step else ∞, 0 if it holds it else -1]`: the root is
//!    the lowest holder of the step; when some rank lacks it, the root broadcasts it.
//!
//! Invariant (property-tested): every rank ends with the same [`Outcome`], equal to
//! [`agree_directly`] of all holdings.

/// Most rounds of the search for the newest common commit (it needs at most as many as
/// there are distinct commits held across the ranks).
pub const AGREE_ROUNDS_MAX: usize = 64;

/// What one rank brings to the agreement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Holding {
    /// The generation it last restored or started in; `None` for a joiner (a new process).
    pub last_generation: Option<u64>,
    /// Steps it had reached (0 for a joiner).
    pub step_reached: u64,
    /// The steps of its in-memory commits, ascending.
    pub commits: Vec<u64>,
}

impl Holding {
    fn latest(&self) -> Option<u64> {
        self.commits.last().copied()
    }

    fn newest_at_or_before(&self, step: u64) -> Option<u64> {
        self.commits.iter().rev().find(|&&s| s <= step).copied()
    }
}

/// A reduction over every rank of the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

/// A reduction [`Agree`] needs: reduce `values` with `op` over every rank, then pass the
/// result to [`Agree::on_reduced`].
#[derive(Debug, Clone, PartialEq)]
pub struct Reduce {
    /// The reduction.
    pub op: ReduceOp,
    /// This rank's values.
    pub values: Vec<f64>,
}

/// What the ranks agreed on; the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No rank holds a commit: the durable checkpoint, else a fresh start.
    Fresh {
        /// The most steps any rank had reached.
        group_step: u64,
    },
    /// Restore the commit at `step`.
    Restore {
        /// The agreed commit's step.
        step: u64,
        /// The lowest rank holding it: it broadcasts when some rank lacks it.
        root: usize,
        /// Every rank holds it (no broadcast).
        everyone_holds: bool,
        /// The most steps any rank had reached.
        group_step: u64,
    },
}

/// Where [`Agree`] is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Maxes,
    Common { c: f64, rounds: usize },
    Newest,
    Who { step: u64 },
    Done,
}

/// One rank's side of the agreement (see the module doc).
#[derive(Debug, Clone)]
pub struct Agree {
    rank: usize,
    mine: Holding,
    holder: bool,
    group_step: u64,
    phase: Phase,
}

/// What comes after a reduction.
#[derive(Debug, Clone, PartialEq)]
pub enum Progress {
    /// Another reduction.
    Reduce(Reduce),
    /// The outcome.
    Done(Outcome),
}

impl Agree {
    /// Starts rank `rank`'s side; returns the first reduction.
    pub fn new(rank: usize, mine: Holding) -> (Agree, Reduce) {
        let last = mine.last_generation.map_or(-1.0, |g| g as f64);
        let first = Reduce {
            op: ReduceOp::Max,
            values: vec![last, mine.step_reached as f64],
        };
        let agree = Agree {
            rank,
            mine,
            holder: false,
            group_step: 0,
            phase: Phase::Maxes,
        };
        (agree, first)
    }

    /// Whether this rank holds the commit at `step` (as a holder).
    pub fn holds(&self, step: u64) -> bool {
        self.holder && self.mine.commits.contains(&step)
    }

    fn common_round(&self, c: f64) -> Reduce {
        let v = if !self.holder {
            f64::INFINITY
        } else if c.is_infinite() {
            self.mine.latest().map_or(-1.0, |s| s as f64)
        } else {
            self.mine
                .newest_at_or_before(c as u64)
                .map_or(-1.0, |s| s as f64)
        };
        Reduce {
            op: ReduceOp::Min,
            values: vec![v],
        }
    }

    fn newest_round(&mut self) -> Progress {
        self.phase = Phase::Newest;
        let latest = if self.holder {
            self.mine.latest()
        } else {
            None
        };
        Progress::Reduce(Reduce {
            op: ReduceOp::Max,
            values: vec![latest.map_or(-1.0, |s| s as f64)],
        })
    }

    fn who_round(&mut self, step: u64) -> Progress {
        self.phase = Phase::Who { step };
        let has = self.holds(step);
        Progress::Reduce(Reduce {
            op: ReduceOp::Min,
            values: vec![
                if has { self.rank as f64 } else { f64::INFINITY },
                if has { 0.0 } else { -1.0 },
            ],
        })
    }

    /// Feeds the result of the last reduction asked for.
    ///
    /// # Panics
    /// When called after [`Progress::Done`], or with fewer values than were asked for
    /// (a bug in the driver).
    pub fn on_reduced(&mut self, reduced: &[f64]) -> Progress {
        match self.phase {
            Phase::Maxes => {
                self.group_step = reduced[1] as u64;
                let last = self.mine.last_generation.map_or(-1.0, |g| g as f64);
                self.holder =
                    !self.mine.commits.is_empty() && reduced[0] >= 0.0 && last == reduced[0];
                let c = f64::INFINITY;
                self.phase = Phase::Common { c, rounds: 1 };
                Progress::Reduce(self.common_round(c))
            }
            Phase::Common { c, rounds } => {
                let n = reduced[0];
                if n.is_infinite() {
                    self.phase = Phase::Done;
                    return Progress::Done(Outcome::Fresh {
                        group_step: self.group_step,
                    });
                }
                if n < 0.0 || (n != c && rounds >= AGREE_ROUNDS_MAX) {
                    return self.newest_round();
                }
                if n == c {
                    return self.who_round(n as u64);
                }
                self.phase = Phase::Common {
                    c: n,
                    rounds: rounds + 1,
                };
                Progress::Reduce(self.common_round(n))
            }
            Phase::Newest => {
                let step = reduced[0].max(0.0) as u64;
                self.who_round(step)
            }
            Phase::Who { step } => {
                self.phase = Phase::Done;
                Progress::Done(Outcome::Restore {
                    step,
                    root: reduced[0] as usize,
                    everyone_holds: reduced[1] == 0.0,
                    group_step: self.group_step,
                })
            }
            Phase::Done => panic!("the agreement is over"),
        }
    }
}

/// The outcome of the agreement among ranks holding `holdings` (index = rank), computed
/// directly; [`Agree`] reaches the same through reductions.
pub fn agree_directly(holdings: &[Holding]) -> Outcome {
    let group_step = holdings.iter().map(|h| h.step_reached).max().unwrap_or(0);
    let newest_generation = holdings.iter().filter_map(|h| h.last_generation).max();
    let holders: Vec<&Holding> = holdings
        .iter()
        .filter(|h| {
            !h.commits.is_empty()
                && newest_generation.is_some()
                && h.last_generation == newest_generation
        })
        .collect();
    if holders.is_empty() {
        return Outcome::Fresh { group_step };
    }
    let common = holders[0]
        .commits
        .iter()
        .rev()
        .find(|s| holders.iter().all(|h| h.commits.contains(s)))
        .copied();
    let step =
        common.unwrap_or_else(|| holders.iter().filter_map(|h| h.latest()).max().unwrap_or(0));
    let is_holder = |h: &Holding| {
        !h.commits.is_empty()
            && h.last_generation.is_some()
            && h.last_generation == newest_generation
    };
    let has = |h: &Holding| is_holder(h) && h.commits.contains(&step);
    let root = holdings.iter().position(has).unwrap_or(usize::MAX);
    Outcome::Restore {
        step,
        root,
        everyone_holds: holdings.iter().all(has),
        group_step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs [`Agree`] on every rank with an in-memory allreduce.
    fn simulate(holdings: &[Holding]) -> Vec<Outcome> {
        let mut ranks = Vec::new();
        let mut asks = Vec::new();
        for (r, h) in holdings.iter().enumerate() {
            let (a, ask) = Agree::new(r, h.clone());
            ranks.push(a);
            asks.push(Progress::Reduce(ask));
        }
        for _ in 0..(AGREE_ROUNDS_MAX + 8) {
            if let Progress::Done(_) = asks[0] {
                break;
            }
            let reqs: Vec<&Reduce> = asks
                .iter()
                .map(|p| match p {
                    Progress::Reduce(r) => r,
                    Progress::Done(_) => panic!("ranks out of step"),
                })
                .collect();
            let op = reqs[0].op;
            let mut out = reqs[0].values.clone();
            for r in &reqs[1..] {
                assert_eq!(r.op, op);
                for (o, v) in out.iter_mut().zip(&r.values) {
                    *o = match op {
                        ReduceOp::Max => o.max(*v),
                        ReduceOp::Min => o.min(*v),
                    };
                }
            }
            asks = ranks.iter_mut().map(|a| a.on_reduced(&out)).collect();
        }
        asks.into_iter()
            .map(|p| match p {
                Progress::Done(o) => o,
                Progress::Reduce(_) => panic!("did not end"),
            })
            .collect()
    }

    fn holding() -> impl Strategy<Value = Holding> {
        (
            proptest::option::of(0u64..3),
            0u64..40,
            proptest::collection::btree_set(0u64..12, 0..5),
        )
            .prop_map(|(last_generation, step_reached, commits)| Holding {
                last_generation,
                step_reached,
                commits: commits.into_iter().collect(),
            })
    }

    proptest! {
        #[test]
        fn every_rank_reaches_the_direct_outcome(
            holdings in proptest::collection::vec(holding(), 1..6),
        ) {
            let want = agree_directly(&holdings);
            for got in simulate(&holdings) {
                prop_assert_eq!(got, want);
            }
        }
    }

    #[test]
    fn the_newest_common_commit_and_the_lowest_holder() {
        let h = |g: Option<u64>, c: &[u64]| Holding {
            last_generation: g,
            step_reached: c.last().copied().unwrap_or(0),
            commits: c.to_vec(),
        };
        let holdings = [h(Some(2), &[4, 8, 12]), h(Some(2), &[4, 8]), h(None, &[])];
        let want = Outcome::Restore {
            step: 8,
            root: 0,
            everyone_holds: false,
            group_step: 12,
        };
        assert_eq!(agree_directly(&holdings), want);
        assert_eq!(simulate(&holdings), vec![want; 3]);
        // A rank that missed a generation is not a holder.
        let stale = [h(Some(1), &[20]), h(Some(2), &[4])];
        assert!(matches!(
            agree_directly(&stale),
            Outcome::Restore {
                step: 4,
                root: 1,
                ..
            }
        ));
        assert_eq!(
            agree_directly(&[h(None, &[])]),
            Outcome::Fresh { group_step: 0 }
        );
    }
}
