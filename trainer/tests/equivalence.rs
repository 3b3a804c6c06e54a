//! N workers with batch b follow one worker with batch N·b; fixed seed and world size give
//! bit-identical runs.

mod common;

use common::{max_diff, train_params};
use trainer::{Arch, DataSpec, ModelSpec, OptimizerKind, TrainParams, TrainSpec};

const STEPS: u64 = 15;

fn spec(arch: Arch, optimizer: OptimizerKind, batch: usize, lr: f64) -> TrainSpec {
    TrainSpec {
        model: ModelSpec {
            arch,
            hidden: vec![64, 32],
            channels: vec![4, 8],
            fc: 32,
            ..ModelSpec::default()
        },
        data: DataSpec::default(),
        train: TrainParams {
            epochs: 1,
            max_steps: Some(STEPS),
            batch_per_worker: batch,
            optimizer,
            lr,
            warmup_epochs: 0.0,
            weight_decay: 1e-4,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    }
}

fn check(arch: Arch, optimizer: OptimizerKind, lr: f64) {
    let world = 3;
    let b = 8;
    // Linear scaling: N workers at `lr` peak at N·lr, which the single worker gets directly.
    let multi = train_params(&spec(arch, optimizer, b, lr), world, STEPS);
    let single = train_params(
        &spec(arch, optimizer, world * b, lr * world as f64),
        1,
        STEPS,
    );
    for r in 1..world {
        assert_eq!(
            multi[0], multi[r],
            "rank {r} diverged from rank 0 (must be bit-identical)"
        );
    }
    let (d, m) = max_diff(&multi[0], &single[0]);
    assert!(
        m > 0.0 && d <= 1e-4 * m.max(1.0),
        "{arch:?}/{optimizer:?}: max |Δ| = {d} (max |p| = {m})"
    );
    let init = train_params(&spec(arch, optimizer, b, lr), 1, 0);
    let (moved, _) = max_diff(&init[0], &single[0]);
    assert!(
        moved > 1e-3,
        "training must move the parameters (moved {moved})"
    );
}

#[test]
fn mlp_sgd_three_workers_equal_one_with_triple_batch() {
    check(Arch::Mlp, OptimizerKind::Sgd, 0.05);
}

#[test]
fn cnn_adamw_three_workers_equal_one_with_triple_batch() {
    check(Arch::Cnn, OptimizerKind::Adamw, 0.002);
}

#[test]
fn same_seed_and_world_is_bit_identical_and_another_seed_is_not() {
    let s = spec(Arch::Mlp, OptimizerKind::Sgd, 8, 0.05);
    let a = train_params(&s, 2, 10);
    let b = train_params(&s, 2, 10);
    assert_eq!(a, b);
    let mut other = s.clone();
    other.train.seed += 1;
    assert_ne!(train_params(&other, 2, 10)[0], a[0]);
}
