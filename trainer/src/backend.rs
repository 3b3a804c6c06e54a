//! Where the layer-wise engine ([`crate::LayerEngine`]) computes: the kernels it needs, over
//! buffers the backend owns.
//!
//! [`Host`] runs the CPU kernels of `crate::kernels` on `Vec`s, in place: the parameters
//! and gradients the engine reads and writes are the trainer's own host buffers. A device
//! backend ([`crate::gpu`]) keeps every buffer on its device: the engine uploads the
//! parameters once per step ([`Backend::load_params`]), computes there, and hands each
//! layer's gradients back to host memory as the backward pass produces them
//! ([`Backend::grads_out`]), so that they can go on the wire at once, as on the CPU.
//! Operations are queued in order on one stream; the host waits only where it reads.
//!
//! Every operation has the semantics of its CPU kernel of the same name; shapes are in
//! values, and a buffer's `len` is what the last `resize` or `upload` gave it.

use crate::error::TrainError;
use crate::kernels::{self, Nhwc, Trans};

/// The kernels of the layer-wise engine on one kind of memory.
pub trait Backend: std::fmt::Debug + Send {
    /// `f32` values.
    type Buf: Default + std::fmt::Debug + Send;
    /// `u32` values (labels, pooling argmaxes).
    type Index: Default + std::fmt::Debug + Send;
    /// Whether buffers are host memory (then the sufficient-factor path, which reads
    /// activations on the host, is available).
    const ON_HOST: bool;

