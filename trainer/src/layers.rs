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
//!
//! The engine is written once over a [`Backend`]: [`Layers`] computes on the CPU in the
//! trainer's own buffers; on a GPU ([`crate::gpu`]) the same code runs the same kernels
//! there, with the parameters uploaded once per step and each layer's gradients copied
//! back as soon as they are computed.

use crate::backend::{Backend, Host};
use crate::error::TrainError;
use crate::kernels::{Nhwc, Trans};
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
#[derive(Debug)]
struct Scratch<B: Backend> {
    /// im2col of the input.
    cols: B::Buf,
    /// Convolution output after ReLU, before pooling.
    conv: B::Buf,
    /// Pooling argmax into `conv`.
    arg: B::Index,
    /// Weights as `[oc, k, k, c]`.
    wp: B::Buf,
    /// Their gradient.
    dwp: B::Buf,
    /// Gradient of the convolution's output (between the two halves of the backward).
    dconv: B::Buf,
}

impl<B: Backend> Default for Scratch<B> {
    fn default() -> Self {
        Scratch {
            cols: Default::default(),
            conv: Default::default(),
            arg: Default::default(),
            wp: Default::default(),
            dwp: Default::default(),
            dconv: Default::default(),
        }
    }
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

/// A sequential model run layer by layer on the CPU (see the module docs).
pub type Layers = LayerEngine<Host>;

/// A sequential model run layer by layer on backend `B` (see the module docs).
///
/// Use: [`LayerEngine::forward`], [`LayerEngine::loss`], then [`LayerEngine::backward`] (or
/// its two halves) for every layer from `len() - 1` down to 0; each returns the parameters
/// whose gradients it wrote (into the caller's host buffers, whatever the backend).
#[derive(Debug)]
pub struct LayerEngine<B: Backend> {
    be: B,
    ops: Vec<Op>,
    scratch: Vec<Scratch<B>>,
    /// `acts[i]` is the input of op `i`; the last one is the logits.
    acts: Vec<B::Buf>,
    /// Gradient with respect to the output of the op being differentiated.
    grad: B::Buf,
    grad_next: B::Buf,
    labels: B::Index,
    /// The parameters and gradients on the backend (empty on the host, where they are the
    /// caller's buffers).
    dev_params: Vec<B::Buf>,
    dev_grads: Vec<B::Buf>,
    /// The logits copied to the host.
    logits_stage: Vec<f32>,
    /// Ops before this one have no parameters: their input gradient is not needed.
    first_param_op: usize,
    /// Per op: a dense layer whose gradients leave as sufficient factors.
    factors: Vec<bool>,
    /// Gradients stay on the backend (see [`LayerEngine::keep_grads_on_device`]).
    grads_stay: bool,
    /// Parameters stay on the backend between steps (see
    /// [`LayerEngine::keep_params_on_device`]), and whether `dev_params` holds them.
    params_stay: bool,
    dev_params_current: bool,
    batch: usize,
    classes: usize,
}

impl Layers {
    /// The layers of `spec` (MLP or CNN; `None` for the transformer) for inputs of `shape`
    /// and `classes` outputs, indexing parameters by their names in `names`, on the CPU.
    pub fn for_model(
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        names: &[&str],
    ) -> Result<Option<Self>, TrainError> {
        LayerEngine::on(Host::default(), spec, shape, classes, names)
    }
}

impl<B: Backend> LayerEngine<B> {
    /// The layers of `spec` (MLP or CNN; `None` for the transformer) for inputs of `shape`
    /// and `classes` outputs, indexing parameters by their names in `names`, computed by
    /// `be`.
    pub fn on(
        be: B,
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
        Ok(Some(LayerEngine {
            be,
            scratch: ops.iter().map(|_| Scratch::default()).collect(),
            acts: (0..=ops.len()).map(|_| B::Buf::default()).collect(),
            factors: vec![false; ops.len()],
            ops,
            grad: B::Buf::default(),
            grad_next: B::Buf::default(),
            labels: B::Index::default(),
            dev_params: Vec::new(),
            dev_grads: Vec::new(),
            logits_stage: Vec::new(),
            first_param_op,
            grads_stay: false,
            params_stay: false,
            dev_params_current: false,
            batch: 0,
            classes,
        }))
    }

