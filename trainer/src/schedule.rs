//! Learning-rate schedule: linear scaling with the world size, linear warm-up, then cosine or
//! step decay (Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour").

use crate::spec::{DecayKind, LrScaling, TrainParams};

/// The learning rate as a pure function of the step.
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    base: f64,
    peak: f64,
    warmup_steps: u64,
    total_steps: u64,
    steps_per_epoch: u64,
    decay: DecayKind,
    step_epochs: u64,
    step_gamma: f64,
}

impl LrSchedule {
    /// The schedule for `world` workers, `steps_per_epoch` global steps per epoch and
    /// `total_steps` steps in all.
    ///
    /// With linear scaling the warm-up goes from `lr` (the one-worker rate) to `lr × world`,
    /// as Goyal et al.'s gradual warm-up; with one worker (or no scaling) it goes from
    /// `lr / warmup_steps` to `lr`, a plain linear warm-up.
    pub fn new(p: &TrainParams, world: usize, steps_per_epoch: u64, total_steps: u64) -> Self {
        let peak = match p.lr_scaling {
            LrScaling::Linear => p.lr * world as f64,
            LrScaling::None => p.lr,
        };
        let warmup_steps = (p.warmup_epochs * steps_per_epoch as f64).round() as u64;
        let base = if peak > p.lr {
            p.lr
        } else {
            peak / warmup_steps.max(1) as f64
        };
        LrSchedule {
            base,
            peak,
            warmup_steps,
            total_steps: total_steps.max(1),
            steps_per_epoch: steps_per_epoch.max(1),
            decay: p.decay,
            step_epochs: p.step_epochs.max(1),
            step_gamma: p.step_gamma,
        }
    }

    /// The rate for the update that follows `step` updates.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            let f = step as f64 / self.warmup_steps as f64;
            return self.base + (self.peak - self.base) * f;
        }
        match self.decay {
            DecayKind::Constant => self.peak,
            DecayKind::Cosine => {
                let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
                let f = ((step - self.warmup_steps) as f64 / span).min(1.0);
                0.5 * self.peak * (1.0 + (std::f64::consts::PI * f).cos())
            }
            DecayKind::Step => {
                let epoch = step / self.steps_per_epoch;
                self.peak
                    * self
                        .step_gamma
                        .powi((epoch / self.step_epochs).min(i32::MAX as u64) as i32)
            }
        }
    }

    /// The peak rate (after warm-up).
    pub fn peak(&self) -> f64 {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_scales_with_world_then_cosine_reaches_zero() {
        let p = TrainParams {
            lr: 0.1,
            warmup_epochs: 1.0,
            ..TrainParams::default()
        };
        let s = LrSchedule::new(&p, 4, 10, 110);
        assert!((s.lr(0) - 0.1).abs() < 1e-12);
        assert!((s.lr(5) - 0.25).abs() < 1e-12);
        assert!((s.lr(10) - 0.4).abs() < 1e-12);
        assert!(s.lr(60) < 0.4 && s.lr(60) > 0.0);
        assert!(s.lr(110).abs() < 1e-12);
    }

    #[test]
    fn step_decay_and_single_worker_warmup() {
        let p = TrainParams {
            lr: 1.0,
            warmup_epochs: 0.0,
            decay: DecayKind::Step,
            step_epochs: 2,
            step_gamma: 0.5,
            ..TrainParams::default()
        };
        let s = LrSchedule::new(&p, 1, 10, 100);
        assert_eq!(
            (s.lr(0), s.lr(19), s.lr(20), s.lr(45)),
            (1.0, 1.0, 0.5, 0.25)
        );
        let q = TrainParams {
            lr: 1.0,
            warmup_epochs: 1.0,
            ..TrainParams::default()
        };
        let s = LrSchedule::new(&q, 1, 4, 100);
        assert_eq!(s.lr(0), 0.25);
    }
}
