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

use ringleader_spec::search::{
    Decision, Params, Report, SearchSpec, Searcher, Trial, TrialKind, TrialState,
};

use super::{
    ignored, rejected, unknown, ControlResponse, ControlState, EventKind, Job, JobId, JobState,
    Slot,
};
use crate::search::{
    record::{TrialOf, TrialRun},
    spec::{search_spec, trial_spec},
};

/// Most reports kept per trial (one per epoch or step that grows); later ones are ignored,
/// so a command trial that reports every step cannot grow the log without bound.
pub const REPORTS_PER_TRIAL_MAX: usize = 1_000;

/// A trial to start (see [`Op::TrialStart`](crate::state::Op::TrialStart)).
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
pub(super) enum RunEnd {
    /// It succeeded (as far as its command knows: the job's state decides).
    Succeeded,
    /// Its own code failed (a rank exited non-zero).
    CodeFailed,
    /// It was lost with a member (not the trial's fault).
    Lost,
    /// It, or its search, was cancelled.
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
        let spec = trial_spec(&job.spec, &s, new.trial, new.params);
        // A trial is its search's: it inherits the search's owner.
        let mut run = Job::new(id, spec, &job.owner, at_ms);
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
        // A trial runs again: the search's trials no longer all wait.
        job.pending_reason = None;
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
        let mut copy = Job::new(id, original.spec.clone(), &original.owner, at_ms);
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
            self.stop_run(c, at_ms, "stopped by the search", true);
        }
        ControlResponse::Applied
    }

    pub(super) fn search_finished(&mut self, search: JobId, at_ms: u64) -> ControlResponse {
        let causes = self.trials_most_common_failure(search);
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
        let best = direction.and_then(|d| crate::search::leaderboard::best(record, d));
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
                     prints `ringleader-metric {metric} VALUE [EPOCH]` (see \
                     docs/book/src/reference/protocol.md)"
                ),
            ),
            None => job.finish(
                at_ms,
                JobState::Failed,
                EventKind::Failed,
                match causes {
                    Some(causes) => format!("{n} trials, none succeeded; {causes}"),
                    None => format!("{n} trials, none succeeded or reported its metric"),
                },
            ),
        }
        ControlResponse::Applied
    }

    /// The most common cause among the failed runs of `search`'s trials, with its count
    /// (`9 failed with exit 1: …`; see `failure::most_common`).
    fn trials_most_common_failure(&self, search: JobId) -> Option<String> {
        let record = self.jobs.get(&search)?.search.as_ref()?;
        let failed = record
            .runs
            .iter()
            .filter_map(|run| self.jobs.get(&run.job))
            .filter(|j| j.state == JobState::Failed)
            .filter_map(Job::failure);
        super::failure::most_common(failed)
    }

    /// Cancels a trial's run job (its processes are stopped by their nodes); `by_search`:
    /// the search decided it (the job reads `stopped`), not a cancel of the search.
    fn stop_run(&mut self, id: JobId, at_ms: u64, why: &str, by_search: bool) {
        if let Some(j) = self.jobs.get_mut(&id) {
            if !j.state.is_terminal() {
                j.stopped_by_search = by_search;
                j.finish(at_ms, JobState::Cancelled, EventKind::Cancelled, why);
            }
        }
    }

    /// A trial's job is pending again: a promotion's next run, or a re-run.
    fn reopen(&mut self, id: JobId, target: u32, at_ms: u64, why: String) {
        if let Some(j) = self.jobs.get_mut(&id) {
            j.state = JobState::Pending;
            j.finished_at_ms = None;
            j.stopped_by_search = false;
            if let Some(of) = j.trial_of.as_mut() {
                of.target = target;
            }
            j.push_event(at_ms, EventKind::Trial, why);
        }
    }

    /// A trial's job placed again (a re-run, a promotion's next run): where and since when.
    /// `Place` calls it once applied (its effect on searches).
    pub(super) fn run_placed(&mut self, id: JobId, slots: &[Slot], at_ms: u64) {
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

    /// A cancelled search's running, pending and paused trials stop, and their jobs with
    /// them. `Cancel` calls it once applied.
    pub(super) fn search_cancelled(&mut self, search: JobId, at_ms: u64) {
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
            self.stop_run(c, at_ms, "the search was cancelled", false);
        }
    }

    /// A trial's job that reached a terminal state: what becomes of the trial. The commands
    /// that may end a job (`WorkerExited`, `AttemptFailed`, `Cancel`) call it once applied.
    pub(super) fn run_ended(&mut self, id: JobId, end: RunEnd, at_ms: u64) {
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
            self.stop_run(c, at_ms, "its other run finished first", true);
        }
        if let Some((id, target, why)) = reopen {
            self.reopen(id, target, at_ms, why);
        }
    }
}

#[cfg(test)]
mod tests;
