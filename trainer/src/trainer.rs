//! The data-parallel training loop.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{Device, D};
use collective::{AbortHandle, Communicator, NcclCommunicator, NcclDouble};
use serde::Serialize;
use tracing::info;

use crate::checkpointer::Checkpointer;
use crate::commit_log::{CommitLog, COMMITS_KEPT};
use crate::compute_clock::ComputeClock;
use crate::dataset::Dataset;
use crate::error::TrainError;
use crate::faults::Faults;
use crate::gpu::double_step::DoubleStep;
use crate::gpu::{Device as ComputeDevice, Engine};
use crate::grad_sync::{GradSync, SyncTimes};
use crate::layers::LayerGrads;
use crate::model::Model;
use crate::optimizer::Optimizer;
use crate::sampler::{DataCursor, Sampler};
use crate::schedule::LrSchedule;
use crate::spec::{SufficientFactors, TrainSpec};
use crate::state::{splitmix64, NamedTensor, StateMeta, TrainState, STATE_FORMAT};

/// Samples per forward pass during validation.
pub const EVAL_BATCH_SAMPLES: usize = 256;
/// Gradient bucket size, bytes (after the first).
pub const BUCKET_BYTES: usize = 4 << 20;
/// First gradient bucket size, bytes: small, so the first allreduce starts early. Also the
/// least a partial bucket holds to be sent at the end of a layer's backward.
pub const FIRST_BUCKET_BYTES: usize = 256 << 10;

/// Per-step metrics.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Steps done after this one.
    pub step: u64,
    /// Epoch this step belonged to.
    pub epoch: u64,
    /// Training loss averaged over all ranks' batches.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Samples per second over the whole group (global batch / step time).
    pub samples_per_s: f64,
    /// Samples in this step over the whole group: the global batch (world × micro-batches
    /// × batch per worker).
    pub samples_per_step: u64,
    /// Forward and backward, s.
    pub compute_s: f64,
    /// Gradient extraction and bucket packing (overlapped with allreduce of full buckets), s.
    pub pack_s: f64,
    /// Waiting for the allreduce after the last push, and unpacking, s.
    pub comm_wait_s: f64,
    /// Optimizer updates (each done as its gradient comes back, between waits) and, for
    /// the autograd engine, writing parameters back into the model, s.
    pub optim_s: f64,
    /// Whole step, s.
    pub step_s: f64,
    /// Bytes this rank sent over the collective in the step (by the ring's schedule; 0 on
    /// one rank).
    pub sent_bytes: u64,
}

/// Validation metrics at the end of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EpochMetrics {
    /// Epoch just finished.
    pub epoch: u64,
    /// Steps done.
    pub step: u64,
    /// Mean validation loss.
    pub val_loss: f64,
    /// Validation accuracy in [0, 1] (next-character accuracy for the language model).
    pub val_accuracy: f64,
}

/// Progress reported by [`Trainer::run`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Event {
    /// A step finished.
    Step(StepMetrics),
    /// An epoch finished and was validated.
    Epoch(EpochMetrics),
    /// The train state was committed to memory at this step.
    Committed(u64),
    /// A checkpoint of this step was handed to the writer (rank 0).
    Checkpoint(u64),
}

/// How [`Trainer::run_until`] ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    /// The step budget is spent; the final validation.
    Finished(EpochMetrics),
    /// The interrupt asked to stop between two steps (no step is half done, the state is
    /// consistent and nothing was validated or checkpointed at the end).
    Interrupted,
}

/// One rank of a data-parallel job.
///
/// Every step: the rank's share of the global batch (see [`Sampler`]), forward, mean loss,
/// backward (see [`Trainer::step`]), gradients averaged over the ranks through the bucketer
/// (with the loss riding along), then the same optimizer update on every rank. Invariants: all ranks hold
/// the same parameters after every step (same init from the seed, same averaged gradients,
/// deterministic update); a fixed seed and world size gives bit-identical runs; N ranks with
/// batch b follow one rank with batch N·b to float tolerance (with the same peak rate).
pub struct Trainer {
    spec: TrainSpec,
    rank: usize,
    world: usize,
    model: Model,
    /// The layer-wise engine (MLP, CNN) on this rank's device; `None`: candle's autograd
    /// (transformer).
    layers: Option<Engine>,
    /// Dense layers whose gradients leave as sufficient factors.
    factored: usize,
    /// This rank's links that are not shared memory.
    network_links: usize,
    /// `auto` factors not chosen yet (they are at the start of this trainer's first step).
    factors_pending: bool,
    params: Vec<Vec<f32>>,
    /// Gradients, then their averages, in parameter order.
    grads: Vec<Vec<f32>>,
    /// Reused batch buffers of the layer-wise engine.
    xs: Vec<f32>,
    ys: Vec<u32>,
    optimizer: Optimizer,
    schedule: LrSchedule,
    sampler: Sampler,
    train: Dataset,
    val: Dataset,
    sync: GradSync,
    step: u64,
    cursor: DataCursor,
    rng: u64,
    total_steps: u64,
    steps_per_epoch: u64,
    /// In-memory commits, newest last (what elastic recovery restores).
    commits: CommitLog,
    metrics: HashMap<String, f64>,
    /// Test-only faults (a straggler's delay, a hang); none in production.
    faults: Faults,
    /// Marks the step's compute sections (the progress heartbeat).
    compute_clock: ComputeClock,
    /// Stop (validated and checkpointed, as at the end) once this many epochs are done,
    /// before the step budget is spent: a search trial trained to its rung, whose schedule
    /// stays the whole run's so that a promotion goes on exactly where it stopped.
    stop_epoch: Option<u64>,
    /// Cancels the communicator's operations (it lives in the gradient task).
    abort: AbortHandle,
    /// Averages the gradients on the device when every rank computes on CUDA
    /// ([`Trainer::new_on`]); `None`: over the TCP ring.
    nccl: Option<NcclCommunicator>,
    /// Averages the gradients through an NCCL-like device group on the CPU
    /// ([`Trainer::set_nccl_double`]); exclusive of `nccl`.
    double: Option<DoubleStep>,
    /// Micro-batches per step ([`Trainer::set_accumulation`]): 1, or more when a ring
    /// shrunk by a preemption keeps its global batch.
    accumulate: usize,
    /// The summed gradients of a step's micro-batches before its last (accumulation only).
    acc: Vec<Vec<f32>>,
    /// The last step failed before its optimizer changed any parameter (host optimizer):
    /// the state is still the previous step's, whole, and may be committed.
    failed_untouched: bool,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("step", &self.step)
            .field("cursor", &self.cursor)
            .finish()
    }
}

