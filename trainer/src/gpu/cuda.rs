//! The CUDA driver of the device backend: cudarc's driver API for memory, copies and
//! launches of `kernels.cu` (compiled by NVRTC at [`CudaDriver::open`]), cuBLAS for `sgemm`.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::arch::{self, KernelImage};

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
                "cannot load {} (a node links the CUDA libraries it finds for the ranks it \
                 starts; elsewhere put them on LD_LIBRARY_PATH, or run `. scripts/cuda-libs.sh; \
                 cuda_libs_env DIR` first)",
                missing.join(", ")
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(dev_err("opening the cuda device"))?;
        let model = ctx.name().unwrap_or_else(|_| "unknown model".into());
        let (major, minor) = ctx.compute_capability().unwrap_or((0, 0));
        let stream = ctx.new_stream().map_err(dev_err("creating a stream"))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| TrainError::Device(format!("creating the cublas handle: {e:?}")))?;
        let (module, image) = load_kernels(&ctx, (major * 10 + minor).max(0) as u32)?;
        // "cuda:0 (NVIDIA H100 80GB HBM3, sm_90; kernels sm_90 cubin)".
        let name = format!("cuda:{ordinal} ({model}, sm_{major}{minor}; kernels {image})");
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

/// The architectures this NVRTC compiles for (`nvrtcGetSupportedArchs`: 90 for sm_90).
fn nvrtc_archs() -> Result<Vec<u32>, TrainError> {
    use cudarc::nvrtc::sys;
    let mut n: std::ffi::c_int = 0;
    // SAFETY: a valid out-pointer.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| TrainError::Device(format!("nvrtcGetNumSupportedArchs: {e:?}")))?;
    let mut archs = vec![0 as std::ffi::c_int; n.max(0) as usize];
    // SAFETY: room for the `n` values NVRTC writes.
    unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| TrainError::Device(format!("nvrtcGetSupportedArchs: {e:?}")))?;
    Ok(archs.into_iter().map(|a| a.max(0) as u32).collect())
}

/// `kernels.cu` as NVRTC built it.
enum Built {
    /// Machine code (an ELF file).
    Cubin(Vec<u8>),
    /// PTX text.
    Ptx(String),
}

impl Built {
    fn into_ptx(self) -> Ptx {
        match self {
            Built::Cubin(bytes) => Ptx::from_binary(bytes),
            Built::Ptx(text) => Ptx::from_src(text),
        }
    }
}

