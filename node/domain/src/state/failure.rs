//! Why a job's attempt failed: its first failing rank's exit status and the last lines of
//! that rank's stderr, or why its program could not start, or, when no rank's exit is the
//! cause (a member lost, too few ranks left), the chief's reason. Kept on the job
//! ([`Job::failures`]) for `ringleader job`, the API's job document and Python's
//! `JobFailed`.
//!
//! A failure that repeats identically on the retry is deterministic (a missing module, a
//! typo in the script): the same exit status and the same last stderr line, or the same
//! start error. Such a job is not retried again (`Job::repeated_failure`), so it does
//! not burn its `max_restarts` on the same crash; its history says `not retried: the same
//! failure twice (…)`. A failure the chief reported (a lost member) never counts as a
//! repeat: it is not the program's.
//!
//! Sizes are bounded here, whatever the reporting node sent: at most
//! [`STDERR_TAIL_LINES_MAX`] lines of stderr, [`STDERR_TAIL_BYTES_MAX`] bytes in all, a
//! start error of [`REASON_BYTES_MAX`]. The node redacts the lines before it sends them
//! (`jobs::process::tail`).

use serde::{Deserialize, Serialize};

use super::{truncate_at_char, Job, REASON_BYTES_MAX};

/// Most stderr lines kept of a failed rank.
pub const STDERR_TAIL_LINES_MAX: usize = 5;
/// Most bytes of stderr kept of a failed rank, all lines together.
pub const STDERR_TAIL_BYTES_MAX: usize = 2048;
/// Failures kept per job: the latest attempt's and the one before (to tell a repeat).
pub const FAILURES_KEPT: usize = 2;

/// What two failures must share to be the same ([`Failure::repeats`]): the start error,
/// the exit code, the signal, the last stderr line.
type Signature<'a> = (Option<&'a str>, Option<i32>, Option<i32>, Option<&'a str>);

/// What a failed rank's node saw of its end, sent with its exit
/// ([`super::ops::WorkerExited::end`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankEnd {
    /// The signal that ended it (its code is then 128 + signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The last lines of its stderr, oldest first, redacted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
    /// Why its program could not start (missing, not executable, a refused set-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
}

/// Why one attempt of a job failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The attempt that failed.
    pub attempt: u32,
    /// The failing rank, when a rank's end is the cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its member's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub member: String,
    /// Its exit code, when it exited by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why its program could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_error: Option<String>,
    /// The chief's reason, when no rank's end is the cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The last lines of the rank's stderr, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
}

impl Failure {
    /// Rank `rank` on `member` ended with `code` in `attempt`, as its node saw it (`end`:
    /// none from a node that sends no detail). Bounded.
    pub fn of_rank(
        attempt: u32,
        rank: u32,
        member: &str,
        code: i32,
        end: Option<&RankEnd>,
    ) -> Failure {
        let end = end.cloned().unwrap_or_default();
        let mut start_error = end.start_error;
        if let Some(e) = start_error.as_mut() {
            truncate_at_char(e, REASON_BYTES_MAX);
        }
        Failure {
            attempt,
            rank: Some(rank),
            member: member.to_owned(),
            exit_code: (end.signal.is_none() && start_error.is_none()).then_some(code),
            signal: end.signal.filter(|_| start_error.is_none()),
            start_error,
            reason: None,
            stderr_tail: bounded_tail(end.stderr_tail),
        }
    }

    /// `attempt` failed for the chief's `reason` (no rank's end).
    pub fn of_reason(attempt: u32, reason: &str) -> Failure {
        let mut reason = reason.to_owned();
        truncate_at_char(&mut reason, REASON_BYTES_MAX);
        Failure {
            attempt,
            rank: None,
            member: String::new(),
            exit_code: None,
            signal: None,
            start_error: None,
            reason: Some(reason),
            stderr_tail: Vec::new(),
        }
    }

