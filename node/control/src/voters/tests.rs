//! Tests of `voters` (a sibling file: the module is long enough without them).

use proptest::prelude::*;

use super::*;

type Id = u64;

struct World {
    leader: Id,
    voters: BTreeSet<Id>,
    learners: BTreeSet<Id>,
    members: BTreeMap<Id, MemberView>,
    now_ms: u64,
    config: VoterConfig,
}

impl World {
    /// A cluster of one node (the leader, id 1) that has just bootstrapped.
    fn bootstrapped() -> World {
        let mut w = World {
            leader: 1,
            voters: [1].into(),
            learners: BTreeSet::new(),
            members: BTreeMap::new(),
            now_ms: 100_000,
            config: VoterConfig::for_test(),
        };
        w.set(1, Health::Alive, 0);
        w
    }

    fn set(&mut self, id: Id, health: Health, since_ms: u64) {
        self.members.insert(id, MemberView { health, since_ms });
    }

    fn input(&self) -> Input<'_, Id> {
        Input {
            leader: &self.leader,
            voters: &self.voters,
            learners: &self.learners,
            members: &self.members,
            now_ms: self.now_ms,
        }
    }

    fn next(&self) -> Option<Change<Id>> {
        next_change(&self.input(), &self.config)
    }

    fn plan(&self) -> Vec<Change<Id>> {
        plan(&self.input(), &self.config)
    }

    /// Applies changes one at a time until none is left, checking the invariants of
    /// each step; returns them.
    fn settle(&mut self) -> Vec<Change<Id>> {
        let mut done = Vec::new();
        while let Some(c) = self.next() {
            assert!(done.len() < 100, "no convergence: {done:?}");
            self.settle_one(c.clone());
            done.push(c);
        }
        done
    }

    /// Applies one change as Raft would, checking it is legal.
    fn settle_one(&mut self, c: Change<Id>) {
        match &c {
            Change::AddLearners(ids) => {
                for id in ids {
                    assert!(self.learners.insert(*id));
                }
            }
            Change::Promote(id) => {
                assert!(self.learners.remove(id));
                self.voters.insert(*id);
            }
            Change::PromotePair(a, b) => {
                assert_ne!(a, b);
                for id in [a, b] {
                    assert!(self.learners.remove(id));
                    self.voters.insert(*id);
                }
            }
            Change::Demote(id) => {
                assert_ne!(*id, self.leader);
                assert!(self.voters.remove(id));
                self.learners.insert(*id);
            }
            Change::Remove(id) => {
                assert_ne!(*id, self.leader);
                assert!(self.voters.remove(id) || self.learners.remove(id));
            }
        }
        assert!(self.voters.is_disjoint(&self.learners));
    }
}

use Change::*;

#[test]
fn bootstrap_alone_needs_nothing() {
    let w = World::bootstrapped();
    assert_eq!(w.next(), None);
}

#[test]
fn growth_one_two_three_members() {
    let mut w = World::bootstrapped();
    w.set(2, Health::Alive, 10);
    // Two members: the second learns but does not vote (an even count adds nothing).
    assert_eq!(w.settle(), [AddLearners([2].into())]);
    assert_eq!(w.voters, [1].into());
    w.set(3, Health::Alive, 20);
    // Three: the new member learns, then both learners are promoted in one change (never
    // two voters, where losing either stops every write).
    assert_eq!(w.settle(), [AddLearners([3].into()), PromotePair(2, 3)]);
    assert_eq!(w.voters, [1, 2, 3].into());
    w.set(4, Health::Alive, 30);
    assert_eq!(w.settle(), [AddLearners([4].into())]);
    assert_eq!(w.voters.len(), 3);
}

#[test]
fn a_booting_cluster_learns_in_a_few_changes() {
    let mut w = World::bootstrapped();
    for id in 2..=128 {
        w.set(id, Health::Alive, 10);
    }
    let steps = w.settle();
    let added: Vec<usize> = steps
        .iter()
        .filter_map(|c| match c {
            AddLearners(ids) => Some(ids.len()),
            _ => None,
        })
        .collect();
    assert_eq!(added, [32, 32, 32, 31], "{steps:?}");
    assert_eq!(w.voters.len() + w.learners.len(), 128);
}