/// `kernels.cu` built by NVRTC as `image`.
fn compile(image: KernelImage) -> Result<Built, String> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(KERNELS_CU).map_err(|e| e.to_string())?;
    let prog = result::create_program(&src, None).map_err(|e| format!("{e:?}"))?;
    let options = [format!("--gpu-architecture={}", image.nvrtc_arch())];
    // SAFETY: `prog` is live until destroyed below; the out-buffers are sized by NVRTC's
    // own size calls.
    let built = unsafe {
        match result::compile_program(prog, &options) {
            Err(e) => {
                let log = result::get_program_log(prog)
                    .map(|l| {
                        std::ffi::CStr::from_ptr(l.as_ptr())
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_default();
                Err(format!("{e:?}: {log}"))
            }
            Ok(()) => match image {
                KernelImage::Cubin(_) => {
                    let mut size = 0usize;
                    sys::nvrtcGetCUBINSize(prog, &mut size)
                        .result()
                        .map_err(|e| format!("nvrtcGetCUBINSize: {e:?}"))
                        .and_then(|()| {
                            let mut bytes = vec![0u8; size];
                            sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast())
                                .result()
                                .map(|()| Built::Cubin(bytes))
                                .map_err(|e| format!("nvrtcGetCUBIN: {e:?}"))
                        })
                }
                KernelImage::Ptx(_) => result::get_ptx(prog)
                    .map(|p| {
                        let text = std::ffi::CStr::from_ptr(p.as_ptr());
                        Built::Ptx(text.to_string_lossy().into_owned())
                    })
                    .map_err(|e| format!("nvrtcGetPTX: {e:?}")),
            },
        }
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    built
}

/// Builds `kernels.cu` for a device of architecture `device` (`90` for sm_90) and loads it:
/// the first of [`arch::images`] that NVRTC builds and the driver loads. Says what was
/// loaded, or every attempt's error.
fn load_kernels(
    ctx: &Arc<CudaContext>,
    device: u32,
) -> Result<(Arc<CudaModule>, KernelImage), TrainError> {
    let supported = nvrtc_archs()?;
    let images = arch::images(device, &supported);
    let mut failures = Vec::new();
    for image in images {
        let loaded = compile(image)
            .and_then(|b| ctx.load_module(b.into_ptx()).map_err(|e| format!("{e:?}")));
        match loaded {
            Ok(module) => return Ok((module, image)),
            Err(e) => failures.push(format!("{image}: {e}")),
        }
    }
    Err(TrainError::Device(if failures.is_empty() {
        format!(
            "this NVRTC compiles for architectures {supported:?}, none at or below the \
             device's sm_{device}"
        )
    } else {
        format!("building kernels.cu: {}", failures.join("; "))
    }))
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
        let scalars: Vec<f32> = args
            .iter()
            .filter_map(|a| match a {
                Arg::S(x) => Some(*x),
                _ => None,
            })
            .collect();
        let (mut sizes, mut scalars) = (sizes.iter(), scalars.iter());
        let mut l = self.0.stream.launch_builder(f);
        for a in args.iter_mut() {
            match a {
                Arg::F(m) => l.arg(*m),
                Arg::FMut(m) => l.arg(&mut **m),
                Arg::U(m) => l.arg(*m),
                Arg::UMut(m) => l.arg(&mut **m),
                Arg::Z(_) => l.arg(sizes.next().expect("one size per Z")),
                Arg::S(_) => l.arg(scalars.next().expect("one scalar per S")),
            };
        }
        // SAFETY: every launch in `DeviceBackend` passes the arguments of the kernel's
        // signature in `kernels.cu`, in order (memory as pointers, sizes as size_t, scalars
        // as float), and checks that each buffer holds what the kernel touches for those
        // sizes; the same argument lists run the kernels on the CPU in the tests
        // (`kernels_on_cpu`).
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

    /// `kernels.cu` compiles with NVRTC to machine code for a device's architecture (an
    /// ELF cubin) and to PTX that defines every kernel [`Cuda::open`] loads, for every image
    /// [`arch::images`] picks for an sm_80 and an sm_90 device. NVRTC needs no GPU:
    /// `scripts/test.sh` fetches libnvrtc (NVIDIA's pip wheel) for this test.
    #[test]
    fn the_kernels_compile_with_nvrtc_for_the_devices_architecture() {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            eprintln!("SKIPPED: libnvrtc not found (scripts/test.sh puts one on LD_LIBRARY_PATH)");
            return;
        }
        let supported = nvrtc_archs().expect("nvrtc lists its architectures");
        assert!(supported.contains(&80), "{supported:?}");
        for device in [80, 90] {
            for image in arch::images(device, &supported) {
                match compile(image).unwrap_or_else(|e| panic!("{image}: {e}")) {
                    Built::Cubin(bytes) => {
                        assert!(matches!(image, KernelImage::Cubin(_)));
                        assert_eq!(&bytes[..4], b"\x7fELF", "{image} is an ELF file");
                    }
                    Built::Ptx(text) => {
                        assert!(matches!(image, KernelImage::Ptx(_)));
                        for name in KERNELS {
                            assert!(
                                text.contains(&format!(".entry {name}(")),
                                "kernel {name} missing from the {image}"
                            );
                        }
                    }
                }
            }
        }
    }
}
