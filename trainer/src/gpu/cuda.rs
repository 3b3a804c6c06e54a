//! The CUDA driver of the device backend: cudarc's driver API for memory, copies and
//! launches of `kernels.cu` (compiled by NVRTC at [`CudaDriver::open`]), cuBLAS for `sgemm`.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};

use super::device::{Arg, DeviceBackend, DeviceElem, Driver};
use super::{GemmPlan, KERNELS, KERNELS_CU};
use crate::error::TrainError;

/// Threads per block of every kernel.
const THREADS_PER_BLOCK: u32 = 256;
/// Blocks of a grid-stride launch at most (each thread then loops).
const BLOCKS_MAX: u32 = 65_535;

/// The layer-wise engine's backend on a CUDA device.
pub type Cuda = DeviceBackend<CudaDriver>;

impl Cuda {
    /// Opens CUDA device `ordinal` ([`CudaDriver::open`]).
    pub fn open(ordinal: usize) -> Result<Cuda, TrainError> {
        CudaDriver::open(ordinal).map(DeviceBackend::new)
    }

    /// The stream every operation is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.driver().0.stream
    }
}

struct Inner {
    name: String,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: HashMap<&'static str, CudaFunction>,
}

// SAFETY: the cuBLAS handle is used from one thread at a time: the engine that owns this
// driver runs one operation at a time (`&self` calls on one trainer), and cuBLAS handles may
// move between threads (each call binds the context first).
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

/// One CUDA device: a context, a stream, a cuBLAS handle and the compiled kernels. Cheap to
/// clone (clones share them); every operation is queued on the one stream, in order.
#[derive(Clone)]
pub struct CudaDriver(Arc<Inner>);

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CudaDriver").field(&self.0.name).finish()
    }
}

fn dev_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> TrainError + '_ {
    move |e| TrainError::Device(format!("{what}: {e:?}"))
}

