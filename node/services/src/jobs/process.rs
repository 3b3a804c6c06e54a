//! One rank's process, from spawn to its exit report: output to the rank's log, reports to
//! the chief, the whole process group killed with it.
//!
//! What the node does about each event of a running rank is decided by its
//! `watch::RankWatch`, a state machine with the time passed in (every rule below is
//! tested there by lines and times); `Run::supervise` sets the rank up and spawns it, and
//! `Run::drive` only feeds the watch its events and carries out its actions.
//!
//! Stdout lines the node reads are [`RankLine`]s (the protocol crate,
//! `docs/book/src/reference/protocol.md`); a `ringleader-…` line that does not parse is logged
//! (warn, with the line, at most once per [`MALFORMED_WARN_INTERVAL_MS`]) and ignored. What the
//! node does with each:
//! - `ringleader-metric NAME VALUE [STEP]`: a job metric (at most one report per metric per
//!   [`METRIC_REPORT_INTERVAL_MS`], the last value always). For a command trial's rank 0, a
//!   line naming the search's metric is also a [`Op::TrialReport`] at STEP
//!   epochs (without STEP: the count of such lines so far), never thinned;
//! - `ringleader-report RESOURCE NAME VALUE [NAME VALUE …]` (a search trial's rank 0): the
//!   search metric's value at RESOURCE (epochs done), as [`Op::TrialReport`];
//!   its values are job metrics too, unless the rank prints them as metric lines as well;
//! - `ringleader-rank-stats generation=G rank=R step=S compute_ms=X wait_ms=Y` (elastic train
//!   ranks, about once a second): [`Op::RankStats`], for straggler detection;
//! - `ringleader-elastic failed generation=G lost_rank=R error="…"`: the rank's collective
//!   lost rank R; [`Op::RankLost`], so the chief re-forms without it;
//! - `ringleader-elastic resumed … steps_lost=L`: metrics `steps_lost` and `restored_step`;
//! - `ringleader-heartbeat computing_ms=X` (elastic train ranks, while one compute section
//!   runs long): past [`HUNG_COMPUTING_MS_MIN`] and [`HUNG_COMPUTE_FACTOR`] × the rank's
//!   usual compute time per step, the rank is reported hung (a deadlock in its own
//!   computation; the ranks waiting for it are on the network and report nothing).
//!
//! A process stopped (SIGSTOP) for [`HUNG_STOPPED_MS`] is reported hung too.
//!
//! A resumable command trial's run ends at its rung ([`Launch::trial_rung`]): rank 0's
//! reports beyond the rung are dropped (no result of a later rung), and a rank 0 still
//! running [`RUNG_EXIT_GRACE_MS`] after it reported at or past its rung is stopped (SIGTERM,
//! SIGKILL after [`STOP_GRACE_MS`]); it exits as having reached its rung (code 0, whatever
//! the signal made of it).
//!
//! Output goes to the log through a per-rank cap ([`super::log_rate`]): ordinary lines past
//! it are dropped and counted, protocol lines are always kept and parsed. Pipes are read in
//! `PIPE_BUFFER_BYTES` pieces and lines cut at `LINE_BYTES_MAX`; the log is written through
//! a buffer flushed every `LOG_FLUSH_MS`.
//!
//! Under `--run-as USER` ([`crate::security::run_as`]) the process runs as that user, in
//! its own work directory (`…/worker-<w>/`, also its `HOME`), with its spec file and its
//! `file://` checkpoint place (`<store>/jobs/<id>/`) given to the user.
//!
//! The exit code (a signal death as 128 + signal, as shells report it) is sent as
//! [`Op::WorkerExited`] for the generation and rank the process was in last, a failed one
//! with the last lines of its stderr (redacted, bounded: `tail`) and the signal, or why it
//! could not start (a missing program, a dataset it could not get, its set-up refused). A
//! rank killed because its generation or job ended reports nothing. A train rank of an
//! elastic job, and a command rank of one with `[elastic] protocol = "ringleader"`, lives
//! through re-forms: the supervisor sends it each new generation, which this task writes to
//! the process's stdin (`ringleader-generation {…}`; a command rank's first one as soon as
//! it starts, [`ProtocolRank`]); a graceful stop writes `ringleader-stop` first. Such a
//! command rank that prints no heartbeat or rank stats within its bound
//! ([`ProtocolRank::first_heartbeat_ms`]) is reported lost ([`silent_rank_reason`]).

use std::{
    collections::VecDeque,
    path::PathBuf,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader},
    sync::mpsc,
};
use tracing::{debug, info, warn};

use ringleader_protocol::{LineError, RankLine};

use watch::{Action, RankWatch, Watched};

use crate::{
    domain::state::{failure::RankEnd, ops, ControlCommand, JobId, Op},
    jobs::{
        launch::Launch,
        log_rate::{is_protocol, LogRate, Verdict, RANK_LOG_BYTES_PER_S_MAX},
    },
    security::{
        rank_dir::RankDir,
        run_as::{make_traverse_dir, RunAs, RANK_DIR_MODE, RANK_FILE_MODE},
        uid_range::JobUsers,
    },
};

/// A rank's process: (job, the generation it was started for, worker): for a rank that
/// lives through re-forms, the first generation of its attempt
/// ([`crate::domain::state::Job::process_generation`]).
pub type Key = (JobId, u32, u32);

