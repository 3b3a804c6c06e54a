//! A spec's admission in the domain: [`check`], the spec's own rules on its value (the
//! text gate and a forwarded submit both end in it), and the sharing rules.
//!
//! The sharing rules a submit must pass before it enters the log, as a pure function of the
//! spec, its owner, the replicated state and the members' sizes ([`refuse`]); the API's
//! submit route asks and answers 400 or 403 naming the field.
//!
//! Refused, as (field, problem):
//!
//! - `priority` above the owner's ceiling (`quota set --max-priority`);
//! - `preemptible = false` when the owner may not refuse preemption: an admin may; a user
//!   may only once the admin allowed it (`quota set USER --may-refuse-preemption true`,
//!   [`Quota::refuses_preemption`]); a viewer never submits;
//! - a job that could never start on the members known now: a rank's cpus or GPUs more
//!   than the largest member has (`resources.cpus_per_worker`, `resources.gpus_per_worker`),
//!   or its floor (`min_workers`, `workers` for a rigid job) more ranks than all members
//!   together could hold (that field).
//!
//! Not refused: a job beyond its owner's quota plus borrowing. It waits with that reason;
//! quotas change. With no member known yet, nothing is refused for size.

use crate::{
    spec::{priority, JobKind, JobSpec},
    state::{quotas::Quota, users::Role, ControlState},
};

/// The spec's own rules, on its value: every field ([`crate::spec::check()`]) and,
/// for a search, its `[search]` and every trial it could make. The one check of a spec,
/// whether it was parsed from the API's text just before or forwarded by another node as
/// a value; the error names the field.
pub fn check(spec: &JobSpec) -> Result<(), ringleader_spec::FieldError> {
    crate::spec::check(spec)?;
    if spec.kind == JobKind::Search {
        crate::search::spec::validate(spec)?;
    }
    Ok(())
}

/// What a member offers, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberSize {
    /// Its cpus.
    pub cpus: u32,
    /// Its GPUs.
    pub gpus: u32,
}

/// What makes a submit forbidden rather than malformed (403, not 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The spec asks for what no member (or the cluster) could ever give, or a priority
    /// above the ceiling: 400.
    Spec,
    /// The owner's role does not allow what the spec asks (`preemptible = false`): 403.
    Role,
}

/// Why `spec` from `owner` (of `role`) is refused at submit: the kind, the field and the
/// problem; `members` are the members that could hold ranks (empty: none known yet).
pub fn refuse(
    spec: &JobSpec,
    owner: &str,
    role: Role,
    state: &ControlState,
    members: &[MemberSize],
) -> Option<(Refusal, &'static str, String)> {
    if let Some(ceiling) = state.max_priority_of(owner).filter(|c| spec.priority > *c) {
        return Some((
            Refusal::Spec,
            "priority",
            format!(
                "{} is above {owner}'s ceiling {} (quota set --max-priority)",
                spec.priority,
                priority::label(ceiling)
            ),
        ));
    }
    if !spec.preemptible && !may_refuse_preemption(owner, role, state) {
        return Some((
            Refusal::Role,
            "preemptible",
            format!(
                "{owner} may not refuse preemption: a user may only once the admin allows it \
                 (quota set {owner} --may-refuse-preemption true)"
            ),
        ));
    }
    never_fits(spec, members).map(|(field, problem)| (Refusal::Spec, field, problem))
}

/// Whether `owner` may submit `preemptible = false`: an admin always, a user once the admin
/// allowed it in its quota record.
pub fn may_refuse_preemption(owner: &str, role: Role, state: &ControlState) -> bool {
    role == Role::Admin
        || (role == Role::User
            && state
                .quotas
                .get(owner)
                .is_some_and(Quota::refuses_preemption))
}

/// Why `spec` could never start on `members`: a rank larger than the largest member, or a
/// floor of more ranks than all of them hold together.
fn never_fits(spec: &JobSpec, members: &[MemberSize]) -> Option<(&'static str, String)> {
    if members.is_empty() {
        return None;
    }
    let r = &spec.resources;
    let largest_cpus = members.iter().map(|m| m.cpus).max().unwrap_or(0);
    if r.cpus_per_worker > largest_cpus {
        return Some((
            "resources.cpus_per_worker",
            format!(
                "{} cpus per worker, but the largest member has {largest_cpus}: it could never start",
                r.cpus_per_worker
            ),
        ));
    }
    let largest_gpus = members.iter().map(|m| m.gpus).max().unwrap_or(0);
    if r.gpus_per_worker > largest_gpus {
        return Some((
            "resources.gpus_per_worker",
            format!(
                "{} GPUs per worker, but no member has more than {largest_gpus}: it could never start",
                r.gpus_per_worker
            ),
        ));
    }
    // Ranks each member could hold with nothing else on it.
    let fit: u64 = members
        .iter()
        .map(|m| {
            let by_cpus = m.cpus / r.cpus_per_worker.max(1);
            let by_gpus = m.gpus.checked_div(r.gpus_per_worker).unwrap_or(u32::MAX);
            u64::from(by_cpus.min(by_gpus))
        })
        .sum();
    let floor = spec.min_workers.min(spec.workers);
    if fit < u64::from(floor) {
        let field = if floor < spec.workers {
            "min_workers"
        } else {
            "workers"
        };
        let mut rank = format!("{} cpus", r.cpus_per_worker.max(1));
        if r.gpus_per_worker > 0 {
            rank.push_str(&format!(" and {} GPUs", r.gpus_per_worker));
        }
        return Some((
            field,
            format!(
                "{floor} ranks of {rank}, but all members together hold {fit}: it could never start"
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests;
