//! Voter reconciliation: which members vote in Raft. Sans-IO, in the manner of Consul's
//! autopilot.
//!
//! The chief (the Raft leader) calls [`next_change`] with the Raft membership (voters and
//! learners), its gossip view and the time, applies the one change returned through openraft,
//! waits for it to commit, and calls again. [`plan`] returns the whole sequence the same rules
//! would produce if nothing else changed (for status and tests).
//!
//! Rules, first applicable wins:
//! 1. a voter or learner that gossip reports `left` is removed at once;
//! 2. a voter or learner `dead` for at least `dead_grace_ms` is removed;
//! 3. while there are fewer voters than wanted, the alive learner that has been alive longest
//!    (ties by id) is promoted; when one more voter would make the count even, the two
//!    longest-alive learners are promoted in one change (never two voters: losing either
//!    would stop every write), and while there is only one such learner, nothing is promoted
//!    yet (rule 4 adds the next);
//! 4. an alive member that is not in the Raft membership is added as a learner (every node
//!    learns the log, so every node can serve reads and knows the chief);
//! 5. while there are more voters than the target, one is demoted to learner (not alive ones
//!    first, then the most recently alive).
//!
//! Wanted voters: the target (`voters_small`, or `voters_large` once the cluster has at least
//! `large_cluster_members` members that have not left), capped by the alive members available,
//! and rounded down to an odd number when growing (an even voter count adds no fault
//! tolerance; 2 members give 1 voter and 1 learner). Alive voters are never demoted only to
//! reach an odd count.
//!
//! Invariants (asserted in tests): at most one change per call; the leader is never removed or
//! demoted; a change is only proposed when the new voter set keeps a majority of alive
//! voters; the result depends only on the input (ordered maps, ties by id).
//!
//! A member missing from the gossip view is treated as suspect: never promoted, never removed
//! (right after a restart the view may be empty). Gossip keeps `dead`/`left` entries, so these
//! rules see them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

/// A member's health as gossip reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Health {
    /// Answers probes.
    Alive,
    /// Missed probes; may come back.
    Suspect,
    /// Declared dead by gossip.
    Dead,
    /// Left on purpose.
    Left,
}

/// Gossip's view of one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberView {
    /// Current health.
    pub health: Health,
    /// When it entered that health, ms (same clock as `now_ms`).
    pub since_ms: u64,
}

/// Voter policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VoterConfig {
    /// Voters wanted in a small cluster (default 3).
    pub voters_small: usize,
    /// Voters wanted once the cluster is large (default 5).
    pub voters_large: usize,
    /// Members (not left) from which the cluster counts as large (default 7).
    pub large_cluster_members: usize,
    /// How long a voter must be dead before it is replaced, ms (default 30 000).
    pub dead_grace_ms: u64,
}

impl Default for VoterConfig {
    fn default() -> Self {
        VoterConfig {
            voters_small: 3,
            voters_large: 5,
            large_cluster_members: 7,
            dead_grace_ms: 30_000,
        }
    }
}

/// A [`VoterConfig`] that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VoterConfigError {
    /// `voters_small` is 0.
    #[error("voters_small must be at least 1")]
    NoVoters,
    /// `voters_large` is smaller than `voters_small`.
    #[error("voters_large ({large}) must be at least voters_small ({small})")]
    LargeBelowSmall {
        /// `voters_small`.
        small: usize,
        /// `voters_large`.
        large: usize,
    },
}

impl VoterConfig {
    /// Short grace for tests.
    pub fn for_test() -> VoterConfig {
        VoterConfig {
            dead_grace_ms: 1_000,
            ..VoterConfig::default()
        }
    }

    /// Checks the policy.
    pub fn validate(&self) -> Result<(), VoterConfigError> {
        if self.voters_small == 0 {
            return Err(VoterConfigError::NoVoters);
        }
        if self.voters_large < self.voters_small {
            return Err(VoterConfigError::LargeBelowSmall {
                small: self.voters_small,
                large: self.voters_large,
            });
        }
        Ok(())
    }
}

/// One Raft membership change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Change<I> {
    /// Add a member as a learner (it receives the log, does not vote).
    AddLearner(I),
    /// Make a learner a voter.
    Promote(I),
    /// Make two learners voters in one change: growing from an odd voter count to the next
    /// odd one without passing through an even count (two voters: losing either stops every
    /// write).
    PromotePair(I, I),
    /// Make a voter a learner.
    Demote(I),
    /// Drop a voter or learner from the membership.
    Remove(I),
}

