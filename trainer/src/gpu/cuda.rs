//! The CUDA backend: cuBLAS for the matrix products, `kernels.cu` (NVRTC) for the rest.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};

use crate::backend::Backend;
use crate::error::TrainError;
use crate::kernels::{Nhwc, Trans};

/// The CUDA C source of the elementwise kernels (compiled by NVRTC at [`Cuda::open`]).
pub const KERNELS_CU: &str = include_str!("kernels.cu");

/// Threads per block of every kernel (`column_sums` relies on 256: its shared array).
const THREADS_PER_BLOCK: u32 = 256;
/// Blocks of a grid-stride launch at most (each thread then loops).
const BLOCKS_MAX: u32 = 65_535;

/// The kernels of `kernels.cu`, loaded.
#[derive(Debug)]
struct Functions {
    add_bias: CudaFunction,
    relu: CudaFunction,
    relu_backward: CudaFunction,
    fill_zero: CudaFunction,
    column_sums: CudaFunction,
    im2col: CudaFunction,
    col2im: CudaFunction,
    max_pool2: CudaFunction,
    max_pool2_backward: CudaFunction,
    batched_transpose: CudaFunction,
    softmax_xent: CudaFunction,
}

struct Inner {
    name: String,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    f: Functions,
}

// SAFETY: the cuBLAS handle is used from one thread at a time: the engine that owns this
// backend runs one operation at a time (`&self` calls on one trainer), and cuBLAS handles may
// move between threads (each call binds the context first).
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

/// One CUDA device for the layer-wise engine: a context, a stream, a cuBLAS handle and the
/// compiled kernels. Cheap to clone (clones share them); every operation is queued on the
/// one stream, in order.
#[derive(Clone)]
pub struct Cuda(Arc<Inner>);

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cuda").field(&self.0.name).finish()
    }
}

fn dev_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> TrainError + '_ {
    move |e| TrainError::Device(format!("{what}: {e:?}"))
}

/// Device memory of `T` holding `len` values (its allocation may be larger: buffers grow,
/// never shrink).
#[derive(Debug)]
pub struct DevBuf<T> {
    data: Option<CudaSlice<T>>,
    len: usize,
}

impl<T> Default for DevBuf<T> {
    fn default() -> Self {
        DevBuf { data: None, len: 0 }
    }
}

impl<T> DevBuf<T> {
    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The allocation, which must hold exactly `len` values (NCCL reduces whole slices).
    pub(crate) fn exact_mut(&mut self) -> Result<&mut CudaSlice<T>, TrainError> {
        let len = self.len;
        match &mut self.data {
            Some(d) if d.len() == len => Ok(d),
            _ => Err(TrainError::Device(format!(
                "a device buffer of {len} values is not allocated at exactly that size"
            ))),
        }
    }

    fn slice(&self) -> &CudaSlice<T> {
        self.data
            .as_ref()
            .expect("a device buffer is sized before use")
    }

    fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        self.data
            .as_mut()
            .expect("a device buffer is sized before use")
    }
}

fn grow<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut DevBuf<T>,
    len: usize,
) -> Result<(), TrainError> {
    if buf.data.as_ref().is_none_or(|d| d.len() < len) {
        buf.data = Some(
            stream
                .alloc_zeros::<T>(len.max(1))
                .map_err(dev_err("cuMemAlloc"))?,
        );
    }
    buf.len = len;
    Ok(())
}