fn grid(n: usize) -> LaunchConfig {
    let blocks = n
        .div_ceil(THREADS_PER_BLOCK as usize)
        .min(BLOCKS_MAX as usize) as u32;
    LaunchConfig {
        grid_dim: (blocks.max(1), 1, 1),
        block_dim: (THREADS_PER_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn gemm_dim(v: usize, what: &str) -> Result<i32, TrainError> {
    i32::try_from(v).map_err(|_| TrainError::Device(format!("sgemm {what}={v} exceeds i32")))
}

impl CudaDriver {
    /// Opens CUDA device `ordinal` (of `CUDA_VISIBLE_DEVICES`), creates its stream and cuBLAS
    /// handle, and compiles `kernels.cu` with NVRTC. Fails with [`TrainError::Device`] naming
    /// a library that cannot be loaded (libcuda, libcublas, libnvrtc) or the step that failed.
    pub fn open(ordinal: usize) -> Result<CudaDriver, TrainError> {
        // SAFETY: only tries to dlopen the libraries (cudarc panics on first use otherwise).
        let libs = unsafe {
            [
                (
                    "libcuda (the NVIDIA driver)",
                    cudarc::driver::sys::is_culib_present(),
                ),
                ("libcublas", cudarc::cublas::sys::is_culib_present()),
                ("libnvrtc", cudarc::nvrtc::sys::is_culib_present()),
            ]
        };
        let missing: Vec<&str> = libs.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
        if !missing.is_empty() {
            return Err(TrainError::Device(format!(
                "cannot load {} (put the CUDA libraries on LD_LIBRARY_PATH)",
                missing.join(", ")
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev_err("opening the cuda device"))?;
        let model = ctx.name().unwrap_or_else(|_| "unknown model".into());
        let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
        let name = format!("cuda:{ordinal} ({model}, sm_{major}{minor})");
        let stream = ctx.new_stream().map_err(dev_err("creating a stream"))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| TrainError::Device(format!("creating the cublas handle: {e:?}")))?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS_CU)
            .map_err(|e| TrainError::Device(format!("compiling kernels.cu with nvrtc: {e:?}")))?;
        let module = ctx
            .load_module(ptx)
            .map_err(dev_err("loading kernels.cu"))?;
        let mut kernels = HashMap::new();
        for k in KERNELS {
            let f = module
                .load_function(k)
                .map_err(|e| TrainError::Device(format!("kernel {k}: {e:?}")))?;
            kernels.insert(k, f);
        }
        Ok(CudaDriver(Arc::new(Inner {
            name,
            stream,
            blas,
            kernels,
        })))
    }
}

impl Driver for CudaDriver {
    type Mem<T: DeviceElem> = CudaSlice<T>;

    fn describe(&self) -> String {
        self.0.name.clone()
    }

    fn alloc<T: DeviceElem>(&self, len: usize) -> Result<CudaSlice<T>, TrainError> {
        self.0
            .stream
            .alloc_zeros::<T>(len)
            .map_err(dev_err("cuMemAlloc"))
    }

    fn capacity<T: DeviceElem>(mem: &CudaSlice<T>) -> usize {
        mem.len()
    }

    fn upload<T: DeviceElem>(&self, src: &[T], dst: &mut CudaSlice<T>) -> Result<(), TrainError> {
        self.0
            .stream
            .memcpy_htod(src, dst)
            .map_err(dev_err("cuMemcpyHtoD"))
    }

    fn download(&self, src: &CudaSlice<f32>, dst: &mut [f32]) -> Result<(), TrainError> {
        self.0
            .stream
            .memcpy_dtoh(&src.slice(..dst.len()), dst)
            .map_err(dev_err("cuMemcpyDtoH"))?;
        self.synchronize()
    }

    fn launch(
        &self,
        name: &'static str,
        threads: usize,
        args: &mut [Arg<'_, Self>],
    ) -> Result<(), TrainError> {
        let f = self
            .0
            .kernels
            .get(name)
            .ok_or_else(|| TrainError::Device(format!("no kernel {name}")))?;
        let sizes: Vec<usize> = args
            .iter()
            .filter_map(|a| match a {
                Arg::Z(z) => Some(*z),
                _ => None,
            })
            .collect();
        let mut sizes = sizes.iter();
        let mut l = self.0.stream.launch_builder(f);
        for a in args.iter_mut() {
            match a {
                Arg::F(m) => l.arg(*m),
                Arg::FMut(m) => l.arg(&mut **m),
                Arg::U(m) => l.arg(*m),
                Arg::UMut(m) => l.arg(&mut **m),
                Arg::Z(_) => l.arg(sizes.next().expect("one size per Z")),
            };
        }
        // SAFETY: every launch in `DeviceBackend` passes the arguments of the kernel's
        // signature in `kernels.cu`, in order (memory as pointers, sizes as size_t), and
        // checks that each buffer holds what the kernel touches for those sizes; the same
        // argument lists run the kernels on the CPU in the tests (`kernels_on_cpu`).
        unsafe { l.launch(grid(threads)) }
            .map(|_| ())
            .map_err(|e| TrainError::Device(format!("launching {name}: {e:?}")))
    }

    fn gemm(
        &self,
        plan: GemmPlan,
        accumulate: bool,
        first: &CudaSlice<f32>,
        second: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> Result<(), TrainError> {
        let op = |t| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        let cfg = GemmConfig {
            transa: op(plan.first_t),
            transb: op(plan.second_t),
            m: gemm_dim(plan.dims.0, "m")?,
            n: gemm_dim(plan.dims.1, "n")?,
            k: gemm_dim(plan.dims.2, "k")?,
            alpha: 1.0f32,
            lda: gemm_dim(plan.lds.0, "lda")?,
            ldb: gemm_dim(plan.lds.1, "ldb")?,
            beta: if accumulate { 1.0f32 } else { 0.0 },
            ldc: gemm_dim(plan.lds.2, "ldc")?,
        };
        // SAFETY: `DeviceBackend::matmul` checked that the operands and `c` hold what these
        // dimensions and leading dimensions reach; `c` is borrowed mutably, so it aliases
        // neither operand.
        unsafe { self.0.blas.gemm(cfg, first, second, c) }
            .map_err(|e| TrainError::Device(format!("cublasSgemm: {e:?}")))
    }

    fn synchronize(&self) -> Result<(), TrainError> {
        self.0
            .stream
            .synchronize()
            .map_err(dev_err("cuStreamSynchronize"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kernels.cu` compiles with NVRTC and defines every kernel [`Cuda::open`] loads. NVRTC
    /// needs no GPU: `scripts/test.sh` fetches libnvrtc (NVIDIA's pip wheel) for this test.
    #[test]
    fn the_kernels_compile_with_nvrtc() {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("SKIPPED: libnvrtc not found (scripts/test.sh puts one on LD_LIBRARY_PATH)");
            return;
        }
        let ptx = cudarc::nvrtc::compile_ptx(KERNELS_CU).expect("kernels.cu compiles");
        let text = ptx.to_src();
        for name in KERNELS {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "kernel {name} missing from the ptx"
            );
        }
    }
}
