//! Placement: which members run a job's workers, and in which ring order. Sans-IO.
//!
//! The chief calls [`place`] with its view of the members (gossip plus what running jobs hold)
//! and records the result in the Raft log, so every replica agrees on the ring.
//!
//! Rules:
//! - only members that are alive and not blacklisted are candidates;
//! - a member hosts at most `min(free_cpus / cpus_per_worker, free_gpus / gpus_per_worker)`
//!   workers (the gpu bound only when gpus are asked for), so it is never over-committed;
//! - devices: each worker gets `gpus_per_worker` of its member's GPUs, the lowest-indexed
//!   ones that no slot of a running job holds, in rank order within the member, so no two
//!   ranks share a GPU (`Slot::gpus`);
//! - `spread` water-fills one worker per member per round, members with the most room first;
//!   `pack` fills members with the most room first, each to its capacity (fewest members);
//! - ring order: chosen members by (name, id), ranks of one member adjacent, `local_rank`
//!   counting within the member;
//! - deterministic: ties are broken by name, then id;
//! - [`place_preferring`] tries one member first (where a search trial's checkpoint is)
//!   or keeps off one (a speculative copy runs away from its original); [`take`] counts
//!   placed slots against the candidates, so later jobs of the same round see them held.

use std::{collections::BTreeSet, fmt};

use crate::domain::spec::{JobSpec, Placement};
pub use crate::domain::state::Slot;

/// A member as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Peer id (unique).
    pub id: String,
    /// Node name (for humans and ordering).
    pub name: String,
    /// Gossip says alive (suspect, dead and left members are not candidates).
    pub alive: bool,
    /// Blacklisted by the chief (stragglers, repeated failures).
    pub blacklisted: bool,
    /// Cpus the member has.
    pub cpus: u32,
    /// The GPUs the member offers, by device index.
    pub gpus: Vec<u32>,
    /// Cpus already held by workers of running jobs on this member.
    pub used_cpus: u32,
    /// GPUs already held by workers of running jobs on this member, by device index.
    pub used_gpus: BTreeSet<u32>,
}

/// What a job asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Number of workers (ring size).
    pub workers: u32,
    /// Cpus per worker (at least 1).
    pub cpus_per_worker: u32,
    /// Gpus per worker.
    pub gpus_per_worker: u32,
    /// Spread or pack.
    pub placement: Placement,
}

impl Request {
    /// The request of a spec at its nominal size (`workers`).
    pub fn from_spec(spec: &JobSpec) -> Request {
        Request {
            workers: spec.workers,
            cpus_per_worker: spec.resources.cpus_per_worker,
            gpus_per_worker: spec.resources.gpus_per_worker,
            placement: spec.placement,
        }
    }
}

/// The job cannot be placed now; it stays pending with this reason shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Unplaceable {
    /// Human reason, e.g. "needs 4 workers with 1 cpu each; 3 alive members have room for 3".
    pub reason: String,
}

