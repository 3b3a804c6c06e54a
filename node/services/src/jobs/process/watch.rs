//! A rank's life as a state machine (sans-IO): what the node does about each thing that
//! happens to a running rank (a line it prints, a look at its run state, its exit, a
//! message from the supervisor, a deadline) is decided here, from the event and the time
//! passed in, and returned as [`Action`]s; [`super::Run::supervise`] only drives it (reads
//! the pipes, waits on the process, the control queue and the next deadline, and carries
//! out the actions). So every rule of a rank's life is tested by events and times, without
//! a process or a clock:
//! - **Metrics**: `ringleader-metric` lines (and a report's values not printed as metric
//!   lines) are offered at most once per [`METRIC_REPORT_INTERVAL_MS`] per name, the last
//!   value of each kept and offered at the end.
//! - **Trial reports**: rank 0's reports of the search's metric ([`TrialReports`]) are
//!   always sent, after the line's metrics. A resumable trial's run that reported its rung
//!   is stopped [`RUNG_EXIT_GRACE_MS`] later if it still runs (SIGTERM, a note in its log),
//!   and its exit counts as reaching the rung.
//! - **Hangs**: a process stopped (run state T) for [`HUNG_STOPPED_MS`], or a heartbeat
//!   inside one compute section past [`HUNG_COMPUTE_FACTOR`] × its usual compute time (at
//!   least [`HUNG_COMPUTING_MS_MIN`]; [`HUNG_FIRST_COMPUTE_MS`] before it reported a step),
//!   is reported hung, once.
//! - **Silence**: a protocol rank that printed no heartbeat or rank stats within its bound
//!   is reported lost (a standby: dropped), again in each generation it survives into.
//! - **Stops**: a kill is SIGKILL at once; a graceful stop tells the rank `ringleader-stop`,
//!   closes its stdin, sends SIGTERM and SIGKILL after [`STOP_GRACE_MS`].
//! - **Preemption**: a requeue's stop is a graceful stop with the job's own grace
//!   (`[preemption] grace_s`) whose exit is reported (the job is requeued once every rank
//!   is out), without SIGTERM for an elastic train rank (it stops at the stop line and
//!   checkpoints; see [`Control::Preempt`]); asked once, a kill still ends it at once.
//! - **Failure**: the last lines of its stderr are kept ([`super::tail`]); a failed end
//!   is reported with them and the signal that ended it ([`RankWatch::rank_end`]).
//! - **Exit**: the rank's group is killed with it (unless a graceful stop's grace still
//!   runs), and its pipes get [`EXIT_DRAIN_MS`] past the exit (or the grace) to deliver
//!   what they hold; the exit code is the process's (128 + signal for a signal), 0 for a
//!   run stopped at its rung, none for a killed rank.
//!
//! May use: the domain's ops and the protocol crate's lines.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;
use ringleader_protocol::{ElasticFailed, Metric, RankLine};
use tracing::{info, warn};

use super::tail::StderrTail;
use super::{
    read_line, silent_rank_reason, Control, Malformed, Read, TrialReports, EXIT_DRAIN_MS,
    HUNG_COMPUTE_FACTOR, HUNG_COMPUTING_MS_MIN, HUNG_FIRST_COMPUTE_MS, HUNG_STOPPED_MS,
    METRIC_REPORT_INTERVAL_MS, RUNG_EXIT_GRACE_MS, STOP_GRACE_MS,
};
use crate::domain::state::{failure::RankEnd, ops, JobId, Op, REASON_BYTES_MAX};

/// What the driver does for the machine.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Action {
    /// Append this line (a note of the node's) to the rank's log.
    Log(String),
    /// Propose this op, waiting for room in the report queue.
    Report(Op),
    /// Propose this op if the report queue has room (metrics, rank stats: best effort).
    Offer(Op),
    /// Send this signal to the rank's process group (SIGKILL: the process too, while it
    /// runs).
    Signal(Signal),
    /// Write this control line to the rank's stdin.
    Tell(String),
    /// Close the rank's stdin.
    CloseStdin,
    /// Stop waiting for the pipes: a process outside the rank's group keeps them open.
    StopDraining,
}

