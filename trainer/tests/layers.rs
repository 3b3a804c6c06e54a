//! The layer-wise engine computes the same function and gradients as candle's autograd on
//! the candle-nn models, on every backend: the CPU, its staged twin (a device's copies), and
//! with `--features cuda` on a host with a GPU, CUDA (elsewhere that part says SKIPPED).

use candle_core::{backprop::GradStore, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use trainer::{Arch, Backend, Host, LayerEngine, Layers, Model, ModelSpec, Staged};

/// Relative difference, scaled by the larger magnitude of the two buffers.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().chain(b).fold(1e-6f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Runs `check` on every backend this build and host have.
fn on_every_backend(check: impl Fn(&dyn Fn() -> Box<dyn Engine>)) {
    check(&|| Box::new(Host::default()) as Box<dyn Engine>);
    check(&|| Box::new(Staged::default()) as Box<dyn Engine>);
    #[cfg(feature = "cuda")]
    match trainer::gpu::Cuda::open(0) {
        Ok(c) => check(&move || Box::new(c.clone()) as Box<dyn Engine>),
        Err(e) => eprintln!("SKIPPED: the CUDA backend ({e})"),
    }
}

/// A backend, type-erased for [`on_every_backend`]: builds the engine of a model on it.
trait Engine {
    fn build(
        &self,
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        names: &[&str],
    ) -> Box<dyn Run>;
}

impl<B: Backend + Clone + 'static> Engine for B {
    fn build(
        &self,
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        names: &[&str],
    ) -> Box<dyn Run> {
        Box::new(
            LayerEngine::on(self.clone(), spec, shape, classes, names)
                .unwrap()
                .expect("a sequential model"),
        )
    }
}

/// The engine's calls the tests make.
trait Run {
    fn logits(&mut self, params: &[Vec<f32>], xs: &[f32], batch: usize) -> Vec<f32>;
    fn loss(&mut self, ys: &[u32]) -> f32;
    fn len(&self) -> usize;
    fn backward(
        &mut self,
        i: usize,
        params: &[Vec<f32>],
        grads: &mut [Vec<f32>],
    ) -> Option<[usize; 2]>;
    fn device(&self) -> String;
}

impl<B: Backend> Run for LayerEngine<B> {
    fn logits(&mut self, params: &[Vec<f32>], xs: &[f32], batch: usize) -> Vec<f32> {
        self.forward(params, xs, batch).unwrap();
        LayerEngine::logits(self).unwrap().to_vec()
    }
    fn loss(&mut self, ys: &[u32]) -> f32 {
        LayerEngine::loss(self, ys).unwrap()
    }
    fn len(&self) -> usize {
        LayerEngine::len(self)
    }
    fn backward(
        &mut self,
        i: usize,
        params: &[Vec<f32>],
        grads: &mut [Vec<f32>],
    ) -> Option<[usize; 2]> {
        LayerEngine::backward(self, i, params, grads).unwrap()
    }
    fn device(&self) -> String {
        LayerEngine::device(self)
    }
}

/// A model, its layer-wise engine and a random batch, as flat buffers and as tensors.
struct Case {
    model: Model,
    params: Vec<Vec<f32>>,
    layers: Box<dyn Run>,
    xs: Vec<f32>,
    ys: Vec<u32>,
    x: Tensor,
    y: Tensor,
}

