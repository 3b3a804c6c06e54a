//! The control state's side of searches: the commands that start, promote, copy and end
//! trials, a trial's reports (the searcher decides on each, deterministically, so every
//! replica agrees), and what happens to a trial when its job ends.
//!
//! A trial runs as a job of its own (`Job::trial_of`), placed like any job. Through its
//! life the same job runs it: a promotion or a re-run re-opens it (pending again, placed
//! as a new attempt), so a train trial resumes from its own checkpoint and its logs stay in
//! one place. Its outcome:
//! - a report: the searcher says continue, done (`succeeded`), pause at the rung
//!   (`paused`), promote (the job exits at its rung and is re-opened towards the next), or
//!   stop (`stopped`: its job is cancelled, its processes get SIGTERM then SIGKILL);
//! - its job exits 0: promoted → re-opened; otherwise `succeeded` (unless already decided);
//!   a run of a `resumable = true` command trial ends at its rung (`TrialOf::resumable`):
//!   its first report past the rung stands for the rung if it did not report the rung
//!   itself (it resumed beyond it), later ones are ignored, and its node stops it there if
//!   it goes on;
//! - its job fails because a member was lost: re-opened (a re-run elsewhere, from its last
//!   checkpoint), without counting as a failure;
//! - its job fails by its own exit code: re-opened while the search's failures are at most
//!   `max_trial_failures`, else `failed`;
//! - a speculative copy (`TrialCopy`) races the original: reports count only when they go
//!   beyond what the trial reported, the first to finish its run wins (the copy then
//!   becomes the trial's job) and the other is cancelled.

use trainer::search::{
    Decision, Params, Report, SearchSpec, Searcher, Trial, TrialKind, TrialState,
};

use super::{
    ignored, rejected, unknown, ControlCommand, ControlResponse, ControlState, EventKind, Job,
    JobId, JobState, Op, Slot,
};
use crate::domain::search::{
    record::{TrialOf, TrialRun},
    spec::{search_spec, trial_spec},
};

/// Most reports kept per trial (one per epoch or step that grows); later ones are ignored,
/// so a command trial that reports every step cannot grow the log without bound.
pub const REPORTS_PER_TRIAL_MAX: usize = 1_000;

/// A trial to start (see [`Op::TrialStart`](crate::domain::state::Op::TrialStart)).
pub(super) struct NewTrial<'a> {
    pub(super) trial: u32,
    pub(super) params: &'a Params,
    pub(super) bracket: u32,
    pub(super) target: u32,
}

/// The search's settings and searcher, from its spec (admitted, so this succeeds unless
/// the spec was changed under us).
pub fn searcher_of(job: &Job) -> Option<(SearchSpec, Searcher)> {
    let s = search_spec(&job.spec).ok()?;
    let searcher = s.searcher(s.resumable_trials()).ok()?;
    Some((s, searcher))
}

/// `k=v` pairs of a trial's params, for events.
pub fn params_text(params: &Params) -> String {
    params
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a trial's job ended, as far as the search cares.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RunEnd {
    Succeeded,
    /// Its own code failed (a rank exited non-zero).
    CodeFailed,
    /// It was lost with a member (not the trial's fault).
    Lost,
    Cancelled,
}

impl ControlState {
    /// The search `search`, if it runs.
    fn running_search(&mut self, search: JobId) -> Result<&mut Job, ControlResponse> {
        let job = self.jobs.get_mut(&search).ok_or_else(|| unknown(search))?;
        if job.search.is_none() || job.state != JobState::Running {
            return Err(rejected(format!("{search} is not a running search")));
        }
        Ok(job)
    }

