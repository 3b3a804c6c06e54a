//! Runs this node's share of command and train jobs: one process per assigned rank.
//!
//! The supervisor is reconciled against the replicated control state: a rank assigned to
//! this node in a job's current attempt, not yet exited, has a process; anything else
//! (an old attempt, a cancelled or failed job) is killed. Processes get the environment
//! torchrun gives (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`, …), so an unmodified PyTorch DDP script works. Their stdout and stderr go
//! to `<data-dir>/jobs/<id>/attempt-<a>/rank-<r>.log`; stdout lines
//! `ringleader-metric NAME VALUE [STEP]` become job metrics; the exit code is reported.
//!
//! A train job (`kind = "train"`) is the same path with a fixed program: this node's own
//! binary as `ringleader train-worker` (see [`crate::train`]), given a spec file written next
//! to the rank's log (`attempt-<a>/spec.toml`), the ring's addresses, the node's storage URL
//! and, in its environment, the ring secret.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    sync::{mpsc, oneshot},
};
use tracing::{info, warn};

use crate::{
    control::state::{ControlCommand, ControlState, JobId, JobState},
    jobs::spec::JobKind,
};

/// Shortest gap between two reports of the same metric, in milliseconds (the last value is
/// always reported when the process ends).
const METRIC_REPORT_INTERVAL_MS: u64 = 500;
/// Longest line kept from a worker's output, in bytes (longer ones are cut).
const LINE_BYTES_MAX: usize = 64 * 1024;
/// First port of the range `MASTER_PORT` is drawn from. The range, plus the train ring's
/// ports just above it (one per rank), stays below Linux's ephemeral ports (32768 and up), so
/// an outgoing connection of this host never holds the port a rank must bind.
const MASTER_PORT_BASE: u16 = 20_000;
/// Size of that range.
const MASTER_PORT_SPAN: u16 = 11_000;

/// A metric line printed by a worker: `ringleader-metric NAME VALUE [STEP]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricLine {
    pub name: String,
    pub value: f64,
    pub step: Option<u64>,
}

/// Parses a metric line; anything else (including a malformed metric line) is `None`.
pub fn parse_metric_line(line: &str) -> Option<MetricLine> {
    let mut parts = line.split_whitespace();
    if parts.next()? != "ringleader-metric" {
        return None;
    }
    let name = parts.next()?.to_string();
    let value: f64 = parts.next()?.parse().ok().filter(|v: &f64| v.is_finite())?;
    let step = match parts.next() {
        Some(s) => Some(s.parse().ok()?),
        None => None,
    };
    if parts.next().is_some() || name.len() > crate::control::state::METRIC_NAME_BYTES_MAX {
        return None;
    }
    Some(MetricLine { name, value, step })
}

/// The rendezvous port of an attempt: the same on every node, different across attempts.
pub fn master_port(id: JobId, attempt: u32) -> u16 {
    let h = blake3::hash(format!("{id}/{attempt}").as_bytes());
    let x = u16::from_le_bytes([h.as_bytes()[0], h.as_bytes()[1]]);
    MASTER_PORT_BASE + x % MASTER_PORT_SPAN
}

/// The storage URL `ringleader node` uses by default: `file://<data-dir>/store`, the data
/// dir being the parent of `jobs_dir`.
fn default_storage(jobs_dir: &Path) -> String {
    let data_dir = jobs_dir.parent().unwrap_or(jobs_dir);
    let abs = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    format!("file://{}", abs.join("store").display())
}

/// Where a rank's log lives under the jobs directory.
pub fn log_path(jobs_dir: &Path, id: JobId, attempt: u32, rank: u32) -> PathBuf {
    jobs_dir
        .join(id.to_string())
        .join(format!("attempt-{attempt}"))
        .join(format!("rank-{rank}.log"))
}

type Key = (JobId, u32, u32);

