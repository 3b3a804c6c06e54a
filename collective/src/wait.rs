//! Waiting for GPU work without ever being stuck in it: the [`Waiter`] polls the work and
//! the [`AbortCell`]'s cause in a loop, as PyTorch's NCCL watchdog does, instead of blocking
//! in a call an abort cannot interrupt (`cuStreamSynchronize`, a blocking NCCL call). The
//! work is whatever the caller's query reports on: NCCL's set-up of a communicator and the
//! queuing of an operation (`ncclCommGetAsyncError` leaving `ncclInProgress`), or the
//! stream running it (`cuStreamQuery`).
//!
//! [`Waiter::step`] is the decision (plain, unit tested); [`wait_for`] drives it with the
//! real clock, sleeping between polls.

use std::time::{Duration, Instant};

use crate::abort::{AbortCell, Abortable};
use crate::error::CollectiveError;

/// Polls that only yield the thread before the waiter starts to sleep: operations shorter
/// than a few hundred microseconds see no added latency.
const WAIT_SPIN_POLLS: u32 = 256;
/// First sleep between two polls once spinning is over, µs; it doubles up to
/// [`WAIT_SLEEP_US_MAX`].
const WAIT_SLEEP_US_MIN: u64 = 10;
/// Longest sleep between two polls, µs: the latency added to a long operation at most.
const WAIT_SLEEP_US_MAX: u64 = 500;

/// What one poll of the queued work found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StreamState {
    /// Everything queued has completed.
    Done,
    /// Still running.
    Pending,
    /// CUDA or NCCL reported an error (a failed query, `ncclCommGetAsyncError`, a failed
    /// enqueue).
    Failed(String),
}

/// What the waiting thread does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    /// The operation completed before any abort: its result is valid.
    Done,
    /// The communicator was aborted: return this cause (after the abort has finished).
    Aborted(CollectiveError),
    /// CUDA or NCCL failed and no cause came within the grace period, or the work was still
    /// pending at the wait's deadline: abort with this error and tell the group.
    Fault(CollectiveError),
    /// Poll again after this long (zero: just yield).
    Sleep(Duration),
}

/// The decision of one wait.
///
/// Contract with the driver: in every round it queries the stream *first* and reads the
/// abort cause *second*. So `Done` with no cause means the work completed before any abort
/// began (an abort ends NCCL's kernels early, after which the stream also reads as done:
/// with a cause, `Done` proves nothing and the cause wins).
///
/// A deadline, when set, bounds how long the work may stay pending (times count from the
/// start of the wait); a failure keeps its grace period.
#[derive(Debug)]
pub(crate) struct Waiter {
    fault_grace_ms: u64,
    deadline: Option<(u64, CollectiveError)>,
    polls: u32,
    fault_since_ms: Option<u64>,
}

impl Waiter {
    /// A wait without deadline that gives the watchdog `fault_grace_ms` to name a cause
    /// after CUDA or NCCL reported an error.
    pub fn new(fault_grace_ms: u64) -> Self {
        Waiter {
            fault_grace_ms,
            deadline: None,
            polls: 0,
            fault_since_ms: None,
        }
    }

    /// The same wait, ending with `error` if the work is still pending after `after_ms`.
    pub fn with_deadline(mut self, after_ms: u64, error: CollectiveError) -> Self {
        self.deadline = Some((after_ms, error));
        self
    }

    /// One round at `now_ms`: the work's state, then the abort cause read after it.
    pub fn step(
        &mut self,
        now_ms: u64,
        stream: StreamState,
        cause: Option<CollectiveError>,
    ) -> Step {
        if let Some(e) = cause {
            return Step::Aborted(e);
        }
        match stream {
            StreamState::Done => Step::Done,
            StreamState::Pending => match &self.deadline {
                Some((after_ms, e)) if now_ms >= *after_ms => Step::Fault(e.clone()),
                _ => {
                    self.polls = self.polls.saturating_add(1);
                    Step::Sleep(backoff(self.polls))
                }
            },
            StreamState::Failed(detail) => {
                let since = *self.fault_since_ms.get_or_insert(now_ms);
                if now_ms.saturating_sub(since) >= self.fault_grace_ms {
                    Step::Fault(CollectiveError::Nccl(detail))
                } else {
                    Step::Sleep(Duration::from_micros(WAIT_SLEEP_US_MAX))
                }
            }
        }
    }
}

