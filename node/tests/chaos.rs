//! Chaos: churn of a 5-node cluster under a stream of submits, recorded as a history and
//! judged by a checker afterwards (as Jepsen does).
//!
//! The driver starts 5 real nodes and waits for a formed cluster (5 alive, a chief, 3
//! voters). For `CHAOS_SECONDS` (default 30) it then, at once:
//! - submits a short command job every 0.3-0.5 s to a random node that is up (a unique
//!   name, an idempotency token, 1 worker, `max_restarts` 100, a sleep of 0.5, 2 or 6 s);
//!   a submit that errs is retried once on another node with the same token; every
//!   submit's node, time and outcome (the id, or the error) goes into the history;
//! - every 3-6 s, kill -9s one node (the chief 40% of the time, read from `status`; 3 to 4
//!   kills in 30 s), restarts it after 0.5-4 s (it joins through a live node) and waits
//!   until the cluster is formed again before the next kill: one node down at a time, so
//!   the 3 voters keep a quorum;
//! - samples every node's `status` (term, chief) every 100 ms, and the running jobs'
//!   documents (attempt) from one node every 250 ms;
//! - scans `/proc` every 50 ms for the jobs' worker processes. Each worker writes a marker
//!   file `<job>.<attempt>.<generation>.<rank>.<pid>` with its start and end times (wall
//!   clock, ns) and its node's pid; a worker killed before its end is given the last time
//!   the scan saw it alive, so every overlap reported is certain.
//!
//! Then every node is up, and the checker asserts:
//! - (a) every submit that returned an id exists on every node and is `succeeded` within
//!   90 s, and its worker ran to its end at least once; a submit that erred may or may not
//!   exist (it may have committed), and whatever exists finishes too; no two jobs have
//!   one name, and submits of one name (a retry with its token) returned one id;
//! - (b) no term ever had two chiefs, over every sample of every node, and no node's term
//!   ever went back (its restarts included);
//! - (c) no job ever had two attempts' workers alive at once (an orphan of a killed node's
//!   attempt running beside the next attempt counts), nor two processes of the same
//!   attempt and rank; and a node's view of a job's attempt never goes back while that
//!   node process lives.
//!
//! Also reported, as a note: workers that outlived their node's kill -9 (the cause of most
//! overlaps: a worker runs in its own process group, which nothing kills when its node is
//! killed).
//!
//! It prints the history's notable events and a summary line, `chaos seconds=… submits=…
//! acked=… kills=… chiefs_per_term_max=… overlapping_attempts=… lost_acked=…`, which
//! `scripts/chaos.sh` (the long run) picks up. `CHAOS_SEED` replays a run's choices (which
//! node, when, which sleep); the seed is printed first. On a failure the nodes' data
//! directories (logs, markers) are kept and their path printed.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use rand::{rngs::SmallRng, Rng, SeedableRng};
use ringleader::{
    api::{client::ApiClient, status::JobSummary},
    cli::local::{process_alive, LocalCluster},
};

/// Nodes in the cluster.
const NODES: usize = 5;
/// Voters a formed cluster has.
const VOTERS: usize = 3;
/// Length of the chaos when `CHAOS_SECONDS` is unset, in seconds.
const CHAOS_SECONDS_DEFAULT: u64 = 30;
/// Cpus each node offers (room for 20 one-cpu workers in all; the load is about 4).
const NODE_CPUS: &str = "4";
/// Gap between two submits, in milliseconds (drawn uniformly).
const SUBMIT_GAP_MS: (u64, u64) = (300, 500);
/// Pause before a submit that erred is retried on another node, in milliseconds.
const SUBMIT_RETRY_PAUSE_MS: u64 = 300;
/// Each job's sleep, in seconds, with its weight: mostly short, a few long enough to be
/// running across a kill and a restart.
const JOB_SLEEPS_S: [(&str, u32); 3] = [("0.5", 6), ("2", 3), ("6", 1)];
/// `max_restarts` of every job: a job may lose its node at each kill.
const JOB_MAX_RESTARTS: u32 = 100;
/// Quiet time before each kill, in milliseconds (drawn uniformly).
const KILL_GAP_MS: (u64, u64) = (3_000, 6_000);
/// How long a killed node stays down, in milliseconds (drawn uniformly): from shorter than
/// failure detection (it comes back suspect) to longer (it was declared dead).
const DOWN_MS: (u64, u64) = (500, 4_000);
/// Chance that a kill picks the chief.
const CHIEF_VICTIM_P: f64 = 0.4;
/// Bound on forming the cluster, at the start and after each restart.
const FORM_WAIT: Duration = Duration::from_secs(60);
/// Bound on every job finishing once the chaos stops.
const FINISH_WAIT: Duration = Duration::from_secs(90);
/// Period of the status sampler, in milliseconds.
const STATUS_POLL_MS: u64 = 100;
/// Period of the job sampler, in milliseconds.
const JOBS_POLL_MS: u64 = 250;
/// Period of the `/proc` scan, in milliseconds.
const PROC_SCAN_MS: u64 = 50;
/// Violations of each kind printed in full.
const SHOWN_MAX: usize = 20;

