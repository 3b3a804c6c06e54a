//! Layer-wise forward and backward for the sequential models (the MLP and the CNN).
//!
//! candle computes all gradients in one `backward()`: no per-layer hooks, so no allreduce
//! can start before the whole backward pass ends, and on the CPU its autograd costs about
//! three times the matrix products it needs (it allocates and zero-fills an accumulator per
//! node, computes input gradients nobody asked for, and copies transposed views). For the
//! sequential models the trainer runs this instead: the same functions of the same
//! parameters (candle-nn's [`crate::Mlp`] and [`crate::Cnn`] define them, and a test
//! checks outputs and gradients against candle's autograd), computed layer by layer on flat
//! buffers, so that the gradients of the last layer are ready, and can be on the wire,
//! while the earlier layers' are still being computed. The transformer keeps candle's
//! autograd.
//!
//! Activations of the convolutional part are NHWC (channels innermost: im2col copies
//! whole pixels); the dense part sees candle's NCHW flatten order.

use crate::error::TrainError;
use crate::kernels::{
    add_bias, col2im, column_sums, im2col, matmul, max_pool2, max_pool2_backward, relu,
    relu_backward, softmax_cross_entropy, transpose_images, Nhwc, Trans,
};
use crate::spec::{Arch, ModelSpec, SufficientFactors};

/// One layer. `w` and `b` index the model's parameter list (sorted by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `y = x·Wᵀ + b`, then ReLU if `relu`.
    Dense {
        w: usize,
        b: usize,
        n_in: usize,
        n_out: usize,
        relu: bool,
    },
    /// `k × k` stride-1 "same" convolution (weights `[oc, c, k, k]` as candle), ReLU, 2×2
    /// max-pool; NHWC in and out.
    ConvPool {
        w: usize,
        b: usize,
        k: usize,
        oc: usize,
        input: Nhwc,
    },
    /// NCHW → NHWC (the input images, when they have more than one channel).
    ToNhwc { input: Nhwc },
    /// NHWC → NCHW (before the dense layers: candle's flatten order).
    ToNchw { input: Nhwc },
}

impl Op {
    /// Values per sample in and out.
    fn sizes(&self) -> (usize, usize) {
        match *self {
            Op::Dense { n_in, n_out, .. } => (n_in, n_out),
            Op::ConvPool { oc, input, .. } => {
                let out = input.pooled(oc);
                (input.h * input.w * input.c, out.h * out.w * out.c)
            }
            Op::ToNhwc { input } | Op::ToNchw { input } => {
                let n = input.h * input.w * input.c;
                (n, n)
            }
        }
    }

    fn params(&self) -> Option<[usize; 2]> {
        match *self {
            Op::Dense { w, b, .. } | Op::ConvPool { w, b, .. } => Some([w, b]),
            _ => None,
        }
    }
}

/// Per-layer buffers kept from step to step.
#[derive(Debug, Default)]
struct Scratch {
    /// im2col of the input.
    cols: Vec<f32>,
    /// Convolution output after ReLU, before pooling.
    conv: Vec<f32>,
    /// Pooling argmax into `conv`.
    arg: Vec<u32>,
    /// Weights as `[oc, k, k, c]`.
    wp: Vec<f32>,
    /// Their gradient.
    dwp: Vec<f32>,
    /// Gradient of the convolution's output (between the two halves of the backward).
    dconv: Vec<f32>,
}

/// What the first half of a layer's backward produced.
#[derive(Debug)]
pub enum LayerGrads<'a> {
    /// The gradients of parameters `[weight, bias]`, written into `grads`.
    Params([usize; 2]),
    /// A dense layer's sufficient factors (see [`SufficientFactors`]), its parameter
    /// gradients not computed: weight `w` (`[n_out, n_in]`) gets `out_gradᵀ·input`, bias `b`
    /// the column sums of `out_grad`.
    Factors {
        /// Weight and bias parameter indices.
        params: (usize, usize),
        /// Gradient of the layer's pre-activation output, `[batch, n_out]`.
        out_grad: &'a [f32],
        /// The layer's input, `[batch, n_in]`.
        input: &'a [f32],
        /// `(n_in, n_out)`.
        dims: (usize, usize),
    },
}

