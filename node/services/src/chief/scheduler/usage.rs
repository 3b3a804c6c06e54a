//! What owners use and may use, for [`super::schedule`]: the [`Ledger`] of running ranks per
//! account (a user, and its group `@GROUP` when that has a quota) against quotas and borrow
//! limits; the [`Claims`] of unused quota by owners with waiting work, which borrowing may
//! not take; the [`Room`] the cluster will have once running work ends, where reservations
//! are made.

use std::collections::BTreeMap;

use super::{Running, Waiting};
use crate::chief::placement::{self, Candidate, Plural, Request, Slot};
use crate::domain::{
    queue,
    state::quotas::{Quota, GROUP_PREFIX},
};

pub use crate::domain::queue::Usage;

/// What `ranks` ranks of `req` hold.
pub fn of(req: &Request, ranks: u64) -> Usage {
    Usage {
        cpus: ranks * u64::from(req.cpus_per_worker),
        gpus: ranks * u64::from(req.gpus_per_worker),
    }
}

/// The cluster's cpus and GPUs on alive members that are not blacklisted.
pub fn totals(members: &[Candidate]) -> Usage {
    members
        .iter()
        .filter(|c| c.alive && !c.blacklisted)
        .fold(Usage::default(), |t, c| Usage {
            cpus: t.cpus + u64::from(c.cpus),
            gpus: t.gpus + c.gpus.len() as u64,
        })
}

/// What is free on alive members that are not blacklisted.
pub fn free(members: &[Candidate]) -> Usage {
    members
        .iter()
        .filter(|c| c.alive && !c.blacklisted)
        .fold(Usage::default(), |t, c| Usage {
            cpus: t.cpus + u64::from(c.cpus.saturating_sub(c.used_cpus)),
            gpus: t.gpus + placement::free_gpus(c).len() as u64,
        })
}

/// The accounts `owner`'s ranks count against: itself, and its group when the group has a
/// quota record.
pub fn accounts(owner: &str, quotas: &BTreeMap<String, Quota>) -> Vec<String> {
    let mut out = vec![owner.to_owned()];
    if let Some(g) = quotas.get(owner).and_then(|q| q.group.as_deref()) {
        let group = format!("{GROUP_PREFIX}{g}");
        if quotas.contains_key(&group) {
            out.push(group);
        }
    }
    out
}

/// An account's limits: quota plus borrow limit per resource (`None`: unlimited), and its
/// quota (0 without a record).
fn limits(account: &str, quotas: &BTreeMap<String, Quota>) -> (Usage, Option<u64>, Option<u64>) {
    let q = quotas.get(account);
    let nominal = Usage {
        cpus: q.and_then(|q| q.cpus).map_or(0, u64::from),
        gpus: q.and_then(|q| q.gpus).map_or(0, u64::from),
    };
    let cpus = q
        .and_then(|q| q.borrow_cpus)
        .map(|b| nominal.cpus + u64::from(b));
    let gpus = q
        .and_then(|q| q.borrow_gpus)
        .map(|b| nominal.gpus + u64::from(b));
    (nominal, cpus, gpus)
}

/// Running ranks per account, kept current through a pass.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    used: BTreeMap<String, Usage>,
}

