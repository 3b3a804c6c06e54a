//! One rank's process, from spawn to its exit report: output to the rank's log, metric
//! lines to the chief, the whole process group killed with it.
//!
//! Stdout lines `ringleader-metric NAME VALUE [STEP]` become job metrics (at most one report
//! per metric per [`METRIC_REPORT_INTERVAL_MS`], the last value always); the exit code (a
//! signal death as 128 + signal, as shells report it) is sent as
//! [`ControlCommand::WorkerExited`]. A rank killed because its attempt or job ended reports
//! nothing.

use std::{
    collections::{BTreeMap, HashMap},
    process::Stdio,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader},
    sync::{mpsc, oneshot},
};
use tracing::warn;

use crate::{
    control::state::{ControlCommand, JobId, METRIC_NAME_BYTES_MAX},
    jobs::launch::Launch,
};

/// A rank's process: (job, attempt, rank).
pub type Key = (JobId, u32, u32);

/// Shortest gap between two reports of the same metric, in milliseconds (the last value is
/// always reported when the process ends).
pub const METRIC_REPORT_INTERVAL_MS: u64 = 500;
/// Longest line kept from a worker's output, in bytes (longer ones are cut).
const LINE_BYTES_MAX: usize = 64 * 1024;

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
    if parts.next().is_some() || name.len() > METRIC_NAME_BYTES_MAX {
        return None;
    }
    Some(MetricLine { name, value, step })
}

/// One worker process, from spawn to its exit report.
pub(super) struct Run {
    pub(super) key: Key,
    pub(super) launch: Launch,
    pub(super) reports: mpsc::Sender<ControlCommand>,
    pub(super) clock_ms: fn() -> u64,
}

impl Run {
    pub(super) async fn run(self, kill: oneshot::Receiver<()>) {
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
        if let Some(dir) = self.launch.log.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let mut log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.launch.log)
            .await?;
        for (path, text) in &self.launch.files {
            tokio::fs::write(path, text).await?;
        }
        let (program, args) = self
            .launch
            .command
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("empty command"))?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .envs(
                self.launch
                    .env
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            )
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
}