/// Milliseconds of wall clock since the Unix epoch (the markers' clock, in ms).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// A node the workload may talk to: its API address and how many times it was started
/// before (its life; a restarted replica may serve an older state than before).
#[derive(Clone, Debug)]
struct Life {
    api: String,
    /// The cluster's API token.
    token: Option<String>,
    life: u32,
}

/// Which nodes are up, shared by the driver with the workload and the samplers.
#[derive(Clone)]
struct Up(Arc<Mutex<Vec<Option<Life>>>>);

impl Up {
    fn snapshot(&self) -> Vec<(usize, Life)> {
        let v = self.0.lock().unwrap();
        v.iter()
            .enumerate()
            .filter_map(|(i, l)| l.clone().map(|l| (i, l)))
            .collect()
    }

    fn set(&self, i: usize, life: Option<Life>) {
        self.0.lock().unwrap()[i] = life;
    }
}

/// One submit, as the client saw it.
#[derive(Clone, Debug)]
struct SubmitOp {
    name: String,
    node: usize,
    at_ms: u64,
    took_ms: u64,
    outcome: Result<String, String>,
}

/// What the nemesis did.
#[derive(Clone, Debug)]
enum NemesisOp {
    Kill {
        at_ms: u64,
        node: usize,
        chief: bool,
    },
    Restart {
        at_ms: u64,
        node: usize,
        formed_after_ms: Option<u64>,
    },
}

/// The history: everything observed, judged by [`check`] once the chaos is over.
#[derive(Default)]
struct History {
    /// When the chaos began (wall clock, ms): times in reports are relative to it.
    t0: u64,
    submits: Vec<SubmitOp>,
    nemesis: Vec<NemesisOp>,
    /// term → chief id → (first seen at, by node, name).
    chiefs: BTreeMap<u64, BTreeMap<String, (u64, usize, String)>>,
    /// Node → the highest term it reported (a Raft term never goes back on a node, its
    /// restarts included: the vote is on disk).
    term_seen: BTreeMap<usize, u64>,
    /// A node reported a lower term than it had before.
    term_regressions: Vec<String>,
    status_samples: u64,
    /// (node, life, job id) → the highest attempt that node process served.
    attempt_seen: BTreeMap<(usize, u32, String), u32>,
    /// A node process served a lower attempt than it had served before.
    attempt_regressions: Vec<String>,
    job_samples: u64,
    /// Worker pid → (first, last) time the `/proc` scan saw it alive.
    procs: BTreeMap<u32, (u64, u64)>,
    /// Node process pid → which node, which life, and when that life was killed.
    node_pids: BTreeMap<u32, NodeLife>,
}

/// One life of a node: from a start to a kill.
#[derive(Clone, Debug)]
struct NodeLife {
    node: usize,
    life: u32,
    killed_ms: Option<u64>,
}

type Shared = Arc<Mutex<History>>;

/// A job's spec: `name`, sleeping `sleep_s`, its worker writing its marker under `marks`
/// (`start <ns> <its node's pid>`, then `end <ns>` if it runs to its end).
fn job_spec(name: &str, sleep_s: &str, marks: &Path) -> String {
    // A TOML literal string: the script holds double quotes and no single quote. The worker
    // writes only to its marker (its stdout may be a pipe to a dead node).
    let script = format!(
        "m={}/$RINGLEADER_JOB_ID.$RINGLEADER_ATTEMPT.$RINGLEADER_GENERATION.$RANK.$$; \
         echo \"start $(date +%s%N) $PPID\" > $m; sleep {sleep_s}; echo \"end $(date +%s%N)\" >> $m",
        marks.display()
    );
    format!(
        "name = \"{name}\"\nkind = \"command\"\nworkers = 1\nmax_restarts = {JOB_MAX_RESTARTS}\n\
         command = [\"sh\", \"-c\", '{script}']\n"
    )
}

