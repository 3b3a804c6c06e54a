//! Gradients averaged on the device with NCCL, for a generation whose every rank computes
//! on CUDA.

use collective::{NcclCommunicator, ReduceOp};

use super::cuda::Cuda;
use super::device::DevBuf;
use crate::backend::Backend;
use crate::error::TrainError;
use crate::layers::LayerEngine;

/// Averages every gradient of `engine` (left on the device by the backward pass) and
/// `extras` across the ranks with NCCL, then copies the gradients into `grads`.
///
/// Blocks the thread (inside `block_in_place`: the runtime must be multi-threaded) until
/// NCCL is done; a lost peer aborts the communicator and returns its
/// [`collective::CollectiveError::PeerLost`], as over TCP.
pub(crate) fn average(
    engine: &mut LayerEngine<Cuda>,
    nccl: &NcclCommunicator,
    grads: &mut [Vec<f32>],
    extras: &mut [f32],
) -> Result<(), TrainError> {
    let be = engine.backend().clone();
    let mut ex = DevBuf::default();
    be.upload(extras, &mut ex)?;
    // NCCL runs on a stream of its own: everything the engine queued must be done first.
    be.synchronize()?;
    tokio::task::block_in_place(|| -> Result<(), TrainError> {
        for g in engine.device_grads().iter_mut().chain([&mut ex]) {
            nccl.allreduce(g.exact_mut()?, ReduceOp::Avg)?;
        }
        Ok(())
    })?;
    let mut stage = Vec::new();
    extras.copy_from_slice(be.view(&ex, &mut stage)?);
    engine.grads_to_host(grads)
}