/// Sleep before poll number `polls + 1`: none while spinning, then doubling to the cap.
fn backoff(polls: u32) -> Duration {
    if polls <= WAIT_SPIN_POLLS {
        return Duration::ZERO;
    }
    let doublings = (polls - WAIT_SPIN_POLLS).min(16);
    let us = (WAIT_SLEEP_US_MIN << doublings).min(WAIT_SLEEP_US_MAX);
    Duration::from_micros(us)
}

/// Blocks the calling thread until `query` reports the work done, or the cell is aborted
/// (its cause is returned once the abort has finished), or CUDA/NCCL fails (then, after the
/// waiter's grace period without a cause from the watchdog), or the waiter's deadline
/// passes: in the last two cases, aborts the cell and the TCP group with the error and
/// returns the cause that won. `query` must not block: it runs between two checks of the
/// cause.
pub(crate) fn wait_for<C: Abortable>(
    cell: &AbortCell<C>,
    mut waiter: Waiter,
    mut query: impl FnMut() -> StreamState,
) -> Result<(), CollectiveError> {
    let start = Instant::now();
    loop {
        let stream = query();
        let cause = cell.cause();
        let now_ms = start.elapsed().as_millis() as u64;
        match waiter.step(now_ms, stream, cause) {
            Step::Done => return Ok(()),
            Step::Aborted(e) => {
                cell.settle();
                return Err(e);
            }
            Step::Fault(e) => {
                cell.abort_group(e.clone());
                return Err(cell.cause().unwrap_or(e));
            }
            Step::Sleep(d) if d.is_zero() => std::thread::yield_now(),
            Step::Sleep(d) => std::thread::sleep(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::abort::tests::{group_handle, FakeComm};

    #[test]
    fn done_before_any_abort_is_valid() {
        let mut w = Waiter::new(100);
        assert_eq!(w.step(0, StreamState::Done, None), Step::Done);
    }

    #[test]
    fn a_cause_wins_even_over_done() {
        let lost = CollectiveError::PeerLost { rank: 3 };
        let mut w = Waiter::new(100);
        assert_eq!(
            w.step(0, StreamState::Done, Some(lost.clone())),
            Step::Aborted(lost.clone())
        );
        assert_eq!(
            w.step(0, StreamState::Pending, Some(lost.clone())),
            Step::Aborted(lost.clone())
        );
        let mut w = Waiter::new(100);
        assert_eq!(
            w.step(
                5,
                StreamState::Failed("remote error".into()),
                Some(lost.clone())
            ),
            Step::Aborted(lost)
        );
    }

    #[test]
    fn a_fault_waits_for_the_grace_period_then_aborts() {
        let mut w = Waiter::new(100);
        let failed = || StreamState::Failed("ncclRemoteError".into());
        assert!(matches!(w.step(1_000, failed(), None), Step::Sleep(_)));
        assert!(matches!(w.step(1_099, failed(), None), Step::Sleep(_)));
        assert_eq!(
            w.step(1_100, failed(), None),
            Step::Fault(CollectiveError::Nccl("ncclRemoteError".into()))
        );
    }

    fn init_deadline() -> CollectiveError {
        CollectiveError::Nccl("set-up not done after 50 ms".into())
    }

    #[test]
    fn a_deadline_ends_pending_work_only() {
        let mut w = Waiter::new(100).with_deadline(50, init_deadline());
        assert!(matches!(
            w.step(49, StreamState::Pending, None),
            Step::Sleep(_)
        ));
        assert_eq!(
            w.step(50, StreamState::Pending, None),
            Step::Fault(init_deadline())
        );
        // Done at the deadline is done; a cause still wins.
        assert_eq!(w.step(60, StreamState::Done, None), Step::Done);
        let lost = CollectiveError::PeerLost { rank: 1 };
        assert_eq!(
            w.step(60, StreamState::Pending, Some(lost.clone())),
            Step::Aborted(lost)
        );
        // A failure keeps its grace period past the deadline, and reports NCCL's error.
        let failed = || StreamState::Failed("ncclRemoteError".into());
        let mut w = Waiter::new(100).with_deadline(50, init_deadline());
        assert!(matches!(w.step(40, failed(), None), Step::Sleep(_)));
        assert!(matches!(w.step(90, failed(), None), Step::Sleep(_)));
        assert_eq!(
            w.step(140, failed(), None),
            Step::Fault(CollectiveError::Nccl("ncclRemoteError".into()))
        );
    }

    #[test]
    fn work_that_stays_in_progress_ends_at_the_deadline_and_tells_the_group() {
        let group = group_handle();
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group.clone());
        let start = Instant::now();
        let r = wait_for(
            &cell,
            Waiter::new(1_000).with_deadline(50, init_deadline()),
            || StreamState::Pending,
        );
        assert_eq!(r, Err(init_deadline()));
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(cell.cause(), Some(init_deadline()));
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
        assert!(group.is_aborted());
    }

    #[test]
    fn work_that_completes_before_the_deadline_is_done_and_nothing_is_aborted() {
        let group = group_handle();
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group.clone());
        let mut polls = 0;
        let r = wait_for(
            &cell,
            Waiter::new(1_000).with_deadline(5_000, init_deadline()),
            || {
                polls += 1;
                if polls < 300 {
                    StreamState::Pending
                } else {
                    StreamState::Done
                }
            },
        );
        assert_eq!(r, Ok(()));
        assert_eq!(polls, 300);
        assert_eq!(cell.cause(), None);
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 0);
        assert!(!group.is_aborted());
    }

    #[test]
    fn work_that_fails_before_the_deadline_reports_the_failure() {
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group_handle());
        let r = wait_for(
            &cell,
            Waiter::new(20).with_deadline(5_000, init_deadline()),
            || StreamState::Failed("ncclInvalidUsage".into()),
        );
        assert_eq!(r, Err(CollectiveError::Nccl("ncclInvalidUsage".into())));
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn pending_spins_then_sleeps_with_a_cap() {
        let mut w = Waiter::new(100);
        let mut sleeps = Vec::new();
        for _ in 0..WAIT_SPIN_POLLS + 40 {
            match w.step(0, StreamState::Pending, None) {
                Step::Sleep(d) => sleeps.push(d),
                s => panic!("unexpected {s:?}"),
            }
        }
        assert!(sleeps[..WAIT_SPIN_POLLS as usize]
            .iter()
            .all(|d| d.is_zero()));
        let after = &sleeps[WAIT_SPIN_POLLS as usize..];
        assert!(after.windows(2).all(|p| p[0] <= p[1]));
        assert_eq!(after[0], Duration::from_micros(2 * WAIT_SLEEP_US_MIN));
        assert_eq!(
            *after.last().unwrap(),
            Duration::from_micros(WAIT_SLEEP_US_MAX)
        );
    }

    #[test]
    fn an_abort_from_another_thread_ends_a_wait_on_work_that_never_finishes() {
        let fake = FakeComm::default();
        let cell = Arc::new(AbortCell::new(fake.clone(), group_handle()));
        let c2 = cell.clone();
        let waiter =
            std::thread::spawn(move || wait_for(&c2, Waiter::new(1_000), || StreamState::Pending));
        std::thread::sleep(Duration::from_millis(20));
        cell.abort(CollectiveError::PeerLost { rank: 1 });
        assert_eq!(
            waiter.join().unwrap(),
            Err(CollectiveError::PeerLost { rank: 1 })
        );
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_local_fault_aborts_the_communicator_and_the_group() {
        let group = group_handle();
        let fake = FakeComm::default();
        let cell = AbortCell::new(fake.clone(), group.clone());
        let r = wait_for(&cell, Waiter::new(20), || {
            StreamState::Failed("ncclSystemError".into())
        });
        assert_eq!(r, Err(CollectiveError::Nccl("ncclSystemError".into())));
        assert_eq!(fake.aborts.load(Ordering::SeqCst), 1);
        assert!(group.is_aborted());
    }
}
