//! LeNet-like convolutional network.

use candle_core::{Module, Tensor};
use candle_nn::{conv2d, linear, Conv2d, Conv2dConfig, Linear, VarBuilder};

/// Two stages of (conv k×k "same", ReLU, 2×2 max-pool), a dense hidden layer, the output.
/// Works for 8×8 (digits: 8 → 4 → 2) and 28×28 (28 → 14 → 7) inputs.
///
/// This defines the function and the parameters; training differentiates it layer by layer
/// ([`crate::Layers`]), not through candle's autograd, whose `max_pool2d` backward (candle
/// 0.11) scales the gradient by ¼.
#[derive(Debug)]
pub struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
}

impl Cnn {
    /// A CNN for `[c, h, w]` inputs; `h` and `w` must be at least 4.
    pub fn new(
        shape: [usize; 3],
        channels: [usize; 2],
        kernel: usize,
        fc: usize,
        classes: usize,
        vb: VarBuilder<'_>,
    ) -> candle_core::Result<Self> {
        let cfg = Conv2dConfig {
            padding: kernel / 2,
            ..Default::default()
        };
        let conv1 = conv2d(shape[0], channels[0], kernel, cfg, vb.pp("conv1"))?;
        let conv2 = conv2d(channels[0], channels[1], kernel, cfg, vb.pp("conv2"))?;
        let flat = channels[1] * (shape[1] / 4) * (shape[2] / 4);
        let fc1 = linear(flat, fc, vb.pp("fc1"))?;
        let fc2 = linear(fc, classes, vb.pp("fc2"))?;
        Ok(Cnn {
            conv1,
            conv2,
            fc1,
            fc2,
        })
    }

    /// Logits `[b, classes]` for `[b, c, h, w]` inputs.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.conv1.forward(x)?.relu()?.max_pool2d(2)?;
        let h = self.conv2.forward(&h)?.relu()?.max_pool2d(2)?;
        let h = self.fc1.forward(&h.flatten_from(1)?)?.relu()?;
        self.fc2.forward(&h)
    }
}