impl Trainer {
    /// A trainer for `spec` on `comm`'s rank, computing on the CPU. Needs a tokio runtime.
    /// Every rank builds the same initial parameters from the seed, so no broadcast is
    /// needed.
    pub fn new(spec: &TrainSpec, comm: Communicator) -> Result<Self, TrainError> {
        Self::new_on(spec, comm, &ComputeDevice::Cpu, None)
    }

    /// [`Trainer::new`] computing on `device` (the MLP and the CNN; the transformer stays on
    /// the CPU): see [`crate::gpu`]. With `nccl` (from [`crate::gpu::connect_nccl`], made
    /// when every rank of the generation trains on CUDA) the gradients are averaged on the
    /// device instead of over the TCP ring; that needs the layer-wise engine on CUDA.
    pub fn new_on(
        spec: &TrainSpec,
        comm: Communicator,
        device: &ComputeDevice,
        nccl: Option<NcclCommunicator>,
    ) -> Result<Self, TrainError> {
        spec.validate()?;
        let (rank, world) = (comm.rank(), comm.world());
        let seed = spec.train.seed;
        let (train, val) = Dataset::load(&spec.data, spec.model.seq_len, seed)?;
        let global_batch = world * spec.train.batch_per_worker;
        let sampler = Sampler::new(train.len(), seed);
        let steps_per_epoch = sampler.steps_per_epoch(global_batch);
        if steps_per_epoch == 0 {
            return Err(TrainError::Spec(format!(
                "global batch {global_batch} exceeds the {} training samples",
                train.len()
            )));
        }
        let mut total_steps = spec.train.epochs.saturating_mul(steps_per_epoch);
        if let Some(m) = spec.train.max_steps {
            total_steps = if spec.train.epochs == 0 {
                m
            } else {
                total_steps.min(m)
            };
        }
        let model = Model::new(&spec.model, train.input_shape(), train.classes(), seed)?;
        let params = model.values()?;
        let sizes: Vec<usize> = params.iter().map(Vec::len).collect();
        let names: Vec<&str> = model.params().iter().map(|(n, _)| n.as_str()).collect();
        let mut layers = Engine::for_model(
            device,
            &spec.model,
            train.input_shape(),
            train.classes(),
            &names,
        )?;
        // `auto` waits for the first step, which tells every rank whether any rank has a
        // network link (see `Trainer::choose_factors`); the other modes decide now.
        let t = &spec.train;
        let factored = match (&mut layers, t.sufficient_factors) {
            (Some(l), mode) if mode != SufficientFactors::Auto => {
                l.choose_factors(mode, world, t.batch_per_worker)
            }
            _ => 0,
        };
        if nccl.is_some() {
            match &mut layers {
                Some(l) => l.keep_state_on_device()?,
                None => {
                    return Err(TrainError::Device(
                        "NCCL gradients need the layer-wise engine on CUDA".into(),
                    ))
                }
            }
        }
        let network_links = comm.network_links();
        let abort = comm.abort_handle();
        let grads = sizes.iter().map(|&n| vec![0.0; n]).collect();
        let optimizer = Optimizer::new(&spec.train, &sizes);
        let schedule = LrSchedule::new(&spec.train, world, steps_per_epoch, total_steps);
        let sync = GradSync::new(
            comm,
            BUCKET_BYTES,
            FIRST_BUCKET_BYTES,
            spec.train.grad_compression,
        )?;
        info!(
            rank,
            world,
            params = model.num_params(),
            steps_per_epoch,
            total_steps,
            peak_lr = schedule.peak(),
            factored,
            device = layers.as_ref().map_or_else(|| "cpu".into(), Engine::device),
            "trainer ready"
        );
        Ok(Trainer {
            spec: spec.clone(),
            rank,
            world,
            model,
            layers,
            factored,
            network_links,
            factors_pending: spec.train.sufficient_factors == SufficientFactors::Auto,
            params,
            grads,
            xs: Vec::new(),
            ys: Vec::new(),
            optimizer,
            schedule,
            sampler,
            train,
            val,
            sync,
            step: 0,
            cursor: DataCursor::default(),
            rng: seed,
            total_steps,
            steps_per_epoch,
            commits: CommitLog::new(COMMITS_KEPT),
            metrics: HashMap::new(),
            faults: Faults::default(),
            compute_clock: ComputeClock::default(),
            stop_epoch: None,
            abort,
            nccl,
            double: None,
            accumulate: 1,
            acc: Vec::new(),
            failed_untouched: false,
        })
    }