fn upload_into<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    src: &[T],
    dst: &mut DevBuf<T>,
) -> Result<(), TrainError> {
    grow(stream, dst, src.len())?;
    if !src.is_empty() {
        stream
            .memcpy_htod(src, dst.slice_mut())
            .map_err(dev_err("cuMemcpyHtoD"))?;
    }
    Ok(())
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

impl Cuda {
    /// Opens CUDA device `ordinal` (of `CUDA_VISIBLE_DEVICES`), creates its stream and cuBLAS
    /// handle, and compiles `kernels.cu` with NVRTC. Fails with [`TrainError::Device`] naming
    /// a library that cannot be loaded (libcuda, libcublas, libnvrtc) or the step that failed.
    pub fn open(ordinal: usize) -> Result<Cuda, TrainError> {
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
        let load = |name: &str| module.load_function(name).map_err(dev_err("kernel"));
        let f = Functions {
            add_bias: load("add_bias")?,
            relu: load("relu")?,
            relu_backward: load("relu_backward")?,
            fill_zero: load("fill_zero")?,
            column_sums: load("column_sums")?,
            im2col: load("im2col")?,
            col2im: load("col2im")?,
            max_pool2: load("max_pool2")?,
            max_pool2_backward: load("max_pool2_backward")?,
            batched_transpose: load("batched_transpose")?,
            softmax_xent: load("softmax_xent")?,
        };
        Ok(Cuda(Arc::new(Inner {
            name,
            stream,
            blas,
            f,
        })))
    }

    /// The stream every operation is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.0.stream
    }

    /// Waits until the queued work is done.
    pub fn synchronize(&self) -> Result<(), TrainError> {
        self.0
            .stream
            .synchronize()
            .map_err(dev_err("cuStreamSynchronize"))
    }

    /// `out[o, j, i] = x[o, i, j]` for `x` of shape `(outer, rows, cols)`.
    fn batched_transpose(
        &self,
        x: &DevBuf<f32>,
        out: &mut DevBuf<f32>,
        (outer, rows, cols): (usize, usize, usize),
    ) -> Result<(), TrainError> {
        let n = outer * rows * cols;
        assert!(x.len >= n && out.len >= n, "transpose shapes");
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.batched_transpose);
        l.arg(x.slice())
            .arg(out.slice_mut())
            .arg(&outer)
            .arg(&rows)
            .arg(&cols);
        // SAFETY: (const float*, float*, size_t × 3), touching [0..n) of both, checked above.
        Self::launched(unsafe { l.launch(grid(n)) }, "batched_transpose")
    }

    fn launched(
        r: Result<
            Option<(cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)>,
            cudarc::driver::DriverError,
        >,
        name: &str,
    ) -> Result<(), TrainError> {
        r.map(|_| ())
            .map_err(|e| TrainError::Device(format!("launching {name}: {e:?}")))
    }
}

impl Backend for Cuda {
    type Buf = DevBuf<f32>;
    type Index = DevBuf<u32>;
    const ON_HOST: bool = false;

    fn describe(&self) -> String {
        self.0.name.clone()
    }

    fn resize(&self, buf: &mut DevBuf<f32>, len: usize) -> Result<(), TrainError> {
        grow(&self.0.stream, buf, len)
    }

    fn upload(&self, src: &[f32], dst: &mut DevBuf<f32>) -> Result<(), TrainError> {
        upload_into(&self.0.stream, src, dst)
    }

    fn upload_index(&self, src: &[u32], dst: &mut DevBuf<u32>) -> Result<(), TrainError> {
        upload_into(&self.0.stream, src, dst)
    }