/// Shortest gap between two reports of the same metric, in milliseconds (the last value is
/// always reported when the process ends).
pub const METRIC_REPORT_INTERVAL_MS: u64 = 500;
/// Longest line kept from a worker's output, in bytes (longer ones are split in pieces of
/// this size, each capped as a line; only the first may be a protocol line).
const LINE_BYTES_MAX: usize = 64 * 1024;
/// Read buffer of each of a rank's pipes, in bytes.
const PIPE_BUFFER_BYTES: usize = 256 * 1024;
/// Write buffer of a rank's log, in bytes.
const LOG_BUFFER_BYTES: usize = 64 * 1024;
/// Longest a line written to a rank's log waits in the buffer, in milliseconds.
const LOG_FLUSH_MS: u64 = 200;
/// Depth of the queue of lines from a rank's pipes to its task.
const LINE_QUEUE_DEPTH: usize = 256;
/// Depth of a rank's control queue (kill, new generations).
pub const CONTROL_QUEUE_DEPTH: usize = 8;
/// A rank whose process stays stopped (SIGSTOP, a debugger) this long is reported hung, in
/// milliseconds: the chief re-forms an elastic ring without it.
pub const HUNG_STOPPED_MS: u64 = 3_000;
/// A compute section running this long, at least, makes a rank hung, in milliseconds.
pub const HUNG_COMPUTING_MS_MIN: u64 = 5_000;
/// … and at least this many times the rank's usual compute time per step.
pub const HUNG_COMPUTE_FACTOR: f64 = 20.0;
/// Before a rank has reported a step (no `ringleader-rank-stats` line yet), its first
/// compute section makes it hung only past this, in milliseconds: a first step compiles
/// (torch.compile, NVRTC), autotunes and warms caches, for minutes on a large model (the
/// 5 s floor killed such ranks as hung); torch's own NCCL timeout is 10 minutes.
pub const HUNG_FIRST_COMPUTE_MS: u64 = 600_000;
/// A rank stopped gracefully (its job cancelled, a search trial stopped early) gets SIGTERM,
/// then SIGKILL after this long, in milliseconds.
pub const STOP_GRACE_MS: u64 = 5_000;
/// A resumable command trial's rank 0 still running this long after it reported at or past
/// its rung gets SIGTERM (its run is over: a promotion resumes it in a new run), in
/// milliseconds: time to save and exit by itself.
pub const RUNG_EXIT_GRACE_MS: u64 = 3_000;
/// How often the process's run state is looked at, in milliseconds.
const WATCH_PERIOD_MS: u64 = 500;
/// Longest wait for a rank's stdin to take one control line, in milliseconds: a rank that
/// does not read its stdin (its pipe full) has it closed rather than stall this task.
const STDIN_WRITE_MS: u64 = 2_000;
/// After a rank's process exits, how long its pipes may still deliver lines, in
/// milliseconds. Its process group is killed at the exit, so the pipes close at once unless
/// a process left the group (`setsid`) and keeps them open: the exit is reported anyway.
const EXIT_DRAIN_MS: u64 = 2_000;

/// A rank's exit as reported: its code (128 + signal for a signal) and, for a failed one,
/// how it ended ([`RankEnd`]: its stderr's last lines, the signal, why it could not start).
type Exit = (i32, Option<RankEnd>);

/// A rank's program could not be started (missing, not executable, a bad interpreter): the
/// reason goes to the rank's log and the job's events, and the retry avoids this member.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct CannotStart(String);

impl CannotStart {
    fn new(program: &str, e: &std::io::Error) -> Self {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => format!(
                "program {program:?} not found on this node (not on its PATH, or no such file \
                 from the job's working directory)"
            ),
            std::io::ErrorKind::PermissionDenied => {
                format!("program {program:?} is not executable on this node ({e})")
            }
            _ => format!("program {program:?} could not be started: {e}"),
        };
        CannotStart(why)
    }
}

/// Whether process `pid` is stopped (run state `T` or `t` in `/proc/<pid>/stat`).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "T" || state == "t")
    })
}

/// How this node runs every rank: the user it runs as and its log cap.
#[derive(Clone, Debug)]
pub struct RankOptions {
    /// `--run-as`: the user ranks run as (`None`: the node's).
    pub run_as: Option<Arc<RunAs>>,
    /// Cap on the bytes a rank adds to its log per second (0: none).
    pub log_bytes_per_s: u64,
    /// `--run-as-range`: each job's ranks run under a uid of their own from it (then
    /// `run_as` is set per rank, to its job's user).
    pub job_users: Option<Arc<Mutex<JobUsers>>>,
}

impl RankOptions {
    /// Whether a rank's place owned by `uid` (neither the node's nor the rank's user's) may
    /// be given to the rank's user: one of the `--run-as-range` (the job's uid of an earlier
    /// node run; jobs never share the range's uids while they live).
    fn may_take(&self, uid: u32) -> bool {
        self.job_users
            .as_ref()
            .is_some_and(|u| u.lock().expect("job users lock").range().contains(uid))
    }
}

impl Default for RankOptions {
    fn default() -> Self {
        RankOptions {
            run_as: None,
            log_bytes_per_s: RANK_LOG_BYTES_PER_S_MAX,
            job_users: None,
        }
    }
}

