//! One worker process of a data-parallel job: the body of `train-worker` and of the node's
//! hidden `ringleader train-worker` subcommand (one copy, used by both).
//!
//! A worker connects the collective's TCP ring, resumes from the job's latest committed
//! checkpoint when every rank finds the same one, trains, and prints progress; rank 0
//! writes checkpoints. With `metric_lines`, rank 0 also prints `ringleader-metric NAME VALUE
//! [STEP]` lines (`step`, `epoch` (1-based: the epoch in progress or just validated),
//! `loss`, `lr`, `samples_per_s`, `val_loss`, `val_accuracy`), at most one step report per
//! [`METRIC_STEP_INTERVAL_MS`] plus one at every validation, which the node's supervisor
//! turns into job metrics.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{bail, Context};
use collective::{Communicator, GroupConfig, Limits, ReduceOp};

use crate::{CheckpointStore, Checkpointer, Event, TrainSpec, Trainer};

/// Shortest gap between two step reports in `ringleader-metric` lines, in milliseconds.
pub const METRIC_STEP_INTERVAL_MS: u64 = 250;

/// What one worker needs; also its command line (`clap::Args`, flattened by both binaries).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Job spec (TOML with `[model]`, `[data]`, `[train]`, `[checkpoint]`; other keys are ignored).
    #[arg(long)]
    pub spec: std::path::PathBuf,
    /// This worker's rank.
    #[arg(long)]
    pub rank: usize,
    /// Data-plane address of every rank, comma-separated, in rank order; this rank binds
    /// its own.
    #[arg(long, value_delimiter = ',', required = true)]
    pub addrs: Vec<SocketAddr>,
    /// Job id: names the checkpoint directory and the collective group.
    #[arg(long, default_value = "local")]
    pub job_id: String,
    /// Generation of the ring (the job's attempt): stale connections are refused.
    #[arg(long, default_value_t = 0)]
    pub generation: u64,
    /// Data directory (the default storage lives under it).
    #[arg(long, default_value = "ringleader-data")]
    pub data_dir: std::path::PathBuf,
    /// Checkpoint storage URL; default `file://<data-dir>/store`.
    #[arg(long)]
    pub storage: Option<String>,
    /// Shared secret authenticating the data-plane connections.
    #[arg(
        long,
        env = "RINGLEADER_SECRET",
        default_value = "local-train",
        hide_env_values = true
    )]
    pub secret: String,
    /// Overrides train.max_steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Benchmark: skip this many steps, time the next `bench_steps`, print one `bench` line.
    #[arg(long, default_value_t = 0)]
    pub bench_steps: u64,
    /// Benchmark warm-up steps (not timed).
    #[arg(long, default_value_t = 3)]
    pub bench_warmup_steps: u64,
    /// Print every step's metrics.
    #[arg(long)]
    pub verbose: bool,
    /// Rank 0 prints `ringleader-metric` lines (for the node's supervisor).
    #[arg(long)]
    pub metric_lines: bool,
    /// Never use the collective's shared-memory path between ranks on one host: every byte
    /// goes over TCP. For hosts emulated in network namespaces, which share `/dev/shm` and
    /// would otherwise bypass their rate-limited links.
    #[arg(long)]
    pub no_shm: bool,
}