/// A sequential model run layer by layer (see the module docs).
///
/// Use: [`Layers::forward`], [`Layers::loss`], then [`Layers::backward`] (or its two halves)
/// for every layer
/// from `len() - 1` down to 0; each returns the parameters whose gradients it wrote.
#[derive(Debug)]
pub struct Layers {
    ops: Vec<Op>,
    scratch: Vec<Scratch>,
    /// `acts[i]` is the input of op `i`; the last one is the logits.
    acts: Vec<Vec<f32>>,
    /// Gradient with respect to the output of the op being differentiated.
    grad: Vec<f32>,
    grad_next: Vec<f32>,
    /// Ops before this one have no parameters: their input gradient is not needed.
    first_param_op: usize,
    /// Per op: a dense layer whose gradients leave as sufficient factors.
    factors: Vec<bool>,
    batch: usize,
    classes: usize,
}

impl Layers {
    /// The layers of `spec` (MLP or CNN; `None` for the transformer) for inputs of `shape`
    /// and `classes` outputs, indexing parameters by their names in `names`.
    pub fn for_model(
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        names: &[&str],
    ) -> Result<Option<Self>, TrainError> {
        let index = |name: String| {
            names
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| TrainError::StateMismatch(format!("no parameter {name}")))
        };
        let dense = |name: &str, n_in, n_out, relu| -> Result<Op, TrainError> {
            Ok(Op::Dense {
                w: index(format!("{name}.weight"))?,
                b: index(format!("{name}.bias"))?,
                n_in,
                n_out,
                relu,
            })
        };
        let mut ops = Vec::new();
        match spec.arch {
            Arch::Transformer => return Ok(None),
            Arch::Mlp => {
                let mut dims = vec![shape.iter().product::<usize>()];
                dims.extend_from_slice(&spec.hidden);
                dims.push(classes);
                for (i, d) in dims.windows(2).enumerate() {
                    ops.push(dense(&format!("fc{i}"), d[0], d[1], i + 2 < dims.len())?);
                }
            }
            Arch::Cnn => {
                let [c, h, w] = shape;
                let image = Nhwc { b: 0, h, w, c };
                if c > 1 {
                    ops.push(Op::ToNhwc { input: image });
                }
                let [c1, c2] = [spec.channels[0], spec.channels[1]];
                let conv = |name: &str, oc, input| -> Result<Op, TrainError> {
                    Ok(Op::ConvPool {
                        w: index(format!("{name}.weight"))?,
                        b: index(format!("{name}.bias"))?,
                        k: spec.kernel,
                        oc,
                        input,
                    })
                };
                ops.push(conv("conv1", c1, image)?);
                let mid = image.pooled(c1);
                ops.push(conv("conv2", c2, mid)?);
                let out = mid.pooled(c2);
                ops.push(Op::ToNchw { input: out });
                ops.push(dense("fc1", out.h * out.w * c2, spec.fc, true)?);
                ops.push(dense("fc2", spec.fc, classes, false)?);
            }
        }
        let first_param_op = ops.iter().position(|o| o.params().is_some()).unwrap_or(0);
        Ok(Some(Layers {
            scratch: ops.iter().map(|_| Scratch::default()).collect(),
            acts: vec![Vec::new(); ops.len() + 1],
            factors: vec![false; ops.len()],
            ops,
            grad: Vec::new(),
            grad_next: Vec::new(),
            first_param_op,
            batch: 0,
            classes,
        }))
    }

    /// Chooses the dense layers whose gradients leave as sufficient factors, for `world`
    /// ranks of `batch` samples each (see [`SufficientFactors`]); returns how many.
    pub fn choose_factors(&mut self, mode: SufficientFactors, world: usize, batch: usize) -> usize {
        for (op, f) in self.ops.iter().zip(&mut self.factors) {
            *f = match *op {
                Op::Dense { n_in, n_out, .. } if world > 1 => match mode {
                    SufficientFactors::Never => false,
                    SufficientFactors::Always => true,
                    SufficientFactors::Auto => world * batch * (n_in + n_out) <= n_in * n_out,
                },
                _ => false,
            };
        }
        self.factors.iter().filter(|f| **f).count()
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Logits `[batch, classes]` for `x` (`batch` samples, NCHW), with `params` in the
    /// model's parameter order. Keeps what the backward pass needs.
    pub fn forward(&mut self, params: &[Vec<f32>], x: &[f32], batch: usize) -> &[f32] {
        self.batch = batch;
        let n0 = self.ops.first().map_or(0, |o| o.sizes().0);
        assert_eq!(x.len(), batch * n0, "input of {batch} samples");
        self.acts[0].clear();
        self.acts[0].extend_from_slice(x);
        for (i, (op, sc)) in self.ops.iter().zip(&mut self.scratch).enumerate() {
            let (head, tail) = self.acts.split_at_mut(i + 1);
            let (x, y) = (&head[i], &mut tail[0]);
            y.resize(batch * op.sizes().1, 0.0);
            match *op {
                Op::Dense {
                    w,
                    b,
                    n_in,
                    n_out,
                    relu: r,
                } => {
                    matmul(
                        y,
                        (batch, n_out, n_in),
                        x,
                        Trans::No,
                        &params[w],
                        Trans::Yes,
                        false,
                    );
                    add_bias(y, &params[b]);
                    if r {
                        relu(y);
                    }
                }
                Op::ConvPool { w, b, k, oc, input } => {
                    let s = Nhwc { b: batch, ..input };
                    let (rows, kkc) = (batch * s.h * s.w, k * k * s.c);
                    sc.cols.resize(rows * kkc, 0.0);
                    im2col(x, s, k, &mut sc.cols);
                    sc.wp.resize(oc * kkc, 0.0);
                    permute_taps(&params[w], oc, s.c, k * k, true, &mut sc.wp);
                    sc.conv.resize(rows * oc, 0.0);
                    matmul(
                        &mut sc.conv,
                        (rows, oc, kkc),
                        &sc.cols,
                        Trans::No,
                        &sc.wp,
                        Trans::Yes,
                        false,
                    );
                    add_bias(&mut sc.conv, &params[b]);
                    relu(&mut sc.conv);
                    sc.arg.resize(y.len(), 0);
                    max_pool2(&sc.conv, Nhwc { c: oc, ..s }, y, &mut sc.arg);
                }
                Op::ToNhwc { input } => transpose_images(x, Nhwc { b: batch, ..input }, false, y),
                Op::ToNchw { input } => transpose_images(x, Nhwc { b: batch, ..input }, true, y),
            }
        }
        &self.acts[self.ops.len()]
    }

    /// Mean cross-entropy of the last forward's logits against `labels`; sets up the
    /// backward pass.
    pub fn loss(&mut self, labels: &[u32]) -> f32 {
        assert_eq!(labels.len(), self.batch, "one label per sample");
        self.grad.resize(self.batch * self.classes, 0.0);
        softmax_cross_entropy(
            &self.acts[self.ops.len()],
            labels,
            self.classes,
            &mut self.grad,
        )
    }

    /// Backward through layer `i` (call from the last layer down to 0 after
    /// [`Layers::loss`]): writes the gradients of its parameters into `grads` (sized as the
    /// parameters) and returns their indices. [`Layers::backward_params`], then
    /// [`Layers::backward_input`].
    ///
    /// # Panics
    /// If layer `i` was chosen for sufficient factors (use the two halves then).
    pub fn backward(
        &mut self,
        i: usize,
        params: &[Vec<f32>],
        grads: &mut [Vec<f32>],
    ) -> Option<[usize; 2]> {
        let done = match self.backward_params(i, grads) {
            Some(LayerGrads::Params(p)) => Some(p),
            Some(LayerGrads::Factors { .. }) => panic!("layer {i} leaves as factors"),
            None => None,
        };
        self.backward_input(i, params);
        done
    }

    /// First half of the backward through layer `i`: the gradients of its parameters
    /// (into `grads`), or for a layer chosen by [`Layers::choose_factors`] its sufficient
    /// factors, so that they can go on the wire while [`Layers::backward_input`] computes
    /// the gradient of the layer's input. `None` for a layer without parameters.
    pub fn backward_params(&mut self, i: usize, grads: &mut [Vec<f32>]) -> Option<LayerGrads<'_>> {
        if i < self.first_param_op {
            return None;
        }
        let batch = self.batch;
        let (x, y) = (&self.acts[i], &self.acts[i + 1]);
        let sc = &mut self.scratch[i];
        let g = &mut self.grad;
        match self.ops[i] {
            Op::Dense {
                w,
                b,
                n_in,
                n_out,
                relu: r,
            } => {
                if r {
                    relu_backward(g, y);
                }
                if self.factors[i] {
                    return Some(LayerGrads::Factors {
                        params: (w, b),
                        out_grad: g,
                        input: x,
                        dims: (n_in, n_out),
                    });
                }
                matmul(
                    &mut grads[w],
                    (n_out, n_in, batch),
                    g,
                    Trans::Yes,
                    x,
                    Trans::No,
                    false,
                );
                column_sums(g, &mut grads[b], false);
            }
            Op::ConvPool { w, b, k, oc, input } => {
                let s = Nhwc { b: batch, ..input };
                let (rows, kkc) = (batch * s.h * s.w, k * k * s.c);
                relu_backward(g, y);
                // The pooled maxima are the ReLU outputs that count; `conv` gets the
                // gradient of the convolution's output (kept for `backward_input`).
                sc.dconv.resize(rows * oc, 0.0);
                max_pool2_backward(g, &sc.arg, &mut sc.dconv, rows * oc);
                sc.dwp.resize(oc * kkc, 0.0);
                matmul(
                    &mut sc.dwp,
                    (oc, kkc, rows),
                    &sc.dconv,
                    Trans::Yes,
                    &sc.cols,
                    Trans::No,
                    false,
                );
                permute_taps(&sc.dwp, oc, s.c, k * k, false, &mut grads[w]);
                column_sums(&sc.dconv, &mut grads[b], false);
            }
            Op::ToNhwc { .. } | Op::ToNchw { .. } => {}
        }
        self.ops[i].params().map(LayerGrads::Params)
    }

    /// Second half of the backward through layer `i`: the gradient of its input, which the
    /// layer before needs (skipped when no layer before has parameters).
    pub fn backward_input(&mut self, i: usize, params: &[Vec<f32>]) {
        if i <= self.first_param_op {
            return;
        }
        let batch = self.batch;
        let sc = &mut self.scratch[i];
        let g = &mut self.grad;
        let next = &mut self.grad_next;
        match self.ops[i] {
            Op::Dense { w, n_in, n_out, .. } => {
                next.resize(batch * n_in, 0.0);
                matmul(
                    next,
                    (batch, n_in, n_out),
                    g,
                    Trans::No,
                    &params[w],
                    Trans::No,
                    false,
                );
                std::mem::swap(g, next);
            }
            Op::ConvPool { k, oc, input, .. } => {
                let s = Nhwc { b: batch, ..input };
                let (rows, kkc) = (batch * s.h * s.w, k * k * s.c);
                // dcols into `cols` (no longer needed), then col2im into `g`.
                matmul(
                    &mut sc.cols,
                    (rows, kkc, oc),
                    &sc.dconv,
                    Trans::No,
                    &sc.wp,
                    Trans::No,
                    false,
                );
                g.resize(s.len(), 0.0);
                col2im(&sc.cols, s, k, g);
            }
            Op::ToNhwc { input } | Op::ToNchw { input } => {
                let s = Nhwc { b: batch, ..input };
                next.resize(s.len(), 0.0);
                // The adjoint of a transpose is the transpose back.
                let to_nchw = matches!(self.ops[i], Op::ToNhwc { .. });
                transpose_images(g, s, to_nchw, next);
                std::mem::swap(g, next);
            }
        }
    }
}

/// Convolution weights `[oc, c, taps]` ⇄ `[oc, taps, c]` (`to_taps_major`: the first to the
/// second).
fn permute_taps(
    src: &[f32],
    oc: usize,
    c: usize,
    taps: usize,
    to_taps_major: bool,
    dst: &mut [f32],
) {
    for o in 0..oc {
        let (s, d) = (
            &src[o * c * taps..(o + 1) * c * taps],
            &mut dst[o * c * taps..(o + 1) * c * taps],
        );
        for ch in 0..c {
            for t in 0..taps {
                if to_taps_major {
                    d[t * c + ch] = s[ch * taps + t];
                } else {
                    d[ch * taps + t] = s[t * c + ch];
                }
            }
        }
    }
}