/// What a command rank of `[elastic] protocol = "ringleader"` is given and held to (a train
/// rank gets its first generation in its arguments and speaks the protocol by build).
#[derive(Clone, PartialEq)]
pub struct ProtocolRank {
    /// The `ringleader-generation {json}` line of the generation it starts in, written to
    /// its stdin first (it holds the ring secret: never logged); `None` for a standby
    /// joiner, whose first generation is the re-form that takes it in.
    pub first_generation: Option<String>,
    /// It must print a `ringleader-heartbeat` or `ringleader-rank-stats` line within this
    /// long of starting (`[elastic] first_heartbeat_s`), in milliseconds, or it is lost.
    pub first_heartbeat_ms: u64,
}

impl std::fmt::Debug for ProtocolRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The generation line holds the ring secret.
        f.debug_struct("ProtocolRank")
            .field("first_generation", &"(hidden)")
            .field("first_heartbeat_ms", &self.first_heartbeat_ms)
            .finish()
    }
}

/// Why a rank of the ringleader protocol that never spoke it is lost (the job's history
/// shows it): what to change.
pub fn silent_rank_reason(first_heartbeat_ms: u64) -> String {
    format!(
        "no ringleader-heartbeat or ringleader-rank-stats line within {} s of starting: with [elastic] protocol = \"ringleader\" the script must use ringleader.torch (call rlt.init()), or drop protocol = \"ringleader\" for torchrun's restart of every rank",
        first_heartbeat_ms / 1_000
    )
}

/// What the supervisor tells a running rank.
#[derive(Debug)]
pub enum Control {
    /// Kill the process group; report nothing.
    Kill,
    /// Stop the process group gracefully: SIGTERM, then SIGKILL after [`STOP_GRACE_MS`];
    /// report nothing.
    Stop,
    /// Left out of its ring by a re-form (a shrink): told to stop at its next step
    /// boundary (`ringleader-stop`, stdin closed) and SIGKILL after [`STOP_GRACE_MS`], no
    /// SIGTERM: the survivors finish the step it is in with it and lose none (a rank
    /// killed mid-step leaves them a step its optimizer had partly applied, and they go
    /// back to their last periodic commit); report nothing.
    Leave,
    /// A preemption's requeue: checkpoint and stop (`ringleader-stop`, stdin closed, and
    /// SIGTERM when `sigterm`), SIGKILL after `grace_ms`; the exit is reported (the job is
    /// requeued once every rank is out). An elastic train rank gets no SIGTERM: it stops
    /// at the stop line's step boundary and writes the state every rank reached as the
    /// checkpoint the next attempt resumes from, while SIGTERM (which it leaves at its
    /// default) would kill it first, mid-step, and the job would go back to its last
    /// periodic checkpoint.
    Preempt { grace_ms: u64, sigterm: bool },
    /// The ring re-formed: the process is now `rank` of `generation`; `line` (a
    /// `ringleader-generation` control line) goes to its stdin.
    Generation {
        generation: u32,
        rank: u32,
        line: String,
    },
}

/// Shortest gap between two warnings about malformed `ringleader-…` lines of one rank, in
/// milliseconds (the lines in between are counted and named in the next warning).
pub const MALFORMED_WARN_INTERVAL_MS: u64 = 10_000;
/// Longest part of a malformed line quoted in the warning, in characters.
const MALFORMED_QUOTE_CHARS_MAX: usize = 200;

/// A rank's output line as the node reads it: a protocol line ([`RankLine`]), a line that
/// claims to be one but does not parse, or the rank's own output.
#[derive(Debug, Clone, PartialEq)]
pub enum Read {
    /// A protocol line.
    Line(RankLine),
    /// A `ringleader-…` line that does not parse: logged and ignored.
    Malformed(LineError),
    /// Anything else.
    Output,
}

/// Reads one stdout line of a rank.
pub fn read_line(text: &str) -> Read {
    if !RankLine::is_protocol(text) {
        return Read::Output;
    }
    match text.parse::<RankLine>() {
        Ok(line) => Read::Line(line),
        Err(e) => Read::Malformed(e),
    }
}

/// How a search trial's rank 0 turns its lines into reports of the search's metric.
#[derive(Debug, Clone, Default)]
pub struct TrialReports {
    /// The search's metric (`None`: not a trial's rank 0).
    pub metric: Option<String>,
    /// `ringleader-metric <metric> VALUE [STEP]` lines are reports too (command trials; a
    /// train trial's metric lines count steps, its `ringleader-report` lines epochs).
    pub from_metric_lines: bool,
    /// The rung this run ends at (a resumable command trial): reports beyond it are
    /// dropped, but for the first one of a run that never reported the rung itself.
    pub rung: Option<u32>,
    /// A report at or past `rung` was seen.
    reached_rung: bool,
    /// The last resource reported: only progress counts.
    last: Option<u32>,
    /// `ringleader-metric <metric>` lines so far (the resource of a line without STEP).
    metric_lines: u32,
}