/// Runs and stops this node's worker processes.
pub struct Supervisor {
    me: String,
    jobs_dir: PathBuf,
    reports: mpsc::Sender<ControlCommand>,
    running: HashMap<Key, oneshot::Sender<()>>,
    /// Ranks whose process ended by itself, while their exit report is on its way: they are
    /// not started again.
    finished: std::collections::HashSet<Key>,
    epoch_ms: fn() -> u64,
    /// Checkpoint storage URL handed to train workers.
    storage: String,
    /// Ranks of train jobs waiting for a member's address, already logged.
    waiting: std::collections::HashSet<Key>,
}

impl Supervisor {
    /// A supervisor for the member `me` (peer id), keeping logs under `jobs_dir` and sending
    /// its reports (exits, metrics) to `reports`; `clock_ms` stamps them.
    pub fn new(
        me: String,
        jobs_dir: PathBuf,
        reports: mpsc::Sender<ControlCommand>,
        clock_ms: fn() -> u64,
    ) -> Self {
        Supervisor {
            me,
            storage: default_storage(&jobs_dir),
            jobs_dir,
            reports,
            running: HashMap::new(),
            finished: Default::default(),
            epoch_ms: clock_ms,
            waiting: Default::default(),
        }
    }

    /// Sets the checkpoint storage URL of train jobs (default: `file://<data-dir>/store`,
    /// the data dir being the parent of `jobs_dir`, as `ringleader node` defaults it).
    pub fn with_storage(mut self, url: String) -> Self {
        self.storage = url;
        self
    }

    /// Brings the processes in line with `state`. `host_of` gives a member's host for
    /// `MASTER_ADDR`.
    pub fn reconcile(&mut self, state: &ControlState, host_of: &dyn Fn(&str) -> Option<String>) {
        let mut wanted: BTreeMap<Key, ()> = BTreeMap::new();
        for job in state.jobs.values() {
            let train = job.spec.kind == JobKind::Train;
            if job.state != JobState::Running || !(train || job.spec.kind == JobKind::Command) {
                continue;
            }
            for slot in job.assignment.iter().filter(|s| s.member == self.me) {
                if job.exits.contains_key(&slot.rank) {
                    continue;
                }
                let key = (job.id, job.attempt, slot.rank);
                wanted.insert(key, ());
                if self.running.contains_key(&key) || self.finished.contains(&key) {
                    continue;
                }
                let rank0 = &job.assignment[0];
                let master_addr = host_of(&rank0.member).unwrap_or_else(|| "127.0.0.1".to_string());
                let local_world = job
                    .assignment
                    .iter()
                    .filter(|s| s.member == slot.member)
                    .count();
                let mut env: Vec<(String, String)> = vec![
                    ("RANK".into(), slot.rank.to_string()),
                    ("WORLD_SIZE".into(), job.assignment.len().to_string()),
                    ("LOCAL_RANK".into(), slot.local_rank.to_string()),
                    ("LOCAL_WORLD_SIZE".into(), local_world.to_string()),
                    ("GROUP_RANK".into(), "0".into()),
                    ("MASTER_ADDR".into(), master_addr),
                    (
                        "MASTER_PORT".into(),
                        master_port(job.id, job.attempt).to_string(),
                    ),
                    (
                        "TORCHELASTIC_RESTART_COUNT".into(),
                        (job.attempt - 1).to_string(),
                    ),
                    (
                        "TORCHELASTIC_MAX_RESTARTS".into(),
                        job.max_restarts.to_string(),
                    ),
                    ("RINGLEADER_JOB_ID".into(), job.id.to_string()),
                    ("RINGLEADER_ATTEMPT".into(), job.attempt.to_string()),
                ];
                env.extend(job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
                let log = log_path(&self.jobs_dir, job.id, job.attempt, slot.rank);
                let (command, files) = if train {
                    let Some(addrs) = crate::train::ring_addrs(job, host_of) else {
                        if self.waiting.insert(key) {
                            info!(job = %job.id, attempt = job.attempt, rank = slot.rank, "waiting for the ring members' addresses");
                        }
                        continue;
                    };
                    let spec_file = log.with_file_name("spec.toml");
                    env.push((
                        "RINGLEADER_SECRET".into(),
                        crate::train::ring_secret(job).to_string(),
                    ));
                    let command = self.train_command(job, slot.rank, &addrs, &spec_file);
                    (
                        command,
                        vec![(spec_file, crate::train::spec_text(&job.spec))],
                    )
                } else {
                    (job.spec.command.clone(), Vec::new())
                };
                let (kill_tx, kill_rx) = oneshot::channel();
                let run = Run {
                    key,
                    command,
                    files,
                    env,
                    log,
                    reports: self.reports.clone(),
                    clock_ms: self.epoch_ms,
                };
                info!(job = %job.id, attempt = job.attempt, rank = slot.rank, "starting worker");
                tokio::spawn(run.run(kill_rx));
                self.running.insert(key, kill_tx);
            }
        }
        // Stop what is no longer wanted (the attempt moved on, the job ended); forget what
        // finished by itself.
        let finished = &mut self.finished;
        finished.retain(|key| wanted.contains_key(key));
        self.waiting.retain(|key| wanted.contains_key(key));
        let mut stop = Vec::new();
        self.running.retain(|key, kill| {
            if kill.is_closed() {
                finished.insert(*key);
                return false;
            }
            if !wanted.contains_key(key) {
                stop.push(*key);
            }
            true
        });
        for key in stop {
            info!(job = %key.0, attempt = key.1, rank = key.2, "stopping worker");
            if let Some(kill) = self.running.remove(&key) {
                let _ = kill.send(());
            }
        }
    }

    /// The command line of a train job's rank: this binary's hidden `train-worker`.
    fn train_command(
        &self,
        job: &crate::control::state::Job,
        rank: u32,
        addrs: &[std::net::SocketAddr],
        spec_file: &Path,
    ) -> Vec<String> {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "ringleader".into());
        let data_dir = self.jobs_dir.parent().unwrap_or(&self.jobs_dir);
        let addrs: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
        vec![
            exe,
            "train-worker".into(),
            "--spec".into(),
            spec_file.display().to_string(),
            "--rank".into(),
            rank.to_string(),
            "--addrs".into(),
            addrs.join(","),
            "--job-id".into(),
            job.id.to_string(),
            "--generation".into(),
            job.attempt.to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--storage".into(),
            self.storage.clone(),
            "--metric-lines".into(),
        ]
    }