impl Case {
    /// `spec`'s model (parameters from `model_seed`) for `shape` inputs and `classes`, and
    /// `batch` samples drawn from `data_seed`.
    fn new(
        be: &dyn Engine,
        spec: &ModelSpec,
        (shape, classes, batch): ([usize; 3], usize, usize),
        model_seed: u64,
        data_seed: u64,
    ) -> Case {
        let model = Model::new(spec, shape, classes, model_seed).unwrap();
        let params = model.values().unwrap();
        let names: Vec<&str> = model.params().iter().map(|(n, _)| n.as_str()).collect();
        let layers = be.build(spec, shape, classes, &names);
        let mut rng = StdRng::seed_from_u64(data_seed);
        let dim: usize = shape.iter().product();
        let xs: Vec<f32> = (0..batch * dim).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let ys: Vec<u32> = (0..batch)
            .map(|_| rng.gen_range(0..classes as u32))
            .collect();
        let x =
            Tensor::from_slice(&xs, (batch, shape[0], shape[1], shape[2]), &Device::Cpu).unwrap();
        let y = Tensor::from_slice(&ys, batch, &Device::Cpu).unwrap();
        Case {
            model,
            params,
            layers,
            xs,
            ys,
            x,
            y,
        }
    }
}

fn check(be: &dyn Engine, spec: ModelSpec, shape: [usize; 3], classes: usize, batch: usize) {
    let Case {
        model,
        params,
        mut layers,
        xs,
        ys,
        x,
        y,
    } = Case::new(be, &spec, (shape, classes, batch), 7, 3);
    let on = layers.device();

    // candle: forward, cross-entropy, one backward().
    let logits = model.forward(&x).unwrap();
    let loss = candle_nn::loss::cross_entropy(&logits, &y).unwrap();
    let grads = loss.backward().unwrap();

    // Layer-wise.
    let ours = layers.logits(&params, &xs, batch);
    let want = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert!(
        rel_diff(&ours, &want) < 1e-5,
        "{on}: logits differ: {}",
        rel_diff(&ours, &want)
    );
    let our_loss = layers.loss(&ys);
    let want_loss = loss.to_scalar::<f32>().unwrap();
    assert!(
        (our_loss - want_loss).abs() < 1e-5 * want_loss.abs().max(1.0),
        "{on}: {our_loss} vs {want_loss}"
    );
    let mut ours: Vec<Vec<f32>> = params.iter().map(|p| vec![f32::NAN; p.len()]).collect();
    let mut written = vec![false; params.len()];
    for i in (0..layers.len()).rev() {
        for p in layers.backward(i, &params, &mut ours).into_iter().flatten() {
            assert!(!written[p], "parameter {p} written twice");
            written[p] = true;
        }
    }
    assert!(
        written.iter().all(|w| *w),
        "every parameter gets a gradient"
    );
    assert_grads_match(&model, &grads, &ours, &format!("{on} mlp"));
}

