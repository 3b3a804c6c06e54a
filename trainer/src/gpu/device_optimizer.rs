//! The optimizer on the device, for a rank whose gradients NCCL averages in device memory:
//! the parameters and the optimizer's state stay there between steps, so a step moves
//! neither the parameters up nor the gradients down (what the first run on an H100 measured
//! as the largest cost: the MLP spent 1.6 ms of its 3.8 ms step in the host optimizer and
//! more in the copies).
//!
//! [`DeviceOptimizer`] holds the state (SGD's momentum, AdamW's two moments) in device
//! buffers and updates with `kernels.cu`'s `sgd_update` and `adamw_update`, the twins of
//! [`crate::Optimizer::update`]; the host optimizer still counts the updates and supplies the
//! coefficients, and is the state's home for checkpoints and elastic commits: [`load`]
//! copies its state to the device, [`store`] back. Written over a [`Driver`], so the tests
//! run it on the emulated device against the host optimizer.
//!
//! [`load`]: DeviceOptimizer::load
//! [`store`]: DeviceOptimizer::store

use crate::error::TrainError;
use crate::optimizer::{Coefficients, Optimizer};
use crate::spec::OptimizerKind;

use super::device::{Arg, DevBuf, DeviceBackend, Driver};

/// The optimizer's state in device memory (see the module docs).
#[derive(Debug)]
pub struct DeviceOptimizer<D: Driver> {
    /// Per parameter: SGD's momentum, AdamW's first moment.
    m: Vec<DevBuf<D, f32>>,
    /// Per parameter: AdamW's second moment (empty for SGD).
    v: Vec<DevBuf<D, f32>>,
    /// Whether `m` and `v` hold the state (else [`DeviceOptimizer::load`] comes first).
    loaded: bool,
}

impl<D: Driver> Default for DeviceOptimizer<D> {
    fn default() -> Self {
        DeviceOptimizer {
            m: Vec::new(),
            v: Vec::new(),
            loaded: false,
        }
    }
}

impl<D: Driver> DeviceOptimizer<D> {
    /// Whether the device holds the state.
    #[cfg(feature = "cuda")]
    pub fn is_loaded(&self) -> bool {
        self.loaded
    }

    /// Copies `host`'s state to the device (at the first update, and after a restore).
    pub fn load(&mut self, be: &DeviceBackend<D>, host: &mut Optimizer) -> Result<(), TrainError> {
        let (m, v) = host.buffers_mut();
        for (dst, src) in [(&mut self.m, &*m), (&mut self.v, &*v)] {
            dst.resize_with(src.len(), DevBuf::default);
            for (d, s) in dst.iter_mut().zip(src) {
                d.upload(be.driver(), s)?;
            }
        }
        self.loaded = true;
        Ok(())
    }

    /// Copies the state on the device into `host` (for a checkpoint or a commit).
    pub fn store(&self, be: &DeviceBackend<D>, host: &mut Optimizer) -> Result<(), TrainError> {
        let (m, v) = host.buffers_mut();
        for (src, dst) in [(&self.m, m), (&self.v, v)] {
            for (s, d) in src.iter().zip(dst.iter_mut()) {
                if !d.is_empty() {
                    be.driver().download(s.mem(), d)?;
                }
            }
        }
        Ok(())
    }

    /// Forgets the state on the device (the host's changed): the next update loads it.
    #[cfg(feature = "cuda")]
    pub fn unload(&mut self) {
        self.loaded = false;
    }

    /// Updates parameter `i` (`p`, with averaged gradient `g`, both on the device) with
    /// learning rate `lr` and the current update's coefficients `c` (from the host
    /// optimizer, after its `begin_step`). The state must be loaded.
    pub fn update(
        &mut self,
        be: &DeviceBackend<D>,
        i: usize,
        p: &mut DevBuf<D, f32>,
        g: &DevBuf<D, f32>,
        lr: f32,
        c: &Coefficients,
    ) -> Result<(), TrainError> {
        let n = p.len();
        if !self.loaded || g.len() != n || self.m.get(i).map(DevBuf::len) != Some(n) {
            return Err(TrainError::Device(format!(
                "device optimizer: parameter {i} of {n} values does not match its state"
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let d = be.driver();
        match c.kind {
            OptimizerKind::Sgd => d.launch(
                "sgd_update",
                n,
                &mut [
                    Arg::FMut(p.mem_mut()),
                    Arg::F(g.mem()),
                    Arg::FMut(self.m[i].mem_mut()),
                    Arg::Z(n),
                    Arg::S(lr),
                    Arg::S(c.momentum),
                    Arg::S(c.weight_decay),
                ],
            ),
            OptimizerKind::Adamw => {
                let v = self.v.get_mut(i).filter(|v| v.len() == n).ok_or_else(|| {
                    TrainError::Device(format!("device optimizer: no second moment for {i}"))
                })?;
                d.launch(
                    "adamw_update",
                    n,
                    &mut [
                        Arg::FMut(p.mem_mut()),
                        Arg::F(g.mem()),
                        Arg::FMut(self.m[i].mem_mut()),
                        Arg::FMut(v.mem_mut()),
                        Arg::Z(n),
                        Arg::S(lr),
                        Arg::S(c.beta1),
                        Arg::S(c.beta2),
                        Arg::S(c.eps),
                        Arg::S(c.weight_decay),
                        Arg::S(c.c1),
                        Arg::S(c.c2),
                    ],
                )
            }
        }
    }
}
