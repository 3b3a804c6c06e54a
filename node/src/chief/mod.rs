//! The chief: what the Raft leader decides for the cluster's jobs, and the loop that asks.
//!
//! [`decide`] is pure: from the replicated state, gossip's view of the members and the time
//! it returns the commands to propose: place a pending job (each rank with its own GPUs, see
//! [`placement`]), or record why it cannot be placed; for a running job that lost a rank (its member dead or left, its process exited
//! non-zero, its peers reported it hung, or it straggled for `straggler_window` steps),
//! re-form an elastic job's ring without it while at least `min_workers` remain (a straggler
//! is also blacklisted), else fail the attempt; grow an elastic job's ring by one available
//! member per generation while it is below `max_workers` (survivors keep their GPUs, a
//! joiner gets its member's lowest free ones); start, promote and copy the trials
//! of searches and end them ([`search`]). [`driver`] runs it every
//! [`driver::CHIEF_PERIOD_MS`] while this node is chief, next to the voter upkeep, and
//! proposes what it returns; the state machine ignores a command that arrives stale, so a
//! decision made just before losing leadership is harmless.
//!
//! May use: `domain` (the state, specs), `control` (the handle), `cluster` (the member view). Used by:
//! the node's start-up only.

pub mod driver;
pub mod placement;
pub mod search;

use std::collections::BTreeMap;

use crate::{
    cluster::{membership::State, net::MemberView},
    domain::state::{ControlCommand, ControlState, Job, JobState, Op, Slot, REJOIN_AFTER_MS},
};
use placement::{Candidate, Request};

/// What the chief should propose now. `new_secret` draws a generation's ring secret (random
/// in production, fixed in tests).
pub fn decide(
    state: &ControlState,
    members: &[MemberView],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut candidates = candidates(state, members, now_ms);
    let mut out = Vec::new();
    for job in state.jobs.values().filter(|j| j.state == JobState::Running) {
        out.extend(running(job, members, &mut candidates, now_ms, new_secret));
    }
    out.extend(place_pending(state, &mut candidates, now_ms, new_secret));
    out.extend(search::decide(state, &mut candidates, now_ms, new_secret));
    out
}

