//! `ringleader-bench control`: the control plane's figures, printed as `control FIGURE=VALUE`.
//!
//! - `failover_s`: 5 nodes (3 voters), kill -9 the chief → every survivor names the same new
//!   chief; median of `--failover-runs` (`failover_s_all` lists them). The killed node is
//!   restarted and the cluster waited back to 5 alive and 3 voters between rounds.
//! - `submit_ms_p50`, `submit_ms_p99`: latency of `POST /v1/jobs` to a follower (forwarded to
//!   the chief and committed), `--submits` trivial jobs one after another.
//! - `jobs_per_s`: a fresh 3-node cluster; `--jobs` trivial command jobs (`command =
//!   ["true"]`, 1 worker) submitted from `--threads` threads as fast as the API accepts,
//!   counted from the first submit until every one has succeeded.
//!
//! Every node runs the `ringleader` binary on 127.0.0.1 through [`LocalCluster`], with fixed p2p ports so
//! a restarted node is found again at its address.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Args;

use ringleader::{
    api::{client::ApiClient, status::StatusDoc},
    cli::local::LocalCluster,
};

/// Benchmark options.
#[derive(Clone, Debug, Args)]
pub struct BenchControlArgs {
    /// kill -9 rounds for the failover median.
    #[arg(long, default_value_t = 5)]
    pub failover_runs: usize,
    /// Submissions timed for the latency percentiles.
    #[arg(long, default_value_t = 200)]
    pub submits: usize,
    /// Trivial jobs for the throughput figure.
    #[arg(long, default_value_t = 300)]
    pub jobs: usize,
    /// Submitting threads for the throughput figure.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
}

/// Bound on every wait of the benchmark.
const WAIT: Duration = Duration::from_secs(120);
/// Poll period while waiting, in milliseconds.
const POLL_MS: u64 = 20;
/// A trivial command job.
const TRIVIAL: &str = "name = \"bench\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n";

use crate::membership::print_runs;

/// The `p`-th percentile (nearest rank) of `v`.
pub(crate) fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn free_port() -> Result<u16> {
    Ok(collective::testing::unused_local_port())
}

/// Starts `n` nodes on fixed p2p ports and waits for n alive, a chief and the voters.
fn formed(root: &std::path::Path, n: usize) -> Result<LocalCluster> {
    let mut c = LocalCluster::new(crate::node_binary()?, root);
    let seed = free_port()?;
    c.start("ctl-0", &["--listen".into(), format!("127.0.0.1:{seed}")])?;
    for i in 1..n {
        let args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{}", free_port()?),
            "--join".to_string(),
            format!("127.0.0.1:{seed}"),
        ];
        c.start(&format!("ctl-{i}"), &args)?;
    }
    wait_formed(&c, n)?;
    Ok(c)
}

fn voters(n: usize) -> usize {
    if n >= 3 {
        3
    } else {
        1
    }
}

fn wait_formed(c: &LocalCluster, n: usize) -> Result<()> {
    c.wait_all(WAIT, "formed with a chief and voters", |s| {
        s.names_in("alive").len() == n
            && s.chief.is_some()
            && s.members.iter().filter(|m| m.voter).count() == voters(n)
    })?;
    Ok(())
}

fn chief_name(s: &StatusDoc) -> Option<String> {
    s.chief.as_ref().map(|c| c.name.clone())
}

/// Runs the benchmark and prints its figures.
pub fn run(args: &BenchControlArgs) -> Result<()> {
    let root = tempfile::Builder::new()
        .prefix("ringleader-bench-control-")
        .tempdir()?;
    {
        let mut c = formed(&root.path().join("five"), 5)?;
        failover(&mut c, args.failover_runs)?;
        submit_latency(&c, args.submits)?;
        c.stop_all();
    }
    let mut c = formed(&root.path().join("three"), 3)?;
    throughput(&c, args.jobs, args.threads)?;
    c.stop_all();
    Ok(())
}

fn failover(c: &mut LocalCluster, runs: usize) -> Result<()> {
    let mut times = Vec::new();
    for _ in 0..runs {
        let old = chief_name(&c.status(c.running()[0])?).context("no chief")?;
        let victim = c
            .nodes
            .iter()
            .position(|n| n.name == old)
            .context("chief not in the cluster")?;
        let t0 = Instant::now();
        c.kill9(victim)?;
        // Every survivor names the same chief, and not the dead one.
        loop {
            let names: Vec<Option<String>> = c
                .running()
                .into_iter()
                .map(|i| c.status(i).ok().and_then(|s| chief_name(&s)))
                .collect();
            let first = names[0].clone();
            if first.as_ref().is_some_and(|n| *n != old) && names.iter().all(|n| *n == first) {
                break;
            }
            if t0.elapsed() > WAIT {
                bail!("no new chief within {WAIT:?}: {names:?}");
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
        times.push(t0.elapsed().as_secs_f64());
        c.restart(victim)?;
        wait_formed(c, 5)?;
    }
    print_runs("control", "failover_s", &times);
    Ok(())
}

fn submit_latency(c: &LocalCluster, submits: usize) -> Result<()> {
    let chief = chief_name(&c.status(0)?).context("no chief")?;
    let follower = c
        .running()
        .into_iter()
        .find(|&i| c.nodes[i].name != chief)
        .context("no follower")?;
    let client = c.nodes[follower].client();
    let mut ms = Vec::with_capacity(submits);
    for _ in 0..submits {
        let t0 = Instant::now();
        client.submit(TRIVIAL)?;
        ms.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    println!("control submit_ms_p50={:.2}", percentile(ms.clone(), 50.0));
    println!("control submit_ms_p99={:.2}", percentile(ms, 99.0));
    Ok(())
}

fn throughput(c: &LocalCluster, jobs: usize, threads: usize) -> Result<()> {
    let threads = threads.max(1);
    let clients: Arc<Vec<ApiClient>> = Arc::new(
        c.running()
            .into_iter()
            .map(|i| c.nodes[i].client())
            .collect(),
    );
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let clients = clients.clone();
            std::thread::spawn(move || -> Result<Vec<String>> {
                let mut ids = Vec::new();
                for k in (t..jobs).step_by(threads) {
                    ids.push(clients[k % clients.len()].submit(TRIVIAL)?);
                }
                Ok(ids)
            })
        })
        .collect();
    let mut ids = Vec::with_capacity(jobs);
    for h in handles {
        ids.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a submitting thread panicked"))??,
        );
    }
    let submitted_s = t0.elapsed().as_secs_f64();
    let ids: std::collections::BTreeSet<String> = ids.into_iter().collect();
    loop {
        let s = c.status(0)?;
        let mine = s.jobs.iter().filter(|j| ids.contains(&j.id));
        let (mut ok, mut failed) = (0, 0);
        for j in mine {
            match j.state.as_str() {
                "succeeded" => ok += 1,
                "failed" | "cancelled" => failed += 1,
                _ => {}
            }
        }
        if failed > 0 {
            bail!("{failed} trivial jobs did not succeed");
        }
        if ok == ids.len() {
            break;
        }
        if t0.elapsed() > WAIT {
            bail!("{ok}/{} jobs succeeded within {WAIT:?}", ids.len());
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    let total_s = t0.elapsed().as_secs_f64();
    println!("control jobs_submit_s={submitted_s:.3}");
    println!("control jobs_per_s={:.1}", ids.len() as f64 / total_s);
    Ok(())
}
