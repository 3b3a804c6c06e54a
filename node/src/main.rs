//! The `ringleader` binary.

use clap::Parser;
use ringleader::cli::{Cli, Cmd};

/// The log filter unless `RUST_LOG` says otherwise: openraft's and libp2p's internals
/// (elections, replication, connection churn) are for debugging, not an operator's log.
/// openraft's replication logs every failed call to an unreachable member (an ERROR and a
/// WARN each retry): silenced, the node logs each member's reach once per change instead
/// (`control::reach`).
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,openraft::replication=off,libp2p=warn";

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only for a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Not eprintln! on a failed write (a full disk under the log file): that panics,
        // and would take down whatever task logged.
        .log_internal_errors(false)
        .init();
}

fn main() {
    // Before anything else, while this is the only thread (no runtime, no logger, no CUDA
    // call yet), so no other thread can read the environment while it changes: the same
    // contract as edition 2024's `unsafe` `set_var`. The node's GPU discovery and every
    // rank it gives devices then number them in PCI bus order.
    ringleader::gpus::use_pci_device_order();
    let cli = Cli::parse();
    if !matches!(cli.command, Cmd::Node(_)) {
        ringleader::cli::closed_pipe::end_quietly();
    }
    let result = match &cli.command {
        Cmd::Node(args) => {
            init_logging();
            // Before the runtime's threads exist, so that they inherit it.
            ringleader::tasks::relax_timers();
            args.clone().into_config().and_then(|config| {
                tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .map_err(anyhow::Error::from)
                    .and_then(|rt| rt.block_on(ringleader::node::run(config)))
            })
        }
        Cmd::Status(args) => ringleader::cli::status(&cli, args),
        Cmd::Submit { file } => ringleader::cli::submit(&cli, file),
        Cmd::Jobs(args) => ringleader::cli::jobs(&cli, args),
        Cmd::Job {
            action: Some(cmd), ..
        } => ringleader::cli::preempt::run(&cli, cmd),
        Cmd::Job { id, watch, .. } => {
            ringleader::cli::job(&cli, id.as_deref().unwrap_or_default(), *watch)
        }
        Cmd::Cancel { id } => ringleader::cli::cancel(&cli, id),
        Cmd::Trials { id } => ringleader::cli::trials(&cli, id),
        Cmd::Dataset(cmd) => ringleader::cli::datasets::run(&cli, cmd),
        Cmd::Token(cmd) => ringleader::cli::tokens::run(&cli, cmd),
        Cmd::Member(cmd) => ringleader::cli::tokens::run_member(&cli, cmd),
        Cmd::Key(cmd) => ringleader::cli::keys::run(&cli, cmd),
        Cmd::Quota(cmd) => ringleader::cli::sharing::run_quota(&cli, cmd),
        Cmd::Queue => ringleader::cli::sharing::run_queue(&cli),
        Cmd::Logs {
            id,
            follow,
            protocol,
        } => ringleader::cli::logs(&cli, id, *follow, *protocol),
        Cmd::TrainWorker(args) => ringleader::cli::train_worker::run_worker(args.clone()),
        Cmd::Demo => ringleader::cli::demo::run(),
        Cmd::Keygen { file } => ringleader::cli::keygen(file.clone()),
    };
    if let Err(e) = result {
        if ringleader::cli::closed_pipe::is_closed_pipe(&e) {
            std::process::exit(0);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
