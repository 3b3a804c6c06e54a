//! A CUDA trainer whose gradients NCCL averages keeps its parameters and optimizer state on
//! the device (the device step of `trainer::gpu`), and trains as the CPU trainer does. One
//! GPU allows a world of one only (NCCL refuses two ranks on a device), which still runs
//! every part of the step: the gradients queued per layer, the wait, the optimizer's kernels,
//! the state brought back for a snapshot and sent up again after a restore. Needs
//! `--features cuda` and a GPU with libnccl; elsewhere it says SKIPPED.

#![cfg(feature = "cuda")]

mod common;

use collective::{Communicator, Limits, NcclConfig};
use common::{max_diff, runtime};
use trainer::gpu::Device;
use trainer::{
    Arch, DataSpec, ModelSpec, OptimizerKind, TrainError, TrainParams, TrainSpec, TrainState,
    Trainer,
};

const STEPS: u64 = 12;

fn spec(arch: Arch, optimizer: OptimizerKind) -> TrainSpec {
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
            max_steps: Some(2 * STEPS),
            batch_per_worker: 16,
            optimizer,
            lr: 0.05,
            warmup_epochs: 0.0,
            weight_decay: 1e-4,
            ..TrainParams::default()
        },
        ..TrainSpec::default()
    }
}

/// The CUDA device, or why there is none (then the test says SKIPPED).
fn gpu() -> Option<Device> {
    match Device::choose(1, false) {
        Ok(d) if collective::nccl_available() => Some(d),
        Ok(_) => {
            eprintln!("SKIPPED: no libnccl (the device step needs NCCL)");
            None
        }
        Err(e) => {
            eprintln!("SKIPPED: no usable GPU here ({e})");
            None
        }
    }
}

/// A trainer of `spec` on `device`, with NCCL when it is CUDA, in a world of one.
async fn trainer(spec: &TrainSpec, device: &Device) -> Result<Trainer, TrainError> {
    let mut comms = Communicator::in_memory(1, Limits::default())?;
    let nccl = if device.is_cuda() {
        let group = Communicator::in_memory(1, Limits::default())?.remove(0);
        Some(group.nccl(0, NcclConfig::default()).await?)
    } else {
        None
    };
    Trainer::new_on(spec, comms.remove(0), device, nccl)
}

/// Runs `steps` steps, then snapshots.
async fn run(t: &mut Trainer, steps: u64) -> Result<TrainState, TrainError> {
    for _ in 0..steps {
        t.step().await?;
    }
    t.snapshot()
}

fn params(s: &TrainState) -> Vec<Vec<f32>> {
    s.params.iter().map(|t| t.data.clone()).collect()
}

fn optimizer_state(s: &TrainState) -> Vec<Vec<f32>> {
    s.optimizer.iter().map(|t| t.data.clone()).collect()
}

/// Per model and optimizer: the GPU trainer's parameters and optimizer state after
/// `2·STEPS` steps are the CPU trainer's to 1e-3 of their magnitude; a GPU trainer restored
/// from the GPU run's snapshot at `STEPS` ends bit-identical to the uninterrupted GPU run.
/// On a multi-threaded runtime and on a current-thread one (where the wait for NCCL cannot
/// use `block_in_place`).
#[test]
fn the_device_step_trains_as_the_cpu_and_restores_exactly() {
    let Some(device) = gpu() else { return };
    for (arch, optimizer, multi_thread) in [
        (Arch::Mlp, OptimizerKind::Sgd, true),
        (Arch::Mlp, OptimizerKind::Adamw, false),
        (Arch::Cnn, OptimizerKind::Sgd, false),
        (Arch::Cnn, OptimizerKind::Adamw, true),
    ] {
        let what = format!("{arch:?} {optimizer:?}");
        let spec = spec(arch, optimizer);
        let rt = runtime(multi_thread);
        let (cpu, gpu_half, gpu_full, resumed) = rt
            .block_on(async {
                let mut c = trainer(&spec, &Device::Cpu).await?;
                let cpu = run(&mut c, 2 * STEPS).await?;
                let mut g = trainer(&spec, &device).await?;
                let half = run(&mut g, STEPS).await?;
                let full = run(&mut g, STEPS).await?;
                drop(g);
                let mut r = trainer(&spec, &device).await?;
                r.restore(&half)?;
                let resumed = run(&mut r, STEPS).await?;
                Ok::<_, TrainError>((cpu, half, full, resumed))
            })
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(gpu_half.meta.step, STEPS, "{what}");
        assert_eq!(gpu_full.meta.optimizer_steps, 2 * STEPS, "{what}");
        let (d, m) = max_diff(&params(&gpu_full), &params(&cpu));
        assert!(
            d <= 1e-3 * m.max(1.0),
            "{what}: parameters {d} apart (max {m})"
        );
        let (d, m) = max_diff(&optimizer_state(&gpu_full), &optimizer_state(&cpu));
        assert!(
            d <= 1e-3 * m.max(1.0),
            "{what}: optimizer state {d} apart (max {m})"
        );
        assert_eq!(params(&resumed), params(&gpu_full), "{what}: restored run");
        assert_eq!(
            optimizer_state(&resumed),
            optimizer_state(&gpu_full),
            "{what}: restored optimizer state"
        );
    }
}
