//! One worker of a data-parallel job, for running a job without the control plane:
//! `scripts/train-local.sh N SPEC.toml` starts N of these on 127.0.0.1. The body is
//! [`trainer::worker::run`], shared with the node's hidden `ringleader train-worker`.

use clap::Parser;
use trainer::worker::WorkerArgs;

#[derive(Debug, Parser)]
#[command(about = "one worker of a local data-parallel training job")]
struct Args {
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    trainer::worker::run(Args::parse().worker).await
}
