//! Small character-level transformer language model.

use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{embedding, linear, Embedding, Linear, VarBuilder};

/// Layer norm from differentiable primitives (candle-nn's fused kernel has no backward).
#[derive(Debug)]
struct Norm {
    gamma: Tensor,
    beta: Tensor,
}

impl Norm {
    fn new(d: usize, vb: VarBuilder<'_>) -> candle_core::Result<Self> {
        Ok(Norm {
            gamma: vb.get_with_hints(d, "gamma", candle_nn::Init::Const(1.0))?,
            beta: vb.get_with_hints(d, "beta", candle_nn::Init::Const(0.0))?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mean)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let xn = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
        xn.broadcast_mul(&self.gamma)?.broadcast_add(&self.beta)
    }
}

#[derive(Debug)]
struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc1: Linear,
    fc2: Linear,
}

/// Pre-norm causal transformer over characters: token and learned position embeddings,
/// `layers` blocks of (multi-head self-attention, 4× GELU MLP), final norm, vocabulary head.
#[derive(Debug)]
pub struct CharTransformer {
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Linear,
    heads: usize,
    mask: Tensor,
}

impl CharTransformer {
    /// A model with `vocab` characters and context `seq_len`.
    pub fn new(
        vocab: usize,
        d_model: usize,
        layers: usize,
        heads: usize,
        seq_len: usize,
        vb: VarBuilder<'_>,
    ) -> candle_core::Result<Self> {
        let blocks = (0..layers)
            .map(|i| {
                let vb = vb.pp(format!("block{i}"));
                Ok(Block {
                    ln1: Norm::new(d_model, vb.pp("ln1"))?,
                    qkv: linear(d_model, 3 * d_model, vb.pp("qkv"))?,
                    proj: linear(d_model, d_model, vb.pp("proj"))?,
                    ln2: Norm::new(d_model, vb.pp("ln2"))?,
                    fc1: linear(d_model, 4 * d_model, vb.pp("fc1"))?,
                    fc2: linear(4 * d_model, d_model, vb.pp("fc2"))?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        // Additive causal mask: 0 on and below the diagonal, a large negative above.
        let mask: Vec<f32> = (0..seq_len)
            .flat_map(|i| (0..seq_len).map(move |j| if j > i { -1e9 } else { 0.0 }))
            .collect();
        Ok(CharTransformer {
            tok: embedding(vocab, d_model, vb.pp("tok_emb"))?,
            pos: embedding(seq_len, d_model, vb.pp("pos_emb"))?,
            blocks,
            ln_f: Norm::new(d_model, vb.pp("ln_f"))?,
            head: linear(d_model, vocab, vb.pp("head"))?,
            heads,
            mask: Tensor::from_vec(mask, (seq_len, seq_len), &Device::Cpu)?,
        })
    }

    /// Logits `[b · t, vocab]` for token ids `[b, t]` (`t` ≤ the context length).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = x.dims2()?;
        let positions = Tensor::arange(0u32, t as u32, x.device())?;
        let mut h = self
            .tok
            .forward(x)?
            .broadcast_add(&self.pos.forward(&positions)?)?;
        let d = h.dim(2)?;
        let hd = d / self.heads;
        let mask = self
            .mask
            .narrow(0, 0, t)?
            .narrow(1, 0, t)?
            .to_dtype(DType::F32)?;
        for blk in &self.blocks {
            let qkv = blk.qkv.forward(&blk.ln1.forward(&h)?)?;
            let split = |i: usize| -> candle_core::Result<Tensor> {
                qkv.narrow(2, i * d, d)?
                    .reshape((b, t, self.heads, hd))?
                    .transpose(1, 2)?
                    .contiguous()
            };
            let (q, k, v) = (split(0)?, split(1)?, split(2)?);
            let att = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
            let att = candle_nn::ops::softmax(&att.broadcast_add(&mask)?, D::Minus1)?;
            let y = att
                .matmul(&v)?
                .transpose(1, 2)?
                .contiguous()?
                .reshape((b, t, d))?;
            h = (h + blk.proj.forward(&y)?)?;
            let m = blk
                .fc2
                .forward(&blk.fc1.forward(&blk.ln2.forward(&h)?)?.gelu()?)?;
            h = (h + m)?;
        }
        let logits = self.head.forward(&self.ln_f.forward(&h)?)?;
        logits.reshape((b * t, ()))
    }
}
