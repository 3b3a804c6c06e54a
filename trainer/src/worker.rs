//! One worker process of a data-parallel job: the body of `train-worker` and of the node's
//! hidden `ringleader train-worker` subcommand (one copy, used by both).
//!
//! A worker connects the collective's TCP ring, resumes from the job's latest committed
//! checkpoint when every rank finds the same one, trains, and prints progress; rank 0
//! writes checkpoints. With `metric_lines`, rank 0 also prints `ringleader-metric NAME VALUE
//! [STEP]` lines (`step`, `epoch` (1-based: the epoch in progress or just validated),
//! `loss`, `lr`, `samples_per_s`, `collective_bytes` (bytes rank 0 sent over the collective
//! so far), `allreduce_wait_ms` (mean wait per step for the gradients' allreduce since the
//! last report), `val_loss`, `val_accuracy`), at most one step report per
//! [`METRIC_STEP_INTERVAL_MS`] plus one at every validation, which the node's supervisor
//! turns into job metrics. At every validation it also prints the search's report line
//! `ringleader-report EPOCHS val_loss X val_accuracy Y` (`EPOCHS`: epochs done, the
//! resource a search trial is measured in), after that validation's metric lines.
//! `--stop-at-epoch N` ends the run after N epochs (validated and checkpointed), keeping
//! the whole run's schedule. Every line for the node is a [`ringleader_protocol::RankLine`]
//! (the protocol's one definition, `docs/book/src/reference/protocol.md`); a non-finite value is
//! not printed.
//!
//! Always, in the job's storage (the checkpoints' URL; see [`crate::observe`]): rank 0
//! writes TensorBoard event files under `jobs/<job-id>/tb/` (rewritten every few seconds
//! and at the end, also when training fails), and at the end of the run the ranks gather
//! the phases of their first [`crate::observe::TIMELINE_STEPS`] steps and rank 0 writes
//! `jobs/<job-id>/timeline.json` (with `--elastic`, each worker writes its own
//! `jobs/<job-id>/timeline-rank-<rank>.json` instead). A storage error there is logged and
//! never stops training.
//!
//! With `--elastic` the worker survives lost ranks ([`crate::elastic`]): after the first
//! generation (the command line's `--rank`, `--addrs`, `--generation`, `--secret`) further
//! generations arrive on stdin, one control line each:
//! `ringleader-generation
//! {"generation":1,"rank":0,"addrs":["127.0.0.1:20001","127.0.0.1:20002"],"secret":"<hex>"}`;
//! `ringleader-stop` or the end of stdin ends the worker (exit 0) after the current step. It
//! prints, one line per event, `key=value` fields:
//! - `ringleader-elastic failed generation=G lost_rank=R error="..."` (`lost_rank=-` when
//!   the error names no lost rank; `"` and `\` in the error escaped with `\`). No failed
//!   line when the generation was superseded: a newer generation (or a stop) arrived
//!   inside a step, and the step was aborted for it, by this worker after
//!   [`crate::elastic::ABORT_GRACE_MS`] or by a peer that left first (a peer that aborts
//!   before this worker has read the newer generation shows as `lost_rank=-`);
//! - `ringleader-elastic resumed generation=G world=N rank=R step=S restored_step=C
//!   steps_lost=L source=memory|broadcast|checkpoint|fresh` after joining a generation (the
//!   first one included; `step`: the most steps any rank had reached);
//! - from every rank, after its first step in a generation and then at most once per
//!   [`RANK_STATS_INTERVAL_MS`]:
//!   `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y`, the mean
//!   compute and communication-wait time per step since the last such line (straggler
//!   detection).
//!
//! With `--elastic`, a heartbeat thread prints `ringleader-heartbeat computing_ms=X` every
//! [`HEARTBEAT_INTERVAL_MS`] while the training thread has been inside one compute section
//! (a forward or backward pass) for at least that long: the node names a rank stuck in its
//! own computation (a deadlock) hung, while ranks blocked on it, waiting on the network, say
//! nothing.
//!
//! A job on a shared dataset (`data.dataset` not a built-in, see
//! [`crate::shared_dataset`]) reads it from the directory named by the environment variable
//! [`DATASET_DIR_ENV`] (`RINGLEADER_DATASET_DIR`: the absolute path of the dataset's
//! directory, set by the node once the dataset is on this machine); unset, the worker stops
//! with an error before it connects the ring. For a built-in dataset it is ignored.
//!
//! Test-only: the environment variable [`STEP_DELAY_ENV`] (`RINGLEADER_TEST_STEP_DELAY_MS`,
//! read once at start) makes every step sleep that long in its compute part, to emulate a
//! straggler; [`HANG_ENV`] (`RINGLEADER_TEST_HANG=RANK:STEP`) makes the worker started as
//! rank RANK never return from step STEP's forward pass, to emulate a deadlock. Both are
//! read once into a [`Faults`] value handed to the trainer, through [`test_hook`], which a release
//! build compiles to `None`; a job spec may not set them (the node refuses `RINGLEADER_*` keys in a
//! spec's `env`), a test sets them in the node's environment, which its ranks inherit.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use collective::{Communicator, GroupConfig, Limits};
use opendal::Operator;
use ringleader_protocol::env as rank_env;
use tracing::warn;

