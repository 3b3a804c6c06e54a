//! The chief: what the Raft leader decides for the cluster's jobs, and the loop that asks.
//!
//! [`decide`] is pure: from the replicated state, gossip's view of the members and the time
//! it returns the commands to propose: place a pending job (each rank with its own GPUs, see
//! [`placement`]), or record why it cannot be placed; for a running job that lost a rank (its member dead or left, its process exited
//! non-zero, its peers reported it hung, or it straggled for `straggler_window` steps),
//! re-form an elastic job's ring without it while at least `min_workers` remain (a straggler
//! is also blacklisted), else fail the attempt; grow an elastic job's ring by one available
//! member per generation while it is below `max_workers` (survivors keep their GPUs, a
//! joiner gets its member's lowest free ones; a command job of the ringleader protocol
//! starts its joiner first as a standby and re-forms once it is ready, see
//! `domain::state::standby`); start, promote and copy the trials
//! of searches and end them ([`search`]). [`driver`] runs it every
//! [`driver::CHIEF_PERIOD_MS`] while this node is chief, next to the voter upkeep, and
//! proposes what it returns; the state machine ignores a command that arrives stale, so a
//! decision made just before losing leadership is harmless.
//!
//! May use: `domain` (the state, specs), `control` (the handle), `cluster` (the member view). Used by:
//! the node's start-up only.

pub mod driver;
pub mod placement;
pub mod scheduler;
pub mod search;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::{
    cluster::{identity::peer_id_text, membership::State, net::MemberView},
    domain::state::{
        ops,
        preempt::{reranked, Stopping, STOP_REPORT_SLACK_MS},
        standby::Standby,
        ControlCommand, ControlState, Job, JobState, Op, Slot,
    },
};
use placement::{Candidate, Request};
use scheduler::Policy;

/// Most pending reasons the chief proposes in one pass, the first waiting jobs in start
/// order first (the rest follow in later passes): a queue that moves changes every waiting
/// job's place, and each change is a log entry.
pub const REASONS_PER_PASS_MAX: usize = 64;

/// What the chief should propose now, with the [`Policy::Fair`] scheduler. `new_secret`
/// draws a generation's ring secret (random in production, fixed in tests).
pub fn decide(
    state: &ControlState,
    members: &[MemberView],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    decide_with(Policy::Fair, state, members, now_ms, new_secret)
}