fn submit_once(life: &Life, spec: &str, token: &str) -> Result<String, String> {
    let client = ApiClient::new(&life.api, life.token.clone());
    client
        .post::<serde_json::Value>(&format!("/v1/jobs?token={token}"), spec)
        .map_err(|e| e.to_string())
        .and_then(|v| {
            v["id"]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no id in {v}"))
        })
}

/// The workload: a submit every 0.3-0.5 s to a random up node until `stop`.
fn submitter(seed: u64, up: Up, history: Shared, marks: PathBuf, stop: Arc<AtomicBool>) {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_5b17);
    let weights: u32 = JOB_SLEEPS_S.iter().map(|(_, w)| w).sum();
    let mut k = 0u32;
    while !stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(
            rng.gen_range(SUBMIT_GAP_MS.0..=SUBMIT_GAP_MS.1),
        ));
        let mut pick = rng.gen_range(0..weights);
        let sleep_s = JOB_SLEEPS_S
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w;
                pick = pick.saturating_sub(*w);
                hit
            })
            .map_or("0.5", |(s, _)| s);
        let name = format!("chaos-{k:05}");
        let token = format!("chaos-{seed}-{k}");
        k += 1;
        let spec = job_spec(&name, sleep_s, &marks);
        let mut tried: Vec<usize> = Vec::new();
        for attempt in 0..2 {
            let nodes: Vec<(usize, Life)> = up
                .snapshot()
                .into_iter()
                .filter(|(i, _)| !tried.contains(i))
                .collect();
            if nodes.is_empty() {
                break;
            }
            let (node, life) = nodes[rng.gen_range(0..nodes.len())].clone();
            tried.push(node);
            let at_ms = wall_ms();
            let outcome = submit_once(&life, &spec, &token);
            let ok = outcome.is_ok();
            history.lock().unwrap().submits.push(SubmitOp {
                name: name.clone(),
                node,
                at_ms,
                took_ms: wall_ms() - at_ms,
                outcome,
            });
            if ok || attempt == 1 {
                break;
            }
            thread::sleep(Duration::from_millis(SUBMIT_RETRY_PAUSE_MS));
        }
    }
}

/// Samples every up node's (term, chief) every 100 ms, and from one node (in turn) the
/// attempts of the running jobs every 250 ms, until `stop`.
fn sampler(up: Up, history: Shared, stop: Arc<AtomicBool>) {
    let mut next_jobs = Instant::now();
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let round = Instant::now();
        let nodes = up.snapshot();
        for (i, life) in &nodes {
            let Ok(s) = ApiClient::new(&life.api, life.token.clone()).status() else {
                continue;
            };
            let mut h = history.lock().unwrap();
            h.status_samples += 1;
            if let Some(term) = s.term {
                let before = h.term_seen.get(i).copied().unwrap_or(0);
                if term < before {
                    let note = format!(
                        "c{i} (life {}) reported term {term} after term {before}",
                        life.life
                    );
                    h.term_regressions.push(note);
                }
                h.term_seen.insert(*i, before.max(term));
            }
            if let (Some(chief), Some(term)) = (s.chief, s.term) {
                h.chiefs
                    .entry(term)
                    .or_default()
                    .entry(chief.id)
                    .or_insert((wall_ms(), *i, chief.name));
            }
        }
        if Instant::now() >= next_jobs && !nodes.is_empty() {
            next_jobs = Instant::now() + Duration::from_millis(JOBS_POLL_MS);
            turn += 1;
            let (i, life) = &nodes[turn % nodes.len()];
            sample_jobs(*i, life, &history);
        }
        let spent = round.elapsed();
        thread::sleep(Duration::from_millis(STATUS_POLL_MS).saturating_sub(spent));
    }
}

/// One node's running jobs and their attempts.
fn sample_jobs(node: usize, life: &Life, history: &Shared) {
    let client = ApiClient::new(&life.api, life.token.clone());
    let Ok(jobs) = client.get::<Vec<JobSummary>>("/v1/jobs?state=running&limit=10000") else {
        return;
    };
    for j in jobs.iter().filter(|j| j.state == "running") {
        let Ok(doc) = client.job(&j.id) else {
            continue;
        };
        let mut h = history.lock().unwrap();
        h.job_samples += 1;
        let key = (node, life.life, doc.id.clone());
        let before = h.attempt_seen.get(&key).copied().unwrap_or(0);
        if doc.attempt < before {
            let note = format!(
                "node {node} (life {}) served job {} ({}) at attempt {} after attempt {before}",
                life.life, doc.id, doc.name, doc.attempt
            );
            h.attempt_regressions.push(note);
        }
        h.attempt_seen.insert(key, before.max(doc.attempt));
    }
}

