//! SGD with momentum and AdamW over flat `f32` parameter buffers, with state that saves and
//! restores exactly.
//!
//! Written here rather than taken from candle-nn so that the state is inspectable, the update
//! runs on the unpacked allreduce output directly, and every rank computes the same bits.

use crate::error::TrainError;
use crate::spec::{OptimizerKind, TrainParams};

/// What an update computes with, besides the state: see [`Optimizer::update`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Coefficients {
    pub kind: OptimizerKind,
    pub momentum: f32,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// AdamW's bias corrections `1 − β₁ᵗ` and `1 − β₂ᵗ` of the current update.
    pub c1: f32,
    pub c2: f32,
}

/// The optimizer and its per-parameter state.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    kind: OptimizerKind,
    momentum: f32,
    weight_decay: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    /// Updates applied (AdamW's bias correction uses it).
    t: u64,
    /// SGD: one momentum buffer per parameter. AdamW: first moments.
    m: Vec<Vec<f32>>,
    /// AdamW: second moments (empty for SGD).
    v: Vec<Vec<f32>>,
}

impl Optimizer {
    /// An optimizer for parameters of the given sizes.
    pub fn new(p: &TrainParams, sizes: &[usize]) -> Self {
        let zeros = || sizes.iter().map(|&n| vec![0.0f32; n]).collect::<Vec<_>>();
        Optimizer {
            kind: p.optimizer,
            momentum: p.momentum as f32,
            weight_decay: p.weight_decay as f32,
            beta1: p.beta1 as f32,
            beta2: p.beta2 as f32,
            eps: p.eps as f32,
            t: 0,
            m: zeros(),
            v: if p.optimizer == OptimizerKind::Adamw {
                zeros()
            } else {
                Vec::new()
            },
        }
    }

    /// Applies one update with learning rate `lr` to `params` given (averaged) `grads`:
    /// [`Optimizer::begin_step`], then [`Optimizer::update`] for every parameter.
    pub fn step(&mut self, params: &mut [Vec<f32>], grads: &[Vec<f32>], lr: f32) {
        assert_eq!(
            params.len(),
            self.m.len(),
            "optimizer built for other parameters"
        );
        assert_eq!(params.len(), grads.len());
        self.begin_step();
        for (i, (p, g)) in params.iter_mut().zip(grads).enumerate() {
            self.update(i, p, g, lr);
        }
    }

    /// Starts an update (counts it, for AdamW's bias correction).
    pub fn begin_step(&mut self) {
        self.t += 1;
    }

    /// Takes back a [`Optimizer::begin_step`] whose update changed no parameter (a step
    /// aborted before any averaged gradient arrived).
    pub fn cancel_step(&mut self) {
        self.t = self.t.saturating_sub(1);
    }

    /// Updates parameter `i` (`p`, with averaged gradient `g`) with learning rate `lr`,
    /// within the update begun by [`Optimizer::begin_step`]. Parameters are independent, so
    /// they may be updated in any order, each as soon as its gradient is in.
    ///
    /// SGD (PyTorch semantics): `b = μ·b + (g + λ·p)`, `p -= lr·b`.
    /// AdamW: `m = β₁m + (1−β₁)g`, `v = β₂v + (1−β₂)g²`, `p -= lr·(m̂/(√v̂+ε) + λ·p)`.
    ///
    /// # Panics
    /// If `i`, `p` or `g` do not match the parameters the optimizer was built for.
    pub fn update(&mut self, i: usize, p: &mut [f32], g: &[f32], lr: f32) {
        assert!(
            p.len() == self.m[i].len() && g.len() == p.len(),
            "optimizer built for other parameters"
        );
        match self.kind {
            OptimizerKind::Sgd => {
                let (mu, wd) = (self.momentum, self.weight_decay);
                for ((p, &g), b) in p.iter_mut().zip(g).zip(self.m[i].iter_mut()) {
                    *b = mu * *b + (g + wd * *p);
                    *p -= lr * *b;
                }
            }
            OptimizerKind::Adamw => {
                let (b1, b2, eps, wd) = (self.beta1, self.beta2, self.eps, self.weight_decay);
                let Coefficients { c1, c2, .. } = self.coefficients();
                for (((p, &g), m), v) in p
                    .iter_mut()
                    .zip(g)
                    .zip(self.m[i].iter_mut())
                    .zip(self.v[i].iter_mut())
                {
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    let update = (*m / c1) / ((*v / c2).sqrt() + eps);
                    *p -= lr * (update + wd * *p);
                }
            }
        }
    }

