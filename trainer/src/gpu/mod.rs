//! Training on a GPU: where a train rank computes, and the CUDA backend of the layer-wise
//! engine.
//!
//! A rank the node gave devices (`RINGLEADER_GPUS` ≥ 1, `CUDA_VISIBLE_DEVICES` naming
//! them) computes on the first of them ([`Device::from_env`]): the MLP and the CNN run the
//! engine of [`crate::LayerEngine`] on a [`DeviceBackend`], which keeps every activation,
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
//! - per step the parameters go up once (the optimizer runs on the host, as on the CPU), the
//!   batch goes up, and each layer's gradients come down as soon as the backward pass has
//!   them, so that the gradient sync overlaps the rest of the backward as on the CPU.
//!
//! Gradients: when every rank of a generation computes on CUDA ([`connect_nccl`] asks
//! them over the TCP ring), they are averaged on the device with NCCL (one `ncclAllReduce`
//! per parameter after the backward pass, bootstrapped over a second TCP group that its
//! watchdog keeps, so a lost peer fails the step with `PeerLost` as over TCP), then copied
//! to the host for the optimizer. Otherwise (a rank without a GPU) they go through host
//! memory over the TCP ring ([`crate::GradSync`]), each layer's as soon as it is ready.
//!
//! cudarc loads libcuda, libcublas and libnvrtc at run time, so the binary built with
//! `--features cuda` runs on hosts without them; `Cuda::open` says which is missing
//! instead of panicking. Without the feature, a rank given a GPU fails at start
//! ([`Device::from_env`]) with [`TrainError::Device`] "built without the `cuda` feature".
//!
//! The transformer keeps candle's autograd on the CPU (candle's CUDA backend needs `nvcc` at
//! build time). Ranks given the test-only fake GPUs (`RINGLEADER_TEST_GPUS`) run the same
//! engine on [`crate::Staged`], the CPU twin with a device's copies.

#[cfg(feature = "cuda")]
mod cuda;
mod device;
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
pub const KERNELS: [&str; 12] = [
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
pub const GPUS_ENV: &str = "RINGLEADER_GPUS";
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
        Self::choose(gpus, crate::worker::test_hook(TEST_GPUS_ENV).is_some())
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
/// trains on CUDA, `None` otherwise (then gradients go over `comm`). Every rank calls it at
/// the same point, with `on_cuda` from [`Device::trains_on_cuda`]: the ranks first agree over
/// `comm` whether all train on CUDA, then connect a second TCP group (same addresses, group
/// id tagged with [`NCCL_GROUP_TAG`]) and bootstrap NCCL over it on device 0.
pub async fn connect_nccl(
    comm: &mut Communicator,
    cfg: &GroupConfig,
    on_cuda: bool,
) -> Result<Option<NcclCommunicator>, TrainError> {
    let mut all = [f32::from(u8::from(on_cuda))];
    comm.allreduce(&mut all, ReduceOp::Min).await?;
    if all[0] < 1.0 {
        return Ok(None);
    }
    let group = Communicator::connect(GroupConfig {
        group_id: cfg.group_id ^ NCCL_GROUP_TAG,
        ..cfg.clone()
    })
    .await?;
    Ok(Some(group.nccl(0, NcclConfig::default()).await?))
}

/// The layer-wise engine on a rank's [`Device`].
#[derive(Debug)]
pub(crate) enum Engine {
    Host(LayerEngine<Host>),
    Staged(LayerEngine<Staged>),
    #[cfg(feature = "cuda")]
    Cuda(LayerEngine<Cuda>),
}

/// Runs `$body` with `$x` bound to the engine inside, whatever its backend.
macro_rules! each {
    ($engine:expr, $x:ident => $body:expr) => {
        match $engine {
            Engine::Host($x) => $body,
            Engine::Staged($x) => $body,
            #[cfg(feature = "cuda")]
            Engine::Cuda($x) => $body,
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
                LayerEngine::on(c.clone(), spec, shape, classes, names)?.map(Engine::Cuda)
            }
        })
    }

    pub(crate) fn device(&self) -> String {
        each!(self, e => e.device())
    }

    pub(crate) fn is_cuda(&self) -> bool {
        #[cfg(feature = "cuda")]
        if let Engine::Cuda(_) = self {
            return true;
        }
        false
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

    /// Averages the step's gradients (left on the device) and `extras` with `nccl`, into
    /// `grads` on the host; only for a CUDA engine.
    pub(crate) fn average_on_device(
        &mut self,
        nccl: &NcclCommunicator,
        grads: &mut [Vec<f32>],
        extras: &mut [f32],
    ) -> Result<(), TrainError> {
        match self {
            #[cfg(feature = "cuda")]
            Engine::Cuda(e) => nccl::average(e, nccl, grads, extras),
            _ => {
                let _ = (nccl, grads, extras);
                Err(TrainError::Device("NCCL needs a CUDA engine".into()))
            }
        }
    }

    /// Leaves the gradients on the device for [`Engine::average_on_device`].
    pub(crate) fn keep_grads_on_device(&mut self, stay: bool) {
        each!(self, e => e.keep_grads_on_device(stay))
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
mod tests {
    use super::*;
    use crate::Trans;

    #[test]
    fn the_gemm_plan_computes_the_row_major_product() {
        let (m, n, k) = (5, 3, 4);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| 1.0 - i as f32 * 0.25).collect();
        let transpose = |x: &[f32], r: usize, c: usize| {
            let mut t = vec![0.0; r * c];
            for i in 0..r {
                for j in 0..c {
                    t[j * r + i] = x[i * c + j];
                }
            }
            t
        };
        let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
        let mut want = vec![0.0; m * n];
        crate::kernels::matmul(&mut want, (m, n, k), &a, Trans::No, &b, Trans::No, false);
        for (aa, ta) in [(&a, Trans::No), (&at, Trans::Yes)] {
            for (bb, tb) in [(&b, Trans::No), (&bt, Trans::Yes)] {
                let plan = gemm_plan((m, n, k), ta, tb);
                // cuBLAS's first operand is B, its second A.
                let mut got = vec![f32::NAN; m * n];
                super::kernels_on_cpu::sgemm_reference(plan, false, bb, aa, &mut got);
                assert_eq!(got, want, "{ta:?} {tb:?}: {plan:?}");
            }
        }
    }

    #[test]
    fn the_device_follows_the_count_and_fakes_stay_on_the_cpu() {
        assert!(matches!(Device::choose(0, false), Ok(Device::Cpu)));
        assert!(matches!(Device::choose(0, true), Ok(Device::Cpu)));
        assert!(matches!(Device::choose(2, true), Ok(Device::Staged)));
        // A real device: opens on a GPU host with the feature, else a clear error.
        match Device::choose(1, false) {
            Ok(d) => assert!(d.describe().starts_with("cuda:0"), "{}", d.describe()),
            Err(e) => {
                eprintln!("SKIPPED: no usable GPU here ({e})");
                let msg = e.to_string();
                assert!(
                    msg.contains("cuda") || msg.contains("libcuda") || msg.contains("device"),
                    "{msg}"
                );
            }
        }
    }
}