/// [`decide`] with the placement `policy` of `ringleader node --scheduler`.
pub fn decide_with(
    policy: Policy,
    state: &ControlState,
    members: &[MemberView],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    // One pass over the jobs (at 10 000 jobs, each pass is most of a settled decision).
    let (mut running_jobs, mut pending) = (Vec::new(), Vec::new());
    for job in state.jobs.values() {
        match job.state {
            JobState::Running => running_jobs.push(job),
            JobState::Pending => pending.push(job),
            _ => {}
        }
    }
    let mut candidates = candidates_of(state, &running_jobs, members, now_ms);
    let gone = gone(members);
    let mut out = Vec::new();
    match policy {
        Policy::Fifo => {
            for job in &running_jobs {
                out.extend(running(
                    job,
                    &gone,
                    &mut candidates,
                    now_ms,
                    new_secret,
                    None,
                ));
            }
            let held = held_for_others(&pending);
            out.extend(place_pending(
                &pending,
                &held,
                &mut candidates,
                now_ms,
                new_secret,
            ));
            let searches = running_jobs.iter().filter(|j| j.search.is_some());
            out.extend(search::decide(
                state,
                searches,
                &mut candidates,
                now_ms,
                new_secret,
            ));
        }
        Policy::Fair => {
            // Lost ranks and standbys first; growth only where the scheduler grants it.
            let mut settled = BTreeSet::new();
            for job in &running_jobs {
                let cmds = running(job, &gone, &mut candidates, now_ms, new_secret, Some(0));
                if cmds.is_empty() && job.standby.is_none() && lost_ranks(job, &gone).is_empty() {
                    settled.insert(job.id);
                }
                out.extend(cmds);
            }
            // What running searches want: their trials wait in the queue like jobs.
            let plans: Vec<(&Job, search::Plan)> = running_jobs
                .iter()
                .filter(|j| j.search.is_some())
                .filter_map(|j| Some((*j, search::plan(state, j, search::room(j, &candidates))?)))
                .collect();
            let decisions = {
                let mut queue = queue_view(state, &running_jobs, &pending, &settled, now_ms);
                queue.waiting.extend(trial_entries(&plans));
                let cluster = scheduler::ClusterView {
                    members: candidates,
                    quotas: &state.quotas,
                };
                scheduler::schedule(&cluster, &queue, now_ms)
            };
            candidates = decisions.left;
            let by_id = |id| state.job(id);
            let mut granted = search::Granted::default();
            let starting: BTreeSet<_> = decisions.starts.iter().map(|s| s.id).collect();
            for start in decisions.starts {
                if let Some(trial) = start.trial {
                    granted.slots.insert((start.id, trial), start.slots);
                    continue;
                }
                let Some(job) = by_id(start.id) else { continue };
                out.push(ControlCommand {
                    op: Op::Place(ops::Place {
                        id: job.id,
                        generation: job.generation + 1,
                        slots: start.slots,
                        secret: new_secret(),
                    }),
                    at_ms: now_ms,
                });
            }
            for grow in &decisions.grows {
                let Some(job) = by_id(grow.job) else { continue };
                if job.assignment.len() >= job.growth_ceiling() as usize {
                    // At a preemption's ceiling whose job no longer waits (a ring still held
                    // is no growth entry at all: `held_at_ceiling`): capacity returned lifts
                    // it, and the next pass re-forms with the joiners (`grown 2 → 4:
                    // capacity returned`).
                    out.push(ControlCommand {
                        op: Op::Grow(ops::Grow {
                            id: job.id,
                            to_workers: job.spec.max_workers,
                            reason: "capacity returned".into(),
                        }),
                        at_ms: now_ms,
                    });
                    continue;
                }
                // At most the ranks the scheduler granted (each within the owner's quota).
                let granted = (grow.to_workers as usize).saturating_sub(job.assignment.len());
                out.extend(running(
                    job,
                    &gone,
                    &mut candidates,
                    now_ms,
                    new_secret,
                    Some(granted),
                ));
            }
            let (trial_reasons, reasons): (Vec<_>, Vec<_>) = decisions
                .reasons
                .into_iter()
                .partition(|r| r.trial.is_some());
            for r in trial_reasons {
                granted.reasons.entry(r.id).or_insert(r.text);
            }
            // A job requeued for another is no entry of the scheduler's while that one
            // waits: its reason says so.
            let held = held_for_others(&pending).into_iter().filter_map(|id| {
                let for_job = by_id(id)?.preempted_for.filter(|f| !starting.contains(f))?;
                Some((id, format!("preempted for {for_job}, which still waits")))
            });
            let reasons = reasons.into_iter().map(|r| (r.id, r.text)).chain(held);
            let changed = reasons.filter_map(|(id, text)| {
                let job = by_id(id)?;
                (job.pending_reason.as_deref() != Some(text.as_str())).then(|| ControlCommand {
                    op: Op::Unplaceable(ops::Unplaceable {
                        id,
                        quiet: job.pending_reason.is_some(),
                        reason: text,
                    }),
                    at_ms: now_ms,
                })
            });
            out.extend(changed.take(REASONS_PER_PASS_MAX));
            out.extend(execute_preemptions(
                state,
                &decisions.preempt,
                now_ms,
                new_secret,
            ));
            out.extend(search::decide_granted(
                state,
                &plans,
                granted,
                &mut candidates,
                now_ms,
                new_secret,
            ));
        }
    }
    out
}