use crate::elastic::{
    agree_on_checkpoint, forward_control_lines, generation_channel, ElasticEvent, ElasticRun,
    Generation, Resumed, TcpConnector,
};
use crate::faults::Faults;
use crate::gpu::{connect_nccl, Device};
use crate::observe::{unix_now_s, write_job_timeline, PhaseRecorder, RankTimeline, TensorBoard};
use crate::redact::redact_url;
use crate::{
    CheckpointStore, Checkpointer, EpochMetrics, Event, RunEnd, StepMetrics, TrainSpec, Trainer,
};
use ringleader_protocol::{
    ElasticFailed, ElasticResumed, Metric, RankLine, RankStats as ProtocolRankStats, Report,
};

/// Shortest gap between two step reports in `ringleader-metric` lines, in milliseconds.
pub const METRIC_STEP_INTERVAL_MS: u64 = 250;
/// Shortest gap between two `ringleader-rank-stats` lines of a rank, in milliseconds.
pub const RANK_STATS_INTERVAL_MS: u64 = 1000;
pub use crate::dataset::DATASET_DIR_ENV;
/// Test-only: `RANK:STEP`, the rank that hangs in a step's forward pass ([`crate::faults`]).
pub use crate::faults::HANG_ENV;
/// Test-only: milliseconds every step sleeps in its compute part (see [`crate::faults`]).
pub use crate::faults::STEP_DELAY_ENV;
/// Period of the progress heartbeat, and the shortest compute section it reports, ms.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1_000;

pub use crate::test_hooks::{test_hook, TEST_HOOK_PREFIX};

/// Prints `ringleader-heartbeat computing_ms=X` every [`HEARTBEAT_INTERVAL_MS`] while the
/// training thread is inside one compute section for at least that long. A plain thread: it
/// goes on when the runtime's threads are stuck.
fn spawn_heartbeat(clock: crate::ComputeClock) -> anyhow::Result<()> {
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_millis(HEARTBEAT_INTERVAL_MS));
            let ms = clock.computing_ms();
            if ms >= HEARTBEAT_INTERVAL_MS {
                emit(RankLine::Heartbeat { computing_ms: ms });
            }
        })
        .context("starting the heartbeat")?;
    Ok(())
}

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
    /// The world size whose global batch each step keeps (a ring shrunk by a preemption):
    /// each rank accumulates ⌈batch_workers / world⌉ micro-batches per step.
    #[arg(long)]
    pub batch_workers: Option<u32>,
    /// Data directory (the default storage lives under it).
    #[arg(long, default_value = "ringleader-data")]
    pub data_dir: std::path::PathBuf,
    /// Checkpoint storage URL; default `file://<data-dir>/store`.
    #[arg(long, env = rank_env::STORAGE, hide_env_values = true)]
    pub storage: Option<String>,
    /// Shared secret authenticating the data-plane connections.
    #[arg(
        long,
        env = rank_env::SECRET,
        default_value = "local-train",
        hide_env_values = true
    )]
    pub secret: String,
    /// Overrides train.max_steps.
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Stop once this many epochs are done, validated and checkpointed, keeping the whole
    /// run's learning-rate schedule (a search trial trained to its rung; a later run with a
    /// higher value resumes from the checkpoint and goes on).
    #[arg(long)]
    pub stop_at_epoch: Option<u64>,
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
    /// would otherwise bypass their rate-limited links. A job sets it for its workers with
    /// `RINGLEADER_NO_SHM = "true"` in its `env`.
    #[arg(long, env = rank_env::NO_SHM)]
    pub no_shm: bool,
    /// Elastic: survive lost ranks; later generations arrive on stdin as control lines
    /// (see the module doc), a stop line or the end of stdin ends the worker.
    #[arg(long)]
    pub elastic: bool,
}