    /// Kills every process (node shutdown).
    pub fn stop_all(&mut self) {
        for (_, kill) in self.running.drain() {
            let _ = kill.send(());
        }
    }
}

/// One worker process, from spawn to its exit report.
struct Run {
    key: Key,
    command: Vec<String>,
    /// Files written before the process starts (path, contents).
    files: Vec<(PathBuf, String)>,
    env: Vec<(String, String)>,
    log: PathBuf,
    reports: mpsc::Sender<ControlCommand>,
    clock_ms: fn() -> u64,
}

impl Run {
    async fn run(self, kill: oneshot::Receiver<()>) {
        let (id, attempt, rank) = self.key;
        let code = match self.supervise(kill).await {
            Ok(Some(code)) => code,
            Ok(None) => return, // killed because the attempt or job ended: nothing to report
            Err(e) => {
                warn!(job = %id, attempt, rank, "worker could not run: {e}");
                127
            }
        };
        let at_ms = (self.clock_ms)();
        let _ = self
            .reports
            .send(ControlCommand::WorkerExited {
                id,
                attempt,
                rank,
                code,
                at_ms,
            })
            .await;
    }

    /// Runs the process; `Some(code)` when it exited by itself, `None` when killed.
    async fn supervise(&self, mut kill: oneshot::Receiver<()>) -> anyhow::Result<Option<i32>> {
        let (id, attempt, _) = self.key;
        if let Some(dir) = self.log.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let mut log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .await?;
        for (path, text) in &self.files {
            tokio::fs::write(path, text).await?;
        }
        let (program, args) = self
            .command
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("empty command"))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {program:?}: {e}"))?;
        let pgid = child.id().map(|p| p as i32);
        // Whatever ends this task (the process exiting, a kill, the node shutting down and
        // dropping it), the rank's whole process group goes with it, as torchrun does.
        let _group = ProcessGroup(pgid);
        let (line_tx, mut lines) = mpsc::channel::<(bool, String)>(256);
        let out = child
            .stdout
            .take()
            .map(|s| tokio::spawn(pump(s, true, line_tx.clone())));
        let err = child
            .stderr
            .take()
            .map(|s| tokio::spawn(pump(s, false, line_tx)));
        let mut last_sent: HashMap<String, Instant> = HashMap::new();
        let mut unsent: BTreeMap<String, MetricLine> = BTreeMap::new();
        let mut killed = false;
        let status = loop {
            tokio::select! {
                line = lines.recv() => match line {
                    Some((is_stdout, text)) => {
                        log.write_all(text.as_bytes()).await?;
                        log.write_all(b"\n").await?;
                        if let Some(m) = is_stdout.then(|| parse_metric_line(&text)).flatten() {
                            let due = last_sent.get(&m.name).is_none_or(|t| t.elapsed() >= Duration::from_millis(METRIC_REPORT_INTERVAL_MS));
                            if due {
                                last_sent.insert(m.name.clone(), Instant::now());
                                unsent.remove(&m.name);
                                self.report_metric(id, attempt, m).await;
                            } else {
                                unsent.insert(m.name.clone(), m);
                            }
                        }
                    }
                    None => break child.wait().await?,
                },
                _ = &mut kill, if !killed => {
                    killed = true;
                    if let Some(pgid) = pgid {
                        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
                    }
                    let _ = child.kill().await;
                }
            }
        };
        for task in [out, err].into_iter().flatten() {
            let _ = task.await;
        }
        log.flush().await?;
        if killed {
            return Ok(None);
        }
        for (_, m) in unsent {
            self.report_metric(id, attempt, m).await;
        }
        use std::os::unix::process::ExitStatusExt;
        Ok(Some(
            status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        ))
    }

    async fn report_metric(&self, id: JobId, attempt: u32, m: MetricLine) {
        let at_ms = (self.clock_ms)();
        let cmd = ControlCommand::Metric {
            id,
            attempt,
            name: m.name,
            value: m.value,
            step: m.step,
            at_ms,
        };
        // Metrics are best effort: when the report queue is full, this value is dropped.
        let _ = self.reports.try_send(cmd);
    }
}