/// Chooses members for `req.workers` workers. See the module docs for the rules.
///
/// On success the slots are in rank order: `slots[i].rank == i`.
pub fn place(candidates: &[Candidate], req: &Request) -> Result<Vec<Slot>, Unplaceable> {
    let wanted = u64::from(req.workers);
    let mut eligible: Vec<(&Candidate, u64)> = candidates
        .iter()
        .filter(|c| c.alive && !c.blacklisted)
        .map(|c| (c, capacity(c, req)))
        .collect();
    let room: u64 = eligible.iter().map(|(_, cap)| cap).sum();
    if wanted == 0 || room < wanted {
        return Err(Unplaceable {
            reason: reason(candidates, req, eligible.len(), room),
        });
    }

    // Most room first; ties by name, then id.
    eligible.sort_by(|(a, ca), (b, cb)| {
        cb.cmp(ca)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| a.id.cmp(&b.id))
    });
    let mut counts = vec![0u64; eligible.len()];
    match req.placement {
        Placement::Pack => {
            let mut left = wanted;
            for (count, (_, cap)) in counts.iter_mut().zip(&eligible) {
                let take = left.min(*cap);
                *count = take;
                left -= take;
                if left == 0 {
                    break;
                }
            }
        }
        Placement::Spread => {
            let mut left = wanted;
            let mut round = 0u64;
            while left > 0 {
                for (count, (_, cap)) in counts.iter_mut().zip(&eligible) {
                    if left > 0 && *cap > round {
                        *count += 1;
                        left -= 1;
                    }
                }
                round += 1;
            }
        }
    }

    // Ring order: chosen members by (name, id), their workers adjacent.
    let mut chosen: Vec<(&Candidate, u64)> = eligible
        .iter()
        .zip(&counts)
        .filter(|(_, n)| **n > 0)
        .map(|((c, _), n)| (*c, *n))
        .collect();
    chosen.sort_by(|(a, _), (b, _)| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
    let mut slots = Vec::with_capacity(req.workers as usize);
    let per_worker = req.gpus_per_worker as usize;
    for (c, n) in chosen {
        let free = free_gpus(c);
        for local in 0..n {
            let rank = u32::try_from(slots.len()).expect("at most req.workers slots");
            let first = local as usize * per_worker;
            slots.push(Slot {
                member: c.id.clone(),
                name: c.name.clone(),
                rank,
                local_rank: u32::try_from(local).expect("local rank below req.workers"),
                worker: rank,
                // Capacity counted the free devices: there are enough.
                gpus: free[first..first + per_worker].to_vec(),
            });
        }
    }
    debug_assert_eq!(slots.len() as u64, wanted);
    Ok(slots)
}

/// How many workers of `req` fit on `c` now.
fn capacity(c: &Candidate, req: &Request) -> u64 {
    let free_cpus = u64::from(c.cpus.saturating_sub(c.used_cpus));
    let by_cpu = free_cpus / u64::from(req.cpus_per_worker.max(1));
    if req.gpus_per_worker == 0 {
        by_cpu
    } else {
        let free_gpus = free_gpus(c).len() as u64;
        by_cpu.min(free_gpus / u64::from(req.gpus_per_worker))
    }
}

/// `c`'s GPUs that no running job's slot holds, lowest index first.
pub fn free_gpus(c: &Candidate) -> Vec<u32> {
    let mut free: Vec<u32> = c
        .gpus
        .iter()
        .copied()
        .filter(|g| !c.used_gpus.contains(g))
        .collect();
    free.sort_unstable();
    free.dedup();
    free
}

fn reason(candidates: &[Candidate], req: &Request, eligible: usize, room: u64) -> String {
    let mut r = format!(
        "needs {} with {}",
        Plural(u64::from(req.workers), "worker"),
        Plural(u64::from(req.cpus_per_worker), "cpu")
    );
    if req.gpus_per_worker > 0 {
        r.push_str(&format!(
            " and {}",
            Plural(u64::from(req.gpus_per_worker), "gpu")
        ));
    }
    let have = if eligible == 1 { "has" } else { "have" };
    r.push_str(&format!(
        " each; {} {have} room for {room}",
        Plural(eligible as u64, "alive member")
    ));
    let blacklisted = candidates
        .iter()
        .filter(|c| c.alive && c.blacklisted)
        .count();
    let not_alive = candidates.iter().filter(|c| !c.alive).count();
    let mut excluded = Vec::new();
    if blacklisted > 0 {
        excluded.push(format!("{blacklisted} blacklisted"));
    }
    if not_alive > 0 {
        excluded.push(format!("{not_alive} not alive"));
    }
    if !excluded.is_empty() {
        r.push_str(&format!(" ({} left out)", excluded.join(", ")));
    }
    r
}

/// "1 cpu", "2 cpus".
struct Plural<'a>(u64, &'a str);

impl fmt::Display for Plural<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.0 == 1 { "" } else { "s" };
        write!(f, "{} {}{s}", self.0, self.1)
    }
}

/// Takes the resources of `slots` (their cpus and their devices) from the candidates.
pub fn take(candidates: &mut [Candidate], slots: &[Slot], req: &Request) {
    for slot in slots {
        if let Some(c) = candidates.iter_mut().find(|c| c.id == slot.member) {
            c.used_cpus += req.cpus_per_worker;
            c.used_gpus.extend(&slot.gpus);
        }
    }
}

