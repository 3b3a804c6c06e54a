//! Soak: a 5-node cluster runs a stream of mixed jobs (train, search, command) for
//! `SOAK_MINUTES` (default 30) while faults hit it, and every node's memory and open file
//! descriptors are sampled; it fails if they grow past a stated bound or an acknowledged job
//! is lost. Long, so `#[ignore]`d: `scripts/soak.sh` runs it on a release build.
//!
//! - Workload: while fewer than [`LIVE_MAX`] jobs are pending or running, a job every 1–2 s
//!   to a random node that is up: a command job (half of them), a 2-worker digits train job
//!   with checkpoints, or a random search of 3 train trials. Every job has room for restarts.
//!   Nodes run with `--job-retention-s` [`RETENTION_S`], so ended jobs leave the live state
//!   (and their memory) as they would in a long-lived cluster.
//! - Faults, one every 30–60 s, the cluster formed again before the next: kill -9 and
//!   restart, or SIGTERM and restart, of a node other than the two witnesses; or a pause
//!   (SIGSTOP for 3–8 s, then SIGCONT) of any node, the chief included, which the others
//!   see as a failure (a new chief, re-formed rings) and the paused node must recover from.
//! - Sampling every [`SAMPLE_S`] s: `VmRSS` and the number of entries in `/proc/PID/fd` of
//!   every node. Growth is judged on the witnesses (nodes 0 and 1, never restarted, so one
//!   process each for the whole run): the mean of the last [`WINDOW_SAMPLES`] samples
//!   against the mean of the first that many after the warm-up (a fifth of the run, at
//!   most 5 minutes).
//!
//! Summary line: `soak minutes=… jobs=… faults=… rss_growth_mb=… fd_growth=…`, then the
//! details. Bounds: [`RSS_GROWTH_MB_MAX`] and [`FD_GROWTH_MAX`]; every acknowledged job must
//! exist and end `succeeded`.

mod common;

