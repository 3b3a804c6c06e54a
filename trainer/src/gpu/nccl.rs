//! A step whose gradients NCCL averages, for a generation whose every rank computes on
//! CUDA: the gradients, the parameters and the optimizer's state stay in device memory.
//!
//! - As the backward pass finishes a layer, its gradients are queued for NCCL's average
//!   ([`DeviceStep::queue_layer`]: one group call per layer, the bucket, on NCCL's stream,
//!   ordered after the kernels that wrote them by cudarc's events), so the allreduce of the
//!   last layers runs while the first layers' gradients are computed.
//! - At the end ([`DeviceStep::finish`]) the loss joins the average (a buffer kept between
//!   steps), the host waits for NCCL by polling (an abort by the watchdog ends the wait with
//!   the generation's cause, as over TCP), and the device optimizer updates the parameters
//!   in place.
//! - The host's parameters and optimizer state are then older than the device's;
//!   [`DeviceStep::sync_to_host`] brings them back for a checkpoint or an elastic commit, and
//!   [`DeviceStep::host_changed`] sends them up again after a restore.
//!
//! The waits run the blocking NCCL calls on the calling thread: inside `block_in_place`
//! on a multi-threaded runtime (so the runtime's other tasks, the watchdog among them, go
//! on), directly otherwise (a current-thread runtime, where `block_in_place` panics).

use collective::{NcclCommunicator, ReduceOp};

use super::cuda::{Cuda, CudaDriver};
use super::device::DevBuf;
use super::device_optimizer::DeviceOptimizer;
use crate::error::TrainError;
use crate::layers::LayerEngine;
use crate::optimizer::Optimizer;

/// The device side of a step with NCCL (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct DeviceStep {
    optimizer: DeviceOptimizer<CudaDriver>,
    /// The step's extras (the loss), averaged with the gradients.
    extras: DevBuf<CudaDriver, f32>,
    /// The host's parameters and optimizer state are older than the device's.
    host_stale: bool,
}

impl DeviceStep {
    /// Queues the average of parameters `ids`' gradients, which the backward pass has just
    /// computed.
    pub(crate) fn queue_layer(
        engine: &mut LayerEngine<Cuda>,
        nccl: &NcclCommunicator,
        ids: [usize; 2],
    ) -> Result<(), TrainError> {
        let (_, grads) = engine.params_and_grads();
        let [a, b] = ids;
        let (lo, hi) = (a.min(b), a.max(b));
        if lo == hi || hi >= grads.len() {
            return Err(TrainError::Device(format!(
                "gradients {a} and {b} of a layer"
            )));
        }
        let (head, tail) = grads.split_at_mut(hi);
        let mut bufs = [head[lo].exact_mut()?, tail[0].exact_mut()?];
        // Off the runtime's worker: the first call waits while NCCL connects to the peers
        // (under the set-up's deadline, `init_timeout_ms`).
        Ok(super::blocking(|| {
            nccl.allreduce_queued(&mut bufs, ReduceOp::Avg)
        })?)
    }

    /// Ends the step: averages `extras` with the queued gradients, waits for NCCL, and
    /// updates every parameter on the device with learning rate `lr` (`host` supplies the
    /// update's coefficients, after its `begin_step`, and the state at the first step).
    /// `extras` holds the average afterwards.
    pub(crate) fn finish(
        &mut self,
        engine: &mut LayerEngine<Cuda>,
        nccl: &NcclCommunicator,
        host: &mut Optimizer,
        extras: &mut [f32],
        lr: f32,
    ) -> Result<(), TrainError> {
        let be = engine.backend().clone();
        if !self.optimizer.is_loaded() {
            self.optimizer.load(&be, host)?;
        }
        crate::Backend::upload(&be, extras, &mut self.extras)?;
        let averaged = self.extras.exact_mut()?;
        super::blocking(|| nccl.allreduce_queued(&mut [averaged], ReduceOp::Avg))?;
        super::blocking(|| nccl.wait_queued())?;
        let c = host.coefficients();
        let (params, grads) = engine.params_and_grads();
        for (i, (p, g)) in params.iter_mut().zip(grads.iter()).enumerate() {
            self.optimizer.update(&be, i, p, g, lr, &c)?;
        }
        self.host_stale = true;
        let mut stage = Vec::new();
        extras.copy_from_slice(crate::Backend::view(&be, &self.extras, &mut stage)?);
        Ok(())
    }

    /// Brings the parameters and the optimizer state on the device into `params` and
    /// `host`, if they are newer there.
    pub(crate) fn sync_to_host(
        &mut self,
        engine: &LayerEngine<Cuda>,
        params: &mut [Vec<f32>],
        host: &mut Optimizer,
    ) -> Result<(), TrainError> {
        if self.host_stale {
            engine.params_to_host(params)?;
            self.optimizer.store(engine.backend(), host)?;
            self.host_stale = false;
        }
        Ok(())
    }

    /// The host's parameters and optimizer state changed (a restore): the device takes
    /// them at the next step.
    pub(crate) fn host_changed(&mut self, engine: &mut LayerEngine<Cuda>) {
        engine.params_changed();
        self.optimizer.unload();
        self.host_stale = false;
    }
}
