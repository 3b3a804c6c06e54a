//! `ringleader-bench`: the benchmarks' figures, one subcommand each (the `scripts/bench-*.sh`
//! run them): `membership`, `control`, `chief`, `elastic`, `scale`. A binary of its own, so
//! the `ringleader` binary ships none of them; those that need real nodes start the
//! `ringleader` binary that lies beside this one ([`node_binary`]).

mod chief;
mod control;
mod elastic;
mod membership;
mod scale;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

/// The benchmarks of a ringleader cluster.
#[derive(Parser)]
#[command(name = "ringleader-bench", version)]
struct Bench {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Membership benchmark (scripts/bench-membership.sh runs this).
    Membership(membership::BenchArgs),
    /// Elastic-training benchmark (scripts/bench-elastic.sh runs this).
    Elastic(elastic::BenchElasticArgs),
    /// The chief's decision and the state's apply at size (scripts/bench-chief.sh runs this).
    Chief(chief::BenchChiefArgs),
    /// Control-plane benchmark (scripts/bench-control.sh runs this).
    Control(control::BenchControlArgs),
    /// Scale benchmark: N real nodes on this host (scripts/bench-scale.sh runs this).
    Scale(scale::BenchScaleArgs),
}

/// The `ringleader` binary the real-process benchmarks start: the one in this binary's
/// folder (`cargo build` puts both in `target/<profile>/`).
fn node_binary() -> Result<PathBuf> {
    let node = std::env::current_exe()?.with_file_name("ringleader");
    if !node.is_file() {
        bail!(
            "no ringleader binary at {} (build it beside ringleader-bench: cargo build --workspace)",
            node.display()
        );
    }
    Ok(node)
}

fn main() {
    let bench = Bench::parse();
    ringleader::cli::closed_pipe::end_quietly();
    let result = match &bench.command {
        Cmd::Membership(args) => membership::run(args),
        Cmd::Chief(args) => chief::run(args),
        Cmd::Control(args) => control::run(args),
        Cmd::Scale(args) => scale::run(args),
        Cmd::Elastic(args) => elastic::run(args),
    };
    if let Err(e) = result {
        if ringleader::cli::closed_pipe::is_closed_pipe(&e) {
            std::process::exit(0);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