/// The scheduler's entries for what running searches want: one per wanted trial, at the
/// search's priority, owner and submit time, each a gang of the search's `workers`, a
/// promotion at its trial's home.
fn trial_entries<'a>(plans: &'a [(&'a Job, search::Plan)]) -> Vec<scheduler::Waiting<'a>> {
    static NO_MEMBERS: BTreeSet<String> = BTreeSet::new();
    plans
        .iter()
        .flat_map(|(job, plan)| {
            plan.wants
                .iter()
                .enumerate()
                .map(move |(i, want)| scheduler::Waiting {
                    id: job.id,
                    owner: &job.owner,
                    priority: job.spec.priority,
                    submitted_at_ms: job.submitted_at_ms,
                    request: plan.request,
                    min_workers: plan.request.workers,
                    home: want.home(),
                    avoid: &NO_MEMBERS,
                    trial: Some(i as u32),
                })
        })
        .collect()
}

/// Members as placement sees them: alive or not, blacklisted or not, with what running jobs
/// hold; in (name, id) order.
#[cfg(test)]
fn candidates(state: &ControlState, members: &[MemberView], now_ms: u64) -> Vec<Candidate> {
    let running: Vec<&Job> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Running)
        .collect();
    candidates_of(state, &running, members, now_ms)
}

/// [`candidates`] given the running jobs.
fn candidates_of(
    state: &ControlState,
    running: &[&Job],
    members: &[MemberView],
    now_ms: u64,
) -> Vec<Candidate> {
    // What running jobs hold, by member, as `ControlState::used_resources` counts it but
    // keyed by borrowed ids: that one allocates a key per slot, which at 10 000 jobs was
    // most of a settled decision's time.
    let mut used: HashMap<&str, (u32, BTreeSet<u32>), foldhash::fast::RandomState> =
        HashMap::default();
    for job in running {
        let standby = job.standby.as_ref().map(|s| &s.slot);
        for slot in job.assignment.iter().chain(standby) {
            let held = used.entry(slot.member.as_str()).or_default();
            held.0 = held.0.saturating_add(job.spec.resources.cpus_per_worker);
            held.1.extend(&slot.gpus);
        }
    }
    let mut candidates: Vec<Candidate> = members
        .iter()
        .map(|m| {
            let id = peer_id_text(&m.id);
            let (used_cpus, used_gpus) = used.remove(id.as_str()).unwrap_or_default();
            let removed = state.is_removed(&id);
            Candidate {
                blacklisted: state.is_blacklisted(&id, now_ms),
                id,
                name: m.meta.name.clone(),
                // A member an operator removed is never given a rank (`domain::state::removal`).
                alive: m.state == State::Alive && !removed,
                cpus: m.meta.cpus,
                gpus: m.meta.gpus.iter().map(|g| g.index).collect(),
                used_cpus,
                used_gpus,
            }
        })
        .collect();
    candidates.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
    candidates
}

/// A rank the current generation lost, and why (the history's reason).
struct Lost<'a> {
    slot: &'a Slot,
    reason: String,
    straggler: bool,
}

/// Members dead or left, by id, with that state's name. Built once per decision and looked
/// up for every running job's ranks, rather than built again per job (jobs × members).
fn gone(members: &[MemberView]) -> BTreeMap<String, &'static str> {
    members
        .iter()
        .filter(|m| matches!(m.state, State::Dead | State::Left))
        .map(|m| (peer_id_text(&m.id), m.state.as_str()))
        .collect()
}

/// The ranks of `job`'s current generation that are lost, in rank order.
fn lost_ranks<'a>(job: &'a Job, gone: &BTreeMap<String, &str>) -> Vec<Lost<'a>> {
    let elastic = &job.spec.elastic;
    let mut lost = Vec::new();
    for slot in &job.assignment {
        // Formatted only for a lost rank: this loop visits every rank of every running job.
        let who = || format!("{} (rank {})", slot.name, slot.rank);
        let straggling = job.rank_stats.get(&slot.rank).filter(|s| {
            s.slow_since_step.is_some_and(|since| {
                s.step.saturating_sub(since) >= u64::from(elastic.straggler_window)
            })
        });
        let (reason, straggler) = if let Some(state) = gone.get(&slot.member) {
            (format!("peer-lost {}: member {state}", who()), false)
        } else if let Some(code) = job.exits.get(&slot.rank).filter(|c| **c != 0) {
            (
                format!("peer-lost {}: exited with code {code}", who()),
                false,
            )
        } else if let Some(seen) = job.suspects.get(&slot.rank) {
            let kind = if seen.hung { "hung" } else { "peer-lost" };
            (format!("{kind} {}: {}", who(), seen.reason), false)
        } else if let Some(stat) = straggling {
            let reason = format!(
                "straggler {}: {:.1} ms of compute per step, over {}x the ring's median for {} steps",
                who(),
                stat.compute_ms, elastic.straggler_factor, elastic.straggler_window
            );
            (reason, true)
        } else {
            continue;
        };
        lost.push(Lost {
            slot,
            reason,
            straggler,
        });
    }
    lost
}