    /// What the engine prints about where it computes (`"cpu"`, `"cuda:0 (NVIDIA H100 …)"`).
    fn describe(&self) -> String;
    /// Makes `buf` hold `len` values (contents unspecified).
    fn resize(&self, buf: &mut Self::Buf, len: usize) -> Result<(), TrainError>;
    /// Copies `src` into `dst`, which then holds `src.len()` values.
    fn upload(&self, src: &[f32], dst: &mut Self::Buf) -> Result<(), TrainError>;
    /// Copies `src` into `dst`, which then holds `src.len()` values.
    fn upload_index(&self, src: &[u32], dst: &mut Self::Index) -> Result<(), TrainError>;
    /// The values of `src` on the host: `src` itself on the host, else copied into `stage`.
    fn view<'a>(
        &self,
        src: &'a Self::Buf,
        stage: &'a mut Vec<f32>,
    ) -> Result<&'a [f32], TrainError>;
    /// `buf` as a host slice: on the host only.
    fn host_slice(buf: &Self::Buf) -> Option<&[f32]>;
    /// Makes the parameters `host` (in parameter order) readable through
    /// [`Backend::param`]: a copy into `dev` on a device, nothing on the host.
    fn load_params(&self, host: &[Vec<f32>], dev: &mut Vec<Self::Buf>) -> Result<(), TrainError>;
    /// Parameter `i`, after [`Backend::load_params`].
    fn param<'a>(host: &'a [Vec<f32>], dev: &'a [Self::Buf], i: usize) -> &'a Self::Buf;
    /// Where the gradient of parameter `i` is computed (`dev` sized by
    /// [`Backend::load_params`]'s caller to the parameter count).
    fn grad<'a>(host: &'a mut [Vec<f32>], dev: &'a mut [Self::Buf], i: usize) -> &'a mut Self::Buf;
    /// Makes the gradients of parameters `ids` visible in `host` (a copy on a device).
    fn grads_out(
        &self,
        dev: &[Self::Buf],
        host: &mut [Vec<f32>],
        ids: [usize; 2],
    ) -> Result<(), TrainError>;

    /// As the CPU kernel `matmul`.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        dst: &mut Self::Buf,
        mnk: (usize, usize, usize),
        a: &Self::Buf,
        ta: Trans,
        b: &Self::Buf,
        tb: Trans,
        accumulate: bool,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `add_bias`.
    fn add_bias(&self, x: &mut Self::Buf, bias: &Self::Buf) -> Result<(), TrainError>;
    /// As the CPU kernel `relu`.
    fn relu(&self, x: &mut Self::Buf) -> Result<(), TrainError>;
    /// As the CPU kernel `relu_backward`.
    fn relu_backward(&self, g: &mut Self::Buf, out: &Self::Buf) -> Result<(), TrainError>;
    /// As the CPU kernel `column_sums` (overwriting `dst`, whose length is the column count).
    fn column_sums(&self, x: &Self::Buf, dst: &mut Self::Buf) -> Result<(), TrainError>;
    /// As the CPU kernel `im2col`.
    fn im2col(
        &self,
        x: &Self::Buf,
        s: Nhwc,
        k: usize,
        cols: &mut Self::Buf,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `col2im`.
    fn col2im(
        &self,
        dcols: &Self::Buf,
        s: Nhwc,
        k: usize,
        dx: &mut Self::Buf,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `max_pool2`.
    fn max_pool2(
        &self,
        x: &Self::Buf,
        s: Nhwc,
        out: &mut Self::Buf,
        arg: &mut Self::Index,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `max_pool2_backward`.
    fn max_pool2_backward(
        &self,
        dout: &Self::Buf,
        arg: &Self::Index,
        dx: &mut Self::Buf,
        len: usize,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `transpose_images`.
    fn transpose_images(
        &self,
        x: &Self::Buf,
        s: Nhwc,
        to_nchw: bool,
        out: &mut Self::Buf,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `permute_taps`.
    #[allow(clippy::too_many_arguments)]
    fn permute_taps(
        &self,
        src: &Self::Buf,
        oc: usize,
        c: usize,
        taps: usize,
        to_taps_major: bool,
        dst: &mut Self::Buf,
    ) -> Result<(), TrainError>;
    /// As the CPU kernel `softmax_cross_entropy` over `rows` samples.
    fn softmax_cross_entropy(
        &self,
        logits: &Self::Buf,
        labels: &Self::Index,
        rows: usize,
        classes: usize,
        dlogits: &mut Self::Buf,
    ) -> Result<f32, TrainError>;
}

/// The CPU: `crate::kernels` on `Vec`s. With `STAGED` it is the CPU twin of a device
/// backend ([`Staged`]); without, the trainer's CPU engine ([`Host`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu<const STAGED: bool>;

/// The CPU engine: parameters and gradients are the trainer's own buffers.
pub type Host = Cpu<false>;

/// The CPU twin of a device backend: the CPU's kernels, a device's buffers and copies
/// (parameters copied in every step, every layer's gradients copied out, logits copied
/// back), so that the engine's device path runs, and is tested, where no device is. Used for
/// ranks given the test-only fake GPUs.
pub type Staged = Cpu<true>;

impl<const STAGED: bool> Backend for Cpu<STAGED> {
    type Buf = Vec<f32>;
    type Index = Vec<u32>;
    const ON_HOST: bool = !STAGED;

    fn describe(&self) -> String {
        if STAGED {
            "cpu (staged like a device)"
        } else {
            "cpu"
        }
        .into()
    }

    fn resize(&self, buf: &mut Vec<f32>, len: usize) -> Result<(), TrainError> {
        buf.resize(len, 0.0);
        Ok(())
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>) -> Result<(), TrainError> {
        dst.clear();
        dst.extend_from_slice(src);
        Ok(())
    }

    fn upload_index(&self, src: &[u32], dst: &mut Vec<u32>) -> Result<(), TrainError> {
        dst.clear();
        dst.extend_from_slice(src);
        Ok(())
    }

    fn view<'a>(
        &self,
        src: &'a Vec<f32>,
        stage: &'a mut Vec<f32>,
    ) -> Result<&'a [f32], TrainError> {
        if !STAGED {
            return Ok(src);
        }
        stage.clear();
        stage.extend_from_slice(src);
        Ok(stage)
    }

    fn host_slice(buf: &Vec<f32>) -> Option<&[f32]> {
        (!STAGED).then_some(buf.as_slice())
    }

    fn load_params(&self, host: &[Vec<f32>], dev: &mut Vec<Vec<f32>>) -> Result<(), TrainError> {
        if STAGED {
            dev.resize_with(host.len(), Vec::new);
            for (h, d) in host.iter().zip(dev.iter_mut()) {
                self.upload(h, d)?;
            }
        }
        Ok(())
    }

    fn param<'a>(host: &'a [Vec<f32>], dev: &'a [Vec<f32>], i: usize) -> &'a Vec<f32> {
        if STAGED {
            &dev[i]
        } else {
            &host[i]
        }
    }

    fn grad<'a>(host: &'a mut [Vec<f32>], dev: &'a mut [Vec<f32>], i: usize) -> &'a mut Vec<f32> {
        if STAGED {
            &mut dev[i]
        } else {
            &mut host[i]
        }
    }

    fn grads_out(
        &self,
        dev: &[Vec<f32>],
        host: &mut [Vec<f32>],
        ids: [usize; 2],
    ) -> Result<(), TrainError> {
        if STAGED {
            for i in ids {
                host[i].copy_from_slice(&dev[i]);
            }
        }
        Ok(())
    }

    fn matmul(
        &self,
        dst: &mut Vec<f32>,
        mnk: (usize, usize, usize),
        a: &Vec<f32>,
        ta: Trans,
        b: &Vec<f32>,
        tb: Trans,
        accumulate: bool,
    ) -> Result<(), TrainError> {
        kernels::matmul(dst, mnk, a, ta, b, tb, accumulate);
        Ok(())
    }

    fn add_bias(&self, x: &mut Vec<f32>, bias: &Vec<f32>) -> Result<(), TrainError> {
        kernels::add_bias(x, bias);
        Ok(())
    }

    fn relu(&self, x: &mut Vec<f32>) -> Result<(), TrainError> {
        kernels::relu(x);
        Ok(())
    }

    fn relu_backward(&self, g: &mut Vec<f32>, out: &Vec<f32>) -> Result<(), TrainError> {
        kernels::relu_backward(g, out);
        Ok(())
    }

    fn column_sums(&self, x: &Vec<f32>, dst: &mut Vec<f32>) -> Result<(), TrainError> {
        kernels::column_sums(x, dst, false);
        Ok(())
    }

    fn im2col(
        &self,
        x: &Vec<f32>,
        s: Nhwc,
        k: usize,
        cols: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        kernels::im2col(x, s, k, cols);
        Ok(())
    }

    fn col2im(
        &self,
        dcols: &Vec<f32>,
        s: Nhwc,
        k: usize,
        dx: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        kernels::col2im(dcols, s, k, dx);
        Ok(())
    }

    fn max_pool2(
        &self,
        x: &Vec<f32>,
        s: Nhwc,
        out: &mut Vec<f32>,
        arg: &mut Vec<u32>,
    ) -> Result<(), TrainError> {
        arg.resize(out.len(), 0);
        kernels::max_pool2(x, s, out, arg);
        Ok(())
    }

    fn max_pool2_backward(
        &self,
        dout: &Vec<f32>,
        arg: &Vec<u32>,
        dx: &mut Vec<f32>,
        len: usize,
    ) -> Result<(), TrainError> {
        kernels::max_pool2_backward(dout, arg, dx, len);
        Ok(())
    }

    fn transpose_images(
        &self,
        x: &Vec<f32>,
        s: Nhwc,
        to_nchw: bool,
        out: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        kernels::transpose_images(x, s, to_nchw, out);
        Ok(())
    }

    fn permute_taps(
        &self,
        src: &Vec<f32>,
        oc: usize,
        c: usize,
        taps: usize,
        to_taps_major: bool,
        dst: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        kernels::permute_taps(src, oc, c, taps, to_taps_major, dst);
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: &Vec<f32>,
        labels: &Vec<u32>,
        rows: usize,
        classes: usize,
        dlogits: &mut Vec<f32>,
    ) -> Result<f32, TrainError> {
        Ok(kernels::softmax_cross_entropy(
            &logits[..rows * classes],
            &labels[..rows],
            classes,
            dlogits,
        ))
    }
}