/// One running rank, as the node sees it.
#[derive(Debug)]
pub(crate) struct RankWatch {
    id: JobId,
    /// Its worker (slot) index in the job.
    worker: u32,
    /// The generation and rank it runs as now.
    generation: u32,
    rank: u32,
    /// A standby joiner until its first generation arrives.
    standby: bool,
    /// A protocol rank's bound on its first heartbeat or rank stats, ms.
    first_heartbeat_ms: Option<u64>,
    started: Instant,
    /// A heartbeat or rank stats seen.
    spoke: bool,
    /// The generation it was last reported silent in.
    silent_reported: Option<u32>,
    trial: TrialReports,
    /// When a run that reported its rung is stopped.
    rung_deadline: Option<Instant>,
    stopped_at_rung: bool,
    /// Killed or stopped by the node: its exit is not reported.
    killed: bool,
    /// Asked to checkpoint and stop for a preemption: its exit is reported.
    preempted: bool,
    exited: bool,
    /// When a graceful stop's grace ends (SIGKILL).
    term_deadline: Option<Instant>,
    /// When the pipes stop being waited for, after the exit.
    drain_deadline: Option<Instant>,
    /// Since when its process is seen stopped.
    stopped_since: Option<Instant>,
    reported_hung: bool,
    /// Its compute time per step as it last reported it, ms (`None`: no step reported yet).
    compute_ms: Option<f64>,
    /// When each metric was last offered, and the last value of each held back since.
    last_sent: HashMap<String, Instant>,
    unsent: BTreeMap<String, Metric>,
    /// Names seen in metric lines: a report's values are job metrics unless printed so too.
    metric_names: HashSet<String>,
    malformed: Malformed,
    /// Its stderr's last lines, for a failed end.
    stderr: StderrTail,
}

/// The rank a [`RankWatch`] watches, as it starts.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub id: JobId,
    pub worker: u32,
    pub generation: u32,
    pub rank: u32,
    pub standby: bool,
    /// A protocol rank's bound on its first heartbeat, ms.
    pub first_heartbeat_ms: Option<u64>,
    pub trial: TrialReports,
}

impl RankWatch {
    /// A rank started at `now`.
    pub(crate) fn new(rank: Watched, now: Instant) -> RankWatch {
        RankWatch {
            id: rank.id,
            worker: rank.worker,
            generation: rank.generation,
            rank: rank.rank,
            standby: rank.standby,
            first_heartbeat_ms: rank.first_heartbeat_ms,
            started: now,
            spoke: false,
            silent_reported: None,
            trial: rank.trial,
            rung_deadline: None,
            stopped_at_rung: false,
            killed: false,
            preempted: false,
            exited: false,
            term_deadline: None,
            drain_deadline: None,
            stopped_since: None,
            reported_hung: false,
            compute_ms: None,
            last_sent: HashMap::new(),
            unsent: BTreeMap::new(),
            metric_names: HashSet::new(),
            malformed: Malformed::default(),
            stderr: StderrTail::default(),
        }
    }

    /// The generation and rank it runs as now, and whether it is still a standby.
    pub(crate) fn position(&self) -> (u32, u32, bool) {
        (self.generation, self.rank, self.standby)
    }

    /// Whether its process has exited.
    pub(crate) fn exited(&self) -> bool {
        self.exited
    }

    /// Whether it still takes the supervisor's messages (not once killed or stopped).
    pub(crate) fn takes_control(&self) -> bool {
        !self.killed
    }

    /// Whether its run state is still worth a look ([`RankWatch::on_watch`]).
    pub(crate) fn watches(&self) -> bool {
        !self.killed && !self.reported_hung
    }

