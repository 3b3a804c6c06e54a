//! The device backend of the layer-wise engine, written over a small [`Driver`]: memory,
//! copies, launching a kernel of `kernels.cu` by name, and `sgemm`. The CUDA driver
//! (`super::cuda`, feature `cuda`) does these with cudarc; a test driver runs the same kernels
//! on the CPU (compiled as C++) and `sgemm` by its definition, so everything here, from the
//! buffers' sizes to every launch's arguments, is tested without a GPU.

use std::sync::{Arc, Mutex};

use crate::backend::Backend;
use crate::error::TrainError;
use crate::kernels::{Nhwc, Trans};

use super::{gemm_plan, GemmPlan, COLUMN_CHUNK_ROWS};

/// A value type device memory holds (`f32`, `u32`).
#[cfg(feature = "cuda")]
pub trait DeviceElem:
    cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
    + std::fmt::Debug
    + Copy
    + Default
    + Send
    + 'static
{
}
/// A value type device memory holds (`f32`, `u32`).
#[cfg(not(feature = "cuda"))]
pub trait DeviceElem: std::fmt::Debug + Copy + Default + Send + 'static {}
impl DeviceElem for f32 {}
impl DeviceElem for u32 {}

/// One kernel argument: device memory (read, or written) or a size.
pub enum Arg<'a, D: Driver> {
    /// Memory the kernel reads (`const float*`).
    F(&'a D::Mem<f32>),
    /// Memory the kernel writes (`float*`).
    FMut(&'a mut D::Mem<f32>),
    /// Indices the kernel reads (`const unsigned*`).
    U(&'a D::Mem<u32>),
    /// Indices the kernel writes (`unsigned*`).
    UMut(&'a mut D::Mem<u32>),
    /// A size (`size_t`).
    Z(usize),
    /// A scalar (`float`).
    S(f32),
}

/// What the device backend needs of a device. Operations are queued in order; only the
/// copies to the host wait.
pub trait Driver: std::fmt::Debug + Clone + Send + Sync + 'static {
    /// Device memory of `T`.
    type Mem<T: DeviceElem>: std::fmt::Debug + Send;

    /// The device, for logs (`"cuda:0 (NVIDIA H100 …, sm_90)"`).
    fn describe(&self) -> String;
    /// `len` zeroed values.
    fn alloc<T: DeviceElem>(&self, len: usize) -> Result<Self::Mem<T>, TrainError>;
    /// Values `mem` holds.
    fn capacity<T: DeviceElem>(mem: &Self::Mem<T>) -> usize;
    /// Copies `src` to the start of `dst` (at least as long).
    fn upload<T: DeviceElem>(&self, src: &[T], dst: &mut Self::Mem<T>) -> Result<(), TrainError>;
    /// Copies the first `dst.len()` values of `src` into `dst` and waits for them.
    fn download(&self, src: &Self::Mem<f32>, dst: &mut [f32]) -> Result<(), TrainError>;
    /// Queues kernel `name` of `kernels.cu` over (at least) `threads` threads; its
    /// grid-stride loops cover any grid.
    fn launch(
        &self,
        name: &'static str,
        threads: usize,
        args: &mut [Arg<'_, Self>],
    ) -> Result<(), TrainError>;
    /// cuBLAS `sgemm` by `plan` (see [`GemmPlan`]): `c = first·second (+ c)`.
    fn gemm(
        &self,
        plan: GemmPlan,
        accumulate: bool,
        first: &Self::Mem<f32>,
        second: &Self::Mem<f32>,
        c: &mut Self::Mem<f32>,
    ) -> Result<(), TrainError>;
    /// Waits until everything queued is done.
    fn synchronize(&self) -> Result<(), TrainError>;
}

/// Device memory of `T` holding `len` values (its allocation may be larger: buffers grow,
/// never shrink).
#[derive(Debug)]
pub struct DevBuf<D: Driver, T: DeviceElem> {
    mem: Option<D::Mem<T>>,
    len: usize,
}

impl<D: Driver, T: DeviceElem> Default for DevBuf<D, T> {
    fn default() -> Self {
        DevBuf { mem: None, len: 0 }
    }
}

impl<D: Driver, T: DeviceElem> DevBuf<D, T> {
    /// Values held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memory, which must hold exactly `len` values (NCCL reduces whole allocations).
    pub fn exact_mut(&mut self) -> Result<&mut D::Mem<T>, TrainError> {
        let len = self.len;
        match &mut self.mem {
            Some(m) if D::capacity(m) == len => Ok(m),
            _ => Err(TrainError::Device(format!(
                "a device buffer of {len} values is not allocated at exactly that size"
            ))),
        }
    }

    pub(super) fn mem(&self) -> &D::Mem<T> {
        self.mem
            .as_ref()
            .expect("a device buffer is sized before use")
    }

    pub(super) fn mem_mut(&mut self) -> &mut D::Mem<T> {
        self.mem
            .as_mut()
            .expect("a device buffer is sized before use")
    }

    /// Makes it hold `len` values, allocating (zeroed) when it has room for fewer.
    pub(super) fn grow(&mut self, d: &D, len: usize) -> Result<(), TrainError> {
        if self.mem.as_ref().is_none_or(|m| D::capacity(m) < len) {
            self.mem = Some(d.alloc::<T>(len.max(1))?);
        }
        self.len = len;
        Ok(())
    }

    pub(super) fn upload(&mut self, d: &D, src: &[T]) -> Result<(), TrainError> {
        self.grow(d, src.len())?;
        if !src.is_empty() {
            d.upload(src, self.mem_mut())?;
        }
        Ok(())
    }
}

/// Buffers an operation needs only while it runs, kept for the next step instead of being
/// allocated in every one.
#[derive(Debug)]
struct Scratch<D: Driver> {
    /// The column sums' partial sums.
    partials: DevBuf<D, f32>,
    /// Softmax cross-entropy's per-row losses, and their copy on the host.
    row_loss: DevBuf<D, f32>,
    row_loss_host: Vec<f32>,
}

/// The layer-wise engine's backend on a device (see the module docs). Clones share the
/// driver and the scratch buffers (an engine runs one operation at a time).
#[derive(Debug, Clone)]
pub struct DeviceBackend<D: Driver>(pub(crate) D, Arc<Mutex<Scratch<D>>>);

impl<D: Driver> DeviceBackend<D> {
    /// The backend on `driver`'s device.
    pub fn new(driver: D) -> Self {
        let scratch = Scratch {
            partials: DevBuf::default(),
            row_loss: DevBuf::default(),
            row_loss_host: Vec::new(),
        };
        DeviceBackend(driver, Arc::new(Mutex::new(scratch)))
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.0
    }

    fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch<D>> {
        self.1.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the queued work is done.
    pub fn synchronize(&self) -> Result<(), TrainError> {
        self.0.synchronize()
    }

    /// `out[o, j, i] = x[o, i, j]` for `x` of shape `(outer, rows, cols)`.
    fn batched_transpose(
        &self,
        x: &DevBuf<D, f32>,
        out: &mut DevBuf<D, f32>,
        (outer, rows, cols): (usize, usize, usize),
    ) -> Result<(), TrainError> {
        let n = outer * rows * cols;
        assert!(x.len >= n && out.len >= n, "transpose shapes");
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "batched_transpose",
            n,
            &mut [
                Arg::F(x.mem()),
                Arg::FMut(out.mem_mut()),
                Arg::Z(outer),
                Arg::Z(rows),
                Arg::Z(cols),
            ],
        )
    }
}

impl<D: Driver> Backend for DeviceBackend<D> {
    type Buf = DevBuf<D, f32>;
    type Index = DevBuf<D, u32>;
    const ON_HOST: bool = false;

    fn describe(&self) -> String {
        self.0.describe()
    }

    fn resize(&self, buf: &mut Self::Buf, len: usize) -> Result<(), TrainError> {
        buf.grow(&self.0, len)
    }

    fn upload(&self, src: &[f32], dst: &mut Self::Buf) -> Result<(), TrainError> {
        dst.upload(&self.0, src)
    }

    fn upload_index(&self, src: &[u32], dst: &mut Self::Index) -> Result<(), TrainError> {
        dst.upload(&self.0, src)
    }

    fn view<'a>(
        &self,
        src: &'a Self::Buf,
        stage: &'a mut Vec<f32>,
    ) -> Result<&'a [f32], TrainError> {
        stage.resize(src.len, 0.0);
        if src.len > 0 {
            self.0.download(src.mem(), stage)?;
        }
        Ok(stage)
    }

    fn host_slice(_: &Self::Buf) -> Option<&[f32]> {
        None
    }

    fn load_params(&self, host: &[Vec<f32>], dev: &mut Vec<Self::Buf>) -> Result<(), TrainError> {
        dev.resize_with(host.len(), DevBuf::default);
        for (h, d) in host.iter().zip(dev.iter_mut()) {
            d.upload(&self.0, h)?;
        }
        Ok(())
    }

    fn param<'a>(_: &'a [Vec<f32>], dev: &'a [Self::Buf], i: usize) -> &'a Self::Buf {
        &dev[i]
    }

    fn grad<'a>(_: &'a mut [Vec<f32>], dev: &'a mut [Self::Buf], i: usize) -> &'a mut Self::Buf {
        &mut dev[i]
    }

    fn grads_out(
        &self,
        dev: &[Self::Buf],
        host: &mut [Vec<f32>],
        ids: [usize; 2],
    ) -> Result<(), TrainError> {
        for i in ids {
            let (d, h) = (&dev[i], &mut host[i]);
            if d.len > 0 {
                self.0.download(d.mem(), &mut h[..d.len])?;
            }
        }
        Ok(())
    }

    fn matmul(
        &self,
        dst: &mut Self::Buf,
        (m, n, k): (usize, usize, usize),
        a: &Self::Buf,
        ta: Trans,
        b: &Self::Buf,
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
        // cuBLAS's first operand is B, its second A (see `GemmPlan`).
        let plan = gemm_plan((m, n, k), ta, tb);
        self.0
            .gemm(plan, accumulate, b.mem(), a.mem(), dst.mem_mut())
    }

    fn add_bias(&self, x: &mut Self::Buf, bias: &Self::Buf) -> Result<(), TrainError> {
        let (n, cols) = (x.len, bias.len);
        if n == 0 || cols == 0 {
            return Ok(());
        }
        self.0.launch(
            "add_bias",
            n,
            &mut [
                Arg::FMut(x.mem_mut()),
                Arg::F(bias.mem()),
                Arg::Z(n),
                Arg::Z(cols),
            ],
        )
    }

    fn relu(&self, x: &mut Self::Buf) -> Result<(), TrainError> {
        let n = x.len;
        if n == 0 {
            return Ok(());
        }
        self.0
            .launch("relu", n, &mut [Arg::FMut(x.mem_mut()), Arg::Z(n)])
    }

    fn relu_backward(&self, g: &mut Self::Buf, out: &Self::Buf) -> Result<(), TrainError> {
        let n = g.len.min(out.len);
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "relu_backward",
            n,
            &mut [Arg::FMut(g.mem_mut()), Arg::F(out.mem()), Arg::Z(n)],
        )
    }

    fn column_sums(&self, x: &Self::Buf, dst: &mut Self::Buf) -> Result<(), TrainError> {
        let cols = dst.len;
        if cols == 0 {
            return Ok(());
        }
        let rows = x.len / cols;
        let chunks = rows.div_ceil(COLUMN_CHUNK_ROWS).max(1);
        let part = &mut self.scratch().partials;
        part.grow(&self.0, chunks * cols)?;
        self.0.launch(
            "column_partials",
            chunks * cols,
            &mut [
                Arg::F(x.mem()),
                Arg::FMut(part.mem_mut()),
                Arg::Z(rows),
                Arg::Z(cols),
                Arg::Z(COLUMN_CHUNK_ROWS),
            ],
        )?;
        self.0.launch(
            "column_finish",
            cols,
            &mut [
                Arg::F(part.mem()),
                Arg::FMut(dst.mem_mut()),
                Arg::Z(chunks),
                Arg::Z(cols),
            ],
        )
    }

    fn im2col(
        &self,
        x: &Self::Buf,
        s: Nhwc,
        k: usize,
        cols: &mut Self::Buf,
    ) -> Result<(), TrainError> {
        let n = s.len() * k * k;
        assert!(x.len >= s.len() && cols.len >= n, "im2col shapes");
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "im2col",
            n,
            &mut [
                Arg::F(x.mem()),
                Arg::FMut(cols.mem_mut()),
                Arg::Z(s.b),
                Arg::Z(s.h),
                Arg::Z(s.w),
                Arg::Z(s.c),
                Arg::Z(k),
            ],
        )
    }

    fn col2im(
        &self,
        dcols: &Self::Buf,
        s: Nhwc,
        k: usize,
        dx: &mut Self::Buf,
    ) -> Result<(), TrainError> {
        let n = s.len();
        assert!(dcols.len >= n * k * k && dx.len >= n, "col2im shapes");
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "col2im",
            n,
            &mut [
                Arg::F(dcols.mem()),
                Arg::FMut(dx.mem_mut()),
                Arg::Z(s.b),
                Arg::Z(s.h),
                Arg::Z(s.w),
                Arg::Z(s.c),
                Arg::Z(k),
            ],
        )
    }

    fn max_pool2(
        &self,
        x: &Self::Buf,
        s: Nhwc,
        out: &mut Self::Buf,
        arg: &mut Self::Index,
    ) -> Result<(), TrainError> {
        let n = s.b * (s.h / 2) * (s.w / 2) * s.c;
        arg.grow(&self.0, out.len)?;
        assert!(x.len >= s.len() && out.len >= n, "max_pool2 shapes");
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "max_pool2",
            n,
            &mut [
                Arg::F(x.mem()),
                Arg::FMut(out.mem_mut()),
                Arg::UMut(arg.mem_mut()),
                Arg::Z(s.b),
                Arg::Z(s.h),
                Arg::Z(s.w),
                Arg::Z(s.c),
            ],
        )
    }

    fn max_pool2_backward(
        &self,
        dout: &Self::Buf,
        arg: &Self::Index,
        dx: &mut Self::Buf,
        len: usize,
    ) -> Result<(), TrainError> {
        assert!(dx.len >= len, "max_pool2_backward shapes");
        if len > 0 {
            self.0.launch(
                "fill_zero",
                len,
                &mut [Arg::FMut(dx.mem_mut()), Arg::Z(len)],
            )?;
        }
        let n = dout.len.min(arg.len);
        if n == 0 {
            return Ok(());
        }
        self.0.launch(
            "max_pool2_backward",
            n,
            &mut [
                Arg::F(dout.mem()),
                Arg::U(arg.mem()),
                Arg::FMut(dx.mem_mut()),
                Arg::Z(n),
            ],
        )
    }

    fn transpose_images(
        &self,
        x: &Self::Buf,
        s: Nhwc,
        to_nchw: bool,
        out: &mut Self::Buf,
    ) -> Result<(), TrainError> {
        let (hw, c) = (s.h * s.w, s.c);
        let (rows, cols) = if to_nchw { (hw, c) } else { (c, hw) };
        self.batched_transpose(x, out, (s.b, rows, cols))
    }

    fn permute_taps(
        &self,
        src: &Self::Buf,
        oc: usize,
        c: usize,
        taps: usize,
        to_taps_major: bool,
        dst: &mut Self::Buf,
    ) -> Result<(), TrainError> {
        let (rows, cols) = if to_taps_major { (c, taps) } else { (taps, c) };
        self.batched_transpose(src, dst, (oc, rows, cols))
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Self::Buf,
        labels: &Self::Index,
        rows: usize,
        classes: usize,
        dlogits: &mut Self::Buf,
    ) -> Result<f32, TrainError> {
        assert!(
            logits.len >= rows * classes && dlogits.len >= rows * classes && labels.len >= rows,
            "softmax shapes"
        );
        if rows == 0 {
            return Ok(0.0);
        }
        let scratch = &mut *self.scratch();
        let row_loss = &mut scratch.row_loss;
        row_loss.grow(&self.0, rows)?;
        self.0.launch(
            "softmax_xent",
            rows,
            &mut [
                Arg::F(logits.mem()),
                Arg::U(labels.mem()),
                Arg::FMut(dlogits.mem_mut()),
                Arg::FMut(row_loss.mem_mut()),
                Arg::Z(rows),
                Arg::Z(classes),
            ],
        )?;
        let losses = self.view(row_loss, &mut scratch.row_loss_host)?;
        let sum: f64 = losses.iter().map(|&v| v as f64).sum();
        Ok((sum / rows as f64) as f32)
    }
}
