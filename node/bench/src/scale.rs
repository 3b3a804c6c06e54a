//! `ringleader-bench scale N…`: a cluster of N real nodes on 127.0.0.1, per N one line
//!
//! ```text
//! scale nodes=N converge_s=… detect_s=… failover_s=… submit_ms_p50=… submit_ms_p99=… wide_job_s=… status_ms=… chief_cpu_pct=… node_rss_mb=… idle_cpu_pct=… chief_kib_per_entry=…
//! ```
//!
//! - `converge_s`: from the start of every node at once (as hosts of a cluster boot: each is
//!   spawned behind a gate that then opens for all, see `LocalCluster::start_many`) until the
//!   first node sees all N alive.
//! - `idle_cpu_pct`, `chief_cpu_pct`, `node_rss_mb`: once formed (a chief, its 3 or 5 voters) and
//!   [`SETTLE`] later, each node's CPU over [`IDLE_WINDOW`] (user + system, % of one core;
//!   the mean over nodes, and the chief's) and its resident memory (mean, MiB).
//! - `status_ms`: median latency of `GET /v1/status` on a follower, [`STATUS_CALLS`] calls.
//! - `submit_ms_p50`, `submit_ms_p99`: `POST /v1/jobs` of a trivial job to a follower
//!   (forwarded to the chief and committed), `--submits` one after another.
//! - `chief_kib_per_entry`: what the chief wrote (its `wchar` in `/proc/PID/io`: sockets and
//!   its logs) from before those submits until their jobs succeeded, over the log entries
//!   committed meanwhile (submits, placements, exits), heartbeats included: what replicating
//!   an entry to every member costs.
//! - `wide_job_s`: a command job (`true`) with one worker per node (`workers = N`,
//!   `placement = "spread"`), from submit until it succeeded.
//! - `detect_s`: kill -9 of a node that is neither chief nor voter, until every sampled
//!   survivor lists it as dead.
//! - `failover_s`: kill -9 of the chief, until every sampled survivor names the same new one.
//!
//! "Sampled survivors": the first node and up to [`SAMPLE`] others spread over the cluster
//! (polling all of 128 nodes every few milliseconds would load the host more than the
//! cluster does). Everything runs on this one host: at large N the figures are those of N
//! processes sharing its cores.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use ringleader::{api::status::StatusDoc, cli::local::LocalCluster};

/// Benchmark options.
#[derive(Clone, Debug, Args)]
pub struct BenchScaleArgs {
    /// Cluster sizes, one line each (e.g. `8 32 128`).
    #[arg(required = true)]
    pub nodes: Vec<usize>,
    /// Submissions timed for the latency percentiles.
    #[arg(long, default_value_t = 50)]
    pub submits: usize,
}

/// Bound on every wait of the benchmark.
const WAIT: Duration = Duration::from_secs(300);
/// Poll period while waiting, in milliseconds.
const POLL_MS: u64 = 20;
/// Survivors polled besides the first node.
pub const SAMPLE: usize = 7;
/// Quiet time after the cluster formed, before the idle window.
pub const SETTLE: Duration = Duration::from_secs(5);
/// The idle CPU window.
pub const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// `GET /v1/status` calls timed.
pub const STATUS_CALLS: usize = 20;
/// A trivial command job.
const TRIVIAL: &str = "name = \"bench\"\nkind = \"command\"\nworkers = 1\ncommand = [\"true\"]\n";

use crate::control::percentile;

/// Runs the benchmark at each size and prints its lines.
pub fn run(args: &BenchScaleArgs) -> Result<()> {
    for &n in &args.nodes {
        if n < 4 {
            bail!("bench-scale needs at least 4 nodes (a chief, voters and a victim), not {n}");
        }
        let root = tempfile::Builder::new()
            .prefix("ringleader-bench-scale-")
            .tempdir()?;
        let line = one_size(root.path(), n, args.submits)
            .with_context(|| format!("bench-scale at {n} nodes"))?;
        println!("{line}");
    }
    Ok(())
}

/// Up to `SAMPLE` indices spread over `candidates`, after `first`.
fn sample(first: usize, candidates: &[usize]) -> Vec<usize> {
    let others: Vec<usize> = candidates.iter().copied().filter(|&i| i != first).collect();
    let step = (others.len() / SAMPLE).max(1);
    let mut v = vec![first];
    v.extend(others.into_iter().step_by(step).take(SAMPLE));
    v
}

