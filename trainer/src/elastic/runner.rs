//! The elastic run loop: train in a generation; on a collective failure (or a new
//! generation from the node) re-form, agree, restore and go on.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use collective::CollectiveError;
use tracing::{info, warn};

use crate::checkpoint::CheckpointStore;
use crate::checkpointer::Checkpointer;
use crate::commit_log::CommitLog;
use crate::compute_clock::ComputeClock;
use crate::elastic::agreement::{agree, agree_on_checkpoint, Holding, RestoreSource};
use crate::elastic::error::ElasticError;
use crate::elastic::generation::{Control, Generation, GenerationSource};
use crate::elastic::ring::RingConnector;
use crate::error::TrainError;
use crate::faults::Faults;
use crate::spec::TrainSpec;
use crate::state::TrainState;
use crate::trainer::{EpochMetrics, Event, RunEnd, Trainer};

/// Progress of an elastic run.
#[derive(Debug, Clone, PartialEq)]
pub enum ElasticEvent {
    /// The trainer of `generation` reported `event`.
    Train {
        /// The generation training.
        generation: u64,
        /// This worker's rank in it.
        rank: usize,
        /// What happened.
        event: Event,
    },
    /// The collective of `generation` failed (connecting, agreeing or training); the
    /// worker waits for the next generation.
    ///
    /// Not reported when a newer generation (or a stop) had already arrived when the step
    /// (or the join) failed, whatever the error: `Aborted` (this worker aborted it, see
    /// [`ABORT_GRACE_MS`]), `PeerAborted` (a peer left for the newer generation first), or
    /// `PeerLost` from a peer that left and closed its links before its abort arrived. The
    /// generation was superseded: the node has formed the next one already (and refuses a
    /// loss reported against an older generation), and a peer that is really gone fails
    /// the next generation's join.
    Failed {
        /// The generation that failed.
        generation: u64,
        /// The rank (of that generation) whose connection was lost, when the error names one.
        lost_rank: Option<usize>,
        /// The error, as text.
        error: String,
    },
    /// The worker restored a state in a new generation and goes on training.
    Resumed(Resumed),
}

/// A re-form done: the generation joined and the state restored.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// The generation joined.
    pub generation: u64,
    /// Its world size.
    pub world: usize,
    /// This worker's rank in it.
    pub rank: usize,
    /// The most steps any rank of the generation had reached before.
    pub step: u64,
    /// The step restored (0 for a fresh start).
    pub restored_step: u64,
    /// `step - restored_step`: steps trained before and to be trained again.
    pub steps_lost: u64,
    /// Where this rank's state came from.
    pub source: RestoreSource,
}

/// How an elastic run ended.
#[derive(Debug, Clone)]
pub struct ElasticSummary {
    /// The final validation when the step budget was spent; `None` when stopped.
    pub finished: Option<EpochMetrics>,
    /// The train state at the end (a completed step); when stopped without a trainer
    /// (joining a generation, or after a failed step), this rank's newest commit; `None`
    /// when it holds none.
    pub state: Option<TrainState>,
    /// Steps this worker had completed at the end (in its last generation; a step that
    /// failed is not counted).
    pub step: u64,
    /// The last generation joined (or tried).
    pub generation: u64,
    /// Generations joined after the first.
    pub reforms: u64,
    /// Steps lost over all re-forms.
    pub steps_lost: u64,
}

/// How long a worker inside a step waits, once a newer generation or a stop has arrived,
/// for the step to end by itself before it aborts the step's collective, in milliseconds
/// (default of [`ElasticRun::with_abort_grace`]).
///
/// A step that ends within the grace leaves at a step boundary with a fresh commit (no step
/// lost, as when the control arrives between steps). A step that does not is most likely
/// blocked on a silent peer (its host died or its process is stopped: no reset arrives,
/// and the collective would only notice after `peer_silence_ms` or `op_timeout_ms`):
/// aborting it lets the worker join the new generation from its last commit at once.
pub const ABORT_GRACE_MS: u64 = 1_000;

