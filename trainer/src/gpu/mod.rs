//! Training on a GPU: where a train rank computes, and the CUDA backend of the layer-wise
//! engine.
//!
//! A train rank the node gave devices (`RINGLEADER_GPUS` ≥ 1, `CUDA_VISIBLE_DEVICES`
//! naming its own alone: the per-rank view, unlike a command rank's, which lists its job's
//! devices on the host) computes on the first of them ([`Device::from_env`]): the MLP and
//! the CNN run the engine of [`crate::LayerEngine`] on a [`DeviceBackend`], which keeps every activation,
//! parameter and gradient in device memory. It is written over a [`Driver`] (memory,
//! copies, a kernel launch by name, `sgemm`): `Cuda` is it on cudarc (feature `cuda`), and the
//! tests run it on a CPU emulator of the same driver (`kernels_on_cpu`), so all of it but
//! cudarc's calls is tested without a GPU.
//! - matrix products are cuBLAS `sgemm` (row-major operands passed as the transposed
//!   column-major problem);
//! - the other kernels (bias, ReLU, im2col and col2im, 2×2 max-pooling, the layout
//!   transposes, softmax cross-entropy) are CUDA C in `kernels.cu`, compiled at start by
//!   NVRTC for the device's architecture, one thread per output value, each the line-by-line
//!   twin of its CPU kernel in `crate::kernels` (col2im gathers instead of scattering, so no
//!   atomics and the same sums in a fixed order);
//! - per step the batch goes up; where the gradients go next depends on the generation
//!   (below).
//!
//! Gradients: when every rank of a generation computes on CUDA and loads libnccl
//! ([`connect_nccl`] asks them over the TCP ring), the step is a device step (`nccl`): as
//! the backward pass finishes a layer, its gradients are queued as one NCCL group on
//! NCCL's stream, so the allreduce of the last layers runs while the first layers' are
//! computed; the optimizer (SGD, AdamW) then runs on the device (`device_optimizer`), and
//! the parameters and the optimizer's state stay in device memory between steps, brought
//! back to the host only for a checkpoint or an elastic commit. NCCL is bootstrapped over a
//! second TCP group whose watchdog is kept, so a lost peer fails the step with `PeerLost`
//! as over TCP. Otherwise (a rank without a GPU, or one that cannot load libnccl) each
//! layer's gradients come down as soon as the backward pass has them and go through host
//! memory over the TCP ring ([`crate::GradSync`]), the optimizer on the host.
//!
//! NCCL's failures are not the ring's: queued work completes for the host at once, a
//! collective whose peer died blocks instead of failing, and only an abort (the
//! watchdog's, on a failed heartbeat) ends the wait. So a device step changes nothing
//! before its wait has returned (the optimizer runs after it), a failed generation's
//! communicator is dropped, which aborts it, and only a normal end waits for it
//! (`NcclCommunicator::finish`: a barrier, finalize, destroy). Queuing runs off the
//! runtime's workers (`blocking`), the first call under NCCL's set-up deadline, and its time
//! counts as waiting for gradients, not compute. The elastic path is tested over
//! [`collective::NcclDouble`], NCCL's semantics on the CPU (`double_step`, ranks of a
//! `MemoryRing::with_nccl_doubles`).
//!
//! cudarc loads libcuda, libcublas and libnvrtc at run time, so the binary built with
//! `--features cuda` runs on hosts without them; `Cuda::open` says which is missing
//! instead of panicking. Without the feature, a rank given a GPU fails at start
//! ([`Device::from_env`]) with [`TrainError::Device`] "built without the `cuda` feature".
//!
//! The transformer keeps candle's autograd on the CPU (candle's CUDA backend needs `nvcc` at
//! build time). Ranks given the test-only fake GPUs (`RINGLEADER_TEST_GPUS`) run the same
//! engine on [`crate::Staged`], the CPU twin with a device's copies.

pub mod arch;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
#[cfg(any(feature = "cuda", test))]
mod device_optimizer;
pub(crate) mod double_step;
#[cfg(feature = "cuda")]
pub(crate) mod nccl;

#[cfg(feature = "cuda")]
pub use cuda::{Cuda, CudaDriver};
pub use device::{Arg, DevBuf, DeviceBackend, DeviceElem, Driver};

#[cfg(test)]
mod kernels_on_cpu;