use std::{
    collections::BTreeMap,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use rand::{rngs::SmallRng, Rng, SeedableRng};
use ringleader::{
    api::client::ApiClient,
    cli::local::{LocalCluster, LocalNode},
};

const NODES: usize = 5;
/// Nodes that are never restarted (paused at most): growth is judged on them.
const WITNESSES: usize = 2;
const SOAK_MINUTES_DEFAULT: u64 = 30;
/// Jobs pending or running at most; the workload waits below it.
const LIVE_MAX: usize = 6;
/// Ended jobs leave the live state after this, in seconds.
const RETENTION_S: &str = "60";
/// Gap between two faults, in seconds (drawn uniformly).
const FAULT_GAP_S: (u64, u64) = (30, 60);
/// How long a pause lasts, in milliseconds (drawn uniformly).
const PAUSE_MS: (u64, u64) = (3_000, 8_000);
/// Sampling period, in seconds.
const SAMPLE_S: u64 = 10;
/// Samples averaged at each end of the judged span.
const WINDOW_SAMPLES: usize = 6;
/// Bound on a witness's resident memory growth, in MB.
const RSS_GROWTH_MB_MAX: f64 = 64.0;
/// Bound on a witness's open file descriptor growth.
const FD_GROWTH_MAX: f64 = 32.0;
/// Bound on forming again after a fault.
const FORM_WAIT: Duration = Duration::from_secs(120);
/// Bound on every job ending once the workload stops.
const DRAIN_WAIT: Duration = Duration::from_secs(300);

const TRAIN: &str = r#"
kind = "train"
workers = 2
max_restarts = 50
[model]
arch = "mlp"
hidden = [32]
[data]
dataset = "digits"
[train]
epochs = 2
max_steps = 80
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 20
keep = 2
commit_every_steps = 10
"#;

const SEARCH: &str = r#"
kind = "search"
max_restarts = 50
[model]
arch = "mlp"
hidden = [16]
[data]
dataset = "digits"
[train]
epochs = 1
max_steps = 30
batch_per_worker = 32
lr = 0.05
[checkpoint]
every_steps = 1000
[search]
algorithm = "random"
trials = 3
max_parallel = 2
metric = "val_accuracy"
direction = "max"
[[search.params]]
name = "train.lr"
type = "double"
min = 0.001
max = 0.5
scale = "log"
"#;

fn command(secs: u32) -> String {
    format!("kind = \"command\"\nmax_restarts = 50\ncommand = [\"sleep\", \"{secs}\"]\n")
}

/// Resident memory (kB) and open descriptors of process `pid`.
fn sample(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

fn formed(c: &LocalCluster, within: Duration) -> anyhow::Result<Duration> {
    c.wait_all(within, "formed", |s| {
        s.names_in("alive").len() == NODES
            && s.chief.is_some()
            && s.members.iter().filter(|m| m.voter).count() == 3
    })
}

/// What the workload and the fault driver share.
struct Shared {
    /// API addresses of the nodes that take submits now (not down, not paused).
    up: Mutex<BTreeMap<usize, String>>,
    /// Acknowledged job ids, by kind.
    acked: Mutex<Vec<(String, &'static str)>>,
    submit_errors: Mutex<u64>,
    stop: AtomicBool,
    /// The cluster's API token.
    token: Option<String>,
}

fn workload(shared: Arc<Shared>, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !shared.stop.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(rng.gen_range(1_000..2_000)));
        let up: Vec<String> = shared.up.lock().unwrap().values().cloned().collect();
        if up.is_empty() {
            continue;
        }
        let client = ApiClient::new(&up[rng.gen_range(0..up.len())], shared.token.clone());
        let live = client
            .status()
            .map(|s| {
                s.jobs
                    .iter()
                    .filter(|j| matches!(j.state.as_str(), "pending" | "running"))
                    .count()
            })
            .unwrap_or(LIVE_MAX);
        if live >= LIVE_MAX {
            continue;
        }
        let (kind, body) = match rng.gen_range(0..6) {
            0..=2 => ("command", command(rng.gen_range(1..4))),
            3 | 4 => ("train", TRAIN.to_string()),
            _ => ("search", SEARCH.to_string()),
        };
        n += 1;
        let spec = format!("name = \"soak-{kind}-{n}\"\n{body}");
        match client.submit(&spec) {
            Ok(id) => shared.acked.lock().unwrap().push((id, kind)),
            Err(_) => *shared.submit_errors.lock().unwrap() += 1,
        }
    }
}

/// Samples of one node process: (seconds since start, rss kB, fds).
type Samples = Vec<(f64, u64, u64)>;

fn mean(v: &[(f64, u64, u64)], f: impl Fn(&(f64, u64, u64)) -> u64) -> f64 {
    v.iter().map(|s| f(s) as f64).sum::<f64>() / v.len().max(1) as f64
}

#[test]
#[ignore = "30 minutes: run with scripts/soak.sh"]
fn soak_mixed_jobs_under_faults_without_growth() {
    let minutes = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(SOAK_MINUTES_DEFAULT)
        .max(1);
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("soak seed {seed}: {minutes} minutes");
    let mut rng = SmallRng::seed_from_u64(seed);
    let dir = tempfile::Builder::new()
        .prefix("rl-soak-")
        .tempdir()
        .unwrap();
    let extra: Vec<String> = ["--cpus", "4", "--job-retention-s", RETENTION_S]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut c = common::formed_cluster(dir.path(), "s", NODES, &extra, FORM_WAIT);
    let api = |node: &LocalNode| node.info.api_addr.clone();
    let shared = Arc::new(Shared {
        up: Mutex::new(c.nodes.iter().map(api).enumerate().collect()),
        acked: Mutex::new(Vec::new()),
        submit_errors: Mutex::new(0),
        stop: AtomicBool::new(false),
        token: c.token.clone(),
    });
    let load = {
        let shared = shared.clone();
        let seed = rng.gen();
        thread::spawn(move || workload(shared, seed))
    };

    let start = Instant::now();
    let end = start + Duration::from_secs(minutes * 60);
    let mut samples: Vec<Samples> = vec![Vec::new(); NODES];
    let mut next_sample = start;
    let mut next_fault = start + Duration::from_secs(rng.gen_range(FAULT_GAP_S.0..=FAULT_GAP_S.1));
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    while Instant::now() < end {
        if Instant::now() >= next_sample {
            for (i, node) in c.nodes.iter().enumerate() {
                if let Some((rss, fds)) = node.pid().and_then(sample) {
                    samples[i].push((start.elapsed().as_secs_f64(), rss, fds));
                }
            }
            next_sample += Duration::from_secs(SAMPLE_S);
        }
        if Instant::now() >= next_fault {
            let kind = match rng.gen_range(0..3) {
                0 => "kill9",
                1 => "sigterm",
                _ => "pause",
            };
            let victim = if kind == "pause" {
                rng.gen_range(0..NODES)
            } else {
                rng.gen_range(WITNESSES..NODES)
            };
            shared.up.lock().unwrap().remove(&victim);
            match kind {
                "pause" => {
                    let pid = c.nodes[victim].pid().unwrap();
                    signal(pid, "-STOP");
                    thread::sleep(Duration::from_millis(rng.gen_range(PAUSE_MS.0..PAUSE_MS.1)));
                    signal(pid, "-CONT");
                }
                _ => {
                    if kind == "kill9" {
                        c.kill9(victim).unwrap();
                    } else {
                        c.terminate(victim).unwrap();
                    }
                    thread::sleep(Duration::from_millis(rng.gen_range(500..4_000)));
                    // It comes back on new ports: it joins through a witness.
                    let mut args = extra.clone();
                    args.extend(["--join".to_string(), c.seed_of(0)]);
                    c.nodes[victim].args = args;
                    c.restart(victim).unwrap();
                }
            }
            let took =
                formed(&c, FORM_WAIT).unwrap_or_else(|e| panic!("after {kind} of s{victim}: {e}"));
            println!(
                "{:>6.0} s  {kind} s{victim}; formed again in {:.1} s",
                start.elapsed().as_secs_f64(),
                took.as_secs_f64()
            );
            shared
                .up
                .lock()
                .unwrap()
                .insert(victim, api(&c.nodes[victim]));
            *faults.entry(kind).or_default() += 1;
            next_fault =
                Instant::now() + Duration::from_secs(rng.gen_range(FAULT_GAP_S.0..=FAULT_GAP_S.1));
        }
        thread::sleep(Duration::from_millis(200));
    }
    shared.stop.store(true, Ordering::SeqCst);
    load.join().unwrap();

    // Every acknowledged job ends, and succeeds.
    let acked = shared.acked.lock().unwrap().clone();
    let client = c.nodes[0].client();
    let deadline = Instant::now() + DRAIN_WAIT;
    let mut by_state: BTreeMap<String, u32> = BTreeMap::new();
    let mut not_ok = Vec::new();
    for (id, kind) in &acked {
        let doc = loop {
            match client.job(id) {
                Ok(d) if matches!(d.state.as_str(), "succeeded" | "failed" | "cancelled") => {
                    break Some(d)
                }
                _ if Instant::now() > deadline => break None,
                _ => thread::sleep(Duration::from_millis(250)),
            }
        };
        match doc {
            Some(d) => {
                *by_state.entry(d.state.clone()).or_default() += 1;
                if d.state != "succeeded" {
                    not_ok.push(format!("{id} ({kind}): {} {:?}", d.state, d.events.last()));
                }
            }
            None => not_ok.push(format!("{id} ({kind}): not ended within {DRAIN_WAIT:?}")),
        }
    }

    // Growth on the witnesses.
    let warmup = (minutes as f64 * 60.0 / 5.0).min(300.0);
    let mut rss_growth_mb: f64 = 0.0;
    let mut fd_growth: f64 = 0.0;
    let mut detail = Vec::new();
    for (i, s) in samples.iter().enumerate().take(WITNESSES) {
        let after: Vec<_> = s.iter().copied().filter(|x| x.0 >= warmup).collect();
        let first = &after[..after.len().min(WINDOW_SAMPLES)];
        let last = &after[after.len().saturating_sub(WINDOW_SAMPLES)..];
        let rss = (mean(last, |x| x.1) - mean(first, |x| x.1)) / 1024.0;
        let fds = mean(last, |x| x.2) - mean(first, |x| x.2);
        rss_growth_mb = rss_growth_mb.max(rss);
        fd_growth = fd_growth.max(fds);
        detail.push(format!(
            "s{i}: rss {:.1} -> {:.1} MB, fds {:.1} -> {:.1}, peak rss {:.1} MB",
            mean(first, |x| x.1) / 1024.0,
            mean(last, |x| x.1) / 1024.0,
            mean(first, |x| x.2),
            mean(last, |x| x.2),
            s.iter().map(|x| x.1).max().unwrap_or(0) as f64 / 1024.0
        ));
    }
    let kinds = acked
        .iter()
        .fold(BTreeMap::<&str, u32>::new(), |mut m, (_, k)| {
            *m.entry(k).or_default() += 1;
            m
        });
    println!(
        "soak minutes={minutes} jobs={} faults={} rss_growth_mb={rss_growth_mb:.1} fd_growth={fd_growth:.1}",
        acked.len(),
        faults.values().sum::<u32>()
    );
    println!(
        "  jobs by kind {kinds:?}, by state {by_state:?}, submit errors {}; faults {faults:?}",
        shared.submit_errors.lock().unwrap()
    );
    for d in &detail {
        println!("  {d}");
    }
    assert!(not_ok.is_empty(), "jobs that did not succeed: {not_ok:#?}");
    assert!(
        rss_growth_mb <= RSS_GROWTH_MB_MAX,
        "resident memory grew {rss_growth_mb:.1} MB (bound {RSS_GROWTH_MB_MAX})"
    );
    assert!(
        fd_growth <= FD_GROWTH_MAX,
        "open descriptors grew {fd_growth:.1} (bound {FD_GROWTH_MAX})"
    );
    c.stop_all();
}
