//! `ringleader-bench elastic`: how fast an elastic train job gets going again after a fault,
//! printed as `elastic fault=F detect_s=… recover_s=… steps_lost=…`.
//!
//! Each fault runs on a fresh local cluster of 3 nodes (the `ringleader` binary on 127.0.0.1) training
//! the digits MLP on 3 workers (`min_workers = 2`, in-memory commits every
//! [`COMMIT_EVERY_STEPS`] steps), once it is past [`WARM_STEPS`] steps:
//! - `worker-kill`: SIGKILL rank 2's process;
//! - `host-kill`: rank 2's host loses power: its node and its worker are frozen at once
//!   (SIGSTOP: no packet, no connection reset leaves the host; gossip declares it dead);
//! - `hang`: SIGSTOP rank 2's process;
//! - `straggler`: rank 2's process throttled to 5 % of a core (cgroup v1 `cpu` quota; the
//!   line says `skipped` without the controller), with the job's samples/s before
//!   (`before_sps`), while throttled (`throttled_sps`) and after the re-form (`after_sps`);
//! - `join`: after a worker-kill, the member is taken back when it may rejoin.
//!
//! `detect_s` runs from the fault to the re-form committed in the log (for `join`: from the
//! moment the member may rejoin to the `joined` re-form); `recover_s` from the fault to the
//! first completed step of the new generation (a survivor's first `ringleader-rank-stats`
//! line of it; for `join`, the joiner's); `steps_lost` is what the survivors trained again.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;

use ringleader::{
    api::status::JobDoc,
    cli::local::{train_workers, LocalCluster, Throttle, CGROUP_CPU},
    domain::spec::REJOIN_AFTER_S_DEFAULT,
};

/// Steps the job trains before the fault.
pub const WARM_STEPS: u64 = 200;
/// In-memory commit interval of the benchmark's job, steps.
pub const COMMIT_EVERY_STEPS: u32 = 10;
/// Samples per worker per step.
const BATCH_PER_WORKER: usize = 32;
/// CPU share a straggler gets, percent of one core.
const STRAGGLER_PERCENT: u32 = 5;
/// Bound on every wait.
const WAIT: Duration = Duration::from_secs(120);
/// Poll period of logs and job documents, ms.
const POLL_MS: u64 = 10;

/// Benchmark options.
#[derive(Clone, Debug, Args)]
pub struct BenchElasticArgs {
    /// Faults to run, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "worker-kill,host-kill,hang,straggler,join"
    )]
    pub faults: Vec<String>,
}