impl Ledger {
    /// The usage of `running` jobs.
    pub fn of<'a>(
        running: impl IntoIterator<Item = &'a Running<'a>>,
        quotas: &BTreeMap<String, Quota>,
    ) -> Ledger {
        let mut ledger = Ledger::default();
        for r in running {
            let req = Request {
                workers: r.slots.len() as u32,
                cpus_per_worker: r.cpus_per_worker,
                gpus_per_worker: r.gpus_per_worker,
                placement: crate::domain::spec::Placement::Spread,
            };
            ledger.add(r.owner, &req, quotas);
        }
        ledger
    }

    /// What `account` runs.
    pub fn used(&self, account: &str) -> Usage {
        self.used.get(account).copied().unwrap_or_default()
    }

    /// Counts `req.workers` ranks of `owner`.
    pub fn add(&mut self, owner: &str, req: &Request, quotas: &BTreeMap<String, Quota>) {
        let add = of(req, u64::from(req.workers));
        for account in accounts(owner, quotas) {
            let u = self.used.entry(account).or_default();
            u.cpus += add.cpus;
            u.gpus += add.gpus;
        }
    }

    /// Takes `ranks` ranks of `req` off `owner`'s usage (a preemption's simulation).
    pub fn remove(
        &mut self,
        owner: &str,
        req: &Request,
        ranks: u64,
        quotas: &BTreeMap<String, Quota>,
    ) {
        let sub = of(req, ranks);
        for account in accounts(owner, quotas) {
            let u = self.used.entry(account).or_default();
            u.cpus = u.cpus.saturating_sub(sub.cpus);
            u.gpus = u.gpus.saturating_sub(sub.gpus);
        }
    }

    /// Most ranks of `w`'s request its owner's quotas plus borrow limits allow now.
    pub fn ranks_allowed(&self, w: &Waiting<'_>, quotas: &BTreeMap<String, Quota>) -> u64 {
        self.ranks_allowed_for(w.owner, &w.request, quotas)
    }

    fn ranks_allowed_for(
        &self,
        owner: &str,
        req: &Request,
        quotas: &BTreeMap<String, Quota>,
    ) -> u64 {
        let mut most = u64::MAX;
        for account in accounts(owner, quotas) {
            let used = self.used(&account);
            let (_, cpus, gpus) = limits(&account, quotas);
            if let Some(limit) = cpus {
                most = most
                    .min(limit.saturating_sub(used.cpus) / u64::from(req.cpus_per_worker.max(1)));
            }
            if let (Some(limit), true) = (gpus, req.gpus_per_worker > 0) {
                most = most.min(limit.saturating_sub(used.gpus) / u64::from(req.gpus_per_worker));
            }
        }
        most
    }

    /// Whether `owner` may run `req.workers` more ranks of `req`.
    pub fn may_add(&self, owner: &str, req: &Request, quotas: &BTreeMap<String, Quota>) -> bool {
        self.ranks_allowed_for(owner, req, quotas) >= u64::from(req.workers)
    }

    /// Why `w` waits for its owner's quota: the first account and resource whose limit its
    /// floor would pass.
    pub fn quota_reason(&self, w: &Waiting<'_>, quotas: &BTreeMap<String, Quota>) -> String {
        let need = of(&w.request, u64::from(w.min_workers));
        for account in accounts(w.owner, quotas) {
            let used = self.used(&account);
            let (_, cpus, gpus) = limits(&account, quotas);
            for (what, need, used, limit) in [
                ("cpus", need.cpus, used.cpus, cpus),
                ("gpus", need.gpus, used.gpus, gpus),
            ] {
                if let Some(limit) = limit.filter(|l| need > 0 && used + need > *l) {
                    let need = Plural(need, &what[..what.len() - 1]);
                    return format!(
                        "waiting for {need}: {account}'s quota {used}/{limit} {what} in use"
                    );
                }
            }
        }
        format!("waiting for {}'s quota", w.owner)
    }

    /// What `req.workers` more ranks of `owner` would borrow: the part above its quota not
    /// borrowed already.
    pub fn borrowed_by(
        &self,
        owner: &str,
        req: &Request,
        quotas: &BTreeMap<String, Quota>,
    ) -> Usage {
        let used = self.used(owner);
        let (nominal, _, _) = limits(owner, quotas);
        let add = of(req, u64::from(req.workers));
        let over = |used: u64, quota: u64| used.saturating_sub(quota);
        Usage {
            cpus: over(used.cpus + add.cpus, nominal.cpus) - over(used.cpus, nominal.cpus),
            gpus: over(used.gpus + add.gpus, nominal.gpus) - over(used.gpus, nominal.gpus),
        }
    }

    /// Whether `owner` runs more than its quota of either resource.
    pub fn borrowing(&self, owner: &str, quotas: &BTreeMap<String, Quota>) -> bool {
        let used = self.used(owner);
        let (nominal, _, _) = limits(owner, quotas);
        used.cpus > nominal.cpus || used.gpus > nominal.gpus
    }

    /// `owner`'s dominant share of the cluster per weight, in millionths.
    pub fn dominant_share_ppm(
        &self,
        owner: &str,
        totals: &Usage,
        quotas: &BTreeMap<String, Quota>,
    ) -> u64 {
        queue::dominant_share_ppm(self.used(owner), *totals, queue::weight_of(owner, quotas))
    }
}

/// A waiting job, or a search's trial entry ([`Waiting::trial`]).
pub type Claimant = (crate::domain::state::JobId, Option<u32>);

/// The unused quota of owners with waiting work: borrowing may not take it.
///
/// Only waiting jobs that fit their owner's nominal quota now (they borrow nothing, so no
/// claim can hold them back) claim, and only what they ask for: claims thus never hold
/// each other up, and every claim ends when its job starts.
#[derive(Debug, Clone, Default)]
pub struct Claims {
    /// Claiming jobs (and searches' trial entries) per owner: what each asks for (its
    /// floor).
    waiting: BTreeMap<String, BTreeMap<Claimant, Usage>>,
}