    pub(super) fn trial_start(
        &mut self,
        log_index: u64,
        search: JobId,
        new: NewTrial<'_>,
        slots: &[Slot],
        secret: &str,
        at_ms: u64,
    ) -> ControlResponse {
        let job = match self.running_search(search) {
            Ok(j) => j,
            Err(r) => return r,
        };
        let Some((s, searcher)) = searcher_of(job) else {
            return rejected(format!("{search}: its search spec does not read"));
        };
        job.pending_reason = None;
        let record = job.search.as_mut().expect("a search");
        if new.trial as usize != record.trials.len() {
            return ignored(format!(
                "{search}: trial {} is not the next ({} exist)",
                new.trial,
                record.trials.len()
            ));
        }
        if new.trial >= searcher.budget() {
            return rejected(format!("{search}: all {} trials exist", new.trial));
        }
        let id = JobId::from_log_index(log_index);
        let mut run = Job::new(id, trial_spec(&job.spec, &s, new.trial, new.params), at_ms);
        run.trial_of = Some(TrialOf {
            search,
            trial: new.trial,
            metric: s.metric.clone(),
            target: new.target,
            copy: false,
            resumable: s.trial == TrialKind::Command && s.resumable,
        });
        run.push_event(
            at_ms,
            EventKind::Submitted,
            format!("trial {} of search {search}", new.trial),
        );
        run.place(slots, secret, at_ms, "start");
        record.trials.push(Trial {
            id: new.trial,
            params: new.params.clone(),
            bracket: new.bracket,
            state: TrialState::Running,
            target: new.target,
            reports: Vec::new(),
            promotions: 0,
        });
        record.runs.push(TrialRun {
            job: id,
            copy: None,
            node: slots.first().map(|s| s.name.clone()).unwrap_or_default(),
            run_started_at_ms: at_ms,
            run_ms: Vec::new(),
            note: String::new(),
            continue_to: None,
        });
        let node = slots.first().map_or("", |s| s.name.as_str()).to_owned();
        job.push_event(
            at_ms,
            EventKind::Trial,
            format!(
                "trial {} started as {id} on {node}: {}",
                new.trial,
                params_text(new.params)
            ),
        );
        self.jobs.insert(id, run);
        ControlResponse::Applied
    }

    pub(super) fn trial_promote(
        &mut self,
        search: JobId,
        trial: u32,
        target: u32,
        slots: &[Slot],
        secret: &str,
        at_ms: u64,
    ) -> ControlResponse {
        let job = match self.running_search(search) {
            Ok(j) => j,
            Err(r) => return r,
        };
        let record = job.search.as_mut().expect("a search");
        let Some((t, run)) = record.get_mut(trial) else {
            return rejected(format!("{search}: no trial {trial}"));
        };
        if t.state != TrialState::Paused || target <= t.target {
            return ignored(format!(
                "{search}: trial {trial} is {:?} at {}, not paused below {target}",
                t.state, t.target
            ));
        }
        t.state = TrialState::Running;
        t.target = target;
        t.promotions += 1;
        run.run_started_at_ms = at_ms;
        run.node = slots.first().map(|s| s.name.clone()).unwrap_or_default();
        let run_id = run.job;
        job.push_event(
            at_ms,
            EventKind::Trial,
            format!("trial {trial} promoted to {target}"),
        );
        let Some(run_job) = self.jobs.get_mut(&run_id) else {
            return ControlResponse::Applied;
        };
        if let Some(of) = run_job.trial_of.as_mut() {
            of.target = target;
        }
        run_job.place(slots, secret, at_ms, &format!("promoted to {target}"));
        ControlResponse::Applied
    }

    pub(super) fn trial_copy(
        &mut self,
        log_index: u64,
        search: JobId,
        trial: u32,
        slots: &[Slot],
        secret: &str,
        at_ms: u64,
    ) -> ControlResponse {
        let run_job = match self.running_search(search) {
            Ok(j) => j
                .search
                .as_ref()
                .and_then(|r| r.runs.get(trial as usize))
                .map(|r| r.job),
            Err(r) => return r,
        };
        let Some(original) = run_job.and_then(|id| self.jobs.get(&id)) else {
            return rejected(format!("{search}: no trial {trial}"));
        };
        if original.state != JobState::Running {
            return ignored(format!("{search}: trial {trial} is not running now"));
        }
        let id = JobId::from_log_index(log_index);
        let mut copy = Job::new(id, original.spec.clone(), at_ms);
        let mut of = original.trial_of.clone().expect("a trial's job");
        of.copy = true;
        let job = self.jobs.get_mut(&search).expect("checked");
        let record = job.search.as_mut().expect("a search");
        let Some((t, run)) = record.get_mut(trial) else {
            return rejected(format!("{search}: no trial {trial}"));
        };
        if t.state != TrialState::Running || run.copy.is_some() {
            return ignored(format!("{search}: trial {trial} needs no copy"));
        }
        copy.trial_of = Some(of);
        copy.push_event(
            at_ms,
            EventKind::Submitted,
            format!("speculative copy of trial {trial} of search {search}"),
        );
        copy.place(slots, secret, at_ms, "start");
        run.copy = Some(id);
        let node = slots.first().map_or("", |s| s.name.as_str()).to_owned();
        job.push_event(
            at_ms,
            EventKind::Trial,
            format!("trial {trial} runs slow: speculative copy {id} on {node}"),
        );
        self.jobs.insert(id, copy);
        ControlResponse::Applied
    }

