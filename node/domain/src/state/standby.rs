//! Standby joiners: a rank started ahead of joining a running ring, so the ring waits for
//! its connect, not for its process to start.
//!
//! Growing an elastic ring by one member used to be one re-form: the survivors moved to the
//! new generation at once and then waited, connecting, while the joiner's process started.
//! A PyTorch rank takes seconds to import torch and build its model (about 8 s here), all
//! of it lost by every survivor. Command jobs of `[elastic] protocol = "ringleader"` now
//! join in two steps:
//! 1. The chief stages the joiner ([`Op::Standby`](super::Op::Standby)): the job records it
//!    ([`Standby`], its worker id taken from the attempt's next one) and its member's node
//!    starts the process with `RINGLEADER_STANDBY=1` and no generation. The survivors go on
//!    training in the current generation; the standby's slot holds its CPUs and GPUs.
//! 2. The rank prints `ringleader-ready` once it is set up and waits for its first
//!    generation; its node reports it ([`Op::StandbyReady`](super::Op::StandbyReady)) and
//!    the chief re-forms the ring with it (reason `joined …`), as before. The re-form takes
//!    the standby into the ring and clears it.
//!
//! A standby whose process exits or stays silent before that, or whose member dies, is
//! dropped ([`Op::StandbyDropped`](super::Op::StandbyDropped)): the job records why in its
//! history and its member may be staged again the spec's `elastic.rejoin_after_s` later. A re-form that shrinks the ring keeps the standby (it joins the next one); a new
//! attempt or the job's end drops it.

use serde::{Deserialize, Serialize};

use super::{ignored, rejected, unknown, ControlResponse, ControlState, EventKind, JobState, Slot};
use crate::{id::JobId, spec::JobKind};

/// A joiner started ahead of the re-form that takes it in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Standby {
    /// Where it runs; its `worker` is its id in the attempt, its `rank` the one it would
    /// have had when staged (the re-form gives it its real one).
    pub slot: Slot,
    /// When it was staged (proposer's clock, ms).
    pub since_ms: u64,
    /// It printed `ringleader-ready`: the chief may re-form with it.
    pub ready: bool,
}

impl super::Job {
    /// Whether a joiner of this job is staged first ([`Standby`]): a running elastic
    /// command job of the ringleader protocol (its ranks live through re-forms and read
    /// their generations on stdin).
    pub fn stages_joiners(&self) -> bool {
        self.spec.kind == JobKind::Command
            && self.spec.keeps_ranks_through_reforms()
            && self.is_elastic()
    }
}

impl ControlState {
    /// Applies `Standby`: `slot` starts ahead of joining `id`'s ring, decided in generation
    /// `generation` (stale otherwise).
    pub(super) fn standby(
        &mut self,
        id: JobId,
        generation: u32,
        slot: &Slot,
        at_ms: u64,
    ) -> ControlResponse {
        let Some(job) = self.jobs.get_mut(&id) else {
            return unknown(id);
        };
        if job.state != JobState::Running || generation != job.generation {
            return ignored(format!(
                "{id}: a standby decided in generation {generation}; the job is {} in {}",
                job.state, job.generation
            ));
        }
        if !job.stages_joiners() {
            return rejected(format!(
                "{id}: only elastic command jobs of protocol \"ringleader\" stage joiners"
            ));
        }
        if job.standby.is_some() {
            return ignored(format!("{id}: a standby is staged already"));
        }
        if job.assignment.iter().any(|s| s.member == slot.member) {
            return ignored(format!("{id}: {} is in the ring already", slot.name));
        }
        if slot.worker < job.next_worker {
            return ignored(format!(
                "{id}: worker {} is taken (next is {})",
                slot.worker, job.next_worker
            ));
        }
        job.next_worker = slot.worker.saturating_add(1);
        job.standby = Some(Standby {
            slot: slot.clone(),
            since_ms: at_ms,
            ready: false,
        });
        ControlResponse::Applied
    }

    /// Applies `StandbyReady`: the standby `worker` of `id` waits for its first generation.
    pub(super) fn standby_ready(&mut self, id: JobId, worker: u32) -> ControlResponse {
        let Some(job) = self.jobs.get_mut(&id) else {
            return unknown(id);
        };
        match job.standby.as_mut() {
            Some(s) if s.slot.worker == worker && job.state == JobState::Running => {
                s.ready = true;
                ControlResponse::Applied
            }
            _ => ignored(format!("{id}: worker {worker} is not its standby")),
        }
    }

    /// Applies `StandbyDropped`: the standby `worker` of `id` will not join (`reason`); its
    /// member may be staged again after the spec's `elastic.rejoin_after_s`.
    pub(super) fn standby_dropped(
        &mut self,
        id: JobId,
        worker: u32,
        reason: &str,
        at_ms: u64,
    ) -> ControlResponse {
        let Some(job) = self.jobs.get_mut(&id) else {
            return unknown(id);
        };
        let Some(standby) = job.standby.take_if(|s| s.slot.worker == worker) else {
            return ignored(format!("{id}: worker {worker} is not its standby"));
        };
        job.departed.insert(standby.slot.member.clone(), at_ms);
        job.push_event(
            at_ms,
            EventKind::Note,
            format!(
                "standby on {} dropped before joining: {reason}",
                standby.slot.name
            ),
        );
        ControlResponse::Applied
    }
}