#[test]
fn seven_members_give_five_voters() {
    let mut w = World::bootstrapped();
    for id in 2..=6 {
        w.set(id, Health::Alive, id * 10);
    }
    w.settle();
    assert_eq!(w.voters, [1, 2, 3].into());
    w.set(7, Health::Alive, 70);
    let steps = w.settle();
    assert_eq!(steps, [PromotePair(4, 5), AddLearners([7].into())]);
    assert_eq!(w.voters, [1, 2, 3, 4, 5].into());
    assert_eq!(w.learners, [6, 7].into());
}

#[test]
fn shrinking_below_seven_demotes_to_three_newest_first() {
    let mut w = World::bootstrapped();
    for id in 2..=7 {
        w.set(id, Health::Alive, id * 10);
    }
    w.settle();
    assert_eq!(w.voters.len(), 5);
    w.set(7, Health::Left, 200);
    // 7 left (a learner): removed; six members: target 3; voters 5 and 4 are demoted.
    assert_eq!(w.settle(), [Remove(7), Demote(5), Demote(4)]);
    assert_eq!(w.voters, [1, 2, 3].into());
}

#[test]
fn dead_voter_replaced_after_grace_not_before() {
    let mut w = World::bootstrapped();
    for id in 2..=4 {
        w.set(id, Health::Alive, id * 10);
    }
    w.settle();
    assert_eq!(
        (w.voters.clone(), w.learners.clone()),
        ([1, 2, 3].into(), [4].into())
    );
    w.set(3, Health::Suspect, w.now_ms);
    assert_eq!(w.next(), None, "suspect voters are kept");
    w.set(3, Health::Dead, w.now_ms);
    w.now_ms += w.config.dead_grace_ms - 1;
    assert_eq!(w.next(), None, "within grace");
    w.now_ms += 1;
    assert_eq!(w.settle(), [Remove(3), Promote(4)]);
    assert_eq!(w.voters, [1, 2, 4].into());
}

#[test]
fn left_voter_removed_at_once() {
    let mut w = World::bootstrapped();
    for id in 2..=4 {
        w.set(id, Health::Alive, id * 10);
    }
    w.settle();
    w.set(2, Health::Left, w.now_ms);
    assert_eq!(w.next(), Some(Remove(2)));
    assert_eq!(w.plan(), [Remove(2), Promote(4)]);
}

#[test]
fn leader_never_removed_or_demoted() {
    let mut w = World::bootstrapped();
    w.set(1, Health::Left, 0); // a stale view of itself
    w.now_ms = u64::MAX;
    assert_eq!(w.next(), None);
    let mut w = World::bootstrapped();
    w.voters = [1, 2, 3, 4, 5].into();
    for id in 2..=5 {
        w.set(id, Health::Alive, 5);
    }
    // Target 3 of 5 members: two demoted, never the leader.
    let steps = w.settle();
    assert_eq!(steps.len(), 2);
    assert!(w.voters.contains(&1));
}

#[test]
fn no_promotion_without_an_alive_majority() {
    let mut w = World::bootstrapped();
    // Eight members want five voters, but voters 2 and 3 are suspect: promoting any
    // learner would give 2 alive of 4 voters, so nothing is proposed.
    w.voters = [1, 2, 3].into();
    w.learners = (4..=8).collect();
    w.set(2, Health::Suspect, 0);
    w.set(3, Health::Suspect, 0);
    for id in 4..=8 {
        w.set(id, Health::Alive, 0);
    }
    assert_eq!(w.next(), None);
    // Once 2 is back, 4 and 5 are promoted together (4 alive of 5).
    w.set(2, Health::Alive, 1);
    assert_eq!(w.plan(), [PromotePair(4, 5)]);
}

#[test]
fn demote_keeps_alive_majority() {
    let mut w = World::bootstrapped();
    // Five voters, two suspect, cluster of 5 members: target 3. Demoting an alive voter
    // would leave 2 alive of 4: only suspect ones are demoted.
    w.voters = [1, 2, 3, 4, 5].into();
    w.set(2, Health::Alive, 0);
    w.set(3, Health::Alive, 0);
    w.set(4, Health::Suspect, 50);
    w.set(5, Health::Suspect, 60);
    assert_eq!(w.settle(), [Demote(5), Demote(4)]);
    assert_eq!(w.voters, [1, 2, 3].into());
}

