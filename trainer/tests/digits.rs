//! A 3-worker digits job reaches ≥ 97% validation accuracy within a fixed step budget
//! (deterministic: the same seed gives the same run, so this passes or fails every time);
//! the digits exported as a shared dataset train exactly like the built-in.

mod common;

use common::{on_group, train_params};
use trainer::{Arch, Event, ModelSpec, OptimizerKind, TrainError, TrainParams, TrainSpec, Trainer};

/// Step budget: 3 workers × 32 samples = 96 per step, 15 steps per epoch, so 15 epochs.
const STEPS: u64 = 225;

#[test]
fn three_workers_reach_97_percent_on_digits() {
    let spec = TrainSpec {
        model: ModelSpec {
            arch: Arch::Cnn,
            channels: vec![8, 16],
            fc: 64,
            ..ModelSpec::default()
        },
        train: TrainParams {
            epochs: 20,
            max_steps: Some(STEPS),
            batch_per_worker: 32,
            optimizer: OptimizerKind::Sgd,
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-4,
            warmup_epochs: 1.0,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    };
    let results = on_group(3, move |c| {
        let spec = spec.clone();
        async move {
            let mut t = Trainer::new(&spec, c)?;
            let mut epochs = Vec::new();
            let last = t
                .run(None, |e| {
                    if let Event::Epoch(m) = e {
                        epochs.push(m.val_accuracy);
                    }
                })
                .await?;
            Ok::<_, TrainError>((last, epochs, t.step_count()))
        }
    });
    let (last, epochs, steps) = results[0].as_ref().unwrap();
    assert_eq!(*steps, STEPS);
    for r in &results[1..] {
        assert_eq!(
            r.as_ref().unwrap().0,
            *last,
            "all ranks validate the same parameters"
        );
    }
    eprintln!("val accuracy per epoch {epochs:?}");
    assert!(
        last.val_accuracy >= 0.97,
        "val accuracy {:.4} after {STEPS} steps (per epoch {epochs:?})",
        last.val_accuracy
    );
}

#[test]
fn shared_digits_train_exactly_like_the_built_in() {
    let dir = tempfile::tempdir().unwrap();
    trainer::export_digits(dir.path()).unwrap();
    let builtin = TrainSpec::from_toml("[model]\nhidden = [32]").unwrap();
    let mut shared = builtin.clone();
    shared.data.dataset = "digits-copy".into();
    shared.data.shared_dir = Some(dir.path().into());
    let a = train_params(&builtin, 2, 20);
    let b = train_params(&shared, 2, 20);
    assert_eq!(a, b, "same data, same seed: the same parameters");
}