/// What reconciliation looks at.
#[derive(Debug, Clone)]
pub struct Input<'a, I> {
    /// This node: the leader; never demoted or removed, always counted alive.
    pub leader: &'a I,
    /// Current voters.
    pub voters: &'a BTreeSet<I>,
    /// Current learners (disjoint from voters).
    pub learners: &'a BTreeSet<I>,
    /// Gossip view by member id.
    pub members: &'a BTreeMap<I, MemberView>,
    /// Now, ms (same clock as `since_ms`).
    pub now_ms: u64,
}

/// The next membership change, or `None` when the membership is as wanted.
pub fn next_change<I: Ord + Clone + Debug>(
    input: &Input<'_, I>,
    config: &VoterConfig,
) -> Option<Change<I>> {
    let r = Reconciler { input, config };

    // 1 and 2: left at once, dead after the grace period (voters first, then learners).
    for id in input.voters.iter().chain(input.learners.iter()) {
        if id != input.leader && r.expired(id) {
            return Some(Change::Remove(id.clone()));
        }
    }

    // 3: promote while short of voters.
    let wanted = r.wanted_voters();
    if input.voters.len() < wanted {
        let mut candidates: Vec<(&I, u64)> = input
            .learners
            .iter()
            .filter(|id| r.alive(id))
            .map(|id| (id, input.members.get(id).map_or(0, |v| v.since_ms)))
            .collect();
        candidates.sort_by(|(a, sa), (b, sb)| sa.cmp(sb).then_with(|| a.cmp(b)));
        let even_after_one = (input.voters.len() + 1).is_multiple_of(2);
        if !even_after_one {
            for (id, _) in &candidates {
                let mut after: BTreeSet<&I> = input.voters.iter().collect();
                after.insert(id);
                if r.keeps_alive_majority(&after) {
                    return Some(Change::Promote((*id).clone()));
                }
            }
        } else if let [(a, _), (b, _), ..] = candidates.as_slice() {
            // Both the current set (it must commit the change) and the new one need an
            // alive majority.
            let now: BTreeSet<&I> = input.voters.iter().collect();
            let mut after = now.clone();
            after.insert(a);
            after.insert(b);
            if r.keeps_alive_majority(&now) && r.keeps_alive_majority(&after) {
                return Some(Change::PromotePair((*a).clone(), (*b).clone()));
            }
        }
        // One learner short of a pair: rule 4 adds the member that will make it.
    }

    // 4: every alive member learns the log.
    for (id, view) in input.members {
        if view.health == Health::Alive
            && !input.voters.contains(id)
            && !input.learners.contains(id)
        {
            return Some(Change::AddLearner(id.clone()));
        }
    }

    // 5: demote above the target; not-alive voters first, then the most recently alive.
    if input.voters.len() > r.target() {
        let mut candidates: Vec<(bool, u64, &I)> = input
            .voters
            .iter()
            .filter(|id| *id != input.leader)
            .map(|id| {
                (
                    r.alive(id),
                    input.members.get(id).map_or(u64::MAX, |v| v.since_ms),
                    id,
                )
            })
            .collect();
        // Not alive (false) first; then newest since_ms first; then larger id first.
        candidates.sort_by(|(aa, sa, ia), (ab, sb, ib)| {
            aa.cmp(ab).then_with(|| sb.cmp(sa)).then_with(|| ib.cmp(ia))
        });
        for (_, _, id) in candidates {
            let after: BTreeSet<&I> = input.voters.iter().filter(|v| *v != id).collect();
            if r.keeps_alive_majority(&after) {
                return Some(Change::Demote(id.clone()));
            }
        }
    }
    None
}

/// The changes [`next_change`] would make one after another if the gossip view stayed as it
/// is and each change committed. At most `plan_len_max(input)` long.
pub fn plan<I: Ord + Clone + Debug>(input: &Input<'_, I>, config: &VoterConfig) -> Vec<Change<I>> {
    let mut voters = input.voters.clone();
    let mut learners = input.learners.clone();
    let mut out = Vec::new();
    // Each member is added, promoted, demoted and removed at most once in a plan.
    let bound = 4 * (input.members.len() + voters.len() + learners.len()) + 1;
    while out.len() < bound {
        let step = Input {
            leader: input.leader,
            voters: &voters,
            learners: &learners,
            members: input.members,
            now_ms: input.now_ms,
        };
        let Some(change) = next_change(&step, config) else {
            break;
        };
        match &change {
            Change::AddLearner(id) => {
                learners.insert(id.clone());
            }
            Change::Promote(id) => {
                learners.remove(id);
                voters.insert(id.clone());
            }
            Change::PromotePair(a, b) => {
                for id in [a, b] {
                    learners.remove(id);
                    voters.insert(id.clone());
                }
            }
            Change::Demote(id) => {
                voters.remove(id);
                learners.insert(id.clone());
            }
            Change::Remove(id) => {
                voters.remove(id);
                learners.remove(id);
            }
        }
        out.push(change);
    }
    out
}