#[test]
fn unknown_members_are_neither_promoted_nor_removed() {
    let mut w = World::bootstrapped();
    w.voters = [1, 2, 3].into();
    w.learners = [9].into();
    // Empty view after a restart (only the leader knows itself).
    assert_eq!(w.next(), None);
}

#[test]
fn two_member_cluster_survives_learner_death() {
    let mut w = World::bootstrapped();
    w.set(2, Health::Alive, 10);
    w.settle();
    w.set(2, Health::Dead, w.now_ms);
    w.now_ms += w.config.dead_grace_ms;
    assert_eq!(w.settle(), [Remove(2)]);
    assert_eq!(w.voters, [1].into());
}

#[test]
fn deterministic_under_equal_since() {
    let mut a = World::bootstrapped();
    for id in [5, 3, 4, 2] {
        a.set(id, Health::Alive, 7);
    }
    let mut b = World::bootstrapped();
    for id in [2, 3, 4, 5] {
        b.set(id, Health::Alive, 7);
    }
    assert_eq!(a.settle(), b.settle());
    assert_eq!(a.voters, [1, 2, 3].into());
}

fn arb_health() -> impl Strategy<Value = Health> {
    prop_oneof![
        4 => Just(Health::Alive),
        1 => Just(Health::Suspect),
        1 => Just(Health::Dead),
        1 => Just(Health::Left),
    ]
}

proptest! {
    /// From any membership and view: each step is one legal change that keeps an alive
    /// majority and spares the leader, and the steps converge.
    #[test]
    fn reconciliation_invariants(
        roles in proptest::collection::vec(0u8..3, 2..10),
        views in proptest::collection::vec(
            proptest::option::weighted(0.9, (arb_health(), 0u64..3_000)),
            2..10,
        ),
    ) {
        let mut w = World::bootstrapped();
        w.now_ms = 3_000;
        for (i, role) in roles.iter().enumerate() {
            let id = i as Id + 2;
            match role {
                1 => { w.voters.insert(id); }
                2 => { w.learners.insert(id); }
                _ => {}
            }
        }
        for (i, view) in views.iter().enumerate() {
            if let Some((health, since_ms)) = view {
                w.set(i as Id + 2, *health, *since_ms);
            }
        }
        let plan = w.plan();
        let mut steps = 0;
        while let Some(c) = w.next() {
            prop_assert_eq!(&plan[steps], &c, "plan and next_change agree");
            let mut voters = w.voters.clone();
            match &c {
                Change::Promote(id) => {
                    prop_assert!(w.learners.contains(id));
                    voters.insert(*id);
                }
                Change::PromotePair(a, b) => {
                    prop_assert!(a != b && w.learners.contains(a) && w.learners.contains(b));
                    voters.insert(*a);
                    voters.insert(*b);
                }
                Change::Demote(id) | Change::Remove(id) => {
                    prop_assert_ne!(*id, w.leader);
                    voters.remove(id);
                }
                Change::AddLearners(ids) => {
                    prop_assert!(!ids.is_empty() && ids.len() <= LEARNERS_PER_CHANGE);
                    for id in ids {
                        prop_assert!(!w.voters.contains(id) && !w.learners.contains(id));
                    }
                }
            }
            if voters != w.voters {
                // Changes of the voter set never leave it without an alive majority,
                // unless it only loses voters that are not alive.
                let alive = |v: &BTreeSet<Id>| v.iter().filter(|id| {
                    **id == w.leader || w.members.get(id).is_some_and(|m| m.health == Health::Alive)
                }).count();
                let loses_only_dead = voters.len() < w.voters.len() && alive(&voters) == alive(&w.voters);
                prop_assert!(alive(&voters) * 2 > voters.len() || loses_only_dead, "{:?} -> {:?}", w.voters, voters);
            }
            w.settle_one(c);
            steps += 1;
            prop_assert!(steps <= 40, "no convergence");
        }
        prop_assert_eq!(steps, plan.len());
        prop_assert!(w.voters.contains(&w.leader));
        // Converged within the large target, unless the voters have no alive majority (then
        // nothing can commit, and no change is proposed).
        let alive_voters = w.voters.iter().filter(|id| {
            **id == w.leader || w.members.get(id).is_some_and(|m| m.health == Health::Alive)
        }).count();
        prop_assert!(w.voters.len() <= w.config.voters_large || alive_voters * 2 <= w.voters.len());
    }
}

