//! One rank's own timeline, for runs that gather nothing at their end (elastic runs).

use std::time::Duration;

use opendal::Operator;
use tracing::warn;

use crate::trainer::StepMetrics;

use super::object_writer::{ObjectWriter, OBJECT_CLOSE_TIMEOUT_MS};
use super::timeline::{timeline_rank_path, trace_json, PhaseRecorder};

/// Records the first steps of the first generation this worker trains in, and writes them
/// as a one-track trace to `jobs/<job-id>/timeline-rank-<rank>.json` (its rank in that
/// generation) as soon as [`super::TIMELINE_STEPS`] are recorded or that generation ends,
/// whichever comes first (or at [`RankTimeline::close`]). Written once; storage errors are
/// logged.
#[derive(Debug)]
pub struct RankTimeline {
    op: Operator,
    job_id: String,
    /// The generation recorded and this worker's rank in it.
    first: Option<(u64, usize)>,
    rec: PhaseRecorder,
    writer: Option<ObjectWriter>,
}

impl RankTimeline {
    /// A timeline of `job_id`'s steps on this worker, to be written under `op`.
    pub fn new(op: Operator, job_id: &str) -> Self {
        RankTimeline {
            op,
            job_id: job_id.into(),
            first: None,
            rec: PhaseRecorder::default(),
            writer: None,
        }
    }

    /// A step `m` of `generation`, trained as `rank`, ended at `end_unix_us`. Needs a
    /// tokio runtime (the write is handed to a task).
    pub fn step(&mut self, generation: u64, rank: usize, m: &StepMetrics, end_unix_us: f64) {
        if self.writer.is_some() {
            return;
        }
        let (g, _) = *self.first.get_or_insert((generation, rank));
        if g != generation {
            self.write();
            return;
        }
        self.rec.record(m, end_unix_us);
        if self.rec.is_full() {
            self.write();
        }
    }

    /// Hands the trace to a writer task (once, and only with steps recorded).
    fn write(&mut self) {
        let Some((_, rank)) = self.first else {
            return;
        };
        if self.writer.is_some() || self.rec.steps().is_empty() {
            return;
        }
        let path = timeline_rank_path(&self.job_id, rank);
        let mut w = ObjectWriter::spawn(self.op.clone(), path);
        w.put(trace_json(&self.job_id, &[(rank, self.rec.steps().to_vec())]).into_bytes());
        self.writer = Some(w);
    }

    /// Writes what is recorded (if not written yet) and waits for the write, at most
    /// [`OBJECT_CLOSE_TIMEOUT_MS`]; a failure is logged.
    pub async fn close(mut self) {
        self.write();
        if let Some(w) = self.writer {
            let path = w.path().to_string();
            if let Err(e) = w
                .close(Duration::from_millis(OBJECT_CLOSE_TIMEOUT_MS))
                .await
            {
                warn!(path = %path, error = %e, "rank timeline not written");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::TIMELINE_STEPS;

    fn m(step: u64) -> StepMetrics {
        StepMetrics {
            samples_per_step: 0,
            step,
            epoch: 0,
            loss: 1.0,
            lr: 0.1,
            samples_per_s: 1.0,
            compute_s: 0.001,
            pack_s: 0.0,
            comm_wait_s: 0.001,
            optim_s: 0.0,
            step_s: 0.002,
            sent_bytes: 0,
        }
    }

    fn events(json: &[u8]) -> Vec<serde_json::Value> {
        let doc: serde_json::Value = serde_json::from_slice(json).unwrap();
        doc["traceEvents"].as_array().unwrap().clone()
    }

    #[tokio::test]
    async fn the_first_generation_is_written_once_under_its_rank() {
        let op = Operator::via_iter("memory", Vec::<(String, String)>::new()).unwrap();
        let mut t = RankTimeline::new(op.clone(), "j");
        for s in 1..=3 {
            t.step(4, 2, &m(s), 1e9 + s as f64 * 1e4);
        }
        // A new generation (this worker now rank 0) ends the recording.
        t.step(5, 0, &m(3), 2e9);
        t.step(5, 0, &m(4), 2e9);
        t.close().await;
        assert!(!op.exists("jobs/j/timeline-rank-0.json").await.unwrap());
        let ev = events(
            &op.read("jobs/j/timeline-rank-2.json")
                .await
                .unwrap()
                .to_vec(),
        );
        let spans = ev.iter().filter(|e| e["cat"] == "step").count();
        assert_eq!(spans, 3);
        assert!(ev.iter().filter(|e| e["ph"] == "X").all(|e| e["tid"] == 2));
    }

    #[tokio::test]
    async fn a_full_recording_is_written_without_waiting_for_the_end() {
        let op = Operator::via_iter("memory", Vec::<(String, String)>::new()).unwrap();
        let mut t = RankTimeline::new(op.clone(), "j");
        for s in 1..=(TIMELINE_STEPS as u64 + 5) {
            t.step(0, 1, &m(s), 1e9 + s as f64 * 1e4);
        }
        t.close().await;
        let ev = events(
            &op.read("jobs/j/timeline-rank-1.json")
                .await
                .unwrap()
                .to_vec(),
        );
        assert_eq!(
            ev.iter().filter(|e| e["cat"] == "step").count(),
            TIMELINE_STEPS
        );
    }
}