    /// With `stay`, the backward pass leaves the gradients on the backend, where the caller
    /// reduces them ([`LayerEngine::device_grads`], NCCL) and then copies them out
    /// ([`LayerEngine::grads_to_host`]); without (the default), each layer's gradients are
    /// copied to the caller's host buffers as soon as they are computed. No effect on the
    /// host, where they are the caller's buffers.
    pub fn keep_grads_on_device(&mut self, stay: bool) {
        self.grads_stay = stay;
    }

    /// With `stay`, the parameters on the backend are the parameters: [`LayerEngine::forward`]
    /// uploads the caller's only when told they changed ([`LayerEngine::params_changed`]),
    /// and the caller updates them in place ([`LayerEngine::params_and_grads`], the device
    /// optimizer) and reads them back with [`LayerEngine::params_to_host`]. No effect on the
    /// host.
    pub fn keep_params_on_device(&mut self, stay: bool) {
        self.params_stay = stay;
        self.dev_params_current = false;
    }

    /// The caller's parameters changed (a restore): the next forward pass uploads them.
    pub fn params_changed(&mut self) {
        self.dev_params_current = false;
    }

    /// The parameters and the gradients on the backend, in parameter order (empty on the
    /// host), after a forward pass.
    pub fn params_and_grads(&mut self) -> (&mut [B::Buf], &mut [B::Buf]) {
        (&mut self.dev_params, &mut self.dev_grads)
    }

    /// Copies the parameters on the backend into `params` (nothing on the host or before
    /// the first forward pass).
    pub fn params_to_host(&self, params: &mut [Vec<f32>]) -> Result<(), TrainError> {
        let mut stage = Vec::new();
        for (d, h) in self.dev_params.iter().zip(params.iter_mut()) {
            let v = self.be.view(d, &mut stage)?;
            if v.len() != h.len() {
                return Err(TrainError::Device(format!(
                    "a parameter of {} values on the device, {} on the host",
                    v.len(),
                    h.len()
                )));
            }
            h.copy_from_slice(v);
        }
        Ok(())
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.be
    }

    /// The gradients on the backend, in parameter order (empty on the host).
    pub fn device_grads(&mut self) -> &mut [B::Buf] {
        &mut self.dev_grads
    }

    /// Copies every gradient from the backend into `grads` (nothing on the host).
    pub fn grads_to_host(&mut self, grads: &mut [Vec<f32>]) -> Result<(), TrainError> {
        for op in &self.ops {
            if let Some(ids) = op.params() {
                self.be.grads_out(&self.dev_grads, grads, ids)?;
            }
        }
        Ok(())
    }

    /// Where this engine computes ([`Backend::describe`]).
    pub fn device(&self) -> String {
        self.be.describe()
    }

