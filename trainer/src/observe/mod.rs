//! What a job shows of itself beyond its metric lines: every new part gets a room of its own.
//!
//! - TensorBoard: rank 0 writes the job's scalars (`loss`, `lr`, `samples_per_s` per step,
//!   `val_loss`, `val_accuracy` per validation) as a TensorBoard event file under
//!   `jobs/<job-id>/tb/` in the job's storage ([`TensorBoard`]: a bounded [`ScalarLog`]
//!   rewritten whole every [`TB_FLUSH_INTERVAL_MS`] by an [`ObjectWriter`]; the format,
//!   TFRecord-framed `Event` protobufs with CRC-32C, is written by hand in
//!   [`event_file`] and [`crc32c`]). `tensorboard --logdir` over a copy of that folder
//!   shows the curves.
//! - Timeline: every rank records the phases of its first [`TIMELINE_STEPS`] steps
//!   ([`PhaseRecorder`]); at the end of the run the ranks gather them over the collective
//!   and rank 0 writes `jobs/<job-id>/timeline.json`, Chrome's trace-event format
//!   ([`trace_json`]), one track per rank, viewable in Perfetto (ui.perfetto.dev) or
//!   `chrome://tracing` ([`write_job_timeline`]). Elastic runs, whose trainers the worker
//!   does not hold at the end, write one file per rank instead,
//!   `jobs/<job-id>/timeline-rank-<rank>.json` ([`RankTimeline`]).
//!
//! Nothing here may fail training: storage errors are logged (`warn`) and dropped.

pub mod crc32c;
pub mod event_file;
mod object_writer;
mod rank_timeline;
mod scalar_log;
mod tensorboard;
mod timeline;

pub use object_writer::{ObjectWriter, OBJECT_CLOSE_TIMEOUT_MS};
pub use rank_timeline::RankTimeline;
pub use scalar_log::{ScalarLog, EPOCH_TAGS, STEP_TAGS, TB_EVENTS_MAX};
pub use tensorboard::{
    event_file_name, hostname, tb_dir, unix_now_s, TensorBoard, HOSTNAME_BYTES_MAX,
    TB_FLUSH_INTERVAL_MS,
};
pub use timeline::{
    gather_phases, timeline_path, timeline_rank_path, trace_json, write_job_timeline,
    PhaseRecorder, StepPhases, PHASES, TIMELINE_GATHER_TIMEOUT_MS, TIMELINE_STEPS,
};
