//! One worker of a data-parallel job, for running a job without the control plane:
//! `scripts/train-local.sh N SPEC.toml` starts N of these on 127.0.0.1.
//!
//! Each rank connects the collective's TCP ring, resumes from the job's latest committed
//! checkpoint if there is one, trains, and prints metrics lines; rank 0 writes checkpoints.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Parser;
use collective::{Communicator, GroupConfig, Limits};
use trainer::{CheckpointStore, Checkpointer, Event, TrainSpec, Trainer};

#[derive(Debug, Parser)]
#[command(about = "one worker of a local data-parallel training job")]
struct Args {
    /// Job spec (TOML with [model], [data], [train], [checkpoint]).
    #[arg(long)]
    spec: std::path::PathBuf,
    /// This worker's rank.
    #[arg(long)]
    rank: usize,
    /// Data-plane address of every rank, comma-separated, in rank order.
    #[arg(long, value_delimiter = ',')]
    addrs: Vec<SocketAddr>,
    /// Job id: names the checkpoint directory and the collective group.
    #[arg(long, default_value = "local")]
    job_id: String,
    /// Data directory (the default storage lives under it).
    #[arg(long, default_value = "ringleader-data")]
    data_dir: std::path::PathBuf,
    /// Checkpoint storage URL; default `file://<data-dir>/store`.
    #[arg(long)]
    storage: Option<String>,
    /// Shared secret authenticating the data-plane connections.
    #[arg(long, env = "RINGLEADER_SECRET", default_value = "local-train")]
    secret: String,
    /// Overrides train.max_steps.
    #[arg(long)]
    max_steps: Option<u64>,
    /// Benchmark: skip this many steps, time the next `bench_steps`, print one `bench` line.
    #[arg(long, default_value_t = 0)]
    bench_steps: u64,
    /// Benchmark warm-up steps (not timed).
    #[arg(long, default_value_t = 3)]
    bench_warmup_steps: u64,
    /// Print every step's metrics.
    #[arg(long)]
    verbose: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.spec)
        .with_context(|| format!("reading {}", args.spec.display()))?;
    let mut spec = TrainSpec::from_toml(&text)?;
    if let Some(m) = args.max_steps {
        spec.train.max_steps = Some(m);
    }
    let world = args.addrs.len();
    if args.rank >= world {
        bail!("rank {} of {world} addresses", args.rank);
    }
    let group_id =
        u64::from_le_bytes(blake3::hash(args.job_id.as_bytes()).as_bytes()[..8].try_into()?);
    let cfg = GroupConfig {
        rank: args.rank,
        world,
        group_id,
        generation: 0,
        addrs: args.addrs.clone(),
        secret: args.secret.clone().into_bytes(),
        limits: Limits::default(),
    };
    let comm = Communicator::connect(cfg)
        .await
        .context("connecting the ring")?;
    let mut trainer = Trainer::new(&spec, comm)?;
    let tag = format!("rank={} workers={world}", args.rank);

    if args.bench_steps > 0 {
        return bench(&mut trainer, &spec, &args).await;
    }

    let data_dir = std::path::absolute(&args.data_dir)?;
    let url = args
        .storage
        .clone()
        .unwrap_or_else(|| format!("file://{}/store", data_dir.display()));
    let store = CheckpointStore::from_url(&url, &args.job_id)?;
    if let Some(state) = store.load_latest().await? {
        trainer.restore(&state)?;
        println!(
            "{tag} resumed step={} epoch={} from={url}",
            state.meta.step, state.meta.epoch
        );
    }
    let mut ckpt = Checkpointer::spawn(store, spec.checkpoint.keep);
    let verbose = args.verbose;
    let final_metrics = trainer
        .run(Some(&mut ckpt), |e| match e {
            Event::Step(m) if verbose => println!(
                "{tag} step={} loss={:.4} lr={:.4} samples_per_s={:.0}",
                m.step, m.loss, m.lr, m.samples_per_s
            ),
            Event::Epoch(m) => println!(
                "{tag} epoch={} step={} val_loss={:.4} val_accuracy={:.4}",
                m.epoch, m.step, m.val_loss, m.val_accuracy
            ),
            Event::Checkpoint(s) => println!("{tag} checkpoint step={s}"),
            _ => {}
        })
        .await?;
    ckpt.close().await?;
    println!(
        "{tag} done step={} val_loss={:.4} val_accuracy={:.4}",
        final_metrics.step, final_metrics.val_loss, final_metrics.val_accuracy
    );
    Ok(())
}

async fn bench(trainer: &mut Trainer, spec: &TrainSpec, args: &Args) -> anyhow::Result<()> {
    for _ in 0..args.bench_warmup_steps {
        trainer.step().await?;
    }
    let (mut compute, mut pack, mut wait, mut optim) = (0.0, 0.0, 0.0, 0.0);
    let t0 = Instant::now();
    for _ in 0..args.bench_steps {
        let m = trainer.step().await?;
        compute += m.compute_s;
        pack += m.pack_s;
        wait += m.comm_wait_s;
        optim += m.optim_s;
    }
    let wall = t0.elapsed().as_secs_f64();
    let samples =
        (args.bench_steps as usize * spec.train.batch_per_worker * trainer.world()) as f64;
    let n = args.bench_steps as f64;
    if trainer.rank() == 0 {
        println!(
            "bench model={:?} workers={} params={} samples_per_s={:.1} step_ms={:.2} compute_ms={:.2} pack_ms={:.2} comm_wait_ms={:.2} optim_ms={:.2} comm_fraction={:.3}",
            spec.model.arch,
            trainer.world(),
            trainer.model().num_params(),
            samples / wall,
            1e3 * wall / n,
            1e3 * compute / n,
            1e3 * pack / n,
            1e3 * wait / n,
            1e3 * optim / n,
            (pack + wait) / wall,
        );
    }
    Ok(())
}