/// Prints a worker's progress lines (the `rank=R workers=N` lines and, with
/// `metric_lines`, the `ringleader-metric` lines).
struct Lines {
    tag: String,
    verbose: bool,
    metric_lines: bool,
    last_report: Option<Instant>,
    /// Bytes this rank sent over the collective so far.
    sent_bytes: u64,
    /// Communication wait since the last step report: (seconds, steps).
    wait: (f64, u64),
}

impl Lines {
    fn event(&mut self, e: &Event) {
        let tag = &self.tag;
        let report = self.metric_lines;
        match e {
            Event::Step(m) => {
                self.sent_bytes += m.sent_bytes;
                self.wait.0 += m.comm_wait_s;
                self.wait.1 += 1;
                if self.verbose {
                    println!(
                        "{tag} step={} loss={:.4} lr={:.4} samples_per_s={:.0}",
                        m.step, m.loss, m.lr, m.samples_per_s
                    );
                }
                let due = self
                    .last_report
                    .is_none_or(|t| t.elapsed().as_millis() as u64 >= METRIC_STEP_INTERVAL_MS);
                if report && due {
                    self.last_report = Some(Instant::now());
                    metric("step", m.step as f64, None);
                    metric("epoch", (m.epoch + 1) as f64, None);
                    metric("loss", m.loss, Some(m.step));
                    metric("lr", m.lr, Some(m.step));
                    metric("samples_per_s", m.samples_per_s, Some(m.step));
                    metric("samples_per_step", m.samples_per_step as f64, Some(m.step));
                    // The collective: bytes sent so far, and the mean wait per step for
                    // the allreduce since the last report (what is not overlapped).
                    metric("collective_bytes", self.sent_bytes as f64, Some(m.step));
                    let (wait_s, steps) = std::mem::take(&mut self.wait);
                    let wait_ms = 1e3 * wait_s / steps.max(1) as f64;
                    metric("allreduce_wait_ms", wait_ms, Some(m.step));
                }
            }
            Event::Epoch(m) => {
                // Epochs are counted from 1 where users read them, as the metric lines do.
                println!(
                    "{tag} epoch={} step={} val_loss={:.4} val_accuracy={:.4}",
                    m.epoch + 1,
                    m.step,
                    m.val_loss,
                    m.val_accuracy
                );
                if report {
                    // The search's per-epoch report: resource (epochs done), then values.
                    let resource = u32::try_from(m.epoch + 1).unwrap_or(u32::MAX);
                    let values = [("val_loss", m.val_loss), ("val_accuracy", m.val_accuracy)];
                    // Non-finite values are not protocol (a diverged run): left out.
                    let values: Vec<(String, f64)> = values
                        .iter()
                        .filter(|(_, v)| v.is_finite())
                        .map(|(n, v)| (n.to_string(), *v))
                        .collect();
                    // Metric lines first: the node then takes the report's values as the
                    // search's, not again as job metrics (which keep their steps).
                    metric("step", m.step as f64, None);
                    metric("epoch", (m.epoch + 1) as f64, None);
                    metric("val_loss", m.val_loss, Some(m.step));
                    metric("val_accuracy", m.val_accuracy, Some(m.step));
                    if !values.is_empty() {
                        emit(RankLine::Report(Report { resource, values }));
                    }
                }
            }
            Event::Checkpoint(s) => println!("{tag} checkpoint step={s}"),
            _ => {}
        }
    }
}

/// Mean compute and wait time per step since the last `ringleader-rank-stats` line: the
/// first step is reported at once, then at most one line per [`RANK_STATS_INTERVAL_MS`].
#[derive(Debug, Default)]
pub struct RankStats {
    last: Option<Instant>,
    steps: u64,
    compute_s: f64,
    wait_s: f64,
}

impl RankStats {
    /// Adds a step finished at `now`; when it is the first or [`RANK_STATS_INTERVAL_MS`]
    /// have passed since the last report, returns the means `(compute_ms, wait_ms)` and
    /// starts counting again.
    pub fn record(&mut self, m: &StepMetrics, now: Instant) -> Option<(f64, f64)> {
        self.steps += 1;
        self.compute_s += m.compute_s;
        self.wait_s += m.comm_wait_s;
        let interval = Duration::from_millis(RANK_STATS_INTERVAL_MS);
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < interval)
        {
            return None;
        }
        let n = self.steps as f64;
        let out = (1e3 * self.compute_s / n, 1e3 * self.wait_s / n);
        *self = RankStats {
            last: Some(now),
            ..RankStats::default()
        };
        Some(out)
    }
}