/// Runs one worker to the end of training (or of the benchmark).
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
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
        generation: args.generation,
        addrs: args.addrs.clone(),
        secret: args.secret.clone().into_bytes(),
        limits: Limits {
            shared_memory: !args.no_shm,
            ..Limits::default()
        },
    };
    let mut comm = Communicator::connect(cfg)
        .await
        .context("connecting the ring")?;
    let tag = format!("rank={} workers={world}", args.rank);

    if args.bench_steps > 0 {
        let mut trainer = Trainer::new(&spec, comm)?;
        return bench(&mut trainer, &spec, &args).await;
    }

    let data_dir = std::path::absolute(&args.data_dir)?;
    let url = args
        .storage
        .clone()
        .unwrap_or_else(|| format!("file://{}/store", data_dir.display()));
    let store = CheckpointStore::from_url(&url, &args.job_id)?;
    // Resume only when every rank sees the same latest checkpoint (a shared store); with
    // per-node stores the ranks would disagree, so they all start over instead.
    let latest = store.load_latest().await?;
    let mine = latest.as_ref().map_or(-1.0, |s| s.meta.step as f64);
    let mut agree = [mine, -mine];
    comm.allreduce(&mut agree, ReduceOp::Max)
        .await
        .context("agreeing on the checkpoint to resume from")?;
    let resume = if agree[0] == -agree[1] {
        latest
    } else {
        println!("{tag} checkpoints differ across ranks (per-node storage?): starting over");
        None
    };
    let mut trainer = Trainer::new(&spec, comm)?;
    if let Some(state) = resume {
        trainer.restore(&state)?;
        println!(
            "{tag} resumed step={} epoch={} from={url}",
            state.meta.step, state.meta.epoch
        );
    }
    let mut ckpt = Checkpointer::spawn(store, spec.checkpoint.keep);
    let verbose = args.verbose;
    let report = args.metric_lines && args.rank == 0;
    let mut last_report: Option<Instant> = None;
    let final_metrics = trainer
        .run(Some(&mut ckpt), |e| match e {
            Event::Step(m) => {
                if verbose {
                    println!(
                        "{tag} step={} loss={:.4} lr={:.4} samples_per_s={:.0}",
                        m.step, m.loss, m.lr, m.samples_per_s
                    );
                }
                let due = last_report
                    .is_none_or(|t| t.elapsed().as_millis() as u64 >= METRIC_STEP_INTERVAL_MS);
                if report && due {
                    last_report = Some(Instant::now());
                    println!("ringleader-metric step {}", m.step);
                    println!("ringleader-metric epoch {}", m.epoch + 1);
                    println!("ringleader-metric loss {} {}", m.loss, m.step);
                    println!("ringleader-metric lr {} {}", m.lr, m.step);
                    println!(
                        "ringleader-metric samples_per_s {} {}",
                        m.samples_per_s, m.step
                    );
                }
            }
            Event::Epoch(m) => {
                println!(
                    "{tag} epoch={} step={} val_loss={:.4} val_accuracy={:.4}",
                    m.epoch, m.step, m.val_loss, m.val_accuracy
                );
                if report {
                    println!("ringleader-metric step {}", m.step);
                    println!("ringleader-metric epoch {}", m.epoch + 1);
                    println!("ringleader-metric val_loss {} {}", m.val_loss, m.step);
                    println!(
                        "ringleader-metric val_accuracy {} {}",
                        m.val_accuracy, m.step
                    );
                }
            }
            Event::Checkpoint(s) => println!("{tag} checkpoint step={s}"),
            _ => {}
        })
        .await?;
    ckpt.close().await?;
    if args.rank == 0 {
        if let Some(step) = store_latest_step(&url, &args.job_id).await {
            println!(
                "{tag} checkpoint committed step={step} at={url} dir=jobs/{}/ckpt/{step:012}/",
                args.job_id
            );
        }
    }
    println!(
        "{tag} done step={} val_loss={:.4} val_accuracy={:.4}",
        final_metrics.step, final_metrics.val_loss, final_metrics.val_accuracy
    );
    Ok(())
}

/// The step of the latest committed checkpoint, if any (after the writer has closed).
async fn store_latest_step(url: &str, job_id: &str) -> Option<u64> {
    let store = CheckpointStore::from_url(url, job_id).ok()?;
    store.steps().await.ok()?.into_iter().max()
}

async fn bench(trainer: &mut Trainer, spec: &TrainSpec, args: &WorkerArgs) -> anyhow::Result<()> {
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