    pub(super) fn trial_report(
        &mut self,
        id: JobId,
        generation: u32,
        resource: u32,
        value: f64,
        at_ms: u64,
    ) -> ControlResponse {
        let run_job = match self.current_attempt(id, generation) {
            Ok(j) => j,
            Err(r) => return r,
        };
        let Some(of) = run_job.trial_of.clone() else {
            return rejected(format!("{id} is not a trial's job"));
        };
        let Some(job) = self.jobs.get_mut(&of.search) else {
            return unknown(of.search);
        };
        let Some((_, searcher)) = searcher_of(job) else {
            return rejected(format!("{}: its search spec does not read", of.search));
        };
        let Some(record) = job.search.as_mut() else {
            return rejected(format!("{} is not a search", of.search));
        };
        let reached = record.reached(of.trial);
        let Some((t, run)) = record.get_mut(of.trial) else {
            return rejected(format!("{}: no trial {}", of.search, of.trial));
        };
        if t.state != TrialState::Running || (run.job != id && run.copy != Some(id)) {
            return ignored(format!("trial {} is {:?}", of.trial, t.state));
        }
        if resource <= reached {
            return ignored(format!("trial {} reported {reached} already", of.trial));
        }
        let resource = if of.resumable && of.target > 0 && resource > of.target {
            // A resumable run ends at its rung: what it did beyond is no result of a later
            // rung (the next run resumes from its checkpoint and reports that rung itself).
            if reached >= of.target {
                return ignored(format!(
                    "trial {}: a report at {resource}, beyond this run's rung {}",
                    of.trial, of.target
                ));
            }
            // Its first report past the rung stands for the rung: a run that went on past
            // its previous rung saved beyond it, so the promoted run resumes beyond this
            // one and never reports the rung itself (rungs 1, 2, 4: it resumes at 3).
            of.target
        } else {
            resource
        };
        if t.reports.len() >= REPORTS_PER_TRIAL_MAX {
            return ignored(format!(
                "trial {} has {REPORTS_PER_TRIAL_MAX} reports already",
                of.trial
            ));
        }
        t.reports.push(Report { resource, value });
        let decision = searcher.on_report(&record.trials, of.trial, resource, value);
        let (t, run) = record.get_mut(of.trial).expect("just found");
        let mut cancel = Vec::new();
        let other = if run.job == id {
            run.copy
        } else {
            Some(run.job)
        };
        let what = match decision {
            Decision::Continue => None,
            Decision::Done => {
                t.state = TrialState::Succeeded;
                cancel.extend(other);
                Some(format!("trial {} done at {resource}: {value}", of.trial))
            }
            Decision::Pause => {
                t.state = TrialState::Paused;
                cancel.extend(other);
                Some(format!(
                    "trial {} paused at rung {resource}: {value}",
                    of.trial
                ))
            }
            Decision::Promote { target } => {
                run.continue_to = Some(target);
                t.target = target;
                t.promotions += 1;
                cancel.extend(other);
                Some(format!(
                    "trial {} promoted at {resource} ({value}) to {target}",
                    of.trial
                ))
            }
            Decision::Stop => {
                t.state = TrialState::Stopped;
                run.note = format!("stopped early at {resource} ({value})");
                cancel.push(run.job);
                cancel.extend(run.copy);
                Some(format!("trial {} stopped at {resource}: {value}", of.trial))
            }
        };
        if other.is_some() && !cancel.is_empty() {
            // The reporting run won the race: it is the trial's job from now on.
            run.job = id;
            run.copy = None;
        }
        if let Some(what) = what {
            job.push_event(at_ms, EventKind::Trial, what);
        }
        for c in cancel {
            self.stop_run(c, at_ms, "stopped by the search");
        }
        ControlResponse::Applied
    }

