//! The hidden `ringleader train-worker` subcommand: one rank of a `kind = "train"` job, as
//! the node's supervisor launches it (see `crate::jobs::launch`). The body is the trainer's
//! [`trainer::worker::run`], shared with the trainer's own `train-worker` binary.

use anyhow::Context;

/// Runs one worker process to its end.
pub fn run_worker(args: trainer::worker::WorkerArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Not eprintln! on a failed write (a full disk under the log file): that panics,
        // and would take down whatever task logged.
        .log_internal_errors(false)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the worker runtime")?
        .block_on(trainer::worker::run(args))
}
