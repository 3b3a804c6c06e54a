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
//! - [`place_preferring`] tries one member first or keeps off one (a speculative copy runs
//!   away from its original); [`place_at_home`] keeps a search trial's next run on the
//!   member whose store holds its checkpoint while that member can take it; [`take`] counts
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

/// How many workers of `req` fit now on the alive, non-blacklisted `candidates` together.
pub fn room(candidates: &[Candidate], req: &Request) -> u64 {
    candidates
        .iter()
        .filter(|c| c.alive && !c.blacklisted)
        .map(|c| capacity(c, req))
        .sum()
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
pub struct Plural<'a>(pub u64, pub &'a str);

impl fmt::Display for Plural<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.0 == 1 { "" } else { "s" };
        write!(f, "{} {}{s}", self.0, self.1)
    }
}

/// Places a search trial's next run (a promotion, a run re-opened at its rung, a re-run) on
/// `home`, the member that ran its last run: what the trial saved with
/// `ringleader.checkpoint` (or a train trial's checkpoint) is in that member's store, and a
/// node's store is its own by default (`file://<data-dir>/store`), so elsewhere the run
/// would start over. While `home` is a candidate that could hold the run, the run waits for
/// room there (`Unplaceable`, saying so) rather than start elsewhere from nothing. Anywhere
/// when there is no home, when `home` is no candidate now (dead, left, blacklisted: what it
/// holds is out of reach, or in a shared store every member reads), or when `home` could
/// not hold the run even with nothing else on it.
pub fn place_at_home(
    candidates: &[Candidate],
    req: &Request,
    home: Option<&str>,
) -> Result<Vec<Slot>, Unplaceable> {
    let Some(h) = home.and_then(|h| candidates.iter().find(|c| c.id == h)) else {
        return place(candidates, req);
    };
    let idle = Candidate {
        used_cpus: 0,
        used_gpus: BTreeSet::new(),
        ..h.clone()
    };
    if !h.alive || h.blacklisted || capacity(&idle, req) < u64::from(req.workers) {
        return place(candidates, req);
    }
    place(std::slice::from_ref(h), req).map_err(|e| Unplaceable {
        reason: format!(
            "waits for room on {}, which holds its checkpoint: {}",
            h.name, e.reason
        ),
    })
}

/// Places a pending job: at `home` ([`place_at_home`]), and on members outside `avoid`
/// (where its program could not start) while it fits elsewhere; those are tried again
/// only when nothing else fits.
pub fn place_job(
    candidates: &[Candidate],
    req: &Request,
    home: Option<&str>,
    avoid: &BTreeSet<String>,
) -> Result<Vec<Slot>, Unplaceable> {
    if avoid.is_empty() {
        return place_at_home(candidates, req, home);
    }
    let elsewhere: Vec<Candidate> = candidates
        .iter()
        .cloned()
        .map(|mut c| {
            c.blacklisted |= avoid.contains(&c.id);
            c
        })
        .collect();
    place_at_home(&elsewhere, req, home).or_else(|_| place_at_home(candidates, req, home))
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
pub(crate) mod tests;