/// How many joiners a growing `job` takes in one re-form: after a grow (`ringleader job
/// grow`, capacity returned), as many as it lacks below its ceiling; else one per
/// generation.
fn joiners_wanted(job: &Job) -> usize {
    let growing = job.preemption.as_ref().and_then(|p| p.growing.as_deref());
    let lacks = (job.growth_ceiling() as usize).saturating_sub(job.assignment.len());
    match (growing, job.stages_joiners()) {
        (Some(_), false) => lacks.max(1),
        _ => 1,
    }
}

/// What a running job needs: nothing, a re-form (elastic jobs), or a failed attempt; growth
/// by at most `grow` joiners (`None`: as many as it wants, `joiners_wanted`).
fn running(
    job: &Job,
    gone: &BTreeMap<String, &'static str>,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
    grow: Option<usize>,
) -> Vec<ControlCommand> {
    if let Some(stopping) = &job.stopping {
        return stopping_ranks(job, stopping, gone, now_ms);
    }
    let lost = lost_ranks(job, gone);
    if !lost.is_empty() {
        return shrink(job, &lost, now_ms, new_secret);
    }
    if let Some(standby) = &job.standby {
        return join_standby(job, standby, gone, candidates, now_ms, new_secret);
    }
    // Growth: an elastic ring below max_workers (or a preemption's ceiling) takes one
    // available member per generation; after a grow, as many as it lacks at once.
    let ceiling = job.growth_ceiling() as usize;
    let wanted = joiners_wanted(job).min(grow.unwrap_or(usize::MAX));
    if wanted == 0 || !job.is_elastic() || job.assignment.len() >= ceiling {
        return Vec::new();
    }
    let growing = job.preemption.as_ref().and_then(|p| p.growing.as_deref());
    let req = Request::from_spec(&job.spec);
    let mut joined: Vec<Slot> = Vec::new();
    for worker in (job.next_worker..).take(wanted) {
        let joiner = candidates.iter_mut().find(|c| {
            c.alive
                && !c.blacklisted
                && !job.assignment.iter().any(|s| s.member == c.id)
                && !joined.iter().any(|s| s.member == c.id)
                && job.departed.get(&c.id).is_none_or(|at| {
                    now_ms.saturating_sub(*at) >= job.spec.elastic.rejoin_after_ms()
                })
                && c.cpus.saturating_sub(c.used_cpus) >= req.cpus_per_worker
                && placement::free_gpus(c).len() >= req.gpus_per_worker as usize
        });
        let Some(joiner) = joiner else {
            break;
        };
        let gpus: Vec<u32> = placement::free_gpus(joiner)
            .into_iter()
            .take(req.gpus_per_worker as usize)
            .collect();
        joiner.used_cpus += req.cpus_per_worker;
        joiner.used_gpus.extend(&gpus);
        joined.push(Slot {
            member: joiner.id.clone(),
            name: joiner.name.clone(),
            rank: 0,
            local_rank: 0,
            worker,
            gpus,
        });
    }
    let Some(new) = joined.first().cloned() else {
        return Vec::new();
    };
    if job.stages_joiners() {
        // Started ahead, with the rank it would take now: the ring goes on meanwhile.
        let slot = reranked(job.assignment.iter().cloned().chain([new]))
            .pop()
            .expect("the joiner's slot");
        return vec![ControlCommand {
            op: Op::Standby(ops::Standby {
                id: job.id,
                generation: job.generation,
                slot,
            }),
            at_ms: now_ms,
        }];
    }
    let (from, to) = (job.assignment.len(), job.assignment.len() + joined.len());
    let names: Vec<&str> = joined.iter().map(|s| s.name.as_str()).collect();
    let reason = match growing {
        Some(why) => format!("grown {from} → {to}: {why} (joined {})", names.join(", ")),
        None => format!("joined {}", names.join(", ")),
    };
    vec![ControlCommand {
        op: Op::Reform(ops::Reform {
            id: job.id,
            generation: job.generation + 1,
            slots: reranked(job.assignment.iter().cloned().chain(joined)),
            secret: new_secret(),
            reason,
        }),
        at_ms: now_ms,
    }]
}

