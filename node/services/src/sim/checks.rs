//! The simulation's invariants, one checker each. A checker reads what the run observed
//! (a [`History`] of samples of every live replica, the chief's placements, the clients'
//! acknowledged submits) and returns the first violation it finds, in words.

use std::collections::{BTreeMap, BTreeSet};

use crate::control::store::NodeId;
use crate::domain::state::{ControlState, EventKind, JobId, JobState};

/// A member's capacity, as the simulated members announce it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Capacity {
    /// Cpus.
    pub cpus: u32,
    /// GPUs, device indexes `0..gpus`.
    pub gpus: u32,
}

/// What a run observed.
#[derive(Debug, Default)]
pub(crate) struct History {
    /// Every (term, node) seen leading.
    pub leaders: BTreeSet<(u64, NodeId)>,
    /// Each job's generation at each applied index a replica was seen at.
    pub generations: BTreeMap<JobId, BTreeMap<u64, BTreeSet<u32>>>,
    /// The state's digest at each applied index a replica was seen at.
    pub digests: BTreeMap<u64, BTreeSet<[u8; 32]>>,
    /// Each `Place` the chief saw applied, as (job, generation).
    pub placed: Vec<(JobId, u32)>,
    /// Each submit a client saw acknowledged, as (token, job).
    pub acked: Vec<(String, JobId)>,
    /// One line a step: what two runs of a seed must agree on.
    pub trace: Vec<String>,
}

impl History {
    /// Records one replica's state, as of its applied index; its digest.
    pub(crate) fn sample(&mut self, state: &ControlState) -> [u8; 32] {
        let index = state.applied_index;
        for job in state.jobs.values() {
            self.generations
                .entry(job.id)
                .or_default()
                .entry(index)
                .or_default()
                .insert(job.generation);
        }
        let bytes = serde_json::to_vec(state).expect("a state serializes");
        let digest = *blake3::hash(&bytes).as_bytes();
        self.digests.entry(index).or_default().insert(digest);
        digest
    }
}

/// At most one chief (Raft leader) per term.
pub(crate) fn one_chief_per_term(h: &History) -> Result<(), String> {
    let mut by_term: BTreeMap<u64, Vec<NodeId>> = BTreeMap::new();
    for (term, node) in &h.leaders {
        by_term.entry(*term).or_default().push(*node);
    }
    match by_term.iter().find(|(_, nodes)| nodes.len() > 1) {
        Some((term, nodes)) => Err(format!("term {term} had chiefs {nodes:?}")),
        None => Ok(()),
    }
}

/// Replicas that applied the same index hold the same state (the log is one log, and
/// applying it is deterministic).
pub(crate) fn replicas_agree(h: &History) -> Result<(), String> {
    match h.digests.iter().find(|(_, d)| d.len() > 1) {
        Some((index, d)) => Err(format!(
            "{} different states at applied index {index}",
            d.len()
        )),
        None => Ok(()),
    }
}

/// At most one placement per attempt: the chief's `Place` of a job's generation is applied
/// once, and in a state each attempt has one `Placed` event, in growing generations.
pub(crate) fn one_placement_per_attempt(h: &History, state: &ControlState) -> Result<(), String> {
    let mut seen = BTreeSet::new();
    if let Some(twice) = h.placed.iter().find(|p| !seen.insert(**p)) {
        return Err(format!("{} generation {} placed twice", twice.0, twice.1));
    }
    for job in state.jobs.values().filter(|j| j.events_dropped == 0) {
        let placed: Vec<u32> = job
            .events
            .iter()
            .filter(|e| e.what == EventKind::Placed)
            .map(|e| e.generation)
            .collect();
        if placed.len() != job.attempt as usize || placed.windows(2).any(|w| w[0] >= w[1]) {
            return Err(format!(
                "{} has {} placements (generations {placed:?}) in {} attempts",
                job.id,
                placed.len(),
                job.attempt
            ));
        }
    }
    Ok(())
}

/// A job's generation only grows along the log: at a later applied index it is never
/// lower, whichever replica was seen there.
pub(crate) fn generation_only_grows(h: &History) -> Result<(), String> {
    for (id, by_index) in &h.generations {
        let mut highest = 0;
        for (index, generations) in by_index {
            let (low, high) = (
                *generations.first().expect("one"),
                *generations.last().expect("one"),
            );
            if low < highest {
                return Err(format!(
                    "{id} at generation {low} at index {index}, after {highest} earlier"
                ));
            }
            highest = highest.max(high);
        }
    }
    Ok(())
}

/// No acknowledged submit is lost: each is in `state`, under its token.
pub(crate) fn no_acked_submit_lost(h: &History, state: &ControlState) -> Result<(), String> {
    for (token, id) in &h.acked {
        if state.tokens.get(token) != Some(id) || !state.jobs.contains_key(id) {
            return Err(format!(
                "submit {token:?} acknowledged as {id} is not in the state at index {}",
                state.applied_index
            ));
        }
    }
    Ok(())
}