impl TrialReports {
    /// The `(resource, value)` a line reports, if it reports the search's metric beyond the
    /// last report.
    pub fn report(&mut self, line: &RankLine) -> Option<(u32, f64)> {
        let metric = self.metric.as_deref()?;
        let (resource, value) = match line {
            RankLine::Report(r) => (r.resource, r.value_of(metric)?),
            RankLine::Metric(m) if self.from_metric_lines && m.name == metric => {
                self.metric_lines = self.metric_lines.saturating_add(1);
                let resource = match m.step {
                    Some(s) => u32::try_from(s).unwrap_or(u32::MAX),
                    None => self.metric_lines,
                };
                (resource, m.value)
            }
            _ => return None,
        };
        if let Some(rung) = self.rung {
            let reported_rung = self.reached_rung;
            self.reached_rung |= resource >= rung;
            if resource > rung && reported_rung {
                // Past the run's rung: not a result of a later rung (the next run, if the
                // trial is promoted, resumes from its checkpoint and reports that itself).
                // The first report past it, when the run never reported the rung itself
                // (it resumed beyond it), goes on: the search takes it as the rung's.
                return None;
            }
        }
        if self.last.is_some_and(|last| resource <= last) {
            // Only progress counts: a report at or below the last is dropped here (the
            // state machine would ignore it).
            return None;
        }
        self.last = Some(resource);
        Some((resource, value))
    }

    /// Whether the run reported at or past its rung (never without one).
    pub fn reached_rung(&self) -> bool {
        self.reached_rung
    }
}

/// One worker process, from spawn to its exit report.
pub(super) struct Run {
    pub(super) key: Key,
    /// The generation and rank it runs as now (changed by [`Control::Generation`]).
    pub(super) generation: u32,
    pub(super) rank: u32,
    pub(super) launch: Launch,
    /// Whether the process reads control lines on stdin (an elastic rank that lives
    /// through re-forms: a train rank, a command rank of the ringleader protocol).
    pub(super) control_stdin: bool,
    /// A command rank of the ringleader protocol: its first generation and heartbeat bound.
    pub(super) protocol: Option<ProtocolRank>,
    /// A standby joiner (`domain::state::standby`) until its first generation arrives: its
    /// `ringleader-ready` line is reported, and its exit or silence drops the standby
    /// instead of counting as a rank's.
    pub(super) standby: bool,
    pub(super) reports: mpsc::Sender<ControlCommand>,
    pub(super) clock_ms: fn() -> u64,
    /// The node's dataset service (`None` in tests without one).
    pub(super) datasets: Option<crate::datasets::Datasets>,
    /// Where running ranks' process groups are recorded (`None` in tests).
    pub(super) groups: Option<std::sync::Arc<super::groups::Groups>>,
    /// The user it runs as and its log cap.
    pub(super) options: RankOptions,
}

/// The next control message: one stashed while the process was not yet running, else the
/// next to arrive.
async fn next_control(
    stash: &mut VecDeque<Control>,
    control: &mut mpsc::Receiver<Control>,
) -> Option<Control> {
    match stash.pop_front() {
        Some(m) => Some(m),
        None => control.recv().await,
    }
}

impl Run {
    /// The directory of the shared dataset `name` on this node, fetched first if missing;
    /// the fetch's progress goes to the rank's log and its start and end to the job's
    /// events.
    async fn fetch_dataset(
        &self,
        datasets: &crate::datasets::Datasets,
        name: &str,
        log: &mut tokio::fs::File,
    ) -> anyhow::Result<std::path::PathBuf> {
        let mut lines: Vec<String> = Vec::new();
        let mut noted = false;
        let result = datasets
            .ensure_local(name, |s| {
                let pct = (s.chunks_done * 100).checked_div(s.chunks).unwrap_or(0);
                lines.push(format!(
                    "ringleader: fetching dataset {name:?}: {pct}% of {} MB, {} MB/s from {} holder(s)",
                    s.size_bytes / 1_000_000,
                    s.mb_per_s,
                    s.sources.len()
                ));
            })
            .await;
        if !lines.is_empty() {
            noted = true;
            for line in &lines {
                log.write_all(line.as_bytes()).await?;
                log.write_all(b"\n").await?;
            }
        }
        let message = match (&result, noted) {
            (Ok(_), false) => None,
            (Ok(dir), true) => Some(format!(
                "dataset {name:?} fetched to this node ({})",
                dir.display()
            )),
            (Err(e), _) => Some(e.to_string()),
        };
        if let Some(message) = message {
            log.write_all(format!("ringleader: {message}\n").as_bytes())
                .await?;
            self.note(message, false).await;
        }
        Ok(result?)
    }