/// A job asked to checkpoint and stop for a preemption's requeue
/// (`domain::state::preempt`): nothing to re-form or grow; the state machine requeues it
/// when every rank has reported its exit. Once the grace and the report slack are over, or
/// when a rank's member is gone (its exit will never come), the attempt ends here (the
/// state machine requeues it all the same: no restart used).
fn stopping_ranks(
    job: &Job,
    stopping: &Stopping,
    gone: &BTreeMap<String, &'static str>,
    now_ms: u64,
) -> Vec<ControlCommand> {
    let member_gone = job
        .assignment
        .iter()
        .find(|s| !job.exits.contains_key(&s.rank) && gone.contains_key(&s.member));
    let reason = match member_gone {
        Some(s) => format!("rank {} on {} gone", s.rank, s.name),
        None if now_ms >= stopping.overdue_at_ms() => format!(
            "{} of {} ranks reported no exit {} s past the grace",
            job.assignment.len() - job.exits.len(),
            job.assignment.len(),
            STOP_REPORT_SLACK_MS / 1_000
        ),
        None => return Vec::new(),
    };
    vec![ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed {
            id: job.id,
            generation: job.generation,
            reason,
        }),
        at_ms: now_ms,
    }]
}

/// Whether a running job's ring may take one more member: elastic, below `max_workers`.
fn may_grow(job: &Job) -> bool {
    job.is_elastic() && job.assignment.len() < job.spec.max_workers as usize
}

/// Whether `job`'s ring is held at a preemption's ceiling: shrunk for a job that still
/// waits, or by an admin's shrink for no job (which stays until the admin grows it). Such
/// a ring does not grow, so it is no growth entry of the scheduler: an entry goes before
/// waiting jobs of its priority and takes a rank's room in the pass, and room taken by a
/// growth the chief then drops stayed idle while those jobs (the one the shrink was for
/// among them) waited `waiting for 3 cpus: 0 free` (bench-sharing, 2026-12-07).
fn held_at_ceiling(state: &ControlState, job: &Job) -> bool {
    if job.assignment.len() < job.growth_ceiling() as usize {
        return false;
    }
    let served = job
        .preemption
        .as_ref()
        .and_then(|p| p.for_job)
        .is_some_and(|f| state.job(f).is_none_or(|j| j.state != JobState::Pending));
    !served
}

/// The pending jobs held back for another: a job requeued for another waits while that one
/// does (the capacity is its), unless that one was itself requeued for something since: a
/// claim on capacity ends when its holder is preempted, so two jobs requeued for each other
/// (a borrower taken back for a job within its quota, which it then preempted by priority)
/// never hold each other forever.
fn held_for_others(pending: &[&Job]) -> BTreeSet<crate::domain::state::JobId> {
    let waiting: BTreeMap<_, &Job> = pending.iter().map(|j| (j.id, *j)).collect();
    pending
        .iter()
        .filter(|job| {
            job.preempted_for
                .and_then(|f| waiting.get(&f))
                .is_some_and(|requester| requester.preempted_for.is_none())
        })
        .map(|job| job.id)
        .collect()
}