/// Every 50 ms, the live (not zombie) processes whose command line names `marks`: the
/// workers' shells, found whether their node lives or not.
fn proc_scanner(marks: PathBuf, history: Shared, stop: Arc<AtomicBool>) {
    let needle = marks.display().to_string();
    while !stop.load(Ordering::Relaxed) {
        let now = wall_ms();
        let pids = worker_pids(&needle);
        {
            let mut h = history.lock().unwrap();
            for pid in pids {
                let seen = h.procs.entry(pid).or_insert((now, now));
                seen.1 = now;
            }
        }
        thread::sleep(Duration::from_millis(PROC_SCAN_MS));
    }
}

/// PIDs of live processes whose command line contains `needle`.
fn worker_pids(needle: &str) -> Vec<u32> {
    ringleader::cli::local::processes()
        .into_iter()
        .filter(|(pid, args)| args.join(" ").contains(needle) && process_alive(*pid))
        .map(|(pid, _)| pid)
        .collect()
}

/// The driver's view of the cluster it churns.
struct Driver {
    c: LocalCluster,
    up: Up,
    history: Shared,
    lives: Vec<u32>,
    t0: u64,
}

impl Driver {
    fn log(&self, what: &str) {
        println!("chaos +{:>7.1}s {what}", (wall_ms() - self.t0) as f64 / 1e3);
    }

    /// Node `i` is up: the workload may use it; its pid names its workers' node.
    fn publish(&self, i: usize) {
        if let Some(pid) = self.c.nodes[i].pid() {
            let life = NodeLife {
                node: i,
                life: self.lives[i],
                killed_ms: None,
            };
            self.history.lock().unwrap().node_pids.insert(pid, life);
        }
        let life = Life {
            api: self.c.nodes[i].info.api_addr.clone(),
            token: self.c.nodes[i].token.clone(),
            life: self.lives[i],
        };
        self.up.set(i, Some(life));
    }

    /// Polls until every running node sees `NODES` alive, a chief and `VOTERS` voters.
    fn wait_formed(&self) -> anyhow::Result<Duration> {
        self.c
            .wait_all(FORM_WAIT, "formed: all alive, a chief, the voters", |s| {
                s.names_in("alive").len() == NODES
                    && s.chief.is_some()
                    && s.members.iter().filter(|m| m.voter).count() == VOTERS
            })
    }

    /// The index of the chief as some running node names it.
    fn chief(&self) -> Option<usize> {
        self.c.running().into_iter().find_map(|i| {
            let name = self.c.status(i).ok()?.chief?.name;
            self.c.nodes.iter().position(|n| n.name == name)
        })
    }

    /// Restarts node `i`, joining through another running node.
    fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let seed = self
            .c
            .running()
            .into_iter()
            .find(|&j| j != i)
            .map(|j| self.c.seed_of(j))
            .ok_or_else(|| anyhow::anyhow!("no running node to join through"))?;
        self.c.nodes[i].args = vec!["--join".into(), seed, "--cpus".into(), NODE_CPUS.into()];
        self.c.restart(i)?;
        self.lives[i] += 1;
        self.publish(i);
        Ok(())
    }
}

/// A worker's run, from its marker file and the `/proc` scan.
#[derive(Clone, Debug)]
struct WorkerRun {
    job: String,
    attempt: u32,
    generation: u32,
    rank: u32,
    pid: u32,
    /// Its node's life, and when that life was killed.
    node: Option<NodeLife>,
    start_ms: u64,
    /// From the marker (it ran to its end), else now (alive at the end), else the last
    /// time the scan saw it alive (a lower bound: an overlap found with it is certain),
    /// else `None` (no end known).
    end_ms: Option<u64>,
    finished: bool,
}

/// Reads every marker under `marks`.
fn worker_runs(marks: &Path, h: &History) -> Vec<WorkerRun> {
    let mut out = Vec::new();
    for f in std::fs::read_dir(marks).into_iter().flatten().flatten() {
        let file = f.file_name().to_string_lossy().into_owned();
        // <job>.<attempt>.<generation>.<rank>.<pid>; the job id holds no dot.
        let parts: Vec<&str> = file.split('.').collect();
        let [job, attempt, generation, rank, pid] = parts[..] else {
            continue;
        };
        let num = |s: &str| s.parse::<u32>().ok();
        let (Some(attempt), Some(generation), Some(rank), Some(pid)) =
            (num(attempt), num(generation), num(rank), num(pid))
        else {
            continue;
        };
        let text = std::fs::read_to_string(f.path()).unwrap_or_default();
        let stamp = |what: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(what)?
                        .split_whitespace()
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .map(|ns| ns / 1_000_000)
        };
        let Some(start_ms) = stamp("start ") else {
            continue;
        };
        let node = text
            .lines()
            .find_map(|l| l.strip_prefix("start ")?.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
            .and_then(|ppid| h.node_pids.get(&ppid).cloned());
        let end = stamp("end ");
        let end_ms = end
            .or_else(|| process_alive(pid).then(wall_ms))
            .or_else(|| h.procs.get(&pid).map(|(_, last)| *last));
        out.push(WorkerRun {
            job: job.to_string(),
            attempt,
            generation,
            rank,
            pid,
            node,
            start_ms,
            end_ms,
            finished: end.is_some(),
        });
    }
    out.sort_by_key(|r| (r.job.clone(), r.start_ms));
    out
}