    /// Steps accumulate the gradients of `k` micro-batches of `batch_per_worker` on every
    /// rank before they are averaged, so a ring of `world` ranks steps as `world × k`
    /// ranks would: the same global batch, sample order, step budget and learning-rate
    /// schedule (peak = base lr × world × k), to float tolerance. Used when a preemption
    /// shrank the ring and the job keeps its global batch (`[elastic] keep_global_batch`).
    /// Call before [`Trainer::restore`]. Gradients then travel whole (no sufficient
    /// factors: they are per micro-batch); over NCCL accumulation is not done and `k`
    /// stays 1 (the learning rate is rescaled linearly instead), which this returns.
    pub fn set_accumulation(&mut self, k: usize) -> usize {
        let k = if self.nccl.is_some() || self.double.is_some() {
            1
        } else {
            k.max(1)
        };
        if k == self.accumulate {
            return k;
        }
        self.accumulate = k;
        if k > 1 {
            self.factors_pending = false;
            if let Some(l) = &mut self.layers {
                self.factored = l.choose_factors(SufficientFactors::Never, 1, 1);
            }
        }
        let world = self.world * k;
        let global_batch = world * self.spec.train.batch_per_worker;
        self.steps_per_epoch = self.sampler.steps_per_epoch(global_batch).max(1);
        let t = &self.spec.train;
        let mut total = t.epochs.saturating_mul(self.steps_per_epoch);
        if let Some(m) = t.max_steps {
            total = if t.epochs == 0 { m } else { total.min(m) };
        }
        self.total_steps = total;
        self.schedule = LrSchedule::new(t, world, self.steps_per_epoch, self.total_steps);
        info!(
            rank = self.rank,
            world = self.world,
            micro_batches = k,
            peak_lr = self.schedule.peak(),
            "steps accumulate micro-batches: the global batch of {world} ranks is kept"
        );
        k
    }

    /// Averages this trainer's gradients through `group`, a device group with NCCL's
    /// semantics on the CPU ([`collective::NcclDouble`]), instead of the TCP ring: for
    /// testing the elastic path as it runs over NCCL. Gradients travel whole (no sufficient
    /// factors) and steps do not accumulate; needs the layer-wise engine and no NCCL.
    pub fn set_nccl_double(&mut self, group: NcclDouble) -> Result<(), TrainError> {
        let Some(layers) = &mut self.layers else {
            return Err(TrainError::Device(
                "an nccl double needs the layer-wise engine (mlp or cnn)".into(),
            ));
        };
        if self.nccl.is_some() {
            return Err(TrainError::Device(
                "an nccl double beside an nccl communicator".into(),
            ));
        }
        self.factored = layers.choose_factors(SufficientFactors::Never, 1, 1);
        self.factors_pending = false;
        let sizes: Vec<usize> = self.params.iter().map(Vec::len).collect();
        self.double = Some(DoubleStep::new(group, &sizes));
        Ok(())
    }

    /// The normal end of the generation's device group, on every rank: a barrier, then
    /// finalize and destroy ([`NcclCommunicator::finish`], or the NCCL double's). Blocks
    /// while a peer is gone until the group's watchdog aborts it. A group dropped without
    /// it (a failed or superseded generation) is aborted, never waited on.
    pub fn finish_device_group(&mut self) -> Result<(), TrainError> {
        if let Some(n) = self.nccl.take() {
            crate::gpu::blocking(|| n.finish())?;
        }
        match self.double.take() {
            Some(d) => d.end(),
            None => Ok(()),
        }
    }

    /// Whether the last step failed before its optimizer changed anything (host optimizer
    /// only), so the state is still the previous step's, whole: a rank leaving a ring at
    /// a re-form commits it, and the next generation loses no step.
    pub fn failed_untouched(&self) -> bool {
        self.failed_untouched
    }

    /// Micro-batches per step (see [`Trainer::set_accumulation`]).
    pub fn accumulation(&self) -> usize {
        self.accumulate
    }