/// Whether a collective error ends only the generation (the ring is re-formed) rather than
/// the worker: lost or aborting peers, timeouts, mismatches, connecting. Malformed frames
/// (corruption or a bug), invalid arguments and CUDA errors stop the worker.
pub fn reformable(e: &CollectiveError) -> bool {
    matches!(
        e,
        CollectiveError::PeerLost { .. }
            | CollectiveError::Mismatch { .. }
            | CollectiveError::Timeout { .. }
            | CollectiveError::Aborted
            | CollectiveError::PeerAborted { .. }
            | CollectiveError::Connect { .. }
            | CollectiveError::Listen { .. }
            | CollectiveError::Handshake(_)
    )
}

/// The collective error a train error carries, when re-forming cures it.
fn reformable_train(e: &TrainError) -> Option<&CollectiveError> {
    match e {
        TrainError::Collective(c) if reformable(c) => Some(c),
        _ => None,
    }
}

/// One worker's elastic training: a spec, where generations come from and how rings are
/// connected.
///
/// Re-forming builds a new [`Trainer`] on the new communicator and restores the agreed
/// state into it ([`Trainer::restore`]): the data are re-sharded for the new (rank, world)
/// from the world-independent cursor, and the learning rate follows the new world (peak =
/// base lr × world under linear scaling, warm-up not repeated). The commit log moves from
/// the old trainer to the new one, cut back to the restored step.
///
/// While a step runs, the source is watched ([`GenerationSource::arrived`]): when a newer
/// generation or a stop arrives and the step has not ended within the abort grace
/// ([`ABORT_GRACE_MS`]), the step's communicator is aborted, so that a step blocked on a
/// silent peer fails at once rather than at the collective's silence bound or deadline.
/// While a generation is joined (connected, agreed on), the source is watched too: a newer
/// generation or a stop ends the join at once, so a rank whose peer never comes (stopped
/// by a requeue) does not wait for the connect's deadline.
#[derive(Debug)]
pub struct ElasticRun<S, C> {
    spec: TrainSpec,
    source: S,
    connector: C,
    store: Option<CheckpointStore>,
    faults: Faults,
    compute_clock: ComputeClock,
    abort_grace: Duration,
    device: crate::gpu::Device,
}

impl<S: GenerationSource, C: RingConnector> ElasticRun<S, C> {
    /// A run of `spec` taking generations from `source` and rings from `connector`.
    pub fn new(spec: TrainSpec, source: S, connector: C) -> Self {
        ElasticRun {
            spec,
            source,
            connector,
            store: None,
            faults: Faults::default(),
            compute_clock: ComputeClock::default(),
            abort_grace: Duration::from_millis(ABORT_GRACE_MS),
            device: crate::gpu::Device::Cpu,
        }
    }

    /// Every generation's trainer computes on `device` (default: the CPU).
    pub fn with_device(mut self, device: crate::gpu::Device) -> Self {
        self.device = device;
        self
    }

    /// How long a step may go on after a newer generation or a stop arrived before its
    /// communicator is aborted (default [`ABORT_GRACE_MS`]); zero aborts at once.
    pub fn with_abort_grace(mut self, grace: Duration) -> Self {
        self.abort_grace = grace;
        self
    }

    /// Falls back to `store`'s latest checkpoint when no rank holds a commit.
    pub fn with_store(mut self, store: CheckpointStore) -> Self {
        self.store = Some(store);
        self
    }

    /// Test-only: the faults every trainer drives into its steps ([`Trainer::set_faults`]).
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Every trainer marks its compute sections on `clock` (the progress heartbeat).
    pub fn with_compute_clock(mut self, clock: ComputeClock) -> Self {
        self.compute_clock = clock;
        self
    }

