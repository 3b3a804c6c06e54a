//! A job's timeline: each rank's compute and communication phases over its first steps,
//! in Chrome's trace-event JSON (the format of Horovod's timeline), viewable in Perfetto.

use std::time::Duration;

use collective::{CollectiveError, Communicator};
use opendal::Operator;
use serde_json::{json, Value};

use crate::trainer::StepMetrics;

/// Steps each rank records for the timeline (its first ones).
pub const TIMELINE_STEPS: usize = 20;
/// Longest the end-of-run gather of the timeline may take, ms (past it the timeline is
/// skipped; the collective's own operation deadline also bounds it).
pub const TIMELINE_GATHER_TIMEOUT_MS: u64 = 60_000;
/// The phases of a step, in the order they are laid out on the track.
pub const PHASES: [&str; 4] = ["compute", "pack", "comm_wait", "optim"];
/// Trace-event categories of [`PHASES`].
const PHASE_CATEGORIES: [&str; 4] = ["compute", "comm", "comm", "optim"];
/// f64s per step in the gathered array: step, start, the four phases, the whole step.
const ROW_F64: usize = 7;

/// The path of a job's timeline in storage: `jobs/<job-id>/timeline.json`.
pub fn timeline_path(job_id: &str) -> String {
    format!("jobs/{job_id}/timeline.json")
}

/// The path of one rank's own timeline (elastic runs, which gather nothing):
/// `jobs/<job-id>/timeline-rank-<rank>.json`.
pub fn timeline_rank_path(job_id: &str, rank: usize) -> String {
    format!("jobs/{job_id}/timeline-rank-{rank}.json")
}

/// One step of one rank: when it started and how long each phase took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPhases {
    /// The step (1-based: steps done after it).
    pub step: u64,
    /// When it started, µs since the Unix epoch (the rank's clock).
    pub start_unix_us: f64,
    /// [`StepMetrics::compute_s`].
    pub compute_s: f64,
    /// [`StepMetrics::pack_s`].
    pub pack_s: f64,
    /// [`StepMetrics::comm_wait_s`].
    pub comm_wait_s: f64,
    /// [`StepMetrics::optim_s`].
    pub optim_s: f64,
    /// [`StepMetrics::step_s`].
    pub step_s: f64,
}

impl StepPhases {
    /// The phases of `m`, a step that ended at `end_unix_us` (µs since the Unix epoch; the
    /// time its metrics were reported, a few µs after it ended): it started `step_s`
    /// before.
    pub fn from_metrics(m: &StepMetrics, end_unix_us: f64) -> Self {
        StepPhases {
            step: m.step,
            start_unix_us: end_unix_us - 1e6 * m.step_s,
            compute_s: m.compute_s,
            pack_s: m.pack_s,
            comm_wait_s: m.comm_wait_s,
            optim_s: m.optim_s,
            step_s: m.step_s,
        }
    }

    /// The phases' durations in [`PHASES`] order, s (negative or not finite: zero).
    fn durations(&self) -> [f64; 4] {
        [self.compute_s, self.pack_s, self.comm_wait_s, self.optim_s].map(finite_non_negative)
    }

    fn to_row(self) -> [f64; ROW_F64] {
        [
            self.step as f64,
            self.start_unix_us,
            self.compute_s,
            self.pack_s,
            self.comm_wait_s,
            self.optim_s,
            self.step_s,
        ]
    }

    /// The step of a gathered row; `None` for an empty row (step 0) or garbage.
    fn from_row(r: &[f64]) -> Option<Self> {
        let step = r[0];
        if !(step >= 1.0 && step.fract() == 0.0 && r[1].is_finite()) {
            return None;
        }
        Some(StepPhases {
            step: step as u64,
            start_unix_us: r[1],
            compute_s: r[2],
            pack_s: r[3],
            comm_wait_s: r[4],
            optim_s: r[5],
            step_s: r[6],
        })
    }
}