/// Makes the members an operator removed (`domain::state::removal`) look `left` to the rules, so
/// rule 1 takes them out of the membership (voter or learner) at once and rule 4 never adds
/// them back, whatever gossip says of them (a removed host may still run and gossip). One
/// that gossip no longer lists is entered as left too.
pub fn exclude_removed<I: Ord>(
    members: &mut BTreeMap<I, MemberView>,
    removed: impl IntoIterator<Item = I>,
) {
    for id in removed {
        members.insert(
            id,
            MemberView {
                health: Health::Left,
                since_ms: 0,
            },
        );
    }
}

struct Reconciler<'a, 'b, I> {
    input: &'a Input<'b, I>,
    config: &'a VoterConfig,
}

impl<I: Ord + Clone + Debug> Reconciler<'_, '_, I> {
    fn alive(&self, id: &I) -> bool {
        id == self.input.leader
            || self
                .input
                .members
                .get(id)
                .is_some_and(|v| v.health == Health::Alive)
    }

    /// Left, or dead for at least the grace period.
    fn expired(&self, id: &I) -> bool {
        match self.input.members.get(id) {
            Some(MemberView {
                health: Health::Left,
                ..
            }) => true,
            Some(MemberView {
                health: Health::Dead,
                since_ms,
            }) => self.input.now_ms.saturating_sub(*since_ms) >= self.config.dead_grace_ms,
            _ => false,
        }
    }

    /// Members that have not left (the leader included even if gossip forgot it).
    fn cluster_size(&self) -> usize {
        let mut n = self
            .input
            .members
            .values()
            .filter(|v| v.health != Health::Left)
            .count();
        if !self.input.members.contains_key(self.input.leader) {
            n += 1;
        }
        n
    }

    fn target(&self) -> usize {
        if self.cluster_size() >= self.config.large_cluster_members {
            self.config.voters_large
        } else {
            self.config.voters_small
        }
    }

    /// Target capped by alive members (voters, learners and members about to be learners),
    /// rounded down to odd.
    fn wanted_voters(&self) -> usize {
        let mut alive: BTreeSet<&I> = self
            .input
            .members
            .iter()
            .filter(|(_, v)| v.health == Health::Alive)
            .map(|(id, _)| id)
            .collect();
        alive.insert(self.input.leader);
        let wanted = self.target().min(alive.len()).max(1);
        if wanted.is_multiple_of(2) {
            wanted - 1
        } else {
            wanted
        }
    }

    /// Whether a majority of `voters` is alive.
    fn keeps_alive_majority(&self, voters: &BTreeSet<&I>) -> bool {
        let alive = voters.iter().filter(|id| self.alive(id)).count();
        alive * 2 > voters.len()
    }
}

#[cfg(test)]
mod tests {
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
                Change::AddLearner(id) => assert!(self.learners.insert(*id)),
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
        assert_eq!(w.settle(), [AddLearner(2)]);
        assert_eq!(w.voters, [1].into());
        w.set(3, Health::Alive, 20);
        // Three: the new member learns, then both learners are promoted in one change (never
        // two voters, where losing either stops every write).
        assert_eq!(w.settle(), [AddLearner(3), PromotePair(2, 3)]);
        assert_eq!(w.voters, [1, 2, 3].into());
        w.set(4, Health::Alive, 30);
        assert_eq!(w.settle(), [AddLearner(4)]);
        assert_eq!(w.voters.len(), 3);
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
        assert_eq!(steps, [PromotePair(4, 5), AddLearner(7)]);
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
                    Change::AddLearner(id) => {
                        prop_assert!(!w.voters.contains(id) && !w.learners.contains(id));
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
                    |c| matches!(c, Change::AddLearner(id) | Change::Promote(id) if *id == removed)
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
}