    /// Trains from generation `first` until the step budget is spent, a stop arrives, or
    /// the source ends (then `Ok` with what was reached). Rank 0 of each generation hands
    /// checkpoints to `ckpt`.
    pub async fn run(
        &mut self,
        first: Generation,
        mut ckpt: Option<&mut Checkpointer>,
        mut on_event: impl FnMut(&ElasticEvent),
    ) -> Result<ElasticSummary, ElasticError> {
        let mut gen = first;
        let first_generation = gen.generation;
        let mut log = CommitLog::default();
        let mut last_generation: Option<u64> = None;
        let mut step_reached = 0u64;
        let mut summary = ElasticSummary {
            finished: None,
            state: None,
            step: 0,
            generation: gen.generation,
            reforms: 0,
            steps_lost: 0,
        };
        loop {
            summary.generation = gen.generation;
            let (joining, source) = self.joining();
            let joined = tokio::select! {
                biased;
                joined = joining.join(&gen, &mut log, last_generation, step_reached) => Some(joined),
                () = source.arrived(gen.generation) => None,
            };
            let (mut trainer, resumed) = match joined {
                Some(Ok(j)) => j,
                // A newer generation or a stop arrived while this one was still connecting
                // or agreeing: it is superseded, so leave it now rather than at a
                // connection's deadline (a requeued peer that never comes). Nothing of the
                // log changed: the join alters it only after its last wait.
                None => {
                    info!(
                        generation = gen.generation,
                        "a newer generation or a stop arrived while joining: leaving the join"
                    );
                    let waiting = self.source.pending(gen.generation);
                    match self.after(gen.generation, waiting).await? {
                        Some(g) => {
                            gen = g;
                            continue;
                        }
                        None => return Ok(stopped_at_commit(summary, &log)),
                    }
                }
                Some(Err(JoinError::Reform(e))) => {
                    // Superseded: not a loss to report (see `ElasticEvent::Failed`).
                    let waiting = self.source.pending(gen.generation);
                    if waiting.is_none() {
                        on_event(&failed(gen.generation, &e));
                    } else {
                        info!(
                            generation = gen.generation,
                            error = %e,
                            "the join failed after a newer generation (or a stop) arrived: not reported as a peer loss"
                        );
                    }
                    match self.after(gen.generation, waiting).await? {
                        Some(g) => {
                            gen = g;
                            continue;
                        }
                        None => return Ok(stopped_at_commit(summary, &log)),
                    }
                }
                Some(Err(JoinError::Fatal(e))) => return Err(e),
            };
            last_generation = Some(gen.generation);
            if gen.generation != first_generation {
                summary.reforms += 1;
            }
            summary.steps_lost += resumed.steps_lost;
            on_event(&ElasticEvent::Resumed(resumed));

            let (generation, rank) = (gen.generation, trainer.rank());
            let abort = trainer.abort_handle();
            // Set once a newer generation or a stop waits in the source: the trainer stops
            // at the next step boundary, and the watcher aborts a step that outlasts the
            // grace.
            let newer = AtomicBool::new(false);
            let grace = self.abort_grace;
            let source = &mut self.source;
            let end = {
                let run = trainer.run_until(
                    ckpt.as_deref_mut(),
                    |event| {
                        on_event(&ElasticEvent::Train {
                            generation,
                            rank,
                            event: event.clone(),
                        })
                    },
                    || newer.load(Ordering::SeqCst),
                );
                let watch = async {
                    source.arrived(generation).await;
                    newer.store(true, Ordering::SeqCst);
                    tokio::time::sleep(grace).await;
                    info!(
                        generation,
                        grace_ms = grace.as_millis() as u64,
                        "a newer generation or a stop arrived and the step has not ended: aborting it"
                    );
                    abort.abort();
                    std::future::pending::<Infallible>().await
                };
                tokio::select! {
                    biased;
                    end = run => end,
                    never = watch => match never {},
                }
            };
            let superseded = newer.load(Ordering::SeqCst);
            let mut control = if superseded {
                self.source.pending(generation)
            } else {
                None
            };
            step_reached = trainer.step_count();
            summary.step = step_reached;
            match end {
                Ok(RunEnd::Finished(m)) => {
                    summary.finished = Some(m);
                    summary.state = Some(trainer.snapshot()?);
                    finish(trainer).await;
                    return Ok(summary);
                }
                Ok(RunEnd::Interrupted) => match control.take() {
                    Some(Control::Generation(g)) => {
                        // Between two steps the state is consistent: commit it, so the
                        // next generation can start from here if every rank got this far.
                        if let Err(e) = trainer.commit() {
                            warn!(error = %e, "no commit of the last step: the next generation starts from an earlier one");
                        }
                        log = trainer.take_commits();
                        info!(
                            from = generation,
                            to = g.generation,
                            step = step_reached,
                            "leaving a healthy generation for a newer one"
                        );
                        depart(trainer, Departure::Background).await;
                        gen = g;
                    }
                    _ => {
                        summary.state = Some(trainer.snapshot()?);
                        depart(trainer, Departure::Awaited).await;
                        return Ok(summary);
                    }
                },
                Err(e) => {
                    let Some(c) = reformable_train(&e) else {
                        return Err(e.into());
                    };
                    // Superseded: not a loss to report (see `ElasticEvent::Failed`).
                    if superseded {
                        info!(
                            generation,
                            step = step_reached,
                            error = %c,
                            "step ended after a newer generation (or a stop) arrived: not reported as a peer loss"
                        );
                    } else {
                        on_event(&failed(generation, c));
                    }
                    // A step that failed before changing anything leaves the last step's
                    // state whole: committed, the next generation starts from it.
                    if trainer.failed_untouched() {
                        if let Err(e) = trainer.commit() {
                            warn!(error = %e, "no commit of the last step after a failed one");
                        }
                    }
                    log = trainer.take_commits();
                    if superseded {
                        leave(trainer).await;
                    } else {
                        close(trainer).await;
                    }
                    match self.after(generation, control.take()).await? {
                        Some(g) => gen = g,
                        None => return Ok(stopped_at_commit(summary, &log)),
                    }
                }
            }
        }
    }