    pub(super) fn search_finished(&mut self, search: JobId, at_ms: u64) -> ControlResponse {
        let job = match self.running_search(search) {
            Ok(j) => j,
            Err(r) => return r,
        };
        let record = job.search.as_mut().expect("a search");
        if record.active() > 0 {
            return rejected(format!(
                "{search}: {} trials still running",
                record.active()
            ));
        }
        for (t, run) in record.trials.iter_mut().zip(record.runs.iter_mut()) {
            if t.state == TrialState::Paused {
                t.state = TrialState::Stopped;
                run.note = "not promoted before the search ended".into();
            }
        }
        let settings = searcher_of(job).map(|(s, _)| s);
        let direction = settings.as_ref().map(|s| s.direction);
        let metric = settings.map(|s| s.metric).unwrap_or_default();
        let reports_required = job.spec.reports_required;
        let record = job.search.as_ref().expect("a search");
        let best = direction.and_then(|d| crate::domain::search::leaderboard::best(record, d));
        let succeeded = record
            .trials
            .iter()
            .filter(|t| t.state == TrialState::Succeeded)
            .count();
        let n = record.trials.len();
        match best {
            Some(b) => job.finish(
                at_ms,
                JobState::Succeeded,
                EventKind::Succeeded,
                format!(
                    "{n} trials; best trial {}: {} ({})",
                    b.id,
                    b.metric,
                    params_text(&b.params)
                ),
            ),
            // Trials that ran fine but reported no metric: a search submitted before
            // `reports_required` ran, nothing to rank (its log replays as it was).
            None if succeeded > 0 && !reports_required => job.finish(
                at_ms,
                JobState::Succeeded,
                EventKind::Succeeded,
                format!("{n} trials, {succeeded} succeeded; none reported its metric"),
            ),
            None if succeeded > 0 => job.finish(
                at_ms,
                JobState::Failed,
                EventKind::Failed,
                format!(
                    "no trial reported {metric} ({n} trials, {succeeded} succeeded): a trial \
                     prints `ringleader-metric {metric} VALUE [EPOCH]` (see docs/protocol.md)"
                ),
            ),
            None => job.finish(
                at_ms,
                JobState::Failed,
                EventKind::Failed,
                format!("{n} trials, none succeeded or reported its metric"),
            ),
        }
        ControlResponse::Applied
    }