/// The CUDA C source of the CUDA backend's kernels (everything but the matrix products),
/// compiled by NVRTC when a rank opens its device.
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// The kernels of [`KERNELS_CU`], by name.
pub const KERNELS: [&str; 14] = [
    "add_bias",
    "relu",
    "relu_backward",
    "fill_zero",
    "column_partials",
    "column_finish",
    "im2col",
    "col2im",
    "max_pool2",
    "max_pool2_backward",
    "batched_transpose",
    "softmax_xent",
    "sgd_update",
    "adamw_update",
];

/// Rows per chunk of the first pass of `kernels.cu`'s column sums.
pub const COLUMN_CHUNK_ROWS: usize = 256;

/// A row-major product `C[m, n] = op(A)·op(B)` as cuBLAS's column-major `sgemm` computes it:
/// row-major C is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, so cuBLAS's first operand is B and its
/// second A, each read as stored (a row-major `[r, c]` matrix is a column-major `[c, r]` one
/// with leading dimension c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmPlan {
    /// Whether cuBLAS transposes its first operand (B).
    pub first_t: bool,
    /// Whether it transposes its second (A).
    pub second_t: bool,
    /// cuBLAS's m, n, k: our n, m, k.
    pub dims: (usize, usize, usize),
    /// Leading dimensions of the first operand, the second, and C.
    pub lds: (usize, usize, usize),
}

/// The [`GemmPlan`] of `C[m, n] = op(A)[m, k]·op(B)[k, n]` with A, B stored as `ta`, `tb`
/// say (see `crate::kernels`' `matmul`).
pub fn gemm_plan((m, n, k): (usize, usize, usize), ta: crate::Trans, tb: crate::Trans) -> GemmPlan {
    use crate::Trans;
    // B stored [k, n] (No) is column-major [n, k]: already op(B)ᵀ. Stored [n, k] (Yes) it is
    // column-major [k, n]: transpose it.
    let (first_t, ld_first) = match tb {
        Trans::No => (false, n),
        Trans::Yes => (true, k),
    };
    let (second_t, ld_second) = match ta {
        Trans::No => (false, k),
        Trans::Yes => (true, m),
    };
    GemmPlan {
        first_t,
        second_t,
        dims: (n, m, k),
        lds: (ld_first.max(1), ld_second.max(1), n.max(1)),
    }
}

use crate::backend::{Host, Staged};
use collective::{Communicator, GroupConfig, NcclCommunicator, NcclConfig, ReduceOp};

use crate::error::TrainError;
use crate::layers::{LayerEngine, LayerGrads};
use crate::spec::{Arch, ModelSpec, SufficientFactors};

/// The environment variable with a train rank's device count (set by the node).
pub use ringleader_protocol::env::GPUS as GPUS_ENV;
/// The node's test-only fake-device variable: its ranks' devices are not real. Read only
/// through [`crate::worker::test_hook`], so a release build never sees it.
pub const TEST_GPUS_ENV: &str = "RINGLEADER_TEST_GPUS";

/// Where a train rank computes.
#[derive(Debug, Clone)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// The CPU, through a device's copies ([`crate::Staged`]): ranks given fake GPUs.
    Staged,
    /// A CUDA device.
    #[cfg(feature = "cuda")]
    Cuda(Cuda),
}

impl Device {
    /// The device of a train rank from its environment: the CPU without `RINGLEADER_GPUS`
    /// (or with 0), [`Device::Staged`] when the node's devices are the test-only fake ones,
    /// else CUDA device 0 (the first of `CUDA_VISIBLE_DEVICES`), which must open.
    pub fn from_env() -> Result<Device, TrainError> {
        let gpus = match std::env::var(GPUS_ENV) {
            Ok(v) => v.trim().parse::<usize>().map_err(|_| {
                TrainError::Device(format!("{GPUS_ENV}={v:?} is not a device count"))
            })?,
            Err(_) => 0,
        };
        Self::choose(gpus, crate::test_hooks::test_hook(TEST_GPUS_ENV).is_some())
    }

    /// [`Device::from_env`] from the device count and whether the devices are fake.
    pub fn choose(gpus: usize, fake: bool) -> Result<Device, TrainError> {
        match (gpus, fake) {
            (0, _) => Ok(Device::Cpu),
            (_, true) => Ok(Device::Staged),
            (_, false) => open_first(),
        }
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(_) = self {
            return true;
        }
        false
    }

    /// Whether a trainer of `model` computes on CUDA here: a CUDA device and a model of the
    /// layer-wise engine (the transformer stays on the CPU).
    pub fn trains_on_cuda(&self, model: &ModelSpec) -> bool {
        self.is_cuda() && model.arch != Arch::Transformer
    }

