//! The scalars of one run, bounded in memory, as a whole TensorBoard event file.

use crate::trainer::{EpochMetrics, StepMetrics};

use super::event_file::{append_record, encode_event, FILE_VERSION};

/// Most events a [`ScalarLog`] holds (about 70 bytes each in the file, so a file stays
/// under about 7 MB however long the run).
pub const TB_EVENTS_MAX: usize = 100_000;

/// Per-step tags, in the order written.
pub const STEP_TAGS: [&str; 3] = ["loss", "lr", "samples_per_s"];
/// Per-epoch (validation) tags, in the order written.
pub const EPOCH_TAGS: [&str; 2] = ["val_loss", "val_accuracy"];

/// One event held: when, at which step, and its values (per-step or per-epoch tags).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Held {
    wall_time_s: f64,
    step: u64,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Step([f32; 3]),
    Epoch([f32; 2]),
}

/// The scalar curves of one run, to be written as one event file.
///
/// Invariants: at most `events_max` events are held; at most one per-step point per step
/// (a step seen again, as after an elastic restore to an earlier commit, replaces the
/// points from that step on: the curve shows the history that went on); held steps are
/// increasing. When full, every other per-step point is dropped and only steps that are a
/// multiple of the doubled stride are kept from then on, so that a long run keeps its whole
/// curve at a coarser grain; per-epoch points are never thinned (a log full of them drops
/// the newest).
#[derive(Debug, Clone)]
pub struct ScalarLog {
    created_s: f64,
    events: Vec<Held>,
    events_max: usize,
    stride: u64,
    dropped: u64,
}

impl ScalarLog {
    /// An empty log whose file-version event is stamped `created_s` (Unix seconds), holding
    /// at most `events_max` events (at least 2).
    pub fn new(created_s: f64, events_max: usize) -> Self {
        ScalarLog {
            created_s,
            events: Vec::new(),
            events_max: events_max.max(2),
            stride: 1,
            dropped: 0,
        }
    }

    /// Records a step's `loss`, `lr` and `samples_per_s` at `wall_time_s` (Unix seconds),
    /// if its step is a multiple of the current stride.
    pub fn step(&mut self, m: &StepMetrics, wall_time_s: f64) {
        self.rewind_to(m.step);
        if !m.step.is_multiple_of(self.stride) {
            return;
        }
        let values = [m.loss as f32, m.lr as f32, m.samples_per_s as f32];
        self.push(Held {
            wall_time_s,
            step: m.step,
            kind: Kind::Step(values),
        });
    }

    /// Records a validation's `val_loss` and `val_accuracy` at `wall_time_s`.
    pub fn epoch(&mut self, m: &EpochMetrics, wall_time_s: f64) {
        // A validation comes after the step it follows: only later steps are stale.
        self.rewind_to(m.step + 1);
        let values = [m.val_loss as f32, m.val_accuracy as f32];
        self.push(Held {
            wall_time_s,
            step: m.step,
            kind: Kind::Epoch(values),
        });
    }

    /// Drops the points from `step` on (a step trained again).
    fn rewind_to(&mut self, step: u64) {
        if self.events.last().is_some_and(|e| e.step >= step) {
            self.events.retain(|e| e.step < step);
        }
    }

    fn push(&mut self, e: Held) {
        if self.events.len() >= self.events_max {
            self.thin();
        }
        if self.events.len() >= self.events_max {
            self.dropped += 1;
            return;
        }
        if matches!(e.kind, Kind::Step(_)) && !e.step.is_multiple_of(self.stride) {
            return;
        }
        self.events.push(e);
    }

    /// Doubles the stride and drops the per-step points that are off it.
    fn thin(&mut self) {
        self.stride = self.stride.saturating_mul(2);
        let stride = self.stride;
        self.events
            .retain(|e| matches!(e.kind, Kind::Epoch(_)) || e.step.is_multiple_of(stride));
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether no event is held.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Steps between two per-step points held now (1 until the log first filled).
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Per-epoch points dropped because the log was full of them.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The whole event file: the file-version event, then every event held, each a
    /// TFRecord.
    pub fn encode(&self) -> Vec<u8> {
        let mut file = Vec::with_capacity(64 + self.events.len() * 72);
        let mut data = Vec::with_capacity(96);
        encode_event(&mut data, self.created_s, 0, Some(FILE_VERSION), &[]);
        append_record(&mut file, &data);
        let mut values: Vec<(&str, f32)> = Vec::with_capacity(3);
        for e in &self.events {
            values.clear();
            match &e.kind {
                Kind::Step(v) => values.extend(STEP_TAGS.iter().copied().zip(v.iter().copied())),
                Kind::Epoch(v) => values.extend(EPOCH_TAGS.iter().copied().zip(v.iter().copied())),
            }
            data.clear();
            encode_event(&mut data, e.wall_time_s, e.step as i64, None, &values);
            append_record(&mut file, &data);
        }
        file
    }
}

#[cfg(test)]
mod tests {
    use super::super::event_file::decode_file;
    use super::*;