    /// Cancels a trial's run job (its processes are stopped by their nodes).
    fn stop_run(&mut self, id: JobId, at_ms: u64, why: &str) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if !j.state.is_terminal() {
                j.finish(at_ms, JobState::Cancelled, EventKind::Cancelled, why);
            }
        }
    }

    /// A trial's job is pending again: a promotion's next run, or a re-run.
    fn reopen(&mut self, id: JobId, target: u32, at_ms: u64, why: String) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.state = JobState::Pending;
            j.finished_at_ms = None;
            if let Some(of) = j.trial_of.as_mut() {
                of.target = target;
            }
            j.push_event(at_ms, EventKind::Trial, why);
        }
    }

    /// Effects on searches of a command just applied: a trial's job that ended, a search
    /// cancelled.
    pub(super) fn after_applied(&mut self, cmd: &ControlCommand) {
        if let ControlCommand {
            op: Op::Place { id, slots, .. },
            at_ms,
        } = cmd
        {
            self.run_placed(*id, slots, *at_ms);
            return;
        }
        let (id, end, at_ms) = match cmd {
            ControlCommand {
                op: Op::WorkerExited { id, code, .. },
                at_ms,
            } => {
                let end = if *code == 0 {
                    RunEnd::Succeeded
                } else {
                    RunEnd::CodeFailed
                };
                (*id, end, *at_ms)
            }
            ControlCommand {
                op: Op::AttemptFailed { id, .. },
                at_ms,
            } => (*id, RunEnd::Lost, *at_ms),
            ControlCommand {
                op: Op::Cancel { id },
                at_ms,
            } => (*id, RunEnd::Cancelled, *at_ms),
            _ => return,
        };
        if matches!(
            cmd,
            ControlCommand {
                op: Op::Cancel { .. },
                ..
            }
        ) {
            self.search_cancelled(id, at_ms);
        }
        self.run_ended(id, end, at_ms);
    }

    /// A trial's job placed again (a re-run, a promotion's next run): where and since when.
    fn run_placed(&mut self, id: JobId, slots: &[Slot], at_ms: u64) {
        let Some(of) = self.jobs.get(&id).and_then(|j| j.trial_of.clone()) else {
            return;
        };
        let Some(record) = self
            .jobs
            .get_mut(&of.search)
            .and_then(|j| j.search.as_mut())
        else {
            return;
        };
        if let Some((_, run)) = record.get_mut(of.trial).filter(|(_, r)| r.job == id) {
            run.node = slots.first().map(|s| s.name.clone()).unwrap_or_default();
            run.run_started_at_ms = at_ms;
        }
    }

    fn search_cancelled(&mut self, search: JobId, at_ms: u64) {
        let Some(record) = self.jobs.get_mut(&search).and_then(|j| j.search.as_mut()) else {
            return;
        };
        let mut cancel = Vec::new();
        for (t, run) in record.trials.iter_mut().zip(record.runs.iter_mut()) {
            if matches!(
                t.state,
                TrialState::Running | TrialState::Pending | TrialState::Paused
            ) {
                t.state = TrialState::Stopped;
                run.note = "the search was cancelled".into();
                cancel.push(run.job);
                cancel.extend(run.copy.take());
            }
        }
        for c in cancel {
            self.stop_run(c, at_ms, "the search was cancelled");
        }
    }

    /// A trial's job that reached a terminal state: what becomes of the trial.
    fn run_ended(&mut self, id: JobId, end: RunEnd, at_ms: u64) {
        let Some(run_job) = self.jobs.get(&id) else {
            return;
        };
        let Some(of) = run_job.trial_of.clone() else {
            return;
        };
        let end = match run_job.state {
            JobState::Succeeded => RunEnd::Succeeded,
            JobState::Failed if end == RunEnd::Succeeded => RunEnd::CodeFailed,
            JobState::Failed => end,
            JobState::Cancelled => RunEnd::Cancelled,
            JobState::Pending | JobState::Running => return,
        };
        let last_reason = run_job
            .events
            .last()
            .map(|e| e.reason.clone())
            .unwrap_or_default();
        let Some(search) = self.jobs.get_mut(&of.search) else {
            return;
        };
        let max_failures = searcher_of(search).map_or(0, |(s, _)| s.max_trial_failures);
        let Some(record) = search.search.as_mut() else {
            return;
        };
        let failures = record.failures;
        let Some((t, run)) = record.get_mut(of.trial) else {
            return;
        };
        let original = run.job == id;
        if !original && run.copy != Some(id) {
            return; // a run that already lost its race
        }
        let other = if original { run.copy } else { Some(run.job) };
        let live = matches!(t.state, TrialState::Running | TrialState::Pending);
        let mut cancel = None;
        let mut reopen = None;
        let mut failed_one = false;
        let what = match end {
            RunEnd::Succeeded => {
                // This run finished first: it is the trial's job; the other is stopped.
                run.run_ms
                    .push((of.target, at_ms.saturating_sub(run.run_started_at_ms)));
                run.job = id;
                run.copy = None;
                cancel = other;
                if let Some(target) = run.continue_to.take().filter(|_| live) {
                    // Promoted at its rung: the same job goes on towards the next one (its
                    // run restarts when it is placed: `run_placed`).
                    reopen = Some((id, target, format!("promoted: runs on to {target}")));
                    None
                } else if live {
                    t.state = TrialState::Succeeded;
                    if t.reports.is_empty() {
                        run.note = format!("never printed {}", of.metric);
                        Some(format!(
                            "trial {} finished ({id} exited 0); trial {} never printed {}",
                            of.trial, of.trial, of.metric
                        ))
                    } else {
                        Some(format!("trial {} finished ({id} exited 0)", of.trial))
                    }
                } else {
                    None
                }
            }
            _ if !live => {
                if !original {
                    run.copy = None;
                }
                None
            }
            _ if other.is_some() => {
                // One of two racing runs ended badly: the other carries the trial.
                run.job = other.expect("checked");
                run.copy = None;
                Some(format!(
                    "trial {}: {id} ended ({last_reason}); its other run goes on",
                    of.trial
                ))
            }
            RunEnd::Cancelled => {
                t.state = TrialState::Stopped;
                run.note = "its job was cancelled".into();
                Some(format!("trial {} stopped: its job was cancelled", of.trial))
            }
            RunEnd::Lost => {
                reopen = Some((id, t.target, format!("re-run: {last_reason}")));
                Some(format!("trial {} re-runs: {last_reason}", of.trial))
            }
            RunEnd::CodeFailed if failures < max_failures => {
                failed_one = true;
                reopen = Some((
                    id,
                    t.target,
                    format!(
                        "retry after a failure ({last_reason}): the search's failure {} of {max_failures}",
                        failures + 1
                    ),
                ));
                Some(format!(
                    "trial {} failed ({last_reason}); retried (failure {} of {max_failures})",
                    of.trial,
                    failures + 1
                ))
            }
            RunEnd::CodeFailed => {
                failed_one = true;
                t.state = TrialState::Failed;
                run.note = last_reason.clone();
                let never = if t.reports.is_empty() {
                    format!("; trial {} never printed {}", of.trial, of.metric)
                } else {
                    String::new()
                };
                Some(format!(
                    "trial {} failed: {last_reason} (the search's {max_failures} retries are used){never}",
                    of.trial
                ))
            }
        };
        if failed_one {
            record.failures = record.failures.saturating_add(1);
        }
        if let Some(what) = what {
            search.push_event(at_ms, EventKind::Trial, what);
        }
        if let Some(c) = cancel {
            self.stop_run(c, at_ms, "its other run finished first");
        }
        if let Some((id, target, why)) = reopen {
            self.reopen(id, target, at_ms, why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobSpec;

    const ASHA: &str = r#"
name = "s"
kind = "search"
[train]
epochs = 9
[search]
algorithm = "asha"
trials = 9
metric = "val_accuracy"
direction = "max"
max_trial_failures = 1
[[search.params]]
name = "train.lr"
type = "double"
min = 0.01
max = 0.5
"#;

    /// A state with the search submitted at index 1; applies commands at the next index.
    struct Log {
        state: ControlState,
        index: u64,
    }

    impl Log {
        fn new(text: &str) -> (Log, JobId) {
            let mut log = Log {
                state: ControlState::default(),
                index: 0,
            };
            let spec = Box::new(JobSpec::parse(text).unwrap());
            let r = log.apply(ControlCommand {
                op: Op::Submit { spec, token: None },
                at_ms: 1,
            });
            let ControlResponse::Submitted { id } = r else {
                panic!("{r:?}")
            };
            (log, id)
        }

        fn apply(&mut self, cmd: ControlCommand) -> ControlResponse {
            self.index += 1;
            self.state.apply(self.index, &cmd)
        }

        /// Starts trial `trial` with `lr` towards `target` on member `m{trial}`; its job id.
        fn start(&mut self, search: JobId, trial: u32, lr: f64, target: u32) -> JobId {
            let mut params = Params::new();
            params.insert("train.lr".into(), toml::Value::Float(lr));
            let r = self.apply(ControlCommand {
                op: Op::TrialStart {
                    search,
                    trial,
                    params,
                    bracket: 0,
                    target,
                    slots: vec![slot(trial)],
                    secret: "ab".repeat(32),
                },
                at_ms: 10,
            });
            assert_eq!(r, ControlResponse::Applied);
            JobId::from_log_index(self.index)
        }

        fn report(&mut self, id: JobId, resource: u32, value: f64) -> ControlResponse {
            let generation = self.state.job(id).unwrap().generation;
            self.apply(ControlCommand {
                op: Op::TrialReport {
                    id,
                    generation,
                    resource,
                    value,
                },
                at_ms: 20,
            })
        }

        fn exit(&mut self, id: JobId, code: i32) {
            let generation = self.state.job(id).unwrap().generation;
            self.apply(ControlCommand {
                op: Op::WorkerExited {
                    id,
                    generation,
                    rank: 0,
                    code,
                },
                at_ms: 30,
            });
        }

        fn trial(&self, search: JobId, trial: u32) -> &Trial {
            &self
                .state
                .job(search)
                .unwrap()
                .search
                .as_ref()
                .unwrap()
                .trials[trial as usize]
        }
    }

    fn slot(i: u32) -> Slot {
        Slot {
            member: format!("id-{i}"),
            name: format!("m{i}"),
            rank: 0,
            local_rank: 0,
            worker: 0,
            gpus: Vec::new(),
        }
    }

    #[test]
    fn a_search_runs_from_its_submit_and_its_trials_are_jobs_of_their_own() {
        let (mut log, search) = Log::new(ASHA);
        assert_eq!(log.state.job(search).unwrap().state, JobState::Running);
        assert_eq!(log.state.pending().count(), 0, "a search is never placed");
        let run = log.start(search, 0, 0.1, 1);
        let job = log.state.job(run).unwrap();
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.spec.name, "s-t0");
        assert_eq!(
            job.spec.train.as_ref().unwrap()["lr"],
            toml::Value::Float(0.1)
        );
        assert_eq!(job.trial_of.as_ref().unwrap().target, 1);
        // Trials are created in order, once.
        let mut params = Params::new();
        params.insert("train.lr".into(), toml::Value::Float(0.2));
        let again = log.apply(ControlCommand {
            op: Op::TrialStart {
                search,
                trial: 0,
                params,
                bracket: 0,
                target: 1,
                slots: vec![slot(1)],
                secret: "ab".repeat(32),
            },
            at_ms: 11,
        });
        assert!(
            matches!(again, ControlResponse::Ignored { .. }),
            "{again:?}"
        );
    }

    #[test]
    fn a_promoted_trial_goes_on_in_the_same_job_and_a_paused_one_waits() {
        let (mut log, search) = Log::new(ASHA);
        let a = log.start(search, 0, 0.1, 1);
        let b = log.start(search, 1, 0.2, 1);
        let c = log.start(search, 2, 0.3, 1);
        // ⌊n/η⌋ of the rung so far: the first two pause, the third (best, n = 3) goes on.
        log.report(a, 1, 0.5);
        assert_eq!(log.trial(search, 0).state, TrialState::Paused);
        log.report(b, 1, 0.6);
        assert_eq!(log.trial(search, 1).state, TrialState::Paused);
        log.report(c, 1, 0.9);
        let t = log.trial(search, 2);
        assert_eq!(
            (t.state, t.target, t.promotions),
            (TrialState::Running, 3, 1)
        );
        // A report behind the trial's progress, or of an old generation, changes nothing.
        assert!(matches!(
            log.report(c, 1, 0.1),
            ControlResponse::Ignored { .. }
        ));
        // It exits at its rung; the same job is placed again towards rung 3.
        log.exit(c, 0);
        let job = log.state.job(c).unwrap();
        assert_eq!(job.state, JobState::Pending);
        assert_eq!(job.trial_of.as_ref().unwrap().target, 3);
        let old_generation = job.generation;
        log.apply(ControlCommand {
            op: Op::Place {
                id: c,
                generation: old_generation + 1,
                slots: vec![slot(2)],
                secret: "cd".repeat(32),
            },
            at_ms: 40,
        });
        let stale = log.apply(ControlCommand {
            op: Op::TrialReport {
                id: c,
                generation: old_generation,
                resource: 2,
                value: 0.95,
            },
            at_ms: 41,
        });
        assert!(
            matches!(stale, ControlResponse::Ignored { .. }),
            "{stale:?}"
        );
        // Alone at rung 3 (⌊1/3⌋ = 0 go on at once) it pauses; its job ends there.
        log.report(c, 3, 0.95);
        assert_eq!(log.trial(search, 2).state, TrialState::Paused);
        log.exit(c, 0);
        assert_eq!(log.state.job(c).unwrap().state, JobState::Succeeded);
        // The chief promotes it later (ASHA's late promotion): the same job runs again.
        let r = log.apply(ControlCommand {
            op: Op::TrialPromote {
                search,
                trial: 2,
                target: 9,
                slots: vec![slot(2)],
                secret: "cd".repeat(32),
            },
            at_ms: 50,
        });
        assert_eq!(r, ControlResponse::Applied);
        let job = log.state.job(c).unwrap();
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.trial_of.as_ref().unwrap().target, 9);
        assert_eq!(log.trial(search, 2).promotions, 2);
        log.report(c, 9, 0.97);
        assert_eq!(log.trial(search, 2).state, TrialState::Succeeded);
        log.exit(c, 0);
        assert_eq!(log.state.job(c).unwrap().state, JobState::Succeeded);
        // The paused trials stay until the search ends; then they are stopped.
        assert_eq!(log.trial(search, 0).state, TrialState::Paused);
        assert!(matches!(
            log.apply(ControlCommand {
                op: Op::SearchFinished { search },
                at_ms: 60
            }),
            ControlResponse::Applied
        ));
        assert_eq!(log.trial(search, 0).state, TrialState::Stopped);
        let s = log.state.job(search).unwrap();
        assert_eq!(s.state, JobState::Succeeded);
        assert!(s.events.last().unwrap().reason.contains("best trial 2"));
    }

    #[test]
    fn a_resumable_command_trials_run_reports_nothing_beyond_its_rung() {
        // The train search's settings, as command trials that resume from their checkpoints.
        let command = ASHA
            .replace(
                "[train]\nepochs = 9\n",
                "command = [\"python3\", \"t.py\"]\n",
            )
            .replace(
                "algorithm = \"asha\"",
                "trial = \"command\"\nalgorithm = \"asha\"\nmax_resource = 9\nresumable = true",
            );
        let (mut log, search) = Log::new(&command);
        let a = log.start(search, 0, 0.1, 1);
        let b = log.start(search, 1, 0.2, 1);
        let c = log.start(search, 2, 0.3, 1);
        let of = log.state.job(c).unwrap().trial_of.clone().unwrap();
        assert!(of.resumable && of.target == 1, "{of:?}");
        log.report(a, 1, 0.5);
        log.report(b, 1, 0.6);
        log.report(c, 1, 0.9);
        assert_eq!(log.trial(search, 2).target, 3, "promoted");
        // The run promoted at rung 1 went on past it: no result of rung 3's run.
        let past = log.report(c, 2, 0.99);
        assert!(matches!(past, ControlResponse::Ignored { .. }), "{past:?}");
        assert_eq!(log.trial(search, 2).reports.len(), 1);
        log.exit(c, 0);
        assert_eq!(
            log.state.job(c).unwrap().trial_of.as_ref().unwrap().target,
            3
        );
        // Placed again, the promoted run resumed past rung 3 (its last run saved beyond its
        // rung): its first report beyond the rung is the rung's, the next beyond it nothing.
        let generation = log.state.job(c).unwrap().generation;
        log.apply(ControlCommand {
            op: Op::Place {
                id: c,
                generation: generation + 1,
                slots: vec![slot(2)],
                secret: "cd".repeat(32),
            },
            at_ms: 40,
        });
        log.report(c, 4, 0.95);
        let reports = &log.trial(search, 2).reports;
        assert_eq!(reports.len(), 2, "{reports:?}");
        assert_eq!((reports[1].resource, reports[1].value), (3, 0.95));
        let again = log.report(c, 5, 0.97);
        assert!(
            matches!(again, ControlResponse::Ignored { .. }),
            "{again:?}"
        );
        // A train trial stops at its rung itself: it is not marked.
        let (mut train, search) = Log::new(ASHA);
        let t = train.start(search, 0, 0.1, 1);
        assert!(
            !train
                .state
                .job(t)
                .unwrap()
                .trial_of
                .as_ref()
                .unwrap()
                .resumable
        );
    }

    /// A search whose trials all exit 0 without a report ends failed naming the metric, and
    /// each such trial is named in its events; a search from an older log (its spec without
    /// `reports_required`) still ends succeeded, as it did.
    #[test]
    fn a_search_without_reports_fails_naming_the_metric_unless_from_an_older_log() {
        let one = ASHA.replace("trials = 9", "trials = 1");
        for required in [true, false] {
            let mut log = Log {
                state: ControlState::default(),
                index: 0,
            };
            let mut spec = JobSpec::parse(&one).unwrap();
            assert!(spec.reports_required, "set on every spec admitted now");
            spec.reports_required = required;
            let r = log.apply(ControlCommand {
                op: Op::Submit {
                    spec: Box::new(spec),
                    token: None,
                },
                at_ms: 1,
            });
            let ControlResponse::Submitted { id: search } = r else {
                panic!("{r:?}")
            };
            let a = log.start(search, 0, 0.1, 9);
            log.exit(a, 0);
            assert_eq!(log.trial(search, 0).state, TrialState::Succeeded);
            log.apply(ControlCommand {
                op: Op::SearchFinished { search },
                at_ms: 60,
            });
            let s = log.state.job(search).unwrap();
            assert!(
                s.events
                    .iter()
                    .any(|e| e.reason.contains("trial 0 never printed val_accuracy")),
                "{:?}",
                s.events
            );
            let last = &s.events.last().unwrap().reason;
            if required {
                assert_eq!(s.state, JobState::Failed);
                assert!(last.starts_with("no trial reported val_accuracy"), "{last}");
            } else {
                assert_eq!(s.state, JobState::Succeeded);
                assert!(last.contains("none reported its metric"), "{last}");
            }
        }
    }

    #[test]
    fn a_lost_trial_is_rerun_and_its_own_failures_are_counted() {
        let (mut log, search) = Log::new(ASHA);
        let a = log.start(search, 0, 0.1, 1);
        let generation = log.state.job(a).unwrap().generation;
        log.apply(ControlCommand {
            op: Op::AttemptFailed {
                id: a,
                generation,
                reason: "peer-lost m0 (rank 0): member dead".into(),
            },
            at_ms: 20,
        });
        assert_eq!(log.state.job(a).unwrap().state, JobState::Pending, "re-run");
        assert_eq!(
            log.state
                .job(search)
                .unwrap()
                .search
                .as_ref()
                .unwrap()
                .failures,
            0
        );
        log.apply(ControlCommand {
            op: Op::Place {
                id: a,
                generation: generation + 1,
                slots: vec![slot(1)],
                secret: "cd".repeat(32),
            },
            at_ms: 21,
        });
        let record = log.state.job(search).unwrap().search.as_ref().unwrap();
        assert_eq!(record.runs[0].node, "m1", "where it runs now");
        // Its own code fails: retried once (max_trial_failures = 1), then failed.
        log.exit(a, 3);
        assert_eq!(log.state.job(a).unwrap().state, JobState::Pending);
        log.apply(ControlCommand {
            op: Op::Place {
                id: a,
                generation: generation + 2,
                slots: vec![slot(1)],
                secret: "cd".repeat(32),
            },
            at_ms: 22,
        });
        log.exit(a, 3);
        assert_eq!(log.state.job(a).unwrap().state, JobState::Failed);
        assert_eq!(log.trial(search, 0).state, TrialState::Failed);
    }

    #[test]
    fn cancelling_a_search_stops_its_trials() {
        let (mut log, search) = Log::new(ASHA);
        let a = log.start(search, 0, 0.1, 1);
        log.apply(ControlCommand {
            op: Op::Cancel { id: search },
            at_ms: 20,
        });
        assert_eq!(log.state.job(a).unwrap().state, JobState::Cancelled);
        assert_eq!(log.trial(search, 0).state, TrialState::Stopped);
    }
}