fn spec() -> String {
    format!(
        r#"
name = "bench-elastic"
kind = "train"
workers = 3
min_workers = 2
max_workers = 3
max_restarts = 0
[model]
arch = "mlp"
hidden = [256, 256]
[data]
dataset = "digits"
[train]
epochs = 100000
max_steps = 1000000
batch_per_worker = {BATCH_PER_WORKER}
lr = 0.05
[checkpoint]
every_steps = 1000000
keep = 1
commit_every_steps = {COMMIT_EVERY_STEPS}
[elastic]
straggler_window = 20
"#
    )
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs the benchmark and prints its lines.
pub fn run(args: &BenchElasticArgs) -> Result<()> {
    for fault in &args.faults {
        let line = match fault.as_str() {
            "worker-kill" | "host-kill" | "hang" | "straggler" | "join" => one(fault)?,
            other => bail!("unknown fault {other:?}"),
        };
        println!("{line}");
    }
    Ok(())
}

/// A cluster with the job past its warm-up, and what the fault needs.
struct Bench {
    cluster: LocalCluster,
    id: String,
    /// PIDs by the rank they started as.
    pids: [u32; 3],
    /// Node index of rank 2.
    victim_node: usize,
    _root: tempfile::TempDir,
}

fn start() -> Result<Bench> {
    let root = tempfile::Builder::new()
        .prefix("ringleader-bench-elastic-")
        .tempdir()?;
    let mut c = LocalCluster::new(crate::node_binary()?, root.path());
    c.start("b0", &[])?;
    for i in 1..3 {
        c.start_joining(&format!("b{i}"), &[])?;
    }
    c.wait_all(WAIT, "formed with a chief", |s| {
        s.names_in("alive").len() == 3 && s.chief.is_some()
    })?;
    let id = c.nodes[0].client().submit(&spec())?;
    let doc = wait_job(&c, 0, &id, |d| {
        d.state == "running" && d.step.is_some_and(|s| s >= WARM_STEPS)
    })?;
    let mut pids = [0; 3];
    for (pid, rank) in train_workers(&id) {
        if let Some(slot) = pids.get_mut(rank as usize) {
            *slot = pid;
        }
    }
    if pids.contains(&0) {
        bail!("not every rank's process was found: {pids:?}");
    }
    let victim_node = c
        .nodes
        .iter()
        .position(|n| n.name == doc.ring[2])
        .context("rank 2's node")?;
    Ok(Bench {
        cluster: c,
        id,
        pids,
        victim_node,
        _root: root,
    })
}

fn wait_job(
    c: &LocalCluster,
    i: usize,
    id: &str,
    cond: impl Fn(&JobDoc) -> bool,
) -> Result<JobDoc> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(doc) = c.nodes[i].client().job(id) {
            if cond(&doc) {
                return Ok(doc);
            }
            if doc.state != "running" && doc.state != "pending" {
                bail!("job {id} ended {}: {:?}", doc.state, doc.history);
            }
        }
        if Instant::now() > deadline {
            bail!("job {id}: condition not met within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

/// Waits for the first log line starting with `prefix`; returns when it was seen.
fn wait_line(c: &LocalCluster, id: &str, prefix: &str) -> Result<(Instant, String)> {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(l) = c.job_log_lines(id, prefix).into_iter().next() {
            return Ok((Instant::now(), l));
        }
        if Instant::now() > deadline {
            bail!("no line {prefix:?} within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) -> Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
        .map_err(|e| anyhow!("signal {sig} to {pid}: {e}"))
}

/// The job's samples per second over `over`: steps done (its `step` metric) × the global
/// batch of its ring (a throttled ring runs in bursts, so a per-step rate would flatter it).
fn throughput(c: &LocalCluster, id: &str, over: Duration) -> Result<f64> {
    let step_of = || -> Result<(f64, usize)> {
        let doc = c.nodes[0].client().job(id)?;
        Ok((
            doc.metrics.get("step").copied().unwrap_or(0.0),
            doc.ring.len(),
        ))
    };
    let (s0, _) = step_of()?;
    let t0 = Instant::now();
    std::thread::sleep(over);
    let (s1, world) = step_of()?;
    Ok((s1 - s0) * (BATCH_PER_WORKER * world) as f64 / t0.elapsed().as_secs_f64())
}

fn one(fault: &str) -> Result<String> {
    if fault == "straggler" && !Throttle::available() {
        return Ok(format!(
            "elastic fault=straggler skipped=\"no cgroup v1 cpu controller at {CGROUP_CPU}\""
        ));
    }
    let mut b = start()?;
    let observer = if b.victim_node == 0 { 1 } else { 0 };
    let t0 = Instant::now();
    let t0_ms = wall_ms();
    let mut extra = String::new();
    let _throttle = match fault {
        "worker-kill" | "join" => {
            signal(b.pids[2], nix::sys::signal::Signal::SIGKILL)?;
            None
        }
        "host-kill" => {
            let node = b.cluster.nodes[b.victim_node]
                .pid()
                .context("rank 2's node")?;
            signal(node, nix::sys::signal::Signal::SIGSTOP)?;
            signal(b.pids[2], nix::sys::signal::Signal::SIGSTOP)?;
            None
        }
        "hang" => {
            signal(b.pids[2], nix::sys::signal::Signal::SIGSTOP)?;
            None
        }
        _ => {
            let before = throughput(&b.cluster, &b.id, Duration::from_secs(2))?;
            let throttle = Throttle::new(b.pids[2], STRAGGLER_PERCENT)?;
            extra = format!(" before_sps={before:.0}");
            Some(throttle)
        }
    };
    if fault == "straggler" {
        // What the ring runs at while one rank is throttled (before it is dropped).
        let throttled = throughput(&b.cluster, &b.id, Duration::from_secs(3))?;
        extra.push_str(&format!(" throttled_sps={throttled:.0}"));
    }
    let reformed = wait_job(&b.cluster, observer, &b.id, |d| d.generation >= 2)?;
    let reform = &reformed.history[1];
    let detect_s = reform.at_ms.saturating_sub(t0_ms) as f64 / 1e3;
    let (at, _) = wait_line(&b.cluster, &b.id, "ringleader-rank-stats generation=2 ")?;
    let recover_s = (at - t0).as_secs_f64();
    let (_, resumed) = wait_line(
        &b.cluster,
        &b.id,
        "ringleader-elastic resumed generation=2 ",
    )?;
    let steps_lost = field(&resumed, "steps_lost").unwrap_or("?").to_string();
    if fault == "straggler" {
        let after = throughput(&b.cluster, &b.id, Duration::from_secs(3))?;
        extra.push_str(&format!(" after_sps={after:.0}"));
    }
    let line = if fault == "join" {
        // The member may rejoin `elastic.rejoin_after_s` (the default here) after it left;
        // time the join from there.
        let eligible_ms = reform.at_ms + u64::from(REJOIN_AFTER_S_DEFAULT) * 1_000;
        let joined = wait_job(&b.cluster, observer, &b.id, |d| d.generation >= 3)?;
        let at_ms = joined.history[2].at_ms;
        let (at, _) = wait_line(&b.cluster, &b.id, "ringleader-rank-stats generation=3 ")?;
        let wall_at = wall_ms().saturating_sub(at.elapsed().as_millis() as u64);
        format!(
            "elastic fault=join detect_s={:.3} recover_s={:.3} steps_lost=0 reason=\"{}\"",
            at_ms.saturating_sub(eligible_ms) as f64 / 1e3,
            wall_at.saturating_sub(at_ms) as f64 / 1e3,
            joined.history[2].reason
        )
    } else {
        format!(
            "elastic fault={fault} detect_s={detect_s:.3} recover_s={recover_s:.3} steps_lost={steps_lost}{extra} reason=\"{}\"",
            reform.reason
        )
    };
    if fault == "host-kill" {
        let _ = signal(b.pids[2], nix::sys::signal::Signal::SIGKILL);
        b.cluster.kill9(b.victim_node)?;
    }
    if fault == "hang" {
        let _ = signal(b.pids[2], nix::sys::signal::Signal::SIGCONT);
    }
    let _ = b.cluster.nodes[observer]
        .client()
        .post::<serde_json::Value>(&format!("/v1/jobs/{}/cancel", b.id), "");
    drop(_throttle);
    b.cluster.stop_all();
    Ok(line)
}
