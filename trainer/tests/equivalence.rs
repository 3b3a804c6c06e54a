//! N workers with batch b follow one worker with batch N·b; fixed seed and world size give
//! bit-identical runs.

mod common;

use common::{max_diff, on_group, train_params};
use trainer::{
    Arch, DataSpec, GradCompression, ModelSpec, OptimizerKind, SufficientFactors, TrainError,
    TrainParams, TrainSpec, Trainer,
};

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
    check_with(arch, optimizer, lr, SufficientFactors::Auto);
}

fn check_with(arch: Arch, optimizer: OptimizerKind, lr: f64, factors: SufficientFactors) {
    let world = 3;
    let b = 8;
    // Linear scaling: N workers at `lr` peak at N·lr, which the single worker gets directly.
    let mut multi_spec = spec(arch, optimizer, b, lr);
    multi_spec.train.sufficient_factors = factors;
    let multi = train_params(&multi_spec, world, STEPS);
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

/// Every dense layer's gradients as gathered sufficient factors instead of allreduced: the
/// same training, to float tolerance, and still bit-identical ranks.
#[test]
fn sufficient_factors_follow_one_worker_too() {
    check_with(
        Arch::Mlp,
        OptimizerKind::Sgd,
        0.05,
        SufficientFactors::Always,
    );
    check_with(
        Arch::Cnn,
        OptimizerKind::Adamw,
        0.002,
        SufficientFactors::Always,
    );
}

/// Which layers `auto` gathers as factors: those where that sends at most half the bytes.
#[test]
fn auto_chooses_factors_where_they_halve_the_bytes() {
    let factored = |arch, world, factors| {
        let mut s = spec(arch, OptimizerKind::Sgd, 8, 0.05);
        s.train.sufficient_factors = factors;
        let out = on_group(world, move |c| {
            let s = s.clone();
            async move {
                // `auto` decides at the first step.
                let mut t = Trainer::new(&s, c)?;
                t.step().await?;
                Ok::<_, TrainError>(t.factored_layers())
            }
        });
        out.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>()
    };
    // MLP 64-64-32-10, batch 8: 3·8·(64+64) ≤ 64·64 for the first layer only.
    assert_eq!(factored(Arch::Mlp, 3, SufficientFactors::Auto), vec![1; 3]);
    assert_eq!(
        factored(Arch::Mlp, 3, SufficientFactors::Always),
        vec![3; 3]
    );
    assert_eq!(factored(Arch::Mlp, 3, SufficientFactors::Never), vec![0; 3]);
    // One rank has nothing to send.
    assert_eq!(factored(Arch::Mlp, 1, SufficientFactors::Always), vec![0]);
    // The CNN's 32-32 dense layer: 2·8·64 ≤ 32·32 with two ranks, not with three.
    assert_eq!(factored(Arch::Cnn, 2, SufficientFactors::Auto), vec![1; 2]);
    assert_eq!(factored(Arch::Cnn, 3, SufficientFactors::Auto), vec![0; 3]);
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

#[test]
fn bf16_gradients_train_stay_identical_across_ranks_and_follow_f32_loosely() {
    let (world, b, lr) = (3, 8, 0.05);
    let mut s = spec(Arch::Mlp, OptimizerKind::Sgd, b, lr);
    s.train.grad_compression = GradCompression::Bf16;
    let runs = on_group(world, move |c| {
        let s = s.clone();
        async move {
            let mut t = Trainer::new(&s, c)?;
            let mut losses = Vec::new();
            for _ in 0..STEPS {
                losses.push(t.step().await?.loss);
            }
            Ok::<_, TrainError>((t.params()?.to_vec(), losses))
        }
    });
    let runs: Vec<_> = runs.into_iter().map(|r| r.expect("training")).collect();
    for (r, run) in runs.iter().enumerate().skip(1) {
        assert_eq!(
            runs[0], *run,
            "rank {r} diverged from rank 0 (must be bit-identical with bf16 too)"
        );
    }
    let losses = &runs[0].1;
    let head = losses[..3].iter().sum::<f64>() / 3.0;
    let tail = losses[losses.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(
        tail < 0.9 * head,
        "loss must fall with bf16 gradients: {losses:?}"
    );
    // One f32 process with the global batch: equal only to bf16 tolerance (each gradient
    // value keeps 8 significant bits, and every ring step rounds the partial sum again).
    let single = train_params(
        &spec(Arch::Mlp, OptimizerKind::Sgd, world * b, lr * 3.0),
        1,
        STEPS,
    );
    let (d, m) = max_diff(&runs[0].0, &single[0]);
    eprintln!("bf16 vs f32 single process: max |Δ| = {d} (max |p| = {m})");
    assert!(
        d <= 5e-3 * m.max(1.0),
        "bf16: max |Δ| = {d} (max |p| = {m}) beyond bf16 tolerance"
    );
}

/// A rank computing through a device's copies (the staged CPU twin of the GPU path:
/// parameters uploaded each step, gradients downloaded per layer, logits read back) trains
/// bit for bit as on the CPU, with the MLP and the CNN, and validates alike. (Sufficient
/// factors are a host-only path: off here, so that both compute the same sums.)
#[test]
fn the_device_path_trains_exactly_as_the_cpu() {
    use trainer::gpu::Device;
    for arch in [Arch::Mlp, Arch::Cnn] {
        let mut s = spec(arch, OptimizerKind::Adamw, 8, 0.002);
        s.train.sufficient_factors = SufficientFactors::Never;
        let run = |device: Device| {
            let s = s.clone();
            on_group(2, move |c| {
                let (s, device) = (s.clone(), device.clone());
                async move {
                    let mut t = Trainer::new_on(&s, c, &device, None)?;
                    for _ in 0..6 {
                        t.step().await?;
                    }
                    let eval = t.evaluate()?;
                    Ok::<_, TrainError>((t.params()?.to_vec(), eval.val_loss, eval.val_accuracy))
                }
            })
            .into_iter()
            .map(|r| r.expect("training"))
            .collect::<Vec<_>>()
        };
        let cpu = run(Device::Cpu);
        let staged = run(Device::Staged);
        for (r, (c, d)) in cpu.iter().zip(&staged).enumerate() {
            let (diff, _) = max_diff(&c.0, &d.0);
            assert!(
                c == d,
                "{arch:?} rank {r}: the staged path differs from the cpu: max |Δp| = {diff}, \
                 validation {:?} vs {:?}",
                (c.1, c.2),
                (d.1, d.2)
            );
        }
    }
}