    /// Updates applied so far.
    pub fn steps_taken(&self) -> u64 {
        self.t
    }

    /// The numbers of the current update (after [`Optimizer::begin_step`]) for an optimizer
    /// that runs elsewhere with this one's state (the device's: `crate::gpu`).
    pub(crate) fn coefficients(&self) -> Coefficients {
        let t = self.t.min(i32::MAX as u64) as i32;
        Coefficients {
            kind: self.kind,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            c1: 1.0 - self.beta1.powi(t),
            c2: 1.0 - self.beta2.powi(t),
        }
    }

    /// The state buffers, for an optimizer elsewhere to read into and write back: SGD's
    /// momentum or AdamW's first moments, and AdamW's second moments (empty for SGD).
    #[cfg(any(feature = "cuda", test))]
    pub(crate) fn buffers_mut(&mut self) -> (&mut [Vec<f32>], &mut [Vec<f32>]) {
        (&mut self.m, &mut self.v)
    }

    /// The state as named buffers: `(suffix, buffers in parameter order)`: `momentum` for SGD,
    /// `exp_avg` and `exp_avg_sq` for AdamW.
    pub fn state(&self) -> Vec<(&'static str, &[Vec<f32>])> {
        match self.kind {
            OptimizerKind::Sgd => vec![("momentum", &self.m[..])],
            OptimizerKind::Adamw => vec![("exp_avg", &self.m[..]), ("exp_avg_sq", &self.v[..])],
        }
    }

    /// Restores the state written by [`Optimizer::state`] (same suffixes, sizes and order).
    pub fn restore(
        &mut self,
        t: u64,
        buffers: Vec<(String, Vec<Vec<f32>>)>,
    ) -> Result<(), TrainError> {
        let mut m = None;
        let mut v = None;
        for (suffix, bufs) in buffers {
            match (self.kind, suffix.as_str()) {
                (OptimizerKind::Sgd, "momentum") | (OptimizerKind::Adamw, "exp_avg") => {
                    m = Some(bufs)
                }
                (OptimizerKind::Adamw, "exp_avg_sq") => v = Some(bufs),
                (k, s) => {
                    return Err(TrainError::StateMismatch(format!(
                        "optimizer {k:?} has no state {s:?}"
                    )))
                }
            }
        }
        let same = |a: &[Vec<f32>], b: &[Vec<f32>]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len())
        };
        let m = m.ok_or_else(|| TrainError::StateMismatch("optimizer state missing".into()))?;
        if !same(&m, &self.m) {
            return Err(TrainError::StateMismatch(
                "optimizer state sizes differ".into(),
            ));
        }
        if self.kind == OptimizerKind::Adamw {
            let v = v.ok_or_else(|| TrainError::StateMismatch("exp_avg_sq missing".into()))?;
            if !same(&v, &self.v) {
                return Err(TrainError::StateMismatch(
                    "optimizer state sizes differ".into(),
                ));
            }
            self.v = v;
        }
        self.m = m;
        self.t = t;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sgd_matches_hand_computation() {
        let p = TrainParams {
            momentum: 0.5,
            weight_decay: 0.1,
            ..TrainParams::default()
        };
        let mut opt = Optimizer::new(&p, &[1]);
        let mut params = vec![vec![1.0f32]];
        opt.step(&mut params, &[vec![2.0]], 0.1);
        // b = 2 + 0.1 = 2.1; p = 1 - 0.21
        assert!((params[0][0] - 0.79).abs() < 1e-6);
        opt.step(&mut params, &[vec![2.0]], 0.1);
        // b = 0.5·2.1 + 2 + 0.079 = 3.129; p = 0.79 - 0.3129
        assert!((params[0][0] - 0.4771).abs() < 1e-6);
    }

    #[test]
    fn adamw_first_step_moves_by_lr_and_state_round_trips() {
        let p = TrainParams {
            optimizer: OptimizerKind::Adamw,
            ..TrainParams::default()
        };
        let mut opt = Optimizer::new(&p, &[2]);
        let mut params = vec![vec![0.0f32, 0.0]];
        opt.step(&mut params, &[vec![3.0, -0.5]], 0.01);
        assert!((params[0][0] + 0.01).abs() < 1e-6 && (params[0][1] - 0.01).abs() < 1e-6);
        let saved: Vec<(String, Vec<Vec<f32>>)> = opt
            .state()
            .into_iter()
            .map(|(s, b)| (s.to_string(), b.to_vec()))
            .collect();
        let mut other = Optimizer::new(&p, &[2]);
        other.restore(opt.steps_taken(), saved).unwrap();
        assert_eq!(other, opt);
    }
}