fn finite_non_negative(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// One rank's first steps, recorded as they end.
#[derive(Debug, Clone)]
pub struct PhaseRecorder {
    steps: Vec<StepPhases>,
    steps_max: usize,
}

impl Default for PhaseRecorder {
    fn default() -> Self {
        Self::new(TIMELINE_STEPS)
    }
}

impl PhaseRecorder {
    /// Records the first `steps_max` steps handed to it (every rank of a job must use the
    /// same `steps_max`: the gather's size depends on it).
    pub fn new(steps_max: usize) -> Self {
        PhaseRecorder {
            steps: Vec::with_capacity(steps_max),
            steps_max,
        }
    }

    /// Records step `m`, which ended at `end_unix_us`, unless `steps_max` are recorded.
    pub fn record(&mut self, m: &StepMetrics, end_unix_us: f64) {
        if !self.is_full() {
            self.steps.push(StepPhases::from_metrics(m, end_unix_us));
        }
    }

    /// Whether `steps_max` steps are recorded.
    pub fn is_full(&self) -> bool {
        self.steps.len() >= self.steps_max
    }

    /// The steps recorded.
    pub fn steps(&self) -> &[StepPhases] {
        &self.steps
    }

    /// The fixed-size array this rank contributes to the gather: `steps_max` rows of
    /// [`ROW_F64`] f64s, unused rows zero.
    fn to_array(&self) -> Vec<f64> {
        let mut a = vec![0.0; self.steps_max * ROW_F64];
        for (row, s) in a.chunks_exact_mut(ROW_F64).zip(&self.steps) {
            row.copy_from_slice(&s.to_row());
        }
        a
    }

    /// The steps in one rank's part of a gathered array.
    fn from_array(a: &[f64]) -> Vec<StepPhases> {
        a.chunks_exact(ROW_F64)
            .filter_map(StepPhases::from_row)
            .collect()
    }
}

/// Gathers every rank's recorded steps (an allgather of fixed-size f64 arrays: every rank
/// of `comm` must call it, with recorders of the same `steps_max`); element `r` of the
/// result is rank `r`'s.
pub async fn gather_phases(
    comm: &mut Communicator,
    mine: &PhaseRecorder,
) -> Result<Vec<Vec<StepPhases>>, CollectiveError> {
    let (rank, world) = (comm.rank(), comm.world());
    let part = mine.to_array();
    let n = part.len();
    let mut all = vec![0.0f64; n * world];
    // With `world` segments of equal size, rank r's segment is exactly [r·n, (r+1)·n).
    debug_assert_eq!(comm.segment(all.len(), rank), rank * n..(rank + 1) * n);
    all[rank * n..(rank + 1) * n].copy_from_slice(&part);
    comm.allgather(&mut all).await?;
    Ok(all
        .chunks_exact(n.max(1))
        .map(PhaseRecorder::from_array)
        .collect())
}

/// Gathers every rank's steps over `comm` (every rank calls it, see [`gather_phases`]) and
/// on rank 0 writes the job's timeline to [`timeline_path`] under `op`, each part bounded
/// by [`TIMELINE_GATHER_TIMEOUT_MS`]. Returns the path written (rank 0, when any rank
/// recorded a step), or the error as text for the caller to log: the timeline never fails
/// a run.
pub async fn write_job_timeline(
    comm: &mut Communicator,
    mine: &PhaseRecorder,
    op: &Operator,
    job_id: &str,
) -> Result<Option<String>, String> {
    let limit = Duration::from_millis(TIMELINE_GATHER_TIMEOUT_MS);
    let all = tokio::time::timeout(limit, gather_phases(comm, mine))
        .await
        .map_err(|_| format!("gather took over {TIMELINE_GATHER_TIMEOUT_MS} ms"))?
        .map_err(|e| format!("gather: {e}"))?;
    if comm.rank() != 0 || all.iter().all(Vec::is_empty) {
        return Ok(None);
    }
    let ranks: Vec<(usize, Vec<StepPhases>)> = all.into_iter().enumerate().collect();
    let path = timeline_path(job_id);
    tokio::time::timeout(
        limit,
        op.write(&path, trace_json(job_id, &ranks).into_bytes()),
    )
    .await
    .map_err(|_| format!("writing {path} took over {TIMELINE_GATHER_TIMEOUT_MS} ms"))?
    .map_err(|e| format!("writing {path}: {e}"))?;
    Ok(Some(path))
}

/// The trace-event JSON of `ranks` (`(rank, its steps)`): one track (`tid`) per rank in
/// process 0, per step one `step N` span (category `step`) enclosing one complete event
/// (`ph: "X"`) per phase of [`PHASES`]. Phases are laid end to end from the step's start in
/// that order, each as long as measured (the packing overlaps the backward pass in
/// reality: the trace shows how a step's time divides, not the exact instants of
/// overlapped work). Times are µs from the earliest step start of any rank; ranks on
/// different hosts are offset by their clocks' difference.
pub fn trace_json(job_id: &str, ranks: &[(usize, Vec<StepPhases>)]) -> String {
    let origin = ranks
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.start_unix_us))
        .fold(f64::INFINITY, f64::min);
    let origin = if origin.is_finite() { origin } else { 0.0 };
    let mut events: Vec<Value> = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0,
        "args": { "name": format!("job {job_id}") },
    })];
    for (rank, steps) in ranks {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
            "args": { "name": format!("rank {rank}") },
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": rank,
            "args": { "sort_index": rank },
        }));
        for s in steps {
            let start = s.start_unix_us - origin;
            let d = s.durations();
            let sum_us: f64 = d.iter().map(|x| 1e6 * x).sum();
            events.push(json!({
                "name": format!("step {}", s.step), "cat": "step", "ph": "X",
                "ts": round_us(start), "dur": round_us((1e6 * finite_non_negative(s.step_s)).max(sum_us)),
                "pid": 0, "tid": rank, "args": { "step": s.step },
            }));
            let mut at = start;
            for ((name, cat), secs) in PHASES.iter().zip(PHASE_CATEGORIES).zip(d) {
                let dur = 1e6 * secs;
                events.push(json!({
                    "name": name, "cat": cat, "ph": "X",
                    "ts": round_us(at), "dur": round_us(dur),
                    "pid": 0, "tid": rank, "args": { "step": s.step },
                }));
                at += dur;
            }
        }
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": { "job": job_id, "steps_per_rank_max": TIMELINE_STEPS },
    });
    serde_json::to_string(&doc).expect("a json value serializes")
}