    /// What the rank prints about where it computes.
    pub fn describe(&self) -> String {
        match self {
            Device::Cpu => "cpu".into(),
            Device::Staged => "cpu (fake gpu, staged like a device)".into(),
            #[cfg(feature = "cuda")]
            Device::Cuda(c) => crate::Backend::describe(c),
        }
    }
}

/// Tags the group id of the second TCP group that a generation's NCCL communicator
/// bootstraps over and keeps for its watchdog ("NCCL" in the high bytes).
pub const NCCL_GROUP_TAG: u64 = 0x4e43_434c_0000_0000;

/// The NCCL communicator of the generation of `comm` (connected with `cfg`) when every rank
/// trains on CUDA and can load libnccl, `None` otherwise (then gradients go over `comm`,
/// and a rank that computes on CUDA without libnccl logs why). Every rank calls it at the
/// same point, with `on_cuda` from [`Device::trains_on_cuda`]: the ranks first agree over
/// `comm` whether all train on CUDA and load NCCL, then connect a second TCP group (same
/// addresses, group id tagged with [`NCCL_GROUP_TAG`]) and bootstrap NCCL over it on
/// device 0.
pub async fn connect_nccl(
    comm: &mut Communicator,
    cfg: &GroupConfig,
    on_cuda: bool,
) -> Result<Option<NcclCommunicator>, TrainError> {
    let loads_nccl = on_cuda && collective::nccl_available();
    if on_cuda && !loads_nccl {
        tracing::warn!(
            rank = comm.rank(),
            "this rank computes on CUDA but cannot load libnccl (or libcuda): its \
             generation averages gradients over TCP, through host memory"
        );
    }
    let mut all = [on_cuda, loads_nccl].map(|b| f32::from(u8::from(b)));
    comm.allreduce(&mut all, ReduceOp::Min).await?;
    if all[0] < 1.0 {
        return Ok(None);
    }
    if all[1] < 1.0 {
        if loads_nccl {
            tracing::warn!(
                rank = comm.rank(),
                "every rank computes on CUDA, but some rank cannot load libnccl: gradients \
                 go over TCP, through host memory (that rank's log says why)"
            );
        }
        return Ok(None);
    }
    let group = Communicator::connect(GroupConfig {
        group_id: cfg.group_id ^ NCCL_GROUP_TAG,
        ..cfg.clone()
    })
    .await?;
    Ok(Some(group.nccl(0, NcclConfig::default()).await?))
}

/// Runs `f`, which blocks the thread (a wait for the GPU), without stalling the tokio
/// runtime it is called from: inside `block_in_place` on a multi-threaded runtime, so its
/// other tasks (NCCL's watchdog among them) move to other threads; directly on a
/// current-thread runtime, where `block_in_place` panics, or outside any runtime.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The layer-wise engine on a rank's [`Device`].
#[derive(Debug)]
pub(crate) enum Engine {
    Host(LayerEngine<Host>),
    Staged(LayerEngine<Staged>),
    #[cfg(feature = "cuda")]
    Cuda(OnCuda),
}

/// The engine on CUDA, and the device side of its steps when NCCL averages the gradients.
#[cfg(feature = "cuda")]
#[derive(Debug)]
pub(crate) struct OnCuda {
    layers: LayerEngine<Cuda>,
    step: Box<nccl::DeviceStep>,
}

/// Runs `$body` with `$x` bound to the engine inside, whatever its backend.
macro_rules! each {
    ($engine:expr, $x:ident => $body:expr) => {
        match $engine {
            Engine::Host($x) => $body,
            Engine::Staged($x) => $body,
            #[cfg(feature = "cuda")]
            Engine::Cuda(OnCuda { layers: $x, .. }) => $body,
        }
    };
}