/// The scheduler's view of the queue: `pending` jobs, running jobs that hold ranks (those in
/// `settled`, with nothing lost or staged, may grow), and the GPU time of owners with a
/// GPU-hours budget.
fn queue_view<'a>(
    state: &'a ControlState,
    running: &[&'a Job],
    pending: &[&'a Job],
    settled: &BTreeSet<crate::domain::state::JobId>,
    now_ms: u64,
) -> scheduler::QueueView<'a> {
    let held = held_for_others(pending);
    let waiting = pending
        .iter()
        .filter(|job| !held.contains(&job.id))
        .map(|job| scheduler::Waiting {
            id: job.id,
            owner: &job.owner,
            priority: job.spec.priority,
            submitted_at_ms: job.submitted_at_ms,
            request: Request::from_spec(&job.spec),
            min_workers: job.spec.min_workers.min(job.spec.workers),
            home: home_of(job),
            avoid: &job.cannot_start,
            trial: None,
        })
        .collect();
    let running = running
        .iter()
        .filter(|job| !job.assignment.is_empty())
        .map(|job| {
            let recent = job
                .departed
                .iter()
                .filter(|(_, at)| now_ms.saturating_sub(**at) < job.spec.elastic.rejoin_after_ms())
                .map(|(m, _)| m.as_str());
            let started_at_ms = job
                .events
                .iter()
                .rev()
                .find(|e| e.what == crate::domain::state::EventKind::Placed)
                .map_or(job.submitted_at_ms, |e| e.at_ms);
            scheduler::Running {
                id: job.id,
                owner: &job.owner,
                priority: job.spec.priority,
                slots: &job.assignment,
                cpus_per_worker: job.spec.resources.cpus_per_worker,
                gpus_per_worker: job.spec.resources.gpus_per_worker,
                min_workers: job.spec.min_workers,
                // Shrinkable in place: a ring that keeps its ranks through re-forms (else
                // a preemption requeues it).
                elastic: job.is_elastic() && job.spec.keeps_ranks_through_reforms(),
                may_grow: settled.contains(&job.id)
                    && may_grow(job)
                    && !held_at_ceiling(state, job),
                grow_by: joiners_wanted(job) as u32,
                joiners_exclude: job
                    .assignment
                    .iter()
                    .map(|s| s.member.as_str())
                    .chain(recent)
                    .collect(),
                trial_of: job.trial_of.as_ref().map(|t| t.search),
                preemptible: job.spec.preemptible,
                started_at_ms,
                stopping: job.stopping.as_ref().map(|s| s.for_job),
            }
        })
        .collect();
    let gpu_ms = crate::domain::queue::gpu_ms_by_owner(state, now_ms);
    scheduler::QueueView {
        waiting,
        running,
        gpu_ms,
    }
}

/// The scheduler's preemption requests carried out by the mechanism
/// ([`crate::domain::preempt::execute`]: a shrink at a step boundary, a checkpointed
/// requeue, paused trials), one log entry per job. A request asked again while its victim
/// is being stopped, or decided on a view the state has left behind, is refused there and
/// dropped here (the next pass decides again).
fn execute_preemptions(
    state: &ControlState,
    requests: &[scheduler::Preempt],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    use crate::domain::preempt::{execute, Preempt, PreemptAction};
    let mut out = Vec::new();
    for r in requests {
        let action = match r.action {
            scheduler::Action::Shrink { to_workers } => PreemptAction::Shrink { to_workers },
            scheduler::Action::Requeue => PreemptAction::Requeue,
            scheduler::Action::PauseTrials { count } => PreemptAction::PauseTrials { count },
        };
        let ask = Preempt {
            victim: r.victim,
            action,
            for_job: Some(r.for_job),
            reason: None,
        };
        match execute(state, &ask, now_ms, new_secret) {
            Ok(cmds) => out.extend(cmds),
            Err(e) => {
                tracing::debug!(victim = %r.victim, for_job = %r.for_job, "preemption not made: {e}")
            }
        }
    }
    out
}

