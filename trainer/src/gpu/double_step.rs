//! A step whose gradients go through an NCCL-like device group on the CPU
//! ([`collective::NcclDouble`]): the elastic path tested against NCCL's failure semantics
//! without a GPU (ranks of an in-memory ring made with `MemoryRing::with_nccl_doubles`).
//!
//! It follows the NCCL step's order ([`super::nccl`]): as the backward pass finishes a
//! layer, its gradients are queued (copied into the group's buffers; the call returns at
//! once, a lost peer or not); at the end the loss joins them, the host waits for the group
//! by polling (only an abort, the watchdog's on a lost peer, ends a wait that cannot
//! complete), and only then are the averaged gradients read back and the optimizer run, so
//! a step whose device work did not complete changes nothing and the last commit stays
//! whole. The wait runs outside every compute section and between the step's compute and
//! optimizer marks: it counts as waiting for gradients, not as compute.

use std::sync::{Arc, Mutex};

use collective::{DeviceBuf, NcclDouble, ReduceOp};

use crate::error::TrainError;

/// The device-group side of a trainer whose generation has an [`NcclDouble`].
#[derive(Debug)]
pub(crate) struct DoubleStep {
    group: NcclDouble,
    /// One "device" buffer a parameter, the gradients' copy the group averages.
    bufs: Vec<DeviceBuf>,
    /// The step's extras (the loss), averaged with the gradients.
    extras: DeviceBuf,
    /// The parameters queued this step: only theirs are read back.
    queued: Mutex<Vec<bool>>,
}

fn buf(n: usize) -> DeviceBuf {
    Arc::new(Mutex::new(vec![0.0; n]))
}

fn lock(b: &DeviceBuf) -> std::sync::MutexGuard<'_, Vec<f32>> {
    b.lock().unwrap_or_else(|p| p.into_inner())
}

impl DoubleStep {
    /// The step of `group` for parameters of these sizes.
    pub(crate) fn new(group: NcclDouble, sizes: &[usize]) -> Self {
        DoubleStep {
            group,
            bufs: sizes.iter().map(|&n| buf(n)).collect(),
            extras: buf(0),
            queued: Mutex::new(vec![false; sizes.len()]),
        }
    }

    /// Queues the average of parameters `ids`' gradients; returns once queued.
    pub(crate) fn queue(&self, ids: &[usize], grads: &[Vec<f32>]) -> Result<(), TrainError> {
        let mut bufs = Vec::with_capacity(ids.len());
        for &p in ids {
            let b = self
                .bufs
                .get(p)
                .ok_or_else(|| TrainError::Device(format!("gradient {p} of a layer")))?;
            {
                let mut d = lock(b);
                d.clear();
                d.extend_from_slice(&grads[p]);
            }
            bufs.push(b.clone());
            self.queued.lock().unwrap_or_else(|p| p.into_inner())[p] = true;
        }
        Ok(self.group.allreduce_queued(&bufs, ReduceOp::Avg)?)
    }

    /// Ends the step's device work: queues `extras`, waits for everything queued, and
    /// reads the averages back into `grads` and `extras`. On an error nothing is read back.
    pub(crate) fn finish(
        &self,
        grads: &mut [Vec<f32>],
        extras: &mut [f32],
    ) -> Result<(), TrainError> {
        {
            let mut e = lock(&self.extras);
            e.clear();
            e.extend_from_slice(extras);
        }
        self.group
            .allreduce_queued(std::slice::from_ref(&self.extras), ReduceOp::Avg)?;
        let queued = std::mem::replace(
            &mut *self.queued.lock().unwrap_or_else(|p| p.into_inner()),
            vec![false; self.bufs.len()],
        );
        super::blocking(|| self.group.wait_queued())?;
        for ((g, b), q) in grads.iter_mut().zip(&self.bufs).zip(queued) {
            let d = lock(b);
            if q && d.len() == g.len() {
                g.copy_from_slice(&d);
            }
        }
        extras.copy_from_slice(&lock(&self.extras));
        Ok(())
    }

    /// The normal end of the generation: the group's barrier, finalize and destroy.
    pub(crate) fn end(self) -> Result<(), TrainError> {
        Ok(super::blocking(|| self.group.finish())?)
    }
}