impl Engine {
    /// The layers of `spec` on `device` (`None` for the transformer, which keeps candle's
    /// autograd on the CPU).
    pub(crate) fn for_model(
        device: &Device,
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        names: &[&str],
    ) -> Result<Option<Engine>, TrainError> {
        Ok(match device {
            Device::Cpu => {
                LayerEngine::on(Host::default(), spec, shape, classes, names)?.map(Engine::Host)
            }
            Device::Staged => {
                LayerEngine::on(Staged::default(), spec, shape, classes, names)?.map(Engine::Staged)
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(c) => {
                LayerEngine::on(c.clone(), spec, shape, classes, names)?.map(|layers| {
                    Engine::Cuda(OnCuda {
                        layers,
                        step: Box::default(),
                    })
                })
            }
        })
    }

    pub(crate) fn device(&self) -> String {
        each!(self, e => e.device())
    }

    pub(crate) fn len(&self) -> usize {
        each!(self, e => e.len())
    }

    pub(crate) fn choose_factors(
        &mut self,
        mode: SufficientFactors,
        world: usize,
        batch: usize,
    ) -> usize {
        each!(self, e => e.choose_factors(mode, world, batch))
    }

    pub(crate) fn forward(
        &mut self,
        params: &[Vec<f32>],
        x: &[f32],
        batch: usize,
    ) -> Result<(), TrainError> {
        each!(self, e => e.forward(params, x, batch))
    }

    pub(crate) fn logits(&mut self) -> Result<&[f32], TrainError> {
        each!(self, e => e.logits())
    }

    pub(crate) fn loss(&mut self, labels: &[u32]) -> Result<f32, TrainError> {
        each!(self, e => e.loss(labels))
    }

    pub(crate) fn backward_params(
        &mut self,
        i: usize,
        grads: &mut [Vec<f32>],
    ) -> Result<Option<LayerGrads<'_>>, TrainError> {
        each!(self, e => e.backward_params(i, grads))
    }

    /// Keeps the gradients, the parameters and the optimizer state on the device, for
    /// steps whose gradients NCCL averages ([`Engine::queue_layer`],
    /// [`Engine::finish_on_device`]); only for a CUDA engine.
    pub(crate) fn keep_state_on_device(&mut self) -> Result<(), TrainError> {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(c) => {
                c.layers.keep_grads_on_device(true);
                c.layers.keep_params_on_device(true);
                Ok(())
            }
            _ => Err(TrainError::Device(
                "NCCL gradients need the layer-wise engine on CUDA".into(),
            )),
        }
    }

    /// Queues the average of the gradients of parameters `ids`, which the backward pass
    /// has just computed, on `nccl` (see `nccl::DeviceStep`).
    pub(crate) fn queue_layer(
        &mut self,
        nccl: &NcclCommunicator,
        ids: [usize; 2],
    ) -> Result<(), TrainError> {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(c) => nccl::DeviceStep::queue_layer(&mut c.layers, nccl, ids),
            _ => {
                let _ = (nccl, ids);
                Err(TrainError::Device("NCCL needs a CUDA engine".into()))
            }
        }
    }

    /// Ends a step whose gradients `nccl` averages: `extras` joins the average, and the
    /// optimizer updates the parameters on the device (`host` counts the update and
    /// supplies its coefficients).
    pub(crate) fn finish_on_device(
        &mut self,
        nccl: &NcclCommunicator,
        host: &mut crate::Optimizer,
        extras: &mut [f32],
        lr: f32,
    ) -> Result<(), TrainError> {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(c) => c.step.finish(&mut c.layers, nccl, host, extras, lr),
            _ => {
                let _ = (nccl, host, extras, lr);
                Err(TrainError::Device("NCCL needs a CUDA engine".into()))
            }
        }
    }

    /// Brings the parameters and optimizer state into `params` and `host` where the
    /// device's are newer (nothing otherwise).
    pub(crate) fn sync_to_host(
        &mut self,
        params: &mut [Vec<f32>],
        host: &mut crate::Optimizer,
    ) -> Result<(), TrainError> {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(c) => c.step.sync_to_host(&c.layers, params, host),
            _ => {
                let _ = (params, host);
                Ok(())
            }
        }
    }

    /// The host's parameters and optimizer state changed (a restore): a device that keeps
    /// them takes them at the next step.
    pub(crate) fn host_changed(&mut self) {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(c) => c.step.host_changed(&mut c.layers),
            e => each!(e, l => l.params_changed()),
        }
    }

    pub(crate) fn backward_input(
        &mut self,
        i: usize,
        params: &[Vec<f32>],
    ) -> Result<(), TrainError> {
        each!(self, e => e.backward_input(i, params))
    }
}

#[cfg(feature = "cuda")]
fn open_first() -> Result<Device, TrainError> {
    Cuda::open(0).map(Device::Cuda)
}

#[cfg(not(feature = "cuda"))]
fn open_first() -> Result<Device, TrainError> {
    Err(TrainError::Device(
        "this rank was given a GPU, but ringleader was built without the `cuda` feature \
         (build with `cargo build --release --features ringleader/cuda`)"
            .into(),
    ))
}

#[cfg(test)]
mod tests;
