//! `ringleader-bench membership`: the membership figures, printed as `membership FIGURE=VALUE`.
//!
//! Real-process figures start a [`LocalCluster`] of the `ringleader` binary on 127.0.0.1; simulation
//! figures come from [`ringleader::cluster::membership::sim`] at default settings.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;

use ringleader::{cli::local::LocalCluster, cluster::membership};

/// Benchmark options.
#[derive(Clone, Debug, Args)]
pub struct BenchArgs {
    /// Real nodes to start.
    #[arg(long, default_value_t = 5)]
    pub nodes: usize,
    /// kill -9 runs for the detection median.
    #[arg(long, default_value_t = 5)]
    pub detect_runs: usize,
    /// Seconds with both cores saturated while counting false suspicions.
    #[arg(long, default_value_t = 60)]
    pub burn_s: u64,
    /// Simulated cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub sim: Vec<usize>,
    /// Simulated cluster sizes that start settled (views converged), for the steady-state
    /// and death-spread figures at scale (10 000 needs about 13 GB of memory).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    pub sim_settled: Vec<usize>,
    /// Message loss probability in the settled simulations.
    #[arg(long, default_value_t = 0.01)]
    pub sim_loss: f64,
    /// Skip the real-process figures.
    #[arg(long)]
    pub skip_real: bool,
    /// Skip the simulation figures.
    #[arg(long)]
    pub skip_sim: bool,
}

const WAIT: Duration = Duration::from_secs(60);

/// The median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Prints `AREA FIGURE=median` and `AREA FIGURE_all=run,run,…` for repeated measurements.
pub(crate) fn print_runs(area: &str, figure: &str, runs: &[f64]) {
    println!("{area} {figure}={:.3}", median(runs.to_vec()));
    let all: Vec<String> = runs.iter().map(|d| format!("{d:.3}")).collect();
    println!("{area} {figure}_all={}", all.join(","));
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &BenchArgs) -> Result<()> {
    if !args.skip_real {
        real(args)?;
    }
    if !args.skip_sim {
        for &n in &args.sim {
            let f = membership::sim::run_benchmark(n, membership::Config::default(), 0.0, 42);
            println!(
                "membership sim_converge_rounds_{n}={:.1}",
                f.converge_rounds
            );
            println!("membership sim_converge_s_{n}={:.3}", f.converge_s);
            println!("membership sim_detect_s_{n}={:.3}", f.detect_s);
        }
        for &n in &args.sim_settled {
            let start = Instant::now();
            let f = membership::sim::run_scale_benchmark(
                n,
                membership::Config::default(),
                args.sim_loss,
                42,
            );
            println!(
                "membership sim members={n} loss={} death_spread_s={:.3} false_suspicions={} \
                 bytes_per_member_s={:.0} updates_per_member_s={:.1} pieces_per_member_s={:.3} \
                 wall_s={:.0}",
                f.loss,
                f.death_spread_s,
                f.false_suspicions,
                f.bytes_per_member_s,
                f.updates_per_member_s,
                f.pieces_per_member_s,
                start.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}

fn real(args: &BenchArgs) -> Result<()> {
    let n = args.nodes;
    let exe = crate::node_binary()?;
    let root = tempfile::Builder::new()
        .prefix("ringleader-bench-")
        .tempdir()?;
    let mut cluster = LocalCluster::new(exe, root.path());
    cluster.start("bench-0", &[])?;
    let start = Instant::now();
    for i in 1..n {
        cluster.start_joining(&format!("bench-{i}"), &[])?;
    }
    cluster.wait_all(WAIT, "join", |s| s.names_in("alive").len() == n)?;
    println!(
        "membership join_converge_s={:.3}",
        start.elapsed().as_secs_f64()
    );

    let mut detect = Vec::new();
    for run in 0..args.detect_runs {
        let victim = 1 + run % (n - 1);
        let name = cluster.nodes[victim].name.clone();
        let t0 = Instant::now();
        cluster.kill9(victim)?;
        cluster.wait_all(WAIT, "death", |s| s.names_in("dead").contains(&name))?;
        detect.push(t0.elapsed().as_secs_f64());
        cluster.restart(victim)?;
        cluster.wait_all(WAIT, "rejoin", |s| s.names_in("alive").len() == n)?;
    }
    print_runs("membership", "detect_s", &detect);

    let suspicions = |c: &LocalCluster| -> Result<u64> {
        let mut total = 0;
        for i in c.running() {
            total += c.status(i).context("status")?.counters.suspicions;
        }
        Ok(total)
    };
    let before = suspicions(&cluster)?;
    let stop = Instant::now() + Duration::from_secs(args.burn_s);
    let burners: Vec<_> = (0..ringleader::cluster::meta::host_cpus())
        .map(|_| {
            std::thread::spawn(move || {
                let mut x = 0u64;
                while Instant::now() < stop {
                    for i in 0..100_000u64 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
                    }
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    for b in burners {
        let _ = b.join();
    }
    let after = suspicions(&cluster)?;
    println!("membership false_suspicions={}", after - before);
    cluster.stop_all();
    Ok(())
}