impl Claims {
    /// The claims of `waiting` jobs that fit the idle cluster and their owner's nominal
    /// quota beside what it runs (`ledger`).
    pub fn of<'a>(
        waiting: impl IntoIterator<Item = &'a Waiting<'a>>,
        members: &[Candidate],
        ledger: &Ledger,
        quotas: &BTreeMap<String, Quota>,
    ) -> Claims {
        let mut claims = Claims::default();
        let idle: Vec<Candidate> = members
            .iter()
            .map(|c| Candidate {
                used_cpus: 0,
                used_gpus: Default::default(),
                ..c.clone()
            })
            .collect();
        for w in waiting.into_iter().filter(|w| quotas.contains_key(w.owner)) {
            let floor = w.floor();
            let borrows = ledger.borrowed_by(w.owner, &floor, quotas) != Usage::default();
            if !borrows && placement::room(&idle, &floor) >= u64::from(w.min_workers) {
                claims
                    .waiting
                    .entry(w.owner.to_owned())
                    .or_default()
                    .insert((w.id, w.trial), of(&floor, u64::from(w.min_workers)));
            }
        }
        claims
    }

    /// `id` started: its claim ends.
    pub fn started(&mut self, owner: &str, id: Claimant) {
        if let Some(jobs) = self.waiting.get_mut(owner) {
            jobs.remove(&id);
        }
    }

    /// Why `owner` may not start `req.workers` ranks of `req` that borrow: together with
    /// the part within its quota (which comes from the same free room), they would take
    /// what others' unused quotas claim. A request that borrows nothing is never refused
    /// here (its owner's quota is its own).
    pub fn refuses(
        &self,
        owner: &str,
        req: &Request,
        now: &[Candidate],
        ledger: &Ledger,
        quotas: &BTreeMap<String, Quota>,
    ) -> Option<String> {
        let borrowed = ledger.borrowed_by(owner, req, quotas);
        if borrowed == Usage::default() {
            return None;
        }
        let total = of(req, u64::from(req.workers));
        let mut claimed = Usage::default();
        for (claimant, jobs) in self.waiting.iter().filter(|(o, _)| *o != owner) {
            let used = ledger.used(claimant);
            let (nominal, _, _) = limits(claimant, quotas);
            let asked = jobs.values().fold(Usage::default(), |t, u| Usage {
                cpus: t.cpus + u.cpus,
                gpus: t.gpus + u.gpus,
            });
            claimed.cpus += nominal.cpus.saturating_sub(used.cpus).min(asked.cpus);
            claimed.gpus += nominal.gpus.saturating_sub(used.gpus).min(asked.gpus);
        }
        let free = free(now);
        // Per resource it borrows: the whole request must leave the claims free.
        for (what, borrows, total, free, claimed) in [
            ("cpus", borrowed.cpus, total.cpus, free.cpus, claimed.cpus),
            ("gpus", borrowed.gpus, total.gpus, free.gpus, claimed.gpus),
        ] {
            if borrows > 0 && total > free.saturating_sub(claimed) {
                let one = &what[..what.len() - 1];
                let all = match total > borrows {
                    true => format!(" ({} in all)", Plural(total, one)),
                    false => String::new(),
                };
                let borrows = Plural(borrows, one);
                return Some(format!(
                    "waiting to borrow {borrows}{all}: {free} free, {claimed} claimed by others' quotas"
                ));
            }
        }
        None
    }
}

/// Per member, what will be free once running work ends, less this pass's starts and
/// reservations: counts only (which devices is decided at the start).
#[derive(Debug, Clone)]
pub struct Room {
    /// (id, name, cpus, GPUs), alive and not blacklisted members only, in (name, id) order.
    members: Vec<(String, String, u32, u32)>,
}

impl Room {
    /// The whole of every alive member that is not blacklisted.
    pub fn idle(members: &[Candidate]) -> Room {
        Room {
            members: members
                .iter()
                .filter(|c| c.alive && !c.blacklisted)
                .map(|c| (c.id.clone(), c.name.clone(), c.cpus, c.gpus.len() as u32))
                .collect(),
        }
    }

    /// Takes `slots` of `req`.
    pub fn take(&mut self, slots: &[Slot], req: &Request) {
        for slot in slots {
            if let Some(m) = self.members.iter_mut().find(|m| m.0 == slot.member) {
                m.2 = m.2.saturating_sub(req.cpus_per_worker);
                m.3 = m.3.saturating_sub(slot.gpus.len() as u32);
            }
        }
    }

    /// Reserves `req` here, if it fits, and holds as much on `now`'s members (cpus, and
    /// that many of their free GPUs), so later jobs of the pass leave it: whether it fit.
    pub fn reserve(&mut self, now: &mut [Candidate], req: &Request) -> bool {
        let as_candidates: Vec<Candidate> = self
            .members
            .iter()
            .map(|(id, name, cpus, gpus)| Candidate {
                id: id.clone(),
                name: name.clone(),
                alive: true,
                blacklisted: false,
                cpus: *cpus,
                gpus: (0..*gpus).collect(),
                used_cpus: 0,
                used_gpus: Default::default(),
            })
            .collect();
        let Ok(slots) = placement::place(&as_candidates, req) else {
            return false;
        };
        self.take(&slots, req);
        for slot in &slots {
            if let Some(c) = now.iter_mut().find(|c| c.id == slot.member) {
                c.used_cpus = c.used_cpus.saturating_add(req.cpus_per_worker);
                let held: Vec<u32> = placement::free_gpus(c)
                    .into_iter()
                    .take(slot.gpus.len())
                    .collect();
                c.used_gpus.extend(held);
            }
        }
        true
    }
}