#[test]
fn config_validation() {
    assert!(VoterConfig::default().validate().is_ok());
    let bad = VoterConfig {
        voters_small: 0,
        ..VoterConfig::default()
    };
    assert_eq!(bad.validate(), Err(VoterConfigError::NoVoters));
    let bad = VoterConfig {
        voters_large: 1,
        ..VoterConfig::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(VoterConfigError::LargeBelowSmall { .. })
    ));
}

/// A removed member leaves the membership (voter or learner) and is never added back,
/// though gossip still calls it alive.
#[test]
fn a_removed_member_is_taken_out_and_never_added_back() {
    let mut w = World::bootstrapped();
    for id in [2, 3, 4] {
        w.set(id, Health::Alive, 10);
    }
    w.voters = [1, 2, 3].into();
    w.learners = [4].into();
    for removed in [3, 4] {
        let mut members = w.members.clone();
        exclude_removed(&mut members, [removed]);
        let input = Input {
            members: &members,
            ..w.input()
        };
        let plan = plan(&input, &w.config);
        assert_eq!(plan.first(), Some(&Change::Remove(removed)), "{plan:?}");
        assert!(
            !plan.iter().any(
                |c| matches!(c, Change::AddLearners(ids) if ids.contains(&removed))
                    || matches!(c, Change::Promote(id) if *id == removed)
            ),
            "{plan:?}"
        );
    }
    // Not in gossip's view at all: still removed.
    let mut members = w.members.clone();
    members.remove(&2);
    exclude_removed(&mut members, [2]);
    let input = Input {
        members: &members,
        ..w.input()
    };
    assert_eq!(next_change(&input, &w.config), Some(Change::Remove(2)));
}

#[test]
fn a_voter_gossip_calls_down_is_confirmed_first_and_kept_when_it_answers() {
    let mut w = World::bootstrapped();
    for id in 2..=4 {
        w.set(id, Health::Alive, id * 10);
    }
    w.settle();
    assert_eq!(w.voters, [1, 2, 3].into());
    let step = |w: &World, round: &Round<Id>| {
        round.step(&w.leader, &w.voters, &w.learners, w.now_ms, &w.config)
    };
    // The review's attack: gossip says voter 3 left (or is long dead).
    for health in [Health::Left, Health::Dead] {
        w.set(3, health, 0);
        assert_eq!(w.next(), Some(Remove(3)), "gossip alone would remove it");
        assert_eq!(hearsay_target(&Remove(3), &w.members), Some(&3));
        // The round asks 3 first; 3 answers: kept, nothing else changes for it this round.
        let mut round = Round::new(w.members.clone(), BTreeSet::new());
        assert_eq!(step(&w, &round), Step::Ask(3));
        round.answered(&3);
        assert_eq!(
            step(&w, &round),
            Step::Done,
            "{health:?}: an answering voter is kept"
        );
        // 3 does not answer: gossip's word stands.
        let mut round = Round::new(w.members.clone(), BTreeSet::new());
        assert_eq!(step(&w, &round), Step::Ask(3));
        round.silent(&3);
        assert_eq!(step(&w, &round), Step::Apply(Remove(3)));
    }
    // An operator's removal needs no call.
    let round = Round::new(w.members.clone(), [3].into());
    assert_eq!(step(&w, &round), Step::Apply(Remove(3)));
    // Changes that do not rest on gossip's word need no call.
    assert_eq!(hearsay_target(&Promote(4), &w.members), None);
    w.set(5, Health::Alive, 50);
    assert_eq!(hearsay_target(&Demote(5), &w.members), None);
    assert_eq!(hearsay_target(&Demote(3), &w.members), Some(&3));
}