/// Members as placement sees them: alive or not, blacklisted or not, with what running jobs
/// hold; in (name, id) order.
fn candidates(state: &ControlState, members: &[MemberView], now_ms: u64) -> Vec<Candidate> {
    let used = state.used_resources();
    let mut candidates: Vec<Candidate> = members
        .iter()
        .map(|m| {
            let id = m.id.to_string();
            let held = used.get(&id).cloned().unwrap_or_default();
            let removed = state.is_removed(&id);
            Candidate {
                blacklisted: state.is_blacklisted(&id, now_ms),
                id,
                name: m.meta.name.clone(),
                // A member an operator removed is never given a rank (`domain::state::removal`).
                alive: m.state == State::Alive && !removed,
                cpus: m.meta.cpus,
                gpus: m.meta.gpus.iter().map(|g| g.index).collect(),
                used_cpus: held.cpus,
                used_gpus: held.gpus,
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

/// The ranks of `job`'s current generation that are lost, in rank order.
fn lost_ranks<'a>(job: &'a Job, members: &[MemberView]) -> Vec<Lost<'a>> {
    let gone: BTreeMap<String, &str> = members
        .iter()
        .filter(|m| matches!(m.state, State::Dead | State::Left))
        .map(|m| (m.id.to_string(), m.state.as_str()))
        .collect();
    let elastic = &job.spec.elastic;
    let mut lost = Vec::new();
    for slot in &job.assignment {
        let who = format!("{} (rank {})", slot.name, slot.rank);
        let straggling = job.rank_stats.get(&slot.rank).filter(|s| {
            s.slow_since_step.is_some_and(|since| {
                s.step.saturating_sub(since) >= u64::from(elastic.straggler_window)
            })
        });
        let (reason, straggler) = if let Some(state) = gone.get(&slot.member) {
            (format!("peer-lost {who}: member {state}"), false)
        } else if let Some(code) = job.exits.get(&slot.rank).filter(|c| **c != 0) {
            (format!("peer-lost {who}: exited with code {code}"), false)
        } else if let Some(seen) = job.suspects.get(&slot.rank) {
            let kind = if seen.hung { "hung" } else { "peer-lost" };
            (format!("{kind} {who}: {}", seen.reason), false)
        } else if let Some(stat) = straggling {
            let reason = format!(
                "straggler {who}: {:.1} ms of compute per step, over {}x the ring's median for {} steps",
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

/// `slots` in ring order with ranks `0..n` and local ranks counted per member.
fn reranked(slots: impl IntoIterator<Item = Slot>) -> Vec<Slot> {
    let mut out: Vec<Slot> = Vec::new();
    for mut slot in slots {
        slot.rank = out.len() as u32;
        slot.local_rank = out.iter().filter(|s| s.member == slot.member).count() as u32;
        out.push(slot);
    }
    out
}

/// What a running job needs: nothing, a re-form (elastic jobs), or a failed attempt.
fn running(
    job: &Job,
    members: &[MemberView],
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let lost = lost_ranks(job, members);
    if !lost.is_empty() {
        return shrink(job, &lost, now_ms, new_secret);
    }
    // Growth: an elastic ring below max_workers takes one available member per generation.
    if !job.is_elastic() || job.assignment.len() >= job.spec.max_workers as usize {
        return Vec::new();
    }
    let req = Request::from_spec(&job.spec);
    let joiner = candidates.iter_mut().find(|c| {
        c.alive
            && !c.blacklisted
            && !job.assignment.iter().any(|s| s.member == c.id)
            && job
                .departed
                .get(&c.id)
                .is_none_or(|at| now_ms.saturating_sub(*at) >= REJOIN_AFTER_MS)
            && c.cpus.saturating_sub(c.used_cpus) >= req.cpus_per_worker
            && placement::free_gpus(c).len() >= req.gpus_per_worker as usize
    });
    let Some(joiner) = joiner else {
        return Vec::new();
    };
    let gpus: Vec<u32> = placement::free_gpus(joiner)
        .into_iter()
        .take(req.gpus_per_worker as usize)
        .collect();
    joiner.used_cpus += req.cpus_per_worker;
    joiner.used_gpus.extend(&gpus);
    let worker = job.next_worker;
    let new = Slot {
        member: joiner.id.clone(),
        name: joiner.name.clone(),
        rank: 0,
        local_rank: 0,
        worker,
        gpus,
    };
    vec![ControlCommand {
        op: Op::Reform {
            id: job.id,
            generation: job.generation + 1,
            slots: reranked(job.assignment.iter().cloned().chain([new])),
            secret: new_secret(),
            reason: format!("joined {}", joiner.name),
        },
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
                op: Op::Blacklist {
                    member: l.slot.member.clone(),
                    name: l.slot.name.clone(),
                    cooldown_ms: u64::from(job.spec.elastic.blacklist_cooldown_s) * 1_000,
                    reason: format!("job {}: {}", job.id, l.reason),
                },
                at_ms: now_ms,
            })
            .collect();
        let keep = job
            .assignment
            .iter()
            .filter(|s| !lost.iter().any(|l| l.slot.rank == s.rank))
            .cloned();
        out.push(ControlCommand {
            op: Op::Reform {
                id: job.id,
                generation: job.generation + 1,
                slots: reranked(keep),
                secret: new_secret(),
                reason,
            },
            at_ms: now_ms,
        });
        return out;
    }
    if lost.iter().all(|l| l.straggler) {
        return Vec::new();
    }
    vec![ControlCommand {
        op: Op::AttemptFailed {
            id: job.id,
            generation: job.generation,
            reason,
        },
        at_ms: now_ms,
    }]
}

/// Places every pending job that fits, in job order; later jobs of the round see the
/// resources of earlier ones as taken. A job that does not fit gets its reason recorded
/// once (not again while the reason is the same).
fn place_pending(
    state: &ControlState,
    candidates: &mut [Candidate],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = Vec::new();
    for job in state.pending() {
        let req = Request::from_spec(&job.spec);
        // A trial's job runs again where it ran (its checkpoint is there) when it can.
        let prefer = job
            .trial_of
            .as_ref()
            .and_then(|_| job.assignment.first())
            .map(|s| s.member.as_str());
        // A retry goes to members where its program started, or could: those where it could
        // not are tried again only when nothing else fits.
        let placed = if job.cannot_start.is_empty() {
            placement::place_preferring(candidates, &req, prefer, None)
        } else {
            let elsewhere: Vec<Candidate> = candidates
                .iter()
                .cloned()
                .map(|mut c| {
                    c.blacklisted |= job.cannot_start.contains(&c.id);
                    c
                })
                .collect();
            placement::place_preferring(&elsewhere, &req, prefer, None)
                .or_else(|_| placement::place_preferring(candidates, &req, prefer, None))
        };
        match placed {
            Ok(slots) => {
                placement::take(candidates, &slots, &req);
                out.push(ControlCommand {
                    op: Op::Place {
                        id: job.id,
                        generation: job.generation + 1,
                        slots,
                        secret: new_secret(),
                    },
                    at_ms: now_ms,
                });
            }
            Err(e) if job.pending_reason.as_deref() == Some(e.reason.as_str()) => {}
            Err(e) => out.push(ControlCommand {
                op: Op::Unplaceable {
                    id: job.id,
                    reason: e.reason,
                },
                at_ms: now_ms,
            }),
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use libp2p::PeerId;

    use super::*;
    use crate::{
        cluster::meta::NodeMeta,
        domain::state::{ControlResponse, JobId},
        jobs::JobSpec,
    };

    /// A member as gossip shows it.
    pub(crate) fn member(name: &str, state: State, cpus: u32) -> MemberView {
        MemberView {
            id: PeerId::random(),
            incarnation: 0,
            state,
            meta: NodeMeta::for_test(name, cpus, "127.0.0.1"),
            meta_version: 0,
            state_since_ms: 0,
        }
    }

    /// An alive member with `gpus` GPUs, indices `0..gpus`.
    pub(crate) fn gpu_member(name: &str, cpus: u32, gpus: u32) -> MemberView {
        let mut m = member(name, State::Alive, cpus);
        m.meta.gpus = (0..gpus)
            .map(|index| crate::cluster::meta::Gpu {
                index,
                model: "H100".into(),
                memory_mb: 81_559,
                uuid: format!("GPU-test-{index}"),
            })
            .collect();
        m
    }

    /// Submits the job `spec` (TOML) at the next log index; returns its id.
    pub(crate) fn submit_text(state: &mut ControlState, spec: &str) -> JobId {
        let index = state.applied_index + 1;
        let cmd = ControlCommand {
            op: Op::Submit {
                spec: Box::new(JobSpec::parse(spec).unwrap()),
                token: None,
            },
            at_ms: 1,
        };
        match state.apply(index, &cmd) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }

    /// Submits a command job of `workers` ranks; returns its id.
    pub(crate) fn submit(state: &mut ControlState, index: u64, workers: u32) -> JobId {
        let text = format!(
            "name = \"t\"\nkind = \"command\"\nworkers = {workers}\ncommand = [\"true\"]\n"
        );
        let cmd = ControlCommand {
            op: Op::Submit {
                spec: Box::new(JobSpec::parse(&text).unwrap()),
                token: None,
            },
            at_ms: 1,
        };
        match state.apply(index, &cmd) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }

    fn secret() -> String {
        "ab".repeat(32)
    }

    /// Applies `cmds` at the next log indexes, each applied.
    fn apply_all(state: &mut ControlState, cmds: &[ControlCommand]) {
        for cmd in cmds {
            let index = state.applied_index + 1;
            assert_eq!(state.apply(index, cmd), ControlResponse::Applied, "{cmd:?}");
        }
    }

    fn devices(state: &ControlState, id: JobId) -> Vec<Vec<u32>> {
        let job = state.job(id).unwrap();
        job.assignment.iter().map(|s| s.gpus.clone()).collect()
    }

    #[test]
    fn a_retry_avoids_the_member_where_the_program_could_not_start_unless_none_else_fits() {
        let members = vec![member("a", State::Alive, 1), member("b", State::Alive, 1)];
        let mut state = ControlState::default();
        let id = submit_text(
            &mut state,
            "name = \"m\"\nkind = \"command\"\nworkers = 1\nmax_restarts = 2\ncommand = [\"nope\"]\n",
        );
        let ring = |state: &ControlState| state.job(id).unwrap().assignment[0].name.clone();
        let fail_start = |state: &mut ControlState, at_ms: u64| {
            let generation = state.job(id).unwrap().generation;
            let note = ControlCommand {
                op: Op::WorkerNote {
                    id,
                    generation,
                    rank: 0,
                    message: "program \"nope\" not found on this node".into(),
                    cannot_start: true,
                },
                at_ms,
            };
            let exit = ControlCommand {
                op: Op::WorkerExited {
                    id,
                    generation,
                    rank: 0,
                    code: 127,
                },
                at_ms,
            };
            apply_all(state, &[note, exit]);
        };
        let cmds = decide(&state, &members, 5, &mut secret);
        apply_all(&mut state, &cmds);
        let first = ring(&state);
        fail_start(&mut state, 6);
        let job = state.job(id).unwrap();
        assert_eq!(job.state, JobState::Pending);
        assert!(job.events.iter().any(|e| e
            .reason
            .contains(&format!("rank 0 could not start on {first}: program"))));
        // The retry goes to the other member…
        let cmds = decide(&state, &members, 7, &mut secret);
        apply_all(&mut state, &cmds);
        let second = ring(&state);
        assert_ne!(first, second);
        // … and when it could start nowhere, to one of them anyway (it may be installed).
        fail_start(&mut state, 8);
        let cmds = decide(&state, &members, 9, &mut secret);
        apply_all(&mut state, &cmds);
        assert_eq!(state.job(id).unwrap().state, JobState::Running);
    }

    const TWO_BY_ONE_GPU: &str = "name = \"g\"\nkind = \"command\"\nworkers = 2\ncommand = [\"true\"]\n[resources]\ngpus_per_worker = 1\n";

    #[test]
    fn jobs_get_disjoint_gpus_and_an_ended_job_frees_them() {
        let members = vec![gpu_member("a", 8, 4)];
        let mut state = ControlState::default();
        let first = submit_text(&mut state, TWO_BY_ONE_GPU);
        let cmds = decide(&state, &members, 5, &mut secret);
        apply_all(&mut state, &cmds);
        let second = submit_text(&mut state, TWO_BY_ONE_GPU);
        let cmds = decide(&state, &members, 6, &mut secret);
        apply_all(&mut state, &cmds);
        assert_eq!(devices(&state, first), [vec![0], vec![1]]);
        assert_eq!(devices(&state, second), [vec![2], vec![3]]);
        // No device left: the third waits, with a reason.
        let third = submit_text(&mut state, TWO_BY_ONE_GPU);
        let cmds = decide(&state, &members, 7, &mut secret);
        let [ControlCommand {
            op: Op::Unplaceable { reason, .. },
            ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert_eq!(
            reason,
            "needs 2 workers with 1 cpu and 1 gpu each; 1 alive member has room for 0"
        );
        apply_all(&mut state, &cmds);
        // The first ends: its devices go to the third.
        for rank in 0..2 {
            let exit = ControlCommand {
                op: Op::WorkerExited {
                    id: first,
                    generation: 1,
                    rank,
                    code: 0,
                },
                at_ms: 8,
            };
            apply_all(&mut state, &[exit]);
        }
        assert_eq!(state.job(first).unwrap().state, JobState::Succeeded);
        let cmds = decide(&state, &members, 9, &mut secret);
        apply_all(&mut state, &cmds);
        assert_eq!(devices(&state, third), [vec![0], vec![1]]);
    }

    #[test]
    fn a_placement_on_a_held_gpu_is_ignored() {
        let members = vec![gpu_member("a", 8, 4)];
        let mut state = ControlState::default();
        let first = submit_text(&mut state, TWO_BY_ONE_GPU);
        let second = submit_text(&mut state, TWO_BY_ONE_GPU);
        // Both decided on the same (stale) view: the second is refused when applied.
        let stale = decide(&state, &members, 5, &mut secret);
        let [ControlCommand {
            op: Op::Place { slots, .. },
            ..
        }, _] = stale.as_slice()
        else {
            panic!("{stale:?}")
        };
        apply_all(&mut state, &stale[..1]);
        let again = ControlCommand {
            op: Op::Place {
                id: second,
                generation: 1,
                slots: slots.clone(),
                secret: secret(),
            },
            at_ms: 6,
        };
        let r = state.apply(state.applied_index + 1, &again);
        assert!(
            matches!(&r, ControlResponse::Ignored { reason } if reason.starts_with("gpu 0 of a is held by")),
            "{r:?}"
        );
        assert_eq!(state.job(first).unwrap().state, JobState::Running);
        assert_eq!(state.job(second).unwrap().state, JobState::Pending);
        // One GPU twice in one placement is malformed.
        let mut twice = slots.clone();
        twice[1].gpus = twice[0].gpus.clone();
        let bad = ControlCommand {
            op: Op::Place {
                id: second,
                generation: 1,
                slots: twice,
                secret: secret(),
            },
            at_ms: 6,
        };
        assert!(matches!(
            bad.check(),
            Err(crate::domain::state::BadCommand::Gpus)
        ));
    }

    #[test]
    fn a_reform_keeps_survivors_gpus_and_a_joiner_gets_the_lowest_free() {
        let members = vec![gpu_member("a", 8, 4), gpu_member("b", 8, 2)];
        let mut state = ControlState::default();
        let elastic = submit_text(&mut state, "name = \"e\"\nkind = \"command\"\nworkers = 3\nmin_workers = 2\nmax_workers = 3\nplacement = \"pack\"\ncommand = [\"true\"]\n[resources]\ngpus_per_worker = 1\n",
        );
        let cmds = decide(&state, &members, 5, &mut secret);
        apply_all(&mut state, &cmds);
        assert_eq!(devices(&state, elastic), [vec![0], vec![1], vec![2]]);
        // Another job takes b's device 0 (a has one free device, b two: b has more room).
        let other = submit_text(&mut state, "name = \"o\"\nkind = \"command\"\nworkers = 1\nplacement = \"pack\"\ncommand = [\"true\"]\n[resources]\ngpus_per_worker = 1\n",
        );
        let cmds = decide(&state, &members, 6, &mut secret);
        apply_all(&mut state, &cmds);
        assert_eq!(state.job(other).unwrap().assignment[0].name, "b");
        assert_eq!(devices(&state, other), [vec![0]]);
        // Rank 1 crashes: the survivors keep devices 0 and 2 (not re-packed to 0 and 1).
        let exit = ControlCommand {
            op: Op::WorkerExited {
                id: elastic,
                generation: 1,
                rank: 1,
                code: 137,
            },
            at_ms: 7,
        };
        apply_all(&mut state, &[exit]);
        let cmds = decide(&state, &members, 8, &mut secret);
        let (slots, _) = reform_of(&cmds);
        assert_eq!(
            slots.iter().map(|s| s.gpus.clone()).collect::<Vec<_>>(),
            [vec![0], vec![2]]
        );
        apply_all(&mut state, &cmds);
        // It grows back with b, whose lowest free device is 1.
        let cmds = decide(&state, &members, 9, &mut secret);
        let (slots, reason) = reform_of(&cmds);
        assert_eq!(reason, "joined b");
        assert_eq!(
            slots
                .iter()
                .map(|s| (s.name.as_str(), s.gpus.clone()))
                .collect::<Vec<_>>(),
            [("a", vec![0]), ("a", vec![2]), ("b", vec![1])]
        );
        apply_all(&mut state, &cmds);
    }

    #[test]
    fn places_a_pending_job_and_then_fails_it_when_a_member_dies() {
        let mut state = ControlState::default();
        let id = submit(&mut state, 1, 2);
        let mut members = vec![member("a", State::Alive, 2), member("b", State::Alive, 2)];
        let cmds = decide(&state, &members, 5, &mut secret);
        let [ControlCommand {
            op:
                Op::Place {
                    id: placed,
                    generation: 1,
                    slots,
                    ..
                },
            ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert_eq!(*placed, id);
        assert_eq!(slots.len(), 2);
        assert_eq!(state.apply(2, &cmds[0]), ControlResponse::Applied);
        // Nothing to do while everyone is alive.
        assert!(decide(&state, &members, 6, &mut secret).is_empty());
        members[1].state = State::Dead;
        let cmds = decide(&state, &members, 7, &mut secret);
        let [ControlCommand {
            op:
                Op::AttemptFailed {
                    generation: 1,
                    reason,
                    ..
                },
            ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert!(
            reason.starts_with("peer-lost b (rank 1): member dead"),
            "{reason}"
        );
    }

    #[test]
    fn an_unplaceable_reason_is_recorded_once() {
        let mut state = ControlState::default();
        submit(&mut state, 1, 3);
        let members = vec![member("a", State::Alive, 1)];
        let cmds = decide(&state, &members, 5, &mut secret);
        assert!(
            matches!(
                cmds.as_slice(),
                [ControlCommand {
                    op: Op::Unplaceable { .. },
                    ..
                }]
            ),
            "{cmds:?}"
        );
        state.apply(2, &cmds[0]);
        assert!(decide(&state, &members, 6, &mut secret).is_empty());
    }

    #[test]
    fn jobs_of_one_round_do_not_share_a_cpu() {
        let mut state = ControlState::default();
        submit(&mut state, 1, 1);
        submit(&mut state, 2, 1);
        let members = vec![member("a", State::Alive, 1)];
        let cmds = decide(&state, &members, 5, &mut secret);
        assert!(
            matches!(
                cmds[0],
                ControlCommand {
                    op: Op::Place { .. },
                    ..
                }
            ),
            "{cmds:?}"
        );
        assert!(
            matches!(
                cmds[1],
                ControlCommand {
                    op: Op::Unplaceable { .. },
                    ..
                }
            ),
            "{cmds:?}"
        );
    }

    /// An elastic command job of `workers` ranks (min 2, max `max`) placed on `members`.
    fn elastic_running(
        members: &[MemberView],
        workers: u32,
        max: u32,
        extra: &str,
    ) -> (ControlState, JobId) {
        let mut state = ControlState::default();
        let text = format!(
            "name = \"e\"\nkind = \"command\"\nworkers = {workers}\nmin_workers = 2\nmax_workers = {max}\ncommand = [\"true\"]\n{extra}"
        );
        let cmd = ControlCommand {
            op: Op::Submit {
                spec: Box::new(JobSpec::parse(&text).unwrap()),
                token: None,
            },
            at_ms: 1,
        };
        let ControlResponse::Submitted { id } = state.apply(1, &cmd) else {
            panic!()
        };
        let place = decide(&state, members, 2, &mut secret);
        assert_eq!(state.apply(2, &place[0]), ControlResponse::Applied);
        (state, id)
    }

    fn reform_of(cmds: &[ControlCommand]) -> (&Vec<Slot>, &str) {
        match cmds.last() {
            Some(ControlCommand {
                op: Op::Reform { slots, reason, .. },
                ..
            }) => (slots, reason),
            other => panic!("expected a re-form, got {other:?} in {cmds:?}"),
        }
    }

    #[test]
    fn an_elastic_job_reforms_without_a_dead_member_and_keeps_its_restarts() {
        let mut members = vec![
            member("a", State::Alive, 1),
            member("b", State::Alive, 1),
            member("c", State::Alive, 1),
        ];
        let (mut state, id) = elastic_running(&members, 3, 3, "");
        members[1].state = State::Dead;
        let cmds = decide(&state, &members, 10, &mut secret);
        let (slots, reason) = reform_of(&cmds);
        assert_eq!(reason, "peer-lost b (rank 1): member dead");
        let names: Vec<&str> = slots.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "c"]);
        assert_eq!(slots[1].rank, 1, "re-ranked");
        assert_eq!(slots[1].worker, 2, "the survivor keeps its worker id");
        assert_eq!(state.apply(3, &cmds[0]), ControlResponse::Applied);
        let job = state.job(id).unwrap();
        assert_eq!((job.generation, job.attempt), (2, 1), "no restart used");
        assert_eq!(job.process_generation(), 2, "command ranks restart");
        // Below min_workers: the attempt fails (a retry from durable state).
        members[2].state = State::Left;
        let cmds = decide(&state, &members, 11, &mut secret);
        assert!(
            matches!(
                cmds.as_slice(),
                [ControlCommand {
                    op: Op::AttemptFailed { generation: 2, .. },
                    ..
                }]
            ),
            "{cmds:?}"
        );
    }

    #[test]
    fn a_crashed_or_hung_rank_is_left_out() {
        let members = vec![
            member("a", State::Alive, 1),
            member("b", State::Alive, 1),
            member("c", State::Alive, 1),
        ];
        let (mut state, id) = elastic_running(&members, 3, 3, "");
        let exit = ControlCommand {
            op: Op::WorkerExited {
                id,
                generation: 1,
                rank: 2,
                code: 137,
            },
            at_ms: 5,
        };
        assert_eq!(state.apply(3, &exit), ControlResponse::Applied);
        assert_eq!(
            state.job(id).unwrap().state,
            JobState::Running,
            "an elastic job goes on"
        );
        let cmds = decide(&state, &members, 10, &mut secret);
        assert_eq!(
            reform_of(&cmds).1,
            "peer-lost c (rank 2): exited with code 137"
        );
        state.apply(4, &cmds[0]);
        let hung = ControlCommand {
            op: Op::RankLost {
                id,
                generation: 2,
                rank: 1,
                hung: true,
                reason: "process stopped for 3000 ms".into(),
            },
            at_ms: 11,
        };
        assert_eq!(state.apply(5, &hung), ControlResponse::Applied);
        // Two ranks left, min_workers 2: the hung one cannot be dropped, the attempt fails.
        let cmds = decide(&state, &members, 12, &mut secret);
        let [ControlCommand {
            op: Op::AttemptFailed { reason, .. },
            ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert!(
            reason.starts_with("hung b (rank 1): process stopped"),
            "{reason}"
        );
    }

    #[test]
    fn a_straggler_is_dropped_and_blacklisted_after_its_window_but_never_below_min() {
        let members = vec![
            member("a", State::Alive, 1),
            member("b", State::Alive, 1),
            member("c", State::Alive, 1),
        ];
        let (mut state, id) = elastic_running(&members, 3, 3, "[elastic]\nstraggler_window = 10\n");
        let mut index = 3;
        let mut stats = |state: &mut ControlState, rank: u32, step: u64, ms: f64| {
            index += 1;
            let cmd = ControlCommand {
                op: Op::RankStats {
                    id,
                    generation: 1,
                    rank,
                    step,
                    compute_ms: ms,
                    wait_ms: 1.0,
                },
                at_ms: 5,
            };
            assert_eq!(state.apply(index, &cmd), ControlResponse::Applied);
        };
        for step in [5, 10, 14] {
            stats(&mut state, 0, step, 10.0);
            stats(&mut state, 1, step, 11.0);
            stats(&mut state, 2, step, 50.0);
        }
        let slow = state.job(id).unwrap().rank_stats[&2];
        assert_eq!(slow.slow_since_step, Some(5));
        assert!(
            decide(&state, &members, 10, &mut secret).is_empty(),
            "10 steps not reached"
        );
        stats(&mut state, 2, 16, 50.0);
        let cmds = decide(&state, &members, 10, &mut secret);
        assert!(
            matches!(&cmds[0], ControlCommand { op: Op::Blacklist { name, .. }, .. } if name == "c"),
            "{cmds:?}"
        );
        assert!(reform_of(&cmds).1.starts_with("straggler c (rank 2)"));
        state.apply(20, &cmds[0]);
        state.apply(21, &cmds[1]);
        assert!(state.is_blacklisted(&members[2].id.to_string(), 10 + 59_000));
        assert!(!state.is_blacklisted(&members[2].id.to_string(), 10 + 60_001));
        // Now at min_workers: a straggler stays.
        let (mut state, id) =
            elastic_running(&members[..2], 2, 3, "[elastic]\nstraggler_window = 1\n");
        for (i, (rank, ms)) in [(0, 10.0), (1, 50.0), (1, 50.0)].into_iter().enumerate() {
            let cmd = ControlCommand {
                op: Op::RankStats {
                    id,
                    generation: 1,
                    rank,
                    step: 5 + i as u64,
                    compute_ms: ms,
                    wait_ms: 1.0,
                },
                at_ms: 5,
            };
            state.apply(10 + i as u64, &cmd);
        }
        assert!(decide(&state, &members[..2], 10, &mut secret).is_empty());
    }

    #[test]
    fn an_elastic_ring_grows_back_with_a_member_after_the_rejoin_delay() {
        let mut members = vec![
            member("a", State::Alive, 1),
            member("b", State::Alive, 1),
            member("c", State::Alive, 1),
        ];
        let (mut state, id) = elastic_running(&members, 3, 3, "");
        members[2].state = State::Dead;
        let cmds = decide(&state, &members, 1_000, &mut secret);
        state.apply(3, &cmds[0]);
        members[2].state = State::Alive;
        assert!(
            decide(&state, &members, 1_000 + REJOIN_AFTER_MS - 1, &mut secret).is_empty(),
            "too soon"
        );
        let cmds = decide(&state, &members, 1_000 + REJOIN_AFTER_MS, &mut secret);
        let (slots, reason) = reform_of(&cmds);
        assert_eq!(reason, "joined c");
        assert_eq!(slots.len(), 3);
        assert_eq!(slots[2].worker, 3, "a joiner gets a new worker id");
        state.apply(4, &cmds[0]);
        let job = state.job(id).unwrap();
        let reasons: Vec<&str> = job
            .events
            .iter()
            .filter(|e| e.what == crate::domain::state::EventKind::Reformed)
            .map(|e| e.reason.as_str())
            .collect();
        assert_eq!(reasons, ["peer-lost c (rank 2): member dead", "joined c"]);
        assert_eq!(job.generation, 3);
        // Full again: nothing more.
        assert!(decide(&state, &members, 100_000, &mut secret).is_empty());
    }

    /// A member an operator removed gets no rank, however much room it has.
    #[test]
    fn a_removed_member_is_never_placed_on() {
        let members = vec![member("a", State::Alive, 1), member("b", State::Alive, 8)];
        let mut state = ControlState::default();
        let removal = ControlCommand {
            op: Op::MemberRemove {
                peer_id: members[1].id.to_string(),
                name: "b".into(),
            },
            at_ms: 1,
        };
        apply_all(&mut state, &[removal]);
        let one = submit_text(
            &mut state,
            "name = \"x\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n",
        );
        let two = submit_text(
            &mut state,
            "name = \"y\"\nkind = \"command\"\nworkers = 2\ncommand = [\"true\"]\n",
        );
        let cmds = decide(&state, &members, 5, &mut secret);
        apply_all(&mut state, &cmds);
        let job = state.job(one).unwrap();
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.assignment[0].name, "a");
        assert_eq!(
            state.job(two).unwrap().state,
            JobState::Pending,
            "b is not counted"
        );
    }
}