/// Resources are never double-booked: the running jobs' slots on a member take at most its
/// cpus, and no GPU twice.
pub(crate) fn no_double_booking(
    state: &ControlState,
    capacity: &BTreeMap<String, Capacity>,
) -> Result<(), String> {
    for (member, held) in state.used_resources() {
        let Some(cap) = capacity.get(&member) else {
            return Err(format!("a slot on unknown member {member}"));
        };
        if held.cpus > cap.cpus || held.gpus.iter().any(|g| *g >= cap.gpus) {
            return Err(format!("{member} holds {held:?}, more than {cap:?}"));
        }
    }
    let mut gpus = BTreeSet::new();
    for job in state.jobs.values().filter(|j| j.state == JobState::Running) {
        for slot in &job.assignment {
            if let Some(g) = slot.gpus.iter().find(|g| !gpus.insert((&slot.member, **g))) {
                return Err(format!("gpu {g} of {} given twice", slot.name));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{ops, ControlCommand, Op, Slot};

    fn state_with_a_running_job(cpus: u32) -> ControlState {
        let mut s = ControlState::default();
        let text = format!(
            "name = \"t\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n[resources]\ncpus_per_worker = {cpus}\ngpus_per_worker = 1\n"
        );
        let submit = Op::Submit(ops::Submit {
            spec: Box::new(crate::domain::spec::JobSpec::parse(&text).unwrap()),
            token: Some("t".into()),
            owner: crate::domain::state::users::admin_user(),
        });
        s.apply(1, &ControlCommand::new(1, submit));
        let place = Op::Place(ops::Place {
            id: JobId::from_log_index(1),
            generation: 1,
            slots: vec![Slot {
                member: "m".into(),
                name: "m".into(),
                rank: 0,
                local_rank: 0,
                worker: 0,
                gpus: vec![0],
            }],
            secret: "ab".repeat(32),
        });
        s.apply(2, &ControlCommand::new(2, place));
        s
    }

    // Each checker passes what holds and names what does not: a checker that cannot fail
    // tests nothing. One test a checker, each fed a history that breaks its invariant.

    #[test]
    fn two_chiefs_in_one_term_fail_one_chief_per_term() {
        let mut h = History::default();
        h.leaders.extend([(1, 10), (2, 11)]);
        assert!(one_chief_per_term(&h).is_ok());
        h.leaders.insert((2, 12));
        assert!(one_chief_per_term(&h).unwrap_err().contains("term 2"));
    }

    #[test]
    fn two_states_at_one_index_fail_replicas_agree() {
        let state = state_with_a_running_job(2);
        let mut h = History::default();
        h.sample(&state);
        h.sample(&state);
        assert!(replicas_agree(&h).is_ok());
        let mut other = state.clone();
        other.jobs.values_mut().for_each(|j| j.generation = 0);
        h.sample(&other);
        assert!(replicas_agree(&h)
            .unwrap_err()
            .contains("at applied index 2"));
    }

    #[test]
    fn a_generation_that_falls_fails_generation_only_grows() {
        let state = state_with_a_running_job(2);
        let mut later = state.clone();
        later.applied_index = 3;
        let mut h = History::default();
        h.sample(&state);
        h.sample(&later);
        assert!(generation_only_grows(&h).is_ok());
        later.applied_index = 4;
        later.jobs.values_mut().for_each(|j| j.generation = 0);
        h.sample(&later);
        assert!(generation_only_grows(&h).unwrap_err().contains("index 4"));
    }

    #[test]
    fn a_second_place_of_one_attempt_fails_one_placement_per_attempt() {
        let state = state_with_a_running_job(2);
        let id = JobId::from_log_index(1);
        let mut h = History::default();
        h.placed.push((id, 1));
        assert!(one_placement_per_attempt(&h, &state).is_ok());
        h.placed.push((id, 1));
        assert!(one_placement_per_attempt(&h, &state)
            .unwrap_err()
            .contains("placed twice"));
        // A state whose job counts more attempts than it has placements.
        let mut h = History::default();
        h.placed.push((id, 1));
        let mut short = state.clone();
        short.jobs.values_mut().for_each(|j| j.attempt += 1);
        assert!(one_placement_per_attempt(&h, &short).is_err());
    }

    #[test]
    fn an_acknowledged_submit_missing_fails_no_acked_submit_lost() {
        let state = state_with_a_running_job(2);
        let mut h = History::default();
        h.acked.push(("t".into(), JobId::from_log_index(1)));
        assert!(no_acked_submit_lost(&h, &state).is_ok());
        h.acked.push(("lost".into(), JobId::from_log_index(7)));
        assert!(no_acked_submit_lost(&h, &state)
            .unwrap_err()
            .contains("\"lost\""));
    }

    #[test]
    fn cpus_over_capacity_or_a_gpu_given_twice_fail_no_double_booking() {
        let state = state_with_a_running_job(2);
        let room = |cpus| BTreeMap::from([("m".to_string(), Capacity { cpus, gpus: 1 })]);
        assert!(no_double_booking(&state, &room(2)).is_ok());
        assert!(no_double_booking(&state, &room(1))
            .unwrap_err()
            .contains("more than"));
        // A second running job on the same member and GPU (the log refuses such a
        // placement; a state that holds one anyway must fail the checker).
        let mut twice = state.clone();
        let mut other = twice.jobs.values().next().expect("a job").clone();
        other.id = JobId::from_log_index(9);
        twice.jobs.insert(other.id, other);
        let room = BTreeMap::from([("m".to_string(), Capacity { cpus: 8, gpus: 1 })]);
        assert!(no_double_booking(&twice, &room)
            .unwrap_err()
            .contains("gpu 0 of m given twice"));
    }
}
