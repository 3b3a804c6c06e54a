//! The character transformer learns the project's text, and follows the data-parallel
//! equivalence like the other models.

mod common;

use common::{max_diff, on_group, train_params};
use trainer::{
    Arch, DataSpec, ModelSpec, OptimizerKind, TrainError, TrainParams, TrainSpec, Trainer,
};

fn lm(batch: usize, lr: f64, steps: u64, optimizer: OptimizerKind) -> TrainSpec {
    TrainSpec {
        model: ModelSpec {
            arch: Arch::Transformer,
            d_model: 32,
            layers: 1,
            heads: 2,
            seq_len: 16,
            ..ModelSpec::default()
        },
        data: DataSpec {
            dataset: "text".into(),
            ..DataSpec::default()
        },
        train: TrainParams {
            epochs: 1,
            max_steps: Some(steps),
            batch_per_worker: batch,
            optimizer,
            lr,
            warmup_epochs: 0.0,
            decay: trainer::DecayKind::Constant,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    }
}

#[test]
fn transformer_loss_falls_on_project_text() {
    let spec = lm(16, 0.01, 40, OptimizerKind::Adamw);
    let out = on_group(1, move |c| {
        let spec = spec.clone();
        async move {
            let mut t = Trainer::new(&spec, c)?;
            let before = t.evaluate()?;
            for _ in 0..40 {
                t.step().await?;
            }
            let after = t.evaluate()?;
            Ok::<_, TrainError>((before, after))
        }
    });
    let (before, after) = out[0].as_ref().unwrap();
    // Uniform guessing over 128 characters is ln 128 ≈ 4.85 nats.
    assert!(before.val_loss > 4.0, "initial loss {}", before.val_loss);
    assert!(
        after.val_loss < 3.3,
        "loss after 40 steps {} (from {})",
        after.val_loss,
        before.val_loss
    );
    assert!(
        after.val_accuracy > 0.15,
        "next-char accuracy {}",
        after.val_accuracy
    );
}

#[test]
fn transformer_two_workers_equal_one_with_double_batch() {
    // SGD: Adam's normalisation turns float noise in near-zero gradients into lr-sized
    // steps, so its equivalence is checked on the CNN, where gradients are not that sparse.
    let multi = train_params(&lm(4, 0.1, 5, OptimizerKind::Sgd), 2, 5);
    let single = train_params(&lm(8, 0.2, 5, OptimizerKind::Sgd), 1, 5);
    assert_eq!(multi[0], multi[1]);
    let (d, m) = max_diff(&multi[0], &single[0]);
    assert!(d <= 1e-4 * m.max(1.0), "max |Δ| = {d}");
}