/// `us` to the nanosecond (three decimals), keeping the file short. Rounding is monotone,
/// so phases laid end to end stay ordered.
fn round_us(us: f64) -> f64 {
    (us * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(step: u64) -> StepMetrics {
        StepMetrics {
            samples_per_step: 0,
            step,
            epoch: 0,
            loss: 1.0,
            lr: 0.1,
            samples_per_s: 1.0,
            compute_s: 0.010,
            pack_s: 0.001,
            comm_wait_s: 0.004,
            optim_s: 0.002,
            step_s: 0.017,
            sent_bytes: 0,
        }
    }

    fn recorder(rank: usize, steps: u64) -> PhaseRecorder {
        let mut r = PhaseRecorder::new(TIMELINE_STEPS);
        for s in 1..=steps {
            // Rank 1's clock a little behind; steps 20 ms apart.
            let end = 1.7e15 + (s as f64) * 20_000.0 - rank as f64 * 300.0;
            r.record(&metrics(s), end);
        }
        r
    }

    #[test]
    fn the_recorder_keeps_the_first_steps_and_round_trips_its_array() {
        let r = recorder(0, 30);
        assert!(r.is_full());
        assert_eq!(r.steps().len(), TIMELINE_STEPS);
        assert_eq!(r.steps()[0].step, 1);
        assert_eq!(PhaseRecorder::from_array(&r.to_array()), r.steps());
        let partial = recorder(0, 3);
        assert_eq!(partial.to_array().len(), TIMELINE_STEPS * ROW_F64);
        assert_eq!(PhaseRecorder::from_array(&partial.to_array()).len(), 3);
    }

    #[test]
    fn the_trace_has_one_event_per_phase_per_step_per_rank_without_overlap() {
        let ranks: Vec<(usize, Vec<StepPhases>)> = (0..3)
            .map(|r| (r, recorder(r, 5).steps().to_vec()))
            .collect();
        let text = trace_json("job-1", &ranks);
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(doc["displayTimeUnit"], "ms");
        let events = doc["traceEvents"].as_array().unwrap();
        let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 3 * 5 * (PHASES.len() + 1));
        assert!(events.iter().all(|e| e["pid"] == 0));
        let min_ts = complete
            .iter()
            .map(|e| e["ts"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        assert_eq!(min_ts, 0.0, "times start at the earliest step");
        for rank in 0..3u64 {
            let names: Vec<_> = events
                .iter()
                .filter(|e| e["ph"] == "M" && e["tid"] == rank && e["name"] == "thread_name")
                .collect();
            assert_eq!(names.len(), 1);
            for step in 1..=5u64 {
                let of_step: Vec<&&Value> = complete
                    .iter()
                    .filter(|e| e["tid"] == rank && e["args"]["step"] == step)
                    .collect();
                let span = of_step.iter().find(|e| e["cat"] == "step").unwrap();
                let (s0, s1) = (
                    span["ts"].as_f64().unwrap(),
                    span["ts"].as_f64().unwrap() + span["dur"].as_f64().unwrap(),
                );
                assert!((s1 - s0 - 17_000.0).abs() < 1e-6);
                let phases: Vec<&&&Value> = of_step.iter().filter(|e| e["cat"] != "step").collect();
                let names: Vec<&str> = phases.iter().map(|e| e["name"].as_str().unwrap()).collect();
                assert_eq!(names, PHASES);
                let mut end = s0;
                for p in phases {
                    let (ts, dur) = (p["ts"].as_f64().unwrap(), p["dur"].as_f64().unwrap());
                    assert!(ts >= end - 1e-6 && dur >= 0.0, "phases overlap: {p}");
                    end = ts + dur;
                }
                assert!(end <= s1 + 1e-6, "phases inside the step");
            }
        }
    }

    #[test]
    fn garbage_durations_are_clamped() {
        let mut m = metrics(1);
        m.compute_s = f64::NAN;
        m.pack_s = -1.0;
        let s = StepPhases::from_metrics(&m, 1e6);
        let doc: Value = serde_json::from_str(&trace_json("j", &[(0, vec![s])])).unwrap();
        assert!(doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .all(|e| e["dur"].as_f64().unwrap() >= 0.0));
        assert!(trace_json("j", &[]).contains("traceEvents"));
    }

    #[tokio::test]
    async fn the_ranks_gather_each_others_steps() {
        let comms = Communicator::in_memory(3, collective::Limits::default()).unwrap();
        let tasks: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(r, mut c)| {
                tokio::spawn(async move {
                    let rec = recorder(r, 2 + r as u64);
                    let all = gather_phases(&mut c, &rec).await.unwrap();
                    // Kept until every rank is done: a dropped rank reads as lost.
                    (all, c)
                })
            })
            .collect();
        let mut kept = Vec::new();
        for t in tasks {
            let (all, c) = t.await.unwrap();
            kept.push(c);
            assert_eq!(all.len(), 3);
            for (r, steps) in all.iter().enumerate() {
                assert_eq!(steps, recorder(r, 2 + r as u64).steps());
            }
        }
    }
}