    /// The next moment [`RankWatch::on_timer`] has something to do.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let rung = self.rung_deadline.filter(|_| !self.exited && !self.killed);
        [self.drain_deadline, self.term_deadline, rung]
            .into_iter()
            .flatten()
            .min()
    }

    /// Its process exited at `now`.
    pub(crate) fn on_exit(&mut self, now: Instant) -> Vec<Action> {
        self.exited = true;
        let drain = Duration::from_millis(EXIT_DRAIN_MS);
        let mut actions = Vec::new();
        match self.term_deadline {
            // Its children may be saving: they get the rest of the grace.
            Some(grace_end) => self.drain_deadline = Some(grace_end + drain),
            None => {
                // The rank is its group's leader: whatever it left running goes with it (a
                // child holding stdout would otherwise hide the exit).
                actions.push(Action::Signal(Signal::SIGKILL));
                self.drain_deadline = Some(now + drain);
            }
        }
        actions
    }

    /// The deadlines due at `now`.
    pub(crate) fn on_timer(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.drain_deadline.is_some_and(|d| d <= now) {
            self.drain_deadline = None;
            actions.push(Action::StopDraining);
        }
        if self.term_deadline.is_some_and(|d| d <= now) {
            self.term_deadline = None;
            actions.push(Action::Signal(Signal::SIGKILL));
        }
        let rung_due = self.rung_deadline.is_some_and(|d| d <= now);
        if rung_due && !self.exited && !self.killed {
            self.rung_deadline = None;
            self.stopped_at_rung = true;
            let rung = self.trial.rung.unwrap_or_default();
            info!(job = %self.id, rank = self.rank, rung, "trial run still going {RUNG_EXIT_GRACE_MS} ms after its rung: stopping it");
            actions.push(Action::Log(format!("ringleader: this run reached its rung ({rung}) and still runs {RUNG_EXIT_GRACE_MS} ms later: stopped (SIGTERM, SIGKILL after {STOP_GRACE_MS} ms); its run counts as reaching the rung")));
            actions.push(Action::Signal(Signal::SIGTERM));
            self.term_deadline = Some(now + Duration::from_millis(STOP_GRACE_MS));
        }
        actions
    }

    /// A look at its process at `now`: `stopped` when its run state is T.
    pub(crate) fn on_watch(&mut self, now: Instant, stopped: bool) -> Vec<Action> {
        let mut actions = Vec::new();
        if !self.watches() {
            return actions;
        }
        match (stopped, self.stopped_since) {
            (false, _) => self.stopped_since = None,
            (true, None) => self.stopped_since = Some(now),
            (true, Some(t)) if now.duration_since(t) >= Duration::from_millis(HUNG_STOPPED_MS) => {
                let ms = now.duration_since(t).as_millis();
                self.hung(
                    format!("its process is stopped (run state T) for {ms} ms"),
                    &mut actions,
                );
            }
            (true, Some(_)) => {}
        }
        if let Some(bound) = self.first_heartbeat_ms {
            let late = now.duration_since(self.started) >= Duration::from_millis(bound);
            if late && !self.spoke && self.silent_reported != Some(self.generation) {
                // Lost in each generation it survives into while silent: once fewer than
                // min_workers remain, the attempt fails with this.
                self.silent_reported = Some(self.generation);
                let reason = silent_rank_reason(bound);
                actions.push(if self.standby {
                    self.standby_dropped(reason)
                } else {
                    self.lost(false, reason)
                });
            }
        }
        actions
    }

    /// A line of its stdout (`is_stdout`) or stderr at `now` (the driver has logged it).
    pub(crate) fn on_line(&mut self, now: Instant, is_stdout: bool, text: &str) -> Vec<Action> {
        let mut actions = Vec::new();
        if !is_stdout {
            self.stderr.push(text);
            return actions;
        }
        let line = match read_line(text) {
            Read::Output => return actions,
            Read::Malformed(e) => {
                self.malformed.note(self.id, self.rank, text, &e, now);
                return actions;
            }
            Read::Line(line) => line,
        };
        self.spoke |= matches!(line, RankLine::Heartbeat { .. } | RankLine::RankStats(_));
        let report = if self.rank == 0 {
            self.trial.report(&line)
        } else {
            None
        };
        if self.rung_deadline.is_none() && !self.stopped_at_rung && self.trial.reached_rung() {
            self.rung_deadline = Some(now + Duration::from_millis(RUNG_EXIT_GRACE_MS));
        }
        let metrics = match line {
            RankLine::Metric(m) => {
                self.metric_names.insert(m.name.clone());
                vec![m]
            }
            RankLine::Report(r) => r
                .values
                .into_iter()
                .filter(|(name, _)| !self.metric_names.contains(name))
                .map(|(name, value)| Metric {
                    name,
                    value,
                    step: None,
                })
                .collect(),
            other => {
                self.elastic(other, &mut actions);
                Vec::new()
            }
        };
        for m in metrics {
            let due = self.last_sent.get(&m.name).is_none_or(|t| {
                now.duration_since(*t) >= Duration::from_millis(METRIC_REPORT_INTERVAL_MS)
            });
            if due {
                self.last_sent.insert(m.name.clone(), now);
                self.unsent.remove(&m.name);
                actions.push(self.metric(m));
            } else {
                self.unsent.insert(m.name.clone(), m);
            }
        }
        // Rank 0 reports for the trial (the rank may change with generations); after the
        // job metrics, which a stop decided on the report would otherwise find the job
        // ended. Never thinned: each is a decision of the search.
        if let Some((resource, value)) = report {
            actions.push(Action::Report(Op::TrialReport(ops::TrialReport {
                id: self.id,
                generation: self.generation,
                resource,
                value,
            })));
        }
        actions
    }

    /// A message of the supervisor at `now` (`None`: the supervisor is gone, as a kill).
    pub(crate) fn on_control(&mut self, now: Instant, msg: Option<Control>) -> Vec<Action> {
        match msg {
            Some(Control::Generation {
                generation,
                rank,
                line,
            }) => {
                info!(job = %self.id, generation, rank, "worker goes on in a new generation");
                self.standby = false;
                self.generation = generation;
                self.rank = rank;
                vec![Action::Tell(line)]
            }
            Some(Control::Kill) | None => {
                self.killed = true;
                vec![Action::Signal(Signal::SIGKILL)]
            }
            Some(Control::Preempt { grace_ms, sigterm }) => {
                if self.preempted {
                    return Vec::new();
                }
                self.preempted = true;
                self.term_deadline = Some(now + Duration::from_millis(grace_ms));
                info!(job = %self.id, rank = self.rank, grace_ms, sigterm, "preempted: asked to checkpoint and stop");
                let how = if sigterm {
                    "ringleader-stop, SIGTERM"
                } else {
                    "ringleader-stop"
                };
                let mut actions = vec![
                    Action::Log(format!("ringleader: preempted: checkpoint and stop ({how}; SIGKILL after {grace_ms} ms)")),
                    Action::Tell(ringleader_protocol::STOP_LINE.to_owned()),
                    Action::CloseStdin,
                ];
                if sigterm {
                    actions.push(Action::Signal(Signal::SIGTERM));
                }
                actions
            }
            Some(Control::Leave) => {
                self.killed = true;
                self.term_deadline = Some(now + Duration::from_millis(STOP_GRACE_MS));
                vec![
                    Action::Tell(ringleader_protocol::STOP_LINE.to_owned()),
                    Action::CloseStdin,
                ]
            }
            Some(Control::Stop) => {
                // A rank that reads control lines is told to stop (and its stdin ends);
                // then SIGTERM; SIGKILL when the grace period is over.
                self.killed = true;
                self.term_deadline = Some(now + Duration::from_millis(STOP_GRACE_MS));
                vec![
                    Action::Tell(ringleader_protocol::STOP_LINE.to_owned()),
                    Action::CloseStdin,
                    Action::Signal(Signal::SIGTERM),
                ]
            }
        }
    }

    /// Its end, with its process's exit `code` or the `signal` that ended it: the metrics
    /// held back, and the code to report (`None` for a rank the node killed or stopped).
    pub(crate) fn on_end(
        &mut self,
        code: Option<i32>,
        signal: Option<i32>,
    ) -> (Vec<Action>, Option<i32>) {
        if self.killed {
            return (Vec::new(), None);
        }
        let unsent = std::mem::take(&mut self.unsent);
        let actions = unsent.into_values().map(|m| self.metric(m)).collect();
        if self.stopped_at_rung {
            // Stopped by this node past its rung: the run did what it was for.
            return (actions, Some(0));
        }
        (
            actions,
            Some(code.unwrap_or_else(|| 128 + signal.unwrap_or(0))),
        )
    }

    /// What its exit report says of a failed end with `code` (the one [`RankWatch::on_end`]
    /// gave) and the `signal` that ended the process, if one did: the signal and its
    /// stderr's last lines; `None` for code 0.
    pub(crate) fn rank_end(&mut self, code: i32, signal: Option<i32>) -> Option<RankEnd> {
        if code == 0 {
            return None;
        }
        Some(RankEnd {
            signal: signal.filter(|s| code == 128 + s),
            stderr_tail: self.stderr.take(),
            start_error: None,
        })
    }

    fn metric(&self, m: Metric) -> Action {
        Action::Offer(Op::Metric(ops::Metric {
            id: self.id,
            generation: self.generation,
            name: m.name,
            value: m.value,
            step: m.step,
        }))
    }

    /// Reports it hung, once.
    fn hung(&mut self, reason: String, actions: &mut Vec<Action>) {
        if self.reported_hung {
            return;
        }
        self.reported_hung = true;
        actions.push(self.lost(true, reason));
    }

    /// Lost in its current generation (`hung`: by its own node's watch): the chief re-forms
    /// without it, or fails the attempt when too few ranks remain.
    fn lost(&self, hung: bool, reason: String) -> Action {
        let what = if hung { "worker hung" } else { "rank lost" };
        warn!(job = %self.id, generation = self.generation, rank = self.rank, "{what}: {reason}");
        Action::Report(Op::RankLost(ops::RankLost {
            id: self.id,
            generation: self.generation,
            rank: self.rank,
            hung,
            reason,
        }))
    }

    /// A standby that will not join the ring.
    fn standby_dropped(&self, reason: String) -> Action {
        warn!(job = %self.id, worker = self.worker, "standby dropped: {reason}");
        Action::Report(Op::StandbyDropped(ops::StandbyDropped {
            id: self.id,
            worker: self.worker,
            reason,
        }))
    }

    /// An elastic rank's line: rank stats, heartbeat, elastic failed or resumed, a
    /// standby's ready.
    fn elastic(&mut self, line: RankLine, actions: &mut Vec<Action>) {
        match line {
            RankLine::Ready if self.standby => {
                info!(job = %self.id, worker = self.worker, "standby ready");
                actions.push(Action::Report(Op::StandbyReady(ops::StandbyReady {
                    id: self.id,
                    worker: self.worker,
                })));
            }
            RankLine::RankStats(ringleader_protocol::RankStats {
                generation,
                rank,
                step,
                compute_ms,
                wait_ms,
            }) => {
                self.compute_ms = Some(compute_ms);
                actions.push(Action::Offer(Op::RankStats(ops::RankStats {
                    id: self.id,
                    generation,
                    rank,
                    step,
                    compute_ms,
                    wait_ms,
                })));
            }
            RankLine::ElasticFailed(ElasticFailed {
                generation,
                lost_rank: Some(rank),
                mut error,
            }) => {
                let mut cut = error.len().min(REASON_BYTES_MAX);
                while !error.is_char_boundary(cut) {
                    cut -= 1;
                }
                error.truncate(cut);
                actions.push(Action::Report(Op::RankLost(ops::RankLost {
                    id: self.id,
                    generation,
                    rank,
                    hung: false,
                    reason: format!("rank {} saw: {error}", self.rank),
                })));
            }
            RankLine::Heartbeat { computing_ms } => {
                let bound = match self.compute_ms {
                    Some(usual) => (HUNG_COMPUTE_FACTOR * usual).max(HUNG_COMPUTING_MS_MIN as f64),
                    None => HUNG_FIRST_COMPUTE_MS as f64,
                };
                if computing_ms as f64 >= bound {
                    let usual = match self.compute_ms {
                        Some(usual) => format!("usually {usual:.1} ms a step"),
                        None => "no step reported yet".into(),
                    };
                    self.hung(
                        format!(
                            "no progress: {computing_ms} ms inside one compute section ({usual})"
                        ),
                        actions,
                    );
                }
            }
            RankLine::ElasticResumed(r) => {
                for (name, value) in [
                    ("restored_step", r.restored_step),
                    ("steps_lost", r.steps_lost),
                ] {
                    actions.push(self.metric(Metric {
                        name: name.into(),
                        value: value as f64,
                        step: None,
                    }));
                }
            }
            // A failure that names no rank: the chief learns of it from the other ranks.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests;