    /// Readies the rank's places for `user` and returns its work directory: the job's and
    /// the generation's directories traversable (0711), the work directory, its `[[files]]`
    /// (and their directories) and a train rank's spec file written afresh and the user's,
    /// and a train rank's `file://` checkpoint place (`<store>/jobs/<id>/`) the user's too.
    /// Everything below the node-owned generation directory goes through descriptors that
    /// never follow a link ([`RankDir`]): a process as the user may swap any entry of the
    /// user's directories for a link at any moment.
    fn prepare_run_as(&self, user: &RunAs) -> anyhow::Result<PathBuf> {
        let log = &self.launch.log;
        for dir in log.ancestors().skip(1).take(2) {
            make_traverse_dir(dir)?;
        }
        let work = log.with_extension("");
        let (Some(generation), Some(work_name)) = (work.parent(), work.file_name()) else {
            anyhow::bail!("--run-as: {} has no parent directory", work.display());
        };
        let owner = user.owner();
        let may_take = |uid| self.options.may_take(uid);
        let context = |path: &std::path::Path| format!("--run-as: preparing {}", path.display());
        let base = RankDir::open_node_dir(generation).with_context(|| context(generation))?;
        let work_dir = base
            .own_child_dir(work_name, owner, RANK_DIR_MODE, &may_take)
            .with_context(|| context(&work))?;
        for (path, contents) in &self.launch.files {
            let (dir, relative) = match path.strip_prefix(&work) {
                Ok(relative) => (&work_dir, relative),
                Err(_) if path.parent() == Some(generation) => (
                    &base,
                    std::path::Path::new(path.file_name().unwrap_or_default()),
                ),
                Err(_) => {
                    anyhow::bail!("--run-as: {} is outside the rank's places", path.display())
                }
            };
            let Some(name) = relative.file_name() else {
                anyhow::bail!("--run-as: {} names no file", path.display());
            };
            let below = relative
                .parent()
                .map(|p| dir.own_dirs(p, owner, RANK_DIR_MODE, &may_take))
                .transpose()
                .with_context(|| context(path))?
                .flatten();
            below
                .as_ref()
                .unwrap_or(dir)
                .write_file(name, contents, owner, RANK_FILE_MODE)
                .with_context(|| context(path))?;
        }
        let storage = self
            .launch
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == ringleader_protocol::env::STORAGE);
        if let Some(dir) = storage.and_then(|(_, url)| RunAs::store_job_dir(url, self.key.0)) {
            user.own_dir(&dir, &may_take)?;
        }
        Ok(work)
    }

    pub(super) async fn run(mut self, control: mpsc::Receiver<Control>) {
        let id = self.key.0;
        let (code, end) = match self.supervise(control).await {
            Ok(Some(exit)) => exit,
            Ok(None) => return, // killed because the generation or job ended: nothing to report
            Err(e) => {
                warn!(job = %id, generation = self.generation, rank = self.rank, "worker could not run: {e:#}");
                let why = match e.downcast_ref::<CannotStart>() {
                    Some(CannotStart(why)) => {
                        self.report_cannot_start(why).await;
                        why.clone()
                    }
                    None => format!("{e:#}"),
                };
                let end = RankEnd {
                    start_error: Some(why),
                    ..RankEnd::default()
                };
                (127, Some(end))
            }
        };
        if self.standby {
            let reason = format!("its process exited with code {code}");
            self.report_standby_dropped(id, reason).await;
            return;
        }
        let at_ms = (self.clock_ms)();
        let _ = self
            .reports
            .send(ControlCommand {
                op: Op::WorkerExited(ops::WorkerExited {
                    id,
                    generation: self.generation,
                    rank: self.rank,
                    code,
                    end,
                }),
                at_ms,
            })
            .await;
    }

    /// Runs the process; `Some((code, how a failed one ended))` when it exited by itself,
    /// `None` when killed.
    async fn supervise(
        &mut self,
        mut control: mpsc::Receiver<Control>,
    ) -> anyhow::Result<Option<Exit>> {
        let id = self.key.0;
        // `--run-as-range`: this job's own uid, held while this task runs (its process
        // group is killed before the hold drops).
        let _uid_hold = match self.options.job_users.clone() {
            Some(users) => {
                let user = users
                    .lock()
                    .expect("job users lock")
                    .assign(id)
                    .map_err(|e| CannotStart(e.to_string()))?;
                self.options.run_as = Some(Arc::new(user));
                Some(UidHold(users, id))
            }
            None => None,
        };
        if let Some(dir) = self.launch.log.parent() {
            tokio::fs::create_dir_all(dir).await?;
        }
        let mut log = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.launch.log)
            .await?;
        if self.options.run_as.is_none() {
            // Under `--run-as`, `prepare_run_as` writes them, never through a link.
            if let Some(dir) = &self.launch.work_dir {
                tokio::fs::create_dir_all(dir).await?;
            }
            for (path, contents) in &self.launch.files {
                write_fresh(path, contents).await?;
            }
        }
        // Control messages that arrive while the dataset is fetched: a kill ends the wait,
        // a new generation is replayed once the process runs (as if it had run all along).
        let mut stash: VecDeque<Control> = VecDeque::new();
        let mut env = self.launch.env.clone();
        // Under --run-as, the rank's use of its dataset's copy: the group it reads it through,
        // until this task ends (after the rank's process group is gone).
        let mut dataset_share: Option<crate::security::run_as::DatasetShare> = None;
        if let Some(name) = self.launch.dataset.clone() {
            let Some(datasets) = self.datasets.clone() else {
                anyhow::bail!("dataset {name:?}: this node has no dataset service");
            };
            let fetch = self.fetch_dataset(&datasets, &name, &mut log);
            tokio::pin!(fetch);
            let dir = loop {
                tokio::select! {
                    dir = &mut fetch => break dir?,
                    msg = control.recv() => match msg {
                        Some(Control::Kill)
                        | Some(Control::Stop)
                        | Some(Control::Preempt { .. })
                        | None => return Ok(None),
                        Some(m) => stash.push_back(m),
                    },
                }
            };
            if let Some(user) = self.options.run_as.clone() {
                // This rank may read the node's copy (read only, the dataset's group).
                let files = dir.clone();
                dataset_share =
                    Some(tokio::task::spawn_blocking(move || user.share_dataset(&files)).await??);
            }
            env.push((
                ringleader_protocol::env::DATASET_DIR.into(),
                dir.display().to_string(),
            ));
        }
        let work_dir = match self.options.run_as.clone() {
            Some(user) => Some(self.prepare_run_as(&user)?),
            None => self.launch.work_dir.clone(),
        };
        let (program, args) = self
            .launch
            .command
            .split_first()
            .ok_or_else(|| anyhow::anyhow!("empty command"))?;
        let stdin = if self.control_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let mut cmd = tokio::process::Command::new(program);
        if let (Some(user), Some(dir)) = (&self.options.run_as, &work_dir) {
            // The user's uid and primary gid (a rank on a shared dataset: the dataset's
            // group instead, its only way to the node's copy); with no groups given, std
            // drops the supplementary groups (setgroups(0) when run by root) before setuid.
            let gid = dataset_share.as_ref().map_or(user.gid, |s| s.gid());
            cmd.uid(user.uid)
                .gid(gid)
                .current_dir(dir)
                .env("HOME", dir)
                .env("USER", &user.name)
                .env("LOGNAME", &user.name);
        } else if let Some(dir) = &work_dir {
            cmd.current_dir(dir);
        }
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                // The rank's group leader dies with its node, kill -9 included (a drop
                // guard cannot run then); its own children are killed by group when the node
                // starts again (`groups`).
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // Not the node's timer slack: the rank's own timers keep Linux's default.
                crate::tasks::set_timer_slack(crate::tasks::RANK_TIMER_SLACK_NS);
                Ok(())
            });
        }
        let child = cmd
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| CannotStart::new(program, &e))?;
        debug!(target: "ringleader::hops", job = %self.key.0, at_ms = (self.clock_ms)(), hop = "spawned");
        let pgid = child.id().map(|p| p as i32);
        // Whatever ends this task (the process exiting, a kill, the node shutting down and
        // dropping it), the rank's whole process group goes with it, as torchrun does.
        let _group = ProcessGroup(pgid);
        let _recorded = pgid.and_then(|g| self.groups.as_ref().map(|r| r.record(g)));
        self.drive(child, pgid, log, control, stash).await
    }

    /// Drives the rank's [`RankWatch`] from its start to its end: reads its pipes into its
    /// log, waits on its process, the supervisor's messages and the watch's next deadline,
    /// and carries out what the watch decides. The exit code to report, as
    /// [`Run::supervise`].
    async fn drive(
        &mut self,
        mut child: tokio::process::Child,
        pgid: Option<i32>,
        log: tokio::fs::File,
        mut control: mpsc::Receiver<Control>,
        mut stash: VecDeque<Control>,
    ) -> anyhow::Result<Option<Exit>> {
        let id = self.key.0;
        let mut io = RankIo {
            stdin: child.stdin.take(),
            // Lines are batched into the log: one write per buffer, not two per line.
            log: tokio::io::BufWriter::with_capacity(LOG_BUFFER_BYTES, log),
            pgid,
        };
        if let Some(first) = self
            .protocol
            .as_ref()
            .and_then(|p| p.first_generation.as_ref())
        {
            tell(&mut io.stdin, first, id, self.rank).await;
        }
        let (line_tx, mut lines) = mpsc::channel::<(bool, String)>(LINE_QUEUE_DEPTH);
        let epoch = Instant::now();
        let rate = Arc::new(Mutex::new(LogRate::new(self.options.log_bytes_per_s, 0)));
        let out = child
            .stdout
            .take()
            .map(|s| tokio::spawn(pump(s, true, rate.clone(), epoch, line_tx.clone())));
        let err = child
            .stderr
            .take()
            .map(|s| tokio::spawn(pump(s, false, rate.clone(), epoch, line_tx)));
        let mut flush = tokio::time::interval(Duration::from_millis(LOG_FLUSH_MS));
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut looks = tokio::time::interval(Duration::from_millis(WATCH_PERIOD_MS));
        looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut watch = RankWatch::new(self.watched(), Instant::now());
        let status = 'run: loop {
            let deadline = watch.next_deadline();
            let actions = tokio::select! {
                status = child.wait(), if !watch.exited() => {
                    let status = status?;
                    if watch.takes_control() {
                        info!(job = %id, generation = self.generation, rank = self.rank, %status, "rank process exited");
                    }
                    watch.on_exit(Instant::now())
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now).into()), if deadline.is_some() => {
                    watch.on_timer(Instant::now())
                }
                _ = flush.tick() => {
                    io.log.flush().await?;
                    continue;
                }
                _ = looks.tick(), if watch.watches() => {
                    let stopped = pgid.is_some_and(|p| is_stopped(p as u32));
                    watch.on_watch(Instant::now(), stopped)
                }
                line = lines.recv() => match line {
                    Some((is_stdout, text)) => {
                        io.log_line(&text).await?;
                        watch.on_line(Instant::now(), is_stdout, &text)
                    }
                    None => break child.wait().await?,
                },
                msg = next_control(&mut stash, &mut control), if watch.takes_control() => {
                    watch.on_control(Instant::now(), msg)
                }
            };
            (self.generation, self.rank, self.standby) = watch.position();
            for action in actions {
                if self
                    .act(&mut io, &mut child, watch.exited(), action)
                    .await?
                {
                    warn!(job = %id, rank = self.rank, "rank exited but a process outside its group keeps its output open; not waiting for it");
                    break 'run child.wait().await?;
                }
            }
        };
        debug!(target: "ringleader::hops", job = %id, at_ms = (self.clock_ms)(), hop = "exited");
        for task in [out, err].into_iter().flatten() {
            // Done already unless a process outside the group holds a pipe (see above).
            if watch.exited() && !task.is_finished() {
                task.abort();
            }
            let _ = task.await;
        }
        // What the pumps still had counted when the pipes closed.
        let dropped = rate.lock().ok().and_then(|mut r| {
            let bytes_per_s = r.bytes_per_s();
            r.take_dropped().map(|d| d.note(bytes_per_s))
        });
        if let Some(note) = dropped {
            io.log_line(&note).await?;
        }
        io.log.flush().await?;
        use std::os::unix::process::ExitStatusExt;
        let (actions, code) = watch.on_end(status.code(), status.signal());
        for action in actions {
            self.act(&mut io, &mut child, true, action).await?;
        }
        Ok(code.map(|code| (code, watch.rank_end(code, status.signal()))))
    }

    /// What the rank's watch is told of it as it starts.
    fn watched(&self) -> Watched {
        Watched {
            id: self.key.0,
            worker: self.key.2,
            generation: self.generation,
            rank: self.rank,
            standby: self.standby,
            first_heartbeat_ms: self.protocol.as_ref().map(|p| p.first_heartbeat_ms),
            trial: TrialReports {
                metric: self.launch.trial_metric.clone(),
                from_metric_lines: self.launch.trial_metric_lines,
                rung: self.launch.trial_rung,
                ..TrialReports::default()
            },
        }
    }

    /// Carries out one of the watch's actions (`exited`: the process has exited); `true`
    /// when the pipes are no longer waited for.
    async fn act(
        &mut self,
        io: &mut RankIo,
        child: &mut tokio::process::Child,
        exited: bool,
        action: Action,
    ) -> std::io::Result<bool> {
        match action {
            Action::Log(note) => io.log_line(&note).await?,
            Action::Report(op) => self.report(op).await,
            Action::Offer(op) => self.offer(op),
            Action::Signal(signal) => {
                if let Some(pgid) = io.pgid {
                    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), signal);
                }
                if signal == nix::sys::signal::Signal::SIGKILL && !exited {
                    let _ = child.start_kill();
                }
            }
            Action::Tell(line) => tell(&mut io.stdin, &line, self.key.0, self.rank).await,
            Action::CloseStdin => io.stdin = None,
            Action::StopDraining => return Ok(true),
        }
        Ok(false)
    }

    /// Says in the rank's log and the job's events why its program did not start.
    async fn report_cannot_start(&self, why: &str) {
        let line = format!("ringleader: rank {} could not start: {why}\n", self.rank);
        let logged = async {
            let mut log = tokio::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.launch.log)
                .await?;
            log.write_all(line.as_bytes()).await?;
            log.flush().await
        };
        if let Err(e) = logged.await {
            warn!(job = %self.key.0, "could not write to the rank's log: {e}");
        }
        self.note(why.to_owned(), true).await;
    }

    /// Sends a note about this rank to the job's events (`cannot_start`: it never ran, so
    /// its retry should go elsewhere).
    async fn note(&self, message: String, cannot_start: bool) {
        let _ = self
            .reports
            .send(ControlCommand {
                op: Op::WorkerNote(ops::WorkerNote {
                    id: self.key.0,
                    generation: self.generation,
                    rank: self.rank,
                    message,
                    cannot_start,
                }),
                at_ms: (self.clock_ms)(),
            })
            .await;
    }

    /// Proposes `op` about this rank, waiting for room in the report queue.
    async fn report(&self, op: Op) {
        let at_ms = (self.clock_ms)();
        let _ = self.reports.send(ControlCommand { op, at_ms }).await;
    }

    /// Proposes `op` if the report queue has room (metrics, rank stats: best effort).
    fn offer(&self, op: Op) {
        let at_ms = (self.clock_ms)();
        let _ = self.reports.try_send(ControlCommand { op, at_ms });
    }

    /// Reports this standby joiner dropped (`reason`): it will not join the ring.
    async fn report_standby_dropped(&self, id: JobId, reason: String) {
        let worker = self.key.2;
        warn!(job = %id, worker, "standby dropped: {reason}");
        let op = Op::StandbyDropped(ops::StandbyDropped { id, worker, reason });
        let at_ms = (self.clock_ms)();
        let _ = self.reports.send(ControlCommand { op, at_ms }).await;
    }
}

