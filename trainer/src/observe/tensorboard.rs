//! Rank 0's TensorBoard log of a job: its [`ScalarLog`] rewritten to storage every few
//! seconds and at the end.

use std::time::{Duration, Instant};

use opendal::Operator;
use tracing::warn;

use crate::trainer::Event;

use super::object_writer::{ObjectWriter, OBJECT_CLOSE_TIMEOUT_MS};
use super::scalar_log::{ScalarLog, TB_EVENTS_MAX};

/// Shortest gap between two writes of the event file during training, ms.
pub const TB_FLUSH_INTERVAL_MS: u64 = 5_000;
/// Longest host name put in an event file's name, bytes.
pub const HOSTNAME_BYTES_MAX: usize = 64;

/// The directory of a job's event files in storage: `jobs/<job-id>/tb/`.
pub fn tb_dir(job_id: &str) -> String {
    format!("jobs/{job_id}/tb/")
}

/// An event file's name as TensorFlow names it:
/// `events.out.tfevents.<unix seconds>.<hostname>.<pid>`.
pub fn event_file_name(unix_s: u64, hostname: &str, pid: u32) -> String {
    format!("events.out.tfevents.{unix_s}.{hostname}.{pid}")
}

/// This machine's host name (from `/proc/sys/kernel/hostname`, `/etc/hostname` or
/// `$HOSTNAME`; `localhost` when none), reduced to `[A-Za-z0-9-_]` so that it is one
/// path segment, at most [`HOSTNAME_BYTES_MAX`] bytes.
pub fn hostname() -> String {
    let raw = ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let clean: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(HOSTNAME_BYTES_MAX)
        .collect();
    if clean.is_empty() {
        "localhost".into()
    } else {
        clean
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Rank 0's TensorBoard writer: scalars `loss`, `lr`, `samples_per_s` per step and
/// `val_loss`, `val_accuracy` per validation, in one event file under
/// `jobs/<job-id>/tb/`, rewritten whole (opendal writes whole objects) at most once per
/// [`TB_FLUSH_INTERVAL_MS`] and at [`TensorBoard::close`]. Storage errors are logged and
/// never reach training.
#[derive(Debug)]
pub struct TensorBoard {
    log: ScalarLog,
    writer: ObjectWriter,
    interval: Duration,
    last_put: Option<Instant>,
    changed: bool,
}

impl TensorBoard {
    /// Starts the writer (needs a tokio runtime) of a new event file of `job_id` under
    /// `op`, named after `created_s` (Unix seconds), this host and this process.
    pub fn spawn(op: Operator, job_id: &str, created_s: f64) -> Self {
        let name = event_file_name(created_s as u64, &hostname(), std::process::id());
        let path = format!("{}{name}", tb_dir(job_id));
        Self::with_path(
            op,
            path,
            created_s,
            Duration::from_millis(TB_FLUSH_INTERVAL_MS),
        )
    }

    /// [`TensorBoard::spawn`] at an explicit `path`, writing at most once per `interval`.
    pub fn with_path(op: Operator, path: String, created_s: f64, interval: Duration) -> Self {
        TensorBoard {
            log: ScalarLog::new(created_s, TB_EVENTS_MAX),
            writer: ObjectWriter::spawn(op, path),
            interval,
            last_put: None,
            changed: false,
        }
    }

    /// The event file's path in storage.
    pub fn path(&self) -> &str {
        self.writer.path()
    }

    /// The scalars held.
    pub fn log(&self) -> &ScalarLog {
        &self.log
    }

    /// Records a trainer event that happened at `wall_time_s` (Unix seconds); hands the
    /// file to the writer when `interval` has passed since the last time (at `now`).
    pub fn event(&mut self, e: &Event, wall_time_s: f64, now: Instant) {
        match e {
            Event::Step(m) => self.log.step(m, wall_time_s),
            Event::Epoch(m) => self.log.epoch(m, wall_time_s),
            _ => return,
        }
        self.changed = true;
        let due = self
            .last_put
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if due {
            self.flush(now);
        }
    }

    /// Hands the whole file to the writer now (if anything changed since the last time).
    pub fn flush(&mut self, now: Instant) {
        if self.changed {
            self.writer.put(self.log.encode());
            self.last_put = Some(now);
            self.changed = false;
        }
    }

    /// Writes the file a last time and waits for it (at most
    /// [`OBJECT_CLOSE_TIMEOUT_MS`]). Returns whether it was written; a failure is logged.
    pub async fn close(mut self) -> bool {
        self.flush(Instant::now());
        let path = self.writer.path().to_string();
        match self
            .writer
            .close(Duration::from_millis(OBJECT_CLOSE_TIMEOUT_MS))
            .await
        {
            Ok(()) => true,
            Err(e) => {
                warn!(path = %path, error = %e, "tensorboard event file not written");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::event_file::decode_file;
    use super::*;
    use crate::trainer::{EpochMetrics, StepMetrics};

    #[test]
    fn names_follow_tensorflow() {
        assert_eq!(
            event_file_name(1_700_000_000, "h-1", 42),
            "events.out.tfevents.1700000000.h-1.42"
        );
        let h = hostname();
        assert!(!h.is_empty() && h.len() <= HOSTNAME_BYTES_MAX);
        assert!(h
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_eq!(tb_dir("job-1"), "jobs/job-1/tb/");
    }

    #[tokio::test]
    async fn writes_at_most_once_per_interval_and_at_close() {
        let op = Operator::via_iter("memory", Vec::<(String, String)>::new()).unwrap();
        let mut tb =
            TensorBoard::with_path(op.clone(), "tb/ev".into(), 1.0, Duration::from_secs(3600));
        let t0 = Instant::now();
        let m = |step| StepMetrics {
            step,
            samples_per_step: 0,
            epoch: 0,
            loss: 1.0,
            lr: 0.1,
            samples_per_s: 10.0,
            compute_s: 0.0,
            pack_s: 0.0,
            comm_wait_s: 0.0,
            optim_s: 0.0,
            step_s: 0.0,
            sent_bytes: 0,
        };
        for s in 1..=5 {
            tb.event(&Event::Step(m(s)), 2.0, t0);
        }
        tb.event(&Event::Checkpoint(5), 2.0, t0);
        let e = EpochMetrics {
            epoch: 0,
            step: 5,
            val_loss: 0.5,
            val_accuracy: 0.9,
        };
        tb.event(&Event::Epoch(e), 3.0, t0);
        assert_eq!(tb.log().len(), 6);
        assert!(tb.close().await);
        let ev = decode_file(&op.read("tb/ev").await.unwrap().to_vec()).unwrap();
        assert_eq!(ev.len(), 7, "the version, five steps and one validation");
    }
}