    /// The cause in a few words, without where: `exit 1: ModuleNotFoundError: No module
    /// named 'foo'` (the status, then the last stderr line), `signal 9`, `could not start:
    /// …`, or the chief's reason.
    pub fn cause(&self) -> String {
        let status = match (&self.start_error, self.signal, self.exit_code, &self.reason) {
            (Some(e), ..) => return format!("could not start: {e}"),
            (None, Some(s), ..) => format!("signal {s}"),
            (None, None, Some(c), _) => format!("exit {c}"),
            (None, None, None, Some(r)) => return r.clone(),
            (None, None, None, None) => "failed".to_owned(),
        };
        match self.stderr_tail.last() {
            Some(line) => format!("{status}: {line}"),
            None => status,
        }
    }

    /// The cause with where it happened: `rank 0 on m1: exit 1: …`.
    pub fn headline(&self) -> String {
        match self.rank {
            Some(rank) => format!("rank {rank} on {}: {}", self.member, self.cause()),
            None => self.cause(),
        }
    }

    /// What must match for two failures to be the same: the start error, or the exit
    /// status and the last stderr line; `None` for the chief's reasons (not the program's).
    fn signature(&self) -> Option<Signature<'_>> {
        if self.reason.is_some() {
            return None;
        }
        Some((
            self.start_error.as_deref(),
            self.exit_code,
            self.signal,
            self.stderr_tail.last().map(String::as_str),
        ))
    }

    /// Whether this failure repeats `earlier` identically (a deterministic failure).
    pub fn repeats(&self, earlier: &Failure) -> bool {
        self.attempt > earlier.attempt
            && self.signature().is_some()
            && self.signature() == earlier.signature()
    }
}

/// `lines` cut to the last [`STDERR_TAIL_LINES_MAX`] and [`STDERR_TAIL_BYTES_MAX`] bytes in
/// all (the newest kept; a line longer than the rest of the room is cut).
pub fn bounded_tail(mut lines: Vec<String>) -> Vec<String> {
    if lines.len() > STDERR_TAIL_LINES_MAX {
        lines.drain(..lines.len() - STDERR_TAIL_LINES_MAX);
    }
    let mut room = STDERR_TAIL_BYTES_MAX;
    let mut kept = Vec::with_capacity(lines.len());
    for mut line in lines.into_iter().rev() {
        if room == 0 {
            break;
        }
        truncate_at_char(&mut line, room);
        room -= line.len();
        kept.push(line);
    }
    kept.reverse();
    kept
}

impl Job {
    /// The latest failed attempt's cause (the current attempt's, while it fails).
    pub fn failure(&self) -> Option<&Failure> {
        self.failures.last()
    }

    /// Records `failure` as its attempt's cause unless that attempt has one already (the
    /// first failing rank is the cause; the others usually fail because of it).
    pub(super) fn note_failure(&mut self, failure: Failure) {
        if self.failure().is_some_and(|f| f.attempt == failure.attempt) {
            return;
        }
        self.failures.push(failure);
        if self.failures.len() > FAILURES_KEPT {
            let extra = self.failures.len() - FAILURES_KEPT;
            self.failures.drain(..extra);
        }
    }

    /// The current attempt's failure, if it repeats the previous failed attempt's
    /// identically.
    pub(super) fn repeated_failure(&self) -> Option<&Failure> {
        match self.failures.as_slice() {
            [.., earlier, latest] if latest.attempt == self.attempt && latest.repeats(earlier) => {
                Some(latest)
            }
            _ => None,
        }
    }
}