/// Every parameter's gradient in `ours` equals candle's in `want` to 1e-4 (relative).
fn assert_grads_match(model: &Model, want: &GradStore, ours: &[Vec<f32>], label: &str) {
    for ((name, var), g) in model.params().iter().zip(ours) {
        let w = want
            .get(var.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let d = rel_diff(g, &w);
        assert!(d < 1e-4, "{label} {name}: gradient differs by {d}");
    }
}

#[test]
fn mlp_matches_candle_autograd() {
    let spec = ModelSpec {
        arch: Arch::Mlp,
        hidden: vec![33, 17],
        ..ModelSpec::default()
    };
    on_every_backend(|be| check(&*be(), spec.clone(), [1, 8, 8], 10, 5));
}

/// The CNN, written with candle ops whose autograd is right: like [`trainer::Cnn`] but
/// pooling by a reshape and two `max` reductions. (candle 0.11's `max_pool2d` backward
/// multiplies the gradient by the window's share of maxima, ¼ for a unique maximum,
/// where it should divide by their number, so the convolution gradients it gives are a
/// quarter per pooling of the true ones; for odd sizes it also upsamples the gradient onto
/// the wrong pixels.)
fn reference_cnn(model: &Model, x: &Tensor, k: usize) -> Tensor {
    let p = |name: &str| {
        model
            .params()
            .iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
            .as_tensor()
            .clone()
    };
    let conv = |x: &Tensor, l: &str| {
        let b = p(&format!("{l}.bias"));
        x.conv2d(&p(&format!("{l}.weight")), k / 2, 1, 1, 1)
            .unwrap()
            .broadcast_add(&b.reshape((1, b.dim(0).unwrap(), 1, 1)).unwrap())
            .unwrap()
    };
    let pool = |x: &Tensor| {
        let (b, c, h, w) = x.dims4().unwrap();
        x.narrow(2, 0, h / 2 * 2)
            .unwrap()
            .narrow(3, 0, w / 2 * 2)
            .unwrap()
            .reshape((b, c, h / 2, 2, w / 2, 2))
            .unwrap()
            .max(5)
            .unwrap()
            .max(3)
            .unwrap()
    };
    let dense = |x: &Tensor, l: &str| {
        x.matmul(&p(&format!("{l}.weight")).t().unwrap())
            .unwrap()
            .broadcast_add(&p(&format!("{l}.bias")))
            .unwrap()
    };
    let h = pool(&conv(x, "conv1").relu().unwrap());
    let h = pool(&conv(&h, "conv2").relu().unwrap());
    let h = dense(&h.flatten_from(1).unwrap(), "fc1").relu().unwrap();
    dense(&h, "fc2")
}

/// The CNN's forward agrees with candle-nn's, and its gradients with candle's autograd of
/// [`reference_cnn`].
fn check_cnn(be: &dyn Engine, spec: &ModelSpec, shape: [usize; 3], classes: usize, batch: usize) {
    let Case {
        model,
        params,
        mut layers,
        xs,
        ys,
        x,
        y,
    } = Case::new(be, spec, (shape, classes, batch), 11, 5);
    let on = layers.device();
    let logits = model.forward(&x).unwrap();
    let want = logits.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let reference = reference_cnn(&model, &x, spec.kernel);
    let d = rel_diff(
        &reference.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        &want,
    );
    assert!(
        d < 1e-5,
        "{shape:?}: the reference differs from candle-nn's forward by {d}"
    );
    let d = rel_diff(&layers.logits(&params, &xs, batch), &want);
    assert!(d < 1e-5, "{on} {shape:?}: logits differ by {d}");
    let loss = candle_nn::loss::cross_entropy(&reference, &y).unwrap();
    let ours = layers.loss(&ys);
    assert!((ours - loss.to_scalar::<f32>().unwrap()).abs() < 1e-5);
    let want = loss.backward().unwrap();
    let mut grads: Vec<Vec<f32>> = params.iter().map(|p| vec![f32::NAN; p.len()]).collect();
    for i in (0..layers.len()).rev() {
        layers.backward(i, &params, &mut grads);
    }
    assert_grads_match(&model, &want, &grads, &format!("{on} {shape:?}"));
}

#[test]
fn cnn_matches_candle_forward_and_autograd_gradients() {
    let spec = ModelSpec {
        arch: Arch::Cnn,
        channels: vec![4, 6],
        kernel: 3,
        fc: 12,
        ..ModelSpec::default()
    };
    on_every_backend(|be| {
        let be = &*be();
        check_cnn(be, &spec, [1, 8, 8], 10, 4);
        check_cnn(be, &spec, [1, 12, 8], 5, 3);
        check_cnn(be, &spec, [3, 8, 8], 5, 3);
        // Odd sizes: pooling drops the last row or column.
        check_cnn(be, &spec, [2, 10, 9], 4, 3);
        let wide = ModelSpec {
            kernel: 5,
            ..spec.clone()
        };
        check_cnn(be, &wide, [2, 12, 12], 4, 2);
    });
}

#[test]
fn the_transformer_has_no_layer_wise_engine() {
    let spec = ModelSpec {
        arch: Arch::Transformer,
        d_model: 16,
        layers: 1,
        heads: 2,
        seq_len: 8,
        ..ModelSpec::default()
    };
    let model = Model::new(&spec, [1, 1, 8], 128, 1).unwrap();
    let names: Vec<&str> = model.params().iter().map(|(n, _)| n.as_str()).collect();
    assert!(Layers::for_model(&spec, [1, 1, 8], 128, &names)
        .unwrap()
        .is_none());
}
