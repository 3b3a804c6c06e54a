//! The chief: what the Raft leader decides for the cluster's jobs, and the loop that asks.
//!
//! [`decide`] is pure: from the replicated state, gossip's view of the members and the time
//! it returns the commands to propose (fail an attempt whose worker's member is gone, place a
//! pending job, record why a job cannot be placed). [`driver`] runs it every
//! [`driver::CHIEF_PERIOD_MS`] while this node is chief, next to the voter upkeep, and
//! proposes what it returns; the state machine ignores a command that arrives stale, so a
//! decision made just before losing leadership is harmless.
//!
//! May use: `control` (state, handle), `cluster` (the member view), `jobs::spec`. Used by:
//! the node's start-up only.

pub mod driver;
pub mod placement;

use std::collections::BTreeMap;

use crate::{
    cluster::{membership::State, net::MemberView},
    control::state::{ControlCommand, ControlState, JobState},
};
use placement::{Candidate, Request};

/// What the chief should propose now. `new_secret` draws a placement's ring secret (random
/// in production, fixed in tests).
pub fn decide(
    state: &ControlState,
    members: &[MemberView],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let mut out = fail_lost_attempts(state, members, now_ms);
    out.extend(place_pending(state, members, now_ms, new_secret));
    out
}

/// A running attempt with a worker on a member that gossip reports dead or left is failed
/// as a whole (torchrun's semantics: the survivors are stopped, and it is retried).
fn fail_lost_attempts(
    state: &ControlState,
    members: &[MemberView],
    now_ms: u64,
) -> Vec<ControlCommand> {
    let gone: BTreeMap<String, &str> = members
        .iter()
        .filter(|m| matches!(m.state, State::Dead | State::Left))
        .map(|m| (m.id.to_string(), m.state.as_str()))
        .collect();
    state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Running)
        .filter_map(|j| {
            let slot = j.assignment.iter().find(|s| gone.contains_key(&s.member))?;
            Some(ControlCommand::AttemptFailed {
                id: j.id,
                attempt: j.attempt,
                reason: format!(
                    "peer-lost: rank {} on {} is {}",
                    slot.rank, slot.name, gone[&slot.member]
                ),
                at_ms: now_ms,
            })
        })
        .collect()
}

/// Places every pending job that fits, in job order; later jobs of the round see the
/// resources of earlier ones as taken. A job that does not fit gets its reason recorded
/// once (not again while the reason is the same).
fn place_pending(
    state: &ControlState,
    members: &[MemberView],
    now_ms: u64,
    new_secret: &mut dyn FnMut() -> String,
) -> Vec<ControlCommand> {
    let used = state.used_resources();
    let mut candidates: Vec<Candidate> = members
        .iter()
        .map(|m| {
            let id = m.id.to_string();
            let (used_cpus, used_gpus) = used.get(&id).copied().unwrap_or((0, 0));
            Candidate {
                id,
                name: m.meta.name.clone(),
                alive: m.state == State::Alive,
                blacklisted: false,
                cpus: m.meta.cpus,
                gpus: m.meta.gpus.len() as u32,
                used_cpus,
                used_gpus,
            }
        })
        .collect();
    candidates.sort_by(|a, b| (&a.name, &a.id).cmp(&(&b.name, &b.id)));
    let mut out = Vec::new();
    for job in state.pending() {
        let req = Request::from_spec(&job.spec);
        match placement::place(&candidates, &req) {
            Ok(slots) => {
                for slot in &slots {
                    if let Some(c) = candidates.iter_mut().find(|c| c.id == slot.member) {
                        c.used_cpus += req.cpus_per_worker;
                        c.used_gpus += req.gpus_per_worker;
                    }
                }
                out.push(ControlCommand::Place {
                    id: job.id,
                    attempt: job.attempt + 1,
                    slots,
                    secret: new_secret(),
                    at_ms: now_ms,
                });
            }
            Err(e) if job.pending_reason.as_deref() == Some(e.reason.as_str()) => {}
            Err(e) => out.push(ControlCommand::Unplaceable {
                id: job.id,
                reason: e.reason,
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
        control::state::{ControlResponse, JobId},
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

    /// Submits a command job of `workers` ranks; returns its id.
    pub(crate) fn submit(state: &mut ControlState, index: u64, workers: u32) -> JobId {
        let text = format!(
            "name = \"t\"\nkind = \"command\"\nworkers = {workers}\ncommand = [\"true\"]\n"
        );
        let cmd = ControlCommand::Submit {
            spec: Box::new(JobSpec::parse(&text).unwrap()),
            at_ms: 1,
            token: None,
        };
        match state.apply(index, &cmd) {
            ControlResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        }
    }

    fn secret() -> String {
        "ab".repeat(32)
    }

    #[test]
    fn places_a_pending_job_and_then_fails_it_when_a_member_dies() {
        let mut state = ControlState::default();
        let id = submit(&mut state, 1, 2);
        let mut members = vec![member("a", State::Alive, 2), member("b", State::Alive, 2)];
        let cmds = decide(&state, &members, 5, &mut secret);
        let [ControlCommand::Place {
            id: placed,
            attempt: 1,
            slots,
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
        let [ControlCommand::AttemptFailed {
            attempt: 1, reason, ..
        }] = cmds.as_slice()
        else {
            panic!("{cmds:?}")
        };
        assert!(
            reason.starts_with("peer-lost: rank 1 on b is dead"),
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
            matches!(cmds.as_slice(), [ControlCommand::Unplaceable { .. }]),
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
        assert!(matches!(cmds[0], ControlCommand::Place { .. }), "{cmds:?}");
        assert!(
            matches!(cmds[1], ControlCommand::Unplaceable { .. }),
            "{cmds:?}"
        );
    }
}