/// Prints one protocol line for the node (stdout, one line; see
/// `docs/book/src/reference/protocol.md`).
fn emit(line: RankLine) {
    println!("{line}");
}

/// `ringleader-metric NAME VALUE [STEP]`; a non-finite value is not protocol (a diverged
/// run) and is left out.
fn metric(name: &str, value: f64, step: Option<u64>) {
    if value.is_finite() {
        emit(RankLine::Metric(Metric {
            name: name.to_string(),
            value,
            step,
        }));
    }
}

/// Generations and ranks are `u32` on the wire (the node's types).
fn small(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `ringleader-elastic failed generation=G lost_rank=R error="..."`.
pub fn failed_line(generation: u64, lost_rank: Option<usize>, error: &str) -> String {
    RankLine::ElasticFailed(ElasticFailed {
        generation: small(generation),
        lost_rank: lost_rank.map(|r| small(r as u64)),
        error: error.to_string(),
    })
    .to_string()
}

/// `ringleader-elastic resumed generation=G world=N rank=R step=S restored_step=C
/// steps_lost=L source=...`.
pub fn resumed_line(r: &Resumed) -> String {
    RankLine::ElasticResumed(ElasticResumed {
        generation: Some(small(r.generation)),
        world: Some(small(r.world as u64)),
        rank: Some(small(r.rank as u64)),
        step: Some(r.step),
        restored_step: r.restored_step,
        steps_lost: r.steps_lost,
        source: Some(r.source.to_string()),
    })
    .to_string()
}

/// `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y`.
pub fn rank_stats_line(
    generation: u64,
    rank: usize,
    step: u64,
    compute_ms: f64,
    wait_ms: f64,
) -> String {
    RankLine::RankStats(ProtocolRankStats {
        generation: small(generation),
        rank: small(rank as u64),
        step,
        compute_ms,
        wait_ms,
    })
    .to_string()
}

/// The directory of `dataset` from [`DATASET_DIR_ENV`]'s value `var`: none for a built-in,
/// required (and not empty) for a shared dataset.
fn shared_dataset_dir(
    dataset: &str,
    var: Option<std::ffi::OsString>,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    if crate::is_builtin_dataset(dataset) {
        return Ok(None);
    }
    match var {
        Some(dir) if !dir.is_empty() => Ok(Some(dir.into())),
        _ => bail!(
            "data.dataset {dataset:?} is a shared dataset: {DATASET_DIR_ENV} must name its \
             directory (the node sets it)"
        ),
    }
}

/// Runs one worker to the end of training (or of the benchmark).
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let text = tokio::fs::read_to_string(&args.spec)
        .await
        .with_context(|| format!("reading {}", args.spec.display()))?;
    let mut spec = TrainSpec::from_toml(&text)?;
    spec.data.shared_dir =
        shared_dataset_dir(&spec.data.dataset, std::env::var_os(DATASET_DIR_ENV))?;
    if let Some(m) = args.max_steps {
        spec.train.max_steps = Some(m);
    }
    let world = args.addrs.len();
    if args.rank >= world {
        bail!("rank {} of {world} addresses", args.rank);
    }
    let group_id =
        u64::from_le_bytes(blake3::hash(args.job_id.as_bytes()).as_bytes()[..8].try_into()?);
    let faults = Faults::from_env(args.rank)?;
    let device = Device::from_env()?;
    println!("rank={} device={:?}", args.rank, device.describe());
    if args.elastic {
        if args.bench_steps > 0 {
            bail!("--bench-steps does not go with --elastic");
        }
        return run_elastic(args, spec, group_id, faults, device).await;
    }
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
    let mut comm = Communicator::connect(cfg.clone())
        .await
        .context("connecting the ring")?;
    let nccl = connect_nccl(&mut comm, &cfg, device.trains_on_cuda(&spec.model))
        .await
        .context("connecting nccl")?;
    let tag = format!("rank={} workers={world}", args.rank);
    if nccl.is_some() {
        println!("{tag} gradients=nccl");
    }

    if args.bench_steps > 0 {
        let mut trainer = Trainer::new_on(&spec, comm, &device, nccl)?;
        trainer.set_faults(faults);
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
    let resume = agree_on_checkpoint(&mut comm, &store)
        .await
        .context("agreeing on the checkpoint to resume from")?;
    let mut trainer = Trainer::new_on(&spec, comm, &device, nccl)?;
    trainer.set_faults(faults);
    trainer.set_stop_epoch(args.stop_at_epoch);
    if let Some(state) = resume {
        trainer.restore(&state)?;
        println!(
            "{tag} resumed step={} epoch={} from={}",
            state.meta.step,
            state.meta.epoch,
            redact_url(&url)
        );
    }
    let mut ckpt = Checkpointer::spawn(store, spec.checkpoint.keep);
    let mut lines = Lines {
        tag: tag.clone(),
        verbose: args.verbose,
        metric_lines: args.metric_lines && args.rank == 0,
        last_report: None,
        sent_bytes: 0,
        wait: (0.0, 0),
    };
    let op = observe_operator(&url);
    let mut tb = op
        .clone()
        .filter(|_| args.rank == 0)
        .map(|op| TensorBoard::spawn(op, &args.job_id, unix_now_s()));
    let mut phases = PhaseRecorder::default();
    // SIGTERM (a preemption's requeue, a search pausing this trial): stop at the next step
    // boundary, checkpoint, exit 0.
    let terminated = sigterm_flag()?;
    let result = trainer
        .run_until(
            Some(&mut ckpt),
            |e| {
                lines.event(e);
                let now_s = unix_now_s();
                if let Event::Step(m) = e {
                    phases.record(m, 1e6 * now_s);
                }
                if let Some(tb) = &mut tb {
                    tb.event(e, now_s, Instant::now());
                }
            },
            || terminated.load(Ordering::SeqCst),
        )
        .await;
    // A peer that stopped first fails this rank's step; untouched, its state is whole.
    let stopped = match &result {
        Ok(RunEnd::Interrupted) => true,
        Err(_) => terminated.load(Ordering::SeqCst) && trainer.failed_untouched(),
        Ok(RunEnd::Finished(_)) => false,
    };
    if stopped {
        if let Some(tb) = tb {
            let _ = tb.close().await;
        }
        if args.rank == 0 {
            ckpt.save(std::sync::Arc::new(trainer.snapshot()?));
        }
        ckpt.close().await?;
        println!(
            "{tag} stopped step={} (SIGTERM): {}",
            trainer.step_count(),
            if args.rank == 0 {
                "checkpointed"
            } else {
                "rank 0 checkpoints"
            }
        );
        return Ok(());
    }
    let final_metrics = match result {
        Ok(RunEnd::Finished(m)) => m,
        Ok(RunEnd::Interrupted) => unreachable!("an interrupted run is stopped above"),
        Err(e) => {
            // The curves up to the failure are worth keeping.
            if let Some(tb) = tb {
                let _ = tb.close().await;
            }
            return Err(e.into());
        }
    };
    // A normal end: the device group's barrier, finalize and destroy (every rank is here).
    if let Err(e) = trainer.finish_device_group() {
        warn!(error = %e, "ending the device group");
    }
    // Every rank takes part in the gather, storage or not (the ranks must agree on it).
    match trainer.into_communicator().await {
        Ok(mut comm) => {
            let op = op.unwrap_or_else(|| {
                Operator::via_iter("memory", Vec::<(String, String)>::new())
                    .expect("the memory service is compiled in")
            });
            match write_job_timeline(&mut comm, &phases, &op, &args.job_id).await {
                Ok(Some(path)) => println!("{tag} timeline at={} path={path}", redact_url(&url)),
                Ok(None) => {}
                Err(e) => warn!(error = %e, "timeline not written"),
            }
        }
        Err(e) => warn!(error = %e, "timeline skipped: no communicator"),
    }
    if let Some(tb) = tb {
        let path = tb.path().to_string();
        if tb.close().await {
            println!("{tag} tensorboard at={} path={path}", redact_url(&url));
        }
    }
    ckpt.close().await?;
    finished(&tag, args.rank, &url, &args.job_id, &final_metrics).await;
    Ok(())
}

/// A run's last lines once its checkpoints are written: rank 0 names the latest committed
/// checkpoint, every rank its final metrics (`run` and `run_elastic` end alike).
async fn finished(tag: &str, rank: usize, url: &str, job_id: &str, m: &EpochMetrics) {
    if rank == 0 {
        if let Some((step, dir)) = store_latest(url, job_id).await {
            println!(
                "{tag} checkpoint committed step={step} at={} dir={dir}",
                redact_url(url)
            );
        }
    }
    println!(
        "{tag} done step={} val_loss={:.4} val_accuracy={:.4}",
        m.step, m.val_loss, m.val_accuracy
    );
}

/// [`run`] with `--elastic`: the first generation from the arguments, later ones from stdin.
async fn run_elastic(
    args: WorkerArgs,
    spec: TrainSpec,
    group_id: u64,
    faults: Faults,
    device: Device,
) -> anyhow::Result<()> {
    let (tx, source) = generation_channel();
    // A blocking read of stdin cannot be cancelled: a plain thread, so that it never holds
    // up the runtime's shutdown (the process exits with it still blocked).
    std::thread::Builder::new()
        .name("control-lines".into())
        .spawn(move || forward_control_lines(std::io::stdin().lock(), tx))
        .context("starting the control-line reader")?;
    let connector = TcpConnector {
        group_id,
        limits: Limits {
            shared_memory: !args.no_shm,
            ..Limits::default()
        },
    };
    let data_dir = std::path::absolute(&args.data_dir)?;
    let url = args
        .storage
        .clone()
        .unwrap_or_else(|| format!("file://{}/store", data_dir.display()));
    let store = CheckpointStore::from_url(&url, &args.job_id)?;
    let keep = spec.checkpoint.keep;
    let clock = crate::ComputeClock::default();
    spawn_heartbeat(clock.clone())?;
    let mut run = ElasticRun::new(spec, source, connector)
        .with_store(store.clone())
        .with_faults(faults)
        .with_compute_clock(clock)
        .with_device(device);
    let first = Generation {
        generation: args.generation,
        rank: args.rank,
        addrs: args.addrs.clone(),
        secret: args.secret.clone(),
        batch_workers: args.batch_workers,
    };
    let mut ckpt = Checkpointer::spawn(store, keep);
    let mut lines = Lines {
        tag: format!("rank={} workers={}", args.rank, args.addrs.len()),
        verbose: args.verbose,
        metric_lines: args.metric_lines && args.rank == 0,
        last_report: None,
        sent_bytes: 0,
        wait: (0.0, 0),
    };
    let mut stats = RankStats::default();
    let mut rank = args.rank;
    let op = observe_operator(&url);
    let mut tb: Option<TensorBoard> = None;
    let mut timeline = op.clone().map(|op| RankTimeline::new(op, &args.job_id));
    let result = run
        .run(first, Some(&mut ckpt), |e| match e {
            ElasticEvent::Train {
                generation,
                rank,
                event,
            } => {
                lines.event(event);
                let now_s = unix_now_s();
                if let Event::Step(m) = event {
                    if let Some((c, w)) = stats.record(m, Instant::now()) {
                        println!("{}", rank_stats_line(*generation, *rank, m.step, c, w));
                    }
                    if let Some(t) = &mut timeline {
                        t.step(*generation, *rank, m, 1e6 * now_s);
                    }
                }
                // Whoever is rank 0 now keeps the curves (from the first time it is).
                if *rank == 0 && tb.is_none() {
                    tb = op
                        .clone()
                        .map(|op| TensorBoard::spawn(op, &args.job_id, now_s));
                }
                if let Some(tb) = tb.as_mut().filter(|_| *rank == 0) {
                    tb.event(event, now_s, Instant::now());
                }
            }
            ElasticEvent::Failed {
                generation,
                lost_rank,
                error,
            } => println!("{}", failed_line(*generation, *lost_rank, error)),
            ElasticEvent::Resumed(r) => {
                println!("{}", resumed_line(r));
                lines.tag = format!("rank={} workers={}", r.rank, r.world);
                lines.metric_lines = args.metric_lines && r.rank == 0;
                rank = r.rank;
                stats = RankStats::default();
            }
        })
        .await;
    if let Some(t) = timeline {
        t.close().await;
    }
    if let Some(tb) = tb {
        let _ = tb.close().await;
    }
    let summary = result?;
    if let (None, Some(state)) = (&summary.finished, &summary.state) {
        // Stopped by the node (a preemption's requeue): the state every rank reached, as
        // a checkpoint the next attempt resumes from.
        if rank == 0 {
            ckpt.save(std::sync::Arc::new(state.clone()));
        }
    }
    ckpt.close().await?;
    let tag = &lines.tag;
    match summary.finished {
        Some(m) => finished(tag, rank, &url, &args.job_id, &m).await,
        None => println!(
            "{tag} stopped step={} generation={} steps_lost={}",
            summary.step, summary.generation, summary.steps_lost
        ),
    }
    Ok(())
}

/// A flag set once this process gets SIGTERM (it then stops at a step boundary).
fn sigterm_flag() -> anyhow::Result<std::sync::Arc<AtomicBool>> {
    let flag = std::sync::Arc::new(AtomicBool::new(false));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let set = flag.clone();
    tokio::spawn(async move {
        if term.recv().await.is_some() {
            set.store(true, Ordering::SeqCst);
        }
    });
    Ok(flag)
}

/// The operator the job's TensorBoard files and timeline are written through (the
/// checkpoints' storage), or `None` (logged) when it cannot be built: training goes on
/// without them.
fn observe_operator(url: &str) -> Option<Operator> {
    crate::operator_from_url(url)
        .inspect_err(
            |e| warn!(url = %redact_url(url), error = %e, "no tensorboard or timeline: storage"),
        )
        .ok()
}

/// The step and directory of the latest committed checkpoint, if any (after the writer has
/// closed).
async fn store_latest(url: &str, job_id: &str) -> Option<(u64, String)> {
    let store = CheckpointStore::from_url(url, job_id).ok()?;
    let step = store.steps().await.ok()?.into_iter().max()?;
    Some((step, store.dir(step)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elastic::RestoreSource;

    fn step(compute_s: f64, comm_wait_s: f64) -> StepMetrics {
        StepMetrics {
            samples_per_step: 0,
            step: 1,
            epoch: 0,
            loss: 1.0,
            lr: 0.1,
            samples_per_s: 1.0,
            compute_s,
            pack_s: 0.0,
            comm_wait_s,
            optim_s: 0.0,
            step_s: compute_s + comm_wait_s,
            sent_bytes: 0,
        }
    }

    #[test]
    fn rank_stats_report_the_first_step_then_means_once_per_interval() {
        let t0 = Instant::now();
        let mut s = RankStats::default();
        assert_eq!(s.record(&step(0.010, 0.002), t0), Some((10.0, 2.0)));
        assert_eq!(
            s.record(&step(0.020, 0.0), t0 + Duration::from_millis(400)),
            None
        );
        let at = t0 + Duration::from_millis(RANK_STATS_INTERVAL_MS);
        let (c, w) = s.record(&step(0.040, 0.004), at).unwrap();
        assert!((c - 30.0).abs() < 1e-9 && (w - 2.0).abs() < 1e-9, "{c} {w}");
    }

    #[test]
    fn a_shared_dataset_needs_the_directory_variable() {
        assert_eq!(
            shared_dataset_dir("digits", Some("/x".into())).unwrap(),
            None
        );
        assert_eq!(
            shared_dataset_dir("mnist", Some("/data/mnist".into())).unwrap(),
            Some("/data/mnist".into())
        );
        for unset in [None, Some("".into())] {
            let e = shared_dataset_dir("mnist", unset).unwrap_err().to_string();
            assert!(
                e.contains("\"mnist\"") && e.contains(DATASET_DIR_ENV),
                "{e}"
            );
        }
    }

    #[test]
    fn elastic_lines_are_key_value_and_quote_the_error() {
        assert_eq!(
            failed_line(2, Some(1), "peer \"lost\"\nrank 1 \\"),
            r#"ringleader-elastic failed generation=2 lost_rank=1 error="peer \"lost\" rank 1 \\""#
        );
        assert!(failed_line(0, None, "x").contains(" lost_rank=- "));
        let r = Resumed {
            generation: 3,
            world: 2,
            rank: 1,
            step: 17,
            restored_step: 15,
            steps_lost: 2,
            source: RestoreSource::Broadcast,
        };
        assert_eq!(
            resumed_line(&r),
            "ringleader-elastic resumed generation=3 world=2 rank=1 step=17 restored_step=15 steps_lost=2 source=broadcast"
        );
        assert_eq!(
            rank_stats_line(3, 1, 20, 12.5, 0.25),
            "ringleader-rank-stats generation=3 rank=1 step=20 compute_ms=12.500 wait_ms=0.250"
        );
    }
}