/// Forwards a pipe's lines (cut at [`LINE_BYTES_MAX`]) until it closes.
async fn pump<R: tokio::io::AsyncRead + Unpin>(
    pipe: R,
    is_stdout: bool,
    tx: mpsc::Sender<(bool, String)>,
) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader)
            .take(LINE_BYTES_MAX as u64)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                if tx
                    .send((is_stdout, String::from_utf8_lossy(&buf).into_owned()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

use tokio::io::AsyncReadExt as _;

/// Kills a process group when dropped.
struct ProcessGroup(Option<i32>);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pgid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_lines() {
        assert_eq!(
            parse_metric_line("ringleader-metric loss 0.25 10"),
            Some(MetricLine {
                name: "loss".into(),
                value: 0.25,
                step: Some(10)
            })
        );
        assert_eq!(
            parse_metric_line("ringleader-metric acc 0.9"),
            Some(MetricLine {
                name: "acc".into(),
                value: 0.9,
                step: None
            })
        );
        for bad in [
            "hello",
            "ringleader-metric",
            "ringleader-metric x",
            "ringleader-metric x nan",
            "ringleader-metric x 1 -3",
            "ringleader-metric x 1 2 3",
        ] {
            assert_eq!(parse_metric_line(bad), None, "{bad}");
        }
    }

    #[test]
    fn master_port_is_stable_and_in_range() {
        let id = JobId::from_log_index(12);
        assert_eq!(master_port(id, 1), master_port(id, 1));
        for a in 0..50 {
            let p = master_port(id, a);
            assert!((MASTER_PORT_BASE..MASTER_PORT_BASE + MASTER_PORT_SPAN).contains(&p));
        }
    }
}