/// Polls `who`'s statuses until `cond` holds for all of them; the time it took.
fn wait_on(
    c: &LocalCluster,
    who: &[usize],
    what: &str,
    cond: impl Fn(&StatusDoc) -> bool,
) -> Result<f64> {
    let t0 = Instant::now();
    loop {
        let all = who
            .iter()
            .all(|&i| c.status(i).map(|s| cond(&s)).unwrap_or(false));
        if all {
            return Ok(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > WAIT {
            bail!("timed out after {WAIT:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

fn chief(s: &StatusDoc) -> Option<String> {
    s.chief.as_ref().map(|c| c.name.clone())
}

/// Bytes a process wrote through system calls (`wchar` of `/proc/PID/io`).
fn proc_written(pid: u32) -> Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no wchar in /proc io")
}

/// A process's CPU time (user + system) in clock ticks and resident memory in KiB.
fn proc_usage(pid: u32) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').context("malformed /proc stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after ')' … state.
    let ticks = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Ok((ticks, rss_kib))
}

fn one_size(root: &std::path::Path, n: usize, submits: usize) -> Result<String> {
    let mut c = LocalCluster::new(crate::node_binary()?, root);
    let seed = collective::testing::unused_local_port();
    let mut nodes = vec![(
        "s-0".to_string(),
        vec!["--listen".to_string(), format!("127.0.0.1:{seed}")],
    )];
    for i in 1..n {
        nodes.push((
            format!("s-{i}"),
            vec!["--join".to_string(), format!("127.0.0.1:{seed}")],
        ));
    }
    let (_, t0) = c.start_many(&nodes)?;
    let everyone: Vec<usize> = (0..n).collect();
    // Progress on stderr about once a second: how many the first node sees alive, how many
    // suspect (a formation that lags is one of late joins or of suspicions) and how many in all.
    let shown = std::cell::Cell::new(0u64);
    wait_on(&c, &[0], "the first node to see every node alive", |s| {
        let alive = s.names_in("alive").len();
        let second = t0.elapsed().as_secs();
        if second > shown.get() {
            shown.set(second);
            let suspect = s.names_in("suspect").len();
            let known = s.members.len();
            eprintln!(
                "bench-scale: {second} s: the first node sees {alive} of {n} alive \
                 ({suspect} suspect, {known} known)"
            );
        }
        alive == n
    })?;
    let converge_s = t0.elapsed().as_secs_f64();
    eprintln!("bench-scale: {n} nodes alive after {converge_s:.2} s");
    let watchers = sample(0, &everyone);
    let policy = ringleader::control::voters::VoterConfig::default();
    let voters_wanted = if n >= policy.large_cluster_members {
        policy.voters_large
    } else {
        policy.voters_small
    };
    wait_on(&c, &watchers, "a chief and its voters", |s| {
        s.chief.is_some() && s.members.iter().filter(|m| m.voter).count() == voters_wanted
    })?;
    let formed = c.status(0)?;
    eprintln!("bench-scale: a chief and {voters_wanted} voters; idle window");
    let chief_name = chief(&formed).context("no chief")?;
    let chief_at = c
        .nodes
        .iter()
        .position(|x| x.name == chief_name)
        .context("the chief is not one of the nodes")?;

    // Idle.
    std::thread::sleep(SETTLE);
    let pids: Vec<u32> = c.nodes.iter().map(|x| x.pid().unwrap_or(0)).collect();
    let before: Vec<u64> = pids
        .iter()
        .map(|&p| proc_usage(p).map(|u| u.0))
        .collect::<Result<_>>()?;
    let w0 = Instant::now();
    std::thread::sleep(IDLE_WINDOW);
    let window = w0.elapsed().as_secs_f64();
    let after: Vec<(u64, u64)> = pids.iter().map(|&p| proc_usage(p)).collect::<Result<_>>()?;
    let tick =
        nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.context("no CLK_TCK")? as f64;
    let pct = |i: usize| 100.0 * (after[i].0 - before[i]) as f64 / tick / window;
    let idle_cpu_pct = (0..n).map(pct).sum::<f64>() / n as f64;
    let chief_cpu_pct = pct(chief_at);
    let node_rss_mb = after.iter().map(|a| a.1 as f64 / 1024.0).sum::<f64>() / n as f64;

    eprintln!("bench-scale: status, {submits} submits, a wide job");
    let follower = (0..n).find(|&i| i != chief_at).context("no follower")?;
    let client = c.nodes[follower].client();
    let mut status_ms = Vec::with_capacity(STATUS_CALLS);
    for _ in 0..STATUS_CALLS {
        let t = Instant::now();
        client.status()?;
        status_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // The chief's log index and bytes written before the submits (a first job, untimed,
    // gives the index: a job's document carries the state's applied index).
    let chief_client = c.nodes[chief_at].client();
    let first = client.submit(TRIVIAL)?;
    wait_on(&c, &[chief_at], "the first trivial job to succeed", |s| {
        s.jobs
            .iter()
            .any(|j| j.id == first && j.state == "succeeded")
    })?;
    let index0 = chief_client.job(&first)?.freshness.applied_index;
    let written0 = proc_written(pids[chief_at])?;
    let mut submit_ms = Vec::with_capacity(submits);
    let mut ids = Vec::with_capacity(submits);
    for _ in 0..submits {
        let t = Instant::now();
        ids.push(client.submit(TRIVIAL)?);
        submit_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    wait_on(&c, &[follower], "the trivial jobs to succeed", |s| {
        s.jobs
            .iter()
            .filter(|j| ids.contains(&j.id))
            .all(|j| j.state == "succeeded")
    })?;
    let last = ids.last().context("no submits")?;
    let index1 = chief_client.job(last)?.freshness.applied_index;
    let written = proc_written(pids[chief_at])?.saturating_sub(written0);
    let chief_kib_per_entry = written as f64 / 1024.0 / index1.saturating_sub(index0).max(1) as f64;

    let wide = format!(
        "name = \"wide\"\nkind = \"command\"\nworkers = {n}\nplacement = \"spread\"\ncommand = [\"true\"]\n"
    );
    let t = Instant::now();
    let id = client.submit(&wide)?;
    loop {
        // A follower answers for the job once it applied the entry (a moment after the
        // chief committed it): "no job" until then.
        let job = match client.job(&id) {
            Ok(job) => job,
            Err(_) if t.elapsed() < WAIT => {
                std::thread::sleep(Duration::from_millis(POLL_MS));
                continue;
            }
            Err(e) => return Err(e),
        };
        match job.state.as_str() {
            "succeeded" => break,
            "failed" | "cancelled" => bail!("the wide job ended {}", job.state),
            _ if t.elapsed() > WAIT => bail!("the wide job did not end within {WAIT:?}"),
            _ => std::thread::sleep(Duration::from_millis(POLL_MS)),
        }
    }
    let wide_job_s = t.elapsed().as_secs_f64();

    eprintln!("bench-scale: a node's death, then the chief's");
    // Death of a node that is neither chief nor voter.
    let voters: Vec<String> = formed
        .members
        .iter()
        .filter(|m| m.voter)
        .map(|m| m.name.clone())
        .collect();
    let victim = (0..n)
        .rev()
        .find(|&i| i != chief_at && i != 0 && !voters.contains(&c.nodes[i].name))
        .context("no node outside the chief and voters")?;
    let victim_name = c.nodes[victim].name.clone();
    let t = Instant::now();
    c.kill9(victim)?;
    let watchers = sample(0, &c.running());
    wait_on(&c, &watchers, "the victim to be seen dead", |s| {
        s.members
            .iter()
            .any(|m| m.name == victim_name && m.state == "dead")
    })?;
    let detect_s = t.elapsed().as_secs_f64();

    // Failover.
    let t = Instant::now();
    c.kill9(chief_at)?;
    let survivors: Vec<usize> = c.running();
    let watchers = sample(survivors[0], &survivors);
    loop {
        let names: Vec<Option<String>> = watchers
            .iter()
            .map(|&i| c.status(i).ok().and_then(|s| chief(&s)))
            .collect();
        let first = names[0].clone();
        if first.as_ref().is_some_and(|x| *x != chief_name) && names.iter().all(|x| *x == first) {
            break;
        }
        if t.elapsed() > WAIT {
            bail!("no new chief within {WAIT:?}: {names:?}");
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    let failover_s = t.elapsed().as_secs_f64();
    c.stop_all();

    Ok(format!(
        "scale nodes={n} converge_s={converge_s:.2} detect_s={detect_s:.2} failover_s={failover_s:.2} \
         submit_ms_p50={:.1} submit_ms_p99={:.1} wide_job_s={wide_job_s:.2} status_ms={:.1} \
         chief_cpu_pct={chief_cpu_pct:.2} node_rss_mb={node_rss_mb:.1} idle_cpu_pct={idle_cpu_pct:.2} \
         chief_kib_per_entry={chief_kib_per_entry:.1}",
        percentile(submit_ms.clone(), 50.0),
        percentile(submit_ms, 99.0),
        percentile(status_ms, 50.0),
    ))
}