/// Places `req` on `prefer` when it has room (a promoted trial's checkpoint is there),
/// else anywhere; `avoid` is never used (a copy runs away from its original).
pub fn place_preferring(
    candidates: &[Candidate],
    req: &Request,
    prefer: Option<&str>,
    avoid: Option<&str>,
) -> Result<Vec<Slot>, Unplaceable> {
    let only = |keep: &dyn Fn(&Candidate) -> bool| -> Vec<Candidate> {
        candidates
            .iter()
            .map(|c| Candidate {
                alive: c.alive && keep(c),
                ..c.clone()
            })
            .collect()
    };
    if let Some(p) = prefer {
        if let Ok(slots) = place(&only(&|c| c.id == p), req) {
            return Ok(slots);
        }
    }
    match avoid {
        Some(a) => place(&only(&|c| c.id != a), req),
        None => place(candidates, req),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn member(name: &str, cpus: u32, gpus: u32) -> Candidate {
        Candidate {
            id: format!("id-{name}"),
            name: name.into(),
            alive: true,
            blacklisted: false,
            cpus,
            gpus: (0..gpus).collect(),
            used_cpus: 0,
            used_gpus: BTreeSet::new(),
        }
    }

    fn req(workers: u32, cpus: u32, gpus: u32, placement: Placement) -> Request {
        Request {
            workers,
            cpus_per_worker: cpus,
            gpus_per_worker: gpus,
            placement,
        }
    }

    fn names(slots: &[Slot]) -> Vec<&str> {
        slots.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn spread_puts_one_worker_per_member_in_name_order() {
        let ms = [member("c", 8, 0), member("a", 8, 0), member("b", 8, 0)];
        let slots = place(&ms, &req(3, 1, 0, Placement::Spread)).unwrap();
        assert_eq!(names(&slots), ["a", "b", "c"]);
        assert!(slots
            .iter()
            .enumerate()
            .all(|(i, s)| s.rank as usize == i && s.local_rank == 0));
        assert_eq!(slots[0].member, "id-a");
    }

    #[test]
    fn spread_prefers_members_with_most_room() {
        let mut busy = member("a", 8, 0);
        busy.used_cpus = 7;
        let ms = [busy, member("b", 8, 0), member("c", 4, 0)];
        let slots = place(&ms, &req(2, 1, 0, Placement::Spread)).unwrap();
        assert_eq!(names(&slots), ["b", "c"]);
        // Five workers: b and c twice each (most room), a once.
        let slots = place(&ms, &req(5, 1, 0, Placement::Spread)).unwrap();
        assert_eq!(names(&slots), ["a", "b", "b", "c", "c"]);
        assert_eq!(
            slots.iter().map(|s| s.local_rank).collect::<Vec<_>>(),
            [0, 0, 1, 0, 1]
        );
    }

    #[test]
    fn pack_fills_the_biggest_member_first() {
        let ms = [member("a", 2, 0), member("b", 8, 0), member("c", 4, 0)];
        let slots = place(&ms, &req(4, 1, 0, Placement::Pack)).unwrap();
        assert_eq!(names(&slots), ["b", "b", "b", "b"]);
        let slots = place(&ms, &req(10, 1, 0, Placement::Pack)).unwrap();
        assert_eq!(
            names(&slots),
            ["b", "b", "b", "b", "b", "b", "b", "b", "c", "c"]
        );
        assert_eq!(slots[9].local_rank, 1);
    }

    #[test]
    fn gpus_bound_capacity() {
        let ms = [member("a", 64, 2), member("b", 64, 0), member("c", 64, 4)];
        let slots = place(&ms, &req(3, 1, 2, Placement::Spread)).unwrap();
        assert_eq!(names(&slots), ["a", "c", "c"]);
        let e = place(&ms, &req(4, 1, 2, Placement::Spread)).unwrap_err();
        assert_eq!(
            e.reason,
            "needs 4 workers with 1 cpu and 2 gpus each; 3 alive members have room for 3"
        );
    }

    fn devices(slots: &[Slot]) -> Vec<Vec<u32>> {
        slots.iter().map(|s| s.gpus.clone()).collect()
    }

    #[test]
    fn workers_get_the_lowest_free_devices_and_never_share_one() {
        let mut ms = [member("a", 8, 4)];
        let one = req(2, 1, 1, Placement::Pack);
        let first = place(&ms, &one).unwrap();
        assert_eq!(devices(&first), [vec![0], vec![1]]);
        take(&mut ms, &first, &one);
        let second = place(&ms, &one).unwrap();
        assert_eq!(
            devices(&second),
            [vec![2], vec![3]],
            "disjoint from the first"
        );
        take(&mut ms, &second, &one);
        assert!(
            place(&ms, &req(1, 1, 1, Placement::Pack)).is_err(),
            "all held"
        );
        // Device 1 freed: the next worker gets it; a job without gpus gets none.
        ms[0].used_gpus.remove(&1);
        let third = place(&ms, &req(1, 1, 1, Placement::Pack)).unwrap();
        assert_eq!(devices(&third), [vec![1]]);
        assert_eq!(
            devices(&place(&ms, &req(1, 1, 0, Placement::Pack)).unwrap()),
            [Vec::<u32>::new()]
        );
        // Two per worker, in rank order within each member; members offer their own indices.
        let mut b = member("b", 8, 0);
        b.gpus = vec![7, 3, 5, 1];
        let slots = place(&[member("a", 8, 2), b], &req(3, 1, 2, Placement::Spread)).unwrap();
        assert_eq!(names(&slots), ["a", "b", "b"]);
        assert_eq!(devices(&slots), [vec![0, 1], vec![1, 3], vec![5, 7]]);
    }

    #[test]
    fn reason_counts_excluded_members() {
        let mut dead = member("d", 8, 0);
        dead.alive = false;
        let mut black = member("e", 8, 0);
        black.blacklisted = true;
        let ms = [
            member("a", 1, 0),
            member("b", 1, 0),
            member("c", 1, 0),
            dead,
            black,
        ];
        let e = place(&ms, &req(4, 1, 0, Placement::Spread)).unwrap_err();
        assert_eq!(
            e.reason,
            "needs 4 workers with 1 cpu each; 3 alive members have room for 3 (1 blacklisted, 1 not alive left out)"
        );
        let e = place(&[], &req(1, 2, 0, Placement::Pack)).unwrap_err();
        assert_eq!(
            e.reason,
            "needs 1 worker with 2 cpus each; 0 alive members have room for 0"
        );
    }

    #[test]
    fn used_resources_are_respected() {
        let mut a = member("a", 4, 0);
        a.used_cpus = 4;
        let mut b = member("b", 4, 0);
        b.used_cpus = 9; // more than it has (stale report): no room, no underflow
        let e = place(&[a, b], &req(1, 1, 0, Placement::Spread)).unwrap_err();
        assert!(
            e.reason.ends_with("2 alive members have room for 0"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn ties_broken_by_name_then_id() {
        let mut x = member("same", 4, 0);
        x.id = "id-2".into();
        let mut y = member("same", 4, 0);
        y.id = "id-1".into();
        let slots = place(&[x.clone(), y.clone()], &req(1, 1, 0, Placement::Pack)).unwrap();
        assert_eq!(slots[0].member, "id-1");
        let slots2 = place(&[y, x], &req(1, 1, 0, Placement::Pack)).unwrap();
        assert_eq!(slots, slots2);
    }

    #[test]
    fn request_from_spec() {
        let spec = JobSpec::parse(
            "name = \"a\"\nkind = \"train\"\nworkers = 3\nplacement = \"pack\"\n[resources]\ncpus_per_worker = 2\ngpus_per_worker = 1\n",
        )
        .unwrap();
        assert_eq!(Request::from_spec(&spec), req(3, 2, 1, Placement::Pack));
    }

    fn arb_candidate() -> impl Strategy<Value = Candidate> {
        (
            0u8..6,
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            0u32..9,
            0u32..4,
            0u32..6,
            0u32..3,
        )
            .prop_map(
                |(n, id, alive, black, cpus, gpus, ucpus, ugpus)| Candidate {
                    id: format!("id-{id}-{n}"),
                    name: format!("m{n}"),
                    alive: alive || black, // bias towards alive
                    blacklisted: black && !alive,
                    cpus,
                    gpus: (0..gpus).collect(),
                    used_cpus: ucpus,
                    // Held devices may be ones the member no longer offers (it restarted
                    // with fewer).
                    used_gpus: (0..ugpus).map(|g| g * 2).collect(),
                },
            )
    }

    proptest! {
        #[test]
        fn placement_invariants(
            raw in proptest::collection::vec(arb_candidate(), 0..8),
            workers in 1u32..12,
            cpw in 1u32..4,
            gpw in 0u32..3,
            pack in any::<bool>(),
        ) {
            // Peer ids are unique in a real view.
            let mut seen = std::collections::BTreeSet::new();
            let ms: Vec<Candidate> = raw.into_iter().filter(|c| seen.insert(c.id.clone())).collect();
            let placement = if pack { Placement::Pack } else { Placement::Spread };
            let r = req(workers, cpw, gpw, placement);
            let room: u64 = ms.iter().filter(|c| c.alive && !c.blacklisted).map(|c| capacity(c, &r)).sum();
            match place(&ms, &r) {
                Err(_) => prop_assert!(room < u64::from(workers)),
                Ok(slots) => {
                    prop_assert_eq!(slots.len(), workers as usize);
                    // Ranks contiguous 0..n.
                    for (i, s) in slots.iter().enumerate() {
                        prop_assert_eq!(s.rank as usize, i);
                    }
                    let mut per: BTreeMap<&str, u32> = BTreeMap::new();
                    for s in &slots {
                        *per.entry(s.member.as_str()).or_default() += 1;
                    }
                    // Never over-commits, only eligible members.
                    for (id, n) in &per {
                        let c = ms.iter().find(|c| c.id == *id).unwrap();
                        prop_assert!(c.alive && !c.blacklisted);
                        prop_assert!(u64::from(*n) <= capacity(c, &r));
                        prop_assert!(c.used_cpus + n * cpw <= c.cpus);
                        prop_assert!(free_gpus(c).len() as u32 >= n * gpw);
                    }
                    // Devices: gpw each, offered by the member, free, never shared.
                    let mut given = std::collections::BTreeSet::new();
                    for s in &slots {
                        let c = ms.iter().find(|c| c.id == s.member).unwrap();
                        prop_assert_eq!(s.gpus.len(), gpw as usize);
                        for g in &s.gpus {
                            prop_assert!(c.gpus.contains(g) && !c.used_gpus.contains(g));
                            prop_assert!(given.insert((s.member.clone(), *g)), "shared: {:?}", slots);
                        }
                    }
                    // Same member adjacent, local ranks count within it.
                    let mut runs: Vec<&str> = Vec::new();
                    for (i, s) in slots.iter().enumerate() {
                        if i == 0 || slots[i - 1].member != s.member {
                            prop_assert!(!runs.contains(&s.member.as_str()), "member split: {:?}", slots);
                            runs.push(&s.member);
                            prop_assert_eq!(s.local_rank, 0);
                        } else {
                            prop_assert_eq!(s.local_rank, slots[i - 1].local_rank + 1);
                        }
                    }
                    let mut caps: Vec<u64> = ms.iter().filter(|c| c.alive && !c.blacklisted)
                        .map(|c| capacity(c, &r)).collect();
                    caps.sort_unstable_by(|a, b| b.cmp(a));
                    if pack {
                        // Fewest members possible.
                        let mut acc = 0;
                        let fewest = caps.iter().take_while(|c| { let before = acc; acc += **c; before < u64::from(workers) }).count();
                        prop_assert_eq!(per.len(), fewest);
                    } else {
                        // Balanced: a member below max - 1 is at capacity.
                        let max = per.values().copied().max().unwrap();
                        for c in ms.iter().filter(|c| c.alive && !c.blacklisted) {
                            let n = per.get(c.id.as_str()).copied().unwrap_or(0);
                            prop_assert!(n + 1 >= max || u64::from(n) == capacity(c, &r));
                        }
                    }
                    // Deterministic under input order.
                    let mut rev = ms.clone();
                    rev.reverse();
                    prop_assert_eq!(place(&rev, &r).unwrap(), slots);
                }
            }
        }
    }
}