    /// The generation to join after `generation`: the control `waiting` (the newest taken
    /// from the source; a stop wins), else the next to arrive; `None` to stop.
    async fn after(
        &mut self,
        generation: u64,
        waiting: Option<Control>,
    ) -> Result<Option<Generation>, ElasticError> {
        match waiting {
            Some(Control::Generation(g)) => Ok(Some(g)),
            Some(Control::Stop) => Ok(None),
            None => self.source.next(generation).await,
        }
    }

    /// What joining a generation borrows, apart from the source that is watched meanwhile.
    fn joining(&mut self) -> (Joining<'_, C>, &mut S) {
        (
            Joining {
                spec: &self.spec,
                connector: &mut self.connector,
                store: &self.store,
                faults: self.faults,
                compute_clock: &self.compute_clock,
                device: &self.device,
            },
            &mut self.source,
        )
    }
}

/// The parts of an [`ElasticRun`] that joining a generation uses.
struct Joining<'a, C> {
    spec: &'a TrainSpec,
    connector: &'a mut C,
    store: &'a Option<CheckpointStore>,
    faults: Faults,
    compute_clock: &'a ComputeClock,
    device: &'a crate::gpu::Device,
}

impl<C: RingConnector> Joining<'_, C> {
    /// Connects generation `gen`, agrees on the state, builds and restores the trainer.
    async fn join(
        self,
        gen: &Generation,
        log: &mut CommitLog,
        last_generation: Option<u64>,
        step_reached: u64,
    ) -> Result<(Trainer, Resumed), JoinError> {
        let mut comm = self.connector.connect(gen).await?;
        let on_cuda = self.device.trains_on_cuda(&self.spec.model);
        let nccl = self.connector.nccl(gen, &mut comm, on_cuda).await?;
        let double = self.connector.nccl_double(gen).await?;
        let holding = Holding {
            log,
            last_generation,
            step_reached,
        };
        let agreed = agree(&mut comm, holding).await?;
        let (state, source) = match (agreed.state, self.store) {
            (Some(s), _) => (Some(s), agreed.source),
            (None, Some(store)) => match agree_on_checkpoint(&mut comm, store).await? {
                Some(s) => (Some(Arc::new(s)), RestoreSource::Checkpoint),
                None => (None, RestoreSource::Fresh),
            },
            (None, None) => (None, RestoreSource::Fresh),
        };
        let mut trainer = Trainer::new_on(self.spec, comm, self.device, nccl)?;
        if let Some(d) = double {
            trainer.set_nccl_double(d)?;
        }
        trainer.set_faults(self.faults);
        trainer.set_compute_clock(self.compute_clock.clone());
        // A ring shrunk by a preemption keeps its global batch: before the restore, which
        // rebases the schedule on it.
        trainer.set_accumulation(gen.accumulation());
        let restored_step = match &state {
            Some(s) => {
                trainer.restore(s)?;
                if source == RestoreSource::Memory {
                    // Its own history up to the restored commit stays valid.
                    log.truncate_after(s.meta.step);
                } else {
                    // Its commits (if any) are of another history, even at the same steps.
                    log.clear();
                    log.push(s.clone());
                }
                s.meta.step
            }
            None => {
                log.clear();
                0
            }
        };
        trainer.set_commits(std::mem::take(log));
        let group_step = agreed.group_step.max(restored_step);
        let resumed = Resumed {
            generation: gen.generation,
            world: trainer.world(),
            rank: trainer.rank(),
            step: group_step,
            restored_step,
            steps_lost: group_step - restored_step,
            source,
        };
        info!(?resumed, "joined generation");
        Ok((trainer, resumed))
    }
}

