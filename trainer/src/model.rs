//! A model chosen by the spec's `[model]` table, its parameters in a fixed order, and a
//! deterministic initialisation.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cnn::Cnn;
use crate::error::TrainError;
use crate::mlp::Mlp;
use crate::spec::{Arch, ModelSpec};
use crate::transformer::CharTransformer;

#[derive(Debug)]
enum Net {
    Mlp(Mlp),
    Cnn(Cnn),
    Transformer(CharTransformer),
}

/// A model and its parameters.
///
/// Invariant: `params` are sorted by name; that order is the order of gradients in every
/// allreduce and of tensors in every checkpoint, so all ranks agree on it.
pub struct Model {
    net: Net,
    params: Vec<(String, Var)>,
    _varmap: VarMap,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("net", &self.net)
            .field("params", &self.params.len())
            .finish()
    }
}

impl Model {
    /// Builds the model of `spec` for inputs of `shape` and `classes` outputs, with
    /// parameters drawn from `seed` (the same on every rank and every run).
    pub fn new(
        spec: &ModelSpec,
        shape: [usize; 3],
        classes: usize,
        seed: u64,
    ) -> Result<Self, TrainError> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let net = match spec.arch {
            Arch::Mlp => Net::Mlp(Mlp::new(shape.iter().product(), &spec.hidden, classes, vb)?),
            Arch::Cnn => {
                if shape[1] < 4 || shape[2] < 4 {
                    return Err(TrainError::Spec(format!(
                        "cnn needs inputs of at least 4×4, got {shape:?}"
                    )));
                }
                Net::Cnn(Cnn::new(
                    shape,
                    [spec.channels[0], spec.channels[1]],
                    spec.kernel,
                    spec.fc,
                    classes,
                    vb,
                )?)
            }
            Arch::Transformer => Net::Transformer(CharTransformer::new(
                classes,
                spec.d_model,
                spec.layers,
                spec.heads,
                spec.seq_len,
                vb,
            )?),
        };
        let mut params: Vec<(String, Var)> = varmap
            .data()
            .lock()
            .expect("varmap lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let model = Model {
            net,
            params,
            _varmap: varmap,
        };
        model.init(seed)?;
        Ok(model)
    }

    /// Overwrites every parameter from `seed` (candle's own initialisers use an unseeded
    /// RNG): norm scales 1, biases and norm shifts 0, embeddings uniform with std 0.02,
    /// other weights uniform with variance 1/fan-in.
    fn init(&self, seed: u64) -> Result<(), TrainError> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x1417_1a11);
        for (name, var) in &self.params {
            let dims = var.dims().to_vec();
            let n: usize = dims.iter().product();
            let values: Vec<f32> = if name.ends_with("gamma") {
                vec![1.0; n]
            } else if name.ends_with("bias") || name.ends_with("beta") {
                vec![0.0; n]
            } else {
                let bound = if name.contains("emb") {
                    0.02 * 3f32.sqrt()
                } else {
                    let fan_in: usize = dims[1..].iter().product::<usize>().max(1);
                    (3.0 / fan_in as f32).sqrt()
                };
                (0..n).map(|_| rng.gen_range(-bound..bound)).collect()
            };
            var.set(&Tensor::from_vec(values, dims, &Device::Cpu)?)?;
        }
        Ok(())
    }

    /// Logits `[predictions, classes]` for a batch's inputs.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, TrainError> {
        Ok(match &self.net {
            Net::Mlp(m) => m.forward(x)?,
            Net::Cnn(m) => m.forward(x)?,
            Net::Transformer(m) => m.forward(x)?,
        })
    }

    /// Parameters (name, variable), sorted by name.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// Total number of scalar parameters.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// Copies every parameter out, in parameter order.
    pub fn values(&self) -> Result<Vec<Vec<f32>>, TrainError> {
        self.params
            .iter()
            .map(|(_, v)| Ok(v.as_tensor().flatten_all()?.to_vec1::<f32>()?))
            .collect()
    }

    /// Sets every parameter from flat values in parameter order.
    pub fn set_values(&self, values: &[Vec<f32>]) -> Result<(), TrainError> {
        if values.len() != self.params.len() {
            return Err(TrainError::StateMismatch(format!(
                "{} tensors for {} parameters",
                values.len(),
                self.params.len()
            )));
        }
        for ((name, var), v) in self.params.iter().zip(values) {
            if v.len() != var.elem_count() {
                return Err(TrainError::StateMismatch(format!(
                    "{name}: {} values for {:?}",
                    v.len(),
                    var.dims()
                )));
            }
            var.set(&Tensor::from_slice(v, var.dims(), &Device::Cpu)?)?;
        }
        Ok(())
    }
}