    fn view<'a>(
        &self,
        src: &'a DevBuf<f32>,
        stage: &'a mut Vec<f32>,
    ) -> Result<&'a [f32], TrainError> {
        stage.resize(src.len, 0.0);
        if src.len > 0 {
            self.0
                .stream
                .memcpy_dtoh(&src.slice().slice(..src.len), stage.as_mut_slice())
                .map_err(dev_err("cuMemcpyDtoH"))?;
            self.synchronize()?;
        }
        Ok(stage)
    }

    fn host_slice(_: &DevBuf<f32>) -> Option<&[f32]> {
        None
    }

    fn load_params(&self, host: &[Vec<f32>], dev: &mut Vec<DevBuf<f32>>) -> Result<(), TrainError> {
        dev.resize_with(host.len(), DevBuf::default);
        for (h, d) in host.iter().zip(dev.iter_mut()) {
            self.upload(h, d)?;
        }
        Ok(())
    }

    fn param<'a>(_: &'a [Vec<f32>], dev: &'a [DevBuf<f32>], i: usize) -> &'a DevBuf<f32> {
        &dev[i]
    }

    fn grad<'a>(
        _: &'a mut [Vec<f32>],
        dev: &'a mut [DevBuf<f32>],
        i: usize,
    ) -> &'a mut DevBuf<f32> {
        &mut dev[i]
    }

    fn grads_out(
        &self,
        dev: &[DevBuf<f32>],
        host: &mut [Vec<f32>],
        ids: [usize; 2],
    ) -> Result<(), TrainError> {
        for i in ids {
            let (d, h) = (&dev[i], &mut host[i]);
            if d.len > 0 {
                self.0
                    .stream
                    .memcpy_dtoh(&d.slice().slice(..d.len), &mut h[..d.len])
                    .map_err(dev_err("cuMemcpyDtoH"))?;
            }
        }
        self.synchronize()
    }

    fn matmul(
        &self,
        dst: &mut DevBuf<f32>,
        (m, n, k): (usize, usize, usize),
        a: &DevBuf<f32>,
        ta: Trans,
        b: &DevBuf<f32>,
        tb: Trans,
        accumulate: bool,
    ) -> Result<(), TrainError> {
        assert!(
            dst.len >= m * n && a.len >= m * k && b.len >= k * n,
            "matmul shapes"
        );
        if m == 0 || n == 0 {
            return Ok(());
        }
        // Row-major C[m, n] = op(A)·op(B) is column-major Cᵀ[n, m] = op(B)ᵀ·op(A)ᵀ: cuBLAS
        // gets B as its first operand and A as its second, each read as stored.
        let (op_b, ld_b) = match tb {
            Trans::No => (cublasOperation_t::CUBLAS_OP_N, n),
            Trans::Yes => (cublasOperation_t::CUBLAS_OP_T, k),
        };
        let (op_a, ld_a) = match ta {
            Trans::No => (cublasOperation_t::CUBLAS_OP_N, k),
            Trans::Yes => (cublasOperation_t::CUBLAS_OP_T, m),
        };
        let cfg = GemmConfig {
            transa: op_b,
            transb: op_a,
            m: gemm_dim(n, "n")?,
            n: gemm_dim(m, "m")?,
            k: gemm_dim(k, "k")?,
            alpha: 1.0f32,
            lda: gemm_dim(ld_b.max(1), "ld")?,
            ldb: gemm_dim(ld_a.max(1), "ld")?,
            beta: if accumulate { 1.0f32 } else { 0.0 },
            ldc: gemm_dim(n, "n")?,
        };
        // SAFETY: the assertion above makes every element cuBLAS reads or writes for these
        // dimensions and leading dimensions fall inside the buffers (their allocations are
        // at least `len`); `dst` is borrowed mutably, so it aliases neither operand.
        unsafe { self.0.blas.gemm(cfg, b.slice(), a.slice(), dst.slice_mut()) }
            .map_err(|e| TrainError::Device(format!("cublasSgemm: {e:?}")))
    }

    fn add_bias(&self, x: &mut DevBuf<f32>, bias: &DevBuf<f32>) -> Result<(), TrainError> {
        let (n, cols) = (x.len, bias.len);
        if n == 0 || cols == 0 {
            return Ok(());
        }
        let s = &self.0.stream;
        let mut l = s.launch_builder(&self.0.f.add_bias);
        l.arg(x.slice_mut()).arg(bias.slice()).arg(&n).arg(&cols);
        // SAFETY: the kernel's signature is (float*, const float*, size_t, size_t) and it
        // touches x[0..n) and bias[0..cols).
        Self::launched(unsafe { l.launch(grid(n)) }, "add_bias")
    }

    fn relu(&self, x: &mut DevBuf<f32>) -> Result<(), TrainError> {
        let n = x.len;
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.relu);
        l.arg(x.slice_mut()).arg(&n);
        // SAFETY: (float*, size_t), touching x[0..n).
        Self::launched(unsafe { l.launch(grid(n)) }, "relu")
    }

    fn relu_backward(&self, g: &mut DevBuf<f32>, out: &DevBuf<f32>) -> Result<(), TrainError> {
        let n = g.len.min(out.len);
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.relu_backward);
        l.arg(g.slice_mut()).arg(out.slice()).arg(&n);
        // SAFETY: (float*, const float*, size_t), touching g[0..n) and out[0..n).
        Self::launched(unsafe { l.launch(grid(n)) }, "relu_backward")
    }

    fn column_sums(&self, x: &DevBuf<f32>, dst: &mut DevBuf<f32>) -> Result<(), TrainError> {
        let cols = dst.len;
        if cols == 0 {
            return Ok(());
        }
        let rows = x.len / cols;
        let blocks = u32::try_from(cols)
            .map_err(|_| TrainError::Device(format!("column_sums of {cols} columns")))?;
        let mut l = self.0.stream.launch_builder(&self.0.f.column_sums);
        l.arg(x.slice()).arg(dst.slice_mut()).arg(&rows).arg(&cols);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: (const float*, float*, size_t, size_t); block j reads column j of the
        // rows × cols matrix x and writes dst[j]; 256 threads, the size of its shared array.
        Self::launched(unsafe { l.launch(cfg) }, "column_sums")
    }

    fn im2col(
        &self,
        x: &DevBuf<f32>,
        s: Nhwc,
        k: usize,
        cols: &mut DevBuf<f32>,
    ) -> Result<(), TrainError> {
        let n = s.b * s.h * s.w * k * k * s.c;
        assert!(x.len >= s.len() && cols.len >= n, "im2col shapes");
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.im2col);
        l.arg(x.slice())
            .arg(cols.slice_mut())
            .arg(&s.b)
            .arg(&s.h)
            .arg(&s.w)
            .arg(&s.c)
            .arg(&k);
        // SAFETY: (const float*, float*, size_t × 5); reads x[0..b·h·w·c), writes
        // cols[0..n), both checked above.
        Self::launched(unsafe { l.launch(grid(n)) }, "im2col")
    }

    fn col2im(
        &self,
        dcols: &DevBuf<f32>,
        s: Nhwc,
        k: usize,
        dx: &mut DevBuf<f32>,
    ) -> Result<(), TrainError> {
        let n = s.len();
        assert!(dcols.len >= n * k * k && dx.len >= n, "col2im shapes");
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.col2im);
        l.arg(dcols.slice())
            .arg(dx.slice_mut())
            .arg(&s.b)
            .arg(&s.h)
            .arg(&s.w)
            .arg(&s.c)
            .arg(&k);
        // SAFETY: (const float*, float*, size_t × 5); writes dx[0..n), reads dcols within
        // its b·h·w rows of k·k·c, both checked above.
        Self::launched(unsafe { l.launch(grid(n)) }, "col2im")
    }

    fn max_pool2(
        &self,
        x: &DevBuf<f32>,
        s: Nhwc,
        out: &mut DevBuf<f32>,
        arg: &mut DevBuf<u32>,
    ) -> Result<(), TrainError> {
        let n = s.b * (s.h / 2) * (s.w / 2) * s.c;
        grow(&self.0.stream, arg, out.len)?;
        assert!(x.len >= s.len() && out.len >= n, "max_pool2 shapes");
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.max_pool2);
        l.arg(x.slice())
            .arg(out.slice_mut())
            .arg(arg.slice_mut())
            .arg(&s.b)
            .arg(&s.h)
            .arg(&s.w)
            .arg(&s.c);
        // SAFETY: (const float*, float*, unsigned*, size_t × 4); writes out and arg [0..n),
        // reads x within b·h·w·c, checked above.
        Self::launched(unsafe { l.launch(grid(n)) }, "max_pool2")
    }

    fn max_pool2_backward(
        &self,
        dout: &DevBuf<f32>,
        arg: &DevBuf<u32>,
        dx: &mut DevBuf<f32>,
        len: usize,
    ) -> Result<(), TrainError> {
        assert!(dx.len >= len, "max_pool2_backward shapes");
        if len > 0 {
            let mut l = self.0.stream.launch_builder(&self.0.f.fill_zero);
            l.arg(dx.slice_mut()).arg(&len);
            // SAFETY: (float*, size_t), writing dx[0..len).
            Self::launched(unsafe { l.launch(grid(len)) }, "fill_zero")?;
        }
        let n = dout.len.min(arg.len);
        if n == 0 {
            return Ok(());
        }
        let mut l = self.0.stream.launch_builder(&self.0.f.max_pool2_backward);
        l.arg(dout.slice())
            .arg(arg.slice())
            .arg(dx.slice_mut())
            .arg(&n);
        // SAFETY: (const float*, const unsigned*, float*, size_t); every arg[o] is an index
        // into the pooled input, which dx holds (max_pool2 wrote them).
        Self::launched(unsafe { l.launch(grid(n)) }, "max_pool2_backward")
    }

    fn transpose_images(
        &self,
        x: &DevBuf<f32>,
        s: Nhwc,
        to_nchw: bool,
        out: &mut DevBuf<f32>,
    ) -> Result<(), TrainError> {
        let (hw, c) = (s.h * s.w, s.c);
        let (rows, cols) = if to_nchw { (hw, c) } else { (c, hw) };
        self.batched_transpose(x, out, (s.b, rows, cols))
    }

    fn permute_taps(
        &self,
        src: &DevBuf<f32>,
        oc: usize,
        c: usize,
        taps: usize,
        to_taps_major: bool,
        dst: &mut DevBuf<f32>,
    ) -> Result<(), TrainError> {
        let (rows, cols) = if to_taps_major { (c, taps) } else { (taps, c) };
        self.batched_transpose(src, dst, (oc, rows, cols))
    }

    fn softmax_cross_entropy(
        &self,
        logits: &DevBuf<f32>,
        labels: &DevBuf<u32>,
        rows: usize,
        classes: usize,
        dlogits: &mut DevBuf<f32>,
    ) -> Result<f32, TrainError> {
        assert!(
            logits.len >= rows * classes && dlogits.len >= rows * classes && labels.len >= rows,
            "softmax shapes"
        );
        if rows == 0 {
            return Ok(0.0);
        }
        let s = &self.0.stream;
        let mut row_loss = DevBuf::<f32>::default();
        grow(s, &mut row_loss, rows)?;
        let mut l = s.launch_builder(&self.0.f.softmax_xent);
        l.arg(logits.slice())
            .arg(labels.slice())
            .arg(dlogits.slice_mut())
            .arg(row_loss.slice_mut())
            .arg(&rows)
            .arg(&classes);
        // SAFETY: (const float*, const unsigned*, float*, float*, size_t, size_t); row r
        // touches [r·classes, (r+1)·classes) of logits and dlogits, labels[r], row_loss[r].
        Self::launched(unsafe { l.launch(grid(rows)) }, "softmax_xent")?;
        let mut host = Vec::new();
        let losses = self.view(&row_loss, &mut host)?;
        let sum: f64 = losses.iter().map(|&v| v as f64).sum();
        Ok((sum / rows as f64) as f32)
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
        for name in [
            "add_bias",
            "relu",
            "relu_backward",
            "fill_zero",
            "column_sums",
            "im2col",
            "col2im",
            "max_pool2",
            "max_pool2_backward",
            "batched_transpose",
            "softmax_xent",
        ] {
            assert!(
                text.contains(&format!(".entry {name}(")),
                "kernel {name} missing from the ptx"
            );
        }
    }
}
