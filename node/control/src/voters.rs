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
//! 4. the alive members that are not in the Raft membership are added as learners, up to
//!    [`LEARNERS_PER_CHANGE`] in one change (every node learns the log, so every node can
//!    serve reads, knows the chief and sees its placements; one at a time, 128 booting hosts
//!    took 31 s to all be learners);
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
//!
//! Gossip is hearsay: never enough alone to take a vote away. Before a change that removes or
//! demotes a member gossip does not report alive ([`hearsay_target`]), the chief asks that
//! member directly over a stream; a member that answers is kept, looked at as suspect (never
//! removed, never promoted) for this round, and the rules run again without that change
//! ([`Round`], which the chief steps through, making the calls it asks for). An operator's
//! `member remove` is not hearsay and needs no such call.

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
    #[cfg(test)]
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

/// Most members one change adds as learners: each starts a replication stream from the
/// chief (the whole log, or a snapshot once the log is purged), so a cluster that boots, or a
/// partition that heals, does not start hundreds of them at once.
pub const LEARNERS_PER_CHANGE: usize = 32;

/// One Raft membership change.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Change<I> {
    /// Add members as learners (they receive the log, do not vote): at least one, at most
    /// [`LEARNERS_PER_CHANGE`].
    AddLearners(BTreeSet<I>),
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
    let newcomers: BTreeSet<I> = input
        .members
        .iter()
        .filter(|(id, view)| {
            view.health == Health::Alive
                && !input.voters.contains(*id)
                && !input.learners.contains(*id)
        })
        .map(|(id, _)| id.clone())
        .take(LEARNERS_PER_CHANGE)
        .collect();
    if !newcomers.is_empty() {
        return Some(Change::AddLearners(newcomers));
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

/// The member `change` would remove or demote on gossip's word alone: one gossip does not
/// report alive. The caller confirms it over a stream before applying the change (a member
/// that answers is kept; see the module doc).
pub fn hearsay_target<'c, I: Ord>(
    change: &'c Change<I>,
    members: &BTreeMap<I, MemberView>,
) -> Option<&'c I> {
    let (Change::Remove(id) | Change::Demote(id)) = change else {
        return None;
    };
    members
        .get(id)
        .is_some_and(|v| v.health != Health::Alive)
        .then_some(id)
}

/// What the chief does next in a round of voter upkeep ([`Round::step`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step<I> {
    /// Apply this change.
    Apply(Change<I>),
    /// Call this member directly first; report the outcome with [`Round::answered`] or
    /// [`Round::silent`] and step again.
    Ask(I),
    /// Nothing to change this round.
    Done,
}

/// One round of voter upkeep with gossip's word confirmed: [`next_change`], except that a
/// change that removes or demotes a member gossip calls down ([`hearsay_target`]) waits until
/// that member failed to answer a direct call, and a member that answers is looked at as
/// suspect (never removed, never promoted) for the rest of the round. An operator's removal
/// ([`exclude_removed`]) needs no call. Each member is asked at most once a round.
#[derive(Debug, Clone)]
pub struct Round<I> {
    members: BTreeMap<I, MemberView>,
    removed: BTreeSet<I>,
    answered: BTreeSet<I>,
    silent: BTreeSet<I>,
}

impl<I: Ord + Clone + Debug> Round<I> {
    /// A round over gossip's view `members` (operator-removed members already excluded)
    /// and the members an operator `removed`.
    pub fn new(members: BTreeMap<I, MemberView>, removed: BTreeSet<I>) -> Round<I> {
        Round {
            members,
            removed,
            answered: BTreeSet::new(),
            silent: BTreeSet::new(),
        }
    }

    /// The next step with the Raft membership as it is now.
    pub fn step(
        &self,
        leader: &I,
        voters: &BTreeSet<I>,
        learners: &BTreeSet<I>,
        now_ms: u64,
        config: &VoterConfig,
    ) -> Step<I> {
        let input = Input {
            leader,
            voters,
            learners,
            members: &self.members,
            now_ms,
        };
        let Some(change) = next_change(&input, config) else {
            return Step::Done;
        };
        match hearsay_target(&change, &self.members) {
            Some(id) if self.answered.contains(id) => Step::Done,
            Some(id) if !self.removed.contains(id) && !self.silent.contains(id) => {
                Step::Ask(id.clone())
            }
            _ => Step::Apply(change),
        }
    }

    /// `id` answered the direct call: kept, looked at as suspect for the rest of the round.
    pub fn answered(&mut self, id: &I) {
        if let Some(v) = self.members.get_mut(id) {
            v.health = Health::Suspect;
        }
        self.answered.insert(id.clone());
    }

    /// `id` did not answer in time: gossip's word stands.
    pub fn silent(&mut self, id: &I) {
        self.silent.insert(id.clone());
    }
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
            Change::AddLearners(ids) => {
                learners.extend(ids.iter().cloned());
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
mod tests;
