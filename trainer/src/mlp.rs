//! Multi-layer perceptron.

use candle_core::{Module, Tensor};
use candle_nn::{linear, Linear, VarBuilder};

/// Dense layers with ReLU between them; the input is flattened.
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    /// `input → hidden[0] → … → classes`, parameters named `fc{i}.weight` / `fc{i}.bias`.
    pub fn new(
        input: usize,
        hidden: &[usize],
        classes: usize,
        vb: VarBuilder<'_>,
    ) -> candle_core::Result<Self> {
        let mut dims = vec![input];
        dims.extend_from_slice(hidden);
        dims.push(classes);
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, w)| linear(w[0], w[1], vb.pp(format!("fc{i}"))))
            .collect::<candle_core::Result<_>>()?;
        Ok(Mlp { layers })
    }

    /// Logits `[b, classes]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut h = x.flatten_from(1)?;
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}
