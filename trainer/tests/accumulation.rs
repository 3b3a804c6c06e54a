//! Gradient accumulation (`Trainer::set_accumulation`), what a ring shrunk by a preemption
//! uses to keep its global batch: W/2 workers accumulating 2 micro-batches per step follow
//! W workers, to float tolerance, with the same learning rate and samples per step.

mod common;

use common::{max_diff, on_group};
use trainer::{
    Arch, DataSpec, ModelSpec, OptimizerKind, TrainError, TrainParams, TrainSpec, Trainer,
};

const STEPS: u64 = 12;

fn spec(arch: Arch, optimizer: OptimizerKind, lr: f64) -> TrainSpec {
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
            batch_per_worker: 8,
            optimizer,
            lr,
            warmup_epochs: 0.0,
            weight_decay: 1e-4,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    }
}

/// Each rank's parameters after `steps`, its learning rate and samples per step at the
/// last step, on `world` ranks accumulating `k` micro-batches.
fn run(spec: &TrainSpec, world: usize, k: usize) -> Vec<(Vec<Vec<f32>>, f64, u64)> {
    let spec = spec.clone();
    on_group(world, move |c| {
        let spec = spec.clone();
        async move {
            let mut t = Trainer::new(&spec, c)?;
            assert_eq!(t.set_accumulation(k), k);
            let mut last = None;
            for _ in 0..STEPS {
                last = Some(t.step().await?);
            }
            let m = last.expect("steps ran");
            Ok::<_, TrainError>((t.params()?.to_vec(), m.lr, m.samples_per_step))
        }
    })
    .into_iter()
    .map(|r| r.expect("training"))
    .collect()
}

fn check(arch: Arch, optimizer: OptimizerKind, lr: f64) {
    let s = spec(arch, optimizer, lr);
    let full = run(&s, 4, 1);
    let half = run(&s, 2, 2);
    assert_eq!(
        half[0].0, half[1].0,
        "ranks of the shrunk ring agree bit for bit"
    );
    let (d, m) = max_diff(&full[0].0, &half[0].0);
    assert!(
        m > 0.0 && d <= 1e-4 * m.max(1.0),
        "{arch:?}/{optimizer:?}: 2 workers × 2 micro-batches vs 4 workers: max |Δ| = {d} (max |p| = {m})"
    );
    assert_eq!(full[0].1, half[0].1, "the learning rate is unchanged");
    assert_eq!(
        (full[0].2, half[0].2),
        (32, 32),
        "samples per step unchanged"
    );
    // Without accumulation the shrunk ring takes half the samples and another path.
    let plain = run(&s, 2, 1);
    assert_eq!(plain[0].2, 16);
    let (d_plain, _) = max_diff(&full[0].0, &plain[0].0);
    assert!(
        d_plain > 10.0 * d,
        "accumulation is what keeps the run: {d_plain} vs {d}"
    );
}

#[test]
fn two_workers_accumulating_two_micro_batches_follow_four_workers_mlp_sgd() {
    check(Arch::Mlp, OptimizerKind::Sgd, 0.05);
}

#[test]
fn two_workers_accumulating_two_micro_batches_follow_four_workers_cnn_adamw() {
    check(Arch::Cnn, OptimizerKind::Adamw, 0.002);
}

/// W not a multiple of W': ⌈4/3⌉ = 2 micro-batches on 3 ranks, a global batch of 6 × 8 (the
/// learning rate follows the 6 linearly).
#[test]
fn three_workers_keeping_four_take_two_micro_batches_each() {
    let s = spec(Arch::Mlp, OptimizerKind::Sgd, 0.05);
    let g = trainer::elastic::Generation {
        generation: 1,
        rank: 0,
        addrs: vec!["127.0.0.1:1".parse().unwrap(); 3],
        secret: String::new(),
        batch_workers: Some(4),
    };
    assert_eq!(g.accumulation(), 2);
    let out = run(&s, 3, g.accumulation());
    assert_eq!(out[0].2, 48);
    let six = run(&s, 6, 1);
    assert_eq!(out[0].1, six[0].1, "the learning rate of six ranks");
}