/// Why joining a generation failed.
enum JoinError {
    /// The generation failed; wait for the next.
    Reform(CollectiveError),
    /// Stop the worker.
    Fatal(ElasticError),
}

impl From<CollectiveError> for JoinError {
    fn from(e: CollectiveError) -> Self {
        if reformable(&e) {
            JoinError::Reform(e)
        } else {
            JoinError::Fatal(e.into())
        }
    }
}

impl From<TrainError> for JoinError {
    fn from(e: TrainError) -> Self {
        match e {
            TrainError::Collective(c) => c.into(),
            e => JoinError::Fatal(e.into()),
        }
    }
}

fn failed(generation: u64, e: &CollectiveError) -> ElasticEvent {
    // A peer that could not be connected to within the deadline is as suspect as one whose
    // connection broke (a joiner that never came up): name it, or the chief would only hear
    // of this rank itself, from the peers it leaves behind.
    let lost_rank = match e {
        CollectiveError::PeerLost { rank } | CollectiveError::Connect { rank, .. } => Some(*rank),
        _ => None,
    };
    ElasticEvent::Failed {
        generation,
        lost_rank,
        error: e.to_string(),
    }
}

/// Ends the last generation of a finished run without failing a peer's last operation:
/// a closed link fails any operation still in flight on the other side, and peers finish
/// the last step at slightly different times. So: a barrier (every rank is past the last
/// step), then the collective's `abort_linger_ms` for the peers to leave the barrier too,
/// then close.
async fn finish(mut trainer: Trainer) {
    // The device group ends normally (barrier, finalize, destroy); on every other way out
    // of a generation it is dropped, which aborts it.
    if let Err(e) = trainer.finish_device_group() {
        warn!(error = %e, "ending the device group");
    }
    match trainer.into_communicator().await {
        Ok(mut comm) => {
            if let Err(e) = comm.barrier().await {
                warn!(error = %e, "final barrier");
            }
            let linger = Duration::from_millis(comm.limits().abort_linger_ms);
            tokio::time::sleep(linger).await;
            comm.shutdown().await;
        }
        Err(e) => warn!(error = %e, "closing the generation's communicator"),
    }
}