/// A running rank's pipes and log, as [`Run::drive`] uses them.
struct RankIo {
    stdin: Option<tokio::process::ChildStdin>,
    log: tokio::io::BufWriter<tokio::fs::File>,
    /// Its process group (the process's own id).
    pgid: Option<i32>,
}

impl RankIo {
    /// Appends one line to the rank's log.
    async fn log_line(&mut self, line: &str) -> std::io::Result<()> {
        self.log.write_all(line.as_bytes()).await?;
        self.log.write_all(b"\n").await
    }
}

/// Writes one control line (`ringleader-generation {…}`, `ringleader-stop`) to a rank's
/// stdin, if it has one. A rank that takes none within [`STDIN_WRITE_MS`] (it does not read
/// its stdin) or whose stdin is closed has it closed: warned, never the line (it may hold
/// the ring secret).
async fn tell(stdin: &mut Option<tokio::process::ChildStdin>, line: &str, id: JobId, rank: u32) {
    let Some(pipe) = stdin.as_mut() else {
        return;
    };
    let sent = async {
        pipe.write_all(line.as_bytes()).await?;
        pipe.write_all(b"\n").await?;
        pipe.flush().await
    };
    let why = match tokio::time::timeout(Duration::from_millis(STDIN_WRITE_MS), sent).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("it took no line for {STDIN_WRITE_MS} ms"),
    };
    warn!(job = %id, rank, "could not write a control line to the rank's stdin ({why}): closing it");
    *stdin = None;
}