/// The most common cause among `failures` and how many share it (ties: the first seen), as
/// `9 failed with exit 1: …`; `None` without failures.
pub fn most_common<'a>(failures: impl IntoIterator<Item = &'a Failure>) -> Option<String> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for cause in failures.into_iter().map(Failure::cause) {
        match counts.iter_mut().find(|(c, _)| *c == cause) {
            Some((_, n)) => *n += 1,
            None => counts.push((cause, 1)),
        }
    }
    let mut best: Option<&(String, usize)> = None;
    for entry in &counts {
        if best.is_none_or(|b| entry.1 > b.1) {
            best = Some(entry);
        }
    }
    best.map(|(cause, n)| format!("{n} failed with {cause}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(attempt: u32, code: i32, tail: &[&str]) -> Failure {
        let end = RankEnd {
            stderr_tail: tail.iter().map(|s| s.to_string()).collect(),
            ..RankEnd::default()
        };
        Failure::of_rank(attempt, 0, "m0", code, Some(&end))
    }

    #[test]
    fn the_cause_is_the_status_and_the_last_stderr_line() {
        let f = exit(
            1,
            1,
            &["Traceback …", "ModuleNotFoundError: No module named 'foo'"],
        );
        assert_eq!(
            f.cause(),
            "exit 1: ModuleNotFoundError: No module named 'foo'"
        );
        assert_eq!(
            f.headline(),
            "rank 0 on m0: exit 1: ModuleNotFoundError: No module named 'foo'"
        );
        let killed = RankEnd {
            signal: Some(9),
            ..RankEnd::default()
        };
        let f = Failure::of_rank(1, 2, "m2", 137, Some(&killed));
        assert_eq!((f.exit_code, f.cause().as_str()), (None, "signal 9"));
        let missing = RankEnd {
            start_error: Some("program \"x\" not found".into()),
            stderr_tail: vec!["ignored".into()],
            ..RankEnd::default()
        };
        let f = Failure::of_rank(1, 0, "m0", 127, Some(&missing));
        assert_eq!(f.cause(), "could not start: program \"x\" not found");
        assert_eq!(Failure::of_reason(1, "lost m1").headline(), "lost m1");
        // A node that sends no detail: the code alone.
        assert_eq!(Failure::of_rank(1, 0, "m0", 3, None).cause(), "exit 3");
    }

    #[test]
    fn the_same_status_and_last_line_or_start_error_repeat_a_reason_never_does() {
        let first = exit(1, 1, &["a", "boom"]);
        assert!(exit(2, 1, &["other", "boom"]).repeats(&first));
        assert!(!exit(2, 2, &["boom"]).repeats(&first), "another code");
        assert!(!exit(2, 1, &["bang"]).repeats(&first), "another last line");
        assert!(!exit(1, 1, &["boom"]).repeats(&first), "the same attempt");
        assert!(
            exit(2, 3, &[]).repeats(&exit(1, 3, &[])),
            "no stderr, twice"
        );
        let start = |attempt, e: &str| {
            let end = RankEnd {
                start_error: Some(e.into()),
                ..RankEnd::default()
            };
            Failure::of_rank(attempt, 0, "m0", 127, Some(&end))
        };
        assert!(start(2, "missing").repeats(&start(1, "missing")));
        assert!(!start(2, "missing").repeats(&start(1, "denied")));
        let lost = Failure::of_reason(1, "lost m1");
        assert!(!Failure::of_reason(2, "lost m1").repeats(&lost));
    }

    #[test]
    fn a_tail_is_bounded_in_lines_and_bytes_keeping_the_newest() {
        let many: Vec<String> = (0..9).map(|i| format!("line {i}")).collect();
        assert_eq!(
            bounded_tail(many),
            ["line 4", "line 5", "line 6", "line 7", "line 8"]
        );
        let long = vec!["é".repeat(2_000), "x".repeat(1_500)];
        let tail = bounded_tail(long);
        assert_eq!(tail[1].len(), 1_500);
        assert!(tail.iter().map(String::len).sum::<usize>() <= STDERR_TAIL_BYTES_MAX);
        let f = exit(1, 1, &[&"y".repeat(5_000)]);
        assert_eq!(f.stderr_tail[0].len(), STDERR_TAIL_BYTES_MAX);
    }

    #[test]
    fn the_most_common_cause_is_named_with_its_count() {
        let fs = [
            exit(1, 1, &["boom"]),
            exit(1, 2, &["bang"]),
            exit(1, 1, &["boom"]),
        ];
        assert_eq!(
            most_common(&fs).as_deref(),
            Some("2 failed with exit 1: boom")
        );
        assert_eq!(most_common(&[]), None);
    }
}