/// What the checker found.
#[derive(Default)]
struct Verdict {
    acked: BTreeMap<String, String>,
    lost_acked: Vec<String>,
    unfinished: Vec<String>,
    never_ran: Vec<String>,
    duplicate_names: Vec<String>,
    split_ids: Vec<String>,
    chiefs_per_term_max: usize,
    two_chiefs: Vec<String>,
    overlapping_attempts: Vec<String>,
    duplicate_ranks: Vec<String>,
    unended: usize,
    alive_at_end: usize,
    outlived_node: Vec<String>,
    retried_jobs: usize,
}

impl Verdict {
    fn violations(&self) -> usize {
        self.lost_acked.len()
            + self.unfinished.len()
            + self.never_ran.len()
            + self.duplicate_names.len()
            + self.split_ids.len()
            + self.two_chiefs.len()
            + self.overlapping_attempts.len()
            + self.duplicate_ranks.len()
    }
}

/// One id per acknowledged name (the first, if a retry got another: see [`check`]).
fn acked(h: &History) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for op in &h.submits {
        if let Ok(id) = &op.outcome {
            out.entry(op.name.clone()).or_insert_with(|| id.clone());
        }
    }
    out
}

/// Polls every running node's job list until every acknowledged job is on it and every
/// chaos job is `succeeded` on every node, or the bound; returns (node, its last list).
fn wait_finished(
    c: &LocalCluster,
    acked: &BTreeMap<String, String>,
) -> Vec<(usize, Vec<JobSummary>)> {
    let deadline = Instant::now() + FINISH_WAIT;
    loop {
        let lists: Vec<(usize, Vec<JobSummary>)> = c
            .running()
            .into_iter()
            .map(|i| {
                let jobs = c.nodes[i]
                    .client()
                    .get("/v1/jobs?limit=10000")
                    .unwrap_or_default();
                (i, jobs)
            })
            .collect();
        let done = lists.iter().all(|(_, jobs)| {
            acked.values().all(|id| jobs.iter().any(|j| &j.id == id))
                && jobs
                    .iter()
                    .filter(|j| j.name.starts_with("chaos-"))
                    .all(|j| j.state == "succeeded")
        });
        if done || Instant::now() > deadline {
            return lists;
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// The checker: (a) acknowledged submits exist and finish, (b) one chief per term, (c) no
/// two attempts of a job at once. `lists`: each node's jobs once the wait for them ended.
fn check(
    c: &LocalCluster,
    h: &History,
    marks: &Path,
    lists: &[(usize, Vec<JobSummary>)],
) -> Verdict {
    let mut v = Verdict {
        acked: acked(h),
        ..Verdict::default()
    };
    // (a) Acknowledged submits: one id per name, on every node, succeeded.
    let mut ids_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for op in &h.submits {
        if let Ok(id) = &op.outcome {
            ids_of.entry(&op.name).or_default().insert(id);
        }
    }
    for (name, ids) in ids_of.iter().filter(|(_, ids)| ids.len() > 1) {
        v.split_ids
            .push(format!("{name}: submits with one token got ids {ids:?}"));
    }
    if lists.len() < NODES {
        let up: Vec<usize> = lists.iter().map(|(i, _)| *i).collect();
        v.lost_acked
            .push(format!("only nodes {up:?} were up to be asked"));
    }
    for (i, jobs) in lists {
        let node = &c.nodes[*i].name;
        for (name, id) in &v.acked {
            match jobs.iter().find(|j| &j.id == id) {
                None => v
                    .lost_acked
                    .push(format!("{name} ({id}) missing on {node}")),
                Some(j) if j.state != "succeeded" => v
                    .unfinished
                    .push(format!("{name} ({id}) {} on {node}", j.state)),
                Some(_) => {}
            }
        }
        let mut by_name: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for j in jobs.iter().filter(|j| j.name.starts_with("chaos-")) {
            by_name.entry(&j.name).or_default().push(&j.id);
            if !v.acked.contains_key(&j.name) && j.state != "succeeded" {
                v.unfinished.push(format!(
                    "{} ({}, its submit erred) {} on {node}",
                    j.name, j.id, j.state
                ));
            }
        }
        for (name, ids) in by_name.iter().filter(|(_, ids)| ids.len() > 1) {
            v.duplicate_names
                .push(format!("{name}: jobs {ids:?} on {node}"));
        }
    }
    // (c) Worker runs from the markers.
    let runs = worker_runs(marks, h);
    let finished_jobs: BTreeSet<&str> = runs
        .iter()
        .filter(|r| r.finished)
        .map(|r| r.job.as_str())
        .collect();
    for (name, id) in &v.acked {
        if !finished_jobs.contains(id.as_str()) {
            v.never_ran
                .push(format!("{name} ({id}): no worker ran to its end"));
        }
    }
    v.unended = runs.iter().filter(|r| r.end_ms.is_none()).count();
    let mut by_job: BTreeMap<&str, Vec<&WorkerRun>> = BTreeMap::new();
    for r in &runs {
        by_job.entry(&r.job).or_default().push(r);
    }
    for (job, rs) in &by_job {
        if rs.iter().map(|r| r.attempt).max() > Some(1) {
            v.retried_jobs += 1;
        }
        for (k, a) in rs.iter().enumerate() {
            for b in &rs[k + 1..] {
                let (Some(a_end), Some(b_end)) = (a.end_ms, b.end_ms) else {
                    continue;
                };
                if a.start_ms >= b_end || b.start_ms >= a_end {
                    continue;
                }
                let what = format!(
                    "{job}: {} and {} overlap",
                    run_text(a, h.t0),
                    run_text(b, h.t0)
                );
                let later = a.start_ms.max(b.start_ms);
                let what = match last_kill_before(h, later) {
                    Some((at, node)) => format!(
                        "{what}; the last kill before: c{node} at +{:.2}s",
                        at.saturating_sub(h.t0) as f64 / 1e3,
                    ),
                    None => format!("{what}; no kill before"),
                };
                if a.attempt != b.attempt {
                    v.overlapping_attempts.push(what);
                } else if (a.generation, a.rank) == (b.generation, b.rank) {
                    v.duplicate_ranks.push(what);
                }
            }
        }
    }
    // Workers alive now: orphans of killed nodes that outlived their job's end.
    v.alive_at_end = runs.iter().filter(|r| process_alive(r.pid)).count();
    // Workers that outlived their node (kill -9): not an invariant of the task's, the cause
    // of overlaps when they are.
    for r in &runs {
        let killed = r.node.as_ref().and_then(|n| n.killed_ms);
        if let (Some(k), Some(end)) = (killed, r.end_ms) {
            if end > k + PROC_SCAN_MS {
                v.outlived_node.push(format!(
                    "{}: {} ran {:.2}s past its node's kill",
                    r.job,
                    run_text(r, h.t0),
                    (end - k) as f64 / 1e3
                ));
            }
        }
    }
    // (b) One chief per term.
    v.chiefs_per_term_max = h.chiefs.values().map(BTreeMap::len).max().unwrap_or(0);
    for (term, chiefs) in h.chiefs.iter().filter(|(_, c)| c.len() > 1) {
        v.two_chiefs.push(format!("term {term}: {chiefs:?}"));
    }
    v
}

/// A worker run for a report: attempt, generation, rank, node, pid, times since `t0`.
fn run_text(r: &WorkerRun, t0: u64) -> String {
    let at = |ms: u64| format!("+{:.2}s", ms.saturating_sub(t0) as f64 / 1e3);
    let node = r
        .node
        .as_ref()
        .map_or("c?".to_string(), |n| format!("c{} life {}", n.node, n.life));
    format!(
        "[attempt {} gen {} rank {} on {node}, pid {}, {}..{}{}]",
        r.attempt,
        r.generation,
        r.rank,
        r.pid,
        at(r.start_ms),
        r.end_ms.map_or("?".into(), at),
        if r.finished { "" } else { " killed" }
    )
}

/// The last kill at or before `at_ms`: (time, node).
fn last_kill_before(h: &History, at_ms: u64) -> Option<(u64, usize)> {
    h.nemesis.iter().rev().find_map(|n| match n {
        NemesisOp::Kill { at_ms: t, node, .. } if *t <= at_ms => Some((*t, *node)),
        _ => None,
    })
}

fn show(what: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    println!("chaos VIOLATION {what}: {}", items.len());
    for item in items.iter().take(SHOWN_MAX) {
        println!("  {item}");
    }
}

#[test]
fn churn_with_a_checker() {
    let seconds = env_u64("CHAOS_SECONDS").unwrap_or(CHAOS_SECONDS_DEFAULT);
    let seed = env_u64("CHAOS_SEED").unwrap_or_else(|| wall_ms() ^ u64::from(std::process::id()));
    println!("chaos seed={seed} seconds={seconds} (replay with CHAOS_SEED={seed})");
    let root = tempfile::Builder::new()
        .prefix("rl-chaos-")
        .tempdir()
        .unwrap();
    let marks = root.path().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let mut rng = SmallRng::seed_from_u64(seed);

    // Phase: a formed 5-node cluster.
    let extra = vec!["--cpus".to_string(), NODE_CPUS.to_string()];
    let c = common::formed_cluster(&root.path().join("nodes"), "c", NODES, &extra, FORM_WAIT);
    let up = Up(Arc::new(Mutex::new(vec![None; NODES])));
    let history: Shared = Arc::default();
    let mut d = Driver {
        c,
        up: up.clone(),
        history: history.clone(),
        lives: vec![0; NODES],
        t0: wall_ms(),
    };
    history.lock().unwrap().t0 = d.t0;
    for i in 0..NODES {
        d.publish(i);
    }
    d.log("formed");

    // Phase: the workload, the samplers and the nemesis, for `seconds`.
    let stop = Arc::new(AtomicBool::new(false));
    let stop_samples = Arc::new(AtomicBool::new(false));
    let workload = {
        let (up, h, m, s) = (up.clone(), history.clone(), marks.clone(), stop.clone());
        thread::spawn(move || submitter(seed, up, h, m, s))
    };
    let samples = {
        let (up, h, s) = (up.clone(), history.clone(), stop_samples.clone());
        thread::spawn(move || sampler(up, h, s))
    };
    let scan = {
        let (h, m, s) = (history.clone(), marks.clone(), stop_samples.clone());
        thread::spawn(move || proc_scanner(m, h, s))
    };
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut stuck: Option<String> = None;
    loop {
        let gap = Duration::from_millis(rng.gen_range(KILL_GAP_MS.0..=KILL_GAP_MS.1));
        if Instant::now() + gap >= end {
            thread::sleep(end.saturating_duration_since(Instant::now()));
            break;
        }
        thread::sleep(gap);
        let chief = d.chief();
        let victim = match chief {
            Some(ch) if rng.gen_bool(CHIEF_VICTIM_P) => ch,
            _ => rng.gen_range(0..NODES),
        };
        let is_chief = chief == Some(victim);
        d.up.set(victim, None);
        let pid = d.c.nodes[victim].pid().unwrap();
        d.c.kill9(victim).unwrap();
        {
            let mut h = history.lock().unwrap();
            let at_ms = wall_ms();
            if let Some(l) = h.node_pids.get_mut(&pid) {
                l.killed_ms = Some(at_ms);
            }
            h.nemesis.push(NemesisOp::Kill {
                at_ms,
                node: victim,
                chief: is_chief,
            });
        }
        d.log(&format!(
            "kill -9 {}{}",
            d.c.nodes[victim].name,
            if is_chief { " (chief)" } else { "" }
        ));
        thread::sleep(Duration::from_millis(rng.gen_range(DOWN_MS.0..=DOWN_MS.1)));
        let at_ms = wall_ms();
        if let Err(e) = d.restart(victim) {
            stuck = Some(format!("restart of {}: {e:#}", d.c.nodes[victim].name));
            break;
        }
        let formed = d.wait_formed();
        d.log(&format!(
            "restarted {}: {}",
            d.c.nodes[victim].name,
            match &formed {
                Ok(t) => format!("formed again after {:.1}s", t.as_secs_f64()),
                Err(e) => format!("NOT formed: {e:#}"),
            }
        ));
        history.lock().unwrap().nemesis.push(NemesisOp::Restart {
            at_ms,
            node: victim,
            formed_after_ms: formed.as_ref().ok().map(|t| t.as_millis() as u64),
        });
        if let Err(e) = formed {
            stuck = Some(format!(
                "after restarting {}: {e:#}",
                d.c.nodes[victim].name
            ));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    workload.join().unwrap();
    d.log("chaos over; waiting for every job to finish");

    // Phase: the checker (the samplers go on through the wait for the jobs).
    let acked_now = acked(&history.lock().unwrap());
    let lists = wait_finished(&d.c, &acked_now);
    d.log("jobs finished (or the wait ended); checking the history");
    stop_samples.store(true, Ordering::Relaxed);
    samples.join().unwrap();
    scan.join().unwrap();
    let h = history.lock().unwrap();
    let verdict = check(&d.c, &h, &marks, &lists);
    let kills = h
        .nemesis
        .iter()
        .filter(|n| matches!(n, NemesisOp::Kill { .. }))
        .count();
    let chief_kills = h
        .nemesis
        .iter()
        .filter(|n| matches!(n, NemesisOp::Kill { chief: true, .. }))
        .count();
    let recovery_max_ms = h
        .nemesis
        .iter()
        .filter_map(|n| match n {
            NemesisOp::Restart {
                formed_after_ms, ..
            } => *formed_after_ms,
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let errs = h.submits.iter().filter(|s| s.outcome.is_err()).count();
    for s in h.submits.iter().filter(|s| s.outcome.is_err()) {
        println!(
            "chaos +{:>7.1}s submit {} to c{} erred after {} ms: {}",
            s.at_ms.saturating_sub(d.t0) as f64 / 1e3,
            s.name,
            s.node,
            s.took_ms,
            s.outcome.as_ref().unwrap_err()
        );
    }
    for n in &h.nemesis {
        let line = match n {
            NemesisOp::Kill { at_ms, node, chief } => format!(
                "+{:.1}s kill -9 c{node}{}",
                at_ms.saturating_sub(d.t0) as f64 / 1e3,
                if *chief { " (chief)" } else { "" }
            ),
            NemesisOp::Restart {
                at_ms,
                node,
                formed_after_ms,
            } => format!(
                "+{:.1}s restart c{node}, formed after {}",
                at_ms.saturating_sub(d.t0) as f64 / 1e3,
                formed_after_ms.map_or("never".into(), |ms| format!("{ms} ms"))
            ),
        };
        println!("chaos nemesis {line}");
    }
    show("lost acknowledged submits", &verdict.lost_acked);
    show("jobs not succeeded", &verdict.unfinished);
    show(
        "acknowledged jobs whose worker never ran to its end",
        &verdict.never_ran,
    );
    show("two jobs with one name", &verdict.duplicate_names);
    show("one token, two ids", &verdict.split_ids);
    show("two chiefs in one term", &verdict.two_chiefs);
    show(
        "two attempts of a job at once",
        &verdict.overlapping_attempts,
    );
    show(
        "one rank of one attempt running twice",
        &verdict.duplicate_ranks,
    );
    show("a node served an older attempt", &h.attempt_regressions);
    show("a node's term went back", &h.term_regressions);
    if !verdict.outlived_node.is_empty() {
        println!(
            "chaos NOTE workers that outlived their node's kill -9: {}",
            verdict.outlived_node.len()
        );
        for item in verdict.outlived_node.iter().take(SHOWN_MAX) {
            println!("  {item}");
        }
    }
    if let Some(why) = &stuck {
        println!("chaos VIOLATION the cluster did not recover: {why}");
    }
    println!(
        "chaos seconds={seconds} submits={} acked={} kills={kills} chiefs_per_term_max={} \
         overlapping_attempts={} lost_acked={} seed={seed} chief_kills={chief_kills} \
         submit_errors={errs} duplicate_ranks={} duplicate_names={} unfinished={} \
         retried_jobs={} recovery_max_s={:.1} terms={} status_samples={} job_samples={} workers_unended={} \
         workers_alive_at_end={} workers_outlived_node={}",
        h.submits.len(),
        verdict.acked.len(),
        verdict.chiefs_per_term_max,
        verdict.overlapping_attempts.len(),
        verdict.lost_acked.len(),
        verdict.duplicate_ranks.len(),
        verdict.duplicate_names.len(),
        verdict.unfinished.len(),
        verdict.retried_jobs,
        recovery_max_ms as f64 / 1e3,
        h.chiefs.len(),
        h.status_samples,
        h.job_samples,
        verdict.unended,
        verdict.alive_at_end,
        verdict.outlived_node.len(),
    );
    let failed = verdict.violations() + h.attempt_regressions.len() + h.term_regressions.len() > 0
        || stuck.is_some();
    drop(h);
    // Workers still alive (orphans of killed nodes) are ours: stop them by PID.
    let needle = marks.display().to_string();
    for pid in worker_pids(&needle) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    d.c.stop_all();
    if failed {
        let kept = root.keep();
        println!("chaos kept {} (node logs, markers)", kept.display());
    }
    assert!(
        !failed,
        "chaos: the checker found violations (seed {seed}), see above"
    );
}