/// The rate limit on warnings about a rank's malformed `ringleader-…` lines.
#[derive(Debug, Default)]
struct Malformed {
    last_warn: Option<Instant>,
    /// Malformed lines since the last warning, not warned about.
    quiet: u64,
}

impl Malformed {
    /// Warns about `line` (once per [`MALFORMED_WARN_INTERVAL_MS`]; the rest are counted).
    fn note(&mut self, id: JobId, rank: u32, line: &str, error: &LineError, now: Instant) {
        let due = self.last_warn.is_none_or(|t| {
            now.duration_since(t) >= Duration::from_millis(MALFORMED_WARN_INTERVAL_MS)
        });
        if !due {
            self.quiet += 1;
            return;
        }
        let quoted: String = line.chars().take(MALFORMED_QUOTE_CHARS_MAX).collect();
        let skipped = std::mem::take(&mut self.quiet);
        self.last_warn = Some(now);
        warn!(job = %id, rank, line = %quoted, %error, skipped, "malformed protocol line ignored (see docs/book/src/reference/protocol.md)");
    }
}

/// Forwards a pipe's lines (cut at [`LINE_BYTES_MAX`]) until it closes, as far as the
/// rank's log cap `rate` lets them through: a dropped line costs a scan for its newline and
/// the cap's check, no copy; a protocol line always goes (see [`super::log_rate`]).
async fn pump<R: tokio::io::AsyncRead + Unpin>(
    pipe: R,
    is_stdout: bool,
    rate: Arc<Mutex<LogRate>>,
    epoch: Instant,
    tx: mpsc::Sender<(bool, String)>,
) {
    let mut reader = BufReader::with_capacity(PIPE_BUFFER_BYTES, pipe);
    let mut buf = Vec::new();
    // The last piece read ended without a newline: the next one is the rest of its line.
    let mut continuation = false;
    loop {
        buf.clear();
        match (&mut reader)
            .take(LINE_BYTES_MAX as u64)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let piece_of_line = continuation;
                continuation = buf.last() != Some(&b'\n');
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                let protocol = is_protocol(&buf, is_stdout, piece_of_line);
                let now_ms = epoch.elapsed().as_millis() as u64;
                let (keep, note) = match rate.lock() {
                    Ok(mut r) => match r.admit(now_ms, buf.len(), protocol) {
                        Verdict::Drop => (false, None),
                        Verdict::Write(dropped) => (true, dropped.map(|d| d.note(r.bytes_per_s()))),
                    },
                    Err(_) => (true, None),
                };
                if !keep {
                    continue;
                }
                if let Some(note) = note {
                    if tx.send((false, note)).await.is_err() {
                        return;
                    }
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

/// Writes a file the node hands a rank (a spec file, a `[[files]]` entry) as a new file:
/// its directories made, never followed through a symbolic link (one a rank of an earlier
/// run left, under `--run-as` another user's), an old file or link at `path` replaced.
async fn write_fresh(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use tokio::fs;
    if let Some(dir) = path.parent() {
        let mut missing = Vec::new();
        for d in dir.ancestors() {
            match fs::symlink_metadata(d).await {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(std::io::Error::other(format!(
                        "{} is a symbolic link: refused",
                        d.display()
                    )))
                }
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(d),
                Err(e) => return Err(e),
            }
        }
        for d in missing.into_iter().rev() {
            if let Err(e) = fs::create_dir(d).await {
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(e);
                }
            }
        }
    }
    if let Err(e) = fs::remove_file(path).await {
        if e.kind() != std::io::ErrorKind::NotFound {
            return Err(e);
        }
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await?;
    tokio::io::AsyncWriteExt::write_all(&mut file, contents).await?;
    tokio::io::AsyncWriteExt::flush(&mut file).await
}

/// A rank's hold on its job's uid of `--run-as-range`, given back when dropped.
struct UidHold(Arc<Mutex<JobUsers>>, JobId);

impl Drop for UidHold {
    fn drop(&mut self) {
        self.0.lock().expect("job users lock").ended_run(self.1);
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

mod tail;
#[cfg(test)]
mod tests;
mod watch;