/// A running job with a standby joiner ([`crate::domain::state::standby`]): re-form with it
/// once it is ready, drop it when its member is gone (dead, left, removed, blacklisted) or
/// the ring is full; otherwise wait.
fn join_standby(
    job: &Job,
    standby: &Standby,
    gone: &BTreeMap<String, &'static str>,
    candidates: &[Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let slot = &standby.slot;
    let unavailable = match gone.get(&slot.member) {
        Some(state) => Some(format!("member {state}")),
        None => candidates
            .iter()
            .find(|c| c.id == slot.member)
            .filter(|c| !c.alive || c.blacklisted)
            .map(|c| {
                let why = if c.blacklisted {
                    "blacklisted"
                } else {
                    "not alive"
                };
                format!("member {why}")
            }),
    };
    let full = job.assignment.len() >= job.spec.max_workers as usize;
    let dropped = unavailable.or_else(|| full.then(|| "the ring is full".to_owned()));
    if let Some(reason) = dropped {
        return vec![ControlCommand {
            op: Op::StandbyDropped(ops::StandbyDropped {
                id: job.id,
                worker: slot.worker,
                reason,
            }),
            at_ms: now_ms,
        }];
    }
    if !standby.ready {
        return Vec::new();
    }
    let n = job.assignment.len();
    let reason = match job.preemption.as_ref().and_then(|p| p.growing.as_deref()) {
        Some(why) => format!("grown {n} → {}: {why} (joined {})", n + 1, slot.name),
        None => format!("joined {}", slot.name),
    };
    vec![ControlCommand {
        op: Op::Reform(ops::Reform {
            id: job.id,
            generation: job.generation + 1,
            slots: reranked(job.assignment.iter().cloned().chain([slot.clone()])),
            secret: new_secret(),
            reason,
        }),
        at_ms: now_ms,
    }]
}

/// A job that lost ranks: an elastic one re-forms without them (blacklisting stragglers)
/// while `min_workers` remain; otherwise the attempt fails, except for stragglers alone,
/// which stay in the ring rather than go below `min_workers`.
fn shrink(
    job: &Job,
    lost: &[Lost<'_>],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let survivors = job.assignment.len() - lost.len();
    let reason = lost
        .iter()
        .map(|l| l.reason.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if job.is_elastic() && survivors >= job.spec.min_workers as usize {
        let mut out: Vec<ControlCommand> = lost
            .iter()
            .filter(|l| l.straggler)
            .map(|l| ControlCommand {
                op: Op::Blacklist(ops::Blacklist {
                    member: l.slot.member.clone(),
                    name: l.slot.name.clone(),
                    cooldown_ms: u64::from(job.spec.elastic.blacklist_cooldown_s) * 1_000,
                    reason: format!("job {}: {}", job.id, l.reason),
                }),
                at_ms: now_ms,
            })
            .collect();
        let keep = job
            .assignment
            .iter()
            .filter(|s| !lost.iter().any(|l| l.slot.rank == s.rank))
            .cloned();
        out.push(ControlCommand {
            op: Op::Reform(ops::Reform {
                id: job.id,
                generation: job.generation + 1,
                slots: reranked(keep),
                secret: new_secret(),
                reason,
            }),
            at_ms: now_ms,
        });
        return out;
    }
    if lost.iter().all(|l| l.straggler) {
        return Vec::new();
    }
    vec![ControlCommand {
        op: Op::AttemptFailed(ops::AttemptFailed {
            id: job.id,
            generation: job.generation,
            reason,
        }),
        at_ms: now_ms,
    }]
}

/// Places every pending job that fits, in job order; later jobs of the round see the
/// resources of earlier ones as taken. A job that does not fit gets its reason recorded
/// once (not again while the reason is the same).
fn place_pending(
    pending: &[&Job],
    held: &BTreeSet<crate::domain::state::JobId>,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    for job in pending {
        if held.contains(&job.id) {
            continue;
        }
        let req = Request::from_spec(&job.spec);
        let placed = placement::place_job(candidates, &req, home_of(job), &job.cannot_start);
        match placed {
            Ok(slots) => {
                placement::take(candidates, &slots, &req);
                out.push(ControlCommand {
                    op: Op::Place(ops::Place {
                        id: job.id,
                        generation: job.generation + 1,
                        slots,
                        secret: new_secret(),
                    }),
                    at_ms: now_ms,
                });
            }
            Err(e) if job.pending_reason.as_deref() == Some(e.reason.as_str()) => {}
            Err(e) => out.push(ControlCommand {
                op: Op::Unplaceable(ops::Unplaceable {
                    id: job.id,
                    reason: e.reason,
                    quiet: false,
                }),
                at_ms: now_ms,
            }),
        }
    }
    out
}

/// Where a trial's job runs again: the member its last run was on, whose store holds its
/// checkpoint (`placement::place_at_home`); `None` for other jobs.
fn home_of(job: &Job) -> Option<&str> {
    job.trial_of
        .as_ref()
        .and_then(|_| job.assignment.first())
        .map(|s| s.member.as_str())
}

#[cfg(test)]
pub(crate) mod tests;