/// A stop that ends the run without a trainer (while joining a generation that never
/// formed, or after a failed step): the state is this rank's newest commit, a step every
/// rank of its last generation completed, so that a preemption's requeue checkpoints it
/// rather than leave the job to its last periodic checkpoint. bench-sharing (release build,
/// 2026-12-07): rank 0 of a ring shrunk 3 → 2 was joining the new generation when the ring
/// was requeued, its peer stopped before joining, and the retry went back 1053 steps.
fn stopped_at_commit(mut summary: ElasticSummary, log: &CommitLog) -> ElasticSummary {
    summary.state = log.latest().map(|s| TrainState::clone(s));
    summary
}

/// Ends a trainer's generation after a failed step: stops its gradient task and closes
/// the communicator.
async fn close(trainer: Trainer) {
    match trainer.into_communicator().await {
        Ok(comm) => comm.shutdown().await,
        Err(e) => warn!(error = %e, "closing the generation's communicator"),
    }
}

/// Whether [`depart`] waits for the communicator's linger (the worker stops after it) or
/// leaves it to a background task (the worker joins a newer generation at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Departure {
    Awaited,
    Background,
}

/// Ends a healthy generation this rank leaves at a step boundary (for a newer generation,
/// or a stop: a preemption's leaver), without an abort. A peer may still be finishing the
/// same step's collective, reading this rank's last frames: an abort failed that step on
/// it after its optimizer had applied part of it, so it could not commit the step and the
/// next generation went back to an older commit (bench-sharing at release speed: a shrink
/// cost the survivors up to `commit_every_steps - 1` steps, a growth 1). The links stay
/// open for the communicator's `abort_linger_ms`, long enough for such a peer to finish,
/// then close; a peer that went on into the next step without this rank sees it lost
/// then, before any of that step's gradients could be reduced, so that step fails
/// untouched and the peer commits where it was (0 steps lost).
async fn depart(trainer: Trainer, how: Departure) {
    match trainer.into_communicator().await {
        Ok(comm) => {
            let linger = Duration::from_millis(comm.limits().abort_linger_ms);
            let closing = async move {
                tokio::time::sleep(linger).await;
                comm.shutdown().await;
            };
            match how {
                Departure::Awaited => closing.await,
                Departure::Background => {
                    tokio::spawn(closing);
                }
            }
        }
        Err(e) => warn!(error = %e, "closing the generation's communicator"),
    }
}

/// Ends a superseded generation whose step was aborted: stops the trainer's gradient task
/// and relays the abort to the peers in the background. The relay lingers up to
/// `abort_linger_ms` on a peer that does not read (the silent one the abort was most
/// likely for); the survivors are leaving for the newer generation anyway, so joining it
/// does not wait for that.
async fn leave(trainer: Trainer) {
    match trainer.into_communicator().await {
        Ok(comm) => {
            tokio::spawn(comm.shutdown());
        }
        Err(e) => warn!(error = %e, "closing the generation's communicator"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(e: CollectiveError) -> Option<usize> {
        match failed(3, &e) {
            ElasticEvent::Failed { lost_rank, .. } => lost_rank,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failure_names_the_peer_that_broke_or_never_came() {
        assert_eq!(lost(CollectiveError::PeerLost { rank: 2 }), Some(2));
        let never = CollectiveError::Connect {
            rank: 4,
            detail: "connection refused".into(),
        };
        assert_eq!(lost(never), Some(4));
        assert_eq!(lost(CollectiveError::Aborted), None);
    }
}