    fn step(step: u64, loss: f64) -> StepMetrics {
        StepMetrics {
            samples_per_step: 0,
            step,
            epoch: 0,
            loss,
            lr: 0.1,
            samples_per_s: 1000.0,
            compute_s: 0.0,
            pack_s: 0.0,
            comm_wait_s: 0.0,
            optim_s: 0.0,
            step_s: 0.0,
            sent_bytes: 0,
        }
    }

    fn epoch(step: u64, val_loss: f64) -> EpochMetrics {
        EpochMetrics {
            epoch: 0,
            step,
            val_loss,
            val_accuracy: 0.5,
        }
    }

    #[test]
    fn the_file_holds_the_version_then_every_point() {
        let mut log = ScalarLog::new(100.0, 10);
        log.step(&step(1, 2.0), 101.0);
        log.step(&step(2, 1.5), 102.0);
        log.epoch(&epoch(2, 1.25), 102.5);
        let ev = decode_file(&log.encode()).unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0].file_version.as_deref(), Some(FILE_VERSION));
        assert_eq!(ev[0].wall_time_s, 100.0);
        assert_eq!((ev[2].step, ev[2].wall_time_s), (2, 102.0));
        let tags: Vec<&str> = ev[1].values.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tags, STEP_TAGS);
        assert_eq!(ev[1].values[0].1, 2.0);
        assert_eq!(ev[3].values[0], ("val_loss".into(), 1.25));
        assert_eq!(ev[3].values[1], ("val_accuracy".into(), 0.5));
    }

    #[test]
    fn a_full_log_thins_steps_and_keeps_the_whole_run() {
        let mut log = ScalarLog::new(0.0, 100);
        for s in 1..=1000 {
            log.step(&step(s, 1.0 / s as f64), s as f64);
            if s % 100 == 0 {
                log.epoch(&epoch(s, 0.0), s as f64);
            }
            assert!(log.len() <= 100);
        }
        let stride = log.stride();
        assert!(stride > 1 && stride.is_power_of_two(), "{stride}");
        let ev = decode_file(&log.encode()).unwrap();
        let steps: Vec<i64> = ev[1..]
            .iter()
            .filter(|e| e.values.len() == 3)
            .map(|e| e.step)
            .collect();
        assert!(steps.iter().all(|s| (*s as u64).is_multiple_of(stride)));
        assert!(steps.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*steps.last().unwrap(), 1000 / stride as i64 * stride as i64);
        let epochs = ev.iter().filter(|e| e.values.len() == 2).count();
        assert_eq!(epochs, 10, "validations are never thinned");
        assert_eq!(log.dropped(), 0);
    }

    #[test]
    fn a_step_seen_again_replaces_the_points_from_there() {
        let mut log = ScalarLog::new(0.0, 100);
        for s in 1..=10 {
            log.step(&step(s, 1.0), s as f64);
        }
        log.epoch(&epoch(10, 0.5), 10.5);
        // An elastic restore to the commit at step 6: step 7 is trained again.
        log.step(&step(7, 2.0), 11.0);
        let ev = decode_file(&log.encode()).unwrap();
        let steps: Vec<i64> = ev[1..].iter().map(|e| e.step).collect();
        assert_eq!(steps, vec![1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(ev.last().unwrap().values[0].1, 2.0);
    }

    #[test]
    fn a_log_full_of_validations_drops_the_newest() {
        let mut log = ScalarLog::new(0.0, 3);
        for s in 1..=5 {
            log.epoch(&epoch(s, s as f64), s as f64);
        }
        assert_eq!((log.len(), log.dropped()), (3, 2));
    }
}