    /// Runs micro-batches `0..k-1` of this step on this rank alone: their mean loss's
    /// gradients summed into `acc`, their losses summed into the return.
    fn local_micro_batches(&mut self) -> Result<f32, TrainError> {
        let (k, b) = (self.accumulate, self.spec.train.batch_per_worker);
        self.acc.resize_with(self.grads.len(), Vec::new);
        for (a, g) in self.acc.iter_mut().zip(&self.grads) {
            a.clear();
            a.resize(g.len(), 0.0);
        }
        let mut loss_sum = 0.0f32;
        for j in 0..k - 1 {
            let idx =
                self.sampler
                    .indices(self.cursor, self.rank + j * self.world, self.world * k, b);
            let _computing = self.compute_clock.enter();
            match &mut self.layers {
                Some(layers) => {
                    self.train
                        .image_batch_into(&idx, &mut self.xs, &mut self.ys)?;
                    layers.forward(&self.params, &self.xs, b)?;
                    loss_sum += layers.loss(&self.ys)?;
                    for i in (0..layers.len()).rev() {
                        if let Some(LayerGrads::Params(ps)) =
                            layers.backward_params(i, &mut self.grads)?
                        {
                            for p in ps {
                                add_into(&mut self.acc[p], &self.grads[p]);
                            }
                        }
                        layers.backward_input(i, &self.params)?;
                    }
                }
                None => {
                    let batch = self.train.batch(&idx, &Device::Cpu)?;
                    let logits = self.model.forward(&batch.x)?;
                    let loss = candle_nn::loss::cross_entropy(&logits, &batch.y)?;
                    let grads = loss.backward()?;
                    loss_sum += loss.to_scalar::<f32>()?;
                    for (i, (_, v)) in self.model.params().iter().enumerate() {
                        if let Some(t) = grads.get(v.as_tensor()) {
                            let flat = t.flatten_all()?.to_vec1::<f32>()?;
                            add_into(&mut self.acc[i], &flat);
                        }
                    }
                }
            }
        }
        Ok(loss_sum)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// World size.
    pub fn world(&self) -> usize {
        self.world
    }
    /// A handle that aborts this trainer's communicator from another task
    /// ([`AbortHandle::abort`]): the step in flight (and every later one) fails with
    /// [`collective::CollectiveError::Aborted`], and the peers' with `PeerAborted`. The
    /// trainer's state is then mid-step: restore a commit before training on.
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }
    /// Steps done.
    pub fn step_count(&self) -> u64 {
        self.step
    }
    /// Dense layers whose gradients travel as sufficient factors rather than through the
    /// allreduce (see [`crate::SufficientFactors`]).
    pub fn factored_layers(&self) -> usize {
        self.factored
    }
    /// Steps the run takes in all (epochs × steps per epoch, capped by `max_steps`).
    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }
    /// Global steps per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }
    /// The data cursor.
    pub fn cursor(&self) -> DataCursor {
        self.cursor
    }
    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }
    /// Current parameters, in parameter order (brought back from the device first when
    /// NCCL steps keep them there).
    pub fn params(&mut self) -> Result<&[Vec<f32>], TrainError> {
        self.sync_host()?;
        Ok(&self.params)
    }

    /// Brings the parameters and the optimizer state back to host memory where NCCL steps
    /// keep them on the device (see [`crate::gpu`]); nothing otherwise.
    fn sync_host(&mut self) -> Result<(), TrainError> {
        match &mut self.layers {
            Some(l) => l.sync_to_host(&mut self.params, &mut self.optimizer),
            None => Ok(()),
        }
    }
    /// The last in-memory commit.
    pub fn committed(&self) -> Option<&Arc<TrainState>> {
        self.commits.latest()
    }
    /// The in-memory commits (the last [`COMMITS_KEPT`]).
    pub fn commits(&self) -> &CommitLog {
        &self.commits
    }
    /// Takes the in-memory commits out (leaving an empty log), to carry them into the
    /// trainer of the next generation.
    pub fn take_commits(&mut self) -> CommitLog {
        std::mem::replace(&mut self.commits, CommitLog::new(COMMITS_KEPT))
    }
    /// Replaces the in-memory commits (those carried over from the previous generation).
    pub fn set_commits(&mut self, commits: CommitLog) {
        self.commits = commits;
    }
    /// The test-only faults this trainer drives into its steps ([`Faults`]: built from the
    /// test environment variables only; none by default).
    pub fn set_faults(&mut self, faults: Faults) {
        self.faults = faults;
    }

    /// Marks this trainer's compute sections on `clock` (read by a heartbeat thread).
    pub fn set_compute_clock(&mut self, clock: ComputeClock) {
        self.compute_clock = clock;
    }

    /// One data-parallel step.
    ///
    /// With the layer-wise engine each layer's gradients are pushed to the allreduce as
    /// soon as the backward pass has computed them, so the last layers' buckets are on the
    /// wire while the first layers' gradients are computed. With candle's autograd all
    /// gradients come at once, after `backward()`.
    pub async fn step(&mut self) -> Result<StepMetrics, TrainError> {
        let t0 = Instant::now();
        self.failed_untouched = true;
        self.faults.delay_step().await;
        let b = self.spec.train.batch_per_worker;
        let k = self.accumulate;
        // With accumulation this rank is virtual ranks rank + j·world of world·k, the last
        // micro-batch's gradients joined with the others' sum on their way to the ring.
        let local_loss = if k > 1 {
            self.local_micro_batches()?
        } else {
            0.0
        };
        let idx = self.sampler.indices(
            self.cursor,
            self.rank + (k - 1) * self.world,
            self.world * k,
            b,
        );
        if self.factors_pending {
            // Whether this rank has network links, averaged: whether any rank has.
            let mut any = [f32::from(u8::from(self.network_links > 0))];
            self.sync.average_now(&mut any).await?;
            self.factors_pending = false;
            self.choose_factors(any[0] > 0.0);
        }
        let mut extras = [0.0f32];
        // Time queuing gradients on a device group (NCCL's first call connects to the
        // peers): waiting for them, not compute.
        let mut queue_wait = Duration::ZERO;
        match &mut self.layers {
            Some(layers) => {
                self.train
                    .image_batch_into(&idx, &mut self.xs, &mut self.ys)?;
                {
                    let _computing = self.compute_clock.enter();
                    self.faults.hang_in_forward(self.step + 1).await;
                    layers.forward(&self.params, &self.xs, b)?;
                    extras[0] = (layers.loss(&self.ys)? + local_loss) / k as f32;
                }
                // With NCCL the loss joins the gradients' average at the end of the step.
                if self.nccl.is_none() && self.double.is_none() {
                    self.sync.push_extras(&extras).await?;
                }
                for i in (0..layers.len()).rev() {
                    // This layer's gradients go on the wire before the gradient of its input
                    // is computed.
                    let grads = {
                        let _computing = self.compute_clock.enter();
                        layers.backward_params(i, &mut self.grads)?
                    };
                    if let Some(nccl) = &self.nccl {
                        // Queued on NCCL's stream behind the kernels that computed them.
                        if let Some(LayerGrads::Params(ids)) = grads {
                            let t = Instant::now();
                            layers.queue_layer(nccl, ids)?;
                            queue_wait += t.elapsed();
                        }
                    } else if let Some(d) = &self.double {
                        // Copied to the group's buffers and queued; returns at once.
                        if let Some(LayerGrads::Params(ids)) = grads {
                            let t = Instant::now();
                            d.queue(&ids, &self.grads)?;
                            queue_wait += t.elapsed();
                        }
                    } else {
                        match grads {
                            Some(LayerGrads::Params(ps)) => {
                                for p in ps {
                                    if k > 1 {
                                        mean_into(&mut self.grads[p], &self.acc[p], k);
                                    }
                                    self.sync.push(p, &self.grads[p]).await?;
                                }
                                self.sync.pause(FIRST_BUCKET_BYTES).await?;
                            }
                            Some(LayerGrads::Factors {
                                params,
                                out_grad,
                                input,
                                dims,
                            }) => {
                                self.sync
                                    .push_factors(params, out_grad, input, dims)
                                    .await?;
                            }
                            None => {}
                        }
                    }
                    let _computing = self.compute_clock.enter();
                    layers.backward_input(i, &self.params)?;
                }
            }
            None => {
                let batch = self.train.batch(&idx, &Device::Cpu)?;
                let computing = self.compute_clock.enter();
                let logits = self.model.forward(&batch.x)?;
                let loss = candle_nn::loss::cross_entropy(&logits, &batch.y)?;
                let grads = loss.backward()?;
                drop(computing);
                extras[0] = (loss.to_scalar::<f32>()? + local_loss) / k as f32;
                self.sync.push_extras(&extras).await?;
                for (i, (_, v)) in self.model.params().iter().enumerate() {
                    let g = &mut self.grads[i];
                    match grads.get(v.as_tensor()) {
                        Some(t) => {
                            let flat = t.flatten_all()?;
                            g.clear();
                            g.extend_from_slice(&flat.to_vec1::<f32>()?);
                        }
                        // A parameter the loss does not reach.
                        None => g.fill(0.0),
                    }
                    if k > 1 {
                        mean_into(g, &self.acc[i], k);
                    }
                    self.sync.push(i, g).await?;
                }
            }
        }
        let t1 = Instant::now();
        // Each parameter is updated as soon as its averaged gradient is in, while later
        // buckets are still being reduced.
        let lr = self.schedule.lr(self.step);
        self.optimizer.begin_step();
        let (params, optimizer) = (&mut self.params, &mut self.optimizer);
        let mut optim = Duration::ZERO;
        let times = match (&self.nccl, &mut self.layers) {
            (Some(nccl), Some(layers)) => {
                self.failed_untouched = false;
                // The optimizer's kernels are queued behind NCCL's: their time is the wait's.
                layers.finish_on_device(nccl, optimizer, &mut extras, lr as f32)?;
                SyncTimes::default()
            }
            (None, Some(_)) if self.double.is_some() => {
                let d = self.double.as_ref().expect("checked");
                // Nothing is updated before the group's work is known complete: a step cut
                // short by a lost peer leaves the last step's state whole.
                if let Err(e) = d.finish(&mut self.grads, &mut extras) {
                    optimizer.cancel_step();
                    return Err(e);
                }
                self.failed_untouched = false;
                for (i, g) in self.grads.iter().enumerate() {
                    let t = Instant::now();
                    optimizer.update(i, &mut params[i], g, lr as f32);
                    optim += t.elapsed();
                }
                SyncTimes::default()
            }
            _ => {
                let mut updates = 0usize;
                let finished = self
                    .sync
                    .finish(&mut self.grads, &mut extras, |i, g| {
                        let t = Instant::now();
                        optimizer.update(i, &mut params[i], g, lr as f32);
                        optim += t.elapsed();
                        updates += 1;
                    })
                    .await;
                if finished.is_err() && updates == 0 {
                    // Nothing changed: the state is the previous step's, whole.
                    optimizer.cancel_step();
                } else {
                    self.failed_untouched = false;
                }
                finished?
            }
        };
        let t2 = Instant::now();
        if self.layers.is_none() {
            self.model.set_values(&self.params)?;
        }
        let t3 = Instant::now();
        let epoch = self.cursor.epoch;
        self.cursor = self.sampler.advance(self.cursor, b * self.world * k);
        self.step += 1;
        splitmix64(&mut self.rng);
        let step_s = (t3 - t0).as_secs_f64();
        let m = StepMetrics {
            step: self.step,
            epoch,
            loss: extras[0] as f64,
            lr,
            samples_per_s: (b * self.world * k) as f64 / step_s.max(1e-9),
            samples_per_step: (b * self.world * k) as u64,
            compute_s: ((t1 - t0).saturating_sub(queue_wait).as_secs_f64() - times.pack_s).max(0.0),
            pack_s: times.pack_s,
            comm_wait_s: ((t2 - t1).saturating_sub(optim) + queue_wait).as_secs_f64(),
            optim_s: (optim + (t3 - t2)).as_secs_f64(),
            step_s,
            sent_bytes: times.sent_bytes,
        };
        self.metrics.insert("loss".into(), m.loss);
        Ok(m)
    }

    /// Chooses, at the start of the first step, the dense layers whose gradients leave as sufficient
    /// factors under `auto`: those where that sends at most half the bytes, and only when
    /// some rank's links go over the network. On one host (every link shared memory, at
    /// GB/s) the allreduce is cheap and the factors' extra products (each rank forms every
    /// rank's share of the weight gradient) cost more than they save. Every rank sees the
    /// same averaged flag, so all decide alike, and alike on every run.
    fn choose_factors(&mut self, any_network: bool) {
        let t = &self.spec.train;
        if t.sufficient_factors != SufficientFactors::Auto {
            return;
        }
        if let Some(l) = &mut self.layers {
            let world = if any_network { self.world } else { 1 };
            self.factored = l.choose_factors(SufficientFactors::Auto, world, t.batch_per_worker);
            info!(
                rank = self.rank,
                any_network,
                factored = self.factored,
                "dense layers whose gradients travel as sufficient factors"
            );
        }
    }

    /// Validation loss and accuracy over the whole validation set (every rank computes the
    /// same numbers; the set is small).
    pub fn evaluate(&mut self) -> Result<EpochMetrics, TrainError> {
        let mut loss_sum = 0.0f64;
        let mut correct = 0u64;
        let mut count = 0u64;
        let n = self.val.len();
        for lo in (0..n).step_by(EVAL_BATCH_SAMPLES) {
            let idx: Vec<usize> = (lo..(lo + EVAL_BATCH_SAMPLES).min(n)).collect();
            let (loss, hits, preds) = match &mut self.layers {
                Some(layers) => {
                    self.val
                        .image_batch_into(&idx, &mut self.xs, &mut self.ys)?;
                    let classes = self.val.classes();
                    layers.forward(&self.params, &self.xs, idx.len())?;
                    let hits = layers
                        .logits()?
                        .chunks_exact(classes)
                        .zip(&self.ys)
                        .filter(|(row, &y)| argmax(row) == y as usize)
                        .count() as u64;
                    (layers.loss(&self.ys)?, hits, idx.len() as u64)
                }
                None => {
                    let batch = self.val.batch(&idx, &Device::Cpu)?;
                    let logits = self.model.forward(&batch.x)?;
                    let preds = logits.dim(0)? as u64;
                    let loss =
                        candle_nn::loss::cross_entropy(&logits, &batch.y)?.to_scalar::<f32>()?;
                    let hits = logits
                        .argmax(D::Minus1)?
                        .eq(&batch.y)?
                        .to_dtype(candle_core::DType::U32)?
                        .sum_all()?
                        .to_scalar::<u32>()?;
                    (loss, hits as u64, preds)
                }
            };
            loss_sum += loss as f64 * preds as f64;
            correct += hits;
            count += preds;
        }
        let m = EpochMetrics {
            epoch: self.cursor.epoch.saturating_sub(1),
            step: self.step,
            val_loss: loss_sum / count.max(1) as f64,
            val_accuracy: correct as f64 / count.max(1) as f64,
        };
        self.metrics.insert("val_loss".into(), m.val_loss);
        self.metrics.insert("val_accuracy".into(), m.val_accuracy);
        Ok(m)
    }

    /// A copy of the whole train state (brought back from the device first when NCCL steps
    /// keep it there).
    pub fn snapshot(&mut self) -> Result<TrainState, TrainError> {
        self.sync_host()?;
        let names = self.model.params();
        let params = names
            .iter()
            .zip(&self.params)
            .map(|((n, v), data)| NamedTensor {
                name: n.clone(),
                shape: v.dims().to_vec(),
                data: data.clone(),
            })
            .collect();
        let mut optimizer = Vec::new();
        for (suffix, bufs) in self.optimizer.state() {
            for ((n, v), data) in names.iter().zip(bufs) {
                optimizer.push(NamedTensor {
                    name: format!("{n}.{suffix}"),
                    shape: v.dims().to_vec(),
                    data: data.clone(),
                });
            }
        }
        optimizer.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(TrainState {
            meta: StateMeta {
                format: STATE_FORMAT,
                step: self.step,
                epoch: self.cursor.epoch,
                cursor: self.cursor,
                rng: self.rng,
                world: self.world,
                optimizer: self.spec.train.optimizer,
                optimizer_steps: self.optimizer.steps_taken(),
                arch: self.spec.model.arch,
                num_params: self.model.num_params(),
                metrics: self.metrics.clone(),
            },
            params,
            optimizer,
        })
    }

    /// Commits the train state to memory (what elastic recovery restores); the log keeps
    /// the last [`COMMITS_KEPT`].
    pub fn commit(&mut self) -> Result<Arc<TrainState>, TrainError> {
        let s = Arc::new(self.snapshot()?);
        self.commits.push(s.clone());
        Ok(s)
    }

    /// Continues from `state` (a commit or checkpoint of the same model and optimizer; the
    /// world size may differ: the cursor counts samples, not steps).
    ///
    /// The run goes on as this world would run it from the state's position (what matters
    /// when the state was made by another world size, or by a run that changed world size
    /// before: an elastic re-form):
    /// - the cursor moves to the next epoch when this world's global batch no longer fits
    ///   in the rest of the epoch (what [`Sampler::advance`] does every step), so the data
    ///   of the steps from here are sharded over this (rank, world);
    /// - the step budget is the steps restored plus the steps this world needs for the
    ///   rest of the `epochs` (still capped by `max_steps`, which counts steps);
    /// - the learning-rate schedule is built for this world and that budget and evaluated
    ///   at the restored step: peak = base lr × this world under linear scaling, warm-up
    ///   not repeated (a step past this world's warm-up length gets the decayed peak; one
    ///   inside it goes on along this world's ramp).
    ///
    /// For a state written by an uninterrupted run of this world all three are what that
    /// run had (the budget is `epochs` × steps per epoch), so restoring it is exactly the
    /// continuing run.
    pub fn restore(&mut self, state: &TrainState) -> Result<(), TrainError> {
        let m = &state.meta;
        if m.arch != self.spec.model.arch
            || m.num_params != self.model.num_params()
            || m.optimizer != self.spec.train.optimizer
        {
            return Err(TrainError::StateMismatch(format!(
                "state of {:?}/{:?} with {} parameters, trainer has {:?}/{:?} with {}",
                m.arch,
                m.optimizer,
                m.num_params,
                self.spec.model.arch,
                self.spec.train.optimizer,
                self.model.num_params()
            )));
        }
        let names: Vec<&str> = self
            .model
            .params()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        let got: Vec<&str> = state.params.iter().map(|t| t.name.as_str()).collect();
        if names != got {
            return Err(TrainError::StateMismatch("parameter names differ".into()));
        }
        let params: Vec<Vec<f32>> = state.params.iter().map(|t| t.data.clone()).collect();
        let mut groups: Vec<(String, Vec<Vec<f32>>)> = Vec::new();
        for (suffix, _) in self.optimizer.state() {
            let mut bufs = Vec::new();
            for n in &names {
                let key = format!("{n}.{suffix}");
                let t = state
                    .optimizer
                    .iter()
                    .find(|t| t.name == key)
                    .ok_or_else(|| TrainError::StateMismatch(format!("{key} missing")))?;
                bufs.push(t.data.clone());
            }
            groups.push((suffix.to_string(), bufs));
        }
        self.model.set_values(&params)?;
        self.optimizer.restore(m.optimizer_steps, groups)?;
        self.params = params;
        if let Some(l) = &mut self.layers {
            l.host_changed();
        }
        self.step = m.step;
        self.cursor = m.cursor;
        self.rng = m.rng;
        self.metrics = m.metrics.clone();
        self.rebase_on_cursor();
        Ok(())
    }

    /// After a restore: the cursor, step budget and learning-rate schedule of this world
    /// from the restored position (see [`Trainer::restore`]).
    fn rebase_on_cursor(&mut self) {
        let global_batch = self.world * self.accumulate * self.spec.train.batch_per_worker;
        let len = self.train.len();
        if self.cursor.offset + global_batch > len {
            self.cursor = DataCursor {
                epoch: self.cursor.epoch + 1,
                offset: 0,
            };
        }
        let t = &self.spec.train;
        if t.epochs > 0 {
            let rest = if self.cursor.epoch < t.epochs {
                let this_epoch = ((len - self.cursor.offset) / global_batch) as u64;
                this_epoch + (t.epochs - self.cursor.epoch - 1) * self.steps_per_epoch
            } else {
                0
            };
            let mut total = self.step.saturating_add(rest);
            if let Some(m) = t.max_steps {
                total = total.min(m);
            }
            self.total_steps = total;
        }
        let before = self.schedule.clone();
        self.schedule = LrSchedule::new(
            &self.spec.train,
            self.world * self.accumulate,
            self.steps_per_epoch,
            self.total_steps,
        );
        if self.schedule != before {
            info!(
                rank = self.rank,
                world = self.world,
                step = self.step,
                total_steps = self.total_steps,
                lr = self.schedule.lr(self.step),
                "restored a state of another world history: step budget and schedule rebased"
            );
        }
    }

    /// Ends the run once `epochs` epochs are done (see [`Trainer::run_until`]); `None`: at the
    /// end of the step budget only. The learning-rate schedule is not changed: a later run
    /// restored from this one's checkpoint goes on along the same schedule.
    pub fn set_stop_epoch(&mut self, epochs: Option<u64>) {
        self.stop_epoch = epochs;
    }

    /// Whether the epochs [`Trainer::set_stop_epoch`] asked for are done.
    fn stop_reached(&self) -> bool {
        self.stop_epoch.is_some_and(|e| self.cursor.epoch >= e)
    }

    /// Trains until the step budget is spent (or the stop epoch is reached): validates each `eval_every_epochs` epochs and
    /// at the end, commits to memory every `commit_every_steps`, and on rank 0 hands a
    /// checkpoint to `ckpt` every `every_steps` and at the end (unless nothing was trained). Returns the final validation.
    pub async fn run(
        &mut self,
        ckpt: Option<&mut Checkpointer>,
        on_event: impl FnMut(&Event),
    ) -> Result<EpochMetrics, TrainError> {
        match self.run_until(ckpt, on_event, || false).await? {
            RunEnd::Finished(e) => Ok(e),
            RunEnd::Interrupted => unreachable!("the interrupt never fires"),
        }
    }

    /// [`Trainer::run`], asking `interrupt` before every step whether to stop there (a new
    /// generation or a stop from the node): then it returns [`RunEnd::Interrupted`] at once.
    pub async fn run_until(
        &mut self,
        mut ckpt: Option<&mut Checkpointer>,
        mut on_event: impl FnMut(&Event),
        mut interrupt: impl FnMut() -> bool,
    ) -> Result<RunEnd, TrainError> {
        let cfg = self.spec.checkpoint.clone();
        let eval_every = self.spec.train.eval_every_epochs;
        let start = self.step;
        while self.step < self.total_steps && !self.stop_reached() {
            if interrupt() {
                return Ok(RunEnd::Interrupted);
            }
            let m = self.step().await?;
            on_event(&Event::Step(m));
            // A step over a device group never waits on the runtime (its waits block in
            // place), so without this the futures raced with the run (the elastic runner's
            // watch for a newer generation) would not run until the run ended.
            tokio::task::yield_now().await;
            if self.cursor.epoch != m.epoch
                && eval_every > 0
                && self.cursor.epoch.is_multiple_of(eval_every)
                && self.step < self.total_steps
                && !self.stop_reached()
            {
                let e = self.evaluate()?;
                on_event(&Event::Epoch(e));
            }
            if cfg.commit_every_steps > 0 && self.step.is_multiple_of(cfg.commit_every_steps) {
                self.commit()?;
                on_event(&Event::Committed(self.step));
            }
            if let Some(c) = ckpt.as_deref_mut() {
                if self.rank == 0
                    && cfg.every_steps > 0
                    && self.step.is_multiple_of(cfg.every_steps)
                {
                    c.save(Arc::new(self.snapshot()?));
                    on_event(&Event::Checkpoint(self.step));
                }
            }
        }
        let e = self.evaluate()?;
        on_event(&Event::Epoch(e));
        if let Some(c) = ckpt {
            if self.rank == 0
                && cfg.every_steps > 0
                && !self.step.is_multiple_of(cfg.every_steps)
                && self.step > start
            {
                c.save(Arc::new(self.snapshot()?));
                on_event(&Event::Checkpoint(self.step));
            }
        }
        Ok(RunEnd::Finished(e))
    }

    /// Stops the gradient task and returns the communicator.
    pub async fn into_communicator(self) -> Result<Communicator, TrainError> {
        self.sync.into_communicator().await
    }
}

/// Index of the first maximum (candle's `argmax` picks the first on ties too).
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// `acc += g`, element-wise.
fn add_into(acc: &mut [f32], g: &[f32]) {
    for (a, x) in acc.iter_mut().zip(g) {
        *a += x;
    }
}

/// `g = (g + acc) / k`: the mean of a step's `k` micro-batch gradients, `g` the last's.
fn mean_into(g: &mut [f32], acc: &[f32], k: usize) {
    let inv = 1.0 / k as f32;
    for (x, a) in g.iter_mut().zip(acc) {
        *x = (*x + a) * inv;
    }
}