    /// Chooses the dense layers whose gradients leave as sufficient factors, for `world`
    /// ranks of `batch` samples each (see [`SufficientFactors`]); returns how many. Never
    /// any off the host (the factors are gathered from host memory).
    pub fn choose_factors(&mut self, mode: SufficientFactors, world: usize, batch: usize) -> usize {
        for (op, f) in self.ops.iter().zip(&mut self.factors) {
            *f = match *op {
                Op::Dense { n_in, n_out, .. } if world > 1 && B::ON_HOST => match mode {
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

    /// Runs the model on `x` (`batch` samples, NCHW), with `params` in the model's
    /// parameter order; keeps what the backward pass needs. [`LayerEngine::logits`] reads
    /// the output.
    pub fn forward(
        &mut self,
        params: &[Vec<f32>],
        x: &[f32],
        batch: usize,
    ) -> Result<(), TrainError> {
        self.batch = batch;
        let n0 = self.ops.first().map_or(0, |o| o.sizes().0);
        assert_eq!(x.len(), batch * n0, "input of {batch} samples");
        let be = &self.be;
        if !(self.params_stay && self.dev_params_current) {
            be.load_params(params, &mut self.dev_params)?;
            self.dev_params_current = self.params_stay;
        }
        if !B::ON_HOST {
            self.dev_grads.resize_with(params.len(), B::Buf::default);
            for (g, p) in self.dev_grads.iter_mut().zip(params) {
                be.resize(g, p.len())?;
            }
        }
        be.upload(x, &mut self.acts[0])?;
        let dev = &self.dev_params;
        let p = |i: usize| B::param(params, dev, i);
        for (i, (op, sc)) in self.ops.iter().zip(&mut self.scratch).enumerate() {
            let (head, tail) = self.acts.split_at_mut(i + 1);
            let (x, y) = (&head[i], &mut tail[0]);
            be.resize(y, batch * op.sizes().1)?;
            match *op {
                Op::Dense {
                    w,
                    b,
                    n_in,
                    n_out,
                    relu: r,
                } => {
                    be.matmul(
                        y,
                        (batch, n_out, n_in),
                        x,
                        Trans::No,
                        p(w),
                        Trans::Yes,
                        false,
                    )?;
                    be.add_bias(y, p(b))?;
                    if r {
                        be.relu(y)?;
                    }
                }
                Op::ConvPool { w, b, k, oc, input } => {
                    let s = Nhwc { b: batch, ..input };
                    let (rows, kkc) = (batch * s.h * s.w, k * k * s.c);
                    be.resize(&mut sc.cols, rows * kkc)?;
                    be.im2col(x, s, k, &mut sc.cols)?;
                    be.resize(&mut sc.wp, oc * kkc)?;
                    be.permute_taps(p(w), oc, s.c, k * k, true, &mut sc.wp)?;
                    be.resize(&mut sc.conv, rows * oc)?;
                    be.matmul(
                        &mut sc.conv,
                        (rows, oc, kkc),
                        &sc.cols,
                        Trans::No,
                        &sc.wp,
                        Trans::Yes,
                        false,
                    )?;
                    be.add_bias(&mut sc.conv, p(b))?;
                    be.relu(&mut sc.conv)?;
                    be.max_pool2(&sc.conv, Nhwc { c: oc, ..s }, y, &mut sc.arg)?;
                }
                Op::ToNhwc { input } => {
                    be.transpose_images(x, Nhwc { b: batch, ..input }, false, y)?
                }
                Op::ToNchw { input } => {
                    be.transpose_images(x, Nhwc { b: batch, ..input }, true, y)?
                }
            }
        }
        Ok(())
    }

    /// The last forward's logits, `[batch, classes]`, on the host.
    pub fn logits(&mut self) -> Result<&[f32], TrainError> {
        self.be
            .view(&self.acts[self.ops.len()], &mut self.logits_stage)
    }

    /// Mean cross-entropy of the last forward's logits against `labels`; sets up the
    /// backward pass.
    pub fn loss(&mut self, labels: &[u32]) -> Result<f32, TrainError> {
        assert_eq!(labels.len(), self.batch, "one label per sample");
        let be = &self.be;
        be.upload_index(labels, &mut self.labels)?;
        be.resize(&mut self.grad, self.batch * self.classes)?;
        be.softmax_cross_entropy(
            &self.acts[self.ops.len()],
            &self.labels,
            self.batch,
            self.classes,
            &mut self.grad,
        )
    }

    /// Backward through layer `i` (call from the last layer down to 0 after
    /// [`LayerEngine::loss`]): writes the gradients of its parameters into `grads` (sized as
    /// the parameters) and returns their indices. [`LayerEngine::backward_params`], then
    /// [`LayerEngine::backward_input`].
    ///
    /// # Panics
    /// If layer `i` was chosen for sufficient factors (use the two halves then).
    pub fn backward(
        &mut self,
        i: usize,
        params: &[Vec<f32>],
        grads: &mut [Vec<f32>],
    ) -> Result<Option<[usize; 2]>, TrainError> {
        let done = match self.backward_params(i, grads)? {
            Some(LayerGrads::Params(p)) => Some(p),
            Some(LayerGrads::Factors { .. }) => panic!("layer {i} leaves as factors"),
            None => None,
        };
        self.backward_input(i, params)?;
        Ok(done)
    }

    /// First half of the backward through layer `i`: the gradients of its parameters
    /// (into `grads`, on the host), or for a layer chosen by [`LayerEngine::choose_factors`]
    /// its sufficient factors, so that they can go on the wire while
    /// [`LayerEngine::backward_input`] computes the gradient of the layer's input. `None`
    /// for a layer without parameters.
    pub fn backward_params(
        &mut self,
        i: usize,
        grads: &mut [Vec<f32>],
    ) -> Result<Option<LayerGrads<'_>>, TrainError> {
        if i < self.first_param_op {
            return Ok(None);
        }
        let batch = self.batch;
        let be = &self.be;
        let (x, y) = (&self.acts[i], &self.acts[i + 1]);
        let sc = &mut self.scratch[i];
        let g = &mut self.grad;
        let dev = &mut self.dev_grads;
        match self.ops[i] {
            Op::Dense {
                w,
                b,
                n_in,
                n_out,
                relu: r,
            } => {
                if r {
                    be.relu_backward(g, y)?;
                }
                if self.factors[i] {
                    let host = |b| B::host_slice(b).expect("factors are chosen on the host only");
                    return Ok(Some(LayerGrads::Factors {
                        params: (w, b),
                        out_grad: host(g),
                        input: host(x),
                        dims: (n_in, n_out),
                    }));
                }
                be.matmul(
                    B::grad(grads, dev, w),
                    (n_out, n_in, batch),
                    g,
                    Trans::Yes,
                    x,
                    Trans::No,
                    false,
                )?;
                be.column_sums(g, B::grad(grads, dev, b))?;
            }
            Op::ConvPool { w, b, k, oc, input } => {
                let s = Nhwc { b: batch, ..input };
                let (rows, kkc) = (batch * s.h * s.w, k * k * s.c);
                be.relu_backward(g, y)?;
                // The pooled maxima are the ReLU outputs that count; `dconv` gets the
                // gradient of the convolution's output (kept for `backward_input`).
                be.resize(&mut sc.dconv, rows * oc)?;
                be.max_pool2_backward(g, &sc.arg, &mut sc.dconv, rows * oc)?;
                be.resize(&mut sc.dwp, oc * kkc)?;
                be.matmul(
                    &mut sc.dwp,
                    (oc, kkc, rows),
                    &sc.dconv,
                    Trans::Yes,
                    &sc.cols,
                    Trans::No,
                    false,
                )?;
                be.permute_taps(&sc.dwp, oc, s.c, k * k, false, B::grad(grads, dev, w))?;
                be.column_sums(&sc.dconv, B::grad(grads, dev, b))?;
            }
            Op::ToNhwc { .. } | Op::ToNchw { .. } => {}
        }
        let done = self.ops[i].params();
        if let (Some(ids), false) = (done, self.grads_stay) {
            be.grads_out(dev, grads, ids)?;
        }
        Ok(done.map(LayerGrads::Params))
    }

    /// Second half of the backward through layer `i`: the gradient of its input, which the
    /// layer before needs (skipped when no layer before has parameters).
    pub fn backward_input(&mut self, i: usize, params: &[Vec<f32>]) -> Result<(), TrainError> {
        if i <= self.first_param_op {
            return Ok(());
        }
        let batch = self.batch;
        let be = &self.be;
        let sc = &mut self.scratch[i];
        let g = &mut self.grad;
        let next = &mut self.grad_next;
        match self.ops[i] {
            Op::Dense { w, n_in, n_out, .. } => {
                be.resize(next, batch * n_in)?;
                be.matmul(
                    next,
                    (batch, n_in, n_out),
                    g,
                    Trans::No,
                    B::param(params, &self.dev_params, w),
                    Trans::No,
                    false,
                )?;
                std::mem::swap(g, next);
            }
            Op::ConvPool { k, oc, input, .. } => {
                let s = Nhwc { b: batch, ..input };
                let (rows, kkc) = (batch * s.h * s.w, k * k * s.c);
                // dcols into `cols` (no longer needed), then col2im into `g`.
                be.matmul(
                    &mut sc.cols,
                    (rows, kkc, oc),
                    &sc.dconv,
                    Trans::No,
                    &sc.wp,
                    Trans::No,
                    false,
                )?;
                be.resize(g, s.len())?;
                be.col2im(&sc.cols, s, k, g)?;
            }
            Op::ToNhwc { input } | Op::ToNchw { input } => {
                let s = Nhwc { b: batch, ..input };
                be.resize(next, s.len())?;
                // The adjoint of a transpose is the transpose back.
                let to_nchw = matches!(self.ops[i], Op::ToNhwc { .. });
                be.transpose_images(g, s, to_nchw, next)?;
                std::mem::swap(g, next);
            }
        }
        Ok(())
    }
}
